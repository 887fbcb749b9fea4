//! One module per command, or per family of commands: each parses its own
//! arguments (clap), calls the application layer or the library, and
//! prints. No command module uses another.

pub mod backup;
pub mod check;
pub mod completions;
pub mod config;
pub mod copy;
pub mod daemon;
pub mod diff;
pub mod dump;
pub mod find;
pub mod forget;
pub mod init;
pub mod key;
pub mod lab;
pub mod mount;
pub mod quota;
pub mod reference;
pub mod restore;
pub mod rewrite;
pub mod schedule;
pub mod snapshots;
pub mod status;
pub mod ui;
