//! Reaching a directory as root without following anything another user
//! could plant: one component at a time from `/`, each opened with
//! `O_NOFOLLOW` relative to its parent's descriptor, and every directory
//! on the way one that only root or this user can change (ssh's
//! `StrictModes`, systemd's "unsafe transition" rule). What is opened is
//! then acted on by descriptor, never by its path again.

use std::ffi::OsStr;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Component, Path};

use rustix::fs::{Mode, OFlags, Stat};

use crate::SnapError;

/// Flags that open a directory and nothing else, never through a link.
pub(crate) fn dir_flags() -> OFlags {
    OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC
}

fn ours(st: &Stat) -> bool {
    st.st_uid == 0 || st.st_uid == rustix::process::geteuid().as_raw()
}

/// Whether a user other than root and this one can add, remove or rename
/// entries in directory `st`.
pub(crate) fn others_can_write(st: &Stat) -> bool {
    !ours(st) || st.st_mode & 0o022 != 0
}

fn why(st: &Stat) -> String {
    format!(
        "is owned by uid {} with mode {:o}, so another user can change what it holds",
        st.st_uid,
        st.st_mode & 0o7777
    )
}

fn untrusted(at: &Path, why: String) -> SnapError {
    SnapError::Untrusted {
        path: at.display().to_string(),
        why,
    }
}

/// Opens the directory at `path` (absolute, without `..`), failing with
/// [`SnapError::Untrusted`] where a link is on the way, or a directory on
/// the way (or the directory itself) is one another user can write. A
/// world-writable sticky directory (`/tmp`) may be passed through to an
/// entry owned by root or this user: the sticky bit keeps others from
/// renaming or removing it.
pub(crate) fn open_dir(path: &Path) -> Result<OwnedFd, SnapError> {
    let mut at = std::path::PathBuf::from("/");
    let mut fd = rustix::fs::open("/", dir_flags(), Mode::empty())
        .map_err(|e| SnapError::io("open", &at, e.into()))?;
    let mut st = rustix::fs::fstat(&fd).map_err(|e| SnapError::io("read", &at, e.into()))?;
    for c in path.components() {
        let name = match c {
            Component::RootDir | Component::CurDir => continue,
            Component::Normal(n) => n,
            Component::Prefix(_) | Component::ParentDir => {
                return Err(untrusted(path, "is not an absolute, normal path".into()))
            }
        };
        at.push(name);
        let next = open_one(&fd, name, &at)?;
        let next_st = rustix::fs::fstat(&next).map_err(|e| SnapError::io("read", &at, e.into()))?;
        let sticky = st.st_mode & 0o1000 != 0;
        if others_can_write(&st) && !(sticky && ours(&next_st)) {
            let parent = at.parent().unwrap_or(Path::new("/"));
            return Err(untrusted(parent, why(&st)));
        }
        (fd, st) = (next, next_st);
    }
    if others_can_write(&st) {
        return Err(untrusted(&at, why(&st)));
    }
    Ok(fd)
}

/// Opens directory `name` in `dir`, never through a link.
fn open_one(dir: &impl AsFd, name: &OsStr, at: &Path) -> Result<OwnedFd, SnapError> {
    rustix::fs::openat(dir, name, dir_flags(), Mode::empty()).map_err(|e| {
        if e == rustix::io::Errno::LOOP || e == rustix::io::Errno::NOTDIR {
            untrusted(
                at,
                "is a symbolic link or not a directory; capsule does not follow links to where it takes or removes snapshots".into(),
            )
        } else {
            SnapError::io("open", at, e.into())
        }
    })
}

/// Opens the directory `rel` below `dir` (whose path is `base`), one
/// component at a time, never through a link; no ownership is asked of
/// what lies on the way (the caller only reads what it opens).
pub(crate) fn open_below(dir: &OwnedFd, base: &Path, rel: &Path) -> Result<OwnedFd, SnapError> {
    let mut at = base.to_path_buf();
    let mut fd: Option<OwnedFd> = None;
    for c in rel.components() {
        let Component::Normal(name) = c else {
            if c == Component::CurDir {
                continue;
            }
            return Err(untrusted(rel, "is not a relative, normal path".into()));
        };
        at.push(name);
        let next = match &fd {
            Some(f) => open_one(f, name, &at)?,
            None => open_one(dir, name, &at)?,
        };
        fd = Some(next);
    }
    match fd {
        Some(f) => Ok(f),
        None => rustix::fs::openat(dir, ".", dir_flags(), Mode::empty())
            .map_err(|e| SnapError::io("open", base, e.into())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_link_on_the_way_or_a_directory_others_can_write_is_refused() {
        let t = std::env::temp_dir().join(format!("capsule-trusted-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&t);
        std::fs::create_dir_all(t.join("a/b")).unwrap();
        std::os::unix::fs::symlink(t.join("a"), t.join("link")).unwrap();
        let t = std::fs::canonicalize(&t).unwrap();
        // Whether the temporary directory's own chain is trusted depends on
        // the machine; below it, this test sets the rules.
        if open_dir(&t).is_ok() {
            assert!(open_dir(&t.join("a/b")).is_ok());
            let e = open_dir(&t.join("link/b")).unwrap_err();
            assert!(matches!(e, SnapError::Untrusted { .. }), "{e}");
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(t.join("a"), std::fs::Permissions::from_mode(0o777)).unwrap();
            let e = open_dir(&t.join("a/b")).unwrap_err();
            assert!(e.to_string().contains("mode 777"), "{e}");
            let e = open_dir(&t.join("a")).unwrap_err();
            assert!(e.to_string().contains("mode 777"), "{e}");
        }
        let top = open_dir(Path::new("/")).unwrap();
        assert!(open_below(
            &top,
            Path::new("/"),
            t.join("link").strip_prefix("/").unwrap()
        )
        .is_err());
        let _ = std::fs::remove_dir_all(&t);
    }
}
