//! Opening a destination the way a backup does: the destination, request
//! accounting, retries of transient failures.

use std::sync::Arc;
use std::time::Instant;

use capsule_backend::{
    LabBackend, LocalBackend, MeteredBackend, RequestStats, RetryBackend, RetryPolicy, SyncPolicy,
};
use capsule_net::Destination;

use crate::Result;

/// An open destination with its counters.
#[derive(Clone)]
pub struct Opened {
    /// The stack to use.
    pub backend: Arc<dyn LabBackend>,
    /// Its request counters.
    pub stats: Arc<RequestStats>,
    /// Seconds to connect (and log in).
    pub connect_secs: f64,
}

/// How to open destinations.
#[derive(Debug, Clone, Default)]
pub struct Connector {
    /// Credentials and knobs for network destinations.
    pub net: capsule_net::Options,
    /// Local directories: skip fsync (`--no-fsync`).
    pub no_fsync: bool,
}

impl Connector {
    /// Opens `dest`, creating its base directory if `create`.
    pub fn open(&self, dest: &Destination, create: bool) -> Result<Opened> {
        let t = Instant::now();
        let raw: Arc<dyn LabBackend> = match dest {
            Destination::Local(p) => {
                let sync = if self.no_fsync {
                    SyncPolicy::NoSync
                } else {
                    SyncPolicy::Sync
                };
                Arc::new(if create {
                    LocalBackend::create(p, sync)?
                } else {
                    LocalBackend::open(p, sync)?
                })
            }
            remote => {
                let mut o = self.net.clone();
                o.create = create;
                capsule_net::connect(remote, &o)?
            }
        };
        let connect_secs = t.elapsed().as_secs_f64();
        let metered = MeteredBackend::new(raw);
        let stats = metered.stats();
        let backend = Arc::new(RetryBackend::new(Arc::new(metered), RetryPolicy::default()));
        Ok(Opened {
            backend,
            stats,
            connect_secs,
        })
    }
}

/// The scheme of a destination, for reports.
pub fn kind(dest: &Destination) -> &'static str {
    match dest {
        Destination::Local(_) => "local",
        Destination::Smb(_) => "smb",
        Destination::Sftp(_) => "sftp",
        Destination::S3(_) => "s3",
    }
}

/// Deletes every object under `prefix` with `threads` requests in flight,
/// then removes the empty directories left behind.
pub fn delete_all(b: &dyn LabBackend, prefix: &str, threads: usize) -> Result<u64> {
    let objects = b.list(prefix)?;
    let n = objects.len() as u64;
    let chunk = objects.len().div_ceil(threads.max(1)).max(1);
    let mut first_err = None;
    std::thread::scope(|s| {
        let handles: Vec<_> = objects
            .chunks(chunk)
            .map(|part| {
                s.spawn(move || {
                    for o in part {
                        b.delete(&o.name)?;
                    }
                    Ok::<(), capsule_backend::BackendError>(())
                })
            })
            .collect();
        for h in handles {
            if let Ok(Err(e)) = h.join() {
                first_err.get_or_insert(e);
            }
        }
    });
    if let Some(e) = first_err {
        return Err(e.into());
    }
    Ok(n)
}
