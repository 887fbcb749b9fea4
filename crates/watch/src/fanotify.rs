//! The fanotify watcher: one mark on each file system holding a source,
//! reporting each change with its directory's file handle and the entry's
//! name (`FAN_REPORT_DFID_NAME`, Linux 5.9). It needs `CAP_SYS_ADMIN`
//! (root); where that is missing, [`crate::start`] falls back to inotify.
//!
//! Against inotify: no watch per directory (no limit to run into, nothing
//! to add when a directory appears, so no window in which a new
//! directory's changes go unseen), and an unbounded queue. Each event's
//! directory handle is turned back into a path (`open_by_handle_at`, then
//! the descriptor's link in `/proc/self/fd`); events outside the sources,
//! which a file-system mark also reports, are dropped there. A handle that
//! no longer opens is a directory deleted since: its parent had an event
//! for that, so nothing is lost by dropping it.
//!
//! The rules of what an event makes dirty or deep are inotify's (see
//! [`crate::inotify`]).

use std::collections::HashMap;
use std::ffi::OsStr;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::error::{Result, WatchError};
use crate::inotify::UNWATCHABLE;
use crate::journal::Journal;
use crate::mounts::{mounts_below, MountWatch};
use crate::watcher::{walked_sources, WatchOptions, Watcher};

const MASK: u64 = libc::FAN_CREATE
    | libc::FAN_DELETE
    | libc::FAN_MOVED_FROM
    | libc::FAN_MOVED_TO
    | libc::FAN_MODIFY
    | libc::FAN_ATTRIB
    | libc::FAN_CLOSE_WRITE
    | libc::FAN_DELETE_SELF
    | libc::FAN_MOVE_SELF
    | libc::FAN_ONDIR;

/// Events outside the sources that may change a file of theirs through
/// another name.
const OUTSIDE_MASK: u64 = libc::FAN_CREATE
    | libc::FAN_MOVED_TO
    | libc::FAN_MODIFY
    | libc::FAN_ATTRIB
    | libc::FAN_CLOSE_WRITE;

/// The fanotify watcher.
pub struct Fanotify {
    fd: OwnedFd,
    /// Each marked file system's ID and where it was marked; a
    /// descriptor on it, for `open_by_handle_at`, is held only within one
    /// drain ([`Fanotify::on`]): held between drains it would keep the
    /// file system busy, and its owner could not unmount it.
    filesystems: Vec<([u8; 8], PathBuf, Option<OwnedFd>)>,
    sources: Vec<PathBuf>,
    ignore_file: Option<Vec<u8>>,
    skip: Vec<PathBuf>,
    /// Directory handle → where it is, until a directory moves.
    paths: HashMap<Vec<u8>, Place>,
    /// Names outside the sources found with one name on a write, in this
    /// drain: a program writing a file outside raises an event per write,
    /// and one look per drain is enough for writes (a new name, a move or
    /// a link-count change is looked at again).
    written_once: std::collections::HashSet<PathBuf>,
    mounts: MountWatch,
    buf: Vec<u8>,
}

/// Where an event's directory is.
#[derive(Debug, Clone)]
enum Place {
    /// In the sources.
    Inside(PathBuf),
    /// Outside them, at this path.
    Outside(PathBuf),
    /// Gone since (its parent's event covers it).
    Gone,
}

/// Where an event's directory record lies in the read buffer: its file
/// system ID, its handle (from its header to its end), and its name.
type DfidAt = (usize, usize, usize, Option<(usize, usize)>);

/// Where a file (found by its own handle) has its names.
enum FileAt {
    /// None: deleted, only descriptors hold it.
    Deleted,
    /// In the sources, in this directory.
    Inside(PathBuf),
    /// Its one name is outside the sources.
    OnlyOutside,
    /// Cannot be told for certain.
    Unknown,
}

/// A file system's ID as `statfs` gives it, in the bytes events carry
/// (`__kernel_fsid_t`: two 32-bit words in memory order; `statvfs` packs
/// them low word first).
fn fsid_of(path: &Path) -> Option<[u8; 8]> {
    Some(fsid_bytes(rustix::fs::statvfs(path).ok()?.f_fsid))
}

/// [`fsid_of`] for an open descriptor.
fn fsid_of_fd(fd: &OwnedFd) -> [u8; 8] {
    rustix::fs::fstatvfs(fd).map_or([0; 8], |v| fsid_bytes(v.f_fsid))
}

fn fsid_bytes(id: u64) -> [u8; 8] {
    let mut out = [0u8; 8];
    out[..4].copy_from_slice(&(id as u32).to_ne_bytes());
    out[4..].copy_from_slice(&((id >> 32) as u32).to_ne_bytes());
    out
}

/// The path the kernel gives for an open descriptor.
fn link_of(fd: &OwnedFd) -> Option<PathBuf> {
    rustix::fs::readlinkat(
        rustix::fs::CWD,
        format!("/proc/self/fd/{}", fd.as_fd().as_raw_fd()),
        Vec::new(),
    )
    .ok()
    .map(|p| PathBuf::from(OsStr::from_bytes(p.as_bytes())))
}

impl Fanotify {
    /// Marks the file system of every source (and, crossing file systems,
    /// of every mount below them).
    pub fn start(opts: &WatchOptions, journal: &mut Journal) -> Result<Fanotify> {
        let flags = libc::FAN_CLOEXEC
            | libc::FAN_NONBLOCK
            | libc::FAN_CLASS_NOTIF
            | libc::FAN_UNLIMITED_QUEUE
            | libc::FAN_REPORT_DFID_NAME
            // The file's own handle too: a write through a name removed
            // since is placed by the file, not by the name (issue 59, 4).
            | libc::FAN_REPORT_FID;
        #[allow(unsafe_code)]
        // SAFETY: fanotify_init takes two integer flag sets and returns a
        // new descriptor or -1; no memory is shared.
        let raw =
            unsafe { libc::fanotify_init(flags, (libc::O_RDONLY | libc::O_LARGEFILE) as u32) };
        if raw < 0 {
            return Err(WatchError::Degraded(format!(
                "fanotify cannot be used here: {}",
                std::io::Error::last_os_error()
            )));
        }
        #[allow(unsafe_code)]
        // SAFETY: `raw` is a descriptor fanotify_init just returned, owned
        // by nothing else.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let sources = walked_sources(&opts.sources);
        let mut w = Fanotify {
            fd,
            filesystems: Vec::new(),
            sources: sources.clone(),
            ignore_file: opts.ignore_file.as_ref().map(|n| n.as_bytes().to_vec()),
            skip: opts
                .skip
                .iter()
                .map(|d| std::fs::canonicalize(d).unwrap_or_else(|_| d.clone()))
                .collect(),
            paths: HashMap::new(),
            written_once: std::collections::HashSet::new(),
            mounts: MountWatch::new(&sources),
            buf: vec![0; 64 << 10],
        };
        let mut places: Vec<PathBuf> = sources
            .iter()
            .filter(|s| std::fs::symlink_metadata(s).is_ok_and(|m| m.is_dir()))
            .cloned()
            .collect();
        if !opts.one_file_system {
            places.extend(mounts_below(&sources));
        }
        for p in places {
            w.mark(&p, journal)?;
        }
        w.mounts.reshare(journal);
        Ok(w)
    }

    /// Marks the file system holding `dir`, once.
    fn mark(&mut self, dir: &Path, journal: &mut Journal) -> Result<()> {
        if let Ok(fs) = rustix::fs::statfs(dir) {
            #[allow(clippy::unnecessary_cast)]
            if UNWATCHABLE.contains(&(fs.f_type as i64)) {
                journal.unwatchable.insert(dir.to_path_buf());
                return Ok(());
            }
        }
        let Some(fsid) = fsid_of(dir) else {
            return Ok(());
        };
        if self.filesystems.iter().any(|(id, _, _)| *id == fsid) {
            return Ok(());
        }
        let c = std::ffi::CString::new(dir.as_os_str().as_bytes())
            .map_err(|_| WatchError::Degraded(format!("{}: a NUL in the path", dir.display())))?;
        #[allow(unsafe_code)]
        // SAFETY: `c` is a NUL-terminated path that outlives the call; the
        // other arguments are integers.
        let r = unsafe {
            libc::fanotify_mark(
                self.fd.as_raw_fd(),
                libc::FAN_MARK_ADD | libc::FAN_MARK_FILESYSTEM,
                MASK,
                libc::AT_FDCWD,
                c.as_ptr(),
            )
        };
        if r < 0 {
            return Err(WatchError::Degraded(format!(
                "fanotify cannot mark the file system of {}: {}",
                dir.display(),
                std::io::Error::last_os_error()
            )));
        }
        self.filesystems.push((fsid, dir.to_path_buf(), None));
        Ok(())
    }

    /// A descriptor on the marked file system `fsid`, opened on first
    /// use within a drain (and checked to be that file system still).
    fn on(&mut self, fsid: &[u8]) -> Option<std::os::fd::BorrowedFd<'_>> {
        let (_, dir, fd) = self.filesystems.iter_mut().find(|(id, _, _)| id == fsid)?;
        if fd.is_none() {
            let opened = rustix::fs::open(
                &*dir,
                rustix::fs::OFlags::RDONLY
                    | rustix::fs::OFlags::DIRECTORY
                    | rustix::fs::OFlags::CLOEXEC,
                rustix::fs::Mode::empty(),
            )
            .ok()?;
            if fsid_of_fd(&opened).as_slice() != fsid {
                return None;
            }
            *fd = Some(opened);
        }
        fd.as_ref().map(|f| f.as_fd())
    }

    /// Where the directory with this handle on the file system `fsid` is.
    fn resolve(&mut self, fsid: &[u8], handle: &[u8]) -> Place {
        let mut key = fsid.to_vec();
        key.extend_from_slice(handle);
        if let Some(p) = self.paths.get(&key) {
            return p.clone();
        }
        let path = match self.open_handle(fsid, handle) {
            // Gone (ESTALE): its parent's event covers it.
            Err(_) => None,
            Ok(fd) => link_of(&fd).filter(|p| !p.as_os_str().as_bytes().ends_with(b" (deleted)")),
        };
        let place = match path {
            None => Place::Gone,
            Some(p)
                if self.sources.iter().any(|s| p.starts_with(s))
                    && !crate::watcher::skipped(&self.skip, &p) =>
            {
                Place::Inside(p)
            }
            Some(p) => Place::Outside(p),
        };
        if self.paths.len() > 100_000 {
            self.paths.clear();
        }
        self.paths.insert(key, place.clone());
        place
    }

    /// Opens (`O_PATH`) what `handle` on the file system `fsid` names; the
    /// error's `errno` when it does not open.
    fn open_handle(
        &mut self,
        fsid: &[u8],
        handle: &[u8],
    ) -> std::result::Result<OwnedFd, Option<i32>> {
        let on = self.on(fsid).map(|f| f.as_raw_fd()).ok_or(None)?;
        // struct file_handle: handle_bytes (u32), handle_type (i32), then
        // the handle; the event carries it in the same layout.
        let mut fh: Vec<u32> = vec![0; handle.len().div_ceil(4) + 1];
        for (i, chunk) in handle.chunks(4).enumerate() {
            let mut w = [0u8; 4];
            w[..chunk.len()].copy_from_slice(chunk);
            fh[i] = u32::from_ne_bytes(w);
        }
        #[allow(unsafe_code)]
        // SAFETY: `fh` holds a whole struct file_handle (its header and
        // `handle_bytes` bytes after it), aligned for it, alive for the
        // call; the kernel only reads it.
        let raw = unsafe {
            libc::open_by_handle_at(
                on,
                fh.as_mut_ptr().cast::<libc::file_handle>(),
                libc::O_PATH | libc::O_CLOEXEC,
            )
        };
        if raw < 0 {
            return Err(std::io::Error::last_os_error().raw_os_error());
        }
        #[allow(unsafe_code)]
        // SAFETY: a descriptor open_by_handle_at just returned.
        Ok(unsafe { OwnedFd::from_raw_fd(raw) })
    }

    /// Whether the file with this handle is the one with device `dev` and
    /// inode `ino`.
    fn is_file(&mut self, fsid: &[u8], handle: &[u8], dev: u64, ino: u64) -> bool {
        self.open_handle(fsid, handle)
            .ok()
            .and_then(|fd| rustix::fs::fstat(&fd).ok())
            .is_some_and(|st| st.st_dev == dev && st.st_ino == ino)
    }

    /// Where the file with this handle on the file system `fsid` has its
    /// names, as far as can be told for certain.
    fn file_at(&mut self, fsid: &[u8], handle: &[u8]) -> FileAt {
        let fd = match self.open_handle(fsid, handle) {
            Ok(fd) => fd,
            // ESTALE: the inode is gone, so no name holds it.
            Err(Some(libc::ESTALE)) => return FileAt::Deleted,
            Err(_) => return FileAt::Unknown,
        };
        // One of its names, if the kernel knows one; believed only where
        // that name is this very file now. A file renamed meanwhile (a
        // temporary moved into place) settles within a look or two.
        // (While a writer's descriptor holds a removed name, the kernel
        // gives that name, "… (deleted)": then this is a loss.)
        let mut placed = None;
        for _ in 0..3 {
            let Ok(st) = rustix::fs::fstat(&fd) else {
                return FileAt::Unknown;
            };
            if st.st_nlink == 0 {
                return FileAt::Deleted;
            }
            let same = link_of(&fd).filter(|p| {
                std::fs::symlink_metadata(p)
                    .is_ok_and(|m| m.dev() == st.st_dev && m.ino() == st.st_ino)
            });
            if let Some(p) = same {
                placed = Some((p, st));
                break;
            }
        }
        let Some((p, st)) = placed else {
            return FileAt::Unknown;
        };
        // With several names, the others may lie in other directories.
        if st.st_nlink != 1 {
            return FileAt::Unknown;
        }
        match p.parent() {
            Some(d) if self.sources.iter().any(|s| p.starts_with(s)) => {
                FileAt::Inside(d.to_path_buf())
            }
            _ => FileAt::OnlyOutside,
        }
    }

    /// A file's link count changed (a name made or removed anywhere on the
    /// file system: the kernel reports it with the file's own handle and
    /// no directory). Its ctime changed with it, so each of its names in
    /// the sources is changed, though its directory raised no event when
    /// the name was made and removed elsewhere (outside the sources, or
    /// made and removed between two drains).
    fn relinked(&mut self, fsid: &[u8], handle: &[u8], journal: &mut Journal) {
        match self.file_at(fsid, handle) {
            FileAt::Deleted | FileAt::OnlyOutside => {}
            FileAt::Inside(d) => journal.dirty(&d),
            FileAt::Unknown => journal.lose(
                "a file with several names had a name made or removed: its names in the sources cannot all be placed",
            ),
        }
    }

    /// Records one event: its mask, the directory's file system and
    /// handle, and the entry's name (none for an event on the directory
    /// itself).
    fn record(
        &mut self,
        mask: u64,
        fsid: &[u8],
        handle: &[u8],
        name: Option<&[u8]>,
        file: Option<(&[u8], &[u8])>,
        journal: &mut Journal,
    ) -> Result<()> {
        let is_dir = mask & libc::FAN_ONDIR != 0;
        // A directory moved: paths learnt before may be wrong now.
        if is_dir && mask & (libc::FAN_MOVED_FROM | libc::FAN_MOVED_TO) != 0 {
            self.paths.clear();
        }
        let dir = match self.resolve(fsid, handle) {
            Place::Inside(dir) => dir,
            Place::Outside(dir) => {
                // A file with several names changed (or given one more)
                // through a name outside the sources: its names inside
                // them raised no event, and only a scan finds them.
                // capsule's own state and cache (written often, by rename)
                // hold no name of a source's file.
                if is_dir || mask & OUTSIDE_MASK == 0 || crate::watcher::skipped(&self.skip, &dir) {
                    return Ok(());
                }
                let entry = name.map(|n| dir.join(OsStr::from_bytes(n)));
                let write_only = mask & OUTSIDE_MASK & !libc::FAN_MODIFY == 0;
                if write_only
                    && entry
                        .as_ref()
                        .is_some_and(|e| self.written_once.contains(e))
                {
                    return Ok(());
                }
                let found = entry
                    .as_ref()
                    .and_then(|e| std::fs::symlink_metadata(e).ok());
                let shown = entry
                    .as_ref()
                    .map_or_else(|| dir.display().to_string(), |e| e.display().to_string());
                match (found, entry) {
                    (Some(m), _) if m.is_file() && m.nlink() > 1 => journal.lose(format!(
                        "{shown}, a file with several names, changed outside the sources: its names in them cannot be placed"
                    )),
                    // The name is that very file's only name: nothing of
                    // the sources'.
                    (Some(m), Some(e))
                        if file.is_none_or(|(fs, h)| self.is_file(fs, h, m.dev(), m.ino())) =>
                    {
                        if write_only {
                            self.written_once.insert(e);
                        } else {
                            self.written_once.remove(&e);
                        }
                    }
                    // A directory-entry event (a create, a move in) carries
                    // no file handle: a name that came and went changed no
                    // content, and a write through it has an event of its
                    // own, with the file's handle.
                    _ if file.is_none() => {}
                    // Written through a descriptor opened by a name removed
                    // (or reused) since: the file may still have a name
                    // inside. Placed by its own handle, or a loss.
                    _ => match file.map_or(FileAt::Unknown, |(fs, h)| self.file_at(fs, h)) {
                        FileAt::Deleted | FileAt::OnlyOutside => {}
                        FileAt::Inside(d) => journal.dirty(&d),
                        FileAt::Unknown => journal.lose(format!(
                            "a file was changed through {shown}, a name outside the sources that is gone or is another file now, and where its other names are cannot be told"
                        )),
                    },
                }
                return Ok(());
            }
            Place::Gone => return Ok(()),
        };
        match name {
            Some(name) if !name.is_empty() && name != b"." => {
                let child = dir.join(OsStr::from_bytes(name));
                if crate::watcher::skipped(&self.skip, &child) {
                    return Ok(());
                }
                journal.dirty(&dir);
                if self.ignore_file.as_deref() == Some(name) {
                    journal.deep(&dir);
                }
                if is_dir && mask & (libc::FAN_CREATE | libc::FAN_MOVED_TO) != 0 {
                    journal.deep(&child);
                }
                if mask & (libc::FAN_DELETE_SELF | libc::FAN_MOVE_SELF) != 0
                    && self.sources.contains(&child)
                {
                    journal.lose(format!(
                        "the source {} was moved or deleted",
                        child.display()
                    ));
                }
            }
            _ => {
                let is_source = self.sources.contains(&dir);
                if mask & (libc::FAN_DELETE_SELF | libc::FAN_MOVE_SELF) != 0 {
                    if is_source {
                        journal.lose(format!("the source {} was moved or deleted", dir.display()));
                    }
                } else if !is_source {
                    if let Some(p) = dir.parent() {
                        journal.dirty(p);
                    }
                }
            }
        }
        Ok(())
    }

    /// Parses what one read returned: events, each a metadata header and
    /// info records.
    fn parse(&mut self, n: usize, journal: &mut Journal) -> Result<()> {
        let buf = std::mem::take(&mut self.buf);
        let mut off = 0;
        let u16_at = |b: &[u8], i: usize| u16::from_ne_bytes([b[i], b[i + 1]]);
        let u32_at = |b: &[u8], i: usize| u32::from_ne_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        let mut result = Ok(());
        while off + 24 <= n {
            let event_len = u32_at(&buf, off) as usize;
            let meta_len = u16_at(&buf, off + 6) as usize;
            let mask = u64::from_ne_bytes(buf[off + 8..off + 16].try_into().unwrap_or_default());
            if event_len < 24 || off + event_len > n {
                break;
            }
            if mask & libc::FAN_Q_OVERFLOW != 0 {
                journal.lose("the kernel's fanotify queue overflowed");
            }
            // Info records: the directory's handle and the entry's name,
            // and the file's own handle.
            let mut i = off + meta_len;
            let mut dfid: Option<DfidAt> = None;
            let mut fid: Option<(usize, usize)> = None;
            while i + 4 <= off + event_len {
                let info_type = buf[i];
                let len = u16_at(&buf, i + 2) as usize;
                if len < 4 || i + len > off + event_len {
                    break;
                }
                // header (4), fsid (8), handle_bytes (4), handle_type (4),
                // handle, then (for DFID_NAME) the NUL-terminated name.
                let hbytes = if i + 16 <= i + len {
                    u32_at(&buf, i + 12) as usize
                } else {
                    usize::MAX
                };
                let hend = (i + 20).saturating_add(hbytes);
                if hend <= i + len {
                    if info_type == libc::FAN_EVENT_INFO_TYPE_DFID_NAME
                        || info_type == libc::FAN_EVENT_INFO_TYPE_DFID
                    {
                        let name = (info_type == libc::FAN_EVENT_INFO_TYPE_DFID_NAME).then(|| {
                            let rest = &buf[hend..i + len];
                            let end = rest.iter().position(|b| *b == 0).unwrap_or(rest.len());
                            (hend, hend + end)
                        });
                        dfid = Some((i + 4, i + 12, hend, name));
                    } else if info_type == libc::FAN_EVENT_INFO_TYPE_FID {
                        fid = Some((i + 4, hend));
                    }
                }
                i += len;
            }
            if let Some((fs, h, hend, name)) = dfid {
                let file = fid.map(|(f, e)| (&buf[f..f + 8], &buf[f + 8..e]));
                let name = name.map(|(a, b)| &buf[a..b]);
                if let Err(e) =
                    self.record(mask, &buf[fs..fs + 8], &buf[h..hend], name, file, journal)
                {
                    result = Err(e);
                }
            } else if let Some((f, e)) = fid {
                if mask & libc::FAN_ATTRIB != 0 && mask & libc::FAN_ONDIR == 0 {
                    self.relinked(&buf[f..f + 8], &buf[f + 8..e], journal);
                }
            }
            off += event_len;
        }
        self.buf = buf;
        result
    }
}

impl Watcher for Fanotify {
    fn kind(&self) -> &'static str {
        "fanotify"
    }

    fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.fd.as_fd()
    }

    fn watches(&self) -> usize {
        0
    }

    fn drain(&mut self, journal: &mut Journal, wait: Duration) -> Result<bool> {
        let before = journal.seq;
        crate::watcher::wait_readable(self.fd.as_fd(), wait, "fanotify")?;
        self.written_once.clear();
        loop {
            match rustix::io::read(&self.fd, &mut self.buf) {
                Ok(0) => break,
                Ok(n) => self.parse(n, journal)?,
                Err(rustix::io::Errno::AGAIN) => break,
                Err(rustix::io::Errno::INTR) => continue,
                Err(e) => {
                    return Err(WatchError::io(
                        "read fanotify events",
                        Path::new("fanotify"),
                        e.into(),
                    ))
                }
            }
        }
        // Nothing held between drains on the file systems watched.
        for (_, _, fd) in &mut self.filesystems {
            *fd = None;
        }
        if self.mounts.changed() {
            journal.lose("the mounts below the sources changed");
            self.mounts.reshare(journal);
            for m in mounts_below(&self.sources) {
                if let Err(e) = self.mark(&m, journal) {
                    journal.degraded = Some(e.to_string());
                    return Err(e);
                }
            }
        }
        Ok(journal.seq != before)
    }
}
