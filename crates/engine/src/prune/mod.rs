//! Prune: giving back the space of packs no snapshot needs, safely while
//! other clients back up, with no lock and no owner.
//!
//! Deletion takes two steps (docs/DESIGN.md, "Prune", has the argument),
//! in one prune when no other session is held, else across prunes:
//!
//! 1. **Mark.** A prune finds indexed packs none of whose blobs a snapshot
//!    references. It writes the index again without them (the new index
//!    file supersedes the ones it read), then lists the sessions that are
//!    held, and writes a *mark*, `prune-marks/<id>`, naming the packs (with
//!    their index entries) and those sessions. From then on no new backup
//!    can reuse their blobs: it does not find them in the index.
//! 2. **Sweep.** A later pass takes up each mark whose sessions have all
//!    ended (or were revoked: see [`crate::session`]). It lists the
//!    snapshots *after* the sessions, so a backup that reused a marked blob
//!    and committed is seen. A pack is deleted only when no snapshot uses
//!    it, no index lists it, and no other pending mark names it; otherwise
//!    it is put back into the index. Then the mark goes.
//!
//! Forgotten snapshots are removed by the prune that marks their data, so
//! `unforget` works until then.
//!
//! Every step is idempotent and ordered so that a cut anywhere leaves a
//! repository that `check` passes, where the next prune finishes the job.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::Instant;

use capsule_format::index::{IndexFile, IndexPack};
use capsule_format::FileType;
use capsule_format::ObjectId;
use serde::Serialize;

use crate::error::{EngineError, Result};
use crate::forget::FORGOTTEN_PREFIX;
use crate::index::{save_index_file, MasterIndex};

use crate::repo::Repository;
use crate::session::{list_sessions, LEASE_SECS};
use crate::timefmt::now_unix;

mod marks;

pub use marks::{add_marked_packs, marked_packs};
use marks::{load_marks, mark_entries, write_marks};
pub(crate) use marks::{marked_index_packs, reindex_marked_for_writer};

/// Where marks live.
pub const MARKS_PREFIX: &str = FileType::PruneMark.prefix();

/// Options of [`prune`].
#[derive(Debug, Clone)]
pub struct PruneOptions {
    /// Report what would happen; change nothing.
    pub dry_run: bool,
    /// A session not renewed for this many seconds may be revoked.
    pub lease_secs: i64,
    /// Repack partly used packs until unused bytes are at most this
    /// fraction of used ones.
    pub max_unused: f64,
    /// Refuse when this machine's clock and the destination's differ by
    /// more (seconds): session leases are judged by clocks.
    pub max_skew_secs: i64,
    /// When marks wait for sessions held elsewhere, wait for them to end
    /// (at most until their leases run out), then sweep.
    pub wait: bool,
    /// On a bucket with object lock, extend the retention of every
    /// current object now, not only of those with less than half a period
    /// left (after raising the period).
    pub extend_all: bool,
    /// Merge small packs every blob of which is used into full ones (see
    /// the mark phase). Off where space is short: writing them first needs
    /// room the merge gives back only after the sweep.
    pub merge_small: bool,
}

impl Default for PruneOptions {
    fn default() -> Self {
        PruneOptions {
            dry_run: false,
            lease_secs: LEASE_SECS,
            max_unused: 0.05,
            max_skew_secs: 300,
            wait: false,
            extend_all: false,
            merge_small: true,
        }
    }
}

/// What a prune did (or, in a dry run, would do).
#[derive(Debug, Clone, Default, Serialize)]
pub struct PruneReport {
    /// True for a dry run.
    pub dry_run: bool,
    /// Live snapshots whose data is kept.
    pub snapshots: u64,
    /// Forgotten snapshots removed for good.
    pub forgotten_removed: u64,
    /// Packs newly marked for deletion by this run.
    pub packs_marked: u64,
    /// Their bytes.
    pub bytes_marked: u64,
    /// Packs deleted (marked by an earlier run).
    pub packs_deleted: u64,
    /// Bytes given back.
    pub bytes_deleted: u64,
    /// Marked packs found in use again and put back into the index.
    pub packs_restored: u64,
    /// Marks still waiting for backups that were running when they were
    /// made.
    pub marks_waiting: u64,
    /// Packs in those marks.
    pub packs_waiting: u64,
    /// Sessions revoked because their lease ran out.
    pub sessions_revoked: Vec<String>,
    /// Partly used packs whose needed blobs were written to new packs (and
    /// which are then marked like unused ones).
    pub packs_repacked: u64,
    /// Of those, small packs every blob of which is used, merged into
    /// full ones (fewer requests to read them).
    pub packs_merged: u64,
    /// Bytes written into new packs by repacking.
    pub bytes_repack_written: u64,
    /// Unused bytes in the repacked packs, given back when they are deleted.
    pub bytes_repack_freed: u64,
    /// Packs kept that still hold some unused blobs (within `max_unused`).
    pub packs_partly_used: u64,
    /// Unused bytes inside partly used packs.
    pub bytes_unused_in_partly_used: u64,
    /// Bytes in indexed packs after this run.
    pub bytes_in_use_packs: u64,
    /// Temporaries that interrupted writes left (`.tmp-*`), older than the
    /// lease, removed (or, in a dry run, to be removed).
    pub temporaries_removed: u64,
    /// Their bytes.
    pub bytes_temporaries: u64,
    /// Requests this run made to the destination, when counted.
    pub requests: Option<u64>,
    /// Wall time.
    pub duration_secs: f64,
    /// Passes this run made: 1, or 2 when it swept what it had just marked
    /// (no session held anywhere), or more after waiting (`wait`).
    pub passes: u32,
    /// The sessions the waiting marks wait for, and when their leases end.
    pub waiting_for: Vec<WaitingFor>,
    /// Seconds spent waiting for them (`wait`).
    pub waited_secs: f64,
    /// Object lock's maintenance, on a bucket with object lock
    /// ([`crate::locked`]).
    pub object_lock: Option<crate::locked::LockReport>,
    /// Index files the store lists but could not give on any read, and
    /// that this prune went on without: every blob the snapshots use was
    /// found in the other files (so none of it was taken for unused).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub index_files_gone: Vec<String>,
}

/// A session a mark waits for.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct WaitingFor {
    /// Session ID.
    pub session: String,
    /// What holds it ("backup", "restore", "check", ...).
    pub kind: String,
    /// Where it runs.
    pub hostname: String,
    /// When it was last renewed (Unix seconds).
    pub heartbeat_unix: i64,
    /// When its lease runs out if it is not renewed: a prune then revokes
    /// it, and the prune after that sweeps.
    pub lease_ends_unix: i64,
}

impl PruneReport {
    /// Adds a later pass of the same run.
    fn absorb(&mut self, later: PruneReport) {
        self.forgotten_removed += later.forgotten_removed;
        self.packs_marked += later.packs_marked;
        self.bytes_marked += later.bytes_marked;
        self.packs_deleted += later.packs_deleted;
        self.bytes_deleted += later.bytes_deleted;
        self.packs_restored += later.packs_restored;
        self.sessions_revoked.extend(later.sessions_revoked);
        self.packs_repacked += later.packs_repacked;
        self.packs_merged += later.packs_merged;
        self.bytes_repack_written += later.bytes_repack_written;
        self.bytes_repack_freed += later.bytes_repack_freed;
        self.temporaries_removed += later.temporaries_removed;
        self.bytes_temporaries += later.bytes_temporaries;
        // What is left is what the last pass saw.
        self.snapshots = later.snapshots;
        self.marks_waiting = later.marks_waiting;
        self.packs_waiting = later.packs_waiting;
        self.packs_partly_used = later.packs_partly_used;
        self.bytes_unused_in_partly_used = later.bytes_unused_in_partly_used;
        self.bytes_in_use_packs = later.bytes_in_use_packs;
        self.waiting_for = later.waiting_for;
        self.passes += later.passes;
    }
}

/// Runs a prune: sweeps what earlier marks allow, then marks what is
/// unused now. When no session other than prunes' was held as its mark was
/// armed, no backup, restore or check anywhere can have seen the marked
/// packs, so a second pass sweeps them at once: one prune gives the space
/// back. Otherwise the marks wait for the sessions named in
/// [`PruneReport::waiting_for`]; with [`PruneOptions::wait`] the prune
/// waits for them (until their leases end at most) and sweeps.
pub fn prune(repo: &Arc<Repository>, opts: &PruneOptions) -> Result<PruneReport> {
    let started = Instant::now();
    if !opts.dry_run {
        crate::session::require_delete(repo, "prune")?;
    }
    let (mut report, mut sweep_now) = prune_pass(repo, opts)?;
    if opts.dry_run {
        report.object_lock = crate::locked::maintain(repo, true, opts.extend_all)?;
        return Ok(report);
    }
    // Another pass when the last one armed a mark no session can have
    // seen; when it swept, it may have marked again (a swept pack found in
    // use is put back, and what a backup re-indexed is marked anew), so a
    // few passes, bounded. After waiting, a pass that revoked a session
    // past its lease leaves its mark to the pass after it.
    let mut passes_left = if opts.wait { 5 } else { 2 };
    let (mut waited, mut revoked) = (false, false);
    loop {
        let again = sweep_now || (waited && revoked && report.marks_waiting > 0);
        if again && passes_left > 0 {
            passes_left -= 1;
            let (later, s) = prune_pass(repo, opts)?;
            revoked = !later.sessions_revoked.is_empty();
            report.absorb(later);
            sweep_now = s;
            continue;
        }
        if opts.wait && !waited && report.marks_waiting > 0 {
            let t = Instant::now();
            wait_for_sessions(repo, &report.waiting_for, opts.lease_secs)?;
            report.waited_secs = t.elapsed().as_secs_f64();
            waited = true;
            sweep_now = true;
            continue;
        }
        break;
    }
    report.object_lock = crate::locked::maintain(repo, false, opts.extend_all)?;
    report.duration_secs = started.elapsed().as_secs_f64();
    Ok(report)
}

/// How often `prune --wait` looks at the sessions it waits for: every
/// second for the first half minute (the backups beside a scheduled prune
/// end within seconds, and one listing a second is cheap), then every
/// five.
const WAIT_POLL_SECS: u64 = 5;
const WAIT_POLL_FAST: std::time::Duration = std::time::Duration::from_secs(30);

/// Waits until none of `sessions` is held any more, or each has run past
/// its lease (a prune may then revoke it). Bounded: at most the lease plus
/// a minute from the newest heartbeat, however the clocks look.
fn wait_for_sessions(repo: &Repository, sessions: &[WaitingFor], lease_secs: i64) -> Result<()> {
    let started = Instant::now();
    let bound = std::time::Duration::from_secs(lease_secs.max(0) as u64 + 60);
    let wanted: HashSet<&str> = sessions.iter().map(|w| w.session.as_str()).collect();
    loop {
        let now = now_unix();
        let held = list_sessions(repo)?;
        let live = held.iter().any(|(id, _, i)| {
            wanted.contains(id.as_str()) && now.saturating_sub(i.heartbeat_unix) <= lease_secs
        });
        if !live || started.elapsed() >= bound {
            return Ok(());
        }
        let poll = if started.elapsed() < WAIT_POLL_FAST {
            1
        } else {
            WAIT_POLL_SECS
        };
        std::thread::sleep(std::time::Duration::from_secs(poll));
    }
}

/// One pass of [`prune`]. Also returns whether the mark it armed (if any)
/// names no session, so that a pass right after may sweep it.
fn prune_pass(repo: &Arc<Repository>, opts: &PruneOptions) -> Result<(PruneReport, bool)> {
    let started = Instant::now();
    let mut report = PruneReport {
        dry_run: opts.dry_run,
        passes: 1,
        ..Default::default()
    };
    let mut sweep_now = false;
    let now = now_unix();
    let backend = repo.backend();

    // A prune holds a session too: its object's time, as the destination
    // records it, is the destination's clock.
    let own = if opts.dry_run {
        None
    } else {
        Some(crate::session::Session::start_kind(repo, "prune")?)
    };
    crate::pause::test_pause("prune-session");

    // Sessions first, snapshots after: a backup whose session is gone has
    // committed before the listing below, or never will.
    let sessions = sessions_listed(repo, own.as_ref())?;
    let destination_now = match &own {
        Some(own) => check_clock(repo, &own.id(), opts.max_skew_secs)?,
        None => None,
    };
    let held: HashMap<&str, &crate::session::SessionInfo> =
        sessions.iter().map(|(id, _, i)| (id.as_str(), i)).collect();
    if !opts.dry_run {
        // Claims of first backups that died (crate::rendezvous). They only
        // ever decide who uploads first, so one left or lost costs an
        // upload at most: not worth failing a prune over.
        let live: HashSet<String> = held.keys().map(|s| s.to_string()).collect();
        let _ = crate::rendezvous::sweep_claims(repo, &live);
    }
    // Trees a running backup reused may sit in marked packs, out of the
    // index: the walk reads them there.
    let mut marked_index = MasterIndex::default();
    let marks = load_marks(repo, &mut marked_index)?;
    let forgotten = list_prefix(repo, FORGOTTEN_PREFIX)?;

    let (snaps, bad) = repo.list_snapshots()?;
    if let Some(e) = bad.first() {
        return Err(EngineError::PruneRefused(format!(
            "{e}; a snapshot that cannot be read may use any pack (repair it with `capsule repair snapshots`, or forget it)"
        )));
    }
    report.snapshots = snaps.len() as u64;
    let (mut index, bad_index) = repo.load_index()?;
    // Prune looks up few blobs (those of marked and repacked packs); the
    // filters' 12 MB at ten million blobs are better left to the used set.
    index.drop_filters();
    // An index file the store lists but answers "not found" for on every
    // read (after the loader's fresh listings), that no file read
    // supersedes: a distributed store can list an object whose upload a
    // node's death cut, for months (the fleet year's days 70 to 188).
    // Prune deletes only packs the index it read names, so packs such a
    // file alone names are never touched; what it must not do is take a
    // blob for unused that only that file locates. So it goes on when
    // every blob the snapshots use is found without it, and refuses
    // otherwise. Any other damage refuses.
    let gone: Vec<&EngineError> = bad_index
        .iter()
        .filter(|e| crate::index::is_not_found(e))
        .collect();
    if let Some(e) = bad_index.iter().find(|e| !crate::index::is_not_found(e)) {
        return Err(EngineError::PruneRefused(format!(
            "{e}; run `capsule repair index` first"
        )));
    }
    let (used, missing) =
        crate::reach::used_blobs(repo, &index, &marked_index, &snaps, !gone.is_empty())?;
    if let Some(e) = gone.first() {
        if missing > 0 {
            return Err(EngineError::PruneRefused(format!(
                "{e}; {missing} blobs the snapshots use are in no other index file; run `capsule repair index` first"
            )));
        }
        report.index_files_gone = bad_index.iter().map(|e| e.to_string()).collect();
    }
    index_sound(&index)?;

    // ----- sweep -----
    // A mark is ready when none of its sessions is still held. Held ones
    // past their lease are revoked now; the mark waits for the next run.
    let mut ready = Vec::new();
    let mut pending_packs: HashSet<ObjectId> = HashSet::new();
    let mut revoke: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut arm: Vec<&String> = Vec::new();
    for (name, mark, packs) in &marks {
        let Some(mark_sessions) = &mark.sessions else {
            // A prune was cut between its mark and its index. Whatever
            // index is visible now, the sessions held now are the ones that
            // may have seen these packs: arm it with them, sweep it later.
            arm.push(name);
            report.marks_waiting += 1;
            report.packs_waiting += packs.len() as u64;
            pending_packs.extend(packs.iter().copied());
            continue;
        };
        let live: Vec<&String> = mark_sessions
            .iter()
            .filter(|s| held.contains_key(s.as_str()))
            .collect();
        if live.is_empty() {
            ready.push(name);
            continue;
        }
        report.marks_waiting += 1;
        report.packs_waiting += packs.len() as u64;
        pending_packs.extend(packs.iter().copied());
        for s in live {
            let info = held[s.as_str()];
            let w = waiting_for(s, info, opts.lease_secs);
            if !report.waiting_for.contains(&w) {
                report.waiting_for.push(w);
            }
            if info.lease_over(now, destination_now, opts.lease_secs) {
                if let Some((_, names, _)) = sessions.iter().find(|(id, _, _)| id == s) {
                    revoke.insert(s.clone(), names.clone());
                }
            }
        }
    }
    let mut restore: Vec<IndexPack> = Vec::new();
    // The index file that puts them back, superseded below by this prune's
    // own index: otherwise the next prune would read it beside that index,
    // in another order, and count duplicate blobs in other packs (a pack
    // marked here would even come back into use).
    let mut restored_file: Option<ObjectId> = None;
    let mut delete: Vec<(String, u64)> = Vec::new();
    let mut seen: HashSet<ObjectId> = HashSet::new();
    // One mark's entries at a time: all of them at once, after a prune
    // that forgot a tenth of ten million blobs, took 56 MB.
    for name in &ready {
        let packs = mark_entries(repo, name)?;
        for p in &packs.packs {
            if !seen.insert(p.id) || pending_packs.contains(&p.id) {
                continue;
            }
            // In use: a snapshot needs a blob that only this pack holds (a
            // repacked pack's blobs live on in their new packs).
            let in_use = p
                .entries
                .iter()
                .any(|e| used.contains(&e.id) && !index.contains(&e.id));
            if in_use || index.has_pack(&p.id) {
                if !index.has_pack(&p.id) {
                    restore.push(p.clone());
                }
                continue;
            }
            let t = p
                .entries
                .first()
                .map(|e| e.blob_type)
                .unwrap_or(capsule_format::BlobType::Data);
            delete.push((crate::repo::pack_name(&p.id, t), p.size));
        }
    }
    report.packs_restored = restore.len() as u64;
    report.packs_deleted = delete.len() as u64;
    report.bytes_deleted = delete.iter().map(|(_, s)| s).sum();
    report.sessions_revoked = revoke.keys().cloned().collect();

    if !opts.dry_run {
        if !restore.is_empty() {
            restored_file = Some(save_index_file(
                &**repo,
                &IndexFile {
                    supersedes: Vec::new(),
                    packs: restore.clone(),
                },
            )?);
            for p in &restore {
                index.add_pack(p);
            }
            crate::pause::test_pause("prune-restored");
        }
        if let Some((first, _)) = delete.first() {
            backend.delete(first)?;
            crate::pause::test_pause("prune-deleting");
        }
        crate::flight::for_each_in_flight(
            delete.get(1..).unwrap_or(&[]),
            crate::flight::REQUESTS_IN_FLIGHT,
            |(name, _)| Ok(backend.delete(name)?),
        )?;
        crate::pause::test_pause("prune-deleted");
        for name in &ready {
            backend.delete(name)?;
        }
        for names in revoke.values() {
            for n in names {
                backend.delete(n)?;
            }
        }
        let held_ids: Vec<String> = sessions
            .iter()
            .filter(|(_, _, i)| i.kind != "prune")
            .map(|(id, _, _)| id.clone())
            .collect();
        // A prune that died leaves its session; clear those past the lease.
        for (_, names, i) in &sessions {
            if i.kind == "prune" && i.lease_over(now, destination_now, opts.lease_secs) {
                for n in names {
                    backend.delete(n)?;
                }
            }
        }
        for name in arm {
            let packs = mark_entries(repo, name)?;
            write_marks(repo, now, Some(held_ids.clone()), &packs.packs)?;
            backend.delete(name)?;
        }
    }

    // Temporaries of writes cut short. One still being written was touched
    // lately, so only those older than the lease go, judged by the
    // destination's clock where it gives one.
    let clock = destination_now.unwrap_or_else(wall_clock);
    let stale: Vec<capsule_backend::ObjectInfo> = backend
        .list_temporaries()?
        .into_iter()
        .filter(|t| {
            t.modified
                .is_some_and(|m| clock.saturating_sub(m) > opts.lease_secs)
        })
        .collect();
    report.temporaries_removed = stale.len() as u64;
    report.bytes_temporaries = stale.iter().map(|t| t.size).sum();
    if !opts.dry_run {
        crate::flight::for_each_in_flight(&stale, crate::flight::REQUESTS_IN_FLIGHT, |t| {
            Ok(backend.delete(&t.name)?)
        })?;
    }

    // ----- mark -----
    // Each used blob counts in one pack: the index's first location for
    // it. Other copies (two backups that stored the same blob at once) are
    // unused space like any unused blob. One scan of the index gives each
    // pack's stored and needed bytes; entries are then gathered only for
    // the packs that leave, so memory follows what changes, not the
    // repository.
    let (stored, needed) = crate::reach::pack_bytes(&index, &used);
    index_sound(&index)?;
    let infos = index.packs();
    let mut keep: Vec<(usize, u64)> = Vec::new();
    let mut condemned_pos: Vec<usize> = Vec::new();
    for i in 0..infos.len() {
        if needed[i] == 0 {
            condemned_pos.push(i);
        } else {
            // Blob bytes only: a pack's header is overhead, not waste.
            keep.push((i, stored[i] - needed[i]));
        }
    }
    // Repack the emptiest partly used packs until what stays unused is at
    // most `max_unused` of what is used.
    let used_bytes: u64 = keep.iter().map(|(i, u)| infos[*i].size - u).sum();
    let mut unused_left: u64 = keep.iter().map(|(_, u)| u).sum();
    let limit = (used_bytes as f64 * opts.max_unused) as u64;
    // Some partly used packs are repacked whatever the limit, as restic
    // does: tree packs (trees are a small part of a repository, every
    // backup, restore and listing reads them, and a forgotten snapshot
    // whose files live on leaves its unique bytes there), and packs smaller
    // than the target size (an hourly backup's few changes make one; merged
    // they cost fewer requests to read, and their waste is the changes the
    // forgotten snapshots made).
    let target = u64::from(repo.config().pack_size);
    let always = |p: &crate::index::PackInfo| {
        p.size < target || p.blob_type == capsule_format::BlobType::Tree
    };
    let mut repack_set: HashSet<usize> = HashSet::new();
    for (k, (i, unneeded)) in keep.iter().enumerate() {
        if *unneeded > 0 && always(&infos[*i]) {
            unused_left -= unneeded;
            repack_set.insert(k);
        }
    }
    // Small packs every blob of which is still used are merged too, once
    // those of a kind together fill a pack: an hourly run's few changes
    // make a pack of a few hundred KiB, and a year of them left the newest
    // snapshot of a year-old repository in 1,088 packs against 144 in a
    // fresh one (the fleet year: 2,857 requests to restore it against 792,
    // 1.48x the time). Each is rewritten once into a full pack; what is
    // left over makes one small pack, rewritten with the next ones.
    for kind in [
        capsule_format::BlobType::Data,
        capsule_format::BlobType::Tree,
    ]
    .into_iter()
    .filter(|_| opts.merge_small)
    {
        let small: Vec<usize> = (0..keep.len())
            .filter(|&k| {
                let p = &infos[keep[k].0];
                keep[k].1 == 0 && p.blob_type == kind && p.size < target / 2
            })
            .collect();
        if small.iter().map(|&k| infos[keep[k].0].size).sum::<u64>() >= target {
            report.packs_merged += small.len() as u64;
            repack_set.extend(small);
        }
    }
    let mut order: Vec<usize> = (0..keep.len())
        .filter(|&k| keep[k].1 > 0 && !repack_set.contains(&k))
        .collect();
    order.sort_by(|&a, &b| {
        let ra = keep[a].1 as f64 / infos[keep[a].0].size.max(1) as f64;
        let rb = keep[b].1 as f64 / infos[keep[b].0].size.max(1) as f64;
        rb.total_cmp(&ra)
    });
    for k in order {
        if unused_left <= limit {
            break;
        }
        unused_left -= keep[k].1;
        repack_set.insert(k);
    }
    let mut repack_pos: Vec<usize> = Vec::new();
    for (k, (i, unneeded)) in keep.iter().enumerate() {
        if repack_set.contains(&k) {
            report.bytes_repack_freed += unneeded;
            repack_pos.push(*i);
        } else {
            if *unneeded > 0 {
                report.packs_partly_used += 1;
                report.bytes_unused_in_partly_used += unneeded;
            }
            report.bytes_in_use_packs += infos[*i].size;
        }
    }
    // The entries of the packs that leave: those repacked first, while the
    // set of used blobs is still needed; it goes before the entries of the
    // condemned packs are gathered, since both grow with the repository
    // (at ten million blobs, forgetting a tenth: 72 MB and 53 MB).
    let gone: HashSet<ObjectId> = condemned_pos
        .iter()
        .chain(&repack_pos)
        .map(|&i| infos[i].id)
        .collect();
    let packs_at = |pos: &[usize]| -> Result<Vec<IndexPack>> {
        let leaving: HashSet<u32> = pos.iter().map(|&i| i as u32).collect();
        let mut by_pack = crate::reach::entries_of(&index, &leaving);
        index_sound(&index)?;
        Ok(pos
            .iter()
            .map(|&i| IndexPack {
                id: infos[i].id,
                size: infos[i].size,
                entries: by_pack.remove(&(i as u32)).unwrap_or_default(),
            })
            .collect())
    };
    let repack = packs_at(&repack_pos)?;
    report.packs_repacked = repack.len() as u64;
    if !opts.dry_run && !repack.is_empty() {
        report.bytes_repack_written =
            crate::repack::repack_packs(repo, &index, &used, &gone, &repack)?;
        crate::pause::test_pause("prune-repacked");
    }
    drop(used);
    crate::mem::release_free();
    let mut condemned = packs_at(&condemned_pos)?;
    condemned.extend(repack);
    report.packs_marked = condemned.len() as u64;
    report.bytes_marked = condemned.iter().map(|p| p.size).sum();
    report.forgotten_removed = forgotten.len() as u64;

    if !opts.dry_run {
        if !condemned.is_empty() || restored_file.is_some() {
            // 1. an unarmed mark, so the packs are on record before they
            //    leave the index;
            // 2. the index without them (superseding the files read, and
            //    the one that put packs back);
            // 3. the armed mark, naming the sessions held now that the new
            //    index is visible: any backup that may have seen the packs
            //    in the old index is among them, or has committed already;
            // 4. the unarmed mark and the superseded index files go.
            let unarmed = if condemned.is_empty() {
                None
            } else {
                Some(write_marks(repo, now, None, &condemned)?)
            };
            crate::pause::test_pause("prune-unarmed");
            let superseded =
                crate::index::rewrite_without(&**repo, index.files(), restored_file, &gone)?;
            crate::pause::test_pause("prune-rewritten");
            if let Some(unarmed) = unarmed {
                let others: Vec<(String, crate::session::SessionInfo)> =
                    sessions_listed(repo, own.as_ref())?
                        .into_iter()
                        .filter(|(_, _, i)| i.kind != "prune")
                        .map(|(id, _, i)| (id, i))
                        .collect();
                // Nobody else holds a session: nothing can have seen these
                // packs in the index that listed them.
                sweep_now = others.is_empty();
                report.marks_waiting += u64::from(!sweep_now);
                report.packs_waiting += if sweep_now { 0 } else { condemned.len() as u64 };
                for (id, info) in &others {
                    let w = waiting_for(id, info, opts.lease_secs);
                    if !report.waiting_for.contains(&w) {
                        report.waiting_for.push(w);
                    }
                }
                let sessions_now = others.into_iter().map(|(id, _)| id).collect();
                write_marks(repo, now, Some(sessions_now), &condemned)?;
                crate::pause::test_pause("prune-armed");
                for name in &unarmed {
                    backend.delete(name)?;
                }
            }
            crate::flight::for_each_in_flight(
                &superseded,
                crate::flight::REQUESTS_IN_FLIGHT,
                |id| Ok(backend.delete(&FileType::Index.name(id))?),
            )?;
        }
        // Old index files a cut prune left: a file read supersedes each,
        // and this prune's files (if any) supersede them too.
        crate::flight::for_each_in_flight(
            index.leftover_files(),
            crate::flight::REQUESTS_IN_FLIGHT,
            |id| Ok(backend.delete(&FileType::Index.name(id))?),
        )?;
        crate::pause::test_pause("prune-marked");
        // Their data is marked now (or was never theirs alone).
        crate::flight::for_each_in_flight(&forgotten, crate::flight::REQUESTS_IN_FLIGHT, |name| {
            Ok(backend.delete(name)?)
        })?;
    }
    report.duration_secs = started.elapsed().as_secs_f64();
    Ok((report, sweep_now))
}

fn waiting_for(id: &str, info: &crate::session::SessionInfo, lease_secs: i64) -> WaitingFor {
    WaitingFor {
        session: id.to_string(),
        kind: info.kind.clone(),
        hostname: info.hostname.clone(),
        heartbeat_unix: info.heartbeat_unix,
        lease_ends_unix: info.heartbeat_unix.saturating_add(lease_secs),
    }
}

/// This machine's clock (not the test clock: it is compared with the
/// destination's).
fn wall_clock() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
}

/// How often, and how far apart, a prune lists the sessions again when the
/// listing lacks its own.
const LISTING_LAG_TRIES: u32 = 6;
const LISTING_LAG_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

/// The sessions held, from a listing that is known to be current: it must
/// show this prune's own session, stored before the listing. A store whose
/// listings lag behind its writes (an eventually consistent one, or a
/// distributed one while a node heals) could otherwise leave out the
/// session a backup stored a moment ago, and a mark naming no session is
/// swept at once: the backup's packs would go. Lists again for up to ten
/// seconds, then refuses, having deleted nothing.
fn sessions_listed(
    repo: &Repository,
    own: Option<&crate::session::Session>,
) -> Result<Vec<(String, Vec<String>, crate::session::SessionInfo)>> {
    let Some(own) = own else {
        return list_sessions(repo);
    };
    let own = own.id();
    for attempt in 1..=LISTING_LAG_TRIES {
        let sessions = list_sessions(repo)?;
        if sessions.iter().any(|(id, _, _)| *id == own) {
            return Ok(sessions);
        }
        if attempt < LISTING_LAG_TRIES {
            std::thread::sleep(LISTING_LAG_WAIT);
        }
    }
    Err(EngineError::PruneRefused(format!(
        "the destination's listing of sessions/ still lacks the session this prune stored {} s ago: its listings lag behind its writes, and a prune that trusted them could delete packs a running backup uses; nothing was deleted, prune again later",
        LISTING_LAG_TRIES * LISTING_LAG_WAIT.as_secs() as u32
    )))
}

/// Refuses to prune when the destination's clock, read from the time it
/// gave this prune's own session object, is far from this machine's: a
/// lease judged by a clock hours ahead would revoke live backups (kopia
/// refuses at five minutes too). Destinations that give no times pass.
/// Returns the destination's time, when it gave one.
fn check_clock(repo: &Repository, own_session: &str, max_skew: i64) -> Result<Option<i64>> {
    let objs = repo.backend().list(crate::session::SESSIONS_PREFIX)?;
    let Some(theirs) = objs
        .iter()
        .find(|o| {
            o.name
                .trim_start_matches(crate::session::SESSIONS_PREFIX)
                .starts_with(own_session)
        })
        .and_then(|o| o.modified)
    else {
        return Ok(None);
    };
    let skew = theirs - wall_clock();
    if skew.abs() > max_skew {
        return Err(EngineError::PruneRefused(format!(
            "this machine's clock is {} min {} the destination's; session leases are judged by clocks, so set the time right (NTP) and prune again",
            skew.abs() / 60,
            if skew > 0 { "behind" } else { "ahead of" }
        )));
    }
    Ok(Some(theirs))
}

fn list_prefix(repo: &Repository, prefix: &str) -> Result<Vec<String>> {
    match repo.backend().list(prefix) {
        Ok(o) => Ok(o.into_iter().map(|o| o.name).collect()),
        Err(e) if e.kind == capsule_backend::ErrorKind::NotFound => Ok(Vec::new()),
        Err(e) => Err(e.into()),
    }
}

/// Refuses to go on when a table of the local index went bad during the
/// run and could not be rebuilt: a blob missing from a lookup must never
/// make a pack look unused.
fn index_sound(index: &MasterIndex) -> Result<()> {
    match index.fault() {
        None => Ok(()),
        Some(f) => Err(EngineError::PruneRefused(format!(
            "the local index went bad during the run ({f}); nothing was deleted: run prune again (the table is rebuilt from the index files)"
        ))),
    }
}
