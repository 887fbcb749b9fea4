//! `capsule rewrite`: take paths out of snapshots already made.

use std::sync::Arc;

use anyhow::Result;
use capsule_app::error::UsageError;
use capsule_app::Settings;
use capsule_engine::backup::{ExcludeRules, Excludes};
use clap::Args;

use crate::exit;
use crate::output::Output;
use crate::repo::open;

/// Arguments of `rewrite`.
#[derive(Args, Debug)]
#[command(after_help = "\
Each snapshot holding an excluded path is written anew without it (same time, host, paths \
and tags; `original` names the snapshot it replaces), and the original is set aside in \
forgotten/ (unless --keep-original). The data stays until a prune: `capsule prune \
--max-unused 0` afterwards removes it from every pack. Patterns are those of `backup \
--exclude` (gitignore syntax, matched against the path in the snapshot).")]
pub struct RewriteArgs {
    /// Snapshots: IDs or prefixes, `latest`, `latest~N`, or a time.
    /// None: every snapshot the filters pass.
    ids: Vec<String>,
    /// Take out paths matching this pattern (repeatable).
    #[arg(short, long = "exclude", value_name = "PATTERN")]
    excludes: Vec<String>,
    /// Read patterns from a file, one a line (# comments skipped).
    #[arg(long, value_name = "FILE")]
    exclude_file: Vec<std::path::PathBuf>,
    /// Take out paths matching this pattern whatever its case.
    #[arg(long = "iexclude", value_name = "PATTERN")]
    iexcludes: Vec<String>,
    /// Take out files larger than this (e.g. 2G).
    #[arg(long, value_name = "SIZE", value_parser = capsule_app::config::parse_size)]
    exclude_larger_than: Option<u64>,
    #[command(flatten)]
    filter: crate::filter::FilterArgs,
    /// Keep the original snapshots beside the new ones.
    #[arg(long)]
    keep_original: bool,
    /// List what would be taken out of which snapshot; change nothing.
    #[arg(short = 'n', long)]
    dry_run: bool,
}

pub fn rewrite(settings: &Settings, out: &Output, a: RewriteArgs) -> Result<u8> {
    let more = crate::excludes::ExcludeArgs {
        exclude_file: a.exclude_file.clone(),
        ..Default::default()
    };
    let mut patterns = a.excludes.clone();
    patterns.extend(more.file_patterns()?);
    if patterns.is_empty() && a.iexcludes.is_empty() && a.exclude_larger_than.is_none() {
        return Err(UsageError(
            "say what to take out: --exclude PATTERN, --exclude-file FILE, --iexclude PATTERN or --exclude-larger-than SIZE".into(),
        )
        .into());
    }
    let excludes = Excludes::new(&patterns, None, Vec::new())?.with_rules(&ExcludeRules {
        iexcludes: a.iexcludes.clone(),
        larger_than: a.exclude_larger_than,
        ..Default::default()
    })?;
    let (repo, _) = open(settings, out)?;
    let repo = Arc::new(repo);
    let (snaps, bad) = repo.list_snapshots()?;
    for e in &bad {
        out.warn(format!("{e}; it is not rewritten (exit 3)"));
    }
    let snaps = a.filter.apply(snaps);
    let mut picked = std::collections::BTreeSet::new();
    for spec in &a.ids {
        picked.insert(capsule_engine::Repository::pick_named(snaps.clone(), spec)?.0);
    }
    let chosen: Vec<_> = snaps
        .into_iter()
        .filter(|(id, _)| a.ids.is_empty() || picked.contains(id))
        .collect();
    let r =
        capsule_engine::rewrite::rewrite(&repo, &chosen, &excludes, a.dry_run, a.keep_original)?;
    if out.json {
        out.json(&r);
    } else {
        for x in &r.rewritten {
            out.result(format!(
                "snapshot {}{}: {} entr{} {}",
                &x.snapshot[..8],
                x.replaced_by
                    .as_ref()
                    .map(|n| format!(" -> {}", &n[..8]))
                    .unwrap_or_default(),
                x.removed_entries,
                if x.removed_entries == 1 { "y" } else { "ies" },
                if a.dry_run { "would go" } else { "taken out" }
            ));
            for d in x.removed.iter().take(20) {
                out.result(format!("  {d}"));
            }
            if x.removed.len() > 20 {
                out.result(format!("  … and {} more", x.removed.len() - 20));
            }
        }
        out.say(format!(
            "{} of {} snapshots {}{}",
            r.rewritten.len(),
            r.snapshots,
            if a.dry_run {
                "would be rewritten; nothing was changed"
            } else {
                "rewritten"
            },
            if !a.dry_run && !a.keep_original && !r.rewritten.is_empty() {
                "; the originals are in forgotten/ until a prune (`capsule prune --max-unused 0` gives all the space back)"
            } else {
                ""
            }
        ));
    }
    Ok(if bad.is_empty() {
        exit::OK
    } else {
        exit::INCOMPLETE
    })
}
