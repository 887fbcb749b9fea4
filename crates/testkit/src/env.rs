//! The environment a test runs capsule in, set up in one place: where its
//! cache, run records, configuration and home are, its password and its
//! clock, and nothing of the developer's own shell that changes what
//! capsule does (an exported `CAPSULE_REPO` or `CAPSULE_PROFILE` would
//! otherwise turn a test's backup into a backup of somewhere else).

use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};
use std::process::Command;

/// The password every test repository is made with.
pub const PASSWORD: &str = "correct horse battery staple";

/// Variables a developer's shell may export that change what capsule
/// does: every test's process starts without them, and gets only what its
/// [`TestEnv`] says.
pub const CLEARED: &[&str] = &[
    "CAPSULE_PASSWORD",
    "CAPSULE_PASSWORD_FILE",
    "CAPSULE_REPO",
    "CAPSULE_PROFILE",
    "CAPSULE_CONFIG",
    "CAPSULE_CACHE_DIR",
    "CAPSULE_STATE_DIR",
    "CAPSULE_CONNECTIONS",
    "CAPSULE_TEST_NOW",
    "CAPSULE_HELD_KEY",
    "CAPSULE_SMB_PASSWORD",
    "CAPSULE_SMB_PASSWORD_FILE",
    "CAPSULE_SFTP_KEY",
    "CAPSULE_SFTP_PASSWORD",
    "CAPSULE_SFTP_PASSWORD_FILE",
    "CAPSULE_SFTP_KNOWN_HOSTS",
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_PROFILE",
];

/// A test server that `scripts/servers.sh` starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Server {
    /// Samba.
    Smb,
    /// OpenSSH's SFTP.
    Sftp,
    /// MinIO.
    S3,
}

/// The credentials capsule needs for `server`, reached at `listen` (its
/// own address, or a proxy's in front of it), as the server script left
/// them in this process's environment; `tag` names the known-hosts file
/// written for SFTP. `None` when the servers were not started (see
/// [`crate::server_env`]).
pub fn server_vars(server: Server, listen: &str, tag: &str) -> Option<Vec<(String, String)>> {
    let env = crate::server_env;
    Some(match server {
        Server::Smb => vec![(
            "CAPSULE_SMB_PASSWORD".into(),
            env("CAPSULE_TEST_SMB_PASSWORD")?,
        )],
        Server::Sftp => {
            // The server's host key, trusted at the address capsule dials.
            let servers = PathBuf::from(env("CAPSULE_TEST_SERVERS")?);
            let key = std::fs::read_to_string(servers.join("ssh/host_key.pub")).ok()?;
            let key: Vec<&str> = key.split_whitespace().take(2).collect();
            let (host, port) = listen.rsplit_once(':')?;
            let known = servers.join(format!("ssh/known_hosts-{tag}"));
            std::fs::write(&known, format!("[{host}]:{port} {}\n", key.join(" "))).ok()?;
            vec![
                ("CAPSULE_SFTP_KEY".into(), env("CAPSULE_TEST_SFTP_KEY")?),
                (
                    "CAPSULE_SFTP_KNOWN_HOSTS".into(),
                    known.display().to_string(),
                ),
            ]
        }
        Server::S3 => vec![
            ("AWS_ACCESS_KEY_ID".into(), env("CAPSULE_TEST_S3_KEY")?),
            (
                "AWS_SECRET_ACCESS_KEY".into(),
                env("CAPSULE_TEST_S3_SECRET")?,
            ),
        ],
    })
}

/// Where a test's capsule keeps its files, and what it is told.
#[derive(Debug, Clone, Default)]
pub struct TestEnv {
    cache: Option<PathBuf>,
    state: Option<PathBuf>,
    config: Option<PathBuf>,
    home: Option<PathBuf>,
    password: Option<String>,
    clock: Option<String>,
    vars: Vec<(String, OsString)>,
}

impl TestEnv {
    /// Nothing set: the developer's variables cleared, capsule's defaults
    /// otherwise.
    pub fn bare() -> TestEnv {
        TestEnv::default()
    }

    /// The cache and the run records in `dir` (`dir/cache`, `dir/state`).
    pub fn under(dir: &Path) -> TestEnv {
        TestEnv::bare()
            .cache(dir.join("cache"))
            .state(dir.join("state"))
    }

    /// The cache beside repository `repo` (`repo.cache`) and the run records
    /// inside it: the cache directory exists before a backup walks, so a
    /// record written there never touches the directory holding a source.
    pub fn beside(repo: &Path) -> TestEnv {
        let cache = repo.with_extension("cache");
        TestEnv::bare().state(cache.join("state")).cache(cache)
    }

    /// `CAPSULE_CACHE_DIR`.
    pub fn cache(mut self, dir: impl Into<PathBuf>) -> TestEnv {
        self.cache = Some(dir.into());
        self
    }

    /// No `CAPSULE_CACHE_DIR`: the cache goes where capsule's defaults (or
    /// a profile) put it.
    pub fn default_cache(mut self) -> TestEnv {
        self.cache = None;
        self
    }

    /// `CAPSULE_STATE_DIR`: run records, locks, journals.
    pub fn state(mut self, dir: impl Into<PathBuf>) -> TestEnv {
        self.state = Some(dir.into());
        self
    }

    /// `CAPSULE_CONFIG`: the configuration file.
    pub fn config(mut self, file: impl Into<PathBuf>) -> TestEnv {
        self.config = Some(file.into());
        self
    }

    /// `HOME` is `dir`, with its data directory `dir/data`
    /// (`XDG_DATA_HOME`) and the other XDG directories where they are by
    /// default (`dir/.config`, `dir/.cache`, `dir/.local/state`): for a
    /// test of capsule's defaults.
    pub fn home(mut self, dir: impl Into<PathBuf>) -> TestEnv {
        self.home = Some(dir.into());
        self
    }

    /// `CAPSULE_PASSWORD`.
    pub fn password(mut self, password: &str) -> TestEnv {
        self.password = Some(password.to_string());
        self
    }

    /// `CAPSULE_TEST_NOW`: a time (`2031-01-01T00:00:00Z`, Unix seconds) or
    /// `@FILE`, a file the test rewrites to move the clock.
    pub fn clock(mut self, now: impl Into<String>) -> TestEnv {
        self.clock = Some(now.into());
        self
    }

    /// Any other variable (a server's credentials, a test hook).
    pub fn var(mut self, key: &str, value: impl AsRef<OsStr>) -> TestEnv {
        self.vars
            .push((key.to_string(), value.as_ref().to_os_string()));
        self
    }

    /// Sets up `c`: the developer's variables cleared, then this
    /// environment's.
    pub fn apply(&self, c: &mut Command) {
        for k in CLEARED {
            c.env_remove(k);
        }
        if let Some(d) = &self.cache {
            c.env("CAPSULE_CACHE_DIR", d);
        }
        if let Some(d) = &self.state {
            c.env("CAPSULE_STATE_DIR", d);
        }
        if let Some(f) = &self.config {
            c.env("CAPSULE_CONFIG", f);
        }
        if let Some(h) = &self.home {
            c.env("HOME", h)
                .env("XDG_DATA_HOME", h.join("data"))
                .env_remove("XDG_CACHE_HOME")
                .env_remove("XDG_CONFIG_HOME")
                .env_remove("XDG_STATE_HOME");
        }
        if let Some(p) = &self.password {
            c.env("CAPSULE_PASSWORD", p);
        }
        if let Some(t) = &self.clock {
            c.env("CAPSULE_TEST_NOW", t);
        }
        for (k, v) in &self.vars {
            c.env(k, v);
        }
    }

    /// A command running `program` (the capsule binary under test) in this
    /// environment.
    pub fn command(&self, program: impl AsRef<OsStr>) -> Command {
        let mut c = Command::new(program);
        self.apply(&mut c);
        c
    }
}
