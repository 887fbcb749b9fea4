//! The words for a versioned, object-locked store: its lock settings,
//! an object's versions and retention, and the [`History`] operations a
//! destination with versioning offers ([`crate::Backend::history`]).

use std::ops::Range;

use crate::error::BackendError;

/// Who may lift a retention before its date.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LockMode {
    /// Credentials with `s3:BypassGovernanceRetention` may shorten or lift
    /// it (an admin can undo a mistake); others may not.
    Governance,
    /// Nobody may, not even the account's root, until the date passes.
    Compliance,
}

impl LockMode {
    /// The name S3 uses (`GOVERNANCE`, `COMPLIANCE`).
    pub fn s3_name(self) -> &'static str {
        match self {
            LockMode::Governance => "GOVERNANCE",
            LockMode::Compliance => "COMPLIANCE",
        }
    }

    /// Parses S3's name (any case).
    pub fn parse(s: &str) -> Option<LockMode> {
        match s.to_ascii_uppercase().as_str() {
            "GOVERNANCE" => Some(LockMode::Governance),
            "COMPLIANCE" => Some(LockMode::Compliance),
            _ => None,
        }
    }
}

/// The bucket's versioning and object-lock settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct LockState {
    /// Versioning is on: an overwrite or delete keeps the old version.
    pub versioned: bool,
    /// Object lock was enabled when the bucket was made (it cannot be
    /// turned on later on most stores).
    pub lock_enabled: bool,
    /// The retention every new object gets: mode and days.
    pub default_retention: Option<(LockMode, u32)>,
}

/// One object's retention, as the store reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Retention {
    /// Who may lift it.
    pub mode: LockMode,
    /// Until when (Unix seconds).
    pub until: i64,
}

/// One version of an object (or a delete marker) in a listing.
#[derive(Debug, Clone, PartialEq)]
pub struct ObjectVersion {
    /// Object name, relative to the repository.
    pub name: String,
    /// The store's version ID.
    pub version: String,
    /// When this version was written (Unix seconds, the store's clock;
    /// S3 lists whole seconds and better).
    pub modified: f64,
    /// Size (0 for a delete marker).
    pub size: u64,
    /// Whether it is the current version.
    pub latest: bool,
    /// A delete marker: the object was deleted at `modified`.
    pub delete_marker: bool,
}

/// One lifecycle rule of the bucket that reaches the repository's
/// objects: what it expires, and after how long.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct LifecycleRule {
    /// Its ID (`ID`), or "" when it has none.
    pub id: String,
    /// Whether it is enabled.
    pub enabled: bool,
    /// The key prefix it applies to ("" for every object).
    pub prefix: String,
    /// Current objects expire (are hidden behind a delete marker) this
    /// many days after they were written.
    pub expire_current_days: Option<u32>,
    /// Older versions are deleted for good this many days after they
    /// stopped being current.
    pub expire_noncurrent_days: Option<u32>,
}

/// The versioned store's own operations.
pub trait History: Send + Sync + std::fmt::Debug {
    /// Versioning and lock settings of the bucket.
    fn lock_state(&self) -> Result<LockState, BackendError>;
    /// The bucket's lifecycle rules that reach the repository's objects
    /// (none when it has no lifecycle configuration).
    fn lifecycle(&self) -> Result<Vec<LifecycleRule>, BackendError>;
    /// Sets the retention every new object gets.
    fn set_default_retention(&self, mode: LockMode, days: u32) -> Result<(), BackendError>;
    /// The retention of `name` (its current version, or `version`); `None`
    /// when it has none.
    fn retention(
        &self,
        name: &str,
        version: Option<&str>,
    ) -> Result<Option<Retention>, BackendError>;
    /// Sets the retention of `name`'s current version to `until` (Unix
    /// seconds). The store refuses to shorten one.
    fn set_retention(&self, name: &str, mode: LockMode, until: i64) -> Result<(), BackendError>;
    /// Every version and delete marker under `prefix`, oldest first per name.
    fn versions(&self, prefix: &str) -> Result<Vec<ObjectVersion>, BackendError>;
    /// Reads one version of `name`.
    fn get_version(
        &self,
        name: &str,
        version: &str,
        range: Option<Range<u64>>,
    ) -> Result<Vec<u8>, BackendError>;
    /// Deletes one version (or delete marker) for good. The store refuses
    /// while its retention lasts.
    fn delete_version(&self, name: &str, version: &str) -> Result<(), BackendError>;
    /// Writes `data` as the current version of `name`, over whatever is
    /// there (`repair --as-of` puts history back this way).
    fn overwrite(&self, name: &str, data: &[u8]) -> Result<(), BackendError>;
}
