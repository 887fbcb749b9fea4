//! How to reach a network destination: the options every backend takes.

use crate::url::Destination;

/// Credentials and knobs for opening a destination, usually from the
/// environment (see [`Options::from_env`]).
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// SMB or SFTP password (`CAPSULE_SMB_PASSWORD`, `CAPSULE_SFTP_PASSWORD`).
    pub password: Option<String>,
    /// SSH private key file (`CAPSULE_SFTP_KEY`; default: `~/.ssh/id_ed25519`,
    /// `id_ecdsa`, `id_rsa`, whichever exists).
    pub ssh_key: Option<std::path::PathBuf>,
    /// known_hosts file (`CAPSULE_SFTP_KNOWN_HOSTS`; default `~/.ssh/known_hosts`).
    pub known_hosts: Option<std::path::PathBuf>,
    /// Requests in flight at once (`CAPSULE_CONNECTIONS`); `None` picks the
    /// backend's default.
    pub concurrency: Option<usize>,
    /// Create the base directory (SMB, SFTP) or the bucket (S3) if it is
    /// missing (for `init`).
    pub create: bool,
    /// A bucket made by `create` gets object lock (and versioning) on
    /// (`init --object-lock`).
    pub create_locked: bool,
    /// The section of the AWS credentials and config files to read
    /// (`AWS_PROFILE`; None: that variable, else `default`).
    pub aws_profile: Option<String>,
}

impl Options {
    /// Reads the options for `dest` from the environment.
    pub fn from_env(dest: &Destination) -> Self {
        Self::from_lookup(dest, &|k| std::env::var(k).ok())
    }

    /// Reads the options for `dest` from `lookup`, which answers for an
    /// environment variable's name: a profile's own settings over the
    /// user's environment, for a process that opens several profiles'
    /// destinations, each with its own credentials.
    pub fn from_lookup(dest: &Destination, lookup: &dyn Fn(&str) -> Option<String>) -> Self {
        let var = |k: &str| lookup(k).filter(|v| !v.is_empty());
        let file = |k: &str| {
            var(k).and_then(|p| {
                std::fs::read_to_string(p)
                    .ok()
                    .map(|s| s.trim_end_matches(['\n', '\r']).to_string())
            })
        };
        let password = match dest {
            Destination::Smb(_) => {
                var("CAPSULE_SMB_PASSWORD").or_else(|| file("CAPSULE_SMB_PASSWORD_FILE"))
            }
            Destination::Sftp(_) => {
                var("CAPSULE_SFTP_PASSWORD").or_else(|| file("CAPSULE_SFTP_PASSWORD_FILE"))
            }
            _ => None,
        };
        Options {
            password,
            ssh_key: var("CAPSULE_SFTP_KEY").map(Into::into),
            known_hosts: var("CAPSULE_SFTP_KNOWN_HOSTS").map(Into::into),
            concurrency: var("CAPSULE_CONNECTIONS").and_then(|v| v.parse().ok()),
            create: false,
            create_locked: false,
            aws_profile: var("AWS_PROFILE"),
        }
    }
}
