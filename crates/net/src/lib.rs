//! capsule's network destinations behind the backend contract of
//! [`capsule_backend::Backend`]:
//!
//! * `smb://user@host[:port]/share/path`: a native SMB2/3 client (the `smb2`
//!   crate; no kernel mount, no FUSE);
//! * `sftp://user@host[:port]/path`: SSH (key or password, known-hosts
//!   checked) with a pipelined SFTP client;
//! * `s3://host[:port]/bucket/prefix` (`s3+http://` for plain-HTTP test
//!   servers): any S3-compatible store.
//!
//! The contract is synchronous; each backend drives its async client on one
//! shared Tokio runtime, so many engine threads can have requests in flight
//! at once over few connections.
//!
//! All three keep the contract's promises the same way a local disk does:
//! an object is written under a temporary name (or as an S3 upload that is
//! invisible until complete) and only then takes its final name, refusing to
//! replace an existing one.

mod rt;
pub mod s3;
pub mod sftp;
pub mod smb;
pub mod url;

use std::sync::Arc;

use capsule_backend::{BackendError, LabBackend};

pub use url::{Destination, ParseError};

/// Credentials and knobs for opening a destination, usually from the
/// environment (see [`Options::from_env`]).
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// SMB or SFTP password (`CAPSULE_SMB_PASSWORD`, `CAPSULE_SFTP_PASSWORD`).
    pub password: Option<String>,
    /// SSH private key file (`CAPSULE_SFTP_KEY`; default: `~/.ssh/id_ed25519`,
    /// `id_ecdsa`, `id_rsa`, whichever exists).
    pub ssh_key: Option<std::path::PathBuf>,
    /// known_hosts file (`CAPSULE_SFTP_KNOWN_HOSTS`; default `~/.ssh/known_hosts`).
    pub known_hosts: Option<std::path::PathBuf>,
    /// Requests in flight at once (`CAPSULE_CONNECTIONS`); `None` picks the
    /// backend's default.
    pub concurrency: Option<usize>,
    /// Create the base directory (SMB, SFTP) or the bucket (S3) if it is
    /// missing (for `init`).
    pub create: bool,
}

impl Options {
    /// Reads the options for `dest` from the environment.
    pub fn from_env(dest: &Destination) -> Self {
        let var = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
        let file = |k: &str| {
            var(k).and_then(|p| {
                std::fs::read_to_string(p)
                    .ok()
                    .map(|s| s.trim_end_matches(['\n', '\r']).to_string())
            })
        };
        let password = match dest {
            Destination::Smb(_) => {
                var("CAPSULE_SMB_PASSWORD").or_else(|| file("CAPSULE_SMB_PASSWORD_FILE"))
            }
            Destination::Sftp(_) => {
                var("CAPSULE_SFTP_PASSWORD").or_else(|| file("CAPSULE_SFTP_PASSWORD_FILE"))
            }
            _ => None,
        };
        Options {
            password,
            ssh_key: var("CAPSULE_SFTP_KEY").map(Into::into),
            known_hosts: var("CAPSULE_SFTP_KNOWN_HOSTS").map(Into::into),
            concurrency: var("CAPSULE_CONNECTIONS").and_then(|v| v.parse().ok()),
            create: false,
        }
    }
}

/// Attempts at connecting, and the pause before the second (doubling).
const CONNECT_ATTEMPTS: u32 = 4;
const CONNECT_BACKOFF: std::time::Duration = std::time::Duration::from_millis(250);

/// Connects to a network destination. Local paths are not handled here.
///
/// A connection reset or dropped while it is being set up (transient) is
/// tried again, 4 times over about 2 s: the retry layer covers requests
/// only once a backend exists, and a blip at the start of a run used to end
/// it (found by the cut sweep). Refused credentials, a missing share or
/// bucket, and a refused connection after the last attempt are reported
/// at once as before.
pub fn connect(dest: &Destination, opts: &Options) -> Result<Arc<dyn LabBackend>, BackendError> {
    let mut attempt = 1;
    loop {
        match connect_once(dest, opts) {
            Err(e) if e.transient && attempt < CONNECT_ATTEMPTS => {
                std::thread::sleep(CONNECT_BACKOFF * 2u32.pow(attempt - 1));
                attempt += 1;
            }
            r => return r,
        }
    }
}

fn connect_once(dest: &Destination, opts: &Options) -> Result<Arc<dyn LabBackend>, BackendError> {
    Ok(match dest {
        Destination::Smb(t) => Arc::new(smb::SmbBackend::connect(t, opts)?),
        Destination::Sftp(t) => Arc::new(sftp::SftpBackend::connect(t, opts)?),
        Destination::S3(t) => {
            let b = s3::S3Backend::connect(t, opts)?;
            if opts.create && b.ensure_bucket()? {
                // The one thing a connect says on its own: a bucket is a
                // billing-visible resource, so its creation is never silent.
                eprintln!("capsule: created bucket {} at {}", t.bucket, t.endpoint);
            }
            Arc::new(b)
        }
        Destination::Local(p) => {
            return Err(BackendError::new(
                capsule_backend::ErrorKind::InvalidName,
                "connect",
                &p.display().to_string(),
                "a local path is not a network destination",
            ))
        }
    })
}

/// A random suffix for temporary object names.
pub(crate) fn random_suffix() -> String {
    let mut r = [0u8; 8];
    let _ = getrandom::fill(&mut r);
    hex::encode(r)
}

/// One entry of a directory listing on a file-like destination.
pub(crate) struct DirEntry {
    pub(crate) name: String,
    pub(crate) is_dir: bool,
    pub(crate) size: u64,
    /// Unix seconds, when the listing gives it.
    pub(crate) modified: Option<i64>,
}

/// Lists every object under `prefix` on a destination made of directories
/// (SMB, SFTP). `read_dir(rel)` lists one directory relative to the base
/// (`""` is the base), or `None` if it does not exist. Directories are read
/// 16 at a time: a repository's `data/` has 256 subdirectories, and one at
/// a time would cost 256 round trips in a row. Temporaries are skipped.
pub(crate) async fn walk_tree<F, Fut>(
    prefix: &str,
    read_dir: F,
) -> Result<Vec<capsule_backend::ObjectInfo>, BackendError>
where
    F: Fn(String) -> Fut,
    Fut: std::future::Future<Output = Result<Option<Vec<DirEntry>>, BackendError>>,
{
    let (mut out, _, _) = walk(prefix.trim_end_matches('/'), read_dir).await?;
    out.retain(|o| o.name.starts_with(prefix));
    Ok(out)
}

/// Every temporary below the base: what interrupted writes left.
pub(crate) async fn walk_temporaries<F, Fut>(
    read_dir: F,
) -> Result<Vec<capsule_backend::ObjectInfo>, BackendError>
where
    F: Fn(String) -> Fut,
    Fut: std::future::Future<Output = Result<Option<Vec<DirEntry>>, BackendError>>,
{
    Ok(walk("", read_dir).await?.2)
}

/// Every directory below the base (and the base, `""`), parents before
/// children: what `remove_empty_dirs` removes in reverse.
pub(crate) async fn all_dirs<F, Fut>(read_dir: F) -> Result<Vec<String>, BackendError>
where
    F: Fn(String) -> Fut,
    Fut: std::future::Future<Output = Result<Option<Vec<DirEntry>>, BackendError>>,
{
    Ok(walk("", read_dir).await?.1)
}

/// Objects, directories in the order visited (parents first), and
/// temporaries.
type Walked = (
    Vec<capsule_backend::ObjectInfo>,
    Vec<String>,
    Vec<capsule_backend::ObjectInfo>,
);

/// The walk behind [`walk_tree`], [`all_dirs`] and [`walk_temporaries`].
async fn walk<F, Fut>(start: &str, read_dir: F) -> Result<Walked, BackendError>
where
    F: Fn(String) -> Fut,
    Fut: std::future::Future<Output = Result<Option<Vec<DirEntry>>, BackendError>>,
{
    let mut out = Vec::new();
    let mut dirs = Vec::new();
    let mut temps = Vec::new();
    let mut pending = vec![start.to_string()];
    while !pending.is_empty() {
        let batch: Vec<String> = pending.drain(..pending.len().min(16)).collect();
        let listed = futures::future::join_all(batch.iter().map(|d| read_dir(d.clone()))).await;
        for (dir, entries) in batch.into_iter().zip(listed) {
            for e in entries?.unwrap_or_default() {
                if e.name == "." || e.name == ".." {
                    continue;
                }
                let is_temp = e.name.starts_with(capsule_backend::TEMP_PREFIX);
                let child = if dir.is_empty() {
                    e.name
                } else {
                    format!("{dir}/{}", e.name)
                };
                if e.is_dir {
                    pending.push(child);
                } else {
                    let o = capsule_backend::ObjectInfo {
                        name: child,
                        size: e.size,
                        modified: e.modified,
                    };
                    if is_temp {
                        temps.push(o);
                    } else {
                        out.push(o);
                    }
                }
            }
            dirs.push(dir);
        }
    }
    Ok((out, dirs, temps))
}
