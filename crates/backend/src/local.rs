//! A repository in a local directory (which may be a mounted network share).
//!
//! Write path: data goes to a uniquely named temporary file in the target
//! directory, is fsynced, then linked into place with `renameat2(NOREPLACE)`
//! (falling back to `link`+`unlink` where the file system lacks it), and the
//! directory is fsynced. A crash at any point leaves either no object or the
//! complete object; stray `.tmp-*` files are invisible to `list`, and a
//! prune removes old ones (`list_temporaries`).

use std::fs::{self, File, OpenOptions};
use std::io::{ErrorKind as IoKind, Read, Seek, SeekFrom, Write};
use std::ops::Range;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use rustix::fs::{renameat_with, RenameFlags, CWD};

use crate::contract::{
    validate_name, Backend, BackendError, Capabilities, ErrorKind, LabBackend, ObjectInfo, Space,
};

/// When writes reach stable storage.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SyncPolicy {
    /// fsync each object and its directory before `put` returns (default).
    Sync,
    /// Leave flushing to the OS: much faster on shares that force sync
    /// writes, at the risk of losing the newest objects in a power cut (the
    /// snapshot is still written last, so a crash loses whole backups at most
    /// if the OS reorders writes).
    NoSync,
}

/// Local directory backend.
#[derive(Debug)]
pub struct LocalBackend {
    root: PathBuf,
    sync: SyncPolicy,
}

fn io_err(op: &'static str, name: &str, e: std::io::Error) -> BackendError {
    let kind = match e.kind() {
        IoKind::NotFound => ErrorKind::NotFound,
        IoKind::AlreadyExists => ErrorKind::AlreadyExists,
        IoKind::PermissionDenied => ErrorKind::PermissionDenied,
        IoKind::StorageFull => ErrorKind::NoSpace,
        _ if e.raw_os_error() == Some(libc_enospc()) => ErrorKind::NoSpace,
        _ => ErrorKind::Io,
    };
    let mut err = BackendError::new(kind, op, name, e.to_string());
    err.transient = matches!(e.kind(), IoKind::Interrupted | IoKind::TimedOut);
    err
}

fn libc_enospc() -> i32 {
    rustix::io::Errno::NOSPC.raw_os_error()
}

impl LocalBackend {
    /// Opens a backend rooted at `root`, which must exist.
    pub fn open(root: impl Into<PathBuf>, sync: SyncPolicy) -> Result<Self, BackendError> {
        let root = root.into();
        match fs::metadata(&root) {
            Ok(m) if m.is_dir() => Ok(LocalBackend { root, sync }),
            Ok(_) => Err(BackendError::new(
                ErrorKind::Io,
                "open",
                &root.display().to_string(),
                "not a directory",
            )),
            Err(e) => Err(io_err("open", &root.display().to_string(), e)),
        }
    }

    /// Creates `root` (and parents) if needed, then opens it.
    pub fn create(root: impl Into<PathBuf>, sync: SyncPolicy) -> Result<Self, BackendError> {
        let root = root.into();
        fs::create_dir_all(&root).map_err(|e| io_err("create", &root.display().to_string(), e))?;
        Self::open(root, sync)
    }

    /// The root directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    fn path(&self, name: &str) -> PathBuf {
        self.root.join(name)
    }

    fn sync_dir(&self, dir: &Path) -> std::io::Result<()> {
        if self.sync == SyncPolicy::Sync {
            File::open(dir)?.sync_all()?;
        }
        Ok(())
    }

    /// Objects below `prefix`, or (with `temps`) only the temporaries.
    fn walk(&self, prefix: &str, temps: bool) -> Result<Vec<ObjectInfo>, BackendError> {
        let mut out = Vec::new();
        let start = self.root.join(prefix.trim_end_matches('/'));
        let mut stack = vec![(start, prefix.trim_end_matches('/').to_string())];
        while let Some((dir, rel)) = stack.pop() {
            let rd = match fs::read_dir(&dir) {
                Ok(rd) => rd,
                Err(e) if e.kind() == IoKind::NotFound => continue,
                Err(e) => return Err(io_err("list", prefix, e)),
            };
            // An entry may go between the directory read and its stat: a
            // temporary renamed into place by a backup, a pack deleted by a
            // prune. Listings run beside both, so a vanished entry is
            // simply not listed.
            let gone = |e: &std::io::Error| e.kind() == IoKind::NotFound;
            for e in rd {
                let e = match e {
                    Ok(e) => e,
                    Err(e) if gone(&e) => continue,
                    Err(e) => return Err(io_err("list", prefix, e)),
                };
                let fname = e.file_name().to_string_lossy().into_owned();
                let is_temp = fname.starts_with(capsule_format::layout::TEMP_PREFIX);
                let child = if rel.is_empty() {
                    fname
                } else {
                    format!("{rel}/{fname}")
                };
                let ft = match e.file_type() {
                    Ok(ft) => ft,
                    Err(e) if gone(&e) => continue,
                    Err(e) => return Err(io_err("list", prefix, e)),
                };
                if ft.is_dir() {
                    stack.push((e.path(), child));
                } else if ft.is_file() && is_temp == temps {
                    let m = match e.metadata() {
                        Ok(m) => m,
                        Err(e) if gone(&e) => continue,
                        Err(e) => return Err(io_err("list", prefix, e)),
                    };
                    out.push(ObjectInfo {
                        name: child,
                        size: m.len(),
                        modified: unix_mtime(&m),
                    });
                }
            }
        }
        Ok(out)
    }

    /// The shared body of `put` and `put_stream`: `fill` writes the bytes
    /// into a fresh temporary, which then takes the name unless it exists.
    fn put_with(
        &self,
        name: &str,
        fill: &mut dyn FnMut(&mut File) -> std::io::Result<()>,
    ) -> Result<(), BackendError> {
        validate_name(name)?;
        let dst = self.path(name);
        let dir = dst.parent().unwrap_or(&self.root).to_path_buf();
        let tmp = match self.write_tmp_with(&dir, fill) {
            Ok(t) => t,
            Err(e) if e.kind() == IoKind::NotFound => {
                fs::create_dir_all(&dir).map_err(|e| io_err("put", name, e))?;
                if let Some(parent) = dir.parent() {
                    self.sync_dir(parent).map_err(|e| io_err("put", name, e))?;
                }
                self.write_tmp_with(&dir, fill)
                    .map_err(|e| io_err("put", name, e))?
            }
            Err(e) => return Err(io_err("put", name, e)),
        };
        if let Err(e) = place_no_replace(&tmp, &dst) {
            let _ = fs::remove_file(&tmp);
            return Err(io_err("put", name, e));
        }
        self.sync_dir(&dir).map_err(|e| io_err("put", name, e))
    }

    fn write_tmp_with(
        &self,
        dir: &Path,
        fill: &mut dyn FnMut(&mut File) -> std::io::Result<()>,
    ) -> std::io::Result<PathBuf> {
        let mut rnd = [0u8; 8];
        getrandom::fill(&mut rnd).map_err(|e| std::io::Error::other(e.to_string()))?;
        let tmp = dir.join(format!(
            "{}{}",
            capsule_format::layout::TEMP_PREFIX,
            hex::encode(rnd)
        ));
        let mut f = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)?;
        let res = fill(&mut f).and_then(|_| {
            if self.sync == SyncPolicy::Sync {
                f.sync_all()
            } else {
                Ok(())
            }
        });
        if let Err(e) = res {
            let _ = fs::remove_file(&tmp);
            return Err(e);
        }
        Ok(tmp)
    }
}

/// Moves `tmp` to `dst` unless `dst` exists.
fn place_no_replace(tmp: &Path, dst: &Path) -> std::io::Result<()> {
    match renameat_with(CWD, tmp, CWD, dst, RenameFlags::NOREPLACE) {
        Ok(()) => Ok(()),
        Err(e) if e == rustix::io::Errno::EXIST => Err(IoKind::AlreadyExists.into()),
        // File systems without RENAME_NOREPLACE (some FUSE and network
        // mounts): a hard link is also atomic and refuses to replace.
        Err(e) if e == rustix::io::Errno::INVAL || e == rustix::io::Errno::NOSYS => {
            match fs::hard_link(tmp, dst) {
                Ok(()) => {
                    fs::remove_file(tmp)?;
                    Ok(())
                }
                Err(e) if e.kind() == IoKind::AlreadyExists => Err(e),
                // No hard links either (some SMB mounts): check, then rename.
                // Two writers of the same content-addressed name write the
                // same bytes, so the remaining race is harmless.
                Err(_) => {
                    if dst.symlink_metadata().is_ok() {
                        return Err(IoKind::AlreadyExists.into());
                    }
                    fs::rename(tmp, dst)
                }
            }
        }
        Err(e) => Err(e.into()),
    }
}

impl Backend for LocalBackend {
    fn put(&self, name: &str, data: &[u8]) -> Result<(), BackendError> {
        self.put_with(name, &mut |f| f.write_all(data))
    }

    fn put_stream(&self, name: &str, size: u64, data: &mut dyn Read) -> Result<(), BackendError> {
        self.put_with(name, &mut |f| {
            let n = std::io::copy(&mut data.take(size), f)?;
            if n < size {
                return Err(std::io::Error::new(
                    IoKind::UnexpectedEof,
                    format!("source ended after {n} of {size} bytes"),
                ));
            }
            Ok(())
        })
    }

    /// Copied by the kernel (`copy_file_range` where the file systems allow)
    /// rather than through a buffer.
    fn put_file(&self, name: &str, file: &File, size: u64) -> Result<(), BackendError> {
        self.put_with(name, &mut |f| {
            let mut src = file;
            src.seek(SeekFrom::Start(0))?;
            let n = std::io::copy(&mut src.take(size), f)?;
            if n < size {
                return Err(std::io::Error::new(
                    IoKind::UnexpectedEof,
                    format!("source ended after {n} of {size} bytes"),
                ));
            }
            Ok(())
        })
    }

    fn get_stream(
        &self,
        name: &str,
        range: Option<Range<u64>>,
        out: &mut dyn Write,
    ) -> Result<u64, BackendError> {
        validate_name(name)?;
        let mut f = File::open(self.path(name)).map_err(|e| io_err("get", name, e))?;
        let size = f.metadata().map_err(|e| io_err("get", name, e))?.len();
        let r = range.unwrap_or(0..size);
        crate::contract::check_range(name, &r, size)?;
        f.seek(SeekFrom::Start(r.start))
            .map_err(|e| io_err("get", name, e))?;
        std::io::copy(&mut f.take(r.end - r.start), out).map_err(|e| io_err("get", name, e))
    }

    fn get(&self, name: &str, range: Option<Range<u64>>) -> Result<Vec<u8>, BackendError> {
        validate_name(name)?;
        let mut f = File::open(self.path(name)).map_err(|e| io_err("get", name, e))?;
        match range {
            None => {
                let mut v = Vec::new();
                f.read_to_end(&mut v).map_err(|e| io_err("get", name, e))?;
                Ok(v)
            }
            Some(r) => {
                let size = f.metadata().map_err(|e| io_err("get", name, e))?.len();
                crate::contract::check_range(name, &r, size)?;
                let mut v = vec![0u8; (r.end - r.start) as usize];
                f.read_exact_at(&mut v, r.start)
                    .map_err(|e| io_err("get", name, e))?;
                let _ = f.seek(SeekFrom::Start(0));
                Ok(v)
            }
        }
    }

    fn stat(&self, name: &str) -> Result<ObjectInfo, BackendError> {
        validate_name(name)?;
        let m = fs::metadata(self.path(name)).map_err(|e| io_err("stat", name, e))?;
        Ok(ObjectInfo {
            name: name.to_string(),
            size: m.len(),
            modified: unix_mtime(&m),
        })
    }

    fn list(&self, prefix: &str) -> Result<Vec<ObjectInfo>, BackendError> {
        self.walk(prefix, false)
    }

    fn list_temporaries(&self) -> Result<Vec<ObjectInfo>, BackendError> {
        self.walk("", true)
    }

    fn delete(&self, name: &str) -> Result<(), BackendError> {
        validate_name(name)?;
        match fs::remove_file(self.path(name)) {
            Ok(()) => {}
            Err(e) if e.kind() == IoKind::NotFound => return Ok(()),
            Err(e) => return Err(io_err("delete", name, e)),
        }
        let p = self.path(name);
        self.sync_dir(p.parent().unwrap_or(&self.root))
            .map_err(|e| io_err("delete", name, e))
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            concurrency: 2,
            durable_put: self.sync == SyncPolicy::Sync,
            local: true,
            buffers_puts: false,
        }
    }

    fn location(&self) -> String {
        self.root.display().to_string()
    }
}

impl LabBackend for LocalBackend {
    fn probe_write(
        &self,
        name: &str,
        data: &[u8],
        writes: usize,
        sync: bool,
    ) -> Result<(), BackendError> {
        validate_name(name)?;
        let p = self.path(name);
        let open = || {
            OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .open(&p)
        };
        let mut f = match open() {
            Err(e) if e.kind() == IoKind::NotFound => {
                if let Some(d) = p.parent() {
                    fs::create_dir_all(d).map_err(|e| io_err("probe", name, e))?;
                }
                open()
            }
            r => r,
        }
        .map_err(|e| io_err("probe", name, e))?;
        let piece = data.len().div_ceil(writes.max(1)).max(1);
        for part in data.chunks(piece) {
            f.write_all(part).map_err(|e| io_err("probe", name, e))?;
        }
        if sync {
            f.sync_all().map_err(|e| io_err("probe", name, e))?;
        }
        Ok(())
    }

    fn space(&self) -> Result<Option<Space>, BackendError> {
        let v = rustix::fs::statvfs(&self.root)
            .map_err(|e| io_err("space", &self.root.display().to_string(), e.into()))?;
        Ok(Some(Space {
            free: v.f_bavail.saturating_mul(v.f_frsize),
            total: v.f_blocks.saturating_mul(v.f_frsize),
        }))
    }

    fn ping(&self) -> Result<(), BackendError> {
        match fs::metadata(self.root.join("capsule-ping")) {
            Ok(_) => Ok(()),
            Err(e) if e.kind() == IoKind::NotFound => Ok(()),
            Err(e) => Err(io_err("ping", "capsule-ping", e)),
        }
    }

    fn remove_empty_dirs(&self) -> Result<(), BackendError> {
        // Deepest first, so a directory's children are gone before it is
        // tried; a directory that is not empty simply stays.
        let mut dirs = vec![self.root.clone()];
        let mut i = 0;
        while i < dirs.len() {
            if let Ok(rd) = fs::read_dir(&dirs[i]) {
                for e in rd.flatten() {
                    if e.file_type().is_ok_and(|t| t.is_dir()) {
                        dirs.push(e.path());
                    }
                }
            }
            i += 1;
        }
        for d in dirs.iter().rev() {
            let _ = fs::remove_dir(d);
        }
        Ok(())
    }
}

fn unix_mtime(m: &fs::Metadata) -> Option<i64> {
    use std::os::unix::fs::MetadataExt;
    Some(m.mtime())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn local_conformance() {
        let dir = tempfile::tempdir().unwrap();
        let b = LocalBackend::open(dir.path(), SyncPolicy::Sync).unwrap();
        crate::conformance::run_all(&b);
        crate::conformance::large_object(&b, 64 << 20);
    }

    #[test]
    fn interrupted_write_is_invisible() {
        let dir = tempfile::tempdir().unwrap();
        let b = LocalBackend::open(dir.path(), SyncPolicy::NoSync).unwrap();
        // Simulate a crash after the temporary was written but before rename.
        std::fs::create_dir_all(dir.path().join("data")).unwrap();
        std::fs::write(dir.path().join("data/.tmp-deadbeef"), b"partial").unwrap();
        assert!(b.list("data/").unwrap().is_empty());
        assert!(b.stat("data/x").is_err());
        let temps = b.list_temporaries().unwrap();
        assert_eq!(temps.len(), 1);
        assert_eq!(temps[0].name, "data/.tmp-deadbeef");
        assert!(temps[0].modified.is_some());
        b.delete(&temps[0].name).unwrap();
        assert!(b.list_temporaries().unwrap().is_empty());
    }
}
