//! A backup killed with SIGKILL leaves a valid repository: `check` passes,
//! earlier snapshots restore, and the next backup reuses what was uploaded.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod common;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::*;

/// Committed objects in a directory (not `.tmp-*` writes in progress).
fn count(dir: &Path) -> usize {
    std::fs::read_dir(dir)
        .map(|d| {
            d.filter_map(|e| e.ok())
                .filter(|e| !e.file_name().to_string_lossy().starts_with(".tmp-"))
                .count()
        })
        .unwrap_or(0)
}

fn spawn_backup(repo: &Path, src: &Path) -> std::process::Child {
    Command::new(env!("CARGO_BIN_EXE_capsule"))
        .args([
            "--repo",
            repo.to_str().unwrap(),
            "--json",
            "backup",
            src.to_str().unwrap(),
        ])
        .env("CAPSULE_PASSWORD", PASSWORD)
        // The same cache (and so the same journal) as the helpers use.
        .env("CAPSULE_CACHE_DIR", repo.with_extension("cache"))
        .env(
            "CAPSULE_STATE_DIR",
            repo.with_extension("cache").join("state"),
        )
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap()
}

/// Committed packs under `data/` (two-level fan-out).
fn data_packs(repo: &Path) -> usize {
    std::fs::read_dir(repo.join("data"))
        .map(|d| d.filter_map(|e| e.ok()).map(|e| count(&e.path())).sum())
        .unwrap_or(0)
}

/// The journal of landed-but-unindexed packs in the test cache.
fn journal(repo: &Path) -> Option<std::path::PathBuf> {
    journal_in(&repo.with_extension("cache"))
}

#[test]
fn killed_before_its_first_index_the_next_run_indexes_landed_packs() {
    let t = tempfile::tempdir().unwrap();
    let (src, repo) = (t.path().join("src"), t.path().join("repo"));
    std::fs::create_dir_all(&src).unwrap();
    let total: u64 = 28 * (10 << 20);
    for i in 0..28u64 {
        std::fs::write(src.join(format!("f{i:02}")), noise(10 << 20, 300 + i)).unwrap();
    }
    init(&repo);

    // Kill once packs have landed (and are journalled) but before the
    // first index file: without the journal they would all be sent again.
    let mut child = spawn_backup(&repo, &src);
    let deadline = Instant::now() + Duration::from_secs(60);
    while !(data_packs(&repo) >= 2 && journal(&repo).is_some()) && Instant::now() < deadline {
        assert!(
            child.try_wait().unwrap().is_none(),
            "backup finished before it could be killed; make the source larger"
        );
        std::thread::sleep(Duration::from_millis(2));
    }
    child.kill().unwrap();
    child.wait().unwrap();
    let landed = data_packs(&repo);
    assert!(landed >= 2, "no packs landed before the deadline");
    let before = json(&repo, &["check"]);
    let unindexed = before["report"]["unindexed_packs"]
        .as_array()
        .unwrap()
        .len();
    assert!(
        unindexed >= 1,
        "the kill came after the first index file; nothing to recover: {before}"
    );

    let r = json(&repo, &["backup", src.to_str().unwrap()]);
    let recovered = r["storage"]["packs_recovered"].as_u64().unwrap() as usize;
    // A pack that landed in the instant between its put returning and its
    // journal entry being written is not known to the journal; the rest are.
    assert!(
        recovered >= 1 && recovered <= unindexed,
        "recovered {recovered} of {unindexed} landed, unindexed packs"
    );
    let added = r["storage"]["stored_bytes_added"].as_u64().unwrap();
    assert!(
        added + (recovered as u64) * (15 << 20) <= total + (1 << 20),
        "recovered packs were uploaded again: added {added} of {total}"
    );
    // What the journal knew is indexed now, and the journal is gone.
    let after = json(&repo, &["check", "--read-data"]);
    assert_eq!(
        after["report"]["unindexed_packs"].as_array().unwrap().len(),
        unindexed - recovered
    );
    assert!(
        journal(&repo).is_none(),
        "a completed run leaves no journal"
    );
    let target = t.path().join("t");
    ok(
        &repo,
        &["restore", "latest", "-t", target.to_str().unwrap()],
    );
    assert_same_tree(&src, &restored(&target, &src), false);
}

#[test]
fn kill_mid_backup_leaves_repository_valid_and_resumable() {
    let t = tempfile::tempdir().unwrap();
    let (base, src, repo) = (
        t.path().join("base"),
        t.path().join("src"),
        t.path().join("repo"),
    );
    std::fs::create_dir_all(&base).unwrap();
    std::fs::write(base.join("keep"), noise(1 << 20, 7)).unwrap();
    std::fs::create_dir_all(&src).unwrap();
    let total: u64 = 28 * (10 << 20);
    for i in 0..28u64 {
        std::fs::write(src.join(format!("f{i:02}")), noise(10 << 20, 100 + i)).unwrap();
    }
    init(&repo);
    ok(&repo, &["backup", base.to_str().unwrap()]);
    let idx0 = count(&repo.join("index"));

    // Kill 1: as soon as the backup has indexed some packs (mid-way).
    let mut child = spawn_backup(&repo, &src);
    let deadline = Instant::now() + Duration::from_secs(60);
    while count(&repo.join("index")) == idx0 && Instant::now() < deadline {
        if child.try_wait().unwrap().is_some() {
            panic!("backup finished before it could be killed; make the source larger");
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    child.kill().unwrap();
    let st = child.wait().unwrap();
    assert!(!st.success(), "the backup must have been killed");
    assert!(
        count(&repo.join("index")) > idx0,
        "no index was written before the kill"
    );

    // Kill 2: very early, while the first packs are being written.
    let mut child = spawn_backup(&repo, &src);
    std::thread::sleep(Duration::from_millis(150));
    child.kill().unwrap();
    child.wait().unwrap();

    // The repository is valid and holds only the first snapshot.
    ok(&repo, &["check"]);
    let snaps = json(&repo, &["snapshots"]);
    assert_eq!(snaps.as_array().unwrap().len(), 1);
    let target = t.path().join("t0");
    ok(
        &repo,
        &["restore", "latest", "-t", target.to_str().unwrap()],
    );
    assert_same_tree(&base, &restored(&target, &base), false);

    // The next backup completes and does not upload again what was indexed.
    let r = json(&repo, &["backup", src.to_str().unwrap()]);
    let added = r["storage"]["stored_bytes_added"].as_u64().unwrap();
    assert!(
        added + (40 << 20) <= total,
        "re-uploaded too much: {added} of {total}"
    );
    ok(&repo, &["check", "--read-data"]);
    let target = t.path().join("t1");
    ok(
        &repo,
        &["restore", "latest", "-t", target.to_str().unwrap()],
    );
    assert_same_tree(&src, &restored(&target, &src), false);
}
