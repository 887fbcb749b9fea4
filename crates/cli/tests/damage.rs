//! Damaged repositories: `check` finds every flipped bit, truncation or lost
//! object, names what it affects, and restore still recovers the rest.

// The command-line suite runs on Linux, against real servers, btrfs,
// fanotify and network namespaces; the macOS build checks the libraries.
#![cfg(target_os = "linux")]
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod common;

use std::path::{Path, PathBuf};

use common::*;

fn objects(repo: &Path, prefix: &str) -> Vec<PathBuf> {
    files_under(&repo.join(prefix))
}

fn flip(p: &Path, offset: u64, bit: u8) {
    use std::os::unix::fs::FileExt;
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(p)
        .unwrap();
    let mut b = [0u8; 1];
    f.read_exact_at(&mut b, offset).unwrap();
    b[0] ^= 1 << bit;
    f.write_all_at(&b, offset).unwrap();
}

fn copy_dir(from: &Path, to: &Path) {
    let st = std::process::Command::new("cp")
        .arg("-a")
        .arg(from)
        .arg(to)
        .status()
        .unwrap();
    assert!(st.success());
}

/// Two snapshots; the second adds file B, whose data lands in its own pack.
/// Returns (tempdir, src, repo, pack holding B, tree pack of snapshot 2).
fn setup() -> (tempfile::TempDir, PathBuf, PathBuf, PathBuf, PathBuf) {
    let t = tempfile::tempdir().unwrap();
    let (src, repo) = (t.path().join("src"), t.path().join("repo"));
    std::fs::create_dir_all(src.join("sub")).unwrap();
    std::fs::write(src.join("A"), noise(3 << 20, 1)).unwrap();
    std::fs::write(src.join("sub/small"), b"small file").unwrap();
    init(&repo);
    ok(&repo, &["backup", src.to_str().unwrap()]);
    let before: Vec<PathBuf> = ["data", "tree"]
        .iter()
        .flat_map(|d| objects(&repo, d))
        .collect();
    std::fs::write(src.join("B"), noise(2 << 20, 2)).unwrap();
    ok(&repo, &["backup", src.to_str().unwrap()]);
    let new = |d: &str| -> Vec<PathBuf> {
        objects(&repo, d)
            .into_iter()
            .filter(|p| !before.contains(p))
            .collect()
    };
    let (data, tree) = (new("data"), new("tree"));
    assert_eq!(
        (data.len(), tree.len()),
        (1, 1),
        "expected one new data pack and one tree pack: {data:?} {tree:?}"
    );
    let (tree_pack, b_pack) = (tree[0].clone(), data[0].clone());
    (t, src, repo, b_pack, tree_pack)
}

fn check_json(repo: &Path, read_data: bool) -> (Option<i32>, serde_json::Value) {
    let mut args = vec!["--json", "check"];
    if read_data {
        args.push("--read-data");
    }
    let o = capsule(repo, &args);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&o.stdout)));
    (o.status.code(), v)
}

fn problem_for<'a>(v: &'a serde_json::Value, object_suffix: &str) -> &'a serde_json::Value {
    v["report"]["problems"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["object"].as_str().unwrap().ends_with(object_suffix))
        .unwrap_or_else(|| panic!("no problem reported for {object_suffix}: {v:#}"))
}

fn affected(p: &serde_json::Value) -> Vec<String> {
    p["affected"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap().to_string())
        .collect()
}

#[test]
fn flipped_bit_in_data_pack_is_found_and_the_rest_restores() {
    let (t, src, repo, b_pack, _) = setup();
    let (code, v) = check_json(&repo, true);
    assert_eq!(code, Some(0), "{v:#}");
    flip(&b_pack, 1000, 3);
    // Structure alone cannot see a flipped bit inside a blob...
    let (code, _) = check_json(&repo, false);
    assert_eq!(code, Some(0));
    // ...reading the data does, and names the file that depends on it.
    let (code, v) = check_json(&repo, true);
    assert_eq!(code, Some(12));
    let name = b_pack.file_name().unwrap().to_str().unwrap();
    let p = problem_for(&v, name);
    let aff = affected(p);
    assert!(aff.iter().any(|a| a.ends_with("/src/B")), "{aff:?}");
    assert!(!aff.iter().any(|a| a.ends_with("/src/A")), "{aff:?}");
    // Restore recovers everything else and says what it could not.
    let target = t.path().join("target");
    let o = capsule(
        &repo,
        &["restore", "latest", "-t", target.to_str().unwrap()],
    );
    assert_eq!(o.status.code(), Some(3));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("/B") && err.contains("damaged"), "{err}");
    let r = restored(&target, &src);
    assert_eq!(
        std::fs::read(r.join("A")).unwrap(),
        std::fs::read(src.join("A")).unwrap()
    );
    assert_eq!(std::fs::read(r.join("sub/small")).unwrap(), b"small file");
}

/// One flipped bit anywhere in any pack, index or snapshot is detected.
#[test]
fn any_single_bit_flip_is_detected() {
    let (t, _, repo, _, _) = setup();
    let mut objs: Vec<PathBuf> = ["data", "tree", "index", "snapshots"]
        .iter()
        .flat_map(|p| objects(&repo, p))
        .collect();
    objs.sort();
    let mut rng = 0x1234_5678_9abc_def0_u64;
    let mut next = || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    for round in 0..40 {
        let victim_repo = t.path().join(format!("r{round}"));
        copy_dir(&repo, &victim_repo);
        let i = (next() % objs.len() as u64) as usize;
        let rel = objs[i].strip_prefix(&repo).unwrap();
        let p = victim_repo.join(rel);
        let len = std::fs::metadata(&p).unwrap().len();
        // Bias half the rounds to the last 64 bytes: trailer and header.
        let off = if round % 2 == 0 {
            next() % len
        } else {
            len - 1 - next() % 64.min(len)
        };
        flip(&p, off, (next() % 8) as u8);
        let (code, v) = check_json(&victim_repo, true);
        assert_eq!(
            code,
            Some(12),
            "flip at {}:{off} not detected: {v:#}",
            rel.display()
        );
        let name = rel.file_name().unwrap().to_str().unwrap();
        assert!(
            v.to_string().contains(name),
            "problem does not name {}: {v:#}",
            rel.display()
        );
        std::fs::remove_dir_all(&victim_repo).unwrap();
    }
}

#[test]
fn truncated_pack_is_found_by_structural_check() {
    let (_t, _, repo, b_pack, _) = setup();
    let len = std::fs::metadata(&b_pack).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&b_pack)
        .unwrap()
        .set_len(len - 100)
        .unwrap();
    let (code, v) = check_json(&repo, false);
    assert_eq!(code, Some(12));
    let p = problem_for(&v, b_pack.file_name().unwrap().to_str().unwrap());
    assert!(p["problem"].as_str().unwrap().contains("truncated"), "{p}");
    assert!(affected(p).iter().any(|a| a.ends_with("/src/B")));
}

#[test]
fn lost_index_file_is_reported_with_affected_files() {
    let (_t, _, repo, _, _) = setup();
    // The newest index file lists B's pack.
    let mut idx = objects(&repo, "index");
    idx.sort_by_key(|p| std::fs::metadata(p).unwrap().modified().unwrap());
    std::fs::remove_file(idx.last().unwrap()).unwrap();
    let (code, v) = check_json(&repo, false);
    assert_eq!(code, Some(12), "{v:#}");
    let all: Vec<String> = v["report"]["problems"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(affected)
        .collect();
    // The lost index listed the second snapshot's packs, root tree included:
    // that whole snapshot is affected, the first one is not.
    let second = json(&repo, &["snapshots"])[1]["id"].as_str().unwrap()[..8].to_string();
    assert!(all.iter().any(|a| a.starts_with(&second)), "{v:#}");
    assert_eq!(v["report"]["unindexed_packs"].as_array().unwrap().len(), 2);
}

#[test]
fn damaged_tree_names_the_directory() {
    let (_t, _, repo, _, tree_pack) = setup();
    flip(&tree_pack, 40, 0);
    let (code, v) = check_json(&repo, false);
    assert_eq!(code, Some(12), "{v:#}");
    let problems = v["report"]["problems"].as_array().unwrap();
    assert!(
        problems
            .iter()
            .any(|p| p["object"].as_str().unwrap().starts_with("tree ") && !affected(p).is_empty()),
        "{v:#}"
    );
    // Older snapshot (other trees) still lists.
    let snaps = json(&repo, &["snapshots"]);
    let first = snaps[0]["id"].as_str().unwrap();
    ok(&repo, &["ls", first]);
}

/// A missing tree pack loses the directories it held, not the restore: the
/// rest of the snapshot is restored and the loss is reported.
#[test]
fn missing_tree_pack_loses_only_its_directories() {
    let (t, src, repo, _, tree_pack) = setup();
    // The first backup's tree pack holds `sub`, which snapshot 2 reuses.
    for p in objects(&repo, "tree") {
        if p != tree_pack {
            std::fs::remove_file(p).unwrap();
        }
    }
    let target = t.path().join("target");
    let o = capsule(
        &repo,
        &[
            "--no-cache",
            "restore",
            "latest",
            "-t",
            target.to_str().unwrap(),
        ],
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(3), "{err}");
    assert!(err.contains("directory contents lost"), "{err}");
    let r = restored(&target, &src);
    assert_eq!(
        std::fs::read(r.join("A")).unwrap(),
        std::fs::read(src.join("A")).unwrap()
    );
    assert_eq!(
        std::fs::read(r.join("B")).unwrap(),
        std::fs::read(src.join("B")).unwrap()
    );
    assert!(!r.join("sub/small").exists());
}
