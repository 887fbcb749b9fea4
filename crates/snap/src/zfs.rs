//! ZFS: a snapshot of the dataset that holds a source, read through the
//! dataset's `.zfs/snapshot` directory (mounted by ZFS on first access,
//! hidden from listings by default).

use std::path::{Path, PathBuf};

use crate::mounts::Mount;
use crate::tool::Tool;
use crate::{is_ours, Kind, Leftovers, SnapError, Snapshotter, Taken};

const ZFS: Tool = Tool {
    name: "zfs",
    package: "zfsutils-linux",
};

pub(crate) struct Zfs;

impl Snapshotter for Zfs {
    fn kind(&self) -> Kind {
        Kind::Zfs
    }

    fn volume(&self, _path: &Path, mount: &Mount) -> Result<PathBuf, SnapError> {
        Ok(mount.point.clone())
    }

    fn create(&self, root: &Path, mount: &Mount, name: &str) -> Result<Taken, SnapError> {
        let handle = format!("{}@{name}", mount.source);
        ZFS.run(
            &format!("taking a ZFS snapshot of {}", mount.source),
            &["snapshot", &handle],
        )?;
        Ok(Taken {
            kind: Kind::Zfs,
            origin: root.to_path_buf(),
            view: mount.point.join(".zfs/snapshot").join(name),
            name: name.to_string(),
            handle,
            pin: None,
        })
    }

    fn remove(&self, t: &Taken) -> Result<(), SnapError> {
        ZFS.run(
            &format!("removing the source snapshot {}", t.handle),
            &["destroy", &t.handle],
        )?;
        Ok(())
    }

    fn leftovers(&self, root: &Path, mount: &Mount) -> Result<Leftovers, SnapError> {
        let out = ZFS.run(
            &format!("listing the snapshots of {}", mount.source),
            &[
                "list",
                "-H",
                "-t",
                "snapshot",
                "-o",
                "name",
                "-d",
                "1",
                &mount.source,
            ],
        )?;
        let found = out
            .lines()
            .filter_map(|l| {
                let (_, name) = l.trim().split_once('@')?;
                (is_ours(name) == Some(false)).then(|| Taken {
                    kind: Kind::Zfs,
                    origin: root.to_path_buf(),
                    view: mount.point.join(".zfs/snapshot").join(name),
                    name: name.to_string(),
                    handle: l.trim().to_string(),
                    pin: None,
                })
            })
            .collect();
        Ok(Leftovers {
            found,
            kept: Vec::new(),
        })
    }
}
