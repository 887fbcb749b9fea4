//! `capsule find`: the paths matching a pattern across snapshots, each with
//! its distinct versions. A tree is read once for every place it appears
//! at (snapshots of an hourly history share almost all of them), and what
//! matched below it is kept, so a thousand snapshots cost about what their
//! changes cost, not a thousand walks.

use std::collections::HashMap;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use capsule_format::snapshot::Snapshot;
use capsule_format::tree::{Node, NodeKind};
use capsule_format::{BlobId, ObjectId};
use globset::{GlobBuilder, GlobMatcher};
use serde::Serialize;

use crate::error::{EngineError, Result};
use crate::index::MasterIndex;
use crate::repo::Repository;

/// Trees nested deeper than this are damage.
const MAX_DEPTH: usize = 512;

/// A pattern: one without `/` matches a name, one with it the whole path
/// (`*` stays within a name, `**` crosses directories).
pub struct Pattern {
    glob: GlobMatcher,
    whole_path: bool,
}

impl Pattern {
    /// Compiles `p`; `fold_case` matches without regard to case.
    pub fn new(p: &str, fold_case: bool) -> Result<Pattern> {
        let whole_path = p.contains('/');
        let glob = GlobBuilder::new(p)
            .literal_separator(true)
            .case_insensitive(fold_case)
            .backslash_escape(true)
            .build()
            .map_err(|e| EngineError::Invalid(format!("pattern {p:?}: {e}")))?
            .compile_matcher();
        Ok(Pattern { glob, whole_path })
    }

    fn matches(&self, path: &Path, name: &[u8]) -> bool {
        if self.whole_path {
            self.glob.is_match(path)
        } else {
            self.glob
                .is_match(Path::new(std::ffi::OsStr::from_bytes(name)))
        }
    }
}

/// One distinct version of a path found.
#[derive(Debug, Clone, Serialize)]
pub struct FoundVersion {
    /// `file`, `dir`, `symlink`…
    #[serde(rename = "type")]
    pub kind: &'static str,
    /// Bytes (files).
    pub size: u64,
    /// Modification time, Unix seconds.
    pub mtime: i64,
    /// The newest snapshot holding it, and its time.
    pub snapshot: String,
    /// See `snapshot`.
    pub time: String,
    /// The oldest snapshot holding it, and its time.
    pub first_snapshot: String,
    /// See `first_snapshot`.
    pub first_time: String,
    /// How many of the snapshots searched hold it.
    pub snapshots: usize,
}

/// A path found, with its versions, newest first.
#[derive(Debug, Clone, Serialize)]
pub struct Found {
    /// The path (lossy UTF-8 for display; `path_bytes` when it is not).
    pub path: String,
    /// The path's bytes in hex, when they are not UTF-8.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub path_hex: Option<String>,
    /// Its distinct versions, newest first.
    pub versions: Vec<FoundVersion>,
    /// Versions left out by `newest`.
    pub more: usize,
}

/// What `find` found.
#[derive(Debug, Clone, Default, Serialize)]
pub struct FindReport {
    /// Snapshots searched.
    pub snapshots: usize,
    /// Distinct trees read.
    pub trees_read: usize,
    /// Paths found, sorted.
    pub found: Vec<Found>,
    /// Snapshots whose trees could not be read, and why.
    pub damaged: Vec<String>,
}

/// A match below one tree at one place.
struct Hit {
    path: PathBuf,
    node: Node,
}

/// What matched below a tree: its own entries and its subtrees' hits.
#[derive(Default)]
struct Below {
    here: Vec<Hit>,
    under: Vec<Arc<Below>>,
}

impl Below {
    fn each(&self, f: &mut dyn FnMut(&Hit)) {
        self.here.iter().for_each(&mut *f);
        for u in &self.under {
            u.each(f);
        }
    }

    fn is_empty(&self) -> bool {
        self.here.is_empty() && self.under.is_empty()
    }
}

struct Search<'a> {
    repo: &'a Repository,
    index: &'a MasterIndex,
    patterns: &'a [Pattern],
    memo: HashMap<(BlobId, PathBuf), Arc<Below>>,
    /// Entries that may still be visited: crafted trees sharing subtrees
    /// under many names could describe 2^40 paths.
    budget: u64,
}

impl Search<'_> {
    fn below(&mut self, tree: &BlobId, at: &Path, depth: usize) -> Result<Arc<Below>> {
        let key = (*tree, at.to_path_buf());
        if let Some(b) = self.memo.get(&key) {
            return Ok(b.clone());
        }
        if depth > MAX_DEPTH {
            return Err(EngineError::corrupt(
                format!("tree {}", tree.short()),
                "nested over 512 deep",
            ));
        }
        let nodes = self.repo.load_tree(self.index, tree)?;
        self.budget = self.budget.checked_sub(nodes.len() as u64).ok_or_else(|| {
            EngineError::corrupt(
                format!("tree {}", tree.short()),
                "its snapshots' trees hold more entries than they record",
            )
        })?;
        let mut out = Below::default();
        for n in nodes {
            let p = at.join(std::ffi::OsStr::from_bytes(&n.name));
            if let (NodeKind::Dir, Some(sub)) = (n.kind(), n.subtree) {
                let b = self.below(&sub, &p, depth + 1)?;
                if !b.is_empty() {
                    out.under.push(b);
                }
            }
            if self.patterns.iter().any(|pt| pt.matches(&p, &n.name)) {
                out.here.push(Hit { path: p, node: n });
            }
        }
        let out = Arc::new(out);
        self.memo.insert(key, out.clone());
        Ok(out)
    }
}

/// The paths matching any of `patterns` in `snaps` (oldest first), each
/// with at most `newest` versions (newest first; None: all).
pub fn find(
    repo: &Repository,
    index: &MasterIndex,
    snaps: &[(ObjectId, Snapshot)],
    patterns: &[Pattern],
    newest: Option<usize>,
) -> Result<FindReport> {
    let budget = snaps
        .iter()
        .map(|(_, s)| crate::treewalk::entry_budget(s))
        .fold(0u64, u64::saturating_add);
    let mut search = Search {
        repo,
        index,
        patterns,
        memo: HashMap::new(),
        budget,
    };
    let mut report = FindReport {
        snapshots: snaps.len(),
        ..Default::default()
    };
    // Path → versions by fingerprint, in the order first seen.
    type Seen = Vec<([u8; 32], FoundVersion)>;
    let mut paths: std::collections::BTreeMap<PathBuf, Seen> = Default::default();
    for (id, s) in snaps {
        let root: BlobId = match s.tree.parse() {
            Ok(r) => r,
            Err(_) => {
                report.damaged.push(format!("{}: bad tree id", id.short()));
                continue;
            }
        };
        let below = match search.below(&root, Path::new("/"), 0) {
            Ok(b) => b,
            Err(EngineError::Backend(b)) if b.is_destination_failure() => {
                return Err(EngineError::Backend(b))
            }
            Err(e) => {
                report.damaged.push(format!("{}: {e}", id.short()));
                continue;
            }
        };
        below.each(&mut |h| {
            let print = crate::versions::fingerprint(&h.node);
            let seen = paths.entry(h.path.clone()).or_default();
            match seen.iter_mut().find(|(p, _)| *p == print) {
                Some((_, v)) => {
                    v.snapshot = id.to_hex();
                    v.time = s.time.clone();
                    v.snapshots += 1;
                    v.mtime = h.node.mtime.secs;
                }
                None => seen.push((
                    print,
                    FoundVersion {
                        kind: h.node.kind().as_str(),
                        size: h.node.size,
                        mtime: h.node.mtime.secs,
                        snapshot: id.to_hex(),
                        time: s.time.clone(),
                        first_snapshot: id.to_hex(),
                        first_time: s.time.clone(),
                        snapshots: 1,
                    },
                )),
            }
        });
    }
    report.trees_read = search.memo.len();
    for (p, seen) in paths {
        let mut versions: Vec<FoundVersion> = seen.into_iter().map(|(_, v)| v).collect();
        // Newest first: by the newest snapshot holding each.
        versions.reverse();
        versions.sort_by(|a, b| b.time.cmp(&a.time));
        let keep = newest.unwrap_or(usize::MAX).min(versions.len());
        let more = versions.len() - keep;
        versions.truncate(keep);
        let bytes = p.as_os_str().as_bytes();
        report.found.push(Found {
            path: p.to_string_lossy().into_owned(),
            path_hex: std::str::from_utf8(bytes)
                .is_err()
                .then(|| hex::encode(bytes)),
            versions,
            more,
        });
    }
    Ok(report)
}
