//! Walking stored trees: listing a snapshot, and finding a path inside it.
//! Trees load one directory at a time, so a listing never holds more than
//! one path from the root to a leaf in memory.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;

use capsule_format::tree::{Node, NodeKind};
use capsule_format::BlobId;

use crate::error::{EngineError, Result};
use crate::index::MasterIndex;
use crate::repo::Repository;

/// How many more entries a walk may visit, and the trees on the path from
/// the root (a tree that is its own ancestor is damage, not a directory).
#[derive(Debug)]
pub struct Budget {
    left: u64,
    claimed: u64,
    ancestors: Vec<BlobId>,
}

impl Budget {
    /// A budget of `entries` (see [`entry_budget`]).
    pub fn new(entries: u64) -> Self {
        Budget {
            left: entries,
            claimed: entries,
            ancestors: Vec::new(),
        }
    }

    /// Counts `n` entries; an error once the budget is spent.
    pub fn take(&mut self, n: u64) -> Result<()> {
        if n > self.left {
            return Err(EngineError::corrupt(
                "snapshot",
                format!(
                    "its trees hold more than the {} entries it records: subtrees shared over and over (a tree bomb); stopped before exhausting memory",
                    self.claimed
                ),
            ));
        }
        self.left -= n;
        Ok(())
    }

    /// Enters `tree`; an error if it is already on the path (a cycle).
    pub fn enter(&mut self, tree: &BlobId) -> Result<()> {
        if self.ancestors.contains(tree) {
            return Err(EngineError::corrupt(
                format!("tree {}", tree.short()),
                "the tree contains itself (a cycle)",
            ));
        }
        self.ancestors.push(*tree);
        Ok(())
    }

    /// Leaves the tree entered last.
    pub fn leave(&mut self) {
        self.ancestors.pop();
    }
}

/// Calls `f` for every entry below `tree`, depth first in name order, with
/// its path relative to the snapshot root (starting with `/`). Stops with
/// an error when `budget` is spent or a tree contains itself.
pub fn walk(
    repo: &Repository,
    index: &MasterIndex,
    tree: &BlobId,
    base: &Path,
    budget: &mut Budget,
    f: &mut dyn FnMut(&Path, &Node) -> Result<()>,
) -> Result<()> {
    budget.enter(tree)?;
    let nodes = repo.load_tree(index, tree)?;
    budget.take(nodes.len() as u64)?;
    for node in nodes {
        let p = base.join(OsStr::from_bytes(&node.name));
        f(&p, &node)?;
        if node.kind() == NodeKind::Dir {
            if let Some(sub) = &node.subtree {
                walk(repo, index, sub, &p, budget, f)?;
            }
        }
    }
    budget.leave();
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
    find_in(
        &mut |id| repo.load_tree(index, id).map(Arc::new),
        root,
        path,
    )
}

/// [`find`] with trees from `load`, which may serve them from a cache: a
/// path looked up in many snapshots meets the same trees again and again.
pub fn find_in(
    load: &mut dyn FnMut(&BlobId) -> Result<Arc<Vec<Node>>>,
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
        let nodes = load(&tree)?;
        // Decoding refuses a tree not strictly sorted by name.
        let i = nodes
            .binary_search_by(|n| n.name.as_slice().cmp(name.as_bytes()))
            .map_err(|_| EngineError::PathNotFound(path.display().to_string()))?;
        found = Some(nodes[i].clone());
    }
    Ok(found)
}

/// Normalizes a user-given snapshot path to start with `/`.
pub fn snapshot_path(p: &str) -> PathBuf {
    Path::new("/").join(p.trim_start_matches('/'))
}

/// The most entries a walk of `snap` may meet: what the snapshot records,
/// plus room for the directories above its source paths. A few KB of
/// crafted trees can describe 2^40 paths by sharing subtrees; walks stop
/// at this bound and call the snapshot damaged instead of exhausting the
/// machine.
pub fn entry_budget(snap: &capsule_format::snapshot::Snapshot) -> u64 {
    let s = &snap.summary;
    s.files
        .saturating_add(s.dirs)
        .saturating_add(s.others)
        .saturating_add(s.errors)
        .saturating_add(4096)
}
