//! `capsule snapshots` and `capsule ls`: what the repository holds.

use anyhow::Result;
use capsule_app::Settings;
use capsule_engine::{treewalk, EngineError};
use capsule_format::tree::NodeKind;
use capsule_format::BlobId;
use clap::Args;

use crate::exit;
use crate::output::{bytes, Output};
use crate::repo::{open, resolve, root_of};

/// Arguments of `snapshots`.
#[derive(Args, Debug)]
pub struct SnapshotsArgs {
    /// List forgotten snapshots instead: those `capsule unforget` can still
    /// bring back.
    #[arg(long)]
    forgotten: bool,
    #[command(flatten)]
    filter: crate::filter::FilterArgs,
}

pub fn snapshots(settings: &Settings, out: &Output, a: SnapshotsArgs) -> Result<u8> {
    let (repo, _) = open(settings, out)?;
    let (snaps, bad) = if a.forgotten {
        capsule_engine::forget::list_forgotten(&repo)?
    } else {
        repo.list_snapshots()?
    };
    let snaps = a.filter.apply(snaps);
    for e in &bad {
        out.warn(e.to_string());
    }
    let now = capsule_engine::timefmt::now_unix();
    let future = |s: &capsule_format::snapshot::Snapshot| {
        capsule_engine::timefmt::is_future(s.time_unix, now)
    };
    if out.json {
        let v: Vec<_> = snaps
            .iter()
            .map(|(id, s)| {
                serde_json::json!({ "id": id.to_hex(), "snapshot": s, "future": future(s) })
            })
            .collect();
        out.json(&v);
        return Ok(exit::OK);
    }
    out.result(format!(
        "{:<10} {:<20} {:<16} {:>8} {:>10}  paths",
        "id", "time", "host", "files", "size"
    ));
    for (id, s) in &snaps {
        out.result(format!(
            "{:<10} {:<20} {:<16} {:>8} {:>10}  {}{}",
            id.short(),
            s.time.replace('T', " ").trim_end_matches('Z'),
            s.hostname,
            s.summary.files,
            bytes(s.summary.bytes),
            s.paths.join(" "),
            [
                (s.incomplete, "  (incomplete)"),
                (future(s), "  (dated in the future: never \"latest\")"),
            ]
            .iter()
            .filter(|(on, _)| *on)
            .map(|(_, t)| *t)
            .collect::<String>()
                + &if s.tags.is_empty() {
                    String::new()
                } else {
                    format!("  [{}]", s.tags.join(","))
                }
        ));
    }
    out.say(format!(
        "{} {}snapshots",
        snaps.len(),
        if a.forgotten { "forgotten " } else { "" }
    ));
    Ok(exit::OK)
}

/// Arguments of `ls`.
#[derive(Args, Debug)]
pub struct LsArgs {
    /// Snapshot: an ID or its prefix, "latest", "latest~N" (the Nth before
    /// it), or a time ("2026-11-20 14:00", local; a date alone is the end
    /// of that day): the newest snapshot at or before it.
    snapshot: String,
    /// Only list below this path of the snapshot.
    path: Option<String>,
    /// Show mode, size and modification time.
    #[arg(short, long)]
    long: bool,
}

pub fn ls(settings: &Settings, out: &Output, a: LsArgs) -> Result<u8> {
    let (repo, _) = open(settings, out)?;
    let (_, snap) = resolve(&repo, out, &a.snapshot)?;
    let (mut index, _) = repo.load_index()?;
    capsule_engine::prune::add_marked_packs(&repo, &mut index)?;
    let mut root = root_of(&snap)?;
    let base = treewalk::snapshot_path(a.path.as_deref().unwrap_or("/"));
    let mut items = Vec::new();
    if base != std::path::Path::new("/") {
        let n = treewalk::find(&repo, &index, &root, &base)?
            .ok_or_else(|| EngineError::PathNotFound(base.display().to_string()))?;
        let is_dir = n.kind() == NodeKind::Dir;
        items.push((base.clone(), n.clone()));
        match (is_dir, n.subtree) {
            (true, Some(sub)) => root = sub,
            _ => root = BlobId::default(),
        }
    }
    let mut print =
        |p: &std::path::Path, n: &capsule_format::tree::Node| -> capsule_engine::Result<()> {
            items.push((p.to_path_buf(), n.clone()));
            Ok(())
        };
    if root != BlobId::default() {
        let mut budget = treewalk::Budget::new(treewalk::entry_budget(&snap));
        treewalk::walk(&repo, &index, &root, &base, &mut budget, &mut print)?;
    }
    if out.json {
        let v: Vec<_> = items
            .iter()
            .map(|(p, n)| {
                serde_json::json!({
                    "path": p.to_string_lossy(),
                    "type": n.kind().as_str(),
                    "size": n.size,
                    "mode": format!("{:o}", n.mode),
                    "uid": n.uid, "gid": n.gid,
                    "mtime": n.mtime.secs, "mtime_nsec": n.mtime.nanos,
                })
            })
            .collect();
        out.json(&v);
    } else {
        for (p, n) in &items {
            if a.long {
                out.result(format!(
                    "{:<8} {:>5o} {:>6} {:>6} {:>12} {}  {}",
                    n.kind().as_str(),
                    n.mode,
                    n.uid,
                    n.gid,
                    n.size,
                    capsule_engine::timefmt::rfc3339(n.mtime.secs),
                    p.to_string_lossy()
                ));
            } else {
                out.result(p.to_string_lossy());
            }
        }
    }
    Ok(exit::OK)
}

/// Arguments of `tag`.
#[derive(Args, Debug)]
#[command(after_help = "\
Each snapshot changed is written anew with the same tree, time, host and paths, naming \
the one it replaces (\"original\"); the old object moves to forgotten/ (`capsule unforget` \
brings it back until a prune). No data is read or written.")]
pub struct TagArgs {
    /// Snapshots: IDs or prefixes, `latest`, `latest~N`, or a time. None:
    /// every snapshot the filters pass.
    ids: Vec<String>,
    #[command(flatten)]
    filter: crate::filter::FilterArgs,
    /// Add this tag (repeatable, or "a,b").
    #[arg(long, value_name = "TAG")]
    add: Vec<String>,
    /// Remove this tag (repeatable, or "a,b").
    #[arg(long, value_name = "TAG")]
    remove: Vec<String>,
    /// Replace all tags with these (repeatable, or "a,b"; "" for none).
    #[arg(long, value_name = "TAG", conflicts_with_all = ["add", "remove"])]
    set: Vec<String>,
    /// Say what would change; change nothing.
    #[arg(short = 'n', long)]
    dry_run: bool,
}

fn tag_list(v: &[String]) -> Vec<String> {
    v.iter()
        .flat_map(|t| t.split(','))
        .map(str::trim)
        .filter(|t| !t.is_empty())
        .map(String::from)
        .collect()
}

pub fn tag(settings: &Settings, out: &Output, a: TagArgs) -> Result<u8> {
    if a.add.is_empty() && a.remove.is_empty() && a.set.is_empty() {
        return Err(capsule_app::error::UsageError(
            "say what to change: --add TAG, --remove TAG or --set TAG".into(),
        )
        .into());
    }
    if a.ids.is_empty() && a.filter.is_empty() {
        return Err(capsule_app::error::UsageError(
            "say which snapshots: IDs, or --host/--tag/--path (a change of every snapshot needs one of them)".into(),
        )
        .into());
    }
    let (repo, _) = open(settings, out)?;
    let (snaps, bad) = repo.list_snapshots()?;
    for e in &bad {
        out.warn(format!("{e}; it is left as it is"));
    }
    let snaps = a.filter.apply(snaps);
    let mut picked = std::collections::BTreeSet::new();
    for spec in &a.ids {
        picked.insert(capsule_engine::Repository::pick_named(snaps.clone(), spec)?.0);
    }
    let (add, remove, set) = (tag_list(&a.add), tag_list(&a.remove), tag_list(&a.set));
    let mut changed = Vec::new();
    for (id, s) in snaps {
        if !a.ids.is_empty() && !picked.contains(&id) {
            continue;
        }
        let mut tags = if a.set.is_empty() {
            s.tags.clone()
        } else {
            set.clone()
        };
        tags.retain(|t| !remove.contains(t));
        for t in &add {
            if !tags.contains(t) {
                tags.push(t.clone());
            }
        }
        if tags != s.tags {
            let mut n = s;
            n.tags = tags;
            changed.push((id, n));
        }
    }
    let ids = if a.dry_run {
        Vec::new()
    } else {
        capsule_engine::forget::replace_all(&repo, changed.clone())?
    };
    if out.json {
        let v: Vec<_> = changed
            .iter()
            .enumerate()
            .map(|(i, (old, s))| {
                serde_json::json!({
                    "snapshot": old.to_hex(),
                    "replaced_by": ids.get(i).map(|n| n.to_hex()),
                    "tags": s.tags,
                })
            })
            .collect();
        out.json(&serde_json::json!({ "changed": v, "dry_run": a.dry_run }));
    } else {
        for (i, (old, s)) in changed.iter().enumerate() {
            out.result(format!(
                "{} {} tags [{}]{}",
                old.short(),
                if a.dry_run { "would get" } else { "now has" },
                s.tags.join(","),
                ids.get(i)
                    .map(|n| format!(" (now snapshot {})", n.short()))
                    .unwrap_or_default()
            ));
        }
        out.say(format!(
            "{} snapshot{} {}changed",
            changed.len(),
            if changed.len() == 1 { "" } else { "s" },
            if a.dry_run { "would be " } else { "" }
        ));
    }
    Ok(exit::OK)
}
