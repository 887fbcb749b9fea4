//! Naming what bounded a run: destination round trips, destination
//! bandwidth, the source disk, or CPU, with the numbers that show it.
//!
//! The pipeline overlaps its stages, so the bound is the stage that kept
//! its resource busy for the largest share of the wall time:
//! * destination: the wall time with at least one request in flight. Within
//!   that, the time of an average request is split into moving its bytes
//!   (at the destination's bandwidth) and waiting for the answer (round
//!   trips): whichever is larger names the bound;
//! * CPU: thread-seconds of chunking, hashing, compressing and encrypting
//!   divided by wall time is the average number of busy cores, a share of
//!   the cores;
//! * scanning: thread-seconds listing directories and reading metadata (a
//!   stat call per entry); one thread at it all the time is the whole run,
//!   since nothing after the walk can start before it has found the work;
//! * source disk: thread-seconds inside `read`, the same way.
//!
//! "Fixed costs" is the verdict only when no stage was busy for a
//! [`BUSY`] share of the run; even then the busiest stage is named.

use serde::{Deserialize, Serialize};

/// What a run spent its time on, as measured.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct RunFacts {
    /// Wall seconds.
    pub wall: f64,
    /// CPU cores available.
    pub cores: f64,
    /// Thread-seconds listing directories and reading metadata.
    pub scan: f64,
    /// Entries (files and directories) the scan went through.
    #[serde(default)]
    pub entries: u64,
    /// Thread-seconds reading file content.
    pub read: f64,
    /// Thread-seconds chunking and hashing.
    pub chunk_hash: f64,
    /// Thread-seconds compressing.
    pub compress: f64,
    /// Thread-seconds encrypting.
    pub encrypt: f64,
    /// Requests to the destination.
    pub requests: u64,
    /// Bytes sent and received.
    pub bytes_moved: u64,
    /// Wall seconds with at least one request in flight.
    pub dest_busy: f64,
    /// Sum of all requests' durations.
    pub request_secs: f64,
    /// The destination's round-trip time, if measured (seconds).
    pub rtt: Option<f64>,
    /// The destination's bandwidth, if measured (bytes/s).
    pub bandwidth: Option<f64>,
}

/// The resource that bounded a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BoundKind {
    /// Waiting for answers: latency times requests in sequence.
    RoundTrips,
    /// Moving bytes to or from the destination.
    Bandwidth,
    /// Reading the source.
    SourceDisk,
    /// Walking the source: listing directories, a stat call per entry.
    Scan,
    /// Chunking, hashing, compressing, encrypting.
    Cpu,
    /// Nothing was busy for most of the run (a short run dominated by fixed
    /// costs such as opening the repository).
    Fixed,
}

impl BoundKind {
    /// Words for people.
    pub fn label(self) -> &'static str {
        match self {
            BoundKind::RoundTrips => "destination round trips",
            BoundKind::Bandwidth => "destination bandwidth",
            BoundKind::SourceDisk => "source disk",
            BoundKind::Scan => "scanning the source",
            BoundKind::Cpu => "CPU",
            BoundKind::Fixed => "fixed costs",
        }
    }
}

/// The verdict, with the evidence behind it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Bound {
    /// The bound.
    pub kind: BoundKind,
    /// One sentence: the bound and its main figure.
    pub summary: String,
    /// The figures compared.
    pub evidence: Vec<String>,
    /// Fraction of wall time the destination was busy (0..1).
    pub dest_share: f64,
    /// Average busy cores divided by cores (0..1).
    pub cpu_share: f64,
    /// Average threads inside `read` (may exceed 1).
    pub read_threads: f64,
    /// Average threads scanning (may exceed 1).
    #[serde(default)]
    pub scan_threads: f64,
}

/// Below this share of the run no stage is called the bound.
pub const BUSY: f64 = 0.3;

/// Analyses one run.
pub fn analyze(f: &RunFacts) -> Bound {
    let wall = f.wall.max(1e-9);
    let cpu_threads = (f.chunk_hash + f.compress + f.encrypt) / wall;
    let cpu_share = (cpu_threads / f.cores.max(1.0)).min(1.0);
    let dest_share = (f.dest_busy / wall).min(1.0);
    let read_threads = f.read / wall;
    let mut evidence = vec![
        format!(
            "destination busy {:.0}% of {:.2} s: {} requests, {:.1} ms each on average",
            dest_share * 100.0,
            f.wall,
            f.requests,
            if f.requests > 0 {
                f.request_secs / f.requests as f64 * 1e3
            } else {
                0.0
            }
        ),
        format!(
            "CPU {:.2} of {} cores busy (chunk+hash {:.2} s, compress {:.2} s, encrypt {:.2} s)",
            cpu_threads, f.cores, f.chunk_hash, f.compress, f.encrypt
        ),
        format!(
            "source reads {:.2} thread-seconds ({:.2} threads on average), scanning {:.2}",
            f.read, read_threads, f.scan
        ),
    ];
    let scan_threads = f.scan / wall;
    // A stage with one thread at it all the time is busy all the time.
    let stages = [
        (BoundKind::RoundTrips, dest_share),
        (BoundKind::Cpu, cpu_share),
        (BoundKind::Scan, scan_threads.min(1.0)),
        (BoundKind::SourceDisk, read_threads.min(1.0)),
    ];
    // The largest share; on a tie the earlier stage (the destination, then
    // CPU) is named, as the one a user can act on.
    let (busiest, share) =
        stages.iter().copied().fold(
            (BoundKind::Fixed, 0.0),
            |best, s| if s.1 > best.1 { s } else { best },
        );
    let (kind, summary) = match busiest {
        _ if share < BUSY => (
            BoundKind::Fixed,
            format!(
                "no stage was busy for most of the run (the busiest, {}, {:.0}%): fixed costs dominate (opening, listing, writing the snapshot)",
                if busiest == BoundKind::RoundTrips {
                    "the destination"
                } else {
                    busiest.label()
                },
                share * 100.0
            ),
        ),
        BoundKind::RoundTrips => {
            let (kind, why) = destination_split(f);
            evidence.push(why.clone());
            (
                kind,
                format!(
                    "bound by {}: the destination was busy {:.0}% of the run; {why}",
                    kind.label(),
                    dest_share * 100.0
                ),
            )
        }
        BoundKind::Cpu => {
            // The CPU stage that took the most, so the verdict says what to
            // change (a lower compression level, fewer threads elsewhere).
            let (stage, secs) = [
                ("chunking and hashing", f.chunk_hash),
                ("compressing", f.compress),
                ("encrypting", f.encrypt),
            ]
            .into_iter()
            .fold(("", 0.0), |best, s| if s.1 > best.1 { s } else { best });
            (
                BoundKind::Cpu,
                format!(
                    "bound by CPU: {:.1} of {} cores busy on average, most of it {stage} ({:.0}% of the CPU time)",
                    cpu_threads,
                    f.cores,
                    secs / (f.chunk_hash + f.compress + f.encrypt).max(1e-9) * 100.0
                ),
            )
        }
        BoundKind::Scan => (
            BoundKind::Scan,
            format!(
                "bound by scanning the source: {} entries, {:.1} of {} cores listing directories and reading metadata",
                f.entries, scan_threads, f.cores
            ),
        ),
        _ => (
            BoundKind::SourceDisk,
            format!(
                "bound by the source disk: {:.1} reader threads waiting on reads on average",
                read_threads
            ),
        ),
    };
    Bound {
        kind,
        summary,
        evidence,
        dest_share,
        cpu_share,
        read_threads,
        scan_threads,
    }
}

/// Splits destination time into bytes and round trips.
fn destination_split(f: &RunFacts) -> (BoundKind, String) {
    let reqs = f.requests.max(1) as f64;
    let per_req = f.request_secs / reqs;
    let bytes_per_req = f.bytes_moved as f64 / reqs;
    match f.bandwidth.filter(|b| *b > 0.0) {
        Some(bw) => {
            let moving = bytes_per_req / bw;
            let waiting = (per_req - moving).max(0.0);
            let kind = if waiting >= moving {
                BoundKind::RoundTrips
            } else {
                BoundKind::Bandwidth
            };
            let rtt = f
                .rtt
                .map(|r| format!(" (round trip {:.1} ms)", r * 1e3))
                .unwrap_or_default();
            (
                kind,
                format!(
                    "an average request took {:.1} ms: {:.1} ms to move its {:.0} KB at {:.0} MB/s and {:.1} ms waiting for answers{rtt}",
                    per_req * 1e3,
                    moving * 1e3,
                    bytes_per_req / 1e3,
                    bw / 1e6,
                    waiting * 1e3
                ),
            )
        }
        None => {
            // Without a measured bandwidth: small requests are round trips.
            let kind = if bytes_per_req < 1e6 {
                BoundKind::RoundTrips
            } else {
                BoundKind::Bandwidth
            };
            (
                kind,
                format!(
                    "an average request took {:.1} ms and moved {:.0} KB",
                    per_req * 1e3,
                    bytes_per_req / 1e3
                ),
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn facts() -> RunFacts {
        RunFacts {
            wall: 10.0,
            cores: 2.0,
            ..RunFacts::default()
        }
    }

    #[test]
    fn small_sequential_requests_are_round_trips() {
        // Per-file copying at 10 ms: 300 requests of 50 KB, 30 ms each.
        let f = RunFacts {
            requests: 300,
            bytes_moved: 300 * 51_200,
            dest_busy: 9.5,
            request_secs: 9.0,
            rtt: Some(0.010),
            bandwidth: Some(100e6),
            ..facts()
        };
        let b = analyze(&f);
        assert_eq!(b.kind, BoundKind::RoundTrips, "{}", b.summary);
    }

    #[test]
    fn large_requests_at_line_rate_are_bandwidth() {
        let f = RunFacts {
            requests: 10,
            bytes_moved: 10 * (16 << 20),
            dest_busy: 9.0,
            request_secs: 10.0,
            rtt: Some(0.002),
            bandwidth: Some(20e6),
            ..facts()
        };
        assert_eq!(analyze(&f).kind, BoundKind::Bandwidth);
    }

    #[test]
    fn busy_cores_are_cpu() {
        let f = RunFacts {
            chunk_hash: 8.0,
            compress: 6.0,
            encrypt: 4.0,
            dest_busy: 3.0,
            ..facts()
        };
        let b = analyze(&f);
        assert_eq!(b.kind, BoundKind::Cpu);
        assert!(
            b.summary
                .contains("most of it chunking and hashing (44% of the CPU time)"),
            "{}",
            b.summary
        );
    }

    #[test]
    fn blocked_readers_are_the_source_disk() {
        let f = RunFacts {
            read: 30.0,
            chunk_hash: 2.0,
            dest_busy: 1.0,
            ..facts()
        };
        assert_eq!(analyze(&f).kind, BoundKind::SourceDisk);
    }

    #[test]
    fn idle_runs_are_fixed_costs() {
        let b = analyze(&facts());
        assert_eq!(b.kind, BoundKind::Fixed);
        assert!(b.summary.contains("fixed costs"), "{}", b.summary);
    }

    /// The no-change run of 1,000,000 files: 2.95 s, 4.40
    /// thread-seconds scanning, the destination and CPU nearly idle.
    #[test]
    fn a_walk_of_many_entries_is_scan_bound() {
        let f = RunFacts {
            wall: 2.95,
            scan: 4.40,
            entries: 1_010_101,
            chunk_hash: 0.01,
            requests: 9,
            dest_busy: 0.05,
            request_secs: 0.05,
            ..facts()
        };
        let b = analyze(&f);
        assert_eq!(b.kind, BoundKind::Scan, "{}", b.summary);
        assert!(
            b.summary.contains("1010101 entries, 1.5 of 2 cores"),
            "{}",
            b.summary
        );
    }

    /// Below the threshold nothing is the bound, but the busiest stage is
    /// still named; above it, the largest share wins whatever its kind.
    #[test]
    fn the_largest_share_names_the_bound() {
        let quiet = RunFacts {
            scan: 2.0,
            dest_busy: 1.0,
            ..facts()
        };
        let b = analyze(&quiet);
        assert_eq!(b.kind, BoundKind::Fixed);
        assert!(
            b.summary.contains("scanning the source, 20%"),
            "{}",
            b.summary
        );
        // Destination 60%, scanning 80%: the scan.
        let f = RunFacts {
            scan: 8.0,
            dest_busy: 6.0,
            requests: 100,
            request_secs: 6.0,
            ..facts()
        };
        assert_eq!(analyze(&f).kind, BoundKind::Scan);
        // Destination 90%, scanning 80%: the destination.
        let f = RunFacts {
            dest_busy: 9.0,
            ..f
        };
        assert_eq!(analyze(&f).kind, BoundKind::RoundTrips);
    }
}
