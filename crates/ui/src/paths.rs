//! Paths in snapshots as the page names them: escaped bytes, a snapshot
//! and a path in it, the tree a path names.

use std::path::{Component, Path, PathBuf};

use axum::http::StatusCode;
use capsule_engine::browse::Browser;
use capsule_engine::browse::View;
use capsule_engine::EngineError;
use capsule_format::snapshot::Snapshot;
use capsule_format::tree::NodeKind;
use capsule_format::{BlobId, ObjectId};
use serde::Deserialize;

use super::state::{bad, Failure};

/// A stored name as the page carries it: UTF-8 as it is, except `%`,
/// written `%25`, and each byte that is not UTF-8, written `%XX`. Lossless,
/// so a name that is not UTF-8 can be opened, downloaded and restored from
/// the page like any other ([`unescape`] reverses it).
pub(crate) fn escape(name: &[u8]) -> String {
    let mut out = String::with_capacity(name.len());
    for chunk in name.utf8_chunks() {
        for c in chunk.valid().chars() {
            if c == '%' {
                out.push_str("%25");
            } else {
                out.push(c);
            }
        }
        for b in chunk.invalid() {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// The bytes of a name or path written by [`escape`]; a `%` not followed
/// by two hex digits stands for itself.
fn unescape(s: &str) -> Vec<u8> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let hex = |x: u8| (x as char).to_digit(16);
        match (
            b[i],
            b.get(i + 1).copied().and_then(hex),
            b.get(i + 2).copied().and_then(hex),
        ) {
            (b'%', Some(h), Some(l)) => {
                out.push((h * 16 + l) as u8);
                i += 3;
            }
            (c, _, _) => {
                out.push(c);
                i += 1;
            }
        }
    }
    out
}

/// A snapshot path as the page gives it ([`escape`]d): absolute, no `..`,
/// no NUL, not absurdly long.
pub(crate) fn snapshot_path(p: &str) -> Result<PathBuf, Failure> {
    use std::os::unix::ffi::OsStrExt;
    let raw = unescape(p);
    if raw.len() > 4096 || raw.contains(&0) || !raw.starts_with(b"/") {
        return Err(bad(format!("not a path in a snapshot: {p:.100}")));
    }
    let path = PathBuf::from(std::ffi::OsStr::from_bytes(&raw));
    if path
        .components()
        .any(|c| !matches!(c, Component::RootDir | Component::Normal(_)))
    {
        return Err(bad(format!("not a path in a snapshot: {p:.100}")));
    }
    Ok(path)
}

pub(crate) fn resolve(v: &View, spec: &str) -> Result<(ObjectId, Snapshot), Failure> {
    let lower = spec.to_ascii_lowercase();
    let hits: Vec<_> = v
        .snapshots
        .iter()
        .filter(|(id, _)| id.to_hex().starts_with(&lower))
        .collect();
    match (spec, hits.as_slice()) {
        ("latest", _) => v.snapshots.last().cloned(),
        (_, [one]) => Some((*one).clone()),
        _ => None,
    }
    .ok_or_else(|| Failure(StatusCode::NOT_FOUND, format!("no snapshot {spec:.80}")))
}

/// The root tree of `snap`.
pub(crate) fn root_tree(snap: &Snapshot) -> Result<BlobId, Failure> {
    snap.tree
        .parse()
        .map_err(|_| Failure::from(EngineError::corrupt("snapshot", "bad tree id")))
}

/// The tree of the directory at `path` in snapshot `snap`.
pub(crate) fn dir_tree(b: &Browser, snap: &Snapshot, path: &Path) -> Result<BlobId, Failure> {
    let root = root_tree(snap)?;
    match b.find(&root, path)? {
        None => Ok(root),
        Some(n) if n.kind() == NodeKind::Dir => n
            .subtree
            .ok_or_else(|| bad(format!("{} has no tree", path.display()))),
        Some(_) => Err(bad(format!("{} is not a directory", path.display()))),
    }
}

/// The file at `path` in the snapshot `spec` names, and its first `len`
/// bytes, read before answering: a file whose data is damaged or missing
/// gets an error naming it, not a 200 and an empty body. Damage further
/// in ends the stream in an error (never a body that looks whole).
pub(crate) fn file_head(
    v: &View,
    spec: &str,
    path: &Path,
    len: usize,
) -> Result<(capsule_format::tree::Node, Vec<u8>), Failure> {
    let (_, snap) = resolve(v, spec)?;
    let root = root_tree(&snap)?;
    let n = v
        .browser
        .find(&root, path)?
        .ok_or_else(|| bad("the root is not a file"))?;
    if n.kind() != NodeKind::File {
        return Err(bad(format!("{} is not a file", path.display())));
    }
    let head = v
        .browser
        .file_map(&n)
        .and_then(|m| v.browser.read_at(&m, 0, len, true));
    match head {
        Ok(h) => Ok((n, h)),
        Err(e) => {
            eprintln!("capsule ui: {}: {e}", path.display());
            Err(Failure(
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("{} cannot be read: {e}", path.display()),
            ))
        }
    }
}

/// A snapshot and a path in it, as a request names them.
#[derive(Deserialize)]
pub(crate) struct At {
    pub(crate) snapshot: String,
    pub(crate) path: String,
}
