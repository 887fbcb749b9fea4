//! What a versioned, object-locked store offers beyond the contract: every
//! version of an object, a retention date the store enforces, and reads of
//! the store as it was at a moment ([`AsOf`]).
//!
//! Only S3 has it. A destination without it answers `None` to
//! [`crate::Backend::history`], and the features built on it (object lock,
//! `--as-of`) say they need a versioned bucket.

use std::collections::BTreeMap;
use std::ops::Range;
use std::sync::Arc;

use crate::contract::{Backend, BackendError, Capabilities, ErrorKind, LabBackend, ObjectInfo};

pub use crate::versioned::{History, LifecycleRule, LockMode, LockState, ObjectVersion, Retention};

/// A read-only view of a versioned store as it was at a moment: each name's
/// newest version written at or before it, and nothing deleted after it
/// missing. What an attacker overwrote or deleted later reads as it was.
#[derive(Debug)]
pub struct AsOf {
    inner: Arc<dyn LabBackend>,
    at: f64,
    /// Name → (version ID, size, modified).
    objects: BTreeMap<String, (String, u64, f64)>,
}

impl AsOf {
    /// The view of `inner` at `at` (Unix seconds, the store's clock). Lists
    /// every version once.
    pub fn new(inner: Arc<dyn LabBackend>, at: f64) -> Result<AsOf, BackendError> {
        let location = inner.location();
        let history = inner.history().ok_or_else(|| {
            BackendError::new(
                ErrorKind::Io,
                "as-of",
                &location,
                "--as-of reads old versions, which only a versioned S3 bucket keeps; this destination keeps none",
            )
        })?;
        let state = history.lock_state()?;
        if !state.versioned {
            return Err(BackendError::new(
                ErrorKind::Io,
                "as-of",
                &location,
                "the bucket does not keep versions (versioning is off), so it holds nothing older than what is there now; turn versioning on (or create the repository with --object-lock) to be able to go back",
            ));
        }
        let mut objects = BTreeMap::new();
        let mut newest: BTreeMap<String, f64> = BTreeMap::new();
        for v in history.versions("")? {
            if v.modified > at {
                continue;
            }
            let seen = newest.get(&v.name).copied().unwrap_or(f64::MIN);
            // Several versions within the same listed instant: the one the
            // store calls latest, or else the later one in the listing.
            if v.modified < seen {
                continue;
            }
            newest.insert(v.name.clone(), v.modified);
            if v.delete_marker {
                objects.remove(&v.name);
            } else {
                objects.insert(v.name.clone(), (v.version, v.size, v.modified));
            }
        }
        Ok(AsOf { inner, at, objects })
    }

    /// The moment this view shows.
    pub fn at(&self) -> f64 {
        self.at
    }

    /// The names in the view with their version IDs.
    pub fn objects(&self) -> impl Iterator<Item = (&str, &str)> {
        self.objects
            .iter()
            .map(|(n, (v, _, _))| (n.as_str(), v.as_str()))
    }

    fn refuse(&self, op: &'static str, name: &str) -> BackendError {
        BackendError::new(
            ErrorKind::PermissionDenied,
            op,
            name,
            "the repository is open as it was at an earlier moment (--as-of), which can only be read; `capsule repair --as-of` writes that state back",
        )
    }

    fn history(&self) -> &dyn History {
        // Checked in `new`.
        self.inner.history().expect("a versioned destination")
    }

    fn find(&self, op: &'static str, name: &str) -> Result<&(String, u64, f64), BackendError> {
        self.objects.get(name).ok_or_else(|| {
            BackendError::new(
                ErrorKind::NotFound,
                op,
                name,
                "no version of this object existed at that moment",
            )
        })
    }
}

/// A reader's session (so that a prune meanwhile keeps what it reads) is
/// the one thing written, and it goes to the store as it is now.
fn is_session(name: &str) -> bool {
    name.starts_with("sessions/")
}

impl Backend for AsOf {
    fn put(&self, name: &str, data: &[u8]) -> Result<(), BackendError> {
        if is_session(name) {
            return self.inner.put(name, data);
        }
        Err(self.refuse("put", name))
    }
    fn get(&self, name: &str, range: Option<Range<u64>>) -> Result<Vec<u8>, BackendError> {
        let (version, size, _) = self.find("get", name)?;
        if let Some(r) = &range {
            crate::contract::check_range(name, r, *size)?;
        }
        self.history().get_version(name, version, range)
    }
    fn stat(&self, name: &str) -> Result<ObjectInfo, BackendError> {
        let (_, size, modified) = self.find("stat", name)?;
        Ok(ObjectInfo {
            name: name.to_string(),
            size: *size,
            modified: Some(*modified as i64),
        })
    }
    fn list(&self, prefix: &str) -> Result<Vec<ObjectInfo>, BackendError> {
        Ok(self
            .objects
            .range(prefix.to_string()..)
            .take_while(|(n, _)| n.starts_with(prefix))
            .map(|(n, (_, size, modified))| ObjectInfo {
                name: n.clone(),
                size: *size,
                modified: Some(*modified as i64),
            })
            .collect())
    }
    fn delete(&self, name: &str) -> Result<(), BackendError> {
        if is_session(name) {
            return self.inner.delete(name);
        }
        Err(self.refuse("delete", name))
    }
    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }
    fn location(&self) -> String {
        self.inner.location()
    }
    fn history(&self) -> Option<&dyn History> {
        self.inner.history()
    }
}

impl LabBackend for AsOf {}

#[cfg(test)]
mod tests {
    use super::*;

    /// A versioned store in memory: every version of every name, as S3
    /// keeps them, with the times the test gives.
    /// What the store in memory answers to what the view never asks.
    fn unused() -> BackendError {
        BackendError::new(ErrorKind::Io, "test", "", "not used by a read-only view")
    }

    #[derive(Debug, Default)]
    struct Versions(Vec<(ObjectVersion, Vec<u8>)>);

    impl Versions {
        fn add(&mut self, name: &str, at: f64, data: Option<&[u8]>) {
            let version = format!("v{}", self.0.len());
            self.0.push((
                ObjectVersion {
                    name: name.into(),
                    version,
                    modified: at,
                    size: data.map_or(0, |d| d.len() as u64),
                    latest: false,
                    delete_marker: data.is_none(),
                },
                data.unwrap_or_default().to_vec(),
            ));
        }
    }

    impl History for Versions {
        fn lock_state(&self) -> Result<LockState, BackendError> {
            Ok(LockState {
                versioned: true,
                ..LockState::default()
            })
        }
        fn lifecycle(&self) -> Result<Vec<LifecycleRule>, BackendError> {
            Ok(Vec::new())
        }
        fn set_default_retention(&self, _: LockMode, _: u32) -> Result<(), BackendError> {
            Err(unused())
        }
        fn retention(&self, _: &str, _: Option<&str>) -> Result<Option<Retention>, BackendError> {
            Ok(None)
        }
        fn set_retention(&self, _: &str, _: LockMode, _: i64) -> Result<(), BackendError> {
            Err(unused())
        }
        fn versions(&self, prefix: &str) -> Result<Vec<ObjectVersion>, BackendError> {
            // Grouped by name, oldest first, as the contract says.
            let mut v: Vec<ObjectVersion> = self
                .0
                .iter()
                .map(|(v, _)| v.clone())
                .filter(|v| v.name.starts_with(prefix))
                .collect();
            v.sort_by(|a, b| a.name.cmp(&b.name));
            Ok(v)
        }
        fn get_version(
            &self,
            name: &str,
            version: &str,
            range: Option<Range<u64>>,
        ) -> Result<Vec<u8>, BackendError> {
            let (_, d) = self
                .0
                .iter()
                .find(|(v, _)| v.name == name && v.version == version)
                .expect("asked for a version that exists");
            Ok(match range {
                Some(r) => d[r.start as usize..r.end as usize].to_vec(),
                None => d.clone(),
            })
        }
        fn delete_version(&self, _: &str, _: &str) -> Result<(), BackendError> {
            Err(unused())
        }
        fn overwrite(&self, _: &str, _: &[u8]) -> Result<(), BackendError> {
            Err(unused())
        }
    }

    impl Backend for Versions {
        fn put(&self, _: &str, _: &[u8]) -> Result<(), BackendError> {
            Err(unused())
        }
        fn get(&self, _: &str, _: Option<Range<u64>>) -> Result<Vec<u8>, BackendError> {
            Err(unused())
        }
        fn stat(&self, _: &str) -> Result<ObjectInfo, BackendError> {
            Err(unused())
        }
        fn list(&self, _: &str) -> Result<Vec<ObjectInfo>, BackendError> {
            Err(unused())
        }
        fn delete(&self, _: &str) -> Result<(), BackendError> {
            Err(unused())
        }
        fn capabilities(&self) -> Capabilities {
            Capabilities {
                concurrency: 1,
                durable_put: true,
                local: true,
                buffers_puts: false,
            }
        }
        fn location(&self) -> String {
            "memory".into()
        }
        fn history(&self) -> Option<&dyn History> {
            Some(self)
        }
    }

    impl LabBackend for Versions {}

    #[test]
    fn a_view_shows_each_name_as_it_was_then() {
        let mut s = Versions::default();
        s.add("config", 10.0, Some(&b"config"[..]));
        s.add("snapshots/a", 20.0, Some(&b"first"[..]));
        s.add("snapshots/a", 30.0, Some(&b"garbage"[..]));
        s.add("snapshots/b", 21.0, Some(&b"second"[..]));
        s.add("snapshots/b", 31.0, None);
        s.add("snapshots/c", 25.0, None);
        s.add("snapshots/d", 40.0, Some(&b"later"[..]));
        // Two versions in the same listed instant: the later one counts.
        s.add("index/x", 22.0, Some(&b"old"[..]));
        s.add("index/x", 22.0, Some(&b"new"[..]));
        let store: Arc<dyn LabBackend> = Arc::new(s);

        let view = AsOf::new(store.clone(), 25.0).unwrap();
        let names: Vec<String> = view.list("").unwrap().into_iter().map(|o| o.name).collect();
        assert_eq!(names, ["config", "index/x", "snapshots/a", "snapshots/b"]);
        assert_eq!(view.get("snapshots/a", None).unwrap(), b"first");
        assert_eq!(view.get("snapshots/b", Some(1..3)).unwrap(), b"ec");
        assert_eq!(view.get("index/x", None).unwrap(), b"new");
        assert_eq!(
            view.get("snapshots/d", None).unwrap_err().kind,
            ErrorKind::NotFound
        );
        assert_eq!(view.stat("snapshots/b").unwrap().size, 6);
        // Read-only, but for a reader's session.
        assert_eq!(
            view.put("snapshots/e", b"x").unwrap_err().kind,
            ErrorKind::PermissionDenied
        );
        assert_eq!(
            view.delete("snapshots/a").unwrap_err().kind,
            ErrorKind::PermissionDenied
        );

        // Later: the overwrite and the delete marker show.
        let later = AsOf::new(store, 35.0).unwrap();
        assert_eq!(later.get("snapshots/a", None).unwrap(), b"garbage");
        assert_eq!(
            later.stat("snapshots/b").unwrap_err().kind,
            ErrorKind::NotFound
        );
    }
}
