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
//! stale or damaged journal only costs re-uploading. Each record is sealed
//! with the repository key like an index file, because it lists the same
//! blob IDs.
//!
//! The file is a sequence of records, one per pack, appended as packs land:
//! the pack ID in clear (it is the pack's object name on the destination
//! anyway), a little-endian `u32` length, and that many bytes sealing an
//! index file that lists only this pack. Appending keeps the cost of a
//! landed pack proportional to that pack, where rewriting the whole journal
//! held three copies of every unindexed entry at once (about 40 MB on
//! 300,000 tiny files). A record cut short by a crash ends the journal;
//! those before it still count.
//!
//! A data pack's record lists no entries, only the pack and its size: the
//! pack's own header lists them, and recovery reads it there (one ranged
//! read a pack, for the few packs a run leaves unindexed). Encoding and
//! sealing a full pack of tiny blobs (260,000 entries) for its record took
//! 27 MB at once, a quarter of the peak of an initial backup of a million
//! tiny files. A tree pack's record keeps its entries (they are few), and
//! a record with entries, as earlier versions wrote for every pack, is
//! still read as it is.

use std::collections::HashSet;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use capsule_backend::ErrorKind;
use capsule_crypto::Aad;
use capsule_format::index::{decode_index, encode_index_parts, IndexPack};
use capsule_format::{BlobType, ObjectId};

use crate::error::{EngineError, Result};
use crate::index::MasterIndex;
use crate::repo::{pack_name, Repository};

/// Bytes before a record's sealed part: pack ID and length.
const RECORD_HEADER: usize = 32 + 4;

/// Packs landed and not yet indexed, mirrored to a local file. Only their
/// IDs are held here; their entries are in the file.
#[derive(Debug)]
pub struct Journal {
    path: PathBuf,
    packs: Mutex<HashSet<ObjectId>>,
}

impl Journal {
    /// A journal at `path`, starting with `packs` (those recovered from the
    /// previous run, which are not in any index file yet either).
    pub fn new(repo: &Repository, path: PathBuf, packs: &[IndexPack]) -> Self {
        let j = Journal {
            path,
            packs: Mutex::new(packs.iter().map(|p| p.id).collect()),
        };
        let mut file = Vec::new();
        for p in packs {
            let _ = append_record(repo, &mut file, &as_recorded(p));
        }
        j.replace(&file);
        j
    }

    /// Records a pack whose put has returned.
    pub fn landed(&self, repo: &Repository, p: &IndexPack) {
        let mut g = self.packs.lock().unwrap_or_else(|p| p.into_inner());
        let mut record = Vec::new();
        if append_record(repo, &mut record, &as_recorded(p)).is_err() {
            return;
        }
        let ok = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.path)
            .and_then(|mut f| f.write_all(&record));
        if ok.is_ok() {
            g.insert(p.id);
        }
        drop(g);
        // A test kills the run here: a pack landed and journalled, and no
        // index file yet (tests/kill.rs).
        crate::pause::test_pause("journal-landed");
    }

    /// Forgets packs that a stored index file now lists.
    pub fn indexed(&self, _repo: &Repository, ids: &[ObjectId]) {
        let mut g = self.packs.lock().unwrap_or_else(|p| p.into_inner());
        let before = g.len();
        for id in ids {
            g.remove(id);
        }
        if g.len() == before {
            return;
        }
        if g.is_empty() {
            let _ = std::fs::remove_file(&self.path);
            return;
        }
        // Keep the records of packs still unindexed (few: an index file is
        // written every few packs).
        let Ok(old) = capsule_backend::ownfile::read_bounded(&self.path, JOURNAL_MAX) else {
            return;
        };
        let mut kept = Vec::new();
        for (id, record) in records(&old) {
            if g.contains(&id) {
                kept.extend_from_slice(record);
            }
        }
        self.replace(&kept);
    }

    /// Replaces the file whole, through a rename, so a reader never sees a
    /// half-written one. Failures are ignored: they cost only re-uploading.
    fn replace(&self, bytes: &[u8]) {
        if bytes.is_empty() {
            let _ = std::fs::remove_file(&self.path);
            return;
        }
        let tmp = self
            .path
            .with_extension(format!("tmp-{}", std::process::id()));
        let ok = std::fs::File::create(&tmp)
            .and_then(|mut w| w.write_all(bytes))
            .and_then(|_| std::fs::rename(&tmp, &self.path));
        if ok.is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
    }
}

/// What a record keeps of `p`: a data pack without its entries (its header
/// has them), a tree pack whole.
fn as_recorded(p: &IndexPack) -> std::borrow::Cow<'_, IndexPack> {
    if p.entries
        .first()
        .is_some_and(|e| e.blob_type == BlobType::Tree)
    {
        std::borrow::Cow::Borrowed(p)
    } else {
        std::borrow::Cow::Owned(IndexPack {
            id: p.id,
            size: p.size,
            entries: Vec::new(),
        })
    }
}

/// Appends one pack's record to `out`.
fn append_record(repo: &Repository, out: &mut Vec<u8>, p: &IndexPack) -> Result<()> {
    let plain = encode_index_parts(&[], std::slice::from_ref(p));
    let sealed = repo.key().seal(Aad::Index, &plain)?;
    let len = u32::try_from(sealed.len())
        .map_err(|_| EngineError::Invalid("journal record over 4 GiB".into()))?;
    out.extend_from_slice(p.id.as_bytes());
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(&sealed);
    Ok(())
}

/// The whole records in `bytes`, each as (pack ID, record bytes including
/// its header); stops at the first one cut short.
fn records(bytes: &[u8]) -> Vec<(ObjectId, &[u8])> {
    let mut out = Vec::new();
    let mut at = 0;
    while let Some(header) = bytes.get(at..at + RECORD_HEADER) {
        let (id, len) = header.split_at(32);
        let len = u32::from_le_bytes(len.try_into().unwrap_or_default()) as usize;
        let Some(record) = bytes.get(at..at + RECORD_HEADER + len) else {
            break;
        };
        let Ok(id) = <[u8; 32]>::try_from(id) else {
            break;
        };
        out.push((ObjectId(capsule_format::Id(id)), record));
        at += RECORD_HEADER + len;
    }
    out
}

/// Reads the journal left at `path` by an earlier run and returns the packs
/// it names that are on the destination but in no index file, after adding
/// them to `index`. An unreadable journal is ignored (and removed): it only
/// The most a journal may hold: a record per pack not yet in an index
/// file, and an index file is written every few packs.
const JOURNAL_MAX: u64 = 256 << 20;

/// ever saves work.
pub fn recover(repo: &Repository, index: &mut MasterIndex, path: &Path) -> Result<Vec<IndexPack>> {
    let bytes = match capsule_backend::ownfile::read_bounded(path, JOURNAL_MAX) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        // Not a file this machine's backups wrote (a FIFO, a link, far too
        // large): it only ever saves work, so it goes.
        Err(_) => {
            let _ = std::fs::remove_file(path);
            return Ok(Vec::new());
        }
    };
    let mut packs = Vec::new();
    for (id, record) in records(&bytes) {
        let pack = repo
            .key()
            .open(Aad::Index, &record[RECORD_HEADER..])
            .ok()
            .and_then(|p| decode_index(&p).ok())
            .and_then(|f| f.packs.into_iter().next())
            .filter(|p| p.id == id);
        match pack {
            Some(p) => packs.push(p),
            // A damaged record: what it named is simply uploaded again.
            None => break,
        }
    }
    if packs.is_empty() {
        let _ = std::fs::remove_file(path);
        return Ok(Vec::new());
    }
    let mut recovered = Vec::new();
    for mut p in packs {
        if index.has_pack(&p.id) {
            continue;
        }
        let t = p
            .entries
            .first()
            .map(|e| e.blob_type)
            .unwrap_or(BlobType::Data);
        let name = pack_name(&p.id, t);
        match repo.backend().stat(&name) {
            Ok(info) if info.size == p.size => {
                if p.entries.is_empty() {
                    // A data pack recorded without its entries: its header
                    // lists them. One that does not open is uploaded again.
                    match repo.read_pack_header(&name, p.id, p.size) {
                        Ok(read) => p.entries = read.entries,
                        Err(EngineError::Backend(e)) if e.is_destination_failure() => {
                            return Err(EngineError::Backend(e))
                        }
                        Err(_) => continue,
                    }
                }
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
