//! A quota, and deleting the oldest snapshots to stay within it, as Time
//! Machine does when its disk fills.
//!
//! The quota is a small sealed object (`quota/<id>`); the newest one
//! counts, so it can be changed without rewriting the config. Thinning
//! plans from *unique sizes*: walking snapshots from those that must stay
//! (the newest of each host and paths, and any younger than the minimum
//! age) to the oldest, it records how many stored bytes each prefix of
//! that order uses. Removing the oldest `k` removable snapshots leaves the
//! bytes the others use, so the plan says exactly what each removal frees
//! before anything is removed, and a prune that repacks down to no unused
//! space frees that (give or take pack headers).

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;

use capsule_crypto::Aad;
use capsule_format::snapshot::{from_json, to_json, Snapshot};
use capsule_format::{BlobId, FileType, ObjectId};
use serde::{Deserialize, Serialize};

use crate::error::{EngineError, Result};
use crate::index::MasterIndex;
use crate::repo::put_addressed;
use crate::repo::Repository;
use crate::timefmt::now_unix;

/// A repository's quota.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
pub struct Quota {
    /// Most bytes the repository's packs may take.
    pub bytes: u64,
    /// Snapshots younger than this are never deleted to make room.
    pub min_age_secs: i64,
    /// When it was set (orders quota objects).
    pub set_unix: i64,
}

/// The quota in force, if any: the newest readable quota object. A quota
/// of 0 bytes means none (how one is cleared).
pub fn load(repo: &Repository) -> Result<Option<Quota>> {
    let listed = match repo.take_quota_listing() {
        Some(l) => Ok(l),
        None => repo.backend().list(FileType::Quota.prefix()),
    };
    let names = match listed {
        Ok(o) => o,
        Err(e) if e.kind == capsule_backend::ErrorKind::NotFound => Vec::new(),
        Err(e) => return Err(e.into()),
    };
    let mut best: Option<Quota> = None;
    for o in names {
        let b = repo.backend().get(&o.name, None)?;
        let q: Quota = repo
            .key()
            .open(Aad::Quota, &b)
            .map_err(|e| EngineError::corrupt(&o.name, e))
            .and_then(|p| from_json(&p).map_err(|e| EngineError::corrupt(&o.name, e)))?;
        if best.is_none_or(|b| q.set_unix > b.set_unix) {
            best = Some(q);
        }
    }
    Ok(best.filter(|q| q.bytes > 0))
}

/// Sets (or, with 0 bytes, clears) the quota; older quota objects go.
pub fn set(repo: &Repository, bytes: u64, min_age_secs: i64) -> Result<Quota> {
    // What was listed while opening is about to be out of date.
    let _ = repo.take_quota_listing();
    let q = Quota {
        bytes,
        min_age_secs,
        set_unix: now_unix(),
    };
    let old = match repo.backend().list(FileType::Quota.prefix()) {
        Ok(o) => o,
        Err(e) if e.kind == capsule_backend::ErrorKind::NotFound => Vec::new(),
        Err(e) => return Err(e.into()),
    };
    let sealed = repo.key().seal(Aad::Quota, &to_json(&q))?;
    let name = FileType::Quota.name(&ObjectId::of(&sealed));
    put_addressed(&**repo.backend(), &name, &sealed)?;
    for o in old.into_iter().filter(|o| o.name != name) {
        repo.backend().delete(&o.name)?;
    }
    Ok(q)
}

/// Bytes of packs on the destination now (marked ones included: they take
/// space until a prune deletes them).
pub fn stored_bytes(repo: &Repository) -> Result<u64> {
    let mut total = 0;
    for prefix in [FileType::DataPack.prefix(), FileType::TreePack.prefix()] {
        total += repo
            .backend()
            .list(prefix)?
            .iter()
            .map(|o| o.size)
            .sum::<u64>();
    }
    Ok(total)
}

/// One snapshot that thinning may remove.
#[derive(Debug, Clone, Serialize)]
pub struct Removable {
    /// Its ID (hex).
    pub id: String,
    /// When it was taken.
    pub time: String,
    /// Stored bytes freed by removing it and every older removable one.
    pub frees_with_older: u64,
}

/// What thinning to a target would do.
#[derive(Debug, Clone, Serialize)]
pub struct ThinPlan {
    /// Bytes of packs on the destination now.
    pub stored: u64,
    /// Bytes the snapshots use (stored blob bytes).
    pub used: u64,
    /// The target the repository is thinned to.
    pub target: u64,
    /// Snapshots to remove, oldest first.
    pub remove: Vec<Removable>,
    /// Bytes used after removing them.
    pub used_after: u64,
    /// False when even removing every removable snapshot leaves more than
    /// the target.
    pub fits: bool,
}

impl ThinPlan {
    /// Whether carrying the plan out changes anything: snapshots to remove,
    /// or more than `room` bytes stored of which at least 1% of `room` is
    /// space no snapshot uses (snapshots forgotten without a prune, packs a
    /// prune marked, unused parts of packs), which its prunes give back.
    /// The simulated year found the second case: after a daily
    /// `forget --prune`, whose packs are only marked, 31 of 8,760 backups
    /// ended up to 210 KB over a quota with nothing left to remove.
    pub fn needed(&self, room: u64) -> bool {
        !self.remove.is_empty()
            || (self.stored > room && self.stored.saturating_sub(self.used_after) >= room / 100)
    }
}

/// Plans the removal of the oldest snapshots until what the rest use
/// fits in `target` bytes. Never plans to remove the newest snapshot of a
/// host and paths, nor one younger than `min_age_secs`.
pub fn plan(repo: &Repository, target: u64, min_age_secs: i64) -> Result<ThinPlan> {
    let (snaps, bad) = repo.list_snapshots()?;
    if let Some(e) = bad.first() {
        return Err(EngineError::PruneRefused(format!(
            "{e}; repair or forget it before thinning"
        )));
    }
    let (index, _) = repo.load_index()?;
    let now = now_unix();
    // The newest of each host and paths stays.
    let mut newest: BTreeMap<(String, Vec<String>), usize> = BTreeMap::new();
    for (i, (_, s)) in snaps.iter().enumerate() {
        let mut p = s.paths.clone();
        p.sort();
        newest.insert((s.hostname.clone(), p), i); // sorted oldest first: the last wins
    }
    let staying: HashSet<usize> = newest.values().copied().collect();
    let removable: Vec<usize> = (0..snaps.len())
        .filter(|i| !staying.contains(i) && now - snaps[*i].1.time_unix >= min_age_secs)
        .collect();
    let removable_set: HashSet<usize> = removable.iter().copied().collect();
    let fixed: Vec<usize> = (0..snaps.len())
        .filter(|i| !removable_set.contains(i))
        .collect();

    // Walk the fixed snapshots, then the removable ones newest first,
    // recording the bytes used after each.
    let mut seen_trees: HashSet<BlobId> = HashSet::new();
    let mut seen_blobs: HashSet<BlobId> = HashSet::new();
    let mut used = 0u64;
    for &i in &fixed {
        used += walk(repo, &index, &snaps[i], &mut seen_trees, &mut seen_blobs)?;
    }
    let base = used;
    // used_with[j] = bytes used by the fixed ones and the newest j removable.
    let mut used_with = vec![base];
    for &i in removable.iter().rev() {
        used += walk(repo, &index, &snaps[i], &mut seen_trees, &mut seen_blobs)?;
        used_with.push(used);
    }
    let total_used = used;
    let m = removable.len();
    // Remove the oldest k: the newest m-k removable stay.
    let mut k = 0;
    while k < m && used_with[m - k] > target {
        k += 1;
    }
    let remove = removable[..k]
        .iter()
        .enumerate()
        .map(|(j, &i)| Removable {
            id: snaps[i].0.to_hex(),
            time: snaps[i].1.time.clone(),
            frees_with_older: total_used - used_with[m - j - 1],
        })
        .collect();
    Ok(ThinPlan {
        stored: stored_bytes(repo)?,
        used: total_used,
        target,
        remove,
        used_after: used_with[m - k],
        fits: used_with[m - k] <= target,
    })
}

/// Stored bytes of the blobs a snapshot uses that `seen_blobs` did not
/// hold yet (they are added).
fn walk(
    repo: &Repository,
    index: &MasterIndex,
    snap: &(ObjectId, Snapshot),
    seen_trees: &mut HashSet<BlobId>,
    seen_blobs: &mut HashSet<BlobId>,
) -> Result<u64> {
    let size = |b: &BlobId| index.get(b).map_or(0, |l| u64::from(l.length));
    let root: BlobId = snap
        .1
        .tree
        .parse()
        .map_err(|_| EngineError::corrupt(FileType::Snapshot.name(&snap.0), "bad tree id"))?;
    let mut added = 0;
    let mut todo = Vec::new();
    if seen_trees.insert(root) {
        todo.push(root);
        added += size(&root);
    }
    while let Some(t) = todo.pop() {
        for n in repo.load_tree(index, &t)? {
            for b in &n.content {
                if seen_blobs.insert(*b) {
                    added += size(b);
                }
            }
            if let Some(sub) = n.subtree {
                if seen_trees.insert(sub) {
                    added += size(&sub);
                    todo.push(sub);
                }
            }
        }
    }
    Ok(added)
}

/// What thinning did.
#[derive(Debug, Clone, Serialize)]
pub struct ThinReport {
    /// The plan carried out.
    pub plan: ThinPlan,
    /// The prunes that gave the space back (mark, then sweep).
    pub prunes: Vec<crate::prune::PruneReport>,
    /// Bytes of packs on the destination afterwards.
    pub stored_after: u64,
}

/// Carries out a plan: forgets its snapshots, then prunes with no unused
/// space allowed, so the space comes back now (when no other backup,
/// restore or check is running; otherwise at a later prune).
pub fn thin(repo: &Arc<Repository>, plan: ThinPlan) -> Result<ThinReport> {
    let ids = plan
        .remove
        .iter()
        .map(|r| {
            r.id.parse()
                .map_err(|_| EngineError::Invalid(format!("bad snapshot id {}", r.id)))
        })
        .collect::<Result<Vec<ObjectId>>>()?;
    crate::forget::forget_all(repo, &ids)?;
    let opts = crate::prune::PruneOptions {
        max_unused: 0.0,
        // Space is what is short: no rewriting of what is kept in full.
        merge_small: false,
        ..Default::default()
    };
    // One prune: it sweeps its own marks when no session is held (as at
    // the start of a backup on this repository's only machine); otherwise
    // they wait for the sessions it names.
    let pruned = crate::prune::prune(repo, &opts)?;
    Ok(ThinReport {
        plan,
        prunes: vec![pruned],
        stored_after: stored_bytes(repo)?,
    })
}

/// Reads a size: `500G`, `1.5TiB`, `200MB`, `123456` (bytes). K, M, G, T
/// are powers of 1024, as a disk's free space is shown.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: f64 = num
        .parse()
        .map_err(|_| format!("{s:?} is not a size: write it as 500G, 1.5T or 200M"))?;
    let mult: f64 = match unit
        .trim()
        .to_ascii_lowercase()
        .trim_end_matches('b')
        .trim_end_matches('i')
    {
        "" => 1.0,
        "k" => 1024.0,
        "m" => 1024.0 * 1024.0,
        "g" => 1024.0 * 1024.0 * 1024.0,
        "t" => 1024.0 * 1024.0 * 1024.0 * 1024.0,
        _ => return Err(format!("{s:?}: unknown unit {unit:?} (use K, M, G or T)")),
    };
    Ok((n * mult) as u64)
}
