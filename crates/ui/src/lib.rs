//! `capsule ui`: a local web page to go back in time. One long-lived
//! process serves it from one [`Browser`], so opening a directory costs its
//! own tree from a shared cache, never a process or a walk of a snapshot.
//!
//! Every request must carry the token printed with the page's address: in
//! the address (`?t=`), which sets a cookie for the rest, or in the
//! `x-capsule-token` header. Requests naming another host than the one
//! listened on are refused too (a page elsewhere cannot rebind a name to
//! loopback and read it). Every asset is in the binary.

use std::collections::{BTreeMap, HashMap};
use std::io::Write;
use std::net::SocketAddr;
use std::path::{Component, Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError, RwLock};

use axum::body::Body;
use axum::extract::{Query, Request, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{Html, IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use capsule_engine::browse::Browser;
use capsule_engine::EngineError;
use capsule_format::snapshot::Snapshot;
use capsule_format::tree::NodeKind;
use capsule_format::{BlobId, ObjectId};
use serde::{Deserialize, Serialize};

pub use capsule_engine::browse::{Refresh, View};

/// What the page needs from the process serving it.
pub struct Ui {
    /// The repository's snapshots and browser; replaced by `refresh`.
    pub view: RwLock<Arc<View>>,
    /// The token every request must carry.
    pub token: String,
    /// Lists the snapshots again (None: nothing changed).
    pub refresh: Refresh,
    /// Each profile's status (`capsule status --json`).
    pub status: Box<dyn Fn() -> serde_json::Value + Send + Sync>,
    /// Recorded backups and lab runs, newest first (`capsule report
    /// --list --json`).
    pub reports: Box<dyn Fn() -> serde_json::Value + Send + Sync>,
    /// One recorded backup's or lab run's HTML report, with its charts.
    pub report_page: ReportPage,
    /// The address served, for the Host check.
    pub addr: SocketAddr,
    /// Restores in progress, by the id the page gave them.
    pub jobs: Jobs,
}

/// Renders one report's HTML page by its id (None: no such report).
pub type ReportPage = Box<dyn Fn(&str) -> Option<String> + Send + Sync>;

/// Restores in progress: the page names each one and asks how far it got
/// while the request that runs it is still open.
#[derive(Default)]
pub struct Jobs(Mutex<HashMap<String, Arc<capsule_engine::progress::Progress>>>);

impl Jobs {
    fn start(&self, id: &str) -> Arc<capsule_engine::progress::Progress> {
        let p = Arc::new(capsule_engine::progress::Progress::default());
        let mut m = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        // A page that never asks leaves nothing behind: ended jobs are
        // removed, and the map is bounded in any case.
        if m.len() < 64 {
            m.insert(id.to_string(), p.clone());
        }
        p
    }
    fn end(&self, id: &str) {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(id);
    }
    fn get(&self, id: &str) -> Option<Arc<capsule_engine::progress::Progress>> {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(id)
            .cloned()
    }
}

/// A request refused or failed, as the page shows it.
#[derive(Debug)]
pub struct Failure(StatusCode, String);

impl IntoResponse for Failure {
    fn into_response(self) -> Response {
        (self.0, Json(serde_json::json!({ "error": self.1 }))).into_response()
    }
}

impl From<EngineError> for Failure {
    fn from(e: EngineError) -> Self {
        let code = match e {
            EngineError::PathNotFound(_)
            | EngineError::SnapshotNotFound(_)
            | EngineError::NoSnapshotBefore { .. } => StatusCode::NOT_FOUND,
            EngineError::AmbiguousSnapshot(_) | EngineError::Invalid(_) => StatusCode::BAD_REQUEST,
            _ => StatusCode::INTERNAL_SERVER_ERROR,
        };
        Failure(code, e.to_string())
    }
}

fn bad(why: impl Into<String>) -> Failure {
    Failure(StatusCode::BAD_REQUEST, why.into())
}

type Shared = Arc<Ui>;

impl Ui {
    fn view(&self) -> Arc<View> {
        self.view
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

/// Equal without telling by its timing how much was equal.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |d, (x, y)| d | (x ^ y)) == 0
}

fn cookie_token(h: &HeaderMap) -> Option<&str> {
    h.get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .find_map(|c| c.trim().strip_prefix("capsule_token="))
}

fn query_token(q: Option<&str>) -> Option<&str> {
    q?.split('&').find_map(|kv| kv.strip_prefix("t="))
}

/// Refuses what lacks the token or names another host; the page's first
/// load, with the token in the address, gets it as a cookie.
async fn guard(State(ui): State<Shared>, req: Request, next: Next) -> Response {
    let host_ok = req
        .headers()
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .is_some_and(|h| {
            let port = ui.addr.port();
            h == ui.addr.to_string()
                || h == format!("localhost:{port}")
                || (ui.addr.ip().is_unspecified() && h.ends_with(&format!(":{port}")))
        });
    if !host_ok {
        return Failure(StatusCode::FORBIDDEN, "wrong host".into()).into_response();
    }
    let from_query = query_token(req.uri().query());
    let given = from_query
        .or_else(|| {
            req.headers()
                .get("x-capsule-token")
                .and_then(|v| v.to_str().ok())
        })
        .or_else(|| cookie_token(req.headers()));
    if !given.is_some_and(|t| same(t.as_bytes(), ui.token.as_bytes())) {
        return Failure(
            StatusCode::UNAUTHORIZED,
            "no token, or the wrong one: open the address `capsule ui` printed".into(),
        )
        .into_response();
    }
    let set_cookie = from_query.is_some();
    let mut resp = next.run(req).await;
    if set_cookie {
        if let Ok(v) = HeaderValue::from_str(&format!(
            "capsule_token={}; HttpOnly; SameSite=Strict; Path=/",
            ui.token
        )) {
            resp.headers_mut().insert(header::SET_COOKIE, v);
        }
    }
    resp
}

/// A stored name as the page carries it: UTF-8 as it is, except `%`,
/// written `%25`, and each byte that is not UTF-8, written `%XX`. Lossless,
/// so a name that is not UTF-8 can be opened, downloaded and restored from
/// the page like any other ([`unescape`] reverses it).
fn escape(name: &[u8]) -> String {
    let mut out = String::with_capacity(name.len());
    for chunk in name.utf8_chunks() {
        for c in chunk.valid().chars() {
            if c == '%' {
                out.push_str("%25");
            } else {
                out.push(c);
            }
        }
        for b in chunk.invalid() {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// The bytes of a name or path written by [`escape`]; a `%` not followed
/// by two hex digits stands for itself.
fn unescape(s: &str) -> Vec<u8> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let hex = |x: u8| (x as char).to_digit(16);
        match (
            b[i],
            b.get(i + 1).copied().and_then(hex),
            b.get(i + 2).copied().and_then(hex),
        ) {
            (b'%', Some(h), Some(l)) => {
                out.push((h * 16 + l) as u8);
                i += 3;
            }
            (c, _, _) => {
                out.push(c);
                i += 1;
            }
        }
    }
    out
}

/// A snapshot path as the page gives it ([`escape`]d): absolute, no `..`,
/// no NUL, not absurdly long.
fn snapshot_path(p: &str) -> Result<PathBuf, Failure> {
    use std::os::unix::ffi::OsStrExt;
    let raw = unescape(p);
    if raw.len() > 4096 || raw.contains(&0) || !raw.starts_with(b"/") {
        return Err(bad(format!("not a path in a snapshot: {p:.100}")));
    }
    let path = PathBuf::from(std::ffi::OsStr::from_bytes(&raw));
    if path
        .components()
        .any(|c| !matches!(c, Component::RootDir | Component::Normal(_)))
    {
        return Err(bad(format!("not a path in a snapshot: {p:.100}")));
    }
    Ok(path)
}

/// Runs `f` on a blocking thread: the engine reads the destination.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, Failure> + Send + 'static,
) -> Result<T, Failure> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| Failure(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?
}

fn resolve(v: &View, spec: &str) -> Result<(ObjectId, Snapshot), Failure> {
    let lower = spec.to_ascii_lowercase();
    let hits: Vec<_> = v
        .snapshots
        .iter()
        .filter(|(id, _)| id.to_hex().starts_with(&lower))
        .collect();
    match (spec, hits.as_slice()) {
        ("latest", _) => v.snapshots.last().cloned(),
        (_, [one]) => Some((*one).clone()),
        _ => None,
    }
    .ok_or_else(|| Failure(StatusCode::NOT_FOUND, format!("no snapshot {spec:.80}")))
}

#[derive(Serialize)]
struct SnapshotRow {
    id: String,
    time: String,
    time_unix: i64,
    host: String,
    paths: Vec<String>,
    files: u64,
    bytes: u64,
    files_read: u64,
    bytes_added: u64,
    incomplete: bool,
}

async fn snapshots(State(ui): State<Shared>) -> Result<Json<Vec<SnapshotRow>>, Failure> {
    let ui2 = ui.clone();
    blocking(move || {
        if let Some(v) = (ui2.refresh)() {
            *ui2.view.write().unwrap_or_else(PoisonError::into_inner) = Arc::new(v);
        }
        Ok(())
    })
    .await?;
    Ok(Json(
        ui.view()
            .snapshots
            .iter()
            .map(|(id, s)| SnapshotRow {
                id: id.to_hex(),
                time: s.time.clone(),
                time_unix: s.time_unix,
                host: s.hostname.clone(),
                paths: s.paths.clone(),
                files: s.summary.files,
                bytes: s.summary.bytes,
                files_read: s.summary.files_read,
                bytes_added: s.summary.bytes_added,
                incomplete: s.incomplete,
            })
            .collect(),
    ))
}

#[derive(Deserialize)]
struct At {
    snapshot: String,
    path: String,
}

#[derive(Serialize)]
struct EntryRow {
    name: String,
    #[serde(rename = "type")]
    kind: &'static str,
    size: u64,
    mtime: i64,
    mode: u32,
    /// False when the name is not UTF-8 (its odd bytes are `%XX` in
    /// `name`).
    utf8: bool,
}

/// The root tree of `snap`.
fn root_tree(snap: &Snapshot) -> Result<BlobId, Failure> {
    snap.tree
        .parse()
        .map_err(|_| Failure::from(EngineError::corrupt("snapshot", "bad tree id")))
}

/// The tree of the directory at `path` in snapshot `snap`.
fn dir_tree(b: &Browser, snap: &Snapshot, path: &Path) -> Result<BlobId, Failure> {
    let root = root_tree(snap)?;
    match b.find(&root, path)? {
        None => Ok(root),
        Some(n) if n.kind() == NodeKind::Dir => n
            .subtree
            .ok_or_else(|| bad(format!("{} has no tree", path.display()))),
        Some(_) => Err(bad(format!("{} is not a directory", path.display()))),
    }
}

async fn ls(State(ui): State<Shared>, Query(q): Query<At>) -> Result<Json<Vec<EntryRow>>, Failure> {
    let path = snapshot_path(&q.path)?;
    let v = ui.view();
    blocking(move || {
        let (_, snap) = resolve(&v, &q.snapshot)?;
        let tree = dir_tree(&v.browser, &snap, &path)?;
        Ok(v.browser
            .tree(&tree)?
            .iter()
            .map(|n| EntryRow {
                name: escape(&n.name),
                kind: n.kind().as_str(),
                size: n.size,
                mtime: n.mtime.secs,
                mode: n.mode,
                utf8: std::str::from_utf8(&n.name).is_ok(),
            })
            .collect())
    })
    .await
    .map(Json)
}

#[derive(Deserialize)]
struct PathOnly {
    path: String,
}

async fn versions(
    State(ui): State<Shared>,
    Query(q): Query<PathOnly>,
) -> Result<Json<capsule_engine::versions::Versions>, Failure> {
    let path = snapshot_path(&q.path)?;
    let v = ui.view();
    blocking(move || Ok(v.browser.versions(&v.snapshots, &path)?))
        .await
        .map(Json)
}

/// A body fed by a blocking writer: what `write` writes is sent as it
/// comes, with at most a few MiB in flight.
fn streamed(write: impl FnOnce(&mut dyn Write) -> std::io::Result<()> + Send + 'static) -> Body {
    struct Chan(tokio::sync::mpsc::Sender<std::io::Result<Vec<u8>>>);
    impl Write for Chan {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0
                .blocking_send(Ok(b.to_vec()))
                .map_err(|_| std::io::Error::new(std::io::ErrorKind::BrokenPipe, "closed"))?;
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let (tx, rx) = tokio::sync::mpsc::channel(8);
    tokio::task::spawn_blocking(move || {
        let mut w = std::io::BufWriter::with_capacity(1 << 20, Chan(tx.clone()));
        let r = write(&mut w).and_then(|()| w.flush());
        if let Err(e) = r {
            // The client sees the stream end in an error, not a short file.
            let _ = tx.blocking_send(Err(e));
        }
    });
    let mut rx = rx;
    Body::from_stream(futures_util::stream::poll_fn(move |cx| rx.poll_recv(cx)))
}

fn attachment(name: &str) -> HeaderValue {
    let safe: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_graphic() && c != '"' && c != '\\' {
                c
            } else {
                '_'
            }
        })
        .collect();
    HeaderValue::from_str(&format!("attachment; filename=\"{safe}\""))
        .unwrap_or(HeaderValue::from_static("attachment"))
}

/// A stored file's content as a reader, fetched a MiB at a time with the
/// browser's read-ahead.
struct Content {
    b: Arc<Browser>,
    map: capsule_engine::browse::FileMap,
    at: u64,
    buf: Vec<u8>,
    pos: usize,
}

impl Content {
    fn new(b: &Arc<Browser>, node: &capsule_format::tree::Node) -> std::io::Result<Self> {
        Ok(Content {
            map: b.file_map(node).map_err(std::io::Error::other)?,
            b: b.clone(),
            at: 0,
            buf: Vec::new(),
            pos: 0,
        })
    }
}

impl std::io::Read for Content {
    fn read(&mut self, out: &mut [u8]) -> std::io::Result<usize> {
        if self.pos == self.buf.len() {
            if self.at >= self.map.size() {
                return Ok(0);
            }
            self.buf = self
                .b
                .read_at(&self.map, self.at, 1 << 20, true)
                .map_err(std::io::Error::other)?;
            self.pos = 0;
            self.at += self.buf.len() as u64;
            if self.buf.is_empty() {
                return Ok(0);
            }
        }
        let n = out.len().min(self.buf.len() - self.pos);
        out[..n].copy_from_slice(&self.buf[self.pos..self.pos + n]);
        self.pos += n;
        Ok(n)
    }
}

/// Writes file `node`'s content to `w`.
fn copy_file(
    b: &Arc<Browser>,
    node: &capsule_format::tree::Node,
    w: &mut dyn Write,
) -> std::io::Result<()> {
    std::io::copy(&mut Content::new(b, node)?, w).map(|_| ())
}

async fn file(State(ui): State<Shared>, Query(q): Query<At>) -> Result<Response, Failure> {
    let path = snapshot_path(&q.path)?;
    let v = ui.view();
    let (node, b, shown) = blocking(move || {
        let (_, snap) = resolve(&v, &q.snapshot)?;
        let root = root_tree(&snap)?;
        let n = v
            .browser
            .find(&root, &path)?
            .ok_or_else(|| bad("the root is not a file"))?;
        if n.kind() != NodeKind::File {
            return Err(bad(format!("{} is not a file", path.display())));
        }
        // The first MiB read before answering: a file whose data is
        // damaged or missing gets an error naming it, not a 200 and an
        // empty download. Damage further in ends the stream in an error
        // (the download fails, never looks whole).
        let first = v
            .browser
            .file_map(&n)
            .and_then(|m| v.browser.read_at(&m, 0, 1 << 20, true));
        if let Err(e) = first {
            eprintln!("capsule ui: {}: {e}", path.display());
            return Err(Failure(
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("{} cannot be read: {e}", path.display()),
            ));
        }
        Ok((n, v.browser.clone(), path))
    })
    .await?;
    let name = String::from_utf8_lossy(&node.name).into_owned();
    let size = node.size;
    let body = streamed(move |w| {
        copy_file(&b, &node, w).inspect_err(|e| {
            eprintln!("capsule ui: {}: {e}", shown.display());
        })
    });
    let mut r = Response::new(body);
    let h = r.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/octet-stream"),
    );
    h.insert(header::CONTENT_DISPOSITION, attachment(&name));
    h.insert(header::CONTENT_LENGTH, HeaderValue::from(size));
    Ok(r)
}

/// A directory as a tar stream: its entries as stored (modes, times,
/// owners, symlinks), files streamed one after another.
async fn tarball(State(ui): State<Shared>, Query(q): Query<At>) -> Result<Response, Failure> {
    let path = snapshot_path(&q.path)?;
    let v = ui.view();
    let v2 = v.clone();
    let spec = q.snapshot.clone();
    let path2 = path.clone();
    let tree = blocking(move || {
        let (_, snap) = resolve(&v2, &spec)?;
        dir_tree(&v2.browser, &snap, &path2)
    })
    .await?;
    let top = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "snapshot".into());
    let name = format!("{top}.tar");
    let b = v.browser.clone();
    let body = streamed(move |w| {
        let mut t = tar::Builder::new(w);
        t.mode(tar::HeaderMode::Complete);
        add_tree(&b, &tree, Path::new(&top), &mut t, 0)?;
        t.finish()
    });
    let mut r = Response::new(body);
    let h = r.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/x-tar"),
    );
    h.insert(header::CONTENT_DISPOSITION, attachment(&name));
    Ok(r)
}

fn add_tree(
    b: &Arc<Browser>,
    tree: &BlobId,
    at: &Path,
    t: &mut tar::Builder<&mut dyn Write>,
    depth: usize,
) -> std::io::Result<()> {
    if depth > 512 {
        return Err(std::io::Error::other("trees nested over 512 deep: damaged"));
    }
    let nodes = b.tree(tree).map_err(std::io::Error::other)?;
    for n in nodes.iter() {
        // Names as stored, bytes and all: tar carries any name.
        let p = at.join(<std::ffi::OsStr as std::os::unix::ffi::OsStrExt>::from_bytes(&n.name));
        let mut h = tar::Header::new_gnu();
        h.set_mode(n.mode & 0o7777);
        h.set_uid(u64::from(n.uid));
        h.set_gid(u64::from(n.gid));
        h.set_mtime(n.mtime.secs.max(0) as u64);
        match n.kind() {
            NodeKind::Dir => {
                h.set_entry_type(tar::EntryType::Directory);
                h.set_size(0);
                t.append_data(&mut h, &p, std::io::empty())?;
                if let Some(sub) = &n.subtree {
                    add_tree(b, sub, &p, t, depth + 1)?;
                }
            }
            NodeKind::File => {
                h.set_entry_type(tar::EntryType::Regular);
                h.set_size(n.size);
                t.append_data(&mut h, &p, Content::new(b, n)?)?;
            }
            NodeKind::Symlink => {
                h.set_entry_type(tar::EntryType::Symlink);
                h.set_size(0);
                let target = String::from_utf8_lossy(&n.target).into_owned();
                t.append_link(&mut h, &p, target)?;
            }
            // FIFOs and devices are not something to download.
            _ => {}
        }
    }
    Ok(())
}

#[derive(Deserialize)]
struct TextDiff {
    path: String,
    a: usize,
    b: usize,
}

/// A unified diff between two versions of a text file (at most 4 MiB
/// each; larger or binary ones are refused).
async fn textdiff(State(ui): State<Shared>, Query(q): Query<TextDiff>) -> Result<String, Failure> {
    let path = snapshot_path(&q.path)?;
    let v = ui.view();
    blocking(move || {
        let vs = v.browser.versions(&v.snapshots, &path)?;
        let text = |n: usize| -> Result<String, Failure> {
            let x = n
                .checked_sub(1)
                .and_then(|i| vs.versions.get(i))
                .ok_or_else(|| bad(format!("no version {n}")))?;
            if x.node.kind() != NodeKind::File || x.size > 4 << 20 {
                return Err(bad(format!(
                    "version {n} is not a text file of at most 4 MiB"
                )));
            }
            let mut data = Vec::new();
            copy_file(&v.browser, &x.node, &mut data)
                .map_err(|e| Failure(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?;
            String::from_utf8(data).map_err(|_| bad(format!("version {n} is not text (UTF-8)")))
        };
        let (a, b) = (text(q.a)?, text(q.b)?);
        Ok(similar::TextDiff::from_lines(&a, &b)
            .unified_diff()
            .header(&format!("version {}", q.a), &format!("version {}", q.b))
            .to_string())
    })
    .await
}

#[derive(Deserialize)]
struct DiffQ {
    a: String,
    b: String,
}

async fn diff(
    State(ui): State<Shared>,
    Query(q): Query<DiffQ>,
) -> Result<Json<Vec<capsule_engine::diff::DiffEntry>>, Failure> {
    let v = ui.view();
    blocking(move || {
        let (_, sa) = resolve(&v, &q.a)?;
        let (_, sb) = resolve(&v, &q.b)?;
        let mut budget = capsule_engine::treewalk::Budget::new(
            capsule_engine::treewalk::entry_budget(&sa)
                .saturating_add(capsule_engine::treewalk::entry_budget(&sb)),
        );
        Ok(capsule_engine::diff::diff(
            v.browser.repo(),
            v.browser.index(),
            &root_tree(&sa)?,
            &root_tree(&sb)?,
            &mut budget,
        )?)
    })
    .await
    .map(Json)
}

#[derive(Deserialize)]
struct SearchQ {
    /// One snapshot; none: every snapshot (search across time).
    snapshot: Option<String>,
    q: String,
}

/// At most this many hits are answered, and kept per directory.
const MAX_HITS: usize = 1000;

/// One path whose name matched, and where in time it was found.
#[derive(Serialize)]
struct Hit {
    path: String,
    #[serde(rename = "type")]
    kind: &'static str,
    /// Snapshots holding it.
    snapshots: usize,
    first_time: String,
    last_time: String,
    last_snapshot: String,
}

#[derive(Serialize)]
struct Hits {
    hits: Vec<Hit>,
    /// More matched than were answered: narrow the search.
    truncated: bool,
}

/// The names below a tree that contain what is searched for, found once
/// per tree: a subtree unchanged across snapshots keeps its ID, so a
/// search across time costs the trees that differ, not one walk per
/// snapshot.
struct Finder<'a> {
    b: &'a Browser,
    want: String,
    memo: HashMap<BlobId, Arc<Vec<(String, &'static str)>>>,
    truncated: bool,
}

impl Finder<'_> {
    fn below(
        &mut self,
        tree: &BlobId,
        depth: usize,
    ) -> Result<Arc<Vec<(String, &'static str)>>, Failure> {
        if let Some(h) = self.memo.get(tree) {
            return Ok(h.clone());
        }
        if depth > 512 {
            return Err(Failure::from(EngineError::corrupt(
                "tree",
                "nested over 512 deep",
            )));
        }
        let nodes = self.b.tree(tree)?;
        let mut out = Vec::new();
        for n in nodes.iter() {
            let name = escape(&n.name);
            if String::from_utf8_lossy(&n.name)
                .to_lowercase()
                .contains(&self.want)
            {
                out.push((name.clone(), n.kind().as_str()));
            }
            if let (NodeKind::Dir, Some(sub)) = (n.kind(), n.subtree) {
                let below = self.below(&sub, depth + 1)?;
                out.extend(below.iter().map(|(p, k)| (format!("{name}/{p}"), *k)));
            }
            if out.len() > MAX_HITS {
                out.truncate(MAX_HITS);
                self.truncated = true;
                break;
            }
        }
        let out = Arc::new(out);
        self.memo.insert(*tree, out.clone());
        Ok(out)
    }
}

/// Entries whose name contains `q` (case-insensitive), in one snapshot or
/// across all of them, each with when it was first and last seen.
async fn search(State(ui): State<Shared>, Query(q): Query<SearchQ>) -> Result<Json<Hits>, Failure> {
    if q.q.is_empty() || q.q.len() > 256 {
        return Err(bad("search for 1 to 256 characters"));
    }
    let v = ui.view();
    blocking(move || {
        let snaps: Vec<(ObjectId, Snapshot)> = match &q.snapshot {
            Some(spec) => vec![resolve(&v, spec)?],
            None => v.snapshots.clone(),
        };
        let mut f = Finder {
            b: &v.browser,
            want: q.q.to_lowercase(),
            memo: HashMap::new(),
            truncated: false,
        };
        let mut found: BTreeMap<String, Hit> = BTreeMap::new();
        for (id, snap) in &snaps {
            for (p, kind) in f.below(&root_tree(snap)?, 0)?.iter() {
                let path = format!("/{p}");
                if found.len() >= MAX_HITS && !found.contains_key(&path) {
                    f.truncated = true;
                    continue;
                }
                let h = found.entry(path.clone()).or_insert_with(|| Hit {
                    path,
                    kind,
                    snapshots: 0,
                    first_time: snap.time.clone(),
                    last_time: String::new(),
                    last_snapshot: String::new(),
                });
                h.snapshots += 1;
                h.kind = kind;
                h.last_time.clone_from(&snap.time);
                h.last_snapshot = id.to_hex();
            }
        }
        Ok(Hits {
            hits: found.into_values().collect(),
            truncated: f.truncated,
        })
    })
    .await
    .map(Json)
}

#[derive(Deserialize)]
struct RestoreQ {
    snapshot: String,
    path: String,
    target: String,
    /// Replace files already in the target (asked for after a first
    /// answer listed them).
    #[serde(default)]
    replace: bool,
    /// A name the page gives this restore, to ask how far it got
    /// (`/api/progress?job=`).
    #[serde(default)]
    job: Option<String>,
}

/// Restores one path of a snapshot into a directory. Without `replace`,
/// a target already holding any of the files restored is answered with
/// the list (409) and nothing written.
async fn restore(State(ui): State<Shared>, Json(q): Json<RestoreQ>) -> Result<Response, Failure> {
    let path = snapshot_path(&q.path)?;
    let target = PathBuf::from(&q.target);
    if !target.is_absolute() || q.target.contains('\0') {
        return Err(bad("the target must be an absolute path"));
    }
    let v = ui.view();
    blocking(move || {
        let (_, snap) = resolve(&v, &q.snapshot)?;
        let root = root_tree(&snap)?;
        let Some(literal) = path.to_str() else {
            // Restore patterns are text: restore the folder holding it.
            return Err(bad(format!(
                "{} is not UTF-8: restore the folder that holds it",
                path.display()
            )));
        };
        let include = capsule_engine::restore::literal_pattern(literal);
        let opts = capsule_engine::restore::RestoreOptions {
            target: target.clone(),
            includes: vec![include],
            max_entries: capsule_engine::treewalk::entry_budget(&snap),
            // Asked for, when anything was in the way.
            overwrite: capsule_engine::restore::Overwrite::Always,
            ..capsule_engine::restore::RestoreOptions::default()
        };
        if !q.replace {
            // What is in the way: whatever a restore that keeps existing
            // files would leave as it is or fail on.
            let existing = conflicts(&target, &path);
            if !existing.is_empty() {
                return Ok((
                    StatusCode::CONFLICT,
                    Json(serde_json::json!({
                        "error": "the target holds files this restore would replace",
                        "replace": existing,
                    })),
                )
                    .into_response());
            }
        }
        let job = q.job.filter(|j| !j.is_empty() && j.len() <= 64);
        let progress = match &job {
            Some(j) => ui.jobs.start(j),
            None => Arc::default(),
        };
        let r = capsule_engine::restore::restore(
            v.browser.repo(),
            v.browser.index(),
            &root,
            &opts,
            &progress,
        );
        if let Some(j) = &job {
            ui.jobs.end(j);
        }
        let r = r?;
        let mut report = serde_json::to_value(&r).unwrap_or_default();
        // Restored less than asked: not a success, whatever was written.
        let code = if r.errors.is_empty() {
            StatusCode::OK
        } else {
            report["error"] = serde_json::Value::from(format!(
                "{} entries could not be restored: {}",
                r.errors.len(),
                r.errors
                    .iter()
                    .take(3)
                    .map(|w| format!("{}: {}", w.path, w.message))
                    .collect::<Vec<_>>()
                    .join("; ")
            ));
            StatusCode::INTERNAL_SERVER_ERROR
        };
        Ok((code, Json(report)).into_response())
    })
    .await
}

#[derive(Deserialize)]
struct JobQ {
    job: String,
}

/// How far a restore got: files and bytes done of those to restore.
async fn progress(
    State(ui): State<Shared>,
    Query(q): Query<JobQ>,
) -> Result<Json<serde_json::Value>, Failure> {
    use capsule_engine::progress::Progress;
    let p = ui.jobs.get(&q.job).ok_or_else(|| {
        Failure(
            StatusCode::NOT_FOUND,
            "no restore of that name is running".into(),
        )
    })?;
    Ok(Json(serde_json::json!({
        "files_done": Progress::get(&p.files_done),
        "files_total": Progress::get(&p.files_total),
        "bytes_done": Progress::get(&p.bytes_done),
        "bytes_total": Progress::get(&p.bytes_total),
        "totals_final": p.totals_final.load(std::sync::atomic::Ordering::Relaxed),
    })))
}

/// Files under `target` + `path` that a restore of `path` would replace.
fn conflicts(target: &Path, path: &Path) -> Vec<String> {
    let at = target.join(path.strip_prefix("/").unwrap_or(path));
    let mut found = Vec::new();
    let mut stack = vec![at];
    while let Some(p) = stack.pop() {
        let Ok(m) = std::fs::symlink_metadata(&p) else {
            continue;
        };
        if m.is_dir() {
            if let Ok(rd) = std::fs::read_dir(&p) {
                stack.extend(rd.flatten().map(|e| e.path()));
            }
        } else {
            found.push(p.to_string_lossy().into_owned());
            if found.len() >= 100 {
                break;
            }
        }
    }
    found.sort();
    found
}

async fn status(State(ui): State<Shared>) -> Json<serde_json::Value> {
    let ui2 = ui.clone();
    Json(
        tokio::task::spawn_blocking(move || (ui2.status)())
            .await
            .unwrap_or_default(),
    )
}

async fn reports(State(ui): State<Shared>) -> Json<serde_json::Value> {
    let ui2 = ui.clone();
    Json(
        tokio::task::spawn_blocking(move || (ui2.reports)())
            .await
            .unwrap_or_default(),
    )
}

#[derive(Deserialize)]
struct ReportQ {
    id: String,
}

/// A recorded backup's or lab run's report, as `capsule report --html`
/// writes it: self-contained, charts inline.
async fn report(State(ui): State<Shared>, Query(q): Query<ReportQ>) -> Result<Response, Failure> {
    if q.id.is_empty() || q.id.len() > 128 || q.id.contains(['/', '\\', '\0']) {
        return Err(bad("not a report id"));
    }
    let ui2 = ui.clone();
    let page = tokio::task::spawn_blocking(move || (ui2.report_page)(&q.id))
        .await
        .map_err(|e| Failure(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?;
    page.map(|p| Html(p).into_response())
        .ok_or_else(|| Failure(StatusCode::NOT_FOUND, "no such report".into()))
}

async fn page() -> Html<&'static str> {
    Html(include_str!("page.html"))
}

/// The page and its API.
pub fn router(ui: Shared) -> Router {
    Router::new()
        .route("/", get(page))
        .route("/api/snapshots", get(snapshots))
        .route("/api/ls", get(ls))
        .route("/api/versions", get(versions))
        .route("/api/file", get(file))
        .route("/api/tar", get(tarball))
        .route("/api/textdiff", get(textdiff))
        .route("/api/diff", get(diff))
        .route("/api/search", get(search))
        .route("/api/restore", post(restore))
        .route("/api/progress", get(progress))
        .route("/api/status", get(status))
        .route("/api/reports", get(reports))
        .route("/report", get(report))
        .layer(axum::middleware::from_fn_with_state(ui.clone(), guard))
        .with_state(ui)
}

/// Serves the page on `listener` until `stop` resolves.
pub async fn serve(
    listener: tokio::net::TcpListener,
    ui: Shared,
    stop: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    axum::serve(listener, router(ui))
        .with_graceful_shutdown(stop)
        .await
}
