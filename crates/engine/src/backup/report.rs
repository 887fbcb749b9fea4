//! What a backup is asked to do, and what it reports: the snapshot, the
//! counts, the time each stage took, the warnings.

use std::path::PathBuf;

use capsule_format::snapshot::SnapshotSummary;
use capsule_format::ObjectId;

use super::changes::{Changes, ScanReport};
use crate::packer::SaverStatsSnapshot;

/// How a backup is run.
#[derive(Debug, Clone, Default)]
pub struct BackupOptions {
    /// Source paths (files or directories).
    pub paths: Vec<PathBuf>,
    /// Exclude patterns (gitignore syntax, matched against absolute paths).
    pub excludes: Vec<String>,
    /// Case-insensitive patterns, marker files and a size limit.
    pub rules: super::exclude::ExcludeRules,
    /// Name of per-directory ignore files (gitignore syntax); `None` disables.
    pub ignore_file: Option<String>,
    /// Do not cross file-system boundaries below each source path.
    pub one_file_system: bool,
    /// Snapshot to compare against (`None` = latest of this host and paths).
    pub parent: Option<String>,
    /// Read every file even if the parent says it is unchanged.
    pub force: bool,
    /// Tags to record.
    pub tags: Vec<String>,
    /// Host name to record (default: this machine's).
    pub hostname: Option<String>,
    /// Directories skipped whatever the patterns say: the repository (and
    /// later the local cache) when they lie inside a source.
    pub skip_dirs: Vec<PathBuf>,
    /// Reader threads (0 = twice the cores).
    pub threads: usize,
    /// Run an estimating scan alongside so progress has totals and an ETA.
    pub estimate: bool,
    /// Local file for the journal of packs landed but not yet indexed (see
    /// [`crate::journal`]); `None` keeps none, and an interrupted run's
    /// unindexed packs are then uploaded again.
    pub journal: Option<PathBuf>,
    /// List the packs on the destination first and treat every indexed
    /// pack that is missing or has the wrong size as lost (`--force`).
    pub verify_packs: bool,
    /// Packs known to be missing or damaged (from the last `check`): their
    /// blobs count as not stored, so a backup uploads them again instead
    /// of referencing lost data.
    pub damaged_packs: Vec<ObjectId>,
    /// What a change journal says changed since the parent snapshot: only
    /// that is listed again (see [`Changes`]). `None`: a full scan.
    pub changes: Option<Changes>,
    /// Why no journal is used, when one was asked for and the caller
    /// already knows it cannot be (reported as the full scan's reason).
    pub no_changes_because: Option<String>,
    /// A verification run: walk with `changes`, then scan in full, store
    /// the full scan's snapshot and say whether the two agreed.
    pub verify_changes: bool,
    /// Do everything but write: read and chunk what changed, count what
    /// would be sent, and store nothing (no packs, index, session or
    /// snapshot). The report's `snapshot_id` is then empty.
    pub dry_run: bool,
    /// A first backup does not meet other machines' first backups
    /// (crate::rendezvous): it uploads what they share itself, as before.
    pub alone: bool,
    /// Read the sources from a snapshot of their file systems taken when
    /// the walk starts (see `capsule_snap`), not from live files.
    pub source_snapshot: capsule_snap::Mode,
}

/// A problem with one source entry; the backup went on without it.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Warning {
    /// The entry.
    pub path: String,
    /// What happened.
    pub message: String,
}

/// Seconds spent per stage, summed over threads.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct StageTimes {
    /// From the start of the run until the index and the parent are
    /// loaded and the scan can begin: what the repository's size costs.
    pub ready: f64,
    /// Listing directories and reading metadata.
    pub scan: f64,
    /// Reading file content.
    pub read: f64,
    /// Finding chunk boundaries and hashing.
    pub chunk_hash: f64,
    /// Compressing.
    pub compress: f64,
    /// Encrypting.
    pub encrypt: f64,
    /// Waiting on storage writes.
    pub write: f64,
}

/// What a backup did.
#[derive(Debug, Clone, serde::Serialize)]
pub struct BackupReport {
    /// The new snapshot's ID.
    pub snapshot_id: String,
    /// Parent used for change detection.
    pub parent: Option<String>,
    /// Summary as recorded in the snapshot.
    pub summary: SnapshotSummary,
    /// Files read because they were new.
    pub files_new: u64,
    /// Files read because they changed.
    pub files_changed: u64,
    /// Files reused from the parent without reading.
    pub files_unchanged: u64,
    /// Directories whose parent tree blob was reused without re-encoding.
    pub trees_reused: u64,
    /// Storage-side counters.
    pub storage: SaverStatsSnapshot,
    /// Per-stage seconds.
    pub stages: StageTimes,
    /// Wall-clock seconds.
    pub duration_secs: f64,
    /// Entries skipped, with reasons.
    pub warnings: Vec<Warning>,
    /// Packs treated as lost (known damaged, or found missing with
    /// `verify_packs`): nothing in this snapshot refers to their copies.
    pub packs_distrusted: Vec<String>,
    /// This machine's clock is behind the newest snapshot of the same host
    /// and paths (one of them is wrong): what was seen.
    pub clock_warning: Option<String>,
    /// What was done to this machine's index tables worth a line (rebuilt
    /// from the index files, not merged for lack of space): not a
    /// problem with the backup.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub index_notes: Vec<String>,
    /// Whether a change journal spared the walk, and if not, why.
    pub scan: ScanReport,
    /// The destination refused to remove this run's session object for
    /// want of permission: these credentials may add but not delete
    /// (an append-only client). The object stays until a prune with other
    /// credentials removes it after its lease.
    pub append_only: bool,
    /// Directories holding files with more than one name (hard links),
    /// which a journal-driven run lists every time (see [`Changes`]).
    #[serde(skip)]
    pub linked_dirs: Vec<PathBuf>,
    /// The sources and the directories above them as this run saw them
    /// before its walk ([`super::changes::tops`]), for the next run's journal.
    #[serde(skip)]
    pub tops: Vec<(PathBuf, String)>,
    /// The source snapshots the run read (`dataset@name`, a path…):
    /// empty when it read live files.
    pub source_snapshots: Vec<String>,
    /// What the snapshot step has to say: why it read live files (with
    /// `auto`), leftovers of interrupted runs it removed, a snapshot it
    /// could not remove.
    pub snapshot_notes: Vec<String>,
    /// Seconds spent taking the source snapshots, removing leftovers, and
    /// removing them after the walk.
    pub snapshot_secs: f64,
}
