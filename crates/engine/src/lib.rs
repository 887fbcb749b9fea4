//! The capsule engine: opening and creating repositories, the backup
//! pipeline, restore, check, diff and statistics. It talks to storage only
//! through the [`capsule_backend::Backend`] contract.

pub mod backup;
pub mod browse;
pub mod check;
pub mod diff;
pub mod error;
pub mod forget;
pub mod index;
pub mod journal;
mod mem;
mod meta;
pub mod packer;
pub mod progress;
pub mod prune;
pub mod quota;
pub mod repair;
pub mod repo;
pub mod restore;
pub mod retention;
pub mod session;
pub mod stats;
pub mod timefmt;
pub mod treewalk;
pub mod versions;

pub use error::EngineError;
pub use repo::{EarlyKey, KeyHint, KeySource, Repository};

/// Result alias for engine operations.
pub type Result<T, E = EngineError> = std::result::Result<T, E>;

/// Splits per-object results into the good ones and the errors, so one
/// damaged object is reported without hiding the rest.
pub(crate) fn partition<T>(results: Vec<Result<T>>) -> (Vec<T>, Vec<EngineError>) {
    let mut good = Vec::new();
    let mut bad = Vec::new();
    for r in results {
        match r {
            Ok(x) => good.push(x),
            Err(e) => bad.push(e),
        }
    }
    (good, bad)
}

/// Requests a prune or forget keeps in flight: on a network destination
/// each is a round trip, and one at a time leaves the link idle.
pub(crate) const REQUESTS_IN_FLIGHT: usize = 8;

/// Runs `f` on every item, up to `width` at once; stops taking new items at
/// the first error, which it returns.
pub(crate) fn for_each_in_flight<T: Sync>(
    items: &[T],
    width: usize,
    f: impl Fn(&T) -> Result<()> + Sync,
) -> Result<()> {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let next = AtomicUsize::new(0);
    let failed = std::sync::Mutex::new(None);
    std::thread::scope(|s| {
        for _ in 0..width.clamp(1, items.len().max(1)) {
            s.spawn(|| {
                while let Some(item) = items.get(next.fetch_add(1, Ordering::SeqCst)) {
                    if let Err(e) = f(item) {
                        if let Ok(mut slot) = failed.lock() {
                            slot.get_or_insert(e);
                        }
                        // No more items for anyone.
                        next.store(items.len(), Ordering::SeqCst);
                        return;
                    }
                }
            });
        }
    });
    match failed.into_inner() {
        Ok(Some(e)) => Err(e),
        _ => Ok(()),
    }
}

/// Test hook: with `CAPSULE_TEST_PAUSE=<point>:<file>`, the process
/// creates `<file>.waiting` at that point and waits (at most ten minutes)
/// until `<file>` exists, so a test can act at an exact moment (stop the
/// process, run a prune, move the clock). Not for production use.
pub(crate) fn test_pause(point: &str) {
    let Some(v) = std::env::var_os("CAPSULE_TEST_PAUSE") else {
        return;
    };
    let v = v.to_string_lossy();
    let Some((p, file)) = v.split_once(':') else {
        return;
    };
    if p != point {
        return;
    }
    let _ = std::fs::write(format!("{file}.waiting"), b"");
    for _ in 0..6000 {
        if std::path::Path::new(file).exists() {
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}
