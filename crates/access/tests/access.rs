//! The one way in, with the in-memory backend: opening (key hint, cache,
//! direct), a backup that thins to its quota, and the stack every caller
//! gets.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::path::Path;
use std::sync::Arc;

use capsule_access::{Access, CachePolicy, Connect, Notice, Stack, WhenFull};
use capsule_backend::testing::MemoryBackend;
use capsule_backend::LabBackend;
use capsule_crypto::KdfParams;
use capsule_engine::backup::BackupOptions;
use capsule_engine::progress::Progress;
use capsule_engine::repo::InitOptions;
use capsule_engine::KeySource;
use capsule_net::Destination;

const PW: &[u8] = b"a password";

fn cheap() -> InitOptions {
    InitOptions {
        kdf: KdfParams {
            m_cost: 64,
            t_cost: 1,
            p_cost: 1,
        },
        ..InitOptions::default()
    }
}

fn access(dir: &Path) -> Access {
    Access {
        dest: Destination::Local(dir.join("labelled-repo")),
        connect: Connect::default(),
        cache: CachePolicy::In(dir.join("cache")),
    }
}

fn stack(store: &Arc<MemoryBackend>) -> Stack {
    Stack::over(
        store.clone() as Arc<dyn LabBackend>,
        "memory",
        &Connect::default(),
    )
    .unwrap()
}

#[test]
fn the_stack_is_built_in_one_order() {
    let store = Arc::new(MemoryBackend::new());
    assert_eq!(stack(&store).layers, ["retry", "metered", "memory"]);
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join("repo");
    let s = Stack::connect(&Destination::Local(dir.clone()), &Connect::default(), true).unwrap();
    assert_eq!(s.layers, ["retry", "metered", "local"]);
    assert!(!s.remote);
    // Missing, without `create`: not a repository, named.
    let e = Stack::connect(
        &Destination::Local(t.path().join("nothing")),
        &Connect::default(),
        false,
    )
    .unwrap_err();
    assert!(e.to_string().contains("nothing"), "{e}");
}

#[test]
fn opening_keeps_a_key_hint_and_puts_the_cache_on_top() {
    let t = tempfile::tempdir().unwrap();
    let a = access(t.path());
    let store = Arc::new(MemoryBackend::new());
    let first = stack(&store).init(&a, PW, &cheap()).unwrap();
    let id = first.repo.config().id.clone();
    assert_eq!(first.repo.key_source(), KeySource::New);
    assert_eq!(
        first.cache_dir(),
        Some(t.path().join("cache").join(&id).as_path())
    );
    // The hint written by the first open starts the next one's derivation.
    let hint = a.key_hint().expect("a key hint is kept");
    assert_eq!(&hint, first.repo.key_hint());
    let early = a.start_key(PW);
    let o = stack(&store).open(&a, PW, early).unwrap();
    assert_eq!(o.repo.key_source(), KeySource::Early);
    assert!(o.cache.is_some());
    // Requests go through the stack's counters.
    let before = o.stack.requests.requests();
    o.repo.list_snapshots().unwrap();
    assert!(o.stack.requests.requests() > before);
    // A key derived once and handed over: nothing derived.
    let (hint, kek) = a.start_key(PW).unwrap().wait().unwrap();
    let held = capsule_engine::EarlyKey::derived(hint, kek);
    let o = stack(&store).open_direct(&a, PW, Some(held)).unwrap();
    assert_eq!(o.repo.key_source(), KeySource::Held);
    assert!(o.cache.is_none(), "direct: no cache layer");
    assert!(o.cache_dir().is_some(), "but its directory is known");
    // A wrong password is the engine's error.
    let e = stack(&store).open(&a, b"wrong", None).unwrap_err();
    assert!(
        matches!(e, capsule_engine::EngineError::WrongPassword { .. }),
        "{e}"
    );
    // Off: no hint, no cache.
    let off = Access {
        cache: CachePolicy::Off,
        ..a.clone()
    };
    assert!(off.key_hint().is_none());
    let o = stack(&store).open(&off, PW, None).unwrap();
    assert!(o.cache.is_none() && o.cache_dir().is_none());
}

#[test]
fn a_backup_thins_to_its_quota_and_says_so() {
    let t = tempfile::tempdir().unwrap();
    let a = access(t.path());
    let store = Arc::new(MemoryBackend::new());
    let src = t.path().join("src");
    std::fs::create_dir_all(&src).unwrap();
    drop(stack(&store).init(&a, PW, &cheap()).unwrap());
    let run = |seed: u64| {
        std::fs::write(src.join("f"), capsule_testkit::noise(3 << 20, seed)).unwrap();
        let o = stack(&store).open(&a, PW, None).unwrap();
        let mut notices = Vec::new();
        let r = o
            .backup(
                BackupOptions {
                    paths: vec![src.clone()],
                    ..BackupOptions::default()
                },
                WhenFull::DeleteOldest,
                &Arc::new(Progress::default()),
                &mut |n| {
                    notices.push(match n {
                        Notice::Warning(w) => w,
                        Notice::Thinning(p) => format!("thin {}", p.remove.len()),
                    })
                },
            )
            .unwrap();
        (r, notices)
    };
    let (r1, _) = run(1);
    let (_, _) = run(2);
    assert!(r1.quota.is_none() && r1.stored.is_none());
    // Room for about two runs: the third must make room first.
    let o = stack(&store).open(&a, PW, None).unwrap();
    capsule_engine::quota::set(&o.repo, 7 << 20, 0).unwrap();
    drop(o);
    let (r3, notices) = run(3);
    assert_eq!(r3.quota.map(|q| q.bytes), Some(7 << 20));
    assert_eq!(notices, ["thin 1"], "one snapshot removed, said once");
    assert_eq!(r3.thinned.len(), 1);
    assert_eq!(r3.thinned[0].plan.remove[0].id, r1.report.snapshot_id);
    assert!(r3.stored.unwrap() <= 7 << 20, "{:?}", r3.stored);
    // With `fail`, a run that would need room fails and removes nothing.
    std::fs::write(src.join("f"), capsule_testkit::noise(3 << 20, 4)).unwrap();
    let o = stack(&store).open(&a, PW, None).unwrap();
    let before = o.repo.list_snapshots().unwrap().0.len();
    let e = o
        .backup(
            BackupOptions {
                paths: vec![src.clone()],
                ..BackupOptions::default()
            },
            WhenFull::Fail,
            &Arc::new(Progress::default()),
            &mut |_| {},
        )
        .unwrap_err();
    assert!(e.to_string().contains("quota"), "{e}");
    let o = stack(&store).open(&a, PW, None).unwrap();
    assert_eq!(o.repo.list_snapshots().unwrap().0.len(), before);
}
