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
use capsule_format::index::IndexPack;
use capsule_format::pack::{decode_header, parse_trailer, PACK_TRAILER_LEN};
use capsule_format::tree::NodeKind;
use capsule_format::{BlobId, BlobType, FileType, ObjectId};

use crate::error::{EngineError, Result};
use crate::index::MasterIndex;
use crate::progress::Progress;
use crate::repo::Repository;

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

/// Which packs `check --read-data-subset` reads.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Subset {
    /// Every pack.
    All,
    /// Slice `n` of `m` (1-based): the packs whose ID, read as a number,
    /// leaves `n - 1` divided by `m`. Fixed, so `m` runs, one slice each,
    /// read every pack once.
    Slice(u32, u32),
    /// The slice of `m` verified longest ago (or never), as the
    /// repository's records say (`next/12`): what a schedule runs.
    Next(u32),
    /// About this percentage of the packs, picked at random each run.
    Percent(f64),
    /// Random packs until this many bytes.
    Bytes(u64),
}

impl Subset {
    /// Reads `N/M`, `P%` or a size (`500M`, `2G`).
    pub fn parse(s: &str) -> std::result::Result<Subset, String> {
        let t = s.trim();
        if let Some((n, m)) = t.split_once('/') {
            if n.trim() == "next" {
                return match m.trim().parse::<u32>() {
                    Ok(m) if m >= 1 => Ok(Subset::Next(m)),
                    _ => Err(format!(
                        "{s:?}: give the rotation as next/M, M >= 1 (say next/12)"
                    )),
                };
            }
            let (n, m) = (n.trim().parse::<u32>(), m.trim().parse::<u32>());
            return match (n, m) {
                (Ok(n), Ok(m)) if m >= 1 && (1..=m).contains(&n) => Ok(Subset::Slice(n, m)),
                _ => Err(format!(
                    "{s:?}: give a slice as N/M, 1 <= N <= M (say 1/12)"
                )),
            };
        }
        if let Some(p) = t.strip_suffix('%') {
            return match p.trim().parse::<f64>() {
                Ok(p) if p > 0.0 && p <= 100.0 => Ok(Subset::Percent(p)),
                _ => Err(format!("{s:?}: give a percentage above 0 and at most 100")),
            };
        }
        crate::quota::parse_size(t)
            .map(Subset::Bytes)
            .map_err(|e| format!("{e}; or give N/M or P%"))
    }

    /// As the user wrote it, for reports.
    pub fn describe(&self) -> String {
        match self {
            Subset::All => "all".into(),
            Subset::Slice(n, m) => format!("{n}/{m}"),
            Subset::Next(m) => format!("next/{m}"),
            Subset::Percent(p) => format!("{p}%"),
            Subset::Bytes(b) => format!("{b} bytes"),
        }
    }

    /// The packs of `packs` (index positions, with IDs and sizes) this
    /// subset reads.
    fn pick(&self, packs: Vec<(u32, ObjectId, u64)>) -> Vec<u32> {
        use std::hash::{BuildHasher, Hasher};
        let number = |id: &ObjectId| {
            let b = id.as_bytes();
            u32::from_be_bytes([b[0], b[1], b[2], b[3]])
        };
        // A different order every run: a hash keyed anew by each process.
        let key = std::collections::hash_map::RandomState::new();
        let random = |id: &ObjectId| {
            let mut h = key.build_hasher();
            h.write(id.as_bytes());
            h.finish()
        };
        match *self {
            Subset::All => packs.into_iter().map(|p| p.0).collect(),
            // Resolved to a slice before packs are picked.
            Subset::Next(_) => Vec::new(),
            Subset::Slice(n, m) => packs
                .into_iter()
                .filter(|(_, id, _)| number(id) % m == n - 1)
                .map(|p| p.0)
                .collect(),
            Subset::Percent(p) => {
                let mut v = packs;
                v.sort_by_key(|(_, id, _)| random(id));
                let keep = ((v.len() as f64 * p / 100.0).ceil() as usize).min(v.len());
                v.truncate(keep);
                v.into_iter().map(|p| p.0).collect()
            }
            Subset::Bytes(limit) => {
                let mut v = packs;
                v.sort_by_key(|(_, id, _)| random(id));
                let mut total = 0u64;
                let mut out = Vec::new();
                for (pos, _, size) in v {
                    if total >= limit {
                        break;
                    }
                    total += size;
                    out.push(pos);
                }
                out
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
        let (obj, detail) = describe(&e);
        problems.add(obj, detail);
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

/// Bytes of packs `check --read-data` holds at once: with 16 MiB packs,
/// four in flight, which keeps a disk or a link busy while the cores
/// verify, within the 128 MiB every command keeps to.
const READ_DATA_BUDGET: u64 = 64 << 20;

/// Where `check --read-data` spent its time, as a restore says it.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct ReadTiming {
    /// Wall seconds of reading and verifying.
    pub secs: f64,
    /// Bytes read a second over `secs`.
    pub bytes_per_sec: f64,
    /// Packs in flight at once.
    pub workers: u64,
    /// Seconds the workers waited for the destination, summed.
    pub wait_secs: f64,
    /// Seconds they spent hashing, decrypting, decompressing, summed.
    pub work_secs: f64,
    /// Packs read twice because their header or the index disagreed with
    /// them (reported below as damage, or found clean the second time).
    pub packs_reread: u64,
    /// What limited the read: `destination` when the workers mostly waited
    /// for bytes, `cpu` when the cores were busy verifying.
    pub bound: &'static str,
}

/// Reads and verifies the packs at index positions `packs`: a pipeline of
/// workers, each fetching a whole pack and verifying it, as many as the
/// destination takes in flight and the memory budget allows. A pack is
/// verified by its own header (one pass, no index scan per pack); one
/// whose header, blobs or index entries disagree is read again and
/// examined blob by blob against the index, which names what is lost.
fn read_data(
    repo: &Repository,
    index: &MasterIndex,
    packs: &[u32],
    blobs_read: &AtomicU64,
    progress: &Progress,
) -> (Vec<(String, String, Vec<BlobId>)>, ReadTiming) {
    let started = std::time::Instant::now();
    // What the index places in each pack, from one scan: how many blobs,
    // and the sum of their entries' fingerprints (20 bytes a pack). A
    // pack whose header lists the same is checked without a lookup per
    // blob, which at millions of tiny blobs cost more than the reading.
    let mut placed = vec![Placed::default(); index.packs().len()];
    for (id, loc) in index.iter() {
        if let Some(p) = placed.get_mut(loc.pack as usize) {
            p.add(&id, loc.blob_type, loc.offset, loc.length, loc.raw_length);
        }
    }
    let caps = repo.backend().capabilities();
    let cpus = std::thread::available_parallelism().map_or(2, |n| n.get());
    let pack_size = u64::from(repo.config().pack_size).max(1 << 20);
    // Locally one more than the cores (a read overlaps the others'
    // verifying); over a network the destination's concurrency.
    let width = crate::flight::reads_in_flight(&caps)
        .max(cpus + 1)
        .min((READ_DATA_BUDGET / pack_size).max(2) as usize);
    let (wait, work) = (AtomicU64::new(0), AtomicU64::new(0));
    let suspect: Vec<u32> = crate::flight::map_in_flight(packs, width, |&pos| {
        let pack = &index.packs()[pos as usize];
        let t0 = std::time::Instant::now();
        let fetched = repo.backend().get(&pack.name(), None);
        let t1 = std::time::Instant::now();
        let clean = fetched.is_ok_and(|mut bytes| {
            let n = bytes.len() as u64;
            let ok = verify_by_header(repo, index, pos, pack, &mut bytes, placed[pos as usize]);
            if ok {
                Progress::add(&progress.bytes_done, n);
                Progress::add(&progress.files_done, 1);
                blobs_read.fetch_add(u64::from(placed[pos as usize].count), Ordering::Relaxed);
            }
            ok
        });
        wait.fetch_add((t1 - t0).as_micros() as u64, Ordering::Relaxed);
        work.fetch_add(t1.elapsed().as_micros() as u64, Ordering::Relaxed);
        (!clean).then_some(pos)
    })
    .into_iter()
    .flatten()
    .collect();
    // The suspects, a few at a time, blob by blob against the index.
    let mut found = Vec::new();
    for batch in suspect.chunks(READ_DATA_BATCH) {
        let by_pack = blobs_in(index, &batch.iter().copied().collect());
        found.extend(
            crate::flight::map_in_flight(batch, width, |&pos| {
                let pack = index.packs()[pos as usize];
                let entries = by_pack.get(&pos).map(|v| v.as_slice()).unwrap_or(&[]);
                let r = read_pack(repo, &pack, entries, blobs_read, progress);
                Progress::add(&progress.files_done, 1);
                r
            })
            .into_iter()
            .flatten(),
        );
    }
    let secs = started.elapsed().as_secs_f64();
    let (wait_secs, work_secs) = (
        wait.into_inner() as f64 / 1e6,
        work.into_inner() as f64 / 1e6,
    );
    let timing = ReadTiming {
        secs,
        bytes_per_sec: Progress::get(&progress.bytes_done) as f64 / secs.max(1e-9),
        workers: width as u64,
        wait_secs,
        work_secs,
        packs_reread: suspect.len() as u64,
        bound: if wait_secs > work_secs {
            "destination"
        } else {
            "cpu"
        },
    };
    (found, timing)
}

/// Whether a fetched pack is wholly sound: its bytes hash to its name, its
/// header opens, every blob the header lists authenticates and matches
/// its ID, and the index's `placed` blobs in this pack are all among them
/// at the header's places. Decrypts in place (the bytes are spent after).
fn verify_by_header(
    repo: &Repository,
    index: &MasterIndex,
    pos: u32,
    pack: &crate::index::PackInfo,
    bytes: &mut [u8],
    placed: Placed,
) -> bool {
    if ObjectId::of(bytes) != pack.id {
        return false;
    }
    let Ok(entries) = header_entries(repo, bytes) else {
        return false;
    };
    let name = pack.name();
    let mut listed = Placed::default();
    for e in &entries {
        let (s, end) = (e.offset as usize, e.offset as usize + e.length as usize);
        let Some(env) = bytes.get_mut(s..end) else {
            return false;
        };
        if repo
            .decode_blob_in_place(&name, e.blob_type, &e.id, env, e.raw_length as usize)
            .is_err()
        {
            return false;
        }
        listed.add(&e.id, e.blob_type, e.offset, e.length, e.raw_length);
    }
    if listed == placed {
        return true;
    }
    // The header lists more (a blob the index places in another pack, as
    // two backups racing can leave) or other entries: each looked up.
    let mut matched = 0u32;
    for e in &entries {
        if index.get(&e.id).is_some_and(|l| {
            l.pack == pos
                && l.offset == e.offset
                && l.length == e.length
                && l.raw_length == e.raw_length
                && l.blob_type == e.blob_type
        }) {
            matched += 1;
        }
    }
    matched == placed.count
}

/// Index entries of one pack, summed: a count and an order-free
/// fingerprint of (ID, type, offset, lengths).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
struct Placed {
    count: u32,
    sum: u128,
}

impl Placed {
    fn add(&mut self, id: &BlobId, t: BlobType, offset: u32, length: u32, raw: u32) {
        let b = id.as_bytes();
        let word = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().unwrap_or([0; 8]));
        // The ID is a keyed hash already: its words are uniform. The
        // places are mixed in so a moved or resized entry changes the sum.
        let places = (u64::from(offset) << 32 | u64::from(length))
            ^ (u64::from(raw) << 1 | u64::from(t == BlobType::Tree)).rotate_left(17);
        let mix = |mut z: u64| {
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^ (z >> 31)
        };
        let lo = mix(word(0) ^ places);
        let hi = mix(word(8) ^ places.rotate_left(29)) ^ word(16);
        self.count += 1;
        self.sum = self.sum.wrapping_add(u128::from(hi) << 64 | u128::from(lo));
    }
}

/// Packs `check --read-data` reads between scans of the index for their
/// blobs: eight packs of tiny files hold about 450,000 blobs (25 MB of
/// entries).
const READ_DATA_BATCH: usize = 8;

/// The blobs whose first location is in one of `packs`, by pack: one scan
/// of the index, holding only those.
fn blobs_in(
    index: &MasterIndex,
    packs: &HashSet<u32>,
) -> HashMap<u32, Vec<(BlobId, crate::index::BlobLoc)>> {
    let mut by: HashMap<u32, Vec<(BlobId, crate::index::BlobLoc)>> = HashMap::new();
    for (id, loc) in index.iter() {
        if packs.contains(&loc.pack) {
            by.entry(loc.pack).or_default().push((id, loc));
        }
    }
    by
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
    header_entries(repo, bytes).map(|_| ())
}

/// The blobs a pack's own header lists.
fn header_entries(
    repo: &Repository,
    bytes: &[u8],
) -> std::result::Result<Vec<capsule_format::pack::PackEntry>, String> {
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
    decode_header(&plain).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn a_packs_fingerprint_ignores_order_and_sees_a_moved_or_changed_entry() {
        let ids: Vec<BlobId> = (0..50u8)
            .map(|i| blake3::hash(&[i]).to_hex().parse().unwrap())
            .collect();
        let sum = |entries: &[(usize, u32, u32)]| {
            let mut p = Placed::default();
            for &(i, off, len) in entries {
                p.add(&ids[i], BlobType::Data, off, len, len + 1);
            }
            p
        };
        let base: Vec<(usize, u32, u32)> = (0..50).map(|i| (i, i as u32 * 100, 90)).collect();
        let mut shuffled = base.clone();
        shuffled.reverse();
        assert_eq!(sum(&base), sum(&shuffled));
        let mut moved = base.clone();
        moved[7].1 += 1;
        assert_ne!(sum(&base), sum(&moved));
        let mut other = base.clone();
        other[7].0 = 49;
        assert_ne!(sum(&base), sum(&other));
        let mut fewer = base.clone();
        fewer.pop();
        assert_ne!(sum(&base), sum(&fewer));
        let mut p = sum(&base);
        p.add(&ids[3], BlobType::Tree, 300, 90, 91);
        assert_ne!(p, sum(&base));
    }

    #[test]
    fn slices_cover_every_pack_once_and_sizes_and_shares_parse() {
        let packs: Vec<(u32, ObjectId, u64)> = (0..500u32)
            .map(|i| (i, ObjectId::of(&i.to_le_bytes()), 1000))
            .collect();
        let mut seen = Vec::new();
        for n in 1..=12 {
            seen.extend(Subset::Slice(n, 12).pick(packs.clone()));
        }
        seen.sort();
        assert_eq!(seen, (0..500).collect::<Vec<_>>());
        assert_eq!(Subset::Percent(10.0).pick(packs.clone()).len(), 50);
        assert_eq!(Subset::Bytes(10_500).pick(packs.clone()).len(), 11);
        assert_eq!(Subset::parse("1/12"), Ok(Subset::Slice(1, 12)));
        assert_eq!(Subset::parse("5%"), Ok(Subset::Percent(5.0)));
        assert_eq!(Subset::parse("2G"), Ok(Subset::Bytes(2 << 30)));
        assert!(Subset::parse("13/12").is_err() && Subset::parse("0%").is_err());
    }
}
