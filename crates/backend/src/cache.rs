//! A local cache in front of any backend, for the objects every backup
//! needs: index files, snapshots and tree packs. They are immutable and named
//! by the BLAKE3 of their bytes, so a cached copy never goes stale; it can
//! only be missing (fetched on first use) or damaged (checked against its
//! name once per process, and fetched again if wrong).
//!
//! With a current cache, a backup reads none of these from the destination:
//! it lists `index/` and `snapshots/`, and that is all. Data packs are never
//! cached. Requests that reach the destination are counted below this layer
//! (see [`crate::metered::MeteredBackend`]).

use std::collections::HashSet;
use std::io::{Read, Seek, SeekFrom, Write};
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use crate::contract::{Backend, BackendError, ErrorKind, LabBackend};
use capsule_format::layout::TEMP_PREFIX;

/// The largest object the cache keeps (a tree pack is at most 512 MiB):
/// anything larger in the cache directory was not written by it.
const MAX_CACHED: u64 = 1 << 30;

/// What the cache did during this process.
#[derive(Debug, Default)]
pub struct CacheStats {
    /// Reads served from the cache.
    pub hits: AtomicU64,
    /// Objects fetched from the destination because the cache lacked them.
    pub fetched: AtomicU64,
    /// Bytes fetched for those.
    pub fetched_bytes: AtomicU64,
    /// Cached copies found damaged and replaced.
    pub repaired: AtomicU64,
    /// Cached copies dropped because the repository no longer holds their
    /// object (another machine's prune or forget removed it).
    pub dropped: AtomicU64,
    /// Copies that could not be kept (the cache's disk full or read-only):
    /// each is fetched again by every run until they can.
    pub unstored: AtomicU64,
    /// Why the first of them could not be kept.
    pub unstored_error: Mutex<Option<String>>,
}

/// A backend with a local cache directory in front of it.
#[derive(Debug)]
pub struct CachingBackend {
    inner: Arc<dyn LabBackend>,
    dir: PathBuf,
    verified: Mutex<HashSet<String>>,
    stats: Arc<CacheStats>,
}

/// The repository layout says which kinds are cached.
fn cacheable(name: &str) -> bool {
    capsule_format::FileType::of_name(name).is_some_and(|t| t.cached())
}

/// The kind the cache keeps whose whole directory `prefix` names.
fn cached_kind(prefix: &str) -> Option<capsule_format::FileType> {
    capsule_format::FileType::ALL
        .into_iter()
        .find(|t| t.cached() && t.prefix() == prefix)
}

/// The object ID in a content-addressed name (its last segment).
fn expected_hash(name: &str) -> &str {
    name.rsplit('/').next().unwrap_or(name)
}

fn matches_name(name: &str, bytes: &[u8]) -> bool {
    blake3::hash(bytes).to_hex().as_str() == expected_hash(name)
}

impl CachingBackend {
    /// Wraps `inner`, caching in `dir` (created if missing, with a
    /// `CACHEDIR.TAG` so other backup tools skip it).
    pub fn new(inner: Arc<dyn LabBackend>, dir: impl Into<PathBuf>) -> std::io::Result<Self> {
        let dir = dir.into();
        std::fs::create_dir_all(&dir)?;
        // Trees name every path backed up: keep the cache private, also
        // when an older capsule created it world-readable.
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700))?;
        let tag = dir.join("CACHEDIR.TAG");
        if !tag.exists() {
            std::fs::write(
                &tag,
                "Signature: 8a477f597d28d172789f06886806bc55\n# capsule cache: index files, snapshots and tree packs.\n",
            )?;
        }
        Ok(CachingBackend {
            inner,
            dir,
            verified: Mutex::new(HashSet::new()),
            stats: Arc::new(CacheStats::default()),
        })
    }

    /// Live statistics.
    pub fn stats(&self) -> Arc<CacheStats> {
        self.stats.clone()
    }

    /// The cache directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn local(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    /// Drops the cached copies under `prefix` whose objects `keep` rejects
    /// and that were stored before `since` (a copy stored later may be of
    /// an object written after the listing or index that `keep` comes
    /// from), and the temporaries of copies cut short (a killed run) an
    /// hour old. Without this, everything another machine's prunes and
    /// forgets removed stays here for ever: a laptop's cache grew by what
    /// the household's repository turned over until its disk was full, and
    /// from then on every run fetched every index file again (the fleet
    /// year, day 203 on). Best effort, like every write of the cache.
    fn drop_unkept(&self, prefix: &str, keep: &dyn Fn(&str) -> bool, since: SystemTime) {
        let Some(kind) = cached_kind(prefix) else {
            return;
        };
        // Packs fan out over one level of subdirectories; the rest are flat.
        let fanned = matches!(
            kind,
            capsule_format::FileType::TreePack | capsule_format::FileType::DataPack
        );
        let top = self.local(prefix.trim_end_matches('/'));
        let dirs: Vec<(PathBuf, String)> = if fanned {
            let Ok(rd) = std::fs::read_dir(&top) else {
                return;
            };
            rd.flatten()
                .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                .map(|e| {
                    let sub = e.file_name().to_string_lossy().into_owned();
                    (e.path(), format!("{prefix}{sub}/"))
                })
                .collect()
        } else {
            vec![(top, prefix.to_string())]
        };
        let stale_tmp = since - std::time::Duration::from_secs(3600);
        for (dir, rel) in dirs {
            let Ok(rd) = std::fs::read_dir(&dir) else {
                continue;
            };
            for e in rd.flatten() {
                let file = e.file_name().to_string_lossy().into_owned();
                // Never follows what it finds: a directory or a link here was
                // not written by the cache, and is left alone.
                let Ok(m) = e.path().symlink_metadata() else {
                    continue;
                };
                let Ok(modified) = m.modified() else { continue };
                if !m.file_type().is_file() {
                    continue;
                }
                let gone = if file.starts_with(TEMP_PREFIX) {
                    modified < stale_tmp
                } else {
                    modified < since && !keep(&format!("{rel}{file}"))
                };
                if gone && std::fs::remove_file(e.path()).is_ok() {
                    self.stats.dropped.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
    }

    /// Stores a copy. Failures only cost a later re-fetch, so they are ignored.
    fn store(&self, name: &str, data: &[u8]) {
        self.store_from(name, &mut &data[..]);
    }

    /// Copies `data` into the cache under `name`, keeping it only if its
    /// hash is the one the name promises (a streamed copy, so a pack put
    /// from a file is never held in memory whole for the cache's sake).
    fn store_from(&self, name: &str, data: &mut dyn Read) {
        let p = self.local(name);
        let Some(parent) = p.parent() else { return };
        if let Err(e) = std::fs::create_dir_all(parent) {
            self.unstored(&e);
            return;
        }
        let tmp = parent.join(format!(
            "{TEMP_PREFIX}{}-{}",
            std::process::id(),
            expected_hash(name)
        ));
        let ok = std::fs::File::create(&tmp).and_then(|f| {
            let mut w = HashingWriter(blake3::Hasher::new(), std::io::BufWriter::new(f));
            std::io::copy(data, &mut w)?;
            w.1.flush()?;
            if w.0.finalize().to_hex().as_str() != expected_hash(name) {
                return Err(std::io::Error::other("content does not match its name"));
            }
            std::fs::rename(&tmp, &p)
        });
        if let Err(e) = ok {
            let _ = std::fs::remove_file(&tmp);
            // A copy whose bytes did not match its name is damage in
            // transit, reported where it is read; the rest is the disk's.
            if e.kind() != std::io::ErrorKind::Other {
                self.unstored(&e);
            }
        } else if let Ok(mut v) = self.verified.lock() {
            v.insert(name.to_string());
        }
    }

    fn unstored(&self, e: &std::io::Error) {
        self.stats.unstored.fetch_add(1, Ordering::Relaxed);
        if let Ok(mut first) = self.stats.unstored_error.lock() {
            first.get_or_insert_with(|| format!("{}: {e}", self.dir.display()));
        }
    }

    /// Returns the cached file if present and (checked once) intact.
    fn open_cached(&self, name: &str) -> Option<std::fs::File> {
        let p = self.local(name);
        // A FIFO, a symlink or something huge planted here is damage: it
        // goes, and the object is fetched from the destination.
        let mut f = match crate::ownfile::open_regular(&p) {
            Ok(f) if f.metadata().is_ok_and(|m| m.len() <= MAX_CACHED) => f,
            Ok(_) | Err(_) if p.symlink_metadata().is_ok() => {
                let _ = std::fs::remove_file(&p);
                self.stats.repaired.fetch_add(1, Ordering::Relaxed);
                return None;
            }
            _ => return None,
        };
        let checked = self
            .verified
            .lock()
            .map(|v| v.contains(name))
            .unwrap_or(false);
        if !checked {
            // Streamed through the hash: read whole, the first look at each
            // of a run's tree packs held it in memory (three 17 MB packs at
            // once were half the peak of a no-change run of a million tiny
            // files).
            let mut h = blake3::Hasher::new();
            let mut buf = vec![0u8; 1 << 16];
            loop {
                match f.read(&mut buf) {
                    Ok(0) => break,
                    Ok(n) => {
                        h.update(&buf[..n]);
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                    Err(_) => return None,
                }
            }
            if h.finalize().to_hex().as_str() != expected_hash(name) {
                let _ = std::fs::remove_file(&p);
                self.stats.repaired.fetch_add(1, Ordering::Relaxed);
                return None;
            }
            if let Ok(mut v) = self.verified.lock() {
                v.insert(name.to_string());
            }
        }
        Some(f)
    }
}

fn read_range(
    f: &mut std::fs::File,
    name: &str,
    range: Option<Range<u64>>,
) -> Result<Vec<u8>, BackendError> {
    let io =
        |e: std::io::Error| BackendError::new(ErrorKind::Io, "get (cache)", name, e.to_string());
    let size = f.metadata().map_err(io)?.len();
    let r = range.unwrap_or(0..size);
    crate::contract::check_range(name, &r, size)?;
    let mut v = vec![0u8; (r.end - r.start) as usize];
    f.seek(SeekFrom::Start(r.start)).map_err(io)?;
    f.read_exact(&mut v).map_err(io)?;
    Ok(v)
}

impl crate::contract::Layer for CachingBackend {
    fn inner(&self) -> &dyn LabBackend {
        &*self.inner
    }

    fn put(&self, name: &str, data: &[u8]) -> Result<(), BackendError> {
        let r = self.inner.put(name, data);
        let stored = r.is_ok()
            || r.as_ref()
                .is_err_and(|e| e.kind == ErrorKind::AlreadyExists);
        if stored && cacheable(name) {
            self.store(name, data);
        }
        r
    }

    /// Objects the cache keeps are put from a borrowed buffer, so the copy
    /// it stores is the one that was sent.
    fn put_owned(&self, name: &str, data: Vec<u8>) -> (Result<(), BackendError>, Option<Vec<u8>>) {
        if cacheable(name) {
            let r = Backend::put(self, name, &data);
            return (r, Some(data));
        }
        self.inner.put_owned(name, data)
    }

    /// Objects the cache keeps are copied from the same file once sent
    /// (checked against their name on the way).
    fn put_file(&self, name: &str, file: &std::fs::File, size: u64) -> Result<(), BackendError> {
        let r = self.inner.put_file(name, file, size);
        let stored = r.is_ok()
            || r.as_ref()
                .is_err_and(|e| e.kind == ErrorKind::AlreadyExists);
        if stored && cacheable(name) {
            self.store_from(name, &mut crate::contract::ReadAt::new(file).take(size));
        }
        r
    }

    fn get(&self, name: &str, range: Option<Range<u64>>) -> Result<Vec<u8>, BackendError> {
        if !cacheable(name) {
            return self.inner.get(name, range);
        }
        if let Some(mut f) = self.open_cached(name) {
            self.stats.hits.fetch_add(1, Ordering::Relaxed);
            return read_range(&mut f, name, range);
        }
        // Miss: fetch the whole object once, keep it, serve the range.
        let all = self.inner.get(name, None)?;
        self.stats.fetched.fetch_add(1, Ordering::Relaxed);
        self.stats
            .fetched_bytes
            .fetch_add(all.len() as u64, Ordering::Relaxed);
        if matches_name(name, &all) {
            self.store(name, &all);
        }
        match range {
            None => Ok(all),
            Some(r) => {
                crate::contract::check_range(name, &r, all.len() as u64)?;
                Ok(all[r.start as usize..r.end as usize].to_vec())
            }
        }
    }

    fn get_stream(
        &self,
        name: &str,
        range: Option<Range<u64>>,
        out: &mut dyn std::io::Write,
    ) -> Result<u64, BackendError> {
        if cacheable(name) {
            let v = Backend::get(self, name, range)?;
            out.write_all(&v)
                .map_err(|e| crate::contract::write_out_error(name, e))?;
            return Ok(v.len() as u64);
        }
        self.inner.get_stream(name, range, out)
    }

    /// A full listing of a kind the cache keeps (every backup lists
    /// `index/` and `snapshots/`) also says which cached copies are of
    /// objects gone since.
    fn list(&self, prefix: &str) -> Result<Vec<crate::contract::ObjectInfo>, BackendError> {
        let since = SystemTime::now();
        let listed = self.inner.list(prefix)?;
        if cached_kind(prefix).is_some() {
            let names: HashSet<&str> = listed.iter().map(|o| o.name.as_str()).collect();
            self.drop_unkept(prefix, &|n| names.contains(n), since);
        }
        Ok(listed)
    }

    fn forget_cached(&self, prefix: &str, keep: &dyn Fn(&str) -> bool, since: SystemTime) {
        self.drop_unkept(prefix, keep, since);
    }

    fn delete(&self, name: &str) -> Result<(), BackendError> {
        self.inner.delete(name)?;
        if cacheable(name) {
            let _ = std::fs::remove_file(self.local(name));
        }
        Ok(())
    }
}

/// Hashes what passes through on its way to the file.
struct HashingWriter<W>(blake3::Hasher, W);

impl<W: Write> Write for HashingWriter<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.1.write(buf)?;
        self.0.update(&buf[..n]);
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.1.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::local::{LocalBackend, SyncPolicy};

    #[test]
    fn conformance_through_the_cache() {
        let d = tempfile::tempdir().unwrap();
        let inner = Arc::new(LocalBackend::open(d.path(), SyncPolicy::NoSync).unwrap());
        let c = CachingBackend::new(inner, d.path().join("..cache-not-in-repo")).unwrap();
        crate::conformance::run_all(&c);
    }

    #[test]
    fn serves_from_cache_and_repairs_damage() {
        let d = tempfile::tempdir().unwrap();
        let repo = d.path().join("repo");
        std::fs::create_dir(&repo).unwrap();
        let inner = Arc::new(LocalBackend::open(&repo, SyncPolicy::NoSync).unwrap());
        let data = b"an index file".to_vec();
        let name = format!("index/{}", blake3::hash(&data).to_hex());
        inner.put(&name, &data).unwrap();
        let cache = d.path().join("cache");

        let c = CachingBackend::new(inner.clone(), &cache).unwrap();
        assert_eq!(c.get(&name, Some(3..8)).unwrap(), b"index");
        assert_eq!(c.stats().fetched.load(Ordering::Relaxed), 1);
        assert_eq!(c.get(&name, None).unwrap(), data);
        assert_eq!(c.stats().hits.load(Ordering::Relaxed), 1);

        // A new process with a damaged cached copy fetches it again.
        std::fs::write(cache.join(&name), b"garbage").unwrap();
        let c = CachingBackend::new(inner, &cache).unwrap();
        assert_eq!(c.get(&name, None).unwrap(), data);
        assert_eq!(c.stats().repaired.load(Ordering::Relaxed), 1);
        assert_eq!(std::fs::read(cache.join(&name)).unwrap(), data);
    }

    /// A listing of a kind the cache keeps drops the copies of objects gone
    /// from the destination, but not one stored after the listing began
    /// (it may be of an object written since), and old temporaries of
    /// copies cut short; the index tells which tree packs are gone.
    #[test]
    fn lets_go_of_what_the_destination_no_longer_holds() {
        let d = tempfile::tempdir().unwrap();
        let repo = d.path().join("repo");
        std::fs::create_dir(&repo).unwrap();
        let inner = Arc::new(LocalBackend::open(&repo, SyncPolicy::NoSync).unwrap());
        let cache = d.path().join("cache");
        let c = CachingBackend::new(inner.clone(), &cache).unwrap();
        let named = |kind: &str, body: &str| {
            let h = blake3::hash(body.as_bytes()).to_hex();
            match kind {
                "tree/" => format!("tree/{}/{h}", &h[..2]),
                _ => format!("{kind}{h}"),
            }
        };
        let (kept, pruned, later) = (
            named("index/", "a"),
            named("index/", "b"),
            named("index/", "c"),
        );
        let (tree_kept, tree_pruned) = (named("tree/", "t1"), named("tree/", "t2"));
        for n in [&kept, &pruned, &later, &tree_kept, &tree_pruned] {
            let body = ["a", "b", "c", "t1", "t2"]
                .into_iter()
                .find(|b| n.ends_with(blake3::hash(b.as_bytes()).to_hex().as_str()))
                .unwrap();
            Backend::put(&c, n, body.as_bytes()).unwrap();
        }
        // Another machine's prune deletes two; one object is stored (by
        // another process of this machine) while the listing runs.
        inner.delete(&pruned).unwrap();
        inner.delete(&later).unwrap();
        inner.delete(&tree_pruned).unwrap();
        let a_minute_on = SystemTime::now() + std::time::Duration::from_secs(60);
        std::fs::File::options()
            .write(true)
            .open(cache.join(&later))
            .unwrap()
            .set_modified(a_minute_on)
            .unwrap();
        let old_tmp = cache.join("index/.tmp-1-cut-short");
        let new_tmp = cache.join("index/.tmp-2-being-written");
        for p in [&old_tmp, &new_tmp] {
            std::fs::write(p, b"part").unwrap();
        }
        let two_hours_ago = SystemTime::now() - std::time::Duration::from_secs(7200);
        std::fs::File::options()
            .write(true)
            .open(&old_tmp)
            .unwrap()
            .set_modified(two_hours_ago)
            .unwrap();

        let listed = Backend::list(&c, "index/").unwrap();
        assert_eq!(listed.len(), 1);
        assert!(cache.join(&kept).exists());
        assert!(!cache.join(&pruned).exists());
        assert!(
            cache.join(&later).exists(),
            "stored after the listing began"
        );
        assert!(!old_tmp.exists());
        assert!(new_tmp.exists());
        // A listing of one object, or of another kind, drops nothing.
        let _ = Backend::list(&c, "snapshots/");
        assert!(cache.join(&later).exists());

        let index_says = |n: &str| n == tree_kept;
        Backend::forget_cached(&c, "tree/", &index_says, SystemTime::now());
        assert!(cache.join(&tree_kept).exists());
        assert!(!cache.join(&tree_pruned).exists());
        assert_eq!(c.stats().dropped.load(Ordering::Relaxed), 3);
        // Data packs are never cached: nothing to walk, nothing dropped.
        Backend::forget_cached(&c, "data/", &|_| false, SystemTime::now());
        assert!(cache.join(&tree_kept).exists());
    }
}
