//! `capsule status`: per profile, the last run, the last success and
//! whether backups have gone stale, from this machine's local state only,
//! so it answers at once and with the destination away.
//!
//! Every `backup --profile NAME` records its outcome in
//! `<state>/profiles/NAME.json` (success or failure). Staleness is judged
//! from the last success against the profile's `stale-after`, else twice
//! its backup interval (hourly by default): a profile that never succeeded
//! is stale too, so staleness shows even when nothing ever ran (no daemon,
//! a broken schedule).

use anyhow::Result;
use clap::Args;
use std::collections::BTreeMap;

use crate::exit;
use crate::output::Output;
use capsule_app::config::{self};
use capsule_app::status::{
    clock_problem, load_daemon_view, load_running, load_state, profile_row, refresh, stale_after,
    RunOutcome,
};
use capsule_app::Settings;

/// Arguments of `status`.
#[derive(Args, Debug)]
pub struct StatusArgs {
    /// Ask each profile's destination first: its size against its quota
    /// (the rest stays what this machine recorded). Bounded: a destination
    /// that does not answer within a minute is reported, not waited for.
    #[arg(long)]
    refresh: bool,
}

pub fn status(settings: &Settings, out: &Output, a: StatusArgs) -> Result<u8> {
    let Some((path, named)) = config::config_path(settings.flags.config.as_deref()) else {
        anyhow::bail!(config::ConfigError(
            "no configuration directory: give --config".into()
        ));
    };
    if !named && !path.exists() {
        return Err(config::ConfigError(format!(
            "no configuration file ({}): status reports on profiles; see `capsule config`",
            path.display()
        ))
        .into());
    }
    let cfg = config::Config::load(&path)?;
    let names: Vec<String> = match &settings.flags.profile {
        Some(n) => {
            cfg.profile(n)?;
            vec![n.clone()]
        }
        None => cfg.file.profiles.keys().cloned().collect(),
    };
    let refreshed: BTreeMap<&String, Option<String>> = if a.refresh {
        names.iter().map(|n| (n, refresh(&path, n))).collect()
    } else {
        BTreeMap::new()
    };
    let now = capsule_engine::timefmt::now_unix();
    let (mut any_stale, mut any_failing) = (false, false);
    let mut rows = Vec::new();
    for name in &names {
        let p = &cfg.file.profiles[name];
        let st = load_state(name);
        let refresh_error = refreshed.get(name).cloned().flatten();
        let (row, stale, failing) = profile_row(name, p, &st, refresh_error.clone(), now);
        let limit = stale_after(p);
        let age = st
            .last_success
            .as_ref()
            .map(|r| now.saturating_sub(r.started_unix));
        let daemon = load_daemon_view(name);
        let journal = row["journal"].clone();
        any_stale |= stale;
        any_failing |= failing;
        rows.push(row);
        if !out.json {
            let when = |r: &RunOutcome| capsule_engine::timefmt::rfc3339(r.started_unix);
            let failed = st.last_run.as_ref().filter(|r| r.result == "failed");
            let away = st.last_run.as_ref().filter(|r| r.result == "skipped");
            out.result(format!(
                "{name}: {}",
                match (&st.last_success, stale) {
                    _ if clock_problem(&st, now).is_some() =>
                        format!("CLOCK: {}", clock_problem(&st, now).unwrap_or_default()),
                    (None, _) => "STALE: never backed up".to_string(),
                    (Some(r), false) if away.is_some() => format!(
                        "WAITING for the destination{}; last backup {} ({} ago)",
                        away.and_then(|f| f.error.as_ref())
                            .map(|e| format!(" ({e})"))
                            .unwrap_or_default(),
                        when(r),
                        span(age.unwrap_or(0))
                    ),
                    (Some(r), false) if failed.is_some() => format!(
                        "FAILING: the last run failed{}; last backup {} ({} ago)",
                        failed
                            .and_then(|f| f.error.as_ref())
                            .map(|e| format!(" ({e})"))
                            .unwrap_or_default(),
                        when(r),
                        span(age.unwrap_or(0))
                    ),
                    (Some(r), true) => format!(
                        "STALE: last backup {} ({} ago; stale after {})",
                        when(r),
                        span(age.unwrap_or(0)),
                        span(limit as i64)
                    ),
                    (Some(r), false) => format!(
                        "ok: last backup {} ({} ago)",
                        when(r),
                        span(age.unwrap_or(0))
                    ),
                }
            ));
            match &daemon {
                Some(d) => out.result(format!(
                    "  next backup {}{}",
                    capsule_engine::timefmt::rfc3339(d.next_backup_unix.max(now)),
                    d.waiting_for
                        .as_ref()
                        .map(|w| match w.starts_with("waiting") {
                            true => format!(" ({w})"),
                            false => format!(" (waiting: {w})"),
                        })
                        .unwrap_or_default()
                )),
                None => out.result("  no daemon runs this profile (`capsule daemon`)"),
            }
            // A backup running now, whoever started it (daemon, page, shell).
            if let Some(r) = load_running(name) {
                out.result(format!(
                    "  backing up now (pid {}, for {}): {} files, {} so far{}",
                    r.pid,
                    span(now.saturating_sub(r.started_unix)),
                    r.files_done,
                    crate::output::bytes(r.bytes_done),
                    if r.totals_final {
                        format!(" of {} files", r.files_total)
                    } else {
                        String::new()
                    }
                ));
            }
            if let Some(r) = &st.last_run {
                out.result(format!(
                    "  last run {}: {}, {:.1} s, {} files, {} added{}",
                    when(r),
                    r.result,
                    r.duration_secs,
                    r.files,
                    crate::output::bytes(r.bytes_added),
                    r.error
                        .as_ref()
                        .map(|e| format!("; {e}"))
                        .unwrap_or_default()
                ));
            }
            if let Some(e) = &refresh_error {
                out.result(format!("  refresh: {e}"));
            }
            if let Some(line) = journal["summary"].as_str() {
                out.result(format!("  journal: {line}"));
            }
            out.result(match &st.repository {
                Some(r) => format!(
                    "  repository: {}{} (as of {})",
                    crate::output::bytes(r.stored),
                    match r.quota {
                        Some(q) => format!(
                            " of its {} quota ({:.0}%)",
                            crate::output::bytes(q),
                            r.stored as f64 * 100.0 / q.max(1) as f64
                        ),
                        None => ", no quota".into(),
                    },
                    capsule_engine::timefmt::rfc3339(r.as_of_unix)
                ),
                None => "  repository: size not measured yet (`capsule status --refresh`)".into(),
            });
            out.result(match &st.last_check {
                Some(c) => format!(
                    "  last check{} {}: {}{}",
                    match (&c.subset, c.read_data) {
                        (Some(s), _) if s != "all" => format!(" --read-data-subset {s}"),
                        (_, true) => " --read-data".into(),
                        _ => String::new(),
                    },
                    capsule_engine::timefmt::rfc3339(c.started_unix),
                    c.result,
                    c.error
                        .as_ref()
                        .map(|e| format!("; {e}"))
                        .unwrap_or_default()
                ),
                None => {
                    "  never checked (`capsule check`, or `check` in the profile's schedule)".into()
                }
            });
            if let Some(of) = st.verified_slices.first().map(|r| r.of) {
                out.result(format!(
                    "  data verified in slices of {of}: {}",
                    slices_line(&st.verified_slices, of)
                ));
            }
        }
    }
    out.json(&serde_json::json!({ "profiles": rows }));
    Ok(if any_stale {
        exit::STALE
    } else if any_failing {
        exit::FAILING
    } else {
        exit::OK
    })
}

/// "1 2026-11-02 (ok), 2 2026-11-09 (ok), 3-12 never": each slice's last
/// verification, date only.
fn slices_line(records: &[capsule_engine::verified::SliceRecord], of: u32) -> String {
    let mut parts = Vec::new();
    let mut never: Vec<u32> = Vec::new();
    for n in 1..=of {
        match records.iter().find(|r| r.of == of && r.slice == n) {
            Some(r) => parts.push(format!(
                "{n} {}{}",
                capsule_engine::timefmt::rfc3339(r.time_unix)
                    .get(..10)
                    .unwrap_or(""),
                if r.ok { "" } else { " (damage found)" }
            )),
            None => never.push(n),
        }
    }
    match never.as_slice() {
        [] => {}
        [one] => parts.push(format!("{one} never")),
        [first, .., last] if (last - first) as usize + 1 == never.len() => {
            parts.push(format!("{first}-{last} never"))
        }
        many => parts.push(format!(
            "{} never",
            many.iter()
                .map(u32::to_string)
                .collect::<Vec<_>>()
                .join(" ")
        )),
    }
    parts.join(", ")
}

/// "3h", "2d 4h", "12 min".
fn span(secs: i64) -> String {
    let s = secs.max(0);
    match s {
        0..=119 => format!("{s} s"),
        120..=7199 => format!("{} min", s / 60),
        7200..=172_799 => format!("{} h", s / 3600),
        _ => format!("{} d", s / 86_400),
    }
}
