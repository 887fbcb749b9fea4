//! Exclusions: global patterns from the command line and per-directory
//! ignore files, both in gitignore syntax (a pattern without `/` matches a
//! name at any depth; a leading `/` anchors it; `!` re-includes).

use std::path::Path;
use std::sync::Arc;

use ignore::gitignore::{Gitignore, GitignoreBuilder};
use ignore::Match;

use crate::error::{EngineError, Result};

/// Global excludes plus the stack of ignore files above a directory.
#[derive(Clone)]
pub struct Excludes {
    global: Arc<Gitignore>,
    /// Directories never backed up, whatever the patterns say (the
    /// repository itself when it lies inside a source).
    skip_dirs: Arc<Vec<std::path::PathBuf>>,
    file_name: Option<String>,
    stack: Vec<Arc<Gitignore>>,
    /// Patterns match names whatever their case, as the file system names
    /// files: macOS volumes are case-insensitive unless made otherwise
    /// (`*.JPG` there excludes `photo.jpg`, the same file to Finder).
    fold_case: bool,
}

/// Whether names on this system's usual volumes are case-insensitive.
pub const FOLD_CASE: bool = cfg!(target_os = "macos");

impl std::fmt::Debug for Excludes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Excludes({} ignore files)", self.stack.len())
    }
}

/// Checks a path pattern as restore's `--include`/`--exclude` and
/// backup's `--exclude` take it: one parser, so that a pattern one command
/// refuses is not taken by the other as a literal name (`[`).
pub fn check_pattern(p: &str) -> Result<globset::Glob> {
    globset::GlobBuilder::new(p)
        .literal_separator(true)
        .backslash_escape(true)
        .build()
        .map_err(|e| EngineError::Invalid(format!("bad pattern {p:?}: {e}")))
}

impl Excludes {
    /// Builds the global matcher. Patterns are matched against absolute
    /// paths, so `/home/me/cache` and `*.tmp` both work.
    pub fn new(
        patterns: &[String],
        file_name: Option<String>,
        skip_dirs: Vec<std::path::PathBuf>,
    ) -> Result<Self> {
        Self::with_case(patterns, file_name, skip_dirs, FOLD_CASE)
    }

    /// [`Excludes::new`], matching names whatever their case or not.
    pub fn with_case(
        patterns: &[String],
        file_name: Option<String>,
        skip_dirs: Vec<std::path::PathBuf>,
        fold_case: bool,
    ) -> Result<Self> {
        let mut b = GitignoreBuilder::new("/");
        b.case_insensitive(fold_case)
            .map_err(|e| EngineError::Invalid(format!("exclude patterns: {e}")))?;
        for p in patterns {
            check_pattern(p)?;
            b.add_line(None, p)
                .map_err(|e| EngineError::Invalid(format!("bad exclude pattern {p:?}: {e}")))?;
        }
        let global = b
            .build()
            .map_err(|e| EngineError::Invalid(format!("exclude patterns: {e}")))?;
        Ok(Excludes {
            global: Arc::new(global),
            skip_dirs: Arc::new(skip_dirs),
            file_name,
            stack: Vec::new(),
            fold_case,
        })
    }

    /// The excludes for entries inside `dir`: adds `dir`'s ignore file if it
    /// has one, read through `read_from` (a path that reaches the same
    /// directory through its descriptor). A malformed ignore file is
    /// reported, and its valid lines still apply.
    pub fn enter(&self, dir: &Path, read_from: &Path) -> (Self, Option<String>) {
        let Some(name) = &self.file_name else {
            return (self.clone(), None);
        };
        let f = read_from.join(name);
        if !f.is_file() {
            return (self.clone(), None);
        }
        let mut b = GitignoreBuilder::new(dir);
        let _ = b.case_insensitive(self.fold_case);
        let err = b.add(&f).map(|e| e.to_string());
        let mut next = self.clone();
        match b.build() {
            Ok(g) => next.stack.push(Arc::new(g)),
            Err(e) => return (next, Some(e.to_string())),
        }
        (next, err)
    }

    /// Whether `path` is excluded. The deepest ignore file with an opinion
    /// wins; the global patterns apply last and cannot be overridden.
    pub fn is_excluded(&self, path: &Path, is_dir: bool) -> bool {
        // capsule's own source snapshots, where they lie in a source.
        if is_dir && path.file_name() == Some(std::ffi::OsStr::new(capsule_snap::DIR_NAME)) {
            return true;
        }
        if is_dir && self.skip_dirs.iter().any(|d| d == path) {
            return true;
        }
        if let Match::Ignore(_) = self.global.matched(path, is_dir) {
            return true;
        }
        for g in self.stack.iter().rev() {
            match g.matched(path, is_dir) {
                Match::Ignore(_) => return true,
                Match::Whitelist(_) => return false,
                Match::None => {}
            }
        }
        false
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// On a case-insensitive volume (macOS's usual), `*.JPG` and
    /// `/Users/ann/Caches` name what Finder shows as `x.jpg` and
    /// `caches`; elsewhere case counts.
    #[test]
    fn case_folds_where_the_volume_does() {
        let pats = vec!["*.JPG".to_string(), "/Users/ann/Caches".to_string()];
        let fold = Excludes::with_case(&pats, None, Vec::new(), true).unwrap();
        assert!(fold.is_excluded(Path::new("/Users/ann/x.jpg"), false));
        assert!(fold.is_excluded(Path::new("/Users/ann/caches"), true));
        assert!(!fold.is_excluded(Path::new("/Users/ann/x.png"), false));
        let exact = Excludes::with_case(&pats, None, Vec::new(), false).unwrap();
        assert!(!exact.is_excluded(Path::new("/Users/ann/x.jpg"), false));
        assert!(exact.is_excluded(Path::new("/Users/ann/x.JPG"), false));
        assert_eq!(FOLD_CASE, cfg!(target_os = "macos"));
    }
}
