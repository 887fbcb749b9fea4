//! The inodes the kernel holds, and what each stands for.
//!
//! A `find` over a snapshot makes the kernel hold an inode for every entry
//! it passed, and it lets them go only under memory pressure: at 1,000,000
//! entries a table of them was most of the mount's memory (a node each:
//! 897 MiB). An entry inside a snapshot is therefore kept as nothing at
//! all: its inode number is its directory's place in a table of
//! directories and its position in that directory's tree, and its node is
//! read from the browser's bounded cache of trees when it is asked for.
//! A directory is kept while the kernel holds any of its entries (their
//! lookups summed), and its place is reused after.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;

use capsule_format::tree::Node;
use capsule_format::{BlobId, ObjectId};

/// Entry `pos` of tree `tree`: an entry inside a snapshot.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) struct At {
    pub(crate) tree: BlobId,
    pub(crate) pos: u32,
}

/// What an inode stands for.
#[derive(Clone)]
pub(crate) enum What {
    Root,
    SnapshotsDir,
    HostsDir,
    Host(String),
    VersionsRoot,
    Link(Vec<u8>),
    /// The root of snapshot `.0`, made at `.1`.
    SnapRoot(ObjectId, i64),
    /// An entry inside a snapshot.
    Entry(At),
    /// A version of a file under `versions/`: its node, renamed.
    Version(Arc<Node>),
    /// A directory under `versions/`: the snapshot path it mirrors.
    VersionsDir(PathBuf),
    /// A file under `versions/`: a directory of its versions.
    FileVersions(PathBuf),
}

/// An inode that is not an entry inside a snapshot: few of them.
struct Other {
    what: What,
    parent: u64,
    name: Vec<u8>,
    lookups: u64,
}

/// A directory entries sit in: its tree, and the inode it is.
struct Dir {
    tree: BlobId,
    ino: u64,
    /// Lookups of its entries the kernel holds, summed; at zero its place
    /// (and with it its entries' inode numbers) is reused.
    refs: u64,
}

/// The top bit marks the inode number of an entry inside a snapshot: the
/// number itself says where it is (see [`Inodes::entry_ino`]).
const ENTRY: u64 = 1 << 63;

/// What a forget dropped.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Gone {
    Nothing,
    /// That inode.
    Inode,
    /// A directory's place, and with it the numbers of all its entries,
    /// which the next directory there reuses: whatever is kept by inode
    /// number for any of them must go too ([`in_place`]).
    Dir(u32),
}

/// Whether `ino` is the number of an entry of the directory at `place`.
pub(crate) fn in_place(ino: u64, place: u32) -> bool {
    ino & ENTRY != 0 && ((ino & !ENTRY) >> 32) as u32 == place
}

/// The inode table.
#[derive(Default)]
pub(crate) struct Inodes {
    others: HashMap<u64, Other>,
    dirs: Vec<Dir>,
    free: Vec<u32>,
    dir_of: HashMap<(BlobId, u64), u32>,
}

/// Where an inode sits: its parent and, for an entry inside a snapshot,
/// its place in the parent's tree; otherwise its name.
pub(crate) enum Place {
    InTree(u64, At),
    Named(u64, Vec<u8>),
}

impl Inodes {
    /// The inode number of entry `at.pos` of directory `parent`, whose
    /// tree is `at.tree`: the directory's place in the table and the
    /// position, so that an entry costs nothing here while the kernel
    /// holds it. While any of the directory's entries is held, the same
    /// entry reached the same way has the same number.
    ///
    /// The number is given and counted as held in one step, under the
    /// table's one lock: given first and counted after, a forget of the
    /// directory's last other entry in between would free its place, and
    /// the count would land on whatever directory took the place next.
    pub(crate) fn hold_entry(&mut self, at: At, parent: u64) -> u64 {
        let ino = self.entry_ino(at, parent);
        if let Some(d) = self.dirs.get_mut(((ino & !ENTRY) >> 32) as usize) {
            d.refs += 1;
        }
        ino
    }

    fn entry_ino(&mut self, at: At, parent: u64) -> u64 {
        let d = match self.dir_of.get(&(at.tree, parent)) {
            Some(&d) => d,
            None => {
                let dir = Dir {
                    tree: at.tree,
                    ino: parent,
                    refs: 0,
                };
                let d = match self.free.pop() {
                    Some(d) => {
                        self.dirs[d as usize] = dir;
                        d
                    }
                    None => {
                        self.dirs.push(dir);
                        (self.dirs.len() - 1) as u32
                    }
                };
                self.dir_of.insert((at.tree, parent), d);
                d
            }
        };
        ENTRY | (u64::from(d) << 32) | u64::from(at.pos)
    }

    /// The number [`Inodes::entry_ino`] gives, if the directory is kept
    /// already (a listing without attributes keeps nothing).
    pub(crate) fn known_entry_ino(&self, at: At, parent: u64) -> Option<u64> {
        let d = *self.dir_of.get(&(at.tree, parent))?;
        Some(ENTRY | (u64::from(d) << 32) | u64::from(at.pos))
    }

    fn dir(&self, ino: u64) -> Option<&Dir> {
        if ino & ENTRY == 0 {
            return None;
        }
        let i = ((ino & !ENTRY) >> 32) as u32;
        let d = self.dirs.get(i as usize)?;
        // A place freed is in the map no more (or under another index).
        (self.dir_of.get(&(d.tree, d.ino)) == Some(&i)).then_some(d)
    }

    /// What `ino` stands for.
    pub(crate) fn what(&self, ino: u64) -> Option<What> {
        if let Some(d) = self.dir(ino) {
            return Some(What::Entry(At {
                tree: d.tree,
                pos: ino as u32,
            }));
        }
        self.others.get(&ino).map(|o| o.what.clone())
    }

    /// The parent of `ino`, and where `ino` sits in it.
    pub(crate) fn place(&self, ino: u64) -> Option<Place> {
        if let Some(d) = self.dir(ino) {
            return Some(Place::InTree(
                d.ino,
                At {
                    tree: d.tree,
                    pos: ino as u32,
                },
            ));
        }
        self.others
            .get(&ino)
            .map(|o| Place::Named(o.parent, o.name.clone()))
    }

    /// The parent of `ino`.
    pub(crate) fn parent(&self, ino: u64) -> Option<u64> {
        match self.place(ino)? {
            Place::InTree(p, _) | Place::Named(p, _) => Some(p),
        }
    }

    /// Counts one lookup of `ino`, entry `name` of `parent` standing for
    /// `what`: the kernel now holds it. Not for entries inside snapshots
    /// ([`Inodes::hold_entry`]).
    pub(crate) fn note(&mut self, ino: u64, parent: u64, name: &[u8], what: What) {
        debug_assert!(ino & ENTRY == 0, "entries are held by hold_entry");
        let e = self.others.entry(ino).or_insert(Other {
            what,
            parent,
            name: name.to_vec(),
            lookups: 0,
        });
        e.lookups += 1;
    }

    /// Takes back `n` lookups of `ino`, and says what went with them.
    pub(crate) fn forget(&mut self, ino: u64, n: u64) -> Gone {
        if ino & ENTRY != 0 {
            if self.dir(ino).is_none() {
                return Gone::Nothing;
            }
            let i = ((ino & !ENTRY) >> 32) as u32;
            let Some(d) = self.dirs.get_mut(i as usize) else {
                return Gone::Nothing;
            };
            d.refs = d.refs.saturating_sub(n);
            if d.refs == 0 {
                let key = (d.tree, d.ino);
                self.dir_of.remove(&key);
                self.free.push(i);
                return Gone::Dir(i);
            }
            return Gone::Nothing;
        }
        if let Some(o) = self.others.get_mut(&ino) {
            o.lookups = o.lookups.saturating_sub(n);
            if o.lookups == 0 {
                self.others.remove(&ino);
                return Gone::Inode;
            }
        }
        Gone::Nothing
    }

    /// Keeps a fixed inode, never forgotten.
    pub(crate) fn fixed(&mut self, ino: u64, parent: u64, name: &str, what: What) {
        self.others.insert(
            ino,
            Other {
                what,
                parent,
                name: name.as_bytes().to_vec(),
                lookups: 1,
            },
        );
    }

    /// Directories kept, and other inodes.
    #[cfg(test)]
    fn len(&self) -> (usize, usize) {
        (self.dir_of.len(), self.others.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_entrys_number_says_where_it_is_and_its_directory_goes_with_its_last_lookup() {
        let mut t = Inodes::default();
        t.fixed(1, 1, "", What::Root);
        let a = |tree: u8, pos: u32| At {
            tree: BlobId(capsule_format::Id([tree; 32])),
            pos,
        };
        // Two entries of one tree under directory 10, one of the same
        // tree under directory 11 (a directory two snapshots share).
        let x = t.hold_entry(a(7, 0), 10);
        let y = t.hold_entry(a(7, 1), 10);
        let z = t.hold_entry(a(7, 0), 11);
        assert!(x != y && x != z && y != z);
        assert_eq!(
            t.hold_entry(a(7, 0), 10),
            x,
            "the same entry, the same number"
        );
        assert_eq!(t.len(), (2, 1));
        assert!(matches!(t.what(y), Some(What::Entry(a)) if a.pos == 1));
        assert_eq!(t.parent(z), Some(11));
        assert_eq!(t.parent(x), Some(10));
        // Directory 10 holds three lookups.
        assert_eq!(t.forget(x, 2), Gone::Nothing);
        assert!(t.what(y).is_some());
        let Gone::Dir(place) = t.forget(y, 1) else {
            panic!("directory 10 is gone with its last lookup");
        };
        assert!(in_place(x, place) && in_place(y, place) && !in_place(z, place));
        assert_eq!(t.len(), (1, 1));
        assert!(
            t.what(x).is_none(),
            "a forgotten directory's entries are gone"
        );
        // Its place is reused, under the new directory.
        let w = t.hold_entry(a(8, 5), 12);
        assert_eq!(t.parent(w), Some(12));
        assert_eq!(t.parent(z), Some(11));
        assert!(matches!(t.forget(z, 1), Gone::Dir(_)));
        assert!(matches!(t.forget(w, 7), Gone::Dir(_)));
        assert_eq!(t.len(), (0, 1));
        assert!(t.what(1).is_some());
        assert_eq!(
            t.forget(w, 1),
            Gone::Nothing,
            "forgetting again changes nothing"
        );
        assert_eq!(t.forget(1, 1), Gone::Inode);
    }
}
