//! `capsule diff` and `capsule stats`: comparing snapshots, and the
//! repository's numbers.

use anyhow::Result;
use capsule_app::Settings;
use capsule_engine::treewalk;
use clap::Args;

use crate::exit;
use crate::output::{bytes, Output};
use crate::repo::{open, resolve, root_of};

/// Arguments of `diff`.
#[derive(Args, Debug)]
pub struct DiffArgs {
    /// Older snapshot (an ID or prefix, "latest", "latest~N", or a time).
    a: String,
    /// Newer snapshot (as the older).
    b: String,
}

pub fn diff(settings: &Settings, out: &Output, a: DiffArgs) -> Result<u8> {
    let (repo, _) = open(settings, out)?;
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

pub fn stats(settings: &Settings, out: &Output) -> Result<u8> {
    let (repo, loc) = open(settings, out)?;
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
