//! RFC 3339 formatting of Unix times without a date-time dependency.

/// Formats Unix seconds as `YYYY-MM-DDTHH:MM:SSZ` (UTC).
pub fn rfc3339(secs: i64) -> String {
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    let (y, m, d) = civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        (rem / 60) % 60,
        rem % 60
    )
}

/// The test clock: when `CAPSULE_TEST_NOW` is set, capsule's notion of now
/// (snapshot times, session heartbeats, retention windows) is that time
/// plus the time elapsed since the process first asked, so a test can
/// simulate a year of hourly backups in minutes. It takes Unix seconds or
/// RFC 3339 (`2027-03-28T01:30:00Z`), or `@FILE` to read either from FILE
/// at every call, so a test can move the clock of a running process (a
/// process suspended for hours). For tests only; a value that does not
/// parse is an error ([`test_clock_error`], checked when capsule starts),
/// and the file is read bounded (64 bytes, never blocking).
pub const TEST_CLOCK_ENV: &str = "CAPSULE_TEST_NOW";

/// Reads the test clock's file: at most 64 bytes, without blocking on a
/// FIFO or reading an endless device.
fn read_clock_file(f: &std::path::Path) -> Option<String> {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc_nonblock())
        .open(f)
        .ok()?;
    let mut s = String::new();
    file.take(64).read_to_string(&mut s).ok()?;
    Some(s)
}

/// `O_NONBLOCK` on Linux.
const fn libc_nonblock() -> i32 {
    0o4000
}

/// Why `CAPSULE_TEST_NOW` cannot be used, when it is set to something
/// that is not a time (or names a file that does not hold one).
pub fn test_clock_error() -> Option<String> {
    let v = std::env::var_os(TEST_CLOCK_ENV)?;
    let v = v.to_string_lossy().into_owned();
    let (text, from) = match v.strip_prefix('@') {
        Some(f) => (
            read_clock_file(std::path::Path::new(f)).unwrap_or_default(),
            format!(" (in {f})"),
        ),
        None => (v.clone(), String::new()),
    };
    parse_time(&text).is_none().then(|| {
        format!(
            "{TEST_CLOCK_ENV}={v:?}: not a time{from}; give Unix seconds, RFC 3339, or @FILE holding either (it is for tests: unset it)"
        )
    })
}

fn wall_clock() -> (i64, u32) {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| (d.as_secs() as i64, d.subsec_nanos()))
        .unwrap_or((0, 0))
}

fn parse_time(v: &str) -> Option<i64> {
    let v = v.trim();
    v.parse::<i64>()
        .ok()
        .or_else(|| v.parse::<jiff::Timestamp>().ok().map(|t| t.as_second()))
}

/// The test clock's current time, when one is set.
fn test_clock() -> Option<i64> {
    enum Clock {
        Off,
        Fixed(i64),
        File(std::path::PathBuf),
    }
    static CLOCK: std::sync::OnceLock<(Clock, std::time::Instant)> = std::sync::OnceLock::new();
    let (clock, since) = CLOCK.get_or_init(|| {
        let clock = match std::env::var_os(TEST_CLOCK_ENV) {
            None => Clock::Off,
            Some(v) => {
                let v = v.to_string_lossy().into_owned();
                match v.strip_prefix('@') {
                    Some(f) => Clock::File(f.into()),
                    None => parse_time(&v).map_or(Clock::Off, Clock::Fixed),
                }
            }
        };
        (clock, std::time::Instant::now())
    });
    let base = match clock {
        Clock::Off => return None,
        Clock::Fixed(t) => *t,
        Clock::File(f) => parse_time(&read_clock_file(f)?)?,
    };
    Some(base.saturating_add(since.elapsed().as_secs() as i64))
}

/// Current Unix time as seconds and nanoseconds (the test clock's, when set).
pub fn now_precise() -> (i64, u32) {
    let (s, n) = wall_clock();
    (test_clock().unwrap_or(s), n)
}

/// Current Unix time in seconds (the test clock's, when set).
pub fn now_unix() -> i64 {
    now_precise().0
}

/// Parses a point in time as a user names one: `2026-11-20 14:00`,
/// `2026-11-20T14:00:30` (local time), `2026-11-20` (the end of that day,
/// local time: "as it was on the 20th" means after that day's last
/// backup), or RFC 3339 with an offset (`2026-11-20T13:00:00Z`). Returns
/// Unix seconds, or None when `s` is none of these.
pub fn parse_when(s: &str) -> Option<i64> {
    let s = s.trim();
    if let Ok(t) = s.parse::<jiff::Timestamp>() {
        return Some(t.as_second());
    }
    let local = |dt: jiff::civil::DateTime| {
        dt.to_zoned(jiff::tz::TimeZone::system())
            .ok()
            .map(|z| z.timestamp().as_second())
    };
    if let Ok(dt) = s.parse::<jiff::civil::DateTime>() {
        // A date alone parses as its midnight; it means the whole day.
        if !s.contains([' ', 'T', 't']) {
            return local(dt.date().at(23, 59, 59, 0));
        }
        return local(dt);
    }
    None
}

/// How far a snapshot's time may lie ahead of this machine's clock before
/// it counts as dated in the future (a clock that ran ahead when it was
/// made): clocks of machines sharing a repository differ by this much
/// without anything being wrong.
pub const FUTURE_SKEW_SECS: i64 = 300;

/// Whether a snapshot taken at `time_unix` is dated in the future of `now`
/// (beyond [`FUTURE_SKEW_SECS`]).
pub fn is_future(time_unix: i64, now: i64) -> bool {
    time_unix > now.saturating_add(FUTURE_SKEW_SECS)
}

#[cfg(test)]
mod when_tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn times_are_read_as_a_user_writes_them() {
        assert_eq!(parse_when("2026-11-20T13:00:00Z"), Some(1_795_179_600));
        assert_eq!(parse_when("2026-11-20T14:00:00+01:00"), Some(1_795_179_600));
        // Local forms: whatever the zone, a minute later is 60 s later and
        // the date alone is the last second of that day.
        let a = parse_when("2026-11-20 14:00").unwrap();
        assert_eq!(parse_when("2026-11-20T14:01").unwrap(), a + 60);
        assert_eq!(parse_when("2026-11-20 14:00:30").unwrap(), a + 30);
        assert_eq!(
            parse_when("2026-11-20").unwrap(),
            parse_when("2026-11-20 23:59:59").unwrap()
        );
        for bad in ["", "latest", "abc123", "2026-13-01", "yesterday"] {
            assert_eq!(parse_when(bad), None, "{bad}");
        }
    }
}

// Howard Hinnant's days-to-civil algorithm.
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { y + 1 } else { y }, m, d)
}

#[cfg(test)]
mod tests {
    #[test]
    fn known_dates() {
        assert_eq!(super::rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(super::rfc3339(1_700_000_000), "2023-11-14T22:13:20Z");
        assert_eq!(super::rfc3339(951_782_400), "2000-02-29T00:00:00Z");
    }

    /// A crafted tree or snapshot may carry any time; listing it must not
    /// panic (debug builds check arithmetic overflow).
    #[test]
    fn extreme_times_format() {
        for t in [i64::MIN, i64::MIN + 1, -1, i64::MAX - 1, i64::MAX] {
            assert!(super::rfc3339(t).ends_with('Z'));
        }
    }
}
