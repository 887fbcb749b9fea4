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

/// CPU seconds every core of this machine has spent busy since boot: user,
/// nice, system, irq and softirq time, not idle, iowait or time stolen by
/// a hypervisor.
pub(crate) fn machine_busy() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let line = stat.lines().find(|l| l.starts_with("cpu "))?;
    busy_of(line)
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

/// CPU seconds (user and system, all threads) this process has used.
pub(crate) fn process() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    process_of(&stat)
}

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
    fn parses_process_times_after_an_awkward_name() {
        let stat = "42 (a) b (c)) S 1 42 42 0 -1 4194560 100 0 0 0 250 75 0 0 20 0 9 0";
        assert!((process_of(stat).unwrap() - 3.25).abs() < 1e-9);
    }

    #[test]
    fn this_process_and_machine_are_measured_on_linux() {
        if cfg!(target_os = "linux") {
            // Busy time only grows, and this process's share of it is part
            // of the machine's.
            let m = machine_busy().unwrap();
            let p = process().unwrap();
            assert!(m >= p, "machine {m} < process {p}");
        }
        assert!(cores() >= 1);
    }
}
