//! A minimal client for Toxiproxy's HTTP API (latency and faults between
//! capsule and a server on loopback). Tests, the benchmark and the lab use it
//! to put a 2 ms round trip, a cut connection or a truncated transfer in
//! front of a real Samba, OpenSSH or MinIO.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

/// A Toxiproxy server's API endpoint, e.g. `127.0.0.1:8474`.
#[derive(Debug, Clone)]
pub struct Toxiproxy {
    api: String,
}

/// One proxy: listens on `listen`, forwards to its upstream. Removed when
/// dropped.
#[derive(Debug)]
pub struct Proxy {
    api: Toxiproxy,
    /// Proxy name.
    pub name: String,
    /// `host:port` it listens on.
    pub listen: String,
}

/// A failed API call.
#[derive(Debug, thiserror::Error)]
#[error("toxiproxy {what}: {detail}")]
pub struct ProxyError {
    what: String,
    detail: String,
}

impl Toxiproxy {
    /// The API at `addr` (`host:port`; an `http://` prefix is accepted).
    pub fn new(addr: &str) -> Self {
        Toxiproxy {
            api: addr
                .trim_start_matches("http://")
                .trim_end_matches('/')
                .to_string(),
        }
    }

    fn call(&self, method: &str, path: &str, body: &str) -> Result<String, ProxyError> {
        let err = |detail: String| ProxyError {
            what: format!("{method} {path}"),
            detail,
        };
        let mut s = TcpStream::connect(&self.api).map_err(|e| err(e.to_string()))?;
        let _ = s.set_read_timeout(Some(Duration::from_secs(10)));
        let req = format!(
            "{method} {path} HTTP/1.0\r\nHost: {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            self.api,
            body.len()
        );
        s.write_all(req.as_bytes())
            .map_err(|e| err(e.to_string()))?;
        let mut resp = String::new();
        s.read_to_string(&mut resp)
            .map_err(|e| err(e.to_string()))?;
        let status: u16 = resp
            .split_whitespace()
            .nth(1)
            .and_then(|c| c.parse().ok())
            .unwrap_or(0);
        let body = resp
            .split_once("\r\n\r\n")
            .map(|(_, b)| b)
            .unwrap_or("")
            .to_string();
        if !(200..300).contains(&status) {
            return Err(err(format!("HTTP {status}: {body}")));
        }
        Ok(body)
    }

    /// Creates a proxy to `upstream` on a free loopback port.
    pub fn proxy(&self, name: &str, upstream: &str) -> Result<Proxy, ProxyError> {
        // A leftover from an interrupted run would hold the name.
        let _ = self.call("DELETE", &format!("/proxies/{name}"), "");
        let body = self.call(
            "POST",
            "/proxies",
            &format!(r#"{{"name":"{name}","listen":"127.0.0.1:0","upstream":"{upstream}","enabled":true}}"#),
        )?;
        let listen = json_field(&body, "listen").ok_or_else(|| ProxyError {
            what: "create proxy".into(),
            detail: format!("no listen address in {body}"),
        })?;
        Ok(Proxy {
            api: self.clone(),
            name: name.to_string(),
            listen,
        })
    }
}

/// The string value of `"key":"value"` in a flat JSON object.
fn json_field(body: &str, key: &str) -> Option<String> {
    let pat = format!("\"{key}\":\"");
    let start = body.find(&pat)? + pat.len();
    let end = body[start..].find('"')? + start;
    Some(body[start..end].to_string())
}

impl Proxy {
    /// Adds a toxic of `kind` with JSON `attributes` on `stream`
    /// (`upstream` = towards the server, `downstream` = towards capsule).
    pub fn toxic(
        &self,
        toxic: &str,
        kind: &str,
        stream: &str,
        attributes: &str,
    ) -> Result<(), ProxyError> {
        self.api
            .call(
                "POST",
                &format!("/proxies/{}/toxics", self.name),
                &format!(r#"{{"name":"{toxic}","type":"{kind}","stream":"{stream}","toxicity":1.0,"attributes":{attributes}}}"#),
            )
            .map(|_| ())
    }

    /// Removes one toxic.
    pub fn remove_toxic(&self, toxic: &str) -> Result<(), ProxyError> {
        self.api
            .call(
                "DELETE",
                &format!("/proxies/{}/toxics/{toxic}", self.name),
                "",
            )
            .map(|_| ())
    }

    /// Adds `ms` of latency each way (a round trip of `2 * ms`).
    pub fn latency(&self, ms: u32) -> Result<(), ProxyError> {
        for dir in ["upstream", "downstream"] {
            self.toxic(
                &format!("latency_{dir}"),
                "latency",
                dir,
                &format!(r#"{{"latency":{ms},"jitter":0}}"#),
            )?;
        }
        Ok(())
    }

    /// Turns the proxy off (connections are cut, new ones refused) or on.
    pub fn set_enabled(&self, on: bool) -> Result<(), ProxyError> {
        self.api
            .call(
                "POST",
                &format!("/proxies/{}", self.name),
                &format!(r#"{{"enabled":{on}}}"#),
            )
            .map(|_| ())
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        let _ = self
            .api
            .call("DELETE", &format!("/proxies/{}", self.name), "");
    }
}
