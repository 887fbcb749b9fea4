//! Raw S3 requests for tests, signed by curl's SigV4: the bucket and STS
//! operations the tests need (and, in the ransomware drill, everything an
//! attacker holding a client's key would try), with no S3 client of their
//! own.

use std::process::Command;

/// Credentials: access key, secret, and a session token for temporary ones.
#[derive(Clone, Debug)]
pub struct Creds {
    pub key: String,
    pub secret: String,
    pub token: Option<String>,
}

impl Creds {
    /// The variables capsule reads them from.
    pub fn vars(&self) -> Vec<(String, String)> {
        let mut v = vec![
            ("AWS_ACCESS_KEY_ID".to_string(), self.key.clone()),
            ("AWS_SECRET_ACCESS_KEY".to_string(), self.secret.clone()),
        ];
        if let Some(t) = &self.token {
            v.push(("AWS_SESSION_TOKEN".to_string(), t.clone()));
        }
        v
    }
}

/// What one request answered.
#[derive(Debug)]
pub struct Answer {
    pub status: u16,
    pub body: String,
}

impl Answer {
    pub fn ok(&self) -> bool {
        (200..300).contains(&self.status)
    }

    /// The store's error code (`AccessDenied`…), if it sent one.
    pub fn code(&self) -> Option<String> {
        xml_values(&self.body, "Code").into_iter().next()
    }
}

/// An S3 endpoint (`ADDR:PORT`) and the key requests are signed with.
#[derive(Clone, Debug)]
pub struct S3 {
    pub endpoint: String,
    pub creds: Creds,
}

/// Percent-encodes a query value as SigV4's canonical form has it.
pub fn enc(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

impl S3 {
    /// The same endpoint with other credentials.
    pub fn with(&self, creds: &Creds) -> S3 {
        S3 {
            endpoint: self.endpoint.clone(),
            creds: creds.clone(),
        }
    }

    /// One request: `path` is `bucket/key?query` (query encoded), `headers`
    /// as `name: value`, and a body.
    pub fn request(
        &self,
        service: &str,
        method: &str,
        path: &str,
        headers: &[String],
        body: Option<&[u8]>,
    ) -> Answer {
        let mut c = Command::new("curl");
        c.args(["-sS", "-X", method, "--aws-sigv4"])
            .arg(format!("aws:amz:us-east-1:{service}"))
            .arg("--user")
            .arg(format!("{}:{}", self.creds.key, self.creds.secret))
            .args(["-w", "\n%{http_code}"]);
        if let Some(t) = &self.creds.token {
            c.arg("-H").arg(format!("x-amz-security-token: {t}"));
        }
        for h in headers {
            c.arg("-H").arg(h);
        }
        let dir = tempfile::tempdir().unwrap();
        if let Some(b) = body {
            // curl 7.88 signs a body wrongly for S3 (SignatureDoesNotMatch)
            // unless the payload hash is given.
            c.arg("-H").arg("x-amz-content-sha256: UNSIGNED-PAYLOAD");
            let f = dir.path().join("body");
            std::fs::write(&f, b).unwrap();
            c.arg("--data-binary").arg(format!("@{}", f.display()));
        }
        let o = c
            .arg(format!("http://{}/{path}", self.endpoint))
            .output()
            .unwrap();
        let out = String::from_utf8_lossy(&o.stdout).into_owned();
        let (body, code) = out.rsplit_once('\n').unwrap_or(("", "0"));
        Answer {
            status: code.trim().parse().unwrap_or(0),
            body: body.to_string(),
        }
    }

    /// A request that must succeed; its body.
    pub fn signed(&self, service: &str, method: &str, path: &str, extra: &[&str]) -> String {
        let mut c = Command::new("curl");
        let o = c
            .args(["-sS", "-X", method, "--aws-sigv4"])
            .arg(format!("aws:amz:us-east-1:{service}"))
            .arg("--user")
            .arg(format!("{}:{}", self.creds.key, self.creds.secret))
            .args(extra)
            .arg(format!("http://{}/{path}", self.endpoint))
            .output()
            .unwrap();
        assert!(
            o.status.success(),
            "curl {method} {path}: {}{}",
            String::from_utf8_lossy(&o.stderr),
            String::from_utf8_lossy(&o.stdout)
        );
        String::from_utf8_lossy(&o.stdout).into_owned()
    }

    /// Temporary credentials (STS AssumeRole) whose session policy allows
    /// `actions` (JSON strings) on `bucket` and nothing elsewhere.
    pub fn key_for(&self, bucket: &str, actions: &str) -> Creds {
        let policy = format!(
            r#"{{"Version":"2012-10-17","Statement":[{{"Effect":"Allow","Action":[{actions}],"Resource":["arn:aws:s3:::{bucket}","arn:aws:s3:::{bucket}/*"]}}]}}"#
        );
        let form = |kv: &str| ["--data-urlencode".to_string(), kv.to_string()];
        let args: Vec<String> = [
            form("Action=AssumeRole"),
            form("Version=2011-06-15"),
            form("DurationSeconds=3600"),
            form(&format!("Policy={policy}")),
        ]
        .concat();
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let xml = self.signed("sts", "POST", "", &args);
        let field = |tag: &str| {
            let (_, rest) = xml.split_once(&format!("<{tag}>")).expect(&xml);
            rest.split_once(&format!("</{tag}>")).unwrap().0.to_string()
        };
        Creds {
            key: field("AccessKeyId"),
            secret: field("SecretAccessKey"),
            token: Some(field("SessionToken")),
        }
    }
}

/// Every `<tag>…</tag>` value in an XML document, in order.
pub fn xml_values(doc: &str, tag: &str) -> Vec<String> {
    let (open, close) = (format!("<{tag}>"), format!("</{tag}>"));
    let mut out = Vec::new();
    let mut rest = doc;
    while let Some(at) = rest.find(&open) {
        let from = &rest[at + open.len()..];
        let Some(end) = from.find(&close) else { break };
        out.push(from[..end].to_string());
        rest = &from[end + close.len()..];
    }
    out
}
