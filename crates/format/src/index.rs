//! Index files: which blobs live in which pack, at which offset. One index
//! file covers one or more packs; together the index files of a repository
//! cover every pack a snapshot may reference.

use crate::codec::{DecodeError, Reader, Writer};
use crate::id::{Id, ObjectId};
use crate::pack::{decode_entry, encode_entry, PackEntry};

const INDEX_VERSION: u8 = 1;

/// The blobs of one pack.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IndexPack {
    /// Pack object ID (BLAKE3 of its bytes).
    pub id: ObjectId,
    /// Total size of the pack file in bytes.
    pub size: u64,
    /// Its blobs, in pack order.
    pub entries: Vec<PackEntry>,
}

/// Plaintext content of one index file.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct IndexFile {
    /// Index files this one replaces (written by future compaction/prune;
    /// readers ignore superseded files once this one is present).
    pub supersedes: Vec<ObjectId>,
    /// Packs described.
    pub packs: Vec<IndexPack>,
}

/// Encodes an index file's plaintext.
pub fn encode_index(idx: &IndexFile) -> Vec<u8> {
    encode_index_parts(&idx.supersedes, &idx.packs)
}

/// Encodes an index file from its parts, for a caller that holds the packs
/// elsewhere and should not copy them to build an [`IndexFile`].
pub fn encode_index_parts(supersedes: &[ObjectId], packs: &[IndexPack]) -> Vec<u8> {
    let n: usize = packs.iter().map(|p| p.entries.len()).sum();
    let mut w = Writer::with_capacity(16 + packs.len() * 48 + n * 48);
    w.u8(INDEX_VERSION);
    w.varint(supersedes.len() as u64);
    for s in supersedes {
        w.raw(s.as_bytes());
    }
    w.varint(packs.len() as u64);
    for p in packs {
        w.raw(p.id.as_bytes());
        w.varint(p.size);
        w.varint(p.entries.len() as u64);
        for e in &p.entries {
            encode_entry(&mut w, e);
        }
    }
    w.buf
}

/// Decodes an index file's plaintext.
pub fn decode_index(bytes: &[u8]) -> Result<IndexFile, DecodeError> {
    let mut r = Reader::new(bytes);
    if r.u8("index version")? != INDEX_VERSION {
        return Err(DecodeError::BadHeader("unknown index version"));
    }
    let ns = r.count("superseded count", 32)?;
    let mut supersedes = Vec::with_capacity(ns);
    for _ in 0..ns {
        supersedes.push(ObjectId(Id(r.id("superseded id")?)));
    }
    let np = r.count("pack count", 34)?;
    let mut packs = Vec::with_capacity(np);
    for _ in 0..np {
        let id = ObjectId(Id(r.id("pack id")?));
        let size = r.varint("pack size")?;
        let ne = r.count("entry count", 36)?;
        let mut entries = Vec::with_capacity(ne);
        for _ in 0..ne {
            entries.push(decode_entry(&mut r)?);
        }
        packs.push(IndexPack { id, size, entries });
    }
    r.finish()?;
    Ok(IndexFile { supersedes, packs })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::blob::BlobType;
    use crate::id::BlobId;

    #[test]
    fn roundtrip() {
        let idx = IndexFile {
            supersedes: vec![ObjectId(Id([3; 32]))],
            packs: vec![IndexPack {
                id: ObjectId(Id([4; 32])),
                size: 12345,
                entries: vec![PackEntry {
                    blob_type: BlobType::Data,
                    id: BlobId(Id([5; 32])),
                    offset: 0,
                    length: 10,
                    raw_length: 9,
                }],
            }],
        };
        assert_eq!(decode_index(&encode_index(&idx)).unwrap(), idx);
        let enc = encode_index(&idx);
        for cut in 0..enc.len() {
            assert!(decode_index(&enc[..cut]).is_err());
        }
    }
}
