//! `repair index`: rebuilds what the index lost from the packs themselves.
//!
//! Every pack ends with an encrypted header listing its blobs (see
//! `capsule_format::pack`), so a damaged, truncated or deleted index file
//! costs nothing that is still on storage. Repair reads the header of
//! every pack no intact index file lists (one or two ranged reads each),
//! writes one new index file for them, and only then deletes the index
//! files that failed to authenticate: a crash at any point leaves an index
//! at least as complete as before.

use std::collections::HashSet;

use capsule_format::index::IndexFile;
use capsule_format::FileType;
use capsule_format::ObjectId;

use crate::error::{EngineError, Result};
use crate::index::save_index_file;
use crate::repo::Repository;
use crate::retree::{Rewritten, Walk};

/// `repair snapshots`' judge: entries whose data no stored pack holds go.
struct LostData<'a> {
    have: &'a dyn Fn(&capsule_format::BlobId) -> bool,
}

impl crate::retree::Judge for LostData<'_> {
    fn tree_lost(&self, tree: &capsule_format::BlobId) -> Option<String> {
        (!(self.have)(tree)).then(|| "its tree's pack is missing".into())
    }

    fn drops_lost_trees(&self) -> bool {
        true
    }

    fn drop_entry(&self, _: &std::path::Path, n: &capsule_format::tree::Node) -> Option<String> {
        if n.kind() != capsule_format::tree::NodeKind::File {
            return None;
        }
        n.content
            .iter()
            .find(|b| !(self.have)(b))
            .map(|b| format!("blob {} is missing", b.short()))
    }
}

/// What `repair index` did.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct RepairReport {
    /// Packs on storage.
    pub packs: u64,
    /// Packs that no intact index file listed.
    pub unindexed: u64,
    /// Of those, packs whose header was read and indexed again.
    pub reindexed: u64,
    /// Blobs they hold.
    pub blobs: u64,
    /// The new index file, if one was written.
    pub index_file: Option<String>,
    /// Damaged index files removed after the new one was stored.
    pub removed_index_files: Vec<String>,
    /// Packs whose header could not be read (damaged or truncated), with
    /// why: their blobs stay unavailable.
    pub unreadable_packs: Vec<(String, String)>,
}

/// Rebuilds the index from pack headers. With `dry_run`, reads and reports
/// but writes and deletes nothing.
pub fn repair_index(repo: &Repository, dry_run: bool) -> Result<RepairReport> {
    let mut report = RepairReport::default();
    let (index, bad) = repo.load_index()?;
    let mut damaged_files = Vec::new();
    // Index files the store lists but answers "not found" for on every
    // read (a distributed store can, after a node died during an upload):
    // the new file supersedes them, so every reader forgives them as
    // replaced, however long the store goes on listing them.
    let mut gone_files = Vec::new();
    for e in bad {
        match e {
            EngineError::Corrupt { object, .. } if object.starts_with(FileType::Index.prefix()) => {
                damaged_files.push(object)
            }
            EngineError::Backend(b)
                if b.kind == capsule_backend::ErrorKind::NotFound
                    && b.name.starts_with(FileType::Index.prefix()) =>
            {
                gone_files.push(b.name)
            }
            // Anything else (the destination failing) stops the repair
            // before it deletes anything.
            other => return Err(other),
        }
    }
    let mut indexed: HashSet<ObjectId> = index.packs().iter().map(|p| p.id).collect();
    // Packs a prune marked stay out: indexing them would undo the prune.
    indexed.extend(crate::prune::marked_packs(repo)?);
    let mut todo = Vec::new();
    for prefix in [FileType::DataPack.prefix(), FileType::TreePack.prefix()] {
        for o in repo.backend().list(prefix)? {
            report.packs += 1;
            let Some(id) = o.name.rsplit('/').next().and_then(|h| h.parse().ok()) else {
                continue;
            };
            if !indexed.contains(&id) {
                todo.push((o.name, id, o.size));
            }
        }
    }
    report.unindexed = todo.len() as u64;
    let width = crate::flight::reads_in_flight(&repo.backend().capabilities());
    let results = crate::flight::map_in_flight(&todo, width, |(name, id, size)| {
        (name.clone(), repo.read_pack_header(name, *id, *size))
    });
    let mut packs = Vec::new();
    for (name, r) in results {
        match r {
            Ok(p) => packs.push(p),
            Err(EngineError::Backend(b)) if b.is_destination_failure() => {
                return Err(EngineError::Backend(b))
            }
            Err(e) => report.unreadable_packs.push((name, e.to_string())),
        }
    }
    report.reindexed = packs.len() as u64;
    report.blobs = packs.iter().map(|p| p.entries.len() as u64).sum();
    if dry_run {
        report.removed_index_files = damaged_files;
        report.removed_index_files.extend(gone_files);
        return Ok(report);
    }
    if !packs.is_empty() || !gone_files.is_empty() {
        let supersedes = gone_files
            .iter()
            .chain(&damaged_files)
            .filter_map(|n| FileType::id_of(n))
            .collect();
        let id = save_index_file(repo, &IndexFile { supersedes, packs })?;
        report.index_file = Some(FileType::Index.name(&id));
    }
    // The new index file is durable: what the damaged ones listed and is
    // still on storage is indexed again, so they can go.
    for f in damaged_files.into_iter().chain(gone_files) {
        repo.backend().delete(&f)?;
        report.removed_index_files.push(f);
    }
    Ok(report)
}

/// What `repair snapshots` did to one snapshot.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct SnapshotRepair {
    /// The damaged snapshot (moved to `forgotten/`).
    pub snapshot: String,
    /// Its replacement, when one was written.
    pub replaced_by: Option<String>,
    /// Paths dropped because their data (or their directory's tree) is
    /// gone, as `<path>: <why>`.
    pub dropped: Vec<String>,
    /// How many entries were dropped (also those in subtrees another
    /// snapshot shares, which `dropped` names once, by their directory).
    pub dropped_entries: u64,
}

/// What `repair snapshots` did.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct SnapshotsRepairReport {
    /// Snapshots read.
    pub snapshots: u64,
    /// Those that referenced missing data, and what became of them.
    pub repaired: Vec<SnapshotRepair>,
}

/// Rewrites every snapshot that refers to missing data: files whose blobs no
/// stored pack holds, and directories whose tree cannot be read, are
/// dropped (and named); everything else is kept, in a new snapshot with the
/// same time, host, paths and tags, marked incomplete and tagged
/// `repaired`. The old snapshot moves to `forgotten/`, so `unforget` can
/// bring it back if the data turns up again (say, a pack restored from a
/// copy). With `dry_run`, reports and writes nothing.
pub fn repair_snapshots(
    repo: &std::sync::Arc<Repository>,
    dry_run: bool,
) -> Result<SnapshotsRepairReport> {
    let (mut index, _) = repo.load_index()?;
    // Blobs a prune has marked but a live snapshot still uses are not lost:
    // the next prune puts their packs back.
    crate::prune::add_marked_packs(repo, &mut index)?;
    // A blob counts as there when an indexed pack holding it is stored
    // with its indexed size.
    let mut stored = std::collections::HashMap::new();
    for prefix in [FileType::DataPack.prefix(), FileType::TreePack.prefix()] {
        for o in repo.backend().list(prefix)? {
            stored.insert(o.name, o.size);
        }
    }
    let present: HashSet<u32> = index
        .packs()
        .iter()
        .enumerate()
        .filter(|(_, p)| stored.get(&p.name()) == Some(&p.size))
        .map(|(i, _)| i as u32)
        .collect();
    let have = |b: &capsule_format::BlobId| index.locations(b).any(|l| present.contains(&l.pack));
    let (snaps, _) = repo.list_snapshots()?;
    let mut report = SnapshotsRepairReport {
        snapshots: snaps.len() as u64,
        ..Default::default()
    };
    let saver = (!dry_run).then(|| {
        crate::packer::BlobSaver::start(
            repo.clone(),
            std::sync::Arc::new(crate::index::MasterIndex::default()),
            2,
        )
    });
    // Each damaged snapshot and its new root (none when the root itself is
    // lost: nothing of it can be kept).
    let mut fixed: Vec<(
        ObjectId,
        capsule_format::snapshot::Snapshot,
        Option<capsule_format::BlobId>,
    )> = Vec::new();
    let mut memo = crate::retree::Memo::default();
    let judge = LostData { have: &have };
    let mut counts = Vec::new();
    for (id, snap) in &snaps {
        let root: capsule_format::BlobId = snap
            .tree
            .parse()
            .map_err(|_| EngineError::corrupt(FileType::Snapshot.name(id), "bad tree id"))?;
        let mut dropped = Vec::new();
        let sources: Vec<std::path::PathBuf> = snap.paths.iter().map(Into::into).collect();
        let mut walk = Walk {
            repo,
            index: &index,
            judge: &judge,
            saver: saver.as_ref(),
            sources: &sources,
            dropped: &mut dropped,
            memo: &mut memo,
        };
        let (new_root, kept) = match walk.rewrite(&root, std::path::Path::new("/"))? {
            (Rewritten::Same, _) => continue,
            (Rewritten::New(r), c) => (Some(r), c),
            (Rewritten::Lost(why), mut c) => {
                dropped.push(format!("/: {why}"));
                c.dropped += 1;
                (None, c)
            }
        };
        report.repaired.push(SnapshotRepair {
            snapshot: id.to_hex(),
            replaced_by: None,
            dropped,
            dropped_entries: kept.dropped,
        });
        counts.push(kept);
        fixed.push((*id, snap.clone(), new_root));
    }
    if let Some(saver) = saver {
        // New trees are stored and indexed before any snapshot names them.
        saver.finish()?;
    }
    if dry_run {
        return Ok(report);
    }
    for (i, (old_id, snap, new_root)) in fixed.into_iter().enumerate() {
        if let Some(root) = new_root {
            let mut s = snap;
            s.tree = root.to_hex();
            s.incomplete = true;
            if !s.tags.iter().any(|t| t == "repaired") {
                s.tags.push("repaired".into());
            }
            // The counts say what it holds now, not what it held.
            let c = counts[i];
            s.summary.files = c.files;
            s.summary.dirs = c.dirs;
            s.summary.others = c.others;
            s.summary.bytes = c.bytes;
            // A snapshot repaired again keeps naming the first original.
            let earlier = s.repaired.take().unwrap_or_default();
            s.repaired = Some(capsule_format::snapshot::Repaired {
                from: if earlier.from.is_empty() {
                    old_id.to_hex()
                } else {
                    earlier.from
                },
                time: crate::timefmt::rfc3339(crate::timefmt::now_unix()),
                dropped: earlier.dropped + c.dropped,
            });
            let new_id = repo.save_snapshot(&s)?;
            report.repaired[i].replaced_by = Some(new_id.to_hex());
        }
        // Set aside, not deleted: `unforget` brings it back if the data
        // turns up again.
        crate::forget::forget(repo, &old_id)?;
    }
    Ok(report)
}
