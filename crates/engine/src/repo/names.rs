//! The names a repository gives: packs' object names, and this machine's
//! host and user names as snapshots and key files record them.

use capsule_format::{BlobType, FileType, ObjectId};

/// Object name of a pack: data packs live under `data/`, tree packs under
/// `tree/`, so tree packs (small, needed by every backup) can be cached and
/// listed without reading pack headers.
pub fn pack_name(id: &ObjectId, t: BlobType) -> String {
    FileType::pack(t).name(id)
}

/// Host name for snapshot and key metadata.
pub fn hostname() -> String {
    rustix::system::uname()
        .nodename()
        .to_string_lossy()
        .into_owned()
}

/// User name for snapshot and key metadata.
pub fn username() -> String {
    std::env::var("USER")
        .or_else(|_| std::env::var("LOGNAME"))
        .unwrap_or_else(|_| format!("uid{}", rustix::process::getuid().as_raw()))
}
