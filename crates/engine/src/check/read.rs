//! `check --read-data`: which packs are read, and reading them at the
//! limit of the destination and the cores.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};

use capsule_crypto::Aad;
use capsule_format::pack::{decode_header, parse_trailer, PACK_TRAILER_LEN};
use capsule_format::{BlobId, BlobType, ObjectId};

use crate::index::MasterIndex;
use crate::progress::Progress;
use crate::repo::Repository;

/// Which packs `check --read-data-subset` reads.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Subset {
    /// Every pack.
    All,
    /// Slice `n` of `m` (1-based): the packs whose ID, read as a number,
    /// leaves `n - 1` divided by `m`. Fixed, so `m` runs, one slice each,
    /// read every pack once.
    Slice(u32, u32),
    /// The slice of `m` verified longest ago (or never), as the
    /// repository's records say (`next/12`): what a schedule runs.
    Next(u32),
    /// About this percentage of the packs, picked at random each run.
    Percent(f64),
    /// Random packs until this many bytes.
    Bytes(u64),
}

impl Subset {
    /// Reads `N/M`, `P%` or a size (`500M`, `2G`).
    pub fn parse(s: &str) -> std::result::Result<Subset, String> {
        let t = s.trim();
        if let Some((n, m)) = t.split_once('/') {
            if n.trim() == "next" {
                return match m.trim().parse::<u32>() {
                    Ok(m) if m >= 1 => Ok(Subset::Next(m)),
                    _ => Err(format!(
                        "{s:?}: give the rotation as next/M, M >= 1 (say next/12)"
                    )),
                };
            }
            let (n, m) = (n.trim().parse::<u32>(), m.trim().parse::<u32>());
            return match (n, m) {
                (Ok(n), Ok(m)) if m >= 1 && (1..=m).contains(&n) => Ok(Subset::Slice(n, m)),
                _ => Err(format!(
                    "{s:?}: give a slice as N/M, 1 <= N <= M (say 1/12)"
                )),
            };
        }
        if let Some(p) = t.strip_suffix('%') {
            return match p.trim().parse::<f64>() {
                Ok(p) if p > 0.0 && p <= 100.0 => Ok(Subset::Percent(p)),
                _ => Err(format!("{s:?}: give a percentage above 0 and at most 100")),
            };
        }
        crate::quota::parse_size(t)
            .map(Subset::Bytes)
            .map_err(|e| format!("{e}; or give N/M or P%"))
    }

    /// As the user wrote it, for reports.
    pub fn describe(&self) -> String {
        match self {
            Subset::All => "all".into(),
            Subset::Slice(n, m) => format!("{n}/{m}"),
            Subset::Next(m) => format!("next/{m}"),
            Subset::Percent(p) => format!("{p}%"),
            Subset::Bytes(b) => format!("{b} bytes"),
        }
    }

    /// The packs of `packs` (index positions, with IDs and sizes) this
    /// subset reads.
    pub(super) fn pick(&self, packs: Vec<(u32, ObjectId, u64)>) -> Vec<u32> {
        use std::hash::{BuildHasher, Hasher};
        let number = |id: &ObjectId| {
            let b = id.as_bytes();
            u32::from_be_bytes([b[0], b[1], b[2], b[3]])
        };
        // A different order every run: a hash keyed anew by each process.
        let key = std::collections::hash_map::RandomState::new();
        let random = |id: &ObjectId| {
            let mut h = key.build_hasher();
            h.write(id.as_bytes());
            h.finish()
        };
        match *self {
            Subset::All => packs.into_iter().map(|p| p.0).collect(),
            // Resolved to a slice before packs are picked.
            Subset::Next(_) => Vec::new(),
            Subset::Slice(n, m) => packs
                .into_iter()
                .filter(|(_, id, _)| number(id) % m == n - 1)
                .map(|p| p.0)
                .collect(),
            Subset::Percent(p) => {
                let mut v = packs;
                v.sort_by_key(|(_, id, _)| random(id));
                let keep = ((v.len() as f64 * p / 100.0).ceil() as usize).min(v.len());
                v.truncate(keep);
                v.into_iter().map(|p| p.0).collect()
            }
            Subset::Bytes(limit) => {
                let mut v = packs;
                v.sort_by_key(|(_, id, _)| random(id));
                let mut total = 0u64;
                let mut out = Vec::new();
                for (pos, _, size) in v {
                    if total >= limit {
                        break;
                    }
                    total += size;
                    out.push(pos);
                }
                out
            }
        }
    }
}

/// Bytes of packs `check --read-data` holds at once: with 16 MiB packs,
/// four in flight, which keeps a disk or a link busy while the cores
/// verify, within the 128 MiB every command keeps to.
const READ_DATA_BUDGET: u64 = 64 << 20;

/// What a network client holds of a pack besides the pack itself while
/// it arrives (its reads in flight).
const IN_FLIGHT_EXTRA: u64 = 4 << 20;

/// The pack `name` of `size` bytes (as the index says), whole. Over a
/// network it is streamed into one buffer: a `get` returned the client's
/// body and then a copy, a pack held twice, so only two fitted the memory
/// budget (S3 at 10 ms: 149 MiB/s where four plain readers took 216). A
/// failure here (this path is not retried) sends the pack to the
/// blob-by-blob examination, which reads it again with retries and names
/// what is wrong.
fn fetch_pack(
    repo: &Repository,
    name: &str,
    size: u64,
    local: bool,
) -> std::result::Result<Vec<u8>, capsule_backend::BackendError> {
    if local {
        return repo.backend().get(name, None);
    }
    // The index's size is a hint only: capped, so a wrong one costs a
    // regrowth, never an allocation the machine cannot make.
    let mut whole = Vec::with_capacity(size.min(64 << 20) as usize);
    repo.backend().get_stream(name, None, &mut whole)?;
    Ok(whole)
}

/// Where `check --read-data` spent its time, as a restore says it.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct ReadTiming {
    /// Wall seconds of reading and verifying.
    pub secs: f64,
    /// Bytes read a second over `secs`.
    pub bytes_per_sec: f64,
    /// Packs in flight at once.
    pub workers: u64,
    /// Seconds the workers waited for the destination, summed.
    pub wait_secs: f64,
    /// Seconds they spent hashing, decrypting, decompressing, summed.
    pub work_secs: f64,
    /// Packs read twice because their header or the index disagreed with
    /// them (reported below as damage, or found clean the second time).
    pub packs_reread: u64,
    /// What limited the read: `destination` when the workers mostly waited
    /// for bytes, `cpu` when the cores were busy verifying.
    pub bound: &'static str,
}

/// Reads and verifies the packs at index positions `packs`: a pipeline of
/// workers, each fetching a whole pack and verifying it, as many as the
/// destination takes in flight and the memory budget allows. A pack is
/// verified by its own header (one pass, no index scan per pack); one
/// whose header, blobs or index entries disagree is read again and
/// examined blob by blob against the index, which names what is lost.
pub(super) fn read_data(
    repo: &Repository,
    index: &MasterIndex,
    packs: &[u32],
    blobs_read: &AtomicU64,
    progress: &Progress,
) -> (Vec<(String, String, Vec<BlobId>)>, ReadTiming) {
    let started = std::time::Instant::now();
    // What the index places in each pack, from one scan: how many blobs,
    // and the sum of their entries' fingerprints (32 bytes a pack). A
    // pack whose header lists the same is checked without a lookup per
    // blob, which at millions of tiny blobs cost more than the reading.
    let mut placed = vec![Placed::default(); index.packs().len()];
    for (id, loc) in index.iter() {
        if let Some(p) = placed.get_mut(loc.pack as usize) {
            p.add(&id, loc.blob_type, loc.offset, loc.length, loc.raw_length);
        }
    }
    let caps = repo.backend().capabilities();
    let cpus = std::thread::available_parallelism().map_or(2, |n| n.get());
    let pack_size = u64::from(repo.config().pack_size).max(1 << 20);
    // Locally one more than the cores (a read overlaps the others'
    // verifying); over a network the destination's concurrency, each pack
    // streamed into one buffer ([`fetch_pack`]).
    let held = if caps.local {
        pack_size
    } else {
        pack_size + IN_FLIGHT_EXTRA
    };
    let width = crate::flight::reads_in_flight(&caps)
        .max(cpus + 1)
        .min((READ_DATA_BUDGET / held).max(2) as usize);
    let (wait, work) = (AtomicU64::new(0), AtomicU64::new(0));
    let suspect: Vec<u32> = crate::flight::map_in_flight(packs, width, |&pos| {
        let pack = &index.packs()[pos as usize];
        let t0 = std::time::Instant::now();
        let fetched = fetch_pack(repo, &pack.name(), pack.size, caps.local);
        let t1 = std::time::Instant::now();
        let clean = fetched.is_ok_and(|mut bytes| {
            let n = bytes.len() as u64;
            let ok = verify_by_header(repo, index, pos, pack, &mut bytes, placed[pos as usize]);
            if ok {
                Progress::add(&progress.bytes_done, n);
                Progress::add(&progress.files_done, 1);
                blobs_read.fetch_add(u64::from(placed[pos as usize].count), Ordering::Relaxed);
            }
            ok
        });
        wait.fetch_add((t1 - t0).as_micros() as u64, Ordering::Relaxed);
        work.fetch_add(t1.elapsed().as_micros() as u64, Ordering::Relaxed);
        (!clean).then_some(pos)
    })
    .into_iter()
    .flatten()
    .collect();
    // The suspects, a few at a time, blob by blob against the index.
    let mut found = Vec::new();
    for batch in suspect.chunks(READ_DATA_BATCH) {
        let by_pack = blobs_in(index, &batch.iter().copied().collect());
        found.extend(
            crate::flight::map_in_flight(batch, width, |&pos| {
                let pack = index.packs()[pos as usize];
                let entries = by_pack.get(&pos).map(|v| v.as_slice()).unwrap_or(&[]);
                let r = read_pack(repo, &pack, entries, blobs_read, progress);
                Progress::add(&progress.files_done, 1);
                r
            })
            .into_iter()
            .flatten(),
        );
    }
    let secs = started.elapsed().as_secs_f64();
    let (wait_secs, work_secs) = (
        wait.into_inner() as f64 / 1e6,
        work.into_inner() as f64 / 1e6,
    );
    let timing = ReadTiming {
        secs,
        bytes_per_sec: Progress::get(&progress.bytes_done) as f64 / secs.max(1e-9),
        workers: width as u64,
        wait_secs,
        work_secs,
        packs_reread: suspect.len() as u64,
        bound: if wait_secs > work_secs {
            "destination"
        } else {
            "cpu"
        },
    };
    (found, timing)
}

/// Whether a fetched pack is wholly sound: its bytes hash to its name, its
/// header opens, every blob the header lists authenticates and matches
/// its ID, and the index's `placed` blobs in this pack are all among them
/// at the header's places. Decrypts in place (the bytes are spent after).
fn verify_by_header(
    repo: &Repository,
    index: &MasterIndex,
    pos: u32,
    pack: &crate::index::PackInfo,
    bytes: &mut [u8],
    placed: Placed,
) -> bool {
    if ObjectId::of(bytes) != pack.id {
        return false;
    }
    let Ok(entries) = header_entries(repo, bytes) else {
        return false;
    };
    let name = pack.name();
    let mut listed = Placed::default();
    for e in &entries {
        let (s, end) = (e.offset as usize, e.offset as usize + e.length as usize);
        let Some(env) = bytes.get_mut(s..end) else {
            return false;
        };
        if repo
            .decode_blob_in_place(&name, e.blob_type, &e.id, env, e.raw_length as usize)
            .is_err()
        {
            return false;
        }
        listed.add(&e.id, e.blob_type, e.offset, e.length, e.raw_length);
    }
    if listed == placed {
        return true;
    }
    // The header lists more (a blob the index places in another pack, as
    // two backups racing can leave) or other entries: each looked up.
    let mut matched = 0u32;
    for e in &entries {
        if index.get(&e.id).is_some_and(|l| {
            l.pack == pos
                && l.offset == e.offset
                && l.length == e.length
                && l.raw_length == e.raw_length
                && l.blob_type == e.blob_type
        }) {
            matched += 1;
        }
    }
    matched == placed.count
}

/// Index entries of one pack, summed: a count and an order-free
/// fingerprint of (ID, type, offset, lengths).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
struct Placed {
    count: u32,
    sum: u128,
}

impl Placed {
    fn add(&mut self, id: &BlobId, t: BlobType, offset: u32, length: u32, raw: u32) {
        let b = id.as_bytes();
        let word = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().unwrap_or([0; 8]));
        // The ID is a keyed hash already: its words are uniform. The
        // places are mixed in so a moved or resized entry changes the sum.
        let places = (u64::from(offset) << 32 | u64::from(length))
            ^ (u64::from(raw) << 1 | u64::from(t == BlobType::Tree)).rotate_left(17);
        let mix = |mut z: u64| {
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^ (z >> 31)
        };
        let lo = mix(word(0) ^ places);
        let hi = mix(word(8) ^ places.rotate_left(29)) ^ word(16);
        self.count += 1;
        self.sum = self.sum.wrapping_add(u128::from(hi) << 64 | u128::from(lo));
    }
}

/// Packs `check --read-data` reads between scans of the index for their
/// blobs: eight packs of tiny files hold about 450,000 blobs (25 MB of
/// entries).
const READ_DATA_BATCH: usize = 8;

/// The blobs whose first location is in one of `packs`, by pack: one scan
/// of the index, holding only those.
pub(super) fn blobs_in(
    index: &MasterIndex,
    packs: &HashSet<u32>,
) -> HashMap<u32, Vec<(BlobId, crate::index::BlobLoc)>> {
    let mut by: HashMap<u32, Vec<(BlobId, crate::index::BlobLoc)>> = HashMap::new();
    for (id, loc) in index.iter() {
        if packs.contains(&loc.pack) {
            by.entry(loc.pack).or_default().push((id, loc));
        }
    }
    by
}

/// Reads one pack whole and verifies it. Returns `(pack, problem, damaged
/// blobs)` if anything is wrong.
fn read_pack(
    repo: &Repository,
    pack: &crate::index::PackInfo,
    entries: &[(BlobId, crate::index::BlobLoc)],
    blobs_read: &AtomicU64,
    progress: &Progress,
) -> Option<(String, String, Vec<BlobId>)> {
    let (name, pid) = (pack.name(), &pack.id);
    let bytes = match repo.backend().get(&name, None) {
        Ok(b) => b,
        Err(e) => {
            return Some((
                name,
                format!("unreadable: {e}"),
                entries.iter().map(|e| e.0).collect(),
            ))
        }
    };
    Progress::add(&progress.bytes_done, bytes.len() as u64);
    let mut msgs = Vec::new();
    if ObjectId::of(&bytes) != *pid {
        msgs.push("content does not match its name (bit rot or tampering)".to_string());
    }
    if let Err(m) = check_header(repo, &bytes) {
        msgs.push(format!("header: {m}"));
    }
    let mut bad = Vec::new();
    for (id, loc) in entries {
        blobs_read.fetch_add(1, Ordering::Relaxed);
        let (s, e) = (
            loc.offset as usize,
            loc.offset as usize + loc.length as usize,
        );
        let ok = bytes.get(s..e).is_some_and(|env| {
            repo.decode_blob(&name, loc.blob_type, id, env, loc.raw_length as usize)
                .is_ok()
        });
        if !ok {
            bad.push(*id);
        }
    }
    if !bad.is_empty() {
        msgs.push(format!(
            "{} of {} blobs fail authentication",
            bad.len(),
            entries.len()
        ));
    }
    if msgs.is_empty() {
        None
    } else {
        Some((name, msgs.join("; "), bad))
    }
}

fn check_header(repo: &Repository, bytes: &[u8]) -> std::result::Result<(), String> {
    header_entries(repo, bytes).map(|_| ())
}

/// The blobs a pack's own header lists.
fn header_entries(
    repo: &Repository,
    bytes: &[u8],
) -> std::result::Result<Vec<capsule_format::pack::PackEntry>, String> {
    if bytes.len() < PACK_TRAILER_LEN {
        return Err("pack shorter than its trailer".into());
    }
    let t = &bytes[bytes.len() - PACK_TRAILER_LEN..];
    let hlen = parse_trailer(t, bytes.len() as u64).map_err(|e| e.to_string())? as usize;
    let start = bytes.len() - PACK_TRAILER_LEN - hlen;
    let plain = repo
        .key()
        .open(
            Aad::PackHeader,
            &bytes[start..bytes.len() - PACK_TRAILER_LEN],
        )
        .map_err(|e| e.to_string())?;
    decode_header(&plain).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn a_packs_fingerprint_ignores_order_and_sees_a_moved_or_changed_entry() {
        let ids: Vec<BlobId> = (0..50u8)
            .map(|i| blake3::hash(&[i]).to_hex().parse().unwrap())
            .collect();
        let sum = |entries: &[(usize, u32, u32)]| {
            let mut p = Placed::default();
            for &(i, off, len) in entries {
                p.add(&ids[i], BlobType::Data, off, len, len + 1);
            }
            p
        };
        let base: Vec<(usize, u32, u32)> = (0..50).map(|i| (i, i as u32 * 100, 90)).collect();
        let mut shuffled = base.clone();
        shuffled.reverse();
        assert_eq!(sum(&base), sum(&shuffled));
        let mut moved = base.clone();
        moved[7].1 += 1;
        assert_ne!(sum(&base), sum(&moved));
        let mut other = base.clone();
        other[7].0 = 49;
        assert_ne!(sum(&base), sum(&other));
        let mut fewer = base.clone();
        fewer.pop();
        assert_ne!(sum(&base), sum(&fewer));
        let mut p = sum(&base);
        p.add(&ids[3], BlobType::Tree, 300, 90, 91);
        assert_ne!(p, sum(&base));
    }

    #[test]
    fn slices_cover_every_pack_once_and_sizes_and_shares_parse() {
        let packs: Vec<(u32, ObjectId, u64)> = (0..500u32)
            .map(|i| (i, ObjectId::of(&i.to_le_bytes()), 1000))
            .collect();
        let mut seen = Vec::new();
        for n in 1..=12 {
            seen.extend(Subset::Slice(n, 12).pick(packs.clone()));
        }
        seen.sort();
        assert_eq!(seen, (0..500).collect::<Vec<_>>());
        assert_eq!(Subset::Percent(10.0).pick(packs.clone()).len(), 50);
        assert_eq!(Subset::Bytes(10_500).pick(packs.clone()).len(), 11);
        assert_eq!(Subset::parse("1/12"), Ok(Subset::Slice(1, 12)));
        assert_eq!(Subset::parse("5%"), Ok(Subset::Percent(5.0)));
        assert_eq!(Subset::parse("2G"), Ok(Subset::Bytes(2 << 30)));
        assert!(Subset::parse("13/12").is_err() && Subset::parse("0%").is_err());
    }
}
