//! Restore a snapshot (or part of it) into a target directory.
//!
//! Safety: entry names are validated when trees are decoded (single
//! components, no `..`), and every entry is created relative to its parent
//! directory's descriptor with `O_NOFOLLOW` (module `fsys`), so nothing a
//! repository contains, and no symlink another process swaps in while the
//! restore runs, can make restore write outside the target.
//!
//! Order: directories (pre-order), then file contents pack by pack with
//! many reads in flight (module `fetch`), then symlinks/specials and hard links,
//! then directory metadata deepest first (so restoring children does not
//! disturb their parent's times or a read-only mode).

mod descend;
pub(crate) mod fetch;
mod fsys;
mod item;
mod trees;

pub use fetch::{max_gap, Bound, BoundKind, FetchStats, MAX_GAP, MAX_GAP_REMOTE, MAX_REQUEST};

/// Removes `name` in directory `parent` and, for a directory, all it
/// holds, through descriptors and never through a link; how many entries.
pub fn remove_tree_at(
    parent: &std::os::fd::OwnedFd,
    name: &std::ffi::OsStr,
) -> std::io::Result<u64> {
    fsys::remove_all_at(parent, name, 0, false)
}

use std::collections::HashMap;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::time::Instant;

use capsule_format::tree::NodeKind;

use capsule_format::BlobId;
use globset::{GlobSet, GlobSetBuilder};
use item::{Arena, Item};

use crate::backup::Warning;
use crate::error::{EngineError, Result};
use crate::index::MasterIndex;
use crate::progress::Progress;
use crate::repo::Repository;

/// What to restore and where.
#[derive(Debug, Clone, Default)]
pub struct RestoreOptions {
    /// Directory to restore into (created if missing).
    pub target: PathBuf,
    /// The target already opened (and checked) by the caller: everything
    /// is restored below this descriptor, and `target` only names it in
    /// messages. Put back reaches its staging folder without following
    /// links and hands the restore that folder, not a path looked up again.
    pub target_dir: Option<std::sync::Arc<std::os::fd::OwnedFd>>,
    /// Only entries matching these globs (and everything below them).
    pub includes: Vec<String>,
    /// Skip entries matching these globs (and everything below them).
    pub excludes: Vec<String>,
    /// Most entries the snapshot's trees may hold
    /// ([`crate::treewalk::entry_budget`]); 0 means no bound.
    pub max_entries: u64,
    /// Reads in flight at once; 0 picks the destination's concurrency.
    pub connections: usize,
    /// What to do with a file already in the target.
    pub overwrite: Overwrite,
    /// Remove what the target holds beyond the snapshot, in every
    /// directory restored whole at or below one of `sources`, so those
    /// equal the snapshot. Nothing above or beside a source is ever removed.
    pub delete: bool,
    /// The snapshot's source paths (absolute): the only places `delete`
    /// removes anything. A source of `/` puts the whole target in scope.
    pub sources: Vec<PathBuf>,
    /// Change nothing: report what would be restored and, with `delete`,
    /// list what would be removed.
    pub dry_run: bool,
    /// Recognise unchanged files by content rather than size and mtime,
    /// and read back every file written to compare it with the snapshot.
    pub verify: bool,
    /// Files one fetch plan covers; 0 means [`FILES_PER_BATCH`]. Smaller
    /// batches hold less; tests make them tiny to cross batch boundaries.
    pub files_per_batch: usize,
}

/// What restore does with a file already in its place.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Overwrite {
    /// Always write the snapshot's version.
    Always,
    /// Keep a file whose size and mtime (or content, with `verify`) match
    /// the snapshot's; write the rest. A second restore into the same
    /// target, or one restarted after a kill, fetches only what differs.
    #[default]
    IfChanged,
    /// Like `IfChanged`, but also keep a file newer than the snapshot's.
    IfNewer,
    /// Never replace anything already in the target.
    Never,
}

/// What a restore did.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct RestoreReport {
    /// Regular files restored.
    pub files: u64,
    /// Directories restored.
    pub dirs: u64,
    /// Symlinks, specials and hard links restored.
    pub others: u64,
    /// Bytes of file content written.
    pub bytes: u64,
    /// Files already in the target as the snapshot has them, left alone.
    pub unchanged: u64,
    /// Entries left alone by the overwrite policy although they differ.
    pub kept: u64,
    /// Entries removed by `delete` (counting everything below a removed
    /// directory); with `dry_run`, those that would be.
    pub deleted: u64,
    /// Each entry `delete` removed (or would remove), where it was in the
    /// target; a directory's entry counts what was below it too.
    pub deleted_paths: Vec<Deleted>,
    /// Nothing was changed (`dry_run`): the counts say what would be.
    pub dry_run: bool,
    /// Part files a killed restore had left, removed.
    pub leftovers_removed: u64,
    /// Files read back and found identical to the snapshot (`verify`).
    pub verified: u64,
    /// Wall-clock seconds.
    pub duration_secs: f64,
    /// Entries that could not be restored.
    pub errors: Vec<Warning>,
    /// What reading the file contents cost.
    pub fetch: FetchStats,
}

/// An entry `--delete` removed.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Deleted {
    /// Where it was.
    pub path: String,
    /// Entries removed with it: 1 for a file, more for a directory.
    pub entries: u64,
}

/// An include or exclude pattern matching exactly `path` (a snapshot path,
/// starting with `/`): its glob characters escaped.
pub fn literal_pattern(path: &str) -> String {
    globset::escape(path)
}

/// Path patterns: a pattern containing `/` matches the whole snapshot path,
/// one without matches the entry name.
struct Patterns {
    full: GlobSet,
    name: GlobSet,
    empty: bool,
}

impl Patterns {
    fn new(pats: &[String]) -> Result<Self> {
        let mut full = GlobSetBuilder::new();
        let mut name = GlobSetBuilder::new();
        for p in pats {
            let g = crate::backup::check_pattern(p)?;
            if p.contains('/') {
                full.add(g);
            } else {
                name.add(g);
            }
        }
        let b = |s: GlobSetBuilder| s.build().map_err(|e| EngineError::Invalid(e.to_string()));
        Ok(Patterns {
            full: b(full)?,
            name: b(name)?,
            empty: pats.is_empty(),
        })
    }
    fn matches(&self, snap_path: &Path, name: &[u8]) -> bool {
        self.full.is_match(snap_path) || self.name.is_match(OsStr::from_bytes(name))
    }
}

struct Entry {
    /// The directory entry holding it, plus one; 0 for the target itself
    /// (4 bytes where an `Option<usize>` takes 16).
    up: u32,
    node: Item,
    needed: bool,
    /// Selected itself (not only needed to hold something selected): a
    /// directory selected is restored whole.
    whole: bool,
}

/// Files whose contents one fetch plan covers by default (see `restore`).
pub const FILES_PER_BATCH: usize = 32_768;

impl Entry {
    fn parent(&self) -> Option<usize> {
        self.up.checked_sub(1).map(|p| p as usize)
    }
}

/// The plan: entries in pre-order, their names and blob lists in `arena`.
#[derive(Default)]
struct Entries {
    list: Vec<Entry>,
    arena: Arena,
}

impl fsys::Layout for Entries {
    fn parent(&self, i: usize) -> Option<usize> {
        self.list[i].parent()
    }
    fn name(&self, i: usize) -> &[u8] {
        self.arena.name(&self.list[i].node)
    }
}

/// Restores the tree `root` of a snapshot.
pub fn restore(
    repo: &Repository,
    index: &MasterIndex,
    root: &BlobId,
    opts: &RestoreOptions,
    progress: &Progress,
) -> Result<RestoreReport> {
    let started = Instant::now();
    let inc = Patterns::new(&opts.includes)?;
    let exc = Patterns::new(&opts.excludes)?;
    if opts.delete && opts.sources.iter().any(|s| !s.is_absolute()) {
        return Err(EngineError::Invalid(
            "--delete needs the snapshot's absolute source paths".into(),
        ));
    }
    // A dry run creates nothing, not even the target.
    let target_exists = opts.target_dir.is_some() || opts.target.exists();
    if !opts.dry_run && opts.target_dir.is_none() {
        std::fs::create_dir_all(&opts.target)
            .map_err(|e| EngineError::io("create target", &opts.target, e))?;
    }
    let target = if opts.target_dir.is_some() {
        opts.target.clone()
    } else if target_exists || !opts.dry_run {
        std::fs::canonicalize(&opts.target)
            .map_err(|e| EngineError::io("resolve target", &opts.target, e))?
    } else {
        std::path::absolute(&opts.target)
            .map_err(|e| EngineError::io("resolve target", &opts.target, e))?
    };

    let workers = match opts.connections {
        0 => {
            let caps = repo.backend().capabilities();
            let cpus = std::thread::available_parallelism().map_or(2, |n| n.get());
            // A local disk gains nothing from more readers than cores to
            // decode what they read; a remote one needs its concurrency.
            if caps.local {
                cpus.max(2)
            } else {
                caps.concurrency.max(cpus)
            }
        }
        n => n,
    };
    // The trees first, every level at once (see `trees`).
    let max_trees = if opts.max_entries == 0 {
        usize::MAX
    } else {
        usize::try_from(opts.max_entries).unwrap_or(usize::MAX)
    };
    let descend = descend::Descend::new(&opts.includes);
    let (mut prefetched, tree_requests) =
        trees::prefetch(repo, index, root, &descend, workers, max_trees);
    // The read buffers the trees came in go back before the plan grows.
    crate::mem::release_free();

    // Plan: a pre-order list of entries, marking which are selected and
    // which directories are needed to hold them.
    // Restoring everything, exactly the room needed (doubling as it grows
    // left up to half a plan of slack: 60 MB on 300,000 files), bounded
    // for a crafted tree. With `--include` the plan keeps only what is
    // selected and the way to it, usually far less than the trees hold.
    let size = prefetched.size();
    let mut entries = if inc.empty {
        Entries {
            list: Vec::with_capacity(size.entries.min(1 << 22)),
            arena: Arena::with_capacity(size.name_bytes.min(1 << 26), size.blobs.min(1 << 22)),
        }
    } else {
        Entries::default()
    };
    let mut errors: Vec<Warning> = Vec::new();
    let mut ancestors: Vec<usize> = Vec::new();
    let mut budget = crate::treewalk::Budget::new(if opts.max_entries == 0 {
        u64::MAX
    } else {
        opts.max_entries
    });
    plan(
        repo,
        index,
        &mut prefetched,
        root,
        Path::new("/"),
        &target,
        None,
        inc.empty,
        &inc,
        &descend,
        &exc,
        &mut entries,
        &mut ancestors,
        &mut budget,
        &mut errors,
    )?;
    // The walk's garbage (trees read, sealed and decoded) goes back to the
    // system before the contents are fetched.
    drop(prefetched);
    crate::mem::release_free();
    unmatched_includes(&opts.includes, &entries, &mut errors)?;

    let total_bytes: u64 = entries
        .list
        .iter()
        .filter(|e| e.needed && e.node.kind() == NodeKind::File)
        .map(|e| e.node.size)
        .sum();
    progress.bytes_total.store(total_bytes, Ordering::Relaxed);
    let needed_files = entries
        .list
        .iter()
        .filter(|e| e.needed && e.node.kind() == NodeKind::File)
        .count();
    progress
        .files_total
        .store(needed_files as u64, Ordering::Relaxed);
    progress.totals_final.store(true, Ordering::Relaxed);

    let scope = DeleteScope::new(opts, &inc, &entries);
    if opts.dry_run {
        return dry_run(
            repo, index, opts, &target, &entries, &scope, &exc, errors, started,
        );
    }

    let mut report = RestoreReport::default();
    let mut warn = |p: &Path, m: String| {
        Progress::add(&progress.errors, 1);
        errors.push(Warning {
            path: p.display().to_string(),
            message: m,
        })
    };
    let fs = match &opts.target_dir {
        Some(fd) => fsys::Target::opened(fd.clone(), &target, &entries),
        None => fsys::Target::open(&target, &entries)
            .map_err(|e| EngineError::io("open target", &target, e))?,
    };
    let all = &entries;
    let (entries, arena) = (&all.list, &all.arena);
    // Where an entry goes, for messages only (every file system call goes
    // through `fs`): built when needed, not held for every entry.
    let path = |i: usize| entry_path(all, &target, i);

    // 1. Directories, parents first. One that was there already may hold
    // what a killed restore was writing (fsys::PART_PREFIX): it goes, so
    // it is never taken for a restored file.
    let mut dir_ok = vec![false; entries.len()];
    let parent_ok = |dir_ok: &[bool], e: &Entry| e.parent().is_none_or(|p| dir_ok[p]);
    let mut clean = |d: Option<usize>, shown: &Path, warn: &mut dyn FnMut(&Path, String)| match fs
        .remove_leftovers(d)
    {
        Ok(n) => report.leftovers_removed += n,
        Err(err) => warn(
            shown,
            format!("cannot look for what a killed restore left: {err}"),
        ),
    };
    if target_exists {
        clean(None, &target, &mut warn);
    }
    for (i, e) in entries.iter().enumerate() {
        if !e.needed || e.node.kind() != NodeKind::Dir || !parent_ok(&dir_ok, e) {
            continue;
        }
        match fs.mkdir(i) {
            Ok(existed) => {
                dir_ok[i] = true;
                if existed {
                    clean(Some(i), &path(i), &mut warn);
                }
            }
            Err(err) => warn(&path(i), format!("cannot create directory: {err}")),
        }
    }

    // 2. File contents. The first occurrence of a hard-linked inode is
    // written; later ones become links to it.
    let mut leaders: HashMap<(u64, u64), usize> = HashMap::new();
    let mut files: Vec<fetch::FileJob> = Vec::with_capacity(needed_files);
    let mut links: Vec<(usize, usize)> = Vec::new();
    let mut others: Vec<usize> = Vec::new();
    for (i, e) in entries.iter().enumerate() {
        if !e.needed || !parent_ok(&dir_ok, e) {
            continue;
        }
        match (e.node.kind(), e.node.hard_link()) {
            (NodeKind::File, Some(link)) => match leaders.get(&link) {
                Some(&l) => links.push((l, i)),
                None => {
                    leaders.insert(link, i);
                    files.push(fetch::FileJob {
                        entry: i,
                        node: &e.node,
                    });
                }
            },
            (NodeKind::File, None) => files.push(fetch::FileJob {
                entry: i,
                node: &e.node,
            }),
            (NodeKind::Dir, _) => {}
            _ => others.push(i),
        }
    }
    // Files already in place are kept as the policy says; only the rest
    // is fetched.
    let mut keep = |f: &fetch::FileJob| -> bool {
        let e = &entries[f.entry];
        match existing(repo, index, &fs, f.entry, &e.node, arena, opts) {
            Existing::Same => {
                report.unchanged += 1;
                Progress::add(&progress.files_done, 1);
                Progress::add(&progress.bytes_done, e.node.size);
                // Owner, mode and xattrs may still differ.
                if let Err(err) = fs
                    .open_read(f.entry)
                    .and_then(|h| fsys::apply_fd_meta(&h, &e.node))
                {
                    warn(
                        &path(f.entry),
                        format!("metadata not fully restored: {err}"),
                    );
                }
                true
            }
            Existing::KeptByPolicy => {
                report.kept += 1;
                Progress::add(&progress.files_done, 1);
                true
            }
            Existing::Replace => false,
        }
    };
    files.retain(|f| !keep(f));
    // In batches of files, so that the fetch plan (each blob, where it
    // goes, each file's state: about 170 bytes a file) is held for one
    // batch, not for every file at once. Batches follow the packs, not the
    // tree: files taken in tree order have their blobs scattered over the
    // packs (a backup's workers interleave them, and deduplicated content
    // sits where it was first stored), and each batch's reads then spanned
    // the others' blobs: 300,000 tiny files fetched 122 MiB for 32 MiB
    // needed. Ordered by where each file's first blob lies, a batch reads
    // its own stretch of the packs; one straddling two batches is read in
    // two ranges.
    let per_batch = match opts.files_per_batch {
        0 => FILES_PER_BATCH,
        n => n,
    };
    if files.len() > per_batch {
        files.sort_by_cached_key(|f| {
            arena
                .content(f.node)
                .first()
                .and_then(|id| index.get(id))
                .map_or((u32::MAX, u32::MAX), |l| (l.pack, l.offset))
        });
    }
    let mut failed: std::collections::HashSet<usize> = Default::default();
    for batch in files.chunks(per_batch) {
        let outcomes = fetch::write_files(
            repo,
            index,
            &fs,
            batch,
            arena,
            workers,
            progress,
            &mut report.fetch,
        )?;
        for (f, mut o) in batch.iter().zip(outcomes) {
            let e = &entries[f.entry];
            if opts.verify && o.is_ok() {
                match same_content(repo, index, &fs, f.entry, arena.content(&e.node)) {
                    Ok(true) => report.verified += 1,
                    Ok(false) => {
                        o = Err("verification failed: what was written differs from the snapshot (disk or memory error?)".into())
                    }
                    Err(err) => o = Err(format!("verification failed: cannot read it back: {err}")),
                }
            }
            match o {
                Ok(meta_warning) => {
                    report.files += 1;
                    report.bytes += e.node.size;
                    if let Some(m) = meta_warning {
                        warn(&path(f.entry), m);
                    }
                }
                Err(why) => {
                    failed.insert(f.entry);
                    warn(
                        &path(f.entry),
                        format!("not restored (no partial file left behind): {why}"),
                    );
                }
            }
        }
        // Each batch's plan and buffers, freed, go back before the next.
        crate::mem::release_free();
    }

    // 3. Symlinks, specials, hard links.
    for &i in &others {
        let e = &entries[i];
        if opts.overwrite == Overwrite::Never && matches!(fs.stat(i), Ok(Some(_))) {
            report.kept += 1;
            continue;
        }
        match fs.special(i, &e.node) {
            Ok(true) => report.others += 1,
            Ok(false) => {}
            Err(err) => warn(&path(i), format!("not restored: {err}")),
        }
    }
    for &(l, i) in &links {
        if opts.overwrite == Overwrite::Never && matches!(fs.stat(i), Ok(Some(_))) {
            report.kept += 1;
            continue;
        }
        if failed.contains(&l) {
            warn(
                &path(i),
                "not restored: the file it is hard-linked to failed".into(),
            );
            continue;
        }
        match fs.hard_link(l, i) {
            Ok(()) => report.others += 1,
            Err(err) => warn(&path(i), format!("hard link not restored: {err}")),
        }
    }

    // 4. With `delete`, what the snapshot lacks goes from every directory
    // restored whole within a source (`DeleteScope`).
    if opts.delete {
        for d in scope.apply(&fs, all, Some(&dir_ok), &exc, &target, false, &mut warn) {
            report.deleted += d.entries;
            report.deleted_paths.push(d);
        }
    }

    // 5. Directory metadata, deepest first.
    for (i, e) in entries.iter().enumerate().rev() {
        if dir_ok[i] {
            report.dirs += 1;
            if let Err(err) = fs.dir_meta(i, &e.node) {
                warn(&path(i), format!("metadata not fully restored: {err}"));
            }
        }
    }

    report.fetch.tree_requests = tree_requests;
    report.errors = errors;
    report.duration_secs = started.elapsed().as_secs_f64();
    Ok(report)
}

/// Where `--delete` may remove anything: directories restored whole (all
/// of them, or what `--include` selected) that are a source of the snapshot
/// or lie below one. A source's ancestors are restored as directories to
/// hold it, never whole: `restore --target / --delete` of a snapshot of
/// `/home/me/Documents` touches nothing outside `/home/me/Documents`.
struct DeleteScope {
    /// The target itself: only for a snapshot of `/` restored whole.
    root: bool,
    /// Directory entries in scope, parents before children.
    dirs: Vec<usize>,
}

impl DeleteScope {
    fn new(opts: &RestoreOptions, inc: &Patterns, entries: &Entries) -> Self {
        if !opts.delete {
            return DeleteScope {
                root: false,
                dirs: Vec::new(),
            };
        }
        let within = |p: &Path| opts.sources.iter().any(|s| p.starts_with(s));
        let dirs = (0..entries.list.len())
            .filter(|&i| {
                let e = &entries.list[i];
                e.whole
                    && e.node.kind() == NodeKind::Dir
                    && within(&entry_path(entries, Path::new("/"), i))
            })
            .collect();
        DeleteScope {
            root: inc.empty && within(Path::new("/")),
            dirs,
        }
    }

    /// Removes (or with `dry`, only counts) what each directory in scope
    /// holds beyond the snapshot. `made` says which directories the restore
    /// created or found (a dry run looks at whatever is there). Excluded
    /// names stay: the user kept them out of the restore, not out of the
    /// target.
    #[allow(clippy::too_many_arguments)]
    fn apply(
        &self,
        fs: &fsys::Target<'_, Entries>,
        all: &Entries,
        made: Option<&[bool]>,
        exc: &Patterns,
        target: &Path,
        dry: bool,
        warn: &mut dyn FnMut(&Path, String),
    ) -> Vec<Deleted> {
        let mut children: HashMap<Option<usize>, std::collections::HashSet<&[u8]>> = HashMap::new();
        for e in &all.list {
            children
                .entry(e.parent())
                .or_default()
                .insert(all.arena.name(&e.node));
        }
        let dirs = self
            .root
            .then_some(None)
            .into_iter()
            .chain(self.dirs.iter().map(|&i| Some(i)))
            .filter(|d| d.is_none_or(|i| made.is_none_or(|m| m[i])));
        let mut out = Vec::new();
        for d in dirs {
            let (shown, snap_dir) = match d {
                None => (target.to_path_buf(), PathBuf::from("/")),
                Some(i) => (
                    entry_path(all, target, i),
                    entry_path(all, Path::new("/"), i),
                ),
            };
            let names = match fs.list(d) {
                Ok(n) => n,
                // A dry run looks at a target that may lack the directory.
                Err(err) if dry && err.kind() == std::io::ErrorKind::NotFound => continue,
                Err(err) => {
                    warn(&shown, format!("cannot list for --delete: {err}"));
                    continue;
                }
            };
            let keep = children.get(&d);
            for n in names {
                if keep.is_some_and(|k| k.contains(&n[..]))
                    || (!exc.empty && exc.matches(&snap_dir.join(OsStr::from_bytes(&n)), &n))
                {
                    continue;
                }
                let path = shown.join(OsStr::from_bytes(&n));
                match fs.remove_all(d, &n, dry) {
                    Ok(entries) => out.push(Deleted {
                        path: path.display().to_string(),
                        entries,
                    }),
                    Err(err) => warn(&path, format!("not deleted: {err}")),
                }
            }
        }
        out
    }
}

/// What a restore would do (`dry_run`), changing nothing: the files it
/// would write (those already in place as the policy keeps them are not
/// counted) and, with `delete`, each entry it would remove.
#[allow(clippy::too_many_arguments)]
fn dry_run(
    repo: &Repository,
    index: &MasterIndex,
    opts: &RestoreOptions,
    target: &Path,
    all: &Entries,
    scope: &DeleteScope,
    exc: &Patterns,
    mut errors: Vec<Warning>,
    started: Instant,
) -> Result<RestoreReport> {
    let mut report = RestoreReport {
        dry_run: true,
        ..Default::default()
    };
    let fs = if target.is_dir() {
        Some(
            fsys::Target::open(target, all)
                .map_err(|e| EngineError::io("open target", target, e))?,
        )
    } else {
        None
    };
    for (i, e) in all.list.iter().enumerate() {
        if !e.needed {
            continue;
        }
        match e.node.kind() {
            NodeKind::Dir => report.dirs += 1,
            NodeKind::File => {
                let there = fs
                    .as_ref()
                    .map(|fs| existing(repo, index, fs, i, &e.node, &all.arena, opts));
                match there {
                    Some(Existing::Same) => report.unchanged += 1,
                    Some(Existing::KeptByPolicy) => report.kept += 1,
                    Some(Existing::Replace) | None => {
                        report.files += 1;
                        report.bytes += e.node.size;
                    }
                }
            }
            _ => report.others += 1,
        }
    }
    if let Some(fs) = &fs {
        let mut warn = |p: &Path, m: String| {
            errors.push(Warning {
                path: p.display().to_string(),
                message: m,
            })
        };
        for d in scope.apply(fs, all, None, exc, target, true, &mut warn) {
            report.deleted += d.entries;
            report.deleted_paths.push(d);
        }
    }
    report.errors = errors;
    report.duration_secs = started.elapsed().as_secs_f64();
    Ok(report)
}

#[allow(clippy::too_many_arguments)]
fn plan(
    repo: &Repository,
    index: &MasterIndex,
    prefetched: &mut trees::Trees,
    tree: &BlobId,
    snap_dir: &Path,
    target_dir: &Path,
    parent: Option<usize>,
    selected: bool,
    inc: &Patterns,
    descend: &descend::Descend,
    exc: &Patterns,
    out: &mut Entries,
    ancestors: &mut Vec<usize>,
    budget: &mut crate::treewalk::Budget,
    errors: &mut Vec<Warning>,
) -> Result<()> {
    budget.enter(tree)?;
    let loaded = match prefetched.take(repo, index, tree) {
        Some(nodes) => Ok(nodes),
        None => repo.load_tree(index, tree),
    };
    let nodes = match loaded {
        Ok(n) => n,
        // Storage that cannot be reached stops the restore; a missing,
        // truncated or damaged tree only loses that directory.
        Err(EngineError::Backend(b)) if b.is_destination_failure() => {
            return Err(EngineError::Backend(b))
        }
        Err(e) => {
            errors.push(Warning {
                path: target_dir.display().to_string(),
                message: format!("directory contents lost: {e}"),
            });
            budget.leave();
            return Ok(());
        }
    };
    budget.take(nodes.len() as u64)?;
    for node in nodes {
        let name = OsStr::from_bytes(&node.name).to_owned();
        let snap_path = snap_dir.join(&name);
        if !exc.empty && exc.matches(&snap_path, &node.name) {
            continue;
        }
        let sel = selected || inc.matches(&snap_path, &node.name);
        let is_dir = node.kind() == NodeKind::Dir;
        // What is not selected is planned only as a directory that may
        // hold something selected, and dropped again if it holds nothing.
        if !(sel || is_dir && descend.opens(&snap_path)) {
            continue;
        }
        let i = out.list.len();
        let mark = out.arena.mark();
        let too_large = || {
            EngineError::Invalid(format!(
                "{}: the snapshot has too many entries, names or blobs to restore at once (over 4 G); restore it in parts with --include",
                snap_path.display()
            ))
        };
        // Entry numbers fit in 32 bits (parents come before children).
        u32::try_from(i + 1).map_err(|_| too_large())?;
        let (node, subtree) = Item::new(node, &mut out.arena).map_err(|_| too_large())?;
        out.list.push(Entry {
            up: parent.map_or(0, |p| p as u32 + 1),
            node,
            needed: sel,
            whole: sel,
        });
        if sel {
            // Everything above a selected entry is needed to hold it.
            for &a in ancestors.iter().rev() {
                if out.list[a].needed {
                    break;
                }
                out.list[a].needed = true;
            }
        }
        if is_dir {
            if let Some(sub) = subtree {
                ancestors.push(i);
                let target = target_dir.join(&name);
                plan(
                    repo,
                    index,
                    prefetched,
                    &sub,
                    &snap_path,
                    &target,
                    Some(i),
                    sel,
                    inc,
                    descend,
                    exc,
                    out,
                    ancestors,
                    budget,
                    errors,
                )?;
                ancestors.pop();
            }
        }
        if !out.list[i].needed {
            out.list.truncate(i);
            out.arena.truncate(mark);
        }
    }
    budget.leave();
    Ok(())
}

/// Where entry `i` goes below `root`.
fn entry_path(entries: &Entries, root: &Path, i: usize) -> PathBuf {
    fsys::path_in(entries, root, i)
}

/// An include pattern that selects nothing is a mistake (a typo, a path
/// from another snapshot): restoring nothing and exiting 0 would hide it.
/// When directories were lost, the pattern may have matched inside them,
/// so it is listed with those losses instead.
fn unmatched_includes(
    includes: &[String],
    entries: &Entries,
    errors: &mut Vec<Warning>,
) -> Result<()> {
    let mut unmatched = Vec::new();
    for p in includes {
        let one = Patterns::new(std::slice::from_ref(p))?;
        let hit = entries.list.iter().enumerate().any(|(i, e)| {
            one.matches(
                &entry_path(entries, Path::new("/"), i),
                entries.arena.name(&e.node),
            )
        });
        if !hit {
            unmatched.push(p.clone());
        }
    }
    if unmatched.is_empty() {
        return Ok(());
    }
    if errors.is_empty() {
        return Err(EngineError::PathNotFound(format!(
            "nothing in the snapshot matches --include {}",
            unmatched.join(", ")
        )));
    }
    for p in unmatched {
        errors.push(Warning {
            path: p,
            message: "--include pattern matched nothing (it may lie in a lost directory)".into(),
        });
    }
    Ok(())
}

enum Existing {
    /// Nothing in the way, or something to replace.
    Replace,
    /// The snapshot's file is already there.
    Same,
    /// Something else is there, and the policy keeps it.
    KeptByPolicy,
}

/// What is at file entry `i`'s place, judged by the overwrite policy.
fn existing<L: fsys::Layout>(
    repo: &Repository,
    index: &MasterIndex,
    fs: &fsys::Target<'_, L>,
    i: usize,
    node: &Item,
    arena: &Arena,
    opts: &RestoreOptions,
) -> Existing {
    let Ok(Some(st)) = fs.stat(i) else {
        // Nothing there (or it cannot be looked at: creating it will say
        // why).
        return Existing::Replace;
    };
    if opts.overwrite == Overwrite::Always {
        return Existing::Replace;
    }
    let is_file =
        rustix::fs::FileType::from_raw_mode(st.st_mode) == rustix::fs::FileType::RegularFile;
    let mtime = (st.st_mtime, st.st_mtime_nsec as u32);
    let snap_mtime = (node.mtime().secs, node.mtime().nanos);
    let same = is_file
        && if opts.verify {
            same_content(repo, index, fs, i, arena.content(node)).unwrap_or(false)
        } else {
            st.st_size as u64 == node.size && mtime == snap_mtime
        };
    let newer = is_file && mtime > snap_mtime;
    if same {
        Existing::Same
    } else if opts.overwrite == Overwrite::Never || (opts.overwrite == Overwrite::IfNewer && newer)
    {
        Existing::KeptByPolicy
    } else {
        Existing::Replace
    }
}

/// Whether file entry `i` holds exactly the snapshot's content: each blob's
/// span hashes to its ID, and nothing follows the last.
fn same_content<L: fsys::Layout>(
    repo: &Repository,
    index: &MasterIndex,
    fs: &fsys::Target<'_, L>,
    i: usize,
    content: &[BlobId],
) -> std::io::Result<bool> {
    use std::io::Read;
    let mut f = std::io::BufReader::with_capacity(1 << 20, fs.open_read(i)?);
    let mut buf = Vec::new();
    for id in content {
        let Some(loc) = index.get(id) else {
            return Ok(false);
        };
        buf.resize(loc.raw_length as usize, 0);
        match f.read_exact(&mut buf) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(false),
            Err(e) => return Err(e),
        }
        if repo.key().blob_id(&buf) != *id {
            return Ok(false);
        }
    }
    Ok(f.read(&mut [0u8; 1])? == 0)
}
