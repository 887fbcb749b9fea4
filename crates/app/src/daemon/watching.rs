//! A profile's watcher in the daemon: the change journal kept current
//! while the daemon runs.

use std::os::fd::OwnedFd;
use std::time::{Duration, Instant};

use super::jobs::{log, Job};
use crate::config::Profile;

/// A profile's watcher: a thread recording the sources' changes in the
/// profile's journal file (see `crate::journal`), written when a backup
/// asks (`sync`) and at most once a second otherwise. Stopped when
/// dropped.
pub(super) struct Watching {
    wake: std::sync::Arc<Bell>,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Watching {
    /// Starts watching `p`'s sources, unless its journal is off or it has
    /// no sources or no scheduled backup.
    pub(super) fn start(name: &str, p: &Profile) -> Option<Watching> {
        use std::sync::atomic::{AtomicBool, Ordering};
        if p.journal == Some(false) || p.sources.is_empty() || Job::Backup.schedule(p).is_none() {
            return None;
        }
        let path = crate::journal::journal_path(name)?;
        let base = crate::journal::base_path(name)?;
        let mut opts = crate::journal::watch_options(p);
        // FSEvents goes on from what the last daemon recorded.
        opts.journal = Some(path.clone());
        // Written to ask for the journal (and to stop): wakes the thread.
        let wake = std::sync::Arc::new(Bell::new()?);
        let woken = wake.clone();
        let (ready, started) = std::sync::mpsc::channel::<()>();
        let stop = std::sync::Arc::new(AtomicBool::new(false));
        let stopping = stop.clone();
        let profile = name.to_string();
        let thread = std::thread::Builder::new()
            .name(format!("watch-{name}"))
            .spawn(move || {
                let (mut journal, mut watcher) = capsule_watch::start(&opts);
                match (&watcher, &journal.degraded) {
                    (Some(w), _) => log(
                        "info",
                        &profile,
                        &match journal.watched {
                            0 => format!(
                                "watching the sources' file systems ({}): runs list only what changed",
                                w.kind()
                            ),
                            n => format!(
                                "watching {n} directories ({}): runs list only what changed",
                                w.kind()
                            ),
                        },
                    ),
                    (None, Some(why)) => log(
                        "warning",
                        &profile,
                        &format!("not watching the sources, every run scans in full: {why}"),
                    ),
                    (None, None) => {}
                }
                for d in &journal.unwatchable {
                    log(
                        "warning",
                        &profile,
                        &format!(
                            "{} is on a file system that cannot be watched: scanned in full each run",
                            d.display()
                        ),
                    );
                }
                let write = |j: &mut capsule_watch::Journal| {
                    // What the last run's cut covered is no longer needed.
                    if let Ok(b) = capsule_watch::Base::load(&base) {
                        if b.cut.epoch == j.identity.epoch {
                            j.prune(b.cut.seq);
                        }
                    }
                    if let Err(e) = j.save(&path) {
                        log("error", &profile, &format!("journal not written: {e}"));
                    }
                };
                write(&mut journal);
                let _ = ready.send(());
                let mut changed = false;
                let mut written = Instant::now();
                while !stopping.load(Ordering::Relaxed) {
                    // Asleep until events are queued, a run asks, or a
                    // second passes (to write what changed, and notice a
                    // change of the mounts).
                    {
                        use rustix::event::{PollFd, PollFlags};
                        let mut fds = vec![PollFd::new(&woken.read, PollFlags::IN)];
                        if let Some(w) = &watcher {
                            fds.push(PollFd::from_borrowed_fd(w.as_fd(), PollFlags::IN));
                        }
                        let second = rustix::time::Timespec {
                            tv_sec: 1,
                            tv_nsec: 0,
                        };
                        let _ = rustix::event::poll(&mut fds, Some(&second));
                    }
                    let asked = woken.answer();
                    // Read after the request arrived: everything the kernel
                    // queued before it is in.
                    if let Some(w) = watcher.as_mut() {
                        match w.drain(&mut journal, Duration::ZERO) {
                            Ok(c) => changed |= c,
                            Err(e) => {
                                log(
                                    "warning",
                                    &profile,
                                    &format!("stopped watching, every run scans in full: {e}"),
                                );
                                watcher = None;
                                changed = true;
                            }
                        }
                    }
                    if asked {
                        journal.syncs += 1;
                    }
                    if asked || (changed && written.elapsed() > Duration::from_secs(1)) {
                        write(&mut journal);
                        changed = false;
                        written = Instant::now();
                    }
                }
            })
            .ok()?;
        // The first run, due at once, finds the journal written (bounded:
        // a huge tree takes its time to watch, and the run then scans in
        // full, as it would anyway with no base).
        let _ = started.recv_timeout(Duration::from_secs(60));
        Some(Watching {
            wake,
            stop,
            thread: Some(thread),
        })
    }

    /// Asks for the journal as of now.
    pub(super) fn sync(&self) {
        self.wake.ring();
    }
}

/// What wakes the watching thread: an eventfd on Linux, a pipe elsewhere.
struct Bell {
    read: OwnedFd,
    /// The pipe's other end (none for an eventfd, which is both).
    write: Option<OwnedFd>,
}

impl Bell {
    #[cfg(target_os = "linux")]
    fn new() -> Option<Bell> {
        use rustix::event::EventfdFlags;
        let fd = rustix::event::eventfd(0, EventfdFlags::CLOEXEC | EventfdFlags::NONBLOCK).ok()?;
        Some(Bell {
            read: fd,
            write: None,
        })
    }

    #[cfg(not(target_os = "linux"))]
    fn new() -> Option<Bell> {
        let (r, w) = rustix::pipe::pipe().ok()?;
        for fd in [&r, &w] {
            let fl = rustix::fs::fcntl_getfl(fd).ok()?;
            rustix::fs::fcntl_setfl(fd, fl | rustix::fs::OFlags::NONBLOCK).ok()?;
            rustix::io::fcntl_setfd(fd, rustix::io::FdFlags::CLOEXEC).ok()?;
        }
        Some(Bell {
            read: r,
            write: Some(w),
        })
    }

    fn ring(&self) {
        let _ = rustix::io::write(
            self.write.as_ref().unwrap_or(&self.read),
            &1u64.to_ne_bytes(),
        );
    }

    /// Whether it was rung since last asked (and quiet again).
    fn answer(&self) -> bool {
        let mut buf = [0u8; 64];
        let mut rung = false;
        while matches!(rustix::io::read(&self.read, &mut buf), Ok(n) if n > 0) {
            rung = true;
            if self.write.is_none() {
                break;
            }
        }
        rung
    }
}

impl Drop for Watching {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        self.sync();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
