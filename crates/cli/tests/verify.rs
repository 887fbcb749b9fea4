//! Verifying a repository in slices (issue 62): a fixed slice, and a
//! rotation recorded in the repository that any machine carries on.

// The command-line suite runs on Linux, against real servers, btrfs,
// fanotify and network namespaces; the macOS build checks the libraries.
#![cfg(target_os = "linux")]
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::Path;

use common::*;

/// A repository of small packs (4 MiB) holding `files` random megabytes.
fn backed_up(dir: &Path, files: u64, seed: u64) -> std::path::PathBuf {
    let (src, repo) = (dir.join("src"), dir.join("repo"));
    std::fs::create_dir_all(&src).unwrap();
    for i in 0..files {
        std::fs::write(src.join(format!("f{i}")), noise(1_000_000, seed + i)).unwrap();
    }
    ok(&repo, &["init", "--pack-size-mib", "4"]);
    ok(&repo, &["backup", src.to_str().unwrap()]);
    repo
}

#[test]
fn a_verify_in_slices_reads_every_pack_once_and_finds_damage_in_its_slice() {
    let t = tempfile::tempdir().unwrap();
    let repo = backed_up(t.path(), 30, 500);
    let all = json(&repo, &["check", "--read-data"]);
    let packs = all["report"]["packs_read"].as_u64().unwrap();
    assert!(packs >= 6, "{all}");
    // Damage one data pack, in its middle.
    let victim = pack_files(&repo)
        .into_iter()
        .find(|p| p.starts_with(repo.join("data")))
        .unwrap();
    let mut bytes = std::fs::read(&victim).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0xff;
    std::fs::write(&victim, bytes).unwrap();
    let (mut read, mut found) = (0, 0);
    for n in 1..=4 {
        let o = capsule(
            &repo,
            &["--json", "check", "--read-data-subset", &format!("{n}/4")],
        );
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        read += v["report"]["packs_read"].as_u64().unwrap();
        assert_eq!(v["report"]["subset"], format!("{n}/4"));
        if v["ok"] == false {
            found += 1;
            assert_eq!(o.status.code(), Some(12), "{}", said(&o));
        }
    }
    assert_eq!(read, packs, "the four slices read every pack once");
    assert_eq!(found, 1, "the damage is in exactly one slice");
    let v = capsule(&repo, &["--json", "check", "--read-data-subset", "100%"]);
    assert_eq!(v.status.code(), Some(12), "{}", said(&v));
    let o = capsule(&repo, &["check", "--read-data-subset", "0/4"]);
    assert_eq!(o.status.code(), Some(2), "{}", said(&o));
}

#[test]
fn a_rotation_of_slices_carries_on_from_another_machine_and_reads_every_pack_once() {
    let t = tempfile::tempdir().unwrap();
    let repo = backed_up(t.path(), 24, 900);
    let packs = json(&repo, &["check", "--read-data"])["report"]["packs_read"]
        .as_u64()
        .unwrap();
    // Machine one verifies two slices of three; machine two (its own cache
    // and state, as a replacement would have) takes the third.
    let other = t.path().join("other");
    let on = |machine: &Path, args: &[&str]| {
        let (cache, state) = (machine.join("cache"), machine.join("state"));
        let o = capsule_env(
            &repo,
            args,
            &[
                ("CAPSULE_PASSWORD", common::PASSWORD),
                ("CAPSULE_CACHE_DIR", cache.to_str().unwrap()),
                ("CAPSULE_STATE_DIR", state.to_str().unwrap()),
            ],
        );
        assert_eq!(o.status.code(), Some(0), "{}", said(&o));
        serde_json::from_slice::<serde_json::Value>(&o.stdout).unwrap()
    };
    let first = t.path().join("first");
    let mut slices = Vec::new();
    let mut read = 0;
    for machine in [&first, &first, &other] {
        let v = on(
            machine,
            &["--json", "check", "--read-data-subset", "next/3"],
        );
        read += v["report"]["packs_read"].as_u64().unwrap();
        slices.push(v["report"]["subset"].as_str().unwrap().to_string());
        assert_eq!(
            v["report"]["slices"].as_array().unwrap().len(),
            slices.len(),
            "the repository records each slice verified: {v}"
        );
    }
    assert_eq!(slices, ["1/3", "2/3", "3/3"], "the replacement carried on");
    assert_eq!(read, packs, "three slices read every pack once");
    // The fourth run starts the cycle again with the slice verified
    // longest ago; one record per slice stays in the repository.
    let v = on(&first, &["--json", "check", "--read-data-subset", "next/3"]);
    assert_eq!(v["report"]["subset"], "1/3", "{v}");
    let records = std::fs::read_dir(repo.join("verified")).unwrap().count();
    assert_eq!(records, 3);
}
