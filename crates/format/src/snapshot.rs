//! Snapshots, the repository config and key files. These are small, rarely
//! written objects, so they are JSON (inside an encryption envelope, except
//! key files whose secret part is itself sealed).

use serde::{Deserialize, Serialize};

/// A committed backup: written last, after every pack and index it needs.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Snapshot {
    /// Format version that wrote it.
    pub version: u32,
    /// When the backup started, RFC 3339 UTC.
    pub time: String,
    /// Unix seconds of `time`, for sorting.
    pub time_unix: i64,
    /// Nanoseconds within `time_unix`, so snapshots taken in the same
    /// second still sort in the order they were made.
    #[serde(default)]
    pub time_nanos: u32,
    /// Backup duration in seconds.
    pub duration_secs: f64,
    /// Host that made it.
    pub hostname: String,
    /// User that made it.
    pub username: String,
    /// Absolute source paths as given (lossy UTF-8 for display).
    pub paths: Vec<String>,
    /// Hex ID of the root tree blob.
    pub tree: String,
    /// Snapshot this one was compared against, if any.
    pub parent: Option<String>,
    /// User tags.
    #[serde(default)]
    pub tags: Vec<String>,
    /// True when some files could not be read and are missing.
    #[serde(default)]
    pub incomplete: bool,
    /// Counters from the run.
    pub summary: SnapshotSummary,
    /// capsule version.
    pub program: String,
    /// Set on a snapshot `repair snapshots` wrote in place of a damaged
    /// one; absent otherwise (and in snapshots written before it existed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub repaired: Option<Repaired>,
    /// Set on a snapshot `tag` or `rewrite` wrote in place of another: the
    /// ID of the first one (a snapshot changed twice still names the one
    /// the backup made). Absent otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub original: Option<String>,
}

/// What `repair snapshots` dropped from a snapshot.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, Default)]
pub struct Repaired {
    /// The damaged snapshot this one replaces (set aside in `forgotten/`).
    pub from: String,
    /// When it was repaired, RFC 3339 UTC.
    pub time: String,
    /// Entries dropped because their data or their directory's tree was
    /// lost (a dropped directory counts once, whatever it held).
    pub dropped: u64,
}

/// Counters recorded in a snapshot.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, Default)]
pub struct SnapshotSummary {
    /// Regular files in the snapshot.
    pub files: u64,
    /// Directories in the snapshot.
    pub dirs: u64,
    /// Other entries (links, devices...).
    pub others: u64,
    /// Total bytes of regular files.
    pub bytes: u64,
    /// Files whose content was read this run.
    pub files_read: u64,
    /// Bytes read from the source this run.
    pub bytes_read: u64,
    /// New blobs stored.
    pub blobs_added: u64,
    /// Bytes added to the repository (after compression and encryption).
    pub bytes_added: u64,
    /// Entries skipped because of errors.
    pub errors: u64,
}

/// Repository parameters, stored encrypted in `config`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct RepoConfig {
    /// Format version.
    pub version: u32,
    /// Random repository identity (hex); also names the local cache.
    pub id: String,
    /// Minimum chunk size in bytes.
    pub chunk_min: u32,
    /// Average chunk size in bytes.
    pub chunk_avg: u32,
    /// Maximum chunk size in bytes.
    pub chunk_max: u32,
    /// Target pack size in bytes.
    pub pack_size: u32,
    /// zstd level (0 = store).
    pub compression: i32,
}

/// A key file: the master key sealed with a key derived from a password.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct KeyFile {
    /// Format version.
    pub version: u32,
    /// Always "argon2id".
    pub kdf: String,
    /// Argon2 memory in KiB.
    pub m_cost: u32,
    /// Argon2 iterations.
    pub t_cost: u32,
    /// Argon2 lanes.
    pub p_cost: u32,
    /// Hex salt, 16 bytes.
    pub salt: String,
    /// Hex crypto envelope of the master key material.
    pub sealed: String,
    /// When created, RFC 3339.
    pub created: String,
    /// Host that created it.
    pub hostname: String,
    /// User that created it.
    pub username: String,
}

/// Decodes JSON objects with a typed error.
pub fn from_json<T: for<'de> Deserialize<'de>>(
    bytes: &[u8],
) -> Result<T, crate::codec::DecodeError> {
    serde_json::from_slice(bytes)
        .map_err(|e| crate::codec::DecodeError::Invalid(format!("json: {e}")))
}

/// Encodes to compact JSON.
pub fn to_json<T: Serialize>(v: &T) -> Vec<u8> {
    // Serializing plain structs with string keys cannot fail.
    serde_json::to_vec(v).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A snapshot as written before `repaired` existed (FORMAT.md's
    /// example) still decodes, without it; one with it round-trips, and one
    /// without writes no `repaired` key, so older readers see what they
    /// always saw.
    #[test]
    fn snapshots_without_the_repaired_field_still_open() {
        let old =
            br#"{"version":1,"time":"2026-11-21T21:19:08Z","time_unix":1795281548,"time_nanos":123,
 "duration_secs":1.2,"hostname":"laptop","username":"me","paths":["/home/me"],
 "tree":"00","parent":null,"tags":[],
 "incomplete":false,"summary":{"files":1,"dirs":1,"others":0,"bytes":1,
 "files_read":1,"bytes_read":1,"blobs_added":2,"bytes_added":100,"errors":0},
 "program":"capsule 0.1.0"}"#;
        let s: Snapshot = from_json(old).unwrap();
        assert_eq!(s.repaired, None);
        assert!(!String::from_utf8(to_json(&s)).unwrap().contains("repaired"));
        let mut r = s.clone();
        r.repaired = Some(Repaired {
            from: "ab".into(),
            time: "2026-11-26T00:00:00Z".into(),
            dropped: 3,
        });
        let back: Snapshot = from_json(&to_json(&r)).unwrap();
        assert_eq!(back.repaired, r.repaired);
        // `original` (tag, rewrite): absent in old snapshots, left out when
        // unset, kept when set.
        assert_eq!(s.original, None);
        assert!(!String::from_utf8(to_json(&s)).unwrap().contains("original"));
        let mut o = s.clone();
        o.original = Some("cd".into());
        let back: Snapshot = from_json(&to_json(&o)).unwrap();
        assert_eq!(back.original.as_deref(), Some("cd"));
    }
}
