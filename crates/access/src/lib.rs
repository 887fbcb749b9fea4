//! The one way in to a repository.
//!
//! Every caller that opens a repository (the command line, the lab, the
//! daemon, later a web page) goes through this crate, so that what a
//! command talks to is built in one place and cannot drift between them:
//!
//! - [`stack`]: the layer stack over a destination, bottom up: the
//!   destination, the reliability suite's crash hook (tests only), request
//!   accounting, retries of transient failures. [`stack::Stack::over`] is
//!   the only place it is assembled.
//! - [`open`]: a location, credentials and a cache policy ([`Access`])
//!   become an open repository ([`Opened`]): the key derivation started
//!   early from this machine's key hint (or handed over already derived),
//!   the cache on top, the damaged-pack memory read.
//! - [`backup`]: a backup with everything a backup does: thinning to the
//!   quota before and after, what to do when the destination is full, the
//!   resume journal, the damaged packs, the repository and cache kept out
//!   of the sources.
//!
//! Errors are the engine's ([`capsule_engine::EngineError`]): this crate
//! adds no failure of its own beyond what opening and backing up can meet.

pub mod backup;
pub mod open;
pub mod place;
pub mod stack;

pub use backup::{BackupRun, Notice, WhenFull};
pub use open::{Access, CachePolicy, Opened};
pub use place::state_dir;
pub use stack::{Connect, Stack};

/// The engine's result type, which this crate shares.
pub type Result<T> = std::result::Result<T, capsule_engine::EngineError>;
