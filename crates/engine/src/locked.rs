//! Object lock's maintenance, run by every prune on a bucket with object
//! lock: what is still in the repository keeps a retention date ahead of
//! it, and what prune retired is deleted for good once its date passes.
//!
//! The bucket's default retention (set by `init --object-lock`) gives every
//! new object version its date when it is written. A prune then:
//!
//! 1. **extends** every current object whose date may come within half the
//!    period (it was written, or last extended, more than half a period
//!    ago) to a full period from now, so live data never becomes
//!    deletable by credentials that may delete;
//! 2. **reclaims** retired versions: a plain delete in a versioned bucket
//!    only hides an object behind a delete marker (its locked version
//!    stays, and `--as-of` still reads it). For a name whose current
//!    version is a delete marker, each older version whose retention has
//!    passed is deleted for good, and the marker with the last of them. A
//!    version still locked is never asked to be deleted; a later prune
//!    takes it.
//!
//! Sessions are not extended: they are deleted within the hour, and their
//! versions go at the first prune after their retention.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};

use capsule_backend::{History, LockMode, ObjectVersion};
use serde::Serialize;

use crate::error::Result;
use crate::flight::{for_each_in_flight, REQUESTS_IN_FLIGHT};
use crate::repo::Repository;
use crate::session::SESSIONS_PREFIX;

/// The shortest retention `init --object-lock` accepts. Maintenance runs
/// with prune (daily in the daemon's default schedule) and extends what has
/// less than half its period left; a period under a day would leave live
/// data unlocked between two runs a day apart.
pub const MIN_DAYS: u32 = 1;

/// Retention requests in flight: each is a few hundred bytes, so the
/// round trip is all they cost, and a maintenance of 100,000 objects at 8 in
/// flight took three minutes at 2 ms.
const EXTEND_IN_FLIGHT: usize = 32;

/// What one maintenance run did (or, in a dry run, would do).
#[derive(Debug, Clone, Default, Serialize)]
pub struct LockReport {
    /// `governance` or `compliance`.
    pub mode: String,
    /// The bucket's default retention, days.
    pub days: u32,
    /// Current objects looked at.
    pub objects: u64,
    /// Those whose retention was extended to a full period from now.
    pub extended: u64,
    /// Retired versions (and delete markers) deleted for good.
    pub versions_deleted: u64,
    /// Their bytes.
    pub bytes_deleted: u64,
    /// Retired versions still locked, left for a later prune.
    pub versions_locked: u64,
    /// The earliest date one of those becomes deletable (Unix seconds).
    pub next_unlock: Option<i64>,
    /// Why nothing was done: the bucket's settings could not be read.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unknown: Option<String>,
    /// What in the bucket's settings would let history go before the
    /// lock period ([`settings_warnings`]).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
}

/// What in a locked bucket's settings would let history go before the
/// lock period, each naming what to change: versioning off, the default
/// retention removed, loosened to governance or shortened below what the
/// repository's own `config` is still locked for (a key with more rights
/// than the user guide's can do that), and lifecycle rules that expire
/// objects or older versions sooner. Nothing for a destination without
/// versioning, or a bucket that never had object lock.
pub fn settings_warnings(repo: &Repository) -> Vec<String> {
    let Some(h) = repo.backend().history() else {
        return Vec::new();
    };
    let Ok(state) = h.lock_state() else {
        // `maintain` says so (`unknown`).
        return Vec::new();
    };
    // The repository's own config was locked at init, and every prune
    // extends it: what the lock was meant to be.
    let config = h.retention("config", None).ok().flatten();
    if !state.lock_enabled && config.is_none() {
        return Vec::new();
    }
    let now = wall_clock();
    let mut w = Vec::new();
    if !state.versioned {
        w.push("versioning is not enabled on the bucket: an overwrite or delete no longer keeps the old version, and `--as-of` cannot bring it back; enable it again with the bucket's admin credentials".to_string());
    }
    match (state.default_retention, config) {
        (None, _) => w.push("the bucket has no default retention: new objects are written unlocked, and credentials that may delete can delete them; set it again with the bucket's admin credentials (`capsule init --object-lock` on a new bucket shows the setting)".to_string()),
        (Some((mode, days)), Some(c)) => {
            if c.mode == LockMode::Compliance && mode == LockMode::Governance {
                w.push(format!("the bucket's default retention was loosened to governance mode ({days} days), while the repository's config is locked in compliance mode: credentials with s3:BypassGovernanceRetention can now delete new objects; set it back to compliance with the bucket's admin credentials"));
            }
            let left = (c.until - now) / 86_400;
            if c.until > now + (i64::from(days) + 1) * 86_400 {
                w.push(format!("the bucket's default retention is {days} day(s), but the repository's config is locked for {left} more days: the retention was shortened, and new objects are kept only {days} day(s); set it back with the bucket's admin credentials"));
            }
        }
        (Some(_), None) => {}
    }
    // The lock meant: the default retention, or longer where the config
    // is still locked for longer (the default was shortened since).
    let config_days = config.map_or(0, |c| {
        ((c.until - now).max(0) as u64).div_ceil(86_400) as u32
    });
    let lock_days = state
        .default_retention
        .map_or(0, |(_, d)| d)
        .max(config_days);
    match h.lifecycle() {
        Ok(rules) => {
            for r in rules.iter().filter(|r| r.enabled) {
                let id = if r.id.is_empty() { "(no ID)" } else { r.id.as_str() };
                if let Some(n) = r.expire_noncurrent_days.filter(|n| lock_days == 0 || *n < lock_days) {
                    w.push(format!("lifecycle rule {id:?} deletes older versions {n} day(s) after they stop being current, sooner than the lock's {lock_days} days: what an attacker deletes or overwrites is gone for good after {n} day(s); remove the rule, or give it {lock_days} days or more"));
                }
                if let Some(n) = r.expire_current_days.filter(|n| lock_days == 0 || *n < lock_days) {
                    w.push(format!("lifecycle rule {id:?} expires current objects {n} day(s) after they are written, sooner than the lock's {lock_days} days: it would hide the repository's objects behind delete markers; remove the rule"));
                }
            }
        }
        Err(e) => w.push(format!(
            "could not read the bucket's lifecycle rules ({e}): whether one expires history sooner than the lock is not known"
        )),
    }
    w
}

fn wall_clock() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
}

/// Runs the maintenance when the repository's bucket has object lock with a
/// default retention; `None` otherwise (any other destination, or a bucket
/// without it). With `extend_all`, every current object is extended, not
/// only those written or extended more than half a period ago.
pub fn maintain(repo: &Repository, dry_run: bool, extend_all: bool) -> Result<Option<LockReport>> {
    let backend = repo.backend();
    let Some(history) = backend.history() else {
        return Ok(None);
    };
    // A prune's own work is done by now: when the bucket's settings cannot
    // be read (a key without s3:GetBucketVersioning, a store away), that
    // is said, not made the prune's failure.
    let state = match history.lock_state() {
        Ok(s) => s,
        Err(e) => {
            return Ok(Some(LockReport {
                unknown: Some(format!(
                    "could not read the bucket's object-lock settings ({e}); if it has object lock, the retention of what is in use was not extended by this run"
                )),
                ..LockReport::default()
            }))
        }
    };
    let Some((mode, days)) = state.default_retention.filter(|_| state.lock_enabled) else {
        return Ok(None);
    };
    let mut report = LockReport {
        mode: match mode {
            LockMode::Governance => "governance".into(),
            LockMode::Compliance => "compliance".into(),
        },
        days,
        ..LockReport::default()
    };
    let now = wall_clock();
    let period = i64::from(days) * 86_400;

    let current = backend.list("")?;
    report.objects = current.len() as u64;
    let due: Vec<&str> = current
        .iter()
        .filter(|o| !o.name.starts_with(SESSIONS_PREFIX))
        // Written (or last extended, which we cannot see without a request
        // per object) more than half a period ago.
        .filter(|o| extend_all || o.modified.is_none_or(|m| m + period / 2 <= now))
        .map(|o| o.name.as_str())
        .collect();
    report.extended = due.len() as u64;
    if !dry_run {
        // A second past the period: S3 keeps retention dates in
        // milliseconds and takes whole seconds here, so an object written
        // within this second would otherwise be asked to shorten.
        let until = now + period + 1;
        for_each_in_flight(&due, EXTEND_IN_FLIGHT, |name| {
            match history.set_retention(name, mode, until) {
                Ok(()) => Ok(()),
                // Already kept longer (a compliance date set by hand, or a
                // clock behind the store's): nothing to extend.
                Err(e) if e.message.contains("WORM protected") => Ok(()),
                Err(e) => Err(e.into()),
            }
        })?;
    }

    reclaim(history, now, dry_run, &mut report)?;
    report.warnings = settings_warnings(repo);
    Ok(Some(report))
}

/// Deletes for good the versions of deleted names whose retention passed.
fn reclaim(history: &dyn History, now: i64, dry_run: bool, report: &mut LockReport) -> Result<()> {
    let mut by_name: BTreeMap<String, Vec<ObjectVersion>> = BTreeMap::new();
    for v in history.versions("")? {
        by_name.entry(v.name.clone()).or_default().push(v);
    }
    // Names whose newest entry is a delete marker: what prune (or a
    // session's end) removed.
    let retired: Vec<(String, Vec<ObjectVersion>)> = by_name
        .into_iter()
        .filter(|(_, vs)| vs.last().is_some_and(|v| v.delete_marker))
        .collect();
    let deleted = AtomicU64::new(0);
    let bytes = AtomicU64::new(0);
    let locked = AtomicU64::new(0);
    let next_unlock = std::sync::Mutex::new(None::<i64>);
    for_each_in_flight(&retired, REQUESTS_IN_FLIGHT, |(name, versions)| {
        let mut still_locked = false;
        for v in versions.iter().filter(|v| !v.delete_marker) {
            match history.retention(name, Some(&v.version))? {
                Some(r) if r.until > now => {
                    still_locked = true;
                    locked.fetch_add(1, Ordering::Relaxed);
                    if let Ok(mut n) = next_unlock.lock() {
                        *n = Some(n.map_or(r.until, |t: i64| t.min(r.until)));
                    }
                }
                _ => {
                    if !dry_run {
                        history.delete_version(name, &v.version)?;
                    }
                    deleted.fetch_add(1, Ordering::Relaxed);
                    bytes.fetch_add(v.size, Ordering::Relaxed);
                }
            }
        }
        if !still_locked {
            // Nothing left behind the markers: they go too, so that the
            // listing of versions does not grow with every session.
            for m in versions.iter().filter(|v| v.delete_marker) {
                if !dry_run {
                    history.delete_version(name, &m.version)?;
                }
                deleted.fetch_add(1, Ordering::Relaxed);
            }
        }
        Ok(())
    })?;
    report.versions_deleted = deleted.into_inner();
    report.bytes_deleted = bytes.into_inner();
    report.versions_locked = locked.into_inner();
    report.next_unlock = next_unlock.into_inner().ok().flatten();
    Ok(())
}
