//! What a watcher is, what it watches, and the scope of a backup's
//! sources it answers for.

use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::error::{Result, WatchError};
use super::journal::Journal;

/// What a journal's scope is made of: the sources as the backup sees them,
/// the exclude patterns, the ignore file's name and whether file-system
/// boundaries are crossed. Another scope is another journal.
pub fn scope(
    sources: &[PathBuf],
    excludes: &[String],
    ignore_file: Option<&str>,
    one_file_system: bool,
) -> String {
    let mut h = blake3::Hasher::new();
    let mut sources: Vec<&PathBuf> = sources.iter().collect();
    sources.sort();
    for s in sources {
        h.update(b"s");
        h.update(s.as_os_str().as_bytes());
        h.update(b"\0");
    }
    for e in excludes {
        h.update(b"e");
        h.update(e.as_bytes());
        h.update(b"\0");
    }
    h.update(b"i");
    h.update(ignore_file.unwrap_or("").as_bytes());
    h.update(if one_file_system { b"x1" } else { b"x0" });
    h.finalize().to_hex()[..32].to_string()
}

/// Each source as the backup walks it: absolute, lexically normal, and a
/// source that is a symlink as what it points to.
pub fn walked_sources(paths: &[PathBuf]) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = paths
        .iter()
        .filter_map(|p| capsule_engine::backup::normalize_source(p).ok())
        .map(|p| match std::fs::symlink_metadata(&p) {
            Ok(m) if m.file_type().is_symlink() => std::fs::canonicalize(&p).unwrap_or(p),
            _ => p,
        })
        .collect();
    out.sort();
    out.dedup();
    out
}

/// Watches sources and records their changes in a [`Journal`]. The Linux
/// watchers are in this crate; a macOS FSEvents or Windows USN watcher
/// would implement the same.
pub trait Watcher: Send {
    /// `inotify`, `fanotify`...
    fn kind(&self) -> &'static str;

    /// Records every event queued by now, waiting up to `wait` for the
    /// first. Returns whether anything was recorded. An error means the
    /// watcher cannot go on (the journal says why in `degraded`).
    fn drain(&mut self, journal: &mut Journal, wait: Duration) -> Result<bool>;

    /// How many directories are watched (0 for a watcher that marks whole
    /// file systems).
    fn watches(&self) -> usize;

    /// A descriptor that becomes readable when events are queued, for a
    /// caller that waits on other things too.
    fn as_fd(&self) -> std::os::fd::BorrowedFd<'_>;
}

/// What to watch.
#[derive(Debug, Clone, Default)]
pub struct WatchOptions {
    /// The sources as given.
    pub sources: Vec<PathBuf>,
    /// Exclude patterns (part of the scope).
    pub excludes: Vec<String>,
    /// The per-directory ignore file's name: a change to one changes what
    /// is excluded below it, so its directory is rescanned in full.
    pub ignore_file: Option<String>,
    /// Stay on each source's file system.
    pub one_file_system: bool,
    /// Directories not watched: capsule's own state and cache, which the
    /// backups skip too. Watching them would make the watcher record its
    /// own writes of the journal, and write it again, forever.
    pub skip: Vec<PathBuf>,
    /// The journal file an earlier watcher wrote: FSEvents resumes from
    /// its last event (the Linux watchers start new ones).
    pub journal: Option<PathBuf>,
}

impl WatchOptions {
    /// The scope of a journal of these options.
    pub fn scope(&self) -> String {
        scope(
            &walked_sources(&self.sources),
            &self.excludes,
            self.ignore_file.as_deref(),
            self.one_file_system,
        )
    }
}

/// Waits up to `wait` for `fd` (a watcher's queue) to have events.
pub(crate) fn wait_readable(
    fd: std::os::fd::BorrowedFd<'_>,
    wait: Duration,
    what: &str,
) -> Result<()> {
    let mut fds = [rustix::event::PollFd::from_borrowed_fd(
        fd,
        rustix::event::PollFlags::IN,
    )];
    let t = rustix::time::Timespec {
        tv_sec: wait.as_secs() as i64,
        tv_nsec: i64::from(wait.subsec_nanos()),
    };
    match rustix::event::poll(&mut fds, Some(&t)) {
        Ok(_) | Err(rustix::io::Errno::INTR) => Ok(()),
        Err(e) => Err(WatchError::io("poll", Path::new(what), e.into())),
    }
}

/// Whether the journal leaves out events at `path`: capsule's own state
/// and cache (`skip`), and its source snapshots, whose creation and
/// removal every run would otherwise record as a change.
pub(crate) fn skipped(skip: &[PathBuf], path: &Path) -> bool {
    skip.iter().any(|s| path.starts_with(s))
        || path
            .components()
            .any(|c| c.as_os_str() == capsule_engine::backup::SNAPSHOT_DIR)
}
