//! Profiles: named sets of settings in `capsule.toml`, so that a command
//! (or the daemon, later) need not repeat the repository, the password
//! source and the sources every time.
//!
//! ```toml
//! [profiles.laptop]
//! sources = ["/home/me/Documents", "/home/me/Pictures"]
//! excludes = ["*.tmp"]
//! repository = "smb://me@nas/backup/laptop"
//! password-command = "secret-tool lookup capsule laptop"
//! credentials = { password-file = "/home/me/.config/capsule/nas-password" }
//! retention = { policy = "timemachine" }
//! quota = "500G"
//! schedule = { backup = "hourly", prune = "daily at 03:00" }
//! ```
//!
//! Precedence, for every setting: a command-line flag, then the
//! environment, then the profile, then capsule's default. List settings
//! (excludes) add up: the profile's and the command line's both apply.
//!
//! The file is read with `toml` and serde; an unknown key is an error, and
//! every mistake names the file, the line and the key.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// The environment variable naming the configuration file.
pub const CONFIG_ENV: &str = "CAPSULE_CONFIG";

/// The configuration file: profiles by name.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ConfigFile {
    /// The profile commands use when neither a repository nor a profile
    /// is named (`default-profile = "laptop"`).
    #[serde(
        rename = "default-profile",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub default_profile: Option<String>,
    /// Profiles by name.
    #[serde(default)]
    pub profiles: BTreeMap<String, Profile>,
}

/// One profile's settings. Every field may be left out.
#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct Profile {
    /// What `backup` backs up when no path is given.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub sources: Vec<PathBuf>,
    /// Exclude patterns (gitignore syntax), added to `--exclude`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub excludes: Vec<String>,
    /// Files of exclude patterns, one a line, added to `--exclude-file`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub exclude_file: Vec<PathBuf>,
    /// Exclude patterns matched whatever the case, added to `--iexclude`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub iexcludes: Vec<String>,
    /// Files of case-insensitive patterns, added to `--iexclude-file`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub iexclude_file: Vec<PathBuf>,
    /// Leave out the contents of directories tagged as caches
    /// (`CACHEDIR.TAG`), as `--exclude-caches`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub exclude_caches: Option<bool>,
    /// Leave out the contents of directories holding one of these files
    /// (`NAME` or `NAME:CONTENT`), added to `--exclude-if-present`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub exclude_if_present: Vec<String>,
    /// Leave out files larger than this ("2G"), as `--exclude-larger-than`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub exclude_larger_than: Option<String>,
    /// Files listing more paths to back up, one a line (`#` comments and
    /// blank lines skipped), added to `--files-from`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub files_from: Vec<PathBuf>,
    /// Files listing paths one a line, taken exactly as written.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub files_from_verbatim: Vec<PathBuf>,
    /// Files listing paths separated by NUL bytes (`find -print0`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub files_from_raw: Vec<PathBuf>,
    /// A command whose output is backed up as one file (a database dump),
    /// instead of `sources`: its program and arguments, run without a
    /// shell, as `backup --stdin-from-command -- …`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub command: Vec<String>,
    /// The file name `command`'s output is stored under (default: the
    /// program's name).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stdin_filename: Option<String>,
    /// Per-directory ignore file name (default `.capsuleignore`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ignore_file: Option<String>,
    /// Read no per-directory ignore files.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub no_ignore_files: Option<bool>,
    /// Stay on each source's file system.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub one_file_system: Option<bool>,
    /// Read the sources from a snapshot of their file systems: "auto",
    /// "apfs" (macOS), "btrfs", "lvm", "zfs" or "off" (the default), as
    /// `--source-snapshot`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub source_snapshot: Option<String>,
    /// Repository location (as `--repo`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub repository: Option<String>,
    /// A file holding the repository password.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub password_file: Option<PathBuf>,
    /// A command whose output is the repository password (run with `sh -c`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub password_command: Option<String>,
    /// The password itself. Discouraged: a file or a command keeps it out
    /// of the configuration; a readable file holding one is warned about.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub password: Option<String>,
    /// How to reach the destination.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub credentials: Option<Credentials>,
    /// Requests in flight to a network destination.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub connections: Option<u32>,
    /// Cache directory.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cache_dir: Option<PathBuf>,
    /// Tags given to every snapshot.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tags: Vec<String>,
    /// What `forget` keeps when no rule is given on the command line.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub retention: Option<Retention>,
    /// The repository's quota (as `quota set`), e.g. "500G".
    #[serde(skip_serializing_if = "Option::is_none")]
    pub quota: Option<String>,
    /// What a backup does when the quota or the destination is full:
    /// "delete-oldest" or "fail".
    #[serde(skip_serializing_if = "Option::is_none")]
    pub when_full: Option<String>,
    /// A second repository `capsule copy` copies this profile's snapshots
    /// to (the default of its `--to`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub copy_to: Option<String>,
    /// When each job runs (used by the daemon).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub schedule: Option<Schedules>,
    /// Commands run around runs.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hooks: Option<Hooks>,
    /// When the daemon holds a due backup back.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub conditions: Option<Conditions>,
    /// Whether the daemon watches the sources so that a run lists only
    /// what changed (default: yes).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub journal: Option<bool>,
    /// One run in this many scans in full and compares with what the
    /// journal said (default 24; 0: never).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub journal_verify_every: Option<u32>,
}

impl Profile {
    /// The profile's exclusions besides its patterns.
    pub fn exclude_rules(&self) -> Result<capsule_engine::backup::ExcludeRules, String> {
        let rules = capsule_engine::backup::ExcludeRules {
            iexcludes: self.iexcludes.clone(),
            caches: self.exclude_caches.unwrap_or(false),
            if_present: self.exclude_if_present.clone(),
            larger_than: match &self.exclude_larger_than {
                Some(s) => Some(parse_size(s).map_err(|e| format!("exclude-larger-than: {e}"))?),
                None => None,
            },
        };
        // Marker names are checked as a backup checks them.
        capsule_engine::backup::Excludes::new(&[], None, Vec::new())
            .and_then(|e| e.with_rules(&rules))
            .map_err(|e| e.to_string())?;
        Ok(rules)
    }
}

/// When the daemon holds a due backup back (re-checked until they pass).
#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct Conditions {
    /// Wait while on battery below this charge (percent).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub min_battery: Option<u32>,
    /// Wait while the network is metered (as NetworkManager marks it).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub skip_metered: Option<bool>,
}

/// Destination credentials: never required inline.
#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct Credentials {
    /// A file holding the SMB or SFTP password.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub password_file: Option<PathBuf>,
    /// A command printing the SMB or SFTP password.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub password_command: Option<String>,
    /// The SMB or SFTP password itself (discouraged, as `password`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub password: Option<String>,
    /// SFTP private key.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sftp_key: Option<PathBuf>,
    /// SFTP known-hosts file.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub known_hosts: Option<PathBuf>,
    /// The `~/.aws/credentials` section for S3.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub aws_profile: Option<String>,
}

/// Retention rules, as `forget` takes them.
#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct Retention {
    /// A named policy ("timemachine").
    #[serde(skip_serializing_if = "Option::is_none")]
    pub policy: Option<String>,
    /// `--keep-last`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub keep_last: Option<u32>,
    /// `--keep-hourly`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub keep_hourly: Option<u32>,
    /// `--keep-daily`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub keep_daily: Option<u32>,
    /// `--keep-weekly`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub keep_weekly: Option<u32>,
    /// `--keep-monthly`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub keep_monthly: Option<u32>,
    /// `--keep-yearly`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub keep_yearly: Option<u32>,
    /// `--keep-within`, e.g. "30d".
    #[serde(skip_serializing_if = "Option::is_none")]
    pub keep_within: Option<String>,
}

/// When each job of a profile runs.
#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct Schedules {
    /// Backups (default "hourly").
    #[serde(skip_serializing_if = "Option::is_none")]
    pub backup: Option<String>,
    /// `forget` by the retention policy.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub forget: Option<String>,
    /// `prune`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prune: Option<String>,
    /// `check`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub check: Option<String>,
    /// `check --read-data`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub check_read_data: Option<String>,
    /// Which packs the scheduled `check-read-data` reads: `next/12` (the
    /// slice of twelve verified longest ago, so twelve runs read every
    /// pack), `5%`, `2G`; all when unset.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub check_read_data_subset: Option<String>,
    /// `copy` of new snapshots to the profile's `copy-to` repository.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub copy: Option<String>,
    /// How old the last successful backup may be before the profile is
    /// stale (default: twice the backup interval), e.g. "2d".
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stale_after: Option<String>,
}

/// Commands run around a profile's runs (with `sh -c`).
#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct Hooks {
    /// Before a run; a failing one skips the run.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub before: Option<String>,
    /// After a run, whatever its result.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub after: Option<String>,
    /// After a failed run.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub on_failure: Option<String>,
    /// Once when the profile becomes stale.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub on_stale: Option<String>,
}

/// When a job runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Schedule {
    /// Never.
    Off,
    /// Every this many seconds.
    Every(u64),
    /// Every day at this local time (hours, minutes).
    DailyAt(u8, u8),
}

impl Schedule {
    /// Parses "hourly", "daily", "weekly", "every 30m" (s, m, h, d),
    /// "daily at 03:00" or "off".
    pub fn parse(s: &str) -> Result<Schedule, String> {
        let t = s.trim().to_ascii_lowercase();
        let words: Vec<&str> = t.split_whitespace().collect();
        match words.as_slice() {
            ["off"] | ["never"] => Ok(Schedule::Off),
            ["hourly"] => Ok(Schedule::Every(3600)),
            ["daily"] => Ok(Schedule::Every(86_400)),
            ["weekly"] => Ok(Schedule::Every(7 * 86_400)),
            ["every", n] => parse_duration(n)
                .filter(|&d| d >= 60)
                .map(Schedule::Every)
                .ok_or_else(|| format!("{s:?}: give an interval of at least a minute, as \"every 30m\", \"every 2h\" or \"every 1d\"")),
            ["daily", "at", hm] => {
                let (h, m) = hm.split_once(':').ok_or_else(|| format!("{s:?}: give the time as HH:MM"))?;
                match (h.parse::<u8>(), m.parse::<u8>()) {
                    (Ok(h), Ok(m)) if h < 24 && m < 60 && m.to_string().len() <= 2 => {
                        Ok(Schedule::DailyAt(h, m))
                    }
                    _ => Err(format!("{s:?}: give the time as HH:MM, from 00:00 to 23:59")),
                }
            }
            _ => Err(format!(
                "{s:?} is not a schedule: use \"hourly\", \"daily\", \"weekly\", \"every 30m\", \"daily at 03:00\" or \"off\""
            )),
        }
    }
}

/// Seconds of "30s", "30m", "2h", "1d".
pub fn parse_duration(s: &str) -> Option<u64> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit())?;
    let n: u64 = s[..split].parse().ok()?;
    let unit = match &s[split..] {
        "s" => 1,
        "m" | "min" => 60,
        "h" => 3600,
        "d" => 86_400,
        "w" => 7 * 86_400,
        _ => return None,
    };
    n.checked_mul(unit)
}

/// A configuration file that cannot be used: its path, and what is wrong
/// (with the line and the key, as the TOML reader reports them). Exit code
/// 2, as a mistake in how capsule was called.
#[derive(Debug)]
pub struct ConfigError(pub String);

impl std::fmt::Display for ConfigError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}
impl std::error::Error for ConfigError {}

/// A configuration file as read.
#[derive(Debug, Clone)]
pub struct Config {
    /// Where it was read from.
    pub path: PathBuf,
    /// What it holds.
    pub file: ConfigFile,
    /// Warnings to show (a secret inline in a file others can read).
    pub warnings: Vec<String>,
    /// Why users other than its owner (and root) could change the file:
    /// a profile that runs commands or names secrets is then refused.
    pub insecure: Option<String>,
}

/// Why a user other than its owner or root could change the file at
/// `path`: it, or a directory above it, belongs to another user or may be
/// written by its group or by everyone (a directory with the sticky bit
/// owned by root, as /tmp, protects what others own in it). As ssh judges
/// its configuration.
pub fn writable_by_others(path: &Path) -> Option<String> {
    use std::os::unix::fs::MetadataExt;
    let me = rustix::process::geteuid().as_raw();
    let real = std::fs::canonicalize(path).ok()?;
    for p in real.ancestors() {
        let m = std::fs::metadata(p).ok()?;
        if m.uid() != me && m.uid() != 0 {
            return Some(format!(
                "{} belongs to another user (uid {})",
                p.display(),
                m.uid()
            ));
        }
        let sticky = m.is_dir() && m.mode() & 0o1000 != 0 && m.uid() == 0 && p != real;
        if m.mode() & 0o022 != 0 && !sticky {
            return Some(format!(
                "{} may be written by {} (mode {:o})",
                p.display(),
                if m.mode() & 0o002 != 0 {
                    "every user"
                } else {
                    "its group"
                },
                m.mode() & 0o7777
            ));
        }
    }
    None
}

impl Profile {
    /// What in this profile runs a command or names a secret (which a file
    /// others may change must not hold).
    pub fn commands_or_secrets(&self) -> Vec<&'static str> {
        let c = self.credentials.as_ref();
        let h = self.hooks.as_ref();
        [
            ("password-command", self.password_command.is_some()),
            ("command", !self.command.is_empty()),
            ("password-file", self.password_file.is_some()),
            ("password", self.password.is_some()),
            (
                "credentials",
                c.is_some_and(|c| {
                    c.password_command.is_some()
                        || c.password_file.is_some()
                        || c.password.is_some()
                        || c.sftp_key.is_some()
                }),
            ),
            (
                "hooks",
                h.is_some_and(|h| {
                    h.before.is_some()
                        || h.after.is_some()
                        || h.on_failure.is_some()
                        || h.on_stale.is_some()
                }),
            ),
        ]
        .into_iter()
        .filter(|(_, on)| *on)
        .map(|(k, _)| k)
        .collect()
    }
}

/// Where the configuration file is: `--config`, else `CAPSULE_CONFIG`, else
/// `capsule.toml` in the user's configuration directory. Also whether it
/// was named explicitly (then it must exist).
pub fn config_path(flag: Option<&Path>) -> Option<(PathBuf, bool)> {
    if let Some(p) = flag {
        return Some((p.to_path_buf(), true));
    }
    if let Some(p) = std::env::var_os(CONFIG_ENV).filter(|p| !p.is_empty()) {
        return Some((PathBuf::from(p), true));
    }
    dirs::config_dir().map(|d| (d.join("capsule").join("capsule.toml"), false))
}

/// The most a configuration file may hold.
const CONFIG_MAX: u64 = 1 << 20;

impl Config {
    /// Reads and checks the file at `path`.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let bytes = std::fs::metadata(path)
            .map_err(|e| e.to_string())
            .and_then(|m| {
                if m.len() > CONFIG_MAX {
                    Err(format!(
                        "{} bytes, more than a configuration holds",
                        m.len()
                    ))
                } else {
                    std::fs::read(path).map_err(|e| e.to_string())
                }
            })
            .map_err(|e| ConfigError(format!("cannot read {}: {e}", path.display())))?;
        let text = String::from_utf8(bytes)
            .map_err(|_| ConfigError(format!("{}: not UTF-8 text", path.display())))?;
        let file: ConfigFile = toml::from_str(&text).map_err(|e| describe(path, &text, &e))?;
        let mut c = Config {
            path: path.to_path_buf(),
            file,
            warnings: Vec::new(),
            insecure: writable_by_others(path),
        };
        c.validate(&text)?;
        c.warn_about_inline_secrets();
        Ok(c)
    }

    /// Values serde cannot check by type: schedules, sizes, choices.
    fn validate(&self, text: &str) -> Result<(), ConfigError> {
        if let Some(d) = &self.file.default_profile {
            if !self.file.profiles.contains_key(d) {
                let line = text
                    .lines()
                    .position(|l| l.trim_start().starts_with("default-profile"))
                    .map(|i| format!(":{}", i + 1))
                    .unwrap_or_default();
                return Err(ConfigError(format!(
                    "{}{line}: `default-profile` names {d:?}, which is not a profile here; {}",
                    self.path.display(),
                    self.known_profiles()
                )));
            }
        }
        for (name, p) in &self.file.profiles {
            let bad = |key: &str, why: String| {
                let line = line_of(text, name, key);
                ConfigError(format!(
                    "{}{}: profile {name:?}, key `{key}`: {why}",
                    self.path.display(),
                    line.map(|l| format!(":{l}")).unwrap_or_default()
                ))
            };
            if let Some(s) = &p.schedule {
                for (key, v) in [
                    ("backup", &s.backup),
                    ("forget", &s.forget),
                    ("prune", &s.prune),
                    ("check", &s.check),
                    ("check-read-data", &s.check_read_data),
                    ("copy", &s.copy),
                ] {
                    if let Some(v) = v {
                        Schedule::parse(v).map_err(|e| bad(key, e))?;
                    }
                }
                if let Some(v) = &s.check_read_data_subset {
                    capsule_engine::check::Subset::parse(v)
                        .map_err(|e| bad("check-read-data-subset", e))?;
                    // Said, rather than a subset that never runs.
                    if s.check_read_data.is_none() {
                        return Err(bad(
                            "check-read-data-subset",
                            "it says which packs the scheduled read takes, but there is none: set `check-read-data` too (say \"weekly\")".into(),
                        ));
                    }
                }
                if let Some(v) = &s.stale_after {
                    parse_duration(v).ok_or_else(|| {
                        bad(
                            "stale-after",
                            format!("{v:?} is not a duration such as \"2d\" or \"36h\""),
                        )
                    })?;
                }
            }
            if p.schedule.as_ref().is_some_and(|s| s.copy.is_some()) && p.copy_to.is_none() {
                return Err(bad(
                    "copy",
                    "a copy schedule needs the repository to copy to: set `copy-to` in the profile"
                        .into(),
                ));
            }
            if let Some(q) = &p.quota {
                parse_size(q).map_err(|e| bad("quota", e))?;
            }
            if let Some(m) = &p.source_snapshot {
                m.parse::<capsule_engine::backup::SourceSnapshot>()
                    .map_err(|e| bad("source-snapshot", e))?;
            }
            if let Some(w) = &p.when_full {
                if w != "delete-oldest" && w != "fail" {
                    return Err(bad(
                        "when-full",
                        format!("{w:?}: use \"delete-oldest\" or \"fail\""),
                    ));
                }
            }
            if let Some(r) = &p.retention {
                if let Some(pol) = &r.policy {
                    if pol != "timemachine" {
                        return Err(bad(
                            "policy",
                            format!("{pol:?}: the only named policy is \"timemachine\""),
                        ));
                    }
                }
                if let Some(w) = &r.keep_within {
                    capsule_engine::retention::parse_span(w).map_err(|e| bad("keep-within", e))?;
                }
            }
            if p.conditions
                .as_ref()
                .and_then(|c| c.min_battery)
                .is_some_and(|b| b > 100)
            {
                return Err(bad("min-battery", "give a percentage, 0 to 100".into()));
            }
            p.exclude_rules()
                .map_err(|e| bad("exclude-if-present", e))?;
            if !p.command.is_empty() && !p.sources.is_empty() {
                return Err(bad(
                    "command",
                    "give sources or a command, not both (a command's output is a snapshot of its own: make a second profile)".into(),
                ));
            }
            if p.command.first().is_some_and(|c| c.is_empty()) {
                return Err(bad("command", "the program's name is empty".into()));
            }
            if let Some(n) = &p.stdin_filename {
                if n.is_empty() || n.contains('/') || n == "." || n == ".." {
                    return Err(bad(
                        "stdin-filename",
                        "give a file name, without \"/\"".into(),
                    ));
                }
            }
            if p.connections == Some(0) || p.connections.is_some_and(|n| n > 256) {
                return Err(bad("connections", "give 1 to 256".into()));
            }
            if p.password_file.is_some() as u8
                + p.password_command.is_some() as u8
                + p.password.is_some() as u8
                > 1
            {
                return Err(bad(
                    "password-file",
                    "give one of password-file, password-command and password".into(),
                ));
            }
        }
        Ok(())
    }

    fn warn_about_inline_secrets(&mut self) {
        use std::os::unix::fs::PermissionsExt;
        let inline: Vec<&String> = self
            .file
            .profiles
            .iter()
            .filter(|(_, p)| {
                p.password.is_some() || p.credentials.as_ref().is_some_and(|c| c.password.is_some())
            })
            .map(|(n, _)| n)
            .collect();
        if inline.is_empty() {
            return;
        }
        let mode = std::fs::metadata(&self.path).map_or(0, |m| m.permissions().mode());
        if mode & 0o077 != 0 {
            self.warnings.push(format!(
                "{} holds a password inline (profile {}) and other users may read it (mode {:o}): `chmod 600 {}`, or use password-file or password-command",
                self.path.display(),
                inline.iter().map(|n| format!("{n:?}")).collect::<Vec<_>>().join(", "),
                mode & 0o777,
                self.path.display()
            ));
        }
    }

    /// Why profile `name`, which runs commands or names secrets, must not
    /// be used from this file (others may change it).
    pub fn refused(&self, name: &str, p: &Profile) -> Option<ConfigError> {
        let why = self.insecure.as_ref()?;
        let what = p.commands_or_secrets();
        (!what.is_empty()).then(|| {
            ConfigError(format!(
                "{}: {why}, so another user could change what profile {name:?} runs or reads ({}); capsule will not use it. Make it yours alone: `chmod go-w` it and the directories above it (and `chown` what belongs to another user)",
                self.path.display(),
                what.join(", ")
            ))
        })
    }

    /// The profile named `name`, or an error listing the known ones (or
    /// saying why it must not be used: see [`Config::refused`]).
    pub fn profile(&self, name: &str) -> Result<&Profile, ConfigError> {
        if let Some(p) = self.file.profiles.get(name) {
            return match self.refused(name, p) {
                Some(e) => Err(e),
                None => Ok(p),
            };
        }
        self.file.profiles.get(name).ok_or_else(|| {
            ConfigError(format!(
                "{}: no profile {name:?}; {}",
                self.path.display(),
                self.known_profiles()
            ))
        })
    }

    /// "the profiles are: a, b" (or that there are none), for a message
    /// about a profile that is not there.
    fn known_profiles(&self) -> String {
        let known: Vec<&str> = self.file.profiles.keys().map(String::as_str).collect();
        if known.is_empty() {
            "the file defines none".to_string()
        } else {
            format!("the profiles are: {}", known.join(", "))
        }
    }
}

/// A TOML error as "FILE:LINE: what (key `k`)".
fn describe(path: &Path, text: &str, e: &toml::de::Error) -> ConfigError {
    let line = e
        .span()
        .map(|s| text[..s.start.min(text.len())].matches('\n').count() + 1);
    // The key: what precedes `=` on the line (a value's error points at
    // the value), else what the error points at.
    let line_text = line.and_then(|l| text.lines().nth(l - 1)).unwrap_or("");
    let key = line_text
        .split_once('=')
        .map(|(k, _)| k.trim().to_string())
        .or_else(|| {
            e.span()
                .and_then(|s| text.get(s.clone()))
                .map(|k| k.trim().trim_matches('"').to_string())
        })
        .filter(|k| !k.is_empty() && !k.contains('\n') && k.len() < 80);
    ConfigError(format!(
        "{}{}: {}{}",
        path.display(),
        line.map(|l| format!(":{l}")).unwrap_or_default(),
        e.message().trim_end(),
        key.map(|k| format!(" (key `{k}`)")).unwrap_or_default()
    ))
}

/// The line of `key` within profile `profile`'s table, best effort.
fn line_of(text: &str, profile: &str, key: &str) -> Option<usize> {
    let mut inside = false;
    for (i, l) in text.lines().enumerate() {
        let t = l.trim();
        if t.starts_with('[') {
            inside = t.contains(&format!("profiles.{profile}]"))
                || t.contains(&format!("profiles.{profile}."))
                || t.contains(&format!("profiles.\"{profile}\""));
        }
        if (inside || t.starts_with(&format!("{profile}."))) && t.contains(key) {
            return Some(i + 1);
        }
    }
    None
}

/// How long a secret's command may take when `CAPSULE_SECRET_TIMEOUT`
/// does not say (seconds): long enough to unlock a keyring by hand.
const SECRET_TIMEOUT: u64 = 120;

/// The most a secret's command may print.
const SECRET_MAX: usize = 64 << 10;

/// Runs `command` with `sh -c` and returns what it printed, without the
/// trailing newline. A command that fails, prints nothing, or has not
/// ended within `CAPSULE_SECRET_TIMEOUT` seconds (default 120) is an
/// error naming `what`. The output is taken when the command itself
/// exits: a child it left in the background (`sleep 1000 & echo pw`) may
/// hold its output open, and is not waited for. On a terminal, after a
/// second, capsule says what it waits for.
pub fn run_secret_command(command: &str, what: &str) -> Result<Vec<u8>, String> {
    use std::io::{IsTerminal, Read};
    use std::os::unix::process::CommandExt;
    let timeout = match std::env::var("CAPSULE_SECRET_TIMEOUT") {
        Ok(v) => v.trim().parse::<u64>().map_err(|_| {
            format!("CAPSULE_SECRET_TIMEOUT={v:?}: give the seconds a secret's command may take")
        })?,
        Err(_) => SECRET_TIMEOUT,
    };
    let mut child = std::process::Command::new("sh")
        .arg("-c")
        .arg(command)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::inherit())
        // Its own process group, so that a command that never ends is
        // ended with everything it started.
        .process_group(0)
        .spawn()
        .map_err(|e| format!("{what}: cannot run its command: {e}"))?;
    let mut stdout = child
        .stdout
        .take()
        .ok_or_else(|| format!("{what}: no output"))?;
    let _ = rustix::io::ioctl_fionbio(&stdout, true);
    let mut out = Vec::new();
    let started = std::time::Instant::now();
    let mut said = false;
    let mut take = |out: &mut Vec<u8>| {
        let mut buf = [0u8; 4096];
        while out.len() <= SECRET_MAX {
            match stdout.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => out.extend_from_slice(&buf[..n]),
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(_) => break,
            }
        }
    };
    let status = loop {
        take(&mut out);
        match child.try_wait() {
            Ok(Some(st)) => break st,
            Ok(None) => {}
            Err(e) => return Err(format!("{what}: cannot wait for its command: {e}")),
        }
        let waited = started.elapsed();
        if waited.as_secs() >= timeout {
            if let Some(pg) = rustix::process::Pid::from_raw(child.id() as i32) {
                let _ = rustix::process::kill_process_group(pg, rustix::process::Signal::KILL);
            }
            let _ = child.kill();
            let _ = child.wait();
            return Err(format!(
                "{what}: its command ({command:?}) did not end within {timeout} s and was stopped; fix it, or give it longer with CAPSULE_SECRET_TIMEOUT=SECS"
            ));
        }
        if !said && waited.as_secs() >= 1 && std::io::stderr().is_terminal() {
            eprintln!("capsule: waiting for {what} ({command:?}; at most {timeout} s)");
            said = true;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    };
    // What it wrote before it ended is in the pipe.
    take(&mut out);
    if out.len() > SECRET_MAX {
        return Err(format!(
            "{what}: its command printed more than a secret holds"
        ));
    }
    if !status.success() {
        return Err(format!("{what}: its command failed ({status})"));
    }
    let mut s = out;
    while matches!(s.last(), Some(b'\n' | b'\r')) {
        s.pop();
    }
    if s.is_empty() {
        return Err(format!("{what}: its command printed nothing"));
    }
    Ok(s)
}

/// Reads a size: `500G`, `1.5TiB`, `200MB`, `123456` (bytes); see
/// [`capsule_engine::quota::parse_size`].
pub fn parse_size(s: &str) -> Result<u64, String> {
    capsule_engine::quota::parse_size(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schedules_parse_and_mistakes_say_what_is_accepted() {
        assert_eq!(Schedule::parse("hourly"), Ok(Schedule::Every(3600)));
        assert_eq!(Schedule::parse("every 30m"), Ok(Schedule::Every(1800)));
        assert_eq!(
            Schedule::parse("Daily at 03:05"),
            Ok(Schedule::DailyAt(3, 5))
        );
        assert_eq!(Schedule::parse("off"), Ok(Schedule::Off));
        for bad in [
            "every 10s",
            "daily at 25:00",
            "daily at 3",
            "sometimes",
            "every",
        ] {
            assert!(Schedule::parse(bad).is_err(), "{bad}");
        }
    }

    fn load(text: &str) -> Result<Config, ConfigError> {
        let t = tempfile::tempdir().unwrap();
        let p = t.path().join("capsule.toml");
        std::fs::write(&p, text).unwrap();
        Config::load(&p)
    }

    #[test]
    fn every_mistake_names_the_file_the_line_and_the_key() {
        let e = load("[profiles.a]\nsources = [\"/x\"]\nrepostory = \"/r\"\n").unwrap_err();
        assert!(e.0.contains("capsule.toml:3"), "{e}");
        assert!(e.0.contains("repostory"), "{e}");
        let e = load("[profiles.a]\nconnections = \"many\"\n").unwrap_err();
        assert!(
            e.0.contains(":2") && e.0.contains("connections") || e.0.contains("many"),
            "{e}"
        );
        let e =
            load("[profiles.a]\n\n[profiles.a.schedule]\nbackup = \"sometimes\"\n").unwrap_err();
        assert!(e.0.contains(":4") && e.0.contains("`backup`"), "{e}");
        let e = load("[profiles.a]\n[profiles.a.schedule]\ncheck-read-data = \"weekly\"\ncheck-read-data-subset = \"13/12\"\n").unwrap_err();
        assert!(
            e.0.contains(":4") && e.0.contains("`check-read-data-subset`"),
            "{e}"
        );
        let e = load("[profiles.a]\n[profiles.a.schedule]\ncheck-read-data-subset = \"next/12\"\n")
            .unwrap_err();
        assert!(e.0.contains("set `check-read-data` too"), "{e}");
        load("[profiles.a]\n[profiles.a.schedule]\ncheck-read-data = \"weekly\"\ncheck-read-data-subset = \"next/12\"\n").unwrap();
        let e = load("[profiles.a]\nquota = \"lots\"\n").unwrap_err();
        assert!(e.0.contains(":2") && e.0.contains("`quota`"), "{e}");
        let e = load("[profiles.a\n").unwrap_err();
        assert!(e.0.contains("capsule.toml:1"), "{e}");
        let e = load("[profile.a]\n").unwrap_err();
        assert!(e.0.contains("profile"), "{e}");
    }

    #[test]
    fn an_unknown_profile_lists_the_known_ones() {
        let c = load("[profiles.laptop]\n[profiles.nas]\n").unwrap();
        let e = c.profile("lapton").unwrap_err();
        assert!(e.0.contains("laptop, nas"), "{e}");
    }
}
