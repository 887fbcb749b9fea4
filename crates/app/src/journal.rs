//! The change journal between the daemon, which keeps it, and a profile's
//! backups, which use it.
//!
//! The daemon runs a watcher per profile (see `capsule_watch`) and writes
//! its journal to `<state>/journal/<profile>.json`. A backup of the
//! profile, started by the daemon or by hand, first asks the daemon to
//! write everything it has seen so far (SIGUSR1; it waits until the file's
//! `syncs` count moves), cuts the journal there, takes what changed since
//! the cut of the run that made the parent snapshot (`<profile>.base.json`),
//! and after committing writes its own cut as the next base. Anything that
//! keeps the journal from vouching for every change gives a full scan, and
//! the reason is in the run's summary, its `--json` and its record.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use capsule_engine::backup::{BackupOptions, BackupReport, Changes};
use capsule_watch::{Base, Cut, Identity, Journal, WatchOptions};

use crate::config::Profile;

/// How many runs make one verification run when the profile says nothing.
/// On macOS, whose FSEvents watcher has not yet run on a Mac, a quarter
/// as many: it is checked against a full scan every sixth run.
pub const VERIFY_EVERY: u32 = if cfg!(target_os = "macos") { 6 } else { 24 };

/// Where the journals are kept.
fn dir() -> Option<PathBuf> {
    capsule_lab::history::state_dir().map(|d| d.join("journal"))
}

/// The journal file the daemon writes for `profile`.
pub fn journal_path(profile: &str) -> Option<PathBuf> {
    dir().map(|d| d.join(format!("{profile}.json")))
}

/// The base file the last backup of `profile` wrote.
pub fn base_path(profile: &str) -> Option<PathBuf> {
    dir().map(|d| d.join(format!("{profile}.base.json")))
}

/// What the daemon watches for a profile: its sources, as its backups
/// back them up.
pub fn watch_options(p: &Profile) -> WatchOptions {
    WatchOptions {
        sources: p.sources.clone(),
        // The other rules are part of the scope as words beside the
        // patterns, as the backup that uses the journal reckons it.
        excludes: p
            .excludes
            .iter()
            .cloned()
            .chain(p.exclude_rules().unwrap_or_default().scope_words())
            .collect(),
        ignore_file: (!p.no_ignore_files.unwrap_or(false)).then(|| {
            p.ignore_file
                .clone()
                .unwrap_or_else(|| ".capsuleignore".into())
        }),
        one_file_system: p.one_file_system.unwrap_or(false),
        skip: capsule_lab::history::state_dir()
            .into_iter()
            .chain(
                p.cache_dir
                    .clone()
                    .or_else(|| std::env::var_os("CAPSULE_CACHE_DIR").map(PathBuf::from))
                    .or_else(|| match capsule_access::CachePolicy::user_default() {
                        capsule_access::CachePolicy::In(d) => Some(d),
                        capsule_access::CachePolicy::Off => None,
                    }),
            )
            .collect(),
        journal: None,
    }
}

/// What a backup takes from the journal.
#[derive(Debug, Default)]
pub struct ForRun {
    /// The journal this run was cut from, and where: the next run's base.
    cut: Option<(Identity, Cut)>,
    /// What changed since the parent.
    pub changes: Option<Changes>,
    /// Why there is no journal to follow.
    pub reason: Option<String>,
    /// This run verifies the journal (a full scan compared with it).
    pub verify: bool,
    runs_since_verify: u32,
    /// Whether a journal file exists for the profile (a daemon watches or
    /// watched it): the reason for a full scan is only worth saying then.
    pub watched: bool,
}

/// Asks the daemon keeping `j` to write what it has seen so far; the
/// journal as then written.
fn synced(path: &std::path::Path, j: Journal) -> Result<Journal, String> {
    let Some(pid) = rustix::process::Pid::from_raw(j.pid as i32) else {
        return Err("the journal names no daemon".into());
    };
    if rustix::process::kill_process(pid, rustix::process::Signal::USR1).is_err() {
        return Err(
            "the daemon that kept the journal is not running: changes since it stopped cannot be known"
                .into(),
        );
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    while Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(2));
        if let Ok(now) = Journal::load(path) {
            if now.syncs > j.syncs || now.identity.epoch != j.identity.epoch {
                return Ok(now);
            }
        }
    }
    Err("the daemon did not write its journal within 5 s".into())
}

/// The journal's part in a backup of `profile` with `opts`.
pub fn for_run(profile: Option<&str>, p: &Profile, opts: &BackupOptions, off: bool) -> ForRun {
    let mut r = ForRun::default();
    let Some(name) = profile else {
        return r;
    };
    let Some(path) = journal_path(name) else {
        return r;
    };
    r.watched = path.exists();
    let no = |mut r: ForRun, why: &str| {
        r.reason = Some(why.to_string());
        r
    };
    if p.journal == Some(false) {
        return no(r, "the profile's journal is off (journal = false)");
    }
    let j = match Journal::load(&path) {
        Ok(j) => j,
        Err(capsule_watch::WatchError::Io { source, .. })
            if source.kind() == std::io::ErrorKind::NotFound =>
        {
            return no(
                r,
                "no watcher keeps a journal for this profile (`capsule daemon` runs one)",
            );
        }
        Err(e) => return no(r, &e.to_string()),
    };
    let j = match synced(&path, j) {
        Ok(j) => j,
        Err(why) => return no(r, &why),
    };
    // Cut even when the journal is not followed: a full scan made after
    // this cut is as good a base for the next run as any.
    let cut = j.cut();
    r.cut = Some((j.identity.clone(), cut.clone()));
    if off {
        return no(r, "--no-journal");
    }
    if opts.parent.is_some() {
        return no(r, "--parent names the snapshot to compare with");
    }
    let base = match base_path(name).map(|b| Base::load(&b)) {
        Some(Ok(b)) => b,
        Some(Err(capsule_watch::WatchError::Io { source, .. }))
            if source.kind() == std::io::ErrorKind::NotFound =>
        {
            return no(r, "no snapshot was made under this journal yet");
        }
        Some(Err(e)) => return no(r, &e.to_string()),
        None => return no(r, "no state directory"),
    };
    let mut words = opts.excludes.clone();
    words.extend(opts.rules.scope_words());
    let scope = capsule_watch::scope(
        &capsule_watch::walked_sources(&opts.paths),
        &words,
        opts.ignore_file.as_deref(),
        opts.one_file_system,
    );
    r.runs_since_verify = base.runs_since_verify;
    match j.changes_since(&base, &scope, &cut) {
        Ok(c) => {
            let every = p.journal_verify_every.unwrap_or(VERIFY_EVERY);
            r.verify = every > 0 && base.runs_since_verify + 1 >= every;
            r.changes = Some(c);
        }
        Err(why) => r.reason = Some(why),
    }
    r
}

/// After a backup committed: its cut is the next run's base. Returns a
/// warning when the base could not be written (the next run then scans in
/// full; nothing is lost).
pub fn after_run(profile: Option<&str>, r: &ForRun, report: &BackupReport) -> Option<String> {
    let (identity, cut) = r.cut.clone()?;
    let path = base_path(profile?)?;
    let verified = report.scan.journal_matched.is_some() || report.scan.mode == "full";
    let base = Base {
        identity,
        cut,
        snapshot: report.snapshot_id.clone(),
        runs_since_verify: if verified { 0 } else { r.runs_since_verify + 1 },
        linked: report.linked_dirs.iter().cloned().collect(),
        tops: report.tops.clone(),
    };
    base.save(&path)
        .err()
        .map(|e| format!("the journal's base was not written ({e}): the next run scans in full"))
}
