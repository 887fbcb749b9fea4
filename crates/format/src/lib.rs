//! The capsule repository format: typed object IDs and the byte encodings of
//! everything stored in a repository (trees, pack headers, index files,
//! snapshots, config, key files). Pure: no I/O, no cryptography.
//!
//! The normative description lives in `docs/FORMAT.md`; the tests in this
//! crate check the test vectors printed there.

pub mod codec;
pub mod compress;
pub mod id;
pub mod index;
pub mod layout;
pub mod pack;
pub mod snapshot;
pub mod tree;

pub use codec::DecodeError;
pub use id::{BlobId, Id, ObjectHasher, ObjectId};
pub use layout::FileType;

/// Version of the repository format this code writes. Readers accept every
/// version listed in `docs/FORMAT.md`'s version log up to this one.
pub const FORMAT_VERSION: u32 = 1;

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
