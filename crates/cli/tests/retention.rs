//! Retention with the real binary: backups made at simulated times (the
//! test clock, `CAPSULE_TEST_NOW`), `forget` by policy and by ID, and
//! `unforget`. The kept set is checked against one computed here from the
//! times alone, not by capsule's code.

// The command-line suite runs on Linux, against real servers, btrfs,
// fanotify and network namespaces; the macOS build checks the libraries.
#![cfg(target_os = "linux")]
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod common;

use std::collections::BTreeSet;
use std::path::Path;

use common::*;

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
    // Each backup ran at a whole minute of the test clock, which goes on
    // from there: on a busy machine a run can start its snapshot a second
    // or more later, so a snapshot is named by its minute.
    let kept: BTreeSet<i64> = snapshot_times(&repo, false)
        .into_iter()
        .map(|(_, t)| t - t.rem_euclid(60))
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
