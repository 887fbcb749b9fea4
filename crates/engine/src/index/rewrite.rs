//! Prune's rewrite of the index: the files that list a leaving pack, and
//! the small ones, written again without it.

use std::collections::HashSet;

use capsule_format::index::{IndexFile, IndexPack};
use capsule_format::ObjectId;

use super::SealedStore;
use super::{load_index_file, save_index_file};
use crate::error::Result;

/// Entries in an index file a rewrite writes, at most; an index file at least
/// half that full that lists no pack leaving is left as it is.
const REWRITE_ENTRIES: usize = 256 * 1024;

/// IDs a rewritten file names as superseded, at most: the files it took in
/// first, then what those superseded (a prune's file lists its own first,
/// so the oldest are the ones left out). 4,096 IDs (128 KiB)
/// hold a household's years of weekly prunes; a file beyond them that is
/// still listed was deleted long since (see `rewrite_without`).
const MAX_SUPERSEDES: usize = 4096;

/// Writes the index without the packs in `gone` (prune's rewrite): the index files that list
/// one of them, and the small ones (merged, so that hourly backups'
/// files do not pile up), are read one at a time and written again into
/// files of at most `REWRITE_ENTRIES` (262,144) entries, each superseding the files
/// it took in; the rest stay. `extra` (the file that put marked packs
/// back) is taken in whatever its size. Returns the superseded files, for
/// deletion once the new ones are stored. A crash between two writes
/// leaves each old file either in force or superseded by a complete new
/// one.
///
/// A new file also supersedes what the files it took in superseded. A
/// prune cut after storing its files and before deleting the old ones
/// leaves the old ones listed, superseded by a file the next rewrite
/// replaces and deletes: without this, the old ones would come back into
/// force then, naming packs deleted since (a check finds them missing), or,
/// deleted but still listed by a store node that was away, be taken for
/// index files lost.
pub fn rewrite_without(
    repo: &dyn SealedStore,
    files: &[ObjectId],
    extra: Option<ObjectId>,
    gone: &HashSet<ObjectId>,
) -> Result<Vec<ObjectId>> {
    let mut superseded = Vec::new();
    let mut taken: Vec<ObjectId> = Vec::new();
    // What the taken files superseded, in the order met.
    let mut inherited: Vec<ObjectId> = Vec::new();
    let mut packs: Vec<IndexPack> = Vec::new();
    let mut entries = 0usize;
    let mut seen: HashSet<ObjectId> = HashSet::new();
    let flush = |taken: &mut Vec<ObjectId>,
                 inherited: &mut Vec<ObjectId>,
                 packs: &mut Vec<IndexPack>,
                 superseded: &mut Vec<ObjectId>|
     -> Result<()> {
        if taken.is_empty() {
            return Ok(());
        }
        let mut names: Vec<ObjectId> = taken.clone();
        let mut named: HashSet<ObjectId> = names.iter().copied().collect();
        for id in inherited.drain(..) {
            if names.len() >= MAX_SUPERSEDES.max(taken.len()) {
                break;
            }
            if named.insert(id) {
                names.push(id);
            }
        }
        save_index_file(
            repo,
            &IndexFile {
                supersedes: names,
                packs: std::mem::take(packs),
            },
        )?;
        superseded.append(taken);
        Ok(())
    };
    for (id, forced) in files
        .iter()
        .map(|id| (*id, false))
        .chain(extra.map(|id| (id, true)))
    {
        let f = load_index_file(repo, &id)?;
        let n: usize = f.packs.iter().map(|p| p.entries.len()).sum();
        let touched = f.packs.iter().any(|p| gone.contains(&p.id));
        if !forced && !touched && n >= REWRITE_ENTRIES / 2 {
            continue;
        }
        taken.push(id);
        inherited.extend(f.supersedes);
        for p in f.packs {
            if gone.contains(&p.id) || !seen.insert(p.id) {
                continue;
            }
            entries += p.entries.len();
            packs.push(p);
        }
        if entries >= REWRITE_ENTRIES {
            flush(&mut taken, &mut inherited, &mut packs, &mut superseded)?;
            entries = 0;
        }
    }
    flush(&mut taken, &mut inherited, &mut packs, &mut superseded)?;
    Ok(superseded)
}
