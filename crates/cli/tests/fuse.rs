//! `capsule mount` against a real FUSE mount: the mounted snapshot equals
//! its source entry for entry (metadata and content), a directory of
//! 100,000 entries lists whole, `versions/` holds each distinct content of
//! a file, a damaged pack fails one file only, a backup or forget made
//! while mounted shows, and a file read after the kernel forgot others
//! reads its own bytes. Skipped, saying why, where there is no
//! `/dev/fuse`.

// The command-line suite runs on Linux, against real servers, btrfs,
// fanotify and network namespaces; the macOS build checks the libraries.
#![cfg(target_os = "linux")]
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod common;

use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::*;

/// A `capsule mount` running; stopped (SIGTERM) and unmounted on drop.
struct Mounted {
    child: Option<Child>,
    at: PathBuf,
}

impl Mounted {
    fn start(repo: &Path, at: &Path) -> Option<Self> {
        Self::start_with(repo, at, &[])
    }

    /// Started with more arguments of `mount`.
    fn start_with(repo: &Path, at: &Path, more: &[&str]) -> Option<Self> {
        if !Path::new("/dev/fuse").exists() {
            eprintln!("skipped: no /dev/fuse on this machine");
            return None;
        }
        std::fs::create_dir_all(at).unwrap();
        let child = capsule_cmd(&TestEnv::beside(repo).password(PASSWORD))
            .args([
                "--repo",
                repo.to_str().unwrap(),
                "mount",
                at.to_str().unwrap(),
            ])
            .args(more)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut m = Mounted {
            child: Some(child),
            at: at.to_path_buf(),
        };
        // Up when its snapshots directory shows: at most 60 s.
        let t = Instant::now();
        while !at.join("snapshots").exists() {
            if let Some(st) = m.child.as_mut().unwrap().try_wait().unwrap() {
                let o = m.child.take().unwrap().wait_with_output().unwrap();
                panic!(
                    "capsule mount exited with {st}: {}",
                    String::from_utf8_lossy(&o.stderr)
                );
            }
            assert!(
                t.elapsed() < Duration::from_secs(60),
                "mount not up in 60 s"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        Some(m)
    }

    /// Stops it as Ctrl-C or a service manager would; its output.
    fn stop(mut self) -> (Option<i32>, String, String) {
        let mut child = self.child.take().unwrap();
        rustix::process::kill_process(
            rustix::process::Pid::from_child(&child),
            rustix::process::Signal::TERM,
        )
        .unwrap();
        let t = Instant::now();
        while child.try_wait().unwrap().is_none() {
            assert!(
                t.elapsed() < Duration::from_secs(30),
                "mount did not stop in 30 s"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        let o = child.wait_with_output().unwrap();
        (
            o.status.code(),
            String::from_utf8_lossy(&o.stdout).into_owned(),
            String::from_utf8_lossy(&o.stderr).into_owned(),
        )
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        // Whatever happened, nothing stays mounted.
        let _ = Command::new("umount").arg("-l").arg(&self.at).output();
    }
}

fn is_mounted(at: &Path) -> bool {
    let abs = std::fs::canonicalize(at).unwrap_or_else(|_| at.to_path_buf());
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .any(|l| l.split(' ').nth(4) == Some(abs.to_str().unwrap()))
}

/// Metadata as a mount can show it: hard links are separate inodes there
/// (with the stored link count) and holes are not reported.
fn comparable(root: &Path) -> std::collections::BTreeMap<Vec<u8>, Meta> {
    let mut m = snapshot_meta(root, false);
    for v in m.values_mut() {
        v.link_group = None;
        v.sparse = false;
    }
    m
}

#[test]
fn a_mounted_snapshot_equals_its_source_and_a_damaged_pack_fails_one_file() {
    let t = tempfile::tempdir().unwrap();
    let (src, repo) = (t.path().join("src"), t.path().join("repo"));
    torture_tree(&src, 100_000);
    std::fs::write(src.join("notes.txt"), "first").unwrap();
    init(&repo);
    let s = src.to_str().unwrap();
    ok(&repo, &["backup", s]);
    std::fs::write(src.join("notes.txt"), "second, longer").unwrap();
    ok(&repo, &["backup", s]);
    // The last backup adds one file whose data lands in a pack of its own.
    let packs = |repo: &Path| files_under(&repo.join("data"));
    let before = packs(&repo);
    std::fs::write(src.join("damaged.bin"), noise(1 << 20, 7)).unwrap();
    ok(&repo, &["backup", s]);
    let new: Vec<PathBuf> = packs(&repo)
        .into_iter()
        .filter(|p| !before.contains(p))
        .collect();
    assert_eq!(new.len(), 1, "{new:?}");
    // Damaged before the mount reads anything (it would keep what it read).
    let pack = &new[0];
    let mut bytes = std::fs::read(pack).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0x40;
    std::fs::write(pack, &bytes).unwrap();

    let at = t.path().join("mnt");
    let Some(m) = Mounted::start(&repo, &at) else {
        return;
    };
    let snaps: Vec<_> = std::fs::read_dir(at.join("snapshots"))
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(snaps.len(), 3, "{snaps:?}");
    let latest = at.join("latest").join(src.strip_prefix("/").unwrap());

    // Entry for entry, metadata and content, as backed up (the damaged
    // file's content aside).
    let (a, b) = (comparable(&src), comparable(&latest));
    assert_eq!(
        a.keys().collect::<Vec<_>>(),
        b.keys().collect::<Vec<_>>(),
        "entry sets differ"
    );
    for (k, x) in &a {
        assert_eq!(x, &b[k], "metadata of {}", String::from_utf8_lossy(k));
        if x.kind == "file" && k.as_slice() != b"damaged.bin" {
            let p = |r: &Path| r.join(std::ffi::OsStr::from_bytes(k));
            assert!(
                std::fs::read(p(&src)).unwrap() == std::fs::read(p(&latest)).unwrap(),
                "content of {}",
                String::from_utf8_lossy(k)
            );
        }
    }
    // Hard-link counts as stored.
    let nlink = |p: &Path| std::os::unix::fs::MetadataExt::nlink(&std::fs::metadata(p).unwrap());
    assert_eq!(nlink(&latest.join("links/a")), 3);
    assert_eq!(nlink(&latest.join("links/sub/c")), 3);
    // `diff -r`, as a user would check it (it calls any two FIFOs or
    // devices different, so those were compared above only).
    let d = Command::new("diff")
        .args([
            "-r",
            "--no-dereference",
            "-x",
            "fifo",
            "-x",
            "chardev",
            "-x",
            "damaged.bin",
        ])
        .arg(&src)
        .arg(&latest)
        .output()
        .unwrap();
    assert!(
        d.status.success(),
        "diff -r: {}",
        String::from_utf8_lossy(&d.stdout)
    );

    // The directory of 100,000 entries, listed whole.
    let big = std::fs::read_dir(latest.join("many")).unwrap().count();
    assert_eq!(big, 100_000);

    // Every version of notes.txt, under versions/.
    let vdir = at
        .join("versions")
        .join(src.strip_prefix("/").unwrap())
        .join("notes.txt");
    let mut contents: Vec<String> = std::fs::read_dir(&vdir)
        .unwrap()
        .map(|e| std::fs::read_to_string(e.unwrap().path()).unwrap())
        .collect();
    contents.sort();
    assert_eq!(contents, ["first", "second, longer"]);
    // Snapshots by host, too. Their entries hold the directory open: the
    // mount is busy when it is stopped below.
    let held_open: Vec<_> = std::fs::read_dir(at.join("hosts")).unwrap().collect();
    assert_eq!(held_open.len(), 1);

    // The damaged pack: that file fails with EIO, the rest reads.
    match std::fs::read(latest.join("damaged.bin")) {
        Ok(b) => panic!("read {} bytes of a damaged file", b.len()),
        Err(e) => assert_eq!(e.raw_os_error(), Some(libc::EIO), "{e}"),
    }
    assert_eq!(
        std::fs::read(latest.join("small.txt")).unwrap(),
        b"hello capsule\n"
    );
    assert!(std::fs::read(latest.join("data/random.bin")).is_ok());

    let (code, out, err) = m.stop();
    assert_eq!(code, Some(0), "{out}\n{err}");
    assert!(err.contains("damaged.bin"), "the log names the file: {err}");
    assert!(out.contains("unmounted") && out.contains("in use"), "{out}");
    drop(held_open);
    assert!(!is_mounted(&at), "still mounted after SIGTERM");

    // A missing or occupied mount point: one clear line, exit 2.
    let o = capsule(&repo, &["mount", t.path().join("nope").to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2));
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("no such directory"), "{err}");
}

/// The kernel keeps the listings the mount gave it: a backup and a forget
/// made while mounted must still show in `snapshots/`, `hosts/`, `latest`
/// and `versions/`, in listings read before them. And a prune meanwhile
/// must not delete what the mount may still read.
#[test]
fn a_backup_and_a_forget_while_mounted_show() {
    let t = tempfile::tempdir().unwrap();
    let (src, repo) = (t.path().join("src"), t.path().join("repo"));
    std::fs::create_dir_all(&src).unwrap();
    std::fs::write(src.join("notes.txt"), "first").unwrap();
    init(&repo);
    let s = src.to_str().unwrap();
    ok(&repo, &["backup", s]);
    let at = t.path().join("mnt");
    let Some(m) = Mounted::start_with(&repo, &at, &["--refresh", "1"]) else {
        return;
    };
    let names = |p: &Path| -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(p)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    };
    let inside = src.strip_prefix("/").unwrap();
    let vdir = at.join("versions").join(inside).join("notes.txt");
    let host = names(&at.join("hosts")).remove(0);
    // Listed, and so kept by the kernel, before the backup.
    let first = names(&at.join("snapshots"));
    assert_eq!(first.len(), 1);
    assert_eq!(names(&at.join("hosts").join(&host)), first);
    assert_eq!(names(&vdir).len(), 1);
    assert_eq!(names(&at.join("versions").join(inside)), ["notes.txt"]);
    let read_latest =
        |name: &str| std::fs::read_to_string(at.join("latest").join(inside).join(name));
    assert_eq!(read_latest("notes.txt").unwrap(), "first");

    // Snapshot times are to the second: the next one a second on.
    std::thread::sleep(Duration::from_millis(1100));
    std::fs::write(src.join("notes.txt"), "second").unwrap();
    std::fs::write(src.join("new.txt"), "new").unwrap();
    ok(&repo, &["backup", s]);
    // Shown within the refresh (1 s) and the kernel's 1 s on lists;
    // waited for at most 30 s.
    let until = |what: &str, done: &dyn Fn() -> bool| {
        let t0 = Instant::now();
        while !done() {
            assert!(
                t0.elapsed() < Duration::from_secs(30),
                "{what}: not shown in 30 s"
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    };
    until("the new snapshot", &|| {
        names(&at.join("snapshots")).len() == 2
    });
    until("the new snapshot by host", &|| {
        names(&at.join("hosts").join(&host)).len() == 2
    });
    until("latest", &|| {
        read_latest("notes.txt").is_ok_and(|c| c == "second")
    });
    assert_eq!(read_latest("new.txt").unwrap(), "new");
    until("the new version", &|| names(&vdir).len() == 2);
    until("the new path", &|| {
        names(&at.join("versions").join(inside)) == ["new.txt", "notes.txt"]
    });
    // The older snapshot still reads as it was.
    let old = at.join("snapshots").join(&first[0]).join(inside);
    assert_eq!(
        std::fs::read_to_string(old.join("notes.txt")).unwrap(),
        "first"
    );

    // And a forget: the newest snapshot goes, latest goes back.
    ok(&repo, &["forget", "latest"]);
    until("the forget", &|| names(&at.join("snapshots")) == first);
    until("latest after the forget", &|| {
        read_latest("notes.txt").is_ok_and(|c| c == "first")
    });

    // A prune meanwhile deletes nothing: the mount holds a session, which
    // the prune names as what it waits for.
    let data = || files_under(&repo.join("data"));
    let before = data();
    let o = capsule(&repo, &["prune"]);
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(o.status.success(), "{said}");
    assert!(
        said.contains("mount on"),
        "the prune names the mount: {said}"
    );
    assert_eq!(data(), before, "a pack was deleted while mounted");
    let (code, out, err) = m.stop();
    assert_eq!(code, Some(0), "{out}\n{err}");
    // Unmounted, the next prune deletes what the forget left unused.
    ok(&repo, &["prune"]);
    assert_ne!(data(), before, "nothing was pruned after the mount ended");
}

/// An entry's inode number is its directory's place in the mount's table
/// and its position in the directory, and a place is reused once the
/// kernel has forgotten every entry of the directory there: what the mount
/// keeps by inode number (a file's map of blobs) must go with them, or a
/// file read after would get the bytes of one read before at the same
/// position. Two directories with the same names, read in turn, with the
/// kernel made to forget everything between (root only: `drop_caches`).
#[test]
fn a_file_read_after_the_kernel_forgot_another_in_its_place_reads_its_own_bytes() {
    if !rustix::process::geteuid().is_root() {
        eprintln!("skipped: making the kernel forget (drop_caches) needs root");
        return;
    }
    let t = tempfile::tempdir().unwrap();
    let (src, repo) = (t.path().join("src"), t.path().join("repo"));
    for d in ["a", "b"] {
        std::fs::create_dir_all(src.join(d)).unwrap();
        for i in 0..10 {
            std::fs::write(src.join(d).join(format!("f{i}")), format!("{d} {i}\n")).unwrap();
        }
    }
    init(&repo);
    ok(&repo, &["backup", src.to_str().unwrap()]);
    let at = t.path().join("mnt");
    let Some(m) = Mounted::start(&repo, &at) else {
        return;
    };
    let inside = at.join("latest").join(src.strip_prefix("/").unwrap());
    let forget = || std::fs::write("/proc/sys/vm/drop_caches", "3").unwrap();
    for round in 0..3 {
        for d in ["a", "b"] {
            for i in 0..10 {
                let got = std::fs::read_to_string(inside.join(d).join(format!("f{i}"))).unwrap();
                assert_eq!(got, format!("{d} {i}\n"), "round {round}: {d}/f{i}");
            }
            forget();
        }
    }
    let (code, _, err) = m.stop();
    assert_eq!(code, Some(0), "{err}");
}
