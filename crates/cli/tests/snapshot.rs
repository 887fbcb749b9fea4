//! Source snapshots (issue 46) on a real btrfs file system made on a loop
//! device: a writer that never stops tears backups of live files and
//! never tears one read from a snapshot; a killed run's snapshot is
//! removed by the next run; a snapshot removed mid-run fails the run; a
//! kind that cannot be had is a clear error, and `auto` says why it reads
//! live files. LVM needs device-mapper, which is checked and, where the
//! kernel has none, skipped with the reason printed.

// The command-line suite runs on Linux, against real servers, btrfs,
// fanotify and network namespaces; the macOS build checks the libraries.
#![cfg(target_os = "linux")]
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod common;

use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;

/// A btrfs file system on a loop device with a subvolume `data`.
struct Btrfs {
    fs: LoopFs,
    data: PathBuf,
}

fn btrfs() -> Option<Btrfs> {
    if Command::new("mkfs.btrfs")
        .arg("--version")
        .output()
        .is_err()
    {
        assert!(
            std::env::var("CAPSULE_REQUIRE_SERVERS").as_deref() != Ok("1") || !is_root(),
            "btrfs-progs is not installed (the test command installs it as root)"
        );
        eprintln!("skipped: btrfs-progs is not installed");
        return None;
    }
    let fs = LoopFs::of("btrfs", 300)?;
    let data = fs.dir.join("data");
    btrfs_cmd(&["subvolume", "create", data.to_str().unwrap()]);
    Some(Btrfs { fs, data })
}

fn btrfs_cmd(args: &[&str]) {
    let o = Command::new("btrfs").args(args).output().unwrap();
    assert!(o.status.success(), "btrfs {args:?}: {}", said(&o));
}

/// Counters as a writer leaves them: fixed width, rewritten in place.
fn counter(n: u64) -> [u8; 20] {
    let mut b = [0u8; 20];
    b.copy_from_slice(format!("{n:020}").as_bytes());
    b
}

const PAIRS: usize = 24;

/// Where the second half of each pair lies: deep below `z`, behind
/// directories of small files, so the walk reads the two halves of a
/// pair milliseconds apart.
fn z_dir(data: &Path) -> PathBuf {
    (0..DEPTH).fold(data.join("z"), |p, i| p.join(format!("d{i}")))
}

const DEPTH: usize = 24;

/// Files `a/pNN` and `z/d0/…/pNN`.
fn lay_out(data: &Path) {
    let mut d = data.join("z");
    for i in 0..DEPTH {
        std::fs::create_dir_all(&d).unwrap();
        for j in 0..30 {
            std::fs::write(d.join(format!("f{j:02}")), noise(500, (i * 100 + j) as u64)).unwrap();
        }
        d = d.join(format!("d{i}"));
    }
    std::fs::create_dir_all(&d).unwrap();
    std::fs::create_dir_all(data.join("a")).unwrap();
    for i in 0..PAIRS {
        std::fs::write(data.join("a").join(format!("p{i:02}")), counter(0)).unwrap();
        std::fs::write(d.join(format!("p{i:02}")), counter(0)).unwrap();
    }
}

/// Rewrites every pair, forever: `a` first, made durable, then `z`. At
/// every instant `a` holds `z` or `z + 1`: what a crash, or a snapshot,
/// can leave. (The walk reads `a` well before `z`, deep below: a round
/// in between leaves `z` ahead of `a`, which no instant had.) `seed`
/// varies the pauses between writes.
struct Writer {
    stop: Arc<AtomicBool>,
    rounds: Arc<AtomicU64>,
    handle: Option<std::thread::JoinHandle<()>>,
}

impl Writer {
    fn start(data: &Path, seed: u64) -> Writer {
        let stop = Arc::new(AtomicBool::new(false));
        let rounds = Arc::new(AtomicU64::new(0));
        let open = |d: &Path, i: usize| {
            std::fs::OpenOptions::new()
                .write(true)
                .open(d.join(format!("p{i:02}")))
                .unwrap()
        };
        let (a, z) = (data.join("a"), z_dir(data));
        let files: Vec<_> = (0..PAIRS).map(|i| (open(&a, i), open(&z, i))).collect();
        let (s, r) = (stop.clone(), rounds.clone());
        let handle = std::thread::spawn(move || {
            let mut x = seed | 1;
            let mut n = 0u64;
            // Bounded: the test stops it, or ten minutes pass.
            let end = Instant::now() + Duration::from_secs(600);
            while !s.load(Ordering::Relaxed) && Instant::now() < end {
                n += 1;
                for (a, z) in &files {
                    a.write_all_at(&counter(n), 0).unwrap();
                    a.sync_data().unwrap();
                    z.write_all_at(&counter(n), 0).unwrap();
                    z.sync_data().unwrap();
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    if x.is_multiple_of(4) {
                        std::thread::sleep(Duration::from_micros(x % 300));
                    }
                }
                r.store(n, Ordering::Relaxed);
            }
        });
        Writer {
            stop,
            rounds,
            handle: Some(handle),
        }
    }

    /// Waits until the writer has done `more` more rounds (bounded).
    fn advance(&self, more: u64) {
        let want = self.rounds.load(Ordering::Relaxed) + more;
        let end = Instant::now() + Duration::from_secs(60);
        while self.rounds.load(Ordering::Relaxed) < want && Instant::now() < end {
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

impl Drop for Writer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

/// Backs up `data` with `mode`; restores it; the pairs that break the
/// writer's invariant, and the sum of the counters (to see them move).
fn run_once(repo: &Path, data: &Path, mode: &str, work: &Path) -> (Vec<String>, u64) {
    let o = capsule(
        repo,
        &[
            "--json",
            "backup",
            "--source-snapshot",
            mode,
            data.to_str().unwrap(),
        ],
    );
    // Live files changing while read are reported (exit 3) and stored.
    assert!(matches!(o.status.code(), Some(0 | 3)), "{}", said(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let taken = v["source_snapshots"].as_array().unwrap().len();
    assert_eq!(taken > 0, mode != "off", "{v}");
    let id = v["snapshot_id"].as_str().unwrap();
    let target = work.join(&id[..12]);
    ok(repo, &["restore", id, "--target", target.to_str().unwrap()]);
    let back = restored(&target, data);
    let (a, z) = (back.join("a"), z_dir(&back));
    let read = |d: &Path, i: usize| -> Option<u64> {
        std::str::from_utf8(&std::fs::read(d.join(format!("p{i:02}"))).ok()?)
            .ok()?
            .parse()
            .ok()
    };
    let mut torn = Vec::new();
    let mut sum = 0;
    for i in 0..PAIRS {
        match (read(&a, i), read(&z, i)) {
            (Some(a), Some(z)) if a == z || a == z + 1 => sum += a,
            (a, z) => torn.push(format!("pair {i}: a={a:?} z={z:?}")),
        }
    }
    std::fs::remove_dir_all(&target).unwrap();
    (torn, sum)
}

#[test]
fn a_snapshot_is_never_torn_where_live_files_are() {
    let Some(b) = btrfs() else { return };
    let t = tempfile::tempdir().unwrap();
    let repo = t.path().join("repo");
    init(&repo);
    lay_out(&b.data);

    // Live files: the writer moves on between the reads of a pair's two
    // files, and some run stores a pair the writer never left on disk.
    // (This is what shows the check can fail.)
    let w = Writer::start(&b.data, 1);
    w.advance(2);
    let mut live_torn = Vec::new();
    for _ in 0..60 {
        let (torn, _) = run_once(&repo, &b.data, "off", t.path());
        if !torn.is_empty() {
            live_torn = torn;
            break;
        }
    }
    let rounds = w.rounds.load(Ordering::Relaxed);
    drop(w);
    eprintln!("the writer did {rounds} rounds of {PAIRS} pairs");
    assert!(
        !live_torn.is_empty(),
        "60 backups of live files under a running writer never stored a torn pair"
    );
    eprintln!("live files: {}", live_torn.join("; "));

    // From snapshots: every restored pair holds, whatever the writer's
    // pace (seeds), and the writer is seen to have moved between runs.
    let mut sums = Vec::new();
    for seed in 1..=8u64 {
        let w = Writer::start(&b.data, seed * 7919);
        w.advance(2);
        let (torn, sum) = run_once(&repo, &b.data, "btrfs", t.path());
        assert!(
            torn.is_empty(),
            "seed {seed}: torn from a snapshot: {torn:?}"
        );
        sums.push(sum);
        drop(w);
    }
    sums.dedup();
    assert!(sums.len() > 1, "the writer did not move: {sums:?}");
    // Nothing left behind: the snapshot directory is empty.
    let left: Vec<_> = std::fs::read_dir(b.data.join(capsule_snap_dir()))
        .unwrap()
        .collect();
    assert!(left.is_empty(), "{left:?}");
    drop(b.fs);
}

fn capsule_snap_dir() -> &'static str {
    ".capsule-snapshots"
}

/// Snapshot-mode and live backups of the same unchanged tree store the
/// same tree: no snapshot path, device number or inode leaks in. A nested
/// subvolume (which a snapshot shows as an empty directory) is read from a
/// snapshot of its own.
#[test]
fn a_snapshot_backup_stores_what_a_live_backup_stores() {
    let Some(b) = btrfs() else { return };
    let t = tempfile::tempdir().unwrap();
    let repo = t.path().join("repo");
    init(&repo);
    std::fs::create_dir_all(b.data.join("docs/deep")).unwrap();
    std::fs::write(b.data.join("docs/deep/note"), b"note").unwrap();
    std::fs::write(b.data.join("docs/one"), noise(300_000, 5)).unwrap();
    std::fs::hard_link(b.data.join("docs/one"), b.data.join("one-again")).unwrap();
    let nested = b.data.join("nested");
    btrfs_cmd(&["subvolume", "create", nested.to_str().unwrap()]);
    std::fs::write(nested.join("inside"), b"in a subvolume of its own").unwrap();
    // An excluded nested subvolume is not snapshotted.
    let skipped = b.data.join("containers");
    btrfs_cmd(&["subvolume", "create", skipped.to_str().unwrap()]);
    let src = b.data.to_str().unwrap();
    // Settled: the files' times lie more than a second before the
    // first run's, so later runs trust them (see DESIGN, change detection).
    std::thread::sleep(Duration::from_millis(2100));

    let ex = ["-e", "containers"];
    let snap = json(
        &repo,
        &[&["backup", "--source-snapshot", "btrfs", src], &ex[..]].concat(),
    );
    let taken = snap["source_snapshots"].as_array().unwrap();
    assert_eq!(taken.len(), 2, "the subvolume and the nested one: {snap}");
    let live = json(&repo, &[&["backup", src], &ex[..]].concat());
    let again = json(
        &repo,
        &[&["backup", "--source-snapshot", "auto", src], &ex[..]].concat(),
    );
    let tree = |id: &serde_json::Value| {
        let v = json(&repo, &["snapshots"]);
        v.as_array()
            .unwrap()
            .iter()
            .find(|s| s["id"] == *id)
            .map(|s| s["snapshot"]["tree"].as_str().unwrap().to_string())
            .unwrap()
    };
    let trees = [
        tree(&snap["snapshot_id"]),
        tree(&live["snapshot_id"]),
        tree(&again["snapshot_id"]),
    ];
    assert!(
        trees.iter().all(|x| *x == trees[0]),
        "snapshot, live and auto runs stored different trees: {trees:?}"
    );
    // The live run and the second snapshot run read nothing again.
    assert_eq!(live["files_unchanged"], 4, "{live}");
    assert_eq!(again["files_unchanged"], 4, "{again}");
    let target = t.path().join("back");
    ok(
        &repo,
        &["restore", "latest", "--target", target.to_str().unwrap()],
    );
    let back = restored(&target, &b.data);
    assert_eq!(
        std::fs::read(back.join("nested/inside")).unwrap(),
        b"in a subvolume of its own"
    );
    assert!(!back.join(capsule_snap_dir()).exists());
    assert_eq!(
        std::fs::read_dir(b.data.join(capsule_snap_dir()))
            .unwrap()
            .count(),
        0
    );
    // The nested subvolume's snapshot went beside the top one's: nothing
    // was ever written into the nested subvolume (issue 59).
    assert!(!nested.join(capsule_snap_dir()).exists());
}

/// Starts a backup that stops once its snapshot is taken; returns it and
/// the pause file that lets it go on.
fn paused_backup(
    repo: &Path,
    src: &Path,
    mode: &str,
    work: &Path,
) -> (std::process::Child, PathBuf) {
    paused_backup_at(repo, src, mode, work, "snapshot-taken")
}

/// Starts a backup that stops at pause point `point`.
fn paused_backup_at(
    repo: &Path,
    src: &Path,
    mode: &str,
    work: &Path,
    point: &str,
) -> (std::process::Child, PathBuf) {
    let gate = work.join("gate");
    let child = capsule_at(repo)
        .args([
            "--json",
            "backup",
            "--source-snapshot",
            mode,
            src.to_str().unwrap(),
        ])
        .env("CAPSULE_TEST_PAUSE", format!("{point}:{}", gate.display()))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let waiting = gate.with_extension("waiting");
    let end = Instant::now() + Duration::from_secs(120);
    while !waiting.exists() && Instant::now() < end {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(waiting.exists(), "the backup never reached its snapshot");
    (child, gate)
}

/// A `--source-snapshot btrfs` backup of `data` that must succeed: its
/// output, and its snapshot notes as text.
fn btrfs_backup_notes(repo: &Path, data: &Path) -> (std::process::Output, String) {
    let o = capsule(
        repo,
        &[
            "--json",
            "backup",
            "--source-snapshot",
            "btrfs",
            data.to_str().unwrap(),
        ],
    );
    assert_eq!(o.status.code(), Some(0), "{}", said(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let notes = v["snapshot_notes"].to_string();
    (o, notes)
}

/// The subvolumes in a snapshot directory (not capsule's records).
fn snapshots_in(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .map(|d| {
            d.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| !n.ends_with(".uuid"))
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

#[test]
fn a_killed_runs_snapshot_is_removed_by_the_next_run_and_no_other() {
    let Some(b) = btrfs() else { return };
    let t = tempfile::tempdir().unwrap();
    let repo = t.path().join("repo");
    init(&repo);
    std::fs::write(b.data.join("f"), b"data").unwrap();
    let dir = b.data.join(capsule_snap_dir());
    // A snapshot capsule did not make, in capsule's own directory.
    std::fs::create_dir_all(&dir).unwrap();
    btrfs_cmd(&[
        "subvolume",
        "snapshot",
        "-r",
        b.data.to_str().unwrap(),
        dir.join("daily").to_str().unwrap(),
    ]);

    // Killed once: `repair source-snapshots` removes what it left.
    let killed = |work: &Path| {
        let (mut child, _gate) = paused_backup(&repo, &b.data, "btrfs", work);
        let left = snapshots_in(&dir);
        assert_eq!(left.len(), 2, "{left:?}");
        child.kill().unwrap();
        child.wait().unwrap();
        assert_eq!(snapshots_in(&dir), left, "killed: the snapshot stays");
        left.iter()
            .find(|n| n.starts_with("capsule-"))
            .unwrap()
            .clone()
    };
    let first = t.path().join("first");
    std::fs::create_dir_all(&first).unwrap();
    let ours = killed(&first);
    let o = capsule(
        &repo,
        &["repair", "source-snapshots", b.data.to_str().unwrap()],
    );
    assert_eq!(o.status.code(), Some(0), "{}", said(&o));
    assert!(
        String::from_utf8_lossy(&o.stdout).contains(&ours),
        "{}",
        said(&o)
    );
    assert_eq!(snapshots_in(&dir), vec!["daily".to_string()]);

    // Killed again: the next run removes it, and says so.
    let ours = killed(t.path());

    let (o, notes) = btrfs_backup_notes(&repo, &b.data);
    assert!(
        notes.contains(&ours) && notes.contains("interrupted run left behind"),
        "{notes}"
    );
    assert!(
        String::from_utf8_lossy(&o.stderr).contains(&ours),
        "{}",
        said(&o)
    );
    assert_eq!(
        snapshots_in(&dir),
        vec!["daily".to_string()],
        "only capsule's own leftover goes"
    );
    // `daily` is not backed up either: the directory is capsule's.
    let ls = ok(&repo, &["ls", "latest"]);
    assert!(!ls.contains("daily"), "{ls}");
}

#[test]
fn a_snapshot_removed_mid_run_fails_the_run_and_stores_nothing() {
    let Some(b) = btrfs() else { return };
    let t = tempfile::tempdir().unwrap();
    let repo = t.path().join("repo");
    init(&repo);
    for i in 0..50 {
        std::fs::write(b.data.join(format!("f{i}")), noise(5000, i)).unwrap();
    }
    let (child, gate) = paused_backup(&repo, &b.data, "btrfs", t.path());
    let dir = b.data.join(capsule_snap_dir());
    let ours = snapshots_in(&dir);
    assert_eq!(ours.len(), 1, "{ours:?}");
    btrfs_cmd(&["subvolume", "delete", dir.join(&ours[0]).to_str().unwrap()]);
    std::fs::write(&gate, b"").unwrap();
    let o = child.wait_with_output().unwrap();
    assert_eq!(o.status.code(), Some(1), "{}", said(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("was removed while the backup read it"),
        "{err}"
    );
    let snaps = json(&repo, &["snapshots"]);
    assert_eq!(snaps.as_array().unwrap().len(), 0, "{snaps}");
}

#[test]
fn a_kind_that_cannot_be_had_is_an_error_and_auto_reads_live_files_saying_why() {
    // Any directory not on btrfs: the test's own temporary directory
    // (target/tmp), or a loop-mounted ext4 where that is btrfs.
    let ext4 = LoopFs::new(64);
    let t = tempfile::tempdir().unwrap();
    let on_ext4 = match &ext4 {
        Some(fs) => fs.dir.join("src"),
        None => t.path().join("src"),
    };
    std::fs::create_dir_all(&on_ext4).unwrap();
    std::fs::write(on_ext4.join("f"), b"x").unwrap();
    let repo = t.path().join("repo");
    init(&repo);
    let src = on_ext4.to_str().unwrap();
    for kind in ["btrfs", "lvm", "zfs"] {
        let o = capsule(&repo, &["backup", "--source-snapshot", kind, src]);
        assert_eq!(o.status.code(), Some(1), "{kind}: {}", said(&o));
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(
            err.contains(&format!("cannot take a {kind} snapshot")) && err.contains(src),
            "{kind}: {err}"
        );
    }
    assert_eq!(json(&repo, &["snapshots"]).as_array().unwrap().len(), 0);
    let o = capsule(
        &repo,
        &["--json", "backup", "--source-snapshot", "auto", src],
    );
    assert_eq!(o.status.code(), Some(0), "{}", said(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert!(v["source_snapshots"].as_array().unwrap().is_empty());
    assert!(
        v["snapshot_notes"]
            .to_string()
            .contains("reading live files"),
        "{v}"
    );
    // A bad value is a usage error, in a flag and in a profile.
    let o = capsule(&repo, &["backup", "--source-snapshot", "vss", src]);
    assert_eq!(o.status.code(), Some(2), "{}", said(&o));
}

/// An LVM volume group on a loop device, removed on drop.
struct Vg {
    name: String,
    loopdev: String,
    mnt: PathBuf,
    _img: tempfile::TempDir,
}

impl Drop for Vg {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.mnt).status();
        let _ = Command::new("vgremove").args(["-f", &self.name]).status();
        let _ = Command::new("pvremove")
            .args(["-f", &self.loopdev])
            .status();
        let _ = Command::new("losetup").args(["-d", &self.loopdev]).status();
    }
}

#[test]
fn an_lvm_snapshot_is_read_and_removed() {
    let dm = Command::new("dmsetup")
        .arg("version")
        .output()
        .map(|o| (o.status.success(), said(&o)));
    match dm {
        Ok((true, _)) if is_root() => {}
        Ok((_, why)) => {
            eprintln!(
                "skipped: no device-mapper here, so no LVM volume can be made to snapshot ({})",
                why.trim()
            );
            return;
        }
        Err(e) => {
            eprintln!("skipped: dmsetup (lvm2) is not installed: {e}");
            return;
        }
    }
    let img = tempfile::tempdir().unwrap();
    let file = img.path().join("pv.img");
    let run = |c: &mut Command| {
        let o = c.output().unwrap();
        assert!(o.status.success(), "{c:?}: {}", said(&o));
        String::from_utf8_lossy(&o.stdout).trim().to_string()
    };
    run(Command::new("truncate").arg("-s400M").arg(&file));
    let loopdev = run(Command::new("losetup").args(["-f", "--show"]).arg(&file));
    let vg = Vg {
        name: format!("capsuletest{}", std::process::id()),
        loopdev,
        mnt: img.path().join("mnt"),
        _img: img,
    };
    run(Command::new("pvcreate").args(["-q", &vg.loopdev]));
    run(Command::new("vgcreate").args(["-q", &vg.name, &vg.loopdev]));
    run(Command::new("lvcreate").args(["-q", "-L", "128M", "-n", "src", &vg.name]));
    let dev = format!("/dev/{}/src", vg.name);
    run(Command::new("mkfs.ext4").args(["-q", &dev]));
    std::fs::create_dir_all(&vg.mnt).unwrap();
    run(Command::new("mount").arg(&dev).arg(&vg.mnt));
    std::fs::write(vg.mnt.join("f"), noise(100_000, 3)).unwrap();
    let t = tempfile::tempdir().unwrap();
    let repo = t.path().join("repo");
    init(&repo);
    let src = vg.mnt.to_str().unwrap();
    let v = json(&repo, &["backup", "--source-snapshot", "lvm", src]);
    assert_eq!(v["source_snapshots"].as_array().unwrap().len(), 1, "{v}");
    let live = json(&repo, &["backup", src]);
    assert_eq!(
        live["files_unchanged"], 2,
        "lost+found's metadata and f: {live}"
    );
    let lvs = run(Command::new("lvs").args(["--noheadings", "-o", "lv_name", &vg.name]));
    assert_eq!(lvs.trim(), "src", "the snapshot volume was removed");
}

/// A shell loop run as carol in a process group of its own: stopped by
/// its stop file, and its whole group killed, when dropped (a failing
/// test leaves none running).
struct Swapper(std::process::Child, PathBuf);

impl Swapper {
    fn start(script: &str, stop: PathBuf) -> Swapper {
        use std::os::unix::process::CommandExt;
        let child = Command::new("setpriv")
            .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
            .args(["sh", "-c", script])
            .process_group(0)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        Swapper(child, stop)
    }
}

impl Drop for Swapper {
    fn drop(&mut self) {
        let _ = std::fs::write(&self.1, b"");
        if let Some(pid) = rustix::process::Pid::from_raw(self.0.id() as i32) {
            let _ = rustix::process::kill_process_group(pid, rustix::process::Signal::KILL);
        }
        let _ = self.0.wait();
    }
}

/// A daemon killed when dropped, so a failing test leaves none running.
struct Daemon(std::process::Child);

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Under the daemon's change journal: a run with nothing to read takes no
/// snapshot; a run with changes reads them from a snapshot; and taking
/// and removing that snapshot (in `.capsule-snapshots`) is no change for
/// the next run.
#[test]
fn under_the_journal_only_runs_that_read_take_a_snapshot_and_it_is_no_change() {
    let Some(b) = btrfs() else { return };
    // In the top-level subvolume: fanotify cannot mark a subvolume of its
    // own (EXDEV), and the daemon then scans in full.
    let top = b.fs.dir.join("top");
    let t = tempfile::tempdir().unwrap();
    let dir = t.path();
    std::fs::create_dir_all(top.join("docs")).unwrap();
    std::fs::write(top.join("docs/a"), b"a").unwrap();
    let config = dir.join("capsule.toml");
    std::fs::write(
        &config,
        format!(
            "[profiles.p]\nsources = [{:?}]\nrepository = {:?}\npassword-command = \"echo {PASSWORD}\"\nschedule = {{ backup = \"hourly\" }}\nsource-snapshot = \"btrfs\"\njournal-verify-every = 0\n",
            top.display().to_string(),
            dir.join("repo").display().to_string()
        ),
    )
    .unwrap();
    let clock = dir.join("clock");
    let set_clock = |t: i64| std::fs::write(&clock, t.to_string()).unwrap();
    set_clock(NOW);
    let cmd = |args: &[&str]| {
        let env = TestEnv::under(dir)
            .config(&config)
            .clock(format!("@{}", clock.display()))
            .var("CAPSULE_DAEMON_TICK_MS", "50");
        let mut c = capsule_cmd(&env);
        c.args(args);
        c
    };
    let o = cmd(&["--profile", "p", "init"]).output().unwrap();
    assert!(o.status.success(), "{}", said(&o));
    let log = dir.join("daemon.log");
    let _daemon = Daemon(
        cmd(&["daemon"])
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap(),
    );
    // The daemon's own first run, at NOW (bounded).
    let end = Instant::now() + Duration::from_secs(120);
    loop {
        let o = cmd(&["--json", "status"]).output().unwrap();
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap_or_default();
        if v["profiles"][0]["last_success"]["started_unix"].as_i64() == Some(NOW) {
            assert_eq!(v["profiles"][0]["journal"]["watching"], true, "{v}");
            break;
        }
        assert!(
            Instant::now() < end,
            "the daemon made no run: {}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let minute = std::cell::Cell::new(0);
    let backup = || -> serde_json::Value {
        minute.set(minute.get() + 1);
        set_clock(NOW + minute.get() * 60);
        let o = cmd(&["--profile", "p", "--json", "backup"])
            .output()
            .unwrap();
        assert_eq!(o.status.code(), Some(0), "{}", said(&o));
        serde_json::from_slice(&o.stdout).unwrap()
    };
    let snapshots = |v: &serde_json::Value| v["source_snapshots"].as_array().unwrap().len();
    std::fs::write(top.join("docs/b"), b"b").unwrap();
    let j = backup();
    assert_eq!(j["scan"]["mode"], "journal", "{j}");
    assert_eq!(
        (j["files_new"].as_u64(), snapshots(&j)),
        (Some(1), 1),
        "{j}"
    );
    for _ in 0..2 {
        let q = backup();
        assert_eq!(
            q["scan"]["unchanged"], true,
            "its snapshot was seen as a change: {q}"
        );
        assert_eq!(snapshots(&q), 0, "{q}");
    }
    std::fs::write(top.join("docs/a"), b"a, changed").unwrap();
    let j = backup();
    assert_eq!(j["scan"]["mode"], "journal", "{j}");
    // (docs/b is read again too: under the test clock no file is settled.)
    assert!(j["files_changed"].as_u64() >= Some(1), "{j}");
    assert_eq!(snapshots(&j), 1, "{j}");
    let q = backup();
    assert_eq!(q["scan"]["unchanged"], true, "{q}");
}

/// Runs `args` as the unprivileged user 65534 (the tester's "carol").
fn as_carol(args: &[&str]) -> std::process::Output {
    Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
        .args(args)
        .output()
        .unwrap()
}

/// Issue 59, 1: a user who owns a subvolume inside a source plants
/// capsule-like names and links, and renames and re-plants in a tight
/// loop while root backs up with snapshots. capsule never takes, reads
/// through or removes a snapshot where that user can write (a nested
/// subvolume's snapshot goes beside the top one, where only root writes),
/// never follows a link to delete, and never deletes a subvolume it did
/// not record as its own read-only snapshot: the unrelated subvolume and
/// the planted writable `capsule-1000-99992` survive every run.
#[test]
fn a_planted_link_or_name_never_makes_a_root_backup_delete_a_subvolume() {
    let Some(b) = btrfs() else { return };
    if Command::new("setpriv").arg("--version").output().is_err() {
        eprintln!("skipped: setpriv (util-linux) is not installed");
        return;
    }
    let t = tempfile::tempdir().unwrap();
    let repo = t.path().join("repo");
    init(&repo);
    let victim = b.fs.dir.join("victim");
    btrfs_cmd(&["subvolume", "create", victim.to_str().unwrap()]);
    std::fs::write(victim.join("precious"), b"not capsule's").unwrap();
    std::fs::write(b.data.join("f"), b"data").unwrap();
    let carol = b.data.join("carol");
    std::fs::create_dir(&carol).unwrap();
    std::os::unix::fs::chown(&carol, Some(65534), Some(65534)).unwrap();
    let mysub = carol.join("mysub");
    let o = as_carol(&["btrfs", "subvolume", "create", mysub.to_str().unwrap()]);
    assert!(o.status.success(), "{}", said(&o));
    let theirs = mysub.join(capsule_snap_dir());
    let o = as_carol(&["mkdir", theirs.to_str().unwrap()]);
    assert!(o.status.success(), "{}", said(&o));
    let o = as_carol(&[
        "sh",
        "-c",
        &format!("echo carol > {}/note.txt", mysub.display()),
    ]);
    assert!(o.status.success(), "{}", said(&o));
    // A writable subvolume with a capsule-like name of a dead run, in
    // capsule's own directory; a link of that shape in carol's.
    let ours = b.data.join(capsule_snap_dir());
    std::fs::create_dir(&ours).unwrap();
    let planted = ours.join("capsule-1000-99992");
    btrfs_cmd(&["subvolume", "create", planted.to_str().unwrap()]);
    std::os::unix::fs::symlink(&victim, theirs.join("capsule-1000-99993")).unwrap();

    // The swapper: as carol, renames whatever capsule-* appears in either
    // snapshot directory and puts a link to the victim in its place, until
    // told to stop (and at most 2,000,000 rounds).
    let stop = t.path().join("stop-swapping");
    let script = format!(
        "i=0; while [ $i -lt 2000000 ] && [ ! -e {} ]; do i=$((i+1)); for d in {} {}; do for s in \"$d\"/capsule-*-*; do \
           [ -L \"$s\" ] && continue; [ -e \"$s\" ] || continue; \
           mv \"$s\" \"$s.moved\" 2>/dev/null && ln -s {} \"$s\" 2>/dev/null; done; done; done",
        stop.display(),
        theirs.display(),
        ours.display(),
        victim.display()
    );
    let swapper = Swapper::start(&script, stop);
    for mode in ["btrfs", "auto", "btrfs"] {
        let o = capsule(
            &repo,
            &[
                "--json",
                "backup",
                "--source-snapshot",
                mode,
                b.data.to_str().unwrap(),
            ],
        );
        assert_eq!(o.status.code(), Some(0), "{mode}: {}", said(&o));
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        assert!(
            v["snapshot_notes"]
                .to_string()
                .contains("capsule-1000-99992"),
            "the planted subvolume is named as left alone: {v}"
        );
        assert!(
            victim.join("precious").exists(),
            "{mode}: the victim survives"
        );
        assert!(planted.exists(), "{mode}: the planted subvolume survives");
    }
    // carol's subvolume was backed up, from a snapshot capsule made in its
    // own directory, and nothing capsule made is left anywhere.
    let ls = ok(&repo, &["ls", "latest", mysub.to_str().unwrap()]);
    assert!(ls.contains("note.txt"), "{ls}");
    drop(swapper);
    assert_eq!(snapshots_in(&ours), vec!["capsule-1000-99992".to_string()]);
    let in_theirs = snapshots_in(&theirs);
    assert!(
        in_theirs
            .iter()
            .all(|n| n.starts_with("capsule-1000-99993")),
        "capsule made nothing in carol's directory: {in_theirs:?}"
    );

    // carol's own subvolume as a source: its snapshot directory is hers,
    // so capsule takes none there: an error with `btrfs`, a note and live
    // files with `auto`.
    let o = capsule(
        &repo,
        &[
            "backup",
            "--source-snapshot",
            "btrfs",
            mysub.to_str().unwrap(),
        ],
    );
    assert_ne!(o.status.code(), Some(0), "{}", said(&o));
    assert!(said(&o).contains("another user can change"), "{}", said(&o));
    let o = capsule(
        &repo,
        &[
            "--json",
            "backup",
            "--source-snapshot",
            "auto",
            mysub.to_str().unwrap(),
        ],
    );
    assert_eq!(o.status.code(), Some(0), "{}", said(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let notes = v["snapshot_notes"].to_string();
    assert!(
        notes.contains(&format!("reading {} live", mysub.display()))
            && notes.contains("another user can change"),
        "{v}"
    );
    assert_eq!(
        snapshots_in(&theirs)
            .iter()
            .filter(|n| !n.starts_with("capsule-1000-99993"))
            .count(),
        0
    );

    // repair names what it leaves, and does not call that "none".
    let o = capsule(
        &repo,
        &["repair", "source-snapshots", b.data.to_str().unwrap()],
    );
    assert_eq!(o.status.code(), Some(3), "{}", said(&o));
    let out = said(&o);
    assert!(
        out.contains("capsule-1000-99992") && !out.contains("no source snapshot left"),
        "{out}"
    );
    assert!(planted.exists() && victim.join("precious").exists());
}

/// Issue 59, 5: a killed run's snapshot of a nested subvolume is found
/// and removed by `repair source-snapshots` and by the next run, and
/// repair never says "none" while one is left.
#[test]
fn a_killed_runs_nested_snapshots_are_removed_too() {
    let Some(b) = btrfs() else { return };
    let t = tempfile::tempdir().unwrap();
    let repo = t.path().join("repo");
    init(&repo);
    let nested = b.data.join("vol/nested");
    std::fs::create_dir(b.data.join("vol")).unwrap();
    btrfs_cmd(&["subvolume", "create", nested.to_str().unwrap()]);
    std::fs::write(nested.join("inside"), b"nested data").unwrap();
    let dir = b.data.join(capsule_snap_dir());
    let killed = |work: &Path| {
        std::fs::create_dir_all(work).unwrap();
        let (mut child, _gate) = paused_backup_at(&repo, &b.data, "btrfs", work, "walked");
        let left = snapshots_in(&dir);
        assert_eq!(left.len(), 2, "the volume's and the nested one's: {left:?}");
        child.kill().unwrap();
        child.wait().unwrap();
        left
    };
    let left = killed(&t.path().join("one"));
    let o = capsule(
        &repo,
        &["repair", "source-snapshots", b.data.to_str().unwrap()],
    );
    assert_eq!(o.status.code(), Some(0), "{}", said(&o));
    for n in &left {
        assert!(said(&o).contains(n.as_str()), "{n}: {}", said(&o));
    }
    assert!(snapshots_in(&dir).is_empty(), "{:?}", snapshots_in(&dir));
    let o = capsule(
        &repo,
        &["repair", "source-snapshots", b.data.to_str().unwrap()],
    );
    assert!(
        said(&o).contains("no source snapshot left behind"),
        "{}",
        said(&o)
    );

    let left = killed(&t.path().join("two"));
    let (_, notes) = btrfs_backup_notes(&repo, &b.data);
    for n in &left {
        assert!(notes.contains(n.as_str()), "{n}: {notes}");
    }
    assert!(snapshots_in(&dir).is_empty(), "{:?}", snapshots_in(&dir));
    let ls = ok(&repo, &["ls", "latest", nested.to_str().unwrap()]);
    assert!(ls.contains("inside"), "{ls}");
}
