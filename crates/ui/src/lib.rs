//! `capsule ui`: a local web page to go back in time. One long-lived
//! process serves it from one [`capsule_engine::browse::Browser`], so opening a directory costs its
//! own tree from a shared cache, never a process or a walk of a snapshot.
//!
//! Every request must carry the token printed with the page's address: in
//! the address (`?t=`), which sets a cookie for the rest, or in the
//! `x-capsule-token` header. Requests naming another host than the one
//! listened on are refused too (a page elsewhere cannot rebind a name to
//! loopback and read it). Every asset is in the binary.

mod auth;
mod browse;
mod download;
mod jobs;
mod look;
mod paths;
mod profiles;
mod putback;
mod state;

use axum::response::Html;
use axum::routing::{get, post};
use axum::Router;
pub use capsule_engine::browse::{Refresh, View};

use auth::guard;
use browse::{diff, ls, search, snapshots, textdiff, versions};
use download::{file, tarball};
use jobs::{progress, report, reports, restore};
use state::Shared;
pub use state::{BackupNow, Failure, Jobs, OpenProfile, ReportPage, Shown, Ui};

/// The page may load and send to nothing but this server: no outside URL,
/// no plugin, no form posted elsewhere, and no other site may frame it.
const PAGE_CSP: &str =
    "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; \
     img-src 'self'; frame-src 'self'; connect-src 'self'; form-action 'none'; base-uri 'none'; \
     frame-ancestors 'none'";

async fn page() -> impl axum::response::IntoResponse {
    (
        [(axum::http::header::CONTENT_SECURITY_POLICY, PAGE_CSP)],
        Html(include_str!("page.html")),
    )
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
        .route("/api/look", get(look::look))
        .route("/api/textdiff", get(textdiff))
        .route("/api/diff", get(diff))
        .route("/api/search", get(search))
        .route("/api/restore", post(restore))
        .route("/api/put-back", post(putback::put_back))
        .route("/api/progress", get(progress))
        .route("/api/status", get(profiles::status))
        .route("/api/profile", post(profiles::switch))
        .route("/api/backup", post(profiles::backup))
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
