//! S3-compatible object stores (AWS, MinIO, Ceph RGW, Garage, R2) through
//! the `object_store` crate.
//!
//! * No overwrite: a single PUT with `If-None-Match: *`, which the store
//!   decides atomically. Objects above [`MULTIPART_ABOVE`] go up as a
//!   multipart upload, invisible until completed; for those the check is a
//!   HEAD before the upload (a narrower guarantee, documented in
//!   docs/DESIGN.md; capsule's packs are far below the threshold).
//! * Credentials: `AWS_ACCESS_KEY_ID` / `AWS_SECRET_ACCESS_KEY` /
//!   `AWS_SESSION_TOKEN`, else the `AWS_PROFILE` (or `default`) section of
//!   `~/.aws/credentials`; the region from `AWS_REGION`,
//!   `AWS_DEFAULT_REGION` or `~/.aws/config`, else `us-east-1`.
//! * Retries are left to capsule's retry layer (so each attempt is counted
//!   as one request); the client's own retries are off.

use std::io::{Read, Write};
use std::ops::Range;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use capsule_backend::{
    check_range, validate_name, Backend, BackendError, Capabilities, ErrorKind, LabBackend,
    ObjectInfo,
};
use futures::{StreamExt, TryStreamExt};
use object_store::aws::{AmazonS3, AmazonS3Builder, S3ConditionalPut};
use object_store::path::Path;
use object_store::{
    ClientOptions, GetOptions, GetRange, ObjectStore, ObjectStoreExt, PutMode, PutOptions,
    PutPayload, RetryConfig,
};

mod history;

use crate::options::Options;
use crate::rt::block_on;
use crate::url::S3Target;

/// Objects larger than this are uploaded in parts.
pub const MULTIPART_ABOVE: u64 = 64 << 20;
const PART_SIZE: usize = 16 << 20;

/// An S3 bucket (and key prefix) as a capsule backend.
#[derive(Debug)]
pub struct S3Backend {
    store: Arc<AmazonS3>,
    prefix: String,
    location: String,
    concurrency: usize,
    /// For a bucket created outside us-east-1.
    region: String,
    /// `scheme://endpoint/bucket`, for the requests `object_store` does not
    /// make (bucket creation, versions, retention).
    base_url: String,
    /// The client those requests go through.
    http: reqwest::Client,
}

/// Reads `key` from the `[section]` of an AWS-style ini file.
fn ini_value(path: &std::path::Path, section: &str, key: &str) -> Option<String> {
    let text = std::fs::read_to_string(path).ok()?;
    let mut inside = false;
    for line in text.lines() {
        let line = line.trim();
        if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            inside = name.trim() == section;
        } else if inside {
            if let Some((k, v)) = line.split_once('=') {
                if k.trim() == key {
                    return Some(v.trim().to_string());
                }
            }
        }
    }
    None
}

fn aws_file(env: &str, default: &str) -> Option<PathBuf> {
    std::env::var_os(env)
        .map(PathBuf::from)
        .or_else(|| dirs::home_dir().map(|h| h.join(".aws").join(default)))
}

fn classify(op: &'static str, name: &str, e: object_store::Error) -> BackendError {
    use object_store::Error as E;
    let chain = tidy(&cause_chain(&e));
    let has = |needle: &str| chain.contains(needle);
    let (kind, transient) = match &e {
        _ if has("NoSuchBucket") => (ErrorKind::NoContainer, false),
        // A key whose policy covers other buckets (or other prefixes): the
        // credentials work, just not here.
        _ if has("AccessDenied") => {
            let bucket = between(&chain, "[bucket ", "]")
                .and_then(|b| b.split(',').next())
                .map_or("this bucket".to_string(), |b| format!("bucket {b}"));
            return BackendError::new(
                ErrorKind::PermissionDenied,
                op,
                name,
                format!("the store refuses these credentials for {bucket} (AccessDenied): check that the key's policy covers this bucket and prefix, and that the repository URL names the right bucket"),
            );
        }
        // Signed requests carry the client's time; a store refuses one more
        // than 15 minutes off its own clock. Retrying cannot help, and the
        // credentials are not at fault.
        _ if has("RequestTimeTooSkewed") => {
            return BackendError::new(
                ErrorKind::AuthFailed,
                op,
                name,
                "this machine's clock is more than 15 minutes off the store's, and the store refuses requests signed at that time (RequestTimeTooSkewed); set the clock right (NTP) and run again",
            )
        }
        E::NotFound { .. } => (ErrorKind::NotFound, false),
        E::AlreadyExists { .. } | E::Precondition { .. } | E::NotModified { .. } => {
            (ErrorKind::AlreadyExists, false)
        }
        _ if has("InvalidAccessKeyId")
            || has("SignatureDoesNotMatch")
            || has("InvalidToken")
            || has("ExpiredToken") =>
        {
            (ErrorKind::AuthFailed, false)
        }
        E::Unauthenticated { .. } => (ErrorKind::AuthFailed, false),
        E::PermissionDenied { .. } => (ErrorKind::PermissionDenied, false),
        _ if has("XMinioStorageFull")
            || has("Storage reached its minimum free drive threshold")
            || has("EntityTooLarge")
            || has("QuotaExceeded") =>
        {
            (ErrorKind::NoSpace, false)
        }
        _ if has("error sending request")
            || has("connection")
            || has("Connection")
            || has("timed out")
            || has("operation timed out")
            || has("error decoding response body")
            || has("HTTP error")
            || has("reset")
            || has("broken pipe")
            || has("500 Internal Server Error")
            || has("502 Bad Gateway")
            || has("503 Service Unavailable")
            || has("504 Gateway")
            || has("SlowDown")
            || has("XMinioServerNotInitialized")
            || has("InsufficientWriteQuorum")
            || has("InsufficientReadQuorum") =>
        {
            (ErrorKind::Unreachable, true)
        }
        _ => (ErrorKind::Io, false),
    };
    BackendError {
        kind,
        transient,
        op,
        name: name.to_string(),
        message: chain,
    }
}

/// The error's text with its causes, each said once: the store's own error
/// code is often only in a cause, but the HTTP client nests the same
/// sentence several levels deep ("error sending request" four times).
fn cause_chain(e: &object_store::Error) -> String {
    let mut chain = e.to_string();
    let mut src = std::error::Error::source(e);
    while let Some(s) = src {
        let text = s.to_string();
        if !chain.contains(&text) {
            chain.push_str(": ");
            chain.push_str(&text);
        }
        src = s.source();
    }
    chain
}

/// The text between `start` and the next `end` in `s`.
fn between<'a>(s: &'a str, start: &str, end: &str) -> Option<&'a str> {
    let from = s.find(start)? + start.len();
    let len = s[from..].find(end)?;
    Some(&s[from..from + len])
}

/// The error text with each XML error document the store sent replaced by
/// what it says: `Code: Message [bucket B, key K]`. The same document is
/// otherwise quoted at every level of the cause chain.
fn tidy(chain: &str) -> String {
    let mut out = String::new();
    let mut rest = chain;
    while let Some(at) = rest.find("<?xml") {
        out.push_str(&rest[..at]);
        let doc_end = rest[at..]
            .find("</Error>")
            .map_or(rest.len(), |e| at + e + "</Error>".len());
        let doc = &rest[at..doc_end];
        let field = |tag: &str| between(doc, &format!("<{tag}>"), &format!("</{tag}>"));
        let mut said = format!(
            "{}: {}",
            field("Code").unwrap_or("error"),
            field("Message").unwrap_or("")
        );
        let place: Vec<String> = [("bucket", "BucketName"), ("key", "Key")]
            .iter()
            .filter_map(|(what, tag)| field(tag).map(|v| format!("{what} {v}")))
            .collect();
        if !place.is_empty() {
            said.push_str(&format!(" [{}]", place.join(", ")));
        }
        if !out.contains(&said) {
            out.push_str(&said);
        }
        rest = &rest[doc_end..];
    }
    out.push_str(rest);
    out
}

/// How long one request may go unanswered before it counts as a transient
/// failure: 30 s, plus the time its body takes at 256 KiB/s. A distributed
/// store that has lost its write quorum answers a plain PUT at once (503
/// SlowDownWrite) but holds a conditional one, waiting for its lock, until
/// the client hangs up; without a deadline of our own each attempt took the
/// HTTP client's full two minutes.
fn answer_within(bytes: u64) -> Duration {
    Duration::from_secs(30) + Duration::from_secs_f64(bytes as f64 / (256.0 * 1024.0))
}

/// Runs one request under [`answer_within`]'s deadline.
async fn within<T>(
    op: &'static str,
    name: &str,
    bytes: u64,
    fut: impl std::future::Future<Output = Result<T, BackendError>>,
) -> Result<T, BackendError> {
    let limit = answer_within(bytes);
    match tokio::time::timeout(limit, fut).await {
        Ok(r) => r,
        Err(_) => Err(BackendError::transient(
            ErrorKind::Unreachable,
            op,
            name,
            format!(
                "no answer in {} s (a distributed store that has lost its quorum holds requests)",
                limit.as_secs()
            ),
        )),
    }
}

impl S3Backend {
    /// Builds the client. Does not contact the store (the first request
    /// does), so that a no-change backup pays no extra round trip.
    pub fn connect(t: &S3Target, opts: &Options) -> Result<Self, BackendError> {
        let scheme = if t.https { "https" } else { "http" };
        let location = crate::url::Destination::S3(t.clone()).to_string();
        let mut b = AmazonS3Builder::from_env()
            .with_endpoint(format!("{scheme}://{}", t.endpoint))
            .with_bucket_name(&t.bucket)
            .with_allow_http(!t.https)
            .with_virtual_hosted_style_request(false)
            .with_conditional_put(S3ConditionalPut::ETagMatch)
            .with_retry(RetryConfig {
                max_retries: 0,
                retry_timeout: Duration::from_secs(60),
                ..Default::default()
            })
            .with_client_options(
                ClientOptions::new()
                    .with_allow_http(!t.https)
                    .with_connect_timeout(Duration::from_secs(10))
                    .with_timeout(Duration::from_secs(120))
                    .with_pool_max_idle_per_host(32),
            );
        let env = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
        let aws_profile = opts
            .aws_profile
            .clone()
            .or_else(|| env("AWS_PROFILE"))
            .unwrap_or_else(|| "default".into());
        // SigV4 signs the body with a SHA-256 that both ends compute over
        // every byte: 10-15% of a backup's CPU here, and a NAS-class server
        // may hash slower than its link. TLS already protects the body in
        // transit, so over HTTPS it is skipped, as the AWS SDKs do; over
        // plain HTTP the signature is the only transit check and stays.
        // capsule authenticates every object itself either way.
        if env("AWS_UNSIGNED_PAYLOAD").is_none() {
            b = b.with_unsigned_payload(t.https);
        }
        if env("AWS_ACCESS_KEY_ID").is_none() {
            let profile = aws_profile.clone();
            if let Some(creds) = aws_file("AWS_SHARED_CREDENTIALS_FILE", "credentials") {
                if let Some(k) = ini_value(&creds, &profile, "aws_access_key_id") {
                    b = b.with_access_key_id(k);
                }
                if let Some(s) = ini_value(&creds, &profile, "aws_secret_access_key") {
                    b = b.with_secret_access_key(s);
                }
                if let Some(s) = ini_value(&creds, &profile, "aws_session_token") {
                    b = b.with_token(s);
                }
            }
        }
        let mut region = env("AWS_REGION")
            .or_else(|| env("AWS_DEFAULT_REGION"))
            .unwrap_or_else(|| "us-east-1".into());
        if env("AWS_REGION").is_none() && env("AWS_DEFAULT_REGION").is_none() {
            let profile = aws_profile.clone();
            let section = if profile == "default" {
                profile
            } else {
                format!("profile {profile}")
            };
            region = aws_file("AWS_CONFIG_FILE", "config")
                .and_then(|c| ini_value(&c, &section, "region"))
                .unwrap_or_else(|| "us-east-1".into());
            b = b.with_region(&region);
        }
        let store = b.build().map_err(|e| {
            let mut err = classify("connect", &location, e);
            if err.message.contains("Missing") || err.message.contains("credential") {
                err.kind = ErrorKind::AuthFailed;
                err.message = format!(
                    "{}; set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY or an ~/.aws/credentials profile",
                    err.message
                );
            }
            err
        })?;
        Ok(S3Backend {
            store: Arc::new(store),
            prefix: t.prefix.clone(),
            location,
            concurrency: opts.concurrency.unwrap_or(8).max(1),
            region,
            base_url: format!("{scheme}://{}/{}", t.endpoint, t.bucket),
            http: reqwest::Client::new(),
        })
    }

    /// Creates the bucket if it does not exist, as restic and kopia do at
    /// `init`, with object lock (and so versioning) on when `locked`.
    /// Returns whether it created one. A bucket that exists costs one
    /// listing request; credentials that may not create buckets give an
    /// access error that says so.
    pub fn ensure_bucket(&self, locked: bool) -> Result<bool, BackendError> {
        block_on(async {
            let probe = self.store.list_with_delimiter(None).await;
            match probe.map_err(|e| classify("list", &self.location, e)) {
                Ok(_) => return Ok(false),
                Err(e) if e.kind == ErrorKind::NoContainer => {}
                Err(e) => return Err(e),
            }
            let fail =
                |kind, msg: String| BackendError::new(kind, "create bucket", &self.location, msg);
            let headers: Vec<(&str, String)> = if locked {
                vec![("x-amz-bucket-object-lock-enabled", "true".into())]
            } else {
                Vec::new()
            };
            match self
                .raw("create bucket", reqwest::Method::PUT, None, "", &headers, self.location_constraint())
                .await
            {
                Ok(_) => Ok(true),
                // Created meanwhile by someone else with these credentials.
                Err(e) if e.message.contains("BucketAlreadyOwnedByYou") => Ok(false),
                Err(e) if matches!(e.kind, ErrorKind::PermissionDenied | ErrorKind::AuthFailed) => Err(fail(
                    ErrorKind::PermissionDenied,
                    format!(
                        "the bucket does not exist and these credentials may not create it ({}); create it, or use credentials that may",
                        e.message
                    ),
                )),
                Err(e) if e.transient => Err(e),
                Err(e) => Err(fail(
                    ErrorKind::NoContainer,
                    format!("the bucket does not exist and creating it failed: {}", e.message),
                )),
            }
        })
    }

    /// The body of a CreateBucket outside us-east-1.
    fn location_constraint(&self) -> Vec<u8> {
        if self.region == "us-east-1" {
            return Vec::new();
        }
        format!(
            "<CreateBucketConfiguration xmlns=\"http://s3.amazonaws.com/doc/2006-03-01/\"><LocationConstraint>{}</LocationConstraint></CreateBucketConfiguration>",
            self.region
        )
        .into_bytes()
    }

    fn key(&self, name: &str) -> Path {
        if self.prefix.is_empty() {
            Path::from(name)
        } else {
            Path::from(format!("{}/{name}", self.prefix))
        }
    }

    fn strip(&self, key: &Path) -> String {
        let k = key.as_ref();
        if self.prefix.is_empty() {
            k.to_string()
        } else {
            k.strip_prefix(&self.prefix)
                .map(|r| r.trim_start_matches('/'))
                .unwrap_or(k)
                .to_string()
        }
    }

    async fn put_multipart(
        &self,
        name: &str,
        size: u64,
        data: &mut dyn Read,
    ) -> Result<(), BackendError> {
        let key = self.key(name);
        match self.store.head(&key).await {
            Ok(_) => {
                return Err(BackendError::new(
                    ErrorKind::AlreadyExists,
                    "put",
                    name,
                    "object exists",
                ))
            }
            Err(object_store::Error::NotFound { .. }) => {}
            Err(e) => return Err(classify("put", name, e)),
        }
        let mut up = self
            .store
            .put_multipart(&key)
            .await
            .map_err(|e| classify("put", name, e))?;
        let result = async {
            let mut left = size;
            let mut in_flight = futures::stream::FuturesUnordered::new();
            while left > 0 {
                let n = left.min(PART_SIZE as u64);
                let mut buf = Vec::with_capacity(n as usize);
                capsule_backend::read_exact_len(data, n, &mut buf, name)?;
                left -= n;
                in_flight.push(up.put_part(PutPayload::from(buf)));
                // Bounded: at most four parts (64 MiB) in memory at once.
                while in_flight.len() >= 4 {
                    if let Some(r) = in_flight.next().await {
                        r.map_err(|e| classify("put", name, e))?;
                    }
                }
            }
            while let Some(r) = in_flight.next().await {
                r.map_err(|e| classify("put", name, e))?;
            }
            up.complete().await.map_err(|e| classify("put", name, e))?;
            Ok::<(), BackendError>(())
        }
        .await;
        if result.is_err() {
            let _ = up.abort().await;
        }
        result
    }

    async fn get_bounded(&self, name: &str, r: Range<u64>) -> Result<bytes::Bytes, BackendError> {
        if r.start == r.end {
            // S3 cannot serve an empty range; check the bounds with a HEAD.
            let meta = self
                .store
                .head(&self.key(name))
                .await
                .map_err(|e| classify("get", name, e))?;
            check_range(name, &r, meta.size)?;
            return Ok(bytes::Bytes::new());
        }
        let opts = GetOptions {
            range: Some(GetRange::Bounded(r.clone())),
            ..Default::default()
        };
        let res = self
            .store
            .get_opts(&self.key(name), opts)
            .await
            .map_err(|e| range_error(classify("get", name, e), name, &r))?;
        let size = res.meta.size;
        check_range(name, &r, size)?;
        res.bytes().await.map_err(|e| classify("get", name, e))
    }
}

/// S3 answers a range past the end with 416 or a short body; both are the
/// contract's `InvalidRange`. A transient failure stays one, whatever its
/// message says: a connection reset in the middle of a ranged GET names the
/// range too, and calling it `InvalidRange` made a restore give up on an
/// intact pack (found by the long cut sweep).
fn range_error(e: BackendError, name: &str, r: &Range<u64>) -> BackendError {
    if !e.transient
        && (e.message.contains("416") || e.message.contains("Range") || e.message.contains("range"))
    {
        BackendError::new(
            ErrorKind::InvalidRange,
            "get",
            name,
            format!("range {}..{} outside object", r.start, r.end),
        )
    } else {
        e
    }
}

impl S3Backend {
    fn put_bytes(&self, name: &str, body: bytes::Bytes) -> Result<(), BackendError> {
        let opts = PutOptions {
            mode: PutMode::Create,
            ..Default::default()
        };
        let bytes = body.len() as u64;
        let put = async {
            self.store
                .put_opts(&self.key(name), PutPayload::from(body), opts)
                .await
                .map(|_| ())
                .map_err(|e| classify("put", name, e))
        };
        block_on(within("put", name, bytes, put))
    }
}

impl Backend for S3Backend {
    fn put(&self, name: &str, data: &[u8]) -> Result<(), BackendError> {
        validate_name(name)?;
        if data.len() as u64 > MULTIPART_ABOVE {
            return self.put_stream(name, data.len() as u64, &mut &data[..]);
        }
        self.put_bytes(name, bytes::Bytes::copy_from_slice(data))
    }

    /// The request body is the buffer itself, not a copy; once the request
    /// is done and no clone of it is left, it is given back.
    fn put_owned(&self, name: &str, data: Vec<u8>) -> (Result<(), BackendError>, Option<Vec<u8>>) {
        if let Err(e) = validate_name(name) {
            return (Err(e), Some(data));
        }
        if data.len() as u64 > MULTIPART_ABOVE {
            let r = self.put_stream(name, data.len() as u64, &mut &data[..]);
            return (r, Some(data));
        }
        let body = bytes::Bytes::from(data);
        let r = self.put_bytes(name, body.clone());
        // The buffer always goes back, so that a failed put can be retried:
        // after a reset the HTTP client may still hold its copy of the body
        // for a moment, and then it is copied. Giving nothing back made the
        // retry layer give up after two attempts on a 300 ms blip.
        let back = body
            .try_into_mut()
            .map(Vec::from)
            .unwrap_or_else(|shared| shared.to_vec());
        (r, Some(back))
    }

    fn put_stream(&self, name: &str, size: u64, data: &mut dyn Read) -> Result<(), BackendError> {
        validate_name(name)?;
        if size <= MULTIPART_ABOVE {
            let mut buf = Vec::new();
            capsule_backend::read_exact_len(data, size, &mut buf, name)?;
            return self.put(name, &buf);
        }
        block_on(self.put_multipart(name, size, data))
    }

    fn get(&self, name: &str, range: Option<Range<u64>>) -> Result<Vec<u8>, BackendError> {
        validate_name(name)?;
        block_on(async {
            match range {
                Some(r) => {
                    let len = r.end.saturating_sub(r.start);
                    within("get", name, len, self.get_bounded(name, r))
                        .await
                        .map(|b| b.to_vec())
                }
                None => {
                    let res = self
                        .store
                        .get(&self.key(name))
                        .await
                        .map_err(|e| classify("get", name, e))?;
                    res.bytes()
                        .await
                        .map(|b| b.to_vec())
                        .map_err(|e| classify("get", name, e))
                }
            }
        })
    }

    fn get_stream(
        &self,
        name: &str,
        range: Option<Range<u64>>,
        out: &mut dyn Write,
    ) -> Result<u64, BackendError> {
        validate_name(name)?;
        block_on(async {
            let opts = GetOptions {
                range: range
                    .clone()
                    .filter(|r| r.start < r.end)
                    .map(GetRange::Bounded),
                ..Default::default()
            };
            if let Some(r) = range.as_ref().filter(|r| r.start == r.end) {
                self.get_bounded(name, r.clone()).await?;
                return Ok(0);
            }
            let res =
                self.store
                    .get_opts(&self.key(name), opts)
                    .await
                    .map_err(|e| match &range {
                        Some(r) => range_error(classify("get", name, e), name, r),
                        None => classify("get", name, e),
                    })?;
            if let Some(r) = &range {
                check_range(name, r, res.meta.size)?;
            }
            let mut stream = res.into_stream();
            let mut n = 0u64;
            while let Some(chunk) = stream
                .try_next()
                .await
                .map_err(|e| classify("get", name, e))?
            {
                out.write_all(&chunk)
                    .map_err(|e| capsule_backend::write_out_error(name, e))?;
                n += chunk.len() as u64;
            }
            Ok(n)
        })
    }

    fn stat(&self, name: &str) -> Result<ObjectInfo, BackendError> {
        validate_name(name)?;
        let head = async {
            self.store
                .head(&self.key(name))
                .await
                .map_err(|e| classify("stat", name, e))
        };
        let meta = block_on(within("stat", name, 0, head))?;
        Ok(ObjectInfo {
            name: name.to_string(),
            size: meta.size,
            modified: Some(meta.last_modified.timestamp()),
        })
    }

    fn list(&self, prefix: &str) -> Result<Vec<ObjectInfo>, BackendError> {
        let p = self.key(prefix.trim_end_matches('/'));
        let p = if p.as_ref().is_empty() {
            None
        } else {
            Some(&p)
        };
        block_on(async {
            let mut out = Vec::new();
            let mut s = self.store.list(p);
            while let Some(meta) = s
                .try_next()
                .await
                .map_err(|e| classify("list", prefix, e))?
            {
                let name = self.strip(&meta.location);
                if name.starts_with(prefix) {
                    out.push(ObjectInfo {
                        name,
                        size: meta.size,
                        modified: Some(meta.last_modified.timestamp()),
                    });
                }
            }
            Ok(out)
        })
    }

    fn delete(&self, name: &str) -> Result<(), BackendError> {
        validate_name(name)?;
        let delete = async {
            match self.store.delete(&self.key(name)).await {
                Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
                Err(e) => Err(classify("delete", name, e)),
            }
        };
        block_on(within("delete", name, 0, delete))
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            concurrency: self.concurrency,
            durable_put: true,
            local: false,
            buffers_puts: true,
        }
    }

    fn location(&self) -> String {
        self.location.clone()
    }

    fn history(&self) -> Option<&dyn capsule_backend::History> {
        Some(self)
    }
}

impl LabBackend for S3Backend {
    /// One plain PUT that may replace: an object store acknowledges only
    /// what it has stored durably, so `sync` and `writes` change nothing.
    fn probe_write(
        &self,
        name: &str,
        data: &[u8],
        _writes: usize,
        _sync: bool,
    ) -> Result<(), BackendError> {
        validate_name(name)?;
        let payload = PutPayload::from(bytes::Bytes::copy_from_slice(data));
        block_on(
            self.store
                .put_opts(&self.key(name), payload, PutOptions::default()),
        )
        .map(|_| ())
        .map_err(|e| classify("probe", name, e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A reset in the middle of a ranged GET is retried, not taken for a
    /// range past the end; a refused range is `InvalidRange`.
    #[test]
    fn only_a_refused_range_is_an_invalid_range() {
        let r = 3_145_892..4_336_191;
        let cut = BackendError::transient(
            ErrorKind::Unreachable,
            "get",
            "data/f6/f6b4",
            "Generic S3 error: error sending request for GET with range 3145892-4336190: connection reset",
        );
        let e = range_error(cut, "data/f6/f6b4", &r);
        assert!(e.transient && e.kind == ErrorKind::Unreachable, "{e:?}");
        let refused = BackendError::new(
            ErrorKind::Io,
            "get",
            "data/f6/f6b4",
            "Server returned non-2xx status code: 416 Range Not Satisfiable",
        );
        let e = range_error(refused, "data/f6/f6b4", &r);
        assert_eq!(e.kind, ErrorKind::InvalidRange);
    }

    /// An error whose text repeats its cause's, as the HTTP client's do.
    #[derive(Debug)]
    struct Nested(String, Option<Box<Nested>>);
    impl std::fmt::Display for Nested {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str(&self.0)
        }
    }
    impl std::error::Error for Nested {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            self.1.as_deref().map(|n| n as _)
        }
    }
    fn nested(texts: &[&str]) -> object_store::Error {
        let mut inner = None;
        for t in texts.iter().rev() {
            inner = Some(Box::new(Nested(t.to_string(), inner)));
        }
        object_store::Error::Generic {
            store: "S3",
            source: inner.unwrap(),
        }
    }

    #[test]
    fn each_cause_is_said_once() {
        let e = nested(&[
            "Error performing PUT http://n2:9000/b/k in 120s - HTTP error: error sending request",
            "HTTP error: error sending request",
            "error sending request",
            "operation timed out",
        ]);
        let b = classify("put", "k", e);
        assert!(b.transient, "{b:?}");
        assert_eq!(b.message.matches("error sending request").count(), 1, "{b}");
        assert!(b.message.ends_with(": operation timed out"), "{b}");
    }

    #[test]
    fn a_key_for_another_bucket_is_named() {
        let doc = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Error><Code>AccessDenied</Code><Message>Access Denied.</Message><Key>r/config</Key><BucketName>capsule-other</BucketName><RequestId>1</RequestId></Error>";
        let outer = format!("Error performing GET http://h/capsule-other/r/config - Server returned non-2xx status code: 403 Forbidden: {doc}");
        let e = nested(&[
            &format!("The operation lacked the necessary privileges: {outer}"),
            &outer,
        ]);
        let b = classify("get", "config", e);
        assert_eq!(b.kind, ErrorKind::PermissionDenied, "{b:?}");
        assert!(
            b.message
                .contains("for bucket capsule-other (AccessDenied)"),
            "{b}"
        );
        assert!(!b.message.contains("<Error>"), "{b}");
        let t = tidy(&format!("a: {doc}: b: {doc}"));
        assert_eq!(
            t,
            "a: AccessDenied: Access Denied. [bucket capsule-other, key r/config]: b: "
        );
    }

    #[test]
    fn a_clock_far_off_is_named_and_not_retried() {
        let e = nested(&["<Code>RequestTimeTooSkewed</Code> 403 Forbidden"]);
        let b = classify("put", "k", e);
        assert!(!b.transient && b.kind == ErrorKind::AuthFailed, "{b:?}");
        assert!(b.message.contains("clock"), "{b}");
    }

    #[test]
    fn a_store_without_quorum_is_waited_for() {
        for text in [
            "<Code>SlowDownWrite</Code> 503 Service Unavailable",
            "<Code>SlowDownRead</Code>",
            "<Code>XMinioServerNotInitialized</Code>",
        ] {
            let b = classify("put", "k", nested(&[text]));
            assert!(
                b.transient && b.kind == ErrorKind::Unreachable,
                "{text}: {b:?}"
            );
        }
        // The deadline grows with the body: a 16 MiB pack at 256 KiB/s.
        assert_eq!(answer_within(16 << 20).as_secs(), 94);
    }
}
