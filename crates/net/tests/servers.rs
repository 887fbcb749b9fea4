//! The backend contract against real servers on loopback: Samba, OpenSSH
//! and MinIO, directly and through Toxiproxy with a 2 ms round trip, plus
//! objects beyond 4 GiB streamed through each.
//!
//! The servers come from `scripts/servers.sh start DIR`, which the README's
//! test command runs; it exports `CAPSULE_TEST_SERVERS` and the URLs. When
//! they are absent the tests say so and pass, unless
//! `CAPSULE_REQUIRE_SERVERS=1` (set by the test command) makes that a
//! failure.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::sync::Arc;

use capsule_backend::{conformance, Backend};
use capsule_net::{Destination, Options};
use capsule_testkit::server_env as env;
use capsule_testkit::toxiproxy::Toxiproxy;

#[derive(Clone, Copy, Debug)]
enum Kind {
    Smb,
    Sftp,
    S3,
}

impl Kind {
    fn prefix(self) -> &'static str {
        match self {
            Kind::Smb => "SMB",
            Kind::Sftp => "SFTP",
            Kind::S3 => "S3",
        }
    }
}

/// Opens a fresh, empty directory/prefix `sub` on the server, through a
/// proxy when `via` is given (host:port replacing the server's).
fn open(kind: Kind, sub: &str, via: Option<&str>) -> Option<Arc<dyn Backend>> {
    let url = env(&format!("CAPSULE_TEST_{}", kind.prefix()))?;
    let upstream = env(&format!("CAPSULE_TEST_{}_UPSTREAM", kind.prefix()))?;
    let url = match via {
        Some(v) => url.replace(&upstream, v),
        None => url,
    };
    let mut opts = Options::default();
    match kind {
        Kind::Smb => {
            let dir = std::path::PathBuf::from(env("CAPSULE_TEST_SMB_DIR")?).join(sub);
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(&dir).unwrap();
            opts.password = env("CAPSULE_TEST_SMB_PASSWORD");
        }
        Kind::Sftp => {
            let dir = std::path::PathBuf::from(env("CAPSULE_TEST_SFTP_DIR")?).join(sub);
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(&dir).unwrap();
            opts.ssh_key = env("CAPSULE_TEST_SFTP_KEY").map(Into::into);
            opts.known_hosts = env("CAPSULE_TEST_KNOWN_HOSTS").map(Into::into);
            if let Some(v) = via {
                // The proxy listens on a port of its choosing: trust the
                // same host key there.
                let servers = std::path::PathBuf::from(env("CAPSULE_TEST_SERVERS")?);
                let key = std::fs::read_to_string(servers.join("ssh/host_key.pub")).unwrap();
                let key: Vec<&str> = key.split_whitespace().take(2).collect();
                let (host, port) = v.rsplit_once(':').unwrap();
                let kh = servers.join(format!("ssh/known_hosts-{sub}"));
                std::fs::write(&kh, format!("[{host}]:{port} {}\n", key.join(" "))).unwrap();
                opts.known_hosts = Some(kh);
            }
        }
        Kind::S3 => {
            std::env::set_var("AWS_ACCESS_KEY_ID", env("CAPSULE_TEST_S3_KEY")?);
            std::env::set_var("AWS_SECRET_ACCESS_KEY", env("CAPSULE_TEST_S3_SECRET")?);
        }
    }
    let dest = Destination::parse(&format!("{url}/{sub}")).unwrap();
    let b = capsule_net::connect(&dest, &opts).unwrap_or_else(|e| panic!("connect {dest}: {e}"));
    if let Kind::S3 = kind {
        for o in b.list("").unwrap() {
            b.delete(&o.name).unwrap();
        }
    }
    Some(b)
}

fn conformance_direct(kind: Kind) {
    let Some(b) = open(kind, &format!("conf-direct-{kind:?}").to_lowercase(), None) else {
        return;
    };
    conformance::run_all(&*b);
}

fn conformance_2ms(kind: Kind) {
    let Some(api) = env("CAPSULE_TEST_PROXY_API") else {
        return;
    };
    let Some(upstream) = env(&format!("CAPSULE_TEST_{}_UPSTREAM", kind.prefix())) else {
        return;
    };
    let proxy = Toxiproxy::new(&api)
        .proxy(&format!("conf-{kind:?}").to_lowercase(), &upstream)
        .unwrap();
    proxy.latency(1).unwrap();
    let Some(b) = open(
        kind,
        &format!("conf-2ms-{kind:?}").to_lowercase(),
        Some(&proxy.listen),
    ) else {
        return;
    };
    let t = std::time::Instant::now();
    conformance::run_all(&*b);
    eprintln!(
        "{kind:?} conformance at 2 ms RTT: {:.1} s",
        t.elapsed().as_secs_f64()
    );
}

/// One large object on the servers' disk at a time: three of them at once
/// (MinIO keeps the parts beside the assembled object) need some 16 GiB free,
/// which a busy test machine need not have, and the other tests sharing the
/// disk would then fail for want of space, not for a defect.
static ONE_LARGE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Beyond 4 GiB, streamed: 32-bit offsets or whole-object buffers would
/// fail here. `CAPSULE_TEST_LARGE_MIB` can shrink it for a quick local run.
fn large(kind: Kind) {
    let _one = ONE_LARGE_AT_A_TIME
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let size = std::env::var("CAPSULE_TEST_LARGE_MIB")
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
        .map(|m| m << 20)
        .unwrap_or((4 << 30) + (1 << 20) + 17);
    let Some(b) = open(kind, &format!("large-{kind:?}").to_lowercase(), None) else {
        return;
    };
    // Gone also when the test fails, so the next large object has room.
    struct Remove(Arc<dyn Backend>);
    impl Drop for Remove {
        fn drop(&mut self) {
            let _ = self.0.delete("conformance/large");
        }
    }
    let _remove = Remove(b.clone());
    let t = std::time::Instant::now();
    conformance::large_object(&*b, size);
    eprintln!(
        "{kind:?}: {size} bytes streamed up and down in {:.1} s",
        t.elapsed().as_secs_f64()
    );
}

#[test]
fn smb_conformance() {
    conformance_direct(Kind::Smb);
}
#[test]
fn sftp_conformance() {
    conformance_direct(Kind::Sftp);
}
#[test]
fn s3_conformance() {
    conformance_direct(Kind::S3);
}
#[test]
fn smb_conformance_at_2ms() {
    conformance_2ms(Kind::Smb);
}
#[test]
fn sftp_conformance_at_2ms() {
    conformance_2ms(Kind::Sftp);
}
#[test]
fn s3_conformance_at_2ms() {
    conformance_2ms(Kind::S3);
}
#[test]
fn smb_large_object() {
    large(Kind::Smb);
}
#[test]
fn sftp_large_object() {
    large(Kind::Sftp);
}
#[test]
fn s3_large_object() {
    large(Kind::S3);
}

/// Password login (no key), and a wrong password refused as such.
#[test]
fn sftp_password_login() {
    let Some(url) = env("CAPSULE_TEST_SFTP_PASSWORD_URL") else {
        return;
    };
    let dest = Destination::parse(&url).unwrap();
    let mut opts = Options {
        password: env("CAPSULE_TEST_SFTP_PASSWORD"),
        known_hosts: env("CAPSULE_TEST_KNOWN_HOSTS").map(Into::into),
        // A key file that does not exist would be an error; point at none.
        ssh_key: None,
        ..Options::default()
    };
    // No default key may be picked up from ~/.ssh for this test.
    std::env::set_var("HOME", "/nonexistent");
    let b = capsule_net::connect(&dest, &opts).unwrap();
    b.put("pw/one", b"hello").unwrap();
    assert_eq!(b.get("pw/one", None).unwrap(), b"hello");
    b.delete("pw/one").unwrap();
    opts.password = Some("wrong".into());
    let e = capsule_net::connect(&dest, &opts).unwrap_err();
    assert_eq!(e.kind, capsule_backend::ErrorKind::AuthFailed, "{e}");
}

/// An unknown host key is refused with its fingerprint and the fix.
#[test]
fn sftp_unknown_host_key() {
    let Some(url) = env("CAPSULE_TEST_SFTP") else {
        return;
    };
    let empty = tempfile::NamedTempFile::new().unwrap();
    let opts = Options {
        ssh_key: env("CAPSULE_TEST_SFTP_KEY").map(Into::into),
        known_hosts: Some(empty.path().to_path_buf()),
        ..Options::default()
    };
    let e = capsule_net::connect(&Destination::parse(&url).unwrap(), &opts).unwrap_err();
    assert_eq!(e.kind, capsule_backend::ErrorKind::AuthFailed, "{e}");
    assert!(
        e.message.contains("SHA256:") && e.message.contains("ssh-keyscan"),
        "{e}"
    );
}

/// A share that requires SMB 3 encryption (`server smb encrypt = required`)
/// is used encrypted, and passes the whole contract; the ordinary share
/// stays unencrypted (capsule's data is encrypted before it is sent).
#[test]
fn smb_encrypted_share() {
    let (Some(url), Some(dir), Some(password)) = (
        env("CAPSULE_TEST_SMB_SEALED"),
        env("CAPSULE_TEST_SMB_SEALED_DIR"),
        env("CAPSULE_TEST_SMB_PASSWORD"),
    ) else {
        return;
    };
    let sub = "conf-sealed";
    let _ = std::fs::remove_dir_all(std::path::Path::new(&dir).join(sub));
    std::fs::create_dir_all(std::path::Path::new(&dir).join(sub)).unwrap();
    let opts = Options {
        password: Some(password),
        ..Options::default()
    };
    let sealed = match Destination::parse(&format!("{url}/{sub}")).unwrap() {
        Destination::Smb(t) => capsule_net::smb::SmbBackend::connect(&t, &opts).unwrap(),
        d => panic!("not SMB: {d}"),
    };
    assert!(sealed.encrypted(), "the sealed share is used unencrypted");
    conformance::run_all(&sealed);
    let plain = match Destination::parse(&env("CAPSULE_TEST_SMB").unwrap()).unwrap() {
        Destination::Smb(t) => capsule_net::smb::SmbBackend::connect(&t, &opts).unwrap(),
        d => panic!("not SMB: {d}"),
    };
    assert!(!plain.encrypted(), "the ordinary share is encrypted");
}
