//! `capsule ui` served for a test: the process, its address and token, and
//! plain HTTP requests to it (no client library, so a test sees exactly
//! the bytes the page answers with).

use std::io::{BufRead, Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Stdio};
use std::time::Duration;

use super::{capsule_cmd, TestEnv, PASSWORD};

pub struct Served {
    pub child: Child,
    pub addr: String,
    pub token: String,
}

pub fn serve(repo: &Path) -> Served {
    serve_with(
        &TestEnv::beside(repo).password(PASSWORD),
        &["--repo", repo.to_str().unwrap()],
    )
}

/// `capsule ARGS --json ui --no-browser` in `env`.
pub fn serve_with(env: &TestEnv, args: &[&str]) -> Served {
    let mut child = capsule_cmd(env)
        .args(args)
        .args(["--json", "ui", "--no-browser"])
        .env_remove("BROWSER")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // First it says where: {"url": ..., "addr": ...}.
    let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
    let mut text = String::new();
    let v: serde_json::Value = loop {
        let mut line = String::new();
        assert!(
            out.read_line(&mut line).unwrap() > 0,
            "no address printed: {text}"
        );
        text += &line;
        if let Ok(v) = serde_json::from_str(&text) {
            break v;
        }
    };
    let url = v["url"].as_str().unwrap();
    Served {
        addr: v["addr"].as_str().unwrap().to_string(),
        token: url.split("t=").nth(1).unwrap().to_string(),
        child,
    }
}

/// One HTTP/1.1 request; (status, headers, body).
pub fn http(
    s: &Served,
    method: &str,
    target: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> (u16, String, Vec<u8>) {
    let mut c = TcpStream::connect(&s.addr).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let mut req = format!(
        "{method} {target} HTTP/1.1\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    if !headers.iter().any(|(k, _)| k.eq_ignore_ascii_case("host")) {
        req += &format!("Host: {}\r\n", s.addr);
    }
    for (k, v) in headers {
        req += &format!("{k}: {v}\r\n");
    }
    req += "\r\n";
    c.write_all(req.as_bytes()).unwrap();
    c.write_all(body).unwrap();
    let mut raw = Vec::new();
    c.read_to_end(&mut raw).unwrap();
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("a response");
    let head = String::from_utf8_lossy(&raw[..split]).into_owned();
    let status: u16 = head.split(' ').nth(1).unwrap().parse().unwrap();
    let mut body = raw[split + 4..].to_vec();
    if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        body = unchunk(&body);
    }
    (status, head, body)
}

pub fn unchunk(mut b: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let eol = b.windows(2).position(|w| w == b"\r\n").unwrap();
        let n = usize::from_str_radix(std::str::from_utf8(&b[..eol]).unwrap().trim(), 16).unwrap();
        if n == 0 {
            return out;
        }
        out.extend_from_slice(&b[eol + 2..eol + 2 + n]);
        b = &b[eol + 4 + n..];
    }
}

pub fn get(s: &Served, target: &str) -> (u16, Vec<u8>) {
    let (code, _, body) = http(
        s,
        "GET",
        target,
        &[("x-capsule-token", &s.token.clone())],
        b"",
    );
    (code, body)
}

pub fn get_json(s: &Served, target: &str) -> serde_json::Value {
    let (code, body) = get(s, target);
    assert_eq!(code, 200, "{target}: {}", String::from_utf8_lossy(&body));
    serde_json::from_slice(&body).unwrap()
}

pub fn enc(s: &str) -> String {
    s.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-_.~/".contains(&b) {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
