//! End-to-end tests of the `capsule` binary on real files with real metadata.

// The command-line suite runs on Linux, against real servers, btrfs,
// fanotify and network namespaces; the macOS build checks the libraries.
#![cfg(target_os = "linux")]
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::Duration;

use common::*;

/// Everything in the fidelity list survives backup and restore exactly:
/// content, kinds, modes, owners, nanosecond times, xattrs, hard links,
/// holes, FIFOs, non-UTF-8 names, a 4,000-byte path, 100,000 entries.
#[test]
fn torture_tree_roundtrip() {
    let t = tempfile::tempdir().unwrap();
    let (src, repo, target) = (
        t.path().join("src"),
        t.path().join("repo"),
        t.path().join("target"),
    );
    torture_tree(&src, 100_000);
    init(&repo);
    let report = json(&repo, &["backup", src.to_str().unwrap()]);
    assert_eq!(report["warnings"].as_array().unwrap().len(), 0, "{report}");
    assert!(report["summary"]["files"].as_u64().unwrap() > 100_000);
    ok(
        &repo,
        &["restore", "latest", "--target", target.to_str().unwrap()],
    );
    assert_same_tree(&src, &restored(&target, &src), true);
    // Holes stay holes.
    let holey = restored(&target, &src).join("sparse/holey");
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(&holey).unwrap();
    assert!(
        m.blocks() * 512 < 2 << 20,
        "sparse file restored with {} bytes allocated",
        m.blocks() * 512
    );
    // The repository is intact.
    ok(&repo, &["check", "--read-data"]);
}

/// What a snapshot records of the directories above `p` (their times):
/// a run that sees them changed adds their trees again, by design.
fn ancestor_times(p: &Path) -> Vec<(i64, i64, i64, i64)> {
    use std::os::unix::fs::MetadataExt;
    p.ancestors()
        .skip(1)
        .map(|a| {
            let m = std::fs::metadata(a).unwrap();
            (m.mtime(), m.mtime_nsec(), m.ctime(), m.ctime_nsec())
        })
        .collect()
}

/// Runs `backup <args>` until a run and the run before it saw the source's
/// ancestors unchanged from the start of the one to the end of the other
/// (a checkout under /tmp has /tmp among them, which the tests running
/// beside this one change all the time), at most six runs. Every run must
/// pass `check_each`; the quiet one, if any, is returned with the object
/// count before it.
fn quiet_rerun(
    repo: &Path,
    src: &Path,
    args: &[&str],
    check_each: impl Fn(&serde_json::Value),
) -> Option<(serde_json::Value, usize)> {
    let mut prev_start: Option<Vec<_>> = None;
    for _ in 0..6 {
        let start = ancestor_times(src);
        let objects = files_under(repo).len();
        let run = json(repo, args);
        check_each(&run);
        let end = ancestor_times(src);
        if prev_start.as_ref() == Some(&end) {
            return Some((run, objects));
        }
        // Only the directories above the source may have changed.
        assert!(
            run["summary"]["blobs_added"].as_u64().unwrap() <= end.len() as u64,
            "more new blobs than ancestors: {run}"
        );
        prev_start = Some(start);
    }
    eprintln!("the source's ancestors changed during six runs; only bounds were checked");
    None
}

/// A second run over an unchanged tree reads no file and adds no blob:
/// only the snapshot object is new.
#[test]
fn no_change_backup_reads_nothing() {
    let t = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let (src, repo) = (t.path().join("src"), t.path().join("repo"));
    torture_tree(&src, 1000);
    // Let ctimes settle: entries changed within a second of a backup are
    // re-read next time by design.
    std::thread::sleep(Duration::from_millis(2100));
    init(&repo);
    let first = json(&repo, &["backup", src.to_str().unwrap()]);
    let reads_nothing = |run: &serde_json::Value| {
        assert_eq!(run["summary"]["bytes_read"], 0, "{run}");
        assert_eq!(run["summary"]["files_read"], 0, "{run}");
        assert_eq!(run["files_unchanged"], first["summary"]["files"], "{run}");
    };
    let second = json(&repo, &["backup", src.to_str().unwrap()]);
    assert_eq!(second["parent"], first["snapshot_id"]);
    reads_nothing(&second);
    if let Some((quiet, objects_before)) = quiet_rerun(
        &repo,
        &src,
        &["backup", src.to_str().unwrap()],
        reads_nothing,
    ) {
        assert_eq!(quiet["summary"]["blobs_added"], 0, "{quiet}");
        assert_eq!(
            files_under(&repo).len(),
            objects_before + 1,
            "only the snapshot is new"
        );
    }

    // One changed file is read, and only it.
    std::fs::write(src.join("small.txt"), b"changed!!!!!!\n").unwrap();
    let third = json(&repo, &["backup", src.to_str().unwrap()]);
    assert_eq!(third["summary"]["files_read"], 1, "{third}");
    assert_eq!(third["files_changed"], 1);
    let d = ok(
        &repo,
        &[
            "diff",
            &second["snapshot_id"].as_str().unwrap()[..12],
            "latest",
        ],
    );
    assert!(d.contains("M  ") && d.contains("small.txt"), "{d}");

    // --force reads everything again, and still adds nothing new.
    let forced = quiet_rerun(
        &repo,
        &src,
        &["backup", "--force", src.to_str().unwrap()],
        |run| assert_eq!(run["files_unchanged"], 0, "{run}"),
    );
    if let Some((forced, _)) = forced {
        assert_eq!(forced["summary"]["blobs_added"], 0, "{forced}");
    }
}

#[test]
fn wrong_or_missing_password_writes_nothing() {
    let t = tempfile::tempdir().unwrap();
    let (src, repo) = (t.path().join("src"), t.path().join("repo"));
    std::fs::create_dir(&src).unwrap();
    std::fs::write(src.join("f"), b"x").unwrap();
    init(&repo);
    let before = files_under(&repo);
    let o = capsule_env(
        &repo,
        &["backup", src.to_str().unwrap()],
        &[("CAPSULE_PASSWORD", "nope")],
    );
    assert_eq!(o.status.code(), Some(10));
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(
        err.lines().next().unwrap(),
        format!(
            "capsule: wrong password: no key in {} opens with it",
            repo.display()
        )
    );
    let o = capsule_env(&repo, &["snapshots"], &[]);
    assert_eq!(
        o.status.code(),
        Some(10),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(String::from_utf8_lossy(&o.stderr).contains("CAPSULE_PASSWORD"));
    assert_eq!(files_under(&repo), before);
    // No directory there: the destination is away (an unplugged disk),
    // exit 14; a directory that holds no repository: exit 11.
    let o = capsule(&t.path().join("nothing"), &["snapshots"]);
    assert_eq!(o.status.code(), Some(14));
    std::fs::create_dir(t.path().join("empty")).unwrap();
    let o = capsule(&t.path().join("empty"), &["snapshots"]);
    assert_eq!(o.status.code(), Some(11));
}

/// Unreadable files become warnings; the snapshot is committed for the rest
/// and the exit code says "incomplete".
#[test]
fn unreadable_file_gives_incomplete_snapshot() {
    let t = tempfile::tempdir().unwrap();
    std::fs::set_permissions(t.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let (src, repo) = (t.path().join("src"), t.path().join("repo"));
    std::fs::create_dir(&src).unwrap();
    std::fs::write(src.join("readable"), b"fine").unwrap();
    std::fs::write(src.join("secret"), b"no").unwrap();
    std::fs::set_permissions(src.join("secret"), std::fs::Permissions::from_mode(0o000)).unwrap();
    // 150 of them: the JSON document repeats the first 100 warnings and
    // counts the rest (the report's own `warnings` has them all).
    for i in 1..150 {
        let p = src.join(format!("secret{i}"));
        std::fs::write(&p, b"no").unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o000)).unwrap();
    }
    init(&repo);
    // Run as an unprivileged user when we are root, so permissions apply.
    let o = if is_root() {
        std::process::Command::new("chown")
            .args(["-R", "65534:65534"])
            .arg(&repo)
            .status()
            .unwrap();
        std::process::Command::new("setpriv")
            .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
            .arg(env!("CARGO_BIN_EXE_capsule"))
            .args([
                "--repo",
                repo.to_str().unwrap(),
                "--json",
                "backup",
                src.to_str().unwrap(),
            ])
            .env("CAPSULE_PASSWORD", PASSWORD)
            .env("HOME", t.path())
            .output()
            .unwrap()
    } else {
        capsule(&repo, &["--json", "backup", src.to_str().unwrap()])
    };
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(3), "{err}");
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["warnings"].as_array().unwrap().len(), 150, "{v}");
    assert_eq!(v["notices"].as_array().unwrap().len(), 100);
    assert!(v["notices_omitted"].as_u64().unwrap() >= 50, "{v}");
    assert!(
        err.contains("secret") && err.contains("Permission denied"),
        "{err}"
    );
    assert!(err.contains("incomplete"), "{err}");
    let snaps = json(&repo, &["snapshots"]);
    assert_eq!(snaps[0]["snapshot"]["incomplete"], true);
    let target = t.path().join("target");
    ok(
        &repo,
        &["restore", "latest", "-t", target.to_str().unwrap()],
    );
    assert_eq!(
        std::fs::read(restored(&target, &src).join("readable")).unwrap(),
        b"fine"
    );
    assert!(!restored(&target, &src).join("secret").exists());
}

/// A file that grows while it is read is flagged, and everything else is kept.
#[test]
fn file_changing_during_backup_is_flagged() {
    let t = tempfile::tempdir().unwrap();
    let (src, repo) = (t.path().join("src"), t.path().join("repo"));
    std::fs::create_dir(&src).unwrap();
    std::fs::write(src.join("stable"), b"stable").unwrap();
    let growing = src.join("growing.log");
    std::fs::write(&growing, noise(64 << 20, 3)).unwrap();
    init(&repo);
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let s2 = stop.clone();
    let g2 = growing.clone();
    let writer = std::thread::spawn(move || {
        use std::io::Write;
        let mut f = std::fs::OpenOptions::new().append(true).open(&g2).unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        while !s2.load(std::sync::atomic::Ordering::Relaxed) && std::time::Instant::now() < deadline
        {
            f.write_all(&[b'x'; 4096]).unwrap();
            std::thread::sleep(Duration::from_micros(200));
        }
    });
    let o = capsule(&repo, &["backup", src.to_str().unwrap()]);
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    writer.join().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(3), "{err}");
    assert!(
        err.contains("growing.log") && err.contains("changed while being read"),
        "{err}"
    );
    ok(&repo, &["check"]);
}

#[test]
fn excludes_ignore_files_and_restore_filters() {
    let t = tempfile::tempdir().unwrap();
    let (src, repo) = (t.path().join("src"), t.path().join("repo"));
    for p in [
        "keep/a.txt",
        "keep/b.tmp",
        "cache/big",
        "proj/target/out.o",
        "proj/src/main.rs",
        "proj/notes.md",
    ] {
        let p = src.join(p);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(&p, p.to_str().unwrap()).unwrap();
    }
    std::fs::write(
        src.join("proj/.capsuleignore"),
        "# build output\ntarget/\n*.md\n!keep.md\n",
    )
    .unwrap();
    init(&repo);
    let cache = format!("{}/cache", src.display());
    ok(
        &repo,
        &[
            "backup",
            src.to_str().unwrap(),
            "--exclude",
            "*.tmp",
            "--exclude",
            &cache,
        ],
    );
    let listing = ok(&repo, &["ls", "latest"]);
    assert!(
        listing.contains("keep/a.txt") && listing.contains("proj/src/main.rs"),
        "{listing}"
    );
    for gone in ["b.tmp", "cache", "target", "notes.md"] {
        assert!(
            !listing.contains(gone),
            "{gone} should be excluded:\n{listing}"
        );
    }
    assert!(listing.contains(".capsuleignore"));

    // Restore only part of it.
    let target = t.path().join("t1");
    let inc = format!("{}/proj", src.display());
    ok(
        &repo,
        &[
            "restore",
            "latest",
            "-t",
            target.to_str().unwrap(),
            "--include",
            &inc,
            "--exclude",
            "*.rs",
        ],
    );
    let got: Vec<String> = files_under(&target)
        .iter()
        .map(|p| p.strip_prefix(&target).unwrap().display().to_string())
        .collect();
    let want = vec![restored(Path::new(""), &src.join("proj/.capsuleignore"))
        .display()
        .to_string()];
    assert_eq!(got, want);
}

#[test]
fn keys_add_list_remove_passwd() {
    let t = tempfile::tempdir().unwrap();
    let repo = t.path().join("repo");
    init(&repo);
    let pwfile = t.path().join("pw2");
    std::fs::write(&pwfile, "second password\n").unwrap();
    ok(
        &repo,
        &[
            "key",
            "add",
            "--new-password-file",
            pwfile.to_str().unwrap(),
        ],
    );
    let keys = json(&repo, &["key", "list"]);
    assert_eq!(keys.as_array().unwrap().len(), 2);
    // The second password opens it, via a file.
    let o = capsule_env(
        &repo,
        &["--password-file", pwfile.to_str().unwrap(), "snapshots"],
        &[],
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    // Cannot remove the key in use.
    let current = keys
        .as_array()
        .unwrap()
        .iter()
        .find(|k| k["current"] == true)
        .unwrap()["id"]
        .as_str()
        .unwrap()
        .to_string();
    let other = keys
        .as_array()
        .unwrap()
        .iter()
        .find(|k| k["current"] == false)
        .unwrap()["id"]
        .as_str()
        .unwrap()
        .to_string();
    let o = capsule(&repo, &["key", "remove", &current[..8]]);
    assert!(!o.status.success());
    ok(&repo, &["key", "remove", &other[..8]]);
    let o = capsule_env(
        &repo,
        &["--password-file", pwfile.to_str().unwrap(), "snapshots"],
        &[],
    );
    assert_eq!(o.status.code(), Some(10));
    // Change the password: the old one stops working, the new one works.
    let pw3 = t.path().join("pw3");
    std::fs::write(&pw3, "third").unwrap();
    ok(
        &repo,
        &[
            "key",
            "passwd",
            "--new-password-file",
            pw3.to_str().unwrap(),
        ],
    );
    assert_eq!(capsule(&repo, &["snapshots"]).status.code(), Some(10));
    let o = capsule_env(&repo, &["snapshots"], &[("CAPSULE_PASSWORD", "third")]);
    assert!(o.status.success());
}

/// Every command speaks JSON.
#[test]
fn json_everywhere() {
    let t = tempfile::tempdir().unwrap();
    let (src, repo) = (t.path().join("src"), t.path().join("repo"));
    std::fs::create_dir(&src).unwrap();
    std::fs::write(src.join("f"), b"x").unwrap();
    let v = json(&repo, &["init"]);
    assert!(v["id"].is_string());
    let b = json(&repo, &["backup", src.to_str().unwrap()]);
    let id = b["snapshot_id"].as_str().unwrap();
    assert_eq!(json(&repo, &["snapshots"])[0]["id"], id);
    assert!(json(&repo, &["ls", id])
        .as_array()
        .unwrap()
        .iter()
        .any(|e| e["path"].as_str().unwrap().ends_with("/f")));
    assert_eq!(json(&repo, &["check"])["ok"], true);
    assert!(json(&repo, &["diff", id, "latest"])
        .as_array()
        .unwrap()
        .is_empty());
    assert_eq!(json(&repo, &["stats"])["snapshots"], 1);
    assert!(
        json(
            &repo,
            &["restore", id, "-t", t.path().join("t").to_str().unwrap()]
        )["files"]
            .as_u64()
            == Some(1)
    );
    assert_eq!(json(&repo, &["key", "list"]).as_array().unwrap().len(), 1);
    // Errors are JSON too, with the exit code.
    let o = capsule(&repo, &["--json", "ls", "ffffffff"]);
    assert_eq!(o.status.code(), Some(13));
    let e: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(e["exit_code"], 13);
}

/// `--trace-requests` writes one line per request the destination saw: as
/// many as the run's own count, the snapshot's upload among them.
#[test]
fn request_trace_matches_the_request_count() {
    let t = tempfile::tempdir().unwrap();
    let (src, repo, trace) = (
        t.path().join("src"),
        t.path().join("repo"),
        t.path().join("trace.tsv"),
    );
    std::fs::create_dir(&src).unwrap();
    std::fs::write(src.join("f"), noise(100_000, 1)).unwrap();
    init(&repo);
    let b = json(
        &repo,
        &[
            "backup",
            "--trace-requests",
            trace.to_str().unwrap(),
            src.to_str().unwrap(),
        ],
    );
    let text = std::fs::read_to_string(&trace).unwrap();
    let mut lines = text.lines();
    assert_eq!(lines.next(), Some("start_s\tsecs\top\tbytes\tresult\tname"));
    let rows: Vec<Vec<&str>> = lines.map(|l| l.split('\t').collect()).collect();
    assert_eq!(
        rows.len() as u64,
        b["destination"]["requests"].as_u64().unwrap(),
        "{text}"
    );
    let id = b["snapshot_id"].as_str().unwrap();
    assert!(
        rows.iter()
            .any(|r| r[2] == "put" && r[4] == "ok" && r[5] == format!("snapshots/{id}")),
        "{text}"
    );
    // The bytes of the puts are what the run reports it sent.
    let up: u64 = rows
        .iter()
        .filter(|r| r[2] == "put" && r[4] == "ok")
        .map(|r| r[3].parse::<u64>().unwrap())
        .sum();
    assert_eq!(up, b["destination"]["bytes_up"].as_u64().unwrap());
    // The stack the command ran on is the library's one way in.
    assert_eq!(
        b["destination"]["layers"],
        serde_json::json!(["retry", "metered", "local"])
    );
    // A trace that cannot be created is an error before anything is done.
    let o = capsule(
        &repo,
        &[
            "backup",
            "--trace-requests",
            t.path().join("no/such/dir/t").to_str().unwrap(),
            src.to_str().unwrap(),
        ],
    );
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("request trace"));
}

/// Each run keeps the opened key's salt and cost beside the cache, and the
/// next run starts the key derivation from it before reading the key file.
/// A hint that is damaged, planted (an absurd cost) or stale (another
/// salt) changes nothing: the repository opens, and a wrong password is
/// still refused.
#[test]
fn the_key_hint_is_kept_and_a_bad_one_changes_nothing() {
    let t = tempfile::tempdir().unwrap();
    let (src, repo) = (t.path().join("src"), t.path().join("repo"));
    std::fs::create_dir(&src).unwrap();
    std::fs::write(src.join("f"), b"x").unwrap();
    init(&repo);
    let hints = repo.with_extension("cache").join("key-hints");
    let files: Vec<_> = std::fs::read_dir(&hints).unwrap().collect();
    assert_eq!(files.len(), 1, "init leaves one hint");
    let hint = files[0].as_ref().unwrap().path();
    let good = std::fs::read_to_string(&hint).unwrap();
    assert!(good.starts_with("argon2id 65536 3 1 "), "{good}");
    ok(&repo, &["backup", src.to_str().unwrap()]);
    assert_eq!(std::fs::read_to_string(&hint).unwrap(), good);

    let salt = good.split_whitespace().last().unwrap();
    let other_salt = format!(
        "{}{}",
        if salt.starts_with('0') { "1" } else { "0" },
        &salt[1..]
    );
    for bad in [
        "garbage\n".to_string(),
        format!("argon2id 1073741824 3 1 {salt}\n"),
        format!("argon2id 65536 3 1 {other_salt}\n"),
    ] {
        std::fs::write(&hint, &bad).unwrap();
        ok(&repo, &["snapshots"]);
        // The run puts the right hint back.
        assert_eq!(
            std::fs::read_to_string(&hint).unwrap(),
            good,
            "after {bad:?}"
        );
        std::fs::write(&hint, &bad).unwrap();
        let o = capsule_env(&repo, &["snapshots"], &[("CAPSULE_PASSWORD", "wrong")]);
        assert_eq!(o.status.code(), Some(10), "after {bad:?}");
    }
    // With the right hint, a wrong password is refused the same way.
    std::fs::write(&hint, &good).unwrap();
    let o = capsule_env(&repo, &["snapshots"], &[("CAPSULE_PASSWORD", "wrong")]);
    assert_eq!(o.status.code(), Some(10));
    // --no-cache neither reads nor writes it.
    std::fs::remove_file(&hint).unwrap();
    ok(&repo, &["--no-cache", "snapshots"]);
    assert!(!hint.exists());
}

/// With no repository configured, `backup` creates and uses the default one.
#[test]
fn embedded_default_repository() {
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("src");
    std::fs::create_dir(&src).unwrap();
    std::fs::write(src.join("f"), b"x").unwrap();
    let run = |args: &[&str]| {
        capsule_cmd(&TestEnv::bare().home(t.path()).password(PASSWORD))
            .args(args)
            .output()
            .unwrap()
    };
    let o = run(&["backup", src.to_str().unwrap()]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(String::from_utf8_lossy(&o.stderr).contains("created a new repository"));
    assert!(t.path().join("data/capsule/repo/config").exists());
    let o = run(&["backup", src.to_str().unwrap()]);
    assert!(o.status.success());
    assert!(!String::from_utf8_lossy(&o.stderr).contains("created"));
    let o = run(&["--json", "snapshots"]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v.as_array().unwrap().len(), 2);
    // Backing up the whole home, which holds the default repository, does
    // not back the repository up into itself.
    let o = run(&["backup", t.path().to_str().unwrap()]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let o = run(&["--json", "ls", "latest"]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let paths: Vec<&str> = v
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["path"].as_str().unwrap())
        .collect();
    assert!(paths.iter().any(|p| p.ends_with("/src/f")), "{paths:?}");
    assert!(
        paths.iter().any(|p| p.ends_with("/data/capsule")),
        "{paths:?}"
    );
    assert!(
        !paths.iter().any(|p| p.contains("/capsule/repo")),
        "repository backed up into itself: {paths:?}"
    );
}

#[test]
fn help_on_every_command() {
    for c in [
        "init",
        "backup",
        "snapshots",
        "ls",
        "restore",
        "check",
        "diff",
        "stats",
        "key",
        "key add",
    ] {
        let mut args: Vec<&str> = c.split(' ').collect();
        args.push("--help");
        let o = capsule_cmd(&TestEnv::bare()).args(&args).output().unwrap();
        assert!(o.status.success(), "{c} --help");
        assert!(String::from_utf8_lossy(&o.stdout).contains("Usage"), "{c}");
    }
    let o = capsule_cmd(&TestEnv::bare())
        .args(["backup"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
}

/// Files deleted and rewritten while the backup runs: it still commits a
/// snapshot, names what vanished or changed, and the repository checks clean.
#[test]
fn files_vanishing_during_backup() {
    let t = tempfile::tempdir().unwrap();
    let (src, repo) = (t.path().join("src"), t.path().join("repo"));
    for d in 0..20 {
        std::fs::create_dir_all(src.join(format!("d{d:02}"))).unwrap();
        for f in 0..250 {
            std::fs::write(
                src.join(format!("d{d:02}/f{f:03}")),
                noise(20_000, d * 1000 + f),
            )
            .unwrap();
        }
    }
    init(&repo);
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (s2, src2) = (stop.clone(), src.clone());
    let churn = std::thread::spawn(move || {
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        let mut i = 0u64;
        while !s2.load(std::sync::atomic::Ordering::Relaxed) && std::time::Instant::now() < deadline
        {
            let p = src2.join(format!("d{:02}/f{:03}", i % 20, (i * 7) % 250));
            if i.is_multiple_of(2) {
                let _ = std::fs::remove_file(&p);
            } else {
                let _ = std::fs::write(&p, noise(30_000, i));
            }
            i += 1;
        }
    });
    let o = capsule(&repo, &["--json", "backup", src.to_str().unwrap()]);
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    churn.join().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(matches!(o.status.code(), Some(0) | Some(3)), "{err}");
    let report: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    for w in report["warnings"].as_array().unwrap() {
        let m = w["message"].as_str().unwrap();
        assert!(
            m.contains("vanished") || m.contains("changed"),
            "unexpected warning {w}"
        );
    }
    assert_eq!(
        o.status.code() == Some(3),
        !report["warnings"].as_array().unwrap().is_empty()
    );
    ok(&repo, &["check", "--read-data"]);
    let target = t.path().join("target");
    ok(
        &repo,
        &["restore", "latest", "-t", target.to_str().unwrap()],
    );
}

/// Completions for each shell and the man pages come from the command
/// definitions; `--install` puts them where each shell and `man` look.
#[test]
fn completions_and_man_pages_are_generated_and_installed() {
    let t = tempfile::tempdir().unwrap();
    let run = |args: &[&str]| {
        let o = capsule_cmd(&TestEnv::bare().home(t.path()))
            .args(args)
            .output()
            .unwrap();
        assert!(o.status.success(), "{args:?}: {o:?}");
        String::from_utf8(o.stdout).unwrap()
    };
    for shell in ["bash", "zsh", "fish"] {
        let s = run(&["completions", shell]);
        assert!(
            s.contains("versions") && s.contains("mount"),
            "{shell}: {s}"
        );
    }
    let man = t.path().join("man");
    run(&["completions", "--man", man.to_str().unwrap()]);
    let page = std::fs::read_to_string(man.join("capsule-restore.1")).unwrap();
    assert!(
        page.contains("\\-\\-version") || page.contains("--version"),
        "{page}"
    );
    assert!(man.join("capsule.1").exists() && man.join("capsule-mount.1").exists());
    run(&["completions", "--install"]);
    for p in [
        "data/bash-completion/completions/capsule",
        ".zfunc/_capsule",
        ".config/fish/completions/capsule.fish",
        "data/man/man1/capsule-versions.1",
    ] {
        assert!(t.path().join(p).is_file(), "{p} not installed");
    }
}
