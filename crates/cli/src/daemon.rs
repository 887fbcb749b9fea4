//! `capsule daemon`: runs each profile's backups (and its forget, prune and
//! check) on its schedule, in the foreground, as a service manager expects.
//!
//! Each job is a child process (`capsule --profile NAME backup`, ...), so
//! a job that crashes or leaks cannot take the daemon with it, and every
//! run writes the same records a run by hand does (`status` reads them).
//! A profile's runs never overlap, even across processes: a run holds an
//! advisory lock (`flock`) that the kernel releases when its process dies,
//! so a killed run or daemon leaves nothing behind; a second daemon for the
//! same profile finds the profile's daemon lock held and refuses.
//!
//! When a backup is due: the interval since the last *successful* backup
//! has passed ("every 1h"), or the last daily time ("daily at 03:00", in
//! the local time zone) is later than it. So after a sleep, a suspended
//! process or downtime, the profile is due once, whatever was missed: one
//! catch-up run, never a burst; and a success ends the slot, so a retry
//! never makes a second snapshot for it. A destination that cannot be
//! reached (exit 14) makes the run "skipped, retrying", retried after 1,
//! 2, 4 ... minutes (at most 15), logged when it starts and when it ends,
//! not at every try.
//!
//! Between jobs the daemon sleeps until the next one is due, waking at
//! least once a minute to notice a changed clock (a resume from suspend),
//! or at once for a signal: SIGTERM or SIGINT stops it (running jobs get
//! SIGTERM and a few seconds; a backup's resume journal makes the next run
//! cheap), SIGHUP rereads the configuration (a broken file keeps the old
//! one, and says why).
//!
//! A due backup waits while its profile's conditions hold it back (on
//! battery below `min-battery`, a metered network with `skip-metered`),
//! shown in `status` as what it waits for.
//!
//! Not built yet (see the issue): holding the opened repository and its
//! key between runs (each run derives the key, started early from its key
//! hint).

use std::collections::BTreeMap;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::Result;
use clap::Args;

use crate::config::{self, Config, Profile, Schedule};
use crate::output::Output;
use crate::status_cmd;
use crate::{exit, GlobalArgs};

/// Arguments of `daemon`.
#[derive(Args, Debug)]
pub struct DaemonArgs {}

/// An advisory lock on a file in the state directory, held until dropped
/// (or until the process dies: the kernel releases it).
pub struct ProfileLock {
    _fd: OwnedFd,
}

/// A lock that another process holds.
#[derive(Debug)]
pub struct Busy(pub String);

impl std::fmt::Display for Busy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}
impl std::error::Error for Busy {}

fn lock_path(profile: &str, kind: &str) -> Option<PathBuf> {
    let id = &capsule_format::ObjectId::of(profile.as_bytes()).to_hex()[..16];
    capsule_lab::history::state_dir().map(|d| d.join("locks").join(format!("{id}.{kind}")))
}

impl ProfileLock {
    /// Takes `profile`'s lock of `kind` ("run" or "daemon") without
    /// waiting. `Err(Busy)` names the process that holds it.
    pub fn acquire(profile: &str, kind: &str) -> Result<Option<ProfileLock>> {
        use rustix::fs::{FlockOperation, Mode, OFlags};
        let Some(path) = lock_path(profile, kind) else {
            return Ok(None);
        };
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        let fd = rustix::fs::open(
            &path,
            OFlags::RDWR | OFlags::CREATE | OFlags::CLOEXEC | OFlags::NOFOLLOW,
            Mode::from_raw_mode(0o600),
        )?;
        match rustix::fs::flock(&fd, FlockOperation::NonBlockingLockExclusive) {
            Ok(()) => {}
            Err(e) if e == rustix::io::Errno::WOULDBLOCK => {
                let holder = std::fs::read_to_string(&path).unwrap_or_default();
                return Err(Busy(format!(
                    "profile {profile:?}: another {} holds it{}",
                    if kind == "daemon" { "daemon" } else { "run" },
                    match holder.trim() {
                        "" => String::new(),
                        pid => format!(" (process {pid})"),
                    }
                ))
                .into());
            }
            Err(e) => return Err(std::io::Error::from(e).into()),
        }
        // Who holds it, for the message another process gives.
        rustix::fs::ftruncate(&fd, 0)?;
        let _ = rustix::io::pwrite(&fd, std::process::id().to_string().as_bytes(), 0);
        Ok(Some(ProfileLock { _fd: fd }))
    }
}

/// A job of a profile.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Job {
    Backup,
    Forget,
    Prune,
    Check,
    CheckReadData,
}

impl Job {
    fn args(self) -> &'static [&'static str] {
        match self {
            Job::Backup => &["backup"],
            Job::Forget => &["forget"],
            Job::Prune => &["prune"],
            Job::Check => &["check"],
            Job::CheckReadData => &["check", "--read-data"],
        }
    }
    fn name(self) -> &'static str {
        match self {
            Job::Backup => "backup",
            Job::Forget => "forget",
            Job::Prune => "prune",
            Job::Check => "check",
            Job::CheckReadData => "check --read-data",
        }
    }
    fn schedule(self, p: &Profile) -> Option<Schedule> {
        let s = p.schedule.clone().unwrap_or_default();
        let text = match self {
            // Backups are hourly unless the profile says otherwise.
            Job::Backup => Some(s.backup.unwrap_or_else(|| "hourly".into())),
            Job::Forget => s.forget,
            Job::Prune => s.prune,
            Job::Check => s.check,
            Job::CheckReadData => s.check_read_data,
        }?;
        Schedule::parse(&text).ok().filter(|s| *s != Schedule::Off)
    }
}

const JOBS: [Job; 5] = [
    Job::Backup,
    Job::Forget,
    Job::Prune,
    Job::Check,
    Job::CheckReadData,
];

/// One line per event, with a syslog priority prefix the systemd journal
/// reads (launchd keeps the line as it is).
fn log(level: &str, profile: &str, event: &str) {
    let prio = match level {
        "error" => 3,
        "warning" => 4,
        _ => 6,
    };
    eprintln!("<{prio}>{level}: profile {profile}: {event}");
}

/// When `job` on `schedule` is next due, given the start of its last
/// success (or its last attempt, for maintenance jobs): `None` = due now.
fn next_due(schedule: Schedule, last: Option<i64>, now: i64) -> Option<i64> {
    // A last run dated after now (the clock was ahead then, or jumped
    // back since) says nothing of when the next is due: plan from now.
    let last = last.filter(|&t| t <= now)?;
    match schedule {
        Schedule::Off => Some(i64::MAX),
        Schedule::Every(n) => Some(last.saturating_add(n as i64)).filter(|&t| t > now),
        Schedule::DailyAt(h, m) => {
            // The most recent h:m, local time, at or before now; due when
            // the last run started before it.
            let tz = jiff::tz::TimeZone::try_system().unwrap_or(jiff::tz::TimeZone::UTC);
            let at = |day: jiff::civil::Date| {
                day.at(h as i8, m as i8, 0, 0)
                    .to_zoned(tz.clone())
                    .map(|z| z.timestamp().as_second())
                    .ok()
            };
            let today = jiff::Timestamp::from_second(now)
                .ok()?
                .to_zoned(tz.clone())
                .date();
            let recent = match at(today) {
                Some(t) if t <= now => t,
                _ => today.yesterday().ok().and_then(at)?,
            };
            if last < recent {
                None
            } else {
                today.tomorrow().ok().and_then(at)
            }
        }
    }
}

/// What the daemon knows of one profile between jobs.
#[derive(Default)]
struct Track {
    /// The backup is "skipped, retrying" until this time.
    retry_at: Option<i64>,
    /// The current backoff, seconds.
    backoff: i64,
    /// The last backup found the destination away.
    away: bool,
    /// Why the backup waits for `retry_at`.
    retry_why: &'static str,
    /// What `status` was last told (written only when it changes).
    view: Option<status_cmd::DaemonView>,
    /// The condition a due backup waits for, if any.
    held_back: Option<String>,
}

struct Running {
    child: std::process::Child,
    profile: String,
    job: Job,
    since: Instant,
}

/// `capsule daemon`.
pub fn daemon(g: &GlobalArgs, out: &Output, _a: DaemonArgs) -> Result<u8> {
    use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM, SIGUSR1};
    let (path, _) = config::config_path(g.config.as_deref())
        .ok_or_else(|| config::ConfigError("no configuration directory: give --config".into()))?;
    let mut cfg = Config::load(&path)?;
    for w in &cfg.warnings {
        out.warn(w);
    }
    let names = |cfg: &Config| -> Result<Vec<String>> {
        Ok(match &g.profile {
            Some(n) => {
                cfg.profile(n)?;
                vec![n.clone()]
            }
            // Without --profile, only profiles with a `schedule` table: a
            // profile kept for commands by hand is not backed up hourly
            // behind its owner's back.
            None => cfg
                .file
                .profiles
                .iter()
                .filter(|(_, p)| p.schedule.is_some())
                .map(|(n, _)| cfg.profile(n).map(|_| n.clone()))
                .collect::<Result<_, _>>()?,
        })
    };
    let mut profiles = names(&cfg)?;
    if profiles.is_empty() {
        return Err(config::ConfigError(format!(
            "{}: no profile has a `schedule`; add one (schedule = {{ backup = \"hourly\" }}) or name a profile with --profile",
            path.display()
        ))
        .into());
    }
    // One daemon per profile, across processes.
    let mut held = BTreeMap::new();
    for name in &profiles {
        match ProfileLock::acquire(name, "daemon")? {
            Some(l) => {
                held.insert(name.clone(), l);
            }
            None => anyhow::bail!("no state directory for the daemon's locks"),
        }
    }
    // Signals arrive on a channel, so the loop sleeps in `recv_timeout`:
    // woken by a signal or when the next job is due, never polling.
    let mut signals = signal_hook::iterator::Signals::new([SIGTERM, SIGINT, SIGHUP, SIGUSR1])?;
    let (tx, rx) = std::sync::mpsc::channel::<i32>();
    std::thread::spawn(move || {
        for s in signals.forever() {
            if tx.send(s).is_err() {
                break;
            }
        }
    });
    let tick = std::env::var("CAPSULE_DAEMON_TICK_MS")
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
        .map(Duration::from_millis);
    let exe = std::env::current_exe()?;
    // Each profile's derived key, held between runs and handed to each
    // run, so that a scheduled run derives none (see `held_key`).
    crate::held_key::forbid_dumps();
    let mut keys: BTreeMap<String, (capsule_access::Access, crate::held_key::HeldKey)> =
        BTreeMap::new();
    let hold = |keys: &mut BTreeMap<_, _>, cfg: &Config, name: &str| {
        if keys.contains_key(name) {
            return;
        }
        let Ok(p) = cfg.profile(name) else { return };
        if let Some(k) = crate::held_key::for_profile(g, name, p) {
            log("info", name, "key derived; held for the next runs");
            keys.insert(name.to_string(), k);
        }
    };
    for name in &profiles {
        hold(&mut keys, &cfg, name);
    }
    // Each profile's watcher, keeping its change journal.
    let mut watching: BTreeMap<String, Watching> = BTreeMap::new();
    let watch_all =
        |watching: &mut BTreeMap<String, Watching>, cfg: &Config, profiles: &[String]| {
            watching.clear();
            for name in profiles {
                if let Some(w) = cfg
                    .profile(name)
                    .ok()
                    .and_then(|p| Watching::start(name, p))
                {
                    watching.insert(name.clone(), w);
                }
            }
        };
    watch_all(&mut watching, &cfg, &profiles);
    let mut tracks: BTreeMap<String, Track> = BTreeMap::new();
    let mut running: Vec<Running> = Vec::new();
    for name in &profiles {
        log("info", name, "daemon started");
    }
    let mut pending: Vec<i32> = Vec::new();
    'outer: loop {
        let sigs: Vec<i32> = pending.drain(..).chain(rx.try_iter()).collect();
        for sig in sigs {
            match sig {
                SIGHUP => match Config::load(&path).and_then(|c| {
                    names(&c).map_err(|e| config::ConfigError(e.to_string()))?;
                    Ok(c)
                }) {
                    Ok(c) => {
                        let new = names(&c).unwrap_or_default();
                        // Profiles added get their daemon lock; those gone
                        // release it.
                        held.retain(|n, _| new.contains(n));
                        for n in &new {
                            if !held.contains_key(n) {
                                match ProfileLock::acquire(n, "daemon") {
                                    Ok(Some(l)) => {
                                        held.insert(n.clone(), l);
                                    }
                                    Ok(None) => {}
                                    Err(e) => log("error", n, &format!("not run: {e}")),
                                }
                            }
                        }
                        profiles = new.into_iter().filter(|n| held.contains_key(n)).collect();
                        cfg = c;
                        // A password or repository may have changed.
                        keys.clear();
                        for name in &profiles {
                            hold(&mut keys, &cfg, name);
                        }
                        // Sources or excludes may have changed: new
                        // journals (the next runs scan in full once).
                        watch_all(&mut watching, &cfg, &profiles);
                        log(
                            "info",
                            "*",
                            &format!("configuration reread from {}", path.display()),
                        );
                    }
                    Err(e) => log(
                        "error",
                        "*",
                        &format!("configuration not reread, the old one stays: {e}"),
                    ),
                },
                // A backup asks for the journals as of now.
                SIGUSR1 => {
                    for w in watching.values() {
                        w.sync();
                    }
                }
                _ => break 'outer,
            }
        }
        // Jobs that ended.
        running.retain_mut(|r| match r.child.try_wait() {
            Ok(None) => true,
            Ok(Some(st)) => {
                finished(
                    &cfg,
                    r,
                    st.code(),
                    tracks.entry(r.profile.clone()).or_default(),
                );
                // The first run on this machine wrote the key hint: derive
                // now, between runs, not in the next one.
                if matches!(st.code(), Some(0 | 3)) {
                    hold(&mut keys, &cfg, &r.profile);
                }
                false
            }
            Err(_) => false,
        });
        let now = capsule_engine::timefmt::now_unix();
        let mut wake = now + 60;
        for name in &profiles {
            let Ok(p) = cfg.profile(name) else { continue };
            let track = tracks.entry(name.clone()).or_default();
            staleness(name, p, now);
            for job in JOBS {
                let Some(schedule) = job.schedule(p) else {
                    continue;
                };
                // One run of each job of a profile at a time; forget,
                // prune and check run beside a backup (prune needs no
                // lock), so a backup never waits for them.
                if running.iter().any(|r| &r.profile == name && r.job == job) {
                    continue;
                }
                let last = match job {
                    Job::Backup => status_cmd::load_state(name)
                        .last_success
                        .map(|r| r.started_unix),
                    // Never run: due now (a daily time: once it passes).
                    _ => status_cmd::load_state(name)
                        .maintenance
                        .get(job.name())
                        .copied(),
                };
                let due = match next_due(schedule, last, now) {
                    None => match (job, track.retry_at) {
                        (Job::Backup, Some(t)) if t > now => Some(t),
                        _ => None,
                    },
                    t => t,
                };
                // A due backup waits for its conditions (battery,
                // metered network), re-checked at every wake.
                let held_back = match (job, due, &p.conditions) {
                    (Job::Backup, None, Some(c)) => crate::conditions::waiting_for(c),
                    _ => None,
                };
                if job == Job::Backup {
                    if held_back != track.held_back {
                        match &held_back {
                            Some(w) => log("info", name, &format!("backup due, waiting for {w}")),
                            None if track.held_back.is_some() => {
                                log("info", name, "conditions met")
                            }
                            None => {}
                        }
                        track.held_back = held_back.clone();
                    }
                    // What `status` shows; written only when it changes
                    // (0: due now).
                    let view = status_cmd::DaemonView {
                        pid: std::process::id(),
                        next_backup_unix: due.unwrap_or(0),
                        waiting_for: held_back.clone().or_else(|| {
                            track
                                .retry_at
                                .filter(|&t| t > now)
                                .map(|_| track.retry_why.to_string())
                        }),
                    };
                    if track.view.as_ref() != Some(&view) {
                        status_cmd::save_daemon_view(name, &view);
                        track.view = Some(view);
                    }
                    if held_back.is_some() {
                        continue;
                    }
                }
                match due {
                    Some(t) => wake = wake.min(t),
                    None => {
                        // A key file changed since (a new password): the
                        // run derives the new key, and the daemon after it.
                        if keys.get(name).is_some_and(|(a, k)| !k.matches(a)) {
                            keys.remove(name);
                        }
                        let key = keys.get(name).map(|(_, k)| k);
                        if let Some(r) = start(&exe, &path, name, job, p, key) {
                            if job != Job::Backup {
                                status_cmd::update(name, |st| {
                                    st.maintenance.insert(job.name().to_string(), now);
                                });
                            }
                            running.push(r);
                        }
                    }
                }
            }
        }
        // Asleep until the next job is due (at most a minute, to notice a
        // changed clock), or until a signal or a job's end.
        let mut sleep = Duration::from_secs(
            wake.saturating_sub(capsule_engine::timefmt::now_unix())
                .clamp(1, 60) as u64,
        );
        if !running.is_empty() {
            sleep = sleep.min(Duration::from_millis(500));
        }
        if let Some(t) = tick {
            sleep = sleep.min(t);
        }
        if let Ok(sig) = rx.recv_timeout(sleep) {
            pending.push(sig);
        }
    }
    // Stopping: running jobs get SIGTERM and a few seconds.
    for r in &running {
        if let Some(pid) = rustix::process::Pid::from_raw(r.child.id() as i32) {
            let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
        }
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    for mut r in running {
        while Instant::now() < deadline && matches!(r.child.try_wait(), Ok(None)) {
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = r.child.kill();
        let _ = r.child.wait();
        log(
            "info",
            &r.profile,
            &format!("{} stopped with the daemon", r.job.name()),
        );
    }
    watching.clear();
    for name in &profiles {
        log("info", name, "daemon stopped");
    }
    Ok(exit::OK)
}

/// A profile's watcher: a thread recording the sources' changes in the
/// profile's journal file (see `crate::journal`), written when a backup
/// asks (`sync`) and at most once a second otherwise. Stopped when
/// dropped.
struct Watching {
    wake: std::sync::Arc<OwnedFd>,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Watching {
    /// Starts watching `p`'s sources, unless its journal is off or it has
    /// no sources or no scheduled backup.
    fn start(name: &str, p: &Profile) -> Option<Watching> {
        use std::sync::atomic::{AtomicBool, Ordering};
        if p.journal == Some(false) || p.sources.is_empty() || Job::Backup.schedule(p).is_none() {
            return None;
        }
        let path = crate::journal::journal_path(name)?;
        let base = crate::journal::base_path(name)?;
        let opts = crate::journal::watch_options(p);
        // Written to ask for the journal (and to stop): wakes the thread.
        let wake = std::sync::Arc::new(
            rustix::event::eventfd(
                0,
                rustix::event::EventfdFlags::CLOEXEC | rustix::event::EventfdFlags::NONBLOCK,
            )
            .ok()?,
        );
        let woken = wake.clone();
        let (ready, started) = std::sync::mpsc::channel::<()>();
        let stop = std::sync::Arc::new(AtomicBool::new(false));
        let stopping = stop.clone();
        let profile = name.to_string();
        let thread = std::thread::Builder::new()
            .name(format!("watch-{name}"))
            .spawn(move || {
                let (mut journal, mut watcher) = capsule_watch::start(&opts);
                match (&watcher, &journal.degraded) {
                    (Some(w), _) => log(
                        "info",
                        &profile,
                        &match journal.watched {
                            0 => format!(
                                "watching the sources' file systems ({}): runs list only what changed",
                                w.kind()
                            ),
                            n => format!(
                                "watching {n} directories ({}): runs list only what changed",
                                w.kind()
                            ),
                        },
                    ),
                    (None, Some(why)) => log(
                        "warning",
                        &profile,
                        &format!("not watching the sources, every run scans in full: {why}"),
                    ),
                    (None, None) => {}
                }
                for d in &journal.unwatchable {
                    log(
                        "warning",
                        &profile,
                        &format!(
                            "{} is on a file system that cannot be watched: scanned in full each run",
                            d.display()
                        ),
                    );
                }
                let write = |j: &mut capsule_watch::Journal| {
                    // What the last run's cut covered is no longer needed.
                    if let Ok(b) = capsule_watch::Base::load(&base) {
                        if b.cut.epoch == j.identity.epoch {
                            j.prune(b.cut.seq);
                        }
                    }
                    if let Err(e) = j.save(&path) {
                        log("error", &profile, &format!("journal not written: {e}"));
                    }
                };
                write(&mut journal);
                let _ = ready.send(());
                let mut changed = false;
                let mut written = Instant::now();
                while !stopping.load(Ordering::Relaxed) {
                    // Asleep until events are queued, a run asks, or a
                    // second passes (to write what changed, and notice a
                    // change of the mounts).
                    {
                        use rustix::event::{PollFd, PollFlags};
                        let mut fds = vec![PollFd::new(&*woken, PollFlags::IN)];
                        if let Some(w) = &watcher {
                            fds.push(PollFd::from_borrowed_fd(w.as_fd(), PollFlags::IN));
                        }
                        let second = rustix::time::Timespec {
                            tv_sec: 1,
                            tv_nsec: 0,
                        };
                        let _ = rustix::event::poll(&mut fds, Some(&second));
                    }
                    let asked = rustix::io::read(&*woken, &mut [0u8; 8]).is_ok_and(|n| n == 8);
                    // Read after the request arrived: everything the kernel
                    // queued before it is in.
                    if let Some(w) = watcher.as_mut() {
                        match w.drain(&mut journal, Duration::ZERO) {
                            Ok(c) => changed |= c,
                            Err(e) => {
                                log(
                                    "warning",
                                    &profile,
                                    &format!("stopped watching, every run scans in full: {e}"),
                                );
                                watcher = None;
                                changed = true;
                            }
                        }
                    }
                    if asked {
                        journal.syncs += 1;
                    }
                    if asked || (changed && written.elapsed() > Duration::from_secs(1)) {
                        write(&mut journal);
                        changed = false;
                        written = Instant::now();
                    }
                }
            })
            .ok()?;
        // The first run, due at once, finds the journal written (bounded:
        // a huge tree takes its time to watch, and the run then scans in
        // full, as it would anyway with no base).
        let _ = started.recv_timeout(Duration::from_secs(60));
        Some(Watching {
            wake,
            stop,
            thread: Some(thread),
        })
    }

    /// Asks for the journal as of now.
    fn sync(&self) {
        let _ = rustix::io::write(&*self.wake, &1u64.to_ne_bytes());
    }
}

impl Drop for Watching {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        self.sync();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Starts `job` of profile `name` as a child process, after its `before`
/// hook (a failing hook skips the job).
fn start(
    exe: &Path,
    config: &Path,
    name: &str,
    job: Job,
    p: &Profile,
    key: Option<&crate::held_key::HeldKey>,
) -> Option<Running> {
    if job == Job::Backup {
        if let Some(h) = p.hooks.as_ref().and_then(|h| h.before.as_ref()) {
            if !hook(h, name, "before", None) {
                log("warning", name, "backup skipped: the before hook failed");
                return None;
            }
        }
    }
    let mut c = std::process::Command::new(exe);
    c.arg("--config")
        .arg(config)
        .arg("--profile")
        .arg(name)
        .arg("--quiet")
        .args(job.args())
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null());
    if key.is_some() {
        c.env(crate::held_key::HELD_KEY, "stdin")
            .stdin(std::process::Stdio::piped());
    }
    match c.spawn() {
        Ok(mut child) => {
            if let (Some(k), Some(stdin)) = (key, child.stdin.take()) {
                // A child that cannot take it derives the key itself.
                let _ = k.hand_over(stdin);
            }
            log("info", name, &format!("{} started", job.name()));
            Some(Running {
                child,
                profile: name.to_string(),
                job,
                since: Instant::now(),
            })
        }
        Err(e) => {
            log("error", name, &format!("{} not started: {e}", job.name()));
            None
        }
    }
}

/// A job ended with exit `code`: log it, run the hooks, set the backoff.
fn finished(cfg: &Config, r: &Running, code: Option<i32>, track: &mut Track) {
    let name = &r.profile;
    let secs = r.since.elapsed().as_secs_f64();
    let hooks = cfg
        .profile(name)
        .ok()
        .and_then(|p| p.hooks.clone())
        .unwrap_or_default();
    let code = code.unwrap_or(-1);
    let result = match code {
        0 => "ok",
        3 => "incomplete",
        14 => "skipped",
        22 => "busy",
        _ => "failed",
    };
    if r.job == Job::Backup {
        match result {
            "skipped" => {
                // The destination cannot be reached: retry with backoff.
                let first = !track.away;
                track.away = true;
                track.backoff = if first {
                    60
                } else {
                    (track.backoff * 2).min(900)
                };
                track.retry_at = Some(capsule_engine::timefmt::now_unix() + track.backoff);
                track.retry_why = "waiting for the destination, which cannot be reached; retrying";
                if first {
                    log(
                        "warning",
                        name,
                        "backup skipped: the destination cannot be reached; retrying",
                    );
                }
                // The run recorded itself as skipped (status_cmd::outcome).
                return;
            }
            "busy" => {
                // A backup by hand (or another process) holds the profile:
                // try again in a minute, not at every wake.
                track.retry_at = Some(capsule_engine::timefmt::now_unix() + 60);
                track.retry_why = "another run of the profile holds it; retrying";
            }
            "failed" => {
                // Not retried at once: a wrong password, a missing
                // repository or a broken password command fails the same
                // way until someone fixes it. 5 minutes, doubling, at most
                // an hour; `status` says why meanwhile.
                track.backoff = if track.away || track.backoff == 0 {
                    300
                } else {
                    (track.backoff * 2).min(3600)
                };
                track.away = false;
                track.retry_at = Some(capsule_engine::timefmt::now_unix() + track.backoff);
                track.retry_why = "the last run failed; retrying";
            }
            _ => {
                if std::mem::take(&mut track.away) {
                    log("info", name, "the destination answers again");
                }
                track.retry_at = None;
                track.backoff = 0;
            }
        }
    }
    let level = if matches!(result, "ok" | "busy") {
        "info"
    } else {
        "warning"
    };
    let next = match (r.job, result) {
        (Job::Backup, "failed") => format!("; next try in {} min", track.backoff / 60),
        _ => String::new(),
    };
    log(
        level,
        name,
        &format!(
            "{} {result} (exit {code}) in {secs:.1} s{next}",
            r.job.name()
        ),
    );
    if r.job == Job::Backup {
        if let Some(h) = &hooks.after {
            hook(h, name, "after", Some(result));
        }
        if result == "failed" {
            if let Some(h) = &hooks.on_failure {
                hook(h, name, "on-failure", Some(result));
            }
        }
    }
}

/// Runs hook `command` (sh -c) with the profile and result in its
/// environment; true when it succeeded.
fn hook(command: &str, profile: &str, which: &str, result: Option<&str>) -> bool {
    let mut c = std::process::Command::new("sh");
    c.arg("-c")
        .arg(command)
        .env("CAPSULE_PROFILE", profile)
        .env("CAPSULE_HOOK", which);
    if let Some(r) = result {
        c.env("CAPSULE_RESULT", r);
    }
    match c.status() {
        Ok(s) if s.success() => true,
        Ok(s) => {
            log("warning", profile, &format!("{which} hook failed ({s})"));
            false
        }
        Err(e) => {
            log("warning", profile, &format!("{which} hook not run: {e}"));
            false
        }
    }
}

/// Runs the staleness hook once when `p` becomes stale (once per stale
/// period, across restarts: recorded in the profile's state).
fn staleness(name: &str, p: &Profile, now: i64) {
    let st = status_cmd::load_state(name);
    let last = st.last_success.as_ref().map(|r| r.started_unix);
    if !status_cmd::is_stale(p, last, now) {
        return;
    }
    let key = last.unwrap_or(0);
    if st.stale_notified == Some(key) {
        return;
    }
    status_cmd::update(name, |st| st.stale_notified = Some(key));
    log(
        "warning",
        name,
        &match last {
            Some(t) => format!(
                "stale: no successful backup since {}",
                capsule_engine::timefmt::rfc3339(t)
            ),
            None => "stale: never backed up".into(),
        },
    );
    if let Some(h) = p.hooks.as_ref().and_then(|h| h.on_stale.as_ref()) {
        hook(h, name, "on-stale", Some("stale"));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_interval_is_due_once_however_much_was_missed() {
        let h = Schedule::Every(3600);
        assert_eq!(next_due(h, None, 1000), None);
        assert_eq!(next_due(h, Some(0), 1000), Some(3600));
        assert_eq!(next_due(h, Some(0), 3600), None);
        // Ten hours asleep: due (once: the run's success moves `last`).
        assert_eq!(next_due(h, Some(0), 36_000), None);
        assert_eq!(next_due(h, Some(36_000), 36_001), Some(39_600));
    }

    #[test]
    fn a_last_run_dated_in_the_future_is_due_now() {
        // Run while the clock said 2031: not planned for 2031 and after.
        let t2031 = 1_924_992_000;
        assert_eq!(next_due(Schedule::Every(3600), Some(t2031), 1000), None);
        assert_eq!(next_due(Schedule::DailyAt(3, 0), Some(t2031), 1000), None);
    }
}
