//! Backup: scan the sources, reuse what the parent snapshot already has,
//! read and chunk what changed, and commit a snapshot.
//!
//! Stages and where they run:
//! * **scan + read + chunk + hash**: a rayon pool walks directories in
//!   parallel (entries of one directory are processed concurrently, and
//!   subdirectories recurse on the same pool); results are collected in name
//!   order, so trees are deterministic whatever the scheduling.
//! * **compress + encrypt + pack + upload + index**: [`crate::packer`].
//! * **commit**: after the saver has flushed (every pack durable and
//!   indexed) the snapshot object is written, last.

mod changes;
mod ctx;
mod exclude;
mod read;
mod report;
mod stream;
mod walk;

use std::path::{Component, Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use capsule_format::snapshot::{Snapshot, SnapshotSummary};
use capsule_format::FileType;
use capsule_format::{BlobId, ObjectId, FORMAT_VERSION};

use crate::error::{EngineError, Result};
use crate::index::MasterIndex;
use crate::packer::{BlobSaver, SaverStatsSnapshot};
use crate::progress::Progress;
use crate::repo::{hostname, username, Repository};
use crate::timefmt::{now_precise, rfc3339};
pub use capsule_snap::{
    clean as clean_source_snapshots, Kind as SnapshotKind, Mode as SourceSnapshot,
    DIR_NAME as SNAPSHOT_DIR,
};
pub use changes::{tops, Changes, ScanReport};
use ctx::{Counters, Ctx};
pub use exclude::{check_pattern, ExcludeRules, Excludes, CACHEDIR_SIGNATURE};
pub use report::{BackupOptions, BackupReport, StageTimes, Warning};
pub use stream::{backup_stream, stream_path, Stream};

/// Makes `p` absolute and lexically normal, without resolving symlinks (the
/// last component is backed up as what it is, link or not).
pub fn normalize_source(p: &Path) -> Result<PathBuf> {
    let abs = std::path::absolute(p).map_err(|e| EngineError::io("resolve", p, e))?;
    let mut out = PathBuf::from("/");
    for c in abs.components() {
        match c {
            Component::RootDir | Component::Prefix(_) | Component::CurDir => {}
            Component::ParentDir => {
                out.pop();
            }
            Component::Normal(n) => out.push(n),
        }
    }
    Ok(out)
}

/// Indexed packs that are not on the destination with their indexed size.
fn missing_packs(repo: &Repository, index: &MasterIndex) -> Result<Vec<ObjectId>> {
    let mut stored = std::collections::HashMap::new();
    for prefix in [FileType::DataPack.prefix(), FileType::TreePack.prefix()] {
        for o in repo.backend().list(prefix)? {
            stored.insert(o.name, o.size);
        }
    }
    Ok(index
        .packs()
        .iter()
        .filter(|p| stored.get(&p.name()) != Some(&p.size))
        .map(|p| p.id)
        .collect())
}

/// After a lapsed session: fails when a pack of the index the backup
/// started from, or one it wrote, is gone.
fn lease_check(
    repo: &Repository,
    index: &MasterIndex,
    written: &[(String, u64)],
    outcome: &str,
) -> Result<()> {
    let mut missing = missing_packs(repo, index)?.len();
    let mut stored = std::collections::HashMap::new();
    for prefix in [FileType::DataPack.prefix(), FileType::TreePack.prefix()] {
        for o in repo.backend().list(prefix)? {
            stored.insert(o.name, o.size);
        }
    }
    missing += written
        .iter()
        .filter(|(name, size)| stored.get(name) != Some(size))
        .count();
    if missing == 0 {
        return Ok(());
    }
    Err(EngineError::LeaseLost(format!(
        "this backup was suspended past its session lease ({} min) and a prune deleted {} pack(s) it may refer to; {outcome}. Run the backup again",
        crate::session::LEASE_SECS / 60,
        missing
    )))
}

/// Commits `snap`, whose packs `packs_indexed` are durable and indexed, and
/// ends `session`: the snapshot ID, and whether the session could not be
/// removed (append-only credentials).
fn commit(
    repo: &Arc<Repository>,
    session: crate::session::Session,
    index: &MasterIndex,
    packs_indexed: &[(String, u64)],
    snap: &Snapshot,
) -> Result<(ObjectId, bool)> {
    // A session that lapsed (the process was suspended past its lease) may
    // have let a prune delete packs this backup refers to: commit only if
    // every pack it started from is still there.
    crate::pause::test_pause("commit");
    if !session.still_held()? {
        lease_check(repo, index, packs_indexed, "nothing was committed")?;
    }
    crate::pause::test_pause("after-check");
    let sid = session.id();
    let marked = crate::prune::reindex_marked_for_writer(repo, &sid, index, packs_indexed)?;
    // The commit point: everything the snapshot references is durable and
    // indexed by now (saver.finish returned Ok).
    let id = repo.save_snapshot(snap)?;
    // Suspended between the check and the commit: check again, and take
    // the snapshot back if it refers to what is gone.
    if !session.still_held()? {
        if let Err(e) = lease_check(repo, index, packs_indexed, "the snapshot was taken back") {
            crate::forget::forget(repo, &id)?;
            return Err(e);
        }
    }
    // A prune that was marking before the commit may have finished its mark
    // since; look again when one was seen (marks are rare, and the next
    // prune's sweep would put the packs back anyway).
    if marked {
        crate::prune::reindex_marked_for_writer(repo, &sid, index, packs_indexed)?;
    }
    Ok((id, !session.end()))
}

/// A parent snapshot and its ID.
type Parent = (ObjectId, Snapshot);

/// Picks the parent snapshot: explicit, or the latest with the same host and
/// the same set of paths that is not dated in the future (its time would
/// make files changed after it look settled: see `content_unchanged`).
/// Also says when this machine's clock is behind the newest snapshot of the
/// same host and paths, future-dated or not: one of the clocks is wrong.
fn find_parent(
    repo: &Repository,
    opts: &BackupOptions,
    host: &str,
    paths: &[String],
    now: (i64, u32),
    snaps: Vec<(ObjectId, Snapshot)>,
) -> Result<(Option<Parent>, Option<String>)> {
    let mut want = paths.to_vec();
    want.sort();
    let mut same = snaps.into_iter().rev().filter(|(_, s)| {
        let mut p = s.paths.clone();
        p.sort();
        s.hostname == host && p == want
    });
    let newest = same.next();
    let clock = newest
        .as_ref()
        .filter(|(_, s)| (s.time_unix, s.time_nanos) > now)
        .map(|(id, s)| {
            format!(
                "this machine's clock ({}) is behind snapshot {} of the same host and paths ({}): check the clock{}",
                rfc3339(now.0),
                id.short(),
                s.time,
                if crate::timefmt::is_future(s.time_unix, now.0) {
                    "; that snapshot is dated in the future and is not used as the parent or as \"latest\""
                } else {
                    ""
                }
            )
        });
    if let Some(spec) = &opts.parent {
        return Ok((Some(repo.resolve_snapshot(spec)?), clock));
    }
    let parent = newest
        .into_iter()
        .chain(same)
        .find(|(_, s)| !crate::timefmt::is_future(s.time_unix, now.0));
    Ok((parent, clock))
}

/// With a journal that saw nothing change, and the sources and the
/// directories above them as the parent's run saw them: the parent's tree
/// is this snapshot's, stored without reading the index or walking (the
/// index of a million files takes longer to read than all else a
/// no-change run does). `None` when that cannot be shown: the run goes on
/// the usual way.
fn unchanged(
    repo: &Arc<Repository>,
    opts: &BackupOptions,
    session: &crate::session::Session,
    host: &str,
    paths: &[String],
    tops_now: &[(PathBuf, String)],
    started: Instant,
) -> Result<Option<BackupReport>> {
    let Some(c) = &opts.changes else {
        return Ok(None);
    };
    if !c.is_empty()
        || c.tops.is_empty()
        || c.tops.as_slice() != tops_now
        || opts.force
        || opts.verify_changes
        || opts.verify_packs
        || !opts.damaged_packs.is_empty()
    {
        return Ok(None);
    }
    let (start_unix, start_nanos) = now_precise();
    let (snapshots, _) = repo.list_snapshots()?;
    let (parent, clock_warning) = find_parent(
        repo,
        opts,
        host,
        paths,
        (start_unix, start_nanos),
        snapshots,
    )?;
    let Some((pid, p)) = parent.filter(|(id, s)| id.to_hex() == c.parent && !s.incomplete) else {
        return Ok(None);
    };
    let summary = SnapshotSummary {
        files_read: 0,
        bytes_read: 0,
        blobs_added: 0,
        bytes_added: 0,
        errors: 0,
        ..p.summary.clone()
    };
    let snap = Snapshot {
        version: FORMAT_VERSION,
        time: rfc3339(start_unix),
        time_unix: start_unix,
        time_nanos: start_nanos,
        duration_secs: started.elapsed().as_secs_f64(),
        hostname: host.to_string(),
        username: username(),
        paths: paths.to_vec(),
        tree: p.tree.clone(),
        parent: Some(pid.to_hex()),
        tags: opts.tags.clone(),
        incomplete: false,
        summary: summary.clone(),
        program: format!("capsule {}", env!("CARGO_PKG_VERSION")),
        repaired: None,
        original: None,
    };
    // A prune marking, or a lapsed session: the usual way, which reads the
    // index these need.
    let empty = MasterIndex::default();
    if !session.still_held()?
        || crate::prune::reindex_marked_for_writer(repo, &session.id(), &empty, &[])?
    {
        return Ok(None);
    }
    let id = repo.save_snapshot(&snap)?;
    if !session.still_held()? {
        crate::forget::forget(repo, &id)?;
        return Ok(None);
    }
    Ok(Some(BackupReport {
        snapshot_id: id.to_hex(),
        parent: snap.parent.clone(),
        summary,
        files_new: 0,
        files_changed: 0,
        files_unchanged: p.summary.files,
        trees_reused: 1,
        storage: SaverStatsSnapshot::default(),
        stages: StageTimes::default(),
        duration_secs: started.elapsed().as_secs_f64(),
        warnings: Vec::new(),
        packs_distrusted: Vec::new(),
        clock_warning,
        index_notes: Vec::new(),
        append_only: false,
        scan: ScanReport {
            mode: "journal".into(),
            reason: None,
            dirs_listed: 0,
            dirs_changed: 0,
            journal_matched: None,
            unchanged: true,
        },
        linked_dirs: Vec::new(),
        tops: tops_now.to_vec(),
        // Nothing is read: no snapshot to read it from.
        source_snapshots: Vec::new(),
        snapshot_notes: Vec::new(),
        snapshot_secs: 0.0,
    }))
}

/// Runs a backup of `opts.paths` into `repo` and commits a snapshot.
///
/// Per-entry problems (vanished, unreadable, changed while read) become
/// warnings and the snapshot is marked incomplete; repository problems abort
/// without writing a snapshot.
pub fn backup(
    repo: Arc<Repository>,
    opts: &BackupOptions,
    progress: &Arc<Progress>,
) -> Result<BackupReport> {
    let started = Instant::now();
    let (start_unix, start_nanos) = now_precise();
    if opts.paths.is_empty() {
        return Err(EngineError::Invalid(
            "nothing to back up: give at least one path".into(),
        ));
    }
    let mut sources = Vec::new();
    for p in &opts.paths {
        let n = normalize_source(p)?;
        std::fs::symlink_metadata(&n).map_err(|e| EngineError::io("read source", &n, e))?;
        sources.push(n);
    }
    sources.sort();
    sources.dedup();
    // A source inside another source is already covered by it.
    let sources: Vec<PathBuf> = sources
        .iter()
        .filter(|s| !sources.iter().any(|o| o != *s && s.starts_with(o)))
        .cloned()
        .collect();
    let path_strings: Vec<String> = sources.iter().map(|p| p.display().to_string()).collect();
    let host = opts.hostname.clone().unwrap_or_else(hostname);

    let tops_now = tops(&sources);
    // Held from before the index is read until the snapshot is committed:
    // a prune deletes nothing this backup may have seen in the index while
    // the session is held (crate::session).
    // A dry run writes nothing: no session either (it reads what a
    // concurrent prune may remove, and a count a little off is its worst).
    let mut session = if opts.dry_run {
        None
    } else {
        Some(crate::session::Session::start(&repo)?)
    };
    if let Some(s) = &session {
        if let Some(r) = unchanged(&repo, opts, s, &host, &path_strings, &tops_now, started)? {
            let append_only = session.take().is_some_and(|s| !s.end());
            return Ok(BackupReport { append_only, ..r });
        }
    }
    // The index and the snapshots (for the parent) do not depend on each
    // other: listed at once, one round trip instead of two.
    let (loaded, listed) = std::thread::scope(|s| {
        let snaps = s.spawn(|| repo.list_snapshots());
        let index = repo.load_index();
        (
            index,
            snaps
                .join()
                .unwrap_or_else(|p| std::panic::resume_unwind(p)),
        )
    });
    let (mut index, _bad) = loaded?;
    let (snapshots, _) = listed?;
    let journal = match opts.journal.as_ref().filter(|_| !opts.dry_run) {
        Some(p) => Some((p.clone(), crate::journal::recover(&repo, &mut index, p)?)),
        None => None,
    };
    let mut lost: std::collections::HashSet<ObjectId> =
        opts.damaged_packs.iter().copied().collect();
    if opts.verify_packs {
        lost.extend(missing_packs(&repo, &index)?);
    }
    let packs_distrusted: Vec<String> = index
        .packs()
        .iter()
        .filter(|p| lost.contains(&p.id))
        .map(|p| p.name())
        .collect();
    index.forget_packs(&lost);
    let index = Arc::new(index);
    let (parent, clock_warning) = find_parent(
        &repo,
        opts,
        &host,
        &path_strings,
        (start_unix, start_nanos),
        snapshots,
    )?;
    let ready = started.elapsed().as_secs_f64();
    let parent_root = match &parent {
        // With --force the parent is still used for identity (atimes,
        // new-vs-changed counts), never to skip reading content.
        Some((_, s)) => {
            let id: BlobId = s
                .tree
                .parse()
                .map_err(|_| EngineError::corrupt("parent snapshot", "bad tree id"))?;
            Some(id)
        }
        _ => None,
    };

    let cores = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(2);
    let readers = if opts.threads == 0 {
        cores * 2
    } else {
        opts.threads
    };
    // A first backup may be one of several machines set up at once: it
    // meets the others (crate::rendezvous) so that what they share is sent
    // once. Only an optimisation: a destination that cannot be listed now
    // fails the backup where it matters, not here.
    let rendezvous = match (&session, &parent) {
        (Some(s), None) if !opts.alone => {
            crate::rendezvous::Rendezvous::start(repo.clone(), s.id(), &index).ok()
        }
        _ => None,
    };
    let saver = if opts.dry_run {
        BlobSaver::start_dry(repo.clone(), index.clone(), cores)
    } else {
        BlobSaver::start_with(repo.clone(), index.clone(), cores, journal, rendezvous)
    };
    let skip: Vec<PathBuf> = opts
        .skip_dirs
        .iter()
        .filter_map(|d| std::fs::canonicalize(d).ok())
        .collect();
    let excludes =
        Excludes::new(&opts.excludes, opts.ignore_file.clone(), skip)?.with_rules(&opts.rules)?;

    // A journal stands only for the parent it was cut for, and only when
    // that parent read everything: entries it skipped (unreadable, or
    // vanished while read) have no event to bring them back.
    let mut no_journal = opts.no_changes_because.clone();
    let changes = match (&opts.changes, &parent) {
        (None, _) => None,
        (Some(_), None) => {
            no_journal = Some("there is no parent snapshot to compare with".into());
            None
        }
        (Some(c), Some((id, s))) => {
            if c.parent != id.to_hex() {
                no_journal = Some(format!(
                    "the parent snapshot {} was not made under this journal (it was cut for {})",
                    id.short(),
                    c.parent.get(..8).unwrap_or(&c.parent)
                ));
                None
            } else if s.incomplete {
                no_journal = Some(format!(
                    "the parent snapshot {} is incomplete: a full scan tries its skipped entries again",
                    id.short()
                ));
                None
            } else if !packs_distrusted.is_empty() {
                no_journal = Some(format!(
                    "{} pack(s) are lost or damaged: a full scan stores their content again",
                    packs_distrusted.len()
                ));
                None
            } else if opts.force {
                no_journal = Some("--force reads everything".into());
                None
            } else {
                Some(c)
            }
        }
    };

    let estimator = if opts.estimate && changes.is_none() {
        Some(read::spawn_estimator(
            sources.clone(),
            excludes.clone(),
            opts.one_file_system,
            progress.clone(),
        ))
    } else {
        None
    };

    // Taken after the journal's cut (the caller cut it before this call,
    // and a run that reads nothing returned above): a change made from
    // here on is the next run's, and none before it is missed.
    let t_snap = Instant::now();
    let capsule_snap::Outcome {
        frozen,
        notes: mut snapshot_notes,
    } = capsule_snap::freeze(opts.source_snapshot, &sources, opts.one_file_system)?;
    let mut snapshot_secs = t_snap.elapsed().as_secs_f64();
    crate::pause::test_pause("snapshot-taken");
    let new_ctx = |follow_journal: bool| Ctx {
        repo: &repo,
        index: &index,
        saver: &saver,
        chunker: repo.chunker(),
        opts,
        excludes: excludes.clone(),
        progress,
        counters: Counters::default(),
        warnings: Mutex::new(Vec::new()),
        hardlinks: Mutex::new(Default::default()),
        parent_time: parent
            .as_ref()
            .map(|(_, s)| s.time_unix)
            .unwrap_or(i64::MIN),
        start_unix,
        windows: crate::mem::Budget::new(read::windows_budget(repo.chunker().sizes().max, cores)),
        changes: changes.filter(|_| follow_journal),
        journal_broken: Mutex::new(None),
        linked: Mutex::new(Vec::new()),
        frozen: frozen.as_ref(),
    };
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(readers)
        .thread_name(|i| format!("read-{i}"))
        .build()
        .map_err(|e| EngineError::Invalid(format!("thread pool: {e}")))?;
    let mut ctx = new_ctx(true);
    let mut root = pool.install(|| walk::save_roots(&ctx, &sources, parent_root));
    let broken = ctx
        .journal_broken
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .take();
    if let Some(why) = broken.filter(|_| changes.is_some()) {
        // What was saved stays saved (the second walk finds it stored).
        no_journal = Some(why);
        ctx = new_ctx(false);
        root = pool.install(|| walk::save_roots(&ctx, &sources, parent_root));
    }
    let mut journal_used = ctx.changes.is_some();
    let mut journal_matched = None;
    if journal_used && opts.verify_changes {
        if let Ok(by_journal) = &root {
            let by_journal = *by_journal;
            ctx = new_ctx(false);
            root = pool.install(|| walk::save_roots(&ctx, &sources, parent_root));
            journal_matched = root.as_ref().ok().map(|full| *full == by_journal);
            journal_used = false;
        }
    }
    if let Some(h) = estimator {
        h.stop();
    }
    let Ctx {
        warnings,
        counters,
        linked,
        ..
    } = ctx;
    let mut linked_dirs = linked.into_inner().unwrap_or_else(|p| p.into_inner());
    linked_dirs.sort();
    // Finish the saver even when the walk failed: if storage failed, its
    // typed error (disk full, permission...) is the one to report, not the
    // "pipeline stopped" that readers saw. No snapshot is written either way.
    let storage = saver.finish();
    let root = match (root, storage.as_ref()) {
        (_, Err(_)) => return Err(storage.err().unwrap_or(EngineError::Interrupted)),
        (Err(e), Ok(_)) => return Err(e),
        (Ok(r), Ok(_)) => r,
    };
    let storage = storage?;
    let source_snapshots: Vec<String> = frozen
        .as_ref()
        .map(|f| f.taken().into_iter().map(|t| t.handle).collect())
        .unwrap_or_default();
    crate::pause::test_pause("walked");
    if let Some(f) = frozen {
        // Read from a snapshot someone removed meanwhile: entries that
        // could not be read would pass for vanished files.
        f.check()?;
        let t = Instant::now();
        snapshot_notes.extend(f.release());
        snapshot_secs += t.elapsed().as_secs_f64();
    }

    let warnings = warnings.into_inner().unwrap_or_else(|p| p.into_inner());
    let c = &counters;
    let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
    // With a journal, what was not listed is counted as the parent had it.
    let base = parent
        .as_ref()
        .filter(|_| journal_used)
        .map(|(_, s)| s.summary.clone())
        .unwrap_or_default();
    let net =
        |base: u64, seen: &AtomicU64, gone: &AtomicU64| (base + g(seen)).saturating_sub(g(gone));
    let summary = SnapshotSummary {
        files: net(base.files, &c.files, &c.gone_files),
        dirs: net(base.dirs, &c.dirs, &c.gone_dirs),
        others: net(base.others, &c.others, &c.gone_others),
        bytes: net(base.bytes, &c.bytes, &c.gone_bytes),
        files_read: g(&c.files_read),
        bytes_read: g(&c.bytes_read),
        blobs_added: storage.blobs_added,
        bytes_added: storage.stored_bytes_added,
        errors: warnings.len() as u64,
    };
    let duration = started.elapsed().as_secs_f64();
    let snap = Snapshot {
        version: FORMAT_VERSION,
        time: rfc3339(start_unix),
        time_unix: start_unix,
        time_nanos: start_nanos,
        duration_secs: duration,
        hostname: host,
        username: username(),
        paths: path_strings,
        tree: root.to_hex(),
        parent: parent.as_ref().map(|(id, _)| id.to_hex()),
        tags: opts.tags.clone(),
        incomplete: !warnings.is_empty(),
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
    let ns = |a: &AtomicU64| a.load(Ordering::Relaxed) as f64 / 1e9;
    Ok(BackupReport {
        snapshot_id: id,
        parent: snap.parent.clone(),
        summary,
        files_new: g(&c.files_new),
        files_changed: g(&c.files_changed),
        files_unchanged: g(&c.files_unchanged),
        trees_reused: g(&c.trees_reused),
        stages: StageTimes {
            ready,
            scan: ns(&c.scan_ns),
            read: ns(&c.read_ns),
            chunk_hash: ns(&c.hash_ns),
            compress: storage.compress_secs,
            encrypt: storage.encrypt_secs,
            write: storage.upload_secs,
        },
        storage,
        duration_secs: started.elapsed().as_secs_f64(),
        warnings,
        packs_distrusted,
        clock_warning,
        index_notes: index.notes(),
        append_only,
        scan: ScanReport {
            mode: match (journal_used, journal_matched) {
                (true, _) => "journal",
                (false, Some(_)) => "verify",
                (false, None) => "full",
            }
            .into(),
            reason: if journal_used || journal_matched.is_some() {
                None
            } else {
                no_journal
            },
            journal_matched,
            dirs_listed: g(&c.dirs_listed),
            dirs_changed: changes.map_or(0, |c| c.len() as u64),
            unchanged: false,
        },
        linked_dirs,
        tops: tops_now,
        source_snapshots,
        snapshot_notes,
        snapshot_secs,
    })
}
