//! Restore a snapshot (or part of it) into a target directory.
//!
//! Safety: entry names are validated when trees are decoded (single
//! components, no `..`), every directory on the way is checked to be a real
//! directory (never a symlink), and files are created with
//! `O_CREAT|O_EXCL|O_NOFOLLOW`, so nothing a repository contains can make
//! restore write outside the target.
//!
//! Order: directories (pre-order), then file contents in parallel, then
//! symlinks/specials and hard links, then directory metadata deepest first
//! (so restoring children does not disturb their parent's times or a
//! read-only mode).

use std::collections::HashMap;
use std::ffi::OsStr;
use std::fs::OpenOptions;
use std::io::{ErrorKind, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Instant;

use capsule_format::tree::{Node, NodeKind};
use capsule_format::{BlobId, BlobType};
use globset::{GlobBuilder, GlobSet, GlobSetBuilder};
use rayon::prelude::*;

use crate::backup::Warning;
use crate::index::MasterIndex;
use crate::meta;
use crate::progress::Progress;
use crate::repo::Repository;
use crate::{EngineError, Result};

/// What to restore and where.
#[derive(Debug, Clone, Default)]
pub struct RestoreOptions {
    /// Directory to restore into (created if missing).
    pub target: PathBuf,
    /// Only entries matching these globs (and everything below them).
    pub includes: Vec<String>,
    /// Skip entries matching these globs (and everything below them).
    pub excludes: Vec<String>,
    /// Most entries the snapshot's trees may hold
    /// ([`crate::treewalk::entry_budget`]); 0 means no bound.
    pub max_entries: u64,
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
    /// Wall-clock seconds.
    pub duration_secs: f64,
    /// Entries that could not be restored.
    pub errors: Vec<Warning>,
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
            let g = GlobBuilder::new(p)
                .literal_separator(true)
                .backslash_escape(true)
                .build()
                .map_err(|e| EngineError::Invalid(format!("bad pattern {p:?}: {e}")))?;
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
    target: PathBuf,
    node: Node,
    needed: bool,
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
    std::fs::create_dir_all(&opts.target)
        .map_err(|e| EngineError::io("create target", &opts.target, e))?;
    let target = std::fs::canonicalize(&opts.target)
        .map_err(|e| EngineError::io("resolve target", &opts.target, e))?;

    // Plan: a pre-order list of entries, marking which are selected and
    // which directories are needed to hold them.
    let mut entries: Vec<Entry> = Vec::new();
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
        root,
        Path::new("/"),
        &target,
        inc.empty,
        &inc,
        &exc,
        &mut entries,
        &mut ancestors,
        &mut budget,
        &mut errors,
    )?;
    unmatched_includes(&opts.includes, &entries, &target, &mut errors)?;

    let total_bytes: u64 = entries
        .iter()
        .filter(|e| e.needed && e.node.kind() == NodeKind::File)
        .map(|e| e.node.size)
        .sum();
    progress.bytes_total.store(total_bytes, Ordering::Relaxed);
    progress.files_total.store(
        entries
            .iter()
            .filter(|e| e.needed && e.node.kind() == NodeKind::File)
            .count() as u64,
        Ordering::Relaxed,
    );
    progress.totals_final.store(true, Ordering::Relaxed);

    let errors = Mutex::new(errors);
    let warn = |p: &Path, m: String| {
        Progress::add(&progress.errors, 1);
        errors
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(Warning {
                path: p.display().to_string(),
                message: m,
            })
    };
    let report = Mutex::new(RestoreReport::default());
    let bump = |f: fn(&mut RestoreReport) -> &mut u64, n: u64| {
        *f(&mut report.lock().unwrap_or_else(|p| p.into_inner())) += n;
    };

    // 1. Directories, parents first.
    let mut dir_ok: HashMap<PathBuf, bool> = HashMap::new();
    dir_ok.insert(target.clone(), true);
    for e in entries
        .iter()
        .filter(|e| e.needed && e.node.kind() == NodeKind::Dir)
    {
        let parent_ok = e
            .target
            .parent()
            .map(|p| dir_ok.get(p).copied().unwrap_or(false))
            .unwrap_or(false);
        let ok = parent_ok
            && match ensure_dir(&e.target) {
                Ok(()) => true,
                Err(err) => {
                    warn(&e.target, format!("cannot create directory: {err}"));
                    false
                }
            };
        dir_ok.insert(e.target.clone(), ok);
    }
    let parent_ok = |p: &Path| {
        p.parent()
            .map(|p| dir_ok.get(p).copied().unwrap_or(false))
            .unwrap_or(false)
    };

    // 2. File contents. The first occurrence of a hard-linked inode is
    // written; later ones become links to it.
    let mut leaders: HashMap<(u64, u64), usize> = HashMap::new();
    let mut files: Vec<usize> = Vec::new();
    let mut links: Vec<(usize, usize)> = Vec::new();
    let mut others: Vec<usize> = Vec::new();
    for (i, e) in entries.iter().enumerate() {
        if !e.needed || !parent_ok(&e.target) {
            continue;
        }
        match e.node.kind() {
            NodeKind::File if e.node.nlink > 1 => match leaders.get(&(e.node.device, e.node.inode))
            {
                Some(&l) => links.push((l, i)),
                None => {
                    leaders.insert((e.node.device, e.node.inode), i);
                    files.push(i);
                }
            },
            NodeKind::File => files.push(i),
            NodeKind::Dir => {}
            _ => others.push(i),
        }
    }
    let failed: Mutex<std::collections::HashSet<usize>> = Mutex::default();
    let written = AtomicU64::new(0);
    files.par_iter().for_each(|&i| {
        let e = &entries[i];
        match restore_file(repo, index, &e.target, &e.node, progress) {
            Ok(()) => {
                written.fetch_add(e.node.size, Ordering::Relaxed);
                bump(|r| &mut r.files, 1);
                if let Err(err) = apply_meta(&e.target, &e.node) {
                    warn(&e.target, format!("metadata not fully restored: {err}"));
                }
            }
            Err(err) => {
                failed.lock().unwrap_or_else(|p| p.into_inner()).insert(i);
                warn(
                    &e.target,
                    format!("not restored (no partial file left behind): {err}"),
                );
            }
        }
        Progress::add(&progress.files_done, 1);
    });

    // 3. Symlinks, specials, hard links.
    for &i in &others {
        let e = &entries[i];
        match restore_special(&e.target, &e.node) {
            Ok(true) => bump(|r| &mut r.others, 1),
            Ok(false) => {}
            Err(err) => warn(&e.target, format!("not restored: {err}")),
        }
    }
    let failed = failed.into_inner().unwrap_or_else(|p| p.into_inner());
    for &(l, i) in &links {
        let (leader, e) = (&entries[l], &entries[i]);
        if failed.contains(&l) {
            warn(
                &e.target,
                "not restored: the file it is hard-linked to failed".into(),
            );
            continue;
        }
        let r =
            remove_existing(&e.target).and_then(|_| std::fs::hard_link(&leader.target, &e.target));
        match r {
            Ok(()) => bump(|r| &mut r.others, 1),
            Err(err) => warn(&e.target, format!("hard link not restored: {err}")),
        }
    }

    // 4. Directory metadata, deepest first.
    for e in entries
        .iter()
        .rev()
        .filter(|e| e.needed && e.node.kind() == NodeKind::Dir)
    {
        if dir_ok.get(&e.target).copied().unwrap_or(false) {
            bump(|r| &mut r.dirs, 1);
            if let Err(err) = apply_meta(&e.target, &e.node) {
                warn(&e.target, format!("metadata not fully restored: {err}"));
            }
        }
    }

    let mut r = report.into_inner().unwrap_or_else(|p| p.into_inner());
    r.bytes = written.into_inner();
    r.errors = errors.into_inner().unwrap_or_else(|p| p.into_inner());
    r.duration_secs = started.elapsed().as_secs_f64();
    Ok(r)
}

#[allow(clippy::too_many_arguments)]
fn plan(
    repo: &Repository,
    index: &MasterIndex,
    tree: &BlobId,
    snap_dir: &Path,
    target_dir: &Path,
    selected: bool,
    inc: &Patterns,
    exc: &Patterns,
    out: &mut Vec<Entry>,
    ancestors: &mut Vec<usize>,
    budget: &mut crate::treewalk::Budget,
    errors: &mut Vec<Warning>,
) -> Result<()> {
    budget.enter(tree)?;
    let nodes = match repo.load_tree(index, tree) {
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
        let target = target_dir.join(&name);
        let i = out.len();
        let is_dir = node.kind() == NodeKind::Dir;
        let subtree = node.subtree;
        out.push(Entry {
            target: target.clone(),
            node,
            needed: sel,
        });
        if sel {
            // Everything above a selected entry is needed to hold it.
            for &a in ancestors.iter().rev() {
                if out[a].needed {
                    break;
                }
                out[a].needed = true;
            }
        }
        if is_dir {
            if let Some(sub) = subtree {
                ancestors.push(i);
                plan(
                    repo, index, &sub, &snap_path, &target, sel, inc, exc, out, ancestors, budget,
                    errors,
                )?;
                ancestors.pop();
            }
        }
    }
    budget.leave();
    Ok(())
}

/// An include pattern that selects nothing is a mistake (a typo, a path
/// from another snapshot): restoring nothing and exiting 0 would hide it.
/// When directories were lost, the pattern may have matched inside them,
/// so it is listed with those losses instead.
fn unmatched_includes(
    includes: &[String],
    entries: &[Entry],
    target: &Path,
    errors: &mut Vec<Warning>,
) -> Result<()> {
    let mut unmatched = Vec::new();
    for p in includes {
        let one = Patterns::new(std::slice::from_ref(p))?;
        let hit = entries.iter().any(|e| {
            let rel = e.target.strip_prefix(target).unwrap_or(&e.target);
            one.matches(&Path::new("/").join(rel), &e.node.name)
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

/// Creates a directory, accepting an existing real directory; refuses a
/// symlink or other file in the way.
fn ensure_dir(p: &Path) -> std::io::Result<()> {
    match std::fs::symlink_metadata(p) {
        Ok(m) if m.is_dir() => Ok(()),
        Ok(_) => Err(std::io::Error::new(
            ErrorKind::AlreadyExists,
            "a non-directory (possibly a symlink) is in the way; refusing to follow it",
        )),
        Err(e) if e.kind() == ErrorKind::NotFound => std::fs::create_dir(p),
        Err(e) => Err(e),
    }
}

/// Removes a file or symlink at `p` so a new entry can be created there.
/// Never removes directories.
fn remove_existing(p: &Path) -> std::io::Result<()> {
    match std::fs::symlink_metadata(p) {
        Ok(m) if m.is_dir() => Err(std::io::Error::new(
            ErrorKind::AlreadyExists,
            "a directory is in the way",
        )),
        Ok(_) => std::fs::remove_file(p),
        Err(e) if e.kind() == ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}

const SPARSE_BLOCK: usize = 4096;

fn restore_file(
    repo: &Repository,
    index: &MasterIndex,
    path: &Path,
    node: &Node,
    progress: &Progress,
) -> Result<()> {
    remove_existing(path).map_err(|e| EngineError::io("replace", path, e))?;
    let nofollow = rustix::fs::OFlags::NOFOLLOW.bits() as i32;
    let mut f = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(nofollow)
        .open(path)
        .map_err(|e| EngineError::io("create", path, e))?;
    let r = write_content(repo, index, &mut f, path, node, progress);
    if r.is_err() {
        // A file that failed must not pass for restored under its real
        // name: remove what this call created (and only that).
        drop(f);
        let _ = std::fs::remove_file(path);
    }
    r
}

fn write_content(
    repo: &Repository,
    index: &MasterIndex,
    f: &mut std::fs::File,
    path: &Path,
    node: &Node,
    progress: &Progress,
) -> Result<()> {
    let mut off: u64 = 0;
    for id in &node.content {
        let data = repo.read_blob(index, BlobType::Data, id)?;
        if node.sparse {
            // Skip all-zero aligned blocks so holes stay holes.
            for (i, block) in data.chunks(SPARSE_BLOCK).enumerate() {
                if block.iter().any(|&b| b != 0) {
                    f.write_all_at(block, off + (i * SPARSE_BLOCK) as u64)
                        .map_err(|e| EngineError::io("write", path, e))?;
                }
            }
        } else {
            f.write_all(&data)
                .map_err(|e| EngineError::io("write", path, e))?;
        }
        off += data.len() as u64;
        Progress::add(&progress.bytes_done, data.len() as u64);
    }
    if node.sparse {
        f.set_len(off)
            .map_err(|e| EngineError::io("set length", path, e))?;
    }
    if off != node.size {
        return Err(EngineError::corrupt(
            path.display().to_string(),
            format!("content is {off} bytes, metadata says {}", node.size),
        ));
    }
    Ok(())
}

/// Restores a symlink, FIFO or device. Returns false for sockets, which
/// cannot be recreated meaningfully.
fn restore_special(path: &Path, node: &Node) -> std::io::Result<bool> {
    remove_existing(path)?;
    match node.kind() {
        NodeKind::Symlink => {
            std::os::unix::fs::symlink(OsStr::from_bytes(&node.target), path)?;
        }
        NodeKind::Fifo | NodeKind::CharDev | NodeKind::BlockDev => {
            let ft = match node.kind() {
                NodeKind::Fifo => rustix::fs::FileType::Fifo,
                NodeKind::CharDev => rustix::fs::FileType::CharacterDevice,
                _ => rustix::fs::FileType::BlockDevice,
            };
            rustix::fs::mknodat(
                rustix::fs::CWD,
                path,
                ft,
                rustix::fs::Mode::from_raw_mode(0o600),
                node.rdev as rustix::fs::Dev,
            )?;
        }
        NodeKind::Socket => return Ok(false),
        NodeKind::File | NodeKind::Dir => return Ok(false),
    }
    apply_meta(path, node)?;
    Ok(true)
}

/// Applies xattrs, owner (as root), mode (not on symlinks) and times.
fn apply_meta(path: &Path, node: &Node) -> std::io::Result<()> {
    let mut first_err = None;
    if let Err(e) = meta::write_xattrs(path, &node.xattrs) {
        first_err.get_or_insert(e);
    }
    if meta::is_root() {
        if let Err(e) = meta::set_owner(path, node) {
            first_err.get_or_insert(e);
        }
    }
    if node.kind() != NodeKind::Symlink {
        if let Err(e) = meta::set_mode(path, node.mode) {
            first_err.get_or_insert(e);
        }
    }
    if let Err(e) = meta::set_times(path, node) {
        first_err.get_or_insert(e);
    }
    match first_err {
        Some(e) => Err(e),
        None => Ok(()),
    }
}
