//! Incremental backups: each change-detection rule on real files, tree
//! reuse, and a deleted cache that is rebuilt.

// The command-line suite runs on Linux, against real servers, btrfs,
// fanotify and network namespaces; the macOS build checks the libraries.
#![cfg(target_os = "linux")]
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod common;

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::time::Duration;

use common::*;

fn mtime(p: &Path) -> (i64, i64) {
    let m = std::fs::metadata(p).unwrap();
    (m.mtime(), m.mtime_nsec())
}

fn atime(p: &Path) -> (i64, i64) {
    let m = std::fs::metadata(p).unwrap();
    (m.atime(), m.atime_nsec())
}

/// Every kind of change that can hide from a naive size+mtime check is
/// picked up, and the new snapshot restores exactly the current tree.
#[test]
fn sneaky_changes_are_detected() {
    let t = tempfile::tempdir().unwrap();
    let (src, repo) = (t.path().join("src"), t.path().join("repo"));
    std::fs::create_dir_all(src.join("same")).unwrap();
    for n in ["rewrite", "chmod", "xattr", "recreate", "untouched"] {
        std::fs::write(src.join(n), format!("original content of {n:>10}")).unwrap();
    }
    for i in 0..50 {
        std::fs::write(src.join(format!("same/f{i}")), format!("{i}")).unwrap();
    }
    std::thread::sleep(Duration::from_millis(2100));
    init(&repo);
    ok(&repo, &["backup", src.to_str().unwrap()]);

    // Same size, mtime put back: only ctime tells.
    let p = src.join("rewrite");
    let (m, a) = (mtime(&p), atime(&p));
    std::fs::write(&p, "CHANGED content of    rewrite").unwrap();
    set_times(&p, a, m);
    // Mode only.
    std::fs::set_permissions(src.join("chmod"), std::fs::Permissions::from_mode(0o600)).unwrap();
    // Extended attribute only.
    rustix::fs::lsetxattr(
        src.join("xattr"),
        "user.added",
        b"later",
        rustix::fs::XattrFlags::empty(),
    )
    .unwrap();
    // Deleted and recreated with the same size and mtime (the inode may even be reused).
    let p = src.join("recreate");
    let (m, a) = (mtime(&p), atime(&p));
    std::fs::remove_file(&p).unwrap();
    std::fs::write(&p, "RECREATE content of   recreate").unwrap();
    set_times(&p, a, m);

    let r = json(&repo, &["backup", src.to_str().unwrap()]);
    assert_eq!(r["summary"]["files_read"], 4, "{r}");
    assert_eq!(r["files_unchanged"], 51, "{r}");
    // The unchanged subdirectory's tree was reused without re-encoding.
    assert!(r["trees_reused"].as_u64().unwrap() >= 1, "{r}");
    let target = t.path().join("target");
    ok(
        &repo,
        &["restore", "latest", "-t", target.to_str().unwrap()],
    );
    assert_same_tree(&src, &restored(&target, &src), false);
}

/// The local cache can be deleted at any time: the next backup fetches what
/// it needs from the repository, says so, and is correct.
#[test]
fn deleted_cache_is_rebuilt() {
    // Snapshots record the source's ancestor directories; /tmp changes all
    // the time while other tests run, which would add a root tree per run.
    let t = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let (src, repo) = (t.path().join("src"), t.path().join("repo"));
    std::fs::create_dir_all(src.join("d")).unwrap();
    for i in 0..100 {
        std::fs::write(src.join(format!("d/f{i}")), noise(5000, i)).unwrap();
    }
    std::thread::sleep(Duration::from_millis(2100));
    init(&repo);
    ok(&repo, &["backup", src.to_str().unwrap()]);
    // The first run created the cache beside src, changing their common
    // parent directory; the second records that once.
    ok(&repo, &["backup", src.to_str().unwrap()]);
    let warm = json(&repo, &["backup", src.to_str().unwrap()]);
    assert_eq!(warm["cache"]["fetched"], 0, "{warm}");
    assert!(warm["cache"]["hits"].as_u64().unwrap() > 0);
    // A current cache: opening (3), two listings, the new snapshot, the
    // session a prune respects (its put and delete, and one listing of
    // prune marks) and one listing of the quota are all that reach the
    // repository. Other tests creating directories in
    // the shared temporary directory change an ancestor's mtime, and then
    // the run stores one new tree: a pack and an index file more.
    let new_tree = if warm["storage"]["packs"].as_u64().unwrap() > 0 {
        2
    } else {
        0
    };
    assert!(
        warm["destination"]["requests"].as_u64().unwrap() <= 10 + new_tree,
        "{warm}"
    );
    assert_eq!(warm["summary"]["files_read"], 0, "{warm}");

    std::fs::remove_dir_all(repo.with_extension("cache")).unwrap();
    std::fs::write(src.join("d/f7"), noise(6000, 777)).unwrap();
    let o = capsule(&repo, &["backup", src.to_str().unwrap()]);
    assert!(o.status.success());
    assert!(String::from_utf8_lossy(&o.stdout).contains("cache was missing or behind"));
    let cold = json(&repo, &["backup", src.to_str().unwrap()]);
    assert_eq!(
        cold["cache"]["fetched"], 0,
        "the cache is current again: {cold}"
    );
    let target = t.path().join("target");
    ok(
        &repo,
        &["restore", "latest", "-t", target.to_str().unwrap()],
    );
    assert_same_tree(&src, &restored(&target, &src), false);
    // Damage in the cache is found and repaired, never trusted.
    let cache = repo.with_extension("cache");
    let tree_packs: Vec<_> = files_under(&cache)
        .into_iter()
        .filter(|p| p.to_string_lossy().contains("/tree/"))
        .collect();
    assert!(!tree_packs.is_empty());
    // f7 changed within a second of the last snapshot, so it would be re-read
    // by design (the racy-entry rule); let that window pass.
    std::thread::sleep(Duration::from_millis(2100));
    ok(&repo, &["backup", src.to_str().unwrap()]);
    for p in &tree_packs {
        std::fs::write(p, b"damaged").unwrap();
    }
    let r = json(&repo, &["backup", src.to_str().unwrap()]);
    assert!(r["cache"]["repaired"].as_u64().unwrap() >= 1, "{r}");
    assert_eq!(r["summary"]["files_read"], 0, "{r}");
}

/// The repository's objects of the kinds the cache keeps, by name
/// (`index/…`, `snapshots/…`, `tree/ab/…`), as `root` holds them: the
/// repository's directory, or a cache directory.
fn cached_kinds(root: &Path) -> std::collections::BTreeSet<String> {
    files_under(root)
        .into_iter()
        .filter_map(|p| {
            let parts: Vec<String> = p
                .strip_prefix(root)
                .unwrap()
                .iter()
                .map(|c| c.to_string_lossy().into_owned())
                .collect();
            let at = parts
                .iter()
                .position(|c| matches!(c.as_str(), "index" | "snapshots" | "tree"))?;
            Some(parts[at..].join("/"))
        })
        .collect()
}

/// Another machine's forgets and prunes leave nothing behind in this
/// machine's cache. They used to: a cache dropped only what its own host
/// deleted, so every index file, snapshot and tree pack the household's
/// desktop pruned stayed in each laptop's cache for ever, until the cache's
/// disk was full; from then on each run fetched every index file again
/// (the fleet year: 48 requests a run on day 203, 400 by day 216).
#[test]
fn the_cache_lets_go_of_what_others_pruned() {
    let t = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let (src, repo) = (t.path().join("src"), t.path().join("repo"));
    std::fs::create_dir_all(src.join("d")).unwrap();
    for i in 0..30 {
        std::fs::write(src.join(format!("d/f{i}")), noise(3000, i)).unwrap();
    }
    init(&repo);
    let desktop = t.path().join("desktop-cache");
    let on_desktop = |args: &[&str]| {
        let o = capsule_env(
            &repo,
            args,
            &[
                ("CAPSULE_PASSWORD", PASSWORD),
                ("CAPSULE_CACHE_DIR", desktop.to_str().unwrap()),
            ],
        );
        assert!(o.status.success(), "{args:?}: {}", said(&o));
    };
    let mut ever = std::collections::BTreeSet::new();
    for round in 0..5u64 {
        for k in 0..2u64 {
            let n = round * 2 + k;
            std::fs::write(src.join(format!("d/f{n}")), noise(4000, 100 + n)).unwrap();
            std::fs::write(src.join(format!("d/new{n}")), noise(2000, 200 + n)).unwrap();
            ok(&repo, &["backup", src.to_str().unwrap()]);
            ever.extend(cached_kinds(&repo));
        }
        on_desktop(&["forget", "--keep-last", "1"]);
        on_desktop(&["prune"]);
    }
    ok(&repo, &["backup", src.to_str().unwrap()]);
    let held = cached_kinds(&repo);
    let gone: Vec<_> = ever.difference(&held).collect();
    // The desktop turned the repository over: without the fix, all of
    // these would still be in the laptop's cache.
    assert!(gone.len() >= 10, "{gone:?}");
    let cached = cached_kinds(&repo.with_extension("cache"));
    let stale: Vec<_> = cached.difference(&held).collect();
    assert!(
        stale.is_empty(),
        "cached, gone from the repository: {stale:?}"
    );
    // What it keeps is what a run needs: nothing fetched, nothing read.
    std::thread::sleep(Duration::from_millis(2100));
    ok(&repo, &["backup", src.to_str().unwrap()]);
    let warm = json(&repo, &["backup", src.to_str().unwrap()]);
    assert_eq!(warm["cache"]["fetched"], 0, "{warm}");
    assert_eq!(warm["summary"]["files_read"], 0, "{warm}");
}

/// A cache whose disk is full costs every run the objects it cannot keep;
/// the run still succeeds, but says so (it used to say the cache "has been
/// brought up to date", run after run).
#[test]
fn a_full_cache_disk_is_named() {
    let Some(fs) = SmallFs::new("64k") else {
        return;
    };
    let t = tempfile::tempdir().unwrap();
    let (src, repo) = (t.path().join("src"), t.path().join("repo"));
    std::fs::create_dir_all(&src).unwrap();
    for i in 0..20 {
        std::fs::write(src.join(format!("f{i}")), noise(50_000, i)).unwrap();
    }
    init(&repo);
    let cache = fs.dir.join("cache");
    let run = || {
        capsule_env(
            &repo,
            &["--json", "backup", src.to_str().unwrap()],
            &[
                ("CAPSULE_PASSWORD", PASSWORD),
                ("CAPSULE_CACHE_DIR", cache.to_str().unwrap()),
            ],
        )
    };
    // The cache is made while there is room (on a disk full from the
    // start, capsule runs without one, and says that instead).
    let o = run();
    assert!(o.status.success(), "{}", said(&o));
    // Fill the small disk to its last block.
    let filler = fs.dir.join("filler");
    let mut f = std::fs::File::create(&filler).unwrap();
    let block = vec![7u8; 4096];
    for _ in 0..64 {
        if std::io::Write::write_all(&mut f, &block).is_err() {
            break;
        }
    }
    drop(f);
    let mut last = None;
    for _ in 0..2 {
        let o = run();
        assert!(o.status.success(), "{}", said(&o));
        last = Some(o);
    }
    let o = last.unwrap();
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert!(v["cache"]["unstored"].as_u64().unwrap() > 0, "{v}");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("local cache could not keep") && err.contains("No space left"),
        "{err}"
    );
    // Space again: the next run keeps what it fetches, and says nothing.
    std::fs::remove_file(&filler).unwrap();
    let o = run();
    assert!(o.status.success(), "{}", said(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["cache"]["unstored"], 0, "{v}");
    let o = run();
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["cache"]["fetched"], 0, "{v}");
}

/// A run with nothing changed over many small files spends its time
/// walking the source: the verdict says so ("scanning the source"), not
/// "fixed costs" as it did while the scan was not counted.
#[test]
fn a_no_change_run_of_many_files_is_named_scan_bound() {
    let t = tempfile::tempdir().unwrap();
    let (src, repo) = (t.path().join("src"), t.path().join("repo"));
    for d in 0..100 {
        let dir = src.join(format!("d{d:03}"));
        std::fs::create_dir_all(&dir).unwrap();
        for f in 0..300 {
            std::fs::write(dir.join(format!("f{f:03}")), [d as u8, f as u8]).unwrap();
        }
    }
    // Entries changed within a second of a snapshot are read again next
    // time (the racy-entry guard): let the tree settle.
    std::thread::sleep(Duration::from_millis(2100));
    init(&repo);
    // Without fsync: on a busy disk the commit's synced writes could
    // outlast the walk, and the run would rightly be named by them.
    json(&repo, &["--no-fsync", "backup", src.to_str().unwrap()]);
    let b = json(&repo, &["--no-fsync", "backup", src.to_str().unwrap()]);
    assert_eq!(b["files_unchanged"], 30_000, "{b}");
    assert_eq!(b["bound"]["kind"], "scan", "{}", b["bound"]);
    let summary = b["bound"]["summary"].as_str().unwrap();
    assert!(summary.contains("30101 entries"), "{summary}");
}

/// A large file appended to (a mailbox, a log) stores about what was
/// appended each run, not its whole last chunk again (0.5 to 4 MiB): the
/// tail of a file of 8 MiB or more is cut finer. The rule depends on the
/// bytes alone, so reading the file again unchanged (`--force`) stores
/// nothing.
#[test]
fn an_appended_large_file_stores_the_append_not_its_last_chunk() {
    let t = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let (src, repo) = (t.path().join("src"), t.path().join("repo"));
    std::fs::create_dir_all(&src).unwrap();
    let mut mbox = noise(8 * 1024 * 1024 + 300 * 1024, 1);
    std::fs::write(src.join("mbox"), &mbox).unwrap();
    init(&repo);
    ok(&repo, &["backup", src.to_str().unwrap()]);
    let mut added = Vec::new();
    for i in 0..4u64 {
        mbox.extend_from_slice(&noise(20_000, 10 + i));
        std::fs::write(src.join("mbox"), &mbox).unwrap();
        let r = json(&repo, &["backup", src.to_str().unwrap()]);
        added.push(r["summary"]["bytes_added"].as_u64().unwrap());
    }
    // Each run stores the append and the last fine piece (16 to 256 KiB)
    // again; one may meet a chunk-sized cut and store a chunk.
    let least = *added.iter().min().unwrap();
    assert!(
        least < 300 * 1024,
        "bytes added by the runs after appends of 20 kB: {added:?}"
    );
    let again = json(&repo, &["backup", "--force", src.to_str().unwrap()]);
    assert_eq!(
        again["summary"]["bytes_added"].as_u64(),
        Some(0),
        "the same bytes read again stored something: {again}"
    );
    let out = t.path().join("out");
    ok(&repo, &["restore", "latest", "-t", out.to_str().unwrap()]);
    let back = std::fs::read(restored(&out, &src).join("mbox")).unwrap();
    assert!(back == mbox, "the appended file restores byte for byte");
}
