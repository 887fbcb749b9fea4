//! The repository password: where it comes from (a file, the environment,
//! the profile's command or inline value, a prompt on a terminal) and
//! reading it, at most once per process for a profile's command.

use std::io::IsTerminal;
use std::sync::OnceLock;

use capsule_access::Access;
use capsule_engine::EarlyKey;

use crate::config::{self, Profile};
use crate::error::{Error, MissingPassword, PasswordCommandError, PasswordFileError, Result};
use crate::settings::Settings;

/// Where the password of this process came from, for the hint after a
/// wrong one: the place to fix.
static PASSWORD_SOURCE: OnceLock<String> = OnceLock::new();

/// Where the password came from, once one was read.
pub fn password_source() -> Option<&'static str> {
    PASSWORD_SOURCE.get().map(String::as_str)
}

/// Names where `s`'s password comes from, in the words of the hint after a
/// wrong one.
fn note_source(s: &Settings) {
    let profile = s.profile_name().unwrap_or("?");
    let p = s.profile.as_ref();
    let source = if let Some(f) = &s.flags.password_file {
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

/// The password when the settings give it without asking, and the key
/// derivation to open with: the daemon's held key when it handed one over
/// (no derivation at all), else one started from this machine's hint.
/// Called before connecting, so the derivation and the connection
/// overlap. A password that cannot be read here is asked for, or
/// reported, later by [`password`].
pub fn start_key(s: &Settings, access: &Access) -> (Option<Vec<u8>>, Option<EarlyKey>) {
    let held = crate::held_key::receive();
    let Ok(Some(pw)) = without_asking(s) else {
        return (None, held);
    };
    let early = held.or_else(|| access.start_key(&pw));
    (Some(pw), early)
}

/// The password for an existing repository: from the settings, else asked
/// for on a terminal.
pub fn password(s: &Settings) -> Result<Vec<u8>> {
    if let Some(p) = without_asking(s)? {
        return Ok(p);
    }
    if std::io::stdin().is_terminal() {
        let p = rpassword::prompt_password("repository password: ")
            .map_err(|e| Error::io("reading the password from the terminal", e))?;
        return Ok(p.into_bytes());
    }
    Err(MissingPassword.into())
}

/// A new password (asked twice on a terminal).
pub fn new_password(s: &Settings, what: &str) -> Result<Vec<u8>> {
    if let Some(p) = without_asking(s)? {
        return Ok(p);
    }
    prompt_new(what)
}

/// Asks for a new password twice; only on a terminal.
pub fn prompt_new(what: &str) -> Result<Vec<u8>> {
    if !std::io::stdin().is_terminal() {
        return Err(MissingPassword.into());
    }
    let ask = |prompt: String| {
        rpassword::prompt_password(prompt)
            .map_err(|e| Error::io("reading the password from the terminal", e))
    };
    let a = ask(format!("{what}: "))?;
    let b = ask(format!("{what} again: "))?;
    if a != b {
        return Err(Error::Other("the passwords do not match".into()));
    }
    if a.is_empty() {
        return Err(Error::Other("the password must not be empty".into()));
    }
    Ok(a.into_bytes())
}

/// The password from `--password-file` / `CAPSULE_PASSWORD_FILE` or
/// `CAPSULE_PASSWORD`, else the profile's. A file named explicitly wins
/// over the variable, so a script's `--password-file` is never silently
/// overridden by an exported `CAPSULE_PASSWORD`.
fn without_asking(s: &Settings) -> Result<Option<Vec<u8>>> {
    note_source(s);
    let found = from_flag_or_env(s)?;
    if found.is_some() {
        return Ok(found);
    }
    // Then the profile (its password file is already the settings' when
    // neither a flag nor the environment gave one).
    profile_password(s)
}

/// The repository password from the profile's `password-command` or
/// inline `password`. The command runs once per process and profile,
/// whatever asks (a process may open several profiles: `capsule ui`).
fn profile_password(s: &Settings) -> Result<Option<Vec<u8>>> {
    type Read = std::result::Result<Option<Vec<u8>>, String>;
    static ONCE: std::sync::Mutex<std::collections::BTreeMap<String, Read>> =
        std::sync::Mutex::new(std::collections::BTreeMap::new());
    let Some(p) = &s.profile else {
        return Ok(None);
    };
    let name = s.profile_name().unwrap_or("?");
    let mut read = ONCE
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let r = read
        .entry(name.to_string())
        .or_insert_with(|| run_profile_password(name, p));
    r.clone().map_err(|e| PasswordCommandError(e).into())
}

/// The password of `s`'s profile as a run of it would read it without
/// asking, read afresh: for the daemon, which holds the key of each of its
/// profiles.
pub fn profile_password_now(s: &Settings) -> Result<Option<Vec<u8>>> {
    if let Some(pw) = from_flag_or_env(s)? {
        return Ok(Some(pw));
    }
    match &s.profile {
        Some(p) => run_profile_password(s.profile_name().unwrap_or("?"), p)
            .map_err(|e| PasswordCommandError(e).into()),
        None => Ok(None),
    }
}

/// The profile's `password-command` output or inline `password`, every
/// time it is called.
fn run_profile_password(name: &str, p: &Profile) -> std::result::Result<Option<Vec<u8>>, String> {
    match (&p.password_command, &p.password) {
        (Some(cmd), _) => {
            config::run_secret_command(cmd, &format!("profile {name:?}: password-command"))
                .map(Some)
        }
        (None, Some(pw)) => Ok(Some(pw.clone().into_bytes())),
        (None, None) => Ok(None),
    }
}

fn from_flag_or_env(s: &Settings) -> Result<Option<Vec<u8>>> {
    if let Some(f) = &s.flags.password_file {
        let mut b = std::fs::read(f).map_err(|e| {
            PasswordFileError(format!("cannot read password file {}: {e}", f.display()))
        })?;
        while matches!(b.last(), Some(b'\n' | b'\r')) {
            b.pop();
        }
        if b.is_empty() {
            return Err(
                PasswordFileError(format!("password file {} is empty", f.display())).into(),
            );
        }
        return Ok(Some(b));
    }
    if let Ok(p) = std::env::var("CAPSULE_PASSWORD") {
        if !p.is_empty() {
            return Ok(Some(p.into_bytes()));
        }
    }
    Ok(None)
}
