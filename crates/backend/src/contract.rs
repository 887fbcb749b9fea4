//! The contract itself: what a destination can be asked (objects put,
//! got, listed, deleted), what it answers, how it fails, and the layers
//! that wrap one destination in another.

use std::fs::File;
use std::io::{Read, Write};
use std::ops::Range;
use std::os::unix::fs::FileExt;
use std::sync::Arc;
use std::time::SystemTime;

pub use crate::error::{BackendError, ErrorKind};

/// Size (and, where cheap, other facts) of a stored object.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ObjectInfo {
    /// Full object name.
    pub name: String,
    /// Size in bytes.
    pub size: u64,
    /// Last modification, Unix seconds by the destination's clock, where a
    /// listing gives it (prune compares it with the local clock).
    pub modified: Option<i64>,
}

/// What a backend can do and how it prefers to be used.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Capabilities {
    /// Concurrent requests that pay off (the engine's upload/download width).
    pub concurrency: usize,
    /// Whether `put` makes data durable before returning.
    pub durable_put: bool,
    /// Whether the backend is on this machine (no round trips).
    pub local: bool,
    /// Whether [`Backend::put_file`] holds the whole object in memory while
    /// it sends it (an S3 request body must be complete before it is
    /// signed and sent). The backup then bounds how many such uploads run
    /// at once, and hands them reusable buffers through
    /// [`Backend::put_owned`]; streaming backends get the file instead.
    pub buffers_puts: bool,
}

/// Free and total bytes of a destination.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Space {
    /// Bytes this user can still write.
    pub free: u64,
    /// Capacity.
    pub total: u64,
}

/// The contract every destination implements: what the engine needs to
/// store and read a repository. All methods are safe to call from many
/// threads at once.
///
/// The destination lab needs a few more operations; they live in
/// [`LabBackend`], so that this contract stays the one a repository relies
/// on. Decorators implement [`Layer`] instead, and forward whatever they do
/// not change.
pub trait Backend: Send + Sync + std::fmt::Debug {
    /// Stores `data` under `name`.
    ///
    /// * Never overwrites: if `name` exists, fails with `AlreadyExists` and the
    ///   stored object is unchanged.
    /// * Atomic: readers see either no object or the whole object, never a
    ///   prefix, even if the process or connection dies mid-way.
    /// * Durable on return when `capabilities().durable_put` is true.
    /// * Not idempotent by itself; callers writing content-addressed names
    ///   may treat `AlreadyExists` as success.
    fn put(&self, name: &str, data: &[u8]) -> Result<(), BackendError>;

    /// Reads the whole object, or `range` of it. A range that extends past
    /// the end is `InvalidRange`; a missing object is `NotFound`.
    fn get(&self, name: &str, range: Option<Range<u64>>) -> Result<Vec<u8>, BackendError>;

    /// Size of an object; `NotFound` if missing.
    fn stat(&self, name: &str) -> Result<ObjectInfo, BackendError>;

    /// Every object whose name starts with `prefix` (a directory-like prefix
    /// ending in `/`, or empty), in no particular order. Incomplete uploads
    /// are never listed.
    fn list(&self, prefix: &str) -> Result<Vec<ObjectInfo>, BackendError>;

    /// The temporaries interrupted writes left behind (names whose last
    /// segment starts with [`crate::TEMP_PREFIX`]), with their sizes and times,
    /// for a prune to remove with [`Backend::delete`] once they are too old
    /// to belong to a write still under way. Destinations whose writes
    /// leave no such names (object stores) have none: the default.
    fn list_temporaries(&self) -> Result<Vec<ObjectInfo>, BackendError> {
        Ok(Vec::new())
    }

    /// Removes an object. Idempotent: deleting a missing object succeeds.
    fn delete(&self, name: &str) -> Result<(), BackendError>;

    /// Stores `size` bytes read from `data` under `name`, with the guarantees
    /// of [`Backend::put`], without holding the whole object in memory
    /// (objects may exceed 4 GiB). Fails if `data` ends before `size` bytes.
    ///
    /// The default buffers the object and calls `put`; backends override it.
    fn put_stream(&self, name: &str, size: u64, data: &mut dyn Read) -> Result<(), BackendError> {
        put_stream_buffered(self, name, size, data)
    }

    /// Stores `data` under `name` with the guarantees of [`Backend::put`],
    /// taking the buffer, so that a backend which must hold the object
    /// while it sends it (an S3 request body) need not copy it: the pack
    /// uploads of a backup would otherwise hold every pack twice. Gives the
    /// buffer back whenever it can, for reuse and for a retry.
    ///
    /// The default calls `put` and always gives the buffer back.
    fn put_owned(&self, name: &str, data: Vec<u8>) -> (Result<(), BackendError>, Option<Vec<u8>>) {
        let r = self.put(name, &data);
        (r, Some(data))
    }

    /// Stores the first `size` bytes of `file` under `name`, with the
    /// guarantees of [`Backend::put`]. The file is read by position from
    /// offset 0 and left as it was, so the same call may be made again: a
    /// retry layer can repeat it, which it cannot do with
    /// [`Backend::put_stream`]'s one-shot reader. This is how a backup
    /// uploads the packs it spilled to temporary files.
    ///
    /// The default streams the file through `put_stream`.
    fn put_file(&self, name: &str, file: &File, size: u64) -> Result<(), BackendError> {
        self.put_stream(name, size, &mut ReadAt::new(file))
    }

    /// Writes the object (or `range` of it) to `out` without holding it in
    /// memory; returns the number of bytes written. Errors as [`Backend::get`].
    ///
    /// The default calls `get`; backends override it.
    fn get_stream(
        &self,
        name: &str,
        range: Option<Range<u64>>,
        out: &mut dyn Write,
    ) -> Result<u64, BackendError> {
        get_stream_buffered(self, name, range, out)
    }

    /// Static facts about this backend.
    fn capabilities(&self) -> Capabilities;

    /// Where this backend points, for messages (`/srv/backup`, `s3://…`).
    fn location(&self) -> String;

    /// The versioned store's own operations (old versions, retention),
    /// where the destination has them: S3 only.
    fn history(&self) -> Option<&dyn crate::versioned::History> {
        None
    }

    /// What the repository still holds under `prefix` (a kind the local
    /// cache keeps: `tree/`), as an index read at `since` says: `keep`
    /// accepts the names that exist. A cache drops its copies of the others
    /// stored before `since` (another machine's prune deleted them, so no
    /// run will ask for them again); every other backend ignores it.
    fn forget_cached(&self, prefix: &str, keep: &dyn Fn(&str) -> bool, since: SystemTime) {
        let _ = (prefix, keep, since);
    }
}

/// What the destination lab needs beyond [`Backend`]: writes shaped like a
/// per-file copier's, free space, the cheapest round trip, and clean-up of
/// the directories its objects left. Never used for repository data. Every
/// method has a default that suits an object store, so a backend opts in
/// with an empty `impl` and overrides only what its protocol does better.
pub trait LabBackend: Backend {
    /// Writes `data` under `name` the way a per-file copier does: no
    /// temporary name, `writes` separate write requests of equal size, and a
    /// request for stable storage only when `sync`. It may replace an
    /// existing object. A synced call must cost the same round trips as an
    /// unsynced one (send the sync with the close), so that the lab's flush
    /// time is the sync.
    ///
    /// The default calls `put` (object stores have no unsynced write).
    fn probe_write(
        &self,
        name: &str,
        data: &[u8],
        writes: usize,
        sync: bool,
    ) -> Result<(), BackendError> {
        let _ = (writes, sync);
        self.delete(name)?;
        self.put(name, data)
    }

    /// Space on the destination, where it can tell (`None` for object
    /// stores).
    fn space(&self) -> Result<Option<Space>, BackendError> {
        Ok(None)
    }

    /// The cheapest request the protocol has, for measuring round-trip time.
    /// The default asks for an object that does not exist.
    fn ping(&self) -> Result<(), BackendError> {
        match self.stat("capsule-ping") {
            Ok(_) => Ok(()),
            Err(e) if e.kind == ErrorKind::NotFound => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Removes empty directories below the base, and the base itself if it
    /// ends up empty: the lab's clean-up after deleting its objects. Object
    /// stores have no directories; the default does nothing.
    fn remove_empty_dirs(&self) -> Result<(), BackendError> {
        Ok(())
    }
}

/// The forwarding base of a decorator (retries, accounting, cache, fault
/// injection): every operation of [`Backend`] and [`LabBackend`] goes to
/// [`Layer::inner`] unless the layer overrides it. A layer therefore writes
/// only what it changes, and an operation added to the contract later
/// reaches the destination through every layer instead of falling back to a
/// default (the way OpenDAL's layered accessor works).
///
/// Every `Layer` is a [`Backend`] and a [`LabBackend`]. Implement it by path
/// (`impl capsule_backend::Layer for …`) rather than importing it, so that
/// method calls on the layer resolve to [`Backend`] alone.
pub trait Layer: Send + Sync + std::fmt::Debug {
    /// The backend this layer wraps.
    fn inner(&self) -> &dyn LabBackend;

    /// See [`Backend::put`].
    fn put(&self, name: &str, data: &[u8]) -> Result<(), BackendError> {
        self.inner().put(name, data)
    }
    /// See [`Backend::get`].
    fn get(&self, name: &str, range: Option<Range<u64>>) -> Result<Vec<u8>, BackendError> {
        self.inner().get(name, range)
    }
    /// See [`Backend::stat`].
    fn stat(&self, name: &str) -> Result<ObjectInfo, BackendError> {
        self.inner().stat(name)
    }
    /// See [`Backend::list`].
    fn list(&self, prefix: &str) -> Result<Vec<ObjectInfo>, BackendError> {
        self.inner().list(prefix)
    }
    /// See [`Backend::list_temporaries`].
    fn list_temporaries(&self) -> Result<Vec<ObjectInfo>, BackendError> {
        self.inner().list_temporaries()
    }
    /// See [`Backend::delete`].
    fn delete(&self, name: &str) -> Result<(), BackendError> {
        self.inner().delete(name)
    }
    /// See [`Backend::put_stream`].
    fn put_stream(&self, name: &str, size: u64, data: &mut dyn Read) -> Result<(), BackendError> {
        self.inner().put_stream(name, size, data)
    }
    /// See [`Backend::put_owned`].
    fn put_owned(&self, name: &str, data: Vec<u8>) -> (Result<(), BackendError>, Option<Vec<u8>>) {
        self.inner().put_owned(name, data)
    }
    /// See [`Backend::put_file`].
    fn put_file(&self, name: &str, file: &File, size: u64) -> Result<(), BackendError> {
        self.inner().put_file(name, file, size)
    }
    /// See [`Backend::get_stream`].
    fn get_stream(
        &self,
        name: &str,
        range: Option<Range<u64>>,
        out: &mut dyn Write,
    ) -> Result<u64, BackendError> {
        self.inner().get_stream(name, range, out)
    }
    /// See [`Backend::capabilities`].
    fn capabilities(&self) -> Capabilities {
        self.inner().capabilities()
    }
    /// See [`Backend::location`].
    fn location(&self) -> String {
        self.inner().location()
    }
    /// See [`Backend::history`].
    fn history(&self) -> Option<&dyn crate::versioned::History> {
        self.inner().history()
    }
    /// See [`Backend::forget_cached`].
    fn forget_cached(&self, prefix: &str, keep: &dyn Fn(&str) -> bool, since: SystemTime) {
        self.inner().forget_cached(prefix, keep, since)
    }
    /// See [`LabBackend::probe_write`].
    fn probe_write(
        &self,
        name: &str,
        data: &[u8],
        writes: usize,
        sync: bool,
    ) -> Result<(), BackendError> {
        self.inner().probe_write(name, data, writes, sync)
    }
    /// See [`LabBackend::space`].
    fn space(&self) -> Result<Option<Space>, BackendError> {
        self.inner().space()
    }
    /// See [`LabBackend::ping`].
    fn ping(&self) -> Result<(), BackendError> {
        self.inner().ping()
    }
    /// See [`LabBackend::remove_empty_dirs`].
    fn remove_empty_dirs(&self) -> Result<(), BackendError> {
        self.inner().remove_empty_dirs()
    }
}

impl<L: Layer> Backend for L {
    fn put(&self, name: &str, data: &[u8]) -> Result<(), BackendError> {
        Layer::put(self, name, data)
    }
    fn get(&self, name: &str, range: Option<Range<u64>>) -> Result<Vec<u8>, BackendError> {
        Layer::get(self, name, range)
    }
    fn stat(&self, name: &str) -> Result<ObjectInfo, BackendError> {
        Layer::stat(self, name)
    }
    fn list(&self, prefix: &str) -> Result<Vec<ObjectInfo>, BackendError> {
        Layer::list(self, prefix)
    }
    fn list_temporaries(&self) -> Result<Vec<ObjectInfo>, BackendError> {
        Layer::list_temporaries(self)
    }
    fn delete(&self, name: &str) -> Result<(), BackendError> {
        Layer::delete(self, name)
    }
    fn put_stream(&self, name: &str, size: u64, data: &mut dyn Read) -> Result<(), BackendError> {
        Layer::put_stream(self, name, size, data)
    }
    fn put_owned(&self, name: &str, data: Vec<u8>) -> (Result<(), BackendError>, Option<Vec<u8>>) {
        Layer::put_owned(self, name, data)
    }
    fn put_file(&self, name: &str, file: &File, size: u64) -> Result<(), BackendError> {
        Layer::put_file(self, name, file, size)
    }
    fn get_stream(
        &self,
        name: &str,
        range: Option<Range<u64>>,
        out: &mut dyn Write,
    ) -> Result<u64, BackendError> {
        Layer::get_stream(self, name, range, out)
    }
    fn capabilities(&self) -> Capabilities {
        Layer::capabilities(self)
    }
    fn location(&self) -> String {
        Layer::location(self)
    }
    fn history(&self) -> Option<&dyn crate::versioned::History> {
        Layer::history(self)
    }
    fn forget_cached(&self, prefix: &str, keep: &dyn Fn(&str) -> bool, since: SystemTime) {
        Layer::forget_cached(self, prefix, keep, since)
    }
}

impl<L: Layer> LabBackend for L {
    fn probe_write(
        &self,
        name: &str,
        data: &[u8],
        writes: usize,
        sync: bool,
    ) -> Result<(), BackendError> {
        Layer::probe_write(self, name, data, writes, sync)
    }
    fn space(&self) -> Result<Option<Space>, BackendError> {
        Layer::space(self)
    }
    fn ping(&self) -> Result<(), BackendError> {
        Layer::ping(self)
    }
    fn remove_empty_dirs(&self) -> Result<(), BackendError> {
        Layer::remove_empty_dirs(self)
    }
}

impl<B: Backend + ?Sized> Backend for Arc<B> {
    fn put(&self, name: &str, data: &[u8]) -> Result<(), BackendError> {
        (**self).put(name, data)
    }
    fn get(&self, name: &str, range: Option<Range<u64>>) -> Result<Vec<u8>, BackendError> {
        (**self).get(name, range)
    }
    fn stat(&self, name: &str) -> Result<ObjectInfo, BackendError> {
        (**self).stat(name)
    }
    fn list(&self, prefix: &str) -> Result<Vec<ObjectInfo>, BackendError> {
        (**self).list(prefix)
    }
    fn list_temporaries(&self) -> Result<Vec<ObjectInfo>, BackendError> {
        (**self).list_temporaries()
    }
    fn delete(&self, name: &str) -> Result<(), BackendError> {
        (**self).delete(name)
    }
    fn put_stream(&self, name: &str, size: u64, data: &mut dyn Read) -> Result<(), BackendError> {
        (**self).put_stream(name, size, data)
    }
    fn put_owned(&self, name: &str, data: Vec<u8>) -> (Result<(), BackendError>, Option<Vec<u8>>) {
        (**self).put_owned(name, data)
    }
    fn put_file(&self, name: &str, file: &File, size: u64) -> Result<(), BackendError> {
        (**self).put_file(name, file, size)
    }
    fn get_stream(
        &self,
        name: &str,
        range: Option<Range<u64>>,
        out: &mut dyn Write,
    ) -> Result<u64, BackendError> {
        (**self).get_stream(name, range, out)
    }
    fn capabilities(&self) -> Capabilities {
        (**self).capabilities()
    }
    fn location(&self) -> String {
        (**self).location()
    }
    fn history(&self) -> Option<&dyn crate::versioned::History> {
        (**self).history()
    }
    fn forget_cached(&self, prefix: &str, keep: &dyn Fn(&str) -> bool, since: SystemTime) {
        (**self).forget_cached(prefix, keep, since)
    }
}

impl<B: LabBackend + ?Sized> LabBackend for Arc<B> {
    fn probe_write(
        &self,
        name: &str,
        data: &[u8],
        writes: usize,
        sync: bool,
    ) -> Result<(), BackendError> {
        (**self).probe_write(name, data, writes, sync)
    }
    fn space(&self) -> Result<Option<Space>, BackendError> {
        (**self).space()
    }
    fn ping(&self) -> Result<(), BackendError> {
        (**self).ping()
    }
    fn remove_empty_dirs(&self) -> Result<(), BackendError> {
        (**self).remove_empty_dirs()
    }
}

/// `put_stream` through `put`: reads the whole object into memory first
/// (the default, for backends without a streaming upload).
pub fn put_stream_buffered<B: Backend + ?Sized>(
    b: &B,
    name: &str,
    size: u64,
    data: &mut dyn Read,
) -> Result<(), BackendError> {
    let mut buf = Vec::new();
    read_exact_len(data, size, &mut buf, name)?;
    b.put(name, &buf)
}

/// A reader over a file by position, from offset 0, that leaves the file's
/// own cursor alone: what [`Backend::put_file`] hands to `put_stream`.
#[derive(Debug)]
pub struct ReadAt<'a> {
    file: &'a File,
    pos: u64,
}

impl<'a> ReadAt<'a> {
    /// Reads `file` from its first byte.
    pub fn new(file: &'a File) -> Self {
        ReadAt { file, pos: 0 }
    }
}

impl Read for ReadAt<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.file.read_at(buf, self.pos)?;
        self.pos += n as u64;
        Ok(n)
    }
}

/// `get_stream` through `get`: holds the whole object (or range) in memory.
pub fn get_stream_buffered<B: Backend + ?Sized>(
    b: &B,
    name: &str,
    range: Option<Range<u64>>,
    out: &mut dyn Write,
) -> Result<u64, BackendError> {
    let data = b.get(name, range)?;
    out.write_all(&data).map_err(|e| write_out_error(name, e))?;
    Ok(data.len() as u64)
}

/// The error of a `get_stream` whose caller-side writer failed (the object
/// itself was fine).
pub fn write_out_error(name: &str, e: std::io::Error) -> BackendError {
    BackendError::new(ErrorKind::Io, "get", name, format!("writing out: {e}"))
}

/// Reads exactly `size` bytes from `data` into `buf` (for `put_stream`
/// implementations that need a chunk, or the whole object, in memory).
pub fn read_exact_len(
    data: &mut dyn Read,
    size: u64,
    buf: &mut Vec<u8>,
    name: &str,
) -> Result<(), BackendError> {
    buf.clear();
    // Room for exactly `size` (up to a sane bound): `read_to_end` alone
    // grows by doubling, and a 16.8 MiB pack would take a 32 MiB buffer.
    if size <= 1 << 30 {
        buf.reserve_exact(size as usize);
    }
    let got = data.take(size).read_to_end(buf).map_err(|e| {
        BackendError::new(ErrorKind::Io, "put", name, format!("reading source: {e}"))
    })?;
    if (got as u64) < size {
        return Err(BackendError::new(
            ErrorKind::Io,
            "put",
            name,
            format!("source ended after {got} of {size} bytes"),
        ));
    }
    Ok(())
}

/// Checks that `range` lies within an object of `size` bytes; the error every
/// backend returns for a range past the end.
pub fn check_range(name: &str, range: &Range<u64>, size: u64) -> Result<(), BackendError> {
    if range.start > range.end || range.end > size {
        return Err(BackendError::new(
            ErrorKind::InvalidRange,
            "get",
            name,
            format!(
                "range {}..{} outside object of {size} bytes",
                range.start, range.end
            ),
        ));
    }
    Ok(())
}

/// Checks a name against the allowed alphabet and shape.
pub fn validate_name(name: &str) -> Result<(), BackendError> {
    let ok = !name.is_empty()
        && name.len() <= 512
        && name.split('/').all(|seg| {
            !seg.is_empty()
                && seg != "."
                && seg != ".."
                && seg
                    .bytes()
                    .all(|b| b.is_ascii_digit() || b.is_ascii_lowercase() || b"._-".contains(&b))
        });
    if ok {
        Ok(())
    } else {
        Err(BackendError::new(
            ErrorKind::InvalidName,
            "name",
            name,
            "object names are lower-case [0-9a-z._-] segments separated by '/'",
        ))
    }
}
