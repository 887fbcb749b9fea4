//! Giving freed memory back to the system between phases.

/// Returns the heap's free pages to the system. glibc keeps what is freed
/// in the middle of its heap resident, and the CLI lets its mmap threshold
/// slide up (see `tune_allocator` there), so the buffers a phase used and
/// freed would count against every later phase's peak: after a restore's
/// plan of 300,000 tiny files that was 10–14 MiB of a 100 MiB peak. Called
/// only between phases, where the cost (one walk over the free lists) is
/// once per run.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[allow(unsafe_code)]
pub(crate) fn release_free() {
    // SAFETY: malloc_trim only returns free pages to the kernel; it takes
    // the allocator's own locks and is safe to call from any thread.
    unsafe {
        libc::malloc_trim(0);
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
pub(crate) fn release_free() {}

/// A number of bytes shared by threads: each takes what it needs before it
/// allocates and gives it back when it is done, so what they hold together
/// stays bounded however many threads there are. A request larger than the
/// whole budget is let through when nothing else is held, so it can never
/// wait forever.
#[derive(Debug)]
pub(crate) struct Budget {
    cap: u64,
    held: std::sync::Mutex<u64>,
    freed: std::sync::Condvar,
}

impl Budget {
    pub(crate) fn new(cap: u64) -> Self {
        Budget {
            cap,
            held: std::sync::Mutex::new(0),
            freed: std::sync::Condvar::new(),
        }
    }

    /// Waits until `n` bytes fit, and holds them until the permit drops.
    pub(crate) fn take(&self, n: u64) -> Permit<'_> {
        let mut held = self.held.lock().unwrap_or_else(|p| p.into_inner());
        while *held > 0 && *held + n > self.cap {
            held = self.freed.wait(held).unwrap_or_else(|p| p.into_inner());
        }
        *held += n;
        Permit { budget: self, n }
    }
}

/// Bytes held from a [`Budget`] until dropped.
#[derive(Debug)]
pub(crate) struct Permit<'a> {
    budget: &'a Budget,
    n: u64,
}

impl Drop for Permit<'_> {
    fn drop(&mut self) {
        let mut held = self.budget.held.lock().unwrap_or_else(|p| p.into_inner());
        *held -= self.n;
        drop(held);
        self.budget.freed.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::Budget;
    use std::sync::atomic::{AtomicU64, Ordering};

    /// Threads taking from a budget never hold more than it together, and
    /// one request larger than the budget still goes through.
    #[test]
    fn a_budget_bounds_what_threads_hold_together() {
        let budget = Budget::new(10);
        let held = AtomicU64::new(0);
        let most = AtomicU64::new(0);
        std::thread::scope(|s| {
            for t in 0..8u64 {
                let (budget, held, most) = (&budget, &held, &most);
                s.spawn(move || {
                    for i in 0..200u64 {
                        let n = 1 + (t + i) % 4;
                        let _p = budget.take(n);
                        let now = held.fetch_add(n, Ordering::SeqCst) + n;
                        most.fetch_max(now, Ordering::SeqCst);
                        std::thread::yield_now();
                        held.fetch_sub(n, Ordering::SeqCst);
                    }
                });
            }
        });
        assert!(most.load(Ordering::SeqCst) <= 10);
        let _big = budget.take(25);
        assert_eq!(*budget.held.lock().unwrap(), 25);
    }
}
