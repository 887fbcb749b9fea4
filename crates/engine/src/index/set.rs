//! The tables of one repository on this machine: which to use, building
//! tables for index files no table covers yet, and merging tables so that
//! a lookup reads few of them (docs/DESIGN.md, "The index on disk").
//!
//! Tables are named by the index files they cover, so two processes that
//! build or merge at once write the same bytes under the same name, each
//! renamed into place whole: neither ever reads a half-written table. A
//! table found damaged is deleted and its index files read again.

use std::collections::{BTreeMap, BinaryHeap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use capsule_format::index::IndexFile;
use capsule_format::{BlobId, ObjectId};

use super::table::{Entry, FileMeta, Page, Table, TableError, TablePack, Writer};

/// Entries a table built from index files holds at most: what is sorted
/// in memory at once (48 bytes each, and about as much again for the
/// decoded index files), so that a first run on a large repository builds
/// many small tables and merges them, in bounded memory.
#[cfg(not(test))]
pub(crate) const BUILD_ENTRIES: usize = 256 * 1024;
/// Small in tests, so that their index files are built in parts.
#[cfg(test)]
pub(crate) const BUILD_ENTRIES: usize = 50;

/// Tables a lookup may have to read before a merge is started.
pub(crate) const MAX_TABLES: usize = 4;

/// Builds one table, unnamed, from index files or parts of them (sorted in
/// memory; callers keep each call near [`BUILD_ENTRIES`]): for a merge to
/// take in, or to be published when it is the only one.
pub(crate) fn build(
    dir: &Path,
    key: &[u8; 32],
    files: &[(ObjectId, IndexFile)],
) -> Result<PathBuf, TableError> {
    let mut sorted: Vec<&(ObjectId, IndexFile)> = files.iter().collect();
    sorted.sort_by_key(|(id, _)| *id);
    let mut metas = Vec::with_capacity(sorted.len());
    let mut packs = Vec::new();
    let mut entries = Vec::new();
    for (fi, (id, f)) in sorted.iter().enumerate() {
        metas.push(FileMeta {
            id: *id,
            supersedes: f.supersedes.clone(),
        });
        for p in &f.packs {
            let slot = packs.len() as u32;
            packs.push(TablePack {
                id: p.id,
                size: p.size,
                blob_type: p
                    .entries
                    .first()
                    .map_or(capsule_format::BlobType::Data, |e| e.blob_type),
                file: fi as u32,
            });
            for e in &p.entries {
                entries.push(Entry {
                    id: e.id,
                    slot,
                    blob_type: e.blob_type,
                    offset: e.offset,
                    length: e.length,
                    raw_length: e.raw_length,
                });
            }
        }
    }
    // Stable: the same blob twice in one pack's listing keeps its first
    // place, as the in-memory index did.
    entries.sort_by_key(|e| (e.id, e.slot));
    entries.dedup_by_key(|e| (e.id, e.slot));
    let mut w = Writer::create(dir, key, metas, packs)?;
    for e in &entries {
        w.push(e)?;
    }
    w.finish_unnamed()
}

/// Reads a table's entries in order, a page at a time.
pub(crate) struct Scan {
    table: Arc<Table>,
    next_page: u64,
    page: Option<Page>,
    at: usize,
}

impl Scan {
    pub fn new(table: Arc<Table>) -> Self {
        Scan {
            table,
            next_page: 0,
            page: None,
            at: 0,
        }
    }
}

impl Iterator for Scan {
    type Item = Result<Entry, TableError>;
    fn next(&mut self) -> Option<Self::Item> {
        loop {
            if let Some(p) = &self.page {
                if self.at < p.len() {
                    self.at += 1;
                    return Some(Ok(p.entry(self.at - 1)));
                }
            }
            if self.next_page >= self.table.pages() {
                return None;
            }
            match self.table.page_checked(self.next_page) {
                Ok(p) => {
                    self.page = Some(p);
                    self.at = 0;
                    self.next_page += 1;
                }
                Err(e) => {
                    self.next_page = self.table.pages();
                    return Some(Err(e));
                }
            }
        }
    }
}

/// Merges `inputs` into one table holding their live entries: those of
/// packs listed by an index file in `live`. Streams: memory is a page per
/// input and the packs.
pub(crate) fn merge(
    dir: &Path,
    key: &[u8; 32],
    inputs: &[Arc<Table>],
    live: &HashSet<ObjectId>,
) -> Result<PathBuf, TableError> {
    // Files in ID order, each with its packs in their listed order: the
    // slots a build from the index files themselves would give.
    // A file in several inputs is one built in parts: its packs follow in
    // input order, which is the parts' order.
    let mut files: BTreeMap<ObjectId, Vec<(usize, u32)>> = BTreeMap::new();
    for (t, table) in inputs.iter().enumerate() {
        for (fi, f) in table.files.iter().enumerate() {
            if live.contains(&f.id) {
                files.entry(f.id).or_default().push((t, fi as u32));
            }
        }
    }
    let mut metas = Vec::new();
    let mut packs = Vec::new();
    // Per input, old slot -> new slot.
    let mut remap: Vec<Vec<Option<u32>>> =
        inputs.iter().map(|t| vec![None; t.packs.len()]).collect();
    for parts in files.values() {
        let new_fi = metas.len() as u32;
        let (t0, fi0) = parts[0];
        metas.push(inputs[t0].files[fi0 as usize].clone());
        for &(t, fi) in parts {
            for (slot, p) in inputs[t].packs.iter().enumerate() {
                if p.file == fi {
                    remap[t][slot] = Some(packs.len() as u32);
                    packs.push(TablePack { file: new_fi, ..*p });
                }
            }
        }
    }
    let mut w = Writer::create(dir, key, metas, packs)?;
    let mut scans: Vec<Scan> = inputs.iter().map(|t| Scan::new(t.clone())).collect();
    let mut heap = BinaryHeap::new();
    for (i, s) in scans.iter_mut().enumerate() {
        if let Some(e) = s.next() {
            let e = e?;
            heap.push(std::cmp::Reverse(Head(e, i)));
        }
    }
    let mut last: Option<(BlobId, u32)> = None;
    let mut pending: Vec<Entry> = Vec::new();
    while let Some(std::cmp::Reverse(Head(e, i))) = heap.pop() {
        if let Some(next) = scans[i].next() {
            heap.push(std::cmp::Reverse(Head(next?, i)));
        }
        let Some(slot) = remap[i][e.slot as usize] else {
            continue;
        };
        // New slots need not follow the old order across inputs: gather a
        // blob's entries, then write them sorted.
        if pending.first().is_some_and(|p| p.id != e.id) {
            flush(&mut w, &mut pending, &mut last)?;
        }
        pending.push(Entry { slot, ..e });
    }
    flush(&mut w, &mut pending, &mut last)?;
    w.finish()
}

fn flush(
    w: &mut Writer,
    pending: &mut Vec<Entry>,
    last: &mut Option<(BlobId, u32)>,
) -> Result<(), TableError> {
    pending.sort_by_key(|e| e.slot);
    for e in pending.drain(..) {
        if *last == Some((e.id, e.slot)) {
            continue;
        }
        *last = Some((e.id, e.slot));
        w.push(&e)?;
    }
    Ok(())
}

/// A scan's head entry, ordered by blob ID then input.
struct Head(Entry, usize);

impl PartialEq for Head {
    fn eq(&self, o: &Self) -> bool {
        (self.0.id, self.1) == (o.0.id, o.1)
    }
}
impl Eq for Head {}
impl PartialOrd for Head {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Head {
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        (self.0.id, self.0.slot, self.1).cmp(&(o.0.id, o.0.slot, o.1))
    }
}

/// The tables in `dir` that this repository's key wrote; damaged ones are
/// deleted (they are rebuilt from the index files), and each is named in
/// `notes`. Temporary files whose writer is gone are removed.
pub(crate) fn open_all(dir: &Path, key: &[u8; 32], notes: &mut Vec<String>) -> Vec<Table> {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for e in rd.flatten() {
        let name = e.file_name();
        let name = name.to_string_lossy();
        let path = e.path();
        if let Some(rest) = name.strip_prefix(".tmp-") {
            // A build or merge under way, or one whose process died (a
            // command that ended while its merge ran behind): the name
            // carries the writer's process ID, so a dead writer's file,
            // which can be the size of the whole index, goes at once.
            let writer_alive = rest
                .split('-')
                .next()
                .and_then(|p| p.parse::<u32>().ok())
                .is_some_and(|pid| Path::new("/proc").join(pid.to_string()).exists());
            let old = e
                .metadata()
                .and_then(|m| m.modified())
                .ok()
                .and_then(|t| t.elapsed().ok())
                .is_some_and(|age| age.as_secs() > 24 * 3600);
            if !writer_alive || old {
                let _ = std::fs::remove_file(&path);
            }
            continue;
        }
        if !name.ends_with(".tbl") {
            continue;
        }
        match Table::open(&path, key) {
            Ok(t) => out.push(t),
            // Gone between the listing and the open: another process
            // merged it away.
            Err(TableError::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => {
            }
            Err(TableError::Older { .. }) => {
                let _ = std::fs::remove_file(&path);
            }
            Err(e) => {
                notes.push(format!("index table rebuilt from the index files: {e}"));
                let _ = std::fs::remove_file(&path);
            }
        }
    }
    out
}

/// Chooses tables that cover disjoint sets of index files, the largest
/// first; tables wholly covered by chosen ones, or covering only files
/// that are gone, are deleted.
pub(crate) fn choose(tables: Vec<Table>, listed: &HashSet<ObjectId>) -> Vec<Table> {
    let mut tables = tables;
    tables.sort_by(|a, b| b.entries.cmp(&a.entries).then(a.id.cmp(&b.id)));
    let mut covered: HashSet<ObjectId> = HashSet::new();
    let mut chosen = Vec::new();
    for t in tables {
        let useful = t.files.iter().any(|f| listed.contains(&f.id));
        let overlaps = t.files.iter().any(|f| covered.contains(&f.id));
        if !useful
            || (overlaps
                && t.files
                    .iter()
                    .all(|f| covered.contains(&f.id) || !listed.contains(&f.id)))
        {
            let _ = std::fs::remove_file(&t.path);
            continue;
        }
        if overlaps {
            continue;
        }
        covered.extend(t.files.iter().map(|f| f.id));
        chosen.push(t);
    }
    chosen
}

/// Which tables to merge now, if any: when there are more than
/// [`MAX_TABLES`], the smallest ones, growing the set while the next is
/// no more than twice what is already taken (so large tables are
/// rewritten rarely); any table that is mostly dead is taken too.
pub(crate) fn to_merge(sizes: &[(u64, u64)]) -> Vec<usize> {
    // (entries, live entries) per table.
    let mut order: Vec<usize> = (0..sizes.len()).collect();
    order.sort_by_key(|&i| sizes[i].0);
    let mostly_dead = |i: usize| sizes[i].1 * 2 < sizes[i].0;
    if sizes.len() <= MAX_TABLES {
        return order.into_iter().filter(|&i| mostly_dead(i)).collect();
    }
    let must = sizes.len() - MAX_TABLES + 1;
    let mut taken = Vec::new();
    let mut sum = 0u64;
    for i in order {
        if taken.len() < must || sizes[i].0 <= 2 * sum.max(1) || mostly_dead(i) {
            sum += sizes[i].0;
            taken.push(i);
        }
    }
    taken
}

/// Counts live entries of a table by its packs (the footer knows which
/// pack each slot is, not how many entries it has): an estimate from the
/// live packs' share.
pub(crate) fn live_share(t: &Table, live: &HashSet<ObjectId>) -> u64 {
    if t.packs.is_empty() {
        return 0;
    }
    let live_packs = t
        .packs
        .iter()
        .filter(|p| live.contains(&t.files[p.file as usize].id))
        .count() as u64;
    t.entries * live_packs / t.packs.len() as u64
}

/// The files a set of tables cover, by ID.
pub(crate) fn coverage(tables: &[Table]) -> HashMap<ObjectId, Vec<ObjectId>> {
    tables
        .iter()
        .flat_map(|t| t.files.iter().map(|f| (f.id, f.supersedes.clone())))
        .collect()
}
