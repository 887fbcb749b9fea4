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
