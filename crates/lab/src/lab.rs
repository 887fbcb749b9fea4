//! `capsule lab`: the probes, then the seed protocol on a real source, then
//! the same files copied one by one, optionally again with the destination
//! nearly full. Everything the lab writes lives under one scratch directory
//! (`capsule-lab-<random>`) of the destination and is removed at the end,
//! whether the runs succeeded or not.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use capsule_backend::LabBackend;
use capsule_engine::backup::BackupOptions;
use capsule_engine::progress::Progress;
use capsule_engine::repo::InitOptions;
use capsule_engine::timefmt::{now_unix, rfc3339};
use capsule_net::Destination;
use serde::{Deserialize, Serialize};

use crate::bound::{analyze, Bound, RunFacts};
use crate::dest::{delete_all, kind, Connector, Opened};
use crate::probe::{self, Noise, Probe, ProbeOptions, SpaceReport, SyncMode};
use crate::record::{cores, from_backup, DestCounters, RunContext, RunRecord};
use crate::series::{Recorder, Sample, Sources};
use crate::{LabError, Result};

/// Version of the lab report layout.
pub const LAB_VERSION: u32 = 1;

/// What `capsule lab` does.
#[derive(Debug, Clone)]
pub struct LabOptions {
    /// Probe sizes.
    pub probe: ProbeOptions,
    /// Run the seed protocol and the per-file copy.
    pub seed: bool,
    /// Source tree for the seed protocol; `None` generates one.
    pub source: Option<PathBuf>,
    /// Size of the generated source.
    pub generate_bytes: u64,
    /// Files added for the third run (and copied one by one).
    pub added_files: usize,
    /// Size of each added file.
    pub added_size: usize,
    /// Stop the per-file copy after this long and extrapolate.
    pub per_file_budget: Duration,
    /// Fill the destination to this percentage and run the seed protocol
    /// again (the caller has the user's consent).
    pub fill_to: Option<f64>,
    /// Where local scratch files go (default: the system temp directory).
    pub work_dir: Option<PathBuf>,
}

impl Default for LabOptions {
    fn default() -> Self {
        LabOptions {
            probe: ProbeOptions::default(),
            seed: true,
            source: None,
            generate_bytes: 256 << 20,
            added_files: 10_000,
            added_size: 50 * 1024,
            per_file_budget: Duration::from_secs(300),
            fill_to: None,
            work_dir: None,
        }
    }
}

/// The seed protocol's three runs.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Seed {
    /// The source: a path, or "generated".
    pub source: String,
    /// Files added before the third run.
    pub added_files: usize,
    /// Their bytes.
    pub added_bytes: u64,
    /// First backup into an empty repository.
    pub initial: RunRecord,
    /// Second run, nothing changed.
    pub no_change: RunRecord,
    /// Third run, after adding the files.
    pub added: RunRecord,
}

/// The same added files written one at a time, each flushed: what Time
/// Machine and `cp` to a share do.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PerFile {
    /// Files to copy.
    pub files: usize,
    /// Files copied before the time budget ran out.
    pub copied: usize,
    /// Bytes copied.
    pub bytes: u64,
    /// Seconds for those.
    pub secs: f64,
    /// Files per second.
    pub files_per_s: f64,
    /// Seconds for all of them (measured, or extrapolated at the same rate).
    pub all_secs: f64,
    /// The destination's counters.
    pub counters: DestCounters,
    /// What bounded it.
    pub bound: Bound,
    /// Time series.
    pub series: Vec<Sample>,
}

/// The seed protocol again, with the destination nearly full.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Full {
    /// Requested fill, percent.
    pub fill_to: f64,
    /// Bytes of filler written.
    pub filled_bytes: u64,
    /// Space while full.
    pub space: Option<SpaceReport>,
    /// The runs.
    pub seed: Seed,
}

/// A plain statement of what the lab found.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Finding {
    /// What it is about (`latency`, `sync`, `per_file`…).
    pub topic: String,
    /// The statement.
    pub text: String,
}

/// What clean-up did.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Cleanup {
    /// Objects the lab removed.
    pub objects_removed: u64,
    /// Free space before the lab wrote anything.
    pub free_before: Option<u64>,
    /// Free space after clean-up.
    pub free_after: Option<u64>,
}

/// Everything `capsule lab` measured.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LabReport {
    /// [`LAB_VERSION`].
    pub version: u32,
    /// Name under which the report is kept (`capsule report <id>`).
    pub id: String,
    /// Start, RFC 3339.
    pub time: String,
    /// The destination measured.
    pub destination: String,
    /// Its kind (local, smb, sftp, s3).
    pub kind: String,
    /// CPU cores here.
    pub cores: usize,
    /// Seconds to connect and log in.
    pub connect_secs: f64,
    /// The probes.
    pub probe: Probe,
    /// The seed protocol.
    pub seed: Option<Seed>,
    /// The per-file copy.
    pub per_file: Option<PerFile>,
    /// The nearly-full runs.
    pub full: Option<Full>,
    /// Conclusions.
    pub findings: Vec<Finding>,
    /// Clean-up.
    pub cleanup: Cleanup,
}

/// Runs the lab against `dest`. `say` receives one line per step.
pub fn run(
    dest: &Destination,
    conn: &Connector,
    opts: &LabOptions,
    say: &dyn Fn(&str),
) -> Result<LabReport> {
    let started = now_unix();
    let id = format!(
        "{}-{}",
        rfc3339(started)
            .replace([':', '-'], "")
            .trim_end_matches('Z'),
        &crate::random_hex(3)
    );
    let scratch = dest.join(&format!("capsule-lab-{}", crate::random_hex(4)));
    say(&format!("connecting to {dest}"));
    let opened = conn.open(&scratch, true)?;
    let b = opened.backend.clone();
    let free_before = b.space().ok().flatten().map(|s| s.free);
    if let Some(pct) = opts.fill_to {
        // Refuse before writing anything.
        if !opts.seed {
            return Err(LabError::Refused(
                "--fill-to runs the seed backups on a nearly full destination; it cannot be combined with --no-seed".into(),
            ));
        }
        if !(1.0..=99.0).contains(&pct) {
            return Err(LabError::Refused(format!(
                "--fill-to {pct}: give a percentage between 1 and 99"
            )));
        }
        if free_before.is_none() {
            let _ = b.remove_empty_dirs();
            return Err(LabError::Refused(
                "--fill-to: this destination does not report its free space, so the lab cannot tell how much to write; not filling".into(),
            ));
        }
    }
    let mut cleanup = Cleanup {
        free_before,
        ..Cleanup::default()
    };
    let work = match &opts.work_dir {
        Some(d) => tempfile::Builder::new()
            .prefix("capsule-lab-")
            .tempdir_in(d),
        None => tempfile::Builder::new().prefix("capsule-lab-").tempdir(),
    }
    .map_err(|e| LabError::io("create a scratch directory", Path::new("temp"), e))?;

    let result = measure(dest, &scratch, conn, &opened, opts, work.path(), say);
    say("cleaning up");
    // Always: whatever failed, the destination gets its space back.
    cleanup.objects_removed = delete_all(&*b, "", 16).unwrap_or(0);
    // Measured before the scratch directory itself goes (statvfs needs it).
    cleanup.free_after = b.space().ok().flatten().map(|s| s.free);
    let _ = b.remove_empty_dirs();
    // Whatever an interrupted step failed with, the cause is the interrupt.
    let (probe, seed, per_file, full) = result.map_err(crate::or_interrupted)?;
    let mut report = LabReport {
        version: LAB_VERSION,
        id,
        time: rfc3339(started),
        destination: dest.to_string(),
        kind: kind(dest).into(),
        cores: cores(),
        connect_secs: opened.connect_secs,
        probe,
        seed,
        per_file,
        full,
        findings: Vec::new(),
        cleanup,
    };
    report.findings = findings(&report);
    Ok(report)
}

type Measured = (Probe, Option<Seed>, Option<PerFile>, Option<Full>);

fn measure(
    dest: &Destination,
    scratch: &Destination,
    conn: &Connector,
    opened: &Opened,
    opts: &LabOptions,
    work: &Path,
    say: &dyn Fn(&str),
) -> Result<Measured> {
    let b = &opened.backend;
    let p = &opts.probe;
    let mut notes = Vec::new();
    step(say, "measuring round trips")?;
    let rtt = probe::round_trip(&**b, p.rtt_samples)?;
    let space = probe::space(&**b)?;
    // Never let the sequential probe fill the destination.
    let mut size = p.size;
    if let Some(s) = space {
        let cap = s.free / 4;
        if size > cap {
            notes.push(format!(
                "sequential size reduced from {} to {} MB: only {} MB free",
                size / 1_000_000,
                cap / 1_000_000,
                s.free / 1_000_000
            ));
            size = cap;
        }
    }
    let (write, read) = if size >= 1 << 20 {
        step(say, &format!("writing and reading {} MB", size / 1_000_000))?;
        let (w, r) = probe::sequential(&**b, size)?;
        (Some(w), Some(r))
    } else {
        notes.push("sequential probe skipped: less than 4 MB free".into());
        (None, None)
    };
    step(
        say,
        &format!(
            "creating, listing, reading, deleting 2 x {} small objects",
            p.small_files
        ),
    )?;
    let small = Some(probe::small_objects(&**b, p.small_files, p.small_size)?);
    step(say, "testing for forced synchronous writes")?;
    let sync = probe::forced_sync(&**b, Some(kind(dest)), p.sync_samples)?;
    let probe = Probe {
        rtt,
        write,
        read,
        small,
        sync,
        space,
        notes,
    };
    if !opts.seed {
        return Ok((probe, None, None, None));
    }
    let hints = Hints {
        rtt: Some(probe.rtt.median_ms / 1e3),
        bandwidth: probe.write.as_ref().map(|w| w.mb_per_s * 1e6),
    };

    let (source, source_name) = match &opts.source {
        Some(s) => (s.clone(), s.display().to_string()),
        None => {
            let dir = work.join("source");
            step(
                say,
                &format!(
                    "generating a {} MB source tree",
                    opts.generate_bytes / 1_000_000
                ),
            )?;
            generate_source(&dir, opts.generate_bytes)?;
            (dir, "generated".to_string())
        }
    };
    let added = work.join("added");
    std::fs::create_dir_all(&added).map_err(|e| LabError::io("create", &added, e))?;
    let seed = seed_protocol(
        conn,
        &scratch.join("repo"),
        &[source.clone(), added.clone()],
        &added,
        opts,
        &work.join("cache"),
        &source_name,
        hints,
        say,
    )?;

    step(
        say,
        &format!("copying the {} added files one by one", opts.added_files),
    )?;
    let per_file = per_file_copy(opened, &added, opts.per_file_budget, hints)?;
    let _ = delete_all(&**b, "perfile/", 16);

    let full = match opts.fill_to {
        None => None,
        Some(pct) => Some(nearly_full(
            conn,
            scratch,
            b,
            pct,
            &[source, added, work.join("added-full")],
            opts,
            work,
            &source_name,
            hints,
            say,
        )?),
    };
    Ok((probe, Some(seed), Some(per_file), full))
}

/// Announces a step, unless the lab was interrupted: steps are where it
/// stops.
fn step(say: &dyn Fn(&str), what: &str) -> Result<()> {
    crate::check_interrupt()?;
    say(what);
    Ok(())
}

/// What is known of the destination, for bound analysis.
#[derive(Debug, Clone, Copy, Default)]
pub struct Hints {
    /// Round trip, seconds.
    pub rtt: Option<f64>,
    /// Bandwidth, bytes/s.
    pub bandwidth: Option<f64>,
}

#[allow(clippy::too_many_arguments)]
fn seed_protocol(
    conn: &Connector,
    repo: &Destination,
    paths: &[PathBuf],
    added: &Path,
    opts: &LabOptions,
    cache: &Path,
    source_name: &str,
    hints: Hints,
    say: &dyn Fn(&str),
) -> Result<Seed> {
    let password = crate::random_hex(16).into_bytes();
    // Change detection re-reads anything modified within a second of the
    // parent snapshot (see docs/DESIGN.md): a tree generated just now would
    // make the no-change run read everything again.
    std::thread::sleep(Duration::from_millis(1100));
    step(say, "seed 1/3: initial backup")?;
    let initial = backup_step(conn, repo, &password, paths, true, cache, hints)?;
    step(say, "seed 2/3: no-change run")?;
    let no_change = backup_step(conn, repo, &password, paths, false, cache, hints)?;
    step(
        say,
        &format!(
            "seed 3/3: adding {} files of {} KB",
            opts.added_files,
            opts.added_size / 1000
        ),
    )?;
    let added_bytes = generate_files(added, opts.added_files, opts.added_size, 0xadd)?;
    let added = backup_step(conn, repo, &password, paths, false, cache, hints)?;
    Ok(Seed {
        source: source_name.to_string(),
        added_files: opts.added_files,
        added_bytes,
        initial,
        no_change,
        added,
    })
}

/// One backup as a separate run would do it: connect, open the repository
/// (with a local cache), back up.
pub fn backup_step(
    conn: &Connector,
    dest: &Destination,
    password: &[u8],
    paths: &[PathBuf],
    init: bool,
    cache: &Path,
    hints: Hints,
) -> Result<RunRecord> {
    let access = conn.access(dest, cache);
    let early = access.start_key(password);
    let stack = conn.open(dest, init)?;
    let stats = stack.requests.clone();
    let connect_secs = stack.connect_secs;
    let opened = if init {
        stack.init(&access, password, &InitOptions::default())?
    } else {
        stack.open(&access, password, early)?
    };
    let open_secs = opened.open_secs;
    let repo_id = opened.repo.config().id.clone();
    let progress = Arc::new(Progress::default());
    let before = DestCounters::read(&stats);
    stats
        .max_in_flight
        .store(0, std::sync::atomic::Ordering::Relaxed);
    let rec = Recorder::start(
        Sources {
            progress: Some(progress.clone()),
            requests: Some(stats.clone()),
        },
        Duration::from_millis(100),
    );
    let start_unix = now_unix();
    let report = opened
        .backup(
            BackupOptions {
                paths: paths.to_vec(),
                ignore_file: None,
                ..BackupOptions::default()
            },
            capsule_access::WhenFull::DeleteOldest,
            &progress,
            &mut |_| {},
        )
        .map(|run| run.report);
    let series = rec.finish();
    let report = report?;
    let counters = DestCounters::read(&stats).since(&before);
    Ok(from_backup(
        &report,
        start_unix,
        RunContext {
            destination: dest.to_string(),
            repository: repo_id,
            paths: paths.iter().map(|p| p.display().to_string()).collect(),
            connect_secs,
            open_secs,
            counters,
            series,
            rtt: hints.rtt,
            bandwidth: hints.bandwidth,
        },
    ))
}

/// Files below `dir`, sorted, as (relative name, path).
fn files_below(dir: &Path) -> Result<Vec<(String, PathBuf)>> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).map_err(|e| LabError::io("list", &d, e))? {
            let e = e.map_err(|e| LabError::io("list", &d, e))?;
            let p = e.path();
            let t = e.file_type().map_err(|e| LabError::io("stat", &p, e))?;
            if t.is_dir() {
                stack.push(p);
            } else if t.is_file() {
                let rel = p
                    .strip_prefix(dir)
                    .unwrap_or(&p)
                    .to_string_lossy()
                    .into_owned();
                out.push((rel, p));
            }
        }
    }
    out.sort();
    Ok(out)
}

fn per_file_copy(opened: &Opened, dir: &Path, budget: Duration, hints: Hints) -> Result<PerFile> {
    let b = &opened.backend;
    let stats = Some(opened.requests.clone());
    let files = files_below(dir)?;
    let progress = Arc::new(Progress::default());
    let before = stats.as_ref().map(|s| DestCounters::read(s));
    let rec = Recorder::start(
        Sources {
            progress: Some(progress.clone()),
            requests: stats.clone(),
        },
        Duration::from_millis(100),
    );
    let t = Instant::now();
    let mut bytes = 0u64;
    let mut copied = 0usize;
    let mut result = Ok(());
    for (rel, path) in &files {
        if t.elapsed() >= budget {
            break;
        }
        if let Err(e) = crate::check_interrupt() {
            result = Err(e);
            break;
        }
        let data = match std::fs::read(path) {
            Ok(d) => d,
            Err(e) => {
                result = Err(LabError::io("read", path, e));
                break;
            }
        };
        if let Err(e) = b.probe_write(&format!("perfile/{rel}"), &data, 1, true) {
            result = Err(e.into());
            break;
        }
        bytes += data.len() as u64;
        copied += 1;
        Progress::add(&progress.files_done, 1);
        Progress::add(&progress.bytes_done, data.len() as u64);
    }
    let secs = t.elapsed().as_secs_f64();
    let series = rec.finish();
    result?;
    let counters = match (&stats, before) {
        (Some(s), Some(b)) => DestCounters::read(s).since(&b),
        _ => DestCounters::default(),
    };
    let bound = analyze(&RunFacts {
        wall: secs,
        cores: cores() as f64,
        requests: counters.requests,
        bytes_moved: counters.bytes_up + counters.bytes_down,
        dest_busy: counters.busy_secs,
        request_secs: counters.request_secs,
        rtt: hints.rtt,
        bandwidth: hints.bandwidth,
        ..RunFacts::default()
    });
    let rate = copied as f64 / secs.max(1e-9);
    Ok(PerFile {
        files: files.len(),
        copied,
        bytes,
        secs,
        files_per_s: rate,
        all_secs: if copied == files.len() {
            secs
        } else {
            files.len() as f64 / rate.max(1e-9)
        },
        counters,
        bound,
        series,
    })
}

#[allow(clippy::too_many_arguments)]
fn nearly_full(
    conn: &Connector,
    scratch: &Destination,
    b: &Arc<dyn LabBackend>,
    pct: f64,
    paths: &[PathBuf],
    opts: &LabOptions,
    work: &Path,
    source_name: &str,
    hints: Hints,
    say: &dyn Fn(&str),
) -> Result<Full> {
    if !(1.0..=99.0).contains(&pct) {
        return Err(LabError::Refused(format!(
            "--fill-to {pct}: give a percentage between 1 and 99"
        )));
    }
    let Some(space) = probe::space(&**b)? else {
        return Err(LabError::Refused(
            "--fill-to: this destination does not report its free space, so the lab cannot tell how much to write or whether it could remove it; not filling".into(),
        ));
    };
    let target_used = (space.total as f64 * pct / 100.0) as u64;
    let used = space.total - space.free.min(space.total);
    let fill = target_used.saturating_sub(used);
    // The runs while full need room for the source and the added files.
    let source_bytes = paths
        .iter()
        .filter_map(|p| files_below(p).ok())
        .flatten()
        .filter_map(|(_, p)| std::fs::metadata(p).ok())
        .map(|m| m.len())
        .sum::<u64>()
        + (opts.added_files * opts.added_size) as u64;
    // Room for everything once, a fifth more for trees, indexes and
    // temporaries, and one pack being written.
    let needed = source_bytes + source_bytes / 5 + (16 << 20);
    let left = space.free.saturating_sub(fill);
    if left < needed {
        return Err(LabError::Refused(format!(
            "--fill-to {pct}: filling would leave {} MB free, and the runs while full need about {} MB; choose a lower percentage or a smaller --source",
            left / 1_000_000,
            needed / 1_000_000
        )));
    }
    step(
        say,
        &format!(
            "filling the destination to {pct}%: writing {} MB of filler (removed afterwards)",
            fill / 1_000_000
        ),
    )?;
    let filled = write_filler(b, fill);
    let result = filled.and_then(|filled| {
        let space = probe::space(&**b)?;
        std::fs::create_dir_all(&paths[2]).map_err(|e| LabError::io("create", &paths[2], e))?;
        let seed = seed_protocol(
            conn,
            &scratch.join("repo-full"),
            paths,
            &paths[2],
            opts,
            &work.join("cache"),
            source_name,
            hints,
            say,
        )?;
        Ok(Full {
            fill_to: pct,
            filled_bytes: filled,
            space,
            seed,
        })
    });
    say("removing the filler");
    delete_all(&**b, "fill/", 16)?;
    result
}

/// Writes `bytes` of filler in 64 MiB objects, four at a time.
fn write_filler(b: &Arc<dyn LabBackend>, bytes: u64) -> Result<u64> {
    const PIECE: u64 = 64 << 20;
    let n = bytes.div_ceil(PIECE);
    let next = std::sync::atomic::AtomicU64::new(0);
    let written = std::sync::atomic::AtomicU64::new(0);
    let mut err = None;
    std::thread::scope(|s| {
        let hs: Vec<_> = (0..4)
            .map(|_| {
                s.spawn(|| loop {
                    let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    if i >= n || crate::interrupted() {
                        return Ok(());
                    }
                    let size = PIECE.min(bytes - i * PIECE);
                    b.put_stream(&format!("fill/{i:06}"), size, &mut Noise::new(i + 1, size))?;
                    written.fetch_add(size, std::sync::atomic::Ordering::Relaxed);
                })
            })
            .collect();
        for h in hs {
            if let Ok(Err(e)) = h.join() {
                err.get_or_insert(e);
            }
        }
    });
    match err {
        Some(_) | None if crate::interrupted() => Err(LabError::Interrupted),
        Some(e) => Err(LabError::Destination(e)),
        None => Ok(written.into_inner()),
    }
}

/// Writes `n` files of `size` random bytes below `dir`, 100 per directory.
pub fn generate_files(dir: &Path, n: usize, size: usize, seed: u64) -> Result<u64> {
    let mut data = vec![0u8; size];
    for i in 0..n {
        if i % 100 == 0 {
            crate::check_interrupt()?;
        }
        let d = dir.join(format!("d{:03}", i / 100));
        if i % 100 == 0 {
            std::fs::create_dir_all(&d).map_err(|e| LabError::io("create", &d, e))?;
        }
        Noise::new(seed.wrapping_mul(1_000_003) + i as u64, size as u64).fill(&mut data);
        let p = d.join(format!("f{i:05}.bin"));
        std::fs::write(&p, &data).map_err(|e| LabError::io("write", &p, e))?;
    }
    Ok((n * size) as u64)
}

/// Generates a source tree of about `bytes`: many small files, some
/// medium, a few large; half the content compresses, half does not.
pub fn generate_source(dir: &Path, bytes: u64) -> Result<()> {
    let classes: [(u64, u64); 3] = [(8 << 10, 10), (256 << 10, 30), (8 << 20, 60)];
    let mut n = 0u64;
    for (size, percent) in classes {
        let count = (bytes * percent / 100 / size).max(1);
        for i in 0..count {
            let d = dir
                .join(format!("s{size}"))
                .join(format!("d{:03}", i / 100));
            if i.is_multiple_of(100) {
                std::fs::create_dir_all(&d).map_err(|e| LabError::io("create", &d, e))?;
            }
            let mut data = vec![0u8; size as usize];
            Noise::new(n + 1, size).fill(&mut data);
            if n.is_multiple_of(2) {
                // Text-like: compresses about 3:1.
                for (j, c) in data.iter_mut().enumerate() {
                    *c = b"abcdefgh \n"[(*c as usize + j / 64) % 10];
                }
            }
            let p = d.join(format!("f{i:05}"));
            std::fs::write(&p, &data).map_err(|e| LabError::io("write", &p, e))?;
            n += 1;
        }
    }
    Ok(())
}

fn findings(r: &LabReport) -> Vec<Finding> {
    let mut f = Vec::new();
    let mut add = |topic: &str, text: String| {
        f.push(Finding {
            topic: topic.into(),
            text,
        })
    };
    let p = &r.probe;
    add(
        "latency",
        format!(
            "Round trip: {:.2} ms (the fastest of {} requests; median {:.2} ms, 90th percentile {:.2} ms, which include the server's work and queueing); connecting took {:.2} s.",
            p.rtt.min_ms, p.rtt.samples, p.rtt.median_ms, p.rtt.p90_ms, r.connect_secs
        ),
    );
    if let (Some(w), Some(rd)) = (&p.write, &p.read) {
        add(
            "throughput",
            format!(
                "Sequential: writing {} MB ran at {:.0} MB/s, reading it back at {:.0} MB/s.",
                w.bytes / 1_000_000,
                w.mb_per_s,
                rd.mb_per_s
            ),
        );
    }
    if let Some(s) = &p.small {
        add(
            "small_files",
            format!(
                "Small objects of {} KB one at a time: {:.0}/s created with a flush each, {:.0}/s without; {:.0}/s read, {:.0}/s deleted; one listing of {} took {:.2} s.",
                s.size / 1000,
                s.create_sync_per_s,
                s.create_nosync_per_s,
                s.read_per_s,
                s.delete_per_s,
                2 * s.count,
                s.list_secs
            ),
        );
    }
    let sync = match p.sync.mode {
        SyncMode::Forced => "Forced sync: YES. ",
        SyncMode::OnRequest => "Forced sync: no. ",
        SyncMode::NotApplicable => "Forced sync: not applicable. ",
        SyncMode::Undetermined => "Forced sync: undetermined. ",
    };
    add("sync", format!("{sync}{}", p.sync.explanation));
    if let Some(s) = &p.space {
        add(
            "space",
            format!(
                "Free space: {:.1} GB of {:.1} GB ({:.0}% used).",
                s.free as f64 / 1e9,
                s.total as f64 / 1e9,
                s.used_percent
            ),
        );
    } else {
        add("space", "Free space: the destination does not tell.".into());
    }
    if let Some(s) = &r.seed {
        let line = |name: &str, x: &RunRecord| {
            format!(
                "{name} {:.2} s ({} files, {:.1} MB read; {})",
                x.total_secs(),
                x.files,
                x.bytes_read as f64 / 1e6,
                x.bound.kind.label()
            )
        };
        add(
            "seed",
            format!(
                "capsule on {} source: {}; {}; {}.",
                if s.source == "generated" {
                    "the generated"
                } else {
                    "the given"
                },
                line("initial", &s.initial),
                line("no change", &s.no_change),
                line(&format!("after adding {} files", s.added_files), &s.added)
            ),
        );
        if let Some(w) = &p.write {
            let rule = s.initial.bytes as f64 / (0.67 * w.mb_per_s * 1e6);
            add(
                "rule_of_thumb",
                format!(
                    "The rule of thumb (0.67 x a large-file copy at {:.0} MB/s) predicts {:.2} s for the initial backup; capsule took {:.2} s.",
                    w.mb_per_s,
                    rule,
                    s.initial.total_secs()
                ),
            );
        }
        if let Some(pf) = &r.per_file {
            let capsule = s.added.backup_secs.max(1e-9);
            add(
                "per_file",
                format!(
                    "Per-file copy of the same {} added files: {:.0} files/s, {:.1} s for all{} ({}). capsule stored them in {:.2} s: {:.0}x faster on this destination.",
                    pf.files,
                    pf.files_per_s,
                    pf.all_secs,
                    if pf.copied < pf.files {
                        format!(", extrapolated from {} copied", pf.copied)
                    } else {
                        String::new()
                    },
                    pf.bound.summary,
                    capsule,
                    pf.all_secs / capsule
                ),
            );
        }
    }
    if let Some(full) = &r.full {
        let used = full.space.map(|s| s.used_percent).unwrap_or(full.fill_to);
        add(
            "nearly_full",
            format!(
                "At {used:.0}% full: initial {:.2} s, no change {:.2} s, after adding files {:.2} s (empty: {}).",
                full.seed.initial.total_secs(),
                full.seed.no_change.total_secs(),
                full.seed.added.total_secs(),
                r.seed
                    .as_ref()
                    .map(|s| format!(
                        "{:.2} s, {:.2} s, {:.2} s",
                        s.initial.total_secs(),
                        s.no_change.total_secs(),
                        s.added.total_secs()
                    ))
                    .unwrap_or_default()
            ),
        );
    }
    f
}
