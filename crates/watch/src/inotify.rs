//! The inotify watcher: a watch on every directory of the sources.
//!
//! inotify has no recursive mode, so each directory gets a watch, added
//! before it is listed (a subdirectory created in between is reported, not
//! missed), and a directory created or moved in is recorded deep: what
//! happened in it before its watch was added is found by scanning it in
//! full. A directory moved away or deleted loses its watches (a moved
//! directory's watch would go on reporting under its old path).
//!
//! Track is lost, and recorded as such ([`Journal::lose`]), when the
//! kernel's queue overflows, a file system below the sources is unmounted,
//! the mounts below the sources change (a mount hides or shows a whole
//! tree without an event in it), or a source itself is moved or deleted.
//! Running out of watches (`fs.inotify.max_user_watches`) stops the watcher
//! for good: the profile scans in full, and `status` says why.
//!
//! Directories on file systems where changes made elsewhere raise no event
//! (network shares, FUSE, procfs) are not watched but recorded as
//! unwatchable: every run scans them in full.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use rustix::fs::inotify::{self, CreateFlags, ReadFlags, WatchFlags};

use crate::error::{Result, WatchError};
use crate::journal::Journal;
use crate::mounts::MountWatch;
use crate::watcher::{walked_sources, WatchOptions, Watcher};

/// File-system types whose changes made elsewhere raise no inotify event
/// (`statfs` `f_type`): NFS, SMB/CIFS (three magics), FUSE, 9p, Ceph,
/// AFS, procfs, sysfs.
pub(crate) const UNWATCHABLE: [i64; 11] = [
    0x6969,
    0x517B,
    0xFF53_4D42,
    0xFE53_4D42,
    0x6573_5546,
    0x0102_1997,
    0x00C3_6400,
    0x5346_414F,
    0x9fa0,
    0x6265_6572,
    0x0027_e0eb, // cgroup
];

/// The inotify watcher.
pub struct Inotify {
    fd: OwnedFd,
    /// Watch descriptor → the directory's path.
    dirs: HashMap<i32, PathBuf>,
    sources: Vec<PathBuf>,
    ignore_file: Option<Vec<u8>>,
    one_file_system: bool,
    skip: Vec<PathBuf>,
    mounts: MountWatch,
    buf: Vec<MaybeUninit<u8>>,
}

fn mask() -> WatchFlags {
    WatchFlags::CREATE
        | WatchFlags::DELETE
        | WatchFlags::MOVED_FROM
        | WatchFlags::MOVED_TO
        | WatchFlags::MODIFY
        | WatchFlags::ATTRIB
        | WatchFlags::CLOSE_WRITE
        | WatchFlags::DELETE_SELF
        | WatchFlags::MOVE_SELF
        | WatchFlags::ONLYDIR
        | WatchFlags::DONT_FOLLOW
}

/// One event, copied out of the read buffer.
struct Event {
    wd: i32,
    flags: ReadFlags,
    name: Option<Vec<u8>>,
}

impl Inotify {
    /// Watches every directory of `opts.sources`, recording into `journal`
    /// what cannot be watched.
    pub fn start(opts: &WatchOptions, journal: &mut Journal) -> Result<Inotify> {
        let fd = inotify::init(CreateFlags::CLOEXEC | CreateFlags::NONBLOCK)
            .map_err(|e| WatchError::Degraded(format!("inotify cannot be used here: {e}")))?;
        let sources = walked_sources(&opts.sources);
        let mut w = Inotify {
            fd,
            dirs: HashMap::new(),
            sources: sources.clone(),
            ignore_file: opts.ignore_file.as_ref().map(|n| n.as_bytes().to_vec()),
            one_file_system: opts.one_file_system,
            skip: opts
                .skip
                .iter()
                .map(|d| std::fs::canonicalize(d).unwrap_or_else(|_| d.clone()))
                .collect(),
            mounts: MountWatch::new(&sources),
            buf: vec![MaybeUninit::uninit(); 64 << 10],
        };
        // A change made through a name outside the sources (a hard link)
        // raises an event only in the outside directory, which inotify
        // does not watch: where a file of the sources can have such a
        // name, events on the sources cannot vouch for their files.
        let table = crate::mounts::table();
        for s in &sources {
            if let Some(why) = crate::mounts::reached_from_outside(s, &table) {
                return Err(WatchError::Degraded(format!(
                    "inotify cannot see a change made through a name outside the sources (a hard link): {why}; every run scans in full (the daemon run as root uses fanotify, which sees them)"
                )));
            }
        }
        w.mounts.reshare(journal);
        for s in &sources {
            if std::fs::symlink_metadata(s).is_ok_and(|m| m.is_dir()) {
                let dev = std::fs::metadata(s).map(|m| m.dev()).unwrap_or(0);
                w.add_tree(s, dev, journal)?;
            }
        }
        Ok(w)
    }

    /// Adds a watch to `dir` and every directory below it (not following
    /// symlinks; not past `dev` with one-file-system).
    fn add_tree(&mut self, dir: &Path, dev: u64, journal: &mut Journal) -> Result<()> {
        let mut stack = vec![dir.to_path_buf()];
        while let Some(d) = stack.pop() {
            if crate::watcher::skipped(&self.skip, &d) {
                continue;
            }
            // Scanned in full by every run: its changes may be made
            // through another path.
            if journal.unwatchable.contains(&d) {
                continue;
            }
            if let Ok(fs) = rustix::fs::statfs(&d) {
                #[allow(clippy::unnecessary_cast)]
                if UNWATCHABLE.contains(&(fs.f_type as i64)) {
                    journal.unwatchable.insert(d);
                    continue;
                }
            }
            match inotify::add_watch(&self.fd, &d, mask()) {
                Ok(wd) => {
                    self.dirs.insert(wd, d.clone());
                }
                Err(rustix::io::Errno::NOSPC) => {
                    let limit = std::fs::read_to_string("/proc/sys/fs/inotify/max_user_watches")
                        .map(|s| s.trim().to_string())
                        .unwrap_or_else(|_| "?".into());
                    return Err(WatchError::Degraded(format!(
                        "the sources have more directories than inotify may watch (fs.inotify.max_user_watches = {limit}, {} watched): every run scans in full until it is raised",
                        self.dirs.len()
                    )));
                }
                // Gone or unreadable since it was listed: its parent's
                // event (or the run's own warning) covers it.
                Err(_) => continue,
            }
            let Ok(rd) = std::fs::read_dir(&d) else {
                continue;
            };
            for e in rd.flatten() {
                if !e.file_type().is_ok_and(|t| t.is_dir()) {
                    continue;
                }
                let p = e.path();
                if self.one_file_system && e.metadata().is_ok_and(|m| m.dev() != dev) {
                    continue;
                }
                stack.push(p);
            }
        }
        Ok(())
    }

    /// Removes the watches of `dir` and everything below it.
    fn forget_tree(&mut self, dir: &Path) {
        let gone: Vec<i32> = self
            .dirs
            .iter()
            .filter(|(_, p)| p.starts_with(dir))
            .map(|(wd, _)| *wd)
            .collect();
        for wd in gone {
            self.dirs.remove(&wd);
            let _ = inotify::remove_watch(&self.fd, wd);
        }
    }

    /// Reads what is queued, without waiting.
    fn read_all(&mut self) -> Result<Vec<Event>> {
        let mut out = Vec::new();
        let mut reader = inotify::Reader::new(self.fd.as_fd(), &mut self.buf);
        loop {
            match reader.next() {
                Ok(e) => out.push(Event {
                    wd: e.wd(),
                    flags: e.events(),
                    name: e.file_name().map(|n| n.to_bytes().to_vec()),
                }),
                Err(rustix::io::Errno::AGAIN) => break,
                Err(rustix::io::Errno::INTR) => continue,
                Err(e) => {
                    return Err(WatchError::io(
                        "read inotify events",
                        Path::new("inotify"),
                        e.into(),
                    ))
                }
            }
            // Stop at the end of what one read returned when nothing more
            // is queued: the next `next()` would read again anyway.
        }
        Ok(out)
    }

    fn record(&mut self, e: Event, journal: &mut Journal) -> Result<()> {
        if e.flags.contains(ReadFlags::QUEUE_OVERFLOW) {
            journal.lose("the kernel's event queue overflowed (fs.inotify.max_queued_events)");
            return Ok(());
        }
        let Some(dir) = self.dirs.get(&e.wd).cloned() else {
            return Ok(());
        };
        if e.flags.contains(ReadFlags::UNMOUNT) {
            journal.lose(format!(
                "a file system below the sources was unmounted ({})",
                dir.display()
            ));
            return Ok(());
        }
        if e.flags.contains(ReadFlags::IGNORED) {
            // The kernel dropped the watch: the directory is gone (its
            // parent reported that) or its file system went (UNMOUNT).
            self.dirs.remove(&e.wd);
            return Ok(());
        }
        match e.name {
            // capsule's own state and cache, where they lie in a source's
            // directory (backups skip them).
            Some(name)
                if crate::watcher::skipped(&self.skip, &dir.join(OsStr::from_bytes(&name))) => {}
            Some(name) => {
                journal.dirty(&dir);
                if self.ignore_file.as_deref() == Some(name.as_slice()) {
                    // What is excluded below changed.
                    journal.deep(&dir);
                }
                let child = dir.join(OsStr::from_bytes(&name));
                if e.flags.contains(ReadFlags::ISDIR) {
                    if e.flags
                        .intersects(ReadFlags::MOVED_FROM | ReadFlags::DELETE)
                    {
                        self.forget_tree(&child);
                    }
                    if e.flags.intersects(ReadFlags::CREATE | ReadFlags::MOVED_TO) {
                        journal.deep(&child);
                        let dev = std::fs::metadata(&dir).map(|m| m.dev()).unwrap_or(0);
                        if !(self.one_file_system
                            && std::fs::symlink_metadata(&child).is_ok_and(|m| m.dev() != dev))
                        {
                            self.add_tree(&child, dev, journal)?;
                        }
                    }
                }
            }
            None => {
                let is_source = self.sources.iter().any(|s| s == &dir);
                if e.flags
                    .intersects(ReadFlags::DELETE_SELF | ReadFlags::MOVE_SELF)
                {
                    if is_source {
                        journal.lose(format!("the source {} was moved or deleted", dir.display()));
                    }
                } else if !is_source {
                    // The directory's own record lives in its parent's
                    // tree (the parent's watch reports it too).
                    if let Some(p) = dir.parent() {
                        journal.dirty(p);
                    }
                }
            }
        }
        Ok(())
    }
}

impl Watcher for Inotify {
    fn kind(&self) -> &'static str {
        "inotify"
    }

    fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.fd.as_fd()
    }

    fn watches(&self) -> usize {
        self.dirs.len()
    }

    fn drain(&mut self, journal: &mut Journal, wait: Duration) -> Result<bool> {
        let before = journal.seq;
        crate::watcher::wait_readable(self.fd.as_fd(), wait, "inotify")?;
        let events = self.read_all()?;
        for e in events {
            if let Err(e) = self.record(e, journal) {
                journal.degraded = Some(e.to_string());
                return Err(e);
            }
        }
        if self.mounts.changed() {
            journal.lose("the mounts below the sources changed");
            let sources = self.sources.clone();
            self.mounts.reshare(journal);
            // Watch what a new mount shows.
            self.dirs.clear();
            // A fresh set of watches: the kernel keeps the old ones for
            // directories still there, and `add_watch` on them returns the
            // same descriptor.
            for s in &sources {
                let dev = std::fs::metadata(s).map(|m| m.dev()).unwrap_or(0);
                if let Err(e) = self.add_tree(s, dev, journal) {
                    journal.degraded = Some(e.to_string());
                    return Err(e);
                }
            }
        }
        journal.watched = self.dirs.len();
        Ok(journal.seq != before)
    }
}
