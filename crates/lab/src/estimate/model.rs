//! The cost model: what this machine and the destination were measured
//! to cost, and the predictions made from it.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::source::SourceScan;

/// This machine's pipeline costs, measured on samples of the source.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Calibration {
    /// Seconds per file read (beyond its bytes).
    pub per_file: f64,
    /// Seconds per byte read.
    pub per_byte: f64,
    /// Seconds per file and per byte reading the samples cold (their pages
    /// dropped from the page cache first) and warm.
    #[serde(default)]
    pub cold: (f64, f64),
    /// See `cold`.
    #[serde(default)]
    pub warm: (f64, f64),
    /// The share of the source in the page cache now, by which `per_file`
    /// and `per_byte` blend the warm costs with the cold ones.
    #[serde(default)]
    pub cached_share: f64,
    /// Seconds per unchanged file in a run with a parent.
    pub per_unchanged_file: f64,
    /// The subtree whose runs with nothing changed gave `per_unchanged_file`
    /// (none: the small sample's, for want of a subtree that fits).
    #[serde(default)]
    pub unchanged_sample: Option<PathBuf>,
    /// Seconds of such a run over that subtree per second of a plain walk
    /// of it, which scales to the whole source's walk.
    #[serde(default)]
    pub walk_factor: f64,
    /// Bytes stored per byte read (compression; new data).
    pub stored_ratio: f64,
    /// Files and bytes in the two samples.
    pub samples: [(u64, u64); 2],
    /// Seconds per file restored from a local repository (beyond its
    /// bytes).
    #[serde(default)]
    pub restore_per_file: f64,
    /// Seconds per directory restored from a local repository.
    #[serde(default)]
    pub restore_per_dir: f64,
    /// Seconds per byte restored from a local repository.
    #[serde(default)]
    pub restore_per_byte: f64,
    /// CPU seconds (this process, all threads) per file of those restores,
    /// beyond its bytes: decrypting, decompressing, creating and writing.
    #[serde(default)]
    pub restore_cpu_per_file: f64,
    /// CPU seconds per directory of those restores.
    #[serde(default)]
    pub restore_cpu_per_dir: f64,
    /// CPU seconds per byte of those restores.
    #[serde(default)]
    pub restore_cpu_per_byte: f64,
    /// Seconds per byte of the large restore sample, all charged to bytes:
    /// how fast the target disk takes a restore's bulk, written by every
    /// worker at once.
    #[serde(default)]
    pub restore_write_per_byte: f64,
    /// Seconds per file of the small restore sample spent off the CPU:
    /// waiting for the target disk to create and close files.
    #[serde(default)]
    pub restore_wait_per_file: f64,
    /// Each restored sample's median round, from which the restore costs
    /// were fitted.
    #[serde(default)]
    pub restore_samples: Vec<RestoreSample>,
    /// The farthest any repeated calibration round (the warm backups and
    /// the restores of the small and the large sample) lay from its
    /// median, relative to it: this machine's own variation while it was
    /// measured.
    #[serde(default)]
    pub spread: f64,
    /// How far the cold reads of three disjoint samples put the source's
    /// cold read from their median, relative to it: how much this disk's
    /// cold read varied while it was measured, which the initial backup
    /// of a source not in the cache meets.
    #[serde(default)]
    pub cold_spread: f64,
    /// Cores this machine gives capsule (0 in records from before it was
    /// measured: then no CPU bound is applied).
    #[serde(default)]
    pub cores: usize,
}

/// One calibration sample restored from its local repository: what it
/// holds and what restoring it took (the median of three rounds).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct RestoreSample {
    /// `empty`, `dirs`, `small`, `tree` (the subtree of the run with
    /// nothing changed) or `large`.
    pub name: String,
    /// Regular files restored.
    pub files: u64,
    /// Directories restored, those above the sample's paths included.
    pub dirs: u64,
    /// Symlinks and other entries restored.
    pub others: u64,
    /// Bytes of file content.
    pub bytes: u64,
    /// Seconds.
    pub secs: f64,
    /// CPU seconds of this process (0 where not measured).
    pub cpu: f64,
}

/// The destination, probed briefly.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct DestProbe {
    /// Seconds to connect.
    pub connect_secs: f64,
    /// Median round trip, seconds.
    pub rtt: f64,
    /// One stream, bytes/s.
    pub stream_bw: f64,
    /// Uploads in flight as a backup runs them, bytes/s.
    pub parallel_bw: f64,
    /// Uploads a backup keeps in flight.
    pub concurrency: usize,
    /// Ranged reads of 4 MiB, as many in flight as a restore keeps,
    /// bytes/s.
    #[serde(default)]
    pub download_bw: f64,
    /// CPU seconds, on the whole machine, per byte of those reads: the
    /// client's receive path, and the server and any proxy when they share
    /// this machine (0 where it cannot be measured).
    #[serde(default)]
    pub download_cpu_per_byte: f64,
    /// Seconds to write one 50 KiB file with a flush, one at a time.
    pub per_file_copy: f64,
    /// Seconds of a whole run that backs up one new small file: connect,
    /// open, list, upload, commit.
    pub run_changed: f64,
    /// Seconds of a whole run with nothing new.
    pub run_unchanged: f64,
    /// What each repeated measurement gave, for judging how far to trust
    /// the estimate: the round trip of each round (ms, the median of that
    /// round's pings), and each whole run with and without a change (s).
    /// The figures above are their medians.
    #[serde(default)]
    pub rounds: ProbeRounds,
}

/// The repeated measurements behind a [`DestProbe`].
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct ProbeRounds {
    /// Round trip of each round, milliseconds.
    pub rtt_ms: Vec<f64>,
    /// Whole runs with one new file, seconds.
    pub run_changed: Vec<f64>,
    /// Whole runs with nothing new, seconds.
    pub run_unchanged: Vec<f64>,
    /// The largest relative distance of a whole run from its median, with
    /// and without a change (0.05: every run within 5%); the round trips
    /// are not counted, their cost is in the runs.
    pub spread: f64,
}

/// How far the values of `v` lie from their median, at most, relative to it.
pub(crate) fn spread_of(v: &[f64]) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    let m = median(&mut v.to_vec());
    if m <= 0.0 {
        return 0.0;
    }
    v.iter().map(|x| (x - m).abs() / m).fold(0.0, f64::max)
}

/// Predicted times, seconds.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Prediction {
    /// capsule, first backup.
    pub initial: f64,
    /// capsule, a typical hourly run.
    pub hourly: f64,
    /// Per-file copying, everything.
    pub per_file_initial: f64,
    /// Per-file copying, the hourly changes.
    pub per_file_hourly: f64,
    /// The rule of thumb: bytes at 0.67 x the one-stream bandwidth.
    pub rule_of_thumb: f64,
    /// capsule, a full restore from the destination to this machine.
    #[serde(default)]
    pub restore: f64,
    /// capsule, a run with nothing changed (every file looked at, none
    /// read): what most hourly runs are.
    #[serde(default)]
    pub no_change: f64,
    /// capsule, a run after a typical hour's change: [`TYPICAL_FILES`] new
    /// files of 50 KiB.
    #[serde(default)]
    pub typical_change: f64,
}

/// The "typical change" of an hour when nothing better is known: this many
/// new files of 50 KiB (a mail folder, a few saved documents, a browser
/// profile's churn).
pub const TYPICAL_FILES: u64 = 100;

/// One recorded run set against the model.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Checked {
    /// When it ran.
    pub time: String,
    /// `initial` (read most files) or `hourly`.
    pub kind: String,
    /// What the model predicts for it.
    pub predicted: f64,
    /// What it took.
    pub actual: f64,
}

/// The result of `capsule estimate`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Estimate {
    /// The destination.
    pub destination: String,
    /// The source.
    pub source: SourceScan,
    /// Assumed hourly change: files read.
    pub hourly_files: u64,
    /// Assumed hourly change: bytes read.
    pub hourly_bytes: u64,
    /// Where the hourly assumption comes from.
    pub hourly_basis: String,
    /// Pipeline costs.
    pub calibration: Calibration,
    /// Destination figures.
    pub probe: DestProbe,
    /// The model's predictions.
    pub model: Prediction,
    /// After correction by history (equal to `model` without history).
    pub predicted: Prediction,
    /// Correction factors applied (initial, hourly).
    pub correction: (f64, f64),
    /// Recorded runs to this destination, predicted vs actual.
    pub history: Vec<Checked>,
    /// How far to trust the predictions, relative (0.08: ± 8%): the larger
    /// of the calibration's and the probe's spread, how far this machine
    /// and the destination varied between repeated rounds of the same work
    /// in this estimate. Estimates in a row differ by about this much.
    #[serde(default)]
    pub uncertainty: f64,
    /// The same for the initial backup, which also meets the disk's cold
    /// read where the source is not in the cache: the larger of
    /// `uncertainty` and the calibration's `cold_spread` for the share of
    /// the source not cached.
    #[serde(default)]
    pub initial_uncertainty: f64,
}

/// The initial backup's uncertainty: the estimate's own, or the disk's
/// cold read's where that varied more, for the share of the source read
/// cold.
pub(crate) fn initial_uncertainty(uncertainty: f64, c: &Calibration) -> f64 {
    uncertainty.max(c.cold_spread * (1.0 - c.cached_share.clamp(0.0, 1.0)))
}

/// What `capsule estimate` needs.
#[derive(Debug, Clone, Default)]
pub struct EstimateOptions {
    /// Hourly change in files (default: from history, else none).
    pub hourly_files: Option<u64>,
    /// Hourly change in bytes.
    pub hourly_bytes: Option<u64>,
    /// Local scratch directory.
    pub work_dir: Option<PathBuf>,
    /// The destination's name in run records, to find its history
    /// (default: the destination URL).
    pub repository: Option<String>,
}

/// Pipeline time for `files` files of `bytes` bytes (no upload).
fn pipeline(c: &Calibration, files: f64, bytes: f64) -> f64 {
    c.per_file * files + c.per_byte * bytes
}

/// Upload time for `bytes` of new data.
pub(crate) fn upload(c: &Calibration, d: &DestProbe, bytes: f64) -> f64 {
    if d.parallel_bw <= 0.0 {
        return 0.0;
    }
    bytes * c.stored_ratio / d.parallel_bw
}

/// The model: seconds for a run that stats `files` files and reads
/// `files_read` of them (`bytes_read` bytes).
pub fn predict_run(
    c: &Calibration,
    d: &DestProbe,
    files: u64,
    files_read: u64,
    bytes_read: u64,
) -> f64 {
    // What a run costs on this destination beyond its data, as measured.
    let fixed = if files_read > 0 {
        d.run_changed
    } else {
        d.run_unchanged
    };
    let unchanged = files.saturating_sub(files_read) as f64 * c.per_unchanged_file;
    let local = pipeline(c, files_read as f64, bytes_read as f64);
    let up = upload(c, d, bytes_read as f64);
    // The last pack is uploaded after the pipeline has finished; its round
    // trips are in the fixed cost, its bytes are not.
    let tail = if bytes_read > 0 && d.stream_bw > 0.0 {
        (16u64 << 20).min(bytes_read) as f64 * c.stored_ratio / d.stream_bw
    } else {
        0.0
    };
    fixed + unchanged + local.max(up) + tail
}

/// Of the shorter of a restore's two overlapped parts (local work, the
/// download), the share that does not hide behind the longer one. Both
/// need the client's cores (decrypting, writing, and receiving: TLS, SSH or
/// SMB signing), so they overlap imperfectly. Fitted on the small and docs
/// sets at 2 ms (SMB, SFTP, S3 here), checked on others (bench/RESULTS.md,
/// Estimator accuracy).
const RESTORE_OVERLAP_LOSS: f64 = 0.3;

/// The parts of a full restore's prediction, seconds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RestoreParts {
    /// A run's fixed costs (the measured run with nothing new).
    pub fixed: f64,
    /// Reading the snapshot's trees, a level at a time: a round trip per
    /// level, with nothing else to do meanwhile.
    pub trees: f64,
    /// This machine's restore work, from the local samples.
    pub local: f64,
    /// The download: stored bytes at the read rate, plus a round trip per
    /// 4 MiB read divided by the reads in flight.
    pub net: f64,
    /// The CPU seconds of both, spread over the cores (0 where not
    /// measured).
    pub cpu: f64,
}

impl RestoreParts {
    /// The longer of local work and download, plus the part of the
    /// shorter that does not overlap.
    fn overlapped(&self) -> f64 {
        self.local.max(self.net) + RESTORE_OVERLAP_LOSS * self.local.min(self.net)
    }

    /// The predicted time.
    pub fn total(&self) -> f64 {
        self.fixed + self.trees + self.overlapped().max(self.cpu)
    }

    /// What bounds the prediction, in a few words.
    pub fn bound(&self) -> &'static str {
        if self.cpu > self.overlapped() {
            "this machine's cores"
        } else if self.net >= self.local {
            "the download"
        } else {
            "writing here"
        }
    }
}

/// The model of a full restore: a run's fixed costs, then the larger of
/// this machine's restore work (measured on the samples) and the download,
/// whose reads of up to 4 MiB each pay a round trip, `concurrency` at once,
/// plus the part of the smaller that does not overlap; unless the CPU
/// seconds both halves need, spread over the cores, take longer still.
pub fn restore_parts(c: &Calibration, d: &DestProbe, s: &SourceScan) -> RestoreParts {
    // Symlinks and other entries cost what an empty file does.
    let entries = (s.files + s.others) as f64;
    let (dirs, bytes) = (s.dirs as f64, s.bytes as f64);
    let cpu_local = c.restore_cpu_per_file * entries
        + c.restore_cpu_per_dir * dirs
        + c.restore_cpu_per_byte * bytes;
    let local = if c.cores > 0 && cpu_local > 0.0 {
        // This machine's work spread over its cores, unless the target
        // disk takes longer to write the bytes and create the files. Not
        // the samples' wall times added up: the small sample (a thousand
        // files in two or three reads) runs on one core, where a restore's
        // files are spread over every worker, so its seconds per file,
        // carried over to 65,000 files, put a restore that took 5.1 s at
        // 5.9-6.8 s (bench/RESULTS.md, Estimator accuracy).
        (cpu_local / c.cores as f64)
            .max(c.restore_write_per_byte * bytes + c.restore_wait_per_file * entries)
    } else {
        c.restore_per_file * entries + c.restore_per_dir * dirs + c.restore_per_byte * bytes
    };
    let stored = bytes * c.stored_ratio;
    let bw = if d.download_bw > 0.0 {
        d.download_bw
    } else {
        d.parallel_bw
    };
    let net = if bw > 0.0 {
        let reads = (stored / f64::from(4u32 << 20)).ceil();
        stored / bw + reads * d.rtt / d.concurrency.max(1) as f64
    } else {
        0.0
    };
    let cpu = if c.cores > 0 {
        (cpu_local + d.download_cpu_per_byte * stored) / c.cores as f64
    } else {
        0.0
    };
    // The trees come first, every level's reads at once but one level
    // after another: a restore over S3 at 10 ms of a tree 16 levels deep
    // spent 0.30 s on them, 48 reads in 16 rounds, before its first read
    // of file contents (`--trace-requests`; bench/RESULTS.md, Estimator
    // accuracy). Left out, the restores at 10 ms were predicted 15-35%
    // short.
    let trees = s.depth as f64 * d.rtt;
    RestoreParts {
        fixed: d.run_unchanged,
        trees,
        local,
        net,
        cpu,
    }
}

/// The predicted seconds of a full restore of `s` ([`restore_parts`]).
pub fn predict_restore(c: &Calibration, d: &DestProbe, s: &SourceScan) -> f64 {
    restore_parts(c, d, s).total()
}

/// Predictions for a source.
pub fn predict(
    c: &Calibration,
    d: &DestProbe,
    s: &SourceScan,
    hourly_files: u64,
    hourly_bytes: u64,
) -> Prediction {
    let per_file = |files: u64, bytes: u64, dirs: u64| {
        files as f64 * d.per_file_copy
            + bytes.saturating_sub(files * 51_200) as f64 / d.stream_bw.max(1.0)
            + dirs as f64 * d.rtt
    };
    Prediction {
        initial: predict_run(c, d, s.files, s.files, s.bytes),
        hourly: predict_run(c, d, s.files, hourly_files, hourly_bytes),
        no_change: predict_run(c, d, s.files, 0, 0),
        typical_change: predict_run(c, d, s.files, TYPICAL_FILES, TYPICAL_FILES * 51_200),
        per_file_initial: per_file(s.files, s.bytes, s.dirs),
        per_file_hourly: per_file(hourly_files, hourly_bytes, 0),
        rule_of_thumb: s.bytes as f64 / (0.67 * d.stream_bw.max(1.0)),
        restore: predict_restore(c, d, s),
    }
}

/// Median of a non-empty slice.
pub(crate) fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}
