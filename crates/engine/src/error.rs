//! Engine errors. Each variant names what failed and where; the CLI maps
//! them to exit codes and adds what the user can do.

use capsule_backend::BackendError;
use std::path::PathBuf;

/// Everything that can go wrong in the engine.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// No key file opened with the password given.
    #[error(
        "wrong password: no key in {location} opens with it{}",
        damaged_note(damaged_keys)
    )]
    WrongPassword {
        /// Repository location.
        location: String,
        /// Key files that could not be tried (damaged or stray), with why.
        damaged_keys: Vec<String>,
    },
    /// Every key file is damaged (or there is none): the password cannot be
    /// tried at all.
    #[error(
        "no intact key file in {location}: the password cannot be tried{}",
        damaged_note(damaged_keys)
    )]
    NoUsableKey {
        /// Repository location.
        location: String,
        /// Key files found damaged, with why.
        damaged_keys: Vec<String>,
    },
    /// The `config` object is damaged: nothing can be read until it is
    /// restored from a copy.
    #[error("the repository config at {location} is damaged: {detail}")]
    DamagedConfig {
        /// Repository location.
        location: String,
        /// What was wrong.
        detail: String,
    },
    /// The repository as it is now cannot be opened, but the versioned
    /// store keeps older versions of it: read it as it was (`--as-of`),
    /// write it back (`repair history`); never `init` over it.
    #[error("{was}; the bucket is versioned and keeps {versions} version(s) of those objects: the repository's objects were deleted or overwritten since")]
    HistoryLeft {
        /// Repository location.
        location: String,
        /// Why it does not open as it is now.
        was: String,
        /// Versions the store keeps of the objects at fault.
        versions: usize,
    },
    /// The location holds repository objects but no `config`.
    #[error(
        "{location} holds capsule data (keys, snapshots or packs) but its config object is missing"
    )]
    MissingConfig {
        /// Repository location.
        location: String,
    },
    /// A source snapshot could not be taken (with a kind named), or went
    /// while the backup read it.
    #[error("source snapshot: {0}")]
    Snapshot(#[from] capsule_snap::SnapError),
    /// The location has no `config` object.
    #[error("no capsule repository at {location}")]
    NotARepository {
        /// Repository location.
        location: String,
    },
    /// `init` on an existing repository.
    #[error("a repository already exists at {location}")]
    AlreadyInitialized {
        /// Repository location.
        location: String,
    },
    /// The repository was written by a newer capsule.
    #[error("repository format version {found} is newer than this capsule supports ({supported}); upgrade capsule")]
    UnsupportedVersion {
        /// Version found.
        found: u32,
        /// Highest version understood.
        supported: u32,
    },
    /// A storage operation failed.
    #[error("repository storage: {0}")]
    Backend(#[from] BackendError),
    /// A stored object failed to authenticate or decode.
    #[error("damaged object {object}: {detail}")]
    Corrupt {
        /// Object name (or blob ID).
        object: String,
        /// What was wrong.
        detail: String,
    },
    /// A blob is referenced but no index lists it.
    #[error("blob {0} is not in any index (repository incomplete; run `capsule check`)")]
    MissingBlob(String),
    /// Snapshot selector matched nothing.
    #[error("no snapshot matches {0:?}")]
    SnapshotNotFound(String),
    /// No snapshot is as old as the time asked for.
    #[error("no snapshot at or before {when}{}", .oldest.as_ref().map(|o| format!(" (the oldest is of {o})")).unwrap_or_default())]
    NoSnapshotBefore {
        /// The time as given.
        when: String,
        /// The oldest snapshot's time, if any.
        oldest: Option<String>,
    },
    /// Snapshot prefix matched several.
    #[error("snapshot prefix {0:?} is ambiguous")]
    AmbiguousSnapshot(String),
    /// A path inside a snapshot does not exist.
    #[error("no such path in snapshot: {0}")]
    PathNotFound(String),
    /// A local file-system operation failed.
    #[error("{op} {path}: {source}")]
    Io {
        /// What was being done.
        op: &'static str,
        /// Where.
        path: PathBuf,
        /// Cause.
        source: std::io::Error,
    },
    /// Invalid arguments or options.
    #[error("{0}")]
    Invalid(String),
    /// Cryptographic failure other than a wrong password.
    #[error("crypto: {0}")]
    Crypto(#[from] capsule_crypto::CryptoError),
    /// The operation was interrupted.
    #[error("interrupted")]
    Interrupted,
    /// A backup's session lapsed (the process was suspended past its lease)
    /// and a prune deleted data it relied on; nothing was committed.
    #[error("{0}")]
    LeaseLost(String),
    /// A stream being backed up (standard input, a command's output) did
    /// not end well; nothing was committed.
    #[error("{0}; no snapshot was made")]
    StreamFailed(String),
    /// Prune cannot run safely on this repository as it is.
    #[error("cannot prune: {0}")]
    PruneRefused(String),
    /// The credentials may write but not delete (an append-only client),
    /// and the command must delete.
    #[error("{0} needs credentials that may delete objects in the repository; these may only add (append-only), so nothing was changed")]
    AppendOnly(&'static str),
}

fn damaged_note(keys: &[String]) -> String {
    if keys.is_empty() {
        String::new()
    } else {
        format!(
            " ({} key file(s) could not be tried: {})",
            keys.len(),
            keys.join("; ")
        )
    }
}

impl EngineError {
    /// Wraps an I/O error with the operation and path.
    pub fn io(op: &'static str, path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        EngineError::Io {
            op,
            path: path.into(),
            source,
        }
    }

    /// A `Corrupt` error.
    pub fn corrupt(object: impl Into<String>, detail: impl std::fmt::Display) -> Self {
        EngineError::Corrupt {
            object: object.into(),
            detail: detail.to_string(),
        }
    }
}

/// Result alias for engine operations.
pub type Result<T, E = EngineError> = std::result::Result<T, E>;
