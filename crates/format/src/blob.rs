//! The kinds of blobs a pack holds.

use crate::codec::DecodeError;

/// The two kinds of blobs a pack can hold. Trees are packed separately from
/// file data so that metadata packs stay small and can be cached whole.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum BlobType {
    /// A chunk of file content.
    Data,
    /// An encoded directory tree.
    Tree,
}

impl BlobType {
    /// The byte used for this type in pack headers, index files and AAD.
    pub fn to_byte(self) -> u8 {
        match self {
            BlobType::Data => 0,
            BlobType::Tree => 1,
        }
    }

    /// Inverse of [`BlobType::to_byte`].
    pub fn from_byte(b: u8) -> Result<Self, DecodeError> {
        match b {
            0 => Ok(BlobType::Data),
            1 => Ok(BlobType::Tree),
            other => Err(DecodeError::BadValue {
                what: "blob type",
                value: other as u64,
            }),
        }
    }
}
