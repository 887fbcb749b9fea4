//! btrfs: a read-only snapshot of the subvolume that holds a source, kept
//! in `.capsule-snapshots` at the subvolume's root (a snapshot must lie on
//! the same file system, and this is the one directory capsule can be
//! sure to find again after a crash).

use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::path::{Path, PathBuf};

use crate::mounts::Mount;
use crate::tool::Tool;
use crate::{is_ours, Kind, SnapError, Snapshotter, Taken, DIR_NAME};

/// The inode of a subvolume's root directory (BTRFS_FIRST_FREE_OBJECTID).
pub(crate) const SUBVOLUME_ROOT_INODE: u64 = 256;
/// The inode of the empty directory a snapshot shows where the original
/// had a subvolume of its own (BTRFS_EMPTY_SUBVOL_DIR_OBJECTID): snapshots
/// do not descend into nested subvolumes.
pub(crate) const NESTED_PLACEHOLDER_INODE: u64 = 2;

const BTRFS: Tool = Tool {
    name: "btrfs",
    package: "btrfs-progs",
};

pub(crate) struct Btrfs;

impl Snapshotter for Btrfs {
    fn kind(&self) -> Kind {
        Kind::Btrfs
    }

    /// The subvolume holding `path`: the highest directory above it on the
    /// same device (each subvolume has a device number of its own).
    fn volume(&self, path: &Path, _mount: &Mount) -> Result<PathBuf, SnapError> {
        let dev = std::fs::metadata(path)
            .map_err(|e| SnapError::io("read", path, e))?
            .dev();
        let mut root = path.to_path_buf();
        while let Some(up) = root.parent() {
            match std::fs::metadata(up) {
                Ok(m) if m.dev() == dev => root = up.to_path_buf(),
                _ => break,
            }
        }
        let ino = std::fs::metadata(&root)
            .map_err(|e| SnapError::io("read", &root, e))?
            .ino();
        if ino != SUBVOLUME_ROOT_INODE {
            return Err(SnapError::Unsupported(format!(
                "{} is on btrfs but no subvolume root was found above it ({} has inode {ino})",
                path.display(),
                root.display()
            )));
        }
        Ok(root)
    }

    fn create(&self, root: &Path, _mount: &Mount, name: &str) -> Result<Taken, SnapError> {
        let dir = root.join(DIR_NAME);
        match std::fs::DirBuilder::new().mode(0o700).create(&dir) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(SnapError::io("create the snapshot directory", &dir, e)),
        }
        let view = dir.join(name);
        let (r, v) = (root.to_string_lossy(), view.to_string_lossy());
        BTRFS.run(
            &format!("taking a read-only snapshot of {r}"),
            &["subvolume", "snapshot", "-r", &r, &v],
        )?;
        Ok(Taken {
            kind: Kind::Btrfs,
            origin: root.to_path_buf(),
            view: view.clone(),
            name: name.to_string(),
            handle: v.into_owned(),
        })
    }

    fn remove(&self, t: &Taken) -> Result<(), SnapError> {
        if std::fs::symlink_metadata(&t.view).is_err() {
            return Ok(());
        }
        BTRFS.run(
            &format!("removing the source snapshot {}", t.view.display()),
            &["subvolume", "delete", &t.handle],
        )?;
        Ok(())
    }

    fn leftovers(&self, root: &Path, _mount: &Mount) -> Result<Vec<Taken>, SnapError> {
        let dir = root.join(DIR_NAME);
        let entries = match std::fs::read_dir(&dir) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(SnapError::io("list", &dir, e)),
        };
        let mut out = Vec::new();
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let view = dir.join(&name);
            let is_subvolume = std::fs::symlink_metadata(&view)
                .is_ok_and(|m| m.is_dir() && m.ino() == SUBVOLUME_ROOT_INODE);
            if is_subvolume && is_ours(&name) == Some(false) {
                out.push(Taken {
                    kind: Kind::Btrfs,
                    origin: root.to_path_buf(),
                    handle: view.to_string_lossy().into_owned(),
                    view,
                    name,
                });
            }
        }
        Ok(out)
    }
}
