//! The SFTP backend's requests: pipelined reads and writes, listings
//! walked several directories deep at once, a connection redialed when
//! it dies.

use std::collections::HashSet;
use std::io::Read;
use std::ops::Range;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use capsule_backend::{check_range, BackendError, ErrorKind};
use futures::stream::{FuturesOrdered, FuturesUnordered};
use futures::StreamExt;
use russh_sftp::client::error::Error as SftpError;
use russh_sftp::protocol::{FileAttributes, OpenFlags, StatusCode};

use super::dial::{
    closed, default_key, is_missing, lock, sftp_err, Auth, Conn, Dialer, Sent, REDIAL_AFTER,
};
use crate::options::Options;
use crate::rt::block_on;
use crate::url::SftpTarget;

/// Requests in flight per object being written or read.
const PIPELINE: usize = 32;

/// READDIR requests in flight per directory listed.
const READDIR_DEPTH: usize = 4;

/// Bytes of write requests in flight per object, at most: each request
/// holds its own copy until the server answers. 4 MiB fills 10 ms at
/// 400 MB/s for one upload.
const WRITE_IN_FLIGHT: u64 = 4 << 20;

/// An SFTP directory as a capsule backend.
#[derive(Debug)]
pub struct SftpBackend {
    pub(crate) dialer: Arc<Dialer>,
    pub(crate) base: String,
    pool: Vec<Slot>,
    /// When each slot's last background dial failed: a slot is not dialled
    /// again in the background for [`REDIAL_AFTER`], so a server that
    /// refuses more sessions is not asked on every request.
    dial_failed: Arc<Vec<Mutex<Option<std::time::Instant>>>>,
    /// Requests active right now (picks the pool slot).
    active: AtomicUsize,
    pub(crate) dirs: Mutex<HashSet<String>>,
    pub(crate) concurrency: usize,
    /// Whether the server refuses renames (an append-only account:
    /// `internal-sftp -P rename,posix-rename,…`), asked once, at the first
    /// write: objects are then written under their own names.
    renames_refused: tokio::sync::OnceCell<bool>,
}

/// Objects are created read-only (as restic creates its files): on an
/// account that may not change permissions (`-P setstat,fsetstat`), not
/// even its owner can then open one to overwrite or truncate it. Deleting
/// is a right of the directory, and unaffected.
fn read_only() -> FileAttributes {
    FileAttributes {
        permissions: Some(0o444),
        ..FileAttributes::default()
    }
}

/// One place in the connection pool.
type Slot = Arc<tokio::sync::Mutex<Option<Arc<Conn>>>>;

impl SftpBackend {
    /// Connects (one SSH connection now, more on demand) and checks that the
    /// base directory exists.
    pub fn connect(t: &SftpTarget, opts: &Options) -> Result<Self, BackendError> {
        let location = crate::url::Destination::Sftp(t.clone()).to_string();
        let key_path = opts.ssh_key.clone().or_else(default_key);
        let key = match &key_path {
            Some(p) => Some(Arc::new(russh::keys::load_secret_key(p, None).map_err(|e| {
                BackendError::new(
                    ErrorKind::AuthFailed,
                    "connect",
                    &location,
                    format!(
                        "cannot load the SSH key {}: {e} (keys with a passphrase are not supported; use an agent-free key or a password)",
                        p.display()
                    ),
                )
            })?)),
            None => None,
        };
        if key.is_none() && opts.password.is_none() {
            return Err(BackendError::new(
                ErrorKind::AuthFailed,
                "connect",
                &location,
                "no SSH key found and no password given: set CAPSULE_SFTP_KEY or CAPSULE_SFTP_PASSWORD",
            ));
        }
        let known_hosts = opts
            .known_hosts
            .clone()
            .or_else(|| dirs::home_dir().map(|h| h.join(".ssh/known_hosts")))
            .unwrap_or_else(|| PathBuf::from("/etc/ssh/ssh_known_hosts"));
        let conns = opts.concurrency.unwrap_or(8).clamp(1, 64);
        let mut b = SftpBackend {
            dialer: Arc::new(Dialer {
                target: t.clone(),
                location,
                auth: Auth {
                    key,
                    key_path,
                    password: opts.password.clone(),
                    known_hosts,
                },
            }),
            base: String::new(),
            // A few SSH connections carry all requests: each has its own
            // sshd process (a core on the server) and its own TCP window.
            pool: (0..conns.div_ceil(2).min(4))
                .map(|_| Arc::new(tokio::sync::Mutex::new(None)))
                .collect(),
            dial_failed: Arc::new(
                (0..conns.div_ceil(2).min(4))
                    .map(|_| Mutex::new(None))
                    .collect(),
            ),
            active: AtomicUsize::new(0),
            dirs: Mutex::new(HashSet::new()),
            concurrency: conns,
            renames_refused: tokio::sync::OnceCell::new(),
        };
        let first = block_on(b.dialer.open())?;
        if opts.create {
            block_on(async {
                // mkdir -p, from the root down; failures for levels that
                // exist are expected and ignored, the final stat decides.
                let mut cur = if t.path.starts_with('/') {
                    String::new()
                } else {
                    ".".to_string()
                };
                for seg in t.path.split('/').filter(|s| !s.is_empty()) {
                    cur = format!("{cur}/{seg}");
                    let _ = first
                        .sftp
                        .mkdir(cur.clone(), FileAttributes::default())
                        .await;
                }
            });
        }
        let base = block_on(first.sftp.realpath(t.path.clone()))
            .map_err(|e| b.base_error(e))?
            .files
            .into_iter()
            .next()
            .map(|f| f.filename)
            .unwrap_or_else(|| t.path.clone());
        match block_on(first.sftp.stat(base.clone())) {
            Ok(a) if a.attrs.is_dir() => {}
            Ok(_) => {
                return Err(BackendError::new(
                    ErrorKind::NoContainer,
                    "connect",
                    &b.dialer.location,
                    format!("{base} on the server is not a directory"),
                ))
            }
            Err(e) => return Err(b.base_error(e)),
        }
        b.base = base.trim_end_matches('/').to_string();
        if b.base.is_empty() {
            b.base = "/".into();
        }
        b.pool[0] = Arc::new(tokio::sync::Mutex::new(Some(first)));
        Ok(b)
    }

    fn base_error(&self, e: SftpError) -> BackendError {
        if is_missing(&e) {
            BackendError::new(
                ErrorKind::NoContainer,
                "connect",
                &self.dialer.location,
                format!(
                    "the directory {} does not exist on the server; create it first",
                    self.dialer.target.path
                ),
            )
        } else {
            sftp_err("connect", &self.dialer.location, e)
        }
    }

    /// A live connection from the pool. The slot follows the number of
    /// requests already active, so a run that makes one request at a time
    /// (a no-change backup) uses one connection and pays for one SSH
    /// handshake, while parallel uploads spread out.
    ///
    /// A handshake costs a dozen round trips (over 150 ms at 10 ms RTT), so
    /// a request whose slot has no connection yet does not wait for one:
    /// the slot's connection is opened in the background, and meanwhile the
    /// request shares a live connection (SFTP multiplexes requests). Only
    /// when no connection is live does the request open one itself.
    pub(crate) async fn conn(&self, active: usize) -> Result<Arc<Conn>, BackendError> {
        let i = active % self.pool.len();
        let slot = &self.pool[i];
        if let Ok(mut guard) = slot.clone().try_lock_owned() {
            if let Some(c) = guard.as_ref().filter(|c| !c._ssh.is_closed()) {
                return Ok(c.clone());
            }
            if let Some(live) = self.any_live() {
                let recently_failed =
                    lock(&self.dial_failed[i]).is_some_and(|t| t.elapsed() < REDIAL_AFTER);
                if !recently_failed {
                    let dialer = self.dialer.clone();
                    let failed = self.dial_failed.clone();
                    tokio::spawn(async move {
                        // A failure leaves the slot empty; the live
                        // connections carry the requests meanwhile.
                        *guard = dialer.open().await.ok();
                        *lock(&failed[i]) = guard.is_none().then(std::time::Instant::now);
                    });
                }
                return Ok(live);
            }
            let c = self.dialer.open().await?;
            *guard = Some(c.clone());
            return Ok(c);
        }
        // The slot is being opened (or replaced) right now.
        if let Some(live) = self.any_live() {
            return Ok(live);
        }
        let mut guard = slot.lock().await;
        if let Some(c) = guard.as_ref().filter(|c| !c._ssh.is_closed()) {
            return Ok(c.clone());
        }
        let c = self.dialer.open().await?;
        *guard = Some(c.clone());
        Ok(c)
    }

    /// Any live connection in the pool, without waiting for a slot.
    fn any_live(&self) -> Option<Arc<Conn>> {
        self.pool.iter().find_map(|s| {
            s.try_lock()
                .ok()?
                .as_ref()
                .filter(|c| !c._ssh.is_closed())
                .cloned()
        })
    }

    /// Forgets a connection after an error that may have killed it.
    async fn drop_conn(&self, c: &Arc<Conn>) {
        for s in &self.pool {
            let mut slot = s.lock().await;
            if slot.as_ref().is_some_and(|x| Arc::ptr_eq(x, c)) {
                *slot = None;
            }
        }
    }

    pub(crate) fn path(&self, name: &str) -> String {
        if name.is_empty() {
            return self.base.clone();
        }
        format!("{}/{name}", self.base.trim_end_matches('/'))
    }

    pub(crate) async fn with_conn<T, F, Fut>(&self, f: F) -> Result<T, BackendError>
    where
        F: FnOnce(Arc<Conn>) -> Fut,
        Fut: std::future::Future<Output = Result<T, BackendError>>,
    {
        let active = self.active.fetch_add(1, Ordering::Relaxed);
        let c = self.conn(active).await;
        let c = match c {
            Ok(c) => c,
            Err(e) => {
                self.active.fetch_sub(1, Ordering::Relaxed);
                return Err(e);
            }
        };
        // A connection cut mid-request leaves its SFTP requests waiting for
        // their timeout; watching the SSH session ends them as soon as it
        // closes, so the retry layer can reconnect promptly.
        let r = tokio::select! {
            r = f(c.clone()) => r,
            _ = closed(&c) => Err(BackendError::transient(
                ErrorKind::Unreachable,
                "request",
                &self.dialer.location,
                "the SSH connection was closed",
            )),
        };
        self.active.fetch_sub(1, Ordering::Relaxed);
        if let Err(e) = &r {
            if e.kind == ErrorKind::Unreachable {
                self.drop_conn(&c).await;
            }
        }
        r
    }

    /// Creates `dir` and its missing parents under the base.
    pub(crate) async fn make_dirs(&self, c: &Conn, rel_dir: &str) -> Result<(), BackendError> {
        let mut cur = String::new();
        for seg in rel_dir.split('/') {
            if !cur.is_empty() {
                cur.push('/');
            }
            cur.push_str(seg);
            if lock(&self.dirs).contains(&cur) {
                continue;
            }
            match c
                .sftp
                .mkdir(self.path(&cur), FileAttributes::default())
                .await
            {
                Ok(_) => {}
                // Exists already (SFTP v3 has no code for that): check. If
                // the check itself fails because the connection went, say
                // that (retried), not the mkdir's generic failure: a cut at
                // this point was once reported as a permanent error.
                Err(e) => {
                    if let Err(se) = c.sftp.stat(self.path(&cur)).await {
                        let se = sftp_err("put", &cur, se);
                        return Err(if se.transient || c._ssh.is_closed() {
                            BackendError::transient(ErrorKind::Unreachable, "put", &cur, se.message)
                        } else {
                            sftp_err("put", &cur, e)
                        });
                    }
                }
            }
            lock(&self.dirs).insert(cur.clone());
        }
        Ok(())
    }

    /// Whether this account may not rename: a rename of a name that does
    /// not exist is refused before it is tried (PERMISSION_DENIED) when the
    /// server denies the request, and fails for the missing file otherwise.
    async fn renames_refused(&self, c: &Conn) -> bool {
        *self
            .renames_refused
            .get_or_init(|| async {
                let probe = |n: &str| {
                    self.path(&format!(
                        "{}probe-{n}-{}",
                        capsule_backend::TEMP_PREFIX,
                        crate::dirwalk::random_suffix()
                    ))
                };
                matches!(
                    c.sftp.rename(probe("a"), probe("b")).await,
                    Err(russh_sftp::client::error::Error::Status(s))
                        if s.status_code == StatusCode::PermissionDenied
                )
            })
            .await
    }

    /// Writes `size` bytes from `source` under `name`: into a new temporary
    /// next to it, renamed into place; or, on an account that may not
    /// rename, straight under its own name.
    pub(crate) async fn put_inner(
        &self,
        c: &Conn,
        name: &str,
        size: u64,
        source: &mut dyn Read,
    ) -> Result<(), BackendError> {
        if self.renames_refused(c).await {
            return self.put_direct(c, name, size, source).await;
        }
        let dir = name.rsplit_once('/').map(|(d, _)| d);
        let tmp_rel = match dir {
            Some(d) => format!(
                "{d}/{}{}",
                capsule_backend::TEMP_PREFIX,
                crate::dirwalk::random_suffix()
            ),
            None => format!(
                "{}{}",
                capsule_backend::TEMP_PREFIX,
                crate::dirwalk::random_suffix()
            ),
        };
        let tmp = self.path(&tmp_rel);
        let flags = OpenFlags::CREATE | OpenFlags::EXCLUDE | OpenFlags::WRITE;
        let handle = match c.sftp.open(tmp.clone(), flags, read_only()).await {
            Ok(h) => h.handle,
            Err(e) if is_missing(&e) && dir.is_some() => {
                self.make_dirs(c, dir.unwrap_or_default()).await?;
                c.sftp
                    .open(tmp.clone(), flags, read_only())
                    .await
                    .map_err(|e| sftp_err("put", name, e))?
                    .handle
            }
            Err(e) => return Err(sftp_err("put", name, e)),
        };
        let failed = self.send_body(c, handle, name, size, source).await;
        if let Some(mut e) = failed {
            let _ = c.sftp.remove(tmp).await;
            if e.kind == ErrorKind::Io && c._ssh.is_closed() {
                // A generic failure on a connection that is gone is the
                // connection's failure: retried.
                e.kind = ErrorKind::Unreachable;
                e.transient = true;
            } else if e.kind == ErrorKind::Io {
                e = self.explain_failure(c, e, size).await;
            }
            return Err(e);
        }
        match c.sftp.rename(tmp.clone(), self.path(name)).await {
            Ok(_) => Ok(()),
            Err(e) => {
                let _ = c.sftp.remove(tmp).await;
                match c.sftp.stat(self.path(name)).await {
                    Ok(_) => Err(BackendError::new(
                        ErrorKind::AlreadyExists,
                        "put",
                        name,
                        "object exists",
                    )),
                    Err(_) => Err(sftp_err("put", name, e)),
                }
            }
        }
    }

    /// Sends the object's bytes on an open `handle`, then its fsync and
    /// close; returns the first failure.
    async fn send_body(
        &self,
        c: &Conn,
        handle: String,
        name: &str,
        size: u64,
        source: &mut dyn Read,
    ) -> Option<BackendError> {
        // Every request goes out as soon as it is made; only the rename
        // waits. The server handles the requests on one handle in the order
        // they arrive (draft-ietf-secsh-filexfer-02, 6.1), so the fsync
        // sent behind the last write covers every write, and the close
        // behind it: an upload costs three round trips (open; writes,
        // fsync and close; rename) whatever its size, not five.
        let mut failed: Option<BackendError> = None;
        let mut in_flight = FuturesUnordered::new();
        let write_depth = PIPELINE.min((WRITE_IN_FLIGHT / c.write_len.max(1)).max(1) as usize);
        let mut off = 0u64;
        let mut buf = Vec::new();
        while off < size && failed.is_none() {
            let n = (size - off).min(c.write_len);
            if let Err(e) = capsule_backend::read_exact_len(source, n, &mut buf, name) {
                failed = Some(e);
                break;
            }
            let write = c.sftp.write(handle.clone(), off, std::mem::take(&mut buf));
            in_flight.push(Sent::now(write).await.answer());
            off += n;
            while in_flight.len() >= write_depth {
                if let Some(Err(e)) = in_flight.next().await {
                    failed.get_or_insert(sftp_err("put", name, e));
                }
            }
        }
        let fsync = if failed.is_none() && c.fsync {
            Some(Sent::now(c.sftp.fsync(handle.clone())).await)
        } else {
            None
        };
        let close = Sent::now(c.sftp.close(handle)).await;
        while let Some(r) = in_flight.next().await {
            if let Err(e) = r {
                failed.get_or_insert(sftp_err("put", name, e));
            }
        }
        if let Some(f) = fsync {
            if let Err(e) = f.answer().await {
                failed.get_or_insert(sftp_err("put", name, e));
            }
        }
        if let Err(e) = close.answer().await {
            failed.get_or_insert(sftp_err("put", name, e));
        }
        failed
    }

    /// Writes the object under its own name, read-only, for an account
    /// that may not rename. A run cut short leaves a partial object this
    /// account may not remove: it is told apart by its size (the server
    /// writes a handle's requests in order, so an object of the full size
    /// is whole), and named in the error, for the admin to remove.
    async fn put_direct(
        &self,
        c: &Conn,
        name: &str,
        size: u64,
        source: &mut dyn Read,
    ) -> Result<(), BackendError> {
        let path = self.path(name);
        let dir = name.rsplit_once('/').map(|(d, _)| d);
        let flags = OpenFlags::CREATE | OpenFlags::EXCLUDE | OpenFlags::WRITE;
        let opened = match c.sftp.open(path.clone(), flags, read_only()).await {
            Err(e) if is_missing(&e) && dir.is_some() => {
                self.make_dirs(c, dir.unwrap_or_default()).await?;
                c.sftp.open(path.clone(), flags, read_only()).await
            }
            other => other,
        };
        let handle = match opened {
            Ok(h) => h.handle,
            Err(e) => {
                return match c.sftp.stat(path).await {
                    Ok(a) if a.attrs.size == Some(size) => Err(BackendError::new(
                        ErrorKind::AlreadyExists,
                        "put",
                        name,
                        "object exists",
                    )),
                    Ok(a) => Err(BackendError::new(
                        ErrorKind::Io,
                        "put",
                        name,
                        format!(
                            "a partial object ({} of {size} bytes) from an upload cut short is in the way, and this account may not remove it (the server refuses renames and deletions: an append-only account); the next run writes under other names, and a prune with an account that may delete removes it",
                            a.attrs.size.unwrap_or(0)
                        ),
                    )),
                    Err(_) => Err(sftp_err("put", name, e)),
                };
            }
        };
        match self.send_body(c, handle, name, size, source).await {
            None => Ok(()),
            Some(mut e) => {
                if e.kind == ErrorKind::Io && c._ssh.is_closed() {
                    e.kind = ErrorKind::Unreachable;
                    e.transient = true;
                } else if e.kind == ErrorKind::Io {
                    e = self.explain_failure(c, e, size).await;
                }
                Err(e)
            }
        }
    }

    /// SFTP v3 reports a full disk as a generic failure; ask the server for
    /// its free space to tell the user what actually happened.
    async fn explain_failure(&self, c: &Conn, e: BackendError, size: u64) -> BackendError {
        if let Ok(v) = c.sftp.statvfs(self.base.clone()).await {
            let free = v.blocks_avail.saturating_mul(v.fragment_size.max(1));
            // Less room than the uploads in flight need means the disk
            // filled up (the other uploads' temporaries come and go, so
            // compare with all of them, not just this one).
            let needed = size.max(1 << 20).saturating_mul(self.concurrency as u64);
            if free < needed {
                return BackendError::new(
                    ErrorKind::NoSpace,
                    e.op,
                    &e.name,
                    format!("{} (the server reports {free} bytes free)", e.message),
                );
            }
        }
        e
    }

    pub(crate) async fn read_range(
        &self,
        c: &Conn,
        name: &str,
        range: Option<Range<u64>>,
        sink: &mut dyn FnMut(&[u8]) -> Result<(), BackendError>,
    ) -> Result<u64, BackendError> {
        // The open and the stat go out together (a stat by path needs no
        // handle), and the close goes out behind the last read and is not
        // waited for: a read costs two round trips, not four.
        let path = self.path(name);
        let (opened, attrs) = futures::join!(
            c.sftp
                .open(path.clone(), OpenFlags::READ, FileAttributes::default()),
            c.sftp.stat(path)
        );
        let handle = opened.map_err(|e| sftp_err("get", name, e))?.handle;
        let mut close = None;
        let res = async {
            let size = attrs
                .map_err(|e| sftp_err("get", name, e))?
                .attrs
                .size
                .unwrap_or(0);
            let r = range.clone().unwrap_or(0..size);
            check_range(name, &r, size)?;
            // Ordered, so chunks reach the sink in file order.
            let mut in_flight = FuturesOrdered::new();
            let mut next = r.start;
            let mut done = 0u64;
            loop {
                while next < r.end && in_flight.len() < PIPELINE {
                    let n = (r.end - next).min(c.read_len);
                    let read = c.sftp.read(handle.clone(), next, n as u32);
                    in_flight.push_back(Sent::now(read).await.answer());
                    next += n;
                }
                if next >= r.end && close.is_none() {
                    close = Some(Sent::now(c.sftp.close(handle.clone())).await);
                }
                let Some(d) = in_flight.next().await else {
                    break;
                };
                let d = d.map_err(|e| sftp_err("get", name, e))?;
                if d.data.is_empty() {
                    return Err(BackendError::new(
                        ErrorKind::Io,
                        "get",
                        name,
                        "the object shrank while being read",
                    ));
                }
                sink(&d.data)?;
                done += d.data.len() as u64;
            }
            if done != r.end - r.start {
                return Err(BackendError::new(
                    ErrorKind::Io,
                    "get",
                    name,
                    format!(
                        "short read: {done} of {} bytes (server sent partial chunks)",
                        r.end - r.start
                    ),
                ));
            }
            Ok(done)
        }
        .await;
        if close.is_none() {
            close = Some(Sent::now(c.sftp.close(handle)).await);
        }
        // Nothing depends on the close's answer; russh-sftp drops answers
        // nobody waits for.
        drop(close);
        res
    }

    /// One directory for the shared walk; `None` if it does not exist.
    pub(crate) async fn read_dir(
        &self,
        c: &Conn,
        d: String,
    ) -> Result<Option<Vec<crate::dirwalk::DirEntry>>, BackendError> {
        match self.list_dir(c, &d).await {
            Ok(entries) => Ok(Some(entries)),
            Err(e) if is_missing(&e) => Ok(None),
            Err(e) => Err(sftp_err("list", &d, e)),
        }
    }

    async fn list_dir(
        &self,
        c: &Conn,
        rel: &str,
    ) -> Result<Vec<crate::dirwalk::DirEntry>, SftpError> {
        let handle = c.sftp.opendir(self.path(rel)).await?.handle;
        let mut entries = Vec::new();
        // Several READDIRs in flight at once: the server answers them in
        // order, each with the next batch of names (OpenSSH sends at most
        // 100) and then EOF, so a directory of a few hundred entries takes
        // one round trip after the open instead of one per batch.
        let mut in_flight = FuturesOrdered::new();
        let res = 'listing: loop {
            for _ in 0..READDIR_DEPTH {
                in_flight.push_back(Sent::now(c.sftp.readdir(handle.clone())).await.answer());
            }
            while let Some(r) = in_flight.next().await {
                match r {
                    Ok(name) => entries.extend(name.files.into_iter().filter_map(|f| {
                        let is_dir = f.attrs.is_dir();
                        // Symlinks, sockets and the like are not objects.
                        (is_dir || f.attrs.is_regular()).then(|| crate::dirwalk::DirEntry {
                            name: f.filename,
                            is_dir,
                            size: f.attrs.size.unwrap_or(0),
                            modified: f.attrs.mtime.map(i64::from),
                        })
                    })),
                    Err(SftpError::Status(s)) if s.status_code == StatusCode::Eof => {
                        break 'listing Ok(())
                    }
                    Err(e) => break 'listing Err(e),
                }
            }
        };
        // The READDIRs still in flight answer EOF; their answers and the
        // close's are dropped unread.
        drop(in_flight);
        drop(Sent::now(c.sftp.close(handle)).await);
        res.map(|_| entries)
    }
}
