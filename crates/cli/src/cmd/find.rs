//! `capsule find`: a file by name (or path pattern) across snapshots.

use anyhow::Result;
use capsule_app::Settings;
use capsule_engine::find::{find as search, Pattern};
use clap::Args;

use crate::exit;
use crate::output::{bytes, Output};
use crate::repo::open;

/// Arguments of `find`.
#[derive(Args, Debug)]
#[command(after_help = "\
A pattern without \"/\" matches a file or directory name (\"*.pdf\", \"report-202?.ods\"); \
one with \"/\" matches the whole path (\"/home/*/Documents/**/*.ods\": \"*\" stays within a \
name, \"**\" crosses directories). Each path found is listed with its distinct versions, \
newest first, and the snapshots holding each.")]
pub struct FindArgs {
    /// What to look for (several: any of them).
    #[arg(required = true, value_name = "PATTERN")]
    patterns: Vec<String>,
    /// Match without regard to case.
    #[arg(short = 'i', long)]
    ignore_case: bool,
    /// At most N versions of each path, the newest.
    #[arg(long, value_name = "N")]
    newest: Option<usize>,
    #[command(flatten)]
    filter: crate::filter::FilterArgs,
}

pub fn find(settings: &Settings, out: &Output, a: FindArgs) -> Result<u8> {
    let patterns = a
        .patterns
        .iter()
        .map(|p| Pattern::new(p, a.ignore_case))
        .collect::<capsule_engine::Result<Vec<_>>>()?;
    let (repo, _) = open(settings, out)?;
    let (snaps, bad) = repo.list_snapshots()?;
    for e in &bad {
        out.warn(format!("{e}; it is not searched"));
    }
    let snaps = a.filter.apply(snaps);
    let (mut index, _) = repo.load_index()?;
    capsule_engine::prune::add_marked_packs(&repo, &mut index)?;
    let r = search(&repo, &index, &snaps, &patterns, a.newest)?;
    for d in &r.damaged {
        out.warn(format!("snapshot {d}; it is not searched"));
    }
    let code = if r.damaged.is_empty() && bad.is_empty() {
        exit::OK
    } else {
        exit::INCOMPLETE
    };
    if out.json {
        out.json(&r);
        return Ok(code);
    }
    for f in &r.found {
        out.result(&f.path);
        for v in &f.versions {
            out.result(format!(
                "  {:<8} {:>10}  modified {}  in {} snapshot{} ({} .. {}, newest {})",
                v.kind,
                bytes(v.size),
                capsule_engine::timefmt::rfc3339(v.mtime),
                v.snapshots,
                if v.snapshots == 1 { "" } else { "s" },
                v.first_time,
                v.time,
                &v.snapshot[..8.min(v.snapshot.len())]
            ));
        }
        if f.more > 0 {
            out.result(format!("  … and {} older version(s)", f.more));
        }
    }
    out.say(format!(
        "{} path{} found in {} snapshots ({} trees read)",
        r.found.len(),
        if r.found.len() == 1 { "" } else { "s" },
        r.snapshots,
        r.trees_read
    ));
    Ok(code)
}
