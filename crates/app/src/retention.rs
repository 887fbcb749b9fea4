//! A profile's retention as the engine's policy.

use capsule_engine::retention::{self, Limit, Period, Policy};

use crate::config::Retention;
use crate::error::UsageError;

/// The profile's retention as a policy (empty without one).
pub fn profile_policy(r: &Retention) -> Result<Policy, UsageError> {
    let mut p = match r.policy.as_deref() {
        Some("timemachine") => Policy::timemachine(),
        _ => Policy::default(),
    };
    if r.keep_last.is_some() {
        p.last = r.keep_last;
    }
    let counts = [
        r.keep_hourly,
        r.keep_daily,
        r.keep_weekly,
        r.keep_monthly,
        r.keep_yearly,
    ];
    for (period, n) in Period::ALL.into_iter().zip(counts) {
        if let Some(n) = n {
            p.buckets.push((period, Limit::Count(n)));
        }
    }
    if let Some(w) = &r.keep_within {
        p.within = Some(retention::parse_span(w).map_err(UsageError)?);
    }
    Ok(p)
}
