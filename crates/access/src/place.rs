//! Where a local repository's file system was when it last opened. The
//! mount point of a disk that is not plugged in is an empty directory: a
//! repository that was there, on a file system of its own, is then away
//! (exit 14, which the daemon waits out), not a place without one (exit
//! 11, which needs the user). A directory that never held one stays "not a
//! repository".

use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// capsule's state directory (`CAPSULE_STATE_DIR`, else
/// `$XDG_STATE_HOME/capsule`, else `~/.local/state/capsule`).
pub fn state_dir() -> Option<PathBuf> {
    if let Some(d) = std::env::var_os("CAPSULE_STATE_DIR").filter(|d| !d.is_empty()) {
        return Some(PathBuf::from(d));
    }
    if let Some(d) = std::env::var_os("XDG_STATE_HOME").filter(|d| !d.is_empty()) {
        return Some(PathBuf::from(d).join("capsule"));
    }
    std::env::var_os("HOME")
        .filter(|h| !h.is_empty())
        .map(|h| PathBuf::from(h).join(".local/state/capsule"))
}

fn record(repo: &Path) -> Option<PathBuf> {
    let real = std::fs::canonicalize(repo).ok()?;
    let h = blake3::hash(real.as_os_str().as_bytes()).to_hex();
    Some(state_dir()?.join("places").join(&h[..32]))
}

/// The top of the file system holding `p`: the highest directory above
/// it on the same device.
fn fs_top(p: &Path) -> Option<PathBuf> {
    let real = std::fs::canonicalize(p).ok()?;
    let dev = std::fs::metadata(&real).ok()?.dev();
    let mut top = real.clone();
    while let Some(up) = top.parent() {
        match std::fs::metadata(up) {
            Ok(m) if m.dev() == dev => top = up.to_path_buf(),
            _ => break,
        }
    }
    Some(top)
}

/// Notes where the repository at `repo` is, after it opened.
pub(crate) fn remember(repo: &Path) {
    let (Some(rec), Some(top)) = (record(repo), fs_top(repo)) else {
        return;
    };
    let line = top.as_os_str().as_bytes().to_vec();
    if std::fs::read(&rec).is_ok_and(|b| b == line) {
        return;
    }
    // Best effort: without it, an unplugged disk reads as "not a
    // repository", as before.
    if let Some(d) = rec.parent() {
        let _ = std::fs::create_dir_all(d);
    }
    let tmp = rec.with_extension("tmp");
    if std::fs::write(&tmp, &line).is_ok() {
        let _ = std::fs::rename(&tmp, &rec);
    }
}

/// Why the repository that opened at `repo` before is away now, if its
/// path is on another file system than it was (its own disk's is not
/// mounted there).
pub(crate) fn away(repo: &Path) -> Option<String> {
    let was = std::fs::read(record(repo)?).ok()?;
    let was = PathBuf::from(std::ffi::OsStr::from_bytes(&was));
    let now = fs_top(repo)?;
    (was != now).then(|| {
        format!(
            "{} holds no repository, and it is not on the file system the repository was on when it last opened (mounted at {}; now the path is on the one at {}): a disk not plugged in, or a share not mounted?",
            repo.display(),
            was.display(),
            now.display()
        )
    })
}
