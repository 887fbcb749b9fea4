//! Helpers for the end-to-end tests: run the real `capsule` binary, build
//! trees with real metadata, and compare trees entry by entry.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

pub mod chrome;
pub mod page;
pub mod remote;
pub mod s3;

pub use capsule_testkit::{TestEnv, PASSWORD};

/// The capsule binary under test, in environment `env` (see
/// [`capsule_testkit::env`]).
pub fn capsule_cmd(env: &TestEnv) -> Command {
    env.command(env!("CARGO_BIN_EXE_capsule"))
}

/// capsule with `--repo repo`, the test password, and the cache and run
/// records beside the repository.
pub fn capsule_at(repo: &Path) -> Command {
    let mut c = capsule_cmd(&TestEnv::beside(repo).password(PASSWORD));
    c.arg("--repo").arg(repo);
    c
}

/// Runs capsule with `--repo repo` and the test password.
pub fn capsule(repo: &Path, args: &[&str]) -> Output {
    capsule_env(repo, args, &[("CAPSULE_PASSWORD", PASSWORD)])
}

/// Runs capsule with `--repo repo`, the cache and run records beside the
/// repository, and `env` (no password unless it gives one).
pub fn capsule_env(repo: &Path, args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut c = capsule_cmd(&TestEnv::beside(repo));
    c.arg("--repo").arg(repo).args(args);
    for (k, v) in env {
        c.env(k, v);
    }
    c.output().expect("run capsule")
}

/// A finished command's exit code and output, for assertion messages.
pub fn said(o: &Output) -> String {
    format!(
        "exit {:?}: {}{}",
        o.status.code(),
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// Runs capsule and asserts the exit code, returning stdout.
pub fn ok(repo: &Path, args: &[&str]) -> String {
    let o = capsule(repo, args);
    assert!(
        o.status.success(),
        "capsule {args:?} failed with {:?}\nstdout: {}\nstderr: {}",
        o.status.code(),
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

pub fn json(repo: &Path, args: &[&str]) -> serde_json::Value {
    let mut a = vec!["--json"];
    a.extend_from_slice(args);
    let out = ok(repo, &a);
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("bad JSON from {args:?}: {e}\n{out}"))
}

pub fn init(repo: &Path) {
    ok(repo, &["init"]);
}

/// Deterministic pseudo-random bytes.
pub fn noise(n: usize, seed: u64) -> Vec<u8> {
    capsule_testkit::noise(n, seed)
}

pub fn set_times(p: &Path, atime: (i64, i64), mtime: (i64, i64)) {
    let t = rustix::fs::Timestamps {
        last_access: rustix::fs::Timespec {
            tv_sec: atime.0,
            tv_nsec: atime.1 as _,
        },
        last_modification: rustix::fs::Timespec {
            tv_sec: mtime.0,
            tv_nsec: mtime.1 as _,
        },
    };
    rustix::fs::utimensat(
        rustix::fs::CWD,
        p,
        &t,
        rustix::fs::AtFlags::SYMLINK_NOFOLLOW,
    )
    .expect("utimensat");
}

pub fn is_root() -> bool {
    rustix::process::geteuid().is_root()
}

/// Builds the torture tree: every kind of entry and metadata capsule keeps.
/// Returns the number of entries made.
pub fn torture_tree(root: &Path, big_dir_entries: usize) {
    use std::fs;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    fs::create_dir_all(root).unwrap();
    let w = |p: &str, data: &[u8]| {
        let path = root.join(p);
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::write(&path, data).unwrap();
        path
    };
    w("empty", b"");
    w("small.txt", b"hello capsule\n");
    w(
        "text/lorem.txt",
        &b"lorem ipsum dolor sit amet ".repeat(50_000),
    );
    // Multi-chunk file with internal repetition (dedup within and across files).
    let big = noise(5 << 20, 1);
    let mut bigger = big.clone();
    bigger.extend_from_slice(&big);
    w("data/random.bin", &big);
    w("data/twice.bin", &bigger);
    w("data/unicode-é-名前.txt", "ünïcødé\n".as_bytes());
    // Names that are not UTF-8.
    let bad = root.join(OsStr::from_bytes(b"latin1-\xe9t\xe9"));
    fs::write(&bad, b"not utf-8 name").unwrap();
    let bad_dir = root.join(OsStr::from_bytes(b"dir-\xff\xfe"));
    fs::create_dir(&bad_dir).unwrap();
    fs::write(bad_dir.join(OsStr::from_bytes(b"\x01\x02ctl")), b"x").unwrap();
    // Modes.
    let m = w("modes/private", b"secret");
    fs::set_permissions(&m, fs::Permissions::from_mode(0o600)).unwrap();
    let m = w("modes/exec.sh", b"#!/bin/sh\n");
    fs::set_permissions(&m, fs::Permissions::from_mode(0o755)).unwrap();
    let m = w("modes/setuid", b"x");
    fs::set_permissions(&m, fs::Permissions::from_mode(0o4755)).unwrap();
    let d = root.join("modes/sticky");
    fs::create_dir(&d).unwrap();
    fs::set_permissions(&d, fs::Permissions::from_mode(0o1777)).unwrap();
    let ro = root.join("modes/readonly-dir");
    fs::create_dir(&ro).unwrap();
    fs::write(ro.join("inside"), b"in a read-only dir").unwrap();
    // Owners (only root can set them).
    let o = w("owners/other", b"owned by 1234:5678");
    if is_root() {
        std::os::unix::fs::lchown(&o, Some(1234), Some(5678)).unwrap();
    }
    // Symlinks: relative, absolute, dangling, to a directory.
    std::os::unix::fs::symlink("../small.txt", root.join("text/rel-link")).unwrap();
    std::os::unix::fs::symlink("/etc/hostname", root.join("abs-link")).unwrap();
    std::os::unix::fs::symlink("does/not/exist", root.join("dangling")).unwrap();
    std::os::unix::fs::symlink("data", root.join("dir-link")).unwrap();
    if is_root() {
        std::os::unix::fs::lchown(root.join("dangling"), Some(42), Some(43)).unwrap();
    }
    // Hard links, within and across directories.
    let h = w("links/a", b"hard linked content");
    fs::hard_link(&h, root.join("links/b")).unwrap();
    fs::create_dir_all(root.join("links/sub")).unwrap();
    fs::hard_link(&h, root.join("links/sub/c")).unwrap();
    // Sparse files: holes at the start, middle and end.
    let sp = root.join("sparse/holey");
    fs::create_dir_all(sp.parent().unwrap()).unwrap();
    {
        use std::os::unix::fs::FileExt;
        let f = fs::File::create(&sp).unwrap();
        f.write_all_at(b"middle data", 20 << 20).unwrap();
        f.write_all_at(&noise(100_000, 9), 40 << 20).unwrap();
        f.set_len(64 << 20).unwrap();
    }
    fs::File::create(root.join("sparse/all-hole"))
        .unwrap()
        .set_len(8 << 20)
        .unwrap();
    // FIFO.
    rustix::fs::mknodat(
        rustix::fs::CWD,
        root.join("fifo"),
        rustix::fs::FileType::Fifo,
        rustix::fs::Mode::from_raw_mode(0o640),
        0,
    )
    .unwrap();
    // A character device (like /dev/null), when we may create one.
    if is_root() {
        rustix::fs::mknodat(
            rustix::fs::CWD,
            root.join("chardev"),
            rustix::fs::FileType::CharacterDevice,
            rustix::fs::Mode::from_raw_mode(0o620),
            rustix::fs::makedev(1, 3),
        )
        .unwrap();
    }
    // xattrs on a file and a directory.
    let x = w("xattr/file", b"with attributes");
    rustix::fs::lsetxattr(
        &x,
        "user.capsule.test",
        b"value \x00 binary",
        rustix::fs::XattrFlags::empty(),
    )
    .unwrap();
    rustix::fs::lsetxattr(&x, "user.empty", b"", rustix::fs::XattrFlags::empty()).unwrap();
    rustix::fs::lsetxattr(
        &x,
        "user.big",
        &noise(3000, 4),
        rustix::fs::XattrFlags::empty(),
    )
    .unwrap();
    rustix::fs::lsetxattr(
        root.join("xattr"),
        "user.on-dir",
        b"d",
        rustix::fs::XattrFlags::empty(),
    )
    .unwrap();
    // A path of about 4,000 bytes.
    let mut long = root.join("long");
    let seg = "L".repeat(205);
    for i in 0..19 {
        long = long.join(format!("{i:02}{seg}"));
    }
    fs::create_dir_all(&long).unwrap();
    fs::write(long.join("deep-file"), b"deep").unwrap();
    // Relative length ~3,970 bytes: with the restore target's prefix the
    // absolute path still fits PATH_MAX (4,096).
    assert!(long.join("deep-file").as_os_str().len() - root.as_os_str().len() >= 3950);
    // A directory with many entries.
    let many = root.join("many");
    fs::create_dir(&many).unwrap();
    for i in 0..big_dir_entries {
        fs::write(
            many.join(format!("f{i:06}")),
            if i % 100 == 0 {
                format!("{i}")
            } else {
                String::new()
            },
        )
        .unwrap();
    }
    // Times with nanoseconds on everything, set last and bottom-up. atime
    // newer than mtime and recent, so relatime never updates it on read.
    let mut all = Vec::new();
    collect(root, &mut all);
    all.sort_by_key(|p| std::cmp::Reverse(p.as_os_str().len()));
    for (i, p) in all.iter().enumerate() {
        let i = i as i64;
        set_times(
            p,
            (now - 3600, 123_456_789 + i),
            (now - 86_400 * 3 - i, 987_654_321 - i),
        );
    }
    fs::set_permissions(&ro, fs::Permissions::from_mode(0o555)).unwrap();
    set_times(&ro, (now - 3600, 5), (now - 86_400 * 4, 6));
    set_times(root, (now - 3600, 7), (now - 86_400 * 4, 8));
}

fn collect(p: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(p).unwrap() {
        let e = e.unwrap();
        let path = e.path();
        if e.file_type().unwrap().is_dir() {
            collect(&path, out);
        }
        out.push(path);
    }
}

/// Everything about an entry that restore must reproduce.
#[derive(Debug, PartialEq, Eq)]
pub struct Meta {
    pub kind: &'static str,
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub size: u64,
    pub mtime: (i64, i64),
    pub atime: Option<(i64, i64)>,
    pub target: Option<Vec<u8>>,
    /// Device number of character and block devices.
    pub rdev: u64,
    pub xattrs: Vec<(Vec<u8>, Vec<u8>)>,
    /// First path (in walk order) sharing this inode, for hard links.
    pub link_group: Option<Vec<u8>>,
    /// Allocated bytes are less than the size (holes present).
    pub sparse: bool,
}

fn xattrs(p: &Path) -> Vec<(Vec<u8>, Vec<u8>)> {
    let mut buf = vec![0u8; 65536];
    let n = match rustix::fs::llistxattr(p, &mut buf[..]) {
        Ok(n) => n,
        Err(_) => return Vec::new(),
    };
    let mut out = Vec::new();
    for name in buf[..n].split(|&b| b == 0).filter(|s| !s.is_empty()) {
        let mut v = vec![0u8; 65536];
        let l = rustix::fs::lgetxattr(p, name, &mut v[..]).unwrap();
        v.truncate(l);
        out.push((name.to_vec(), v));
    }
    out.sort();
    out
}

/// Metadata of every entry under `root`, keyed by relative path bytes.
/// Read before any content is read, so atimes are as restore left them.
pub fn snapshot_meta(root: &Path, with_atime: bool) -> BTreeMap<Vec<u8>, Meta> {
    let mut out = BTreeMap::new();
    let mut inodes: BTreeMap<u64, Vec<u8>> = BTreeMap::new();
    walk_meta(root, root, with_atime, &mut out, &mut inodes);
    out
}

fn walk_meta(
    root: &Path,
    dir: &Path,
    with_atime: bool,
    out: &mut BTreeMap<Vec<u8>, Meta>,
    inodes: &mut BTreeMap<u64, Vec<u8>>,
) {
    let mut names: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    names.sort_by(|a, b| a.as_bytes().cmp(b.as_bytes()));
    for n in names {
        let p = dir.join(&n);
        let m = std::fs::symlink_metadata(&p).unwrap();
        let rel = p
            .strip_prefix(root)
            .unwrap()
            .as_os_str()
            .as_bytes()
            .to_vec();
        let ft = m.file_type();
        use std::os::unix::fs::FileTypeExt;
        let kind = if ft.is_file() {
            "file"
        } else if ft.is_dir() {
            "dir"
        } else if ft.is_symlink() {
            "symlink"
        } else if ft.is_fifo() {
            "fifo"
        } else if ft.is_char_device() {
            "chardev"
        } else {
            "other"
        };
        let link_group = (kind == "file" && m.nlink() > 1)
            .then(|| inodes.entry(m.ino()).or_insert(rel.clone()).clone());
        out.insert(
            rel,
            Meta {
                kind,
                mode: m.mode() & 0o7777,
                uid: m.uid(),
                gid: m.gid(),
                size: if kind == "dir" { 0 } else { m.size() },
                mtime: (m.mtime(), m.mtime_nsec()),
                // Reading a symlink updates its atime on Linux, so the source's
                // changes under the backup itself; compare the rest.
                atime: (with_atime && kind != "symlink").then_some((m.atime(), m.atime_nsec())),
                target: (kind == "symlink").then(|| {
                    std::fs::read_link(&p)
                        .unwrap()
                        .as_os_str()
                        .as_bytes()
                        .to_vec()
                }),
                rdev: if kind == "chardev" { m.rdev() } else { 0 },
                xattrs: xattrs(&p),
                link_group,
                sparse: kind == "file" && m.blocks() * 512 + 4096 <= m.size(),
            },
        );
        if kind == "dir" {
            walk_meta(root, &p, with_atime, out, inodes);
        }
    }
}

/// Asserts two trees are equal entry for entry, metadata and content.
pub fn assert_same_tree(a: &Path, b: &Path, with_atime: bool) {
    let ma = snapshot_meta(a, with_atime);
    let mb = snapshot_meta(b, with_atime);
    let ka: Vec<_> = ma.keys().collect();
    let kb: Vec<_> = mb.keys().collect();
    if ka != kb {
        let only_a: Vec<_> = ma
            .keys()
            .filter(|k| !mb.contains_key(*k))
            .map(|k| String::from_utf8_lossy(k))
            .take(10)
            .collect();
        let only_b: Vec<_> = mb
            .keys()
            .filter(|k| !ma.contains_key(*k))
            .map(|k| String::from_utf8_lossy(k))
            .take(10)
            .collect();
        panic!("entry sets differ: only in source {only_a:?}, only in restore {only_b:?}");
    }
    for (k, x) in &ma {
        let y = &mb[k];
        assert_eq!(x, y, "metadata differs for {}", String::from_utf8_lossy(k));
        if x.kind == "file" {
            let pa = a.join(OsStr::from_bytes(k));
            let pb = b.join(OsStr::from_bytes(k));
            assert!(
                std::fs::read(&pa).unwrap() == std::fs::read(&pb).unwrap(),
                "content differs for {}",
                pa.display()
            );
        }
    }
}

/// The directory inside a restore target that corresponds to `src`.
pub fn restored(target: &Path, src: &Path) -> PathBuf {
    target.join(src.strip_prefix("/").unwrap())
}

/// Files under `dir` (recursively).
pub fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut v = Vec::new();
    collect(dir, &mut v);
    v.retain(|p| p.is_file());
    v.sort();
    v
}

/// The journal of landed-but-unindexed packs that a backup keeps in its
/// cache directory (one subdirectory per repository ID), if there is one.
pub fn journal_in(cache_dir: &Path) -> Option<PathBuf> {
    std::fs::read_dir(cache_dir)
        .ok()?
        .filter_map(|e| e.ok())
        .map(|e| e.path().join("unindexed-packs"))
        .find(|p| p.exists())
}

/// Runs capsule with arguments and extra environment variables.
pub type CapsuleRunner<'a> = dyn Fn(&[&str], &[(&str, String)]) -> Output + Sync + 'a;

/// Eight clients (own source, own cache, own host name, as eight machines
/// would be) back up into one repository at once, `rounds` times each,
/// while `check --read-data` runs beside them in a loop and a ninth client
/// forgets all but the newest snapshot of each host and prunes, again and
/// again. Afterwards no snapshot is lost (each one made is live or was
/// forgotten by name), the repository is clean, and every live snapshot
/// restores what its client backed up. `run` runs capsule against the
/// repository with extra environment. `CAPSULE_SOAK_ROUNDS` lengthens it
/// (docs/RELIABILITY.md has the hour-long run).
pub fn soak(work: &Path, run: &CapsuleRunner<'_>) {
    use std::collections::BTreeSet;
    use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
    use std::sync::Mutex;
    let rounds: usize = std::env::var("CAPSULE_SOAK_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2);
    let clients = 8;
    let own = |i: usize| noise(300_000 + 1000 * i, 1000 + i as u64);
    let srcs: Vec<PathBuf> = (0..clients)
        .map(|i| {
            let s = work.join(format!("client{i}"));
            std::fs::create_dir_all(s.join("d")).unwrap();
            // Shared content across clients (dedup races) and unique files.
            std::fs::write(s.join("shared"), noise(400_000, 42)).unwrap();
            std::fs::write(s.join(format!("d/own{i}")), own(i)).unwrap();
            s
        })
        .collect();
    let o = run(&["init"], &[]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let stop = AtomicBool::new(false);
    let failures: Mutex<Vec<String>> = Mutex::new(Vec::new());
    let made: Mutex<BTreeSet<String>> = Mutex::new(BTreeSet::new());
    let forgotten: Mutex<BTreeSet<String>> = Mutex::new(BTreeSet::new());
    let fail = |what: String, o: &Output| {
        failures.lock().unwrap().push(format!(
            "{what} exited {:?}: {}",
            o.status.code(),
            String::from_utf8_lossy(&o.stderr)
        ));
    };
    std::thread::scope(|s| {
        let checker = s.spawn(|| {
            let mut checks = 0;
            // Bounded: stops when the clients are done, or after 200 checks.
            while !stop.load(SeqCst) && checks < 200 {
                let o = run(&["--no-cache", "check", "--read-data"], &[]);
                checks += 1;
                if !o.status.success() {
                    fail("check during backups and prunes".into(), &o);
                }
            }
            checks
        });
        let pruner = s.spawn(|| {
            let mut prunes = 0;
            // Bounded like the checker. Its own cache, as another machine.
            let cache = work.join("cache-pruner");
            let env = [("CAPSULE_CACHE_DIR", cache.display().to_string())];
            while !stop.load(SeqCst) && prunes < 200 {
                let args = [
                    "--json",
                    "forget",
                    "--keep-last",
                    "1",
                    "--group-by",
                    "host",
                    "--prune",
                ];
                let o = run(&args, &env);
                prunes += 1;
                if !o.status.success() {
                    fail("forget --prune during backups".into(), &o);
                    continue;
                }
                let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
                let gone = v["forget"]["forgotten"]
                    .as_array()
                    .cloned()
                    .unwrap_or_default();
                forgotten
                    .lock()
                    .unwrap()
                    .extend(gone.iter().map(|i| i.as_str().unwrap().to_string()));
            }
            prunes
        });
        let handles: Vec<_> = (0..clients)
            .map(|i| {
                let (src, fail, made) = (&srcs[i], &fail, &made);
                s.spawn(move || {
                    let cache = work.join(format!("cache{i}"));
                    let env = [
                        ("CAPSULE_CACHE_DIR", cache.display().to_string()),
                        (
                            "CAPSULE_STATE_DIR",
                            cache.join("state").display().to_string(),
                        ),
                    ];
                    for round in 0..rounds {
                        std::fs::write(src.join("round"), format!("{i} {round}")).unwrap();
                        let host = format!("client{i}");
                        let args = ["--json", "backup", "--host", &host, src.to_str().unwrap()];
                        let o = run(&args, &env);
                        if !o.status.success() {
                            fail(format!("client {i} round {round}"), &o);
                            continue;
                        }
                        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
                        made.lock()
                            .unwrap()
                            .insert(v["snapshot_id"].as_str().unwrap().to_string());
                    }
                })
            })
            .collect();
        for h in handles {
            h.join().unwrap();
        }
        stop.store(true, SeqCst);
        let checks = checker.join().unwrap();
        let prunes = pruner.join().unwrap();
        eprintln!(
            "soak: {clients} clients x {rounds} rounds, {checks} concurrent checks, {prunes} concurrent forget --prune runs"
        );
    });
    let failures = failures.into_inner().unwrap();
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    // The marks the last prunes made are swept now that nothing runs.
    let mut quiet = Vec::new();
    for _ in 0..2 {
        let o = run(&["--json", "prune"], &[]);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        quiet.push(String::from_utf8_lossy(&o.stdout).into_owned());
    }
    let o = run(&["--json", "snapshots"], &[]);
    let snaps: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let snaps = snaps.as_array().unwrap();
    let live: BTreeSet<String> = snaps
        .iter()
        .map(|s| s["id"].as_str().unwrap().to_string())
        .collect();
    let (made, forgotten) = (made.into_inner().unwrap(), forgotten.into_inner().unwrap());
    assert_eq!(made.len(), clients * rounds);
    let accounted: BTreeSet<String> = live.union(&forgotten).cloned().collect();
    assert_eq!(accounted, made, "snapshots lost, or forgotten twice");
    assert!(live.is_disjoint(&forgotten), "a forgotten snapshot is live");
    let o = run(&["--no-cache", "--json", "check", "--read-data"], &[]);
    assert!(
        o.status.success(),
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(
        v["report"]["packs_marked_for_deletion"], 0,
        "{v}\nthe two prunes after the soak: {quiet:?}"
    );
    assert!(
        v["report"]["unindexed_packs"]
            .as_array()
            .unwrap()
            .is_empty(),
        "{v}"
    );
    for (i, src) in srcs.iter().enumerate() {
        let mine: Vec<&serde_json::Value> = snaps
            .iter()
            .filter(|s| s["snapshot"]["hostname"] == format!("client{i}"))
            .collect();
        assert!(!mine.is_empty(), "client {i} has no snapshot left");
        for s in mine {
            let id = s["id"].as_str().unwrap();
            let target = work.join(format!("restore-{id}"));
            let o = run(&["restore", id, "--target", target.to_str().unwrap()], &[]);
            assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
            let got = restored(&target, src);
            assert_eq!(
                std::fs::read(got.join("shared")).unwrap(),
                noise(400_000, 42)
            );
            assert_eq!(
                std::fs::read(got.join(format!("d/own{i}"))).unwrap(),
                own(i)
            );
            let round = std::fs::read_to_string(got.join("round")).unwrap();
            let r: usize = round
                .strip_prefix(&format!("{i} "))
                .unwrap()
                .parse()
                .unwrap();
            assert!(r < rounds, "{round}");
        }
    }
}

/// A loop-mounted file system (ext4 unless said), unmounted on drop. `None` (a skip)
/// when not root, unless the test command requires everything to run.
pub struct LoopFs {
    pub dir: PathBuf,
    _img: tempfile::TempDir,
}

impl LoopFs {
    pub fn new(mib: u32) -> Option<LoopFs> {
        Self::of("ext4", mib)
    }

    /// A loop-mounted file system of type `fstype` (ext4 or btrfs).
    pub fn of(fstype: &str, mib: u32) -> Option<LoopFs> {
        if !is_root() {
            assert!(
                std::env::var("CAPSULE_REQUIRE_SERVERS").as_deref() != Ok("1"),
                "loop mounts need root"
            );
            eprintln!("skipped: loop mounts need root");
            return None;
        }
        let img = tempfile::tempdir().unwrap();
        let file = img.path().join("fs.img");
        let dir = img.path().join("mnt");
        std::fs::create_dir(&dir).unwrap();
        let run = |c: &mut Command| assert!(c.status().unwrap().success(), "{c:?}");
        run(Command::new("truncate").arg(format!("-s{mib}M")).arg(&file));
        match fstype {
            "btrfs" => run(Command::new("mkfs.btrfs").args(["-q", "-f"]).arg(&file)),
            _ => run(Command::new("mkfs.ext4")
                .args(["-q", "-F", "-m", "0"])
                .arg(&file)),
        }
        run(Command::new("mount")
            .args(["-o", "loop"])
            .arg(&file)
            .arg(&dir));
        Some(LoopFs { dir, _img: img })
    }
}

impl Drop for LoopFs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.dir).status();
    }
}

/// Plants what interrupted writes leave in a repository directory (local,
/// or the directory behind an SMB or SFTP share): two `.tmp-*` files two
/// hours old and one just written, owned like the directory they are in so
/// the server may remove them. Returns (old, fresh) paths.
pub fn plant_temporaries(repo_dir: &Path) -> (Vec<PathBuf>, PathBuf) {
    use std::os::unix::fs::MetadataExt;
    let two_hours_ago = std::time::SystemTime::now() - std::time::Duration::from_secs(7200);
    let mut old = Vec::new();
    let data_dir = std::fs::read_dir(repo_dir.join("data"))
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .find(|p| p.is_dir())
        .expect("a data subdirectory");
    let plant = |dir: &Path, name: &str, when: Option<std::time::SystemTime>| {
        let p = dir.join(name);
        let f = std::fs::File::create(&p).unwrap();
        std::io::Write::write_all(&mut &f, &noise(10_000, 7)).unwrap();
        if let Some(t) = when {
            f.set_modified(t).unwrap();
        }
        let m = std::fs::metadata(dir).unwrap();
        std::os::unix::fs::chown(&p, Some(m.uid()), Some(m.gid())).unwrap();
        p
    };
    old.push(plant(&data_dir, ".tmp-cut1", Some(two_hours_ago)));
    old.push(plant(
        &repo_dir.join("index"),
        ".tmp-cut2",
        Some(two_hours_ago),
    ));
    let fresh = plant(&data_dir, ".tmp-inflight", None);
    (old, fresh)
}

/// Headless Chromium, or None where it is missing and not required
/// (scripts/servers.sh installs it; with CAPSULE_REQUIRE_SERVERS=1 a
/// missing one fails the test).
pub fn chromium() -> Option<PathBuf> {
    for c in ["chromium", "chromium-browser", "google-chrome"] {
        if let Ok(o) = Command::new("which").arg(c).output() {
            if o.status.success() {
                return Some(PathBuf::from(String::from_utf8_lossy(&o.stdout).trim()));
            }
        }
    }
    assert!(
        std::env::var("CAPSULE_REQUIRE_SERVERS").as_deref() != Ok("1"),
        "chromium is not installed (scripts/servers.sh installs it)"
    );
    eprintln!("skipped: no chromium");
    None
}

/// The test clock: an hour, a day, and a Monday noon to count from.
pub const H: i64 = 3600;
/// A day of the test clock.
pub const D: i64 = 86_400;

/// Monday 2026-11-23 12:00 UTC.
pub const NOW: i64 = 1_795_435_200;

/// capsule at test time `t` (Unix seconds), in UTC, with the password.
pub fn at(repo: &Path, t: i64, args: &[&str]) -> std::process::Output {
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

/// [`at`], asserting success; stdout.
pub fn ok_at(repo: &Path, t: i64, args: &[&str]) -> String {
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
pub fn snapshot_times(repo: &Path, forgotten: bool) -> Vec<(String, i64)> {
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

/// Pack objects on disk (data and tree).
pub fn pack_files(repo: &Path) -> BTreeSet<std::path::PathBuf> {
    files_under(repo)
        .into_iter()
        .filter(|p| p.starts_with(repo.join("data")) || p.starts_with(repo.join("tree")))
        .collect()
}

/// Bytes of the files named.
pub fn dir_bytes(paths: &BTreeSet<std::path::PathBuf>) -> u64 {
    paths
        .iter()
        .map(|p| std::fs::metadata(p).unwrap().len())
        .sum()
}

/// A small tmpfs, unmounted on drop.
pub struct SmallFs {
    /// Its mount point.
    pub dir: PathBuf,
    _t: tempfile::TempDir,
}

impl SmallFs {
    /// A tmpfs of `size` (`3m`), or None (skipped) when not root.
    pub fn new(size: &str) -> Option<SmallFs> {
        if !is_root() {
            assert!(
                std::env::var_os("CAPSULE_REQUIRE_SERVERS").is_none(),
                "a test of a full disk needs root (a tmpfs mount)"
            );
            eprintln!("skipped: a tmpfs mount needs root");
            return None;
        }
        let t = tempfile::tempdir().unwrap();
        let dir = t.path().join("mnt");
        std::fs::create_dir(&dir).unwrap();
        let st = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(&dir)
            .status()
            .unwrap();
        assert!(st.success(), "mount tmpfs");
        Some(SmallFs { dir, _t: t })
    }
}

impl Drop for SmallFs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.dir).status();
    }
}
