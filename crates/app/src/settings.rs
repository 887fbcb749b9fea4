//! Settings: what the command line and the environment give
//! ([`Flags`]), merged with a profile of the configuration file into one
//! value ([`Settings`]) that says everything a job needs, built once,
//! before anything is connected.
//!
//! Precedence, for every setting: a flag, then the environment (clap
//! reads both into [`Flags`]), then the profile, then capsule's default.
//! Lists (excludes, tags) add up. Credentials that only a destination's
//! connector reads from the environment are set in this process's
//! environment where it does not set them already; a process that opens
//! another profile's destination too (`capsule ui`) hands that one its own
//! credentials instead ([`Settings::for_other_profile`]).

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use capsule_access::{Access, CachePolicy};
use capsule_net::Destination;

use crate::config::{self, Config, ConfigError, Profile};
use crate::error::{Error, PasswordCommandError, Result, UsageError};

/// What a command was given, by flag or environment variable, before any
/// profile fills in the rest.
#[derive(Debug, Clone, Default)]
pub struct Flags {
    /// `--repo` / `CAPSULE_REPO`.
    pub repo: Option<String>,
    /// `--password-file` / `CAPSULE_PASSWORD_FILE`.
    pub password_file: Option<PathBuf>,
    /// `--no-cache`.
    pub no_cache: bool,
    /// `--cache-dir` / `CAPSULE_CACHE_DIR`.
    pub cache_dir: Option<PathBuf>,
    /// `--no-fsync`.
    pub no_fsync: bool,
    /// `--connections` / `CAPSULE_CONNECTIONS`.
    pub connections: Option<u32>,
    /// `--retry-for` / `CAPSULE_RETRY_FOR`, seconds.
    pub retry_for: Option<u64>,
    /// `--trace-requests FILE`.
    pub trace_requests: Option<PathBuf>,
    /// `--as-of WHEN`, as given.
    pub as_of: Option<String>,
    /// `--config` / `CAPSULE_CONFIG`.
    pub config: Option<PathBuf>,
    /// `--profile` / `CAPSULE_PROFILE`.
    pub profile: Option<String>,
}

/// The repository a command should use.
#[derive(Debug, Clone)]
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

    /// Whether this is the built-in default and no repository exists
    /// there yet (a backup then creates it).
    pub fn is_new_default(&self) -> bool {
        self.is_default
            && self
                .local_path()
                .is_some_and(|p| !p.join("config").exists())
    }
}

/// Why the repository's location could not be had.
#[derive(Debug, Clone)]
enum LocationError {
    /// `--repo` is not a location (exit 2).
    Usage(String),
    /// No data directory for the default repository.
    NoDataDir,
    /// Nothing named, nothing at the default, and several profiles to
    /// choose from (the message names them).
    Choose(String),
}

/// Everything a job needs, resolved: the repository and how to reach it,
/// the password's source, the cache, and the profile behind them (its
/// sources, excludes, retention, quota, schedule).
#[derive(Debug, Clone)]
pub struct Settings {
    /// The merged values: a flag or the environment, else the profile.
    pub flags: Flags,
    /// The profile in use, if any.
    pub profile: Option<Profile>,
    /// Where the repository is (parsed once; an error is reported by the
    /// first command that needs it, so `status` runs with a bad `--repo`).
    location: std::result::Result<RepoLocation, LocationError>,
    /// The profile's credentials as environment variables, when they are
    /// not in this process's environment ([`Settings::for_other_profile`]).
    own_env: Option<Vec<(&'static str, std::ffi::OsString)>>,
}

/// What resolving read: the settings, and the configuration file's
/// warnings for the caller to show.
#[derive(Debug)]
pub struct Resolved {
    /// The settings.
    pub settings: Settings,
    /// Things to tell the user (an unknown key kept for a newer version, a
    /// file others may write).
    pub warnings: Vec<String>,
}

/// The built-in default repository: `<data dir>/capsule/repo`.
pub fn default_repo() -> Option<PathBuf> {
    let base = dirs::data_dir().or_else(|| dirs::home_dir().map(|h| h.join(".local/share")))?;
    Some(base.join("capsule").join("repo"))
}

/// Reads the configuration file named by `--config`/`CAPSULE_CONFIG` (or
/// the default one). `None` when none is named and the default is absent.
pub fn load_config(flag: Option<&Path>) -> Result<Option<Config>, ConfigError> {
    let Some((path, named)) = config::config_path(flag) else {
        return Ok(None);
    };
    if !named && !path.exists() {
        return Ok(None);
    }
    Ok(Some(Config::load(&path)?))
}

impl Settings {
    /// The settings of `flags` alone, with no profile read (for `config
    /// check`, which reads the file itself).
    pub fn without_profile(flags: Flags) -> Settings {
        let location = locate(flags.repo.as_deref());
        Settings {
            flags,
            profile: None,
            location,
            own_env: None,
        }
    }

    /// Resolves `flags`: with a profile (`--profile` or `CAPSULE_PROFILE`),
    /// reads it and fills in every setting neither a flag nor the
    /// environment gave, and sets its destination credentials in this
    /// process's environment where not set. Call it before any thread is
    /// started.
    pub fn resolve(flags: Flags) -> Result<Resolved> {
        let Some(name) = flags.profile.clone() else {
            return Ok(Resolved {
                settings: Settings::without_profile(flags),
                warnings: Vec::new(),
            });
        };
        let cfg = load_config(flags.config.as_deref())?.ok_or_else(|| {
            ConfigError(format!(
                "--profile {name}: no configuration file ({}); create it, or name one with --config",
                config::config_path(None)
                    .map(|(p, _)| p.display().to_string())
                    .unwrap_or_else(|| "no configuration directory".into())
            ))
        })?;
        let mut warnings = cfg.warnings.clone();
        let p = cfg.profile(&name)?.clone();
        if let Some(why) = &cfg.insecure {
            warnings.push(format!(
                "{}: {why}; another user could change what profile {name:?} backs up and where (`chmod go-w` it)",
                cfg.path.display()
            ));
        }
        if let Some(c) = &p.credentials {
            set_default_env(c, &name)?;
        }
        Ok(Resolved {
            settings: Settings::with_profile(flags, p),
            warnings,
        })
    }

    /// As [`Settings::resolve`], for a command that works on one
    /// repository. With neither a repository nor a profile named (flag or
    /// environment), the configuration chooses: its `default-profile`, or
    /// its only profile when there is no repository at the built-in
    /// default. The second is said once (a note in the state directory
    /// remembers it), so a user who wrote one profile learns why a plain
    /// `capsule ui` opened its repository.
    pub fn resolve_one(mut flags: Flags) -> Result<Resolved> {
        let mut said = None;
        let mut choose = None;
        let unnamed = flags.profile.is_none() && flags.repo.as_deref().is_none_or(str::is_empty);
        if unnamed {
            if let Some(cfg) = load_config(flags.config.as_deref())? {
                let no_default = default_repo().is_some_and(|r| !r.join("config").exists());
                if let Some(name) = &cfg.file.default_profile {
                    flags.profile = Some(name.clone());
                } else if cfg.file.profiles.len() > 1 && no_default {
                    let names: Vec<&str> = cfg.file.profiles.keys().map(String::as_str).collect();
                    choose = Some(format!(
                        "no repository named and none at the default {}: name a profile with --profile ({}), or set `default-profile` in {}, or a repository with --repo",
                        default_repo().map(|r| r.display().to_string()).unwrap_or_default(),
                        names.join(", "),
                        cfg.path.display()
                    ));
                } else if cfg.file.profiles.len() == 1 && no_default {
                    let name = cfg.file.profiles.keys().next().cloned().unwrap_or_default();
                    if first_time_implied(&name) {
                        said = Some(format!(
                            "using profile {name:?}, the only one in {} (there is no repository at the default {}); name another with --profile, or set `default-profile` in the file",
                            cfg.path.display(),
                            default_repo().map(|r| r.display().to_string()).unwrap_or_default()
                        ));
                    }
                    flags.profile = Some(name);
                }
            }
        }
        let mut r = Settings::resolve(flags)?;
        if let Some(s) = said {
            r.warnings.insert(0, s);
        }
        if let Some(m) = choose {
            r.settings.location = Err(LocationError::Choose(m));
        }
        Ok(r)
    }

    /// `flags` with every setting neither a flag nor the environment gave
    /// taken from profile `p` (credentials aside: see [`Settings::resolve`]).
    pub fn with_profile(mut flags: Flags, p: Profile) -> Settings {
        if flags.repo.is_none() {
            flags.repo = p.repository.clone();
        }
        if flags.password_file.is_none() && std::env::var_os("CAPSULE_PASSWORD").is_none() {
            flags.password_file = p.password_file.clone();
        }
        if flags.connections.is_none() {
            flags.connections = p.connections;
        }
        if flags.cache_dir.is_none() {
            flags.cache_dir = p.cache_dir.clone();
        }
        let location = locate(flags.repo.as_deref());
        Settings {
            flags,
            profile: Some(p),
            location,
            own_env: None,
        }
    }

    /// The profile's name, when a profile is in use.
    pub fn profile_name(&self) -> Option<&str> {
        self.flags.profile.as_deref()
    }

    /// The profile in use, or an empty one.
    pub fn profile_or_default(&self) -> Profile {
        self.profile.clone().unwrap_or_default()
    }

    /// Where the repository is.
    pub fn location(&self) -> Result<RepoLocation> {
        self.location.clone().map_err(|e| match e {
            LocationError::Usage(m) => UsageError(m).into(),
            LocationError::NoDataDir => Error::Other(
                "cannot find a data directory for the default repository; set CAPSULE_REPO or --repo"
                    .into(),
            ),
            LocationError::Choose(m) => UsageError(m).into(),
        })
    }

    /// How a command reaches the repository at `loc`: the library's
    /// [`Access`], the one way in that the lab and the daemon use too.
    pub fn access(&self, loc: &RepoLocation) -> Result<Access> {
        let mut connect = capsule_access::Connect::from_env(&loc.dest);
        if let Some(own) = &self.own_env {
            let lookup = |k: &str| {
                own.iter()
                    .find(|(n, _)| *n == k)
                    .map(|(_, v)| v.clone())
                    .or_else(|| user_var(k))
                    .map(|v| v.to_string_lossy().into_owned())
            };
            connect.net = capsule_net::Options::from_lookup(&loc.dest, &lookup);
            // Not another profile's section of the AWS files.
            connect
                .net
                .aws_profile
                .get_or_insert_with(|| "default".into());
        }
        if let Some(n) = self.flags.connections {
            connect.net.concurrency = Some(n as usize);
        }
        connect.no_fsync = self.flags.no_fsync;
        connect.retry_for = self.flags.retry_for.map(std::time::Duration::from_secs);
        connect.trace = self.trace()?;
        if let Some(when) = &self.flags.as_of {
            let at = capsule_engine::timefmt::parse_when(when).ok_or_else(|| {
                UsageError(format!(
                    "--as-of {when:?} is not a moment: give it as \"2026-11-20 14:00\" (local time), 2026-11-20 or 2026-11-20T13:00:00Z"
                ))
            })?;
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs() as i64);
            if at > now {
                return Err(UsageError(format!(
                    "--as-of {when:?} is later than now: name a moment in the past (the one before the damage)"
                ))
                .into());
            }
            connect.as_of = Some(at);
        }
        let cache = if self.flags.no_cache {
            CachePolicy::Off
        } else {
            match &self.flags.cache_dir {
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
    pub fn trace(&self) -> Result<Option<capsule_backend::TraceSink>> {
        static TRACE: OnceLock<capsule_backend::TraceSink> = OnceLock::new();
        let Some(path) = &self.flags.trace_requests else {
            return Ok(None);
        };
        if let Some(t) = TRACE.get() {
            return Ok(Some(t.clone()));
        }
        let t = capsule_access::stack::trace_file(path)?;
        Ok(Some(TRACE.get_or_init(|| t).clone()))
    }

    /// Settings of profile `name` as a run of it would resolve them, over
    /// `self`'s flags (for the daemon, which holds every profile's key).
    pub fn for_profile(&self, name: &str, p: &Profile) -> Settings {
        let mut flags = self.flags.clone();
        flags.profile = Some(name.to_string());
        Settings::with_profile(flags, p.clone())
    }

    /// Settings of profile `name` for a process that resolved another
    /// profile (or none): its own credentials, never those the first
    /// profile set in this process's environment (`capsule ui` switching
    /// profiles).
    pub fn for_other_profile(&self, name: &str, p: &Profile) -> Result<Settings> {
        let mut flags = self.flags.clone();
        flags.profile = Some(name.to_string());
        // What the first profile filled into the flags goes; what the user
        // gave (a flag, the environment) stays, as for any run. The
        // repository is the other profile's by definition.
        flags.repo = None;
        if let Some(first) = &self.profile {
            if flags.password_file == first.password_file {
                flags.password_file = None;
            }
            if flags.cache_dir == first.cache_dir {
                flags.cache_dir = None;
            }
            if flags.connections == first.connections {
                flags.connections = None;
            }
        }
        let own = match &p.credentials {
            Some(c) => profile_env(c, name)?,
            None => Vec::new(),
        };
        let mut s = Settings::with_profile(flags, p.clone());
        s.own_env = Some(own);
        Ok(s)
    }
}

/// Whether profile `name` is chosen for the first time as the only one
/// (and remembers that it now has been). Without a state directory it is
/// always the first time: saying it again beats never saying it.
fn first_time_implied(name: &str) -> bool {
    let Some(dir) = capsule_lab::history::state_dir() else {
        return true;
    };
    let mark = dir.join("implied-profile");
    if std::fs::read_to_string(&mark).is_ok_and(|s| s.trim() == name) {
        return false;
    }
    let _ = std::fs::create_dir_all(&dir);
    let _ = std::fs::write(&mark, name);
    true
}

/// The profiles of the configuration named by `config` (or the default
/// one), for a message that asks the user to choose: empty when there is
/// no file or it cannot be read.
pub fn profile_names(config: Option<&Path>) -> Vec<String> {
    load_config(config)
        .ok()
        .flatten()
        .map(|c| c.file.profiles.into_keys().collect())
        .unwrap_or_default()
}

fn locate(repo: Option<&str>) -> std::result::Result<RepoLocation, LocationError> {
    let Some(r) = repo.filter(|r| !r.is_empty()) else {
        return Ok(RepoLocation {
            dest: Destination::Local(default_repo().ok_or(LocationError::NoDataDir)?),
            is_default: true,
        });
    };
    let r = r.strip_prefix("local:").unwrap_or(r);
    Ok(RepoLocation {
        dest: Destination::parse(r).map_err(|e| LocationError::Usage(e.to_string()))?,
        is_default: false,
    })
}

/// The environment variables this process set from its profile's
/// credentials (`set_default_env`): not the user's, so neither another
/// profile opened here ([`Settings::for_other_profile`]) nor a child run
/// of another profile ([`crate::now`]) takes them for its own.
static SET_FROM_PROFILE: std::sync::Mutex<Vec<&'static str>> = std::sync::Mutex::new(Vec::new());

/// The variables this process set from its profile (see [`Settings::resolve`]).
pub fn env_set_by_profile() -> Vec<&'static str> {
    SET_FROM_PROFILE
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .clone()
}

/// Variable `k` as the user set it (not from a profile).
fn user_var(k: &str) -> Option<std::ffi::OsString> {
    if env_set_by_profile().contains(&k) {
        return None;
    }
    std::env::var_os(k)
}

/// The destination credentials of a profile as the connectors read them
/// (environment variables and their values), for those the user's
/// environment does not give.
fn profile_env(
    c: &config::Credentials,
    profile: &str,
) -> Result<Vec<(&'static str, std::ffi::OsString)>> {
    let mut out: Vec<(&'static str, std::ffi::OsString)> = Vec::new();
    let mut set = |k: &'static str, v: &std::ffi::OsStr| {
        if user_var(k).is_none() {
            out.push((k, v.to_os_string()));
        }
    };
    let password_given = [
        "CAPSULE_SMB_PASSWORD",
        "CAPSULE_SMB_PASSWORD_FILE",
        "CAPSULE_SFTP_PASSWORD",
        "CAPSULE_SFTP_PASSWORD_FILE",
    ]
    .iter()
    .any(|k| user_var(k).is_some());
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
    Ok(out)
}

/// Sets the destination credentials of a profile in this process's
/// environment, where the user's does not set them already, and remembers
/// which it set.
fn set_default_env(c: &config::Credentials, profile: &str) -> Result<()> {
    let vars = profile_env(c, profile)?;
    let mut set = SET_FROM_PROFILE
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    for (k, v) in vars {
        // Single-threaded here: resolving comes before any command starts
        // a thread (main, right after parsing the command line).
        std::env::set_var(k, v);
        set.push(k);
    }
    Ok(())
}
