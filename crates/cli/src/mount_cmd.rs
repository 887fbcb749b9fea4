//! `capsule mount`: the repository as a read-only file system, until Ctrl-C,
//! SIGTERM or an unmount from outside.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Result;
use clap::Args;

use capsule_engine::browse::Browser;
use capsule_engine::Repository;
use capsule_mount::{CapsuleFs, View};

use crate::output::Output;
use crate::{commands, exit, GlobalArgs};

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

/// The snapshots and a browser of the index holding them.
pub(crate) fn view(repo: &Arc<Repository>, out: Option<&Output>) -> capsule_engine::Result<View> {
    let (snapshots, bad) = repo.list_snapshots()?;
    let (mut index, bad_index) = repo.load_index()?;
    capsule_engine::prune::add_marked_packs(repo, &mut index)?;
    if let Some(out) = out {
        for e in &bad {
            out.warn(format!("{e} (not shown)"));
        }
        for e in &bad_index {
            out.warn(format!("{e} (blobs it lists are unavailable)"));
        }
    }
    Ok(View {
        browser: Browser::new(repo.clone(), Arc::new(index)),
        snapshots,
    })
}

/// A flag raised by Ctrl-C, SIGTERM or SIGHUP: a long-lived command
/// (`mount`, `ui`) ends cleanly when it sees it.
pub(crate) fn stop_flag() -> Result<Arc<AtomicBool>> {
    let stop = Arc::new(AtomicBool::new(false));
    for s in [
        signal_hook::consts::SIGINT,
        signal_hook::consts::SIGTERM,
        signal_hook::consts::SIGHUP,
    ] {
        signal_hook::flag::register(s, stop.clone())?;
    }
    Ok(stop)
}

/// A refresh of `first`: the snapshots listed again, and when they changed
/// the index loaded again (a backup or forget since).
pub(crate) fn refresher(repo: &Arc<Repository>, first: &View) -> capsule_mount::Refresh {
    let shown = std::sync::Mutex::new(
        first
            .snapshots
            .iter()
            .map(|(id, _)| *id)
            .collect::<Vec<_>>(),
    );
    let repo = repo.clone();
    Box::new(move || {
        let (snaps, _) = repo.list_snapshots().ok()?;
        let ids: Vec<_> = snaps.iter().map(|(id, _)| *id).collect();
        let mut last = shown
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if *last == ids {
            return None;
        }
        let v = view(&repo, None).ok()?;
        *last = v.snapshots.iter().map(|(id, _)| *id).collect();
        Some(v)
    })
}

pub fn mount(g: &GlobalArgs, out: &Output, a: MountArgs) -> Result<u8> {
    // Before opening the repository: a wrong mount point is said at once.
    capsule_mount::check_mount_point(&a.mountpoint)
        .map_err(|e| crate::settings::UsageError(e.to_string()))?;
    let (repo, _) = commands::open(g, out)?;
    let repo = Arc::new(repo);
    // Held as long as the mount is: a prune meanwhile keeps what it
    // would delete until the mount ends, and files read on.
    let _session = commands::reading_session(
        &repo,
        out,
        "mount",
        "a prune running meanwhile may delete data of forgotten snapshots still shown, whose files then fail to read",
    );
    let first = view(&repo, Some(out))?;
    let count = first.snapshots.len();
    let refresh = refresher(&repo, &first);
    let stop = stop_flag()?;
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
