//! Sorted arrays that grow by merging batches in, for sets too large for a
//! hash set's overhead (prune's used blobs, a backup's claimed blobs).

use std::collections::HashSet;

use capsule_format::BlobId;

/// Merges the sorted, duplicate-free `fresh` into the sorted `sorted`, in
/// place from the back: memory is the two arrays, never twice the first.
/// Duplicates between the two are removed.
pub(crate) fn merge_in<T: Ord + Copy + Default>(sorted: &mut Vec<T>, fresh: &[T]) {
    let (n, m) = (sorted.len(), fresh.len());
    sorted.reserve_exact(m);
    sorted.resize(n + m, T::default());
    let (mut i, mut j) = (n, m);
    for k in (0..n + m).rev() {
        if j == 0 {
            break;
        }
        if i > 0 && sorted[i - 1] > fresh[j - 1] {
            sorted[k] = sorted[i - 1];
            i -= 1;
        } else {
            sorted[k] = fresh[j - 1];
            j -= 1;
        }
    }
    sorted.dedup();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merging_keeps_order_and_drops_duplicates() {
        let mut a = vec![1, 4, 9];
        merge_in(&mut a, &[0, 4, 5, 10]);
        assert_eq!(a, [0, 1, 4, 5, 9, 10]);
        let mut e: Vec<u8> = Vec::new();
        merge_in(&mut e, &[2, 3]);
        assert_eq!(e, [2, 3]);
        merge_in(&mut e, &[]);
        assert_eq!(e, [2, 3]);
    }
}

/// A set of blob IDs, exact (a backup's blobs taken to store: one wrongly
/// taken for stored would be lost) and compact, since an initial backup of
/// a million tiny files takes a million blobs: a sorted array of IDs (32
/// bytes each, against about 100 in a hash set while it grows) and a
/// small set of the latest, merged in when it fills.
#[derive(Debug, Default)]
pub(crate) struct IdSet {
    sorted: Vec<BlobId>,
    fresh: HashSet<BlobId>,
}

/// IDs held in the small set before a merge.
const FRESH: usize = 1 << 16;

impl IdSet {
    /// Adds `id`; false when it was in the set already.
    pub(crate) fn insert(&mut self, id: BlobId) -> bool {
        if self.sorted.binary_search(&id).is_ok() || !self.fresh.insert(id) {
            return false;
        }
        if self.fresh.len() >= FRESH {
            let mut fresh: Vec<BlobId> = self.fresh.drain().collect();
            fresh.sort_unstable();
            merge_in(&mut self.sorted, &fresh);
        }
        true
    }

    /// Whether `id` is in the set.
    pub(crate) fn contains(&self, id: &BlobId) -> bool {
        self.fresh.contains(id) || self.sorted.binary_search(id).is_ok()
    }
}

#[cfg(test)]
mod id_set_tests {
    use super::*;

    #[test]
    fn claims_are_exact_across_merges() {
        let id = |n: u32| {
            let mut b = [0u8; 32];
            b[..4].copy_from_slice(&n.wrapping_mul(2_654_435_761).to_be_bytes());
            b[4..8].copy_from_slice(&n.to_le_bytes());
            BlobId(capsule_format::Id(b))
        };
        let mut c = IdSet::default();
        let n = FRESH as u32 * 3 + 5;
        for k in 0..n {
            assert!(c.insert(id(k)), "{k} is new");
        }
        for k in 0..n {
            assert!(!c.insert(id(k)), "{k} was claimed");
            assert!(c.contains(&id(k)));
        }
        assert!(!c.contains(&id(n)));
        assert!(c.sorted.windows(2).all(|w| w[0] < w[1]));
    }
}
