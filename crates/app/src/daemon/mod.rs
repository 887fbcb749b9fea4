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
//! one, and says why), SIGUSR2 starts the backups asked for now
//! ([`crate::now`]), whatever their schedule and conditions.
//!
//! A due backup waits while its profile's conditions hold it back (on
//! battery below `min-battery`, a metered network with `skip-metered`),
//! shown in `status` as what it waits for.
//!
//! Each profile's derived key is held between runs and handed to each run
//! on a pipe ([`crate::held_key`]), so a scheduled run derives none; the
//! opened repository is not held (each run opens it, a child process of
//! its own).

mod jobs;
mod watching;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use crate::config::{self, Config};
use crate::error::{Error, Result};
use crate::held_key::HeldKey;
use crate::lock::ProfileLock;
use crate::settings::Settings;
use crate::status;
use jobs::{finished, log, next_due, staleness, start, Job, Running, Track, JOBS};
use watching::Watching;

/// `capsule daemon`.
///
/// Runs until SIGTERM or SIGINT; `warn` hears of the configuration file's
/// warnings (everything after goes to the log, on standard error).
pub fn run(s: &Settings, warn: &dyn Fn(String)) -> Result<()> {
    use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM, SIGUSR1, SIGUSR2};
    let io = |what: &str, e: std::io::Error| Error::io(format!("the daemon: {what}"), e);
    let (path, _) = config::config_path(s.flags.config.as_deref())
        .ok_or_else(|| config::ConfigError("no configuration directory: give --config".into()))?;
    let mut cfg = Config::load(&path)?;
    for w in &cfg.warnings {
        warn(w.clone());
    }
    let names = |cfg: &Config| -> Result<Vec<String>, config::ConfigError> {
        Ok(match &s.flags.profile {
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
            None => {
                return Err(Error::Other(
                    "no state directory for the daemon's locks".into(),
                ))
            }
        }
    }
    // Signals arrive on a channel, so the loop sleeps in `recv_timeout`:
    // woken by a signal or when the next job is due, never polling.
    let mut signals =
        signal_hook::iterator::Signals::new([SIGTERM, SIGINT, SIGHUP, SIGUSR1, SIGUSR2])
            .map_err(|e| io("handling signals", e))?;
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
    let exe = std::env::current_exe().map_err(|e| io("finding its own program", e))?;
    // Each profile's derived key, held between runs and handed to each
    // run, so that a scheduled run derives none (see `held_key`).
    crate::held_key::forbid_dumps();
    let mut keys: BTreeMap<String, (capsule_access::Access, HeldKey)> = BTreeMap::new();
    let hold = |keys: &mut BTreeMap<_, _>, cfg: &Config, name: &str| {
        if keys.contains_key(name) {
            return;
        }
        let Ok(p) = cfg.profile(name) else { return };
        if let Some(k) = key_for_profile(s, name, p) {
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
                    names(&c)?;
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
                // A backup asked for ("Back up now"): the loop below finds
                // the request.
                SIGUSR2 => {}
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
                    Job::Backup => status::load_state(name)
                        .last_success
                        .map(|r| r.started_unix),
                    // Never run: due now (a daily time: once it passes).
                    _ => status::load_state(name)
                        .maintenance
                        .get(job.name())
                        .copied(),
                };
                // "Back up now" (the page): due whatever the schedule and
                // the conditions say.
                let asked = job == Job::Backup && status::take_backup_request(name);
                let due = match next_due(schedule, last, now) {
                    _ if asked => None,
                    None => match (job, track.retry_at) {
                        (Job::Backup, Some(t)) if t > now => Some(t),
                        _ => None,
                    },
                    t => t,
                };
                // A due backup waits for its conditions (battery,
                // metered network), re-checked at every wake.
                let held_back = match (job, due, &p.conditions) {
                    (Job::Backup, None, Some(c)) if !asked => crate::conditions::waiting_for(c),
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
                    let view = status::DaemonView {
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
                        status::save_daemon_view(name, &view);
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
                                status::update(name, |st| {
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
    Ok(())
}

/// The key of profile `name` (`p`), derived as a run of it would open
/// its repository: `None` when no run has opened it yet on this machine
/// (no key hint) or its password cannot be read without asking.
fn key_for_profile(
    s: &Settings,
    name: &str,
    p: &crate::config::Profile,
) -> Option<(capsule_access::Access, HeldKey)> {
    let ps = s.for_profile(name, p);
    let loc = ps.location().ok()?;
    let access = ps.access(&loc).ok()?;
    let pw = zeroize::Zeroizing::new(crate::password::profile_password_now(&ps).ok()??);
    let key = HeldKey::derive(&access, &pw)?;
    Some((access, key))
}
