//! Browsing: the snapshots, a directory's entries, a path's versions, a
//! diff of two snapshots or of two versions of a text file, a search.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, PoisonError};

use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::Json;
use capsule_engine::browse::Browser;
use capsule_engine::EngineError;
use capsule_format::snapshot::Snapshot;
use capsule_format::tree::NodeKind;
use capsule_format::{BlobId, ObjectId};
use serde::{Deserialize, Serialize};

use super::download::copy_file;
use super::paths::{dir_tree, escape, resolve, root_tree, snapshot_path, At};
use super::state::{bad, blocking, Failure, Shared};

#[derive(Serialize)]
pub(crate) struct SnapshotRow {
    pub(crate) id: String,
    time: String,
    time_unix: i64,
    pub(crate) host: String,
    pub(crate) paths: Vec<String>,
    pub(crate) files: u64,
    bytes: u64,
    files_read: u64,
    bytes_added: u64,
    incomplete: bool,
}

pub(crate) async fn snapshots(State(ui): State<Shared>) -> Result<Json<Vec<SnapshotRow>>, Failure> {
    let shown = ui.shown();
    let s2 = shown.clone();
    blocking(move || {
        if let Some(v) = (s2.refresh)() {
            *s2.view.write().unwrap_or_else(PoisonError::into_inner) = Arc::new(v);
        }
        Ok(())
    })
    .await?;
    Ok(Json(
        shown
            .view()
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

#[derive(Serialize)]
pub(crate) struct EntryRow {
    pub(crate) name: String,
    #[serde(rename = "type")]
    pub(crate) kind: &'static str,
    pub(crate) size: u64,
    pub(crate) mtime: i64,
    pub(crate) mode: u32,
    /// False when the name is not UTF-8 (its odd bytes are `%XX` in
    /// `name`).
    utf8: bool,
}

pub(crate) async fn ls(
    State(ui): State<Shared>,
    Query(q): Query<At>,
) -> Result<Json<Vec<EntryRow>>, Failure> {
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
pub(crate) struct PathOnly {
    pub(crate) path: String,
}

pub(crate) async fn versions(
    State(ui): State<Shared>,
    Query(q): Query<PathOnly>,
) -> Result<Json<capsule_engine::versions::Versions>, Failure> {
    let path = snapshot_path(&q.path)?;
    let v = ui.view();
    blocking(move || Ok(v.browser.versions(&v.snapshots, &path)?))
        .await
        .map(Json)
}

#[derive(Deserialize)]
pub(crate) struct TextDiff {
    pub(crate) path: String,
    pub(crate) a: usize,
    pub(crate) b: usize,
}

/// A unified diff between two versions of a text file (at most 4 MiB
/// each; larger or binary ones are refused).
pub(crate) async fn textdiff(
    State(ui): State<Shared>,
    Query(q): Query<TextDiff>,
) -> Result<String, Failure> {
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
pub(crate) struct DiffQ {
    pub(crate) a: String,
    pub(crate) b: String,
}

pub(crate) async fn diff(
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
pub(crate) struct SearchQ {
    /// One snapshot; none: every snapshot (search across time).
    pub(crate) snapshot: Option<String>,
    pub(crate) q: String,
}

/// At most this many hits are answered, and kept per directory.
const MAX_HITS: usize = 1000;

/// One path whose name matched, and where in time it was found.
#[derive(Serialize)]
pub(crate) struct Hit {
    pub(crate) path: String,
    #[serde(rename = "type")]
    pub(crate) kind: &'static str,
    /// Snapshots holding it.
    pub(crate) snapshots: usize,
    first_time: String,
    last_time: String,
    last_snapshot: String,
}

#[derive(Serialize)]
pub(crate) struct Hits {
    pub(crate) hits: Vec<Hit>,
    /// More matched than were answered: narrow the search.
    truncated: bool,
}

/// The names below a tree that contain what is searched for, found once
/// per tree: a subtree unchanged across snapshots keeps its ID, so a
/// search across time costs the trees that differ, not one walk per
/// snapshot.
struct Finder<'a> {
    pub(crate) b: &'a Browser,
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
pub(crate) async fn search(
    State(ui): State<Shared>,
    Query(q): Query<SearchQ>,
) -> Result<Json<Hits>, Failure> {
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
