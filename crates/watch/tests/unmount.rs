//! Issue 59, 5: the daemon kept a file system mounted below a source busy
//! ("target is busy"): the fanotify watcher held a descriptor on each file
//! system it watched. Now it holds one only within a drain, so the mount's
//! owner can unmount it while the watcher runs, and the watcher says the
//! mounts changed.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

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
