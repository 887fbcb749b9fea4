//! A backup as every caller runs one: thinning to the quota before and
//! after, what to do when the destination is full, the resume journal, the
//! damaged packs, and the repository and cache kept out of the sources.

use std::sync::Arc;

use capsule_engine::backup::{BackupOptions, BackupReport};
use capsule_engine::progress::Progress;
use capsule_engine::quota::{self, Quota, ThinPlan, ThinReport};
use capsule_engine::{EngineError, Repository};

use crate::open::{Opened, RESUME_JOURNAL};
use capsule_engine::Result;

/// What a backup does when space runs out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum WhenFull {
    /// Delete the oldest snapshots, prune, carry on (as Time Machine does).
    #[default]
    DeleteOldest,
    /// Fail, deleting nothing.
    Fail,
}

/// What a backup tells its caller while it runs, to print or log.
#[derive(Debug)]
pub enum Notice<'a> {
    /// Something the user should know; the run goes on.
    Warning(String),
    /// Snapshots are about to be removed to make room (oldest first).
    Thinning(&'a ThinPlan),
}

/// A finished backup.
#[derive(Debug)]
pub struct BackupRun {
    /// The engine's report.
    pub report: BackupReport,
    /// Thinning done for the quota or a full destination, before and after.
    pub thinned: Vec<ThinReport>,
    /// The repository's quota, if it has one.
    pub quota: Option<Quota>,
    /// Bytes of packs on the destination after the run, when there is a
    /// quota (measuring it costs two listings, which a run without one
    /// does not pay).
    pub stored: Option<u64>,
}

impl Opened {
    /// Backs up with `opts`, filled in with what this open repository
    /// knows: its own directory and cache are skipped (a repository inside
    /// a source would back itself up, growing with every run), the resume
    /// journal and the damaged packs live in the cache directory.
    ///
    /// With a quota, snapshots are thinned first so that what the last run
    /// added fits again, and after the run if it went over. A destination
    /// that reports itself full is, with [`WhenFull::DeleteOldest`],
    /// thinned and the run tried once more.
    pub fn backup(
        self,
        opts: BackupOptions,
        when_full: WhenFull,
        progress: &Arc<Progress>,
        notice: &mut dyn FnMut(Notice<'_>),
    ) -> Result<BackupRun> {
        self.run(opts, when_full, notice, &mut |repo, opts| {
            capsule_engine::backup::backup(repo.clone(), opts, progress)
        })
    }

    /// [`Opened::backup`] of one stream (standard input, a command's
    /// output). A stream is read once: a destination found full is thinned
    /// for the next run, and this one fails.
    pub fn backup_stream(
        self,
        opts: BackupOptions,
        stream: capsule_engine::backup::Stream<'_>,
        when_full: WhenFull,
        progress: &Arc<Progress>,
        notice: &mut dyn FnMut(Notice<'_>),
    ) -> Result<BackupRun> {
        let mut stream = Some(stream);
        self.run(opts, when_full, notice, &mut |repo, opts| match stream.take() {
            Some(s) => capsule_engine::backup::backup_stream(repo.clone(), opts, s, progress),
            None => Err(EngineError::StreamFailed(
                "the destination was full, and a stream cannot be read again: run it again (room was made)".into(),
            )),
        })
    }

    fn run(
        self,
        mut opts: BackupOptions,
        when_full: WhenFull,
        notice: &mut dyn FnMut(Notice<'_>),
        go: &mut dyn FnMut(&Arc<Repository>, &BackupOptions) -> Result<BackupReport>,
    ) -> Result<BackupRun> {
        opts.skip_dirs.extend(self.local.iter().cloned());
        if let Some(dir) = self.cache_dir() {
            opts.skip_dirs.push(dir.to_path_buf());
            opts.journal = Some(dir.join(RESUME_JOURNAL));
        }
        if opts.damaged_packs.is_empty() {
            opts.damaged_packs = self.damaged_packs();
        }
        let repo = Arc::new(self.repo);
        // One listing when there is no quota; with one, what the last run
        // added is what this one is expected to add.
        // A dry run changes nothing: no thinning before or after.
        let quota = if opts.dry_run {
            None
        } else {
            quota::load(&repo)?
        };
        let expected = match quota {
            Some(_) => repo
                .list_snapshots()
                .ok()
                .and_then(|(s, _)| s.last().map(|(_, s)| s.summary.bytes_added))
                .unwrap_or(0),
            None => 0,
        };
        let (before, _) = thin_to_quota(&repo, notice, when_full, quota, expected)?;
        let mut report = go(&repo, &opts);
        let full = matches!(&report, Err(e) if is_full(e));
        if when_full == WhenFull::DeleteOldest
            && full
            && !opts.dry_run
            && thin_when_full(&repo, notice, expected)?
        {
            report = go(&repo, &opts);
        }
        let report = report?;
        // A run larger than expected may have gone over: thin now, so the
        // repository is within its quota between runs.
        let (after, stored) =
            thin_to_quota(&repo, notice, when_full, quota, 0).unwrap_or_else(|e| {
                notice(Notice::Warning(format!(
                    "could not thin to the quota after the run: {e}"
                )));
                (None, None)
            });
        Ok(BackupRun {
            report,
            thinned: before.into_iter().chain(after).collect(),
            quota,
            stored,
        })
    }
}

/// Before a backup: with a quota, thin so that the run's expected new data
/// (what the last run of these paths added) fits. Says so when it will not.
/// Also returns the bytes stored in the end (with a quota).
fn thin_to_quota(
    repo: &Arc<Repository>,
    notice: &mut dyn FnMut(Notice<'_>),
    when_full: WhenFull,
    quota: Option<Quota>,
    expected: u64,
) -> Result<(Option<ThinReport>, Option<u64>)> {
    let Some(q) = quota else {
        return Ok((None, None));
    };
    let stored = quota::stored_bytes(repo)?;
    if stored.saturating_add(expected) <= q.bytes {
        return Ok((None, Some(stored)));
    }
    // Pack headers and index files take a little beyond the blobs.
    let target = (q.bytes as f64 * 0.98) as u64;
    let target = target.saturating_sub(expected);
    let plan = quota::plan(repo, target, q.min_age_secs)?;
    if when_full == WhenFull::Fail {
        return Err(EngineError::Invalid(format!(
            "the repository holds {} of its {} quota and this run is expected to add {}; deleting old snapshots would make room (--when-full delete-oldest)",
            human_bytes(stored),
            human_bytes(q.bytes),
            human_bytes(expected)
        )));
    }
    let plan = if plan.fits {
        plan
    } else {
        // Forgetting history that cannot make the run fit buys nothing the
        // user asked for: forget none of it. Space no snapshot uses (what
        // earlier forgets left) still comes back below.
        notice(Notice::Warning(format!(
            "the {} quota is too small for this run by {}: the snapshots that must stay (the newest of each source and those younger than the minimum age) use {}, and this run may add {} (what the last run of these paths added). Nothing was forgotten for it; backing up anyway. Raise the quota with `capsule quota set SIZE`",
            human_bytes(q.bytes),
            human_bytes(plan.used_after.saturating_add(expected).saturating_sub(q.bytes)),
            human_bytes(plan.used_after),
            human_bytes(expected)
        )));
        ThinPlan {
            remove: Vec::new(),
            used_after: plan.used,
            ..plan
        }
    };
    if !plan.needed(q.bytes.saturating_sub(expected)) {
        return Ok((None, Some(stored)));
    }
    notice(Notice::Thinning(&plan));
    let r = quota::thin(repo, plan)?;
    let after = r.stored_after;
    Ok((Some(r), Some(after)))
}

/// After a destination reported itself full: frees, oldest first, what the
/// last run added with a fifth to spare, and at least a fifth of what the
/// snapshots use, so that the run can be tried again.
fn thin_when_full(
    repo: &Arc<Repository>,
    notice: &mut dyn FnMut(Notice<'_>),
    expected: u64,
) -> Result<bool> {
    let min_age = quota::load(repo)?.map_or(3600, |q| q.min_age_secs);
    let probe = quota::plan(repo, u64::MAX, min_age)?;
    let free = (probe.used / 5).max(expected / 5 * 6);
    let plan = quota::plan(repo, probe.used.saturating_sub(free), min_age)?;
    if plan.remove.is_empty() {
        return Ok(false);
    }
    notice(Notice::Warning(format!(
        "the destination is full: deleting the {} oldest snapshot(s) to make room, then trying again",
        plan.remove.len()
    )));
    notice(Notice::Thinning(&plan));
    quota::thin(repo, plan)?;
    Ok(true)
}

/// Whether an engine error means the destination (or a spill directory)
/// is full.
pub fn is_full(e: &EngineError) -> bool {
    match e {
        EngineError::Backend(b) => b.kind == capsule_backend::ErrorKind::NoSpace,
        EngineError::Io { source, .. } => matches!(
            source.kind(),
            std::io::ErrorKind::StorageFull | std::io::ErrorKind::QuotaExceeded
        ),
        _ => false,
    }
}

/// A byte count for people: `512 B`, `1.5 MiB`.
pub fn human_bytes(n: u64) -> String {
    const U: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut v = n as f64;
    let mut i = 0;
    while v >= 1024.0 && i < U.len() - 1 {
        v /= 1024.0;
        i += 1;
    }
    if i == 0 {
        format!("{n} B")
    } else {
        format!("{v:.1} {}", U[i])
    }
}
