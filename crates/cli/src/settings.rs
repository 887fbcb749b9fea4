//! Resolving where the repository is and what the password is, from flags,
//! environment and, on a terminal, a prompt.

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, OnceLock};

use anyhow::{bail, Context, Result};
use capsule_access::{Access, CachePolicy, Stack};
use capsule_backend::RequestStats;
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
    layers: Vec<&'static str>,
}

static STATS: OnceLock<DestinationStats> = OnceLock::new();

/// How this command reaches the repository at `loc`: the flags (and the
/// profile behind them) turned into the library's [`Access`], the one way
/// in that the lab and the daemon use too.
pub fn access(g: &GlobalArgs, loc: &RepoLocation) -> Result<Access> {
    let mut connect = capsule_access::Connect::from_env(&loc.dest);
    if let Some(n) = g.connections {
        connect.net.concurrency = Some(n as usize);
    }
    connect.no_fsync = g.no_fsync;
    connect.trace = trace(g)?;
    let cache = if g.no_cache {
        CachePolicy::Off
    } else {
        match &g.cache_dir {
            Some(d) => CachePolicy::In(d.clone()),
            None => CachePolicy::user_default(),
        }
    };
    Ok(Access {
        dest: loc.dest.clone(),
        connect,
        cache,
    })
}

/// This process's request trace (`--trace-requests FILE`), created on
/// first use: every destination the command opens writes into it.
pub fn trace(g: &GlobalArgs) -> Result<Option<capsule_backend::TraceSink>> {
    static TRACE: OnceLock<capsule_backend::TraceSink> = OnceLock::new();
    let Some(path) = &g.trace_requests else {
        return Ok(None);
    };
    if let Some(t) = TRACE.get() {
        return Ok(Some(t.clone()));
    }
    let t = capsule_access::stack::trace_file(path)?;
    Ok(Some(TRACE.get_or_init(|| t).clone()))
}

/// Connects, and keeps the stack's counters for `--json` and the summary.
pub fn connect(access: &Access, create: bool) -> Result<Stack> {
    let stack = access.connect(create)?;
    let _ = STATS.set(DestinationStats {
        requests: stack.requests.clone(),
        retries: stack.retries.clone(),
        remote: stack.remote,
        layers: stack.layers.clone(),
    });
    Ok(stack)
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
        "layers": d.layers,
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

/// The password when flags, the environment or the profile give it without
/// asking, and the key derivation to open with: the daemon's held key when
/// it handed one over (no derivation at all), else one started from this
/// machine's hint. Called before connecting, so the derivation and the
/// connection overlap. A password that cannot be read here is asked for,
/// or reported, later by [`password`], as before.
pub fn start_key(
    g: &GlobalArgs,
    access: &Access,
) -> (Option<Vec<u8>>, Option<capsule_engine::EarlyKey>) {
    let held = crate::held_key::receive();
    let Ok(Some(pw)) = from_env_or_file(g) else {
        return (None, held);
    };
    let early = held.or_else(|| access.start_key(&pw));
    (Some(pw), early)
}

/// Reads a file capsule keeps for itself (cache or state directory), at
/// most `max` bytes, regular files only. Nothing there is `None`; anything
/// else that cannot be read is `None` with a warning, since such a file
/// only ever saves work.
pub fn read_own_file(path: &Path, max: u64) -> Option<Vec<u8>> {
    capsule_access::open::read_own_file(path, max)
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

/// Where the password of this process came from, for the hint after a
/// wrong one: the place to fix.
static PASSWORD_SOURCE: std::sync::OnceLock<String> = std::sync::OnceLock::new();

/// Where the password came from, once one was read.
pub fn password_source() -> Option<&'static str> {
    PASSWORD_SOURCE.get().map(String::as_str)
}

/// Names where `g`'s password comes from, in the words of the hint after a
/// wrong one.
fn note_source(g: &GlobalArgs) {
    let profile = g.profile.as_deref().unwrap_or("?");
    let p = g.profile_settings.as_ref();
    let source = if let Some(f) = &g.password_file {
        if std::env::var_os("CAPSULE_PASSWORD_FILE").is_some_and(|v| v == f.as_os_str()) {
            format!("CAPSULE_PASSWORD_FILE ({})", f.display())
        } else if p.and_then(|p| p.password_file.as_ref()) == Some(f) {
            format!("the password-file of profile {profile:?} ({})", f.display())
        } else {
            format!("--password-file {}", f.display())
        }
    } else if std::env::var("CAPSULE_PASSWORD").is_ok_and(|v| !v.is_empty()) {
        "CAPSULE_PASSWORD".to_string()
    } else if let Some(cmd) = p.and_then(|p| p.password_command.as_ref()) {
        format!("the password-command of profile {profile:?} ({cmd:?})")
    } else if p.is_some_and(|p| p.password.is_some()) {
        format!("the password of profile {profile:?} in the configuration file")
    } else {
        "the password typed".to_string()
    };
    let _ = PASSWORD_SOURCE.set(source);
}

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
    note_source(g);
    let found = from_flag_or_env(g)?;
    if found.is_some() {
        return Ok(found);
    }
    // Then the profile (its password file is already `g.password_file`
    // when neither a flag nor the environment gave one).
    crate::config_cmd::profile_password(g)
}

/// The password of profile `name` (filled into `g`) as a run of it would
/// read it without asking, read afresh: for the daemon, which holds the
/// key of each of its profiles.
pub fn profile_password_now(g: &GlobalArgs, name: &str) -> Result<Option<Vec<u8>>> {
    if let Some(pw) = from_flag_or_env(g)? {
        return Ok(Some(pw));
    }
    match &g.profile_settings {
        Some(p) => crate::config_cmd::run_profile_password(name, p)
            .map_err(|e| crate::config_cmd::PasswordCommandError(e).into()),
        None => Ok(None),
    }
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
