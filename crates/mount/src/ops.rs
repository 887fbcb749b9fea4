//! The FUSE operations: lookups, attributes, listings and reads answered
//! from the file system's state.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::sync::atomic::Ordering;

use capsule_format::tree::{Node, NodeKind};
use fuser::{
    Errno, FileHandle, FileType, Filesystem, Generation, INodeNo, LockOwner, OpenFlags, ReplyAttr,
    ReplyData, ReplyDirectory, ReplyEntry, ReplyOpen, ReplyStatfs, ReplyXattr, Request,
};

use super::fs::{
    ino_of, kind_of, lock, CapsuleFs, HOSTS, LATEST, ROOT, SNAPSHOTS, TTL_LISTS, VERSIONS,
};
use super::inodes::{At, What};

impl Filesystem for CapsuleFs {
    fn init(&mut self, _req: &Request, config: &mut fuser::KernelConfig) -> std::io::Result<()> {
        use fuser::InitFlags as F;
        // Attributes with every listing: a lookup per name saved. Not
        // only when the kernel guesses they are wanted
        // (`FUSE_READDIRPLUS_AUTO`): it guesses so for the first 4 KiB of
        // a listing only, since `ls -l` and `cp -r` read a whole directory
        // before they look at its entries, and every entry past those then
        // cost a LOOKUP (1,023 copying /usr/share/doc; `ls -l` of 100,000
        // files 7.2 s, now 4.5 s). A plain `ls -f` of 100,000 pays for it:
        // 0.09 s, now 0.38 s.
        let wanted = F::FUSE_DO_READDIRPLUS
                // Symlink targets kept by the kernel: a path through
                // `latest` otherwise costs a READLINK for every file
                // `cp -r` touches (12,475 of 24,000 requests copying
                // /usr/share/doc).
                | F::FUSE_CACHE_SYMLINKS
                // A directory listing the kernel keeps is dropped when
                // the directory's mtime changes (see `opendir`).
                | F::FUSE_AUTO_INVAL_DATA;
        // What this kernel has of it (each is an optimization).
        let has = config.capabilities();
        let _ = config.add_capabilities(wanted & has);
        self.bare_open = has.contains(F::FUSE_NO_OPEN_SUPPORT);
        self.bare_opendir = has.contains(F::FUSE_NO_OPENDIR_SUPPORT | F::FUSE_AUTO_INVAL_DATA);
        // Larger reads ahead of a reader in the kernel too.
        let _ = config.set_max_readahead(1 << 20);
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let parent = u64::from(parent);
        let Some(pw) = self.what(parent) else {
            return reply.error(Errno::ENOENT);
        };
        let name = name.as_bytes();
        let found = match self.tree_of(&pw) {
            Some(Ok((id, t))) => {
                let Ok(i) = t.binary_search_by(|n| n.name.as_slice().cmp(name)) else {
                    return reply.error(Errno::ENOENT);
                };
                // The node is in hand: its attributes cost no lookup.
                let what = What::Entry(At {
                    tree: id,
                    pos: i as u32,
                });
                let ttl = Self::ttl(&what);
                let ino = self.hold(parent, name, what);
                let attr = Self::entry_attr(ino, &t[i]);
                return reply.entry(&ttl, &attr, Generation(0));
            }
            Some(Err(e)) => return reply.error(e),
            None => {
                if pw_is_snapshots(&pw) {
                    let v = self.view();
                    v.by_name(name).map(|i| {
                        let (id, s) = &v.view.snapshots[i];
                        What::SnapRoot(*id, s.time_unix)
                    })
                } else {
                    match self.cached_listing(parent, &pw) {
                        Ok(l) => l
                            .iter()
                            .find(|(n, _, _)| n == name)
                            .map(|(_, w, _)| w.clone()),
                        Err(e) => return reply.error(e),
                    }
                }
            }
        };
        match found {
            Some(w) => {
                let ttl = Self::ttl(&w);
                match self.remember(parent, name, w) {
                    Ok(attr) => reply.entry(&ttl, &attr, Generation(0)),
                    Err(e) => reply.error(e),
                }
            }
            None => reply.error(Errno::ENOENT),
        }
    }

    fn forget(&self, _req: &Request, ino: INodeNo, nlookup: u64) {
        let ino = u64::from(ino);
        if ino <= LATEST {
            return;
        }
        self.let_go(ino, nlookup);
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        let ino = u64::from(ino);
        let what = self.what(ino);
        // A listing of snapshots the kernel keeps is used again only while
        // its directory's mtime, the time the view last changed, stays.
        if what.as_ref().is_some_and(lists_snapshots) {
            self.maybe_refresh();
        }
        match what.map(|w| (Self::ttl(&w), self.attr(ino, &w))) {
            Some((ttl, Ok(a))) => reply.attr(&ttl, &a),
            Some((_, Err(e))) => reply.error(e),
            None => reply.error(Errno::ENOENT),
        }
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        let ino = u64::from(ino);
        let Some(what) = self.what(ino) else {
            return reply.error(Errno::ENOENT);
        };
        match (&what, self.node(&what)) {
            (What::Link(t), _) => reply.data(t),
            (_, Some(Ok(n))) if n.kind() == NodeKind::Symlink => reply.data(&n.target),
            (_, Some(Err(e))) => reply.error(e),
            _ => reply.error(Errno::EINVAL),
        }
    }

    /// Opening a directory asks nothing of us either: answered ENOSYS, the
    /// kernel opens directories without a request from then on, sends no
    /// RELEASEDIR, and keeps what it read of a directory
    /// (`FOPEN_CACHE_DIR`): copying a tree of 1,000 directories costs
    /// 2,000 requests fewer. A kept listing is read again once its
    /// directory's mtime changes (`FUSE_AUTO_INVAL_DATA`), which for the
    /// directories listing snapshots is when the view last changed;
    /// inside a snapshot nothing changes.
    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        let Some(what) = self.what(u64::from(ino)) else {
            return reply.error(Errno::ENOENT);
        };
        match (&what, self.node(&what)) {
            (_, Some(Err(e))) => reply.error(e),
            (_, Some(Ok(n))) if n.kind() != NodeKind::Dir => reply.error(Errno::ENOTDIR),
            (What::Link(_), _) => reply.error(Errno::ENOTDIR),
            _ if self.bare_opendir => reply.error(Errno::ENOSYS),
            _ => reply.opened(FileHandle(0), fuser::FopenFlags::empty()),
        }
    }

    /// Opening a file asks nothing of us: answered ENOSYS, the kernel
    /// opens files without a request from then on (and sends no RELEASE),
    /// keeping their page cache (the kernel's default for such opens).
    /// Copying a tree out of the mount then costs a READ per file, not
    /// OPEN, READ and RELEASE.
    fn open(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        let Some(what) = self.what(u64::from(ino)) else {
            return reply.error(Errno::ENOENT);
        };
        match self.node(&what) {
            Some(Ok(n)) if n.kind() == NodeKind::File && self.bare_open => {
                reply.error(Errno::ENOSYS)
            }
            Some(Ok(n)) if n.kind() == NodeKind::File => {
                reply.opened(FileHandle(0), fuser::FopenFlags::FOPEN_KEEP_CACHE)
            }
            Some(Ok(_)) => reply.error(Errno::EINVAL),
            Some(Err(e)) => reply.error(e),
            None => reply.error(Errno::EISDIR),
        }
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let ino = u64::from(ino);
        let r = match self.reading(ino) {
            Ok(r) => r,
            Err(e) => return reply.error(e),
        };
        let in_order = r.next.swap(offset + u64::from(size), Ordering::Relaxed) == offset;
        let browser = self.view().view.browser.clone();
        match browser.read_at(&r.map, offset, size as usize, in_order) {
            Ok(b) => reply.data(&b),
            Err(e) => reply.error(self.failed(&self.path_of(ino), &e)),
        }
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let ino = u64::from(ino);
        let Some(w) = self.what(ino) else {
            return reply.error(Errno::ENOENT);
        };
        let parent = lock(&self.inos).parent(ino).unwrap_or(ROOT);
        // Offsets: 1 and 2 are "." and "..", then entry k at k + 3.
        let mut at = offset;
        if at == 0 {
            if reply.add(INodeNo(ino), 1, FileType::Directory, ".") {
                return reply.ok();
            }
            at = 1;
        }
        if at == 1 {
            if reply.add(INodeNo(parent), 2, FileType::Directory, "..") {
                return reply.ok();
            }
            at = 2;
        }
        let skip = (at - 2) as usize;
        match self.tree_of(&w) {
            Some(Ok((id, t))) => {
                for (k, n) in t.iter().enumerate().skip(skip) {
                    // The number a lookup gives, where it is known; a
                    // listing without attributes keeps nothing.
                    let at = At {
                        tree: id,
                        pos: k as u32,
                    };
                    let child = lock(&self.inos)
                        .known_entry_ino(at, ino)
                        .unwrap_or_else(|| ino_of(ino, &n.name));
                    let full = reply.add(
                        INodeNo(child),
                        k as u64 + 3,
                        kind_of(n),
                        OsStr::from_bytes(&n.name),
                    );
                    if full {
                        break;
                    }
                }
                reply.ok();
            }
            Some(Err(e)) => reply.error(e),
            None => match self.cached_listing(ino, &w) {
                Ok(l) => {
                    for (k, (name, what, kind)) in l.iter().enumerate().skip(skip) {
                        let child = match what {
                            What::HostsDir => HOSTS,
                            What::SnapshotsDir => SNAPSHOTS,
                            What::VersionsRoot => VERSIONS,
                            What::Link(target) if ino == ROOT => ino_of(LATEST, target),
                            _ => ino_of(ino, name),
                        };
                        if reply.add(INodeNo(child), k as u64 + 3, *kind, OsStr::from_bytes(name)) {
                            break;
                        }
                    }
                    reply.ok();
                }
                Err(e) => reply.error(e),
            },
        }
    }

    fn readdirplus(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: fuser::ReplyDirectoryPlus,
    ) {
        let ino = u64::from(ino);
        let Some(w) = self.what(ino) else {
            return reply.error(Errno::ENOENT);
        };
        let parent = lock(&self.inos).parent(ino).unwrap_or(ROOT);
        // "." and ".." carry attributes too, but the kernel takes no
        // reference on them: they are not counted as lookups.
        let mut at = offset;
        for (k, (name, i)) in [(".", ino), ("..", parent)].into_iter().enumerate() {
            if at == k as u64 {
                let attr = self.dir_attr(i, self.view().at);
                if reply.add(INodeNo(i), at + 1, name, &TTL_LISTS, &attr, Generation(0)) {
                    return reply.ok();
                }
                at += 1;
            }
        }
        let skip = (at - 2) as usize;
        // Entries as (name, what, their node if in hand): held as they
        // are numbered, let go again unless the reply took them.
        let mut add = |k: usize, name: &[u8], what: What, node: Option<&Node>| -> bool {
            let ttl = Self::ttl(&what);
            let child = self.hold(ino, name, what.clone());
            let attr = match node {
                Some(n) => Self::entry_attr(child, n),
                None => match self.attr(child, &what) {
                    Ok(a) => a,
                    // Listed without attributes the kernel would keep.
                    Err(_) => {
                        self.let_go(child, 1);
                        return false;
                    }
                },
            };
            let full = reply.add(
                INodeNo(child),
                k as u64 + 3,
                OsStr::from_bytes(name),
                &ttl,
                &attr,
                Generation(0),
            );
            if full {
                self.let_go(child, 1);
            }
            full
        };
        match self.tree_of(&w) {
            Some(Ok((id, t))) => {
                for (k, n) in t.iter().enumerate().skip(skip) {
                    let what = What::Entry(At {
                        tree: id,
                        pos: k as u32,
                    });
                    if add(k, &n.name, what, Some(n)) {
                        break;
                    }
                }
            }
            Some(Err(e)) => return reply.error(e),
            None => match self.cached_listing(ino, &w) {
                Ok(l) => {
                    for (k, (name, what, _)) in l.iter().enumerate().skip(skip) {
                        if add(k, name, what.clone(), None) {
                            break;
                        }
                    }
                }
                Err(e) => return reply.error(e),
            },
        }
        reply.ok();
    }

    fn getxattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        let Some(Some(Ok(n))) = self.what(u64::from(ino)).map(|w| self.node(&w)) else {
            return reply.error(Errno::NO_XATTR);
        };
        match n
            .xattrs
            .iter()
            .find(|(k, _)| k.as_slice() == name.as_bytes())
        {
            Some((_, v)) if size == 0 => reply.size(v.len() as u32),
            Some((_, v)) if v.len() <= size as usize => reply.data(v),
            Some(_) => reply.error(Errno::ERANGE),
            None => reply.error(Errno::NO_XATTR),
        }
    }

    fn listxattr(&self, _req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        let mut names = Vec::new();
        if let Some(Some(Ok(n))) = self.what(u64::from(ino)).map(|w| self.node(&w)) {
            for (k, _) in &n.xattrs {
                names.extend_from_slice(k);
                names.push(0);
            }
        }
        if size == 0 {
            reply.size(names.len() as u32);
        } else if names.len() <= size as usize {
            reply.data(&names);
        } else {
            reply.error(Errno::ERANGE);
        }
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        reply.statfs(0, 0, 0, 0, 0, 4096, 255, 4096);
    }
}

fn pw_is_snapshots(w: &What) -> bool {
    matches!(w, What::SnapshotsDir)
}

/// Whether directory `w` lists snapshots, or paths over all of them:
/// its listing changes when a backup or forget runs.
fn lists_snapshots(w: &What) -> bool {
    matches!(
        w,
        What::Root
            | What::SnapshotsDir
            | What::HostsDir
            | What::Host(_)
            | What::VersionsRoot
            | What::VersionsDir(_)
            | What::FileVersions(_)
    )
}
