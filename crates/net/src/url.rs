//! Destination URLs:
//!
//! | form | meaning |
//! |---|---|
//! | `/path`, `file:///path` | a local directory (or a mounted share) |
//! | `smb://[user@]host[:port]/share[/path]` | SMB2/3, port 445 by default |
//! | `sftp://[user@]host[:port]/path` | SFTP over SSH, port 22; `/~/path` is relative to the home directory |
//! | `s3://host[:port]/bucket[/prefix]` | S3 over HTTPS |
//! | `s3+http://host[:port]/bucket[/prefix]` | S3 over plain HTTP (test servers) |
//!
//! User names and paths may be percent-encoded. Passwords are never taken
//! from the URL (they would land in shell history and process lists).

use std::fmt;
use std::path::PathBuf;

/// Where a repository lives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Destination {
    /// A local directory.
    Local(PathBuf),
    /// An SMB share.
    Smb(SmbTarget),
    /// An SFTP server.
    Sftp(SftpTarget),
    /// An S3-compatible store.
    S3(S3Target),
}

/// `smb://user@host:port/share/path`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SmbTarget {
    /// Account name (default: the local user name).
    pub user: String,
    /// Server name or address.
    pub host: String,
    /// TCP port.
    pub port: u16,
    /// Share name.
    pub share: String,
    /// Directory inside the share, `/`-separated, no leading or trailing `/`.
    pub path: String,
}

/// `sftp://user@host:port/path`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SftpTarget {
    /// Account name (default: the local user name).
    pub user: String,
    /// Server name or address.
    pub host: String,
    /// TCP port.
    pub port: u16,
    /// Directory on the server: absolute, or relative to the home directory.
    pub path: String,
}

/// `s3://host:port/bucket/prefix`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct S3Target {
    /// Endpoint `host[:port]`.
    pub endpoint: String,
    /// HTTPS (`s3://`) or plain HTTP (`s3+http://`).
    pub https: bool,
    /// Bucket name.
    pub bucket: String,
    /// Key prefix, no leading or trailing `/` (may be empty).
    pub prefix: String,
}

/// A destination string that cannot be understood.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("bad destination {url:?}: {reason} (expected e.g. {example})")]
pub struct ParseError {
    /// The string given.
    pub url: String,
    /// What is wrong.
    pub reason: String,
    /// A well-formed example of the scheme.
    pub example: &'static str,
}

impl fmt::Display for Destination {
    /// The canonical URL: every default filled in, user and path
    /// percent-encoded where needed, IPv6 hosts in brackets. It parses back
    /// to the same destination, and it is the key of the estimator's
    /// history, so it must be stable.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Destination::Local(p) => write!(f, "{}", p.display()),
            Destination::Smb(t) => {
                let path = if t.path.is_empty() {
                    format!("/{}", t.share)
                } else {
                    format!("/{}/{}", t.share, t.path)
                };
                f.write_str(&build("smb", Some(&t.user), &t.host, Some(t.port), &path))
            }
            Destination::Sftp(t) => {
                let path = match t.path.as_str() {
                    "." => "/~".to_string(),
                    p if p.starts_with('/') => p.to_string(),
                    p => format!("/~/{p}"),
                };
                f.write_str(&build("sftp", Some(&t.user), &t.host, Some(t.port), &path))
            }
            Destination::S3(t) => {
                let scheme = if t.https { "s3" } else { "s3+http" };
                let path = if t.prefix.is_empty() {
                    format!("/{}", t.bucket)
                } else {
                    format!("/{}/{}", t.bucket, t.prefix)
                };
                // The endpoint is kept as written (`host[:port]`, brackets
                // for IPv6), so it goes in as it is.
                match url::Url::parse(&format!("{scheme}://{}/", t.endpoint)) {
                    Ok(mut u) => {
                        u.set_path(&path);
                        f.write_str(u.as_str())
                    }
                    Err(_) => write!(f, "{scheme}://{}{path}", t.endpoint),
                }
            }
        }
    }
}

/// `scheme://user@host:port/path` through the `url` crate, which encodes
/// what must be encoded and brackets IPv6 addresses.
fn build(scheme: &str, user: Option<&str>, host: &str, port: Option<u16>, path: &str) -> String {
    let bracketed = if host.contains(':') {
        format!("[{host}]")
    } else {
        host.to_string()
    };
    let Ok(mut u) = url::Url::parse(&format!("{scheme}://{bracketed}/")) else {
        // Unreachable for hosts that parsed; keep something readable.
        return format!("{scheme}://{bracketed}{path}");
    };
    if let Some(user) = user {
        let _ = u.set_username(user);
    }
    let _ = u.set_port(port);
    u.set_path(path);
    u.to_string()
}

/// `s` with any password in its user-info replaced by `***`, for error
/// messages: a password typed into a URL must not be echoed to logs.
pub fn redact(s: &str) -> String {
    // Any `:secret@` (a colon, then no '/' up to an '@') is user-info with a
    // password, wherever it sits: also in strings that are not well-formed
    // URLs, which are echoed in errors too.
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(at) = rest.find('@') {
        let (head, tail) = rest.split_at(at);
        let colon = head.rfind(':').filter(|&c| {
            !head[c + 1..].contains('/') && !head[c + 1..].is_empty() && !head[..c].ends_with(':')
        });
        match colon {
            // "scheme://": that colon is followed by '/', so never matches.
            Some(c) => {
                out.push_str(&head[..=c]);
                out.push_str("***");
            }
            None => out.push_str(head),
        }
        out.push('@');
        rest = &tail[1..];
    }
    out.push_str(rest);
    out
}

fn local_user() -> String {
    std::env::var("USER")
        .or_else(|_| std::env::var("LOGNAME"))
        .unwrap_or_else(|_| "root".into())
}

fn percent_decode(s: &str) -> Option<String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let h = std::str::from_utf8(b.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(h, 16).ok()?);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// `[user@]host[:port]` and the path, as the `url` crate parsed them.
struct Parts {
    user: Option<String>,
    host: String,
    port: Option<u16>,
    path: String,
}

fn split(url: &str, example: &'static str) -> Result<Parts, ParseError> {
    let err = |reason: &str| ParseError {
        url: redact(url),
        reason: reason.to_string(),
        example,
    };
    let u = url::Url::parse(url).map_err(|e| err(&e.to_string()))?;
    if u.password().is_some() {
        return Err(err(
            "passwords do not belong in the URL; use the environment or a password file",
        ));
    }
    if u.query().is_some() || u.fragment().is_some() {
        return Err(err("a '?' or '#' in the URL (percent-encode it in paths)"));
    }
    let user = match u.username() {
        "" => None,
        name => {
            Some(percent_decode(name).ok_or_else(|| err("bad percent-encoding in the user name"))?)
        }
    };
    let host = match u.host() {
        Some(url::Host::Ipv6(a)) => a.to_string(),
        Some(url::Host::Ipv4(a)) => a.to_string(),
        // Host names are taken as written: letters, digits, '.', '-', '_'.
        Some(url::Host::Domain(d)) => {
            if !d
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b".-_".contains(&b))
            {
                return Err(err("the host name has characters a host name cannot have"));
            }
            d.to_string()
        }
        None => String::new(),
    };
    if host.is_empty() {
        return Err(err("no host"));
    }
    let path = percent_decode(u.path()).ok_or_else(|| err("bad percent-encoding in the path"))?;
    Ok(Parts {
        user,
        host,
        port: u.port(),
        path,
    })
}

fn trim_slashes(s: &str) -> String {
    s.trim_matches('/').to_string()
}

impl Destination {
    /// The same destination one directory (or key prefix) deeper: where the
    /// lab keeps its scratch repository.
    pub fn join(&self, child: &str) -> Destination {
        let join = |base: &str| match base {
            "" => child.to_string(),
            "/" => format!("/{child}"),
            b => format!("{}/{child}", b.trim_end_matches('/')),
        };
        match self {
            Destination::Local(p) => Destination::Local(p.join(child)),
            Destination::Smb(t) => Destination::Smb(SmbTarget {
                path: join(&t.path),
                ..t.clone()
            }),
            Destination::Sftp(t) => Destination::Sftp(SftpTarget {
                path: if t.path == "." {
                    child.to_string()
                } else {
                    join(&t.path)
                },
                ..t.clone()
            }),
            Destination::S3(t) => Destination::S3(S3Target {
                prefix: join(&t.prefix),
                ..t.clone()
            }),
        }
    }

    /// Parses a destination; anything without a scheme is a local path.
    pub fn parse(s: &str) -> Result<Destination, ParseError> {
        if let Some(p) = s.strip_prefix("file://") {
            return Ok(Destination::Local(PathBuf::from(p)));
        }
        let Some((scheme, _)) = s.split_once("://") else {
            return Ok(Destination::Local(PathBuf::from(s)));
        };
        match scheme {
            "smb" | "cifs" => {
                const EX: &str = "smb://backup@nas.local/share/capsule";
                let p = split(s, EX)?;
                let mut segs = p.path.trim_matches('/').splitn(2, '/');
                let share = segs.next().unwrap_or("").to_string();
                if share.is_empty() {
                    return Err(ParseError {
                        url: redact(s),
                        reason: "no share name".into(),
                        example: EX,
                    });
                }
                Ok(Destination::Smb(SmbTarget {
                    user: p.user.unwrap_or_else(local_user),
                    host: p.host,
                    port: p.port.unwrap_or(445),
                    share,
                    path: trim_slashes(segs.next().unwrap_or("")),
                }))
            }
            "sftp" => {
                const EX: &str = "sftp://backup@nas.local:22/srv/capsule";
                let p = split(s, EX)?;
                let path = match p.path.strip_prefix("/~/") {
                    Some(rel) => rel.trim_end_matches('/').to_string(),
                    None if p.path == "/~" || p.path.is_empty() => ".".to_string(),
                    None => {
                        let t = p.path.trim_end_matches('/');
                        if t.is_empty() { "/" } else { t }.to_string()
                    }
                };
                Ok(Destination::Sftp(SftpTarget {
                    user: p.user.unwrap_or_else(local_user),
                    host: p.host,
                    port: p.port.unwrap_or(22),
                    path,
                }))
            }
            "s3" | "s3+https" | "s3+http" => {
                const EX: &str = "s3://s3.example.com/bucket/prefix";
                let p = split(s, EX)?;
                let err = |reason: &str| ParseError {
                    url: redact(s),
                    reason: reason.into(),
                    example: EX,
                };
                if p.user.is_some() {
                    return Err(err(
                        "credentials come from AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY or ~/.aws, not the URL",
                    ));
                }
                let mut segs = p.path.trim_matches('/').splitn(2, '/');
                let bucket = segs.next().unwrap_or("").to_string();
                if bucket.is_empty() {
                    return Err(err("no bucket"));
                }
                let host = if p.host.contains(':') {
                    format!("[{}]", p.host)
                } else {
                    p.host
                };
                let endpoint = match p.port {
                    Some(port) => format!("{host}:{port}"),
                    None => host,
                };
                Ok(Destination::S3(S3Target {
                    endpoint,
                    https: scheme != "s3+http",
                    bucket,
                    prefix: trim_slashes(segs.next().unwrap_or("")),
                }))
            }
            other => Err(ParseError {
                url: redact(s),
                reason: format!("unknown scheme {}://", redact(other)),
                example: "a local path, smb://, sftp://, s3:// or s3+http://",
            }),
        }
    }

    /// True for destinations reached over the network.
    pub fn is_remote(&self) -> bool {
        !matches!(self, Destination::Local(_))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn join_goes_one_level_deeper() {
        let d = |s: &str| Destination::parse(s).unwrap();
        assert_eq!(
            d("smb://u@h:445/share").join("lab").to_string(),
            "smb://u@h:445/share/lab"
        );
        assert_eq!(
            d("smb://u@h:445/share/a/").join("lab").to_string(),
            "smb://u@h:445/share/a/lab"
        );
        assert_eq!(
            d("sftp://u@h:22/").join("lab").to_string(),
            "sftp://u@h:22/lab"
        );
        assert_eq!(d("sftp://u@h/~/").join("lab"), d("sftp://u@h/~/lab"));
        assert_eq!(
            d("s3+http://h:9000/b").join("lab").to_string(),
            "s3+http://h:9000/b/lab"
        );
        assert_eq!(d("/srv/x").join("lab"), d("/srv/x/lab"));
    }

    #[test]
    fn parses_each_scheme() {
        assert_eq!(
            Destination::parse("smb://backup@127.0.0.1:4450/tm/macs/laptop").unwrap(),
            Destination::Smb(SmbTarget {
                user: "backup".into(),
                host: "127.0.0.1".into(),
                port: 4450,
                share: "tm".into(),
                path: "macs/laptop".into()
            })
        );
        assert_eq!(
            Destination::parse("sftp://me%40corp@host/~/backups/").unwrap(),
            Destination::Sftp(SftpTarget {
                user: "me@corp".into(),
                host: "host".into(),
                port: 22,
                path: "backups".into()
            })
        );
        assert_eq!(
            Destination::parse("s3+http://[::1]:9000/b/p/q/").unwrap(),
            Destination::S3(S3Target {
                endpoint: "[::1]:9000".into(),
                https: false,
                bucket: "b".into(),
                prefix: "p/q".into()
            })
        );
        assert_eq!(
            Destination::parse("/srv/x").unwrap(),
            Destination::Local("/srv/x".into())
        );
    }

    #[test]
    fn rejects_what_it_cannot_use() {
        for bad in [
            "smb://host",
            "smb://u:pw@host/share",
            "s3://host",
            "s3://key@host/b",
            "sftp://host:x/p",
            "ftp://host/p",
            "smb://@/share",
        ] {
            assert!(Destination::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn display_round_trips() {
        // (given, canonical): the canonical form fills in defaults, and
        // both parse to the same destination.
        for (given, canonical) in [
            (
                "smb://backup@h:445/share/a/b",
                "smb://backup@h:445/share/a/b",
            ),
            ("smb://backup@h/share", "smb://backup@h:445/share"),
            (
                "smb://backup@[::1]:4450/share/p",
                "smb://backup@[::1]:4450/share/p",
            ),
            (
                "smb://me%40corp@h/share/with%20space",
                "smb://me%40corp@h:445/share/with%20space",
            ),
            ("sftp://u@h:22/srv/x", "sftp://u@h:22/srv/x"),
            ("sftp://u@h/", "sftp://u@h:22/"),
            ("sftp://u@h/~/backups", "sftp://u@h:22/~/backups"),
            ("sftp://u@h/~", "sftp://u@h:22/~"),
            ("sftp://u@h", "sftp://u@h:22/~"),
            ("sftp://u@[fe80::1]:2222/srv", "sftp://u@[fe80::1]:2222/srv"),
            ("s3+http://h:9000/b/p", "s3+http://h:9000/b/p"),
            ("s3://h/b", "s3://h/b"),
            ("s3+http://[::1]:9000/b/p/q", "s3+http://[::1]:9000/b/p/q"),
            ("/srv/x", "/srv/x"),
        ] {
            let d = Destination::parse(given).unwrap();
            assert_eq!(d.to_string(), canonical, "{given}");
            assert_eq!(Destination::parse(canonical).unwrap(), d, "{given}");
        }
        let six = Destination::parse("sftp://u@[::1]:22/x").unwrap();
        match six {
            Destination::Sftp(t) => assert_eq!(t.host, "::1"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn passwords_are_refused_and_never_echoed() {
        for url in [
            "smb://u:hunter2@h/share",
            "sftp://u:hunter2@h/p",
            "s3://key:hunter2@h/b",
        ] {
            let e = Destination::parse(url).unwrap_err().to_string();
            assert!(!e.contains("hunter2"), "{e}");
            assert!(e.contains("***"), "{e}");
        }
        assert_eq!(redact("smb://u:pw@h/s"), "smb://u:***@h/s");
        // Over-redacting a path in an error message is harmless.
        assert_eq!(redact("smb://u@h/s:x@y"), "smb://u@h/s:***@y");
        assert_eq!(redact("/b/p@:secret@s3://h"), "/b/p@:***@s3://h");
        assert_eq!(redact("/plain/path"), "/plain/path");
    }

    /// A property test over generated strings made of URL parts: whatever
    /// parses prints to a URL that parses to the same destination, and an
    /// error never carries the password. (The format decoders are fuzzed
    /// with cargo-fuzz; this one stays a property test, since fuzzing it
    /// would build the network clients with the fuzzer's instrumentation.)
    #[test]
    fn generated_urls_round_trip_and_never_leak_passwords() {
        const PARTS: &[&str] = &[
            "smb://",
            "sftp://",
            "s3://",
            "s3+http://",
            "cifs://",
            "ftp://",
            "u",
            "me%40corp",
            "@",
            ":",
            "pw123456",
            "h",
            "127.0.0.1",
            "[::1]",
            "[fe80::1]",
            "nas.local",
            ":445",
            ":22",
            ":9000",
            ":x",
            "/",
            "/share",
            "/~",
            "/~/",
            "a b",
            "%20",
            "%zz",
            "?",
            "#",
            "[",
            "]",
            "..",
            "/b/p",
            "é",
        ];
        let mut x = 0x9E37_79B9_7F4A_7C15_u64;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        for _ in 0..50_000 {
            let n = 1 + next() % 7;
            let s: String = (0..n)
                .map(|_| PARTS[(next() % PARTS.len() as u64) as usize])
                .collect();
            match Destination::parse(&s) {
                Ok(d) if d.is_remote() => {
                    let printed = d.to_string();
                    assert_eq!(
                        Destination::parse(&printed).as_ref(),
                        Ok(&d),
                        "{s} printed as {printed}"
                    );
                }
                Ok(_) => {}
                Err(e) => assert!(!e.to_string().contains(":pw123456@"), "{s}: {e}"),
            }
        }
    }
}
