//! Reading the files capsule keeps for itself on this machine (its cache
//! and state directories: key hints, cached objects, run records, journals).
//!
//! They are local and usually written by capsule, but anything with the
//! user's rights can replace one, and a FIFO, a symlink to `/dev/zero` or a
//! file of gigabytes must not hang or exhaust a command that only hoped to
//! save some work. So each is opened without following a symlink, without
//! blocking, and only when it is a regular file, and read only up to a
//! bound the caller states.

use std::fs::File;
use std::io::{Error, ErrorKind, Read};
use std::path::Path;

use rustix::fs::{FileType, Mode, OFlags};

/// Opens `path` for reading if it is a regular file, never following a
/// symlink at its last component and never blocking (a FIFO is refused, not
/// waited on). `NotFound` when there is nothing there.
pub fn open_regular(path: &Path) -> std::io::Result<File> {
    let fd = rustix::fs::open(
        path,
        OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| {
        if e == rustix::io::Errno::LOOP {
            Error::new(
                ErrorKind::InvalidData,
                "a symlink, not a file capsule wrote",
            )
        } else {
            Error::from(e)
        }
    })?;
    let st = rustix::fs::fstat(&fd)?;
    if FileType::from_raw_mode(st.st_mode) != FileType::RegularFile {
        return Err(Error::new(
            ErrorKind::InvalidData,
            "not a regular file, so not one capsule wrote",
        ));
    }
    Ok(File::from(fd))
}

/// Reads all of regular file `path` ([`open_regular`]) if it holds at most
/// `max` bytes; a larger one is refused before it is read.
pub fn read_bounded(path: &Path, max: u64) -> std::io::Result<Vec<u8>> {
    let f = open_regular(path)?;
    let len = f.metadata()?.len();
    if len > max {
        return Err(too_large(len, max));
    }
    let mut out = Vec::with_capacity(len as usize);
    // Bounded again while reading: the file may grow after the fstat.
    f.take(max + 1).read_to_end(&mut out)?;
    if out.len() as u64 > max {
        return Err(too_large(out.len() as u64, max));
    }
    Ok(out)
}

fn too_large(len: u64, max: u64) -> Error {
    Error::new(
        ErrorKind::InvalidData,
        format!("{len} bytes, more than the {max} such a file may hold"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fifos_symlinks_devices_and_large_files_are_refused() {
        let t = tempfile::tempdir().unwrap();
        let p = t.path().join("ok");
        std::fs::write(&p, b"abc").unwrap();
        assert_eq!(read_bounded(&p, 3).unwrap(), b"abc");
        assert_eq!(
            read_bounded(&p, 2).unwrap_err().kind(),
            ErrorKind::InvalidData
        );
        let link = t.path().join("zero");
        std::os::unix::fs::symlink("/dev/zero", &link).unwrap();
        assert_eq!(
            read_bounded(&link, 100).unwrap_err().kind(),
            ErrorKind::InvalidData
        );
        let fifo = t.path().join("fifo");
        // mkfifo(1): rustix has no mknodat on macOS.
        assert!(std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap()
            .success());
        // Returns at once (no writer would ever come).
        assert_eq!(
            read_bounded(&fifo, 100).unwrap_err().kind(),
            ErrorKind::InvalidData
        );
        assert_eq!(
            read_bounded(Path::new("/dev/zero"), 100)
                .unwrap_err()
                .kind(),
            ErrorKind::InvalidData
        );
        assert_eq!(
            read_bounded(&t.path().join("none"), 100)
                .unwrap_err()
                .kind(),
            ErrorKind::NotFound
        );
    }
}
