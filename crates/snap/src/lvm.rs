//! LVM: a snapshot of the logical volume that holds a source (thin when
//! the volume is thin, classic otherwise), mounted read-only under
//! `/run/capsule/snapshots`. Every snapshot capsule makes carries the LV
//! tag `capsule-snapshot`, and a name that starts with `capsule-`.
//!
//! A snapshot is removed by the LV UUID read when it was made (or found
//! as a leftover), selected by `lvremove --select`, never by its name
//! looked up again: a volume renamed into its name is not removed.

use std::path::{Path, PathBuf};

use crate::mounts::Mount;
use crate::tool::Tool;
use crate::{is_ours, Kind, Leftovers, SnapError, Snapshotter, Taken};

const TAG: &str = "capsule-snapshot";
const MOUNTS: &str = "/run/capsule/snapshots";
/// A classic snapshot holds the blocks the origin changes while it
/// exists; a tenth of the volume outlasts an hourly run's writes.
const CLASSIC_SHARE: u64 = 10;

const LVS: Tool = Tool {
    name: "lvs",
    package: "lvm2",
};
const VGS: Tool = Tool {
    name: "vgs",
    package: "lvm2",
};
const LVCREATE: Tool = Tool {
    name: "lvcreate",
    package: "lvm2",
};
const LVREMOVE: Tool = Tool {
    name: "lvremove",
    package: "lvm2",
};
const MOUNT: Tool = Tool {
    name: "mount",
    package: "mount",
};
const UMOUNT: Tool = Tool {
    name: "umount",
    package: "mount",
};

/// Whether the mount's device is an LVM logical volume (device-mapper
/// says so in the UUID it gives the volume).
pub(crate) fn is_lv(mount: &Mount) -> bool {
    std::fs::read_to_string(format!("/sys/dev/block/{}/dm/uuid", mount.dev))
        .is_ok_and(|u| u.starts_with("LVM-"))
}

pub(crate) struct Lvm;

/// The volume group, name, thin pool and size of the LV behind `mount`.
fn origin(mount: &Mount) -> Result<(String, String, String, u64), SnapError> {
    let out = LVS.run(
        &format!("finding the logical volume of {}", mount.point.display()),
        &[
            "--noheadings",
            "--separator",
            "|",
            "--units",
            "b",
            "--nosuffix",
            "-o",
            "vg_name,lv_name,pool_lv,lv_size",
            &mount.source,
        ],
    )?;
    let f: Vec<&str> = out.trim().split('|').map(str::trim).collect();
    match f.as_slice() {
        [vg, lv, pool, size] => Ok((
            vg.to_string(),
            lv.to_string(),
            pool.to_string(),
            size.parse().unwrap_or(0),
        )),
        _ => Err(SnapError::Unsupported(format!(
            "{} is not on an LVM logical volume that lvs knows ({})",
            mount.point.display(),
            out.trim()
        ))),
    }
}

fn view_of(mount: &Mount, name: &str) -> PathBuf {
    // A bind mount shows a directory of the volume: so does the view.
    Path::new(MOUNTS)
        .join(name)
        .join(mount.root.strip_prefix("/").unwrap_or(&mount.root))
}

impl Snapshotter for Lvm {
    fn kind(&self) -> Kind {
        Kind::Lvm
    }

    fn volume(&self, _path: &Path, mount: &Mount) -> Result<PathBuf, SnapError> {
        Ok(mount.point.clone())
    }

    fn create(&self, root: &Path, mount: &Mount, name: &str) -> Result<Taken, SnapError> {
        let (vg, lv, pool, size) = origin(mount)?;
        let name = format!("{name}-{lv}");
        let full = format!("{vg}/{lv}");
        let doing = format!("taking an LVM snapshot of {full} ({})", root.display());
        if pool.is_empty() {
            let want = (size / CLASSIC_SHARE).max(64 << 20);
            let free: u64 = VGS
                .run(
                    &doing,
                    &[
                        "--noheadings",
                        "--units",
                        "b",
                        "--nosuffix",
                        "-o",
                        "vg_free",
                        &vg,
                    ],
                )?
                .trim()
                .parse()
                .unwrap_or(0);
            if free < want {
                return Err(SnapError::Unsupported(format!(
                    "no space for a snapshot of {full}: volume group {vg} has {free} bytes free, and a classic snapshot needs about a tenth of the volume ({want} bytes); extend the group, or set source-snapshot = \"off\""
                )));
            }
            LVCREATE.run(
                &doing,
                &[
                    "--snapshot",
                    "--yes",
                    "--addtag",
                    TAG,
                    "--name",
                    &name,
                    "--size",
                    &format!("{want}b"),
                    &full,
                ],
            )?;
        } else {
            LVCREATE.run(
                &doing,
                &[
                    "--snapshot",
                    "--yes",
                    "--addtag",
                    TAG,
                    "--setactivationskip",
                    "n",
                    "--name",
                    &name,
                    &full,
                ],
            )?;
        }
        let handle = format!("{vg}/{name}");
        let uuid = LVS.run(
            &format!("reading the identity of the snapshot {handle} just taken"),
            &["--noheadings", "-o", "lv_uuid,lv_tags", &handle],
        );
        let ident = match uuid.as_deref().map(uuid_tagged) {
            Ok(Some(u)) => u,
            Ok(None) | Err(_) => {
                // Not knowing which volume it made, capsule removes none:
                // the name alone could by now be another's.
                return Err(SnapError::Unsupported(format!(
                    "the LVM snapshot {handle} was made but its identity could not be read ({}); remove it with `lvremove {handle}` once you have checked it is capsule's",
                    match &uuid {
                        Ok(o) => o.trim().to_string(),
                        Err(e) => e.to_string(),
                    }
                )));
            }
        };
        let taken = Taken {
            kind: Kind::Lvm,
            origin: root.to_path_buf(),
            view: view_of(mount, &name),
            name: name.clone(),
            handle,
            pin: None,
            ident: Some(ident),
        };
        if let Err(e) = mount_ro(&taken, mount) {
            let _ = self.remove(&taken);
            return Err(e);
        }
        Ok(taken)
    }

    fn remove(&self, t: &Taken) -> Result<(), SnapError> {
        let at = Path::new(MOUNTS).join(&t.name);
        if is_mounted(&at) {
            UMOUNT.run(
                &format!("unmounting the source snapshot {}", at.display()),
                &[&at.to_string_lossy()],
            )?;
        }
        let _ = std::fs::remove_dir(&at);
        let Some(uuid) = &t.ident else {
            return Err(SnapError::Unsupported(format!(
                "the LVM snapshot {} has no recorded identity; it is left as it is",
                t.handle
            )));
        };
        LVREMOVE.run(
            &format!("removing the source snapshot {}", t.handle),
            &["--yes", "--select", &select(uuid)],
        )?;
        Ok(())
    }

    fn leftovers(&self, root: &Path, mount: &Mount) -> Result<Leftovers, SnapError> {
        let (vg, lv, _, _) = origin(mount)?;
        let out = LVS.run(
            &format!("listing the snapshots of {vg}/{lv}"),
            &[
                "--noheadings",
                "--separator",
                "|",
                "-o",
                "vg_name,lv_name,origin,lv_uuid",
                &format!("@{TAG}"),
            ],
        )?;
        let found = out
            .lines()
            .filter_map(|l| {
                let f: Vec<&str> = l.trim().split('|').map(str::trim).collect();
                match f.as_slice() {
                    [g, name, o, uuid] if *g == vg && *o == lv && is_ours(name) == Some(false) => {
                        Some(Taken {
                            kind: Kind::Lvm,
                            origin: root.to_path_buf(),
                            view: view_of(mount, name),
                            name: name.to_string(),
                            handle: format!("{vg}/{name}"),
                            pin: None,
                            ident: Some(uuid.to_string()),
                        })
                    }
                    _ => None,
                }
            })
            .collect();
        Ok(Leftovers {
            found,
            kept: Vec::new(),
        })
    }
}

/// The LV UUID in `lvs -o lv_uuid,lv_tags` output, if the volume carries
/// capsule's tag (only root can tag a volume).
fn uuid_tagged(out: &str) -> Option<String> {
    let mut f = out.split_whitespace();
    let uuid = f.next()?;
    let tags = f.next().unwrap_or("");
    (tags.split(',').any(|t| t == TAG) && !uuid.is_empty()).then(|| uuid.to_string())
}

/// `lvremove --select` for exactly the volume with this UUID and
/// capsule's tag (LVM quotes values with double quotes).
fn select(uuid: &str) -> String {
    format!("lv_uuid=\"{uuid}\" && lv_tags={{{TAG}}}")
}

fn is_mounted(at: &Path) -> bool {
    crate::mounts::table().iter().any(|m| m.point == at)
}

fn mount_ro(t: &Taken, origin: &Mount) -> Result<(), SnapError> {
    let at = Path::new(MOUNTS).join(&t.name);
    std::fs::create_dir_all(&at).map_err(|e| SnapError::io("create", &at, e))?;
    // XFS refuses a second mount of the same file-system UUID.
    let opts = if origin.fstype == "xfs" {
        "ro,nouuid"
    } else {
        "ro"
    };
    let dev = format!("/dev/{}", t.handle);
    MOUNT.run(
        &format!("mounting the source snapshot {dev}"),
        &[
            "-t",
            &origin.fstype,
            "-o",
            opts,
            &dev,
            &at.to_string_lossy(),
        ],
    )?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_tagged_volume_has_an_identity() {
        assert_eq!(
            uuid_tagged("  fKj1Lf-1X2y-AbCd-eFgH-iJkL-mNoP-qRsTuV capsule-snapshot,x\n"),
            Some("fKj1Lf-1X2y-AbCd-eFgH-iJkL-mNoP-qRsTuV".into())
        );
        assert_eq!(uuid_tagged("  fKj1Lf-1X2y other\n"), None);
        assert_eq!(uuid_tagged("  fKj1Lf-1X2y\n"), None);
        assert_eq!(uuid_tagged(""), None);
        assert_eq!(
            select("a-b"),
            "lv_uuid=\"a-b\" && lv_tags={capsule-snapshot}"
        );
    }
}
