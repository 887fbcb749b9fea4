//! The three btrfs ioctls capsule's snapshots need, on descriptors it has
//! opened and checked: snapshot a subvolume into a directory, read a
//! subvolume's identity, delete a subvolume by its ID. btrfs-progs takes
//! paths, which it looks up again (and follows, where a link was planted
//! meanwhile); these take descriptors, so what is acted on is what was
//! checked.
#![allow(unsafe_code)]

use std::ffi::OsStr;
use std::os::fd::{AsRawFd, BorrowedFd};
use std::os::unix::ffi::OsStrExt;

const MAGIC: u64 = 0x94;
const NAME_MAX: usize = 4040;
/// `BTRFS_SUBVOL_RDONLY`.
const SUBVOL_RDONLY: u64 = 1 << 1;
/// `BTRFS_SUBVOL_SPEC_BY_ID`.
const SUBVOL_SPEC_BY_ID: u64 = 1 << 4;
/// `BTRFS_ROOT_SUBVOL_RDONLY`, in a subvolume's root item flags.
const ROOT_SUBVOL_RDONLY: u64 = 1 << 0;

const fn iow(nr: u64, size: usize) -> u64 {
    (1 << 30) | ((size as u64) << 16) | (MAGIC << 8) | nr
}
const fn ior(nr: u64, size: usize) -> u64 {
    (2 << 30) | ((size as u64) << 16) | (MAGIC << 8) | nr
}

/// `struct btrfs_ioctl_vol_args_v2`; the last field is a union of the name
/// and the subvolume ID.
#[repr(C)]
struct VolArgsV2 {
    fd: i64,
    transid: u64,
    flags: u64,
    unused: [u64; 4],
    name: [u8; NAME_MAX],
}

#[allow(dead_code)]
#[repr(C)]
struct Timespec {
    sec: u64,
    nsec: u32,
}

/// `struct btrfs_ioctl_get_subvol_info_args` (the kernel's layout: not
/// every field is read).
#[allow(dead_code)]
#[repr(C)]
struct SubvolInfoArgs {
    treeid: u64,
    name: [u8; 256],
    parent_id: u64,
    dirid: u64,
    generation: u64,
    flags: u64,
    uuid: [u8; 16],
    parent_uuid: [u8; 16],
    received_uuid: [u8; 16],
    transids: [u64; 4],
    times: [Timespec; 4],
    reserved: [u64; 8],
}

// The kernel's sizes (linux/btrfs.h): the ioctl numbers encode them.
const _: () = assert!(std::mem::size_of::<VolArgsV2>() == 4096);
const _: () = assert!(std::mem::size_of::<SubvolInfoArgs>() == 504);

const SNAP_CREATE_V2: u64 = iow(23, std::mem::size_of::<VolArgsV2>());
const SNAP_DESTROY_V2: u64 = iow(63, std::mem::size_of::<VolArgsV2>());
const GET_SUBVOL_INFO: u64 = ior(60, std::mem::size_of::<SubvolInfoArgs>());

/// A subvolume's identity.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Info {
    /// Its ID (tree ID) on its file system.
    pub(crate) id: u64,
    /// Its UUID, which no other subvolume anywhere has.
    pub(crate) uuid: [u8; 16],
    /// The UUID of the subvolume it is a snapshot of (zero if none).
    pub(crate) parent_uuid: [u8; 16],
    /// Whether it is read-only.
    pub(crate) readonly: bool,
}

fn vol_args() -> VolArgsV2 {
    VolArgsV2 {
        fd: 0,
        transid: 0,
        flags: 0,
        unused: [0; 4],
        name: [0; NAME_MAX],
    }
}

fn done(r: libc::c_int) -> std::io::Result<()> {
    if r < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// Takes a read-only snapshot of the subvolume whose root is `source`,
/// named `name` in directory `dir` (same file system).
pub(crate) fn snapshot(
    dir: BorrowedFd<'_>,
    source: BorrowedFd<'_>,
    name: &OsStr,
) -> std::io::Result<()> {
    let b = name.as_bytes();
    if b.is_empty() || b.len() >= NAME_MAX || b.contains(&b'/') || b.contains(&0) {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "not a snapshot name",
        ));
    }
    let mut a = vol_args();
    a.fd = i64::from(source.as_raw_fd());
    a.flags = SUBVOL_RDONLY;
    a.name[..b.len()].copy_from_slice(b);
    // SAFETY: `a` has the layout of the kernel's struct (its size is
    // checked above); the kernel reads it and keeps no pointer to it.
    done(unsafe { libc::ioctl(dir.as_raw_fd(), SNAP_CREATE_V2 as _, &a) })
}

/// Deletes the subvolume with ID `id` on the file system `fs` is on.
pub(crate) fn destroy_by_id(fs: BorrowedFd<'_>, id: u64) -> std::io::Result<()> {
    let mut a = vol_args();
    a.flags = SUBVOL_SPEC_BY_ID;
    a.name[..8].copy_from_slice(&id.to_ne_bytes());
    // SAFETY: as in `snapshot`.
    done(unsafe { libc::ioctl(fs.as_raw_fd(), SNAP_DESTROY_V2 as _, &a) })
}

/// The identity of the subvolume `fd` is in.
pub(crate) fn info(fd: BorrowedFd<'_>) -> std::io::Result<Info> {
    let mut a = SubvolInfoArgs {
        treeid: 0,
        name: [0; 256],
        parent_id: 0,
        dirid: 0,
        generation: 0,
        flags: 0,
        uuid: [0; 16],
        parent_uuid: [0; 16],
        received_uuid: [0; 16],
        transids: [0; 4],
        times: std::array::from_fn(|_| Timespec { sec: 0, nsec: 0 }),
        reserved: [0; 8],
    };
    // SAFETY: `a` has the layout of the kernel's struct (its size is
    // checked above), which the kernel fills and does not keep.
    done(unsafe { libc::ioctl(fd.as_raw_fd(), GET_SUBVOL_INFO as _, &mut a) })?;
    Ok(Info {
        id: a.treeid,
        uuid: a.uuid,
        parent_uuid: a.parent_uuid,
        readonly: a.flags & ROOT_SUBVOL_RDONLY != 0,
    })
}

/// A UUID as text (lowercase hex, no dashes).
pub(crate) fn hex(u: &[u8; 16]) -> String {
    u.iter().map(|b| format!("{b:02x}")).collect()
}
