//! A stored file's bytes, or a stored directory as a tar stream, written
//! to any writer (standard output, a file, a web response) as it is read
//! from the repository: `capsule dump` and the page's downloads.
//!
//! Memory stays bounded whatever the size: a file is read a MiB at a time
//! through the browser's read-ahead, and a directory is walked one tree at
//! a time (its files' blobs fetched ahead in pack order, as a restore
//! reads them).

use std::io::{Read, Write};
use std::path::Path;
use std::sync::Arc;

use capsule_format::tree::{Node, NodeKind};
use capsule_format::BlobId;

use crate::browse::{Browser, FileMap};

/// Trees nested deeper than this are damage, not a directory layout.
const MAX_DEPTH: usize = 512;

/// A stored file's content as a reader, fetched a MiB at a time with the
/// browser's read-ahead.
pub struct Content {
    b: Arc<Browser>,
    map: FileMap,
    at: u64,
    buf: Vec<u8>,
    pos: usize,
}

impl Content {
    /// Reads file `node` through `b`. A blob no index lists is an error
    /// here, before a byte is written.
    pub fn new(b: &Arc<Browser>, node: &Node) -> std::io::Result<Self> {
        Ok(Content {
            map: b.file_map(node).map_err(std::io::Error::other)?,
            b: b.clone(),
            at: 0,
            buf: Vec::new(),
            pos: 0,
        })
    }

    /// The file's size as its blobs make it up.
    pub fn size(&self) -> u64 {
        self.map.size()
    }
}

impl Read for Content {
    fn read(&mut self, out: &mut [u8]) -> std::io::Result<usize> {
        if self.pos == self.buf.len() {
            if self.at >= self.map.size() {
                return Ok(0);
            }
            self.buf = self
                .b
                .read_at(&self.map, self.at, 1 << 20, true)
                .map_err(std::io::Error::other)?;
            self.pos = 0;
            self.at += self.buf.len() as u64;
            if self.buf.is_empty() {
                return Ok(0);
            }
        }
        let n = out.len().min(self.buf.len() - self.pos);
        out[..n].copy_from_slice(&self.buf[self.pos..self.pos + n]);
        self.pos += n;
        Ok(n)
    }
}

/// What a dump wrote.
#[derive(Debug, Clone, Copy, Default, serde::Serialize)]
pub struct Dumped {
    /// Regular files written.
    pub files: u64,
    /// Directories written.
    pub dirs: u64,
    /// Symbolic links and hard-link-free others written.
    pub others: u64,
    /// Entries the archive cannot carry as what they are (sockets; in a
    /// zip also FIFOs and devices), left out.
    pub skipped: u64,
    /// Bytes of file content written.
    pub bytes: u64,
}

/// Writes file `node`'s content to `w`; the bytes written.
pub fn copy_file(b: &Arc<Browser>, node: &Node, w: &mut dyn Write) -> std::io::Result<u64> {
    let mut c = Content::new(b, node)?;
    let n = std::io::copy(&mut c, w)?;
    if n != node.size {
        // The blobs make up another size than the snapshot recorded: the
        // reader must not take a short file for the whole one.
        return Err(std::io::Error::other(format!(
            "the stored file has {n} bytes, but the snapshot recorded {}",
            node.size
        )));
    }
    Ok(n)
}

/// Writes directory tree `tree` as a tar stream under the name `top`
/// (and `top_node`'s own entry first, when given):
/// entries as stored (modes, owners, times, symlinks, FIFOs and devices),
/// names byte for byte, then the archive's end.
pub fn write_tar(
    b: &Arc<Browser>,
    tree: Option<&BlobId>,
    top: &Path,
    top_node: Option<&Node>,
    w: &mut dyn Write,
) -> std::io::Result<Dumped> {
    let mut t = tar::Builder::new(w);
    t.mode(tar::HeaderMode::Complete);
    t.follow_symlinks(false);
    let mut done = Dumped::default();
    if let Some(n) = top_node {
        let mut h = header(n);
        h.set_entry_type(tar::EntryType::Directory);
        h.set_size(0);
        t.append_data(&mut h, top, std::io::empty())?;
        done.dirs += 1;
    }
    // An empty directory may be stored without a tree.
    if let Some(tree) = tree {
        add_tree(b, tree, top, &mut t, 0, &mut done)?;
    }
    t.finish()?;
    Ok(done)
}

/// A tar header with `n`'s mode, owners and modification time.
fn header(n: &Node) -> tar::Header {
    let mut h = tar::Header::new_gnu();
    h.set_mode(n.mode & 0o7777);
    h.set_uid(u64::from(n.uid));
    h.set_gid(u64::from(n.gid));
    h.set_mtime(n.mtime.secs.max(0) as u64);
    h
}

fn add_tree(
    b: &Arc<Browser>,
    tree: &BlobId,
    at: &Path,
    t: &mut tar::Builder<&mut dyn Write>,
    depth: usize,
    done: &mut Dumped,
) -> std::io::Result<()> {
    use std::os::unix::ffi::OsStrExt;
    if depth > MAX_DEPTH {
        return Err(std::io::Error::other(format!(
            "{}: trees nested over {MAX_DEPTH} deep: the repository is damaged",
            at.display()
        )));
    }
    let nodes = b.tree(tree).map_err(std::io::Error::other)?;
    // This directory's files, fetched ahead in the order their blobs lie
    // in packs: on a remote store that is a few ranged reads, not one
    // round trip per file.
    let files: Vec<Node> = nodes
        .iter()
        .filter(|n| n.kind() == NodeKind::File)
        .cloned()
        .collect();
    b.prefetch(&files);
    for n in nodes.iter() {
        // Names as stored, bytes and all: tar carries any name.
        let p = at.join(std::ffi::OsStr::from_bytes(&n.name));
        let mut h = header(n);
        match n.kind() {
            NodeKind::Dir => {
                h.set_entry_type(tar::EntryType::Directory);
                h.set_size(0);
                t.append_data(&mut h, &p, std::io::empty())?;
                done.dirs += 1;
                if let Some(sub) = &n.subtree {
                    add_tree(b, sub, &p, t, depth + 1, done)?;
                }
            }
            NodeKind::File => {
                h.set_entry_type(tar::EntryType::Regular);
                h.set_size(n.size);
                let c = Content::new(b, n)?;
                if c.size() != n.size {
                    return Err(std::io::Error::other(format!(
                        "{}: the stored file has {} bytes, but the snapshot recorded {}",
                        p.display(),
                        c.size(),
                        n.size
                    )));
                }
                t.append_data(&mut h, &p, c)?;
                done.files += 1;
                done.bytes += n.size;
            }
            NodeKind::Symlink => {
                h.set_entry_type(tar::EntryType::Symlink);
                h.set_size(0);
                t.append_link(&mut h, &p, std::ffi::OsStr::from_bytes(&n.target))?;
                done.others += 1;
            }
            kind @ (NodeKind::Fifo | NodeKind::CharDev | NodeKind::BlockDev) => {
                h.set_entry_type(match kind {
                    NodeKind::Fifo => tar::EntryType::Fifo,
                    NodeKind::CharDev => tar::EntryType::Char,
                    _ => tar::EntryType::Block,
                });
                h.set_size(0);
                let (major, minor) = (
                    rustix::fs::major(n.rdev as _),
                    rustix::fs::minor(n.rdev as _),
                );
                h.set_device_major(major)?;
                h.set_device_minor(minor)?;
                t.append_data(&mut h, &p, std::io::empty())?;
                done.others += 1;
            }
            // A socket is made by the program that listens on it; tar has
            // no entry for one.
            _ => done.skipped += 1,
        }
    }
    Ok(())
}

/// Writes directory tree `tree` as a zip stream under the name `top`:
/// files deflated, directories and symlinks as entries, permissions and
/// modification times (to the two seconds zip keeps, in local time, as zip
/// tools read them). Zip has no owners, FIFOs or devices (left out and
/// counted), and names that are not UTF-8 are stored as shown. Written
/// without seeking (sizes follow each file), so standard output will do.
pub fn write_zip(
    b: &Arc<Browser>,
    tree: Option<&BlobId>,
    top: &Path,
    top_node: Option<&Node>,
    w: &mut dyn Write,
) -> std::io::Result<Dumped> {
    let mut z = zip::ZipWriter::new_stream(w);
    let mut done = Dumped::default();
    let tz = jiff::tz::TimeZone::try_system().unwrap_or(jiff::tz::TimeZone::UTC);
    let name = top.to_string_lossy().into_owned();
    let o = top_node.map_or_else(zip::write::SimpleFileOptions::default, |n| {
        zip_options(n, &tz)
    });
    z.add_directory(name.clone(), o)
        .map_err(std::io::Error::other)?;
    done.dirs += 1;
    if let Some(tree) = tree {
        add_zip(b, tree, &name, &mut z, 0, &mut done, &tz)?;
    }
    z.finish().map_err(std::io::Error::other)?;
    Ok(done)
}

type Zip<'a> = zip::ZipWriter<zip::write::StreamWriter<&'a mut dyn Write>>;

fn zip_options(n: &Node, tz: &jiff::tz::TimeZone) -> zip::write::SimpleFileOptions {
    let mut o = zip::write::SimpleFileOptions::default()
        .unix_permissions(n.mode & 0o7777)
        .large_file(n.size >= u64::from(u32::MAX));
    let t = jiff::Timestamp::from_second(n.mtime.secs)
        .ok()
        .map(|ts| ts.to_zoned(tz.clone()).datetime());
    if let Some(d) = t.and_then(|d| {
        zip::DateTime::from_date_and_time(
            u16::try_from(d.year()).ok()?,
            d.month() as u8,
            d.day() as u8,
            d.hour() as u8,
            d.minute() as u8,
            d.second() as u8,
        )
        .ok()
    }) {
        o = o.last_modified_time(d);
    }
    o
}

fn add_zip(
    b: &Arc<Browser>,
    tree: &BlobId,
    at: &str,
    z: &mut Zip<'_>,
    depth: usize,
    done: &mut Dumped,
    tz: &jiff::tz::TimeZone,
) -> std::io::Result<()> {
    if depth > MAX_DEPTH {
        return Err(std::io::Error::other(format!(
            "{at}: trees nested over {MAX_DEPTH} deep: the repository is damaged"
        )));
    }
    let nodes = b.tree(tree).map_err(std::io::Error::other)?;
    let files: Vec<Node> = nodes
        .iter()
        .filter(|n| n.kind() == NodeKind::File)
        .cloned()
        .collect();
    b.prefetch(&files);
    for n in nodes.iter() {
        let p = format!("{at}/{}", String::from_utf8_lossy(&n.name));
        let o = zip_options(n, tz);
        match n.kind() {
            NodeKind::Dir => {
                z.add_directory(p.clone(), o)
                    .map_err(std::io::Error::other)?;
                done.dirs += 1;
                if let Some(sub) = &n.subtree {
                    add_zip(b, sub, &p, z, depth + 1, done, tz)?;
                }
            }
            NodeKind::File => {
                let o = o.compression_method(zip::CompressionMethod::Deflated);
                z.start_file(p.clone(), o).map_err(std::io::Error::other)?;
                let written = std::io::copy(&mut Content::new(b, n)?, z)?;
                if written != n.size {
                    return Err(std::io::Error::other(format!(
                        "{p}: the stored file has {written} bytes, but the snapshot recorded {}",
                        n.size
                    )));
                }
                done.files += 1;
                done.bytes += n.size;
            }
            NodeKind::Symlink => {
                let target = String::from_utf8_lossy(&n.target).into_owned();
                z.add_symlink(p, target, o).map_err(std::io::Error::other)?;
                done.others += 1;
            }
            _ => done.skipped += 1,
        }
    }
    Ok(())
}
