//! The source's file bytes for a re-chunking copy, fetched ahead.
//!
//! Re-chunking reads every file back in order. Read blob by blob, that is a
//! ranged request per blob: fine from a local disk, a round trip per
//! chunk from a network repository. The feed knows the blobs a directory's
//! files will ask for, in order, and fetches a window of them at a time as
//! a restore does: grouped by pack, neighbours merged into ranged reads of
//! up to [`MAX_REQUEST`], as many requests in flight as the destination
//! takes. Memory: one window of decoded blobs (plus blobs a later file of
//! the directory uses again) and the requests in flight.

use std::collections::{HashMap, VecDeque};

use capsule_format::{BlobId, BlobType};

use crate::error::Result;
use crate::index::{BlobLoc, MasterIndex};
use crate::repo::Repository;
use crate::restore::fetch::{max_gap, MAX_REQUEST};

/// Bytes of file content fetched at once, ahead of the chunker.
const WINDOW: u64 = 32 << 20;

pub(super) struct Feed<'a> {
    src: &'a Repository,
    index: &'a MasterIndex,
    width: usize,
    /// Blobs not yet fetched, in the order they are first asked for.
    queue: VecDeque<BlobId>,
    /// Asks still to come, per blob.
    uses: HashMap<BlobId, u32>,
    /// Fetched and decoded, waiting for their asks.
    ready: HashMap<BlobId, Vec<u8>>,
}

impl<'a> Feed<'a> {
    /// A feed for `contents`, asked for in this order.
    pub(super) fn new(src: &'a Repository, index: &'a MasterIndex, contents: &[&[BlobId]]) -> Self {
        let mut queue = VecDeque::new();
        let mut uses: HashMap<BlobId, u32> = HashMap::new();
        for id in contents.iter().flat_map(|c| c.iter()) {
            let n = uses.entry(*id).or_insert(0);
            if *n == 0 {
                queue.push_back(*id);
            }
            *n += 1;
        }
        Feed {
            src,
            index,
            width: crate::flight::reads_in_flight(&src.backend().capabilities()),
            queue,
            uses,
            ready: HashMap::new(),
        }
    }

    /// The plaintext of data blob `id`. A blob the window could not fetch
    /// or decode is read alone, from any copy the index knows, which also
    /// names the damage when there is none.
    pub(super) fn take(&mut self, id: &BlobId) -> Result<Vec<u8>> {
        if !self.ready.contains_key(id) && self.queue.contains(id) {
            self.fill(id);
        }
        let left = self.uses.get_mut(id).map(|n| {
            *n = n.saturating_sub(1);
            *n
        });
        let got = match left {
            Some(0) | None => self.ready.remove(id),
            Some(_) => self.ready.get(id).cloned(),
        };
        match got {
            Some(b) => Ok(b),
            None => self.src.read_blob(self.index, BlobType::Data, id),
        }
    }

    /// Fetches the queue's next window, up to and including `id`.
    fn fill(&mut self, id: &BlobId) {
        let mut want: Vec<(BlobId, BlobLoc)> = Vec::new();
        let (mut bytes, mut reached) = (0u64, false);
        // Everything up to the blob asked for, and on to a window's worth.
        while let Some(next) = self.queue.pop_front() {
            reached |= next == *id;
            if let Some(loc) = self.index.get(&next) {
                bytes += u64::from(loc.raw_length);
                want.push((next, loc));
            }
            if reached && bytes >= WINDOW {
                break;
            }
        }
        want.sort_by_key(|(_, l)| (l.pack, l.offset));
        let gap = max_gap(self.src);
        let mut runs: Vec<Vec<(BlobId, BlobLoc)>> = Vec::new();
        for (b, l) in want {
            let joins = runs.last().is_some_and(|run| {
                let (first, last) = (&run[0].1, &run[run.len() - 1].1);
                let end = u64::from(last.offset) + u64::from(last.length);
                l.pack == last.pack
                    && u64::from(l.offset) >= end
                    && u64::from(l.offset) - end <= gap
                    && u64::from(l.offset) + u64::from(l.length) - u64::from(first.offset)
                        <= MAX_REQUEST
            });
            match runs.last_mut() {
                Some(run) if joins => run.push((b, l)),
                _ => runs.push(vec![(b, l)]),
            }
        }
        let (src, index) = (self.src, self.index);
        let fetched =
            crate::flight::map_in_flight(&runs, self.width, |run| fetch_run(src, index, run));
        for (b, plain) in fetched.into_iter().flatten() {
            self.ready.insert(b, plain);
        }
    }
}

/// One ranged read over `run` (blobs of one pack in offset order), each
/// blob decoded; one that fails is left out (read alone later).
fn fetch_run(
    src: &Repository,
    index: &MasterIndex,
    run: &[(BlobId, BlobLoc)],
) -> Vec<(BlobId, Vec<u8>)> {
    let (first, last) = (&run[0].1, &run[run.len() - 1].1);
    let start = u64::from(first.offset);
    let end = u64::from(last.offset) + u64::from(last.length);
    let name = crate::repo::pack_name(&index.pack_id(first.pack), BlobType::Data);
    let Ok(mut bytes) = src.backend().get(&name, Some(start..end)) else {
        return Vec::new();
    };
    let mut out = Vec::with_capacity(run.len());
    for (b, l) in run {
        let s = (u64::from(l.offset) - start) as usize;
        let Some(env) = bytes.get_mut(s..s + l.length as usize) else {
            continue;
        };
        if let Ok(plain) =
            src.decode_blob_in_place(&name, BlobType::Data, b, env, l.raw_length as usize)
        {
            out.push((*b, plain.into_owned()));
        }
    }
    out
}
