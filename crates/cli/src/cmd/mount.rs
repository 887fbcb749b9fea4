//! `capsule mount`: the repository as a read-only file system, until Ctrl-C,
//! SIGTERM or an unmount from outside.

use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::time::Duration;

use anyhow::Result;
use clap::Args;

use capsule_app::{browse, Settings};
use capsule_mount::CapsuleFs;

use crate::exit;
use crate::output::Output;
use crate::repo::open;

/// Arguments of `mount`.
#[derive(Args, Debug)]
pub struct MountArgs {
    /// An empty directory to show the repository in.
    mountpoint: PathBuf,
    /// Requests served at once.
    #[arg(long, default_value_t = 4)]
    threads: usize,
    /// How often, at most, the list of snapshots is read again, in
    /// seconds: a backup or forget shows within this time.
    #[arg(long, default_value_t = 30, value_name = "SECS")]
    refresh: u64,
}

/// `capsule mount`.
pub fn mount(settings: &Settings, out: &Output, a: MountArgs) -> Result<u8> {
    // Before opening the repository: a wrong mount point is said at once.
    capsule_mount::check_mount_point(&a.mountpoint)
        .map_err(|e| capsule_app::UsageError(e.to_string()))?;
    let (repo, _) = open(settings, out)?;
    let browse::Shown {
        first,
        refresh,
        session: _session,
    } = browse::show(repo, "mount", &|w| out.warn(w))?;
    let count = first.snapshots.len();
    let stop = browse::stop_flag()?;
    let m = capsule_mount::mount(
        CapsuleFs::new(first, refresh, std::time::Duration::from_secs(a.refresh)),
        &a.mountpoint,
        a.threads,
    )?;
    out.say(format!(
        "{count} snapshots mounted at {} (snapshots/, hosts/, latest, versions/); Ctrl-C unmounts",
        a.mountpoint.display()
    ));
    // Bounded only by the user: the mount lasts until asked to end.
    while !stop.load(Ordering::Relaxed) {
        if m.ended() {
            out.say(format!("{} was unmounted", a.mountpoint.display()));
            return Ok(exit::OK);
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    if m.unmount()? {
        out.say(format!(
            "unmounted {}; it was in use (a shell or a program inside it), which now loses it",
            a.mountpoint.display()
        ));
    } else {
        out.say(format!("unmounted {}", a.mountpoint.display()));
    }
    Ok(exit::OK)
}
