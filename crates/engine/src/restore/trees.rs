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

/// Decoded trees by ID, each with the number of times the snapshot refers
/// to it, so the plan can take each one's nodes (moved, not copied) at its
/// last use and the trees are never held twice.
#[derive(Default)]
pub(super) struct Trees {
    trees: HashMap<BlobId, (Arc<Vec<Node>>, usize)>,
}

impl Trees {
    /// The nodes of `id` for one use: moved out at the last one.
    pub(super) fn take(&mut self, id: &BlobId) -> Option<Vec<Node>> {
        let (nodes, left) = self.trees.get_mut(id)?;
        *left = left.saturating_sub(1);
        if *left > 0 {
            return Some(nodes.as_ref().clone());
        }
        let (nodes, _) = self.trees.remove(id)?;
        Some(Arc::try_unwrap(nodes).unwrap_or_else(|shared| shared.as_ref().clone()))
    }

    /// Entries the plan will hold if it takes every tree at every use (an
    /// upper bound: excluded ones are left out).
    pub(super) fn entries(&self) -> usize {
        self.trees
            .values()
            .map(|(nodes, uses)| nodes.len().saturating_mul((*uses).min(1 << 22)))
            .fold(0usize, usize::saturating_add)
    }
}

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
    let mut trees = Trees::default();
    let mut seen: HashSet<BlobId> = HashSet::from([*root]);
    let mut level = vec![*root];
    let mut requests = 0;
    while !level.is_empty() {
        let (got, n) = fetch_level(repo, index, &level, workers);
        requests += n;
        let mut next = Vec::new();
        for (id, nodes) in got {
            for sub in subtrees(&nodes) {
                if seen.len() < max_trees && seen.insert(sub) {
                    next.push(sub);
                }
            }
            trees.trees.insert(id, (nodes, 0));
        }
        level = next;
    }
    count_uses(&mut trees, root);
    (trees, requests)
}

fn subtrees(nodes: &[Node]) -> impl Iterator<Item = BlobId> + '_ {
    nodes
        .iter()
        .filter(|n| n.kind() == NodeKind::Dir)
        .filter_map(|n| n.subtree)
}

/// How many times the walk will come to each tree: the snapshot is a
/// graph of distinct trees (a subtree stored once may sit in many places),
/// so a tree's uses are the sum over the places that refer to it of their
/// parent's uses, counted parents first (Kahn's order; the graph has no
/// cycles, its edges being content hashes).
fn count_uses(trees: &mut Trees, root: &BlobId) {
    let mut waiting: HashMap<BlobId, usize> = HashMap::new();
    for (nodes, _) in trees.trees.values() {
        for sub in subtrees(nodes) {
            *waiting.entry(sub).or_default() += 1;
        }
    }
    let mut uses: HashMap<BlobId, usize> = HashMap::from([(*root, 1)]);
    let mut ready = vec![*root];
    while let Some(t) = ready.pop() {
        let Some((nodes, _)) = trees.trees.get(&t) else {
            continue;
        };
        let n = uses.get(&t).copied().unwrap_or(1);
        for sub in subtrees(nodes) {
            let u = uses.entry(sub).or_default();
            *u = u.saturating_add(n);
            if let Some(w) = waiting.get_mut(&sub) {
                *w -= 1;
                if *w == 0 {
                    ready.push(sub);
                }
            }
        }
    }
    for (id, (_, left)) in trees.trees.iter_mut() {
        // A tree the count could not reach (never expected) is kept to the
        // end: copied at every use, as before the count existed.
        *left = uses.get(id).copied().unwrap_or(usize::MAX);
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    fn id(b: u8) -> BlobId {
        BlobId(capsule_format::Id([b; 32]))
    }

    fn dir(sub: u8) -> Node {
        Node {
            kind: Some(NodeKind::Dir),
            subtree: Some(id(sub)),
            ..Default::default()
        }
    }

    /// Root holds B twice and C once; B holds A twice; C holds A once: the
    /// walk comes to A five times, and takes its nodes (moved) at the last.
    #[test]
    fn a_shared_tree_is_counted_once_per_place_it_sits_and_moved_at_its_last_use() {
        let file = Node {
            name: b"f".to_vec(),
            ..Default::default()
        };
        let mut trees = Trees::default();
        for (t, nodes) in [
            (0, vec![dir(1), dir(1), dir(2)]),
            (1, vec![dir(3), dir(3)]),
            (2, vec![dir(3)]),
            (3, vec![file.clone()]),
        ] {
            trees.trees.insert(id(t), (Arc::new(nodes), 0));
        }
        count_uses(&mut trees, &id(0));
        let uses = |t: u8| trees.trees[&id(t)].1;
        assert_eq!((uses(0), uses(1), uses(2), uses(3)), (1, 2, 1, 5));
        assert_eq!(trees.entries(), 3 + 2 * 2 + 1 + 5);
        for _ in 0..4 {
            assert_eq!(trees.take(&id(3)), Some(vec![file.clone()]));
            assert!(trees.trees.contains_key(&id(3)));
        }
        assert_eq!(trees.take(&id(3)), Some(vec![file]));
        assert!(!trees.trees.contains_key(&id(3)), "gone after its last use");
        assert_eq!(trees.take(&id(3)), None);
    }
}
