//! The tables answer as the in-memory index did ([`super::model`]), over
//! random sequences of index files written, superseded and deleted, tables
//! merged behind, damaged and half-written.

#![allow(clippy::unwrap_used)]
use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use capsule_format::pack::PackEntry;
use proptest::prelude::*;

use super::model::Model;
use super::*;

/// Objects in memory, "sealed" as plaintext: what the index needs and
/// nothing of a repository; its tables in a directory of its own.
#[derive(Clone)]
struct MemStore {
    objs: Arc<Mutex<BTreeMap<String, Vec<u8>>>>,
    /// Names listed but not there: a deleted object a distributed store
    /// still lists (a node that missed the delete, until it heals).
    ghosts: Arc<Mutex<BTreeSet<String>>>,
    dir: Arc<tempfile::TempDir>,
}

impl MemStore {
    fn new() -> Self {
        MemStore {
            objs: Arc::default(),
            ghosts: Arc::default(),
            dir: Arc::new(tempfile::tempdir().unwrap()),
        }
    }
    fn tables(&self) -> PathBuf {
        self.dir.path().join("tables")
    }
    fn table_files(&self) -> Vec<PathBuf> {
        let mut v: Vec<PathBuf> = std::fs::read_dir(self.tables())
            .map(|rd| rd.flatten().map(|e| e.path()).collect())
            .unwrap_or_default();
        v.retain(|p| p.extension().is_some_and(|e| e == "tbl"));
        v.sort();
        v
    }
}

impl SealedStore for MemStore {
    fn list(&self, t: FileType) -> Result<Vec<(String, u64)>> {
        let m = self.objs.lock().unwrap();
        let ghosts = self.ghosts.lock().unwrap();
        Ok(m.iter()
            .map(|(k, v)| (k.clone(), v.len() as u64))
            .chain(ghosts.iter().map(|k| (k.clone(), 0)))
            .filter(|(k, _)| k.starts_with(t.prefix()))
            .collect())
    }
    fn read_sealed(&self, t: FileType, id: &ObjectId, _: Aad<'_>) -> Result<Vec<u8>> {
        let name = t.name(id);
        let m = self.objs.lock().unwrap();
        m.get(&name).cloned().ok_or_else(|| {
            EngineError::Backend(capsule_backend::BackendError::new(
                capsule_backend::ErrorKind::NotFound,
                "get",
                &name,
                "missing",
            ))
        })
    }
    fn write_sealed(&self, t: FileType, _: Aad<'_>, plain: &[u8]) -> Result<ObjectId> {
        let id = ObjectId::of(plain);
        self.objs
            .lock()
            .unwrap()
            .insert(t.name(&id), plain.to_vec());
        Ok(id)
    }
    fn index_home(&self) -> IndexHome {
        IndexHome {
            dir: Some(self.tables()),
            key: [7; 32],
            source: Some(Arc::new(self.clone())),
        }
    }
}

fn blob(b: u8) -> BlobId {
    BlobId(capsule_format::Id([b; 32]))
}

fn pack(seed: u64, blobs: &[u8]) -> IndexPack {
    IndexPack {
        id: ObjectId::of(&seed.to_le_bytes()),
        size: 1000 + seed,
        entries: blobs
            .iter()
            .enumerate()
            .map(|(i, b)| PackEntry {
                blob_type: if b % 5 == 0 {
                    BlobType::Tree
                } else {
                    BlobType::Data
                },
                id: blob(*b),
                offset: i as u32 * 100,
                length: 100 + u32::from(*b),
                raw_length: 90,
            })
            .collect(),
    }
}

/// What the in-memory index loaded from `store`, as it did: every
/// readable file not superseded by another, in ID order.
fn model_of(store: &MemStore) -> Model {
    let mut files: BTreeMap<ObjectId, IndexFile> = BTreeMap::new();
    for (name, _) in store.list(FileType::Index).unwrap() {
        let id: ObjectId = name
            .trim_start_matches(FileType::Index.prefix())
            .parse()
            .unwrap();
        files.insert(id, load_index_file(store, &id).unwrap());
    }
    let superseded: HashSet<ObjectId> = files
        .values()
        .flat_map(|f| f.supersedes.iter().copied())
        .collect();
    let mut m = Model::default();
    for (id, f) in &files {
        if !superseded.contains(id) {
            m.note_file(*id);
            for p in &f.packs {
                m.add_pack(p);
            }
        }
    }
    m
}

type Loc = (ObjectId, BlobType, u32, u32, u32);

fn model_locs(m: &Model, id: &BlobId) -> BTreeSet<Loc> {
    m.locations(id)
        .map(|l| {
            (
                m.pack_id(l.pack),
                l.blob_type,
                l.offset,
                l.length,
                l.raw_length,
            )
        })
        .collect()
}

fn locs(idx: &MasterIndex, id: &BlobId) -> BTreeSet<Loc> {
    idx.locations(id)
        .map(|l| {
            (
                idx.pack_id(l.pack),
                l.blob_type,
                l.offset,
                l.length,
                l.raw_length,
            )
        })
        .collect()
}

/// Every question the index answers, asked of both.
fn same(idx: &MasterIndex, m: &Model) {
    for b in 0..=255u8 {
        let id = blob(b);
        let want = model_locs(m, &id);
        assert_eq!(locs(idx, &id), want, "locations of blob {b}");
        assert_eq!(idx.contains(&id), m.contains(&id), "blob {b}");
        if let Some(l) = idx.get(&id) {
            assert!(want.contains(&(
                idx.pack_id(l.pack),
                l.blob_type,
                l.offset,
                l.length,
                l.raw_length
            )));
        }
    }
    let packs = |v: &[PackInfo]| -> BTreeSet<(ObjectId, u64, BlobType)> {
        v.iter().map(|p| (p.id, p.size, p.blob_type)).collect()
    };
    assert_eq!(packs(idx.packs()), packs(m.packs()), "packs");
    for p in m.packs() {
        assert_eq!(idx.has_pack(&p.id), m.has_pack(&p.id));
    }
    assert_eq!(idx.is_empty(), m.is_empty());
    let ids: BTreeSet<BlobId> = idx.iter().map(|(id, _)| id).collect();
    let want: BTreeSet<BlobId> = m.iter().map(|(id, _)| *id).collect();
    assert_eq!(ids, want);
    for id in &want {
        let l = m.get(id).unwrap();
        assert!(model_locs(m, id).contains(&(
            m.pack_id(l.pack),
            l.blob_type,
            l.offset,
            l.length,
            l.raw_length
        )));
    }
    let mut files = m.files().to_vec();
    files.sort();
    assert_eq!(idx.files(), &files[..], "files");
    let all: Vec<(BlobId, Vec<BlobLoc>)> = idx.iter_all().collect();
    assert!(
        all.windows(2).all(|w| w[0].0 < w[1].0),
        "in ID order, once each"
    );
    assert_eq!(all.len(), m.len());
    for (id, ls) in &all {
        let got: BTreeSet<Loc> = ls
            .iter()
            .map(|l| {
                (
                    idx.pack_id(l.pack),
                    l.blob_type,
                    l.offset,
                    l.length,
                    l.raw_length,
                )
            })
            .collect();
        assert_eq!(got, model_locs(m, id));
    }
    assert_eq!(idx.fault(), None);
}

#[derive(Debug, Clone)]
enum Op {
    /// An index file of a few packs of the given blobs.
    Write(Vec<Vec<u8>>),
    /// A file superseding some (by position) and keeping some of their
    /// packs, as prune writes.
    Supersede(Vec<usize>, u8),
    /// Delete a listed file (as prune does after superseding it).
    Delete(usize),
    /// Load and compare.
    Load,
    /// Flip a byte of a table.
    Damage(usize, u16),
    /// Cut a table short.
    Truncate(usize, u16),
    /// Leave a half-written table behind, as a killed build does.
    HalfWritten,
    /// After a load: packs added, packs forgotten; compare.
    Overlay(Vec<u8>, usize),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => prop::collection::vec(prop::collection::vec(any::<u8>(), 1..40), 1..4).prop_map(Op::Write),
        1 => (prop::collection::vec(0..32usize, 1..4), any::<u8>()).prop_map(|(v, k)| Op::Supersede(v, k)),
        1 => (0..32usize).prop_map(Op::Delete),
        3 => Just(Op::Load),
        1 => (0..8usize, any::<u16>()).prop_map(|(t, at)| Op::Damage(t, at)),
        1 => (0..8usize, any::<u16>()).prop_map(|(t, at)| Op::Truncate(t, at)),
        1 => Just(Op::HalfWritten),
        1 => (prop::collection::vec(any::<u8>(), 1..20), 0..8usize).prop_map(|(v, k)| Op::Overlay(v, k)),
    ]
}

fn run(ops: &[Op]) {
    let store = MemStore::new();
    let mut seed = 0u64;
    let mut written: Vec<ObjectId> = Vec::new();
    for op in ops {
        match op {
            Op::Write(packs) => {
                let packs = packs
                    .iter()
                    .map(|b| {
                        seed += 1;
                        pack(seed, b)
                    })
                    .collect();
                let f = IndexFile {
                    supersedes: vec![],
                    packs,
                };
                written.push(save_index_file(&store, &f).unwrap());
            }
            Op::Supersede(which, keep) => {
                if written.is_empty() {
                    continue;
                }
                let mut sup = Vec::new();
                let mut packs = Vec::new();
                for w in which {
                    let id = written[w % written.len()];
                    if let Ok(f) = load_index_file(&store, &id) {
                        sup.push(id);
                        packs.extend(
                            f.packs
                                .into_iter()
                                .enumerate()
                                .filter(|(i, _)| (keep >> (i % 8)) & 1 == 1)
                                .map(|(_, p)| p),
                        );
                    }
                }
                sup.sort();
                sup.dedup();
                let f = IndexFile {
                    supersedes: sup,
                    packs,
                };
                written.push(save_index_file(&store, &f).unwrap());
            }
            Op::Delete(i) => {
                if !written.is_empty() {
                    let id = written[i % written.len()];
                    store
                        .objs
                        .lock()
                        .unwrap()
                        .remove(&FileType::Index.name(&id));
                }
            }
            Op::Load => {
                let (idx, bad) = MasterIndex::load(&store).unwrap();
                assert!(bad.is_empty());
                same(&idx, &model_of(&store));
            }
            Op::Damage(t, at) | Op::Truncate(t, at) => {
                let tables = store.table_files();
                if tables.is_empty() {
                    continue;
                }
                let path = &tables[t % tables.len()];
                let Ok(mut bytes) = std::fs::read(path) else {
                    continue; // merged away meanwhile
                };
                if bytes.is_empty() {
                    continue; // truncated to nothing by an earlier step
                }
                let at = usize::from(*at) % bytes.len();
                if matches!(op, Op::Damage(..)) {
                    bytes[at] ^= 0x40;
                } else {
                    bytes.truncate(at);
                }
                std::fs::write(path, bytes).unwrap();
            }
            Op::HalfWritten => {
                let _ = std::fs::create_dir_all(store.tables());
                std::fs::write(store.tables().join(".tmp-dead.tbl"), [1u8; 5000]).unwrap();
                std::fs::write(store.tables().join("00ff.tbl"), [2u8; 100]).unwrap();
            }
            Op::Overlay(blobs, forget) => {
                let (mut idx, _) = MasterIndex::load(&store).unwrap();
                let mut m = model_of(&store);
                seed += 1;
                let p = pack(seed, blobs);
                idx.add_pack(&p);
                m.add_pack(&p);
                // Also a pack already indexed, added again (a journal's).
                if let Some(again) = m.packs().first().copied() {
                    let f = written
                        .iter()
                        .filter_map(|id| load_index_file(&store, id).ok())
                        .flat_map(|f| f.packs)
                        .find(|p| p.id == again.id);
                    if let Some(p) = f {
                        idx.add_pack(&p);
                        m.add_pack(&p);
                    }
                }
                same(&idx, &m);
                let packs = m.packs();
                if !packs.is_empty() {
                    let bad: HashSet<ObjectId> = [packs[forget % packs.len()].id].into();
                    idx.forget_packs(&bad);
                    m.forget_packs(&bad);
                    same(&idx, &m);
                }
            }
        }
    }
    let (idx, _) = MasterIndex::load(&store).unwrap();
    same(&idx, &model_of(&store));
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]
    #[test]
    fn tables_answer_as_the_in_memory_index_did(ops in prop::collection::vec(op(), 1..40)) {
        run(&ops);
    }
}

#[test]
fn many_files_make_many_tables_merged_into_few() {
    let store = MemStore::new();
    let mut model_seed = 0;
    for round in 0..12u8 {
        let packs = (0..3)
            .map(|k| {
                model_seed += 1;
                pack(
                    model_seed,
                    &[round, round.wrapping_mul(7).wrapping_add(k), 200 + k],
                )
            })
            .collect();
        save_index_file(
            &store,
            &IndexFile {
                supersedes: vec![],
                packs,
            },
        )
        .unwrap();
        // One load a run: each adds a table for the file it had not seen.
        let (idx, _) = MasterIndex::load(&store).unwrap();
        same(&idx, &model_of(&store));
        idx.finish_merge();
    }
    // Merges run behind: each load waits for its own, and a few loads
    // bring the tables in use down to a few.
    for _ in 0..20 {
        if store.table_files().len() <= set::MAX_TABLES {
            break;
        }
        MasterIndex::load(&store).unwrap().0.finish_merge();
    }
    assert!(
        store.table_files().len() <= set::MAX_TABLES,
        "{:?}",
        store.table_files()
    );
    let (idx, _) = MasterIndex::load(&store).unwrap();
    same(&idx, &model_of(&store));
}

#[test]
fn a_page_damaged_mid_run_is_rebuilt_not_believed() {
    let store = MemStore::new();
    let blobs: Vec<u8> = (0..=255).collect();
    save_index_file(
        &store,
        &IndexFile {
            supersedes: vec![],
            packs: vec![pack(1, &blobs)],
        },
    )
    .unwrap();
    let (idx, _) = MasterIndex::load(&store).unwrap();
    let tables = store.table_files();
    assert_eq!(tables.len(), 1);
    // After the open (footer checked), before any page is read.
    let mut bytes = std::fs::read(&tables[0]).unwrap();
    bytes[table::PAGE + 10] ^= 1;
    std::fs::write(&tables[0], bytes).unwrap();
    same_but_noted(&idx, &model_of(&store));
    assert!(
        idx.notes()
            .iter()
            .any(|n| n.contains("page 1 fails its MAC")),
        "{:?}",
        idx.notes()
    );
}

/// Stores an index file of one pack.
fn save_one(store: &MemStore, p: IndexPack) {
    save_index_file(
        store,
        &IndexFile {
            supersedes: vec![],
            packs: vec![p],
        },
    )
    .unwrap();
}

/// [`same`], for an index that had to rebuild a table.
fn same_but_noted(idx: &MasterIndex, m: &Model) {
    same(idx, m);
}

#[test]
fn a_table_of_another_repository_is_not_believed() {
    let store = MemStore::new();
    save_one(&store, pack(1, &[1, 2, 3]));
    let _ = MasterIndex::load(&store).unwrap();
    let path = store.table_files().remove(0);
    // Another key opens nothing of it.
    assert!(matches!(
        table::Table::open(&path, &[8; 32]),
        Err(TableError::Damaged { .. })
    ));
    let (idx, _) = MasterIndex::load(&store).unwrap();
    same(&idx, &model_of(&store));
}

/// Without its filters (prune frees them), the index answers the same.
#[test]
fn without_filters_the_answers_are_the_same() {
    let store = MemStore::new();
    let blobs: Vec<u8> = (0..=255).step_by(3).collect();
    for seed in 1..4 {
        save_index_file(
            &store,
            &IndexFile {
                supersedes: vec![],
                packs: vec![pack(seed, &blobs)],
            },
        )
        .unwrap();
    }
    let (idx, _) = MasterIndex::load(&store).unwrap();
    idx.drop_filters();
    same(&idx, &model_of(&store));
}

/// A table an earlier version wrote (before the filter) is rebuilt, as a
/// cache is, without a warning: upgrading is not damage.
#[test]
fn a_table_of_an_earlier_version_is_rebuilt_quietly() {
    let store = MemStore::new();
    save_one(&store, pack(1, &[1, 2, 3]));
    let _ = MasterIndex::load(&store).unwrap();
    let path = store.table_files().remove(0);
    let mut bytes = std::fs::read(&path).unwrap();
    let n = bytes.len();
    bytes[n - 1] = 1; // the magic's version byte
    std::fs::write(&path, bytes).unwrap();
    assert!(matches!(
        table::Table::open(&path, &store.index_home().key),
        Err(TableError::Older { .. })
    ));
    let (idx, _) = MasterIndex::load(&store).unwrap();
    same(&idx, &model_of(&store));
    assert!(idx.notes().is_empty(), "{:?}", idx.notes());
    assert!(table::Table::open(&store.table_files()[0], &store.index_home().key).is_ok());
}

#[test]
fn a_full_disk_while_merging_leaves_the_tables_in_use_and_says_so() {
    let store = MemStore::new();
    let files: Vec<(ObjectId, IndexFile)> = (1..=3u8)
        .map(|k| {
            let f = IndexFile {
                supersedes: vec![],
                packs: vec![pack(u64::from(k), &[k, k ^ 0x55])],
            };
            (save_index_file(&store, &f).unwrap(), f)
        })
        .collect();
    // One table for the three.
    let _ = MasterIndex::load(&store).unwrap();
    assert_eq!(store.table_files().len(), 1);
    table::full::set(&store.tables(), true);
    // A prune's rewrite of two of them: their table is mostly dead, so a
    // merge starts behind, and fails; the new file's table cannot be
    // written either, and it is held in memory.
    let rewrite = IndexFile {
        supersedes: vec![files[0].0, files[1].0],
        packs: files[..2]
            .iter()
            .flat_map(|(_, f)| f.packs.clone())
            .collect(),
    };
    save_index_file(&store, &rewrite).unwrap();
    let (idx, _) = MasterIndex::load(&store).unwrap();
    same(&idx, &model_of(&store));
    idx.finish_merge();
    let notes = idx.notes();
    assert!(
        notes.iter().any(|n| n.contains("not merged"))
            && notes.iter().any(|n| n.contains("held in memory")),
        "{notes:?}"
    );
    assert!(
        std::fs::read_dir(store.tables())
            .unwrap()
            .flatten()
            .all(|e| !e.file_name().to_string_lossy().starts_with(".tmp-")),
        "nothing half-written left"
    );
    // Space again: the next run builds and merges, and answers the same.
    table::full::set(&store.tables(), false);
    let (idx, _) = MasterIndex::load(&store).unwrap();
    same(&idx, &model_of(&store));
    idx.finish_merge();
    let (idx, _) = MasterIndex::load(&store).unwrap();
    same(&idx, &model_of(&store));
    assert!(idx.notes().is_empty(), "{:?}", idx.notes());
}

#[test]
fn two_loaders_at_once_build_and_merge_the_same_tables() {
    let store = MemStore::new();
    for round in 0..30u8 {
        save_index_file(
            &store,
            &IndexFile {
                supersedes: vec![],
                packs: vec![pack(u64::from(round) + 100, &[round, 200 - round])],
            },
        )
        .unwrap();
        // Two "processes" open at once, building and merging the same
        // tables under the same names.
        std::thread::scope(|s| {
            let a = s.spawn(|| MasterIndex::load(&store).unwrap().0);
            let b = s.spawn(|| MasterIndex::load(&store).unwrap().0);
            let m = model_of(&store);
            same(&a.join().unwrap(), &m);
            same(&b.join().unwrap(), &m);
        });
    }
}

/// Small index files (a backup's each) are read the destination's
/// concurrency at once; large ones (a prune's, ~10 MB) a few at a time, so
/// what is held while they decode stays bounded.
#[test]
fn index_files_are_read_many_small_or_a_few_large_at_once() {
    let f = |i: u8, size: u64| (ObjectId::of(&[i]), size);
    let small: Vec<_> = (0..20).map(|i| f(i, 300_000)).collect();
    let sizes: Vec<usize> = super::read_groups(&small, 8)
        .iter()
        .map(|g| g.len())
        .collect();
    assert_eq!(sizes, [8, 8, 4]);
    let large: Vec<_> = (0..5).map(|i| f(i, 10 << 20)).collect();
    let sizes: Vec<usize> = super::read_groups(&large, 8)
        .iter()
        .map(|g| g.len())
        .collect();
    assert_eq!(sizes, [1, 1, 1, 1, 1], "16 MiB at once, at least one file");
    let mixed = [f(0, 100), f(1, 12 << 20), f(2, 8 << 20), f(3, 100)];
    let sizes: Vec<usize> = super::read_groups(&mixed, 8)
        .iter()
        .map(|g| g.len())
        .collect();
    assert_eq!(sizes, [2, 2]);
    let unknown: Vec<_> = (0..9).map(|i| f(i, 0)).collect();
    let sizes: Vec<usize> = super::read_groups(&unknown, 8)
        .iter()
        .map(|g| g.len())
        .collect();
    assert_eq!(sizes, [8, 1]);
    assert!(super::read_groups(&[], 8).is_empty());
}

/// Issue 63's month on the distributed store: a prune refused ("run
/// `capsule repair index` first") because the store still listed an index
/// file a prune had deleted once its replacement was stored. Such a file
/// is not a loss; one that nothing replaced is.
#[test]
fn a_listed_file_that_is_gone_is_a_loss_only_when_nothing_replaced_it() {
    let store = MemStore::new();
    let old = save_index_file(
        &store,
        &IndexFile {
            supersedes: vec![],
            packs: vec![pack(1, &[1, 2])],
        },
    )
    .unwrap();
    // The prune's file: the same pack, superseding the old file, which it
    // then deletes; the store goes on listing it.
    save_index_file(
        &store,
        &IndexFile {
            supersedes: vec![old],
            packs: vec![pack(1, &[1, 2])],
        },
    )
    .unwrap();
    let name = FileType::Index.name(&old);
    store.objs.lock().unwrap().remove(&name);
    store.ghosts.lock().unwrap().insert(name);
    let (idx, bad) = MasterIndex::load(&store).unwrap();
    assert!(bad.is_empty(), "{bad:?}");
    assert_eq!(locs(&idx, &blob(1)).len(), 1);
    assert!(
        idx.notes().iter().any(|n| n.contains("listed but gone")),
        "{:?}",
        idx.notes()
    );

    // A file nothing supersedes, gone: its packs would be unindexed, so it
    // is reported and a prune refuses.
    let lost = save_index_file(
        &store,
        &IndexFile {
            supersedes: vec![],
            packs: vec![pack(2, &[3])],
        },
    )
    .unwrap();
    let name = FileType::Index.name(&lost);
    store.objs.lock().unwrap().remove(&name);
    store.ghosts.lock().unwrap().insert(name);
    let (_, bad) = MasterIndex::load(&store).unwrap();
    assert_eq!(bad.len(), 1, "{bad:?}");
    assert!(is_not_found(&bad[0]), "{bad:?}");
}

/// The fleet year's day 269: a file deleted by one prune while a store
/// node was away, listed again once it was back, after a second prune had
/// replaced the first one's file too. The second prune's file supersedes
/// what the first one's superseded, so the ghost is still no loss.
#[test]
fn a_file_gone_two_rewrites_back_is_no_loss() {
    let store = MemStore::new();
    let old = save_index_file(
        &store,
        &IndexFile {
            supersedes: vec![],
            packs: vec![pack(1, &[1, 2])],
        },
    )
    .unwrap();
    let none = HashSet::new();
    // First prune: replaces the old file, deletes it; a node still lists it.
    let gone = super::rewrite_without(&store, &[old], None, &none).unwrap();
    assert_eq!(gone, [old]);
    let name = FileType::Index.name(&old);
    store.objs.lock().unwrap().remove(&name);
    store.ghosts.lock().unwrap().insert(name);
    // Second prune: replaces the first one's file and deletes it for good.
    let (idx, _) = MasterIndex::load(&store).unwrap();
    let first = idx.files().to_vec();
    assert_eq!(first.len(), 1);
    assert_eq!(idx.leftover_files(), [old], "the ghost is a file to delete");
    let gone = super::rewrite_without(&store, &first, None, &none).unwrap();
    assert_eq!(gone, first);
    store
        .objs
        .lock()
        .unwrap()
        .remove(&FileType::Index.name(&first[0]));
    let (idx, bad) = MasterIndex::load(&store).unwrap();
    assert!(bad.is_empty(), "{bad:?}");
    assert_eq!(locs(&idx, &blob(1)).len(), 1);
    assert_eq!(idx.leftover_files(), [old]);
}
