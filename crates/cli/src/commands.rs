//! One function per subcommand: open the repository, call the engine, print.

use crate::settings::UsageError;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context, Result};
use capsule_crypto::KdfParams;
use capsule_engine::backup::BackupOptions;
use capsule_engine::progress::Progress;
use capsule_engine::repo::InitOptions;
use capsule_engine::restore::RestoreOptions;
use capsule_engine::{treewalk, EngineError, Repository};
use capsule_format::tree::NodeKind;
use capsule_format::BlobId;
use clap::{Args, Subcommand};

use crate::output::{bytes, Output};
use crate::settings::{self, RepoLocation};
use crate::{exit, GlobalArgs};
use capsule_access::Opened;

pub(crate) fn open(g: &GlobalArgs, out: &Output) -> Result<(Repository, RepoLocation)> {
    let loc = settings::location(g)?;
    let opened = connect_and_open(g, &loc, out, false)?;
    Ok((opened.repo, loc))
}

/// Opens without the cache: for `check` and `repair`, which must read the
/// destination.
fn open_uncached(g: &GlobalArgs, out: &Output) -> Result<Opened> {
    let loc = settings::location(g)?;
    connect_and_open(g, &loc, out, true)
}

/// Connects and opens with the password, through the library's one way in
/// ([`capsule_access`]). The key derivation starts first, from the last
/// run's hint (or is the daemon's, already done), so that on a network
/// destination it runs while the connection is made and the key files are
/// read. A password that must be asked for is asked once connected.
fn connect_and_open(
    g: &GlobalArgs,
    loc: &RepoLocation,
    out: &Output,
    direct: bool,
) -> Result<Opened> {
    let access = settings::access(g, loc)?;
    let (pw, early) = settings::start_key(g, &access);
    let stack = settings::connect(&access, false)?;
    let pw = match pw {
        Some(pw) => pw,
        None => settings::password(g)?,
    };
    let opened = if direct {
        stack.open_direct(&access, &pw, early)?
    } else {
        stack.open(&access, &pw, early)?
    };
    for w in &opened.warnings {
        out.warn(format!(
            "{w}; another key opened the repository (remove the damaged file with `capsule key remove`, or restore it from a copy)"
        ));
    }
    Ok(opened)
}

/// Resolves a snapshot argument. When some snapshots cannot be read,
/// `latest` may not be the newest one made: say so, and say which one it
/// means, rather than silently using an older one.
fn resolve(
    repo: &Repository,
    out: &Output,
    spec: &str,
) -> Result<(capsule_format::ObjectId, capsule_format::snapshot::Snapshot)> {
    let r = repo.resolve_snapshot_noting(spec)?;
    let (id, snap, damaged) = (r.id, r.snapshot, r.damaged);
    if !r.future.is_empty() {
        let named: Vec<String> = r
            .future
            .iter()
            .map(|(id, t)| format!("{} of {t}", id.short()))
            .collect();
        out.warn(format!(
            "{spec:?} skips {} snapshot(s) dated in the future ({}): a clock was ahead when they were made; {spec:?} is {} of {}. Name one by ID to use it, or `capsule forget ID` it",
            named.len(),
            named.join(", "),
            id.short(),
            snap.time
        ));
    }
    // Named by ID or by a time later than now: it may be one made while a
    // clock ran ahead, which is worth knowing before it is used.
    let now = capsule_engine::timefmt::now_unix();
    if capsule_engine::timefmt::is_future(snap.time_unix, now) {
        out.warn(format!(
            "snapshot {} is dated {}, in the future of this machine's clock ({}): a clock was ahead when it was made, or this one is behind",
            id.short(),
            snap.time,
            capsule_engine::timefmt::rfc3339(now)
        ));
    }
    match &snap.repaired {
        Some(r) => out.warn(format!(
            "snapshot {} was repaired on {}: {} entries whose data was lost were dropped from it (the original, {}, is set aside: `capsule snapshots --forgotten`)",
            id.short(),
            r.time,
            r.dropped,
            r.from.get(..8).unwrap_or(&r.from)
        )),
        None if snap.tags.iter().any(|t| t == "repaired") => out.warn(format!(
            "snapshot {} was repaired: entries whose data was lost were dropped from it",
            id.short()
        )),
        None => {}
    }
    if spec == "latest" && !damaged.is_empty() {
        out.warn(format!(
            "{} snapshot(s) cannot be read ({}); one of them may be newer: \"latest\" is {} of {}, the newest readable one",
            damaged.len(),
            damaged.join("; "),
            id.short(),
            snap.time
        ));
    }
    Ok((id, snap))
}

/// Arguments of `init`.
#[derive(Args, Debug)]
pub struct InitArgs {
    /// zstd level for new data (0 stores uncompressed; 1 is fastest; up to 19).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(i32).range(0..=19))]
    compression: i32,
    /// Target pack size in MiB.
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u32).range(4..=512))]
    pack_size_mib: u32,
    /// Most space the repository may take (500G, 1.5T): backups delete the
    /// oldest snapshots to stay within it (`capsule quota` changes it).
    #[arg(long, value_name = "SIZE", value_parser = crate::forget_cmd::parse_size)]
    quota: Option<u64>,
}

pub fn init(g: &GlobalArgs, out: &Output, a: InitArgs) -> Result<u8> {
    let loc = settings::location(g)?;
    let access = settings::access(g, &loc)?;
    let stack = settings::connect(&access, true)?;
    let pw = settings::new_password(g, "new repository password")?;
    let opts = InitOptions {
        compression: a.compression,
        pack_size: a.pack_size_mib << 20,
        ..InitOptions::default()
    };
    let repo = stack.init(&access, &pw, &opts)?.repo;
    if let Some(q) = a.quota.filter(|q| *q > 0) {
        capsule_engine::quota::set(&repo, q, 3600)?;
        out.say(format!("quota {}", bytes(q)));
    }
    out.json(&serde_json::json!({ "repository": loc.display(), "id": repo.config().id, "quota": a.quota }));
    out.say(format!(
        "created repository {} at {}",
        &repo.config().id[..8],
        loc.display()
    ));
    out.say("keep the password safe: without it the backups cannot be read");
    Ok(exit::OK)
}

/// Arguments of `backup`.
#[derive(Args, Debug)]
pub struct BackupArgs {
    /// Files and directories to back up (default: the profile's sources).
    paths: Vec<PathBuf>,
    /// Exclude paths matching a pattern (gitignore syntax; repeatable).
    #[arg(short, long = "exclude", value_name = "PATTERN")]
    excludes: Vec<String>,
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
    /// Tag the snapshot (repeatable).
    #[arg(long = "tag")]
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

/// A backup's arguments with the profile's settings filled in: a flag
/// wins, lists add up, and with no paths the profile's sources are backed
/// up.
fn with_profile(g: &GlobalArgs, mut a: BackupArgs) -> Result<(BackupArgs, WhenFull)> {
    let p = g.profile_settings.clone().unwrap_or_default();
    if a.paths.is_empty() {
        if p.sources.is_empty() {
            return Err(settings::UsageError(match &g.profile {
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
    let when_full = a.when_full.unwrap_or(match p.when_full.as_deref() {
        Some("fail") => WhenFull::Fail,
        _ => WhenFull::DeleteOldest,
    });
    Ok((a, when_full))
}

/// What a backup leaves for the profile's record.
#[derive(Debug)]
pub struct BackupDone {
    /// The engine's report.
    pub report: capsule_engine::backup::BackupReport,
    /// How the key was had (`held`: from the daemon, nothing derived).
    pub key: capsule_engine::KeySource,
    /// The repository's quota, if any, and the bytes stored after the run.
    pub quota: Option<u64>,
    /// Bytes of packs stored (measured when there is a quota).
    pub stored: Option<u64>,
}

/// Runs `backup`; also returns what the profile's record keeps.
pub fn backup(g: &GlobalArgs, out: &Output, a: BackupArgs) -> Result<(u8, Option<BackupDone>)> {
    let (a, when_full) = with_profile(g, a)?;
    let loc = settings::location(g)?;
    let new_default =
        loc.is_default && loc.local_path().is_some_and(|p| !p.join("config").exists());
    let opened = if new_default {
        // The embedded default: created on first use.
        let access = settings::access(g, &loc)?;
        let stack = settings::connect(&access, true)?;
        let pw = settings::new_password(g, "password for the new default repository")?;
        let opened = stack.init(&access, &pw, &InitOptions::default())?;
        if !out.json {
            eprintln!("created a new repository at {}", loc.display());
        }
        opened
    } else {
        connect_and_open(g, &loc, out, false)?
    };
    let connect_secs = opened.stack.connect_secs;
    let open_secs = opened.open_secs;
    let repo_id = opened.repo.config().id.clone();
    let key_source = opened.repo.key_source();
    let cache = opened.cache.clone();
    // Run records change with every run; backing them up would too.
    let skip_dirs: Vec<PathBuf> = capsule_lab::history::state_dir().into_iter().collect();
    let progress = Arc::new(Progress::default());
    let bar = out.progress(&progress, "backup");
    let no_journal = a.no_journal;
    let mut opts = BackupOptions {
        paths: a.paths,
        excludes: a.excludes,
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
        ..BackupOptions::default()
    };
    let profile = g.profile_settings.clone().unwrap_or_default();
    let journal = crate::journal::for_run(g.profile.as_deref(), &profile, &opts, no_journal);
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
    let paths: Vec<String> = opts.paths.iter().map(|p| p.display().to_string()).collect();
    let run = opened.backup(opts, when_full.into(), &progress, &mut |n| match n {
        capsule_access::Notice::Warning(w) => out.warn(w),
        capsule_access::Notice::Thinning(plan) => crate::forget_cmd::report_plan(out, plan, false),
    });
    let series = recorder.finish();
    drop(bar);
    let capsule_access::BackupRun {
        report,
        thinned,
        quota,
        stored,
    } = run?;
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
    record.process_secs = crate::STARTED.get().map(|t| t.elapsed().as_secs_f64());
    // The record feeds `capsule report` and `capsule estimate`; a backup
    // that worked is not failed for want of it.
    if let Some(h) = capsule_lab::history::History::open_default() {
        if let Err(e) = h.save_run(&record) {
            out.warn(format!("the run record was not kept: {e}"));
        }
    }
    if let Some(w) = crate::journal::after_run(g.profile.as_deref(), &journal, &report) {
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
    let cache_stats = cache.as_ref().map(|c| settings::cache_json(&c.stats));
    if out.json {
        let mut v = serde_json::to_value(&report)?;
        v["thinned"] = serde_json::to_value(&thinned)?;
        v["cache"] = cache_stats.clone().unwrap_or(serde_json::Value::Null);
        v["destination"] = settings::destination_json();
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
    let st = &report.stages;
    out.say(format!(
        "  time {:.2}s (thread-seconds: scan {:.2}, read {:.2}, chunk+hash {:.2}, compress {:.2}, encrypt {:.2}, write {:.2})",
        report.duration_secs, st.scan, st.read, st.chunk_hash, st.compress, st.encrypt, st.write
    ));
    let d = settings::destination_json();
    out.say(format!(
        "  destination: {} requests ({} retried), waited {:.2}s, up to {} in flight, sent {}",
        d["requests"],
        d["retries"],
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
        if c["fetched"].as_u64().unwrap_or(0) > 0 && report.parent.is_some() {
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

/// Arguments of `snapshots`.
#[derive(Args, Debug)]
pub struct SnapshotsArgs {
    /// List forgotten snapshots instead: those `capsule unforget` can still
    /// bring back.
    #[arg(long)]
    forgotten: bool,
}

pub fn snapshots(g: &GlobalArgs, out: &Output, a: SnapshotsArgs) -> Result<u8> {
    let (repo, _) = open(g, out)?;
    let (snaps, bad) = if a.forgotten {
        capsule_engine::forget::list_forgotten(&repo)?
    } else {
        repo.list_snapshots()?
    };
    for e in &bad {
        out.warn(e.to_string());
    }
    let now = capsule_engine::timefmt::now_unix();
    let future = |s: &capsule_format::snapshot::Snapshot| {
        capsule_engine::timefmt::is_future(s.time_unix, now)
    };
    if out.json {
        let v: Vec<_> = snaps
            .iter()
            .map(|(id, s)| {
                serde_json::json!({ "id": id.to_hex(), "snapshot": s, "future": future(s) })
            })
            .collect();
        out.json(&v);
        return Ok(exit::OK);
    }
    out.result(format!(
        "{:<10} {:<20} {:<16} {:>8} {:>10}  paths",
        "id", "time", "host", "files", "size"
    ));
    for (id, s) in &snaps {
        out.result(format!(
            "{:<10} {:<20} {:<16} {:>8} {:>10}  {}{}",
            id.short(),
            s.time.replace('T', " ").trim_end_matches('Z'),
            s.hostname,
            s.summary.files,
            bytes(s.summary.bytes),
            s.paths.join(" "),
            [
                (s.incomplete, "  (incomplete)"),
                (future(s), "  (dated in the future: never \"latest\")"),
            ]
            .iter()
            .filter(|(on, _)| *on)
            .map(|(_, t)| *t)
            .collect::<String>()
        ));
    }
    out.say(format!(
        "{} {}snapshots",
        snaps.len(),
        if a.forgotten { "forgotten " } else { "" }
    ));
    Ok(exit::OK)
}

/// Arguments of `ls`.
#[derive(Args, Debug)]
pub struct LsArgs {
    /// Snapshot: an ID or its prefix, "latest", "latest~N" (the Nth before
    /// it), or a time ("2026-11-20 14:00", local; a date alone is the end
    /// of that day): the newest snapshot at or before it.
    snapshot: String,
    /// Only list below this path of the snapshot.
    path: Option<String>,
    /// Show mode, size and modification time.
    #[arg(short, long)]
    long: bool,
}

fn root_of(s: &capsule_format::snapshot::Snapshot) -> Result<BlobId> {
    s.tree
        .parse()
        .map_err(|_| EngineError::corrupt("snapshot", "bad tree id").into())
}

pub fn ls(g: &GlobalArgs, out: &Output, a: LsArgs) -> Result<u8> {
    let (repo, _) = open(g, out)?;
    let (_, snap) = resolve(&repo, out, &a.snapshot)?;
    let (mut index, _) = repo.load_index()?;
    capsule_engine::prune::add_marked_packs(&repo, &mut index)?;
    let mut root = root_of(&snap)?;
    let base = treewalk::snapshot_path(a.path.as_deref().unwrap_or("/"));
    let mut items = Vec::new();
    if base != std::path::Path::new("/") {
        let n = treewalk::find(&repo, &index, &root, &base)?
            .ok_or_else(|| EngineError::PathNotFound(base.display().to_string()))?;
        let is_dir = n.kind() == NodeKind::Dir;
        items.push((base.clone(), n.clone()));
        match (is_dir, n.subtree) {
            (true, Some(sub)) => root = sub,
            _ => root = BlobId::default(),
        }
    }
    let mut print =
        |p: &std::path::Path, n: &capsule_format::tree::Node| -> capsule_engine::Result<()> {
            items.push((p.to_path_buf(), n.clone()));
            Ok(())
        };
    if root != BlobId::default() {
        let mut budget = treewalk::Budget::new(treewalk::entry_budget(&snap));
        treewalk::walk(&repo, &index, &root, &base, &mut budget, &mut print)?;
    }
    if out.json {
        let v: Vec<_> = items
            .iter()
            .map(|(p, n)| {
                serde_json::json!({
                    "path": p.to_string_lossy(),
                    "type": n.kind().as_str(),
                    "size": n.size,
                    "mode": format!("{:o}", n.mode),
                    "uid": n.uid, "gid": n.gid,
                    "mtime": n.mtime.secs, "mtime_nsec": n.mtime.nanos,
                })
            })
            .collect();
        out.json(&v);
    } else {
        for (p, n) in &items {
            if a.long {
                out.result(format!(
                    "{:<8} {:>5o} {:>6} {:>6} {:>12} {}  {}",
                    n.kind().as_str(),
                    n.mode,
                    n.uid,
                    n.gid,
                    n.size,
                    capsule_engine::timefmt::rfc3339(n.mtime.secs),
                    p.to_string_lossy()
                ));
            } else {
                out.result(p.to_string_lossy());
            }
        }
    }
    Ok(exit::OK)
}

/// Arguments of `restore`.
#[derive(Args, Debug)]
pub struct RestoreArgs {
    /// Snapshot: an ID or its prefix, "latest", "latest~N" (the Nth before
    /// it), or a time ("2026-11-20 14:00", local; a date alone is the end
    /// of that day): the newest snapshot at or before it.
    /// With --version: the path whose version to restore.
    #[arg(required_unless_present = "at", value_name = "SNAPSHOT|PATH")]
    snapshot: Option<String>,
    /// Restore the newest snapshot at or before this time (as for
    /// SNAPSHOT), instead of naming one.
    #[arg(long, value_name = "TIME", conflicts_with_all = ["snapshot", "version"])]
    at: Option<String>,
    /// Restore version N of the path given instead of a snapshot, as
    /// `capsule versions PATH` numbers them, from the newest snapshot
    /// holding it.
    #[arg(long, value_name = "N")]
    version: Option<usize>,
    /// Directory to restore into; snapshot paths are recreated below it.
    #[arg(short, long)]
    target: PathBuf,
    /// Only restore entries matching this glob, with everything below them
    /// (a pattern with "/" matches the full snapshot path, one without matches names).
    #[arg(short, long = "include", value_name = "PATTERN")]
    includes: Vec<String>,
    /// Skip entries matching this glob, with everything below them.
    #[arg(short, long = "exclude", value_name = "PATTERN")]
    excludes: Vec<String>,
    /// What to do with a file already in the target: if-changed keeps one
    /// whose size and mtime (with --verify: content) match the snapshot, so
    /// restoring again, or after an interrupted restore, fetches only what
    /// differs; if-newer also keeps files newer than the snapshot's.
    #[arg(long, value_enum, default_value_t = OverwriteArg::IfChanged)]
    overwrite: OverwriteArg,
    /// Remove files and directories the snapshot does not have, so what was
    /// backed up equals the snapshot again. Only inside the snapshot's
    /// source paths (and inside --include paths when given): never in the
    /// directories above a source or beside it, so restoring a snapshot of
    /// /home/me/Documents with --target / touches nothing else. A snapshot
    /// whose source is / puts the whole target in scope. Excluded names are
    /// left alone. Try it with --dry-run first.
    #[arg(long)]
    delete: bool,
    /// Change nothing: say how many files would be restored and list every
    /// entry --delete would remove.
    #[arg(long)]
    dry_run: bool,
    /// Compare files already in the target by content, and read back every
    /// file written to check it against the snapshot.
    #[arg(long)]
    verify: bool,
}

/// `restore --overwrite` values.
#[derive(clap::ValueEnum, Clone, Copy, Debug)]
pub enum OverwriteArg {
    Always,
    IfChanged,
    IfNewer,
    Never,
}

impl From<OverwriteArg> for capsule_engine::restore::Overwrite {
    fn from(o: OverwriteArg) -> Self {
        use capsule_engine::restore::Overwrite as O;
        match o {
            OverwriteArg::Always => O::Always,
            OverwriteArg::IfChanged => O::IfChanged,
            OverwriteArg::IfNewer => O::IfNewer,
            OverwriteArg::Never => O::Never,
        }
    }
}

/// A session held while a command of `kind` reads the repository, as a
/// backup's is while it writes: a prune meanwhile then keeps the packs it
/// marks until the session ends, rather than delete data being read. A
/// destination this user may only read gets none, and the user is told
/// `risk`.
pub(crate) fn reading_session(
    repo: &Arc<Repository>,
    out: &Output,
    kind: &str,
    risk: &str,
) -> Option<capsule_engine::session::Session> {
    match capsule_engine::session::Session::start_kind(repo, kind) {
        Ok(s) => Some(s),
        Err(e) => {
            out.warn(format!("no session could be written ({e}); {risk}"));
            None
        }
    }
}

pub fn restore(g: &GlobalArgs, out: &Output, a: RestoreArgs) -> Result<u8> {
    let (repo, _) = open(g, out)?;
    let repo = Arc::new(repo);
    // Held like a backup's, so that a prune meanwhile (which now sweeps at
    // once when no session is held) waits for this restore before it
    // deletes packs of a snapshot forgotten while it is being read. A
    // destination this user may only read gets none.
    let _session = (!a.dry_run).then(|| {
        reading_session(
            &repo,
            out,
            "restore",
            "a prune running meanwhile may delete data this restore is reading",
        )
    });
    let mut includes = a.includes;
    let spec = match (a.version, a.at, a.snapshot) {
        (Some(n), _, Some(path)) => {
            let (id, path) = version_snapshot(&repo, out, &path, n)?;
            if !includes.is_empty() {
                return Err(UsageError(
                    "--version restores one path: give no --include beside it".into(),
                )
                .into());
            }
            includes.push(capsule_engine::restore::literal_pattern(&path));
            id
        }
        (None, Some(at), _) => at,
        (None, None, Some(s)) => s,
        (Some(_), _, None) | (None, None, None) => {
            return Err(
                UsageError("name a snapshot, a --at time, or a PATH with --version".into()).into(),
            )
        }
    };
    let (id, snap) = resolve(&repo, out, &spec)?;
    if a.delete {
        // Snapshot paths are kept as text; one that was not UTF-8 is kept
        // with U+FFFD in place of its bad bytes and matches no directory
        // restored under its real name. Matching it loosely could reach a
        // sibling whose name differs only there, so it is left out of the
        // deletion, and the user is told.
        for p in snap.paths.iter().filter(|p| p.contains('\u{FFFD}')) {
            out.warn(format!(
                "--delete: the source path {p:?} is not valid UTF-8 in this snapshot; nothing below it is deleted (remove what the snapshot does not hold there by hand)"
            ));
        }
    }
    // Then the restore did less than asked: it says so in its exit code.
    let delete_skipped = a.delete && snap.paths.iter().any(|p| p.contains('\u{FFFD}'));
    let (mut index, bad) = repo.load_index()?;
    capsule_engine::prune::add_marked_packs(&repo, &mut index)?;
    for e in &bad {
        out.warn(format!("{e} (blobs it lists are unavailable)"));
    }
    let progress = Arc::new(Progress::default());
    let bar = out.progress(&progress, "restore");
    let opts = RestoreOptions {
        target: a.target.clone(),
        includes,
        excludes: a.excludes,
        max_entries: treewalk::entry_budget(&snap),
        connections: 0,
        overwrite: a.overwrite.into(),
        delete: a.delete,
        sources: snap.paths.iter().map(PathBuf::from).collect(),
        dry_run: a.dry_run,
        verify: a.verify,
        files_per_batch: 0,
    };
    let r = capsule_engine::restore::restore(&repo, &index, &root_of(&snap)?, &opts, &progress);
    drop(bar);
    let r = r?;
    for w in &r.errors {
        out.warn(format!("{}: {}", w.path, w.message));
    }
    if out.json {
        let mut v = serde_json::to_value(&r)?;
        v["destination"] = settings::destination_json();
        out.json(&v);
    }
    for d in &r.deleted_paths {
        let what = if r.dry_run { "would delete" } else { "deleted" };
        match d.entries {
            1 => out.say(format!("{what} {}", d.path)),
            n => out.say(format!("{what} {} ({n} entries)", d.path)),
        }
    }
    if r.dry_run {
        out.say(format!(
            "dry run, nothing changed: would restore {} files ({}), {} dirs, {} others into {}; {} files already there unchanged, {} kept by --overwrite; would delete {} entries",
            r.files,
            bytes(r.bytes),
            r.dirs,
            r.others,
            a.target.display(),
            r.unchanged,
            r.kept,
            r.deleted
        ));
        return Ok(if delete_skipped {
            exit::INCOMPLETE
        } else {
            exit::OK
        });
    }
    out.say(format!(
        "restored snapshot {} to {}: {} files, {} dirs, {} others, {} in {:.2}s",
        id.short(),
        a.target.display(),
        r.files,
        r.dirs,
        r.others,
        bytes(r.bytes),
        r.duration_secs
    ));
    let mut also = Vec::new();
    if r.unchanged > 0 {
        also.push(format!("{} files already there unchanged", r.unchanged));
    }
    if r.kept > 0 {
        also.push(format!("{} entries kept (--overwrite)", r.kept));
    }
    if r.deleted > 0 {
        also.push(format!("{} entries deleted (--delete)", r.deleted));
    }
    if r.leftovers_removed > 0 {
        also.push(format!(
            "{} incomplete files of an interrupted restore removed",
            r.leftovers_removed
        ));
    }
    if a.verify {
        also.push(format!("{} files verified", r.verified));
    }
    if !also.is_empty() {
        out.say(also.join(", "));
    }
    let f = &r.fetch;
    if f.requests > 0 {
        out.say(format!(
            "fetched {} in {} requests from {} of {} packs ({} needed), {} at once",
            bytes(f.bytes_fetched),
            f.requests,
            f.packs,
            f.packs_in_repository,
            bytes(f.bytes_needed),
            f.workers
        ));
        out.say(format!(
            "bound: {} ({})",
            serde_json::to_value(&f.bound.kind)?
                .as_str()
                .unwrap_or("?")
                .replace('_', " "),
            f.bound.evidence
        ));
    }
    if r.errors.is_empty() && delete_skipped {
        eprintln!(
            "capsule: restore incomplete: --delete left a source that is not valid UTF-8 untouched (named above)"
        );
        Ok(exit::INCOMPLETE)
    } else if r.errors.is_empty() {
        Ok(exit::OK)
    } else {
        eprintln!(
            "capsule: restore incomplete: {} entries failed (listed above)",
            r.errors.len()
        );
        Ok(exit::INCOMPLETE)
    }
}

/// Arguments of `check`.
#[derive(Args, Debug)]
pub struct CheckArgs {
    /// Also read and authenticate every byte of every pack.
    #[arg(long)]
    pub(crate) read_data: bool,
}

pub fn check(g: &GlobalArgs, out: &Output, a: CheckArgs) -> Result<u8> {
    let opened = open_uncached(g, out)?;
    let cache_dir = opened.cache_dir().map(PathBuf::from);
    let repo = Arc::new(opened.repo);
    // Held like a backup's, so that a prune running meanwhile does not
    // delete packs this check is about to read. A destination this user may
    // only read gets none, and a prune could then race the check.
    let session = reading_session(
        &repo,
        out,
        "check",
        "a prune running meanwhile may make this check report packs it deleted",
    );
    let progress = Arc::new(Progress::default());
    let bar = if a.read_data {
        out.progress(&progress, "check")
    } else {
        None
    };
    let r = capsule_engine::check::check(&repo, a.read_data, &progress);
    drop(bar);
    drop(session);
    let r = r?;
    // The next backup must not reuse what this check found lost.
    if let Some(dir) = cache_dir {
        if let Err(e) = capsule_access::open::write_damaged_packs(&dir, &r.damaged_packs) {
            out.warn(format!(
                "cannot record the damaged packs in {}: {e}; run the next backup with --force so it does not reuse them",
                dir.display()
            ));
        }
    }
    out.json(&serde_json::json!({ "ok": r.ok(), "report": r, "destination": settings::destination_json() }));
    out.say(format!(
        "checked {} snapshots, {} trees, {} packs{}",
        r.snapshots,
        r.trees,
        r.packs,
        if a.read_data {
            format!(", read {} blobs ({})", r.blobs_read, bytes(r.bytes_read))
        } else {
            String::new()
        }
    ));
    let index_damaged = r
        .problems
        .iter()
        .any(|p| p.object.starts_with("index/") || p.problem.contains("not in any index"));
    if !r.unindexed_packs.is_empty() && !index_damaged {
        out.say(format!(
            "{} packs are not indexed (left by an interrupted backup; a later prune reclaims them)",
            r.unindexed_packs.len()
        ));
    }
    if r.ok() {
        out.say("no errors found");
        return Ok(exit::OK);
    }
    if !out.json {
        let unused = |p: &capsule_engine::check::Problem| {
            p.affected.is_empty()
                && (p.object.starts_with("data/") || p.object.starts_with("tree/"))
        };
        for p in &r.problems {
            eprintln!("damaged: {}: {}", p.object, p.problem);
            if unused(p) {
                eprintln!(
                    "  no snapshot uses it (what used it was forgotten, or dropped by `repair snapshots`); `capsule prune` takes it out of the index"
                );
            }
            for f in p.affected.iter().take(20) {
                eprintln!("  affects {f}");
            }
            if p.affected.len() > 20 {
                eprintln!("  ... and {} more", p.affected.len() - 20);
            }
        }
        if r.problems.iter().all(unused) {
            eprintln!(
                "capsule: check found {} missing or damaged packs that no snapshot uses: every snapshot restores in full; run `capsule prune` to take them out of the index",
                r.problems.len()
            );
        } else {
            eprintln!(
                "capsule: check found {} damaged objects; files not listed above still restore",
                r.problems.len()
            );
        }
        if index_damaged && !r.unindexed_packs.is_empty() {
            eprintln!(
                "  hint: {} packs are on the destination but in no index; `capsule repair index` rebuilds the index from them",
                r.unindexed_packs.len()
            );
        } else if index_damaged {
            eprintln!(
                "  hint: `capsule repair index` rebuilds the index from the packs' own headers"
            );
        }
        if !r.damaged_packs.is_empty() {
            eprintln!(
                "  the next backup stores the lost data again where the files still exist (recorded in the cache; use --force on other machines)"
            );
        }
    }
    Ok(exit::DAMAGED)
}

/// Arguments of `diff`.
#[derive(Args, Debug)]
pub struct DiffArgs {
    /// Older snapshot (an ID or prefix, "latest", "latest~N", or a time).
    a: String,
    /// Newer snapshot (as the older).
    b: String,
}

pub fn diff(g: &GlobalArgs, out: &Output, a: DiffArgs) -> Result<u8> {
    let (repo, _) = open(g, out)?;
    let (_, sa) = resolve(&repo, out, &a.a)?;
    let (_, sb) = resolve(&repo, out, &a.b)?;
    let (mut index, _) = repo.load_index()?;
    capsule_engine::prune::add_marked_packs(&repo, &mut index)?;
    let mut budget = treewalk::Budget::new(
        treewalk::entry_budget(&sa).saturating_add(treewalk::entry_budget(&sb)),
    );
    let d = capsule_engine::diff::diff(&repo, &index, &root_of(&sa)?, &root_of(&sb)?, &mut budget)?;
    out.json(&d);
    for e in &d {
        out.result(format!("{}  {}", e.change, e.path));
    }
    let count = |c: char| d.iter().filter(|e| e.change == c).count();
    out.say(format!(
        "{} added, {} removed, {} modified, {} metadata only, {} type changed",
        count('+'),
        count('-'),
        count('M'),
        count('U'),
        count('T')
    ));
    Ok(exit::OK)
}

pub fn stats(g: &GlobalArgs, out: &Output) -> Result<u8> {
    let (repo, loc) = open(g, out)?;
    let (index, _) = repo.load_index()?;
    let s = capsule_engine::stats::stats(&repo, &index)?;
    out.json(&s);
    out.result(format!("repository      {}", loc.display()));
    out.result(format!("snapshots       {}", s.snapshots));
    out.result(format!(
        "stored          {} in {} packs, {} index files",
        bytes(s.pack_bytes),
        s.packs,
        s.index_files
    ));
    out.result(format!(
        "unique data     {} in {} data blobs, {} tree blobs",
        bytes(s.unique_bytes),
        s.data_blobs,
        s.tree_blobs
    ));
    out.result(format!(
        "all snapshots   {} of files",
        bytes(s.logical_bytes)
    ));
    out.result(format!(
        "space saving    {:.2}x (dedup and compression)",
        s.space_saving_ratio
    ));
    Ok(exit::OK)
}

/// `key` subcommands.
#[derive(Subcommand, Debug)]
pub enum KeyCommand {
    /// Add another password.
    Add {
        /// Read the new password from this file instead of prompting.
        #[arg(long)]
        new_password_file: Option<PathBuf>,
    },
    /// List keys.
    List,
    /// Remove a key (not the one in use).
    Remove {
        /// Key ID or prefix.
        id: String,
    },
    /// Change the password in use (adds a new key, removes the old one).
    Passwd {
        /// Read the new password from this file instead of prompting.
        #[arg(long)]
        new_password_file: Option<PathBuf>,
    },
}

fn read_new_password(f: &Option<PathBuf>) -> Result<Vec<u8>> {
    match f {
        Some(f) => {
            let mut s = std::fs::read(f).with_context(|| format!("reading {}", f.display()))?;
            while matches!(s.last(), Some(b'\n' | b'\r')) {
                s.pop();
            }
            Ok(s)
        }
        None => settings::prompt_new("new password"),
    }
}

pub fn key(g: &GlobalArgs, out: &Output, k: KeyCommand) -> Result<u8> {
    let (mut repo, loc) = open(g, out)?;
    match k {
        KeyCommand::Add { new_password_file } => {
            let pw = read_new_password(&new_password_file)?;
            let id = repo.add_key(&pw, KdfParams::default())?;
            out.json(&serde_json::json!({ "added": id.to_hex() }));
            out.say(format!("added key {}", id.short()));
        }
        KeyCommand::List => {
            let keys = repo.list_keys()?;
            out.json(&keys);
            for k in &keys {
                let short: String = k.id.chars().take(8).collect();
                match &k.damaged {
                    None => out.result(format!(
                        "{} {:<10} {} {}@{}",
                        if k.current { "*" } else { " " },
                        short,
                        k.created,
                        k.username,
                        k.hostname
                    )),
                    Some(why) => out.result(format!("  {short:<10} DAMAGED: {why}")),
                }
            }
        }
        KeyCommand::Remove { id } => {
            let removed = repo.remove_key(&id)?;
            out.json(&serde_json::json!({ "removed": removed }));
            out.say(format!(
                "removed key {}",
                removed.chars().take(8).collect::<String>()
            ));
        }
        KeyCommand::Passwd { new_password_file } => {
            let pw = read_new_password(&new_password_file)?;
            let id = repo.change_password(&pw, KdfParams::default())?;
            settings::access(g, &loc)?.remember_key(&repo);
            out.json(&serde_json::json!({ "key": id.to_hex() }));
            out.say(format!("password changed (new key {})", id.short()));
        }
    }
    Ok(exit::OK)
}

/// `repair` subcommands.
#[derive(Subcommand, Debug)]
pub enum RepairCommand {
    /// Rebuild the index from the packs' own headers: indexes every pack no
    /// intact index file lists, then removes the damaged index files.
    Index {
        /// Read and report, but write and delete nothing.
        #[arg(long)]
        dry_run: bool,
    },
    /// Rewrite snapshots that refer to missing data: drop the files (and
    /// directories) that are lost, name them, keep everything else. The
    /// damaged snapshots are set aside (`capsule unforget` brings one back).
    Snapshots {
        /// Report what would be dropped; write nothing.
        #[arg(long)]
        dry_run: bool,
    },
}

pub fn repair(g: &GlobalArgs, out: &Output, r: RepairCommand) -> Result<u8> {
    let dry_run = match r {
        RepairCommand::Index { dry_run } => dry_run,
        RepairCommand::Snapshots { dry_run } => return repair_snapshots(g, out, dry_run),
    };
    // The destination's truth, not the cache's.
    let repo = open_uncached(g, out)?.repo;
    let rep = capsule_engine::repair::repair_index(&repo, dry_run)?;
    if out.json {
        let mut v = serde_json::to_value(&rep)?;
        v["dry_run"] = serde_json::json!(dry_run);
        v["destination"] = settings::destination_json();
        out.json(&v);
    }
    out.say(format!(
        "{} packs on storage, {} in no intact index file; {}indexed {} of them ({} blobs)",
        rep.packs,
        rep.unindexed,
        if dry_run { "would have " } else { "" },
        rep.reindexed,
        rep.blobs
    ));
    for f in &rep.removed_index_files {
        out.say(format!(
            "{} damaged index file {f}",
            if dry_run { "would remove" } else { "removed" }
        ));
    }
    for (p, why) in &rep.unreadable_packs {
        out.warn(format!("{p}: not indexed: {why}"));
    }
    if rep.unreadable_packs.is_empty() {
        Ok(exit::OK)
    } else {
        eprintln!(
            "capsule: {} packs could not be read; their blobs stay unavailable (`capsule check` names the files affected)",
            rep.unreadable_packs.len()
        );
        Ok(exit::DAMAGED)
    }
}

fn repair_snapshots(g: &GlobalArgs, out: &Output, dry_run: bool) -> Result<u8> {
    let repo = open_uncached(g, out)?.repo;
    let rep = capsule_engine::repair::repair_snapshots(&Arc::new(repo), dry_run)?;
    if out.json {
        let mut v = serde_json::to_value(&rep)?;
        v["dry_run"] = serde_json::json!(dry_run);
        v["destination"] = settings::destination_json();
        out.json(&v);
        return Ok(exit::OK);
    }
    for r in &rep.repaired {
        out.result(format!(
            "snapshot {}: {} lost entr{}{}",
            &r.snapshot[..8],
            r.dropped.len(),
            if r.dropped.len() == 1 { "y" } else { "ies" },
            match (&r.replaced_by, dry_run) {
                (_, true) => " (dry run)".to_string(),
                (Some(n), false) => format!(", replaced by {} (tagged repaired)", &n[..8]),
                (None, false) => ", nothing left to keep: set aside".to_string(),
            }
        ));
        for d in &r.dropped {
            out.result(format!("  dropped {d}"));
        }
    }
    out.say(format!(
        "{} snapshots read, {} {}",
        rep.snapshots,
        rep.repaired.len(),
        if dry_run {
            "refer to missing data (dry run: nothing changed)"
        } else {
            "repaired; the originals are set aside until the next prune (`capsule snapshots --forgotten`), which takes the lost packs out of the index"
        }
    ));
    Ok(exit::OK)
}

/// Arguments of `versions`.
#[derive(Args, Debug)]
pub struct VersionsArgs {
    /// The file or directory, as it was backed up: an absolute path, or one
    /// relative to the current directory.
    path: PathBuf,
    /// Only snapshots made by this host.
    #[arg(long)]
    host: Option<String>,
}

/// `path` as snapshots store it: absolute, `.` and `..` taken out as the
/// shell would, symlinks left alone (a snapshot holds the link).
fn snapshot_path_of(path: &std::path::Path) -> Result<PathBuf> {
    let abs =
        std::path::absolute(path).map_err(|e| UsageError(format!("{}: {e}", path.display())))?;
    let mut clean = PathBuf::from("/");
    for c in abs.components() {
        match c {
            std::path::Component::ParentDir => {
                clean.pop();
            }
            std::path::Component::Normal(n) => clean.push(n),
            _ => {}
        }
    }
    Ok(clean)
}

/// The snapshots to look in, oldest first; damaged ones are warned about.
fn snapshots_for_versions(
    repo: &Repository,
    out: &Output,
    host: Option<&str>,
) -> Result<Vec<(capsule_format::ObjectId, capsule_format::snapshot::Snapshot)>> {
    let (snaps, bad) = repo.list_snapshots()?;
    for e in &bad {
        out.warn(format!("{e} (its versions are not shown)"));
    }
    Ok(snaps
        .into_iter()
        .filter(|(_, s)| host.is_none_or(|h| s.hostname == h))
        .collect())
}

pub fn versions(g: &GlobalArgs, out: &Output, a: VersionsArgs) -> Result<u8> {
    let (repo, _) = open(g, out)?;
    let path = snapshot_path_of(&a.path)?;
    let snaps = snapshots_for_versions(&repo, out, a.host.as_deref())?;
    let (mut index, _) = repo.load_index()?;
    capsule_engine::prune::add_marked_packs(&repo, &mut index)?;
    let v = capsule_engine::versions::versions(&repo, &index, &snaps, &path)?;
    for d in &v.damaged {
        out.warn(format!("{d}: its version of {} is not known", v.path));
    }
    if out.json {
        out.json(&v);
    } else {
        let held = v.timeline.iter().filter(|h| h.version.is_some()).count();
        out.result(format!(
            "{}: {} version{} in {held} of {} snapshots",
            v.path,
            v.versions.len(),
            if v.versions.len() == 1 { "" } else { "s" },
            v.timeline.len()
        ));
        out.result(format!(
            "{:>3}  {:<8} {:>10}  {:<20}  {:<20}  {:<20}  {:>5}",
            "#", "type", "size", "modified", "first seen", "last seen", "snaps"
        ));
        for x in &v.versions {
            out.result(format!(
                "{:>3}  {:<8} {:>10}  {:<20}  {:<20}  {:<20}  {:>5}",
                x.number,
                x.kind,
                crate::output::bytes(x.size),
                capsule_engine::timefmt::rfc3339(x.mtime),
                x.first_time,
                x.last_time,
                x.snapshots
            ));
        }
        // Where it was absent between versions: deleted, then back.
        let gaps = v
            .timeline
            .windows(2)
            .filter(|w| w[0].version.is_some() && w[1].version.is_none())
            .count();
        if gaps > 0 {
            out.result(format!(
                "absent from {} snapshot(s) in between (deleted, then back); `--json` has each snapshot's version",
                v.timeline.iter().filter(|h| h.version.is_none()).count()
            ));
        }
        out.result(format!(
            "restore one with: capsule restore --version N {} --target DIR",
            shell_quote(&v.path)
        ));
    }
    // Some snapshots could not be looked in: the answer is partial.
    Ok(if v.damaged.is_empty() {
        exit::OK
    } else {
        exit::INCOMPLETE
    })
}

/// Quotes `s` for a POSIX shell when it needs it.
fn shell_quote(s: &str) -> String {
    if s.bytes()
        .all(|b| b.is_ascii_alphanumeric() || b"/._-+:@%,".contains(&b))
    {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', "'\\''"))
    }
}

/// The newest snapshot holding version `n` of `path`, and the path as
/// stored, for `restore --version`.
fn version_snapshot(
    repo: &Repository,
    out: &Output,
    path: &str,
    n: usize,
) -> Result<(String, String)> {
    let path = snapshot_path_of(std::path::Path::new(path))?;
    let Some(text) = path.to_str().map(str::to_string) else {
        return Err(UsageError(format!(
            "{}: --version takes a path in UTF-8; restore this one with --include and a pattern",
            path.display()
        ))
        .into());
    };
    let snaps = snapshots_for_versions(repo, out, None)?;
    let (mut index, _) = repo.load_index()?;
    capsule_engine::prune::add_marked_packs(repo, &mut index)?;
    let v = capsule_engine::versions::versions(repo, &index, &snaps, &path)?;
    let Some(x) = n.checked_sub(1).and_then(|i| v.versions.get(i)) else {
        return Err(UsageError(format!(
            "{text} has {} version(s) (`capsule versions {}`); there is no version {n}",
            v.versions.len(),
            shell_quote(&text)
        ))
        .into());
    };
    Ok((x.last_snapshot.clone(), text))
}
