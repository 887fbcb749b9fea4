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

use capsule_crypto::Aad;
use capsule_format::index::{IndexFile, IndexPack};
use capsule_format::pack::{decode_header, parse_trailer, PACK_TRAILER_LEN};
use capsule_format::FileType;
use capsule_format::{BlobType, ObjectId};
use rayon::prelude::*;

use crate::index::save_index_file;
use crate::repo::Repository;
use crate::{EngineError, Result};

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

/// Most header bytes read in the first request: the trailer and, for all
/// but the largest packs, the whole header with it.
const TAIL_GUESS: u64 = 64 * 1024;

/// Rebuilds the index from pack headers. With `dry_run`, reads and reports
/// but writes and deletes nothing.
pub fn repair_index(repo: &Repository, dry_run: bool) -> Result<RepairReport> {
    let mut report = RepairReport::default();
    let (index, bad) = repo.load_index()?;
    let mut damaged_files = Vec::new();
    for e in bad {
        match e {
            EngineError::Corrupt { object, .. } if object.starts_with(FileType::Index.prefix()) => {
                damaged_files.push(object)
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
    let results: Vec<_> = todo
        .par_iter()
        .map(|(name, id, size)| (name, read_header(repo, name, *id, *size)))
        .collect();
    let mut packs = Vec::new();
    for (name, r) in results {
        match r {
            Ok(p) => packs.push(p),
            Err(EngineError::Backend(b)) if b.is_destination_failure() => {
                return Err(EngineError::Backend(b))
            }
            Err(e) => report.unreadable_packs.push((name.clone(), e.to_string())),
        }
    }
    report.reindexed = packs.len() as u64;
    report.blobs = packs.iter().map(|p| p.entries.len() as u64).sum();
    if dry_run {
        report.removed_index_files = damaged_files;
        return Ok(report);
    }
    if !packs.is_empty() {
        let id = save_index_file(
            repo,
            &IndexFile {
                supersedes: Vec::new(),
                packs,
            },
        )?;
        report.index_file = Some(FileType::Index.name(&id));
    }
    // The new index file is durable: what the damaged ones listed and is
    // still on storage is indexed again, so they can go.
    for f in damaged_files {
        repo.backend().delete(&f)?;
        report.removed_index_files.push(f);
    }
    Ok(report)
}

/// Reads and authenticates one pack's header.
fn read_header(repo: &Repository, name: &str, id: ObjectId, size: u64) -> Result<IndexPack> {
    if size < PACK_TRAILER_LEN as u64 {
        return Err(EngineError::corrupt(name, "shorter than a pack trailer"));
    }
    let start = size.saturating_sub(TAIL_GUESS);
    let mut tail = repo.backend().get(name, Some(start..size))?;
    if tail.len() as u64 != size - start {
        return Err(EngineError::corrupt(name, "short read of the pack's end"));
    }
    let t = &tail[tail.len() - PACK_TRAILER_LEN..];
    let hlen = parse_trailer(t, size).map_err(|e| EngineError::corrupt(name, e))? as u64;
    let hstart = size - PACK_TRAILER_LEN as u64 - hlen;
    // A header longer than the first read: fetch it whole.
    let base = if hstart < start {
        tail = repo.backend().get(name, Some(hstart..size))?;
        if tail.len() as u64 != size - hstart {
            return Err(EngineError::corrupt(name, "short read of the pack header"));
        }
        hstart
    } else {
        start
    };
    let env = &tail[(hstart - base) as usize..tail.len() - PACK_TRAILER_LEN];
    let plain = repo
        .key()
        .open(Aad::PackHeader, env)
        .map_err(|e| EngineError::corrupt(name, format!("header: {e}")))?;
    let entries = decode_header(&plain).map_err(|e| EngineError::corrupt(name, e))?;
    let want = if FileType::of_name(name) == Some(FileType::TreePack) {
        BlobType::Tree
    } else {
        BlobType::Data
    };
    for e in &entries {
        if e.blob_type != want || u64::from(e.offset) + u64::from(e.length) > hstart {
            return Err(EngineError::corrupt(
                name,
                "header lists a blob outside the pack or of the wrong type",
            ));
        }
    }
    Ok(IndexPack { id, size, entries })
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
    let mut memo: std::collections::HashMap<capsule_format::BlobId, Rewritten> = Default::default();
    for (id, snap) in &snaps {
        let root: capsule_format::BlobId = snap
            .tree
            .parse()
            .map_err(|_| EngineError::corrupt(FileType::Snapshot.name(id), "bad tree id"))?;
        let mut dropped = Vec::new();
        let new_root = match rewrite_tree(
            repo,
            &index,
            &have,
            saver.as_ref(),
            &root,
            std::path::Path::new("/"),
            &mut dropped,
            &mut memo,
        )? {
            Rewritten::Same => continue,
            Rewritten::New(r) => Some(r),
            Rewritten::Lost(why) => {
                dropped.push(format!("/: {why}"));
                None
            }
        };
        report.repaired.push(SnapshotRepair {
            snapshot: id.to_hex(),
            replaced_by: None,
            dropped,
        });
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
            let new_id = repo.save_snapshot(&s)?;
            report.repaired[i].replaced_by = Some(new_id.to_hex());
        }
        // Set aside, not deleted: `unforget` brings it back if the data
        // turns up again.
        crate::forget::forget(repo, &old_id)?;
    }
    Ok(report)
}

/// A tree after repair.
#[derive(Clone)]
enum Rewritten {
    /// Nothing under it was lost.
    Same,
    /// Rewritten without what was lost.
    New(capsule_format::BlobId),
    /// The tree itself cannot be read.
    Lost(String),
}

#[allow(clippy::too_many_arguments)]
fn rewrite_tree(
    repo: &Repository,
    index: &crate::index::MasterIndex,
    have: &dyn Fn(&capsule_format::BlobId) -> bool,
    saver: Option<&crate::packer::BlobSaver>,
    tree: &capsule_format::BlobId,
    path: &std::path::Path,
    dropped: &mut Vec<String>,
    memo: &mut std::collections::HashMap<capsule_format::BlobId, Rewritten>,
) -> Result<Rewritten> {
    use capsule_format::tree::{encode_tree, NodeKind};
    use std::os::unix::ffi::OsStrExt;
    // Shared subtrees are judged once; what they drop is named per snapshot.
    if let Some(r) = memo.get(tree) {
        if !matches!(r, Rewritten::Same) {
            dropped.push(format!("{}: (as in an earlier snapshot)", path.display()));
        }
        return Ok(r.clone());
    }
    let nodes = match repo.load_tree(index, tree) {
        Ok(n) if have(tree) => n,
        Ok(_) => return Ok(Rewritten::Lost("its tree's pack is missing".into())),
        Err(EngineError::Backend(b)) if b.is_destination_failure() => {
            return Err(EngineError::Backend(b))
        }
        Err(e) => return Ok(Rewritten::Lost(e.to_string())),
    };
    let mut changed = false;
    let mut out = Vec::with_capacity(nodes.len());
    for mut n in nodes {
        let p = path.join(std::ffi::OsStr::from_bytes(&n.name));
        match n.kind() {
            NodeKind::Dir => {
                if let Some(sub) = n.subtree {
                    match rewrite_tree(repo, index, have, saver, &sub, &p, dropped, memo)? {
                        Rewritten::Same => {}
                        Rewritten::New(id) => {
                            n.subtree = Some(id);
                            changed = true;
                        }
                        Rewritten::Lost(why) => {
                            dropped.push(format!("{}/: {why}", p.display()));
                            changed = true;
                            continue;
                        }
                    }
                }
            }
            NodeKind::File => {
                if let Some(b) = n.content.iter().find(|b| !have(b)) {
                    dropped.push(format!("{}: blob {} is missing", p.display(), b.short()));
                    changed = true;
                    continue;
                }
            }
            _ => {}
        }
        out.push(n);
    }
    let r = if !changed {
        Rewritten::Same
    } else {
        let enc = encode_tree(&out);
        let id = repo.key().blob_id(&enc);
        if let Some(s) = saver {
            s.save(BlobType::Tree, id, &enc)?;
        }
        Rewritten::New(id)
    };
    memo.insert(*tree, r.clone());
    Ok(r)
}
