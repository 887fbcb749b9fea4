//! Regression tests for the silent losses, lock-outs and misdiagnoses a
//! hostile test found (issue "Trust first"). Each test fails on the code
//! before its fix: it names the defect it holds down.

// The command-line suite runs on Linux, against real servers, btrfs,
// fanotify and network namespaces; the macOS build checks the libraries.
#![cfg(target_os = "linux")]
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use common::*;

fn code(o: &std::process::Output) -> Option<i32> {
    o.status.code()
}

fn stderr(o: &std::process::Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn small_repo() -> (tempfile::TempDir, PathBuf, PathBuf) {
    let t = tempfile::tempdir().unwrap();
    let (src, repo) = (t.path().join("src"), t.path().join("repo"));
    std::fs::create_dir_all(src.join("sub")).unwrap();
    std::fs::write(src.join("a"), noise(300_000, 1)).unwrap();
    std::fs::write(src.join("sub/b"), noise(200_000, 2)).unwrap();
    init(&repo);
    ok(&repo, &["backup", src.to_str().unwrap()]);
    (t, src, repo)
}

/// Restores `latest` into `target` without the cache (which may hold intact
/// copies of what a test damaged on the destination).
fn restore_uncached(repo: &Path, target: &Path) -> std::process::Output {
    capsule(
        repo,
        &[
            "--no-cache",
            "restore",
            "latest",
            "--target",
            target.to_str().unwrap(),
        ],
    )
}

/// Restores `latest` into `target` and compares it with `src`.
fn latest_restores_intact(repo: &Path, src: &Path, target: &Path) {
    ok(
        repo,
        &["restore", "latest", "--target", target.to_str().unwrap()],
    );
    assert_same_tree(src, &restored(target, src), false);
}

fn objects(repo: &Path, prefix: &str) -> Vec<PathBuf> {
    files_under(&repo.join(prefix))
}

// ----- silent data loss -----

#[test]
fn source_below_a_symlinked_directory_is_backed_up() {
    let t = tempfile::tempdir().unwrap();
    let repo = t.path().join("repo");
    let real = t.path().join("real");
    std::fs::create_dir_all(real.join("sub")).unwrap();
    std::fs::write(real.join("sub/f"), b"under a symlinked parent").unwrap();
    std::os::unix::fs::symlink(&real, t.path().join("linkdir")).unwrap();
    init(&repo);
    let given = t.path().join("linkdir/sub");
    ok(&repo, &["backup", given.to_str().unwrap()]);
    let target = t.path().join("target");
    ok(
        &repo,
        &["restore", "latest", "--target", target.to_str().unwrap()],
    );
    let back = restored(&target, &given).join("f");
    assert_eq!(std::fs::read(&back).unwrap(), b"under a symlinked parent");
    // A source that is itself a symlink stands for what it points to.
    ok(
        &repo,
        &["backup", t.path().join("linkdir").to_str().unwrap()],
    );
    let listing = ok(&repo, &["ls", "latest"]);
    assert!(listing.contains("linkdir/sub/f"), "{listing}");
}

/// A tree deeper than `PATH_MAX` (4,096 bytes) backs up whole, with its
/// extended attributes and symlinks, and restores: the walk reaches every
/// entry through its parent directory's descriptor. Before, every entry
/// past the limit was a warning and missing from the snapshot.
#[test]
fn paths_longer_than_path_max_back_up_and_restore() {
    use rustix::fs::{mkdirat, openat, readlinkat, symlinkat, Mode, OFlags};
    let t = tempfile::tempdir().unwrap();
    let (src, repo) = (t.path().join("src"), t.path().join("repo"));
    std::fs::create_dir(&src).unwrap();
    let name = [b'd'; 200];
    let down = |root: &Path, levels: usize| {
        let mut fd = rustix::fs::open(root, OFlags::DIRECTORY, Mode::empty()).unwrap();
        for _ in 0..levels {
            fd = openat(
                &fd,
                &name[..],
                OFlags::DIRECTORY | OFlags::NOFOLLOW,
                Mode::empty(),
            )
            .unwrap();
        }
        fd
    };
    let mut fd = rustix::fs::open(&src, OFlags::DIRECTORY, Mode::empty()).unwrap();
    for _ in 0..25 {
        mkdirat(&fd, &name[..], Mode::from_raw_mode(0o755)).unwrap();
        fd = openat(&fd, &name[..], OFlags::DIRECTORY, Mode::empty()).unwrap();
    }
    let leaf = openat(
        &fd,
        "leaf",
        OFlags::WRONLY | OFlags::CREATE,
        Mode::from_raw_mode(0o640),
    )
    .unwrap();
    let mut leaf = std::fs::File::from(leaf);
    std::io::Write::write_all(&mut leaf, b"deep data").unwrap();
    let xattr = rustix::fs::fsetxattr(
        &leaf,
        "user.capsule",
        b"deep",
        rustix::fs::XattrFlags::empty(),
    );
    symlinkat("leaf", &fd, "link").unwrap();
    drop((leaf, fd));

    init(&repo);
    let o = capsule(&repo, &["--json", "backup", src.to_str().unwrap()]);
    assert_eq!(code(&o), Some(0), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["warnings"].as_array().map(Vec::len), Some(0), "{v}");
    assert_eq!(v["files_new"], 1, "{v}");

    let target = t.path().join("target");
    ok(
        &repo,
        &["restore", "latest", "--target", target.to_str().unwrap()],
    );
    let fd = down(&restored(&target, &src), 25);
    let f = openat(&fd, "leaf", OFlags::RDONLY, Mode::empty()).unwrap();
    let mut back = std::fs::File::from(f);
    let mut s = String::new();
    std::io::Read::read_to_string(&mut back, &mut s).unwrap();
    assert_eq!(s, "deep data");
    let link = readlinkat(&fd, "link", Vec::new()).unwrap();
    assert_eq!(link.as_bytes(), b"leaf");
    if xattr.is_ok() {
        let mut buf = [0u8; 16];
        let n = rustix::fs::fgetxattr(&back, "user.capsule", &mut buf).unwrap();
        assert_eq!(&buf[..n], b"deep");
    }
}

#[test]
fn proc_files_are_read_not_stored_empty() {
    let t = tempfile::tempdir().unwrap();
    let repo = t.path().join("repo");
    init(&repo);
    let o = capsule(&repo, &["backup", "/proc/self/status"]);
    assert_eq!(code(&o), Some(0), "{}", stderr(&o));
    let v = json(&repo, &["ls", "latest", "-l"]);
    let status = v
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["path"].as_str().unwrap().ends_with("/status"))
        .unwrap_or_else(|| panic!("no /proc/<pid>/status in {v:#}"));
    assert!(status["size"].as_u64().unwrap() > 0, "{status}");
}

/// The pack holding `sub/b` (the only data pack of a one-backup repo).
fn the_data_pack(repo: &Path) -> PathBuf {
    let packs = objects(repo, "data");
    assert_eq!(packs.len(), 1, "{packs:?}");
    packs[0].clone()
}

#[test]
fn backup_after_check_found_a_pack_missing_uploads_the_data_again() {
    let (t, src, repo) = small_repo();
    std::fs::remove_file(the_data_pack(&repo)).unwrap();
    let o = capsule(&repo, &["check"]);
    assert_eq!(code(&o), Some(12), "{}", stderr(&o));
    let v = json(&repo, &["backup", src.to_str().unwrap()]);
    assert!(
        v["summary"]["bytes_added"].as_u64().unwrap() > 400_000,
        "{v:#}"
    );
    assert_eq!(v["packs_distrusted"].as_array().unwrap().len(), 1, "{v:#}");
    // The new snapshot restores in full, without the lost pack.
    latest_restores_intact(&repo, &src, &t.path().join("target"));
}

#[test]
fn backup_force_finds_a_missing_pack_without_check() {
    let (t, src, repo) = small_repo();
    std::fs::remove_file(the_data_pack(&repo)).unwrap();
    let v = json(&repo, &["backup", "--force", src.to_str().unwrap()]);
    assert!(
        v["summary"]["bytes_added"].as_u64().unwrap() > 400_000,
        "{v:#}"
    );
    latest_restores_intact(&repo, &src, &t.path().join("target"));
}

#[test]
fn latest_says_which_snapshot_it_means_when_a_snapshot_is_damaged() {
    let (t, src, repo) = small_repo();
    let first: Vec<PathBuf> = objects(&repo, "snapshots");
    std::fs::write(src.join("c"), b"new").unwrap();
    ok(&repo, &["backup", src.to_str().unwrap()]);
    let newest = objects(&repo, "snapshots")
        .into_iter()
        .find(|p| !first.contains(p))
        .unwrap();
    std::fs::write(&newest, b"garbage").unwrap();
    let target = t.path().join("target");
    // Without the cache, which still holds an intact copy of the snapshot.
    let o = restore_uncached(&repo, &target);
    let err = stderr(&o);
    let older = first[0].file_name().unwrap().to_str().unwrap();
    assert!(
        err.contains("\"latest\" is") && err.contains(&older[..8]),
        "{err}"
    );
    // Asking for the damaged one by ID says it is damaged, not missing.
    let id = newest.file_name().unwrap().to_str().unwrap();
    let o = capsule(&repo, &["--no-cache", "ls", &id[..10]]);
    assert!(stderr(&o).contains("damaged"), "{}", stderr(&o));
}

#[test]
fn restore_include_that_matches_nothing_is_an_error() {
    let (t, _, repo) = small_repo();
    let target = t.path().join("target");
    let o = capsule(
        &repo,
        &[
            "restore",
            "latest",
            "--target",
            target.to_str().unwrap(),
            "--include",
            "/no/such/path",
        ],
    );
    assert_eq!(code(&o), Some(13), "{}", stderr(&o));
    assert!(stderr(&o).contains("/no/such/path"), "{}", stderr(&o));
}

// ----- lock-outs and misdiagnoses -----

fn key_files(repo: &Path) -> Vec<PathBuf> {
    objects(repo, "keys")
}

#[test]
fn a_stray_or_damaged_key_file_does_not_lock_anyone_out() {
    let (t, _, repo) = small_repo();
    std::fs::write(repo.join("keys/b"), b"{").unwrap();
    let o = capsule(&repo, &["snapshots"]);
    assert_eq!(code(&o), Some(0), "{}", stderr(&o));
    assert!(stderr(&o).contains("keys/b"), "{}", stderr(&o));
    // A second password, then the first key damaged: the second still opens.
    let pw2 = t.path().join("pw2");
    std::fs::write(&pw2, "second password").unwrap();
    let first = key_files(&repo)
        .into_iter()
        .find(|p| !p.ends_with("b"))
        .unwrap();
    ok(
        &repo,
        &["key", "add", "--new-password-file", pw2.to_str().unwrap()],
    );
    let mut bytes = std::fs::read(&first).unwrap();
    let n = bytes.len();
    bytes[n / 2] ^= 0x20;
    std::fs::write(&first, &bytes).unwrap();
    let o = capsule_env(
        &repo,
        &["snapshots"],
        &[("CAPSULE_PASSWORD", "second password")],
    );
    assert_eq!(code(&o), Some(0), "{}", stderr(&o));
    // The first password's only key is damaged: say so, not "wrong password".
    let o = capsule(&repo, &["snapshots"]);
    assert_eq!(code(&o), Some(10), "{}", stderr(&o));
    assert!(stderr(&o).contains("could not be tried"), "{}", stderr(&o));
}

#[test]
fn the_only_key_damaged_is_reported_as_damage() {
    let (_t, _, repo) = small_repo();
    let k = &key_files(&repo)[0];
    let mut bytes = std::fs::read(k).unwrap();
    let n = bytes.len();
    bytes[n - 40] ^= 0x01;
    std::fs::write(k, &bytes).unwrap();
    let o = capsule(&repo, &["snapshots"]);
    assert_eq!(code(&o), Some(12), "{}", stderr(&o));
    let err = stderr(&o);
    assert!(
        err.contains("damaged") || err.contains("does not match"),
        "{err}"
    );
    assert!(!err.contains("wrong password"), "{err}");
}

#[test]
fn a_key_file_demanding_absurd_argon2_costs_is_refused_quickly() {
    let (_t, _, repo) = small_repo();
    let k = &key_files(&repo)[0];
    let mut v: serde_json::Value = serde_json::from_slice(&std::fs::read(k).unwrap()).unwrap();
    v["m_cost"] = serde_json::json!(4u64 * 1024 * 1024);
    v["t_cost"] = serde_json::json!(100);
    let bytes = serde_json::to_vec(&v).unwrap();
    let name = blake3::hash(&bytes).to_hex().to_string();
    std::fs::write(repo.join("keys").join(&name), &bytes).unwrap();
    // Listing order must not matter: the good key opens, the hostile one is
    // reported, and its cost is never paid (no timing assertion: the test
    // would take minutes if it were).
    let o = capsule(&repo, &["snapshots"]);
    assert_eq!(code(&o), Some(0), "{}", stderr(&o));
    assert!(stderr(&o).contains("out of range"), "{}", stderr(&o));
}

#[test]
fn damaged_or_missing_config_is_exit_12_and_never_suggests_init() {
    let (_t, _, repo) = small_repo();
    let cfg = repo.join("config");
    let good = std::fs::read(&cfg).unwrap();
    let mut bad = good.clone();
    bad[30] ^= 1;
    std::fs::write(&cfg, &bad).unwrap();
    let o = capsule(&repo, &["check"]);
    assert_eq!(code(&o), Some(12), "{}", stderr(&o));
    assert!(stderr(&o).contains("config"), "{}", stderr(&o));
    std::fs::remove_file(&cfg).unwrap();
    let o = capsule(&repo, &["snapshots"]);
    assert_eq!(code(&o), Some(12), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("do not run `capsule init`"),
        "{}",
        stderr(&o)
    );
    // And init refuses to put a new config beside the old data.
    let o = capsule(&repo, &["init"]);
    assert_ne!(code(&o), Some(0), "{}", stderr(&o));
    assert!(!repo.join("config").exists());
    std::fs::write(&cfg, &good).unwrap();
    ok(&repo, &["check"]);
}

#[test]
fn check_names_every_snapshot_a_shared_damaged_pack_affects() {
    let (_t, src, repo) = small_repo();
    std::fs::write(src.join("c"), b"another file").unwrap();
    ok(&repo, &["backup", src.to_str().unwrap()]);
    std::fs::write(src.join("d"), b"and another").unwrap();
    ok(&repo, &["backup", src.to_str().unwrap()]);
    // The first data pack holds `a` and `sub/b`, shared by all three.
    let mut packs = objects(&repo, "data");
    packs.sort_by_key(|p| std::fs::metadata(p).unwrap().modified().unwrap());
    std::fs::remove_file(&packs[0]).unwrap();
    let o = capsule(&repo, &["--json", "check"]);
    assert_eq!(code(&o), Some(12));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let affected: Vec<String> = v["report"]["problems"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|p| p["affected"].as_array().unwrap().clone())
        .map(|a| a.as_str().unwrap().to_string())
        .collect();
    let snaps = json(&repo, &["snapshots"]);
    for s in snaps.as_array().unwrap() {
        let short = &s["id"].as_str().unwrap()[..8];
        for f in ["/src/a", "/src/sub/b"] {
            assert!(
                affected
                    .iter()
                    .any(|a| a.starts_with(short) && a.ends_with(f)),
                "{short}:{f} not named: {affected:?}"
            );
        }
    }
}

#[test]
fn truncated_tree_pack_loses_only_its_directories() {
    let (t, _, repo) = small_repo();
    let tree = &objects(&repo, "tree")[0];
    let len = std::fs::metadata(tree).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(tree)
        .unwrap()
        .set_len(len / 2)
        .unwrap();
    let target = t.path().join("target");
    let o = restore_uncached(&repo, &target);
    assert_eq!(code(&o), Some(3), "{}", stderr(&o));
}

#[test]
fn repair_index_rebuilds_a_lost_or_damaged_index_from_pack_headers() {
    let (t, src, repo) = small_repo();
    let idx = objects(&repo, "index");
    for f in &idx {
        let mut b = std::fs::read(f).unwrap();
        let n = b.len();
        b.truncate(n / 2);
        std::fs::write(f, b).unwrap();
    }
    let o = capsule(&repo, &["--no-cache", "check"]);
    assert_eq!(code(&o), Some(12));
    assert!(
        stderr(&o).contains("capsule repair index"),
        "{}",
        stderr(&o)
    );
    let v = json(&repo, &["repair", "index"]);
    assert_eq!(v["reindexed"], v["unindexed"], "{v:#}");
    assert!(v["reindexed"].as_u64().unwrap() >= 2, "{v:#}");
    ok(&repo, &["--no-cache", "check", "--read-data"]);
    let target = t.path().join("target");
    let o = restore_uncached(&repo, &target);
    assert_eq!(code(&o), Some(0), "{}", stderr(&o));
    assert_same_tree(&src, &restored(&target, &src), false);
}

#[test]
fn password_file_wins_over_the_environment_and_its_errors_are_password_errors() {
    let (t, _, repo) = small_repo();
    let pw = t.path().join("pw");
    std::fs::write(&pw, PASSWORD).unwrap();
    let o = capsule_env(
        &repo,
        &["--password-file", pw.to_str().unwrap(), "snapshots"],
        &[("CAPSULE_PASSWORD", "not the password")],
    );
    assert_eq!(code(&o), Some(0), "{}", stderr(&o));
    let o = capsule(&repo, &["--password-file", "/no/such/file", "snapshots"]);
    assert_eq!(code(&o), Some(10), "{}", stderr(&o));
    // A repository path that is a file is "no repository".
    let f = t.path().join("plain-file");
    std::fs::write(&f, b"x").unwrap();
    let o = capsule(&f, &["snapshots"]);
    assert_eq!(code(&o), Some(11), "{}", stderr(&o));
}

#[test]
fn a_password_in_a_url_is_never_printed() {
    let t = tempfile::tempdir().unwrap();
    let o = capsule_env(
        Path::new("smb://me:hunter2@127.0.0.1/share"),
        &["--json", "snapshots"],
        &[("CAPSULE_CACHE_DIR", t.path().to_str().unwrap())],
    );
    assert_eq!(code(&o), Some(2));
    let all = format!("{}{}", stderr(&o), String::from_utf8_lossy(&o.stdout));
    assert!(!all.contains("hunter2"), "{all}");
}

// ----- local races and hygiene -----

#[test]
fn failed_files_are_not_left_behind_as_empty_files() {
    let (t, src, repo) = small_repo();
    let pack = the_data_pack(&repo);
    std::fs::remove_file(&pack).unwrap();
    let target = t.path().join("target");
    let o = capsule(
        &repo,
        &["restore", "latest", "--target", target.to_str().unwrap()],
    );
    assert_eq!(code(&o), Some(3), "{}", stderr(&o));
    let r = restored(&target, &src);
    assert!(!r.join("a").exists() && !r.join("sub/b").exists());
    assert!(stderr(&o).contains("/src/a"), "{}", stderr(&o));
}

#[test]
fn cache_and_run_records_are_private() {
    let (_t, _, repo) = small_repo();
    let cache = repo.with_extension("cache");
    let mut seen = 0;
    let mut stack = vec![cache.clone()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            let m = std::fs::symlink_metadata(&p).unwrap();
            let mode = m.permissions().mode() & 0o777;
            if m.is_dir() {
                assert_eq!(mode & 0o077, 0, "{} is {mode:o}", p.display());
                stack.push(p);
            } else {
                assert_eq!(mode & 0o077, 0, "{} is {mode:o}", p.display());
                seen += 1;
            }
        }
    }
    assert!(seen > 3, "expected cache files and a run record");
}

#[test]
fn ls_into_a_closed_pipe_exits_quietly() {
    let (_t, _, repo) = small_repo();
    let mut c = capsule_cmd(&TestEnv::beside(&repo).password(PASSWORD));
    c.arg("--repo")
        .arg(&repo)
        .args(["ls", "latest"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let mut child = c.spawn().unwrap();
    // Close the reading end before capsule writes a line.
    drop(child.stdout.take());
    let o = child.wait_with_output().unwrap();
    let err = stderr(&o);
    assert!(!err.contains("panicked"), "{err}");
    assert_eq!(code(&o), Some(0), "{err}");
}

#[test]
fn local_soak_eight_clients() {
    let t = tempfile::tempdir().unwrap();
    let repo = t.path().join("repo");
    soak(t.path(), &|args, extra| {
        let mut env: Vec<(&str, &str)> = vec![("CAPSULE_PASSWORD", PASSWORD)];
        env.extend(extra.iter().map(|(k, v)| (*k, v.as_str())));
        capsule_env(&repo, args, &env)
    });
}

/// Packs are built in temporary files; a temporary directory that cannot
/// hold them fails the backup with a message naming it and TMPDIR, and no
/// snapshot claims data that was never stored.
#[test]
fn a_temporary_directory_that_cannot_hold_packs_fails_the_backup_by_name() {
    let t = tempfile::tempdir().unwrap();
    let (src, repo) = (t.path().join("src"), t.path().join("repo"));
    std::fs::create_dir(&src).unwrap();
    std::fs::write(src.join("f"), noise(200_000, 5)).unwrap();
    init(&repo);
    let not_a_dir = t.path().join("plain-file");
    std::fs::write(&not_a_dir, b"x").unwrap();
    let o = capsule_env(
        &repo,
        &["backup", src.to_str().unwrap()],
        &[
            ("CAPSULE_PASSWORD", PASSWORD),
            ("TMPDIR", not_a_dir.to_str().unwrap()),
        ],
    );
    assert_eq!(code(&o), Some(1), "{}", stderr(&o));
    let err = stderr(&o);
    assert!(
        err.contains("temporary pack file") && err.contains("TMPDIR"),
        "{err}"
    );
    assert!(err.contains(not_a_dir.to_str().unwrap()), "{err}");
    let listed = json(&repo, &["snapshots"]);
    assert_eq!(listed.as_array().map(Vec::len), Some(0), "{listed}");
}
