//! From a location, credentials and a cache policy to an open repository.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use capsule_backend::{CacheStats, CachingBackend, LabBackend};
use capsule_engine::repo::InitOptions;
use capsule_engine::{EarlyKey, EngineError, KeyHint, Repository};
use capsule_format::ObjectId;
use capsule_net::Destination;

use crate::stack::{Connect, Stack};
use capsule_engine::Result;

/// Where this machine keeps what only saves work: the per-repository cache
/// of index files, snapshots and trees, the resume journal, the damaged-pack
/// memory, and the key hints.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CachePolicy {
    /// Keep nothing (`--no-cache`): every command reads the destination and
    /// derives the key after reading the key file.
    Off,
    /// Keep it below this directory (one subdirectory per repository ID).
    In(PathBuf),
}

impl CachePolicy {
    /// The user's cache directory (`~/.cache/capsule`), or off without one.
    pub fn user_default() -> CachePolicy {
        dirs::cache_dir().map_or(CachePolicy::Off, |d| CachePolicy::In(d.join("capsule")))
    }
}

/// Everything needed to open one repository.
#[derive(Debug, Clone)]
pub struct Access {
    /// Where the repository is.
    pub dest: Destination,
    /// How to reach it.
    pub connect: Connect,
    /// What this machine keeps for it.
    pub cache: CachePolicy,
}

/// The most a key hint file holds (one line of about 100 bytes).
const KEY_HINT_MAX: u64 = 512;

/// Where `check` leaves the packs it found missing or damaged, for the
/// next backup on this machine to stop relying on (one pack name a line).
pub const DAMAGED_PACKS: &str = "damaged-packs";

/// Where the index's tables are, in the repository's cache directory.
pub const INDEX_TABLES: &str = "index-tables";

/// What a backup interrupted before its packs were indexed left, in the
/// repository's cache directory (the engine's resume journal).
pub const RESUME_JOURNAL: &str = "unindexed-packs";

impl Access {
    /// A repository at `dest`, credentials from the environment, the user's
    /// cache directory.
    pub fn new(dest: Destination) -> Access {
        Access {
            connect: Connect::from_env(&dest),
            dest,
            cache: CachePolicy::user_default(),
        }
    }

    /// Connects (building the [`Stack`]).
    pub fn connect(&self, create: bool) -> Result<Stack> {
        Stack::connect(&self.dest, &self.connect, create)
    }

    /// Connects and opens with `password`, the cache on top: what most
    /// callers want. The key derivation starts first, from this machine's
    /// hint, so that on a network destination it runs while the connection
    /// is made and the key files are read.
    pub fn open(&self, password: &[u8]) -> Result<Opened> {
        let early = self.start_key(password);
        self.connect(false)?.open(self, password, early)
    }

    /// Creates a repository at the location and opens it.
    pub fn init(&self, password: &[u8], opts: &InitOptions) -> Result<Opened> {
        self.connect(true)?.init(self, password, opts)
    }

    /// The cache directory of the repository with this ID (`None` when the
    /// cache is off).
    pub fn cache_dir(&self, repo_id: &str) -> Option<PathBuf> {
        match &self.cache {
            CachePolicy::Off => None,
            CachePolicy::In(base) => Some(base.join(repo_id)),
        }
    }

    /// The file holding the salt and cost of the key that last opened the
    /// repository at this location. Keyed by the location, since the
    /// repository's ID is only known once it is open.
    fn key_hint_path(&self) -> Option<PathBuf> {
        let CachePolicy::In(base) = &self.cache else {
            return None;
        };
        let id = ObjectId::of(self.dest.to_string().as_bytes()).to_hex();
        Some(base.join("key-hints").join(&id[..32]))
    }

    /// This machine's hint for the repository's key, if one is kept and is
    /// no costlier than the default: a hint is a local file that anything
    /// with the user's rights can plant, and a planted costly one must cost
    /// nothing ([`KeyHint::costs_at_most`]).
    pub fn key_hint(&self) -> Option<KeyHint> {
        let text = read_own_file(&self.key_hint_path()?, KEY_HINT_MAX)?;
        KeyHint::parse(&String::from_utf8_lossy(&text))
            .filter(|h| h.costs_at_most(capsule_crypto::KdfParams::default()))
    }

    /// Starts deriving the key of `password` from this machine's hint
    /// (`None` without one).
    pub fn start_key(&self, password: &[u8]) -> Option<EarlyKey> {
        Some(EarlyKey::start(password, self.key_hint()?))
    }

    /// Keeps the opened key's salt and cost for the next run. Best effort:
    /// without it the next run derives the key after reading the key file,
    /// as it would anyway.
    pub fn remember_key(&self, repo: &Repository) {
        let Some(path) = self.key_hint_path() else {
            return;
        };
        let text = repo.key_hint().to_text();
        if capsule_backend::ownfile::read_bounded(&path, KEY_HINT_MAX)
            .is_ok_and(|old| old == text.as_bytes())
        {
            return;
        }
        let _ = write_own_file(&path, text.as_bytes());
    }

    /// A local directory that holds no repository, where one on a file
    /// system of its own last opened: away (an unplugged disk's mount
    /// point), not missing ([`crate::place`]).
    fn away(&self, e: EngineError) -> EngineError {
        match (&self.dest, &e) {
            (Destination::Local(p), EngineError::NotARepository { .. }) => {
                match crate::place::away(p) {
                    Some(why) => capsule_backend::BackendError::new(
                        capsule_backend::ErrorKind::Unreachable,
                        "open",
                        &p.display().to_string(),
                        why,
                    )
                    .into(),
                    None => e,
                }
            }
            _ => e,
        }
    }

    fn finish_open(
        &self,
        stack: Stack,
        repo: Repository,
        t: Instant,
        cached: bool,
    ) -> Result<Opened> {
        if let Destination::Local(p) = &self.dest {
            crate::place::remember(p);
        }
        self.remember_key(&repo);
        let warnings = repo.open_warnings().iter().map(|w| w.to_string()).collect();
        let dir = self.cache_dir(&repo.config().id);
        let mut cache = None;
        // The index's tables live beside the cache, also when opened
        // direct: they are checked against the repository key, and built
        // again from the index files when they do not hold.
        let repo = match &dir {
            Some(d) => repo.with_index_dir(d.join(INDEX_TABLES)),
            None => repo,
        };
        let repo = match dir.clone().filter(|_| cached) {
            None => repo,
            // The cache only saves time: if it cannot be created, work
            // without it, and say so.
            Some(dir) => match CachingBackend::new(stack.backend.clone(), &dir) {
                Ok(c) => {
                    cache = Some(Cache {
                        stats: c.stats(),
                        dir,
                    });
                    repo.with_backend(Arc::new(c))
                }
                Err(e) => {
                    eprintln!(
                        "warning: running without a local cache: cannot create {}: {e} (set CAPSULE_CACHE_DIR to a writable directory)",
                        dir.display()
                    );
                    repo
                }
            },
        };
        Ok(Opened {
            repo,
            open_secs: t.elapsed().as_secs_f64(),
            stack,
            cache,
            warnings,
            local: match &self.dest {
                Destination::Local(p) => Some(p.clone()),
                _ => None,
            },
            cache_dir: dir,
        })
    }
}

impl Stack {
    /// Creates a repository on this stack (connected with `create`) and
    /// opens it, the cache on top.
    pub fn init(self, access: &Access, password: &[u8], opts: &InitOptions) -> Result<Opened> {
        let t = Instant::now();
        let repo = Repository::init(self.backend.clone(), password, opts)?;
        access.finish_open(self, repo, t, true)
    }

    /// Creates a repository on this stack that cuts files and names blobs
    /// as `like` does (see [`Repository::init_like`]), and opens it.
    pub fn init_like(
        self,
        access: &Access,
        password: &[u8],
        opts: &InitOptions,
        like: &Repository,
    ) -> Result<Opened> {
        let t = Instant::now();
        let repo = Repository::init_like(self.backend.clone(), password, opts, like)?;
        access.finish_open(self, repo, t, true)
    }

    /// Opens the repository on this stack with `password` (and a key
    /// derivation already under way or done, for the key file it was
    /// started for), and puts the cache on top when `access` keeps one.
    pub fn open(self, access: &Access, password: &[u8], early: Option<EarlyKey>) -> Result<Opened> {
        let t = Instant::now();
        let repo = Repository::open_with_early_key(self.backend.clone(), password, early)
            .map_err(|e| access.away(e))?;
        access.finish_open(self, repo, t, true)
    }

    /// [`open`](Self::open) without the cache layer: for `check` and
    /// `repair`, which must read the destination itself. The cache
    /// directory is still known ([`Opened::cache_dir`]).
    pub fn open_direct(
        self,
        access: &Access,
        password: &[u8],
        early: Option<EarlyKey>,
    ) -> Result<Opened> {
        let t = Instant::now();
        let repo = Repository::open_with_early_key(self.backend.clone(), password, early)
            .map_err(|e| access.away(e))?;
        access.finish_open(self, repo, t, false)
    }
}

/// The local cache in front of a repository.
#[derive(Debug, Clone)]
pub struct Cache {
    /// Hits, fetches.
    pub stats: Arc<CacheStats>,
    /// The repository's cache directory.
    pub dir: PathBuf,
}

/// An open repository with what was built to reach it.
#[derive(Debug)]
pub struct Opened {
    /// The repository, on the cache when there is one.
    pub repo: Repository,
    /// The stack under it, with its counters.
    pub stack: Stack,
    /// The cache, unless off (or opened direct).
    pub cache: Option<Cache>,
    /// Damaged or stray key files seen while opening (another key opened
    /// the repository).
    pub warnings: Vec<String>,
    /// Seconds from the connection to the open repository (key files,
    /// config, key derivation).
    pub open_secs: f64,
    /// The repository's directory, when local.
    pub local: Option<PathBuf>,
    /// The repository's cache directory, also when opened direct.
    cache_dir: Option<PathBuf>,
}

impl Opened {
    /// The repository's cache directory (also when opened direct).
    pub fn cache_dir(&self) -> Option<&Path> {
        self.cache_dir.as_deref()
    }

    /// The packs the last `check` on this machine found missing or damaged.
    pub fn damaged_packs(&self) -> Vec<ObjectId> {
        self.cache_dir().map(read_damaged_packs).unwrap_or_default()
    }

    /// Records what `check` found (an empty list removes the record).
    pub fn write_damaged_packs(&self, packs: &[String]) -> std::io::Result<()> {
        match self.cache_dir() {
            Some(dir) => write_damaged_packs(dir, packs),
            None => Ok(()),
        }
    }

    /// The top of the stack, under the cache.
    pub fn backend(&self) -> Arc<dyn LabBackend> {
        self.stack.backend.clone()
    }
}

/// The packs the last `check` found missing or damaged.
pub fn read_damaged_packs(dir: &Path) -> Vec<ObjectId> {
    // A line a pack (about 80 bytes): room for 200,000 of them.
    let Some(text) = read_own_file(&dir.join(DAMAGED_PACKS), 16 << 20) else {
        return Vec::new();
    };
    String::from_utf8_lossy(&text)
        .lines()
        .filter_map(|l| l.rsplit('/').next()?.parse().ok())
        .collect()
}

/// Records what `check` found (an empty list removes the record).
pub fn write_damaged_packs(dir: &Path, packs: &[String]) -> std::io::Result<()> {
    let p = dir.join(DAMAGED_PACKS);
    if packs.is_empty() {
        return match std::fs::remove_file(&p) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        };
    }
    write_own_file(&p, (packs.join("\n") + "\n").as_bytes())
}

/// Reads a file capsule keeps for itself (cache or state directory), at
/// most `max` bytes, regular files only
/// ([`capsule_backend::ownfile::read_bounded`]). Nothing there is `None`;
/// anything else that cannot be read is `None` with a warning, since such a
/// file only ever saves work.
pub fn read_own_file(path: &Path, max: u64) -> Option<Vec<u8>> {
    match capsule_backend::ownfile::read_bounded(path, max) {
        Ok(b) => Some(b),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => {
            eprintln!(
                "warning: {}: ignored ({e}); capsule keeps this file only to save work, and will write it again",
                path.display()
            );
            None
        }
    }
}

/// Writes a file of capsule's own whole or not at all (a temporary file
/// renamed over it).
fn write_own_file(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let dir = path
        .parent()
        .ok_or_else(|| std::io::Error::other("no parent directory"))?;
    std::fs::create_dir_all(dir)?;
    let name = path.file_name().unwrap_or_default().to_string_lossy();
    let tmp = dir.join(format!(".{name}.tmp-{}", std::process::id()));
    let r = std::fs::write(&tmp, bytes).and_then(|()| std::fs::rename(&tmp, path));
    if r.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    r
}
