//! CPU time, to price what a restore asks of this machine's cores.
//!
//! A restore's two halves, receiving and writing, both need the client's
//! cores: decrypting and decompressing on one side, and on the other the
//! receive path (TLS, SSH or SMB signing, socket copies), plus the server
//! and any proxy when they run on the same machine. When the cores are the
//! limit, neither the local work nor the download alone predicts the time;
//! their CPU seconds together, over the cores, do.
//!
//! Read from `/proc` (Linux), in the kernel's `USER_HZ` ticks: 1/100 s on
//! x86, ARM, RISC-V and the other architectures capsule is built for (a few
//! old ones, such as Alpha, use 1/1024 s, and would misprice this bound).
//! Elsewhere nothing is measured and the model goes without this bound.

/// Seconds per `USER_HZ` tick in `/proc/stat` and `/proc/<pid>/stat`.
const TICK: f64 = 0.01;

/// CPU seconds the cores this process may run on have spent busy since
/// boot: user, nice, system, irq and softirq time, not idle, iowait or
/// time stolen by a hypervisor. Every core when the process may run on
/// any; only its own when it is bound to some (`taskset`), so that what
/// runs on the others (a server given a core of its own, as a NAS has) is
/// not charged to the cores the client has.
pub(crate) fn cores_busy() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let status = std::fs::read_to_string("/proc/self/status").ok();
    let allowed = status.as_deref().and_then(|s| {
        s.lines()
            .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
            .and_then(|l| cpu_list(l.trim()))
    });
    busy_on(&stat, allowed.as_deref())
}

/// The busy seconds of the CPUs in `allowed` (all of them: the `cpu ` line)
/// from `/proc/stat`'s text.
fn busy_on(stat: &str, allowed: Option<&[usize]>) -> Option<f64> {
    let all = || busy_of(stat.lines().find(|l| l.starts_with("cpu "))?);
    let Some(allowed) = allowed else {
        return all();
    };
    let mut sum = 0.0;
    let mut seen = 0;
    for line in stat.lines() {
        let Some(n) = line
            .split_whitespace()
            .next()
            .and_then(|w| w.strip_prefix("cpu"))
            .and_then(|n| n.parse::<usize>().ok())
        else {
            continue;
        };
        if allowed.contains(&n) {
            sum += busy_of(line)?;
            seen += 1;
        }
    }
    if seen == 0 {
        all()
    } else {
        Some(sum)
    }
}

/// Parses a CPU list as `/proc/self/status` writes it (`0-3,6,8-9`).
fn cpu_list(s: &str) -> Option<Vec<usize>> {
    let mut out = Vec::new();
    for part in s.split(',').filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((a, b)) => out.extend(a.parse::<usize>().ok()?..=b.parse::<usize>().ok()?),
            None => out.push(part.parse().ok()?),
        }
    }
    (!out.is_empty()).then_some(out)
}

fn busy_of(line: &str) -> Option<f64> {
    let v: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .map(|f| f.parse().ok())
        .collect::<Option<_>>()?;
    // user nice system idle iowait irq softirq [steal ...]
    let busy = [0usize, 1, 2, 5, 6]
        .iter()
        .map(|&i| v.get(i).copied())
        .sum::<Option<u64>>()?;
    Some(busy as f64 * TICK)
}

/// CPU seconds (user and system, all threads) this process has used, to
/// the nanosecond (`CLOCK_PROCESS_CPUTIME_ID`). `/proc/self/stat` counts
/// in ticks of 10 ms, a seventh of a small calibration restore (60-90 ms):
/// the per-file cost fitted from it moved by that much between estimates.
pub(crate) fn process() -> Option<f64> {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ProcessCPUTime);
    Some(t.tv_sec as f64 + t.tv_nsec as f64 * 1e-9)
}

/// CPU seconds of this process from `/proc/self/stat` (in ticks), as a
/// check on [`process`].
#[cfg(test)]
fn process_ticks() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    process_of(&stat)
}

#[cfg(test)]
fn process_of(stat: &str) -> Option<f64> {
    // The command name is in parentheses and may hold spaces or ')': the
    // fields counted from 3 (state) start after the last ')'.
    let rest = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime are fields 14 and 15, so 11 and 12 after the name.
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some((utime + stime) as f64 * TICK)
}

/// Cores this process may run on.
pub(crate) fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_proc_stat_busy_time() {
        let line = "cpu  100 20 30 5000 40 5 6 700 0 0";
        // 100 + 20 + 30 + 5 + 6 ticks; idle, iowait and steal left out.
        assert!((busy_of(line).unwrap() - 1.61).abs() < 1e-9);
        assert!(busy_of("cpu  1 2").is_none());
    }

    #[test]
    fn counts_only_the_cores_this_process_may_run_on() {
        let stat = "cpu  300 0 30 9000 0 0 0 0 0 0\n\
                    cpu0 100 0 10 4500 0 0 0 0 0 0\n\
                    cpu1 200 0 20 4500 0 0 0 0 0 0\n\
                    intr 12345\n";
        // Bound to core 0 (the servers pinned to core 1): core 0's 110
        // ticks, not the machine's 330.
        assert!((busy_on(stat, Some(&[0])).unwrap() - 1.1).abs() < 1e-9);
        assert!((busy_on(stat, Some(&[0, 1])).unwrap() - 3.3).abs() < 1e-9);
        assert!((busy_on(stat, None).unwrap() - 3.3).abs() < 1e-9);
        // A list naming no core /proc/stat has: the whole machine.
        assert!((busy_on(stat, Some(&[7])).unwrap() - 3.3).abs() < 1e-9);
        assert_eq!(cpu_list("0-2,5,7-8"), Some(vec![0, 1, 2, 5, 7, 8]));
        assert_eq!(cpu_list("1"), Some(vec![1]));
        assert_eq!(cpu_list(""), None);
        assert_eq!(cpu_list("x"), None);
    }

    #[test]
    fn parses_process_times_after_an_awkward_name() {
        let stat = "42 (a) b (c)) S 1 42 42 0 -1 4194560 100 0 0 0 250 75 0 0 20 0 9 0";
        assert!((process_of(stat).unwrap() - 3.25).abs() < 1e-9);
    }

    #[test]
    fn this_process_and_machine_are_measured_on_linux() {
        if cfg!(target_os = "linux") {
            // Busy time only grows, and this process's share of it is part
            // of its cores'.
            let m = cores_busy().unwrap();
            let p = process().unwrap();
            assert!(m >= p, "machine {m} < process {p}");
            // The fine clock and the ticks agree, to a tick or two.
            let busy = std::time::Instant::now();
            while busy.elapsed().as_millis() < 50 {
                std::hint::black_box(busy.elapsed());
            }
            let (fine, ticks) = (process().unwrap(), process_ticks().unwrap());
            assert!(
                (fine - ticks).abs() < 0.05 + 0.1 * fine,
                "fine {fine} ticks {ticks}"
            );
        }
        assert!(cores() >= 1);
    }
}
