//! The daemon's jobs: when each is due, starting one as a child process
//! (with the held key handed over), and what its end means: the log line,
//! the hooks, the retries and their backoff, staleness.

use std::path::Path;
use std::time::Instant;

use crate::config::{Config, Profile, Schedule};
use crate::held_key::{HeldKey, HELD_KEY};
use crate::status;

/// A job of a profile.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum Job {
    Backup,
    Forget,
    Prune,
    Check,
    CheckReadData,
    /// `copy` to the profile's `copy-to`.
    Copy,
}

impl Job {
    fn args(self, p: &Profile) -> Vec<String> {
        let words: &[&str] = match self {
            Job::Backup => &["backup"],
            Job::Forget => &["forget"],
            // Its own process, beside the backups (which never wait for
            // it), so it may wait for the sessions its marks wait for (the
            // backups running elsewhere as it marked, seconds long) and
            // give the space back in the same run, not a schedule later.
            Job::Prune => &["prune", "--wait"],
            Job::Check => &["check"],
            Job::CheckReadData => {
                // A slice or a share when the schedule names one.
                if let Some(sub) = p
                    .schedule
                    .as_ref()
                    .and_then(|s| s.check_read_data_subset.clone())
                {
                    return vec!["check".into(), "--read-data-subset".into(), sub];
                }
                &["check", "--read-data"]
            }
            Job::Copy => &["copy"],
        };
        words.iter().map(|w| w.to_string()).collect()
    }
    pub(super) fn name(self) -> &'static str {
        match self {
            Job::Backup => "backup",
            Job::Forget => "forget",
            Job::Prune => "prune",
            Job::Check => "check",
            Job::CheckReadData => "check --read-data",
            Job::Copy => "copy",
        }
    }
    pub(super) fn schedule(self, p: &Profile) -> Option<Schedule> {
        let s = p.schedule.clone().unwrap_or_default();
        let text = match self {
            // Backups are hourly unless the profile says otherwise.
            Job::Backup => Some(s.backup.unwrap_or_else(|| "hourly".into())),
            Job::Forget => s.forget,
            Job::Prune => s.prune,
            Job::Check => s.check,
            Job::CheckReadData => s.check_read_data,
            Job::Copy => s.copy.filter(|_| p.copy_to.is_some()),
        }?;
        Schedule::parse(&text).ok().filter(|s| *s != Schedule::Off)
    }
}

pub(super) const JOBS: [Job; 6] = [
    Job::Backup,
    Job::Forget,
    Job::Prune,
    Job::Check,
    Job::CheckReadData,
    Job::Copy,
];

/// One line per event, with a syslog priority prefix the systemd journal
/// reads (launchd keeps the line as it is).
pub(super) fn log(level: &str, profile: &str, event: &str) {
    let prio = match level {
        "error" => 3,
        "warning" => 4,
        _ => 6,
    };
    eprintln!("<{prio}>{level}: profile {profile}: {event}");
}

/// When `job` on `schedule` is next due, given the start of its last
/// success (or its last attempt, for maintenance jobs): `None` = due now.
pub(super) fn next_due(schedule: Schedule, last: Option<i64>, now: i64) -> Option<i64> {
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
pub(super) struct Track {
    /// The backup is "skipped, retrying" until this time.
    pub(super) retry_at: Option<i64>,
    /// The current backoff, seconds.
    pub(super) backoff: i64,
    /// The last backup found the destination away.
    pub(super) away: bool,
    /// Why the backup waits for `retry_at`.
    pub(super) retry_why: &'static str,
    /// What `status` was last told (written only when it changes).
    pub(super) view: Option<status::DaemonView>,
    /// The condition a due backup waits for, if any.
    pub(super) held_back: Option<String>,
}

pub(super) struct Running {
    pub(super) child: std::process::Child,
    pub(super) profile: String,
    pub(super) job: Job,
    pub(super) since: Instant,
}

/// Starts `job` of profile `name` as a child process, after its `before`
/// hook (a failing hook skips the job).
pub(super) fn start(
    exe: &Path,
    config: &Path,
    name: &str,
    job: Job,
    p: &Profile,
    key: Option<&HeldKey>,
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
        .args(job.args(p))
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null());
    if key.is_some() {
        c.env(HELD_KEY, "stdin").stdin(std::process::Stdio::piped());
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
pub(super) fn finished(cfg: &Config, r: &Running, code: Option<i32>, track: &mut Track) {
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
                // The run recorded itself as skipped (status::outcome).
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
pub(super) fn hook(command: &str, profile: &str, which: &str, result: Option<&str>) -> bool {
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
pub(super) fn staleness(name: &str, p: &Profile, now: i64) {
    let st = status::load_state(name);
    let last = st.last_success.as_ref().map(|r| r.started_unix);
    if !status::is_stale(p, last, now) {
        return;
    }
    let key = last.unwrap_or(0);
    if st.stale_notified == Some(key) {
        return;
    }
    status::update(name, |st| st.stale_notified = Some(key));
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

    #[test]
    fn a_scheduled_read_takes_the_profiles_subset() {
        let mut p = Profile::default();
        assert_eq!(Job::CheckReadData.args(&p), ["check", "--read-data"]);
        let toml = "check-read-data = \"weekly\"\ncheck-read-data-subset = \"next/12\"\n";
        p.schedule = Some(toml::from_str(toml).unwrap_or_else(|e| panic!("{e}")));
        assert_eq!(
            Job::CheckReadData.args(&p),
            ["check", "--read-data-subset", "next/12"]
        );
        assert_eq!(Job::Check.args(&p), ["check"]);
    }

    #[test]
    fn the_scheduled_prune_waits_for_the_backups_beside_it() {
        assert_eq!(Job::Prune.args(&Profile::default()), ["prune", "--wait"]);
    }
}
