//! Applying a profile to the command line's settings, and `capsule config`.

use std::sync::OnceLock;

use anyhow::Result;
use clap::Subcommand;

use crate::config::{self, Config, ConfigError, Profile};
use crate::output::Output;
use crate::{exit, GlobalArgs};

/// `capsule config` subcommands.
#[derive(Subcommand, Debug)]
pub enum ConfigCommand {
    /// Print the settings a command would use, with where each comes from
    /// (flag, environment, profile, default); secrets are masked.
    Show,
    /// Read and check the configuration file: exit 0 when it is usable,
    /// 2 with the file, line and key of the first mistake otherwise.
    Check,
}

/// A password (or credentials) command of a profile that failed or printed
/// nothing (exit code 10, as a password problem).
#[derive(Debug)]
pub struct PasswordCommandError(pub String);

impl std::fmt::Display for PasswordCommandError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}
impl std::error::Error for PasswordCommandError {}

/// Reads the configuration file named by `--config`/`CAPSULE_CONFIG` (or
/// the default one). `None` when none is named and the default is absent.
fn load(g: &GlobalArgs) -> Result<Option<Config>> {
    let Some((path, named)) = config::config_path(g.config.as_deref()) else {
        return Ok(None);
    };
    if !named && !path.exists() {
        return Ok(None);
    }
    Ok(Some(Config::load(&path)?))
}

/// With `--profile` (or `CAPSULE_PROFILE`): reads the profile and fills in
/// every setting that neither a flag nor the environment gave. Settings
/// that only the destination's connector reads from the environment
/// (credentials) are set in this process's environment, where not set.
pub fn apply_profile(g: &mut GlobalArgs, out: &Output) -> Result<()> {
    let Some(name) = g.profile.clone() else {
        return Ok(());
    };
    let cfg = load(g)?.ok_or_else(|| {
        ConfigError(format!(
            "--profile {name}: no configuration file ({}); create it, or name one with --config",
            config::config_path(None)
                .map(|(p, _)| p.display().to_string())
                .unwrap_or_else(|| "no configuration directory".into())
        ))
    })?;
    for w in &cfg.warnings {
        out.warn(w);
    }
    let p = cfg.profile(&name)?.clone();
    if let Some(why) = &cfg.insecure {
        out.warn(format!(
            "{}: {why}; another user could change what profile {name:?} backs up and where (`chmod go-w` it)",
            cfg.path.display()
        ));
    }
    if let Some(c) = &p.credentials {
        set_default_env(c, &name)?;
    }
    fill_from_profile(g, p);
    Ok(())
}

/// Fills in from profile `p` every setting of `g` that neither a flag nor
/// the environment gave (credentials aside: see [`apply_profile`]).
pub fn fill_from_profile(g: &mut GlobalArgs, p: Profile) {
    if g.repo.is_none() {
        g.repo = p.repository.clone();
    }
    if g.password_file.is_none() && std::env::var_os("CAPSULE_PASSWORD").is_none() {
        g.password_file = p.password_file.clone();
    }
    if g.connections.is_none() {
        g.connections = p.connections;
    }
    if g.cache_dir.is_none() {
        g.cache_dir = p.cache_dir.clone();
    }
    g.profile_settings = Some(p);
}

/// The destination credentials of a profile, as the connectors read them,
/// where the environment does not set them already.
fn set_default_env(c: &config::Credentials, profile: &str) -> Result<()> {
    let set = |k: &str, v: &std::ffi::OsStr| {
        if std::env::var_os(k).is_none() {
            // Single-threaded here: called before any command starts a
            // thread (main, right after parsing the command line).
            std::env::set_var(k, v);
        }
    };
    let password_given = [
        "CAPSULE_SMB_PASSWORD",
        "CAPSULE_SMB_PASSWORD_FILE",
        "CAPSULE_SFTP_PASSWORD",
        "CAPSULE_SFTP_PASSWORD_FILE",
    ]
    .iter()
    .any(|k| std::env::var_os(k).is_some());
    if !password_given {
        if let Some(f) = &c.password_file {
            set("CAPSULE_SMB_PASSWORD_FILE", f.as_os_str());
            set("CAPSULE_SFTP_PASSWORD_FILE", f.as_os_str());
        } else {
            let secret = match (&c.password_command, &c.password) {
                (Some(cmd), _) => Some(
                    config::run_secret_command(
                        cmd,
                        &format!("profile {profile:?}: credentials password-command"),
                    )
                    .map_err(PasswordCommandError)?,
                ),
                (None, Some(p)) => Some(p.clone().into_bytes()),
                (None, None) => None,
            };
            if let Some(s) = secret {
                use std::os::unix::ffi::OsStrExt;
                set("CAPSULE_SMB_PASSWORD", std::ffi::OsStr::from_bytes(&s));
                set("CAPSULE_SFTP_PASSWORD", std::ffi::OsStr::from_bytes(&s));
            }
        }
    }
    if let Some(k) = &c.sftp_key {
        set("CAPSULE_SFTP_KEY", k.as_os_str());
    }
    if let Some(k) = &c.known_hosts {
        set("CAPSULE_SFTP_KNOWN_HOSTS", k.as_os_str());
    }
    if let Some(p) = &c.aws_profile {
        set("AWS_PROFILE", std::ffi::OsStr::new(p));
    }
    Ok(())
}

/// The repository password from the profile's `password-command` or
/// inline `password`, when neither a flag nor the environment gave one.
/// The command runs once per process, whatever asks.
pub fn profile_password(g: &GlobalArgs) -> Result<Option<Vec<u8>>> {
    static ONCE: OnceLock<Result<Option<Vec<u8>>, String>> = OnceLock::new();
    let Some(p) = &g.profile_settings else {
        return Ok(None);
    };
    let name = g.profile.as_deref().unwrap_or("?");
    let r = ONCE.get_or_init(|| run_profile_password(name, p));
    r.clone().map_err(|e| PasswordCommandError(e).into())
}

/// The profile's `password-command` output or inline `password`, every
/// time it is called (the daemon asks once per profile, to hold its key).
pub fn run_profile_password(name: &str, p: &Profile) -> Result<Option<Vec<u8>>, String> {
    match (&p.password_command, &p.password) {
        (Some(cmd), _) => {
            config::run_secret_command(cmd, &format!("profile {name:?}: password-command"))
                .map(Some)
        }
        (None, Some(pw)) => Ok(Some(pw.clone().into_bytes())),
        (None, None) => Ok(None),
    }
}

/// `capsule config show | check`.
pub fn config(g: &GlobalArgs, out: &Output, c: ConfigCommand) -> Result<u8> {
    let cfg = load(g)?;
    match c {
        ConfigCommand::Check => {
            let Some(cfg) = cfg else {
                let path = config::config_path(None).map(|(p, _)| p.display().to_string());
                out.result(format!(
                    "no configuration file ({}): nothing to check",
                    path.unwrap_or_else(|| "no configuration directory".into())
                ));
                return Ok(exit::OK);
            };
            for w in &cfg.warnings {
                out.warn(w);
            }
            if let Some(name) = &g.profile {
                cfg.profile(name)?;
            }
            // Any profile of a file others may change that runs commands
            // or names secrets: the file is not fit to use.
            if let Some(e) = cfg
                .file
                .profiles
                .iter()
                .find_map(|(n, p)| cfg.refused(n, p))
            {
                return Err(e.into());
            }
            if let Some(why) = &cfg.insecure {
                out.warn(format!(
                    "{}: {why}; another user could change what it backs up and where",
                    cfg.path.display()
                ));
            }
            out.json(&serde_json::json!({
                "ok": true,
                "file": cfg.path.display().to_string(),
                "profiles": cfg.file.profiles.keys().collect::<Vec<_>>(),
            }));
            out.result(format!(
                "{}: ok, {} profile(s): {}",
                cfg.path.display(),
                cfg.file.profiles.len(),
                cfg.file
                    .profiles
                    .keys()
                    .cloned()
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
            Ok(exit::OK)
        }
        ConfigCommand::Show => {
            let profile = match (&cfg, &g.profile) {
                (Some(cfg), Some(name)) => {
                    for w in &cfg.warnings {
                        out.warn(w);
                    }
                    Some(cfg.profile(name)?.clone())
                }
                _ => None,
            };
            let rows = effective(g, profile.as_ref());
            if out.json {
                let v: serde_json::Map<String, serde_json::Value> = rows
                    .iter()
                    .map(|(k, v, from)| {
                        (
                            k.to_string(),
                            serde_json::json!({ "value": v, "from": from }),
                        )
                    })
                    .collect();
                out.json(&serde_json::json!({
                    "file": cfg.as_ref().map(|c| c.path.display().to_string()),
                    "profile": g.profile,
                    "settings": v,
                }));
            } else {
                if let Some(c) = &cfg {
                    out.result(format!(
                        "# {}{}",
                        c.path.display(),
                        g.profile
                            .as_ref()
                            .map(|p| format!(", profile {p:?}"))
                            .unwrap_or_default()
                    ));
                }
                for (k, v, from) in rows {
                    out.result(format!("{k:<18} {v:<40} ({from})"));
                }
            }
            Ok(exit::OK)
        }
    }
}

const MASK: &str = "********";

/// Every setting a command would use: (name, value with secrets masked,
/// where it comes from).
fn effective(g: &GlobalArgs, p: Option<&Profile>) -> Vec<(&'static str, String, &'static str)> {
    let env = |k: &str| std::env::var_os(k).filter(|v| !v.is_empty());
    let mut rows = Vec::new();
    // `g` holds the merged value (flag, else environment, else profile:
    // see `apply_profile`); where it came from is told by comparing.
    let origin = |merged: &Option<String>, var: &str, profile: Option<String>| -> &'static str {
        let from_env = env(var).map(|v| v.to_string_lossy().into_owned());
        match merged {
            None => "default",
            Some(m) if from_env.as_ref() == Some(m) => "environment",
            Some(m) if profile.as_ref() == Some(m) => "profile",
            Some(_) => "flag",
        }
    };
    let repo = g.repo.clone();
    rows.push((
        "repository",
        repo.clone()
            .unwrap_or_else(|| "(the default repository in your data directory)".into()),
        origin(&repo, "CAPSULE_REPO", p.and_then(|p| p.repository.clone())),
    ));
    let pw_file = g.password_file.as_ref().map(|f| f.display().to_string());
    let pw_file_from = origin(
        &pw_file,
        "CAPSULE_PASSWORD_FILE",
        p.and_then(|p| p.password_file.as_ref())
            .map(|f| f.display().to_string()),
    );
    let password = if let Some(f) = pw_file.filter(|_| pw_file_from != "profile") {
        (format!("file {f}"), pw_file_from)
    } else if env("CAPSULE_PASSWORD").is_some() {
        (MASK.to_string(), "environment")
    } else if let Some(p) = p {
        match (&p.password_file, &p.password_command, &p.password) {
            (Some(f), _, _) => (format!("file {}", f.display()), "profile"),
            (_, Some(c), _) => (format!("command {c:?}"), "profile"),
            (_, _, Some(_)) => (MASK.to_string(), "profile"),
            _ => ("(asked on a terminal)".to_string(), "default"),
        }
    } else {
        ("(asked on a terminal)".to_string(), "default")
    };
    rows.push(("password", password.0, password.1));
    let conn = g.connections.map(|n| n.to_string());
    rows.push((
        "connections",
        conn.clone().unwrap_or_else(|| "8".into()),
        origin(
            &conn,
            "CAPSULE_CONNECTIONS",
            p.and_then(|p| p.connections).map(|n| n.to_string()),
        ),
    ));
    let cache = g.cache_dir.as_ref().map(|d| d.display().to_string());
    rows.push((
        "cache-dir",
        cache
            .clone()
            .unwrap_or_else(|| "(per repository in your cache directory)".into()),
        origin(
            &cache,
            "CAPSULE_CACHE_DIR",
            p.and_then(|p| p.cache_dir.as_ref())
                .map(|d| d.display().to_string()),
        ),
    ));
    if let Some(p) = p {
        let list = |v: &[std::path::PathBuf]| {
            v.iter()
                .map(|x| x.display().to_string())
                .collect::<Vec<_>>()
                .join(" ")
        };
        if !p.sources.is_empty() {
            rows.push(("sources", list(&p.sources), "profile"));
        }
        if !p.excludes.is_empty() {
            rows.push(("excludes", p.excludes.join(" "), "profile"));
        }
        if let Some(c) = &p.credentials {
            let mut parts = Vec::new();
            if let Some(f) = &c.password_file {
                parts.push(format!("password-file {}", f.display()));
            }
            if let Some(cmd) = &c.password_command {
                parts.push(format!("password-command {cmd:?}"));
            }
            if c.password.is_some() {
                parts.push(format!("password {MASK}"));
            }
            if let Some(k) = &c.sftp_key {
                parts.push(format!("sftp-key {}", k.display()));
            }
            if let Some(k) = &c.known_hosts {
                parts.push(format!("known-hosts {}", k.display()));
            }
            if let Some(a) = &c.aws_profile {
                parts.push(format!("aws-profile {a}"));
            }
            rows.push(("credentials", parts.join(", "), "profile"));
        }
        if let Some(r) = &p.retention {
            rows.push(("retention", toml_inline(r), "profile"));
        }
        if let Some(q) = &p.quota {
            rows.push(("quota", q.clone(), "profile"));
        }
        if let Some(w) = &p.when_full {
            rows.push(("when-full", w.clone(), "profile"));
        }
        if let Some(s) = &p.schedule {
            rows.push(("schedule", toml_inline(s), "profile"));
        }
        if let Some(h) = &p.hooks {
            rows.push(("hooks", toml_inline(h), "profile"));
        }
    }
    rows
}

/// A table as one inline TOML line.
fn toml_inline<T: serde::Serialize>(v: &T) -> String {
    toml::Value::try_from(v)
        .map(|t| t.to_string())
        .unwrap_or_default()
}
