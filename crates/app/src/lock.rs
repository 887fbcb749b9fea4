//! A profile's advisory locks: one run at a time, one daemon per profile,
//! across processes (`flock`: the kernel releases a lock when its process
//! dies, so a killed run or daemon leaves nothing behind).

use std::os::fd::OwnedFd;
use std::path::PathBuf;

use crate::error::{Busy, Error, Result};

/// An advisory lock on a file in the state directory, held until dropped
/// (or until the process dies: the kernel releases it).
pub struct ProfileLock {
    _fd: OwnedFd,
}

fn lock_path(profile: &str, kind: &str) -> Option<PathBuf> {
    let id = &capsule_format::ObjectId::of(profile.as_bytes()).to_hex()[..16];
    capsule_lab::history::state_dir().map(|d| d.join("locks").join(format!("{id}.{kind}")))
}

impl ProfileLock {
    /// Takes `profile`'s lock of `kind` ("run" or "daemon") without
    /// waiting. `Err(Busy)` names the process that holds it.
    pub fn acquire(profile: &str, kind: &str) -> Result<Option<ProfileLock>> {
        let io =
            |e: std::io::Error| Error::io(format!("the {kind} lock of profile {profile:?}"), e);
        use rustix::fs::{FlockOperation, Mode, OFlags};
        let Some(path) = lock_path(profile, kind) else {
            return Ok(None);
        };
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(io)?;
        }
        let fd = rustix::fs::open(
            &path,
            OFlags::RDWR | OFlags::CREATE | OFlags::CLOEXEC | OFlags::NOFOLLOW,
            Mode::from_raw_mode(0o600),
        )
        .map_err(|e| io(e.into()))?;
        match rustix::fs::flock(&fd, FlockOperation::NonBlockingLockExclusive) {
            Ok(()) => {}
            Err(e) if e == rustix::io::Errno::WOULDBLOCK => {
                let holder = std::fs::read_to_string(&path).unwrap_or_default();
                return Err(Busy(format!(
                    "profile {profile:?}: another {} holds it{}",
                    if kind == "daemon" { "daemon" } else { "run" },
                    match holder.trim() {
                        "" => String::new(),
                        pid => format!(" (process {pid})"),
                    }
                ))
                .into());
            }
            Err(e) => return Err(io(e.into())),
        }
        // Who holds it, for the message another process gives.
        rustix::fs::ftruncate(&fd, 0).map_err(|e| io(e.into()))?;
        let _ = rustix::io::pwrite(&fd, std::process::id().to_string().as_bytes(), 0);
        Ok(Some(ProfileLock { _fd: fd }))
    }
}
