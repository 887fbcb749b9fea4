//! `capsule estimate`: predicts the initial backup and a typical hourly run
//! of a source to a destination, for capsule and for per-file copying, next
//! to the "0.67 x a large-file copy" rule of thumb; then checks the model
//! against recorded runs and corrects it.
//!
//! The model has three measured parts:
//! * **this machine's pipeline** (scan, read, chunk, hash, compress,
//!   encrypt), from two small real backups of samples of the source into a
//!   local scratch repository: one of small files (cost per file), one of
//!   the largest files (cost per byte), and a no-change re-run of the small
//!   sample (cost per unchanged file);
//! * **the destination**, probed briefly: connect time, round trip,
//!   bandwidth of one stream and of the upload concurrency, and the time to
//!   write one small file with a flush;
//! * **fixed costs**, measured by doing them: a tiny repository in a
//!   scratch directory on the destination gets real backups, each in a new
//!   connection like a separate process, one with a new file and one with
//!   nothing new. Connecting, key derivation, opening the repository, the
//!   listings, new pack directories, and the commit's puts one after
//!   another all cost what they cost there, however many round trips that
//!   is on this protocol.
//!
//! An initial backup overlaps the pipeline with uploads, so it takes the
//! longer of the two plus fixed costs; an hourly run stats every file and
//! backs up what changed the same way.

mod calibrate;
mod destination;
mod model;
mod source;

use std::path::{Path, PathBuf};

use capsule_net::Destination;

use crate::dest::Connector;
use crate::history::History;
use crate::record::RunRecord;
use crate::{LabError, Result};
pub use calibrate::{calibrate, cold_and_warm};
pub use destination::probe_destination;
use model::median;
pub use model::{
    predict, predict_restore, predict_run, restore_parts, Calibration, Checked, DestProbe,
    Estimate, EstimateOptions, Prediction, ProbeRounds, RestoreParts, RestoreSample, TYPICAL_FILES,
};
pub use source::{scan, unchanged_per_file, SizeClass, SourceScan};

/// Sets recorded runs to `destination` against the model; returns the
/// checks and the correction factors (initial, hourly), each the median
/// actual/predicted ratio of the newest five runs of its kind.
pub fn check_history(
    runs: &[RunRecord],
    destination: &str,
    c: &Calibration,
    d: &DestProbe,
) -> (Vec<Checked>, (f64, f64)) {
    let mut checked = Vec::new();
    let (mut init, mut hourly) = (Vec::new(), Vec::new());
    for r in runs.iter().filter(|r| r.destination == destination) {
        let predicted = predict_run(c, d, r.files, r.files_read, r.bytes_read);
        let actual = r.total_secs();
        let initial = r.files_read * 2 >= r.files.max(1);
        if predicted > 0.0 {
            if initial { &mut init } else { &mut hourly }.push(actual / predicted);
        }
        checked.push(Checked {
            time: r.time.clone(),
            kind: if initial { "initial" } else { "hourly" }.into(),
            predicted,
            actual,
        });
    }
    let factor = |v: &mut Vec<f64>| {
        let n = v.len();
        if n == 0 {
            1.0
        } else {
            median(&mut v[n.saturating_sub(5)..]).clamp(0.33, 3.0)
        }
    };
    (checked, (factor(&mut init), factor(&mut hourly)))
}

/// Runs the whole estimate.
pub fn estimate(
    paths: &[PathBuf],
    dest: &Destination,
    conn: &Connector,
    history: Option<&History>,
    opts: &EstimateOptions,
    say: &dyn Fn(&str),
) -> Result<Estimate> {
    say("scanning the source");
    let (source, files) = scan(paths)?;
    let work = match &opts.work_dir {
        Some(d) => tempfile::Builder::new()
            .prefix("capsule-estimate-")
            .tempdir_in(d),
        None => tempfile::Builder::new()
            .prefix("capsule-estimate-")
            .tempdir(),
    }
    .map_err(|e| LabError::io("create a scratch directory", Path::new("temp"), e))?;
    crate::check_interrupt()?;
    say("measuring this machine on samples of the source");
    let calibration =
        calibrate(paths, &files, &source, work.path()).map_err(crate::or_interrupted)?;
    crate::check_interrupt()?;
    say(&format!("probing {dest}"));
    let probe = probe_destination(conn, dest, work.path()).map_err(crate::or_interrupted)?;
    let runs = history.map(|h| h.runs()).unwrap_or_default();
    let repo_name = opts.repository.clone().unwrap_or_else(|| dest.to_string());
    let (checked, correction) = check_history(&runs, &repo_name, &calibration, &probe);
    // The hourly change: given, else what recent hourly runs read.
    let recent: Vec<&RunRecord> = runs
        .iter()
        .filter(|r| r.destination == repo_name && r.files_read * 2 < r.files.max(1))
        .collect();
    let (hourly_files, hourly_bytes, hourly_basis) = match (opts.hourly_files, opts.hourly_bytes) {
        (Some(f), b) => (f, b.unwrap_or(f * 51_200), "given".to_string()),
        (None, Some(b)) => (b.div_ceil(51_200), b, "given".to_string()),
        (None, None) if !recent.is_empty() => {
            let tail = &recent[recent.len().saturating_sub(5)..];
            let mut f: Vec<f64> = tail.iter().map(|r| r.files_read as f64).collect();
            let mut b: Vec<f64> = tail.iter().map(|r| r.bytes_read as f64).collect();
            (
                median(&mut f) as u64,
                median(&mut b) as u64,
                format!("median of the last {} hourly runs", tail.len()),
            )
        }
        _ => (
            0,
            0,
            "no history and none given: a run with nothing changed".to_string(),
        ),
    };
    let model = predict(&calibration, &probe, &source, hourly_files, hourly_bytes);
    let predicted = Prediction {
        initial: model.initial * correction.0,
        hourly: model.hourly * correction.1,
        no_change: model.no_change * correction.1,
        typical_change: model.typical_change * correction.1,
        ..model.clone()
    };
    let uncertainty = calibration.spread.max(probe.rounds.spread);
    let initial_uncertainty = model::initial_uncertainty(uncertainty, &calibration);
    Ok(Estimate {
        destination: dest.to_string(),
        source,
        hourly_files,
        hourly_bytes,
        hourly_basis,
        calibration,
        probe,
        model,
        predicted,
        correction,
        history: checked,
        uncertainty,
        initial_uncertainty,
    })
}

#[cfg(test)]
mod tests {
    use super::calibrate::{fit, fit_restore, fit_restores, pick_cold};
    use super::model::spread_of;
    use super::source::{small_dirs, walk_sample};
    use super::*;

    fn cal() -> Calibration {
        Calibration {
            per_file: 1e-4,
            per_byte: 1e-8,
            per_unchanged_file: 1e-6,
            stored_ratio: 1.0,
            samples: [(0, 0); 2],
            restore_per_file: 5e-5,
            restore_per_byte: 2e-9,
            restore_cpu_per_file: 0.0,
            restore_cpu_per_byte: 0.0,
            cores: 0,
            ..Calibration::default()
        }
    }

    /// A source of `files` files and `bytes` bytes, no directories.
    fn shape(files: u64, bytes: u64) -> SourceScan {
        SourceScan {
            files,
            bytes,
            ..SourceScan::default()
        }
    }

    fn dest(rtt: f64, bw: f64) -> DestProbe {
        DestProbe {
            connect_secs: 0.05,
            rtt,
            stream_bw: bw,
            parallel_bw: bw,
            concurrency: 8,
            download_bw: bw,
            download_cpu_per_byte: 0.0,
            per_file_copy: 3.0 * rtt,
            run_changed: 0.6,
            run_unchanged: 0.4,
            rounds: ProbeRounds::default(),
        }
    }

    #[test]
    fn the_small_sample_takes_leaves_of_small_files_of_at_most_half_its_size() {
        let root = tempfile::tempdir().unwrap();
        let mut files = Vec::new();
        let mut add = |dir: &str, n: usize, size: u64| {
            let d = root.path().join(dir);
            std::fs::create_dir_all(&d).unwrap();
            for i in 0..n {
                let p = d.join(format!("f{i}"));
                std::fs::write(&p, b"x").unwrap();
                files.push((p, size));
            }
        };
        add("a", 40, 1000);
        add("b", 40, 2000);
        // A few large files beside one small one.
        add("lists", 3, 30 << 20);
        // One leaf larger than half the sample.
        add("huge", 500, 1000);
        files.push((root.path().join("lists/tiny"), 10));
        for seed in 1..20 {
            let got = small_dirs(&files, 100, seed);
            assert!(!got.is_empty());
            for d in &got {
                let name = d.file_name().unwrap().to_str().unwrap();
                assert!(name == "a" || name == "b", "took {name}");
            }
        }
        // Where only large leaves exist, they are taken all the same.
        let only_huge: Vec<_> = files
            .iter()
            .filter(|(p, _)| p.parent().unwrap().ends_with("huge"))
            .cloned()
            .collect();
        assert_eq!(small_dirs(&only_huge, 100, 7).len(), 1);
    }

    #[test]
    fn the_spread_is_the_farthest_round_from_the_median() {
        assert_eq!(spread_of(&[]), 0.0);
        assert!((spread_of(&[2.0, 2.2, 1.9]) - 0.1).abs() < 1e-9);
        // The probe's is its whole runs': round trips of 3, 1 and 1 µs to a
        // local disk are not ± 200%.
        let runs = (vec![0.30, 0.33, 0.27], vec![0.28, 0.28, 0.28]);
        assert!((super::destination::probe_spread(&runs) - 0.1).abs() < 1e-9);
        // One noisy round (a first connection) moves the median little.
        let mut rtt = vec![4.97, 2.68, 2.71];
        assert_eq!(median(&mut rtt), 2.71);
    }

    #[test]
    fn no_change_and_typical_change_are_predicted_beside_the_hourly_run() {
        let c = cal();
        let d = dest(0.010, 1e8);
        let s = SourceScan {
            files: 100_000,
            bytes: 1 << 30,
            ..SourceScan::default()
        };
        let p = predict(&c, &d, &s, 0, 0);
        assert_eq!(p.no_change, p.hourly);
        assert!((p.no_change - 0.5).abs() < 1e-6, "{}", p.no_change);
        assert!(p.typical_change > p.no_change);
        assert_eq!(
            p.typical_change,
            predict_run(&c, &d, 100_000, TYPICAL_FILES, TYPICAL_FILES * 51_200)
        );
    }

    #[test]
    fn slow_links_bound_initial_backups() {
        let c = cal();
        // 1 GB: pipeline 10 s + 1,000 files 0.1 s; upload at 10 MB/s 100 s.
        let t = predict_run(&c, &dest(0.002, 10e6), 1000, 1000, 1_000_000_000);
        assert!((100.0..103.0).contains(&t), "{t}");
        let fast = predict_run(&c, &dest(0.002, 1e9), 1000, 1000, 1_000_000_000);
        assert!((10.0..12.5).contains(&fast), "{fast}");
    }

    #[test]
    fn hourly_runs_cost_stats_and_round_trips() {
        let c = cal();
        let d = dest(0.010, 1e8);
        let t = predict_run(&c, &d, 100_000, 0, 0);
        // The measured no-change run + 100k x 1 us.
        assert!((t - 0.5).abs() < 1e-6, "{t}");
        // 100 new 50 KB files: the measured run with a change, 99.9k x 1 us,
        // the pipeline (0.01 s + 51 ms) over the upload (51 ms), and the
        // last pack's bytes at one stream (51 ms).
        let t = predict_run(&c, &d, 100_000, 100, 5_120_000);
        assert!((t - (0.6 + 0.0999 + 0.0612 + 0.0512)).abs() < 1e-6, "{t}");
    }

    #[test]
    fn restores_cost_the_larger_of_local_work_and_the_download() {
        let c = cal();
        // 1 GB, 1,000 files: local work 0.05 + 2 s; at 10 MB/s the download
        // is 100 s plus 239 reads of 4 MiB at 10 ms, 8 at once (0.3 s), and
        // 30% of the local work does not hide behind it.
        let t = predict_restore(&c, &dest(0.010, 10e6), &shape(1000, 1_000_000_000));
        let net = 100.0 + 239.0 * 0.010 / 8.0;
        assert!((t - (0.4 + net + 0.3 * 2.05)).abs() < 1e-6, "{t}");
        // On a fast link this machine's work bounds it.
        let t = predict_restore(&c, &dest(0.001, 1e10), &shape(1000, 1_000_000_000));
        let net = 0.1 + 239.0 * 0.001 / 8.0;
        assert!((t - (0.4 + 2.05 + 0.3 * net)).abs() < 1e-6, "{t}");
    }

    #[test]
    fn restores_need_the_cpu_of_both_halves_over_the_cores() {
        // 1 GB, 1,000 files, on 2 cores: local work 2.05 s, the download
        // at 1 GB/s 1.03 s, which would overlap into 2.05 + 0.3 x 1.03 s.
        // But writing takes 3 CPU seconds per GB and receiving 2: 5 CPU
        // seconds over 2 cores is 2.5 s (+ 5 ms per-file CPU).
        let c = Calibration {
            restore_cpu_per_file: 1e-5,
            restore_cpu_per_byte: 3e-9,
            cores: 2,
            ..cal()
        };
        let d = DestProbe {
            download_cpu_per_byte: 2e-9,
            ..dest(0.001, 1e9)
        };
        let t = predict_restore(&c, &d, &shape(1000, 1_000_000_000));
        assert!((t - (0.4 + 2.505)).abs() < 1e-6, "{t}");
        assert_eq!(
            restore_parts(&c, &d, &shape(1000, 1_000_000_000)).bound(),
            "this machine's cores"
        );
        // With CPU to spare, the overlap of the two halves decides, and
        // the local half is the disk's 2 s a GB.
        let spare = Calibration {
            cores: 8,
            restore_write_per_byte: 2e-9,
            ..c
        };
        let net = 1.0 + 239.0 * 0.001 / 8.0;
        let t = predict_restore(&spare, &d, &shape(1000, 1_000_000_000));
        assert!((t - (0.4 + 2.0 + 0.3 * net)).abs() < 1e-6, "{t}");
        assert_eq!(
            restore_parts(&spare, &d, &shape(1000, 1_000_000_000)).bound(),
            "writing here"
        );
    }

    #[test]
    fn restore_costs_fit_two_samples_or_split_one() {
        // 1,000 files of 50 KB in 0.15 s; 10 files of 10 MB in 0.2 s:
        // 0.1 ms per file and 1 ns per byte.
        let (f, b) = fit_restore(Some((1000.0, 5e7, 0.15)), Some((10.0, 1e8, 0.101)));
        assert!(
            (f - 1e-4).abs() < 1e-9 && (b - 1e-9).abs() < 1e-12,
            "{f} {b}"
        );
        let (f, b) = fit_restore(Some((1000.0, 5e7, 0.2)), None);
        assert!(
            (f - 1e-4).abs() < 1e-12 && (b - 2e-9).abs() < 1e-15,
            "{f} {b}"
        );
        assert_eq!(fit_restore(None, None), (0.0, 0.0));
    }

    /// A restored sample: its name, files, directories, bytes, seconds
    /// and CPU seconds.
    fn restored(name: &str, files: u64, dirs: u64, bytes: u64, secs: f64) -> RestoreSample {
        restored_cpu(name, files, dirs, bytes, secs, secs / 2.0)
    }

    /// As [`restored`], with its CPU seconds.
    fn restored_cpu(
        name: &str,
        files: u64,
        dirs: u64,
        bytes: u64,
        secs: f64,
        cpu: f64,
    ) -> RestoreSample {
        RestoreSample {
            name: name.into(),
            files,
            dirs,
            others: 0,
            bytes,
            secs,
            cpu,
        }
    }

    #[test]
    fn a_restores_directories_are_priced_apart_from_its_files() {
        // This machine: a restore costs 0.1 s to start, 20 µs a file,
        // 80 µs a directory (those above the sample's paths among them)
        // and 1 ns a byte.
        let secs = |files: u64, dirs: u64, bytes: u64| {
            0.1 + 20e-6 * files as f64 + 80e-6 * dirs as f64 + 1e-9 * bytes as f64
        };
        let at = |small_dirs: u64| {
            let samples = [
                restored("empty", 0, 5, 0, secs(0, 5, 0)),
                restored("dirs", 0, 935, 0, secs(0, 935, 0)),
                restored(
                    "small",
                    1000,
                    small_dirs,
                    8_000_000,
                    secs(1000, small_dirs, 8_000_000),
                ),
                restored("large", 2, 5, 200_000_000, secs(2, 5, 200_000_000)),
            ];
            fit_restores(&samples)
        };
        // Two estimates in a row drew small samples of 1,000 files from 70
        // leaves and from 250 (with the directories above them): the
        // costs they find are the same, and they are this machine's.
        for small_dirs in [74, 254] {
            let c = at(small_dirs);
            assert!((c.secs.per_file - 20e-6).abs() < 1e-9, "{c:?}");
            assert!((c.secs.per_dir - 80e-6).abs() < 1e-9, "{c:?}");
            assert!((c.secs.per_byte - 1e-9).abs() < 1e-13, "{c:?}");
            assert!((c.cpu.per_dir - 40e-6).abs() < 1e-9, "{c:?}");
        }
        // Charged to the files, the directories moved the per-file cost by
        // half between the two samples.
        let per_file_only = |small_dirs: u64| {
            let (f, _) = fit_restore(
                Some((
                    1000.0,
                    8e6,
                    secs(1000, small_dirs, 8_000_000) - secs(0, 5, 0),
                )),
                Some((2.0, 2e8, secs(2, 5, 200_000_000) - secs(0, 5, 0))),
            );
            f
        };
        assert!(per_file_only(254) / per_file_only(74) > 1.5);
        let c = Calibration {
            restore_per_file: at(254).secs.per_file,
            restore_per_dir: at(254).secs.per_dir,
            restore_per_byte: at(254).secs.per_byte,
            ..cal()
        };
        let tree = SourceScan {
            files: 65_000,
            dirs: 2_800,
            bytes: 0,
            ..SourceScan::default()
        };
        let local = restore_parts(&c, &dest(0.001, 1e10), &tree).local;
        assert!(
            (local - (65_000.0 * 20e-6 + 2_800.0 * 80e-6)).abs() < 1e-6,
            "{local}"
        );
    }

    #[test]
    fn the_leaves_and_the_subtree_are_pooled_less_their_directories() {
        // This machine: 31 µs a file, 40 µs a directory, 2.24 ns a byte,
        // 0.14 s to start; the samples' rounds off by a few percent each
        // way, as they are.
        let cost = |f: u64, d: u64, b: u64| {
            0.14 + 31e-6 * f as f64 + 40e-6 * d as f64 + 2.24e-9 * b as f64
        };
        let samples = |small_noise: f64, tree_noise: f64| {
            [
                restored("empty", 0, 3, 0, cost(0, 3, 0)),
                restored("dirs", 0, 933, 0, cost(0, 933, 0)),
                restored(
                    "small",
                    1000,
                    464,
                    13_390_389,
                    cost(1000, 464, 13_390_389) * small_noise,
                ),
                restored(
                    "tree",
                    2091,
                    271,
                    66_391_538,
                    cost(2091, 271, 66_391_538) * tree_noise,
                ),
                restored("large", 1, 4, 153_621_360, cost(1, 4, 153_621_360)),
            ]
        };
        let exact = fit_restores(&samples(1.0, 1.0)).secs;
        assert!((exact.per_file - 31e-6).abs() < 1e-9, "{exact:?}");
        assert!((exact.per_dir - 40e-6).abs() < 1e-9, "{exact:?}");
        assert!((exact.per_byte - 2.24e-9).abs() < 1e-13, "{exact:?}");
        // Noise of ±5% on the two small samples moves a file's cost by
        // less than a third (the pooled point has 3,091 files).
        for (a, b) in [(1.05, 0.95), (0.95, 1.05), (1.05, 1.05), (0.95, 0.95)] {
            let c = fit_restores(&samples(a, b)).secs;
            assert!((c.per_file / 31e-6 - 1.0).abs() < 0.33, "{a} {b}: {c:?}");
        }
    }

    #[test]
    fn a_restore_reads_its_trees_a_level_at_a_time() {
        // The same files 16 levels deep: at 10 ms, 16 round trips before
        // the first file's contents (the trace: 48 tree reads in 16
        // rounds); on a local disk, next to nothing.
        let c = cal();
        let deep = SourceScan {
            depth: 16,
            ..shape(1000, 1_000_000_000)
        };
        let flat = shape(1000, 1_000_000_000);
        let far = dest(0.010, 1e9);
        let extra = predict_restore(&c, &far, &deep) - predict_restore(&c, &far, &flat);
        assert!((extra - 0.16).abs() < 1e-9, "{extra}");
        assert!((restore_parts(&c, &far, &deep).trees - 0.16).abs() < 1e-9);
        let near = dest(0.0001, 1e9);
        assert!(restore_parts(&c, &near, &deep).trees < 0.002);
        // The scan counts the levels from the root.
        let t = tempfile::tempdir().unwrap();
        let leaf = t.path().join("a/b/c");
        std::fs::create_dir_all(&leaf).unwrap();
        std::fs::write(leaf.join("f"), b"x").unwrap();
        let (s, _) = scan(&[t.path().to_path_buf()]).unwrap();
        assert_eq!(s.depth, leaf.components().count() as u64);
    }

    /// The restore samples of an estimate of a 65,194-file tree over S3
    /// at 5 ms (bench/estimate.sh's `mix`), 2 cores, as `--json` gave them:
    /// name, files, directories, bytes, seconds, CPU seconds.
    fn measured_samples() -> Vec<RestoreSample> {
        [
            ("empty", 0, 5, 0, 0.000_905, 0.000_987),
            ("dirs", 0, 935, 0, 0.026_572, 0.026_821),
            ("small", 1053, 156, 8_254_440, 0.074_728, 0.074_688),
            ("large", 1, 4, 153_621_360, 0.288_751, 0.553_341),
        ]
        .into_iter()
        .map(|(name, files, dirs, bytes, secs, cpu)| {
            restored_cpu(name, files, dirs, bytes, secs, cpu)
        })
        .collect()
    }

    #[test]
    fn a_restores_local_work_is_its_cpu_over_the_cores_not_the_samples_walls_added() {
        // The wrong term: the small sample ran on one core (74.7 ms of
        // wall, 74.7 ms of CPU) and the large one on two (289 ms, 553 ms).
        // Fitted together, wall time charged a file 51 µs where it costs
        // 38 µs of CPU, and the 65,194 files' local work came to 6.1 s of
        // a restore that took 5.07 s in all (using 6.67 CPU seconds).
        let samples = measured_samples();
        let costs = fit_restores(&samples);
        let c = costs.into_calibration(Calibration {
            stored_ratio: 0.426,
            cores: 2,
            ..Calibration::default()
        });
        let tree = SourceScan {
            files: 65_194,
            dirs: 2_835,
            bytes: 1_409_666_899,
            ..SourceScan::default()
        };
        let walls_added = costs.secs.per_file * 65_194.0
            + costs.secs.per_dir * 2_835.0
            + costs.secs.per_byte * 1_409_666_899.0;
        assert!(walls_added > 6.0, "{walls_added}");
        let local = restore_parts(&c, &dest(0.005, 3e8), &tree).local;
        let cpu = costs.cpu.per_file * 65_194.0
            + costs.cpu.per_dir * 2_835.0
            + costs.cpu.per_byte * 1_409_666_899.0;
        assert!((local - cpu / 2.0).abs() < 1e-9, "{local} {cpu}");
        assert!((3.5..4.1).contains(&local), "{local}");
        // Hardly any time off the CPU in the small sample: the disk kept up.
        assert!(costs.wait_per_file < 1e-6, "{}", costs.wait_per_file);
        // A disk slower than the cores bounds it instead: the large
        // sample's wall per byte at a tenth of the speed.
        let slow = Calibration {
            restore_write_per_byte: costs.write_per_byte * 10.0,
            ..c
        };
        let local = restore_parts(&slow, &dest(0.005, 3e8), &tree).local;
        assert!(local > 20.0, "{local}");
    }

    #[test]
    fn history_corrects_by_median_ratio() {
        let c = cal();
        let d = dest(0.002, 1e8);
        let mk = |files_read, secs| RunRecord {
            files_read,
            backup_secs: secs,
            ..crate::record::test_record("x", 0, 1000)
        };
        let base = predict_run(&c, &d, 1000, 0, 0);
        let runs = vec![mk(0, base * 2.0), mk(0, base * 2.0), mk(0, base * 4.0)];
        let (checked, (i, h)) = check_history(&runs, "x", &c, &d);
        assert_eq!(checked.len(), 3);
        assert_eq!(i, 1.0);
        assert!((h - 2.0).abs() < 1e-9, "{h}");
        // Other destinations do not count.
        assert!(check_history(&runs, "y", &c, &d).0.is_empty());
    }

    fn round(secs: f64, read: f64) -> RunRecord {
        let mut r = crate::record::test_record("local", 0, 1000);
        r.backup_secs = secs;
        r.stages.read = read;
        r
    }

    /// A sample's run: `files` files and `bytes` bytes read at these costs,
    /// over a fixed 0.1 s.
    fn run(files: u64, bytes: u64, per_file: f64, per_byte: f64) -> RunRecord {
        RunRecord {
            files_read: files,
            bytes_read: bytes,
            backup_secs: 0.1 + files as f64 * per_file + bytes as f64 * per_byte,
            ..round(0.0, 0.0)
        }
    }

    /// Recorded sample rounds: a round disturbed by something else is
    /// discounted (the median stands), and a first round that read the
    /// source cold is recognised and stands for the backup, which will
    /// read it cold too.
    #[test]
    fn the_run_with_nothing_changed_is_scaled_by_the_walk_of_a_whole_subtree() {
        let f = |p: &str, n: u64| (PathBuf::from(p), n);
        let mut files = Vec::new();
        // /s/a: 3,000 small files in 30 directories; /s/b: 12,000 (too
        // many); /s/c: 2,000 of 100 KiB (too many bytes); /s/d: 500 (too
        // few). /s/a is taken, whole.
        for i in 0..3_000 {
            files.push(f(&format!("/s/a/{}/{i}", i % 30), 1_000));
        }
        for i in 0..12_000 {
            files.push(f(&format!("/s/b/{i}"), 10));
        }
        for i in 0..2_000 {
            files.push(f(&format!("/s/c/{i}"), 100 << 10));
        }
        for i in 0..500 {
            files.push(f(&format!("/s/d/{i}"), 10));
        }
        let roots = [PathBuf::from("/s")];
        assert_eq!(walk_sample(&files, &roots), Some(PathBuf::from("/s/a")));
        // One flat directory of 20,000 files: nothing fits.
        let flat: Vec<_> = (0..20_000).map(|i| f(&format!("/flat/{i}"), 1)).collect();
        assert_eq!(walk_sample(&flat, &[PathBuf::from("/flat")]), None);
        // The sample's run took 12 ms over an empty run's 2 ms, its walk
        // 20 ms: half a walk. The source's walk took 300 ms over 100,000
        // files: 1.5 µs a file.
        let per = unchanged_per_file(0.012, 0.002, 0.020, 0.300, 100_000).unwrap();
        assert!((per - 1.5e-6).abs() < 1e-12, "{per}");
        // No walk to scale by: none.
        assert_eq!(unchanged_per_file(0.012, 0.002, 0.0, 0.3, 100_000), None);
        // An empty run slower than the sample's (noise): no negative cost.
        assert_eq!(
            unchanged_per_file(0.002, 0.003, 0.02, 0.3, 100_000),
            Some(0.0)
        );
    }

    #[test]
    fn the_first_round_is_the_cold_one_and_the_warm_one_is_not_the_disturbed() {
        let rounds = [round(0.55, 0.30), round(0.41, 0.012), round(0.21, 0.011)];
        let (cold, warm) = cold_and_warm(&rounds);
        assert_eq!((cold.backup_secs, warm.backup_secs), (0.55, 0.21));
        let (cold, warm) = cold_and_warm(&rounds[..1]);
        assert_eq!((cold.backup_secs, warm.backup_secs), (0.55, 0.55));
    }

    #[test]
    fn the_two_samples_tell_the_cost_per_file_from_the_cost_per_byte() {
        // 1,000 small files and 100 MB: 50 µs a file and 4 ns a byte cold,
        // 20 µs and 1 ns warm, over a fixed 0.1 s.
        let empty = round(0.1, 0.0);
        let (f, b) = fit(
            Some(&run(1000, 10_000_000, 50e-6, 4e-9)),
            Some(&run(100, 100_000_000, 50e-6, 4e-9)),
            &empty,
        );
        assert!(
            (f - 50e-6).abs() < 1e-9 && (b - 4e-9).abs() < 1e-13,
            "{f} {b}"
        );
        let (wf, wb) = fit(
            Some(&run(1000, 10_000_000, 20e-6, 1e-9)),
            Some(&run(100, 100_000_000, 20e-6, 1e-9)),
            &empty,
        );
        assert!((wf - 20e-6).abs() < 1e-9 && (wb - 1e-9).abs() < 1e-13);
    }

    /// The term that was wrong in the initial backup's estimate: the disk's
    /// cold read, measured once, moved estimates in a row by up to 44%
    /// while each said ± 12-30%. Three disjoint samples read cold: the
    /// median stands for the backup, their spread for its uncertainty.
    #[test]
    fn the_cold_read_is_the_median_of_three_samples_and_their_spread_is_told() {
        let empty = round(0.1, 0.0);
        // The disk read the second pair of samples at twice the cost per
        // file, the third at 1.2 times.
        let small = [
            run(1000, 10_000_000, 100e-6, 4e-9),
            run(1000, 10_000_000, 200e-6, 4e-9),
            run(1000, 10_000_000, 120e-6, 4e-9),
        ];
        let large = [
            run(100, 100_000_000, 100e-6, 4e-9),
            run(100, 100_000_000, 200e-6, 4e-9),
            run(100, 100_000_000, 120e-6, 4e-9),
        ];
        // A source of 50,000 files and 1 GB: 5 + 4, 10 + 4, 6 + 4 s.
        let ((f, b), spread) = pick_cold(&small, &large, &empty, 50_000, 1_000_000_000);
        assert!(
            (f - 120e-6).abs() < 1e-9 && (b - 4e-9).abs() < 1e-13,
            "{f} {b}"
        );
        assert!((spread - 4.0 / 10.0).abs() < 1e-6, "{spread}");
        // One sample of each: its own costs, nothing known of the spread.
        let ((f, _), spread) = pick_cold(&small[1..2], &large[1..2], &empty, 50_000, 0);
        assert!((f - 200e-6).abs() < 1e-9 && spread == 0.0);
        // More small samples than large (a source of few large files): the
        // first large one stands beside each.
        let ((f, _), _) = pick_cold(&small, &large[..1], &empty, 50_000, 0);
        assert!(f > 100e-6, "{f}");
        // The initial backup's uncertainty holds the cold spread for the
        // share of the source not cached, and never less than the rest's.
        let c = Calibration {
            cold_spread: 0.4,
            cached_share: 0.25,
            ..Calibration::default()
        };
        assert!((model::initial_uncertainty(0.1, &c) - 0.3).abs() < 1e-12);
        assert_eq!(model::initial_uncertainty(0.5, &c), 0.5);
    }
}
