//! A repository that does not open: whether what is there is one at all
//! (objects without a config), and whether a versioned store still keeps
//! what was deleted or overwritten (then `--as-of`, never `init`).

use capsule_backend::{Backend, ErrorKind};
use capsule_format::FileType;

use crate::error::{EngineError, Result};

/// A repository whose `config` (or every key file) is gone or damaged on
/// a versioned store that still keeps older versions of it: deleted or
/// overwritten since (an attack, or a mistake), and readable as it was
/// with `--as-of`.
pub(super) fn history_left(backend: &dyn Backend, e: EngineError) -> EngineError {
    let (location, what) = match &e {
        EngineError::NotARepository { location }
        | EngineError::MissingConfig { location }
        | EngineError::DamagedConfig { location, .. } => (location.clone(), "config"),
        // Every key file damaged: overwritten, where older versions are kept.
        EngineError::NoUsableKey { location, .. } => (location.clone(), "keys/"),
        _ => return e,
    };
    let was = e.to_string();
    let Some(h) = backend.history() else {
        return e;
    };
    let Ok(versions) = h.versions(what) else {
        return e;
    };
    let mut per_name: std::collections::BTreeMap<&str, usize> = Default::default();
    for v in versions.iter().filter(|v| !v.delete_marker) {
        *per_name.entry(v.name.as_str()).or_default() += 1;
    }
    let kept: usize = per_name.values().sum();
    // Gone: any version kept is history. Damaged: an older version beside
    // the current one, for some name.
    let gone = matches!(
        e,
        EngineError::NotARepository { .. } | EngineError::MissingConfig { .. }
    );
    if !(gone && kept > 0 || per_name.values().any(|n| *n >= 2)) {
        return e;
    }
    EngineError::HistoryLeft {
        location,
        was,
        versions: kept,
    }
}

/// Whether the location holds keys, snapshots or index files: the marks
/// of a repository, with or without its config.
pub(super) fn holds_repository_objects(backend: &dyn Backend) -> Result<bool> {
    for prefix in [
        FileType::Key.prefix(),
        FileType::Snapshot.prefix(),
        FileType::Index.prefix(),
    ] {
        match backend.list(prefix) {
            Ok(l) if !l.is_empty() => return Ok(true),
            Ok(_) => {}
            Err(e) if e.kind == ErrorKind::NotFound => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(false)
}
