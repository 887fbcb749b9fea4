//! SMB2/3 shares through the pure-Rust `smb2` crate: no kernel mount, no
//! FUSE. Why this crate: docs/DESIGN.md "SMB client" (it was measured
//! against Samba beside `smb` 0.12; figures in shared research).
//!
//! * One SMB session (one TCP connection, signed) carries every request;
//!   clones of its `Connection` pipeline requests from many engine threads,
//!   bounded by the server's credits.
//! * No overwrite, atomically: the object is written to `.tmp-<random>` in
//!   its directory (CREATE+WRITE+FLUSH in one compound for small objects,
//!   pipelined 512 KiB WRITEs for packs, FLUSH before CLOSE so it is on the
//!   NAS's disk), then renamed without `ReplaceIfExists`: the server refuses
//!   the rename if the name exists, which settles races.
//! * Dead sessions are re-established by the client for idempotent requests;
//!   other failures surface as transient errors for capsule's retry layer.

use std::collections::HashSet;
use std::io::{Read, Write};
use std::ops::Range;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use capsule_backend::{
    check_range, validate_name, Backend, BackendError, Capabilities, ErrorKind, LabBackend,
    ObjectInfo, Space,
};
use smb2::client::connection::Connection;
use smb2::{ClientConfig, SmbClient, Tree};

use crate::options::Options;
use crate::rt::block_on;
use crate::url::SmbTarget;

/// Objects up to this size go in one compound request; larger ones are
/// written with pipelined WRITEs.
const COMPOUND_MAX: usize = 1 << 20;
/// Chunk for streamed reads, [`READS_IN_FLIGHT`] of them asked for at
/// once on one handle (what smbclient does): one 4 MiB READ at a time made
/// a 16 MiB pack four round trips end to end, and `check --read-data` read
/// 102 MiB/s at 10 ms where four smbclients read 250 (`bench/verify.sh`).
/// The bytes in flight stay what one 4 MiB chunk was.
const STREAM_CHUNK: usize = 1 << 20;
const READS_IN_FLIGHT: usize = 4;
/// Chunk for streamed writes. The writer pipelines its WRITEs in a window
/// of its own (up to 4 MiB in flight), so a larger chunk only adds copies
/// per upload: ours, and the writer's pending buffer. With 4 MiB chunks,
/// eight uploads of large files held 150 MiB peak RSS.
const WRITE_CHUNK: usize = 1 << 20;
/// What any request may take besides moving its bytes (see
/// [`SmbBackend::bounded`]).
const REQUEST_ALLOWANCE: Duration = Duration::from_secs(120);
/// What an object read whose size is not known up front is allowed.
const UNKNOWN_READ: u64 = 64 << 20;
/// What a listing may take: it is many requests (every directory, in
/// rounds), and a large repository on a slow link needs minutes.
const LIST_LIMIT: Duration = Duration::from_secs(600);

/// The deadline of a request moving `bytes`: two minutes, plus the bytes
/// at 50 KB/s. Generous on purpose: eight uploads share the link, and a
/// deadline that a slow uplink could reach would fail good uploads over
/// and over; it is there to end a hang, not to judge speed.
fn limit_for(bytes: u64) -> Duration {
    REQUEST_ALLOWANCE + Duration::from_micros(bytes.saturating_mul(20))
}

/// A directory on an SMB share as a capsule backend.
pub struct SmbBackend {
    location: String,
    // Held so the session stays up; requests use clones of its connection.
    _client: tokio::sync::Mutex<SmbClient>,
    conn: Connection,
    /// The share's tree connection and the connection generation it belongs
    /// to: a revived session invalidates every tree id, so the tree is
    /// connected again (see [`SmbBackend::live`]).
    tree: std::sync::RwLock<(u64, Arc<Tree>)>,
    share: String,
    base: String,
    dirs: Mutex<HashSet<String>>,
    concurrency: usize,
}

impl std::fmt::Debug for SmbBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SmbBackend")
            .field("location", &self.location)
            .finish()
    }
}

fn smb_err(op: &'static str, name: &str, e: smb2::Error) -> BackendError {
    use smb2::types::status::NtStatus;
    use smb2::ErrorKind as K;
    // Objects are never rewritten in place, so another client holding one
    // open exclusively is a delete of it in flight (the delete's CREATE
    // shares only delete access for one round trip): worth asking again.
    let sharing = e.kind() == K::SharingViolation;
    let transient = e.is_retryable() || sharing;
    let kind = match e.kind() {
        // Deleted by another client that has not yet closed its handle: it
        // is gone for every purpose of ours (a listing then a read of a
        // session being ended must not call it unreadable).
        _ if e.status() == Some(NtStatus::DELETE_PENDING) => ErrorKind::NotFound,
        K::NotFound => ErrorKind::NotFound,
        K::AlreadyExists => ErrorKind::AlreadyExists,
        K::AccessDenied => ErrorKind::PermissionDenied,
        K::AuthRequired | K::GuestSessionRefused => ErrorKind::AuthFailed,
        K::DiskFull => ErrorKind::NoSpace,
        K::SharingViolation => ErrorKind::Io,
        K::ConnectionLost | K::TimedOut | K::SessionExpired => ErrorKind::Unreachable,
        _ if transient => ErrorKind::Unreachable,
        _ => ErrorKind::Io,
    };
    BackendError {
        kind,
        transient: transient || kind == ErrorKind::Unreachable,
        op,
        name: name.to_string(),
        message: e.to_string(),
    }
}

impl SmbBackend {
    /// Whether requests on this share are encrypted (SMB 3 encryption; on
    /// when the share or server requires it).
    pub fn encrypted(&self) -> bool {
        self.conn.should_encrypt()
    }

    /// Signs in, connects the share and checks the base directory.
    pub fn connect(t: &SmbTarget, opts: &Options) -> Result<Self, BackendError> {
        let location = crate::url::Destination::Smb(t.clone()).to_string();
        let password = opts.password.clone().ok_or_else(|| {
            BackendError::new(
                ErrorKind::AuthFailed,
                "connect",
                &location,
                "no SMB password: set CAPSULE_SMB_PASSWORD or CAPSULE_SMB_PASSWORD_FILE",
            )
        })?;
        let config = ClientConfig {
            addr: if t.host.contains(':') {
                format!("[{}]:{}", t.host, t.port)
            } else {
                format!("{}:{}", t.host, t.port)
            },
            timeout: Duration::from_secs(10),
            username: t.user.clone(),
            password,
            auto_reconnect: true,
            // Packs are compressed and encrypted: LZ4 would only burn CPU.
            compression: false,
            response_timeout: Some(Duration::from_secs(60)),
            ..Default::default()
        };
        block_on(async {
            let mut client = SmbClient::connect(config).await.map_err(|e| {
                let mut err = smb_err("connect", &location, e);
                if err.kind == ErrorKind::PermissionDenied {
                    err.kind = ErrorKind::AuthFailed;
                }
                if err.kind == ErrorKind::AuthFailed {
                    err.message = format!(
                        "the server refused user {} ({}); check the user name and CAPSULE_SMB_PASSWORD",
                        t.user, err.message
                    );
                }
                err
            })?;
            let tree = client.connect_share(&t.share).await.map_err(|e| {
                let mut err = smb_err("connect", &location, e);
                if err.kind == ErrorKind::NotFound || err.message.contains("BAD_NETWORK_NAME") {
                    err.kind = ErrorKind::NoContainer;
                    err.message = format!(
                        "the server has no share named {:?} ({})",
                        t.share, err.message
                    );
                } else if err.kind == ErrorKind::PermissionDenied {
                    err.kind = ErrorKind::AuthFailed;
                    err.message = format!(
                        "user {} may not use share {:?} ({})",
                        t.user, t.share, err.message
                    );
                }
                err
            })?;
            let mut conn = client.connection().clone();
            if !t.path.is_empty() {
                match tree.stat(&mut conn, &t.path).await {
                    Ok(i) if i.is_directory => {}
                    Ok(_) => {
                        return Err(BackendError::new(
                            ErrorKind::NoContainer,
                            "connect",
                            &location,
                            format!("{} on the share is not a directory", t.path),
                        ))
                    }
                    Err(e) if e.kind() == smb2::ErrorKind::NotFound && opts.create => {
                        let mut cur = String::new();
                        for seg in t.path.split('/') {
                            if !cur.is_empty() {
                                cur.push('/');
                            }
                            cur.push_str(seg);
                            match tree.create_directory(&mut conn, &cur).await {
                                Ok(()) => {}
                                Err(e) if e.kind() == smb2::ErrorKind::AlreadyExists => {}
                                Err(e) => return Err(smb_err("connect", &location, e)),
                            }
                        }
                    }
                    Err(e) if e.kind() == smb2::ErrorKind::NotFound => {
                        return Err(BackendError::new(
                            ErrorKind::NoContainer,
                            "connect",
                            &location,
                            format!(
                                "the directory {:?} does not exist on share {:?}; create it first",
                                t.path, t.share
                            ),
                        ))
                    }
                    Err(e) => return Err(smb_err("connect", &location, e)),
                }
            }
            Ok(SmbBackend {
                location: location.clone(),
                _client: tokio::sync::Mutex::new(client),
                tree: std::sync::RwLock::new((conn.generation(), Arc::new(tree))),
                conn,
                share: t.share.clone(),
                base: t.path.clone(),
                dirs: Mutex::new(HashSet::new()),
                concurrency: opts.concurrency.unwrap_or(8).max(1),
            })
        })
    }

    fn path(&self, name: &str) -> String {
        if self.base.is_empty() {
            name.to_string()
        } else if name.is_empty() {
            self.base.clone()
        } else {
            format!("{}/{name}", self.base)
        }
    }

    fn conn(&self) -> Connection {
        self.conn.clone()
    }

    /// The share's current tree connection.
    fn tree(&self) -> Arc<Tree> {
        self.tree
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .1
            .clone()
    }

    /// Whether the tree belongs to the live session.
    fn tree_is_live(&self) -> bool {
        !self.conn.is_disconnected()
            && self.tree.read().unwrap_or_else(|p| p.into_inner()).0 == self.conn.generation()
    }

    /// Runs one request to completion, or gives up on it after `limit`
    /// (see [`limit_for`]). A connection cut in a
    /// way the client does not notice (seen with a proxy that stopped
    /// forwarding mid-upload: one pack upload waited for more than nine
    /// minutes) would otherwise hold the backup forever. On the deadline
    /// the connection is declared dead, so every request on it fails as
    /// transient and the retry revives the session.
    fn bounded<T>(
        &self,
        op: &'static str,
        name: &str,
        limit: Duration,
        fut: impl std::future::Future<Output = Result<T, BackendError>>,
    ) -> Result<T, BackendError> {
        match block_on(async { tokio::time::timeout(limit, fut).await }) {
            Ok(r) => r,
            Err(_) => {
                self.conn.mark_dead();
                Err(BackendError::transient(
                    ErrorKind::Unreachable,
                    op,
                    name,
                    format!("no answer from the server within {} s; the connection is dropped and made again", limit.as_secs()),
                ))
            }
        }
    }

    /// Brings a dropped session back before a request: the client revives
    /// the connection in place (dial, negotiate, sign in again), but every
    /// tree id of the old session is gone, so the share is connected again
    /// here. Without this, one reset connection failed every later request
    /// of the run. A request cut mid-way fails as transient; the retry
    /// layer calls again, and this call revives. Revivals are serialized on
    /// the client; the first caller in does the work.
    fn live(&self, op: &'static str, name: &str) -> Result<(), BackendError> {
        if self.tree_is_live() {
            return Ok(());
        }
        block_on(async {
            let mut client = self._client.lock().await;
            if self.tree_is_live() {
                return Ok(());
            }
            self.conn
                .reconnect_if_needed()
                .await
                .map_err(|e| smb_err(op, name, e))?;
            let generation = self.conn.generation();
            let tree = client
                .connect_share(&self.share)
                .await
                .map_err(|e| smb_err(op, name, e))?;
            *self.tree.write().unwrap_or_else(|p| p.into_inner()) = (generation, Arc::new(tree));
            Ok(())
        })
    }

    async fn make_dirs(&self, rel_dir: &str) -> Result<(), BackendError> {
        let mut cur = String::new();
        for seg in rel_dir.split('/') {
            if !cur.is_empty() {
                cur.push('/');
            }
            cur.push_str(seg);
            if self
                .dirs
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .contains(&cur)
            {
                continue;
            }
            match self
                .tree()
                .create_directory(&mut self.conn(), &self.path(&cur))
                .await
            {
                Ok(()) => {}
                Err(e) if e.kind() == smb2::ErrorKind::AlreadyExists => {}
                Err(e) => return Err(smb_err("put", &cur, e)),
            }
            self.dirs
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(cur.clone());
        }
        Ok(())
    }

    /// Writes a temporary file; `fill` decides how the bytes go out.
    async fn write_tmp(&self, name: &str, source: Source<'_>) -> Result<String, BackendError> {
        let dir = name.rsplit_once('/').map(|(d, _)| d);
        let tmp = match dir {
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
        let mut source = source;
        let mut made_dirs = false;
        loop {
            let r = self.write_file(&self.path(&tmp), &mut source).await;
            match r {
                Ok(()) => return Ok(tmp),
                Err(e) if e.kind() == smb2::ErrorKind::NotFound && !made_dirs && dir.is_some() => {
                    self.make_dirs(dir.unwrap_or_default()).await?;
                    made_dirs = true;
                }
                Err(e) => {
                    // Best effort: the temporary name is never listed anyway.
                    let _ = self
                        .tree()
                        .delete_file(&mut self.conn(), &self.path(&tmp))
                        .await;
                    return Err(smb_err("put", name, e));
                }
            }
        }
    }

    async fn write_file(&self, path: &str, source: &mut Source<'_>) -> smb2::Result<()> {
        let mut conn = self.conn();
        match source {
            Source::Bytes(b) if b.len() <= COMPOUND_MAX => {
                self.tree()
                    .write_file_compound_exclusive(&mut conn, path, b)
                    .await?;
            }
            Source::Bytes(b) => {
                self.tree().write_file_pipelined(&mut conn, path, b).await?;
            }
            Source::Stream { size, reader } => {
                let mut w = self.tree().create_file_writer_exclusive(conn, path).await?;
                let mut left = *size;
                let mut buf = Vec::new();
                while left > 0 {
                    let n = left.min(WRITE_CHUNK as u64);
                    if let Err(e) = capsule_backend::read_exact_len(*reader, n, &mut buf, path) {
                        drop(w);
                        return Err(smb2::Error::Io(std::io::Error::other(e.message)));
                    }
                    w.write_chunk(&buf).await?;
                    left -= n;
                }
                w.finish().await?;
            }
        }
        Ok(())
    }

    /// One directory, relative to the base; `None` if it does not exist.
    async fn read_dir(
        &self,
        d: String,
    ) -> Result<Option<Vec<crate::dirwalk::DirEntry>>, BackendError> {
        let path = self.path(&d);
        // One round trip for a directory that fits one answer (keys/,
        // snapshots/, a data/xx/ of a few hundred packs); a bigger one is
        // listed again step by step.
        let listed = match self
            .tree()
            .list_directory_compound(&mut self.conn(), &path)
            .await
        {
            Ok(Some(entries)) => Ok(entries),
            Ok(None) => self.tree().list_directory(&mut self.conn(), &path).await,
            Err(e) => Err(e),
        };
        match listed {
            Ok(entries) => Ok(Some(
                entries
                    .into_iter()
                    .map(|e| crate::dirwalk::DirEntry {
                        name: e.name,
                        is_dir: e.is_directory,
                        size: e.size,
                        modified: e
                            .modified
                            .to_system_time()
                            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
                            .map(|d| d.as_secs() as i64),
                    })
                    .collect(),
            )),
            Err(e) if e.kind() == smb2::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(smb_err("list", &d, e)),
        }
    }

    /// The lab's per-file write: one compound of CREATE, `writes` WRITEs
    /// and CLOSE (one round trip), or with `sync`, CREATE, WRITEs and FLUSH
    /// followed by a CLOSE (a FLUSH must end a compound, as it may go
    /// asynchronous). This is what a copier that does or does not flush each
    /// file sends; a share with `sync always` flushes every WRITE anyway.
    async fn probe_compound(
        &self,
        path: &str,
        data: &[u8],
        writes: usize,
        sync: bool,
    ) -> smb2::Result<()> {
        use smb2::msg::close::CloseRequest;
        use smb2::msg::create::{
            CreateDisposition, CreateRequest, ImpersonationLevel, ShareAccess,
        };
        use smb2::msg::flush::FlushRequest;
        use smb2::msg::write::WriteRequest;
        use smb2::types::flags::{FileAccessMask, FileAttributes};
        use smb2::types::status::NtStatus;
        use smb2::types::{Command, CreditCharge, FileId, OplockLevel};
        use smb2::CompoundOp;

        let tree_id = Some(self.tree().tree_id);
        let create = CreateRequest {
            requested_oplock_level: OplockLevel::None,
            impersonation_level: ImpersonationLevel::Impersonation,
            desired_access: FileAccessMask::new(
                FileAccessMask::FILE_WRITE_DATA
                    | FileAccessMask::FILE_WRITE_ATTRIBUTES
                    | FileAccessMask::SYNCHRONIZE,
            ),
            file_attributes: FileAttributes::NORMAL,
            share_access: ShareAccess(0),
            create_disposition: CreateDisposition::FileOverwriteIf,
            // FILE_NON_DIRECTORY_FILE
            create_options: 0x40,
            name: path.replace('/', "\\"),
            create_contexts: vec![],
        };
        let piece = data.len().div_ceil(writes.max(1)).max(1);
        let bodies: Vec<WriteRequest> = data
            .chunks(piece)
            .enumerate()
            .map(|(i, part)| WriteRequest {
                // Header (64) + fixed WRITE body (48).
                data_offset: 0x70,
                offset: (i * piece) as u64,
                file_id: FileId::SENTINEL,
                channel: 0,
                remaining_bytes: 0,
                write_channel_info_offset: 0,
                write_channel_info_length: 0,
                flags: 0,
                data: part.to_vec(),
            })
            .collect();
        let flush = FlushRequest {
            file_id: FileId::SENTINEL,
        };
        let close = CloseRequest {
            flags: 0,
            file_id: FileId::SENTINEL,
        };
        let mut ops = vec![CompoundOp::new(Command::Create, &create, tree_id)];
        for b in &bodies {
            ops.push(CompoundOp {
                command: Command::Write,
                body: b,
                tree_id,
                credit_charge: CreditCharge(b.data.len().div_ceil(65536).max(1) as u16),
            });
        }
        // The flush travels in the same compound as the close, so a synced
        // probe costs the same round trips as an unsynced one and the lab's
        // flush time is the sync alone (a separate close made it a round
        // trip too, and a sync-always share looked buffered at 10 ms).
        if sync {
            ops.push(CompoundOp::new(Command::Flush, &flush, tree_id));
        }
        ops.push(CompoundOp::new(Command::Close, &close, tree_id));
        let frames = self.conn().execute_compound(&ops).await?;
        let mut statuses = Vec::new();
        for f in frames {
            let f = f?;
            statuses.push((f.header.command, f.header.status));
        }
        match statuses.into_iter().find(|(_, s)| *s != NtStatus::SUCCESS) {
            None => Ok(()),
            Some((command, status)) => Err(smb2::Error::Protocol { status, command }),
        }
    }

    async fn put_inner(&self, name: &str, source: Source<'_>) -> Result<(), BackendError> {
        let tmp = self.write_tmp(name, source).await?;
        let r = self
            .tree()
            .rename(&mut self.conn(), &self.path(&tmp), &self.path(name))
            .await;
        match r {
            Ok(()) => Ok(()),
            Err(e) => {
                let _ = self
                    .tree()
                    .delete_file(&mut self.conn(), &self.path(&tmp))
                    .await;
                let mut err = smb_err("put", name, e);
                if err.kind == ErrorKind::AlreadyExists {
                    err.message = "object exists".into();
                }
                Err(err)
            }
        }
    }

    async fn read(
        &self,
        name: &str,
        range: Option<Range<u64>>,
        sink: &mut dyn FnMut(&[u8]) -> Result<(), BackendError>,
    ) -> Result<u64, BackendError> {
        let path = self.path(name);
        if range.is_none() {
            // Small objects (index files, snapshots, tree packs) in one
            // compound CREATE+READ+CLOSE; the crate falls back for larger.
            let data = match self
                .tree()
                .read_file_compound(&mut self.conn(), &path)
                .await
            {
                Ok(d) => d,
                Err(e) if e.kind() == smb2::ErrorKind::TooLarge => {
                    return self.read_ranges(name, None, sink).await;
                }
                Err(e) => return Err(smb_err("get", name, e)),
            };
            sink(&data)?;
            return Ok(data.len() as u64);
        }
        self.read_ranges(name, range, sink).await
    }

    async fn read_ranges(
        &self,
        name: &str,
        range: Option<Range<u64>>,
        sink: &mut dyn FnMut(&[u8]) -> Result<(), BackendError>,
    ) -> Result<u64, BackendError> {
        let reader = self
            .tree()
            .open_file_reader(self.conn(), &self.path(name))
            .await
            .map_err(|e| smb_err("get", name, e))?;
        let res = async {
            use futures::StreamExt;
            let r = range.unwrap_or(0..reader.size());
            check_range(name, &r, reader.size())?;
            let reader = &reader;
            // In order: `buffered` keeps READS_IN_FLIGHT reads going and
            // hands them back as asked.
            let mut reads = futures::stream::iter(
                (r.start..r.end)
                    .step_by(STREAM_CHUNK)
                    .map(|off| (off, (r.end - off).min(STREAM_CHUNK as u64))),
            )
            .map(|(off, n)| async move { (n, reader.read_at(off, n).await) })
            .buffered(READS_IN_FLIGHT);
            while let Some((n, d)) = reads.next().await {
                let d = d.map_err(|e| smb_err("get", name, e))?;
                if (d.len() as u64) < n {
                    return Err(BackendError::new(
                        ErrorKind::Io,
                        "get",
                        name,
                        "the object shrank while being read",
                    ));
                }
                sink(&d)?;
            }
            Ok(r.end - r.start)
        }
        .await;
        let _ = reader.close().await;
        res
    }
}

enum Source<'a> {
    Bytes(&'a [u8]),
    Stream { size: u64, reader: &'a mut dyn Read },
}

impl Backend for SmbBackend {
    fn put(&self, name: &str, data: &[u8]) -> Result<(), BackendError> {
        self.live("put", name)?;
        validate_name(name)?;
        self.bounded(
            "put",
            name,
            limit_for(data.len() as u64),
            self.put_inner(name, Source::Bytes(data)),
        )
    }

    fn put_stream(&self, name: &str, size: u64, data: &mut dyn Read) -> Result<(), BackendError> {
        self.live("put", name)?;
        validate_name(name)?;
        self.bounded(
            "put",
            name,
            limit_for(size),
            self.put_inner(name, Source::Stream { size, reader: data }),
        )
    }

    fn get(&self, name: &str, range: Option<Range<u64>>) -> Result<Vec<u8>, BackendError> {
        self.live("get", name)?;
        validate_name(name)?;
        let mut out = Vec::new();
        let bytes = range.as_ref().map_or(UNKNOWN_READ, |r| r.end - r.start);
        self.bounded(
            "get",
            name,
            limit_for(bytes),
            self.read(name, range, &mut |b| {
                out.extend_from_slice(b);
                Ok(())
            }),
        )?;
        Ok(out)
    }

    fn get_stream(
        &self,
        name: &str,
        range: Option<Range<u64>>,
        out: &mut dyn Write,
    ) -> Result<u64, BackendError> {
        self.live("get", name)?;
        validate_name(name)?;
        let bytes = range.as_ref().map_or(UNKNOWN_READ, |r| r.end - r.start);
        self.bounded(
            "get",
            name,
            limit_for(bytes),
            self.read_ranges(name, range, &mut |b| {
                out.write_all(b)
                    .map_err(|e| capsule_backend::write_out_error(name, e))
            }),
        )
    }

    fn stat(&self, name: &str) -> Result<ObjectInfo, BackendError> {
        self.live("stat", name)?;
        validate_name(name)?;
        let i = self.bounded("stat", name, REQUEST_ALLOWANCE, async {
            self.tree()
                .stat(&mut self.conn(), &self.path(name))
                .await
                .map_err(|e| smb_err("stat", name, e))
        })?;
        if i.is_directory {
            return Err(BackendError::new(
                ErrorKind::NotFound,
                "stat",
                name,
                "is a directory",
            ));
        }
        Ok(ObjectInfo {
            name: name.to_string(),
            size: i.size,
            modified: None,
        })
    }

    fn list(&self, prefix: &str) -> Result<Vec<ObjectInfo>, BackendError> {
        self.live("list", prefix)?;
        self.bounded(
            "list",
            prefix,
            LIST_LIMIT,
            crate::dirwalk::walk_tree(prefix, |d| self.read_dir(d)),
        )
    }

    fn list_temporaries(&self) -> Result<Vec<ObjectInfo>, BackendError> {
        self.live("list", "")?;
        self.bounded(
            "list",
            "",
            LIST_LIMIT,
            crate::dirwalk::walk_temporaries(|d| self.read_dir(d)),
        )
    }

    fn delete(&self, name: &str) -> Result<(), BackendError> {
        self.live("delete", name)?;
        validate_name(name)?;
        self.bounded("delete", name, REQUEST_ALLOWANCE, async {
            match self
                .tree()
                .delete_file(&mut self.conn(), &self.path(name))
                .await
            {
                Ok(()) => Ok(()),
                Err(e) if e.kind() == smb2::ErrorKind::NotFound => Ok(()),
                Err(e) => Err(smb_err("delete", name, e)),
            }
        })
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            concurrency: self.concurrency,
            durable_put: true,
            local: false,
            buffers_puts: false,
        }
    }

    fn location(&self) -> String {
        self.location.clone()
    }
}

impl LabBackend for SmbBackend {
    fn probe_write(
        &self,
        name: &str,
        data: &[u8],
        writes: usize,
        sync: bool,
    ) -> Result<(), BackendError> {
        self.live("probe", name)?;
        validate_name(name)?;
        let r = block_on(self.probe_compound(&self.path(name), data, writes, sync));
        match r {
            Err(e) if e.kind() == smb2::ErrorKind::NotFound => {
                if let Some((d, _)) = name.rsplit_once('/') {
                    block_on(self.make_dirs(d))?;
                }
                block_on(self.probe_compound(&self.path(name), data, writes, sync))
            }
            r => r,
        }
        .map_err(|e| smb_err("probe", name, e))
    }

    fn space(&self) -> Result<Option<Space>, BackendError> {
        self.live("space", "")?;
        let i =
            block_on(self.tree().fs_info(&mut self.conn())).map_err(|e| smb_err("space", "", e))?;
        Ok(Some(Space {
            free: i.free_bytes,
            total: i.total_bytes,
        }))
    }

    fn remove_empty_dirs(&self) -> Result<(), BackendError> {
        self.live("rmdir", "")?;
        block_on(async {
            let dirs = crate::dirwalk::all_dirs(|d| self.read_dir(d)).await?;
            // Deepest first; a directory that is not empty simply stays.
            for d in dirs.iter().rev() {
                let _ = self
                    .tree()
                    .delete_directory(&mut self.conn(), &self.path(d))
                    .await;
            }
            self.dirs.lock().unwrap_or_else(|p| p.into_inner()).clear();
            Ok(())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use smb2::types::status::NtStatus;
    use smb2::types::Command;

    fn status(s: NtStatus) -> BackendError {
        smb_err(
            "get",
            "sessions/x",
            smb2::Error::Protocol {
                status: s,
                command: Command::Create,
            },
        )
    }

    /// What a read meets when another client deletes the object at that
    /// moment: the delete's exclusive open (asked again) or its pending
    /// removal (gone). Neither may read as damage.
    #[test]
    fn a_delete_in_flight_is_gone_or_worth_asking_again_never_an_error_of_the_object() {
        let pending = status(NtStatus::DELETE_PENDING);
        assert_eq!(pending.kind, ErrorKind::NotFound);
        let sharing = status(NtStatus::SHARING_VIOLATION);
        assert!(sharing.transient, "{sharing}");
        assert_eq!(sharing.kind, ErrorKind::Io);
        let denied = status(NtStatus::ACCESS_DENIED);
        assert!(!denied.transient);
    }
}
