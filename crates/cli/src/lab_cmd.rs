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
use crate::settings::UsageError;
use crate::GlobalArgs;

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
    if !(n >= 0.0) {
        return Err(format!("{s:?} is not a size"));
    }
    Ok((n * mul as f64) as u64)
}

/// Arguments of `lab`.
#[derive(Args, Debug)]
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

pub(crate) fn connector(g: &GlobalArgs, dest: &Destination) -> Connector {
    let mut net = capsule_net::Options::from_env(dest);
    if let Some(n) = g.connections {
        net.concurrency = Some(n as usize);
    }
    Connector {
        net,
        no_fsync: g.no_fsync,
    }
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

/// `capsule lab`.
pub fn lab(g: &GlobalArgs, out: &Output, a: LabArgs) -> Result<u8> {
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
    let conn = connector(g, &dest);
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
