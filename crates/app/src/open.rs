//! Opening the repository the settings name, through the library's one
//! way in ([`capsule_access`]), and what every command that reads it
//! shares: the destination's counters, a snapshot named on the command
//! line, a reading session.

use std::sync::atomic::AtomicU64;
use std::sync::{Arc, OnceLock};

use capsule_access::{Access, Opened, Stack};
use capsule_backend::RequestStats;
use capsule_engine::repo::InitOptions;
use capsule_engine::Repository;
use capsule_format::snapshot::Snapshot;
use capsule_format::ObjectId;

use crate::error::Result;
use crate::password;
use crate::settings::{RepoLocation, Settings};

/// Counters of the destination this process talks to (one per process).
struct DestinationStats {
    requests: Arc<RequestStats>,
    retries: Arc<AtomicU64>,
    remote: bool,
    layers: Vec<&'static str>,
    retry_for: std::time::Duration,
}

static STATS: OnceLock<DestinationStats> = OnceLock::new();

/// Connects, and keeps the stack's counters for `--json` and the summary.
pub fn connect(access: &Access, create: bool) -> Result<Stack> {
    let stack = access.connect(create)?;
    let _ = STATS.set(DestinationStats {
        requests: stack.requests.clone(),
        retries: stack.retries.clone(),
        remote: stack.remote,
        layers: stack.layers.clone(),
        retry_for: stack.retry_for,
    });
    Ok(stack)
}

/// The destination's request counters, once a backend is open.
pub fn destination_stats() -> Option<Arc<RequestStats>> {
    STATS.get().map(|d| d.requests.clone())
}

/// What this process asked of the destination, as JSON (`null` before any
/// backend was opened).
pub fn destination_json() -> serde_json::Value {
    use std::sync::atomic::Ordering::Relaxed;
    let Some(d) = STATS.get() else {
        return serde_json::Value::Null;
    };
    let s = &d.requests;
    serde_json::json!({
        "remote": d.remote,
        "layers": d.layers,
        "requests": s.requests(),
        "puts": s.puts.load(Relaxed),
        "gets": s.gets.load(Relaxed),
        "stats": s.stats.load(Relaxed),
        "lists": s.lists.load(Relaxed),
        "deletes": s.deletes.load(Relaxed),
        "errors": s.errors.load(Relaxed),
        "retries": d.retries.load(Relaxed),
        "retry_for_secs": d.retry_for.as_secs(),
        "bytes_up": s.bytes_up.load(Relaxed),
        "bytes_down": s.bytes_down.load(Relaxed),
        "wait_secs": s.busy_micros.load(Relaxed) as f64 / 1e6,
        "request_secs": s.wait_micros.load(Relaxed) as f64 / 1e6,
        "max_in_flight": s.max_in_flight.load(Relaxed),
    })
}

/// Cache statistics as JSON.
pub fn cache_json(s: &capsule_backend::CacheStats) -> serde_json::Value {
    use std::sync::atomic::Ordering::Relaxed;
    serde_json::json!({
        "hits": s.hits.load(Relaxed),
        "fetched": s.fetched.load(Relaxed),
        "fetched_bytes": s.fetched_bytes.load(Relaxed),
        "repaired": s.repaired.load(Relaxed),
        "dropped": s.dropped.load(Relaxed),
        "unstored": s.unstored.load(Relaxed),
        "unstored_error": s.unstored_error.lock().ok().and_then(|e| e.clone()),
    })
}

/// How to open: through the cache, or reading the destination itself
/// (`check` and `repair`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Through {
    /// The local cache of index files, snapshots and trees.
    Cache,
    /// The destination alone.
    Direct,
}

/// Connects and opens the repository `access` reaches, with the password. The key
/// derivation starts first, from the last run's hint (or is the daemon's,
/// already done), so that on a network destination it runs while the
/// connection is made and the key files are read. A password that must
/// be asked for is asked once connected. `warn` hears of damaged key
/// files passed over.
pub fn open_at(
    s: &Settings,
    access: &Access,
    through: Through,
    warn: &dyn Fn(String),
) -> Result<Opened> {
    let (pw, early) = password::start_key(s, access);
    let stack = connect(access, false)?;
    let pw = match pw {
        Some(pw) => pw,
        None => password::password(s)?,
    };
    let opened = match through {
        Through::Direct => stack.open_direct(access, &pw, early)?,
        Through::Cache => stack.open(access, &pw, early)?,
    };
    for w in &opened.warnings {
        warn(format!(
            "{w}; another key opened the repository (remove the damaged file with `capsule key remove`, or restore it from a copy)"
        ));
    }
    Ok(opened)
}

/// Opens the settings' repository through the cache.
pub fn open(s: &Settings, warn: &dyn Fn(String)) -> Result<(Repository, RepoLocation)> {
    let loc = s.location()?;
    let access = s.access(&loc)?;
    let opened = open_at(s, &access, Through::Cache, warn)?;
    Ok((opened.repo, loc))
}

/// Creates a repository where `access` reaches, with a new password
/// (`what` is the prompt on a terminal).
pub fn create(s: &Settings, access: &Access, what: &str, opts: &InitOptions) -> Result<Opened> {
    let stack = connect(access, true)?;
    let pw = password::new_password(s, what)?;
    Ok(stack.init(access, &pw, opts)?)
}

/// Resolves a snapshot argument. When some snapshots cannot be read,
/// `latest` may not be the newest one made: `warn` says so, and says which
/// one it means, rather than silently using an older one.
pub fn resolve_snapshot(
    repo: &Repository,
    spec: &str,
    warn: &dyn Fn(String),
) -> Result<(ObjectId, Snapshot)> {
    let r = repo.resolve_snapshot_noting(spec)?;
    let (id, snap, damaged) = (r.id, r.snapshot, r.damaged);
    if !r.future.is_empty() {
        let named: Vec<String> = r
            .future
            .iter()
            .map(|(id, t)| format!("{} of {t}", id.short()))
            .collect();
        warn(format!(
            "{spec:?} skips {} snapshot(s) dated in the future ({}): a clock was ahead when they were made; {spec:?} is {} of {}. Name one by ID to use it, or `capsule forget ID` it",
            named.len(),
            named.join(", "),
            id.short(),
            snap.time
        ));
    }
    // Named by ID or by a time later than now: it may be one made while a
    // clock ran ahead, which is worth knowing before it is used.
    let now = capsule_engine::timefmt::now_unix();
    if capsule_engine::timefmt::is_future(snap.time_unix, now) {
        warn(format!(
            "snapshot {} is dated {}, in the future of this machine's clock ({}): a clock was ahead when it was made, or this one is behind",
            id.short(),
            snap.time,
            capsule_engine::timefmt::rfc3339(now)
        ));
    }
    match &snap.repaired {
        Some(r) => warn(format!(
            "snapshot {} was repaired on {}: {} entries whose data was lost were dropped from it (the original, {}, is set aside: `capsule snapshots --forgotten`)",
            id.short(),
            r.time,
            r.dropped,
            r.from.get(..8).unwrap_or(&r.from)
        )),
        None if snap.tags.iter().any(|t| t == "repaired") => warn(format!(
            "snapshot {} was repaired: entries whose data was lost were dropped from it",
            id.short()
        )),
        None => {}
    }
    if spec == "latest" && !damaged.is_empty() {
        warn(format!(
            "{} snapshot(s) cannot be read ({}); one of them may be newer: \"latest\" is {} of {}, the newest readable one",
            damaged.len(),
            damaged.join("; "),
            id.short(),
            snap.time
        ));
    }
    Ok((id, snap))
}

/// A session of `kind` held while a command reads the repository, so that
/// a prune meanwhile keeps what it would delete until the session ends.
/// `None`, with `risk` told to `warn`, when none could be written (a
/// destination this user may only read).
pub fn reading_session(
    repo: &Arc<Repository>,
    kind: &str,
    risk: &str,
    warn: &dyn Fn(String),
) -> Option<capsule_engine::session::Session> {
    match capsule_engine::session::Session::start_kind(repo, kind) {
        Ok(s) => Some(s),
        Err(e) => {
            warn(format!("no session could be written ({e}); {risk}"));
            None
        }
    }
}
