//! `capsule check` and `capsule repair`: finding damage, and mending it.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Result;
use capsule_app::Settings;
use capsule_engine::progress::Progress;
use clap::{Args, Subcommand};

use crate::exit;
use crate::output::{bytes, Output};
use crate::repo::{open_uncached, reading_session};

/// Arguments of `check`.
#[derive(Args, Debug)]
pub struct CheckArgs {
    /// Also read and authenticate every byte of every pack.
    #[arg(long)]
    pub(crate) read_data: bool,
    /// Read and authenticate only part of the packs: N/M (slice N of M,
    /// fixed, so M runs read everything once), P% (at random) or a size
    /// (2G: random packs up to it).
    #[arg(long, value_name = "N/M|P%|SIZE", value_parser = capsule_engine::check::Subset::parse, conflicts_with = "read_data")]
    pub(crate) read_data_subset: Option<capsule_engine::check::Subset>,
}

/// `capsule check`, recorded for `status` when a profile is in use.
pub fn run(settings: &Settings, out: &Output, a: CheckArgs) -> Result<u8> {
    let started = capsule_engine::timefmt::now_unix();
    let read_data = a.read_data || a.read_data_subset.is_some();
    let mut subset = None;
    let r = check(settings, out, a, &mut subset);
    if let Some(name) = settings.profile_name() {
        let (subset, slices) = subset.unwrap_or_default();
        capsule_app::status::record_check(
            name,
            capsule_app::status::CheckOutcome {
                started_unix: started,
                read_data,
                subset,
                slices,
                result: match &r {
                    Ok(0) => "ok",
                    Ok(_) => "damaged",
                    Err(_) => "failed",
                }
                .into(),
                error: r
                    .as_ref()
                    .err()
                    .map(|e| format!("{e:#}").lines().next().unwrap_or("").to_string()),
            },
        );
    }
    r
}

/// Which packs a check read, and the slices' records, for `status`.
type SubsetSeen = Option<(Option<String>, Vec<capsule_engine::verified::SliceRecord>)>;

fn check(settings: &Settings, out: &Output, a: CheckArgs, seen: &mut SubsetSeen) -> Result<u8> {
    let opened = open_uncached(settings, out)?;
    let cache_dir = opened.cache_dir().map(PathBuf::from);
    let repo = Arc::new(opened.repo);
    // Held like a backup's, so that a prune running meanwhile does not
    // delete packs this check is about to read. A destination this user may
    // only read gets none, and a prune could then race the check.
    let session = reading_session(
        &repo,
        out,
        "check",
        "a prune running meanwhile may make this check report packs it deleted",
    );
    let progress = Arc::new(Progress::default());
    let read = match (a.read_data, a.read_data_subset) {
        (_, Some(s)) => Some(s),
        (true, None) => Some(capsule_engine::check::Subset::All),
        (false, None) => None,
    };
    let bar = if read.is_some() {
        out.progress(&progress, "check")
    } else {
        None
    };
    let r = capsule_engine::check::check_subset(&repo, read, &progress);
    drop(bar);
    drop(session);
    let r = r?;
    *seen = Some((r.subset.clone(), r.slices.clone()));
    if let Some(e) = &r.slice_not_recorded {
        out.warn(format!(
            "this slice's verification could not be recorded in the repository ({e}): the next `next/M` check reads it again"
        ));
    }
    // A locked bucket whose settings would let history go sooner.
    let lock_warnings = capsule_engine::locked::settings_warnings(&repo);
    for w in &lock_warnings {
        out.warn(w);
    }
    // The next backup must not reuse what this check found lost.
    if let Some(dir) = cache_dir {
        if let Err(e) = capsule_access::open::write_damaged_packs(&dir, &r.damaged_packs) {
            out.warn(format!(
                "cannot record the damaged packs in {}: {e}; run the next backup with --force so it does not reuse them",
                dir.display()
            ));
        }
    }
    out.json(&serde_json::json!({ "ok": r.ok(), "report": r, "lock_warnings": lock_warnings, "destination": capsule_app::open::destination_json() }));
    out.say(format!(
        "checked {} snapshots, {} trees, {} packs{}",
        r.snapshots,
        r.trees,
        r.packs,
        if read.is_some() {
            format!(
                ", read {} blobs ({}) in {} packs{}{}",
                r.blobs_read,
                bytes(r.bytes_read),
                r.packs_read,
                match &r.read {
                    Some(t) if t.secs > 0.0 => format!(
                        " in {:.1} s, {}/s ({} at once; limited by the {})",
                        t.secs,
                        bytes(t.bytes_per_sec as u64),
                        t.workers,
                        if t.bound == "cpu" {
                            "cores"
                        } else {
                            "destination"
                        }
                    ),
                    _ => String::new(),
                },
                match &r.subset {
                    Some(s) if s != "all" => {
                        format!(
                            " (subset {s}; {} packs not read this time)",
                            r.packs_not_read
                        )
                    }
                    _ => String::new(),
                }
            )
        } else {
            String::new()
        }
    ));
    let index_damaged = r
        .problems
        .iter()
        .any(|p| p.object.starts_with("index/") || p.problem.contains("not in any index"));
    for name in &r.index_files_gone {
        out.warn(format!(
            "{name}: the store lists this index file but every read finds it gone (a distributed store can list an object whose upload or delete a node's outage cut){}; `capsule repair index` indexes its packs again and supersedes it",
            if index_damaged {
                ""
            } else {
                ": every blob the snapshots use is in the other index files, so nothing is lost"
            }
        ));
    }
    if !r.unindexed_packs.is_empty() && !index_damaged && r.index_files_gone.is_empty() {
        out.say(format!(
            "{} packs are not indexed (left by an interrupted backup; a later prune reclaims them)",
            r.unindexed_packs.len()
        ));
    }
    if let Some(last) = r.slices.iter().max_by_key(|s| s.time_unix) {
        let of = last.of;
        let done = r.slices.len();
        let oldest = r.slices.iter().map(|s| s.time_unix).min().unwrap_or(0);
        out.say(format!(
            "slice {}/{of} verified; {done} of {of} slices verified so far{}",
            last.slice,
            if done as u32 == of {
                format!(
                    ", the oldest on {}",
                    capsule_engine::timefmt::rfc3339(oldest)
                )
            } else {
                String::new()
            }
        ));
    }
    if r.listing_lagged > 0 {
        out.say(format!(
            "{} packs were missing from the destination's listing but there when asked for by name: its listings lag behind its writes (not damage)",
            r.listing_lagged
        ));
    }
    if r.ok() {
        out.say("no errors found");
        return Ok(exit::OK);
    }
    if !out.json {
        let unused = |p: &capsule_engine::check::Problem| {
            p.affected.is_empty()
                && (p.object.starts_with("data/") || p.object.starts_with("tree/"))
        };
        for p in &r.problems {
            eprintln!("damaged: {}: {}", p.object, p.problem);
            if unused(p) {
                eprintln!(
                    "  no snapshot uses it (what used it was forgotten, or dropped by `repair snapshots`); `capsule prune` takes it out of the index"
                );
            }
            for f in p.affected.iter().take(20) {
                eprintln!("  affects {f}");
            }
            if p.affected.len() > 20 {
                eprintln!("  ... and {} more", p.affected.len() - 20);
            }
        }
        if r.problems.iter().all(unused) {
            eprintln!(
                "capsule: check found {} missing or damaged packs that no snapshot uses: every snapshot restores in full; run `capsule prune` to take them out of the index",
                r.problems.len()
            );
        } else {
            eprintln!(
                "capsule: check found {} damaged objects; files not listed above still restore",
                r.problems.len()
            );
        }
        if index_damaged && !r.unindexed_packs.is_empty() {
            eprintln!(
                "  hint: {} packs are on the destination but in no index; `capsule repair index` rebuilds the index from them",
                r.unindexed_packs.len()
            );
        } else if index_damaged {
            eprintln!(
                "  hint: `capsule repair index` rebuilds the index from the packs' own headers"
            );
        }
        if !r.damaged_packs.is_empty() {
            eprintln!(
                "  the next backup stores the lost data again where the files still exist (recorded in the cache; use --force on other machines)"
            );
        }
    }
    Ok(exit::DAMAGED)
}

/// `repair` subcommands.
#[derive(Subcommand, Debug)]
pub enum RepairCommand {
    /// Rebuild the index from the packs' own headers: indexes every pack no
    /// intact index file lists, then removes the damaged index files.
    Index {
        /// Read and report, but write and delete nothing.
        #[arg(long)]
        dry_run: bool,
    },
    /// Rewrite snapshots that refer to missing data: drop the files (and
    /// directories) that are lost, name them, keep everything else. The
    /// damaged snapshots are set aside (`capsule unforget` brings one back).
    Snapshots {
        /// Report what would be dropped; write nothing.
        #[arg(long)]
        dry_run: bool,
    },
    /// Write the repository as it was at `--as-of WHEN` back as its current
    /// state, on a versioned S3 bucket: every object deleted or overwritten
    /// since (by ransomware holding the backup credentials, say) is written
    /// again from its old version; objects made later stay. Needs
    /// credentials that may write.
    History {
        /// Count what would be written back; write nothing.
        #[arg(long)]
        dry_run: bool,
    },
    /// Remove the source snapshots (`source-snapshot`) that interrupted
    /// backups left on the file systems holding these paths (default: the
    /// profile's sources). Only capsule's own, of runs that are gone.
    SourceSnapshots {
        /// Sources whose file systems to look at.
        paths: Vec<std::path::PathBuf>,
    },
}

pub fn repair(settings: &Settings, out: &Output, r: RepairCommand) -> Result<u8> {
    let dry_run = match r {
        RepairCommand::Index { dry_run } => dry_run,
        RepairCommand::Snapshots { dry_run } => return repair_snapshots(settings, out, dry_run),
        RepairCommand::History { dry_run } => return repair_history(settings, out, dry_run),
        RepairCommand::SourceSnapshots { paths } => {
            return repair_source_snapshots(settings, out, paths)
        }
    };
    // The destination's truth, not the cache's.
    let repo = open_uncached(settings, out)?.repo;
    let rep = capsule_engine::repair::repair_index(&repo, dry_run)?;
    if out.json {
        let mut v = serde_json::to_value(&rep)?;
        v["dry_run"] = serde_json::json!(dry_run);
        v["destination"] = capsule_app::open::destination_json();
        out.json(&v);
    }
    out.say(format!(
        "{} packs on storage, {} in no intact index file; {}indexed {} of them ({} blobs)",
        rep.packs,
        rep.unindexed,
        if dry_run { "would have " } else { "" },
        rep.reindexed,
        rep.blobs
    ));
    for f in &rep.removed_index_files {
        out.say(format!(
            "{} damaged index file {f}",
            if dry_run { "would remove" } else { "removed" }
        ));
    }
    for (p, why) in &rep.unreadable_packs {
        out.warn(format!("{p}: not indexed: {why}"));
    }
    if rep.unreadable_packs.is_empty() {
        Ok(exit::OK)
    } else {
        eprintln!(
            "capsule: {} packs could not be read; their blobs stay unavailable (`capsule check` names the files affected)",
            rep.unreadable_packs.len()
        );
        Ok(exit::DAMAGED)
    }
}

/// Needs no repository: the snapshots are on the sources' file systems.
fn repair_source_snapshots(
    settings: &Settings,
    out: &Output,
    mut paths: Vec<std::path::PathBuf>,
) -> Result<u8> {
    let profile = settings.profile.clone().unwrap_or_default();
    if paths.is_empty() {
        paths = profile.sources.clone();
    }
    if paths.is_empty() {
        return Err(capsule_app::UsageError(
            "name the sources whose file systems to look at, or --profile NAME with sources".into(),
        )
        .into());
    }
    let cleaned = capsule_engine::backup::clean_source_snapshots(
        &paths,
        profile.one_file_system.unwrap_or(false),
    );
    if out.json {
        out.json(&serde_json::json!({ "notes": cleaned.notes, "left": cleaned.left }));
    }
    if cleaned.notes.is_empty() {
        out.result("no source snapshot left behind");
    }
    for n in &cleaned.notes {
        out.result(n);
    }
    // Something is left (or could not be looked at): not a success.
    Ok(if cleaned.left > 0 {
        exit::INCOMPLETE
    } else {
        exit::OK
    })
}

fn repair_history(settings: &Settings, out: &Output, dry_run: bool) -> Result<u8> {
    let loc = settings.location()?;
    let access = settings.access(&loc)?;
    let Some(at) = access.connect.as_of else {
        return Err(capsule_app::UsageError(
            "repair history writes back the repository as it was at a moment: name it with --as-of WHEN (the moment before the damage)".into(),
        )
        .into());
    };
    let r = capsule_app::history::restore_as_of(&access, at, dry_run)?;
    if out.json {
        let mut v = serde_json::to_value(&r)?;
        v["dry_run"] = serde_json::json!(dry_run);
        out.json(&v);
    }
    let would = if dry_run { "would write" } else { "wrote" };
    out.result(format!(
        "{} objects at {}: {} unchanged, {would} back {} ({}) deleted or overwritten since; {} newer objects left as they are",
        r.objects,
        capsule_engine::timefmt::rfc3339(r.as_of),
        r.unchanged,
        r.written,
        bytes(r.bytes),
        r.newer
    ));
    if !dry_run && r.written > 0 {
        out.say("run `capsule check` to see that every snapshot reads again");
    }
    Ok(exit::OK)
}

fn repair_snapshots(settings: &Settings, out: &Output, dry_run: bool) -> Result<u8> {
    let repo = open_uncached(settings, out)?.repo;
    let rep = capsule_engine::repair::repair_snapshots(&Arc::new(repo), dry_run)?;
    if out.json {
        let mut v = serde_json::to_value(&rep)?;
        v["dry_run"] = serde_json::json!(dry_run);
        v["destination"] = capsule_app::open::destination_json();
        out.json(&v);
        return Ok(exit::OK);
    }
    for r in &rep.repaired {
        out.result(format!(
            "snapshot {}: {} lost entr{}{}",
            &r.snapshot[..8],
            r.dropped.len(),
            if r.dropped.len() == 1 { "y" } else { "ies" },
            match (&r.replaced_by, dry_run) {
                (_, true) => " (dry run)".to_string(),
                (Some(n), false) => format!(", replaced by {} (tagged repaired)", &n[..8]),
                (None, false) => ", nothing left to keep: set aside".to_string(),
            }
        ));
        for d in &r.dropped {
            out.result(format!("  dropped {d}"));
        }
    }
    out.say(format!(
        "{} snapshots read, {} {}",
        rep.snapshots,
        rep.repaired.len(),
        if dry_run {
            "refer to missing data (dry run: nothing changed)"
        } else {
            "repaired; the originals are set aside until the next prune (`capsule snapshots --forgotten`), which takes the lost packs out of the index"
        }
    ));
    Ok(exit::OK)
}
