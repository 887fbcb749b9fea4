//! Exit codes (the user guide's reference/exit-codes.md is generated from
//! these doc comments by scripts/book.sh).

/// Success.
pub const OK: u8 = 0;
/// A fatal error (I/O, storage, bug).
pub const ERROR: u8 = 1;
/// Bad usage (clap also uses 2).
pub const USAGE: u8 = 2;
/// Finished, but some entries were skipped: the snapshot (or restore) is incomplete.
pub const INCOMPLETE: u8 = 3;
/// Wrong or missing password.
pub const PASSWORD: u8 = 10;
/// No repository at the location, or one already exists for `init`.
pub const REPOSITORY: u8 = 11;
/// `check` found damage.
pub const DAMAGED: u8 = 12;
/// Snapshot or path not found.
pub const NOT_FOUND: u8 = 13;
/// The destination cannot be reached or stopped answering.
pub const UNREACHABLE: u8 = 14;
/// The destination refused the credentials, the host key did not match,
/// or access was denied.
pub const ACCESS: u8 = 15;
/// The destination is full.
pub const FULL: u8 = 16;
/// The share, bucket or base directory does not exist.
pub const NO_CONTAINER: u8 = 17;
/// A retention policy would remove every snapshot of a group, and
/// `--allow-empty` was not given.
pub const KEEPS_NOTHING: u8 = 18;
/// A quota cannot hold the snapshots that must stay.
pub const QUOTA_TOO_SMALL: u8 = 19;
/// `status`: a profile's backups have gone stale (no success within
/// its `stale-after`, twice its interval by default, or never).
pub const STALE: u8 = 20;
/// `status`: nothing is stale, but a profile's last run failed.
pub const FAILING: u8 = 21;
/// Another run of the profile holds its lock (a backup), or another
/// daemon runs the profile: nothing was done.
pub const BUSY: u8 = 22;
/// Interrupted by a signal.
pub const INTERRUPTED: u8 = 130;
