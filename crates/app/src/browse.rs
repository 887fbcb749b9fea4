//! The snapshots as the mount and the web page show them, kept current
//! while they are shown, and the signal that ends such a long-lived view.

use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use capsule_engine::browse::Browser;
use capsule_engine::Repository;
use capsule_mount::View;

/// The snapshots and a browser of the index holding them. `warn` hears of
/// snapshots and index files that cannot be read (`None`: nobody asked).
pub fn view(repo: &Arc<Repository>, warn: Option<&dyn Fn(String)>) -> capsule_engine::Result<View> {
    let (snapshots, bad) = repo.list_snapshots()?;
    let (mut index, bad_index) = repo.load_index()?;
    capsule_engine::prune::add_marked_packs(repo, &mut index)?;
    if let Some(warn) = warn {
        for e in &bad {
            warn(format!("{e} (not shown)"));
        }
        for e in &bad_index {
            warn(format!("{e} (blobs it lists are unavailable)"));
        }
    }
    Ok(View {
        browser: Browser::new(repo.clone(), Arc::new(index)),
        snapshots,
    })
}

/// A refresh of `first`: the snapshots listed again, and when they changed
/// the index loaded again (a backup or forget since).
pub fn refresher(repo: &Arc<Repository>, first: &View) -> capsule_mount::Refresh {
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

/// A flag raised by Ctrl-C, SIGTERM or SIGHUP: a long-lived command
/// (`mount`, `ui`) ends cleanly when it sees it.
pub fn stop_flag() -> std::io::Result<Arc<AtomicBool>> {
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
