//! A pack's header read from storage: the one helper a backup's journal,
//! repair and prune share, kept beside the repository it reads from so
//! that none of them depends on another for it.

use capsule_crypto::Aad;
use capsule_format::index::IndexPack;
use capsule_format::pack::{decode_header, parse_trailer, PACK_TRAILER_LEN};
use capsule_format::FileType;
use capsule_format::{BlobType, ObjectId};

use super::Repository;
use crate::error::{EngineError, Result};

/// Most header bytes read in the first request: the trailer and, for all
/// but the largest packs, the whole header with it.
const TAIL_GUESS: u64 = 64 * 1024;

impl Repository {
    /// Reads and authenticates one pack's header.
    pub(crate) fn read_pack_header(
        &self,
        name: &str,
        id: ObjectId,
        size: u64,
    ) -> Result<IndexPack> {
        if size < PACK_TRAILER_LEN as u64 {
            return Err(EngineError::corrupt(name, "shorter than a pack trailer"));
        }
        let start = size.saturating_sub(TAIL_GUESS);
        let mut tail = self.backend().get(name, Some(start..size))?;
        if tail.len() as u64 != size - start {
            return Err(EngineError::corrupt(name, "short read of the pack's end"));
        }
        let t = &tail[tail.len() - PACK_TRAILER_LEN..];
        let hlen = parse_trailer(t, size).map_err(|e| EngineError::corrupt(name, e))? as u64;
        let hstart = size - PACK_TRAILER_LEN as u64 - hlen;
        // A header longer than the first read: fetch it whole.
        let base = if hstart < start {
            tail = self.backend().get(name, Some(hstart..size))?;
            if tail.len() as u64 != size - hstart {
                return Err(EngineError::corrupt(name, "short read of the pack header"));
            }
            hstart
        } else {
            start
        };
        let env = &tail[(hstart - base) as usize..tail.len() - PACK_TRAILER_LEN];
        let plain = self
            .key()
            .open(Aad::PackHeader, env)
            .map_err(|e| EngineError::corrupt(name, format!("header: {e}")))?;
        let entries = decode_header(&plain).map_err(|e| EngineError::corrupt(name, e))?;
        let want = if FileType::of_name(name) == Some(FileType::TreePack) {
            BlobType::Tree
        } else {
            BlobType::Data
        };
        for e in &entries {
            if e.blob_type != want || u64::from(e.offset) + u64::from(e.length) > hstart {
                return Err(EngineError::corrupt(
                    name,
                    "header lists a blob outside the pack or of the wrong type",
                ));
            }
        }
        Ok(IndexPack { id, size, entries })
    }
}
