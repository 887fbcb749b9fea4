//! `capsule copy`: snapshots into a second repository, sending only what it
//! lacks; resumable when killed, idempotent when run again; with shared
//! chunker parameters or re-chunked; into S3.

// The command-line suite runs on Linux, against real servers, btrfs,
// fanotify and network namespaces; the macOS build checks the libraries.
#![cfg(target_os = "linux")]
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::Path;

use capsule_testkit::server_env as env;
use common::said;
use common::{capsule_env, json, noise, ok, PASSWORD};

/// Three backups of a changing tree into `src`; returns the source dir.
fn three_backups(work: &Path, src_repo: &Path) -> std::path::PathBuf {
    let src = work.join("files");
    std::fs::create_dir_all(src.join("sub")).unwrap();
    ok(src_repo, &["init"]);
    for round in 0..3u64 {
        std::fs::write(src.join(format!("new-{round}")), noise(3_000_000, round)).unwrap();
        std::fs::write(src.join("sub/changing"), noise(2_000_000, 50 + round)).unwrap();
        ok(src_repo, &["backup", src.to_str().unwrap()]);
    }
    src
}

/// Every file below `d` (none when it does not exist).
fn walk(d: &Path) -> Vec<std::path::PathBuf> {
    let Ok(rd) = std::fs::read_dir(d) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for e in rd.flatten() {
        if e.path().is_dir() {
            out.extend(walk(&e.path()));
        } else {
            out.push(e.path());
        }
    }
    out
}

fn snapshot_ids(repo: &Path) -> Vec<(String, String)> {
    json(repo, &["snapshots"])
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            (
                s["id"].as_str().unwrap().to_string(),
                s["snapshot"]["time"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

/// Every snapshot of `dst` restores to what the same-timed snapshot of
/// `src` restores to.
fn same_snapshots(work: &Path, src: &Path, dst: &Path) {
    let (a, b) = (snapshot_ids(src), snapshot_ids(dst));
    assert_eq!(a.len(), b.len(), "{a:?} against {b:?}");
    for ((ida, ta), (idb, tb)) in a.iter().zip(&b) {
        assert_eq!(ta, tb);
        let (ra, rb) = (
            work.join(format!("ra-{ida}")),
            work.join(format!("rb-{idb}")),
        );
        ok(src, &["restore", ida, "--target", ra.to_str().unwrap()]);
        ok(dst, &["restore", idb, "--target", rb.to_str().unwrap()]);
        common::assert_same_tree(&ra, &rb, false);
    }
}

/// With shared chunker parameters: blobs go as they are, a second copy
/// sends nothing, and a copy killed midway finishes on the next run.
#[test]
fn a_copy_sends_only_what_is_missing_and_resumes_after_a_kill() {
    let work = tempfile::tempdir().unwrap();
    let work = work.path();
    let (a, b) = (work.join("nas"), work.join("offsite"));
    three_backups(work, &a);
    // Killed at every third request until a run completes: every cut run
    // is finished by the next one, whole. (Whether packs that landed are
    // taken up depends on where a cut falls between threads; the count is
    // printed, and the exact case is the pause below.)
    let landed = |d: &Path| {
        walk(d)
            .iter()
            .filter(|p| {
                !p.file_name()
                    .unwrap()
                    .to_string_lossy()
                    .starts_with(".tmp-")
            })
            .count()
    };
    let mut resumed = 0;
    let mut completed = false;
    for n in (8..200).step_by(3) {
        let _ = std::fs::remove_dir_all(&b);
        let out = ok(
            &b,
            &[
                "init",
                "--pack-size-mib",
                "4",
                "--copy-chunker-params-from",
                a.to_str().unwrap(),
            ],
        );
        assert!(out.contains("cuts files and names blobs as"), "{out}");
        let o = capsule_env(
            &a,
            &["copy", "--to", b.to_str().unwrap()],
            &[
                ("CAPSULE_PASSWORD", PASSWORD),
                ("CAPSULE_TEST_KILL_AT_CALL", &n.to_string()),
            ],
        );
        if o.status.success() {
            completed = true;
            break;
        }
        let packs = landed(&b.join("data"));
        let v = json(&a, &["copy", "--to", b.to_str().unwrap()]);
        assert_eq!(v["rechunked"], false, "{v}");
        let copied = v["copied"].as_array().unwrap().len() as u64;
        assert_eq!(
            copied + v["already_there"].as_u64().unwrap(),
            3,
            "cut at {n}: {v}"
        );
        if packs > 0 && v["blobs_present"].as_u64().unwrap() > 0 {
            resumed += 1;
        }
        ok(&b, &["check", "--read-data"]);
    }
    eprintln!("{resumed} cut runs had packs the next run took up");
    assert!(completed, "no run went through");

    // Killed at a known moment: everything sent and indexed, no snapshot
    // written yet. The next run sends nothing and writes the snapshots.
    let _ = std::fs::remove_dir_all(&b);
    ok(
        &b,
        &["init", "--copy-chunker-params-from", a.to_str().unwrap()],
    );
    let gate = work.join("gate");
    let mut child = common::capsule_cmd(&common::TestEnv::beside(&a))
        .arg("--repo")
        .arg(&a)
        .args(["copy", "--to", b.to_str().unwrap()])
        .env("CAPSULE_PASSWORD", PASSWORD)
        .env(
            "CAPSULE_TEST_PAUSE",
            format!("copy-sent:{}", gate.display()),
        )
        .spawn()
        .unwrap();
    let waiting = gate.with_extension("waiting");
    for _ in 0..1200 {
        if waiting.exists() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    assert!(waiting.exists(), "the copy never reached its pause");
    child.kill().unwrap();
    child.wait().unwrap();
    assert_eq!(landed(&b.join("snapshots")), 0);
    let v = json(&a, &["copy", "--to", b.to_str().unwrap()]);
    assert_eq!(v["copied"].as_array().unwrap().len(), 3, "{v}");
    assert_eq!(v["blobs_sent"], 0, "{v}");
    assert!(v["blobs_present"].as_u64().unwrap() > 0, "{v}");
    ok(&b, &["check", "--read-data"]);
    same_snapshots(work, &a, &b);

    // Again: nothing new, nothing sent.
    let v = json(&a, &["copy", "--to", b.to_str().unwrap()]);
    assert_eq!(v["copied"].as_array().unwrap().len(), 0, "{v}");
    assert_eq!(v["already_there"], 3, "{v}");
    assert_eq!(v["blobs_sent"], 0, "{v}");
    assert_eq!(v["bytes_stored"], 0, "{v}");

    // The destination's own backup of the same files dedups against the
    // copies: the keyed IDs are the same.
    let src = work.join("files");
    let v = json(&b, &["backup", src.to_str().unwrap()]);
    assert_eq!(v["storage"]["blobs_added"], 0, "{v}");
}

/// Without shared parameters the copy says it re-chunks, and what that
/// reads; every snapshot still restores the same. A policy picks which.
#[test]
fn a_copy_between_unrelated_repositories_rechunks_and_says_so() {
    let work = tempfile::tempdir().unwrap();
    let work = work.path();
    let (a, b) = (work.join("nas"), work.join("other"));
    three_backups(work, &a);
    ok(&b, &["init"]);
    let o = capsule_env(
        &a,
        &["copy", "--to", b.to_str().unwrap(), "--keep-last", "2"],
        &[("CAPSULE_PASSWORD", PASSWORD)],
    );
    assert!(o.status.success(), "{}", said(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("cuts files differently") && err.contains("to read"),
        "{err}"
    );
    assert!(String::from_utf8_lossy(&o.stdout).contains("copied 2 of 2 snapshots"));
    ok(&b, &["check", "--read-data"]);
    let (sa, sb) = (snapshot_ids(&a), snapshot_ids(&b));
    assert_eq!(sb.len(), 2);
    assert_eq!(
        sa[1..].iter().map(|s| &s.1).collect::<Vec<_>>(),
        sb.iter().map(|s| &s.1).collect::<Vec<_>>()
    );
    // The rest, then all again: idempotent.
    let v = json(&a, &["copy", "--to", b.to_str().unwrap()]);
    assert_eq!(v["copied"].as_array().unwrap().len(), 1, "{v}");
    assert_eq!(v["rechunked"], true, "{v}");
    same_snapshots(work, &a, &b);

    // A repository into itself is a mistake.
    let o = capsule_env(
        &a,
        &["copy", "--to", a.to_str().unwrap()],
        &[("CAPSULE_PASSWORD", PASSWORD)],
    );
    assert_eq!(o.status.code(), Some(2), "{}", said(&o));
}

/// From a local repository into S3 (the test MinIO), with its own
/// password, and back out byte for byte.
#[test]
fn a_copy_goes_to_s3_under_the_destinations_own_password() {
    let (Some(url), Some(key), Some(secret)) = (
        env("CAPSULE_TEST_S3"),
        env("CAPSULE_TEST_S3_KEY"),
        env("CAPSULE_TEST_S3_SECRET"),
    ) else {
        return;
    };
    let work = tempfile::tempdir().unwrap();
    let work = work.path();
    let a = work.join("nas");
    let src = three_backups(work, &a);
    // And a folder of small files: a chunk each, many to a pack.
    std::fs::create_dir_all(src.join("many")).unwrap();
    for i in 0..600u64 {
        std::fs::write(src.join(format!("many/{i}.txt")), noise(3000, 7000 + i)).unwrap();
    }
    ok(&a, &["backup", src.to_str().unwrap()]);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    let dest = format!("{url}/copy-{}-{nanos}", std::process::id());
    let s3 = [
        ("AWS_ACCESS_KEY_ID", key.as_str()),
        ("AWS_SECRET_ACCESS_KEY", secret.as_str()),
    ];
    let with = |pw: &'static str, extra: &[(&'static str, &'static str)]| {
        let mut v: Vec<(&str, &str)> = s3.to_vec();
        v.push(("CAPSULE_PASSWORD", pw));
        v.extend_from_slice(extra);
        v
    };
    // The S3 repository's cache and run records in the scratch directory.
    let cache = work.join("s3-cache");
    let at = |repo: &str, args: &[&str], env: &[(&str, &str)]| {
        let mut c = common::capsule_cmd(
            &common::TestEnv::bare()
                .cache(&cache)
                .state(cache.join("state")),
        );
        c.arg("--repo").arg(repo).args(args);
        for (k, v) in env {
            c.env(k, v);
        }
        c.output().unwrap()
    };
    let o = at(
        &dest,
        &["init", "--copy-chunker-params-from", a.to_str().unwrap()],
        &with("offsite secret", &[("CAPSULE_FROM_PASSWORD", PASSWORD)]),
    );
    assert!(o.status.success(), "{}", said(&o));
    let o = at(
        a.to_str().unwrap(),
        &["--json", "copy", "--to", &dest],
        &with(PASSWORD, &[("CAPSULE_TO_PASSWORD", "offsite secret")]),
    );
    assert!(o.status.success(), "{}", said(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["copied"].as_array().unwrap().len(), 4, "{v}");
    // The source's password does not open the copy.
    let o = at(&dest, &["snapshots"], &with(PASSWORD, &[]));
    assert_eq!(o.status.code(), Some(10), "{}", said(&o));
    let o = at(
        &dest,
        &["check", "--read-data"],
        &with("offsite secret", &[]),
    );
    assert!(o.status.success(), "{}", said(&o));
    let target = work.join("from-s3");
    let o = at(
        &dest,
        &["restore", "latest", "--target", target.to_str().unwrap()],
        &with("offsite secret", &[]),
    );
    assert!(o.status.success(), "{}", said(&o));
    common::assert_same_tree(&src, &common::restored(&target, &src), false);

    // Back out of S3 into a repository that cuts files its own way: every
    // file re-chunked, its bytes fetched in ranged reads of many blobs at
    // once, not a request per blob.
    let back = work.join("back");
    ok(&back, &["init"]);
    let o = at(
        &dest,
        &["--json", "copy", "--to", back.to_str().unwrap()],
        &with("offsite secret", &[("CAPSULE_TO_PASSWORD", PASSWORD)]),
    );
    assert!(o.status.success(), "{}", said(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["rechunked"], true, "{v}");
    let (sent, gets) = (
        v["blobs_sent"].as_u64().unwrap(),
        v["source"]["gets"].as_u64().unwrap(),
    );
    assert!(sent > 600, "{v}");
    assert!(
        gets * 5 < sent,
        "{gets} requests to S3 for {sent} blobs: the copy read blob by blob"
    );
    let target = work.join("from-back");
    ok(
        &back,
        &["restore", "latest", "--target", target.to_str().unwrap()],
    );
    common::assert_same_tree(&src, &common::restored(&target, &src), false);
}
