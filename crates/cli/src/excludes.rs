//! The exclude flags a backup takes beside `--exclude` (restic's and
//! borg's names), the lists of paths it may read from files, and their
//! profile keys: a flag adds to the profile's list, a switch turns on.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use capsule_app::config::Profile;
use capsule_app::error::UsageError;
use capsule_engine::backup::ExcludeRules;
use clap::Args;

/// Exclusions besides patterns, and paths from files.
#[derive(Args, Debug, Default, Clone)]
pub struct ExcludeArgs {
    /// Read exclude patterns from a file, one a line (# comments and blank
    /// lines skipped; repeatable).
    #[arg(long, value_name = "FILE")]
    pub exclude_file: Vec<PathBuf>,
    /// Exclude paths matching a pattern whatever its case (repeatable).
    #[arg(long = "iexclude", value_name = "PATTERN")]
    pub iexcludes: Vec<String>,
    /// Read case-insensitive exclude patterns from a file (repeatable).
    #[arg(long, value_name = "FILE")]
    pub iexclude_file: Vec<PathBuf>,
    /// Leave out the contents of directories tagged as caches by a
    /// CACHEDIR.TAG with the standard signature (browsers, build tools);
    /// the tag itself is kept.
    #[arg(long)]
    pub exclude_caches: bool,
    /// Leave out the contents of directories holding a file of this name
    /// (NAME, or NAME:CONTENT for one that begins with CONTENT), such as
    /// .nobackup; the marker itself is kept (repeatable).
    #[arg(long, value_name = "NAME[:CONTENT]")]
    pub exclude_if_present: Vec<String>,
    /// Leave out files larger than this (e.g. 2G, 500M).
    #[arg(long, value_name = "SIZE", value_parser = capsule_app::config::parse_size)]
    pub exclude_larger_than: Option<u64>,
    /// Back up the paths listed in FILE too, one a line (# comments and
    /// blank lines skipped, spaces trimmed; "-" is standard input).
    #[arg(long, value_name = "FILE")]
    pub files_from: Vec<PathBuf>,
    /// As --files-from, each line taken exactly as written.
    #[arg(long, value_name = "FILE")]
    pub files_from_verbatim: Vec<PathBuf>,
    /// As --files-from, the paths separated by NUL bytes (find -print0).
    #[arg(long, value_name = "FILE")]
    pub files_from_raw: Vec<PathBuf>,
}

impl ExcludeArgs {
    /// The flags with the profile's keys added.
    pub fn with_profile(mut self, p: &Profile) -> Result<Self> {
        self.exclude_file
            .splice(0..0, p.exclude_file.iter().cloned());
        self.iexcludes.splice(0..0, p.iexcludes.iter().cloned());
        self.iexclude_file
            .splice(0..0, p.iexclude_file.iter().cloned());
        self.exclude_caches |= p.exclude_caches.unwrap_or(false);
        self.exclude_if_present
            .splice(0..0, p.exclude_if_present.iter().cloned());
        if self.exclude_larger_than.is_none() {
            self.exclude_larger_than = p.exclude_rules().map_err(UsageError)?.larger_than;
        }
        self.files_from.splice(0..0, p.files_from.iter().cloned());
        self.files_from_verbatim
            .splice(0..0, p.files_from_verbatim.iter().cloned());
        self.files_from_raw
            .splice(0..0, p.files_from_raw.iter().cloned());
        Ok(self)
    }

    /// Patterns read from the --exclude-file files.
    pub fn file_patterns(&self) -> Result<Vec<String>> {
        patterns_from(&self.exclude_file)
    }

    /// The rules for the engine.
    pub fn rules(&self) -> Result<ExcludeRules> {
        let mut iexcludes = self.iexcludes.clone();
        iexcludes.extend(patterns_from(&self.iexclude_file)?);
        Ok(ExcludeRules {
            iexcludes,
            caches: self.exclude_caches,
            if_present: self.exclude_if_present.clone(),
            larger_than: self.exclude_larger_than,
        })
    }

    /// The paths the --files-from* files list, in order.
    pub fn listed_paths(&self) -> Result<Vec<PathBuf>> {
        let mut out = Vec::new();
        for f in &self.files_from {
            for line in read_list(f)?.split(|b| *b == b'\n') {
                let line = trim(line.strip_suffix(b"\r").unwrap_or(line));
                if line.is_empty() || line.starts_with(b"#") {
                    continue;
                }
                out.push(PathBuf::from(OsStr::from_bytes(line)));
            }
        }
        for f in &self.files_from_verbatim {
            let data = read_list(f)?;
            let data = data.strip_suffix(b"\n").unwrap_or(&data);
            for line in data.split(|b| *b == b'\n').filter(|l| !l.is_empty()) {
                out.push(PathBuf::from(OsStr::from_bytes(line)));
            }
        }
        for f in &self.files_from_raw {
            for p in read_list(f)?.split(|b| *b == 0).filter(|l| !l.is_empty()) {
                out.push(PathBuf::from(OsStr::from_bytes(p)));
            }
        }
        // A listed path that is not there is the user's mistake, said
        // before anything is read: a backup silently short of it would
        // pass for a whole one.
        if let Some(missing) = out.iter().find(|p| std::fs::symlink_metadata(p).is_err()) {
            return Err(UsageError(format!(
                "{}, listed in a --files-from file, does not exist: fix the list",
                missing.display()
            ))
            .into());
        }
        Ok(out)
    }
}

fn trim(b: &[u8]) -> &[u8] {
    let start = b
        .iter()
        .position(|c| !c.is_ascii_whitespace())
        .unwrap_or(b.len());
    let end = b
        .iter()
        .rposition(|c| !c.is_ascii_whitespace())
        .map_or(start, |e| e + 1);
    &b[start..end]
}

/// A list file's bytes ("-": standard input).
fn read_list(f: &Path) -> Result<Vec<u8>> {
    if f == Path::new("-") {
        let mut v = Vec::new();
        std::io::Read::read_to_end(&mut std::io::stdin().lock(), &mut v)
            .context("read the list of paths from standard input")?;
        return Ok(v);
    }
    std::fs::read(f).map_err(|e| {
        UsageError(format!(
            "cannot read the list of paths {}: {e}",
            f.display()
        ))
        .into()
    })
}

/// Patterns from pattern files: one a line, # comments and blank lines
/// skipped.
fn patterns_from(files: &[PathBuf]) -> Result<Vec<String>> {
    let mut out = Vec::new();
    for f in files {
        let text = std::fs::read_to_string(f).map_err(|e| {
            UsageError(format!("cannot read the pattern file {}: {e}", f.display()))
        })?;
        for line in text.lines() {
            let l = line.trim();
            if l.is_empty() || l.starts_with('#') {
                continue;
            }
            capsule_engine::backup::check_pattern(l)
                .map_err(|e| UsageError(format!("{}: {e}", f.display())))?;
            out.push(l.to_string());
        }
    }
    Ok(out)
}
