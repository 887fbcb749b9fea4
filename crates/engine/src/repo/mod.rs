//! A repository: its backend, master key and config, and the typed
//! operations on stored objects (keys, config, snapshots, index files, blobs).
//!
//! Object names: `config`, `keys/<id>`, `snapshots/<id>`, `index/<id>`,
//! `data/<id[0..2]>/<id>`, where `<id>` is the BLAKE3 hex of the stored bytes.

mod keys;
mod names;
mod packhead;
mod sealed;
mod unopened;

use std::sync::Arc;

use capsule_backend::{Backend, ErrorKind};
use capsule_crypto::{Aad, KdfParams, MasterKey};
use capsule_format::snapshot::{from_json, to_json, KeyFile, RepoConfig, Snapshot};
use capsule_format::tree::{decode_tree, Node};
use capsule_format::{compress, BlobId, BlobType, FileType, ObjectId, FORMAT_VERSION};

use crate::error::{EngineError, Result};
use crate::index::MasterIndex;
use keys::{find_key, new_keyfile, parse_keyfile, ENVELOPE_SLACK};
pub use keys::{EarlyKey, KeyHint, KeyInfo, KeySource};
pub use names::{hostname, pack_name, username};

/// Readable snapshots (oldest first) and the errors of unreadable ones.
pub type SnapshotList = (Vec<(ObjectId, Snapshot)>, Vec<EngineError>);

/// Snapshots with their IDs, oldest first.
type Snapshots = Vec<(ObjectId, Snapshot)>;

/// A snapshot named by the user, and what `latest` passed over to find it.
#[derive(Debug)]
pub struct Resolved {
    /// The snapshot's ID.
    pub id: ObjectId,
    /// The snapshot.
    pub snapshot: Snapshot,
    /// Snapshots that could not be read (for `latest`: one may be newer).
    pub damaged: Vec<String>,
    /// Snapshots dated in the future that `latest` skipped: ID and time.
    pub future: Vec<(ObjectId, String)>,
}

/// An open repository.
#[derive(Debug)]
pub struct Repository {
    backend: Arc<dyn Backend>,
    key: MasterKey,
    config: RepoConfig,
    key_id: ObjectId,
    /// The salt and cost of that key file.
    key_hint: KeyHint,
    /// How that key was had.
    key_source: KeySource,
    /// Damaged or stray key files seen while opening.
    warnings: Vec<EngineError>,
    /// `quota/` as listed beside the config while opening (taken once, by
    /// the first `quota::load`): a backup starts one round trip sooner.
    quota_listing: std::sync::Mutex<Option<Vec<capsule_backend::ObjectInfo>>>,
    /// Where this machine keeps the index's tables (the cache directory's
    /// `index-tables`); without one, each process makes its own.
    index_dir: Option<std::path::PathBuf>,
}

/// Parameters for `init`.
#[derive(Debug, Clone)]
pub struct InitOptions {
    /// Password KDF cost.
    pub kdf: KdfParams,
    /// Chunk sizes.
    pub chunks: capsule_chunker::ChunkSizes,
    /// Pack target size.
    pub pack_size: u32,
    /// zstd level.
    pub compression: i32,
}

impl Default for InitOptions {
    fn default() -> Self {
        InitOptions {
            kdf: KdfParams::default(),
            chunks: capsule_chunker::ChunkSizes::default(),
            pack_size: 16 * 1024 * 1024,
            compression: 1,
        }
    }
}

/// Writes content-addressed bytes; an existing object of that name already
/// holds the same bytes, so `AlreadyExists` counts as success.
pub(crate) fn put_addressed(backend: &dyn Backend, name: &str, bytes: &[u8]) -> Result<()> {
    match backend.put(name, bytes) {
        Ok(()) => Ok(()),
        Err(e) if e.kind == ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// [`put_addressed`] from the first `size` bytes of a file.
pub(crate) fn put_addressed_file(
    backend: &dyn Backend,
    name: &str,
    file: &std::fs::File,
    size: u64,
) -> Result<()> {
    match backend.put_file(name, file, size) {
        Ok(()) => Ok(()),
        Err(e) if e.kind == ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// [`put_addressed`] handing the buffer to the backend; returns it when the
/// backend gives it back.
pub(crate) fn put_addressed_owned(
    backend: &dyn Backend,
    name: &str,
    bytes: Vec<u8>,
) -> (Result<()>, Option<Vec<u8>>) {
    match backend.put_owned(name, bytes) {
        (Ok(()), back) => (Ok(()), back),
        (Err(e), back) if e.kind == ErrorKind::AlreadyExists => (Ok(()), back),
        (Err(e), back) => (Err(e.into()), back),
    }
}

impl Repository {
    /// Creates a new repository on an empty backend and opens it.
    pub fn init(backend: Arc<dyn Backend>, password: &[u8], opts: &InitOptions) -> Result<Self> {
        Self::init_keyed(backend, password, opts, None)
    }

    /// [`init`](Self::init) for a repository that cuts files and names
    /// blobs as `like` does (its chunk sizes, chunker seed and blob-ID key;
    /// a sealing key of its own), so snapshots copy between the two without
    /// re-chunking and dedup against each other.
    pub fn init_like(
        backend: Arc<dyn Backend>,
        password: &[u8],
        opts: &InitOptions,
        like: &Repository,
    ) -> Result<Self> {
        let c = like.config();
        let opts = InitOptions {
            chunks: capsule_chunker::ChunkSizes {
                min: c.chunk_min as usize,
                avg: c.chunk_avg as usize,
                max: c.chunk_max as usize,
            },
            ..opts.clone()
        };
        Self::init_keyed(backend, password, &opts, Some(like.key().sharing_ids()?))
    }

    fn init_keyed(
        backend: Arc<dyn Backend>,
        password: &[u8],
        opts: &InitOptions,
        key: Option<MasterKey>,
    ) -> Result<Self> {
        match backend.stat("config") {
            Ok(_) => {
                return Err(EngineError::AlreadyInitialized {
                    location: backend.location(),
                })
            }
            Err(e) if e.kind == ErrorKind::NotFound => {}
            Err(e) => return Err(e.into()),
        }
        // A repository that lost its config still holds its data: a new
        // config (new key, new ID) beside it would orphan all of it.
        if unopened::holds_repository_objects(&*backend)? {
            return Err(EngineError::MissingConfig {
                location: backend.location(),
            });
        }
        if password.is_empty() {
            return Err(EngineError::Invalid(
                "the password must not be empty".into(),
            ));
        }
        let key = match key {
            Some(k) => k,
            None => MasterKey::generate()?,
        };
        let mut rid = [0u8; 16];
        capsule_crypto::random_bytes(&mut rid)?;
        let config = RepoConfig {
            version: FORMAT_VERSION,
            id: hex::encode(rid),
            chunk_min: opts.chunks.min as u32,
            chunk_avg: opts.chunks.avg as u32,
            chunk_max: opts.chunks.max as u32,
            pack_size: opts.pack_size,
            compression: opts.compression,
        };
        // Key first, config last: a repository is initialized once `config`
        // exists, and by then a key can open it.
        let (kf, key_hint) = new_keyfile(&key, password, opts.kdf)?;
        let key_id = ObjectId::of(&kf);
        put_addressed(&*backend, &FileType::Key.name(&key_id), &kf)?;
        let sealed = key.seal(Aad::Config, &to_json(&config))?;
        backend.put("config", &sealed)?;
        Ok(Repository {
            backend,
            key,
            config,
            key_id,
            key_hint,
            key_source: KeySource::New,
            warnings: Vec::new(),
            quota_listing: std::sync::Mutex::new(None),
            index_dir: None,
        })
    }

    /// Opens an existing repository with a password.
    pub fn open(backend: Arc<dyn Backend>, password: &[u8]) -> Result<Self> {
        Self::open_with_early_key(backend, password, None)
    }

    /// [`open`](Self::open), using a key derivation already under way for
    /// the key file it was started for.
    pub fn open_with_early_key(
        backend: Arc<dyn Backend>,
        password: &[u8],
        early: Option<EarlyKey>,
    ) -> Result<Self> {
        Self::open_inner(backend.clone(), password, early)
            .map_err(|e| unopened::history_left(&*backend, e))
    }

    fn open_inner(
        backend: Arc<dyn Backend>,
        password: &[u8],
        early: Option<EarlyKey>,
    ) -> Result<Self> {
        // The config and the key files do not depend on each other, so the
        // config is fetched while the keys are listed: every command on a
        // remote repository starts one round trip sooner. The config's
        // outcome is still judged first.
        let (config_got, search, quota_listing) = std::thread::scope(|s| {
            let config = s.spawn(|| backend.get("config", None));
            let quota = s.spawn(|| backend.list(FileType::Quota.prefix()).ok());
            let search = find_key(&*backend, password, early);
            (config.join(), search, quota.join().ok().flatten())
        });
        let config_got = config_got.unwrap_or_else(|panic| std::panic::resume_unwind(panic));
        let sealed_config = match config_got {
            Ok(b) => b,
            Err(e) if e.kind == ErrorKind::NotFound => {
                if unopened::holds_repository_objects(&*backend)? {
                    return Err(EngineError::MissingConfig {
                        location: backend.location(),
                    });
                }
                return Err(EngineError::NotARepository {
                    location: backend.location(),
                });
            }
            Err(e) => return Err(e.into()),
        };
        let search = search?;
        let Some((key, key_id, key_hint)) = search.key else {
            if search.intact > 0 {
                return Err(EngineError::WrongPassword {
                    location: backend.location(),
                    damaged_keys: search.damaged.iter().map(|e| e.to_string()).collect(),
                });
            }
            return Err(EngineError::NoUsableKey {
                location: backend.location(),
                damaged_keys: search.damaged.iter().map(|e| e.to_string()).collect(),
            });
        };
        let plain =
            key.open(Aad::Config, &sealed_config)
                .map_err(|e| EngineError::DamagedConfig {
                    location: backend.location(),
                    detail: e.to_string(),
                })?;
        let config: RepoConfig = from_json(&plain).map_err(|e| EngineError::DamagedConfig {
            location: backend.location(),
            detail: e.to_string(),
        })?;
        if config.version > FORMAT_VERSION {
            return Err(EngineError::UnsupportedVersion {
                found: config.version,
                supported: FORMAT_VERSION,
            });
        }
        if config.chunk_min == 0
            || config.chunk_min > config.chunk_avg
            || config.chunk_avg > config.chunk_max
            || config.chunk_max > 64 << 20
        {
            return Err(EngineError::DamagedConfig {
                location: backend.location(),
                detail: "chunk sizes out of range".into(),
            });
        }
        Ok(Repository {
            backend,
            key,
            config,
            key_id,
            key_hint,
            key_source: search.source,
            warnings: search.damaged,
            quota_listing: std::sync::Mutex::new(quota_listing),
            index_dir: None,
        })
    }

    /// Replaces the backend with a wrapper of it (a cache, a metrics or
    /// fault-injection decorator) after the repository was opened.
    pub fn with_backend(mut self, backend: Arc<dyn Backend>) -> Self {
        self.backend = backend;
        self
    }

    /// Keeps the index's tables in `dir` (created when needed), so that
    /// each run reads only the index files the last one had not seen.
    pub fn with_index_dir(mut self, dir: impl Into<std::path::PathBuf>) -> Self {
        self.index_dir = Some(dir.into());
        self
    }

    /// `quota/` as listed while opening, once; `None` after (or when that
    /// listing failed): list it then.
    pub(crate) fn take_quota_listing(&self) -> Option<Vec<capsule_backend::ObjectInfo>> {
        self.quota_listing
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
    }

    /// How the key that opened the repository was had (a daemon's run
    /// reports `held`: it derived nothing).
    pub fn key_source(&self) -> KeySource {
        self.key_source
    }

    /// What opening found wrong without failing: damaged or stray key
    /// files, which the user should remove or replace.
    pub fn open_warnings(&self) -> &[EngineError] {
        &self.warnings
    }

    /// The storage backend.
    pub fn backend(&self) -> &Arc<dyn Backend> {
        &self.backend
    }
    /// The master key.
    pub fn key(&self) -> &MasterKey {
        &self.key
    }
    /// The config.
    pub fn config(&self) -> &RepoConfig {
        &self.config
    }
    /// A chunker with this repository's parameters and secret seed.
    pub fn chunker(&self) -> capsule_chunker::Chunker {
        capsule_chunker::Chunker::new(
            capsule_chunker::ChunkSizes {
                min: self.config.chunk_min as usize,
                avg: self.config.chunk_avg as usize,
                max: self.config.chunk_max as usize,
            },
            self.key.chunker_seed(),
        )
    }

    // ----- keys -----

    /// Adds a key file for another password.
    pub fn add_key(&self, password: &[u8], kdf: KdfParams) -> Result<ObjectId> {
        self.add_key_hinted(password, kdf).map(|(id, _)| id)
    }

    fn add_key_hinted(&self, password: &[u8], kdf: KdfParams) -> Result<(ObjectId, KeyHint)> {
        if password.is_empty() {
            return Err(EngineError::Invalid(
                "the password must not be empty".into(),
            ));
        }
        let (kf, hint) = new_keyfile(&self.key, password, kdf)?;
        let id = ObjectId::of(&kf);
        put_addressed(&*self.backend, &FileType::Key.name(&id), &kf)?;
        Ok((id, hint))
    }

    /// The salt and cost of the key file that opened this repository (or
    /// that `init` or `change_password` wrote), for the next command's
    /// [`EarlyKey`].
    pub fn key_hint(&self) -> &KeyHint {
        &self.key_hint
    }

    /// Lists key files, damaged ones included (so they can be removed).
    pub fn list_keys(&self) -> Result<Vec<KeyInfo>> {
        let mut out = Vec::new();
        for o in self.backend.list(FileType::Key.prefix())? {
            let id = o
                .name
                .trim_start_matches(FileType::Key.prefix())
                .to_string();
            let parsed = self
                .backend
                .get(&o.name, None)
                .map_err(|e| EngineError::corrupt(&o.name, e))
                .and_then(|bytes| {
                    parse_keyfile(&bytes, &o.name)?;
                    from_json::<KeyFile>(&bytes).map_err(|e| EngineError::corrupt(&o.name, e))
                });
            let (kf, damaged) = match parsed {
                Ok(kf) => (Some(kf), None),
                Err(e) => (None, Some(e.to_string())),
            };
            out.push(KeyInfo {
                current: id == self.key_id.to_hex(),
                id,
                created: kf.as_ref().map(|k| k.created.clone()).unwrap_or_default(),
                hostname: kf.as_ref().map(|k| k.hostname.clone()).unwrap_or_default(),
                username: kf.map(|k| k.username).unwrap_or_default(),
                damaged,
            });
        }
        out.sort_by(|a, b| a.created.cmp(&b.created).then(a.id.cmp(&b.id)));
        Ok(out)
    }

    /// Removes a key file by ID prefix. Refuses to remove the last key or
    /// the key in use (use `change_password` for that).
    pub fn remove_key(&self, prefix: &str) -> Result<String> {
        let keys = self.list_keys()?;
        let m: Vec<_> = keys.iter().filter(|k| k.id.starts_with(prefix)).collect();
        let k = match m.as_slice() {
            [] => return Err(EngineError::Invalid(format!("no key matches {prefix:?}"))),
            [k] => *k,
            _ => {
                return Err(EngineError::Invalid(format!(
                    "key prefix {prefix:?} is ambiguous"
                )))
            }
        };
        if k.current {
            return Err(EngineError::Invalid(
                "refusing to remove the key in use; open with another password or use `key passwd`"
                    .into(),
            ));
        }
        if k.damaged.is_none() && keys.iter().filter(|k| k.damaged.is_none()).count() < 2 {
            return Err(EngineError::Invalid(
                "refusing to remove the last key".into(),
            ));
        }
        self.backend.delete(&FileType::Key.name_hex(&k.id))?;
        Ok(k.id.clone())
    }

    /// Replaces the key in use with one for `new_password`. The new key is
    /// written before the old one is removed, so a crash leaves both.
    pub fn change_password(&mut self, new_password: &[u8], kdf: KdfParams) -> Result<ObjectId> {
        let (id, hint) = self.add_key_hinted(new_password, kdf)?;
        self.backend.delete(&FileType::Key.name(&self.key_id))?;
        self.key_id = id;
        self.key_hint = hint;
        Ok(id)
    }

    // ----- snapshots -----

    /// Stores a snapshot: the commit point of a backup.
    pub fn save_snapshot(&self, s: &Snapshot) -> Result<ObjectId> {
        let sealed = self.key.seal(Aad::Snapshot, &to_json(s))?;
        let id = ObjectId::of(&sealed);
        put_addressed(&*self.backend, &FileType::Snapshot.name(&id), &sealed)?;
        Ok(id)
    }

    /// Loads one snapshot by ID.
    pub fn load_snapshot(&self, id: &ObjectId) -> Result<Snapshot> {
        self.load_snapshot_object(&FileType::Snapshot.name(id), id)
    }

    /// Loads, authenticates and decodes a snapshot object stored under
    /// `name` (in `snapshots/`, or set aside in `forgotten/`).
    pub(crate) fn load_snapshot_object(&self, name: &str, id: &ObjectId) -> Result<Snapshot> {
        let name = name.to_string();
        let b = self.backend.get(&name, None)?;
        if ObjectId::of(&b) != *id {
            return Err(EngineError::corrupt(
                &name,
                "content does not match its name",
            ));
        }
        let p = self
            .key
            .open(Aad::Snapshot, &b)
            .map_err(|e| EngineError::corrupt(&name, e))?;
        from_json(&p).map_err(|e| EngineError::corrupt(&name, e))
    }

    /// All snapshots, oldest first. Damaged ones are returned as errors
    /// beside the good ones, so one bad object does not hide the rest.
    pub fn list_snapshots(&self) -> Result<SnapshotList> {
        self.list_snapshot_objects(FileType::Snapshot.prefix())
    }

    /// The snapshots' IDs, sorted, without reading them: one listing, for
    /// a long-lived view to tell whether anything changed.
    pub fn snapshot_ids(&self) -> Result<Vec<ObjectId>> {
        let prefix = FileType::Snapshot.prefix();
        let mut ids: Vec<ObjectId> = match self.backend.list(prefix) {
            Ok(o) => o
                .iter()
                .filter_map(|o| o.name.trim_start_matches(prefix).parse().ok())
                .collect(),
            Err(e) if e.kind == ErrorKind::NotFound => Vec::new(),
            Err(e) => return Err(e.into()),
        };
        ids.sort();
        Ok(ids)
    }

    /// Every snapshot object under `prefix`, oldest first, damaged ones
    /// beside the good ones.
    pub(crate) fn list_snapshot_objects(&self, prefix: &str) -> Result<SnapshotList> {
        let objs = match self.backend.list(prefix) {
            Ok(o) => o,
            // A directory that was never created holds nothing.
            Err(e) if e.kind == ErrorKind::NotFound => Vec::new(),
            Err(e) => return Err(e.into()),
        };
        let width = crate::flight::reads_in_flight(&self.backend.capabilities());
        let results: Vec<_> = crate::flight::map_in_flight(&objs, width, |o| {
            let Ok(id) = o.name.trim_start_matches(prefix).parse::<ObjectId>() else {
                return Some(Err(EngineError::corrupt(&o.name, "name is not an ID")));
            };
            match self.load_snapshot_object(&o.name, &id) {
                // Forgotten (or set back) between the listing and the
                // read: it was moved, not damaged.
                Err(EngineError::Backend(e)) if e.kind == ErrorKind::NotFound => None,
                r => Some(r.map(|s| (id, s))),
            }
        })
        .into_iter()
        .flatten()
        .collect();
        let (mut good, bad) = crate::flight::partition(results);
        good.sort_by_key(|(id, s)| (s.time_unix, s.time_nanos, *id));
        Ok((good, bad))
    }

    /// Resolves `latest`, `latest~N`, a point in time (the newest snapshot
    /// at or before it), a full ID, or a unique hex prefix.
    pub fn resolve_snapshot(&self, spec: &str) -> Result<(ObjectId, Snapshot)> {
        self.resolve_snapshot_noting(spec)
            .map(|r| (r.id, r.snapshot))
    }

    /// Like [`Repository::resolve_snapshot`], and also says what `latest`
    /// passed over, which callers must tell the user: snapshots that could
    /// not be read (one may be newer), and snapshots dated in the future of
    /// this machine's clock ([`crate::timefmt::is_future`]), which are never
    /// `latest`: one backup made while a clock ran ahead would otherwise
    /// stand for the newest data for years.
    pub fn resolve_snapshot_noting(&self, spec: &str) -> Result<Resolved> {
        let (snaps, mut bad) = self.list_snapshots()?;
        let (snaps, future) = Self::split_future(snaps, spec);
        match Self::pick(snaps, spec) {
            Ok((id, snapshot)) => Ok(Resolved {
                id,
                snapshot,
                damaged: bad.iter().map(|e| e.to_string()).collect(),
                future,
            }),
            // The snapshot asked for by ID exists but is damaged: say that,
            // not "no such snapshot".
            Err(EngineError::SnapshotNotFound(_)) if spec != "latest" => {
                let want = FileType::Snapshot.name_hex(&spec.to_ascii_lowercase());
                match bad.iter().position(
                    |e| matches!(e, EngineError::Corrupt { object, .. } if object.starts_with(&want)),
                ) {
                    Some(i) => Err(bad.swap_remove(i)),
                    None => Err(EngineError::SnapshotNotFound(spec.into())),
                }
            }
            Err(e) => Err(e),
        }
    }

    /// The snapshot `spec` names among `snaps` (oldest first), as
    /// [`Repository::resolve_snapshot`] takes it: `latest` and `latest~N`
    /// pass over snapshots dated in the future of this machine's clock.
    pub fn pick_named(
        snaps: Vec<(ObjectId, Snapshot)>,
        spec: &str,
    ) -> Result<(ObjectId, Snapshot)> {
        Self::pick(Self::split_future(snaps, spec).0, spec)
    }

    /// For `latest` and `latest~N`: `snaps` without those dated in the
    /// future ([`crate::timefmt::is_future`]), and those (ID and time).
    /// Any other name: `snaps` as they are.
    fn split_future(
        snaps: Vec<(ObjectId, Snapshot)>,
        spec: &str,
    ) -> (Snapshots, Vec<(ObjectId, String)>) {
        if spec != "latest" && !spec.starts_with("latest~") {
            return (snaps, Vec::new());
        }
        let now = crate::timefmt::now_unix();
        let (f, rest): (Vec<_>, Vec<_>) = snaps
            .into_iter()
            .partition(|(_, s)| crate::timefmt::is_future(s.time_unix, now));
        (rest, f.into_iter().map(|(id, s)| (id, s.time)).collect())
    }

    /// The snapshot `spec` names: `latest`; `latest~N`, the Nth before it;
    /// a point in time ([`crate::timefmt::parse_when`]), the newest at or
    /// before it; or an ID prefix. `snaps` are oldest first. A time can
    /// never be taken for an ID prefix: IDs are hex, times have dashes.
    fn pick(mut snaps: Vec<(ObjectId, Snapshot)>, spec: &str) -> Result<(ObjectId, Snapshot)> {
        let not_found = || EngineError::SnapshotNotFound(spec.into());
        if spec == "latest" {
            return snaps.pop().ok_or_else(not_found);
        }
        if let Some(n) = spec.strip_prefix("latest~") {
            let n: usize = n.parse().map_err(|_| not_found())?;
            let i = snaps.len().checked_sub(n + 1).ok_or_else(not_found)?;
            return Ok(snaps.swap_remove(i));
        }
        if let Some(t) = crate::timefmt::parse_when(spec) {
            let i = snaps.partition_point(|(_, s)| s.time_unix <= t);
            return match i.checked_sub(1) {
                Some(i) => Ok(snaps.swap_remove(i)),
                None => Err(EngineError::NoSnapshotBefore {
                    when: spec.into(),
                    oldest: snaps.first().map(|(_, s)| s.time.clone()),
                }),
            };
        }
        let mut m: Vec<_> = snaps
            .into_iter()
            .filter(|(id, _)| id.to_hex().starts_with(&spec.to_ascii_lowercase()))
            .collect();
        match m.len() {
            0 => Err(EngineError::SnapshotNotFound(spec.into())),
            1 => Ok(m.remove(0)),
            _ => Err(EngineError::AmbiguousSnapshot(spec.into())),
        }
    }

    // ----- index and blobs -----

    /// Loads every index file. Damaged index files are reported, not fatal.
    pub fn load_index(&self) -> Result<(MasterIndex, Vec<EngineError>)> {
        let since = std::time::SystemTime::now();
        let (index, bad) = MasterIndex::load(self)?;
        // The index names every pack there is: a tree pack the local cache
        // holds beyond it was deleted by a prune elsewhere. Only from a
        // whole index (an unreadable index file may name packs still used).
        if bad.is_empty() {
            let keep = |name: &str| FileType::id_of(name).is_some_and(|id| index.has_pack(&id));
            self.backend()
                .forget_cached(FileType::TreePack.prefix(), &keep, since);
        }
        Ok((index, bad))
    }

    /// Reads, authenticates, decompresses and verifies one blob. When its
    /// first location fails (pack missing, truncated or damaged) and the
    /// blob is stored elsewhere too, the other copies are tried.
    pub fn read_blob(&self, index: &MasterIndex, t: BlobType, id: &BlobId) -> Result<Vec<u8>> {
        let mut first_err = None;
        for loc in index.locations(id).filter(|l| l.blob_type == t) {
            match self.read_blob_at(index, t, id, &loc) {
                Ok(b) => return Ok(b),
                // The destination failing is not the copy's fault.
                Err(EngineError::Backend(b)) if b.is_destination_failure() => {
                    return Err(EngineError::Backend(b))
                }
                Err(e) => {
                    first_err.get_or_insert(e);
                }
            }
        }
        Err(first_err.unwrap_or_else(|| EngineError::MissingBlob(id.to_hex())))
    }

    fn read_blob_at(
        &self,
        index: &MasterIndex,
        t: BlobType,
        id: &BlobId,
        loc: &crate::index::BlobLoc,
    ) -> Result<Vec<u8>> {
        let pack = index.pack_id(loc.pack);
        let name = pack_name(&pack, t);
        // Nor is a crafted length read: compression only shrinks a blob, so
        // its envelope is at most its plaintext plus framing.
        if loc.length as usize > self.max_blob_len(t) + ENVELOPE_SLACK {
            return Err(EngineError::corrupt(
                format!("{name} blob {}", id.short()),
                format!(
                    "the index gives it {} stored bytes, more than a blob can take",
                    loc.length
                ),
            ));
        }
        let env = self.backend.get(
            &name,
            Some(loc.offset as u64..loc.offset as u64 + loc.length as u64),
        )?;
        self.decode_blob(&name, t, id, &env, loc.raw_length as usize)
    }

    /// Bytes an envelope may add to a blob's plaintext (nonce, tag,
    /// framing), with room to spare.
    pub const ENVELOPE_SLACK: usize = ENVELOPE_SLACK;

    /// The largest plaintext a blob of type `t` can have here: a data blob
    /// is one chunk (at most the chunker's maximum); a tree is bounded at
    /// 256 MiB, about two million entries in one directory.
    pub fn max_blob_len(&self, t: BlobType) -> usize {
        match t {
            BlobType::Data => (self.config.chunk_max as usize).max(1 << 20),
            BlobType::Tree => 256 << 20,
        }
    }

    /// Opens a blob envelope read from a pack and checks its ID.
    pub fn decode_blob(
        &self,
        pack_name: &str,
        t: BlobType,
        id: &BlobId,
        envelope: &[u8],
        raw_len: usize,
    ) -> Result<Vec<u8>> {
        let mut envelope = envelope.to_vec();
        self.decode_blob_in_place(pack_name, t, id, &mut envelope, raw_len)
            .map(std::borrow::Cow::into_owned)
    }

    /// Like [`Repository::decode_blob`], decrypting where the envelope lies
    /// (its bytes are unspecified afterwards, also on failure): a blob
    /// stored raw comes back as a part of `envelope`, with no copy made.
    pub fn decode_blob_in_place<'a>(
        &self,
        pack_name: &str,
        t: BlobType,
        id: &BlobId,
        envelope: &'a mut [u8],
        raw_len: usize,
    ) -> Result<std::borrow::Cow<'a, [u8]>> {
        let obj = || format!("{pack_name} blob {}", id.short());
        // The length is checked before anything is allocated for it: a
        // crafted index or pack header (a decompression bomb) could
        // otherwise make every reader allocate gigabytes.
        let limit = self.max_blob_len(t);
        if raw_len > limit {
            return Err(EngineError::corrupt(
                obj(),
                format!(
                    "claims {raw_len} bytes, more than any {} blob of this repository can hold ({limit})",
                    match t {
                        BlobType::Data => "data",
                        BlobType::Tree => "tree",
                    }
                ),
            ));
        }
        let framed = self
            .key
            .open_in_place(Aad::Blob(t, id), envelope)
            .map_err(|e| EngineError::corrupt(obj(), e))?;
        let plain =
            compress::unframe_ref(framed, raw_len).map_err(|e| EngineError::corrupt(obj(), e))?;
        if self.key.blob_id(&plain) != *id {
            return Err(EngineError::corrupt(obj(), "content does not match its ID"));
        }
        Ok(plain)
    }

    /// Opens a blob's envelope where it lies and returns it framed (its
    /// framing byte, then its bytes compressed or raw), not unframed: the
    /// AEAD binds the blob's type and ID, so what opens is that blob as a
    /// key holder sealed it. `copy` seals it again as it is.
    pub fn open_framed<'a>(
        &self,
        pack_name: &str,
        t: BlobType,
        id: &BlobId,
        envelope: &'a mut [u8],
    ) -> Result<&'a [u8]> {
        self.key
            .open_in_place(Aad::Blob(t, id), envelope)
            .map(|b| &*b)
            .map_err(|e| EngineError::corrupt(format!("{pack_name} blob {}", id.short()), e))
    }

    /// Loads and decodes a directory tree.
    pub fn load_tree(&self, index: &MasterIndex, id: &BlobId) -> Result<Vec<Node>> {
        let b = self.read_blob(index, BlobType::Tree, id)?;
        decode_tree(&b).map_err(|e| EngineError::corrupt(format!("tree {}", id.short()), e))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::keys::Kek;
    use super::*;
    use capsule_backend::testing::MemoryBackend;

    const PW: &[u8] = b"early";

    fn cheap() -> KdfParams {
        KdfParams {
            m_cost: 64,
            t_cost: 1,
            p_cost: 1,
        }
    }

    #[test]
    fn a_hint_costlier_than_the_default_is_not_derived_early() {
        let salt = "00".repeat(16);
        let costly = KeyHint::parse(&format!("argon2id 1048576 4 16 {salt}")).unwrap();
        assert!(!costly.costs_at_most(KdfParams::default()));
        for more in ["65537 3 1", "65536 4 1", "65536 3 2"] {
            let h = KeyHint::parse(&format!("argon2id {more} {salt}")).unwrap();
            assert!(!h.costs_at_most(KdfParams::default()), "{more}");
        }
        let usual = KeyHint::parse(&format!("argon2id 65536 3 1 {salt}")).unwrap();
        assert!(usual.costs_at_most(KdfParams::default()));
    }

    fn repo() -> (Arc<MemoryBackend>, KeyHint) {
        let store = Arc::new(MemoryBackend::new());
        let opts = InitOptions {
            kdf: cheap(),
            ..InitOptions::default()
        };
        let r = Repository::init(store.clone(), PW, &opts).unwrap();
        (store, r.key_hint().clone())
    }

    /// An early key whose derivation yields `kek`, whatever the password.
    fn planted(hint: KeyHint, kek: [u8; 32]) -> EarlyKey {
        EarlyKey {
            hint,
            kek: Kek::Deriving(std::thread::spawn(move || Ok(zeroize::Zeroizing::new(kek)))),
        }
    }

    #[test]
    fn a_held_key_opens_without_a_derivation_and_a_wrong_one_falls_back() {
        let (store, hint) = repo();
        let (h, kek) = EarlyKey::start(PW, hint.clone()).wait().unwrap();
        assert_eq!(h, hint);
        let r = Repository::open_with_early_key(
            store.clone(),
            PW,
            Some(EarlyKey::derived(hint.clone(), kek)),
        )
        .unwrap();
        assert_eq!(r.key_source(), KeySource::Held);
        // Derived from another password (a profile changed since): this
        // command's own password opens, derived the usual way.
        let wrong = EarlyKey::derived(hint.clone(), zeroize::Zeroizing::new([7; 32]));
        let r = Repository::open_with_early_key(store.clone(), PW, Some(wrong)).unwrap();
        assert_eq!(r.key_source(), KeySource::Derived);
        let wrong = EarlyKey::derived(hint, zeroize::Zeroizing::new([7; 32]));
        let e = Repository::open_with_early_key(store, b"nope", Some(wrong)).unwrap_err();
        assert!(matches!(e, EngineError::WrongPassword { .. }), "{e}");
    }

    #[test]
    fn a_hint_reads_back_and_a_bad_one_is_ignored() {
        let (_, hint) = repo();
        assert_eq!(KeyHint::parse(&hint.to_text()), Some(hint.clone()));
        let salt = hex::encode(&hint.salt);
        for bad in [
            String::new(),
            "garbage".into(),
            format!("scrypt 64 1 1 {salt}"),
            format!("argon2id 64 1 1 {salt} extra"),
            format!("argon2id 64 1 1 {}", &salt[..8]),
            format!("argon2id 64 1 1 zz{}", &salt[2..]),
            // A name that is not a key file's: never read.
            format!("argon2id 64 1 1 {salt} keys/../config"),
            format!("argon2id 64 1 1 {salt} config"),
            // More than a key file may ask: a planted hint costs nothing.
            format!("argon2id 4194304 3 1 {salt}"),
            format!("argon2id 65536 100 1 {salt}"),
        ] {
            assert_eq!(KeyHint::parse(&bad), None, "{bad:?}");
        }
    }

    #[test]
    fn a_hint_naming_its_key_file_is_read_while_the_keys_are_listed() {
        use capsule_backend::{LabBackend, MeteredBackend};
        use std::sync::atomic::Ordering::Relaxed;
        let (store, hint) = repo();
        assert!(hint.name.is_some());
        let open = |hint: KeyHint| {
            let inner: Arc<dyn LabBackend> = store.clone();
            let m = MeteredBackend::new(inner);
            let stats = m.stats();
            let r =
                Repository::open_with_early_key(Arc::new(m), PW, Some(EarlyKey::start(PW, hint)));
            (r, stats)
        };
        let (r, stats) = open(hint.clone());
        assert_eq!(r.unwrap().key_source(), KeySource::Early);
        // `keys/` and `quota/` listed, the key file and the config read,
        // all at once: nothing waits on the listing.
        assert_eq!(stats.lists.load(Relaxed), 2);
        assert_eq!(stats.gets.load(Relaxed), 2);
        // A hint naming a key file that is gone: found by the listing.
        let mut gone = hint;
        gone.name = Some(format!("{}{}", FileType::Key.prefix(), "ab".repeat(32)));
        let (r, stats) = open(gone);
        assert!(r.is_ok());
        assert_eq!(stats.gets.load(Relaxed), 3);
    }

    #[test]
    fn the_early_derivation_stands_in_for_its_key_files_own() {
        let (store, hint) = repo();
        // The real derivation: opens.
        let early = EarlyKey::start(PW, hint.clone());
        let r = Repository::open_with_early_key(store.clone(), PW, Some(early)).unwrap();
        assert_eq!(r.key_hint(), &hint);
        // A planted result for the same salt and cost is what gets tried,
        // not a derivation of its own: the right password fails with it.
        let wrong = planted(hint.clone(), [7; 32]);
        let e = Repository::open_with_early_key(store.clone(), PW, Some(wrong)).unwrap_err();
        assert!(matches!(e, EngineError::WrongPassword { .. }), "{e}");
    }

    #[test]
    fn an_early_key_for_another_salt_is_left_aside() {
        let (store, hint) = repo();
        let mut other = hint.clone();
        other.salt[0] ^= 1;
        let stale = planted(other, [7; 32]);
        let r = Repository::open_with_early_key(store.clone(), PW, Some(stale)).unwrap();
        assert_eq!(r.key_hint(), &hint);
    }

    #[test]
    fn with_two_keys_the_early_one_failing_leaves_the_other_to_open() {
        let (store, hint) = repo();
        let r = Repository::open(store.clone(), PW).unwrap();
        r.add_key(b"second", cheap()).unwrap();
        // Derived for the first key with the second password: it fails
        // there, and the second key opens.
        let early = EarlyKey::start(b"second", hint.clone());
        let r = Repository::open_with_early_key(store.clone(), b"second", Some(early)).unwrap();
        assert_ne!(r.key_hint(), &hint);
        // A wrong password with an early key is the usual error.
        let early = EarlyKey::start(b"nope", hint);
        let e = Repository::open_with_early_key(store, b"nope", Some(early)).unwrap_err();
        assert!(matches!(e, EngineError::WrongPassword { .. }), "{e}");
    }

    #[test]
    fn changing_the_password_changes_the_hint() {
        let (store, hint) = repo();
        let mut r = Repository::open(store.clone(), PW).unwrap();
        r.change_password(b"new", cheap()).unwrap();
        let new = r.key_hint().clone();
        assert_ne!(new, hint);
        let early = EarlyKey::start(b"new", new.clone());
        let r = Repository::open_with_early_key(store, b"new", Some(early)).unwrap();
        assert_eq!(r.key_hint(), &new);
    }
}
