//! What a restore keeps of each tree node while it works.
//!
//! A restore plans every entry of the snapshot before it writes, so what it
//! holds per entry is multiplied by the number of entries: 300,000 files
//! held as full tree nodes (ctime, inode, device, link count, subtree ID,
//! symlink target and xattrs as empty vectors) took 256 bytes each before
//! their name and blob list, and each name and blob list was a heap
//! allocation of its own (a 7-byte name takes a 32-byte chunk). An `Item`
//! keeps the fields every entry needs (72 bytes), moves those only some
//! entries have (a symlink's target, xattrs, a device number, a hard link's
//! identity) behind one pointer, and puts names and blob lists end to end
//! in an `Arena`.

use capsule_format::tree::{Node, NodeKind, Timestamp};
use capsule_format::BlobId;

/// Every item's name and blob list, end to end.
#[derive(Default)]
pub(super) struct Arena {
    names: Vec<u8>,
    blobs: Vec<BlobId>,
}

impl Arena {
    /// Room for this many name bytes and blob references: grown by
    /// doubling instead, the arena would leave its earlier, smaller copies
    /// in the heap.
    pub fn with_capacity(name_bytes: usize, blobs: usize) -> Arena {
        Arena {
            names: Vec::with_capacity(name_bytes),
            blobs: Vec::with_capacity(blobs),
        }
    }

    /// Item `it`'s name: one path component, raw bytes.
    pub fn name(&self, it: &Item) -> &[u8] {
        &self.names[it.name.range()]
    }

    /// File item `it`'s data blobs, in order.
    pub fn content(&self, it: &Item) -> &[BlobId] {
        &self.blobs[it.content.range()]
    }

    /// Where the next item's parts will go: what `truncate` returns to.
    pub fn mark(&self) -> (usize, usize) {
        (self.names.len(), self.blobs.len())
    }

    /// Drops every part appended since `mark` (the items made since are
    /// dropped with them).
    pub fn truncate(&mut self, mark: (usize, usize)) {
        self.names.truncate(mark.0);
        self.blobs.truncate(mark.1);
    }
}

/// Where in an arena vector an item's part lies.
#[derive(Clone, Copy)]
struct Span {
    start: u32,
    len: u32,
}

impl Span {
    /// Appends `part` to `to`; `None` past 4 G elements.
    fn append<T>(to: &mut Vec<T>, part: Vec<T>) -> Option<Span> {
        let start = u32::try_from(to.len()).ok()?;
        let len = u32::try_from(part.len()).ok()?;
        start.checked_add(len)?;
        to.extend(part);
        Some(Span { start, len })
    }

    fn range(self) -> std::ops::Range<usize> {
        self.start as usize..self.start as usize + self.len as usize
    }
}

/// The arena is full: more than 4 GiB of names or 4 G blob references.
#[derive(Debug)]
pub(super) struct TooLarge;

/// One entry's kind and metadata as restore needs them; its name and blob
/// list are in the `Arena`.
pub(super) struct Item {
    name: Span,
    content: Span,
    /// Files: content length.
    pub size: u64,
    mtime_secs: i64,
    atime_secs: i64,
    mtime_nanos: u32,
    atime_nanos: u32,
    /// Permission bits (`st_mode & 0o7777`).
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    kind: NodeKind,
    /// The source file had holes; keep zero blocks as holes.
    pub sparse: bool,
    rare: Option<Box<Rare>>,
}

/// Fields most entries leave empty.
#[derive(Default)]
struct Rare {
    target: Vec<u8>,
    xattrs: Vec<(Vec<u8>, Vec<u8>)>,
    rdev: u64,
    /// `(device, inode)` of a file with more than one link at the source.
    link: Option<(u64, u64)>,
    /// macOS: birth time and file flags.
    btime: Option<Timestamp>,
    file_flags: Option<u32>,
}

impl Item {
    /// Keeps what restore needs of `node`, its name and blob list in
    /// `arena`; returns its subtree with it, which only the tree walk uses.
    pub fn new(node: Node, arena: &mut Arena) -> Result<(Item, Option<BlobId>), TooLarge> {
        let kind = node.kind();
        let link = (kind == NodeKind::File && node.nlink > 1).then_some((node.device, node.inode));
        let rare = (!node.target.is_empty()
            || !node.xattrs.is_empty()
            || node.rdev != 0
            || link.is_some()
            || node.btime.is_some()
            || node.file_flags.is_some())
        .then(|| {
            Box::new(Rare {
                target: node.target,
                xattrs: node.xattrs,
                rdev: node.rdev,
                link,
                btime: node.btime,
                file_flags: node.file_flags,
            })
        });
        let item = Item {
            name: Span::append(&mut arena.names, node.name).ok_or(TooLarge)?,
            content: Span::append(&mut arena.blobs, node.content).ok_or(TooLarge)?,
            size: node.size,
            mtime_secs: node.mtime.secs,
            atime_secs: node.atime.secs,
            mtime_nanos: node.mtime.nanos,
            atime_nanos: node.atime.nanos,
            mode: node.mode,
            uid: node.uid,
            gid: node.gid,
            kind,
            sparse: node.sparse,
            rare,
        };
        Ok((item, node.subtree))
    }

    pub fn kind(&self) -> NodeKind {
        self.kind
    }

    pub fn mtime(&self) -> Timestamp {
        Timestamp {
            secs: self.mtime_secs,
            nanos: self.mtime_nanos,
        }
    }

    pub fn atime(&self) -> Timestamp {
        Timestamp {
            secs: self.atime_secs,
            nanos: self.atime_nanos,
        }
    }

    /// Symlink: raw target bytes.
    pub fn target(&self) -> &[u8] {
        self.rare.as_ref().map_or(&[], |r| &r.target)
    }

    /// Extended attributes, sorted by name.
    pub fn xattrs(&self) -> &[(Vec<u8>, Vec<u8>)] {
        self.rare.as_ref().map_or(&[], |r| &r.xattrs)
    }

    /// Device number of a character or block device.
    pub fn rdev(&self) -> u64 {
        self.rare.as_ref().map_or(0, |r| r.rdev)
    }

    /// When the file was created at the source (macOS).
    pub fn btime(&self) -> Option<Timestamp> {
        self.rare.as_ref().and_then(|r| r.btime)
    }

    /// BSD file flags at the source (macOS).
    pub fn file_flags(&self) -> Option<u32> {
        self.rare.as_ref().and_then(|r| r.file_flags)
    }

    /// `(device, inode)` at the source of a file with several links, which
    /// restore links together within one snapshot.
    pub fn hard_link(&self) -> Option<(u64, u64)> {
        self.rare.as_ref().and_then(|r| r.link)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_item_is_small_and_keeps_every_field_restore_uses() {
        // The per-entry figure DESIGN.md quotes.
        assert!(
            std::mem::size_of::<Item>() <= 72,
            "{}",
            std::mem::size_of::<Item>()
        );
        let mut arena = Arena::default();
        let node = Node {
            name: b"a".to_vec(),
            kind: Some(NodeKind::File),
            mode: 0o4755,
            uid: 7,
            gid: 8,
            mtime: Timestamp { secs: -5, nanos: 9 },
            atime: Timestamp { secs: 6, nanos: 10 },
            size: 3,
            device: 11,
            inode: 12,
            nlink: 2,
            content: vec![BlobId(capsule_format::Id([1; 32]))],
            xattrs: vec![(b"user.k".to_vec(), b"v".to_vec())],
            sparse: true,
            ..Default::default()
        };
        let (it, sub) = Item::new(node.clone(), &mut arena).unwrap();
        assert_eq!(sub, None);
        assert_eq!(arena.name(&it), b"a");
        assert_eq!(it.kind(), NodeKind::File);
        assert_eq!(
            (it.mode, it.uid, it.gid, it.size, it.sparse),
            (0o4755, 7, 8, 3, true)
        );
        assert_eq!((it.mtime(), it.atime()), (node.mtime, node.atime));
        assert_eq!(arena.content(&it), &node.content[..]);
        assert_eq!(it.xattrs(), &node.xattrs[..]);
        assert_eq!(it.hard_link(), Some((11, 12)));
        // A plain file carries nothing rare, and a single link is no link.
        let (plain, _) = Item::new(
            Node {
                nlink: 1,
                name: b"bc".to_vec(),
                content: vec![
                    BlobId(capsule_format::Id([3; 32])),
                    BlobId(capsule_format::Id([4; 32])),
                ],
                xattrs: vec![],
                ..node
            },
            &mut arena,
        )
        .unwrap();
        assert!(plain.rare.is_none());
        assert_eq!(plain.hard_link(), None);
        // Each item finds its own parts after others were appended.
        assert_eq!(
            (arena.name(&it), arena.name(&plain)),
            (&b"a"[..], &b"bc"[..])
        );
        assert_eq!(arena.content(&it), &[BlobId(capsule_format::Id([1; 32]))]);
        assert_eq!(
            arena.content(&plain),
            &[
                BlobId(capsule_format::Id([3; 32])),
                BlobId(capsule_format::Id([4; 32]))
            ]
        );
        let (link, _) = Item::new(
            Node {
                kind: Some(NodeKind::Symlink),
                target: b"../x".to_vec(),
                ..Default::default()
            },
            &mut arena,
        )
        .unwrap();
        assert_eq!(link.target(), b"../x");
        let (dir, sub) = Item::new(
            Node {
                kind: Some(NodeKind::Dir),
                subtree: Some(BlobId(capsule_format::Id([2; 32]))),
                ..Default::default()
            },
            &mut arena,
        )
        .unwrap();
        assert_eq!(
            (dir.kind(), sub),
            (NodeKind::Dir, Some(BlobId(capsule_format::Id([2; 32]))))
        );
    }
}
