//! The master index: blob ID → (pack, offset, length), merged from every
//! index file in the repository.
//!
//! It lives on local disk, in sorted tables read a page at a time
//! (modules `table` and `set`), so that memory does not grow with the number of
//! blobs: what is held is the pack list, the index files' names, and a
//! fence key per page of each table (about 0.1 byte per blob). Packs added
//! by this process (a backup's new packs, a journal's recovered ones) are
//! held in memory until the next run finds them in an index file.

#[cfg(test)]
mod model;
mod rewrite;
mod set;
mod table;

use std::collections::{BinaryHeap, HashMap, HashSet};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, RwLock};

use capsule_crypto::Aad;
use capsule_format::index::{decode_index, encode_index, IndexFile, IndexPack};
use capsule_format::FileType;
use capsule_format::{BlobId, BlobType, ObjectId};

use crate::error::{EngineError, Result};
pub use rewrite::rewrite_without;
pub use table::TableError;

/// Where a blob is stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlobLoc {
    /// Position of the pack in [`MasterIndex::packs`].
    pub pack: u32,
    /// Data or tree.
    pub blob_type: BlobType,
    /// Offset of the envelope in the pack.
    pub offset: u32,
    /// Envelope length.
    pub length: u32,
    /// Plaintext length.
    pub raw_length: u32,
}

/// One indexed pack.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PackInfo {
    /// Pack object ID.
    pub id: ObjectId,
    /// Size in bytes.
    pub size: u64,
    /// What its blobs are (a pack never mixes types).
    pub blob_type: BlobType,
}

impl PackInfo {
    /// The pack's object name.
    pub fn name(&self) -> String {
        FileType::pack(self.blob_type).name(&self.id)
    }
}

/// Where the tables of a repository live on this machine, and what they
/// are checked with.
pub struct IndexHome {
    /// The directory (the repository's cache directory's `index/`).
    pub dir: Option<PathBuf>,
    /// The MAC key of its tables, derived from the repository key.
    pub key: [u8; 32],
    /// The index files again, for a table found damaged mid-run.
    pub source: Option<Arc<dyn SealedStore + Send>>,
}

/// A slot of a table that no live index file lists.
const NOWHERE: u32 = u32::MAX;

/// A table in use, with where its slots are in [`MasterIndex::packs`].
#[derive(Debug)]
struct Loaded {
    table: Arc<table::Table>,
    to_pack: Vec<u32>,
}

/// All index files merged.
#[derive(Default)]
pub struct MasterIndex {
    tables: Vec<RwLock<Arc<Loaded>>>,
    /// Locations not in a table: packs added by this process, and index
    /// files no table could be written for (a full disk). The first
    /// location of a blob is its main one; the rest are alternates.
    overlay: HashMap<BlobId, Vec<BlobLoc>>,
    packs: Vec<PackInfo>,
    pack_pos: HashMap<ObjectId, u32>,
    files: Vec<ObjectId>,
    /// Packs known missing or damaged ([`forget_packs`](Self::forget_packs)).
    dead: HashSet<u32>,
    /// The live index files with what each supersedes, for a rebuild.
    live: HashSet<ObjectId>,
    /// Listed files a live one supersedes: left by a prune cut before its
    /// deletes (or listed by a store that has not caught up with them).
    leftover: Vec<ObjectId>,
    dir: Option<PathBuf>,
    /// Holds a directory of tables made for this process only (no cache).
    _temp: Option<tempfile::TempDir>,
    key: [u8; 32],
    source: Option<Arc<dyn SealedStore + Send>>,
    /// Serialises rebuilds of damaged tables.
    rescue: Mutex<()>,
    /// A table that went bad mid-run and could not be rebuilt: lookups
    /// in it answer nothing, and commands that delete must not go on.
    fault: Mutex<Option<String>>,
    /// What was done to the tables worth saying (rebuilt, merged, not
    /// merged for lack of space).
    notes: Arc<Mutex<Vec<String>>>,
    /// The merge running behind, if one was started.
    merging: Mutex<Option<std::thread::JoinHandle<()>>>,
}

impl std::fmt::Debug for MasterIndex {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MasterIndex")
            .field("tables", &self.tables.len())
            .field("overlay", &self.overlay.len())
            .field("packs", &self.packs.len())
            .field("files", &self.files.len())
            .finish_non_exhaustive()
    }
}

/// Listings taken again when index files vanish while being read.
const VANISHED_RETRIES: usize = 5;

/// Whether `e` is the store answering "not found".
pub(crate) fn is_not_found(e: &EngineError) -> bool {
    matches!(e, EngineError::Backend(b) if b.kind == capsule_backend::ErrorKind::NotFound)
}

/// Index files read from the destination, for tables not built yet.
struct Fresh {
    tables: Vec<table::Table>,
    /// Files whose table could not be written: held in memory.
    in_memory: Vec<(ObjectId, IndexFile)>,
    /// Files that could not be read, with why.
    failed: Vec<(ObjectId, EngineError)>,
}

/// Stored bytes of index files read at once: a few large files (a prune
/// writes them of up to 262,144 entries, about 10 MB) are held whole while
/// they are decoded, so the reads in flight are bounded by their size as
/// well as their number. Many small files (a backup's each) still go at
/// the destination's concurrency.
const INDEX_BYTES_AT_ONCE: u64 = 16 << 20;

/// `ids` (with their stored sizes, 0 where unknown) in groups to read at
/// once: up to `width` files and [`INDEX_BYTES_AT_ONCE`] bytes, at least
/// one file.
fn read_groups(ids: &[(ObjectId, u64)], width: usize) -> Vec<&[(ObjectId, u64)]> {
    let mut out = Vec::new();
    let mut rest = ids;
    while !rest.is_empty() {
        let mut n = 0;
        let mut bytes = 0u64;
        while n < rest.len() && n < width.max(1) {
            bytes = bytes.saturating_add(rest[n].1);
            if n > 0 && bytes > INDEX_BYTES_AT_ONCE {
                break;
            }
            n += 1;
        }
        let (group, tail) = rest.split_at(n);
        out.push(group);
        rest = tail;
    }
    out
}

/// Reads the index files `ids` (with their stored sizes, 0 where unknown)
/// and builds tables of them in `dir`, in batches of bounded size, merged
/// into one when there are several.
fn build_fresh(
    store: &dyn SealedStore,
    dir: &std::path::Path,
    key: &[u8; 32],
    ids: Vec<(ObjectId, u64)>,
    notes: &mut Vec<String>,
) -> Fresh {
    let mut out = Fresh {
        tables: Vec::new(),
        in_memory: Vec::new(),
        failed: Vec::new(),
    };
    let mut batch: Vec<(ObjectId, IndexFile)> = Vec::new();
    let mut batch_entries = 0usize;
    let mut disk_failed: Option<TableError> = None;
    let mut flush = |batch: &mut Vec<(ObjectId, IndexFile)>, out: &mut Fresh| {
        if batch.is_empty() {
            return;
        }
        if disk_failed.is_none() {
            match set::build(dir, key, batch).and_then(|p| table::Table::open(&p, key)) {
                Ok(t) => {
                    out.tables.push(t);
                    batch.clear();
                    return;
                }
                Err(e) => disk_failed = Some(e),
            }
        }
        out.in_memory.append(batch);
    };
    // A few files at a time (as many as the destination serves at once,
    // up to a bound on their bytes); a file larger than a build is built
    // in parts, a run of its packs each, merged below (an older backup or
    // prune could write one index file for every blob).
    let width = store.reads_in_flight();
    for group in read_groups(&ids, width) {
        type Loaded = std::result::Result<(ObjectId, IndexFile), (ObjectId, EngineError)>;
        let loaded: Vec<Loaded> = crate::flight::map_in_flight(group, width, |(id, _)| {
            load_index_file(store, id)
                .map(|f| (*id, f))
                .map_err(|e| (*id, e))
        });
        for r in loaded {
            let (id, f) = match r {
                Ok(x) => x,
                Err(e) => {
                    out.failed.push(e);
                    continue;
                }
            };
            let n: usize = f.packs.iter().map(|p| p.entries.len()).sum();
            if n <= set::BUILD_ENTRIES {
                batch_entries += n;
                batch.push((id, f));
            } else {
                flush(&mut batch, &mut out);
                batch_entries = 0;
                let mut part = Vec::new();
                let mut part_entries = 0;
                for p in f.packs {
                    part_entries += p.entries.len();
                    part.push(p);
                    if part_entries >= set::BUILD_ENTRIES {
                        let packs = std::mem::take(&mut part);
                        batch.push((
                            id,
                            IndexFile {
                                supersedes: f.supersedes.clone(),
                                packs,
                            },
                        ));
                        flush(&mut batch, &mut out);
                        part_entries = 0;
                    }
                }
                if !part.is_empty() {
                    batch.push((
                        id,
                        IndexFile {
                            supersedes: f.supersedes.clone(),
                            packs: part,
                        },
                    ));
                    flush(&mut batch, &mut out);
                }
            }
            if batch_entries >= set::BUILD_ENTRIES {
                flush(&mut batch, &mut out);
                batch_entries = 0;
            }
        }
    }
    flush(&mut batch, &mut out);
    if let Some(e) = &disk_failed {
        notes.push(format!(
            "index files held in memory, not in a table on disk: {e} (free space in the cache directory)"
        ));
    }
    if out.tables.len() == 1 && disk_failed.is_none() {
        // Whole files, all of them: the next run may take it.
        if let Err(e) = table::publish(&mut out.tables[0]) {
            notes.push(format!("index table kept for this run only: {e}"));
            let _ = std::fs::remove_file(&out.tables[0].path);
        }
    } else if out.tables.len() > 1 && disk_failed.is_none() {
        // A first run on a large repository: one table, not many.
        let inputs: Vec<Arc<table::Table>> = out.tables.drain(..).map(Arc::new).collect();
        let live: HashSet<ObjectId> = inputs
            .iter()
            .flat_map(|t| t.files.iter().map(|f| f.id))
            .collect();
        let merged = set::merge(dir, key, &inputs, &live).and_then(|p| table::Table::open(&p, key));
        for i in &inputs {
            let _ = std::fs::remove_file(&i.path);
        }
        match merged {
            Ok(t) => out.tables.push(t),
            Err(e) => {
                // The parts serve this run (their files stay open); none
                // is left for another to take for whole.
                notes.push(format!("index tables not merged: {e}"));
                out.tables = inputs
                    .into_iter()
                    .map(|t| Arc::try_unwrap(t).unwrap_or_else(|_| unreachable!("sole owner")))
                    .collect();
            }
        }
    } else {
        for t in &out.tables {
            let _ = std::fs::remove_file(&t.path);
        }
    }
    out
}

impl MasterIndex {
    /// Loads the index of `store`: the tables on this machine that still
    /// hold, and tables built for index files none covers. Index files
    /// that fail to read, authenticate or decode are returned as errors;
    /// the rest load.
    pub fn load(store: &dyn SealedStore) -> Result<(Self, Vec<EngineError>)> {
        let home = store.index_home();
        let mut notes = Vec::new();
        let (dir, temp) = match home.dir.as_ref().map(|d| (d, std::fs::create_dir_all(d))) {
            Some((d, Ok(()))) => (d.clone(), None),
            other => {
                if let Some((d, Err(e))) = other {
                    notes.push(format!(
                        "index tables kept for this run only: cannot create {}: {e}",
                        d.display()
                    ));
                }
                let t = tempfile::Builder::new()
                    .prefix("capsule-index-")
                    .tempdir()
                    .map_err(|e| {
                        EngineError::io("create a directory for the index", std::env::temp_dir(), e)
                    })?;
                (t.path().to_path_buf(), Some(t))
            }
        };
        let mut tables = set::open_all(&dir, &home.key, &mut notes);
        let mut bad = Vec::new();
        let mut vanished_files: Vec<(ObjectId, EngineError)> = Vec::new();
        let mut in_memory = Vec::new();
        let mut listed = HashSet::new();
        let mut sizes: HashMap<ObjectId, u64> = HashMap::new();
        // A prune deletes index files once the file superseding them is
        // stored. One read between the two finds a listed file gone; the
        // listing taken again then holds the file that replaced it.
        // Bounded: a destination that keeps losing files is reported as
        // it is.
        for attempt in 0..VANISHED_RETRIES {
            listed.clear();
            bad.clear();
            vanished_files.clear();
            for (o, size) in store.list(FileType::Index)? {
                match o.trim_start_matches(FileType::Index.prefix()).parse() {
                    Ok(id) => {
                        listed.insert(id);
                        sizes.insert(id, size);
                    }
                    Err(_) => bad.push(EngineError::corrupt(&o, "name is not an ID")),
                }
            }
            tables = set::choose(tables, &listed);
            let covered = set::coverage(&tables);
            let held: HashSet<ObjectId> = in_memory.iter().map(|(id, _)| *id).collect();
            let mut missing: Vec<ObjectId> = listed
                .iter()
                .filter(|id| !covered.contains_key(id) && !held.contains(id))
                .copied()
                .collect();
            missing.sort();
            let missing = missing
                .into_iter()
                .map(|id| (id, sizes.get(&id).copied().unwrap_or(0)))
                .collect();
            let fresh = build_fresh(store, &dir, &home.key, missing, &mut notes);
            tables.extend(fresh.tables);
            in_memory.extend(fresh.in_memory);
            let vanished = fresh.failed.iter().any(|(_, e)| is_not_found(e));
            for (id, e) in fresh.failed {
                if is_not_found(&e) {
                    vanished_files.push((id, e));
                } else {
                    bad.push(e);
                }
            }
            if !vanished || attempt + 1 == VANISHED_RETRIES {
                break;
            }
        }
        let mut supersedes: HashMap<ObjectId, Vec<ObjectId>> = set::coverage(&tables);
        supersedes.extend(in_memory.iter().map(|(id, f)| (*id, f.supersedes.clone())));
        let superseded: HashSet<ObjectId> = supersedes
            .iter()
            .filter(|(id, _)| listed.contains(id))
            .flat_map(|(_, s)| s.iter().copied())
            .collect();
        // A file still listed but gone, that a file read supersedes, was
        // deleted by the prune that wrote its replacement: a store may list
        // a deleted object for a while (a distributed store's node that was
        // away when it was deleted, until it heals), and the reads above
        // found it gone each time. What it held is in the replacement. Any
        // other file gone is a loss: its packs could be taken for unused.
        for (id, e) in vanished_files {
            if superseded.contains(&id) {
                notes.push(format!(
                    "index file {} is listed but gone: it was replaced by a prune, whose file was read instead",
                    id.short()
                ));
            } else {
                bad.push(e);
            }
        }
        let live: HashSet<ObjectId> = supersedes
            .keys()
            .filter(|id| listed.contains(id) && !superseded.contains(id))
            .copied()
            .collect();
        let mut idx = MasterIndex {
            dir: Some(dir.clone()),
            _temp: temp,
            key: home.key,
            source: home.source,
            ..MasterIndex::default()
        };
        let mut files: Vec<ObjectId> = live.iter().copied().collect();
        files.sort();
        idx.files = files;
        idx.leftover = listed.intersection(&superseded).copied().collect();
        idx.leftover.sort();
        // Sizes for the merge policy: (entries, live entries).
        let mut sizes = Vec::new();
        let mut kept = Vec::new();
        for t in tables {
            let live_entries = set::live_share(&t, &live);
            if live_entries == 0 && !t.packs.is_empty() {
                let _ = std::fs::remove_file(&t.path);
                continue;
            }
            sizes.push((t.entries, live_entries));
            let t = Arc::new(t);
            let to_pack = idx.map_slots(&t, &live);
            kept.push(t.clone());
            idx.tables
                .push(RwLock::new(Arc::new(Loaded { table: t, to_pack })));
        }
        in_memory.sort_by_key(|(id, _)| *id);
        for (id, f) in &in_memory {
            if live.contains(id) {
                for p in &f.packs {
                    idx.add_pack(p);
                }
            }
        }
        idx.live = live;
        let merge: Vec<Arc<table::Table>> = set::to_merge(&sizes)
            .into_iter()
            .map(|i| kept[i].clone())
            .collect();
        if !merge.is_empty() && idx._temp.is_none() {
            idx.merge_behind(merge);
        }
        idx.notes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .extend(notes);
        Ok((idx, bad))
    }

    /// Where each slot of `t` is in the pack list (adding its packs).
    fn map_slots(&mut self, t: &table::Table, live: &HashSet<ObjectId>) -> Vec<u32> {
        t.packs
            .iter()
            .map(|p| {
                if !live.contains(&t.files[p.file as usize].id) {
                    return NOWHERE;
                }
                self.pack_position(p.id, p.size, p.blob_type)
            })
            .collect()
    }

    fn pack_position(&mut self, id: ObjectId, size: u64, blob_type: BlobType) -> u32 {
        if let Some(&pos) = self.pack_pos.get(&id) {
            return pos;
        }
        let pos = self.packs.len() as u32;
        self.packs.push(PackInfo {
            id,
            size,
            blob_type,
        });
        self.pack_pos.insert(id, pos);
        pos
    }

    /// Merges `inputs` into one table on a thread of its own: this run
    /// goes on with the tables it has; the next one opens the merged one.
    fn merge_behind(&self, inputs: Vec<Arc<table::Table>>) {
        let (Some(dir), key, live, notes) = (
            self.dir.clone(),
            self.key,
            self.live.clone(),
            self.notes.clone(),
        ) else {
            return;
        };
        let spawned = std::thread::Builder::new()
            .name("index-merge".into())
            .spawn(move || match set::merge(&dir, &key, &inputs, &live) {
                Ok(path) => {
                    for t in &inputs {
                        if t.path != path {
                            let _ = std::fs::remove_file(&t.path);
                        }
                    }
                }
                Err(e) => notes
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push(format!(
                        "index tables not merged, lookups read {} tables until they are: {e}",
                        inputs.len()
                    )),
            });
        if let Ok(h) = spawned {
            *self.merging.lock().unwrap_or_else(|p| p.into_inner()) = Some(h);
        }
    }

    /// Waits for the merge started behind this load, if any: for tests,
    /// and for callers that would rather the next run find one table.
    pub fn finish_merge(&self) {
        let h = self
            .merging
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        if let Some(h) = h {
            let _ = h.join();
        }
    }

    /// Adds the blobs of one pack. A blob already indexed elsewhere keeps its
    /// first location; this one becomes an alternate.
    pub fn add_pack(&mut self, p: &IndexPack) {
        let blob_type = p
            .entries
            .first()
            .map(|e| e.blob_type)
            .unwrap_or(BlobType::Data);
        let pos = self.pack_position(p.id, p.size, blob_type);
        for e in &p.entries {
            let loc = BlobLoc {
                pack: pos,
                blob_type: e.blob_type,
                offset: e.offset,
                length: e.length,
                raw_length: e.raw_length,
            };
            let in_tables = self.table_locations(&e.id, false);
            if in_tables.iter().any(|l| l.pack == pos) {
                continue;
            }
            let locs = self.overlay.entry(e.id).or_default();
            if !locs.iter().any(|l| l.pack == pos) {
                locs.push(loc);
            }
        }
    }

    /// Drops every location in the given packs (known missing or damaged,
    /// or leaving the repository), so their blobs count as not stored: a
    /// backup uploads them again instead of referencing lost data.
    pub fn forget_packs(&mut self, bad: &HashSet<ObjectId>) {
        let bad_pos = bad.iter().filter_map(|id| self.pack_pos.get(id).copied());
        self.dead.extend(bad_pos);
    }

    /// Locations in the tables, live packs only, each pack once.
    /// The blob's locations in the tables, in table order; with `first`,
    /// only the first (the tables after it are not read).
    fn table_locations(&self, id: &BlobId, first: bool) -> Vec<BlobLoc> {
        let mut out = Vec::new();
        let mut found = Vec::new();
        for (i, slot) in self.tables.iter().enumerate() {
            let loaded = slot.read().unwrap_or_else(|p| p.into_inner()).clone();
            found.clear();
            let found_ok = match loaded.table.find(id, &mut found) {
                Ok(()) => Some(loaded),
                Err(e) => self.rescue(i, &loaded, e).and_then(|l| {
                    found.clear();
                    l.table.find(id, &mut found).ok().map(|_| l)
                }),
            };
            let Some(loaded) = found_ok else {
                continue;
            };
            for e in &found {
                let pos = loaded.to_pack[e.slot as usize];
                if pos == NOWHERE
                    || self.dead.contains(&pos)
                    || out.iter().any(|l: &BlobLoc| l.pack == pos)
                {
                    continue;
                }
                out.push(BlobLoc {
                    pack: pos,
                    blob_type: e.blob_type,
                    offset: e.offset,
                    length: e.length,
                    raw_length: e.raw_length,
                });
                if first {
                    return out;
                }
            }
        }
        out
    }

    /// Rebuilds table `i`, found damaged, from the index files it covers,
    /// and puts it in place; `None` (and the fault recorded) when that
    /// cannot be done.
    fn rescue(&self, i: usize, bad: &Arc<Loaded>, e: TableError) -> Option<Arc<Loaded>> {
        let _one = self.rescue.lock().unwrap_or_else(|p| p.into_inner());
        let now = self.tables[i]
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        if !Arc::ptr_eq(&now, bad) {
            return Some(now); // another thread rebuilt it
        }
        let fail = |why: String| {
            let msg = format!("{e}; the index files it covers could not be read again: {why}");
            self.fault
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .get_or_insert(msg);
            None
        };
        let (Some(source), Some(dir)) = (&self.source, &self.dir) else {
            return fail("no repository to read them from".into());
        };
        // The damaged table is not trusted again, by this run or the next.
        let _ = std::fs::remove_file(&bad.table.path);
        let ids: Vec<(ObjectId, u64)> = bad
            .table
            .files
            .iter()
            .map(|f| f.id)
            .filter(|id| self.live.contains(id))
            .map(|id| (id, 0))
            .collect();
        let mut notes = Vec::new();
        let fresh = build_fresh(&**source, dir, &self.key, ids, &mut notes);
        if let Some((_, f)) = fresh.failed.first() {
            return fail(f.to_string());
        }
        if !fresh.in_memory.is_empty() || fresh.tables.len() != 1 {
            return fail(notes.join("; "));
        }
        let Some(t) = fresh.tables.into_iter().next() else {
            return fail("nothing was built".into());
        };
        let t = Arc::new(t);
        // Same packs, in the same places: positions come from the pack list.
        let to_pack = t
            .packs
            .iter()
            .map(|p| self.pack_pos.get(&p.id).copied().unwrap_or(NOWHERE))
            .collect();
        let loaded = Arc::new(Loaded { table: t, to_pack });
        *self.tables[i].write().unwrap_or_else(|p| p.into_inner()) = loaded.clone();
        self.notes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(format!("index table rebuilt from the index files: {e}"));
        Some(loaded)
    }

    /// Every location of a blob: the first, then the alternates.
    pub fn locations(&self, id: &BlobId) -> std::vec::IntoIter<BlobLoc> {
        let mut out = self.table_locations(id, false);
        if let Some(more) = self.overlay.get(id) {
            for l in more {
                if !self.dead.contains(&l.pack) && !out.iter().any(|o| o.pack == l.pack) {
                    out.push(*l);
                }
            }
        }
        out.into_iter()
    }

    /// Whether a pack is indexed.
    pub fn has_pack(&self, id: &ObjectId) -> bool {
        self.pack_pos.contains_key(id)
    }

    /// Frees the tables' filters (1.25 bytes a blob), for a run that
    /// makes few lookups beside a large structure of its own (prune, beside
    /// its used set): a lookup then reads a page in every table.
    pub fn drop_filters(&self) {
        for slot in &self.tables {
            slot.read()
                .unwrap_or_else(|p| p.into_inner())
                .table
                .drop_filter();
        }
    }

    /// Location of a blob.
    pub fn get(&self, id: &BlobId) -> Option<BlobLoc> {
        // The first of `locations`, without reading the tables after it.
        if let Some(l) = self.table_locations(id, true).first() {
            return Some(*l);
        }
        self.overlay
            .get(id)?
            .iter()
            .find(|l| !self.dead.contains(&l.pack))
            .copied()
    }

    /// Whether a blob is indexed.
    pub fn contains(&self, id: &BlobId) -> bool {
        self.get(id).is_some()
    }

    /// Pack ID at a position.
    pub fn pack_id(&self, pos: u32) -> ObjectId {
        self.packs[pos as usize].id
    }

    /// Every pack.
    pub fn packs(&self) -> &[PackInfo] {
        &self.packs
    }

    /// Index files merged (not superseded).
    pub fn files(&self) -> &[ObjectId] {
        &self.files
    }

    /// Listed index files that a merged one supersedes: a prune deletes
    /// them (what they held is in the file that supersedes them).
    pub fn leftover_files(&self) -> &[ObjectId] {
        &self.leftover
    }

    /// A table that went bad during this run and could not be rebuilt:
    /// some blobs may be missing from lookups, so nothing may be deleted
    /// on what the index says.
    pub fn fault(&self) -> Option<String> {
        self.fault.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// What was done to the local tables that is worth a line.
    pub fn notes(&self) -> Vec<String> {
        self.notes.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Every blob with its first location, in blob ID order, read a page
    /// at a time.
    pub fn iter(&self) -> impl Iterator<Item = (BlobId, BlobLoc)> + '_ {
        self.iter_all().map(|(id, locs)| (id, locs[0]))
    }

    /// Every blob with all its locations (the first, then alternates), in
    /// blob ID order, read a page at a time.
    pub fn iter_all(&self) -> impl Iterator<Item = (BlobId, Vec<BlobLoc>)> + '_ {
        let scans: Vec<(set::Scan, Arc<Loaded>)> = self
            .tables
            .iter()
            .map(|s| {
                let l = s.read().unwrap_or_else(|p| p.into_inner()).clone();
                (set::Scan::new(l.table.clone()), l)
            })
            .collect();
        let mut overlay: Vec<(&BlobId, &Vec<BlobLoc>)> = self.overlay.iter().collect();
        overlay.sort_by_key(|(id, _)| **id);
        Iter {
            index: self,
            heads: vec![None; scans.len()],
            scans,
            heap: BinaryHeap::new(),
            started: false,
            overlay,
            at: 0,
        }
    }

    /// Number of blobs (reads every table).
    pub fn len(&self) -> usize {
        self.iter().count()
    }

    /// True when no blob is indexed.
    pub fn is_empty(&self) -> bool {
        self.iter().next().is_none()
    }
}

/// [`MasterIndex::iter`]: a merge of the tables' scans and the overlay.
struct Iter<'a> {
    index: &'a MasterIndex,
    scans: Vec<(set::Scan, Arc<Loaded>)>,
    /// Each scan's next live entry, by blob ID then table.
    heap: BinaryHeap<std::cmp::Reverse<(BlobId, usize)>>,
    /// Where each scan's entry in the heap is.
    heads: Vec<Option<BlobLoc>>,
    started: bool,
    overlay: Vec<(&'a BlobId, &'a Vec<BlobLoc>)>,
    at: usize,
}

impl Iter<'_> {
    /// Puts scan `i`'s next live entry in the heap.
    fn advance(&mut self, i: usize) {
        self.heads[i] = None;
        while let Some(r) = self.scans[i].0.next() {
            match r {
                Ok(e) => {
                    let pos = self.scans[i].1.to_pack[e.slot as usize];
                    if pos == NOWHERE || self.index.dead.contains(&pos) {
                        continue;
                    }
                    self.heap.push(std::cmp::Reverse((e.id, i)));
                    self.heads[i] = Some(BlobLoc {
                        pack: pos,
                        blob_type: e.blob_type,
                        offset: e.offset,
                        length: e.length,
                        raw_length: e.raw_length,
                    });
                    return;
                }
                Err(e) => {
                    self.index
                        .fault
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .get_or_insert(format!("reading the whole index: {e}"));
                    return;
                }
            }
        }
    }
}

impl Iterator for Iter<'_> {
    type Item = (BlobId, Vec<BlobLoc>);
    fn next(&mut self) -> Option<Self::Item> {
        if !self.started {
            self.started = true;
            for i in 0..self.scans.len() {
                self.advance(i);
            }
        }
        loop {
            let table_head = self.heap.peek().map(|r| r.0 .0);
            let over_head = self.overlay.get(self.at).map(|(id, _)| **id);
            let id = match (table_head, over_head) {
                (None, None) => return None,
                (Some(t), Some(o)) => t.min(o),
                (Some(t), None) => t,
                (None, Some(o)) => o,
            };
            let mut found: Vec<BlobLoc> = Vec::new();
            while self.heap.peek().is_some_and(|r| r.0 .0 == id) {
                let Some(std::cmp::Reverse((_, i))) = self.heap.pop() else {
                    break;
                };
                if let Some(l) = self.heads[i] {
                    if !found.iter().any(|f| f.pack == l.pack) {
                        found.push(l);
                    }
                }
                self.advance(i);
            }
            if over_head == Some(id) {
                for l in self.overlay[self.at].1 {
                    if !self.index.dead.contains(&l.pack) && !found.iter().any(|f| f.pack == l.pack)
                    {
                        found.push(*l);
                    }
                }
                self.at += 1;
            }
            if !found.is_empty() {
                return Some((id, found));
            }
        }
    }
}

/// What the index needs from a repository, and no more: list the objects of
/// a kind, read one back authenticated, store one sealed. The repository
/// implements it over its backend and key; tests implement it in memory, so
/// the index is loaded and saved without a whole repository.
pub trait SealedStore: Sync {
    /// Names and stored sizes of every object of kind `t` (the sizes
    /// bound how many index files are read at once).
    fn list(&self, t: FileType) -> Result<Vec<(String, u64)>>;
    /// The plaintext of object `id` of kind `t`, after checking that its
    /// bytes hash to its name and authenticating them with `aad`.
    fn read_sealed(&self, t: FileType, id: &ObjectId, aad: Aad<'_>) -> Result<Vec<u8>>;
    /// Seals `plain` with `aad`, stores it under its hash; returns the ID.
    fn write_sealed(&self, t: FileType, aad: Aad<'_>, plain: &[u8]) -> Result<ObjectId>;
    /// Index files to read at once: the destination's concurrency.
    fn reads_in_flight(&self) -> usize {
        rayon::current_num_threads().max(1)
    }
    /// Where this machine keeps the index's tables. Without one, they are
    /// made in a temporary directory for the process.
    fn index_home(&self) -> IndexHome {
        IndexHome {
            dir: None,
            key: [0; 32],
            source: None,
        }
    }
}

/// Reads and decodes one index file.
pub fn load_index_file(store: &dyn SealedStore, id: &ObjectId) -> Result<IndexFile> {
    let p = store.read_sealed(FileType::Index, id, Aad::Index)?;
    decode_index(&p).map_err(|e| EngineError::corrupt(FileType::Index.name(id), e))
}

/// Encrypts and stores an index file; returns its ID.
pub fn save_index_file(store: &dyn SealedStore, f: &IndexFile) -> Result<ObjectId> {
    store.write_sealed(FileType::Index, Aad::Index, &encode_index(f))
}

#[cfg(test)]
mod tests;
