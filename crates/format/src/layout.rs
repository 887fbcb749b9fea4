//! Where each kind of object lives in a repository, in one place: the
//! directory, how names are formed from IDs, and whether the local cache
//! keeps copies. `docs/FORMAT.md` ("Layout") is the normative table; the
//! test below holds the two together.

use crate::blob::BlobType;
use crate::id::ObjectId;

/// A kind of object in a repository.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FileType {
    /// `config`: the encrypted repository config (one object).
    Config,
    /// `keys/<id>`: key files.
    Key,
    /// `snapshots/<id>`: committed snapshots.
    Snapshot,
    /// `forgotten/<id>`: snapshots set aside by `forget` until a prune.
    Forgotten,
    /// `index/<id>`: index files.
    Index,
    /// `data/<id[0..2]>/<id>`: packs of file data.
    DataPack,
    /// `tree/<id[0..2]>/<id>`: packs of trees.
    TreePack,
    /// `sessions/<sid>-<seq>`: running backups.
    Session,
    /// `prune-marks/<id>`: packs a prune will delete.
    PruneMark,
    /// `quota/<id>`: the repository's quota (the newest counts).
    Quota,
    /// `verified/<id>`: when a slice of the packs was last read and
    /// verified (`check --read-data-subset next/M`).
    Verified,
}

/// Prefix of incomplete writes (`.tmp-<random>` in the object's directory):
/// never listed, never read.
pub const TEMP_PREFIX: &str = ".tmp-";

impl FileType {
    /// Every kind, in the order of FORMAT.md's table.
    pub const ALL: [FileType; 11] = [
        FileType::Config,
        FileType::Key,
        FileType::Snapshot,
        FileType::Forgotten,
        FileType::Index,
        FileType::DataPack,
        FileType::TreePack,
        FileType::Session,
        FileType::PruneMark,
        FileType::Quota,
        FileType::Verified,
    ];

    /// The directory prefix to list (with its trailing `/`); for the
    /// config, its whole name.
    pub const fn prefix(self) -> &'static str {
        match self {
            FileType::Config => "config",
            FileType::Key => "keys/",
            FileType::Snapshot => "snapshots/",
            FileType::Forgotten => "forgotten/",
            FileType::Index => "index/",
            FileType::DataPack => "data/",
            FileType::TreePack => "tree/",
            FileType::Session => "sessions/",
            FileType::PruneMark => "prune-marks/",
            FileType::Quota => "quota/",
            FileType::Verified => "verified/",
        }
    }

    /// The pack kind that holds blobs of type `t`.
    pub const fn pack(t: BlobType) -> FileType {
        match t {
            BlobType::Data => FileType::DataPack,
            BlobType::Tree => FileType::TreePack,
        }
    }

    /// The object name of ID `id` (the config ignores it). Packs fan out
    /// over 256 subdirectories by the first two hex digits, so no directory
    /// of a file-system destination grows past a few thousand entries.
    pub fn name(self, id: &ObjectId) -> String {
        self.name_hex(&id.to_hex())
    }

    /// Like [`FileType::name`], from the hex form (or, for sessions, the
    /// `<sid>-<seq>` suffix).
    pub fn name_hex(self, hex: &str) -> String {
        match self {
            FileType::Config => "config".to_string(),
            FileType::DataPack | FileType::TreePack => {
                format!("{}{}/{hex}", self.prefix(), hex.get(..2).unwrap_or(hex))
            }
            _ => format!("{}{hex}", self.prefix()),
        }
    }

    /// Whether the local cache keeps copies: small objects every run needs
    /// (index files, snapshots, tree packs, and prune marks, which every
    /// backup reads while a prune's packs wait for the sweep, a week on the
    /// daemon's schedule), all content-addressed, so a cached copy is
    /// checked against its name.
    pub const fn cached(self) -> bool {
        matches!(
            self,
            FileType::Index | FileType::Snapshot | FileType::TreePack | FileType::PruneMark
        )
    }

    /// The kind an object name belongs to (`None` for names outside the
    /// layout, and for incomplete writes).
    pub fn of_name(name: &str) -> Option<FileType> {
        if name
            .rsplit('/')
            .next()
            .is_some_and(|n| n.starts_with(TEMP_PREFIX))
        {
            return None;
        }
        if name == "config" {
            return Some(FileType::Config);
        }
        FileType::ALL
            .into_iter()
            .skip(1)
            .find(|t| name.starts_with(t.prefix()) && name.len() > t.prefix().len())
    }

    /// The ID at the end of a content-addressed name.
    pub fn id_of(name: &str) -> Option<ObjectId> {
        name.rsplit('/').next()?.parse().ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_match_the_format_document() {
        let id = ObjectId::of(b"x");
        let doc = include_str!("../../../docs/FORMAT.md");
        for t in FileType::ALL {
            let name = t.name(&id);
            assert_eq!(FileType::of_name(&name), Some(t), "{name}");
            if t != FileType::Config && t != FileType::Session {
                assert_eq!(FileType::id_of(&name), Some(id));
            }
            // The layout table in FORMAT.md names every directory.
            assert!(
                doc.contains(t.prefix()),
                "FORMAT.md does not mention {}",
                t.prefix()
            );
        }
        let h = id.to_hex();
        assert_eq!(
            FileType::DataPack.name(&id),
            format!("data/{}/{h}", &h[..2])
        );
        assert_eq!(FileType::pack(BlobType::Tree), FileType::TreePack);
        assert_eq!(FileType::of_name("data/ab/.tmp-1234"), None);
        assert_eq!(FileType::of_name("elsewhere/x"), None);
        assert!(FileType::TreePack.cached() && !FileType::DataPack.cached());
    }
}
