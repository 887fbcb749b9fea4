//! capsule's application layer: what the command line, the web page and
//! the daemon share, below the argument parser and above the library's
//! one way in ([`capsule_access`]), the engine and the change journal.
//!
//! - [`config`]: the configuration file and its profiles.
//! - [`settings`]: flags, environment and a profile resolved into one
//!   value, [`Settings`], built once before anything is connected;
//!   [`password`]: where the repository password comes from, and reading it.
//! - [`open`]: opening the repository the settings name; the destination's
//!   counters; a snapshot named on the command line; reading sessions.
//! - [`status`]: each profile's run records, staleness and status rows.
//! - [`daemon`]: the scheduler: due times, retries, conditions
//!   ([`conditions`]), staleness, hooks, one child process per job with
//!   the held key ([`held_key`]) handed over, a watcher per profile
//!   keeping its change journal ([`journal`]); [`lock`]: a profile's
//!   run and daemon locks.
//! - [`service`]: the systemd unit and launchd property list that start
//!   the daemon.
//! - [`browse`]: the snapshots as the mount and the page show them.
//! - [`retention`]: a profile's retention as the engine's policy.
//!
//! Errors are typed ([`Error`]); the command line maps them to exit codes.

pub mod browse;
pub mod conditions;
pub mod config;
pub mod copy;
pub mod daemon;
pub mod error;
pub mod explain;
pub mod held_key;
pub mod history;
pub mod journal;
pub mod lock;
pub mod now;
pub mod open;
pub mod password;
pub mod retention;
pub mod service;
pub mod settings;
pub mod status;

pub use error::{Error, Result, UsageError};
pub use settings::{Flags, RepoLocation, Settings};

/// When the process started: run records count from here.
pub static STARTED: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
