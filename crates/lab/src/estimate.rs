//! `capsule estimate`: predicts the initial backup and a typical hourly run
//! of a source to a destination, for capsule and for per-file copying, next
//! to the "0.67 x a large-file copy" rule of thumb; then checks the model
//! against recorded runs and corrects it.
//!
//! The model has three measured parts:
//! * **this machine's pipeline** (scan, read, chunk, hash, compress,
//!   encrypt), from two small real backups of samples of the source into a
//!   local scratch repository: one of small files (cost per file), one of
//!   the largest files (cost per byte), and a no-change re-run of the small
//!   sample (cost per unchanged file);
//! * **the destination**, probed briefly: connect time, round trip,
//!   bandwidth of one stream and of the upload concurrency, and the time to
//!   write one small file with a flush;
//! * **fixed costs**, measured by doing them: a tiny repository in a
//!   scratch directory on the destination gets real backups, each in a new
//!   connection like a separate process, one with a new file and one with
//!   nothing new. Connecting, key derivation, opening the repository, the
//!   listings, new pack directories, and the commit's puts one after
//!   another all cost what they cost there, however many round trips that
//!   is on this protocol.
//!
//! An initial backup overlaps the pipeline with uploads, so it takes the
//! longer of the two plus fixed costs; an hourly run stats every file and
//! backs up what changed the same way.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use capsule_backend::LabBackend;
use capsule_net::Destination;
use serde::{Deserialize, Serialize};

use capsule_engine::progress::Progress;
use capsule_engine::restore::{restore, RestoreOptions};
use capsule_engine::Repository;

use crate::dest::{delete_all, Connector};
use crate::history::History;
use crate::lab::{backup_step, Hints};
use crate::probe::{self, Noise};
use crate::record::RunRecord;
use crate::{LabError, Result};

/// One size class of the source.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct SizeClass {
    /// Files up to this size (bytes; the last class has no bound: 0).
    pub up_to: u64,
    /// Files in the class.
    pub files: u64,
    /// Their bytes.
    pub bytes: u64,
}

/// What the scan of the source found.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct SourceScan {
    /// Regular files.
    pub files: u64,
    /// Directories.
    pub dirs: u64,
    /// Bytes of regular files.
    pub bytes: u64,
    /// Size distribution.
    pub classes: Vec<SizeClass>,
    /// Seconds the scan took.
    pub scan_secs: f64,
    /// Seconds a second walk of the source took (every entry looked at,
    /// every directory listed, nothing read), with its metadata now in the
    /// cache as it is for a run with nothing changed. The model of such a
    /// run scales a sample's by this ([`unchanged_per_file`]).
    #[serde(default)]
    pub walk_secs: f64,
}

const CLASS_BOUNDS: [u64; 6] = [4 << 10, 64 << 10, 1 << 20, 16 << 20, 256 << 20, 0];

/// Walks `paths` (not following symlinks) and counts.
pub fn scan(paths: &[PathBuf]) -> Result<(SourceScan, Vec<(PathBuf, u64)>)> {
    let t = Instant::now();
    let mut s = SourceScan {
        classes: CLASS_BOUNDS
            .iter()
            .map(|&up_to| SizeClass {
                up_to,
                ..SizeClass::default()
            })
            .collect(),
        ..SourceScan::default()
    };
    let mut files = Vec::new();
    let mut stack: Vec<PathBuf> = paths.to_vec();
    while let Some(p) = stack.pop() {
        let m = std::fs::symlink_metadata(&p).map_err(|e| LabError::io("read", &p, e))?;
        if m.is_dir() {
            s.dirs += 1;
            let Ok(rd) = std::fs::read_dir(&p) else {
                continue;
            };
            for e in rd.flatten() {
                stack.push(e.path());
            }
        } else if m.is_file() {
            let len = m.len();
            s.files += 1;
            s.bytes += len;
            let c = s
                .classes
                .iter_mut()
                .find(|c| c.up_to == 0 || len <= c.up_to)
                .expect("the last class is unbounded");
            c.files += 1;
            c.bytes += len;
            files.push((p, len));
        }
    }
    s.scan_secs = t.elapsed().as_secs_f64();
    s.walk_secs = walk(paths);
    Ok((s, files))
}

/// Seconds to walk `paths` as a run with nothing changed does, less its own
/// work: every entry's metadata, every directory's listing, no file read.
fn walk(paths: &[PathBuf]) -> f64 {
    let t = Instant::now();
    let mut stack: Vec<PathBuf> = paths.to_vec();
    while let Some(p) = stack.pop() {
        let Ok(m) = std::fs::symlink_metadata(&p) else {
            continue;
        };
        if m.is_dir() {
            if let Ok(rd) = std::fs::read_dir(&p) {
                stack.extend(rd.flatten().map(|e| e.path()));
            }
        }
    }
    t.elapsed().as_secs_f64()
}

/// The subtree of the source that stands for it in a run with nothing
/// changed: the directory holding the most files up to 10,000, of at most
/// 64 MiB in all (its first backup reads them), and at least 1,000 (fewer
/// take too little time to tell from the noise). None when no directory
/// fits.
///
/// A whole subtree, because capsule's walk of a subtree costs about the
/// same multiple of a plain walk of it as for the whole tree (0.43–0.63
/// here on four parts of `/usr/share` and the whole of it), whereas the
/// small sample's seventy separate leaves cost 2 times their walk: each
/// source and the directories above it cost a run more than a directory
/// within. The largest that fits, not one at random, so that estimates in
/// a row agree.
fn walk_sample(files: &[(PathBuf, u64)], roots: &[PathBuf]) -> Option<PathBuf> {
    use std::collections::HashMap;
    use std::ffi::OsStr;
    let mut per_dir: HashMap<&OsStr, (u64, u64)> = HashMap::new();
    for (p, n) in files {
        let Some(root) = roots.iter().find(|r| p.starts_with(r)) else {
            continue;
        };
        for dir in p.ancestors().skip(1) {
            let e = per_dir.entry(dir.as_os_str()).or_default();
            e.0 += 1;
            e.1 += n;
            if dir == root.as_path() {
                break;
            }
        }
    }
    per_dir
        .into_iter()
        .filter(|(_, (n, bytes))| (1_000..=10_000).contains(n) && *bytes <= 64 << 20)
        .max_by_key(|(d, (n, _))| (*n, std::cmp::Reverse(*d)))
        .map(|(d, _)| PathBuf::from(d))
}

/// Seconds per unchanged file in a run with nothing changed, for a source
/// whose plain walk took `source_walk` seconds over `source_files`
/// files: the sample's no-change run less an empty one's, per second of
/// the sample's own walk, times the source's walk.
///
/// A sample's figure per file does not carry over by itself: a directory
/// costs more than a file (a listing, a tree to read and one to write), and
/// a subtree has its own files per directory. The plain walk pays the same
/// shape of costs, so the ratio to it does carry over.
pub fn unchanged_per_file(
    sample_unchanged: f64,
    empty_unchanged: f64,
    sample_walk: f64,
    source_walk: f64,
    source_files: u64,
) -> Option<f64> {
    (sample_walk > 0.0 && source_walk > 0.0 && source_files > 0).then(|| {
        (sample_unchanged - empty_unchanged).max(0.0) / sample_walk * source_walk
            / source_files as f64
    })
}

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
    /// Seconds per byte restored from a local repository.
    #[serde(default)]
    pub restore_per_byte: f64,
    /// CPU seconds (this process, all threads) per file of those restores,
    /// beyond its bytes: decrypting, decompressing, creating and writing.
    #[serde(default)]
    pub restore_cpu_per_file: f64,
    /// CPU seconds per byte of those restores.
    #[serde(default)]
    pub restore_cpu_per_byte: f64,
    /// Cores this machine gives capsule (0 in records from before it was
    /// measured: then no CPU bound is applied).
    #[serde(default)]
    pub cores: usize,
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
    /// The largest relative distance of a round from its median, over all
    /// of the above (0.05: every round within 5%).
    pub spread: f64,
}

/// How far the values of `v` lie from their median, at most, relative to it.
fn spread_of(v: &[f64]) -> f64 {
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
fn upload(c: &Calibration, d: &DestProbe, bytes: f64) -> f64 {
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
        self.fixed + self.overlapped().max(self.cpu)
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
pub fn restore_parts(c: &Calibration, d: &DestProbe, files: u64, bytes: u64) -> RestoreParts {
    let local = c.restore_per_file * files as f64 + c.restore_per_byte * bytes as f64;
    let stored = bytes as f64 * c.stored_ratio;
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
        (c.restore_cpu_per_file * files as f64
            + c.restore_cpu_per_byte * bytes as f64
            + d.download_cpu_per_byte * stored)
            / c.cores as f64
    } else {
        0.0
    };
    RestoreParts {
        fixed: d.run_unchanged,
        local,
        net,
        cpu,
    }
}

/// The predicted seconds of a full restore ([`restore_parts`]).
pub fn predict_restore(c: &Calibration, d: &DestProbe, files: u64, bytes: u64) -> f64 {
    restore_parts(c, d, files, bytes).total()
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
        restore: predict_restore(c, d, s.files, s.bytes),
    }
}

/// Leaf directories (no subdirectories) of small files, spread over the
/// source, with about `want` files in all.
///
/// A leaf counts as small when its files average at most 64 KiB and none
/// is over 1 MiB. Taking any leaf with one small file in it let a directory
/// of a few large files (`/usr/share/package-lists`: 13 files, 95 MB) into
/// the small sample now and then; the two samples then no longer told the
/// cost per file from the cost per byte, and one estimate in five said
/// 19.8 s for a backup the others put at 4.8–5.9 s.
fn small_dirs(files: &[(PathBuf, u64)], want: u64, seed: u64) -> Vec<PathBuf> {
    use std::collections::BTreeMap;
    // Files, bytes and the largest file of each directory.
    let mut per_dir: BTreeMap<&Path, (u64, u64, u64)> = BTreeMap::new();
    for (p, n) in files {
        if let Some(d) = p.parent() {
            let e = per_dir.entry(d).or_default();
            e.0 += 1;
            e.1 += n;
            e.2 = e.2.max(*n);
        }
    }
    let leaves: Vec<(&Path, u64)> = per_dir
        .iter()
        .filter(|(d, (all, bytes, largest))| {
            *bytes <= *all * (64 << 10)
                && *largest <= 1 << 20
                && std::fs::read_dir(d).is_ok_and(|rd| {
                    rd.flatten()
                        .all(|e| e.file_type().is_ok_and(|t| !t.is_dir()))
                })
        })
        .map(|(d, (all, _, _))| (*d, *all))
        .collect();
    // Leaves of at most half the sample each, where there are any: one leaf
    // of 18,000 files made a sample 18 times the size of the others, read
    // in a different way (one directory, one reader at a time).
    let fitting: Vec<(&Path, u64)> = leaves
        .iter()
        .copied()
        .filter(|(_, n)| *n <= want.div_ceil(2))
        .collect();
    let leaves = if fitting.is_empty() { leaves } else { fitting };
    let total: u64 = leaves.iter().map(|(_, n)| n).sum();
    // Every step-th leaf: about `want` files when the leaves taken hold the
    // average number of files. When they hold fewer, further passes take
    // the leaves halfway between, until there are enough.
    let step = (total / want.max(1)).max(1) as usize;
    let mut taken = vec![false; leaves.len()];
    let mut out = Vec::new();
    let mut got = 0;
    // Where the first pass starts: random, so that estimates in a row
    // sample other files, and one run after another still sees a cold
    // source as cold (the files a first estimate read are warm after it,
    // the rest of the source is not).
    // Within the leaves there are: a few leaves of many files each make a
    // step longer than the list.
    let mut offset = (seed % step.min(leaves.len()).max(1) as u64) as usize;
    let mut stride = step;
    while got < want && offset < leaves.len() {
        for (i, (d, n)) in leaves.iter().enumerate().skip(offset).step_by(step) {
            if got >= want {
                break;
            }
            if !std::mem::replace(&mut taken[i], true) {
                out.push(d.to_path_buf());
                got += n;
            }
        }
        if stride <= 1 {
            break;
        }
        stride /= 2;
        offset += stride;
    }
    out
}

/// Measures this machine's pipeline on samples of `files`.
pub fn calibrate(
    paths: &[PathBuf],
    files: &[(PathBuf, u64)],
    source: &SourceScan,
    work: &Path,
) -> Result<Calibration> {
    // Small sample: whole leaf directories of small files, about 1,000
    // files, backed up the way the source will be.
    let mut seed = [0u8; 8];
    let _ = getrandom::fill(&mut seed);
    let mut seed = u64::from_le_bytes(seed) | 1;
    let small = small_dirs(files, 1000, seed);
    // Large sample: up to 96 MiB of large files, drawn at random from the
    // largest (those making up four times that), for the same reason.
    let mut by_size: Vec<&(PathBuf, u64)> = files.iter().filter(|(_, n)| *n > 64 << 10).collect();
    by_size.sort_by_key(|(_, n)| std::cmp::Reverse(*n));
    let mut pool_bytes = 0u64;
    let pool = by_size
        .iter()
        .take_while(|(_, n)| {
            pool_bytes += n;
            pool_bytes - n < 4 * (96 << 20)
        })
        .count();
    let pool = &mut by_size[..pool];
    for i in (1..pool.len()).rev() {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        pool.swap(i, (seed % (i as u64 + 1)) as usize);
    }
    let mut large = Vec::new();
    let mut large_bytes = 0u64;
    for (p, n) in pool.iter() {
        if large_bytes >= 96 << 20 || large.len() >= 200 {
            break;
        }
        large.push(p.clone());
        large_bytes += n;
    }
    let empty = work.join("empty-source");
    std::fs::create_dir_all(&empty).map_err(|e| LabError::io("create", &empty, e))?;
    let conn = Connector {
        no_fsync: true,
        ..Connector::default()
    };
    let password = crate::random_hex(16).into_bytes();
    // Each sample is backed up three times, each into a new repository
    // (so each round does the whole work), then re-run with nothing
    // changed. The first round reads the sample cold: its pages are
    // dropped from the page cache first. The others read it warm. Which
    // one the backup will meet depends on how much of the source is in
    // the cache now (`cached_share`): the two are blended by that. One
    // round alone, read cold or warm as it happened, moved the per-file
    // cost by 2.4x between estimates in a row (the same sample measured
    // 66 and 27 µs a file).
    let sample = |name: &str, paths: &[PathBuf]| -> Result<Option<Rounds>> {
        if paths.is_empty() {
            return Ok(None);
        }
        evict(paths);
        let cache = work.join("cache");
        let mut firsts = Vec::new();
        let mut seconds = Vec::new();
        for round in 0..SAMPLE_ROUNDS {
            let dest = Destination::Local(work.join(format!("{name}-{round}")));
            firsts.push(backup_step(
                &conn,
                &dest,
                &password,
                paths,
                true,
                &cache,
                Hints::default(),
            )?);
            seconds.push(backup_step(
                &conn,
                &dest,
                &password,
                paths,
                false,
                &cache,
                Hints::default(),
            )?);
            crate::check_interrupt()?;
        }
        seconds.sort_by(|a, b| a.backup_secs.total_cmp(&b.backup_secs));
        let (cold, warm) = cold_and_warm(&firsts);
        Ok(Some(Rounds {
            cold: cold.clone(),
            warm: warm.clone(),
            unchanged: seconds[seconds.len() / 2].clone(),
        }))
    };
    // Runs with nothing changed over one whole subtree of the source: the
    // median of a few (each takes milliseconds, near the noise of one run)
    // and the fastest plain walk of it, both warm as the source's second
    // walk is.
    let unchanged_sample = |paths: &[PathBuf]| -> Result<(f64, f64)> {
        let dest = Destination::Local(work.join("tree"));
        let cache = work.join("cache");
        let step = |init| {
            backup_step(
                &conn,
                &dest,
                &password,
                paths,
                init,
                &cache,
                Hints::default(),
            )
        };
        step(true)?;
        let mut secs = Vec::new();
        for _ in 0..UNCHANGED_ROUNDS {
            secs.push(step(false)?.backup_secs);
            crate::check_interrupt()?;
        }
        let fastest = (0..5).map(|_| walk(paths)).fold(f64::INFINITY, f64::min);
        Ok((median(&mut secs), fastest))
    };
    // Restores of the same samples from their local repositories: the
    // median of three, each into a directory of its own, with the CPU
    // seconds that round used. Not the fastest: on some machines writing
    // into the page cache costs ten times more for a while (a VM whose
    // host takes freed pages back; a filesystem mounted with `discard`
    // just after many deletions), and the restore being predicted meets
    // that as often as the samples do. Nothing is deleted until the end.
    let restored = work.join("restored");
    let restore_secs = |name: &str| -> Result<(f64, f64)> {
        let opened = conn.open(&Destination::Local(work.join(format!("{name}-0"))), false)?;
        let repo = Repository::open(opened.backend.clone(), &password)?;
        let (index, _) = repo.load_index()?;
        let (_, snap) = repo.resolve_snapshot("latest")?;
        let root = snap
            .tree
            .parse()
            .map_err(|_| capsule_engine::EngineError::corrupt("snapshot", "bad tree id"))?;
        let mut rounds = Vec::new();
        for round in 0..3 {
            let target = restored.join(format!("{name}-{round}"));
            let cpu0 = crate::cpu::process();
            let t = Instant::now();
            let r = restore(
                &repo,
                &index,
                &root,
                &RestoreOptions {
                    target: target.clone(),
                    ..RestoreOptions::default()
                },
                &Progress::default(),
            )?;
            let secs = t.elapsed().as_secs_f64();
            let cpu = match (cpu0, crate::cpu::process()) {
                (Some(a), Some(b)) => (b - a).max(0.0),
                _ => 0.0,
            };
            rounds.push((secs, cpu));
            if !r.errors.is_empty() {
                return Err(LabError::io(
                    "restore the sample",
                    &target,
                    std::io::Error::other(format!("{} entries failed", r.errors.len())),
                ));
            }
        }
        rounds.sort_by(|a, b| a.0.total_cmp(&b.0));
        Ok(rounds[rounds.len() / 2])
    };
    // What any run costs here with nothing to do.
    let e = sample("empty", &[empty])?.expect("one path");
    let s = sample("small", &small)?;
    let l = sample("large", &large)?;
    let share = cached_share(files, seed);
    let (cold_file, cold_byte) = fit(
        s.as_ref().map(|r| &r.cold),
        l.as_ref().map(|r| &r.cold),
        &e.warm,
    );
    let (warm_file, warm_byte) = fit(
        s.as_ref().map(|r| &r.warm),
        l.as_ref().map(|r| &r.warm),
        &e.warm,
    );
    let blend = |cold: f64, warm: f64| share * warm + (1.0 - share) * cold;
    let (per_file, per_byte) = (blend(cold_file, warm_file), blend(cold_byte, warm_byte));
    let e2 = e.unchanged.backup_secs;
    let unchanged_sample_path = walk_sample(files, paths);
    let tree = match &unchanged_sample_path {
        Some(t) => Some(unchanged_sample(std::slice::from_ref(t))?),
        None => None,
    };
    let walk_factor = tree
        .map(|(secs, w)| (secs - e2).max(0.0) / w.max(1e-9))
        .unwrap_or(0.0);
    let unchanged = tree
        .and_then(|(secs, w)| unchanged_per_file(secs, e2, w, source.walk_secs, source.files))
        .or_else(|| {
            // No subtree of a fitting size (one flat directory): the small
            // sample's own figure per file.
            s.as_ref()
                .or(l.as_ref())
                .map(|r| (r.unchanged.backup_secs - e2).max(0.0) / r.unchanged.files.max(1) as f64)
        })
        .unwrap_or(0.0);
    let s = s.map(|r| (r.warm, r.unchanged));
    let l = l.map(|r| (r.warm, r.unchanged));
    let ratio = l
        .as_ref()
        .or(s.as_ref())
        .map(|(f, _)| f.bytes_added as f64 / f.bytes_read.max(1) as f64)
        .unwrap_or(1.0);
    // The same two-point fit for restores.
    let rs = s
        .as_ref()
        .map(|(f, _)| (f.files_read as f64, f.bytes_read as f64));
    let rl = l
        .as_ref()
        .map(|(f, _)| (f.files_read as f64, f.bytes_read as f64));
    // What a restore costs with nothing to write (starting, planning,
    // finishing), taken off the samples as the empty backup is above; the
    // same for its CPU seconds.
    let (fixed_secs, fixed_cpu) = restore_secs("empty")?;
    let less_fixed =
        |(secs, cpu): (f64, f64)| ((secs - fixed_secs).max(0.0), (cpu - fixed_cpu).max(0.0));
    let rs = match rs {
        Some((f, b)) => Some((f, b, less_fixed(restore_secs("small")?))),
        None => None,
    };
    let rl = match rl {
        Some((f, b)) => Some((f, b, less_fixed(restore_secs("large")?))),
        None => None,
    };
    let _ = std::fs::remove_dir_all(&restored);
    let time = |p: &(f64, f64, (f64, f64))| (p.0, p.1, p.2 .0);
    let cpu = |p: &(f64, f64, (f64, f64))| (p.0, p.1, p.2 .1);
    let (restore_per_file, restore_per_byte) =
        fit_restore(rs.as_ref().map(time), rl.as_ref().map(time));
    let (restore_cpu_per_file, restore_cpu_per_byte) =
        fit_restore(rs.as_ref().map(cpu), rl.as_ref().map(cpu));
    let dims = |x: &Option<(RunRecord, RunRecord)>| {
        x.as_ref()
            .map(|(f, _)| (f.files_read, f.bytes_read))
            .unwrap_or_default()
    };
    Ok(Calibration {
        per_file,
        per_byte,
        cold: (cold_file, cold_byte),
        warm: (warm_file, warm_byte),
        cached_share: share,
        per_unchanged_file: unchanged,
        unchanged_sample: unchanged_sample_path,
        walk_factor,
        stored_ratio: ratio.clamp(0.01, 1.2),
        samples: [dims(&s), dims(&l)],
        restore_per_file,
        restore_per_byte,
        restore_cpu_per_file,
        restore_cpu_per_byte,
        cores: crate::cpu::cores(),
    })
}

/// A sample's rounds: the first (read cold), a warm one, and a run with
/// nothing changed.
struct Rounds {
    cold: RunRecord,
    warm: RunRecord,
    unchanged: RunRecord,
}

/// Seconds per file and per byte from the small and the large sample's
/// run, less what a run of an empty source (`empty`) costs.
fn fit(small: Option<&RunRecord>, large: Option<&RunRecord>, empty: &RunRecord) -> (f64, f64) {
    let point = |r: &RunRecord| {
        (
            r.files_read as f64,
            r.bytes_read as f64,
            (r.backup_secs - empty.backup_secs).max(0.0),
        )
    };
    match (small, large) {
        (Some(s1), Some(l1)) => {
            let (f1, b1, t1) = point(s1);
            let (f2, b2, t2) = point(l1);
            let det = f1 * b2 - f2 * b1;
            // Samples with the same bytes per file cannot separate the two
            // costs; then charge bytes only.
            let same_shape = f1 > 0.0 && f2 > 0.0 && ((b1 / f1) / (b2 / f2) - 1.0).abs() < 0.3;
            let solved = (!same_shape && det.abs() > 1e-9)
                .then(|| ((t1 * b2 - t2 * b1) / det, (f1 * t2 - f2 * t1) / det));
            match solved {
                Some((a, b)) if a >= 0.0 && b >= 0.0 => (a, b),
                _ => (0.0, (t1 + t2) / (b1 + b2).max(1.0)),
            }
        }
        (Some(s1), None) => {
            let (f, b, t) = point(s1);
            if b > 0.0 {
                (0.5 * t / f.max(1.0), 0.5 * t / b)
            } else {
                (t / f.max(1.0), 0.0)
            }
        }
        (None, Some(l1)) => {
            let (_, b, t) = point(l1);
            (0.0, t / b.max(1.0))
        }
        (None, None) => (0.0, 0.0),
    }
}

/// The round read cold (the first: its sample was just dropped from the
/// page cache) and the warm one standing for the others (their median).
pub fn cold_and_warm(rounds: &[RunRecord]) -> (&RunRecord, &RunRecord) {
    let (first, rest) = rounds.split_first().expect("at least one round");
    if rest.is_empty() {
        return (first, first);
    }
    let mut by_time: Vec<&RunRecord> = rest.iter().collect();
    by_time.sort_by(|a, b| a.backup_secs.total_cmp(&b.backup_secs));
    // Of two, the faster: a warm round is only ever slowed by something
    // else on the machine.
    (first, by_time[(by_time.len() - 1) / 2])
}

/// Drops the pages of `paths` (files, or directories of files) from the
/// page cache, so that the next read of them is a read from the disk, as
/// it is for a source not read lately. Only clean pages go, and only as
/// far as the kernel agrees: this is advice (`POSIX_FADV_DONTNEED`).
fn evict(paths: &[PathBuf]) {
    fn one(p: &Path) {
        if let Ok(f) = std::fs::File::open(p) {
            let _ = rustix::fs::fadvise(&f, 0, None, rustix::fs::Advice::DontNeed);
        }
    }
    for p in paths {
        match std::fs::read_dir(p) {
            Ok(rd) => rd
                .flatten()
                .filter(|e| e.file_type().is_ok_and(|t| t.is_file()))
                .for_each(|e| one(&e.path())),
            Err(_) => one(p),
        }
    }
}

/// The share of the source's files whose first page is in the page cache,
/// from up to 256 drawn at random: a read with `RWF_NOWAIT` succeeds only
/// from the cache, and reads nothing from the disk when it fails (so it
/// warms nothing). 0 where it cannot be told (an older kernel).
fn cached_share(files: &[(PathBuf, u64)], mut seed: u64) -> f64 {
    let nonempty: Vec<&PathBuf> = files
        .iter()
        .filter(|(_, n)| *n > 0)
        .map(|(p, _)| p)
        .collect();
    if nonempty.is_empty() {
        return 0.0;
    }
    let (mut cached, mut asked) = (0u32, 0u32);
    let mut buf = [0u8; 1];
    for _ in 0..256.min(nonempty.len()) {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        let p = nonempty[(seed % nonempty.len() as u64) as usize];
        let Ok(f) = std::fs::File::open(p) else {
            continue;
        };
        let mut bufs = [std::io::IoSliceMut::new(&mut buf)];
        match rustix::io::preadv2(&f, &mut bufs, 0, rustix::io::ReadWriteFlags::NOWAIT) {
            Ok(_) => {
                cached += 1;
                asked += 1;
            }
            Err(rustix::io::Errno::AGAIN) => asked += 1,
            // No RWF_NOWAIT here: say nothing is cached, the cautious side.
            Err(_) => return 0.0,
        }
    }
    if asked == 0 {
        0.0
    } else {
        f64::from(cached) / f64::from(asked)
    }
}

/// How many times each calibration sample is backed up.
const SAMPLE_ROUNDS: usize = 3;

/// How many runs with nothing changed the subtree sample gets.
const UNCHANGED_ROUNDS: usize = 5;

/// Cost per file and per byte from the small and the large restore sample,
/// each (files, bytes, cost): solved exactly when both exist and the
/// solution is not negative, else charged to bytes; one sample alone is
/// split evenly between its files and its bytes.
fn fit_restore(small: Option<(f64, f64, f64)>, large: Option<(f64, f64, f64)>) -> (f64, f64) {
    match (small, large) {
        (Some((f1, b1, t1)), Some((f2, b2, t2))) => {
            let det = f1 * b2 - f2 * b1;
            match (det.abs() > 1e-9).then(|| ((t1 * b2 - t2 * b1) / det, (f1 * t2 - f2 * t1) / det))
            {
                Some((a, b)) if a >= 0.0 && b >= 0.0 => (a, b),
                _ => (0.0, (t1 + t2) / (b1 + b2).max(1.0)),
            }
        }
        (Some((f, b, t)), None) | (None, Some((f, b, t))) => {
            (0.5 * t / f.max(1.0), 0.5 * t / b.max(1.0))
        }
        (None, None) => (0.0, 0.0),
    }
}

/// Probes the destination briefly (a few seconds at most on a LAN; `work`
/// is a local scratch directory).
pub fn probe_destination(conn: &Connector, dest: &Destination, work: &Path) -> Result<DestProbe> {
    let scratch = dest.join(&format!("capsule-estimate-{}", crate::random_hex(4)));
    let opened = conn.open(&scratch, true)?;
    let b = opened.backend.clone();
    let r = (|| {
        // Three rounds of ten after the warm-up: one round's median moved
        // by half from one estimate to the next (a first connection, a
        // server still waking); the median of three does not.
        let mut rtt_ms = Vec::new();
        for _ in 0..3 {
            rtt_ms.push(probe::round_trip(&*b, 10)?.median_ms);
        }
        let rtt = median(&mut rtt_ms.clone()) / 1e3;
        let concurrency = b.capabilities().concurrency.max(1);
        // One stream.
        let size = 16u64 << 20;
        let t = Instant::now();
        b.put_stream("est/stream", size, &mut Noise::new(3, size))?;
        let stream_bw = size as f64 / t.elapsed().as_secs_f64().max(1e-9);
        // As many as a backup keeps in flight, of the default pack size
        // (smaller on slow links, to stay brief). A first round of tiny
        // puts opens the connections a backup's pool would already have.
        parallel_puts(&b, "warm", concurrency, 1)?;
        let piece = if stream_bw > 40e6 {
            16u64 << 20
        } else {
            4 << 20
        };
        // The better of two rounds: a backend may still be opening its
        // pool's connections in the background during the first (SFTP does,
        // and lends the requests a live one meanwhile), which a backup of
        // any length has long done. With one round, the model put SFTP
        // backups at 10 ms 20–37% slower than they ran.
        let mut parallel_bw = 0f64;
        for round in ["q", "p"] {
            let t = Instant::now();
            parallel_puts(&b, round, concurrency, piece)?;
            let bw = (concurrency as u64 * piece) as f64 / t.elapsed().as_secs_f64().max(1e-9);
            parallel_bw = parallel_bw.max(bw);
        }
        // Reading them back in 4 MiB ranges, all at once, as a restore does;
        // the better of two rounds, because the first also pays for the
        // server's first reads of what was just written and for streams
        // that are still opening their windows (it read about half the
        // restores' rates on SFTP and S3 here).
        // The machine's busy CPU seconds over the better round price each
        // byte received (see crate::cpu).
        let mut download_bw = 0f64;
        let mut download_cpu_per_byte = 0f64;
        for _ in 0..2 {
            let cpu0 = crate::cpu::machine_busy();
            let t = Instant::now();
            let got = parallel_gets(&b, "p", concurrency, piece)?;
            let bw = got as f64 / t.elapsed().as_secs_f64().max(1e-9);
            if bw > download_bw {
                download_bw = bw;
                download_cpu_per_byte = match (cpu0, crate::cpu::machine_busy()) {
                    (Some(a), Some(b)) => (b - a).max(0.0) / got.max(1) as f64,
                    _ => 0.0,
                };
            }
        }
        // Per-file copying: small files one at a time, flushed.
        let data = Noise::bytes(5, 51_200);
        let t = Instant::now();
        let n = 12;
        for i in 0..n {
            b.probe_write(&format!("est/f/{i}"), &data, 1, true)?;
        }
        let per_file_copy = t.elapsed().as_secs_f64() / n as f64;
        crate::check_interrupt()?;
        let runs = fixed_costs(conn, &scratch.join("repo"), work)?;
        let (run_changed, run_unchanged) =
            (median(&mut runs.0.clone()), median(&mut runs.1.clone()));
        let spread = [spread_of(&rtt_ms), spread_of(&runs.0), spread_of(&runs.1)]
            .into_iter()
            .fold(0.0, f64::max);
        Ok(DestProbe {
            connect_secs: opened.connect_secs,
            rtt,
            stream_bw,
            parallel_bw,
            concurrency,
            download_bw,
            download_cpu_per_byte,
            per_file_copy,
            run_changed,
            run_unchanged,
            rounds: ProbeRounds {
                rtt_ms,
                run_changed: runs.0,
                run_unchanged: runs.1,
                spread,
            },
        })
    })();
    let _ = delete_all(&*b, "", 16);
    let _ = b.remove_empty_dirs();
    r
}

/// Seconds of whole runs with one new small file, and with nothing new,
/// on a tiny repository at `repo`: each run connects afresh, as a separate
/// process would; three of each, alternating.
fn fixed_costs(conn: &Connector, repo: &Destination, work: &Path) -> Result<(Vec<f64>, Vec<f64>)> {
    let src = work.join("fixed-source");
    std::fs::create_dir_all(&src).map_err(|e| LabError::io("create", &src, e))?;
    let add = |i: u32| -> Result<()> {
        let p = src.join(format!("f{i}"));
        let f = std::fs::File::create(&p).map_err(|e| LabError::io("create", &p, e))?;
        std::io::Write::write_all(&mut &f, &Noise::bytes(u64::from(i) + 20, 51_200))
            .map_err(|e| LabError::io("write", &p, e))?;
        // Older than the files cache's re-read window, so the run with
        // nothing new really reads nothing.
        let old = std::time::SystemTime::now() - std::time::Duration::from_secs(10);
        f.set_modified(old)
            .map_err(|e| LabError::io("set the time of", &p, e))
    };
    let password = crate::random_hex(16).into_bytes();
    let cache = work.join("fixed-cache");
    let paths = [src.clone()];
    let run = |init: bool| -> Result<f64> {
        let r = backup_step(
            conn,
            repo,
            &password,
            &paths,
            init,
            &cache,
            Hints::default(),
        )?;
        Ok(r.connect_secs + r.open_secs + r.backup_secs)
    };
    add(0)?;
    run(true)?;
    let (mut changed, mut unchanged) = (Vec::new(), Vec::new());
    for i in 1..=3 {
        add(i)?;
        changed.push(run(false)?);
        unchanged.push(run(false)?);
        crate::check_interrupt()?;
    }
    Ok((changed, unchanged))
}

/// Runs `f(i)` for `i` in `0..n` on `n` threads at once; the first error
/// wins.
fn on_threads(
    n: usize,
    f: impl Fn(usize) -> std::result::Result<(), capsule_backend::BackendError> + Sync,
) -> Result<()> {
    let mut err = None;
    std::thread::scope(|s| {
        let f = &f;
        let hs: Vec<_> = (0..n).map(|i| s.spawn(move || f(i))).collect();
        for h in hs {
            if let Ok(Err(e)) = h.join() {
                err.get_or_insert(e);
            }
        }
    });
    match err {
        Some(e) => Err(e.into()),
        None => Ok(()),
    }
}

fn parallel_puts(b: &Arc<dyn LabBackend>, tag: &str, n: usize, size: u64) -> Result<()> {
    on_threads(n, |i| {
        b.put_stream(
            &format!("est/{tag}{i}"),
            size,
            &mut Noise::new(i as u64 + 9, size),
        )
    })
}

/// Reads back what [`parallel_puts`] wrote, in 4 MiB ranges, `n` reads at
/// once. Returns the bytes read.
fn parallel_gets(b: &Arc<dyn LabBackend>, tag: &str, n: usize, size: u64) -> Result<u64> {
    use std::sync::atomic::Ordering::Relaxed;
    let chunk = 4u64 << 20;
    let ranges: Vec<(usize, u64)> = (0..n)
        .flat_map(|i| (0..size.div_ceil(chunk)).map(move |k| (i, k * chunk)))
        .collect();
    let next = std::sync::atomic::AtomicUsize::new(0);
    let total = std::sync::atomic::AtomicU64::new(0);
    on_threads(n, |_| {
        while let Some(&(i, off)) = ranges.get(next.fetch_add(1, Relaxed)) {
            let got = b.get(&format!("est/{tag}{i}"), Some(off..(off + chunk).min(size)))?;
            total.fetch_add(got.len() as u64, Relaxed);
        }
        Ok(())
    })?;
    Ok(total.into_inner())
}

/// Median of a non-empty slice.
fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Sets recorded runs to `destination` against the model; returns the
/// checks and the correction factors (initial, hourly), each the median
/// actual/predicted ratio of the newest five runs of its kind.
pub fn check_history(
    runs: &[RunRecord],
    destination: &str,
    c: &Calibration,
    d: &DestProbe,
) -> (Vec<Checked>, (f64, f64)) {
    let mut checked = Vec::new();
    let (mut init, mut hourly) = (Vec::new(), Vec::new());
    for r in runs.iter().filter(|r| r.destination == destination) {
        let predicted = predict_run(c, d, r.files, r.files_read, r.bytes_read);
        let actual = r.total_secs();
        let initial = r.files_read * 2 >= r.files.max(1);
        if predicted > 0.0 {
            if initial { &mut init } else { &mut hourly }.push(actual / predicted);
        }
        checked.push(Checked {
            time: r.time.clone(),
            kind: if initial { "initial" } else { "hourly" }.into(),
            predicted,
            actual,
        });
    }
    let factor = |v: &mut Vec<f64>| {
        let n = v.len();
        if n == 0 {
            1.0
        } else {
            median(&mut v[n.saturating_sub(5)..]).clamp(0.33, 3.0)
        }
    };
    (checked, (factor(&mut init), factor(&mut hourly)))
}

/// Runs the whole estimate.
pub fn estimate(
    paths: &[PathBuf],
    dest: &Destination,
    conn: &Connector,
    history: Option<&History>,
    opts: &EstimateOptions,
    say: &dyn Fn(&str),
) -> Result<Estimate> {
    say("scanning the source");
    let (source, files) = scan(paths)?;
    let work = match &opts.work_dir {
        Some(d) => tempfile::Builder::new()
            .prefix("capsule-estimate-")
            .tempdir_in(d),
        None => tempfile::Builder::new()
            .prefix("capsule-estimate-")
            .tempdir(),
    }
    .map_err(|e| LabError::io("create a scratch directory", Path::new("temp"), e))?;
    crate::check_interrupt()?;
    say("measuring this machine on samples of the source");
    let calibration =
        calibrate(paths, &files, &source, work.path()).map_err(crate::or_interrupted)?;
    crate::check_interrupt()?;
    say(&format!("probing {dest}"));
    let probe = probe_destination(conn, dest, work.path()).map_err(crate::or_interrupted)?;
    let runs = history.map(|h| h.runs()).unwrap_or_default();
    let repo_name = opts.repository.clone().unwrap_or_else(|| dest.to_string());
    let (checked, correction) = check_history(&runs, &repo_name, &calibration, &probe);
    // The hourly change: given, else what recent hourly runs read.
    let recent: Vec<&RunRecord> = runs
        .iter()
        .filter(|r| r.destination == repo_name && r.files_read * 2 < r.files.max(1))
        .collect();
    let (hourly_files, hourly_bytes, hourly_basis) = match (opts.hourly_files, opts.hourly_bytes) {
        (Some(f), b) => (f, b.unwrap_or(f * 51_200), "given".to_string()),
        (None, Some(b)) => (b.div_ceil(51_200), b, "given".to_string()),
        (None, None) if !recent.is_empty() => {
            let tail = &recent[recent.len().saturating_sub(5)..];
            let mut f: Vec<f64> = tail.iter().map(|r| r.files_read as f64).collect();
            let mut b: Vec<f64> = tail.iter().map(|r| r.bytes_read as f64).collect();
            (
                median(&mut f) as u64,
                median(&mut b) as u64,
                format!("median of the last {} hourly runs", tail.len()),
            )
        }
        _ => (
            0,
            0,
            "no history and none given: a run with nothing changed".to_string(),
        ),
    };
    let model = predict(&calibration, &probe, &source, hourly_files, hourly_bytes);
    let predicted = Prediction {
        initial: model.initial * correction.0,
        hourly: model.hourly * correction.1,
        no_change: model.no_change * correction.1,
        typical_change: model.typical_change * correction.1,
        ..model.clone()
    };
    Ok(Estimate {
        destination: dest.to_string(),
        source,
        hourly_files,
        hourly_bytes,
        hourly_basis,
        calibration,
        probe,
        model,
        predicted,
        correction,
        history: checked,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cal() -> Calibration {
        Calibration {
            per_file: 1e-4,
            per_byte: 1e-8,
            per_unchanged_file: 1e-6,
            stored_ratio: 1.0,
            samples: [(0, 0); 2],
            restore_per_file: 5e-5,
            restore_per_byte: 2e-9,
            restore_cpu_per_file: 0.0,
            restore_cpu_per_byte: 0.0,
            cores: 0,
            ..Calibration::default()
        }
    }

    fn dest(rtt: f64, bw: f64) -> DestProbe {
        DestProbe {
            connect_secs: 0.05,
            rtt,
            stream_bw: bw,
            parallel_bw: bw,
            concurrency: 8,
            download_bw: bw,
            download_cpu_per_byte: 0.0,
            per_file_copy: 3.0 * rtt,
            run_changed: 0.6,
            run_unchanged: 0.4,
            rounds: ProbeRounds::default(),
        }
    }

    #[test]
    fn the_small_sample_takes_leaves_of_small_files_of_at_most_half_its_size() {
        let root = tempfile::tempdir().unwrap();
        let mut files = Vec::new();
        let mut add = |dir: &str, n: usize, size: u64| {
            let d = root.path().join(dir);
            std::fs::create_dir_all(&d).unwrap();
            for i in 0..n {
                let p = d.join(format!("f{i}"));
                std::fs::write(&p, b"x").unwrap();
                files.push((p, size));
            }
        };
        add("a", 40, 1000);
        add("b", 40, 2000);
        // A few large files beside one small one.
        add("lists", 3, 30 << 20);
        // One leaf larger than half the sample.
        add("huge", 500, 1000);
        files.push((root.path().join("lists/tiny"), 10));
        for seed in 1..20 {
            let got = small_dirs(&files, 100, seed);
            assert!(!got.is_empty());
            for d in &got {
                let name = d.file_name().unwrap().to_str().unwrap();
                assert!(name == "a" || name == "b", "took {name}");
            }
        }
        // Where only large leaves exist, they are taken all the same.
        let only_huge: Vec<_> = files
            .iter()
            .filter(|(p, _)| p.parent().unwrap().ends_with("huge"))
            .cloned()
            .collect();
        assert_eq!(small_dirs(&only_huge, 100, 7).len(), 1);
    }

    #[test]
    fn the_spread_is_the_farthest_round_from_the_median() {
        assert_eq!(spread_of(&[]), 0.0);
        assert!((spread_of(&[2.0, 2.2, 1.9]) - 0.1).abs() < 1e-9);
        // One noisy round (a first connection) moves the median little.
        let mut rtt = vec![4.97, 2.68, 2.71];
        assert_eq!(median(&mut rtt), 2.71);
    }

    #[test]
    fn no_change_and_typical_change_are_predicted_beside_the_hourly_run() {
        let c = cal();
        let d = dest(0.010, 1e8);
        let s = SourceScan {
            files: 100_000,
            bytes: 1 << 30,
            ..SourceScan::default()
        };
        let p = predict(&c, &d, &s, 0, 0);
        assert_eq!(p.no_change, p.hourly);
        assert!((p.no_change - 0.5).abs() < 1e-6, "{}", p.no_change);
        assert!(p.typical_change > p.no_change);
        assert_eq!(
            p.typical_change,
            predict_run(&c, &d, 100_000, TYPICAL_FILES, TYPICAL_FILES * 51_200)
        );
    }

    #[test]
    fn slow_links_bound_initial_backups() {
        let c = cal();
        // 1 GB: pipeline 10 s + 1,000 files 0.1 s; upload at 10 MB/s 100 s.
        let t = predict_run(&c, &dest(0.002, 10e6), 1000, 1000, 1_000_000_000);
        assert!((100.0..103.0).contains(&t), "{t}");
        let fast = predict_run(&c, &dest(0.002, 1e9), 1000, 1000, 1_000_000_000);
        assert!((10.0..12.5).contains(&fast), "{fast}");
    }

    #[test]
    fn hourly_runs_cost_stats_and_round_trips() {
        let c = cal();
        let d = dest(0.010, 1e8);
        let t = predict_run(&c, &d, 100_000, 0, 0);
        // The measured no-change run + 100k x 1 us.
        assert!((t - 0.5).abs() < 1e-6, "{t}");
        // 100 new 50 KB files: the measured run with a change, 99.9k x 1 us,
        // the pipeline (0.01 s + 51 ms) over the upload (51 ms), and the
        // last pack's bytes at one stream (51 ms).
        let t = predict_run(&c, &d, 100_000, 100, 5_120_000);
        assert!((t - (0.6 + 0.0999 + 0.0612 + 0.0512)).abs() < 1e-6, "{t}");
    }

    #[test]
    fn restores_cost_the_larger_of_local_work_and_the_download() {
        let c = cal();
        // 1 GB, 1,000 files: local work 0.05 + 2 s; at 10 MB/s the download
        // is 100 s plus 239 reads of 4 MiB at 10 ms, 8 at once (0.3 s), and
        // 30% of the local work does not hide behind it.
        let t = predict_restore(&c, &dest(0.010, 10e6), 1000, 1_000_000_000);
        let net = 100.0 + 239.0 * 0.010 / 8.0;
        assert!((t - (0.4 + net + 0.3 * 2.05)).abs() < 1e-6, "{t}");
        // On a fast link this machine's work bounds it.
        let t = predict_restore(&c, &dest(0.001, 1e10), 1000, 1_000_000_000);
        let net = 0.1 + 239.0 * 0.001 / 8.0;
        assert!((t - (0.4 + 2.05 + 0.3 * net)).abs() < 1e-6, "{t}");
    }

    #[test]
    fn restores_need_the_cpu_of_both_halves_over_the_cores() {
        // 1 GB, 1,000 files, on 2 cores: local work 2.05 s, the download
        // at 1 GB/s 1.03 s, which would overlap into 2.05 + 0.3 x 1.03 s.
        // But writing takes 3 CPU seconds per GB and receiving 2: 5 CPU
        // seconds over 2 cores is 2.5 s (+ 5 ms per-file CPU).
        let c = Calibration {
            restore_cpu_per_file: 1e-5,
            restore_cpu_per_byte: 3e-9,
            cores: 2,
            ..cal()
        };
        let d = DestProbe {
            download_cpu_per_byte: 2e-9,
            ..dest(0.001, 1e9)
        };
        let t = predict_restore(&c, &d, 1000, 1_000_000_000);
        assert!((t - (0.4 + 2.505)).abs() < 1e-6, "{t}");
        assert_eq!(
            restore_parts(&c, &d, 1000, 1_000_000_000).bound(),
            "this machine's cores"
        );
        // With CPU to spare, the overlap of the two halves decides.
        let spare = Calibration { cores: 8, ..c };
        let net = 1.0 + 239.0 * 0.001 / 8.0;
        let t = predict_restore(&spare, &d, 1000, 1_000_000_000);
        assert!((t - (0.4 + 2.05 + 0.3 * net)).abs() < 1e-6, "{t}");
        assert_eq!(
            restore_parts(&spare, &d, 1000, 1_000_000_000).bound(),
            "writing here"
        );
    }

    #[test]
    fn restore_costs_fit_two_samples_or_split_one() {
        // 1,000 files of 50 KB in 0.15 s; 10 files of 10 MB in 0.2 s:
        // 0.1 ms per file and 1 ns per byte.
        let (f, b) = fit_restore(Some((1000.0, 5e7, 0.15)), Some((10.0, 1e8, 0.101)));
        assert!(
            (f - 1e-4).abs() < 1e-9 && (b - 1e-9).abs() < 1e-12,
            "{f} {b}"
        );
        let (f, b) = fit_restore(Some((1000.0, 5e7, 0.2)), None);
        assert!(
            (f - 1e-4).abs() < 1e-12 && (b - 2e-9).abs() < 1e-15,
            "{f} {b}"
        );
        assert_eq!(fit_restore(None, None), (0.0, 0.0));
    }

    #[test]
    fn history_corrects_by_median_ratio() {
        let c = cal();
        let d = dest(0.002, 1e8);
        let mk = |files_read, secs| RunRecord {
            files_read,
            backup_secs: secs,
            ..crate::record::test_record("x", 0, 1000)
        };
        let base = predict_run(&c, &d, 1000, 0, 0);
        let runs = vec![mk(0, base * 2.0), mk(0, base * 2.0), mk(0, base * 4.0)];
        let (checked, (i, h)) = check_history(&runs, "x", &c, &d);
        assert_eq!(checked.len(), 3);
        assert_eq!(i, 1.0);
        assert!((h - 2.0).abs() < 1e-9, "{h}");
        // Other destinations do not count.
        assert!(check_history(&runs, "y", &c, &d).0.is_empty());
    }

    fn round(secs: f64, read: f64) -> RunRecord {
        let mut r = crate::record::test_record("local", 0, 1000);
        r.backup_secs = secs;
        r.stages.read = read;
        r
    }

    /// Recorded sample rounds: a round disturbed by something else is
    /// discounted (the median stands), and a first round that read the
    /// source cold is recognised and stands for the backup, which will
    /// read it cold too.
    #[test]
    fn the_run_with_nothing_changed_is_scaled_by_the_walk_of_a_whole_subtree() {
        let f = |p: &str, n: u64| (PathBuf::from(p), n);
        let mut files = Vec::new();
        // /s/a: 3,000 small files in 30 directories; /s/b: 12,000 (too
        // many); /s/c: 2,000 of 100 KiB (too many bytes); /s/d: 500 (too
        // few). /s/a is taken, whole.
        for i in 0..3_000 {
            files.push(f(&format!("/s/a/{}/{i}", i % 30), 1_000));
        }
        for i in 0..12_000 {
            files.push(f(&format!("/s/b/{i}"), 10));
        }
        for i in 0..2_000 {
            files.push(f(&format!("/s/c/{i}"), 100 << 10));
        }
        for i in 0..500 {
            files.push(f(&format!("/s/d/{i}"), 10));
        }
        let roots = [PathBuf::from("/s")];
        assert_eq!(walk_sample(&files, &roots), Some(PathBuf::from("/s/a")));
        // One flat directory of 20,000 files: nothing fits.
        let flat: Vec<_> = (0..20_000).map(|i| f(&format!("/flat/{i}"), 1)).collect();
        assert_eq!(walk_sample(&flat, &[PathBuf::from("/flat")]), None);
        // The sample's run took 12 ms over an empty run's 2 ms, its walk
        // 20 ms: half a walk. The source's walk took 300 ms over 100,000
        // files: 1.5 µs a file.
        let per = unchanged_per_file(0.012, 0.002, 0.020, 0.300, 100_000).unwrap();
        assert!((per - 1.5e-6).abs() < 1e-12, "{per}");
        // No walk to scale by: none.
        assert_eq!(unchanged_per_file(0.012, 0.002, 0.0, 0.3, 100_000), None);
        // An empty run slower than the sample's (noise): no negative cost.
        assert_eq!(
            unchanged_per_file(0.002, 0.003, 0.02, 0.3, 100_000),
            Some(0.0)
        );
    }

    #[test]
    fn the_first_round_is_the_cold_one_and_the_warm_one_is_not_the_disturbed() {
        let rounds = [round(0.55, 0.30), round(0.41, 0.012), round(0.21, 0.011)];
        let (cold, warm) = cold_and_warm(&rounds);
        assert_eq!((cold.backup_secs, warm.backup_secs), (0.55, 0.21));
        let (cold, warm) = cold_and_warm(&rounds[..1]);
        assert_eq!((cold.backup_secs, warm.backup_secs), (0.55, 0.55));
    }

    #[test]
    fn the_two_samples_tell_the_cost_per_file_from_the_cost_per_byte() {
        // 1,000 small files and 100 MB: 50 µs a file and 4 ns a byte cold,
        // 20 µs and 1 ns warm, over a fixed 0.1 s.
        let run = |files: u64, bytes: u64, per_file: f64, per_byte: f64| RunRecord {
            files_read: files,
            bytes_read: bytes,
            backup_secs: 0.1 + files as f64 * per_file + bytes as f64 * per_byte,
            ..round(0.0, 0.0)
        };
        let empty = round(0.1, 0.0);
        let (f, b) = fit(
            Some(&run(1000, 10_000_000, 50e-6, 4e-9)),
            Some(&run(100, 100_000_000, 50e-6, 4e-9)),
            &empty,
        );
        assert!(
            (f - 50e-6).abs() < 1e-9 && (b - 4e-9).abs() < 1e-13,
            "{f} {b}"
        );
        let (wf, wb) = fit(
            Some(&run(1000, 10_000_000, 20e-6, 1e-9)),
            Some(&run(100, 100_000_000, 20e-6, 1e-9)),
            &empty,
        );
        assert!((wf - 20e-6).abs() < 1e-9 && (wb - 1e-9).abs() < 1e-13);
    }
}
