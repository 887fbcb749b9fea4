//! Profiles (`capsule.toml`): precedence, mistakes, secrets.

// The command-line suite runs on Linux, against real servers, btrfs,
// fanotify and network namespaces; the macOS build checks the libraries.
#![cfg(target_os = "linux")]
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod common;

use std::path::Path;
use std::process::Output;

use common::*;

/// Runs capsule with only `env` set of capsule's variables (no
/// `CAPSULE_PASSWORD` unless given), the config file at `config`.
fn run(config: &Path, args: &[&str], env: &[(&str, &str)]) -> Output {
    // No CAPSULE_CACHE_DIR: where the cache goes is what some tests check.
    let env_ = TestEnv::bare()
        .config(config)
        .state(config.with_extension("state"))
        .var("XDG_CACHE_HOME", config.with_extension("cache"));
    let mut c = capsule_cmd(&env_);
    c.args(args);
    for (k, v) in env {
        c.env(k, v);
    }
    c.output().unwrap()
}

fn err(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn setting(o: &Output, key: &str) -> (String, String) {
    assert!(o.status.success(), "{}", err(o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let s = &v["settings"][key];
    (
        s["value"].as_str().unwrap().to_string(),
        s["from"].as_str().unwrap().to_string(),
    )
}

#[test]
fn a_profile_backs_up_its_sources_with_its_repository_and_password_command() {
    let t = tempfile::tempdir().unwrap();
    let (src, repo) = (t.path().join("src"), t.path().join("repo"));
    std::fs::create_dir_all(src.join("skip")).unwrap();
    std::fs::write(src.join("a"), b"a").unwrap();
    std::fs::write(src.join("skip/b"), b"b").unwrap();
    let config = t.path().join("capsule.toml");
    std::fs::write(
        &config,
        format!(
            "[profiles.docs]\nsources = [{src:?}]\nexcludes = [\"skip\"]\nrepository = {repo:?}\npassword-command = \"echo {PASSWORD}\"\ntags = [\"daily\"]\n\n[profiles.docs.retention]\nkeep-last = 1\n",
            src = src.display().to_string(),
            repo = repo.display().to_string(),
        ),
    )
    .unwrap();
    let o = run(&config, &["--profile", "docs", "init"], &[]);
    assert!(o.status.success(), "{}", err(&o));
    let o = run(&config, &["--profile", "docs", "--json", "backup"], &[]);
    assert!(o.status.success(), "{}", err(&o));
    let o = run(
        &config,
        &["--json", "snapshots"],
        &[("CAPSULE_PROFILE", "docs")],
    );
    assert!(o.status.success(), "{}", err(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v[0]["snapshot"]["paths"][0], src.display().to_string());
    assert_eq!(v[0]["snapshot"]["tags"][0], "daily");
    assert_eq!(
        v[0]["snapshot"]["summary"]["files"], 1,
        "excluded skip/: {v}"
    );
    // A second backup, then the profile's retention (keep-last 1).
    std::fs::write(src.join("a"), b"a2").unwrap();
    assert!(run(&config, &["--profile", "docs", "backup"], &[])
        .status
        .success());
    let o = run(&config, &["--profile", "docs", "--json", "forget"], &[]);
    assert!(o.status.success(), "{}", err(&o));
    let o = run(&config, &["--profile", "docs", "--json", "snapshots"], &[]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v.as_array().unwrap().len(), 1, "{v}");
}

#[test]
fn flag_then_environment_then_profile_then_default() {
    let t = tempfile::tempdir().unwrap();
    let config = t.path().join("capsule.toml");
    std::fs::write(
        &config,
        "[profiles.p]\nrepository = \"/from/profile\"\nconnections = 3\n",
    )
    .unwrap();
    let show = |args: &[&str], env: &[(&str, &str)]| {
        let mut a = vec!["--json"];
        a.extend_from_slice(args);
        a.extend_from_slice(&["config", "show"]);
        run(&config, &a, env)
    };
    assert_eq!(setting(&show(&[], &[]), "repository").1, "default");
    assert_eq!(
        setting(&show(&["--profile", "p"], &[]), "repository"),
        ("/from/profile".into(), "profile".into())
    );
    assert_eq!(
        setting(
            &show(&["--profile", "p"], &[("CAPSULE_REPO", "/from/env")]),
            "repository"
        ),
        ("/from/env".into(), "environment".into())
    );
    assert_eq!(
        setting(
            &show(
                &["--profile", "p", "--repo", "/from/flag"],
                &[("CAPSULE_REPO", "/from/env")]
            ),
            "repository"
        ),
        ("/from/flag".into(), "flag".into())
    );
    assert_eq!(
        setting(&show(&["--profile", "p"], &[]), "connections"),
        ("3".into(), "profile".into())
    );
    assert_eq!(
        setting(
            &show(&["--profile", "p", "--connections", "5"], &[]),
            "connections"
        ),
        ("5".into(), "flag".into())
    );
}

#[test]
fn config_mistakes_name_the_file_the_line_and_the_key() {
    let t = tempfile::tempdir().unwrap();
    let config = t.path().join("capsule.toml");
    let cases = [
        (
            "[profiles.p]\nsources = [\"/x\"]\nrepositry = \"/r\"\n",
            ":3",
            "repositry",
        ),
        (
            "[profiles.p]\n[profiles.p.schedule]\nbackup = \"sometimes\"\n",
            ":3",
            "backup",
        ),
        ("[profiles.p]\nwhen-full = \"panic\"\n", ":2", "when-full"),
        ("[profiles.p]\nconnections = -1\n", ":2", "connections"),
    ];
    for (text, line, key) in cases {
        std::fs::write(&config, text).unwrap();
        for args in [
            &["config", "check"][..],
            &["--profile", "p", "snapshots"][..],
        ] {
            let o = run(&config, args, &[]);
            assert_eq!(o.status.code(), Some(2), "{text}: {}", err(&o));
            let e = err(&o);
            assert!(
                e.contains(&format!("{}{line}", config.display())) && e.contains(key),
                "{text}: {e}"
            );
        }
    }
    // Issue 59, 5: a pattern every backup of the profile would refuse is
    // refused by `config check` too, naming the profile and the key.
    std::fs::write(
        &config,
        "[profiles.p]\nsources = [\"/x\"]\nexcludes = [\"[\"]\n",
    )
    .unwrap();
    let o = run(&config, &["config", "check"], &[]);
    assert_eq!(o.status.code(), Some(2), "{}", err(&o));
    assert!(
        err(&o).contains("profile p: excludes") && err(&o).contains(&config.display().to_string()),
        "{}",
        err(&o)
    );
    std::fs::write(&config, "[profiles.laptop]\n[profiles.nas]\n").unwrap();
    let o = run(&config, &["--profile", "lapton", "snapshots"], &[]);
    assert_eq!(o.status.code(), Some(2));
    assert!(err(&o).contains("laptop, nas"), "{}", err(&o));
    let o = run(&config, &["config", "check"], &[]);
    assert!(o.status.success(), "{}", err(&o));
    // A named file that does not exist is a mistake too.
    let o = run(
        &t.path().join("none.toml"),
        &["--profile", "p", "snapshots"],
        &[],
    );
    assert_eq!(o.status.code(), Some(2), "{}", err(&o));
}

#[test]
fn secrets_are_masked_and_an_inline_one_in_a_readable_file_is_warned_about() {
    use std::os::unix::fs::PermissionsExt;
    let t = tempfile::tempdir().unwrap();
    let config = t.path().join("capsule.toml");
    std::fs::write(
        &config,
        "[profiles.p]\nrepository = \"/r\"\npassword = \"hunter2\"\ncredentials = { password = \"swordfish\" }\n",
    )
    .unwrap();
    std::fs::set_permissions(&config, std::fs::Permissions::from_mode(0o644)).unwrap();
    let o = run(&config, &["--profile", "p", "config", "show"], &[]);
    assert!(o.status.success(), "{}", err(&o));
    let all = format!("{}{}", String::from_utf8_lossy(&o.stdout), err(&o));
    assert!(
        !all.contains("hunter2") && !all.contains("swordfish"),
        "{all}"
    );
    assert!(all.contains("********"), "{all}");
    assert!(err(&o).contains("other users may read it"), "{}", err(&o));
    std::fs::set_permissions(&config, std::fs::Permissions::from_mode(0o600)).unwrap();
    let o = run(&config, &["--profile", "p", "config", "show"], &[]);
    assert!(!err(&o).contains("other users"), "{}", err(&o));
}

#[test]
fn a_password_command_that_fails_or_prints_nothing_names_the_profile() {
    let t = tempfile::tempdir().unwrap();
    let repo = t.path().join("repo");
    init(&repo);
    let config = t.path().join("capsule.toml");
    for cmd in ["false", "true"] {
        std::fs::write(
            &config,
            format!(
                "[profiles.p]\nrepository = {:?}\npassword-command = \"{cmd}\"\n",
                repo.display().to_string()
            ),
        )
        .unwrap();
        let o = run(&config, &["--profile", "p", "snapshots"], &[]);
        assert_eq!(o.status.code(), Some(10), "{cmd}: {}", err(&o));
        assert!(
            err(&o).contains("profile \"p\": password-command"),
            "{}",
            err(&o)
        );
    }
}

/// `status` from local records only: stale before any backup (no daemon
/// ever ran), fresh after one, stale again once twice the interval has
/// passed with no success, and "failing" (its own code) when the last run
/// failed while the last success is still fresh.
#[test]
fn status_reports_staleness_and_failures_with_its_own_exit_codes() {
    let t = tempfile::tempdir().unwrap();
    let (src, repo) = (t.path().join("src"), t.path().join("repo"));
    std::fs::create_dir_all(&src).unwrap();
    std::fs::write(src.join("f"), b"x").unwrap();
    let config = t.path().join("capsule.toml");
    let write = |cmd: &str| {
        std::fs::write(
            &config,
            format!(
                "[profiles.p]\nsources = [{:?}]\nrepository = {:?}\npassword-command = \"{cmd}\"\nschedule = {{ backup = \"hourly\" }}\n",
                src.display().to_string(),
                repo.display().to_string()
            ),
        )
        .unwrap();
    };
    write(&format!("echo {PASSWORD}"));
    let status = |env: &[(&str, &str)]| {
        let o = run(&config, &["--json", "status"], env);
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap_or_default();
        (o.status.code(), v)
    };
    let (code, v) = status(&[]);
    assert_eq!(code, Some(20), "never backed up: {v}");
    assert!(v["profiles"][0]["last_success"].is_null());
    assert!(run(&config, &["--profile", "p", "init"], &[])
        .status
        .success());
    let o = run(&config, &["--profile", "p", "backup"], &[]);
    assert!(o.status.success(), "{}", err(&o));
    let (code, v) = status(&[]);
    assert_eq!(code, Some(0), "{v}");
    assert_eq!(v["profiles"][0]["last_run"]["result"], "ok");
    assert_eq!(v["profiles"][0]["last_run"]["files"], 1);
    // Three hours on, with no success since: stale (hourly: after 2 h).
    let later = (capsule_now() + 3 * 3600).to_string();
    let (code, v) = status(&[("CAPSULE_TEST_NOW", &later)]);
    assert_eq!(code, Some(20), "{v}");
    // A failed run with the last success still fresh: failing.
    write("false");
    let o = run(&config, &["--profile", "p", "backup"], &[]);
    assert_eq!(o.status.code(), Some(10));
    let (code, v) = status(&[]);
    assert_eq!(code, Some(21), "{v}");
    assert!(v["profiles"][0]["last_run"]["error"]
        .as_str()
        .unwrap()
        .contains("password-command"));
    let text = String::from_utf8_lossy(&run(&config, &["status"], &[]).stdout).into_owned();
    assert!(
        text.contains("p: FAILING: the last run failed") && text.contains("last backup"),
        "{text}"
    );
}

fn capsule_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
}

/// `schedule install` writes a systemd unit that `systemd-analyze verify`
/// accepts and a launchd plist that parses with the expected keys, both
/// running `capsule --config FILE daemon`; `remove` takes them away.
#[test]
fn schedule_writes_a_valid_systemd_unit_and_launchd_plist() {
    let t = tempfile::tempdir().unwrap();
    let config = t.path().join("capsule.toml");
    std::fs::write(&config, "[profiles.p]\nsources = [\"/tmp\"]\n").unwrap();
    let units = t.path().join("units");
    let dir = units.to_str().unwrap();
    let o = run(
        &config,
        &[
            "schedule",
            "install",
            "--dir",
            dir,
            "--no-start",
            "--manager",
            "systemd",
        ],
        &[],
    );
    assert!(o.status.success(), "{}", err(&o));
    let unit = units.join("capsule.service");
    let text = std::fs::read_to_string(&unit).unwrap();
    assert!(
        text.contains(&format!(
            "--config {} daemon",
            config.canonicalize().unwrap().display()
        )),
        "{text}"
    );
    assert!(text.contains("Restart=on-failure") && text.contains("WantedBy=default.target"));
    // systemd-analyze is installed by scripts/test.sh; without it the unit
    // is still checked for its keys above.
    match std::process::Command::new("systemd-analyze")
        .arg("verify")
        .arg(&unit)
        .output()
    {
        Ok(v) => assert!(v.status.success(), "{}", String::from_utf8_lossy(&v.stderr)),
        Err(e) => eprintln!("systemd-analyze not run: {e}"),
    }
    let o = run(
        &config,
        &[
            "schedule",
            "install",
            "--dir",
            dir,
            "--no-start",
            "--manager",
            "launchd",
        ],
        &[],
    );
    assert!(o.status.success(), "{}", err(&o));
    let plist = units.join("org.capsule.daemon.plist");
    let check = std::process::Command::new("python3")
        .arg("-c")
        .arg(
            "import plistlib,sys; d=plistlib.load(open(sys.argv[1],'rb')); \
             assert d['Label']=='org.capsule.daemon'; assert d['ProgramArguments'][-1]=='daemon'; \
             assert d['ProgramArguments'][1]=='--config'; assert d['RunAtLoad'] is True; \
             assert d['KeepAlive']=={'SuccessfulExit': False}",
        )
        .arg(&plist)
        .output()
        .unwrap();
    assert!(
        check.status.success(),
        "{}",
        String::from_utf8_lossy(&check.stderr)
    );
    let o = run(
        &config,
        &[
            "--json",
            "schedule",
            "status",
            "--dir",
            dir,
            "--manager",
            "systemd",
        ],
        &[],
    );
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["installed"], true, "{v}");
    for m in ["systemd", "launchd"] {
        let o = run(
            &config,
            &[
                "schedule",
                "remove",
                "--dir",
                dir,
                "--no-start",
                "--manager",
                m,
            ],
            &[],
        );
        assert!(o.status.success(), "{}", err(&o));
    }
    assert!(!unit.exists() && !plist.exists());
    // A broken configuration is refused before anything is written.
    std::fs::write(&config, "[profiles.p]\nsorces = []\n").unwrap();
    let o = run(
        &config,
        &["schedule", "install", "--dir", dir, "--no-start"],
        &[],
    );
    assert_eq!(o.status.code(), Some(2), "{}", err(&o));
    assert!(!unit.exists());
}

/// `status` shows the repository's size against its quota and the last
/// check, from this machine's records; `--refresh` asks the destination,
/// and a destination that cannot answer is reported, not fatal.
#[test]
fn status_shows_the_size_against_the_quota_and_the_last_check() {
    let t = tempfile::tempdir().unwrap();
    let (src, repo) = (t.path().join("src"), t.path().join("repo"));
    std::fs::create_dir_all(&src).unwrap();
    std::fs::write(src.join("a"), vec![7u8; 100_000]).unwrap();
    let config = t.path().join("capsule.toml");
    let write = |repo: &Path| {
        std::fs::write(
            &config,
            format!(
                "[profiles.p]\nsources = [{:?}]\nrepository = {:?}\npassword-command = \"echo {PASSWORD}\"\n",
                src.display().to_string(),
                repo.display().to_string(),
            ),
        )
        .unwrap()
    };
    write(&repo);
    let status = || {
        let o = run(&config, &["--json", "status"], &[]);
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        v["profiles"][0].clone()
    };
    let o = run(&config, &["--profile", "p", "init"], &[]);
    assert!(o.status.success(), "{}", err(&o));
    let s = status();
    assert!(
        s["repository"].is_null() && s["last_check"].is_null(),
        "{s}"
    );
    let o = run(&config, &["--profile", "p", "quota", "set", "1G"], &[]);
    assert!(o.status.success(), "{}", err(&o));
    let o = run(&config, &["--profile", "p", "backup"], &[]);
    assert!(o.status.success(), "{}", err(&o));
    // The backup measured the size, since there is a quota.
    let s = status();
    assert_eq!(s["repository"]["quota"], 1u64 << 30, "{s}");
    let stored = s["repository"]["stored"].as_u64().unwrap();
    assert!(stored > 0, "{s}");
    let o = run(&config, &["--profile", "p", "check"], &[]);
    assert!(o.status.success(), "{}", err(&o));
    let s = status();
    assert_eq!(s["last_check"]["result"], "ok", "{s}");
    assert_eq!(s["last_check"]["read_data"], false);
    let text = run(&config, &["status"], &[]);
    let text = String::from_utf8_lossy(&text.stdout).into_owned();
    assert!(text.contains("of its 1.0 GiB quota"), "{text}");
    assert!(text.contains("last check"), "{text}");
    // --refresh asks the destination: more data is seen at once.
    std::fs::write(
        src.join("b"),
        (0..200_000u32)
            .map(|i| (i * 7919 % 251) as u8)
            .collect::<Vec<_>>(),
    )
    .unwrap();
    // Backed up without the profile: nothing of it is recorded here.
    let o = run(
        &config,
        &[
            "-r",
            repo.to_str().unwrap(),
            "backup",
            src.to_str().unwrap(),
        ],
        &[("CAPSULE_PASSWORD", PASSWORD)],
    );
    assert!(o.status.success(), "{}", err(&o));
    assert_eq!(status()["repository"]["stored"].as_u64(), Some(stored));
    let o = run(&config, &["--json", "status", "--refresh"], &[]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let s = &v["profiles"][0];
    assert!(s["refresh_error"].is_null(), "{s}");
    assert!(s["repository"]["stored"].as_u64().unwrap() > stored, "{s}");
    // A repository that is not there: said, and status still answers.
    write(&t.path().join("gone"));
    let o = run(&config, &["--json", "status", "--refresh"], &[]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let e = v["profiles"][0]["refresh_error"].as_str().unwrap_or("");
    assert!(e.contains("gone"), "{v}");
    assert_eq!(o.status.code(), Some(0), "{}", err(&o));
    // A check that cannot run is recorded as failed.
    let o = run(&config, &["--profile", "p", "check"], &[]);
    assert!(!o.status.success());
    assert_eq!(status()["last_check"]["result"], "failed");
}

/// A user who wrote one profile and no `--profile`: commands use it (and
/// say so once) while there is no repository at the default; a second
/// profile makes them ask, naming both; `default-profile` chooses for
/// every command, and a wrong one is a mistake in the file.
#[test]
fn the_only_profile_or_the_default_profile_is_used_when_none_is_named() {
    let t = tempfile::tempdir().unwrap();
    let home = t.path().join("home");
    std::fs::create_dir_all(home.join("data")).unwrap();
    let (src, repo) = (t.path().join("src"), t.path().join("laptop-repo"));
    std::fs::create_dir_all(&src).unwrap();
    std::fs::write(src.join("a"), b"a").unwrap();
    let config = t.path().join("capsule.toml");
    let laptop = format!(
        "[profiles.laptop]\nsources = [{:?}]\nrepository = {:?}\npassword-command = \"echo {PASSWORD}\"\n",
        src.display().to_string(),
        repo.display().to_string()
    );
    std::fs::write(&config, &laptop).unwrap();
    let run = |args: &[&str]| {
        let env = TestEnv::bare()
            .config(&config)
            .home(&home)
            .state(t.path().join("state"))
            .cache(t.path().join("cache"));
        capsule_cmd(&env).args(args).output().unwrap()
    };
    let o = run(&["init"]);
    assert!(o.status.success(), "{}", err(&o));
    assert!(
        err(&o).contains("using profile \"laptop\", the only one in"),
        "{}",
        err(&o)
    );
    assert!(
        repo.join("config").exists(),
        "init went to the profile's repository"
    );
    let o = run(&["backup"]);
    assert!(o.status.success(), "{}", err(&o));
    // Said once: not again.
    assert!(!err(&o).contains("using profile"), "{}", err(&o));
    let o = run(&["--json", "snapshots"]);
    assert!(o.status.success(), "{}", err(&o));
    let snaps: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(snaps.as_array().unwrap().len(), 1, "{snaps}");
    // A second profile: nothing to choose by, so the default repository,
    // which does not exist; the message names both profiles.
    let desk = "[profiles.desk]\nrepository = \"/nonexistent/desk\"\n";
    std::fs::write(&config, format!("{laptop}\n{desk}")).unwrap();
    let o = run(&["snapshots"]);
    assert_eq!(o.status.code(), Some(2), "{}", err(&o));
    assert!(
        err(&o).contains("--profile") && err(&o).contains("desk, laptop"),
        "{}",
        err(&o)
    );
    // default-profile chooses, silently.
    std::fs::write(
        &config,
        format!("default-profile = \"laptop\"\n\n{laptop}\n{desk}"),
    )
    .unwrap();
    let o = run(&["--json", "snapshots"]);
    assert!(o.status.success(), "{}", err(&o));
    assert!(!err(&o).contains("using profile"), "{}", err(&o));
    // A flag still wins over it.
    let o = run(&["--profile", "desk", "snapshots"]);
    assert!(!o.status.success());
    assert!(err(&o).contains("/nonexistent/desk"), "{}", err(&o));
    // A default naming no profile: the file, the line, the profiles.
    std::fs::write(
        &config,
        format!("default-profile = \"lap\"\n\n{laptop}\n{desk}"),
    )
    .unwrap();
    let o = run(&["snapshots"]);
    assert_eq!(o.status.code(), Some(2), "{}", err(&o));
    assert!(
        err(&o).contains("capsule.toml:1")
            && err(&o).contains("\"lap\"")
            && err(&o).contains("desk, laptop"),
        "{}",
        err(&o)
    );
}
