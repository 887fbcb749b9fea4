//! `capsule mount`: a repository's snapshots as a read-only FUSE file
//! system.
//!
//! ```text
//! MOUNTPOINT/
//!   snapshots/<time>/…       every snapshot, as it was backed up
//!   hosts/<host>/<time>      the same, by host (links into snapshots/)
//!   latest                   a link to the newest snapshot
//!   versions/…               every path any snapshot holds; a file there
//!                            is a directory of its distinct versions
//! ```
//!
//! Everything is served from one [`Browser`](capsule_engine::browse::Browser): a directory costs its own
//! tree, from a bounded cache; a file read fetches neighbouring blobs of a
//! pack in one ranged read and reads ahead of a reader reading in order.
//! Inode numbers of entries are a hash of their parent's and their name,
//! so the same entry is the same inode however it was reached; entries the
//! kernel holds (looked up, or listed with their attributes) are
//! remembered until it forgets them.

use std::collections::hash_map::DefaultHasher;
use std::collections::HashMap;
use std::ffi::OsStr;
use std::hash::{Hash, Hasher};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use capsule_engine::browse::{FileMap, Lru};
pub use capsule_engine::browse::{Refresh, View};
use capsule_format::tree::{Node, NodeKind, Timestamp};
use capsule_format::ObjectId;
use fuser::{
    Errno, FileAttr, FileHandle, FileType, Filesystem, Generation, INodeNo, LockOwner, OpenFlags,
    ReplyAttr, ReplyData, ReplyDirectory, ReplyEntry, ReplyOpen, ReplyStatfs, ReplyXattr, Request,
};

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
const TTL_LISTS: Duration = Duration::from_secs(1);
/// Read-ahead across the files of a directory: at most this many files,
/// and this many bytes, past the one opened.
const AHEAD_FILES: usize = 256;
const AHEAD_BYTES: u64 = 32 << 20;
/// At most this many files fetched ahead across directories at once.
const AHEAD_BEYOND_FILES: usize = 2048;
/// Entries of `versions/` listings kept, over all of them.
const LISTING_CACHE_ENTRIES: usize = 1_000_000;

const ROOT: u64 = 1;
const SNAPSHOTS: u64 = 2;
const HOSTS: u64 = 3;
const VERSIONS: u64 = 4;
const LATEST: u64 = 5;

/// What an inode stands for.
#[derive(Clone)]
enum What {
    Root,
    SnapshotsDir,
    HostsDir,
    Host(String),
    VersionsRoot,
    Link(Vec<u8>),
    /// The root of snapshot `.0` (its index in the view), made at `.1`.
    SnapRoot(ObjectId, i64),
    /// An entry inside a snapshot.
    Entry(Arc<Node>),
    /// A directory under `versions/`: the snapshot path it mirrors.
    VersionsDir(PathBuf),
    /// A file under `versions/`: a directory of its versions.
    FileVersions(PathBuf),
}

struct Ino {
    what: What,
    parent: u64,
    name: Vec<u8>,
    lookups: u64,
}

/// A file being read: where its content lies, and where the last read
/// ended. Kept per inode, not per open: opens cost no request at all
/// (see `open`).
struct Reading {
    map: FileMap,
    /// Where the last read ended: a read starting there reads in order.
    next: AtomicU64,
}

/// At most this many files' maps are kept; beyond it they are dropped and
/// made again on the next read (a file's map is its list of blobs).
const MAX_READING: usize = 4096;

/// The file system.
pub struct CapsuleFs {
    view: RwLock<Arc<ViewNames>>,
    refresh: Refresh,
    /// How often the snapshot lists are read again, at most.
    refresh_every: Duration,
    refreshed: Mutex<Instant>,
    inos: Mutex<HashMap<u64, Ino>>,
    /// Files read lately, by inode.
    reading: Mutex<HashMap<u64, Arc<Reading>>>,
    uid: u32,
    gid: u32,
    /// The kernel opens files without asking (`FUSE_NO_OPEN_SUPPORT`).
    bare_open: bool,
    /// The kernel opens directories without asking, keeps their listings,
    /// and drops them when their mtime changes (`FUSE_NO_OPENDIR_SUPPORT`
    /// and `FUSE_AUTO_INVAL_DATA`).
    bare_opendir: bool,
    /// Per directory inode: how far its files were fetched ahead.
    ahead_marks: Mutex<HashMap<u64, usize>>,
    /// Per directory inode: the stretch of its subdirectories last fetched
    /// ahead, as (first, end) indexes into its tree.
    beyond_marks: Mutex<HashMap<u64, (usize, usize)>>,
    /// Lists under `versions/`, by inode ([`CapsuleFs::cached_listing`]).
    listings: Mutex<Lru<u64, Arc<Listing>>>,
}

/// A view with each snapshot's directory name.
struct ViewNames {
    view: View,
    /// When this view replaced the one before: the modification time of
    /// every directory listing snapshots (the root, `snapshots/`, `hosts/`,
    /// `versions/`). The kernel keeps directory listings (see
    /// [`CapsuleFs::opendir`]) until that time changes.
    at: SystemTime,
    /// (name, index into view.snapshots), sorted by name.
    names: Vec<(String, usize)>,
}

impl ViewNames {
    fn new(view: View) -> Self {
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

    fn by_name(&self, name: &[u8]) -> Option<usize> {
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

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
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

fn ino_of(parent: u64, name: &[u8]) -> u64 {
    let mut h = DefaultHasher::new();
    parent.hash(&mut h);
    name.hash(&mut h);
    h.finish() | (1 << 40)
}

fn time(t: Timestamp) -> SystemTime {
    if t.secs >= 0 {
        UNIX_EPOCH + Duration::new(t.secs as u64, t.nanos)
    } else {
        UNIX_EPOCH - Duration::from_secs(t.secs.unsigned_abs())
    }
}

fn kind_of(n: &Node) -> FileType {
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

/// What a directory lists: (name, what, kind).
type Listing = Vec<(Vec<u8>, What, FileType)>;

impl CapsuleFs {
    /// A file system showing `view`, listing it again through `refresh`
    /// at most once per `refresh_every`.
    pub fn new(view: View, refresh: Refresh, refresh_every: Duration) -> Self {
        let mut inos = HashMap::new();
        let fixed = [
            (ROOT, What::Root, ""),
            (SNAPSHOTS, What::SnapshotsDir, "snapshots"),
            (HOSTS, What::HostsDir, "hosts"),
            (VERSIONS, What::VersionsRoot, "versions"),
        ];
        for (ino, what, name) in fixed {
            inos.insert(
                ino,
                Ino {
                    what,
                    parent: ROOT,
                    name: name.as_bytes().to_vec(),
                    lookups: 0,
                },
            );
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

    fn view(&self) -> Arc<ViewNames> {
        self.view
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Reads the snapshot list again when it is older than
    /// `refresh_every`; called when a list of snapshots is shown or its
    /// attributes are asked for (the kernel asks before it reads a listing
    /// it keeps, to see whether the listing changed).
    fn maybe_refresh(&self) {
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
    fn cached_listing(&self, ino: u64, what: &What) -> Result<Arc<Listing>, Errno> {
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

    fn what(&self, ino: u64) -> Option<What> {
        lock(&self.inos).get(&ino).map(|i| i.what.clone())
    }

    /// The path of `ino` below the mount point, for messages.
    fn path_of(&self, mut ino: u64) -> PathBuf {
        let inos = lock(&self.inos);
        let mut parts = Vec::new();
        while ino != ROOT {
            let Some(i) = inos.get(&ino) else { break };
            parts.push(i.name.clone());
            ino = i.parent;
        }
        parts.iter().rev().map(|p| OsStr::from_bytes(p)).collect()
    }

    fn dir_attr(&self, ino: u64, mtime: SystemTime) -> FileAttr {
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

    fn attr(&self, ino: u64, what: &What) -> FileAttr {
        match what {
            What::Entry(n) => FileAttr {
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
            },
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
                        (node.name.clone(), What::Entry(Arc::new(node)), kind)
                    })
                    .collect()
            }
            What::SnapRoot(..) | What::Entry(_) | What::Link(_) => {
                return Err(Errno::ENOTDIR);
            }
        })
    }

    /// The tree a directory inside a snapshot lists, if `what` is one.
    fn tree_of(&self, what: &What) -> Option<Result<Arc<Vec<Node>>, Errno>> {
        let v = self.view();
        let id = match what {
            What::SnapRoot(id, _) => {
                let s = v.view.snapshots.iter().find(|(i, _)| i == id)?;
                s.1.tree.parse().ok()?
            }
            What::Entry(n) if n.kind() == NodeKind::Dir => n.subtree?,
            _ => return None,
        };
        Some(
            v.view
                .browser
                .tree(&id)
                .map_err(|e| self.failed(Path::new(&id.to_hex()), &e)),
        )
    }

    /// Logs a failure and gives the error the kernel passes on.
    fn failed(&self, what: &Path, e: &capsule_engine::EngineError) -> Errno {
        eprintln!("capsule mount: {}: {e}", what.display());
        match e {
            capsule_engine::EngineError::PathNotFound(_) => Errno::ENOENT,
            _ => Errno::EIO,
        }
    }

    /// The inode number of entry `name` of `parent`, standing for `what`.
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

    /// Remembers entry `name` of `parent` (one more lookup) and answers.
    fn remember(&self, parent: u64, name: &[u8], what: What) -> FileAttr {
        let ino = Self::ino_for(parent, name, &what);
        let attr = self.attr(ino, &what);
        self.note(ino, parent, name, what);
        attr
    }

    /// Counts one lookup of `ino`, which the kernel now holds.
    fn note(&self, ino: u64, parent: u64, name: &[u8], what: What) {
        let mut inos = lock(&self.inos);
        let e = inos.entry(ino).or_insert(Ino {
            what,
            parent,
            name: name.to_vec(),
            lookups: 0,
        });
        e.lookups += 1;
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
        let Some((up, name)) = lock(&self.inos)
            .get(&dir)
            .map(|i| (i.parent, i.name.clone()))
        else {
            return;
        };
        let Some(Ok(siblings)) = self.what(up).and_then(|w| self.tree_of(&w)) else {
            return;
        };
        let Ok(at) = siblings.binary_search_by(|x| x.name.as_slice().cmp(&name)) else {
            return;
        };
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
    fn reading(&self, ino: u64) -> Result<Arc<Reading>, Errno> {
        if let Some(r) = lock(&self.reading).get(&ino) {
            return Ok(r.clone());
        }
        let Some(What::Entry(n)) = self.what(ino) else {
            return Err(Errno::ENOENT);
        };
        if n.kind() != NodeKind::File {
            return Err(Errno::EISDIR);
        }
        let map = match self.view().view.browser.file_map(&n) {
            Ok(m) => m,
            Err(e) => return Err(self.failed(&self.path_of(ino), &e)),
        };
        let parent = lock(&self.inos)
            .get(&ino)
            .map(|i| (i.parent, i.name.clone()));
        if let Some((parent, name)) = parent {
            if let Some(Ok(tree)) = self.what(parent).and_then(|w| self.tree_of(&w)) {
                if let Ok(i) = tree.binary_search_by(|x| x.name.as_slice().cmp(&name)) {
                    self.read_ahead_siblings(parent, &tree, i);
                }
            }
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

    fn ttl(what: &What) -> Duration {
        match what {
            What::Entry(_) | What::SnapRoot(..) => TTL_CONTENT,
            _ => TTL_LISTS,
        }
    }
}

impl Filesystem for CapsuleFs {
    fn init(&mut self, _req: &Request, config: &mut fuser::KernelConfig) -> std::io::Result<()> {
        use fuser::InitFlags as F;
        // Attributes with every listing: a lookup per name saved. Not
        // only when the kernel guesses they are wanted
        // (`FUSE_READDIRPLUS_AUTO`): it guesses so for the first 4 KiB of
        // a listing only, since `ls -l` and `cp -r` read a whole directory
        // before they look at its entries, and every entry past those then
        // cost a LOOKUP (1,023 copying /usr/share/doc; `ls -l` of 100,000
        // files 7.2 s, now 4.5 s). A plain `ls -f` of 100,000 pays for it:
        // 0.09 s, now 0.38 s.
        let wanted = F::FUSE_DO_READDIRPLUS
                // Symlink targets kept by the kernel: a path through
                // `latest` otherwise costs a READLINK for every file
                // `cp -r` touches (12,475 of 24,000 requests copying
                // /usr/share/doc).
                | F::FUSE_CACHE_SYMLINKS
                // A directory listing the kernel keeps is dropped when
                // the directory's mtime changes (see `opendir`).
                | F::FUSE_AUTO_INVAL_DATA;
        // What this kernel has of it (each is an optimization).
        let has = config.capabilities();
        let _ = config.add_capabilities(wanted & has);
        self.bare_open = has.contains(F::FUSE_NO_OPEN_SUPPORT);
        self.bare_opendir = has.contains(F::FUSE_NO_OPENDIR_SUPPORT | F::FUSE_AUTO_INVAL_DATA);
        // Larger reads ahead of a reader in the kernel too.
        let _ = config.set_max_readahead(1 << 20);
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let parent = u64::from(parent);
        let Some(pw) = self.what(parent) else {
            return reply.error(Errno::ENOENT);
        };
        let name = name.as_bytes();
        let found = match self.tree_of(&pw) {
            Some(Ok(t)) => t
                .binary_search_by(|n| n.name.as_slice().cmp(name))
                .ok()
                .map(|i| What::Entry(Arc::new(t[i].clone()))),
            Some(Err(e)) => return reply.error(e),
            None => {
                if pw_is_snapshots(&pw) {
                    let v = self.view();
                    v.by_name(name).map(|i| {
                        let (id, s) = &v.view.snapshots[i];
                        What::SnapRoot(*id, s.time_unix)
                    })
                } else {
                    match self.cached_listing(parent, &pw) {
                        Ok(l) => l
                            .iter()
                            .find(|(n, _, _)| n == name)
                            .map(|(_, w, _)| w.clone()),
                        Err(e) => return reply.error(e),
                    }
                }
            }
        };
        match found {
            Some(w) => {
                let ttl = Self::ttl(&w);
                let attr = self.remember(parent, name, w);
                reply.entry(&ttl, &attr, Generation(0));
            }
            None => reply.error(Errno::ENOENT),
        }
    }

    fn forget(&self, _req: &Request, ino: INodeNo, nlookup: u64) {
        let ino = u64::from(ino);
        if ino <= LATEST {
            return;
        }
        let mut inos = lock(&self.inos);
        if let Some(i) = inos.get_mut(&ino) {
            i.lookups = i.lookups.saturating_sub(nlookup);
            if i.lookups == 0 {
                inos.remove(&ino);
                lock(&self.reading).remove(&ino);
            }
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        let ino = u64::from(ino);
        let what = self.what(ino);
        // A listing of snapshots the kernel keeps is used again only while
        // its directory's mtime, the time the view last changed, stays.
        if what.as_ref().is_some_and(lists_snapshots) {
            self.maybe_refresh();
        }
        match what {
            Some(w) => reply.attr(&Self::ttl(&w), &self.attr(ino, &w)),
            None => reply.error(Errno::ENOENT),
        }
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        let ino = u64::from(ino);
        match self.what(ino) {
            Some(What::Link(t)) => reply.data(&t),
            Some(What::Entry(n)) if n.kind() == NodeKind::Symlink => reply.data(&n.target),
            Some(_) => reply.error(Errno::EINVAL),
            None => reply.error(Errno::ENOENT),
        }
    }

    /// Opening a directory asks nothing of us either: answered ENOSYS, the
    /// kernel opens directories without a request from then on, sends no
    /// RELEASEDIR, and keeps what it read of a directory
    /// (`FOPEN_CACHE_DIR`): copying a tree of 1,000 directories costs
    /// 2,000 requests fewer. A kept listing is read again once its
    /// directory's mtime changes (`FUSE_AUTO_INVAL_DATA`), which for the
    /// directories listing snapshots is when the view last changed;
    /// inside a snapshot nothing changes.
    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        match self.what(u64::from(ino)) {
            Some(What::Entry(n)) if n.kind() != NodeKind::Dir => reply.error(Errno::ENOTDIR),
            Some(What::Link(_)) => reply.error(Errno::ENOTDIR),
            Some(_) if self.bare_opendir => reply.error(Errno::ENOSYS),
            Some(_) => reply.opened(FileHandle(0), fuser::FopenFlags::empty()),
            None => reply.error(Errno::ENOENT),
        }
    }

    /// Opening a file asks nothing of us: answered ENOSYS, the kernel
    /// opens files without a request from then on (and sends no RELEASE),
    /// keeping their page cache (the kernel's default for such opens).
    /// Copying a tree out of the mount then costs a READ per file, not
    /// OPEN, READ and RELEASE.
    fn open(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        match self.what(u64::from(ino)) {
            Some(What::Entry(n)) if n.kind() == NodeKind::File && self.bare_open => {
                reply.error(Errno::ENOSYS)
            }
            Some(What::Entry(n)) if n.kind() == NodeKind::File => {
                reply.opened(FileHandle(0), fuser::FopenFlags::FOPEN_KEEP_CACHE)
            }
            Some(What::Entry(_)) => reply.error(Errno::EINVAL),
            Some(_) => reply.error(Errno::EISDIR),
            None => reply.error(Errno::ENOENT),
        }
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let ino = u64::from(ino);
        let r = match self.reading(ino) {
            Ok(r) => r,
            Err(e) => return reply.error(e),
        };
        let in_order = r.next.swap(offset + u64::from(size), Ordering::Relaxed) == offset;
        let browser = self.view().view.browser.clone();
        match browser.read_at(&r.map, offset, size as usize, in_order) {
            Ok(b) => reply.data(&b),
            Err(e) => reply.error(self.failed(&self.path_of(ino), &e)),
        }
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let ino = u64::from(ino);
        let Some(w) = self.what(ino) else {
            return reply.error(Errno::ENOENT);
        };
        let parent = lock(&self.inos).get(&ino).map_or(ROOT, |i| i.parent);
        // Offsets: 1 and 2 are "." and "..", then entry k at k + 3.
        let mut at = offset;
        if at == 0 {
            if reply.add(INodeNo(ino), 1, FileType::Directory, ".") {
                return reply.ok();
            }
            at = 1;
        }
        if at == 1 {
            if reply.add(INodeNo(parent), 2, FileType::Directory, "..") {
                return reply.ok();
            }
            at = 2;
        }
        let skip = (at - 2) as usize;
        match self.tree_of(&w) {
            Some(Ok(t)) => {
                for (k, n) in t.iter().enumerate().skip(skip) {
                    let full = reply.add(
                        INodeNo(ino_of(ino, &n.name)),
                        k as u64 + 3,
                        kind_of(n),
                        OsStr::from_bytes(&n.name),
                    );
                    if full {
                        break;
                    }
                }
                reply.ok();
            }
            Some(Err(e)) => reply.error(e),
            None => match self.cached_listing(ino, &w) {
                Ok(l) => {
                    for (k, (name, what, kind)) in l.iter().enumerate().skip(skip) {
                        let child = match what {
                            What::HostsDir => HOSTS,
                            What::SnapshotsDir => SNAPSHOTS,
                            What::VersionsRoot => VERSIONS,
                            What::Link(target) if ino == ROOT => ino_of(LATEST, target),
                            _ => ino_of(ino, name),
                        };
                        if reply.add(INodeNo(child), k as u64 + 3, *kind, OsStr::from_bytes(name)) {
                            break;
                        }
                    }
                    reply.ok();
                }
                Err(e) => reply.error(e),
            },
        }
    }

    fn readdirplus(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: fuser::ReplyDirectoryPlus,
    ) {
        let ino = u64::from(ino);
        let Some(w) = self.what(ino) else {
            return reply.error(Errno::ENOENT);
        };
        let parent = lock(&self.inos).get(&ino).map_or(ROOT, |i| i.parent);
        // "." and ".." carry attributes too, but the kernel takes no
        // reference on them: they are not counted as lookups.
        let mut at = offset;
        for (k, (name, i)) in [(".", ino), ("..", parent)].into_iter().enumerate() {
            if at == k as u64 {
                let attr = self.dir_attr(i, self.view().at);
                if reply.add(INodeNo(i), at + 1, name, &TTL_LISTS, &attr, Generation(0)) {
                    return reply.ok();
                }
                at += 1;
            }
        }
        let skip = (at - 2) as usize;
        // Entries as (name, what); only those the reply took are counted.
        let mut add = |k: usize, name: &[u8], what: What| -> bool {
            let child = Self::ino_for(ino, name, &what);
            let attr = self.attr(child, &what);
            let ttl = Self::ttl(&what);
            let full = reply.add(
                INodeNo(child),
                k as u64 + 3,
                OsStr::from_bytes(name),
                &ttl,
                &attr,
                Generation(0),
            );
            if !full {
                self.note(child, ino, name, what);
            }
            full
        };
        match self.tree_of(&w) {
            Some(Ok(t)) => {
                for (k, n) in t.iter().enumerate().skip(skip) {
                    if add(k, &n.name, What::Entry(Arc::new(n.clone()))) {
                        break;
                    }
                }
            }
            Some(Err(e)) => return reply.error(e),
            None => match self.cached_listing(ino, &w) {
                Ok(l) => {
                    for (k, (name, what, _)) in l.iter().enumerate().skip(skip) {
                        if add(k, name, what.clone()) {
                            break;
                        }
                    }
                }
                Err(e) => return reply.error(e),
            },
        }
        reply.ok();
    }

    fn getxattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        let Some(What::Entry(n)) = self.what(u64::from(ino)) else {
            return reply.error(Errno::NO_XATTR);
        };
        match n
            .xattrs
            .iter()
            .find(|(k, _)| k.as_slice() == name.as_bytes())
        {
            Some((_, v)) if size == 0 => reply.size(v.len() as u32),
            Some((_, v)) if v.len() <= size as usize => reply.data(v),
            Some(_) => reply.error(Errno::ERANGE),
            None => reply.error(Errno::NO_XATTR),
        }
    }

    fn listxattr(&self, _req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        let mut names = Vec::new();
        if let Some(What::Entry(n)) = self.what(u64::from(ino)) {
            for (k, _) in &n.xattrs {
                names.extend_from_slice(k);
                names.push(0);
            }
        }
        if size == 0 {
            reply.size(names.len() as u32);
        } else if names.len() <= size as usize {
            reply.data(&names);
        } else {
            reply.error(Errno::ERANGE);
        }
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        reply.statfs(0, 0, 0, 0, 0, 4096, 255, 4096);
    }
}

fn pw_is_snapshots(w: &What) -> bool {
    matches!(w, What::SnapshotsDir)
}

/// Whether directory `w` lists snapshots, or paths over all of them:
/// its listing changes when a backup or forget runs.
fn lists_snapshots(w: &What) -> bool {
    matches!(
        w,
        What::Root
            | What::SnapshotsDir
            | What::HostsDir
            | What::Host(_)
            | What::VersionsRoot
            | What::VersionsDir(_)
            | What::FileVersions(_)
    )
}

/// Checks that `path` can be mounted on: an existing directory, not a
/// mount point already.
pub fn check_mount_point(path: &Path) -> Result<(), MountError> {
    let bad = |why: String| MountError::MountPoint {
        path: path.to_path_buf(),
        why,
    };
    let m = std::fs::metadata(path).map_err(|e| {
        bad(match e.kind() {
            std::io::ErrorKind::NotFound => {
                "no such directory (create it first: mkdir -p …)".to_string()
            }
            // A FUSE mount whose process died answers ENOTCONN.
            _ if e.raw_os_error() == Some(libc::ENOTCONN) => {
                "a mount whose process has gone is still there: `fusermount -u` it (or `umount -l`)"
                    .to_string()
            }
            _ => e.to_string(),
        })
    })?;
    if !m.is_dir() {
        return Err(bad("not a directory".into()));
    }
    let abs = std::fs::canonicalize(path).map_err(|e| bad(e.to_string()))?;
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let busy = mounts.lines().any(|l| {
        l.split(' ')
            .nth(4)
            .is_some_and(|p| Path::new(&unescape_mountinfo(p)) == abs)
    });
    if busy {
        return Err(bad(
            "something is mounted there already (unmount it first: `fusermount -u` or `umount`)"
                .into(),
        ));
    }
    Ok(())
}

/// mountinfo escapes space, tab, newline and backslash as octal.
fn unescape_mountinfo(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 3 < b.len() && b[i + 1..i + 4].iter().all(u8::is_ascii_digit) {
            let v = (b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0');
            out.push(v);
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// A mounted file system; dropping it unmounts.
pub struct Mounted {
    session: Option<fuser::BackgroundSession>,
    path: PathBuf,
}

impl Mounted {
    /// Whether the file system was unmounted from outside (`umount`).
    pub fn ended(&self) -> bool {
        self.session.as_ref().is_none_or(|s| s.guard.is_finished())
    }

    /// Unmounts and waits for the session to end. When something still
    /// uses the mount (a shell inside it, an open file), detaches it
    /// instead: it is gone from the tree at once, and what held it gets
    /// errors once this process ends. Returns whether it was busy.
    pub fn unmount(mut self) -> std::io::Result<bool> {
        let Some(s) = self.session.take() else {
            return Ok(false);
        };
        match s.umount_and_join() {
            Ok(()) => Ok(false),
            Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {
                rustix::mount::unmount(&self.path, rustix::mount::UnmountFlags::DETACH)?;
                Ok(true)
            }
            Err(e) => Err(e),
        }
    }
}

/// Mounts `fs` read-only on `path`, served by `threads` threads.
pub fn mount(fs: CapsuleFs, path: &Path, threads: usize) -> Result<Mounted, MountError> {
    check_mount_point(path)?;
    let mut config = fuser::Config::default();
    config.mount_options = vec![
        fuser::MountOption::RO,
        fuser::MountOption::FSName("capsule".into()),
        fuser::MountOption::Subtype("capsule".into()),
        fuser::MountOption::DefaultPermissions,
    ];
    config.n_threads = Some(threads.max(1));
    let err = |source| MountError::Mount {
        path: path.to_path_buf(),
        source,
    };
    let session = fuser::Session::new(fs, path, &config).map_err(err)?;
    Ok(Mounted {
        session: Some(session.spawn().map_err(err)?),
        path: path.to_path_buf(),
    })
}
