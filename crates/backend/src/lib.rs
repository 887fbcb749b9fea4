//! The backend contract: a small set of operations on immutable, named
//! objects, which every destination (local path, SFTP, S3, SMB) implements and
//! which decorators (retry, metrics, fault injection) wrap.
//!
//! Object names are relative, `/`-separated, and made only of
//! `[0-9a-z._-]` segments, e.g. `data/3f/3f9a…`, `index/…`, `config`.
//! Objects are never modified in place: the engine writes each name once.

use std::ops::Range;
use std::sync::Arc;

pub mod cache;
pub mod conformance;
pub mod local;

pub use cache::{CacheStats, CachingBackend};
pub use local::{LocalBackend, SyncPolicy};

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
}

/// Size (and, where cheap, other facts) of a stored object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectInfo {
    /// Full object name.
    pub name: String,
    /// Size in bytes.
    pub size: u64,
}

/// What a backend can do and how it prefers to be used.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Capabilities {
    /// Concurrent requests that pay off (the engine's upload/download width).
    pub concurrency: usize,
    /// Whether `put` makes data durable before returning.
    pub durable_put: bool,
    /// Whether the backend is on this machine (no round trips).
    pub local: bool,
}

/// The contract every destination implements. All methods are safe to call
/// from many threads at once.
pub trait Backend: Send + Sync + std::fmt::Debug {
    /// Stores `data` under `name`.
    ///
    /// * Never overwrites: if `name` exists, fails with `AlreadyExists` and the
    ///   stored object is unchanged.
    /// * Atomic: readers see either no object or the whole object, never a
    ///   prefix, even if the process or connection dies mid-way.
    /// * Durable on return when `capabilities().durable_put` is true.
    /// * Not idempotent by itself; callers writing content-addressed names
    ///   may treat `AlreadyExists` as success.
    fn put(&self, name: &str, data: &[u8]) -> Result<(), BackendError>;

    /// Reads the whole object, or `range` of it. A range that extends past
    /// the end is `InvalidRange`; a missing object is `NotFound`.
    fn get(&self, name: &str, range: Option<Range<u64>>) -> Result<Vec<u8>, BackendError>;

    /// Size of an object; `NotFound` if missing.
    fn stat(&self, name: &str) -> Result<ObjectInfo, BackendError>;

    /// Every object whose name starts with `prefix` (a directory-like prefix
    /// ending in `/`, or empty), in no particular order. Incomplete uploads
    /// are never listed.
    fn list(&self, prefix: &str) -> Result<Vec<ObjectInfo>, BackendError>;

    /// Removes an object. Idempotent: deleting a missing object succeeds.
    fn delete(&self, name: &str) -> Result<(), BackendError>;

    /// Static facts about this backend.
    fn capabilities(&self) -> Capabilities;

    /// Where this backend points, for messages (`/srv/backup`, `s3://…`).
    fn location(&self) -> String;
}

impl<B: Backend + ?Sized> Backend for Arc<B> {
    fn put(&self, name: &str, data: &[u8]) -> Result<(), BackendError> {
        (**self).put(name, data)
    }
    fn get(&self, name: &str, range: Option<Range<u64>>) -> Result<Vec<u8>, BackendError> {
        (**self).get(name, range)
    }
    fn stat(&self, name: &str) -> Result<ObjectInfo, BackendError> {
        (**self).stat(name)
    }
    fn list(&self, prefix: &str) -> Result<Vec<ObjectInfo>, BackendError> {
        (**self).list(prefix)
    }
    fn delete(&self, name: &str) -> Result<(), BackendError> {
        (**self).delete(name)
    }
    fn capabilities(&self) -> Capabilities {
        (**self).capabilities()
    }
    fn location(&self) -> String {
        (**self).location()
    }
}

/// Checks that `range` lies within an object of `size` bytes; the error every
/// backend returns for a range past the end.
pub fn check_range(name: &str, range: &Range<u64>, size: u64) -> Result<(), BackendError> {
    if range.start > range.end || range.end > size {
        return Err(BackendError::new(
            ErrorKind::InvalidRange,
            "get",
            name,
            format!(
                "range {}..{} outside object of {size} bytes",
                range.start, range.end
            ),
        ));
    }
    Ok(())
}

/// Checks a name against the allowed alphabet and shape.
pub fn validate_name(name: &str) -> Result<(), BackendError> {
    let ok = !name.is_empty()
        && name.len() <= 512
        && name.split('/').all(|seg| {
            !seg.is_empty()
                && seg != "."
                && seg != ".."
                && seg
                    .bytes()
                    .all(|b| b.is_ascii_digit() || b.is_ascii_lowercase() || b"._-".contains(&b))
        });
    if ok {
        Ok(())
    } else {
        Err(BackendError::new(
            ErrorKind::InvalidName,
            "name",
            name,
            "object names are lower-case [0-9a-z._-] segments separated by '/'",
        ))
    }
}
