//! The FSEvents stream (macOS): a thread running a CFRunLoop with one
//! stream over the sources, handing batches of events to the daemon's
//! thread through a channel and waking it through a pipe (the
//! [`Watcher`] waits on a descriptor). The rules the events are recorded
//! by are in [`crate::fsevents`].
//!
//! Built and linked for macOS here, never run: the journal's verification
//! runs (a full scan compared with the journal) stay on for it.
#![allow(unsafe_code)] // FSEvents and CoreFoundation calls

use std::ffi::{c_void, CStr, CString};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{Receiver, Sender, TryRecvError};
use std::sync::Arc;
use std::time::Duration;

use fsevent_sys as fs;
use fsevent_sys::core_foundation as cf;

use crate::error::{Result, WatchError};
use crate::fsevents::{Event, Recorder};
use crate::journal::Journal;
use crate::watcher::{wait_readable, Watcher};

#[repr(C)]
struct CFUUIDBytes([u8; 16]);

#[link(name = "CoreServices", kind = "framework")]
extern "C" {
    fn FSEventsCopyUUIDForDevice(dev: libc::dev_t) -> cf::CFRef;
}

#[link(name = "CoreFoundation", kind = "framework")]
extern "C" {
    fn CFUUIDGetUUIDBytes(uuid: cf::CFRef) -> CFUUIDBytes;
}

/// The system's current event ID.
pub(crate) fn current_id() -> u64 {
    // SAFETY: no arguments, no state.
    unsafe { fs::FSEventsGetCurrentEventId() }
}

/// Each source with the UUID of its volume's event database (empty where
/// the volume keeps none: a network share, a read-only disk).
pub(crate) fn volumes(sources: &[PathBuf]) -> Vec<(String, String)> {
    use std::os::unix::fs::MetadataExt;
    sources
        .iter()
        .map(|s| {
            let uuid = std::fs::metadata(s)
                .ok()
                .and_then(|m| {
                    // SAFETY: a device number; the UUID returned is ours
                    // to release.
                    let u = unsafe { FSEventsCopyUUIDForDevice(m.dev() as libc::dev_t) };
                    if u.is_null() {
                        return None;
                    }
                    // SAFETY: `u` is a CFUUID we hold.
                    let bytes = unsafe { CFUUIDGetUUIDBytes(u) };
                    // SAFETY: released once, by its owner.
                    unsafe { cf::CFRelease(u) };
                    Some(hex::encode(bytes.0))
                })
                .unwrap_or_default();
            (s.display().to_string(), uuid)
        })
        .collect()
}

/// What the callback is handed: where batches go, and the pipe's write
/// end that wakes the reader.
struct Sink {
    tx: Sender<Vec<Event>>,
    wake: OwnedFd,
}

extern "C" fn callback(
    _stream: fs::FSEventStreamRef,
    info: *mut c_void,
    n: usize,
    paths: *mut c_void,
    flags: *const fs::FSEventStreamEventFlags,
    ids: *const fs::FSEventStreamEventId,
) {
    // SAFETY: FSEvents hands back the context's `info` (a `Sink` that
    // outlives the stream) and `n` paths (C strings without
    // `UseCFTypes`), flags and IDs.
    let (sink, paths, flags, ids) = unsafe {
        (
            &*(info as *const Sink),
            std::slice::from_raw_parts(paths as *const *const libc::c_char, n),
            std::slice::from_raw_parts(flags, n),
            std::slice::from_raw_parts(ids, n),
        )
    };
    let batch = (0..n)
        .map(|i| Event {
            // SAFETY: each path is a NUL-terminated string FSEvents owns
            // for the call.
            path: PathBuf::from(std::ffi::OsStr::from_bytes(
                unsafe { CStr::from_ptr(paths[i]) }.to_bytes(),
            )),
            flags: flags[i],
            id: ids[i],
        })
        .collect();
    if sink.tx.send(batch).is_ok() {
        let _ = rustix::io::write(&sink.wake, &[1]);
    }
}

/// The run loop the stream's thread runs, to stop it from another thread.
struct RunLoop(cf::CFRunLoopRef);
// SAFETY: CFRunLoopStop may be called from any thread.
unsafe impl Send for RunLoop {}
// SAFETY: only used to call CFRunLoopStop.
unsafe impl Sync for RunLoop {}

/// The FSEvents watcher.
pub struct FsEvents {
    rx: Receiver<Vec<Event>>,
    wake: OwnedFd,
    recorder: Recorder,
    run_loop: Arc<std::sync::OnceLock<RunLoop>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl FsEvents {
    /// Starts a stream over `sources` with the events after `since`.
    pub(crate) fn start(
        sources: &[PathBuf],
        skip: &[PathBuf],
        since: u64,
        replaying: bool,
    ) -> Result<FsEvents> {
        let (r, w) = rustix::pipe::pipe()
            .map_err(|e| WatchError::io("creating a pipe for", Path::new("FSEvents"), e.into()))?;
        for fd in [&r, &w] {
            let fl = rustix::fs::fcntl_getfl(fd).map_err(|e| {
                WatchError::io("setting up the pipe for", Path::new("FSEvents"), e.into())
            })?;
            let _ = rustix::fs::fcntl_setfl(fd, fl | rustix::fs::OFlags::NONBLOCK);
        }
        let (tx, rx) = std::sync::mpsc::channel();
        let paths: Vec<CString> = sources
            .iter()
            .filter_map(|s| CString::new(s.as_os_str().as_bytes()).ok())
            .collect();
        let run_loop = Arc::new(std::sync::OnceLock::new());
        let shared = run_loop.clone();
        let (ready, started) = std::sync::mpsc::channel::<std::result::Result<(), String>>();
        let thread = std::thread::Builder::new()
            .name("fsevents".into())
            .spawn(move || {
                let sink = Box::new(Sink { tx, wake: w });
                // SAFETY: CoreFoundation calls with values made here; the
                // array and stream are released below, after the run loop
                // stopped; `sink` outlives the stream.
                unsafe {
                    let array = cf::CFArrayCreateMutable(
                        cf::kCFAllocatorDefault,
                        0,
                        &cf::kCFTypeArrayCallBacks,
                    );
                    for p in &paths {
                        let s = cf::CFStringCreateWithCString(
                            cf::kCFAllocatorDefault,
                            p.as_ptr(),
                            cf::kCFStringEncodingUTF8,
                        );
                        cf::CFArrayAppendValue(array, s);
                        cf::CFRelease(s);
                    }
                    let ctx = fs::FSEventStreamContext {
                        version: 0,
                        info: &*sink as *const Sink as *mut c_void,
                        retain: None,
                        release: None,
                        copy_description: None,
                    };
                    let stream = fs::FSEventStreamCreate(
                        cf::kCFAllocatorDefault,
                        callback,
                        &ctx,
                        array,
                        since,
                        0.1,
                        fs::kFSEventStreamCreateFlagFileEvents
                            | fs::kFSEventStreamCreateFlagWatchRoot
                            | fs::kFSEventStreamCreateFlagNoDefer,
                    );
                    cf::CFRelease(array);
                    if stream.is_null() {
                        let _ = ready.send(Err("FSEventStreamCreate failed".into()));
                        return;
                    }
                    let here = cf::CFRunLoopGetCurrent();
                    fs::FSEventStreamScheduleWithRunLoop(stream, here, cf::kCFRunLoopDefaultMode);
                    if fs::FSEventStreamStart(stream) == 0 {
                        let _ = ready.send(Err("FSEventStreamStart failed".into()));
                    } else {
                        let _ = shared.set(RunLoop(here));
                        let _ = ready.send(Ok(()));
                        cf::CFRunLoopRun();
                        fs::FSEventStreamStop(stream);
                    }
                    fs::FSEventStreamInvalidate(stream);
                    fs::FSEventStreamRelease(stream);
                }
                drop(sink);
            })
            .map_err(|e| WatchError::io("starting a thread for", Path::new("FSEvents"), e))?;
        match started.recv() {
            Ok(Ok(())) => {}
            Ok(Err(why)) => return Err(WatchError::Degraded(why)),
            Err(_) => return Err(WatchError::Degraded("the FSEvents thread ended".into())),
        }
        Ok(FsEvents {
            rx,
            wake: r,
            recorder: Recorder::new(sources.to_vec(), skip.to_vec(), replaying),
            run_loop,
            thread: Some(thread),
        })
    }
}

impl Watcher for FsEvents {
    fn kind(&self) -> &'static str {
        "fsevents"
    }

    fn drain(&mut self, journal: &mut Journal, wait: Duration) -> Result<bool> {
        wait_readable(self.wake.as_fd(), wait, "FSEvents")?;
        let mut buf = [0u8; 256];
        while matches!(rustix::io::read(&self.wake, &mut buf), Ok(n) if n > 0) {}
        let mut any = false;
        loop {
            match self.rx.try_recv() {
                Ok(batch) => {
                    for e in &batch {
                        self.recorder.record(journal, e);
                    }
                    any |= !batch.is_empty();
                }
                Err(TryRecvError::Empty) => return Ok(any),
                Err(TryRecvError::Disconnected) => {
                    let why = "the FSEvents stream ended".to_string();
                    journal.degraded = Some(why.clone());
                    return Err(WatchError::Degraded(why));
                }
            }
        }
    }

    fn watches(&self) -> usize {
        0
    }

    fn as_fd(&self) -> BorrowedFd<'_> {
        self.wake.as_fd()
    }
}

impl Drop for FsEvents {
    fn drop(&mut self) {
        let Some(t) = self.thread.take() else { return };
        // A stop that comes before the thread entered its run loop is not
        // seen by it: asked again until the thread has ended (bounded).
        for _ in 0..200 {
            if t.is_finished() {
                break;
            }
            if let Some(l) = self.run_loop.get() {
                // SAFETY: stopping a run loop is allowed from any thread.
                unsafe { cf::CFRunLoopStop(l.0) };
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        if t.is_finished() {
            let _ = t.join();
        }
    }
}
