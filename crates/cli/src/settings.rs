//! Resolving where the repository is and what the password is, from flags,
//! environment and, on a terminal, a prompt.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use capsule_backend::{Backend, LocalBackend, SyncPolicy};

use crate::GlobalArgs;

/// The repository a command should use.
pub struct RepoLocation {
    /// Local directory.
    pub path: PathBuf,
    /// True when no repository was configured and the built-in default is used.
    pub is_default: bool,
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
            path: default_repo()?,
            is_default: true,
        });
    };
    if let Some(rest) = r
        .strip_prefix("file://")
        .or_else(|| r.strip_prefix("local:"))
    {
        return Ok(RepoLocation {
            path: PathBuf::from(rest),
            is_default: false,
        });
    }
    if let Some((scheme, _)) = r.split_once("://") {
        bail!(
            "repository URL scheme {scheme}:// is not supported by this build yet (only local paths); \
             mount the share and give its path, or use a local directory"
        );
    }
    Ok(RepoLocation {
        path: PathBuf::from(r),
        is_default: false,
    })
}

/// Opens the backend for a location. With `create`, makes the directory.
pub fn backend(g: &GlobalArgs, loc: &RepoLocation, create: bool) -> Result<Arc<dyn Backend>> {
    let sync = if g.no_fsync {
        SyncPolicy::NoSync
    } else {
        SyncPolicy::Sync
    };
    let b = if create {
        LocalBackend::create(&loc.path, sync)?
    } else {
        LocalBackend::open(&loc.path, sync).map_err(|e| match e.kind {
            capsule_backend::ErrorKind::NotFound => {
                anyhow::Error::new(capsule_engine::EngineError::NotARepository {
                    location: loc.path.display().to_string(),
                })
            }
            _ => e.into(),
        })?
    };
    Ok(Arc::new(b))
}

/// Statistics and directory of the cache in use.
pub type CacheHandle = (Arc<capsule_backend::CacheStats>, PathBuf);

/// Puts the local cache in front of an open repository's backend, unless
/// `--no-cache`. Returns the cache's statistics and directory.
pub fn with_cache(
    g: &GlobalArgs,
    repo: capsule_engine::Repository,
) -> Result<(capsule_engine::Repository, Option<CacheHandle>)> {
    if g.no_cache {
        return Ok((repo, None));
    }
    let dir = match &g.cache_dir {
        Some(d) => d.join(&repo.config().id),
        None => match dirs::cache_dir() {
            Some(d) => d.join("capsule").join(&repo.config().id),
            None => return Ok((repo, None)),
        },
    };
    // The cache only saves time: if it cannot be created, work without it.
    let cached = match capsule_backend::CachingBackend::new(repo.backend().clone(), &dir) {
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
        "remote_requests": s.remote_requests.load(Relaxed),
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

fn from_env_or_file(g: &GlobalArgs) -> Result<Option<Vec<u8>>> {
    if let Ok(p) = std::env::var("CAPSULE_PASSWORD") {
        if !p.is_empty() {
            return Ok(Some(p.into_bytes()));
        }
    }
    if let Some(f) = &g.password_file {
        let mut s =
            std::fs::read(f).with_context(|| format!("reading password file {}", f.display()))?;
        while matches!(s.last(), Some(b'\n' | b'\r')) {
            s.pop();
        }
        if s.is_empty() {
            bail!("password file {} is empty", f.display());
        }
        return Ok(Some(s));
    }
    Ok(None)
}
