//! Prune marks (`prune-marks/<id>`): the packs a prune took out of the
//! index, with their entries, until a later pass sweeps them (docs/FORMAT.md,
//! "Prune marks").

use std::collections::HashSet;

use capsule_crypto::Aad;
use capsule_format::index::{decode_index, encode_index, IndexFile, IndexPack};
use capsule_format::snapshot::{from_json, to_json};
use capsule_format::{FileType, ObjectId};
use serde::{Deserialize, Serialize};

use super::{list_prefix, MARKS_PREFIX};
use crate::error::{EngineError, Result};
use crate::index::{save_index_file, MasterIndex};
use crate::repo::{put_addressed, Repository};

/// A mark, sealed with [`Aad::PruneMark`].
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(super) struct Mark {
    version: u32,
    /// When it was made (the pruner's clock).
    time_unix: i64,
    hostname: String,
    /// Sessions held once the index without these packs was visible; none
    /// while the mark is *unarmed*: written before the index, so a cut
    /// between the two leaves a record of the packs (see [`super::prune`]).
    pub(super) sessions: Option<Vec<String>>,
    /// The packs and their index entries, as an encoded index file (hex):
    /// what a sweep needs to put a pack back.
    packs: String,
}

/// Entries a mark holds at most (unless one pack alone has more): a mark
/// is written and read whole, as hex in JSON, so one mark for every pack a
/// prune takes out grew with what it forgot (1 M entries made a 96 MB
/// mark, and writing it took three times that). Marks are independent, so
/// the packs are simply spread over several.
const MARK_ENTRIES: usize = 65_536;

/// Stores the marks for `packs` (as many as [`MARK_ENTRIES`] asks);
/// returns their names.
pub(super) fn write_marks(
    repo: &Repository,
    now: i64,
    sessions: Option<Vec<String>>,
    packs: &[IndexPack],
) -> Result<Vec<String>> {
    let mut names = Vec::new();
    let mut rest = packs;
    while !rest.is_empty() {
        let mut n = 0;
        let mut entries = 0;
        while n < rest.len() && (n == 0 || entries + rest[n].entries.len() <= MARK_ENTRIES) {
            entries += rest[n].entries.len();
            n += 1;
        }
        let (these, later) = rest.split_at(n);
        rest = later;
        let mark = Mark {
            version: 1,
            time_unix: now,
            hostname: crate::repo::hostname(),
            sessions: sessions.clone(),
            packs: hex::encode(encode_index(&IndexFile {
                supersedes: Vec::new(),
                packs: these.to_vec(),
            })),
        };
        let sealed = repo.key().seal(Aad::PruneMark, &to_json(&mark))?;
        let name = FileType::PruneMark.name(&ObjectId::of(&sealed));
        put_addressed(&**repo.backend(), &name, &sealed)?;
        names.push(name);
    }
    Ok(names)
}

/// Packs that a prune has marked for deletion: out of the index on
/// purpose, so `check` does not call them unindexed and `repair index` does
/// not take them back. A damaged mark marks nothing.
pub fn marked_packs(repo: &Repository) -> Result<HashSet<ObjectId>> {
    Ok(marked_index_packs(repo)?
        .into_iter()
        .map(|p| p.id)
        .collect())
}

/// Adds the packs marked for deletion to `index` as a fallback: blobs
/// indexed elsewhere keep their place, others are found in their marked
/// pack. Readers (restore, ls, check's tree walk) use it for the one window
/// where a live snapshot needs a marked pack: a backup that committed
/// while a prune marked blobs it reused, until the next prune's sweep puts
/// the pack back. Such a pack is never deleted while a live snapshot uses
/// it. Returns how many packs were added.
pub fn add_marked_packs(repo: &Repository, index: &mut MasterIndex) -> Result<usize> {
    let marked = marked_index_packs(repo)?;
    let mut added = 0;
    for p in &marked {
        if !index.has_pack(&p.id) {
            index.add_pack(p);
            added += 1;
        }
    }
    Ok(added)
}

/// The packs every readable mark names, with their index entries.
pub(crate) fn marked_index_packs(repo: &Repository) -> Result<Vec<IndexPack>> {
    Ok(readable_marks(repo)?
        .into_iter()
        .flat_map(|(_, packs)| packs)
        .collect())
}

/// A readable mark: the sessions it names (`None`: unarmed) and its packs
/// with their index entries.
type ReadMark = (Option<Vec<String>>, Vec<IndexPack>);

/// Every readable mark.
fn readable_marks(repo: &Repository) -> Result<Vec<ReadMark>> {
    let mut out = Vec::new();
    for name in list_prefix(repo, MARKS_PREFIX)? {
        let Ok(b) = repo.backend().get(&name, None) else {
            continue;
        };
        let Ok(p) = repo.key().open(Aad::PruneMark, &b) else {
            continue;
        };
        let Ok(mark) = from_json::<Mark>(&p) else {
            continue;
        };
        let Some(idx) = hex::decode(&mark.packs)
            .ok()
            .and_then(|raw| decode_index(&raw).ok())
        else {
            continue;
        };
        out.push((mark.sessions, idx.packs));
    }
    Ok(out)
}

/// For a backup about to commit (or just committed): puts back into the
/// index every marked pack it may refer to, those of the index it started
/// from and those it wrote. A prune that ran during the backup may have
/// marked them; without this, its snapshot would refer to blobs that no
/// index lists until the next prune's sweep finds them in use. One list
/// request when nothing is marked. Returns whether a mark that concerns
/// this backup exists.
///
/// Only marks unarmed or naming `session` concern it. A mark armed without
/// it was armed before the session began: the prune lists the sessions
/// after its index without the packs is visible, and the backup stores its
/// session before it reads the index. So the index it started from had
/// those packs only where something put them back since (an index file
/// that stays until a later prune marks them again, naming this session
/// then). The same holds for an unarmed mark a later prune armed with the
/// sessions it listed first (its packs may still be in index files the
/// cut prune did not replace): no prune takes a pack out of the index
/// without carrying it into its own file or marking it anew with the
/// sessions held once its index is visible, so a pack this backup may
/// use stays indexed, or a mark naming this session covers it.
/// Putting them back again, as every backup once did for as long as
/// the mark waited, wrote two index files a run that every other machine
/// then fetched, and kept packs no snapshot uses indexed, so that each
/// sweep put them back instead of deleting them.
pub(crate) fn reindex_marked_for_writer(
    repo: &Repository,
    session: &str,
    start: &MasterIndex,
    written: &[(String, u64)],
) -> Result<bool> {
    let marked: Vec<IndexPack> = readable_marks(repo)?
        .into_iter()
        .filter(|(sessions, _)| {
            sessions
                .as_ref()
                .is_none_or(|s| s.iter().any(|id| id == session))
        })
        .flat_map(|(_, packs)| packs)
        .collect();
    if marked.is_empty() {
        return Ok(false);
    }
    let written: HashSet<&str> = written.iter().map(|(n, _)| n.as_str()).collect();
    let mut seen = HashSet::new();
    let back: Vec<IndexPack> = marked
        .into_iter()
        .filter(|p| {
            let t = p
                .entries
                .first()
                .map_or(capsule_format::BlobType::Data, |e| e.blob_type);
            (start.has_pack(&p.id) || written.contains(crate::repo::pack_name(&p.id, t).as_str()))
                && seen.insert(p.id)
        })
        .collect();
    if back.is_empty() {
        return Ok(true);
    }
    save_index_file(
        repo,
        &IndexFile {
            supersedes: Vec::new(),
            packs: back,
        },
    )?;
    Ok(true)
}

/// A mark as a pass holds it: its name, what it says (without its
/// entries) and the packs it names.
type LoadedMark = (String, Mark, Vec<ObjectId>);

/// Every mark, oldest first, without the index entries (a pass reads those
/// again, one mark at a time, when it sweeps or arms one); the tree packs
/// they name, with their entries, go into `trees`. A damaged mark stops
/// the prune: its packs are out of the index, and without it nobody knows
/// which they are.
pub(super) fn load_marks(repo: &Repository, trees: &mut MasterIndex) -> Result<Vec<LoadedMark>> {
    let mut out = Vec::new();
    for name in list_prefix(repo, MARKS_PREFIX)? {
        let (mut mark, packs) = read_mark(repo, &name)?;
        mark.packs = String::new();
        for p in &packs.packs {
            if p.entries
                .first()
                .is_some_and(|e| e.blob_type == capsule_format::BlobType::Tree)
            {
                trees.add_pack(p);
            }
        }
        out.push((name, mark, packs.packs.iter().map(|p| p.id).collect()));
    }
    out.sort_by_key(|(n, m, _)| (m.time_unix, n.clone()));
    Ok(out)
}

/// The packs mark `name` names, with their entries.
pub(super) fn mark_entries(repo: &Repository, name: &str) -> Result<IndexFile> {
    Ok(read_mark(repo, name)?.1)
}

fn read_mark(repo: &Repository, name: &str) -> Result<(Mark, IndexFile)> {
    let b = repo.backend().get(name, None)?;
    let damaged = |d: String| {
        EngineError::PruneRefused(format!(
            "the prune mark {name} is damaged ({d}); restore it from a copy, or remove it and run `capsule repair index` to take its packs back"
        ))
    };
    let p = repo
        .key()
        .open(Aad::PruneMark, &b)
        .map_err(|e| damaged(e.to_string()))?;
    let mark: Mark = from_json(&p).map_err(|e| damaged(e.to_string()))?;
    let raw = hex::decode(&mark.packs).map_err(|e| damaged(e.to_string()))?;
    let packs = decode_index(&raw).map_err(|e| damaged(e.to_string()))?;
    Ok((mark, packs))
}

#[cfg(test)]
mod tests {
    use super::*;
    use capsule_format::pack::PackEntry;
    use capsule_format::{BlobId, BlobType, Id};

    fn pack(n: u8, t: BlobType, entries: usize) -> IndexPack {
        IndexPack {
            id: ObjectId::of(&[n]),
            size: 1 << 20,
            entries: (0..entries)
                .map(|i| PackEntry {
                    blob_type: t,
                    id: BlobId(Id(
                        *blake3::hash(&[&[n][..], &i.to_le_bytes()].concat()).as_bytes()
                    )),
                    offset: i as u32,
                    length: 1,
                    raw_length: 1,
                })
                .collect(),
        }
    }

    /// Packs are spread over marks of at most `MARK_ENTRIES` entries (a
    /// pack larger than that alone in one), every pack in exactly one;
    /// loading keeps only the pack list and the tree packs' entries, and
    /// each mark gives back its entries whole.
    #[test]
    fn marks_stay_small_and_together_name_every_pack() {
        let store = std::sync::Arc::new(capsule_backend::testing::MemoryBackend::new());
        let opts = crate::repo::InitOptions {
            kdf: capsule_crypto::KdfParams {
                m_cost: 64,
                t_cost: 1,
                p_cost: 1,
            },
            ..Default::default()
        };
        let repo = Repository::init(store, b"pw", &opts).unwrap();
        let packs = vec![
            pack(1, BlobType::Data, 30_000),
            pack(2, BlobType::Tree, 40_000),
            pack(3, BlobType::Data, MARK_ENTRIES + 1),
            pack(4, BlobType::Data, 10),
        ];
        let names = write_marks(&repo, 1, None, &packs).unwrap();
        // 30,000 | 40,000 | 65,537 (alone, over the bound) | 10
        assert_eq!(names.len(), 4);

        let mut trees = MasterIndex::default();
        let loaded = load_marks(&repo, &mut trees).unwrap();
        let mut named: Vec<ObjectId> = loaded.iter().flat_map(|(_, _, p)| p.clone()).collect();
        named.sort();
        let mut want: Vec<ObjectId> = packs.iter().map(|p| p.id).collect();
        want.sort();
        assert_eq!(named, want);
        assert!(loaded
            .iter()
            .all(|(_, m, _)| m.packs.is_empty() && m.sessions.is_none()));
        assert!(trees.contains(&packs[1].entries[0].id));
        assert!(!trees.contains(&packs[0].entries[0].id));

        let mut entries = 0;
        for (name, _, _) in &loaded {
            let f = mark_entries(&repo, name).unwrap();
            let n: usize = f.packs.iter().map(|p| p.entries.len()).sum();
            assert!(n <= MARK_ENTRIES || f.packs.len() == 1, "{n}");
            entries += n;
        }
        assert_eq!(entries, 30_000 + 40_000 + MARK_ENTRIES + 1 + 10);
    }
}
