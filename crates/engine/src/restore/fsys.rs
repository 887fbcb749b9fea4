//! The restore target, reached only through directory file descriptors.
//!
//! Every entry is created and opened relative to its parent directory's
//! descriptor with `O_NOFOLLOW`, and every directory is opened with
//! `O_DIRECTORY|O_NOFOLLOW`. So no symlink (planted in the target before the
//! restore, or swapped in by another process while it runs) can make a
//! write land outside the target, and no path is ever longer than one name,
//! so `PATH_MAX` does not limit the depth of what restores.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::fs::File;
use std::io::{Error, ErrorKind};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::{Arc, Mutex};

use capsule_format::tree::{NodeKind, Timestamp};

use super::item::Item;
use rustix::fs::{AtFlags, FileType, Mode, OFlags, Timespec, Timestamps, XattrFlags};

/// Directory descriptors kept open at once. Deeper trees reopen what was
/// dropped (each open is one `openat` per missing ancestor).
const MAX_DIR_FDS: usize = 256;

/// Where each planned entry lives: its parent directory (an index into the
/// same list, `None` for the target itself) and its name.
pub(super) trait Layout: Sync {
    fn parent(&self, i: usize) -> Option<usize>;
    fn name(&self, i: usize) -> &[u8];
}

/// Where entry `i` of `layout` is below `root`: its names up the parent
/// chain (paths are built when a message needs one, not held per entry).
pub(super) fn path_in<L: Layout + ?Sized>(layout: &L, root: &Path, i: usize) -> std::path::PathBuf {
    let mut names = Vec::new();
    let mut at = Some(i);
    while let Some(j) = at {
        names.push(OsStr::from_bytes(layout.name(j)));
        at = layout.parent(j);
    }
    let mut p = root.to_path_buf();
    p.extend(names.into_iter().rev());
    p
}

/// The target directory and a bounded cache of its subdirectories'
/// descriptors.
pub(super) struct Target<'a, L: Layout> {
    root: Arc<OwnedFd>,
    /// The target's path, for messages only.
    root_path: std::path::PathBuf,
    layout: &'a L,
    dirs: Mutex<HashMap<usize, Arc<OwnedFd>>>,
    /// This process's ID, in the names files are written under until they
    /// are complete ([`PART_PREFIX`]).
    pid: u32,
}

/// A file is written under `.capsule-part-<pid>-<entry>` (hex) in its own
/// directory and renamed to its name only once its content and metadata are
/// complete, so a restore killed at any point never leaves a file under its
/// real name with the snapshot's size and wrong content. The next restore
/// into the same directory removes what a dead restore left
/// ([`Target::remove_leftovers`]).
pub(super) const PART_PREFIX: &str = ".capsule-part-";

/// The process that wrote a part file named `name`, if `name` is one.
fn part_owner(name: &[u8]) -> Option<u32> {
    let rest = name.strip_prefix(PART_PREFIX.as_bytes())?;
    let rest = std::str::from_utf8(rest).ok()?;
    let (pid, entry) = rest.split_once('-')?;
    let hex = |s: &str| !s.is_empty() && s.len() <= 16 && s.bytes().all(|b| b.is_ascii_hexdigit());
    if !hex(pid) || !hex(entry) {
        return None;
    }
    u32::from_str_radix(pid, 16).ok()
}

fn dir_flags() -> OFlags {
    OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC
}

fn in_the_way(what: &str) -> Error {
    Error::new(
        ErrorKind::AlreadyExists,
        format!("{what} is in the way; refusing to follow or replace it"),
    )
}

impl<'a, L: Layout> Target<'a, L> {
    /// Opens the target directory, which must already exist. It is opened
    /// by path once; everything below it by descriptor.
    pub(super) fn open(path: &Path, layout: &'a L) -> std::io::Result<Self> {
        let root = rustix::fs::open(path, dir_flags(), Mode::empty())?;
        Ok(Self::opened(Arc::new(root), path, layout))
    }

    /// The target directory, opened by the caller (`path` names it).
    pub(super) fn opened(root: Arc<OwnedFd>, path: &Path, layout: &'a L) -> Self {
        Target {
            root,
            root_path: path.to_path_buf(),
            layout,
            dirs: Mutex::new(HashMap::new()),
            pid: std::process::id(),
        }
    }

    /// Where entry `i` is, for messages (calls go through descriptors).
    pub(super) fn path(&self, i: usize) -> std::path::PathBuf {
        path_in(self.layout, &self.root_path, i)
    }

    /// The descriptor of directory entry `dir` (`None`: the target).
    pub(super) fn dir(&self, dir: Option<usize>) -> std::io::Result<Arc<OwnedFd>> {
        let Some(d) = dir else {
            return Ok(self.root.clone());
        };
        if let Some(fd) = self.lock().get(&d) {
            return Ok(fd.clone());
        }
        let parent = self.dir(self.layout.parent(d))?;
        let fd = Arc::new(rustix::fs::openat(
            &*parent,
            OsStr::from_bytes(self.layout.name(d)),
            dir_flags(),
            Mode::empty(),
        )?);
        let mut cache = self.lock();
        if cache.len() >= MAX_DIR_FDS {
            cache.clear();
        }
        cache.insert(d, fd.clone());
        Ok(fd)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<usize, Arc<OwnedFd>>> {
        self.dirs.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn at(&self, i: usize) -> std::io::Result<(Arc<OwnedFd>, &OsStr)> {
        Ok((
            self.dir(self.layout.parent(i))?,
            OsStr::from_bytes(self.layout.name(i)),
        ))
    }

    /// The name file `i` is written under until it is complete.
    fn part(&self, i: usize) -> std::io::Result<(Arc<OwnedFd>, String)> {
        Ok((
            self.dir(self.layout.parent(i))?,
            format!("{PART_PREFIX}{:x}-{i:x}", self.pid),
        ))
    }

    /// Creates directory `i`, accepting a real directory already there and
    /// refusing anything else (a symlink above all). Returns whether it was
    /// there before.
    pub(super) fn mkdir(&self, i: usize) -> std::io::Result<bool> {
        let (p, name) = self.at(i)?;
        match rustix::fs::mkdirat(&*p, name, Mode::from_raw_mode(0o700)) {
            Ok(()) => Ok(false),
            Err(e) if e == rustix::io::Errno::EXIST => {
                let st = rustix::fs::statat(&*p, name, AtFlags::SYMLINK_NOFOLLOW)?;
                if FileType::from_raw_mode(st.st_mode) == FileType::Directory {
                    Ok(true)
                } else {
                    Err(in_the_way("a non-directory (possibly a symlink)"))
                }
            }
            Err(e) => Err(e.into()),
        }
    }

    /// Removes what is at entry `i`'s place, unless it is a directory.
    pub(super) fn remove_existing(&self, i: usize) -> std::io::Result<()> {
        let (p, name) = self.at(i)?;
        match rustix::fs::statat(&*p, name, AtFlags::SYMLINK_NOFOLLOW) {
            Ok(st) if FileType::from_raw_mode(st.st_mode) == FileType::Directory => {
                Err(in_the_way("a directory"))
            }
            Ok(_) => Ok(rustix::fs::unlinkat(&*p, name, AtFlags::empty())?),
            Err(e) if e == rustix::io::Errno::NOENT => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    /// Creates regular file `i` afresh under its part name ([`PART_PREFIX`])
    /// with its final length, and returns it with its identity. What is at
    /// its real name stays until [`Target::commit_file`].
    pub(super) fn create_file(&self, i: usize, len: u64) -> std::io::Result<(File, FileId)> {
        let (p, part) = self.part(i)?;
        let create = || {
            rustix::fs::openat(
                &*p,
                part.as_str(),
                OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                Mode::from_raw_mode(0o600),
            )
        };
        let fd = match create() {
            // A part file of this process's ID is a dead restore's (or an
            // earlier failed attempt's): never another's live work.
            Err(e) if e == rustix::io::Errno::EXIST => {
                rustix::fs::unlinkat(&*p, part.as_str(), AtFlags::empty())?;
                create()?
            }
            r => r?,
        };
        let f = File::from(fd);
        // The final length first: sparse files keep their holes, and the
        // blobs can then be written in any order.
        f.set_len(len)?;
        let id = FileId::of(&f)?;
        Ok((f, id))
    }

    /// Opens file `i` again for writing, only if it is still the file this
    /// restore created.
    pub(super) fn reopen_file(&self, i: usize, id: FileId) -> std::io::Result<File> {
        let (p, part) = self.part(i)?;
        let fd = rustix::fs::openat(
            &*p,
            part.as_str(),
            OFlags::WRONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )?;
        let f = File::from(fd);
        if FileId::of(&f)? != id {
            return Err(in_the_way("another file (replaced during the restore)"));
        }
        Ok(f)
    }

    /// Gives complete file `i` its real name, replacing a file or symlink
    /// there (never following it) and refusing a directory.
    pub(super) fn commit_file(&self, i: usize, id: FileId) -> std::io::Result<()> {
        let (p, part) = self.part(i)?;
        let name = OsStr::from_bytes(self.layout.name(i));
        let st = rustix::fs::statat(&*p, part.as_str(), AtFlags::SYMLINK_NOFOLLOW)?;
        if (st.st_dev as u64, st.st_ino as u64) != (id.dev, id.ino) {
            return Err(in_the_way("another file (replaced during the restore)"));
        }
        match rustix::fs::renameat(&*p, part.as_str(), &*p, name) {
            Ok(()) => Ok(()),
            Err(e) if e == rustix::io::Errno::ISDIR || e == rustix::io::Errno::NOTEMPTY => {
                Err(in_the_way("a directory"))
            }
            Err(e) => Err(e.into()),
        }
    }

    /// Removes file `i`'s part file if it is still the one this restore
    /// created (the file was not completed).
    pub(super) fn remove_file(&self, i: usize, id: FileId) -> std::io::Result<()> {
        let (p, part) = self.part(i)?;
        let st = rustix::fs::statat(&*p, part.as_str(), AtFlags::SYMLINK_NOFOLLOW)?;
        if (st.st_dev as u64, st.st_ino as u64) == (id.dev, id.ino) {
            rustix::fs::unlinkat(&*p, part.as_str(), AtFlags::empty())?;
        }
        Ok(())
    }

    /// Removes the part files a dead restore left in directory `dir`
    /// (`None`: the target). A live restore's (another process writing
    /// into the same target) are left alone. Returns how many went.
    pub(super) fn remove_leftovers(&self, dir: Option<usize>) -> std::io::Result<u64> {
        let fd = self.dir(dir)?;
        let mut removed = 0;
        for e in rustix::fs::Dir::read_from(&*fd)? {
            let e = e?;
            let name = e.file_name();
            let Some(pid) = part_owner(name.to_bytes()) else {
                continue;
            };
            if pid != self.pid && crate::platform::alive(pid) {
                continue;
            }
            let st = rustix::fs::statat(&*fd, name, AtFlags::SYMLINK_NOFOLLOW)?;
            if FileType::from_raw_mode(st.st_mode) == FileType::RegularFile {
                rustix::fs::unlinkat(&*fd, name, AtFlags::empty())?;
                removed += 1;
            }
        }
        Ok(removed)
    }

    /// What is at entry `i`'s place now (not following a symlink), if
    /// anything.
    pub(super) fn stat(&self, i: usize) -> std::io::Result<Option<rustix::fs::Stat>> {
        let (p, name) = self.at(i)?;
        match rustix::fs::statat(&*p, name, AtFlags::SYMLINK_NOFOLLOW) {
            Ok(st) => Ok(Some(st)),
            Err(e) if e == rustix::io::Errno::NOENT => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    /// Opens regular file `i` for reading, never through a symlink.
    pub(super) fn open_read(&self, i: usize) -> std::io::Result<File> {
        let (p, name) = self.at(i)?;
        let fd = rustix::fs::openat(
            &*p,
            name,
            OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )?;
        Ok(File::from(fd))
    }

    /// Names in directory `dir` (`None`: the target), without `.` and `..`.
    pub(super) fn list(&self, dir: Option<usize>) -> std::io::Result<Vec<Vec<u8>>> {
        let fd = self.dir(dir)?;
        let mut out = Vec::new();
        for e in rustix::fs::Dir::read_from(&*fd)? {
            let name = e?.file_name().to_bytes().to_vec();
            if name != b"." && name != b".." {
                out.push(name);
            }
        }
        Ok(out)
    }

    /// Removes `name` from directory `dir` and, if it is a directory,
    /// everything below it, all by descriptor. Returns the entries removed;
    /// with `dry`, removes nothing and counts what would go.
    pub(super) fn remove_all(
        &self,
        dir: Option<usize>,
        name: &[u8],
        dry: bool,
    ) -> std::io::Result<u64> {
        let p = self.dir(dir)?;
        remove_all_at(&p, OsStr::from_bytes(name), 0, dry)
    }

    /// Makes entry `i` a hard link to file `to`.
    pub(super) fn hard_link(&self, to: usize, i: usize) -> std::io::Result<()> {
        self.remove_existing(i)?;
        let (tp, tname) = self.at(to)?;
        let (p, name) = self.at(i)?;
        // Flags 0: a symlink at the source is linked, never followed.
        rustix::fs::linkat(&*tp, tname, &*p, name, AtFlags::empty())?;
        Ok(())
    }

    /// Restores a symlink, FIFO or device with its metadata. Returns false
    /// for sockets, which cannot be recreated meaningfully.
    pub(super) fn special(&self, i: usize, node: &Item) -> std::io::Result<bool> {
        let ft = match node.kind() {
            NodeKind::Symlink => None,
            NodeKind::Fifo => Some(FileType::Fifo),
            NodeKind::CharDev => Some(FileType::CharacterDevice),
            NodeKind::BlockDev => Some(FileType::BlockDevice),
            NodeKind::Socket | NodeKind::File | NodeKind::Dir => return Ok(false),
        };
        self.remove_existing(i)?;
        let (p, name) = self.at(i)?;
        match ft {
            None => rustix::fs::symlinkat(OsStr::from_bytes(node.target()), &*p, name)?,
            Some(ft) => {
                crate::platform::mknodat(&*p, name, ft, Mode::from_raw_mode(0o600), node.rdev())?
            }
        }
        self.meta_at(i, node)?;
        Ok(true)
    }

    /// Applies a symlink's or special file's metadata by name, never
    /// following a link. (Opening a FIFO or device to use its descriptor
    /// could block or have effects.)
    fn meta_at(&self, i: usize, node: &Item) -> std::io::Result<()> {
        let (p, name) = self.at(i)?;
        let mut first = None;
        // The owner first: a chown clears setuid bits the mode then sets.
        if crate::meta::is_root() {
            let r = rustix::fs::chownat(
                &*p,
                name,
                owner(node).0,
                owner(node).1,
                AtFlags::SYMLINK_NOFOLLOW,
            );
            if let Err(e) = r {
                first.get_or_insert(e.into());
            }
        }
        if let Err(e) = special_meta(&p, name, node) {
            first.get_or_insert(e);
        }
        if let Err(e) = rustix::fs::utimensat(&*p, name, &times(node), AtFlags::SYMLINK_NOFOLLOW) {
            first.get_or_insert(e.into());
        }
        first.map_or(Ok(()), Err)
    }

    /// Applies directory `i`'s metadata through its descriptor.
    pub(super) fn dir_meta(&self, i: usize, node: &Item) -> std::io::Result<()> {
        let fd = self.dir(Some(i))?;
        apply_fd_meta(&*fd, node)
    }
}

/// Depth below which `remove_all` refuses to go (a crafted or looping
/// tree would otherwise exhaust the stack).
const MAX_REMOVE_DEPTH: usize = 512;

pub(super) fn remove_all_at(
    parent: &OwnedFd,
    name: &OsStr,
    depth: usize,
    dry: bool,
) -> std::io::Result<u64> {
    let st = rustix::fs::statat(parent, name, AtFlags::SYMLINK_NOFOLLOW)?;
    if FileType::from_raw_mode(st.st_mode) != FileType::Directory {
        if !dry {
            rustix::fs::unlinkat(parent, name, AtFlags::empty())?;
        }
        return Ok(1);
    }
    if depth >= MAX_REMOVE_DEPTH {
        return Err(Error::other("directory tree too deep to remove"));
    }
    let fd = rustix::fs::openat(parent, name, dir_flags(), Mode::empty())?;
    let mut names = Vec::new();
    for e in rustix::fs::Dir::read_from(&fd)? {
        let n = e?.file_name().to_bytes().to_vec();
        if n != b"." && n != b".." {
            names.push(n);
        }
    }
    let mut removed = 0;
    for n in names {
        removed += remove_all_at(&fd, OsStr::from_bytes(&n), depth + 1, dry)?;
    }
    if !dry {
        rustix::fs::unlinkat(parent, name, AtFlags::REMOVEDIR)?;
    }
    Ok(removed + 1)
}

/// Which inode a created file is, so it is never confused with a file
/// another process put in its place. (Once restore has closed a file and
/// someone deleted it, a new file may get the same inode number; it is
/// still reached through restore's own directory descriptor, so this can
/// never lead outside the target.)
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct FileId {
    dev: u64,
    ino: u64,
}

impl FileId {
    fn of(f: &File) -> std::io::Result<Self> {
        let st = rustix::fs::fstat(f)?;
        Ok(FileId {
            dev: st.st_dev as u64,
            ino: st.st_ino as u64,
        })
    }
}

fn ts(t: Timestamp) -> Timespec {
    Timespec {
        tv_sec: t.secs,
        tv_nsec: t.nanos as _,
    }
}

fn times(node: &Item) -> Timestamps {
    Timestamps {
        last_access: ts(node.atime()),
        last_modification: ts(node.mtime()),
    }
}

/// A special file's or symlink's extended attributes and (not for a
/// symlink) permissions, never following a link. Linux: through an
/// `O_PATH` descriptor of the entry and its `/proc/self/fd` link, which
/// names exactly that inode (`fchmod` refuses `O_PATH` descriptors).
#[cfg(target_os = "linux")]
fn special_meta(dir: &OwnedFd, name: &OsStr, node: &Item) -> std::io::Result<()> {
    let mut first: Option<std::io::Error> = None;
    let fd = rustix::fs::openat(
        dir,
        name,
        OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    let proc = format!("/proc/self/fd/{}", std::os::fd::AsRawFd::as_raw_fd(&fd));
    for (k, v) in node.xattrs() {
        if let Err(e) = rustix::fs::lsetxattr(&proc, &k[..], v, XattrFlags::empty()) {
            first.get_or_insert(e.into());
        }
    }
    if node.kind() != NodeKind::Symlink {
        if let Err(e) = rustix::fs::chmod(&proc, mode_of(node)) {
            first.get_or_insert(e.into());
        }
    }
    first.map_or(Ok(()), Err)
}

/// macOS: permissions by `fchmodat(AT_SYMLINK_NOFOLLOW)`, which it
/// honours; extended attributes by the restore directory's own path
/// (`F_GETPATH`) with `XATTR_NOFOLLOW`: a directory capsule made for the
/// restore, so no other user's link is on the way.
#[cfg(not(target_os = "linux"))]
fn special_meta(dir: &OwnedFd, name: &OsStr, node: &Item) -> std::io::Result<()> {
    use std::os::unix::ffi::OsStringExt;
    let mut first: Option<std::io::Error> = None;
    if !node.xattrs().is_empty() {
        let d = rustix::fs::getpath(dir)?;
        let path =
            std::path::PathBuf::from(std::ffi::OsString::from_vec(d.into_bytes())).join(name);
        for (k, v) in node.xattrs() {
            if let Err(e) = rustix::fs::lsetxattr(&path, &k[..], v, XattrFlags::empty()) {
                first.get_or_insert(e.into());
            }
        }
    }
    if node.kind() != NodeKind::Symlink {
        if let Err(e) = rustix::fs::chmodat(dir, name, mode_of(node), AtFlags::SYMLINK_NOFOLLOW) {
            first.get_or_insert(e.into());
        }
    }
    first.map_or(Ok(()), Err)
}

/// The node's permission bits as the system's mode type.
fn mode_of(node: &Item) -> Mode {
    Mode::from_raw_mode((node.mode & 0o7777) as rustix::fs::RawMode)
}

/// Applies xattrs, owner (as root), mode and times to an open file or
/// directory. Times go last: the others would change ctime only, but
/// writing xattrs can touch mtime on some file systems.
pub(super) fn apply_fd_meta(fd: impl AsFd, node: &Item) -> std::io::Result<()> {
    let fd = fd.as_fd();
    let mut first: Option<Error> = None;
    for (k, v) in node.xattrs() {
        if let Err(e) = rustix::fs::fsetxattr(fd, &k[..], v, XattrFlags::empty()) {
            first.get_or_insert(e.into());
        }
    }
    if crate::meta::is_root() {
        let (uid, gid) = owner(node);
        let r = rustix::fs::fchown(fd, uid, gid);
        if let Err(e) = r {
            first.get_or_insert(e.into());
        }
    }
    if let Err(e) = rustix::fs::fchmod(fd, mode_of(node)) {
        first.get_or_insert(e.into());
    }
    if let Err(e) = rustix::fs::futimens(fd, &times(node)) {
        first.get_or_insert(e.into());
    }
    if let Err(e) = crate::platform::set_mac_meta(fd, node.btime(), node.file_flags()) {
        first.get_or_insert(e);
    }
    first.map_or(Ok(()), Err)
}

/// The owner to give a restored entry. An id of -1 asks chown to leave the
/// id unchanged (and rustix refuses to build it): no real owner has it, so
/// a tree that says so, which only a crafted one does, changes nothing.
fn owner(node: &Item) -> (Option<rustix::fs::Uid>, Option<rustix::fs::Gid>) {
    (
        (node.uid != u32::MAX).then(|| rustix::fs::Uid::from_raw(node.uid)),
        (node.gid != u32::MAX).then(|| rustix::fs::Gid::from_raw(node.gid)),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    /// Entry 0 is directory "d" in the target, entry 1 file "f" in it.
    struct Two;
    impl Layout for Two {
        fn parent(&self, i: usize) -> Option<usize> {
            (i == 1).then_some(0)
        }
        fn name(&self, i: usize) -> &[u8] {
            [b"d", b"f"][i]
        }
    }

    #[test]
    fn a_directory_swapped_for_a_symlink_after_creation_is_not_followed() {
        let t = tempfile::tempdir().unwrap();
        let (target, outside) = (t.path().join("target"), t.path().join("outside"));
        std::fs::create_dir_all(&target).unwrap();
        std::fs::create_dir_all(&outside).unwrap();
        let fs = Target::open(&target, &Two).unwrap();
        fs.mkdir(0).unwrap();
        // Another process swaps the new directory for a symlink to outside.
        std::fs::rename(target.join("d"), t.path().join("moved")).unwrap();
        std::os::unix::fs::symlink(&outside, target.join("d")).unwrap();
        let err = fs.create_file(1, 5).unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc_eloop_or_enotdir(&err)));
        assert_eq!(std::fs::read_dir(&outside).unwrap().count(), 0);
        // The same swap once the directory is open: the write lands in the
        // directory that was created (wherever it was moved), never
        // through the symlink.
        std::fs::remove_file(target.join("d")).unwrap();
        std::fs::rename(t.path().join("moved"), target.join("d")).unwrap();
        let fs = Target::open(&target, &Two).unwrap();
        let _ = fs.dir(Some(0)).unwrap();
        std::fs::rename(target.join("d"), t.path().join("moved")).unwrap();
        std::os::unix::fs::symlink(&outside, target.join("d")).unwrap();
        let (mut f, id) = fs.create_file(1, 0).unwrap();
        f.write_all(b"x").unwrap();
        fs.commit_file(1, id).unwrap();
        assert_eq!(std::fs::read_dir(&outside).unwrap().count(), 0);
        assert_eq!(std::fs::read(t.path().join("moved/f")).unwrap(), b"x");
    }

    fn libc_eloop_or_enotdir(e: &Error) -> i32 {
        // openat(O_DIRECTORY|O_NOFOLLOW) on a symlink: ELOOP (or ENOTDIR
        // on some kernels).
        match e.raw_os_error() {
            Some(n) if n == rustix::io::Errno::NOTDIR.raw_os_error() => n,
            _ => rustix::io::Errno::LOOP.raw_os_error(),
        }
    }

    #[test]
    fn a_file_replaced_by_another_is_not_reopened_or_removed() {
        let t = tempfile::tempdir().unwrap();
        let target = t.path().join("target");
        std::fs::create_dir_all(target.join("d")).unwrap();
        let fs = Target::open(&target, &Two).unwrap();
        // Held open, as restore holds a file it is writing: the inode
        // cannot be freed and handed to the replacement.
        let (_held, id) = fs.create_file(1, 3).unwrap();
        let part = target.join(format!("d/{PART_PREFIX}{:x}-1", std::process::id()));
        assert!(
            !target.join("d/f").exists(),
            "only complete files get their name"
        );
        std::fs::remove_file(&part).unwrap();
        std::fs::write(&part, b"someone else's").unwrap();
        assert!(fs.reopen_file(1, id).is_err());
        assert!(fs.commit_file(1, id).is_err());
        fs.remove_file(1, id).unwrap();
        assert_eq!(std::fs::read(&part).unwrap(), b"someone else's");
        assert!(!target.join("d/f").exists());
    }

    #[test]
    fn part_files_are_recognised_by_their_exact_shape() {
        assert_eq!(part_owner(b".capsule-part-1f-a"), Some(0x1f));
        for n in [
            &b".capsule-part-"[..],
            b".capsule-part-1f",
            b".capsule-part-1f-",
            b".capsule-part-xyz-1",
            b".capsule-part-1-2-3",
            b"capsule-part-1-2",
            b"report.txt",
        ] {
            assert_eq!(part_owner(n), None, "{}", String::from_utf8_lossy(n));
        }
    }
}
