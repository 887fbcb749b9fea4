//! Round-trip accounting: a decorator that counts every request that reaches
//! the destination and the time spent waiting for it. It sits directly on the
//! destination's backend (below the retry layer and the cache), so each
//! attempt on the wire is one request.

use std::io::{Read, Write};
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Instant;

use crate::{BackendError, LabBackend, ObjectInfo, Space};

/// Counters of one destination, shared with whoever reports them.
#[derive(Debug, Default)]
pub struct RequestStats {
    /// `put` and `put_stream` calls.
    pub puts: AtomicU64,
    /// `get` and `get_stream` calls.
    pub gets: AtomicU64,
    /// `stat` calls.
    pub stats: AtomicU64,
    /// `list` calls.
    pub lists: AtomicU64,
    /// `delete` calls.
    pub deletes: AtomicU64,
    /// Calls that returned an error (including `NotFound` and `AlreadyExists`).
    pub errors: AtomicU64,
    /// Bytes sent.
    pub bytes_up: AtomicU64,
    /// Bytes received.
    pub bytes_down: AtomicU64,
    /// Sum over all calls of their duration, in microseconds. With calls in
    /// flight concurrently this exceeds wall time.
    pub wait_micros: AtomicU64,
    /// Requests in flight right now.
    pub in_flight: AtomicU64,
    /// The most requests that were in flight at once.
    pub max_in_flight: AtomicU64,
    /// Wall time, in microseconds, during which at least one request was in
    /// flight: how long the run actually waited on the destination.
    pub busy_micros: AtomicU64,
    busy_since: AtomicU64,
    epoch: std::sync::OnceLock<Instant>,
}

impl RequestStats {
    /// All requests.
    pub fn requests(&self) -> u64 {
        self.puts.load(Relaxed)
            + self.gets.load(Relaxed)
            + self.stats.load(Relaxed)
            + self.lists.load(Relaxed)
            + self.deletes.load(Relaxed)
    }

    fn now_micros(&self) -> u64 {
        self.epoch.get_or_init(Instant::now).elapsed().as_micros() as u64
    }

    fn begin(&self) -> Instant {
        let now = self.now_micros();
        if self.in_flight.fetch_add(1, Relaxed) == 0 {
            self.busy_since.store(now, Relaxed);
        }
        self.max_in_flight
            .fetch_max(self.in_flight.load(Relaxed), Relaxed);
        Instant::now()
    }

    fn end(&self, started: Instant, ok: bool) {
        self.wait_micros
            .fetch_add(started.elapsed().as_micros() as u64, Relaxed);
        if !ok {
            self.errors.fetch_add(1, Relaxed);
        }
        let now = self.now_micros();
        if self.in_flight.fetch_sub(1, Relaxed) == 1 {
            // Approximate under races (another call may have begun between
            // the two loads); good enough for a report, never negative.
            let since = self.busy_since.load(Relaxed);
            self.busy_micros
                .fetch_add(now.saturating_sub(since), Relaxed);
        }
    }
}

/// A backend that counts requests into a shared [`RequestStats`].
#[derive(Debug)]
pub struct MeteredBackend {
    inner: Arc<dyn LabBackend>,
    stats: Arc<RequestStats>,
}

impl MeteredBackend {
    /// Wraps `inner`.
    pub fn new(inner: Arc<dyn LabBackend>) -> Self {
        MeteredBackend {
            inner,
            stats: Arc::new(RequestStats::default()),
        }
    }

    /// The shared counters.
    pub fn stats(&self) -> Arc<RequestStats> {
        self.stats.clone()
    }

    fn timed<T>(
        &self,
        counter: &AtomicU64,
        f: impl FnOnce() -> Result<T, BackendError>,
    ) -> Result<T, BackendError> {
        counter.fetch_add(1, Relaxed);
        let t = self.stats.begin();
        let r = f();
        self.stats.end(t, r.is_ok());
        r
    }
}

impl crate::Layer for MeteredBackend {
    fn inner(&self) -> &dyn LabBackend {
        &*self.inner
    }

    fn put(&self, name: &str, data: &[u8]) -> Result<(), BackendError> {
        let r = self.timed(&self.stats.puts, || self.inner.put(name, data));
        if r.is_ok() {
            self.stats.bytes_up.fetch_add(data.len() as u64, Relaxed);
        }
        r
    }

    fn get(&self, name: &str, range: Option<Range<u64>>) -> Result<Vec<u8>, BackendError> {
        let r = self.timed(&self.stats.gets, || self.inner.get(name, range));
        if let Ok(v) = &r {
            self.stats.bytes_down.fetch_add(v.len() as u64, Relaxed);
        }
        r
    }

    fn put_owned(&self, name: &str, data: Vec<u8>) -> (Result<(), BackendError>, Option<Vec<u8>>) {
        let len = data.len() as u64;
        self.stats.puts.fetch_add(1, Relaxed);
        let t = self.stats.begin();
        let (r, back) = self.inner.put_owned(name, data);
        self.stats.end(t, r.is_ok());
        if r.is_ok() {
            self.stats.bytes_up.fetch_add(len, Relaxed);
        }
        (r, back)
    }

    fn put_stream(&self, name: &str, size: u64, data: &mut dyn Read) -> Result<(), BackendError> {
        let r = self.timed(&self.stats.puts, || self.inner.put_stream(name, size, data));
        if r.is_ok() {
            self.stats.bytes_up.fetch_add(size, Relaxed);
        }
        r
    }

    fn put_file(&self, name: &str, file: &std::fs::File, size: u64) -> Result<(), BackendError> {
        let r = self.timed(&self.stats.puts, || self.inner.put_file(name, file, size));
        if r.is_ok() {
            self.stats.bytes_up.fetch_add(size, Relaxed);
        }
        r
    }

    fn get_stream(
        &self,
        name: &str,
        range: Option<Range<u64>>,
        out: &mut dyn Write,
    ) -> Result<u64, BackendError> {
        let r = self.timed(&self.stats.gets, || self.inner.get_stream(name, range, out));
        if let Ok(n) = &r {
            self.stats.bytes_down.fetch_add(*n, Relaxed);
        }
        r
    }

    fn stat(&self, name: &str) -> Result<ObjectInfo, BackendError> {
        self.timed(&self.stats.stats, || self.inner.stat(name))
    }

    fn list(&self, prefix: &str) -> Result<Vec<ObjectInfo>, BackendError> {
        self.timed(&self.stats.lists, || self.inner.list(prefix))
    }

    fn list_temporaries(&self) -> Result<Vec<ObjectInfo>, BackendError> {
        self.timed(&self.stats.lists, || self.inner.list_temporaries())
    }

    fn delete(&self, name: &str) -> Result<(), BackendError> {
        self.timed(&self.stats.deletes, || self.inner.delete(name))
    }

    fn probe_write(
        &self,
        name: &str,
        data: &[u8],
        writes: usize,
        sync: bool,
    ) -> Result<(), BackendError> {
        let r = self.timed(&self.stats.puts, || {
            self.inner.probe_write(name, data, writes, sync)
        });
        if r.is_ok() {
            self.stats.bytes_up.fetch_add(data.len() as u64, Relaxed);
        }
        r
    }

    fn space(&self) -> Result<Option<Space>, BackendError> {
        self.timed(&self.stats.stats, || self.inner.space())
    }

    fn ping(&self) -> Result<(), BackendError> {
        self.timed(&self.stats.stats, || self.inner.ping())
    }

    fn remove_empty_dirs(&self) -> Result<(), BackendError> {
        self.timed(&self.stats.deletes, || self.inner.remove_empty_dirs())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Backend, LocalBackend, SyncPolicy};

    #[test]
    fn counts_each_call_and_its_bytes() {
        let d = tempfile::tempdir().unwrap();
        let m = MeteredBackend::new(Arc::new(
            LocalBackend::open(d.path(), SyncPolicy::NoSync).unwrap(),
        ));
        m.put("a/b", b"12345").unwrap();
        assert!(m.put("a/b", b"12345").is_err());
        assert_eq!(m.get("a/b", Some(1..3)).unwrap(), b"23");
        assert_eq!(m.list("a/").unwrap().len(), 1);
        m.delete("a/b").unwrap();
        let s = m.stats();
        assert_eq!(s.requests(), 5);
        assert_eq!(s.puts.load(Relaxed), 2);
        assert_eq!(s.errors.load(Relaxed), 1);
        assert_eq!(s.bytes_up.load(Relaxed), 5);
        assert_eq!(s.bytes_down.load(Relaxed), 2);
        assert_eq!(s.in_flight.load(Relaxed), 0);
        assert_eq!(s.max_in_flight.load(Relaxed), 1);
    }
}
