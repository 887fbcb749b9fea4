//! `capsule copy`: snapshots of this repository into another (3-2-1: a
//! second copy somewhere else).

use std::collections::BTreeSet;
use std::sync::Arc;

use anyhow::Result;
use capsule_app::copy::Other;
use capsule_app::{Settings, UsageError};
use capsule_engine::retention::{self, GroupBy};
use capsule_engine::timefmt::now_unix;
use capsule_format::ObjectId;
use clap::Args;

use crate::exit;
use crate::keep::{parse_group_by, KeepArgs};
use crate::output::{bytes, Output};
use crate::repo::{open, reading_session};

/// Arguments of `copy`.
#[derive(Args, Debug)]
#[command(after_help = "\
Copies into the repository --to names (it must exist: `capsule -r DEST init \
--copy-chunker-params-from SRC` makes one that cuts files as this one does, so \
blobs copy as they are and dedup with its own backups; any other repository \
works too, with every file read back and cut again). Only blobs the destination \
lacks are sent, sealed under its key. A snapshot already there (same time, host \
and paths) is skipped, so running it again, or after it was cut short, sends \
only what is missing. The destination's password: CAPSULE_TO_PASSWORD or \
CAPSULE_TO_PASSWORD_FILE, else this repository's.")]
pub struct CopyArgs {
    /// Snapshots to copy: IDs or unique prefixes, `latest`, `latest~N`, or a
    /// time (the newest at or before it). Default: every snapshot, or those
    /// the --keep-* policy keeps.
    ids: Vec<String>,
    /// The repository to copy into (default: the profile's `copy-to`).
    #[arg(long, value_name = "REPO", env = "CAPSULE_COPY_TO")]
    to: Option<String>,
    #[command(flatten)]
    filter: crate::filter::FilterArgs,
    #[command(flatten)]
    keep: KeepArgs,
    /// With a policy, group snapshots by: host,paths (the default), host,
    /// paths or none.
    #[arg(long, value_name = "FIELDS", default_value = "host,paths", value_parser = parse_group_by)]
    group_by: GroupBy,
    /// Say what would be copied; copy nothing.
    #[arg(short = 'n', long)]
    dry_run: bool,
}

pub fn copy(settings: &Settings, out: &Output, a: CopyArgs) -> Result<u8> {
    let to =
        a.to.clone()
            .or_else(|| settings.profile.as_ref().and_then(|p| p.copy_to.clone()))
            .ok_or_else(|| {
                UsageError(
                "say where to copy to: --to REPO (or CAPSULE_COPY_TO, or copy-to in the profile)"
                    .into(),
            )
            })?;
    let (src, loc) = open(settings, out)?;
    let src = Arc::new(src);
    let _session = reading_session(
        &src,
        out,
        "copy",
        "a prune meanwhile may delete data this copy still reads",
    );
    let (snaps, bad) = src.list_snapshots()?;
    for e in &bad {
        out.warn(format!("{e}; it is not copied (exit 3)"));
    }
    let snaps = a.filter.apply(snaps);
    let mut picked: BTreeSet<ObjectId> = BTreeSet::new();
    for spec in &a.ids {
        picked.insert(capsule_engine::Repository::pick_named(snaps.clone(), spec)?.0);
    }
    let policy = a.keep.policy();
    if !policy.is_empty() {
        let tz = jiff::tz::TimeZone::try_system().unwrap_or(jiff::tz::TimeZone::UTC);
        for p in retention::plan(&snaps, now_unix(), &tz, &policy, a.group_by) {
            picked.extend(p.snapshots.iter().filter(|v| v.keep).map(|v| v.id));
        }
    }
    let all = a.ids.is_empty() && policy.is_empty();
    let mut chosen: Vec<_> = snaps
        .into_iter()
        .filter(|(id, _)| all || picked.contains(id))
        .collect();
    // Oldest first: a copy cut short has the older ones.
    chosen.sort_by_key(|(id, s)| (s.time_unix, s.time_nanos, *id));

    let pw = capsule_app::copy::password(settings, Other::To)?;
    let opened = capsule_app::copy::open(settings, &to, &pw)?;
    // Packs sent but not yet indexed, for a run cut short; apart from the
    // backups' own journal for that repository.
    let journal = opened.cache_dir().map(|d| d.join("unindexed-packs-copy"));
    let dst = Arc::new(opened.repo);
    if dst.config().id == src.config().id {
        return Err(UsageError(format!(
            "{to} is this repository ({}); copy into another one",
            loc.display()
        ))
        .into());
    }
    if !capsule_engine::copy::shares_chunks(&src, &dst) {
        let total: u64 = chosen.iter().map(|(_, s)| s.summary.bytes).sum();
        out.warn(format!(
            "{to} cuts files differently from {} (it was not made with `init --copy-chunker-params-from` this repository): copy reads every file back and cuts it again, up to {} of file data to read and decode here, and the copies dedup only against each other and what the destination cut the same way",
            loc.display(),
            bytes(total)
        ));
    }
    if a.dry_run {
        for (id, s) in &chosen {
            out.result(format!(
                "would copy {}  {}  {}",
                id.short(),
                s.time,
                s.hostname
            ));
        }
        out.json(&serde_json::json!({
            "dry_run": true,
            "would_copy": chosen.iter().map(|(id, _)| id.to_hex()).collect::<Vec<_>>(),
        }));
        return Ok(exit::OK);
    }
    let progress = std::sync::Arc::new(capsule_engine::progress::Progress::default());
    let bar = out.progress(&progress, "copy");
    let report = capsule_engine::copy::copy(&src, &dst, &chosen, journal.as_deref(), &progress);
    drop(bar);
    let report = report?;
    if out.json {
        let mut v = serde_json::to_value(&report)?;
        v["to"] = serde_json::json!(to);
        // The counters are the first stack's: this repository's.
        v["source"] = capsule_app::open::destination_json();
        out.json(&v);
    }
    out.result(format!(
        "copied {} of {} snapshots to {to} ({} already there){}",
        report.copied.len(),
        chosen.len(),
        report.already_there,
        if report.rechunked { ", re-chunked" } else { "" }
    ));
    out.say(format!(
        "  sent {} blobs ({} stored), {} already there; read {} in {:.2}s",
        report.blobs_sent,
        bytes(report.bytes_stored),
        report.blobs_present,
        bytes(report.bytes_read),
        report.duration_secs
    ));
    // A snapshot that could not be read was not copied: not everything
    // asked for is in the destination.
    Ok(if bad.is_empty() {
        exit::OK
    } else {
        exit::INCOMPLETE
    })
}
