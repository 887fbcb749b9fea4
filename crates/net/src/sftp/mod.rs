//! SFTP over SSH (the `russh` and `russh-sftp` crates; pure Rust).
//!
//! * Authentication: a private key (`CAPSULE_SFTP_KEY`, else the usual
//!   `~/.ssh/id_*`), then a password (`CAPSULE_SFTP_PASSWORD`). The server's
//!   host key must already be in known_hosts; an unknown or changed key is
//!   refused with the fingerprint and the command that records it.
//! * No overwrite, atomically: the object is written to `.tmp-<random>` in
//!   its directory, fsynced (`fsync@openssh.com`), then renamed. SFTP v3's
//!   RENAME refuses an existing target (OpenSSH implements it with link(2)),
//!   so the rename decides the race. Objects are created read-only (0444).
//! * Append-only accounts (`internal-sftp -P remove,rmdir,rename,…`): the
//!   first write asks whether renames are refused (one rename of a name
//!   that does not exist), and if so writes each object straight under its
//!   name with `O_EXCL`; read-only, it cannot then be overwritten by the
//!   same account, which may not change permissions either.
//! * Latency: writes and reads are pipelined (many requests in flight per
//!   object), and a small pool of SSH connections carries concurrent
//!   requests, since one sshd process serves one connection on one core.

mod backend;
mod dial;
mod requests;

pub use requests::SftpBackend;
