//! "Put back": a file or folder of a snapshot restored to the path it was
//! backed up from, as Time Machine's "Restore" does.
//!
//! Nothing is replaced without asking: a first answer (409) lists what
//! differs from the snapshot's version and would be replaced. The
//! snapshot's version is restored first into a staging folder beside the
//! item (same file system, removed after), then moved into place entry by
//! entry, each file by one `rename` (so a reader sees the old file or the
//! new one, never half of either). A folder is merged: what it gained
//! since the snapshot stays. Nothing outside the item is written, but for
//! the staging folder and parents that no longer exist.
//!
//! The page runs as whoever started it, often root, over folders other
//! users own: every step goes through directory descriptors reached from
//! `/` without following links (as the restore engine does), so a link
//! planted on the way, before or while it runs, is refused and named,
//! never followed.

use std::ffi::OsStr;
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path};
use std::sync::Arc;

use rustix::fs::{AtFlags, FileType, Mode, OFlags, Stat};

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use capsule_engine::browse::Browser;
use capsule_format::tree::{Node, NodeKind};
use serde::Deserialize;

use super::jobs::{not_restored, run_restore};
use super::paths::{resolve, root_tree, snapshot_path};
use super::state::{bad, blocking, Failure, Shared};

#[derive(Deserialize)]
pub(crate) struct PutBackQ {
    snapshot: String,
    path: String,
    /// Replace what differs (asked for after a first answer listed it).
    #[serde(default)]
    replace: bool,
    /// A name to ask how far it got (`/api/progress?job=`).
    #[serde(default)]
    job: Option<String>,
}

/// Most paths a 409 lists (the count is always whole).
const LISTED: usize = 100;

/// Puts `path` of `snapshot` back where it was backed up from.
pub(crate) async fn put_back(
    State(ui): State<Shared>,
    Json(q): Json<PutBackQ>,
) -> Result<Response, Failure> {
    let path = snapshot_path(&q.path)?;
    if path.parent().is_none() {
        return Err(bad("put back the folders inside / one at a time"));
    }
    let v = ui.view();
    let here = ui.host.clone();
    blocking(move || {
        let (_, snap) = resolve(&v, &q.snapshot)?;
        if snap.hostname != here {
            return Err(Failure(
                StatusCode::CONFLICT,
                format!(
                    "this snapshot was made on {}, not on this machine ({here}): restore it into a directory instead",
                    snap.hostname
                ),
            ));
        }
        let root = root_tree(&snap)?;
        let node = v
            .browser
            .find(&root, &path)?
            .ok_or_else(|| bad("the root cannot be put back"))?;
        let Some(literal) = path.to_str() else {
            return Err(bad(format!(
                "{} is not UTF-8: put back the folder that holds it",
                path.display()
            )));
        };
        let mut differ = Vec::new();
        let mut count = 0u64;
        if let (Some(parent), Some(name)) = (open_existing(&path)?, path.file_name()) {
            replaced(&v.browser, &node, &parent, name, &path, &mut differ, &mut count, 0)?;
        }
        if count > 0 && !q.replace {
            return Ok((
                StatusCode::CONFLICT,
                Json(serde_json::json!({
                    "error": format!("{count} item(s) at {} differ from this version and would be replaced", path.display()),
                    "replace": differ,
                    "count": count,
                })),
            )
                .into_response());
        }
        let parent = path.parent().unwrap_or(Path::new("/"));
        let name = path
            .file_name()
            .ok_or_else(|| bad("the root cannot be put back"))?;
        let to = Arc::new(walk_to(parent)?);
        let staging = Staging::new(to.clone(), parent)?;
        let opts = capsule_engine::restore::RestoreOptions {
            target: staging.path.clone(),
            target_dir: Some(staging.fd.clone()),
            includes: vec![capsule_engine::restore::literal_pattern(literal)],
            max_entries: capsule_engine::treewalk::entry_budget(&snap),
            overwrite: capsule_engine::restore::Overwrite::Always,
            ..capsule_engine::restore::RestoreOptions::default()
        };
        let r = run_restore(&ui, &v, &root, &opts, q.job)?;
        if !r.errors.is_empty() {
            // Nothing moved into place: the item is as it was.
            return Err(internal(format!("nothing was put back: {}", not_restored(&r))));
        }
        let rel = parent.strip_prefix("/").unwrap_or(parent);
        let from = below(&staging.fd, rel)
            .map_err(|e| internal(format!("the restored copy of {}: {e}", path.display())))?;
        let mut moved = 0u64;
        move_into_place(&from, &to, name, &mut moved, 0)
            .map_err(|e| internal(format!("putting {} back stopped: {e}", path.display())))?;
        let mut report = serde_json::to_value(&r).unwrap_or_default();
        report["put_back"] = serde_json::Value::from(moved);
        report["replaced"] = serde_json::Value::from(count);
        Ok((StatusCode::OK, Json(report)).into_response())
    })
    .await
}

fn internal(why: String) -> Failure {
    Failure(StatusCode::INTERNAL_SERVER_ERROR, why)
}

fn dir_flags() -> OFlags {
    OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC
}

fn is(st: &Stat, t: FileType) -> bool {
    FileType::from_raw_mode(st.st_mode) == t
}

/// A link (or other non-folder) where put back needed a folder on its way:
/// refused, and named with where it points.
fn in_the_way(at: &Path) -> Failure {
    let what = match std::fs::read_link(at) {
        Ok(to) => format!("a symbolic link (to {})", to.display()),
        Err(_) => "not a folder".to_string(),
    };
    Failure(
        StatusCode::CONFLICT,
        format!(
            "{} is {what}: put back does not follow it, as it could lead outside the folders backed up; nothing was written. Remove it, or restore into a folder instead",
            at.display()
        ),
    )
}

/// Opens folder `name` in `dir` (at `at`), never through a link.
fn step(dir: &OwnedFd, name: &OsStr, at: &Path) -> Result<Option<OwnedFd>, Failure> {
    match rustix::fs::openat(dir, name, dir_flags(), Mode::empty()) {
        Ok(fd) => Ok(Some(fd)),
        Err(rustix::io::Errno::NOENT) => Ok(None),
        Err(rustix::io::Errno::LOOP | rustix::io::Errno::NOTDIR) => Err(in_the_way(at)),
        Err(e) => Err(internal(format!("cannot open {}: {e}", at.display()))),
    }
}

fn names(p: &Path) -> impl Iterator<Item = &OsStr> {
    p.components().filter_map(|c| match c {
        Component::Normal(n) => Some(n),
        _ => None,
    })
}

fn slash() -> Result<OwnedFd, Failure> {
    rustix::fs::open("/", dir_flags(), Mode::empty())
        .map_err(|e| internal(format!("cannot open /: {e}")))
}

/// The folder holding `path`, if every folder down to it exists; a link
/// on the way is refused.
fn open_existing(path: &Path) -> Result<Option<OwnedFd>, Failure> {
    let mut fd = slash()?;
    let mut at = std::path::PathBuf::from("/");
    for n in names(path.parent().unwrap_or(Path::new("/"))) {
        at.push(n);
        match step(&fd, n, &at)? {
            Some(next) => fd = next,
            None => return Ok(None),
        }
    }
    Ok(Some(fd))
}

/// Opens folder `dir` from `/`, making what is missing, never through a
/// link.
fn walk_to(dir: &Path) -> Result<OwnedFd, Failure> {
    let mut fd = slash()?;
    let mut at = std::path::PathBuf::from("/");
    for n in names(dir) {
        at.push(n);
        if let Some(next) = step(&fd, n, &at)? {
            fd = next;
            continue;
        }
        match rustix::fs::mkdirat(&fd, n, Mode::from_raw_mode(0o755)) {
            Ok(()) | Err(rustix::io::Errno::EXIST) => {}
            Err(e) => {
                return Err(internal(format!(
                    "cannot create {} to put the item back into: {e}",
                    at.display()
                )))
            }
        }
        fd = step(&fd, n, &at)?.ok_or_else(|| internal(format!("{} vanished", at.display())))?;
    }
    Ok(fd)
}

/// Opens `rel` below `dir`, never through a link.
fn below(dir: &OwnedFd, rel: &Path) -> std::io::Result<OwnedFd> {
    let mut fd = rustix::fs::openat(dir, ".", dir_flags(), Mode::empty())?;
    for n in names(rel) {
        fd = rustix::fs::openat(&fd, n, dir_flags(), Mode::empty())?;
    }
    Ok(fd)
}

/// A folder beside the item to restore into, removed when dropped.
struct Staging {
    parent: Arc<OwnedFd>,
    name: String,
    fd: Arc<OwnedFd>,
    path: std::path::PathBuf,
}

impl Staging {
    fn new(parent: Arc<OwnedFd>, parent_path: &Path) -> Result<Self, Failure> {
        let mut r = [0u8; 6];
        getrandom::fill(&mut r).map_err(|e| internal(format!("no randomness: {e}")))?;
        let hex: String = r.iter().map(|b| format!("{b:02x}")).collect();
        let name = format!(".capsule-put-back-{hex}");
        let cannot = |e: rustix::io::Errno| {
            internal(format!(
                "cannot write in {} to put the item back: {e}",
                parent_path.display()
            ))
        };
        rustix::fs::mkdirat(&parent, name.as_str(), Mode::from_raw_mode(0o700)).map_err(cannot)?;
        let fd = rustix::fs::openat(&parent, name.as_str(), dir_flags(), Mode::empty())
            .map_err(cannot)?;
        Ok(Staging {
            path: parent_path.join(&name),
            parent,
            name,
            fd: Arc::new(fd),
        })
    }
}

impl Drop for Staging {
    fn drop(&mut self) {
        let _ = capsule_engine::restore::remove_tree_at(&self.parent, OsStr::new(&self.name));
    }
}

/// Counts (and lists up to [`LISTED`]) what is at `name` in `dir` (`at`)
/// and differs from `node`: a file of another size or time, another kind
/// of entry, a symlink elsewhere. What the snapshot lacks is kept, so not
/// counted.
#[allow(clippy::too_many_arguments)]
fn replaced(
    b: &Arc<Browser>,
    node: &Node,
    dir: &OwnedFd,
    name: &OsStr,
    at: &Path,
    list: &mut Vec<String>,
    count: &mut u64,
    depth: usize,
) -> Result<(), Failure> {
    if depth > 512 {
        return Err(internal("trees nested over 512 deep: damaged".into()));
    }
    let Ok(st) = rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW) else {
        return Ok(());
    };
    let differs = match node.kind() {
        NodeKind::Dir if is(&st, FileType::Directory) => match &node.subtree {
            Some(sub) => match rustix::fs::openat(dir, name, dir_flags(), Mode::empty()) {
                Ok(fd) => {
                    for n in b.tree(sub)?.iter() {
                        let nn = OsStr::from_bytes(&n.name);
                        replaced(b, n, &fd, nn, &at.join(nn), list, count, depth + 1)?;
                    }
                    false
                }
                // Swapped for something else since it was looked at.
                Err(_) => true,
            },
            None => false,
        },
        NodeKind::File => {
            !is(&st, FileType::RegularFile)
                || st.st_size as u64 != node.size
                || st.st_mtime != node.mtime.secs
        }
        NodeKind::Symlink => {
            !is(&st, FileType::Symlink)
                || rustix::fs::readlinkat(dir, name, Vec::new())
                    .ok()
                    .as_ref()
                    .map(|p| p.as_bytes())
                    != Some(&node.target[..])
        }
        _ => true,
    };
    if differs {
        *count += 1;
        if list.len() < LISTED {
            let mut s = at.to_string_lossy().into_owned();
            if is(&st, FileType::Directory) && node.kind() != NodeKind::Dir {
                s.push_str(" (a folder, with all it holds)");
            } else if is(&st, FileType::Symlink) && node.kind() != NodeKind::Symlink {
                s.push_str(" (a symbolic link: replaced, not followed)");
            }
            list.push(s);
        }
    }
    Ok(())
}

/// Moves what was restored as `name` in `from` to `name` in `to`: a folder
/// into an existing folder entry by entry (keeping what only `to` has),
/// anything else by one rename over what was there (a link is replaced,
/// never followed).
fn move_into_place(
    from: &OwnedFd,
    to: &OwnedFd,
    name: &OsStr,
    moved: &mut u64,
    depth: usize,
) -> std::io::Result<()> {
    if depth > 512 {
        return Err(std::io::Error::other("trees nested over 512 deep"));
    }
    let staged = rustix::fs::statat(from, name, AtFlags::SYMLINK_NOFOLLOW)?;
    let there = rustix::fs::statat(to, name, AtFlags::SYMLINK_NOFOLLOW).ok();
    let staged_dir = is(&staged, FileType::Directory);
    match there {
        Some(t) if staged_dir && is(&t, FileType::Directory) => {
            let f = rustix::fs::openat(from, name, dir_flags(), Mode::empty())?;
            let d = rustix::fs::openat(to, name, dir_flags(), Mode::empty())?;
            let mut entries = Vec::new();
            for e in rustix::fs::Dir::read_from(&f)? {
                let n = e?.file_name().to_bytes().to_vec();
                if n != b"." && n != b".." {
                    entries.push(n);
                }
            }
            for n in entries {
                move_into_place(&f, &d, OsStr::from_bytes(&n), moved, depth + 1)?;
            }
            // The folder's own mode and time as the snapshot has them.
            rustix::fs::fchmod(&d, Mode::from_raw_mode(staged.st_mode & 0o7777))?;
            let omit = rustix::fs::Timespec {
                tv_sec: 0,
                tv_nsec: rustix::fs::UTIME_OMIT,
            };
            rustix::fs::futimens(
                &d,
                &rustix::fs::Timestamps {
                    last_access: omit,
                    last_modification: rustix::fs::Timespec {
                        tv_sec: staged.st_mtime,
                        tv_nsec: staged.st_mtime_nsec as _,
                    },
                },
            )?;
            Ok(())
        }
        Some(t) if is(&t, FileType::Directory) => {
            // Listed and agreed to: a folder where the snapshot has a file.
            capsule_engine::restore::remove_tree_at(to, name)?;
            rustix::fs::renameat(from, name, to, name)?;
            *moved += 1;
            Ok(())
        }
        Some(_) if staged_dir => {
            // Listed and agreed to: a file (or link) where the snapshot
            // has a folder.
            rustix::fs::unlinkat(to, name, AtFlags::empty())?;
            rustix::fs::renameat(from, name, to, name)?;
            *moved += 1;
            Ok(())
        }
        _ => {
            rustix::fs::renameat(from, name, to, name)?;
            *moved += 1;
            Ok(())
        }
    }
}
