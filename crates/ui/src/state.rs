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

/// The repository the page shows, and what keeps it shown.
pub struct Shown {
    /// The profile it belongs to (None: named by `--repo`).
    pub profile: Option<String>,
    /// Its snapshots and browser; replaced by `refresh`.
    pub view: RwLock<Arc<View>>,
    /// Lists the snapshots again (None: nothing changed).
    pub refresh: Refresh,
    /// Its reading session, held as long as it is shown.
    pub session: Option<capsule_engine::session::Session>,
}

impl Shown {
    pub(crate) fn view(&self) -> Arc<View> {
        self.view
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

/// Opens a profile's repository with its own credentials, to be shown
/// instead (Err: why not, in one line).
pub type OpenProfile = Box<dyn Fn(&str) -> Result<Shown, String> + Send + Sync>;

/// Starts a backup of a profile now ("Back up now"): how it was started.
/// A profile that does not exist is [`Failure::not_found`], naming those
/// that do.
pub type BackupNow = Box<dyn Fn(&str) -> Result<serde_json::Value, Failure> + Send + Sync>;

/// What the page needs from the process serving it.
pub struct Ui {
    /// The repository shown; replaced when the page switches profiles.
    pub shown: RwLock<Arc<Shown>>,
    /// The token every request must carry.
    pub token: String,
    /// Opens another profile's repository.
    pub open_profile: OpenProfile,
    /// Starts a profile's backup now.
    pub backup_now: BackupNow,
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
    /// This machine's name as backups record it: only its own snapshots
    /// are put back in place.
    pub host: String,
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

impl Failure {
    /// 404: what was asked for is not there (the message says what is).
    pub fn not_found(why: impl Into<String>) -> Self {
        Failure(StatusCode::NOT_FOUND, why.into())
    }
    /// 500: it could not be done.
    pub fn internal(why: impl Into<String>) -> Self {
        Failure(StatusCode::INTERNAL_SERVER_ERROR, why.into())
    }
}

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
    pub(crate) fn shown(&self) -> Arc<Shown> {
        self.shown
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
    pub(crate) fn view(&self) -> Arc<View> {
        self.shown().view()
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
