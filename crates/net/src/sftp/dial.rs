//! Dialing: an SSH connection and its SFTP session, authenticated by key
//! or password, the host key checked against known_hosts, the ciphers
//! this machine runs fastest; and the errors of a session.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use capsule_backend::{BackendError, ErrorKind};
use russh::client;
use russh::keys::{HashAlg, PrivateKeyWithHashAlg, PublicKeyOrCertificate};
use russh_sftp::client::error::Error as SftpError;
use russh_sftp::client::RawSftpSession;
use russh_sftp::protocol::StatusCode;

use crate::url::SftpTarget;

/// Chunk size when the server does not announce its limits.
const DEFAULT_CHUNK: u64 = 32 * 1024;

/// How long a pool slot whose background dial failed is left to the
/// connections that are live.
pub(crate) const REDIAL_AFTER: Duration = Duration::from_secs(30);

/// Seconds a request may wait for its answer.
const REQUEST_TIMEOUT: u64 = 60;

/// What opening a connection needs; shared with the tasks that open pool
/// connections in the background.
#[derive(Debug)]
pub(crate) struct Dialer {
    pub(crate) target: SftpTarget,
    pub(crate) location: String,
    pub(crate) auth: Auth,
}

#[derive(Clone)]
pub(crate) struct Auth {
    pub(crate) key: Option<Arc<russh::keys::PrivateKey>>,
    pub(crate) key_path: Option<PathBuf>,
    pub(crate) password: Option<String>,
    pub(crate) known_hosts: PathBuf,
}

impl std::fmt::Debug for Auth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Auth")
            .field("key_path", &self.key_path)
            .field("password", &self.password.as_ref().map(|_| "***"))
            .field("known_hosts", &self.known_hosts)
            .finish()
    }
}

pub(crate) struct Conn {
    // Kept so the SSH connection lives as long as the SFTP session.
    pub(crate) _ssh: client::Handle<HostCheck>,
    pub(crate) sftp: RawSftpSession,
    pub(crate) read_len: u64,
    pub(crate) write_len: u64,
    pub(crate) fsync: bool,
}

impl std::fmt::Debug for Conn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Conn")
    }
}

/// What the host-key check found, read after a failed connect.
#[derive(Debug, Clone)]
enum HostKeyProblem {
    Unknown(String),
    Changed { line: usize, fingerprint: String },
    Certificate,
    Unreadable(String),
}

pub(crate) struct HostCheck {
    pub(crate) host: String,
    pub(crate) port: u16,
    pub(crate) known_hosts: PathBuf,
    problem: Arc<Mutex<Option<HostKeyProblem>>>,
}

impl client::Handler for HostCheck {
    type Error = russh::Error;

    async fn check_server_key(
        &mut self,
        key: &PublicKeyOrCertificate,
    ) -> Result<bool, Self::Error> {
        let PublicKeyOrCertificate::PublicKey { key, .. } = key else {
            *lock(&self.problem) = Some(HostKeyProblem::Certificate);
            return Ok(false);
        };
        let fp = key.fingerprint(HashAlg::Sha256).to_string();
        let verdict =
            russh::keys::check_known_hosts_path(&self.host, self.port, key, &self.known_hosts);
        let problem = match verdict {
            Ok(true) => return Ok(true),
            Ok(false) => HostKeyProblem::Unknown(fp),
            Err(russh::keys::Error::KeyChanged { line }) => HostKeyProblem::Changed {
                line,
                fingerprint: fp,
            },
            Err(e) => HostKeyProblem::Unreadable(e.to_string()),
        };
        *lock(&self.problem) = Some(problem);
        Ok(false)
    }
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

pub(crate) fn sftp_err(op: &'static str, name: &str, e: SftpError) -> BackendError {
    match e {
        SftpError::Status(s) => {
            let kind = match s.status_code {
                StatusCode::NoSuchFile => ErrorKind::NotFound,
                StatusCode::PermissionDenied => ErrorKind::PermissionDenied,
                StatusCode::NoConnection | StatusCode::ConnectionLost => ErrorKind::Unreachable,
                _ => ErrorKind::Io,
            };
            let transient = kind == ErrorKind::Unreachable;
            BackendError {
                kind,
                transient,
                op,
                name: name.to_string(),
                message: format!("{}: {}", s.status_code, s.error_message),
            }
        }
        SftpError::Timeout => BackendError::transient(
            ErrorKind::Unreachable,
            op,
            name,
            "the SFTP server did not answer in time",
        ),
        other => BackendError::transient(
            ErrorKind::Unreachable,
            op,
            name,
            format!("SFTP session lost: {other}"),
        ),
    }
}

pub(crate) fn is_missing(e: &SftpError) -> bool {
    matches!(e, SftpError::Status(s) if s.status_code == StatusCode::NoSuchFile)
}

pub(crate) fn default_key() -> Option<PathBuf> {
    let ssh = dirs::home_dir()?.join(".ssh");
    ["id_ed25519", "id_ecdsa", "id_rsa"]
        .iter()
        .map(|n| ssh.join(n))
        .find(|p| p.exists())
}

impl Dialer {
    /// Opens, authenticates and starts SFTP on a new SSH connection.
    pub(crate) async fn open(&self) -> Result<Arc<Conn>, BackendError> {
        let t = &self.target;
        let config = Arc::new(client::Config {
            nodelay: true,
            inactivity_timeout: Some(Duration::from_secs(300)),
            keepalive_interval: Some(Duration::from_secs(30)),
            window_size: 16 << 20,
            preferred: preferred_algorithms(),
            ..Default::default()
        });
        let problem = Arc::new(Mutex::new(None));
        let handler = HostCheck {
            host: t.host.clone(),
            port: t.port,
            known_hosts: self.auth.known_hosts.clone(),
            problem: problem.clone(),
        };
        let fail = |kind, msg: String| BackendError::new(kind, "connect", &self.location, msg);
        let connect = tokio::time::timeout(
            Duration::from_secs(20),
            client::connect(config, (t.host.as_str(), t.port), handler),
        )
        .await
        .map_err(|_| {
            BackendError::transient(
                ErrorKind::Unreachable,
                "connect",
                &self.location,
                "no SSH handshake within 20 s",
            )
        })?;
        let mut ssh = match connect {
            Ok(h) => h,
            Err(e) => {
                let p = lock(&problem).clone();
                return Err(match p {
                    Some(HostKeyProblem::Unknown(fp)) => fail(
                        ErrorKind::AuthFailed,
                        format!(
                            "the server's host key ({fp}) is not in {}; if it is the right server, record it with: ssh-keyscan -p {} {} >> {}",
                            self.auth.known_hosts.display(),
                            t.port,
                            t.host,
                            self.auth.known_hosts.display()
                        ),
                    ),
                    Some(HostKeyProblem::Changed { line, fingerprint }) => fail(
                        ErrorKind::AuthFailed,
                        format!(
                            "the server's host key changed (now {fingerprint}; {} line {line} has another): possible man-in-the-middle; refusing to connect",
                            self.auth.known_hosts.display()
                        ),
                    ),
                    Some(HostKeyProblem::Certificate) => fail(
                        ErrorKind::AuthFailed,
                        "the server presents an SSH certificate; only plain host keys are supported".into(),
                    ),
                    Some(HostKeyProblem::Unreadable(m)) => fail(
                        ErrorKind::AuthFailed,
                        format!("cannot check the host key against {}: {m}", self.auth.known_hosts.display()),
                    ),
                    None => BackendError::transient(
                        ErrorKind::Unreachable,
                        "connect",
                        &self.location,
                        format!("cannot connect to {}:{}: {e}", t.host, t.port),
                    ),
                });
            }
        };
        let mut authed = false;
        let mut dropped = false;
        if let Some(key) = &self.auth.key {
            let hash = ssh.best_supported_rsa_hash().await.ok().flatten().flatten();
            let r = ssh
                .authenticate_publickey(&t.user, PrivateKeyWithHashAlg::new(key.clone(), hash))
                .await
                .map_err(|e| unreachable_err(&self.location, e))?;
            authed = r.success();
            dropped |= session_ended(&r);
        }
        if !authed {
            if let Some(pw) = &self.auth.password {
                let r = ssh
                    .authenticate_password(&t.user, pw)
                    .await
                    .map_err(|e| unreachable_err(&self.location, e))?;
                authed = r.success();
                dropped |= session_ended(&r);
            }
        }
        if !authed && (dropped || ssh.is_closed()) {
            // A connection dropped mid-authentication also ends in "not
            // authenticated"; that is a vanished server, not a refusal.
            return Err(BackendError::transient(
                ErrorKind::Unreachable,
                "connect",
                &self.location,
                format!(
                    "the connection to {}:{} closed during authentication",
                    t.host, t.port
                ),
            ));
        }
        if !authed {
            let tried = match (&self.auth.key_path, &self.auth.password) {
                (Some(k), Some(_)) => format!("key {} and password", k.display()),
                (Some(k), None) => format!("key {}", k.display()),
                _ => "password".into(),
            };
            return Err(fail(
                ErrorKind::AuthFailed,
                format!(
                    "the server refused {} for user {} ({tried})",
                    t.host, t.user
                ),
            ));
        }
        let channel = ssh
            .channel_open_session()
            .await
            .map_err(|e| unreachable_err(&self.location, e))?;
        channel
            .request_subsystem(true, "sftp")
            .await
            .map_err(|e| unreachable_err(&self.location, e))?;
        let sftp = RawSftpSession::new(channel.into_stream());
        sftp.set_timeout(REQUEST_TIMEOUT);
        let version = sftp
            .init()
            .await
            .map_err(|e| sftp_err("connect", &self.location, e))?;
        let (mut read_len, mut write_len) = (DEFAULT_CHUNK, DEFAULT_CHUNK);
        if version.extensions.contains_key("limits@openssh.com") {
            if let Ok(l) = sftp.limits().await {
                // Leave room for the packet header inside max_packet_len.
                let cap = l.max_packet_len.saturating_sub(1024).max(DEFAULT_CHUNK);
                if l.max_read_len > 0 {
                    read_len = l.max_read_len.min(cap);
                }
                if l.max_write_len > 0 {
                    write_len = l.max_write_len.min(cap);
                }
            }
        }
        Ok(Arc::new(Conn {
            _ssh: ssh,
            sftp,
            read_len: read_len.min(256 * 1024),
            write_len: write_len.min(256 * 1024),
            fsync: version.extensions.contains_key("fsync@openssh.com"),
        }))
    }
}

/// A request already sent, whose answer is awaited later.
///
/// russh-sftp sends a request when its future is first polled. Polling it
/// once on creation puts requests on the wire in program order, which lets
/// requests the server must handle in order (writes, then the fsync, then
/// the close of one handle) go out together instead of one round trip
/// apart.
pub(crate) enum Sent<F: std::future::Future> {
    Answered(F::Output),
    Waiting(std::pin::Pin<Box<F>>),
}

impl<F: std::future::Future> Sent<F> {
    pub(crate) async fn now(f: F) -> Self {
        let mut f = Box::pin(f);
        match futures::poll!(f.as_mut()) {
            std::task::Poll::Ready(out) => Sent::Answered(out),
            std::task::Poll::Pending => Sent::Waiting(f),
        }
    }

    pub(crate) async fn answer(self) -> F::Output {
        match self {
            Sent::Answered(out) => out,
            Sent::Waiting(f) => f.await,
        }
    }
}

/// Resolves once the SSH session behind `c` has closed.
pub(crate) async fn closed(c: &Conn) {
    while !c._ssh.is_closed() {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// russh offers chacha20-poly1305 first, as OpenSSH does; but where the CPU
/// has AES instructions, AES-GCM costs a fraction of the cycles per byte, and
/// on two cores the cipher is what bounds a restore's throughput over SFTP.
/// Without them the default order stands.
fn preferred_algorithms() -> russh::Preferred {
    use russh::cipher;
    static AES_FIRST: &[cipher::Name] = &[
        cipher::AES_256_GCM,
        cipher::CHACHA20_POLY1305,
        cipher::AES_256_CTR,
        cipher::AES_192_CTR,
        cipher::AES_128_CTR,
    ];
    let mut preferred = russh::Preferred::default();
    if hardware_aes() {
        preferred.cipher = std::borrow::Cow::Borrowed(AES_FIRST);
    }
    preferred
}

fn hardware_aes() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("aes")
            && std::arch::is_x86_feature_detected!("pclmulqdq")
    }
    #[cfg(target_arch = "aarch64")]
    {
        std::arch::is_aarch64_feature_detected!("aes")
    }
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    {
        false
    }
}

fn unreachable_err(location: &str, e: russh::Error) -> BackendError {
    BackendError::transient(
        ErrorKind::Unreachable,
        "connect",
        location,
        format!("SSH: {e}"),
    )
}

/// russh reports a session that ended while waiting for the server's answer
/// as a failure with no methods left; a real refusal from OpenSSH always
/// names the methods that may continue.
fn session_ended(r: &client::AuthResult) -> bool {
    matches!(r, client::AuthResult::Failure { remaining_methods, partial_success: false } if remaining_methods.is_empty())
}
