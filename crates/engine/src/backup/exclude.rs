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
}

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
        let mut b = GitignoreBuilder::new("/");
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
