//! Restoring again: into a target that already holds the snapshot, after
//! an interrupted restore, with `--overwrite`, `--delete` and `--verify`.

// The command-line suite runs on Linux, against real servers, btrfs,
// fanotify and network namespaces; the macOS build checks the libraries.
#![cfg(target_os = "linux")]
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
    let mut child = capsule_cmd(&TestEnv::beside(&repo).password(PASSWORD))
        .args([
            "--repo",
            repo.to_str().unwrap(),
            "--no-cache",
            "--connections",
            "1",
        ])
        .args(["restore", "latest", "--target", target.to_str().unwrap()])
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

/// Files below `root`, as paths relative to it, sorted.
fn rel_files(root: &Path) -> Vec<String> {
    let mut v: Vec<String> = files_under(root)
        .iter()
        .map(|p| p.strip_prefix(root).unwrap().display().to_string())
        .collect();
    v.sort();
    v
}

/// Issue 30.1: `--delete` of a snapshot of one folder, restored into a
/// target laid out like `/`, removes nothing above or beside that folder.
/// The old code emptied every ancestor (the target itself included).
#[test]
fn delete_stays_inside_the_snapshots_sources() {
    let t = tempfile::tempdir().unwrap();
    let (root, repo) = (t.path().join("fakeroot"), t.path().join("repo"));
    let docs = root.join("home/me/Documents");
    std::fs::create_dir_all(&docs).unwrap();
    std::fs::create_dir_all(root.join("home/me/Pictures")).unwrap();
    std::fs::create_dir_all(root.join("etc")).unwrap();
    std::fs::write(docs.join("report.txt"), b"v1").unwrap();
    std::fs::write(root.join("home/me/Pictures/photo.jpg"), b"p").unwrap();
    std::fs::write(root.join("home/me/.ssh_key"), b"s").unwrap();
    std::fs::write(root.join("etc/passwd_fake"), b"c").unwrap();
    init(&repo);
    ok(&repo, &["backup", docs.to_str().unwrap()]);

    // The target holds a copy of the whole fake root where the snapshot's
    // paths put it, plus one file inside Documents the snapshot lacks.
    let target = t.path().join("t2");
    let copy = restored(&target, &root);
    std::fs::create_dir_all(copy.parent().unwrap()).unwrap();
    let st = Command::new("cp")
        .arg("-a")
        .arg(&root)
        .arg(copy.parent().unwrap())
        .status()
        .unwrap();
    assert!(st.success());
    std::fs::write(target.join("toplevel_file"), b"x").unwrap();
    std::fs::write(copy.join("home/me/Documents/stray.txt"), b"new").unwrap();
    let before = rel_files(&target);

    // A dry run lists exactly the stray file and changes nothing.
    let dry = restore_json(&repo, &target, &["--delete", "--dry-run"]);
    assert_eq!(dry["dry_run"], true, "{dry}");
    let listed: Vec<&str> = dry["deleted_paths"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["path"].as_str().unwrap())
        .collect();
    assert_eq!(listed.len(), 1, "{dry}");
    assert!(listed[0].ends_with("home/me/Documents/stray.txt"), "{dry}");
    assert_eq!(rel_files(&target), before);

    let r = restore_json(&repo, &target, &["--delete"]);
    assert_eq!(n(&r, "deleted"), 1, "{r}");
    assert!(r["deleted_paths"][0]["path"]
        .as_str()
        .unwrap()
        .ends_with("Documents/stray.txt"));
    let mut expect = before.clone();
    expect.retain(|p| !p.ends_with("stray.txt"));
    assert_eq!(rel_files(&target), expect);
    assert!(target.join("toplevel_file").exists());
    assert!(copy.join("home/me/.ssh_key").exists());
    assert!(copy.join("etc/passwd_fake").exists());
    assert!(copy.join("home/me/Pictures/photo.jpg").exists());
}

/// Two sources under one parent: the sibling that is not a source survives
/// a `--delete`, and so does a file beside the sources in their parent.
#[test]
fn delete_spares_a_sibling_of_two_sources() {
    let t = tempfile::tempdir().unwrap();
    let (src, repo) = (t.path().join("src"), t.path().join("repo"));
    for d in ["a", "b", "c"] {
        std::fs::create_dir_all(src.join(d)).unwrap();
        std::fs::write(src.join(d).join("f"), d.as_bytes()).unwrap();
    }
    init(&repo);
    ok(
        &repo,
        &[
            "backup",
            src.join("a").to_str().unwrap(),
            src.join("b").to_str().unwrap(),
        ],
    );
    let target = t.path().join("target");
    restore_json(&repo, &target, &[]);
    let dir = restored(&target, &src);
    std::fs::create_dir_all(dir.join("c")).unwrap();
    std::fs::write(dir.join("c/f"), b"c").unwrap();
    std::fs::write(dir.join("beside"), b"x").unwrap();
    std::fs::write(dir.join("a/extra"), b"x").unwrap();
    let r = restore_json(&repo, &target, &["--delete"]);
    assert_eq!(n(&r, "deleted"), 1, "{r}");
    assert!(!dir.join("a/extra").exists());
    assert!(dir.join("c/f").exists());
    assert!(dir.join("beside").exists());
    // With --include of one source, the other is out of scope too.
    std::fs::write(dir.join("a/extra"), b"x").unwrap();
    std::fs::write(dir.join("b/extra"), b"x").unwrap();
    let inc = format!("{}/b", src.display());
    let r = restore_json(&repo, &target, &["--delete", "--include", &inc]);
    assert_eq!(n(&r, "deleted"), 1, "{r}");
    assert!(dir.join("a/extra").exists());
    assert!(!dir.join("b/extra").exists());
}

/// A source whose name is not UTF-8 is kept in the snapshot with U+FFFD:
/// `--delete` cannot match it exactly, so it deletes nothing below it (a
/// loose match could reach a sibling differing only there) and says so.
#[test]
fn delete_below_a_source_that_is_not_utf8_is_skipped_and_said() {
    use std::os::unix::ffi::OsStrExt;
    let t = tempfile::tempdir().unwrap();
    let repo = t.path().join("repo");
    let src = t.path().join(std::ffi::OsStr::from_bytes(b"src-\xff"));
    std::fs::create_dir_all(&src).unwrap();
    std::fs::write(src.join("f"), b"f").unwrap();
    init(&repo);
    let o = capsule_cmd(&TestEnv::beside(&repo).password(PASSWORD))
        .arg("--repo")
        .arg(&repo)
        .arg("backup")
        .arg(&src)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let target = t.path().join("target");
    restore_json(&repo, &target, &[]);
    let dir = target.join(src.strip_prefix("/").unwrap());
    assert!(dir.join("f").exists(), "restored under its real name");
    std::fs::write(dir.join("extra"), b"x").unwrap();
    let o = capsule(
        &repo,
        &[
            "--no-cache",
            "--json",
            "restore",
            "latest",
            "--target",
            target.to_str().unwrap(),
            "--delete",
        ],
    );
    // Less than asked was done: exit 3 (incomplete), not 0.
    assert_eq!(
        o.status.code(),
        Some(3),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let r: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(n(&r, "deleted"), 0, "{r}");
    assert!(dir.join("extra").exists());
    let notices = r["notices"].to_string();
    assert!(notices.contains("not valid UTF-8"), "{r}");
}

/// A snapshot whose source is `/` puts the whole target in scope: what the
/// target holds beyond the snapshot goes, at its top too. (`/` itself is
/// backed up with everything but the test's own tree excluded.)
#[test]
fn delete_of_a_snapshot_of_root_covers_the_whole_target() {
    let t = tempfile::tempdir().unwrap();
    let (src, repo) = (t.path().join("src"), t.path().join("repo"));
    std::fs::create_dir_all(src.join("d")).unwrap();
    std::fs::write(src.join("d/f"), b"f").unwrap();
    init(&repo);
    // Back up `/` but exclude everything outside `src` (and the repo).
    let mut args = vec!["backup".to_string(), "/".to_string()];
    for e in std::fs::read_dir("/").unwrap() {
        let p = e.unwrap().path();
        if !src.starts_with(&p) {
            args.push("--exclude".into());
            args.push(p.display().to_string());
        }
    }
    // Everything beside `src` on its way down from `/` is excluded too.
    let mut up = src.clone();
    while let Some(parent) = up.parent() {
        if parent == Path::new("/") {
            break;
        }
        for e in std::fs::read_dir(parent).unwrap() {
            let p = e.unwrap().path();
            if p != up {
                args.push("--exclude".into());
                args.push(p.display().to_string());
            }
        }
        up = parent.to_path_buf();
    }
    let a: Vec<&str> = args.iter().map(String::as_str).collect();
    ok(&repo, &a);
    let target = t.path().join("target");
    std::fs::create_dir_all(&target).unwrap();
    std::fs::write(target.join("toplevel_file"), b"x").unwrap();
    let r = restore_json(&repo, &target, &["--delete", "--dry-run"]);
    let listed: Vec<&str> = r["deleted_paths"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["path"].as_str().unwrap())
        .collect();
    assert!(
        listed.iter().any(|p| p.ends_with("/toplevel_file")),
        "a snapshot of / has the whole target in scope: {r}"
    );
    let r = restore_json(&repo, &target, &["--delete"]);
    assert!(!target.join("toplevel_file").exists(), "{r}");
    assert_eq!(
        std::fs::read(restored(&target, &src).join("d/f")).unwrap(),
        b"f"
    );
}

/// Issue 30.4: a restore killed with SIGKILL at seeded moments never leaves
/// a file under its real name that differs from the snapshot (the old code
/// wrote in place: files with the snapshot's size and a zero tail). What it
/// left under part names goes with the next restore, which completes.
#[test]
fn a_killed_restore_never_leaves_a_wrong_file_under_its_real_name() {
    let t = tempfile::tempdir().unwrap();
    let (src, repo) = (t.path().join("src"), t.path().join("repo"));
    std::fs::create_dir_all(&src).unwrap();
    // Files of several chunks each, so a file is written in several steps.
    for i in 0..12 {
        std::fs::write(src.join(format!("big{i:02}")), noise(6 << 20, i + 7)).unwrap();
    }
    init(&repo);
    ok(&repo, &["backup", src.to_str().unwrap()]);
    let mut wrong_before_fix = 0;
    for (round, delay_ms) in [0u64, 5, 20, 60, 150, 400].into_iter().enumerate() {
        let target = t.path().join(format!("target{round}"));
        let mut child = capsule_cmd(&TestEnv::beside(&repo).password(PASSWORD))
            .args([
                "--repo",
                repo.to_str().unwrap(),
                "--no-cache",
                "--connections",
                "2",
            ])
            .args(["restore", "latest", "--target", target.to_str().unwrap()])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        // Bounded wait for the first file (real or part) to appear, then
        // the seeded delay, then SIGKILL.
        let dir = restored(&target, &src);
        let deadline = Instant::now() + Duration::from_secs(60);
        while Instant::now() < deadline && child.try_wait().unwrap().is_none() {
            if std::fs::read_dir(&dir).is_ok_and(|mut d| d.next().is_some()) {
                break;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        std::thread::sleep(Duration::from_millis(delay_ms));
        let _ = child.kill();
        child.wait().unwrap();
        let mut parts = 0;
        if let Ok(rd) = std::fs::read_dir(&dir) {
            for e in rd {
                let e = e.unwrap();
                let name = e.file_name().to_string_lossy().into_owned();
                if name.starts_with(".capsule-part-") {
                    parts += 1;
                    continue;
                }
                let got = std::fs::read(e.path()).unwrap();
                let want = std::fs::read(src.join(&name)).unwrap();
                if got != want {
                    wrong_before_fix += 1;
                    eprintln!("round {round}: {name} is under its real name but differs");
                }
            }
        }
        eprintln!("round {round} (+{delay_ms} ms): {parts} part files left");
        let again = restore_json(&repo, &target, &[]);
        assert_same_tree(&src, &dir, false);
        assert_eq!(n(&again, "leftovers_removed"), parts, "{again}");
        let left = std::fs::read_dir(&dir)
            .unwrap()
            .filter(|e| {
                e.as_ref()
                    .unwrap()
                    .file_name()
                    .to_string_lossy()
                    .starts_with(".capsule-part-")
            })
            .count();
        assert_eq!(left, 0);
    }
    assert_eq!(wrong_before_fix, 0, "wrong files under real names");
}

/// `versions` of a file added, changed, removed and restored again; the
/// versions restored by number; snapshots named by time and by `latest~N`.
#[test]
fn versions_of_a_file_and_snapshots_named_by_time() {
    let t = tempfile::tempdir().unwrap();
    let (src, repo) = (t.path().join("src"), t.path().join("repo"));
    std::fs::create_dir_all(&src).unwrap();
    init(&repo);
    let file = src.join("notes.txt");
    let at = |hour: u32, args: &[&str]| {
        let now = format!("2026-11-20T{hour:02}:00:00Z");
        let o = capsule_env(
            &repo,
            args,
            &[
                ("CAPSULE_PASSWORD", PASSWORD),
                ("CAPSULE_TEST_NOW", &now),
                ("TZ", "UTC"),
            ],
        );
        assert!(o.status.success(), "{args:?}: {o:?}");
        String::from_utf8_lossy(&o.stdout).into_owned()
    };
    let s = src.to_str().unwrap();
    std::fs::write(src.join("other"), "x").unwrap();
    at(9, &["backup", s]); // 09:00: no notes.txt yet
    std::fs::write(&file, "first").unwrap();
    at(10, &["backup", s]); // 10:00: version 1
    at(11, &["backup", s]); // 11:00: the same
    std::fs::write(&file, "second, longer").unwrap();
    at(12, &["backup", s]); // 12:00: version 2
    std::fs::remove_file(&file).unwrap();
    at(13, &["backup", s]); // 13:00: gone
    std::fs::write(&file, "first").unwrap();
    at(14, &["backup", s]); // 14:00: version 1 again

    let v = json(&repo, &["versions", file.to_str().unwrap()]);
    let vs = v["versions"].as_array().unwrap();
    assert_eq!(vs.len(), 2, "{v}");
    assert_eq!(vs[0]["size"], 5);
    assert_eq!(vs[0]["snapshots"], 3);
    assert_eq!(vs[0]["first_time"], "2026-11-20T10:00:00Z");
    assert_eq!(vs[0]["last_time"], "2026-11-20T14:00:00Z");
    assert_eq!(vs[1]["size"], 14);
    assert_eq!(vs[1]["snapshots"], 1);
    let held: Vec<_> = v["timeline"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| h["version"].as_u64())
        .collect();
    assert_eq!(held, [None, Some(1), Some(1), Some(2), None, Some(1)]);
    // A relative path is taken from the current directory, as typed.
    let o = capsule_cmd(&TestEnv::beside(&repo).password(PASSWORD))
        .current_dir(&src)
        .args([
            "--repo",
            repo.to_str().unwrap(),
            "versions",
            "./sub/../notes.txt",
        ])
        .output()
        .unwrap();
    assert!(o.status.success(), "{o:?}");
    assert!(String::from_utf8_lossy(&o.stdout).contains("2 versions in 4 of 6 snapshots"));
    // A path in no snapshot: not found (13), named.
    let o = capsule(&repo, &["versions", src.join("nope").to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(13), "{o:?}");
    assert!(String::from_utf8_lossy(&o.stderr).contains("nope"));

    // Version 2 restored by number, and only that path.
    let target = t.path().join("v2");
    ok(
        &repo,
        &[
            "restore",
            "--version",
            "2",
            file.to_str().unwrap(),
            "--target",
            target.to_str().unwrap(),
        ],
    );
    let back = restored(&target, &src);
    assert_eq!(
        std::fs::read_to_string(back.join("notes.txt")).unwrap(),
        "second, longer"
    );
    assert!(!back.join("other").exists(), "only the path asked for");
    let o = capsule(
        &repo,
        &[
            "restore",
            "--version",
            "3",
            file.to_str().unwrap(),
            "--target",
            target.to_str().unwrap(),
        ],
    );
    assert_eq!(o.status.code(), Some(2), "no version 3: {o:?}");

    // By time: 12:30 is the 12:00 snapshot; a date alone is its last.
    let when = |spec: &[&str]| -> String {
        let dir = t
            .path()
            .join(format!("at{}", spec.join("_").replace([' ', ':'], "-")));
        let mut a = vec!["restore"];
        a.extend_from_slice(spec);
        a.extend(["--target", dir.to_str().unwrap()]);
        at(15, &a);
        std::fs::read_to_string(restored(&dir, &src).join("notes.txt")).unwrap_or_default()
    };
    assert_eq!(when(&["--at", "2026-11-20 12:30"]), "second, longer");
    assert_eq!(when(&["2026-11-20 11:59"]), "first");
    // 13:01, not 13:00: the test clock goes on while a run starts, so on
    // a busy machine the 13:00 snapshot can be dated a second or more after.
    assert_eq!(when(&["2026-11-20 13:01"]), "", "gone at 13:00");
    assert_eq!(when(&["2026-11-20"]), "first", "the day's last");
    assert_eq!(when(&["latest~2"]), "second, longer");
    // Before the first snapshot: not found, and says which is the oldest.
    let o = capsule_env(
        &repo,
        &[
            "restore",
            "--at",
            "2026-11-19 23:00",
            "--target",
            t.path().join("x").to_str().unwrap(),
        ],
        &[("CAPSULE_PASSWORD", PASSWORD), ("TZ", "UTC")],
    );
    assert_eq!(o.status.code(), Some(13), "{o:?}");
    assert!(String::from_utf8_lossy(&o.stderr).contains("the oldest is of 2026-11-20T09:00:00Z"));
    let o = capsule(&repo, &["ls", "latest~6"]);
    assert_eq!(o.status.code(), Some(13), "only six snapshots: {o:?}");
}
