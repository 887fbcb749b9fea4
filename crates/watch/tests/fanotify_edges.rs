//! Two findings of issue 59 against the real fanotify watcher (root):
//! - the daemon kept a file system mounted below a source busy ("target is
//!   busy"): the watcher held a descriptor on each file system it watched;
//!   now it holds one only within a drain;
//! - a write through a descriptor opened by an outside name of a source's
//!   file, that name removed since, was dropped: now the file is placed by
//!   its own handle.

// The Linux watchers (inotify, fanotify); FSEvents' rules are tested in
// the library.
#![cfg(target_os = "linux")]
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::io::Write;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use capsule_watch::fanotify::Fanotify;
use capsule_watch::{Identity, Journal, WatchOptions, Watcher};

#[test]
fn a_file_system_below_a_source_unmounts_while_it_is_watched() {
    if !rustix::process::geteuid().is_root() {
        eprintln!("skipped: mounting and fanotify need root");
        return;
    }
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("src");
    let mnt = src.join("mnt");
    std::fs::create_dir_all(&mnt).unwrap();
    let mounted = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=1m", "tmpfs"])
        .arg(&mnt)
        .status()
        .is_ok_and(|s| s.success());
    if !mounted {
        eprintln!("skipped: tmpfs cannot be mounted here");
        return;
    }
    let mut j = Journal::new(Identity::new("fanotify", String::new(), &[]));
    let opts = WatchOptions {
        sources: vec![src.clone()],
        ..WatchOptions::default()
    };
    let mut w = match Fanotify::start(&opts, &mut j) {
        Ok(w) => w,
        Err(e) => {
            let _ = Command::new("umount").arg("-l").arg(&mnt).status();
            eprintln!("skipped: fanotify cannot run here ({e})");
            return;
        }
    };
    // Changes on the mounted file system: the watcher opens it to place
    // their handles, within the drain.
    std::fs::create_dir(mnt.join("d")).unwrap();
    std::fs::write(mnt.join("d/f"), b"x").unwrap();
    for _ in 0..20 {
        if w.drain(&mut j, Duration::from_millis(100)).unwrap() {
            break;
        }
    }
    let o = Command::new("umount").arg(&mnt).output().unwrap();
    let unmounted = o.status.success();
    if !unmounted {
        let _ = Command::new("umount").arg("-l").arg(&mnt).status();
    }
    assert!(
        unmounted,
        "the watched file system could not be unmounted: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    w.drain(&mut j, Duration::ZERO).unwrap();
}

/// `exec 3>>outside/alias` (a hard link of a file inside a source), `rm
/// outside/alias`, then `echo PAYLOAD >&3`: the file's directory inside
/// the source is dirty, or the journal says it lost track; never nothing
/// (three journal runs stored a stale file). A deleted temporary file
/// written the same way costs nothing.
#[test]
fn a_write_through_a_removed_outside_name_marks_the_file_inside() {
    let Some((t, mut w, mut j)) = watching() else {
        return;
    };
    let sub = t.path().join("src/sub");
    let outside = t.path().join("outside");
    std::fs::create_dir_all(&outside).unwrap();
    let alias = outside.join("alias");
    std::fs::hard_link(sub.join("f"), &alias).unwrap();
    let mut fd = std::fs::OpenOptions::new()
        .append(true)
        .open(&alias)
        .unwrap();
    std::fs::remove_file(&alias).unwrap();
    settle(&mut w, &mut j);
    let (seq, lost) = (j.seq, j.lost.clone());
    fd.write_all(b"PAYLOAD\n").unwrap();
    settle(&mut w, &mut j);
    // The kernel names the file by the name the writer opened ("…
    // (deleted)") while the descriptor holds it, so the file cannot be
    // placed for certain: a loss, and the next run scans.
    // (Compared by what the loss names: other programs write on this
    // file system too.)
    let marked = j.dirty.get(&sub).is_some_and(|s| *s > seq);
    let named = |l: &Option<capsule_watch::Lost>, what: &str| {
        l.as_ref().is_some_and(|l| l.reason.contains(what))
    };
    assert!(
        marked || (j.lost != lost && named(&j.lost, "outside/alias")),
        "the write went unseen: dirty {:?}, lost {:?}",
        j.dirty,
        j.lost
    );
    // A file written through an outside name that was its only one, and
    // removed since (a temporary file): nothing of the sources', no loss.
    let tmp = t.path().join("outside/tmp");
    let mut fd = std::fs::File::create(&tmp).unwrap();
    std::fs::remove_file(&tmp).unwrap();
    settle(&mut w, &mut j);
    let lost = j.lost.clone();
    fd.write_all(b"scratch").unwrap();
    settle(&mut w, &mut j);
    assert!(
        j.lost == lost || !named(&j.lost, "outside/tmp"),
        "a deleted temporary file is no loss: {:?}",
        j.lost
    );
}

/// A source `src` holding `sub/f` under a fresh directory, watched by
/// fanotify (None, saying why, where it cannot run).
fn watching() -> Option<(tempfile::TempDir, Fanotify, Journal)> {
    if !rustix::process::geteuid().is_root() {
        eprintln!("skipped: fanotify needs root");
        return None;
    }
    let t = tempfile::tempdir().unwrap();
    let sub: PathBuf = t.path().join("src/sub");
    std::fs::create_dir_all(&sub).unwrap();
    std::fs::write(sub.join("f"), vec![7u8; 55_470]).unwrap();
    let mut j = Journal::new(Identity::new("fanotify", String::new(), &[]));
    let opts = WatchOptions {
        sources: vec![t.path().join("src")],
        ..WatchOptions::default()
    };
    match Fanotify::start(&opts, &mut j) {
        Ok(w) => Some((t, w, j)),
        Err(e) => {
            eprintln!("skipped: fanotify cannot run here ({e})");
            None
        }
    }
}

/// Drains until a drain records nothing (bounded).
fn settle(w: &mut Fanotify, j: &mut Journal) {
    for _ in 0..50 {
        if !w.drain(j, Duration::from_millis(100)).unwrap() {
            break;
        }
    }
}
