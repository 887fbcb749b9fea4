//! The mount table: which file system holds a path, what kind it is, and
//! what is mounted below a path.

#[cfg(target_os = "macos")]
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

/// One line of `/proc/self/mountinfo`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mount {
    /// The device (`major:minor`): one file system, wherever mounted.
    pub dev: String,
    /// The directory of that file system shown here (`/` for all of it;
    /// for btrfs, the subvolume mounted).
    pub root: PathBuf,
    /// Where it is mounted.
    pub point: PathBuf,
    /// The file-system type (`btrfs`, `ext4`, `zfs`…).
    pub fstype: String,
    /// What is mounted: a block device, a ZFS dataset, a share.
    pub source: String,
}

/// The mount table (`getmntinfo`; empty when it cannot be read). APFS
/// shows the data volume at `/` through firmlinks: a path's volume is
/// found by [`holding`] from its own `statfs`, not by its prefix.
#[allow(unsafe_code)]
#[cfg(target_os = "macos")]
pub fn table() -> Vec<Mount> {
    use std::os::unix::fs::MetadataExt;
    let mut list: *mut libc::statfs = std::ptr::null_mut();
    // SAFETY: getmntinfo points `list` at a buffer it owns (valid until
    // the next call in this thread) and returns how many it holds.
    let n = unsafe { libc::getmntinfo(&mut list, libc::MNT_NOWAIT) };
    if n <= 0 || list.is_null() {
        return Vec::new();
    }
    // SAFETY: `n` entries, as getmntinfo said.
    let all = unsafe { std::slice::from_raw_parts(list, n as usize) };
    let text = |c: &[libc::c_char]| {
        // SAFETY: the fields are NUL-terminated within their arrays.
        unsafe { std::ffi::CStr::from_ptr(c.as_ptr()) }
            .to_string_lossy()
            .into_owned()
    };
    all.iter()
        .map(|f| {
            let point = PathBuf::from(text(&f.f_mntonname));
            let dev = std::fs::metadata(&point).map_or(0, |m| m.dev());
            Mount {
                dev: format!(
                    "{}:{}",
                    rustix::fs::major(dev as _),
                    rustix::fs::minor(dev as _)
                ),
                root: PathBuf::from("/"),
                point,
                fstype: text(&f.f_fstypename),
                source: text(&f.f_mntfromname),
            }
        })
        .collect()
}

/// The mount table of this process (empty when it cannot be read).
#[cfg(not(target_os = "macos"))]
pub fn table() -> Vec<Mount> {
    std::fs::read_to_string("/proc/self/mountinfo")
        .map(|t| parse(&t))
        .unwrap_or_default()
}

/// Reads the text of `/proc/self/mountinfo`.
pub fn parse(text: &str) -> Vec<Mount> {
    text.lines()
        .filter_map(|l| {
            let (head, tail) = l.split_once(" - ")?;
            let mut f = head.split(' ');
            let dev = f.nth(2)?;
            let root = f.next()?;
            let point = f.next()?;
            let mut t = tail.split(' ');
            let fstype = t.next().unwrap_or_default();
            let source = t.next().unwrap_or_default();
            Some(Mount {
                dev: dev.to_string(),
                root: PathBuf::from(unescape(root)),
                point: PathBuf::from(unescape(point)),
                fstype: fstype.to_string(),
                source: unescape(source).to_string_lossy().into_owned(),
            })
        })
        .collect()
}

/// The mount that `path` lies on: the one `statfs` names for it.
#[allow(unsafe_code)]
#[cfg(target_os = "macos")]
pub fn holding<'t>(path: &Path, table: &'t [Mount]) -> Option<&'t Mount> {
    let st = rustix::fs::statfs(path).ok()?;
    // SAFETY: NUL-terminated within its array.
    let on = unsafe { std::ffi::CStr::from_ptr(st.f_mntonname.as_ptr()) };
    let on = Path::new(std::ffi::OsStr::from_bytes(on.to_bytes()));
    table.iter().rev().find(|m| m.point == on)
}

/// The mount that `path` lies on (the last mounted of the longest mount
/// points above it).
#[cfg(not(target_os = "macos"))]
pub fn holding<'t>(path: &Path, table: &'t [Mount]) -> Option<&'t Mount> {
    table
        .iter()
        .filter(|m| path.starts_with(&m.point))
        .fold(None, |best: Option<&Mount>, m| match best {
            Some(b) if b.point.components().count() > m.point.components().count() => Some(b),
            _ => Some(m),
        })
}

/// The mounts strictly below `path`.
pub fn below<'t>(path: &'t Path, table: &'t [Mount]) -> impl Iterator<Item = &'t Mount> + 't {
    table
        .iter()
        .filter(move |m| m.point != path && m.point.starts_with(path))
}

/// `/proc/self/mountinfo` writes space, tab, newline and backslash in
/// paths as octal escapes.
pub fn unescape(p: &str) -> std::ffi::OsString {
    use std::os::unix::ffi::OsStringExt;
    let b = p.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 3 < b.len()
            && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            out.push((b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0'));
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    std::ffi::OsString::from_vec(out)
}

#[cfg(all(test, not(target_os = "macos")))]
mod tests {
    use super::*;

    const TABLE: &str = "\
22 1 254:0 / / rw - ext4 /dev/vda rw
30 22 0:40 / /data rw - tmpfs tmpfs rw
40 22 0:45 /@home /home rw,relatime shared:5 - btrfs /dev/loop0 rw,subvol=/@home
41 40 0:46 / /home/me/my\\040disk rw - zfs tank/disk rw
";

    #[test]
    fn the_mount_holding_a_path_and_those_below() {
        let t = parse(TABLE);
        assert_eq!(t.len(), 4);
        let h = holding(Path::new("/home/me/docs"), &t).unwrap();
        assert_eq!(
            (h.fstype.as_str(), h.source.as_str()),
            ("btrfs", "/dev/loop0")
        );
        assert_eq!(h.root, Path::new("/@home"));
        let z = holding(Path::new("/home/me/my disk/x"), &t).unwrap();
        assert_eq!((z.fstype.as_str(), z.source.as_str()), ("zfs", "tank/disk"));
        let b: Vec<_> = below(Path::new("/home"), &t)
            .map(|m| m.point.clone())
            .collect();
        assert_eq!(b, vec![PathBuf::from("/home/me/my disk")]);
        assert_eq!(holding(Path::new("/etc"), &t).unwrap().fstype, "ext4");
    }
}
