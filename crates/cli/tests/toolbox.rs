//! The everyday tools (issue 61): `dump`, snapshot filters and `tag`,
//! `find`, the excludes people reach for, backups from standard input and
//! from a command.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::BTreeMap;
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
