//! The profiles: each one's status, which one the page shows (switched
//! from the page, each repository opened with its own credentials), and
//! "Back up now".

use std::sync::{Arc, PoisonError};

use axum::extract::State;
use axum::http::StatusCode;
use axum::Json;
use serde::Deserialize;

use super::state::{bad, blocking, Failure, Shared};

/// Each profile's status (`capsule status --json`), with the one shown.
pub(crate) async fn status(State(ui): State<Shared>) -> Json<serde_json::Value> {
    let ui2 = ui.clone();
    let mut s = tokio::task::spawn_blocking(move || (ui2.status)())
        .await
        .unwrap_or_default();
    s["current"] = serde_json::json!(ui.shown().profile);
    Json(s)
}

#[derive(Deserialize)]
pub(crate) struct ProfileQ {
    profile: String,
}

fn named(q: &ProfileQ) -> Result<String, Failure> {
    if q.profile.is_empty() || q.profile.len() > 256 || q.profile.contains('\0') {
        return Err(bad("not a profile name"));
    }
    Ok(q.profile.clone())
}

/// Shows another profile's repository. Restores and downloads under way
/// read on from the one they started in.
pub(crate) async fn switch(
    State(ui): State<Shared>,
    Json(q): Json<ProfileQ>,
) -> Result<Json<serde_json::Value>, Failure> {
    let name = named(&q)?;
    let ui2 = ui.clone();
    let shown = blocking(move || {
        (ui2.open_profile)(&name).map_err(|e| Failure(StatusCode::BAD_GATEWAY, e))
    })
    .await?;
    let current = shown.profile.clone();
    *ui.shown.write().unwrap_or_else(PoisonError::into_inner) = Arc::new(shown);
    Ok(Json(serde_json::json!({ "current": current })))
}

/// Starts a profile's backup now; the page follows it in `/api/status`
/// (its `running` progress, then its `last_run`).
pub(crate) async fn backup(
    State(ui): State<Shared>,
    Json(q): Json<ProfileQ>,
) -> Result<Json<serde_json::Value>, Failure> {
    let name = named(&q)?;
    let how = blocking(move || (ui.backup_now)(&name)).await?;
    Ok(Json(how))
}
