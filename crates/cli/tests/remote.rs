//! End-to-end over real network servers on loopback (Samba, OpenSSH,
//! MinIO), through Toxiproxy at a 2 ms round trip: back up a tree with real
//! metadata, run again with nothing changed (≤ 10 requests), restore and
//! compare; then faults: a connection cut mid-upload, a server that
//! vanishes, wrong credentials, a missing share/bucket, a full destination.
//!
//! Servers come from `scripts/servers.sh` (see crates/net/tests/servers.rs
//! for the switch that makes their absence a failure in the test command).

// The command-line suite runs on Linux, against real servers, btrfs,
// fanotify and network namespaces; the macOS build checks the libraries.
#![cfg(target_os = "linux")]
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use common::remote::{Kind, Remote};
use common::*;

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn roundtrip(kind: Kind) {
    let name = format!("roundtrip-{kind:?}").to_lowercase();
    let Some(r) = Remote::new(kind, &name) else {
        return;
    };
    let work = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let src = work.path().join("src");
    torture_tree(&src, 3000);
    // Entries changed within a second (whole seconds) of a snapshot are re-read next time
    // (the racy-entry guard); let the tree settle so "unchanged" is exact.
    std::thread::sleep(std::time::Duration::from_millis(2100));
    r.ok(&["init"]);
    let first = r.json(&["backup", src.to_str().unwrap()]);
    assert!(first["destination"]["requests"].as_u64().unwrap() > 3);
    assert_eq!(
        first["destination"]["layers"][2].as_str(),
        Some(format!("{kind:?}").to_lowercase().as_str())
    );
    // Nothing changed: a handful of requests, whatever the tree's size:
    // opening, two listings, the snapshot, the session (put, delete, one
    // listing of prune marks), one listing of the quota; and when another
    // test touched an ancestor directory, one tree pack and its index file.
    let again = r.json(&["backup", src.to_str().unwrap()]);
    let req = again["destination"]["requests"].as_u64().unwrap();
    assert!(
        req <= 12,
        "{kind:?}: a no-change run made {req} requests: {again}"
    );
    assert_eq!(
        again["files_unchanged"],
        first["summary"]["files"],
        "{kind:?}: {}",
        serde_json::json!({"parent": again["parent"], "new": again["files_new"], "changed": again["files_changed"], "first_snapshot": first["snapshot_id"]})
    );
    let target = work.path().join("restored");
    r.ok(&["restore", "latest", "--target", target.to_str().unwrap()]);
    assert_same_tree(&src, &restored(&target, &src), false);
    let check = r.json(&["check", "--read-data"]);
    assert_eq!(check["ok"], true, "{check}");
    // A pack damaged on the server is found by the network read (streamed
    // into one buffer; on SMB in reads kept in flight) and named.
    if let Some(dir) = &r.local_dir {
        let victim = pack_files(dir)
            .into_iter()
            .filter(|p| p.starts_with(dir.join("data")))
            .max_by_key(|p| std::fs::metadata(p).unwrap().len())
            .unwrap();
        let mut bytes = std::fs::read(&victim).unwrap();
        let mid = bytes.len() / 2;
        bytes[mid] ^= 0x40;
        std::fs::write(&victim, &bytes).unwrap();
        let o = r.run(&["check", "--read-data"]);
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(12), "{kind:?}: {err}");
        let name = victim.file_name().unwrap().to_str().unwrap();
        assert!(err.contains(name), "{kind:?}: {name} not named: {err}");
    }
}

/// The connection dies after `limit` bytes, again and again: every object
/// either lands whole or not at all, no snapshot names missing data, and
/// once the link is healthy the next run completes.
fn cut_mid_upload(kind: Kind) {
    let name = format!("cut-{kind:?}").to_lowercase();
    let Some(r) = Remote::new(kind, &name) else {
        return;
    };
    let work = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let src = work.path().join("src");
    std::fs::create_dir_all(&src).unwrap();
    for i in 0..3 {
        std::fs::write(src.join(format!("big{i}")), noise(14 << 20, i)).unwrap();
    }
    r.ok(&["init", "--pack-size-mib", "4"]);
    r.proxy
        .toxic("cut", "limit_data", "upstream", r#"{"bytes":6000000}"#)
        .unwrap();
    let o = r.run_with(
        &["backup", src.to_str().unwrap()],
        &[("CAPSULE_CONNECTIONS", "2")],
    );
    r.proxy.remove_toxic("cut").unwrap();
    let code = o.status.code().unwrap();
    eprintln!("{kind:?} with cuts: exit {code}; {}", stderr(&o).trim());
    assert!(
        code == 0 || code == 14,
        "{kind:?}: expected success or 'unreachable' (14), got {code}: {}",
        stderr(&o)
    );
    if code == 14 {
        assert!(
            stderr(&o).lines().any(|l| l.starts_with("capsule: ")),
            "{}",
            stderr(&o)
        );
        let snaps = r.json(&["snapshots"]);
        assert_eq!(
            snaps.as_array().unwrap().len(),
            0,
            "no snapshot after a failed run"
        );
    }
    // Whatever landed is whole: every pack reads back and authenticates.
    let check = r.json(&["check", "--read-data"]);
    assert_eq!(check["ok"], true, "{kind:?}: {check}");
    // The next run completes and restores byte for byte.
    r.ok(&["backup", src.to_str().unwrap()]);
    let target = work.path().join("restored");
    r.ok(&["restore", "latest", "--target", target.to_str().unwrap()]);
    for i in 0..3 {
        let f = format!("big{i}");
        assert!(
            std::fs::read(restored(&target, &src).join(&f)).unwrap() == noise(14 << 20, i),
            "{f} differs"
        );
    }
}

/// The destination vanishes mid-backup, after some packs landed but before
/// an index file listed them (a laptop leaving home). The run fails with
/// "unreachable"; the next one finds those packs through the local journal
/// and indexes them instead of uploading their content again.
fn vanish_mid_backup(kind: Kind) {
    let name = format!("vanish-{kind:?}").to_lowercase();
    let Some(r) = Remote::new(kind, &name) else {
        return;
    };
    let (work, src) = r.big_source(500);
    let journal = || journal_in(r.cache.path());
    let (status, err) = r.vanish_during(&["backup", src.to_str().unwrap()], || journal().is_some());
    assert_eq!(status.code(), Some(14), "{kind:?}: {err}");
    assert!(
        journal().is_some(),
        "{kind:?}: the journal survives a failed run"
    );

    let before = r.json(&["check"]);
    let unindexed = before["report"]["unindexed_packs"]
        .as_array()
        .unwrap()
        .len();
    assert!(unindexed >= 1, "{kind:?}: nothing left unindexed: {before}");
    let again = r.json(&["backup", src.to_str().unwrap()]);
    let recovered = again["storage"]["packs_recovered"].as_u64().unwrap() as usize;
    assert!(
        recovered >= 1 && recovered <= unindexed,
        "{kind:?}: recovered {recovered} of {unindexed} unindexed packs"
    );
    let added = again["storage"]["stored_bytes_added"].as_u64().unwrap();
    assert!(
        added + (recovered as u64) * (3 << 20) <= 120 << 20,
        "{kind:?}: recovered packs were sent again: added {added}"
    );
    let after = r.json(&["check", "--read-data"]);
    assert_eq!(after["ok"], true, "{kind:?}: {after}");
    assert_eq!(
        after["report"]["unindexed_packs"].as_array().unwrap().len(),
        unindexed - recovered,
        "{kind:?}: {after}"
    );
    assert!(
        journal().is_none(),
        "{kind:?}: a completed run leaves no journal"
    );
    let target = work.path().join("restored");
    r.ok(&["restore", "latest", "--target", target.to_str().unwrap()]);
    assert_same_tree(&src, &restored(&target, &src), false);
}

/// A destination away for a while during a backup (a NAS restarting, a
/// node of a distributed store lost and back) is ridden out: the run
/// retries for up to `--retry-for` (60 s by default), here through an
/// outage of 10 s, longer than the six attempts (about 8 s) a run made
/// before, and its snapshot is whole.
fn ride_out(kind: Kind) {
    let name = format!("rideout-{kind:?}").to_lowercase();
    let Some(r) = Remote::new(kind, &name) else {
        return;
    };
    let (work, src) = r.big_source(700);
    let journal = || journal_in(r.cache.path());
    let (status, out, err) = r.away(
        &["--json", "backup", src.to_str().unwrap()],
        &[("CAPSULE_RETRY_FOR", "60")],
        || journal().is_some(),
        Some(Duration::from_secs(10)),
    );
    assert!(status.success(), "{kind:?}: {err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert!(
        v["destination"]["retries"].as_u64().unwrap() > 0,
        "{kind:?}: the outage was not met: {}",
        v["destination"]
    );
    assert_eq!(v["destination"]["retry_for_secs"], 60, "{kind:?}");
    let after = r.json(&["check", "--read-data"]);
    assert_eq!(after["ok"], true, "{kind:?}: {after}");
    let target = work.path().join("restored");
    r.ok(&["restore", "latest", "--target", target.to_str().unwrap()]);
    assert_same_tree(&src, &restored(&target, &src), false);
}

/// The destination vanishes mid-restore. The restore retries, then gives
/// up with "unreachable" (14), leaving only complete files; the same
/// command run again finishes, without fetching those files again.
fn vanish_mid_restore(kind: Kind) {
    let name = format!("vanish-restore-{kind:?}").to_lowercase();
    let Some(r) = Remote::new(kind, &name) else {
        return;
    };
    let work = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let src = work.path().join("src");
    std::fs::create_dir_all(&src).unwrap();
    for i in 0..24 {
        std::fs::write(src.join(format!("f{i:02}")), noise(5 << 20, 700 + i)).unwrap();
    }
    r.ok(&["init", "--pack-size-mib", "4"]);
    r.ok(&["backup", src.to_str().unwrap()]);
    let target = work.path().join("restored");
    let dir = restored(&target, &src);
    // A file is complete once its times are set (the last step).
    let complete = || {
        files_under(&dir)
            .iter()
            .filter(|f| {
                let m = |p: &Path| std::fs::metadata(p).and_then(|m| m.modified()).ok();
                m(f) == m(&src.join(f.file_name().unwrap()))
            })
            .count()
    };
    let t = target.to_str().unwrap();
    let (status, err) = r.vanish_during(
        &[
            "--no-cache",
            "--connections",
            "2",
            "restore",
            "latest",
            "--target",
            t,
        ],
        || dir.exists() && complete() >= 4,
    );
    assert_eq!(status.code(), Some(14), "{kind:?}: {err}");
    // What is left is complete.
    let left = files_under(&dir);
    for f in &left {
        assert_eq!(
            std::fs::read(f).unwrap(),
            std::fs::read(src.join(f.file_name().unwrap())).unwrap(),
            "{kind:?}: {} left incomplete",
            f.display()
        );
    }
    let again = r.json(&[
        "--no-cache",
        "restore",
        "latest",
        "--target",
        target.to_str().unwrap(),
    ]);
    eprintln!(
        "{kind:?}: {} files complete at the cut; the rerun restored {}",
        left.len(),
        again["files"]
    );
    assert!(left.len() >= 4, "{kind:?}: complete files were removed");
    assert_eq!(again["unchanged"].as_u64().unwrap(), left.len() as u64);
    assert_eq!(again["files"].as_u64().unwrap(), 24 - left.len() as u64);
    assert_same_tree(&src, &dir, false);
}

/// The reliability suite's network cuts, at N offsets per phase spread
/// evenly over an uncut run, taking turns over three kinds of cut:
/// * `limit_data`: every connection is closed after N bytes (N spread over
///   what an uncut run sends in backup, or receives in restore);
/// * `reset_peer`: connections are reset at a point in time spread over the
///   uncut run's duration, and new ones for the next 300 ms;
/// * `timeout`: from such a point, data stops flowing for 1.5 s and stalled
///   connections are closed after 1 s.
///
/// A reset or a stall is a blip the retry layer must ride out (exit 0);
/// after a `limit_data` cut a run may also stop with "unreachable" (14),
/// as every new connection is cut too. After each,
/// `check --read-data` is clean; a cut restore run again completes; every
/// output is bit-identical.
/// `CAPSULE_CUT_OFFSETS` sets the offsets per phase (3 in the test command,
/// 100 in the documented long run, docs/RELIABILITY.md).
fn cut_sweep(kind: Kind) {
    let offsets: u64 = std::env::var("CAPSULE_CUT_OFFSETS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3);
    let name = format!("sweep-{kind:?}").to_lowercase();
    let Some(r) = Remote::new(kind, &name) else {
        return;
    };
    let work = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let src = work.path().join("src");
    std::fs::create_dir_all(src.join("small")).unwrap();
    for i in 0..40 {
        std::fs::write(src.join(format!("small/f{i:02}")), noise(20_000, 900 + i)).unwrap();
    }
    r.ok(&["init", "--pack-size-mib", "4"]);
    r.ok(&["backup", src.to_str().unwrap()]);
    let src_s = src.to_str().unwrap();
    let add =
        |i: u64| std::fs::write(src.join(format!("new{i:03}")), noise(3 << 20, 2000 + i)).unwrap();
    // What a run that adds one file sends, uncut.
    add(0);
    let started = Instant::now();
    let up = r.json(&["backup", src_s])["destination"]["bytes_up"]
        .as_u64()
        .unwrap();
    let backup_secs = started.elapsed();
    // Cut `i` of `offsets` in a run of `args`: its kind, and the run.
    let cut = |i: u64, args: &[&str], stream: &str, bytes: u64, secs: Duration| {
        let frac = i as f64 / (offsets + 1) as f64;
        let extra = [("CAPSULE_CONNECTIONS", "2")];
        match i % 3 {
            1 => {
                let limit = (bytes as f64 * frac) as u64;
                r.proxy
                    .toxic(
                        "sweep",
                        "limit_data",
                        stream,
                        &format!(r#"{{"bytes":{limit}}}"#),
                    )
                    .unwrap();
                let o = r.run_with(args, &extra);
                r.proxy.remove_toxic("sweep").unwrap();
                (format!("limit_data after {limit} bytes"), o)
            }
            k => {
                // A reset (new connections too, for 300 ms) or a stall
                // (closed after 1 s, for 1.5 s).
                let (toxic, attrs, window) = if k == 2 {
                    ("reset_peer", r#"{"timeout":0}"#, 300)
                } else {
                    ("timeout", r#"{"timeout":1000}"#, 1500)
                };
                let at = secs.mul_f64(frac);
                let window = Duration::from_millis(window);
                let o = r.toxic_window(args, &extra, at, window, (toxic, stream, attrs));
                (format!("{toxic} at {at:?}"), o)
            }
        }
    };
    let code_of = |o: &Output, what: &str| {
        let code = o.status.code().unwrap();
        assert!(
            code == 0 || code == 14,
            "{kind:?} {what}: exit {code}: {}",
            stderr(o)
        );
        code
    };
    let mut stopped = 0;
    for i in 1..=offsets {
        add(i);
        let (what, o) = cut(i, &["backup", src_s], "upstream", up, backup_secs);
        let what = format!("backup cut by {what}");
        let code = code_of(&o, &what);
        eprintln!("{kind:?} {what}: exit {code}");
        assert!(
            code == 0 || i % 3 == 1,
            "{kind:?} {what}: a blip of at most 1.5 s must be ridden out: {}",
            stderr(&o)
        );
        if code == 14 {
            stopped += 1;
        }
        let check = r.json(&["check", "--read-data"]);
        assert_eq!(check["ok"], true, "{kind:?} {what}: {check}");
    }
    r.ok(&["backup", src_s]);
    let reference = work.path().join("reference");
    let started = Instant::now();
    let full = r.json(&[
        "--no-cache",
        "restore",
        "latest",
        "--target",
        reference.to_str().unwrap(),
    ]);
    assert_same_tree(&src, &restored(&reference, &src), false);
    let restore_secs = started.elapsed();
    let down = full["destination"]["bytes_down"].as_u64().unwrap();
    for i in 1..=offsets {
        let target = work.path().join(format!("cut-{i}"));
        let t = target.to_str().unwrap();
        let args = ["--no-cache", "restore", "latest", "--target", t];
        let (what, o) = cut(i, &args, "downstream", down, restore_secs);
        let code = code_of(&o, &format!("restore cut by {what}"));
        eprintln!("{kind:?} restore cut by {what}: exit {code}");
        assert!(
            code == 0 || i % 3 == 1,
            "{kind:?} restore cut by {what}: a blip of at most 1.5 s must be ridden out: {}",
            stderr(&o)
        );
        if code == 14 {
            stopped += 1;
            r.ok(&["--no-cache", "restore", "latest", "--target", t]);
        }
        assert_same_tree(&src, &restored(&target, &src), false);
        std::fs::remove_dir_all(&target).unwrap();
    }
    eprintln!(
        "{kind:?}: {} cuts ({offsets} in backup, {offsets} in restore), {stopped} stopped with exit 14, all recovered",
        2 * offsets
    );
}

/// A server that goes away, bad credentials and a missing container each
/// give one clear line and their own exit code.
fn errors(kind: Kind) {
    let name = format!("errors-{kind:?}").to_lowercase();
    let Some(r) = Remote::new(kind, &name) else {
        return;
    };
    r.ok(&["init"]);

    r.proxy.set_enabled(false).unwrap();
    let o = r.run(&["snapshots"]);
    r.proxy.set_enabled(true).unwrap();
    assert_eq!(
        o.status.code(),
        Some(14),
        "{kind:?} vanished: {}",
        stderr(&o)
    );
    assert!(
        stderr(&o).contains(&r.proxy.listen) || stderr(&o).contains("127.0.0.1"),
        "{}",
        stderr(&o)
    );

    let bad: &[(&str, &str)] = match kind {
        Kind::Smb => &[("CAPSULE_SMB_PASSWORD", "wrong")],
        Kind::Sftp => &[
            ("CAPSULE_SFTP_KEY", "/nonexistent-key"),
            ("CAPSULE_SFTP_PASSWORD", "wrong"),
        ],
        Kind::S3 => &[("AWS_SECRET_ACCESS_KEY", "wrong-secret")],
    };
    let o = r.run_with(&["snapshots"], bad);
    assert_eq!(
        o.status.code(),
        Some(15),
        "{kind:?} bad credentials: {}",
        stderr(&o)
    );
    assert_eq!(
        stderr(&o)
            .lines()
            .filter(|l| l.starts_with("capsule: "))
            .count(),
        1,
        "{}",
        stderr(&o)
    );

    let missing = match kind {
        Kind::Smb => r.url.replace("/backup/", "/no-such-share/"),
        Kind::Sftp => format!("{}/no/such/dir", r.url),
        Kind::S3 => r.url.replace("/capsule-test/", "/no-such-bucket/"),
    };
    let mut c = capsule_cmd(&r.test_env());
    c.arg("--repo").arg(&missing).arg("snapshots");
    for (k, v) in &r.env {
        c.env(k, v);
    }
    let o = c.output().unwrap();
    assert_eq!(
        o.status.code(),
        Some(17),
        "{kind:?} missing container: {}",
        stderr(&o)
    );
}

/// `init` on a bucket that does not exist creates it and says so; with
/// credentials the store refuses, it fails with an access error and
/// creates nothing.
#[test]
fn s3_init_creates_a_missing_bucket() {
    let Some(r) = Remote::new(Kind::S3, "new-bucket") else {
        return;
    };
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    let bucket = format!("capsule-new-{}-{nanos}", std::process::id());
    let url = r.url.replace("/capsule-test/", &format!("/{bucket}/"));
    let run = |args: &[&str], extra: &[(&str, &str)]| {
        let mut c = capsule_cmd(&r.test_env());
        c.arg("--repo").arg(&url).args(args);
        for (k, v) in &r.env {
            c.env(k, v);
        }
        for (k, v) in extra {
            c.env(k, v);
        }
        c.output().unwrap()
    };
    let o = run(&["init"], &[("AWS_SECRET_ACCESS_KEY", "wrong-secret")]);
    assert_eq!(o.status.code(), Some(15), "{}", stderr(&o));
    let o = run(&["snapshots"], &[]);
    assert_eq!(
        o.status.code(),
        Some(17),
        "nothing was created: {}",
        stderr(&o)
    );
    let o = run(&["init"], &[]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stderr(&o).contains(&format!("created bucket {bucket}")),
        "{}",
        stderr(&o)
    );
    let src = tempfile::tempdir().unwrap();
    std::fs::write(src.path().join("f"), b"into a new bucket").unwrap();
    let o = run(&["backup", src.path().to_str().unwrap()], &[]);
    assert!(o.status.success(), "{}", stderr(&o));
    // A second init finds the bucket there (and the repository in it).
    let o = run(&["init"], &[]);
    assert_eq!(o.status.code(), Some(11), "{}", stderr(&o));
    assert!(!stderr(&o).contains("created bucket"), "{}", stderr(&o));
}

/// A destination that fills up: one clear line, exit 16, nothing
/// committed; after space is freed the next run completes. Uses a small
/// tmpfs under the share / SFTP directory, so it needs root.
fn full(kind: Kind) {
    if !is_root() {
        eprintln!("skipped: needs root to mount a small tmpfs");
        return;
    }
    let name = format!("full-{kind:?}").to_lowercase();
    let Some(r) = Remote::new(kind, &name) else {
        return;
    };
    let Some(dir) = r.local_dir.clone() else {
        return;
    };
    std::fs::create_dir_all(&dir).unwrap();
    let st = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=24m", "tmpfs"])
        .arg(&dir)
        .status()
        .unwrap();
    assert!(st.success());
    struct Unmount(PathBuf);
    impl Drop for Unmount {
        fn drop(&mut self) {
            let _ = Command::new("umount").arg("-l").arg(&self.0).status();
        }
    }
    let _guard = Unmount(dir.clone());
    let work = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let src = work.path().join("src");
    std::fs::create_dir_all(&src).unwrap();
    for i in 0..4 {
        std::fs::write(src.join(format!("f{i}")), noise(10 << 20, 100 + i)).unwrap();
    }
    r.ok(&["init", "--pack-size-mib", "4"]);
    let o = r.run(&["backup", src.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(16), "{kind:?} full: {}", stderr(&o));
    assert_eq!(r.json(&["snapshots"]).as_array().unwrap().len(), 0);
    // Make room and run again: it completes.
    std::fs::remove_file(src.join("f3")).unwrap();
    std::fs::remove_file(src.join("f2")).unwrap();
    Command::new("mount")
        .args(["-o", "remount,size=64m"])
        .arg(&dir)
        .status()
        .unwrap();
    r.ok(&["backup", src.to_str().unwrap()]);
    assert_eq!(r.json(&["check"])["ok"], true);
}

#[test]
fn smb_roundtrip() {
    roundtrip(Kind::Smb);
}
#[test]
fn sftp_roundtrip() {
    roundtrip(Kind::Sftp);
}
#[test]
fn s3_roundtrip() {
    roundtrip(Kind::S3);
}
#[test]
fn smb_cut_mid_upload() {
    cut_mid_upload(Kind::Smb);
}
#[test]
fn sftp_cut_mid_upload() {
    cut_mid_upload(Kind::Sftp);
}
#[test]
fn s3_cut_mid_upload() {
    cut_mid_upload(Kind::S3);
}
#[test]
fn smb_ride_out() {
    ride_out(Kind::Smb);
}
#[test]
fn sftp_ride_out() {
    ride_out(Kind::Sftp);
}
#[test]
fn s3_ride_out() {
    ride_out(Kind::S3);
}
#[test]
fn smb_vanish_mid_backup() {
    vanish_mid_backup(Kind::Smb);
}
#[test]
fn sftp_vanish_mid_backup() {
    vanish_mid_backup(Kind::Sftp);
}
#[test]
fn s3_vanish_mid_backup() {
    vanish_mid_backup(Kind::S3);
}
#[test]
fn smb_vanish_mid_restore() {
    vanish_mid_restore(Kind::Smb);
}
#[test]
fn sftp_vanish_mid_restore() {
    vanish_mid_restore(Kind::Sftp);
}
#[test]
fn s3_vanish_mid_restore() {
    vanish_mid_restore(Kind::S3);
}
#[test]
fn smb_cut_sweep() {
    cut_sweep(Kind::Smb);
}
#[test]
fn sftp_cut_sweep() {
    cut_sweep(Kind::Sftp);
}
#[test]
fn s3_cut_sweep() {
    cut_sweep(Kind::S3);
}
#[test]
fn smb_errors() {
    errors(Kind::Smb);
}
#[test]
fn sftp_errors() {
    errors(Kind::Sftp);
}
#[test]
fn s3_errors() {
    errors(Kind::S3);
}
#[test]
fn smb_full() {
    full(Kind::Smb);
}
#[test]
fn sftp_full() {
    full(Kind::Sftp);
}

/// forget and prune over the network: with nothing else running, the
/// prune deletes what it marks in the same run, with requests in
/// proportion to the packs it touches, and the kept snapshot restores bit
/// for bit.
fn prune_remote(kind: Kind) {
    let name = format!("prune-{kind:?}").to_lowercase();
    let Some(r) = Remote::new(kind, &name) else {
        return;
    };
    let work = tempfile::tempdir().unwrap();
    let src = work.path().join("src");
    std::fs::create_dir_all(&src).unwrap();
    r.ok(&["init"]);
    for i in 0..3u64 {
        let _ = std::fs::remove_file(src.join(format!("f{}", i.wrapping_sub(1))));
        std::fs::write(src.join(format!("f{i}")), noise(2_000_000, 40 + i)).unwrap();
        r.ok(&["backup", src.to_str().unwrap()]);
    }
    // What cut writes leave on a share: old temporaries go, a fresh one
    // stays (object stores leave none).
    let planted = r.local_dir.as_deref().map(plant_temporaries);
    let swept = r.json(&["forget", "--keep-last", "1", "--prune"]);
    let n = swept["prune"]["packs_marked"].as_u64().unwrap();
    assert!(n >= 2, "{kind:?}: {swept}");
    assert!(
        swept["prune"]["bytes_marked"].as_u64().unwrap() >= 4_000_000,
        "{swept}"
    );
    assert_eq!(
        swept["prune"]["packs_deleted"].as_u64().unwrap(),
        n,
        "{kind:?}: {swept}"
    );
    if let Some((old, fresh)) = planted {
        assert_eq!(
            swept["prune"]["temporaries_removed"], 2,
            "{kind:?}: {swept}"
        );
        assert!(old.iter().all(|p| !p.exists()), "{kind:?}");
        assert!(fresh.exists(), "{kind:?}");
        std::fs::remove_file(&fresh).unwrap();
    }
    // Two passes, each listing sessions, marks, forgotten, snapshots and
    // the index and reading them; a delete per pack, the marks: no
    // per-blob requests (45 for four packs on a local disk).
    let requests = swept["destination"]["requests"].as_u64().unwrap();
    assert!(
        requests <= 60 + 3 * n,
        "{kind:?}: {requests} requests: {swept}"
    );
    let check = r.json(&["check", "--read-data"]);
    assert_eq!(check["ok"], true, "{check}");
    assert_eq!(check["report"]["packs_marked_for_deletion"], 0, "{check}");
    let target = work.path().join("restored");
    r.ok(&["restore", "latest", "--target", target.to_str().unwrap()]);
    assert_eq!(
        std::fs::read(restored(&target, &src).join("f2")).unwrap(),
        noise(2_000_000, 42)
    );
}

#[test]
fn smb_prune() {
    prune_remote(Kind::Smb);
}

#[test]
fn sftp_prune() {
    prune_remote(Kind::Sftp);
}

#[test]
fn s3_prune() {
    prune_remote(Kind::S3);
}

/// The destination vanishes in the middle of a prune's mark (index
/// rewritten, mark not yet armed) and again in the middle of its sweep
/// (first pack deleted): each run exits 14, `check` stays clean, the next
/// prunes finish the job, and the kept snapshot restores bit for bit.
fn vanish_mid_prune(kind: Kind) {
    let name = format!("vanish-prune-{kind:?}").to_lowercase();
    let Some(r) = Remote::new(kind, &name) else {
        return;
    };
    let work = tempfile::tempdir().unwrap();
    let src = work.path().join("src");
    std::fs::create_dir_all(&src).unwrap();
    r.ok(&["init", "--pack-size-mib", "4"]);
    for i in 0..3u64 {
        let _ = std::fs::remove_file(src.join(format!("f{}", i.wrapping_sub(1))));
        std::fs::write(src.join(format!("f{i}")), noise(9_000_000, 60 + i)).unwrap();
        r.ok(&["backup", src.to_str().unwrap()]);
    }
    let forget = ["forget", "--keep-last", "1", "--prune"];
    let (status, err) = r.vanish_at_pause(&forget, "prune-rewritten");
    assert_eq!(status.code(), Some(14), "{kind:?}: {err}");
    let check = r.json(&["check"]);
    assert_eq!(check["ok"], true, "{kind:?}: {check}");
    // Arms the mark the cut run left unarmed; the next one sweeps it.
    r.ok(&["prune"]);
    let (status, err) = r.vanish_at_pause(&["prune"], "prune-deleting");
    assert_eq!(status.code(), Some(14), "{kind:?}: {err}");
    let check = r.json(&["check"]);
    assert_eq!(check["ok"], true, "{kind:?}: {check}");
    r.ok(&["prune"]);
    let check = r.json(&["check", "--read-data"]);
    assert_eq!(check["ok"], true, "{kind:?}: {check}");
    assert_eq!(check["report"]["packs_marked_for_deletion"], 0, "{check}");
    let dry = r.json(&["prune", "--dry-run"]);
    assert_eq!(dry["prune"]["packs_marked"], 0, "{kind:?}: {dry}");
    assert_eq!(dry["prune"]["marks_waiting"], 0, "{kind:?}: {dry}");
    let target = work.path().join("restored");
    r.ok(&["restore", "latest", "--target", target.to_str().unwrap()]);
    assert_same_tree(&src, &restored(&target, &src), false);
}

#[test]
fn smb_vanish_mid_prune() {
    vanish_mid_prune(Kind::Smb);
}
#[test]
fn sftp_vanish_mid_prune() {
    vanish_mid_prune(Kind::Sftp);
}
#[test]
fn s3_vanish_mid_prune() {
    vanish_mid_prune(Kind::S3);
}

/// Eight clients at once on each server, with a ninth forgetting and
/// pruning (see `common::soak`).
fn soak_remote(kind: Kind) {
    let name = format!("soak-{kind:?}").to_lowercase();
    let Some(r) = Remote::new(kind, &name) else {
        return;
    };
    let work = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    soak(work.path(), &|args, extra| {
        let extra: Vec<(&str, &str)> = extra.iter().map(|(k, v)| (*k, v.as_str())).collect();
        r.run_with(args, &extra)
    });
}

#[test]
fn smb_soak_eight_clients() {
    soak_remote(Kind::Smb);
}
#[test]
fn sftp_soak_eight_clients() {
    soak_remote(Kind::Sftp);
}
#[test]
fn s3_soak_eight_clients() {
    soak_remote(Kind::S3);
}
