//! `capsule ui` over real HTTP: the token and Host guard, the timeline's
//! data, browsing, versions and their text diff, downloads of a file and of
//! a folder as tar, a diff between snapshots, crafted paths refused, a
//! restore that asks before replacing anything, and a folder put back.

// The command-line suite runs on Linux, against real servers, btrfs,
// fanotify and network namespaces; the macOS build checks the libraries.
#![cfg(target_os = "linux")]
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod common;

use std::path::PathBuf;
use std::process::Command;

use common::page::*;
use common::*;

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

/// "Put back" of a folder: what differs is listed and nothing written
/// until asked again; then the snapshot's files are back in place, a file
/// where the snapshot had a folder is replaced, and what the folder gained
/// since stays; no staging folder is left.
#[test]
fn put_back_of_a_folder_asks_then_merges_keeping_what_it_gained() {
    let t = tempfile::tempdir().unwrap();
    let (src, repo) = (t.path().join("src"), t.path().join("repo"));
    let docs = src.join("docs");
    std::fs::create_dir_all(docs.join("deep")).unwrap();
    std::fs::write(docs.join("a.txt"), "a as backed up\n").unwrap();
    std::fs::write(docs.join("same.txt"), "unchanged\n").unwrap();
    std::fs::write(docs.join("deep/b.bin"), noise(100_000, 4)).unwrap();
    init(&repo);
    ok(&repo, &["backup", src.to_str().unwrap()]);
    // Since: a.txt edited, deep/ replaced by a file, b.bin gone with it, a
    // new file added.
    std::fs::write(docs.join("a.txt"), "a edited").unwrap();
    std::fs::remove_dir_all(docs.join("deep")).unwrap();
    std::fs::write(docs.join("deep"), "a file now").unwrap();
    std::fs::write(docs.join("new.txt"), "added since").unwrap();
    let s = serve(&repo);
    let id = get_json(&s, "/api/snapshots")[0]["id"]
        .as_str()
        .unwrap()
        .to_string();
    let put = |replace: bool| {
        http(
            &s,
            "POST",
            "/api/put-back",
            &[
                ("x-capsule-token", &s.token),
                ("content-type", "application/json"),
            ],
            serde_json::json!({ "snapshot": id, "path": docs, "replace": replace })
                .to_string()
                .as_bytes(),
        )
    };
    let (code, _, body) = put(false);
    assert_eq!(code, 409, "{}", String::from_utf8_lossy(&body));
    let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(v["count"], 2, "a.txt and deep differ: {v}");
    let listed = v["replace"].to_string();
    assert!(
        listed.contains("docs/a.txt") && listed.contains("docs/deep"),
        "{listed}"
    );
    assert_eq!(std::fs::read(docs.join("a.txt")).unwrap(), b"a edited");

    let (code, _, body) = put(true);
    assert_eq!(code, 200, "{}", String::from_utf8_lossy(&body));
    assert_eq!(
        std::fs::read(docs.join("a.txt")).unwrap(),
        b"a as backed up\n"
    );
    assert_eq!(
        std::fs::read(docs.join("deep/b.bin")).unwrap(),
        noise(100_000, 4)
    );
    assert_eq!(std::fs::read(docs.join("new.txt")).unwrap(), b"added since");
    assert_eq!(
        std::fs::read(docs.join("same.txt")).unwrap(),
        b"unchanged\n"
    );
    let left: Vec<_> = std::fs::read_dir(&src)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(
        left,
        ["docs"],
        "no staging folder left in {}",
        src.display()
    );
}

/// Issue 59, 2: a user who owns a folder inside a source swaps a
/// subfolder for a link to a place outside (a stand-in for
/// `/etc/cron.d`). Put back refuses the link on its way and names it, a
/// link in the item is listed and replaced, never followed; and with a
/// swapper flipping the folder and the link in a tight loop while put
/// back runs again and again, nothing is ever written outside.
#[test]
fn put_back_never_writes_through_a_link_planted_on_its_way() {
    let t = tempfile::tempdir().unwrap();
    let (src, repo) = (t.path().join("src"), t.path().join("repo"));
    let sub = src.join("docs/sub");
    std::fs::create_dir_all(&sub).unwrap();
    std::fs::write(sub.join("job"), "backed up\n").unwrap();
    init(&repo);
    ok(&repo, &["backup", src.to_str().unwrap()]);
    let outside = t.path().join("cron.d");
    std::fs::create_dir(&outside).unwrap();
    std::fs::write(outside.join("job"), "outside, not to be touched\n").unwrap();
    let outside_as_it_was = || {
        let names: Vec<_> = std::fs::read_dir(&outside)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["job"], "nothing new outside");
        assert_eq!(
            std::fs::read(outside.join("job")).unwrap(),
            b"outside, not to be touched\n"
        );
    };
    std::fs::remove_dir_all(&sub).unwrap();
    std::os::unix::fs::symlink(&outside, &sub).unwrap();

    let s = serve(&repo);
    let id = get_json(&s, "/api/snapshots")[0]["id"]
        .as_str()
        .unwrap()
        .to_string();
    let put = |path: &std::path::Path, replace: bool| {
        let (code, _, body) = http(
            &s,
            "POST",
            "/api/put-back",
            &[
                ("x-capsule-token", &s.token),
                ("content-type", "application/json"),
            ],
            serde_json::json!({ "snapshot": id, "path": path, "replace": replace })
                .to_string()
                .as_bytes(),
        );
        (code, String::from_utf8_lossy(&body).into_owned())
    };
    // The file below the link: refused, the link named, whether asked or
    // agreed to.
    for replace in [false, true] {
        let (code, body) = put(&sub.join("job"), replace);
        assert_eq!(code, 409, "{body}");
        assert!(
            body.contains("symbolic link") && body.contains(sub.to_str().unwrap()),
            "{body}"
        );
        outside_as_it_was();
    }
    // The folder holding the link: the link is listed as what is replaced,
    // then replaced by the snapshot's folder, not followed.
    let docs = src.join("docs");
    let (code, body) = put(&docs, false);
    assert_eq!(code, 409, "{body}");
    assert!(
        body.contains("symbolic link: replaced, not followed"),
        "{body}"
    );
    let (code, body) = put(&docs, true);
    assert_eq!(code, 200, "{body}");
    assert!(!sub.is_symlink());
    assert_eq!(std::fs::read(sub.join("job")).unwrap(), b"backed up\n");
    outside_as_it_was();

    // The race: a swapper flips sub between a folder and the link while
    // put back of the file (and of the folder) runs, a bounded number of
    // times each.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let swapper = {
        let (stop, sub, outside) = (stop.clone(), sub.clone(), outside.clone());
        let aside = src.join("docs/aside");
        std::thread::spawn(move || {
            for _ in 0..2_000_000 {
                if stop.load(std::sync::atomic::Ordering::Relaxed) {
                    break;
                }
                if std::fs::rename(&sub, &aside).is_ok() {
                    let _ = std::os::unix::fs::symlink(&outside, &sub);
                    std::thread::sleep(std::time::Duration::from_millis(2));
                    let _ = std::fs::remove_file(&sub);
                    let _ = std::fs::rename(&aside, &sub);
                }
                std::thread::yield_now();
            }
        })
    };
    let mut answers = std::collections::BTreeMap::new();
    for i in 0..40 {
        let path = if i % 2 == 0 {
            sub.join("job")
        } else {
            docs.clone()
        };
        let (code, _) = put(&path, true);
        *answers.entry(code).or_insert(0) += 1;
        outside_as_it_was();
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    swapper.join().unwrap();
    outside_as_it_was();
    eprintln!("put back under the swapper: {answers:?}");
}
