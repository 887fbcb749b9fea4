//! The layer stack between a repository and its destination, built in
//! exactly one place ([`Stack::over`]).

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use capsule_backend::{
    BackendError, LabBackend, LocalBackend, MeteredBackend, ObjectInfo, RequestStats, RetryBackend,
    RetryPolicy, SyncPolicy, TraceSink,
};
use capsule_engine::EngineError;
use capsule_net::Destination;

use capsule_engine::Result;

/// How to reach a destination: credentials and knobs for network ones,
/// the sync policy for local directories, an optional request trace.
#[derive(Debug, Clone, Default)]
pub struct Connect {
    /// Credentials, connections and timeouts for SMB, SFTP and S3.
    pub net: capsule_net::Options,
    /// Local directories: skip fsync (`--no-fsync`).
    pub no_fsync: bool,
    /// Write a line per request into this trace (`--trace-requests`);
    /// every stack given a clone writes into the same one.
    pub trace: Option<TraceSink>,
    /// How long a call rides out a destination that stopped answering
    /// before the run gives up (`--retry-for`; default
    /// [`capsule_backend::RIDE_OUT`]).
    pub retry_for: Option<std::time::Duration>,
    /// Read the destination as it was at this moment (Unix seconds,
    /// `--as-of`): a versioned S3 bucket's old versions, read-only.
    pub as_of: Option<i64>,
}

impl Connect {
    /// Credentials from the environment (`CAPSULE_SMB_PASSWORD`, AWS
    /// variables…) for `dest`, everything else at its default.
    pub fn from_env(dest: &Destination) -> Connect {
        Connect {
            net: capsule_net::Options::from_env(dest),
            ..Connect::default()
        }
    }
}

/// A request trace into a new file at `path` (`--trace-requests`).
pub fn trace_file(path: &Path) -> Result<TraceSink> {
    let file = std::fs::File::create(path).map_err(|source| EngineError::Io {
        op: "create the request trace",
        path: path.to_path_buf(),
        source,
    })?;
    Ok(TraceSink::new(Box::new(file)))
}

/// An open destination with its layers and counters.
#[derive(Clone)]
pub struct Stack {
    /// The top of the stack: what a repository is opened on.
    pub backend: Arc<dyn LabBackend>,
    /// Every request on the wire (attempts, not calls: a retried request
    /// counts each time).
    pub requests: Arc<RequestStats>,
    /// Requests retried after a transient failure.
    pub retries: Arc<AtomicU64>,
    /// Seconds the connection (and login) took.
    pub connect_secs: f64,
    /// Whether the destination is across a network.
    pub remote: bool,
    /// The layers, top first, for tests and `--json` (`retry`, `metered`,
    /// `kill-at-call`, then the destination's kind).
    pub layers: Vec<&'static str>,
    /// How long a call rides out a destination away before giving up.
    pub retry_for: std::time::Duration,
}

impl std::fmt::Debug for Stack {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stack")
            .field("layers", &self.layers)
            .finish()
    }
}

impl Stack {
    /// Connects to `dest` and builds the stack. With `create`, makes the
    /// directory (and, on SMB and SFTP, the base directory on the server).
    /// A local directory that is missing (without `create`) or a file is
    /// "not a repository", named; a missing directory is a destination
    /// that is away (an unplugged disk, a share not mounted: exit 14, which
    /// the daemon skips and retries), named by what is missing.
    pub fn connect(dest: &Destination, how: &Connect, create: bool) -> Result<Stack> {
        let t = Instant::now();
        let raw: Arc<dyn LabBackend> = match dest {
            Destination::Local(path) => {
                let sync = if how.no_fsync {
                    SyncPolicy::NoSync
                } else {
                    SyncPolicy::Sync
                };
                if path.exists() && !path.is_dir() {
                    return Err(EngineError::NotARepository {
                        location: format!("{} (a file, not a directory)", path.display()),
                    });
                }
                if !create && std::fs::symlink_metadata(path).is_err() {
                    return Err(away(path).into());
                }
                if create {
                    Arc::new(LocalBackend::create(path, sync)?)
                } else {
                    let b = LocalBackend::open(path, sync).map_err(|e| match e.kind {
                        capsule_backend::ErrorKind::NotFound => match crate::place::away(path) {
                            // The mount point of a disk not plugged in.
                            Some(why) => capsule_backend::BackendError::new(
                                capsule_backend::ErrorKind::Unreachable,
                                "open",
                                &path.display().to_string(),
                                why,
                            )
                            .into(),
                            None => EngineError::NotARepository {
                                location: path.display().to_string(),
                            },
                        },
                        _ => e.into(),
                    })?;
                    Arc::new(b)
                }
            }
            remote => {
                let mut opts = how.net.clone();
                opts.create = create;
                capsule_net::connect(remote, &opts)?
            }
        };
        let raw = match how.as_of {
            Some(at) => Arc::new(capsule_backend::AsOf::new(raw, at as f64)?),
            None => raw,
        };
        let connect_secs = t.elapsed().as_secs_f64();
        let mut s = Stack::over(raw, kind(dest), how)?;
        s.connect_secs = connect_secs;
        s.remote = dest.is_remote();
        Ok(s)
    }

    /// The stack over a destination already open (`raw`, of kind `kind`):
    /// the one place its layers are put together, bottom up:
    ///
    /// 1. the reliability suite's crash hook, when `CAPSULE_TEST_KILL_AT_CALL`
    ///    is set (tests only, see [`KILL_AT_CALL`]);
    /// 2. request accounting (each attempt on the wire counts), with the
    ///    request trace when asked;
    /// 3. retries of transient failures.
    ///
    /// The cache goes on top once the repository is open and its ID known
    /// ([`crate::open`]).
    pub fn over(raw: Arc<dyn LabBackend>, kind: &'static str, how: &Connect) -> Result<Stack> {
        let mut layers = vec![kind];
        let raw = match KillAtCall::from_env(raw) {
            Ok(k) => {
                layers.push("kill-at-call");
                Arc::new(k) as Arc<dyn LabBackend>
            }
            Err(raw) => raw,
        };
        let mut metered = MeteredBackend::new(raw);
        if let Some(sink) = &how.trace {
            metered = metered.with_trace(sink.clone());
        }
        layers.push("metered");
        let requests = metered.stats();
        let policy = RetryPolicy {
            ride_out: how.retry_for.unwrap_or(capsule_backend::RIDE_OUT),
            ..RetryPolicy::default()
        };
        let retry = RetryBackend::new(Arc::new(metered), policy);
        layers.push("retry");
        layers.reverse();
        Ok(Stack {
            retries: retry.retries(),
            backend: Arc::new(retry),
            requests,
            connect_secs: 0.0,
            remote: false,
            layers,
            retry_for: policy.ride_out,
        })
    }
}

/// The scheme of a destination, for reports.
pub fn kind(dest: &Destination) -> &'static str {
    match dest {
        Destination::Local(_) => "local",
        Destination::Smb(_) => "smb",
        Destination::Sftp(_) => "sftp",
        Destination::S3(_) => "s3",
    }
}

/// The variable the crash hook of the reliability suite reads (see
/// [`Stack::over`]).
pub const KILL_AT_CALL: &str = "CAPSULE_TEST_KILL_AT_CALL";

/// The reliability suite's crash points by call count: with
/// `CAPSULE_TEST_KILL_AT_CALL=N` this process kills itself with SIGKILL as
/// its Nth request reaches the destination, and with `N+` as the Nth
/// returns (the request landed, but nothing that follows it happened).
/// Requests are counted on the wire, as the request statistics count them.
/// Only tests set it.
#[derive(Debug)]
struct KillAtCall {
    inner: Arc<dyn LabBackend>,
    at: u64,
    after: bool,
    calls: AtomicU64,
}

impl KillAtCall {
    /// `raw` under the hook when the variable asks for it, else `raw` back.
    fn from_env(raw: Arc<dyn LabBackend>) -> std::result::Result<KillAtCall, Arc<dyn LabBackend>> {
        let Ok(v) = std::env::var(KILL_AT_CALL) else {
            return Err(raw);
        };
        let (n, after) = match v.strip_suffix('+') {
            Some(n) => (n, true),
            None => (v.as_str(), false),
        };
        Ok(KillAtCall {
            inner: raw,
            // Unparsable: count (for the exit line) and never kill.
            at: n.trim().parse().unwrap_or(0),
            after,
            calls: AtomicU64::new(0),
        })
    }

    fn count<T>(&self, f: impl FnOnce() -> T) -> T {
        let n = self.calls.fetch_add(1, Ordering::SeqCst) + 1;
        if n == self.at && !self.after {
            sigkill_self();
        }
        let r = f();
        if n == self.at && self.after {
            sigkill_self();
        }
        r
    }
}

fn sigkill_self() -> ! {
    // SIGKILL cannot be caught: nothing of this process runs after it.
    let _ = rustix::process::kill_process(rustix::process::getpid(), rustix::process::Signal::KILL);
    std::process::abort()
}

impl capsule_backend::Layer for KillAtCall {
    fn inner(&self) -> &dyn LabBackend {
        &*self.inner
    }
    fn put(&self, name: &str, data: &[u8]) -> std::result::Result<(), BackendError> {
        self.count(|| self.inner.put(name, data))
    }
    fn get(
        &self,
        name: &str,
        range: Option<std::ops::Range<u64>>,
    ) -> std::result::Result<Vec<u8>, BackendError> {
        self.count(|| self.inner.get(name, range))
    }
    fn stat(&self, name: &str) -> std::result::Result<ObjectInfo, BackendError> {
        self.count(|| self.inner.stat(name))
    }
    fn list(&self, prefix: &str) -> std::result::Result<Vec<ObjectInfo>, BackendError> {
        self.count(|| self.inner.list(prefix))
    }
    fn delete(&self, name: &str) -> std::result::Result<(), BackendError> {
        self.count(|| self.inner.delete(name))
    }
    fn put_stream(
        &self,
        name: &str,
        size: u64,
        data: &mut dyn std::io::Read,
    ) -> std::result::Result<(), BackendError> {
        self.count(|| self.inner.put_stream(name, size, data))
    }
    fn put_owned(
        &self,
        name: &str,
        data: Vec<u8>,
    ) -> (std::result::Result<(), BackendError>, Option<Vec<u8>>) {
        self.count(|| self.inner.put_owned(name, data))
    }
    fn put_file(
        &self,
        name: &str,
        file: &std::fs::File,
        size: u64,
    ) -> std::result::Result<(), BackendError> {
        self.count(|| self.inner.put_file(name, file, size))
    }
    fn get_stream(
        &self,
        name: &str,
        range: Option<std::ops::Range<u64>>,
        out: &mut dyn std::io::Write,
    ) -> std::result::Result<u64, BackendError> {
        self.count(|| self.inner.get_stream(name, range, out))
    }
}

/// A local repository directory that is not there: the destination is
/// away, as a server that does not answer is. Names the first part of the
/// path that is missing, which tells an unplugged disk (its mount point's
/// directory is there, empty) from a typing mistake.
fn away(path: &std::path::Path) -> capsule_backend::BackendError {
    let missing = path
        .ancestors()
        .take_while(|a| std::fs::symlink_metadata(a).is_err())
        .last()
        .unwrap_or(path);
    capsule_backend::BackendError::new(
        capsule_backend::ErrorKind::Unreachable,
        "open",
        &path.display().to_string(),
        format!(
            "the repository directory is not there ({} does not exist): a disk not plugged in, or a share not mounted? (`capsule init` makes a new repository)",
            missing.display()
        ),
    )
}
