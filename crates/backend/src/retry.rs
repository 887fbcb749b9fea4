//! Retries with exponential backoff for transient failures only: a reset
//! connection, a timeout, a server that restarts. Permanent errors (not
//! found, already exists, no space, bad credentials) pass through at once.
//!
//! Retrying a `put` is safe because a failed put leaves no visible object
//! (the contract makes puts atomic). If an earlier attempt did land and only
//! its answer was lost, the retry reports `AlreadyExists`, which callers of
//! content-addressed names treat as success.

use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::contract::{BackendError, LabBackend, ObjectInfo, Space};

/// How often and how patiently to retry.
#[derive(Debug, Clone, Copy)]
pub struct RetryPolicy {
    /// Attempts in all, including the first.
    pub attempts: u32,
    /// Delay before the first retry; doubles each time.
    pub initial: Duration,
    /// Upper bound of one delay.
    pub max_delay: Duration,
    /// How long one call keeps retrying, counted from its first failure:
    /// a destination away for less (a NAS restarting, a node of a
    /// distributed store lost and back, a Wi-Fi link dropping) is ridden
    /// out. `attempts` are made however short it is, as long as they fail
    /// quickly (within [`QUICK_FAILURES`]).
    pub ride_out: Duration,
}

/// How long after a call's first failure its `attempts` are still made
/// whatever the ride-out: long enough for six quick failures (about 8 s),
/// short enough that requests which each hang until their deadline (a
/// store that has lost its quorum) do not stretch a run far past the
/// ride-out it promised.
pub const QUICK_FAILURES: Duration = Duration::from_secs(15);

/// How long a destination may be away before a run gives up on it, by
/// default (`--retry-for` changes it).
pub const RIDE_OUT: Duration = Duration::from_secs(60);

impl Default for RetryPolicy {
    /// Retries starting at 250 ms, doubling to at most 8 s apart, for up to
    /// a minute ([`RIDE_OUT`]): a node of a distributed store restarting,
    /// or a NAS waking up, comes back within it; a dead server is reported
    /// a minute after it stopped answering.
    fn default() -> Self {
        RetryPolicy {
            attempts: 6,
            initial: Duration::from_millis(250),
            max_delay: Duration::from_secs(8),
            ride_out: RIDE_OUT,
        }
    }
}

impl RetryPolicy {
    /// The delay before retry number `n` (1-based), with up to 25% jitter so
    /// that parallel uploaders do not retry in lockstep.
    fn delay(&self, n: u32) -> Duration {
        let base = self
            .initial
            .saturating_mul(1u32 << (n - 1).min(16))
            .min(self.max_delay);
        let mut r = [0u8; 2];
        let _ = getrandom::fill(&mut r);
        let jitter = u16::from_le_bytes(r) as f64 / u16::MAX as f64 * 0.25;
        base.mul_f64(1.0 + jitter)
    }
}

impl RetryPolicy {
    /// Whether a call that has failed `failed` times, the first `since`
    /// ago, tries again after `delay`.
    fn keep_trying(&self, failed: u32, since: Duration, delay: Duration) -> bool {
        let quick = failed < self.attempts && since < QUICK_FAILURES;
        quick || since + delay <= self.ride_out
    }
}

/// A backend that retries transient failures of the one it wraps.
#[derive(Debug)]
pub struct RetryBackend {
    inner: Arc<dyn LabBackend>,
    policy: RetryPolicy,
    retries: Arc<AtomicU64>,
}

impl RetryBackend {
    /// Wraps `inner`.
    pub fn new(inner: Arc<dyn LabBackend>, policy: RetryPolicy) -> Self {
        RetryBackend {
            inner,
            policy,
            retries: Arc::new(AtomicU64::new(0)),
        }
    }

    /// Count of retries made so far (shared, for reports).
    pub fn retries(&self) -> Arc<AtomicU64> {
        self.retries.clone()
    }

    fn run<T>(&self, mut f: impl FnMut() -> Result<T, BackendError>) -> Result<T, BackendError> {
        let mut budget = Budget::default();
        loop {
            match f() {
                Err(e) if e.transient => {
                    if !self.wait(&mut budget) {
                        return Err(self.gave_up(e, &budget));
                    }
                }
                r => return r,
            }
        }
    }

    /// After a transient failure: waits before the next attempt and says
    /// true, or says false when the policy is spent (its attempts made and
    /// its ride-out over).
    fn wait(&self, b: &mut Budget) -> bool {
        let first = *b.first.get_or_insert_with(Instant::now);
        b.failed += 1;
        let delay = self.policy.delay(b.failed);
        if self.policy.keep_trying(b.failed, first.elapsed(), delay) {
            self.retries.fetch_add(1, Relaxed);
            std::thread::sleep(delay);
            true
        } else {
            false
        }
    }

    /// The error a spent policy gives up with, saying how long it waited
    /// and how to wait longer.
    fn gave_up(&self, mut e: BackendError, b: &Budget) -> BackendError {
        if b.failed > 1 {
            let secs = b.first.map_or(0.0, |t| t.elapsed().as_secs_f64());
            e.message = format!(
                "{} (gave up after {} attempts in {secs:.0} s: the destination was away longer than a run waits for it, {} s; --retry-for SECS changes that)",
                e.message,
                b.failed,
                self.policy.ride_out.as_secs()
            );
        }
        e
    }
}

/// One call's retries so far: failed attempts, and when the first failed.
#[derive(Default)]
struct Budget {
    failed: u32,
    first: Option<Instant>,
}

/// `put_stream` and `get_stream` are not retried (the source cannot be
/// rewound, and part of the object may already have been written out;
/// callers with a seekable source retry themselves), nor is `ping` (it
/// measures the round trip, and a retried one would hide the failure it is
/// meant to show): the layer forwards them unchanged.
impl crate::contract::Layer for RetryBackend {
    fn inner(&self) -> &dyn LabBackend {
        &*self.inner
    }

    fn put(&self, name: &str, data: &[u8]) -> Result<(), BackendError> {
        self.run(|| self.inner.put(name, data))
    }

    fn get(&self, name: &str, range: Option<Range<u64>>) -> Result<Vec<u8>, BackendError> {
        self.run(|| self.inner.get(name, range.clone()))
    }

    /// Retried while the destination gives the buffer back (a backend that
    /// kept it cannot be asked again).
    fn put_owned(&self, name: &str, data: Vec<u8>) -> (Result<(), BackendError>, Option<Vec<u8>>) {
        let mut data = data;
        let mut budget = Budget::default();
        loop {
            match self.inner.put_owned(name, data) {
                (Err(e), Some(back)) if e.transient => {
                    if !self.wait(&mut budget) {
                        return (Err(self.gave_up(e, &budget)), Some(back));
                    }
                    data = back;
                }
                done => return done,
            }
        }
    }

    /// Retried as a whole: the file is read from its start each time.
    fn put_file(&self, name: &str, file: &std::fs::File, size: u64) -> Result<(), BackendError> {
        self.run(|| self.inner.put_file(name, file, size))
    }

    fn stat(&self, name: &str) -> Result<ObjectInfo, BackendError> {
        self.run(|| self.inner.stat(name))
    }

    fn list(&self, prefix: &str) -> Result<Vec<ObjectInfo>, BackendError> {
        self.run(|| self.inner.list(prefix))
    }

    fn list_temporaries(&self) -> Result<Vec<ObjectInfo>, BackendError> {
        self.run(|| self.inner.list_temporaries())
    }

    fn delete(&self, name: &str) -> Result<(), BackendError> {
        self.run(|| self.inner.delete(name))
    }

    fn probe_write(
        &self,
        name: &str,
        data: &[u8],
        writes: usize,
        sync: bool,
    ) -> Result<(), BackendError> {
        self.run(|| self.inner.probe_write(name, data, writes, sync))
    }

    fn space(&self) -> Result<Option<Space>, BackendError> {
        self.run(|| self.inner.space())
    }

    fn remove_empty_dirs(&self) -> Result<(), BackendError> {
        self.run(|| self.inner.remove_empty_dirs())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::contract::{Backend, Capabilities, ErrorKind};
    use std::sync::Mutex;

    /// Fails the first `fail` calls with the given error, then succeeds.
    #[derive(Debug)]
    struct Flaky {
        fail: Mutex<u32>,
        transient: bool,
    }

    impl Backend for Flaky {
        fn put(&self, name: &str, _: &[u8]) -> Result<(), BackendError> {
            let mut f = self.fail.lock().unwrap();
            if *f > 0 {
                *f -= 1;
                let mut e = BackendError::new(ErrorKind::Unreachable, "put", name, "reset");
                e.transient = self.transient;
                return Err(e);
            }
            Ok(())
        }
        fn get(&self, _: &str, _: Option<Range<u64>>) -> Result<Vec<u8>, BackendError> {
            Ok(vec![])
        }
        fn stat(&self, n: &str) -> Result<ObjectInfo, BackendError> {
            Err(BackendError::new(ErrorKind::NotFound, "stat", n, "no"))
        }
        fn list(&self, _: &str) -> Result<Vec<ObjectInfo>, BackendError> {
            Ok(vec![])
        }
        fn delete(&self, _: &str) -> Result<(), BackendError> {
            Ok(())
        }
        fn capabilities(&self) -> Capabilities {
            Capabilities {
                concurrency: 1,
                durable_put: true,
                local: false,
                buffers_puts: false,
            }
        }
        fn location(&self) -> String {
            "flaky".into()
        }
    }

    impl LabBackend for Flaky {}

    fn quick() -> RetryPolicy {
        RetryPolicy {
            attempts: 3,
            initial: Duration::from_millis(1),
            max_delay: Duration::from_millis(2),
            ride_out: Duration::ZERO,
        }
    }

    #[test]
    fn transient_errors_are_retried_until_the_budget_ends() {
        let ok = RetryBackend::new(
            Arc::new(Flaky {
                fail: Mutex::new(2),
                transient: true,
            }),
            quick(),
        );
        ok.put("x", b"").unwrap();
        assert_eq!(ok.retries().load(Relaxed), 2);

        let gives_up = RetryBackend::new(
            Arc::new(Flaky {
                fail: Mutex::new(5),
                transient: true,
            }),
            quick(),
        );
        let e = gives_up.put("x", b"").unwrap_err();
        assert!(e.message.contains("gave up after 3 attempts"), "{e}");
        assert!(e.message.contains("--retry-for"), "{e}");
    }

    #[test]
    fn an_outage_within_the_ride_out_is_ridden_out() {
        // 40 failures, a few milliseconds apart: far more than `attempts`,
        // far less than the bound (they take milliseconds, the bound is a
        // minute).
        let b = RetryBackend::new(
            Arc::new(Flaky {
                fail: Mutex::new(40),
                transient: true,
            }),
            RetryPolicy {
                ride_out: Duration::from_secs(60),
                ..quick()
            },
        );
        b.put("x", b"").unwrap();
        assert_eq!(b.retries().load(Relaxed), 40);
    }

    #[test]
    fn slow_failures_stop_at_the_ride_out_not_after_every_attempt() {
        let p = RetryPolicy {
            ride_out: Duration::from_secs(60),
            ..RetryPolicy::default()
        };
        let s = Duration::from_secs;
        // Quick failures: every attempt is made, whatever the ride-out.
        let none = RetryPolicy {
            ride_out: Duration::ZERO,
            ..p
        };
        assert!(none.keep_trying(5, s(8), s(4)));
        assert!(!none.keep_trying(6, s(8), s(4)));
        // Requests that each hang for 30 s: the second failure comes 30 s
        // after the first, the third a minute after; the ride-out ends it
        // there, not the five attempts left (which made a run against a
        // store without quorum take ten minutes).
        assert!(p.keep_trying(2, s(30), s(1)));
        assert!(!p.keep_trying(3, s(60), s(1)));
        assert!(!none.keep_trying(2, s(30), s(1)));
    }

    #[test]
    fn permanent_errors_are_not_retried() {
        let b = RetryBackend::new(
            Arc::new(Flaky {
                fail: Mutex::new(1),
                transient: false,
            }),
            quick(),
        );
        assert!(b.put("x", b"").is_err());
        assert_eq!(b.retries().load(Relaxed), 0);
        assert_eq!(b.stat("y").unwrap_err().kind, ErrorKind::NotFound);
    }
}
