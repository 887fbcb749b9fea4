//! What a change journal vouches for, and how a backup walks with it.
//!
//! A watcher (see the `capsule-watch` crate) records which directories
//! changed since the parent snapshot's run started. With that, a backup
//! lists again only the directories that changed, at directory
//! granularity as Apple advises for FSEvents: a *dirty* directory is listed
//! and each entry compared with the parent snapshot (the rules of a full
//! scan, `content_unchanged` among them); a *clean* one keeps the parent's
//! tree without a single `stat`; a *deep* one (created or moved in, or
//! where the journal lost track) is scanned in full with all below it.
//!
//! The engine trusts what it is given. Whether a journal may be trusted at
//! all (same boot, a watcher running since the parent started, no overflow,
//! the same sources...) is the watcher's side to decide; the engine only
//! refuses a journal written against another parent, or a parent that
//! could not read everything (its skipped entries would stay skipped).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// Directories changed since the parent snapshot's run started, as a
/// change journal saw them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Changes {
    /// The snapshot the journal is relative to (hex ID): the run started
    /// after the journal's cut for it.
    pub parent: String,
    /// Directories whose entries changed (created, deleted, renamed, or
    /// their metadata or content): listed again and compared.
    pub dirty: BTreeSet<PathBuf>,
    /// Directories scanned in full with everything below them.
    pub deep: BTreeSet<PathBuf>,
    /// What the parent's run saw of the sources and the directories above
    /// them ([`tops`]): when nothing changed below and these are the same,
    /// the parent's tree is the new snapshot's, and the run reads no index.
    pub tops: Vec<(PathBuf, String)>,
}

// Hard links: a change to a file with several names (its content, its
// link count) raises an event only in the directory of the name it was
// made through, or none at all when that name lies outside the sources.
// So the directories holding such files are listed by every run (the
// journal adds the previous run's `BackupReport::linked_dirs` to `dirty`),
// and a run that meets a file newly given a second name, whose other
// names no journal can place, scans everything.

/// A fingerprint of each source and of each directory above one, taken
/// before the walk: for a source, what its record holds (kind, identity,
/// mode, owner, times, size, links); for a directory above, what decides
/// whether its record is stored anew (identity, mode, owner, attributes:
/// see "Directories above the sources" in docs/DESIGN.md). Sorted by path.
pub fn tops(sources: &[PathBuf]) -> Vec<(PathBuf, String)> {
    use std::os::unix::fs::MetadataExt;
    let mut out = std::collections::BTreeMap::new();
    for s in sources {
        // A source that is a symlink stands for what it points to.
        let real = match std::fs::symlink_metadata(s) {
            Ok(m) if m.file_type().is_symlink() => {
                std::fs::canonicalize(s).unwrap_or_else(|_| s.clone())
            }
            _ => s.clone(),
        };
        let print = match std::fs::symlink_metadata(&real) {
            Ok(m) => format!(
                "{:o} {} {} {} {} {} {}.{} {}.{} {} {}",
                m.mode(),
                m.ino(),
                m.dev(),
                m.uid(),
                m.gid(),
                m.nlink(),
                m.mtime(),
                m.mtime_nsec(),
                m.ctime(),
                m.ctime_nsec(),
                m.size(),
                u8::from(m.is_dir())
            ),
            Err(e) => format!("error {e}"),
        };
        out.insert(s.clone(), print);
        for a in s.ancestors().skip(1) {
            if out.contains_key(a) {
                continue;
            }
            let print = match std::fs::metadata(a) {
                Ok(m) => {
                    let x = crate::meta::read_xattrs(a).unwrap_or_default();
                    let x: Vec<String> = x
                        .iter()
                        .map(|(k, v)| format!("{}={}", hex::encode(k), hex::encode(v)))
                        .collect();
                    format!(
                        "{:o} {} {} {} {} {}",
                        m.mode(),
                        m.ino(),
                        m.dev(),
                        m.uid(),
                        m.gid(),
                        x.join(",")
                    )
                }
                Err(e) => format!("error {e}"),
            };
            out.insert(a.to_path_buf(), print);
        }
    }
    out.into_iter().collect()
}

impl Changes {
    /// Whether `dir` is to be listed again.
    pub fn is_dirty(&self, dir: &Path) -> bool {
        self.dirty.contains(dir)
    }

    /// Whether `dir` is to be scanned in full: it or a directory above it
    /// is deep.
    pub fn is_deep(&self, dir: &Path) -> bool {
        dir.ancestors().any(|a| self.deep.contains(a))
    }

    /// Whether anything at or below `dir` changed (or lies under a deep
    /// directory): when not, the parent's tree for `dir` stands as it is.
    pub fn touches(&self, dir: &Path) -> bool {
        let below = |set: &BTreeSet<PathBuf>| {
            // Paths order component by component, so everything below
            // `dir` follows it directly.
            set.range(dir.to_path_buf()..)
                .next()
                .is_some_and(|p| p.starts_with(dir))
        };
        below(&self.dirty) || below(&self.deep) || self.is_deep(dir)
    }

    /// How many directories the journal names.
    pub fn len(&self) -> usize {
        self.dirty.len() + self.deep.len()
    }

    /// Whether the journal names no directory at all.
    pub fn is_empty(&self) -> bool {
        self.dirty.is_empty() && self.deep.is_empty()
    }
}

/// How a backup scanned its sources, for its report and run record.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ScanReport {
    /// `"journal"` (only what changed was listed), `"full"`, or `"verify"`
    /// (both, the full scan stored).
    pub mode: String,
    /// Why the whole tree was scanned when a journal was offered or asked
    /// for; `None` when no journal was asked for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Directories listed (journal mode: the dirty ones and all below the
    /// deep ones).
    pub dirs_listed: u64,
    /// Directories changed per the journal (dirty and deep).
    #[serde(default)]
    pub dirs_changed: u64,
    /// A verification run (`mode` "verify": the journal's walk, then a full
    /// scan, whose snapshot is stored): whether the two agreed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub journal_matched: Option<bool>,
    /// Nothing changed, the sources and the directories above them as the
    /// parent saw them: the parent's tree was taken whole, no index read.
    #[serde(default)]
    pub unchanged: bool,
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn set(v: &[&str]) -> BTreeSet<PathBuf> {
        v.iter().map(PathBuf::from).collect()
    }

    #[test]
    fn touches_sees_what_is_at_or_below_and_under_a_deep_directory() {
        let c = Changes {
            parent: String::new(),
            dirty: set(&["/s/a/b", "/s/c"]),
            deep: set(&["/s/d"]),
            tops: Vec::new(),
        };
        for p in ["/s", "/s/a", "/s/a/b", "/s/c", "/s/d", "/s/d/x/y"] {
            assert!(c.touches(Path::new(p)), "{p}");
        }
        // A sibling whose name extends a dirty one's is not below it.
        for p in ["/s/a/b-x", "/s/a/bb", "/s/a/c", "/s/b", "/t", "/s/c/x"] {
            assert!(!c.touches(Path::new(p)), "{p}");
        }
        assert!(c.is_deep(Path::new("/s/d/x")));
        assert!(!c.is_deep(Path::new("/s/dd")));
        assert!(c.is_dirty(Path::new("/s/c")) && !c.is_dirty(Path::new("/s/c/x")));
    }
}
