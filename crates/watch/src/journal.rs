//! The journal: which directories changed since a cut, the identity that
//! says whether two cuts belong to one watch, the base a backup keeps, and
//! their files (bounded, written atomically).

use std::collections::{BTreeMap, BTreeSet};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Path, PathBuf};

use capsule_engine::backup::Changes;
use serde::{Deserialize, Serialize};

use super::error::{Result, WatchError};

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
    /// The sources and what is excluded from them ([`crate::watcher::scope`]).
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

/// What a journal kept by FSEvents records so that a later watcher can
/// resume where it stopped.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct Mark {
    /// The last event ID recorded.
    pub last_id: u64,
    /// Each source and the UUID of its volume's event database.
    pub volumes: Vec<(String, String)>,
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
    /// Kept by FSEvents: where a later watcher resumes (`fsevents::resume`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fsevents: Option<Mark>,
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
            fsevents: None,
        }
    }

    /// An earlier watcher's journal, going on in this process: this boot
    /// and this daemon (the epoch stays: the records are continuous).
    pub fn resumed(mut self) -> Journal {
        self.identity.boot = Identity::of_this_machine().1;
        self.pid = std::process::id();
        self
    }

    /// Whether the journal spans restarts (FSEvents' persistent IDs):
    /// another boot, then, is not a gap.
    fn spans_restarts(&self) -> bool {
        self.fsevents.is_some()
    }

    pub(crate) fn next(&mut self) -> u64 {
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
        if id.boot != here.1 && !self.spans_restarts() {
            return Err("the journal is from before the machine last started".into());
        }
        if let Some(why) = &self.degraded {
            return Err(why.clone());
        }
        let rebooted = base.identity.boot != id.boot;
        if base.identity.machine != id.machine || (rebooted && !self.spans_restarts()) {
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
        // Across a reboot the boot clock started again: nothing to compare.
        let drift = (now.wall - base.cut.wall) - (now.boot - base.cut.boot);
        if drift.abs() > 5 && !rebooted {
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
    #[cfg(not(target_os = "macos"))]
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

    /// The Mac's hardware UUID (`gethostuuid`) and this boot's session
    /// UUID (`kern.bootsessionuuid`).
    #[cfg(target_os = "macos")]
    #[allow(unsafe_code)]
    fn of_this_machine() -> (String, String) {
        let mut host = [0u8; 16];
        let wait = libc::timespec {
            tv_sec: 1,
            tv_nsec: 0,
        };
        // SAFETY: a 16-byte buffer, as gethostuuid writes.
        let machine = if unsafe { libc::gethostuuid(host.as_mut_ptr(), &wait) } == 0 {
            hex::encode(host)
        } else {
            String::new()
        };
        let mut buf = [0u8; 64];
        let mut len = buf.len();
        // SAFETY: a NUL-terminated name, and the buffer with its length.
        let ok = unsafe {
            libc::sysctlbyname(
                c"kern.bootsessionuuid".as_ptr(),
                buf.as_mut_ptr().cast(),
                &mut len,
                std::ptr::null_mut(),
                0,
            )
        } == 0;
        let boot = if ok {
            String::from_utf8_lossy(&buf[..len])
                .trim_end_matches('\0')
                .to_string()
        } else {
            String::new()
        };
        (machine, boot)
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

fn now_unix() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}

/// Seconds since boot, counting suspend.
pub fn boot_secs() -> i64 {
    #[cfg(not(target_os = "macos"))]
    let clock = rustix::time::ClockId::Boottime;
    // macOS's monotonic clock goes on while the Mac sleeps, as Linux's
    // boot time does.
    #[cfg(target_os = "macos")]
    let clock = rustix::time::ClockId::Monotonic;
    rustix::time::clock_gettime(clock).tv_sec
}

/// The most a state file may hold: a journal at its bound of directories
/// is about 20 MB.
pub(crate) const STATE_MAX: u64 = 64 << 20;

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
