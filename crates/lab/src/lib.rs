//! The destination lab: measure a destination, explain where a backup's
//! time goes, and predict backup times.
//!
//! * [`probe`]: round trips, throughput, small objects, forced sync, space.
//! * [`lab`]: `capsule lab`, the probes plus the seed protocol (initial
//!   backup, no-change run, 10,000 files added, optionally nearly full) and
//!   the same files copied one by one as Time Machine does.
//! * [`series`] and [`bound`]: the time series every backup records and the
//!   verdict on what bounded it.
//! * [`estimate`]: predictions for a source and a destination, corrected by
//!   the recorded history of real runs.
//! * [`history`]: where run records and lab reports are kept.
//! * [`html`]: self-contained HTML reports with SVG charts.

pub mod bound;
mod cpu;
pub mod dest;
pub mod estimate;
pub mod history;
pub mod html;
pub mod lab;
pub mod probe;
pub mod record;
pub mod series;
pub mod svg;

use capsule_backend::BackendError;
use capsule_engine::EngineError;

/// What can go wrong in the lab.
#[derive(Debug, thiserror::Error)]
pub enum LabError {
    /// The destination failed a request.
    #[error("destination: {0}")]
    Destination(#[from] BackendError),
    /// A backup run by the lab failed.
    #[error("{0}")]
    Engine(#[from] EngineError),
    /// A local file or directory.
    #[error("{what} {path}: {source}")]
    Io {
        /// What was being done.
        what: &'static str,
        /// Where.
        path: String,
        /// The OS error.
        source: std::io::Error,
    },
    /// The lab will not do this (e.g. fill a destination it cannot measure).
    #[error("{0}")]
    Refused(String),
    /// Nothing recorded under that name.
    #[error("{0}")]
    NotFound(String),
    /// Stopped by Ctrl-C or SIGTERM ([`interrupt`]).
    #[error("interrupted")]
    Interrupted,
    /// A stored record could not be read.
    #[error("{path}: {message}")]
    BadRecord {
        /// The record's file.
        path: String,
        /// What is wrong with it.
        message: String,
    },
}

impl LabError {
    pub(crate) fn io(what: &'static str, path: &std::path::Path, source: std::io::Error) -> Self {
        LabError::Io {
            what,
            path: path.display().to_string(),
            source,
        }
    }
}

/// Set by [`interrupt`]; long loops check it between steps.
static INTERRUPTED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Asks a running lab or estimate to stop at the next step. It then removes
/// what it wrote (filler included) and returns [`LabError::Interrupted`].
/// Safe to call from a signal handler thread.
pub fn interrupt() {
    INTERRUPTED.store(true, std::sync::atomic::Ordering::SeqCst);
}

/// Whether [`interrupt`] was called.
pub fn interrupted() -> bool {
    INTERRUPTED.load(std::sync::atomic::Ordering::Relaxed)
}

/// `Err(Interrupted)` once [`interrupt`] was called.
pub(crate) fn check_interrupt() -> Result<()> {
    if interrupted() {
        Err(LabError::Interrupted)
    } else {
        Ok(())
    }
}

/// `Interrupted` in place of `e` once [`interrupt`] was called: a step
/// stopped by it fails with whatever error its cut-short request gave.
pub(crate) fn or_interrupted(e: LabError) -> LabError {
    if interrupted() {
        LabError::Interrupted
    } else {
        e
    }
}

/// Result of lab operations.
pub type Result<T, E = LabError> = std::result::Result<T, E>;

/// A random lowercase hex string of `bytes` bytes.
pub(crate) fn random_hex(bytes: usize) -> String {
    let mut r = vec![0u8; bytes];
    let _ = getrandom::fill(&mut r);
    hex::encode(r)
}
