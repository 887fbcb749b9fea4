//! The other repository of `capsule copy` and of `init
//! --copy-chunker-params-from`: where it is, and its password.

use capsule_access::Opened;
use capsule_engine::repo::InitOptions;
use capsule_engine::Repository;
use capsule_net::Destination;

use crate::error::{Result, UsageError};
use crate::open::connect;
use crate::settings::{RepoLocation, Settings};

/// Which other repository: the destination of a copy (`TO`) or the source
/// of chunker parameters (`FROM`); names its password's variables.
#[derive(Debug, Clone, Copy)]
pub enum Other {
    /// `capsule copy --to`: `CAPSULE_TO_PASSWORD`, `CAPSULE_TO_PASSWORD_FILE`.
    To,
    /// `init --copy-chunker-params-from`: `CAPSULE_FROM_PASSWORD`,
    /// `CAPSULE_FROM_PASSWORD_FILE`.
    From,
}

impl Other {
    fn var(self) -> &'static str {
        match self {
            Other::To => "CAPSULE_TO_PASSWORD",
            Other::From => "CAPSULE_FROM_PASSWORD",
        }
    }
}

/// The other repository's password: its own variable or file, else this
/// repository's (one password for both is the common case).
pub fn password(s: &Settings, which: Other) -> Result<Vec<u8>> {
    let var = which.var();
    if let Some(p) = std::env::var_os(var).filter(|p| !p.is_empty()) {
        return Ok(p.into_encoded_bytes());
    }
    let file_var = format!("{var}_FILE");
    if let Some(f) = std::env::var_os(&file_var).filter(|p| !p.is_empty()) {
        let text = std::fs::read(&f).map_err(|e| {
            crate::error::Error::io(format!("reading {file_var} {}", f.to_string_lossy()), e)
        })?;
        let text = text.strip_suffix(b"\n").unwrap_or(&text).to_vec();
        return Ok(text.strip_suffix(b"\r").unwrap_or(&text).to_vec());
    }
    crate::password::password(s)
}

fn location(url: &str) -> Result<RepoLocation> {
    let url = url.strip_prefix("local:").unwrap_or(url);
    Ok(RepoLocation {
        dest: Destination::parse(url).map_err(|e| UsageError(format!("{url:?}: {e}")))?,
        is_default: false,
    })
}

/// Opens the repository at `url` with `password`, through the cache, read
/// as it is now (a copy writes to it; `--as-of` is for the source).
pub fn open(s: &Settings, url: &str, password: &[u8]) -> Result<Opened> {
    let mut access = s.access(&location(url)?)?;
    access.connect.as_of = None;
    let stack = connect(&access, false)?;
    Ok(stack.open(&access, password, None)?)
}

/// Creates the repository `access` reaches so that it cuts files and names
/// blobs as `like` does.
pub fn create_like(
    s: &Settings,
    access: &capsule_access::Access,
    opts: &InitOptions,
    like: &Repository,
    what: &str,
) -> Result<Opened> {
    let stack = connect(access, true)?;
    let pw = crate::password::new_password(s, what)?;
    Ok(stack.init_like(access, &pw, opts, like)?)
}
