//! Prunes cut short: killed at each of their steps, and the old index
//! files a prune cut before its deletes leaves behind.

// The command-line suite runs on Linux, against real servers, btrfs,
// fanotify and network namespaces; the macOS build checks the libraries.
#![cfg(target_os = "linux")]
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod common;

use std::path::Path;

use common::*;

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
    for point in points {
        let repo = t.path().join(point);
        copy_tree(&base, &repo);
        copy_tree(&base.with_extension("cache"), &repo.with_extension("cache"));
        // Every step is reached (a renamed step would otherwise go
        // untested), and the prune killed there.
        prune_paused(&repo, point, &t.path().join(format!("{point}-gate"))).kill();
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
}

/// A prune started with `--max-unused 0` that waits at `point`.
struct Paused {
    child: std::process::Child,
    gate: std::path::PathBuf,
}

impl Paused {
    fn kill(mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
    }
    /// Lets it go on, and waits for it to finish well.
    fn release(mut self) {
        std::fs::write(&self.gate, b"").unwrap();
        let status = self.child.wait().unwrap();
        assert!(status.success(), "the prune after the pause: {status}");
    }
}

fn prune_paused(repo: &Path, point: &str, gate: &Path) -> Paused {
    let mut c = capsule_cmd(&TestEnv::beside(repo).password(PASSWORD));
    c.arg("--repo")
        .arg(repo)
        .args(["prune", "--max-unused", "0"])
        .env("CAPSULE_TEST_PAUSE", format!("{point}:{}", gate.display()))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
    let mut child = c.spawn().unwrap();
    let waiting = gate.with_extension("waiting");
    for _ in 0..2400 {
        if waiting.exists() || child.try_wait().unwrap().is_some() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(25));
    }
    assert!(waiting.exists(), "the prune never reached {point}");
    Paused {
        child,
        gate: gate.to_path_buf(),
    }
}

/// Index files in the repository directory.
fn index_files(repo: &Path) -> usize {
    std::fs::read_dir(repo.join("index")).unwrap().count()
}

/// A prune killed after storing the index files that replace the old ones
/// and before deleting those: the old files stay, superseded by the new.
/// The next prune that rewrites the index replaces the new files in turn;
/// the old ones must not come back into force then (they name packs long
/// deleted: `check` called them missing, the fleet year's day 269), nor
/// be held against a reader that finds one listed but gone (a distributed
/// store's node that was away when it was deleted lists it until it
/// heals). A prune's file supersedes what the files it replaces
/// superseded, and a prune deletes the superseded files it finds.
#[test]
fn old_index_files_a_cut_prune_left_never_come_back() {
    let t = tempfile::tempdir().unwrap();
    let (src, repo) = (t.path().join("src"), t.path().join("repo"));
    std::fs::create_dir_all(&src).unwrap();
    init(&repo);
    // Each run replaces one of three 200 kB files; keeping the last run
    // leaves the packs of the earlier ones unused.
    let mut seeds = [1u64, 2, 3];
    let mut run = |n: u64| {
        let f = (n % 3) as usize;
        seeds[f] = 100 + n;
        std::fs::write(src.join(format!("f{f}")), noise(200_000, seeds[f])).unwrap();
        ok(&repo, &["backup", "-q", src.to_str().unwrap()]);
        seeds
    };
    for n in 0..3 {
        run(n);
    }
    ok(&repo, &["forget", "--keep-last", "1"]);
    let before = index_files(&repo);
    let cut = prune_paused(&repo, "prune-rewritten", &t.path().join("gate"));
    cut.kill();
    assert!(
        index_files(&repo) > before,
        "the cut prune left its new index file beside the old ones"
    );
    // A prune with nothing new to mark finishes the cut one's work: the
    // packs it took out of the index are deleted (the old files still
    // name them, out of force).
    ok(&repo, &["prune", "--max-unused", "0"]);
    // The next prune that marks something replaces the cut one's file
    // (and the next backup's) and deletes it: a check run then (here:
    // while the prune waits after that pass) must find the old files still
    // out of force, or it finds the packs they name missing.
    run(3);
    ok(&repo, &["forget", "--keep-last", "1"]);
    let next = prune_paused(&repo, "prune-marked", &t.path().join("gate2"));
    let during = capsule(&repo, &["check"]);
    next.release();
    assert!(
        during.status.success(),
        "check during the next prune: {}",
        said(&during)
    );
    // Two more rounds of changes, each forgotten and pruned: each prune
    // rewrites the index again.
    let mut last = [0u64; 3];
    for n in 4..6 {
        last = run(n);
        ok(&repo, &["forget", "--keep-last", "1"]);
        for _ in 0..2 {
            ok(&repo, &["prune", "--max-unused", "0"]);
        }
    }
    ok(&repo, &["check", "--read-data"]);
    // Every index file left is in force: the old ones were deleted.
    assert_eq!(index_files(&repo), 1, "index files left after the prunes");
    let target = t.path().join("restored");
    ok(
        &repo,
        &["restore", "latest", "-t", target.to_str().unwrap()],
    );
    let dir = restored(&target, &src);
    for (f, seed) in last.iter().enumerate() {
        assert_eq!(
            std::fs::read(dir.join(format!("f{f}"))).unwrap(),
            noise(200_000, *seed),
            "f{f}"
        );
    }
}
