//! The capsule engine: opening and creating repositories, the backup
//! pipeline, restore, check, diff and statistics. It talks to storage only
//! through the [`capsule_backend::Backend`] contract.

pub mod backup;
pub mod check;
pub mod diff;
pub mod error;
pub mod index;
mod meta;
pub mod packer;
pub mod progress;
pub mod repo;
pub mod restore;
pub mod stats;
pub mod timefmt;
pub mod treewalk;

pub use error::EngineError;
pub use repo::Repository;

/// Result alias for engine operations.
pub type Result<T, E = EngineError> = std::result::Result<T, E>;
