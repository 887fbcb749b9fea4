//! What a backup run leaves behind for reports and for the estimator: its
//! figures, stage times, time series and the bound.

use std::sync::atomic::Ordering::Relaxed;

use capsule_backend::RequestStats;
use capsule_engine::backup::BackupReport;
use serde::{Deserialize, Serialize};

use crate::bound::{analyze, Bound, RunFacts};
use crate::series::Sample;

/// Version of the record layout.
pub const RECORD_VERSION: u32 = 1;

/// The destination's counters at one moment.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq)]
pub struct DestCounters {
    /// Requests.
    pub requests: u64,
    /// Of which puts.
    pub puts: u64,
    /// Bytes sent.
    pub bytes_up: u64,
    /// Bytes received.
    pub bytes_down: u64,
    /// Wall seconds with at least one request in flight.
    pub busy_secs: f64,
    /// Sum of request durations.
    pub request_secs: f64,
    /// Most requests in flight at once.
    pub max_in_flight: u64,
}

impl DestCounters {
    /// Reads the counters now.
    pub fn read(s: &RequestStats) -> DestCounters {
        DestCounters {
            requests: s.requests(),
            puts: s.puts.load(Relaxed),
            bytes_up: s.bytes_up.load(Relaxed),
            bytes_down: s.bytes_down.load(Relaxed),
            busy_secs: s.busy_micros.load(Relaxed) as f64 / 1e6,
            request_secs: s.wait_micros.load(Relaxed) as f64 / 1e6,
            max_in_flight: s.max_in_flight.load(Relaxed),
        }
    }

    /// What happened between `before` and `self` (the peak is kept).
    pub fn since(&self, before: &DestCounters) -> DestCounters {
        DestCounters {
            requests: self.requests.saturating_sub(before.requests),
            puts: self.puts.saturating_sub(before.puts),
            bytes_up: self.bytes_up.saturating_sub(before.bytes_up),
            bytes_down: self.bytes_down.saturating_sub(before.bytes_down),
            busy_secs: (self.busy_secs - before.busy_secs).max(0.0),
            request_secs: (self.request_secs - before.request_secs).max(0.0),
            max_in_flight: self.max_in_flight,
        }
    }
}

/// Thread-seconds per stage.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Stages {
    /// Listing directories and reading metadata.
    pub scan: f64,
    /// Reading file content.
    pub read: f64,
    /// Chunking and hashing.
    pub chunk_hash: f64,
    /// Compressing.
    pub compress: f64,
    /// Encrypting.
    pub encrypt: f64,
    /// Uploading packs (thread-seconds in the uploaders).
    pub upload: f64,
    /// Wall seconds waiting on the destination (at least one request in
    /// flight), including round trips outside the upload of packs.
    pub waiting: f64,
}

/// One backup, as recorded.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RunRecord {
    /// [`RECORD_VERSION`].
    pub version: u32,
    /// Start, RFC 3339.
    pub time: String,
    /// Start, Unix seconds.
    pub time_unix: i64,
    /// Where it went (URL or path).
    pub destination: String,
    /// Repository ID.
    pub repository: String,
    /// The snapshot written.
    pub snapshot: String,
    /// Source paths.
    pub paths: Vec<String>,
    /// CPU cores.
    pub cores: usize,
    /// Seconds connecting to the destination.
    pub connect_secs: f64,
    /// Seconds opening the repository (key derivation, config, cache).
    pub open_secs: f64,
    /// Seconds of the backup itself.
    pub backup_secs: f64,
    /// Seconds from the start of the process to the end of the backup, when
    /// the run was a process of its own (includes reading the password and
    /// everything between the steps).
    #[serde(default)]
    pub process_secs: Option<f64>,
    /// Files in the snapshot.
    pub files: u64,
    /// Directories.
    pub dirs: u64,
    /// Bytes of files.
    pub bytes: u64,
    /// Files read (new or changed).
    pub files_read: u64,
    /// Bytes read.
    pub bytes_read: u64,
    /// Bytes stored (after dedup, compression, encryption).
    pub bytes_added: u64,
    /// Packs written.
    pub packs: u64,
    /// The destination's counters over the run.
    pub destination_counters: DestCounters,
    /// Stage times.
    pub stages: Stages,
    /// What bounded the run.
    pub bound: Bound,
    /// Time series.
    pub series: Vec<Sample>,
}

impl RunRecord {
    /// Total seconds: the whole process where known, else connecting,
    /// opening and the backup.
    pub fn total_secs(&self) -> f64 {
        self.process_secs
            .unwrap_or(self.connect_secs + self.open_secs + self.backup_secs)
    }
}

/// Everything besides the engine's report that a record needs.
pub struct RunContext {
    /// Destination, for people.
    pub destination: String,
    /// Repository ID.
    pub repository: String,
    /// Source paths.
    pub paths: Vec<String>,
    /// Seconds connecting.
    pub connect_secs: f64,
    /// Seconds opening the repository.
    pub open_secs: f64,
    /// Destination counters over the backup.
    pub counters: DestCounters,
    /// The sampled series.
    pub series: Vec<Sample>,
    /// The destination's round-trip time, if known (seconds).
    pub rtt: Option<f64>,
    /// Its bandwidth, if known (bytes/s).
    pub bandwidth: Option<f64>,
}

/// CPU cores of this machine.
pub fn cores() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
}

/// Builds the record of a finished backup.
pub fn from_backup(r: &BackupReport, started_unix: i64, ctx: RunContext) -> RunRecord {
    let c = ctx.counters;
    let stages = Stages {
        scan: r.stages.scan,
        read: r.stages.read,
        chunk_hash: r.stages.chunk_hash,
        compress: r.stages.compress,
        encrypt: r.stages.encrypt,
        upload: r.stages.write,
        waiting: c.busy_secs,
    };
    let facts = RunFacts {
        wall: r.duration_secs,
        cores: cores() as f64,
        scan: stages.scan,
        entries: r.summary.files + r.summary.dirs,
        read: stages.read,
        chunk_hash: stages.chunk_hash,
        compress: stages.compress,
        encrypt: stages.encrypt,
        requests: c.requests,
        bytes_moved: c.bytes_up + c.bytes_down,
        dest_busy: c.busy_secs,
        request_secs: c.request_secs,
        rtt: ctx.rtt,
        bandwidth: ctx.bandwidth,
    };
    RunRecord {
        version: RECORD_VERSION,
        time: capsule_engine::timefmt::rfc3339(started_unix),
        time_unix: started_unix,
        destination: ctx.destination,
        repository: ctx.repository,
        snapshot: r.snapshot_id.clone(),
        paths: ctx.paths,
        cores: cores(),
        connect_secs: ctx.connect_secs,
        open_secs: ctx.open_secs,
        backup_secs: r.duration_secs,
        process_secs: None,
        files: r.summary.files,
        dirs: r.summary.dirs,
        bytes: r.summary.bytes,
        files_read: r.summary.files_read,
        bytes_read: r.summary.bytes_read,
        bytes_added: r.summary.bytes_added,
        packs: r.storage.packs,
        destination_counters: c,
        stages,
        bound: analyze(&facts),
        series: ctx.series,
    }
}

/// A record with everything zero but what a test sets.
#[cfg(test)]
pub(crate) fn test_record(destination: &str, time_unix: i64, files: u64) -> RunRecord {
    RunRecord {
        version: RECORD_VERSION,
        time: String::new(),
        time_unix,
        destination: destination.into(),
        repository: "r".into(),
        snapshot: format!("{time_unix:016x}"),
        paths: vec![],
        cores: 1,
        connect_secs: 0.0,
        open_secs: 0.0,
        backup_secs: 0.0,
        process_secs: None,
        files,
        dirs: 1,
        bytes: 0,
        files_read: 0,
        bytes_read: 0,
        bytes_added: 0,
        packs: 0,
        destination_counters: DestCounters::default(),
        stages: Stages::default(),
        bound: analyze(&RunFacts::default()),
        series: vec![],
    }
}
