//! Opening a destination the way a backup does, through the library's one
//! way in ([`capsule_access`]): the lab measures the very stack a backup
//! runs on, and builds none of its own.

use std::path::Path;

use capsule_access::{Access, CachePolicy, Connect, Stack};
use capsule_backend::LabBackend;
use capsule_engine::EngineError;
use capsule_net::Destination;

use crate::{LabError, Result};

/// An open destination with its counters: the library's [`Stack`].
pub type Opened = Stack;

/// How to open destinations.
#[derive(Debug, Clone, Default)]
pub struct Connector {
    /// Credentials and knobs for network destinations.
    pub net: capsule_net::Options,
    /// Local directories: skip fsync (`--no-fsync`).
    pub no_fsync: bool,
    /// Every request to the destinations opened, into one trace
    /// (`--trace-requests`).
    pub trace: Option<capsule_backend::TraceSink>,
}

impl Connector {
    fn connect(&self) -> Connect {
        Connect {
            net: self.net.clone(),
            no_fsync: self.no_fsync,
            trace: self.trace.clone(),
            // The lab measures what a destination does: one that stops
            // answering is reported after six attempts (about 8 s), not
            // ridden out for a minute as a backup rides it out.
            retry_for: Some(std::time::Duration::ZERO),
            as_of: None,
        }
    }

    /// Opens `dest`, creating its base directory if `create`.
    pub fn open(&self, dest: &Destination, create: bool) -> Result<Opened> {
        Stack::connect(dest, &self.connect(), create).map_err(|e| match e {
            // The lab reports what the destination said as such.
            EngineError::Backend(b) => LabError::Destination(b),
            e => LabError::Engine(e),
        })
    }

    /// The repository at `dest` as a backup opens it, with its cache (and
    /// key hint) under `cache`.
    pub fn access(&self, dest: &Destination, cache: &Path) -> Access {
        Access {
            dest: dest.clone(),
            connect: self.connect(),
            cache: CachePolicy::In(cache.to_path_buf()),
        }
    }
}

/// The scheme of a destination, for reports.
pub fn kind(dest: &Destination) -> &'static str {
    capsule_access::stack::kind(dest)
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The lab measures the stack a backup runs on: the library's, built
    /// by the library.
    #[test]
    fn the_lab_opens_the_stack_a_backup_opens() {
        let t = tempfile::tempdir().unwrap();
        let dest = Destination::Local(t.path().join("r"));
        let lab = Connector::default().open(&dest, true).unwrap();
        let access = Connector::default().access(&dest, t.path());
        let backup = access.connect(false).unwrap();
        assert_eq!(lab.layers, backup.layers);
        assert_eq!(lab.layers, ["retry", "metered", "local"]);
    }
}
