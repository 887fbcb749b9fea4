//! `capsule mount`: a repository's snapshots as a read-only FUSE file
//! system.
//!
//! ```text
//! MOUNTPOINT/
//!   snapshots/<time>/…       every snapshot, as it was backed up
//!   hosts/<host>/<time>      the same, by host (links into snapshots/)
//!   latest                   a link to the newest snapshot
//!   versions/…               every path any snapshot holds; a file there
//!                            is a directory of its distinct versions
//! ```
//!
//! Everything is served from one [`Browser`](capsule_engine::browse::Browser): a directory costs its own
//! tree, from a bounded cache; a file read fetches neighbouring blobs of a
//! pack in one ranged read and reads ahead of a reader reading in order.
//! An entry inside a snapshot costs nothing while the kernel holds it: its
//! inode number says which directory and which position (see `inodes`);
//! other inodes (snapshots, hosts, `versions/`) are remembered until the
//! kernel forgets them.

mod fs;
mod inodes;
mod ops;

use std::path::{Path, PathBuf};

pub use capsule_engine::browse::{Refresh, View};

pub use fs::{CapsuleFs, MountError};

/// Checks that `path` can be mounted on: an existing directory, not a
/// mount point already.
pub fn check_mount_point(path: &Path) -> Result<(), MountError> {
    let bad = |why: String| MountError::MountPoint {
        path: path.to_path_buf(),
        why,
    };
    let m = std::fs::metadata(path).map_err(|e| {
        bad(match e.kind() {
            std::io::ErrorKind::NotFound => {
                "no such directory (create it first: mkdir -p …)".to_string()
            }
            // A FUSE mount whose process died answers ENOTCONN.
            _ if e.raw_os_error() == Some(libc::ENOTCONN) => {
                "a mount whose process has gone is still there: `fusermount -u` it (or `umount -l`)"
                    .to_string()
            }
            _ => e.to_string(),
        })
    })?;
    if !m.is_dir() {
        return Err(bad("not a directory".into()));
    }
    let abs = std::fs::canonicalize(path).map_err(|e| bad(e.to_string()))?;
    let busy = is_mount_point(&abs);
    if busy {
        return Err(bad(
            "something is mounted there already (unmount it first: `fusermount -u` or `umount`)"
                .into(),
        ));
    }
    Ok(())
}

/// Whether something is mounted at `abs`.
#[cfg(not(target_os = "macos"))]
fn is_mount_point(abs: &Path) -> bool {
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    mounts.lines().any(|l| {
        l.split(' ')
            .nth(4)
            .is_some_and(|p| Path::new(&unescape_mountinfo(p)) == abs)
    })
}

/// Whether something is mounted at `abs`: its `statfs` names it.
#[cfg(target_os = "macos")]
#[allow(unsafe_code)]
fn is_mount_point(abs: &Path) -> bool {
    rustix::fs::statfs(abs).is_ok_and(|st| {
        // SAFETY: NUL-terminated within its array.
        let on = unsafe { std::ffi::CStr::from_ptr(st.f_mntonname.as_ptr()) };
        on.to_bytes() == abs.as_os_str().as_encoded_bytes()
    })
}

/// mountinfo escapes space, tab, newline and backslash as octal.
#[cfg(not(target_os = "macos"))]
fn unescape_mountinfo(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 3 < b.len() && b[i + 1..i + 4].iter().all(u8::is_ascii_digit) {
            let v = (b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0');
            out.push(v);
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// A mounted file system; dropping it unmounts.
pub struct Mounted {
    session: Option<fuser::BackgroundSession>,
    #[cfg_attr(not(target_os = "linux"), allow(dead_code))] // a forced detach
    path: PathBuf,
}

impl Mounted {
    /// Whether the file system was unmounted from outside (`umount`).
    pub fn ended(&self) -> bool {
        self.session.as_ref().is_none_or(|s| s.guard.is_finished())
    }

    /// Unmounts and waits for the session to end. When something still
    /// uses the mount (a shell inside it, an open file), detaches it
    /// instead: it is gone from the tree at once, and what held it gets
    /// errors once this process ends. Returns whether it was busy.
    pub fn unmount(mut self) -> std::io::Result<bool> {
        let Some(s) = self.session.take() else {
            return Ok(false);
        };
        match s.umount_and_join() {
            Ok(()) => Ok(false),
            Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {
                #[cfg(target_os = "linux")]
                {
                    rustix::mount::unmount(&self.path, rustix::mount::UnmountFlags::DETACH)?;
                    Ok(true)
                }
                // No session is ever made where there is no FUSE.
                #[cfg(not(target_os = "linux"))]
                Err(e)
            }
            Err(e) => Err(e),
        }
    }
}

/// On macOS: no mount (this build is made without macFUSE).
#[cfg(target_os = "macos")]
pub fn mount(_fs: CapsuleFs, path: &Path, _threads: usize) -> Result<Mounted, MountError> {
    check_mount_point(path)?;
    Err(MountError::Unavailable(
        "on macOS it needs macFUSE, and this build was made without it; browse snapshots with `capsule ls`, `capsule find` or the page (`capsule ui`), and take files back with `capsule restore`",
    ))
}

/// Mounts `fs` read-only on `path`, served by `threads` threads.
#[cfg(not(target_os = "macos"))]
pub fn mount(fs: CapsuleFs, path: &Path, threads: usize) -> Result<Mounted, MountError> {
    check_mount_point(path)?;
    let mut config = fuser::Config::default();
    config.mount_options = vec![
        fuser::MountOption::RO,
        fuser::MountOption::FSName("capsule".into()),
        fuser::MountOption::Subtype("capsule".into()),
        fuser::MountOption::DefaultPermissions,
    ];
    config.n_threads = Some(threads.max(1));
    let err = |source| MountError::Mount {
        path: path.to_path_buf(),
        source,
    };
    let session = fuser::Session::new(fs, path, &config).map_err(err)?;
    Ok(Mounted {
        session: Some(session.spawn().map_err(err)?),
        path: path.to_path_buf(),
    })
}
