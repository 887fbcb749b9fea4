//! What differs between Linux and macOS below the engine: the calls one
//! of them lacks, and the widths `stat` gives its fields.

use std::ffi::OsStr;
use std::os::fd::AsFd;

use rustix::fs::{FileType, Mode, OFlags};

/// `O_NOATIME` where the system has it (Linux); macOS has none.
#[cfg(target_os = "linux")]
pub(crate) const NOATIME: OFlags = OFlags::NOATIME;
/// `O_NOATIME` where the system has it (Linux); macOS has none.
#[cfg(not(target_os = "linux"))]
pub(crate) const NOATIME: OFlags = OFlags::empty();

/// `mknodat`: a FIFO or device named `name` in `dir`.
#[cfg(target_os = "linux")]
pub(crate) fn mknodat(
    dir: impl AsFd,
    name: &OsStr,
    ft: FileType,
    mode: Mode,
    rdev: u64,
) -> std::io::Result<()> {
    Ok(rustix::fs::mknodat(dir, name, ft, mode, rdev)?)
}

/// `mknodat`: a FIFO or device named `name` in `dir` (macOS 13 has the
/// call; rustix does not offer it there).
#[cfg(target_os = "macos")]
#[allow(unsafe_code)]
pub(crate) fn mknodat(
    dir: impl AsFd,
    name: &OsStr,
    ft: FileType,
    mode: Mode,
    rdev: u64,
) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(name.as_bytes())
        .map_err(|_| std::io::Error::from(std::io::ErrorKind::InvalidInput))?;
    let kind = match ft {
        FileType::Fifo => libc::S_IFIFO,
        FileType::CharacterDevice => libc::S_IFCHR,
        _ => libc::S_IFBLK,
    };
    // SAFETY: a NUL-terminated name and a descriptor we hold.
    let r = unsafe {
        libc::mknodat(
            dir.as_fd().as_raw_fd(),
            c.as_ptr(),
            kind | mode.bits() as libc::mode_t,
            rdev as libc::dev_t,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// `stat` fields at the widths the format stores (macOS gives narrower
/// and signed ones).
#[allow(clippy::unnecessary_cast)]
pub(crate) fn widths(st: &rustix::fs::Stat) -> (u32, u64, u64, u64) {
    (
        st.st_mode as u32,
        st.st_dev as u64,
        st.st_nlink as u64,
        st.st_rdev as u64,
    )
}

/// The file flags a user (`UF_NODUMP`, `UF_IMMUTABLE`, `UF_APPEND`,
/// `UF_OPAQUE`, `UF_HIDDEN`) or root (`SF_ARCHIVED`, `SF_IMMUTABLE`,
/// `SF_APPEND`) sets. The others describe how the system keeps the file
/// (`UF_COMPRESSED`: its content is in a decmpfs attribute; `SF_DATALESS`,
/// `SF_RESTRICTED`, `SF_FIRMLINK`): set on a restored file they would
/// make it unreadable or claim what is not so. They are neither stored
/// nor restored.
#[cfg(target_os = "macos")]
const KEPT_FLAGS: u32 = 0x1 | 0x2 | 0x4 | 0x8 | 0x8000 | 0x1_0000 | 0x2_0000 | 0x4_0000;

/// macOS's birth time and file flags of a `stat` (`None` elsewhere, and
/// flags only where any is set).
#[cfg(target_os = "macos")]
pub(crate) fn mac_meta(
    st: &rustix::fs::Stat,
) -> (Option<capsule_format::tree::Timestamp>, Option<u32>) {
    (
        Some(capsule_format::tree::Timestamp {
            secs: st.st_birthtime,
            nanos: st.st_birthtime_nsec as u32,
        }),
        Some(st.st_flags & KEPT_FLAGS).filter(|f| *f != 0),
    )
}

/// macOS's birth time and file flags of a `stat` (`None` elsewhere, and
/// flags only where any is set).
#[cfg(not(target_os = "macos"))]
pub(crate) fn mac_meta(
    _st: &rustix::fs::Stat,
) -> (Option<capsule_format::tree::Timestamp>, Option<u32>) {
    (None, None)
}

/// Sets a birth time and file flags on an open file or directory (macOS;
/// nothing elsewhere, where neither can be set). Flags go last: with
/// `UF_IMMUTABLE` nothing else could be changed after.
#[cfg(target_os = "macos")]
#[allow(unsafe_code)]
pub(crate) fn set_mac_meta(
    fd: std::os::fd::BorrowedFd<'_>,
    btime: Option<capsule_format::tree::Timestamp>,
    flags: Option<u32>,
) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    let mut first = None;
    if let Some(t) = btime {
        let mut list = libc::attrlist {
            bitmapcount: libc::ATTR_BIT_MAP_COUNT,
            reserved: 0,
            commonattr: libc::ATTR_CMN_CRTIME,
            volattr: 0,
            dirattr: 0,
            fileattr: 0,
            forkattr: 0,
        };
        let mut ts = libc::timespec {
            tv_sec: t.secs as libc::time_t,
            tv_nsec: t.nanos as libc::c_long,
        };
        // SAFETY: an attribute list naming one timespec, and that timespec.
        let r = unsafe {
            libc::fsetattrlist(
                fd.as_raw_fd(),
                (&mut list as *mut libc::attrlist).cast(),
                (&mut ts as *mut libc::timespec).cast(),
                std::mem::size_of::<libc::timespec>(),
                0,
            )
        };
        if r != 0 {
            first = Some(std::io::Error::last_os_error());
        }
    }
    // Root's flags only as root; a stored word is masked again, as a
    // crafted tree could name any.
    let mask = if rustix::process::geteuid().is_root() {
        KEPT_FLAGS
    } else {
        KEPT_FLAGS & 0xFFFF
    };
    if let Some(f) = flags.map(|f| f & mask).filter(|f| *f != 0) {
        // SAFETY: a descriptor we hold and a flags word.
        if unsafe { libc::fchflags(fd.as_raw_fd(), f as libc::c_uint) } != 0 {
            first.get_or_insert(std::io::Error::last_os_error());
        }
    }
    first.map_or(Ok(()), Err)
}

/// Sets a birth time and file flags (macOS only).
#[cfg(not(target_os = "macos"))]
pub(crate) fn set_mac_meta(
    _fd: std::os::fd::BorrowedFd<'_>,
    _btime: Option<capsule_format::tree::Timestamp>,
    _flags: Option<u32>,
) -> std::io::Result<()> {
    Ok(())
}

/// Whether macOS's own marks keep an entry out of backups, as Time
/// Machine honours them: the `UF_NODUMP` flag, and the sticky exclusion
/// `tmutil addexclusion` writes (the extended attribute
/// `com.apple.metadata:com_apple_backup_excludeItem`). Never elsewhere.
#[cfg(target_os = "macos")]
pub(crate) fn excluded_by_system(
    st: &rustix::fs::Stat,
    path: impl FnOnce() -> std::path::PathBuf,
) -> bool {
    if st.st_flags & libc::UF_NODUMP != 0 {
        return true;
    }
    let mut none = [0u8; 0];
    rustix::fs::lgetxattr(path(), TM_EXCLUDE, &mut none).is_ok()
}

/// Whether macOS's own marks keep an entry out (never off macOS).
#[cfg(not(target_os = "macos"))]
pub(crate) fn excluded_by_system(
    _st: &rustix::fs::Stat,
    _path: impl FnOnce() -> std::path::PathBuf,
) -> bool {
    false
}

/// The extended attribute `tmutil addexclusion` sets.
#[cfg(target_os = "macos")]
const TM_EXCLUDE: &str = "com.apple.metadata:com_apple_backup_excludeItem";

/// Whether process `pid` of this machine is alive (a restore it runs may
/// still be writing; a backup whose session is on the destination may
/// still be sending what it claimed).
pub(crate) fn alive(pid: u32) -> bool {
    let Some(pid) = i32::try_from(pid)
        .ok()
        .and_then(rustix::process::Pid::from_raw)
    else {
        return false;
    };
    // EPERM: it exists, as another user's.
    match rustix::process::test_kill_process(pid) {
        Ok(()) => true,
        Err(e) => e == rustix::io::Errno::PERM,
    }
}
