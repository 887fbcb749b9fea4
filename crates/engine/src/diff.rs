//! Differences between two snapshots. Subtrees with equal IDs are identical
//! and skipped without loading, so diffing two hourly snapshots costs what
//! changed between them.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use capsule_format::tree::{Node, NodeKind};
use capsule_format::BlobId;

use crate::error::Result;
use crate::index::MasterIndex;
use crate::repo::Repository;
use crate::treewalk::{walk, Budget};

/// One difference.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct DiffEntry {
    /// `+` added, `-` removed, `M` content changed, `U` metadata only, `T` type changed.
    pub change: char,
    /// Path in the snapshot.
    pub path: String,
}

/// Lists differences from tree `a` to tree `b`.
pub fn diff(
    repo: &Repository,
    index: &MasterIndex,
    a: &BlobId,
    b: &BlobId,
    budget: &mut Budget,
) -> Result<Vec<DiffEntry>> {
    let mut out = Vec::new();
    diff_trees(repo, index, a, b, Path::new("/"), budget, &mut out)?;
    Ok(out)
}

fn push(out: &mut Vec<DiffEntry>, change: char, p: &Path) {
    out.push(DiffEntry {
        change,
        path: p.display().to_string(),
    });
}

fn all_below(
    repo: &Repository,
    index: &MasterIndex,
    n: &Node,
    p: &Path,
    c: char,
    budget: &mut Budget,
    out: &mut Vec<DiffEntry>,
) -> Result<()> {
    push(out, c, p);
    if let (NodeKind::Dir, Some(sub)) = (n.kind(), n.subtree) {
        walk(repo, index, &sub, p, budget, &mut |q, _| {
            push(out, c, q);
            Ok(())
        })?;
    }
    Ok(())
}

fn meta_differs(x: &Node, y: &Node) -> bool {
    x.mode != y.mode
        || x.uid != y.uid
        || x.gid != y.gid
        || x.mtime != y.mtime
        || x.xattrs != y.xattrs
}

fn diff_trees(
    repo: &Repository,
    index: &MasterIndex,
    a: &BlobId,
    b: &BlobId,
    base: &Path,
    budget: &mut Budget,
    out: &mut Vec<DiffEntry>,
) -> Result<()> {
    if a == b {
        return Ok(());
    }
    let (ta, tb) = (repo.load_tree(index, a)?, repo.load_tree(index, b)?);
    budget.take((ta.len() + tb.len()) as u64)?;
    let (mut i, mut j) = (0, 0);
    while i < ta.len() || j < tb.len() {
        let ord = match (ta.get(i), tb.get(j)) {
            (Some(x), Some(y)) => x.name.cmp(&y.name),
            (Some(_), None) => std::cmp::Ordering::Less,
            _ => std::cmp::Ordering::Greater,
        };
        match ord {
            std::cmp::Ordering::Less => {
                let x = &ta[i];
                all_below(
                    repo,
                    index,
                    x,
                    &base.join(OsStr::from_bytes(&x.name)),
                    '-',
                    budget,
                    out,
                )?;
                i += 1;
            }
            std::cmp::Ordering::Greater => {
                let y = &tb[j];
                all_below(
                    repo,
                    index,
                    y,
                    &base.join(OsStr::from_bytes(&y.name)),
                    '+',
                    budget,
                    out,
                )?;
                j += 1;
            }
            std::cmp::Ordering::Equal => {
                let (x, y) = (&ta[i], &tb[j]);
                let p = base.join(OsStr::from_bytes(&x.name));
                if x.kind() != y.kind() {
                    push(out, 'T', &p);
                } else if x.kind() == NodeKind::Dir {
                    if meta_differs(x, y) {
                        push(out, 'U', &p);
                    }
                    if let (Some(sa), Some(sb)) = (x.subtree, y.subtree) {
                        diff_trees(repo, index, &sa, &sb, &p, budget, out)?;
                    }
                } else if x.content != y.content || x.target != y.target || x.rdev != y.rdev {
                    push(out, 'M', &p);
                } else if meta_differs(x, y) {
                    push(out, 'U', &p);
                }
                i += 1;
                j += 1;
            }
        }
    }
    Ok(())
}
