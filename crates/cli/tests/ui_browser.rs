//! The page in a real browser: headless Chromium drives the timeline,
//! browsing, versions, diffs and a restore as a user would; and the
//! page's latency on a 10,000-entry directory, the benchmark behind
//! `bench/page.sh`.

// The command-line suite runs on Linux, against real servers, btrfs,
// fanotify and network namespaces; the macOS build checks the libraries.
#![cfg(target_os = "linux")]
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod common;

use std::process::{Command, Output};
use std::time::Duration;

use common::chrome::*;
use common::page::*;
use common::*;
use headless_chrome::protocol::cdp::Browser as BrowserDomain;

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
    // It opened on what the newest snapshot backed up, the source folder,
    // with the path above it as crumbs, not at the file system's root.
    until(
        &tab,
        &format!(
            "path === {} && document.querySelectorAll('#listing tr.row').length === 3 && [...document.querySelectorAll('#crumbs a')].some(a => a.dataset.p === {})",
            js(src.to_str().unwrap()),
            js(src.parent().unwrap().to_str().unwrap())
        ),
        "the source folder first, its parents as crumbs",
    );
    // `capsule ui PATH`: the page opens on that folder in the newest
    // snapshot holding it.
    tab.navigate_to(&format!(
        "http://{}/?at={}",
        s.addr,
        src.join("photos").to_str().unwrap()
    ))
    .unwrap()
    .wait_until_navigated()
    .unwrap();
    until(
        &tab,
        &format!(
            "path === {} && document.querySelectorAll('#listing tr.row').length === 20 && cur && cur.id === snaps[snaps.length - 1].id",
            js(src.join("photos").to_str().unwrap())
        ),
        "the photos folder in the newest snapshot",
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

/// `f`'s first figure, and its next ten (the warm ones).
fn first_and_warm(mut f: impl FnMut() -> f64) -> (f64, Vec<f64>) {
    let first = f();
    (first, (0..10).map(|_| f()).collect())
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
    let (first_api, warm_api) = first_and_warm(|| {
        ms(|| {
            let v = get_json(&s, &api);
            assert_eq!(v.as_array().unwrap().len(), 10_000);
        })
    });

    // The page: a fresh process, so its first open is cold too.
    drop(s);
    let s = serve(&repo);
    let browser = launch(bin);
    let tab = open_page(&browser, &s);
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
    let (first_page, warm_page) = first_and_warm(|| {
        tab.evaluate(&open, true)
            .unwrap()
            .value
            .unwrap()
            .as_f64()
            .unwrap()
    });

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

/// The benchmark behind the page's timeline row (bench/page.sh runs it,
/// in release, with `CAPSULE_BLOBGEN` naming bench's `blobgen`): a
/// repository of 10,000 hourly snapshots of one source, its timeline
/// listed by the API and drawn in Chromium, first and warm.
#[test]
#[ignore = "benchmark: bench/page.sh runs it"]
fn page_latency_of_a_10k_snapshot_timeline() {
    let bin = chromium().expect("chromium");
    let blobgen = std::env::var("CAPSULE_BLOBGEN").expect("CAPSULE_BLOBGEN: bench's blobgen");
    let t = tempfile::tempdir().unwrap();
    let repo = t.path().join("repo");
    init(&repo);
    let o = Command::new(blobgen)
        .args([repo.to_str().unwrap(), "10000", "10000", "--one-source"])
        .env("CAPSULE_PASSWORD", PASSWORD)
        .output()
        .unwrap();
    assert!(o.status.success(), "{o:?}");
    let s = serve(&repo);
    let (first_api, warm_api) = first_and_warm(|| {
        ms(|| {
            let v = get_json(&s, "/api/snapshots");
            assert_eq!(v.as_array().unwrap().len(), 10_000);
        })
    });
    drop(s);
    let s = serve(&repo);
    let browser = launch(bin);
    let tab = open_page(&browser, &s);
    until(&tab, "snaps.length === 10000 && cur !== null", "the page");
    // From the call to the timeline drawn: the request, the chart and the
    // list built, and the frame after it painted.
    let draw = "(async () => { const t0 = performance.now(); await refreshSnaps(); \
         await new Promise((r) => requestAnimationFrame(() => setTimeout(r, 0))); \
         const n = document.querySelectorAll('#chart g.snap').length; \
         if (snaps.length !== 10000 || n === 0) throw new Error('dots: ' + n); \
         return performance.now() - t0; })()";
    let (first_page, times) = first_and_warm(|| {
        tab.evaluate(draw, true)
            .unwrap()
            .value
            .unwrap()
            .as_f64()
            .unwrap()
    });
    println!("| a timeline of 10,000 hourly snapshots | first, ms | warm, median of 10, ms |");
    println!("|---|---:|---:|");
    println!(
        "| capsule ui, the API (`/api/snapshots`) | {first_api:.0} | {:.1} |",
        median(warm_api)
    );
    println!(
        "| capsule ui, the page in Chromium (call to the timeline drawn) | {first_page:.0} | {:.0} |",
        median(times)
    );
}
