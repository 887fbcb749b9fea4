//! Retention with the real binary: backups made at simulated times (the
//! test clock, `CAPSULE_TEST_NOW`), `forget` by policy and by ID, and
//! `unforget`. The kept set is checked against one computed here from the
//! times alone, not by capsule's code.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod common;

use std::collections::BTreeSet;
use std::path::Path;

use common::*;

const H: i64 = 3600;
const D: i64 = 86_400;
/// Monday 2026-11-23 12:00 UTC.
const NOW: i64 = 1_795_435_200;

fn at(repo: &Path, t: i64, args: &[&str]) -> std::process::Output {
    let t = t.to_string();
    capsule_env(
        repo,
        args,
        &[
            ("CAPSULE_PASSWORD", PASSWORD),
            ("CAPSULE_TEST_NOW", t.as_str()),
            // Calendar buckets are local: pin the zone.
            ("TZ", "UTC"),
        ],
    )
}

fn ok_at(repo: &Path, t: i64, args: &[&str]) -> String {
    let o = at(repo, t, args);
    assert!(
        o.status.success(),
        "capsule {args:?} at {t} failed with {:?}: {}",
        o.status.code(),
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// Snapshot times (Unix seconds) by ID.
fn snapshot_times(repo: &Path, forgotten: bool) -> Vec<(String, i64)> {
    let args: &[&str] = if forgotten {
        &["snapshots", "--forgotten"]
    } else {
        &["snapshots"]
    };
    json(repo, args)
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            (
                s["id"].as_str().unwrap().to_string(),
                s["snapshot"]["time_unix"].as_i64().unwrap(),
            )
        })
        .collect()
}

/// What Time Machine's schedule keeps at `now`, from the times alone:
/// everything of the last 24 hours, the newest of each UTC day of the last
/// 30 days, the newest of each ISO week (weeks start on Monday; 1 January
/// 1970 was a Thursday).
fn timemachine_expected(times: &[i64], now: i64) -> BTreeSet<i64> {
    let newest_by = |key: &dyn Fn(i64) -> i64| -> BTreeSet<i64> {
        let mut best = std::collections::BTreeMap::new();
        for &t in times {
            let e = best.entry(key(t)).or_insert(t);
            *e = (*e).max(t);
        }
        best.into_values().collect()
    };
    let daily = newest_by(&|t| t.div_euclid(D));
    let weekly = newest_by(&|t| (t.div_euclid(D) + 3).div_euclid(7));
    times
        .iter()
        .copied()
        .filter(|&t| {
            now - t <= D || (now - t <= 30 * D && daily.contains(&t)) || weekly.contains(&t)
        })
        .collect()
}

#[test]
fn timemachine_policy_keeps_exactly_its_schedule_and_forgetting_touches_no_data() {
    let t = tempfile::tempdir().unwrap();
    let (src, repo) = (t.path().join("src"), t.path().join("repo"));
    std::fs::create_dir_all(&src).unwrap();
    init(&repo);
    // Daily backups for 40 days, then every three hours for the last three
    // days: a source that changes a little each time.
    let mut times: Vec<i64> = (0..40).map(|i| NOW - 43 * D + i * D + 7 * H).collect();
    times.extend((0..24).map(|i| NOW - 3 * D + i * 3 * H + 1800));
    for (i, &when) in times.iter().enumerate() {
        std::fs::write(src.join(format!("f{}", i % 7)), noise(20_000, i as u64)).unwrap();
        ok_at(&repo, when, &["backup", "-q", src.to_str().unwrap()]);
    }
    let before = snapshot_times(&repo, false);
    assert_eq!(before.len(), times.len());
    let packs = |repo: &Path| {
        files_under(repo)
            .into_iter()
            .filter(|p| {
                !p.starts_with(repo.join("snapshots")) && !p.starts_with(repo.join("forgotten"))
            })
            .collect::<BTreeSet<_>>()
    };
    let data_before = packs(&repo);

    // The dry run says, for every snapshot, kept or not and why, and
    // changes nothing.
    let out = at(
        &repo,
        NOW,
        &["--json", "forget", "--policy", "timemachine", "--dry-run"],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let plan: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let listed = plan["groups"][0]["snapshots"].as_array().unwrap();
    assert_eq!(listed.len(), times.len());
    for v in listed {
        let kept = v["keep"].as_bool().unwrap();
        assert_eq!(kept, !v["reasons"].as_array().unwrap().is_empty(), "{v}");
    }
    assert_eq!(snapshot_times(&repo, false).len(), times.len());

    ok_at(&repo, NOW, &["forget", "--policy", "timemachine"]);
    let kept: BTreeSet<i64> = snapshot_times(&repo, false)
        .into_iter()
        .map(|(_, t)| t)
        .collect();
    let expected = timemachine_expected(&times, NOW);
    assert_eq!(kept, expected);
    assert!(
        kept.len() < times.len() && kept.len() > 10,
        "{}",
        kept.len()
    );
    // Only snapshot objects moved: every pack and index file is still there.
    assert_eq!(packs(&repo), data_before);
    ok(&repo, &["check", "--read-data"]);

    // A forgotten snapshot comes back whole and restores bit-identically
    // (the oldest, whose files have all changed since).
    let forgotten = snapshot_times(&repo, true);
    assert_eq!(forgotten.len(), times.len() - kept.len());
    let (oldest_id, _) = forgotten.iter().min_by_key(|(_, t)| *t).unwrap().clone();
    ok(&repo, &["unforget", &oldest_id[..12]]);
    assert!(snapshot_times(&repo, false)
        .iter()
        .any(|(id, _)| *id == oldest_id));
    assert!(!snapshot_times(&repo, true)
        .iter()
        .any(|(id, _)| *id == oldest_id));
    let target = t.path().join("restored");
    ok(
        &repo,
        &["restore", &oldest_id, "--target", target.to_str().unwrap()],
    );
    let first = restored(&target, &src).join("f0");
    assert_eq!(std::fs::read(first).unwrap(), noise(20_000, 0));

    // The same policy again forgets the snapshot brought back, and only it.
    ok_at(&repo, NOW, &["forget", "--policy", "timemachine"]);
    let now_kept = snapshot_times(&repo, false).len();
    assert_eq!(now_kept, kept.len());
}

#[test]
fn forget_takes_ids_and_names_and_refuses_unknown_ones_empty_policies_and_missing_rules_first() {
    let t = tempfile::tempdir().unwrap();
    let (src, repo) = (t.path().join("src"), t.path().join("repo"));
    std::fs::create_dir_all(&src).unwrap();
    std::fs::write(src.join("a"), b"a").unwrap();
    init(&repo);
    for i in 0..3 {
        ok_at(
            &repo,
            NOW - 10 * D + i * H,
            &["backup", "-q", src.to_str().unwrap()],
        );
    }
    let all = snapshot_times(&repo, false);
    let code = |args: &[&str]| at(&repo, NOW, args).status.code();

    // One good ID and one unknown: nothing is forgotten.
    assert_eq!(code(&["forget", &all[0].0, "0123456789abcdef"]), Some(13));
    // Everything is older than the window: the group would be emptied.
    let o = at(&repo, NOW, &["forget", "--keep-within", "2d"]);
    assert_eq!(o.status.code(), Some(18));
    assert!(String::from_utf8_lossy(&o.stderr).contains("--allow-empty"));
    // No IDs and no rules.
    assert_eq!(code(&["forget"]), Some(2));
    assert_eq!(code(&["forget", "--keep-daily", "0"]), Some(2));
    assert_eq!(code(&["forget", "--keep-within", "soon"]), Some(2));
    assert_eq!(snapshot_times(&repo, false), all);

    // By ID (a prefix).
    ok_at(&repo, NOW, &["forget", &all[1].0[..10]]);
    let left = vec![all[0].clone(), all[2].clone()];
    assert_eq!(snapshot_times(&repo, false), left);
    // By name, as everywhere: a time before the oldest names none, and
    // nothing is forgotten; so does `latest~2` of two.
    assert_eq!(code(&["forget", "2026-11-01"]), Some(13));
    assert_eq!(code(&["forget", "latest~2"]), Some(13));
    assert_eq!(snapshot_times(&repo, false), left);
    // A time: the newest at or before it (12:00, not 14:00; 13:00 is gone).
    ok_at(&repo, NOW, &["forget", "2026-11-13 13:59"]);
    assert_eq!(snapshot_times(&repo, false), vec![all[2].clone()]);
    // Then the rest with --allow-empty.
    ok_at(
        &repo,
        NOW,
        &["forget", "--keep-within", "2d", "--allow-empty"],
    );
    assert!(snapshot_times(&repo, false).is_empty());
    assert_eq!(snapshot_times(&repo, true).len(), 3);
    // Unknown IDs to unforget are named.
    let o = at(&repo, NOW, &["unforget", "fedcba98"]);
    assert_eq!(o.status.code(), Some(13));
}

/// A snapshot from a clock that ran ahead is kept, and does not take the
/// place of today's real one, neither for a policy nor as `latest`.
#[test]
fn snapshots_dated_in_the_future_are_kept() {
    let t = tempfile::tempdir().unwrap();
    let (src, repo) = (t.path().join("src"), t.path().join("repo"));
    std::fs::create_dir_all(&src).unwrap();
    std::fs::write(src.join("a"), b"a").unwrap();
    init(&repo);
    for when in [NOW - 2 * H, NOW - H, NOW + 30 * D] {
        ok_at(&repo, when, &["backup", "-q", src.to_str().unwrap()]);
    }
    ok_at(&repo, NOW, &["forget", "--keep-last", "1"]);
    let kept: Vec<i64> = snapshot_times(&repo, false)
        .into_iter()
        .map(|(_, t)| t)
        .collect();
    assert_eq!(kept, vec![NOW - H, NOW + 30 * D]);
    // `forget latest` means what `restore latest` does: today's newest,
    // not the one dated a month ahead.
    ok_at(&repo, NOW, &["forget", "latest"]);
    let kept: Vec<i64> = snapshot_times(&repo, false)
        .into_iter()
        .map(|(_, t)| t)
        .collect();
    assert_eq!(kept, vec![NOW + 30 * D]);
}

/// Pack objects on disk (data and tree).
fn pack_files(repo: &Path) -> BTreeSet<std::path::PathBuf> {
    files_under(repo)
        .into_iter()
        .filter(|p| p.starts_with(repo.join("data")) || p.starts_with(repo.join("tree")))
        .collect()
}

fn dir_bytes(paths: &BTreeSet<std::path::PathBuf>) -> u64 {
    paths
        .iter()
        .map(|p| std::fs::metadata(p).unwrap().len())
        .sum()
}

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
    let mut c = capsule_cmd(&TestEnv::beside(repo).password(PASSWORD));
    c.arg("--repo")
        .arg(repo)
        .args(args)
        .env("CAPSULE_TEST_NOW", when)
        .env("CAPSULE_TEST_PAUSE", format!("{point}:{}", gate.display()))
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
        "capsule {args:?} never reached {point}: {}",
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

/// A lost pack: `repair snapshots` drops exactly the files whose data it
/// held, names them, keeps the rest restorable, and sets the damaged
/// snapshots aside; two prunes later `check` is clean.
#[test]
fn repair_snapshots_drops_only_what_is_lost() {
    let t = tempfile::tempdir().unwrap();
    let (src, repo) = (t.path().join("src"), t.path().join("repo"));
    std::fs::create_dir_all(src.join("sub")).unwrap();
    std::fs::write(src.join("lost"), noise(3_000_000, 1)).unwrap();
    init(&repo);
    ok(&repo, &["backup", "-q", src.to_str().unwrap()]);
    // The first pack holds only `lost`; the second run's data goes elsewhere.
    let first_packs = pack_files(&repo);
    std::fs::write(src.join("sub/kept"), noise(3_000_000, 2)).unwrap();
    std::fs::write(src.join("small"), b"small").unwrap();
    ok(&repo, &["backup", "-q", src.to_str().unwrap()]);
    let lost_pack = first_packs
        .iter()
        .filter(|p| p.starts_with(repo.join("data")))
        .max_by_key(|p| std::fs::metadata(p).unwrap().len())
        .unwrap();
    std::fs::remove_file(lost_pack).unwrap();
    assert_eq!(capsule(&repo, &["check"]).status.code(), Some(12));

    let dry = json(&repo, &["repair", "snapshots", "--dry-run"]);
    assert_eq!(dry["repaired"].as_array().unwrap().len(), 2, "{dry}");
    assert_eq!(snapshot_times(&repo, true).len(), 0);
    let rep = json(&repo, &["repair", "snapshots"]);
    for r in rep["repaired"].as_array().unwrap() {
        let dropped = r["dropped"].as_array().unwrap();
        assert_eq!(dropped.len(), 1, "{rep}");
        assert!(dropped[0].as_str().unwrap().contains("/src/lost"), "{rep}");
        assert!(r["replaced_by"].is_string());
    }
    assert_eq!(snapshot_times(&repo, true).len(), 2);
    let target = t.path().join("restored");
    ok(
        &repo,
        &["restore", "latest", "--target", target.to_str().unwrap()],
    );
    let r = restored(&target, &src);
    assert_eq!(
        std::fs::read(r.join("sub/kept")).unwrap(),
        noise(3_000_000, 2)
    );
    assert_eq!(std::fs::read(r.join("small")).unwrap(), b"small");
    assert!(!r.join("lost").exists());
    let snaps = json(&repo, &["snapshots"]);
    for s in snaps.as_array().unwrap() {
        assert_eq!(s["snapshot"]["incomplete"], true);
        assert!(s["snapshot"]["tags"]
            .as_array()
            .unwrap()
            .contains(&"repaired".into()));
    }
    // The lost pack leaves the index in two prunes.
    ok(&repo, &["prune"]);
    ok(&repo, &["prune"]);
    ok(&repo, &["check", "--read-data"]);
}

/// A simulated month of backups every three hours (the test clock), with
/// churn each run, the Time Machine policy applied daily and a quota, on a
/// small loop-mounted file system. Checked independently of capsule's code:
/// the packs on disk never exceed the quota; the kept set is the policy's
/// set for these times, less only its oldest members (what the quota took);
/// sampled kept snapshots restore bit for bit; `check --read-data` is clean.
#[test]
fn a_simulated_month_stays_within_its_quota_and_policy() {
    let Some(fs) = LoopFs::new(96) else {
        return;
    };
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("src");
    std::fs::create_dir_all(&src).unwrap();
    let repo = fs.dir.join("repo");
    const QUOTA: u64 = 12 << 20;
    ok(&repo, &["init", "--quota", "12M"]);
    // The source: name -> content seed; 40 files of 100 kB.
    let mut files: std::collections::BTreeMap<String, u64> =
        (0..40u64).map(|i| (format!("f{i:03}"), i)).collect();
    for (n, seed) in &files {
        std::fs::write(src.join(n), noise(100_000, *seed)).unwrap();
    }
    let start = NOW - 30 * D;
    let mut history: Vec<(i64, std::collections::BTreeMap<String, u64>)> = Vec::new();
    let mut next_seed = 1000u64;
    let packs_on_disk = |repo: &Path| dir_bytes(&pack_files(repo));
    for run in 0..(30 * 8) {
        let when = start + run * 3 * H;
        // About 1% churn: one file rewritten each run, one added and one
        // deleted every third run.
        let victim = files
            .keys()
            .nth(run as usize % files.len())
            .unwrap()
            .clone();
        next_seed += 1;
        files.insert(victim.clone(), next_seed);
        std::fs::write(src.join(&victim), noise(100_000, next_seed)).unwrap();
        if run % 3 == 0 {
            next_seed += 1;
            let name = format!("n{run:04}");
            std::fs::write(src.join(&name), noise(100_000, next_seed)).unwrap();
            files.insert(name, next_seed);
            let gone = files.keys().next().unwrap().clone();
            std::fs::remove_file(src.join(&gone)).unwrap();
            files.remove(&gone);
        }
        ok_at(&repo, when, &["backup", "-q", src.to_str().unwrap()]);
        history.push((when, files.clone()));
        if run % 8 == 7 {
            ok_at(
                &repo,
                when,
                &["forget", "-q", "--policy", "timemachine", "--prune"],
            );
        }
        let on_disk = packs_on_disk(&repo);
        assert!(
            on_disk <= QUOTA,
            "run {run}: {on_disk} bytes of packs, quota {QUOTA}"
        );
    }
    let now = history.last().unwrap().0;
    ok_at(
        &repo,
        now,
        &["forget", "-q", "--policy", "timemachine", "--prune"],
    );
    ok_at(&repo, now, &["prune", "-q"]);
    assert!(packs_on_disk(&repo) <= QUOTA);

    let kept: BTreeSet<i64> = snapshot_times(&repo, false)
        .into_iter()
        .map(|(_, t)| t)
        .collect();
    let times: Vec<i64> = history.iter().map(|(t, _)| *t).collect();
    let expected = timemachine_expected(&times, now);
    let oldest = *kept.iter().next().unwrap();
    // The quota took some of the policy's oldest snapshots.
    assert!(
        *expected.iter().next().unwrap() < oldest,
        "the quota never acted"
    );
    let expected_suffix: BTreeSet<i64> = expected.into_iter().filter(|t| *t >= oldest).collect();
    assert_eq!(kept, expected_suffix);
    // The quota, not the policy, decided how far back it goes; the last day
    // is all there.
    assert!(
        kept.iter().filter(|t| now - **t <= D).count() >= 8,
        "{kept:?}"
    );

    // Three kept snapshots, oldest, middle and newest, restore exactly.
    let ids = snapshot_times(&repo, false);
    for (id, when) in [&ids[0], &ids[ids.len() / 2], &ids[ids.len() - 1]] {
        let state = &history.iter().find(|(t, _)| t == when).unwrap().1;
        let target = t.path().join(format!("r-{id}"));
        ok(
            &repo,
            &["restore", id, "--target", target.to_str().unwrap()],
        );
        let dir = restored(&target, &src);
        let got: BTreeSet<String> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(got, state.keys().cloned().collect::<BTreeSet<_>>(), "{id}");
        for (n, seed) in state {
            assert_eq!(
                std::fs::read(dir.join(n)).unwrap(),
                noise(100_000, *seed),
                "{id} {n}"
            );
        }
    }
    ok(&repo, &["check", "--read-data"]);
}

/// A destination that fills up: with the default --when-full delete-oldest
/// every run succeeds, deleting the oldest snapshots to make room; with
/// --when-full fail the run fails with exit 16 and deletes nothing.
#[test]
fn a_full_destination_deletes_the_oldest_and_carries_on() {
    let Some(fs) = LoopFs::new(48) else {
        return;
    };
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("src");
    std::fs::create_dir_all(&src).unwrap();
    let repo = fs.dir.join("repo");
    init(&repo);
    let fill = |run: u64| {
        for f in 0..6u64 {
            std::fs::write(src.join(format!("f{f}")), noise(1_000_000, run * 10 + f)).unwrap();
        }
    };
    // Six runs of 6 MB fit in 48 MiB; then --when-full fail refuses.
    let mut run = 0;
    loop {
        fill(run);
        let o = at(
            &repo,
            NOW - 20 * D + run as i64 * D,
            &["backup", "-q", "--when-full", "fail", src.to_str().unwrap()],
        );
        if !o.status.success() {
            assert_eq!(
                o.status.code(),
                Some(16),
                "{}",
                String::from_utf8_lossy(&o.stderr)
            );
            break;
        }
        run += 1;
        assert!(run < 12, "48 MiB never filled");
    }
    let before = snapshot_times(&repo, false).len();
    assert_eq!(before as u64, run);
    // The default deletes the oldest and carries on, run after run.
    for _ in 0..4 {
        fill(run);
        ok_at(
            &repo,
            NOW - 20 * D + run as i64 * D,
            &["backup", "-q", src.to_str().unwrap()],
        );
        run += 1;
    }
    let after = snapshot_times(&repo, false);
    assert!(after.len() >= 2 && after.len() < run as usize, "{after:?}");
    ok(&repo, &["check", "--read-data"]);
    let target = t.path().join("restored");
    ok(
        &repo,
        &["restore", "latest", "--target", target.to_str().unwrap()],
    );
    assert_eq!(
        std::fs::read(restored(&target, &src).join("f5")).unwrap(),
        noise(1_000_000, (run - 1) * 10 + 5)
    );
}

/// Copies a directory tree (a repository at a chosen state).
fn copy_tree(from: &Path, to: &Path) {
    let ok = std::process::Command::new("cp")
        .arg("-a")
        .arg(from)
        .arg(to)
        .status()
        .unwrap()
        .success();
    assert!(ok);
}

/// A prune killed (SIGKILL) at each of its steps, from the same starting
/// state: one mark waiting to be swept, new unused packs and a partly used
/// one to repack. Afterwards the next prunes finish the job, `check
/// --read-data` is clean and the kept snapshot restores bit for bit.
#[test]
fn a_prune_killed_at_any_step_leaves_a_repository_the_next_prune_finishes() {
    let t = tempfile::tempdir().unwrap();
    let (src, base) = (t.path().join("src"), t.path().join("base"));
    std::fs::create_dir_all(&src).unwrap();
    init(&base);
    // Five runs; each rewrites four of twenty 150 kB files, so packs end up
    // partly used.
    let mut seeds: Vec<u64> = (0..20).collect();
    for (f, seed) in seeds.iter().enumerate() {
        std::fs::write(src.join(format!("f{f:02}")), noise(150_000, *seed)).unwrap();
    }
    for run in 0..5u64 {
        for k in 0..4usize {
            let f = (run as usize * 4 + k) % 20;
            seeds[f] = 100 + run * 10 + k as u64;
            std::fs::write(src.join(format!("f{f:02}")), noise(150_000, seeds[f])).unwrap();
        }
        ok(&base, &["backup", "-q", src.to_str().unwrap()]);
    }
    ok(&base, &["forget", "--keep-last", "3", "--prune"]);
    ok(&base, &["forget", "--keep-last", "1"]);
    // ("prune-restored" needs a marked pack used again by a snapshot no
    // writer re-indexed, a race this state cannot set up; that step is one
    // put of an index file listing packs that also stay marked.)
    let points = [
        "prune-deleting",
        "prune-deleted",
        "prune-repacked",
        "prune-unarmed",
        "prune-rewritten",
        "prune-armed",
        "prune-marked",
    ];
    let mut reached = 0;
    for point in points {
        let repo = t.path().join(point);
        copy_tree(&base, &repo);
        copy_tree(&base.with_extension("cache"), &repo.with_extension("cache"));
        let gate = t.path().join(format!("{point}-gate"));
        let mut c = capsule_cmd(&TestEnv::beside(&repo).password(PASSWORD));
        c.arg("--repo")
            .arg(&repo)
            .args(["prune", "--max-unused", "0"])
            .env("CAPSULE_TEST_PAUSE", format!("{point}:{}", gate.display()))
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null());
        let mut child = c.spawn().unwrap();
        let waiting = gate.with_extension("waiting");
        let mut paused = false;
        for _ in 0..1200 {
            if waiting.exists() {
                paused = true;
                break;
            }
            if child.try_wait().unwrap().is_some() {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(25));
        }
        let _ = child.kill();
        let _ = child.wait();
        if paused {
            reached += 1;
        }
        // The next prunes finish what it started.
        for _ in 0..3 {
            ok(&repo, &["prune"]);
        }
        ok(&repo, &["check", "--read-data"]);
        let target = t.path().join(format!("{point}.restored"));
        ok(
            &repo,
            &["restore", "latest", "--target", target.to_str().unwrap()],
        );
        let dir = restored(&target, &src);
        for (f, seed) in seeds.iter().enumerate() {
            assert_eq!(
                std::fs::read(dir.join(format!("f{f:02}"))).unwrap(),
                noise(150_000, *seed),
                "{point}: f{f:02}"
            );
        }
        let left = json(&repo, &["prune", "--dry-run"]);
        assert_eq!(left["prune"]["packs_marked"], 0, "{point}: {left}");
        assert_eq!(left["prune"]["marks_waiting"], 0, "{point}: {left}");
    }
    // Every step was reached (a renamed step would otherwise go untested).
    assert_eq!(reached, points.len());
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

/// Thinning to a quota frees what its dry run said it would, within 1%:
/// the plan counts each snapshot's unique bytes, the disk is the judge.
#[test]
fn thinning_frees_what_its_dry_run_says_within_one_percent() {
    let t = tempfile::tempdir().unwrap();
    let (src, repo) = (t.path().join("src"), t.path().join("repo"));
    std::fs::create_dir_all(&src).unwrap();
    init(&repo);
    // Shared data in every snapshot, and each snapshot's own file of a
    // different size; one file lives in two snapshots.
    std::fs::write(src.join("shared"), noise(1_500_000, 1)).unwrap();
    for i in 0..6u64 {
        if i % 2 == 0 {
            let _ = std::fs::remove_file(src.join(format!("own{}", i.wrapping_sub(2))));
        }
        std::fs::write(
            src.join(format!("own{i}")),
            noise(1_000_000 + 300_000 * i as usize, 10 + i),
        )
        .unwrap();
        ok_at(
            &repo,
            NOW - 10 * D + i as i64 * D,
            &["backup", "-q", src.to_str().unwrap()],
        );
    }
    let before = dir_bytes(&pack_files(&repo));
    ok_at(&repo, NOW, &["quota", "set", "9M", "--min-age", "1h"]);
    let dry = json(&repo, &["quota", "enforce", "--dry-run"]);
    let remove = dry["plan"]["remove"].as_array().unwrap();
    assert!(remove.len() >= 2, "{dry}");
    let predicted = remove.last().unwrap()["frees_with_older"].as_u64().unwrap();
    let done = json(&repo, &["quota", "enforce"]);
    assert_eq!(
        done["thin"]["plan"]["remove"].as_array().unwrap().len(),
        remove.len()
    );
    let after = dir_bytes(&pack_files(&repo));
    assert_eq!(after, done["thin"]["stored_after"].as_u64().unwrap());
    let freed = before - after;
    let error = (freed as f64 - predicted as f64).abs() / freed as f64;
    eprintln!("thinning: predicted {predicted} bytes freed, {freed} freed");
    assert!(
        error <= 0.01,
        "predicted {predicted}, freed {freed} ({:.2}%)",
        error * 100.0
    );
    assert!(after <= 9 << 20, "{after}");
    ok(&repo, &["check", "--read-data"]);
}

/// Over the quota with no snapshot left to remove: the space is held by a
/// snapshot forgotten without a prune. The next backup prunes it away
/// instead of staying over (the simulated year's finding).
#[test]
fn a_backup_over_its_quota_with_nothing_to_remove_prunes_what_no_snapshot_uses() {
    let t = tempfile::tempdir().unwrap();
    let (src, repo) = (t.path().join("src"), t.path().join("repo"));
    std::fs::create_dir_all(&src).unwrap();
    init(&repo);
    std::fs::write(src.join("a"), noise(2_000_000, 1)).unwrap();
    ok_at(&repo, NOW - 3 * D, &["backup", "-q", src.to_str().unwrap()]);
    std::fs::remove_file(src.join("a")).unwrap();
    std::fs::write(src.join("b"), noise(2_000_000, 2)).unwrap();
    ok_at(&repo, NOW - 2 * D, &["backup", "-q", src.to_str().unwrap()]);
    ok_at(&repo, NOW - D, &["forget", "-q", "--keep-last", "1"]);
    let before = dir_bytes(&pack_files(&repo));
    assert!(before > 3_900_000, "both files stored: {before}");
    ok_at(&repo, NOW - D, &["quota", "set", "3M", "--min-age", "1h"]);

    let out = at(&repo, NOW, &["--json", "backup", src.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let thinned = v["thinned"].as_array().unwrap();
    assert!(!thinned.is_empty(), "a prune ran: {v}");
    assert!(thinned[0]["plan"]["remove"].as_array().unwrap().is_empty());
    let after = dir_bytes(&pack_files(&repo));
    assert!(
        after <= 3 << 20,
        "{after} bytes of packs over a 3 MiB quota"
    );
    assert_eq!(snapshot_times(&repo, false).len(), 2);
    ok(&repo, &["check", "--read-data"]);
}

/// 30.7: a prune while a backup holds its session marks what is unused
/// and names the session its mark waits for (no sweep yet); `prune --wait`
/// waits for that backup to finish, then deletes the packs.
#[test]
fn a_prune_names_the_sessions_it_waits_for_and_wait_sweeps_after_them() {
    let t = tempfile::tempdir().unwrap();
    let (src, other, repo) = (
        t.path().join("src"),
        t.path().join("other"),
        t.path().join("repo"),
    );
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
