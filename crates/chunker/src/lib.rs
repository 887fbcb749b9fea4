//! Content-defined chunking with FastCDC (2020 variant, normalization level 1).
//!
//! The gear table is XORed with a per-repository secret seed, so the same file
//! is cut at different places in different repositories and chunk lengths do
//! not reveal which file was stored. The caller owns the buffer and the I/O:
//! this crate only answers "where is the next cut in these bytes?".

use std::borrow::Cow;

use fastcdc::v2020::{cut_gear, get_gear_with_seed, select_masks, Normalization};

/// Chunk size bounds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChunkSizes {
    /// No chunk is shorter, except the last of a file.
    pub min: usize,
    /// Target average.
    pub avg: usize,
    /// No chunk is longer.
    pub max: usize,
}

impl Default for ChunkSizes {
    /// 512 KiB / 1 MiB / 4 MiB: large enough that the index stays small and
    /// per-chunk overhead is negligible, small enough to dedup edits well.
    /// The maximum bounds each reader's look-ahead buffer (twice the max).
    fn default() -> Self {
        ChunkSizes {
            min: 512 * 1024,
            avg: 1024 * 1024,
            max: 4 * 1024 * 1024,
        }
    }
}

impl ChunkSizes {
    /// The sizes a large file's tail is cut with (see [`FileCuts`]): a
    /// sixteenth of these (a thirty-second for `min`), 16 KiB / 64 KiB /
    /// 256 KiB by default: an append of a few kilobytes then stores one
    /// such piece again, not a whole last chunk of 0.5 to 4 MiB.
    pub fn fine(self) -> ChunkSizes {
        ChunkSizes {
            min: (self.min / 32).max(64),
            avg: (self.avg / 16).max(256),
            max: (self.max / 16).max(1024),
        }
    }
}

/// A keyed FastCDC cutter.
#[derive(Clone)]
pub struct Chunker {
    sizes: ChunkSizes,
    mask_s: u64,
    mask_l: u64,
    fine: ChunkSizes,
    fine_mask_s: u64,
    fine_mask_l: u64,
    gear: Cow<'static, [u64]>,
    gear_ls: Cow<'static, [u64]>,
}

impl Chunker {
    /// A chunker for `sizes` keyed with `seed`.
    pub fn new(sizes: ChunkSizes, seed: u64) -> Self {
        let (mask_s, mask_l) = select_masks(sizes.avg, Normalization::Level1);
        let fine = sizes.fine();
        let (fine_mask_s, fine_mask_l) = select_masks(fine.avg, Normalization::Level1);
        let (gear, gear_ls) = get_gear_with_seed(seed);
        Chunker {
            sizes,
            mask_s,
            mask_l,
            fine,
            fine_mask_s,
            fine_mask_l,
            gear,
            gear_ls,
        }
    }

    /// The configured bounds.
    pub fn sizes(&self) -> ChunkSizes {
        self.sizes
    }

    /// Length of the next chunk at the start of `data`. When `eof` is false
    /// the caller must supply at least `max` bytes (or all that remain), so
    /// that a cut is never placed at an arbitrary buffer boundary.
    pub fn next_cut(&self, data: &[u8], eof: bool) -> usize {
        debug_assert!(eof || data.len() >= self.sizes.max);
        self.cut(data, self.sizes, self.mask_s, self.mask_l)
    }

    fn cut(&self, data: &[u8], sizes: ChunkSizes, mask_s: u64, mask_l: u64) -> usize {
        if data.len() <= sizes.min {
            return data.len();
        }
        let (_, cut) = cut_gear(
            data,
            sizes.min,
            sizes.avg,
            sizes.max,
            mask_s,
            mask_l,
            mask_s << 1,
            mask_l << 1,
            &self.gear,
            &self.gear_ls,
        );
        cut.clamp(1, data.len())
    }

    /// Cuts for one file, read from its start (see [`FileCuts`]).
    pub fn file(&self) -> FileCuts<'_> {
        FileCuts {
            chunker: self,
            read: 0,
            in_tail: false,
        }
    }

    /// Splits a whole file held in memory as [`FileCuts`] does (a large
    /// file's tail finer).
    pub fn cut_file(&self, mut data: &[u8]) -> Vec<usize> {
        let mut cuts = self.file();
        let mut out = Vec::new();
        while !data.is_empty() {
            let n = cuts.next_cut(data, true);
            out.push(n);
            data = &data[n..];
        }
        out
    }

    /// Splits a whole in-memory buffer into chunk lengths with the usual
    /// sizes throughout (no finer tail).
    pub fn cut_all(&self, mut data: &[u8]) -> Vec<usize> {
        let mut out = Vec::new();
        while !data.is_empty() {
            let n = self.next_cut(data, true);
            out.push(n);
            data = &data[n..];
        }
        out
    }
}

/// The cuts of one file. In a file of at least [`FileCuts::LARGE`] times
/// the largest chunk, the tail (the part after the last cut when no further
/// cut comes before the end) is cut with the [fine sizes](ChunkSizes::fine).
/// Large files are the ones appended to (a mailbox, a log, a database's
/// journal): the next append finds the same fine cuts in the same bytes
/// (every cut depends only on the bytes since the one before) and stores
/// one small piece again, where one chunk of 0.5 to 4 MiB would have been
/// stored whole again by every backup until a usual cut appeared. Once the
/// appended bytes hold a usual cut, the region up to it becomes one usual
/// chunk, stored once.
///
/// The rule depends on the bytes alone (how many came before the tail), so
/// the same bytes always give the same blobs, whoever reads them: a journal
/// -driven snapshot and a full scan agree, and a file read again unchanged
/// stores nothing. (An earlier rule, "the file grew since its parent",
/// broke that.) The price: up to about 16 more blobs per large file, at
/// most two per MiB at the threshold and fewer above it.
pub struct FileCuts<'a> {
    chunker: &'a Chunker,
    read: u64,
    in_tail: bool,
}

impl FileCuts<'_> {
    /// A file is large, and its tail cut finer, from this many times the
    /// largest chunk (8 MiB by default).
    pub const LARGE: usize = 2;

    /// Length of the next chunk at the start of `data`, as
    /// [`Chunker::next_cut`] asks (at least `max` bytes, or all that
    /// remain with `eof`).
    pub fn next_cut(&mut self, data: &[u8], eof: bool) -> usize {
        let c = self.chunker;
        if !self.in_tail {
            let n = c.next_cut(data, eof);
            // No cut before the end of a large file: what remains is the tail.
            let large = self.read + data.len() as u64 >= (Self::LARGE * c.sizes.max) as u64;
            if !(large && eof && n == data.len()) {
                self.read += n as u64;
                return n;
            }
            self.in_tail = true;
        }
        let n = c.cut(data, c.fine, c.fine_mask_s, c.fine_mask_l);
        self.read += n as u64;
        n
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn noise(n: usize, mut x: u64) -> Vec<u8> {
        (0..n)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                (x >> 24) as u8
            })
            .collect()
    }

    fn small() -> ChunkSizes {
        ChunkSizes {
            min: 2048,
            avg: 8192,
            max: 65536,
        }
    }

    #[test]
    fn bounds_hold_and_lengths_sum() {
        let d = noise(1 << 20, 1);
        let c = Chunker::new(small(), 42);
        let cuts = c.cut_all(&d);
        assert_eq!(cuts.iter().sum::<usize>(), d.len());
        for &n in &cuts[..cuts.len() - 1] {
            assert!((2048..=65536).contains(&n), "{n}");
        }
        let avg = d.len() / cuts.len();
        assert!((4096..=16384).contains(&avg), "average {avg}");
    }

    #[test]
    fn seed_changes_boundaries() {
        let d = noise(1 << 20, 2);
        let a = Chunker::new(small(), 1).cut_all(&d);
        let b = Chunker::new(small(), 2).cut_all(&d);
        assert_ne!(a, b);
    }

    #[test]
    fn insertion_resynchronizes() {
        // Boundaries after an edit realign: most chunks are shared.
        let d = noise(1 << 20, 3);
        let mut e = d.clone();
        e.splice(1000..1000, b"inserted bytes".iter().copied());
        let c = Chunker::new(small(), 9);
        let chunks = |v: &[u8]| {
            let mut set = std::collections::HashSet::new();
            let mut off = 0;
            for n in c.cut_all(v) {
                set.insert(v[off..off + n].to_vec());
                off += n;
            }
            set
        };
        let (a, b) = (chunks(&d), chunks(&e));
        let shared = a.intersection(&b).count();
        assert!(shared * 10 >= a.len() * 8, "{shared} of {}", a.len());
    }

    /// Test vector from docs/FORMAT.md: the cuts of a fixed input and seed.
    #[test]
    fn vector() {
        let d = noise(200_000, 7);
        let cuts = Chunker::new(small(), 0x5eed).cut_all(&d);
        assert_eq!(
            cuts,
            vec![
                11405, 22277, 2661, 8230, 6715, 6026, 15743, 19985, 12635, 7822, 19463, 9451, 9859,
                2902, 14074, 10572, 3268, 2079, 7032, 7801
            ]
        );
    }

    /// Test vector from docs/FORMAT.md: the same bytes as a file, its tail
    /// (after 131,072 = twice the largest chunk) cut finer.
    #[test]
    fn file_vector() {
        let d = noise(200_000, 7);
        let c = Chunker::new(small(), 0x5eed);
        let cuts = c.cut_file(&d);
        assert_eq!(cuts.iter().sum::<usize>(), d.len());
        assert_eq!(
            cuts,
            vec![
                11405, 22277, 2661, 8230, 6715, 6026, 15743, 19985, 12635, 7822, 19463, 9451, 9859,
                2902, 14074, 10572, 3268, 2079, 7032, 103, 939, 462, 498, 672, 764, 925, 512, 661,
                250, 688, 1327
            ]
        );
    }

    /// The cuts of a whole buffer by `FileCuts`.
    fn file_cuts(c: &Chunker, d: &[u8]) -> Vec<usize> {
        file_cuts_by(c, d, c.sizes().max)
    }

    /// The same, fed `window` bytes (at least `max`) at a time.
    fn file_cuts_by(c: &Chunker, d: &[u8], window: usize) -> Vec<usize> {
        let mut f = c.file();
        let mut out = Vec::new();
        let mut off = 0;
        while off < d.len() {
            let end = (off + window).min(d.len());
            let n = f.next_cut(&d[off..end], end == d.len());
            out.push(n);
            off += n;
        }
        out
    }

    fn pieces<'a>(d: &'a [u8], cuts: &[usize]) -> Vec<&'a [u8]> {
        let mut off = 0;
        cuts.iter()
            .map(|&n| {
                off += n;
                &d[off - n..off]
            })
            .collect()
    }

    #[test]
    fn an_append_stores_one_fine_piece_again() {
        let c = Chunker::new(small(), 3);
        let all = noise(400_000, 21);
        let (mut kept, mut before) = (0usize, 0usize);
        // A file that grows by 1,000 bytes at a time.
        for len in (150_000..=400_000).step_by(1000) {
            let d = &all[..len];
            let old = &all[..len - 1000];
            let (was, now) = (file_cuts(&c, old), file_cuts(&c, d));
            let was: std::collections::HashSet<&[u8]> = pieces(old, &was).into_iter().collect();
            let new: usize = pieces(d, &now)
                .iter()
                .filter(|p| !was.contains(*p))
                .map(|p| p.len())
                .sum();
            kept += new;
            // Without fine tails, the whole last chunk is new each time.
            let plain = *c.cut_all(d).last().unwrap();
            before += plain;
            let fine_max = small().fine().max;
            assert!(
                new <= fine_max + 1000 || new >= small().min,
                "{new} new bytes at {len}"
            );
        }
        // Before: the last chunk (8 KiB on average, more as a chunk that
        // holds the end is a long one) each time. Now: the append, its last
        // fine piece again (512 B on average), and each appended byte once
        // more when a usual cut appears: about twice what was appended.
        let appended = 251 * 1000;
        assert!(
            kept < 3 * appended,
            "{kept} bytes stored for {appended} appended"
        );
        assert!(
            kept * 2 < before,
            "{kept} bytes stored again, {before} before"
        );
    }

    #[test]
    fn a_small_file_is_cut_as_before_a_large_one_finer_at_its_tail() {
        let c = Chunker::new(small(), 3);
        // Under twice the largest chunk (128 KiB here): the usual cuts.
        let d = noise(120_000, 22);
        assert_eq!(file_cuts(&c, &d), c.cut_all(&d));
        let d = noise(300_000, 22);
        let large = file_cuts(&c, &d);
        let plain = c.cut_all(&d);
        // Only the last chunk is cut finer.
        assert_eq!(large[..plain.len() - 1], plain[..plain.len() - 1]);
        assert_eq!(large.iter().sum::<usize>(), d.len());
        assert!(large.len() > plain.len());
    }

    proptest! {
        #[test]
        fn streaming_equals_whole(len in 0usize..300_000, split in 65536usize..200_000) {
            // Feeding a window of >= max bytes gives the same cuts as the whole buffer.
            let d = noise(len, 11);
            let c = Chunker::new(small(), 5);
            let whole = c.cut_all(&d);
            let mut got = Vec::new();
            let mut off = 0;
            while off < d.len() {
                let end = (off + split).min(d.len());
                let eof = end == d.len();
                let n = c.next_cut(&d[off..end], eof);
                got.push(n);
                off += n;
            }
            prop_assert_eq!(got, whole);
        }

        #[test]
        fn file_cuts_depend_on_the_bytes_alone(len in 0usize..400_000, window in 65536usize..200_000) {
            // However the reader feeds them, the same bytes get the same cuts.
            let d = noise(len, 12);
            let c = Chunker::new(small(), 5);
            prop_assert_eq!(file_cuts_by(&c, &d, window), file_cuts(&c, &d));
        }
    }
}
