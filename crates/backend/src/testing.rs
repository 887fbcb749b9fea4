//! Test backends: an in-memory store, and a decorator that injects faults
//! into any backend. Built only with the `testing` feature (engine and CLI
//! tests turn it on); nothing here ships in capsule.
//!
//! The fault decorator counts every call and fails, truncates or lies on
//! the calls a [`FaultPlan`] names, so a test can put a crash, a cut
//! connection or a full disk at call N of a real operation, and replay it
//! from its seed.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::ops::Range;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use crate::contract::{Backend, BackendError, Capabilities, ErrorKind, LabBackend, ObjectInfo};

/// Objects in memory. Cheap to clone (a deep copy of the store), so one
/// repository state can be the start of many fault runs.
#[derive(Debug, Default)]
pub struct MemoryBackend {
    objects: Mutex<BTreeMap<String, Arc<Vec<u8>>>>,
    /// Names listed (with their last size) that no read finds: what a
    /// distributed store can do after a node died during an upload.
    ghosts: Mutex<BTreeMap<String, u64>>,
}

impl MemoryBackend {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    /// A copy of the store as it is now.
    pub fn fork(&self) -> MemoryBackend {
        MemoryBackend {
            objects: Mutex::new(self.lock().clone()),
            ghosts: Mutex::new(self.ghosts().clone()),
        }
    }

    /// Takes an object's bytes away but goes on listing it: every read
    /// answers "not found", every listing names it.
    pub fn ghost(&self, name: &str) {
        if let Some(b) = self.lock().remove(name) {
            self.ghosts().insert(name.to_string(), b.len() as u64);
        }
    }

    /// Lists a deleted object again (a store node that was away when it
    /// was deleted), its reads still "not found".
    pub fn ghost_again(&self, name: &str) {
        if !self.lock().contains_key(name) {
            self.ghosts().insert(name.to_string(), 0);
        }
    }

    fn ghosts(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, u64>> {
        self.ghosts.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Every object name, sorted.
    pub fn names(&self) -> Vec<String> {
        self.lock().keys().cloned().collect()
    }

    /// Replaces an object's bytes (to damage it on purpose).
    pub fn overwrite(&self, name: &str, data: Vec<u8>) {
        self.lock().insert(name.to_string(), Arc::new(data));
    }

    /// An object's bytes.
    pub fn bytes(&self, name: &str) -> Option<Vec<u8>> {
        self.lock().get(name).map(|b| b.to_vec())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, Arc<Vec<u8>>>> {
        self.objects.lock().unwrap_or_else(|p| p.into_inner())
    }
}

fn not_found(op: &'static str, name: &str) -> BackendError {
    BackendError::new(ErrorKind::NotFound, op, name, "no such object")
}

impl Backend for MemoryBackend {
    fn put(&self, name: &str, data: &[u8]) -> Result<(), BackendError> {
        crate::contract::validate_name(name)?;
        let mut m = self.lock();
        if m.contains_key(name) {
            return Err(BackendError::new(
                ErrorKind::AlreadyExists,
                "put",
                name,
                "exists",
            ));
        }
        m.insert(name.to_string(), Arc::new(data.to_vec()));
        Ok(())
    }

    fn get(&self, name: &str, range: Option<Range<u64>>) -> Result<Vec<u8>, BackendError> {
        let b = self
            .lock()
            .get(name)
            .cloned()
            .ok_or_else(|| not_found("get", name))?;
        match range {
            None => Ok(b.to_vec()),
            Some(r) if r.start <= r.end && r.end <= b.len() as u64 => {
                Ok(b[r.start as usize..r.end as usize].to_vec())
            }
            Some(r) => Err(BackendError::new(
                ErrorKind::InvalidRange,
                "get",
                name,
                format!("range {r:?} outside {} bytes", b.len()),
            )),
        }
    }

    fn stat(&self, name: &str) -> Result<ObjectInfo, BackendError> {
        let m = self.lock();
        let b = m.get(name).ok_or_else(|| not_found("stat", name))?;
        Ok(ObjectInfo {
            name: name.to_string(),
            size: b.len() as u64,
            modified: None,
        })
    }

    fn list(&self, prefix: &str) -> Result<Vec<ObjectInfo>, BackendError> {
        let mut out: BTreeMap<String, u64> = self
            .lock()
            .range(prefix.to_string()..)
            .take_while(|(k, _)| k.starts_with(prefix))
            .map(|(k, v)| (k.clone(), v.len() as u64))
            .collect();
        out.extend(
            self.ghosts()
                .range(prefix.to_string()..)
                .take_while(|(k, _)| k.starts_with(prefix))
                .map(|(k, v)| (k.clone(), *v)),
        );
        Ok(out
            .into_iter()
            .map(|(name, size)| ObjectInfo {
                name,
                size,
                modified: None,
            })
            .collect())
    }

    fn delete(&self, name: &str) -> Result<(), BackendError> {
        self.lock().remove(name);
        self.ghosts().remove(name);
        Ok(())
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            concurrency: 4,
            durable_put: true,
            local: true,
            buffers_puts: true,
        }
    }

    fn location(&self) -> String {
        "memory".into()
    }
}

impl LabBackend for MemoryBackend {}

/// How long a [`Fault::Stall`] holds its call.
pub const STALL: std::time::Duration = std::time::Duration::from_millis(100);

/// What to do to one call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Fail with a transient I/O error (a cut connection).
    Fail,
    /// Fail, and every later call too: the process died here.
    Crash,
    /// `put`: store the first half of the object, then crash (a backend
    /// that breaks the atomic-put contract). Other calls: crash.
    TornWrite,
    /// `get`: return only the first half of what was asked for.
    ShortRead,
    /// `put`: report success having stored nothing.
    LostWrite,
    /// Wait [`STALL`] before the call goes through: a destination that
    /// stops answering for a while, then recovers.
    Stall,
    /// `put`: the destination is full.
    Full,
}

/// Which calls get which fault. Calls are counted from 1 across all
/// methods, in the order they reach the decorator.
#[derive(Debug, Clone, Default)]
pub struct FaultPlan {
    /// Faults at exact call numbers.
    pub at: BTreeMap<u64, Fault>,
    /// A fault on every Nth call: `(n, fault)`.
    pub every: Option<(u64, Fault)>,
}

impl FaultPlan {
    /// One fault at call `n`.
    pub fn at(n: u64, f: Fault) -> Self {
        let mut p = FaultPlan::default();
        p.at.insert(n, f);
        p
    }
}

/// Wraps a backend and injects the faults of a [`FaultPlan`].
#[derive(Debug)]
pub struct FaultBackend {
    inner: Arc<dyn LabBackend>,
    plan: FaultPlan,
    calls: AtomicU64,
    crashed: AtomicBool,
    injected: AtomicU64,
}

impl FaultBackend {
    /// Wraps `inner`.
    pub fn new(inner: Arc<dyn LabBackend>, plan: FaultPlan) -> Self {
        FaultBackend {
            inner,
            plan,
            calls: AtomicU64::new(0),
            crashed: AtomicBool::new(false),
            injected: AtomicU64::new(0),
        }
    }

    /// Calls seen so far.
    pub fn calls(&self) -> u64 {
        self.calls.load(Ordering::SeqCst)
    }

    /// Faults injected so far.
    pub fn injected(&self) -> u64 {
        self.injected.load(Ordering::SeqCst)
    }

    /// Whether a crash fault has fired.
    pub fn crashed(&self) -> bool {
        self.crashed.load(Ordering::SeqCst)
    }

    fn err(op: &'static str, name: &str, what: &str) -> BackendError {
        BackendError::transient(ErrorKind::Io, op, name, format!("injected fault: {what}"))
    }

    /// The fault for this call, if any; counts the call.
    fn next(&self, op: &'static str, name: &str) -> Result<Option<Fault>, BackendError> {
        let n = self.calls.fetch_add(1, Ordering::SeqCst) + 1;
        if self.crashed() {
            return Err(Self::err(op, name, "after the crash"));
        }
        let f = self.plan.at.get(&n).copied().or_else(|| {
            self.plan
                .every
                .filter(|(every, _)| *every > 0 && n.is_multiple_of(*every))
                .map(|(_, f)| f)
        });
        if f.is_some() {
            self.injected.fetch_add(1, Ordering::SeqCst);
        }
        match f {
            Some(Fault::Fail) => Err(Self::err(op, name, "call failed")),
            Some(Fault::Crash) => {
                self.crashed.store(true, Ordering::SeqCst);
                Err(Self::err(op, name, "crash"))
            }
            Some(Fault::TornWrite) if op != "put" => {
                self.crashed.store(true, Ordering::SeqCst);
                Err(Self::err(op, name, "crash"))
            }
            Some(Fault::Stall) => {
                std::thread::sleep(STALL);
                Ok(None)
            }
            Some(Fault::Full) if op == "put" => Err(BackendError::new(
                ErrorKind::NoSpace,
                op,
                name,
                "injected fault: destination full",
            )),
            other => Ok(other),
        }
    }
}

/// Every repository operation counts as a call and may draw a fault; the
/// streaming calls go through `put` and `get` so that they do too. The lab's
/// operations pass through uncounted.
impl crate::contract::Layer for FaultBackend {
    fn inner(&self) -> &dyn LabBackend {
        &*self.inner
    }

    fn put_stream(&self, name: &str, size: u64, data: &mut dyn Read) -> Result<(), BackendError> {
        crate::contract::put_stream_buffered(self, name, size, data)
    }

    fn put_owned(&self, name: &str, data: Vec<u8>) -> (Result<(), BackendError>, Option<Vec<u8>>) {
        let r = Backend::put(self, name, &data);
        (r, Some(data))
    }

    fn put_file(&self, name: &str, file: &std::fs::File, size: u64) -> Result<(), BackendError> {
        crate::contract::put_stream_buffered(
            self,
            name,
            size,
            &mut crate::contract::ReadAt::new(file),
        )
    }

    fn get_stream(
        &self,
        name: &str,
        range: Option<Range<u64>>,
        out: &mut dyn Write,
    ) -> Result<u64, BackendError> {
        crate::contract::get_stream_buffered(self, name, range, out)
    }

    fn put(&self, name: &str, data: &[u8]) -> Result<(), BackendError> {
        match self.next("put", name)? {
            Some(Fault::LostWrite) => Ok(()),
            Some(Fault::TornWrite) => {
                let _ = self.inner.put(name, &data[..data.len() / 2]);
                self.crashed.store(true, Ordering::SeqCst);
                Err(Self::err("put", name, "torn write, then crash"))
            }
            _ => self.inner.put(name, data),
        }
    }

    fn get(&self, name: &str, range: Option<Range<u64>>) -> Result<Vec<u8>, BackendError> {
        let short = self.next("get", name)? == Some(Fault::ShortRead);
        let mut b = self.inner.get(name, range)?;
        if short {
            b.truncate(b.len() / 2);
        }
        Ok(b)
    }

    fn stat(&self, name: &str) -> Result<ObjectInfo, BackendError> {
        self.next("stat", name)?;
        self.inner.stat(name)
    }

    fn list(&self, prefix: &str) -> Result<Vec<ObjectInfo>, BackendError> {
        self.next("list", prefix)?;
        self.inner.list(prefix)
    }

    fn list_temporaries(&self) -> Result<Vec<ObjectInfo>, BackendError> {
        self.next("list", "")?;
        self.inner.list_temporaries()
    }

    fn delete(&self, name: &str) -> Result<(), BackendError> {
        self.next("delete", name)?;
        self.inner.delete(name)
    }

    fn location(&self) -> String {
        format!("faults({})", self.inner.location())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_backend_meets_the_contract() {
        crate::conformance::run_all(&MemoryBackend::new());
    }

    /// The whole decorator stack the CLI builds (cache over retries over
    /// request accounting), plus the fault decorator with no faults, keeps
    /// the contract: a decorator that forgot a method would show here.
    #[test]
    fn decorator_stack_meets_the_contract() {
        let dir = tempfile::tempdir().unwrap();
        let mem: Arc<dyn LabBackend> = Arc::new(MemoryBackend::new());
        let faults: Arc<dyn LabBackend> = Arc::new(FaultBackend::new(mem, FaultPlan::default()));
        let metered: Arc<dyn LabBackend> = Arc::new(crate::metered::MeteredBackend::new(faults));
        let retry: Arc<dyn LabBackend> = Arc::new(crate::retry::RetryBackend::new(
            metered,
            crate::retry::RetryPolicy::default(),
        ));
        let cached = crate::cache::CachingBackend::new(retry, dir.path()).unwrap();
        crate::conformance::run_all(&cached);
    }

    /// The lab's operations are not in the repository contract, yet they
    /// must reach the destination through every layer rather than fall back
    /// to a default: free space through the stack is the disk's.
    #[test]
    fn lab_operations_reach_the_destination_through_every_layer() {
        let dir = tempfile::tempdir().unwrap();
        let repo = dir.path().join("repo");
        std::fs::create_dir(&repo).unwrap();
        let local: Arc<dyn LabBackend> = Arc::new(
            crate::local::LocalBackend::open(&repo, crate::local::SyncPolicy::NoSync).unwrap(),
        );
        let faults: Arc<dyn LabBackend> =
            Arc::new(FaultBackend::new(local.clone(), FaultPlan::default()));
        let metered = crate::metered::MeteredBackend::new(faults);
        let stats = metered.stats();
        let retry: Arc<dyn LabBackend> = Arc::new(crate::retry::RetryBackend::new(
            Arc::new(metered),
            crate::retry::RetryPolicy::default(),
        ));
        let top = crate::cache::CachingBackend::new(retry, dir.path().join("cache")).unwrap();

        assert_eq!(
            top.space().unwrap().map(|s| s.total),
            local.space().unwrap().map(|s| s.total),
            "space() reaches the disk"
        );
        top.probe_write("lab/a/x", b"0123456789", 2, false).unwrap();
        assert_eq!(std::fs::read(repo.join("lab/a/x")).unwrap(), b"0123456789");
        top.delete("lab/a/x").unwrap();
        top.remove_empty_dirs().unwrap();
        assert!(
            !repo.join("lab").exists(),
            "remove_empty_dirs reached the disk"
        );
        top.ping().unwrap();
        assert!(
            stats.requests() >= 4,
            "the accounting layer saw the lab's calls"
        );
    }

    #[test]
    fn faults_fire_on_the_calls_planned() {
        let mem = Arc::new(MemoryBackend::new());
        let f = FaultBackend::new(mem.clone(), FaultPlan::at(2, Fault::TornWrite));
        f.put("a", b"1234").unwrap();
        assert!(f.put("b", b"5678").is_err());
        assert!(f.crashed());
        assert!(f.get("a", None).is_err(), "calls after a crash fail");
        assert_eq!(
            mem.bytes("b").unwrap(),
            b"56",
            "a torn write leaves a prefix"
        );
        let f = FaultBackend::new(mem.clone(), FaultPlan::at(1, Fault::LostWrite));
        f.put("c", b"x").unwrap();
        assert!(mem.bytes("c").is_none());
        let f = FaultBackend::new(mem.clone(), FaultPlan::at(1, Fault::ShortRead));
        assert_eq!(f.get("a", None).unwrap(), b"12");
        let f = FaultBackend::new(mem, FaultPlan::at(1, Fault::Full));
        assert_eq!(f.put("d", b"x").unwrap_err().kind, ErrorKind::NoSpace);
    }
}
