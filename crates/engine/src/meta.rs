//! Reading metadata from the local file system. Every call acts on the
//! link itself, never on what a symlink points to. (Restore applies
//! metadata through descriptors: see `restore::fsys`.)

use std::ffi::OsStr;
use std::fs::Metadata;
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

/// Reads extended attributes of `path` (not following symlinks), sorted by
/// name. File systems without xattr support yield an empty list.
pub fn read_xattrs(path: &Path) -> std::io::Result<Vec<(Vec<u8>, Vec<u8>)>> {
    let mut names = vec![0u8; 1024];
    let n = loop {
        match rustix::fs::llistxattr(path, &mut names[..]) {
            Ok(n) => break n,
            Err(e) if e == rustix::io::Errno::RANGE => {
                let need = rustix::fs::llistxattr_query(path)?;
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
            match rustix::fs::lgetxattr(path, name, &mut val[..]) {
                Ok(l) => break Some(l),
                Err(e) if e == rustix::io::Errno::RANGE => {
                    let need = rustix::fs::lgetxattr_query(path, name)?;
                    val.resize(need.max(val.len() * 2), 0);
                }
                // Removed between list and get.
                Err(e) if e == rustix::io::Errno::NODATA => break None,
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

/// Whether this process can set arbitrary owners.
pub fn is_root() -> bool {
    rustix::process::geteuid().is_root()
}
