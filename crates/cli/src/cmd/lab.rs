//! `capsule lab`, `capsule estimate` and `capsule report`: the destination
//! lab's commands. The work is in `capsule-lab`; this file parses, prints
//! and maps errors to exit codes.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Result;
use capsule_lab::dest::Connector;
use capsule_lab::lab::{LabOptions, LabReport};
use capsule_lab::probe::ProbeOptions;
use capsule_lab::LabError;
use capsule_net::Destination;
use clap::Args;

use crate::output::Output;
use capsule_app::{Settings, UsageError};

/// A size with an optional K, M, G or T suffix (powers of 1024).
fn parse_size(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let (num, mul) = match s.char_indices().last() {
        Some((i, c)) if c.is_ascii_alphabetic() => {
            let m: u64 = match c.to_ascii_uppercase() {
                'K' => 1 << 10,
                'M' => 1 << 20,
                'G' => 1 << 30,
                'T' => 1 << 40,
                'B' => 1,
                _ => return Err(format!("unknown size suffix {c:?} (use K, M, G or T)")),
            };
            (&s[..i], m)
        }
        _ => (s, 1),
    };
    let n: f64 = num
        .parse()
        .map_err(|_| format!("{s:?} is not a size (like 512K, 64M, 1G)"))?;
    if !n.is_finite() || n < 0.0 {
        return Err(format!("{s:?} is not a size"));
    }
    Ok((n * mul as f64) as u64)
}

/// Arguments of `lab`.
#[derive(Args, Debug)]
#[command(args_override_self = true)]
pub struct LabArgs {
    /// The destination to measure: a local path, smb://, sftp://, s3:// URL.
    /// The lab works in a new `capsule-lab-*` directory below it and
    /// removes it at the end.
    destination: String,
    /// Bytes for the sequential write and read test.
    #[arg(long, default_value = "1G", value_parser = parse_size, value_name = "SIZE")]
    size: u64,
    /// Small objects created, listed, read and deleted one at a time (each
    /// with and without a flush).
    #[arg(long, default_value_t = 1000, value_name = "N")]
    small_files: usize,
    /// Round trips timed.
    #[arg(long, default_value_t = 30, value_name = "N")]
    rtt_samples: usize,
    /// Only the probes: skip the seed backups and the per-file copy.
    #[arg(long)]
    no_seed: bool,
    /// Source tree for the seed backups (default: a generated tree).
    #[arg(long, value_name = "DIR")]
    source: Option<PathBuf>,
    /// Size of the generated source tree.
    #[arg(long, default_value = "256M", value_parser = parse_size, value_name = "SIZE")]
    generate: u64,
    /// Files added before the third seed run, and copied one by one.
    #[arg(long, default_value_t = 10_000, value_name = "N")]
    added_files: usize,
    /// Size of each added file.
    #[arg(long, default_value = "50K", value_parser = parse_size, value_name = "SIZE")]
    added_size: u64,
    /// Stop the per-file copy after this many seconds and extrapolate.
    #[arg(long, default_value_t = 300, value_name = "SECS")]
    per_file_budget: u64,
    /// Also run the seed backups with the destination filled to PERCENT
    /// (with filler the lab removes afterwards). Needs --yes.
    #[arg(long, value_name = "PERCENT")]
    fill_to: Option<f64>,
    /// Consent to --fill-to writing filler to the destination.
    #[arg(long)]
    yes: bool,
    /// Local scratch directory (default: the system temp directory).
    #[arg(long, value_name = "DIR")]
    work_dir: Option<PathBuf>,
    /// Also write the report as a self-contained HTML page.
    #[arg(long, value_name = "FILE")]
    html: Option<PathBuf>,
    /// Also write each chart as an SVG file into DIR.
    #[arg(long, value_name = "DIR")]
    svg: Option<PathBuf>,
}

pub(crate) fn connector(settings: &Settings, dest: &Destination) -> Result<Connector> {
    let mut net = capsule_net::Options::from_env(dest);
    if let Some(n) = settings.flags.connections {
        net.concurrency = Some(n as usize);
    }
    Ok(Connector {
        net,
        no_fsync: settings.flags.no_fsync,
        trace: settings.trace()?,
    })
}

/// Makes lab errors carry the types the exit-code mapping knows.
pub(crate) fn lab_err(e: LabError) -> anyhow::Error {
    match e {
        LabError::Destination(b) => b.into(),
        LabError::Engine(e) => e.into(),
        LabError::Refused(s) => UsageError(s).into(),
        other => other.into(),
    }
}

/// Ctrl-C (or SIGTERM, SIGHUP) asks the lab or estimate to stop at its next
/// step and remove what it wrote, so a filled destination is never left
/// full; a second one quits at once.
fn stop_on_signal(out: &Output) {
    let quiet = out.quiet;
    let _ = ctrlc::set_handler(move || {
        if capsule_lab::interrupted() {
            std::process::exit(i32::from(crate::exit::INTERRUPTED));
        }
        capsule_lab::interrupt();
        if !quiet {
            eprintln!("stopping: removing what was written (press Ctrl-C again to quit at once)");
        }
    });
}

/// `capsule lab`.
pub fn lab(settings: &Settings, out: &Output, a: LabArgs) -> Result<u8> {
    let dest = Destination::parse(&a.destination).map_err(|e| UsageError(e.to_string()))?;
    if a.fill_to.is_some() && !a.yes {
        return Err(UsageError(
            "--fill-to writes filler to the destination until it is that full (and removes it afterwards); add --yes to consent".into(),
        )
        .into());
    }
    if let Some(s) = &a.source {
        if !s.is_dir() {
            return Err(UsageError(format!("--source {}: not a directory", s.display())).into());
        }
    }
    stop_on_signal(out);
    let opts = LabOptions {
        probe: ProbeOptions {
            size: a.size,
            small_files: a.small_files,
            rtt_samples: a.rtt_samples.max(3),
            ..ProbeOptions::default()
        },
        seed: !a.no_seed,
        source: a.source,
        generate_bytes: a.generate,
        added_files: a.added_files,
        added_size: a.added_size as usize,
        per_file_budget: Duration::from_secs(a.per_file_budget),
        fill_to: a.fill_to,
        work_dir: a.work_dir,
    };
    let conn = connector(settings, &dest)?;
    let chatty = !out.json && !out.quiet;
    let say = |s: &str| {
        if chatty {
            eprintln!("lab: {s}");
        }
    };
    let report = capsule_lab::lab::run(&dest, &conn, &opts, &say).map_err(lab_err)?;
    let saved = match capsule_lab::history::History::open_default() {
        Some(h) => match h.save_lab(&report) {
            Ok(p) => Some(p),
            Err(e) => {
                out.warn(format!("the report was not kept: {e}"));
                None
            }
        },
        None => None,
    };
    write_outputs(out, &report, a.html.as_deref(), a.svg.as_deref())?;
    if out.json {
        out.json(&report);
    } else {
        print_lab(out, &report);
        if let Some(p) = saved {
            out.say(format!(
                "report {} kept in {} (`capsule report {}` renders it)",
                report.id,
                p.display(),
                report.id
            ));
        }
    }
    Ok(crate::exit::OK)
}

fn print_lab(out: &Output, r: &LabReport) {
    out.say(format!("capsule lab: {}", r.destination));
    for f in &r.findings {
        out.say(format!("  {}", f.text));
    }
}

fn write_outputs(
    out: &Output,
    r: &LabReport,
    html: Option<&std::path::Path>,
    svg: Option<&std::path::Path>,
) -> Result<()> {
    if let Some(p) = html {
        std::fs::write(p, capsule_lab::html::lab_page(r))
            .map_err(|e| anyhow::anyhow!("write {}: {e}", p.display()))?;
        out.say(format!("HTML report written to {}", p.display()));
    }
    if let Some(d) = svg {
        let n = write_svgs(d, &capsule_lab::html::lab_charts(r))?;
        out.say(format!("{n} SVG charts written to {}", d.display()));
    }
    Ok(())
}

pub(crate) fn write_svgs(dir: &std::path::Path, charts: &[(String, String)]) -> Result<usize> {
    std::fs::create_dir_all(dir).map_err(|e| anyhow::anyhow!("create {}: {e}", dir.display()))?;
    for (name, svg) in charts {
        let p = dir.join(format!("{name}.svg"));
        std::fs::write(&p, svg).map_err(|e| anyhow::anyhow!("write {}: {e}", p.display()))?;
    }
    Ok(charts.len())
}

#[cfg(test)]
mod tests {
    use super::parse_size;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("512").unwrap(), 512);
        assert_eq!(parse_size("50K").unwrap(), 51_200);
        assert_eq!(parse_size("1.5M").unwrap(), 1_572_864);
        assert_eq!(parse_size("1g").unwrap(), 1 << 30);
        assert!(parse_size("12Q").is_err());
        assert!(parse_size("lots").is_err());
    }
}

/// Arguments of `estimate`.
#[derive(Args, Debug)]
pub struct EstimateArgs {
    /// Files and directories that would be backed up.
    #[arg(required = true)]
    paths: Vec<PathBuf>,
    /// The destination (local path or URL); default: the repository.
    #[arg(long, value_name = "DESTINATION")]
    to: Option<String>,
    /// Files changed per hour (default: from recorded runs, else none).
    #[arg(long, value_name = "N")]
    hourly_files: Option<u64>,
    /// Bytes changed per hour.
    #[arg(long, value_parser = parse_size, value_name = "SIZE")]
    hourly_bytes: Option<u64>,
    /// Local scratch directory for the calibration samples.
    #[arg(long, value_name = "DIR")]
    work_dir: Option<PathBuf>,
}

fn human_secs(s: f64) -> String {
    if s >= 3600.0 {
        format!("{:.1} h", s / 3600.0)
    } else if s >= 120.0 {
        format!("{:.1} min", s / 60.0)
    } else {
        format!("{s:.2} s")
    }
}

/// `capsule estimate`.
pub fn estimate(settings: &Settings, out: &Output, a: EstimateArgs) -> Result<u8> {
    let (dest, repo_name) = match &a.to {
        Some(t) => {
            let d = Destination::parse(t).map_err(|e| UsageError(e.to_string()))?;
            let name = d.to_string();
            (d, name)
        }
        None => {
            let loc = settings.location()?;
            let name = loc.display();
            (loc.dest, name)
        }
    };
    for p in &a.paths {
        if std::fs::symlink_metadata(p).is_err() {
            return Err(UsageError(format!("{}: no such file or directory", p.display())).into());
        }
    }
    stop_on_signal(out);
    let conn = connector(settings, &dest)?;
    let chatty = !out.json && !out.quiet;
    let say = |s: &str| {
        if chatty {
            eprintln!("estimate: {s}");
        }
    };
    let history = capsule_lab::history::History::open_default();
    let paths: Vec<PathBuf> = a
        .paths
        .iter()
        .map(|p| std::path::absolute(p).unwrap_or_else(|_| p.clone()))
        .collect();
    let e = capsule_lab::estimate::estimate(
        &paths,
        &dest,
        &conn,
        history.as_ref(),
        &capsule_lab::estimate::EstimateOptions {
            hourly_files: a.hourly_files,
            hourly_bytes: a.hourly_bytes,
            work_dir: a.work_dir,
            repository: Some(repo_name),
        },
        &say,
    )
    .map_err(lab_err)?;
    if out.json {
        out.json(&e);
        return Ok(crate::exit::OK);
    }
    let s = &e.source;
    out.say(format!(
        "source: {} files in {} directories, {} (scanned in {:.2} s)",
        s.files,
        s.dirs,
        crate::output::bytes(s.bytes),
        s.scan_secs
    ));
    for c in &s.classes {
        if c.files > 0 {
            out.say(format!(
                "  {:>10}: {:>8} files, {}",
                if c.up_to == 0 {
                    "larger".to_string()
                } else {
                    format!("<= {}", crate::output::bytes(c.up_to))
                },
                c.files,
                crate::output::bytes(c.bytes)
            ));
        }
    }
    let d = &e.probe;
    out.say(format!(
        "destination: {} — round trip {:.2} ms, one stream {:.0} MB/s, {} in flight {:.0} MB/s, a flushed 50 KB file {:.1} ms",
        e.destination,
        d.rtt * 1e3,
        d.stream_bw / 1e6,
        d.concurrency,
        d.parallel_bw / 1e6,
        d.per_file_copy * 1e3
    ));
    out.say(format!(
        "a whole run there, tiny repository: {} with a new file, {} with nothing new (medians of {}; every measurement within {:.0}% of its median)",
        human_secs(d.run_changed),
        human_secs(d.run_unchanged),
        d.rounds.run_unchanged.len(),
        d.rounds.spread * 100.0
    ));
    let p = &e.predicted;
    out.say(format!(
        "hourly change assumed: {} files, {} ({})",
        e.hourly_files,
        crate::output::bytes(e.hourly_bytes),
        e.hourly_basis
    ));
    out.say(format!("{:<28} {:>12} {:>12}", "", "initial", "hourly"));
    out.say(format!(
        "{:<28} {:>12} {:>12}",
        "capsule",
        human_secs(p.initial),
        human_secs(p.hourly)
    ));
    out.say(format!(
        "{:<28} {:>12} {:>12}",
        "per-file copy (Time Machine)",
        human_secs(p.per_file_initial),
        human_secs(p.per_file_hourly)
    ));
    out.say(format!(
        "{:<28} {:>12} {:>12}",
        "rule of thumb (0.67 x copy)",
        human_secs(p.rule_of_thumb),
        "—"
    ));
    out.say(format!(
        "capsule hourly runs: {} with nothing changed (every file looked at, none read); {} after {} new files of 50 KiB",
        human_secs(p.no_change),
        human_secs(p.typical_change),
        capsule_lab::estimate::TYPICAL_FILES
    ));
    out.say(
        "  (both walk the whole source; with `capsule daemon` watching it, a run lists only the directories that changed)",
    );
    let parts = capsule_lab::estimate::restore_parts(&e.calibration, d, &e.source);
    out.say(format!(
        "capsule full restore from there: {} (reads at {:.0} MB/s with {} in flight; bound by {})",
        human_secs(p.restore),
        d.download_bw / 1e6,
        d.concurrency,
        parts.bound()
    ));
    out.say(format!(
        "these figures are ± {:.0}%: how far this machine's and the destination's repeated measurements in this estimate lay from their medians",
        e.uncertainty * 100.0
    ));
    if e.initial_uncertainty > e.uncertainty {
        out.say(format!(
            "the initial backup ± {:.0}%: this disk's cold read varied that much between samples read cold (the share of the source not in the page cache meets it)",
            e.initial_uncertainty * 100.0
        ));
    }
    if e.history.is_empty() {
        out.say("no recorded backups to this destination yet: after real backups, estimates are checked against them and corrected");
    } else {
        out.say(format!(
            "checked against {} recorded runs: corrections x{:.2} (initial), x{:.2} (hourly)",
            e.history.len(),
            e.correction.0,
            e.correction.1
        ));
        for c in e.history.iter().rev().take(5) {
            out.say(format!(
                "  {} {:<8} predicted {:>9}, took {:>9}",
                c.time,
                c.kind,
                human_secs(c.predicted),
                human_secs(c.actual)
            ));
        }
    }
    Ok(crate::exit::OK)
}

/// Arguments of `report`.
#[derive(Args, Debug)]
pub struct ReportArgs {
    /// A snapshot ID (prefix) of a recorded backup, a lab report id, or
    /// `latest` / `latest-lab`.
    #[arg(required_unless_present = "list")]
    id: Option<String>,
    /// List recorded backups and lab runs.
    #[arg(long)]
    list: bool,
    /// Write the report as a self-contained HTML page.
    #[arg(long, value_name = "FILE")]
    html: Option<PathBuf>,
    /// Write each chart as an SVG file into DIR.
    #[arg(long, value_name = "DIR")]
    svg: Option<PathBuf>,
}

/// `capsule report`.
pub fn report(_settings: &Settings, out: &Output, a: ReportArgs) -> Result<u8> {
    let Some(h) = capsule_lab::history::History::open_default() else {
        return Err(UsageError("no state directory: set CAPSULE_STATE_DIR or HOME".into()).into());
    };
    if a.list {
        let runs = h.runs();
        let labs = h.lab_ids();
        if out.json {
            out.json(&serde_json::json!({
                "backups": runs.iter().map(|r| serde_json::json!({
                    "snapshot": r.snapshot, "time": r.time, "destination": r.destination,
                    "secs": r.total_secs(), "bound": r.bound.kind,
                })).collect::<Vec<_>>(),
                "lab": labs,
            }));
        } else {
            for r in &runs {
                out.result(format!(
                    "{}  {}  {:>9.2} s  {:<24} {}",
                    &r.snapshot[..8.min(r.snapshot.len())],
                    r.time,
                    r.total_secs(),
                    r.bound.kind.label(),
                    r.destination
                ));
            }
            for l in &labs {
                out.result(format!("lab {l}"));
            }
        }
        return Ok(crate::exit::OK);
    }
    let id = a.id.unwrap_or_default();
    // Lab ids are times (`20261121T234356-b48ca9`); snapshot IDs are hex.
    let lab = if id == "latest-lab" || id.contains('T') {
        Some(h.find_lab(&id).map_err(lab_err)?)
    } else {
        None
    };
    if let Some(r) = lab {
        write_outputs(out, &r, a.html.as_deref(), a.svg.as_deref())?;
        if out.json {
            out.json(&r);
        } else {
            print_lab(out, &r);
        }
        return Ok(crate::exit::OK);
    }
    let r = h.find_run(&id).map_err(lab_err)?;
    if let Some(p) = &a.html {
        std::fs::write(p, capsule_lab::html::run_page(&r))
            .map_err(|e| anyhow::anyhow!("write {}: {e}", p.display()))?;
        out.say(format!("HTML report written to {}", p.display()));
    }
    if let Some(d) = &a.svg {
        let n = write_svgs(d, &capsule_lab::html::run_charts(&r))?;
        out.say(format!("{n} SVG charts written to {}", d.display()));
    }
    if out.json {
        out.json(&r);
    } else {
        out.say(format!(
            "backup {} of {} to {} at {}",
            &r.snapshot[..8.min(r.snapshot.len())],
            r.paths.join(", "),
            r.destination,
            r.time
        ));
        out.say(format!(
            "  {:.2} s (connect {:.2}, open {:.2}, backup {:.2}); {} files, {} read, {} stored",
            r.total_secs(),
            r.connect_secs,
            r.open_secs,
            r.backup_secs,
            r.files,
            crate::output::bytes(r.bytes_read),
            crate::output::bytes(r.bytes_added)
        ));
        out.say(format!("  {}", r.bound.summary));
        for e in &r.bound.evidence {
            out.say(format!("    {e}"));
        }
    }
    Ok(crate::exit::OK)
}
