//! Many machines, one distributed store: clients backing up at once into
//! one repository on MinIO in distributed mode (4 nodes × 2 drives,
//! erasure-coded, each node in a network namespace of its own:
//! scripts/cluster.sh, started by scripts/servers.sh as root), each client
//! talking to its own node, with a node killed and brought back, a drive
//! wiped, and forget + prune running beside them. Nothing may be lost.
//!
//! The 32-client version with its figures is `bench/cluster.sh`.

// The command-line suite runs on Linux, against real servers, btrfs,
// fanotify and network namespaces; the macOS build checks the libraries.
#![cfg(target_os = "linux")]
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::sync::Mutex;
use std::time::Duration;

use capsule_testkit::server_env as env;
use common::s3::{Creds, S3};
use common::said;
use common::{capsule_cmd, noise, TestEnv, NOW, PASSWORD};

/// The store is one for every test here: a test that kills, restarts or
/// wipes nodes runs alone, the others together. Run beside the node kills,
/// the append-only test's backup waited 63 s for its node and failed.
static STORE: std::sync::RwLock<()> = std::sync::RwLock::new(());

/// A test's turn on the store, held while the test runs.
#[allow(dead_code)] // held, never read
enum Turn {
    Shared(std::sync::RwLockReadGuard<'static, ()>),
    Alone(std::sync::RwLockWriteGuard<'static, ()>),
}

/// The distributed store `scripts/servers.sh` started.
struct Cluster {
    _turn: Turn,
    /// `ADDR:PORT` of each node.
    nodes: Vec<String>,
    /// The directory `scripts/cluster.sh` keeps it in.
    dir: PathBuf,
    bucket: String,
    key: String,
    secret: String,
}

impl Cluster {
    /// The store, beside the other tests that leave its nodes alone.
    fn new() -> Option<Cluster> {
        Self::with(false)
    }

    /// The store, for a test that kills, restarts or wipes nodes.
    fn alone() -> Option<Cluster> {
        Self::with(true)
    }

    fn with(alone: bool) -> Option<Cluster> {
        let url = env("CAPSULE_TEST_CLUSTER")?;
        // A test that failed holding its turn leaves the store as it is.
        let turn = if alone {
            Turn::Alone(STORE.write().unwrap_or_else(|p| p.into_inner()))
        } else {
            Turn::Shared(STORE.read().unwrap_or_else(|p| p.into_inner()))
        };
        let nodes = env("CAPSULE_TEST_CLUSTER_NODES")?
            .split_whitespace()
            .map(str::to_string)
            .collect();
        Some(Cluster {
            _turn: turn,
            nodes,
            dir: PathBuf::from(env("CAPSULE_TEST_CLUSTER_DIR")?),
            bucket: url.rsplit('/').next()?.to_string(),
            key: env("CAPSULE_TEST_CLUSTER_KEY")?,
            secret: env("CAPSULE_TEST_CLUSTER_SECRET")?,
        })
    }

    /// The repository under `prefix`, reached through node `node`.
    fn url(&self, node: usize, prefix: &str) -> String {
        let n = &self.nodes[node % self.nodes.len()];
        format!("s3+http://{n}/{}/{prefix}", self.bucket)
    }

    /// `scripts/cluster.sh ARGS DIR`: kill, restart or wipe a node.
    fn ctl(&self, args: &[&str]) {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/cluster.sh");
        let o = Command::new(script)
            .args(args)
            .arg(&self.dir)
            .output()
            .unwrap();
        assert!(
            o.status.success(),
            "cluster.sh {args:?}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
    }

    /// One machine's environment: its own cache and run records.
    fn machine(&self, work: &Path, name: &str, clock: &Path) -> TestEnv {
        let cache = work.join(format!("cache-{name}"));
        TestEnv::bare()
            .cache(&cache)
            .state(cache.join("state"))
            .password(PASSWORD)
            .clock(format!("@{}", clock.display()))
            .var("AWS_ACCESS_KEY_ID", &self.key)
            .var("AWS_SECRET_ACCESS_KEY", &self.secret)
    }

    /// Requests to node 1 signed with the cluster's own (admin) key.
    fn admin(&self) -> S3 {
        S3 {
            endpoint: self.nodes[0].clone(),
            creds: Creds {
                key: self.key.clone(),
                secret: self.secret.clone(),
                token: None,
            },
        }
    }

    fn signed(&self, service: &str, method: &str, path: &str, extra: &[&str]) -> String {
        self.admin().signed(service, method, path, extra)
    }

    /// Temporary credentials whose policy allows `actions` (JSON strings)
    /// on the test bucket and nothing elsewhere.
    fn key_for_test_bucket_only(&self, actions: &str) -> Vec<(String, String)> {
        self.admin().key_for(&self.bucket, actions).vars()
    }

    /// Removes what an earlier run left under `prefix`.
    fn wipe(&self, prefix: &str) {
        std::env::set_var("AWS_ACCESS_KEY_ID", &self.key);
        std::env::set_var("AWS_SECRET_ACCESS_KEY", &self.secret);
        let dest = capsule_net::Destination::parse(&self.url(0, prefix)).unwrap();
        let b = capsule_net::connect(&dest, &capsule_net::Options::default()).unwrap();
        for o in b.list("").unwrap() {
            b.delete(&o.name).unwrap();
        }
    }
}

/// A repository of a test's own under `prefix` in the test bucket (what an
/// earlier run left there removed), with a scratch directory and a test
/// clock the machines share.
struct Repo<'a> {
    cluster: &'a Cluster,
    prefix: &'static str,
    work: tempfile::TempDir,
    clock: PathBuf,
}

impl<'a> Repo<'a> {
    fn new(cluster: &'a Cluster, prefix: &'static str) -> Repo<'a> {
        cluster.wipe(prefix);
        let work = tempfile::tempdir().unwrap();
        let clock = work.path().join("clock");
        std::fs::write(&clock, NOW.to_string()).unwrap();
        Repo {
            cluster,
            prefix,
            work,
            clock,
        }
    }

    fn work(&self) -> &Path {
        self.work.path()
    }

    /// Sets the shared clock.
    fn at(&self, t: i64) {
        std::fs::write(&self.clock, t.to_string()).unwrap();
    }

    /// Machine `name`'s environment.
    fn machine(&self, name: &str) -> TestEnv {
        self.cluster.machine(self.work(), name, &self.clock)
    }

    /// capsule in `env` (a machine's), through node `node`.
    fn command(&self, env: &TestEnv, node: usize) -> Command {
        let mut c = capsule_cmd(env);
        c.arg("--repo").arg(self.cluster.url(node, self.prefix));
        c
    }

    /// Runs capsule `args` as machine `name` through node `node`.
    fn run(&self, node: usize, name: &str, args: &[&str]) -> Output {
        self.command(&self.machine(name), node)
            .args(args)
            .output()
            .unwrap()
    }
}

/// Eight machines, each with its own node, three rounds of backups (most
/// of their data shared), forget + prune in a loop beside them:
/// * before round 2 a node is killed (SIGKILL) and comes back 6 s later:
///   its clients ride it out (they retried, and succeeded);
/// * before round 3 one drive of another node is emptied (a disk
///   replaced), which the store heals;
/// * after the rounds the node is killed again and a run told to wait 3 s
///   for it stops with exit 14; once the node is back the next run
///   completes;
/// * at the end `check --read-data` is clean and every machine's newest
///   snapshot restores equal to its source.
#[test]
fn eight_machines_ride_out_a_lost_node_and_a_wiped_drive_with_prune_beside_them() {
    let Some(c) = Cluster::alone() else { return };
    let repo = Repo::new(&c, "eight-machines");
    let work = repo.work();
    let run = |node: usize, name: &str, args: &[&str]| repo.run(node, name, args);
    let o = run(0, "admin", &["init"]);
    assert!(o.status.success(), "{}", said(&o));

    let machines = 8;
    let srcs: Vec<PathBuf> = (0..machines)
        .map(|i| {
            let s = work.join(format!("machine{i}"));
            std::fs::create_dir_all(s.join("shared")).unwrap();
            // What a household shares (photos, installers), then its own.
            for k in 0..3 {
                std::fs::write(s.join(format!("shared/{k}")), noise(200_000, 42 + k)).unwrap();
            }
            std::fs::write(s.join("own"), noise(150_000 + i, 1000 + i as u64)).unwrap();
            s
        })
        .collect();

    let failures: Mutex<Vec<String>> = Mutex::new(Vec::new());
    let stop = AtomicBool::new(false);
    let lost_node = 1;
    let mut rode_out = 0;
    let mut newest = vec![String::new(); machines];
    std::thread::scope(|s| {
        let pruner = s.spawn(|| {
            // Bounded: ends with the rounds, or after 100 prunes.
            let mut prunes = 0;
            while !stop.load(SeqCst) && prunes < 100 {
                let args = [
                    "--json",
                    "forget",
                    "--keep-last",
                    "2",
                    "--group-by",
                    "host",
                    "--prune",
                ];
                let o = run(3, "pruner", &args);
                prunes += 1;
                if !o.status.success() {
                    failures
                        .lock()
                        .unwrap()
                        .push(format!("prune {prunes}: {}", said(&o)));
                }
            }
            prunes
        });
        for round in 0..3i64 {
            repo.at(NOW + round * 3600);
            for (i, src) in srcs.iter().enumerate() {
                std::fs::write(src.join("round"), format!("{i} {round}")).unwrap();
                let fresh = noise(100_000, (10_000 + 100 * i as i64 + round) as u64);
                std::fs::write(src.join(format!("new{round}")), fresh).unwrap();
            }
            if round == 1 {
                c.ctl(&["kill", &(lost_node + 1).to_string()]);
            }
            if round == 2 {
                c.ctl(&["wipe", "3", "1"]);
            }
            let back = (round == 1).then(|| {
                s.spawn(|| {
                    std::thread::sleep(Duration::from_secs(6));
                    c.ctl(&["restart", &(lost_node + 1).to_string()]);
                })
            });
            let runs: Vec<_> = (0..machines)
                .map(|i| {
                    let src = &srcs[i];
                    let run = &run;
                    s.spawn(move || {
                        let host = format!("machine{i}");
                        let args = ["--json", "backup", "--host", &host, src.to_str().unwrap()];
                        (i, run(i % 4, &host, &args))
                    })
                })
                .collect();
            for r in runs {
                let (i, o) = r.join().unwrap();
                if !o.status.success() {
                    failures
                        .lock()
                        .unwrap()
                        .push(format!("machine {i} round {round}: {}", said(&o)));
                    continue;
                }
                let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
                newest[i] = v["snapshot_id"].as_str().unwrap().to_string();
                if round == 1 && i % 4 == lost_node {
                    // Its node was away when it started: it got through by
                    // retrying, within the ride-out it announces.
                    assert!(v["destination"]["retries"].as_u64().unwrap() > 0, "{v}");
                    assert_eq!(v["destination"]["retry_for_secs"], 60, "{v}");
                    rode_out += 1;
                }
            }
            if let Some(b) = back {
                b.join().unwrap();
            }
        }
        stop.store(true, SeqCst);
        let prunes = pruner.join().unwrap();
        eprintln!("cluster: {machines} machines x 3 rounds, {prunes} prunes beside them");
    });
    let failures = failures.into_inner().unwrap();
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert_eq!(rode_out, 2, "both machines of the lost node rode it out");

    // A node away for longer than a run waits (here told to wait 3 s):
    // the run stops with exit 14 naming the bound, and once the node is
    // back the next run completes.
    let away = lost_node + 1;
    c.ctl(&["kill", &away.to_string()]);
    std::fs::write(srcs[lost_node].join("late"), noise(50_000, 77)).unwrap();
    let host = format!("machine{lost_node}");
    let src = srcs[lost_node].to_str().unwrap();
    let impatient = repo.machine(&host).var("CAPSULE_RETRY_FOR", "3");
    let o = repo
        .command(&impatient, lost_node)
        .args(["backup", "--host", &host, src])
        .output()
        .unwrap();
    c.ctl(&["restart", &away.to_string()]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(14), "{}", said(&o));
    assert!(err.contains("--retry-for") && err.contains("3 s"), "{err}");
    let o = run(
        lost_node,
        &host,
        &["--json", "backup", "--host", &host, src],
    );
    assert!(o.status.success(), "{}", said(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    newest[lost_node] = v["snapshot_id"].as_str().unwrap().to_string();

    // Nothing lost: every pack reads back and authenticates, and each
    // machine's newest snapshot is its source.
    let o = run(0, "admin", &["--no-cache", "check", "--read-data"]);
    assert!(o.status.success(), "{}", said(&o));
    for (i, src) in srcs.iter().enumerate() {
        let target = work.join(format!("restored{i}"));
        let o = run(
            (i + 1) % 4,
            "admin",
            &["restore", &newest[i], "--target", target.to_str().unwrap()],
        );
        assert!(o.status.success(), "{}", said(&o));
        common::assert_same_tree(src, &common::restored(&target, src), false);
    }
}

/// A repository in a bucket of its own, made with the admin key, and a
/// machine to use it.
fn own_bucket(c: &Cluster, bucket: &str, work: &Path) -> (String, TestEnv) {
    // MinIO's force-delete empties it, so an earlier run's leftovers go.
    c.signed(
        "s3",
        "DELETE",
        bucket,
        &["-H", "x-minio-force-delete: true"],
    );
    c.signed("s3", "PUT", bucket, &[]);
    let url = format!("s3+http://{}/{bucket}/repo", c.nodes[0]);
    let clock = work.join("clock");
    std::fs::write(&clock, NOW.to_string()).unwrap();
    let machine = c.machine(work, "m", &clock);
    let o = capsule_cmd(&machine)
        .args(["--repo", &url, "init"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", said(&o));
    (url, machine)
}

/// Credentials for one bucket used against another: the store's refusal
/// is named, with the bucket, and the exit code says "access".
#[test]
fn a_key_for_another_bucket_is_a_clear_error() {
    let Some(c) = Cluster::new() else { return };
    let work = tempfile::tempdir().unwrap();
    let (url, machine) = own_bucket(&c, "capsule-other", work.path());
    let mut cmd = capsule_cmd(&machine);
    for (k, v) in c.key_for_test_bucket_only(r#""s3:*""#) {
        cmd.env(k, v);
    }
    let o = cmd.args(["--repo", &url, "snapshots"]).output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(15), "{}", said(&o));
    assert!(
        err.contains("refuses these credentials for bucket capsule-other (AccessDenied)"),
        "{err}"
    );
    assert!(
        !err.contains("<Error>"),
        "the store's XML is said, not quoted: {err}"
    );
}

/// A bucket deleted under a repository: the run stops with the missing
/// bucket named, not with "repository damaged" or "object missing".
#[test]
fn a_deleted_bucket_is_a_clear_error() {
    let Some(c) = Cluster::new() else { return };
    let work = tempfile::tempdir().unwrap();
    let (url, machine) = own_bucket(&c, "capsule-gone", work.path());
    let src = work.path().join("src");
    std::fs::create_dir_all(&src).unwrap();
    std::fs::write(src.join("f"), noise(100_000, 5)).unwrap();
    c.signed(
        "s3",
        "DELETE",
        "capsule-gone",
        &["-H", "x-minio-force-delete: true"],
    );
    let o = capsule_cmd(&machine)
        .args(["--repo", &url, "backup", src.to_str().unwrap()])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(17), "{}", said(&o));
    assert!(
        err.contains("NoSuchBucket") && err.contains("capsule-gone"),
        "{err}"
    );
}

/// A machine whose clock is hours off (libfaketime moves it for this one
/// process): the store refuses its signatures, and the error says it is
/// the clock, not the key.
#[test]
fn a_clock_hours_off_is_a_clear_error() {
    let Some(c) = Cluster::new() else { return };
    let Some(faketime) = which("faketime") else {
        assert!(
            std::env::var("CAPSULE_REQUIRE_SERVERS").as_deref() != Ok("1"),
            "faketime is missing: scripts/servers.sh installs it"
        );
        eprintln!("skipped: no faketime (scripts/servers.sh installs it)");
        return;
    };
    let work = tempfile::tempdir().unwrap();
    let (url, machine) = own_bucket(&c, "capsule-skew", work.path());
    let mut cmd = Command::new(faketime);
    machine.apply(&mut cmd);
    let o = cmd
        .args([
            "-f",
            "+3h",
            env!("CARGO_BIN_EXE_capsule"),
            "--repo",
            &url,
            "snapshots",
        ])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(15), "{}", said(&o));
    assert!(
        err.contains("RequestTimeTooSkewed") && err.contains("clock"),
        "{err}"
    );
    // The same machine with its clock right reads the repository.
    let o = capsule_cmd(&machine)
        .args(["--repo", &url, "snapshots"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", said(&o));
}

fn which(program: &str) -> Option<PathBuf> {
    std::env::var_os("PATH")?
        .to_str()?
        .split(':')
        .map(|d| Path::new(d).join(program))
        .find(|p| p.is_file())
}

/// A client whose key may add but not delete (an S3 policy without
/// `s3:DeleteObject`) backs up, lists and restores, and says it runs
/// append-only; forget and prune from it are refused before they change
/// anything, and the admin's key still does both.
#[test]
fn an_append_only_client_backs_up_and_restores_but_cannot_forget_or_prune() {
    let Some(c) = Cluster::new() else { return };
    let repo = Repo::new(&c, "append-only");
    let work = repo.work();
    let admin = |args: &[&str]| repo.run(0, "admin", args);
    let creds = c.key_for_test_bucket_only(
        r#""s3:GetObject","s3:PutObject","s3:ListBucket","s3:GetBucketLocation""#,
    );
    let mut laptop = repo.machine("laptop");
    for (k, v) in &creds {
        laptop = laptop.var(k, v);
    }
    let client = |args: &[&str]| repo.command(&laptop, 1).args(args).output().unwrap();
    let o = admin(&["init"]);
    assert!(o.status.success(), "{}", said(&o));
    let src = work.join("src");
    std::fs::create_dir_all(&src).unwrap();
    let mut ids = Vec::new();
    for round in 0..2u64 {
        std::fs::write(src.join(format!("f{round}")), noise(200_000, 60 + round)).unwrap();
        let o = client(&["--json", "backup", src.to_str().unwrap()]);
        assert!(o.status.success(), "{}", said(&o));
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        assert_eq!(v["append_only"], true, "{v}");
        ids.push(v["snapshot_id"].as_str().unwrap().to_string());
    }
    let o = client(&["backup", src.to_str().unwrap()]);
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{}", said(&o));
    assert_eq!(text.matches("append-only").count(), 1, "said once: {text}");

    let target = work.join("restored");
    let o = client(&["restore", &ids[1], "--target", target.to_str().unwrap()]);
    assert!(o.status.success(), "{}", said(&o));
    common::assert_same_tree(&src, &common::restored(&target, &src), false);

    for args in [
        &["forget", &ids[0]][..],
        &["prune"],
        &["forget", "--keep-last", "1", "--prune"],
    ] {
        let o = client(args);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(15), "{args:?}: {}", said(&o));
        assert!(
            err.contains("append-only") && err.contains("nothing was changed"),
            "{err}"
        );
    }
    // Nothing changed: the three snapshots are all there, none forgotten.
    let o = admin(&["--json", "snapshots"]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v.as_array().unwrap().len(), 3, "{v}");
    // The admin's key may.
    let o = admin(&["forget", &ids[0], "--prune"]);
    assert!(o.status.success(), "{}", said(&o));
    let o = admin(&["--no-cache", "check", "--read-data"]);
    assert!(o.status.success(), "{}", said(&o));
}
