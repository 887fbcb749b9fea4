//! Reading the sources: a file's content chunked and hashed in bounded
//! windows, pseudo-files read whole, an entry found by its descriptor or
//! its path, and a source that cannot be read noted, not fatal.

use std::ffi::OsStr;
use std::fs::File;
use std::io::{ErrorKind, Read};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use capsule_format::tree::Node;
use capsule_format::{BlobId, BlobType};
use rustix::fs::{AtFlags, Mode, OFlags};

use super::ctx::Ctx;
use super::exclude::Excludes;
use crate::error::Result;
use crate::meta::{node_from_metadata, read_xattrs, read_xattrs_from, XattrSource};
use crate::progress::Progress;

pub(crate) fn elapsed_ns(t: Instant) -> u64 {
    t.elapsed().as_nanos() as u64
}

/// Records a source entry that could not be read; the entry is skipped.
/// A missing entry is told apart because it is normal churn, not a fault.
pub(crate) fn source_error<T>(
    ctx: &Ctx<'_>,
    path: &Path,
    doing: &str,
    e: std::io::Error,
) -> Option<T> {
    if e.kind() == ErrorKind::NotFound {
        ctx.warn(path, "vanished before it could be read");
    } else {
        ctx.warn(path, format!("{doing}: {e}"));
    }
    None
}

/// The entry names read and, if listing stopped early, the error.
type Listing = (Vec<std::ffi::OsString>, Option<std::io::Error>);

/// Lists an open directory.
pub(crate) fn list_dir(fd: &OwnedFd) -> std::io::Result<Listing> {
    let mut names = Vec::new();
    for e in rustix::fs::Dir::read_from(fd)? {
        match e {
            Ok(e) => {
                let n = e.file_name().to_bytes();
                if n != b"." && n != b".." {
                    names.push(OsStr::from_bytes(n).to_owned());
                }
            }
            Err(e) => return Ok((names, Some(e.into()))),
        }
    }
    Ok((names, None))
}

/// Where an entry is, for the system calls: its parent directory's
/// descriptor and its name (every entry below a source), or a path (the
/// sources themselves). Reaching entries through their directory's
/// descriptor (`fstatat`, `openat`, `readlinkat`) works at any depth, past
/// `PATH_MAX`, costs no path walk per entry, and cannot be redirected by a
/// directory renamed or swapped for a symlink while the walk runs.
#[derive(Clone, Copy)]
pub(crate) enum Loc<'a> {
    At(BorrowedFd<'a>, &'a OsStr),
    Path(&'a Path),
}

impl Loc<'_> {
    pub(crate) fn parts(&self) -> (BorrowedFd<'_>, &OsStr) {
        match *self {
            Loc::At(fd, name) => (fd, name),
            Loc::Path(p) => (rustix::fs::CWD, p.as_os_str()),
        }
    }

    /// `lstat`.
    pub(crate) fn stat(&self) -> std::io::Result<rustix::fs::Stat> {
        let (dir, name) = self.parts();
        Ok(rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW)?)
    }

    /// Opens the entry itself, never a symlink's target, with `O_NOATIME`
    /// where allowed: reading would otherwise move access times (and a
    /// directory's recorded atime, storing a new tree for nothing). It
    /// needs ownership (or CAP_FOWNER), so fall back without it.
    pub(crate) fn open(&self, flags: OFlags) -> std::io::Result<OwnedFd> {
        let (dir, name) = self.parts();
        let flags = flags | OFlags::NOFOLLOW | OFlags::CLOEXEC;
        match rustix::fs::openat(dir, name, flags | crate::platform::NOATIME, Mode::empty()) {
            Err(e) if e == rustix::io::Errno::PERM => {
                Ok(rustix::fs::openat(dir, name, flags, Mode::empty())?)
            }
            r => Ok(r?),
        }
    }

    pub(crate) fn read_link(&self) -> std::io::Result<Vec<u8>> {
        let (dir, name) = self.parts();
        Ok(rustix::fs::readlinkat(dir, name, Vec::new())?.into_bytes())
    }

    /// A path for the calls that have no `*at` form (extended attributes of
    /// a symlink or special file, which cannot be opened to read them):
    /// `/proc/self/fd/<n>/<name>` reaches the entry through its directory's
    /// descriptor; without procfs, the full `path`.
    pub(crate) fn sys_path(&self, path: &Path) -> PathBuf {
        match self {
            Loc::At(fd, name) => {
                through_fd(fd).map_or_else(|| path.to_path_buf(), |d| d.join(name))
            }
            Loc::Path(p) => p.to_path_buf(),
        }
    }
}

/// A short path that reaches the open directory `fd` itself:
/// `/proc/self/fd/<n>`. `None` without procfs.
pub(crate) fn through_fd(fd: &impl AsFd) -> Option<PathBuf> {
    static PROC: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    PROC.get_or_init(|| Path::new("/proc/self/fd").is_dir())
        .then(|| PathBuf::from(format!("/proc/self/fd/{}", fd.as_fd().as_raw_fd())))
}

/// Reads, chunks and hashes a file; hands new chunks to the saver. Returns
/// `Ok(None)` after recording a warning if the file cannot be read.
pub(crate) fn read_file(
    ctx: &Ctx<'_>,
    path: &Path,
    loc: Loc<'_>,
    node: &mut Node,
) -> Result<Option<Vec<BlobId>>> {
    let link_key = (node.device, node.inode);
    if node.nlink > 1 {
        let cache = ctx.hardlinks.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((size, content)) = cache.get(&link_key) {
            if *size == node.size {
                let content = content.clone();
                drop(cache);
                read_node_xattrs(ctx, path, loc, node);
                Progress::add(&ctx.progress.bytes_done, node.size);
                return Ok(Some(content));
            }
        }
    }
    let t0 = Instant::now();
    let mut f = match loc.open(OFlags::RDONLY) {
        Ok(fd) => File::from(fd),
        Err(e) => return Ok(source_error(ctx, path, "cannot open", e)),
    };
    let before = match f.metadata() {
        Ok(m) => m,
        Err(e) => {
            ctx.warn(path, format!("cannot read metadata: {e}"));
            return Ok(None);
        }
    };
    if before.ino() != node.inode || !before.is_file() {
        if !before.is_file() {
            ctx.warn(path, "replaced by a non-file while being backed up");
            return Ok(None);
        }
        // Replaced between the scan and open: describe what we actually read.
        let name = std::mem::take(&mut node.name);
        *node = node_from_metadata(OsStr::from_bytes(&name), &before);
    }
    match read_xattrs_from(XattrSource::Fd(f.as_fd())) {
        Ok(x) => node.xattrs = x,
        Err(e) => ctx.warn(path, format!("cannot read extended attributes: {e}")),
    }
    Progress::add(&ctx.counters.read_ns, elapsed_ns(t0));

    let mut limit = before.len();
    let chunker = &ctx.chunker;
    // A large file's tail is cut finer (the same bytes, the same cuts).
    let mut cuts = chunker.file();
    let max = chunker.sizes().max;
    // The chunker needs `max` bytes ahead of each cut; every refill tops
    // the window up and first moves what is left (< `max`) to its front.
    // One and a half `max` (6 MiB) keeps that move under two bytes per
    // byte read, a few percent of a backup's CPU; two (8 MiB) halved it,
    // but four readers' windows were then a third of the heap's peak (34
    // of 74 MB backing up 4 × 128 MiB over SMB).
    let window = max + max / 2;
    // A file larger than one chunk holds a share of the readers' budget
    // until it is read: with many readers (two per core) on large files,
    // their windows would otherwise grow with the cores. Smaller files
    // never wait, so large files do not stall the small ones beside them.
    let _window = (limit > max as u64).then(|| {
        ctx.windows
            .take(window.min(usize::try_from(limit).unwrap_or(usize::MAX)) as u64)
    });
    let mut content = Vec::new();
    let mut buf: Vec<u8> = Vec::new();
    let mut start = 0usize;
    let mut eof = false;
    let mut total: u64 = 0;
    // Files of procfs and sysfs report size 0 yet have content: probe, and
    // read such a file whole (it is small and generated on read).
    let mut pseudo = false;
    if limit == 0 {
        match read_pseudo(&mut f) {
            Ok(data) if !data.is_empty() => {
                pseudo = true;
                total = data.len() as u64;
                limit = total;
                Progress::add(&ctx.progress.bytes_read, total);
                buf = data;
                eof = true;
            }
            Ok(_) => {}
            Err(e) => {
                ctx.warn(path, format!("read failed: {e}"));
                return Ok(None);
            }
        }
    }
    loop {
        if !eof && buf.len() - start < max {
            if start > 0 {
                buf.drain(..start);
                start = 0;
            }
            // Read no further than the size seen at open: a file that keeps
            // growing (a busy log) must not keep the backup chasing its end.
            let want = ((window - buf.len()) as u64).min(limit - total);
            buf.reserve(want as usize);
            let t = Instant::now();
            let got = match (&mut f).take(want).read_to_end(&mut buf) {
                Ok(n) => n as u64,
                Err(e) => {
                    ctx.warn(path, format!("read failed after {total} bytes: {e}"));
                    return Ok(None);
                }
            };
            Progress::add(&ctx.counters.read_ns, elapsed_ns(t));
            total += got;
            Progress::add(&ctx.progress.bytes_read, got);
            if got < want || total == limit {
                eof = true;
            }
            if !eof && buf.len() - start < max && buf.len() < window {
                continue;
            }
        }
        if start == buf.len() {
            break;
        }
        let t = Instant::now();
        let n = cuts.next_cut(&buf[start..], eof);
        let chunk = &buf[start..start + n];
        let id = ctx.repo.key().blob_id(chunk);
        Progress::add(&ctx.counters.hash_ns, elapsed_ns(t));
        if ctx.saver.save(BlobType::Data, id, chunk)? {
            Progress::add(&ctx.progress.bytes_new, n as u64);
        }
        Progress::add(&ctx.progress.bytes_done, n as u64);
        content.push(id);
        start += n;
    }
    Progress::add(&ctx.counters.files_read, 1);
    Progress::add(&ctx.counters.bytes_read, total);
    if let Ok(after) = f.metadata() {
        if (after.len() != limit && !pseudo)
            || after.mtime() != before.mtime()
            || after.mtime_nsec() != before.mtime_nsec()
            || after.ctime() != before.ctime()
            || after.ctime_nsec() != before.ctime_nsec()
            || total != limit
        {
            ctx.warn(
                path,
                "changed while being read; stored what was read, it will be read again next time",
            );
            // Recorded with the pre-read times, so the next run sees a change.
        }
    }
    node.size = total;
    if node.nlink > 1 {
        ctx.hardlinks
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(link_key, (total, content.clone()));
    }
    Ok(Some(content))
}

/// What the readers' windows may hold together: as many whole windows
/// (one and a half times the largest chunk) as half the cores, and never
/// fewer than two; files up to one chunk take nothing from it. Readers are
/// two per core so that opening, reading and hashing small files overlap.
/// On a large file a reader's work is hashing and chunking, less than
/// sealing the same bytes takes (compression probe, encryption, the pack
/// write), so readers on half the cores keep the sealers busy. Four 6 MiB
/// windows were a quarter of a large-file backup's peak heap on two cores
/// (25 of 81 MB to S3), and would have been 96 MiB on sixteen.
pub(super) fn windows_budget(max_chunk: usize, cores: usize) -> u64 {
    ((max_chunk + max_chunk / 2) * (cores / 2).max(2)) as u64
}

/// Most content read from a file that reports size 0 (see `read_file`).
const PSEUDO_FILE_MAX: u64 = 64 << 20;

/// Reads a file that reported size 0 to its end: empty for a real empty
/// file, the content for a procfs or sysfs file.
fn read_pseudo(f: &mut File) -> std::io::Result<Vec<u8>> {
    let mut data = Vec::new();
    f.take(PSEUDO_FILE_MAX + 1).read_to_end(&mut data)?;
    if data.len() as u64 > PSEUDO_FILE_MAX {
        return Err(std::io::Error::other(format!(
            "it reports size 0 but holds more than {} MiB (a generated file that never ends?)",
            PSEUDO_FILE_MAX >> 20
        )));
    }
    Ok(data)
}

/// A running estimating scan.
pub(super) struct Estimator {
    pub(crate) stop: Arc<AtomicBool>,
    handle: Option<std::thread::JoinHandle<()>>,
}

impl Estimator {
    pub(super) fn stop(mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

/// Counts files and bytes under the sources so progress can show totals and
/// an ETA. Runs beside the backup on its own thread and stops early if the
/// backup finishes first.
pub(super) fn spawn_estimator(
    sources: Vec<PathBuf>,
    ex: Excludes,
    one_fs: bool,
    progress: Arc<Progress>,
) -> Estimator {
    let stop = Arc::new(AtomicBool::new(false));
    let s2 = stop.clone();
    let handle = std::thread::Builder::new()
        .name("estimate".into())
        .spawn(move || {
            let p = &*progress;
            let mut stack: Vec<(PathBuf, Option<u64>)> =
                sources.into_iter().map(|s| (s, None)).collect();
            while let Some((path, dev)) = stack.pop() {
                if s2.load(Ordering::Relaxed) {
                    return;
                }
                let Ok(m) = std::fs::symlink_metadata(&path) else {
                    continue;
                };
                if ex.is_excluded(&path, m.is_dir()) || (m.is_file() && ex.too_large(m.len())) {
                    continue;
                }
                if m.is_file() {
                    Progress::add(&p.files_total, 1);
                    Progress::add(&p.bytes_total, m.len());
                } else if m.is_dir() {
                    if one_fs && dev.is_some_and(|d| d != m.dev()) {
                        continue;
                    }
                    if let Ok(rd) = std::fs::read_dir(&path) {
                        for e in rd.flatten() {
                            stack.push((e.path(), Some(dev.unwrap_or(m.dev()))));
                        }
                    }
                }
            }
            p.totals_final.store(true, Ordering::Relaxed);
        })
        .expect("spawn estimator");
    Estimator {
        stop,
        handle: Some(handle),
    }
}

/// Extended attributes of an entry that is not opened (a symlink or a
/// special file, or a hard link whose content is already known).
pub(crate) fn read_node_xattrs(ctx: &Ctx<'_>, path: &Path, loc: Loc<'_>, node: &mut Node) {
    match read_xattrs(&loc.sys_path(path)) {
        Ok(x) => node.xattrs = x,
        Err(e) => ctx.warn(path, format!("cannot read extended attributes: {e}")),
    }
}
