//! `capsule forget`, `unforget` and `prune`: snapshots taken away by ID or
//! by a retention policy, brought back until a prune, and the space of
//! data no snapshot uses given back.

use std::collections::BTreeSet;

use anyhow::Result;
use capsule_app::error::KeepsNothing;
use capsule_app::{Settings, UsageError};
use capsule_engine::forget;
use capsule_engine::retention::{self, GroupBy};
use capsule_engine::timefmt::now_unix;
use capsule_format::ObjectId;
use clap::Args;
use jiff::tz::TimeZone;

use crate::exit;
use crate::keep::{parse_group_by, KeepArgs};
use crate::output::{bytes, Output};
use crate::repo::open;

/// Arguments of `forget`.
#[derive(Args, Debug)]
#[command(after_help = "\
Forgetting moves each snapshot object aside (to forgotten/ in the repository) and \
touches no data: `capsule unforget ID` brings it back until a prune reclaims its space. \
Windows (--keep-within*) count back from now, in the local time zone (TZ). \
A policy applies to each host and set of paths on its own, and never removes every \
snapshot of one unless --allow-empty is given.")]
pub struct ForgetArgs {
    /// Snapshots to forget: IDs or unique prefixes, `latest`, `latest~N`,
    /// or a time ("2026-11-20 14:00": the newest snapshot at or before it).
    ids: Vec<String>,
    #[command(flatten)]
    keep: KeepArgs,
    /// Group snapshots by: host,paths (the default), host, paths or none.
    #[arg(long, value_name = "FIELDS", default_value = "host,paths", value_parser = parse_group_by)]
    group_by: GroupBy,
    #[command(flatten)]
    filter: crate::filter::FilterArgs,
    /// Say what would be forgotten, and by which rule each snapshot is kept; change nothing.
    #[arg(short = 'n', long)]
    dry_run: bool,
    /// Let a policy remove every snapshot of a group.
    #[arg(long)]
    allow_empty: bool,
    /// Prune afterwards (see `capsule prune --help`).
    #[arg(long)]
    pub(crate) prune: bool,
    /// With --prune: see `capsule prune --help`.
    #[arg(long, value_name = "PERCENT", default_value_t = 5.0,
          value_parser = parse_percent, requires = "prune")]
    max_unused: f64,
}

/// The local time zone, as the calendar buckets are counted in it.
fn local_zone() -> TimeZone {
    TimeZone::try_system().unwrap_or(TimeZone::UTC)
}

pub fn forget(settings: &Settings, out: &Output, a: ForgetArgs) -> Result<u8> {
    let mut policy = a.keep.policy();
    // No rule and no ID on the command line: the profile's retention.
    if a.ids.is_empty() && policy.is_empty() {
        if let Some(r) = settings.profile.as_ref().and_then(|p| p.retention.as_ref()) {
            policy = capsule_app::retention::profile_policy(r)?;
        }
    }
    if a.ids.is_empty() && policy.is_empty() {
        return Err(UsageError(
            "say what to forget: snapshot IDs, or a policy (--policy timemachine, --keep-last N, --keep-daily N, --keep-within 30d, ...)".into(),
        )
        .into());
    }
    let (repo, _) = open(settings, out)?;
    let (snaps, bad) = repo.list_snapshots()?;
    for e in &bad {
        out.warn(format!("{e}; it is left as it is"));
    }
    let snaps = a.filter.apply(snaps);

    // Every ID is resolved before anything is removed: one typo must not
    // leave half the list forgotten.
    let mut by_id: BTreeSet<ObjectId> = BTreeSet::new();
    // Named as everywhere else: an ID or prefix, `latest`, `latest~N`
    // (never one dated in the future: that is not the newest backup, and
    // forgetting it by that name would forget the wrong one), or a time
    // (the newest at or before it), among the --host's.
    for spec in &a.ids {
        by_id.insert(capsule_engine::Repository::pick_named(snaps.clone(), spec)?.0);
    }

    let tz = local_zone();
    let now = now_unix();
    let plans = if policy.is_empty() {
        Vec::new()
    } else {
        retention::plan(&snaps, now, &tz, &policy, a.group_by)
    };
    if !a.allow_empty {
        if let Some(p) = plans.iter().find(|p| p.keeps_nothing()) {
            return Err(KeepsNothing(format!(
                "the policy would remove all {} snapshots of {}{}; nothing was forgotten (widen the policy, or pass --allow-empty)",
                p.dated(),
                p.group,
                match p.snapshots.len() - p.dated() {
                    0 => String::new(),
                    n => format!(" but {n} dated in the future (a clock that ran ahead), which are kept and count for nothing"),
                }
            ))
            .into());
        }
    }
    let mut remove: BTreeSet<ObjectId> = by_id.clone();
    for p in &plans {
        remove.extend(p.snapshots.iter().filter(|v| !v.keep).map(|v| v.id));
    }
    // Oldest first, so a cut leaves the newest ones.
    let mut order: Vec<&(ObjectId, _)> =
        snaps.iter().filter(|(id, _)| remove.contains(id)).collect();
    order.sort_by_key(|(id, s)| (s.time_unix, s.time_nanos, *id));

    let time_of = |t: i64| -> String {
        jiff::Timestamp::from_second(t)
            .map(|ts| {
                ts.to_zoned(tz.clone())
                    .strftime("%Y-%m-%d %H:%M:%S %Z")
                    .to_string()
            })
            .unwrap_or_else(|_| t.to_string())
    };
    if !out.json {
        for p in &plans {
            let kept = p
                .snapshots
                .iter()
                .filter(|v| v.keep && !by_id.contains(&v.id))
                .count();
            out.result(format!(
                "{}: keeping {kept} of {}",
                p.group,
                p.snapshots.len()
            ));
            for v in &p.snapshots {
                let (word, why) = if by_id.contains(&v.id) {
                    ("remove", "named".to_string())
                } else if v.keep {
                    (
                        "keep",
                        v.reasons
                            .iter()
                            .map(|r| r.to_string())
                            .collect::<Vec<_>>()
                            .join(", "),
                    )
                } else {
                    ("remove", String::new())
                };
                out.result(
                    format!(
                        "  {word:<7}{}  {}  {why}",
                        v.id.short(),
                        time_of(v.time_unix)
                    )
                    .trim_end(),
                );
            }
        }
        if plans.is_empty() {
            for (id, s) in &order {
                out.result(format!(
                    "  remove {}  {}  named",
                    id.short(),
                    time_of(s.time_unix)
                ));
            }
        }
    }

    let mut done = Vec::new();
    if !a.dry_run {
        let ids: Vec<_> = order.iter().map(|(id, _)| *id).collect();
        forget::forget_all(&repo, &ids)?;
        done = ids.iter().map(|id| id.to_hex()).collect();
    }
    let summary = serde_json::json!({
            "dry_run": a.dry_run,
            "now": now,
            "groups": plans,
            "named": by_id.iter().map(|i| i.to_hex()).collect::<Vec<_>>(),
            "would_forget": if a.dry_run { order.iter().map(|(i, _)| i.to_hex()).collect() } else { Vec::new() },
            "forgotten": done,
    });
    if a.prune {
        if !out.json {
            out.say(format!("forgot {} snapshots; pruning", done.len()));
        }
        let p = PruneArgs {
            dry_run: a.dry_run,
            max_unused: a.max_unused,
            wait: false,
            extend_retention: false,
        };
        return run_prune(&std::sync::Arc::new(repo), out, &p, Some(summary));
    }
    if out.json {
        out.json(&summary);
    } else if a.dry_run {
        out.say(format!(
            "would forget {} snapshots (dry run: nothing changed)",
            order.len()
        ));
    } else {
        out.say(format!(
            "forgot {} snapshots; `capsule unforget ID` brings one back until the next prune",
            done.len()
        ));
    }
    Ok(exit::OK)
}

/// Arguments of `unforget`.
#[derive(Args, Debug)]
pub struct UnforgetArgs {
    /// Forgotten snapshots to bring back, by ID or unique prefix
    /// (`capsule snapshots --forgotten` lists them).
    #[arg(required = true)]
    ids: Vec<String>,
}

pub fn unforget(settings: &Settings, out: &Output, a: UnforgetArgs) -> Result<u8> {
    let (repo, _) = open(settings, out)?;
    let mut back = Vec::new();
    for spec in &a.ids {
        let (id, s) = forget::unforget(&repo, spec)?;
        out.say(format!("brought back {} of {}", id.short(), s.time));
        back.push(id.to_hex());
    }
    if out.json {
        out.json(&serde_json::json!({ "restored": back }));
    }
    Ok(exit::OK)
}

/// Arguments of `prune`.
#[derive(Args, Debug)]
#[command(after_help = "\
Prune needs no lock: backups may run during it, from any machine. Packs no snapshot \
uses are first marked, and deleted once every backup, restore and check that was running \
when they were marked has finished (or stopped renewing its session for an hour). When \
none was running, the same prune deletes them: one prune gives the space back. Otherwise \
it names the sessions it waits for, and --wait waits for them. Forgotten snapshots are \
removed for good by the prune that marks their data.")]
pub struct PruneArgs {
    /// Say what would be marked and deleted; change nothing.
    #[arg(short = 'n', long)]
    dry_run: bool,
    /// When packs wait for backups, restores or checks running elsewhere,
    /// wait for those to finish (at most until their sessions' leases run
    /// out, an hour after their last renewal), then delete the packs.
    #[arg(long)]
    wait: bool,
    /// Repack partly used packs until unused space is at most this share of
    /// used space (percent).
    #[arg(long, value_name = "PERCENT", default_value_t = 5.0,
          value_parser = parse_percent)]
    max_unused: f64,
    /// On a bucket with object lock: extend the retention of every object
    /// in use to a full period from now, not only of those with less than
    /// half of it left (after raising the bucket's retention period).
    #[arg(long)]
    extend_retention: bool,
}

fn parse_percent(s: &str) -> Result<f64, String> {
    let v: f64 = s
        .trim_end_matches('%')
        .parse()
        .map_err(|_| format!("{s:?} is not a percentage"))?;
    if !(0.0..=1000.0).contains(&v) {
        return Err(format!("{s:?}: give a percentage from 0 to 1000"));
    }
    Ok(v)
}

pub fn prune(settings: &Settings, out: &Output, a: PruneArgs) -> Result<u8> {
    let (repo, _) = open(settings, out)?;
    run_prune(&std::sync::Arc::new(repo), out, &a, None)
}

fn run_prune(
    repo: &std::sync::Arc<capsule_engine::Repository>,
    out: &Output,
    a: &PruneArgs,
    forgotten: Option<serde_json::Value>,
) -> Result<u8> {
    let dry_run = a.dry_run;
    let r = capsule_engine::prune::prune(
        repo,
        &capsule_engine::prune::PruneOptions {
            dry_run,
            max_unused: a.max_unused / 100.0,
            wait: a.wait,
            extend_all: a.extend_retention,
            ..Default::default()
        },
    )?;
    if out.json {
        let mut v = serde_json::json!({ "prune": r });
        v["destination"] = capsule_app::open::destination_json();
        if let Some(f) = forgotten {
            v["forget"] = f;
        }
        out.json(&v);
        return Ok(exit::OK);
    }
    let would = if dry_run { "would be " } else { "" };
    out.result(format!(
        "{} packs ({}) {would}deleted; {} {would}put back in use",
        r.packs_deleted,
        bytes(r.bytes_deleted),
        r.packs_restored
    ));
    if r.packs_marked > 0 {
        out.result(format!(
            "{} packs ({}) {would}marked for deletion (unused, or repacked){}",
            r.packs_marked,
            bytes(r.bytes_marked),
            if dry_run {
                ""
            } else if r.passes > 1 && r.marks_waiting == 0 {
                ", and deleted in the same run: no backup, restore or check was running"
            } else {
                ""
            }
        ));
    }
    if r.marks_waiting > 0 {
        out.result(format!(
            "{} packs wait for sessions that were running when they were marked; a prune after they end deletes them{}:",
            r.packs_waiting,
            if a.wait { "" } else { " (`capsule prune --wait` waits for them)" }
        ));
        for w in &r.waiting_for {
            out.result(format!(
                "  {} on {} (session {}), last renewed {}; its lease ends {}",
                w.kind,
                w.hostname,
                w.session.get(..8).unwrap_or(&w.session),
                capsule_engine::timefmt::rfc3339(w.heartbeat_unix),
                capsule_engine::timefmt::rfc3339(w.lease_ends_unix)
            ));
        }
    }
    for e in &r.index_files_gone {
        out.warn(format!(
            "{e}: the store lists this index file but could not give it; every blob the snapshots use is in the other index files, so the prune went on without it (`capsule check` names it, as a warning, until the store stops listing it; `capsule repair index` rebuilds what it held and supersedes it)"
        ));
    }
    for s in &r.sessions_revoked {
        out.warn(format!(
            "session {s} has not been renewed for over an hour: revoked (that backup, if it wakes, re-checks its data before it commits)"
        ));
    }
    if r.packs_repacked > r.packs_merged {
        out.result(format!(
            "{} partly used packs {would}repacked: {} {would}written anew, {} {would}freed when they are deleted",
            r.packs_repacked - r.packs_merged,
            bytes(r.bytes_repack_written),
            bytes(r.bytes_repack_freed)
        ));
    }
    if r.packs_merged > 0 {
        out.result(format!(
            "{} small packs {would}merged into full ones (fewer requests to read them)",
            r.packs_merged
        ));
    }
    if r.packs_partly_used > 0 {
        out.result(format!(
            "{} partly used packs keep {} no snapshot needs (within --max-unused)",
            r.packs_partly_used,
            bytes(r.bytes_unused_in_partly_used)
        ));
    }
    if r.forgotten_removed > 0 {
        out.result(format!(
            "{} forgotten snapshots {would}removed for good",
            r.forgotten_removed
        ));
    }
    if r.temporaries_removed > 0 {
        out.result(format!(
            "{} temporaries ({}) that interrupted writes left {would}removed",
            r.temporaries_removed,
            bytes(r.bytes_temporaries)
        ));
    }
    for w in r.object_lock.iter().flat_map(|l| &l.warnings) {
        out.warn(w);
    }
    if let Some(why) = r.object_lock.as_ref().and_then(|l| l.unknown.as_ref()) {
        out.warn(why);
    } else if let Some(l) = &r.object_lock {
        let ext = if dry_run { "would extend" } else { "extended" };
        out.result(format!(
            "object lock ({}, {} days): {ext} the retention of {} of {} objects; {} retired versions ({}) {would}deleted for good, {} still locked{}",
            l.mode,
            l.days,
            l.extended,
            l.objects,
            l.versions_deleted,
            bytes(l.bytes_deleted),
            l.versions_locked,
            l.next_unlock
                .map(|t| format!(" (the first unlocks {})", capsule_engine::timefmt::rfc3339(t)))
                .unwrap_or_default()
        ));
    }
    let d = capsule_app::open::destination_json();
    out.say(format!(
        "{}in {:.2}s, {} requests",
        if dry_run {
            "dry run: nothing changed, "
        } else {
            ""
        },
        r.duration_secs,
        d["requests"]
    ));
    Ok(exit::OK)
}
