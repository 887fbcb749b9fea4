//! The snapshot's trees, fetched level by level before the plan walks them.
//!
//! Walking a snapshot loads one tree per directory, each after its parent:
//! without a cache (a restore on a new machine, or `--no-cache`) that was a
//! round trip per directory, one after another, which at 10 ms made the
//! trees of a 2,600-file documentation tree cost longer than its data.
//! Here every level's trees are fetched at once: grouped by pack, merged
//! into ranged reads like file contents, `workers` reads in flight. Each
//! distinct tree is fetched once, so shared subtrees (and tree bombs, made
//! of few distinct trees) cost nothing extra, and at most `max_trees` are
//! fetched. A tree this pass cannot supply is simply left out: the walk
//! then loads it the usual way, which tries every copy and reports the
//! damage where it belongs.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use capsule_format::tree::{decode_tree, Node, NodeKind};
use capsule_format::{BlobId, BlobType};

use super::fetch::{MAX_GAP, MAX_REQUEST};
use crate::index::MasterIndex;
use crate::repo::{pack_name, Repository};

/// Decoded trees by ID.
pub(super) type Trees = HashMap<BlobId, Arc<Vec<Node>>>;

/// One level's trees as read, and the read requests it took.
type Level = (Vec<(BlobId, Arc<Vec<Node>>)>, u64);

/// Fetches every tree below `root` (at most `max_trees` distinct ones).
/// Returns the trees it could read, and the number of read requests made.
pub(super) fn prefetch(
    repo: &Repository,
    index: &MasterIndex,
    root: &BlobId,
    workers: usize,
    max_trees: usize,
) -> (Trees, u64) {
    let mut trees: Trees = HashMap::new();
    let mut seen: HashSet<BlobId> = HashSet::from([*root]);
    let mut level = vec![*root];
    let mut requests = 0;
    while !level.is_empty() {
        let (got, n) = fetch_level(repo, index, &level, workers);
        requests += n;
        let mut next = Vec::new();
        for (id, nodes) in got {
            for node in nodes.iter() {
                if node.kind() != NodeKind::Dir {
                    continue;
                }
                if let Some(sub) = node.subtree {
                    if seen.len() < max_trees && seen.insert(sub) {
                        next.push(sub);
                    }
                }
            }
            trees.insert(id, nodes);
        }
        level = next;
    }
    (trees, requests)
}

/// One level: grouped by pack, merged into ranged reads, fetched in
/// parallel.
fn fetch_level(repo: &Repository, index: &MasterIndex, ids: &[BlobId], workers: usize) -> Level {
    let mut wanted: Vec<(BlobId, crate::index::BlobLoc)> = ids
        .iter()
        .filter_map(|id| {
            index
                .locations(id)
                .find(|l| l.blob_type == BlobType::Tree)
                .map(|l| (*id, *l))
        })
        .collect();
    wanted.sort_by_key(|(_, l)| (l.pack, l.offset));
    // (pack, range, wanted[a..b])
    let mut reads: Vec<(u32, std::ops::Range<u64>, std::ops::Range<usize>)> = Vec::new();
    for (i, (_, l)) in wanted.iter().enumerate() {
        let (start, end) = (l.offset as u64, l.offset as u64 + l.length as u64);
        if let Some(r) = reads.last_mut() {
            if r.0 == l.pack
                && start >= r.1.end
                && start - r.1.end <= MAX_GAP
                && end - r.1.start <= MAX_REQUEST
            {
                r.1.end = end;
                r.2.end = i + 1;
                continue;
            }
        }
        reads.push((l.pack, start..end, i..i + 1));
    }
    let next = AtomicUsize::new(0);
    let out = Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for _ in 0..workers.clamp(1, reads.len().max(1)) {
            s.spawn(|| {
                while let Some((pack, range, blobs)) =
                    reads.get(next.fetch_add(1, Ordering::Relaxed))
                {
                    let name = pack_name(&index.pack_id(*pack), BlobType::Tree);
                    let Ok(buf) = repo.backend().get(&name, Some(range.clone())) else {
                        continue;
                    };
                    for (id, l) in &wanted[blobs.clone()] {
                        let start = (l.offset as u64 - range.start) as usize;
                        let Some(env) = buf.get(start..start + l.length as usize) else {
                            continue;
                        };
                        let decoded = repo
                            .decode_blob(&name, BlobType::Tree, id, env, l.raw_length as usize)
                            .ok()
                            .and_then(|plain| decode_tree(&plain).ok());
                        if let Some(nodes) = decoded {
                            out.lock()
                                .unwrap_or_else(|p| p.into_inner())
                                .push((*id, Arc::new(nodes)));
                        }
                    }
                }
            });
        }
    });
    (
        out.into_inner().unwrap_or_else(|p| p.into_inner()),
        reads.len() as u64,
    )
}
