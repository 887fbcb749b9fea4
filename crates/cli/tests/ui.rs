//! `capsule ui` over real HTTP: the token and Host guard, the timeline's
//! data, browsing, versions and their text diff, downloads of a file and of
//! a folder as tar, a diff between snapshots, crafted paths refused, and a
//! restore that asks before replacing anything.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod common;

use std::io::{BufRead, Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::*;

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
    let mut child = Command::new(env!("CARGO_BIN_EXE_capsule"))
        .args([
            "--repo",
            repo.to_str().unwrap(),
            "--json",
            "ui",
            "--no-browser",
        ])
        .env("CAPSULE_PASSWORD", PASSWORD)
        .env("CAPSULE_CACHE_DIR", repo.with_extension("cache"))
        .env(
            "CAPSULE_STATE_DIR",
            repo.with_extension("cache").join("state"),
        )
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
    assert_eq!(hits.as_array().unwrap().len(), 1, "{hits}");

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
