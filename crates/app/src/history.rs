//! History a stolen credential cannot erase: a repository made on an S3
//! bucket with object lock (`init --object-lock`), and the store's old
//! versions written back as current (`repair history --as-of`).

use capsule_access::Access;
use capsule_backend::{AsOf, History, LockMode};
use capsule_engine::repo::InitOptions;
use serde::Serialize;

use crate::error::{Error, Result, UsageError};
use capsule_access::Opened;

use crate::open::connect;
use crate::settings::Settings;

/// What `init --object-lock` asks for.
#[derive(Debug, Clone, Copy)]
pub struct LockRequest {
    /// Who may lift a retention early.
    pub mode: LockMode,
    /// How long every object is kept from being deleted or overwritten.
    pub days: u32,
}

/// Retention as `--object-lock` gives it (`30d`, `4w`, `1y`), in days: a
/// period under [`capsule_engine::locked::MIN_DAYS`] is refused.
pub fn parse_days(s: &str) -> std::result::Result<u32, String> {
    let t = s.trim();
    let secs = match t.strip_suffix('y') {
        Some(n) => n.parse::<u64>().ok().map(|y| y * 365 * 86_400),
        None => crate::config::parse_duration(t),
    }
    .ok_or_else(|| format!("{s:?} is not a period: give it as 30d, 4w or 1y"))?;
    let min = capsule_engine::locked::MIN_DAYS;
    if secs < u64::from(min) * 86_400 {
        return Err(format!(
            "a retention of {s} is shorter than the prune safety window: prune extends the retention of live data when less than half of it is left, and runs about daily, so anything under {min} day(s) would leave backups deletable between two runs; give at least {min}d (30d is usual)"
        ));
    }
    Ok(secs.div_ceil(86_400).min(u64::from(u32::MAX)) as u32)
}

fn wall_clock() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
}

/// Creates a repository whose every object the store keeps from deletion
/// and overwrite for `lock.days`: on a bucket with object lock (made so
/// when `init` creates the bucket), with the bucket's default retention
/// set, and checked on the first object written, so that a store which
/// ignores retention is an error here and never a repository that only
/// looks protected.
pub fn create_locked(
    s: &Settings,
    access: &Access,
    what: &str,
    opts: &InitOptions,
    lock: LockRequest,
    like: Option<&capsule_engine::Repository>,
) -> Result<Opened> {
    if !matches!(access.dest, capsule_net::Destination::S3(_)) {
        return Err(UsageError(format!(
            "--object-lock needs an S3 bucket (s3://…); {} is not one. For a NAS, see \"Append-only over SFTP\" in the user guide (book/src/history.md)",
            access.dest
        ))
        .into());
    }
    let mut access = access.clone();
    access.connect.net.create_locked = true;
    let stack = connect(&access, true)?;
    let location = stack.backend.location();
    let backend = stack.backend.clone();
    let history = backend
        .history()
        .ok_or_else(|| Error::Other(format!("{location}: this destination has no object lock")))?;
    let state = history.lock_state()?;
    if !state.lock_enabled {
        return Err(UsageError(format!(
            "the bucket of {location} was made without object lock, and a store cannot turn it on for a bucket that exists; give a bucket name that does not exist yet (init creates it with object lock), or create one with it (`mc mb --with-lock`, `aws s3api create-bucket --object-lock-enabled-for-bucket`)"
        ))
        .into());
    }
    if state.default_retention != Some((lock.mode, lock.days)) {
        history.set_default_retention(lock.mode, lock.days)?;
    }
    let pw = crate::password::new_password(s, what)?;
    let opened = match like {
        Some(like) => stack.init_like(&access, &pw, opts, like)?,
        None => stack.init(&access, &pw, opts)?,
    };
    verify(history, lock, &location)?;
    Ok(opened)
}

/// Checks that the repository's first object carries the retention asked
/// for.
fn verify(history: &dyn History, lock: LockRequest, location: &str) -> Result<()> {
    let want = wall_clock() + i64::from(lock.days) * 86_400;
    match history.retention("config", None)? {
        // An hour of slack for clocks apart.
        Some(r) if r.mode == lock.mode && r.until >= want - 3600 => Ok(()),
        got => Err(Error::Other(format!(
            "{location}: the store accepted the object-lock settings but wrote the repository's config with {} instead of {} until {}: this store does not enforce retention, and the repository is NOT protected against deletion. Use a store that supports S3 Object Lock (AWS S3, MinIO, Ceph RGW), or do without --object-lock",
            match got {
                Some(r) => format!("{:?} until {}", r.mode, capsule_engine::timefmt::rfc3339(r.until)),
                None => "no retention".into(),
            },
            lock.mode.s3_name(),
            capsule_engine::timefmt::rfc3339(want)
        ))),
    }
}

/// What `repair history --as-of` did.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Restored {
    /// The moment written back (Unix seconds).
    pub as_of: i64,
    /// Objects at that moment.
    pub objects: u64,
    /// Those whose current version was already the same one.
    pub unchanged: u64,
    /// Those written back as current (deleted or overwritten since).
    pub written: u64,
    /// Their bytes.
    pub bytes: u64,
    /// Objects that did not exist at that moment, left as they are (later
    /// backups, or what an attacker added; `check` tells which).
    pub newer: u64,
}

/// Writes the repository as it was at `at` back as its current state:
/// every object deleted or overwritten since is written again from its old
/// version. Objects made later stay. With `dry_run`, only counts.
pub fn restore_as_of(access: &Access, at: i64, dry_run: bool) -> Result<Restored> {
    let mut access = access.clone();
    access.connect.as_of = None;
    let stack = connect(&access, false)?;
    let view = AsOf::new(stack.backend.clone(), at as f64)?;
    let history = stack
        .backend
        .history()
        .ok_or_else(|| Error::Other("only a versioned S3 bucket keeps old versions".into()))?;
    let mut current = std::collections::HashMap::new();
    for v in history.versions("")? {
        if v.latest {
            current.insert(v.name.clone(), (v.version.clone(), v.delete_marker));
        }
    }
    let mut r = Restored {
        as_of: at,
        ..Restored::default()
    };
    let mut then = std::collections::HashSet::new();
    for (name, version) in view.objects() {
        r.objects += 1;
        then.insert(name.to_string());
        match current.get(name) {
            Some((v, false)) if v == version => r.unchanged += 1,
            _ => {
                let data = history.get_version(name, version, None)?;
                r.written += 1;
                r.bytes += data.len() as u64;
                if !dry_run {
                    history.overwrite(name, &data)?;
                }
            }
        }
    }
    r.newer = current
        .iter()
        .filter(|(n, (_, marker))| !marker && !then.contains(*n))
        .count() as u64;
    Ok(r)
}
