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
fn forget_refuses_unknown_ids_empty_policies_and_missing_rules_before_removing_anything() {
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

    // By ID (a prefix), then the rest with --allow-empty.
    ok_at(&repo, NOW, &["forget", &all[1].0[..10]]);
    assert_eq!(snapshot_times(&repo, false).len(), 2);
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
/// place of today's real one.
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
}
