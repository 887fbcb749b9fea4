//! Tests that need real mounts (tmpfs), so they run as root: file-system
//! boundaries and a repository disk that fills up.
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
