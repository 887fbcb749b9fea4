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
//!
//! Packs are written to anonymous temporary files as they fill, not kept in
//! memory: eight uploads of 16 MiB packs would otherwise hold 128 MiB, and
//! a slow destination keeps them all busy. A file whose pack has landed is
//! written over by a later pack, since filling fresh page cache costs far
//! more than writing over cached pages. Streaming destinations (local,
//! SMB, SFTP) read the file with their own bounded window; those that must
//! hold a whole request body (S3) get one of [`PACK_BUFFER_BYTES`]' worth
//! of reusable buffers, so at most that much pack data is in memory at once.

use std::fs::File;
use std::io::{Seek, Write};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;

use capsule_crypto::{Aad, NONCE_LEN, TAG_LEN};
use capsule_format::index::{IndexFile, IndexPack};
use capsule_format::pack::{encode_header, trailer, PackEntry};
use capsule_format::{compress, BlobId, BlobType, ObjectHasher, ObjectId};
use crossbeam_channel::{bounded, Receiver, Sender};

use crate::error::{EngineError, Result};
use crate::index::{save_index_file, MasterIndex};
use crate::journal::Journal;
use crate::rendezvous::{Claim, Rendezvous, CLAIM_MIN};
use crate::repo::{pack_name, put_addressed_file, put_addressed_owned, Repository};
use crate::sorted::IdSet;

/// Packs per index file written during a backup.
pub const INDEX_EVERY: usize = 4;

/// Pack bytes held in memory at once for destinations that must hold a
/// whole request body ([`capsule_backend::Capabilities::buffers_puts`]):
/// two 16 MiB packs. Three were as fast at 10 ms and 5% faster at 30 ms
/// (4 × 128 MiB to MinIO through the proxy: 2.70–2.81 s against
/// 2.88–2.91 s), but held 15 MiB more (peak RSS 134–144 MiB against
/// 117–131). The buffers are reused: a fresh 16 MiB buffer is a fresh
/// mapping, and faulting its pages in and unmapping it again cost about a
/// tenth of the pipeline's CPU in a 10,000-file backup.
pub const PACK_BUFFER_BYTES: u64 = 32 << 20;

struct SealJob {
    t: BlobType,
    id: BlobId,
    /// The blob's length.
    raw_len: usize,
    /// The blob laid out to become its envelope where it lies
    /// ([`SealJob::new`]).
    buf: Vec<u8>,
    /// `buf` holds the blob framed already (compressed or not, as another
    /// repository stored it: [`SealJob::framed`]): it is only sealed.
    framed: bool,
}

/// Where a blob starts in [`SealJob::buf`]: after its envelope's nonce
/// and its framing byte.
const SEAL_AT: usize = NONCE_LEN + 1;

impl SealJob {
    /// Copies `data` into a buffer laid out as its envelope: room for the
    /// nonce and the framing byte before it, and for the tag after it. A
    /// blob stored raw (most bytes of a typical backup: media, archives) is
    /// then framed and encrypted where it lies: one copy from the reader's
    /// window to the pack instead of four, and one chunk-sized buffer per
    /// blob in flight instead of three.
    fn new(t: BlobType, id: BlobId, data: &[u8]) -> Self {
        let mut buf = Vec::with_capacity(SEAL_AT + data.len() + TAG_LEN);
        buf.resize(SEAL_AT, 0);
        buf.extend_from_slice(data);
        SealJob {
            t,
            id,
            raw_len: data.len(),
            buf,
            framed: false,
        }
    }

    /// A blob already framed (its framing byte, then its bytes compressed
    /// or raw), of `raw_len` bytes unframed: what `copy` takes from another
    /// repository's envelope, so it is neither decompressed nor compressed
    /// again.
    fn framed(t: BlobType, id: BlobId, framed: &[u8], raw_len: usize) -> Self {
        let mut buf = Vec::with_capacity(NONCE_LEN + framed.len() + TAG_LEN);
        buf.resize(NONCE_LEN, 0);
        buf.extend_from_slice(framed);
        SealJob {
            t,
            id,
            raw_len,
            buf,
            framed: true,
        }
    }
}

/// A pack's bytes in an anonymous temporary file (gone when closed, or
/// when the process dies), named as they are written.
struct Spill {
    file: File,
    dir: PathBuf,
    len: u64,
    hash: ObjectHasher,
}

impl Spill {
    /// A spill file: one an upload gave back when there is one, else a new
    /// one.
    fn create(dir: &std::path::Path, reuse: Option<File>) -> Result<Self> {
        let file = match reuse {
            Some(mut f) => f.seek(std::io::SeekFrom::Start(0)).map(|_| f),
            None => tempfile::tempfile_in(dir),
        }
        .map_err(|e| {
            EngineError::io(
                "creating a temporary pack file (set TMPDIR to a directory with room) in",
                dir,
                e,
            )
        })?;
        Ok(Spill {
            file,
            dir: dir.to_path_buf(),
            len: 0,
            hash: ObjectHasher::default(),
        })
    }

    fn append(&mut self, bytes: &[u8]) -> Result<()> {
        self.file.write_all(bytes).map_err(|e| {
            EngineError::io(
                "writing a temporary pack file (set TMPDIR to a directory with room) in",
                &self.dir,
                e,
            )
        })?;
        self.hash.update(bytes);
        self.len += bytes.len() as u64;
        Ok(())
    }
}

struct FinishedPack {
    file: File,
    size: u64,
    id: ObjectId,
    entries: Vec<PackEntry>,
}

#[derive(Default)]
struct PackBuilder {
    spill: Option<Spill>,
    entries: Vec<PackEntry>,
}

impl PackBuilder {
    fn take(&mut self, repo: &Repository) -> Result<Option<FinishedPack>> {
        let Some(mut spill) = self.spill.take().filter(|_| !self.entries.is_empty()) else {
            return Ok(None);
        };
        let entries = std::mem::take(&mut self.entries);
        let header = repo.key().seal(Aad::PackHeader, &encode_header(&entries))?;
        spill.append(&header)?;
        spill.append(&trailer(header.len() as u32))?;
        // A reused file may be longer than this pack: cut what an earlier
        // one left beyond it, so the file is the pack and nothing more.
        spill.file.set_len(spill.len).map_err(|e| {
            EngineError::io(
                "writing a temporary pack file (set TMPDIR to a directory with room) in",
                &spill.dir,
                e,
            )
        })?;
        Ok(Some(FinishedPack {
            id: spill.hash.finish(),
            size: spill.len,
            file: spill.file,
            entries,
        }))
    }
}

/// Reusable pack buffers for destinations that buffer their puts; taking
/// one waits until an upload gives one back, which bounds the pack bytes
/// in memory.
struct BufferPool {
    free: Mutex<Vec<Vec<u8>>>,
    returned: Condvar,
}

impl BufferPool {
    fn new(buffers: usize) -> Self {
        BufferPool {
            free: Mutex::new((0..buffers).map(|_| Vec::new()).collect()),
            returned: Condvar::new(),
        }
    }

    fn take(&self) -> Vec<u8> {
        let mut free = self.free.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            if let Some(b) = free.pop() {
                return b;
            }
            free = self.returned.wait(free).unwrap_or_else(|p| p.into_inner());
        }
    }

    /// Gives a buffer back; an empty one when the destination kept it, so
    /// that the number of uploads allowed stays the same.
    fn give(&self, mut buf: Vec<u8>) {
        buf.clear();
        self.free
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(buf);
        self.returned.notify_one();
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
    claimed: Mutex<IdSet>,
    packers: [Mutex<PackBuilder>; 2],
    pending: Mutex<IndexFile>,
    journal: Option<Journal>,
    spill_dir: PathBuf,
    /// Spill files uploads gave back, to be written over. Writing into the
    /// page cache a fresh file takes costs a page allocation per 4 KiB, and
    /// writing over pages already cached does not: a fifth of a backup's
    /// CPU (4 × 128 MiB to SMB at 10 ms) went to filling fresh spill files.
    /// The price is that the files stay until the backup ends (one per
    /// pack in flight, 11 × 16 MiB at most with eight uploads) and that
    /// their pages, never older than a pack's upload when files were new,
    /// may now be written back to the disk under TMPDIR.
    spills: Mutex<Vec<File>>,
    /// `Some` when the destination buffers its puts.
    buffers: Option<BufferPool>,
    error: Mutex<Option<EngineError>>,
    failed: AtomicBool,
    stats: SaverStats,
    /// Object names and sizes of the packs this saver indexed.
    indexed: Mutex<Vec<(String, u64)>>,
    /// A dry run: blobs are compressed and sealed, to count what a backup
    /// would send, and then dropped; nothing is written anywhere.
    dry_run: bool,
    /// A first backup's rendezvous with the other machines writing.
    rendezvous: Option<Arc<Rendezvous>>,
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
        const INDEX_ENTRIES: usize = 256 * 1024;
        let f = {
            let mut p = self.pending.lock().unwrap_or_else(|p| p.into_inner());
            let entries: usize = p.packs.iter().map(|p| p.entries.len()).sum();
            // Packs of tiny files hold hundreds of thousands of blobs: an
            // index file stays small enough for every reader to take in
            // whole (each machine reads it once, into its index tables).
            let full = p.packs.len() >= INDEX_EVERY || entries >= INDEX_ENTRIES;
            if p.packs.is_empty() || (!force && !full) {
                return Ok(());
            }
            std::mem::take(&mut *p)
        };
        let written = save_index_file(&*self.repo, &f)?;
        if let Some(r) = &self.rendezvous {
            r.wrote_index(written);
        }
        self.stats.index_files.fetch_add(1, Ordering::Relaxed);
        self.indexed
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .extend(f.packs.iter().map(|p| {
                let t = p.entries.first().map_or(BlobType::Data, |e| e.blob_type);
                (crate::repo::pack_name(&p.id, t), p.size)
            }));
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
    claim_tx: Option<Sender<Sealed>>,
    seal_threads: Vec<JoinHandle<()>>,
    claim_threads: Vec<JoinHandle<()>>,
    upload_threads: Vec<JoinHandle<()>>,
}

/// A sealed data blob on its way to be claimed (see [`crate::rendezvous`]).
struct Sealed {
    t: BlobType,
    id: BlobId,
    env: Vec<u8>,
    raw_len: usize,
}

impl BlobSaver {
    /// Starts seal and upload workers.
    pub fn start(repo: Arc<Repository>, index: Arc<MasterIndex>, threads: usize) -> Self {
        Self::start_with(repo, index, threads, None, None)
    }

    /// Like [`BlobSaver::start`], keeping a [`Journal`] of packs landed but
    /// not yet indexed at `journal.0`. `journal.1` are packs recovered from
    /// an earlier run's journal (already in `index`): they are listed in this
    /// run's first index file. With a `rendezvous` (a first backup), large
    /// data blobs are claimed before they are packed, and blobs other
    /// machines index meanwhile are not sent again.
    pub fn start_with(
        repo: Arc<Repository>,
        index: Arc<MasterIndex>,
        threads: usize,
        journal: Option<(std::path::PathBuf, Vec<IndexPack>)>,
        rendezvous: Option<Arc<Rendezvous>>,
    ) -> Self {
        Self::start_full(repo, index, threads, journal, false, rendezvous)
    }

    /// A saver that counts what it would store, and stores nothing
    /// (`backup --dry-run`).
    pub fn start_dry(repo: Arc<Repository>, index: Arc<MasterIndex>, threads: usize) -> Self {
        Self::start_full(repo, index, threads, None, true, None)
    }

    fn start_full(
        repo: Arc<Repository>,
        index: Arc<MasterIndex>,
        threads: usize,
        journal: Option<(std::path::PathBuf, Vec<IndexPack>)>,
        dry_run: bool,
        rendezvous: Option<Arc<Rendezvous>>,
    ) -> Self {
        let caps = repo.backend().capabilities();
        let uploads = caps.concurrency.max(1);
        let buffers = caps.buffers_puts.then(|| {
            let pack = u64::from(repo.config().pack_size).max(1);
            BufferPool::new((PACK_BUFFER_BYTES / pack).max(1) as usize)
        });
        let (seal_tx, seal_rx) = bounded::<SealJob>(threads * 2);
        // Packs in temporary files at most: one filling per type, one
        // queued, one per uploader.
        let (upload_tx, upload_rx) = bounded::<FinishedPack>(1);
        let stats = SaverStats::default();
        let mut pending = IndexFile::default();
        let journal = journal.map(|(path, recovered)| {
            stats
                .packs_recovered
                .store(recovered.len() as u64, Ordering::Relaxed);
            let j = Journal::new(&repo, path, &recovered);
            pending.packs = recovered;
            j
        });
        let shared = Arc::new(Shared {
            repo,
            index,
            claimed: Mutex::new(IdSet::default()),
            packers: [Mutex::default(), Mutex::default()],
            pending: Mutex::new(pending),
            journal,
            spill_dir: std::env::temp_dir(),
            spills: Mutex::new(Vec::new()),
            buffers,
            error: Mutex::new(None),
            failed: AtomicBool::new(false),
            indexed: Mutex::new(Vec::new()),
            stats,
            dry_run,
            rendezvous,
        });
        // Claims are round trips: several in flight, as uploads are.
        let (claim_tx, claim_rx) = bounded::<Sealed>(uploads * 2);
        let claim_threads = if shared.rendezvous.is_some() {
            (0..uploads.clamp(2, 8))
                .map(|i| {
                    let s = shared.clone();
                    let rx = claim_rx.clone();
                    let tx = upload_tx.clone();
                    std::thread::Builder::new()
                        .name(format!("claim-{i}"))
                        .spawn(move || claim_worker(&s, rx, tx))
                        .expect("spawn claim worker")
                })
                .collect()
        } else {
            Vec::new()
        };
        let claim_tx = shared.rendezvous.is_some().then_some(claim_tx);
        let seal_threads = (0..threads)
            .map(|i| {
                let s = shared.clone();
                let rx = seal_rx.clone();
                let tx = upload_tx.clone();
                let claims = claim_tx.clone();
                std::thread::Builder::new()
                    .name(format!("seal-{i}"))
                    .spawn(move || seal_worker(&s, rx, tx, claims))
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
            claim_tx,
            seal_threads,
            claim_threads,
            upload_threads,
        }
    }

    /// Stores a blob unless the repository or this run already has it.
    /// Returns whether it was new. Fails once the pipeline has failed, so
    /// that a repository write error stops the backup instead of being
    /// mistaken for a per-file problem.
    pub fn save(&self, t: BlobType, id: BlobId, data: &[u8]) -> Result<bool> {
        // Copied only now: a blob already stored costs no copy at all.
        self.submit(id, || SealJob::new(t, id, data))
    }

    /// [`BlobSaver::save`] for a blob already framed by another repository
    /// (see [`Repository::open_framed`]), of `raw_len` bytes unframed: it
    /// is sealed under this repository's key as it is.
    pub fn save_framed(
        &self,
        t: BlobType,
        id: BlobId,
        framed: &[u8],
        raw_len: usize,
    ) -> Result<bool> {
        self.submit(id, || SealJob::framed(t, id, framed, raw_len))
    }

    /// Claims `id` and hands the job `make` builds to the sealers, unless
    /// the repository or this run has the blob already.
    fn submit(&self, id: BlobId, make: impl FnOnce() -> SealJob) -> Result<bool> {
        if self.shared.failed.load(Ordering::Relaxed) {
            return Err(self.failure());
        }
        if self.shared.index.contains(&id) || self.learned(&id) {
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
        if tx.send(make()).is_err() {
            return Err(self.failure());
        }
        Ok(true)
    }

    /// Whether another machine indexed the blob during this run.
    fn learned(&self, id: &BlobId) -> bool {
        self.shared.rendezvous.as_ref().is_some_and(|r| r.knows(id))
    }

    /// Whether the blob is stored or being stored.
    pub fn has(&self, id: &BlobId) -> bool {
        self.shared.index.contains(id)
            || self.learned(id)
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
        drop(self.claim_tx.take());
        for h in self.claim_threads.drain(..) {
            let _ = h.join();
        }
        crate::pause::test_pause("saver-finish");
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
        let mut packs_indexed = Vec::new();
        if let Some(r) = &self.shared.rendezvous {
            self.settle(r)?;
            packs_indexed = r.packs_used();
        }
        packs_indexed.extend(std::mem::take(
            &mut *self
                .shared
                .indexed
                .lock()
                .unwrap_or_else(|p| p.into_inner()),
        ));
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
            packs_indexed,
        })
    }

    /// Once this run's own packs are indexed: the blobs other machines
    /// claimed are either indexed by them by now or uploaded here, and
    /// indexed, before the snapshot may refer to them.
    fn settle(&self, r: &Rendezvous) -> Result<()> {
        let s = &*self.shared;
        let target = s.repo.config().pack_size as usize;
        let (blobs, raw, stored) = r.settle(|t, id, env, raw_len| {
            if let Some(fp) = pack_blob(s, t, id, env, raw_len, target)? {
                land(s, fp)?;
            }
            Ok(())
        })?;
        let last = s.packers[0]
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take(&s.repo)?;
        if let Some(fp) = last {
            land(s, fp)?;
        }
        s.flush_index(true)?;
        uncount(s, blobs, raw, stored);
        Ok(())
    }
}

impl Drop for BlobSaver {
    fn drop(&mut self) {
        // Dropped without finish (an error path): stop workers, write nothing more.
        self.shared.failed.store(true, Ordering::SeqCst);
        drop(self.seal_tx.take());
        drop(self.claim_tx.take());
        drop(self.upload_tx.take());
        for h in self
            .seal_threads
            .drain(..)
            .chain(self.claim_threads.drain(..))
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
    /// Names and sizes of the packs indexed (what a snapshot of this run
    /// may refer to besides what was indexed before).
    #[serde(skip)]
    pub packs_indexed: Vec<(String, u64)>,
}

fn nanos_since(t: std::time::Instant) -> u64 {
    t.elapsed().as_nanos() as u64
}

fn seal_worker(
    s: &Shared,
    rx: Receiver<SealJob>,
    tx: Sender<FinishedPack>,
    claims: Option<Sender<Sealed>>,
) {
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
        let mut env = if job.framed {
            job.buf
        } else {
            compress::frame_in_place(zstd.as_mut(), job.buf, SEAL_AT - 1, TAG_LEN)
        };
        let t1 = std::time::Instant::now();
        s.stats
            .compress_ns
            .fetch_add((t1 - t0).as_nanos() as u64, Ordering::Relaxed);
        if let Err(e) = s
            .repo
            .key()
            .seal_in_place(Aad::Blob(job.t, &job.id), &mut env)
        {
            s.fail(e.into());
            continue;
        }
        s.stats
            .encrypt_ns
            .fetch_add(nanos_since(t1), Ordering::Relaxed);
        s.stats.blobs_added.fetch_add(1, Ordering::Relaxed);
        s.stats
            .raw_bytes_added
            .fetch_add(job.raw_len as u64, Ordering::Relaxed);
        s.stats
            .stored_bytes_added
            .fetch_add(env.len() as u64, Ordering::Relaxed);
        if s.dry_run {
            continue;
        }
        if let Some(c) = claims.as_ref().filter(|_| {
            job.t == BlobType::Data
                && job.raw_len >= CLAIM_MIN
                && s.rendezvous.as_ref().is_some_and(|r| r.active())
        }) {
            let sealed = Sealed {
                t: job.t,
                id: job.id,
                env,
                raw_len: job.raw_len,
            };
            if c.send(sealed).is_err() {
                s.fail(EngineError::Interrupted);
            }
            continue;
        }
        hand_on(
            s,
            &tx,
            pack_blob(s, job.t, job.id, &env, job.raw_len, target),
        );
    }
}

/// Adds a sealed blob to the pack of its type being filled; returns the
/// pack once it is full.
fn pack_blob(
    s: &Shared,
    t: BlobType,
    id: BlobId,
    env: &[u8],
    raw_len: usize,
    target: usize,
) -> Result<Option<FinishedPack>> {
    let slot = match t {
        BlobType::Data => 0,
        BlobType::Tree => 1,
    };
    let mut p = s.packers[slot].lock().unwrap_or_else(|p| p.into_inner());
    append_blob(s, &mut p, t, id, env, raw_len, target)
}

/// Passes a pack that filled to the uploaders; a failure stops the pipeline.
fn hand_on(s: &Shared, tx: &Sender<FinishedPack>, packed: Result<Option<FinishedPack>>) {
    match packed {
        Ok(Some(fp)) => {
            if tx.send(fp).is_err() {
                s.fail(EngineError::Interrupted);
            }
        }
        Ok(None) => {}
        Err(e) => s.fail(e),
    }
}

/// Takes back what the seal workers counted for blobs another machine
/// stored instead.
fn uncount(s: &Shared, blobs: u64, raw: u64, stored: u64) {
    s.stats.blobs_added.fetch_sub(blobs, Ordering::Relaxed);
    s.stats.raw_bytes_added.fetch_sub(raw, Ordering::Relaxed);
    s.stats
        .stored_bytes_added
        .fetch_sub(stored, Ordering::Relaxed);
}

/// Blobs a pack holds at most, whatever its size. A pack of tiny files
/// reaches the target size only at about 260,000 blobs, and every copy of
/// its entries (the builder's list, the sealed header, the index file it
/// goes into, the finished pack waiting for its upload) was then 12 MB:
/// together a quarter of the peak of an initial backup of a million tiny
/// files. At 65,536 such a pack is about 4 MB, still one request per
/// 65,536 files.
pub const PACK_BLOBS: usize = 65_536;

/// Adds a sealed blob to the pack being filled; returns the pack once it
/// reaches `target` bytes or [`PACK_BLOBS`] blobs.
fn append_blob(
    s: &Shared,
    p: &mut PackBuilder,
    t: BlobType,
    id: BlobId,
    env: &[u8],
    raw_len: usize,
    target: usize,
) -> Result<Option<FinishedPack>> {
    let spill = match &mut p.spill {
        Some(sp) => sp,
        None => {
            let reuse = s.spills.lock().unwrap_or_else(|p| p.into_inner()).pop();
            p.spill.insert(Spill::create(&s.spill_dir, reuse)?)
        }
    };
    let offset = spill.len as u32;
    spill.append(env)?;
    p.entries.push(PackEntry {
        blob_type: t,
        id,
        offset,
        length: env.len() as u32,
        raw_length: raw_len as u32,
    });
    let full = spill.len >= target as u64 || p.entries.len() >= PACK_BLOBS;
    if full {
        p.take(&s.repo)
    } else {
        Ok(None)
    }
}

/// Puts one finished pack: the file itself to a streaming destination, a
/// pooled buffer holding it to one that buffers.
fn upload_pack(s: &Shared, name: &str, fp: &FinishedPack) -> Result<()> {
    let backend = &**s.repo.backend();
    let Some(pool) = &s.buffers else {
        return put_addressed_file(backend, name, &fp.file, fp.size);
    };
    let mut buf = pool.take();
    let mut reader = capsule_backend::ReadAt::new(&fp.file);
    if let Err(e) = capsule_backend::read_exact_len(&mut reader, fp.size, &mut buf, name) {
        pool.give(buf);
        return Err(EngineError::io(
            "reading a temporary pack file in",
            &s.spill_dir,
            std::io::Error::other(e.message),
        ));
    }
    let (r, back) = put_addressed_owned(backend, name, buf);
    pool.give(back.unwrap_or_default());
    r
}

/// Claims each sealed blob: packs those this run won, keeps aside those
/// another machine claimed first.
fn claim_worker(s: &Shared, rx: Receiver<Sealed>, tx: Sender<FinishedPack>) {
    let Some(r) = s.rendezvous.as_ref() else {
        return;
    };
    let target = s.repo.config().pack_size as usize;
    for b in rx {
        if s.failed.load(Ordering::Relaxed) {
            continue;
        }
        if r.knows(&b.id) {
            // Another machine indexed it since it was read.
            uncount(s, 1, b.raw_len as u64, b.env.len() as u64);
            continue;
        }
        let done = match r.claim(&b.id) {
            Claim::Lost(winner) => r.defer(b.t, b.id, &b.env, b.raw_len, winner).map(|_| None),
            Claim::Won => pack_blob(s, b.t, b.id, &b.env, b.raw_len, target),
        };
        hand_on(s, &tx, done);
    }
}

fn upload_worker(s: &Shared, rx: Receiver<FinishedPack>) {
    for fp in rx {
        if s.failed.load(Ordering::Relaxed) {
            continue;
        }
        if let Err(e) = land(s, fp) {
            s.fail(e);
        }
    }
}

/// Uploads a finished pack, journals it and queues it for the index.
fn land(s: &Shared, fp: FinishedPack) -> Result<()> {
    let id = fp.id;
    let t0 = std::time::Instant::now();
    let t = fp
        .entries
        .first()
        .map(|e| e.blob_type)
        .unwrap_or(BlobType::Data);
    let size = fp.size;
    let r = upload_pack(s, &pack_name(&id, t), &fp);
    if r.is_ok() {
        s.spills
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(fp.file);
    }
    s.stats
        .upload_ns
        .fetch_add(nanos_since(t0), Ordering::Relaxed);
    r?;
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
    s.flush_index(false)
}
