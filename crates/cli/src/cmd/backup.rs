//! `capsule backup`: back up files and directories into a new snapshot,
//! and keep the profile's run record and change journal.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Result;
use capsule_app::Settings;
use capsule_engine::progress::Progress;
use clap::Args;

use crate::exit;
use crate::output::{bytes, Output};
use crate::repo::open_at;
use capsule_app::status::{self, BackupDone, Ended};
use capsule_engine::backup::BackupOptions;
use capsule_engine::repo::InitOptions;

/// Arguments of `backup`.
#[derive(Args, Debug)]
pub struct BackupArgs {
    /// Files and directories to back up (default: the profile's sources);
    /// with --stdin-from-command, the command and its arguments (after
    /// `--`).
    paths: Vec<PathBuf>,
    /// Back up standard input as one file (named by --stdin-filename).
    #[arg(long, conflicts_with = "stdin_from_command")]
    stdin: bool,
    /// Back up a command's output as one file: `capsule backup
    /// --stdin-from-command -- pg_dump mydb`. A command that fails makes
    /// no snapshot; its stderr is passed through.
    #[arg(long)]
    stdin_from_command: bool,
    /// The file name a stream is stored under (default: "stdin", or the
    /// command's name).
    #[arg(long, value_name = "NAME")]
    stdin_filename: Option<String>,
    /// Exclude paths matching a pattern (gitignore syntax; repeatable).
    #[arg(short, long = "exclude", value_name = "PATTERN")]
    excludes: Vec<String>,
    #[command(flatten)]
    more: crate::excludes::ExcludeArgs,
    /// Per-directory ignore file name (gitignore syntax; default
    /// .capsuleignore).
    #[arg(long, value_name = "NAME")]
    ignore_file: Option<String>,
    /// Do not read per-directory ignore files.
    #[arg(long)]
    no_ignore_files: bool,
    /// Stay on the file system of each path.
    #[arg(short = 'x', long)]
    one_file_system: bool,
    /// Compare against this snapshot instead of the latest one of the same host and paths.
    #[arg(long, value_name = "SNAPSHOT")]
    parent: Option<String>,
    /// Read every file, even those unchanged since the parent.
    #[arg(long)]
    force: bool,
    /// Say what the backup would read and about how much it would send;
    /// write nothing (no snapshot, no data, no run record).
    #[arg(short = 'n', long)]
    dry_run: bool,
    /// A first backup normally meets the first backups other machines are
    /// running into the same repository (small claim objects), so that
    /// what they share is uploaded once. This turns that off: each
    /// uploads everything itself, with fewer requests.
    #[arg(long, env = "CAPSULE_ALONE")]
    alone: bool,
    /// Tag the snapshot (repeatable, or "a,b").
    #[arg(long = "tag", value_delimiter = ',')]
    tags: Vec<String>,
    /// Host name to record.
    #[arg(long)]
    host: Option<String>,
    /// When the repository's quota would be exceeded or the destination is
    /// full: delete the oldest snapshots (never the newest of a source, nor
    /// recent ones) and carry on, or fail (default: delete-oldest).
    #[arg(long, value_enum)]
    when_full: Option<WhenFull>,
    /// Reader threads (default: twice the cores).
    #[arg(long, default_value_t = 0)]
    threads: usize,
    /// Scan every directory, whatever the daemon's change journal says.
    #[arg(long)]
    no_journal: bool,
    /// Read the sources from a snapshot of their file systems, so every
    /// file is stored as it was at one instant: auto (what the file system
    /// offers, else live files with a warning), apfs (macOS), btrfs, lvm, zfs (required:
    /// an error where not possible) or off (default: the profile's
    /// `source-snapshot`, else off).
    #[arg(long, env = "CAPSULE_SOURCE_SNAPSHOT", value_name = "KIND", value_parser = parse_mode)]
    source_snapshot: Option<capsule_engine::backup::SourceSnapshot>,
}

fn parse_mode(s: &str) -> Result<capsule_engine::backup::SourceSnapshot, String> {
    s.parse()
}

/// What a backup does when space runs out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum WhenFull {
    /// Delete the oldest snapshots, prune, carry on (as Time Machine does).
    DeleteOldest,
    /// Fail, deleting nothing.
    Fail,
}

impl From<WhenFull> for capsule_access::WhenFull {
    fn from(w: WhenFull) -> Self {
        match w {
            WhenFull::DeleteOldest => capsule_access::WhenFull::DeleteOldest,
            WhenFull::Fail => capsule_access::WhenFull::Fail,
        }
    }
}

/// The stream a backup reads, when it reads one.
fn stream_source(a: &BackupArgs) -> Result<Option<crate::stream::StreamSource>> {
    if a.stdin {
        return crate::stream::StreamSource::stdin(a.stdin_filename.clone()).map(Some);
    }
    if a.stdin_from_command {
        let argv = a.paths.iter().map(|p| p.as_os_str().to_owned()).collect();
        return crate::stream::StreamSource::command(argv, a.stdin_filename.clone()).map(Some);
    }
    Ok(None)
}

/// A backup's arguments with the profile's settings filled in: a flag
/// wins, lists add up, and with no paths the profile's sources are backed
/// up.
fn with_profile(settings: &Settings, mut a: BackupArgs) -> Result<(BackupArgs, WhenFull)> {
    let p = settings.profile.clone().unwrap_or_default();
    a.more = a.more.with_profile(&p)?;
    a.excludes.extend(a.more.file_patterns()?);
    // A profile's command stands for its sources.
    if a.paths.is_empty() && !a.stdin && !a.stdin_from_command && !p.command.is_empty() {
        a.stdin_from_command = true;
        a.paths = p.command.iter().map(PathBuf::from).collect();
    }
    if a.stdin_filename.is_none() {
        a.stdin_filename = p.stdin_filename.clone();
    }
    if a.stdin || a.stdin_from_command {
        if a.stdin && !a.paths.is_empty() {
            return Err(capsule_app::UsageError(
                "--stdin backs up standard input alone: give no paths".into(),
            )
            .into());
        }
        if a.stdin_from_command && a.paths.is_empty() {
            return Err(capsule_app::UsageError(
                "--stdin-from-command needs the command: capsule backup --stdin-from-command -- pg_dump mydb".into(),
            )
            .into());
        }
        a.tags.splice(0..0, p.tags.iter().cloned());
        let when_full = a.when_full.unwrap_or(match p.when_full.as_deref() {
            Some("fail") => WhenFull::Fail,
            _ => WhenFull::DeleteOldest,
        });
        return Ok((a, when_full));
    }
    a.paths.extend(a.more.listed_paths()?);
    let lists =
        a.more.files_from.len() + a.more.files_from_verbatim.len() + a.more.files_from_raw.len();
    if a.paths.is_empty() && lists > 0 {
        return Err(capsule_app::UsageError(
            "the --files-from lists name no path, and none was given: nothing to back up".into(),
        )
        .into());
    }
    if a.paths.is_empty() {
        if p.sources.is_empty() {
            return Err(capsule_app::UsageError(match &settings.flags.profile {
                Some(name) => {
                    format!("nothing to back up: give paths, or list `sources` in profile {name:?}")
                }
                None => "nothing to back up: give paths, or --profile NAME with sources".into(),
            })
            .into());
        }
        a.paths = p.sources.clone();
    }
    a.excludes.splice(0..0, p.excludes.iter().cloned());
    a.tags.splice(0..0, p.tags.iter().cloned());
    a.one_file_system |= p.one_file_system.unwrap_or(false);
    a.no_ignore_files |= p.no_ignore_files.unwrap_or(false);
    if a.ignore_file.is_none() {
        a.ignore_file = p.ignore_file.clone();
    }
    if a.source_snapshot.is_none() {
        // Checked when the profile was read.
        a.source_snapshot = p.source_snapshot.as_deref().and_then(|m| m.parse().ok());
    }
    let when_full = a.when_full.unwrap_or(match p.when_full.as_deref() {
        Some("fail") => WhenFull::Fail,
        _ => WhenFull::DeleteOldest,
    });
    Ok((a, when_full))
}

/// `capsule backup`: one run at a time per profile, across processes (the
/// lock goes with this process, however it ends), and the run recorded
/// for `status`.
pub fn run(settings: &Settings, out: &Output, a: BackupArgs) -> Result<u8> {
    let started = capsule_engine::timefmt::now_precise();
    let t = std::time::Instant::now();
    let _lock = match settings.profile_name() {
        Some(name) => match capsule_app::lock::ProfileLock::acquire(name, "run") {
            Ok(lock) => lock,
            // Whatever keeps it from taking the lock, nothing was done.
            Err(e) => {
                out.error(&e.into());
                return Ok(exit::BUSY);
            }
        },
        None => None,
    };
    let progress = Arc::new(Progress::default());
    let live = settings
        .profile_name()
        .map(|name| Live::start(name, started.0, progress.clone()));
    let dry_run = a.dry_run;
    let r = backup(settings, out, a, progress);
    if let Some(name) = settings.profile_name().filter(|_| !dry_run) {
        let end = match &r {
            Ok((code, done)) => Ended::Saved {
                complete: *code == exit::OK,
                done: done.as_ref(),
            },
            Err(e) => Ended::Failed {
                unreachable: crate::output::exit_code_for(e) == exit::UNREACHABLE,
                error: format!("{e:#}").lines().next().unwrap_or("").to_string(),
            },
        };
        status::record(
            name,
            status::outcome(started.0, t.elapsed().as_secs_f64(), end),
        );
    }
    // Running until its outcome is recorded: nobody sees it neither.
    drop(live);
    r.map(|(code, _)| code)
}

/// A profile's backup saying how far it got, every half second, for
/// `status` and the page ([`status::Running`]), until dropped.
struct Live {
    stop: Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
    profile: String,
}

impl Live {
    fn start(profile: &str, started_unix: i64, p: Arc<Progress>) -> Live {
        use std::sync::atomic::{AtomicBool, Ordering};
        let stop = Arc::new(AtomicBool::new(false));
        let (stop2, name) = (stop.clone(), profile.to_string());
        let thread = std::thread::Builder::new()
            .name("live".into())
            .spawn(move || {
                let mut last = None;
                // Bounded by the run: stopped when it ends.
                while !stop2.load(Ordering::Relaxed) {
                    let r = status::Running {
                        pid: std::process::id(),
                        started_unix,
                        files_done: Progress::get(&p.files_done),
                        bytes_done: Progress::get(&p.bytes_done),
                        files_total: Progress::get(&p.files_total),
                        bytes_total: Progress::get(&p.bytes_total),
                        totals_final: p.totals_final.load(Ordering::Relaxed),
                    };
                    if last.as_ref() != Some(&r) {
                        status::save_running(&name, &r);
                        last = Some(r);
                    }
                    std::thread::park_timeout(std::time::Duration::from_millis(500));
                }
            })
            .ok();
        Live {
            stop,
            thread,
            profile: profile.to_string(),
        }
    }
}

impl Drop for Live {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            t.thread().unpark();
            let _ = t.join();
        }
        status::clear_running(&self.profile);
    }
}

/// Runs `backup`; also returns what the profile's record keeps.
pub fn backup(
    settings: &Settings,
    out: &Output,
    a: BackupArgs,
    progress: Arc<Progress>,
) -> Result<(u8, Option<BackupDone>)> {
    let (a, when_full) = with_profile(settings, a)?;
    let loc = settings.location()?;
    let access = settings.access(&loc)?;
    if a.dry_run && loc.is_new_default() {
        return Err(capsule_app::UsageError(format!(
            "there is no repository at {} yet, and a dry run creates none: run `capsule backup` once, or give --repo",
            loc.display()
        ))
        .into());
    }
    let opened = if loc.is_new_default() {
        // The embedded default: created on first use.
        let opened = capsule_app::open::create(
            settings,
            &access,
            "password for the new default repository",
            &InitOptions::default(),
        )?;
        if !out.json {
            eprintln!("created a new repository at {}", loc.display());
        }
        opened
    } else {
        open_at(settings, &access, out)?
    };
    let connect_secs = opened.stack.connect_secs;
    let open_secs = opened.open_secs;
    let repo_id = opened.repo.config().id.clone();
    let key_source = opened.repo.key_source();
    let cache = opened.cache.clone();
    // Run records change with every run; backing them up would too.
    let skip_dirs: Vec<PathBuf> = capsule_lab::history::state_dir().into_iter().collect();
    let bar = out.progress(
        &progress,
        if a.stdin || a.stdin_from_command {
            "stream"
        } else {
            "backup"
        },
    );
    let no_journal = a.no_journal;
    let dry_run = a.dry_run;
    let stream = stream_source(&a)?;
    let mut opts = BackupOptions {
        paths: a.paths,
        excludes: a.excludes,
        rules: a.more.rules()?,
        ignore_file: (!a.no_ignore_files).then(|| {
            a.ignore_file
                .clone()
                .unwrap_or_else(|| ".capsuleignore".into())
        }),
        one_file_system: a.one_file_system,
        parent: a.parent,
        force: a.force,
        tags: a.tags,
        hostname: a.host,
        threads: a.threads,
        skip_dirs,
        estimate: bar.is_some(),
        // --force trusts nothing: it also checks that every indexed pack is
        // still there (one listing), so lost data is uploaded again.
        verify_packs: a.force,
        source_snapshot: a.source_snapshot.unwrap_or_default(),
        dry_run: a.dry_run,
        alone: a.alone,
        ..BackupOptions::default()
    };
    let profile = settings.profile.clone().unwrap_or_default();
    let journal = if stream.is_some() {
        capsule_app::journal::ForRun::default()
    } else {
        capsule_app::journal::for_run(settings.profile_name(), &profile, &opts, no_journal)
    };
    opts.changes = journal.changes.clone();
    opts.no_changes_because = journal.reason.clone();
    opts.verify_changes = journal.verify;
    let requests = opened.stack.requests.clone();
    let before = capsule_lab::record::DestCounters::read(&requests);
    let recorder = capsule_lab::series::Recorder::start(
        capsule_lab::series::Sources {
            progress: Some(progress.clone()),
            requests: Some(requests.clone()),
        },
        std::time::Duration::from_millis(250),
    );
    let start_unix = capsule_engine::timefmt::now_unix();
    let mut notice = |n: capsule_access::Notice<'_>| match n {
        capsule_access::Notice::Warning(w) => out.warn(w),
        capsule_access::Notice::Thinning(plan) => crate::output::report_plan(out, plan, false),
    };
    let (paths, run) = match stream {
        None => (
            opts.paths.iter().map(|p| p.display().to_string()).collect(),
            opened.backup(opts, when_full.into(), &progress, &mut notice),
        ),
        Some(mut src) => {
            let name = src.name.clone();
            let (mut reader, mut ended) = src.open()?;
            let s = capsule_engine::backup::Stream {
                name: &name,
                reader: &mut *reader,
                ended: &mut *ended,
            };
            (
                vec![capsule_engine::backup::stream_path(&name)],
                opened.backup_stream(opts, s, when_full.into(), &progress, &mut notice),
            )
        }
    };
    let series = recorder.finish();
    drop(bar);
    let capsule_access::BackupRun {
        report,
        thinned,
        quota,
        stored,
    } = run?;
    if dry_run {
        return dry_run_said(out, &report);
    }
    let counters = capsule_lab::record::DestCounters::read(&requests).since(&before);
    let mut record = capsule_lab::record::from_backup(
        &report,
        start_unix,
        capsule_lab::record::RunContext {
            destination: loc.display(),
            repository: repo_id,
            paths,
            connect_secs,
            open_secs,
            counters,
            series,
            rtt: None,
            bandwidth: None,
        },
    );
    record.process_secs = capsule_app::STARTED
        .get()
        .map(|t| t.elapsed().as_secs_f64());
    // The record feeds `capsule report` and `capsule estimate`; a backup
    // that worked is not failed for want of it.
    if let Some(h) = capsule_lab::history::History::open_default() {
        if let Err(e) = h.save_run(&record) {
            out.warn(format!("the run record was not kept: {e}"));
        }
    }
    if let Some(w) = capsule_app::journal::after_run(settings.profile_name(), &journal, &report) {
        out.warn(w);
    }
    if report.scan.journal_matched == Some(false) {
        out.warn(
            "verification run: a full scan found changes the change journal did not record; the full scan's snapshot was stored (counted in `status`)",
        );
    }
    for w in &report.warnings {
        out.warn(format!("{}: {}", w.path, w.message));
    }
    if let Some(w) = &report.clock_warning {
        out.warn(w);
    }
    for n in &report.index_notes {
        out.warn(n);
    }
    for n in &report.snapshot_notes {
        out.warn(n);
    }
    if report.append_only {
        out.say(
            "append-only: these credentials may add to the repository but not delete (the snapshot is stored); forget and prune need credentials that may, and this run's session object stays until such a prune removes it",
        );
    }
    let cache_stats = cache
        .as_ref()
        .map(|c| capsule_app::open::cache_json(&c.stats));
    if out.json {
        let mut v = serde_json::to_value(&report)?;
        v["thinned"] = serde_json::to_value(&thinned)?;
        v["cache"] = cache_stats.clone().unwrap_or(serde_json::Value::Null);
        v["destination"] = capsule_app::open::destination_json();
        v["bound"] = serde_json::to_value(&record.bound)?;
        v["connect_secs"] = serde_json::json!(connect_secs);
        v["open_secs"] = serde_json::json!(open_secs);
        v["key"] = serde_json::to_value(key_source)?;
        v["quota"] = serde_json::json!(quota.map(|q| q.bytes));
        v["stored"] = serde_json::json!(stored);
        out.json(&v);
    }
    let s = &report.summary;
    out.say(format!(
        "snapshot {} saved: {} files, {} dirs, {}",
        &report.snapshot_id[..8],
        s.files,
        s.dirs,
        bytes(s.bytes)
    ));
    out.say(format!(
        "  files: {} new, {} changed, {} unchanged; read {}, added {} ({} blobs, {} packs)",
        report.files_new,
        report.files_changed,
        report.files_unchanged,
        bytes(s.bytes_read),
        bytes(s.bytes_added),
        s.blobs_added,
        report.storage.packs
    ));
    if !report.packs_distrusted.is_empty() {
        out.say(format!(
            "  {} packs are missing or damaged (found by `check` or --force): their data was read and stored again",
            report.packs_distrusted.len()
        ));
    }
    if report.storage.packs_recovered > 0 {
        out.say(format!(
            "  resumed: {} packs uploaded by an interrupted run were indexed, not sent again",
            report.storage.packs_recovered
        ));
    }
    if !report.source_snapshots.is_empty() {
        out.say(format!(
            "  read from source snapshot {} (removed)",
            report.source_snapshots.join(", ")
        ));
    }
    let st = &report.stages;
    out.say(format!(
        "  time {:.2}s (thread-seconds: scan {:.2}, read {:.2}, chunk+hash {:.2}, compress {:.2}, encrypt {:.2}, write {:.2})",
        report.duration_secs, st.scan, st.read, st.chunk_hash, st.compress, st.encrypt, st.write
    ));
    let d = capsule_app::open::destination_json();
    out.say(format!(
        "  destination: {} requests ({} retried; one away is waited for up to {} s), waited {:.2}s, up to {} in flight, sent {}",
        d["requests"],
        d["retries"],
        d["retry_for_secs"],
        d["wait_secs"].as_f64().unwrap_or(0.0),
        d["max_in_flight"],
        bytes(d["bytes_up"].as_u64().unwrap_or(0))
    ));
    out.say(format!("  {}", record.bound.summary));
    let sc = &report.scan;
    match (sc.mode.as_str(), &sc.reason) {
        ("journal", _) => out.say(format!(
            "  scan: by the change journal, {} changed, {} listed",
            plural(sc.dirs_changed, "directory", "directories"),
            sc.dirs_listed
        )),
        ("verify", _) => out.say(format!(
            "  scan: verification run, a full scan {} the change journal",
            if sc.journal_matched == Some(true) {
                "agreed with"
            } else {
                "found more than"
            }
        )),
        (_, Some(why)) if journal.watched || no_journal => out.say(format!("  scan: full, {why}")),
        _ => {}
    }
    if let Some(c) = &cache_stats {
        out.say(format!(
            "  cache: {} hits, {} objects fetched ({})",
            c["hits"],
            c["fetched"],
            bytes(c["fetched_bytes"].as_u64().unwrap_or(0))
        ));
        if c["unstored"].as_u64().unwrap_or(0) > 0 {
            // Not an error (nothing is lost), but every later run pays for
            // it: the fleet year's laptops fetched 400 objects a run.
            eprintln!(
                "capsule: warning: the local cache could not keep {} objects ({}): each run fetches them from the destination again; free space there, or point CAPSULE_CACHE_DIR elsewhere",
                c["unstored"],
                c["unstored_error"].as_str().unwrap_or("?")
            );
        } else if c["fetched"].as_u64().unwrap_or(0) > 0 && report.parent.is_some() {
            out.say("  the local cache was missing or behind the repository; it has been brought up to date");
        }
    }
    let code = if report.warnings.is_empty() {
        exit::OK
    } else {
        eprintln!(
            "capsule: snapshot {} is incomplete: {} entries could not be backed up (listed above)",
            &report.snapshot_id[..8],
            report.warnings.len()
        );
        exit::INCOMPLETE
    };
    Ok((
        code,
        Some(BackupDone {
            report,
            key: key_source,
            quota: quota.map(|q| q.bytes),
            stored,
        }),
    ))
}

/// `n` and the noun for it.
fn plural(n: u64, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

/// What a dry run found: what would be read and sent. Nothing was written.
fn dry_run_said(
    out: &Output,
    r: &capsule_engine::backup::BackupReport,
) -> Result<(u8, Option<BackupDone>)> {
    for w in &r.warnings {
        out.warn(format!("{}: {}", w.path, w.message));
    }
    let s = &r.summary;
    if out.json {
        out.json(&serde_json::json!({
            "dry_run": true,
            "parent": r.parent,
            "files": s.files,
            "dirs": s.dirs,
            "bytes": s.bytes,
            "files_new": r.files_new,
            "files_changed": r.files_changed,
            "files_unchanged": r.files_unchanged,
            "files_read": s.files_read,
            "bytes_read": s.bytes_read,
            "blobs_added": s.blobs_added,
            "bytes_added": s.bytes_added,
            "scan": r.scan,
            "warnings": r.warnings,
        }));
    } else {
        out.result(format!(
            "dry run: {} files, {} dirs, {} in all; {} new, {} changed, {} unchanged",
            s.files,
            s.dirs,
            bytes(s.bytes),
            r.files_new,
            r.files_changed,
            r.files_unchanged
        ));
        out.result(format!(
            "  would read {} ({} files) and send about {} ({} new blobs, compressed and sealed); nothing was written",
            bytes(s.bytes_read),
            s.files_read,
            bytes(s.bytes_added),
            s.blobs_added
        ));
    }
    Ok((
        if r.warnings.is_empty() {
            exit::OK
        } else {
            exit::INCOMPLETE
        },
        None,
    ))
}
