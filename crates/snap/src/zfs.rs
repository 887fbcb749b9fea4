//! ZFS: a snapshot of the dataset that holds a source, read through the
//! dataset's `.zfs/snapshot` directory (mounted by ZFS on first access,
//! hidden from listings by default).
//!
//! Each snapshot carries the user property `capsule:snapshot` (its own
//! name) and is known by the GUID ZFS gives it. It is destroyed only
//! while the snapshot under its name still has that GUID; `zfs destroy`
//! takes no GUID, so between that look and the act only a user with
//! ZFS's own `rename`/`destroy` rights on the dataset (`zfs allow`) could
//! swap it, and then only for another snapshot of the same dataset.

use std::path::{Path, PathBuf};

use crate::mounts::Mount;
use crate::tool::Tool;
use crate::{is_ours, Kind, Leftovers, SnapError, Snapshotter, Taken};

const PROP: &str = "capsule:snapshot";

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
            &["snapshot", "-o", &format!("{PROP}={name}"), &handle],
        )?;
        let guid = guid_of(&handle)?;
        Ok(Taken {
            kind: Kind::Zfs,
            origin: root.to_path_buf(),
            view: mount.point.join(".zfs/snapshot").join(name),
            name: name.to_string(),
            handle,
            pin: None,
            ident: Some(guid),
        })
    }

    fn remove(&self, t: &Taken) -> Result<(), SnapError> {
        let now = guid_of(&t.handle)?;
        if t.ident.as_deref() != Some(now.as_str()) {
            return Err(SnapError::Unsupported(format!(
                "the ZFS snapshot {} is not the one capsule made (its GUID is {now}, capsule's was {}); it is left as it is",
                t.handle,
                t.ident.as_deref().unwrap_or("not recorded")
            )));
        }
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
                "-p",
                "-o",
                &format!("name,guid,{PROP}"),
                "-d",
                "1",
                &mount.source,
            ],
        )?;
        let mut found = Vec::new();
        let mut kept = Vec::new();
        for l in out.lines() {
            let Some(row) = Row::parse(l) else { continue };
            if is_ours(row.name) != Some(false) {
                continue;
            }
            if row.made_as != row.name {
                kept.push(format!(
                    "{} looks like a snapshot of capsule's but does not carry capsule's {PROP} property; left as it is (`zfs destroy {}` once you have checked it)",
                    row.handle, row.handle
                ));
                continue;
            }
            found.push(Taken {
                kind: Kind::Zfs,
                origin: root.to_path_buf(),
                view: mount.point.join(".zfs/snapshot").join(row.name),
                name: row.name.to_string(),
                handle: row.handle.to_string(),
                pin: None,
                ident: Some(row.guid.to_string()),
            });
        }
        Ok(Leftovers { found, kept })
    }
}

/// The GUID of the snapshot `handle` names now.
fn guid_of(handle: &str) -> Result<String, SnapError> {
    Ok(ZFS
        .run(
            &format!("reading the identity of the snapshot {handle}"),
            &["get", "-H", "-p", "-o", "value", "guid", handle],
        )?
        .trim()
        .to_string())
}

/// One line of `zfs list -H -p -o name,guid,capsule:snapshot`.
struct Row<'a> {
    handle: &'a str,
    name: &'a str,
    guid: &'a str,
    /// The property's value (`-` where it is not set).
    made_as: &'a str,
}

impl<'a> Row<'a> {
    fn parse(line: &'a str) -> Option<Row<'a>> {
        let mut f = line.trim_end_matches('\n').split('\t');
        let handle = f.next()?.trim();
        let guid = f.next()?.trim();
        let made_as = f.next()?.trim();
        let (_, name) = handle.split_once('@')?;
        Some(Row {
            handle,
            name,
            guid,
            made_as,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_row_names_its_snapshot_guid_and_mark() {
        let r = Row::parse("tank/home@capsule-1-2\t1234567\tcapsule-1-2\n").unwrap();
        assert_eq!(
            (r.handle, r.name, r.guid, r.made_as),
            (
                "tank/home@capsule-1-2",
                "capsule-1-2",
                "1234567",
                "capsule-1-2"
            )
        );
        let r = Row::parse("tank/home@capsule-1-2\t99\t-").unwrap();
        assert_ne!(r.made_as, r.name, "no mark: not taken as capsule's");
        assert!(Row::parse("tank/home\t1\t-").is_none());
    }
}
