//! What every step of a backup shares: the repository, the options, the
//! parent snapshot's index, the counters and the warnings.

use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicU64;
use std::sync::Mutex;

use capsule_format::BlobId;

use super::changes::Changes;
use super::exclude::Excludes;
use super::report::{BackupOptions, Warning};
use crate::index::MasterIndex;
use crate::packer::BlobSaver;
use crate::progress::Progress;
use crate::repo::Repository;

#[derive(Default)]
pub(crate) struct Counters {
    pub(crate) files: AtomicU64,
    pub(crate) dirs: AtomicU64,
    pub(crate) others: AtomicU64,
    pub(crate) bytes: AtomicU64,
    pub(crate) files_read: AtomicU64,
    pub(crate) bytes_read: AtomicU64,
    pub(crate) files_new: AtomicU64,
    pub(crate) files_changed: AtomicU64,
    pub(crate) files_unchanged: AtomicU64,
    pub(crate) trees_reused: AtomicU64,
    pub(crate) dirs_listed: AtomicU64,
    /// With a journal, entries of the parent that are gone or listed again
    /// (the summary is the parent's, plus what was seen, less these).
    pub(crate) gone_files: AtomicU64,
    pub(crate) gone_dirs: AtomicU64,
    pub(crate) gone_others: AtomicU64,
    pub(crate) gone_bytes: AtomicU64,
    pub(crate) scan_ns: AtomicU64,
    pub(crate) read_ns: AtomicU64,
    pub(crate) hash_ns: AtomicU64,
}

/// (device, inode) → (size, content) of hard-linked files already read.
type HardLinkCache = std::collections::HashMap<(u64, u64), (u64, Vec<BlobId>)>;

/// Everything the walkers share.
pub(crate) struct Ctx<'a> {
    pub(crate) repo: &'a Repository,
    pub(crate) index: &'a MasterIndex,
    pub(crate) saver: &'a BlobSaver,
    pub(crate) chunker: capsule_chunker::Chunker,
    pub(crate) opts: &'a BackupOptions,
    pub(crate) excludes: Excludes,
    pub(crate) progress: &'a Progress,
    pub(crate) counters: Counters,
    pub(crate) warnings: Mutex<Vec<Warning>>,
    /// Content of hard-linked files already read, by (device, inode).
    pub(crate) hardlinks: Mutex<HardLinkCache>,
    /// Start of the parent snapshot (Unix seconds): parent entries changed
    /// within a second of it cannot be trusted (see docs/DESIGN.md).
    pub(crate) parent_time: i64,
    /// Start of this backup.
    pub(crate) start_unix: i64,
    /// What the readers' look-ahead windows may hold together (see
    /// `walk::read_file`).
    pub(crate) windows: crate::mem::Budget,
    /// The change journal the walk follows, if any.
    pub(crate) changes: Option<&'a Changes>,
    /// Set when the journal's walk cannot go on (a parent tree that cannot
    /// be read): the walk is then done again in full.
    pub(crate) journal_broken: Mutex<Option<String>>,
    /// Directories listed that hold a file with several names.
    pub(crate) linked: Mutex<Vec<PathBuf>>,
    /// The source snapshots read instead of live files, if any.
    pub(crate) frozen: Option<&'a capsule_snap::Frozen>,
}

impl Ctx<'_> {
    /// Where the entry the sources name `logical` is read: in a source
    /// snapshot, or live.
    pub(crate) fn physical(&self, logical: &Path) -> PathBuf {
        self.frozen
            .map_or_else(|| logical.to_path_buf(), |f| f.physical(logical))
    }

    /// The device number recorded for `dev` as seen where the entry was
    /// read: a snapshot's is the original's.
    pub(crate) fn device(&self, dev: u64) -> u64 {
        self.frozen.map_or(dev, |f| f.device(dev))
    }

    pub(crate) fn warn(&self, path: &Path, message: impl Into<String>) {
        Progress::add(&self.progress.errors, 1);
        self.warnings
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(Warning {
                path: path.display().to_string(),
                message: message.into(),
            });
    }
}
