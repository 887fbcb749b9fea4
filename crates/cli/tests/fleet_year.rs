//! A household's month on the distributed store, with fifty faults: the
//! short version of `bench/fleet-year.sh` (a year of 8 hosts with 1,000
//! faults). Three hosts (a desktop always on, two laptops that sleep) back
//! up through their profiles into one repository on the 4-node MinIO
//! cluster `scripts/servers.sh` started, under the test clock, for a
//! simulated month, while a seeded schedule kills clients, prunes, checks
//! and forgets, kills store nodes and cuts their links, wipes a drive,
//! fills a cache disk, jumps a clock, starts two runs of one host at once
//! and replaces a machine.
//!
//! `bench/fleet_year.py` makes every check outside capsule's code (hash
//! manifests of the source at each run, restores compared byte for byte,
//! the kept set against the Time Machine schedule, `check --read-data`,
//! the store's own listing) and exits 1 on any failure; this test runs it
//! and reads its outputs. No check depends on timing: a fault that landed
//! after its run ended is counted as such, not asserted on.

#![cfg(target_os = "linux")]
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::process::Command;

use capsule_testkit::server_env as env;

#[test]
fn a_household_month_with_fifty_faults_loses_nothing() {
    let Some(_) = env("CAPSULE_TEST_CLUSTER") else {
        return;
    };
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let out = tempfile::tempdir().unwrap();
    let o = Command::new("python3")
        .arg(root.join("bench/fleet_year.py"))
        .args(["--capsule", env!("CARGO_BIN_EXE_capsule")])
        .arg("--out")
        .arg(out.path())
        .args([
            "--days",
            "30",
            "--hosts",
            "3",
            "--faults",
            "50",
            "--hourly-days",
            "1",
            "--sampled-days",
            "14",
        ])
        .args([
            "--read-data-points",
            "1",
            "--max-outage",
            "10",
            "--sample",
            "0.1",
        ])
        .args(["--seed", "7"])
        .env("CLUSTER_CTL", root.join("scripts/cluster.sh"))
        .output()
        .expect("python3 runs bench/fleet_year.py");
    let said = format!(
        "{}\n{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(o.status.success(), "the month failed a check:\n{said}");
    let summary = std::fs::read_to_string(out.path().join("summary.md")).unwrap();
    assert!(summary.contains("| lost | **0**"), "{summary}");
    assert!(
        summary.contains("| exit 0 with less than the source | **0** |"),
        "{summary}"
    );
    assert!(summary.contains("| problems | 0 |"), "{summary}");
    // Fifty faults, every kind among them, each listed with what it did.
    let faults = std::fs::read_to_string(out.path().join("faults.csv")).unwrap();
    let rows: Vec<&str> = faults.lines().skip(1).collect();
    assert_eq!(rows.len(), 50, "{faults}");
    for kind in [
        "kill-backup",
        "two-at-once",
        "cache-full",
        "clock-jump",
        "kill-prune",
        "kill-check",
        "kill-forget",
        "node-kill",
        "link-down",
        "node-kill-prune",
        "drive-wipe",
        "replaced",
    ] {
        assert!(
            rows.iter().any(|r| r.split(',').nth(2) == Some(kind)),
            "no {kind} fault in the month:\n{faults}"
        );
    }
    // Every run is in the CSV, and most backups succeeded (the rest were
    // killed, busy, or waited out a store outage).
    let runs = std::fs::read_to_string(out.path().join("runs.csv")).unwrap();
    let backups: Vec<&str> = runs.lines().filter(|l| l.contains(",backup,")).collect();
    let ok = backups
        .iter()
        .filter(|l| l.split(',').nth(4) == Some("0"))
        .count();
    assert!(
        backups.len() > 60 && ok * 2 > backups.len(),
        "{ok} of {} backups succeeded:\n{said}",
        backups.len()
    );
    assert!(out.path().join("fleet-year.svg").exists());
}
