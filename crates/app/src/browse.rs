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
    let sorted = |v: &View| {
        let mut ids: Vec<_> = v.snapshots.iter().map(|(id, _)| *id).collect();
        ids.sort();
        ids
    };
    let shown = std::sync::Mutex::new(sorted(first));
    let repo = repo.clone();
    Box::new(move || {
        // The names alone: reading 10,000 snapshots to find none changed
        // took 0.23 s a refresh (bench/page.sh). A damaged snapshot is
        // listed but not shown, so the view is read again each time: a
        // cost only a damaged repository pays.
        let ids = repo.snapshot_ids().ok()?;
        let mut last = shown
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if *last == ids {
            return None;
        }
        let v = view(&repo, None).ok()?;
        *last = sorted(&v);
        Some(v)
    })
}

/// A repository shown by a long-lived command (`mount`, `ui`).
pub struct Shown {
    /// The snapshots as first listed.
    pub first: View,
    /// Lists them again when asked, and reloads the index when they changed.
    pub refresh: capsule_mount::Refresh,
    /// Held as long as the repository is shown: a prune meanwhile keeps
    /// what it would delete until the view ends, and files read on. `None`
    /// when the destination takes no session (it was said to `warn`).
    pub session: Option<capsule_engine::session::Session>,
}

/// Shows `repo` for a command of `kind`: its reading session, the first
/// view of its snapshots and their refresh. `warn` hears of what cannot be
/// read or held.
pub fn show(repo: Repository, kind: &str, warn: &dyn Fn(String)) -> capsule_engine::Result<Shown> {
    let repo = Arc::new(repo);
    let session = crate::open::reading_session(
        &repo,
        kind,
        "a prune running meanwhile may delete data of forgotten snapshots still shown, whose files then fail to read",
        warn,
    );
    let first = view(&repo, Some(warn))?;
    let refresh = refresher(&repo, &first);
    Ok(Shown {
        first,
        refresh,
        session,
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
