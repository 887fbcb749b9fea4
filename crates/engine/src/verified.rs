//! Which slices of the packs `check --read-data-subset N/M` last verified.
//!
//! A weekly check of one slice in twelve reads every pack once a quarter,
//! but only if each week takes the slice verified longest ago. That choice
//! is kept in the repository (`verified/<id>`, one small sealed record per
//! slice), not on the machine that ran it: a machine replaced mid-cycle, or
//! a second machine taking turns with it, carries on where the rotation
//! stands instead of starting again at slice 1.

use capsule_crypto::Aad;
use capsule_format::snapshot::{from_json, to_json};
use capsule_format::{FileType, ObjectId};
use serde::{Deserialize, Serialize};

use crate::error::{EngineError, Result};
use crate::repo::{put_addressed, Repository};

/// One slice's last verification.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct SliceRecord {
    /// The slice, 1-based.
    pub slice: u32,
    /// Out of how many.
    pub of: u32,
    /// When the check that read it started, Unix seconds.
    pub time_unix: i64,
    /// The machine that ran it.
    pub hostname: String,
    /// Whether every pack of the slice was sound.
    pub ok: bool,
    /// Packs read.
    pub packs: u64,
}

/// Every slice record (the newest per slice and count), and the names of
/// records that could not be read (reported, never fatal: the worst a lost
/// record costs is a slice read again early).
pub fn load(repo: &Repository) -> Result<(Vec<SliceRecord>, Vec<String>)> {
    let mut records: Vec<(String, SliceRecord)> = Vec::new();
    let mut unreadable = Vec::new();
    for o in list(repo)? {
        let rec = repo
            .backend()
            .get(&o, None)
            .map_err(EngineError::from)
            .and_then(|b| {
                repo.key()
                    .open(Aad::Verified, &b)
                    .map_err(|e| EngineError::corrupt(&o, e))
            })
            .and_then(|p| from_json::<SliceRecord>(&p).map_err(|e| EngineError::corrupt(&o, e)));
        match rec {
            Ok(r) => records.push((o, r)),
            Err(_) => unreadable.push(o),
        }
    }
    records.sort_by(|a, b| {
        (a.1.of, a.1.slice, b.1.time_unix).cmp(&(b.1.of, b.1.slice, a.1.time_unix))
    });
    records.dedup_by(|b, a| a.1.of == b.1.of && a.1.slice == b.1.slice);
    Ok((records.into_iter().map(|r| r.1).collect(), unreadable))
}

/// The slice of `m` to verify next: one never verified (the lowest), else
/// the one verified longest ago.
pub fn next(records: &[SliceRecord], m: u32) -> u32 {
    let m = m.max(1);
    (1..=m)
        .min_by_key(|n| {
            records
                .iter()
                .filter(|r| r.of == m && r.slice == *n)
                .map(|r| r.time_unix)
                .max()
                .unwrap_or(i64::MIN)
        })
        .unwrap_or(1)
}

/// Stores `rec`, then removes the older records of its slice. A removal
/// refused (an object lock, a key without delete) is left for later: the
/// newest record counts either way.
pub fn record(repo: &Repository, rec: &SliceRecord) -> Result<()> {
    let old = list(repo)?;
    let sealed = repo.key().seal(Aad::Verified, &to_json(rec))?;
    let name = FileType::Verified.name(&ObjectId::of(&sealed));
    put_addressed(&**repo.backend(), &name, &sealed)?;
    for o in old.into_iter().filter(|o| *o != name) {
        let same = repo
            .backend()
            .get(&o, None)
            .ok()
            .and_then(|b| repo.key().open(Aad::Verified, &b).ok())
            .and_then(|p| from_json::<SliceRecord>(&p).ok())
            .is_some_and(|r| {
                r.of == rec.of && r.slice == rec.slice && r.time_unix <= rec.time_unix
            });
        if same {
            let _ = repo.backend().delete(&o);
        }
    }
    Ok(())
}

fn list(repo: &Repository) -> Result<Vec<String>> {
    match repo.backend().list(FileType::Verified.prefix()) {
        Ok(o) => Ok(o.into_iter().map(|o| o.name).collect()),
        Err(e) if e.kind == capsule_backend::ErrorKind::NotFound => Ok(Vec::new()),
        Err(e) => Err(e.into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(slice: u32, of: u32, t: i64) -> SliceRecord {
        SliceRecord {
            slice,
            of,
            time_unix: t,
            hostname: "h".into(),
            ok: true,
            packs: 1,
        }
    }

    #[test]
    fn the_next_slice_is_the_one_never_or_longest_ago_verified() {
        assert_eq!(next(&[], 12), 1);
        assert_eq!(next(&[rec(1, 12, 10)], 12), 2);
        let all: Vec<_> = (1..=4).map(|n| rec(n, 4, 100 + i64::from(n))).collect();
        assert_eq!(next(&all, 4), 1);
        let mut later = all.clone();
        later[0].time_unix = 200;
        assert_eq!(next(&later, 4), 2);
        // Records of another count say nothing of this one.
        assert_eq!(next(&all, 3), 1);
    }
}
