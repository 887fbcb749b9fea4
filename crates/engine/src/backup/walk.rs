//! Walking the sources: one call per directory, entries in parallel, results
//! in name order. Also the estimating scan that gives progress its totals.

use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::time::Instant;

use capsule_format::tree::{encode_tree, Node, NodeKind};
use capsule_format::{BlobId, BlobType};
use rayon::prelude::*;
use rustix::fs::OFlags;

use super::ctx::Ctx;
use super::exclude::Excludes;
use super::read::{
    elapsed_ns, list_dir, read_file, read_node_xattrs, source_error, through_fd, Loc,
};
use crate::error::Result;
use crate::meta::{node_from_metadata, node_from_stat, read_xattrs, read_xattrs_from, XattrSource};
use crate::progress::Progress;

/// The directories above the sources, as a tree of names.
enum Plan {
    /// A source path: back up everything below.
    Source,
    /// An ancestor of sources: only these children.
    Dir(BTreeMap<Vec<u8>, Plan>),
}

fn build_plan(sources: &[PathBuf]) -> BTreeMap<Vec<u8>, Plan> {
    let mut root = BTreeMap::new();
    for s in sources {
        let comps: Vec<&OsStr> = s.iter().skip(1).collect();
        let mut cur = &mut root;
        for (i, c) in comps.iter().enumerate() {
            let last = i + 1 == comps.len();
            let e = cur.entry(c.as_bytes().to_vec()).or_insert_with(|| {
                if last {
                    Plan::Source
                } else {
                    Plan::Dir(BTreeMap::new())
                }
            });
            match e {
                Plan::Dir(m) if !last => cur = m,
                _ => break,
            }
        }
    }
    root
}

fn find<'a>(nodes: &'a [Node], name: &[u8]) -> Option<&'a Node> {
    nodes
        .binary_search_by(|n| n.name.as_slice().cmp(name))
        .ok()
        .map(|i| &nodes[i])
}

fn load_parent(ctx: &Ctx<'_>, id: Option<BlobId>) -> Vec<Node> {
    // An unreadable parent tree only costs speed: everything is read anew.
    id.and_then(|id| ctx.repo.load_tree(ctx.index, &id).ok())
        .unwrap_or_default()
}

/// The parent's tree `id` where a journal's walk needs it: one that cannot
/// be read stops the walk (which is then done again in full), where a full
/// scan only reads everything anew.
fn load_parent_strict(ctx: &Ctx<'_>, id: BlobId) -> Result<Vec<Node>> {
    ctx.repo.load_tree(ctx.index, &id).map_err(|e| {
        give_up(
            ctx,
            format!("a tree of the parent snapshot cannot be read ({e})"),
        )
    })
}

/// The journal's walk cannot go on: says why, and stops the walk (which
/// is then done again in full).
fn give_up(ctx: &Ctx<'_>, why: String) -> crate::error::EngineError {
    ctx.journal_broken
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .get_or_insert(why);
    crate::error::EngineError::Interrupted
}

/// Under a journal: a file newly seen with several names (a hard link made
/// since the parent, or a file moved here that has one) has other names
/// in directories that may have had no event.
fn newly_linked(old: &[Node], now: &[Node]) -> Option<Vec<u8>> {
    now.iter()
        .filter(|n| n.kind() == NodeKind::File && n.nlink > 1)
        .find(|n| {
            !find(old, &n.name)
                .is_some_and(|o| o.kind() == NodeKind::File && o.inode == n.inode && o.nlink > 1)
        })
        .map(|n| n.name.clone())
}

/// Under a journal: whether the parent's record of the directory at `path`
/// (`old`) is followed for `now`, the same directory as it is now: the
/// same inode on the same device (not replaced, nothing mounted or
/// unmounted on it), and not to be scanned in full.
fn follows(ctx: &Ctx<'_>, old: Option<&Node>, now: &Node, path: &Path) -> bool {
    let Some(changes) = ctx.changes else {
        return false;
    };
    old.is_some_and(|o| {
        o.kind() == NodeKind::Dir
            && now.kind() == NodeKind::Dir
            && o.inode == now.inode
            && o.device == now.device
            && o.subtree.is_some()
    }) && !changes.is_deep(path)
}

/// Under a journal: the parent's entry `old` is no longer counted as it was
/// (gone, or counted again as seen now).
fn gone(ctx: &Ctx<'_>, old: &Node) {
    let c = &ctx.counters;
    match old.kind() {
        NodeKind::File => {
            Progress::add(&c.gone_files, 1);
            Progress::add(&c.gone_bytes, old.size);
        }
        NodeKind::Dir => Progress::add(&c.gone_dirs, 1),
        _ => Progress::add(&c.gone_others, 1),
    }
}

/// Under a journal: everything below the parent's directory `old` is no
/// longer counted (the directory went, or was scanned in full again).
fn gone_below(ctx: &Ctx<'_>, old: &Node) -> Result<()> {
    let Some(id) = old.subtree else {
        return Ok(());
    };
    for n in load_parent_strict(ctx, id)? {
        gone(ctx, &n);
        if n.kind() == NodeKind::Dir {
            gone_below(ctx, &n)?;
        }
    }
    Ok(())
}

/// Under a journal, after `dir` was looked at again: the parent's entries
/// (`old`) leave the count, with all below those directories whose walk
/// did not follow the parent's (see [`follows`]).
fn account(ctx: &Ctx<'_>, dir: &Path, old: &[Node], now: &[Node]) -> Result<()> {
    for o in old {
        gone(ctx, o);
        if o.kind() == NodeKind::Dir {
            let name = OsStr::from_bytes(&o.name);
            let n = find(now, &o.name);
            if !n.is_some_and(|n| follows(ctx, Some(o), n, &dir.join(name))) {
                gone_below(ctx, o)?;
            }
        }
    }
    Ok(())
}

fn save_tree(ctx: &Ctx<'_>, nodes: &[Node]) -> Result<BlobId> {
    let enc = encode_tree(nodes);
    // Readers refuse larger trees (a decompression-bomb guard), so a
    // snapshot must never hold one.
    let limit = ctx.repo.max_blob_len(BlobType::Tree);
    if enc.len() > limit {
        return Err(crate::error::EngineError::Invalid(format!(
            "a directory with {} entries encodes to {} bytes, more than a tree may hold ({limit}); split it or exclude part of it",
            nodes.len(),
            enc.len()
        )));
    }
    let id = ctx.repo.key().blob_id(&enc);
    ctx.saver.save(BlobType::Tree, id, &enc)?;
    Ok(id)
}

/// Backs up every source and returns the root tree ID. The root tree mirrors
/// the absolute paths: `/home/me/docs` is stored as `home/me/docs`.
pub(super) fn save_roots(
    ctx: &Ctx<'_>,
    sources: &[PathBuf],
    parent: Option<BlobId>,
) -> Result<BlobId> {
    let root = Path::new("/");
    if sources.iter().any(|s| s == root) {
        // `/` itself: its entries are the snapshot's root tree (the plan
        // below has no component to put it under, and once saved nothing
        // at all). Other sources lie below it and are covered.
        let fd = rustix::fs::open(
            ctx.physical(root),
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            rustix::fs::Mode::empty(),
        )
        .map_err(|e| crate::error::EngineError::io("open source", root, e.into()))?;
        let dev = ctx.device(
            rustix::fs::fstat(&fd)
                .map_err(|e| crate::error::EngineError::io("read source", root, e.into()))?
                .st_dev as u64,
        );
        Progress::add(&ctx.counters.dirs, 1);
        // The root's own record is not kept in a tree: its count goes as
        // the parent's.
        if ctx.changes.is_some() {
            Progress::add(&ctx.counters.gone_dirs, 1);
        }
        let journal = ctx.changes.is_some() && parent.is_some();
        return save_dir(ctx, root, &fd, parent, &ctx.excludes, dev, journal);
    }
    let plan = build_plan(sources);
    save_plan(ctx, root, &plan, parent)
}

fn save_plan(
    ctx: &Ctx<'_>,
    dir: &Path,
    children: &BTreeMap<Vec<u8>, Plan>,
    parent: Option<BlobId>,
) -> Result<BlobId> {
    let parent_nodes = load_parent(ctx, parent);
    let items: Vec<(&Vec<u8>, &Plan)> = children.iter().collect();
    let nodes: Vec<Option<Node>> = items
        .par_iter()
        .map(|(name, plan)| {
            let name = OsStr::from_bytes(name);
            let path = dir.join(name);
            let pnode = find(&parent_nodes, name.as_bytes());
            match plan {
                // A source is backed up as named: one that is a symlink
                // stands for what it points to (storing only the link would
                // save nothing of `~/Documents -> /data/docs`). A dangling
                // link is all there is, so it is stored as a link.
                Plan::Source => {
                    // The link is followed where the sources name it (a
                    // snapshot of its target's file system was taken),
                    // then read where that is read.
                    let real = match std::fs::symlink_metadata(ctx.physical(&path)) {
                        Ok(m) if m.file_type().is_symlink() => {
                            std::fs::canonicalize(&path).unwrap_or_else(|_| path.clone())
                        }
                        _ => path.clone(),
                    };
                    let read_at = ctx.physical(&real);
                    let r = save_entry(
                        ctx,
                        &real,
                        Loc::Path(&read_at),
                        name,
                        pnode,
                        &ctx.excludes,
                        None,
                        ctx.changes.is_some(),
                    )?;
                    if let (Some(_), Some(o)) = (ctx.changes, pnode) {
                        account(ctx, dir, std::slice::from_ref(o), r.as_slice())?;
                    }
                    Ok(r)
                }
                // A directory above a source, followed if it is a symlink:
                // stored as a directory, so the source below stays
                // reachable in the snapshot (a symlink node would hide it).
                Plan::Dir(sub) => {
                    let read_at = ctx.physical(&path);
                    let m = match std::fs::metadata(&read_at) {
                        Ok(m) => m,
                        Err(e) => {
                            ctx.warn(&path, format!("cannot read metadata: {e}"));
                            return Ok(None);
                        }
                    };
                    let mut node = node_from_metadata(name, &m);
                    node.device = ctx.device(node.device);
                    node.xattrs = read_xattrs(&read_at).unwrap_or_default();
                    // A directory above the sources keeps the times and
                    // size the parent recorded while it is the same
                    // directory with the same owner, mode and attributes:
                    // they move with everything else in it (the home
                    // directory, when backing up ~/Documents), and storing
                    // them again would store a new root tree, an index and
                    // a pack for a run where no source changed.
                    if let Some(p) = pnode.filter(|p| {
                        p.kind() == NodeKind::Dir
                            && p.inode == node.inode
                            && p.device == node.device
                            && p.mode == node.mode
                            && p.uid == node.uid
                            && p.gid == node.gid
                            && p.xattrs == node.xattrs
                    }) {
                        node.mtime = p.mtime;
                        node.ctime = p.ctime;
                        node.atime = p.atime;
                        node.size = p.size;
                        node.nlink = p.nlink;
                    }
                    node.subtree = Some(save_plan(ctx, &path, sub, pnode.and_then(|p| p.subtree))?);
                    Ok(Some(node))
                }
            }
        })
        .collect::<Result<_>>()?;
    let nodes: Vec<Node> = nodes.into_iter().flatten().collect();
    save_tree(ctx, &nodes)
}

/// Backs up the directory open at `fd`; `path` is for messages and
/// excludes. Every entry is reached through `fd` ([`Loc::At`]).
///
/// Under a journal (`journal`: the parent's tree `parent` is the same
/// directory's, see [`follows`]), a directory where nothing changed keeps
/// the parent's tree, one where only something below changed keeps the
/// parent's entries but those on the way there, and only a dirty one is
/// listed.
#[allow(clippy::too_many_arguments)]
fn save_dir(
    ctx: &Ctx<'_>,
    path: &Path,
    fd: &OwnedFd,
    parent: Option<BlobId>,
    ex: &Excludes,
    dev: u64,
    journal: bool,
) -> Result<BlobId> {
    if let (Some(changes), Some(id), true) = (ctx.changes, parent, journal) {
        if !changes.touches(path) && ctx.saver.has(&id) {
            Progress::add(&ctx.counters.trees_reused, 1);
            return Ok(id);
        }
        if !changes.is_dirty(path) && changes.touches(path) {
            return save_on_the_way(ctx, path, fd, id, ex, dev);
        }
    }
    let t0 = Instant::now();
    Progress::add(&ctx.counters.dirs_listed, 1);
    let mut names = match list_dir(fd) {
        Ok((names, None)) => names,
        Ok((names, Some(e))) => {
            ctx.warn(path, format!("listing failed part-way: {e}"));
            names
        }
        Err(e) => {
            ctx.warn(path, format!("cannot list directory: {e}; stored as empty"));
            Vec::new()
        }
    };
    names.sort_by(|a, b| a.as_bytes().cmp(b.as_bytes()));
    Progress::add(&ctx.counters.scan_ns, elapsed_ns(t0));
    let here = through_fd(fd).unwrap_or_else(|| path.to_path_buf());
    let (ex, err) = ex.enter(path, &here, Some(&names));
    if let Some(err) = err {
        ctx.warn(path, format!("ignore file: {err}"));
    }
    let parent_nodes = match parent {
        Some(id) if journal => load_parent_strict(ctx, id)?,
        _ => load_parent(ctx, parent),
    };
    let nodes: Vec<Option<Node>> = names
        .par_iter()
        .map(|n| {
            save_entry(
                ctx,
                &path.join(n),
                Loc::At(fd.as_fd(), n),
                n,
                find(&parent_nodes, n.as_bytes()),
                &ex,
                Some(dev),
                journal,
            )
        })
        .collect::<Result<_>>()?;
    let nodes: Vec<Node> = nodes.into_iter().flatten().collect();
    if nodes
        .iter()
        .any(|n| n.kind() == NodeKind::File && n.nlink > 1)
    {
        ctx.linked
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(path.to_path_buf());
    }
    // Also in a directory scanned in full under a journal (a new one): a
    // link made there has its other names where the journal saw nothing.
    if ctx.changes.is_some() {
        if let Some(name) = newly_linked(&parent_nodes, &nodes) {
            return Err(give_up(
                ctx,
                format!(
                    "{} has a new hard link: its other names may be in directories with no event",
                    path.join(OsStr::from_bytes(&name)).display()
                ),
            ));
        }
    }
    if journal {
        account(ctx, path, &parent_nodes, &nodes)?;
    }
    // Every entry as the parent recorded it: reuse its tree blob as is,
    // without encoding or hashing it again.
    // The parent's tree must still be stored: after a pack was found lost,
    // its blobs are forgotten and must be written again.
    if let Some(id) =
        parent.filter(|id| !parent_nodes.is_empty() && nodes == parent_nodes && ctx.saver.has(id))
    {
        Progress::add(&ctx.counters.trees_reused, 1);
        return Ok(id);
    }
    save_tree(ctx, &nodes)
}

/// Under a journal: the directory at `path` did not change, but something
/// below it did. Its entries are the parent's (`parent`), but for the
/// directories on the way to a change, which are looked at again.
fn save_on_the_way(
    ctx: &Ctx<'_>,
    path: &Path,
    fd: &OwnedFd,
    parent: BlobId,
    ex: &Excludes,
    dev: u64,
) -> Result<BlobId> {
    let changes = ctx.changes.expect("only under a journal");
    let old = load_parent_strict(ctx, parent)?;
    let here = through_fd(fd).unwrap_or_else(|| path.to_path_buf());
    let (ex, err) = ex.enter(path, &here, None);
    if let Some(err) = err {
        ctx.warn(path, format!("ignore file: {err}"));
    }
    let nodes: Vec<Option<Node>> = old
        .par_iter()
        .map(|o| {
            let name = OsStr::from_bytes(&o.name);
            let child = path.join(name);
            if o.kind() != NodeKind::Dir || !changes.touches(&child) {
                return Ok(Some(o.clone()));
            }
            let r = save_entry(
                ctx,
                &child,
                Loc::At(fd.as_fd(), name),
                name,
                Some(o),
                &ex,
                Some(dev),
                true,
            )?;
            account(ctx, path, std::slice::from_ref(o), r.as_slice())?;
            Ok(r)
        })
        .collect::<Result<_>>()?;
    let nodes: Vec<Node> = nodes.into_iter().flatten().collect();
    if nodes == old && ctx.saver.has(&parent) {
        Progress::add(&ctx.counters.trees_reused, 1);
        return Ok(parent);
    }
    save_tree(ctx, &nodes)
}

/// Backs up one entry. `Ok(None)` means skipped (excluded, or a warning was
/// recorded); `Err` means the repository side failed and the backup stops.
///
/// `path` is the entry's full path, for messages and exclude patterns;
/// `loc` is where the system calls find it.
///
/// `journal`: the walk follows a change journal here (see `save_dir`).
#[allow(clippy::too_many_arguments)]
fn save_entry(
    ctx: &Ctx<'_>,
    path: &Path,
    loc: Loc<'_>,
    name: &OsStr,
    parent: Option<&Node>,
    ex: &Excludes,
    fs_dev: Option<u64>,
    journal: bool,
) -> Result<Option<Node>> {
    let t0 = Instant::now();
    let mut st = match loc.stat() {
        Ok(st) => st,
        Err(e) => return Ok(source_error(ctx, path, "cannot read metadata", e)),
    };
    // An excluded nested subvolume is not snapshotted (a machine may hold
    // thousands: container images).
    let view = match ctx.frozen {
        Some(f)
            if f.is_nested_placeholder(crate::platform::widths(&st).1, st.st_ino)
                && !ex.is_excluded(path, true) =>
        {
            match nested(ctx, f, path) {
                Ok((nested, view)) => {
                    st = nested;
                    view
                }
                Err(e) => {
                    ctx.warn(path, e);
                    return Ok(None);
                }
            }
        }
        _ => None,
    };
    let loc = view.as_deref().map_or(loc, Loc::Path);
    Progress::add(&ctx.counters.scan_ns, elapsed_ns(t0));
    let mut node = node_from_stat(name, &st);
    node.device = ctx.device(node.device);
    if ex.is_excluded(path, node.kind() == NodeKind::Dir)
        || (node.kind() == NodeKind::File && ex.too_large(node.size))
        || crate::platform::excluded_by_system(&st, || loc.sys_path(path))
    {
        return Ok(None);
    }
    let c = &ctx.counters;
    // An entry the parent saw with the same identity and change time keeps
    // the parent's atime: reading it (a symlink, or a file or directory we
    // may not open with O_NOATIME) moves its atime, and recording that
    // would store new trees for nothing that changed.
    let same_entry = parent.filter(|p| {
        p.kind() == node.kind()
            && p.inode == node.inode
            && p.mtime == node.mtime
            && p.ctime == node.ctime
    });
    if let Some(p) = same_entry {
        node.atime = p.atime;
    }
    match node.kind() {
        NodeKind::File => {
            Progress::add(&c.files, 1);
            if let Some(p) = unchanged(ctx, parent, &node) {
                node.content = p.content.clone();
                node.xattrs = p.xattrs.clone();
                Progress::add(&c.files_unchanged, 1);
                Progress::add(&ctx.progress.files_unchanged, 1);
                Progress::add(&ctx.progress.bytes_unchanged, node.size);
                Progress::add(&ctx.progress.bytes_done, node.size);
            } else {
                match read_file(ctx, path, loc, &mut node)? {
                    Some(content) => node.content = content,
                    None => return Ok(None),
                }
                let is_changed = parent.is_some_and(|p| p.kind() == NodeKind::File);
                Progress::add(
                    if is_changed {
                        &c.files_changed
                    } else {
                        &c.files_new
                    },
                    1,
                );
            }
            Progress::add(&c.bytes, node.size);
            Progress::add(&ctx.progress.files_done, 1);
        }
        NodeKind::Dir => {
            Progress::add(&c.dirs, 1);
            let root_dev = fs_dev.unwrap_or(node.device);
            let psub = parent
                .filter(|p| p.kind() == NodeKind::Dir)
                .and_then(|p| p.subtree);
            let follow = journal && follows(ctx, parent, &node, path);
            // Nothing changed at or below it, and the directory itself is
            // as the parent saw it: the parent's record stands, not even
            // opened (its attributes cannot change without its ctime).
            if let (true, Some(p), Some(id)) = (follow, same_entry, psub) {
                if !ctx.changes.is_some_and(|c| c.touches(path)) && ctx.saver.has(&id) {
                    node.xattrs = p.xattrs.clone();
                    node.subtree = Some(id);
                    Progress::add(&c.trees_reused, 1);
                    return Ok(Some(node));
                }
            }
            let dir = match loc.open(OFlags::RDONLY | OFlags::DIRECTORY) {
                Ok(fd) => Some(fd),
                Err(e) => {
                    ctx.warn(path, format!("cannot list directory: {e}; stored as empty"));
                    None
                }
            };
            if let Some(fd) = &dir {
                match read_xattrs_from(XattrSource::Fd(fd.as_fd())) {
                    Ok(x) => node.xattrs = x,
                    Err(e) => ctx.warn(path, format!("cannot read extended attributes: {e}")),
                }
            }
            node.subtree = Some(match dir {
                Some(fd) if !(ctx.opts.one_file_system && node.device != root_dev) => {
                    save_dir(ctx, path, &fd, psub, ex, root_dev, follow)?
                }
                // A mount point: keep the directory, not what is mounted on
                // it; or a directory that could not be opened.
                _ => save_tree(ctx, &[])?,
            });
        }
        NodeKind::Symlink => {
            Progress::add(&c.others, 1);
            // A symlink's target cannot change without a new inode.
            if let Some(p) = same_entry.filter(|p| p.size == node.size && !ctx.opts.force) {
                node.target = p.target.clone();
                node.xattrs = p.xattrs.clone();
                return Ok(Some(node));
            }
            read_node_xattrs(ctx, path, loc, &mut node);
            match loc.read_link() {
                Ok(t) => node.target = t,
                Err(e) => {
                    ctx.warn(path, format!("cannot read symlink: {e}"));
                    return Ok(None);
                }
            }
        }
        _ => {
            Progress::add(&c.others, 1);
            read_node_xattrs(ctx, path, loc, &mut node);
        }
    }
    Ok(Some(node))
}

/// A btrfs subvolume of its own below a snapshotted one, which the
/// snapshot shows as an empty directory: snapshotted in turn, and read
/// there (its stat, and where). With one-file-system it is another file
/// system, kept as the live walk keeps one: its own directory, empty.
fn nested(
    ctx: &Ctx<'_>,
    frozen: &capsule_snap::Frozen,
    path: &Path,
) -> std::result::Result<(rustix::fs::Stat, Option<PathBuf>), String> {
    let stat = |p: &Path| {
        rustix::fs::statat(rustix::fs::CWD, p, rustix::fs::AtFlags::SYMLINK_NOFOLLOW)
            .map_err(|e| format!("cannot read the nested subvolume: {e}"))
    };
    if ctx.opts.one_file_system {
        return Ok((stat(path)?, None));
    }
    let view = frozen
        .nested(path)
        .map_err(|e| format!("cannot snapshot the nested subvolume: {e}"))?;
    Ok((stat(&view)?, Some(view)))
}

/// The parent's entry, if it can stand in for reading the file again.
fn unchanged<'p>(ctx: &Ctx<'_>, parent: Option<&'p Node>, node: &Node) -> Option<&'p Node> {
    if ctx.opts.force {
        return None;
    }
    let p = parent?;
    let trusted = content_unchanged(p, node, ctx.parent_time, ctx.start_unix)
        && p.content.iter().all(|id| ctx.saver.has(id));
    trusted.then_some(p)
}

/// The change-detection rules (docs/DESIGN.md, "Change detection"): may the
/// content recorded in `parent` stand for the file now described by `now`?
///
/// 1. same kind (file), size, mtime and ctime to the nanosecond, and inode;
/// 2. the parent saw the file settled: its ctime and mtime are more than a
///    second before the parent snapshot started (`parent_time`), so a
///    rewrite within the same timestamp tick after it was read cannot hide;
/// 3. the file's mtime is not in the future (clock-skewed files are re-read).
pub(crate) fn content_unchanged(
    parent: &Node,
    now: &Node,
    parent_time: i64,
    start_unix: i64,
) -> bool {
    let same = parent.kind() == NodeKind::File
        && now.kind() == NodeKind::File
        && parent.size == now.size
        && parent.mtime == now.mtime
        && parent.ctime == now.ctime
        && parent.inode == now.inode;
    let settled = parent.ctime.secs < parent_time - 1 && parent.mtime.secs < parent_time - 1;
    let sane_clock = now.mtime.secs <= start_unix + 1;
    same && settled && sane_clock
}

#[cfg(test)]
mod tests {
    use super::content_unchanged;
    use capsule_format::tree::{Node, NodeKind, Timestamp};

    const PARENT_TIME: i64 = 1_000_000;
    const NOW: i64 = 1_003_600;

    fn file() -> Node {
        Node {
            name: b"f".to_vec(),
            kind: Some(NodeKind::File),
            size: 100,
            mtime: Timestamp {
                secs: PARENT_TIME - 100,
                nanos: 5,
            },
            ctime: Timestamp {
                secs: PARENT_TIME - 100,
                nanos: 7,
            },
            inode: 42,
            device: 1,
            ..Node::default()
        }
    }

    #[test]
    fn identical_settled_file_is_unchanged() {
        assert!(content_unchanged(&file(), &file(), PARENT_TIME, NOW));
        // Device numbers may change across reboots; they are not compared.
        let mut n = file();
        n.device = 2;
        assert!(content_unchanged(&file(), &n, PARENT_TIME, NOW));
    }

    #[test]
    fn same_size_rewrite_in_the_same_second_is_caught() {
        // Only the nanoseconds differ.
        let mut n = file();
        n.mtime.nanos += 1;
        n.ctime.nanos += 1;
        assert!(!content_unchanged(&file(), &n, PARENT_TIME, NOW));
        let mut n = file();
        n.mtime.nanos += 1;
        assert!(!content_unchanged(&file(), &n, PARENT_TIME, NOW));
    }

    #[test]
    fn ctime_only_change_is_caught() {
        // chmod, chown, xattr changes, or mtime set back with utimensat.
        let mut n = file();
        n.ctime.secs += 5;
        assert!(!content_unchanged(&file(), &n, PARENT_TIME, NOW));
    }

    #[test]
    fn inode_reuse_is_caught() {
        // Deleted and recreated with the same size and times, new inode.
        let mut n = file();
        n.inode = 43;
        assert!(!content_unchanged(&file(), &n, PARENT_TIME, NOW));
    }

    #[test]
    fn size_change_is_caught() {
        let mut n = file();
        n.size = 101;
        assert!(!content_unchanged(&file(), &n, PARENT_TIME, NOW));
    }

    #[test]
    fn racy_parent_entry_is_not_trusted() {
        // Changed within a second of the parent snapshot: a same-tick rewrite
        // after the parent read it would leave every field equal.
        let mut p = file();
        p.ctime.secs = PARENT_TIME - 1;
        assert!(!content_unchanged(&p, &p.clone(), PARENT_TIME, NOW));
        let mut p = file();
        p.mtime.secs = PARENT_TIME;
        assert!(!content_unchanged(&p, &p.clone(), PARENT_TIME, NOW));
    }

    #[test]
    fn clock_skewed_file_is_reread() {
        // mtime in the future: whatever produced it, its times cannot be trusted.
        let mut p = file();
        p.mtime.secs = NOW + 86_400;
        assert!(!content_unchanged(
            &p,
            &p.clone(),
            PARENT_TIME + 200_000,
            NOW
        ));
    }

    #[test]
    fn kind_change_is_caught() {
        let mut n = file();
        n.kind = Some(NodeKind::Symlink);
        assert!(!content_unchanged(&file(), &n, PARENT_TIME, NOW));
    }
}
