//! The change journal: which directories of a profile's sources changed,
//! recorded by a watcher the daemon runs, and when that record can be
//! trusted.
//!
//! A journal that misses one change is worse than none, so everything here
//! starts from "never miss a change": the record is trusted for a run only
//! when it can prove it saw every change since the parent snapshot's run
//! started. The proof is the journal's [`Identity`] (this machine, this
//! boot, this watcher since it started, these sources and excludes) and
//! its sequence numbers: each recorded change takes the next number, and a
//! run records where it cut the journal ([`Cut`]). The next run takes the
//! directories recorded after that cut, unless the watcher lost track
//! after it (a queue overflow, an unmount, more changes than the journal
//! holds) or anything else in [`Journal::changes_since`] says no. Then the
//! run scans in full and says why.
//!
//! Work is at directory granularity, as Apple advises for FSEvents: an
//! event in a directory marks it dirty (listed again and compared with
//! the parent snapshot); a directory created or moved in is deep (scanned
//! in full with all below it, because changes in it before it was watched
//! were not seen).
//!
//! The state is a file per profile in the daemon's state directory,
//! written whole and renamed into place. Paths are stored percent-encoded,
//! so names that are not UTF-8 survive.

pub mod fanotify;
pub mod inotify;
mod mounts;

use std::collections::{BTreeMap, BTreeSet};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

pub use capsule_engine::backup::Changes;

/// What can go wrong running a watcher or keeping its state.
#[derive(Debug, thiserror::Error)]
pub enum WatchError {
    /// A system call failed.
    #[error("{doing} {path}: {source}")]
    Io {
        /// What was being done.
        doing: &'static str,
        /// On what.
        path: String,
        /// The error.
        source: std::io::Error,
    },
    /// The watcher cannot watch these sources (a limit, a permission); the
    /// profile's runs scan in full.
    #[error("{0}")]
    Degraded(String),
    /// A state file that cannot be read as one.
    #[error("{path}: {why}; it is not trusted (the next run scans in full and writes a new one)")]
    Damaged {
        /// The file.
        path: String,
        /// What is wrong with it.
        why: String,
    },
}

impl WatchError {
    fn io(doing: &'static str, path: &Path, source: std::io::Error) -> Self {
        WatchError::Io {
            doing,
            path: path.display().to_string(),
            source,
        }
    }
}

/// Result of this crate.
pub type Result<T> = std::result::Result<T, WatchError>;

/// Which journal this is: a record from another machine, another boot or
/// another run of the watcher says nothing about the changes this one saw.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Identity {
    /// `/etc/machine-id` (empty where there is none).
    pub machine: String,
    /// This boot (`/proc/sys/kernel/random/boot_id`).
    pub boot: String,
    /// Random, new each time a watcher starts: two records with the same
    /// epoch were kept by one watcher that ran all along.
    pub epoch: String,
    /// The watcher (`inotify`, `fanotify`).
    pub kind: String,
    /// The sources and what is excluded from them ([`scope`]).
    pub scope: String,
    /// Each source's device when the watcher started: a source remounted
    /// or replaced since is another file system.
    pub devices: Vec<(String, u64)>,
}

/// Where a run cut the journal: changes recorded after `seq` are the next
/// run's to rescan.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Cut {
    /// The watcher's epoch.
    pub epoch: String,
    /// The last change recorded before the run started.
    pub seq: u64,
    /// Wall clock at the cut, Unix seconds.
    pub wall: i64,
    /// Seconds since boot at the cut (`CLOCK_BOOTTIME`, which goes on in
    /// suspend and never jumps).
    pub boot: i64,
}

/// A snapshot a run stored under a journal cut: the base the next run's
/// changes are taken from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Base {
    /// The journal it was cut from.
    pub identity: Identity,
    /// Where.
    pub cut: Cut,
    /// The snapshot stored (hex ID).
    pub snapshot: String,
    /// Runs since the last verification run (a full scan compared with
    /// the journal).
    #[serde(default)]
    pub runs_since_verify: u32,
    /// Directories holding files with several names, listed by every run
    /// (the backup's `linked_dirs`).
    #[serde(default, with = "path_set")]
    pub linked: BTreeSet<PathBuf>,
    /// The sources and the directories above them as that run saw them
    /// (the backup's `tops`).
    #[serde(default, with = "path_pairs")]
    pub tops: Vec<(PathBuf, String)>,
}

/// Where the watcher lost track, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Lost {
    /// The sequence number of the loss: runs cut before it scan in full.
    pub seq: u64,
    /// Why (for the run's summary).
    pub reason: String,
}

/// The journal: directories changed, each with the sequence number of its
/// last change.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Journal {
    /// Whose.
    pub identity: Identity,
    /// The daemon keeping it.
    pub pid: u32,
    /// The last sequence number given.
    pub seq: u64,
    /// Directories watched (for `status`).
    #[serde(default)]
    pub watched: usize,
    /// When the watcher started, Unix seconds.
    #[serde(default)]
    pub since: i64,
    /// How many times it was written on request (see [`Journal::syncs`]).
    pub syncs: u64,
    /// The latest loss of track.
    pub lost: Option<Lost>,
    /// Why the watcher stopped for good (a limit): every run scans in full.
    pub degraded: Option<String>,
    /// Directories whose entries changed.
    #[serde(with = "path_map")]
    pub dirty: BTreeMap<PathBuf, u64>,
    /// Directories to scan in full with all below.
    #[serde(with = "path_map")]
    pub deep: BTreeMap<PathBuf, u64>,
    /// Directories on file systems no watcher sees all changes of (network
    /// shares, FUSE, procfs): scanned in full by every run.
    #[serde(with = "path_set")]
    pub unwatchable: BTreeSet<PathBuf>,
    /// How many directories the journal holds before it gives up and
    /// records a loss instead (its memory bound; `CAPSULE_JOURNAL_MAX_DIRS`
    /// sets a small one in tests to force overflows).
    pub max_dirs: usize,
}

/// The bound on recorded directories when none is set: about 20 MB of
/// paths, and far more directories than change between two hourly runs.
pub const MAX_DIRS: usize = 100_000;

impl Journal {
    /// A new journal, no change recorded.
    pub fn new(identity: Identity) -> Self {
        let max_dirs = std::env::var("CAPSULE_JOURNAL_MAX_DIRS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(MAX_DIRS);
        Journal {
            identity,
            pid: std::process::id(),
            seq: 0,
            watched: 0,
            since: now_unix(),
            syncs: 0,
            lost: None,
            degraded: None,
            dirty: BTreeMap::new(),
            deep: BTreeMap::new(),
            unwatchable: BTreeSet::new(),
            max_dirs,
        }
    }

    fn next(&mut self) -> u64 {
        self.seq += 1;
        self.seq
    }

    fn bounded(&mut self) {
        if self.dirty.len() + self.deep.len() > self.max_dirs {
            let n = self.max_dirs;
            self.lose(format!(
                "more than {n} directories changed, more than the journal holds"
            ));
        }
    }

    /// `dir`'s entries changed.
    pub fn dirty(&mut self, dir: &Path) {
        let s = self.next();
        self.dirty.insert(dir.to_path_buf(), s);
        self.bounded();
    }

    /// `dir` is to be scanned in full with all below it.
    pub fn deep(&mut self, dir: &Path) {
        let s = self.next();
        self.deep.insert(dir.to_path_buf(), s);
        self.bounded();
    }

    /// The watcher lost track: runs cut before now scan in full. What was
    /// recorded before no longer matters to any run that can use the
    /// journal, so it goes.
    pub fn lose(&mut self, reason: impl Into<String>) {
        let seq = self.next();
        self.lost = Some(Lost {
            seq,
            reason: reason.into(),
        });
        self.dirty.clear();
        self.deep.clear();
    }

    /// Drops what a run cut at `seq` has covered (the base moved past it).
    pub fn prune(&mut self, seq: u64) {
        self.dirty.retain(|_, s| *s > seq);
        self.deep.retain(|_, s| *s > seq);
    }

    /// Where a run starting now cuts the journal.
    pub fn cut(&self) -> Cut {
        Cut {
            epoch: self.identity.epoch.clone(),
            seq: self.seq,
            wall: now_unix(),
            boot: boot_secs(),
        }
    }

    /// What changed since `base` was cut, for a run of `scope` cut at
    /// `now`; or why the journal cannot say, in words for the run's
    /// summary.
    pub fn changes_since(
        &self,
        base: &Base,
        scope: &str,
        now: &Cut,
    ) -> std::result::Result<Changes, String> {
        let here = Identity::of_this_machine();
        let id = &self.identity;
        if id.machine != here.0 {
            return Err("the journal was written on another machine".into());
        }
        if id.boot != here.1 {
            return Err("the journal is from before the machine last started".into());
        }
        if let Some(why) = &self.degraded {
            return Err(why.clone());
        }
        if base.identity.machine != id.machine || base.identity.boot != id.boot {
            return Err(
                "the machine restarted since the parent snapshot: changes made while no watcher ran cannot be known"
                    .into(),
            );
        }
        if base.identity.epoch != id.epoch || base.cut.epoch != id.epoch || now.epoch != id.epoch {
            return Err(
                "the watcher restarted since the parent snapshot: changes made while it was not running cannot be known"
                    .into(),
            );
        }
        if id.scope != scope || base.identity.scope != scope {
            return Err("the sources or excludes changed since the journal started".into());
        }
        if base.cut.seq > self.seq || now.seq > self.seq {
            return Err("the journal is older than the run it would serve".into());
        }
        if let Some(l) = self.lost.as_ref().filter(|l| l.seq > base.cut.seq) {
            return Err(l.reason.clone());
        }
        // The wall clock moved by more than the time that passed: a run's
        // rules about settled files assume it did not.
        let drift = (now.wall - base.cut.wall) - (now.boot - base.cut.boot);
        if drift.abs() > 5 {
            return Err(format!(
                "the clock moved by {drift} s since the parent snapshot"
            ));
        }
        for (source, dev) in &id.devices {
            let now_dev = std::fs::metadata(source).map(|m| {
                use std::os::unix::fs::MetadataExt;
                m.dev()
            });
            if now_dev.ok() != Some(*dev) {
                return Err(format!(
                    "the file system of {source} was unmounted, remounted or replaced"
                ));
            }
        }
        let after = |m: &BTreeMap<PathBuf, u64>| -> BTreeSet<PathBuf> {
            m.iter()
                .filter(|(_, s)| **s > base.cut.seq && **s <= now.seq)
                .map(|(p, _)| p.clone())
                .collect()
        };
        let mut deep = after(&self.deep);
        deep.extend(self.unwatchable.iter().cloned());
        let mut dirty = after(&self.dirty);
        dirty.extend(base.linked.iter().cloned());
        Ok(Changes {
            parent: base.snapshot.clone(),
            dirty,
            deep,
            tops: base.tops.clone(),
        })
    }

    /// Reads a journal file.
    pub fn load(path: &Path) -> Result<Journal> {
        load_json(path)
    }

    /// Writes the journal, whole, in place of the old one.
    pub fn save(&self, path: &Path) -> Result<()> {
        save_json(path, self)
    }
}

impl Identity {
    /// A new identity for a watcher starting now.
    pub fn new(kind: &str, scope: String, sources: &[PathBuf]) -> Identity {
        let (machine, boot) = Identity::of_this_machine();
        let mut epoch = [0u8; 16];
        let _ = getrandom::fill(&mut epoch);
        Identity {
            machine,
            boot,
            epoch: hex::encode(epoch),
            kind: kind.to_string(),
            scope,
            devices: sources
                .iter()
                .filter_map(|s| {
                    use std::os::unix::fs::MetadataExt;
                    let m = std::fs::metadata(s).ok()?;
                    Some((s.display().to_string(), m.dev()))
                })
                .collect(),
        }
    }

    /// This machine's ID and this boot's.
    fn of_this_machine() -> (String, String) {
        let read = |p: &str| {
            std::fs::read_to_string(p)
                .map(|s| s.trim().to_string())
                .unwrap_or_default()
        };
        (
            read("/etc/machine-id"),
            read("/proc/sys/kernel/random/boot_id"),
        )
    }
}

impl Base {
    /// Reads a base file.
    pub fn load(path: &Path) -> Result<Base> {
        load_json(path)
    }

    /// Writes it in place of the old one.
    pub fn save(&self, path: &Path) -> Result<()> {
        save_json(path, self)
    }
}

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

/// Starts the best watcher this process may run for `opts`, with a new
/// journal. Where none can run, the journal says why (`degraded`) and no
/// watcher is returned: the profile's runs scan in full.
pub fn start(opts: &WatchOptions) -> (Journal, Option<Box<dyn Watcher>>) {
    let sources = walked_sources(&opts.sources);
    // fanotify where this process may (root, or CAP_SYS_ADMIN), unless
    // told not to (`CAPSULE_WATCHER=inotify`).
    if std::env::var("CAPSULE_WATCHER").as_deref() != Ok("inotify") {
        let mut journal = Journal::new(Identity::new("fanotify", opts.scope(), &sources));
        if let Ok(w) = fanotify::Fanotify::start(opts, &mut journal) {
            return (journal, Some(Box::new(w)));
        }
    }
    let identity = Identity::new("inotify", opts.scope(), &sources);
    let mut journal = Journal::new(identity);
    match inotify::Inotify::start(opts, &mut journal) {
        Ok(w) => {
            journal.watched = w.watches();
            (journal, Some(Box::new(w)))
        }
        Err(e) => {
            journal.degraded = Some(e.to_string());
            (journal, None)
        }
    }
}

/// Waits up to `wait` for `fd` (a watcher's queue) to have events.
fn wait_readable(fd: std::os::fd::BorrowedFd<'_>, wait: Duration, what: &str) -> Result<()> {
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

fn now_unix() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}

/// Seconds since boot, counting suspend.
pub fn boot_secs() -> i64 {
    rustix::time::clock_gettime(rustix::time::ClockId::Boottime).tv_sec
}

/// The most a state file may hold: a journal at its bound of directories
/// is about 20 MB.
const STATE_MAX: u64 = 64 << 20;

/// Reads a state file, bounded: a regular file of at most [`STATE_MAX`]
/// bytes, not reached through a symlink (a FIFO would block the reader,
/// `/dev/zero` would fill its memory). Anything else is damaged.
fn read_state(path: &Path) -> Result<Vec<u8>> {
    use rustix::fs::{Mode, OFlags};
    use std::io::Read;
    let damaged = |why: String| WatchError::Damaged {
        path: path.display().to_string(),
        why,
    };
    let fd = match rustix::fs::open(
        path,
        OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC,
        Mode::empty(),
    ) {
        Ok(fd) => fd,
        Err(rustix::io::Errno::LOOP) => return Err(damaged("a symlink, not a file".into())),
        Err(e) => return Err(WatchError::io("read", path, e.into())),
    };
    let f = std::fs::File::from(fd);
    let m = f.metadata().map_err(|e| WatchError::io("read", path, e))?;
    if !m.is_file() {
        return Err(damaged("not a regular file".into()));
    }
    if m.len() > STATE_MAX {
        return Err(damaged(format!(
            "{} bytes, more than a state file holds",
            m.len()
        )));
    }
    let mut bytes = Vec::new();
    f.take(STATE_MAX + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| WatchError::io("read", path, e))?;
    if bytes.len() as u64 > STATE_MAX {
        return Err(damaged("grew past what a state file holds".into()));
    }
    Ok(bytes)
}

fn load_json<T: serde::de::DeserializeOwned>(path: &Path) -> Result<T> {
    let bytes = read_state(path)?;
    serde_json::from_slice(&bytes).map_err(|e| WatchError::Damaged {
        path: path.display().to_string(),
        why: e.to_string(),
    })
}

fn save_json<T: Serialize>(path: &Path, value: &T) -> Result<()> {
    let bytes = serde_json::to_vec(value).map_err(|e| WatchError::Damaged {
        path: path.display().to_string(),
        why: e.to_string(),
    })?;
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(|e| WatchError::io("create", dir, e))?;
    }
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, bytes).map_err(|e| WatchError::io("write", &tmp, e))?;
    std::fs::rename(&tmp, path).map_err(|e| WatchError::io("rename", path, e))
}

/// A path as text: `%` and bytes that are not printable ASCII are written
/// `%XX`, so any name survives JSON.
pub fn encode_path(p: &Path) -> String {
    let mut out = String::new();
    for &b in p.as_os_str().as_bytes() {
        if (0x20..0x7f).contains(&b) && b != b'%' {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// The inverse of [`encode_path`].
pub fn decode_path(s: &str) -> Option<PathBuf> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = s.get(i + 1..i + 3)?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    Some(PathBuf::from(std::ffi::OsString::from_vec(out)))
}

mod path_map {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use serde::de::Error;

    pub fn serialize<S: serde::Serializer>(
        m: &BTreeMap<PathBuf, u64>,
        s: S,
    ) -> std::result::Result<S::Ok, S::Error> {
        s.collect_seq(m.iter().map(|(p, n)| (encode_path(p), *n)))
    }

    pub fn deserialize<'de, D: serde::Deserializer<'de>>(
        d: D,
    ) -> std::result::Result<BTreeMap<PathBuf, u64>, D::Error> {
        let v: Vec<(String, u64)> = Vec::deserialize(d)?;
        v.into_iter()
            .map(|(p, n)| {
                Ok((
                    decode_path(&p).ok_or_else(|| D::Error::custom("bad path"))?,
                    n,
                ))
            })
            .collect()
    }
}

mod path_pairs {
    use super::*;
    use serde::de::Error;

    pub fn serialize<S: serde::Serializer>(
        v: &[(PathBuf, String)],
        s: S,
    ) -> std::result::Result<S::Ok, S::Error> {
        s.collect_seq(v.iter().map(|(p, t)| (encode_path(p), t)))
    }

    pub fn deserialize<'de, D: serde::Deserializer<'de>>(
        d: D,
    ) -> std::result::Result<Vec<(PathBuf, String)>, D::Error> {
        let v: Vec<(String, String)> = Vec::deserialize(d)?;
        v.into_iter()
            .map(|(p, t)| {
                Ok((
                    decode_path(&p).ok_or_else(|| D::Error::custom("bad path"))?,
                    t,
                ))
            })
            .collect()
    }
}

mod path_set {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use serde::de::Error;

    pub fn serialize<S: serde::Serializer>(
        m: &BTreeSet<PathBuf>,
        s: S,
    ) -> std::result::Result<S::Ok, S::Error> {
        s.collect_seq(m.iter().map(|p| encode_path(p)))
    }

    pub fn deserialize<'de, D: serde::Deserializer<'de>>(
        d: D,
    ) -> std::result::Result<BTreeSet<PathBuf>, D::Error> {
        let v: Vec<String> = Vec::deserialize(d)?;
        v.into_iter()
            .map(|p| decode_path(&p).ok_or_else(|| D::Error::custom("bad path")))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn any_name_survives_the_state_file() {
        let p = PathBuf::from(std::ffi::OsString::from_vec(b"/a/b%c/\xff\x01 d".to_vec()));
        assert_eq!(encode_path(&p), "/a/b%25c/%FF%01 d");
        assert_eq!(decode_path(&encode_path(&p)), Some(p));
        assert_eq!(decode_path("%G1"), None);
        assert_eq!(decode_path("%4"), None);
    }

    fn journal() -> Journal {
        Journal::new(Identity::new("inotify", "scope".into(), &[]))
    }

    fn base(j: &Journal) -> Base {
        Base {
            identity: j.identity.clone(),
            cut: j.cut(),
            snapshot: "aa".repeat(32),
            runs_since_verify: 0,
            linked: BTreeSet::new(),
            tops: Vec::new(),
        }
    }

    #[test]
    fn a_run_takes_what_changed_after_the_parent_was_cut() {
        let mut j = journal();
        j.dirty(Path::new("/s/a"));
        let b = base(&j);
        j.dirty(Path::new("/s/b"));
        j.deep(Path::new("/s/new"));
        let c = j.changes_since(&b, "scope", &j.cut()).unwrap();
        assert_eq!(c.dirty.iter().collect::<Vec<_>>(), [Path::new("/s/b")]);
        assert_eq!(c.deep.iter().collect::<Vec<_>>(), [Path::new("/s/new")]);
        assert_eq!(c.parent, b.snapshot);
        // What the run covered goes once the base moves past it.
        j.prune(b.cut.seq);
        assert!(!j.dirty.contains_key(Path::new("/s/a")));
    }

    #[test]
    fn every_discontinuity_is_refused_with_its_reason() {
        let mut j = journal();
        let b = base(&j);
        let now = j.cut();
        let refuse = |j: &Journal, b: &Base, scope: &str, now: &Cut| {
            j.changes_since(b, scope, now).unwrap_err()
        };
        assert!(refuse(&j, &b, "other", &now).contains("sources or excludes"));
        let mut other = b.clone();
        other.identity.epoch = "restarted".into();
        other.cut.epoch = "restarted".into();
        assert!(refuse(&j, &other, "scope", &now).contains("watcher restarted"));
        let mut other = b.clone();
        other.identity.boot = "before".into();
        assert!(refuse(&j, &other, "scope", &now).contains("restarted since"));
        let mut moved = now.clone();
        moved.wall += 3600;
        assert!(refuse(&j, &b, "scope", &moved).contains("clock moved by 3600 s"));
        let mut copied = j.clone();
        copied.identity.machine = "elsewhere".into();
        assert!(refuse(&copied, &b, "scope", &now).contains("another machine"));
        j.lose("the kernel's event queue overflowed");
        assert!(refuse(&j, &b, "scope", &j.cut()).contains("overflowed"));
        // A base cut after the loss is good again.
        let b2 = base(&j);
        j.dirty(Path::new("/s/x"));
        assert_eq!(
            j.changes_since(&b2, "scope", &j.cut()).unwrap().dirty.len(),
            1
        );
    }

    #[test]
    fn more_directories_than_the_bound_is_a_loss_not_memory() {
        let mut j = journal();
        j.max_dirs = 3;
        let b = base(&j);
        for i in 0..5 {
            j.dirty(&PathBuf::from(format!("/s/{i}")));
        }
        assert!(j.dirty.len() <= 3);
        assert!(j
            .changes_since(&b, "scope", &j.cut())
            .unwrap_err()
            .contains("more than 3 directories"));
    }

    #[test]
    fn a_state_file_is_read_bounded() {
        let d = tempfile::tempdir().unwrap();
        // A symlink to an endless file, and a FIFO: refused at once, named.
        let link = d.path().join("zero.json");
        std::os::unix::fs::symlink("/dev/zero", &link).unwrap();
        let e = Journal::load(&link).unwrap_err().to_string();
        assert!(e.contains("a symlink") && e.contains("not trusted"), "{e}");
        let fifo = d.path().join("fifo.json");
        rustix::fs::mknodat(
            rustix::fs::CWD,
            &fifo,
            rustix::fs::FileType::Fifo,
            rustix::fs::Mode::from_raw_mode(0o600),
            0,
        )
        .unwrap();
        let e = Journal::load(&fifo).unwrap_err().to_string();
        assert!(e.contains("not a regular file"), "{e}");
        let big = d.path().join("big.json");
        std::fs::File::create(&big)
            .unwrap()
            .set_len(STATE_MAX + 1)
            .unwrap();
        let e = Base::load(&big).unwrap_err().to_string();
        assert!(e.contains("more than a state file holds"), "{e}");
    }

    #[test]
    fn a_damaged_state_file_is_named_and_not_trusted() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("j");
        let j = journal();
        j.save(&p).unwrap();
        assert_eq!(Journal::load(&p).unwrap(), j);
        std::fs::write(&p, b"{\"identity\": 3").unwrap();
        let e = Journal::load(&p).unwrap_err().to_string();
        assert!(e.contains("not trusted"), "{e}");
    }
}
