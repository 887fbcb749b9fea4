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

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

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
        replaced(&v.browser, &node, &path, &mut differ, &mut count, 0)?;
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
        std::fs::create_dir_all(parent).map_err(|e| {
            internal(format!("cannot create {} to put it back into: {e}", parent.display()))
        })?;
        let staging = Staging::new(parent)?;
        let opts = capsule_engine::restore::RestoreOptions {
            target: staging.0.clone(),
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
        let staged = staging.0.join(path.strip_prefix("/").unwrap_or(&path));
        let mut moved = 0u64;
        move_into_place(&staged, &path, &mut moved, 0)
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

/// A folder beside the item to restore into, removed when dropped.
struct Staging(PathBuf);

impl Staging {
    fn new(parent: &Path) -> Result<Self, Failure> {
        let mut r = [0u8; 6];
        getrandom::fill(&mut r).map_err(|e| internal(format!("no randomness: {e}")))?;
        let name: String = r.iter().map(|b| format!("{b:02x}")).collect();
        let p = parent.join(format!(".capsule-put-back-{name}"));
        std::fs::create_dir(&p).map_err(|e| {
            internal(format!(
                "cannot write in {} to put the item back: {e}",
                parent.display()
            ))
        })?;
        Ok(Staging(p))
    }
}

impl Drop for Staging {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Counts (and lists up to [`LISTED`]) what is at `at` and differs from
/// `node`: a file of another size or time, another kind of entry, a
/// symlink elsewhere. What the snapshot lacks is kept, so not counted.
fn replaced(
    b: &Arc<Browser>,
    node: &Node,
    at: &Path,
    list: &mut Vec<String>,
    count: &mut u64,
    depth: usize,
) -> Result<(), Failure> {
    if depth > 512 {
        return Err(internal("trees nested over 512 deep: damaged".into()));
    }
    let Ok(m) = std::fs::symlink_metadata(at) else {
        return Ok(());
    };
    let differs = match node.kind() {
        NodeKind::Dir if m.is_dir() => {
            if let Some(sub) = &node.subtree {
                for n in b.tree(sub)?.iter() {
                    let name =
                        <std::ffi::OsStr as std::os::unix::ffi::OsStrExt>::from_bytes(&n.name);
                    replaced(b, n, &at.join(name), list, count, depth + 1)?;
                }
            }
            false
        }
        NodeKind::File => !m.is_file() || m.size() != node.size || m.mtime() != node.mtime.secs,
        NodeKind::Symlink => {
            !m.file_type().is_symlink()
                || std::fs::read_link(at)
                    .ok()
                    .as_deref()
                    .map(|p| p.as_os_str().as_encoded_bytes())
                    != Some(&node.target[..])
        }
        _ => true,
    };
    if differs {
        *count += 1;
        if list.len() < LISTED {
            let mut s = at.to_string_lossy().into_owned();
            if m.is_dir() && node.kind() != NodeKind::Dir {
                s.push_str(" (a folder, with all it holds)");
            }
            list.push(s);
        }
    }
    Ok(())
}

/// Moves what was restored at `from` to `to`: a folder into an existing
/// folder entry by entry (keeping what only `to` has), anything else by
/// one rename over what was there.
fn move_into_place(from: &Path, to: &Path, moved: &mut u64, depth: usize) -> std::io::Result<()> {
    if depth > 512 {
        return Err(std::io::Error::other("trees nested over 512 deep"));
    }
    let staged = std::fs::symlink_metadata(from)?;
    let there = std::fs::symlink_metadata(to).ok();
    match there {
        Some(t) if staged.is_dir() && t.is_dir() => {
            for e in std::fs::read_dir(from)? {
                let e = e?;
                move_into_place(&e.path(), &to.join(e.file_name()), moved, depth + 1)?;
            }
            // The folder's own mode and time as the snapshot has them.
            std::fs::set_permissions(to, staged.permissions())?;
            std::fs::File::open(to)?.set_modified(staged.modified()?)?;
            Ok(())
        }
        Some(t) if t.is_dir() => {
            // Listed and agreed to: a folder where the snapshot has a file.
            std::fs::remove_dir_all(to)?;
            std::fs::rename(from, to)?;
            *moved += 1;
            Ok(())
        }
        Some(_) if staged.is_dir() => {
            // Listed and agreed to: a file where the snapshot has a folder.
            std::fs::remove_file(to)?;
            std::fs::rename(from, to)?;
            *moved += 1;
            Ok(())
        }
        _ => {
            std::fs::rename(from, to)?;
            *moved += 1;
            Ok(())
        }
    }
}
