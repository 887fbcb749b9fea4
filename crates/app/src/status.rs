//! Run records and status: every `backup --profile NAME` records its
//! outcome in `<state>/profiles/NAME.json` (success or failure), from
//! this machine's local state only, so status answers at once and with
//! the destination away.
//!
//! Staleness is judged from the last success against the profile's
//! `stale-after`, else twice its backup interval (hourly by default): a
//! profile that never succeeded is stale too, so staleness shows even
//! when nothing ever ran (no daemon, a broken schedule).

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::config::{self, Schedule};

/// What this machine last learnt of a profile's repository size.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct RepoSize {
    /// Bytes of packs on the destination.
    pub stored: u64,
    /// Its quota, if it has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quota: Option<u64>,
    /// When it was measured, Unix seconds.
    pub as_of_unix: i64,
}

/// The last `check` of a profile's repository.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct CheckOutcome {
    /// When it started, Unix seconds.
    pub started_unix: i64,
    /// Whether it read packs (`--read-data`, or a subset of them).
    pub read_data: bool,
    /// Which packs it read when not all (`3/12`, `5%`, `2 GB`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subset: Option<String>,
    /// With slices: when each slice was last verified (from the
    /// repository's records, so also by other machines).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub slices: Vec<capsule_engine::verified::SliceRecord>,
    /// "ok", "damaged" (it found problems: see `capsule check`) or
    /// "failed" (it could not run).
    pub result: String,
    /// Why it failed, in one line.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// One run of a profile, as recorded.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct RunOutcome {
    /// When it started, Unix seconds.
    pub started_unix: i64,
    /// How long it took.
    pub duration_secs: f64,
    /// "ok", "incomplete" (some files could not be read) or "failed".
    pub result: String,
    /// The snapshot written.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot: Option<String>,
    /// Files in it.
    #[serde(default)]
    pub files: u64,
    /// Bytes it added to the repository.
    #[serde(default)]
    pub bytes_added: u64,
    /// Why it failed, in one line.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// How the key was had: `held` (the daemon's: nothing derived),
    /// `early`, `derived`, `new`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<capsule_engine::KeySource>,
    /// The repository's quota, when it has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quota: Option<u64>,
    /// Bytes stored after the run (measured when there is a quota).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stored: Option<u64>,
    /// How the sources were scanned: with the change journal or in full,
    /// and why.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scan: Option<capsule_engine::backup::ScanReport>,
}

/// What this machine knows of a profile's runs.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct ProfileState {
    /// The last run, whatever its result.
    pub last_run: Option<RunOutcome>,
    /// The last run that saved a snapshot.
    pub last_success: Option<RunOutcome>,
    /// When the daemon last started each maintenance job ("forget",
    /// "prune", "check", "check --read-data"), Unix seconds: kept here so a
    /// restarted daemon does not start their intervals again.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub maintenance: std::collections::BTreeMap<String, i64>,
    /// The staleness hook ran for the stale period that began after this
    /// last success (its start; 0: never backed up), so it runs once per
    /// period, across daemon restarts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stale_notified: Option<i64>,
    /// The repository's size against its quota, as last measured (by a
    /// backup when there is a quota, `quota show`, `status --refresh`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub repository: Option<RepoSize>,
    /// The last check.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_check: Option<CheckOutcome>,
    /// When each slice of the packs was last verified, as the last check
    /// of a slice read it from the repository.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub verified_slices: Vec<capsule_engine::verified::SliceRecord>,
    /// Verification runs of the change journal (a full scan compared with
    /// it), and how many found a difference.
    #[serde(default)]
    pub journal_verified: u32,
    /// See `journal_verified`.
    #[serde(default)]
    pub journal_mismatches: u32,
}

/// What a running daemon says of a profile (`<state>/profiles/*.daemon`).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct DaemonView {
    /// The daemon's process ID.
    pub pid: u32,
    /// When the next backup is due (Unix seconds); 0 or earlier than now:
    /// due now (running, or waiting for a condition).
    pub next_backup_unix: i64,
    /// Why it waits beyond its schedule ("the destination cannot be
    /// reached", "the last run failed"), if it does.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub waiting_for: Option<String>,
}

fn daemon_file(profile: &str) -> Option<PathBuf> {
    state_file(profile).map(|p| p.with_extension("daemon"))
}

/// Keeps what the daemon says of `profile`, when it changed.
pub fn save_daemon_view(profile: &str, v: &DaemonView) {
    let Some(path) = daemon_file(profile) else {
        return;
    };
    write_replacing(&path, &serde_json::to_vec(v).unwrap_or_default());
}

/// What the daemon last said of `profile`, if its process still runs.
pub fn load_daemon_view(profile: &str) -> Option<DaemonView> {
    let v: DaemonView = daemon_file(profile)
        .and_then(|p| capsule_access::open::read_own_file(&p, 1 << 16))
        .and_then(|b| serde_json::from_slice(&b).ok())?;
    alive(v.pid).then_some(v)
}

/// A backup of a profile while it runs, as it says of itself every half
/// second (`<state>/profiles/*.running`): what `status` and the page show
/// as its progress, whoever started it (the daemon, the page, a shell).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct Running {
    /// The backup's process ID.
    pub pid: u32,
    /// When it started (Unix seconds).
    pub started_unix: i64,
    /// Files done (read, or found unchanged), of `files_total`.
    pub files_done: u64,
    /// Bytes of the files done, of `bytes_total`.
    pub bytes_done: u64,
    /// Files expected (final once `totals_final`).
    pub files_total: u64,
    /// Bytes expected.
    pub bytes_total: u64,
    /// The estimating scan has finished.
    pub totals_final: bool,
}

fn running_file(profile: &str) -> Option<PathBuf> {
    state_file(profile).map(|p| p.with_extension("running"))
}

/// Says how far `profile`'s backup got (best effort).
pub fn save_running(profile: &str, r: &Running) {
    if let Some(path) = running_file(profile) {
        write_replacing(&path, &serde_json::to_vec(r).unwrap_or_default());
    }
}

/// The backup of `profile` ended: nothing runs any more.
pub fn clear_running(profile: &str) {
    if let Some(path) = running_file(profile) {
        let _ = std::fs::remove_file(path);
    }
}

/// The backup of `profile` running now, if its process still runs (a
/// killed one leaves its file behind).
pub fn load_running(profile: &str) -> Option<Running> {
    let r: Running = running_file(profile)
        .and_then(|p| capsule_access::open::read_own_file(&p, 1 << 16))
        .and_then(|b| serde_json::from_slice(&b).ok())?;
    alive(r.pid).then_some(r)
}

fn request_file(profile: &str) -> Option<PathBuf> {
    state_file(profile).map(|p| p.with_extension("now"))
}

/// Asks the daemon to back `profile` up now ([`crate::now`]).
pub fn request_backup(profile: &str) -> std::io::Result<()> {
    let path = request_file(profile)
        .ok_or_else(|| std::io::Error::other("no state directory (is $HOME set?)"))?;
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(path, b"")
}

/// Whether a backup of `profile` was asked for now; the request is taken.
pub fn take_backup_request(profile: &str) -> bool {
    request_file(profile).is_some_and(|p| std::fs::remove_file(p).is_ok())
}

pub(crate) fn alive(pid: u32) -> bool {
    let Some(pid) = rustix::process::Pid::from_raw(pid as i32) else {
        return false;
    };
    match rustix::process::test_kill_process(pid) {
        Ok(()) => true,
        Err(e) => e == rustix::io::Errno::PERM,
    }
}

/// Writes `bytes` to `path` by a rename, so a reader sees the old file or
/// the new one, never half of either.
fn write_replacing(path: &std::path::Path, bytes: &[u8]) {
    let Some(dir) = path.parent() else { return };
    let tmp = dir.join(format!(
        ".tmp-{}-{}",
        path.extension().and_then(|e| e.to_str()).unwrap_or("x"),
        std::process::id()
    ));
    let ok = std::fs::create_dir_all(dir)
        .and_then(|()| std::fs::write(&tmp, bytes))
        .and_then(|()| std::fs::rename(&tmp, path));
    if ok.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
}

fn state_file(profile: &str) -> Option<PathBuf> {
    // Profile names are TOML keys: anything; keep the file name plain.
    let safe: String = profile
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect();
    let id = &capsule_format::ObjectId::of(profile.as_bytes()).to_hex()[..8];
    capsule_lab::history::state_dir().map(|d| d.join("profiles").join(format!("{safe}-{id}.json")))
}

/// The recorded state of `profile` (empty when none, or unreadable).
pub fn load_state(profile: &str) -> ProfileState {
    state_file(profile)
        .and_then(|p| capsule_access::open::read_own_file(&p, 1 << 20))
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or_default()
}

/// Records a run of `profile`. Best effort: a run is not failed for want
/// of its record.
pub fn record(profile: &str, run: RunOutcome) {
    update(profile, |st| {
        if let Some(stored) = run.stored {
            st.repository = Some(RepoSize {
                stored,
                quota: run.quota,
                as_of_unix: run.started_unix,
            });
        }
        if let Some(matched) = run.scan.as_ref().and_then(|s| s.journal_matched) {
            st.journal_verified += 1;
            if !matched {
                st.journal_mismatches += 1;
            }
        }
        if run.result == "ok" || run.result == "incomplete" {
            st.last_success = Some(run.clone());
        }
        st.last_run = Some(run);
    });
}

/// Changes `profile`'s recorded state (read, change, replace atomically).
/// Best effort, as `record`.
pub fn update(profile: &str, change: impl FnOnce(&mut ProfileState)) {
    let Some(path) = state_file(profile) else {
        return;
    };
    let mut st = load_state(profile);
    change(&mut st);
    let Some(dir) = path.parent() else { return };
    let tmp = dir.join(format!(".tmp-{}", std::process::id()));
    let ok = std::fs::create_dir_all(dir)
        .and_then(|()| std::fs::write(&tmp, serde_json::to_vec_pretty(&st).unwrap_or_default()))
        .and_then(|()| std::fs::rename(&tmp, &path));
    if let Err(e) = ok {
        let _ = std::fs::remove_file(&tmp);
        eprintln!(
            "warning: the run of profile {profile:?} was not recorded in {}: {e}",
            path.display()
        );
    }
}

/// How a backup ended, as its record needs it.
pub enum Ended<'a> {
    /// It saved a snapshot (`complete`: every entry was read).
    Saved {
        /// Whether every entry was read.
        complete: bool,
        /// What it did.
        done: Option<&'a BackupDone>,
    },
    /// It failed, with its error's first line.
    Failed {
        /// The destination could not be reached (exit 14): the run is
        /// skipped, not the profile failing.
        unreachable: bool,
        /// The error, in one line.
        error: String,
    },
}

/// What a backup leaves for the profile's record.
#[derive(Debug)]
pub struct BackupDone {
    /// The engine's report.
    pub report: capsule_engine::backup::BackupReport,
    /// How the key was had (`held`: from the daemon, nothing derived).
    pub key: capsule_engine::KeySource,
    /// The repository's quota, if any, and the bytes stored after the run.
    pub quota: Option<u64>,
    /// Bytes of packs stored (measured when there is a quota).
    pub stored: Option<u64>,
}

/// What a backup's end records: its snapshot and counts, or its error.
pub fn outcome(started_unix: i64, duration_secs: f64, end: Ended<'_>) -> RunOutcome {
    match end {
        Ended::Saved { complete, done } => RunOutcome {
            started_unix,
            duration_secs,
            result: if complete { "ok" } else { "incomplete" }.into(),
            snapshot: done.map(|d| d.report.snapshot_id.clone()),
            files: done.map_or(0, |d| d.report.summary.files),
            bytes_added: done.map_or(0, |d| d.report.summary.bytes_added),
            error: None,
            key: done.map(|d| d.key),
            quota: done.and_then(|d| d.quota),
            stored: done.and_then(|d| d.stored),
            scan: done.map(|d| d.report.scan.clone()),
        },
        Ended::Failed { unreachable, error } => RunOutcome {
            started_unix,
            duration_secs,
            // A destination away (a NAS asleep, a laptop off the home
            // network) skips the run; it is not the profile failing.
            result: if unreachable { "skipped" } else { "failed" }.into(),
            snapshot: None,
            files: 0,
            bytes_added: 0,
            error: Some(error),
            key: None,
            quota: None,
            stored: None,
            scan: None,
        },
    }
}

/// Whether `p`, whose last successful backup started at `last`, is stale
/// at `now`. A last backup dated after now proves nothing about the
/// backups being current (the clock was ahead when it ran, or is behind
/// now): stale too.
pub fn is_stale(p: &config::Profile, last: Option<i64>, now: i64) -> bool {
    last.is_none_or(|t| t > now || now.saturating_sub(t) > stale_after(p) as i64)
}

/// What is wrong with the clock, when the profile's last run or last
/// success is dated after `now`.
pub fn clock_problem(st: &ProfileState, now: i64) -> Option<String> {
    let future = [st.last_success.as_ref(), st.last_run.as_ref()]
        .into_iter()
        .flatten()
        .map(|r| r.started_unix)
        .filter(|&t| t > now)
        .max()?;
    Some(format!(
        "a run is dated {}, after this machine's clock ({}): the clock was ahead then or is behind now; check it (`timedatectl`). The daemon plans from now",
        capsule_engine::timefmt::rfc3339(future),
        capsule_engine::timefmt::rfc3339(now)
    ))
}

/// How old the last success may be before `p` is stale, in seconds.
pub fn stale_after(p: &config::Profile) -> u64 {
    let s = p.schedule.clone().unwrap_or_default();
    if let Some(d) = s.stale_after.as_deref().and_then(config::parse_duration) {
        return d;
    }
    match s.backup.as_deref().map(Schedule::parse) {
        Some(Ok(Schedule::Every(n))) => 2 * n,
        Some(Ok(Schedule::DailyAt(..))) => 2 * 86_400,
        // No schedule: judged as hourly, the default.
        _ => 2 * 3600,
    }
}

/// What `status` says of a profile's change journal: whether a watcher
/// keeps one, whether the last run could use it, and what the
/// verification runs found.
fn journal_view(name: &str, daemon: bool, st: &ProfileState) -> serde_json::Value {
    let j = crate::journal::journal_path(name).and_then(|p| capsule_watch::Journal::load(&p).ok());
    let scan = st.last_run.as_ref().and_then(|r| r.scan.clone());
    let mut parts = Vec::new();
    match (&j, daemon) {
        (Some(j), true) => match &j.degraded {
            Some(why) => parts.push(format!("not watching: {why}")),
            None => parts.push(format!(
                "{} watches {} since {}",
                j.identity.kind,
                match j.watched {
                    0 => "the sources' file systems".to_string(),
                    n => format!("{n} directories"),
                },
                capsule_engine::timefmt::rfc3339(j.since)
            )),
        },
        (Some(_), false) => parts.push("no watcher runs (the daemon is stopped)".into()),
        (None, _) => {}
    }
    if let Some(j) = j.as_ref().filter(|_| daemon) {
        for d in &j.unwatchable {
            parts.push(format!(
                "{} cannot be watched, scanned in full",
                d.display()
            ));
        }
    }
    if let Some(s) = &scan {
        match (s.mode.as_str(), &s.reason) {
            ("journal", _) => parts.push(format!(
                "last run listed {} directories of {} changed",
                s.dirs_listed, s.dirs_changed
            )),
            ("verify", _) => parts.push("last run was a verification run".into()),
            (_, Some(why)) if j.is_some() => parts.push(format!("last run scanned in full: {why}")),
            _ => {}
        }
    }
    if st.journal_verified > 0 {
        parts.push(format!(
            "{} verification runs, {} found a difference",
            st.journal_verified, st.journal_mismatches
        ));
    }
    serde_json::json!({
        "kind": j.as_ref().map(|j| j.identity.kind.clone()),
        "watching": daemon && j.as_ref().is_some_and(|j| j.degraded.is_none()),
        "watched_dirs": j.as_ref().map(|j| j.watched),
        "degraded": j.as_ref().and_then(|j| j.degraded.clone()),
        "unwatchable": j.as_ref().map(|j| j.unwatchable.iter().map(|p| p.display().to_string()).collect::<Vec<_>>()),
        "verified": st.journal_verified,
        "mismatches": st.journal_mismatches,
        "summary": (!parts.is_empty()).then(|| parts.join("; ")),
    })
}

/// One profile's status as `status --json` gives it, and whether it is
/// stale and failing.
pub fn profile_row(
    name: &str,
    p: &config::Profile,
    st: &ProfileState,
    refresh_error: Option<String>,
    now: i64,
) -> (serde_json::Value, bool, bool) {
    let limit = stale_after(p);
    let age = st
        .last_success
        .as_ref()
        .map(|r| now.saturating_sub(r.started_unix));
    let stale = is_stale(p, st.last_success.as_ref().map(|r| r.started_unix), now);
    let failing = st.last_run.as_ref().is_some_and(|r| r.result == "failed");
    let daemon = load_daemon_view(name);
    let journal = journal_view(name, daemon.is_some(), st);
    let row = serde_json::json!({
        "profile": name,
        "clock_problem": clock_problem(st, now),
        "next_backup_unix": daemon.as_ref().map(|d| d.next_backup_unix),
        "waiting_for": daemon.as_ref().and_then(|d| d.waiting_for.clone()),
        "daemon": daemon.is_some(),
        "stale": stale,
        "stale_after_secs": limit,
        "last_success_age_secs": age,
        "failing": failing,
        "last_run": st.last_run,
        "last_success": st.last_success,
        "repository": st.repository,
        "last_check": st.last_check,
        "verified_slices": st.verified_slices,
        "refresh_error": refresh_error,
        "journal": journal,
        "running": load_running(name),
    });
    (row, stale, failing)
}

/// Every profile's status, as `status --json` gives it (none without a
/// configuration file): for `capsule ui`.
pub fn all_rows(config_flag: Option<&std::path::Path>) -> Vec<serde_json::Value> {
    let Some((path, _)) = config::config_path(config_flag) else {
        return Vec::new();
    };
    let Ok(cfg) = config::Config::load(&path) else {
        return Vec::new();
    };
    let now = capsule_engine::timefmt::now_unix();
    cfg.file
        .profiles
        .iter()
        .map(|(name, p)| profile_row(name, p, &load_state(name), None, now).0)
        .collect()
}

/// Asks `profile`'s destination for its size and quota, in a child
/// process (`quota show`, which records what it finds), so that each
/// profile's credentials stay its own. `None` when it answered; else why
/// not, in one line. Bounded by a minute.
pub fn refresh(config: &std::path::Path, profile: &str) -> Option<String> {
    let exe = match std::env::current_exe() {
        Ok(e) => e,
        Err(e) => return Some(format!("cannot run capsule: {e}")),
    };
    let child = std::process::Command::new(exe)
        .arg("--config")
        .arg(config)
        .args(["--profile", profile, "--quiet", "quota", "show"])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn();
    let mut child = match child {
        Ok(c) => c,
        Err(e) => return Some(format!("cannot run capsule: {e}")),
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        match child.try_wait() {
            Ok(Some(st)) if st.success() => return None,
            Ok(Some(st)) => {
                let mut err = String::new();
                if let Some(mut e) = child.stderr.take() {
                    use std::io::Read;
                    let _ = e.read_to_string(&mut err);
                }
                let line = err
                    .lines()
                    .find(|l| l.starts_with("capsule:") || l.starts_with("error"))
                    .or_else(|| err.lines().next())
                    .unwrap_or("")
                    .to_string();
                return Some(format!(
                    "the destination did not answer ({}): {line}",
                    st.code().map_or("killed".into(), |c| format!("exit {c}"))
                ));
            }
            Ok(None) if std::time::Instant::now() < deadline => {
                std::thread::sleep(std::time::Duration::from_millis(50))
            }
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                return Some("the destination did not answer within a minute".into());
            }
        }
    }
}

/// Records a check of `profile`.
pub fn record_check(profile: &str, c: CheckOutcome) {
    update(profile, |st| {
        if !c.slices.is_empty() {
            st.verified_slices = c.slices.clone();
        }
        st.last_check = Some(c)
    });
}

/// Records the repository's size of `profile`.
pub fn record_size(profile: &str, r: RepoSize) {
    update(profile, |st| st.repository = Some(r));
}
