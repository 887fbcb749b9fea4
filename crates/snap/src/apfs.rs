//! APFS local snapshots (macOS), as Time Machine takes them: `tmutil
//! localsnapshot` makes one (only Apple-signed tools may name their own:
//! `fs_snapshot_create` needs an entitlement), `mount_apfs -s` mounts it
//! read-only below `/var/run/capsule/snapshots`, and `diskutil apfs
//! deleteSnapshot -uuid` removes it.
//!
//! Identity: a snapshot is capsule's only when capsule recorded it. Right
//! after `tmutil` answers with the date it used, capsule lists the
//! volume's snapshots, takes the one named for that date (and refuses if
//! there are two), and writes a record (`<name>.apfs`: device, snapshot
//! UUID, XID, snapshot name) in `/var/db/capsule/snapshots`, a directory
//! only root can change. It is removed by that UUID, never by a name or a
//! date looked up again, so Time Machine's own snapshots, and any made
//! meanwhile, are never touched. A killed run's record names a leftover,
//! removed by the next run while a snapshot with that UUID still exists.
//!
//! Built and linked for macOS here, never run: the listing and record
//! rules are tested on Linux.

use std::path::{Path, PathBuf};

use crate::mounts::Mount;
use crate::tool::Tool;
use crate::{is_ours, Kind, Leftovers, SnapError, Snapshotter, Taken};

const TMUTIL: Tool = Tool {
    name: "tmutil",
    package: "macOS",
};
const DISKUTIL: Tool = Tool {
    name: "diskutil",
    package: "macOS",
};
const MOUNT_APFS: Tool = Tool {
    name: "mount_apfs",
    package: "macOS",
};
const UMOUNT: Tool = Tool {
    name: "umount",
    package: "macOS",
};

/// Where snapshots are mounted (root's; emptied at boot).
const MOUNTS: &str = "/var/run/capsule/snapshots";
/// Where capsule records the snapshots it made (root's; kept across
/// boots, as the snapshots are).
const RECORDS: &str = "/var/db/capsule/snapshots";

pub(crate) struct Apfs;

/// The date `tmutil localsnapshot` says it used.
pub(crate) fn created_date(out: &str) -> Option<&str> {
    let (_, rest) = out.split_once("Created local snapshot with date: ")?;
    let d = rest.split_whitespace().next()?;
    (d.len() == 17 && d.bytes().all(|b| b.is_ascii_digit() || b == b'-')).then_some(d)
}

/// One snapshot in `diskutil apfs listSnapshots` output.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Listed {
    pub(crate) uuid: String,
    pub(crate) name: String,
    pub(crate) xid: u64,
}

/// Reads `diskutil apfs listSnapshots <device>`: a `+-- <UUID>` line per
/// snapshot, then its `Name:` and `XID:`.
pub(crate) fn parse_list(out: &str) -> Vec<Listed> {
    let mut all = Vec::new();
    let mut cur: Option<Listed> = None;
    for line in out.lines() {
        let l = line.trim_start_matches(['|', ' ']);
        if let Some(uuid) = l.strip_prefix("+-- ") {
            all.extend(cur.take());
            cur = Some(Listed {
                uuid: uuid.trim().to_string(),
                name: String::new(),
                xid: 0,
            });
        } else if let (Some(c), Some((k, v))) = (cur.as_mut(), l.split_once(':')) {
            match k.trim() {
                "Name" => c.name = v.trim().to_string(),
                "XID" => c.xid = v.trim().parse().unwrap_or(0),
                _ => {}
            }
        }
    }
    all.extend(cur);
    all.retain(|s| !s.uuid.is_empty() && !s.name.is_empty());
    all
}

/// The one snapshot named for `date`; none or two is an error.
pub(crate) fn the_one<'a>(list: &'a [Listed], date: &str) -> Result<&'a Listed, String> {
    let name = format!("com.apple.TimeMachine.{date}.local");
    let mut it = list.iter().filter(|s| s.name == name);
    match (it.next(), it.next()) {
        (Some(s), None) => Ok(s),
        (None, _) => Err(format!("no snapshot named {name} was listed")),
        (Some(_), Some(_)) => Err(format!(
            "two snapshots are named {name}: capsule cannot tell which it made, and removes neither"
        )),
    }
}

/// A record: what capsule made, for its removal by identity.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Record {
    pub(crate) device: String,
    pub(crate) uuid: String,
    pub(crate) xid: u64,
    pub(crate) snapshot: String,
    pub(crate) point: PathBuf,
}

impl Record {
    pub(crate) fn encode(&self) -> String {
        format!(
            "device\t{}\nuuid\t{}\nxid\t{}\nsnapshot\t{}\npoint\t{}\n",
            self.device,
            self.uuid,
            self.xid,
            self.snapshot,
            self.point.display()
        )
    }

    pub(crate) fn decode(text: &str) -> Option<Record> {
        let get = |k: &str| {
            text.lines()
                .find_map(|l| l.strip_prefix(k)?.strip_prefix('\t'))
                .map(str::to_string)
        };
        let r = Record {
            device: get("device")?,
            uuid: get("uuid")?,
            xid: get("xid")?.parse().ok()?,
            snapshot: get("snapshot")?,
            point: PathBuf::from(get("point")?),
        };
        // A UUID is hex and dashes: nothing a tool could read as a flag.
        (r.uuid.len() == 36 && r.uuid.bytes().all(|b| b.is_ascii_hexdigit() || b == b'-'))
            .then_some(r)
    }
}

fn record_path(name: &str) -> PathBuf {
    Path::new(RECORDS).join(format!("{name}.apfs"))
}

/// The volume's root as the sources name it: the mount point, or `/` for
/// the data volume that macOS shows at `/` through firmlinks.
fn origin_of(path: &Path, mount: &Mount) -> Result<PathBuf, SnapError> {
    if mount.point == Path::new("/") {
        return Err(SnapError::Unsupported(format!(
            "{} is on the sealed system volume, which never changes: nothing to snapshot (exclude it, or set source-snapshot = \"off\")",
            path.display()
        )));
    }
    if path.starts_with(&mount.point) {
        Ok(mount.point.clone())
    } else {
        Ok(PathBuf::from("/"))
    }
}

impl Snapshotter for Apfs {
    fn kind(&self) -> Kind {
        Kind::Apfs
    }

    fn volume(&self, path: &Path, mount: &Mount) -> Result<PathBuf, SnapError> {
        origin_of(path, mount)
    }

    fn create(&self, root: &Path, mount: &Mount, name: &str) -> Result<Taken, SnapError> {
        let doing = format!("taking an APFS snapshot of {}", mount.point.display());
        let out = TMUTIL.run(&doing, &["localsnapshot"])?;
        let date = created_date(&out).ok_or_else(|| {
            SnapError::Unsupported(format!(
                "{doing}: tmutil did not say which snapshot it made ({})",
                out.trim()
            ))
        })?;
        let list = DISKUTIL.run(&doing, &["apfs", "listSnapshots", &mount.source])?;
        let list = parse_list(&list);
        let one = the_one(&list, date)
            .map_err(|why| SnapError::Unsupported(format!("{doing}: {why}")))?;
        let record = Record {
            device: mount.source.clone(),
            uuid: one.uuid.clone(),
            xid: one.xid,
            snapshot: one.name.clone(),
            point: mount.point.clone(),
        };
        write_record(name, &record)?;
        let at = Path::new(MOUNTS).join(name);
        let taken = Taken {
            kind: Kind::Apfs,
            origin: root.to_path_buf(),
            view: at.clone(),
            name: name.to_string(),
            handle: format!("{}@{}", mount.source, one.name),
            pin: None,
            ident: Some(record.uuid.clone()),
        };
        let mounted = std::fs::create_dir_all(&at)
            .map_err(|e| SnapError::io("create", &at, e))
            .and_then(|()| {
                MOUNT_APFS.run(
                    &format!("mounting the source snapshot {}", one.name),
                    &[
                        "-o",
                        "rdonly,nobrowse",
                        "-s",
                        &one.name,
                        &mount.source,
                        &at.to_string_lossy(),
                    ],
                )
            });
        if let Err(e) = mounted {
            let _ = self.remove(&taken);
            return Err(e);
        }
        Ok(taken)
    }

    fn remove(&self, t: &Taken) -> Result<(), SnapError> {
        let at = Path::new(MOUNTS).join(&t.name);
        if crate::mounts::table().iter().any(|m| m.point == at) {
            UMOUNT.run(
                &format!("unmounting the source snapshot {}", at.display()),
                &[&at.to_string_lossy()],
            )?;
        }
        let _ = std::fs::remove_dir(&at);
        let rec = read_record(&t.name)?;
        if t.ident.as_deref() != Some(rec.uuid.as_str()) {
            return Err(SnapError::Unsupported(format!(
                "the record of {} names another snapshot than the one capsule holds; it is left as it is",
                t.handle
            )));
        }
        DISKUTIL.run(
            &format!("removing the source snapshot {}", t.handle),
            &["apfs", "deleteSnapshot", &rec.device, "-uuid", &rec.uuid],
        )?;
        let _ = std::fs::remove_file(record_path(&t.name));
        Ok(())
    }

    fn leftovers(&self, root: &Path, mount: &Mount) -> Result<Leftovers, SnapError> {
        let mut out = Leftovers::default();
        let Ok(dir) = std::fs::read_dir(RECORDS) else {
            return Ok(out);
        };
        let listed = DISKUTIL.run(
            &format!("listing the snapshots of {}", mount.source),
            &["apfs", "listSnapshots", &mount.source],
        )?;
        let listed = parse_list(&listed);
        for e in dir.flatten() {
            let file = e.file_name().to_string_lossy().into_owned();
            let Some(name) = file.strip_suffix(".apfs") else {
                continue;
            };
            if is_ours(name) != Some(false) {
                continue;
            }
            let Ok(rec) = read_record(name) else { continue };
            if rec.device != mount.source {
                continue;
            }
            if !listed.iter().any(|s| s.uuid == rec.uuid) {
                // macOS purged it (local snapshots are purgeable).
                let _ = std::fs::remove_file(record_path(name));
                continue;
            }
            out.found.push(Taken {
                kind: Kind::Apfs,
                origin: root.to_path_buf(),
                view: Path::new(MOUNTS).join(name),
                name: name.to_string(),
                handle: format!("{}@{}", rec.device, rec.snapshot),
                pin: None,
                ident: Some(rec.uuid),
            });
        }
        Ok(out)
    }
}

/// Opens the records directory, root's and writable by no one else,
/// without following a link on the way.
fn records_dir(create: bool) -> Result<std::os::fd::OwnedFd, SnapError> {
    use rustix::fs::{Mode, OFlags};
    let mut fd = rustix::fs::open("/", OFlags::DIRECTORY | OFlags::CLOEXEC, Mode::empty())
        .map_err(|e| SnapError::io("open", Path::new("/"), e.into()))?;
    let mut at = PathBuf::from("/");
    for part in ["var", "db", "capsule", "snapshots"] {
        at.push(part);
        if create {
            let _ = rustix::fs::mkdirat(&fd, part, Mode::from_raw_mode(0o700));
        }
        // `/var` is a link to `/private/var` on macOS, root's own.
        let next = if part == "var" {
            rustix::fs::open(
                "/private/var",
                OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                Mode::empty(),
            )
        } else {
            rustix::fs::openat(
                &fd,
                part,
                OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                Mode::empty(),
            )
        }
        .map_err(|e| SnapError::io("open", &at, e.into()))?;
        let st = rustix::fs::fstat(&next).map_err(|e| SnapError::io("read", &at, e.into()))?;
        if st.st_uid != 0 || (st.st_mode as u32) & 0o022 != 0 {
            return Err(SnapError::Untrusted {
                path: at.display().to_string(),
                why: "is not root's alone".into(),
            });
        }
        fd = next;
    }
    Ok(fd)
}

fn write_record(name: &str, r: &Record) -> Result<(), SnapError> {
    use rustix::fs::{Mode, OFlags};
    let dir = records_dir(true)?;
    let file = format!("{name}.apfs");
    let fd = rustix::fs::openat(
        &dir,
        file.as_str(),
        OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::from_raw_mode(0o600),
    )
    .map_err(|e| SnapError::io("create", &record_path(name), e.into()))?;
    rustix::io::write(&fd, r.encode().as_bytes())
        .map_err(|e| SnapError::io("write", &record_path(name), e.into()))?;
    Ok(())
}

fn read_record(name: &str) -> Result<Record, SnapError> {
    use rustix::fs::{Mode, OFlags};
    let dir = records_dir(false)?;
    let file = format!("{name}.apfs");
    let fd = rustix::fs::openat(
        &dir,
        file.as_str(),
        OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| SnapError::io("open", &record_path(name), e.into()))?;
    let mut buf = vec![0u8; 4096];
    let n = rustix::io::read(&fd, &mut buf)
        .map_err(|e| SnapError::io("read", &record_path(name), e.into()))?;
    Record::decode(&String::from_utf8_lossy(&buf[..n])).ok_or_else(|| {
        SnapError::Unsupported(format!(
            "{} is not a record capsule wrote; the snapshot it names is left as it is",
            record_path(name).display()
        ))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIST: &str = "\
Snapshots for disk3s5 (3 found)
|
+-- 0C4AD1D3-8F2B-4E0B-9F83-4D0F0A6C1E11
|   Name:        com.apple.TimeMachine.2026-12-02-043512.local
|   XID:         1234567
|   Purgeable:   Yes
|   NOTE:        This snapshot limits the minimum size of APFS Container disk3
|
+-- 9E1F3B1A-2C3D-4E5F-8A9B-0C1D2E3F4A5B
|   Name:        com.apple.TimeMachine.2026-12-02-053512.local
|   XID:         1234999
|   Purgeable:   Yes
|
+-- 11111111-2222-3333-4444-555555555555
    Name:        com.apple.TimeMachine.2026-12-02-053512.local
    XID:         1235000
    Purgeable:   Yes
";

    #[test]
    fn tmutil_and_diskutil_are_read() {
        assert_eq!(
            created_date(
                "NOTE: local snapshots are considered purgeable and may be removed at any time by deleted(8).\nCreated local snapshot with date: 2026-12-02-043512\n"
            ),
            Some("2026-12-02-043512")
        );
        assert_eq!(
            created_date("Created local snapshot with date: ; rm -rf /"),
            None
        );
        assert_eq!(created_date("Failed to create local snapshot"), None);
        let l = parse_list(LIST);
        assert_eq!(l.len(), 3);
        assert_eq!(
            l[0],
            Listed {
                uuid: "0C4AD1D3-8F2B-4E0B-9F83-4D0F0A6C1E11".into(),
                name: "com.apple.TimeMachine.2026-12-02-043512.local".into(),
                xid: 1_234_567,
            }
        );
        assert_eq!(the_one(&l, "2026-12-02-043512").unwrap().xid, 1_234_567);
        // Two of one date (Time Machine ran in the same second): neither
        // is taken for capsule's.
        assert!(the_one(&l, "2026-12-02-053512")
            .unwrap_err()
            .contains("removes neither"));
        assert!(the_one(&l, "2026-12-02-063512")
            .unwrap_err()
            .contains("no snapshot"));
    }

    #[test]
    fn a_record_round_trips_and_a_forged_one_is_refused() {
        let r = Record {
            device: "/dev/disk3s5".into(),
            uuid: "0C4AD1D3-8F2B-4E0B-9F83-4D0F0A6C1E11".into(),
            xid: 7,
            snapshot: "com.apple.TimeMachine.2026-12-02-043512.local".into(),
            point: PathBuf::from("/System/Volumes/Data"),
        };
        assert_eq!(Record::decode(&r.encode()), Some(r.clone()));
        let forged = r.encode().replace(&r.uuid, "-name x");
        assert_eq!(Record::decode(&forged), None);
    }

    #[test]
    fn the_data_volume_stands_at_the_root_and_the_system_volume_is_refused() {
        let m = |point: &str| Mount {
            dev: "1:5".into(),
            root: PathBuf::from("/"),
            point: PathBuf::from(point),
            fstype: "apfs".into(),
            source: "/dev/disk3s5".into(),
        };
        // /Users is a firmlink into the data volume.
        assert_eq!(
            origin_of(Path::new("/Users/ann"), &m("/System/Volumes/Data")).unwrap(),
            Path::new("/")
        );
        assert_eq!(
            origin_of(Path::new("/Volumes/Ext/docs"), &m("/Volumes/Ext")).unwrap(),
            Path::new("/Volumes/Ext")
        );
        assert!(origin_of(Path::new("/usr/bin"), &m("/"))
            .unwrap_err()
            .to_string()
            .contains("sealed system volume"));
    }
}
