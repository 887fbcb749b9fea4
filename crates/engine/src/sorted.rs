//! Sorted arrays that grow by merging batches in, for sets too large for a
//! hash set's overhead (prune's used blobs, a backup's claimed blobs).

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
