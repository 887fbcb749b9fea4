//! The backend contract: a small set of operations on immutable, named
//! objects, which every destination (local path, SFTP, S3, SMB) implements and
//! which decorators (retry, metrics, fault injection) wrap.
//!
//! Object names are relative, `/`-separated, and made only of
//! `[0-9a-z._-]` segments, e.g. `data/3f/3f9a…`, `index/…`, `config`.
//! Objects are never modified in place: the engine writes each name once.

pub mod cache;
pub mod conformance;
pub mod contract;
pub mod error;
pub mod history;
pub mod local;
pub mod metered;
pub mod ownfile;
pub mod retry;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
pub mod versioned;

pub use cache::{CacheStats, CachingBackend};
/// Prefix of incomplete writes, which no backend lists (see the format's layout).
pub use capsule_format::layout::TEMP_PREFIX;
pub use contract::{
    check_range, get_stream_buffered, put_stream_buffered, read_exact_len, validate_name,
    write_out_error, Backend, BackendError, Capabilities, ErrorKind, LabBackend, Layer, ObjectInfo,
    ReadAt, Space,
};
pub use history::{AsOf, History, LifecycleRule, LockMode, LockState, ObjectVersion, Retention};
pub use local::{LocalBackend, SyncPolicy};
pub use metered::{MeteredBackend, RequestStats, TraceSink};
pub use retry::{RetryBackend, RetryPolicy, QUICK_FAILURES, RIDE_OUT};
