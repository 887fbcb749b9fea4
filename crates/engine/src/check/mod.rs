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

use capsule_format::index::IndexPack;
use capsule_format::tree::NodeKind;
use capsule_format::{BlobId, BlobType, FileType, ObjectId};

use crate::error::{EngineError, Result};
use crate::index::MasterIndex;
use crate::progress::Progress;
use crate::repo::Repository;

mod read;

use read::{blobs_in, read_data};
pub use read::{ReadTiming, Subset};

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
    /// Which packs were read (`all`, `3/12`, `5%`…), with `read_data`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub subset: Option<String>,
    /// Packs read (with `read_data`).
    pub packs_read: u64,
    /// Intact packs a subset left unread.
    pub packs_not_read: u64,
    /// With a slice (`N/M`, `next/M`): when each slice of `M` was last
    /// verified, from the repository's records, this one included.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub slices: Vec<crate::verified::SliceRecord>,
    /// Why this slice's verification could not be recorded (a key that
    /// may only read): the rotation stays where it was.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub slice_not_recorded: Option<String>,
    /// Packs present but in no index: left by an interrupted backup, or
    /// orphaned by a lost index file (`capsule repair index` indexes them).
    pub unindexed_packs: Vec<String>,
    /// Index files the store lists but answers "not found" for on every
    /// read (a distributed store can list, for months, an object whose
    /// upload or delete a node's outage cut). Not damage by itself: a blob
    /// a snapshot uses that only such a file located is reported as "not
    /// in any index", with what it affects. `capsule repair index` indexes
    /// their packs again and supersedes them.
    pub index_files_gone: Vec<String>,
    /// Packs a prune has marked for deletion (out of the index on purpose;
    /// the next prune deletes them unless a snapshot uses them again).
    pub packs_marked_for_deletion: u64,
    /// Packs the index names that the destination's listing left out but a
    /// request by name found: its listings lag behind its writes (not
    /// damage; said so that a store's operator can see it).
    pub listing_lagged: u64,
    /// How the packs were read, and what limited it (with `read_data`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub read: Option<ReadTiming>,
    /// Everything found wrong.
    pub problems: Vec<Problem>,
    /// Packs found missing, truncated or damaged: a backup must not
    /// reference their blobs, and uploads them again instead.
    pub damaged_packs: Vec<String>,
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
    check_subset(repo, read_data.then_some(Subset::All), progress)
}

/// Checks the repository, reading the packs `read` names (none: reads no
/// data; the structure is checked in full either way).
pub fn check_subset(
    repo: &Repository,
    read: Option<Subset>,
    progress: &Progress,
) -> Result<CheckReport> {
    let mut report = CheckReport::default();
    let mut problems = Problems::default();
    let started_unix = crate::timefmt::now_unix();
    let read = match read {
        Some(Subset::Next(m)) => {
            let (records, _) = crate::verified::load(repo)?;
            Some(Subset::Slice(crate::verified::next(&records, m), m))
        }
        r => r,
    };
    // Snapshots first, then index files, then packs: each object is written
    // after everything it refers to, so listing in this order sees all that
    // a listed snapshot needs even while a backup is running. (The other
    // order finds a new snapshot whose index file it has not loaded yet.)
    let (snaps, bad_snaps) = repo.list_snapshots()?;
    let (mut index, bad_index) = repo.load_index()?;
    for e in bad_index {
        match &e {
            EngineError::Backend(b) if crate::index::is_not_found(&e) => {
                report.index_files_gone.push(b.name.clone());
            }
            _ => {
                let (obj, detail) = describe(&e);
                problems.add(obj, detail);
            }
        }
    }

    // Marks before the pack listing: a prune deletes a marked pack before
    // its mark, so a pack listed below whose mark is gone by then cannot be
    // taken for an unindexed one.
    let marked_packs = crate::prune::marked_index_packs(repo)?;
    let marked: HashSet<ObjectId> = marked_packs.iter().map(|p| p.id).collect();

    // Packs on storage vs packs in the index.
    let mut stored: HashMap<String, u64> = HashMap::new();
    for prefix in [FileType::DataPack.prefix(), FileType::TreePack.prefix()] {
        stored.extend(
            repo.backend()
                .list(prefix)?
                .into_iter()
                .map(|o| (o.name, o.size)),
        );
    }
    // A listing is not the last word: a store whose listings lag behind its
    // writes (an eventually consistent one, or a distributed one healing a
    // node) can leave out a pack stored a moment ago. A pack the index
    // names and the listing lacks is asked for by name (read-after-write
    // holds for that on every store capsule supports) before it is called
    // missing.
    for pack in index.packs() {
        if let std::collections::hash_map::Entry::Vacant(slot) = stored.entry(pack.name()) {
            match repo.backend().stat(slot.key()) {
                Ok(o) => {
                    report.listing_lagged += 1;
                    slot.insert(o.size);
                }
                Err(e) if e.kind == capsule_backend::ErrorKind::NotFound => {}
                Err(e) => return Err(e.into()),
            }
        }
    }
    let indexed: HashSet<String> = index.packs().iter().map(|p| p.name()).collect();
    // Blob -> the problem object that makes it unusable.
    let mut damaged: HashMap<BlobId, String> = HashMap::new();
    let mut intact_packs = Vec::new();
    let mut broken: Vec<(u32, String)> = Vec::new();
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
                broken.push((pos as u32, name));
            }
            None => intact_packs.push(pos as u32),
        }
    }
    if !broken.is_empty() {
        let at: HashSet<u32> = broken.iter().map(|(p, _)| *p).collect();
        for (pos, blobs) in blobs_in(&index, &at) {
            if let Some((_, name)) = broken.iter().find(|(p, _)| *p == pos) {
                for (b, _) in blobs {
                    damaged.insert(b, name.clone());
                }
            }
        }
    }
    report.packs = index.packs().len() as u64;
    let is_marked = |name: &str| {
        name.rsplit('/')
            .next()
            .and_then(|h| h.parse::<ObjectId>().ok())
            .is_some_and(|id| marked.contains(&id))
    };
    report.packs_marked_for_deletion = stored.keys().filter(|n| is_marked(n)).count() as u64;
    let mut unindexed: Vec<String> = stored
        .keys()
        .filter(|n| !indexed.contains(*n) && !is_marked(n))
        .cloned()
        .collect();
    unindexed.sort();
    report.unindexed_packs = unindexed;

    if let Some(subset) = read {
        let all = intact_packs.len();
        let intact_packs = subset.pick(
            intact_packs
                .iter()
                .map(|&p| {
                    let pack = index.packs()[p as usize];
                    (p, pack.id, pack.size)
                })
                .collect(),
        );
        report.subset = Some(subset.describe());
        report.packs_read = intact_packs.len() as u64;
        report.packs_not_read = (all - intact_packs.len()) as u64;
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
        let (found, timing) = read_data(repo, &index, &intact_packs, &blobs_read, progress);
        for (name, msg, bad) in found {
            problems.add(name.clone(), msg);
            for b in bad {
                damaged.insert(b, name.clone());
            }
        }
        report.read = Some(timing);
        report.blobs_read = blobs_read.into_inner();
        report.bytes_read = Progress::get(&progress.bytes_done);
    }

    // Snapshots and trees. A backup that committed while a prune marked
    // blobs it reused finds them in their marked packs until the next
    // prune puts those back: not damage.
    for p in &marked_packs {
        if !index.has_pack(&p.id) {
            index.add_pack(p);
        }
    }
    for e in bad_snaps {
        let (obj, detail) = describe(&e);
        problems.add(obj, detail);
    }
    // A forgotten snapshot that cannot be read cannot be brought back; a
    // session object that cannot be read holds prunes back for a lease.
    // Neither loses live data, but both are damage the user should hear of.
    let (_, bad_forgotten) = crate::forget::list_forgotten(repo)?;
    for e in bad_forgotten {
        let (obj, detail) = describe(&e);
        problems.add(
            obj,
            format!("forgotten snapshot cannot be read ({detail}): `capsule unforget` cannot bring it back; the next prune removes it"),
        );
    }
    for (id, names, info) in crate::session::list_sessions(repo)? {
        if info.damaged {
            problems.add(
                names.last().cloned().unwrap_or(id),
                format!(
                    "session object cannot be read: counted as a running backup until {} (its lease), then a prune removes it",
                    crate::timefmt::rfc3339(info.heartbeat_unix + crate::session::LEASE_SECS)
                ),
            );
        }
    }
    // A snapshot forgotten while this check runs may have its data swept
    // by a prune (its trees may sit in a marked pack that waits for no one,
    // read here because a backup reused them): only snapshots still live
    // when the walk is done count. Walking nothing forgotten already saves
    // work; the second listing, made only when the walk found something,
    // settles the rest.
    let list_live = || -> Result<HashSet<ObjectId>> {
        Ok(repo
            .backend()
            .list(FileType::Snapshot.prefix())?
            .iter()
            .filter_map(|o| FileType::id_of(&o.name))
            .collect())
    };
    let live = list_live()?;
    let snaps: Vec<_> = snaps
        .into_iter()
        .filter(|(id, _)| live.contains(id))
        .collect();
    let (mut walked, mut trees, mut found) = walk_snapshots(repo, &index, &damaged, &snaps)?;
    let is_clean = |walked: &Walked| {
        walked.iter().all(|(_, sub, own)| {
            own.is_none() && sub.as_ref().is_none_or(|s| s.affected.is_empty())
        })
    };
    let mut clean = is_clean(&walked);
    let added = if clean {
        Vec::new()
    } else {
        index_grew(repo, &mut index)?
    };
    if !added.is_empty() {
        // A sweep that puts back a marked pack a backup reused writes an
        // index file for it, then deletes the mark; between this check's
        // index load and its reading of the marks, it misses both, and
        // what a live snapshot reuses looks unindexed. What appeared
        // since is in the index now. A pack named only now must still be
        // there, or its blobs are as lost as any missing pack's.
        for p in &added {
            let name = FileType::pack(p.entries.first().map_or(BlobType::Data, |e| e.blob_type))
                .name(&p.id);
            report.unindexed_packs.retain(|n| *n != name);
            if stored.contains_key(&name) {
                continue;
            }
            match repo.backend().stat(&name) {
                Ok(_) => {}
                Err(e) if e.kind == capsule_backend::ErrorKind::NotFound => {
                    problems.add(name.clone(), "pack missing".to_string());
                    for b in &p.entries {
                        damaged.insert(b.id, name.clone());
                    }
                }
                Err(e) => return Err(e.into()),
            }
        }
        (walked, trees, found) = walk_snapshots(repo, &index, &damaged, &snaps)?;
        clean = is_clean(&walked);
    }
    report.trees = trees;
    let still_live = if clean { live } else { list_live()? };
    let mut reached: HashSet<&str> = HashSet::new();
    for (sid, sub, own) in &walked {
        if !still_live.contains(sid) {
            continue;
        }
        report.snapshots += 1;
        if let Some(msg) = own {
            problems.add(FileType::Snapshot.name(sid), msg.clone());
        }
        // Every snapshot gets its own list of affected paths, also below
        // trees it shares with others: each was checked once (memoised).
        let Some(sub) = sub else { continue };
        reached.extend(sub.objects.iter().map(String::as_str));
        for (obj, path) in &sub.affected {
            if let Some(p) = found.0.get(obj) {
                problems.add(obj.clone(), p.problem.clone());
            }
            problems.affect(
                obj,
                format!("{}:{}", sid.short(), Path::new("/").join(path).display()),
            );
        }
    }
    // Damage beyond the affected-paths cap of every live snapshot still
    // counts; damage only forgotten snapshots reached does not.
    for (obj, p) in found.0 {
        if reached.contains(obj.as_str()) {
            problems.add(obj, p.problem);
        }
    }
    report.damaged_packs = problems
        .0
        .keys()
        .filter(|o| {
            matches!(
                FileType::of_name(o),
                Some(FileType::DataPack | FileType::TreePack)
            )
        })
        .cloned()
        .collect();
    if let Some(f) = index.fault() {
        // This machine's copy of the index, not the repository: said, so
        // that what it hid is not taken for damage on the destination.
        problems.add("local index table".into(), f);
    }
    report.problems = problems.0.into_values().collect();
    if let Some(Subset::Slice(n, m)) = read {
        let rec = crate::verified::SliceRecord {
            slice: n,
            of: m,
            time_unix: started_unix,
            hostname: crate::repo::hostname(),
            ok: report.ok(),
            packs: report.packs_read,
        };
        // A destination this key may only read keeps no record: said, and
        // the rotation simply does not move.
        if let Err(e) = crate::verified::record(repo, &rec) {
            report.slice_not_recorded = Some(e.to_string());
        }
        if let Ok((records, _)) = crate::verified::load(repo) {
            report.slices = records.into_iter().filter(|r| r.of == m).collect();
        }
    }
    Ok(report)
}

/// Per snapshot walked: its ID, what it reaches that is damaged, and a
/// problem of its own.
type Walked = Vec<(ObjectId, Option<std::rc::Rc<Subtree>>, Option<String>)>;

/// Walks the trees of `snaps`: what each reaches that is damaged, how many
/// trees were checked, and the problems found.
fn walk_snapshots(
    repo: &Repository,
    index: &MasterIndex,
    damaged: &HashMap<BlobId, String>,
    snaps: &[(ObjectId, capsule_format::snapshot::Snapshot)],
) -> Result<(Walked, u64, Problems)> {
    let mut walker = TreeChecker {
        repo,
        index,
        damaged,
        memo: HashMap::new(),
        in_progress: HashSet::new(),
        problems: Problems::default(),
    };
    let mut walked = Vec::with_capacity(snaps.len());
    for (sid, snap) in snaps {
        let Ok(root) = snap.tree.parse::<BlobId>() else {
            walked.push((*sid, None, Some("bad root tree id".to_string())));
            continue;
        };
        let sub = walker.tree(&root)?;
        let claimed = crate::treewalk::entry_budget(snap);
        let bomb = (sub.entries > claimed).then(|| {
            format!(
                "its trees hold more than {claimed} entries, far more than the snapshot records ({} files, {} directories): shared subtrees repeated to exhaust memory (a tree bomb)",
                snap.summary.files, snap.summary.dirs
            )
        });
        walked.push((*sid, Some(sub), bomb));
    }
    Ok((walked, walker.memo.len() as u64, walker.problems))
}

/// Adds to `index` the packs of index files stored since it was loaded,
/// and of the marks there are now. Returns the packs it gained.
fn index_grew(repo: &Repository, index: &mut MasterIndex) -> Result<Vec<IndexPack>> {
    let known: HashSet<ObjectId> = index.files().iter().copied().collect();
    let mut packs = crate::prune::marked_index_packs(repo)?;
    for o in repo.backend().list(FileType::Index.prefix())? {
        let Some(id) = FileType::id_of(&o.name) else {
            continue;
        };
        if known.contains(&id) {
            continue;
        }
        // One that vanished or fails to read was superseded meanwhile, or is
        // reported by the next check; either way it adds nothing here.
        if let Ok(f) = crate::index::load_index_file(repo, &id) {
            packs.extend(f.packs);
        }
    }
    let mut seen = HashSet::new();
    packs.retain(|p| !index.has_pack(&p.id) && seen.insert(p.id));
    for p in &packs {
        index.add_pack(p);
    }
    Ok(packs)
}

/// The damage below one tree, as paths relative to it, and how many
/// entries the tree holds in all (saturating: a tree bomb's count is huge).
#[derive(Default)]
struct Subtree {
    affected: Vec<(String, std::path::PathBuf)>,
    /// Every damaged object below, also those past the affected-paths cap.
    objects: HashSet<String>,
    entries: u64,
}

/// Most affected paths kept per tree: enough to act on, bounded for trees
/// shared many times over.
const AFFECTED_PER_TREE: usize = 1000;

struct TreeChecker<'a> {
    repo: &'a Repository,
    index: &'a MasterIndex,
    damaged: &'a HashMap<BlobId, String>,
    /// Each tree is loaded and checked once, however often it is shared.
    memo: HashMap<BlobId, std::rc::Rc<Subtree>>,
    /// Trees on the current path from the root: meeting one again is a
    /// cycle, which no backup writes.
    in_progress: HashSet<BlobId>,
    /// What the walk found, kept apart until it is known which snapshots
    /// are still live.
    problems: Problems,
}

impl TreeChecker<'_> {
    fn tree(&mut self, tree: &BlobId) -> Result<std::rc::Rc<Subtree>> {
        if let Some(s) = self.memo.get(tree) {
            return Ok(s.clone());
        }
        if !self.in_progress.insert(*tree) {
            let obj = format!("tree {}", tree.to_hex());
            self.problems
                .add(obj.clone(), "the tree contains itself (a cycle)".into());
            return Ok(std::rc::Rc::new(Subtree {
                affected: vec![(obj.clone(), std::path::PathBuf::new())],
                objects: HashSet::from([obj]),
                entries: 0,
            }));
        }
        let result = self.load_and_check(tree);
        self.in_progress.remove(tree);
        let sub = std::rc::Rc::new(result?);
        self.memo.insert(*tree, sub.clone());
        Ok(sub)
    }

    fn load_and_check(&mut self, tree: &BlobId) -> Result<Subtree> {
        let mut out = Subtree::default();
        let affect = |out: &mut Subtree, obj: &str, p: std::path::PathBuf| {
            if !out.objects.contains(obj) {
                out.objects.insert(obj.to_string());
            }
            if out.affected.len() < AFFECTED_PER_TREE {
                out.affected.push((obj.to_string(), p));
            }
        };
        if let Some(obj) = self.damaged.get(tree) {
            affect(&mut out, obj, std::path::PathBuf::new());
            return Ok(out);
        }
        let nodes = match self.repo.load_tree(self.index, tree) {
            Ok(n) => n,
            Err(EngineError::Backend(b)) if b.is_destination_failure() => {
                return Err(EngineError::Backend(b))
            }
            Err(e) => {
                let obj = format!("tree {}", tree.to_hex());
                let msg = match e {
                    EngineError::MissingBlob(_) => "tree is not in any index".to_string(),
                    other => other.to_string(),
                };
                self.problems.add(obj.clone(), msg);
                affect(&mut out, &obj, std::path::PathBuf::new());
                return Ok(out);
            }
        };
        out.entries = nodes.len() as u64;
        for n in &nodes {
            let p = std::path::PathBuf::from(OsStr::from_bytes(&n.name));
            match n.kind() {
                NodeKind::Dir => {
                    if let Some(sub) = &n.subtree {
                        let s = self.tree(sub)?;
                        out.entries = out.entries.saturating_add(s.entries);
                        out.objects.extend(s.objects.iter().cloned());
                        for (obj, rel) in &s.affected {
                            affect(&mut out, obj, p.join(rel));
                        }
                    }
                }
                NodeKind::File => {
                    for b in &n.content {
                        if let Some(obj) = self.damaged.get(b) {
                            affect(&mut out, obj, p.clone());
                            break;
                        }
                        match self.index.get(b) {
                            Some(l) if l.blob_type == BlobType::Data => {}
                            _ => {
                                let obj = format!("blob {}", b.to_hex());
                                self.problems
                                    .add(obj.clone(), "referenced but not in any index".into());
                                affect(&mut out, &obj, p.clone());
                                break;
                            }
                        }
                    }
                }
                _ => {}
            }
        }
        Ok(out)
    }
}

fn describe(e: &EngineError) -> (String, String) {
    match e {
        EngineError::Corrupt { object, detail } => (object.clone(), detail.clone()),
        EngineError::Backend(b) => (b.name.clone(), b.message.clone()),
        other => ("repository".into(), other.to_string()),
    }
}
