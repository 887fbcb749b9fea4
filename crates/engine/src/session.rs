//! Writer sessions: how a prune learns which backups are running.
//!
//! A backup holds a session from before it loads the index until after it
//! commits its snapshot. The session is a small sealed object,
//! `sessions/<session id>-<sequence>`, renewed every [`HEARTBEAT`] by
//! writing the next sequence number and then removing the previous one, so
//! there is always at least one object while the session lives. The
//! heartbeat time inside says when it was last renewed (the writer's clock).
//!
//! A prune never deletes a pack while a session that could have seen it in
//! the index is still held. A session whose heartbeat is older than the
//! lease (a crashed backup, or a laptop asleep for hours) may be *revoked*:
//! the prune deletes its objects, and only a later prune deletes packs on
//! the strength of that. The writer learns of it before it commits: its
//! newest session object is gone. It then checks that every pack it may
//! reference still exists, and commits nothing if one does not. It checks
//! again after committing, and takes its snapshot back if a pack went
//! missing in between (docs/DESIGN.md, "Prune").

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use capsule_backend::ErrorKind;
use capsule_crypto::Aad;
use capsule_format::snapshot::{from_json, to_json};
use capsule_format::FileType;
use serde::{Deserialize, Serialize};

use crate::error::{EngineError, Result};
use crate::repo::put_addressed;
use crate::repo::Repository;
use crate::timefmt::now_unix;

/// Where sessions live.
pub const SESSIONS_PREFIX: &str = FileType::Session.prefix();

/// How often a session is renewed.
pub const HEARTBEAT: Duration = Duration::from_secs(300);

/// A session not renewed for this long may be revoked by a prune: twelve
/// missed heartbeats.
pub const LEASE_SECS: i64 = 3600;

/// What a session object holds.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SessionInfo {
    /// Session ID (hex).
    pub id: String,
    /// Host of the writer.
    pub hostname: String,
    /// Its process ID.
    pub pid: u32,
    /// When the session began (Unix seconds, the writer's clock).
    pub started_unix: i64,
    /// When it was last renewed.
    pub heartbeat_unix: i64,
    /// Renewal count.
    pub seq: u64,
    /// What holds it: "backup", or "prune" (a prune's session only dates
    /// the destination's clock; marks do not wait for it).
    #[serde(default = "backup_kind")]
    pub kind: String,
    /// The session object could not be read (never stored: set by
    /// [`list_sessions`]).
    #[serde(skip)]
    pub damaged: bool,
    /// When the destination stored its newest object, by the destination's
    /// clock, where the listing says (never stored: set by
    /// [`list_sessions`]).
    #[serde(skip)]
    pub stored_unix: Option<i64>,
}

impl SessionInfo {
    /// Whether its lease has run out, as a prune judges it at `now` (its
    /// clock) and `destination_now` (the destination's time for the
    /// prune's own session object): by the heartbeat inside, or by the
    /// destination's own times, one clock for both objects. The second
    /// holds when the writer's clock was wrong: a laptop killed while its
    /// clock ran days ahead wrote a heartbeat no pruner's clock would reach
    /// for days, and every prune's marks waited for it.
    pub fn lease_over(&self, now: i64, destination_now: Option<i64>, lease_secs: i64) -> bool {
        now.saturating_sub(self.heartbeat_unix) > lease_secs
            || matches!((destination_now, self.stored_unix),
                (Some(d), Some(s)) if d.saturating_sub(s) > lease_secs)
    }
}

fn backup_kind() -> String {
    "backup".into()
}

fn object_name(id: &str, seq: u64) -> String {
    FileType::Session.name_hex(&format!("{id}-{seq:010}"))
}

/// A held session; renewed in the background until [`Session::end`] or drop.
pub struct Session {
    repo: Arc<Repository>,
    state: Arc<Mutex<State>>,
    stop: Option<crossbeam_channel::Sender<()>>,
    heartbeat: Option<std::thread::JoinHandle<()>>,
    revoked: Arc<AtomicBool>,
}

struct State {
    info: SessionInfo,
    /// The newest object written.
    name: String,
}

impl Session {
    /// Opens a backup's session: its first object is stored before this
    /// returns.
    pub fn start(repo: &Arc<Repository>) -> Result<Session> {
        Self::start_kind(repo, "backup")
    }

    /// Opens a session of the given kind.
    pub fn start_kind(repo: &Arc<Repository>, kind: &str) -> Result<Session> {
        let mut raw = [0u8; 12];
        capsule_crypto::random_bytes(&mut raw)?;
        let now = now_unix();
        let info = SessionInfo {
            id: hex::encode(raw),
            hostname: crate::repo::hostname(),
            pid: std::process::id(),
            started_unix: now,
            heartbeat_unix: now,
            seq: 0,
            kind: kind.into(),
            damaged: false,
            stored_unix: None,
        };
        let name = object_name(&info.id, 0);
        store(repo, &name, &info)?;
        let state = Arc::new(Mutex::new(State { info, name }));
        let revoked = Arc::new(AtomicBool::new(false));
        let (tx, rx) = crossbeam_channel::bounded::<()>(1);
        let heartbeat = {
            let (repo, state, revoked) = (repo.clone(), state.clone(), revoked.clone());
            std::thread::Builder::new()
                .name("session".into())
                .spawn(move || {
                    while let Err(crossbeam_channel::RecvTimeoutError::Timeout) =
                        rx.recv_timeout(HEARTBEAT)
                    {
                        if !renew(&repo, &state, &revoked) {
                            break;
                        }
                    }
                })
                .map_err(|e| EngineError::Invalid(format!("session thread: {e}")))?
        };
        Ok(Session {
            repo: repo.clone(),
            state,
            stop: Some(tx),
            heartbeat: Some(heartbeat),
            revoked,
        })
    }

    /// The session's ID.
    pub fn id(&self) -> String {
        self.lock().info.id.clone()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether the session is still held: its newest object exists. Once
    /// revoked, always false.
    ///
    /// Within one heartbeat of the last renewal, on this machine's wall
    /// clock (which runs on through SIGSTOP and sleep), no prune can have
    /// revoked it short of a clock 55 minutes ahead of ours, so the request
    /// is saved: a no-change run stays at a handful of round trips.
    pub fn still_held(&self) -> Result<bool> {
        if self.revoked.load(Ordering::SeqCst) {
            return Ok(false);
        }
        let (name, last) = {
            let st = self.lock();
            (st.name.clone(), st.info.heartbeat_unix)
        };
        let elapsed = now_unix().saturating_sub(last);
        if (0..HEARTBEAT.as_secs() as i64).contains(&elapsed) {
            return Ok(true);
        }
        match self.repo.backend().stat(&name) {
            Ok(_) => Ok(true),
            Err(e) if e.kind == ErrorKind::NotFound => {
                self.revoked.store(true, Ordering::SeqCst);
                Ok(false)
            }
            Err(e) => Err(e.into()),
        }
    }

    /// Ends the session: stops renewing and removes its object. Says false
    /// when the destination refused the removal for want of permission:
    /// the client is append-only, and its session object stays until a
    /// prune with other credentials removes it once its lease is over.
    pub fn end(mut self) -> bool {
        self.finish()
    }

    fn finish(&mut self) -> bool {
        // Once: `end` and then `drop` both come here.
        let Some(tx) = self.stop.take() else {
            return true;
        };
        drop(tx);
        if let Some(h) = self.heartbeat.take() {
            let _ = h.join();
        }
        let name = self.lock().name.clone();
        // Best effort: a session object left behind only delays a prune
        // until its lease runs out.
        !matches!(
            self.repo.backend().delete(&name),
            Err(e) if e.kind == ErrorKind::PermissionDenied
        )
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        let _ = self.finish();
    }
}

fn store(repo: &Repository, name: &str, info: &SessionInfo) -> Result<()> {
    let sealed = repo.key().seal(Aad::Session, &to_json(info))?;
    put_addressed(&**repo.backend(), name, &sealed)
}

/// One renewal; false when the session was revoked (stop renewing).
fn renew(repo: &Repository, state: &Mutex<State>, revoked: &AtomicBool) -> bool {
    let mut st = state.lock().unwrap_or_else(|p| p.into_inner());
    // Renewing a revoked session would bring it back after a prune acted on
    // its absence.
    match repo.backend().stat(&st.name) {
        Ok(_) => {}
        Err(e) if e.kind == ErrorKind::NotFound => {
            revoked.store(true, Ordering::SeqCst);
            return false;
        }
        // The destination is unreachable: try again next beat.
        Err(_) => return true,
    }
    let mut info = st.info.clone();
    info.seq += 1;
    info.heartbeat_unix = now_unix();
    let name = object_name(&info.id, info.seq);
    if store(repo, &name, &info).is_err() {
        return true;
    }
    let old = std::mem::replace(&mut st.name, name);
    st.info = info;
    let _ = repo.backend().delete(&old);
    true
}

/// Every session on the destination, by ID: its newest object's name and
/// content. An unreadable session object counts as a backup's session last
/// renewed when it was written (so it expires a lease later), never as no
/// session.
pub fn list_sessions(repo: &Repository) -> Result<Vec<(String, Vec<String>, SessionInfo)>> {
    let objs = match repo.backend().list(SESSIONS_PREFIX) {
        Ok(o) => o,
        Err(e) if e.kind == ErrorKind::NotFound => Vec::new(),
        Err(e) => return Err(e.into()),
    };
    let mut by_id: std::collections::BTreeMap<String, Vec<String>> = Default::default();
    let mut modified: std::collections::HashMap<String, i64> = Default::default();
    for o in objs {
        let rest = o.name.trim_start_matches(SESSIONS_PREFIX);
        let id = rest.split('-').next().unwrap_or(rest).to_string();
        if let Some(m) = o.modified {
            modified.insert(o.name.clone(), m);
        }
        by_id.entry(id).or_default().push(o.name);
    }
    let mut out = Vec::new();
    for (id, mut names) in by_id {
        names.sort();
        let newest = names.last().cloned().unwrap_or_default();
        let stored_unix = modified.get(&newest).copied();
        let info = match load(repo, &newest) {
            Ok(i) => SessionInfo { stored_unix, ..i },
            // Renewed (and the old object removed) between list and get.
            Err(EngineError::Backend(e)) if e.kind == ErrorKind::NotFound => continue,
            // The destination failed to answer, which says nothing about the
            // object: ended (gone) since the listing, or an error to report,
            // never damage.
            Err(EngineError::Backend(e)) => match repo.backend().stat(&newest) {
                Err(s) if s.kind == ErrorKind::NotFound => continue,
                _ => return Err(e.into()),
            },
            // Damaged: held (as a backup's) until its lease would have run
            // out, counted from when the destination last saw it written,
            // or from now where the listing gives no time. Treating it as
            // absent would let a prune delete what a running backup uses.
            Err(_) => SessionInfo {
                id: id.clone(),
                hostname: "?".into(),
                pid: 0,
                started_unix: 0,
                heartbeat_unix: stored_unix.unwrap_or_else(now_unix),
                seq: 0,
                kind: backup_kind(),
                damaged: true,
                stored_unix,
            },
        };
        out.push((id, names, info));
    }
    Ok(out)
}

/// What holds the session whose object is `name` ("backup", "prune", …).
pub(crate) fn kind_of(repo: &Repository, name: &str) -> Result<String> {
    Ok(load(repo, name)?.kind)
}

fn load(repo: &Repository, name: &str) -> Result<SessionInfo> {
    let b = repo.backend().get(name, None)?;
    let p = repo
        .key()
        .open(Aad::Session, &b)
        .map_err(|e| EngineError::corrupt(name, e))?;
    from_json(&p).map_err(|e| EngineError::corrupt(name, e))
}

/// Whether these credentials may delete objects in the repository: one
/// DELETE of a name that does not exist, which a store answers with success
/// when the credentials may delete and with "access denied" when they may
/// only add (an S3 policy without `s3:DeleteObject`). Destinations that
/// cannot tell (a file system reports a missing file before a permission)
/// say yes, and a refused deletion later is still an error.
pub fn may_delete(repo: &Repository) -> Result<bool> {
    let mut r = [0u8; 8];
    capsule_crypto::random_bytes(&mut r)?;
    let probe = format!("{SESSIONS_PREFIX}probe-{}", hex::encode(r));
    match repo.backend().delete(&probe) {
        Ok(()) => Ok(true),
        Err(e) if e.kind == ErrorKind::NotFound => Ok(true),
        Err(e) if e.kind == ErrorKind::PermissionDenied => Ok(false),
        Err(e) => Err(e.into()),
    }
}

/// Refuses `what` (a command that deletes) for append-only credentials.
pub fn require_delete(repo: &Repository, what: &'static str) -> Result<()> {
    if may_delete(repo)? {
        Ok(())
    } else {
        Err(EngineError::AppendOnly(what))
    }
}
