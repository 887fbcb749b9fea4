//! The options every command takes, and what they say to the
//! application layer.

use clap::Args;

/// Options every command takes.
#[derive(Args, Debug, Clone)]
pub struct GlobalArgs {
    /// Repository location: a directory, smb://user@host:port/share/path,
    /// sftp://user@host:port/path, s3://host:port/bucket/prefix (ports optional) or
    /// s3+http://… (default: a repository in your data directory, e.g.
    /// ~/.local/share/capsule/repo). Credentials: CAPSULE_SMB_PASSWORD or _FILE,
    /// CAPSULE_SFTP_KEY, CAPSULE_SFTP_PASSWORD or _FILE, CAPSULE_SFTP_KNOWN_HOSTS,
    /// AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY or ~/.aws/credentials.
    #[arg(short = 'r', long, env = "CAPSULE_REPO", global = true)]
    pub repo: Option<String>,
    /// Read the password from this file (it wins over CAPSULE_PASSWORD).
    #[arg(long, env = "CAPSULE_PASSWORD_FILE", global = true)]
    pub password_file: Option<std::path::PathBuf>,
    /// Print machine-readable JSON on stdout.
    #[arg(long, global = true)]
    pub json: bool,
    /// Print only errors and warnings.
    #[arg(short, long, global = true)]
    pub quiet: bool,
    /// Do not use the local cache of index files, snapshots and trees.
    #[arg(long, global = true)]
    pub no_cache: bool,
    /// Cache directory (default: the user cache directory, per repository).
    #[arg(long, env = "CAPSULE_CACHE_DIR", global = true)]
    pub cache_dir: Option<std::path::PathBuf>,
    /// Do not fsync objects on the local backend (faster on shares that
    /// force synchronous writes; a power cut may lose the newest backup).
    #[arg(long, global = true, conflicts_with = "sync")]
    pub no_fsync: bool,
    /// Fsync every object on the local backend before it counts as stored
    /// (the default; say it explicitly in scripts for mounted shares).
    #[arg(long, global = true)]
    pub sync: bool,
    /// Requests in flight to a network destination (default 8).
    #[arg(long, env = "CAPSULE_CONNECTIONS", global = true, value_name = "N",
          value_parser = clap::value_parser!(u32).range(1..=256))]
    pub connections: Option<u32>,
    /// How long a run waits for a destination that stopped answering, in
    /// seconds, retrying, before it gives up (default 60: a NAS restarting
    /// or a node of a distributed store lost and back is ridden out).
    #[arg(long, env = "CAPSULE_RETRY_FOR", global = true, value_name = "SECS",
          value_parser = clap::value_parser!(u64).range(0..=86_400))]
    pub retry_for: Option<u64>,
    /// Write a line per request to the destination into FILE (tab-separated:
    /// start and duration in seconds, operation, bytes, result, object), to
    /// see where a slow run waits.
    #[arg(long, global = true, value_name = "FILE")]
    pub trace_requests: Option<std::path::PathBuf>,
    /// Read the repository as it was at this moment ("2026-11-20 14:00",
    /// local time, or RFC 3339): on a versioned S3 bucket, every object's
    /// version of then, so what was deleted or overwritten later (by
    /// ransomware holding the backup credentials) reads as it was. Read
    /// only; `capsule --as-of WHEN repair history` writes that state back.
    #[arg(long, global = true, value_name = "WHEN")]
    pub as_of: Option<String>,
    /// Configuration file (default: capsule.toml in your configuration
    /// directory, e.g. ~/.config/capsule/capsule.toml).
    #[arg(long, env = capsule_app::config::CONFIG_ENV, global = true, value_name = "FILE")]
    pub config: Option<std::path::PathBuf>,
    /// Take settings from this profile of the configuration file. A flag or
    /// an environment variable wins over the profile, the profile over
    /// capsule's default; lists (excludes, tags) add up.
    #[arg(long, env = "CAPSULE_PROFILE", global = true, value_name = "NAME")]
    pub profile: Option<String>,
}

impl GlobalArgs {
    /// What the flags and the environment give, for the application
    /// layer to resolve with a profile.
    pub fn flags(&self) -> capsule_app::Flags {
        capsule_app::Flags {
            repo: self.repo.clone(),
            password_file: self.password_file.clone(),
            no_cache: self.no_cache,
            cache_dir: self.cache_dir.clone(),
            no_fsync: self.no_fsync,
            connections: self.connections,
            retry_for: self.retry_for,
            trace_requests: self.trace_requests.clone(),
            as_of: self.as_of.clone(),
            config: self.config.clone(),
            profile: self.profile.clone(),
        }
    }
}
