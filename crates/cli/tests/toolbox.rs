//! The everyday tools (issue 61): `dump`, snapshot filters and `tag`,
//! `find`, the excludes people reach for, backups from standard input and
//! from a command.

// The command-line suite runs on Linux, against real servers, btrfs,
// fanotify and network namespaces; the macOS build checks the libraries.
#![cfg(target_os = "linux")]
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Stdio;

use common::*;

/// What a tar keeps of each entry, read from the file system: kind, mode,
/// owners, size, mtime seconds (symlinks: target), content.
fn tar_view(root: &Path) -> BTreeMap<Vec<u8>, String> {
    snapshot_meta(root, false)
        .into_iter()
        .map(|(k, m)| {
            let content = if m.kind == "file" {
                let p =
                    root.join(<std::ffi::OsStr as std::os::unix::ffi::OsStrExt>::from_bytes(&k));
                blake3::hash(&std::fs::read(p).unwrap())
                    .to_hex()
                    .to_string()
            } else {
                String::new()
            };
            let mtime = if m.kind == "symlink" { 0 } else { m.mtime.0 };
            let v = format!(
                "{} {:o} {}:{} {} {} {:?} {} {}",
                m.kind, m.mode, m.uid, m.gid, m.size, mtime, m.target, m.rdev, content
            );
            (k, v)
        })
        .collect()
}

fn restored_path(r: &Path, src: &Path, k: &[u8]) -> std::path::PathBuf {
    restored(r, src).join(<std::ffi::OsStr as std::os::unix::ffi::OsStrExt>::from_bytes(k))
}

fn capsule_to_file(repo: &Path, args: &[&str], out: &Path) -> std::process::Output {
    let f = std::fs::File::create(out).unwrap();
    let mut c = capsule_at(repo);
    c.args(args).stdout(Stdio::from(f));
    c.output().unwrap()
}

#[test]
fn dump_of_a_folder_read_by_tar_equals_a_restore_and_a_file_is_its_bytes() {
    let t = tempfile::tempdir().unwrap();
    let (src, repo) = (t.path().join("src"), t.path().join("repo"));
    torture_tree(&src, 300);
    init(&repo);
    ok(&repo, &["backup", src.to_str().unwrap()]);

    // The folder: system tar reads what dump wrote.
    let tarball = t.path().join("src.tar");
    let o = capsule_to_file(&repo, &["dump", "latest", src.to_str().unwrap()], &tarball);
    assert!(o.status.success(), "{}", said(&o));
    let x = t.path().join("x");
    std::fs::create_dir(&x).unwrap();
    let st = std::process::Command::new("tar")
        .args(["-x", "-p", "--same-owner", "--numeric-owner", "-f"])
        .arg(&tarball)
        .arg("-C")
        .arg(&x)
        .status()
        .unwrap();
    assert!(st.success(), "tar -x failed");
    let r = t.path().join("r");
    ok(
        &repo,
        &["restore", "latest", "--target", r.to_str().unwrap()],
    );
    let restored = tar_view(&restored(&r, &src));
    let from_tar = tar_view(&x.join("src"));
    // Sockets are no tar entry; the restore makes none either.
    assert_eq!(
        from_tar.keys().collect::<Vec<_>>(),
        restored.keys().collect::<Vec<_>>(),
        "entry sets differ"
    );
    for (k, v) in &restored {
        assert_eq!(&from_tar[k], v, "{} differs", String::from_utf8_lossy(k));
    }

    // As a zip: every file's bytes and mode as the restore has them.
    let zipped = t.path().join("src.zip");
    let o = capsule_to_file(
        &repo,
        &["dump", "latest", src.to_str().unwrap(), "--archive", "zip"],
        &zipped,
    );
    assert!(o.status.success(), "{}", said(&o));
    let mut z = zip::ZipArchive::new(std::fs::File::open(&zipped).unwrap()).unwrap();
    let mut checked = 0;
    for (k, v) in &restored {
        let name = format!("src/{}", String::from_utf8_lossy(k));
        if !v.starts_with("file ") || std::str::from_utf8(k).is_err() {
            continue;
        }
        let mut e = z.by_name(&name).unwrap_or_else(|e| panic!("{name}: {e}"));
        let mut data = Vec::new();
        std::io::Read::read_to_end(&mut e, &mut data).unwrap();
        let want = std::fs::read(restored_path(&r, &src, k)).unwrap();
        assert!(data == want, "{name}: content differs");
        // Zip keeps the permission bits, not setuid and the like.
        let mode = std::fs::symlink_metadata(restored_path(&r, &src, k))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(e.unix_mode().unwrap() & 0o777, mode & 0o777, "{name}");
        checked += 1;
    }
    assert!(checked > 10, "only {checked} files checked");

    // A file: its bytes, and --target writes a new file, never over one.
    let f = src.join("text/lorem.txt");
    let one = t.path().join("one");
    let o = capsule_to_file(&repo, &["dump", "latest", f.to_str().unwrap()], &one);
    assert!(o.status.success(), "{}", said(&o));
    assert_eq!(std::fs::read(&one).unwrap(), std::fs::read(&f).unwrap());
    let tgt = t.path().join("tgt");
    let v = json(
        &repo,
        &[
            "dump",
            "latest",
            f.to_str().unwrap(),
            "--target",
            tgt.to_str().unwrap(),
        ],
    );
    assert_eq!(v["written"]["files"], 1, "{v}");
    assert_eq!(std::fs::read(&tgt).unwrap(), std::fs::read(&f).unwrap());
    let o = capsule(
        &repo,
        &[
            "dump",
            "latest",
            f.to_str().unwrap(),
            "--target",
            tgt.to_str().unwrap(),
        ],
    );
    assert_eq!(o.status.code(), Some(2), "{}", said(&o));
    assert!(said(&o).contains("already exists"), "{}", said(&o));
    // A path the snapshot lacks is exit 13, and nothing is written.
    let none = t.path().join("none");
    let o = capsule(
        &repo,
        &[
            "dump",
            "latest",
            "/no/such/file",
            "--target",
            none.to_str().unwrap(),
        ],
    );
    assert_eq!(o.status.code(), Some(13), "{}", said(&o));
    assert!(!none.exists());
}

fn ids_of(v: &serde_json::Value) -> Vec<String> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|s| s["id"].as_str().unwrap().to_string())
        .collect()
}

#[test]
fn snapshots_are_filtered_by_host_tag_and_path_and_tag_rewrites_only_the_snapshot_objects() {
    let t = tempfile::tempdir().unwrap();
    let (a, b, repo) = (
        t.path().join("a"),
        t.path().join("b"),
        t.path().join("repo"),
    );
    std::fs::create_dir_all(&a).unwrap();
    std::fs::create_dir_all(&b).unwrap();
    std::fs::write(a.join("f"), noise(300_000, 1)).unwrap();
    std::fs::write(b.join("g"), noise(1000, 2)).unwrap();
    init(&repo);
    let (sa, sb) = (a.to_str().unwrap(), b.to_str().unwrap());
    ok(&repo, &["backup", sa, "--tag", "daily,work"]);
    ok(&repo, &["backup", sb, "--tag", "daily", "--host", "other"]);
    ok(&repo, &["backup", sa, sb]);
    let all = ids_of(&json(&repo, &["snapshots"]));
    assert_eq!(all.len(), 3);
    let sel = |args: &[&str]| {
        let mut v = vec!["snapshots"];
        v.extend_from_slice(args);
        ids_of(&json(&repo, &v))
    };
    assert_eq!(sel(&["--tag", "daily"]), all[..2]);
    assert_eq!(sel(&["--tag", "daily,work"]), all[..1]);
    assert_eq!(sel(&["--tag", "work", "--tag", "nothing"]), all[..1]);
    assert_eq!(sel(&["--host", "other"]), all[1..2]);
    assert_eq!(sel(&["--path", sa]), [all[0].clone(), all[2].clone()]);
    assert_eq!(sel(&["--path", sa, "--path", sb]), all[2..]);

    // tag: new snapshot objects naming their original; packs untouched.
    let packs = pack_files(&repo);
    let v = json(
        &repo,
        &["tag", "--tag", "daily", "--add", "keep", "--remove", "work"],
    );
    assert_eq!(v["changed"].as_array().unwrap().len(), 2, "{v}");
    assert_eq!(pack_files(&repo), packs, "tag wrote or removed packs");
    let after = json(&repo, &["snapshots", "--tag", "keep"]);
    let tags: Vec<Vec<String>> = after
        .as_array()
        .unwrap()
        .iter()
        .map(|s| serde_json::from_value(s["snapshot"]["tags"].clone()).unwrap())
        .collect();
    assert_eq!(tags, [vec!["daily", "keep"], vec!["daily", "keep"]]);
    let originals: Vec<&str> = after
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["snapshot"]["original"].as_str().unwrap())
        .collect();
    assert_eq!(originals, [all[0].as_str(), all[1].as_str()]);
    // The old objects are set aside, and the content is the same.
    let forgotten = ids_of(&json(&repo, &["snapshots", "--forgotten"]));
    assert_eq!(forgotten, all[..2]);
    let r = t.path().join("r");
    let newest_a = ids_of(&after)[0].clone();
    ok(
        &repo,
        &["restore", &newest_a, "--target", r.to_str().unwrap()],
    );
    assert_eq!(
        std::fs::read(restored(&r, &a).join("f")).unwrap(),
        noise(300_000, 1)
    );
    // --set replaces; nothing to change is no new object.
    let v = json(&repo, &["tag", &newest_a, "--set", "only"]);
    assert_eq!(v["changed"][0]["tags"], serde_json::json!(["only"]), "{v}");
    let again = json(&repo, &["tag", "--tag", "only", "--add", "only"]);
    assert_eq!(again["changed"].as_array().unwrap().len(), 0, "{again}");
    // A change of every snapshot must be asked for by a filter or IDs.
    let o = capsule(&repo, &["tag", "--add", "x"]);
    assert_eq!(o.status.code(), Some(2), "{}", said(&o));
    // forget takes the same filters: "latest" among the other host's.
    assert_eq!(sel(&["--host", "other"]).len(), 1);
    ok(&repo, &["forget", "--host", "other", "latest"]);
    assert_eq!(sel(&["--host", "other"]).len(), 0);
    assert_eq!(sel(&[]).len(), 2);
}

#[test]
fn find_lists_each_path_with_its_versions_across_snapshots() {
    let t = tempfile::tempdir().unwrap();
    let (src, repo) = (t.path().join("src"), t.path().join("repo"));
    std::fs::create_dir_all(src.join("docs/old")).unwrap();
    std::fs::write(src.join("docs/Report.PDF"), b"one").unwrap();
    std::fs::write(src.join("docs/old/report.pdf"), b"old").unwrap();
    std::fs::write(src.join("notes.txt"), b"x").unwrap();
    init(&repo);
    let s = src.to_str().unwrap();
    ok(&repo, &["backup", s]);
    std::fs::write(src.join("docs/Report.PDF"), b"two!").unwrap();
    ok(&repo, &["backup", s]);
    ok(&repo, &["backup", s]);
    let v = json(&repo, &["find", "-i", "*.pdf"]);
    let found: Vec<&str> = v["found"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["path"].as_str().unwrap())
        .collect();
    let want_a = src.join("docs/Report.PDF");
    let want_b = src.join("docs/old/report.pdf");
    assert_eq!(
        found,
        [want_a.to_str().unwrap(), want_b.to_str().unwrap()],
        "{v}"
    );
    // Report.PDF: two versions, newest first (4 bytes in 2 snapshots).
    let vs = &v["found"][0]["versions"];
    assert_eq!(vs.as_array().unwrap().len(), 2, "{v}");
    assert_eq!(vs[0]["size"], 4);
    assert_eq!(vs[0]["snapshots"], 2);
    assert_eq!(vs[1]["size"], 3);
    // The unchanged subtree docs/old was read once for three snapshots.
    let trees = v["trees_read"].as_u64().unwrap();
    assert!(trees < 3 * 4, "every snapshot's trees were read: {v}");
    // Case matters without -i; a path pattern matches the whole path.
    let v = json(&repo, &["find", "*.pdf", "--newest", "1"]);
    assert_eq!(v["found"].as_array().unwrap().len(), 1, "{v}");
    let pat = format!("{}/**/old/*", s);
    let v = json(&repo, &["find", &pat]);
    assert_eq!(v["found"][0]["path"], want_b.to_str().unwrap(), "{v}");
    let v = json(&repo, &["find", "Report.PDF", "--newest", "1"]);
    assert_eq!(v["found"][0]["versions"].as_array().unwrap().len(), 1);
    assert_eq!(v["found"][0]["more"], 1);
}

/// The paths below `root` in snapshot `latest`, relative.
fn listed(repo: &Path, root: &Path) -> Vec<String> {
    let v = json(repo, &["ls", "latest"]);
    let mut out: Vec<String> = v
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|e| {
            let p = e["path"].as_str().unwrap();
            Path::new(p)
                .strip_prefix(root)
                .ok()
                .map(|r| r.to_string_lossy().into_owned())
        })
        .filter(|r| !r.is_empty())
        .collect();
    out.sort();
    out
}

#[test]
fn the_excludes_people_use_leave_out_caches_marked_folders_huge_files_and_case_variants() {
    let t = tempfile::tempdir().unwrap();
    let (home, repo) = (t.path().join("home"), t.path().join("repo"));
    let w = |p: &str, data: &[u8]| {
        let f = home.join(p);
        std::fs::create_dir_all(f.parent().unwrap()).unwrap();
        std::fs::write(f, data).unwrap();
    };
    // ~/.cache tagged as the spec says; a look-alike tag without the
    // signature is no cache.
    let mut tag = capsule_engine::backup::CACHEDIR_SIGNATURE.to_vec();
    tag.extend_from_slice(b"\n# This file is a cache directory tag.\n");
    w(".cache/CACHEDIR.TAG", &tag);
    w(".cache/mozilla/blob", b"cached");
    w("fake/CACHEDIR.TAG", b"not a signature");
    w("fake/kept", b"kept");
    w("proj/node_modules/left/index.js", b"x");
    w("proj/src/main.js", b"y");
    w("vm/.nobackup", b"");
    w("vm/disk.img", b"big");
    w("big.iso", &vec![7u8; 300_000]);
    w("Thumbs.DB", b"t");
    w("photos/IMG.JPG", b"p");
    init(&repo);
    let h = home.to_str().unwrap();
    ok(
        &repo,
        &[
            "backup",
            h,
            "--exclude-caches",
            "--exclude",
            "node_modules",
            "--exclude-if-present",
            ".nobackup",
            "--exclude-larger-than",
            "200K",
            "--iexclude",
            "thumbs.db",
        ],
    );
    assert_eq!(
        listed(&repo, &home),
        [
            ".cache",
            ".cache/CACHEDIR.TAG",
            "fake",
            "fake/CACHEDIR.TAG",
            "fake/kept",
            "photos",
            "photos/IMG.JPG",
            "proj",
            "proj/src",
            "proj/src/main.js",
            "vm",
            "vm/.nobackup",
        ]
    );
    // Without the flags, everything; a marker with content must match it.
    ok(
        &repo,
        &[
            "backup",
            h,
            "--exclude-if-present",
            ".nobackup:yes",
            "--exclude",
            "*.jpg",
        ],
    );
    let all = listed(&repo, &home);
    for p in [
        ".cache/mozilla/blob",
        "vm/disk.img",
        "big.iso",
        "Thumbs.DB",
        "photos/IMG.JPG",
    ] {
        assert!(all.contains(&p.to_string()), "{p} missing from {all:?}");
    }
    // A bad marker name is a usage error, nothing saved.
    let o = capsule(&repo, &["backup", h, "--exclude-if-present", "a/b"]);
    assert_eq!(o.status.code(), Some(2), "{}", said(&o));

    // The same as profile keys, shown by `config show` with their origin.
    let cfg = t.path().join("capsule.toml");
    std::fs::write(
        &cfg,
        format!(
            "[profiles.home]\nrepository = {:?}\nsources = [{:?}]\nexclude-caches = true\nexclude-if-present = [\".nobackup\"]\nexclude-larger-than = \"200K\"\niexcludes = [\"THUMBS.db\"]\niexclude-file = [{:?}]\nexcludes = [\"node_modules\"]\n",
            repo.to_str().unwrap(),
            h,
            t.path().join("ipatterns").to_str().unwrap()
        ),
    )
    .unwrap();
    std::fs::write(t.path().join("ipatterns"), "# photos\n*.jpg\n").unwrap();
    let mut c = capsule_cmd(&TestEnv::beside(&repo).password(PASSWORD));
    let o = c
        .args([
            "--config",
            cfg.to_str().unwrap(),
            "--profile",
            "home",
            "backup",
        ])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", said(&o));
    let got = listed(&repo, &home);
    assert!(
        !got.iter().any(|p| p.contains("mozilla")
            || p.contains("IMG")
            || p.contains("Thumbs")
            || p == "big.iso"),
        "{got:?}"
    );
    let mut c = capsule_cmd(&TestEnv::beside(&repo).password(PASSWORD));
    let o = c
        .args([
            "--config",
            cfg.to_str().unwrap(),
            "--profile",
            "home",
            "config",
            "show",
        ])
        .output()
        .unwrap();
    let shown = said(&o);
    assert!(
        shown.contains("exclude-caches")
            && shown.contains("exclude-larger-than")
            && shown.contains("iexclude-file"),
        "{shown}"
    );
}

#[test]
fn files_from_lists_take_comments_verbatim_lines_and_nul_separated_names() {
    use std::os::unix::ffi::OsStrExt;
    let t = tempfile::tempdir().unwrap();
    let (src, repo) = (t.path().join("src"), t.path().join("repo"));
    std::fs::create_dir_all(&src).unwrap();
    let odd = src.join(std::ffi::OsStr::from_bytes(b"caf\xe9 # not a comment"));
    for p in [
        src.join("a"),
        src.join(" spaced "),
        src.join("b"),
        odd.clone(),
    ] {
        std::fs::write(&p, b"x").unwrap();
    }
    std::fs::write(src.join("not-listed"), b"x").unwrap();
    let list = t.path().join("list");
    std::fs::write(
        &list,
        format!("# my files\n\n  {}  \n", src.join("a").display()),
    )
    .unwrap();
    let verbatim = t.path().join("verbatim");
    std::fs::write(&verbatim, format!("{}\n", src.join(" spaced ").display())).unwrap();
    let raw = t.path().join("raw");
    let mut r = src.join("b").as_os_str().as_bytes().to_vec();
    r.push(0);
    r.extend_from_slice(odd.as_os_str().as_bytes());
    r.push(0);
    std::fs::write(&raw, r).unwrap();
    init(&repo);
    ok(
        &repo,
        &[
            "backup",
            "--files-from",
            list.to_str().unwrap(),
            "--files-from-verbatim",
            verbatim.to_str().unwrap(),
            "--files-from-raw",
            raw.to_str().unwrap(),
        ],
    );
    let got = listed(&repo, &src);
    assert_eq!(got.len(), 4, "{got:?}");
    assert!(!got.contains(&"not-listed".to_string()), "{got:?}");
    assert!(got.contains(&" spaced ".to_string()), "{got:?}");
    // A listed path that is not there: exit 2, no snapshot.
    std::fs::write(&list, format!("{}\n", src.join("gone").display())).unwrap();
    let before = json(&repo, &["snapshots"]).as_array().unwrap().len();
    let o = capsule(&repo, &["backup", "--files-from", list.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2), "{}", said(&o));
    assert!(said(&o).contains("does not exist"), "{}", said(&o));
    assert_eq!(
        json(&repo, &["snapshots"]).as_array().unwrap().len(),
        before
    );
}

/// A text dump of a table, as pg_dump writes one: a header, `rows` rows
/// of a few columns, and a trailer. Night `n` updates 1 % of the rows (a
/// run of them, as a day's orders are: 1 % spread evenly would touch every
/// chunk of any chunking backup tool) and appends a few new ones.
fn table_dump(rows: usize, night: usize) -> Vec<u8> {
    let mut out = String::from(
        "--\n-- PostgreSQL database dump\n--\nCOPY public.orders (id, customer, amount, note) FROM stdin;\n",
    );
    for i in 0..rows + night * 20 {
        let mut x = (i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 7;
        // Row i changed on the nights whose number divides its position.
        let touched = (1..=night)
            .filter(|n| {
                let start = n * rows * 23 / 100 % rows;
                (start..start + rows / 100).contains(&i)
            })
            .count();
        x = x.wrapping_add(touched as u64 * 7919);
        out.push_str(&format!(
            "{i}\tcustomer-{}\t{}.{:02}\tnote {:x}\n",
            x % 5000,
            x % 100_000,
            x % 100,
            x
        ));
    }
    out.push_str("\\.\n\n-- PostgreSQL database dump complete\n");
    out.into_bytes()
}

fn backup_json(repo: &Path, args: &[&str]) -> serde_json::Value {
    let mut a = vec!["backup"];
    a.extend_from_slice(args);
    json(repo, &a)
}

#[test]
fn a_nightly_dump_from_a_command_stores_only_what_changed_and_a_failed_command_no_snapshot() {
    let t = tempfile::tempdir().unwrap();
    let repo = t.path().join("repo");
    init(&repo);
    let dump = t.path().join("dump.sql");
    let cat = [
        "--stdin-from-command",
        "--stdin-filename",
        "shop.sql",
        "--",
        "cat",
    ];
    let mut added = Vec::new();
    for night in 0..3 {
        std::fs::write(&dump, table_dump(1_000_000, night)).unwrap();
        let mut args = cat.to_vec();
        args.push(dump.to_str().unwrap());
        let v = backup_json(&repo, &args);
        added.push(v["summary"]["bytes_added"].as_u64().unwrap());
        let size = std::fs::metadata(&dump).unwrap().len();
        assert_eq!(v["summary"]["bytes"].as_u64().unwrap(), size, "{v}");
    }
    // The first night stores the dump (compressed); a later night about
    // what changed: far less than the first.
    assert!(
        added[1] * 4 < added[0] && added[2] * 4 < added[0],
        "a night with 1 % changed added {added:?}"
    );
    let o = capsule_to_file(
        &repo,
        &["dump", "latest", "/shop.sql"],
        &t.path().join("back"),
    );
    assert!(o.status.success(), "{}", said(&o));
    assert_eq!(
        std::fs::read(t.path().join("back")).unwrap(),
        std::fs::read(&dump).unwrap()
    );

    // A command that fails, or is killed part-way: no snapshot, an exit
    // that names it, its stderr passed through.
    let n = json(&repo, &["snapshots"]).as_array().unwrap().len();
    let script = format!(
        "head -c 300000 {}; echo 'pg_dump: error: connection lost' >&2; exit 3",
        dump.display()
    );
    let o = capsule(
        &repo,
        &["backup", "--stdin-from-command", "--", "sh", "-c", &script],
    );
    assert_ne!(o.status.code(), Some(0), "{}", said(&o));
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(e.contains("connection lost"), "{e}");
    assert!(
        e.contains("exited with status 3") && e.contains("no snapshot"),
        "{e}"
    );
    let script = format!("head -c 300000 {}; kill -9 $$", dump.display());
    let o = capsule(
        &repo,
        &["backup", "--stdin-from-command", "--", "sh", "-c", &script],
    );
    assert!(said(&o).contains("killed by signal 9"), "{}", said(&o));
    let o = capsule(
        &repo,
        &["backup", "--stdin-from-command", "--", "/no/such/pg_dump"],
    );
    assert_eq!(o.status.code(), Some(2), "{}", said(&o));
    assert_eq!(json(&repo, &["snapshots"]).as_array().unwrap().len(), n);
    ok(&repo, &["check"]);
}

#[test]
fn standard_input_is_one_file_and_a_run_killed_while_reading_saves_nothing() {
    use std::io::Write;
    let t = tempfile::tempdir().unwrap();
    let repo = t.path().join("repo");
    init(&repo);
    let data = noise(3_000_000, 9);
    let mut c = capsule_at(&repo);
    c.args(["backup", "--stdin", "--stdin-filename", "blob.bin"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped());
    let mut child = c.spawn().unwrap();
    child.stdin.take().unwrap().write_all(&data).unwrap();
    assert!(child.wait_with_output().unwrap().status.success());
    let o = capsule_to_file(&repo, &["dump", "latest", "/blob.bin"], &t.path().join("b"));
    assert!(o.status.success(), "{}", said(&o));
    assert_eq!(std::fs::read(t.path().join("b")).unwrap(), data);

    // Killed while the stream is still coming: no snapshot.
    let mut c = capsule_at(&repo);
    c.args(["backup", "--stdin"]).stdin(Stdio::piped());
    let mut child = c.spawn().unwrap();
    let mut w = child.stdin.take().unwrap();
    w.write_all(&data).unwrap();
    child.kill().unwrap();
    child.wait().unwrap();
    drop(w);
    assert_eq!(json(&repo, &["snapshots"]).as_array().unwrap().len(), 1);
    ok(&repo, &["check"]);
}

#[test]
fn a_profile_names_a_command_and_a_file_others_may_write_runs_none() {
    use std::os::unix::fs::PermissionsExt;
    let t = tempfile::tempdir().unwrap();
    let repo = t.path().join("repo");
    init(&repo);
    let ran = t.path().join("RAN");
    let cfg = t.path().join("capsule.toml");
    std::fs::write(
        &cfg,
        format!(
            "[profiles.db]\nrepository = {:?}\ncommand = [\"sh\", \"-c\", \"touch {}; echo dumped\"]\nstdin-filename = \"db.sql\"\n",
            repo.to_str().unwrap(),
            ran.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&cfg, std::fs::Permissions::from_mode(0o600)).unwrap();
    let run = |args: &[&str]| {
        let mut c = capsule_cmd(&TestEnv::beside(&repo).password(PASSWORD));
        c.arg("--config").arg(&cfg).args(args).output().unwrap()
    };
    let o = run(&["config", "check"]);
    assert!(o.status.success(), "{}", said(&o));
    let o = run(&["--profile", "db", "backup"]);
    assert!(o.status.success(), "{}", said(&o));
    assert!(ran.exists());
    let o = capsule_to_file(&repo, &["dump", "latest", "/db.sql"], &t.path().join("d"));
    assert!(o.status.success(), "{}", said(&o));
    assert_eq!(std::fs::read(t.path().join("d")).unwrap(), b"dumped\n");
    std::fs::remove_file(&ran).unwrap();
    std::fs::set_permissions(&cfg, std::fs::Permissions::from_mode(0o666)).unwrap();
    let o = run(&["--profile", "db", "backup"]);
    assert_eq!(o.status.code(), Some(2), "{}", said(&o));
    assert!(said(&o).contains("command"), "{}", said(&o));
    assert!(!ran.exists(), "the command ran");
    // Sources and a command in one profile: refused by config check.
    std::fs::set_permissions(&cfg, std::fs::Permissions::from_mode(0o600)).unwrap();
    let mut text = std::fs::read_to_string(&cfg).unwrap();
    text.push_str("sources = [\"/etc\"]\n");
    std::fs::write(&cfg, text).unwrap();
    let o = run(&["config", "check"]);
    assert_eq!(o.status.code(), Some(2), "{}", said(&o));
}

/// Every file under `dir` with its size and modification time.
fn files_state(dir: &Path) -> Vec<(std::path::PathBuf, u64, i64)> {
    use std::os::unix::fs::MetadataExt;
    let mut v: Vec<_> = files_under(dir)
        .into_iter()
        .map(|p| {
            let m = std::fs::metadata(&p).unwrap();
            (p, m.len(), m.mtime_nsec() + m.mtime() * 1_000_000_000)
        })
        .collect();
    v.sort();
    v
}

#[test]
fn a_dry_run_counts_what_a_backup_then_does_and_writes_nothing() {
    let t = tempfile::tempdir().unwrap();
    let (src, repo) = (t.path().join("src"), t.path().join("repo"));
    for i in 0..40 {
        let d = src.join(format!("d{}", i % 3));
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join(format!("f{i}")), noise(20_000 + i * 1000, i as u64)).unwrap();
    }
    init(&repo);
    let s = src.to_str().unwrap();
    ok(&repo, &["backup", s]);
    // Some changed, some new.
    for i in 0..5 {
        std::fs::write(src.join(format!("d0/new{i}")), noise(50_000, 100 + i)).unwrap();
    }
    std::fs::write(src.join("d1/f1"), noise(30_000, 777)).unwrap();
    let before = files_state(&repo);
    let dry = json(&repo, &["--no-cache", "backup", s, "--dry-run"]);
    assert_eq!(
        files_state(&repo),
        before,
        "a dry run wrote into the repository"
    );
    assert_eq!(json(&repo, &["snapshots"]).as_array().unwrap().len(), 1);
    assert_eq!(dry["dry_run"], true);
    let real = json(&repo, &["backup", s]);
    assert_eq!(dry["files_new"], real["files_new"], "{dry}\n{real}");
    assert_eq!(dry["files_new"], 5);
    assert_eq!(dry["files_changed"], real["files_changed"]);
    assert_eq!(dry["bytes_read"], real["summary"]["bytes_read"]);
    // What it said it would send is what the backup stored.
    assert_eq!(
        dry["bytes_added"], real["summary"]["bytes_added"],
        "{dry}\n{real}"
    );
    // A stream's dry run reads it and stores nothing.
    let before = files_state(&repo);
    let o = capsule(
        &repo,
        &[
            "backup",
            "--dry-run",
            "--stdin-from-command",
            "--",
            "cat",
            src.join("d1/f1").to_str().unwrap(),
        ],
    );
    assert!(o.status.success(), "{}", said(&o));
    assert!(said(&o).contains("nothing was written"), "{}", said(&o));
    assert_eq!(files_state(&repo), before);
}

fn paths_in_all_snapshots(repo: &Path) -> Vec<String> {
    let mut out = Vec::new();
    for id in ids_of(&json(repo, &["snapshots"])) {
        for e in json(repo, &["ls", &id]).as_array().unwrap() {
            out.push(e["path"].as_str().unwrap().to_string());
        }
    }
    out
}

#[test]
fn rewrite_takes_a_secret_out_of_every_snapshot_and_prune_gives_its_space_back() {
    let t = tempfile::tempdir().unwrap();
    let (src, repo) = (t.path().join("src"), t.path().join("repo"));
    std::fs::create_dir_all(src.join("keys")).unwrap();
    std::fs::write(src.join("keys/id_secret"), noise(2_000_000, 42)).unwrap();
    std::fs::write(src.join("notes.txt"), b"keep me").unwrap();
    init(&repo);
    let s = src.to_str().unwrap();
    for i in 0..3 {
        std::fs::write(src.join(format!("day{i}")), noise(100_000, i)).unwrap();
        ok(&repo, &["backup", s, "--tag", "home"]);
    }
    let before = ids_of(&json(&repo, &["snapshots"]));
    // Dry run: what would go, from which snapshot; nothing changes.
    let v = json(&repo, &["rewrite", "--exclude", "id_secret", "--dry-run"]);
    assert_eq!(v["rewritten"].as_array().unwrap().len(), 3, "{v}");
    assert!(
        v["rewritten"][0]["removed"][0]
            .as_str()
            .unwrap()
            .contains("keys/id_secret"),
        "{v}"
    );
    assert_eq!(ids_of(&json(&repo, &["snapshots"])), before);

    // Killed at seeded points (in a copy: a killed run's session holds
    // back a prune's deletions until its lease ends): every snapshot stays
    // readable, and the run after finishes the work without duplicates.
    let cut = t.path().join("cut").join("repo");
    std::fs::create_dir_all(cut.parent().unwrap()).unwrap();
    let st = std::process::Command::new("cp")
        .arg("-a")
        .arg(&repo)
        .arg(&cut)
        .status()
        .unwrap();
    assert!(st.success());
    let mut finished = false;
    for n in (3..60).step_by(7) {
        let o = capsule_env(
            &cut,
            &["rewrite", "--exclude", "id_secret"],
            &[
                ("CAPSULE_PASSWORD", PASSWORD),
                ("CAPSULE_TEST_KILL_AT_CALL", &n.to_string()),
            ],
        );
        ok(&cut, &["check"]);
        for id in ids_of(&json(&cut, &["snapshots"])) {
            ok(&cut, &["ls", &id]);
        }
        if o.status.success() {
            finished = true;
            break;
        }
    }
    if !finished {
        ok(&cut, &["rewrite", "--exclude", "id_secret"]);
    }
    assert_eq!(json(&cut, &["snapshots"]).as_array().unwrap().len(), 3);
    assert!(!paths_in_all_snapshots(&cut)
        .iter()
        .any(|p| p.contains("id_secret")));
    ok(&repo, &["rewrite", "--exclude", "id_secret"]);
    // The new snapshots: time, host, tags kept; no secret; one per
    // original, each naming it.
    let after = json(&repo, &["snapshots"]);
    let snaps = after.as_array().unwrap();
    assert_eq!(snaps.len(), 3, "{after}");
    let mut originals: Vec<String> = snaps
        .iter()
        .map(|s| s["snapshot"]["original"].as_str().unwrap().to_string())
        .collect();
    originals.sort();
    let mut want = before.clone();
    want.sort();
    assert_eq!(originals, want);
    for s in snaps {
        assert_eq!(s["snapshot"]["tags"], serde_json::json!(["home"]));
    }
    let all = paths_in_all_snapshots(&repo);
    assert!(!all.iter().any(|p| p.contains("id_secret")), "{all:?}");
    assert!(all.iter().any(|p| p.ends_with("notes.txt")));
    assert_eq!(
        json(&repo, &["find", "id_secret"])["found"]
            .as_array()
            .unwrap()
            .len(),
        0
    );
    // The space comes back with a prune: the secret's 2 MB of noise leave
    // the packs, and what stays reads back whole.
    let packed = dir_bytes(&pack_files(&repo));
    let said_prune = ok(&repo, &["prune", "--max-unused", "0"]);
    let left = dir_bytes(&pack_files(&repo));
    assert!(
        packed > left + 1_900_000,
        "pruned {packed} -> {left}: {said_prune}"
    );
    ok(&repo, &["check", "--read-data"]);
    let r = t.path().join("r");
    ok(
        &repo,
        &["restore", "latest", "--target", r.to_str().unwrap()],
    );
    assert_eq!(
        std::fs::read(restored(&r, &src).join("notes.txt")).unwrap(),
        b"keep me"
    );
    assert!(!restored(&r, &src).join("keys/id_secret").exists());
}
