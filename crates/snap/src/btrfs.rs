//! btrfs: a read-only snapshot of the subvolume that holds a source, kept
//! in `.capsule-snapshots` at the subvolume's root (a snapshot must lie on
//! the same file system, and this is the one directory capsule can be
//! sure to find again after a crash). A nested subvolume met during the
//! run is snapshotted into the same directory, so capsule never writes in
//! a subvolume another user owns.
//!
//! Safe as root over trees other users write (docs/DESIGN.md, "Paths
//! capsule acts on as root"):
//! - the subvolume's root and `.capsule-snapshots` are reached from `/`
//!   without following links, through directories only root (or this
//!   user) can change ([`trusted::open_dir`]); elsewhere capsule takes no
//!   snapshot;
//! - snapshots are made and deleted by ioctl on those descriptors, and
//!   deleted by the subvolume ID read from a descriptor of the snapshot
//!   itself, held open from its making to its removal (an ID is not
//!   reused while a descriptor holds the subvolume);
//! - each snapshot is recorded beside it (`<name>.uuid`: the origin's
//!   UUID before it is made, its own after): a leftover is only a
//!   read-only subvolume its record names.

use std::ffi::OsStr;
use std::io::Write;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustix::fs::{AtFlags, Mode, OFlags};

use crate::btrfs_ioctl::{self as ioctl, hex, Info};
use crate::mounts::Mount;
use crate::trusted::{self, dir_flags};
use crate::{is_ours, Kind, Leftovers, SnapError, Snapshotter, Taken, DIR_NAME};

/// The inode of a subvolume's root directory (BTRFS_FIRST_FREE_OBJECTID).
pub(crate) const SUBVOLUME_ROOT_INODE: u64 = 256;
/// The inode of the empty directory a snapshot shows where the original
/// had a subvolume of its own (BTRFS_EMPTY_SUBVOL_DIR_OBJECTID): snapshots
/// do not descend into nested subvolumes.
pub(crate) const NESTED_PLACEHOLDER_INODE: u64 = 2;

/// A record's name ends so.
const RECORD: &str = ".uuid";

/// A subvolume's root and its `.capsule-snapshots`, opened and checked.
#[derive(Debug)]
pub(crate) struct Place {
    root: OwnedFd,
    root_path: PathBuf,
    dir: OwnedFd,
    dir_path: PathBuf,
}

/// A snapshot capsule made: held open, and known by its ID and UUID.
#[derive(Debug)]
pub(crate) struct Pin {
    place: Arc<Place>,
    snap: OwnedFd,
    info: Info,
    name: String,
}

fn sys<'a>(doing: &'static str, at: &'a Path) -> impl Fn(rustix::io::Errno) -> SnapError + 'a {
    move |e| SnapError::io(doing, at, e.into())
}

impl Place {
    /// Opens the subvolume root `root` and its snapshot directory (made
    /// when `create`; `None` when it is missing and not `create`).
    fn open(root: &Path, create: bool) -> Result<Option<Place>, SnapError> {
        let fd = trusted::open_dir(root)?;
        let st = rustix::fs::fstat(&fd).map_err(sys("read", root))?;
        if st.st_ino != SUBVOLUME_ROOT_INODE {
            return Err(SnapError::Unsupported(format!(
                "{} is no longer the root of a btrfs subvolume",
                root.display()
            )));
        }
        let dir_path = root.join(DIR_NAME);
        if create {
            match rustix::fs::mkdirat(&fd, DIR_NAME, Mode::from_raw_mode(0o700)) {
                Ok(()) | Err(rustix::io::Errno::EXIST) => {}
                Err(e) => {
                    return Err(SnapError::io(
                        "create the snapshot directory",
                        &dir_path,
                        e.into(),
                    ))
                }
            }
        }
        let dir = match rustix::fs::openat(&fd, DIR_NAME, dir_flags(), Mode::empty()) {
            Ok(d) => d,
            Err(rustix::io::Errno::NOENT) if !create => return Ok(None),
            Err(rustix::io::Errno::LOOP | rustix::io::Errno::NOTDIR) => {
                return Err(SnapError::Untrusted {
                    path: dir_path.display().to_string(),
                    why: "is not a directory (a link?); capsule does not follow it".into(),
                })
            }
            Err(e) => return Err(SnapError::io("open", &dir_path, e.into())),
        };
        let dst = rustix::fs::fstat(&dir).map_err(sys("read", &dir_path))?;
        if trusted::others_can_write(&dst) {
            return Err(SnapError::Untrusted {
                path: dir_path.display().to_string(),
                why: format!(
                    "is owned by uid {} with mode {:o}, so another user can change what it holds",
                    dst.st_uid,
                    dst.st_mode & 0o7777
                ),
            });
        }
        Ok(Some(Place {
            root: fd,
            root_path: root.to_path_buf(),
            dir,
            dir_path,
        }))
    }

    fn record(&self, name: &str) -> String {
        format!("{name}{RECORD}")
    }

    /// Writes `line` to `name`'s record (created by the first line).
    fn note(&self, name: &str, line: &str, first: bool) -> Result<(), SnapError> {
        let rec = self.record(name);
        let at = self.dir_path.join(&rec);
        let flags = OFlags::WRONLY
            | OFlags::NOFOLLOW
            | OFlags::CLOEXEC
            | if first {
                OFlags::CREATE | OFlags::EXCL
            } else {
                OFlags::APPEND
            };
        let fd = rustix::fs::openat(&self.dir, &rec, flags, Mode::from_raw_mode(0o600))
            .map_err(sys("write the snapshot's record", &at))?;
        let mut f = std::fs::File::from(fd);
        f.write_all(format!("{line}\n").as_bytes())
            .and_then(|()| f.sync_all())
            .map_err(|e| SnapError::io("write the snapshot's record", &at, e))
    }

    /// `name`'s record: the origin's UUID and, once made, the snapshot's.
    fn read_record(&self, name: &str) -> Option<(String, Option<String>)> {
        let fd = rustix::fs::openat(
            &self.dir,
            self.record(name),
            OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .ok()?;
        let text = std::io::read_to_string(std::fs::File::from(fd)).ok()?;
        let mut l = text.lines();
        let origin = l.next()?.strip_prefix("origin ")?.to_string();
        let own = l
            .next()
            .and_then(|s| s.strip_prefix("snapshot "))
            .map(str::to_string);
        Some((origin, own))
    }

    /// Snapshots the subvolume whose root `source` is (`origin`, as the
    /// sources name it) into this place's directory as `name`.
    fn snapshot(
        self: &Arc<Self>,
        source: &OwnedFd,
        origin: &Path,
        name: &str,
    ) -> Result<Taken, SnapError> {
        let view = self.dir_path.join(name);
        let of = ioctl::info(source.as_fd())
            .map_err(|e| SnapError::io("read the subvolume's identity", origin, e))?;
        self.note(name, &format!("origin {}", hex(&of.uuid)), true)?;
        let made = ioctl::snapshot(self.dir.as_fd(), source.as_fd(), OsStr::new(name));
        if let Err(e) = made {
            let _ = rustix::fs::unlinkat(&self.dir, self.record(name), AtFlags::empty());
            let e = SnapError::io("take a read-only snapshot into", &view, e);
            return Err(match &e {
                SnapError::Io { source, .. } if source.raw_os_error() == Some(libc::EPERM) => {
                    SnapError::Unsupported(format!("{e} (snapshots need root, or CAP_SYS_ADMIN: run the backup as root, or set source-snapshot = \"off\")"))
                }
                _ => e,
            });
        }
        let snap = rustix::fs::openat(&self.dir, name, dir_flags(), Mode::empty())
            .map_err(sys("open the source snapshot", &view))?;
        let info = ioctl::info(snap.as_fd())
            .map_err(|e| SnapError::io("read the snapshot's identity", &view, e))?;
        if !info.readonly || info.parent_uuid != of.uuid {
            return Err(SnapError::Unsupported(format!(
                "{} is not the read-only snapshot of {} just taken; it is left as it is",
                view.display(),
                origin.display()
            )));
        }
        self.note(name, &format!("snapshot {}", hex(&info.uuid)), false)?;
        Ok(Taken {
            kind: Kind::Btrfs,
            origin: origin.to_path_buf(),
            handle: view.to_string_lossy().into_owned(),
            view,
            name: name.to_string(),
            ident: None,
            pin: Some(Arc::new(Pin {
                place: self.clone(),
                snap,
                info,
                name: name.to_string(),
            })),
        })
    }
}

/// Snapshots the subvolume at `logical`, nested below `top`'s origin, into
/// `top`'s snapshot directory as `name`. The way down is taken without
/// following links; what is there is another user's to name, and a
/// read-only snapshot of it, made where only root writes and removed by
/// its ID, is harm to no one.
pub(crate) fn nested(top: &Taken, logical: &Path, name: &str) -> Result<Taken, SnapError> {
    let Some(pin) = &top.pin else {
        return Err(SnapError::Unsupported(format!(
            "{} is not a snapshot capsule holds",
            top.view.display()
        )));
    };
    let rel = logical.strip_prefix(&top.origin).map_err(|_| {
        SnapError::Unsupported(format!(
            "{} is not below {}",
            logical.display(),
            top.origin.display()
        ))
    })?;
    let place = &pin.place;
    let src = trusted::open_below(&place.root, &place.root_path, rel)?;
    let st = rustix::fs::fstat(&src).map_err(sys("read the nested subvolume", logical))?;
    if st.st_ino != SUBVOLUME_ROOT_INODE {
        return Err(SnapError::Unsupported(format!(
            "{} was a nested subvolume when the snapshot was taken, and is no longer one",
            logical.display()
        )));
    }
    place.snapshot(&src, logical, name)
}

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
        let place = Place::open(root, true)?.ok_or_else(|| {
            SnapError::Unsupported(format!("{} has no snapshot directory", root.display()))
        })?;
        let place = Arc::new(place);
        place.snapshot(&place.root, root, name)
    }

    fn remove(&self, t: &Taken) -> Result<(), SnapError> {
        let Some(pin) = &t.pin else {
            return Err(SnapError::Unsupported(format!(
                "{} is not a snapshot capsule holds; it is left as it is",
                t.view.display()
            )));
        };
        // The snapshot's own descriptor is open: its ID names it and no
        // other subvolume, whatever its name shows now.
        let now = ioctl::info(pin.snap.as_fd())
            .map_err(|e| SnapError::io("read the snapshot's identity", &t.view, e))?;
        if now.id != pin.info.id || now.uuid != pin.info.uuid {
            return Err(SnapError::Unsupported(format!(
                "{} is no longer the snapshot capsule made; it is left as it is",
                t.view.display()
            )));
        }
        match ioctl::destroy_by_id(pin.place.dir.as_fd(), pin.info.id) {
            Ok(()) => {}
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {}
            Err(e) => return Err(SnapError::io("remove the source snapshot", &t.view, e)),
        }
        let _ = rustix::fs::unlinkat(
            &pin.place.dir,
            pin.place.record(&pin.name),
            AtFlags::empty(),
        );
        Ok(())
    }

    fn leftovers(&self, root: &Path, _mount: &Mount) -> Result<Leftovers, SnapError> {
        let mut out = Leftovers::default();
        let Some(place) = Place::open(root, false)? else {
            return Ok(out);
        };
        let place = Arc::new(place);
        let names: Vec<Vec<u8>> = rustix::fs::Dir::read_from(&place.dir)
            .map_err(sys("list", &place.dir_path))?
            .filter_map(Result::ok)
            .map(|e| e.file_name().to_bytes().to_vec())
            .filter(|n| n != b"." && n != b"..")
            .collect();
        for raw in &names {
            let Ok(name) = std::str::from_utf8(raw) else {
                continue;
            };
            if let Some(stem) = name.strip_suffix(RECORD) {
                // A record whose snapshot is gone (removed, and the run
                // stopped before the record went).
                let gone = rustix::fs::statat(&place.dir, stem, AtFlags::SYMLINK_NOFOLLOW).is_err();
                if gone && is_ours(stem) == Some(false) {
                    let _ = rustix::fs::unlinkat(&place.dir, name, AtFlags::empty());
                }
                continue;
            }
            if is_ours(name) != Some(false) {
                continue;
            }
            let view = place.dir_path.join(name);
            match leftover(&place, name) {
                Some(pin) => out.found.push(Taken {
                    kind: Kind::Btrfs,
                    origin: root.to_path_buf(),
                    handle: view.to_string_lossy().into_owned(),
                    view,
                    name: name.to_string(),
                    pin: Some(Arc::new(pin)),
                    ident: None,
                }),
                None => out.kept.push(format!(
                    "left {} as it is: capsule did not record it as a read-only snapshot of its own (remove it by hand with `btrfs subvolume delete` if it is not needed)",
                    view.display()
                )),
            }
        }
        Ok(out)
    }
}

/// `name` in `place`, if it is a read-only subvolume its record names.
fn leftover(place: &Arc<Place>, name: &str) -> Option<Pin> {
    let snap = rustix::fs::openat(&place.dir, name, dir_flags(), Mode::empty()).ok()?;
    let st = rustix::fs::fstat(&snap).ok()?;
    if st.st_ino != SUBVOLUME_ROOT_INODE {
        return None;
    }
    let info = ioctl::info(snap.as_fd()).ok()?;
    let (origin, own) = place.read_record(name)?;
    let recorded = match own {
        Some(u) => u == hex(&info.uuid),
        // Killed between making it and recording it: the snapshot of the
        // origin the record names.
        None => origin == hex(&info.parent_uuid),
    };
    (info.readonly && recorded).then(|| Pin {
        place: place.clone(),
        snap,
        info,
        name: name.to_string(),
    })
}
