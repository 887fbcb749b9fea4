//! Source snapshots: before a backup reads anything, a read-only snapshot
//! of each file system that holds a source, so that every file is stored
//! as it was at one instant (Time Machine's APFS snapshot, VSS on
//! Windows). The backup reads the snapshot through [`Frozen::physical`]
//! and records every path, device number and hard link as the original's.
//!
//! Kinds here: btrfs (a read-only subvolume snapshot), LVM (a thin or
//! classic snapshot, mounted read-only), ZFS, and APFS on macOS (a local
//! snapshot, as Time Machine's, mounted read-only). Windows VSS would
//! implement [`Snapshotter`] the same way.
//!
//! Names: every snapshot capsule makes is named `capsule-<unix>-<pid>`
//! (LVM adds the origin's name), so a later run, or `capsule repair`,
//! removes those a killed run left behind ([`is_ours`]), and never one
//! that another tool made or that a running capsule still reads.

mod apfs;
#[cfg(target_os = "linux")]
mod btrfs;
#[cfg(target_os = "linux")]
mod btrfs_ioctl;
mod error;
mod lvm;
pub mod mounts;
mod tool;
#[cfg(target_os = "linux")]
mod trusted;
mod zfs;

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

pub use error::SnapError;
use mounts::Mount;

/// The directory at a btrfs subvolume's root that holds capsule's
/// snapshots of it. Backups and the change journal leave it out.
pub const DIR_NAME: &str = ".capsule-snapshots";

const PREFIX: &str = "capsule-";

/// What a backup does about snapshots (`source-snapshot` in a profile,
/// `--source-snapshot`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Mode {
    /// Read live files.
    #[default]
    Off,
    /// Snapshot what the file systems offer; read live files, saying so
    /// once, where they offer nothing.
    Auto,
    /// Require this kind: a clear error where it cannot be taken.
    Kind(Kind),
}

#[cfg(target_os = "linux")]
use btrfs::Pin;
/// No btrfs here: nothing is pinned.
#[cfg(not(target_os = "linux"))]
#[derive(Debug)]
struct Pin;

/// A kind of snapshot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A read-only btrfs subvolume snapshot.
    Btrfs,
    /// An LVM snapshot, mounted read-only.
    Lvm,
    /// A ZFS snapshot.
    Zfs,
    /// An APFS local snapshot (macOS), mounted read-only.
    Apfs,
}

impl std::fmt::Display for Kind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Kind::Btrfs => "btrfs",
            Kind::Lvm => "lvm",
            Kind::Zfs => "zfs",
            Kind::Apfs => "apfs",
        })
    }
}

impl std::fmt::Display for Mode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Mode::Off => f.write_str("off"),
            Mode::Auto => f.write_str("auto"),
            Mode::Kind(k) => k.fmt(f),
        }
    }
}

impl std::str::FromStr for Mode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Ok(match s {
            "off" => Mode::Off,
            "auto" => Mode::Auto,
            "btrfs" => Mode::Kind(Kind::Btrfs),
            "lvm" => Mode::Kind(Kind::Lvm),
            "zfs" => Mode::Kind(Kind::Zfs),
            "apfs" => Mode::Kind(Kind::Apfs),
            _ => {
                return Err(format!(
                    "source-snapshot {s:?}: expected auto, apfs, btrfs, lvm, zfs or off"
                ))
            }
        })
    }
}

/// One snapshot taken.
#[derive(Debug, Clone)]
pub struct Taken {
    /// Its kind.
    pub kind: Kind,
    /// The root of what it is a snapshot of, as the sources name it.
    pub origin: PathBuf,
    /// Where the snapshot's copy of `origin` is read.
    pub view: PathBuf,
    /// Its name (`capsule-<unix>-<pid>`…).
    pub name: String,
    /// What its tool calls it (a path, `vg/lv`, `dataset@name`).
    pub handle: String,
    /// For btrfs: the snapshot held open, with its recorded identity, by
    /// which alone it is removed.
    #[cfg_attr(not(target_os = "linux"), allow(dead_code))] // btrfs only
    pin: Option<std::sync::Arc<Pin>>,
    /// For LVM and ZFS: the identity the volume manager gave it when it
    /// was made or found (the LV's UUID, the snapshot's GUID). Names in
    /// those namespaces can be reused; the identity cannot, and only a
    /// snapshot that still carries it is removed.
    ident: Option<String>,
}

/// What [`Snapshotter::leftovers`] found.
#[derive(Debug, Default)]
pub struct Leftovers {
    /// capsule's own snapshots of runs that are gone: to remove.
    pub found: Vec<Taken>,
    /// What looks like one but capsule did not record as its own: left
    /// as it is, and said.
    pub kept: Vec<String>,
}

/// A kind of file-system snapshot.
pub trait Snapshotter: Send + Sync {
    /// Which kind.
    fn kind(&self) -> Kind;
    /// The root of the volume holding `path` (on `mount`): what a
    /// snapshot copies.
    fn volume(&self, path: &Path, mount: &Mount) -> Result<PathBuf, SnapError>;
    /// Takes a read-only snapshot named `name` of the volume at `root`.
    fn create(&self, root: &Path, mount: &Mount, name: &str) -> Result<Taken, SnapError>;
    /// Removes a snapshot this kind took.
    fn remove(&self, taken: &Taken) -> Result<(), SnapError>;
    /// capsule's snapshots of the volume at `root` whose run is gone.
    fn leftovers(&self, root: &Path, mount: &Mount) -> Result<Leftovers, SnapError>;
}

fn snapshotter(k: Kind) -> &'static dyn Snapshotter {
    match k {
        #[cfg(target_os = "linux")]
        Kind::Btrfs => &btrfs::Btrfs,
        #[cfg(not(target_os = "linux"))]
        Kind::Btrfs => &Unavailable(Kind::Btrfs),
        Kind::Lvm => &lvm::Lvm,
        Kind::Zfs => &zfs::Zfs,
        Kind::Apfs => &apfs::Apfs,
    }
}

/// A kind this system does not have (btrfs off Linux): never chosen by
/// `auto` (no file system here is of that kind), and named clearly when
/// asked for.
#[cfg(not(target_os = "linux"))]
struct Unavailable(Kind);

#[cfg(not(target_os = "linux"))]
impl Unavailable {
    fn no(&self) -> SnapError {
        SnapError::Unsupported(format!(
            "{} snapshots are not available on this system",
            self.0
        ))
    }
}

#[cfg(not(target_os = "linux"))]
impl Snapshotter for Unavailable {
    fn kind(&self) -> Kind {
        self.0
    }
    fn volume(&self, _: &Path, _: &Mount) -> Result<PathBuf, SnapError> {
        Err(self.no())
    }
    fn create(&self, _: &Path, _: &Mount, _: &str) -> Result<Taken, SnapError> {
        Err(self.no())
    }
    fn remove(&self, _: &Taken) -> Result<(), SnapError> {
        Err(self.no())
    }
    fn leftovers(&self, _: &Path, _: &Mount) -> Result<Leftovers, SnapError> {
        Err(self.no())
    }
}

/// The kind of snapshot the file system of `mount` can take.
pub fn kind_of(mount: &Mount) -> Option<Kind> {
    match mount.fstype.as_str() {
        "btrfs" => Some(Kind::Btrfs),
        "zfs" => Some(Kind::Zfs),
        "apfs" => Some(Kind::Apfs),
        _ if lvm::is_lv(mount) => Some(Kind::Lvm),
        _ => None,
    }
}

/// `Some(true)` for a capsule snapshot name whose run still runs,
/// `Some(false)` for one whose run is gone (a leftover), `None` for a name
/// capsule did not give.
pub fn is_ours(name: &str) -> Option<bool> {
    let mut f = name.strip_prefix(PREFIX)?.split('-');
    let unix: i64 = f.next()?.parse().ok()?;
    let pid: u32 = f.next()?.parse().ok()?;
    Some(running_since(pid).is_some_and(|started| started <= unix + 2))
}

/// When process `pid` started (Unix seconds), if it runs.
#[allow(unsafe_code)]
#[cfg(target_os = "macos")]
fn running_since(pid: u32) -> Option<i64> {
    let mut info = std::mem::MaybeUninit::<libc::proc_bsdinfo>::zeroed();
    let size = std::mem::size_of::<libc::proc_bsdinfo>() as libc::c_int;
    // SAFETY: a buffer of the size given, for the struct this flavour
    // writes.
    let n = unsafe {
        libc::proc_pidinfo(
            pid as libc::c_int,
            libc::PROC_PIDTBSDINFO,
            0,
            info.as_mut_ptr().cast(),
            size,
        )
    };
    // SAFETY: written whole when the call returned its size.
    (n == size).then(|| unsafe { info.assume_init() }.pbi_start_tvsec as i64)
}

/// When process `pid` started (Unix seconds), if it runs.
#[cfg(not(target_os = "macos"))]
fn running_since(pid: u32) -> Option<i64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name (which may hold spaces), from the
    // third: the start time is the 22nd, in clock ticks since boot.
    let after = &stat[stat.rfind(')')? + 1..];
    let ticks: u64 = after.split_whitespace().nth(19)?.parse().ok()?;
    let boot: i64 = std::fs::read_to_string("/proc/stat")
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix("btime ")?.trim().parse().ok())?;
    let hz = rustix::param::clock_ticks_per_second().max(1);
    Some(boot + (ticks / hz) as i64)
}

/// A snapshot being read.
struct Held {
    taken: Taken,
    /// The view's device and inode when taken: someone removing the
    /// snapshot under the run changes them.
    view_id: (u64, u64),
    /// The original's device: what the stored snapshot records.
    origin_dev: u64,
    /// For btrfs, the file system's own device: what the empty
    /// directories standing for nested subvolumes show.
    #[cfg_attr(not(target_os = "linux"), allow(dead_code))] // btrfs only
    fs_dev: Option<u64>,
}

/// The snapshots a backup reads, removed when it is done (or dropped).
pub struct Frozen {
    name: String,
    held: Mutex<Vec<Held>>,
    /// Nested subvolumes snapshotted so far (their snapshots' names).
    #[cfg_attr(not(target_os = "linux"), allow(dead_code))] // btrfs only
    nested: std::sync::atomic::AtomicU32,
}

/// What [`freeze`] did.
#[derive(Default)]
pub struct Outcome {
    /// The snapshots to read; `None`: read live files.
    pub frozen: Option<Frozen>,
    /// What the run should say: why it reads live files (with `auto`),
    /// and leftover snapshots it removed.
    pub notes: Vec<String>,
}

fn dev_of(m: &Mount) -> Option<u64> {
    let (a, b) = m.dev.split_once(':')?;
    #[allow(clippy::unnecessary_cast)] // a u64 on Linux, an i32 on macOS
    Some(rustix::fs::makedev(a.parse().ok()?, b.parse().ok()?) as u64)
}

/// The volumes the sources lie on (with what lies mounted below them,
/// unless `one_file_system`), and the kind of each.
fn volumes(
    mode: Mode,
    sources: &[PathBuf],
    one_file_system: bool,
) -> Result<Vec<(PathBuf, Mount, Kind)>, SnapError> {
    let table = mounts::table();
    let mut places = Vec::new();
    for s in sources {
        // A missing source is the backup's to report.
        let Ok(real) = std::fs::canonicalize(s) else {
            continue;
        };
        let m = mounts::holding(&real, &table)
            .ok_or_else(|| SnapError::Unsupported(format!("no mount holds {}", real.display())))?;
        places.push((real.clone(), m.clone(), None));
        if !one_file_system {
            for b in mounts::below(&real, &table) {
                places.push((b.point.clone(), b.clone(), Some(s.clone())));
            }
        }
    }
    let mut out: Vec<(PathBuf, Mount, Kind)> = Vec::new();
    for (path, m, spans) in places {
        let kind = match (mode, kind_of(&m)) {
            (Mode::Auto, Some(k)) => k,
            (Mode::Kind(want), Some(k)) if k == want => k,
            (_, found) => {
                let what = match found {
                    Some(k) => format!("a {k} file system"),
                    None => format!("{} (no snapshots)", m.fstype),
                };
                let want = match mode {
                    Mode::Kind(k) => format!("a {k} snapshot"),
                    _ => "a snapshot".into(),
                };
                return Err(SnapError::Unsupported(match spans {
                    Some(src) => format!(
                        "source {} spans two file systems: {} is {what}, which cannot take {want}; back it up with one-file-system, or exclude it",
                        src.display(),
                        m.point.display()
                    ),
                    None => format!(
                        "{} is on {what} (mounted at {}), which cannot take {want}",
                        path.display(),
                        m.point.display()
                    ),
                }));
            }
        };
        let root = snapshotter(kind).volume(&path, &m)?;
        if !out.iter().any(|(r, _, _)| *r == root) {
            out.push((root, m, kind));
        }
    }
    Ok(out)
}

/// What [`clean`] did.
#[derive(Debug, Default)]
pub struct Cleaned {
    /// Every leftover removed, and every one left (with why).
    pub notes: Vec<String>,
    /// How many are left, or could not be looked for.
    pub left: usize,
}

/// Removes capsule's snapshots of the sources' volumes that runs which
/// are gone left behind (nested subvolumes' among them: they are kept
/// beside their top volume's); says which, and what is left.
pub fn clean(sources: &[PathBuf], one_file_system: bool) -> Cleaned {
    match volumes(Mode::Auto, sources, one_file_system) {
        Ok(vols) => clean_volumes(&vols),
        Err(e) => Cleaned {
            notes: vec![format!("looking for leftover source snapshots: {e}")],
            left: 0,
        },
    }
}

fn clean_volumes(vols: &[(PathBuf, Mount, Kind)]) -> Cleaned {
    let mut out = Cleaned::default();
    for (root, m, kind) in vols {
        let s = snapshotter(*kind);
        let found = match s.leftovers(root, m) {
            Ok(f) => f,
            Err(e) => {
                out.notes
                    .push(format!("looking for leftover source snapshots: {e}"));
                out.left += 1;
                continue;
            }
        };
        out.left += found.kept.len();
        out.notes.extend(found.kept);
        for t in found.found {
            out.notes.push(match s.remove(&t) {
                Ok(()) => format!(
                    "removed the source snapshot {} that an interrupted run left behind",
                    t.handle
                ),
                Err(e) => {
                    out.left += 1;
                    format!("a source snapshot an interrupted run left behind: {e}")
                }
            });
        }
    }
    out
}

/// Takes the snapshots `mode` asks for, of the file systems holding
/// `sources`, after removing leftovers of runs that are gone. With
/// `auto`, what keeps it from snapshotting becomes a note and the run
/// reads live files; a named kind makes it an error.
pub fn freeze(
    mode: Mode,
    sources: &[PathBuf],
    one_file_system: bool,
) -> Result<Outcome, SnapError> {
    if mode == Mode::Off {
        return Ok(Outcome::default());
    }
    let fallback = |e: SnapError| match mode {
        Mode::Auto => Ok(Outcome {
            frozen: None,
            notes: vec![format!("source-snapshot auto: reading live files: {e}")],
        }),
        _ => Err(e),
    };
    let vols = match volumes(mode, sources, one_file_system) {
        Ok(v) => v,
        Err(e) => return fallback(e),
    };
    let mut notes = clean_volumes(&vols).notes;
    let frozen = Frozen {
        name: format!(
            "{PREFIX}{}-{}",
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
            std::process::id()
        ),
        held: Mutex::new(Vec::new()),
        nested: std::sync::atomic::AtomicU32::new(0),
    };
    for (root, m, kind) in &vols {
        match frozen.take(*kind, root, m) {
            Ok(_) => continue,
            // With `auto`, a volume another user can change is read live
            // and the others from their snapshots.
            Err(e @ SnapError::Untrusted { .. }) if mode == Mode::Auto => {
                notes.push(format!(
                    "source-snapshot auto: reading {} live: {e}",
                    root.display()
                ));
                continue;
            }
            Err(e) => {
                // Dropping `frozen` removes what was taken.
                return fallback(e).map(|mut o| {
                    o.notes.append(&mut notes);
                    o
                });
            }
        }
    }
    Ok(Outcome {
        frozen: Some(frozen),
        notes,
    })
}

impl Frozen {
    fn held(&self) -> std::sync::MutexGuard<'_, Vec<Held>> {
        self.held.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn take(&self, kind: Kind, root: &Path, m: &Mount) -> Result<PathBuf, SnapError> {
        let taken = snapshotter(kind).create(root, m, &self.name)?;
        // APFS's data volume stands at `/` through firmlinks, where the
        // system volume's device shows: its device is its mount point's.
        let dev_at = (kind == Kind::Apfs).then(|| m.point.clone());
        self.hold(
            taken,
            (kind == Kind::Btrfs).then(|| dev_of(m)).flatten(),
            dev_at,
        )
    }

    /// Keeps `taken` to read, and to remove when done.
    fn hold(
        &self,
        taken: Taken,
        fs_dev: Option<u64>,
        dev_at: Option<PathBuf>,
    ) -> Result<PathBuf, SnapError> {
        let s = snapshotter(taken.kind);
        let root = dev_at.as_deref().unwrap_or(&taken.origin);
        let origin_dev = match std::fs::metadata(root) {
            Ok(m) => m.dev(),
            Err(e) => {
                let _ = s.remove(&taken);
                return Err(SnapError::io("read", root, e));
            }
        };
        let view = taken.view.clone();
        let id = match std::fs::metadata(&view) {
            Ok(v) => (v.dev(), v.ino()),
            Err(e) => {
                let _ = s.remove(&taken);
                return Err(SnapError::io("open the source snapshot", &view, e));
            }
        };
        self.held().push(Held {
            taken,
            view_id: id,
            origin_dev,
            fs_dev,
        });
        Ok(view)
    }

    /// The snapshots taken.
    pub fn taken(&self) -> Vec<Taken> {
        self.held().iter().map(|h| h.taken.clone()).collect()
    }

    /// Where `logical` (a path as the sources name it) is read: in the
    /// snapshot of the deepest volume holding it, or live.
    pub fn physical(&self, logical: &Path) -> PathBuf {
        let held = self.held();
        held.iter()
            .filter_map(|h| {
                let rest = logical.strip_prefix(&h.taken.origin).ok()?;
                Some((h.taken.origin.components().count(), &h.taken.view, rest))
            })
            .max_by_key(|(depth, _, _)| *depth)
            .map_or_else(
                || logical.to_path_buf(),
                |(_, view, rest)| {
                    if rest.as_os_str().is_empty() {
                        view.clone()
                    } else {
                        view.join(rest)
                    }
                },
            )
    }

    /// The original's device number for `dev` seen in a snapshot.
    pub fn device(&self, dev: u64) -> u64 {
        self.held()
            .iter()
            .find(|h| h.view_id.0 == dev)
            .map_or(dev, |h| h.origin_dev)
    }

    /// Whether an entry with this device and inode is the empty directory
    /// a btrfs snapshot shows for a subvolume of its own below the one
    /// snapshotted ([`Frozen::nested`] snapshots it).
    #[cfg(target_os = "linux")]
    pub fn is_nested_placeholder(&self, dev: u64, ino: u64) -> bool {
        ino == btrfs::NESTED_PLACEHOLDER_INODE && self.held().iter().any(|h| h.fs_dev == Some(dev))
    }

    /// No btrfs here: no placeholders.
    #[cfg(not(target_os = "linux"))]
    pub fn is_nested_placeholder(&self, _dev: u64, _ino: u64) -> bool {
        false
    }

    /// Snapshots the btrfs subvolume at `logical` (found as a placeholder
    /// in a snapshot of the one above it) and returns where it is read.
    /// It goes into the snapshot directory of the volume above it (never
    /// into the nested subvolume, which may be another user's), found
    /// from there without following links.
    #[cfg(not(target_os = "linux"))]
    pub fn nested(&self, logical: &Path) -> Result<PathBuf, SnapError> {
        Err(SnapError::Unsupported(format!(
            "no btrfs snapshot was taken above {}",
            logical.display()
        )))
    }

    /// Snapshots the btrfs subvolume at `logical` (found as a placeholder
    /// in a snapshot of the one above it) and returns where it is read.
    #[cfg(target_os = "linux")]
    pub fn nested(&self, logical: &Path) -> Result<PathBuf, SnapError> {
        let (top, fs_dev) = {
            let held = self.held();
            let h = held
                .iter()
                .filter(|h| h.taken.kind == Kind::Btrfs && logical.starts_with(&h.taken.origin))
                .max_by_key(|h| h.taken.origin.components().count())
                .ok_or_else(|| {
                    SnapError::Unsupported(format!(
                        "no btrfs snapshot was taken above {}",
                        logical.display()
                    ))
                })?;
            (h.taken.clone(), h.fs_dev)
        };
        let k = self
            .nested
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
            + 1;
        let taken = btrfs::nested(&top, logical, &format!("{}-n{k}", self.name))?;
        self.hold(taken, fs_dev, None)
    }

    /// Fails when a snapshot was removed, or replaced, since it was taken:
    /// what was read from it cannot be vouched for.
    pub fn check(&self) -> Result<(), SnapError> {
        for h in self.held().iter() {
            let now = std::fs::metadata(&h.taken.view).map(|v| (v.dev(), v.ino()));
            if now.ok() != Some(h.view_id) {
                return Err(SnapError::Vanished {
                    view: h.taken.view.display().to_string(),
                    origin: h.taken.origin.display().to_string(),
                });
            }
        }
        Ok(())
    }

    /// Removes the snapshots (nested ones first); what could not be
    /// removed is left for the next run, and said.
    pub fn release(self) -> Vec<String> {
        let held = std::mem::take(&mut *self.held());
        held.iter()
            .rev()
            .filter_map(|h| {
                snapshotter(h.taken.kind)
                    .remove(&h.taken)
                    .err()
                    .map(|e| format!("{e}; the next run removes it"))
            })
            .collect()
    }
}

impl Drop for Frozen {
    fn drop(&mut self) {
        let held = std::mem::take(&mut *self.held());
        for h in held.iter().rev() {
            let _ = snapshotter(h.taken.kind).remove(&h.taken);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_read_and_print_alike() {
        for s in ["auto", "apfs", "btrfs", "lvm", "zfs", "off"] {
            assert_eq!(s.parse::<Mode>().unwrap().to_string(), s);
        }
        assert!("vss".parse::<Mode>().unwrap_err().contains("expected auto"));
    }

    #[test]
    fn only_capsule_names_of_runs_that_are_gone_are_leftovers() {
        assert_eq!(is_ours("daily-2026"), None);
        assert_eq!(is_ours("capsule-x-1"), None);
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs();
        // This process: running, started before now.
        assert_eq!(
            is_ours(&format!("capsule-{now}-{}", std::process::id())),
            Some(true)
        );
        // This process's number, but a name older than the process: the
        // number was reused, the run that made it is gone.
        assert_eq!(
            is_ours(&format!("capsule-1000-{}", std::process::id())),
            Some(false)
        );
        // No such process (above the kernel's largest pid).
        assert_eq!(is_ours(&format!("capsule-{now}-4194305-home")), Some(false));
    }
}
