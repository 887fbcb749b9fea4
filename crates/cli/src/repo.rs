//! The repository as a command reads it: the application layer's opening,
//! snapshot naming and reading sessions, with their warnings printed.

use std::sync::Arc;

use anyhow::Result;
use capsule_access::{Access, Opened};
use capsule_app::open::Through;
use capsule_app::{RepoLocation, Settings};
use capsule_engine::{EngineError, Repository};
use capsule_format::snapshot::Snapshot;
use capsule_format::{BlobId, ObjectId};

use crate::output::Output;

/// Opens the settings' repository through the cache.
pub fn open(s: &Settings, out: &Output) -> Result<(Repository, RepoLocation)> {
    Ok(capsule_app::open::open(s, &|w| out.warn(w))?)
}

/// Opens without the cache: for `check` and `repair`, which must read the
/// destination.
pub fn open_uncached(s: &Settings, out: &Output) -> Result<Opened> {
    let access = s.access(&s.location()?)?;
    Ok(capsule_app::open::open_at(
        s,
        &access,
        Through::Direct,
        &|w| out.warn(w),
    )?)
}

/// Opens the repository `access` reaches, through the cache.
pub fn open_at(s: &Settings, access: &Access, out: &Output) -> Result<Opened> {
    Ok(capsule_app::open::open_at(
        s,
        access,
        Through::Cache,
        &|w| out.warn(w),
    )?)
}

/// Resolves a snapshot argument, saying what is odd about the one it
/// names (see [`capsule_app::open::resolve_snapshot`]).
pub fn resolve(repo: &Repository, out: &Output, spec: &str) -> Result<(ObjectId, Snapshot)> {
    Ok(capsule_app::open::resolve_snapshot(repo, spec, &|w| {
        out.warn(w)
    })?)
}

/// A session held while a command of `kind` reads the repository (see
/// [`capsule_app::open::reading_session`]); `risk` is said when none can
/// be written.
pub fn reading_session(
    repo: &Arc<Repository>,
    out: &Output,
    kind: &str,
    risk: &str,
) -> Option<capsule_engine::session::Session> {
    capsule_app::open::reading_session(repo, kind, risk, &|w| out.warn(w))
}

/// The root tree of snapshot `s`.
pub fn root_of(s: &Snapshot) -> Result<BlobId> {
    s.tree
        .parse()
        .map_err(|_| EngineError::corrupt("snapshot", "bad tree id").into())
}
