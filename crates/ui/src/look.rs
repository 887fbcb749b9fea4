//! Quick look: a version of a file shown in the page before it is
//! restored. Only kinds a browser shows without running anything of the
//! file's own are served inline (text, images, PDF), each with its own
//! content type, `nosniff`, and a content security policy that lets the
//! file load nothing and run nothing; anything else is refused, to be
//! downloaded instead.

use axum::extract::{Query, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::Response;

use super::download::streamed;
use super::paths::{file_head, snapshot_path, At};
use super::state::{blocking, Failure, Shared};
use capsule_engine::dump::Content;

/// What a looked-at file may do once in the browser: nothing. `sandbox`
/// also gives it an origin of its own, so a file that manages to run
/// script (an SVG opened on its own) cannot use the page's token.
const LOOK_CSP: &str =
    "default-src 'none'; img-src 'self'; style-src 'unsafe-inline'; sandbox; frame-ancestors 'self'";
/// Chromium refuses to show a PDF in a sandboxed document, and its viewer
/// runs no script of the file's own: PDFs get the policy without `sandbox`.
const PDF_CSP: &str = "default-src 'none'; frame-ancestors 'self'";

/// Bytes read to tell what a file is.
const SNIFF: usize = 8192;

/// The content type a quick look serves `head` (a file's first bytes)
/// with, or None: not a kind shown inline.
pub(crate) fn kind(name: &[u8], head: &[u8]) -> Option<&'static str> {
    // Text kinds (HTML, XML, scripts) are text here: shown as their
    // source, never rendered.
    if let Some(t) = infer::get(head).filter(|t| t.matcher_type() != infer::MatcherType::Text) {
        return match t.mime_type() {
            m @ ("image/png" | "image/jpeg" | "image/gif" | "image/webp" | "image/bmp"
            | "image/avif" | "application/pdf") => Some(m),
            _ => None,
        };
    }
    // Text: no NUL, and UTF-8 but for a character cut at the sniff's end.
    let valid = match std::str::from_utf8(head) {
        Ok(_) => true,
        Err(e) => e.error_len().is_none() && head.len() >= SNIFF,
    };
    if !valid || head.contains(&0) {
        return None;
    }
    if name.to_ascii_lowercase().ends_with(b".svg") {
        Some("image/svg+xml")
    } else {
        Some("text/plain; charset=utf-8")
    }
}

/// A file's version for the page to show (`/api/look?snapshot=&path=`).
pub(crate) async fn look(
    State(ui): State<Shared>,
    Query(q): Query<At>,
) -> Result<Response, Failure> {
    let path = snapshot_path(&q.path)?;
    let v = ui.view();
    let (node, b, mime) = blocking(move || {
        let (n, head) = file_head(&v, &q.snapshot, &path, SNIFF)?;
        let mime = kind(&n.name, &head).ok_or_else(|| {
            Failure(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                format!(
                    "{}: no quick look for this kind of file (text, images and PDF only): download it",
                    path.display()
                ),
            )
        })?;
        Ok((n, v.browser.clone(), mime))
    })
    .await?;
    let size = node.size;
    let body = streamed(move |w| std::io::copy(&mut Content::new(&b, &node)?, w).map(|_| ()));
    let mut r = Response::new(body);
    let h = r.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(mime));
    h.insert(header::CONTENT_LENGTH, HeaderValue::from(size));
    h.insert(
        header::CONTENT_DISPOSITION,
        HeaderValue::from_static("inline"),
    );
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(if mime == "application/pdf" {
            PDF_CSP
        } else {
            LOOK_CSP
        }),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    Ok(r)
}

#[cfg(test)]
mod tests {
    use super::kind;

    #[test]
    fn only_text_images_and_pdf_are_shown() {
        let png = b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR";
        assert_eq!(kind(b"a.bin", png), Some("image/png"));
        assert_eq!(kind(b"x.pdf", b"%PDF-1.7\n"), Some("application/pdf"));
        assert_eq!(
            kind(b"notes.txt", "grüße\n".as_bytes()),
            Some("text/plain; charset=utf-8")
        );
        assert_eq!(
            kind(b"i.svg", b"<svg xmlns=\"http://www.w3.org/2000/svg\"/>"),
            Some("image/svg+xml")
        );
        // HTML is text here: shown as its source, never rendered.
        assert_eq!(
            kind(b"p.html", b"<script>alert(1)</script>"),
            Some("text/plain; charset=utf-8")
        );
        assert_eq!(kind(b"a.zip", b"PK\x03\x04rest"), None);
        assert_eq!(kind(b"a.bin", b"\0\x01\x02"), None);
        assert_eq!(kind(b"a.txt", b"\xff\xfe bad"), None);
    }
}
