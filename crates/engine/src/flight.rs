//! Work on many objects at once: requests kept in flight, and results
//! split so one damaged object does not hide the rest.

use crate::error::{EngineError, Result};

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
