//! Live counters shared between a running operation and whoever displays
//! progress. The engine only increments them; it never prints.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// Counters of a backup or restore in progress.
#[derive(Debug, Default)]
pub struct Progress {
    /// Files fully processed (read, or found unchanged).
    pub files_done: AtomicU64,
    /// Bytes of processed files (read or unchanged).
    pub bytes_done: AtomicU64,
    /// Files expected, from the estimating scan.
    pub files_total: AtomicU64,
    /// Bytes expected, from the estimating scan.
    pub bytes_total: AtomicU64,
    /// The estimating scan has finished, so totals are final.
    pub totals_final: AtomicBool,
    /// Files whose content was unchanged and not read.
    pub files_unchanged: AtomicU64,
    /// Bytes skipped because files were unchanged.
    pub bytes_unchanged: AtomicU64,
    /// Bytes actually read from the source.
    pub bytes_read: AtomicU64,
    /// Bytes of new (not deduplicated) blobs.
    pub bytes_new: AtomicU64,
    /// Entries skipped with a warning.
    pub errors: AtomicU64,
}

impl Progress {
    /// Adds to a counter.
    pub fn add(c: &AtomicU64, n: u64) {
        c.fetch_add(n, Ordering::Relaxed);
    }
    /// Reads a counter.
    pub fn get(c: &AtomicU64) -> u64 {
        c.load(Ordering::Relaxed)
    }
}
