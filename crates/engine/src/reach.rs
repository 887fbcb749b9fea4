//! What the snapshots reach, and what that says of each pack: prune's
//! mark phase (see [`crate::prune`] and docs/DESIGN.md, "Prune").
//!
//! The set of used blobs is the one thing prune must hold per blob. It is
//! kept as sorted 64-bit fingerprints (the first 8 bytes of each blob ID),
//! 8 bytes a blob against about 60 for a hash set of IDs. Two IDs sharing
//! a fingerprint (about one chance in 2^64 / n² for n blobs: one in ten
//! thousand at ten million) can only make an unused blob look used, which
//! keeps a pack that could have gone: never the other way.

use std::collections::{HashMap, HashSet};

use capsule_format::pack::PackEntry;
use capsule_format::{BlobId, FileType, ObjectId};

use crate::error::{EngineError, Result};
use crate::index::MasterIndex;
use crate::repo::Repository;

/// Blobs some snapshot uses, as sorted fingerprints.
#[derive(Debug, Default)]
pub struct UsedBlobs {
    sorted: Vec<u64>,
    /// Added since the last sort (sorted and merged when it outgrows it).
    fresh: Vec<u64>,
}

/// Fingerprints added between merges (8 MiB).
const FRESH: usize = 1 << 20;

fn fingerprint(id: &BlobId) -> u64 {
    let mut b = [0u8; 8];
    b.copy_from_slice(&id.0 .0[..8]);
    u64::from_be_bytes(b)
}

impl UsedBlobs {
    /// Adds a blob.
    pub fn insert(&mut self, id: &BlobId) {
        self.fresh.push(fingerprint(id));
        if self.fresh.len() >= FRESH {
            self.settle();
        }
    }

    /// Merges what was added into the sorted set, in place from the back:
    /// memory is the set plus [`FRESH`] fingerprints, never twice the set.
    fn settle(&mut self) {
        self.fresh.sort_unstable();
        self.fresh.dedup();
        crate::sorted::merge_in(&mut self.sorted, &self.fresh);
        self.fresh.clear();
    }

    /// Whether a blob is used (or shares its fingerprint with one that is).
    pub fn contains(&self, id: &BlobId) -> bool {
        debug_assert!(self.fresh.is_empty(), "settled before use");
        self.sorted.binary_search(&fingerprint(id)).is_ok()
    }
}

/// Every blob the snapshots reference: their trees and the data in them.
/// Trees shared between snapshots are walked once (a set of tree IDs: a
/// tree holds hundreds of entries, so these are few). With `count_missing`,
/// also how many data blobs a snapshot uses neither `index` nor `marked`
/// holds (one lookup per reference walked, so only when asked: a prune
/// that goes on without an index file the store lists but cannot give).
pub(crate) fn used_blobs(
    repo: &Repository,
    index: &MasterIndex,
    marked: &MasterIndex,
    snaps: &[(ObjectId, capsule_format::snapshot::Snapshot)],
    count_missing: bool,
) -> Result<(UsedBlobs, u64)> {
    let mut missing = 0u64;
    let mut used = UsedBlobs::default();
    let mut trees: HashSet<BlobId> = HashSet::new();
    let mut todo: Vec<BlobId> = Vec::new();
    for (id, s) in snaps {
        let root: BlobId = s
            .tree
            .parse()
            .map_err(|_| EngineError::corrupt(FileType::Snapshot.name(id), "bad tree id"))?;
        if trees.insert(root) {
            used.insert(&root);
            todo.push(root);
        }
    }
    while let Some(t) = todo.pop() {
        let loaded = match repo.load_tree(index, &t) {
            Err(EngineError::MissingBlob(_)) if marked.contains(&t) => repo.load_tree(marked, &t),
            other => other,
        };
        let nodes = loaded.map_err(|e| {
            EngineError::PruneRefused(format!(
                "tree {} cannot be read ({e}); run `capsule check` and repair first",
                t.short()
            ))
        })?;
        for n in nodes {
            for b in &n.content {
                used.insert(b);
                if count_missing && !index.contains(b) && !marked.contains(b) {
                    missing += 1;
                }
            }
            if let Some(sub) = n.subtree {
                if trees.insert(sub) {
                    used.insert(&sub);
                    todo.push(sub);
                }
            }
        }
    }
    used.settle();
    Ok((used, missing))
}

/// Each pack's stored and needed blob bytes, by position, from one scan of
/// the index: a blob is needed in the pack of its first location when a
/// snapshot uses it.
pub(crate) fn pack_bytes(index: &MasterIndex, used: &UsedBlobs) -> (Vec<u64>, Vec<u64>) {
    let n = index.packs().len();
    let (mut stored, mut needed) = (vec![0u64; n], vec![0u64; n]);
    for (id, locs) in index.iter_all() {
        let is_used = used.contains(&id);
        for (k, loc) in locs.iter().enumerate() {
            stored[loc.pack as usize] += u64::from(loc.length);
            if k == 0 && is_used {
                needed[loc.pack as usize] += u64::from(loc.length);
            }
        }
    }
    (stored, needed)
}

/// Every location in the packs at `packs` (first locations and alternates
/// both: a pack's entries are all its blobs), by pack, in pack order.
pub(crate) fn entries_of(
    index: &MasterIndex,
    packs: &HashSet<u32>,
) -> HashMap<u32, Vec<PackEntry>> {
    let mut by: HashMap<u32, Vec<PackEntry>> = HashMap::new();
    if packs.is_empty() {
        return by;
    }
    for (id, locs) in index.iter_all() {
        for loc in locs {
            if packs.contains(&loc.pack) {
                by.entry(loc.pack).or_default().push(PackEntry {
                    blob_type: loc.blob_type,
                    id,
                    offset: loc.offset,
                    length: loc.length,
                    raw_length: loc.raw_length,
                });
            }
        }
    }
    for v in by.values_mut() {
        v.sort_by_key(|e| e.offset);
    }
    by
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_used_set_holds_what_was_added_and_nothing_else() {
        let id = |n: u64| {
            let mut b = [0u8; 32];
            b[..8].copy_from_slice(&n.wrapping_mul(0x9E37_79B9_7F4A_7C15).to_be_bytes());
            BlobId(capsule_format::Id(b))
        };
        let mut u = UsedBlobs::default();
        // More than one merge's worth, with duplicates across merges.
        for n in 0..(FRESH as u64 * 2 + 10) {
            u.insert(&id(n % (FRESH as u64 + 7)));
            u.insert(&id(n));
        }
        u.settle();
        assert!(u.sorted.windows(2).all(|w| w[0] < w[1]));
        for n in 0..(FRESH as u64 * 2 + 10) {
            assert!(u.contains(&id(n)));
        }
        assert!(!u.contains(&id(FRESH as u64 * 3)));
    }
}
