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
