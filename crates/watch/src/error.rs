//! What can go wrong running a watcher or keeping its state.

use std::path::Path;

/// What can go wrong running a watcher or keeping its state.
#[derive(Debug, thiserror::Error)]
pub enum WatchError {
    /// A system call failed.
    #[error("{doing} {path}: {source}")]
    Io {
        /// What was being done.
        doing: &'static str,
        /// On what.
        path: String,
        /// The error.
        source: std::io::Error,
    },
    /// The watcher cannot watch these sources (a limit, a permission); the
    /// profile's runs scan in full.
    #[error("{0}")]
    Degraded(String),
    /// A state file that cannot be read as one.
    #[error("{path}: {why}; it is not trusted (the next run scans in full and writes a new one)")]
    Damaged {
        /// The file.
        path: String,
        /// What is wrong with it.
        why: String,
    },
}

impl WatchError {
    pub(crate) fn io(doing: &'static str, path: &Path, source: std::io::Error) -> Self {
        WatchError::Io {
            doing,
            path: path.display().to_string(),
            source,
        }
    }
}

/// Result of this crate.
pub type Result<T> = std::result::Result<T, WatchError>;
