//! What a year does to a repository, at engine level on an in-memory
//! store: an index file the store lists but cannot give, and the small
//! packs of hourly runs.
//!
//! The lost index file (the fleet year's days 70 to 188: a distributed
//! store listed an index file after a node died during its upload, and
//! answered "not found" to every read): prune went on refusing for months,
//! so marked packs waited. It now goes on when every blob the snapshots use
//! is found without the file, and still refuses when one is not.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::path::Path;
use std::sync::Arc;

use capsule_backend::testing::MemoryBackend;
use capsule_backend::Backend;
use capsule_crypto::KdfParams;
use capsule_engine::backup::{backup, BackupOptions};
use capsule_engine::progress::Progress;
use capsule_engine::prune::{prune, PruneOptions};
use capsule_engine::repo::InitOptions;
use capsule_engine::{EngineError, Repository};

const PW: &[u8] = b"ghost";

fn init(store: &Arc<MemoryBackend>) {
    let opts = InitOptions {
        kdf: KdfParams {
            m_cost: 64,
            t_cost: 1,
            p_cost: 1,
        },
        chunks: capsule_chunker::ChunkSizes {
            min: 8 << 10,
            avg: 32 << 10,
            max: 128 << 10,
        },
        pack_size: 128 << 10,
        compression: 1,
    };
    Repository::init(store.clone(), PW, &opts).unwrap();
}

fn open(store: &Arc<MemoryBackend>) -> Arc<Repository> {
    Arc::new(Repository::open(store.clone() as Arc<dyn Backend>, PW).unwrap())
}

fn noise(n: usize, mut x: u64) -> Vec<u8> {
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}

fn run_backup(store: &Arc<MemoryBackend>, src: &Path) -> String {
    let opts = BackupOptions {
        paths: vec![src.to_path_buf()],
        threads: 2,
        ..Default::default()
    };
    backup(open(store), &opts, &Arc::new(Progress::default()))
        .unwrap()
        .snapshot_id
}

fn index_files(store: &MemoryBackend) -> Vec<String> {
    store
        .names()
        .into_iter()
        .filter(|n| n.starts_with("index/"))
        .collect()
}

fn packs(store: &MemoryBackend) -> Vec<String> {
    store
        .names()
        .into_iter()
        .filter(|n| n.starts_with("data/") || n.starts_with("tree/"))
        .collect()
}

/// Three snapshots: `kept`; `kept` and `gone`; `kept` and `new`. The
/// second is forgotten. Returns the index files only the second backup
/// wrote (they name `gone` and the second snapshot's trees, nothing any
/// live snapshot uses) and the files of the other two.
fn three_snapshots(store: &Arc<MemoryBackend>, src: &Path) -> (Vec<String>, Vec<String>) {
    std::fs::create_dir_all(src).unwrap();
    std::fs::write(src.join("kept"), noise(300_000, 1)).unwrap();
    run_backup(store, src);
    let before = index_files(store);
    std::fs::write(src.join("gone"), noise(600_000, 2)).unwrap();
    let second = run_backup(store, src);
    let seconds: Vec<String> = index_files(store)
        .into_iter()
        .filter(|n| !before.contains(n))
        .collect();
    std::fs::remove_file(src.join("gone")).unwrap();
    std::fs::write(src.join("new"), noise(400_000, 3)).unwrap();
    run_backup(store, src);
    let repo = open(store);
    capsule_engine::forget::forget(&repo, &second.parse().unwrap()).unwrap();
    let others = index_files(store)
        .into_iter()
        .filter(|n| !seconds.contains(n))
        .collect();
    (seconds, others)
}

fn prune_twice(store: &Arc<MemoryBackend>) -> capsule_engine::Result<Vec<String>> {
    let repo = open(store);
    let opts = PruneOptions {
        max_unused: 0.0,
        ..PruneOptions::default()
    };
    let mut gone = prune(&repo, &opts)?.index_files_gone;
    gone.extend(prune(&repo, &opts)?.index_files_gone);
    Ok(gone)
}

fn restores_whole(store: &Arc<MemoryBackend>, src: &Path, scratch: &Path) {
    let repo = open(store);
    let (index, _) = repo.load_index().unwrap();
    let (snaps, _) = repo.list_snapshots().unwrap();
    let (_, snap) = snaps.last().unwrap();
    let root: capsule_format::BlobId = snap.tree.parse().unwrap();
    let _ = std::fs::remove_dir_all(scratch);
    let r = capsule_engine::restore::restore(
        &repo,
        &index,
        &root,
        &capsule_engine::restore::RestoreOptions {
            target: scratch.to_path_buf(),
            max_entries: capsule_engine::treewalk::entry_budget(snap),
            ..Default::default()
        },
        &Progress::default(),
    )
    .unwrap();
    assert!(r.errors.is_empty(), "{:?}", r.errors);
    let restored = scratch.join(src.strip_prefix("/").unwrap());
    for f in ["kept", "new"] {
        assert_eq!(
            std::fs::read(restored.join(f)).unwrap(),
            std::fs::read(src.join(f)).unwrap(),
            "{f}"
        );
    }
}

/// The file that goes missing names only what no live snapshot uses (the
/// forgotten snapshot's): prune goes on and says so, never touches the
/// packs only that file names, and the live snapshots restore whole. Once
/// `repair index` has indexed those packs again, a prune gives them back.
#[test]
fn a_listed_index_file_nothing_used_needs_does_not_block_prune() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src");
    let store = Arc::new(MemoryBackend::new());
    init(&store);
    let (seconds, _) = three_snapshots(&store, &src);
    assert!(!seconds.is_empty());
    for n in &seconds {
        store.ghost(n);
    }
    let before = packs(&store);
    let gone = prune_twice(&store).unwrap();
    assert!(
        seconds.iter().all(|n| gone
            .iter()
            .any(|g| g.contains(n.trim_start_matches("index/")))),
        "the prune did not report every file: {gone:?}"
    );
    // The forgotten snapshot's packs are named only by the lost files: the
    // prune left them.
    let after = packs(&store);
    assert_eq!(after, before, "a prune deleted packs it had no index of");
    restores_whole(&store, &src, &dir.path().join("r1"));

    // A check names the files (and the packs nothing indexes), but finds
    // nothing damaged: every snapshot restores (the fleet year's weekly
    // checks reported such a file as damage, steps 158 and 171).
    let repo = open(&store);
    let r = capsule_engine::check::check(&repo, false, &Progress::default()).unwrap();
    assert!(r.ok(), "{:?}", r.problems);
    assert!(
        seconds
            .iter()
            .all(|n| r.index_files_gone.iter().any(|g| g == n)),
        "{:?} against {seconds:?}",
        r.index_files_gone
    );
    assert!(!r.unindexed_packs.is_empty(), "{r:?}");

    // Repaired: the packs are indexed again, and a prune gives back what
    // the forgotten snapshot alone used.
    // (The store goes on listing the files, as the year's did: the repair's
    // file supersedes them, which is what lets every reader pass them by.)
    let r = capsule_engine::repair::repair_index(&repo, false).unwrap();
    assert!(r.reindexed > 0, "{r:?}");
    for n in &seconds {
        store.ghost_again(n);
    }
    let r = capsule_engine::check::check(&open(&store), false, &Progress::default()).unwrap();
    assert!(r.ok(), "{:?}", r.problems);
    assert!(r.index_files_gone.is_empty(), "{:?}", r.index_files_gone);
    let gone = prune_twice(&store).unwrap();
    assert!(gone.is_empty(), "{gone:?}");
    assert!(packs(&store).len() < before.len(), "nothing given back");
    restores_whole(&store, &src, &dir.path().join("r2"));
}

/// The files that go missing are the ones the live snapshot needs: prune
/// refuses (as before) and deletes nothing.
#[test]
fn a_listed_index_file_a_snapshot_needs_still_blocks_prune() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src");
    let store = Arc::new(MemoryBackend::new());
    init(&store);
    let (_, others) = three_snapshots(&store, &src);
    let before = packs(&store);
    for n in &others {
        store.ghost(n);
    }
    match prune_twice(&store) {
        Err(EngineError::PruneRefused(m)) => assert!(m.contains("repair"), "{m}"),
        other => panic!("prune did not refuse: {other:?}"),
    }
    assert_eq!(packs(&store), before, "a refused prune deleted packs");
    // And a check calls it damage, naming what it affects.
    let r = capsule_engine::check::check(&open(&store), false, &Progress::default()).unwrap();
    assert!(!r.ok(), "check found nothing wrong");
    assert!(
        r.problems
            .iter()
            .any(|p| p.problem.contains("not in any index") && !p.affected.is_empty()),
        "{:?}",
        r.problems
    );
    assert!(!r.index_files_gone.is_empty());
}

/// A day of hourly runs, each adding a small file: each leaves a small
/// pack whose every blob the newest snapshot uses. A prune merges them
/// into full packs (a year of them left the newest snapshot in 1,088 packs
/// against a fresh repository's 144), the newest snapshot restores whole,
/// and a prune right after merges nothing again.
#[test]
fn a_prune_merges_the_small_packs_of_hourly_runs() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src");
    let store = Arc::new(MemoryBackend::new());
    init(&store);
    std::fs::create_dir_all(&src).unwrap();
    std::fs::write(src.join("kept"), noise(300_000, 1)).unwrap();
    std::fs::write(src.join("new"), noise(400_000, 3)).unwrap();
    for h in 0..24u64 {
        std::fs::write(src.join(format!("h{h}")), noise(20_000, 100 + h)).unwrap();
        run_backup(&store, &src);
    }
    let data = |s: &MemoryBackend| packs(s).iter().filter(|n| n.starts_with("data/")).count();
    let before = data(&store);
    assert!(before >= 24, "{before} data packs");
    let repo = open(&store);
    let r = prune(&repo, &PruneOptions::default()).unwrap();
    assert!(r.packs_merged >= 20, "{r:?}");
    let after = data(&store);
    // 1.2 MB of data in 128 KiB packs: about ten, not thirty.
    assert!(
        after * 2 < before,
        "{before} data packs before, {after} after"
    );
    let r = prune(&repo, &PruneOptions::default()).unwrap();
    assert_eq!(r.packs_merged, 0, "merged again: {r:?}");
    assert_eq!(data(&store), after);
    restores_whole(&store, &src, &dir.path().join("r"));
    for h in 0..24u64 {
        let name = format!("h{h}");
        let restored = dir
            .path()
            .join("r")
            .join(src.strip_prefix("/").unwrap())
            .join(&name);
        assert_eq!(
            std::fs::read(restored).unwrap(),
            noise(20_000, 100 + h),
            "{name}"
        );
    }
}
