//! The time series every run records: a sampler thread reads the engine's
//! progress counters and the destination's request counters at a fixed
//! interval. Samples are cumulative; rates are differences, so a late sample
//! never loses work.

use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use capsule_backend::RequestStats;
use capsule_engine::progress::Progress;
use serde::{Deserialize, Serialize};

/// Cumulative counters at one instant.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq)]
pub struct Sample {
    /// Seconds since the run started.
    pub t: f64,
    /// Items (files) processed: read or found unchanged.
    pub items: u64,
    /// Bytes of processed files.
    pub bytes: u64,
    /// Bytes read from the source.
    pub bytes_read: u64,
    /// Bytes sent to the destination.
    pub bytes_up: u64,
    /// Requests to the destination.
    pub requests: u64,
    /// Requests in flight at this instant.
    pub in_flight: u64,
    /// Wall seconds so far with at least one request in flight.
    pub waiting: f64,
}

/// Rates between two consecutive samples, for charts and bound analysis.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq)]
pub struct Rate {
    /// Middle of the interval, seconds since start.
    pub t: f64,
    /// Items per second.
    pub items_per_s: f64,
    /// Source MB/s (10^6 bytes) processed.
    pub mb_per_s: f64,
    /// MB/s sent to the destination.
    pub up_mb_per_s: f64,
    /// Requests in flight (at the interval's end).
    pub in_flight: u64,
    /// Fraction of the interval spent with a request in flight (0..1).
    pub waiting: f64,
}

/// Turns cumulative samples into per-interval rates.
pub fn rates(samples: &[Sample]) -> Vec<Rate> {
    samples
        .windows(2)
        .filter_map(|w| {
            let dt = w[1].t - w[0].t;
            (dt > 0.0).then(|| Rate {
                t: (w[0].t + w[1].t) / 2.0,
                items_per_s: w[1].items.saturating_sub(w[0].items) as f64 / dt,
                mb_per_s: w[1].bytes.saturating_sub(w[0].bytes) as f64 / dt / 1e6,
                up_mb_per_s: w[1].bytes_up.saturating_sub(w[0].bytes_up) as f64 / dt / 1e6,
                in_flight: w[1].in_flight,
                waiting: ((w[1].waiting - w[0].waiting) / dt).clamp(0.0, 1.0),
            })
        })
        .collect()
}

/// What the sampler reads.
#[derive(Clone, Default)]
pub struct Sources {
    /// The engine's progress counters.
    pub progress: Option<Arc<Progress>>,
    /// The destination's request counters.
    pub requests: Option<Arc<RequestStats>>,
}

impl Sources {
    fn sample(&self, t: f64) -> Sample {
        let mut s = Sample {
            t,
            ..Sample::default()
        };
        if let Some(p) = &self.progress {
            s.items = Progress::get(&p.files_done);
            s.bytes = Progress::get(&p.bytes_done);
            s.bytes_read = Progress::get(&p.bytes_read);
        }
        if let Some(r) = &self.requests {
            s.bytes_up = r.bytes_up.load(Relaxed);
            s.requests = r.requests();
            s.in_flight = r.in_flight.load(Relaxed);
            s.waiting = r.busy_micros.load(Relaxed) as f64 / 1e6;
        }
        s
    }
}

/// Most samples kept: long runs are thinned to this many, evenly.
const MAX_SAMPLES: usize = 600;

/// A running sampler; [`Recorder::finish`] stops it and returns the series.
pub struct Recorder {
    /// Dropping it wakes the sampler at once (a sleeping sampler would
    /// otherwise hold up the end of every run by up to one interval).
    stop: Option<std::sync::mpsc::Sender<()>>,
    samples: Arc<Mutex<Vec<Sample>>>,
    handle: Option<JoinHandle<()>>,
    sources: Sources,
    started: Instant,
}

impl Recorder {
    /// Starts sampling every `interval`. The first sample is taken now.
    pub fn start(sources: Sources, interval: Duration) -> Recorder {
        let started = Instant::now();
        let (stop, stopped) = std::sync::mpsc::channel::<()>();
        let samples = Arc::new(Mutex::new(vec![sources.sample(0.0)]));
        let handle = {
            let (samples, sources) = (samples.clone(), sources.clone());
            std::thread::Builder::new()
                .name("sampler".into())
                .spawn(move || {
                    let mut interval = interval;
                    while let Err(std::sync::mpsc::RecvTimeoutError::Timeout) =
                        stopped.recv_timeout(interval)
                    {
                        let s = sources.sample(started.elapsed().as_secs_f64());
                        let mut v = samples.lock().unwrap_or_else(|p| p.into_inner());
                        v.push(s);
                        // Halve the resolution when full: memory stays
                        // bounded however long the run.
                        if v.len() >= MAX_SAMPLES {
                            let thinned: Vec<Sample> = v.iter().step_by(2).copied().collect();
                            *v = thinned;
                            interval *= 2;
                        }
                    }
                })
                .ok()
        };
        Recorder {
            stop: Some(stop),
            samples,
            handle,
            sources,
            started,
        }
    }

    /// Stops the sampler; the last sample is taken now.
    pub fn finish(mut self) -> Vec<Sample> {
        drop(self.stop.take());
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
        let mut v = std::mem::take(&mut *self.samples.lock().unwrap_or_else(|p| p.into_inner()));
        v.push(self.sources.sample(self.started.elapsed().as_secs_f64()));
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_are_differences_over_time() {
        let a = Sample {
            t: 1.0,
            items: 10,
            bytes: 1_000_000,
            waiting: 0.5,
            ..Sample::default()
        };
        let b = Sample {
            t: 3.0,
            items: 30,
            bytes: 5_000_000,
            waiting: 1.5,
            ..Sample::default()
        };
        let r = rates(&[a, b]);
        assert_eq!(r.len(), 1);
        assert_eq!(r[0].t, 2.0);
        assert_eq!(r[0].items_per_s, 10.0);
        assert_eq!(r[0].mb_per_s, 2.0);
        assert_eq!(r[0].waiting, 0.5);
    }

    #[test]
    fn recorder_samples_live_counters() {
        let p = Arc::new(Progress::default());
        let rec = Recorder::start(
            Sources {
                progress: Some(p.clone()),
                requests: None,
            },
            Duration::from_millis(5),
        );
        for _ in 0..5 {
            Progress::add(&p.files_done, 1);
            std::thread::sleep(Duration::from_millis(10));
        }
        let s = rec.finish();
        assert!(s.len() >= 3, "{s:?}");
        assert_eq!(s.first().map(|s| s.items), Some(0));
        assert_eq!(s.last().map(|s| s.items), Some(5));
        assert!(s.windows(2).all(|w| w[0].t <= w[1].t));
    }
}
