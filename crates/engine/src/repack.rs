//! Repacking: the blobs still used in partly used packs written into new
//! packs, so that the old ones can be marked like unused ones (see
//! [`crate::prune`] and docs/DESIGN.md, "Repacking").

use std::collections::HashSet;
use std::sync::Arc;

use capsule_format::index::IndexPack;
use capsule_format::pack::PackEntry;
use capsule_format::ObjectId;

use crate::error::{EngineError, Result};
use crate::index::MasterIndex;
use crate::packer::BlobSaver;
use crate::repo::Repository;

/// Whether entry `e` of pack `pos` is where a used blob is counted: the
/// index's first location of a blob some snapshot uses.
pub(crate) fn needed_here(
    index: &MasterIndex,
    used: &crate::reach::UsedBlobs,
    e: &PackEntry,
    pos: u32,
) -> bool {
    used.contains(&e.id) && index.get(&e.id).is_some_and(|l| l.pack == pos)
}

/// Packs larger than this are read blob by blob rather than whole.
pub(crate) const WHOLE_PACK_READ: u64 = 64 << 20;

/// Writes the needed blobs of `repack` into new packs (indexed as they
/// fill, by the backup's own saver); returns the bytes written. Blobs
/// already stored in a kept pack are not written again, so a repack cut
/// short and run again adds no third copy.
pub(crate) fn repack_packs(
    repo: &Arc<Repository>,
    index: &MasterIndex,
    used: &crate::reach::UsedBlobs,
    gone: &HashSet<ObjectId>,
    repack: &[IndexPack],
) -> Result<u64> {
    // What the saver may count as stored: every pack but those leaving.
    let (mut base, _) = repo.load_index()?;
    // Its blobs are in the tables (in packs now forgotten): the filters
    // would pass them all, and their memory is better left to the caller.
    base.drop_filters();
    base.forget_packs(gone);
    let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
    let saver = BlobSaver::start(repo.clone(), Arc::new(base), cores);
    // Two packs read at once: the next one's round trips hide behind the
    // current one's decoding, and at most two whole packs are held.
    let result = crate::flight::for_each_in_flight(repack, 2, |p| -> Result<()> {
        let pos = index
            .packs()
            .iter()
            .position(|i| i.id == p.id)
            .map(|i| i as u32);
        let wanted: Vec<&PackEntry> = p
            .entries
            .iter()
            .filter(|e| pos.is_some_and(|pos| needed_here(index, used, e, pos)))
            .collect();
        let Some(first) = wanted.first() else {
            return Ok(());
        };
        let name = crate::repo::pack_name(&p.id, first.blob_type);
        let whole = if p.size <= WHOLE_PACK_READ {
            Some(repo.backend().get(&name, None)?)
        } else {
            None
        };
        for e in wanted {
            let range = e.offset as usize..e.offset as usize + e.length as usize;
            let env = match &whole {
                Some(b) => b
                    .get(range)
                    .ok_or_else(|| EngineError::corrupt(&name, "shorter than its index says"))?
                    .to_vec(),
                None => repo
                    .backend()
                    .get(&name, Some(range.start as u64..range.end as u64))?,
            };
            let plain = repo.decode_blob(&name, e.blob_type, &e.id, &env, e.raw_length as usize)?;
            saver.save(e.blob_type, e.id, &plain)?;
        }
        Ok(())
    });
    // Storage's own error first (see `copy`).
    let stats = saver.finish()?;
    result?;
    Ok(stats.stored_bytes_added)
}
