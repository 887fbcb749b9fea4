//! What every handler shares: the page's state ([`Ui`]), the restore
//! jobs, and how a failure becomes a response.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError, RwLock};

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use capsule_engine::browse::{Refresh, View};
use capsule_engine::EngineError;

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
    pub(crate) fn start(&self, id: &str) -> Arc<capsule_engine::progress::Progress> {
        let p = Arc::new(capsule_engine::progress::Progress::default());
        let mut m = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        // A page that never asks leaves nothing behind: ended jobs are
        // removed, and the map is bounded in any case.
        if m.len() < 64 {
            m.insert(id.to_string(), p.clone());
        }
        p
    }
    pub(crate) fn end(&self, id: &str) {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(id);
    }
    pub(crate) fn get(&self, id: &str) -> Option<Arc<capsule_engine::progress::Progress>> {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(id)
            .cloned()
    }
}

/// A request refused or failed, as the page shows it.
#[derive(Debug)]
pub struct Failure(pub(crate) StatusCode, pub(crate) String);

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

pub(crate) fn bad(why: impl Into<String>) -> Failure {
    Failure(StatusCode::BAD_REQUEST, why.into())
}

pub(crate) type Shared = Arc<Ui>;

impl Ui {
    pub(crate) fn view(&self) -> Arc<View> {
        self.view
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

/// Runs `f` on a blocking thread: the engine reads the destination.
pub(crate) async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, Failure> + Send + 'static,
) -> Result<T, Failure> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| Failure(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?
}
