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
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use capsule_format::tree::{decode_tree, Node, NodeKind};
use capsule_format::{BlobId, BlobType};

use super::descend::Descend;
use super::fetch::{MAX_GAP, MAX_REQUEST};
use crate::index::MasterIndex;
use crate::repo::{pack_name, Repository};

/// One tree as fetched: its sealed, compressed envelope (a fifth of the
/// decoded nodes' size, or less), what is needed to open it again, and what
/// the walk needs to know before it does.
struct Fetched {
    /// Where its envelope lies in `Trees::envs`.
    env: std::ops::Range<usize>,
    /// Position of its pack in the index.
    pack: u32,
    raw_len: usize,
    /// Nodes it holds, the bytes of their names and the blobs their
    /// contents name.
    size: Size,
    /// The subtrees it refers to, once per place.
    subtrees: Vec<BlobId>,
    /// Uses the walk has still to make of it.
    left: usize,
}

/// The snapshot's trees by ID, each with the number of times the walk will
/// come to it. They are kept sealed and decoded at each use, so the trees
/// are not held decoded beside the plan built from them (on 300,000 tiny
/// files the decoded trees took 70 MB, their envelopes 14 MB).
///
/// The envelopes lie end to end in one buffer: held one allocation each,
/// they were freed one by one in the middle of the heap as the walk went,
/// and the allocator kept those 14 MB resident for the rest of the restore.
/// One buffer goes back to the system whole when the walk is done.
#[derive(Default)]
pub(super) struct Trees {
    trees: HashMap<BlobId, Fetched>,
    envs: Vec<u8>,
}

impl Trees {
    /// The nodes of `id` for one use (dropped from here at its last).
    /// `None` when it was not fetched or no longer opens: the walk then
    /// loads it the usual way, which reports the damage.
    pub(super) fn take(
        &mut self,
        repo: &Repository,
        index: &MasterIndex,
        id: &BlobId,
    ) -> Option<Vec<Node>> {
        let t = self.trees.get_mut(id)?;
        t.left = t.left.saturating_sub(1);
        let name = pack_name(&index.pack_id(t.pack), BlobType::Tree);
        let nodes = repo
            .decode_blob(
                &name,
                BlobType::Tree,
                id,
                &self.envs[t.env.clone()],
                t.raw_len,
            )
            .ok()
            .and_then(|plain| decode_tree(&plain).ok());
        if t.left == 0 {
            self.trees.remove(id);
        }
        nodes
    }

    /// What the plan will hold if it takes every tree at every use (an
    /// upper bound: excluded ones are left out).
    pub(super) fn size(&self) -> Size {
        let mut all = Size::default();
        for t in self.trees.values() {
            let uses = t.left.min(1 << 22);
            all.entries = all
                .entries
                .saturating_add(t.size.entries.saturating_mul(uses));
            all.name_bytes = all
                .name_bytes
                .saturating_add(t.size.name_bytes.saturating_mul(uses));
            all.blobs = all.blobs.saturating_add(t.size.blobs.saturating_mul(uses));
        }
        all
    }
}

/// What a tree, or the plan built from trees, holds.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(super) struct Size {
    pub entries: usize,
    pub name_bytes: usize,
    pub blobs: usize,
}

impl Size {
    fn of(nodes: &[Node]) -> Size {
        Size {
            entries: nodes.len(),
            name_bytes: nodes.iter().map(|n| n.name.len()).sum(),
            blobs: nodes.iter().map(|n| n.content.len()).sum(),
        }
    }
}

/// One level's trees as read, each with the snapshot paths of the
/// subtrees it lists, and the read requests it took.
type Level = (Vec<(BlobId, Fetched, Vec<PathBuf>)>, u64);

/// Fetches every tree below `root` (at most `max_trees` distinct ones) in
/// the directories `descend` opens. Returns the trees it could read, and
/// the number of read requests made.
///
/// A tree is fetched once, at the first place a level reaches it; the
/// subtrees it lists are those `descend` opens there. Where the same tree
/// sits at another place whose subtrees `descend` opens differently, the
/// walk loads what this pass left out the usual way.
pub(super) fn prefetch(
    repo: &Repository,
    index: &MasterIndex,
    root: &BlobId,
    descend: &Descend,
    workers: usize,
    max_trees: usize,
) -> (Trees, u64) {
    let mut trees = Trees::default();
    let mut seen: HashSet<BlobId> = HashSet::from([*root]);
    let mut level = vec![(*root, PathBuf::from("/"))];
    let mut requests = 0;
    let mut small = SmallPacks::default();
    while !level.is_empty() {
        let (got, n) = fetch_level(
            repo,
            index,
            &level,
            descend,
            workers,
            &mut trees.envs,
            &mut small,
        );
        requests += n;
        let mut next = Vec::new();
        for (id, t, paths) in got {
            for (&sub, path) in t.subtrees.iter().zip(paths) {
                if seen.len() < max_trees && seen.insert(sub) {
                    next.push((sub, path));
                }
            }
            trees.trees.insert(id, t);
        }
        level = next;
    }
    count_uses(&mut trees, root);
    (trees, requests)
}

/// The subtrees of `nodes`, a tree at `dir`, that `descend` opens, with
/// their paths.
fn subtrees(nodes: &[Node], dir: &Path, descend: &Descend) -> (Vec<BlobId>, Vec<PathBuf>) {
    nodes
        .iter()
        .filter(|n| n.kind() == NodeKind::Dir)
        .filter_map(|n| {
            let path = dir.join(OsStr::from_bytes(&n.name));
            let sub = n.subtree?;
            descend.opens(&path).then_some((sub, path))
        })
        .unzip()
}

/// How many times the walk will come to each tree: the snapshot is a
/// graph of distinct trees (a subtree stored once may sit in many places),
/// so a tree's uses are the sum over the places that refer to it of their
/// parent's uses, counted parents first (Kahn's order; the graph has no
/// cycles, its edges being content hashes).
fn count_uses(trees: &mut Trees, root: &BlobId) {
    let mut waiting: HashMap<BlobId, usize> = HashMap::new();
    for t in trees.trees.values() {
        for &sub in &t.subtrees {
            *waiting.entry(sub).or_default() += 1;
        }
    }
    let mut uses: HashMap<BlobId, usize> = HashMap::from([(*root, 1)]);
    let mut ready = vec![*root];
    while let Some(id) = ready.pop() {
        let Some(t) = trees.trees.get(&id) else {
            continue;
        };
        let n = uses.get(&id).copied().unwrap_or(1);
        for &sub in &t.subtrees {
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
    for (id, t) in trees.trees.iter_mut() {
        // A tree the count could not reach (never expected) is kept to the
        // end.
        t.left = uses.get(id).copied().unwrap_or(usize::MAX);
    }
}

/// A tree pack no larger than this is read whole the first time a level
/// needs it, and kept for the levels below.
const SMALL_TREE_PACK: u64 = 1 << 20;
/// Bytes of small tree packs kept at once, at most.
const SMALL_PACKS_HELD: u64 = 16 << 20;

/// Small tree packs read whole, by position in the index.
///
/// The levels of one snapshot's trees mostly lie in the same few packs
/// (a backup writes its new trees together), so reading by level asked the
/// same pack once per directory level: ten levels, ten round trips, for a
/// pack often smaller than one round trip's worth of transfer. A small pack
/// is read whole once instead; a large one (the trees of a big first
/// backup) is still read in ranges, since reading all of it for a partial
/// restore would cost more than the round trips it saves.
#[derive(Default)]
struct SmallPacks {
    held: HashMap<u32, std::sync::Arc<Vec<u8>>>,
    bytes: u64,
}

/// How one read of a level gets its bytes.
enum Source {
    /// Already held whole.
    Held(std::sync::Arc<Vec<u8>>),
    /// A small pack, read whole (as long as the index says it is, so
    /// that a wrong object cannot make the read larger) and then held.
    Whole(u64),
    /// A range of a large pack.
    Range(std::ops::Range<u64>),
}

/// One level: grouped by pack, merged into ranged reads, fetched in
/// parallel.
/// Envelopes are appended to `envs`.
fn fetch_level(
    repo: &Repository,
    index: &MasterIndex,
    ids: &[(BlobId, PathBuf)],
    descend: &Descend,
    workers: usize,
    envs: &mut Vec<u8>,
    small: &mut SmallPacks,
) -> Level {
    let mut wanted: Vec<(BlobId, crate::index::BlobLoc, &Path)> = ids
        .iter()
        .filter_map(|(id, path)| {
            index
                .locations(id)
                .find(|l| l.blob_type == BlobType::Tree)
                .map(|l| (*id, l, path.as_path()))
        })
        .collect();
    wanted.sort_by_key(|(_, l, _)| (l.pack, l.offset));
    // (pack, source, wanted[a..b])
    let mut reads: Vec<(u32, Source, std::ops::Range<usize>)> = Vec::new();
    let mut planned = small.bytes;
    for (i, (_, l, _)) in wanted.iter().enumerate() {
        let (start, end) = (l.offset as u64, l.offset as u64 + l.length as u64);
        if let Some(r) = reads.last_mut() {
            if r.0 == l.pack {
                match &mut r.1 {
                    Source::Held(_) | Source::Whole(_) => {
                        r.2.end = i + 1;
                        continue;
                    }
                    Source::Range(range)
                        if start >= range.end
                            && start - range.end <= MAX_GAP
                            && end - range.start <= MAX_REQUEST =>
                    {
                        range.end = end;
                        r.2.end = i + 1;
                        continue;
                    }
                    Source::Range(_) => {}
                }
            }
        }
        let size = index
            .packs()
            .get(l.pack as usize)
            .map_or(u64::MAX, |p| p.size);
        let source = if let Some(buf) = small.held.get(&l.pack) {
            Source::Held(buf.clone())
        } else if size <= SMALL_TREE_PACK && planned + size <= SMALL_PACKS_HELD {
            planned += size;
            Source::Whole(size)
        } else {
            Source::Range(start..end)
        };
        reads.push((l.pack, source, i..i + 1));
    }
    let requests = reads
        .iter()
        .filter(|r| !matches!(r.1, Source::Held(_)))
        .count() as u64;
    let next = AtomicUsize::new(0);
    let out = Mutex::new((Vec::new(), std::mem::take(envs)));
    let read_whole = Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for _ in 0..workers.clamp(1, reads.len().max(1)) {
            s.spawn(|| {
                while let Some((pack, source, blobs)) =
                    reads.get(next.fetch_add(1, Ordering::Relaxed))
                {
                    let name = pack_name(&index.pack_id(*pack), BlobType::Tree);
                    let (buf, base) = match source {
                        Source::Held(buf) => (buf.clone(), 0),
                        Source::Whole(size) => {
                            let Ok(buf) = repo.backend().get(&name, Some(0..*size)) else {
                                continue;
                            };
                            let buf = std::sync::Arc::new(buf);
                            read_whole
                                .lock()
                                .unwrap_or_else(|p| p.into_inner())
                                .push((*pack, buf.clone()));
                            (buf, 0)
                        }
                        Source::Range(range) => {
                            let Ok(buf) = repo.backend().get(&name, Some(range.clone())) else {
                                continue;
                            };
                            (std::sync::Arc::new(buf), range.start)
                        }
                    };
                    for (id, l, dir) in &wanted[blobs.clone()] {
                        let start = (l.offset as u64 - base) as usize;
                        let Some(env) = buf.get(start..start + l.length as usize) else {
                            continue;
                        };
                        let decoded = repo
                            .decode_blob(&name, BlobType::Tree, id, env, l.raw_length as usize)
                            .ok()
                            .and_then(|plain| decode_tree(&plain).ok());
                        if let Some(nodes) = decoded {
                            let (subtrees, paths) = subtrees(&nodes, dir, descend);
                            let mut out = out.lock().unwrap_or_else(|p| p.into_inner());
                            let (list, envs) = &mut *out;
                            let at = envs.len();
                            envs.extend_from_slice(env);
                            let t = Fetched {
                                env: at..envs.len(),
                                pack: l.pack,
                                raw_len: l.raw_length as usize,
                                size: Size::of(&nodes),
                                subtrees,
                                left: 0,
                            };
                            list.push((*id, t, paths));
                        }
                    }
                }
            });
        }
    });
    for (pack, buf) in read_whole.into_inner().unwrap_or_else(|p| p.into_inner()) {
        small.bytes += buf.len() as u64;
        small.held.insert(pack, buf);
    }
    let (list, all) = out.into_inner().unwrap_or_else(|p| p.into_inner());
    *envs = all;
    (list, requests)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(b: u8) -> BlobId {
        BlobId(capsule_format::Id([b; 32]))
    }

    fn fetched(nodes: usize, subtrees: &[u8]) -> Fetched {
        Fetched {
            env: 0..0,
            pack: 0,
            raw_len: 0,
            size: Size {
                entries: nodes,
                name_bytes: 2 * nodes,
                blobs: 3 * nodes,
            },
            subtrees: subtrees.iter().map(|&b| id(b)).collect(),
            left: 0,
        }
    }

    /// Root holds B twice and C once; B holds A twice; C holds A once: the
    /// walk comes to A five times, and the plan holds every node of every
    /// use.
    #[test]
    fn a_shared_tree_is_counted_once_per_place_it_sits() {
        let mut trees = Trees::default();
        for (t, f) in [
            (0, fetched(3, &[1, 1, 2])),
            (1, fetched(2, &[3, 3])),
            (2, fetched(1, &[3])),
            (3, fetched(1, &[])),
        ] {
            trees.trees.insert(id(t), f);
        }
        count_uses(&mut trees, &id(0));
        let uses = |t: u8| trees.trees[&id(t)].left;
        assert_eq!((uses(0), uses(1), uses(2), uses(3)), (1, 2, 1, 5));
        let entries = 3 + 2 * 2 + 1 + 5;
        let want = Size {
            entries,
            name_bytes: 2 * entries,
            blobs: 3 * entries,
        };
        assert_eq!(trees.size(), want);
    }
}
