//! One index table: the blobs of some index files, sorted by blob ID, in a
//! local file that is read a page at a time (docs/FORMAT.md, "Index
//! tables"). Only the table's footer is held in memory: which index files
//! it covers, its packs, the first key of each page (the fences, about 0.1
//! byte per blob) and a filter (1.25 bytes per blob) that answers most
//! lookups of a blob the table lacks without reading a page. A lookup
//! reads one page, rarely two.
//!
//! Tables are a cache of what the repository's index files say: they are
//! never uploaded, and are rebuilt from the index files when missing or
//! damaged. Every page and the footer carry a MAC keyed from the
//! repository key, so neither a damaged disk nor a table planted by
//! another local user is believed.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use capsule_format::{BlobId, BlobType, Id, ObjectId};

/// Bytes in a page.
pub(crate) const PAGE: usize = 4096;
/// Bytes in an entry: blob ID, pack slot (top bit: tree), offset, stored
/// length, plaintext length.
const ENTRY: usize = 48;
/// Entries in a full page.
pub(crate) const PER_PAGE: usize = 84;
/// Where a page's entry count is.
const COUNT_AT: usize = PER_PAGE * ENTRY;
/// Where a page's MAC is: the last 32 bytes.
const MAC_AT: usize = PAGE - 32;
/// The footer's first bytes.
/// Version 2 added the filter; a version-1 table is rebuilt.
const MAGIC: &[u8; 16] = b"capsule-itable\x00\x02";
/// The magic of tables before the filter.
const MAGIC_V1: &[u8; 16] = b"capsule-itable\x00\x01";
/// The last bytes of a table: footer offset, footer length, footer MAC,
/// magic.
const TAIL: usize = 8 + 8 + 32 + 16;
/// The top bit of a slot marks a tree blob.
const TREE_BIT: u32 = 1 << 31;
/// The most packs or files a footer may claim (a damaged count must not
/// allocate gigabytes before its MAC is checked).
const MAX_FOOTER: u64 = 1 << 30;

/// Filter bits per entry: with [`PROBES`] bits set in one 512-bit block,
/// about 1 % of lookups of a blob a table lacks read a page anyway.
const FILTER_BITS_PER_ENTRY: u64 = 10;
/// Bits set (and tested) per blob.
const PROBES: usize = 6;
/// Bytes in a filter block (a cache line): every probe of a blob falls in
/// one block.
const BLOCK: usize = 64;

/// A blocked Bloom filter over blob IDs. The IDs are keyed hashes, so
/// their bytes serve as the hash: bytes 8–16 choose the block (bytes 0–8
/// are the fences'), bytes 16–24 the bits in it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Filter {
    blocks: Vec<[u8; BLOCK]>,
}

impl Filter {
    fn for_entries(entries: u64) -> Filter {
        let n = (entries.saturating_mul(FILTER_BITS_PER_ENTRY)).div_ceil(BLOCK as u64 * 8);
        Filter {
            blocks: vec![[0u8; BLOCK]; n.max(1) as usize],
        }
    }

    fn probes(&self, id: &BlobId) -> (usize, [u16; PROBES]) {
        let b = &id.0 .0;
        let h = u64::from_le_bytes([b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]]);
        let block = ((u128::from(h) * self.blocks.len() as u128) >> 64) as usize;
        let g = u64::from_le_bytes([b[16], b[17], b[18], b[19], b[20], b[21], b[22], b[23]]);
        let mut bits = [0u16; PROBES];
        for (i, bit) in bits.iter_mut().enumerate() {
            *bit = ((g >> (9 * i)) & 511) as u16;
        }
        (block, bits)
    }

    fn insert(&mut self, id: &BlobId) {
        let (block, bits) = self.probes(id);
        for bit in bits {
            self.blocks[block][bit as usize / 8] |= 1 << (bit % 8);
        }
    }

    fn may_contain(&self, id: &BlobId) -> bool {
        let (block, bits) = self.probes(id);
        bits.iter()
            .all(|&bit| self.blocks[block][bit as usize / 8] & (1 << (bit % 8)) != 0)
    }
}

/// A table that cannot be used: the caller rebuilds it.
#[derive(Debug, thiserror::Error)]
pub enum TableError {
    /// Reading or writing the file failed.
    #[error("{path}: {source}")]
    Io {
        /// The table.
        path: PathBuf,
        /// What failed.
        source: std::io::Error,
    },
    /// The bytes are not what this repository's key wrote.
    #[error("{path}: {what}")]
    Damaged {
        /// The table.
        path: PathBuf,
        /// Which part fails.
        what: String,
    },
    /// Written by an earlier version, without the filter: rebuilt, as a
    /// cache is, and not worth a warning.
    #[error("{path}: an older table version")]
    Older {
        /// The table.
        path: PathBuf,
    },
}

/// One blob's row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Entry {
    pub id: BlobId,
    /// Position of the pack in the table's pack list.
    pub slot: u32,
    pub blob_type: BlobType,
    pub offset: u32,
    pub length: u32,
    pub raw_length: u32,
}

impl Entry {
    fn encode(&self, out: &mut [u8]) {
        out[..32].copy_from_slice(&self.id.0 .0);
        let slot = self.slot
            | match self.blob_type {
                BlobType::Tree => TREE_BIT,
                BlobType::Data => 0,
            };
        out[32..36].copy_from_slice(&slot.to_le_bytes());
        out[36..40].copy_from_slice(&self.offset.to_le_bytes());
        out[40..44].copy_from_slice(&self.length.to_le_bytes());
        out[44..48].copy_from_slice(&self.raw_length.to_le_bytes());
    }

    fn decode(b: &[u8]) -> Entry {
        let u = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        let mut id = [0u8; 32];
        id.copy_from_slice(&b[..32]);
        let slot = u(32);
        Entry {
            id: BlobId(Id(id)),
            slot: slot & !TREE_BIT,
            blob_type: if slot & TREE_BIT != 0 {
                BlobType::Tree
            } else {
                BlobType::Data
            },
            offset: u(36),
            length: u(40),
            raw_length: u(44),
        }
    }
}

/// An index file a table covers, and what it supersedes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct FileMeta {
    pub id: ObjectId,
    pub supersedes: Vec<ObjectId>,
}

/// A pack of a table: listed by one of its files.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct TablePack {
    pub id: ObjectId,
    pub size: u64,
    pub blob_type: BlobType,
    /// Position of the listing file in the table's file list.
    pub file: u32,
}

/// The first 8 bytes of a blob ID, as a number: the fences compare these.
fn prefix(id: &BlobId) -> u64 {
    let mut b = [0u8; 8];
    b.copy_from_slice(&id.0 .0[..8]);
    u64::from_be_bytes(b)
}

/// The name of the table covering exactly `files`, keyed so that two
/// repositories' tables never share a name.
pub(crate) fn table_id(key: &[u8; 32], files: &[FileMeta]) -> [u8; 32] {
    let mut ids: Vec<&ObjectId> = files.iter().map(|f| &f.id).collect();
    ids.sort();
    let mut h = blake3::Hasher::new_keyed(key);
    h.update(b"table");
    for id in ids {
        h.update(id.as_bytes());
    }
    *h.finalize().as_bytes()
}

fn page_mac(key: &[u8; 32], table: &[u8; 32], n: u64, bytes: &[u8]) -> [u8; 32] {
    let mut h = blake3::Hasher::new_keyed(key);
    h.update(b"page");
    h.update(table);
    h.update(&n.to_le_bytes());
    h.update(bytes);
    *h.finalize().as_bytes()
}

fn footer_mac(key: &[u8; 32], footer: &[u8], at: u64) -> [u8; 32] {
    let mut h = blake3::Hasher::new_keyed(key);
    h.update(b"footer");
    h.update(&at.to_le_bytes());
    h.update(footer);
    *h.finalize().as_bytes()
}

/// The file name of a table.
pub(crate) fn file_name(id: &[u8; 32]) -> String {
    format!("{}.tbl", hex::encode(&id[..16]))
}

/// Writes a table from entries given in order (blob ID, then slot), to a
/// temporary file renamed into place when complete: a reader never sees a
/// half-written table.
pub(crate) struct Writer {
    out: BufWriter<File>,
    tmp: PathBuf,
    dir: PathBuf,
    key: [u8; 32],
    id: [u8; 32],
    files: Vec<FileMeta>,
    packs: Vec<TablePack>,
    page: Box<[u8; PAGE]>,
    in_page: usize,
    pages: u64,
    fences: Vec<u64>,
    entries: u64,
    last: Option<(BlobId, u32)>,
}

impl Writer {
    /// Starts a table over `files` and their `packs` in `dir`.
    pub fn create(
        dir: &Path,
        key: &[u8; 32],
        files: Vec<FileMeta>,
        packs: Vec<TablePack>,
    ) -> Result<Writer, TableError> {
        let id = table_id(key, &files);
        let io = |source| TableError::Io {
            path: dir.to_path_buf(),
            source,
        };
        #[cfg(test)]
        if full::is_full(dir) {
            return Err(io(std::io::Error::from_raw_os_error(libc::ENOSPC)));
        }
        let tmp = tempfile::Builder::new()
            .prefix(&format!(".tmp-{}-", std::process::id()))
            .suffix(".tbl")
            .tempfile_in(dir)
            .map_err(io)?;
        // Kept on disk until renamed or dropped (then removed).
        let (file, tmp) = tmp.keep().map_err(|e| io(e.error))?;
        Ok(Writer {
            out: BufWriter::with_capacity(64 * PAGE, file),
            tmp,
            dir: dir.to_path_buf(),
            key: *key,
            id,
            files,
            packs,
            page: Box::new([0u8; PAGE]),
            in_page: 0,
            pages: 0,
            fences: Vec::new(),
            entries: 0,
            last: None,
        })
    }

    fn io(&self, source: std::io::Error) -> TableError {
        TableError::Io {
            path: self.tmp.clone(),
            source,
        }
    }

    /// Adds one entry; entries come sorted by blob ID, then slot.
    pub fn push(&mut self, e: &Entry) -> Result<(), TableError> {
        debug_assert!(self.last.is_none_or(|l| l < (e.id, e.slot)));
        debug_assert!((e.slot as usize) < self.packs.len());
        self.last = Some((e.id, e.slot));
        if self.in_page == 0 {
            self.fences.push(prefix(&e.id));
        }
        e.encode(&mut self.page[self.in_page * ENTRY..(self.in_page + 1) * ENTRY]);
        self.in_page += 1;
        self.entries += 1;
        if self.in_page == PER_PAGE {
            self.flush_page()?;
        }
        Ok(())
    }

    fn flush_page(&mut self) -> Result<(), TableError> {
        let n = self.in_page;
        self.page[n * ENTRY..COUNT_AT].fill(0);
        self.page[COUNT_AT..COUNT_AT + 4].copy_from_slice(&(n as u32).to_le_bytes());
        self.page[COUNT_AT + 4..MAC_AT].fill(0);
        let mac = page_mac(&self.key, &self.id, self.pages, &self.page[..MAC_AT]);
        self.page[MAC_AT..].copy_from_slice(&mac);
        let r = self.out.write_all(&self.page[..]);
        r.map_err(|e| self.io(e))?;
        self.pages += 1;
        self.in_page = 0;
        Ok(())
    }

    /// Writes the footer, syncs, and renames the table into place; returns
    /// its path. A table of that name already there (another process built
    /// the same one) is the same bytes, and is replaced.
    pub fn finish(self) -> Result<PathBuf, TableError> {
        let dir = self.dir.clone();
        self.finish_to(|id| dir.join(file_name(id)))
    }

    fn finish_to(mut self, to: impl FnOnce(&[u8; 32]) -> PathBuf) -> Result<PathBuf, TableError> {
        if self.in_page > 0 {
            self.flush_page()?;
        }
        // The filter is sized by the final count, so the same entries make
        // the same bytes however the table was made: read back from the
        // pages just written (in the page cache).
        self.out.flush().map_err(|e| self.io(e))?;
        let mut filter = Filter::for_entries(self.entries);
        let mut page = vec![0u8; 64 * PAGE];
        let mut n = 0;
        while n < self.pages {
            let k = (self.pages - n).min(64);
            let buf = &mut page[..k as usize * PAGE];
            let r = self.out.get_ref().read_exact_at(buf, n * PAGE as u64);
            r.map_err(|e| self.io(e))?;
            for p in buf.chunks_exact(PAGE) {
                let c = &p[COUNT_AT..COUNT_AT + 4];
                let len = u32::from_le_bytes([c[0], c[1], c[2], c[3]]) as usize;
                for i in 0..len.min(PER_PAGE) {
                    filter.insert(&Entry::decode(&p[i * ENTRY..(i + 1) * ENTRY]).id);
                }
            }
            n += k;
        }
        let mut f = Vec::with_capacity(
            64 + self.packs.len() * 48 + self.fences.len() * 8 + filter.blocks.len() * BLOCK,
        );
        f.extend_from_slice(MAGIC);
        f.extend_from_slice(&(self.files.len() as u64).to_le_bytes());
        f.extend_from_slice(&(self.packs.len() as u64).to_le_bytes());
        f.extend_from_slice(&self.pages.to_le_bytes());
        f.extend_from_slice(&self.entries.to_le_bytes());
        f.extend_from_slice(&self.id);
        for m in &self.files {
            f.extend_from_slice(m.id.as_bytes());
            f.extend_from_slice(&(m.supersedes.len() as u64).to_le_bytes());
            for s in &m.supersedes {
                f.extend_from_slice(s.as_bytes());
            }
        }
        for p in &self.packs {
            f.extend_from_slice(p.id.as_bytes());
            f.extend_from_slice(&p.size.to_le_bytes());
            f.extend_from_slice(&p.file.to_le_bytes());
            f.extend_from_slice(&[u8::from(p.blob_type == BlobType::Tree), 0, 0, 0]);
        }
        for fence in &self.fences {
            f.extend_from_slice(&fence.to_le_bytes());
        }
        f.extend_from_slice(&(filter.blocks.len() as u64).to_le_bytes());
        for b in &filter.blocks {
            f.extend_from_slice(b);
        }
        let at = self.pages * PAGE as u64;
        let mac = footer_mac(&self.key, &f, at);
        let len = f.len() as u64;
        f.extend_from_slice(&at.to_le_bytes());
        f.extend_from_slice(&len.to_le_bytes());
        f.extend_from_slice(&mac);
        f.extend_from_slice(MAGIC);
        let r = self.out.write_all(&f).and_then(|_| self.out.flush());
        r.map_err(|e| self.io(e))?;
        let r = self.out.get_ref().sync_all();
        r.map_err(|e| self.io(e))?;
        let path = to(&self.id);
        if path != self.tmp {
            std::fs::rename(&self.tmp, &path).map_err(|e| self.io(e))?;
        }
        self.tmp = PathBuf::new();
        Ok(path)
    }

    /// As [`finish`](Self::finish), but the table stays under its
    /// temporary name: a part of a build, for a merge to take in, that no
    /// other process may take for a whole table.
    pub fn finish_unnamed(self) -> Result<PathBuf, TableError> {
        let tmp = self.tmp.clone();
        self.finish_to(|_| tmp)
    }
}

impl Drop for Writer {
    fn drop(&mut self) {
        // Unfinished (an error, a full disk): leave nothing half-written.
        if !self.tmp.as_os_str().is_empty() {
            let _ = std::fs::remove_file(&self.tmp);
        }
    }
}

/// A full disk, for tests: writes of tables into the directories named
/// here fail as on a full file system (per directory, so that tests
/// running at once do not see each other's).
#[cfg(test)]
pub(crate) mod full {
    use std::path::{Path, PathBuf};
    use std::sync::Mutex;

    static FULL: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());

    pub fn set(dir: &Path, full: bool) {
        let mut v = FULL.lock().unwrap_or_else(|p| p.into_inner());
        v.retain(|d| d != dir);
        if full {
            v.push(dir.to_path_buf());
        }
    }

    pub fn is_full(dir: &Path) -> bool {
        FULL.lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .any(|d| d == dir)
    }
}

/// Gives a table built unnamed its name, so that the next run opens it.
pub(crate) fn publish(t: &mut Table) -> Result<(), TableError> {
    let Some(dir) = t.path.parent() else {
        return Ok(());
    };
    let to = dir.join(file_name(&t.id));
    std::fs::rename(&t.path, &to).map_err(|source| TableError::Io {
        path: t.path.clone(),
        source,
    })?;
    t.path = to;
    Ok(())
}

/// An open table: its footer in memory, its pages on disk.
#[derive(Debug)]
pub(crate) struct Table {
    file: File,
    pub path: PathBuf,
    pub id: [u8; 32],
    pub files: Vec<FileMeta>,
    pub packs: Vec<TablePack>,
    fences: Vec<u64>,
    /// `None` once dropped ([`Table::drop_filter`]): every lookup reads.
    filter: std::sync::RwLock<Option<Filter>>,
    pub entries: u64,
    /// One bit a page: its MAC was checked in this process.
    verified: Vec<AtomicU64>,
    /// Pages lookups read lately, direct-mapped by page number (see
    /// [`Table::looked_up`]); empty once the filter is dropped.
    hot: std::sync::Mutex<Vec<HotPage>>,
    key: [u8; 32],
}

/// Pages a table keeps for lookups: up to 4 MiB, 86,000 entries, filled
/// as lookups land. A no-change run asks whether every unchanged file's
/// blobs are still there; in a repository of a household's size each page
/// is then read once, not once a file (53,000 `pread`s and 4 KiB copies,
/// about 0.05 s of a 0.3 s run at 53,000 files).
const HOT_PAGES: usize = 1024;

/// A kept page and its number.
type HotPage = Option<(u64, Arc<Page>)>;

/// A page read and checked: its entries.
#[derive(Debug)]
pub(crate) struct Page {
    bytes: Box<[u8; PAGE]>,
    len: usize,
}

impl Page {
    pub fn len(&self) -> usize {
        self.len
    }
    pub fn entry(&self, i: usize) -> Entry {
        Entry::decode(&self.bytes[i * ENTRY..(i + 1) * ENTRY])
    }
    fn id(&self, i: usize) -> &[u8] {
        &self.bytes[i * ENTRY..i * ENTRY + 32]
    }
}

struct Cursor<'a> {
    b: &'a [u8],
    at: usize,
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let s = self.b.get(self.at..self.at.checked_add(n)?)?;
        self.at += n;
        Some(s)
    }
    fn u64(&mut self) -> Option<u64> {
        let mut a = [0u8; 8];
        a.copy_from_slice(self.take(8)?);
        Some(u64::from_le_bytes(a))
    }
    fn id(&mut self) -> Option<ObjectId> {
        let mut a = [0u8; 32];
        a.copy_from_slice(self.take(32)?);
        Some(ObjectId(Id(a)))
    }
}

impl Table {
    /// Opens a table and checks its footer against `key`.
    pub fn open(path: &Path, key: &[u8; 32]) -> Result<Table, TableError> {
        let damaged = |what: &str| TableError::Damaged {
            path: path.to_path_buf(),
            what: what.to_string(),
        };
        let io = |source| TableError::Io {
            path: path.to_path_buf(),
            source,
        };
        let file = File::open(path).map_err(io)?;
        let size = file.metadata().map_err(io)?.len();
        if size < TAIL as u64 {
            return Err(damaged("shorter than its footer"));
        }
        let mut tail = [0u8; TAIL];
        file.read_exact_at(&mut tail, size - TAIL as u64)
            .map_err(io)?;
        if &tail[TAIL - 16..] == MAGIC_V1 {
            return Err(TableError::Older {
                path: path.to_path_buf(),
            });
        }
        if &tail[TAIL - 16..] != MAGIC {
            return Err(damaged("does not end as a table does"));
        }
        let mut c = Cursor { b: &tail, at: 0 };
        let (at, len) = (c.u64().unwrap_or(0), c.u64().unwrap_or(0));
        let mac = c.take(32).unwrap_or(&[]).to_vec();
        // The footer ends where the tail starts.
        if len > MAX_FOOTER || at.checked_add(len) != Some(size - TAIL as u64) {
            return Err(damaged("its footer's bounds do not match its size"));
        }
        let mut footer = vec![0u8; len as usize];
        file.read_exact_at(&mut footer, at).map_err(io)?;
        if footer_mac(key, &footer, at)[..] != mac[..] {
            return Err(damaged(
                "its footer fails its MAC (damaged, or not written with this repository's key)",
            ));
        }
        let parsed = (|| {
            let mut c = Cursor { b: &footer, at: 0 };
            if c.take(16)? != MAGIC {
                return None;
            }
            let (nf, np, pages, entries) = (c.u64()?, c.u64()?, c.u64()?, c.u64()?);
            let mut id = [0u8; 32];
            id.copy_from_slice(c.take(32)?);
            if nf > MAX_FOOTER || np > MAX_FOOTER || pages * PAGE as u64 != at {
                return None;
            }
            let mut files = Vec::with_capacity(nf as usize);
            for _ in 0..nf {
                let fid = c.id()?;
                let ns = c.u64()?;
                if ns > MAX_FOOTER {
                    return None;
                }
                let supersedes = (0..ns).map(|_| c.id()).collect::<Option<Vec<_>>>()?;
                files.push(FileMeta {
                    id: fid,
                    supersedes,
                });
            }
            let mut packs = Vec::with_capacity(np as usize);
            for _ in 0..np {
                let pid = c.id()?;
                let size = c.u64()?;
                let f = c.take(8)?;
                let file = u32::from_le_bytes([f[0], f[1], f[2], f[3]]);
                if file as u64 >= nf {
                    return None;
                }
                packs.push(TablePack {
                    id: pid,
                    size,
                    file,
                    blob_type: if f[4] == 1 {
                        BlobType::Tree
                    } else {
                        BlobType::Data
                    },
                });
            }
            let fences = (0..pages).map(|_| c.u64()).collect::<Option<Vec<_>>>()?;
            let blocks = c.u64()?;
            if blocks == 0 || blocks > MAX_FOOTER / BLOCK as u64 {
                return None;
            }
            let filter = Filter {
                blocks: c
                    .take(blocks as usize * BLOCK)?
                    .chunks_exact(BLOCK)
                    .map(|b| b.try_into().unwrap_or([0u8; BLOCK]))
                    .collect(),
            };
            (c.at == footer.len()).then_some((id, files, packs, fences, filter, entries))
        })();
        let (id, files, packs, fences, filter, entries) =
            parsed.ok_or_else(|| damaged("its footer does not decode"))?;
        let verified = (0..fences.len().div_ceil(64))
            .map(|_| AtomicU64::new(0))
            .collect();
        let hot = std::sync::Mutex::new(vec![None; fences.len().min(HOT_PAGES)]);
        Ok(Table {
            file,
            path: path.to_path_buf(),
            id,
            files,
            packs,
            fences,
            filter: std::sync::RwLock::new(Some(filter)),
            entries,
            verified,
            hot,
            key: *key,
        })
    }

    /// Frees the filter (1.25 bytes a blob): lookups then read a page in
    /// every table. For a run that makes few lookups and holds much else.
    pub fn drop_filter(&self) {
        *self.filter.write().unwrap_or_else(|p| p.into_inner()) = None;
        // Such a run wants its memory for other things too.
        *self.hot.lock().unwrap_or_else(|p| p.into_inner()) = Vec::new();
    }

    /// Page `n` for a lookup: kept, so that the next lookup landing on it
    /// reads nothing.
    fn looked_up(&self, n: u64) -> Result<Arc<Page>, TableError> {
        let slot = {
            let hot = self.hot.lock().unwrap_or_else(|p| p.into_inner());
            if hot.is_empty() {
                None
            } else {
                let slot = (n % hot.len() as u64) as usize;
                match &hot[slot] {
                    Some((m, p)) if *m == n => return Ok(p.clone()),
                    _ => Some(slot),
                }
            }
        };
        let page = Arc::new(self.page(n)?);
        if let Some(slot) = slot {
            let mut hot = self.hot.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(s) = hot.get_mut(slot) {
                *s = Some((n, page.clone()));
            }
        }
        Ok(page)
    }

    /// Pages in the table.
    pub fn pages(&self) -> u64 {
        self.fences.len() as u64
    }

    /// Reads page `n`, checking its MAC the first time in this process.
    pub fn page(&self, n: u64) -> Result<Page, TableError> {
        self.read_page(n, false)
    }

    /// Reads page `n` and checks its MAC whatever was checked before: for
    /// a merge, which writes what it reads into a new table under a MAC of
    /// its own. A byte that went bad on disk after a lookup had checked its
    /// page would otherwise pass into the merged table as sound (found by
    /// `tables_answer_as_the_in_memory_index_did`: a table damaged while a
    /// merge behind a load read it answered an offset 4 MiB out).
    pub fn page_checked(&self, n: u64) -> Result<Page, TableError> {
        self.read_page(n, true)
    }

    fn read_page(&self, n: u64, always: bool) -> Result<Page, TableError> {
        let mut bytes = Box::new([0u8; PAGE]);
        self.file
            .read_exact_at(&mut bytes[..], n * PAGE as u64)
            .map_err(|source| TableError::Io {
                path: self.path.clone(),
                source,
            })?;
        let damaged = |what: String| TableError::Damaged {
            path: self.path.clone(),
            what,
        };
        let (word, bit) = ((n / 64) as usize, 1u64 << (n % 64));
        if always || self.verified[word].load(Ordering::Relaxed) & bit == 0 {
            let mac = page_mac(&self.key, &self.id, n, &bytes[..MAC_AT]);
            if mac[..] != bytes[MAC_AT..] {
                return Err(damaged(format!("page {n} fails its MAC")));
            }
            self.verified[word].fetch_or(bit, Ordering::Relaxed);
        }
        let c = &bytes[COUNT_AT..COUNT_AT + 4];
        let len = u32::from_le_bytes([c[0], c[1], c[2], c[3]]) as usize;
        if len == 0 || len > PER_PAGE {
            return Err(damaged(format!("page {n} claims {len} entries")));
        }
        let page = Page { bytes, len };
        // A MAC'd page out of order is a bug in the writer; say so
        // rather than answer wrongly.
        if prefix(&page.entry(0).id) != self.fences[n as usize] {
            return Err(damaged(format!("page {n} does not start at its fence")));
        }
        Ok(page)
    }

    /// Every entry for `id`, in slot order, appended to `out`.
    pub fn find(&self, id: &BlobId, out: &mut Vec<Entry>) -> Result<(), TableError> {
        let filtered = self
            .filter
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
            .is_some_and(|f| !f.may_contain(id));
        if filtered {
            return Ok(());
        }
        let p = prefix(id);
        let first = self.fences.partition_point(|f| *f < p).saturating_sub(1);
        let mut n = first;
        while n < self.fences.len() && (n == first || self.fences[n] <= p) {
            let page = self.looked_up(n as u64)?;
            let key = &id.0 .0[..];
            let (mut i, mut hi) = (0, page.len());
            while i < hi {
                let mid = (i + hi) / 2;
                if page.id(mid) < key {
                    i = mid + 1;
                } else {
                    hi = mid;
                }
            }
            while i < page.len() && page.id(i) == key {
                out.push(page.entry(i));
                i += 1;
            }
            if i < page.len() {
                break; // a larger key ends the run
            }
            n += 1;
        }
        Ok(())
    }
}

#[cfg(test)]
mod filter_tests {
    use super::*;

    fn id(i: u32) -> BlobId {
        BlobId(Id(*blake3::hash(&i.to_le_bytes()).as_bytes()))
    }

    /// Every blob put in is found; of blobs never put in, about 1 % pass
    /// (deterministic: the IDs are fixed hashes).
    #[test]
    fn the_filter_never_forgets_and_rarely_lies() {
        let mut f = Filter::for_entries(20_000);
        for i in 0..20_000 {
            f.insert(&id(i));
        }
        assert!((0..20_000).all(|i| f.may_contain(&id(i))));
        let lies = (20_000..120_000).filter(|&i| f.may_contain(&id(i))).count();
        assert!(lies < 3_000, "{lies} of 100,000 absent blobs pass");
    }
}
