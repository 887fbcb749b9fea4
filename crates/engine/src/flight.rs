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

/// Reads a destination's small objects (snapshots, index files, pack
/// headers) keep in flight: its concurrency, and on this machine's disk one
/// a core. Not rayon's pool: that is one thread a core, so on a machine
/// with one core (or a process pinned to one) every read waited for the
/// one before it. A restore over S3 at 10 ms read its four snapshots and
/// seven index files one after another that way: 0.19 s more before its
/// first tree than at once (bench/RESULTS.md, Estimator accuracy).
pub(crate) fn reads_in_flight(caps: &capsule_backend::Capabilities) -> usize {
    let cpus = std::thread::available_parallelism().map_or(2, |n| n.get());
    if caps.local {
        cpus
    } else {
        caps.concurrency.max(cpus)
    }
}

/// `f` of every item, in the items' order, up to `width` computed at once
/// (each on a thread of its own, so a wait on the network is not a core
/// held).
pub(crate) fn map_in_flight<T: Sync, R: Send>(
    items: &[T],
    width: usize,
    f: impl Fn(&T) -> R + Sync,
) -> Vec<R> {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let next = AtomicUsize::new(0);
    let done: std::sync::Mutex<Vec<(usize, R)>> =
        std::sync::Mutex::new(Vec::with_capacity(items.len()));
    std::thread::scope(|s| {
        for _ in 0..width.clamp(1, items.len().max(1)) {
            s.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(item) = items.get(i) else { break };
                let r = f(item);
                done.lock().unwrap_or_else(|p| p.into_inner()).push((i, r));
            });
        }
    });
    let mut done = done.into_inner().unwrap_or_else(|p| p.into_inner());
    done.sort_by_key(|(i, _)| *i);
    done.into_iter().map(|(_, r)| r).collect()
}

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn map_in_flight_keeps_the_order_and_runs_at_the_width_asked() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        let items: Vec<u32> = (0..40).collect();
        let (now, most) = (AtomicUsize::new(0), AtomicUsize::new(0));
        let out = map_in_flight(&items, 6, |&x| {
            let n = now.fetch_add(1, Ordering::SeqCst) + 1;
            most.fetch_max(n, Ordering::SeqCst);
            // Held until six are in flight (or a bounded while), as reads
            // waiting on a network would be, whatever the cores.
            for _ in 0..10_000 {
                if now.load(Ordering::SeqCst) >= 6 || most.load(Ordering::SeqCst) >= 6 {
                    break;
                }
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
            now.fetch_sub(1, Ordering::SeqCst);
            x * 2
        });
        assert_eq!(out, (0..40).map(|x| x * 2).collect::<Vec<_>>());
        assert_eq!(most.load(Ordering::SeqCst), 6, "six at once, never more");
        assert!(map_in_flight(&[] as &[u32], 4, |&x| x).is_empty());
    }
}
