//! A versioned, object-locked bucket's own requests (versions, retention,
//! lock configuration), which `object_store` does not make: signed here
//! with its SigV4 signer and the same credentials, and sent with the same
//! HTTP client library.

use std::ops::Range;

use capsule_backend::{
    validate_name, BackendError, ErrorKind, History, LifecycleRule, LockMode, LockState,
    ObjectVersion, Retention,
};
use md5::{Digest, Md5};
use object_store::aws::AwsAuthorizer;
use object_store::{ObjectStore, ObjectStoreExt};
use serde::Deserialize;

use super::{tidy, S3Backend};
use crate::rt::block_on;

/// What one raw request answered.
pub(super) struct Answer {
    status: u16,
    body: bytes::Bytes,
}

impl Answer {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "PascalCase", default)]
struct ListVersionsResult {
    is_truncated: bool,
    next_key_marker: Option<String>,
    next_version_id_marker: Option<String>,
    #[serde(rename = "$value")]
    entries: Vec<Entry>,
}

#[derive(Deserialize)]
enum Entry {
    Version(VersionXml),
    DeleteMarker(VersionXml),
    #[serde(other)]
    Other,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "PascalCase", default)]
struct VersionXml {
    key: String,
    version_id: String,
    is_latest: bool,
    last_modified: String,
    size: u64,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "PascalCase", default)]
struct LockXml {
    object_lock_enabled: Option<String>,
    rule: Option<RuleXml>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "PascalCase", default)]
struct RuleXml {
    default_retention: Option<DefaultXml>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "PascalCase", default)]
struct DefaultXml {
    mode: String,
    days: Option<u32>,
    years: Option<u32>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "PascalCase", default)]
struct RetentionXml {
    mode: String,
    retain_until_date: String,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "PascalCase", default)]
struct LifecycleXml {
    #[serde(rename = "Rule")]
    rules: Vec<LifecycleRuleXml>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "PascalCase", default)]
struct LifecycleRuleXml {
    #[serde(rename = "ID")]
    id: String,
    status: String,
    prefix: Option<String>,
    filter: Option<FilterXml>,
    expiration: Option<ExpirationXml>,
    noncurrent_version_expiration: Option<NoncurrentXml>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "PascalCase", default)]
struct FilterXml {
    prefix: Option<String>,
    and: Option<AndXml>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "PascalCase", default)]
struct AndXml {
    prefix: Option<String>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "PascalCase", default)]
struct ExpirationXml {
    days: Option<u32>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "PascalCase", default)]
struct NoncurrentXml {
    noncurrent_days: Option<u32>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "PascalCase", default)]
struct VersioningXml {
    status: Option<String>,
}

fn unix(op: &'static str, name: &str, iso: &str) -> Result<f64, BackendError> {
    let t: jiff::Timestamp = iso.parse().map_err(|e| {
        BackendError::new(
            ErrorKind::Io,
            op,
            name,
            format!("the store sent a time capsule cannot read ({iso:?}: {e})"),
        )
    })?;
    Ok(t.as_millisecond() as f64 / 1000.0)
}

fn iso(unix: i64) -> String {
    jiff::Timestamp::from_second(unix)
        .unwrap_or(jiff::Timestamp::UNIX_EPOCH)
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string()
}

fn xml<T: for<'de> Deserialize<'de>>(
    op: &'static str,
    name: &str,
    a: &Answer,
) -> Result<T, BackendError> {
    quick_xml::de::from_str(&a.text()).map_err(|e| {
        BackendError::new(
            ErrorKind::Io,
            op,
            name,
            format!("the store's answer is not the XML S3 sends ({e})"),
        )
    })
}

impl S3Backend {
    /// One signed request, tried again on a transient failure (four
    /// attempts over about 3.5 s): these requests bypass the retry layer,
    /// which wraps the backend contract only.
    pub(super) async fn raw(
        &self,
        op: &'static str,
        method: reqwest::Method,
        key: Option<&str>,
        query: &str,
        headers: &[(&str, String)],
        body: Vec<u8>,
    ) -> Result<Answer, BackendError> {
        let mut pause = std::time::Duration::from_millis(500);
        let mut attempt = 1;
        loop {
            match self
                .raw_once(op, method.clone(), key, query, headers, body.clone())
                .await
            {
                Err(e) if e.transient && attempt < 4 => {
                    tokio::time::sleep(pause).await;
                    pause *= 2;
                    attempt += 1;
                }
                r => return r,
            }
        }
    }

    async fn raw_once(
        &self,
        op: &'static str,
        method: reqwest::Method,
        key: Option<&str>,
        query: &str,
        headers: &[(&str, String)],
        body: Vec<u8>,
    ) -> Result<Answer, BackendError> {
        let name = key.unwrap_or("");
        let mut url = self.base_url.clone();
        if let Some(k) = key {
            url.push('/');
            url.push_str(self.key(k).as_ref());
        }
        if !query.is_empty() {
            url.push('?');
            url.push_str(query);
        }
        let fail = |kind, msg: String| BackendError::new(kind, op, name, msg);
        let cred = self
            .store
            .credentials()
            .get_credential()
            .await
            .map_err(|e| fail(ErrorKind::AuthFailed, e.to_string()))?;
        let mut req = http::Request::builder().method(method.as_str()).uri(&url);
        for (k, v) in headers {
            req = req.header(*k, v.as_str());
        }
        let mut req = req
            .body(object_store::client::HttpRequestBody::from(body.clone()))
            .map_err(|e| fail(ErrorKind::Io, e.to_string()))?;
        AwsAuthorizer::new(&cred, "s3", &self.region)
            .try_authorize(&mut req, None)
            .map_err(|e| fail(ErrorKind::AuthFailed, e.to_string()))?;
        let send = async {
            let resp = self
                .http
                .request(method, &url)
                .headers(req.headers().clone())
                .body(body)
                .send()
                .await
                .map_err(|e| {
                    BackendError::transient(ErrorKind::Unreachable, op, name, e.to_string())
                })?;
            let status = resp.status().as_u16();
            let body = resp.bytes().await.map_err(|e| {
                BackendError::transient(ErrorKind::Unreachable, op, name, e.to_string())
            })?;
            Ok(Answer { status, body })
        };
        let a = super::within(op, name, 0, send).await?;
        if (200..300).contains(&a.status) {
            return Ok(a);
        }
        let text = tidy(&a.text());
        let code = super::between(&text, "", ":").unwrap_or("").to_string();
        let kind = match (a.status, code.as_str()) {
            (404, _) => ErrorKind::NotFound,
            (_, "NoSuchBucket") => ErrorKind::NoContainer,
            (401, _) | (_, "InvalidAccessKeyId") | (_, "SignatureDoesNotMatch") => {
                ErrorKind::AuthFailed
            }
            (403, _) => ErrorKind::PermissionDenied,
            _ => ErrorKind::Io,
        };
        let mut e = fail(kind, format!("{} {text}", a.status));
        e.transient = matches!(a.status, 500 | 502 | 503 | 504);
        Err(e)
    }

    fn md5_header(body: &[u8]) -> (&'static str, String) {
        use base64::Engine;
        (
            "content-md5",
            base64::engine::general_purpose::STANDARD.encode(Md5::digest(body)),
        )
    }
}

impl History for S3Backend {
    fn lock_state(&self) -> Result<LockState, BackendError> {
        block_on(async {
            let v = self
                .raw(
                    "versioning",
                    reqwest::Method::GET,
                    None,
                    "versioning=",
                    &[],
                    Vec::new(),
                )
                .await?;
            let v: VersioningXml = xml("versioning", "", &v)?;
            let mut state = LockState {
                versioned: v.status.as_deref() == Some("Enabled"),
                ..LockState::default()
            };
            let lock = self
                .raw(
                    "object lock",
                    reqwest::Method::GET,
                    None,
                    "object-lock=",
                    &[],
                    Vec::new(),
                )
                .await;
            let lock = match lock {
                Ok(a) => a,
                // "ObjectLockConfigurationNotFoundError": no lock on this bucket.
                Err(e) if e.kind == ErrorKind::NotFound || e.message.contains("ObjectLock") => {
                    return Ok(state)
                }
                Err(e) => return Err(e),
            };
            let lock: LockXml = xml("object lock", "", &lock)?;
            state.lock_enabled = lock.object_lock_enabled.as_deref() == Some("Enabled");
            state.default_retention = lock.rule.and_then(|r| r.default_retention).and_then(|d| {
                let days = d.days.or(d.years.map(|y| y * 365))?;
                Some((LockMode::parse(&d.mode)?, days))
            });
            Ok(state)
        })
    }

    fn lifecycle(&self) -> Result<Vec<LifecycleRule>, BackendError> {
        let a = block_on(self.raw(
            "lifecycle",
            reqwest::Method::GET,
            None,
            "lifecycle=",
            &[],
            Vec::new(),
        ));
        let a = match a {
            Ok(a) => a,
            Err(e)
                if e.kind == ErrorKind::NotFound
                    || e.message.contains("NoSuchLifecycleConfiguration") =>
            {
                return Ok(Vec::new())
            }
            Err(e) => return Err(e),
        };
        let l: LifecycleXml = xml("lifecycle", "", &a)?;
        let ours = if self.prefix.is_empty() {
            String::new()
        } else {
            format!("{}/", self.prefix)
        };
        Ok(l.rules
            .into_iter()
            .map(|r| {
                let prefix = r
                    .filter
                    .as_ref()
                    .and_then(|f| {
                        f.prefix
                            .clone()
                            .or_else(|| f.and.as_ref().and_then(|a| a.prefix.clone()))
                    })
                    .or(r.prefix)
                    .unwrap_or_default();
                LifecycleRule {
                    id: r.id,
                    enabled: r.status == "Enabled",
                    prefix,
                    expire_current_days: r.expiration.and_then(|e| e.days),
                    expire_noncurrent_days: r
                        .noncurrent_version_expiration
                        .and_then(|n| n.noncurrent_days),
                }
            })
            // Rules whose prefix reaches the repository's objects.
            .filter(|r| ours.starts_with(&r.prefix) || r.prefix.starts_with(&ours))
            .collect())
    }

    fn set_default_retention(&self, mode: LockMode, days: u32) -> Result<(), BackendError> {
        let body = format!(
            "<ObjectLockConfiguration xmlns=\"http://s3.amazonaws.com/doc/2006-03-01/\"><ObjectLockEnabled>Enabled</ObjectLockEnabled><Rule><DefaultRetention><Mode>{}</Mode><Days>{days}</Days></DefaultRetention></Rule></ObjectLockConfiguration>",
            mode.s3_name()
        )
        .into_bytes();
        let md5 = Self::md5_header(&body);
        block_on(self.raw(
            "object lock",
            reqwest::Method::PUT,
            None,
            "object-lock=",
            &[md5],
            body,
        ))
        .map(|_| ())
    }

    fn retention(
        &self,
        name: &str,
        version: Option<&str>,
    ) -> Result<Option<Retention>, BackendError> {
        validate_name(name)?;
        let query = match version {
            Some(v) => format!("retention=&versionId={v}"),
            None => "retention=".into(),
        };
        let a = block_on(self.raw(
            "retention",
            reqwest::Method::GET,
            Some(name),
            &query,
            &[],
            Vec::new(),
        ));
        let a = match a {
            Ok(a) => a,
            Err(e) if e.message.contains("NoSuchObjectLockConfiguration") => return Ok(None),
            Err(e) => return Err(e),
        };
        let r: RetentionXml = xml("retention", name, &a)?;
        let Some(mode) = LockMode::parse(&r.mode) else {
            return Ok(None);
        };
        Ok(Some(Retention {
            mode,
            until: unix("retention", name, &r.retain_until_date)? as i64,
        }))
    }

    fn set_retention(&self, name: &str, mode: LockMode, until: i64) -> Result<(), BackendError> {
        validate_name(name)?;
        let body = format!(
            "<Retention xmlns=\"http://s3.amazonaws.com/doc/2006-03-01/\"><Mode>{}</Mode><RetainUntilDate>{}</RetainUntilDate></Retention>",
            mode.s3_name(),
            iso(until)
        )
        .into_bytes();
        let md5 = Self::md5_header(&body);
        block_on(self.raw(
            "extend retention",
            reqwest::Method::PUT,
            Some(name),
            "retention=",
            &[md5],
            body,
        ))
        .map(|_| ())
    }

    fn versions(&self, prefix: &str) -> Result<Vec<ObjectVersion>, BackendError> {
        let full = self.key(prefix).as_ref().to_string();
        let full = if self.prefix.is_empty() || !prefix.is_empty() {
            full
        } else {
            format!("{}/", self.prefix)
        };
        let enc = |s: &str| url::form_urlencoded::byte_serialize(s.as_bytes()).collect::<String>();
        let mut out = Vec::new();
        let mut marker: Option<(String, String)> = None;
        // Bounded: a listing of a million pages is no repository of ours.
        for _ in 0..1_000_000 {
            let mut query = format!("prefix={}&versions=", enc(&full));
            if let Some((k, v)) = &marker {
                query.push_str(&format!(
                    "&key-marker={}&version-id-marker={}",
                    enc(k),
                    enc(v)
                ));
            }
            let a = block_on(self.raw(
                "list versions",
                reqwest::Method::GET,
                None,
                &query,
                &[],
                Vec::new(),
            ))?;
            let page: ListVersionsResult = xml("list versions", prefix, &a)?;
            for e in page.entries {
                let (v, delete_marker) = match e {
                    Entry::Version(v) => (v, false),
                    Entry::DeleteMarker(v) => (v, true),
                    Entry::Other => continue,
                };
                let name = self.strip(&object_store::path::Path::from(v.key.as_str()));
                out.push(ObjectVersion {
                    modified: unix("list versions", &name, &v.last_modified)?,
                    name,
                    version: v.version_id,
                    size: v.size,
                    latest: v.is_latest,
                    delete_marker,
                });
            }
            match (page.is_truncated, page.next_key_marker) {
                (true, Some(k)) => {
                    marker = Some((k, page.next_version_id_marker.unwrap_or_default()))
                }
                _ => break,
            }
        }
        // S3 lists each name's versions newest first; the contract says
        // oldest first (ties then resolve to the later one).
        let mut start = 0;
        while start < out.len() {
            let mut end = start + 1;
            while end < out.len() && out[end].name == out[start].name {
                end += 1;
            }
            out[start..end].reverse();
            start = end;
        }
        Ok(out)
    }

    fn get_version(
        &self,
        name: &str,
        version: &str,
        range: Option<Range<u64>>,
    ) -> Result<Vec<u8>, BackendError> {
        validate_name(name)?;
        let opts = object_store::GetOptions {
            version: Some(version.to_string()),
            range: range
                .clone()
                .filter(|r| r.start < r.end)
                .map(object_store::GetRange::Bounded),
            ..Default::default()
        };
        if range.as_ref().is_some_and(|r| r.start == r.end) {
            return Ok(Vec::new());
        }
        block_on(async {
            let res = self
                .store
                .get_opts(&self.key(name), opts)
                .await
                .map_err(|e| super::classify("get", name, e))?;
            res.bytes()
                .await
                .map(|b| b.to_vec())
                .map_err(|e| super::classify("get", name, e))
        })
    }

    fn delete_version(&self, name: &str, version: &str) -> Result<(), BackendError> {
        validate_name(name)?;
        let enc: String = url::form_urlencoded::byte_serialize(version.as_bytes()).collect();
        block_on(self.raw(
            "delete version",
            reqwest::Method::DELETE,
            Some(name),
            &format!("versionId={enc}"),
            &[],
            Vec::new(),
        ))
        .map(|_| ())
    }

    fn overwrite(&self, name: &str, data: &[u8]) -> Result<(), BackendError> {
        validate_name(name)?;
        let payload = object_store::PutPayload::from(bytes::Bytes::copy_from_slice(data));
        block_on(async {
            self.store
                .put(&self.key(name), payload)
                .await
                .map(|_| ())
                .map_err(|e| super::classify("put", name, e))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_version_listing_reads() {
        let doc = r#"<?xml version="1.0" encoding="UTF-8"?>
<ListVersionsResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/"><Name>b</Name><Prefix>p/</Prefix><KeyMarker></KeyMarker><VersionIdMarker></VersionIdMarker><MaxKeys>1000</MaxKeys><IsTruncated>true</IsTruncated><NextKeyMarker>p/k</NextKeyMarker><NextVersionIdMarker>v1</NextVersionIdMarker><Version><Key>p/config</Key><VersionId>v3</VersionId><IsLatest>true</IsLatest><LastModified>2026-11-28T08:00:01.250Z</LastModified><ETag>"x"</ETag><Size>12</Size><StorageClass>STANDARD</StorageClass></Version><DeleteMarker><Key>p/k</Key><VersionId>v2</VersionId><IsLatest>true</IsLatest><LastModified>2026-11-28T08:00:02Z</LastModified></DeleteMarker><Version><Key>p/k</Key><VersionId>v1</VersionId><IsLatest>false</IsLatest><LastModified>2026-11-28T08:00:00Z</LastModified><Size>3</Size></Version></ListVersionsResult>"#;
        let mut page: ListVersionsResult = quick_xml::de::from_str(doc).unwrap();
        assert!(page.is_truncated);
        assert_eq!(page.next_key_marker.as_deref(), Some("p/k"));
        // Name, Prefix, markers and MaxKeys read as `Other`.
        page.entries.retain(|e| !matches!(e, Entry::Other));
        assert_eq!(page.entries.len(), 3);
        match &page.entries[1] {
            Entry::DeleteMarker(v) => assert_eq!(v.version_id, "v2"),
            _ => panic!("a delete marker"),
        }
        match &page.entries[0] {
            Entry::Version(v) => {
                assert_eq!(v.size, 12);
                assert_eq!(unix("t", "", &v.last_modified).unwrap(), 1_795_852_801.25);
            }
            _ => panic!("a version"),
        }
    }

    #[test]
    fn retention_dates_round_trip() {
        let t = 1_795_852_800;
        assert_eq!(iso(t), "2026-11-28T08:00:00Z");
        assert_eq!(unix("t", "", &iso(t)).unwrap() as i64, t);
    }
}
