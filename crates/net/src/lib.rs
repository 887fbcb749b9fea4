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

mod dirwalk;
pub mod options;
mod rt;
pub mod s3;
pub mod sftp;
pub mod smb;
pub mod url;

use std::sync::Arc;

use capsule_backend::{BackendError, LabBackend};

pub use options::Options;
pub use url::{Destination, ParseError};

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
            if opts.create && b.ensure_bucket(opts.create_locked)? {
                // The one thing a connect says on its own: a bucket is a
                // billing-visible resource, so its creation is never silent.
                let lock = if opts.create_locked {
                    " with object lock"
                } else {
                    ""
                };
                eprintln!(
                    "capsule: created bucket {} at {}{lock}",
                    t.bucket, t.endpoint
                );
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
