//! What can go wrong in the application layer, as types a caller can match
//! (the command line maps each to its exit code).

use capsule_backend::BackendError;
use capsule_engine::EngineError;

pub use crate::config::ConfigError;

/// A mistake in how capsule was called (exit code 2).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct UsageError(pub String);

/// Why no password could be had (exit code 10).
#[derive(Debug, thiserror::Error)]
#[error("no password: set CAPSULE_PASSWORD or CAPSULE_PASSWORD_FILE, pass --password-file, or run on a terminal to be asked")]
pub struct MissingPassword;

/// A password file that cannot be used (exit code 10, like a wrong
/// password: the fix is the same).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct PasswordFileError(pub String);

/// A password (or credentials) command of a profile that failed or printed
/// nothing (exit code 10, as a password problem).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct PasswordCommandError(pub String);

/// A lock that another process holds (exit code 22).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct Busy(pub String);

/// A policy would remove every snapshot of a group (exit code 18).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct KeepsNothing(pub String);

/// A quota that cannot hold the snapshots that must stay (exit code 19).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct QuotaTooSmall(pub String);

/// Any failure of the application layer: its own, or the engine's, the
/// destination's or the file system's as they met it.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// See [`UsageError`].
    #[error(transparent)]
    Usage(#[from] UsageError),
    /// The configuration file or a profile in it.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// See [`MissingPassword`].
    #[error(transparent)]
    MissingPassword(#[from] MissingPassword),
    /// See [`PasswordFileError`].
    #[error(transparent)]
    PasswordFile(#[from] PasswordFileError),
    /// See [`PasswordCommandError`].
    #[error(transparent)]
    PasswordCommand(#[from] PasswordCommandError),
    /// See [`Busy`].
    #[error(transparent)]
    Busy(#[from] Busy),
    /// Opening, reading or writing the repository.
    #[error(transparent)]
    Engine(#[from] EngineError),
    /// The destination.
    #[error(transparent)]
    Backend(#[from] BackendError),
    /// A local file or process: `what` says which, and what was being done.
    #[error("{what}: {source}")]
    Io {
        /// What failed, naming the file.
        what: String,
        /// The system's error.
        source: std::io::Error,
    },
    /// A failure whose message says it all (a terminal that cannot be
    /// asked, no data directory).
    #[error("{0}")]
    Other(String),
}

impl Error {
    /// The error this one wraps (itself for [`Error::Io`] and
    /// [`Error::Other`]), for a caller that maps error types to exit codes.
    pub fn inner(&self) -> &(dyn std::error::Error + 'static) {
        match self {
            Error::Usage(e) => e,
            Error::Config(e) => e,
            Error::MissingPassword(e) => e,
            Error::PasswordFile(e) => e,
            Error::PasswordCommand(e) => e,
            Error::Busy(e) => e,
            Error::Engine(e) => e,
            Error::Backend(e) => e,
            Error::Io { .. } | Error::Other(_) => self,
        }
    }

    /// An I/O failure, saying what was being done.
    pub fn io(what: impl Into<String>, source: std::io::Error) -> Error {
        Error::Io {
            what: what.into(),
            source,
        }
    }
}

/// The application layer's result.
pub type Result<T, E = Error> = std::result::Result<T, E>;
