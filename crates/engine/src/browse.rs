//! Looking inside snapshots from a long-lived process (`capsule mount`,
//! `capsule ui`): trees and file contents on demand, with bounded caches
//! shared by every request.
//!
//! Opening a directory costs its own tree (and the trees above it, once);
//! nothing walks a whole snapshot. Decoded trees are kept up to
//! [`TREE_CACHE_BYTES`], blobs up to [`BLOB_CACHE_BYTES`]; a
//! tree of a million entries that does not fit is still served, just not
//! kept. File reads fetch neighbouring blobs of one pack in one ranged
//! read, as a restore does, and a file read in order is fetched ahead of
//! the reader ([`READ_AHEAD`]) by a background thread.

use std::collections::{HashMap, HashSet};
use std::hash::Hash;
use std::path::Path;
use std::sync::{Arc, Mutex, PoisonError};

use capsule_format::snapshot::Snapshot;
use capsule_format::tree::{Node, NodeKind};
use capsule_format::{BlobId, BlobType, ObjectId};

use crate::error::{EngineError, Result};
use crate::index::{BlobLoc, MasterIndex};
use crate::repo::{pack_name, Repository};
use crate::treewalk::find_in;

/// Decoded trees kept, in bytes as [`tree_bytes`] counts them. A node
/// takes about 300 bytes decoded, so this keeps some 150,000 entries: a
/// directory of 100,000 files listed with `ls -l` stays whole, while a
/// `find` over a snapshot of millions stays within it (it counted entries
/// and allowed 1,000,000, about 300 MiB).
pub const TREE_CACHE_BYTES: usize = 48 << 20;
/// Blob bytes kept decoded.
pub const BLOB_CACHE_BYTES: usize = 96 << 20;
/// How far ahead of a reader reading in order its file is fetched.
pub const READ_AHEAD: u64 = 16 << 20;
/// Largest ranged read, and largest gap between two blobs one read spans
/// (as the restore's plan: `restore::fetch`).
const MAX_REQUEST: u64 = 4 << 20;
const MAX_GAP: u64 = 64 << 10;
/// Read-ahead fetches running at once, over all files.
const MAX_AHEAD_FETCHES: usize = 4;

/// About the bytes `t` takes decoded: its nodes and what they point to.
pub fn tree_bytes(t: &[Node]) -> usize {
    t.iter()
        .map(|n| {
            std::mem::size_of::<Node>()
                + n.name.len()
                + n.target.len()
                + n.content.len() * std::mem::size_of::<BlobId>()
                + n.xattrs
                    .iter()
                    .map(|(k, v)| 48 + k.len() + v.len())
                    .sum::<usize>()
        })
        .sum()
}

/// A least-recently-used map bounded by the summed weight of its values,
/// or by the one value heavier than that.
pub struct Lru<K, V> {
    map: HashMap<K, (V, usize, u64)>,
    order: std::collections::BTreeMap<u64, K>,
    tick: u64,
    weight: usize,
    bound: usize,
}

impl<K: Eq + Hash + Clone, V: Clone> Lru<K, V> {
    /// An empty map holding at most `bound` weight.
    pub fn new(bound: usize) -> Self {
        Lru {
            map: HashMap::new(),
            order: std::collections::BTreeMap::new(),
            tick: 0,
            weight: 0,
            bound,
        }
    }

    /// The value for `k`, now the most recently used.
    pub fn get(&mut self, k: &K) -> Option<V> {
        let (v, _, t) = self.map.get_mut(k)?;
        self.order.remove(t);
        self.tick += 1;
        *t = self.tick;
        self.order.insert(self.tick, k.clone());
        Some(v.clone())
    }

    /// Keeps `v` of `weight` for `k`, dropping the least recently used
    /// until it fits. A value heavier than the bound is kept alone: not
    /// keeping it would make it again on every use (a directory of
    /// 500,000 entries read again for every page of its listing).
    pub fn put(&mut self, k: K, v: V, weight: usize) {
        if let Some((_, w, t)) = self.map.remove(&k) {
            self.order.remove(&t);
            self.weight -= w;
        }
        while self.weight + weight > self.bound {
            let Some((_, old)) = self.order.pop_first() else {
                break;
            };
            if let Some((_, w, _)) = self.map.remove(&old) {
                self.weight -= w;
            }
        }
        self.tick += 1;
        self.order.insert(self.tick, k.clone());
        self.map.insert(k, (v, weight, self.tick));
        self.weight += weight;
    }

    /// The summed weight held.
    pub fn weight(&self) -> usize {
        self.weight
    }
}

/// Where each part of a file's content lies: its blobs and the offset each
/// starts at.
#[derive(Debug, Clone)]
pub struct FileMap {
    blobs: Vec<(BlobId, u64)>,
    size: u64,
}

impl FileMap {
    /// The file's size as its blobs give it.
    pub fn size(&self) -> u64 {
        self.size
    }
}

/// The snapshots a long-lived process shows, and a browser of the index
/// that holds them.
pub struct View {
    /// The browser.
    pub browser: Arc<Browser>,
    /// Snapshots, oldest first.
    pub snapshots: Vec<(ObjectId, Snapshot)>,
}

/// Lists the snapshots again, and loads the index again when they
/// changed (None: nothing changed, or it could not be read now).
pub type Refresh = Box<dyn Fn() -> Option<View> + Send + Sync>;

/// A repository opened for browsing.
pub struct Browser {
    repo: Arc<Repository>,
    index: Arc<MasterIndex>,
    trees: Mutex<Lru<BlobId, Arc<Vec<Node>>>>,
    blobs: Mutex<Lru<BlobId, Arc<Vec<u8>>>>,
    /// Blobs a read-ahead is fetching now.
    fetching: Mutex<HashSet<BlobId>>,
    /// Signalled when blobs leave `fetching`: a read waits for a blob the
    /// read-ahead is already fetching rather than fetch it twice.
    fetched: std::sync::Condvar,
    ahead: std::sync::atomic::AtomicUsize,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Browser {
    /// Browses `repo` through `index`.
    pub fn new(repo: Arc<Repository>, index: Arc<MasterIndex>) -> Arc<Self> {
        Arc::new(Browser {
            repo,
            index,
            trees: Mutex::new(Lru::new(TREE_CACHE_BYTES)),
            blobs: Mutex::new(Lru::new(BLOB_CACHE_BYTES)),
            fetching: Mutex::new(HashSet::new()),
            fetched: std::sync::Condvar::new(),
            ahead: std::sync::atomic::AtomicUsize::new(0),
        })
    }

    /// The repository.
    pub fn repo(&self) -> &Arc<Repository> {
        &self.repo
    }

    /// The index.
    pub fn index(&self) -> &Arc<MasterIndex> {
        &self.index
    }

    /// The entries of tree `id`, sorted by name.
    pub fn tree(&self, id: &BlobId) -> Result<Arc<Vec<Node>>> {
        if let Some(t) = lock(&self.trees).get(id) {
            return Ok(t);
        }
        let t = Arc::new(self.repo.load_tree(&self.index, id)?);
        lock(&self.trees).put(*id, t.clone(), tree_bytes(&t).max(1));
        Ok(t)
    }

    /// The node at `path` below tree `root` (None: the root itself).
    pub fn find(&self, root: &BlobId, path: &Path) -> Result<Option<Node>> {
        find_in(&mut |id| self.tree(id), root, path)
    }

    /// The entry `name` of tree `id`.
    pub fn child(&self, id: &BlobId, name: &[u8]) -> Result<Option<Node>> {
        let t = self.tree(id)?;
        Ok(t.binary_search_by(|n| n.name.as_slice().cmp(name))
            .ok()
            .map(|i| t[i].clone()))
    }

    /// The versions of `path` in `snaps` ([`crate::versions::versions`]),
    /// with this browser's trees.
    pub fn versions(
        &self,
        snaps: &[(ObjectId, Snapshot)],
        path: &Path,
    ) -> Result<crate::versions::Versions> {
        crate::versions::versions_with(&mut |id| self.tree(id), snaps, path)
    }

    /// The names below `path` in any of `snaps`, each with whether it is a
    /// directory in any of them, sorted: the directory as it was at any
    /// time. Each distinct tree is read once.
    pub fn union_dir(
        &self,
        snaps: &[(ObjectId, Snapshot)],
        path: &Path,
    ) -> Result<Vec<(Vec<u8>, bool)>> {
        let mut seen = HashSet::new();
        let mut names: std::collections::BTreeMap<Vec<u8>, bool> = Default::default();
        for (_, s) in snaps {
            let Ok(root) = s.tree.parse::<BlobId>() else {
                continue;
            };
            let tree = match self.find(&root, path) {
                Ok(None) => Some(root),
                Ok(Some(n)) if n.kind() == NodeKind::Dir => n.subtree,
                Ok(Some(_)) | Err(EngineError::PathNotFound(_)) => None,
                Err(e) => return Err(e),
            };
            let Some(tree) = tree else { continue };
            if !seen.insert(tree) {
                continue;
            }
            for n in self.tree(&tree)?.iter() {
                *names.entry(n.name.clone()).or_default() |= n.kind() == NodeKind::Dir;
            }
        }
        Ok(names.into_iter().collect())
    }

    /// Where the content of file `node` lies. A blob no index lists is
    /// [`EngineError::MissingBlob`].
    pub fn file_map(&self, node: &Node) -> Result<FileMap> {
        let mut at = 0u64;
        let mut blobs = Vec::with_capacity(node.content.len());
        for id in &node.content {
            let loc = self
                .index
                .get(id)
                .ok_or_else(|| EngineError::MissingBlob(id.to_hex()))?;
            blobs.push((*id, at));
            at += u64::from(loc.raw_length);
        }
        Ok(FileMap { blobs, size: at })
    }

    /// Up to `len` bytes of the file at `offset`. When `ahead` is set (the
    /// reader reads in order), the next [`READ_AHEAD`] bytes are fetched
    /// in the background.
    pub fn read_at(
        self: &Arc<Self>,
        f: &FileMap,
        offset: u64,
        len: usize,
        ahead: bool,
    ) -> Result<Vec<u8>> {
        let end = f.size.min(offset.saturating_add(len as u64));
        if offset >= end {
            return Ok(Vec::new());
        }
        let first = f.blobs.partition_point(|(_, s)| *s <= offset) - 1;
        let last = f.blobs.partition_point(|(_, s)| *s < end);
        let got = self.blobs(&f.blobs[first..last], true)?;
        let mut out = Vec::with_capacity((end - offset) as usize);
        for ((_, start), b) in f.blobs[first..last].iter().zip(&got) {
            let from = offset.saturating_sub(*start) as usize;
            let to = ((end - start) as usize).min(b.len());
            out.extend_from_slice(&b[from.min(to)..to]);
        }
        if ahead {
            let until = end.saturating_add(READ_AHEAD);
            let more = f.blobs.partition_point(|(_, s)| *s < until);
            self.fetch_ahead(&f.blobs[last..more]);
        }
        Ok(out)
    }

    /// Fetches the contents of `files` in the background, in the order
    /// they lie in their packs: what reading them one after another will
    /// need, in as few ranged reads as a restore makes.
    pub fn prefetch(self: &Arc<Self>, files: &[Node]) {
        let mut ids: Vec<(BlobId, BlobLoc)> = files
            .iter()
            .flat_map(|n| n.content.iter())
            .filter_map(|id| self.index.get(id).map(|l| (*id, l)))
            .collect();
        ids.sort_by_key(|(_, l)| (l.pack, l.offset));
        ids.dedup_by_key(|(id, _)| *id);
        let ids: Vec<(BlobId, u64)> = ids.into_iter().map(|(id, _)| (id, 0)).collect();
        self.fetch_ahead(&ids);
    }

    /// Fetches `ids` in a background thread unless they are cached or
    /// being fetched, or enough fetches run already.
    fn fetch_ahead(self: &Arc<Self>, ids: &[(BlobId, u64)]) {
        use std::sync::atomic::Ordering::Relaxed;
        let wanted: Vec<(BlobId, u64)> = {
            let cache = lock(&self.blobs);
            let mut fetching = lock(&self.fetching);
            ids.iter()
                .filter(|(id, _)| !cache.map.contains_key(id) && fetching.insert(*id))
                .copied()
                .collect()
        };
        if wanted.is_empty() {
            return;
        }
        if self.ahead.fetch_add(1, Relaxed) >= MAX_AHEAD_FETCHES {
            self.ahead.fetch_sub(1, Relaxed);
            let mut fetching = lock(&self.fetching);
            for (id, _) in &wanted {
                fetching.remove(id);
            }
            return;
        }
        let me = self.clone();
        let spawned = std::thread::Builder::new()
            .name("read-ahead".into())
            .spawn(move || {
                // A failure here is met again, and reported, by the read
                // that needs the blob.
                let _ = me.blobs(&wanted, false);
                let mut fetching = lock(&me.fetching);
                for (id, _) in &wanted {
                    fetching.remove(id);
                }
                drop(fetching);
                me.fetched.notify_all();
                me.ahead.fetch_sub(1, Relaxed);
            });
        if spawned.is_err() {
            self.ahead.fetch_sub(1, Relaxed);
        }
    }

    /// Waits, bounded, until none of the blobs of `ids` not in `have` is
    /// being fetched by a read-ahead.
    fn await_fetches(&self, ids: &[(BlobId, u64)], have: &[Option<Arc<Vec<u8>>>]) {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        let mut fetching = lock(&self.fetching);
        while ids
            .iter()
            .zip(have)
            .any(|((id, _), h)| h.is_none() && fetching.contains(id))
        {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                // Fetched again here rather than wait longer.
                return;
            }
            fetching = match self.fetched.wait_timeout(fetching, left) {
                Ok((g, _)) => g,
                Err(p) => p.into_inner().0,
            };
        }
    }

    /// The decoded blobs `ids`, from the cache or fetched: neighbours in
    /// one pack in one ranged read. With `wait`, blobs a read-ahead is
    /// fetching are waited for, not fetched a second time.
    fn blobs(&self, ids: &[(BlobId, u64)], wait: bool) -> Result<Vec<Arc<Vec<u8>>>> {
        let mut out: Vec<Option<Arc<Vec<u8>>>> = {
            let mut cache = lock(&self.blobs);
            ids.iter().map(|(id, _)| cache.get(id)).collect()
        };
        if wait && out.iter().any(Option::is_none) {
            self.await_fetches(ids, &out);
            let mut cache = lock(&self.blobs);
            for (o, (id, _)) in out.iter_mut().zip(ids) {
                if o.is_none() {
                    *o = cache.get(id);
                }
            }
        }
        let missing: Vec<(usize, BlobId, BlobLoc)> = ids
            .iter()
            .enumerate()
            .filter(|(i, _)| out[*i].is_none())
            .map(|(i, (id, _))| {
                self.index
                    .get(id)
                    .map(|l| (i, *id, l))
                    .ok_or_else(|| EngineError::MissingBlob(id.to_hex()))
            })
            .collect::<Result<_>>()?;
        let mut run: Vec<(usize, BlobId, BlobLoc)> = Vec::new();
        for m in missing {
            let joins = run.last().is_some_and(|(_, _, l)| {
                let (start, end) = (run[0].2.offset as u64, l.offset as u64 + l.length as u64);
                l.pack == m.2.pack
                    && (m.2.offset as u64) >= end
                    && (m.2.offset as u64) - end <= MAX_GAP
                    && m.2.offset as u64 + m.2.length as u64 - start <= MAX_REQUEST
            });
            if !joins && !run.is_empty() {
                self.fetch_run(&run, &mut out)?;
                run.clear();
            }
            run.push(m);
        }
        if !run.is_empty() {
            self.fetch_run(&run, &mut out)?;
        }
        Ok(out
            .into_iter()
            .map(|b| b.expect("every blob fetched"))
            .collect())
    }

    /// One ranged read covering `run` (blobs of one pack in offset order);
    /// each decoded blob goes into `out` and the cache. A blob failing
    /// there is read alone, then from any other copy ([`Repository::read_blob`]).
    fn fetch_run(
        &self,
        run: &[(usize, BlobId, BlobLoc)],
        out: &mut [Option<Arc<Vec<u8>>>],
    ) -> Result<()> {
        let pack = pack_name(&self.index.pack_id(run[0].2.pack), BlobType::Data);
        let start = run[0].2.offset as u64;
        let end = run
            .iter()
            .map(|(_, _, l)| l.offset as u64 + l.length as u64)
            .max()
            .unwrap_or(start);
        // A failed read is not fatal yet: each blob is then read alone.
        let bytes = self.repo.backend().get(&pack, Some(start..end)).ok();
        for (i, id, l) in run {
            let decoded = bytes
                .as_ref()
                .ok_or_else(|| EngineError::corrupt(&pack, "the ranged read failed"))
                .and_then(|b| {
                    let from = (l.offset as u64 - start) as usize;
                    let env = b.get(from..from + l.length as usize).ok_or_else(|| {
                        EngineError::corrupt(&pack, "shorter than its index says")
                    })?;
                    self.repo
                        .decode_blob(&pack, BlobType::Data, id, env, l.raw_length as usize)
                })
                .or_else(|_| self.repo.read_blob(&self.index, BlobType::Data, id))?;
            let b = Arc::new(decoded);
            lock(&self.blobs).put(*id, b.clone(), b.len());
            out[*i] = Some(b);
        }
        // Whoever waits for these may go on: they are in the cache.
        let mut fetching = lock(&self.fetching);
        let mut any = false;
        for (_, id, _) in run {
            any |= fetching.remove(id);
        }
        drop(fetching);
        if any {
            self.fetched.notify_all();
        }
        Ok(())
    }
}
