//! First backups of several machines at once upload what they share once.
//!
//! Eight machines set up on one evening back up the same system files,
//! photos and installers at the same moment. Each starts from the same
//! index, so without a word between them each uploads the shared data
//! itself (the 32-client benchmark sent 3.1–3.5× the distinct data in its
//! first round; a prune gives the storage back, not the uplink).
//!
//! A first backup (one with no parent snapshot) that sees other writers'
//! sessions on the destination (backups and copies; not a mount, a check or
//! a prune) does two things:
//!
//! * **It learns what landed meanwhile.** Every few seconds it lists
//!   `index/` and reads the index files written since it loaded the index,
//!   so a blob another machine stored a minute ago is not sent again (the
//!   staggered start).
//! * **It claims each large blob before sending it.** A claim is an empty
//!   object `claims/<blob id>/<session id>`; after writing it, the client
//!   lists the blob's claims, and the earliest claim (by the destination's
//!   clock, then by name) of a session still on the destination wins. The
//!   winner packs and uploads the blob. A loser keeps the sealed blob in a
//!   temporary file and, once its own packs are indexed, waits for the
//!   winner's index file: a blob that appears is referred to where it
//!   lies; one whose winner ended, failed or did not answer in time is
//!   uploaded after all (the simultaneous start).
//!
//! Claims only ever decide who sends a blob first, never whether it is
//! stored: every blob a snapshot refers to is in an index file before the
//! snapshot is written, and a pack learned from another machine's index is
//! protected at commit as this backup's own packs are (the packs it refers
//! to go into `packs_indexed`, which the lease check and the prune marks'
//! reindexing consult). Two clients that list each other's claims in
//! different orders may both win and upload the blob twice; none can both
//! lose, since the winner is a function of the listing both see once both
//! claims are written. A claim left by a client that died is ignored once
//! its session is gone, and a prune deletes claims of sessions that ended.

use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use capsule_backend::ErrorKind;
use capsule_format::layout::FileType;
use capsule_format::{BlobId, BlobType, ObjectId};

use crate::error::{EngineError, Result};
use crate::index::{load_index_file, MasterIndex};
use crate::repo::{pack_name, Repository};
use crate::session::SESSIONS_PREFIX;

/// Where claims live: `claims/<blob id>/<session id>`, empty objects.
pub const CLAIMS_PREFIX: &str = "claims/";

/// Blobs smaller than this are not claimed: a claim costs three small
/// requests, worth it against a chunk (about 1 MiB on average), not
/// against a 4 KiB file packed with thousands of others.
pub const CLAIM_MIN: usize = 64 << 10;

/// How long a backup whose blobs other machines claimed waits, after its
/// own packs are indexed, for theirs to be indexed. The machines of one
/// evening finish within seconds of each other; a winner that takes
/// longer costs one upload of what it claimed, never the backup.
const WAIT_FOR_WINNERS: Duration = Duration::from_secs(60);

/// How often the sessions and the index files are listed while others
/// are writing (at least: ten times the last listing's time, so a
/// destination with thousands of index files is not listed back to back).
const LOOK_EVERY: Duration = Duration::from_secs(2);

/// A blob another machine claimed first, kept sealed in the spill file.
struct Deferred {
    t: BlobType,
    id: BlobId,
    offset: u64,
    len: usize,
    raw_len: usize,
    winner: String,
}

/// Blobs of packs other machines indexed during this run.
#[derive(Default)]
struct Learned {
    /// Blob to the position of its pack in `packs`.
    blobs: HashMap<BlobId, usize>,
    /// Name and size of each pack, and whether this backup refers to it.
    packs: Vec<(String, u64, bool)>,
    /// Index files read (at load, learned since, or written by this run).
    files: HashSet<ObjectId>,
}

/// What the claim said.
pub(crate) enum Claim {
    /// Ours to upload.
    Won,
    /// Another session (this ID) claimed it first.
    Lost(String),
}

/// One first backup's part in the rendezvous; see the module docs.
pub struct Rendezvous {
    repo: Arc<Repository>,
    me: String,
    /// Sessions of other writers on the destination (as last listed).
    others: RwLock<HashSet<String>>,
    /// Whether each session seen holds a writer (a backup or a copy):
    /// read once per session, since a mount, a check or a prune beside a
    /// first backup is no reason to claim.
    writers: Mutex<HashMap<String, bool>>,
    learned: RwLock<Learned>,
    /// Our claim objects, deleted at the end.
    claims: Mutex<Vec<String>>,
    deferred: Mutex<(Option<File>, u64, Vec<Deferred>)>,
    spill_dir: std::path::PathBuf,
    stop: Arc<AtomicBool>,
    watcher: Mutex<Option<JoinHandle<()>>>,
}

impl Rendezvous {
    /// Starts the rendezvous of the backup holding session `me`, whose
    /// index was loaded as `index`: learns what landed since the load and
    /// keeps looking in the background while other sessions are listed.
    pub fn start(repo: Arc<Repository>, me: String, index: &MasterIndex) -> Result<Arc<Self>> {
        crate::pause::test_pause("rendezvous");
        let r = Arc::new(Rendezvous {
            repo,
            me,
            others: RwLock::default(),
            writers: Mutex::default(),
            learned: RwLock::new(Learned {
                files: index.files().iter().copied().collect(),
                ..Learned::default()
            }),
            claims: Mutex::default(),
            deferred: Mutex::new((None, 0, Vec::new())),
            spill_dir: std::env::temp_dir(),
            stop: Arc::default(),
            watcher: Mutex::default(),
        });
        r.look()?;
        let w = Arc::downgrade(&r);
        let stop = r.stop.clone();
        let h = std::thread::Builder::new()
            .name("rendezvous".into())
            .spawn(move || {
                let mut pause = LOOK_EVERY;
                // Bounded by the backup: it sets `stop` when it ends.
                while !stop.load(Ordering::Relaxed) {
                    let t = Instant::now();
                    while t.elapsed() < pause && !stop.load(Ordering::Relaxed) {
                        std::thread::sleep(Duration::from_millis(100));
                    }
                    let Some(r) = w.upgrade() else { return };
                    if stop.load(Ordering::Relaxed) || !r.active() {
                        // Alone: nothing to learn until someone else
                        // starts, which the sessions listing tells.
                        let _ = r.list_others();
                        continue;
                    }
                    let t = Instant::now();
                    // A failed look is only a missed chance to save an
                    // upload: the backup goes on and reports its own errors.
                    let _ = r.look();
                    pause = LOOK_EVERY.max(t.elapsed() * 10);
                }
            })
            .map_err(|e| EngineError::Invalid(format!("rendezvous thread: {e}")))?;
        *r.watcher.lock().unwrap_or_else(|p| p.into_inner()) = Some(h);
        Ok(r)
    }

    /// Whether other writers are on the destination (claims are made only
    /// then).
    pub fn active(&self) -> bool {
        !self.read_others().is_empty()
    }

    fn read_others(&self) -> std::sync::RwLockReadGuard<'_, HashSet<String>> {
        self.others.read().unwrap_or_else(|p| p.into_inner())
    }

    /// Lists the sessions, then the index files landed since the last look.
    fn look(&self) -> Result<()> {
        self.list_others()?;
        self.learn()
    }

    fn list_others(&self) -> Result<()> {
        let objs = match self.repo.backend().list(SESSIONS_PREFIX) {
            Ok(o) => o,
            Err(e) if e.kind == ErrorKind::NotFound => Vec::new(),
            Err(e) => return Err(e.into()),
        };
        let mut writers = self.writers.lock().unwrap_or_else(|p| p.into_inner());
        let mut ids = HashSet::new();
        for o in &objs {
            let Some(id) = o
                .name
                .strip_prefix(SESSIONS_PREFIX)
                .and_then(|n| n.split('-').next())
                .filter(|id| *id != self.me && !id.starts_with("probe"))
            else {
                continue;
            };
            let writer = *writers.entry(id.to_string()).or_insert_with(|| {
                // One that cannot be read (renewed or ended meanwhile,
                // damaged) counts as a writer: a claim too many costs
                // three requests, a claim too few an upload.
                crate::session::kind_of(&self.repo, &o.name).map_or(true, |k| k == "backup")
            });
            if writer {
                ids.insert(id.to_string());
            }
        }
        *self.others.write().unwrap_or_else(|p| p.into_inner()) = ids;
        Ok(())
    }

    /// Reads the index files not read yet.
    fn learn(&self) -> Result<()> {
        let listed = match self.repo.backend().list(FileType::Index.prefix()) {
            Ok(o) => o,
            Err(e) if e.kind == ErrorKind::NotFound => Vec::new(),
            Err(e) => return Err(e.into()),
        };
        let new: Vec<ObjectId> = {
            let l = self.learned.read().unwrap_or_else(|p| p.into_inner());
            listed
                .iter()
                .filter_map(|o| FileType::id_of(&o.name))
                .filter(|id| !l.files.contains(id))
                .collect()
        };
        for id in new {
            let f = match load_index_file(&*self.repo, &id) {
                Ok(f) => f,
                // Superseded and deleted by a prune since the listing: the
                // file that replaced it is read at the next look.
                Err(EngineError::Backend(e)) if e.kind == ErrorKind::NotFound => continue,
                Err(e) => return Err(e),
            };
            let mut l = self.learned.write().unwrap_or_else(|p| p.into_inner());
            l.files.insert(id);
            for p in f.packs {
                let t = p.entries.first().map_or(BlobType::Data, |e| e.blob_type);
                let at = l.packs.len();
                l.packs.push((pack_name(&p.id, t), p.size, false));
                for e in p.entries {
                    l.blobs.entry(e.id).or_insert(at);
                }
            }
        }
        Ok(())
    }

    /// Records an index file this backup wrote, so it is not read back.
    pub(crate) fn wrote_index(&self, id: ObjectId) {
        self.learned
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .files
            .insert(id);
    }

    /// Whether another machine indexed `id` during this run; if so, this
    /// backup now refers to the pack that holds it.
    pub(crate) fn knows(&self, id: &BlobId) -> bool {
        let at = {
            let l = self.learned.read().unwrap_or_else(|p| p.into_inner());
            match l.blobs.get(id) {
                None => return false,
                Some(&at) if l.packs[at].2 => return true,
                Some(&at) => at,
            }
        };
        self.learned
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .packs[at]
            .2 = true;
        true
    }

    /// Claims blob `id`. A claim that cannot be made or listed counts as
    /// won: the blob is then simply uploaded, as without a rendezvous.
    pub(crate) fn claim(&self, id: &BlobId) -> Claim {
        let dir = format!("{CLAIMS_PREFIX}{}/", id.0.to_hex());
        let mine = format!("{dir}{}", self.me);
        let backend = self.repo.backend();
        if backend.put(&mine, b"").is_err() {
            return Claim::Won;
        }
        self.claims
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(mine);
        let Ok(listed) = backend.list(&dir) else {
            return Claim::Won;
        };
        let others = self.read_others();
        let winner = listed
            .iter()
            .filter_map(|o| Some((o.modified.unwrap_or(0), o.name.strip_prefix(&dir)?)))
            .filter(|(_, s)| *s == self.me || others.contains(*s))
            .min();
        match winner {
            Some((_, w)) if w != self.me => Claim::Lost(w.to_string()),
            _ => Claim::Won,
        }
    }

    /// Keeps a sealed blob another session claimed until the end.
    pub(crate) fn defer(
        &self,
        t: BlobType,
        id: BlobId,
        env: &[u8],
        raw_len: usize,
        winner: String,
    ) -> Result<()> {
        let mut d = self.deferred.lock().unwrap_or_else(|p| p.into_inner());
        let io = |e| {
            EngineError::io(
                "writing a temporary file of blobs another machine is sending (set TMPDIR to a directory with room) in",
                &self.spill_dir,
                e,
            )
        };
        if d.0.is_none() {
            d.0 = Some(tempfile::tempfile_in(&self.spill_dir).map_err(io)?);
        }
        let offset = d.1;
        if let Some(f) = d.0.as_mut() {
            f.write_all(env).map_err(io)?;
        }
        d.1 += env.len() as u64;
        d.2.push(Deferred {
            t,
            id,
            offset,
            len: env.len(),
            raw_len,
            winner,
        });
        Ok(())
    }

    /// After this backup's own packs are indexed: deletes its claims, then
    /// waits (at most [`WAIT_FOR_WINNERS`]) for the blobs others claimed to
    /// be indexed. Calls `upload` with each blob still missing (type, ID,
    /// sealed bytes, plaintext length) and returns how many blobs and
    /// sealed bytes others stored for this backup.
    pub(crate) fn settle(
        &self,
        mut upload: impl FnMut(BlobType, BlobId, &[u8], usize) -> Result<()>,
    ) -> Result<(u64, u64, u64)> {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(h) = self
            .watcher
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
        {
            let _ = h.join();
        }
        self.delete_claims();
        let (file, _, deferred) =
            std::mem::take(&mut *self.deferred.lock().unwrap_or_else(|p| p.into_inner()));
        if deferred.is_empty() {
            return Ok((0, 0, 0));
        }
        crate::pause::test_pause("claims-wait");
        let waited = Instant::now();
        let dead = self.dead_here();
        let mut missing: Vec<&Deferred> = deferred.iter().collect();
        for round in 0u32.. {
            if round > 0 {
                std::thread::sleep(Duration::from_millis(500));
            }
            if self.look().is_err() {
                break;
            }
            missing.retain(|d| !self.knows(&d.id));
            let others = self.read_others();
            let waiting = missing
                .iter()
                .any(|d| others.contains(&d.winner) && !dead.contains(&d.winner));
            if missing.is_empty() || !waiting || waited.elapsed() >= WAIT_FOR_WINNERS {
                break;
            }
        }
        let file =
            file.ok_or_else(|| EngineError::Invalid("deferred blobs without their file".into()))?;
        let mut buf = Vec::new();
        for d in &missing {
            buf.resize(d.len, 0);
            file.read_exact_at(&mut buf, d.offset).map_err(|e| {
                EngineError::io(
                    "reading the temporary file of blobs another machine was sending in",
                    &self.spill_dir,
                    e,
                )
            })?;
            upload(d.t, d.id, &buf, d.raw_len)?;
        }
        let others_stored: Vec<&Deferred> = deferred
            .iter()
            .filter(|d| !missing.iter().any(|m| m.id == d.id))
            .collect();
        Ok((
            others_stored.len() as u64,
            others_stored.iter().map(|d| d.raw_len as u64).sum(),
            others_stored.iter().map(|d| d.len as u64).sum(),
        ))
    }

    /// Sessions of this machine whose process is gone: a backup killed
    /// here left them, and its claims (the usual case when a first backup
    /// is run again after a crash) are not worth waiting for. Other
    /// machines' sessions cannot be judged from here; they are waited for
    /// as long as they are on the destination, within the bound.
    fn dead_here(&self) -> HashSet<String> {
        let me = crate::repo::hostname();
        crate::session::list_sessions(&self.repo)
            .unwrap_or_default()
            .into_iter()
            .filter(|(_, _, i)| i.hostname == me && !crate::platform::alive(i.pid))
            .map(|(id, _, _)| id)
            .collect()
    }

    /// Deletes this backup's claims, several at a time (best effort: a
    /// prune deletes those of ended sessions).
    fn delete_claims(&self) {
        let claims = std::mem::take(&mut *self.claims.lock().unwrap_or_else(|p| p.into_inner()));
        let width = self.repo.backend().capabilities().concurrency.clamp(1, 8);
        let next = std::sync::atomic::AtomicUsize::new(0);
        std::thread::scope(|s| {
            for _ in 0..width {
                s.spawn(|| loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some(c) = claims.get(i) else { break };
                    let _ = self.repo.backend().delete(c);
                });
            }
        });
    }

    /// Names and sizes of the packs of other machines this backup refers to.
    pub(crate) fn packs_used(&self) -> Vec<(String, u64)> {
        self.learned
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .packs
            .iter()
            .filter(|p| p.2)
            .map(|(n, s, _)| (n.clone(), *s))
            .collect()
    }
}

impl Drop for Rendezvous {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// Deletes the claims of sessions no longer on the destination (a prune's
/// chore: a client that died leaves its claims behind). Returns how many.
pub fn sweep_claims(repo: &Repository, live: &HashSet<String>) -> Result<usize> {
    let listed = match repo.backend().list(CLAIMS_PREFIX) {
        Ok(o) => o,
        Err(e) if e.kind == ErrorKind::NotFound => return Ok(0),
        Err(e) => return Err(e.into()),
    };
    let mut n = 0;
    for o in listed {
        let session = Path::new(&o.name)
            .file_name()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default();
        if !live.contains(&session) {
            repo.backend().delete(&o.name)?;
            n += 1;
        }
    }
    Ok(n)
}
