//! Output: JSON or human text on stdout, warnings and errors on stderr, and
//! a progress bar only when stderr is a terminal.

use std::io::IsTerminal;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use capsule_engine::progress::Progress;
use capsule_engine::EngineError;
use indicatif::{ProgressBar, ProgressStyle};

use crate::exit;

/// How to print.
pub struct Output {
    /// JSON on stdout.
    pub json: bool,
    /// Suppress non-essential text.
    pub quiet: bool,
    /// Warnings given so far, also put in the JSON document (`notices`,
    /// the first [`NOTICES_KEPT`]), and how many more there were
    /// (`notices_omitted`).
    notices: std::sync::Mutex<(Vec<String>, u64)>,
    /// The configuration file named (`--config`), whose profiles a hint
    /// names.
    pub config: Option<std::path::PathBuf>,
}

impl Output {
    pub fn new(json: bool, quiet: bool) -> Self {
        Output {
            json,
            quiet,
            notices: Default::default(),
            config: None,
        }
    }

    /// Prints a line of human output unless quiet or JSON.
    pub fn say(&self, s: impl AsRef<str>) {
        if !self.json && !self.quiet {
            stdout_line(s.as_ref());
        }
    }

    /// Prints human output even when quiet (the command's actual result).
    pub fn result(&self, s: impl AsRef<str>) {
        if !self.json {
            stdout_line(s.as_ref());
        }
    }

    /// Prints a JSON document when in JSON mode.
    pub fn json<T: serde::Serialize>(&self, v: &T) {
        if self.json {
            // Every warning printed on stderr is in the document too, so
            // a script reading JSON misses none of them.
            let (notices, omitted) = self
                .notices
                .lock()
                .map(|n| (n.0.clone(), n.1))
                .unwrap_or_default();
            let v = match serde_json::to_value(v) {
                Ok(serde_json::Value::Object(mut m)) if !notices.is_empty() => {
                    m.entry("notices").or_insert(notices.into());
                    if omitted > 0 {
                        m.entry("notices_omitted").or_insert(omitted.into());
                    }
                    serde_json::Value::Object(m)
                }
                Ok(v) => v,
                Err(e) => return eprintln!("capsule: cannot encode JSON output: {e}"),
            };
            match serde_json::to_string_pretty(&v) {
                Ok(s) => stdout_line(&s),
                Err(e) => eprintln!("capsule: cannot encode JSON output: {e}"),
            }
        }
    }

    /// A warning on stderr.
    pub fn warn(&self, s: impl AsRef<str>) {
        eprintln!("warning: {}", s.as_ref());
        if let Ok(mut n) = self.notices.lock() {
            // A run with 100,000 unreadable files warns 100,000 times (each
            // also in the report's own `warnings`): the document keeps the
            // first ones and counts the rest.
            if n.0.len() < NOTICES_KEPT {
                n.0.push(s.as_ref().to_string());
            } else {
                n.1 += 1;
            }
        }
    }

    /// A fatal error on stderr, with a hint where one helps.
    pub fn error(&self, e: &anyhow::Error) {
        let mut msg = format!("capsule: {e}");
        for cause in e.chain().skip(1) {
            // Engine errors already include their cause in their message.
            let c = cause.to_string();
            if !msg.contains(&c) {
                msg.push_str(&format!(": {c}"));
            }
        }
        if let Some(h) = hint(e, self.config.as_deref()) {
            msg.push_str(&format!("\n  hint: {h}"));
        }
        if self.json {
            let v = serde_json::json!({ "error": e.to_string(), "exit_code": exit_code_for(e) });
            stdout_line(&v.to_string());
        }
        eprintln!("{msg}");
    }

    /// Starts a progress display for `p` if stderr is a terminal.
    pub fn progress(&self, p: &Arc<Progress>, what: &'static str) -> Option<ProgressHandle> {
        if self.json || self.quiet || !std::io::stderr().is_terminal() {
            return None;
        }
        let bar = ProgressBar::new(0);
        // A stream has no total: what was read, and how fast.
        let stream = what == "stream";
        bar.set_style(
            ProgressStyle::with_template(if stream {
                "{spinner} {prefix} {binary_bytes} read {msg}"
            } else {
                "{spinner} {prefix} [{bar:30}] {binary_bytes}/{binary_total_bytes} {msg}"
            })
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> "),
        );
        bar.set_prefix(what);
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (p2, b2, s2) = (p.clone(), bar.clone(), stop.clone());
        let started = std::time::Instant::now();
        let h = std::thread::spawn(move || {
            while !s2.load(Ordering::Relaxed) {
                let total = Progress::get(&p2.bytes_total);
                let done = Progress::get(&p2.bytes_done);
                b2.set_length(total.max(done));
                b2.set_position(done);
                let secs = started.elapsed().as_secs_f64().max(0.001);
                b2.set_message(if stream {
                    let g = Progress::get;
                    format!(
                        "at {}/s, new {} (a stream: no total, no ETA)",
                        bytes((g(&p2.bytes_read) as f64 / secs) as u64),
                        bytes(g(&p2.bytes_new))
                    )
                } else {
                    status_line(&p2, secs)
                });
                b2.tick();
                std::thread::sleep(Duration::from_millis(100));
            }
        });
        Some(ProgressHandle {
            bar,
            stop,
            thread: Some(h),
        })
    }
}

/// Writes one line on stdout. When the reader has gone (`capsule ls |
/// head`), exits quietly as Unix tools do, instead of panicking: what was
/// asked for has been read. Only read-only output goes to stdout, and
/// commands that change the repository print after they are done.
fn stdout_line(s: &str) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    if let Err(e) = writeln!(out, "{s}") {
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            std::process::exit(0);
        }
        eprintln!("capsule: cannot write output: {e}");
    }
}

/// The progress message: rates, the unchanged/new split, and an ETA that
/// models the three kinds of data separately. Unchanged files cost a stat,
/// deduplicated data costs a read and a hash, new data costs everything: so
/// the bytes still to *read* are the remaining bytes times the share that
/// needed reading so far, at the observed read rate; when nothing needed
/// reading yet, the ETA follows the file rate instead.
fn status_line(p: &Progress, secs: f64) -> String {
    let g = Progress::get;
    let (files, files_total) = (g(&p.files_done), g(&p.files_total));
    let (done, total) = (g(&p.bytes_done), g(&p.bytes_total));
    let (read, new, unchanged_files) = (g(&p.bytes_read), g(&p.bytes_new), g(&p.files_unchanged));
    let rate = read as f64 / secs;
    let eta = if !p.totals_final.load(Ordering::Relaxed) || total == 0 {
        None
    } else if read > 0 && done > 0 {
        let to_read_share = read as f64 / done as f64;
        let remaining = total.saturating_sub(done) as f64 * to_read_share.min(1.0);
        Some(remaining / rate.max(1.0))
    } else if files > 0 {
        Some(files_total.saturating_sub(files) as f64 / (files as f64 / secs))
    } else {
        None
    };
    let eta = match eta {
        Some(e) if e.is_finite() => format!("ETA {}", fmt_secs(e)),
        _ => "ETA …".to_string(),
    };
    format!(
        "{files}/{files_total} files ({unchanged_files} unchanged) {:.0} files/s, read {}/s, new {} {eta}",
        files as f64 / secs,
        bytes(rate as u64),
        bytes(new),
    )
}

fn fmt_secs(s: f64) -> String {
    let s = s.round() as u64;
    if s >= 3600 {
        format!("{}h{:02}m", s / 3600, (s / 60) % 60)
    } else if s >= 60 {
        format!("{}m{:02}s", s / 60, s % 60)
    } else {
        format!("{s}s")
    }
}

/// How many warnings the JSON document repeats in `notices`.
pub const NOTICES_KEPT: usize = 100;

/// A running progress display; finished on drop.
pub struct ProgressHandle {
    bar: ProgressBar,
    stop: Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Drop for ProgressHandle {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        self.bar.finish_and_clear();
    }
}

/// The error of type `T` behind `e`: itself, or the one an application
/// layer error wraps.
fn find<T: std::error::Error + Send + Sync + 'static>(e: &anyhow::Error) -> Option<&T> {
    e.downcast_ref::<T>().or_else(|| {
        e.downcast_ref::<capsule_app::Error>()
            .and_then(|a| a.inner().downcast_ref::<T>())
    })
}

/// Maps an error to the documented exit code.
pub fn exit_code_for(e: &anyhow::Error) -> u8 {
    use capsule_app::error as app;
    if find::<app::MissingPassword>(e).is_some()
        || find::<app::PasswordFileError>(e).is_some()
        || find::<app::PasswordCommandError>(e).is_some()
    {
        return exit::PASSWORD;
    }
    if find::<app::UsageError>(e).is_some() || find::<app::ConfigError>(e).is_some() {
        return exit::USAGE;
    }
    if find::<app::Busy>(e).is_some() {
        return exit::BUSY;
    }
    if find::<app::KeepsNothing>(e).is_some() {
        return exit::KEEPS_NOTHING;
    }
    if find::<app::QuotaTooSmall>(e).is_some() {
        return exit::QUOTA_TOO_SMALL;
    }
    match e.downcast_ref::<capsule_lab::LabError>() {
        Some(capsule_lab::LabError::NotFound(_)) => return exit::NOT_FOUND,
        Some(capsule_lab::LabError::Interrupted) => return exit::INTERRUPTED,
        _ => {}
    }
    if let Some(code) = backend_error(e).and_then(destination_exit_code) {
        return code;
    }
    if let Some(EngineError::Io { source, .. }) = find::<EngineError>(e) {
        if matches!(
            source.kind(),
            std::io::ErrorKind::StorageFull | std::io::ErrorKind::QuotaExceeded
        ) {
            return exit::FULL;
        }
    }
    match find::<EngineError>(e) {
        Some(EngineError::WrongPassword { .. }) => exit::PASSWORD,
        Some(
            EngineError::NoUsableKey { .. }
            | EngineError::DamagedConfig { .. }
            | EngineError::MissingConfig { .. }
            | EngineError::HistoryLeft { .. },
        ) => exit::DAMAGED,
        Some(EngineError::NotARepository { .. } | EngineError::AlreadyInitialized { .. }) => {
            exit::REPOSITORY
        }
        Some(
            EngineError::SnapshotNotFound(_)
            | EngineError::NoSnapshotBefore { .. }
            | EngineError::AmbiguousSnapshot(_)
            | EngineError::PathNotFound(_),
        ) => exit::NOT_FOUND,
        Some(EngineError::Invalid(_)) => exit::USAGE,
        Some(EngineError::PruneRefused(_)) => exit::DAMAGED,
        Some(EngineError::AppendOnly(_)) => exit::ACCESS,
        Some(EngineError::Interrupted) => exit::INTERRUPTED,
        _ => exit::ERROR,
    }
}

/// The backend error behind `e`, whether the engine wrapped it or not.
fn backend_error(e: &anyhow::Error) -> Option<&capsule_backend::BackendError> {
    match find::<EngineError>(e) {
        Some(EngineError::Backend(b)) => Some(b),
        _ => find::<capsule_backend::BackendError>(e),
    }
}

/// Exit codes that say what is wrong with the destination.
fn destination_exit_code(b: &capsule_backend::BackendError) -> Option<u8> {
    use capsule_backend::ErrorKind as K;
    match b.kind {
        K::Unreachable => Some(exit::UNREACHABLE),
        K::AuthFailed | K::PermissionDenied => Some(exit::ACCESS),
        K::NoSpace => Some(exit::FULL),
        K::NoContainer => Some(exit::NO_CONTAINER),
        _ => None,
    }
}

fn hint(e: &anyhow::Error, config: Option<&std::path::Path>) -> Option<String> {
    hint_static(e, config).map(|h| h.into_owned())
}

fn hint_static(
    e: &anyhow::Error,
    config: Option<&std::path::Path>,
) -> Option<std::borrow::Cow<'static, str>> {
    if let Some(b) = backend_error(e) {
        use capsule_backend::ErrorKind as K;
        match b.kind {
            K::Unreachable if b.op == "open" => {
                return Some("plug in the disk or mount the share, or check --repo / CAPSULE_REPO; nothing was written".into())
            }
            K::Unreachable => {
                return Some("check that the server is up and reachable; the next run resumes where this one stopped".into())
            }
            K::AuthFailed if b.message.contains("RequestTimeTooSkewed") => {
                return Some("set this machine's clock right (`timedatectl set-ntp true`) and run again; the credentials are not at fault".into())
            }
            K::AuthFailed => return Some("check the user name and credentials in the repository URL and environment".into()),
            K::NoContainer => {
                return Some("create the share, bucket or directory first, or check the repository URL".into())
            }
            _ => {}
        }
    }
    match find::<EngineError>(e)? {
        EngineError::WrongPassword { .. } => Some(match capsule_app::password::password_source() {
            Some(from) => format!("the password came from {from}: check it; nothing was written").into(),
            None => "check CAPSULE_PASSWORD / CAPSULE_PASSWORD_FILE; nothing was written".into(),
        }),
        EngineError::AppendOnly(_) => Some("run it with credentials that may delete (the repository's admin key or account); backups, listings and restores work with these".into()),
        EngineError::NotARepository { .. } => {
            let names = capsule_app::settings::profile_names(config);
            Some(if names.is_empty() || std::env::var_os("CAPSULE_PROFILE").is_some() {
                "check --repo / CAPSULE_REPO, or create a new repository there with `capsule init`".into()
            } else {
                format!(
                    "name the repository with --repo, or a profile with --profile (the configuration has: {}; `default-profile` in it picks one for every command), or create a new repository there with `capsule init`",
                    names.join(", ")
                )
                .into()
            })
        }
        EngineError::HistoryLeft { .. } => Some("read the repository as it was before with --as-of WHEN (`capsule --as-of '2026-12-01 12:00' snapshots`), then write it back with `capsule --as-of WHEN repair history`; do not run `capsule init` there, the history is the repository".into()),
        EngineError::NoUsableKey { .. } => Some("restore the key files under keys/ from a copy of the repository; do not run `capsule init` here, it cannot read the existing data".into()),
        EngineError::DamagedConfig { .. } | EngineError::MissingConfig { .. } => Some("restore the `config` object from a copy of the repository (any copy made after `init` will do; it never changes); do not run `capsule init` here, a new config cannot read the existing data".into()),
        EngineError::Corrupt { .. } | EngineError::MissingBlob(_) => Some("run `capsule check --read-data` to see what is damaged and which files it affects".into()),
        EngineError::Io { op: "write", source, .. }
            if matches!(
                source.kind(),
                std::io::ErrorKind::StorageFull | std::io::ErrorKind::QuotaExceeded
            ) =>
        {
            Some("the disk being written to is full; free space and run the command again (a restore keeps the files it completed and does not fetch them again)".into())
        }
        EngineError::Backend(b) if b.kind == capsule_backend::ErrorKind::NoSpace => {
            Some("the repository's disk is full; free space and run the backup again (it resumes)".into())
        }
        EngineError::Backend(b) if b.kind == capsule_backend::ErrorKind::PermissionDenied => {
            Some("check what these credentials may do on the repository (the message names what was refused)".into())
        }
        _ => None,
    }
}

/// Human-readable byte count.
pub fn bytes(n: u64) -> String {
    capsule_access::backup::human_bytes(n)
}

/// Prints which snapshots a thinning plan removes and why.
pub fn report_plan(out: &Output, plan: &capsule_engine::quota::ThinPlan, dry_run: bool) {
    if out.json {
        return;
    }
    let would = if dry_run { "would be " } else { "" };
    for r in &plan.remove {
        out.result(format!(
            "  remove {}  {}  oldest first: with the older ones frees {}",
            &r.id[..8],
            r.time,
            bytes(r.frees_with_older)
        ));
    }
    if plan.remove.is_empty() {
        out.say(format!(
            "no snapshot {would}removed: snapshots use {} of the {} stored (a prune gives back the rest)",
            bytes(plan.used),
            bytes(plan.stored),
        ));
        return;
    }
    out.say(format!(
        "{} snapshots {would}removed to fit {}: snapshots use {} now, {} after{}",
        plan.remove.len(),
        bytes(plan.target),
        bytes(plan.used),
        bytes(plan.used_after),
        if plan.fits {
            ""
        } else {
            " (still over: only the newest of each source and recent ones are left)"
        }
    ));
}
