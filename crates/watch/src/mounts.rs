//! The mount table, as far as the journal cares: which mounts lie below
//! the sources (a mount hides or shows a whole tree without an event in
//! it), and where the files of the sources can also be reached through a
//! path outside them, which no watcher of the sources sees.
//!
//! Two ways in from outside matter:
//! * a file system that holds more than the sources: a file of theirs may
//!   be given a second name outside them (a hard link), and a change made
//!   through that name raises an event only in the outside directory;
//! * a bind mount (or a second mount of the same file system) below a
//!   source: its files are also reached through the other mount, whose
//!   events name the other path.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

// The mount table is read as the source snapshots read it.
#[cfg(test)]
use capsule_snap::mounts::parse;
pub(crate) use capsule_snap::mounts::{holding, table, Mount};

/// Why a file of `source` may have a name outside the sources, which
/// makes no event in them: `None` when `source` is the root of a file
/// system all of which it shows.
pub(crate) fn reached_from_outside(source: &Path, table: &[Mount]) -> Option<String> {
    let m = holding(source, table)?;
    if m.point != source {
        return Some(format!(
            "{} lies on the file system mounted at {}, which holds more than the sources",
            source.display(),
            m.point.display()
        ));
    }
    if m.root != Path::new("/") {
        return Some(format!(
            "{} is a bind mount of {}, part of a larger file system",
            source.display(),
            m.root.display()
        ));
    }
    None
}

/// Mount points at or below a source whose files are also reached
/// through another path: a bind mount (it shows part of a file system),
/// or a file system mounted elsewhere too. Changes made through the other
/// path are reported under it, so these are scanned in full by every run.
pub(crate) fn shared_below(sources: &[PathBuf], table: &[Mount]) -> BTreeSet<PathBuf> {
    let below = |p: &Path| sources.iter().any(|s| p.starts_with(s));
    table
        .iter()
        .filter(|m| below(&m.point))
        // The source's own mount, when it is the file system's root, is
        // watched as the source; deeper ones are judged here.
        .filter(|m| {
            m.root != Path::new("/")
                || table
                    .iter()
                    .any(|o| o.dev == m.dev && o.point != m.point && !below(&o.point))
        })
        .map(|m| m.point.clone())
        .collect()
}

/// Mount points at or below any of `sources`.
pub(crate) fn mounts_below(sources: &[PathBuf]) -> BTreeSet<PathBuf> {
    table()
        .into_iter()
        .map(|m| m.point)
        .filter(|p| sources.iter().any(|s| p.starts_with(s)))
        .collect()
}

/// The mount table, polled for a change below the sources: a mount hides
/// or shows a whole tree without an event in it.
pub(crate) struct MountWatch {
    file: Option<std::fs::File>,
    sources: Vec<PathBuf>,
    mounts: BTreeSet<PathBuf>,
    /// The mounts below the sources reached through another path too,
    /// as last put in a journal's `unwatchable`.
    shared: BTreeSet<PathBuf>,
}

impl MountWatch {
    pub(crate) fn new(sources: &[PathBuf]) -> MountWatch {
        MountWatch {
            file: std::fs::File::open("/proc/self/mountinfo").ok(),
            sources: sources.to_vec(),
            mounts: mounts_below(sources),
            shared: BTreeSet::new(),
        }
    }

    /// Puts the mounts below the sources that are reached through
    /// another path too in `journal.unwatchable` (scanned in full by
    /// every run), in place of those put there before.
    pub(crate) fn reshare(&mut self, journal: &mut crate::journal::Journal) {
        for p in std::mem::take(&mut self.shared) {
            journal.unwatchable.remove(&p);
        }
        self.shared = shared_below(&self.sources, &table());
        journal.unwatchable.extend(self.shared.iter().cloned());
    }

    /// Whether the mounts below the sources changed since last asked.
    pub(crate) fn changed(&mut self) -> bool {
        let Some(f) = &mut self.file else {
            return false;
        };
        let mut fds = [rustix::event::PollFd::new(
            &*f,
            rustix::event::PollFlags::PRI,
        )];
        let ready =
            rustix::event::poll(&mut fds, Some(&rustix::time::Timespec::default())).unwrap_or(0);
        if ready == 0 {
            return false;
        }
        // Reading it to the end re-arms the notification.
        use std::io::{Read, Seek};
        let _ = f.seek(std::io::SeekFrom::Start(0));
        let _ = f.read_to_end(&mut Vec::new());
        let now = mounts_below(&self.sources);
        std::mem::replace(&mut self.mounts, now) != self.mounts
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    const TABLE: &str = "\
22 1 254:0 / / rw - ext4 /dev/vda rw
30 22 0:40 / /data rw - tmpfs tmpfs rw
31 22 254:0 /srv/x /home/me/src/bound rw - ext4 /dev/vda rw
32 22 0:41 / /home/me/src/disk rw - ext4 /dev/vdb rw
33 22 0:42 / /home/me/src/twice rw - ext4 /dev/vdc rw
34 22 0:42 / /mnt/again rw - ext4 /dev/vdc rw
35 22 0:43 /sub /bindsrc rw - ext4 /dev/vdd rw
36 22 0:44 / /with\\040space rw - tmpfs tmpfs rw
";

    #[test]
    fn what_reaches_the_sources_from_outside() {
        let t = parse(TABLE);
        assert_eq!(t[7].point, Path::new("/with space"));
        let src = [PathBuf::from("/home/me/src")];
        // A bind mount, and a file system mounted elsewhere too: scanned
        // in full; a file system mounted only below the source: watched.
        let shared = shared_below(&src, &t);
        assert_eq!(
            shared.into_iter().collect::<Vec<_>>(),
            [
                PathBuf::from("/home/me/src/bound"),
                PathBuf::from("/home/me/src/twice")
            ]
        );
        // Hard links from outside: a source that is not its file
        // system's root, or that shows only part of one.
        let why = reached_from_outside(Path::new("/home/me/src"), &t).unwrap();
        assert!(why.contains("mounted at /,"), "{why}");
        assert!(reached_from_outside(Path::new("/data"), &t).is_none());
        assert!(reached_from_outside(Path::new("/data/x"), &t).is_some());
        let why = reached_from_outside(Path::new("/bindsrc"), &t).unwrap();
        assert!(why.contains("bind mount of /sub"), "{why}");
    }
}
