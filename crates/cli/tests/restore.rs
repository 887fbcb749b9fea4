//! Restoring again: into a target that already holds the snapshot, after
//! an interrupted restore, with `--overwrite`, `--delete` and `--verify`.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use common::*;

/// A source of `n` files of `size` bytes in a few directories, backed up.
fn backed_up(n: usize, size: usize) -> (tempfile::TempDir, PathBuf, PathBuf) {
    let t = tempfile::tempdir().unwrap();
    let (src, repo) = (t.path().join("src"), t.path().join("repo"));
    for i in 0..n {
        let d = src.join(format!("d{}", i % 4));
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join(format!("f{i:04}")), noise(size, i as u64 + 1)).unwrap();
    }
    init(&repo);
    ok(&repo, &["backup", src.to_str().unwrap()]);
    (t, src, repo)
}

fn restore_json(repo: &Path, target: &Path, extra: &[&str]) -> serde_json::Value {
    let mut a = vec![
        "--no-cache",
        "restore",
        "latest",
        "--target",
        target.to_str().unwrap(),
    ];
    a.extend_from_slice(extra);
    json(repo, &a)
}

fn n(v: &serde_json::Value, k: &str) -> u64 {
    v[k].as_u64().unwrap_or_else(|| panic!("no {k} in {v}"))
}

#[test]
fn restoring_into_an_unchanged_target_fetches_nothing() {
    let (t, src, repo) = backed_up(40, 50_000);
    let target = t.path().join("target");
    let first = restore_json(&repo, &target, &[]);
    assert_eq!(n(&first, "files"), 40);
    assert!(n(&first["fetch"], "requests") > 0);
    let again = restore_json(&repo, &target, &[]);
    assert_eq!(n(&again, "files"), 0, "{again}");
    assert_eq!(n(&again, "unchanged"), 40);
    assert_eq!(n(&again["fetch"], "requests"), 0);
    assert_same_tree(&src, &restored(&target, &src), false);
}

/// The state a killed restore leaves, made exactly: complete files, files
/// created at full length but only partly written (mtime not yet set),
/// and files not created at all. The next restore writes only the last
/// two kinds, and the target ends identical to the snapshot.
#[test]
fn an_interrupted_restore_finishes_and_fetches_only_what_was_incomplete() {
    let (t, src, repo) = backed_up(40, 50_000);
    let target = t.path().join("target");
    restore_json(&repo, &target, &[]);
    let files = files_under(&restored(&target, &src));
    assert_eq!(files.len(), 40);
    for f in &files[..5] {
        // Full length, garbage tail, mtime of "now": as a killed write.
        let mut b = std::fs::read(f).unwrap();
        let len = b.len();
        b[len / 2..].fill(0);
        std::fs::write(f, &b).unwrap();
    }
    for f in &files[5..10] {
        std::fs::remove_file(f).unwrap();
    }
    let again = restore_json(&repo, &target, &[]);
    assert_eq!(n(&again, "files"), 10, "{again}");
    assert_eq!(n(&again, "unchanged"), 30);
    assert_same_tree(&src, &restored(&target, &src), false);
}

/// A real kill -9 mid-restore, then the same command again: identical
/// output, and the second run fetches less than a whole restore needs when
/// the first got anywhere.
#[test]
fn a_restore_killed_with_sigkill_resumes() {
    let (t, src, repo) = backed_up(200, 200_000);
    let target = t.path().join("target");
    let full = restore_json(&repo, &t.path().join("reference"), &[]);
    let mut child = Command::new(env!("CARGO_BIN_EXE_capsule"))
        .args([
            "--repo",
            repo.to_str().unwrap(),
            "--no-cache",
            "--connections",
            "1",
        ])
        .args(["restore", "latest", "--target", target.to_str().unwrap()])
        .env("CAPSULE_PASSWORD", PASSWORD)
        .env("CAPSULE_CACHE_DIR", repo.with_extension("cache"))
        .env(
            "CAPSULE_STATE_DIR",
            repo.with_extension("cache").join("state"),
        )
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    // Bounded wait for a fifth of the files to appear, then SIGKILL.
    let deadline = Instant::now() + Duration::from_secs(60);
    let dir = restored(&target, &src);
    while Instant::now() < deadline && child.try_wait().unwrap().is_none() {
        if dir.exists() && files_under(&dir).len() >= 40 {
            break;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    let _ = child.kill();
    let status = child.wait().unwrap();
    let killed = !status.success();
    let again = restore_json(&repo, &target, &[]);
    assert_same_tree(&src, &dir, false);
    let (needed, refetched) = (
        n(&full["fetch"], "bytes_needed"),
        n(&again["fetch"], "bytes_needed"),
    );
    eprintln!("killed: {killed}; second run needed {refetched} of {needed} bytes");
    assert!(refetched <= needed);
    if killed {
        assert!(n(&again, "unchanged") > 0 || refetched == needed, "{again}");
    }
}

#[test]
fn delete_makes_the_target_equal_the_snapshot_but_spares_excluded_names() {
    let (t, src, repo) = backed_up(8, 10_000);
    let target = t.path().join("target");
    restore_json(&repo, &target, &[]);
    let dir = restored(&target, &src);
    std::fs::write(dir.join("d0/extra"), b"not in the snapshot").unwrap();
    std::fs::create_dir_all(dir.join("d1/extra-dir/deeper")).unwrap();
    std::fs::write(dir.join("d1/extra-dir/deeper/x"), b"x").unwrap();
    std::fs::write(dir.join("d2/keep.local"), b"excluded").unwrap();
    std::os::unix::fs::symlink("/etc", dir.join("d3/link-out")).unwrap();
    let r = restore_json(&repo, &target, &["--delete", "--exclude", "*.local"]);
    // extra, extra-dir, deeper, x, link-out
    assert_eq!(n(&r, "deleted"), 5, "{r}");
    assert!(dir.join("d2/keep.local").exists());
    assert!(Path::new("/etc/passwd").exists());
    // Without the excluded file, another restore puts d2's times back.
    std::fs::remove_file(dir.join("d2/keep.local")).unwrap();
    restore_json(&repo, &target, &[]);
    assert_same_tree(&src, &dir, false);
}

#[test]
fn overwrite_never_and_if_newer_keep_what_the_target_has() {
    let (t, src, repo) = backed_up(4, 10_000);
    let target = t.path().join("target");
    restore_json(&repo, &target, &[]);
    let f = restored(&target, &src).join("d0/f0000");
    std::fs::write(&f, b"edited after the backup").unwrap();
    let r = restore_json(&repo, &target, &["--overwrite", "never"]);
    assert_eq!((n(&r, "kept"), n(&r, "files")), (1, 0), "{r}");
    let r = restore_json(&repo, &target, &["--overwrite", "if-newer"]);
    assert_eq!((n(&r, "kept"), n(&r, "files")), (1, 0), "{r}");
    assert_eq!(std::fs::read(&f).unwrap(), b"edited after the backup");
    // Older than the snapshot's copy: if-newer replaces it.
    set_times(&f, (1, 0), (1, 0));
    let r = restore_json(&repo, &target, &["--overwrite", "if-newer"]);
    assert_eq!((n(&r, "kept"), n(&r, "files")), (0, 1), "{r}");
    assert_same_tree(&src, &restored(&target, &src), false);
    let r = restore_json(&repo, &target, &["--overwrite", "always"]);
    assert_eq!((n(&r, "files"), n(&r, "unchanged")), (4, 0), "{r}");
}

#[test]
fn verify_finds_content_changed_behind_an_unchanged_size_and_mtime() {
    let (t, src, repo) = backed_up(4, 10_000);
    let target = t.path().join("target");
    restore_json(&repo, &target, &[]);
    let f = restored(&target, &src).join("d1/f0001");
    let m = std::fs::symlink_metadata(&f).unwrap();
    let mut b = std::fs::read(&f).unwrap();
    b[100] ^= 1;
    std::fs::write(&f, &b).unwrap();
    use std::os::unix::fs::MetadataExt;
    set_times(&f, (m.atime(), m.atime_nsec()), (m.mtime(), m.mtime_nsec()));
    // Size and mtime match: the default keeps it (as rsync would).
    let r = restore_json(&repo, &target, &[]);
    assert_eq!(n(&r, "unchanged"), 4);
    // --verify compares content, rewrites it, and reads back what it wrote.
    let r = restore_json(&repo, &target, &["--verify"]);
    assert_eq!(
        (n(&r, "files"), n(&r, "unchanged"), n(&r, "verified")),
        (1, 3, 1),
        "{r}"
    );
    assert_same_tree(&src, &restored(&target, &src), false);
}

/// A small tmpfs, unmounted on drop.
struct SmallFs {
    dir: PathBuf,
    _t: tempfile::TempDir,
}

impl SmallFs {
    fn new(size: &str) -> Option<SmallFs> {
        if !is_root() {
            assert!(
                std::env::var_os("CAPSULE_REQUIRE_SERVERS").is_none(),
                "the full-target test needs root (a tmpfs mount)"
            );
            eprintln!("skipped: a tmpfs mount needs root");
            return None;
        }
        let t = tempfile::tempdir().unwrap();
        let dir = t.path().join("mnt");
        std::fs::create_dir(&dir).unwrap();
        let st = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(&dir)
            .status()
            .unwrap();
        assert!(st.success(), "mount tmpfs");
        Some(SmallFs { dir, _t: t })
    }
}

impl Drop for SmallFs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.dir).status();
    }
}

/// A target disk that fills up: exit 16 with one clear line, and no file
/// left looking complete when it is not. After space is freed, the same
/// command finishes the job.
#[test]
fn a_full_target_is_exit_16_and_leaves_no_incomplete_file() {
    let (t, src, repo) = backed_up(40, 200_000);
    let Some(fs) = SmallFs::new("3m") else { return };
    let target = fs.dir.join("target");
    let o = capsule(
        &repo,
        &[
            "--no-cache",
            "restore",
            "latest",
            "--target",
            target.to_str().unwrap(),
        ],
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(16), "{err}");
    assert!(err.contains("full"), "{err}");
    let dir = restored(&target, &src);
    let left = files_under(&dir);
    for f in &left {
        let rel = f.strip_prefix(&dir).unwrap();
        assert_eq!(
            std::fs::read(f).unwrap(),
            std::fs::read(src.join(rel)).unwrap(),
            "{} is left incomplete",
            rel.display()
        );
    }
    eprintln!("{} complete files left; stderr: {err}", left.len());
    // Nothing about the repository was harmed: a restore with room to
    // spare completes.
    drop(fs);
    let target = t.path().join("target2");
    let r = restore_json(&repo, &target, &[]);
    assert_eq!(n(&r, "files"), 40);
    assert_same_tree(&src, &restored(&target, &src), false);
}

/// Restoring one folder of a snapshot reads only the packs holding it, and
/// `--json` says how many of the repository's packs that was.
#[test]
fn a_partial_restore_reads_only_the_packs_it_needs() {
    let t = tempfile::tempdir().unwrap();
    let (src, repo) = (t.path().join("src"), t.path().join("repo"));
    // Two folders backed up in two runs, so their data is in different packs.
    for (d, seed) in [("one", 1), ("two", 2)] {
        std::fs::create_dir_all(src.join(d)).unwrap();
        std::fs::write(src.join(d).join("big"), noise(20 << 20, seed)).unwrap();
        if d == "one" {
            init(&repo);
        }
        ok(&repo, &["backup", src.to_str().unwrap()]);
    }
    let include = format!("{}/one", src.display());
    let r = restore_json(&repo, &t.path().join("target"), &["--include", &include]);
    let f = &r["fetch"];
    assert_eq!(n(&r, "files"), 1, "{r}");
    assert!(n(f, "packs") < n(f, "packs_in_repository"), "{f}");
    assert!(n(f, "bytes_fetched") < 21 << 20, "{f}");
    assert_eq!(
        std::fs::read(restored(&t.path().join("target"), &src).join("one/big")).unwrap(),
        noise(20 << 20, 1)
    );
}
