//! Tests that need real mounts (tmpfs), so they run as root: file-system
//! boundaries and a repository disk that fills up.

// The command-line suite runs on Linux, against real servers, btrfs,
// fanotify and network namespaces; the macOS build checks the libraries.
#![cfg(target_os = "linux")]
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod common;

use std::path::Path;
use std::process::Command;

use common::*;

/// A tmpfs mounted at `at`, unmounted on drop.
struct Tmpfs(std::path::PathBuf);

impl Tmpfs {
    fn mount(at: &Path, size: &str) -> Option<Self> {
        if !is_root() {
            eprintln!("skipped: mounting needs root");
            return None;
        }
        std::fs::create_dir_all(at).unwrap();
        let st = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(at)
            .status()
            .unwrap();
        assert!(st.success(), "mount tmpfs failed");
        Some(Tmpfs(at.to_path_buf()))
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

#[test]
fn one_file_system_stops_at_mount_points() {
    let t = tempfile::tempdir().unwrap();
    let (src, repo) = (t.path().join("src"), t.path().join("repo"));
    std::fs::create_dir_all(&src).unwrap();
    std::fs::write(src.join("here"), b"same fs").unwrap();
    let Some(_m) = Tmpfs::mount(&src.join("mnt"), "8m") else {
        return;
    };
    std::fs::write(src.join("mnt/there"), b"other fs").unwrap();
    init(&repo);
    ok(
        &repo,
        &["backup", "--one-file-system", src.to_str().unwrap()],
    );
    let l = ok(&repo, &["ls", "latest"]);
    assert!(l.contains("/src/here") && l.contains("/src/mnt\n"), "{l}");
    assert!(!l.contains("there"), "crossed into the mount:\n{l}");
    ok(&repo, &["backup", src.to_str().unwrap()]);
    assert!(ok(&repo, &["ls", "latest"]).contains("/src/mnt/there"));
}

/// The repository's disk fills up: a clear error, no snapshot, a repository
/// that still checks clean, and a backup that succeeds once there is room.
#[test]
fn full_repository_disk_fails_cleanly_and_recovers() {
    let t = tempfile::tempdir().unwrap();
    let (src, repo_mnt) = (t.path().join("src"), t.path().join("repodisk"));
    std::fs::create_dir_all(&src).unwrap();
    std::fs::write(src.join("small"), b"fits").unwrap();
    let Some(_m) = Tmpfs::mount(&repo_mnt, "64m") else {
        return;
    };
    let repo = repo_mnt.join("repo");
    init(&repo);
    ok(&repo, &["backup", src.to_str().unwrap()]);
    // Other data on the same disk, which the user deletes later.
    let ballast = repo_mnt.join("ballast");
    std::fs::write(&ballast, noise(24 << 20, 4)).unwrap();
    std::fs::write(src.join("big"), noise(48 << 20, 5)).unwrap();
    let o = capsule(&repo, &["backup", src.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&o.stderr);
    // 16: the destination is full (its own exit code since network backends).
    assert_eq!(o.status.code(), Some(16), "{err}");
    assert!(err.contains("No space left"), "{err}");
    assert!(err.contains("hint: the repository's disk is full"), "{err}");
    assert_eq!(
        json(&repo, &["snapshots"]).as_array().unwrap().len(),
        1,
        "no snapshot may be committed"
    );
    ok(&repo, &["check"]);
    // Free space; the next run reuses the packs that landed and fits.
    std::fs::remove_file(&ballast).unwrap();
    let r = json(&repo, &["backup", src.to_str().unwrap()]);
    assert!(
        r["storage"]["stored_bytes_added"].as_u64().unwrap() < 40 << 20,
        "{r}"
    );
    ok(&repo, &["check", "--read-data"]);
}

/// Issue 59, 5: `copy` into a repository whose disk fills up says so as
/// `backup` does (exit 16, "the repository's disk is full"), not
/// "interrupted" (130), with and without --json.
#[test]
fn copy_to_a_full_disk_reports_the_full_disk() {
    let t = tempfile::tempdir().unwrap();
    let (src, a, disk) = (
        t.path().join("src"),
        t.path().join("a"),
        t.path().join("bdisk"),
    );
    std::fs::create_dir_all(&src).unwrap();
    std::fs::write(src.join("big"), noise(40 << 20, 7)).unwrap();
    let Some(_m) = Tmpfs::mount(&disk, "16m") else {
        return;
    };
    init(&a);
    ok(&a, &["backup", src.to_str().unwrap()]);
    let b = disk.join("b");
    init(&b);
    for json in [false, true] {
        let mut args = vec!["copy", "--to", b.to_str().unwrap()];
        if json {
            args.insert(0, "--json");
        }
        let o = capsule(&a, &args);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(16), "--json {json}: {err}");
        assert!(err.contains("the repository's disk is full"), "{err}");
    }
}

/// Issue 59, 5: the repository was the root of a disk now unplugged: its
/// mount point is an empty directory. That is a destination away (exit
/// 14, which the daemon waits out), told apart from an empty directory
/// that never held one (exit 11) by the file system the repository was on
/// when it last opened. The hint names the profiles of the configuration
/// file `--config` named.
#[test]
fn an_empty_mount_point_where_the_repository_was_is_away_not_missing() {
    let t = tempfile::tempdir().unwrap();
    let (src, disk) = (t.path().join("src"), t.path().join("disk"));
    std::fs::create_dir_all(&src).unwrap();
    std::fs::write(src.join("f"), b"x").unwrap();
    let Some(m) = Tmpfs::mount(&disk, "32m") else {
        return;
    };
    init(&disk);
    ok(&disk, &["backup", src.to_str().unwrap()]);
    drop(m);
    assert_eq!(std::fs::read_dir(&disk).unwrap().count(), 0, "unplugged");
    let o = capsule(&disk, &["backup", src.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(14), "{}", said(&o));
    assert!(said(&o).contains("a disk not plugged in"), "{}", said(&o));

    let fresh = t.path().join("fresh");
    std::fs::create_dir(&fresh).unwrap();
    let o = capsule(&fresh, &["snapshots"]);
    assert_eq!(o.status.code(), Some(11), "{}", said(&o));
    let other = t.path().join("other.toml");
    std::fs::write(&other, "[profiles.alpha]\n[profiles.beta]\n").unwrap();
    let o = capsule(&fresh, &["--config", other.to_str().unwrap(), "snapshots"]);
    assert_eq!(o.status.code(), Some(11), "{}", said(&o));
    assert!(said(&o).contains("alpha, beta"), "{}", said(&o));
}
