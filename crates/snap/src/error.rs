//! What can go wrong taking, reading or removing a source snapshot.

/// What can go wrong taking, reading or removing a source snapshot.
#[derive(Debug, thiserror::Error)]
pub enum SnapError {
    /// The file system cannot be snapshotted this way (its type, a source
    /// spanning two file systems, a kind that is not there): with `auto`
    /// the run reads live files.
    #[error("{0}")]
    Unsupported(String),
    /// A tool the snapshot needs is not installed.
    #[error("{tool} is not installed ({package} provides it): install it, or set source-snapshot = \"off\"")]
    NoTool {
        /// The command.
        tool: &'static str,
        /// The package that provides it.
        package: &'static str,
    },
    /// A tool ran and failed: its own words, and what capsule was doing.
    #[error("{doing}: {tool} failed: {message}{hint}")]
    Failed {
        /// What capsule was doing.
        doing: String,
        /// The command.
        tool: &'static str,
        /// What it printed.
        message: String,
        /// What to do, when the message says (no space, no privilege).
        hint: &'static str,
    },
    /// A directory on the way to where a snapshot is taken, read or
    /// removed is one another user can change: nothing is done there.
    #[error("not taking or removing a source snapshot at {path}: it {why}; make it root's and not writable by others (chown root, chmod go-w), or set source-snapshot = \"off\"")]
    Untrusted {
        /// The directory (or link) in question.
        path: String,
        /// Why it cannot be trusted.
        why: String,
    },
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
    /// The snapshot was removed (by someone else) while the run read it.
    #[error("{view}, a snapshot of {origin}, was removed while the backup read it; nothing read from it is stored as complete. Run the backup again")]
    Vanished {
        /// Where the snapshot was read.
        view: String,
        /// What it was a snapshot of.
        origin: String,
    },
}

impl SnapError {
    pub(crate) fn io(doing: &'static str, path: &std::path::Path, source: std::io::Error) -> Self {
        SnapError::Io {
            doing,
            path: path.display().to_string(),
            source,
        }
    }
}
