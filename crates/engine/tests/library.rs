//! Engine tests on the library API over an in-memory destination, with the
//! request accounting the CLI uses: what restore asks of the destination
//! (pack grouping, shared blobs, partial restores) and what `check` and
//! `repair index` find, counted rather than timed.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use capsule_backend::testing::MemoryBackend;
use capsule_backend::{Backend, LabBackend, MeteredBackend, RequestStats};
use capsule_crypto::KdfParams;
use capsule_engine::backup::{backup, BackupOptions};
use capsule_engine::index::MasterIndex;
use capsule_engine::progress::Progress;
use capsule_engine::repo::InitOptions;
use capsule_engine::restore::{restore, RestoreOptions, RestoreReport};
use capsule_engine::Repository;
use capsule_format::{BlobId, BlobType};

const PW: &[u8] = b"library";

use capsule_testkit::noise;

/// A repository in memory with small chunks and packs, opened through the
/// request accounting.
struct Lab {
    _dir: tempfile::TempDir,
    src: std::path::PathBuf,
    scratch: std::path::PathBuf,
    store: Arc<MemoryBackend>,
}

impl Lab {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(MemoryBackend::new());
        let opts = InitOptions {
            kdf: KdfParams {
                m_cost: 64,
                t_cost: 1,
                p_cost: 1,
            },
            chunks: capsule_chunker::ChunkSizes {
                min: 8 << 10,
                avg: 32 << 10,
                max: 128 << 10,
            },
            pack_size: 256 << 10,
            compression: 1,
        };
        Repository::init(store.clone(), PW, &opts).unwrap();
        let src = dir.path().join("src");
        let scratch = dir.path().join("scratch");
        std::fs::create_dir_all(&src).unwrap();
        Lab {
            src,
            scratch,
            store,
            _dir: dir,
        }
    }

    /// The repository, opened over fresh counters.
    fn open(&self) -> (Repository, Arc<RequestStats>) {
        let inner: Arc<dyn LabBackend> = self.store.clone();
        let m = MeteredBackend::new(inner);
        let stats = m.stats();
        (Repository::open(Arc::new(m), PW).unwrap(), stats)
    }

    fn backup(&self) -> String {
        let (repo, _) = self.open();
        let opts = BackupOptions {
            paths: vec![self.src.clone()],
            threads: 2,
            ..Default::default()
        };
        backup(Arc::new(repo), &opts, &Arc::new(Progress::default()))
            .unwrap()
            .snapshot_id
    }

    /// Restores `latest` (with `includes`) into a fresh directory; returns
    /// the report, the requests the restore made and the index.
    fn restore(&self, includes: &[&str]) -> (RestoreReport, u64, MasterIndex, std::path::PathBuf) {
        let (repo, stats) = self.open();
        let (_, snap) = repo.resolve_snapshot("latest").unwrap();
        let (index, _) = repo.load_index().unwrap();
        let root: BlobId = snap.tree.parse().unwrap();
        let target = self.scratch.join(format!("t{}", includes.len()));
        let _ = std::fs::remove_dir_all(&target);
        let before = stats.gets.load(Relaxed);
        let opts = RestoreOptions {
            target: target.clone(),
            includes: includes.iter().map(|s| s.to_string()).collect(),
            max_entries: capsule_engine::treewalk::entry_budget(&snap),
            ..Default::default()
        };
        let r = restore(&repo, &index, &root, &opts, &Progress::default()).unwrap();
        assert!(r.errors.is_empty(), "{:?}", r.errors);
        (r, stats.gets.load(Relaxed) - before, index, target)
    }

    fn restored(&self, target: &Path, rel: &str) -> Vec<u8> {
        std::fs::read(target.join(self.src.strip_prefix("/").unwrap()).join(rel)).unwrap()
    }

    /// The snapshot's content blobs of `rels` (paths below the source).
    fn blobs_of(&self, index: &MasterIndex, rels: &[&str]) -> Vec<BlobId> {
        let (repo, _) = self.open();
        let (_, snap) = repo.resolve_snapshot("latest").unwrap();
        let mut out = Vec::new();
        for rel in rels {
            let full = self.src.join(rel);
            let mut tree: BlobId = snap.tree.parse().unwrap();
            let parts: Vec<_> = full.iter().skip(1).collect();
            for (i, part) in parts.iter().enumerate() {
                let nodes = repo.load_tree(index, &tree).unwrap();
                let n = nodes
                    .iter()
                    .find(|n| n.name == part.as_encoded_bytes())
                    .unwrap_or_else(|| panic!("{part:?} not in the snapshot"));
                if i + 1 == parts.len() {
                    out.extend(n.content.iter().copied());
                } else {
                    tree = n.subtree.unwrap();
                }
            }
        }
        out
    }

    /// The packs holding the content of `rels`.
    fn packs_of(&self, index: &MasterIndex, rels: &[&str]) -> BTreeSet<u32> {
        self.blobs_of(index, rels)
            .iter()
            .map(|id| {
                let loc = index.get(id).expect("every blob is indexed");
                assert_eq!(loc.blob_type, BlobType::Data);
                loc.pack
            })
            .collect()
    }
}

/// A file read in look-ahead windows is cut exactly where the chunker cuts
/// it whole: the window's size (1.5 × the largest chunk) must never move a
/// boundary, or deduplication against earlier backups would break. The
/// file spans dozens of refills of the window, and its length is no
/// multiple of anything.
#[test]
fn a_streamed_file_is_cut_where_the_whole_file_is() {
    let lab = Lab::new();
    let data = noise(3_000_017, 77);
    std::fs::write(lab.src.join("big"), &data).unwrap();
    lab.backup();
    let (repo, _) = lab.open();
    let (index, _) = repo.load_index().unwrap();
    let mut whole = Vec::new();
    let mut rest = &data[..];
    for n in repo.chunker().cut_file(&data) {
        whole.push(repo.key().blob_id(&rest[..n]));
        rest = &rest[n..];
    }
    assert!(whole.len() > 40, "{} chunks", whole.len());
    assert_eq!(lab.blobs_of(&index, &["big"]), whole);
}

/// Three files sharing content (a copy, and a file made of the first's
/// first half twice) restore with each distinct blob read once, in one
/// ranged read per pack, and nothing fetched that was not needed.
#[test]
fn restore_reads_each_shared_blob_once_and_each_pack_in_one_request() {
    let lab = Lab::new();
    let a = noise(900_000, 1);
    std::fs::write(lab.src.join("a"), &a).unwrap();
    std::fs::write(lab.src.join("copy-of-a"), &a).unwrap();
    let mut twice = a[..450_000].to_vec();
    twice.extend_from_slice(&a[..450_000]);
    std::fs::write(lab.src.join("half-twice"), &twice).unwrap();
    lab.backup();

    let (r, gets, index, target) = lab.restore(&[]);
    assert_eq!(lab.restored(&target, "a"), a);
    assert_eq!(lab.restored(&target, "copy-of-a"), a);
    assert_eq!(lab.restored(&target, "half-twice"), twice);
    let f = &r.fetch;
    let packs = lab.packs_of(&index, &["a", "copy-of-a", "half-twice"]);
    assert_eq!(f.packs, packs.len() as u64, "{f:?}");
    // Every blob of a pack is needed, so each pack is one read.
    assert_eq!(f.requests, f.packs, "{f:?}");
    assert_eq!(f.bytes_fetched, f.bytes_needed, "{f:?}");
    // Each distinct blob once: the copy and the repeated half add none.
    let all = lab.blobs_of(&index, &["a", "copy-of-a", "half-twice"]);
    let distinct: BTreeSet<BlobId> = all.iter().copied().collect();
    assert!(distinct.len() < all.len(), "the files share blobs");
    assert_eq!(f.blobs, distinct.len() as u64, "{f:?}");
    // The destination saw the data reads, the tree reads and the opening
    // reads (config, key, snapshot, index): nothing per file.
    assert!(
        gets <= f.requests + f.tree_requests + 8,
        "{gets} gets for {f:?}"
    );
}

/// The trees of a deep directory, written by one backup into one small
/// pack, are read in one request, not one per directory level: each level
/// used to ask the same pack again.
#[test]
fn a_small_tree_pack_is_read_once_however_deep_the_tree() {
    let lab = Lab::new();
    let mut dir = lab.src.clone();
    let mut files = Vec::new();
    for level in 0..10u8 {
        dir = dir.join(format!("level{level}"));
        std::fs::create_dir(&dir).unwrap();
        let data = noise(5_000, u64::from(level));
        std::fs::write(dir.join("f"), &data).unwrap();
        files.push((dir.strip_prefix(&lab.src).unwrap().join("f"), data));
    }
    lab.backup();
    let (r, _, index, target) = lab.restore(&[]);
    for (rel, data) in &files {
        assert_eq!(lab.restored(&target, rel.to_str().unwrap()), *data);
    }
    let tree_packs = index
        .packs()
        .iter()
        .filter(|p| p.blob_type == BlobType::Tree)
        .count() as u64;
    assert!(tree_packs >= 1);
    assert_eq!(r.fetch.tree_requests, tree_packs, "{:?}", r.fetch);
}

/// A restore in batches of a few files: files sharing content across
/// batches, and packs holding blobs of several batches, restore byte for
/// byte, and each pack counts once in the report.
#[test]
fn a_restore_in_small_batches_writes_every_file_and_counts_each_pack_once() {
    let lab = Lab::new();
    let mut expect = Vec::new();
    for i in 0..23u64 {
        // Every third file repeats an earlier one, often in another batch.
        let data = noise(
            20_000 + 3_000 * i as usize,
            if i % 3 == 2 { i - 2 } else { i },
        );
        std::fs::write(lab.src.join(format!("f{i:02}")), &data).unwrap();
        expect.push((format!("f{i:02}"), data));
    }
    lab.backup();
    let (whole, _, index, _) = lab.restore(&[]);

    let (repo, _) = lab.open();
    let (_, snap) = repo.resolve_snapshot("latest").unwrap();
    let root: BlobId = snap.tree.parse().unwrap();
    let target = lab.scratch.join("batched");
    let opts = RestoreOptions {
        target: target.clone(),
        max_entries: capsule_engine::treewalk::entry_budget(&snap),
        files_per_batch: 4,
        ..Default::default()
    };
    let r = restore(&repo, &index, &root, &opts, &Progress::default()).unwrap();
    assert!(r.errors.is_empty(), "{:?}", r.errors);
    assert_eq!(r.files, expect.len() as u64);
    for (name, data) in &expect {
        assert_eq!(&lab.restored(&target, name), data, "{name}");
    }
    let names: Vec<&str> = expect.iter().map(|(n, _)| n.as_str()).collect();
    let packs = lab.packs_of(&index, &names);
    assert_eq!(r.fetch.packs, packs.len() as u64, "{:?}", r.fetch);
    assert_eq!(r.fetch.packs, whole.fetch.packs);
    // More requests than in one batch (a pack is read once per batch that
    // needs it), never fewer bytes than needed.
    assert!(r.fetch.requests >= whole.fetch.requests, "{:?}", r.fetch);
    assert!(r.fetch.bytes_fetched >= r.fetch.bytes_needed);
}

/// Batches follow the packs: a folder whose files' contents were first
/// stored in another order (here by a folder backed up before it, in a
/// stride permutation) restores in small batches without reading more
/// than one batch does. In tree order, each batch of `b` named blobs a
/// seventh of the pack apart, and its reads spanned the blobs between.
#[test]
fn batches_read_no_more_than_one_restore_when_tree_and_pack_order_differ() {
    let lab = Lab::new();
    for d in ["a", "b"] {
        std::fs::create_dir_all(lab.src.join(d)).unwrap();
    }
    let n = 42u64;
    for i in 0..n {
        std::fs::write(lab.src.join(format!("a/{i:02}")), noise(6_000, 1000 + i)).unwrap();
    }
    lab.backup();
    for i in 0..n {
        let from = (i * 11) % n;
        std::fs::write(lab.src.join(format!("b/{i:02}")), noise(6_000, 1000 + from)).unwrap();
    }
    lab.backup();
    let pattern = format!("{}/b/**", lab.src.display());
    let (whole, _, index, _) = lab.restore(&[&pattern]);

    let (repo, _) = lab.open();
    let (_, snap) = repo.resolve_snapshot("latest").unwrap();
    let root: BlobId = snap.tree.parse().unwrap();
    let target = lab.scratch.join("batched");
    let opts = RestoreOptions {
        target: target.clone(),
        includes: vec![pattern],
        max_entries: capsule_engine::treewalk::entry_budget(&snap),
        files_per_batch: 6,
        ..Default::default()
    };
    let r = restore(&repo, &index, &root, &opts, &Progress::default()).unwrap();
    assert!(r.errors.is_empty(), "{:?}", r.errors);
    assert_eq!(r.files, n);
    for i in 0..n {
        let got = lab.restored(&target, &format!("b/{i:02}"));
        assert_eq!(got, noise(6_000, 1000 + (i * 11) % n), "b/{i:02}");
    }
    assert_eq!(
        whole.fetch.bytes_fetched, whole.fetch.bytes_needed,
        "{:?}",
        whole.fetch
    );
    assert_eq!(r.fetch.bytes_fetched, r.fetch.bytes_needed, "{:?}", r.fetch);
    assert!(
        r.fetch.requests <= whole.fetch.requests + n / 6,
        "{:?}",
        r.fetch
    );
}

/// A restore of one folder reads only the packs holding its files.
#[test]
fn partial_restore_reads_only_the_packs_it_needs() {
    let lab = Lab::new();
    for d in ["wanted", "other"] {
        std::fs::create_dir_all(lab.src.join(d)).unwrap();
    }
    for i in 0..4u64 {
        std::fs::write(lab.src.join(format!("other/f{i}")), noise(400_000, 50 + i)).unwrap();
    }
    std::fs::write(lab.src.join("wanted/w"), noise(300_000, 99)).unwrap();
    lab.backup();
    let (_, _, index, _) = lab.restore(&[]);
    let pattern = format!("{}/wanted/**", lab.src.display());
    let (r, _, _, target) = lab.restore(&[&pattern]);
    assert_eq!(lab.restored(&target, "wanted/w"), noise(300_000, 99));
    assert!(!target
        .join(lab.src.strip_prefix("/").unwrap())
        .join("other/f0")
        .exists());
    let need = lab.packs_of(&index, &["wanted/w"]);
    let f = &r.fetch;
    assert_eq!(f.packs, need.len() as u64, "{f:?}");
    assert!(f.packs < f.packs_in_repository, "{f:?}");
    assert!(f.bytes_fetched < 2 * f.bytes_needed, "{f:?}");
}

/// `check` over the library API finds a lost pack and names the file it
/// held; `repair index` rebuilds a lost index file from the pack headers
/// and the restore is whole again.
#[test]
fn check_names_a_lost_pack_and_repair_index_rebuilds_a_lost_index() {
    let lab = Lab::new();
    std::fs::write(lab.src.join("kept"), noise(200_000, 7)).unwrap();
    lab.backup();
    let (repo, _) = lab.open();
    let index_files = repo.backend().list("index/").unwrap();
    assert!(!index_files.is_empty());
    for f in &index_files {
        lab.store.delete(&f.name).unwrap();
    }
    let report = capsule_engine::repair::repair_index(&repo, false).unwrap();
    assert!(report.index_file.is_some(), "{report:?}");
    let (repo, _) = lab.open();
    let r = capsule_engine::check::check(&repo, true, &Progress::default()).unwrap();
    assert!(r.ok(), "{:?}", r.problems);
    let (_, _, _, target) = lab.restore(&[]);
    assert_eq!(lab.restored(&target, "kept"), noise(200_000, 7));

    let data = repo.backend().list("data/").unwrap();
    lab.store.delete(&data[0].name).unwrap();
    let r = capsule_engine::check::check(&repo, false, &Progress::default()).unwrap();
    assert!(!r.ok());
    let text = format!("{:?}", r);
    assert!(text.contains("kept"), "check names the file: {text}");
}

/// A destination that refuses index files: every pack lands, no index
/// does, as when a run dies between its packs and its first index.
#[derive(Debug)]
struct NoIndexFiles(Arc<dyn LabBackend>);

impl capsule_backend::Layer for NoIndexFiles {
    fn inner(&self) -> &dyn LabBackend {
        &*self.0
    }
    fn put(&self, name: &str, data: &[u8]) -> Result<(), capsule_backend::BackendError> {
        if name.starts_with("index/") {
            return Err(capsule_backend::BackendError::new(
                capsule_backend::ErrorKind::Unreachable,
                "put",
                name,
                "refused for the test",
            ));
        }
        self.0.put(name, data)
    }
}

/// The journal over the library API: packs that landed before a run
/// failed to write any index are found by the next run through the local
/// journal, indexed instead of uploaded again, and the snapshot restores.
#[test]
fn the_journal_lets_the_next_run_index_packs_a_failed_run_landed() {
    let lab = Lab::new();
    for i in 0..6u64 {
        std::fs::write(lab.src.join(format!("f{i}")), noise(300_000, 300 + i)).unwrap();
    }
    let journal = lab.scratch.join("journal");
    std::fs::create_dir_all(&lab.scratch).unwrap();
    let opts = BackupOptions {
        paths: vec![lab.src.clone()],
        threads: 2,
        journal: Some(journal.clone()),
        ..Default::default()
    };
    let inner: Arc<dyn LabBackend> = lab.store.clone();
    let refusing = Repository::open(Arc::new(NoIndexFiles(inner)), PW).unwrap();
    let failed = backup(Arc::new(refusing), &opts, &Arc::new(Progress::default()));
    assert!(failed.is_err(), "the run could not index anything");
    let landed = lab.store.list("data/").unwrap().len();
    assert!(landed >= 2, "packs landed before the failure: {landed}");
    assert!(lab.store.list("index/").unwrap().is_empty());
    // A record cut short by a crash mid-append ends the journal; the whole
    // records before it still count.
    let mut torn = std::fs::OpenOptions::new()
        .append(true)
        .open(&journal)
        .unwrap();
    std::io::Write::write_all(&mut torn, &[7u8; 40]).unwrap();
    drop(torn);

    let (repo, stats) = lab.open();
    let r = backup(Arc::new(repo), &opts, &Arc::new(Progress::default())).unwrap();
    assert!(
        r.storage.packs_recovered >= 2,
        "{} of {landed} landed packs recovered",
        r.storage.packs_recovered
    );
    // Had the recovered packs' data been sent again, the repository would
    // hold it twice: the 1.8 MB of random content plus at least two packs.
    let stored: u64 = lab
        .store
        .list("data/")
        .unwrap()
        .iter()
        .map(|o| o.size)
        .sum();
    assert!(
        stored < 1_800_000 * 21 / 20,
        "{stored} bytes of data packs for 1.8 MB of content"
    );
    assert!(stats.puts.load(Relaxed) > 0);
    let (_, _, _, target) = lab.restore(&[]);
    for i in 0..6u64 {
        assert_eq!(
            lab.restored(&target, &format!("f{i}")),
            noise(300_000, 300 + i)
        );
    }
}

/// A destination that streams its puts (as SMB, SFTP and local disks do):
/// it says so in its capabilities, counts the puts it gets from files and
/// from owned buffers, and cuts the first upload of every pack halfway,
/// after reading half of the file, as a dropped connection would.
#[derive(Debug)]
struct Streaming {
    inner: Arc<dyn LabBackend>,
    from_files: std::sync::atomic::AtomicU64,
    owned: std::sync::atomic::AtomicU64,
    cut: std::sync::Mutex<BTreeSet<String>>,
    /// The (device, inode) of every file handed over, and how many of
    /// them were longer or shorter than the pack they were handed as.
    files: std::sync::Mutex<BTreeSet<(u64, u64)>>,
    inexact: std::sync::atomic::AtomicU64,
    /// Handles on every file handed over, so that no inode is freed and
    /// given to a new file: a new file must count as one.
    pinned: std::sync::Mutex<Vec<std::fs::File>>,
}

impl capsule_backend::Layer for Streaming {
    fn inner(&self) -> &dyn LabBackend {
        &*self.inner
    }
    fn capabilities(&self) -> capsule_backend::Capabilities {
        capsule_backend::Capabilities {
            buffers_puts: false,
            ..self.inner.capabilities()
        }
    }
    fn put_owned(
        &self,
        name: &str,
        data: Vec<u8>,
    ) -> (Result<(), capsule_backend::BackendError>, Option<Vec<u8>>) {
        self.owned.fetch_add(1, Relaxed);
        self.inner.put_owned(name, data)
    }
    fn put_file(
        &self,
        name: &str,
        file: &std::fs::File,
        size: u64,
    ) -> Result<(), capsule_backend::BackendError> {
        self.from_files.fetch_add(1, Relaxed);
        let meta = file.metadata().unwrap();
        use std::os::unix::fs::MetadataExt;
        if self.files.lock().unwrap().insert((meta.dev(), meta.ino())) {
            self.pinned.lock().unwrap().push(file.try_clone().unwrap());
        }
        if meta.len() != size {
            self.inexact.fetch_add(1, Relaxed);
        }
        if self.cut.lock().unwrap().insert(name.to_string()) {
            let mut half = vec![0; (size / 2) as usize];
            std::io::Read::read_exact(&mut capsule_backend::ReadAt::new(file), &mut half).unwrap();
            return Err(capsule_backend::BackendError::transient(
                capsule_backend::ErrorKind::Unreachable,
                "put",
                name,
                "connection cut for the test",
            ));
        }
        self.inner.put_file(name, file, size)
    }
}

/// Packs are spilled to temporary files as they fill and a streaming
/// destination is handed the file, never an owned copy of the pack; an
/// upload cut halfway is retried from the file's start, and what lands
/// restores byte for byte. Spill files are written over once their pack
/// has landed: no more of them exist than packs can be in flight, and each
/// is exactly its pack when handed over, whatever a longer pack before it
/// left in it.
#[test]
fn packs_reach_streaming_destinations_as_files_and_retries_resend_them_whole() {
    let lab = Lab::new();
    let files = 24u64;
    for i in 0..files {
        std::fs::write(lab.src.join(format!("f{i}")), noise(400_000, 700 + i)).unwrap();
    }
    let inner: Arc<dyn LabBackend> = lab.store.clone();
    let streaming = Arc::new(Streaming {
        inner,
        from_files: Default::default(),
        owned: Default::default(),
        cut: Default::default(),
        files: Default::default(),
        inexact: Default::default(),
        pinned: Default::default(),
    });
    let quick = capsule_backend::RetryPolicy {
        attempts: 3,
        initial: std::time::Duration::from_millis(1),
        max_delay: std::time::Duration::from_millis(2),
        ride_out: std::time::Duration::ZERO,
    };
    let retrying = capsule_backend::RetryBackend::new(streaming.clone(), quick);
    let repo = Repository::open(Arc::new(retrying), PW).unwrap();
    let opts = BackupOptions {
        paths: vec![lab.src.clone()],
        threads: 2,
        ..Default::default()
    };
    let r = backup(Arc::new(repo), &opts, &Arc::new(Progress::default())).unwrap();
    let packs = lab.store.list("data/").unwrap().len() + lab.store.list("tree/").unwrap().len();
    assert!(packs >= 24, "9.6 MB in 256 KiB packs made {packs} packs");
    assert_eq!(r.storage.packs as usize, packs);
    assert_eq!(
        streaming.owned.load(Relaxed),
        0,
        "a pack was put from memory"
    );
    assert_eq!(
        streaming.from_files.load(Relaxed) as usize,
        2 * packs,
        "every pack: one cut upload, one whole retry"
    );
    assert_eq!(
        streaming.inexact.load(Relaxed),
        0,
        "a spill file was not its pack"
    );
    // In flight at once: a pack filling per blob type, one finished pack
    // per seal worker (one per core) waiting to be queued, one queued, one
    // per upload.
    let cores = std::thread::available_parallelism().unwrap().get();
    let in_flight = 2 + cores + 1 + lab.store.capabilities().concurrency;
    let spills = streaming.files.lock().unwrap().len();
    assert!(
        spills <= in_flight,
        "{spills} spill files for {packs} packs, at most {in_flight} in flight"
    );
    let (_, _, _, target) = lab.restore(&[]);
    for i in 0..files {
        assert_eq!(
            lab.restored(&target, &format!("f{i}")),
            noise(400_000, 700 + i)
        );
    }
}

/// The moment a prune's sweep lands while `check` walks trees: on the first
/// tree read, the snapshot is forgotten (when `forget` is set) and the pack
/// being read is deleted, as a sweep of a mark that waits for no one does.
#[derive(Debug)]
struct SweepDuringWalk {
    inner: Arc<dyn LabBackend>,
    repo: Arc<MemoryBackend>,
    forget: Option<capsule_format::ObjectId>,
    fired: std::sync::atomic::AtomicBool,
}

impl capsule_backend::Layer for SweepDuringWalk {
    fn inner(&self) -> &dyn LabBackend {
        &*self.inner
    }
    fn get(
        &self,
        name: &str,
        range: Option<std::ops::Range<u64>>,
    ) -> Result<Vec<u8>, capsule_backend::BackendError> {
        if name.starts_with("tree/") && !self.fired.swap(true, Relaxed) {
            if let Some(id) = &self.forget {
                let repo = Repository::open(self.repo.clone(), PW).unwrap();
                capsule_engine::forget::forget(&repo, id).unwrap();
            }
            self.repo.delete(name).unwrap();
        }
        self.inner.get(name, range)
    }
}

/// A snapshot forgotten and swept while `check` walks its trees is not
/// damage; the same pack lost under a snapshot still live is, and is named.
#[test]
fn check_ignores_what_a_prune_swept_under_a_snapshot_forgotten_meanwhile() {
    for forgotten in [true, false] {
        let lab = Lab::new();
        std::fs::write(lab.src.join("f"), noise(50_000, 3)).unwrap();
        let id: capsule_format::ObjectId = lab.backup().parse().unwrap();
        let inner: Arc<dyn LabBackend> = lab.store.clone();
        let layer = SweepDuringWalk {
            inner,
            repo: lab.store.clone(),
            forget: forgotten.then_some(id),
            fired: false.into(),
        };
        let repo = Repository::open(Arc::new(layer), PW).unwrap();
        let r = capsule_engine::check::check(&repo, false, &Progress::default()).unwrap();
        if forgotten {
            assert!(r.ok(), "{:?}", r.problems);
            assert_eq!(r.snapshots, 0);
        } else {
            assert!(!r.ok());
            let text = format!("{:?}", r.problems);
            assert!(text.contains(&id.short()), "names the snapshot: {text}");
            assert_eq!(r.snapshots, 1);
        }
    }
}

/// Hides one index file until `check` lists the prune marks, as a sweep
/// does that puts a marked pack back: it stores an index file for the
/// pack, then deletes its mark, both between a check's index load and its
/// reading of the marks.
#[derive(Debug)]
struct IndexAppearsAtMarks {
    inner: Arc<dyn LabBackend>,
    hidden: std::sync::Mutex<Option<(String, Vec<u8>)>>,
}

impl capsule_backend::Layer for IndexAppearsAtMarks {
    fn inner(&self) -> &dyn LabBackend {
        &*self.inner
    }
    fn list(
        &self,
        prefix: &str,
    ) -> Result<Vec<capsule_backend::ObjectInfo>, capsule_backend::BackendError> {
        if prefix.starts_with(capsule_engine::prune::MARKS_PREFIX) {
            if let Some((name, bytes)) = self.hidden.lock().unwrap().take() {
                self.inner.put(&name, &bytes)?;
            }
        }
        self.inner.list(prefix)
    }
}

/// An index file stored after `check` loaded the index (a sweep putting a
/// marked pack back) does not make what a live snapshot reuses look lost;
/// a pack only that file names, and which is gone, is still named as lost.
#[test]
fn check_sees_an_index_file_stored_while_it_ran() {
    for pack_gone in [false, true] {
        let lab = Lab::new();
        std::fs::write(lab.src.join("f"), noise(50_000, 4)).unwrap();
        lab.backup();
        let names = lab.store.list("index/").unwrap();
        assert_eq!(names.len(), 1, "one index file");
        let name = names[0].name.clone();
        let bytes = lab.store.get(&name, None).unwrap();
        lab.store.delete(&name).unwrap();
        let data = lab.store.list("data/").unwrap();
        if pack_gone {
            for o in &data {
                lab.store.delete(&o.name).unwrap();
            }
        }
        let layer = IndexAppearsAtMarks {
            inner: lab.store.clone(),
            hidden: Some((name, bytes)).into(),
        };
        let repo = Repository::open(Arc::new(layer), PW).unwrap();
        let r = capsule_engine::check::check(&repo, false, &Progress::default()).unwrap();
        assert_eq!(r.snapshots, 1);
        assert!(r.unindexed_packs.is_empty(), "{:?}", r.unindexed_packs);
        if pack_gone {
            let text = format!("{:?}", r.problems);
            assert!(!r.ok());
            assert!(
                data.iter().all(|o| text.contains(&o.name)),
                "names every lost pack: {text}"
            );
            assert!(text.contains("/f"), "names the file: {text}");
        } else {
            assert!(r.ok(), "{:?}", r.problems);
        }
    }
}

/// A store whose listings lag behind its writes: objects under `hide` are
/// left out of every listing (a request by name still finds them, as
/// read-after-write promises).
#[derive(Debug)]
struct LaggingListing {
    inner: Arc<dyn LabBackend>,
    hide: &'static str,
}

impl capsule_backend::Layer for LaggingListing {
    fn inner(&self) -> &dyn LabBackend {
        &*self.inner
    }
    fn list(
        &self,
        prefix: &str,
    ) -> Result<Vec<capsule_backend::ObjectInfo>, capsule_backend::BackendError> {
        let mut all = self.inner.list(prefix)?;
        all.retain(|o| !o.name.starts_with(self.hide));
        Ok(all)
    }
}

fn lagging(lab: &Lab, hide: &'static str) -> Repository {
    let layer = LaggingListing {
        inner: lab.store.clone(),
        hide,
    };
    Repository::open(Arc::new(layer), PW).unwrap()
}

/// A prune whose listing of sessions lacks the session it stored itself
/// cannot know which backups run: it refuses, deleting nothing, rather
/// than sweep packs a backup whose session the listing also missed uses.
#[test]
fn a_prune_that_cannot_see_its_own_session_deletes_nothing() {
    let lab = Lab::new();
    std::fs::write(lab.src.join("a"), noise(300_000, 11)).unwrap();
    let first = lab.backup();
    std::fs::write(lab.src.join("a"), noise(300_000, 12)).unwrap();
    lab.backup();
    let (repo, _) = lab.open();
    capsule_engine::forget::forget(&repo, &first.parse().unwrap()).unwrap();
    let before: Vec<String> = lab
        .store
        .list("data/")
        .unwrap()
        .into_iter()
        .map(|o| o.name)
        .collect();

    let repo = Arc::new(lagging(&lab, "sessions/"));
    let e = capsule_engine::prune::prune(&repo, &Default::default()).unwrap_err();
    assert!(e.to_string().contains("lag behind its writes"), "{e}");
    let after: Vec<String> = lab
        .store
        .list("data/")
        .unwrap()
        .into_iter()
        .map(|o| o.name)
        .collect();
    assert_eq!(before, after, "nothing deleted");
    assert!(
        lab.store.list("prune-marks/").unwrap().is_empty(),
        "nothing marked"
    );

    // With listings that keep up, the same prune goes ahead.
    let (repo, _) = lab.open();
    let r = capsule_engine::prune::prune(&Arc::new(repo), &Default::default()).unwrap();
    assert!(r.packs_deleted > 0, "{r:?}");
}

/// `check` asks for a pack by name before it calls it missing: a listing
/// that left it out is reported as lag, not as damage.
#[test]
fn check_asks_for_a_pack_by_name_before_calling_it_missing() {
    let lab = Lab::new();
    std::fs::write(lab.src.join("a"), noise(300_000, 21)).unwrap();
    lab.backup();
    let repo = lagging(&lab, "data/");
    assert!(repo.backend().list("data/").unwrap().is_empty());
    let r = capsule_engine::check::check(&repo, true, &Progress::default()).unwrap();
    assert!(r.ok(), "{:?}", r.problems);
    assert!(r.listing_lagged > 0, "{r:?}");
    assert!(r.blobs_read > 0, "{r:?}");
}

/// A network destination at a round trip of 100 ms (long beside a busy
/// machine's scheduling delay), counting the reads of
/// small objects in flight.
#[derive(Debug)]
struct Far {
    inner: Arc<MemoryBackend>,
    now: std::sync::atomic::AtomicUsize,
    most: std::sync::atomic::AtomicUsize,
}

impl capsule_backend::Layer for Far {
    fn inner(&self) -> &dyn LabBackend {
        &*self.inner
    }
    fn get(
        &self,
        name: &str,
        range: Option<std::ops::Range<u64>>,
    ) -> Result<Vec<u8>, capsule_backend::BackendError> {
        if !(name.starts_with("snapshots/") || name.starts_with("index/")) {
            return self.inner.get(name, range);
        }
        let n = self.now.fetch_add(1, Relaxed) + 1;
        self.most.fetch_max(n, Relaxed);
        std::thread::sleep(std::time::Duration::from_millis(100));
        self.now.fetch_sub(1, Relaxed);
        self.inner.get(name, range)
    }
    fn capabilities(&self) -> capsule_backend::Capabilities {
        capsule_backend::Capabilities {
            concurrency: 8,
            local: false,
            ..self.inner.capabilities()
        }
    }
}

/// Opening a repository reads its snapshots and index files the
/// destination's concurrency at once, also where the process has one core:
/// on rayon's pool (a thread a core) a restore pinned to one core read
/// them one after another, a round trip each (bench/RESULTS.md, Estimator
/// accuracy).
#[test]
fn snapshots_and_index_files_are_read_at_once_on_one_core() {
    let lab = Lab::new();
    for i in 0..6 {
        std::fs::write(lab.src.join(format!("f{i}")), noise(40_000, i)).unwrap();
        lab.backup();
    }
    let far = Arc::new(Far {
        inner: lab.store.clone(),
        now: Default::default(),
        most: Default::default(),
    });
    let one_core = rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build()
        .unwrap();
    let (snaps, index_files) = one_core.install(|| {
        let repo = Repository::open(far.clone(), PW).unwrap();
        let (snaps, bad) = repo.list_snapshots().unwrap();
        assert!(bad.is_empty());
        let snapshots_at_once = far.most.swap(0, Relaxed);
        let (index, bad) = repo.load_index().unwrap();
        assert!(bad.is_empty());
        assert!(snapshots_at_once > 1, "snapshots read one at a time");
        (snaps.len(), index.files().len())
    });
    assert_eq!(snaps, 6);
    assert!(index_files > 1, "{index_files} index files");
    assert!(far.most.load(Relaxed) > 1, "index files read one at a time");
}

/// A first backup meets other writers only (issue 62): a check's session
/// beside it is no reason to claim blobs; another backup's is.
#[test]
fn a_first_backup_meets_backups_not_readers() {
    use capsule_engine::rendezvous::Rendezvous;
    use capsule_engine::session::Session;
    let lab = Lab::new();
    let repo = Arc::new(lab.open().0);
    let me = Session::start(&repo).unwrap();
    let check = Session::start_kind(&repo, "check").unwrap();
    let index = MasterIndex::default();
    let alone = Rendezvous::start(repo.clone(), me.id(), &index).unwrap();
    assert!(!alone.active(), "a check beside it is not a writer");
    let other = Session::start(&repo).unwrap();
    let met = Rendezvous::start(repo.clone(), me.id(), &index).unwrap();
    assert!(met.active(), "another backup is");
    drop((alone, met));
    for s in [me, check, other] {
        assert!(s.end());
    }
}
