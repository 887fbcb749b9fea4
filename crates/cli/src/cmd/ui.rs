//! `capsule ui`: serves the local web page until Ctrl-C or SIGTERM.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::atomic::Ordering;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use anyhow::{Context, Result};
use clap::Args;

use crate::exit;
use crate::output::Output;
use crate::repo::open;
use capsule_app::{browse, Settings};

/// Arguments of `ui`.
#[derive(Args, Debug)]
pub struct UiArgs {
    /// Serve on this address instead of a free loopback port. Anything
    /// but loopback lets other machines reach the page: it is served over
    /// plain HTTP (no TLS), guarded only by the token, and said so.
    #[arg(long, value_name = "ADDR:PORT")]
    listen: Option<SocketAddr>,
    /// Do not open a browser ($BROWSER) on the page.
    #[arg(long)]
    no_browser: bool,
    /// Open the page on this file or folder, in the newest snapshot that
    /// holds it (default: the newest snapshot, on the folders it backed up).
    path: Option<std::path::PathBuf>,
}

pub fn ui(settings: &Settings, out: &Output, a: UiArgs) -> Result<u8> {
    let (repo, _) = open(settings, out)?;
    // Held as long as the page is served: downloads and restores read on.
    let browse::Shown {
        first,
        refresh,
        session,
    } = browse::show(repo, "ui", &|w| out.warn(w))?;
    let mut token = [0u8; 24];
    getrandom::fill(&mut token).map_err(|e| anyhow::anyhow!("no randomness for the token: {e}"))?;
    let token = hex::encode(token);
    let listen = a
        .listen
        .unwrap_or(SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 0));
    if !listen.ip().is_loopback() {
        out.warn(format!(
            "serving on {listen}, reachable from other machines, over plain HTTP: the token travels unencrypted, and anyone who learns it can read every file in the repository. Prefer the default (loopback) and an SSH tunnel"
        ));
    }
    let socket =
        std::net::TcpListener::bind(listen).with_context(|| format!("listening on {listen}"))?;
    socket.set_nonblocking(true)?;
    let addr = socket.local_addr()?;
    let at = match &a.path {
        // Named as the user sees it: relative to here, symlinks resolved
        // where it still exists (the snapshot holds the real path).
        Some(p) => {
            let abs = std::fs::canonicalize(p)
                .or_else(|_| std::path::absolute(p))
                .with_context(|| format!("{}: cannot make it an absolute path", p.display()))?;
            let Some(text) = abs.to_str() else {
                return Err(capsule_app::UsageError(format!(
                    "{}: the page opens on UTF-8 paths only; open its folder",
                    abs.display()
                ))
                .into());
            };
            format!("&at={}", percent(text))
        }
        None => String::new(),
    };
    let url = format!("http://{addr}/?t={token}{at}");
    let config = settings.flags.config.clone();
    let (opened_first, config2, config3) = (settings.clone(), config.clone(), config.clone());
    let ui = Arc::new(capsule_ui::Ui {
        shown: RwLock::new(Arc::new(capsule_ui::Shown {
            profile: settings.profile_name().map(str::to_string),
            view: RwLock::new(Arc::new(first)),
            refresh,
            session,
        })),
        token,
        open_profile: Box::new(move |name| show_profile(&opened_first, name)),
        backup_now: Box::new(move |name| {
            // A profile that is not there is refused, with those that are,
            // before anything is started.
            let cfg = capsule_app::settings::load_config(config2.as_deref())
                .map_err(|e| capsule_ui::Failure::internal(e.to_string()))?;
            match &cfg {
                Some(c) => {
                    c.profile(name)
                        .map_err(|e| capsule_ui::Failure::not_found(e.to_string()))?;
                }
                None => {
                    return Err(capsule_ui::Failure::not_found(format!(
                        "no profile {name:?}: there is no configuration file"
                    )))
                }
            }
            capsule_app::now::backup_now(config2.as_deref(), name)
                .map(|how| serde_json::json!({ "started": how }))
                .map_err(|e| {
                    capsule_ui::Failure::internal(format!("cannot start a backup of {name}: {e}"))
                })
        }),
        status: Box::new(
            move || serde_json::json!({ "profiles": capsule_app::status::all_rows(config3.as_deref()) }),
        ),
        reports: Box::new(reports),
        report_page: Box::new(report_page),
        addr,
        jobs: capsule_ui::Jobs::default(),
        host: capsule_engine::repo::hostname(),
    });
    let stop = browse::stop_flag()?;
    if out.json {
        out.json(&serde_json::json!({ "url": url, "addr": addr.to_string() }));
    } else {
        out.result(&url);
        out.say("the page is served until Ctrl-C");
    }
    if !a.no_browser {
        if let Some(b) = std::env::var_os("BROWSER").filter(|b| !b.is_empty()) {
            let _ = std::process::Command::new(b)
                .arg(&url)
                .stdin(std::process::Stdio::null())
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .spawn();
        }
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    rt.block_on(async move {
        let listener = tokio::net::TcpListener::from_std(socket)?;
        let stopped = async move {
            // Bounded only by the user: served until asked to stop.
            while !stop.load(Ordering::Relaxed) {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        };
        capsule_ui::serve(listener, ui, stopped).await
    })?;
    out.say("stopped");
    Ok(exit::OK)
}

/// Profile `name`'s repository, opened as a run of the profile would open
/// it (its own destination, credentials and password source), to be shown
/// by the page instead of the one it shows.
fn show_profile(first: &Settings, name: &str) -> Result<capsule_ui::Shown, String> {
    let cfg = capsule_app::settings::load_config(first.flags.config.as_deref())
        .map_err(|e| e.to_string())?
        .ok_or_else(|| "no configuration file: no profiles".to_string())?;
    let p = cfg.profile(name).map_err(|e| e.to_string())?;
    let s = first
        .for_other_profile(name, p)
        .map_err(|e| format!("profile {name}: {e}"))?;
    let warn = |w: String| eprintln!("capsule ui: {name}: {w}");
    let (repo, loc) = capsule_app::open::open(&s, &warn)
        .map_err(|e| format!("profile {name}: {}", anyhow::Error::from(e)))?;
    let shown = browse::show(repo, "ui", &warn)
        .map_err(|e| format!("profile {name} ({}): {e}", loc.display()))?;
    Ok(capsule_ui::Shown {
        profile: Some(name.to_string()),
        view: RwLock::new(Arc::new(shown.first)),
        refresh: shown.refresh,
        session: shown.session,
    })
}

/// Recorded backups and lab runs, newest first, as `report --list --json`
/// gives them.
fn reports() -> serde_json::Value {
    let Some(h) = capsule_lab::history::History::open_default() else {
        return serde_json::json!({ "backups": [], "lab": [] });
    };
    let mut runs = h.runs();
    runs.reverse();
    let mut labs = h.lab_ids();
    labs.reverse();
    serde_json::json!({
        "backups": runs.iter().take(200).map(|r| serde_json::json!({
            "snapshot": r.snapshot, "time": r.time, "destination": r.destination,
            "secs": r.total_secs(), "bound": r.bound.kind.label(),
        })).collect::<Vec<_>>(),
        "lab": labs.into_iter().take(50).collect::<Vec<_>>(),
    })
}

/// One report's page, as `report ID --html` writes it.
fn report_page(id: &str) -> Option<String> {
    let h = capsule_lab::history::History::open_default()?;
    if id.contains('T') {
        return h.find_lab(id).ok().map(|r| capsule_lab::html::lab_page(&r));
    }
    h.find_run(id).ok().map(|r| capsule_lab::html::run_page(&r))
}

/// `s` with everything but unreserved characters and `/` percent-encoded,
/// for a query string.
fn percent(s: &str) -> String {
    use percent_encoding::{utf8_percent_encode, NON_ALPHANUMERIC};
    const KEEP: &percent_encoding::AsciiSet = &NON_ALPHANUMERIC
        .remove(b'-')
        .remove(b'.')
        .remove(b'_')
        .remove(b'~')
        .remove(b'/');
    utf8_percent_encode(s, KEEP).to_string()
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_path_goes_into_the_address_percent_encoded() {
        assert_eq!(
            super::percent("/home/me/My Documents"),
            "/home/me/My%20Documents"
        );
        assert_eq!(super::percent("/a&b=c/ü"), "/a%26b%3Dc/%C3%BC");
    }
}
