//! `capsule quota`: set, show or enforce the repository's quota.

use anyhow::Result;
use capsule_app::error::QuotaTooSmall;
use capsule_app::{Settings, UsageError};
use capsule_engine::retention::{self};
use jiff::Span;

use crate::exit;
use crate::output::{bytes, report_plan, Output};
use crate::repo::open;

/// `capsule quota`.
#[derive(clap::Subcommand, Debug)]
pub enum QuotaCommand {
    /// Show the quota and how much of it is used.
    Show,
    /// Set the quota: backups delete the oldest snapshots to stay within it.
    Set {
        /// Most space the repository's data may take (500G, 1.5T).
        #[arg(value_parser = capsule_app::config::parse_size)]
        size: u64,
        /// Never delete snapshots younger than this to make room.
        #[arg(long, value_name = "DURATION", default_value = "1h", value_parser = retention::parse_span)]
        min_age: Span,
    },
    /// Remove the quota.
    Clear,
    /// Delete the oldest snapshots now until the repository fits its quota.
    Enforce {
        /// Say which snapshots would go and what each frees; change nothing.
        #[arg(short = 'n', long)]
        dry_run: bool,
    },
}

fn span_secs(s: &Span) -> i64 {
    let now = jiff::Zoned::now();
    now.checked_sub(*s)
        .map(|then| now.timestamp().as_second() - then.timestamp().as_second())
        .unwrap_or(i64::MAX)
}

pub fn quota(settings: &Settings, out: &Output, q: QuotaCommand) -> Result<u8> {
    use capsule_engine::quota;
    let (repo, _) = open(settings, out)?;
    let repo = std::sync::Arc::new(repo);
    match q {
        QuotaCommand::Show => {
            let current = quota::load(&repo)?;
            let stored = quota::stored_bytes(&repo)?;
            if let Some(name) = &settings.flags.profile {
                capsule_app::status::record_size(
                    name,
                    capsule_app::status::RepoSize {
                        stored,
                        quota: current.map(|q| q.bytes),
                        as_of_unix: capsule_engine::timefmt::now_unix(),
                    },
                );
            }
            if out.json {
                out.json(&serde_json::json!({ "quota": current, "stored": stored }));
            } else {
                match current {
                    Some(c) => out.result(format!(
                        "quota {}, {} used ({:.0}%); snapshots younger than {} min are never deleted to make room",
                        bytes(c.bytes),
                        bytes(stored),
                        stored as f64 * 100.0 / c.bytes.max(1) as f64,
                        c.min_age_secs / 60
                    )),
                    None => out.result(format!("no quota; {} used", bytes(stored))),
                }
            }
        }
        QuotaCommand::Set { size, min_age } => {
            if size == 0 {
                return Err(UsageError(
                    "a quota of 0 bytes holds nothing; use `capsule quota clear`".into(),
                )
                .into());
            }
            let min_age = span_secs(&min_age);
            let plan = quota::plan(&repo, size, min_age)?;
            if !plan.fits {
                return Err(QuotaTooSmall(format!(
                    "a quota of {} cannot hold the snapshots that must stay (the newest of each source and those younger than the minimum age use {}); nothing was changed",
                    bytes(size),
                    bytes(plan.used_after)
                ))
                .into());
            }
            let q = quota::set(&repo, size, min_age)?;
            if out.json {
                out.json(&serde_json::json!({ "quota": q, "stored": plan.stored }));
            } else {
                out.result(format!(
                    "quota set to {} ({} used); backups delete the oldest snapshots to stay within it",
                    bytes(size),
                    bytes(plan.stored)
                ));
            }
        }
        QuotaCommand::Clear => {
            quota::set(&repo, 0, 0)?;
            out.say("quota cleared");
        }
        QuotaCommand::Enforce { dry_run } => {
            let Some(q) = quota::load(&repo)? else {
                return Err(UsageError(
                    "this repository has no quota (`capsule quota set 500G`)".into(),
                )
                .into());
            };
            let plan = quota::plan(&repo, q.bytes, q.min_age_secs)?;
            report_plan(out, &plan, dry_run);
            if dry_run || !plan.needed(q.bytes) {
                if out.json {
                    out.json(&serde_json::json!({ "dry_run": dry_run, "plan": plan }));
                }
                return Ok(exit::OK);
            }
            let r = quota::thin(&repo, plan)?;
            if out.json {
                out.json(&serde_json::json!({ "dry_run": false, "thin": r }));
            } else {
                out.say(format!("{} stored now", bytes(r.stored_after)));
            }
        }
    }
    Ok(exit::OK)
}
