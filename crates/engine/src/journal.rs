//! The local journal of packs that have landed but that no index file lists
//! yet.
//!
//! A backup writes an index file every [`crate::packer::INDEX_EVERY`] packs,
//! so a run that dies (killed, power lost, connection gone for good) leaves
//! up to that many finished packs, plus the ones in flight, stored but
//! unlisted. Without the journal the next run would upload their content
//! again: at 16 MiB a pack, up to 64 MiB or more over a slow link.
//!
//! Each pack is recorded here once its put has returned (so the journal only
//! names durable packs) and dropped once an index file listing it is stored.
//! The next run reads the journal, confirms each pack is on the destination
//! with the recorded size (one `stat` each, nothing when the journal is
//! empty, as it is after every completed run) and indexes it, so its blobs
//! count as stored and are not uploaded again.
//!
//! The journal is an optimisation, never needed for correctness: a missing,
//! stale or damaged journal only costs re-uploading. It is sealed with the
//! repository key like an index file, because it lists the same blob IDs.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use capsule_backend::ErrorKind;
use capsule_crypto::Aad;
use capsule_format::index::{decode_index, encode_index, IndexFile, IndexPack};
use capsule_format::{BlobType, ObjectId};

use crate::index::MasterIndex;
use crate::repo::{pack_name, Repository};
use crate::{EngineError, Result};

/// Packs landed and not yet indexed, mirrored to a local file.
#[derive(Debug)]
pub struct Journal {
    path: PathBuf,
    packs: Mutex<Vec<IndexPack>>,
}

impl Journal {
    /// A journal at `path`, starting with `packs` (those recovered from the
    /// previous run, which are not in any index file yet either).
    pub fn new(path: PathBuf, packs: Vec<IndexPack>) -> Self {
        Journal {
            path,
            packs: Mutex::new(packs),
        }
    }

    /// Records a pack whose put has returned.
    pub fn landed(&self, repo: &Repository, p: &IndexPack) {
        let mut g = self.packs.lock().unwrap_or_else(|p| p.into_inner());
        g.push(p.clone());
        self.write(repo, &g);
    }

    /// Forgets packs that a stored index file now lists.
    pub fn indexed(&self, repo: &Repository, ids: &[ObjectId]) {
        let mut g = self.packs.lock().unwrap_or_else(|p| p.into_inner());
        let before = g.len();
        g.retain(|p| !ids.contains(&p.id));
        if g.len() != before {
            self.write(repo, &g);
        }
    }

    /// Rewrites the file (whole, through a rename, so a reader never sees a
    /// half-written one). Failures are ignored: they cost only re-uploading.
    fn write(&self, repo: &Repository, packs: &[IndexPack]) {
        if packs.is_empty() {
            let _ = std::fs::remove_file(&self.path);
            return;
        }
        let f = IndexFile {
            packs: packs.to_vec(),
            ..Default::default()
        };
        let Ok(sealed) = repo.key().seal(Aad::Index, &encode_index(&f)) else {
            return;
        };
        let tmp = self
            .path
            .with_extension(format!("tmp-{}", std::process::id()));
        let ok = std::fs::File::create(&tmp)
            .and_then(|mut w| w.write_all(&sealed))
            .and_then(|_| std::fs::rename(&tmp, &self.path));
        if ok.is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
    }
}

/// Reads the journal left at `path` by an earlier run and returns the packs
/// it names that are on the destination but in no index file, after adding
/// them to `index`. An unreadable journal is ignored (and removed): it only
/// ever saves work.
pub fn recover(repo: &Repository, index: &mut MasterIndex, path: &Path) -> Result<Vec<IndexPack>> {
    let Ok(sealed) = std::fs::read(path) else {
        return Ok(Vec::new());
    };
    let file = repo
        .key()
        .open(Aad::Index, &sealed)
        .ok()
        .and_then(|p| decode_index(&p).ok());
    let Some(file) = file else {
        let _ = std::fs::remove_file(path);
        return Ok(Vec::new());
    };
    let mut recovered = Vec::new();
    for p in file.packs {
        if index.has_pack(&p.id) {
            continue;
        }
        let t = p
            .entries
            .first()
            .map(|e| e.blob_type)
            .unwrap_or(BlobType::Data);
        match repo.backend().stat(&pack_name(&p.id, t)) {
            Ok(info) if info.size == p.size => {
                index.add_pack(&p);
                recovered.push(p);
            }
            // Gone or different: upload its blobs again, as without a journal.
            Ok(_) => {}
            Err(e) if e.kind == ErrorKind::NotFound => {}
            Err(e) => return Err(EngineError::from(e)),
        }
    }
    Ok(recovered)
}
