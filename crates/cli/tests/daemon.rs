//! `capsule daemon` with real processes and the test clock
//! (`CAPSULE_TEST_NOW=@FILE`, moved by the test): every wait is bounded,
//! and nothing is asserted on elapsed time.

// The command-line suite runs on Linux, against real servers, btrfs,
// fanotify and network namespaces; the macOS build checks the libraries.
#![cfg(target_os = "linux")]
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod common;

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use capsule_testkit::server_env;
use common::*;

/// Monday 2026-11-23 12:00 UTC.
const T0: i64 = 1_795_435_200;
const H: i64 = 3600;

struct World {
    _t: tempfile::TempDir,
    dir: PathBuf,
    config: PathBuf,
    clock: PathBuf,
}

impl World {
    fn new() -> World {
        let t = tempfile::tempdir().unwrap();
        let dir = t.path().to_path_buf();
        let src = dir.join("src");
        std::fs::create_dir_all(&src).unwrap();
        std::fs::write(src.join("f"), b"x").unwrap();
        let config = dir.join("capsule.toml");
        let w = World {
            clock: dir.join("clock"),
            _t: t,
            dir,
            config,
        };
        w.write_config(&format!("echo {PASSWORD}"));
        w.set_clock(T0);
        let o = w.cmd(&["--profile", "p", "init"]).output().unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        w
    }

    fn write_config(&self, password_command: &str) {
        std::fs::write(
            &self.config,
            format!(
                "[profiles.p]\nsources = [{:?}]\nrepository = {:?}\npassword-command = \"{password_command}\"\nschedule = {{ backup = \"hourly\" }}\n",
                self.dir.join("src").display().to_string(),
                self.dir.join("repo").display().to_string()
            ),
        )
        .unwrap();
    }

    fn set_clock(&self, t: i64) {
        let tmp = self.clock.with_extension("tmp");
        std::fs::write(&tmp, t.to_string()).unwrap();
        std::fs::rename(&tmp, &self.clock).unwrap();
    }

    fn cmd(&self, args: &[&str]) -> Command {
        let env = TestEnv::under(&self.dir)
            .config(&self.config)
            .clock(format!("@{}", self.clock.display()))
            .var("CAPSULE_DAEMON_TICK_MS", "50");
        let mut c = capsule_cmd(&env);
        c.args(args);
        c
    }

    fn daemon(&self, log: &str) -> Daemon {
        let f = std::fs::File::create(self.dir.join(log)).unwrap();
        Daemon(Some(
            self.cmd(&["daemon"])
                .stdout(Stdio::null())
                .stderr(f)
                .spawn()
                .unwrap(),
        ))
    }

    fn log(&self, log: &str) -> String {
        std::fs::read_to_string(self.dir.join(log)).unwrap_or_default()
    }

    /// The start of the last successful backup `status` knows of.
    fn last_success(&self) -> Option<i64> {
        let o = self.cmd(&["--json", "status"]).output().unwrap();
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).ok()?;
        v["profiles"][0]["last_success"]["started_unix"].as_i64()
    }

    /// Waits (bounded) until the last success started at `t`.
    fn wait_for_run_at(&self, t: i64, daemon: &mut Daemon, log: &str) {
        let deadline = Instant::now() + Duration::from_secs(90);
        while Instant::now() < deadline {
            if self.last_success() == Some(t) {
                return;
            }
            if let Some(st) = daemon.try_wait().unwrap() {
                panic!("the daemon ended ({st}): {}", self.log(log));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!("no run at {t}: {}", self.log(log));
    }

    fn snapshot_times(&self) -> Vec<i64> {
        let o = self
            .cmd(&["--profile", "p", "--json", "snapshots"])
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        v.as_array()
            .unwrap()
            .iter()
            .map(|s| s["snapshot"]["time_unix"].as_i64().unwrap())
            .collect()
    }
}

impl World {
    /// Moves the clock to each of `minutes` past T0 while the destination
    /// is away, and waits (bounded) each time until the daemon plans its
    /// next retry later than the one before ("skipped, retrying", backing
    /// off); then checks that it said so once, not at every retry.
    fn retries_while_away(&self, d: &mut Daemon, log: &str, minutes: &[i64]) {
        let mut planned = 0;
        for m in minutes {
            let clock = T0 + m * 60;
            self.set_clock(clock);
            let deadline = Instant::now() + Duration::from_secs(90);
            loop {
                let o = self.cmd(&["--json", "status"]).output().unwrap();
                let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap_or_default();
                let p = &v["profiles"][0];
                if let (Some(at), Some(why)) =
                    (p["next_backup_unix"].as_i64(), p["waiting_for"].as_str())
                {
                    if at > clock && at > planned {
                        assert!(why.contains("cannot be reached"), "{why}");
                        planned = at;
                        break;
                    }
                }
                assert!(Instant::now() < deadline, "{}", self.log(log));
                assert!(d.try_wait().unwrap().is_none(), "{}", self.log(log));
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        std::thread::sleep(Duration::from_millis(300));
        assert_eq!(
            self.log(log).matches("cannot be reached").count(),
            1,
            "{}",
            self.log(log)
        );
    }
}

/// A daemon the test started: killed when dropped, so a failing test
/// leaves no daemon running.
struct Daemon(Option<Child>);

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Some(mut c) = self.0.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl std::ops::Deref for Daemon {
    type Target = Child;
    fn deref(&self) -> &Child {
        self.0.as_ref().unwrap()
    }
}

impl std::ops::DerefMut for Daemon {
    fn deref_mut(&mut self) -> &mut Child {
        self.0.as_mut().unwrap()
    }
}

/// SIGTERM, then its exit code (bounded; past the bound the guard kills
/// it).
fn stop(mut d: Daemon) -> Option<i32> {
    let pid = rustix::process::Pid::from_raw(d.id() as i32).unwrap();
    rustix::process::kill_process(pid, rustix::process::Signal::TERM).unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while Instant::now() < deadline {
        if let Some(st) = d.try_wait().unwrap() {
            return st.code();
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("the daemon did not stop on SIGTERM");
}

/// Hourly runs, a 10-hour suspend (one catch-up run, not ten), half an
/// hour with nothing due, then a stopped daemon and six hours later a new
/// one (one catch-up run): exactly the expected snapshots.
#[test]
fn hourly_runs_with_gaps_give_one_catch_up_run_per_gap() {
    let w = World::new();
    let mut d = w.daemon("d1.log");
    let mut expected = vec![T0];
    w.wait_for_run_at(T0, &mut d, "d1.log");
    for h in 1..=3 {
        w.set_clock(T0 + h * H);
        w.wait_for_run_at(T0 + h * H, &mut d, "d1.log");
        expected.push(T0 + h * H);
    }
    // Suspended for ten hours.
    let t = T0 + 13 * H;
    w.set_clock(t);
    w.wait_for_run_at(t, &mut d, "d1.log");
    expected.push(t);
    // Half an hour later nothing is due; an hour after the run, one is.
    w.set_clock(t + H / 2);
    std::thread::sleep(Duration::from_millis(500));
    w.set_clock(t + H);
    w.wait_for_run_at(t + H, &mut d, "d1.log");
    expected.push(t + H);
    assert_eq!(stop(d), Some(0), "{}", w.log("d1.log"));
    assert!(w.log("d1.log").contains("daemon stopped"));
    // The daemon was not running for six hours: one run when it is back.
    let t = t + 7 * H;
    w.set_clock(t);
    let mut d = w.daemon("d2.log");
    w.wait_for_run_at(t, &mut d, "d2.log");
    expected.push(t);
    assert_eq!(stop(d), Some(0));
    assert_eq!(w.snapshot_times(), expected);
}

/// A second daemon for the same profile refuses; one killed with SIGKILL
/// leaves nothing that stops the next.
#[test]
fn a_second_daemon_refuses_and_a_killed_one_leaves_no_lock() {
    let w = World::new();
    let mut d = w.daemon("a.log");
    w.wait_for_run_at(T0, &mut d, "a.log");
    let o = w.cmd(&["daemon"]).output().unwrap();
    assert_eq!(
        o.status.code(),
        Some(22),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(String::from_utf8_lossy(&o.stderr).contains("another daemon"));
    // A backup by hand while the daemon idles: the run lock is free.
    let o = w.cmd(&["--profile", "p", "backup"]).output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    d.kill().unwrap();
    d.wait().unwrap();
    w.set_clock(T0 + H);
    let mut d = w.daemon("b.log");
    w.wait_for_run_at(T0 + H, &mut d, "b.log");
    assert_eq!(stop(d), Some(0));
}

/// SIGHUP with a broken configuration keeps the old one (and says so);
/// the next run happens as before.
#[test]
fn sighup_with_a_broken_config_keeps_the_old_one() {
    let w = World::new();
    let mut d = w.daemon("h.log");
    w.wait_for_run_at(T0, &mut d, "h.log");
    let good = std::fs::read(&w.config).unwrap();
    std::fs::write(&w.config, "[profiles.p]\nrepostory = 1\n").unwrap();
    let pid = rustix::process::Pid::from_raw(d.id() as i32).unwrap();
    rustix::process::kill_process(pid, rustix::process::Signal::HUP).unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while !w.log("h.log").contains("configuration not reread") {
        assert!(Instant::now() < deadline, "{}", w.log("h.log"));
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(w.log("h.log").contains("repostory"), "{}", w.log("h.log"));
    // The run itself reads the file too: put it back before it is due.
    std::fs::write(&w.config, good).unwrap();
    w.set_clock(T0 + H);
    w.wait_for_run_at(T0 + H, &mut d, "h.log");
    assert_eq!(stop(d), Some(0));
}

/// A destination that cannot be reached: the backup is "skipped,
/// retrying", said once however many retries fail; once it answers again
/// (here: the profile points at a reachable repository, reread on
/// SIGHUP), exactly one run, at the next retry.
#[test]
fn an_unreachable_destination_is_skipped_and_retried_then_run_once() {
    let w = World::new();
    let good = std::fs::read_to_string(&w.config).unwrap();
    let away = good.replace(
        &format!("{:?}", w.dir.join("repo").display().to_string()),
        "\"smb://nobody@127.0.0.1:1/share/away\"",
    );
    assert_ne!(away, good);
    std::fs::write(&w.config, &away).unwrap();
    let f = std::fs::File::create(w.dir.join("u.log")).unwrap();
    let mut d = Daemon(Some(
        w.cmd(&["daemon"])
            .env("CAPSULE_SMB_PASSWORD", "x")
            .stdout(Stdio::null())
            .stderr(f)
            .spawn()
            .unwrap(),
    ));
    let deadline = Instant::now() + Duration::from_secs(60);
    while !w.log("u.log").contains("cannot be reached; retrying") {
        assert!(Instant::now() < deadline, "{}", w.log("u.log"));
        assert!(d.try_wait().unwrap().is_none(), "{}", w.log("u.log"));
        std::thread::sleep(Duration::from_millis(50));
    }
    // Retries after 1, 2, 4 minutes fail quietly. Each is waited for until
    // the daemon says when it retries next (in `status`), so the clock
    // moves on only then.
    w.retries_while_away(&mut d, "u.log", &[0, 2, 4, 8]);
    let o = w.cmd(&["--json", "status"]).output().unwrap();
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["profiles"][0]["last_run"]["result"], "skipped", "{v}");
    // Back: one run at the next retry (the backoff is at most 15 min; an
    // hour on, whatever the last retry left, the run is due).
    std::fs::write(&w.config, &good).unwrap();
    let pid = rustix::process::Pid::from_raw(d.id() as i32).unwrap();
    rustix::process::kill_process(pid, rustix::process::Signal::HUP).unwrap();
    let t = T0 + 60 * 60;
    w.set_clock(t);
    w.wait_for_run_at(t, &mut d, "u.log");
    let deadline = Instant::now() + Duration::from_secs(30);
    while !w.log("u.log").contains("answers again") {
        assert!(Instant::now() < deadline, "{}", w.log("u.log"));
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(stop(d), Some(0));
    assert_eq!(w.snapshot_times(), vec![t]);
}

/// A due backup waits while on battery below the profile's level, and on a
/// metered network (both from faked providers), says so in `status`, and
/// runs once the condition passes.
#[test]
fn a_due_backup_waits_for_battery_and_an_unmetered_network() {
    let w = World::new();
    let mut text = std::fs::read_to_string(&w.config).unwrap();
    text.push_str("conditions = { min-battery = 20, skip-metered = true }\n");
    std::fs::write(&w.config, text).unwrap();
    let power = w.dir.join("power");
    let bat = power.join("BAT0");
    std::fs::create_dir_all(&bat).unwrap();
    std::fs::write(bat.join("type"), "Battery\n").unwrap();
    std::fs::write(bat.join("status"), "Discharging\n").unwrap();
    std::fs::write(bat.join("capacity"), "12\n").unwrap();
    let metered = w.dir.join("metered");
    std::fs::write(&metered, "u 2\n").unwrap();
    let f = std::fs::File::create(w.dir.join("c.log")).unwrap();
    let mut d = Daemon(Some(
        w.cmd(&["daemon"])
            .env("CAPSULE_POWER_SUPPLY_DIR", &power)
            .env(
                "CAPSULE_METERED_COMMAND",
                format!("cat {}", metered.display()),
            )
            .stdout(Stdio::null())
            .stderr(f)
            .spawn()
            .unwrap(),
    ));
    let waiting = |what: &str| {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let o = w.cmd(&["--json", "status"]).output().unwrap();
            let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap_or_default();
            if v["profiles"][0]["waiting_for"]
                .as_str()
                .is_some_and(|s| s.contains(what))
            {
                return;
            }
            assert!(Instant::now() < deadline, "{v}: {}", w.log("c.log"));
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    waiting("battery");
    assert_eq!(w.last_success(), None);
    // Charging now, but the network is metered.
    std::fs::write(bat.join("status"), "Charging\n").unwrap();
    std::fs::write(&metered, "u 1\n").unwrap();
    waiting("metered");
    assert_eq!(w.last_success(), None);
    std::fs::write(&metered, "u 4\n").unwrap();
    w.wait_for_run_at(T0, &mut d, "c.log");
    assert!(
        w.log("c.log").contains("conditions met"),
        "{}",
        w.log("c.log")
    );
    assert_eq!(stop(d), Some(0));
}

/// SIGTERM while a backup runs (held at its commit, every pack uploaded):
/// the daemon stops within its bound, and the next run sends none of what
/// had landed. Also: the staleness hook
/// runs once, and forget runs on its own schedule by the profile's
/// retention.
#[test]
fn sigterm_mid_run_then_the_next_run_resumes_and_maintenance_runs_on_schedule() {
    let w = World::new();
    std::fs::write(w.dir.join("src/big"), noise(6 << 20, 5)).unwrap();
    let mut text = std::fs::read_to_string(&w.config).unwrap();
    let marker = w.dir.join("stale-hook-ran");
    text = text.replace(
        "schedule = { backup = \"hourly\" }",
        "schedule = { backup = \"hourly\", forget = \"daily\" }\nretention = { keep-last = 1 }",
    );
    text.push_str(&format!(
        "hooks = {{ on-stale = \"echo x >> {}\" }}\n",
        marker.display()
    ));
    std::fs::write(&w.config, text).unwrap();
    let gate = w.dir.join("gate");
    let f = std::fs::File::create(w.dir.join("t.log")).unwrap();
    let d = Daemon(Some(
        w.cmd(&["daemon"])
            .env("CAPSULE_TEST_PAUSE", format!("commit:{}", gate.display()))
            .stdout(Stdio::null())
            .stderr(f)
            .spawn()
            .unwrap(),
    ));
    let waiting = gate.with_extension("waiting");
    let deadline = Instant::now() + Duration::from_secs(90);
    while !waiting.exists() {
        assert!(Instant::now() < deadline, "{}", w.log("t.log"));
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(stop(d), Some(0), "{}", w.log("t.log"));
    assert!(
        w.log("t.log").contains("backup stopped with the daemon"),
        "{}",
        w.log("t.log")
    );
    assert_eq!(w.last_success(), None);
    // Never backed up: the staleness hook ran, once.
    assert_eq!(std::fs::read_to_string(&marker).unwrap().lines().count(), 1);
    // The next run (by hand, as the daemon would) sends none of the 6 MiB
    // that had landed (held at its commit, the stopped run had indexed
    // its packs; cut earlier, the resume journal indexes them).
    let o = w
        .cmd(&["--profile", "p", "--json", "backup"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert!(
        v["destination"]["bytes_up"].as_u64().unwrap() < 1 << 20,
        "{v}"
    );
    // A backup by hand a day later; half an hour after it a new daemon:
    // no backup is due, forget (daily, last run when the first daemon
    // started) is, and keeps the last snapshot by the profile's retention.
    let t = T0 + 86_400 + H / 2;
    w.set_clock(t);
    let o = w.cmd(&["--profile", "p", "backup"]).output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    w.set_clock(t + H / 2);
    let d = w.daemon("t2.log");
    let deadline = Instant::now() + Duration::from_secs(90);
    while !w.log("t2.log").contains("forget ok") {
        assert!(Instant::now() < deadline, "{}", w.log("t2.log"));
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(stop(d), Some(0));
    assert!(
        !w.log("t2.log").contains("backup started"),
        "{}",
        w.log("t2.log")
    );
    assert_eq!(w.snapshot_times(), vec![t]);
    // Not stale then: the hook ran once in all.
    assert_eq!(std::fs::read_to_string(&marker).unwrap().lines().count(), 1);
}

/// A backup by hand holding the profile when the daemon's is due: the
/// daemon's run finds it busy and waits a minute (said in `status`), not a
/// retry at every wake. A profile without a `schedule` is not run.
#[test]
fn a_busy_profile_is_retried_later_and_an_unscheduled_one_is_not_run() {
    let w = World::new();
    let mut text = std::fs::read_to_string(&w.config).unwrap();
    text.push_str("\n[profiles.q]\nsources = [\"/nonexistent\"]\n");
    std::fs::write(&w.config, text).unwrap();
    let gate = w.dir.join("gate");
    let mut by_hand = w
        .cmd(&["--profile", "p", "backup"])
        .env("CAPSULE_TEST_PAUSE", format!("commit:{}", gate.display()))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let waiting = gate.with_extension("waiting");
    let deadline = Instant::now() + Duration::from_secs(90);
    while !waiting.exists() {
        assert!(Instant::now() < deadline);
        std::thread::sleep(Duration::from_millis(50));
    }
    let d = w.daemon("b.log");
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let o = w
            .cmd(&["--json", "status", "--profile", "p"])
            .output()
            .unwrap();
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap_or_default();
        if v["profiles"][0]["waiting_for"]
            .as_str()
            .is_some_and(|s| s.contains("another run"))
        {
            break;
        }
        assert!(Instant::now() < deadline, "{v}: {}", w.log("b.log"));
        std::thread::sleep(Duration::from_millis(50));
    }
    // The clock does not move: no retry before a minute of it has passed.
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(
        w.log("b.log").matches("backup started").count(),
        1,
        "{}",
        w.log("b.log")
    );
    assert!(!w.log("b.log").contains("profile q"), "{}", w.log("b.log"));
    std::fs::write(&gate, b"").unwrap();
    assert!(by_hand.wait().unwrap().success());
    assert_eq!(stop(d), Some(0));
}

/// The daemon holds each profile's derived key and hands it to its runs:
/// a scheduled run derives no key (`key: held`), a run by hand does. After
/// a password change the held key no longer fits: the next run derives the
/// new one itself, and the daemon holds that one from then on.
#[test]
fn scheduled_runs_use_the_key_the_daemon_holds() {
    let w = World::new();
    let key_of_last_run = || -> String {
        let o = w.cmd(&["--json", "status"]).output().unwrap();
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        v["profiles"][0]["last_run"]["key"]
            .as_str()
            .unwrap_or("")
            .to_string()
    };
    let mut d = w.daemon("k.log");
    w.wait_for_run_at(T0, &mut d, "k.log");
    assert_eq!(key_of_last_run(), "held", "{}", w.log("k.log"));
    assert!(
        w.log("k.log").contains("key derived; held"),
        "{}",
        w.log("k.log")
    );
    w.set_clock(T0 + H);
    w.wait_for_run_at(T0 + H, &mut d, "k.log");
    assert_eq!(key_of_last_run(), "held");
    // By hand: the hint starts a derivation, nothing is handed over.
    let o = w
        .cmd(&["--profile", "p", "--json", "backup"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["key"], "early");
    // A new password: the config says it, the daemon rereads it.
    let new_pw = w.dir.join("new-pw");
    std::fs::write(&new_pw, "another password\n").unwrap();
    let o = w
        .cmd(&["--profile", "p", "key", "passwd", "--new-password-file"])
        .arg(&new_pw)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    w.write_config("echo another password");
    let pid = rustix::process::Pid::from_raw(d.id() as i32).unwrap();
    rustix::process::kill_process(pid, rustix::process::Signal::HUP).unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while !w.log("k.log").contains("configuration reread") {
        assert!(Instant::now() < deadline, "{}", w.log("k.log"));
        std::thread::sleep(Duration::from_millis(50));
    }
    w.set_clock(T0 + 2 * H);
    w.wait_for_run_at(T0 + 2 * H, &mut d, "k.log");
    assert_eq!(key_of_last_run(), "held", "{}", w.log("k.log"));
    w.set_clock(T0 + 3 * H);
    w.wait_for_run_at(T0 + 3 * H, &mut d, "k.log");
    assert_eq!(key_of_last_run(), "held", "{}", w.log("k.log"));
    assert_eq!(stop(d), Some(0));
}

/// A Samba server of this test's own (so that stopping it touches no other
/// test): `smbd` in the foreground on a loopback port, its share in `dir`,
/// stopped with SIGTERM and started again on the same port.
struct Samba {
    conf: PathBuf,
    port: u16,
    child: Option<Child>,
}

impl Samba {
    fn new(dir: &std::path::Path, user: &str, password: &str) -> Samba {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        for d in ["share", "private", "lock", "state", "cache", "pid"] {
            std::fs::create_dir_all(dir.join(d)).unwrap();
        }
        let conf = dir.join("smb.conf");
        let d = dir.display();
        std::fs::write(
            &conf,
            format!(
                "[global]\n interfaces = lo\n bind interfaces only = yes\n smb ports = {port}\n disable netbios = yes\n server min protocol = SMB2\n server role = standalone server\n passdb backend = tdbsam:{d}/private/passdb.tdb\n pid directory = {d}/pid\n lock directory = {d}/lock\n state directory = {d}/state\n cache directory = {d}/cache\n private dir = {d}/private\n ncalrpc dir = {d}/state/ncalrpc\n log file = {d}/log.%m\n load printers = no\n printing = bsd\n printcap name = /dev/null\n map to guest = never\n[backup]\n path = {d}/share\n read only = no\n valid users = {user}\n force user = root\n"
            ),
        )
        .unwrap();
        let mut c = Command::new("smbpasswd")
            .arg("-c")
            .arg(&conf)
            .args(["-s", "-a", user])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .spawn()
            .unwrap();
        use std::io::Write;
        write!(c.stdin.take().unwrap(), "{password}\n{password}\n").unwrap();
        assert!(c.wait().unwrap().success());
        let mut s = Samba {
            conf,
            port,
            child: None,
        };
        s.start();
        s
    }

    fn start(&mut self) {
        let child = Command::new("smbd")
            .args(["--foreground", "-s"])
            .arg(&self.conf)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(30);
        while std::net::TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            assert!(Instant::now() < deadline, "smbd did not listen");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// SIGTERM, and waits (bounded) for it and its port to go.
    fn stop(&mut self) {
        let Some(mut c) = self.child.take() else {
            return;
        };
        let pid = rustix::process::Pid::from_raw(c.id() as i32).unwrap();
        let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
        let deadline = Instant::now() + Duration::from_secs(20);
        while matches!(c.try_wait(), Ok(None)) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = c.kill();
        let _ = c.wait();
        while std::net::TcpStream::connect(("127.0.0.1", self.port)).is_ok() {
            assert!(Instant::now() < deadline, "smbd still listens");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Samba {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A real SMB server is stopped: the hourly backup is skipped and retried
/// (said once), nothing piles up; when the server is started again, the
/// next retry runs exactly once.
#[test]
fn a_stopped_smb_server_is_retried_and_once_back_backed_up_once() {
    let (Some(url), Some(password)) = (
        server_env("CAPSULE_TEST_SMB"),
        server_env("CAPSULE_TEST_SMB_PASSWORD"),
    ) else {
        return;
    };
    let user = url
        .strip_prefix("smb://")
        .and_then(|u| u.split_once('@'))
        .map(|(u, _)| u.to_string())
        .unwrap();
    let w = World::new();
    let mut smb = Samba::new(&w.dir.join("samba"), &user, &password);
    let text = std::fs::read_to_string(&w.config).unwrap().replace(
        &format!("{:?}", w.dir.join("repo").display().to_string()),
        &format!("\"smb://{user}@127.0.0.1:{}/backup/r\"", smb.port),
    );
    std::fs::write(&w.config, text).unwrap();
    let with_smb = |mut c: Command| {
        c.env("CAPSULE_SMB_PASSWORD", &password);
        c
    };
    let o = with_smb(w.cmd(&["--profile", "p", "init"]))
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let f = std::fs::File::create(w.dir.join("s.log")).unwrap();
    let mut d = Daemon(Some(
        with_smb(w.cmd(&["daemon"]))
            .stdout(Stdio::null())
            .stderr(f)
            .spawn()
            .unwrap(),
    ));
    w.wait_for_run_at(T0, &mut d, "s.log");
    smb.stop();
    // Due an hour later, with the server stopped: skipped, retried at
    // growing intervals, said once.
    w.retries_while_away(&mut d, "s.log", &[60, 62, 64]);
    // Started again: one run at the next retry (15 minutes at most).
    smb.start();
    let t = T0 + 90 * 60;
    w.set_clock(t);
    w.wait_for_run_at(t, &mut d, "s.log");
    let deadline = Instant::now() + Duration::from_secs(30);
    while !w.log("s.log").contains("answers again") {
        assert!(Instant::now() < deadline, "{}", w.log("s.log"));
        std::thread::sleep(Duration::from_millis(50));
    }
    // Nothing more is due until an hour after that run.
    w.set_clock(t + 30 * 60);
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(stop(d), Some(0));
    let snaps = with_smb(w.cmd(&["--profile", "p", "--json", "snapshots"]))
        .output()
        .unwrap();
    assert!(
        snaps.status.success(),
        "{}",
        String::from_utf8_lossy(&snaps.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&snaps.stdout).unwrap();
    let times: Vec<i64> = v
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["snapshot"]["time_unix"].as_i64().unwrap())
        .collect();
    assert_eq!(times, vec![T0, t]);
}

/// The daemon's change journal, end to end: the daemon watches the
/// profile's sources; a backup (by hand here, while the daemon runs) lists
/// only the directories that changed and stores the same tree as a full
/// scan; a run where only the source's parent changed adds exactly one
/// object, the snapshot; every reason the journal cannot vouch for a run
/// gives a full scan that says so (no base yet, `--no-journal`, other
/// excludes, a restarted watcher, more changes than the journal holds);
/// and one run in `journal-verify-every` is a verification run that
/// `status` counts.
#[test]
fn the_journal_lists_only_what_changed_and_says_why_when_it_cannot() {
    let w = World::new();
    let src = w.dir.join("src");
    for d in ["a", "b/c", "b/d"] {
        std::fs::create_dir_all(src.join(d)).unwrap();
        for i in 0..3 {
            std::fs::write(src.join(d).join(format!("f{i}")), format!("{d}{i}")).unwrap();
        }
    }
    let mut config = std::fs::read_to_string(&w.config).unwrap();
    config.push_str("journal-verify-every = 4\n");
    std::fs::write(&w.config, config).unwrap();
    let mut d = w.daemon("j.log");
    w.wait_for_run_at(T0, &mut d, "j.log");
    let status = || -> serde_json::Value {
        let o = w.cmd(&["--json", "status"]).output().unwrap();
        serde_json::from_slice(&o.stdout).unwrap()
    };
    let st = status();
    assert_eq!(
        st["profiles"][0]["last_run"]["scan"]["reason"],
        "no snapshot was made under this journal yet",
        "{st}"
    );
    assert_eq!(st["profiles"][0]["journal"]["watching"], true, "{st}");
    // By hand, a minute apart on the test clock (the daemon's next run is
    // an hour away).
    let minute = std::cell::Cell::new(0);
    let backup = |extra: &[&str]| -> serde_json::Value {
        minute.set(minute.get() + 1);
        w.set_clock(T0 + minute.get() * 60);
        let mut args = vec!["--profile", "p", "--json", "backup"];
        args.extend_from_slice(extra);
        let o = w.cmd(&args).output().unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        serde_json::from_slice(&o.stdout).unwrap()
    };
    let tree = |snapshot: &serde_json::Value| -> String {
        let o = w
            .cmd(&["--profile", "p", "--json", "snapshots"])
            .output()
            .unwrap();
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        v.as_array()
            .unwrap()
            .iter()
            .find(|s| s["id"] == *snapshot)
            .map(|s| s["snapshot"]["tree"].as_str().unwrap().to_string())
            .unwrap_or_else(|| panic!("no snapshot {snapshot} in {v}"))
    };
    std::fs::write(src.join("b/c/new"), b"new").unwrap();
    std::fs::remove_file(src.join("a/f0")).unwrap();
    let j = backup(&[]);
    assert_eq!(j["scan"]["mode"], "journal", "{j}");
    assert_eq!(j["scan"]["dirs_changed"], 2, "{j}");
    assert_eq!(j["scan"]["dirs_listed"], 2, "{j}");
    let full = backup(&["--no-journal"]);
    assert_eq!(full["scan"]["reason"], "--no-journal", "{full}");
    assert_eq!(tree(&j["snapshot_id"]), tree(&full["snapshot_id"]));
    assert_eq!(j["summary"]["files"], full["summary"]["files"]);
    // Only the source's parent changed: one object more, the snapshot.
    let objects = || {
        let mut n = 0;
        let mut stack = vec![w.dir.join("repo")];
        while let Some(d) = stack.pop() {
            for e in std::fs::read_dir(&d).unwrap().flatten() {
                let name = e.file_name();
                if e.file_type().unwrap().is_dir() {
                    // Sessions and locks come and go with each run.
                    if name != "sessions" && name != "locks" {
                        stack.push(e.path());
                    }
                } else {
                    n += 1;
                }
            }
        }
        n
    };
    let before = objects();
    std::fs::write(w.dir.join("beside-the-source"), b"x").unwrap();
    let j = backup(&[]);
    assert_eq!(j["scan"]["mode"], "journal", "{j}");
    assert_eq!(j["scan"]["dirs_listed"], 0, "{j}");
    assert_eq!(objects(), before + 1, "{j}");
    // Other excludes are another scope.
    let other = backup(&["--exclude", "*.tmp"]);
    assert!(
        other["scan"]["reason"]
            .as_str()
            .unwrap()
            .contains("sources or excludes changed"),
        "{other}"
    );
    // The fourth run since a full scan verifies the journal.
    backup(&[]);
    backup(&[]);
    backup(&[]);
    let v = backup(&[]);
    assert_eq!(v["scan"]["mode"], "verify", "{v}");
    assert_eq!(v["scan"]["journal_matched"], true, "{v}");
    assert_eq!(status()["profiles"][0]["journal"]["verified"], 1);
    // A restarted watcher did not see what happened while it was down.
    assert_eq!(stop(d), Some(0));
    std::fs::write(src.join("a/while-stopped"), b"unseen").unwrap();
    let down = backup(&[]);
    assert!(
        down["scan"]["reason"]
            .as_str()
            .unwrap()
            .contains("not running"),
        "{down}"
    );
    let d = w.daemon("j2.log");
    let deadline = Instant::now() + Duration::from_secs(60);
    while !w.log("j2.log").contains("watching") {
        assert!(Instant::now() < deadline, "{}", w.log("j2.log"));
        std::thread::sleep(Duration::from_millis(50));
    }
    let restarted = backup(&[]);
    assert!(
        restarted["scan"]["reason"]
            .as_str()
            .unwrap()
            .contains("watcher restarted"),
        "{restarted}"
    );
    // More changed directories than the journal holds: a loss, not memory.
    assert_eq!(stop(d), Some(0));
    let f = std::fs::File::create(w.dir.join("j3.log")).unwrap();
    let mut d = Daemon(Some(
        w.cmd(&["daemon"])
            .env("CAPSULE_JOURNAL_MAX_DIRS", "2")
            .stdout(Stdio::null())
            .stderr(f)
            .spawn()
            .unwrap(),
    ));
    let deadline = Instant::now() + Duration::from_secs(60);
    while !w.log("j3.log").contains("watching") {
        assert!(Instant::now() < deadline, "{}", w.log("j3.log"));
        assert!(d.try_wait().unwrap().is_none(), "{}", w.log("j3.log"));
        std::thread::sleep(Duration::from_millis(50));
    }
    backup(&[]);
    for dir in ["a", "b/c", "b/d"] {
        std::fs::write(src.join(dir).join("more"), b"more").unwrap();
    }
    let over = backup(&[]);
    assert!(
        over["scan"]["reason"]
            .as_str()
            .unwrap()
            .contains("more than 2 directories changed"),
        "{over}"
    );
    let after = backup(&[]);
    assert_eq!(after["scan"]["mode"], "journal", "{after}");
    assert_eq!(stop(d), Some(0));
}

/// A profile with `copy-to` and a copy schedule: the daemon copies its
/// snapshots into the second repository, which then holds the same ones;
/// a copy schedule without `copy-to` is a configuration error.
#[test]
fn the_daemon_copies_snapshots_to_the_profiles_second_repository() {
    let w = World::new();
    let (repo, offsite) = (w.dir.join("repo"), w.dir.join("offsite"));
    let run = |args: &[&str]| {
        let o = w
            .cmd(args)
            .env("CAPSULE_PASSWORD", PASSWORD)
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        o.stdout
    };
    let from = ["--copy-chunker-params-from", repo.to_str().unwrap()];
    run(&[&["--repo", offsite.to_str().unwrap(), "init"][..], &from].concat());
    let text = std::fs::read_to_string(&w.config).unwrap().replace(
        "schedule = { backup = \"hourly\" }",
        "schedule = { backup = \"off\", copy = \"daily\" }",
    );
    std::fs::write(&w.config, &text).unwrap();
    let o = w.cmd(&["config", "check"]).output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && err.contains("copy-to"), "{err}");
    let copy_to = format!("copy-to = {:?}\n", offsite.display().to_string());
    std::fs::write(&w.config, text + &copy_to).unwrap();
    for round in 0..2 {
        std::fs::write(w.dir.join("src/f"), noise(100_000, round)).unwrap();
        run(&["--profile", "p", "backup"]);
    }
    let d = w.daemon("c.log");
    let deadline = Instant::now() + Duration::from_secs(90);
    while !w.log("c.log").contains("copy ok") {
        assert!(Instant::now() < deadline, "{}", w.log("c.log"));
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(stop(d), Some(0));
    let times = |r: &std::path::Path| {
        let out = run(&["--repo", r.to_str().unwrap(), "--json", "snapshots"]);
        let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
        let mut t: Vec<i64> = (v.as_array().unwrap().iter())
            .map(|s| s["snapshot"]["time_unix"].as_i64().unwrap())
            .collect();
        t.sort();
        t
    };
    assert_eq!(times(&offsite).len(), 2);
    assert_eq!(times(&offsite), times(&repo));
}
