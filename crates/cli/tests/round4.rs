//! Trust, round four: a regression test per defect the hostile review
//! found in the daemon, its status, the configuration file and the
//! snapshot names (the journal's blind spots are in
//! `crates/watch/tests/model.rs`). Every wait is bounded.

// The command-line suite runs on Linux, against real servers, btrfs,
// fanotify and network namespaces; the macOS build checks the libraries.
#![cfg(target_os = "linux")]
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::*;

/// A configuration with one profile `p` backing up `src` into `repo`.
struct World {
    _t: tempfile::TempDir,
    dir: PathBuf,
    config: PathBuf,
}

impl World {
    fn new(password_command: &str) -> World {
        let t = tempfile::tempdir().unwrap();
        let dir = t.path().to_path_buf();
        std::fs::create_dir_all(dir.join("src")).unwrap();
        std::fs::write(dir.join("src/f"), b"x").unwrap();
        let w = World {
            config: dir.join("capsule.toml"),
            _t: t,
            dir,
        };
        w.write(password_command, &w.dir.join("repo"));
        w
    }

    fn write(&self, password_command: &str, repo: &Path) {
        std::fs::write(
            &self.config,
            format!(
                "[profiles.p]\nsources = [{:?}]\nrepository = {:?}\npassword-command = {password_command:?}\nschedule = {{ backup = \"hourly\" }}\n",
                self.dir.join("src").display().to_string(),
                repo.display().to_string()
            ),
        )
        .unwrap();
    }

    fn cmd(&self, args: &[&str]) -> Command {
        let mut c = capsule_cmd(&TestEnv::under(&self.dir).config(&self.config));
        c.args(args).stdin(Stdio::null());
        c
    }

    /// Runs to the end, or kills it after 90 s and fails.
    fn run(&self, args: &[&str], env: &[(&str, &str)]) -> Output {
        let mut c = self.cmd(args);
        for (k, v) in env {
            c.env(k, v);
        }
        bounded(c)
    }

    fn status(&self) -> (Option<i32>, String, serde_json::Value) {
        let text = self.run(&["status"], &[]);
        let j = self.run(&["--json", "status"], &[]);
        (
            text.status.code(),
            String::from_utf8_lossy(&text.stdout).into_owned(),
            serde_json::from_slice(&j.stdout).unwrap(),
        )
    }
}

fn bounded(mut c: Command) -> Output {
    let mut child = c
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(90);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("{c:?} did not end within 90 s");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
}

fn err(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn pw() -> String {
    format!("echo {PASSWORD}")
}

/// Item 3: One run while the clock said 2031: `status` says the clock is wrong
/// (not "ok", exit 20), and the daemon backs up now, not in 2031.
#[test]
fn a_run_dated_in_the_future_is_a_clock_problem_and_the_daemon_plans_from_now() {
    let w = World::new(&pw());
    assert!(w.run(&["--profile", "p", "init"], &[]).status.success());
    let o = w.run(
        &["--profile", "p", "backup"],
        &[("CAPSULE_TEST_NOW", "2031-01-01T00:00:00Z")],
    );
    assert!(o.status.success(), "{}", err(&o));
    let (code, text, v) = w.status();
    assert_eq!(code, Some(20), "{text}");
    assert!(
        text.starts_with("p: CLOCK: a run is dated 2031-01-01"),
        "{text}"
    );
    assert!(!text.contains(": ok:"), "{text}");
    assert!(v["profiles"][0]["clock_problem"].is_string(), "{v}");
    let log = std::fs::File::create(w.dir.join("d.log")).unwrap();
    let mut d = w
        .cmd(&["daemon"])
        .env("CAPSULE_DAEMON_TICK_MS", "50")
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(90);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    loop {
        let (_, _, v) = w.status();
        let t = v["profiles"][0]["last_success"]["started_unix"].as_i64();
        if t.is_some_and(|t| t >= now - 5 && t < 1_900_000_000) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no run now: {v}\n{}",
            std::fs::read_to_string(w.dir.join("d.log")).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let _ = d.kill();
    let _ = d.wait();
    let (code, text, _) = w.status();
    assert_eq!(code, Some(0), "{text}");
}

/// Item 4 and 14: A local repository directory that is not there is away (exit
/// 14, "waiting for the destination"), not failing; a directory without a
/// repository stays an error; a failed run makes the headline say so.
#[test]
fn a_missing_local_destination_is_away_and_a_failed_run_says_failing() {
    let w = World::new(&pw());
    assert!(w.run(&["--profile", "p", "init"], &[]).status.success());
    assert!(w.run(&["--profile", "p", "backup"], &[]).status.success());
    // Unplugged: the disk's mount point is there, the repository is not.
    w.write(&pw(), &w.dir.join("usb/capsule"));
    let o = w.run(&["--profile", "p", "backup"], &[]);
    assert_eq!(o.status.code(), Some(14), "{}", err(&o));
    assert!(err(&o).contains("usb does not exist"), "{}", err(&o));
    let (code, text, v) = w.status();
    assert_eq!(code, Some(0), "{text}");
    assert!(text.starts_with("p: WAITING for the destination"), "{text}");
    assert_eq!(v["profiles"][0]["failing"], false, "{v}");
    // A directory that holds no repository is an error.
    std::fs::create_dir_all(w.dir.join("empty")).unwrap();
    w.write(&pw(), &w.dir.join("empty"));
    let o = w.run(&["--profile", "p", "backup"], &[]);
    assert_eq!(o.status.code(), Some(11), "{}", err(&o));
    // 14: the last run failed: the headline says so.
    let (code, text, _) = w.status();
    assert_eq!(code, Some(21), "{text}");
    assert!(
        text.starts_with("p: FAILING: the last run failed"),
        "{text}"
    );
}

/// Item 5: A configuration file others may write does not run its commands.
#[test]
fn a_configuration_file_others_may_write_runs_no_command() {
    use std::os::unix::fs::PermissionsExt;
    let w = World::new("touch RAN; echo pw");
    let ran = w.dir.join("RAN");
    w.write(
        &format!("touch {}; echo {PASSWORD}", ran.display()),
        &w.dir.join("repo"),
    );
    std::fs::set_permissions(&w.config, std::fs::Permissions::from_mode(0o666)).unwrap();
    let o = w.run(&["--profile", "p", "snapshots"], &[]);
    assert_eq!(o.status.code(), Some(2), "{}", err(&o));
    assert!(
        err(&o).contains("may be written by every user"),
        "{}",
        err(&o)
    );
    assert!(err(&o).contains("password-command"), "{}", err(&o));
    assert!(!ran.exists(), "the command ran");
    let o = w.run(&["config", "check"], &[]);
    assert_eq!(o.status.code(), Some(2), "{}", err(&o));
    assert!(err(&o).contains("chmod go-w"), "{}", err(&o));
    // The daemon refuses it too.
    let o = w.run(&["daemon"], &[]);
    assert_eq!(o.status.code(), Some(2), "{}", err(&o));
    assert!(!ran.exists(), "the command ran");
    // Group-writable too; the owner's alone is fine.
    std::fs::set_permissions(&w.config, std::fs::Permissions::from_mode(0o620)).unwrap();
    assert_eq!(w.run(&["config", "check"], &[]).status.code(), Some(2));
    std::fs::set_permissions(&w.config, std::fs::Permissions::from_mode(0o600)).unwrap();
    let o = w.run(&["config", "check"], &[]);
    assert!(o.status.success(), "{}", err(&o));
}

/// Item 6 and 15: `schedule install` refuses a path that would add a line of
/// its own to the unit, escapes `$`, and exits non-zero when the service
/// manager did not start the service, saying what to run.
#[test]
fn schedule_install_quotes_paths_and_fails_when_the_service_did_not_start() {
    let w = World::new(&pw());
    let units = w.dir.join("units");
    let install = |config: Option<&Path>, extra: &[&str]| {
        let mut args = Vec::new();
        if let Some(c) = config {
            args.extend(["--config", c.to_str().unwrap()]);
        }
        args.extend(["schedule", "install", "--dir", units.to_str().unwrap()]);
        args.extend_from_slice(extra);
        w.run(&args, &[])
    };
    let evil = w.dir.join("a\nExecStartPre=touch PWNED\n.toml");
    std::fs::copy(&w.config, &evil).unwrap();
    let o = install(Some(&evil), &["--no-start"]);
    assert_eq!(o.status.code(), Some(2), "{}", err(&o));
    assert!(err(&o).contains("control character"), "{}", err(&o));
    assert!(!units.join("capsule.service").exists());
    let dollar = w.dir.join("$HOME-cfg.toml");
    std::fs::copy(&w.config, &dollar).unwrap();
    let o = install(Some(&dollar), &["--no-start"]);
    assert!(o.status.success(), "{}", err(&o));
    let unit = std::fs::read_to_string(units.join("capsule.service")).unwrap();
    assert!(unit.contains("$$HOME-cfg.toml"), "{unit}");
    // The manager cannot start a unit that is not where it looks (or is
    // not running here at all): not exit 0.
    let o = install(None, &["--system"]);
    assert_eq!(o.status.code(), Some(1), "{}", err(&o));
    assert!(
        err(&o).contains("systemctl enable --now capsule.service"),
        "{}",
        err(&o)
    );
}

/// Item 7: A password command that never ends is stopped after the timeout,
/// named; one that leaves a child holding its output open is read when it
/// exits.
#[test]
fn a_password_command_that_hangs_is_bounded_and_one_that_forks_is_read_at_exit() {
    let w = World::new("sleep 1000");
    let o = w.run(
        &["--profile", "p", "init"],
        &[("CAPSULE_SECRET_TIMEOUT", "2")],
    );
    assert_eq!(o.status.code(), Some(10), "{}", err(&o));
    assert!(
        err(&o).contains("\"sleep 1000\") did not end within 2 s"),
        "{}",
        err(&o)
    );
    // The child keeps the command's output open; its stderr, which is
    // capsule's (this test reads that to its end), goes elsewhere.
    w.write(
        &format!("sleep 60 2>/dev/null & echo {PASSWORD}"),
        &w.dir.join("repo"),
    );
    let o = w.run(&["--profile", "p", "init"], &[]);
    assert!(o.status.success(), "{}", err(&o));
    let o = w.run(
        &["--profile", "p", "init"],
        &[("CAPSULE_SECRET_TIMEOUT", "x")],
    );
    assert_ne!(o.status.code(), Some(0), "{}", err(&o));
    assert!(err(&o).contains("CAPSULE_SECRET_TIMEOUT"), "{}", err(&o));
}

/// Item 8: A journal file that is a FIFO or a link to /dev/zero: `status` and a
/// backup end, and the backup scans in full saying why.
#[test]
fn a_journal_file_that_is_a_fifo_or_a_device_is_not_read() {
    let w = World::new(&pw());
    assert!(w.run(&["--profile", "p", "init"], &[]).status.success());
    let jdir = w.dir.join("state/journal");
    std::fs::create_dir_all(&jdir).unwrap();
    let journal = jdir.join("p.json");
    rustix::fs::mknodat(
        rustix::fs::CWD,
        &journal,
        rustix::fs::FileType::Fifo,
        rustix::fs::Mode::from_raw_mode(0o600),
        0,
    )
    .unwrap();
    let (_, text, _) = w.status();
    assert!(text.starts_with("p: STALE"), "{text}");
    let o = w.run(&["--profile", "p", "--json", "backup"], &[]);
    assert!(o.status.success(), "{}", err(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert!(
        v["scan"]["reason"]
            .as_str()
            .unwrap()
            .contains("not a regular file"),
        "{v}"
    );
    std::fs::remove_file(&journal).unwrap();
    std::os::unix::fs::symlink("/dev/zero", &journal).unwrap();
    w.status();
    let o = w.run(&["--profile", "p", "--json", "backup"], &[]);
    assert!(o.status.success(), "{}", err(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert!(
        v["scan"]["reason"].as_str().unwrap().contains("a symlink"),
        "{v}"
    );
}

/// Item 9: The test clock: a file that never ends, a FIFO, or garbage is an
/// error at once (exit 2), not a hang or the real clock.
#[test]
fn a_test_clock_that_is_not_a_time_is_an_error() {
    let t = tempfile::tempdir().unwrap();
    let repo = t.path().join("repo");
    let fifo = t.path().join("fifo");
    rustix::fs::mknodat(
        rustix::fs::CWD,
        &fifo,
        rustix::fs::FileType::Fifo,
        rustix::fs::Mode::from_raw_mode(0o600),
        0,
    )
    .unwrap();
    let at_fifo = format!("@{}", fifo.display());
    for v in ["@/dev/zero", "garbage", "", at_fifo.as_str()] {
        let mut c = capsule_cmd(&TestEnv::beside(&repo).password(PASSWORD).clock(v));
        c.arg("--repo").arg(&repo).arg("snapshots");
        let o = bounded(c);
        assert_eq!(o.status.code(), Some(2), "{v:?}: {}", err(&o));
        assert!(err(&o).contains("CAPSULE_TEST_NOW"), "{v:?}: {}", err(&o));
    }
}

/// Item 10, 11 and 12: Names say what they resolved; a snapshot dated in the
/// future is named as such; backup and restore parse patterns alike.
#[test]
fn names_say_what_they_resolved_and_patterns_parse_alike() {
    let t = tempfile::tempdir().unwrap();
    let repo = t.path().join("repo");
    let src = t.path().join("src");
    std::fs::create_dir_all(&src).unwrap();
    std::fs::write(src.join("f"), b"x").unwrap();
    init(&repo);
    let s = src.to_str().unwrap();
    let at = |now: &str, args: &[&str]| {
        capsule_env(
            &repo,
            args,
            &[("CAPSULE_PASSWORD", PASSWORD), ("CAPSULE_TEST_NOW", now)],
        )
    };
    assert!(at("2026-01-01T00:00:00Z", &["backup", s]).status.success());
    assert!(at("2026-01-02T00:00:00Z", &["backup", s]).status.success());
    assert!(at("2035-01-01T00:00:00Z", &["backup", s]).status.success());
    let target = t.path().join("r1");
    let o = capsule(
        &repo,
        &["restore", "latest~1", "--target", target.to_str().unwrap()],
    );
    assert!(o.status.success(), "{}", err(&o));
    assert!(err(&o).contains("\"latest~1\" is "), "{}", err(&o));
    assert!(!err(&o).contains("\"latest\" is"), "{}", err(&o));
    let target = t.path().join("r2");
    let o = capsule(
        &repo,
        &[
            "restore",
            "--at",
            "2040-01-01",
            "--target",
            target.to_str().unwrap(),
        ],
    );
    assert!(o.status.success(), "{}", err(&o));
    assert!(
        err(&o).contains("is dated 2035-01-01T00:00:00Z, in the future"),
        "{}",
        err(&o)
    );
    let o = capsule(&repo, &["backup", "--exclude", "[", s]);
    assert_eq!(o.status.code(), Some(2), "{}", err(&o));
    assert!(err(&o).contains("bad pattern \"[\""), "{}", err(&o));
    let o = capsule(
        &repo,
        &[
            "restore",
            "latest",
            "--target",
            "/nonexistent-x",
            "--exclude",
            "[",
        ],
    );
    assert_eq!(o.status.code(), Some(2), "{}", err(&o));
    assert!(err(&o).contains("bad pattern \"[\""), "{}", err(&o));
}

/// Item 13: A wrong password from a profile's command: the hint names it.
#[test]
fn a_wrong_password_names_where_it_came_from() {
    let w = World::new(&pw());
    assert!(w.run(&["--profile", "p", "init"], &[]).status.success());
    w.write("echo wrong", &w.dir.join("repo"));
    let o = w.run(&["--profile", "p", "snapshots"], &[]);
    assert_eq!(o.status.code(), Some(10), "{}", err(&o));
    assert!(
        err(&o).contains("the password-command of profile \"p\" (\"echo wrong\")"),
        "{}",
        err(&o)
    );
    assert!(!err(&o).contains("CAPSULE_PASSWORD_FILE"), "{}", err(&o));
}
