//! Reading metadata from the local file system. Every call acts on the
//! link itself, never on what a symlink points to. (Restore applies
//! metadata through descriptors: see `restore::fsys`.)

use std::ffi::OsStr;
use std::fs::Metadata;
use std::os::fd::BorrowedFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use capsule_format::tree::{Node, NodeKind, Timestamp};

/// Fills a node's metadata fields from `lstat` results.
pub fn node_from_metadata(name: &OsStr, m: &Metadata) -> Node {
    let ft = m.file_type();
    use std::os::unix::fs::FileTypeExt;
    let kind = if ft.is_file() {
        NodeKind::File
    } else if ft.is_dir() {
        NodeKind::Dir
    } else if ft.is_symlink() {
        NodeKind::Symlink
    } else if ft.is_fifo() {
        NodeKind::Fifo
    } else if ft.is_char_device() {
        NodeKind::CharDev
    } else if ft.is_block_device() {
        NodeKind::BlockDev
    } else {
        NodeKind::Socket
    };
    Node {
        name: name.as_bytes().to_vec(),
        kind: Some(kind),
        mode: m.mode() & 0o7777,
        uid: m.uid(),
        gid: m.gid(),
        mtime: Timestamp {
            secs: m.mtime(),
            nanos: m.mtime_nsec() as u32,
        },
        atime: Timestamp {
            secs: m.atime(),
            nanos: m.atime_nsec() as u32,
        },
        ctime: Timestamp {
            secs: m.ctime(),
            nanos: m.ctime_nsec() as u32,
        },
        size: if kind == NodeKind::Dir { 0 } else { m.size() },
        device: m.dev(),
        inode: m.ino(),
        nlink: m.nlink(),
        rdev: if matches!(kind, NodeKind::CharDev | NodeKind::BlockDev) {
            m.rdev()
        } else {
            0
        },
        // Fewer allocated blocks than the size needs means holes.
        sparse: kind == NodeKind::File && m.blocks() * 512 + 4096 <= m.size(),
        ..Node::default()
    }
}

/// Where extended attributes are read from: a path (not following a
/// symlink at its end) or an open descriptor.
#[derive(Clone, Copy)]
pub enum XattrSource<'a> {
    /// `llistxattr`/`lgetxattr` on the path.
    Path(&'a Path),
    /// `flistxattr`/`fgetxattr` on the descriptor.
    Fd(BorrowedFd<'a>),
}

impl XattrSource<'_> {
    fn list(self, buf: &mut [u8]) -> rustix::io::Result<usize> {
        match self {
            XattrSource::Path(p) => rustix::fs::llistxattr(p, buf),
            XattrSource::Fd(fd) => rustix::fs::flistxattr(fd, buf),
        }
    }
    fn list_len(self) -> rustix::io::Result<usize> {
        match self {
            XattrSource::Path(p) => rustix::fs::llistxattr_query(p),
            XattrSource::Fd(fd) => rustix::fs::flistxattr_query(fd),
        }
    }
    fn get(self, name: &[u8], buf: &mut [u8]) -> rustix::io::Result<usize> {
        match self {
            XattrSource::Path(p) => rustix::fs::lgetxattr(p, name, buf),
            XattrSource::Fd(fd) => rustix::fs::fgetxattr(fd, name, buf),
        }
    }
    fn get_len(self, name: &[u8]) -> rustix::io::Result<usize> {
        match self {
            XattrSource::Path(p) => rustix::fs::lgetxattr_query(p, name),
            XattrSource::Fd(fd) => rustix::fs::fgetxattr_query(fd, name),
        }
    }
}

/// Reads extended attributes of `path` (not following symlinks), sorted by
/// name. File systems without xattr support yield an empty list.
pub fn read_xattrs(path: &Path) -> std::io::Result<Vec<(Vec<u8>, Vec<u8>)>> {
    read_xattrs_from(XattrSource::Path(path))
}

/// Reads extended attributes, sorted by name. File systems without xattr
/// support yield an empty list.
pub fn read_xattrs_from(src: XattrSource<'_>) -> std::io::Result<Vec<(Vec<u8>, Vec<u8>)>> {
    let mut names = vec![0u8; 1024];
    let n = loop {
        match src.list(&mut names[..]) {
            Ok(n) => break n,
            Err(e) if e == rustix::io::Errno::RANGE => {
                let need = src.list_len()?;
                names.resize(need.max(names.len() * 2), 0);
            }
            Err(e) if e == rustix::io::Errno::NOTSUP || e == rustix::io::Errno::NOSYS => {
                return Ok(Vec::new())
            }
            Err(e) => return Err(e.into()),
        }
    };
    let mut out = Vec::new();
    for name in names[..n].split(|&b| b == 0).filter(|s| !s.is_empty()) {
        let mut val = vec![0u8; 256];
        let len = loop {
            match src.get(name, &mut val[..]) {
                Ok(l) => break Some(l),
                Err(e) if e == rustix::io::Errno::RANGE => {
                    let need = src.get_len(name)?;
                    val.resize(need.max(val.len() * 2), 0);
                }
                // Removed between list and get (macOS says ENOATTR).
                Err(e) if e == rustix::io::Errno::NODATA => break None,
                #[cfg(target_os = "macos")]
                Err(e) if e == rustix::io::Errno::NOATTR => break None,
                Err(e) => return Err(e.into()),
            }
        };
        if let Some(len) = len {
            val.truncate(len);
            out.push((name.to_vec(), val));
        }
    }
    out.sort();
    Ok(out)
}

/// Fills a node's metadata fields from an `fstatat` (not following a
/// symlink) result: [`node_from_metadata`] for the walk's `*at` calls.
pub fn node_from_stat(name: &OsStr, st: &rustix::fs::Stat) -> Node {
    use rustix::fs::FileType;
    let (st_mode, st_dev, st_nlink, st_rdev) = crate::platform::widths(st);
    let (btime, file_flags) = crate::platform::mac_meta(st);
    let kind = match FileType::from_raw_mode(st.st_mode) {
        FileType::RegularFile => NodeKind::File,
        FileType::Directory => NodeKind::Dir,
        FileType::Symlink => NodeKind::Symlink,
        FileType::Fifo => NodeKind::Fifo,
        FileType::CharacterDevice => NodeKind::CharDev,
        FileType::BlockDevice => NodeKind::BlockDev,
        _ => NodeKind::Socket,
    };
    let size = st.st_size as u64;
    Node {
        name: name.as_bytes().to_vec(),
        kind: Some(kind),
        mode: st_mode & 0o7777,
        uid: st.st_uid,
        gid: st.st_gid,
        mtime: Timestamp {
            secs: st.st_mtime,
            nanos: st.st_mtime_nsec as u32,
        },
        atime: Timestamp {
            secs: st.st_atime,
            nanos: st.st_atime_nsec as u32,
        },
        ctime: Timestamp {
            secs: st.st_ctime,
            nanos: st.st_ctime_nsec as u32,
        },
        size: if kind == NodeKind::Dir { 0 } else { size },
        device: st_dev,
        inode: st.st_ino,
        nlink: st_nlink,
        rdev: if matches!(kind, NodeKind::CharDev | NodeKind::BlockDev) {
            st_rdev
        } else {
            0
        },
        sparse: kind == NodeKind::File && (st.st_blocks as u64) * 512 + 4096 <= size,
        btime,
        file_flags,
        ..Node::default()
    }
}

/// Whether this process can set arbitrary owners.
pub fn is_root() -> bool {
    rustix::process::geteuid().is_root()
}
