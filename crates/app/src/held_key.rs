//! The key a daemon holds between runs, and its hand-over to the run.
//!
//! The daemon runs each job as a child process (so that a run's memory
//! goes back to the system when it ends, a crash or SIGKILL stays inside
//! one run, and SIGTERM stops a run within seconds). To spare every run the
//! key derivation (Argon2, 64 MiB and about 0.15 s here, far more on a slow
//! NAS client), the daemon derives the key-encryption key once per
//! profile, through the library's one way in ([`capsule_access::Access`]),
//! and hands it to each child on a pipe: the child's standard input, read
//! once when [`HELD_KEY`] says so. The key never touches the environment,
//! the command line or a file.
//!
//! Held, it is locked into memory (`mlock`, never written to swap) and the
//! daemon is not dumpable (`PR_SET_DUMPABLE` 0: no core dump, no ptrace by
//! other processes of the user), where the OS allows; where it does not,
//! the daemon says so once and still holds it.

use std::io::{Read, Write};

use capsule_engine::{EarlyKey, KeyHint};
use zeroize::{Zeroize, Zeroizing};

/// Set to `stdin` in a child the daemon started: its standard input holds
/// the key hint and the key-encryption key.
pub const HELD_KEY: &str = "CAPSULE_HELD_KEY";

/// The most the hand-over holds: a hint line and 64 hex digits.
const HAND_OVER_MAX: u64 = 512;

/// In a run the daemon started, the key it handed over (`None` otherwise,
/// or when what came is unusable: the run then derives the key as a run by
/// hand does).
pub fn receive() -> Option<EarlyKey> {
    if std::env::var(HELD_KEY).ok()? != "stdin" {
        return None;
    }
    let mut text = Zeroizing::new(Vec::new());
    std::io::stdin()
        .lock()
        .take(HAND_OVER_MAX)
        .read_to_end(&mut text)
        .ok()?;
    let text = std::str::from_utf8(&text).ok()?;
    let (hint, kek) = text.trim_end().rsplit_once('\n')?;
    let hint = KeyHint::parse(hint)?;
    let mut bytes = Zeroizing::new([0u8; 32]);
    hex::decode_to_slice(kek.trim(), &mut *bytes).ok()?;
    Some(EarlyKey::derived(hint, bytes))
}

/// A derived key held by the daemon for one repository.
pub struct HeldKey {
    hint: KeyHint,
    kek: Box<Zeroizing<[u8; 32]>>,
}

impl std::fmt::Debug for HeldKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HeldKey").field("hint", &self.hint).finish()
    }
}

impl HeldKey {
    /// Derives the key of `password` for the key file this machine last
    /// opened the repository with (`access`'s key hint). `None` before any
    /// run has opened it (there is no hint yet) or if the derivation failed.
    pub fn derive(access: &capsule_access::Access, password: &[u8]) -> Option<HeldKey> {
        let (hint, kek) = access.start_key(password)?.wait()?;
        let kek = Box::new(kek);
        lock_in_memory(&kek[..]);
        Some(HeldKey { hint, kek })
    }

    /// Whether this key was derived for the repository's current key file
    /// (the hint a run last wrote).
    pub fn matches(&self, access: &capsule_access::Access) -> bool {
        access.key_hint().as_ref() == Some(&self.hint)
    }

    /// Writes the hand-over into a child's standard input, and closes it.
    pub fn hand_over(&self, mut to: impl Write) -> std::io::Result<()> {
        let mut text = Zeroizing::new(self.hint.to_text());
        let mut hex = hex::encode(&self.kek[..]);
        text.push_str(&hex);
        text.push('\n');
        hex.zeroize();
        to.write_all(text.as_bytes())
    }
}

/// Keeps the pages holding `key` out of swap (best effort: the limit on
/// locked memory may be zero in a container).
#[allow(unsafe_code)]
fn lock_in_memory(key: &[u8]) {
    // SAFETY: mlock only changes how the kernel pages the range; the range
    // is a live allocation that outlives the call (the key's box is held
    // for as long as the key), and unlocking happens when the process ends.
    let r = unsafe { libc::mlock(key.as_ptr().cast(), key.len()) };
    if r != 0 {
        eprintln!(
            "capsule daemon: note: the held key could not be locked into memory ({}); it may be written to swap",
            std::io::Error::last_os_error()
        );
    }
}

/// No core dumps of the daemon, and no attaching to it, where the OS
/// allows (Linux's `PR_SET_DUMPABLE`).
pub fn forbid_dumps() {
    #[cfg(target_os = "linux")]
    if let Err(e) =
        rustix::process::set_dumpable_behavior(rustix::process::DumpableBehavior::NotDumpable)
    {
        eprintln!("capsule daemon: note: core dumps could not be turned off ({e})");
    }
}
