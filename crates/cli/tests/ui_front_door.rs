//! The page as the front door, in headless Chromium: a set-up of profiles
//! only, where a plain `capsule ui` opens on what the default profile
//! backed up; "Back up now" adding a snapshot to the timeline; "Put back"
//! of a changed file, asked first, then restored byte for byte in place;
//! a quick look at an image version; another profile's repository shown
//! with its own password; and every new action refused without the token.

// The command-line suite runs on Linux, against real servers, btrfs,
// fanotify and network namespaces; the macOS build checks the libraries.
#![cfg(target_os = "linux")]
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod common;

use std::path::Path;

use common::chrome::*;
use common::page::*;
use common::*;

/// A 3 × 2 red PNG.
const PIXELS: &str = "89504e470d0a1a0a0000000d49484452000000030000000208020000001216f14d0000001049444154789c63f8cfc000410c70160041d205fb87f0b9480000000049454e44ae426082";

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

/// Two profiles, each with its own repository and password, the first the
/// default; both backed up once. (environment, docs, pics)
fn profiles(t: &Path) -> (TestEnv, std::path::PathBuf, std::path::PathBuf) {
    let (docs, pics) = (t.join("src/docs"), t.join("src/pics"));
    std::fs::create_dir_all(&docs).unwrap();
    std::fs::create_dir_all(&pics).unwrap();
    std::fs::write(docs.join("notes.txt"), "the first version\n").unwrap();
    std::fs::write(docs.join("pixels.png"), unhex(PIXELS)).unwrap();
    std::fs::write(docs.join("data.bin"), noise(70_000, 1)).unwrap();
    std::fs::write(pics.join("holiday.bin"), noise(40_000, 2)).unwrap();
    let config = t.join("capsule.toml");
    std::fs::write(
        &config,
        format!(
            "default-profile = \"laptop\"\n\n\
             [profiles.laptop]\nsources = [{docs:?}]\nrepository = {:?}\npassword-command = \"echo pw-laptop\"\n\n\
             [profiles.photos]\nsources = [{pics:?}]\nrepository = {:?}\npassword-command = \"echo pw-photos\"\n",
            t.join("repo-laptop"),
            t.join("repo-photos"),
        ),
    )
    .unwrap();
    let env = TestEnv::bare()
        .home(t.join("home"))
        .config(&config)
        .state(t.join("state"))
        .cache(t.join("cache"));
    for p in ["laptop", "photos"] {
        for cmd in ["init", "backup"] {
            let o = capsule_cmd(&env)
                .args(["--profile", p, cmd])
                .output()
                .unwrap();
            assert!(o.status.success(), "{p} {cmd}: {o:?}");
        }
    }
    (env, docs, pics)
}

fn snapshots(env: &TestEnv, profile: &str) -> usize {
    let o = capsule_cmd(env)
        .args(["--profile", profile, "--json", "snapshots"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{o:?}");
    serde_json::from_slice::<serde_json::Value>(&o.stdout)
        .unwrap()
        .as_array()
        .unwrap()
        .len()
}

#[test]
fn the_page_backs_up_puts_back_and_looks_from_profiles_alone() {
    let Some(bin) = chromium() else {
        return;
    };
    let t = tempfile::tempdir().unwrap();
    let (env, docs, pics) = profiles(t.path());
    // Changed since the snapshot: what "Back up now" saves.
    std::fs::write(docs.join("notes.txt"), "the second version, longer\n").unwrap();

    // No repository, no profile named: the default profile's.
    let s = serve_with(&env, &[]);

    // Every new action refused without the token.
    let newest = &get_json(&s, "/api/snapshots")[0];
    let look = format!(
        "/api/look?snapshot={}&path={}",
        newest["id"].as_str().unwrap(),
        enc(docs.join("pixels.png").to_str().unwrap())
    );
    let json = [("content-type", "application/json")];
    for (method, target, body) in [
        ("GET", look.as_str(), String::new()),
        ("POST", "/api/backup", r#"{"profile":"laptop"}"#.to_string()),
        (
            "POST",
            "/api/profile",
            r#"{"profile":"photos"}"#.to_string(),
        ),
        (
            "POST",
            "/api/put-back",
            serde_json::json!({ "snapshot": newest["id"], "path": docs.join("notes.txt") })
                .to_string(),
        ),
    ] {
        let (code, _, _) = http(&s, method, target, &json, body.as_bytes());
        assert_eq!(code, 401, "{method} {target} without the token");
    }
    assert_eq!(snapshots(&env, "laptop"), 1, "nothing was started");
    assert_eq!(
        std::fs::read(docs.join("notes.txt")).unwrap(),
        b"the second version, longer\n",
        "nothing was put back"
    );

    // The quick look: the image as stored, with its own type, and a
    // policy that lets it load and run nothing.
    let (code, head, body) = http(&s, "GET", &look, &[("x-capsule-token", &s.token)], b"");
    assert_eq!(code, 200, "{head}");
    let head = head.to_ascii_lowercase();
    assert!(head.contains("content-type: image/png"), "{head}");
    assert!(head.contains("x-content-type-options: nosniff"), "{head}");
    assert!(
        head.contains("content-security-policy: default-src 'none'") && head.contains("sandbox"),
        "{head}"
    );
    assert_eq!(body, unhex(PIXELS));
    let binary = look.replace("pixels.png", "data.bin");
    assert_eq!(get(&s, &binary).0, 415, "no quick look of a binary file");

    let browser = launch(bin);
    let tab = open_page(&browser, &s);
    // Opened on the folder the profile backs up, not on /.
    until(
        &tab,
        &format!(
            "path === {} && document.querySelectorAll('#listing tr.row').length === 3",
            js(docs.to_str().unwrap())
        ),
        "the docs folder, where the default profile's snapshot opens",
    );
    until(
        &tab,
        "document.querySelector('#profiles b.cur') && document.querySelector('#profiles b.cur').innerText === 'laptop' && document.querySelector('#profiles a.prof[data-p=photos]') !== null",
        "both profiles listed, laptop shown",
    );

    // Back up now: a second snapshot, in the timeline without a reload.
    click(&tab, "button.bnow[data-p=laptop]");
    until(
        &tab,
        "snaps.length === 2 && document.querySelectorAll('#chart g.snap').length === 2 && document.querySelector('#bdone').innerText.includes('backup of laptop: saved')",
        "the new snapshot in the timeline",
    );
    assert_eq!(snapshots(&env, "laptop"), 2);
    screenshot(&tab, "front-door.png");

    // Put back: the file changed again; the newest version is asked about,
    // then put back byte for byte.
    std::fs::write(docs.join("notes.txt"), "an edit to undo").unwrap();
    tab.evaluate("pick(snaps[1].id)", false).unwrap();
    click(&tab, "tr.row[data-n='notes.txt']");
    until(
        &tab,
        "document.querySelectorAll('#versions a.put').length === 2",
        "notes.txt's two versions",
    );
    // The versions come newest last.
    tab.evaluate(
        "[...document.querySelectorAll('#versions a.put')].pop().click()",
        false,
    )
    .unwrap();
    until(
        &tab,
        "!document.querySelector('#pask').hidden && document.querySelector('#plist').innerText.includes('notes.txt')",
        "the question before replacing",
    );
    assert_eq!(
        std::fs::read(docs.join("notes.txt")).unwrap(),
        b"an edit to undo",
        "nothing replaced before the answer"
    );
    screenshot(&tab, "put-back.png");
    click(&tab, "#preplace");
    until(
        &tab,
        "document.querySelector('#pdone').innerText.includes('Put back')",
        "the put back's report",
    );
    assert_eq!(
        std::fs::read(docs.join("notes.txt")).unwrap(),
        b"the second version, longer\n"
    );
    let left: Vec<_> = std::fs::read_dir(&docs)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(left.len(), 3, "no staging folder left behind: {left:?}");

    // Quick look of the image's version, drawn by the browser.
    click(&tab, "tr.row[data-n='pixels.png']");
    until(
        &tab,
        "document.querySelectorAll('#versions a.look').length === 1",
        "pixels.png's version",
    );
    click(&tab, "#versions a.look");
    until(
        &tab,
        "document.querySelector('#lookimg') && document.querySelector('#lookimg').complete && document.querySelector('#lookimg').naturalWidth === 3",
        "the image drawn in the page",
    );

    // The other profile: its repository, opened with its own password.
    click(&tab, "#profiles a.prof[data-p=photos]");
    until(
        &tab,
        &format!(
            "path === {} && document.querySelector('#listing tr.row[data-n=\"holiday.bin\"]') !== null && document.querySelector('#profiles b.cur').innerText === 'photos'",
            js(pics.to_str().unwrap())
        ),
        "the photos profile's folder",
    );
}

/// With a daemon running the profile, "Back up now" asks it, and its run
/// is the one that saves the snapshot.
#[test]
fn back_up_now_goes_through_the_daemon_when_one_runs() {
    let t = tempfile::tempdir().unwrap();
    let (env, docs, _) = profiles(t.path());
    let config = t.path().join("capsule.toml");
    let text = std::fs::read_to_string(&config).unwrap();
    // Hourly, and backed up just now: not due for an hour.
    std::fs::write(
        &config,
        text.replace(
            "password-command = \"echo pw-laptop\"\n",
            "password-command = \"echo pw-laptop\"\nschedule = { backup = \"hourly\" }\n",
        ),
    )
    .unwrap();
    std::fs::write(docs.join("notes.txt"), "changed for the daemon's run\n").unwrap();
    let daemon = Stopped(
        capsule_cmd(&env)
            .arg("daemon")
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap(),
    );
    let status = || {
        let o = capsule_cmd(&env)
            .args(["--json", "status"])
            .output()
            .unwrap();
        serde_json::from_slice::<serde_json::Value>(&o.stdout).unwrap()
    };
    let laptop = |v: &serde_json::Value| {
        v["profiles"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["profile"] == "laptop")
            .cloned()
            .unwrap()
    };
    // Bounded: the daemon says when it will back up next.
    for _ in 0..300 {
        if laptop(&status())["daemon"] == true {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    assert_eq!(laptop(&status())["daemon"], true, "the daemon runs laptop");
    let before = laptop(&status())["last_run"]["started_unix"]
        .as_i64()
        .unwrap();

    let s = serve_with(&env, &[]);
    let post = |body: &[u8]| {
        http(
            &s,
            "POST",
            "/api/backup",
            &[
                ("content-type", "application/json"),
                ("x-capsule-token", &s.token),
            ],
            body,
        )
    };
    // Issue 59, 5: a profile that does not exist is refused, naming those
    // that do; nothing is started.
    let (code, _, body) = post(br#"{"profile":"lapton"}"#);
    let said = String::from_utf8_lossy(&body);
    assert_eq!(code, 404, "{said}");
    assert!(said.contains("laptop, photos"), "{said}");
    let (code, _, body) = post(br#"{"profile":"laptop"}"#);
    assert_eq!(code, 200, "{}", String::from_utf8_lossy(&body));
    let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(v["started"], "daemon");
    let mut ran = false;
    for _ in 0..600 {
        let p = laptop(&status());
        if p["running"].is_null() && p["last_run"]["started_unix"].as_i64().unwrap() > before
            || snapshots(&env, "laptop") == 2
        {
            ran = true;
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    drop(daemon);
    assert!(ran, "the daemon's backup ran");
    assert_eq!(snapshots(&env, "laptop"), 2);
}

/// A daemon stopped when dropped, also when an assertion fails first.
struct Stopped(std::process::Child);

impl Drop for Stopped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
