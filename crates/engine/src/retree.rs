//! Trees written again without some of their entries: what `repair
//! snapshots` (entries whose data is lost) and `rewrite` (entries the user
//! excludes) share. A subtree is judged once for each place it appears
//! at, however many snapshots hold it there, and a subtree nothing is
//! dropped from is kept as it is.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use capsule_format::tree::{encode_tree, Node, NodeKind};
use capsule_format::{BlobId, BlobType};

use crate::error::{EngineError, Result};
use crate::index::MasterIndex;
use crate::repo::Repository;

/// What decides which entries go.
pub(crate) trait Judge {
    /// Why tree `tree` counts as lost though it was read (its pack is
    /// gone), if it does.
    fn tree_lost(&self, tree: &BlobId) -> Option<String>;
    /// Whether a tree that cannot be read (or is lost) is dropped, with
    /// its directory: `false` makes it an error.
    fn drops_lost_trees(&self) -> bool;
    /// Why entry `n` at `p` is dropped, if it is.
    fn drop_entry(&self, p: &Path, n: &Node) -> Option<String>;
}

/// A tree after the walk.
#[derive(Clone)]
pub(crate) enum Rewritten {
    /// Nothing under it was dropped.
    Same,
    /// Written anew without what was dropped.
    New(BlobId),
    /// The tree itself cannot be read.
    Lost(String),
}

/// What a tree holds, counted as a backup counts a snapshot's summary:
/// entries at or below a source (its ancestors are not counted).
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Counts {
    pub files: u64,
    pub dirs: u64,
    pub others: u64,
    pub bytes: u64,
    /// Entries dropped in it (a dropped directory counts once).
    pub dropped: u64,
}

impl std::ops::AddAssign for Counts {
    fn add_assign(&mut self, o: Counts) {
        self.files += o.files;
        self.dirs += o.dirs;
        self.others += o.others;
        self.bytes += o.bytes;
        self.dropped += o.dropped;
    }
}

/// Judged subtrees, by tree and place, across the snapshots of one run.
pub(crate) type Memo = HashMap<(BlobId, PathBuf), (Rewritten, Counts)>;

/// One snapshot's walk: what it reads, where it writes, what it found.
pub(crate) struct Walk<'a> {
    pub repo: &'a Repository,
    pub index: &'a MasterIndex,
    pub judge: &'a dyn Judge,
    /// Where new trees go (none: a dry run, which computes their IDs).
    pub saver: Option<&'a crate::packer::BlobSaver>,
    pub sources: &'a [PathBuf],
    /// What was dropped, as `<path>: <why>`.
    pub dropped: &'a mut Vec<String>,
    pub memo: &'a mut Memo,
}

impl Walk<'_> {
    /// Tree `tree` at `path` without what is dropped, and what it then
    /// holds.
    pub fn rewrite(&mut self, tree: &BlobId, path: &Path) -> Result<(Rewritten, Counts)> {
        use std::os::unix::ffi::OsStrExt;
        let key = (*tree, path.to_path_buf());
        if let Some((r, c)) = self.memo.get(&key) {
            if !matches!(r, Rewritten::Same) {
                self.dropped
                    .push(format!("{}: (as in an earlier snapshot)", path.display()));
            }
            return Ok((r.clone(), *c));
        }
        let lost = |why: String| -> Result<(Rewritten, Counts)> {
            Ok((Rewritten::Lost(why), Counts::default()))
        };
        let nodes = match self.repo.load_tree(self.index, tree) {
            Ok(n) => match self.judge.tree_lost(tree) {
                None => n,
                Some(why) if self.judge.drops_lost_trees() => return lost(why),
                Some(why) => {
                    return Err(EngineError::corrupt(format!("tree {}", tree.short()), why))
                }
            },
            Err(EngineError::Backend(b)) if b.is_destination_failure() => {
                return Err(EngineError::Backend(b))
            }
            Err(e) if self.judge.drops_lost_trees() => return lost(e.to_string()),
            Err(e) => return Err(e),
        };
        let mut changed = false;
        let mut counts = Counts::default();
        let mut out = Vec::with_capacity(nodes.len());
        for mut n in nodes {
            let p = path.join(std::ffi::OsStr::from_bytes(&n.name));
            let inside = self.sources.iter().any(|s| p.starts_with(s));
            if let Some(why) = self.judge.drop_entry(&p, &n) {
                let slash = if n.kind() == NodeKind::Dir { "/" } else { "" };
                self.dropped.push(format!("{}{slash}: {why}", p.display()));
                changed = true;
                counts.dropped += 1;
                continue;
            }
            let mut here = Counts::default();
            match n.kind() {
                NodeKind::Dir => {
                    here.dirs = 1;
                    if let Some(sub) = n.subtree {
                        match self.rewrite(&sub, &p)? {
                            (Rewritten::Same, c) => counts += c,
                            (Rewritten::New(id), c) => {
                                n.subtree = Some(id);
                                changed = true;
                                counts += c;
                            }
                            (Rewritten::Lost(why), _) => {
                                self.dropped.push(format!("{}/: {why}", p.display()));
                                changed = true;
                                counts.dropped += 1;
                                continue;
                            }
                        }
                    }
                }
                NodeKind::File => {
                    here.files = 1;
                    here.bytes = n.size;
                }
                _ => here.others = 1,
            }
            if inside {
                counts += here;
            }
            out.push(n);
        }
        let r = if !changed {
            Rewritten::Same
        } else {
            let enc = encode_tree(&out);
            let id = self.repo.key().blob_id(&enc);
            if let Some(s) = self.saver {
                s.save(BlobType::Tree, id, &enc)?;
            }
            Rewritten::New(id)
        };
        self.memo.insert(key, (r.clone(), counts));
        Ok((r, counts))
    }
}
