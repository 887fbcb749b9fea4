//! Destination probes: round-trip time, sequential throughput, many small
//! objects with and without stable storage, free space, and whether the
//! destination forces every write to stable storage.
//!
//! Every probe object lives under `probe/` of the lab's scratch location and
//! is deleted before the probe returns.

use std::io::Read;
use std::time::Instant;

use capsule_backend::{BackendError, ErrorKind, LabBackend};
use serde::{Deserialize, Serialize};

use crate::Result;

/// How much to measure.
#[derive(Debug, Clone)]
pub struct ProbeOptions {
    /// Bytes for the sequential write and read (large enough to pass the
    /// destination's caches).
    pub size: u64,
    /// Small objects created, listed, read and deleted (each way: with and
    /// without stable storage).
    pub small_files: usize,
    /// Size of each small object.
    pub small_size: usize,
    /// Round trips timed.
    pub rtt_samples: usize,
    /// Repetitions of each forced-sync measurement.
    pub sync_samples: usize,
}

impl Default for ProbeOptions {
    fn default() -> Self {
        ProbeOptions {
            size: 1 << 30,
            small_files: 1000,
            small_size: 50 * 1024,
            rtt_samples: 30,
            sync_samples: 9,
        }
    }
}

/// Distribution of repeated timings, in milliseconds.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Timing {
    /// Samples taken.
    pub samples: usize,
    /// Fastest.
    pub min_ms: f64,
    /// Median.
    pub median_ms: f64,
    /// 90th percentile.
    pub p90_ms: f64,
}

impl Timing {
    /// Summarises durations given in seconds.
    pub fn of(secs: &[f64]) -> Timing {
        let mut v: Vec<f64> = secs.iter().map(|s| s * 1e3).collect();
        v.sort_by(f64::total_cmp);
        let at = |q: f64| {
            if v.is_empty() {
                0.0
            } else {
                v[((v.len() - 1) as f64 * q).round() as usize]
            }
        };
        Timing {
            samples: v.len(),
            min_ms: at(0.0),
            median_ms: at(0.5),
            p90_ms: at(0.9),
        }
    }
}

/// One large transfer.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Transfer {
    /// Bytes moved.
    pub bytes: u64,
    /// Seconds taken.
    pub secs: f64,
    /// MB/s (10^6 bytes per second).
    pub mb_per_s: f64,
}

impl Transfer {
    fn new(bytes: u64, secs: f64) -> Transfer {
        Transfer {
            bytes,
            secs,
            mb_per_s: bytes as f64 / secs.max(1e-9) / 1e6,
        }
    }
}

/// Many small objects, one at a time, the way a per-file copier works.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct SmallObjects {
    /// Objects per pass.
    pub count: usize,
    /// Bytes each.
    pub size: usize,
    /// Created per second, each forced to stable storage.
    pub create_sync_per_s: f64,
    /// Created per second, left to the destination to flush.
    pub create_nosync_per_s: f64,
    /// Objects listed per second (one listing of all of them).
    pub list_per_s: f64,
    /// Seconds for that listing.
    pub list_secs: f64,
    /// Read per second.
    pub read_per_s: f64,
    /// Deleted per second.
    pub delete_per_s: f64,
}

/// Does the destination force writes to stable storage?
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SyncMode {
    /// Every write reaches stable storage before it is acknowledged
    /// (e.g. Samba `sync always = yes`, a file system mounted `sync`).
    Forced,
    /// Writes are buffered until the client asks for a flush.
    OnRequest,
    /// An object store: a PUT is acknowledged once stored; there is no
    /// unsynced write to compare with.
    NotApplicable,
    /// Stable storage costs too little here to tell the two apart.
    Undetermined,
}

/// The forced-sync verdict with its evidence.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SyncVerdict {
    /// The verdict.
    pub mode: SyncMode,
    /// Extra milliseconds per write request of an unflushed 1 MiB file
    /// written as 32 requests, compared with one request.
    pub per_write_ms: f64,
    /// Milliseconds a flush adds to a 1 MiB file written in one request.
    pub flush_ms: f64,
    /// In words.
    pub explanation: String,
}

/// Free space report.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize)]
pub struct SpaceReport {
    /// Free bytes.
    pub free: u64,
    /// Capacity.
    pub total: u64,
    /// Percent used.
    pub used_percent: f64,
}

/// Everything the probes measured.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Probe {
    /// Round trip of the cheapest request.
    pub rtt: Timing,
    /// Sequential write of one large object (stable on return).
    pub write: Option<Transfer>,
    /// Sequential read of it back.
    pub read: Option<Transfer>,
    /// Small objects, one at a time.
    pub small: Option<SmallObjects>,
    /// Forced sync.
    pub sync: SyncVerdict,
    /// Free space, where the destination can tell.
    pub space: Option<SpaceReport>,
    /// Notes on what was adapted (e.g. a size reduced to fit).
    pub notes: Vec<String>,
}

/// Deterministic incompressible bytes (xorshift), so nothing on the way can
/// shrink them.
pub struct Noise {
    state: u64,
    left: u64,
}

impl Noise {
    /// `len` bytes from `seed`.
    pub fn new(seed: u64, len: u64) -> Noise {
        Noise {
            state: seed | 1,
            left: len,
        }
    }

    /// Fills `buf` entirely.
    pub fn fill(&mut self, buf: &mut [u8]) {
        for c in buf.chunks_mut(8) {
            self.state ^= self.state << 13;
            self.state ^= self.state >> 7;
            self.state ^= self.state << 17;
            c.copy_from_slice(&self.state.to_le_bytes()[..c.len()]);
        }
    }

    /// `len` bytes as a vector.
    pub fn bytes(seed: u64, len: usize) -> Vec<u8> {
        let mut v = vec![0u8; len];
        Noise::new(seed, len as u64).fill(&mut v);
        v
    }
}

impl Read for Noise {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        // A large upload stops mid-stream when the lab is interrupted; the
        // backend then drops the partial object.
        if crate::interrupted() {
            return Err(std::io::Error::other("interrupted"));
        }
        let n = (buf.len() as u64).min(self.left) as usize;
        self.fill(&mut buf[..n]);
        self.left -= n as u64;
        Ok(n)
    }
}

fn time<T>(f: impl FnOnce() -> Result<T>) -> Result<(T, f64)> {
    let t = Instant::now();
    let r = f()?;
    Ok((r, t.elapsed().as_secs_f64()))
}

/// Times `n` cheapest requests.
pub fn round_trip(b: &dyn LabBackend, n: usize) -> Result<Timing> {
    // One untimed request first: connections and caches warm up.
    b.ping()?;
    let mut v = Vec::with_capacity(n);
    for _ in 0..n {
        v.push(time(|| Ok(b.ping()?))?.1);
    }
    Ok(Timing::of(&v))
}

/// Free space, as a report.
pub fn space(b: &dyn LabBackend) -> Result<Option<SpaceReport>> {
    Ok(b.space()?.map(|s| SpaceReport {
        free: s.free,
        total: s.total,
        used_percent: if s.total > 0 {
            (s.total - s.free.min(s.total)) as f64 * 100.0 / s.total as f64
        } else {
            0.0
        },
    }))
}

/// Writes then reads `size` bytes as one object.
pub fn sequential(b: &dyn LabBackend, size: u64) -> Result<(Transfer, Transfer)> {
    let name = "probe/sequential";
    b.delete(name)?;
    let r = (|| {
        let (_, w) = time(|| Ok(b.put_stream(name, size, &mut Noise::new(7, size))?))?;
        let (n, r) = time(|| Ok(b.get_stream(name, None, &mut std::io::sink())?))?;
        Ok((Transfer::new(size, w), Transfer::new(n, r)))
    })();
    let _ = b.delete(name);
    r
}

/// Creates, lists, reads and deletes `count` small objects one at a time.
pub fn small_objects(b: &dyn LabBackend, count: usize, size: usize) -> Result<SmallObjects> {
    let count = count.max(1);
    let data = Noise::bytes(11, size);
    let names = |tag: &str| -> Vec<String> {
        (0..count)
            .map(|i| format!("probe/small/{tag}/{:03}/{i:06}", i / 1000))
            .collect()
    };
    let (synced, unsynced) = (names("s"), names("n"));
    let r = (|| {
        let create = |names: &[String], sync: bool| {
            time(|| {
                for (i, n) in names.iter().enumerate() {
                    crate::check_interrupt()?;
                    let mut d = data.clone();
                    d[..8.min(size)].copy_from_slice(&(i as u64).to_le_bytes()[..8.min(size)]);
                    b.probe_write(n, &d, 1, sync)?;
                }
                Ok(())
            })
            .map(|(_, s)| s)
        };
        let c_sync = create(&synced, true)?;
        let c_nosync = create(&unsynced, false)?;
        let (listed, l) = time(|| Ok(b.list("probe/small/")?))?;
        if listed.len() < 2 * count {
            return Err(crate::LabError::Destination(BackendError::new(
                ErrorKind::Io,
                "list",
                "probe/small/",
                format!(
                    "listed {} of the {} objects just written",
                    listed.len(),
                    2 * count
                ),
            )));
        }
        let (_, rd) = time(|| {
            for n in &synced {
                b.get(n, None)?;
            }
            Ok(())
        })?;
        let (_, del) = time(|| {
            for n in synced.iter().chain(&unsynced) {
                b.delete(n)?;
            }
            Ok(())
        })?;
        let per = |n: usize, s: f64| n as f64 / s.max(1e-9);
        Ok(SmallObjects {
            count,
            size,
            create_sync_per_s: per(count, c_sync),
            create_nosync_per_s: per(count, c_nosync),
            list_per_s: per(listed.len(), l),
            list_secs: l,
            read_per_s: per(count, rd),
            delete_per_s: per(2 * count, del),
        })
    })();
    if r.is_err() {
        for n in synced.iter().chain(&unsynced) {
            let _ = b.delete(n);
        }
    }
    r
}

/// Pieces of the forced-sync probe's many-writes file.
const SYNC_PIECES: usize = 32;
/// Size of the forced-sync probe's file.
const SYNC_SIZE: usize = 1 << 20;

/// Decides whether the destination forces every write to stable storage.
///
/// A 1 MiB file is written unflushed in one request and in 32 requests, and
/// flushed in one request, `reps` times each, interleaved. Where writes are
/// buffered, 31 extra requests cost almost nothing (they travel together)
/// and the flush costs one real sync. Where every write is forced to
/// stable storage, each request costs a sync of its own, and the flush
/// finds nothing left to do.
pub fn forced_sync(
    b: &dyn LabBackend,
    remote_kind: Option<&str>,
    reps: usize,
) -> Result<SyncVerdict> {
    if remote_kind == Some("s3") {
        return Ok(SyncVerdict {
            mode: SyncMode::NotApplicable,
            per_write_ms: 0.0,
            flush_ms: 0.0,
            explanation: "an object store acknowledges a PUT only once it has stored it; there is no unsynced write to compare".into(),
        });
    }
    let data = Noise::bytes(13, SYNC_SIZE);
    let (mut one, mut many, mut flushed) = (Vec::new(), Vec::new(), Vec::new());
    let name = "probe/sync";
    let r = (|| -> Result<()> {
        // Warm-up: directories exist, connections are open.
        b.probe_write(name, &data, 1, false)?;
        for _ in 0..reps.max(3) {
            one.push(time(|| Ok(b.probe_write(name, &data, 1, false)?))?.1);
            many.push(time(|| Ok(b.probe_write(name, &data, SYNC_PIECES, false)?))?.1);
            flushed.push(time(|| Ok(b.probe_write(name, &data, 1, true)?))?.1);
        }
        Ok(())
    })();
    let _ = b.delete(name);
    r?;
    // Fastest of each: load only ever adds time, so minima compare what
    // the destination costs, where medians compare how busy the machine
    // was (medians made a sync-always share look buffered beside a CPU
    // burner).
    let min = |v: &[f64]| Timing::of(v).min_ms;
    let per_write_ms = ((min(&many) - min(&one)) / (SYNC_PIECES - 1) as f64).max(0.0);
    let flush_ms = (min(&flushed) - min(&one)).max(0.0);
    Ok(verdict(per_write_ms, flush_ms))
}

/// The decision rule, separate so it can be tested on numbers.
pub fn verdict(per_write_ms: f64, flush_ms: f64) -> SyncVerdict {
    // A buffered write request costs microseconds; a synced one costs at
    // least a journal commit (0.1 ms on fast SSDs, milliseconds on disks).
    // A write request that costs a twentieth of a flush or more is paying
    // for a sync: where writes are buffered, a request costs far less than
    // the one real sync a flush makes, however busy the machine is (both
    // grow with load). The ratio matters beside the absolute floor. Seen
    // beside CPU burners: a buffered SFTP write cost 0.11 ms against a
    // 6 ms flush, while a sync-always SMB share's write cost 0.26 ms against
    // 1.5 ms at 0 ms RTT, and 1.74 ms against 19.5 ms at 10 ms. The flush
    // must not carry a round trip of its own (the backends send it with the
    // close): CI once saw a sync-always share's 0.28 ms writes against a
    // 10.74 ms "flush" at 10 ms RTT, which was the round trip, and called
    // it buffered.
    const SYNCED_WRITE_MS: f64 = 0.08;
    let threshold = SYNCED_WRITE_MS.max(flush_ms / 20.0);
    let (mode, explanation) = if per_write_ms >= threshold {
        (
            SyncMode::Forced,
            format!(
                "every write request costs {per_write_ms:.2} ms more: the destination forces each write to stable storage (like Samba's `sync always = yes`); per-file copies and small writes pay a sync each"
            ),
        )
    } else if flush_ms >= SYNCED_WRITE_MS {
        (
            SyncMode::OnRequest,
            format!(
                "extra write requests cost {per_write_ms:.2} ms each while a flush costs {flush_ms:.2} ms: writes are buffered and reach stable storage when the client asks"
            ),
        )
    } else {
        (
            SyncMode::Undetermined,
            format!(
                "neither extra write requests ({per_write_ms:.2} ms) nor a flush ({flush_ms:.2} ms) cost measurably: stable storage is too cheap here to tell whether it is forced"
            ),
        )
    };
    SyncVerdict {
        mode,
        per_write_ms,
        flush_ms,
        explanation,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timing_takes_order_statistics() {
        let t = Timing::of(&[0.003, 0.001, 0.002, 0.010]);
        assert_eq!(t.samples, 4);
        assert_eq!(t.min_ms, 1.0);
        assert_eq!(t.median_ms, 3.0);
    }

    #[test]
    fn verdict_rule() {
        assert_eq!(verdict(0.5, 0.1).mode, SyncMode::Forced);
        assert_eq!(verdict(0.01, 2.0).mode, SyncMode::OnRequest);
        assert_eq!(verdict(0.01, 0.01).mode, SyncMode::Undetermined);
        // Seen beside CPU burners: a buffered SFTP write, a sync-always
        // SMB share at 0 and 10 ms.
        assert_eq!(verdict(0.11, 5.97).mode, SyncMode::OnRequest);
        assert_eq!(verdict(0.26, 1.52).mode, SyncMode::Forced);
        assert_eq!(verdict(2.73, 14.36).mode, SyncMode::Forced);
        assert_eq!(verdict(1.74, 19.5).mode, SyncMode::Forced);
        // Since a synced probe costs no extra round trip (flush and close
        // travel together): sync-always SMB, buffered SMB and SFTP at 0 ms.
        assert_eq!(verdict(0.21, 0.43).mode, SyncMode::Forced);
        assert_eq!(verdict(0.004, 0.81).mode, SyncMode::OnRequest);
        assert_eq!(verdict(0.012, 0.98).mode, SyncMode::OnRequest);
    }

    #[test]
    fn noise_is_deterministic_and_sized() {
        let mut a = Vec::new();
        Noise::new(1, 1000).read_to_end(&mut a).unwrap();
        assert_eq!(a.len(), 1000);
        let mut b = vec![0u8; 1000];
        Noise::new(1, 1000).fill(&mut b);
        assert_eq!(a, b);
    }
}
