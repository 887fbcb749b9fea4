//! Calibration: timed backups and restores of samples of the source, to
//! a local repository, fitted to a per-file and a per-byte cost.

use std::path::{Path, PathBuf};
use std::time::Instant;

use capsule_engine::progress::Progress;
use capsule_engine::restore::{restore, RestoreOptions};
use capsule_engine::Repository;
use capsule_net::Destination;

use super::model::{median, spread_of, Calibration, RestoreSample};
use super::source::{
    cached_share, evict, small_dirs, unchanged_per_file, walk, walk_sample, SourceScan,
};
use crate::dest::Connector;
use crate::lab::{backup_step, Hints};
use crate::record::RunRecord;
use crate::{LabError, Result};

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
    // Up to COLD_SAMPLES disjoint large samples from the pool, one after
    // another: the first is backed up as the small one is, the others
    // only read cold once more (below).
    let mut larges: Vec<Vec<PathBuf>> = vec![Vec::new()];
    let mut large_bytes = 0u64;
    for (p, n) in pool.iter() {
        let last = larges.last_mut().expect("one");
        if large_bytes >= 96 << 20 || last.len() >= 200 {
            if larges.len() == COLD_SAMPLES {
                break;
            }
            larges.push(Vec::new());
            large_bytes = 0;
        }
        larges.last_mut().expect("one").push(p.clone());
        large_bytes += n;
    }
    let large = larges[0].clone();
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
    // How far repeated rounds of the same work lay from their median: the
    // machine's own variation, reported as the estimate's uncertainty.
    let spreads = std::cell::RefCell::new(Vec::new());
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
        let warm_secs: Vec<f64> = firsts.iter().skip(1).map(|r| r.backup_secs).collect();
        spreads.borrow_mut().push(spread_of(&warm_secs));
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
        let dest = Destination::Local(work.join("tree-0"));
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
    let restore_secs = |name: &str| -> Result<RestoreSample> {
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
            rounds.push(RestoreSample {
                name: name.to_string(),
                files: r.files,
                dirs: r.dirs,
                others: r.others,
                bytes: r.bytes,
                secs,
                cpu,
            });
            if !r.errors.is_empty() {
                return Err(LabError::io(
                    "restore the sample",
                    &target,
                    std::io::Error::other(format!("{} entries failed", r.errors.len())),
                ));
            }
        }
        if name == "small" || name == "large" {
            let secs: Vec<f64> = rounds.iter().map(|r| r.secs).collect();
            spreads.borrow_mut().push(spread_of(&secs));
        }
        rounds.sort_by(|a, b| a.secs.total_cmp(&b.secs));
        Ok(rounds.swap_remove(rounds.len() / 2))
    };
    // What any run costs here with nothing to do.
    let e = sample("empty", &[empty])?.expect("one path");
    let s = sample("small", &small)?;
    let l = sample("large", &large)?;
    // The disk's cold read, twice more, from samples disjoint from the
    // first (the same files read again may come from a cache below this
    // machine's, a VM host's): one cold read per sample put this disk at
    // 0.070 to 0.204 ms a file in 21 estimates of one tree, an hour apart
    // at most, and its own uncertainty did not show that.
    let cold_read = |name: String, paths: &[PathBuf]| -> Result<RunRecord> {
        evict(paths);
        let r = backup_step(
            &conn,
            &Destination::Local(work.join(name)),
            &password,
            paths,
            true,
            &work.join("cache"),
            Hints::default(),
        )?;
        crate::check_interrupt()?;
        Ok(r)
    };
    let mut cold_small: Vec<RunRecord> = s.iter().map(|r| r.cold.clone()).collect();
    let mut cold_large: Vec<RunRecord> = l.iter().map(|r| r.cold.clone()).collect();
    let mut read: std::collections::HashSet<PathBuf> = small.iter().cloned().collect();
    for k in 1..COLD_SAMPLES {
        if s.is_some() {
            let rest: Vec<(PathBuf, u64)> = files
                .iter()
                .filter(|(p, _)| p.parent().is_some_and(|d| !read.contains(d)))
                .cloned()
                .collect();
            let more = small_dirs(&rest, 1000, seed.rotate_left(8 * k as u32) | 1);
            if !more.is_empty() {
                cold_small.push(cold_read(format!("small-cold{k}"), &more)?);
                read.extend(more);
            }
        }
        if l.is_some() {
            let more = larges.get(k).filter(|m| !m.is_empty()).unwrap_or(&large);
            cold_large.push(cold_read(format!("large-cold{k}"), more)?);
        }
    }
    let share = cached_share(files, seed);
    let ((cold_file, cold_byte), cold_spread) = pick_cold(
        &cold_small,
        &cold_large,
        &e.warm,
        source.files,
        source.bytes,
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
    // Restores of the samples: what any restore costs (the empty one),
    // what a directory costs, then files and bytes from the small and the
    // large sample, each less its directories.
    let dirs_source = work.join("dirs-source");
    make_dirs(&dirs_source)?;
    backup_step(
        &conn,
        &Destination::Local(work.join("dirs-0")),
        &password,
        std::slice::from_ref(&dirs_source),
        true,
        &work.join("cache"),
        Hints::default(),
    )?;
    let mut samples = vec![restore_secs("empty")?, restore_secs("dirs")?];
    if s.is_some() {
        samples.push(restore_secs("small")?);
    }
    if tree.is_some() {
        samples.push(restore_secs("tree")?);
    }
    if l.is_some() {
        samples.push(restore_secs("large")?);
    }
    let _ = std::fs::remove_dir_all(&restored);
    let costs = fit_restores(&samples);
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
        restore_samples: samples,
        spread: spreads.into_inner().into_iter().fold(0.0, f64::max),
        cold_spread,
        cores: crate::cpu::cores(),
        ..costs.into_calibration(Calibration::default())
    })
}

/// A sample's rounds: the first (read cold), a warm one, and a run with
/// nothing changed.
struct Rounds {
    pub(crate) cold: RunRecord,
    pub(crate) warm: RunRecord,
    pub(crate) unchanged: RunRecord,
}

/// Seconds per file and per byte from the small and the large sample's
/// run, less what a run of an empty source (`empty`) costs.
pub(crate) fn fit(
    small: Option<&RunRecord>,
    large: Option<&RunRecord>,
    empty: &RunRecord,
) -> (f64, f64) {
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

/// The per-file and per-byte cost of reading cold, from cold reads of
/// several small and large samples (paired in order; a missing partner is
/// the first one's), each less `empty`: of the costs each pair gives, the
/// one that puts the source (`files`, `bytes`) at the median, and how far
/// the others lay from it ([`spread_of`]): how much this disk's cold read
/// varied while it was measured.
pub(crate) fn pick_cold(
    small: &[RunRecord],
    large: &[RunRecord],
    empty: &RunRecord,
    files: u64,
    bytes: u64,
) -> ((f64, f64), f64) {
    let pairs = small.len().max(large.len()).max(1);
    let mut fits: Vec<((f64, f64), f64)> = (0..pairs)
        .map(|i| {
            let (f, b) = fit(
                small.get(i).or(small.first()),
                large.get(i).or(large.first()),
                empty,
            );
            ((f, b), files as f64 * f + bytes as f64 * b)
        })
        .collect();
    let secs: Vec<f64> = fits.iter().map(|(_, t)| *t).collect();
    fits.sort_by(|a, b| a.1.total_cmp(&b.1));
    (fits[(fits.len() - 1) / 2].0, spread_of(&secs))
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

/// How many times each calibration sample is backed up.
const SAMPLE_ROUNDS: usize = 3;

/// How many samples, small and large, are read cold.
const COLD_SAMPLES: usize = 3;

/// How many runs with nothing changed the subtree sample gets.
const UNCHANGED_ROUNDS: usize = 5;

/// Makes the directory sample: 30 directories of 30 empty ones each, the
/// shape of a tree's directories without their files.
fn make_dirs(root: &Path) -> Result<()> {
    for i in 0..30 {
        for j in 0..30 {
            let d = root.join(format!("d{i:02}")).join(format!("e{j:02}"));
            std::fs::create_dir_all(&d).map_err(|e| LabError::io("create", &d, e))?;
        }
    }
    Ok(())
}

/// A restore's costs per file, per directory and per byte, in seconds and
/// in CPU seconds, from the restored samples ([`RestoreSample`], by name),
/// each less `empty` (what any restore costs): a directory costs what one
/// of `dirs` (900 empty directories) does; `small` (leaves from all over
/// the source, each with the directories above it) and `tree` (one whole
/// subtree, the source's own shape), less their directories at that cost,
/// are pooled into one point of many small files, and with `large` (a few
/// large files) give a file's and a byte's cost ([`fit_restore`]).
///
/// Beside them, what the samples' wall time says about the target disk:
/// the large sample's seconds per byte (it is written by every worker at
/// once, as a restore's bulk is), and the small sample's seconds per file
/// spent off the CPU (waiting for the disk to create and close files).
///
/// Why: charged to the files, the small sample's many directories (one per
/// 2 to 7 files, where a tree has one per 20) made a file cost 25% more
/// than in the source (58 µs of CPU against 46-49 µs, for 29,040 files in
/// 4,979 directories). Solving the three samples together for the three
/// costs instead was tried and dropped: the leaves and the subtree differ
/// too little in shape against the noise, and two estimates in a row put a
/// file at 0.5 and 30 µs.
pub(crate) fn fit_restores(samples: &[RestoreSample]) -> RestoreCosts {
    let find = |name: &str| samples.iter().find(|s| s.name == name);
    let costs = |value: fn(&RestoreSample) -> f64| {
        let base = find("empty");
        // A sample less the empty restore: (value, directories, files).
        let less_base = |s: &RestoreSample| {
            let (v, dirs, files) =
                base.map_or((0.0, 0, 0), |b| (value(b), b.dirs, b.files + b.others));
            (
                (value(s) - v).max(0.0),
                s.dirs.saturating_sub(dirs) as f64,
                (s.files + s.others).saturating_sub(files) as f64,
            )
        };
        // A directory costs what one of the empty ones does.
        let per_dir = find("dirs").map_or(0.0, |d| {
            let (v, dirs, _) = less_base(d);
            if dirs > 0.0 {
                v / dirs
            } else {
                0.0
            }
        });
        // The leaves and the subtree, less their directories at that cost,
        // pooled into one point of many small files: the subtree, of the
        // source's own shape and up to ten times the files, weighs most.
        let point = |name: &str| {
            find(name).map(|s| {
                let (v, dirs, files) = less_base(s);
                (files, s.bytes as f64, (v - dirs * per_dir).max(0.0))
            })
        };
        let pooled = match (point("small"), point("tree")) {
            (Some(a), Some(b)) => Some((a.0 + b.0, a.1 + b.1, a.2 + b.2)),
            (a, b) => a.or(b),
        };
        let (per_file, per_byte) = fit_restore(pooled, point("large"));
        UnitCosts {
            per_file,
            per_dir,
            per_byte,
        }
    };
    let base = find("empty").map_or((0.0, 0.0), |b| (b.secs, b.cpu));
    let write_per_byte =
        find("large").map_or(0.0, |l| (l.secs - base.0).max(0.0) / l.bytes.max(1) as f64);
    let wait_per_file = find("small").map_or(0.0, |s| {
        ((s.secs - base.0) - (s.cpu - base.1)).max(0.0) / (s.files + s.others).max(1) as f64
    });
    RestoreCosts {
        secs: costs(|s| s.secs),
        cpu: costs(|s| s.cpu),
        write_per_byte,
        wait_per_file,
    }
}

/// What [`fit_restores`] finds.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct RestoreCosts {
    /// Seconds.
    pub secs: UnitCosts,
    /// CPU seconds of this process.
    pub cpu: UnitCosts,
    /// Seconds per byte of the large sample, all of it charged to bytes.
    pub write_per_byte: f64,
    /// Seconds per file of the small sample spent off the CPU.
    pub wait_per_file: f64,
}

impl RestoreCosts {
    /// `base` with these restore costs in it.
    pub(crate) fn into_calibration(self, base: Calibration) -> Calibration {
        Calibration {
            restore_per_file: self.secs.per_file,
            restore_per_dir: self.secs.per_dir,
            restore_per_byte: self.secs.per_byte,
            restore_cpu_per_file: self.cpu.per_file,
            restore_cpu_per_dir: self.cpu.per_dir,
            restore_cpu_per_byte: self.cpu.per_byte,
            restore_write_per_byte: self.write_per_byte,
            restore_wait_per_file: self.wait_per_file,
            ..base
        }
    }
}

/// Costs of one kind per file, directory and byte.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct UnitCosts {
    pub per_file: f64,
    pub per_dir: f64,
    pub per_byte: f64,
}

/// Cost per file and per byte from the small and the large restore sample,
/// each (files, bytes, cost): solved exactly when both exist and the
/// solution is not negative, else charged to bytes; one sample alone is
/// split evenly between its files and its bytes.
pub(crate) fn fit_restore(
    small: Option<(f64, f64, f64)>,
    large: Option<(f64, f64, f64)>,
) -> (f64, f64) {
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
