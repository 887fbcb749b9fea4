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
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Destination::Local(p) => write!(f, "{}", p.display()),
            Destination::Smb(t) => write!(
                f,
                "smb://{}@{}:{}/{}{}{}",
                t.user,
                t.host,
                t.port,
                t.share,
                if t.path.is_empty() { "" } else { "/" },
                t.path
            ),
            Destination::Sftp(t) => write!(f, "sftp://{}@{}:{}{}", t.user, t.host, t.port, t.path),
            Destination::S3(t) => write!(
                f,
                "{}://{}/{}{}{}",
                if t.https { "s3" } else { "s3+http" },
                t.endpoint,
                t.bucket,
                if t.prefix.is_empty() { "" } else { "/" },
                t.prefix
            ),
        }
    }
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

/// `[user@]host[:port]` and the rest of the URL after the first `/`.
struct Parts {
    user: Option<String>,
    host: String,
    port: Option<u16>,
    path: String,
}

fn split(url: &str, rest: &str, example: &'static str) -> Result<Parts, ParseError> {
    let err = |reason: &str| ParseError {
        url: url.to_string(),
        reason: reason.to_string(),
        example,
    };
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, ""),
    };
    let (user, hostport) = match authority.rsplit_once('@') {
        Some((u, h)) => {
            if u.contains(':') {
                return Err(err(
                    "passwords do not belong in the URL; use the environment or a password file",
                ));
            }
            (
                Some(
                    percent_decode(u)
                        .ok_or_else(|| err("bad percent-encoding in the user name"))?,
                ),
                h,
            )
        }
        None => (None, authority),
    };
    let (host, port) = if let Some(h) = hostport.strip_prefix('[') {
        // [v6 address]:port
        let (h, after) = h.split_once(']').ok_or_else(|| err("unclosed '['"))?;
        (h.to_string(), after.strip_prefix(':'))
    } else {
        match hostport.rsplit_once(':') {
            Some((h, p)) => (h.to_string(), Some(p)),
            None => (hostport.to_string(), None),
        }
    };
    if host.is_empty() {
        return Err(err("no host"));
    }
    let port = match port {
        Some(p) => Some(p.parse().map_err(|_| err("the port is not a number"))?),
        None => None,
    };
    let path = percent_decode(path).ok_or_else(|| err("bad percent-encoding in the path"))?;
    Ok(Parts {
        user,
        host,
        port,
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
        let Some((scheme, rest)) = s.split_once("://") else {
            return Ok(Destination::Local(PathBuf::from(s)));
        };
        match scheme {
            "smb" | "cifs" => {
                const EX: &str = "smb://backup@nas.local/share/capsule";
                let p = split(s, rest, EX)?;
                let mut segs = p.path.trim_matches('/').splitn(2, '/');
                let share = segs.next().unwrap_or("").to_string();
                if share.is_empty() {
                    return Err(ParseError {
                        url: s.into(),
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
                let p = split(s, rest, EX)?;
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
                let p = split(s, rest, EX)?;
                let err = |reason: &str| ParseError {
                    url: s.into(),
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
                let endpoint = match p.port {
                    Some(port) if p.host.contains(':') => format!("[{}]:{port}", p.host),
                    Some(port) => format!("{}:{port}", p.host),
                    None => p.host,
                };
                Ok(Destination::S3(S3Target {
                    endpoint,
                    https: scheme != "s3+http",
                    bucket,
                    prefix: trim_slashes(segs.next().unwrap_or("")),
                }))
            }
            other => Err(ParseError {
                url: s.into(),
                reason: format!("unknown scheme {other}://"),
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
        for s in [
            "smb://backup@h:445/share/a/b",
            "sftp://u@h:22/srv/x",
            "s3+http://h:9000/b/p",
            "s3://h/b",
        ] {
            let d = Destination::parse(s).unwrap();
            assert_eq!(Destination::parse(&d.to_string()).unwrap(), d, "{s}");
        }
    }
}
