//! The in-memory master index: blob ID → (pack, offset, length), merged from
//! every index file in the repository.
//!
//! Memory is about 100 bytes per blob. With 1 MiB average chunks that is
//! 100 MB per 1 TB of unique data; a sorted on-disk index replaces this
//! before repositories grow past that (see docs/DESIGN.md).

use std::collections::{BTreeMap, HashMap, HashSet};

use capsule_crypto::Aad;
use capsule_format::index::{decode_index, encode_index, IndexFile, IndexPack};
use capsule_format::FileType;
use capsule_format::{BlobId, BlobType, ObjectId};
use rayon::prelude::*;

use crate::error::{EngineError, Result};

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

/// All index files merged.
#[derive(Debug, Default)]
pub struct MasterIndex {
    map: HashMap<BlobId, BlobLoc>,
    /// Further locations of blobs stored more than once (concurrent
    /// backups, or data uploaded again after its pack was lost): readers
    /// fall back to them when the first location fails. Rare, so kept
    /// apart from `map`.
    alternates: HashMap<BlobId, Vec<BlobLoc>>,
    packs: Vec<PackInfo>,
    pack_pos: HashMap<ObjectId, u32>,
    files: Vec<ObjectId>,
}

/// Listings taken again when index files vanish while being read.
const VANISHED_RETRIES: usize = 5;

fn is_not_found(e: &EngineError) -> bool {
    matches!(e, EngineError::Backend(b) if b.kind == capsule_backend::ErrorKind::NotFound)
}

impl MasterIndex {
    /// Loads and merges every index file of `store`. Index files that fail to
    /// read, authenticate or decode are returned as errors; the rest load.
    pub fn load(store: &dyn SealedStore) -> Result<(Self, Vec<EngineError>)> {
        // A prune deletes index files once the file superseding them is
        // stored. One read between the two finds a listed file gone; the
        // listing taken again then holds the file that replaced it. Bounded:
        // a destination that keeps losing files is reported as it is.
        let mut good: BTreeMap<ObjectId, IndexFile> = BTreeMap::new();
        let mut bad = Vec::new();
        for attempt in 0..VANISHED_RETRIES {
            let objs = store.list(FileType::Index)?;
            let loaded: Vec<Result<(ObjectId, IndexFile)>> = objs
                .par_iter()
                .filter_map(|o| {
                    let id: ObjectId = match o.trim_start_matches(FileType::Index.prefix()).parse()
                    {
                        Ok(id) => id,
                        Err(_) => return Some(Err(EngineError::corrupt(o, "name is not an ID"))),
                    };
                    if good.contains_key(&id) {
                        return None;
                    }
                    Some(load_index_file(store, &id).map(|f| (id, f)))
                })
                .collect();
            let (ok, failed) = crate::flight::partition(loaded);
            good.extend(ok);
            let vanished = failed.iter().any(is_not_found);
            bad = failed;
            if !vanished || attempt + 1 == VANISHED_RETRIES {
                break;
            }
        }
        let good: Vec<(ObjectId, IndexFile)> = good.into_iter().collect();
        let superseded: HashSet<ObjectId> = good
            .iter()
            .flat_map(|(_, f)| f.supersedes.iter().copied())
            .collect();
        let mut idx = MasterIndex::default();
        for (id, f) in good {
            if superseded.contains(&id) {
                continue;
            }
            idx.files.push(id);
            for p in &f.packs {
                idx.add_pack(p);
            }
        }
        Ok((idx, bad))
    }

    /// Adds the blobs of one pack. A blob already indexed elsewhere keeps its
    /// first location; this one becomes an alternate.
    pub fn add_pack(&mut self, p: &IndexPack) {
        let pos = match self.pack_pos.get(&p.id) {
            Some(&pos) => pos,
            None => {
                let pos = self.packs.len() as u32;
                self.packs.push(PackInfo {
                    id: p.id,
                    size: p.size,
                    blob_type: p
                        .entries
                        .first()
                        .map(|e| e.blob_type)
                        .unwrap_or(BlobType::Data),
                });
                self.pack_pos.insert(p.id, pos);
                pos
            }
        };
        for e in &p.entries {
            let loc = BlobLoc {
                pack: pos,
                blob_type: e.blob_type,
                offset: e.offset,
                length: e.length,
                raw_length: e.raw_length,
            };
            match self.map.entry(e.id) {
                std::collections::hash_map::Entry::Vacant(v) => {
                    v.insert(loc);
                }
                std::collections::hash_map::Entry::Occupied(o) => {
                    if o.get().pack != pos {
                        let alts = self.alternates.entry(e.id).or_default();
                        if !alts.iter().any(|a| a.pack == pos) {
                            alts.push(loc);
                        }
                    }
                }
            }
        }
    }

    /// Drops every location in the given packs (known missing or damaged),
    /// so their blobs count as not stored: a backup uploads them again
    /// instead of referencing lost data. Returns the blobs that no longer
    /// have any location.
    pub fn forget_packs(&mut self, bad: &HashSet<ObjectId>) -> usize {
        let bad_pos: HashSet<u32> = bad
            .iter()
            .filter_map(|id| self.pack_pos.get(id).copied())
            .collect();
        if bad_pos.is_empty() {
            return 0;
        }
        for alts in self.alternates.values_mut() {
            alts.retain(|l| !bad_pos.contains(&l.pack));
        }
        let mut lost = 0;
        let alternates = &mut self.alternates;
        self.map.retain(|id, loc| {
            if !bad_pos.contains(&loc.pack) {
                return true;
            }
            match alternates.get_mut(id).and_then(|a| a.pop()) {
                Some(alt) => {
                    *loc = alt;
                    true
                }
                None => {
                    lost += 1;
                    false
                }
            }
        });
        self.alternates.retain(|_, a| !a.is_empty());
        lost
    }

    /// Every location of a blob: the first, then the alternates.
    pub fn locations(&self, id: &BlobId) -> impl Iterator<Item = &BlobLoc> {
        self.map
            .get(id)
            .into_iter()
            .chain(self.alternates.get(id).into_iter().flatten())
    }

    /// Whether a pack is indexed.
    pub fn has_pack(&self, id: &ObjectId) -> bool {
        self.pack_pos.contains_key(id)
    }

    /// Location of a blob.
    pub fn get(&self, id: &BlobId) -> Option<&BlobLoc> {
        self.map.get(id)
    }

    /// Whether a blob is indexed.
    pub fn contains(&self, id: &BlobId) -> bool {
        self.map.contains_key(id)
    }

    /// Pack ID at a position.
    pub fn pack_id(&self, pos: u32) -> ObjectId {
        self.packs[pos as usize].id
    }

    /// Every pack.
    pub fn packs(&self) -> &[PackInfo] {
        &self.packs
    }

    /// Number of blobs.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// True when no blob is indexed.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// Index files merged (not superseded).
    pub fn files(&self) -> &[ObjectId] {
        &self.files
    }

    /// Iterates over every blob.
    pub fn iter(&self) -> impl Iterator<Item = (&BlobId, &BlobLoc)> {
        self.map.iter()
    }
}

/// What the index needs from a repository, and no more: list the objects of
/// a kind, read one back authenticated, store one sealed. The repository
/// implements it over its backend and key; tests implement it in memory, so
/// the index is loaded and saved without a whole repository.
pub trait SealedStore: Sync {
    /// Names of every object of kind `t`.
    fn list(&self, t: FileType) -> Result<Vec<String>>;
    /// The plaintext of object `id` of kind `t`, after checking that its
    /// bytes hash to its name and authenticating them with `aad`.
    fn read_sealed(&self, t: FileType, id: &ObjectId, aad: Aad<'_>) -> Result<Vec<u8>>;
    /// Seals `plain` with `aad`, stores it under its hash; returns the ID.
    fn write_sealed(&self, t: FileType, aad: Aad<'_>, plain: &[u8]) -> Result<ObjectId>;
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
mod tests {
    #![allow(clippy::unwrap_used)]
    use std::collections::BTreeMap;
    use std::sync::Mutex;

    use capsule_format::pack::PackEntry;

    use super::*;

    /// Objects in memory, "sealed" as plaintext: what the index needs and
    /// nothing of a repository.
    #[derive(Default)]
    struct MemStore(Mutex<BTreeMap<String, Vec<u8>>>);

    impl SealedStore for MemStore {
        fn list(&self, t: FileType) -> Result<Vec<String>> {
            let m = self.0.lock().unwrap();
            Ok(m.keys()
                .filter(|k| k.starts_with(t.prefix()))
                .cloned()
                .collect())
        }
        fn read_sealed(&self, t: FileType, id: &ObjectId, _: Aad<'_>) -> Result<Vec<u8>> {
            let name = t.name(id);
            let m = self.0.lock().unwrap();
            m.get(&name)
                .cloned()
                .ok_or_else(|| EngineError::corrupt(&name, "missing"))
        }
        fn write_sealed(&self, t: FileType, _: Aad<'_>, plain: &[u8]) -> Result<ObjectId> {
            let id = ObjectId::of(plain);
            self.0.lock().unwrap().insert(t.name(&id), plain.to_vec());
            Ok(id)
        }
    }

    fn pack(seed: u8, blobs: &[u8]) -> IndexPack {
        IndexPack {
            id: ObjectId::of(&[seed]),
            size: 1000,
            entries: blobs
                .iter()
                .enumerate()
                .map(|(i, b)| PackEntry {
                    blob_type: BlobType::Data,
                    id: BlobId(capsule_format::Id([*b; 32])),
                    offset: i as u32 * 100,
                    length: 100,
                    raw_length: 90,
                })
                .collect(),
        }
    }

    #[test]
    fn superseded_files_drop_out_and_duplicates_become_alternates() {
        let store = MemStore::default();
        let a = save_index_file(
            &store,
            &IndexFile {
                supersedes: vec![],
                packs: vec![pack(1, &[1, 2])],
            },
        )
        .unwrap();
        save_index_file(
            &store,
            &IndexFile {
                supersedes: vec![],
                packs: vec![pack(2, &[2, 3])],
            },
        )
        .unwrap();
        let (idx, bad) = MasterIndex::load(&store).unwrap();
        assert!(bad.is_empty());
        assert_eq!((idx.packs().len(), idx.len()), (2, 3));
        assert_eq!(
            idx.locations(&BlobId(capsule_format::Id([2; 32]))).count(),
            2
        );

        // A rewrite superseding the first file, without its pack.
        save_index_file(
            &store,
            &IndexFile {
                supersedes: vec![a],
                packs: vec![],
            },
        )
        .unwrap();
        let (idx, _) = MasterIndex::load(&store).unwrap();
        assert_eq!(idx.packs().len(), 1);
        assert!(!idx.contains(&BlobId(capsule_format::Id([1; 32]))));
        assert!(idx.contains(&BlobId(capsule_format::Id([3; 32]))));

        // A damaged file is reported, the rest still load.
        store
            .0
            .lock()
            .unwrap()
            .insert(FileType::Index.name_hex(&"ab".repeat(32)), vec![9, 9]);
        let (idx, bad) = MasterIndex::load(&store).unwrap();
        assert_eq!(bad.len(), 1);
        assert_eq!(idx.packs().len(), 1);
    }
}
