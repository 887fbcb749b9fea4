//! Where run records and lab reports are kept: `$CAPSULE_STATE_DIR`, else
//! `$XDG_STATE_HOME/capsule`, else `~/.local/state/capsule`.
//!
//! * `runs/<repository id>/<time>-<snapshot>.json`: one per backup;
//! * `lab/<id>.json`: one per `capsule lab`.
//!
//! Local, not in the repository: the records describe this machine's runs
//! (its CPU, its link), and reports must not need the repository password.

use std::path::{Path, PathBuf};

use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::lab::LabReport;
use crate::record::RunRecord;
use crate::{LabError, Result};

/// Backup records kept per repository (about four weeks of hourly runs).
pub const RUNS_KEPT: usize = 700;

/// The state directory (where the access crate keeps it).
pub use capsule_access::state_dir;

fn write_json<T: Serialize>(path: &Path, v: &T) -> Result<()> {
    if let Some(d) = path.parent() {
        std::fs::create_dir_all(d).map_err(|e| LabError::io("create", d, e))?;
        // Run records are not encrypted and name the paths backed up.
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o700))
            .map_err(|e| LabError::io("protect", d, e))?;
    }
    let tmp = path.with_extension("json.tmp");
    let data = serde_json::to_vec_pretty(v).map_err(|e| LabError::BadRecord {
        path: path.display().to_string(),
        message: e.to_string(),
    })?;
    {
        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&tmp)
            .map_err(|e| LabError::io("write", &tmp, e))?;
        f.write_all(&data)
            .map_err(|e| LabError::io("write", &tmp, e))?;
    }
    std::fs::rename(&tmp, path).map_err(|e| LabError::io("write", path, e))
}

fn read_json<T: DeserializeOwned>(path: &Path) -> Result<T> {
    // A run record is a few KB to a few MB; a FIFO or a huge file planted
    // in the state directory is refused, not waited on or loaded.
    let data = capsule_backend::ownfile::read_bounded(path, 64 << 20)
        .map_err(|e| LabError::io("read", path, e))?;
    serde_json::from_slice(&data).map_err(|e| LabError::BadRecord {
        path: path.display().to_string(),
        message: e.to_string(),
    })
}

/// The history in one state directory.
#[derive(Debug, Clone)]
pub struct History {
    dir: PathBuf,
}

impl History {
    /// The default state directory, if there is one.
    pub fn open_default() -> Option<History> {
        state_dir().map(History::at)
    }

    /// A history kept in `dir`.
    pub fn at(dir: impl Into<PathBuf>) -> History {
        History { dir: dir.into() }
    }

    /// Its directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Keeps a backup's record; returns its file. Only the newest
    /// [`RUNS_KEPT`] records of a repository are kept: hourly backups would
    /// otherwise grow the directory forever.
    pub fn save_run(&self, r: &RunRecord) -> Result<PathBuf> {
        let dir = self.dir.join("runs").join(&r.repository);
        let p = dir.join(format!(
            "{}-{}.json",
            r.time_unix,
            &r.snapshot[..r.snapshot.len().min(16)]
        ));
        write_json(&p, r)?;
        // Names start with the Unix time, so name order is age order.
        let mut all = json_files(&dir);
        all.sort();
        for old in &all[..all.len().saturating_sub(RUNS_KEPT)] {
            let _ = std::fs::remove_file(old);
        }
        Ok(p)
    }

    /// Keeps a lab report; returns its file.
    pub fn save_lab(&self, r: &LabReport) -> Result<PathBuf> {
        let p = self.dir.join("lab").join(format!("{}.json", r.id));
        write_json(&p, r)?;
        Ok(p)
    }

    /// Every backup record, oldest first. An unreadable one is skipped with
    /// a warning on stderr: records only inform estimates and reports.
    pub fn runs(&self) -> Vec<RunRecord> {
        let mut out: Vec<RunRecord> = json_files(&self.dir.join("runs"))
            .iter()
            .filter_map(|p| match read_json(p) {
                Ok(r) => Some(r),
                Err(e) => {
                    eprintln!("warning: run record ignored: {e}");
                    None
                }
            })
            .collect();
        out.sort_by_key(|r: &RunRecord| r.time_unix);
        out
    }

    /// Every lab report's id, oldest first.
    pub fn lab_ids(&self) -> Vec<String> {
        let mut v: Vec<String> = json_files(&self.dir.join("lab"))
            .iter()
            .filter_map(|p| p.file_stem().map(|s| s.to_string_lossy().into_owned()))
            .collect();
        v.sort();
        v
    }

    /// The run whose snapshot ID starts with `prefix` (or the newest run
    /// for `latest`).
    pub fn find_run(&self, prefix: &str) -> Result<RunRecord> {
        let runs = self.runs();
        if prefix == "latest" {
            return runs
                .into_iter()
                .last()
                .ok_or_else(|| LabError::NotFound("no backup has been recorded yet".into()));
        }
        let mut hits: Vec<RunRecord> = runs
            .into_iter()
            .filter(|r| r.snapshot.starts_with(prefix))
            .collect();
        match hits.len() {
            1 => Ok(hits.remove(0)),
            0 => Err(LabError::NotFound(format!(
                "no recorded backup or lab run matches {prefix:?} (records are in {})",
                self.dir.display()
            ))),
            n => Err(LabError::NotFound(format!(
                "{n} recorded backups match {prefix:?}; give more of the snapshot ID"
            ))),
        }
    }

    /// The lab report with this id (or prefix; `latest-lab` for the newest).
    pub fn find_lab(&self, prefix: &str) -> Result<LabReport> {
        let ids = self.lab_ids();
        let hits: Vec<&String> = if prefix == "latest-lab" {
            ids.last().into_iter().collect()
        } else {
            ids.iter().filter(|i| i.starts_with(prefix)).collect()
        };
        match hits.as_slice() {
            [one] => read_json(&self.dir.join("lab").join(format!("{one}.json"))),
            [] => Err(LabError::NotFound(format!(
                "no lab run matches {prefix:?} (records are in {})",
                self.dir.display()
            ))),
            many => Err(LabError::NotFound(format!(
                "{} lab runs match {prefix:?}; give more of the id",
                many.len()
            ))),
        }
    }
}

fn json_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in rd.flatten() {
            let p = e.path();
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                stack.push(p);
            } else if p.extension().is_some_and(|x| x == "json") {
                out.push(p);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(t: i64) -> RunRecord {
        crate::record::test_record("d", t, 1)
    }

    #[test]
    fn runs_are_found_by_prefix_and_pruned_oldest_first() {
        let d = tempfile::tempdir().unwrap();
        let h = History::at(d.path());
        let base = 1_700_000_000;
        for i in 0..(RUNS_KEPT as i64 + 3) {
            h.save_run(&record(base + i)).unwrap();
        }
        let runs = h.runs();
        assert_eq!(runs.len(), RUNS_KEPT);
        assert_eq!(runs[0].time_unix, base + 3, "the oldest three went");
        assert_eq!(
            h.find_run("latest").unwrap().time_unix,
            base + RUNS_KEPT as i64 + 2
        );
        let id = format!("{:016x}", base + 10);
        assert_eq!(h.find_run(&id).unwrap().time_unix, base + 10);
        assert!(matches!(h.find_run("zz"), Err(LabError::NotFound(_))));
    }
}
