//! Restore never writes outside its target, whatever a (crafted) repository
//! contains: `..` and `/` in names, duplicate names that would put a file
//! behind a symlink, and symlinks already planted in the target.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::path::Path;
use std::sync::Arc;

use capsule_backend::{LocalBackend, SyncPolicy};
use capsule_crypto::KdfParams;
use capsule_engine::index::MasterIndex;
use capsule_engine::packer::BlobSaver;
use capsule_engine::progress::Progress;
use capsule_engine::repo::InitOptions;
use capsule_engine::restore::{restore, RestoreOptions};
use capsule_engine::Repository;
use capsule_format::tree::{encode_tree, Node, NodeKind};
use capsule_format::{BlobId, BlobType};

fn repo(dir: &Path) -> Arc<Repository> {
    let b = Arc::new(LocalBackend::create(dir, SyncPolicy::NoSync).unwrap());
    let opts = InitOptions {
        kdf: KdfParams {
            m_cost: 64,
            t_cost: 1,
            p_cost: 1,
        },
        ..InitOptions::default()
    };
    Arc::new(Repository::init(b, b"pw", &opts).unwrap())
}

fn file(name: &[u8], content: BlobId, size: u64) -> Node {
    Node {
        name: name.to_vec(),
        kind: Some(NodeKind::File),
        mode: 0o644,
        size,
        nlink: 1,
        content: vec![content],
        ..Node::default()
    }
}

fn dir(name: &[u8], sub: BlobId) -> Node {
    Node {
        name: name.to_vec(),
        kind: Some(NodeKind::Dir),
        mode: 0o755,
        subtree: Some(sub),
        ..Node::default()
    }
}

fn symlink(name: &[u8], target: &Path) -> Node {
    Node {
        name: name.to_vec(),
        kind: Some(NodeKind::Symlink),
        mode: 0o777,
        target: target.as_os_str().as_encoded_bytes().to_vec(),
        ..Node::default()
    }
}

/// Stores raw (possibly invalid) trees and returns the root's ID.
struct Crafter {
    repo: Arc<Repository>,
    saver: Option<BlobSaver>,
}

impl Crafter {
    fn new(repo: Arc<Repository>) -> Self {
        let saver = BlobSaver::start(repo.clone(), Arc::new(MasterIndex::default()), 1);
        Crafter {
            repo,
            saver: Some(saver),
        }
    }
    fn blob(&self, t: BlobType, data: &[u8]) -> BlobId {
        let id = self.repo.key().blob_id(data);
        self.saver.as_ref().unwrap().save(t, id, data).unwrap();
        id
    }
    /// Trees are encoded as given: no sorting, no validation.
    fn tree(&self, nodes: &[Node]) -> BlobId {
        self.blob(BlobType::Tree, &encode_tree(nodes))
    }
    fn finish(mut self) -> MasterIndex {
        self.saver.take().unwrap().finish().unwrap();
        self.repo.load_index().unwrap().0
    }
}

fn run(
    repo: &Repository,
    index: &MasterIndex,
    root: &BlobId,
    target: &Path,
) -> capsule_engine::restore::RestoreReport {
    let opts = RestoreOptions {
        target: target.to_path_buf(),
        ..Default::default()
    };
    restore(repo, index, root, &opts, &Progress::default()).unwrap()
}

fn assert_empty(dir: &Path) {
    let n: Vec<_> = std::fs::read_dir(dir).unwrap().collect();
    assert!(n.is_empty(), "{} was written to: {n:?}", dir.display());
}

#[test]
fn dotdot_and_slash_names_are_refused() {
    let t = tempfile::tempdir().unwrap();
    let outside = t.path().join("outside");
    std::fs::create_dir(&outside).unwrap();
    let repo = repo(&t.path().join("repo"));
    for (i, name) in [
        &b".."[..],
        b"../outside/x",
        b"/tmp/x",
        b"a/../../x",
        b".",
        b"",
    ]
    .iter()
    .enumerate()
    {
        let c = Crafter::new(repo.clone());
        let evil = c.blob(BlobType::Data, b"pwned");
        let inner = c.tree(&[file(b"x", evil, 5)]);
        let root = c.tree(&[dir(name, inner)]);
        let root2 = c.tree(&[file(name, evil, 5)]);
        let idx = c.finish();
        for (j, r) in [root, root2].iter().enumerate() {
            let target = t.path().join(format!("target{i}-{j}"));
            let rep = run(&repo, &idx, r, &target);
            assert!(
                !rep.errors.is_empty(),
                "{:?} must be reported",
                String::from_utf8_lossy(name)
            );
            assert_empty(&target);
        }
    }
    assert!(!t.path().join("x").exists());
    assert_empty(&outside);
}

#[test]
fn duplicate_names_cannot_hide_a_file_behind_a_symlink() {
    let t = tempfile::tempdir().unwrap();
    let outside = t.path().join("outside");
    std::fs::create_dir(&outside).unwrap();
    let repo = repo(&t.path().join("repo"));
    let c = Crafter::new(repo.clone());
    let evil = c.blob(BlobType::Data, b"pwned");
    let inner = c.tree(&[file(b"f", evil, 5)]);
    // "a" as a symlink to outside, then "a" as a directory holding "f".
    let root = c.tree(&[symlink(b"a", &outside), dir(b"a", inner)]);
    let idx = c.finish();
    let target = t.path().join("target");
    let r = run(&repo, &idx, &root, &target);
    assert!(!r.errors.is_empty());
    assert_empty(&outside);
}

#[test]
fn symlinks_planted_in_the_target_are_not_followed() {
    let t = tempfile::tempdir().unwrap();
    let outside = t.path().join("outside");
    std::fs::create_dir(&outside).unwrap();
    std::fs::write(outside.join("victim"), b"original").unwrap();
    let repo = repo(&t.path().join("repo"));
    let c = Crafter::new(repo.clone());
    let evil = c.blob(BlobType::Data, b"pwned");
    let inner = c.tree(&[file(b"f", evil, 5)]);
    let root = c.tree(&[file(b"file", evil, 5), dir(b"x", inner)]);
    let idx = c.finish();
    let target = t.path().join("target");
    std::fs::create_dir(&target).unwrap();
    std::os::unix::fs::symlink(&outside, target.join("x")).unwrap();
    std::os::unix::fs::symlink(outside.join("victim"), target.join("file")).unwrap();
    let r = run(&repo, &idx, &root, &target);
    // The directory behind a symlink is refused...
    assert!(
        r.errors.iter().any(|e| e.path.ends_with("/x")),
        "{:?}",
        r.errors
    );
    assert!(!outside.join("f").exists());
    // ...and a symlink where a file goes is replaced, not written through.
    assert_eq!(std::fs::read(outside.join("victim")).unwrap(), b"original");
    assert_eq!(std::fs::read(target.join("file")).unwrap(), b"pwned");
    assert!(!std::fs::symlink_metadata(target.join("file"))
        .unwrap()
        .file_type()
        .is_symlink());
}

/// A directory where the snapshot has a file is refused by name and left
/// as it was: restore creates files first and removes only a file or a
/// symlink in the way.
#[test]
fn a_directory_where_a_file_goes_is_refused_and_kept() {
    let t = tempfile::tempdir().unwrap();
    let repo = repo(&t.path().join("repo"));
    let c = Crafter::new(repo.clone());
    let blob = c.blob(BlobType::Data, b"new");
    let root = c.tree(&[file(b"file", blob, 3), file(b"other", blob, 3)]);
    let idx = c.finish();
    let target = t.path().join("target");
    std::fs::create_dir_all(target.join("file")).unwrap();
    std::fs::write(target.join("file/keep"), b"mine").unwrap();
    let r = run(&repo, &idx, &root, &target);
    assert!(
        r.errors.iter().any(|e| e.path.ends_with("/file")),
        "{:?}",
        r.errors
    );
    assert_eq!(std::fs::read(target.join("file/keep")).unwrap(), b"mine");
    assert_eq!(std::fs::read(target.join("other")).unwrap(), b"new");
}

/// 40 trees, each holding two directories that are both the next tree:
/// a few KB that describe 2^40 paths. Every walk stops at what the
/// snapshot records, and check calls the snapshot a tree bomb.
#[test]
fn tree_bomb_is_bounded_and_reported() {
    let t = tempfile::tempdir().unwrap();
    let r = repo(&t.path().join("repo"));
    let c = Crafter::new(r.clone());
    let leaf = c.blob(BlobType::Data, b"x");
    let mut next = c.tree(&[file(b"f", leaf, 1)]);
    for _ in 0..40 {
        next = c.tree(&[dir(b"a", next), dir(b"b", next)]);
    }
    let index = c.finish();
    let snap = capsule_format::snapshot::Snapshot {
        version: capsule_format::FORMAT_VERSION,
        time: "2026-01-01T00:00:00Z".into(),
        time_unix: 1_767_225_600,
        time_nanos: 0,
        duration_secs: 1.0,
        hostname: "h".into(),
        username: "u".into(),
        paths: vec!["/".into()],
        tree: next.to_hex(),
        parent: None,
        tags: vec![],
        incomplete: false,
        summary: capsule_format::snapshot::SnapshotSummary {
            files: 1,
            dirs: 80,
            ..Default::default()
        },
        program: "crafted".into(),
        repaired: None,
        original: None,
    };
    r.save_snapshot(&snap).unwrap();
    let budget = capsule_engine::treewalk::entry_budget(&snap);

    let opts = RestoreOptions {
        target: t.path().join("target"),
        max_entries: budget,
        connections: 0,
        ..Default::default()
    };
    let e = restore(&r, &index, &next, &opts, &Progress::default()).unwrap_err();
    assert!(e.to_string().contains("tree bomb"), "{e}");

    let mut b = capsule_engine::treewalk::Budget::new(budget);
    let mut seen = 0u64;
    let e =
        capsule_engine::treewalk::walk(&r, &index, &next, Path::new("/"), &mut b, &mut |_, _| {
            seen += 1;
            Ok(())
        })
        .unwrap_err();
    assert!(e.to_string().contains("tree bomb"), "{e}");
    assert!(seen <= budget, "{seen}");

    let report = capsule_engine::check::check(&r, false, &Progress::default()).unwrap();
    assert!(
        report
            .problems
            .iter()
            .any(|p| p.object.starts_with("snapshots/") && p.problem.contains("tree bomb")),
        "{:?}",
        report.problems
    );
    // Each shared tree was loaded once, not 2^k times.
    assert_eq!(report.trees, 41);
}

/// Another local process swaps every directory the restore creates for a
/// symlink to a directory outside the target, as fast as it can. Every
/// entry is reached through its parent's descriptor with `O_NOFOLLOW`, so
/// nothing lands outside, and whatever could not be written is reported.
#[test]
fn directories_swapped_for_symlinks_during_a_restore_are_not_followed() {
    let t = tempfile::tempdir().unwrap();
    let outside = t.path().join("outside");
    std::fs::create_dir(&outside).unwrap();
    let repo = repo(&t.path().join("repo"));
    let c = Crafter::new(repo.clone());
    let data = c.blob(BlobType::Data, b"restored data");
    let names: Vec<Vec<u8>> = (0..200).map(|i| format!("d{i:03}").into_bytes()).collect();
    let mut dirs = Vec::new();
    for n in &names {
        let inner = c.tree(&[file(b"f", data, 13)]);
        dirs.push(dir(n, inner));
    }
    let root = c.tree(&dirs);
    let idx = c.finish();
    let target = t.path().join("target");
    std::fs::create_dir(&target).unwrap();

    let done = std::sync::atomic::AtomicBool::new(false);
    let swaps = std::sync::atomic::AtomicUsize::new(0);
    let stash = t.path().join("stash");
    std::fs::create_dir(&stash).unwrap();
    let r = std::thread::scope(|s| {
        s.spawn(|| {
            // Bounded: at most 200 swaps, and it stops with the restore.
            let mut left: Vec<&Vec<u8>> = names.iter().collect();
            while !done.load(std::sync::atomic::Ordering::Relaxed) && !left.is_empty() {
                left.retain(|n| {
                    let name = std::str::from_utf8(n).unwrap();
                    let p = target.join(name);
                    match std::fs::symlink_metadata(&p) {
                        Ok(m) if m.is_dir() => {
                            std::fs::rename(&p, stash.join(name)).unwrap();
                            std::os::unix::fs::symlink(&outside, &p).unwrap();
                            swaps.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                            false
                        }
                        _ => true,
                    }
                });
                std::thread::yield_now();
            }
        });
        let r = run(&repo, &idx, &root, &target);
        done.store(true, std::sync::atomic::Ordering::Relaxed);
        r
    });
    assert_empty(&outside);
    let swapped = swaps.into_inner();
    eprintln!(
        "{swapped} directories swapped; {} entries reported",
        r.errors.len()
    );
    // Each of the 200 files was either restored (into the directory the
    // restore created, wherever it was moved) or reported.
    let placed = (0..200)
        .filter(|i| {
            let n = format!("d{i:03}");
            std::fs::read(target.join(&n).join("f")).is_ok_and(|b| b == b"restored data")
                || std::fs::read(stash.join(&n).join("f")).is_ok_and(|b| b == b"restored data")
        })
        .count() as u64;
    assert_eq!(placed, r.files);
    let file_errors = r.errors.iter().filter(|e| e.path.ends_with("/f")).count();
    assert_eq!(r.files as usize + file_errors, 200, "{:?}", r.errors);
}

/// A path far longer than `PATH_MAX` (4,096 bytes) restores: no call ever
/// gets more than one name.
#[test]
fn paths_longer_than_path_max_restore() {
    let t = tempfile::tempdir().unwrap();
    let repo = repo(&t.path().join("repo"));
    let c = Crafter::new(repo.clone());
    let data = c.blob(BlobType::Data, b"deep");
    let name = vec![b'n'; 200];
    let mut sub = c.tree(&[file(b"leaf", data, 4)]);
    for _ in 0..30 {
        sub = c.tree(&[dir(&name, sub)]);
    }
    let idx = c.finish();
    let target = t.path().join("target");
    let r = run(&repo, &idx, &sub, &target);
    assert!(r.errors.is_empty(), "{:?}", r.errors);
    assert_eq!((r.files, r.dirs), (1, 30));
    // Walk down by descriptor to read it back (std's path calls would hit
    // ENAMETOOLONG themselves).
    use rustix::fs::{openat, Mode, OFlags};
    let mut fd = rustix::fs::open(&target, OFlags::DIRECTORY, Mode::empty()).unwrap();
    for _ in 0..30 {
        fd = openat(
            &fd,
            &name[..],
            OFlags::DIRECTORY | OFlags::NOFOLLOW,
            Mode::empty(),
        )
        .unwrap();
    }
    let f = openat(&fd, "leaf", OFlags::RDONLY, Mode::empty()).unwrap();
    let mut s = String::new();
    std::io::Read::read_to_string(&mut std::fs::File::from(f), &mut s).unwrap();
    assert_eq!(s, "deep");
}

/// A decompression bomb: a blob whose index entry claims gigabytes. It is
/// refused before anything is allocated for it, and only the file that
/// needs it fails.
#[test]
fn a_blob_claiming_gigabytes_is_refused_before_allocating() {
    let t = tempfile::tempdir().unwrap();
    let repo = repo(&t.path().join("repo"));
    let c = Crafter::new(repo.clone());
    let data = c.blob(BlobType::Data, b"small and honest");
    let root = c.tree(&[file(b"ok", data, 16)]);
    let idx = c.finish();
    let loc = idx.get(&data).unwrap();
    let env = repo
        .backend()
        .get(
            &capsule_engine::repo::pack_name(&idx.pack_id(loc.pack), BlobType::Data),
            Some(loc.offset as u64..loc.offset as u64 + loc.length as u64),
        )
        .unwrap();
    let e = repo
        .decode_blob("pack", BlobType::Data, &data, &env, 3 << 30)
        .unwrap_err();
    assert!(e.to_string().contains("claims"), "{e}");
    let e = repo
        .decode_blob("pack", BlobType::Tree, &data, &env, 1 << 30)
        .unwrap_err();
    assert!(e.to_string().contains("claims"), "{e}");
    // The honest blob still restores.
    let r = run(&repo, &idx, &root, &t.path().join("target"));
    assert!(r.errors.is_empty(), "{:?}", r.errors);
}

/// A few bytes of crafted tree cannot make restore allocate, create or
/// promise more than the data behind it: a file claiming a petabyte is
/// refused before anything is created, and absurd times and ids neither
/// panic nor fail the files that carry them.
#[test]
fn absurd_sizes_times_and_ids_in_a_few_bytes_cost_nothing() {
    let t = tempfile::tempdir().unwrap();
    let repo = repo(&t.path().join("repo"));
    let c = Crafter::new(repo.clone());
    let data = c.blob(BlobType::Data, b"small and honest");
    let mut far_future = file(b"far-future", data, 16);
    far_future.mtime = capsule_format::tree::Timestamp {
        secs: i64::MAX,
        nanos: 999_999_999,
    };
    far_future.atime = capsule_format::tree::Timestamp {
        secs: i64::MIN,
        nanos: 0,
    };
    far_future.uid = u32::MAX;
    far_future.gid = u32::MAX;
    let root = c.tree(&[
        file(b"claims-a-petabyte", data, 1 << 50),
        file(b"claims-nothing", data, 0),
        far_future,
        file(b"ok", data, 16),
    ]);
    let idx = c.finish();
    let target = t.path().join("target");
    let r = run(&repo, &idx, &root, &target);
    let failed: Vec<String> = r.errors.iter().map(|e| format!("{e:?}")).collect();
    assert_eq!(r.errors.len(), 2, "{failed:?}");
    assert!(
        failed.iter().any(|e| e.contains("claims-a-petabyte")),
        "{failed:?}"
    );
    assert!(
        failed.iter().any(|e| e.contains("claims-nothing")),
        "{failed:?}"
    );
    assert!(
        !target.join("claims-a-petabyte").exists(),
        "no file (sparse or not) is created for a size the content does not back"
    );
    assert_eq!(
        std::fs::read(target.join("ok")).unwrap(),
        b"small and honest"
    );
    assert_eq!(
        std::fs::read(target.join("far-future")).unwrap(),
        b"small and honest"
    );
}

/// `--include` under literal directories opens only the way there: a
/// restore of `/keep/f` never reads `/elsewhere`, so a directory whose tree
/// is missing there costs nothing and says nothing (reading every tree of
/// a snapshot of a million files took 204 MiB to restore one), while the
/// same restore by a name pattern, which may match anywhere, still opens
/// it and reports the loss.
#[test]
fn an_include_under_literal_directories_opens_only_the_way_there() {
    let t = tempfile::tempdir().unwrap();
    let r = repo(&t.path().join("repo"));
    let c = Crafter::new(r.clone());
    let data = c.blob(BlobType::Data, b"kept");
    let keep = c.tree(&[file(b"f", data, 4), file(b"g", data, 4)]);
    let lost = BlobId(capsule_format::Id([7; 32]));
    let root = c.tree(&[dir(b"elsewhere", lost), dir(b"keep", keep)]);
    let index = c.finish();

    let restore_with = |include: &str, target: &str| {
        let opts = RestoreOptions {
            target: t.path().join(target),
            includes: vec![include.into()],
            ..Default::default()
        };
        restore(&r, &index, &root, &opts, &Progress::default()).unwrap()
    };
    let by_path = restore_with("/keep/f", "by-path");
    assert!(by_path.errors.is_empty(), "{:?}", by_path.errors);
    assert_eq!((by_path.files, by_path.dirs), (1, 1));
    assert_eq!(
        std::fs::read(t.path().join("by-path/keep/f")).unwrap(),
        b"kept"
    );
    assert!(!t.path().join("by-path/keep/g").exists());
    assert!(!t.path().join("by-path/elsewhere").exists());

    let by_name = restore_with("f", "by-name");
    assert_eq!(by_name.files, 1);
    assert!(
        by_name
            .errors
            .iter()
            .any(|e| e.path.ends_with("/elsewhere") && e.message.contains("lost")),
        "{:?}",
        by_name.errors
    );
    // The directory that held nothing selected is not created.
    assert!(!t.path().join("by-name/elsewhere").exists());
}
