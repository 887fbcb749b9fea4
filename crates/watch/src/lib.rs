//! The change journal: which directories of a profile's sources changed,
//! recorded by a watcher the daemon runs, and when that record can be
//! trusted.
//!
//! A journal that misses one change is worse than none, so everything here
//! starts from "never miss a change": the record is trusted for a run only
//! when it can prove it saw every change since the parent snapshot's run
//! started. The proof is the journal's [`Identity`] (this machine, this
//! boot, this watcher since it started, these sources and excludes) and
//! its sequence numbers: each recorded change takes the next number, and a
//! run records where it cut the journal ([`Cut`]). The next run takes the
//! directories recorded after that cut, unless the watcher lost track
//! after it (a queue overflow, an unmount, more changes than the journal
//! holds) or anything else in [`Journal::changes_since`] says no. Then the
//! run scans in full and says why.
//!
//! Work is at directory granularity, as Apple advises for FSEvents: an
//! event in a directory marks it dirty (listed again and compared with
//! the parent snapshot); a directory created or moved in is deep (scanned
//! in full with all below it, because changes in it before it was watched
//! were not seen).
//!
//! The state is a file per profile in the daemon's state directory,
//! written whole and renamed into place. Paths are stored percent-encoded,
//! so names that are not UTF-8 survive.

mod error;
#[cfg(target_os = "linux")]
pub mod fanotify;
pub mod fsevents;
#[cfg(target_os = "macos")]
mod fsevents_stream;
#[cfg(target_os = "linux")]
pub mod inotify;
mod journal;
#[cfg(target_os = "linux")]
mod mounts;
mod watcher;

pub use capsule_engine::backup::Changes;

pub use error::{Result, WatchError};
pub use journal::{
    boot_secs, decode_path, encode_path, Base, Cut, Identity, Journal, Lost, MAX_DIRS,
};
pub use watcher::{scope, walked_sources, WatchOptions, Watcher};

/// Starts the best watcher this process may run for `opts`, with a new
/// journal. Where none can run, the journal says why (`degraded`) and no
/// watcher is returned: the profile's runs scan in full.
#[cfg(target_os = "linux")]
pub fn start(opts: &WatchOptions) -> (Journal, Option<Box<dyn Watcher>>) {
    let sources = walked_sources(&opts.sources);
    // fanotify where this process may (root, or CAP_SYS_ADMIN), unless
    // told not to (`CAPSULE_WATCHER=inotify`).
    if std::env::var("CAPSULE_WATCHER").as_deref() != Ok("inotify") {
        let mut journal = Journal::new(Identity::new("fanotify", opts.scope(), &sources));
        if let Ok(w) = fanotify::Fanotify::start(opts, &mut journal) {
            return (journal, Some(Box::new(w)));
        }
    }
    let identity = Identity::new("inotify", opts.scope(), &sources);
    let mut journal = Journal::new(identity);
    match inotify::Inotify::start(opts, &mut journal) {
        Ok(w) => {
            journal.watched = w.watches();
            (journal, Some(Box::new(w)))
        }
        Err(e) => {
            journal.degraded = Some(e.to_string());
            (journal, None)
        }
    }
}

/// Starts an FSEvents watcher for `opts`: it goes on with the journal an
/// earlier watcher left (`opts.journal`) where [`fsevents::resume`] allows,
/// and asks for the events after its last; otherwise it starts a new
/// journal (the next run scans in full).
#[cfg(target_os = "macos")]
pub fn start(opts: &WatchOptions) -> (Journal, Option<Box<dyn Watcher>>) {
    use fsevents::{resume, Mark, Resume};
    let sources = walked_sources(&opts.sources);
    let scope = opts.scope();
    let volumes = fsevents_stream::volumes(&sources);
    let current = fsevents_stream::current_id();
    let saved = opts.journal.as_deref().and_then(|p| Journal::load(p).ok());
    let (mut journal, since) = match (resume(saved.as_ref(), &scope, &volumes, current), saved) {
        (Resume::From(id), Some(j)) => (j.resumed(), id),
        _ => {
            let mut j = Journal::new(Identity::new("fsevents", scope, &sources));
            j.fsevents = Some(Mark {
                last_id: current,
                volumes,
            });
            (j, current)
        }
    };
    match fsevents_stream::FsEvents::start(&sources, &opts.skip, since, since != current) {
        Ok(w) => (journal, Some(Box::new(w))),
        Err(e) => {
            journal.degraded = Some(e.to_string());
            (journal, None)
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use std::collections::BTreeSet;
    use std::os::unix::ffi::OsStringExt;
    use std::path::{Path, PathBuf};

    use super::*;

    #[test]
    fn any_name_survives_the_state_file() {
        let p = PathBuf::from(std::ffi::OsString::from_vec(b"/a/b%c/\xff\x01 d".to_vec()));
        assert_eq!(encode_path(&p), "/a/b%25c/%FF%01 d");
        assert_eq!(decode_path(&encode_path(&p)), Some(p));
        assert_eq!(decode_path("%G1"), None);
        assert_eq!(decode_path("%4"), None);
    }

    fn journal() -> Journal {
        Journal::new(Identity::new("inotify", "scope".into(), &[]))
    }

    fn base(j: &Journal) -> Base {
        Base {
            identity: j.identity.clone(),
            cut: j.cut(),
            snapshot: "aa".repeat(32),
            runs_since_verify: 0,
            linked: BTreeSet::new(),
            tops: Vec::new(),
        }
    }

    #[test]
    fn a_run_takes_what_changed_after_the_parent_was_cut() {
        let mut j = journal();
        j.dirty(Path::new("/s/a"));
        let b = base(&j);
        j.dirty(Path::new("/s/b"));
        j.deep(Path::new("/s/new"));
        let c = j.changes_since(&b, "scope", &j.cut()).unwrap();
        assert_eq!(c.dirty.iter().collect::<Vec<_>>(), [Path::new("/s/b")]);
        assert_eq!(c.deep.iter().collect::<Vec<_>>(), [Path::new("/s/new")]);
        assert_eq!(c.parent, b.snapshot);
        // What the run covered goes once the base moves past it.
        j.prune(b.cut.seq);
        assert!(!j.dirty.contains_key(Path::new("/s/a")));
    }

    #[test]
    fn every_discontinuity_is_refused_with_its_reason() {
        let mut j = journal();
        let b = base(&j);
        let now = j.cut();
        let refuse = |j: &Journal, b: &Base, scope: &str, now: &Cut| {
            j.changes_since(b, scope, now).unwrap_err()
        };
        assert!(refuse(&j, &b, "other", &now).contains("sources or excludes"));
        let mut other = b.clone();
        other.identity.epoch = "restarted".into();
        other.cut.epoch = "restarted".into();
        assert!(refuse(&j, &other, "scope", &now).contains("watcher restarted"));
        let mut other = b.clone();
        other.identity.boot = "before".into();
        assert!(refuse(&j, &other, "scope", &now).contains("restarted since"));
        let mut moved = now.clone();
        moved.wall += 3600;
        assert!(refuse(&j, &b, "scope", &moved).contains("clock moved by 3600 s"));
        let mut copied = j.clone();
        copied.identity.machine = "elsewhere".into();
        assert!(refuse(&copied, &b, "scope", &now).contains("another machine"));
        j.lose("the kernel's event queue overflowed");
        assert!(refuse(&j, &b, "scope", &j.cut()).contains("overflowed"));
        // A base cut after the loss is good again.
        let b2 = base(&j);
        j.dirty(Path::new("/s/x"));
        assert_eq!(
            j.changes_since(&b2, "scope", &j.cut()).unwrap().dirty.len(),
            1
        );
    }

    #[test]
    fn more_directories_than_the_bound_is_a_loss_not_memory() {
        let mut j = journal();
        j.max_dirs = 3;
        let b = base(&j);
        for i in 0..5 {
            j.dirty(&PathBuf::from(format!("/s/{i}")));
        }
        assert!(j.dirty.len() <= 3);
        assert!(j
            .changes_since(&b, "scope", &j.cut())
            .unwrap_err()
            .contains("more than 3 directories"));
    }

    #[test]
    #[cfg(target_os = "linux")]
    fn a_state_file_is_read_bounded() {
        use super::journal::STATE_MAX;
        let d = tempfile::tempdir().unwrap();
        // A symlink to an endless file, and a FIFO: refused at once, named.
        let link = d.path().join("zero.json");
        std::os::unix::fs::symlink("/dev/zero", &link).unwrap();
        let e = Journal::load(&link).unwrap_err().to_string();
        assert!(e.contains("a symlink") && e.contains("not trusted"), "{e}");
        let fifo = d.path().join("fifo.json");
        rustix::fs::mknodat(
            rustix::fs::CWD,
            &fifo,
            rustix::fs::FileType::Fifo,
            rustix::fs::Mode::from_raw_mode(0o600),
            0,
        )
        .unwrap();
        let e = Journal::load(&fifo).unwrap_err().to_string();
        assert!(e.contains("not a regular file"), "{e}");
        let big = d.path().join("big.json");
        std::fs::File::create(&big)
            .unwrap()
            .set_len(STATE_MAX + 1)
            .unwrap();
        let e = Base::load(&big).unwrap_err().to_string();
        assert!(e.contains("more than a state file holds"), "{e}");
    }

    #[test]
    fn a_damaged_state_file_is_named_and_not_trusted() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("j");
        let j = journal();
        j.save(&p).unwrap();
        assert_eq!(Journal::load(&p).unwrap(), j);
        std::fs::write(&p, b"{\"identity\": 3").unwrap();
        let e = Journal::load(&p).unwrap_err().to_string();
        assert!(e.contains("not trusted"), "{e}");
    }
}
