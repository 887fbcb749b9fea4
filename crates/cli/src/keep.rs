//! A retention policy on the command line, shared by `forget` (which
//! removes what the policy does not keep) and `copy` (which copies what it
//! keeps).

use capsule_engine::retention::{self, GroupBy, Limit, Period, Policy};
use clap::{Args, ValueEnum};
use jiff::Span;

/// Named policies.
#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum NamedPolicy {
    /// Every snapshot of the last 24 hours, one a day for 30 days, one a
    /// week for as long as space allows (as Time Machine does).
    Timemachine,
}

/// A retention policy on the command line: `forget` removes what it does
/// not keep, `copy` copies what it keeps.
#[derive(Args, Debug, Default)]
pub struct KeepArgs {
    /// Start from a named policy (further --keep-* options add to it).
    #[arg(long, value_enum)]
    policy: Option<NamedPolicy>,
    /// Keep the newest N snapshots.
    #[arg(long, value_name = "N")]
    keep_last: Option<u32>,
    /// Keep the newest snapshot of each of the last N hours that have one ("all": every hour).
    #[arg(long, value_name = "N|all", value_parser = parse_count)]
    keep_hourly: Option<Limit>,
    /// Keep the newest snapshot of each of the last N days that have one.
    #[arg(long, value_name = "N|all", value_parser = parse_count)]
    keep_daily: Option<Limit>,
    /// Keep the newest snapshot of each of the last N ISO weeks that have one.
    #[arg(long, value_name = "N|all", value_parser = parse_count)]
    keep_weekly: Option<Limit>,
    /// Keep the newest snapshot of each of the last N months that have one.
    #[arg(long, value_name = "N|all", value_parser = parse_count)]
    keep_monthly: Option<Limit>,
    /// Keep the newest snapshot of each of the last N years that have one.
    #[arg(long, value_name = "N|all", value_parser = parse_count)]
    keep_yearly: Option<Limit>,
    /// Keep every snapshot younger than DURATION (24h, 30d, 2w, 6mo, 1y), counted from now.
    #[arg(long, value_name = "DURATION", value_parser = retention::parse_span)]
    keep_within: Option<Span>,
    /// Keep one snapshot per hour younger than DURATION.
    #[arg(long, value_name = "DURATION", value_parser = retention::parse_span)]
    keep_within_hourly: Option<Span>,
    /// Keep one snapshot per day younger than DURATION.
    #[arg(long, value_name = "DURATION", value_parser = retention::parse_span)]
    keep_within_daily: Option<Span>,
    /// Keep one snapshot per week younger than DURATION.
    #[arg(long, value_name = "DURATION", value_parser = retention::parse_span)]
    keep_within_weekly: Option<Span>,
    /// Keep one snapshot per month younger than DURATION.
    #[arg(long, value_name = "DURATION", value_parser = retention::parse_span)]
    keep_within_monthly: Option<Span>,
    /// Keep one snapshot per year younger than DURATION.
    #[arg(long, value_name = "DURATION", value_parser = retention::parse_span)]
    keep_within_yearly: Option<Span>,
    /// Keep every snapshot with this tag (repeatable).
    #[arg(long, value_name = "TAG")]
    keep_tag: Vec<String>,
}

fn parse_count(s: &str) -> Result<Limit, String> {
    match s {
        "all" | "unlimited" => Ok(Limit::Unlimited),
        _ => match s.parse::<u32>() {
            Ok(0) | Err(_) => Err(format!(
                "{s:?} is not a count: give a number from 1, or \"all\""
            )),
            Ok(n) => Ok(Limit::Count(n)),
        },
    }
}

pub fn parse_group_by(s: &str) -> Result<GroupBy, String> {
    let mut g = GroupBy {
        host: false,
        paths: false,
    };
    for part in s.split(',').map(str::trim) {
        match part {
            "host" => g.host = true,
            "paths" => g.paths = true,
            "none" | "" => {}
            other => {
                return Err(format!(
                    "cannot group by {other:?}: use host, paths, host,paths or none"
                ))
            }
        }
    }
    Ok(g)
}

impl KeepArgs {
    /// The policy these options give (empty when none is given).
    pub fn policy(&self) -> Policy {
        let mut p = match self.policy {
            Some(NamedPolicy::Timemachine) => Policy::timemachine(),
            None => Policy::default(),
        };
        if self.keep_last.is_some() {
            p.last = self.keep_last;
        }
        let counts = [
            &self.keep_hourly,
            &self.keep_daily,
            &self.keep_weekly,
            &self.keep_monthly,
            &self.keep_yearly,
        ];
        let windows = [
            &self.keep_within_hourly,
            &self.keep_within_daily,
            &self.keep_within_weekly,
            &self.keep_within_monthly,
            &self.keep_within_yearly,
        ];
        for (i, period) in Period::ALL.into_iter().enumerate() {
            if let Some(l) = counts[i] {
                p.buckets.push((period, l.clone()));
            }
            if let Some(w) = windows[i] {
                p.buckets.push((period, Limit::Within(*w)));
            }
        }
        if self.keep_within.is_some() {
            p.within = self.keep_within;
        }
        p.tags.extend(self.keep_tag.iter().cloned());
        p
    }
}
