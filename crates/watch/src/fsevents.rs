//! The FSEvents watcher's rules (macOS), kept apart from the stream that
//! feeds them so they run, and are tested, on any system: how an event
//! marks the journal, which events are losses, and when a watcher that
//! starts may resume from the last event an earlier one saw.
//!
//! FSEvents differs from the Linux watchers in one way that matters: its
//! event IDs persist across restarts and reboots in a per-volume database,
//! so a daemon that starts again asks for the events after the last one it
//! recorded (`sinceWhen`) and gets what happened while it was not running,
//! as Time Machine does. That is trusted only while the volume is the one
//! the earlier watcher saw: `FSEventsCopyUUIDForDevice` names the volume's
//! event database, and a new UUID (a reformat, another disk under the same
//! name, a database reset) means the history in between is gone. Event
//! IDs never go back on one machine; an ID lower than the one recorded
//! means they wrapped, or the journal is not this machine's.
//!
//! Losses (the next run scans in full): `MustScanSubDirs` (FSEvents
//! coalesced events above the directories it could name, with or without
//! `UserDropped`/`KernelDropped`), `EventIdsWrapped`, `RootChanged` (a
//! source, or a directory above it, was moved, renamed or deleted: a
//! volume renamed in `/Volumes` is one), `Mount`/`Unmount` at or below a
//! source, and any item event FSEvents names outside the sources (its
//! paths are real paths; one that cannot be placed is not dropped).
//!
//! Blind spots, as on Linux: FSEvents names a file by the path of the
//! vnode written, which for a file with several names may be a name
//! outside the sources; directories holding files with several names are
//! listed by every run (`Base::linked`), as they are on Linux. A write
//! through a descriptor whose outside name was removed is named by the
//! file's one remaining path, inside. What FSEvents coalesces within its
//! latency is still named (by directory), so nothing is lost by it.

use std::path::{Path, PathBuf};

use crate::journal::Journal;
pub use crate::journal::Mark;
use crate::watcher::skipped;

/// `FSEventStreamEventFlags`, as FSEvents.h numbers them.
pub mod flag {
    /// Events were coalesced above the directories named: scan below.
    pub const MUST_SCAN_SUB_DIRS: u32 = 0x0000_0001;
    /// The client fell behind and events were dropped.
    pub const USER_DROPPED: u32 = 0x0000_0002;
    /// The kernel fell behind and events were dropped.
    pub const KERNEL_DROPPED: u32 = 0x0000_0004;
    /// Event IDs wrapped around.
    pub const EVENT_IDS_WRAPPED: u32 = 0x0000_0008;
    /// The replay of history (`sinceWhen`) is done.
    pub const HISTORY_DONE: u32 = 0x0000_0010;
    /// A watched root, or a directory above it, changed (`WatchRoot`).
    pub const ROOT_CHANGED: u32 = 0x0000_0020;
    /// A volume was mounted below a watched path.
    pub const MOUNT: u32 = 0x0000_0040;
    /// A volume was unmounted below a watched path.
    pub const UNMOUNT: u32 = 0x0000_0080;
    /// The item was created.
    pub const ITEM_CREATED: u32 = 0x0000_0100;
    /// The item was removed.
    pub const ITEM_REMOVED: u32 = 0x0000_0200;
    /// The item's inode metadata changed.
    pub const ITEM_INODE_META_MOD: u32 = 0x0000_0400;
    /// The item was renamed (one event per side).
    pub const ITEM_RENAMED: u32 = 0x0000_0800;
    /// The item's content changed.
    pub const ITEM_MODIFIED: u32 = 0x0000_1000;
    /// The item's Finder information changed.
    pub const ITEM_FINDER_INFO_MOD: u32 = 0x0000_2000;
    /// The item's owner changed.
    pub const ITEM_CHANGE_OWNER: u32 = 0x0000_4000;
    /// The item's extended attributes changed.
    pub const ITEM_XATTR_MOD: u32 = 0x0000_8000;
    /// The item is a file.
    pub const ITEM_IS_FILE: u32 = 0x0001_0000;
    /// The item is a directory.
    pub const ITEM_IS_DIR: u32 = 0x0002_0000;
    /// The item is a symbolic link.
    pub const ITEM_IS_SYMLINK: u32 = 0x0004_0000;
    /// The item is a hard link.
    pub const ITEM_IS_HARDLINK: u32 = 0x0010_0000;
    /// The item was cloned.
    pub const ITEM_CLONED: u32 = 0x0040_0000;
}

/// One event as the stream delivers it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    /// The real path FSEvents names.
    pub path: PathBuf,
    /// Its flags ([`flag`]).
    pub flags: u32,
    /// Its event ID (persistent, increasing).
    pub id: u64,
}

/// Where a starting watcher begins.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Resume {
    /// Ask for the events after this ID: the earlier journal goes on.
    From(u64),
    /// Start a new journal (the next run scans in full), and why.
    Fresh(String),
}

/// The resume rule: an earlier journal of the same scope, written by an
/// FSEvents watcher, goes on from its last event if every source's volume
/// still has the event database it had, and the IDs have not gone back.
pub fn resume(
    saved: Option<&Journal>,
    scope: &str,
    volumes_now: &[(String, String)],
    current_id: u64,
) -> Resume {
    let Some(j) = saved else {
        return Resume::Fresh("no journal from an earlier watcher".into());
    };
    let Some(mark) = j.fsevents.as_ref() else {
        return Resume::Fresh(format!(
            "the earlier journal was kept by {}, which cannot resume",
            j.identity.kind
        ));
    };
    if j.identity.scope != scope {
        return Resume::Fresh("the sources or excludes changed since the journal started".into());
    }
    if let Some(why) = &j.degraded {
        return Resume::Fresh(format!("the earlier watcher had stopped: {why}"));
    }
    for (source, uuid) in volumes_now {
        if uuid.is_empty() {
            return Resume::Fresh(format!(
                "{source} is not on a volume with an event history now (the volume was renamed or unmounted, or keeps none)"
            ));
        }
        match mark.volumes.iter().find(|(s, _)| s == source) {
            Some((_, was)) if was == uuid => {}
            Some(_) => {
                return Resume::Fresh(format!(
                    "the volume of {source} is not the one the journal saw (its event database's UUID changed: reformatted, replaced, or its history reset)"
                ))
            }
            None => {
                return Resume::Fresh(format!(
                    "{source} was not watched by the earlier journal"
                ))
            }
        }
    }
    if mark.volumes.len() != volumes_now.len() {
        return Resume::Fresh("the sources changed since the journal started".into());
    }
    if mark.last_id > current_id {
        return Resume::Fresh(format!(
            "event IDs went back (the journal's last is {}, the system's is {current_id}): they wrapped, or the journal is another machine's",
            mark.last_id
        ));
    }
    Resume::From(mark.last_id)
}

/// Marks the journal for events, under the rules above.
pub struct Recorder {
    sources: Vec<PathBuf>,
    skip: Vec<PathBuf>,
    /// Whether the stream is still replaying history (`HISTORY_DONE` not
    /// seen yet).
    pub replaying: bool,
}

impl Recorder {
    /// A recorder for these (walked) sources, leaving out `skip`.
    pub fn new(sources: Vec<PathBuf>, skip: Vec<PathBuf>, replaying: bool) -> Recorder {
        Recorder {
            sources,
            skip,
            replaying,
        }
    }

    fn inside(&self, p: &Path) -> bool {
        self.sources.iter().any(|s| p.starts_with(s))
    }

    /// Records one event; the journal's mark moves to its ID.
    pub fn record(&mut self, journal: &mut Journal, ev: &Event) {
        use flag::*;
        let f = ev.flags;
        if let Some(m) = journal.fsevents.as_mut() {
            m.last_id = m.last_id.max(ev.id);
        }
        if f & HISTORY_DONE != 0 {
            self.replaying = false;
            return;
        }
        if f & (USER_DROPPED | KERNEL_DROPPED) != 0 {
            journal.lose(format!(
                "FSEvents dropped events ({} fell behind)",
                if f & KERNEL_DROPPED != 0 {
                    "the kernel"
                } else {
                    "the watcher"
                }
            ));
            return;
        }
        if f & MUST_SCAN_SUB_DIRS != 0 {
            journal.lose(format!(
                "FSEvents coalesced changes below {} without naming them",
                ev.path.display()
            ));
            return;
        }
        if f & EVENT_IDS_WRAPPED != 0 {
            journal.lose("FSEvents event IDs wrapped around");
            return;
        }
        if f & ROOT_CHANGED != 0 {
            journal.lose(format!(
                "{} (a source or a directory above it) was moved, renamed or deleted",
                ev.path.display()
            ));
            return;
        }
        if f & (MOUNT | UNMOUNT) != 0 {
            journal.lose(format!(
                "a volume was {} at {}",
                if f & MOUNT != 0 {
                    "mounted"
                } else {
                    "unmounted"
                },
                ev.path.display()
            ));
            return;
        }
        if skipped(&self.skip, &ev.path) {
            return;
        }
        if !self.inside(&ev.path) {
            journal.lose(format!(
                "FSEvents named {}, outside the sources: a change that cannot be placed",
                ev.path.display()
            ));
            return;
        }
        let parent = ev
            .path
            .parent()
            .filter(|p| self.inside(p))
            .map(Path::to_path_buf);
        if f & ITEM_IS_DIR != 0 {
            if f & (ITEM_CREATED | ITEM_RENAMED) != 0 {
                // Moved in or made: what happened in it before is not in
                // the stream under this name.
                journal.deep(&ev.path);
            } else {
                journal.dirty(&ev.path);
            }
        } else if f & (ITEM_IS_FILE | ITEM_IS_SYMLINK | ITEM_IS_HARDLINK) == 0 {
            // No item flags: a directory-level event (the stream's own
            // coalescing), naming the directory whose entries changed.
            journal.dirty(&ev.path);
        }
        // A file's (and a directory's own) name and metadata live in the
        // parent's listing.
        match parent {
            Some(p) => journal.dirty(&p),
            None => journal.dirty(&ev.path),
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::flag::*;
    use super::*;
    use crate::journal::{Base, Identity};
    use std::collections::BTreeSet;

    fn journal(volumes: &[(&str, &str)], last_id: u64) -> Journal {
        let mut j = Journal::new(Identity::new("fsevents", "scope".into(), &[]));
        j.fsevents = Some(Mark {
            last_id,
            volumes: volumes
                .iter()
                .map(|(s, u)| (s.to_string(), u.to_string()))
                .collect(),
        });
        j
    }

    /// The base a run cut from `j` now would keep.
    fn base(j: &Journal, snapshot: &str) -> Base {
        Base {
            identity: j.identity.clone(),
            cut: j.cut(),
            snapshot: snapshot.repeat(32),
            runs_since_verify: 0,
            linked: BTreeSet::new(),
            tops: Vec::new(),
        }
    }

    fn ev(path: &str, flags: u32, id: u64) -> Event {
        Event {
            path: PathBuf::from(path),
            flags,
            id,
        }
    }

    fn recorder() -> Recorder {
        Recorder::new(
            vec![PathBuf::from("/Users/ann")],
            vec![PathBuf::from("/Users/ann/Library/Caches/capsule")],
            false,
        )
    }

    fn keys(m: &std::collections::BTreeMap<PathBuf, u64>) -> Vec<&str> {
        m.keys().map(|p| p.to_str().unwrap()).collect()
    }

    #[test]
    fn item_events_mark_directories() {
        let mut j = journal(&[("/Users/ann", "U1")], 0);
        let mut r = recorder();
        for e in [
            ev("/Users/ann/docs/a.txt", ITEM_MODIFIED | ITEM_IS_FILE, 10),
            ev("/Users/ann/new", ITEM_CREATED | ITEM_IS_DIR, 11),
            ev("/Users/ann/pics/old", ITEM_RENAMED | ITEM_IS_DIR, 12),
            ev("/Users/ann/x", ITEM_XATTR_MOD | ITEM_IS_DIR, 13),
            ev("/Users/ann/l", ITEM_CREATED | ITEM_IS_SYMLINK, 14),
            ev("/Users/ann/Library/Caches/capsule/i", ITEM_MODIFIED, 15),
        ] {
            r.record(&mut j, &e);
        }
        assert_eq!(
            keys(&j.dirty),
            [
                "/Users/ann",
                "/Users/ann/docs",
                "/Users/ann/pics",
                "/Users/ann/x"
            ]
        );
        assert_eq!(keys(&j.deep), ["/Users/ann/new", "/Users/ann/pics/old"]);
        assert!(j.lost.is_none());
        assert_eq!(j.fsevents.as_ref().unwrap().last_id, 15);
    }

    #[test]
    fn drops_coalescing_wraps_mounts_and_strangers_are_losses() {
        let cases = [
            (
                ev("/Users/ann", MUST_SCAN_SUB_DIRS | USER_DROPPED, 5),
                "the watcher fell behind",
            ),
            (
                ev("/", MUST_SCAN_SUB_DIRS | KERNEL_DROPPED, 5),
                "the kernel fell behind",
            ),
            (ev("/Users/ann/a", MUST_SCAN_SUB_DIRS, 5), "coalesced"),
            (ev("/", EVENT_IDS_WRAPPED, 5), "wrapped"),
            (
                ev("/Users/ann", ROOT_CHANGED, 5),
                "moved, renamed or deleted",
            ),
            (ev("/Users/ann/Volumes/x", MOUNT, 5), "mounted at"),
            (ev("/Users/ann/Volumes/x", UNMOUNT, 5), "unmounted at"),
            (
                ev("/Users/bob/f", ITEM_MODIFIED | ITEM_IS_FILE, 5),
                "outside the sources",
            ),
        ];
        for (e, why) in cases {
            let mut j = journal(&[("/Users/ann", "U1")], 0);
            j.dirty(Path::new("/Users/ann/before"));
            let b = base(&j, "aa");
            recorder().record(&mut j, &e);
            let said = j.changes_since(&b, "scope", &j.cut()).unwrap_err();
            assert!(said.contains(why), "{e:?}: {said}");
        }
    }

    /// A recorded day: the daemon stops at event 120, the Mac reboots,
    /// the daemon starts again and resumes from 120; the replayed events
    /// mark the journal the run after reads, and `HistoryDone` ends the
    /// replay.
    #[test]
    fn a_restart_or_reboot_resumes_from_the_last_event() {
        let vols = [("/Users/ann".to_string(), "U1".to_string())];
        let mut j = journal(&[("/Users/ann", "U1")], 0);
        j.identity.boot = "the boot before".into();
        let mut r = recorder();
        r.record(
            &mut j,
            &ev("/Users/ann/a/f", ITEM_MODIFIED | ITEM_IS_FILE, 120),
        );
        // The last run before the reboot cut the journal here.
        let b = base(&j, "bb");
        let saved = j.clone();
        // Another boot: IDs went on (the database persists).
        assert_eq!(resume(Some(&saved), "scope", &vols, 400), Resume::From(120));
        let mut r = Recorder::new(vec![PathBuf::from("/Users/ann")], Vec::new(), true);
        let mut j = saved.resumed();
        assert_ne!(j.identity.boot, b.identity.boot);
        for e in [
            ev("/Users/ann/b/g", ITEM_CREATED | ITEM_IS_FILE, 130),
            ev("/Users/ann/c", ITEM_CREATED | ITEM_IS_DIR, 140),
            ev("/", HISTORY_DONE, 0),
        ] {
            r.record(&mut j, &e);
        }
        assert!(!r.replaying);
        let c = j.changes_since(&b, "scope", &j.cut()).unwrap();
        assert_eq!(
            c.dirty.iter().collect::<Vec<_>>(),
            [Path::new("/Users/ann"), Path::new("/Users/ann/b")]
        );
        assert_eq!(
            c.deep.iter().collect::<Vec<_>>(),
            [Path::new("/Users/ann/c")]
        );
        assert_eq!(
            j.fsevents.unwrap().last_id,
            140,
            "HistoryDone's ID 0 moves nothing"
        );
    }

    /// A volume renamed while the daemon runs: FSEvents says the watched
    /// root changed, and the journal loses track.
    #[test]
    fn a_volume_renamed_under_the_watcher_is_a_loss() {
        let mut j = journal(&[("/Volumes/Data", "U1")], 0);
        let mut r = Recorder::new(vec![PathBuf::from("/Volumes/Data")], Vec::new(), false);
        r.record(
            &mut j,
            &ev("/Volumes/Data/a", ITEM_MODIFIED | ITEM_IS_FILE, 7),
        );
        assert!(j.lost.is_none());
        for e in [
            ev("/Volumes/Data", ROOT_CHANGED, 0),
            ev("/Volumes/Data 1", MOUNT, 8),
        ] {
            r.record(&mut j, &e);
        }
        let l = j.lost.unwrap();
        assert!(
            l.reason.contains("mounted at /Volumes/Data 1"),
            "{}",
            l.reason
        );
        assert!(j.dirty.is_empty(), "what was recorded before a loss goes");
    }

    #[test]
    fn a_new_volume_other_sources_or_ids_gone_back_start_fresh() {
        let j = journal(&[("/Volumes/Data", "U1")], 500);
        let now = |u: &str| vec![("/Volumes/Data".to_string(), u.to_string())];
        assert_eq!(
            resume(Some(&j), "scope", &now("U1"), 900),
            Resume::From(500)
        );
        let why = |r: Resume| match r {
            Resume::Fresh(w) => w,
            Resume::From(id) => panic!("resumed from {id}"),
        };
        // The disk renamed back after a reformat: same path, new database.
        assert!(why(resume(Some(&j), "scope", &now("U2"), 900)).contains("UUID changed"));
        // The volume renamed in Finder ("Data" → "Data 1"): nothing is
        // mounted at the source's path now.
        assert!(why(resume(Some(&j), "scope", &now(""), 900)).contains("renamed or unmounted"));
        assert!(why(resume(Some(&j), "scope", &now("U1"), 100)).contains("went back"));
        assert!(why(resume(Some(&j), "other", &now("U1"), 900)).contains("excludes"));
        let two = vec![
            ("/Volumes/Data".to_string(), "U1".to_string()),
            ("/Users/ann".to_string(), "U3".to_string()),
        ];
        assert!(why(resume(Some(&j), "scope", &two, 900)).contains("not watched"));
        assert!(why(resume(None, "scope", &now("U1"), 900)).contains("no journal"));
        let mut linux = j.clone();
        linux.fsevents = None;
        assert!(why(resume(Some(&linux), "scope", &now("U1"), 900)).contains("cannot resume"));
        let mut stopped = j;
        stopped.degraded = Some("too many".into());
        assert!(why(resume(Some(&stopped), "scope", &now("U1"), 900)).contains("stopped"));
    }
}
