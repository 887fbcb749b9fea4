//! Pack files: many encrypted blobs followed by an encrypted header that lists
//! them, so that the index can be rebuilt from packs alone.
//!
//! ```text
//! blob_0 | blob_1 | ... | blob_n-1 | header envelope | header_len: u32 LE | "CAPSPK01"
//! ```
//! Each blob and the header are crypto envelopes (see `capsule-crypto`).
//! `header_len` counts the header envelope only.

use crate::blob::BlobType;
use crate::codec::{DecodeError, Reader, Writer};
use crate::id::{BlobId, Id};

/// Magic that ends every pack.
pub const PACK_MAGIC: &[u8; 8] = b"CAPSPK01";
/// Bytes after the header envelope: length plus magic.
pub const PACK_TRAILER_LEN: usize = 12;
const HEADER_VERSION: u8 = 1;

/// Where one blob sits inside its pack.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PackEntry {
    /// Data or tree.
    pub blob_type: BlobType,
    /// Keyed hash of the plaintext.
    pub id: BlobId,
    /// Byte offset of the blob's envelope in the pack.
    pub offset: u32,
    /// Length of the envelope.
    pub length: u32,
    /// Length of the plaintext after decompression.
    pub raw_length: u32,
}

/// Encodes the plaintext of a pack header.
pub fn encode_header(entries: &[PackEntry]) -> Vec<u8> {
    let mut w = Writer::with_capacity(8 + entries.len() * 48);
    w.u8(HEADER_VERSION);
    w.varint(entries.len() as u64);
    for e in entries {
        encode_entry(&mut w, e);
    }
    w.buf
}

pub(crate) fn encode_entry(w: &mut Writer, e: &PackEntry) {
    w.u8(e.blob_type.to_byte());
    w.raw(e.id.as_bytes());
    w.varint(e.offset as u64);
    w.varint(e.length as u64);
    w.varint(e.raw_length as u64);
}

pub(crate) fn decode_entry(r: &mut Reader<'_>) -> Result<PackEntry, DecodeError> {
    Ok(PackEntry {
        blob_type: BlobType::from_byte(r.u8("blob type")?)?,
        id: BlobId(Id(r.id("blob id")?)),
        offset: r.varint_u32("blob offset")?,
        length: r.varint_u32("blob length")?,
        raw_length: r.varint_u32("blob raw length")?,
    })
}

/// Decodes a pack header plaintext.
pub fn decode_header(bytes: &[u8]) -> Result<Vec<PackEntry>, DecodeError> {
    let mut r = Reader::new(bytes);
    if r.u8("pack header version")? != HEADER_VERSION {
        return Err(DecodeError::BadHeader("unknown pack header version"));
    }
    let n = r.count("pack entry count", 36)?;
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        out.push(decode_entry(&mut r)?);
    }
    r.finish()?;
    Ok(out)
}

/// The trailer appended after the header envelope.
pub fn trailer(header_envelope_len: u32) -> [u8; PACK_TRAILER_LEN] {
    let mut t = [0u8; PACK_TRAILER_LEN];
    t[..4].copy_from_slice(&header_envelope_len.to_le_bytes());
    t[4..].copy_from_slice(PACK_MAGIC);
    t
}

/// Parses the trailer (the last 12 bytes of a pack) and returns the header
/// envelope's length, checked against the pack size.
pub fn parse_trailer(t: &[u8], pack_size: u64) -> Result<u32, DecodeError> {
    if t.len() != PACK_TRAILER_LEN {
        return Err(DecodeError::Truncated {
            what: "pack trailer",
            needed: PACK_TRAILER_LEN.saturating_sub(t.len()),
        });
    }
    if &t[4..] != PACK_MAGIC {
        return Err(DecodeError::BadHeader(
            "pack magic missing: truncated or not a pack",
        ));
    }
    let len = u32::from_le_bytes([t[0], t[1], t[2], t[3]]);
    if len as u64 + PACK_TRAILER_LEN as u64 > pack_size {
        return Err(DecodeError::BadValue {
            what: "pack header length",
            value: len as u64,
        });
    }
    Ok(len)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_roundtrip() {
        let e = vec![
            PackEntry {
                blob_type: BlobType::Data,
                id: BlobId(Id([1; 32])),
                offset: 0,
                length: 100,
                raw_length: 200,
            },
            PackEntry {
                blob_type: BlobType::Tree,
                id: BlobId(Id([2; 32])),
                offset: 100,
                length: 50,
                raw_length: 40,
            },
        ];
        assert_eq!(decode_header(&encode_header(&e)).unwrap(), e);
        let t = trailer(77);
        assert_eq!(parse_trailer(&t, 1000).unwrap(), 77);
        assert!(parse_trailer(&t, 80).is_err());
        assert!(parse_trailer(&t[1..], 1000).is_err());
    }
}
