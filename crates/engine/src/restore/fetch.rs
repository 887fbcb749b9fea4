//! File contents, fetched pack by pack.
//!
//! A restore needs a set of blobs, each written at one or more (file,
//! offset) places. Fetching blob by blob costs a round trip per blob, which
//! at NAS or WAN latency makes a restore many times slower than the backup
//! was. So the plan groups the needed blobs by pack, sorts them by offset,
//! and merges neighbours into ranged reads of up to [`MAX_REQUEST`] bytes
//! (reading across a gap of up to [`MAX_GAP`], [`MAX_GAP_REMOTE`] over the
//! network, rather than paying another request). `workers` threads (the destination's concurrency) take the
//! requests in order, so that many are in flight at once; each worker
//! authenticates, decompresses and verifies what it fetched and writes
//! every blob to every place that needs it with positioned writes. A large
//! file's blobs live in many packs and so are written by many workers at
//! once: parallelism never comes only from having many files.
//!
//! Memory: each worker holds one request's bytes and one decoded blob, so
//! the bound is `workers × (MAX_REQUEST + 2 × largest blob)`: 8 workers and
//! 4 MiB chunks give 96 MiB at worst. The plan itself costs about 100
//! bytes per needed blob.

use std::collections::HashMap;
use std::fs::File;
use std::ops::Range;
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use capsule_backend::BackendError;
use capsule_format::{BlobId, BlobType};

use super::fsys::{apply_fd_meta, FileId, Layout, Target};
use super::item::{Arena, Item};
use crate::error::EngineError;
use crate::index::{BlobLoc, MasterIndex};
use crate::progress::Progress;
use crate::repo::{pack_name, Repository};

/// Largest ranged read the plan makes from several blobs.
pub const MAX_REQUEST: u64 = 4 << 20;
/// Largest gap between two needed blobs that one read spans, on a local
/// destination (a disk: a request costs a system call, bytes cost reads).
pub const MAX_GAP: u64 = 64 << 10;
/// The same on a network destination, where a request costs a round trip
/// and the server's work for it: the fleet year's four MinIO nodes spent
/// about 5.5 ms of CPU a request and 3.2 ms a MiB (two restores of the
/// same data, 379 and 109 requests), so reading across up to 1 MiB is
/// cheaper than asking again. It matters most in a repository grown by
/// hourly runs and pruned for a year: many small packs, each with what
/// later snapshots no longer use between what the newest one needs.
pub const MAX_GAP_REMOTE: u64 = 1 << 20;

/// The gap one read spans on `repo`'s destination.
pub fn max_gap(repo: &Repository) -> u64 {
    if repo.backend().capabilities().local {
        MAX_GAP
    } else {
        MAX_GAP_REMOTE
    }
}
/// Files held open between their writes; beyond this a file is closed
/// after each write and reopened (and its identity checked) for the next.
const MAX_OPEN_FILES: usize = 512;
/// Holes in sparse files are kept at this granularity.
const SPARSE_BLOCK: usize = 4096;

/// What fetching cost, for `--json` and the restore's bound.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct FetchStats {
    /// Distinct packs read from.
    pub packs: u64,
    /// Data packs in the repository: a partial restore reads only the
    /// `packs` that hold what it needs.
    pub packs_in_repository: u64,
    /// Ranged reads made (retries and fallbacks included).
    pub requests: u64,
    /// Ranged reads of tree packs, every directory level at once.
    pub tree_requests: u64,
    /// Bytes those reads returned.
    pub bytes_fetched: u64,
    /// Bytes of the blobs the restore needed (their stored, encrypted size).
    pub bytes_needed: u64,
    /// Distinct blobs fetched.
    pub blobs: u64,
    /// Requests in flight at once (worker threads).
    pub workers: u64,
    /// Seconds the workers spent waiting for the destination, summed.
    pub wait_secs: f64,
    /// Seconds they spent decrypting, decompressing, verifying and
    /// writing, summed.
    pub work_secs: f64,
    /// Of `work_secs`, seconds spent in writes to the target.
    pub write_secs: f64,
    /// Round trip per request, from a least-squares fit of request time
    /// against request size (the intercept); the slope is the transfer.
    pub request_latency_secs: f64,
    /// What limited the restore, with the evidence.
    pub bound: Bound,
    /// Packs read so far (positions in the index), so that `packs` counts
    /// each once across batches.
    #[serde(skip)]
    packs_read: std::collections::HashSet<u32>,
    /// Sums for the fit of request time against size, over every batch:
    /// n, Σx, Σy, Σxx, Σxy.
    #[serde(skip)]
    fit: [f64; 5],
}

/// What a restore waited on most.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum BoundKind {
    /// Nothing was fetched.
    #[default]
    None,
    /// Waiting for answers, most of it the fixed cost of each request
    /// (round trips, and queueing at the server): more requests in flight
    /// (`--connections`) help when the server has room.
    DestinationRoundTrips,
    /// Waiting for answers, most of it transfer: the link or the server.
    DestinationBandwidth,
    /// Writing to the target disk.
    TargetDisk,
    /// Decrypting, decompressing and verifying.
    Cpu,
}

/// A restore's bound and why.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct Bound {
    /// The limit.
    pub kind: BoundKind,
    /// The figures behind it.
    pub evidence: String,
}

impl FetchStats {
    /// Classifies the bound from the summed times. Waiting is split into
    /// latency (requests × the quickest request, spread over the workers)
    /// and the rest (transfer); work into writing and decoding.
    fn classify(&mut self) {
        if self.requests == 0 {
            return;
        }
        let latency = (self.requests as f64 * self.request_latency_secs).min(self.wait_secs);
        let transfer = self.wait_secs - latency;
        let write = self.write_secs;
        let cpu = (self.work_secs - write).max(0.0);
        let parts = [
            (BoundKind::DestinationRoundTrips, latency),
            (BoundKind::DestinationBandwidth, transfer),
            (BoundKind::TargetDisk, write),
            (BoundKind::Cpu, cpu),
        ];
        let total: f64 = parts.iter().map(|p| p.1).sum::<f64>().max(1e-9);
        let (kind, _) =
            parts.iter().cloned().fold(
                (BoundKind::None, -1.0),
                |a, b| if b.1 > a.1 { b } else { a },
            );
        let pct = |x: f64| x / total * 100.0;
        self.bound = Bound {
            kind,
            evidence: format!(
                "of {:.1} worker-seconds: {:.0}% per-request time ({} requests, {:.1} ms each beyond their transfer), {:.0}% transfer ({:.0} MB fetched), {:.0}% writing, {:.0}% decoding; {} requests in flight",
                total,
                pct(latency),
                self.requests,
                self.request_latency_secs * 1e3,
                pct(transfer),
                self.bytes_fetched as f64 / 1e6,
                pct(write),
                pct(cpu),
                self.workers
            ),
        };
    }
}

/// One file to write: its entry in the plan and its metadata.
pub(super) struct FileJob<'n> {
    pub entry: usize,
    pub node: &'n Item,
}

struct BlobJob {
    id: BlobId,
    loc: BlobLoc,
    /// (file job, offset in that file)
    places: Places,
}

/// Where a blob goes. Most blobs go to one place: that one is held inline,
/// and only a blob shared by several files or offsets allocates (a `Vec`
/// per blob cost 19 MB on 300,000 tiny files).
#[derive(Default)]
struct Places {
    first: Option<(u32, u64)>,
    more: Vec<(u32, u64)>,
}

impl Places {
    fn push(&mut self, p: (u32, u64)) {
        if self.first.is_none() {
            self.first = Some(p);
        } else {
            self.more.push(p);
        }
    }

    fn is_empty(&self) -> bool {
        self.first.is_none()
    }

    fn iter(&self) -> impl Iterator<Item = &(u32, u64)> {
        self.first.iter().chain(&self.more)
    }
}

struct Request {
    pack: u32,
    range: Range<u64>,
    blobs: Range<usize>,
}

#[derive(Default)]
struct Slot {
    file: Option<Arc<File>>,
    id: Option<FileId>,
    remaining: usize,
    failed: Option<String>,
    done: bool,
}

/// The outcome for each file job, in order: `Ok` when complete with its
/// metadata applied (the `String` is a metadata warning, if any), `Err`
/// with the reason otherwise.
pub(super) type Outcome = Result<Option<String>, String>;

/// Writes the contents of `files` below `target`. Returns each file's
/// outcome, or the destination failure that stopped the restore. Called
/// once per batch of files: `stats` adds up over the calls.
#[allow(clippy::too_many_arguments)]
pub(super) fn write_files<L: Layout>(
    repo: &Repository,
    index: &MasterIndex,
    target: &Target<'_, L>,
    files: &[FileJob<'_>],
    arena: &Arena,
    workers: usize,
    progress: &Progress,
    stats: &mut FetchStats,
) -> Result<Vec<Outcome>, EngineError> {
    let slots: Vec<Mutex<Slot>> = files.iter().map(|_| Mutex::default()).collect();
    let lock = |k: usize| slots[k].lock().unwrap_or_else(|p| p.into_inner());

    // The plan: every needed blob once, with every place it goes.
    // Room for as many blobs as the files name (fewer when they share):
    // growing by doubling would leave up to half of it idle at the peak.
    let named = files
        .iter()
        .map(|f| arena.content(f.node).len())
        .fold(0usize, usize::saturating_add)
        .min(1 << 22);
    let mut blobs: Vec<BlobJob> = Vec::with_capacity(named);
    let mut by_id: HashMap<BlobId, usize> = HashMap::with_capacity(named);
    for (k, f) in files.iter().enumerate() {
        let mut off = 0u64;
        let content = arena.content(f.node);
        let mut places = Vec::with_capacity(content.len());
        let mut missing = None;
        for id in content {
            let Some(loc) = index.locations(id).find(|l| l.blob_type == BlobType::Data) else {
                missing = Some(format!("blob {} is in no index", id.short()));
                break;
            };
            // A crafted index must not make a worker read or allocate
            // gigabytes (see `Repository::decode_blob`).
            let limit = repo.max_blob_len(BlobType::Data);
            if loc.raw_length as usize > limit
                || loc.length as usize > limit + Repository::ENVELOPE_SLACK
            {
                missing = Some(format!(
                    "blob {} claims {} bytes ({} stored), more than a data blob can hold",
                    id.short(),
                    loc.raw_length,
                    loc.length
                ));
                break;
            }
            let b = *by_id.entry(*id).or_insert_with(|| {
                blobs.push(BlobJob {
                    id: *id,
                    loc,
                    places: Places::default(),
                });
                blobs.len() - 1
            });
            places.push((b, off));
            off += loc.raw_length as u64;
        }
        if missing.is_none() && off != f.node.size {
            missing = Some(format!(
                "content is {off} bytes, metadata says {}",
                f.node.size
            ));
        }
        let mut s = lock(k);
        match missing {
            Some(m) => s.failed = Some(m),
            None => {
                s.remaining = places.len();
                for (b, off) in places {
                    blobs[b].places.push((k as u32, off));
                }
            }
        }
    }
    drop(by_id);
    // Blobs of files that already failed are not fetched.
    blobs.retain(|b| !b.places.is_empty());
    blobs.sort_by_key(|b| (b.loc.pack, b.loc.offset));
    let requests = coalesce(&blobs, max_gap(repo));
    stats.blobs += blobs.len() as u64;
    stats.packs_in_repository = index
        .packs()
        .iter()
        .filter(|p| p.blob_type == BlobType::Data)
        .count() as u64;
    stats.bytes_needed += blobs.iter().map(|b| b.loc.length as u64).sum::<u64>();
    stats.packs_read.extend(requests.iter().map(|r| r.pack));
    stats.packs = stats.packs_read.len() as u64;

    let meta_warn: Mutex<Vec<(usize, String)>> = Mutex::default();
    let meta_failed = |k: usize, e: std::io::Error| {
        meta_warn
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push((k, format!("metadata not fully restored: {e}")));
    };

    // Files with no content are complete now.
    for (k, f) in files.iter().enumerate() {
        let mut s = lock(k);
        if s.failed.is_none() && s.remaining == 0 {
            match target.create_file(f.entry, 0) {
                Ok((file, id)) => {
                    s.id = Some(id);
                    if let Err(e) = apply_fd_meta(&file, f.node) {
                        meta_failed(k, e);
                    }
                    match target.commit_file(f.entry, id) {
                        Ok(()) => {
                            s.done = true;
                            Progress::add(&progress.files_done, 1);
                        }
                        Err(e) => s.failed = Some(format!("cannot put in place: {e}")),
                    }
                }
                Err(e) => s.failed = Some(format!("cannot create: {e}")),
            }
        }
    }

    let open_files = AtomicUsize::new(0);
    let next = AtomicUsize::new(0);
    // What stops the whole restore: the destination failing for good, or
    // the target disk filling up (every later file would fail the same
    // way, so going on would only turn one clear error into thousands).
    let abort: Mutex<Option<EngineError>> = Mutex::new(None);
    let stop = AtomicBool::new(false);
    let requests_made = AtomicU64::new(0);
    let fetched = AtomicU64::new(0);
    let wait_ns = AtomicU64::new(0);
    let work_ns = AtomicU64::new(0);
    let write_ns = AtomicU64::new(0);
    // Sums for the fit of request time against size: n, Σx, Σy, Σxx, Σxy.
    let fit: Mutex<[f64; 5]> = Mutex::new(stats.fit);

    let fail_blob = |b: &BlobJob, why: &str| {
        for &(k, _) in b.places.iter() {
            let mut s = lock(k as usize);
            s.failed.get_or_insert_with(|| why.to_string());
        }
    };
    let stop_with = |e: EngineError| {
        abort
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get_or_insert(e);
        stop.store(true, Ordering::Relaxed);
    };
    let destination_failed = |e: BackendError| stop_with(EngineError::Backend(e));
    let target_full = |k: usize, e: &std::io::Error| {
        if e.kind() == std::io::ErrorKind::StorageFull
            || e.kind() == std::io::ErrorKind::QuotaExceeded
        {
            stop_with(EngineError::io(
                "write",
                target.path(files[k].entry),
                std::io::Error::new(e.kind(), e.to_string()),
            ));
        }
    };

    // Writes one blob's plaintext to file `k` at `off`.
    let write = |k: usize, off: u64, data: &[u8]| -> Result<(), String> {
        let f = &files[k];
        let file = {
            let mut s = lock(k);
            if let Some(why) = &s.failed {
                return Err(why.clone());
            }
            match &s.file {
                Some(f) => f.clone(),
                None => {
                    let opened = match s.id {
                        None => target.create_file(f.entry, f.node.size).map(|(file, id)| {
                            s.id = Some(id);
                            file
                        }),
                        Some(id) => target.reopen_file(f.entry, id),
                    };
                    let file = Arc::new(opened.map_err(|e| {
                        target_full(k, &e);
                        let m = format!("cannot create: {e}");
                        s.failed = Some(m.clone());
                        m
                    })?);
                    if open_files.fetch_add(1, Ordering::Relaxed) < MAX_OPEN_FILES {
                        s.file = Some(file.clone());
                    } else {
                        open_files.fetch_sub(1, Ordering::Relaxed);
                    }
                    file
                }
            }
        };
        let t = Instant::now();
        let r = if f.node.sparse {
            data.chunks(SPARSE_BLOCK)
                .enumerate()
                .filter(|(_, b)| b.iter().any(|&x| x != 0))
                .try_for_each(|(i, b)| file.write_all_at(b, off + (i * SPARSE_BLOCK) as u64))
        } else {
            file.write_all_at(data, off)
        };
        write_ns.fetch_add(t.elapsed().as_nanos() as u64, Ordering::Relaxed);
        Progress::add(&progress.bytes_done, data.len() as u64);
        let mut s = lock(k);
        if let Err(e) = r {
            target_full(k, &e);
            let m = format!("write failed: {e}");
            s.failed.get_or_insert(m.clone());
            return Err(m);
        }
        s.remaining -= 1;
        if s.remaining == 0 && s.failed.is_none() {
            if s.file.take().is_some() {
                open_files.fetch_sub(1, Ordering::Relaxed);
            }
            let id = s.id;
            drop(s);
            if let Err(e) = apply_fd_meta(&*file, f.node) {
                meta_failed(k, e);
            }
            // Complete, with its metadata: only now under its real name.
            let placed = match id {
                Some(id) => target.commit_file(f.entry, id),
                None => Err(std::io::Error::other("created by no one")),
            };
            let mut s = lock(k);
            match placed {
                Ok(()) => {
                    s.done = true;
                    Progress::add(&progress.files_done, 1);
                }
                Err(e) => {
                    let m = format!("cannot put in place: {e}");
                    s.failed.get_or_insert(m.clone());
                    return Err(m);
                }
            }
        }
        Ok(())
    };
    let deliver = |b: &BlobJob, data: &[u8]| {
        for &(k, off) in b.places.iter() {
            // A failed file is reported once, from its slot.
            let _ = write(k as usize, off, data);
        }
    };
    // A blob its planned read could not supply: every other copy is tried.
    let fallback = |b: &BlobJob, first: &EngineError| {
        requests_made.fetch_add(1, Ordering::Relaxed);
        match repo.read_blob(index, BlobType::Data, &b.id) {
            Ok(data) => deliver(b, &data),
            Err(EngineError::Backend(e)) if e.is_destination_failure() => destination_failed(e),
            Err(_) => fail_blob(b, &first.to_string()),
        }
    };

    let workers = workers.clamp(1, requests.len().max(1));
    stats.workers = workers as u64;
    std::thread::scope(|scope| {
        for _ in 0..workers {
            scope.spawn(|| {
                while !stop.load(Ordering::Relaxed) {
                    let r = next.fetch_add(1, Ordering::Relaxed);
                    let Some(req) = requests.get(r) else { break };
                    let name = pack_name(&index.pack_id(req.pack), BlobType::Data);
                    let t = Instant::now();
                    requests_made.fetch_add(1, Ordering::Relaxed);
                    let got = repo.backend().get(&name, Some(req.range.clone()));
                    let waited = t.elapsed().as_nanos() as u64;
                    wait_ns.fetch_add(waited, Ordering::Relaxed);
                    {
                        let (x, y) = (
                            (req.range.end - req.range.start) as f64,
                            waited as f64 / 1e9,
                        );
                        let mut f = fit.lock().unwrap_or_else(|p| p.into_inner());
                        for (acc, v) in f.iter_mut().zip([1.0, x, y, x * x, x * y]) {
                            *acc += v;
                        }
                    }
                    let t = Instant::now();
                    match got {
                        Ok(mut buf) => {
                            fetched.fetch_add(buf.len() as u64, Ordering::Relaxed);
                            // Each blob is decrypted where it lies in the
                            // fetched range: the plan names a blob once, and
                            // blobs of one pack never overlap (one that does
                            // only fails its own authentication).
                            for b in &blobs[req.blobs.clone()] {
                                let start = (b.loc.offset as u64 - req.range.start) as usize;
                                let end = start + b.loc.length as usize;
                                let env = buf.get_mut(start..end).unwrap_or(&mut []);
                                match repo.decode_blob_in_place(
                                    &name,
                                    BlobType::Data,
                                    &b.id,
                                    env,
                                    b.loc.raw_length as usize,
                                ) {
                                    Ok(data) => deliver(b, &data),
                                    Err(e) => fallback(b, &e),
                                }
                            }
                        }
                        Err(e) if e.is_destination_failure() => destination_failed(e),
                        Err(e) => {
                            let e = EngineError::Backend(e);
                            for b in &blobs[req.blobs.clone()] {
                                fallback(b, &e);
                            }
                        }
                    }
                    work_ns.fetch_add(t.elapsed().as_nanos() as u64, Ordering::Relaxed);
                }
            });
        }
    });
    stats.requests += requests_made.into_inner();
    stats.bytes_fetched += fetched.into_inner();
    stats.wait_secs += wait_ns.into_inner() as f64 / 1e9;
    stats.work_secs += work_ns.into_inner() as f64 / 1e9;
    stats.write_secs += write_ns.into_inner() as f64 / 1e9;
    stats.fit = fit.into_inner().unwrap_or_else(|p| p.into_inner());
    stats.request_latency_secs = {
        let [n, sx, sy, sxx, sxy] = stats.fit;
        let den = n * sxx - sx * sx;
        if n < 2.0 || den.abs() < f64::EPSILON {
            // All requests the same size: latency cannot be told from
            // transfer; call none of it latency.
            0.0
        } else {
            let slope = ((n * sxy - sx * sy) / den).max(0.0);
            ((sy - slope * sx) / n).clamp(0.0, sy / n)
        }
    };
    stats.classify();

    let aborted = abort.into_inner().unwrap_or_else(|p| p.into_inner());
    let mut outcomes: Vec<Outcome> = Vec::with_capacity(files.len());
    for (k, slot) in slots.into_iter().enumerate() {
        let s = slot.into_inner().unwrap_or_else(|p| p.into_inner());
        drop(s.file);
        let outcome = if s.done && s.failed.is_none() {
            Ok(None)
        } else {
            // What this restore created for it (under its part name) goes.
            if let Some(id) = s.id {
                let _ = target.remove_file(files[k].entry, id);
            }
            Err(s
                .failed
                .unwrap_or_else(|| "not restored: the restore stopped".to_string()))
        };
        outcomes.push(outcome);
    }
    for (k, m) in meta_warn.into_inner().unwrap_or_else(|p| p.into_inner()) {
        if let Some(Ok(w)) = outcomes.get_mut(k) {
            *w = Some(m);
        }
    }
    match aborted {
        Some(e) => Err(e),
        None => Ok(outcomes),
    }
}

/// Merges blobs (sorted by pack and offset) into ranged reads.
fn coalesce(blobs: &[BlobJob], max_gap: u64) -> Vec<Request> {
    let mut out: Vec<Request> = Vec::new();
    for (i, b) in blobs.iter().enumerate() {
        let start = b.loc.offset as u64;
        let end = start + b.loc.length as u64;
        if let Some(r) = out.last_mut() {
            if r.pack == b.loc.pack
                && start >= r.range.end
                && start - r.range.end <= max_gap
                && end - r.range.start <= MAX_REQUEST
            {
                r.range.end = end;
                r.blobs.end = i + 1;
                continue;
            }
        }
        out.push(Request {
            pack: b.loc.pack,
            range: start..end,
            blobs: i..i + 1,
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn blob(pack: u32, offset: u32, length: u32) -> BlobJob {
        BlobJob {
            id: BlobId(capsule_format::id::Id([offset as u8; 32])),
            loc: BlobLoc {
                pack,
                blob_type: BlobType::Data,
                offset,
                length,
                raw_length: length,
            },
            places: Places {
                first: Some((0, 0)),
                more: Vec::new(),
            },
        }
    }

    #[test]
    fn neighbours_merge_and_far_or_foreign_blobs_do_not() {
        let gap = MAX_GAP as u32;
        let blobs = [
            blob(0, 0, 100),
            blob(0, 100, 100),         // adjacent: merged
            blob(0, 200 + gap, 100),   // gap of exactly MAX_GAP: merged
            blob(0, 301 + 2 * gap, 1), // one byte further: a new read
            blob(1, 0, 100),           // another pack: a new read
        ];
        let r = coalesce(&blobs, MAX_GAP);
        let got: Vec<_> = r
            .iter()
            .map(|r| (r.pack, r.range.clone(), r.blobs.clone()))
            .collect();
        assert_eq!(
            got,
            vec![
                (0, 0..(300 + MAX_GAP), 0..3),
                (0, (301 + 2 * MAX_GAP)..(302 + 2 * MAX_GAP), 3..4),
                (1, 0..100, 4..5),
            ]
        );
        // Over the network the far blob is worth the gap's bytes.
        let r = coalesce(&blobs, MAX_GAP_REMOTE);
        let got: Vec<_> = r.iter().map(|r| r.blobs.clone()).collect();
        assert_eq!(got, vec![0..4, 4..5]);
    }

    #[test]
    fn no_read_grows_past_the_limit_unless_one_blob_is_that_large() {
        let big = MAX_REQUEST as u32;
        let blobs = [
            blob(0, 0, big / 2),
            blob(0, big / 2, big / 2),  // exactly the limit: merged
            blob(0, big, 1),            // over it: a new read
            blob(0, big + 1, big + 10), // one blob above the limit: alone
        ];
        let r = coalesce(&blobs, MAX_GAP);
        let got: Vec<_> = r.iter().map(|r| r.blobs.clone()).collect();
        assert_eq!(got, vec![0..2, 2..3, 3..4]);
        assert!(r
            .iter()
            .all(|r| r.range.end - r.range.start <= MAX_REQUEST || r.blobs.len() == 1));
    }
}
