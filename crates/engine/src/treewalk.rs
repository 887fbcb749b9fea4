//! Walking stored trees: listing a snapshot, and finding a path inside it.
//! Trees load one directory at a time, so a listing never holds more than
//! one path from the root to a leaf in memory.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

use capsule_format::tree::{Node, NodeKind};
use capsule_format::BlobId;

use crate::index::MasterIndex;
use crate::repo::Repository;
use crate::{EngineError, Result};

/// Calls `f` for every entry below `tree`, depth first in name order, with
/// its path relative to the snapshot root (starting with `/`).
pub fn walk(
    repo: &Repository,
    index: &MasterIndex,
    tree: &BlobId,
    base: &Path,
    f: &mut dyn FnMut(&Path, &Node) -> Result<()>,
) -> Result<()> {
    for node in repo.load_tree(index, tree)? {
        let p = base.join(OsStr::from_bytes(&node.name));
        f(&p, &node)?;
        if node.kind() == NodeKind::Dir {
            if let Some(sub) = &node.subtree {
                walk(repo, index, sub, &p, f)?;
            }
        }
    }
    Ok(())
}

/// Finds the node at `path` (absolute, as shown by `ls`) in the tree rooted
/// at `root`. Returns `None` for the root itself.
pub fn find(
    repo: &Repository,
    index: &MasterIndex,
    root: &BlobId,
    path: &Path,
) -> Result<Option<Node>> {
    let mut tree = *root;
    let mut found: Option<Node> = None;
    for c in path.components() {
        let name = match c {
            Component::RootDir | Component::CurDir => continue,
            Component::Normal(n) => n,
            _ => return Err(EngineError::PathNotFound(path.display().to_string())),
        };
        if let Some(n) = &found {
            tree = n
                .subtree
                .filter(|_| n.kind() == NodeKind::Dir)
                .ok_or_else(|| EngineError::PathNotFound(path.display().to_string()))?;
        }
        let nodes = repo.load_tree(index, &tree)?;
        let n = nodes
            .into_iter()
            .find(|n| n.name == name.as_bytes())
            .ok_or_else(|| EngineError::PathNotFound(path.display().to_string()))?;
        found = Some(n);
    }
    Ok(found)
}

/// Normalizes a user-given snapshot path to start with `/`.
pub fn snapshot_path(p: &str) -> PathBuf {
    Path::new("/").join(p.trim_start_matches('/'))
}
