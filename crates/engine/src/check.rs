//! Integrity check.
//!
//! * Structure (always): every index file authenticates and decodes; every
//!   indexed pack exists with the indexed size; every snapshot decodes;
//!   every tree of every snapshot loads; every blob a file needs is indexed
//!   and lives in an intact pack.
//! * `--read-data`: additionally reads every pack whole, checks its bytes
//!   against its name (BLAKE3), authenticates its header and every blob, and
//!   checks each blob's plaintext against its keyed ID. Any single flipped bit
//!   anywhere in a pack is found.
//!
//! Problems name the damaged object and the files that depend on it.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

use capsule_crypto::Aad;
use capsule_format::pack::{decode_header, parse_trailer, PACK_TRAILER_LEN};
use capsule_format::tree::NodeKind;
use capsule_format::{BlobId, BlobType, ObjectId};
use rayon::prelude::*;

use crate::index::MasterIndex;
use crate::progress::Progress;
use crate::repo::Repository;
use crate::{EngineError, Result};

/// One damaged object and what it affects.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Problem {
    /// Object name (`data/..`, `index/..`, `snapshots/..`, or a blob).
    pub object: String,
    /// What is wrong with it.
    pub problem: String,
    /// Files and directories (`<snapshot>:<path>`) that cannot be restored intact.
    pub affected: Vec<String>,
}

/// Result of a check.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct CheckReport {
    /// Snapshots examined.
    pub snapshots: u64,
    /// Distinct trees loaded.
    pub trees: u64,
    /// Packs examined.
    pub packs: u64,
    /// Blobs authenticated (with `read_data`).
    pub blobs_read: u64,
    /// Bytes read (with `read_data`).
    pub bytes_read: u64,
    /// Packs present but in no index (left by an interrupted backup;
    /// harmless, reclaimed by a future prune).
    pub unindexed_packs: Vec<String>,
    /// Everything found wrong.
    pub problems: Vec<Problem>,
}

impl CheckReport {
    /// True when nothing is damaged.
    pub fn ok(&self) -> bool {
        self.problems.is_empty()
    }
}

#[derive(Default)]
struct Problems(BTreeMap<String, Problem>);

impl Problems {
    fn add(&mut self, object: String, problem: String) {
        self.0.entry(object.clone()).or_insert(Problem {
            object,
            problem,
            affected: Vec::new(),
        });
    }
    fn affect(&mut self, object: &str, what: String) {
        if let Some(p) = self.0.get_mut(object) {
            if p.affected.len() < 1000 {
                p.affected.push(what);
            }
        }
    }
}

/// Checks the repository.
pub fn check(repo: &Repository, read_data: bool, progress: &Progress) -> Result<CheckReport> {
    let mut report = CheckReport::default();
    let mut problems = Problems::default();
    let (index, bad_index) = repo.load_index()?;
    for e in bad_index {
        let (obj, detail) = describe(&e);
        problems.add(obj, detail);
    }

    // Packs on storage vs packs in the index.
    let mut stored: HashMap<String, u64> = HashMap::new();
    for prefix in ["data/", "tree/"] {
        stored.extend(
            repo.backend()
                .list(prefix)?
                .into_iter()
                .map(|o| (o.name, o.size)),
        );
    }
    let indexed: HashSet<String> = index.packs().iter().map(|p| p.name()).collect();
    // Blob -> the problem object that makes it unusable.
    let mut damaged: HashMap<BlobId, String> = HashMap::new();
    let mut blobs_by_pack: HashMap<u32, Vec<(BlobId, crate::index::BlobLoc)>> = HashMap::new();
    for (id, loc) in index.iter() {
        blobs_by_pack.entry(loc.pack).or_default().push((*id, *loc));
    }
    let mut intact_packs = Vec::new();
    for (pos, pack) in index.packs().iter().enumerate() {
        let (name, size) = (pack.name(), &pack.size);
        let issue = match stored.get(&name) {
            None => Some("missing".to_string()),
            Some(s) if s != size => Some(format!(
                "{s} bytes on storage, index says {size} (truncated or replaced)"
            )),
            Some(_) => None,
        };
        match issue {
            Some(msg) => {
                problems.add(name.clone(), format!("pack {msg}"));
                for (b, _) in blobs_by_pack.get(&(pos as u32)).into_iter().flatten() {
                    damaged.insert(*b, name.clone());
                }
            }
            None => intact_packs.push(pos as u32),
        }
    }
    report.packs = index.packs().len() as u64;
    let mut unindexed: Vec<String> = stored
        .keys()
        .filter(|n| !indexed.contains(*n))
        .cloned()
        .collect();
    unindexed.sort();
    report.unindexed_packs = unindexed;

    if read_data {
        progress
            .files_total
            .store(intact_packs.len() as u64, Ordering::Relaxed);
        progress.bytes_total.store(
            intact_packs
                .iter()
                .map(|p| index.packs()[*p as usize].size)
                .sum(),
            Ordering::Relaxed,
        );
        progress.totals_final.store(true, Ordering::Relaxed);
        let blobs_read = AtomicU64::new(0);
        let found: Vec<(String, String, Vec<BlobId>)> = intact_packs
            .par_iter()
            .filter_map(|&pos| {
                let pack = index.packs()[pos as usize];
                let entries = blobs_by_pack.get(&pos).map(|v| v.as_slice()).unwrap_or(&[]);
                let r = read_pack(repo, &pack, entries, &blobs_read, progress);
                Progress::add(&progress.files_done, 1);
                r
            })
            .collect();
        for (name, msg, bad) in found {
            problems.add(name.clone(), msg);
            for b in bad {
                damaged.insert(b, name.clone());
            }
        }
        report.blobs_read = blobs_read.into_inner();
        report.bytes_read = Progress::get(&progress.bytes_done);
    }

    // Snapshots and trees.
    let (snaps, bad_snaps) = repo.list_snapshots()?;
    for e in bad_snaps {
        let (obj, detail) = describe(&e);
        problems.add(obj, detail);
    }
    report.snapshots = snaps.len() as u64;
    let mut seen: HashSet<BlobId> = HashSet::new();
    for (sid, snap) in &snaps {
        let label = sid.short();
        let Ok(root) = snap.tree.parse::<BlobId>() else {
            problems.add(
                format!("snapshots/{}", sid.to_hex()),
                "bad root tree id".into(),
            );
            continue;
        };
        check_tree(
            repo,
            &index,
            &root,
            Path::new("/"),
            &label,
            &damaged,
            &mut seen,
            &mut problems,
            &mut report,
        )?;
    }
    report.problems = problems.0.into_values().collect();
    Ok(report)
}

fn describe(e: &EngineError) -> (String, String) {
    match e {
        EngineError::Corrupt { object, detail } => (object.clone(), detail.clone()),
        EngineError::Backend(b) => (b.name.clone(), b.message.clone()),
        other => ("repository".into(), other.to_string()),
    }
}

/// Reads one pack whole and verifies it. Returns `(pack, problem, damaged
/// blobs)` if anything is wrong.
fn read_pack(
    repo: &Repository,
    pack: &crate::index::PackInfo,
    entries: &[(BlobId, crate::index::BlobLoc)],
    blobs_read: &AtomicU64,
    progress: &Progress,
) -> Option<(String, String, Vec<BlobId>)> {
    let (name, pid) = (pack.name(), &pack.id);
    let bytes = match repo.backend().get(&name, None) {
        Ok(b) => b,
        Err(e) => {
            return Some((
                name,
                format!("unreadable: {e}"),
                entries.iter().map(|e| e.0).collect(),
            ))
        }
    };
    Progress::add(&progress.bytes_done, bytes.len() as u64);
    let mut msgs = Vec::new();
    if ObjectId::of(&bytes) != *pid {
        msgs.push("content does not match its name (bit rot or tampering)".to_string());
    }
    if let Err(m) = check_header(repo, &bytes) {
        msgs.push(format!("header: {m}"));
    }
    let mut bad = Vec::new();
    for (id, loc) in entries {
        blobs_read.fetch_add(1, Ordering::Relaxed);
        let (s, e) = (
            loc.offset as usize,
            loc.offset as usize + loc.length as usize,
        );
        let ok = bytes.get(s..e).is_some_and(|env| {
            repo.decode_blob(&name, loc.blob_type, id, env, loc.raw_length as usize)
                .is_ok()
        });
        if !ok {
            bad.push(*id);
        }
    }
    if !bad.is_empty() {
        msgs.push(format!(
            "{} of {} blobs fail authentication",
            bad.len(),
            entries.len()
        ));
    }
    if msgs.is_empty() {
        None
    } else {
        Some((name, msgs.join("; "), bad))
    }
}

fn check_header(repo: &Repository, bytes: &[u8]) -> std::result::Result<(), String> {
    if bytes.len() < PACK_TRAILER_LEN {
        return Err("pack shorter than its trailer".into());
    }
    let t = &bytes[bytes.len() - PACK_TRAILER_LEN..];
    let hlen = parse_trailer(t, bytes.len() as u64).map_err(|e| e.to_string())? as usize;
    let start = bytes.len() - PACK_TRAILER_LEN - hlen;
    let plain = repo
        .key()
        .open(
            Aad::PackHeader,
            &bytes[start..bytes.len() - PACK_TRAILER_LEN],
        )
        .map_err(|e| e.to_string())?;
    decode_header(&plain).map(|_| ()).map_err(|e| e.to_string())
}

#[allow(clippy::too_many_arguments)]
fn check_tree(
    repo: &Repository,
    index: &MasterIndex,
    tree: &BlobId,
    base: &Path,
    snap: &str,
    damaged: &HashMap<BlobId, String>,
    seen: &mut HashSet<BlobId>,
    problems: &mut Problems,
    report: &mut CheckReport,
) -> Result<()> {
    if !seen.insert(*tree) {
        return Ok(());
    }
    report.trees += 1;
    let where_ = || format!("{snap}:{}", base.display());
    if let Some(obj) = damaged.get(tree) {
        problems.affect(obj, where_());
        return Ok(());
    }
    let nodes = match repo.load_tree(index, tree) {
        Ok(n) => n,
        Err(e @ EngineError::Backend(_)) if !matches!(&e, EngineError::Backend(b) if b.kind == capsule_backend::ErrorKind::NotFound) => {
            return Err(e)
        }
        Err(e) => {
            let obj = format!("tree {}", tree.to_hex());
            let msg = match e {
                EngineError::MissingBlob(_) => "tree is not in any index".to_string(),
                other => other.to_string(),
            };
            problems.add(obj.clone(), msg);
            problems.affect(&obj, where_());
            return Ok(());
        }
    };
    for n in &nodes {
        let p = base.join(OsStr::from_bytes(&n.name));
        match n.kind() {
            NodeKind::Dir => {
                if let Some(sub) = &n.subtree {
                    check_tree(repo, index, sub, &p, snap, damaged, seen, problems, report)?;
                }
            }
            NodeKind::File => {
                for b in &n.content {
                    if let Some(obj) = damaged.get(b) {
                        problems.affect(obj, format!("{snap}:{}", p.display()));
                        break;
                    }
                    match index.get(b) {
                        Some(l) if l.blob_type == BlobType::Data => {}
                        _ => {
                            let obj = format!("blob {}", b.to_hex());
                            problems.add(obj.clone(), "referenced but not in any index".into());
                            problems.affect(&obj, format!("{snap}:{}", p.display()));
                            break;
                        }
                    }
                }
            }
            _ => {}
        }
    }
    Ok(())
}
