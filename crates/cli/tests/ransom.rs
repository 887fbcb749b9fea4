//! History a stolen credential cannot erase: the ransomware drill.
//!
//! A repository on MinIO with object lock and versioning (`init
//! --object-lock`), backed up by a client whose key may add but not delete.
//! Then an attacker holding that same key tries everything the S3 API
//! offers against it: delete every object, overwrite every object with
//! garbage, delete every version by ID, shorten retention, put a lifecycle
//! rule, suspend versioning, loosen the lock, replace the bucket policy,
//! delete many objects at once, delete the bucket. Each refusal is counted
//! and each acceptance recorded. Afterwards the admin, with `--as-of` the
//! moment before the attack, restores every snapshot byte for byte and
//! `check --read-data` is clean; `repair history` writes that state back.

// The command-line suite runs on Linux, against real servers, btrfs,
// fanotify and network namespaces; the macOS build checks the libraries.
#![cfg(target_os = "linux")]
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use capsule_testkit::server_env as env;
use common::s3::{enc, xml_values, Creds, S3};
use common::said;
use common::{capsule_cmd, noise, TestEnv, PASSWORD};

/// The test MinIO that `scripts/servers.sh` started, reached directly with
/// its root key.
fn admin() -> Option<S3> {
    Some(S3 {
        endpoint: env("CAPSULE_TEST_S3_UPSTREAM")?,
        creds: Creds {
            key: env("CAPSULE_TEST_S3_KEY")?,
            secret: env("CAPSULE_TEST_S3_SECRET")?,
            token: None,
        },
    })
}

fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

/// A bucket name no earlier run used: locked objects outlive a test.
fn fresh_bucket(what: &str) -> String {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    format!("capsule-{what}-{}-{nanos}", std::process::id())
}

struct Machine {
    env: TestEnv,
    url: String,
}

impl Machine {
    fn new(work: &Path, name: &str, url: &str, creds: &Creds) -> Machine {
        let cache = work.join(format!("cache-{name}"));
        let mut env = TestEnv::bare()
            .cache(&cache)
            .state(cache.join("state"))
            .password(PASSWORD);
        for (k, v) in creds.vars() {
            env = env.var(&k, &v);
        }
        Machine {
            env,
            url: url.to_string(),
        }
    }

    fn run(&self, args: &[&str]) -> Output {
        capsule_cmd(&self.env)
            .arg("--repo")
            .arg(&self.url)
            .args(args)
            .output()
            .unwrap()
    }

    fn ok(&self, args: &[&str]) -> String {
        let o = self.run(args);
        assert!(o.status.success(), "{args:?}: {}", said(&o));
        String::from_utf8_lossy(&o.stdout).into_owned()
    }

    fn json(&self, args: &[&str]) -> serde_json::Value {
        let mut a = vec!["--json"];
        a.extend_from_slice(args);
        serde_json::from_str(&self.ok(&a)).unwrap()
    }
}

/// Every version of every object under `prefix`: (key, version ID).
fn versions(s3: &S3, bucket: &str, prefix: &str) -> Vec<(String, String)> {
    let body = s3.signed(
        "s3",
        "GET",
        &format!("{bucket}?prefix={}&versions=", enc(prefix)),
        &[],
    );
    let keys = xml_values(&body, "Key");
    let ids = xml_values(&body, "VersionId");
    assert_eq!(keys.len(), ids.len(), "{body}");
    keys.into_iter().zip(ids).collect()
}

fn content_md5(body: &[u8]) -> String {
    use base64::Engine;
    use md5::Digest;
    format!(
        "Content-MD5: {}",
        base64::engine::general_purpose::STANDARD.encode(md5::Md5::digest(body))
    )
}

/// What the attacker tried: action → (refused, accepted), and the
/// store's reasons for refusing.
#[derive(Default, Debug)]
struct Tally(BTreeMap<&'static str, (u32, u32)>, BTreeMap<String, u32>);

impl Tally {
    fn count(&mut self, action: &'static str, a: &common::s3::Answer) {
        let e = self.0.entry(action).or_default();
        if a.ok() {
            e.1 += 1;
        } else {
            e.0 += 1;
            let code = a.code().unwrap_or_else(|| format!("HTTP {}", a.status));
            // A request the store could not even read proves nothing.
            assert!(
                ![
                    "SignatureDoesNotMatch",
                    "MalformedXML",
                    "MissingContentMD5",
                    "InvalidDigest"
                ]
                .contains(&code.as_str()),
                "{action}: the drill's own request was wrong: {a:?}"
            );
            *self.1.entry(format!("{action}: {code}")).or_default() += 1;
        }
    }
    fn accepted(&self) -> Vec<&'static str> {
        self.0
            .iter()
            .filter(|(_, (_, acc))| *acc > 0)
            .map(|(k, _)| *k)
            .collect()
    }
    fn refused(&self, action: &str) -> u32 {
        self.0.get(action).map_or(0, |r| r.0)
    }
}

/// Everything an attacker holding the client's key can ask of S3, against
/// every object of the repository under `prefix`.
fn attack(attacker: &S3, admin: &S3, bucket: &str, prefix: &str) -> Tally {
    let mut t = Tally::default();
    let listed = attacker.request(
        "s3",
        "GET",
        &format!("{bucket}?list-type=2&prefix={}", enc(prefix)),
        &[],
        None,
    );
    assert!(listed.ok(), "the client may list: {listed:?}");
    let keys = xml_values(&listed.body, "Key");
    assert!(keys.len() > 5, "{}", listed.body);
    // The version IDs, as the attacker would find them out (the client's
    // key may not list versions; the admin's listing is the worst case).
    let all_versions = versions(admin, bucket, prefix);
    // Sooner than the day the lock gives, but in the future (a date in the
    // past is not a retention at all).
    let past = jiff::Timestamp::from_second(unix_now() as i64 + 3600).unwrap();
    for key in &keys {
        let path = format!("{bucket}/{key}");
        t.count(
            "delete object",
            &attacker.request("s3", "DELETE", &path, &[], None),
        );
        let body = format!("<Retention><Mode>GOVERNANCE</Mode><RetainUntilDate>{past}</RetainUntilDate></Retention>");
        t.count(
            "shorten retention",
            &attacker.request(
                "s3",
                "PUT",
                &format!("{path}?retention="),
                &[content_md5(body.as_bytes())],
                Some(body.as_bytes()),
            ),
        );
        t.count(
            "shorten retention bypassing governance",
            &attacker.request(
                "s3",
                "PUT",
                &format!("{path}?retention="),
                &[
                    content_md5(body.as_bytes()),
                    "x-amz-bypass-governance-retention: true".into(),
                ],
                Some(body.as_bytes()),
            ),
        );
        t.count(
            "overwrite with garbage",
            &attacker.request("s3", "PUT", &path, &[], Some(b"encrypted by ransomware")),
        );
    }
    for (key, version) in &all_versions {
        let path = format!("{bucket}/{key}?versionId={}", enc(version));
        t.count(
            "delete version",
            &attacker.request("s3", "DELETE", &path, &[], None),
        );
        t.count(
            "delete version bypassing governance",
            &attacker.request(
                "s3",
                "DELETE",
                &path,
                &["x-amz-bypass-governance-retention: true".into()],
                None,
            ),
        );
    }
    let multi = format!(
        "<Delete>{}</Delete>",
        all_versions
            .iter()
            .map(|(k, v)| format!("<Object><Key>{k}</Key><VersionId>{v}</VersionId></Object>"))
            .collect::<String>()
    );
    let answer = attacker.request(
        "s3",
        "POST",
        &format!("{bucket}?delete="),
        &[content_md5(multi.as_bytes())],
        Some(multi.as_bytes()),
    );
    // A multi-object delete answers 200 with an error per object.
    let deleted = xml_values(&answer.body, "Deleted").len();
    t.0.entry("delete many at once").or_default().0 += u32::from(deleted == 0);
    t.0.entry("delete many at once").or_default().1 += deleted as u32;
    let bucket_ops: [(&'static str, &str, String, String); 5] = [
        (
            "put a lifecycle rule",
            "PUT",
            format!("{bucket}?lifecycle="),
            "<LifecycleConfiguration><Rule><ID>x</ID><Status>Enabled</Status><Filter><Prefix></Prefix></Filter><Expiration><Days>1</Days></Expiration><NoncurrentVersionExpiration><NoncurrentDays>1</NoncurrentDays></NoncurrentVersionExpiration></Rule></LifecycleConfiguration>".into(),
        ),
        (
            "suspend versioning",
            "PUT",
            format!("{bucket}?versioning="),
            "<VersioningConfiguration><Status>Suspended</Status></VersioningConfiguration>".into(),
        ),
        (
            "loosen the default retention",
            "PUT",
            format!("{bucket}?object-lock="),
            "<ObjectLockConfiguration><ObjectLockEnabled>Enabled</ObjectLockEnabled></ObjectLockConfiguration>".into(),
        ),
        (
            "replace the bucket policy",
            "PUT",
            format!("{bucket}?policy="),
            format!(r#"{{"Version":"2012-10-17","Statement":[{{"Effect":"Allow","Principal":{{"AWS":["*"]}},"Action":["s3:*"],"Resource":["arn:aws:s3:::{bucket}/*"]}}]}}"#),
        ),
        ("delete the bucket", "DELETE", bucket.to_string(), String::new()),
    ];
    for (what, method, path, body) in &bucket_ops {
        let (headers, body) = if body.is_empty() {
            (vec![], None)
        } else {
            (vec![content_md5(body.as_bytes())], Some(body.as_bytes()))
        };
        t.count(what, &attacker.request("s3", method, path, &headers, body));
    }
    t
}

/// The files in `b` are those in `a`, byte for byte (the copies kept of
/// what each backup saw have their own times).
fn assert_same_files(a: &Path, b: &Path) {
    let names = |d: &Path| {
        let mut v: Vec<_> = std::fs::read_dir(d)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        v.sort();
        v
    };
    assert_eq!(
        names(a),
        names(b),
        "{} against {}",
        a.display(),
        b.display()
    );
    for n in names(a) {
        assert!(
            std::fs::read(a.join(&n)).unwrap() == std::fs::read(b.join(&n)).unwrap(),
            "{n:?} differs"
        );
    }
}

/// A copy of the flat directory `src` at `to` (what a backup saw), returned.
fn keep_a_copy(src: &Path, to: &Path) -> PathBuf {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(src).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
    }
    to.to_path_buf()
}

/// The client's key as the user guide's append-only policy has it.
const APPEND_ONLY: &str = r#""s3:GetObject","s3:PutObject","s3:ListBucket","s3:GetBucketLocation""#;

/// The drill in governance mode, with the user guide's append-only key.
#[test]
fn ransomware_holding_an_append_only_key_loses_no_snapshot_in_governance_mode() {
    drill("governance", APPEND_ONLY);
}

/// The drill in compliance mode, with a key that may also change
/// retention and ask to bypass governance: compliance refuses it anyway.
#[test]
fn ransomware_holding_a_key_that_may_change_retention_loses_no_snapshot_in_compliance_mode() {
    drill(
        "compliance",
        &format!(r#"{APPEND_ONLY},"s3:PutObjectRetention","s3:BypassGovernanceRetention""#),
    );
}

/// The drill: nothing an attacker holding the client's key (allowed
/// `actions`) does loses a snapshot of a repository locked in `mode`.
fn drill(mode: &str, actions: &str) {
    let Some(admin) = admin() else { return };
    let work = tempfile::tempdir().unwrap();
    let work = work.path();
    let bucket = fresh_bucket(&format!("drill-{mode}"));
    let url = format!("s3+http://{}/{bucket}/repo", admin.endpoint);
    let boss = Machine::new(work, "admin", &url, &admin.creds);

    // init makes the bucket, with object lock, and checks an object's date.
    let out = boss.ok(&["init", "--object-lock", "1d", "--lock-mode", mode]);
    assert!(out.contains(&format!("object lock: every object is kept from deletion and overwrite for 1 days ({mode} mode)")), "{out}");
    let client_key = admin.key_for(&bucket, actions);
    let laptop = Machine::new(work, "laptop", &url, &client_key);

    // Three backups from the append-only client; what each saw is kept.
    let src = work.join("src");
    std::fs::create_dir_all(&src).unwrap();
    let mut saved: Vec<(String, PathBuf)> = Vec::new();
    for round in 0..3u64 {
        std::fs::write(src.join(format!("new-{round}")), noise(400_000, round)).unwrap();
        std::fs::write(src.join("changing"), noise(60_000, 100 + round)).unwrap();
        let v = laptop.json(&["backup", src.to_str().unwrap()]);
        assert_eq!(v["append_only"], true, "{v}");
        let expect = keep_a_copy(&src, &work.join(format!("expect-{round}")));
        saved.push((v["snapshot_id"].as_str().unwrap().to_string(), expect));
    }

    // The moment before the attack, with a second on each side: the store
    // dates versions in milliseconds, the moment is given in seconds.
    std::thread::sleep(Duration::from_millis(1100));
    let before = unix_now().floor() as i64;
    std::thread::sleep(Duration::from_millis(1100));
    let as_of = jiff::Timestamp::from_second(before).unwrap().to_string();

    let tally = attack(&admin.with(&client_key), &admin, &bucket, "repo/");
    eprintln!("attack: {tally:?}");
    assert_eq!(
        tally.accepted(),
        vec!["overwrite with garbage"],
        "the only thing the store let the attacker do is write new versions: {tally:?}"
    );
    for action in [
        "delete object",
        "delete version",
        "delete version bypassing governance",
        "shorten retention",
        "shorten retention bypassing governance",
        "put a lifecycle rule",
        "suspend versioning",
        "loosen the default retention",
        "replace the bucket policy",
        "delete the bucket",
        "delete many at once",
    ] {
        assert!(
            tally.refused(action) > 0,
            "{action} was never refused: {tally:?}"
        );
    }

    // The repository as it is now is garbage…
    let o = boss.run(&["--no-cache", "snapshots"]);
    assert!(!o.status.success(), "{}", said(&o));
    // Issue 59, 5: the history is named, and `init` is never suggested.
    assert_eq!(o.status.code(), Some(12), "{}", said(&o));
    assert!(
        said(&o).contains("--as-of") && said(&o).contains("repair history"),
        "{}",
        said(&o)
    );
    assert!(
        !said(&o).contains("create a new repository"),
        "{}",
        said(&o)
    );

    // …and as it was before the attack, whole.
    let listed = boss.json(&["--no-cache", "--as-of", &as_of, "snapshots"]);
    let ids: Vec<&str> = listed
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids.len(), 3, "{listed}");
    for (id, expect) in &saved {
        assert!(ids.iter().any(|i| i == id), "{id} in {ids:?}");
        let target = work.join(format!("restored-{id}"));
        boss.ok(&[
            "--as-of",
            &as_of,
            "restore",
            id,
            "--target",
            target.to_str().unwrap(),
        ]);
        assert_same_files(expect, &common::restored(&target, &src));
    }
    boss.ok(&["--no-cache", "--as-of", &as_of, "check", "--read-data"]);

    // Writing it back makes it current again: check reads it whole
    // without --as-of, and the client backs up on top.
    let v = boss.json(&["--as-of", &as_of, "repair", "history"]);
    assert!(v["written"].as_u64().unwrap() > 5, "{v}");
    boss.ok(&["--no-cache", "check", "--read-data"]);
    let v = laptop.json(&["--no-cache", "backup", src.to_str().unwrap()]);
    assert!(v["snapshot_id"].is_string(), "{v}");
    assert_eq!(
        boss.json(&["--no-cache", "snapshots"])
            .as_array()
            .unwrap()
            .len(),
        4
    );

    // Maintenance on a locked bucket: nothing retired is deletable yet.
    let v = boss.json(&["prune"]);
    let lock = &v["prune"]["object_lock"];
    assert_eq!(lock["days"], 1, "{v}");
    assert_eq!(lock["mode"], mode, "{v}");
    assert!(lock["objects"].as_u64().unwrap() > 5, "{v}");
}

/// Object lock asked of what cannot give it is an error at `init`, never a
/// repository that only looks protected; `--as-of` where no versions are
/// kept says why.
#[test]
fn object_lock_where_it_cannot_hold_is_a_clear_error() {
    let Some(admin) = admin() else { return };
    let work = tempfile::tempdir().unwrap();
    let work = work.path();

    // A bucket that exists without object lock.
    let plain = fresh_bucket("plain");
    admin.signed("s3", "PUT", &plain, &[]);
    let url = format!("s3+http://{}/{plain}/repo", admin.endpoint);
    let m = Machine::new(work, "m", &url, &admin.creds);
    let o = m.run(&["init", "--object-lock", "30d"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{}", said(&o));
    assert!(err.contains("without object lock"), "{err}");
    let o = m.run(&["snapshots"]);
    assert!(!o.status.success(), "no repository was made: {}", said(&o));

    // A retention shorter than the prune safety window.
    let o = m.run(&["init", "--object-lock", "2h"]);
    assert_eq!(o.status.code(), Some(2), "{}", said(&o));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("shorter than the prune safety window"),
        "{}",
        said(&o)
    );

    // --as-of where the bucket keeps no versions.
    m.ok(&["init"]);
    let o = m.run(&["--as-of", "2026-01-01T00:00:00Z", "snapshots"]);
    assert!(!o.status.success(), "{}", said(&o));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("versioning is off"),
        "{}",
        said(&o)
    );

    // Object lock on a directory.
    let local = work.join("local");
    let m = Machine::new(work, "l", local.to_str().unwrap(), &admin.creds);
    let o = m.run(&["init", "--object-lock", "30d"]);
    assert_eq!(o.status.code(), Some(2), "{}", said(&o));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("needs an S3 bucket"),
        "{}",
        said(&o)
    );
}

/// One `sftp` batch command as the append-only account: whether the
/// server carried it out.
fn sftp_as(url_host: &str, port: &str, key: &str, known: &str, dir: &Path, cmd: &str) -> bool {
    let batch = dir.join("batch");
    std::fs::write(&batch, format!("{cmd}\n")).unwrap();
    let o = std::process::Command::new("sftp")
        .args(["-q", "-b"])
        .arg(&batch)
        .args(["-i", key, "-P", port])
        .arg("-o")
        .arg(format!("UserKnownHostsFile={known}"))
        .args(["-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=yes"])
        .arg(url_host)
        .output()
        .unwrap();
    o.status.success()
}

/// The drill over SFTP: an OpenSSH account whose server refuses removal,
/// renames, permission changes and links (the user guide's append-only
/// account) backs up; then an attacker holding that account tries to
/// delete, rename, chmod, overwrite and link over every object and to
/// remove every directory. Only new files are accepted, and every snapshot
/// restores byte for byte afterwards, with no `--as-of` needed.
#[test]
fn ransomware_holding_the_append_only_sftp_account_loses_no_snapshot() {
    let (Some(base), Some(key), Some(known)) = (
        env("CAPSULE_TEST_SFTP_APPEND_ONLY"),
        env("CAPSULE_TEST_SFTP_KEY"),
        env("CAPSULE_TEST_KNOWN_HOSTS"),
    ) else {
        return;
    };
    let base_dir = PathBuf::from(env("CAPSULE_TEST_SFTP_APPEND_ONLY_DIR").unwrap());
    let work = tempfile::tempdir().unwrap();
    let work = work.path();
    let name = fresh_bucket("sftp-drill");
    let url = format!("{base}/{name}");
    let env_of = |who: &str| {
        let cache = work.join(format!("cache-{who}"));
        TestEnv::bare()
            .cache(&cache)
            .state(cache.join("state"))
            .password(PASSWORD)
            .var("CAPSULE_SFTP_KEY", &key)
            .var("CAPSULE_SFTP_KNOWN_HOSTS", &known)
    };
    let laptop = Machine {
        env: env_of("laptop"),
        url: url.clone(),
    };
    // The account creates its own repository (it owns what it makes).
    laptop.ok(&["init"]);
    let src = work.join("src");
    std::fs::create_dir_all(&src).unwrap();
    let mut saved: Vec<(String, PathBuf)> = Vec::new();
    for round in 0..3u64 {
        std::fs::write(src.join(format!("new-{round}")), noise(300_000, round)).unwrap();
        std::fs::write(src.join("changing"), noise(50_000, 200 + round)).unwrap();
        let v = laptop.json(&["backup", src.to_str().unwrap()]);
        assert_eq!(v["append_only"], true, "{v}");
        let expect = keep_a_copy(&src, &work.join(format!("expect-{round}")));
        saved.push((v["snapshot_id"].as_str().unwrap().to_string(), expect));
    }
    // forget and prune from the account stop before changing anything.
    let o = laptop.run(&["forget", "--keep-last", "1", "--prune"]);
    assert_eq!(o.status.code(), Some(15), "{}", said(&o));

    // The attacker, with the same account and key.
    let rest = base.strip_prefix("sftp://").unwrap();
    let (user_host, _) = rest.split_once('/').unwrap();
    let (user_at_host, port) = user_host.rsplit_once(':').unwrap();
    let remote = format!("{}/{name}", base_dir.display());
    let repo_dir = base_dir.join(&name);
    let mut objects = Vec::new();
    let mut dirs = Vec::new();
    for p in walk_all(&repo_dir) {
        let rel = p
            .strip_prefix(&repo_dir)
            .unwrap()
            .to_str()
            .unwrap()
            .to_string();
        if p.is_dir() {
            dirs.push(rel);
        } else {
            objects.push(rel);
        }
    }
    assert!(objects.len() > 5, "{objects:?}");
    let junk = work.join("junk");
    std::fs::write(&junk, b"encrypted by ransomware").unwrap();
    let mut t = Tally::default();
    let mut try_it = |what: &'static str, cmd: String| {
        let done = sftp_as(user_at_host, port, &key, &known, work, &cmd);
        let e = t.0.entry(what).or_default();
        if done {
            e.1 += 1;
        } else {
            e.0 += 1;
        }
    };
    for o in &objects {
        let p = format!("{remote}/{o}");
        try_it("delete object", format!("rm {p}"));
        try_it("rename object away", format!("rename {p} {p}.gone"));
        try_it("make it writable", format!("chmod 666 {p}"));
        try_it(
            "overwrite with garbage",
            format!("put {} {p}", junk.display()),
        );
        try_it("symlink over it", format!("ln -s /dev/null {p}"));
        try_it("hard-link it elsewhere", format!("ln {p} {p}.link"));
    }
    for d in &dirs {
        try_it("remove a directory", format!("rmdir {remote}/{d}"));
    }
    try_it(
        "write a new file",
        format!("put {} {remote}/junk-file", junk.display()),
    );
    eprintln!("attack: {t:?}");
    assert_eq!(
        t.accepted(),
        vec!["write a new file"],
        "the only thing the server let the attacker do is add a file: {t:?}"
    );

    // Every snapshot restores as it was; check reads everything, and says
    // nothing worse than the attacker's extra file.
    for (id, expect) in &saved {
        let target = work.join(format!("restored-{id}"));
        laptop.ok(&["restore", id, "--target", target.to_str().unwrap()]);
        assert_same_files(expect, &common::restored(&target, &src));
    }
    laptop.ok(&["--no-cache", "check", "--read-data"]);
}

/// Every file and directory below `d`.
fn walk_all(d: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(d).unwrap().flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(walk_all(&p));
        }
        out.push(p);
    }
    out
}

/// Issue 59, 5: a key with more rights than the user guide's changes what no
/// capsule command read before: a lifecycle rule that deletes older
/// versions after a day, and the default retention loosened to governance
/// and shortened. `check` and `prune` read the bucket's lifecycle and lock
/// configuration and warn, naming the rule and the setting.
#[test]
fn check_and_prune_warn_of_settings_that_let_history_go_before_the_lock() {
    let Some(admin) = admin() else { return };
    let work = tempfile::tempdir().unwrap();
    let work = work.path();
    let bucket = fresh_bucket("settings");
    let url = format!("s3+http://{}/{bucket}/repo", admin.endpoint);
    let boss = Machine::new(work, "admin", &url, &admin.creds);
    boss.ok(&["init", "--object-lock", "3d", "--lock-mode", "compliance"]);
    let src = work.join("src");
    std::fs::create_dir_all(&src).unwrap();
    std::fs::write(src.join("f"), noise(10_000, 1)).unwrap();
    boss.ok(&["backup", src.to_str().unwrap()]);
    // As the bucket is now: nothing to warn of.
    let v = boss.json(&["check"]);
    assert_eq!(v["lock_warnings"], serde_json::json!([]), "{v}");

    let put = |path: String, body: &str| {
        let a = admin.request(
            "s3",
            "PUT",
            &path,
            &[content_md5(body.as_bytes())],
            Some(body.as_bytes()),
        );
        assert!(a.ok(), "{path}: {a:?}");
    };
    put(
        format!("{bucket}?lifecycle="),
        "<LifecycleConfiguration><Rule><ID>expire-old</ID><Status>Enabled</Status><Filter><Prefix></Prefix></Filter><NoncurrentVersionExpiration><NoncurrentDays>1</NoncurrentDays></NoncurrentVersionExpiration></Rule></LifecycleConfiguration>",
    );
    put(
        format!("{bucket}?object-lock="),
        "<ObjectLockConfiguration><ObjectLockEnabled>Enabled</ObjectLockEnabled><Rule><DefaultRetention><Mode>GOVERNANCE</Mode><Days>1</Days></DefaultRetention></Rule></ObjectLockConfiguration>",
    );
    let o = boss.run(&["check"]);
    assert!(o.status.success(), "{}", said(&o));
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    assert!(err.contains("lifecycle rule \"expire-old\""), "{err}");
    assert!(err.contains("loosened to governance"), "{err}");
    assert!(err.contains("the retention was shortened"), "{err}");
    let v = boss.json(&["prune"]);
    let w = v["prune"]["object_lock"]["warnings"].to_string();
    assert!(w.contains("expire-old") && w.contains("governance"), "{v}");
}
