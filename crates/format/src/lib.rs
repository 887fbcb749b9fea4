//! The capsule repository format: typed object IDs and the byte encodings of
//! everything stored in a repository (trees, pack headers, index files,
//! snapshots, config, key files). Pure: no I/O, no cryptography.
//!
//! The normative description lives in `docs/FORMAT.md`; the tests in this
//! crate check the test vectors printed there.

pub mod blob;
pub mod codec;
pub mod compress;
pub mod id;
pub mod index;
pub mod layout;
pub mod pack;
pub mod snapshot;
pub mod tree;

pub use blob::BlobType;
pub use codec::DecodeError;
pub use id::{BlobId, Id, ObjectHasher, ObjectId};
pub use layout::FileType;

/// Version of the repository format this code writes. Readers accept every
/// version listed in `docs/FORMAT.md`'s version log up to this one.
pub const FORMAT_VERSION: u32 = 1;
