//! Repository statistics: how much is stored, and how much deduplication and
//! compression saved.

use capsule_format::BlobType;

use crate::error::Result;
use crate::index::MasterIndex;
use crate::repo::Repository;

/// Repository-wide numbers.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct RepoStats {
    /// Snapshots.
    pub snapshots: u64,
    /// Pack files indexed.
    pub packs: u64,
    /// Bytes in indexed packs.
    pub pack_bytes: u64,
    /// Index files.
    pub index_files: u64,
    /// Data blobs.
    pub data_blobs: u64,
    /// Tree blobs.
    pub tree_blobs: u64,
    /// Plaintext bytes of all unique blobs.
    pub unique_bytes: u64,
    /// Sum of file bytes over all snapshots (what restoring all would write).
    pub logical_bytes: u64,
    /// `logical_bytes / pack_bytes`: combined gain of dedup and compression.
    pub space_saving_ratio: f64,
}

/// Computes statistics from the index and snapshot summaries.
pub fn stats(repo: &Repository, index: &MasterIndex) -> Result<RepoStats> {
    let (snaps, _) = repo.list_snapshots()?;
    let mut s = RepoStats {
        snapshots: snaps.len() as u64,
        packs: index.packs().len() as u64,
        pack_bytes: index.packs().iter().map(|p| p.size).sum(),
        index_files: index.files().len() as u64,
        logical_bytes: snaps.iter().map(|(_, s)| s.summary.bytes).sum(),
        ..RepoStats::default()
    };
    for (_, loc) in index.iter() {
        match loc.blob_type {
            BlobType::Data => s.data_blobs += 1,
            BlobType::Tree => s.tree_blobs += 1,
        }
        s.unique_bytes += loc.raw_length as u64;
    }
    if s.pack_bytes > 0 {
        s.space_saving_ratio = s.logical_bytes as f64 / s.pack_bytes as f64;
    }
    Ok(s)
}
