//! Resolving where the repository is and what the password is, from flags,
//! environment and, on a terminal, a prompt.

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, OnceLock};

use anyhow::{bail, Context, Result};
use capsule_backend::{
    LabBackend, LocalBackend, MeteredBackend, RequestStats, RetryBackend, RetryPolicy, SyncPolicy,
};
use capsule_net::Destination;

use crate::GlobalArgs;

/// The repository a command should use.
pub struct RepoLocation {
    /// Where it is.
    pub dest: Destination,
    /// True when no repository was configured and the built-in default is used.
    pub is_default: bool,
}

impl RepoLocation {
    /// The directory, for a local repository.
    pub fn local_path(&self) -> Option<&Path> {
        match &self.dest {
            Destination::Local(p) => Some(p),
            _ => None,
        }
    }

    /// For messages and JSON.
    pub fn display(&self) -> String {
        self.dest.to_string()
    }
}

/// The built-in default repository: `<data dir>/capsule/repo`.
pub fn default_repo() -> Result<PathBuf> {
    let base = dirs::data_dir()
        .or_else(|| dirs::home_dir().map(|h| h.join(".local/share")))
        .context(
            "cannot find a data directory for the default repository; set CAPSULE_REPO or --repo",
        )?;
    Ok(base.join("capsule").join("repo"))
}

/// Parses `--repo`.
pub fn location(g: &GlobalArgs) -> Result<RepoLocation> {
    let Some(r) = g.repo.as_deref().filter(|r| !r.is_empty()) else {
        return Ok(RepoLocation {
            dest: Destination::Local(default_repo()?),
            is_default: true,
        });
    };
    let r = r.strip_prefix("local:").unwrap_or(r);
    Ok(RepoLocation {
        dest: Destination::parse(r).map_err(|e| anyhow::Error::new(UsageError(e.to_string())))?,
        is_default: false,
    })
}

/// A mistake in how capsule was called (exit code 2).
#[derive(Debug)]
pub struct UsageError(pub String);

impl std::fmt::Display for UsageError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}
impl std::error::Error for UsageError {}

/// Counters of the destination this process talks to (one per process).
struct DestinationStats {
    requests: Arc<RequestStats>,
    retries: Arc<AtomicU64>,
    remote: bool,
}

static STATS: OnceLock<DestinationStats> = OnceLock::new();

/// Opens the backend for a location. With `create`, makes the directory
/// (and, on SMB and SFTP, the base directory on the server).
///
/// The stack, bottom up: the destination, request accounting (each attempt
/// on the wire counts), retries of transient failures. The cache goes on
/// top in [`with_cache`].
pub fn backend(g: &GlobalArgs, loc: &RepoLocation, create: bool) -> Result<Arc<dyn LabBackend>> {
    let raw: Arc<dyn LabBackend> = match &loc.dest {
        Destination::Local(path) => {
            let sync = if g.no_fsync {
                SyncPolicy::NoSync
            } else {
                SyncPolicy::Sync
            };
            if path.exists() && !path.is_dir() {
                return Err(anyhow::Error::new(
                    capsule_engine::EngineError::NotARepository {
                        location: format!("{} (a file, not a directory)", path.display()),
                    },
                ));
            }
            let b = if create {
                LocalBackend::create(path, sync)?
            } else {
                LocalBackend::open(path, sync).map_err(|e| match e.kind {
                    capsule_backend::ErrorKind::NotFound => {
                        anyhow::Error::new(capsule_engine::EngineError::NotARepository {
                            location: path.display().to_string(),
                        })
                    }
                    _ => e.into(),
                })?
            };
            Arc::new(b)
        }
        remote => {
            let mut opts = capsule_net::Options::from_env(remote);
            if let Some(n) = g.connections {
                opts.concurrency = Some(n as usize);
            }
            opts.create = create;
            capsule_net::connect(remote, &opts)?
        }
    };
    let raw = KillAtCall::wrap_if_asked(raw);
    let mut metered = MeteredBackend::new(raw);
    if let Some(path) = &g.trace_requests {
        let file = std::fs::File::create(path)
            .with_context(|| format!("cannot create the request trace {}", path.display()))?;
        metered = metered.with_trace(Box::new(file));
    }
    let requests = metered.stats();
    let retry = RetryBackend::new(Arc::new(metered), RetryPolicy::default());
    let _ = STATS.set(DestinationStats {
        requests,
        retries: retry.retries(),
        remote: loc.dest.is_remote(),
    });
    Ok(Arc::new(retry))
}

/// The reliability suite's crash points by call count: with
/// `CAPSULE_TEST_KILL_AT_CALL=N` this process kills itself with SIGKILL as
/// its Nth request reaches the destination, and with `N+` as the Nth
/// returns (the request landed, but nothing that follows it happened).
/// Requests are counted on the wire, as `destination.requests` counts them;
/// with the variable set, the count is printed to stderr at exit so a test
/// can measure an uncut run's. Only tests set it.
#[derive(Debug)]
struct KillAtCall {
    inner: Arc<dyn LabBackend>,
    at: u64,
    after: bool,
    calls: std::sync::atomic::AtomicU64,
}

/// The variable [`KillAtCall`] reads.
pub const KILL_AT_CALL: &str = "CAPSULE_TEST_KILL_AT_CALL";

impl KillAtCall {
    /// `raw` with the hook on top when the variable asks for it.
    fn wrap_if_asked(raw: Arc<dyn LabBackend>) -> Arc<dyn LabBackend> {
        let Ok(v) = std::env::var(KILL_AT_CALL) else {
            return raw;
        };
        let (n, after) = match v.strip_suffix('+') {
            Some(n) => (n, true),
            None => (v.as_str(), false),
        };
        Arc::new(KillAtCall {
            inner: raw,
            // Unparsable: count (for the exit line) and never kill.
            at: n.trim().parse().unwrap_or(0),
            after,
            calls: Default::default(),
        })
    }

    fn count<T>(&self, f: impl FnOnce() -> T) -> T {
        let n = self.calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
        if n == self.at && !self.after {
            sigkill_self();
        }
        let r = f();
        if n == self.at && self.after {
            sigkill_self();
        }
        r
    }
}

#[allow(unsafe_code)]
fn sigkill_self() -> ! {
    // SAFETY: kill(2) on our own pid with a constant signal has no memory
    // effects; SIGKILL cannot be caught, so nothing runs after it.
    unsafe {
        libc::kill(libc::getpid(), libc::SIGKILL);
    }
    std::process::abort()
}

impl capsule_backend::Layer for KillAtCall {
    fn inner(&self) -> &dyn LabBackend {
        &*self.inner
    }
    fn put(&self, name: &str, data: &[u8]) -> Result<(), capsule_backend::BackendError> {
        self.count(|| self.inner.put(name, data))
    }
    fn get(
        &self,
        name: &str,
        range: Option<std::ops::Range<u64>>,
    ) -> Result<Vec<u8>, capsule_backend::BackendError> {
        self.count(|| self.inner.get(name, range))
    }
    fn stat(
        &self,
        name: &str,
    ) -> Result<capsule_backend::ObjectInfo, capsule_backend::BackendError> {
        self.count(|| self.inner.stat(name))
    }
    fn list(
        &self,
        prefix: &str,
    ) -> Result<Vec<capsule_backend::ObjectInfo>, capsule_backend::BackendError> {
        self.count(|| self.inner.list(prefix))
    }
    fn delete(&self, name: &str) -> Result<(), capsule_backend::BackendError> {
        self.count(|| self.inner.delete(name))
    }
    fn put_stream(
        &self,
        name: &str,
        size: u64,
        data: &mut dyn std::io::Read,
    ) -> Result<(), capsule_backend::BackendError> {
        self.count(|| self.inner.put_stream(name, size, data))
    }
    fn put_owned(
        &self,
        name: &str,
        data: Vec<u8>,
    ) -> (Result<(), capsule_backend::BackendError>, Option<Vec<u8>>) {
        self.count(|| self.inner.put_owned(name, data))
    }
    fn put_file(
        &self,
        name: &str,
        file: &std::fs::File,
        size: u64,
    ) -> Result<(), capsule_backend::BackendError> {
        self.count(|| self.inner.put_file(name, file, size))
    }
    fn get_stream(
        &self,
        name: &str,
        range: Option<std::ops::Range<u64>>,
        out: &mut dyn std::io::Write,
    ) -> Result<u64, capsule_backend::BackendError> {
        self.count(|| self.inner.get_stream(name, range, out))
    }
}

/// The destination's request counters, once a backend is open.
pub fn destination_stats() -> Option<Arc<capsule_backend::RequestStats>> {
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
        "requests": s.requests(),
        "puts": s.puts.load(Relaxed),
        "gets": s.gets.load(Relaxed),
        "stats": s.stats.load(Relaxed),
        "lists": s.lists.load(Relaxed),
        "deletes": s.deletes.load(Relaxed),
        "errors": s.errors.load(Relaxed),
        "retries": d.retries.load(Relaxed),
        "bytes_up": s.bytes_up.load(Relaxed),
        "bytes_down": s.bytes_down.load(Relaxed),
        "wait_secs": s.busy_micros.load(Relaxed) as f64 / 1e6,
        "request_secs": s.wait_micros.load(Relaxed) as f64 / 1e6,
        "max_in_flight": s.max_in_flight.load(Relaxed),
    })
}

/// Where this machine keeps the salt and cost of the key that last opened
/// the repository at `loc` (a [`capsule_engine::KeyHint`]), unless
/// `--no-cache`. Keyed by the location, since the repository's ID is only
/// known once it is open.
fn key_hint_path(g: &GlobalArgs, loc: &RepoLocation) -> Option<PathBuf> {
    if g.no_cache {
        return None;
    }
    let base = match &g.cache_dir {
        Some(d) => d.clone(),
        None => dirs::cache_dir()?.join("capsule"),
    };
    let id = capsule_format::ObjectId::of(loc.display().as_bytes()).to_hex();
    Some(base.join("key-hints").join(&id[..32]))
}

/// The password, when flags or the environment give it without asking,
/// and the key derivation started with it from the last run's hint
/// (`None` without either). Called before connecting, so the derivation
/// and the connection overlap. A password that cannot be read here is
/// asked for, or reported, later by [`password`], as before.
pub fn start_key(
    g: &GlobalArgs,
    loc: &RepoLocation,
) -> (Option<Vec<u8>>, Option<capsule_engine::EarlyKey>) {
    let Ok(Some(pw)) = from_env_or_file(g) else {
        return (None, None);
    };
    let early = key_hint_path(g, loc)
        .and_then(|p| read_own_file(&p, KEY_HINT_MAX))
        .and_then(|text| capsule_engine::KeyHint::parse(&String::from_utf8_lossy(&text)))
        .filter(|hint| hint.costs_at_most(capsule_crypto::KdfParams::default()))
        .map(|hint| capsule_engine::EarlyKey::start(&pw, hint));
    (Some(pw), early)
}

/// The most a key hint file holds (one line of about 100 bytes).
const KEY_HINT_MAX: u64 = 512;

/// Reads a file capsule keeps for itself (cache or state directory), at
/// most `max` bytes, regular files only
/// ([`capsule_backend::ownfile::read_bounded`]). Nothing there is `None`;
/// anything else that cannot be read is `None` with a warning, since such a
/// file only ever saves work.
pub fn read_own_file(path: &std::path::Path, max: u64) -> Option<Vec<u8>> {
    match capsule_backend::ownfile::read_bounded(path, max) {
        Ok(b) => Some(b),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => {
            eprintln!(
                "warning: {}: ignored ({e}); capsule keeps this file only to save work, and will write it again",
                path.display()
            );
            None
        }
    }
}

/// Keeps the opened key's salt and cost for the next run's
/// [`start_key`]. Best effort: without it the next run derives the key
/// after reading the key file, as it would anyway.
pub fn remember_key(g: &GlobalArgs, loc: &RepoLocation, repo: &capsule_engine::Repository) {
    let Some(path) = key_hint_path(g, loc) else {
        return;
    };
    let text = repo.key_hint().to_text();
    if capsule_backend::ownfile::read_bounded(&path, KEY_HINT_MAX)
        .is_ok_and(|old| old == text.as_bytes())
    {
        return;
    }
    let Some(dir) = path.parent() else { return };
    let tmp = dir.join(format!(".tmp-{}", std::process::id()));
    let stored = std::fs::create_dir_all(dir)
        .and_then(|()| std::fs::write(&tmp, &text))
        .and_then(|()| std::fs::rename(&tmp, &path));
    if stored.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
}

/// The repository's cache directory, unless `--no-cache`.
pub fn cache_dir(g: &GlobalArgs, repo: &capsule_engine::Repository) -> Option<PathBuf> {
    if g.no_cache {
        return None;
    }
    match &g.cache_dir {
        Some(d) => Some(d.join(&repo.config().id)),
        None => dirs::cache_dir().map(|d| d.join("capsule").join(&repo.config().id)),
    }
}

/// Where `check` leaves the packs it found missing or damaged, for the
/// next backup on this machine to stop relying on (one pack name a line).
pub const DAMAGED_PACKS: &str = "damaged-packs";

/// The packs the last `check` found missing or damaged.
pub fn read_damaged_packs(dir: &Path) -> Vec<capsule_format::ObjectId> {
    // A line a pack (about 80 bytes): room for 200,000 of them.
    let Some(text) = read_own_file(&dir.join(DAMAGED_PACKS), 16 << 20) else {
        return Vec::new();
    };
    String::from_utf8_lossy(&text)
        .lines()
        .filter_map(|l| l.rsplit('/').next()?.parse().ok())
        .collect()
}

/// Records what `check` found (an empty list removes the record).
pub fn write_damaged_packs(dir: &Path, packs: &[String]) -> std::io::Result<()> {
    let p = dir.join(DAMAGED_PACKS);
    if packs.is_empty() {
        return match std::fs::remove_file(&p) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        };
    }
    std::fs::create_dir_all(dir)?;
    let tmp = dir.join(format!("{DAMAGED_PACKS}.tmp-{}", std::process::id()));
    std::fs::write(&tmp, packs.join("\n") + "\n")?;
    std::fs::rename(&tmp, &p)
}

/// Statistics and directory of the cache in use.
pub type CacheHandle = (Arc<capsule_backend::CacheStats>, PathBuf);

/// Puts the local cache in front of an open repository's backend (the
/// `backend` it was opened on), unless `--no-cache`. Returns the cache's
/// statistics and directory.
pub fn with_cache(
    g: &GlobalArgs,
    repo: capsule_engine::Repository,
    backend: Arc<dyn LabBackend>,
) -> Result<(capsule_engine::Repository, Option<CacheHandle>)> {
    let Some(dir) = cache_dir(g, &repo) else {
        return Ok((repo, None));
    };
    // The cache only saves time: if it cannot be created, work without it.
    let cached = match capsule_backend::CachingBackend::new(backend, &dir) {
        Ok(c) => c,
        Err(e) => {
            eprintln!(
                "warning: running without a local cache: cannot create {}: {e} (set CAPSULE_CACHE_DIR to a writable directory)",
                dir.display()
            );
            return Ok((repo, None));
        }
    };
    let stats = cached.stats();
    Ok((repo.with_backend(Arc::new(cached)), Some((stats, dir))))
}

/// Cache statistics as JSON.
pub fn cache_json(s: &capsule_backend::CacheStats) -> serde_json::Value {
    use std::sync::atomic::Ordering::Relaxed;
    serde_json::json!({
        "hits": s.hits.load(Relaxed),
        "fetched": s.fetched.load(Relaxed),
        "fetched_bytes": s.fetched_bytes.load(Relaxed),
        "repaired": s.repaired.load(Relaxed),
    })
}

/// Why no password could be had.
#[derive(Debug)]
pub struct MissingPassword;

impl std::fmt::Display for MissingPassword {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(
            "no password: set CAPSULE_PASSWORD or CAPSULE_PASSWORD_FILE, pass --password-file, or run on a terminal to be asked",
        )
    }
}
impl std::error::Error for MissingPassword {}

/// The password for an existing repository.
pub fn password(g: &GlobalArgs) -> Result<Vec<u8>> {
    if let Some(p) = from_env_or_file(g)? {
        return Ok(p);
    }
    if std::io::stdin().is_terminal() {
        let p = rpassword::prompt_password("repository password: ")?;
        return Ok(p.into_bytes());
    }
    Err(MissingPassword.into())
}

/// A new password (asked twice on a terminal).
pub fn new_password(g: &GlobalArgs, what: &str) -> Result<Vec<u8>> {
    if let Some(p) = from_env_or_file(g)? {
        return Ok(p);
    }
    prompt_new(what)
}

/// Asks for a new password twice; only on a terminal.
pub fn prompt_new(what: &str) -> Result<Vec<u8>> {
    if !std::io::stdin().is_terminal() {
        return Err(MissingPassword.into());
    }
    let a = rpassword::prompt_password(format!("{what}: "))?;
    let b = rpassword::prompt_password(format!("{what} again: "))?;
    if a != b {
        bail!("the passwords do not match");
    }
    if a.is_empty() {
        bail!("the password must not be empty");
    }
    Ok(a.into_bytes())
}

/// A password file that cannot be used (exit code 10, like a wrong
/// password: the fix is the same).
#[derive(Debug)]
pub struct PasswordFileError(pub String);

impl std::fmt::Display for PasswordFileError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}
impl std::error::Error for PasswordFileError {}

/// The password from `--password-file` / `CAPSULE_PASSWORD_FILE` or
/// `CAPSULE_PASSWORD`. A file named explicitly wins over the variable, so a
/// script's `--password-file` is never silently overridden by an exported
/// `CAPSULE_PASSWORD`.
fn from_env_or_file(g: &GlobalArgs) -> Result<Option<Vec<u8>>> {
    let found = from_flag_or_env(g)?;
    if found.is_some() {
        return Ok(found);
    }
    // Then the profile (its password file is already `g.password_file`
    // when neither a flag nor the environment gave one).
    crate::config_cmd::profile_password(g)
}

fn from_flag_or_env(g: &GlobalArgs) -> Result<Option<Vec<u8>>> {
    if let Some(f) = &g.password_file {
        let mut s = std::fs::read(f).map_err(|e| {
            PasswordFileError(format!("cannot read password file {}: {e}", f.display()))
        })?;
        while matches!(s.last(), Some(b'\n' | b'\r')) {
            s.pop();
        }
        if s.is_empty() {
            return Err(
                PasswordFileError(format!("password file {} is empty", f.display())).into(),
            );
        }
        return Ok(Some(s));
    }
    if let Ok(p) = std::env::var("CAPSULE_PASSWORD") {
        if !p.is_empty() {
            return Ok(Some(p.into_bytes()));
        }
    }
    Ok(None)
}
