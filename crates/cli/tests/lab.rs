//! The destination lab against real destinations on loopback: a local
//! directory, a small loop-mounted file system nearly full, Samba with
//! `sync always` on and off, OpenSSH and MinIO, the network ones behind
//! Toxiproxy at 0, 2 and 10 ms. The report must get reality right: the
//! round trip of a bare TCP echo through the same proxy plus the server's
//! own time (ground truth measured in the same run, not the configured
//! latency, which Toxiproxy overshoots), forced sync found on the
//! share that forces it and only there, round trips named as the bound of
//! per-file copying at 10 ms. Then the HTML report in headless Chromium.
//!
//! Servers come from `scripts/servers.sh`; without them these tests skip,
//! unless `CAPSULE_REQUIRE_SERVERS=1` (the README's test command) makes
//! that a failure.

// The command-line suite runs on Linux, against real servers, btrfs,
// fanotify and network namespaces; the macOS build checks the libraries.
#![cfg(target_os = "linux")]
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod common;

use common::{capsule_cmd, chromium};

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use capsule_testkit::echo::Echo;
use capsule_testkit::toxiproxy::{Proxy, Toxiproxy};
use capsule_testkit::{server_vars, Server, TestEnv};
use serde_json::Value;

fn env(key: &str) -> Option<String> {
    capsule_testkit::server_env(key)
}

/// A destination as the lab sees it: URL (through a private proxy with
/// the given one-way latency) and the environment capsule needs.
struct Dest {
    url: String,
    env: Vec<(String, String)>,
    state: tempfile::TempDir,
    _proxy: Option<Proxy>,
}

impl Dest {
    fn local(dir: &Path) -> Dest {
        Dest {
            url: dir.display().to_string(),
            env: vec![],
            state: tempfile::tempdir().unwrap(),
            _proxy: None,
        }
    }

    /// `which` is SMB, SMB_SYNC, SFTP or S3.
    fn remote(which: &str, name: &str, one_way_ms: u32) -> Option<Dest> {
        let url = env(&format!("CAPSULE_TEST_{which}"))?;
        let up_key = if which == "SMB_SYNC" { "SMB" } else { which };
        let upstream = env(&format!("CAPSULE_TEST_{up_key}_UPSTREAM"))?;
        let _servers = PathBuf::from(env("CAPSULE_TEST_SERVERS")?);
        let proxy = Toxiproxy::new(&env("CAPSULE_TEST_PROXY_API")?)
            .proxy(&format!("lab-{name}"), &upstream)
            .unwrap();
        if one_way_ms > 0 {
            proxy.latency(one_way_ms).unwrap();
        }
        let url = url.replace(&upstream, &proxy.listen);
        let server = match up_key {
            "SMB" => Server::Smb,
            "SFTP" => Server::Sftp,
            _ => Server::S3,
        };
        let e = server_vars(server, &proxy.listen, &format!("lab-{name}"))?;
        Some(Dest {
            url,
            env: e,
            state: tempfile::tempdir().unwrap(),
            _proxy: Some(proxy),
        })
    }

    fn run(&self, args: &[&str]) -> Output {
        let mut c = capsule_cmd(&TestEnv::bare().state(self.state.path()));
        c.args(args);
        for (k, v) in &self.env {
            c.env(k, v);
        }
        c.output().expect("run capsule")
    }

    /// `capsule lab` with small sizes, as JSON.
    fn lab(&self, extra: &[&str]) -> Value {
        let mut args = vec![
            "lab",
            &self.url,
            "--json",
            "--size",
            "4M",
            "--small-files",
            "20",
            "--rtt-samples",
            "15",
        ];
        args.extend_from_slice(extra);
        let o = self.run(&args);
        assert!(
            o.status.success(),
            "capsule lab {} failed ({:?}):\n{}",
            self.url,
            o.status.code(),
            String::from_utf8_lossy(&o.stderr)
        );
        serde_json::from_slice(&o.stdout).unwrap()
    }
}

const SEED: [&str; 6] = [
    "--generate",
    "2M",
    "--added-files",
    "150",
    "--per-file-budget",
    "60",
];

fn f(v: &Value) -> f64 {
    v.as_f64().unwrap_or_else(|| panic!("not a number: {v}"))
}

/// The fastest of 15 round trips to a bare TCP echo through a fresh proxy
/// with `one_way_ms` each way: what the proxy really adds on this machine
/// under its present load. Toxiproxy adds more than it is told (its timers
/// and goroutine hops: here +0.2 ms at 2 ms and +0.7 ms at 10 ms, more on a
/// busy machine), so the configured figure is not the truth to compare with.
fn echo_rtt(echo: &Echo, name: &str, one_way_ms: u32) -> f64 {
    let proxy = Toxiproxy::new(&env("CAPSULE_TEST_PROXY_API").unwrap())
        .proxy(&format!("echo-{name}"), &echo.addr)
        .unwrap();
    if one_way_ms > 0 {
        proxy.latency(one_way_ms).unwrap();
    }
    capsule_testkit::echo::ping(&proxy.listen, 15).unwrap()[0]
}

/// Checks what every report must get right at `one_way_ms`.
///
/// `echo_ms` is the ground truth measured in the same run: a bare TCP
/// round trip through an identical proxy. `server_ms` is what the server
/// itself adds to its fastest request (the lab's round trip minus the
/// echo's, at 0 ms added). The lab must find the echo's round trip plus the
/// server's time, within three quarters of the added latency: tight enough
/// to catch a lab that counts two round trips as one (off by the whole
/// added latency and more) or misses the added latency, and loose enough
/// for a busy machine (minima, not means, on both sides; half was missed
/// by 0.35 ms on S3 at 2 ms in one fresh-clone run).
fn check_reality(which: &str, r: &Value, one_way_ms: u32, echo_ms: f64, server_ms: f64) {
    let rtt = f(&r["probe"]["rtt"]["min_ms"]);
    let added = 2.0 * one_way_ms as f64;
    if one_way_ms == 0 {
        assert!(rtt < 2.0, "{which} at 0 ms: measured {rtt} ms");
    } else {
        let want = echo_ms + server_ms;
        assert!(
            (rtt - want).abs() <= 0.75 * added,
            "{which}: measured RTT {rtt:.2} ms; through the same proxy a TCP echo took {echo_ms:.2} ms and the server adds {server_ms:.2} ms, so {want:.2} ms ± {:.2} was expected (configured {added} ms)",
            0.75 * added
        );
        assert!(
            rtt >= echo_ms * 0.9,
            "{which}: measured RTT {rtt:.2} ms is below the network's own {echo_ms:.2} ms"
        );
    }
    let sync = r["probe"]["sync"]["mode"].as_str().unwrap();
    // A plain share must never be called forced. It is usually
    // "on_request", but on a VM disk where one flush (its minimum over
    // several tries) costs a few microseconds, "undetermined" is the
    // honest verdict, so that is accepted too (seen once in a fresh-clone
    // run: a 0.03 ms flush).
    let expected = match which {
        "SMB_SYNC" => "forced",
        "S3" => "not_applicable",
        _ => "",
    };
    if expected.is_empty() {
        assert_ne!(
            sync, "forced",
            "{which} at {one_way_ms} ms: {}",
            r["probe"]["sync"]
        );
    } else {
        assert_eq!(
            sync, expected,
            "{which} at {one_way_ms} ms: {}",
            r["probe"]["sync"]
        );
    }
    assert!(r["cleanup"]["objects_removed"].as_u64().is_some());
}

/// One lab at a time: timings are the point, and the servers share the
/// machine's two cores with the client.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn network(which: &str) {
    let _one = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let Some(_) = env("CAPSULE_TEST_PROXY_API") else {
        return;
    };
    let echo = Echo::start().unwrap();
    let mut server_ms = 0.0;
    for ms in [0u32, 1, 5] {
        let name = format!("{}-{ms}", which.to_lowercase().replace('_', "-"));
        let Some(d) = Dest::remote(which, &name, ms) else {
            return;
        };
        // The full protocol at 10 ms, where per-file copying must be seen
        // waiting on round trips; the probes alone elsewhere.
        let mut r = if ms == 5 {
            d.lab(&SEED)
        } else {
            d.lab(&["--no-seed"])
        };
        let mut echo_ms = echo_rtt(&echo, &name, ms);
        // At 1 ms a round trip is a few milliseconds, and one stall of the
        // machine can double a probe's minimum (seen twice in fresh-clone
        // runs, on S3 and on SMB with sync, each passing on the next run):
        // the probes alone are measured once more, and a lab that is wrong
        // is wrong both times.
        let rtt = f(&r["probe"]["rtt"]["min_ms"]);
        if ms == 1 && (rtt - echo_ms - server_ms).abs() > 0.75 * 2.0 {
            eprintln!("{which} at 1 ms: RTT {rtt:.2} ms against an echo of {echo_ms:.2} ms: measuring once more");
            r = d.lab(&["--no-seed"]);
            echo_ms = echo_rtt(&echo, &name, ms);
        }
        check_reality(which, &r, ms, echo_ms, server_ms);
        if ms == 0 {
            server_ms = (f(&r["probe"]["rtt"]["min_ms"]) - echo_ms).max(0.0);
        }
        if ms == 5 {
            let pf = &r["per_file"];
            assert_eq!(
                pf["bound"]["kind"], "round_trips",
                "{which}: per-file copy at 10 ms: {}",
                pf["bound"]
            );
            let seed = &r["seed"];
            assert!(f(&seed["no_change"]["destination_counters"]["requests"]) <= 10.0);
            assert!(seed["initial"]["series"].as_array().unwrap().len() >= 2);
            // Packed beats per-file by far at 10 ms.
            let packed = 150.0 / f(&seed["added"]["backup_secs"]);
            assert!(
                packed > 5.0 * f(&pf["files_per_s"]),
                "{which}: packed {packed} files/s vs per-file {}",
                pf["files_per_s"]
            );
        }
    }
}

#[test]
fn lab_smb() {
    network("SMB");
}

#[test]
fn lab_smb_sync_always() {
    network("SMB_SYNC");
}

#[test]
fn lab_sftp() {
    network("SFTP");
}

#[test]
fn lab_s3() {
    network("S3");
    let Some(d) = Dest::remote("S3", "s3-fill", 0) else {
        return;
    };
    // An object store cannot say how full it is: the lab refuses to fill it.
    let o = d.run(&["lab", &d.url, "--fill-to", "90", "--yes"]);
    assert_eq!(
        o.status.code(),
        Some(2),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(String::from_utf8_lossy(&o.stderr).contains("free space"));
}

#[test]
fn lab_local_directory() {
    let _one = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let d = Dest::local(dir.path());
    let trace_dir = tempfile::tempdir().unwrap();
    let trace = trace_dir.path().join("trace.tsv");
    let mut args = SEED.to_vec();
    args.extend(["--trace-requests", trace.to_str().unwrap()]);
    let r = d.lab(&args);
    check_reality("LOCAL", &r, 0, 0.0, 0.0);
    // Every destination the lab opened wrote into one trace: the probes'
    // objects and the seed backup's snapshot alike, under one header.
    let text = std::fs::read_to_string(&trace).unwrap();
    assert_eq!(text.matches("start_s").count(), 1, "{text}");
    let rows: Vec<Vec<&str>> = text
        .lines()
        .skip(1)
        .map(|l| l.split('\t').collect())
        .collect();
    assert!(rows.iter().all(|r| r.len() == 6), "{text}");
    assert!(
        rows.iter()
            .any(|r| r[2] == "put" && r[5].starts_with("snapshots/")),
        "{text}"
    );
    assert!(rows.len() > 40, "{} rows", rows.len());
    assert!(r["probe"]["space"]["total"].as_u64().unwrap() > 0);
    // Nothing left behind.
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    // Without consent, no filling.
    let o = d.run(&["lab", &d.url, "--no-seed", "--fill-to", "50"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("--yes"));
}

#[test]
fn lab_nearly_full_loop_filesystem() {
    let _one = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let Some(fs) = common::LoopFs::new(256) else {
        return;
    };
    // Someone else's data fills half of it.
    std::fs::write(fs.dir.join("theirs"), vec![7u8; 80 << 20]).unwrap();
    let d = Dest::local(&fs.dir);
    let before = f(&d.lab(&["--no-seed"])["probe"]["space"]["free"]);
    // The sequential probe never takes more than a quarter of what is free.
    let r = d.lab(&["--no-seed", "--size", "1G"]);
    let seq = f(&r["probe"]["write"]["bytes"]);
    assert!(seq <= before / 4.0 + 1.0, "wrote {seq} of {before} free");
    assert!(r["probe"]["notes"][0].as_str().unwrap().contains("reduced"));

    // Filled to 85% for the seed runs, then given back.
    let r = d.lab(&[
        "--generate",
        "1M",
        "--added-files",
        "50",
        "--fill-to",
        "85",
        "--yes",
    ]);
    let full = &r["full"];
    assert!(
        f(&full["space"]["used_percent"]) >= 84.0,
        "{}",
        full["space"]
    );
    assert!(full["seed"]["added"]["files"].as_u64().unwrap() >= 50);
    let after = f(&r["cleanup"]["free_after"]);
    assert!(
        (after - before).abs() < (2 << 20) as f64,
        "free before {before}, after {after}"
    );
    let left: Vec<_> = std::fs::read_dir(&fs.dir)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .filter(|n| n != "theirs" && n != "lost+found")
        .collect();
    assert!(left.is_empty(), "left behind: {left:?}");

    // Filling to 99% would leave too little for the runs: refused, and
    // nothing written.
    let o = d.run(&[
        "lab",
        &d.url,
        "--generate",
        "1M",
        "--added-files",
        "50",
        "--fill-to",
        "99",
        "--yes",
        "--size",
        "4M",
        "--small-files",
        "5",
    ]);
    assert_eq!(
        o.status.code(),
        Some(2),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(String::from_utf8_lossy(&o.stderr).contains("lower percentage"));
    let after = f(&d.lab(&["--no-seed"])["probe"]["space"]["free"]);
    assert!((after - before).abs() < (2 << 20) as f64);
}

fn headless(bin: &Path, args: &[&str], page: &Path) -> Output {
    Command::new(bin)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--hide-scrollbars",
            "--virtual-time-budget=3000",
        ])
        .args(args)
        .arg(format!("file://{}", page.display()))
        .output()
        .unwrap()
}

#[test]
fn html_report_renders_in_chromium() {
    let _one = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let Some(bin) = chromium() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let target = dir.path().join("dest");
    std::fs::create_dir(&target).unwrap();
    let d = Dest::local(&target);
    let r = d.lab(&SEED);
    let id = r["id"].as_str().unwrap();
    // Rendered again from the kept record, as a user would.
    let page = dir.path().join("report.html");
    let svg = dir.path().join("svg");
    let o = d.run(&[
        "report",
        id,
        "--html",
        page.to_str().unwrap(),
        "--svg",
        svg.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let charts = std::fs::read_dir(&svg).unwrap().count();
    assert!(charts >= 5, "{charts} SVG files");
    let html = std::fs::read_to_string(&page).unwrap();
    assert!(
        !html.contains("<script src") && !html.contains("<link"),
        "not self-contained"
    );

    // The DOM after layout: every chart drew, and the numbers are there.
    let o = headless(&bin, &["--dump-dom"], &page);
    let dom = String::from_utf8_lossy(&o.stdout);
    let drawn = dom
        .split("data-charts-drawn=\"")
        .nth(1)
        .and_then(|s| s.split('"').next())
        .and_then(|n| n.parse::<usize>().ok())
        .unwrap_or_else(|| {
            panic!(
                "no chart count in the DOM:\n{}",
                &dom[..dom.len().min(2000)]
            )
        });
    assert_eq!(drawn, charts, "charts drawn in Chromium");
    let rtt = format!("{:.2}", f(&r["probe"]["rtt"]["min_ms"]));
    assert!(
        dom.contains(&rtt),
        "the round trip {rtt} is not in the page"
    );
    let per_file = format!("{:.0} files/s", f(&r["per_file"]["files_per_s"]));
    assert!(dom.contains(&per_file), "{per_file} is not in the page");

    // A screenshot, kept as a test artifact.
    let art = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("artifacts");
    std::fs::create_dir_all(&art).unwrap();
    let shot = art.join("lab-report.png");
    let _ = std::fs::remove_file(&shot);
    let o = headless(
        &bin,
        &[
            &format!("--screenshot={}", shot.display()),
            "--window-size=900,2600",
        ],
        &page,
    );
    assert!(
        shot.exists(),
        "no screenshot: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    let png = std::fs::read(&shot).unwrap();
    assert_eq!(&png[1..4], b"PNG");
    assert!(
        png.len() > 30_000,
        "a {}-byte screenshot is blank",
        png.len()
    );
    eprintln!("screenshot: {}", shot.display());
}

#[test]
fn backups_are_recorded_and_reported() {
    let dir = tempfile::tempdir().unwrap();
    let repo = dir.path().join("repo");
    let src = dir.path().join("src");
    std::fs::create_dir(&src).unwrap();
    for i in 0..50 {
        std::fs::write(src.join(format!("f{i}")), common::noise(20_000, i)).unwrap();
    }
    common::init(&repo);
    let b = common::json(&repo, &["backup", src.to_str().unwrap()]);
    assert!(b["bound"]["kind"].is_string(), "{b}");
    let id = b["snapshot_id"].as_str().unwrap();
    let r = common::json(&repo, &["report", &id[..8]]);
    assert_eq!(r["snapshot"], id);
    assert_eq!(r["files"], 50);
    assert!(r["series"].as_array().unwrap().len() >= 2);
    assert!(f(&r["stages"]["chunk_hash"]) > 0.0);
    let latest = common::json(&repo, &["report", "latest"]);
    assert_eq!(latest["snapshot"], id);
    let page = dir.path().join("run.html");
    common::ok(&repo, &["report", id, "--html", page.to_str().unwrap()]);
    let html = std::fs::read_to_string(&page).unwrap();
    assert_eq!(html.matches("<svg").count(), 4);
    assert!(html.contains(&id[..8]));
    let o = common::capsule(&repo, &["report", "ffffffff"]);
    assert_eq!(o.status.code(), Some(13));
}

/// Ctrl-C mid-probe: the lab stops at once, removes everything it wrote and
/// exits 130.
#[test]
fn interrupted_lab_cleans_up() {
    let _one = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let d = Dest::local(dir.path());
    let state = d.state.path().to_path_buf();
    // A sequential probe of up to a quarter of the free space: seconds of
    // writing, long enough to be caught in the middle.
    let mut child = capsule_cmd(&TestEnv::bare().state(&state))
        .args(["lab", &d.url, "--size", "64G", "--no-seed"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let written = |p: &Path| -> u64 {
        let mut n = 0;
        let mut stack = vec![p.to_path_buf()];
        while let Some(d) = stack.pop() {
            for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
                match e.metadata() {
                    Ok(m) if m.is_dir() => stack.push(e.path()),
                    Ok(m) => n += m.len(),
                    Err(_) => {}
                }
            }
        }
        n
    };
    let t = std::time::Instant::now();
    while written(dir.path()) < 64 << 20 {
        assert!(
            t.elapsed() < std::time::Duration::from_secs(60),
            "the lab wrote nothing in 60 s"
        );
        assert!(child.try_wait().unwrap().is_none(), "the lab ended early");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let pid = child.id().to_string();
    assert!(Command::new("kill")
        .args(["-INT", &pid])
        .status()
        .unwrap()
        .success());
    let t = std::time::Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        assert!(
            t.elapsed() < std::time::Duration::from_secs(60),
            "the lab did not stop within 60 s of Ctrl-C"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    let mut err = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err).unwrap();
    assert_eq!(status.code(), Some(130), "{err}");
    assert!(err.contains("stopping"), "{err}");
    let left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
    assert!(left.is_empty(), "left behind: {left:?}");
}

/// `estimate` to a local directory: a prediction for each run, and with
/// `--trace-requests` every request to the destination in one trace.
#[test]
fn estimate_local_directory_with_a_trace() {
    let _one = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("src");
    for d in 0..4 {
        let dir = src.join(format!("d{d}"));
        std::fs::create_dir_all(&dir).unwrap();
        for f in 0..50 {
            std::fs::write(dir.join(format!("f{f}")), vec![d as u8; 3000 + f]).unwrap();
        }
    }
    std::fs::write(src.join("big"), capsule_testkit::noise(2 << 20, 1)).unwrap();
    let dest = t.path().join("dest");
    std::fs::create_dir_all(&dest).unwrap();
    let d = Dest::local(&dest);
    let trace = t.path().join("trace.tsv");
    let o = d.run(&[
        "estimate",
        src.to_str().unwrap(),
        "--to",
        dest.to_str().unwrap(),
        "--json",
        "--trace-requests",
        trace.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["source"]["files"], 201, "{v}");
    for k in ["initial", "hourly", "restore"] {
        assert!(f(&v["predicted"][k]) > 0.0, "{k}: {v}");
    }
    let text = std::fs::read_to_string(&trace).unwrap();
    assert_eq!(text.matches("start_s").count(), 1);
    let rows: Vec<&str> = text.lines().skip(1).collect();
    // The probes and the fixed-cost runs on the destination, in one trace.
    assert!(rows.iter().any(|r| r.ends_with("\test/stream")), "{text}");
    assert!(
        rows.iter()
            .any(|r| r.contains("\tput\t") && r.contains("\tsnapshots/")),
        "{text}"
    );
    // The scratch directory is gone.
    assert_eq!(std::fs::read_dir(&dest).unwrap().count(), 0);
}
