//! Retention: which snapshots a policy keeps.
//!
//! [`plan`] is a pure function of the snapshots, the current time, the time
//! zone and the policy, so every rule can be checked by table tests (time
//! zones, daylight-saving changes, clocks that ran ahead) without a
//! repository.
//!
//! The rules, as restic has them, with two differences users asked for:
//! * **Windows count from now.** `--keep-within 24h` keeps what is younger
//!   than 24 hours *now*; restic counts from the newest snapshot, so a
//!   machine that stopped backing up keeps its last day forever while the
//!   user believes old data is gone.
//! * **A snapshot dated in the future is kept and said so**, never counted
//!   into a bucket: it comes from a clock that ran ahead, and letting it take
//!   today's daily slot would drop the real one.
//!
//! Buckets are the local calendar: a day is a local date (23 or 25 hours
//! across a daylight-saving change), a week an ISO week starting Monday,
//! a month and a year local ones. An hour is an hour of elapsed time, so the
//! hour repeated when clocks go back holds two hourly snapshots, not one.
//! In each bucket the newest snapshot is the one kept.
//!
//! Counts (`--keep-daily 7`) are counts of buckets that *have* snapshots,
//! so a machine that stopped backing up keeps its last seven days rather
//! than losing everything to the calendar.

use std::collections::BTreeMap;
use std::fmt;

use capsule_format::id::ObjectId;
use capsule_format::snapshot::Snapshot;
use jiff::tz::TimeZone;
use jiff::{Span, Timestamp};

/// A calendar bucket size.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Period {
    /// An hour of elapsed time.
    Hourly,
    /// A local calendar date.
    Daily,
    /// An ISO week (Monday to Sunday), local.
    Weekly,
    /// A local calendar month.
    Monthly,
    /// A local calendar year.
    Yearly,
}

impl Period {
    /// Every period, shortest first.
    pub const ALL: [Period; 5] = [
        Period::Hourly,
        Period::Daily,
        Period::Weekly,
        Period::Monthly,
        Period::Yearly,
    ];

    fn name(self) -> &'static str {
        match self {
            Period::Hourly => "hourly",
            Period::Daily => "daily",
            Period::Weekly => "weekly",
            Period::Monthly => "monthly",
            Period::Yearly => "yearly",
        }
    }

    /// The bucket a time falls into: equal keys, same bucket.
    fn key(self, t: i64, tz: &TimeZone) -> i64 {
        let Ok(ts) = Timestamp::from_second(t) else {
            // Out of the calendar's range: a bucket of its own.
            return t;
        };
        let z = ts.to_zoned(tz.clone());
        let date = z.date();
        match self {
            // Elapsed hours, shifted by the zone's offset within the hour so
            // that half-hour zones (India, Newfoundland) bucket at their own
            // hour boundaries.
            Period::Hourly => {
                let off = i64::from(z.offset().seconds()).rem_euclid(3600);
                (t + off).div_euclid(3600)
            }
            Period::Daily => i64::from(date.year()) * 1000 + i64::from(date.day_of_year()),
            Period::Weekly => {
                let w = date.iso_week_date();
                i64::from(w.year()) * 100 + i64::from(w.week())
            }
            Period::Monthly => i64::from(date.year()) * 100 + i64::from(date.month()),
            Period::Yearly => i64::from(date.year()),
        }
    }
}

/// How many buckets of a period to keep.
#[derive(Debug, Clone)]
pub enum Limit {
    /// The newest N buckets that hold snapshots.
    Count(u32),
    /// Every bucket.
    Unlimited,
    /// Every bucket younger than this span, counted from now.
    Within(Span),
}

/// A retention policy. A snapshot is kept when any rule keeps it.
#[derive(Debug, Clone, Default)]
pub struct Policy {
    /// Keep the newest N snapshots.
    pub last: Option<u32>,
    /// Keep one snapshot per bucket, by period.
    pub buckets: Vec<(Period, Limit)>,
    /// Keep every snapshot younger than this, counted from now.
    pub within: Option<Span>,
    /// Keep every snapshot carrying one of these tags.
    pub tags: Vec<String>,
}

impl Policy {
    /// Time Machine's schedule: every snapshot of the last 24 hours, one a
    /// day for 30 days, one a week for as long as space allows.
    pub fn timemachine() -> Policy {
        Policy {
            last: None,
            buckets: vec![
                (Period::Daily, Limit::Within(Span::new().days(30))),
                (Period::Weekly, Limit::Unlimited),
            ],
            within: Some(Span::new().hours(24)),
            tags: Vec::new(),
        }
    }

    /// True when no rule is set: such a policy would keep nothing.
    pub fn is_empty(&self) -> bool {
        self.last.is_none()
            && self.buckets.is_empty()
            && self.within.is_none()
            && self.tags.is_empty()
    }
}

/// Why a snapshot is kept.
#[derive(Debug, Clone)]
pub enum Rule {
    /// One of the newest N.
    Last(u32),
    /// The newest in its bucket.
    Bucket(Period, Limit),
    /// Younger than the window.
    Within(Span),
    /// Carries this tag.
    Tag(String),
    /// Dated after now.
    Future,
}

// Spans compare field by field: "24h" and "1d" are different rules.
impl PartialEq for Limit {
    fn eq(&self, other: &Self) -> bool {
        match (self, other) {
            (Limit::Count(a), Limit::Count(b)) => a == b,
            (Limit::Unlimited, Limit::Unlimited) => true,
            (Limit::Within(a), Limit::Within(b)) => a.fieldwise() == b.fieldwise(),
            _ => false,
        }
    }
}

impl PartialEq for Rule {
    fn eq(&self, other: &Self) -> bool {
        match (self, other) {
            (Rule::Last(a), Rule::Last(b)) => a == b,
            (Rule::Bucket(p, l), Rule::Bucket(q, m)) => p == q && l == m,
            (Rule::Within(a), Rule::Within(b)) => a.fieldwise() == b.fieldwise(),
            (Rule::Tag(a), Rule::Tag(b)) => a == b,
            (Rule::Future, Rule::Future) => true,
            _ => false,
        }
    }
}

impl fmt::Display for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Rule::Last(n) => write!(f, "last {n}"),
            Rule::Bucket(p, Limit::Count(n)) => write!(f, "{} {n}", p.name()),
            Rule::Bucket(p, Limit::Unlimited) => write!(f, "{} (all)", p.name()),
            Rule::Bucket(p, Limit::Within(s)) => write!(f, "{} within {s:#}", p.name()),
            Rule::Within(s) => write!(f, "within {s:#}"),
            Rule::Tag(t) => write!(f, "tag {t}"),
            Rule::Future => write!(f, "dated in the future"),
        }
    }
}

impl serde::Serialize for Rule {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

/// How snapshots are grouped: a policy applies to each group on its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GroupBy {
    /// Snapshots of different hosts are separate groups.
    pub host: bool,
    /// Snapshots of different path sets are separate groups.
    pub paths: bool,
}

impl Default for GroupBy {
    fn default() -> Self {
        GroupBy {
            host: true,
            paths: true,
        }
    }
}

/// What identifies a group.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, serde::Serialize)]
pub struct GroupKey {
    /// Host, when grouping by host.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
    /// Sorted source paths, when grouping by paths.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub paths: Option<Vec<String>>,
}

impl fmt::Display for GroupKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut parts = Vec::new();
        if let Some(h) = &self.host {
            parts.push(format!("host {h}"));
        }
        if let Some(p) = &self.paths {
            parts.push(format!("paths {}", p.join(" ")));
        }
        if parts.is_empty() {
            return f.write_str("all snapshots");
        }
        f.write_str(&parts.join(", "))
    }
}

/// The verdict on one snapshot.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Verdict {
    /// The snapshot's ID.
    #[serde(serialize_with = "ser_id")]
    pub id: ObjectId,
    /// When it was taken, Unix seconds.
    pub time_unix: i64,
    /// True when kept.
    pub keep: bool,
    /// Every rule that keeps it (empty when removed).
    pub reasons: Vec<Rule>,
}

fn ser_id<S: serde::Serializer>(id: &ObjectId, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&id.to_hex())
}

/// One group's verdicts, newest first.
#[derive(Debug, Clone, serde::Serialize)]
pub struct GroupPlan {
    /// The group.
    pub group: GroupKey,
    /// Its snapshots, newest first.
    pub snapshots: Vec<Verdict>,
}

impl GroupPlan {
    /// True when the policy keeps none of the group's snapshots that are
    /// not dated in the future. Those are kept whatever the policy says, so
    /// counting them would let `--keep-last 0` forget every real snapshot
    /// of a group behind one backup made while a clock ran ahead.
    pub fn keeps_nothing(&self) -> bool {
        let dated = |v: &&Verdict| !v.reasons.contains(&Rule::Future);
        self.snapshots.iter().filter(dated).count() > 0
            && !self.snapshots.iter().filter(dated).any(|v| v.keep)
    }

    /// The snapshots counted by the policy (not dated in the future).
    pub fn dated(&self) -> usize {
        self.snapshots
            .iter()
            .filter(|v| !v.reasons.contains(&Rule::Future))
            .count()
    }
}

/// Applies `policy` at time `now` (Unix seconds) in zone `tz` to every
/// group of `snaps`. Groups come out sorted by key; within a group the
/// newest snapshot comes first.
pub fn plan(
    snaps: &[(ObjectId, Snapshot)],
    now: i64,
    tz: &TimeZone,
    policy: &Policy,
    group_by: GroupBy,
) -> Vec<GroupPlan> {
    let mut groups: BTreeMap<GroupKey, Vec<&(ObjectId, Snapshot)>> = BTreeMap::new();
    for s in snaps {
        groups.entry(group_key(&s.1, group_by)).or_default().push(s);
    }
    groups
        .into_iter()
        .map(|(group, mut members)| {
            members.sort_by(|a, b| {
                (b.1.time_unix, b.1.time_nanos, b.0).cmp(&(a.1.time_unix, a.1.time_nanos, a.0))
            });
            GroupPlan {
                group,
                snapshots: plan_group(&members, now, tz, policy),
            }
        })
        .collect()
}

fn group_key(s: &Snapshot, by: GroupBy) -> GroupKey {
    GroupKey {
        host: by.host.then(|| s.hostname.clone()),
        paths: by.paths.then(|| {
            let mut p = s.paths.clone();
            p.sort();
            p
        }),
    }
}

/// The earliest time a window starting now and reaching back `span` covers.
/// Calendar units (days, months) are counted in the local calendar, so "30
/// days" across a daylight-saving change is 30 local days.
fn cutoff(now: i64, tz: &TimeZone, span: &Span) -> i64 {
    let Ok(ts) = Timestamp::from_second(now) else {
        return i64::MIN;
    };
    ts.to_zoned(tz.clone())
        .checked_sub(*span)
        .map(|z| z.timestamp().as_second())
        // A span reaching before the calendar's start covers everything.
        .unwrap_or(i64::MIN)
}

fn plan_group(
    members: &[&(ObjectId, Snapshot)],
    now: i64,
    tz: &TimeZone,
    policy: &Policy,
) -> Vec<Verdict> {
    let mut out: Vec<Verdict> = members
        .iter()
        .map(|(id, s)| Verdict {
            id: *id,
            time_unix: s.time_unix,
            keep: false,
            reasons: Vec::new(),
        })
        .collect();
    let keep = |i: usize, r: Rule, out: &mut Vec<Verdict>| {
        out[i].keep = true;
        out[i].reasons.push(r);
    };
    // Snapshots from a clock that ran ahead are kept and counted nowhere.
    let dated: Vec<usize> = (0..members.len())
        .filter(|&i| {
            if crate::timefmt::is_future(members[i].1.time_unix, now) {
                keep(i, Rule::Future, &mut out);
                false
            } else {
                true
            }
        })
        .collect();
    if let Some(n) = policy.last {
        for &i in dated.iter().take(n as usize) {
            keep(i, Rule::Last(n), &mut out);
        }
    }
    for (period, limit) in &policy.buckets {
        let mut last_key = None;
        let mut left = match limit {
            Limit::Count(n) => *n,
            _ => u32::MAX,
        };
        let since = match limit {
            Limit::Within(span) => cutoff(now, tz, span),
            _ => i64::MIN,
        };
        for &i in &dated {
            let t = members[i].1.time_unix;
            if left == 0 || t < since {
                break;
            }
            let key = period.key(t, tz);
            if last_key != Some(key) {
                last_key = Some(key);
                if matches!(limit, Limit::Count(_)) {
                    left -= 1;
                }
                keep(i, Rule::Bucket(*period, limit.clone()), &mut out);
            }
        }
    }
    if let Some(span) = &policy.within {
        let since = cutoff(now, tz, span);
        for &i in &dated {
            if members[i].1.time_unix >= since {
                keep(i, Rule::Within(*span), &mut out);
            }
        }
    }
    for tag in &policy.tags {
        for &i in &dated {
            if members[i].1.tags.iter().any(|t| t == tag) {
                keep(i, Rule::Tag(tag.clone()), &mut out);
            }
        }
    }
    out
}

/// Parses a duration such as `24h`, `30d`, `2w`, `6mo`, `1y` or `1y6mo`.
/// Minutes are `m`, months `mo`, as in jiff's friendly format.
pub fn parse_span(s: &str) -> Result<Span, String> {
    let span: Span = s.trim().parse().map_err(|e| {
        format!("cannot read the duration {s:?} ({e}); write it as 24h, 30d, 2w, 6mo or 1y")
    })?;
    if span.is_negative() || span.is_zero() {
        return Err(format!("the duration {s:?} must be longer than zero"));
    }
    Ok(span)
}

#[cfg(test)]
mod tests {
    use super::*;
    use capsule_format::snapshot::SnapshotSummary;

    const H: i64 = 3600;
    const D: i64 = 86_400;

    fn snap(time_unix: i64, host: &str, tags: &[&str]) -> Snapshot {
        Snapshot {
            version: 1,
            time: String::new(),
            time_unix,
            time_nanos: 0,
            duration_secs: 1.0,
            hostname: host.into(),
            username: "u".into(),
            paths: vec!["/home".into()],
            tree: String::new(),
            parent: None,
            tags: tags.iter().map(|t| t.to_string()).collect(),
            incomplete: false,
            summary: SnapshotSummary::default(),
            program: String::new(),
            repaired: None,
            original: None,
        }
    }

    fn snaps(times: &[i64]) -> Vec<(ObjectId, Snapshot)> {
        times
            .iter()
            .map(|&t| (ObjectId::of(&t.to_le_bytes()), snap(t, "h", &[])))
            .collect()
    }

    /// The kept times, oldest first.
    fn kept(times: &[i64], now: i64, tz: &TimeZone, p: &Policy) -> Vec<i64> {
        let plan = plan(&snaps(times), now, tz, p, GroupBy::default());
        assert_eq!(plan.len(), 1);
        let mut k: Vec<i64> = plan[0]
            .snapshots
            .iter()
            .filter(|v| v.keep)
            .map(|v| v.time_unix)
            .collect();
        k.sort();
        k
    }

    fn ts(s: &str) -> i64 {
        s.parse::<Timestamp>().expect("test timestamp").as_second()
    }

    fn posix(s: &str) -> TimeZone {
        TimeZone::posix(s).expect("test zone")
    }

    fn hourly_from(start: i64, n: i64) -> Vec<i64> {
        (0..n).map(|i| start + i * H).collect()
    }

    #[test]
    fn last_keeps_the_newest_n() {
        let t = hourly_from(0, 10);
        let p = Policy {
            last: Some(3),
            ..Default::default()
        };
        assert_eq!(
            kept(&t, 10 * H, &TimeZone::UTC, &p),
            vec![7 * H, 8 * H, 9 * H]
        );
    }

    #[test]
    fn daily_keeps_the_newest_of_each_local_day() {
        // Hourly for three days in UTC+14 (Kiribati): local days start at
        // 10:00 UTC, so UTC days would pick other snapshots.
        let tz = TimeZone::fixed(jiff::tz::offset(14));
        let start = ts("2026-03-01T00:00:00Z");
        let t = hourly_from(start, 72);
        let p = Policy {
            buckets: vec![(Period::Daily, Limit::Count(10))],
            ..Default::default()
        };
        let k = kept(&t, start + 72 * H, &tz, &p);
        // Last snapshot before each local midnight (10:00 UTC), plus the newest.
        assert_eq!(
            k,
            vec![
                ts("2026-03-01T09:00:00Z"),
                ts("2026-03-02T09:00:00Z"),
                ts("2026-03-03T09:00:00Z"),
                ts("2026-03-03T23:00:00Z"),
            ]
        );
    }

    #[test]
    fn days_across_daylight_saving_changes_are_local_dates() {
        // Central Europe: clocks go forward on 2026-03-29 at 01:00 UTC and
        // back on 2026-10-25 at 01:00 UTC.
        let tz = posix("CET-1CEST,M3.5.0,M10.5.0/3");
        let p = Policy {
            buckets: vec![(Period::Daily, Limit::Count(3))],
            ..Default::default()
        };
        // Spring: local 29 March has 23 hours, from 23:00 UTC on the 28th
        // (midnight CET) to 22:00 UTC on the 29th (midnight CEST).
        let start = ts("2026-03-28T00:00:00Z");
        let t = hourly_from(start, 70);
        let k = kept(&t, start + 70 * H, &tz, &p);
        assert_eq!(
            k,
            vec![
                // Midnight of 29 March local (CET) is 23:00 UTC on the 28th.
                ts("2026-03-28T22:00:00Z"),
                // Midnight of 30 March local (CEST) is 22:00 UTC on the 29th.
                ts("2026-03-29T21:00:00Z"),
                ts("2026-03-30T21:00:00Z"),
            ]
        );
        // Autumn: 25 October has 25 local hours; its last hour starts at
        // 22:00 UTC (23:00 CET).
        let start = ts("2026-10-24T00:00:00Z");
        let t = hourly_from(start, 72);
        let k = kept(&t, start + 72 * H, &tz, &p);
        assert_eq!(
            k,
            vec![
                ts("2026-10-25T22:00:00Z"),
                ts("2026-10-26T22:00:00Z"),
                ts("2026-10-26T23:00:00Z"),
            ]
        );
    }

    #[test]
    fn the_repeated_hour_when_clocks_go_back_keeps_two_hourlies() {
        let tz = posix("CET-1CEST,M3.5.0,M10.5.0/3");
        // 00:30 and 01:30 UTC on 25 October are both 02:30 local.
        let t = vec![ts("2026-10-25T00:30:00Z"), ts("2026-10-25T01:30:00Z")];
        let p = Policy {
            buckets: vec![(Period::Hourly, Limit::Count(24))],
            ..Default::default()
        };
        assert_eq!(kept(&t, t[1] + H, &tz, &p), t);
    }

    #[test]
    fn half_hour_zones_bucket_at_their_own_hour() {
        // India, UTC+5:30: local hours start at :30 UTC.
        let tz = TimeZone::fixed(jiff::tz::Offset::from_seconds(5 * 3600 + 1800).expect("offset"));
        let t = vec![
            ts("2026-05-01T10:10:00Z"),
            ts("2026-05-01T10:25:00Z"),
            ts("2026-05-01T10:35:00Z"),
        ];
        let p = Policy {
            buckets: vec![(Period::Hourly, Limit::Count(24))],
            ..Default::default()
        };
        assert_eq!(kept(&t, t[2] + H, &tz, &p), vec![t[1], t[2]]);
    }

    #[test]
    fn weeks_are_iso_weeks_starting_monday() {
        let p = Policy {
            buckets: vec![(Period::Weekly, Limit::Count(5))],
            ..Default::default()
        };
        // Sunday 2026-01-04 and Monday 2026-01-05, noon UTC, and a Saturday
        // at the end of 2026 in ISO week 53.
        let t = vec![
            ts("2026-01-04T12:00:00Z"),
            ts("2026-01-05T12:00:00Z"),
            ts("2026-01-06T12:00:00Z"),
        ];
        assert_eq!(kept(&t, t[2] + D, &TimeZone::UTC, &p), vec![t[0], t[2]]);
        // 2026-12-31 (Thursday) and 2027-01-01 (Friday) share ISO week 53
        // of 2026.
        let t = vec![ts("2026-12-31T12:00:00Z"), ts("2027-01-01T12:00:00Z")];
        assert_eq!(kept(&t, t[1] + D, &TimeZone::UTC, &p), vec![t[1]]);
    }

    #[test]
    fn monthly_and_yearly_use_the_local_calendar() {
        // 31 Dec 23:30 in New York is already 1 January in UTC.
        let tz = posix("EST5EDT,M3.2.0,M11.1.0");
        let t = vec![ts("2027-01-01T04:30:00Z"), ts("2027-01-01T06:00:00Z")];
        for period in [Period::Monthly, Period::Yearly] {
            let p = Policy {
                buckets: vec![(period, Limit::Count(5))],
                ..Default::default()
            };
            assert_eq!(kept(&t, t[1] + D, &tz, &p), t, "{period:?}");
            assert_eq!(
                kept(&t, t[1] + D, &TimeZone::UTC, &p),
                vec![t[1]],
                "{period:?} UTC"
            );
        }
    }

    #[test]
    fn windows_count_from_now_not_from_the_newest_snapshot() {
        // Backups stopped ten days ago.
        let now = ts("2026-06-20T12:00:00Z");
        let t = hourly_from(now - 12 * D, 48);
        let p = Policy {
            within: Some(Span::new().days(3)),
            ..Default::default()
        };
        assert!(kept(&t, now, &TimeZone::UTC, &p).is_empty());
        let p = Policy {
            buckets: vec![(Period::Daily, Limit::Within(Span::new().days(11)))],
            ..Default::default()
        };
        // Only the snapshots of the last 11 days count: the newest of each
        // of the two days they fall on (9 and 10 June).
        assert_eq!(kept(&t, now, &TimeZone::UTC, &p), vec![t[35], t[47]]);
    }

    #[test]
    fn counts_keep_the_last_buckets_that_hold_snapshots() {
        let now = ts("2026-06-20T12:00:00Z");
        let t: Vec<i64> = (0..10).map(|i| now - 100 * D + i * D).collect();
        let p = Policy {
            buckets: vec![(Period::Daily, Limit::Count(3))],
            ..Default::default()
        };
        assert_eq!(kept(&t, now, &TimeZone::UTC, &p), t[7..].to_vec());
    }

    #[test]
    fn snapshots_dated_in_the_future_are_kept_and_take_no_bucket() {
        let now = ts("2026-06-20T12:00:00Z");
        let t = vec![now - 2 * H, now - H, now + 5 * H, now + 400 * D];
        let p = Policy {
            last: Some(1),
            ..Default::default()
        };
        let plan = plan(&snaps(&t), now, &TimeZone::UTC, &p, GroupBy::default());
        let v = &plan[0].snapshots;
        assert_eq!(v[0].reasons, vec![Rule::Future]);
        assert_eq!(v[1].reasons, vec![Rule::Future]);
        // `last 1` goes to the newest snapshot that is not in the future.
        assert_eq!(v[2].time_unix, now - H);
        assert_eq!(v[2].reasons, vec![Rule::Last(1)]);
        assert!(!v[3].keep);
    }

    #[test]
    fn timemachine_keeps_a_day_of_hourlies_a_month_of_dailies_then_weeklies() {
        let now = ts("2026-11-23T12:00:00Z");
        // Hourly backups for a year.
        let start = now - 365 * D;
        let t = hourly_from(start, 365 * 24 + 1);
        let k = kept(&t, now, &TimeZone::UTC, &Policy::timemachine());
        let expected = {
            let mut e: Vec<i64> = Vec::new();
            for &x in &t {
                let age = now - x;
                let last_of_day = (x + H) % D == 0 || x == now;
                let z = Timestamp::from_second(x)
                    .expect("ts")
                    .to_zoned(TimeZone::UTC);
                let newest_in_week = {
                    let next = Timestamp::from_second(x + H)
                        .expect("ts")
                        .to_zoned(TimeZone::UTC);
                    x == now
                        || next.date().iso_week_date().week() != z.date().iso_week_date().week()
                };
                if age <= D || (age <= 30 * D && last_of_day) || newest_in_week {
                    e.push(x);
                }
            }
            e
        };
        assert_eq!(k, expected);
        // 25 hourlies (both ends of the 24 h window), ~30 dailies, ~52 weeklies.
        assert!((100..115).contains(&k.len()), "{}", k.len());
    }

    #[test]
    fn groups_are_separate_and_tags_keep() {
        let s = vec![
            (ObjectId::of(b"a"), snap(100, "laptop", &[])),
            (ObjectId::of(b"b"), snap(200, "laptop", &["before-upgrade"])),
            (ObjectId::of(b"c"), snap(300, "laptop", &[])),
            (ObjectId::of(b"d"), snap(50, "desktop", &[])),
        ];
        let p = Policy {
            last: Some(1),
            tags: vec!["before-upgrade".into()],
            ..Default::default()
        };
        let plan = plan(&s, 1000, &TimeZone::UTC, &p, GroupBy::default());
        assert_eq!(plan.len(), 2);
        assert_eq!(plan[0].group.host.as_deref(), Some("desktop"));
        assert!(plan[0].snapshots[0].keep);
        let laptop: Vec<(i64, bool)> = plan[1]
            .snapshots
            .iter()
            .map(|v| (v.time_unix, v.keep))
            .collect();
        assert_eq!(laptop, vec![(300, true), (200, true), (100, false)]);
        assert_eq!(
            plan[1].snapshots[1].reasons,
            vec![Rule::Tag("before-upgrade".into())]
        );
        let one = plan_one_group(&s, &p);
        assert_eq!(one.snapshots.iter().filter(|v| v.keep).count(), 2);
    }

    fn plan_one_group(s: &[(ObjectId, Snapshot)], p: &Policy) -> GroupPlan {
        let mut v = plan(
            s,
            1000,
            &TimeZone::UTC,
            p,
            GroupBy {
                host: false,
                paths: false,
            },
        );
        assert_eq!(v.len(), 1);
        v.remove(0)
    }

    #[test]
    fn a_policy_that_keeps_nothing_is_visible() {
        let p = Policy {
            within: Some(Span::new().hours(1)),
            ..Default::default()
        };
        let plan = plan(
            &snaps(&[0, H]),
            100 * D,
            &TimeZone::UTC,
            &p,
            GroupBy::default(),
        );
        assert!(plan[0].keeps_nothing());
        assert!(Policy::default().is_empty());
        assert!(!Policy::timemachine().is_empty());
    }

    #[test]
    fn spans_parse_in_friendly_units() {
        assert_eq!(parse_span("24h").expect("24h").get_hours(), 24);
        assert_eq!(parse_span("30d").expect("30d").get_days(), 30);
        assert_eq!(parse_span("6mo").expect("6mo").get_months(), 6);
        assert!(parse_span("1y6mo").is_ok());
        assert!(parse_span("0d").is_err());
        assert!(parse_span("soon").expect_err("bad").contains("30d"));
    }

    #[test]
    fn rules_read_well() {
        assert_eq!(
            Rule::Bucket(Period::Daily, Limit::Count(7)).to_string(),
            "daily 7"
        );
        assert_eq!(
            Rule::Bucket(Period::Daily, Limit::Within(Span::new().days(30))).to_string(),
            "daily within 30d"
        );
        assert_eq!(
            Rule::Within(Span::new().hours(24)).to_string(),
            "within 24h"
        );
    }
}
