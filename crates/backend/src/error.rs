//! How a destination fails, independent of transport: the vocabulary
//! every other part of the crate speaks, so it depends on none of them.

/// What went wrong, independent of transport.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// The object does not exist.
    NotFound,
    /// `put` found an object of that name already.
    AlreadyExists,
    /// Credentials or permissions refuse the operation.
    PermissionDenied,
    /// The destination is full.
    NoSpace,
    /// A name outside the allowed alphabet.
    InvalidName,
    /// Network or device error; may be transient.
    Io,
    /// The range asked for lies outside the object.
    InvalidRange,
    /// The destination cannot be reached or stopped answering (connection
    /// refused or reset, timeout, server gone).
    Unreachable,
    /// The destination refused the credentials (wrong password, key or
    /// secret), as opposed to a permission on one object.
    AuthFailed,
    /// The container itself is missing: the SMB share, the S3 bucket or the
    /// SFTP base directory.
    NoContainer,
}

/// A backend failure: kind, whether retrying may help, and what failed.
#[derive(Debug, thiserror::Error)]
#[error("{op} {name}: {message}")]
pub struct BackendError {
    /// Category.
    pub kind: ErrorKind,
    /// True when the same call may succeed later (timeouts, resets).
    pub transient: bool,
    /// Operation (`put`, `get`...).
    pub op: &'static str,
    /// Object name or prefix.
    pub name: String,
    /// Human-readable cause.
    pub message: String,
}

impl BackendError {
    /// Builds an error.
    pub fn new(kind: ErrorKind, op: &'static str, name: &str, message: impl Into<String>) -> Self {
        BackendError {
            kind,
            transient: false,
            op,
            name: name.to_string(),
            message: message.into(),
        }
    }

    /// True when the destination itself failed (unreachable, credentials,
    /// container gone, or a transient fault that outlived its retries), as
    /// opposed to one object being missing or damaged. Callers that can
    /// lose one object and carry on must still stop on these.
    pub fn is_destination_failure(&self) -> bool {
        self.transient
            || matches!(
                self.kind,
                ErrorKind::Unreachable | ErrorKind::AuthFailed | ErrorKind::NoContainer
            )
    }

    /// Builds an error that a retry may cure.
    pub fn transient(
        kind: ErrorKind,
        op: &'static str,
        name: &str,
        message: impl Into<String>,
    ) -> Self {
        BackendError {
            transient: true,
            ..BackendError::new(kind, op, name, message)
        }
    }
}
