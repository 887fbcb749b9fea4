//! Prune with the real binary: the space of what no kept snapshot uses
//! given back in one pass, shared packs repacked, and prune beside
//! backups that reuse what it marks, pause past their lease or hold
//! sessions (prunes killed at every step: `prune_cut.rs`).

// The command-line suite runs on Linux, against real servers, btrfs,
// fanotify and network namespaces; the macOS build checks the libraries.
#![cfg(target_os = "linux")]
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod common;

use std::path::Path;

use common::*;

/// forget + prune give back exactly the packs no kept snapshot uses, in
/// one prune when nothing else runs (issue 30.7: it used to take two, and
/// the first grew the repository); what is kept restores bit for bit and
/// checks clean; a forgotten snapshot can be brought back until the prune
/// that marks its data, not after.
#[test]
fn one_prune_gives_back_what_no_kept_snapshot_uses() {
    let t = tempfile::tempdir().unwrap();
    let (src, repo) = (t.path().join("src"), t.path().join("repo"));
    std::fs::create_dir_all(&src).unwrap();
    init(&repo);
    // Each run replaces one 3 MB file: every snapshot has its own data.
    for i in 0..4u64 {
        let _ = std::fs::remove_file(src.join(format!("f{}", i.wrapping_sub(1))));
        std::fs::write(src.join(format!("f{i}")), noise(3_000_000, i)).unwrap();
        ok_at(
            &repo,
            NOW - 10 * H + i as i64 * H,
            &["backup", "-q", src.to_str().unwrap()],
        );
    }
    let before = pack_files(&repo);
    let before_bytes = dir_bytes(&before);
    let dry = json(&repo, &["prune", "--dry-run"]);
    assert_eq!(dry["prune"]["packs_marked"], 0, "{dry}");

    let forget = at(
        &repo,
        NOW,
        &["--json", "forget", "--keep-last", "1", "--prune"],
    );
    assert!(
        forget.status.success(),
        "{}",
        String::from_utf8_lossy(&forget.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&forget.stdout).unwrap();
    assert_eq!(v["forget"]["forgotten"].as_array().unwrap().len(), 3);
    // Three 3 MB files' packs (and their trees) are marked and, with no
    // session held anywhere, deleted in the same run.
    assert!(v["prune"]["packs_marked"].as_u64().unwrap() >= 3, "{v}");
    assert!(
        v["prune"]["bytes_marked"].as_u64().unwrap() >= 9_000_000,
        "{v}"
    );
    assert_eq!(
        v["prune"]["packs_deleted"], v["prune"]["packs_marked"],
        "{v}"
    );
    assert_eq!(v["prune"]["passes"], 2, "{v}");
    assert_eq!(v["prune"]["marks_waiting"], 0, "{v}");
    let after = pack_files(&repo);
    let freed = before_bytes - dir_bytes(&after);
    assert!(freed >= 9_000_000, "{freed}");
    // What was given back is what was deleted, less the repacked packs
    // written in their place.
    assert_eq!(
        freed + v["prune"]["bytes_repack_written"].as_u64().unwrap(),
        v["prune"]["bytes_deleted"].as_u64().unwrap(),
        "{v}"
    );
    // The prune that marked their data removed the forgotten snapshots.
    assert!(snapshot_times(&repo, true).is_empty());
    ok(&repo, &["check", "--read-data"]);

    let (old, fresh) = common::plant_temporaries(&repo);
    let second = json(&repo, &["prune"]);
    assert_eq!(second["prune"]["packs_deleted"], 0, "{second}");
    // Temporaries of cut writes go once older than the lease; one that may
    // still be written stays.
    assert_eq!(second["prune"]["temporaries_removed"], 2, "{second}");
    assert!(old.iter().all(|p| !p.exists()));
    assert!(fresh.exists());
    std::fs::remove_file(&fresh).unwrap();
    ok(&repo, &["check", "--read-data"]);
    let target = t.path().join("restored");
    ok(
        &repo,
        &["restore", "latest", "--target", target.to_str().unwrap()],
    );
    assert_eq!(
        std::fs::read(restored(&target, &src).join("f3")).unwrap(),
        noise(3_000_000, 3)
    );
    // Nothing more to do.
    let third = json(&repo, &["prune"]);
    assert_eq!(third["prune"]["packs_marked"], 0);
    assert_eq!(third["prune"]["packs_deleted"], 0);
}

/// Starts a backup that stops at `point` (CAPSULE_TEST_PAUSE) and returns
/// it once it is waiting there.
fn paused_backup(
    repo: &Path,
    src: &Path,
    when: &str,
    point: &str,
    gate: &Path,
) -> std::process::Child {
    paused(
        repo,
        &["--json", "backup", src.to_str().unwrap()],
        when,
        point,
        gate,
    )
}

/// Starts `capsule args` at test time `when`, stopping at `point`
/// (CAPSULE_TEST_PAUSE), and returns it once it is waiting there.
fn paused(repo: &Path, args: &[&str], when: &str, point: &str, gate: &Path) -> std::process::Child {
    paused_at(
        repo,
        args,
        when,
        &format!("{point}:{}", gate.display()),
        gate,
    )
}

/// [`paused`] with every `point:gate` pair of `pauses` (`;` between them),
/// returned once it waits at `gate`.
fn paused_at(
    repo: &Path,
    args: &[&str],
    when: &str,
    pauses: &str,
    gate: &Path,
) -> std::process::Child {
    let mut c = capsule_cmd(&TestEnv::beside(repo).password(PASSWORD));
    c.arg("--repo")
        .arg(repo)
        .args(args)
        .env("CAPSULE_TEST_NOW", when)
        .env("CAPSULE_TEST_PAUSE", pauses)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let mut child = c.spawn().unwrap();
    let waiting = gate.with_extension("waiting");
    for _ in 0..1200 {
        if waiting.exists() {
            return child;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let _ = child.kill();
    let out = child.wait_with_output().unwrap();
    panic!(
        "capsule {args:?} never reached {pauses}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn signal(child: &std::process::Child, sig: rustix::process::Signal) {
    let pid = rustix::process::Pid::from_raw(child.id() as i32).unwrap();
    rustix::process::kill_process(pid, sig).unwrap();
}

/// Source with one file every later backup reuses (`keep`), one snapshot
/// of it, then that snapshot forgotten: its packs are what a prune marks
/// while a backup that reuses them is running.
fn reuse_scenario(t: &Path) -> (std::path::PathBuf, std::path::PathBuf) {
    let (src, repo) = (t.join("src"), t.join("repo"));
    std::fs::create_dir_all(&src).unwrap();
    std::fs::write(src.join("keep"), noise(2_000_000, 7)).unwrap();
    // Let the file settle, so the next backup trusts its recorded content.
    std::thread::sleep(std::time::Duration::from_millis(1100));
    init(&repo);
    ok_at(&repo, NOW - 2 * H, &["backup", "-q", src.to_str().unwrap()]);
    std::fs::write(src.join("new"), noise(100_000, 8)).unwrap();
    (src, repo)
}

/// The worst interleaving, forced: a backup reuses a blob whose only
/// snapshot is forgotten, and holds off its commit while prunes mark that
/// pack and run again. The pack survives (the backup's session is held),
/// the backup commits, and the next prune puts the pack back in use.
#[test]
fn a_backup_reusing_a_blob_that_prune_marks_keeps_it() {
    let t = tempfile::tempdir().unwrap();
    let (src, repo) = reuse_scenario(t.path());
    let gate = t.path().join("gate");
    let child = paused_backup(&repo, &src, &(NOW - H).to_string(), "commit", &gate);
    let first = snapshot_times(&repo, false)[0].0.clone();
    ok_at(&repo, NOW - H, &["forget", &first]);
    let packs = pack_files(&repo);
    let p1 = json(&repo, &["prune"]);
    assert!(p1["prune"]["packs_marked"].as_u64().unwrap() >= 1, "{p1}");
    // The mark waits for the running backup.
    let p2 = json(&repo, &["prune"]);
    assert_eq!(p2["prune"]["packs_deleted"], 0, "{p2}");
    assert_eq!(p2["prune"]["marks_waiting"], 1, "{p2}");
    assert!(pack_files(&repo).is_superset(&packs));

    std::fs::write(&gate, b"").unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // It put the marked packs it may refer to back into the index as it
    // committed: readers need not wait for the next prune.
    ok(&repo, &["check", "--read-data"]);
    let p3 = json(&repo, &["prune"]);
    assert!(pack_files(&repo).contains(&keep_pack(&repo)), "{p3}");
    ok(&repo, &["check", "--read-data"]);
    let target = t.path().join("restored");
    ok(
        &repo,
        &["restore", "latest", "--target", target.to_str().unwrap()],
    );
    assert_eq!(
        std::fs::read(restored(&target, &src).join("keep")).unwrap(),
        noise(2_000_000, 7)
    );
}

/// The one data pack of the reuse scenario's first snapshot: the largest.
fn keep_pack(repo: &Path) -> std::path::PathBuf {
    pack_files(repo)
        .into_iter()
        .filter(|p| p.starts_with(repo.join("data")))
        .max_by_key(|p| std::fs::metadata(p).unwrap().len())
        .unwrap()
}

/// A backup suspended (SIGSTOP) past its lease while the clock jumps two
/// hours: a prune revokes its session, the next deletes the pack it
/// reuses. Woken, the backup sees its session gone, finds the pack
/// missing, and commits nothing; the repository checks clean and the next
/// backup stores the data again. With `after_check`, the suspension falls
/// between its check and its commit: it commits, sees the lapse after, and
/// takes its snapshot back.
fn suspended_backup_past_its_lease(point: &str) {
    let t = tempfile::tempdir().unwrap();
    let (src, repo) = reuse_scenario(t.path());
    let gate = t.path().join("gate");
    // The backup's clock reads a file, so it can jump while it is stopped.
    let clock = t.path().join("clock");
    std::fs::write(&clock, (NOW - H).to_string()).unwrap();
    let child = paused_backup(&repo, &src, &format!("@{}", clock.display()), point, &gate);
    signal(&child, rustix::process::Signal::STOP);
    let first = snapshot_times(&repo, false)[0].0.clone();
    ok_at(&repo, NOW - H, &["forget", &first]);
    let marked = at(&repo, NOW - H, &["--json", "prune"]);
    assert!(marked.status.success());
    // Two hours later: the session's heartbeat is older than its lease.
    let revoke: serde_json::Value =
        serde_json::from_str(&ok_at(&repo, NOW + H, &["--json", "prune"])).unwrap();
    assert_eq!(
        revoke["prune"]["sessions_revoked"]
            .as_array()
            .unwrap()
            .len(),
        1,
        "{revoke}"
    );
    assert_eq!(revoke["prune"]["packs_deleted"], 0);
    let sweep: serde_json::Value =
        serde_json::from_str(&ok_at(&repo, NOW + H, &["--json", "prune"])).unwrap();
    assert!(
        sweep["prune"]["packs_deleted"].as_u64().unwrap() >= 1,
        "{sweep}"
    );

    // It wakes two hours later.
    std::fs::write(&clock, (NOW + H).to_string()).unwrap();
    std::fs::write(&gate, b"").unwrap();
    signal(&child, rustix::process::Signal::CONT);
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("session lease"), "{stderr}");
    // Nothing it committed survives, and nothing is damaged.
    assert!(snapshot_times(&repo, false).is_empty());
    ok(&repo, &["check", "--read-data"]);
    // The next backup stores the file again.
    ok_at(&repo, NOW + 2 * H, &["backup", "-q", src.to_str().unwrap()]);
    ok(&repo, &["check", "--read-data"]);
    let target = t.path().join("restored");
    ok(
        &repo,
        &["restore", "latest", "--target", target.to_str().unwrap()],
    );
    assert_eq!(
        std::fs::read(restored(&target, &src).join("keep")).unwrap(),
        noise(2_000_000, 7)
    );
}

#[test]
fn a_backup_suspended_past_its_lease_commits_nothing() {
    suspended_backup_past_its_lease("commit");
}

#[test]
fn a_backup_suspended_between_its_check_and_commit_takes_its_snapshot_back() {
    suspended_backup_past_its_lease("after-check");
}

/// Packs that hold both kept and forgotten files are repacked: at the
/// default --max-unused, at least 95% of the bytes no kept snapshot uses
/// come back (measured on disk, against the files deleted), and what is
/// kept restores bit for bit.
#[test]
fn repacking_gives_back_the_unused_part_of_shared_packs() {
    let t = tempfile::tempdir().unwrap();
    let (src, repo) = (t.path().join("src"), t.path().join("repo"));
    std::fs::create_dir_all(&src).unwrap();
    // 40 files of 200 kB in the same few packs; 22 of them go.
    for i in 0..40u64 {
        std::fs::write(src.join(format!("f{i:02}")), noise(200_000, 100 + i)).unwrap();
    }
    init(&repo);
    ok(&repo, &["backup", "-q", src.to_str().unwrap()]);
    let mut removed = 0u64;
    for i in (0..40u64).filter(|i| i % 2 == 0 || *i < 5) {
        std::fs::remove_file(src.join(format!("f{i:02}"))).unwrap();
        removed += 200_000;
    }
    ok(&repo, &["backup", "-q", src.to_str().unwrap()]);
    let data = |repo: &Path| {
        dir_bytes(
            &pack_files(repo)
                .into_iter()
                .filter(|p| p.starts_with(repo.join("data")))
                .collect(),
        )
    };
    let before = data(&repo);
    let first = json(&repo, &["forget", "--keep-last", "1", "--prune"]);
    assert!(
        first["prune"]["packs_repacked"].as_u64().unwrap() >= 1,
        "{first}"
    );
    // One prune gives the space back (nothing else runs).
    ok(&repo, &["check", "--read-data"]);
    let second = json(&repo, &["prune"]);
    assert_eq!(second["prune"]["packs_deleted"], 0, "{second}");
    let freed = before - data(&repo);
    assert!(
        freed as f64 >= 0.95 * removed as f64,
        "freed {freed} of {removed} unused bytes: {first}"
    );
    ok(&repo, &["check", "--read-data"]);
    let target = t.path().join("restored");
    ok(
        &repo,
        &["restore", "latest", "--target", target.to_str().unwrap()],
    );
    for i in (0..40u64).filter(|i| i % 2 == 1 && *i >= 5) {
        assert_eq!(
            std::fs::read(restored(&target, &src).join(format!("f{i:02}"))).unwrap(),
            noise(200_000, 100 + i)
        );
    }
    // Repacking again finds nothing to do.
    let again = json(&repo, &["prune"]);
    assert_eq!(again["prune"]["packs_repacked"], 0, "{again}");
}

/// A prune that puts marked packs back into use (their snapshot was
/// brought back after the mark) and repacks the partly used one in the
/// same run leaves one index: the next prune deletes what it marked, marks
/// nothing new, and the one after has nothing to do. (The file that put
/// the packs back used to stay beside the new index, so the next prune saw
/// a marked pack in use again and repacked its blobs a second time.)
#[test]
fn a_prune_that_puts_packs_back_leaves_nothing_for_the_next_to_redo() {
    let t = tempfile::tempdir().unwrap();
    let (src, repo) = (t.path().join("src"), t.path().join("repo"));
    std::fs::create_dir_all(&src).unwrap();
    init(&repo);
    // `a` and `b` share a small pack; the second snapshot keeps `a` only.
    std::fs::write(src.join("a"), noise(300_000, 1)).unwrap();
    std::fs::write(src.join("b"), noise(300_000, 2)).unwrap();
    ok_at(&repo, NOW - 3 * H, &["backup", "-q", src.to_str().unwrap()]);
    std::fs::remove_file(src.join("b")).unwrap();
    std::fs::write(src.join("c"), noise(300_000, 3)).unwrap();
    ok_at(&repo, NOW - 2 * H, &["backup", "-q", src.to_str().unwrap()]);
    let other = t.path().join("other");
    std::fs::create_dir_all(&other).unwrap();
    std::fs::write(other.join("z"), noise(100_000, 4)).unwrap();
    ok_at(&repo, NOW - H, &["backup", "-q", other.to_str().unwrap()]);
    let times = snapshot_times(&repo, false);
    let (first, second) = (times[0].0.clone(), times[1].0.clone());
    ok_at(&repo, NOW, &["forget", &first, &second]);

    // The prune has marked both snapshots' packs; the second snapshot
    // comes back before the prune ends.
    let gate = t.path().join("gate");
    let pruner = paused(
        &repo,
        &["--json", "prune"],
        &NOW.to_string(),
        "prune-armed",
        &gate,
    );
    ok_at(&repo, NOW, &["unforget", &second]);
    std::fs::write(&gate, b"").unwrap();
    let out = pruner.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The same prune's next pass (it sweeps at once: no session is held)
    // finds the snapshot back and puts its packs back, then repacks them.
    let back: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(
        back["prune"]["packs_marked"].as_u64().unwrap() >= 2,
        "{back}"
    );
    assert!(
        back["prune"]["packs_restored"].as_u64().unwrap() >= 2,
        "{back}"
    );
    assert!(
        back["prune"]["packs_repacked"].as_u64().unwrap() >= 1,
        "{back}"
    );
    let next = json(&repo, &["prune"]);
    assert_eq!(next["prune"]["packs_marked"], 0, "{next}");
    assert_eq!(next["prune"]["packs_repacked"], 0, "{next}");
    let idle = json(&repo, &["prune"]);
    assert_eq!(idle["prune"]["packs_deleted"], 0, "{idle}");
    assert_eq!(idle["prune"]["packs_marked"], 0, "{idle}");
    ok(&repo, &["check", "--read-data"]);
    let target = t.path().join("restored");
    ok(
        &repo,
        &["restore", &second, "--target", target.to_str().unwrap()],
    );
    let dir = restored(&target, &src);
    assert_eq!(std::fs::read(dir.join("a")).unwrap(), noise(300_000, 1));
    assert_eq!(std::fs::read(dir.join("c")).unwrap(), noise(300_000, 3));
    assert!(!dir.join("b").exists());
}

/// A destination whose clock is two hours off this machine's (the prune's
/// own session object is dated so): prune refuses, deleting nothing.
#[test]
fn prune_refuses_a_large_clock_skew_against_the_destination() {
    let t = tempfile::tempdir().unwrap();
    let (src, repo) = (t.path().join("src"), t.path().join("repo"));
    std::fs::create_dir_all(&src).unwrap();
    std::fs::write(src.join("a"), noise(10_000, 1)).unwrap();
    init(&repo);
    ok(&repo, &["backup", "-q", src.to_str().unwrap()]);
    let gate = t.path().join("gate");
    let mut c = capsule_cmd(&TestEnv::beside(&repo).password(PASSWORD));
    c.arg("--repo")
        .arg(&repo)
        .arg("prune")
        .env(
            "CAPSULE_TEST_PAUSE",
            format!("prune-session:{}", gate.display()),
        )
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let child = c.spawn().unwrap();
    let waiting = gate.with_extension("waiting");
    for _ in 0..1200 {
        if waiting.exists() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(25));
    }
    for s in std::fs::read_dir(repo.join("sessions")).unwrap() {
        let ok = std::process::Command::new("touch")
            .args(["-d", "2 hours ago"])
            .arg(s.unwrap().path())
            .status()
            .unwrap()
            .success();
        assert!(ok);
    }
    std::fs::write(&gate, b"").unwrap();
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(12), "{stderr}");
    assert!(
        stderr.contains("clock") && stderr.contains("ahead"),
        "{stderr}"
    );
    assert!(
        std::fs::read_dir(repo.join("prune-marks"))
            .is_err_and(|e| e.kind() == std::io::ErrorKind::NotFound)
            || std::fs::read_dir(repo.join("prune-marks"))
                .unwrap()
                .next()
                .is_none()
    );
    ok(&repo, &["check"]);
}

/// A repository of three hourly backups of a 2 MB file that changes each
/// time (what `forget --keep-last 1` leaves unused), and another source
/// for a backup to hold a session with. Returns that source and the
/// repository.
fn three_hours_of_backups(t: &Path) -> (std::path::PathBuf, std::path::PathBuf) {
    let (src, other, repo) = (t.join("src"), t.join("other"), t.join("repo"));
    std::fs::create_dir_all(&src).unwrap();
    std::fs::create_dir_all(&other).unwrap();
    std::fs::write(other.join("z"), noise(100_000, 9)).unwrap();
    init(&repo);
    for i in 0..3u64 {
        let _ = std::fs::remove_file(src.join(format!("f{}", i.wrapping_sub(1))));
        std::fs::write(src.join(format!("f{i}")), noise(2_000_000, i)).unwrap();
        ok_at(
            &repo,
            NOW - 5 * H + i as i64 * H,
            &["backup", "-q", src.to_str().unwrap()],
        );
    }
    (other, repo)
}

/// 30.7: a prune while a backup holds its session marks what is unused
/// and names the session its mark waits for (no sweep yet); `prune --wait`
/// waits for that backup to finish, then deletes the packs.
#[test]
fn a_prune_names_the_sessions_it_waits_for_and_wait_sweeps_after_them() {
    let t = tempfile::tempdir().unwrap();
    let (other, repo) = three_hours_of_backups(t.path());
    let gate = t.path().join("gate");
    let backup = paused_backup(&repo, &other, &NOW.to_string(), "commit", &gate);
    let before = dir_bytes(&pack_files(&repo));
    let v = json(&repo, &["forget", "--keep-last", "1", "--prune"]);
    let p = &v["prune"];
    assert!(p["packs_marked"].as_u64().unwrap() >= 2, "{v}");
    assert_eq!(p["packs_deleted"], 0, "{v}");
    assert_eq!(p["marks_waiting"], 1, "{v}");
    let w = &p["waiting_for"][0];
    assert_eq!(w["kind"], "backup", "{v}");
    assert!(w["lease_ends_unix"].as_i64().unwrap() > w["heartbeat_unix"].as_i64().unwrap());
    let text = ok(&repo, &["prune", "--dry-run"]);
    assert!(
        text.contains("wait for sessions") && text.contains("backup on"),
        "{text}"
    );

    // prune --wait, started while the backup still runs, sweeps once the
    // backup has committed.
    let waiter = capsule_cmd(&TestEnv::beside(&repo).password(PASSWORD))
        .arg("--repo")
        .arg(&repo)
        .args(["--json", "prune", "--wait"])
        .env("CAPSULE_TEST_NOW", NOW.to_string())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(std::time::Duration::from_millis(500));
    std::fs::write(&gate, b"").unwrap();
    let b = backup.wait_with_output().unwrap();
    assert!(b.status.success(), "{}", String::from_utf8_lossy(&b.stderr));
    let out = waiter.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    // The two forgotten snapshots' files (2 MB each) are gone from disk.
    // (The backup put back into the index the marked packs it had seen,
    // as a writer must; the same run marked those again and deleted them.)
    assert_eq!(r["prune"]["marks_waiting"], 0, "{r}");
    assert!(dir_bytes(&pack_files(&repo)) + 4_000_000 <= before, "{r}");
    ok(&repo, &["check", "--read-data"]);
    let idle = json(&repo, &["prune"]);
    assert_eq!(idle["prune"]["packs_deleted"], 0, "{idle}");
}

/// A mark waiting for a backup costs the backups after it nothing: only a
/// backup that held its session when the mark was armed puts the marked
/// packs it started from back into the index; later ones find them put
/// back already and leave them, and read the mark from the cache. (Issue
/// 63: every backup put them back again for as long as the mark waited,
/// two index files a run that every other machine then fetched, and the
/// packs stayed indexed, so each sweep kept them.)
#[test]
fn a_waiting_mark_costs_the_backups_after_it_nothing() {
    let t = tempfile::tempdir().unwrap();
    let (other, repo) = three_hours_of_backups(t.path());
    let src = t.path().join("src");
    let gate = t.path().join("gate");
    let held = paused_backup(&repo, &other, &NOW.to_string(), "commit", &gate);
    let v = json(&repo, &["forget", "--keep-last", "1", "--prune"]);
    assert_eq!(v["prune"]["marks_waiting"], 1, "{v}");
    std::fs::write(&gate, b"").unwrap();
    let b = held.wait_with_output().unwrap();
    assert!(b.status.success(), "{}", String::from_utf8_lossy(&b.stderr));
    let index_files = || std::fs::read_dir(repo.join("index")).unwrap().count();
    let traced = |n: u32, when: i64| {
        let trace = t.path().join(format!("trace{n}.tsv"));
        std::fs::write(src.join(format!("late{n}")), noise(50_000, 20 + n as u64)).unwrap();
        let files = index_files();
        ok_at(
            &repo,
            when,
            &[
                "--trace-requests",
                trace.to_str().unwrap(),
                "backup",
                "-q",
                src.to_str().unwrap(),
            ],
        );
        assert_eq!(
            index_files(),
            files + 1,
            "backup {n} wrote more than its own index file"
        );
        std::fs::read_to_string(&trace).unwrap()
    };
    let first = traced(1, NOW + 60);
    assert!(first.contains("prune-marks/"), "{first}");
    // The second reads the mark from the cache.
    let second = traced(2, NOW + 120);
    assert!(
        !second
            .lines()
            .any(|l| l.split('\t').nth(2) == Some("get") && l.contains("prune-marks/")),
        "{second}"
    );
    // The next prune gives the space back: nothing kept the packs indexed.
    let r = json(&repo, &["prune"]);
    assert_eq!(r["prune"]["marks_waiting"], 0, "{r}");
    assert!(
        r["prune"]["bytes_deleted"].as_u64().unwrap() >= 4_000_000,
        "{r}"
    );
    ok(&repo, &["check", "--read-data"]);
}

/// A backup killed while its machine's clock ran days ahead leaves a
/// session whose heartbeat no pruner's clock reaches for days: the marks
/// waited for it that long (the fleet year's clock-jump faults). A lease
/// is now also judged by the destination's own times (its newest object's
/// and this prune's): once the destination has not seen it renewed for
/// longer than the lease, a prune revokes it and the next sweeps.
#[test]
fn a_session_from_a_clock_days_ahead_runs_out_by_the_destinations_time() {
    let t = tempfile::tempdir().unwrap();
    let (other, repo) = three_hours_of_backups(t.path());
    let gate = t.path().join("gate");
    let mut backup = paused_backup(&repo, &other, &(NOW + 3 * D).to_string(), "commit", &gate);
    backup.kill().unwrap();
    backup.wait().unwrap();
    let prune = |args: &[&str]| {
        let mut a = vec!["--json"];
        a.extend_from_slice(args);
        let out = ok_at(&repo, NOW, &a);
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        v["prune"].clone()
    };
    let first = prune(&["forget", "--keep-last", "1", "--prune"]);
    assert!(first["packs_marked"].as_u64().unwrap() >= 2, "{first}");
    assert_eq!(first["marks_waiting"], 1, "{first}");
    assert_eq!(
        first["waiting_for"][0]["heartbeat_unix"],
        NOW + 3 * D,
        "{first}"
    );
    // Still renewed a moment ago, as the destination saw it: held.
    let again = prune(&["prune"]);
    assert_eq!(
        again["sessions_revoked"].as_array().unwrap().len(),
        0,
        "{again}"
    );
    assert_eq!(again["packs_deleted"], 0, "{again}");
    // Two hours later by the destination's clock, nothing renewed it.
    let two_hours_ago = std::time::SystemTime::now() - std::time::Duration::from_secs(2 * 3600);
    let sessions = files_under(&repo.join("sessions"));
    assert_eq!(sessions.len(), 1, "{sessions:?}");
    std::fs::File::options()
        .write(true)
        .open(&sessions[0])
        .unwrap()
        .set_modified(two_hours_ago)
        .unwrap();
    let revoking = prune(&["prune"]);
    assert_eq!(
        revoking["sessions_revoked"].as_array().unwrap().len(),
        1,
        "{revoking}"
    );
    let sweeping = prune(&["prune"]);
    let deleted =
        revoking["packs_deleted"].as_u64().unwrap() + sweeping["packs_deleted"].as_u64().unwrap();
    assert!(deleted >= 2, "{revoking}\n{sweeping}");
    assert_eq!(sweeping["marks_waiting"], 0, "{sweeping}");
    ok(&repo, &["check", "--read-data"]);
}

/// Two machines' first backups of the same data, started together: `a`
/// sees `b`'s session, claims every large blob and stops before its last
/// pack is sent; `b` then claims the same blobs, loses the shared ones to
/// `a` and stops once its own are indexed; `a` finishes. Returns the repo,
/// the sources, `a` (paused before its packs are flushed) and `b` (paused
/// waiting for `a`'s blobs) with their gates, and the shared bytes.
struct Pair {
    repo: std::path::PathBuf,
    src: [std::path::PathBuf; 2],
    gate_a: std::path::PathBuf,
    gate_b: std::path::PathBuf,
    shared: u64,
}

fn first_backups_at_once(t: &Path) -> (Pair, std::process::Child, std::process::Child) {
    let repo = t.join("repo");
    init(&repo);
    let shared = noise(6_000_000, 40);
    let src = [t.join("a"), t.join("b")];
    for (i, s) in src.iter().enumerate() {
        std::fs::create_dir_all(s).unwrap();
        std::fs::write(s.join("shared"), &shared).unwrap();
        std::fs::write(s.join("own"), noise(1_000_000, 41 + i as u64)).unwrap();
    }
    let when = NOW.to_string();
    let spawn = |host: &str, s: &Path, pauses: String, wait: &Path| {
        let args = ["--json", "backup", "--host", host, s.to_str().unwrap()];
        paused_at(&repo, &args, &when, &pauses, wait)
    };
    let (b_start, gate_b, gate_a) = (t.join("b-start"), t.join("b-wait"), t.join("a-finish"));
    // b's session is on the destination, so a meets it and claims.
    let b = spawn(
        "b",
        &src[1],
        format!(
            "rendezvous:{};claims-wait:{}",
            b_start.display(),
            gate_b.display()
        ),
        &b_start,
    );
    let a = spawn(
        "a",
        &src[0],
        format!("saver-finish:{}", gate_a.display()),
        &gate_a,
    );
    // Claims are ordered by the destination's clock in seconds, then by
    // name: b's come a second after a's.
    std::thread::sleep(std::time::Duration::from_millis(1200));
    std::fs::write(&b_start, b"").unwrap();
    let waiting = gate_b.with_extension("waiting");
    for _ in 0..1200 {
        if waiting.exists() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    assert!(waiting.exists(), "b never waited for a's blobs");
    let p = Pair {
        repo,
        src,
        gate_a,
        gate_b,
        shared: shared.len() as u64,
    };
    (p, a, b)
}

fn bytes_up(out: &std::process::Output) -> u64 {
    assert!(out.status.success(), "{}", said(out));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    v["destination"]["bytes_up"].as_u64().unwrap()
}

fn restores_both(p: &Pair, t: &Path) {
    let check = capsule(&p.repo, &["check", "--read-data"]);
    assert!(check.status.success(), "{}", said(&check));
    let snaps = json(&p.repo, &["snapshots"]);
    for (host, src) in ["a", "b"].iter().zip(&p.src) {
        let target = t.join(format!("restored-{host}"));
        let id = snaps
            .as_array()
            .unwrap()
            .iter()
            .rev()
            .find(|s| s["snapshot"]["hostname"] == *host)
            .map(|s| s["id"].as_str().unwrap().to_string())
            .unwrap_or_else(|| panic!("no snapshot of {host}: {snaps}"));
        ok(
            &p.repo,
            &["restore", &id, "--target", target.to_str().unwrap()],
        );
        assert_same_tree(src, &restored(&target, src), false);
    }
    let claims = files_under(&p.repo.join("claims"));
    assert!(claims.is_empty(), "claims left behind: {claims:?}");
}

/// Issue 62: machines set up at once send what they share once. `b` loses
/// the shared blobs to `a`, waits for `a`'s index, and sends only its own
/// file; both restore, check is clean, and no claim is left.
#[test]
fn first_backups_at_once_send_what_they_share_once() {
    let t = tempfile::tempdir().unwrap();
    let (p, a, b) = first_backups_at_once(t.path());
    std::fs::write(&p.gate_a, b"").unwrap();
    let up_a = bytes_up(&a.wait_with_output().unwrap());
    std::fs::write(&p.gate_b, b"").unwrap();
    let up_b = bytes_up(&b.wait_with_output().unwrap());
    assert!(
        up_a > p.shared,
        "a sent {up_a} bytes, the shared file is {}",
        p.shared
    );
    assert!(
        up_b < p.shared / 3,
        "b sent {up_b} bytes: the shared {} again",
        p.shared
    );
    restores_both(&p, t.path());
}

/// The machine that claimed the shared blobs dies before sending them: the
/// other waits for it (its session is still on the destination) at most a
/// minute, then sends them itself, and nothing is lost.
#[test]
fn a_first_backup_sends_what_a_machine_that_died_claimed() {
    let t = tempfile::tempdir().unwrap();
    let (p, mut a, b) = first_backups_at_once(t.path());
    a.kill().unwrap();
    let _ = a.wait();
    std::fs::write(&p.gate_b, b"").unwrap();
    let up_b = bytes_up(&b.wait_with_output().unwrap());
    assert!(
        up_b > p.shared,
        "b sent {up_b} bytes, the shared file is {}",
        p.shared
    );
    // a's snapshot was never made: back it up again (its blobs are b's now).
    ok_at(
        &p.repo,
        NOW,
        &["backup", "-q", "--host", "a", p.src[0].to_str().unwrap()],
    );
    // The claims a left behind go with the next prune (its session, never
    // ended, is revoked only after its lease: delete it as that prune would).
    for s in files_under(&p.repo.join("sessions")) {
        std::fs::remove_file(s).unwrap();
    }
    ok(&p.repo, &["prune"]);
    restores_both(&p, t.path());
}
