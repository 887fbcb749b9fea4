//! `capsule copy`: snapshots from one repository into another (the NAS to
//! S3, say), sending only the blobs the destination lacks and sealing them
//! under the destination's key.
//!
//! Two ways, chosen by the keys:
//!
//! * **Shared chunks** (the destination was made with `init
//!   --copy-chunker-params-from` the source, so both cut files alike and
//!   name blobs alike): every blob keeps its ID, trees are copied as they
//!   are, and a blob the destination already holds (from an earlier copy,
//!   or from its own backups of the same files) is not sent.
//! * **Re-chunked** otherwise: every file's bytes are read back and cut
//!   again with the destination's chunker, and trees are rewritten with
//!   the new IDs. It costs reading every byte of every file copied, and
//!   the destination dedups copied files only against each other and its
//!   own backups cut the same way.
//!
//! A copy holds a writer session on the destination, like a backup, so a
//! prune there keeps what it sent until its snapshots are written. Packs
//! that landed are written down in a local journal until an index file
//! lists them (as a backup's are), so a copy cut short is resumed by the
//! next run, which sends only what is still missing. A snapshot already in the
//! destination (same time, host and paths) is not copied again.

mod feed;

use std::collections::{HashMap, HashSet};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use capsule_format::snapshot::Snapshot;
use capsule_format::tree::{decode_tree, encode_tree, NodeKind};
use capsule_format::{BlobId, BlobType, ObjectId};
use serde::Serialize;

use crate::error::{EngineError, Result};
use crate::index::MasterIndex;
use crate::packer::BlobSaver;
use crate::progress::Progress;
use crate::repo::Repository;

/// What a copy did.
#[derive(Debug, Clone, Default, Serialize)]
pub struct CopyReport {
    /// Snapshots written to the destination.
    pub copied: Vec<String>,
    /// Snapshots the destination already had.
    pub already_there: u64,
    /// Whether files were cut again (the repositories do not share chunks).
    pub rechunked: bool,
    /// Blobs sent.
    pub blobs_sent: u64,
    /// Blobs the destination already had.
    pub blobs_present: u64,
    /// Bytes stored in the destination (after compression and sealing).
    pub bytes_stored: u64,
    /// Bytes read from the source (stored bytes when blobs are copied as
    /// they are; file bytes when re-chunking).
    pub bytes_read: u64,
    /// Wall time.
    pub duration_secs: f64,
}

/// Whether `dst` cuts and names blobs as `src` does, so blobs and trees
/// copy unchanged.
pub fn shares_chunks(src: &Repository, dst: &Repository) -> bool {
    let (a, b) = (src.config(), dst.config());
    src.key().shares_ids_with(dst.key())
        && (a.chunk_min, a.chunk_avg, a.chunk_max) == (b.chunk_min, b.chunk_avg, b.chunk_max)
}

/// A snapshot's identity across repositories: a copy keeps its time, host
/// and paths, whatever its tree is called there.
fn identity(s: &Snapshot) -> (i64, u32, String, Vec<String>) {
    (
        s.time_unix,
        s.time_nanos,
        s.hostname.clone(),
        s.paths.clone(),
    )
}

/// Copies `snapshots` (read from `src`) into `dst`. `journal` is a file
/// of this machine's for the packs landed but not yet in an index file
/// (as a backup keeps one): a copy cut short then does not send them again.
/// `progress` counts the bytes read from the source against what is to be
/// read (known once the snapshots' trees are walked).
pub fn copy(
    src: &Arc<Repository>,
    dst: &Arc<Repository>,
    snapshots: &[(ObjectId, Snapshot)],
    journal: Option<&std::path::Path>,
    progress: &Progress,
) -> Result<CopyReport> {
    let started = Instant::now();
    let mut report = CopyReport {
        rechunked: !shares_chunks(src, dst),
        ..CopyReport::default()
    };
    let (there, _) = dst.list_snapshots()?;
    let there: HashSet<_> = there.iter().map(|(_, s)| identity(s)).collect();
    let todo: Vec<&(ObjectId, Snapshot)> = snapshots
        .iter()
        .filter(|(_, s)| !there.contains(&identity(s)))
        .collect();
    report.already_there = (snapshots.len() - todo.len()) as u64;
    if todo.is_empty() {
        report.duration_secs = started.elapsed().as_secs_f64();
        return Ok(report);
    }

    let session = crate::session::Session::start(dst)?;
    let (src_index, bad) = src.load_index()?;
    if let Some(e) = bad.into_iter().next() {
        return Err(e);
    }
    let (mut dst_index, _) = dst.load_index()?;
    let journal = match journal {
        Some(p) => Some((
            p.to_path_buf(),
            crate::journal::recover(dst, &mut dst_index, p)?,
        )),
        None => None,
    };
    let dst_index = Arc::new(dst_index);
    let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
    let saver = BlobSaver::start_with(dst.clone(), dst_index.clone(), cores, journal, None);

    let sent = if report.rechunked {
        rechunk(src, dst, &src_index, &saver, &todo, &mut report, progress)
    } else {
        send_missing(
            src,
            &src_index,
            &dst_index,
            &saver,
            &todo,
            &mut report,
            progress,
        )
        .map(|()| {
            todo.iter()
                .map(|(_, s)| s.tree.clone())
                .collect::<Vec<String>>()
        })
    };
    // Storage's own error (a full disk, a refused write) comes first: the
    // readers only saw the pipeline stop ("interrupted") because of it.
    let (roots, stats) = match (sent, saver.finish()) {
        (_, Err(e)) | (Err(e), Ok(_)) => return Err(e),
        (Ok(r), Ok(s)) => (r, s),
    };
    report.bytes_stored = stats.stored_bytes_added;
    crate::pause::test_pause("copy-sent");

    for ((_, snap), root) in todo.iter().zip(roots) {
        let mut s = snap.clone();
        s.tree = root;
        // The parent is a snapshot of the source; here it names nothing.
        s.parent = None;
        let id = dst.save_snapshot(&s)?;
        report.copied.push(id.to_hex());
    }
    session.end();
    report.duration_secs = started.elapsed().as_secs_f64();
    Ok(report)
}

/// Shared chunks: every blob of the snapshots' trees the destination lacks,
/// read pack by pack from the source and saved as it is.
fn send_missing(
    src: &Arc<Repository>,
    src_index: &MasterIndex,
    dst_index: &MasterIndex,
    saver: &BlobSaver,
    todo: &[&(ObjectId, Snapshot)],
    report: &mut CopyReport,
    progress: &Progress,
) -> Result<()> {
    // The blobs needed, by source pack. A tree the destination holds may
    // still lack descendants (a copy cut short indexes packs in the order
    // they land), so every tree is walked.
    let mut seen: HashSet<BlobId> = HashSet::new();
    let mut by_pack: HashMap<u32, Vec<(BlobType, BlobId)>> = HashMap::new();
    let mut need = |t: BlobType, id: BlobId, report: &mut CopyReport| -> Result<()> {
        if !seen.insert(id) {
            return Ok(());
        }
        if dst_index.contains(&id) {
            report.blobs_present += 1;
            return Ok(());
        }
        let loc = src_index
            .get(&id)
            .ok_or_else(|| EngineError::MissingBlob(id.to_hex()))?;
        by_pack.entry(loc.pack).or_default().push((t, id));
        report.blobs_sent += 1;
        Ok(())
    };
    let mut trees: Vec<BlobId> = Vec::new();
    for (_, s) in todo {
        trees.push(parse_tree_id(&s.tree)?);
    }
    let mut walked: HashSet<BlobId> = HashSet::new();
    while let Some(t) = trees.pop() {
        if !walked.insert(t) {
            continue;
        }
        need(BlobType::Tree, t, report)?;
        for n in src.load_tree(src_index, &t)? {
            match n.kind {
                Some(NodeKind::Dir) => trees.extend(n.subtree),
                Some(NodeKind::File) => {
                    for c in n.content {
                        need(BlobType::Data, c, report)?;
                    }
                }
                _ => {}
            }
        }
    }
    let packs: Vec<(u32, Vec<(BlobType, BlobId)>)> = by_pack.into_iter().collect();
    let to_read: u64 = packs
        .iter()
        .flat_map(|(pos, blobs)| blobs.iter().map(move |(_, id)| (pos, id)))
        .filter_map(|(pos, id)| src_index.locations(id).find(|l| l.pack == *pos))
        .map(|l| u64::from(l.length))
        .sum();
    progress.bytes_total.store(to_read, Ordering::Relaxed);
    progress
        .files_total
        .store(packs.len() as u64, Ordering::Relaxed);
    progress.totals_final.store(true, Ordering::Relaxed);
    let read = std::sync::atomic::AtomicU64::new(0);
    // Packs in flight as the destination takes them (a network source's
    // round trips hide behind each other), within a memory budget: each
    // is held whole while its blobs are sent.
    let caps = src.backend().capabilities();
    let pack_size = u64::from(src.config().pack_size).max(1 << 20);
    // A network client holds a pack twice while it arrives.
    let held = if caps.local { pack_size } else { 2 * pack_size };
    let width =
        crate::flight::reads_in_flight(&caps).min((COPY_READ_BUDGET / held).max(2) as usize);
    crate::flight::for_each_in_flight(&packs, width, |(pos, blobs)| {
        let n = send_pack(src, src_index, saver, *pos, blobs)?;
        read.fetch_add(n, Ordering::Relaxed);
        Progress::add(&progress.bytes_done, n);
        Progress::add(&progress.bytes_read, n);
        Progress::add(&progress.files_done, 1);
        Ok(())
    })?;
    report.bytes_read = read.into_inner();
    Ok(())
}

/// Bytes of source packs a copy holds at once.
const COPY_READ_BUDGET: u64 = 64 << 20;

/// Sends `blobs` of the source pack at `pos`: each envelope opened and
/// sealed again as it is framed (no decompression, no compression, no
/// second hash: the envelope's authentication binds the blob's ID). A blob
/// that does not open there is read as a restore reads it (from another
/// copy, when the index knows one) and saved from its plaintext. Returns
/// the stored bytes read.
fn send_pack(
    src: &Repository,
    src_index: &MasterIndex,
    saver: &BlobSaver,
    pos: u32,
    blobs: &[(BlobType, BlobId)],
) -> Result<u64> {
    let pack = src_index.pack_id(pos);
    let size = src_index
        .packs()
        .get(pos as usize)
        .map_or(u64::MAX, |p| p.size);
    let t0 = blobs.first().map_or(BlobType::Data, |b| b.0);
    let name = crate::repo::pack_name(&pack, t0);
    // A pack up to this size is read whole, as a repack reads it.
    let whole = if size <= crate::repack::WHOLE_PACK_READ {
        src.backend().get(&name, None).ok()
    } else {
        None
    };
    let mut read = 0u64;
    for (t, id) in blobs {
        let Some(loc) = src_index.locations(id).find(|l| l.pack == pos) else {
            continue;
        };
        let range = loc.offset as u64..loc.offset as u64 + loc.length as u64;
        let mut env = match &whole {
            Some(b) => b
                .get(range.start as usize..range.end as usize)
                .map(<[u8]>::to_vec),
            None => src.backend().get(&name, Some(range)).ok(),
        };
        read += loc.length as u64;
        let framed = env
            .as_mut()
            .filter(|_| loc.raw_length as usize <= src.max_blob_len(*t))
            .and_then(|e| src.open_framed(&name, *t, id, e).ok());
        match framed {
            Some(f) => {
                saver.save_framed(*t, *id, f, loc.raw_length as usize)?;
            }
            None => {
                let plain = src.read_blob(src_index, *t, id)?;
                saver.save(*t, *id, &plain)?;
            }
        }
    }
    Ok(read)
}

fn parse_tree_id(hex: &str) -> Result<BlobId> {
    hex.parse()
        .map_err(|_| EngineError::Invalid(format!("bad tree ID {hex:?}")))
}

/// Different chunks: each snapshot's trees rewritten bottom up, every file
/// cut again with the destination's chunker. Returns the new root trees.
fn rechunk(
    src: &Arc<Repository>,
    dst: &Arc<Repository>,
    src_index: &MasterIndex,
    saver: &BlobSaver,
    todo: &[&(ObjectId, Snapshot)],
    report: &mut CopyReport,
    progress: &Progress,
) -> Result<Vec<String>> {
    // What is to be read: every distinct file's bytes, from a walk of the
    // trees (cached here after the first read).
    let (mut seen_trees, mut seen_files) = (HashSet::new(), HashSet::new());
    let (mut total, mut files) = (0u64, 0u64);
    let mut stack: Vec<BlobId> = todo
        .iter()
        .map(|(_, s)| parse_tree_id(&s.tree))
        .collect::<Result<_>>()?;
    while let Some(t) = stack.pop() {
        if !seen_trees.insert(t) {
            continue;
        }
        for n in src.load_tree(src_index, &t)? {
            match n.kind {
                Some(NodeKind::Dir) => stack.extend(n.subtree),
                Some(NodeKind::File) if seen_files.insert(n.content.clone()) => {
                    files += 1;
                    total += n.size;
                }
                _ => {}
            }
        }
    }
    drop((seen_trees, seen_files));
    progress.bytes_total.store(total, Ordering::Relaxed);
    progress.files_total.store(files, Ordering::Relaxed);
    progress.totals_final.store(true, Ordering::Relaxed);
    let mut r = Rechunk {
        src,
        dst,
        src_index,
        saver,
        trees: HashMap::new(),
        files: HashMap::new(),
        report,
        progress,
    };
    let mut roots = Vec::new();
    for (_, s) in todo {
        let root = r.tree(&parse_tree_id(&s.tree)?, 0)?;
        roots.push(root.to_hex());
    }
    Ok(roots)
}

struct Rechunk<'a> {
    src: &'a Arc<Repository>,
    dst: &'a Arc<Repository>,
    src_index: &'a MasterIndex,
    saver: &'a BlobSaver,
    /// Source tree → destination tree, for trees shared between snapshots.
    trees: HashMap<BlobId, BlobId>,
    /// Source content → destination content, for files seen before.
    files: HashMap<Vec<BlobId>, Vec<BlobId>>,
    report: &'a mut CopyReport,
    progress: &'a Progress,
}

impl Rechunk<'_> {
    fn tree(&mut self, id: &BlobId, depth: usize) -> Result<BlobId> {
        if let Some(done) = self.trees.get(id) {
            return Ok(*done);
        }
        // Deeper than any file system allows: a tree that contains itself.
        if depth > 4096 {
            return Err(EngineError::corrupt(
                format!("tree {}", id.short()),
                "nested more than 4096 levels deep (a tree that contains itself)",
            ));
        }
        let plain = self.src.read_blob(self.src_index, BlobType::Tree, id)?;
        let mut nodes = decode_tree(&plain)
            .map_err(|e| EngineError::corrupt(format!("tree {}", id.short()), e))?;
        // This directory's files first, their bytes fetched ahead; then
        // its subdirectories, so one feed's window is held at a time.
        let is_file = |n: &capsule_format::tree::Node| {
            n.kind == Some(NodeKind::File) && !n.content.is_empty()
        };
        let fresh: Vec<&[BlobId]> = {
            let mut once = HashSet::new();
            nodes
                .iter()
                .filter(|n| is_file(n) && !self.files.contains_key(&n.content))
                .map(|n| n.content.as_slice())
                .filter(|c| once.insert(*c))
                .collect()
        };
        let mut feed = feed::Feed::new(self.src, self.src_index, &fresh);
        for n in nodes.iter_mut().filter(|n| is_file(n)) {
            n.content = self.file(&n.content, &mut feed)?;
        }
        drop(feed);
        for n in &mut nodes {
            if let (Some(NodeKind::Dir), Some(sub)) = (n.kind, n.subtree) {
                n.subtree = Some(self.tree(&sub, depth + 1)?);
            }
        }
        let enc = encode_tree(&nodes);
        let new = self.dst.key().blob_id(&enc);
        self.save(BlobType::Tree, new, &enc)?;
        self.trees.insert(*id, new);
        Ok(new)
    }

    fn file(&mut self, content: &[BlobId], feed: &mut feed::Feed) -> Result<Vec<BlobId>> {
        if let Some(done) = self.files.get(content) {
            return Ok(done.clone());
        }
        let chunker = self.dst.chunker();
        let mut cuts = chunker.file();
        let max = self.dst.config().chunk_max as usize;
        let mut buf: Vec<u8> = Vec::new();
        let mut out = Vec::new();
        for (i, c) in content.iter().enumerate() {
            let plain = feed.take(c)?;
            self.report.bytes_read += plain.len() as u64;
            Progress::add(&self.progress.bytes_done, plain.len() as u64);
            Progress::add(&self.progress.bytes_read, plain.len() as u64);
            buf.extend_from_slice(&plain);
            let last = i + 1 == content.len();
            // Cut while a whole chunk's worth is buffered (or at the end).
            while !buf.is_empty() && (buf.len() >= max || last) {
                let cut = cuts.next_cut(&buf, last).clamp(1, buf.len());
                let id = self.dst.key().blob_id(&buf[..cut]);
                self.save(BlobType::Data, id, &buf[..cut])?;
                out.push(id);
                buf.drain(..cut);
            }
        }
        self.files.insert(content.to_vec(), out.clone());
        Progress::add(&self.progress.files_done, 1);
        Ok(out)
    }

    fn save(&mut self, t: BlobType, id: BlobId, data: &[u8]) -> Result<()> {
        if self.saver.save(t, id, data)? {
            self.report.blobs_sent += 1;
        } else {
            self.report.blobs_present += 1;
        }
        Ok(())
    }
}
