//! The in-memory index this crate used before the tables: the model the
//! tables must answer as (property tests in `super::tests`).

use std::collections::{HashMap, HashSet};

use capsule_format::index::IndexPack;
use capsule_format::{BlobId, BlobType, ObjectId};

use super::{BlobLoc, PackInfo};

/// All index files merged.
#[derive(Debug, Default)]
pub struct Model {
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

impl Model {
    /// Counts an index file as merged.
    pub fn note_file(&mut self, id: ObjectId) {
        self.files.push(id);
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
