//! Downloads: a file as it was, a directory as a tar stream, streamed
//! from the repository without holding it in memory.

use std::io::Write;
use std::path::Path;
use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Query, State};
use axum::http::{header, HeaderValue};
use axum::response::Response;
use capsule_engine::browse::Browser;
use capsule_format::tree::NodeKind;
use capsule_format::BlobId;

use super::paths::{dir_tree, file_head, resolve, snapshot_path, At};
use super::state::{blocking, Failure, Shared};

/// A body fed by a blocking writer: what `write` writes is sent as it
/// comes, with at most a few MiB in flight.
pub(crate) fn streamed(
    write: impl FnOnce(&mut dyn Write) -> std::io::Result<()> + Send + 'static,
) -> Body {
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
pub(crate) struct Content {
    pub(crate) b: Arc<Browser>,
    pub(crate) map: capsule_engine::browse::FileMap,
    pub(crate) at: u64,
    buf: Vec<u8>,
    pos: usize,
}

impl Content {
    pub(crate) fn new(
        b: &Arc<Browser>,
        node: &capsule_format::tree::Node,
    ) -> std::io::Result<Self> {
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
pub(crate) fn copy_file(
    b: &Arc<Browser>,
    node: &capsule_format::tree::Node,
    w: &mut dyn Write,
) -> std::io::Result<()> {
    std::io::copy(&mut Content::new(b, node)?, w).map(|_| ())
}

pub(crate) async fn file(
    State(ui): State<Shared>,
    Query(q): Query<At>,
) -> Result<Response, Failure> {
    let path = snapshot_path(&q.path)?;
    let v = ui.view();
    let (node, b, shown) = blocking(move || {
        let (n, _) = file_head(&v, &q.snapshot, &path, 1 << 20)?;
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
pub(crate) async fn tarball(
    State(ui): State<Shared>,
    Query(q): Query<At>,
) -> Result<Response, Failure> {
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
