//! `capsule rewrite`: snapshots written again without the paths the user
//! excludes (a secret, a huge file backed up by mistake). The new trees
//! are stored and indexed first, then each new snapshot (same time, host,
//! paths and tags, naming its original), and only then are the originals
//! set aside in `forgotten/`: a run cut short at any point leaves every
//! snapshot readable, and the next prune gives the space back.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use capsule_format::snapshot::Snapshot;
use capsule_format::tree::{Node, NodeKind};
use capsule_format::{BlobId, ObjectId};
use serde::Serialize;

use crate::backup::Excludes;
use crate::error::{EngineError, Result};
use crate::repo::Repository;
use crate::retree::{Memo, Rewritten, Walk};

/// One snapshot rewritten (or that would be).
#[derive(Debug, Clone, Serialize)]
pub struct Rewrote {
    /// The snapshot.
    pub snapshot: String,
    /// The one written in its place (none in a dry run).
    pub replaced_by: Option<String>,
    /// What was taken out, as `<path>: <why>`.
    pub removed: Vec<String>,
    /// Entries taken out (a directory counts once).
    pub removed_entries: u64,
}

/// What `rewrite` did.
#[derive(Debug, Clone, Default, Serialize)]
pub struct RewriteReport {
    /// Snapshots looked at.
    pub snapshots: u64,
    /// Those that held something excluded.
    pub rewritten: Vec<Rewrote>,
    /// Whether the originals were kept.
    pub kept_originals: bool,
    /// Nothing was written.
    pub dry_run: bool,
}

/// The exclude patterns as a judge.
struct Excluded<'a>(&'a Excludes);

impl crate::retree::Judge for Excluded<'_> {
    fn tree_lost(&self, _: &BlobId) -> Option<String> {
        None
    }

    fn drops_lost_trees(&self) -> bool {
        false
    }

    fn drop_entry(&self, p: &Path, n: &Node) -> Option<String> {
        let dir = n.kind() == NodeKind::Dir;
        (self.0.is_excluded(p, dir) || (n.kind() == NodeKind::File && self.0.too_large(n.size)))
            .then(|| "excluded".to_string())
    }
}

/// Rewrites `snaps` without what `excludes` matches. With `dry_run`,
/// reports what would go and writes nothing; with `keep_original`, the
/// originals stay beside the new snapshots.
pub fn rewrite(
    repo: &Arc<Repository>,
    snaps: &[(ObjectId, Snapshot)],
    excludes: &Excludes,
    dry_run: bool,
    keep_original: bool,
) -> Result<RewriteReport> {
    if !dry_run && !keep_original {
        crate::session::require_delete(repo, "rewrite")?;
    }
    // Held while new trees are stored but no snapshot names them yet: a
    // prune meanwhile must not take them for garbage.
    let session = if dry_run {
        None
    } else {
        Some(crate::session::Session::start_kind(repo, "rewrite")?)
    };
    let (mut index, _) = repo.load_index()?;
    crate::prune::add_marked_packs(repo, &mut index)?;
    let index = Arc::new(index);
    let saver = (!dry_run).then(|| crate::packer::BlobSaver::start(repo.clone(), index.clone(), 2));
    let judge = Excluded(excludes);
    let mut memo = Memo::default();
    let mut report = RewriteReport {
        snapshots: snaps.len() as u64,
        kept_originals: keep_original,
        dry_run,
        ..Default::default()
    };
    let mut changed: Vec<(ObjectId, Snapshot)> = Vec::new();
    let walked = (|| -> Result<()> {
        for (id, snap) in snaps {
            let root: BlobId = snap.tree.parse().map_err(|_| {
                EngineError::corrupt(capsule_format::FileType::Snapshot.name(id), "bad tree id")
            })?;
            let sources: Vec<PathBuf> = snap.paths.iter().map(Into::into).collect();
            let mut removed = Vec::new();
            let mut walk = Walk {
                repo,
                index: &index,
                judge: &judge,
                saver: saver.as_ref(),
                sources: &sources,
                dropped: &mut removed,
                memo: &mut memo,
            };
            let (new_root, c) = match walk.rewrite(&root, Path::new("/"))? {
                (Rewritten::Same, _) => continue,
                (Rewritten::New(r), c) => (r, c),
                (Rewritten::Lost(why), _) => {
                    return Err(EngineError::corrupt(format!("tree {}", root.short()), why))
                }
            };
            let mut s = snap.clone();
            s.tree = new_root.to_hex();
            s.summary.files = c.files;
            s.summary.dirs = c.dirs;
            s.summary.others = c.others;
            s.summary.bytes = c.bytes;
            report.rewritten.push(Rewrote {
                snapshot: id.to_hex(),
                replaced_by: None,
                removed,
                removed_entries: c.dropped,
            });
            changed.push((*id, s));
        }
        Ok(())
    })();
    if let Some(saver) = saver {
        // New trees are stored and indexed before any snapshot names them.
        let stored = saver.finish();
        walked?;
        stored?;
    } else {
        walked?;
    }
    if dry_run {
        return Ok(report);
    }
    crate::pause::test_pause("rewrite-trees-stored");
    // A run cut short after writing new snapshots and before setting the
    // originals aside left both: the new one is taken as it is, not
    // written a second time.
    let (live, _) = repo.list_snapshots()?;
    let mut new_ids = Vec::with_capacity(changed.len());
    let mut originals = Vec::with_capacity(changed.len());
    for (old, mut s) in changed {
        let first = s.original.clone().unwrap_or_else(|| old.to_hex());
        s.original = Some(first.clone());
        let done = live
            .iter()
            .find(|(id, l)| *id != old && l.original.as_deref() == Some(&first) && l.tree == s.tree)
            .map(|(id, _)| *id);
        new_ids.push(match done {
            Some(id) => id,
            None => repo.save_snapshot(&s)?,
        });
        originals.push(old);
    }
    crate::pause::test_pause("rewrite-snapshots-written");
    if !keep_original {
        crate::forget::forget_all(repo, &originals)?;
    }
    for (r, id) in report.rewritten.iter_mut().zip(new_ids) {
        r.replaced_by = Some(id.to_hex());
    }
    if let Some(s) = session {
        s.end();
    }
    Ok(report)
}
