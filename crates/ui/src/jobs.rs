//! Restores started from the page and their progress, and the profiles'
//! status and the recorded reports, which the process serving the page
//! provides.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::{Html, IntoResponse, Response};
use axum::Json;
use serde::Deserialize;

use super::paths::{resolve, root_tree, snapshot_path};
use super::state::{bad, blocking, Failure, Shared};

#[derive(Deserialize)]
pub(crate) struct RestoreQ {
    pub(crate) snapshot: String,
    pub(crate) path: String,
    pub(crate) target: String,
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
pub(crate) async fn restore(
    State(ui): State<Shared>,
    Json(q): Json<RestoreQ>,
) -> Result<Response, Failure> {
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
        let r = run_restore(&ui, &v, &root, &opts, q.job)?;
        let mut report = serde_json::to_value(&r).unwrap_or_default();
        // Restored less than asked: not a success, whatever was written.
        let code = if r.errors.is_empty() {
            StatusCode::OK
        } else {
            report["error"] = serde_json::Value::from(not_restored(&r));
            StatusCode::INTERNAL_SERVER_ERROR
        };
        Ok((code, Json(report)).into_response())
    })
    .await
}

/// Runs a restore of `root` under the page's name `job` (if it gave a
/// usable one), so `/api/progress?job=` can say how far it got.
pub(crate) fn run_restore(
    ui: &Shared,
    v: &capsule_engine::browse::View,
    root: &capsule_format::BlobId,
    opts: &capsule_engine::restore::RestoreOptions,
    job: Option<String>,
) -> Result<capsule_engine::restore::RestoreReport, Failure> {
    let job = job.filter(|j| !j.is_empty() && j.len() <= 64);
    let progress = match &job {
        Some(j) => ui.jobs.start(j),
        None => Arc::default(),
    };
    let r = capsule_engine::restore::restore(
        v.browser.repo(),
        v.browser.index(),
        root,
        opts,
        &progress,
    );
    if let Some(j) = &job {
        ui.jobs.end(j);
    }
    Ok(r?)
}

/// What a restore could not restore, in one line: how many, the first few.
pub(crate) fn not_restored(r: &capsule_engine::restore::RestoreReport) -> String {
    format!(
        "{} entries could not be restored: {}",
        r.errors.len(),
        r.errors
            .iter()
            .take(3)
            .map(|w| format!("{}: {}", w.path, w.message))
            .collect::<Vec<_>>()
            .join("; ")
    )
}

#[derive(Deserialize)]
pub(crate) struct JobQ {
    job: String,
}

/// How far a restore got: files and bytes done of those to restore.
pub(crate) async fn progress(
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

pub(crate) async fn reports(State(ui): State<Shared>) -> Json<serde_json::Value> {
    let ui2 = ui.clone();
    Json(
        tokio::task::spawn_blocking(move || (ui2.reports)())
            .await
            .unwrap_or_default(),
    )
}

#[derive(Deserialize)]
pub(crate) struct ReportQ {
    pub(crate) id: String,
}

/// A recorded backup's or lab run's report, as `capsule report --html`
/// writes it: self-contained, charts inline.
pub(crate) async fn report(
    State(ui): State<Shared>,
    Query(q): Query<ReportQ>,
) -> Result<Response, Failure> {
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
