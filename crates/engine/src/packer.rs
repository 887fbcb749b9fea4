//! The write side of the pipeline: deduplicate, compress, encrypt, pack and
//! upload blobs, then index them.
//!
//! ```text
//! readers ──(bounded)──► seal workers ──► pack builders ──(bounded)──► uploaders ──► index writer
//! ```
//! Readers call [`BlobSaver::save`] with a blob and its ID. Seal workers
//! (one per core) compress and encrypt; the pack builders (one per blob type)
//! cut packs at the target size; uploaders put packs and then record them in
//! an index file every [`INDEX_EVERY`] packs, so an interrupted backup loses at
//! most that many packs' worth of work. Bounded channels give backpressure,
//! which bounds memory no matter how fast the readers are.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use capsule_crypto::Aad;
use capsule_format::index::{IndexFile, IndexPack};
use capsule_format::pack::{encode_header, trailer, PackEntry};
use capsule_format::{compress, BlobId, BlobType, ObjectId};
use crossbeam_channel::{bounded, Receiver, Sender};

use crate::index::{save_index_file, MasterIndex};
use crate::journal::Journal;
use crate::repo::{pack_name, put_addressed_owned, Repository};
use crate::{EngineError, Result};

/// Packs per index file written during a backup.
pub const INDEX_EVERY: usize = 4;

/// Uploaded pack buffers kept for the next packs. A fresh 16 MiB buffer is
/// a fresh mapping (the CLI sets glibc's mmap threshold at 1 MiB), and
/// faulting its pages in and unmapping it again cost about a tenth of the
/// pipeline's CPU in a 10,000-file backup.
const SPARE_BUFFERS: usize = 2;

struct SealJob {
    t: BlobType,
    id: BlobId,
    data: Vec<u8>,
}

struct FinishedPack {
    bytes: Vec<u8>,
    entries: Vec<PackEntry>,
}

#[derive(Default)]
struct PackBuilder {
    buf: Vec<u8>,
    entries: Vec<PackEntry>,
}

impl PackBuilder {
    fn take(&mut self, repo: &Repository) -> Result<Option<FinishedPack>> {
        if self.entries.is_empty() {
            return Ok(None);
        }
        let mut bytes = std::mem::take(&mut self.buf);
        let entries = std::mem::take(&mut self.entries);
        let header = repo.key().seal(Aad::PackHeader, &encode_header(&entries))?;
        bytes.extend_from_slice(&header);
        bytes.extend_from_slice(&trailer(header.len() as u32));
        Ok(Some(FinishedPack { bytes, entries }))
    }
}

/// Counters of what the saver stored.
#[derive(Debug, Default)]
pub struct SaverStats {
    /// New blobs stored.
    pub blobs_added: AtomicU64,
    /// Plaintext bytes of new blobs.
    pub raw_bytes_added: AtomicU64,
    /// Bytes of envelopes stored (after compression and encryption).
    pub stored_bytes_added: AtomicU64,
    /// Packs uploaded.
    pub packs: AtomicU64,
    /// Packs an interrupted earlier run had uploaded but not indexed,
    /// indexed by this run instead of uploaded again.
    pub packs_recovered: AtomicU64,
    /// Index files written.
    pub index_files: AtomicU64,
    /// Nanoseconds spent compressing.
    pub compress_ns: AtomicU64,
    /// Nanoseconds spent encrypting.
    pub encrypt_ns: AtomicU64,
    /// Nanoseconds spent in backend puts.
    pub upload_ns: AtomicU64,
}

struct Shared {
    repo: Arc<Repository>,
    index: Arc<MasterIndex>,
    claimed: Mutex<HashSet<BlobId>>,
    packers: [Mutex<PackBuilder>; 2],
    pending: Mutex<IndexFile>,
    journal: Option<Journal>,
    spare: Mutex<Vec<Vec<u8>>>,
    error: Mutex<Option<EngineError>>,
    failed: AtomicBool,
    stats: SaverStats,
}

impl Shared {
    fn fail(&self, e: EngineError) {
        self.failed.store(true, Ordering::SeqCst);
        let mut g = self.error.lock().unwrap_or_else(|p| p.into_inner());
        if g.is_none() {
            *g = Some(e);
        }
    }

    fn flush_index(&self, force: bool) -> Result<()> {
        let f = {
            let mut p = self.pending.lock().unwrap_or_else(|p| p.into_inner());
            if p.packs.is_empty() || (!force && p.packs.len() < INDEX_EVERY) {
                return Ok(());
            }
            std::mem::take(&mut *p)
        };
        save_index_file(&self.repo, &f)?;
        self.stats.index_files.fetch_add(1, Ordering::Relaxed);
        if let Some(j) = &self.journal {
            let ids: Vec<ObjectId> = f.packs.iter().map(|p| p.id).collect();
            j.indexed(&self.repo, &ids);
        }
        Ok(())
    }
}

/// Handle to the write pipeline of one backup.
pub struct BlobSaver {
    shared: Arc<Shared>,
    seal_tx: Option<Sender<SealJob>>,
    upload_tx: Option<Sender<FinishedPack>>,
    seal_threads: Vec<JoinHandle<()>>,
    upload_threads: Vec<JoinHandle<()>>,
}

impl BlobSaver {
    /// Starts seal and upload workers.
    pub fn start(repo: Arc<Repository>, index: Arc<MasterIndex>, threads: usize) -> Self {
        Self::start_with(repo, index, threads, None)
    }

    /// Like [`BlobSaver::start`], keeping a [`Journal`] of packs landed but
    /// not yet indexed at `journal.0`. `journal.1` are packs recovered from
    /// an earlier run's journal (already in `index`): they are listed in this
    /// run's first index file.
    pub fn start_with(
        repo: Arc<Repository>,
        index: Arc<MasterIndex>,
        threads: usize,
        journal: Option<(std::path::PathBuf, Vec<IndexPack>)>,
    ) -> Self {
        let uploads = repo.backend().capabilities().concurrency.max(1);
        let (seal_tx, seal_rx) = bounded::<SealJob>(threads * 2);
        // Packs in memory at most: one filling per type, one queued, one
        // per uploader.
        let (upload_tx, upload_rx) = bounded::<FinishedPack>(1);
        let stats = SaverStats::default();
        let mut pending = IndexFile::default();
        let journal = journal.map(|(path, recovered)| {
            stats
                .packs_recovered
                .store(recovered.len() as u64, Ordering::Relaxed);
            pending.packs = recovered.clone();
            Journal::new(path, recovered)
        });
        let shared = Arc::new(Shared {
            repo,
            index,
            claimed: Mutex::new(HashSet::new()),
            packers: [Mutex::default(), Mutex::default()],
            pending: Mutex::new(pending),
            journal,
            spare: Mutex::new(Vec::new()),
            error: Mutex::new(None),
            failed: AtomicBool::new(false),
            stats,
        });
        let seal_threads = (0..threads)
            .map(|i| {
                let s = shared.clone();
                let rx = seal_rx.clone();
                let tx = upload_tx.clone();
                std::thread::Builder::new()
                    .name(format!("seal-{i}"))
                    .spawn(move || seal_worker(&s, rx, tx))
                    .expect("spawn seal worker")
            })
            .collect();
        let upload_threads = (0..uploads)
            .map(|i| {
                let s = shared.clone();
                let rx = upload_rx.clone();
                std::thread::Builder::new()
                    .name(format!("upload-{i}"))
                    .spawn(move || upload_worker(&s, rx))
                    .expect("spawn upload worker")
            })
            .collect();
        BlobSaver {
            shared,
            seal_tx: Some(seal_tx),
            upload_tx: Some(upload_tx),
            seal_threads,
            upload_threads,
        }
    }

    /// Stores a blob unless the repository or this run already has it.
    /// Returns whether it was new. Fails once the pipeline has failed, so
    /// that a repository write error stops the backup instead of being
    /// mistaken for a per-file problem.
    pub fn save(&self, t: BlobType, id: BlobId, data: Vec<u8>) -> Result<bool> {
        if self.shared.failed.load(Ordering::Relaxed) {
            return Err(self.failure());
        }
        if self.shared.index.contains(&id) {
            return Ok(false);
        }
        if !self
            .shared
            .claimed
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(id)
        {
            return Ok(false);
        }
        let tx = self.seal_tx.as_ref().ok_or(EngineError::Interrupted)?;
        if tx.send(SealJob { t, id, data }).is_err() {
            return Err(self.failure());
        }
        Ok(true)
    }

    /// Whether the blob is stored or being stored.
    pub fn has(&self, id: &BlobId) -> bool {
        self.shared.index.contains(id)
            || self
                .shared
                .claimed
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .contains(id)
    }

    /// What readers see once the pipeline failed; the real error is kept
    /// for [`BlobSaver::finish`], which callers must still call.
    fn failure(&self) -> EngineError {
        EngineError::Interrupted
    }

    /// Live counters.
    pub fn stats(&self) -> &SaverStats {
        &self.shared.stats
    }

    /// Flushes everything: remaining packs are uploaded and indexed. After
    /// `Ok`, every blob passed to `save` is durable and indexed, so a snapshot
    /// referencing them may be written.
    pub fn finish(mut self) -> Result<SaverStatsSnapshot> {
        drop(self.seal_tx.take());
        for h in self.seal_threads.drain(..) {
            let _ = h.join();
        }
        if !self.shared.failed.load(Ordering::SeqCst) {
            if let Some(tx) = self.upload_tx.as_ref() {
                for p in &self.shared.packers {
                    let taken = p
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .take(&self.shared.repo);
                    match taken {
                        Ok(Some(fp)) => {
                            let _ = tx.send(fp);
                        }
                        Ok(None) => {}
                        Err(e) => self.shared.fail(e),
                    }
                }
            }
        }
        drop(self.upload_tx.take());
        for h in self.upload_threads.drain(..) {
            let _ = h.join();
        }
        if let Some(e) = self
            .shared
            .error
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
        {
            // Index the packs that did land (best effort: the failure may
            // be a full disk), so the next run reuses instead of re-uploading
            // them.
            let _ = self.shared.flush_index(true);
            return Err(e);
        }
        self.shared.flush_index(true)?;
        let s = &self.shared.stats;
        Ok(SaverStatsSnapshot {
            blobs_added: s.blobs_added.load(Ordering::Relaxed),
            raw_bytes_added: s.raw_bytes_added.load(Ordering::Relaxed),
            stored_bytes_added: s.stored_bytes_added.load(Ordering::Relaxed),
            packs: s.packs.load(Ordering::Relaxed),
            packs_recovered: s.packs_recovered.load(Ordering::Relaxed),
            index_files: s.index_files.load(Ordering::Relaxed),
            compress_secs: s.compress_ns.load(Ordering::Relaxed) as f64 / 1e9,
            encrypt_secs: s.encrypt_ns.load(Ordering::Relaxed) as f64 / 1e9,
            upload_secs: s.upload_ns.load(Ordering::Relaxed) as f64 / 1e9,
        })
    }
}

impl Drop for BlobSaver {
    fn drop(&mut self) {
        // Dropped without finish (an error path): stop workers, write nothing more.
        self.shared.failed.store(true, Ordering::SeqCst);
        drop(self.seal_tx.take());
        drop(self.upload_tx.take());
        for h in self
            .seal_threads
            .drain(..)
            .chain(self.upload_threads.drain(..))
        {
            let _ = h.join();
        }
    }
}

/// Final counters of a saver.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct SaverStatsSnapshot {
    /// New blobs stored.
    pub blobs_added: u64,
    /// Plaintext bytes of new blobs.
    pub raw_bytes_added: u64,
    /// Bytes stored after compression and encryption.
    pub stored_bytes_added: u64,
    /// Packs uploaded.
    pub packs: u64,
    /// Packs left unindexed by an interrupted earlier run that this run
    /// found on the destination and indexed instead of uploading again.
    pub packs_recovered: u64,
    /// Index files written.
    pub index_files: u64,
    /// CPU seconds compressing (summed over threads).
    pub compress_secs: f64,
    /// CPU seconds encrypting (summed over threads).
    pub encrypt_secs: f64,
    /// Seconds waiting on backend puts (summed over uploaders).
    pub upload_secs: f64,
}

fn nanos_since(t: std::time::Instant) -> u64 {
    t.elapsed().as_nanos() as u64
}

fn seal_worker(s: &Shared, rx: Receiver<SealJob>, tx: Sender<FinishedPack>) {
    let level = s.repo.config().compression;
    let target = s.repo.config().pack_size as usize;
    let mut zstd = zstd::bulk::Compressor::new(level)
        .ok()
        .filter(|_| level != 0);
    for job in rx {
        if s.failed.load(Ordering::Relaxed) {
            continue; // drain so readers never block on a dead pipeline
        }
        let t0 = std::time::Instant::now();
        let framed = match zstd.as_mut() {
            Some(c) => compress::frame_with(c, &job.data),
            None => compress::frame(&job.data, 0),
        };
        let t1 = std::time::Instant::now();
        s.stats
            .compress_ns
            .fetch_add((t1 - t0).as_nanos() as u64, Ordering::Relaxed);
        let env = match s.repo.key().seal(Aad::Blob(job.t, &job.id), &framed) {
            Ok(e) => e,
            Err(e) => {
                s.fail(e.into());
                continue;
            }
        };
        s.stats
            .encrypt_ns
            .fetch_add(nanos_since(t1), Ordering::Relaxed);
        s.stats.blobs_added.fetch_add(1, Ordering::Relaxed);
        s.stats
            .raw_bytes_added
            .fetch_add(job.data.len() as u64, Ordering::Relaxed);
        s.stats
            .stored_bytes_added
            .fetch_add(env.len() as u64, Ordering::Relaxed);
        let slot = match job.t {
            BlobType::Data => 0,
            BlobType::Tree => 1,
        };
        let finished = {
            let mut p = s.packers[slot].lock().unwrap_or_else(|p| p.into_inner());
            if p.buf.capacity() == 0 {
                if let Some(b) = s.spare.lock().unwrap_or_else(|p| p.into_inner()).pop() {
                    p.buf = b;
                }
            }
            if p.buf.capacity() < target + env.len() {
                // Reserve the whole pack once: growing by doubling would
                // briefly hold twice the pack size.
                let more = target + env.len() - p.buf.len();
                p.buf.reserve_exact(more);
            }
            let offset = p.buf.len() as u32;
            p.buf.extend_from_slice(&env);
            p.entries.push(PackEntry {
                blob_type: job.t,
                id: job.id,
                offset,
                length: env.len() as u32,
                raw_length: job.data.len() as u32,
            });
            if p.buf.len() >= target {
                p.take(&s.repo)
            } else {
                Ok(None)
            }
        };
        match finished {
            Ok(Some(fp)) => {
                if tx.send(fp).is_err() {
                    s.fail(EngineError::Interrupted);
                }
            }
            Ok(None) => {}
            Err(e) => s.fail(e),
        }
    }
}

fn upload_worker(s: &Shared, rx: Receiver<FinishedPack>) {
    for fp in rx {
        if s.failed.load(Ordering::Relaxed) {
            continue;
        }
        let id = ObjectId::of(&fp.bytes);
        let t0 = std::time::Instant::now();
        let t = fp
            .entries
            .first()
            .map(|e| e.blob_type)
            .unwrap_or(BlobType::Data);
        let size = fp.bytes.len() as u64;
        let (r, back) = put_addressed_owned(&**s.repo.backend(), &pack_name(&id, t), fp.bytes);
        s.stats
            .upload_ns
            .fetch_add(nanos_since(t0), Ordering::Relaxed);
        if let Some(mut buf) = back {
            buf.clear();
            let mut spare = s.spare.lock().unwrap_or_else(|p| p.into_inner());
            if spare.len() < SPARE_BUFFERS {
                spare.push(buf);
            }
        }
        if let Err(e) = r {
            s.fail(e);
            continue;
        }
        s.stats.packs.fetch_add(1, Ordering::Relaxed);
        let p = IndexPack {
            id,
            size,
            entries: fp.entries,
        };
        // Journal first: once the pack is in `pending`, another uploader's
        // flush may index it and drop it from the journal.
        if let Some(j) = &s.journal {
            j.landed(&s.repo, &p);
        }
        s.pending
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .packs
            .push(p);
        if let Err(e) = s.flush_index(false) {
            s.fail(e);
        }
    }
}
