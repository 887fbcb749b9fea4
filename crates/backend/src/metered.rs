//! Round-trip accounting: a decorator that counts every request that reaches
//! the destination and the time spent waiting for it. It sits directly on the
//! destination's backend (below the retry layer and the cache), so each
//! attempt on the wire is one request.

use std::io::{Read, Write};
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use crate::contract::{BackendError, LabBackend, ObjectInfo, Space};

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

/// A backend that counts requests into a shared [`RequestStats`], and
/// optionally writes one line per request to a trace.
#[derive(Debug)]
pub struct MeteredBackend {
    inner: Arc<dyn LabBackend>,
    stats: Arc<RequestStats>,
    trace: Option<TraceSink>,
}

/// Where the request trace goes. A line per request, tab-separated: start
/// and duration in seconds since the trace began, the operation, bytes
/// moved, `ok` or the error kind, and the object name. Lines are written
/// as requests end, so they are ordered by end time; sort by the first
/// column for a timeline.
///
/// Cheap to clone: every [`MeteredBackend`] given a clone writes into the
/// same file on one timeline (the lab and the estimator open many
/// destinations in one command).
#[derive(Clone)]
pub struct TraceSink(Arc<Mutex<Trace>>);

struct Trace {
    out: Box<dyn Write + Send>,
    /// When the trace began: every line's start is counted from here.
    epoch: Instant,
    /// The first write error, after which tracing stops: a trace must never
    /// fail a backup.
    error: Option<String>,
}

impl std::fmt::Debug for TraceSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TraceSink")
    }
}

impl TraceSink {
    /// A trace into `out`; the header line is written now.
    pub fn new(mut out: Box<dyn Write + Send>) -> TraceSink {
        let header =
            writeln!(out, "start_s\tsecs\top\tbytes\tresult\tname").and_then(|_| out.flush());
        TraceSink(Arc::new(Mutex::new(Trace {
            out,
            epoch: Instant::now(),
            error: header.err().map(|e| e.to_string()),
        })))
    }

    /// Why writing the trace failed, if it did: it stops there, and the
    /// command should say so at its end.
    pub fn error(&self) -> Option<String> {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .error
            .clone()
    }

    fn line(&self, started: Instant, op: &str, name: &str, bytes: u64, result: &str) {
        let secs = started.elapsed().as_secs_f64();
        let mut t = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if t.error.is_some() {
            return;
        }
        let start = started.saturating_duration_since(t.epoch).as_secs_f64();
        let line = format!("{start:.6}\t{secs:.6}\t{op}\t{bytes}\t{result}\t{name}\n");
        if let Err(e) = t.out.write_all(line.as_bytes()).and_then(|_| t.out.flush()) {
            t.error = Some(e.to_string());
        }
    }
}

impl MeteredBackend {
    /// Wraps `inner`.
    pub fn new(inner: Arc<dyn LabBackend>) -> Self {
        MeteredBackend {
            inner,
            stats: Arc::new(RequestStats::default()),
            trace: None,
        }
    }

    /// Also writes every request to `sink` (see [`TraceSink`]).
    pub fn with_trace(mut self, sink: TraceSink) -> Self {
        self.trace = Some(sink);
        self
    }

    /// The shared counters.
    pub fn stats(&self) -> Arc<RequestStats> {
        self.stats.clone()
    }

    fn timed<T>(
        &self,
        counter: &AtomicU64,
        op: &str,
        name: &str,
        bytes: impl FnOnce(&T) -> u64,
        f: impl FnOnce() -> Result<T, BackendError>,
    ) -> Result<T, BackendError> {
        counter.fetch_add(1, Relaxed);
        let t = self.stats.begin();
        let r = f();
        self.stats.end(t, r.is_ok());
        if self.trace.is_some() {
            let moved = r.as_ref().map(bytes).unwrap_or(0);
            self.record(t, op, name, moved, r.as_ref().err());
        }
        r
    }

    fn record(
        &self,
        started: Instant,
        op: &str,
        name: &str,
        bytes: u64,
        err: Option<&BackendError>,
    ) {
        let Some(trace) = &self.trace else { return };
        let result = match err {
            None => "ok".to_string(),
            Some(e) => format!("{:?}", e.kind),
        };
        trace.line(started, op, name, bytes, &result);
    }
}

impl crate::contract::Layer for MeteredBackend {
    fn inner(&self) -> &dyn LabBackend {
        &*self.inner
    }

    fn put(&self, name: &str, data: &[u8]) -> Result<(), BackendError> {
        let len = data.len() as u64;
        let r = self.timed(
            &self.stats.puts,
            "put",
            name,
            |_| len,
            || self.inner.put(name, data),
        );
        if r.is_ok() {
            self.stats.bytes_up.fetch_add(len, Relaxed);
        }
        r
    }

    fn get(&self, name: &str, range: Option<Range<u64>>) -> Result<Vec<u8>, BackendError> {
        let r = self.timed(
            &self.stats.gets,
            "get",
            name,
            |v: &Vec<u8>| v.len() as u64,
            || self.inner.get(name, range),
        );
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
        if self.trace.is_some() {
            let moved = if r.is_ok() { len } else { 0 };
            self.record(t, "put", name, moved, r.as_ref().err());
        }
        if r.is_ok() {
            self.stats.bytes_up.fetch_add(len, Relaxed);
        }
        (r, back)
    }

    fn put_stream(&self, name: &str, size: u64, data: &mut dyn Read) -> Result<(), BackendError> {
        let r = self.timed(
            &self.stats.puts,
            "put",
            name,
            |_| size,
            || self.inner.put_stream(name, size, data),
        );
        if r.is_ok() {
            self.stats.bytes_up.fetch_add(size, Relaxed);
        }
        r
    }

    fn put_file(&self, name: &str, file: &std::fs::File, size: u64) -> Result<(), BackendError> {
        let r = self.timed(
            &self.stats.puts,
            "put",
            name,
            |_| size,
            || self.inner.put_file(name, file, size),
        );
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
        let r = self.timed(
            &self.stats.gets,
            "get",
            name,
            |n| *n,
            || self.inner.get_stream(name, range, out),
        );
        if let Ok(n) = &r {
            self.stats.bytes_down.fetch_add(*n, Relaxed);
        }
        r
    }

    fn stat(&self, name: &str) -> Result<ObjectInfo, BackendError> {
        self.timed(
            &self.stats.stats,
            "stat",
            name,
            |_| 0,
            || self.inner.stat(name),
        )
    }

    fn list(&self, prefix: &str) -> Result<Vec<ObjectInfo>, BackendError> {
        self.timed(
            &self.stats.lists,
            "list",
            prefix,
            |_| 0,
            || self.inner.list(prefix),
        )
    }

    fn list_temporaries(&self) -> Result<Vec<ObjectInfo>, BackendError> {
        self.timed(
            &self.stats.lists,
            "list",
            TEMP_LISTING,
            |_| 0,
            || self.inner.list_temporaries(),
        )
    }

    fn delete(&self, name: &str) -> Result<(), BackendError> {
        self.timed(
            &self.stats.deletes,
            "delete",
            name,
            |_| 0,
            || self.inner.delete(name),
        )
    }

    fn probe_write(
        &self,
        name: &str,
        data: &[u8],
        writes: usize,
        sync: bool,
    ) -> Result<(), BackendError> {
        let len = data.len() as u64;
        let r = self.timed(
            &self.stats.puts,
            "probe_write",
            name,
            |_| len,
            || self.inner.probe_write(name, data, writes, sync),
        );
        if r.is_ok() {
            self.stats.bytes_up.fetch_add(len, Relaxed);
        }
        r
    }

    fn space(&self) -> Result<Option<Space>, BackendError> {
        self.timed(&self.stats.stats, "space", "", |_| 0, || self.inner.space())
    }

    fn ping(&self) -> Result<(), BackendError> {
        self.timed(&self.stats.stats, "ping", "", |_| 0, || self.inner.ping())
    }

    fn remove_empty_dirs(&self) -> Result<(), BackendError> {
        self.timed(
            &self.stats.deletes,
            "remove_empty_dirs",
            "",
            |_| 0,
            || self.inner.remove_empty_dirs(),
        )
    }
}

/// The name a trace gives the listing of incomplete writes.
const TEMP_LISTING: &str = "(temporaries)";

#[cfg(test)]
mod tests {
    use super::*;
    use crate::contract::Backend;
    use crate::local::{LocalBackend, SyncPolicy};

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

    /// A `Write` into a buffer the test keeps.
    #[derive(Clone, Default)]
    struct Shared(Arc<Mutex<Vec<u8>>>);

    impl Write for Shared {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn the_trace_has_a_line_per_request_with_its_outcome() {
        let d = tempfile::tempdir().unwrap();
        let out = Shared::default();
        let m = MeteredBackend::new(Arc::new(
            LocalBackend::open(d.path(), SyncPolicy::NoSync).unwrap(),
        ))
        .with_trace(TraceSink::new(Box::new(out.clone())));
        m.put("a/b", b"12345").unwrap();
        assert!(m.put("a/b", b"12345").is_err());
        assert_eq!(m.get("a/b", Some(1..3)).unwrap(), b"23");
        assert!(m.get("a/c", None).is_err());
        m.list("a/").unwrap();
        let text = String::from_utf8(out.0.lock().unwrap().clone()).unwrap();
        let lines: Vec<Vec<&str>> = text.lines().map(|l| l.split('\t').collect()).collect();
        assert_eq!(
            lines[0],
            ["start_s", "secs", "op", "bytes", "result", "name"]
        );
        let rows: Vec<[&str; 4]> = lines[1..]
            .iter()
            .map(|f| [f[2], f[3], f[4], f[5]])
            .collect();
        assert_eq!(
            rows,
            [
                ["put", "5", "ok", "a/b"],
                ["put", "0", "AlreadyExists", "a/b"],
                ["get", "2", "ok", "a/b"],
                ["get", "0", "NotFound", "a/c"],
                ["list", "0", "ok", "a/"],
            ]
        );
        // Times are seconds since the trace began, each start no later
        // than the next one's (the calls ran one after another).
        let starts: Vec<f64> = lines[1..].iter().map(|f| f[0].parse().unwrap()).collect();
        assert!(starts.windows(2).all(|w| w[0] <= w[1]), "{starts:?}");
        assert!(lines[1..]
            .iter()
            .all(|f| f[1].parse::<f64>().unwrap() >= 0.0));
    }
}
