//! `capsule restore` and `capsule versions`: getting files back, whole
//! snapshots or one version of a path.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Result;
use capsule_app::{Settings, UsageError};
use capsule_engine::progress::Progress;
use capsule_engine::restore::RestoreOptions;
use capsule_engine::{treewalk, Repository};
use clap::Args;

use crate::exit;
use crate::output::{bytes, Output};
use crate::repo::{open, reading_session, resolve, root_of};

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

pub fn restore(settings: &Settings, out: &Output, a: RestoreArgs) -> Result<u8> {
    let (repo, _) = open(settings, out)?;
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
        target_dir: None,
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
        v["destination"] = capsule_app::open::destination_json();
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

pub fn versions(settings: &Settings, out: &Output, a: VersionsArgs) -> Result<u8> {
    let (repo, _) = open(settings, out)?;
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
