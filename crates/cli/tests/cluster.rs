//! Many machines, one distributed store: clients backing up at once into
//! one repository on MinIO in distributed mode (4 nodes × 2 drives,
//! erasure-coded, each node in a network namespace of its own:
//! scripts/cluster.sh, started by scripts/servers.sh as root), each client
//! talking to its own node, with a node killed and brought back, a drive
//! wiped, and forget + prune running beside them. Nothing may be lost.
//!
//! The 32-client version with its figures is `bench/cluster.sh`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::sync::Mutex;
use std::time::Duration;

use capsule_testkit::server_env as env;
use common::{capsule_cmd, noise, TestEnv, NOW, PASSWORD};

/// The distributed store `scripts/servers.sh` started.
struct Cluster {
    /// `ADDR:PORT` of each node.
    nodes: Vec<String>,
    /// The directory `scripts/cluster.sh` keeps it in.
    dir: PathBuf,
    bucket: String,
    key: String,
    secret: String,
}

impl Cluster {
    fn new() -> Option<Cluster> {
        let url = env("CAPSULE_TEST_CLUSTER")?;
        let nodes = env("CAPSULE_TEST_CLUSTER_NODES")?
            .split_whitespace()
            .map(str::to_string)
            .collect();
        Some(Cluster {
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

fn said(o: &Output) -> String {
    format!(
        "exit {:?}: {}{}",
        o.status.code(),
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// Eight machines, each with its own node, three rounds of backups (most
/// of their data shared), forget + prune in a loop beside them:
/// * before round 2 a node is killed (SIGKILL) and comes back 6 s later:
///   its clients ride it out (they retried, and succeeded);
/// * before round 3 one drive of another node is emptied (a disk
///   replaced), which the store heals;
/// * at the end `check --read-data` is clean and every machine's newest
///   snapshot restores equal to its source.
#[test]
fn eight_machines_ride_out_a_lost_node_and_a_wiped_drive_with_prune_beside_them() {
    let Some(c) = Cluster::new() else { return };
    let prefix = "eight-machines";
    c.wipe(prefix);
    let work = tempfile::tempdir().unwrap();
    let work = work.path();
    let clock = work.join("clock");
    std::fs::write(&clock, NOW.to_string()).unwrap();
    let run = |node: usize, name: &str, args: &[&str]| -> Output {
        capsule_cmd(&c.machine(work, name, &clock))
            .arg("--repo")
            .arg(c.url(node, prefix))
            .args(args)
            .output()
            .unwrap()
    };
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
            std::fs::write(&clock, (NOW + round * 3600).to_string()).unwrap();
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
