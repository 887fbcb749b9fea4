//! The versions of one path across snapshots: its distinct contents, when
//! each appeared and which snapshots hold it. Found from tree and content
//! IDs alone, without reading file data; the trees along the path are read
//! once each however many snapshots share them, so an hourly history costs
//! about what its changes along the path cost.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use capsule_format::snapshot::Snapshot;
use capsule_format::tree::{Node, NodeKind};
use capsule_format::{BlobId, ObjectId};
use serde::Serialize;

use crate::error::{EngineError, Result};
use crate::index::MasterIndex;
use crate::repo::Repository;
use crate::treewalk::find_in;

/// One distinct content of the path.
#[derive(Debug, Clone, Serialize)]
pub struct Version {
    /// 1 for the content seen first, counting up.
    pub number: usize,
    /// `file`, `dir`, `symlink`…
    #[serde(rename = "type")]
    pub kind: &'static str,
    /// Bytes (files).
    pub size: u64,
    /// Modification time (Unix seconds) in the first snapshot holding it.
    pub mtime: i64,
    /// Permission bits.
    pub mode: u32,
    /// A fingerprint of the content (its data blob IDs, subtree ID or link
    /// target), 16 hex digits: equal fingerprints, equal contents.
    pub content: String,
    /// The oldest snapshot holding it: time and ID.
    pub first_time: String,
    /// See `first_time`.
    pub first_snapshot: String,
    /// The newest snapshot holding it.
    pub last_time: String,
    /// See `last_time`.
    pub last_snapshot: String,
    /// How many snapshots hold it.
    pub snapshots: usize,
    /// The node as stored in the newest snapshot holding it (not in JSON).
    #[serde(skip)]
    pub node: Node,
}

/// What one snapshot holds at the path.
#[derive(Debug, Clone, Serialize)]
pub struct Held {
    /// Snapshot ID.
    pub snapshot: String,
    /// Its time.
    pub time: String,
    /// The host that made it.
    pub host: String,
    /// The version it holds; none when the path is absent from it (or its
    /// trees along the path are damaged: see `damaged`).
    pub version: Option<usize>,
}

/// The versions of a path.
#[derive(Debug, Clone, Serialize)]
pub struct Versions {
    /// The path, as stored.
    pub path: String,
    /// Distinct contents, the first seen first.
    pub versions: Vec<Version>,
    /// Every snapshot looked in, oldest first.
    pub timeline: Vec<Held>,
    /// Snapshots whose trees along the path could not be read, with why.
    /// The others are still answered.
    pub damaged: Vec<String>,
}

/// The fingerprint of a node's content: what makes two versions the same.
/// Times, owners and modes are not content: a file only touched is the
/// same version.
pub(crate) fn fingerprint(n: &Node) -> [u8; 32] {
    let mut h = blake3::Hasher::new();
    h.update(n.kind().as_str().as_bytes());
    match n.kind() {
        NodeKind::File => {
            h.update(&n.size.to_le_bytes());
            for b in &n.content {
                h.update(b.as_bytes());
            }
        }
        NodeKind::Dir => {
            if let Some(t) = &n.subtree {
                h.update(t.as_bytes());
            }
        }
        NodeKind::Symlink => {
            h.update(&n.target);
        }
        _ => {
            h.update(&n.rdev.to_le_bytes());
        }
    }
    *h.finalize().as_bytes()
}

/// The versions of `path` (absolute, as `ls` shows it) in `snaps` (oldest
/// first). A snapshot whose trees cannot be read is named in `damaged`
/// and the rest are answered; the path absent from every snapshot is
/// [`EngineError::PathNotFound`].
pub fn versions(
    repo: &Repository,
    index: &MasterIndex,
    snaps: &[(ObjectId, Snapshot)],
    path: &Path,
) -> Result<Versions> {
    let mut trees: HashMap<BlobId, Arc<Vec<Node>>> = HashMap::new();
    versions_with(
        &mut |id: &BlobId| -> Result<Arc<Vec<Node>>> {
            if let Some(t) = trees.get(id) {
                return Ok(t.clone());
            }
            let t = Arc::new(repo.load_tree(index, id)?);
            trees.insert(*id, t.clone());
            Ok(t)
        },
        snaps,
        path,
    )
}

/// [`versions`] with trees from `load` (a cache shared with other
/// requests: [`crate::browse::Browser`]).
pub fn versions_with(
    load: &mut dyn FnMut(&BlobId) -> Result<Arc<Vec<Node>>>,
    snaps: &[(ObjectId, Snapshot)],
    path: &Path,
) -> Result<Versions> {
    let mut by_print: HashMap<[u8; 32], usize> = HashMap::new();
    let mut out = Versions {
        path: path.to_string_lossy().into_owned(),
        versions: Vec::new(),
        timeline: Vec::new(),
        damaged: Vec::new(),
    };
    for (id, snap) in snaps {
        let found = snap
            .tree
            .parse::<BlobId>()
            .map_err(|_| EngineError::corrupt("snapshot", "bad tree id"))
            .and_then(|root| find_in(load, &root, path));
        let node = match found {
            Ok(n) => n,
            Err(EngineError::PathNotFound(_)) => None,
            Err(e) => {
                out.damaged.push(format!("snapshot {}: {e}", id.short()));
                None
            }
        };
        let version = node.map(|n| {
            let print = fingerprint(&n);
            let next = out.versions.len();
            let i = *by_print.entry(print).or_insert(next);
            if i == next {
                out.versions.push(Version {
                    number: next + 1,
                    kind: n.kind().as_str(),
                    size: n.size,
                    mtime: n.mtime.secs,
                    mode: n.mode,
                    content: hex::encode(&print[..8]),
                    first_time: snap.time.clone(),
                    first_snapshot: id.to_hex(),
                    last_time: String::new(),
                    last_snapshot: String::new(),
                    snapshots: 0,
                    node: n.clone(),
                });
            }
            let v = &mut out.versions[i];
            v.last_time.clone_from(&snap.time);
            v.last_snapshot = id.to_hex();
            v.snapshots += 1;
            v.node = n;
            i + 1
        });
        out.timeline.push(Held {
            snapshot: id.to_hex(),
            time: snap.time.clone(),
            host: snap.hostname.clone(),
            version,
        });
    }
    if out.versions.is_empty() && out.damaged.is_empty() {
        return Err(EngineError::PathNotFound(format!(
            "{} (in none of the {} snapshots)",
            path.display(),
            snaps.len()
        )));
    }
    Ok(out)
}
