//! Fills a repository with many distinct small blobs, written through the
//! engine's packer as a backup writes them, and with snapshots that use
//! them: a repository of ten million blobs without a ten-million-file
//! tree (bench/index.sh).
//!
//! `blobgen REPO BLOBS [SNAPSHOTS] [--one-source]`, password in
//! `CAPSULE_PASSWORD`. Each blob is one small file's content (64 to 447
//! bytes that do not compress); files go 1,000 to a directory; snapshot k
//! holds the k-th share of the blobs, so forgetting one frees that share.
//! Snapshots are an hour apart, the last an hour ago. With `--one-source`
//! they all back up the same path, as a profile's hourly backups do (the
//! page's timeline of 10,000 snapshots, bench/page.sh).

use std::sync::Arc;

use anyhow::{bail, Context, Result};
use capsule_backend::{LocalBackend, SyncPolicy};
use capsule_engine::index::MasterIndex;
use capsule_engine::packer::BlobSaver;
use capsule_engine::Repository;
use capsule_format::snapshot::{Snapshot, SnapshotSummary};
use capsule_format::tree::{encode_tree, Node, NodeKind};
use capsule_format::{BlobId, BlobType};

const PER_DIR: u64 = 1000;

/// xorshift64*: fast, and enough to keep blobs distinct and incompressible.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().collect();
    if args.len() < 3 {
        bail!("usage: blobgen REPO BLOBS [SNAPSHOTS]  (password in CAPSULE_PASSWORD)");
    }
    let blobs: u64 = args[2].parse().context("BLOBS")?;
    let snapshots: u64 = args.get(3).map_or(Ok(10), |s| s.parse())?;
    let one_source = args.iter().any(|a| a == "--one-source");
    let pw = std::env::var("CAPSULE_PASSWORD").context("CAPSULE_PASSWORD")?;
    let backend = Arc::new(LocalBackend::open(&args[1], SyncPolicy::NoSync)?);
    let repo = Arc::new(Repository::open(backend, pw.as_bytes())?);
    let threads = std::thread::available_parallelism().map_or(2, |n| n.get());
    let saver = BlobSaver::start(repo.clone(), Arc::new(MasterIndex::default()), threads);
    let save = |t: BlobType, data: &[u8]| -> Result<BlobId> {
        let id = repo.key().blob_id(data);
        saver.save(t, id, data)?;
        Ok(id)
    };
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    let started = std::time::Instant::now();
    let per_snap = blobs.div_ceil(snapshots);
    let mut made = 0u64;
    let mut roots = Vec::new();
    for k in 0..snapshots {
        let end = ((k + 1) * per_snap).min(blobs);
        let mut dirs = Vec::new();
        let mut files = Vec::with_capacity(PER_DIR as usize);
        let mut buf = Vec::with_capacity(512);
        while made < end {
            buf.clear();
            buf.extend_from_slice(&made.to_le_bytes());
            let len = 64 + (rng.next() % 384) as usize;
            while buf.len() < len {
                buf.extend_from_slice(&rng.next().to_le_bytes());
            }
            buf.truncate(len);
            let id = save(BlobType::Data, &buf)?;
            files.push(Node {
                name: format!("f{made:08}").into_bytes(),
                kind: Some(NodeKind::File),
                mode: 0o644,
                size: len as u64,
                nlink: 1,
                content: vec![id],
                ..Node::default()
            });
            made += 1;
            if files.len() as u64 == PER_DIR || made == end {
                let sub = save(BlobType::Tree, &encode_tree(&files))?;
                dirs.push(Node {
                    name: format!("d{:06}", dirs.len()).into_bytes(),
                    kind: Some(NodeKind::Dir),
                    mode: 0o755,
                    subtree: Some(sub),
                    ..Node::default()
                });
                files.clear();
            }
            if made.is_multiple_of(1_000_000) {
                eprintln!("{made} blobs, {:.0} s", started.elapsed().as_secs_f64());
            }
        }
        let root = save(BlobType::Tree, &encode_tree(&dirs))?;
        roots.push((k, root, end - k * per_snap));
    }
    let stats = saver.finish()?;
    // After every pack and index file they need, as a backup commits.
    for (k, root, files) in roots {
        let path = if one_source {
            "/blobgen".to_string()
        } else {
            format!("/blobgen/part-{k}")
        };
        snapshot(&repo, snapshots - k, path, root, files)?;
    }
    eprintln!(
        "{made} blobs in {snapshots} snapshots, {:.0} s, {} packs",
        started.elapsed().as_secs_f64(),
        stats.packs
    );
    Ok(())
}

/// A snapshot of `path`, dated `hours_ago` hours ago.
fn snapshot(
    repo: &Repository,
    hours_ago: u64,
    path: String,
    root: BlobId,
    files: u64,
) -> Result<()> {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_secs() as i64;
    let t = now - 3600 * hours_ago as i64;
    repo.save_snapshot(&Snapshot {
        version: 1,
        time: capsule_engine::timefmt::rfc3339(t),
        time_unix: t,
        time_nanos: 0,
        duration_secs: 0.0,
        hostname: "blobgen".into(),
        username: "bench".into(),
        paths: vec![path],
        tree: root.to_hex(),
        parent: None,
        tags: vec![],
        incomplete: false,
        summary: SnapshotSummary {
            files,
            ..SnapshotSummary::default()
        },
        program: "blobgen".into(),
        repaired: None,
        original: None,
    })?;
    Ok(())
}
