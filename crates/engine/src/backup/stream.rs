//! A backup of one stream (standard input, a command's output such as a
//! database dump) as one file in a snapshot of its own. The stream is cut
//! into chunks as a file is, so a dump that changes a little each night
//! stores only the chunks around the changes.

use std::io::Read;
use std::sync::Arc;
use std::time::Instant;

use capsule_format::snapshot::{Snapshot, SnapshotSummary};
use capsule_format::tree::{encode_tree, Node, NodeKind, Timestamp};
use capsule_format::{BlobType, FORMAT_VERSION};

use crate::error::{EngineError, Result};
use crate::packer::BlobSaver;
use crate::progress::Progress;
use crate::repo::{hostname, username, Repository};
use crate::timefmt::{now_precise, rfc3339};

use super::{commit, find_parent, BackupOptions, BackupReport, ScanReport, StageTimes};

/// A stream to back up.
pub struct Stream<'a> {
    /// The file name it is stored under (one name, no `/`).
    pub name: &'a str,
    /// Where its bytes come from.
    pub reader: &'a mut dyn Read,
    /// Called after the reader's end, before anything is committed: an
    /// error (a command that exited non-zero) means the stream is not the
    /// whole, and no snapshot is made.
    pub ended: &'a mut dyn FnMut() -> std::result::Result<(), String>,
}

/// The path a stream named `name` has in its snapshot.
pub fn stream_path(name: &str) -> String {
    format!("/{name}")
}

/// Backs up `stream` into a snapshot holding it as `/NAME`; `opts` gives
/// the tags and host (paths, excludes and the like do not apply).
pub fn backup_stream(
    repo: Arc<Repository>,
    opts: &BackupOptions,
    stream: Stream<'_>,
    progress: &Arc<Progress>,
) -> Result<BackupReport> {
    let started = Instant::now();
    let (start_unix, start_nanos) = now_precise();
    let name = stream.name;
    if name.is_empty() || name.contains('/') || name == "." || name == ".." {
        return Err(EngineError::Invalid(format!(
            "--stdin-filename {name:?}: give a file name, without \"/\""
        )));
    }
    let paths = vec![stream_path(name)];
    let host = opts.hostname.clone().unwrap_or_else(hostname);
    let session = if opts.dry_run {
        None
    } else {
        Some(crate::session::Session::start(&repo)?)
    };
    let (index, _) = repo.load_index()?;
    let index = Arc::new(index);
    let (snapshots, _) = repo.list_snapshots()?;
    let (parent, clock_warning) = find_parent(
        &repo,
        opts,
        &host,
        &paths,
        (start_unix, start_nanos),
        snapshots,
    )?;
    let ready = started.elapsed().as_secs_f64();
    let cores = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(2);
    let saver = if opts.dry_run {
        BlobSaver::start_dry(repo.clone(), index.clone(), cores)
    } else {
        BlobSaver::start_with(repo.clone(), index.clone(), cores, None, None)
    };
    let read = read_chunks(&repo, &saver, stream.reader, progress);
    // The stream's end is judged before the saver's: a command that failed
    // is the error to report, whatever storage said.
    let ended = match &read {
        Ok(_) => (stream.ended)(),
        Err(_) => Ok(()),
    };
    let content = read.and_then(|c| {
        ended.map_err(EngineError::StreamFailed)?;
        Ok(c)
    });
    let (content, total, read_secs) = match content {
        Ok(c) => c,
        Err(e) => {
            // What was stored stays unreferenced until a prune.
            let _ = saver.finish();
            return Err(e);
        }
    };
    let now = Timestamp {
        secs: start_unix,
        nanos: start_nanos,
    };
    let node = Node {
        name: name.as_bytes().to_vec(),
        kind: Some(NodeKind::File),
        mode: 0o600,
        uid: rustix::process::getuid().as_raw(),
        gid: rustix::process::getgid().as_raw(),
        mtime: now,
        atime: now,
        ctime: now,
        size: total,
        nlink: 1,
        content,
        ..Node::default()
    };
    let enc = encode_tree(std::slice::from_ref(&node));
    let root = repo.key().blob_id(&enc);
    let stored = saver.save(BlobType::Tree, root, &enc);
    let storage = saver.finish();
    stored?;
    let storage = storage?;
    let summary = SnapshotSummary {
        files: 1,
        dirs: 0,
        others: 0,
        bytes: total,
        files_read: 1,
        bytes_read: total,
        blobs_added: storage.blobs_added,
        bytes_added: storage.stored_bytes_added,
        errors: 0,
    };
    let snap = Snapshot {
        version: FORMAT_VERSION,
        time: rfc3339(start_unix),
        time_unix: start_unix,
        time_nanos: start_nanos,
        duration_secs: started.elapsed().as_secs_f64(),
        hostname: host,
        username: username(),
        paths,
        tree: root.to_hex(),
        parent: parent.as_ref().map(|(id, _)| id.to_hex()),
        tags: opts.tags.clone(),
        incomplete: false,
        summary: summary.clone(),
        program: format!("capsule {}", env!("CARGO_PKG_VERSION")),
        repaired: None,
        original: None,
    };
    let (id, append_only) = match session {
        Some(session) => {
            let (id, append_only) = commit(&repo, session, &index, &storage.packs_indexed, &snap)?;
            (id.to_hex(), append_only)
        }
        None => (String::new(), false),
    };
    let changed = parent.is_some();
    Ok(BackupReport {
        snapshot_id: id,
        parent: snap.parent.clone(),
        summary,
        files_new: u64::from(!changed),
        files_changed: u64::from(changed),
        files_unchanged: 0,
        trees_reused: 0,
        stages: StageTimes {
            ready,
            read: read_secs,
            compress: storage.compress_secs,
            encrypt: storage.encrypt_secs,
            write: storage.upload_secs,
            ..Default::default()
        },
        storage,
        duration_secs: started.elapsed().as_secs_f64(),
        warnings: Vec::new(),
        packs_distrusted: Vec::new(),
        clock_warning,
        index_notes: index.notes(),
        append_only,
        scan: ScanReport {
            mode: "stream".into(),
            reason: None,
            dirs_listed: 0,
            dirs_changed: 0,
            journal_matched: None,
            unchanged: false,
        },
        linked_dirs: Vec::new(),
        tops: Vec::new(),
        source_snapshots: Vec::new(),
        snapshot_notes: Vec::new(),
        snapshot_secs: 0.0,
    })
}

/// Reads `r` to its end in chunks cut as a file's are, handing new ones to
/// the saver: the chunk IDs, the bytes read, and the seconds spent
/// waiting for the stream.
fn read_chunks(
    repo: &Repository,
    saver: &BlobSaver,
    r: &mut dyn Read,
    progress: &Progress,
) -> Result<(Vec<capsule_format::BlobId>, u64, f64)> {
    let chunker = repo.chunker();
    let mut cuts = chunker.file();
    let max = chunker.sizes().max;
    let window = max + max / 2;
    let mut buf: Vec<u8> = Vec::with_capacity(window);
    let mut start = 0usize;
    let mut eof = false;
    let mut total = 0u64;
    let mut content = Vec::new();
    let mut waited = 0.0;
    loop {
        if !eof && buf.len() - start < max {
            buf.drain(..start);
            start = 0;
            let t = Instant::now();
            // Fill the window: a pipe gives at most 64 KiB a read.
            while buf.len() < window {
                let want = (window - buf.len()) as u64;
                let got = match r.take(want).read_to_end(&mut buf) {
                    Ok(n) => n,
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                    Err(e) => {
                        return Err(EngineError::StreamFailed(format!(
                            "reading the stream failed after {} bytes: {e}",
                            total + (buf.len() - start) as u64
                        )))
                    }
                };
                Progress::add(&progress.bytes_read, got as u64);
                if got == 0 {
                    eof = true;
                    break;
                }
            }
            waited += t.elapsed().as_secs_f64();
        }
        if start == buf.len() {
            break;
        }
        let n = cuts.next_cut(&buf[start..], eof);
        let chunk = &buf[start..start + n];
        let id = repo.key().blob_id(chunk);
        if saver.save(BlobType::Data, id, chunk)? {
            Progress::add(&progress.bytes_new, n as u64);
        }
        Progress::add(&progress.bytes_done, n as u64);
        total += n as u64;
        content.push(id);
        start += n;
    }
    Ok((content, total, waited))
}
