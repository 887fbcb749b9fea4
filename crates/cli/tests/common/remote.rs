//! A test's view of a network server that `scripts/servers.sh` started:
//! its URL through a private Toxiproxy proxy at a 2 ms round trip, the
//! credentials capsule needs, a cache directory, and capsule run against it.

use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use capsule_testkit::server_env as env;
use capsule_testkit::toxiproxy::{Proxy, Toxiproxy};
use capsule_testkit::{server_vars, Server, TestEnv, PASSWORD};

use super::{capsule_cmd, noise};

#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Kind {
    Smb,
    Sftp,
    S3,
}

/// One test's view of a server: its URL through a private proxy, the
/// environment capsule needs, and a cache directory.
pub struct Remote {
    pub kind: Kind,
    pub url: String,
    pub env: Vec<(String, String)>,
    pub cache: tempfile::TempDir,
    pub proxy: Proxy,
    /// Local directory behind the URL (SMB and SFTP), for fault setups.
    pub local_dir: Option<PathBuf>,
}

pub fn wipe_s3_prefix(r: &Remote) {
    for (k, v) in &r.env {
        if k.starts_with("AWS_") {
            std::env::set_var(k, v);
        }
    }
    let dest = capsule_net::Destination::parse(&r.url).unwrap();
    let b = capsule_net::connect(&dest, &capsule_net::Options::default()).unwrap();
    for o in b.list("").unwrap() {
        b.delete(&o.name).unwrap();
    }
}

impl Remote {
    pub fn new(kind: Kind, name: &str) -> Option<Remote> {
        let p = match kind {
            Kind::Smb => "SMB",
            Kind::Sftp => "SFTP",
            Kind::S3 => "S3",
        };
        let url = env(&format!("CAPSULE_TEST_{p}"))?;
        let upstream = env(&format!("CAPSULE_TEST_{p}_UPSTREAM"))?;
        let _servers = PathBuf::from(env("CAPSULE_TEST_SERVERS")?);
        let proxy = Toxiproxy::new(&env("CAPSULE_TEST_PROXY_API")?)
            .proxy(&format!("e2e-{name}"), &upstream)
            .unwrap();
        proxy.latency(1).unwrap();
        let url = format!("{}/{name}", url.replace(&upstream, &proxy.listen));
        let mut env_vars = vec![
            ("CAPSULE_PASSWORD".to_string(), PASSWORD.to_string()),
            // The faults these tests make are outages longer than a run
            // waits: with no ride-out, a run gives up after its six
            // attempts (about 8 s), which keeps them short. `ride_out`
            // sets it back for the outage it rides out.
            ("CAPSULE_RETRY_FOR".to_string(), "0".to_string()),
        ];
        let (server, dir) = match kind {
            Kind::Smb => (Server::Smb, Some("CAPSULE_TEST_SMB_DIR")),
            Kind::Sftp => (Server::Sftp, Some("CAPSULE_TEST_SFTP_DIR")),
            Kind::S3 => (Server::S3, None),
        };
        let mut local_dir = None;
        if let Some(var) = dir {
            let d = PathBuf::from(env(var)?).join(name);
            let _ = std::fs::remove_dir_all(&d);
            local_dir = Some(d);
        }
        env_vars.extend(server_vars(server, &proxy.listen, &format!("e2e-{name}"))?);
        let r = Remote {
            kind,
            url,
            env: env_vars,
            cache: tempfile::tempdir().unwrap(),
            proxy,
            local_dir,
        };
        if kind == Kind::S3 {
            // A fresh prefix: remove what an earlier run left there.
            wipe_s3_prefix(&r);
        }
        Some(r)
    }

    /// This destination's cache and run records, in its own directory.
    pub fn test_env(&self) -> TestEnv {
        TestEnv::bare()
            .cache(self.cache.path())
            .state(self.cache.path().join("state"))
    }

    pub fn run_with(&self, args: &[&str], extra: &[(&str, &str)]) -> Output {
        self.command(args, extra).output().expect("run capsule")
    }

    /// capsule with `args` on this destination: its credentials and cache,
    /// none inherited from the caller's environment, then `extra`.
    pub fn command(&self, args: &[&str], extra: &[(&str, &str)]) -> Command {
        let mut c = capsule_cmd(&self.test_env());
        c.arg("--repo").arg(&self.url).args(args);
        for (k, v) in &self.env {
            c.env(k, v);
        }
        for (k, v) in extra {
            c.env(k, v);
        }
        c
    }

    /// Runs capsule with `args` and puts a toxic on the proxy `at` into the
    /// run for `window` (both cut short if the run ends first): a reset or
    /// a stall in the middle of the run, which the retry layer may ride
    /// out. Waits at most 120 s for the run to end.
    pub fn toxic_window(
        &self,
        args: &[&str],
        extra: &[(&str, &str)],
        at: Duration,
        window: Duration,
        toxic: (&str, &str, &str),
    ) -> Output {
        let mut child = self
            .command(args, extra)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let wait_until = |child: &mut std::process::Child, until: Instant| {
            while Instant::now() < until && child.try_wait().unwrap().is_none() {
                std::thread::sleep(Duration::from_millis(2));
            }
        };
        wait_until(&mut child, Instant::now() + at);
        let (kind, stream, attrs) = toxic;
        self.proxy.toxic("window", kind, stream, attrs).unwrap();
        wait_until(&mut child, Instant::now() + window);
        self.proxy.remove_toxic("window").unwrap();
        wait_until(&mut child, Instant::now() + Duration::from_secs(120));
        if child.try_wait().unwrap().is_none() {
            let _ = child.kill();
            panic!(
                "{:?}: {args:?} still running 120 s after a {kind} toxic",
                self.kind
            );
        }
        child.wait_with_output().unwrap()
    }

    /// Runs capsule with `args`; once `ready` holds (within 60 s, and
    /// before the run ends), the destination vanishes (the proxy is
    /// disabled) until the run gives up (within 180 s; with no ride-out
    /// the retry layer takes about 8 s). Returns the run's exit status and
    /// stderr.
    pub fn vanish_during(
        &self,
        args: &[&str],
        ready: impl Fn() -> bool,
    ) -> (std::process::ExitStatus, String) {
        let (status, _, err) = self.away(args, &[], ready, None);
        (status, err)
    }

    /// Runs capsule with `args` and `extra`; once `ready` holds (within
    /// 60 s, and before the run ends), the destination goes away (the
    /// proxy is disabled) for `away`, or, with `None`, until the run gives
    /// up; then the run is waited for, bounded. Returns its exit status,
    /// stdout and stderr.
    pub fn away(
        &self,
        args: &[&str],
        extra: &[(&str, &str)],
        ready: impl Fn() -> bool,
        away: Option<Duration>,
    ) -> (std::process::ExitStatus, String, String) {
        let mut child = self
            .command(args, extra)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let kind = self.kind;
        let deadline = Instant::now() + Duration::from_secs(60);
        while !ready() && Instant::now() < deadline {
            assert!(
                child.try_wait().unwrap().is_none(),
                "{kind:?}: {args:?} finished before the destination could go away"
            );
            std::thread::sleep(Duration::from_millis(2));
        }
        self.proxy.set_enabled(false).unwrap();
        if let Some(t) = away {
            std::thread::sleep(t);
            self.proxy.set_enabled(true).unwrap();
        }
        // Read once the run ends: what it prints (one JSON document at
        // most, and its errors) fits in a pipe's buffer.
        let deadline = Instant::now() + Duration::from_secs(180);
        let status = loop {
            if let Some(st) = child.try_wait().unwrap() {
                break st;
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                panic!("{kind:?}: {args:?} did not end after the destination went away");
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        self.proxy.set_enabled(true).unwrap();
        let (mut out, mut err) = (String::new(), String::new());
        std::io::Read::read_to_string(&mut child.stdout.take().unwrap(), &mut out).unwrap();
        std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err).unwrap();
        (status, out, err)
    }

    /// A repository with 4 MiB packs, and a source of 12 files of 10 MiB
    /// (noise from `seed`): enough packs that some land before an index
    /// lists them. Returns the work directory and the source.
    pub fn big_source(&self, seed: u64) -> (tempfile::TempDir, PathBuf) {
        let work = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
        let src = work.path().join("src");
        std::fs::create_dir_all(&src).unwrap();
        for i in 0..12 {
            std::fs::write(src.join(format!("f{i:02}")), noise(10 << 20, seed + i)).unwrap();
        }
        self.ok(&["init", "--pack-size-mib", "4"]);
        (work, src)
    }

    /// Runs capsule paused at test point `point` (`CAPSULE_TEST_PAUSE`),
    /// takes the destination away there, lets it go on, and brings the
    /// destination back once it has given up.
    pub fn vanish_at_pause(
        &self,
        args: &[&str],
        point: &str,
    ) -> (std::process::ExitStatus, String) {
        let dir = tempfile::tempdir().unwrap();
        let go = dir.path().join("go");
        let pause = format!("{point}:{}", go.display());
        let mut child = self
            .command(args, &[("CAPSULE_TEST_PAUSE", &pause)])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let waiting = go.with_extension("waiting");
        let deadline = Instant::now() + Duration::from_secs(120);
        while !waiting.exists() {
            assert!(
                child.try_wait().unwrap().is_none() && Instant::now() < deadline,
                "{:?}: {args:?} never reached {point}",
                self.kind
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        self.proxy.set_enabled(false).unwrap();
        std::fs::write(&go, b"").unwrap();
        let deadline = Instant::now() + Duration::from_secs(90);
        let status = loop {
            if let Some(st) = child.try_wait().unwrap() {
                break st;
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                panic!(
                    "{:?}: {args:?} did not give up on a vanished destination",
                    self.kind
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        self.proxy.set_enabled(true).unwrap();
        let mut err = String::new();
        std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err).unwrap();
        (status, err)
    }

    pub fn run(&self, args: &[&str]) -> Output {
        self.run_with(args, &[])
    }

    pub fn ok(&self, args: &[&str]) -> String {
        let o = self.run(args);
        assert!(
            o.status.success(),
            "{:?}: capsule {args:?} failed with {:?}\nstdout: {}\nstderr: {}",
            self.kind,
            o.status.code(),
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        );
        String::from_utf8_lossy(&o.stdout).into_owned()
    }

    pub fn json(&self, args: &[&str]) -> serde_json::Value {
        let mut a = vec!["--json"];
        a.extend_from_slice(args);
        serde_json::from_str(&self.ok(&a)).unwrap()
    }
}
