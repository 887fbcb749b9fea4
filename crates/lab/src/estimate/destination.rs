//! The destination's probe: its round trips, throughput and fixed costs,
//! measured with the backend capsule uses.

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use capsule_backend::LabBackend;
use capsule_net::Destination;

use super::model::{median, spread_of, DestProbe, ProbeRounds};
use crate::dest::{delete_all, Connector};
use crate::lab::{backup_step, Hints};
use crate::probe::{self, Noise};
use crate::{LabError, Result};

/// Probes the destination briefly (a few seconds at most on a LAN; `work`
/// is a local scratch directory).
pub fn probe_destination(conn: &Connector, dest: &Destination, work: &Path) -> Result<DestProbe> {
    let scratch = dest.join(&format!("capsule-estimate-{}", crate::random_hex(4)));
    let opened = conn.open(&scratch, true)?;
    let b = opened.backend.clone();
    let r = (|| {
        // Three rounds of ten after the warm-up: one round's median moved
        // by half from one estimate to the next (a first connection, a
        // server still waking); the median of three does not.
        let mut rtt_ms = Vec::new();
        for _ in 0..3 {
            rtt_ms.push(probe::round_trip(&*b, 10)?.median_ms);
        }
        let rtt = median(&mut rtt_ms.clone()) / 1e3;
        let concurrency = b.capabilities().concurrency.max(1);
        // One stream.
        let size = 16u64 << 20;
        let t = Instant::now();
        b.put_stream("est/stream", size, &mut Noise::new(3, size))?;
        let stream_bw = size as f64 / t.elapsed().as_secs_f64().max(1e-9);
        // As many as a backup keeps in flight, of the default pack size
        // (smaller on slow links, to stay brief). A first round of tiny
        // puts opens the connections a backup's pool would already have.
        parallel_puts(&b, "warm", concurrency, 1)?;
        let piece = if stream_bw > 40e6 {
            16u64 << 20
        } else {
            4 << 20
        };
        // The better of two rounds: a backend may still be opening its
        // pool's connections in the background during the first (SFTP does,
        // and lends the requests a live one meanwhile), which a backup of
        // any length has long done. With one round, the model put SFTP
        // backups at 10 ms 20–37% slower than they ran.
        let mut parallel_bw = 0f64;
        for round in ["q", "p"] {
            let t = Instant::now();
            parallel_puts(&b, round, concurrency, piece)?;
            let bw = (concurrency as u64 * piece) as f64 / t.elapsed().as_secs_f64().max(1e-9);
            parallel_bw = parallel_bw.max(bw);
        }
        // Reading them back in 4 MiB ranges, all at once, as a restore does;
        // the better of two rounds, because the first also pays for the
        // server's first reads of what was just written and for streams
        // that are still opening their windows (it read about half the
        // restores' rates on SFTP and S3 here).
        // The busy CPU seconds of the cores this process may run on, over
        // the better round, price each byte received (see crate::cpu).
        let mut download_bw = 0f64;
        let mut download_cpu_per_byte = 0f64;
        for _ in 0..2 {
            let cpu0 = crate::cpu::cores_busy();
            let t = Instant::now();
            let got = parallel_gets(&b, "p", concurrency, piece)?;
            let bw = got as f64 / t.elapsed().as_secs_f64().max(1e-9);
            if bw > download_bw {
                download_bw = bw;
                download_cpu_per_byte = match (cpu0, crate::cpu::cores_busy()) {
                    (Some(a), Some(b)) => (b - a).max(0.0) / got.max(1) as f64,
                    _ => 0.0,
                };
            }
        }
        // Per-file copying: small files one at a time, flushed.
        let data = Noise::bytes(5, 51_200);
        let t = Instant::now();
        let n = 12;
        for i in 0..n {
            b.probe_write(&format!("est/f/{i}"), &data, 1, true)?;
        }
        let per_file_copy = t.elapsed().as_secs_f64() / n as f64;
        crate::check_interrupt()?;
        let runs = fixed_costs(conn, &scratch.join("repo"), work)?;
        let (run_changed, run_unchanged) =
            (median(&mut runs.0.clone()), median(&mut runs.1.clone()));
        // Whole runs, made of round trips, carry what the round trips'
        // variation costs. The round trips' own relative spread is not
        // counted: to a local disk they take microseconds, and a jitter of
        // 2 µs (3, 1 and 1 µs) made an estimate say ± 85%.
        let spread = probe_spread(&runs);
        Ok(DestProbe {
            connect_secs: opened.connect_secs,
            rtt,
            stream_bw,
            parallel_bw,
            concurrency,
            download_bw,
            download_cpu_per_byte,
            per_file_copy,
            run_changed,
            run_unchanged,
            rounds: ProbeRounds {
                rtt_ms,
                run_changed: runs.0,
                run_unchanged: runs.1,
                spread,
            },
        })
    })();
    let _ = delete_all(&*b, "", 16);
    let _ = b.remove_empty_dirs();
    r
}

/// Seconds of whole runs with one new small file, and with nothing new,
/// on a tiny repository at `repo`: each run connects afresh, as a separate
/// process would; three of each, alternating.
fn fixed_costs(conn: &Connector, repo: &Destination, work: &Path) -> Result<(Vec<f64>, Vec<f64>)> {
    let src = work.join("fixed-source");
    std::fs::create_dir_all(&src).map_err(|e| LabError::io("create", &src, e))?;
    let add = |i: u32| -> Result<()> {
        let p = src.join(format!("f{i}"));
        let f = std::fs::File::create(&p).map_err(|e| LabError::io("create", &p, e))?;
        std::io::Write::write_all(&mut &f, &Noise::bytes(u64::from(i) + 20, 51_200))
            .map_err(|e| LabError::io("write", &p, e))?;
        // Older than the files cache's re-read window, so the run with
        // nothing new really reads nothing.
        let old = std::time::SystemTime::now() - std::time::Duration::from_secs(10);
        f.set_modified(old)
            .map_err(|e| LabError::io("set the time of", &p, e))
    };
    let password = crate::random_hex(16).into_bytes();
    let cache = work.join("fixed-cache");
    let paths = [src.clone()];
    let run = |init: bool| -> Result<f64> {
        let r = backup_step(
            conn,
            repo,
            &password,
            &paths,
            init,
            &cache,
            Hints::default(),
        )?;
        Ok(r.connect_secs + r.open_secs + r.backup_secs)
    };
    add(0)?;
    run(true)?;
    let (mut changed, mut unchanged) = (Vec::new(), Vec::new());
    for i in 1..=3 {
        add(i)?;
        changed.push(run(false)?);
        unchanged.push(run(false)?);
        crate::check_interrupt()?;
    }
    Ok((changed, unchanged))
}

/// Runs `f(i)` for `i` in `0..n` on `n` threads at once; the first error
/// wins.
fn on_threads(
    n: usize,
    f: impl Fn(usize) -> std::result::Result<(), capsule_backend::BackendError> + Sync,
) -> Result<()> {
    let mut err = None;
    std::thread::scope(|s| {
        let f = &f;
        let hs: Vec<_> = (0..n).map(|i| s.spawn(move || f(i))).collect();
        for h in hs {
            if let Ok(Err(e)) = h.join() {
                err.get_or_insert(e);
            }
        }
    });
    match err {
        Some(e) => Err(e.into()),
        None => Ok(()),
    }
}

fn parallel_puts(b: &Arc<dyn LabBackend>, tag: &str, n: usize, size: u64) -> Result<()> {
    on_threads(n, |i| {
        b.put_stream(
            &format!("est/{tag}{i}"),
            size,
            &mut Noise::new(i as u64 + 9, size),
        )
    })
}

/// Reads back what [`parallel_puts`] wrote, in 4 MiB ranges, `n` reads at
/// once. Returns the bytes read.
fn parallel_gets(b: &Arc<dyn LabBackend>, tag: &str, n: usize, size: u64) -> Result<u64> {
    use std::sync::atomic::Ordering::Relaxed;
    let chunk = 4u64 << 20;
    let ranges: Vec<(usize, u64)> = (0..n)
        .flat_map(|i| (0..size.div_ceil(chunk)).map(move |k| (i, k * chunk)))
        .collect();
    let next = std::sync::atomic::AtomicUsize::new(0);
    let total = std::sync::atomic::AtomicU64::new(0);
    on_threads(n, |_| {
        while let Some(&(i, off)) = ranges.get(next.fetch_add(1, Relaxed)) {
            let got = b.get(&format!("est/{tag}{i}"), Some(off..(off + chunk).min(size)))?;
            total.fetch_add(got.len() as u64, Relaxed);
        }
        Ok(())
    })?;
    Ok(total.into_inner())
}

/// How far the probe's repeated whole runs (with one new file, and with
/// nothing new) lay from their medians.
pub(crate) fn probe_spread(runs: &(Vec<f64>, Vec<f64>)) -> f64 {
    spread_of(&runs.0).max(spread_of(&runs.1))
}
