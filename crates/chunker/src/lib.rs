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

/// A keyed FastCDC cutter.
#[derive(Clone)]
pub struct Chunker {
    sizes: ChunkSizes,
    mask_s: u64,
    mask_l: u64,
    gear: Cow<'static, [u64]>,
    gear_ls: Cow<'static, [u64]>,
}

impl Chunker {
    /// A chunker for `sizes` keyed with `seed`.
    pub fn new(sizes: ChunkSizes, seed: u64) -> Self {
        let (mask_s, mask_l) = select_masks(sizes.avg, Normalization::Level1);
        let (gear, gear_ls) = get_gear_with_seed(seed);
        Chunker {
            sizes,
            mask_s,
            mask_l,
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
        if data.len() <= self.sizes.min {
            return data.len();
        }
        let (_, cut) = cut_gear(
            data,
            self.sizes.min,
            self.sizes.avg,
            self.sizes.max,
            self.mask_s,
            self.mask_l,
            self.mask_s << 1,
            self.mask_l << 1,
            &self.gear,
            &self.gear_ls,
        );
        cut.clamp(1, data.len())
    }

    /// Splits a whole in-memory buffer into chunk lengths.
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
    }
}
