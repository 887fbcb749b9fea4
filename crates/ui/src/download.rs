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

/// Writes file `node`'s content to `w`.
pub(crate) fn copy_file(
    b: &Arc<Browser>,
    node: &capsule_format::tree::Node,
    w: &mut dyn Write,
) -> std::io::Result<()> {
    capsule_engine::dump::copy_file(b, node, w).map(|_| ())
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
        capsule_engine::dump::write_tar(&b, Some(&tree), Path::new(&top), None, w).map(|_| ())
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
