//! The capsule engine: opening and creating repositories, the backup
//! pipeline, restore, check, diff and statistics. It talks to storage only
//! through the [`capsule_backend::Backend`] contract.

pub mod backup;
pub mod browse;
pub mod check;
pub mod copy;
pub mod diff;
pub mod dump;
pub mod error;
pub mod find;
mod flight;
pub mod forget;
pub mod index;
pub mod journal;
pub mod locked;
mod mem;
mod meta;
pub mod packer;
mod pause;
mod platform;
pub mod progress;
pub mod prune;
pub mod quota;
mod reach;
pub mod rendezvous;
mod repack;
pub mod repair;
pub mod repo;
pub mod restore;
pub mod retention;
mod retree;
pub mod rewrite;
pub mod session;
mod sorted;
pub mod stats;
pub mod timefmt;
pub mod treewalk;
pub mod verified;
pub mod versions;

pub use error::{EngineError, Result};
pub use repo::{EarlyKey, KeyHint, KeySource, Repository};
