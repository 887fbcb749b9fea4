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
}

pub fn snapshots(settings: &Settings, out: &Output, a: SnapshotsArgs) -> Result<u8> {
    let (repo, _) = open(settings, out)?;
    let (snaps, bad) = if a.forgotten {
        capsule_engine::forget::list_forgotten(&repo)?
    } else {
        repo.list_snapshots()?
    };
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
