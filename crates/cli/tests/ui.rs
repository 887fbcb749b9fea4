//! `capsule ui` over real HTTP: the token and Host guard, the timeline's
//! data, browsing, versions and their text diff, downloads of a file and of
//! a folder as tar, a diff between snapshots, crafted paths refused, and a
//! restore that asks before replacing anything.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod common;

use std::io::{BufRead, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

use common::*;
use headless_chrome::protocol::cdp::Browser as BrowserDomain;
use headless_chrome::protocol::cdp::Page::CaptureScreenshotFormatOption;
use headless_chrome::{Browser, LaunchOptions, Tab};

struct Served {
    child: Child,
    addr: String,
    token: String,
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn serve(repo: &Path) -> Served {
    let mut child = capsule_cmd(&TestEnv::beside(repo).password(PASSWORD))
        .args([
            "--repo",
            repo.to_str().unwrap(),
            "--json",
            "ui",
            "--no-browser",
        ])
        .env_remove("BROWSER")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // First it says where: {"url": ..., "addr": ...}.
    let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
    let mut text = String::new();
    let v: serde_json::Value = loop {
        let mut line = String::new();
        assert!(
            out.read_line(&mut line).unwrap() > 0,
            "no address printed: {text}"
        );
        text += &line;
        if let Ok(v) = serde_json::from_str(&text) {
            break v;
        }
    };
    let url = v["url"].as_str().unwrap();
    Served {
        addr: v["addr"].as_str().unwrap().to_string(),
        token: url.split("t=").nth(1).unwrap().to_string(),
        child,
    }
}

/// One HTTP/1.1 request; (status, headers, body).
fn http(
    s: &Served,
    method: &str,
    target: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> (u16, String, Vec<u8>) {
    let mut c = TcpStream::connect(&s.addr).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let mut req = format!(
        "{method} {target} HTTP/1.1\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    if !headers.iter().any(|(k, _)| k.eq_ignore_ascii_case("host")) {
        req += &format!("Host: {}\r\n", s.addr);
    }
    for (k, v) in headers {
        req += &format!("{k}: {v}\r\n");
    }
    req += "\r\n";
    c.write_all(req.as_bytes()).unwrap();
    c.write_all(body).unwrap();
    let mut raw = Vec::new();
    c.read_to_end(&mut raw).unwrap();
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("a response");
    let head = String::from_utf8_lossy(&raw[..split]).into_owned();
    let status: u16 = head.split(' ').nth(1).unwrap().parse().unwrap();
    let mut body = raw[split + 4..].to_vec();
    if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        body = unchunk(&body);
    }
    (status, head, body)
}

fn unchunk(mut b: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let eol = b.windows(2).position(|w| w == b"\r\n").unwrap();
        let n = usize::from_str_radix(std::str::from_utf8(&b[..eol]).unwrap().trim(), 16).unwrap();
        if n == 0 {
            return out;
        }
        out.extend_from_slice(&b[eol + 2..eol + 2 + n]);
        b = &b[eol + 4 + n..];
    }
}

fn get(s: &Served, target: &str) -> (u16, Vec<u8>) {
    let (code, _, body) = http(
        s,
        "GET",
        target,
        &[("x-capsule-token", &s.token.clone())],
        b"",
    );
    (code, body)
}

fn get_json(s: &Served, target: &str) -> serde_json::Value {
    let (code, body) = get(s, target);
    assert_eq!(code, 200, "{target}: {}", String::from_utf8_lossy(&body));
    serde_json::from_slice(&body).unwrap()
}

fn enc(s: &str) -> String {
    s.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-_.~/".contains(&b) {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

#[test]
fn the_page_browses_diffs_downloads_and_restores_only_with_its_token() {
    let t = tempfile::tempdir().unwrap();
    let (src, repo) = (t.path().join("src"), t.path().join("repo"));
    std::fs::create_dir_all(src.join("docs/deep")).unwrap();
    std::fs::write(src.join("docs/notes.txt"), "first line\nsame\n").unwrap();
    std::fs::write(src.join("docs/deep/data.bin"), noise(300_000, 3)).unwrap();
    init(&repo);
    ok(&repo, &["backup", src.to_str().unwrap()]);
    std::fs::write(src.join("docs/notes.txt"), "second line\nsame\n").unwrap();
    ok(&repo, &["backup", src.to_str().unwrap()]);
    let s = serve(&repo);
    let docs = format!("{}/docs", src.display());
    let notes = format!("{docs}/notes.txt");

    // No token, a wrong one, another Host: refused.
    assert_eq!(http(&s, "GET", "/", &[], b"").0, 401);
    assert_eq!(
        http(
            &s,
            "GET",
            "/api/snapshots",
            &[("x-capsule-token", "nope")],
            b""
        )
        .0,
        401
    );
    let (code, _, _) = http(
        &s,
        "GET",
        "/api/snapshots",
        &[
            ("x-capsule-token", &s.token.clone()),
            ("Host", "evil.example:80"),
        ],
        b"",
    );
    assert_eq!(code, 403);
    // The page, with the token in its address, sets the cookie the rest use.
    let (code, head, page) = http(&s, "GET", &format!("/?t={}", s.token), &[], b"");
    assert_eq!(code, 200);
    assert!(String::from_utf8_lossy(&page).contains("Timeline"));
    assert!(
        !String::from_utf8_lossy(&page).contains("http://")
            && !String::from_utf8_lossy(&page).contains("https://"),
        "nothing from elsewhere"
    );
    let cookie = head
        .lines()
        .find_map(|l| {
            l.strip_prefix("set-cookie: ")
                .or_else(|| l.strip_prefix("Set-Cookie: "))
        })
        .unwrap()
        .split(';')
        .next()
        .unwrap()
        .to_string();
    let (code, _, _) = http(&s, "GET", "/api/snapshots", &[("Cookie", &cookie)], b"");
    assert_eq!(code, 200);

    let snaps = get_json(&s, "/api/snapshots");
    let snaps = snaps.as_array().unwrap();
    assert_eq!(snaps.len(), 2);
    let (first, last) = (
        snaps[0]["id"].as_str().unwrap(),
        snaps[1]["id"].as_str().unwrap(),
    );
    let ls = get_json(&s, &format!("/api/ls?snapshot=latest&path={}", enc(&docs)));
    let names: Vec<_> = ls
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["deep", "notes.txt"]);

    let v = get_json(&s, &format!("/api/versions?path={}", enc(&notes)));
    assert_eq!(v["versions"].as_array().unwrap().len(), 2);
    let (code, d) = get(&s, &format!("/api/textdiff?path={}&a=1&b=2", enc(&notes)));
    assert_eq!(code, 200);
    let d = String::from_utf8(d).unwrap();
    assert!(
        d.contains("-first line") && d.contains("+second line"),
        "{d}"
    );

    // Downloads: a file, by its bytes; a folder as tar, by its files.
    let (code, body) = get(
        &s,
        &format!("/api/file?snapshot={first}&path={}", enc(&notes)),
    );
    assert_eq!(
        (code, body.as_slice()),
        (200, b"first line\nsame\n".as_slice())
    );
    let (code, body) = get(&s, &format!("/api/tar?snapshot={last}&path={}", enc(&docs)));
    assert_eq!(code, 200);
    let out = t.path().join("untar");
    std::fs::create_dir_all(&out).unwrap();
    std::fs::write(t.path().join("docs.tar"), &body).unwrap();
    let st = Command::new("tar")
        .arg("-xf")
        .arg(t.path().join("docs.tar"))
        .arg("-C")
        .arg(&out)
        .status()
        .unwrap();
    assert!(st.success());
    assert_eq!(
        std::fs::read(out.join("docs/deep/data.bin")).unwrap(),
        noise(300_000, 3)
    );
    assert_eq!(
        std::fs::read(out.join("docs/notes.txt")).unwrap(),
        b"second line\nsame\n"
    );

    let d = get_json(&s, &format!("/api/diff?a={first}&b={last}"));
    assert!(
        d.as_array()
            .unwrap()
            .iter()
            .any(|e| e["change"] == "M" && e["path"].as_str().unwrap().ends_with("notes.txt")),
        "{d}"
    );
    let hits = get_json(&s, "/api/search?snapshot=latest&q=DATA");
    assert_eq!(hits["hits"].as_array().unwrap().len(), 1, "{hits}");
    // Across time: a name found in both snapshots, with when it was first
    // and last seen.
    let hits = get_json(&s, "/api/search?q=notes");
    let h = &hits["hits"][0];
    assert_eq!(h["path"].as_str().unwrap(), notes, "{hits}");
    assert_eq!(
        (h["snapshots"].as_u64(), h["last_snapshot"].as_str()),
        (Some(2), Some(last)),
        "{hits}"
    );
    assert_eq!(h["first_time"], snaps[0]["time"]);
    assert_eq!(get(&s, "/api/progress?job=nothing").0, 404);
    // The recorded backups' reports, with their charts.
    let r = get_json(&s, "/api/reports");
    let backups = r["backups"].as_array().unwrap();
    assert_eq!(backups.len(), 2, "{r}");
    let id = backups[0]["snapshot"].as_str().unwrap();
    let (code, page) = get(&s, &format!("/report?id={id}"));
    let page = String::from_utf8_lossy(&page);
    assert_eq!(code, 200, "{page}");
    assert!(
        page.contains("<svg") && page.contains(&id[..8]),
        "{page:.300}"
    );
    assert_eq!(get(&s, "/report?id=../../etc").0, 400);
    assert_eq!(get(&s, "/report?id=ffffffff").0, 404);

    // Crafted paths: refused, nothing read.
    for bad in [
        "/../etc/passwd",
        "relative",
        "/a/%00/b",
        &format!("/{}", "x".repeat(5000)),
    ] {
        let (code, _) = get(&s, &format!("/api/ls?snapshot=latest&path={bad}"));
        assert_eq!(code, 400, "{bad:.40}");
    }
    assert_eq!(get(&s, "/api/ls?snapshot=ffff&path=/").0, 404);

    // Restore: into an empty directory; then, with a file changed there,
    // asked first (409, the file named, nothing written); then replaced.
    let target = t.path().join("restored");
    let restore = |body: serde_json::Value| {
        http(
            &s,
            "POST",
            "/api/restore",
            &[
                ("x-capsule-token", &s.token.clone()),
                ("content-type", "application/json"),
            ],
            body.to_string().as_bytes(),
        )
    };
    let post = |replace: bool| {
        restore(
            serde_json::json!({"snapshot": first, "path": notes, "target": target, "replace": replace}),
        )
    };
    assert_eq!(post(false).0, 200);
    let there = restored(&target, &src).join("docs/notes.txt");
    assert_eq!(std::fs::read(&there).unwrap(), b"first line\nsame\n");
    std::fs::write(&there, "edited since").unwrap();
    let (code, _, body) = post(false);
    assert_eq!(code, 409);
    assert!(String::from_utf8_lossy(&body).contains("notes.txt"));
    assert_eq!(
        std::fs::read(&there).unwrap(),
        b"edited since",
        "nothing replaced unasked"
    );
    assert_eq!(post(true).0, 200);
    assert_eq!(std::fs::read(&there).unwrap(), b"first line\nsame\n");
    // A relative target is refused.
    let (code, _, _) =
        restore(serde_json::json!({"snapshot": first, "path": notes, "target": "rel"}));
    assert_eq!(code, 400);
}

/// Chromium started headless for a test, with a window large enough for
/// the page's three columns.
fn launch(bin: PathBuf) -> Browser {
    Browser::new(LaunchOptions {
        path: Some(bin),
        headless: true,
        // Root in a container: Chromium's sandbox cannot start there.
        sandbox: false,
        window_size: Some((1400, 860)),
        idle_browser_timeout: Duration::from_secs(300),
        ..LaunchOptions::default()
    })
    .unwrap()
}

/// Waits, bounded, until `js` (an expression) is true in the page.
fn until(tab: &Tab, js: &str, what: &str) {
    for _ in 0..600 {
        let v = tab.evaluate(js, false).unwrap().value;
        if v == Some(serde_json::Value::Bool(true)) {
            return;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let text = tab
        .evaluate("document.body.innerText", false)
        .ok()
        .and_then(|r| r.value);
    panic!("gave up after 60 s waiting for {what} ({js}); the page says: {text:?}");
}

fn click(tab: &Tab, selector: &str) {
    tab.wait_for_element_with_custom_timeout(selector, Duration::from_secs(60))
        .unwrap_or_else(|e| panic!("{selector}: {e}"))
        .click()
        .unwrap_or_else(|e| panic!("click {selector}: {e}"));
}

fn screenshot(tab: &Tab, name: &str) {
    let png = tab
        .capture_screenshot(CaptureScreenshotFormatOption::Png, None, None, true)
        .unwrap();
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("page-screenshots");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join(name), png).unwrap();
    eprintln!("screenshot: {}", dir.join(name).display());
}

/// A JavaScript string literal.
fn js(s: &str) -> String {
    serde_json::Value::from(s).to_string()
}

/// The page itself, in a real browser: refused without the token; the
/// timeline drawn; browsing to a file; its versions and their diff; a
/// download compared by its bytes; search across time; a folder restored,
/// then asked about before anything is replaced.
#[test]
fn the_page_works_in_headless_chromium() {
    let Some(bin) = chromium() else {
        return;
    };
    let t = tempfile::tempdir().unwrap();
    let (src, repo) = (t.path().join("src"), t.path().join("repo"));
    let docs = src.join("docs");
    std::fs::create_dir_all(docs.join("deep")).unwrap();
    std::fs::create_dir_all(src.join("photos")).unwrap();
    for i in 0..20 {
        std::fs::write(
            src.join(format!("photos/img_{i:04}.jpg")),
            noise(20_000 + i * 1000, i as u64),
        )
        .unwrap();
    }
    std::fs::write(docs.join("deep/data.bin"), noise(300_000, 3)).unwrap();
    // A directory longer than a screen: drawn as it scrolls.
    std::fs::create_dir_all(src.join("many")).unwrap();
    for i in 0..3000 {
        std::fs::write(src.join(format!("many/m{i:04}")), "").unwrap();
    }
    init(&repo);
    // The snapshots are made tomorrow (the test clock), from files of
    // today: every file's change time is before each backup then, so each
    // reads only the file changed, as hourly backups do.
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    let tomorrow = (now / 86_400 + 1) * 86_400;
    let day_before = (tomorrow - 86_400, 0);
    let mut stack = vec![src.clone()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            if e.file_type().unwrap().is_dir() {
                stack.push(e.path());
            } else {
                set_times(&e.path(), day_before, day_before);
            }
        }
    }
    // Hourly backups with a stretch of eight hours without any: the gap
    // the timeline must show.
    let notes = docs.join("notes.txt");
    for (i, hour) in [9, 10, 11, 12, 20, 21].into_iter().enumerate() {
        std::fs::write(&notes, format!("line one\nedit {}\nsame\n", i / 2)).unwrap();
        let at = tomorrow + i64::from(hour) * 3600;
        set_times(&notes, (at - 1800, 0), (at - 1800, 0));
        let o = capsule_env(
            &repo,
            &["backup", src.to_str().unwrap()],
            &[
                ("CAPSULE_PASSWORD", PASSWORD),
                ("CAPSULE_TEST_NOW", &at.to_string()),
            ],
        );
        assert!(o.status.success(), "{o:?}");
    }
    // Another set of paths (another profile's), once: a row of its own.
    let o = capsule_env(
        &repo,
        &["backup", src.join("photos").to_str().unwrap()],
        &[
            ("CAPSULE_PASSWORD", PASSWORD),
            ("CAPSULE_TEST_NOW", &(tomorrow + 15 * 3600).to_string()),
        ],
    );
    assert!(o.status.success(), "{o:?}");
    let s = serve(&repo);
    let browser = launch(bin);
    let tab = browser.new_tab().unwrap();
    tab.set_default_timeout(Duration::from_secs(60));

    // Without the token: refused, and nothing of the repository shown.
    tab.navigate_to(&format!("http://{}/", s.addr))
        .unwrap()
        .wait_until_navigated()
        .unwrap();
    until(
        &tab,
        "document.body.innerText.includes('no token')",
        "the refusal",
    );
    tab.navigate_to(&format!("http://{}/api/snapshots", s.addr))
        .unwrap()
        .wait_until_navigated()
        .unwrap();
    until(
        &tab,
        "document.body.innerText.includes('no token')",
        "the API's refusal",
    );

    // With it: the timeline, seven snapshots in two rows, one gap shaded.
    tab.navigate_to(&format!("http://{}/?t={}", s.addr, s.token))
        .unwrap()
        .wait_until_navigated()
        .unwrap();
    until(
        &tab,
        "document.querySelectorAll('#chart circle').length === 7 && document.querySelectorAll('#snaps div').length === 7",
        "seven snapshots on the timeline",
    );
    until(
        &tab,
        "[...document.querySelectorAll('#chart text')].filter(t => /: (src|photos)$/.test(t.firstChild.nodeValue)).length === 2",
        "a row for each set of paths",
    );
    until(
        &tab,
        "document.querySelectorAll('#chart rect.gap').length === 1",
        "one gap on the timeline",
    );
    // The token left the address bar; the cookie carries it from here.
    until(
        &tab,
        "!location.search.includes('t=')",
        "the token gone from the address",
    );

    // Browse down to the source's docs folder, name by name, after a look
    // at the end of a long directory.
    tab.evaluate(
        &format!("open({})", js(src.join("many").to_str().unwrap())),
        false,
    )
    .unwrap();
    until(
        &tab,
        "typeof listed === 'object' && listed && listed.rows.length === 3000 && document.querySelectorAll('#listing tr.row').length < 300",
        "3,000 entries listed, those in sight drawn",
    );
    tab.evaluate(
        "document.querySelector('#listing').parentElement.scrollTop = 1e9",
        false,
    )
    .unwrap();
    until(
        &tab,
        "document.querySelector('#listing tr.row[data-n=\"m2999\"]') !== null",
        "the last entry drawn after scrolling to the end",
    );
    tab.evaluate("open('/')", false).unwrap();
    let top = src
        .components()
        .nth(1)
        .unwrap()
        .as_os_str()
        .to_str()
        .unwrap();
    until(
        &tab,
        &format!(
            "document.querySelector('#listing tr.row[data-n=' + {} + ']') !== null",
            js(&js(top))
        ),
        "the root again",
    );
    let mut at = String::new();
    for c in docs.components().skip(1) {
        let name = c.as_os_str().to_str().unwrap();
        click(&tab, &format!("tr.row[data-n={}]", js(name)));
        at = format!("{at}/{name}");
        until(
            &tab,
            &format!(
                "[...document.querySelectorAll('#crumbs a')].some(a => a.dataset.p === {})",
                js(&at)
            ),
            &at,
        );
    }
    until(
        &tab,
        "document.querySelectorAll('#listing tr.row').length === 2",
        "docs listed",
    );
    // The file: its versions (three contents over six snapshots) and the
    // diff between the last two.
    click(&tab, "tr.row[data-n=\"notes.txt\"]");
    until(
        &tab,
        "document.querySelectorAll('#versions a.dl').length === 3",
        "three versions",
    );
    click(&tab, "#dgo");
    until(
        &tab,
        "document.querySelector('#dout').innerText.includes('-edit 1') && document.querySelector('#dout').innerText.includes('+edit 2')",
        "the diff of versions 2 and 3",
    );
    screenshot(&tab, "versions.png");

    // Download the first version; compare its bytes.
    let downloads = t.path().join("downloads");
    std::fs::create_dir_all(&downloads).unwrap();
    tab.call_method(BrowserDomain::SetDownloadBehavior {
        behavior: BrowserDomain::SetDownloadBehaviorBehaviorOption::Allow,
        browser_context_id: None,
        download_path: Some(downloads.to_str().unwrap().to_string()),
        events_enabled: None,
    })
    .unwrap();
    click(&tab, "#versions a.dl");
    let got = downloads.join("notes.txt");
    for _ in 0..600 {
        if std::fs::read(&got).is_ok_and(|b| b == b"line one\nedit 0\nsame\n") {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(
        std::fs::read(&got).unwrap_or_default(),
        b"line one\nedit 0\nsame\n",
        "the downloaded first version"
    );

    // Search across time: the file found in all six snapshots.
    tab.evaluate(
        "document.querySelector('#alltime').checked = true; document.querySelector('#q').value = 'notes';",
        false,
    )
    .unwrap();
    tab.wait_for_element("#q").unwrap().click().unwrap();
    tab.press_key("Enter").unwrap();
    until(
        &tab,
        "[...document.querySelectorAll('#listing tr.hit')].some(r => r.dataset.p.endsWith('/docs/notes.txt') && r.innerText.trim().endsWith('6'))",
        "notes.txt found across time, in 6 snapshots",
    );

    // Back to docs, and restore it: into an empty directory, then again
    // with a file there changed, which is asked about before replacing.
    click(
        &tab,
        &format!("#crumbs a[data-p={}]", js(docs.to_str().unwrap())),
    );
    until(
        &tab,
        "document.querySelectorAll('#listing tr.row').length === 2",
        "docs listed again",
    );
    let target = t.path().join("restored");
    std::fs::create_dir_all(&target).unwrap();
    click(&tab, "#restore");
    tab.evaluate(
        &format!(
            "document.querySelector('#rtarget').value = {}",
            js(target.to_str().unwrap())
        ),
        false,
    )
    .unwrap();
    click(&tab, "#rgo");
    until(
        &tab,
        "document.querySelector('#rdone').innerText.includes('Restored 2 files')",
        "the restore's report",
    );
    let back = target.join(docs.strip_prefix("/").unwrap());
    assert_eq!(
        std::fs::read(back.join("notes.txt")).unwrap(),
        std::fs::read(&notes).unwrap()
    );
    assert_eq!(
        std::fs::read(back.join("deep/data.bin")).unwrap(),
        noise(300_000, 3)
    );
    std::fs::write(back.join("notes.txt"), "changed since").unwrap();
    click(&tab, "#rgo");
    until(
        &tab,
        "!document.querySelector('#rask').hidden && document.querySelector('#rlist').innerText.includes('notes.txt')",
        "the question before replacing",
    );
    screenshot(&tab, "restore.png");
    assert_eq!(
        std::fs::read(back.join("notes.txt")).unwrap(),
        b"changed since",
        "nothing replaced before the answer"
    );
    click(&tab, "#rreplace");
    until(
        &tab,
        "document.querySelector('#rdone').innerText.includes('Restored')",
        "the restore after the answer",
    );
    assert_eq!(
        std::fs::read(back.join("notes.txt")).unwrap(),
        std::fs::read(&notes).unwrap()
    );

    // The changes from 12:00 to the snapshot shown, as a tree.
    tab.evaluate(
        "document.querySelector('#diffbase').value = snaps[3].id",
        false,
    )
    .unwrap();
    click(&tab, "#diffprev");
    until(
        &tab,
        "/\\n *docs\\/\\n *M notes.txt/.test(document.querySelector('#difftree').innerText) && document.querySelector('#listing p').innerText.includes('1 changed')",
        "notes.txt changed, under docs/, in the tree of changes",
    );
    screenshot(&tab, "diff.png");

    // An older snapshot picked on the timeline: the listing follows it.
    click(&tab, "#chart g.snap");
    until(
        &tab,
        "document.querySelector('#crumbs a').innerText === when(snaps[0].time)",
        "the oldest snapshot picked on the chart",
    );
    screenshot(&tab, "timeline.png");
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn ms(f: impl FnOnce()) -> f64 {
    let t = std::time::Instant::now();
    f();
    t.elapsed().as_secs_f64() * 1000.0
}

/// The benchmark behind the page's latency row (bench/page.sh runs it,
/// in release): a directory of 10,000 entries opened through the page's
/// API and in Chromium, first and warm, against a process per view
/// (`capsule ls`, and `restic ls` as restic's web front ends do it).
#[test]
#[ignore = "benchmark: bench/page.sh runs it"]
fn page_latency_of_a_10k_entry_directory() {
    let bin = chromium().expect("chromium");
    let t = tempfile::tempdir().unwrap();
    let (src, repo) = (t.path().join("src"), t.path().join("repo"));
    let big = src.join("big");
    std::fs::create_dir_all(&big).unwrap();
    for i in 0..10_000 {
        std::fs::write(big.join(format!("file-{i:05}.txt")), format!("{i}\n")).unwrap();
    }
    // The rest of the snapshot, which opening `big` must not walk.
    for d in 0..200 {
        let dir = src.join(format!("other/d{d:03}"));
        std::fs::create_dir_all(&dir).unwrap();
        for i in 0..100 {
            std::fs::write(dir.join(format!("{i}")), format!("{d} {i}\n")).unwrap();
        }
    }
    init(&repo);
    ok(&repo, &["backup", src.to_str().unwrap()]);
    let restic = Command::new("restic").arg("version").output().is_ok();
    let rrepo = t.path().join("restic");
    let renv = [
        ("RESTIC_PASSWORD", PASSWORD),
        ("RESTIC_CACHE_DIR", "/tmp/capsule-page-bench-restic-cache"),
    ];
    if restic {
        for args in [
            vec!["-q", "init", "-r", rrepo.to_str().unwrap()],
            vec![
                "-q",
                "-r",
                rrepo.to_str().unwrap(),
                "backup",
                src.to_str().unwrap(),
            ],
        ] {
            let o = Command::new("restic")
                .args(&args)
                .envs(renv)
                .output()
                .unwrap();
            assert!(o.status.success(), "{o:?}");
        }
    }
    let path = big.to_str().unwrap().to_string();
    let s = serve(&repo);
    let api = format!("/api/ls?snapshot=latest&path={}", enc(&path));
    let mut first_api = 0.0;
    let mut warm_api = Vec::new();
    for i in 0..11 {
        let took = ms(|| {
            let v = get_json(&s, &api);
            assert_eq!(v.as_array().unwrap().len(), 10_000);
        });
        if i == 0 {
            first_api = took;
        } else {
            warm_api.push(took);
        }
    }

    // The page: a fresh process, so its first open is cold too.
    drop(s);
    let s = serve(&repo);
    let browser = launch(bin);
    let tab = browser.new_tab().unwrap();
    tab.navigate_to(&format!("http://{}/?t={}", s.addr, s.token))
        .unwrap()
        .wait_until_navigated()
        .unwrap();
    until(
        &tab,
        "document.querySelectorAll('#crumbs a').length > 0",
        "the page",
    );
    // From the call to the rows drawn: the request, the table built, and
    // the frame after it painted.
    let open = format!(
        "(async () => {{ const t0 = performance.now(); await open({}); \
         await new Promise((r) => requestAnimationFrame(() => setTimeout(r, 0))); \
         const n = document.querySelectorAll('#listing tr.row').length; \
         if (listed.rows.length !== 10000 || n < 20) throw new Error('rows: ' + n); \
         const t = performance.now() - t0; await open('/'); return t; }})()",
        js(&path)
    );
    let mut first_page = 0.0;
    let mut warm_page = Vec::new();
    for i in 0..11 {
        let took = tab
            .evaluate(&open, true)
            .unwrap()
            .value
            .unwrap()
            .as_f64()
            .unwrap();
        if i == 0 {
            first_page = took;
        } else {
            warm_page.push(took);
        }
    }

    let per_process = |cmd: &mut dyn FnMut() -> Output| {
        median(
            (0..5)
                .map(|_| {
                    ms(|| {
                        let o = cmd();
                        assert!(o.status.success(), "{o:?}");
                    })
                })
                .collect(),
        )
    };
    let cls = per_process(&mut || capsule(&repo, &["ls", "latest", &path]));
    let rls = restic.then(|| {
        per_process(&mut || {
            Command::new("restic")
                .args(["-q", "-r", rrepo.to_str().unwrap(), "ls", "latest", &path])
                .envs(renv)
                .output()
                .unwrap()
        })
    });
    println!("| a directory of 10,000 entries, in a snapshot of 30,200 files | first open, ms | warm, median of 10, ms |");
    println!("|---|---:|---:|");
    println!(
        "| capsule ui, the API (`/api/ls`) | {first_api:.0} | {:.1} |",
        median(warm_api)
    );
    println!(
        "| capsule ui, the page in Chromium (call to the rows in sight drawn) | {first_page:.0} | {:.0} |",
        median(warm_page)
    );
    println!("| `capsule ls` (a process per view) | {cls:.0} | {cls:.0} |");
    if let Some(r) = rls {
        println!(
            "| `restic ls` 0.14 (a process per view, as its web front ends do) | {r:.0} | {r:.0} |"
        );
    }
    let _ = std::fs::remove_dir_all("/tmp/capsule-page-bench-restic-cache");
}

/// A file whose pack is damaged: its download answers an error naming it;
/// the page goes on serving everything else.
#[test]
fn a_damaged_pack_fails_that_download_only() {
    let t = tempfile::tempdir().unwrap();
    let (src, repo) = (t.path().join("src"), t.path().join("repo"));
    std::fs::create_dir_all(&src).unwrap();
    std::fs::write(src.join("good.txt"), "fine\n").unwrap();
    init(&repo);
    ok(&repo, &["backup", src.to_str().unwrap()]);
    // The second backup's new data lands in a pack of its own.
    let before = files_under(&repo.join("data"));
    std::fs::write(src.join("damaged.bin"), noise(1 << 20, 9)).unwrap();
    ok(&repo, &["backup", src.to_str().unwrap()]);
    let new: Vec<PathBuf> = files_under(&repo.join("data"))
        .into_iter()
        .filter(|p| !before.contains(p))
        .collect();
    assert_eq!(new.len(), 1, "{new:?}");
    let mut bytes = std::fs::read(&new[0]).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0x40;
    std::fs::write(&new[0], &bytes).unwrap();

    let s = serve(&repo);
    let damaged = format!("{}/damaged.bin", src.display());
    let (code, body) = get(
        &s,
        &format!("/api/file?snapshot=latest&path={}", enc(&damaged)),
    );
    let body = String::from_utf8_lossy(&body);
    assert_eq!(code, 500, "{body:.300}");
    assert!(body.contains("damaged.bin"), "names the file: {body:.300}");
    // Everything else still serves.
    let (code, body) = get(
        &s,
        &format!(
            "/api/file?snapshot=latest&path={}",
            enc(&format!("{}/good.txt", src.display()))
        ),
    );
    assert_eq!((code, body.as_slice()), (200, b"fine\n".as_slice()));
    let ls = get_json(
        &s,
        &format!(
            "/api/ls?snapshot=latest&path={}",
            enc(src.to_str().unwrap())
        ),
    );
    assert_eq!(ls.as_array().unwrap().len(), 2);
    assert_eq!(
        get_json(&s, &format!("/api/versions?path={}", enc(&damaged)))["versions"]
            .as_array()
            .unwrap()
            .len(),
        1
    );
}

/// Names that are not UTF-8, or hold `%`, are carried losslessly (`%XX`
/// for odd bytes, `%25` for `%`): listed, opened, downloaded, searched,
/// archived and restored byte for byte.
#[test]
fn names_that_are_not_utf8_are_listed_opened_and_restored() {
    use std::os::unix::ffi::OsStrExt;
    let t = tempfile::tempdir().unwrap();
    let (src, repo) = (t.path().join("src"), t.path().join("repo"));
    let odd = src.join("odd");
    let bytes_name = |b: &[u8]| std::ffi::OsStr::from_bytes(b).to_os_string();
    std::fs::create_dir_all(odd.join(bytes_name(b"dir\xff"))).unwrap();
    std::fs::write(odd.join(bytes_name(b"caf\xe9.txt")), "latin-1\n").unwrap();
    std::fs::write(odd.join("100%.txt"), "percent\n").unwrap();
    std::fs::write(
        odd.join(bytes_name(b"dir\xff")).join("inside.txt"),
        "inside\n",
    )
    .unwrap();
    init(&repo);
    ok(&repo, &["backup", src.to_str().unwrap()]);
    let s = serve(&repo);
    let at = odd.to_str().unwrap().to_string();
    let ls = get_json(&s, &format!("/api/ls?snapshot=latest&path={}", enc(&at)));
    let rows: Vec<(String, bool)> = ls
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["name"].as_str().unwrap().into(),
                e["utf8"].as_bool().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        rows,
        [
            ("100%25.txt".into(), true),
            ("caf%E9.txt".into(), false),
            ("dir%FF".into(), false)
        ]
    );
    let file = |p: &str| get(&s, &format!("/api/file?snapshot=latest&path={}", enc(p)));
    assert_eq!(file(&format!("{at}/caf%E9.txt")).1, b"latin-1\n");
    assert_eq!(file(&format!("{at}/100%25.txt")).1, b"percent\n");
    assert_eq!(file(&format!("{at}/dir%FF/inside.txt")).1, b"inside\n");
    let inner = get_json(
        &s,
        &format!(
            "/api/ls?snapshot=latest&path={}",
            enc(&format!("{at}/dir%FF"))
        ),
    );
    assert_eq!(inner[0]["name"], "inside.txt");
    let v = get_json(
        &s,
        &format!("/api/versions?path={}", enc(&format!("{at}/caf%E9.txt"))),
    );
    assert_eq!(v["versions"].as_array().unwrap().len(), 1);
    let hits = get_json(&s, "/api/search?q=caf");
    assert_eq!(hits["hits"][0]["path"], format!("{at}/caf%E9.txt"));

    // The folder as tar, extracted: the names byte for byte.
    let (code, body) = get(&s, &format!("/api/tar?snapshot=latest&path={}", enc(&at)));
    assert_eq!(code, 200);
    let out = t.path().join("untar");
    std::fs::create_dir_all(&out).unwrap();
    std::fs::write(t.path().join("odd.tar"), &body).unwrap();
    assert!(Command::new("tar")
        .arg("-xf")
        .arg(t.path().join("odd.tar"))
        .arg("-C")
        .arg(&out)
        .status()
        .unwrap()
        .success());
    assert_eq!(
        std::fs::read(out.join("odd").join(bytes_name(b"caf\xe9.txt"))).unwrap(),
        b"latin-1\n"
    );
    assert_eq!(
        std::fs::read(
            out.join("odd")
                .join(bytes_name(b"dir\xff"))
                .join("inside.txt")
        )
        .unwrap(),
        b"inside\n"
    );

    // Restored through the page: the folder holding them, byte for byte; a
    // path that is not UTF-8 itself is refused with what to do instead.
    let target = t.path().join("restored");
    let post = |path: &str| {
        http(
            &s,
            "POST",
            "/api/restore",
            &[
                ("x-capsule-token", &s.token.clone()),
                ("content-type", "application/json"),
            ],
            serde_json::json!({"snapshot": "latest", "path": path, "target": target})
                .to_string()
                .as_bytes(),
        )
    };
    let (code, _, body) = post(&at);
    assert_eq!(code, 200, "{}", String::from_utf8_lossy(&body));
    let back = target.join(odd.strip_prefix("/").unwrap());
    assert_eq!(
        std::fs::read(back.join(bytes_name(b"caf\xe9.txt"))).unwrap(),
        b"latin-1\n"
    );
    assert_eq!(std::fs::read(back.join("100%.txt")).unwrap(), b"percent\n");
    let (code, _, body) = post(&format!("{at}/caf%E9.txt"));
    assert_eq!(code, 400);
    assert!(String::from_utf8_lossy(&body).contains("restore the folder"));
}
