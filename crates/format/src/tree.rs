//! Directory trees: one blob per directory, listing its entries sorted by name
//! bytes. Names are raw bytes (Unix names need not be UTF-8).
//!
//! Decoding enforces the invariants restore relies on for safety: every name
//! is a single, non-empty path component other than `.` and `..`, without
//! `/` or NUL, and names are strictly increasing (so no duplicates).

use crate::codec::{DecodeError, Reader, Writer};
use crate::id::{BlobId, Id};

/// Version 1: no node carries a birth time or file flags. Version 2: a
/// node may (flag bits 1 and 2). A tree is written as version 1 whenever
/// it can be, so trees made where neither exists (Linux) are the same
/// bytes, and the same blobs, as before, and older readers read them.
const TREE_VERSION: u8 = 1;
const TREE_VERSION_MAC: u8 = 2;

/// Seconds and nanoseconds since the Unix epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, PartialOrd, Ord, Hash)]
pub struct Timestamp {
    /// Whole seconds (may be negative).
    pub secs: i64,
    /// Nanoseconds, below 1e9.
    pub nanos: u32,
}

/// What a node is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum NodeKind {
    /// Regular file; content is a list of data blobs.
    File,
    /// Directory; content is a subtree blob.
    Dir,
    /// Symbolic link; content is the raw target bytes.
    Symlink,
    /// Named pipe.
    Fifo,
    /// Character device (`rdev`).
    CharDev,
    /// Block device (`rdev`).
    BlockDev,
    /// Unix socket (recorded, restored as nothing: sockets cannot be recreated).
    Socket,
}

impl NodeKind {
    fn to_byte(self) -> u8 {
        match self {
            NodeKind::File => 0,
            NodeKind::Dir => 1,
            NodeKind::Symlink => 2,
            NodeKind::Fifo => 3,
            NodeKind::CharDev => 4,
            NodeKind::BlockDev => 5,
            NodeKind::Socket => 6,
        }
    }
    fn from_byte(b: u8) -> Result<Self, DecodeError> {
        Ok(match b {
            0 => NodeKind::File,
            1 => NodeKind::Dir,
            2 => NodeKind::Symlink,
            3 => NodeKind::Fifo,
            4 => NodeKind::CharDev,
            5 => NodeKind::BlockDev,
            6 => NodeKind::Socket,
            v => {
                return Err(DecodeError::BadValue {
                    what: "node kind",
                    value: v as u64,
                })
            }
        })
    }
    /// Short lower-case name for listings and JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            NodeKind::File => "file",
            NodeKind::Dir => "dir",
            NodeKind::Symlink => "symlink",
            NodeKind::Fifo => "fifo",
            NodeKind::CharDev => "chardev",
            NodeKind::BlockDev => "blockdev",
            NodeKind::Socket => "socket",
        }
    }
}

/// One directory entry with its metadata and a reference to its content.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Node {
    /// File name: one path component, raw bytes.
    pub name: Vec<u8>,
    /// Kind, and with it which content field is meaningful.
    pub kind: Option<NodeKind>,
    /// Permission bits including setuid/setgid/sticky (`st_mode & 0o7777`).
    pub mode: u32,
    /// Owner.
    pub uid: u32,
    /// Group.
    pub gid: u32,
    /// Content modification time.
    pub mtime: Timestamp,
    /// Access time.
    pub atime: Timestamp,
    /// Inode change time; never restored, used to detect changes.
    pub ctime: Timestamp,
    /// Size in bytes (files: content length; symlinks: target length).
    pub size: u64,
    /// Device of the source file system; change detection and hard links.
    pub device: u64,
    /// Inode number on the source; change detection and hard links.
    pub inode: u64,
    /// Hard link count on the source; `> 1` makes restore link equal
    /// `(device, inode)` pairs within one snapshot.
    pub nlink: u64,
    /// Device number for character and block devices.
    pub rdev: u64,
    /// File: data blobs in order. Empty for empty files.
    pub content: Vec<BlobId>,
    /// Dir: the subtree blob.
    pub subtree: Option<BlobId>,
    /// Symlink: raw target bytes.
    pub target: Vec<u8>,
    /// Extended attributes, sorted by name.
    pub xattrs: Vec<(Vec<u8>, Vec<u8>)>,
    /// The source file had holes; restore keeps zero blocks as holes.
    pub sparse: bool,
    /// When the file was created (macOS `st_birthtime`); restored there.
    pub btime: Option<Timestamp>,
    /// BSD file flags (macOS `st_flags`: `UF_HIDDEN`, `UF_NODUMP`,
    /// `UF_IMMUTABLE`…), where any is set; restored there.
    pub file_flags: Option<u32>,
}

impl Node {
    /// The node's kind; decoded nodes always have one.
    pub fn kind(&self) -> NodeKind {
        self.kind.unwrap_or(NodeKind::File)
    }
}

/// Checks that `name` is a single safe path component.
pub fn validate_name(name: &[u8]) -> Result<(), DecodeError> {
    if name.is_empty() || name == b"." || name == b".." || name.contains(&b'/') || name.contains(&0)
    {
        return Err(DecodeError::Invalid(format!(
            "unsafe entry name {:?}",
            String::from_utf8_lossy(name)
        )));
    }
    Ok(())
}

const FLAG_SPARSE: u8 = 1;
const FLAG_BTIME: u8 = 2;
const FLAG_FILE_FLAGS: u8 = 4;

/// Encodes a directory. `nodes` must already be sorted by name.
pub fn encode_tree(nodes: &[Node]) -> Vec<u8> {
    let mut w = Writer::with_capacity(64 + nodes.len() * 96);
    let mac = nodes
        .iter()
        .any(|n| n.btime.is_some() || n.file_flags.is_some());
    w.u8(if mac { TREE_VERSION_MAC } else { TREE_VERSION });
    w.varint(nodes.len() as u64);
    for n in nodes {
        encode_node(&mut w, n);
    }
    w.buf
}

fn ts(w: &mut Writer, t: Timestamp) {
    w.svarint(t.secs);
    w.varint(t.nanos as u64);
}

fn encode_node(w: &mut Writer, n: &Node) {
    let kind = n.kind();
    w.bytes(&n.name);
    w.u8(kind.to_byte());
    let mut flags = 0;
    for (set, bit) in [
        (n.sparse, FLAG_SPARSE),
        (n.btime.is_some(), FLAG_BTIME),
        (n.file_flags.is_some(), FLAG_FILE_FLAGS),
    ] {
        if set {
            flags |= bit;
        }
    }
    w.u8(flags);
    w.varint(n.mode as u64);
    w.varint(n.uid as u64);
    w.varint(n.gid as u64);
    ts(w, n.mtime);
    ts(w, n.atime);
    ts(w, n.ctime);
    w.varint(n.size);
    w.varint(n.device);
    w.varint(n.inode);
    w.varint(n.nlink);
    match kind {
        NodeKind::File => {
            w.varint(n.content.len() as u64);
            for id in &n.content {
                w.raw(id.as_bytes());
            }
        }
        NodeKind::Dir => w.raw(n.subtree.unwrap_or_default().as_bytes()),
        NodeKind::Symlink => w.bytes(&n.target),
        NodeKind::CharDev | NodeKind::BlockDev => w.varint(n.rdev),
        NodeKind::Fifo | NodeKind::Socket => {}
    }
    w.varint(n.xattrs.len() as u64);
    for (k, v) in &n.xattrs {
        w.bytes(k);
        w.bytes(v);
    }
    if let Some(t) = n.btime {
        ts(w, t);
    }
    if let Some(f) = n.file_flags {
        w.varint(u64::from(f));
    }
}

fn read_ts(r: &mut Reader<'_>, what: &'static str) -> Result<Timestamp, DecodeError> {
    let secs = r.svarint(what)?;
    let nanos = r.varint_u32(what)?;
    if nanos >= 1_000_000_000 {
        return Err(DecodeError::BadValue {
            what,
            value: nanos as u64,
        });
    }
    Ok(Timestamp { secs, nanos })
}

/// Decodes and validates a directory tree.
pub fn decode_tree(bytes: &[u8]) -> Result<Vec<Node>, DecodeError> {
    let mut r = Reader::new(bytes);
    let version = r.u8("tree version")?;
    if version != TREE_VERSION && version != TREE_VERSION_MAC {
        return Err(DecodeError::BadHeader("unknown tree version"));
    }
    // The smallest node encodes in well over 16 bytes.
    let count = r.count("tree entry count", 16)?;
    let mut nodes: Vec<Node> = Vec::with_capacity(count);
    for _ in 0..count {
        let n = decode_node(&mut r, version)?;
        if let Some(prev) = nodes.last() {
            if prev.name >= n.name {
                return Err(DecodeError::Invalid(format!(
                    "entries not strictly sorted at {:?}",
                    String::from_utf8_lossy(&n.name)
                )));
            }
        }
        nodes.push(n);
    }
    r.finish()?;
    Ok(nodes)
}

fn decode_node(r: &mut Reader<'_>, version: u8) -> Result<Node, DecodeError> {
    let name = r.bytes("entry name")?.to_vec();
    validate_name(&name)?;
    let kind = NodeKind::from_byte(r.u8("node kind")?)?;
    let flags = r.u8("node flags")?;
    let known = if version == TREE_VERSION {
        FLAG_SPARSE
    } else {
        FLAG_SPARSE | FLAG_BTIME | FLAG_FILE_FLAGS
    };
    if flags & !known != 0 {
        return Err(DecodeError::BadValue {
            what: "node flags",
            value: flags as u64,
        });
    }
    let mut n = Node {
        name,
        kind: Some(kind),
        sparse: flags & FLAG_SPARSE != 0,
        mode: r.varint_u32("mode")?,
        uid: r.varint_u32("uid")?,
        gid: r.varint_u32("gid")?,
        mtime: read_ts(r, "mtime")?,
        atime: read_ts(r, "atime")?,
        ctime: read_ts(r, "ctime")?,
        size: r.varint("size")?,
        device: r.varint("device")?,
        inode: r.varint("inode")?,
        nlink: r.varint("nlink")?,
        ..Node::default()
    };
    match kind {
        NodeKind::File => {
            let c = r.count("content blob count", 32)?;
            n.content.reserve_exact(c);
            for _ in 0..c {
                n.content.push(BlobId(Id(r.id("content blob id")?)));
            }
        }
        NodeKind::Dir => n.subtree = Some(BlobId(Id(r.id("subtree id")?))),
        NodeKind::Symlink => n.target = r.bytes("symlink target")?.to_vec(),
        NodeKind::CharDev | NodeKind::BlockDev => n.rdev = r.varint("rdev")?,
        NodeKind::Fifo | NodeKind::Socket => {}
    }
    let xc = r.count("xattr count", 2)?;
    for _ in 0..xc {
        let k = r.bytes("xattr name")?.to_vec();
        let v = r.bytes("xattr value")?.to_vec();
        n.xattrs.push((k, v));
    }
    if flags & FLAG_BTIME != 0 {
        n.btime = Some(read_ts(r, "btime")?);
    }
    if flags & FLAG_FILE_FLAGS != 0 {
        n.file_flags = Some(r.varint_u32("file flags")?);
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn sample() -> Vec<Node> {
        vec![
            Node {
                name: b"a\xff".to_vec(),
                kind: Some(NodeKind::File),
                mode: 0o644,
                uid: 1000,
                gid: 1000,
                mtime: Timestamp {
                    secs: 1_700_000_000,
                    nanos: 123_456_789,
                },
                atime: Timestamp { secs: -5, nanos: 0 },
                ctime: Timestamp {
                    secs: 1_700_000_001,
                    nanos: 1,
                },
                size: 3,
                device: 2049,
                inode: 42,
                nlink: 1,
                content: vec![BlobId(Id([7u8; 32]))],
                xattrs: vec![(b"user.k".to_vec(), b"v".to_vec())],
                ..Node::default()
            },
            Node {
                name: b"b".to_vec(),
                kind: Some(NodeKind::Dir),
                mode: 0o755,
                subtree: Some(BlobId(Id([9u8; 32]))),
                ..Node::default()
            },
            Node {
                name: b"c".to_vec(),
                kind: Some(NodeKind::Symlink),
                mode: 0o777,
                target: b"../x".to_vec(),
                size: 4,
                ..Node::default()
            },
        ]
    }

    #[test]
    fn roundtrip() {
        let nodes = sample();
        let enc = encode_tree(&nodes);
        assert_eq!(decode_tree(&enc).unwrap(), nodes);
    }

    /// Test vector from docs/FORMAT.md ("Tree encoding").
    #[test]
    fn tree_vector() {
        let nodes = vec![Node {
            name: b"hi".to_vec(),
            kind: Some(NodeKind::Symlink),
            mode: 0o777,
            uid: 0,
            gid: 0,
            mtime: Timestamp { secs: 1, nanos: 2 },
            size: 1,
            nlink: 1,
            target: b"x".to_vec(),
            ..Node::default()
        }];
        assert_eq!(
            hex::encode(encode_tree(&nodes)),
            "01010268690200ff03000002020000000001000001017800"
        );
    }

    /// Test vector from docs/FORMAT.md: the same node with a birth time
    /// and file flags (a version 2 tree); and a version 1 tree still reads.
    #[test]
    fn tree_vector_with_birth_time_and_flags() {
        let mut node = Node {
            name: b"hi".to_vec(),
            kind: Some(NodeKind::Symlink),
            mode: 0o777,
            mtime: Timestamp { secs: 1, nanos: 2 },
            size: 1,
            nlink: 1,
            target: b"x".to_vec(),
            ..Node::default()
        };
        let v1 = hex::decode("01010268690200ff03000002020000000001000001017800").unwrap();
        assert_eq!(decode_tree(&v1).unwrap(), vec![node.clone()]);
        node.btime = Some(Timestamp { secs: -1, nanos: 5 });
        node.file_flags = Some(0x8000); // UF_HIDDEN
        let enc = encode_tree(std::slice::from_ref(&node));
        assert_eq!(
            hex::encode(&enc),
            "02010268690206ff030000020200000000010000010178000105808002"
        );
        assert_eq!(decode_tree(&enc).unwrap(), vec![node]);
        // A version 1 tree may not carry the new bits.
        let mut bad = v1.clone();
        bad[6] = 0x02;
        assert!(decode_tree(&bad).is_err());
    }

    #[test]
    fn rejects_unsafe_and_unsorted() {
        for bad in [&b".."[..], b".", b"", b"a/b", b"a\0"] {
            let mut n = sample();
            n[0].name = bad.to_vec();
            assert!(decode_tree(&encode_tree(&n)).is_err(), "{bad:?}");
        }
        let mut n = sample();
        n.swap(0, 1);
        assert!(decode_tree(&encode_tree(&n)).is_err());
        let mut n = sample();
        n[1].name = n[0].name.clone();
        assert!(decode_tree(&encode_tree(&n)).is_err());
    }

    proptest! {
        #[test]
        fn decode_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
            let _ = decode_tree(&bytes);
        }

        #[test]
        fn truncation_is_detected(cut in 0usize..200) {
            let enc = encode_tree(&sample());
            let cut = cut.min(enc.len() - 1);
            prop_assert!(decode_tree(&enc[..cut]).is_err());
        }
    }
}
