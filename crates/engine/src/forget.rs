//! Forgetting snapshots, and bringing them back.
//!
//! Forgetting touches one object per snapshot and never any data: the
//! snapshot object moves from `snapshots/<id>` to `forgotten/<id>`, byte for
//! byte, so its ID and authentication stay valid. Every pack it referenced
//! stays until a prune decides no remaining snapshot needs it, so until then
//! [`unforget`] brings the snapshot back whole.
//!
//! Write order, so that a cut at any point loses nothing:
//! 1. put `forgotten/<id>` (an existing copy is fine: same bytes);
//! 2. delete `snapshots/<id>`.
//!
//! A cut between the two leaves the snapshot live and a spare copy set
//! aside; listing forgotten snapshots hides copies whose snapshot is still
//! live, and forgetting it again finishes the move.

use std::collections::HashSet;

use capsule_format::id::ObjectId;
use capsule_format::snapshot::Snapshot;
use capsule_format::FileType;

use crate::error::{EngineError, Result};
use crate::repo::Repository;
use crate::repo::{put_addressed, SnapshotList};

/// Where forgotten snapshots are set aside until a prune.
pub const FORGOTTEN_PREFIX: &str = FileType::Forgotten.prefix();

fn live_name(id: &ObjectId) -> String {
    FileType::Snapshot.name(id)
}

fn forgotten_name(id: &ObjectId) -> String {
    FileType::Forgotten.name(id)
}

/// Forgets one snapshot: sets its object aside, then removes it from the
/// snapshot list. Touches no data.
pub fn forget(repo: &Repository, id: &ObjectId) -> Result<()> {
    let backend = repo.backend();
    // Raw bytes: the object moves as it is, sealed, so its name (the hash
    // of its bytes) stays right.
    let sealed = backend.get(&live_name(id), None)?;
    if ObjectId::of(&sealed) != *id {
        return Err(EngineError::corrupt(
            live_name(id),
            "content does not match its name",
        ));
    }
    put_addressed(&**backend, &forgotten_name(id), &sealed)?;
    backend.delete(&live_name(id))?;
    Ok(())
}

/// Forgets several snapshots, a few at a time (each move is three
/// requests). Stops at the first failure; those moved stay moved.
pub fn forget_all(repo: &Repository, ids: &[ObjectId]) -> Result<()> {
    // Append-only credentials could add the forgotten copy but not remove
    // the live one: refuse before changing anything. (Nor is the decision
    // left for an admin's prune to carry out: whoever holds the client's
    // credentials, ransomware included, could then forget every snapshot.)
    if !ids.is_empty() {
        crate::session::require_delete(repo, "forget")?;
    }
    crate::flight::for_each_in_flight(ids, crate::flight::REQUESTS_IN_FLIGHT, |id| {
        forget(repo, id)
    })
}

/// Writes each `(old, changed)` pair's changed snapshot (`tag`, `rewrite`)
/// and then sets the old one aside in `forgotten/`; the new IDs, in the
/// same order. The changed one names the first original. Every new
/// snapshot is stored before any old one moves, so a cut leaves both (the
/// same data twice, never none); credentials that cannot delete are
/// refused before anything is written.
pub fn replace_all(repo: &Repository, changed: Vec<(ObjectId, Snapshot)>) -> Result<Vec<ObjectId>> {
    if changed.is_empty() {
        return Ok(Vec::new());
    }
    crate::session::require_delete(repo, "replace a snapshot")?;
    let mut new_ids = Vec::with_capacity(changed.len());
    for (old, mut s) in changed.iter().cloned() {
        s.original.get_or_insert_with(|| old.to_hex());
        new_ids.push(repo.save_snapshot(&s)?);
    }
    let old: Vec<ObjectId> = changed
        .iter()
        .zip(&new_ids)
        // Changed back to what it was: the same object, nothing to move.
        .filter(|((old, _), new)| old != *new)
        .map(|((old, _), _)| *old)
        .collect();
    forget_all(repo, &old)?;
    Ok(new_ids)
}

/// Snapshots forgotten and not yet pruned away, oldest first (those whose
/// move was cut short and which are still live are left out).
pub fn list_forgotten(repo: &Repository) -> Result<SnapshotList> {
    let (forgotten, bad) = repo.list_snapshot_objects(FORGOTTEN_PREFIX)?;
    let live: HashSet<String> = repo
        .backend()
        .list(FileType::Snapshot.prefix())?
        .into_iter()
        .map(|o| o.name)
        .collect();
    let forgotten = forgotten
        .into_iter()
        .filter(|(id, _)| !live.contains(&live_name(id)))
        .collect();
    Ok((forgotten, bad))
}

/// Brings back a forgotten snapshot, by full ID or unique prefix.
///
/// Order mirrors [`forget`]: the snapshot is live again before its set-aside
/// copy goes.
pub fn unforget(repo: &Repository, spec: &str) -> Result<(ObjectId, Snapshot)> {
    let (forgotten, _) = list_forgotten(repo)?;
    let spec_lc = spec.to_ascii_lowercase();
    let mut matches: Vec<_> = forgotten
        .into_iter()
        .filter(|(id, _)| id.to_hex().starts_with(&spec_lc))
        .collect();
    let (id, snap) = match matches.len() {
        0 => return Err(EngineError::SnapshotNotFound(spec.into())),
        1 => matches.remove(0),
        _ => return Err(EngineError::AmbiguousSnapshot(spec.into())),
    };
    let backend = repo.backend();
    let sealed = backend.get(&forgotten_name(&id), None)?;
    put_addressed(&**backend, &live_name(&id), &sealed)?;
    backend.delete(&forgotten_name(&id))?;
    Ok((id, snap))
}
