//! The file system's state: inode numbers, the names of the snapshots,
//! hosts, `latest` and `versions/` trees, open files and the read-ahead,
//! kept current by the refresh.

use std::collections::hash_map::DefaultHasher;
use std::collections::HashMap;
use std::ffi::OsStr;
use std::hash::{Hash, Hasher};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use capsule_engine::browse::{FileMap, Lru};
use capsule_engine::browse::{Refresh, View};
use capsule_format::tree::{Node, NodeKind, Timestamp};
use capsule_format::BlobId;
use fuser::{Errno, FileAttr, FileType, INodeNo};

use crate::inodes::{in_place, At, Gone, Inodes, Place, What};

/// What can go wrong mounting.
#[derive(Debug, thiserror::Error)]
pub enum MountError {
    /// The mount point is missing, not a directory, or already mounted.
    #[error("{path}: {why}")]
    MountPoint {
        /// The mount point.
        path: PathBuf,
        /// What is wrong with it, and what to do.
        why: String,
    },
    /// This build cannot mount (macOS without macFUSE).
    #[error("capsule mount is not available in this build: {0}")]
    Unavailable(&'static str),
    /// The kernel or the mount helper refused.
    #[error("mounting {path}: {source} (is FUSE available? `/dev/fuse` must exist, and without root `fusermount3` or `fusermount`)")]
    Mount {
        /// The mount point.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
}

/// How long the kernel may keep what it was told: snapshot contents never
/// change; the lists of snapshots do, when a backup or forget runs.
const TTL_CONTENT: Duration = Duration::from_secs(3600);

pub(crate) const TTL_LISTS: Duration = Duration::from_secs(1);

/// Read-ahead across the files of a directory: at most this many files,
/// and this many bytes, past the one opened.
const AHEAD_FILES: usize = 256;

const AHEAD_BYTES: u64 = 32 << 20;

/// At most this many files fetched ahead across directories at once.
const AHEAD_BEYOND_FILES: usize = 2048;

/// Entries of `versions/` listings kept, over all of them.
const LISTING_CACHE_ENTRIES: usize = 1_000_000;

pub(crate) const ROOT: u64 = 1;

pub(crate) const SNAPSHOTS: u64 = 2;

pub(crate) const HOSTS: u64 = 3;

pub(crate) const VERSIONS: u64 = 4;

pub(crate) const LATEST: u64 = 5;

/// An entry's node: in its tree (kept by the browser's cache while we
/// hold it), or on its own (a version under `versions/`).
pub(crate) enum NodeRef {
    InTree(Arc<Vec<Node>>, usize),
    Alone(Arc<Node>),
}

impl std::ops::Deref for NodeRef {
    type Target = Node;

    fn deref(&self) -> &Node {
        match self {
            NodeRef::InTree(t, i) => &t[*i],
            NodeRef::Alone(n) => n,
        }
    }
}

/// A file being read: where its content lies, and where the last read
/// ended. Kept per inode, not per open: opens cost no request at all
/// (see `open`).
pub(crate) struct Reading {
    pub(crate) map: FileMap,
    /// Where the last read ended: a read starting there reads in order.
    pub(crate) next: AtomicU64,
}

/// At most this many files' maps are kept; beyond it they are dropped and
/// made again on the next read (a file's map is its list of blobs).
const MAX_READING: usize = 4096;

/// The file system.
pub struct CapsuleFs {
    pub(crate) view: RwLock<Arc<ViewNames>>,
    refresh: Refresh,
    /// How often the snapshot lists are read again, at most.
    refresh_every: Duration,
    refreshed: Mutex<Instant>,
    pub(crate) inos: Mutex<Inodes>,
    /// Files read lately, by inode.
    pub(crate) reading: Mutex<HashMap<u64, Arc<Reading>>>,
    uid: u32,
    gid: u32,
    /// The kernel opens files without asking (`FUSE_NO_OPEN_SUPPORT`).
    pub(crate) bare_open: bool,
    /// The kernel opens directories without asking, keeps their listings,
    /// and drops them when their mtime changes (`FUSE_NO_OPENDIR_SUPPORT`
    /// and `FUSE_AUTO_INVAL_DATA`).
    pub(crate) bare_opendir: bool,
    /// Per directory inode: how far its files were fetched ahead.
    ahead_marks: Mutex<HashMap<u64, usize>>,
    /// Per directory inode: the stretch of its subdirectories last fetched
    /// ahead, as (first, end) indexes into its tree.
    beyond_marks: Mutex<HashMap<u64, (usize, usize)>>,
    /// Lists under `versions/`, by inode ([`CapsuleFs::cached_listing`]).
    listings: Mutex<Lru<u64, Arc<Listing>>>,
}

/// A view with each snapshot's directory name.
pub(crate) struct ViewNames {
    pub(crate) view: View,
    /// When this view replaced the one before: the modification time of
    /// every directory listing snapshots (the root, `snapshots/`, `hosts/`,
    /// `versions/`). The kernel keeps directory listings (see
    /// [`CapsuleFs::opendir`]) until that time changes.
    pub(crate) at: SystemTime,
    /// (name, index into view.snapshots), sorted by name.
    pub(crate) names: Vec<(String, usize)>,
}

impl ViewNames {
    pub(crate) fn new(view: View) -> Self {
        let mut seen: HashMap<String, usize> = HashMap::new();
        let mut names = Vec::new();
        for (i, (id, s)) in view.snapshots.iter().enumerate() {
            let base = s.time.clone();
            let n = seen.entry(base.clone()).or_default();
            *n += 1;
            // Several in one second: the later ones carry their ID.
            let name = if *n == 1 {
                base
            } else {
                format!("{base}-{}", id.short())
            };
            names.push((name, i));
        }
        names.sort();
        ViewNames {
            view,
            names,
            at: SystemTime::now(),
        }
    }

    pub(crate) fn by_name(&self, name: &[u8]) -> Option<usize> {
        self.names
            .binary_search_by(|(n, _)| n.as_bytes().cmp(name))
            .ok()
            .map(|i| self.names[i].1)
    }

    fn name_of(&self, i: usize) -> &str {
        self.names
            .iter()
            .find(|(_, j)| *j == i)
            .map(|(n, _)| n.as_str())
            .unwrap_or("")
    }

    fn hosts(&self) -> Vec<String> {
        let mut h: Vec<String> = self
            .view
            .snapshots
            .iter()
            .map(|(_, s)| s.hostname.clone())
            .collect();
        h.sort();
        h.dedup();
        h
    }
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The inode number of entry `name` of directory `parent`: the same every
/// time, so that a listing need not remember what it listed. Numbers
/// below 2^32 are left to the fixed inodes.
/// The files of `n` (itself, or below it when a directory, depth first in
/// name order, at most 8 levels down) while the budget lasts.
fn collect_files(
    b: &capsule_engine::browse::Browser,
    n: &Node,
    files: &mut Vec<Node>,
    bytes: &mut u64,
    depth: usize,
) {
    if files.len() >= AHEAD_BEYOND_FILES || *bytes >= AHEAD_BYTES {
        return;
    }
    match (n.kind(), &n.subtree) {
        (NodeKind::File, _) => {
            *bytes += n.size;
            files.push(n.clone());
        }
        (NodeKind::Dir, Some(sub)) if depth < 8 => {
            if let Ok(t) = b.tree(sub) {
                for c in t.iter() {
                    collect_files(b, c, files, bytes, depth + 1);
                }
            }
        }
        _ => {}
    }
}

pub(crate) fn ino_of(parent: u64, name: &[u8]) -> u64 {
    let mut h = DefaultHasher::new();
    parent.hash(&mut h);
    name.hash(&mut h);
    // The top bit is left to entries inside snapshots (`inodes::ENTRY`).
    (h.finish() & !(1 << 63)) | (1 << 40)
}

fn time(t: Timestamp) -> SystemTime {
    if t.secs >= 0 {
        UNIX_EPOCH + Duration::new(t.secs as u64, t.nanos)
    } else {
        UNIX_EPOCH - Duration::from_secs(t.secs.unsigned_abs())
    }
}

pub(crate) fn kind_of(n: &Node) -> FileType {
    match n.kind() {
        NodeKind::File => FileType::RegularFile,
        NodeKind::Dir => FileType::Directory,
        NodeKind::Symlink => FileType::Symlink,
        NodeKind::Fifo => FileType::NamedPipe,
        NodeKind::CharDev => FileType::CharDevice,
        NodeKind::BlockDev => FileType::BlockDevice,
        NodeKind::Socket => FileType::Socket,
    }
}

/// A directory inside a snapshot: its tree's ID and entries.
pub(crate) type Listed = (BlobId, Arc<Vec<Node>>);

/// What a directory lists: (name, what, kind).
type Listing = Vec<(Vec<u8>, What, FileType)>;

impl CapsuleFs {
    /// A file system showing `view`, listing it again through `refresh`
    /// at most once per `refresh_every`.
    pub fn new(view: View, refresh: Refresh, refresh_every: Duration) -> Self {
        let mut inos = Inodes::default();
        let fixed = [
            (ROOT, What::Root, ""),
            (SNAPSHOTS, What::SnapshotsDir, "snapshots"),
            (HOSTS, What::HostsDir, "hosts"),
            (VERSIONS, What::VersionsRoot, "versions"),
        ];
        for (ino, what, name) in fixed {
            inos.fixed(ino, ROOT, name, what);
        }
        CapsuleFs {
            view: RwLock::new(Arc::new(ViewNames::new(view))),
            refresh,
            refresh_every,
            refreshed: Mutex::new(Instant::now()),
            inos: Mutex::new(inos),
            reading: Mutex::new(HashMap::new()),
            uid: rustix::process::getuid().as_raw(),
            gid: rustix::process::getgid().as_raw(),
            bare_open: false,
            bare_opendir: false,
            ahead_marks: Mutex::new(HashMap::new()),
            beyond_marks: Mutex::new(HashMap::new()),
            listings: Mutex::new(Lru::new(LISTING_CACHE_ENTRIES)),
        }
    }

    pub(crate) fn view(&self) -> Arc<ViewNames> {
        self.view
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Reads the snapshot list again when it is older than
    /// `refresh_every`; called when a list of snapshots is shown or its
    /// attributes are asked for (the kernel asks before it reads a listing
    /// it keeps, to see whether the listing changed).
    pub(crate) fn maybe_refresh(&self) {
        {
            let mut at = lock(&self.refreshed);
            if at.elapsed() < self.refresh_every {
                return;
            }
            *at = Instant::now();
        }
        if let Some(v) = (self.refresh)() {
            *self.view.write().unwrap_or_else(PoisonError::into_inner) =
                Arc::new(ViewNames::new(v));
            // versions/ is a union over the snapshots: listed again.
            *lock(&self.listings) = Lru::new(LISTING_CACHE_ENTRIES);
        }
    }

    /// What directory `ino` (standing for `what`) lists. The lists under
    /// `versions/` are unions over every snapshot: built once and kept
    /// (within [`LISTING_CACHE_ENTRIES`] entries in all), since the kernel
    /// reads a listing in many calls and looks each name up after, which
    /// would otherwise build it again each time: quadratic in its size.
    pub(crate) fn cached_listing(&self, ino: u64, what: &What) -> Result<Arc<Listing>, Errno> {
        let costly = matches!(
            what,
            What::VersionsRoot | What::VersionsDir(_) | What::FileVersions(_)
        );
        if !costly {
            return self.listing(what).map(Arc::new);
        }
        if let Some(l) = lock(&self.listings).get(&ino) {
            return Ok(l);
        }
        let l = Arc::new(self.listing(what)?);
        lock(&self.listings).put(ino, l.clone(), l.len().max(1));
        Ok(l)
    }

    pub(crate) fn what(&self, ino: u64) -> Option<What> {
        lock(&self.inos).what(ino)
    }

    /// The node `what` stands for, if it is an entry: from the browser's
    /// cache of trees, which reads the tree again if it was dropped.
    pub(crate) fn node(&self, what: &What) -> Option<Result<NodeRef, Errno>> {
        match what {
            What::Entry(at) => Some(self.entry(at)),
            What::Version(n) => Some(Ok(NodeRef::Alone(n.clone()))),
            _ => None,
        }
    }

    fn entry(&self, at: &At) -> Result<NodeRef, Errno> {
        let t = self
            .view()
            .view
            .browser
            .tree(&at.tree)
            .map_err(|e| self.failed(Path::new(&at.tree.to_hex()), &e))?;
        let pos = at.pos as usize;
        if pos >= t.len() {
            return Err(Errno::EIO);
        }
        Ok(NodeRef::InTree(t, pos))
    }

    /// The path of `ino` below the mount point, for messages.
    pub(crate) fn path_of(&self, mut ino: u64) -> PathBuf {
        let mut parts = Vec::new();
        // Bounded: a path is at most this deep in any tree we could list.
        for _ in 0..4096 {
            if ino == ROOT {
                break;
            }
            let place = lock(&self.inos).place(ino);
            match place {
                Some(Place::Named(p, name)) => {
                    parts.push(name);
                    ino = p;
                }
                Some(Place::InTree(p, at)) => {
                    match self.entry(&at) {
                        Ok(n) => parts.push(n.name.clone()),
                        Err(_) => parts.push(b"?".to_vec()),
                    }
                    ino = p;
                }
                None => break,
            }
        }
        parts.iter().rev().map(|p| OsStr::from_bytes(p)).collect()
    }

    pub(crate) fn dir_attr(&self, ino: u64, mtime: SystemTime) -> FileAttr {
        FileAttr {
            ino: INodeNo(ino),
            size: 0,
            blocks: 0,
            atime: mtime,
            mtime,
            ctime: mtime,
            crtime: mtime,
            kind: FileType::Directory,
            perm: 0o555,
            nlink: 2,
            uid: self.uid,
            gid: self.gid,
            rdev: 0,
            flags: 0,
            blksize: 4096,
        }
    }

    /// The attributes of `ino`, standing for `what`.
    pub(crate) fn attr(&self, ino: u64, what: &What) -> Result<FileAttr, Errno> {
        Ok(match what {
            What::Entry(_) | What::Version(_) => {
                let n = self.node(what).ok_or(Errno::EIO)??;
                Self::entry_attr(ino, &n)
            }
            What::Link(target) => {
                let mut a = self.dir_attr(ino, self.view().at);
                a.kind = FileType::Symlink;
                a.perm = 0o777;
                a.nlink = 1;
                a.size = target.len() as u64;
                a
            }
            What::SnapRoot(_, t) => self.dir_attr(ino, time(Timestamp { secs: *t, nanos: 0 })),
            _ => self.dir_attr(ino, self.view().at),
        })
    }

    /// The attributes of `ino`, entry `n` of a snapshot.
    pub(crate) fn entry_attr(ino: u64, n: &Node) -> FileAttr {
        FileAttr {
            ino: INodeNo(ino),
            size: if n.kind() == NodeKind::Symlink {
                n.target.len() as u64
            } else {
                n.size
            },
            blocks: n.size.div_ceil(512),
            atime: time(n.atime),
            mtime: time(n.mtime),
            ctime: time(n.ctime),
            crtime: time(n.mtime),
            kind: kind_of(n),
            perm: (n.mode & 0o7777) as u16,
            nlink: n.nlink.clamp(1, u64::from(u32::MAX)) as u32,
            uid: n.uid,
            gid: n.gid,
            rdev: n.rdev as u32,
            flags: 0,
            blksize: 4096,
        }
    }

    fn latest_target(&self) -> Vec<u8> {
        let v = self.view();
        match v.view.snapshots.len().checked_sub(1) {
            Some(i) => format!("snapshots/{}", v.name_of(i)).into_bytes(),
            None => b"snapshots".to_vec(),
        }
    }

    /// Everything directory `what` lists. Inside a snapshot this is the
    /// cached tree itself, not a copy: see [`Self::tree_of`].
    fn listing(&self, what: &What) -> Result<Listing, Errno> {
        let v = self.view();
        let dir = FileType::Directory;
        Ok(match what {
            What::Root => vec![
                (b"hosts".to_vec(), What::HostsDir, dir),
                (
                    b"latest".to_vec(),
                    What::Link(self.latest_target()),
                    FileType::Symlink,
                ),
                (b"snapshots".to_vec(), What::SnapshotsDir, dir),
                (b"versions".to_vec(), What::VersionsRoot, dir),
            ],
            What::SnapshotsDir => {
                self.maybe_refresh();
                let v = self.view();
                v.names
                    .iter()
                    .map(|(n, i)| {
                        let (id, s) = &v.view.snapshots[*i];
                        (
                            n.clone().into_bytes(),
                            What::SnapRoot(*id, s.time_unix),
                            dir,
                        )
                    })
                    .collect()
            }
            What::HostsDir => {
                self.maybe_refresh();
                self.view()
                    .hosts()
                    .into_iter()
                    .map(|h| (h.clone().into_bytes(), What::Host(h), dir))
                    .collect()
            }
            What::Host(h) => v
                .names
                .iter()
                .filter(|(_, i)| v.view.snapshots[*i].1.hostname == *h)
                .map(|(n, _)| {
                    (
                        n.clone().into_bytes(),
                        What::Link(format!("../../snapshots/{n}").into_bytes()),
                        FileType::Symlink,
                    )
                })
                .collect(),
            What::VersionsRoot | What::VersionsDir(_) => {
                let base = match what {
                    What::VersionsDir(p) => p.clone(),
                    _ => PathBuf::from("/"),
                };
                v.view
                    .browser
                    .union_dir(&v.view.snapshots, &base)
                    .map_err(|e| self.failed(&base, &e))?
                    .into_iter()
                    .map(|(name, is_dir)| {
                        let p = base.join(OsStr::from_bytes(&name));
                        if is_dir {
                            (name, What::VersionsDir(p), dir)
                        } else {
                            (name, What::FileVersions(p), dir)
                        }
                    })
                    .collect()
            }
            What::FileVersions(p) => {
                let vs = v
                    .view
                    .browser
                    .versions(&v.view.snapshots, p)
                    .map_err(|e| self.failed(p, &e))?;
                let ext = p
                    .extension()
                    .map(|e| format!(".{}", e.to_string_lossy()))
                    .unwrap_or_default();
                vs.versions
                    .into_iter()
                    .map(|x| {
                        let kind = kind_of(&x.node);
                        let mut node = x.node;
                        // Named as the snapshot it first appeared in is
                        // under snapshots/: unique, and sorted by time.
                        let first = v
                            .view
                            .snapshots
                            .iter()
                            .position(|(id, _)| id.to_hex() == x.first_snapshot)
                            .map_or(x.first_time.as_str(), |i| v.name_of(i));
                        node.name = format!("{first}{ext}").into_bytes();
                        (node.name.clone(), What::Version(Arc::new(node)), kind)
                    })
                    .collect()
            }
            What::SnapRoot(..) | What::Entry(_) | What::Version(_) | What::Link(_) => {
                return Err(Errno::ENOTDIR);
            }
        })
    }

    /// The tree a directory inside a snapshot lists, and its ID, if
    /// `what` is one.
    pub(crate) fn tree_of(&self, what: &What) -> Option<Result<Listed, Errno>> {
        let v = self.view();
        let id = match what {
            What::SnapRoot(id, _) => {
                let s = v.view.snapshots.iter().find(|(i, _)| i == id)?;
                s.1.tree.parse().ok()?
            }
            What::Entry(_) | What::Version(_) => match self.node(what)? {
                Ok(n) if n.kind() == NodeKind::Dir => n.subtree?,
                Ok(_) => return None,
                Err(e) => return Some(Err(e)),
            },
            _ => return None,
        };
        Some(
            v.view
                .browser
                .tree(&id)
                .map(|t| (id, t))
                .map_err(|e| self.failed(Path::new(&id.to_hex()), &e)),
        )
    }

    /// Logs a failure and gives the error the kernel passes on.
    pub(crate) fn failed(&self, what: &Path, e: &capsule_engine::EngineError) -> Errno {
        eprintln!("capsule mount: {}: {e}", what.display());
        match e {
            capsule_engine::EngineError::PathNotFound(_) => Errno::ENOENT,
            _ => Errno::EIO,
        }
    }

    /// The inode number of entry `name` of `parent`, standing for `what`,
    /// other than an entry inside a snapshot (numbered as it is held:
    /// [`Self::hold`]).
    fn ino_for(parent: u64, name: &[u8], what: &What) -> u64 {
        match what {
            What::HostsDir => HOSTS,
            What::SnapshotsDir => SNAPSHOTS,
            What::VersionsRoot => VERSIONS,
            // `latest` is an inode per target: the kernel caches symlinks
            // (FUSE_CACHE_SYMLINKS), and a new latest snapshot must be a
            // new inode, found when the entry's 1 s expires.
            What::Link(target) if parent == ROOT => ino_of(LATEST, target),
            _ => ino_of(parent, name),
        }
    }

    /// Counts one lookup of entry `name` of `parent`, standing for `what`:
    /// the kernel is about to hold it. Its inode number.
    pub(crate) fn hold(&self, parent: u64, name: &[u8], what: What) -> u64 {
        let mut inos = lock(&self.inos);
        if let What::Entry(at) = what {
            return inos.hold_entry(at, parent);
        }
        let ino = Self::ino_for(parent, name, &what);
        inos.note(ino, parent, name, what);
        ino
    }

    /// Takes back `n` lookups of `ino`, and what was kept for it.
    pub(crate) fn let_go(&self, ino: u64, n: u64) {
        let gone = lock(&self.inos).forget(ino, n);
        match gone {
            Gone::Nothing => {}
            Gone::Inode => {
                lock(&self.reading).remove(&ino);
            }
            // The numbers of that directory's entries will stand for
            // other files: a kept map under one of them would be read for
            // another file's bytes.
            Gone::Dir(place) => lock(&self.reading).retain(|k, _| !in_place(*k, place)),
        }
    }

    /// Remembers entry `name` of `parent` (one more lookup) and answers.
    pub(crate) fn remember(&self, parent: u64, name: &[u8], what: What) -> Result<FileAttr, Errno> {
        let ino = self.hold(parent, name, what.clone());
        self.attr(ino, &what).inspect_err(|_| self.let_go(ino, 1))
    }

    /// Read-ahead across files: opening entry `index` of the tree `tree`
    /// (a directory of parent `parent`) fetches the files after it, in the
    /// order `cp -r` and most readers take them, up to [`AHEAD_FILES`]
    /// files or [`AHEAD_BYTES`], unless that stretch was fetched already.
    /// One ranged read then serves many small files, as in a restore.
    fn read_ahead_siblings(&self, parent: u64, tree: &[Node], index: usize) {
        let from = {
            let mut marks = lock(&self.ahead_marks);
            let mark = marks.entry(parent).or_insert(0);
            // Still well inside what was fetched: nothing to do yet.
            if index + AHEAD_FILES / 4 < *mark {
                return;
            }
            let from = (*mark).max(index + 1);
            *mark = (from + AHEAD_FILES).min(tree.len());
            from
        };
        let mut bytes = 0u64;
        let mut files: Vec<Node> = tree
            .iter()
            .skip(from)
            .take(AHEAD_FILES)
            .filter(|n| n.kind() == NodeKind::File)
            .take_while(|n| {
                bytes += n.size;
                bytes <= AHEAD_BYTES
            })
            .cloned()
            .collect();
        // This directory's files end within the budget: the directories
        // after it come next in `cp -r`, and in a tree of many small
        // directories (/usr/share/doc: 1,063 of about 5 files) staying in
        // one directory makes a ranged read per handful of files.
        if from + AHEAD_FILES >= tree.len() && bytes < AHEAD_BYTES {
            self.ahead_beyond(parent, &mut files, &mut bytes);
        }
        self.view().view.browser.prefetch(&files);
    }

    /// Adds to `files` the files of the directories after `dir` in its
    /// parent, depth first, within [`AHEAD_BYTES`] and [`AHEAD_BEYOND_FILES`].
    /// A new stretch is started only once the reader has reached the
    /// start of the last one, so at most two are cached ahead.
    fn ahead_beyond(&self, dir: u64, files: &mut Vec<Node>, bytes: &mut u64) {
        // Only a directory inside a snapshot has siblings to fetch.
        let Some(Place::InTree(up, at)) = lock(&self.inos).place(dir) else {
            return;
        };
        let Ok(siblings) = self.view().view.browser.tree(&at.tree) else {
            return;
        };
        let at = at.pos as usize;
        let start = {
            let marks = lock(&self.beyond_marks);
            match marks.get(&up) {
                Some(&(first, _)) if at < first => return,
                Some(&(_, end)) if at < end => end,
                _ => at + 1,
            }
        };
        let b = self.view().view.browser.clone();
        let mut i = start;
        while i < siblings.len() && files.len() < AHEAD_BEYOND_FILES && *bytes < AHEAD_BYTES {
            collect_files(&b, &siblings[i], files, bytes, 0);
            i += 1;
        }
        lock(&self.beyond_marks).insert(up, (start, i));
    }

    /// The file `ino` as being read. The first read of a file also fetches
    /// its next siblings ahead, in pack order: a tree copied out of the
    /// mount reads them next.
    pub(crate) fn reading(&self, ino: u64) -> Result<Arc<Reading>, Errno> {
        if let Some(r) = lock(&self.reading).get(&ino) {
            return Ok(r.clone());
        }
        let Some(what) = self.what(ino) else {
            return Err(Errno::ENOENT);
        };
        let n = match self.node(&what) {
            Some(n) => n?,
            None => return Err(Errno::EISDIR),
        };
        if n.kind() != NodeKind::File {
            return Err(Errno::EISDIR);
        }
        let map = match self.view().view.browser.file_map(&n) {
            Ok(m) => m,
            Err(e) => return Err(self.failed(&self.path_of(ino), &e)),
        };
        // The table's lock is let go before the read-ahead takes it again.
        let place = lock(&self.inos).place(ino);
        if let (Some(Place::InTree(parent, _)), NodeRef::InTree(tree, i)) = (place, &n) {
            self.read_ahead_siblings(parent, tree, *i);
        }
        let r = Arc::new(Reading {
            map,
            next: AtomicU64::new(0),
        });
        let mut reading = lock(&self.reading);
        if reading.len() >= MAX_READING {
            reading.clear();
        }
        reading.insert(ino, r.clone());
        Ok(r)
    }

    pub(crate) fn ttl(what: &What) -> Duration {
        match what {
            What::Entry(_) | What::Version(_) | What::SnapRoot(..) => TTL_CONTENT,
            _ => TTL_LISTS,
        }
    }
}
