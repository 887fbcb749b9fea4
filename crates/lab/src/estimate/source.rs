//! The source as an estimate sees it: its files by size class, a sample
//! walk, the page cache's share of it, small directories to time.

use std::path::{Path, PathBuf};
use std::time::Instant;

use serde::{Deserialize, Serialize};

use crate::{LabError, Result};

/// One size class of the source.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct SizeClass {
    /// Files up to this size (bytes; the last class has no bound: 0).
    pub up_to: u64,
    /// Files in the class.
    pub files: u64,
    /// Their bytes.
    pub bytes: u64,
}

/// What the scan of the source found.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct SourceScan {
    /// Regular files.
    pub files: u64,
    /// Directories.
    pub dirs: u64,
    /// Symlinks and other entries that are neither files nor directories.
    #[serde(default)]
    pub others: u64,
    /// Levels of directories from the file system's root down to the
    /// deepest directory (`/a/b` is 3: `/`, `a`, `b`): a snapshot holds
    /// the absolute paths, and a restore reads its trees a level at a time.
    #[serde(default)]
    pub depth: u64,
    /// Bytes of regular files.
    pub bytes: u64,
    /// Size distribution.
    pub classes: Vec<SizeClass>,
    /// Seconds the scan took.
    pub scan_secs: f64,
    /// Seconds a second walk of the source took (every entry looked at,
    /// every directory listed, nothing read), with its metadata now in the
    /// cache as it is for a run with nothing changed. The model of such a
    /// run scales a sample's by this ([`unchanged_per_file`]).
    #[serde(default)]
    pub walk_secs: f64,
}

const CLASS_BOUNDS: [u64; 6] = [4 << 10, 64 << 10, 1 << 20, 16 << 20, 256 << 20, 0];

/// Walks `paths` (not following symlinks) and counts.
pub fn scan(paths: &[PathBuf]) -> Result<(SourceScan, Vec<(PathBuf, u64)>)> {
    let t = Instant::now();
    let mut s = SourceScan {
        classes: CLASS_BOUNDS
            .iter()
            .map(|&up_to| SizeClass {
                up_to,
                ..SizeClass::default()
            })
            .collect(),
        ..SourceScan::default()
    };
    let mut files = Vec::new();
    let mut stack: Vec<PathBuf> = paths.to_vec();
    while let Some(p) = stack.pop() {
        let m = std::fs::symlink_metadata(&p).map_err(|e| LabError::io("read", &p, e))?;
        if m.is_dir() {
            s.dirs += 1;
            s.depth = s.depth.max(p.components().count() as u64);
            let Ok(rd) = std::fs::read_dir(&p) else {
                continue;
            };
            for e in rd.flatten() {
                stack.push(e.path());
            }
        } else if m.is_file() {
            let len = m.len();
            s.files += 1;
            s.bytes += len;
            let c = s
                .classes
                .iter_mut()
                .find(|c| c.up_to == 0 || len <= c.up_to)
                .expect("the last class is unbounded");
            c.files += 1;
            c.bytes += len;
            files.push((p, len));
        } else {
            s.others += 1;
        }
    }
    s.scan_secs = t.elapsed().as_secs_f64();
    s.walk_secs = walk(paths);
    Ok((s, files))
}

/// Seconds to walk `paths` as a run with nothing changed does, less its own
/// work: every entry's metadata, every directory's listing, no file read.
pub(crate) fn walk(paths: &[PathBuf]) -> f64 {
    let t = Instant::now();
    let mut stack: Vec<PathBuf> = paths.to_vec();
    while let Some(p) = stack.pop() {
        let Ok(m) = std::fs::symlink_metadata(&p) else {
            continue;
        };
        if m.is_dir() {
            if let Ok(rd) = std::fs::read_dir(&p) {
                stack.extend(rd.flatten().map(|e| e.path()));
            }
        }
    }
    t.elapsed().as_secs_f64()
}

/// The subtree of the source that stands for it in a run with nothing
/// changed: the directory holding the most files up to 10,000, of at most
/// 64 MiB in all (its first backup reads them), and at least 1,000 (fewer
/// take too little time to tell from the noise). None when no directory
/// fits.
///
/// A whole subtree, because capsule's walk of a subtree costs about the
/// same multiple of a plain walk of it as for the whole tree (0.43–0.63
/// here on four parts of `/usr/share` and the whole of it), whereas the
/// small sample's seventy separate leaves cost 2 times their walk: each
/// source and the directories above it cost a run more than a directory
/// within. The largest that fits, not one at random, so that estimates in
/// a row agree.
pub(crate) fn walk_sample(files: &[(PathBuf, u64)], roots: &[PathBuf]) -> Option<PathBuf> {
    use std::collections::HashMap;
    use std::ffi::OsStr;
    let mut per_dir: HashMap<&OsStr, (u64, u64)> = HashMap::new();
    for (p, n) in files {
        let Some(root) = roots.iter().find(|r| p.starts_with(r)) else {
            continue;
        };
        for dir in p.ancestors().skip(1) {
            let e = per_dir.entry(dir.as_os_str()).or_default();
            e.0 += 1;
            e.1 += n;
            if dir == root.as_path() {
                break;
            }
        }
    }
    per_dir
        .into_iter()
        .filter(|(_, (n, bytes))| (1_000..=10_000).contains(n) && *bytes <= 64 << 20)
        .max_by_key(|(d, (n, _))| (*n, std::cmp::Reverse(*d)))
        .map(|(d, _)| PathBuf::from(d))
}

/// Seconds per unchanged file in a run with nothing changed, for a source
/// whose plain walk took `source_walk` seconds over `source_files`
/// files: the sample's no-change run less an empty one's, per second of
/// the sample's own walk, times the source's walk.
///
/// A sample's figure per file does not carry over by itself: a directory
/// costs more than a file (a listing, a tree to read and one to write), and
/// a subtree has its own files per directory. The plain walk pays the same
/// shape of costs, so the ratio to it does carry over.
pub fn unchanged_per_file(
    sample_unchanged: f64,
    empty_unchanged: f64,
    sample_walk: f64,
    source_walk: f64,
    source_files: u64,
) -> Option<f64> {
    (sample_walk > 0.0 && source_walk > 0.0 && source_files > 0).then(|| {
        (sample_unchanged - empty_unchanged).max(0.0) / sample_walk * source_walk
            / source_files as f64
    })
}

/// Leaf directories (no subdirectories) of small files, spread over the
/// source, with about `want` files in all.
///
/// A leaf counts as small when its files average at most 64 KiB and none
/// is over 1 MiB. Taking any leaf with one small file in it let a directory
/// of a few large files (`/usr/share/package-lists`: 13 files, 95 MB) into
/// the small sample now and then; the two samples then no longer told the
/// cost per file from the cost per byte, and one estimate in five said
/// 19.8 s for a backup the others put at 4.8–5.9 s.
pub(crate) fn small_dirs(files: &[(PathBuf, u64)], want: u64, seed: u64) -> Vec<PathBuf> {
    use std::collections::BTreeMap;
    // Files, bytes and the largest file of each directory.
    let mut per_dir: BTreeMap<&Path, (u64, u64, u64)> = BTreeMap::new();
    for (p, n) in files {
        if let Some(d) = p.parent() {
            let e = per_dir.entry(d).or_default();
            e.0 += 1;
            e.1 += n;
            e.2 = e.2.max(*n);
        }
    }
    let leaves: Vec<(&Path, u64)> = per_dir
        .iter()
        .filter(|(d, (all, bytes, largest))| {
            *bytes <= *all * (64 << 10)
                && *largest <= 1 << 20
                && std::fs::read_dir(d).is_ok_and(|rd| {
                    rd.flatten()
                        .all(|e| e.file_type().is_ok_and(|t| !t.is_dir()))
                })
        })
        .map(|(d, (all, _, _))| (*d, *all))
        .collect();
    // Leaves of at most half the sample each, where there are any: one leaf
    // of 18,000 files made a sample 18 times the size of the others, read
    // in a different way (one directory, one reader at a time).
    let fitting: Vec<(&Path, u64)> = leaves
        .iter()
        .copied()
        .filter(|(_, n)| *n <= want.div_ceil(2))
        .collect();
    let leaves = if fitting.is_empty() { leaves } else { fitting };
    let total: u64 = leaves.iter().map(|(_, n)| n).sum();
    // Every step-th leaf: about `want` files when the leaves taken hold the
    // average number of files. When they hold fewer, further passes take
    // the leaves halfway between, until there are enough.
    let step = (total / want.max(1)).max(1) as usize;
    let mut taken = vec![false; leaves.len()];
    let mut out = Vec::new();
    let mut got = 0;
    // Where the first pass starts: random, so that estimates in a row
    // sample other files, and one run after another still sees a cold
    // source as cold (the files a first estimate read are warm after it,
    // the rest of the source is not).
    // Within the leaves there are: a few leaves of many files each make a
    // step longer than the list.
    let mut offset = (seed % step.min(leaves.len()).max(1) as u64) as usize;
    let mut stride = step;
    while got < want && offset < leaves.len() {
        for (i, (d, n)) in leaves.iter().enumerate().skip(offset).step_by(step) {
            if got >= want {
                break;
            }
            if !std::mem::replace(&mut taken[i], true) {
                out.push(d.to_path_buf());
                got += n;
            }
        }
        if stride <= 1 {
            break;
        }
        stride /= 2;
        offset += stride;
    }
    out
}

/// Drops the pages of `paths` (files, or directories of files) from the
/// page cache, so that the next read of them is a read from the disk, as
/// it is for a source not read lately. Only clean pages go, and only as
/// far as the kernel agrees: this is advice (`POSIX_FADV_DONTNEED`).
pub(crate) fn evict(paths: &[PathBuf]) {
    fn one(p: &Path) {
        // macOS has no such advice: its caches are dropped by `purge`
        // alone, for the whole machine, which a measurement must not do.
        #[cfg(target_os = "linux")]
        if let Ok(f) = std::fs::File::open(p) {
            let _ = rustix::fs::fadvise(&f, 0, None, rustix::fs::Advice::DontNeed);
        }
        #[cfg(not(target_os = "linux"))]
        let _ = p;
    }
    for p in paths {
        match std::fs::read_dir(p) {
            Ok(rd) => rd
                .flatten()
                .filter(|e| e.file_type().is_ok_and(|t| t.is_file()))
                .for_each(|e| one(&e.path())),
            Err(_) => one(p),
        }
    }
}

/// Whether `f`'s first page is in the page cache: a read with
/// `RWF_NOWAIT` succeeds only from it. `None` where that cannot be told
/// (an older kernel; macOS has no such read).
fn in_cache(f: &std::fs::File, buf: &mut [u8]) -> Option<bool> {
    #[cfg(target_os = "linux")]
    {
        let mut bufs = [std::io::IoSliceMut::new(buf)];
        match rustix::io::preadv2(f, &mut bufs, 0, rustix::io::ReadWriteFlags::NOWAIT) {
            Ok(_) => Some(true),
            Err(rustix::io::Errno::AGAIN) => Some(false),
            Err(_) => None,
        }
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = (f, buf);
        None
    }
}

/// The share of the source's files whose first page is in the page cache,
/// from up to 256 drawn at random: a read with `RWF_NOWAIT` succeeds only
/// from the cache, and reads nothing from the disk when it fails (so it
/// warms nothing). 0 where it cannot be told (an older kernel).
pub(crate) fn cached_share(files: &[(PathBuf, u64)], mut seed: u64) -> f64 {
    let nonempty: Vec<&PathBuf> = files
        .iter()
        .filter(|(_, n)| *n > 0)
        .map(|(p, _)| p)
        .collect();
    if nonempty.is_empty() {
        return 0.0;
    }
    let (mut cached, mut asked) = (0u32, 0u32);
    let mut buf = [0u8; 1];
    for _ in 0..256.min(nonempty.len()) {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        let p = nonempty[(seed % nonempty.len() as u64) as usize];
        let Ok(f) = std::fs::File::open(p) else {
            continue;
        };
        match in_cache(&f, &mut buf) {
            Some(true) => {
                cached += 1;
                asked += 1;
            }
            Some(false) => asked += 1,
            // No RWF_NOWAIT here: say nothing is cached, the cautious side.
            None => return 0.0,
        }
    }
    if asked == 0 {
        0.0
    } else {
        f64::from(cached) / f64::from(asked)
    }
}
