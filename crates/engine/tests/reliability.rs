//! The reliability suite, engine level: real backups of real files into an
//! in-memory repository behind the fault-injecting backend, with an oracle
//! after every fault.
//!
//! * **Crash points**: a backup (or a key change) is cut at call N of the
//!   backend, N chosen by seed over the calls a clean run makes; every call
//!   after it fails, as if the process had been killed there. Afterwards
//!   `check --read-data` is clean, every committed snapshot restores
//!   bit-identically, and the next backup completes.
//! * **Torn and lost writes**: a backend that breaks its contract (a put
//!   that stores a prefix, or reports success having stored nothing) is
//!   caught by `check`, never by a silent bad restore.
//! * **Bit flips**: one flipped bit in any object is found by `check`, and
//!   every file restore writes is bit-identical; a file that cannot be is
//!   reported, and `check` named it.
//!
//! `CAPSULE_RELIABILITY_RUNS` sets the runs per scenario (the test command
//! uses the default, a few hundred in all; docs/RELIABILITY.md has the
//! long run). `CAPSULE_RELIABILITY_SEED` replays one seed. The table of
//! scenarios, runs, failures, seeds and time is printed at the end.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use capsule_backend::testing::{Fault, FaultBackend, FaultPlan, MemoryBackend};
use capsule_backend::Backend;
use capsule_crypto::KdfParams;
use capsule_engine::backup::{backup, BackupOptions};
use capsule_engine::progress::Progress;
use capsule_engine::prune::{prune, PruneOptions};
use capsule_engine::repo::InitOptions;
use capsule_engine::restore::{restore, RestoreOptions};
use capsule_engine::Repository;
use capsule_format::BlobId;

const PW: &[u8] = b"reliability";

fn kdf() -> KdfParams {
    KdfParams {
        m_cost: 64,
        t_cost: 1,
        p_cost: 1,
    }
}

/// Small chunks and packs, so a small tree makes many packs and several
/// index files: more places for a crash to land.
fn init(store: &Arc<MemoryBackend>) {
    let opts = InitOptions {
        kdf: kdf(),
        chunks: capsule_chunker::ChunkSizes {
            min: 8 << 10,
            avg: 32 << 10,
            max: 128 << 10,
        },
        pack_size: 128 << 10,
        compression: 1,
    };
    Repository::init(store.clone(), PW, &opts).unwrap();
}

fn open(b: Arc<dyn Backend>) -> capsule_engine::Result<Repository> {
    Repository::open(b, PW)
}

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

fn noise(n: usize, seed: u64) -> Vec<u8> {
    let mut r = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
    let mut v = Vec::with_capacity(n + 8);
    while v.len() < n {
        v.extend_from_slice(&r.next().to_le_bytes());
    }
    v.truncate(n);
    v
}

/// A source tree: some compressible, some random, some shared content.
fn write_tree(dir: &Path, generation: u64) {
    std::fs::create_dir_all(dir.join("docs/deep")).unwrap();
    for i in 0..12u64 {
        let size = 1_000 + (i as usize * 37_000) % 180_000;
        std::fs::write(dir.join(format!("docs/f{i}")), noise(size, i + 100)).unwrap();
    }
    std::fs::write(dir.join("docs/deep/text"), "capsule ".repeat(20_000)).unwrap();
    // What changes between generations.
    std::fs::write(
        dir.join(format!("gen-{generation}")),
        noise(1_200_000, 1000 + generation),
    )
    .unwrap();
    std::fs::write(dir.join("docs/f0"), noise(5_000, 7 + generation)).unwrap();
}

/// Every regular file below `dir` and its bytes, by relative path.
fn contents(dir: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    let mut out = BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in rd {
            let p = e.unwrap().path();
            let m = std::fs::symlink_metadata(&p).unwrap();
            if m.is_dir() {
                stack.push(p);
            } else if m.is_file() {
                out.insert(
                    p.strip_prefix(dir).unwrap().to_path_buf(),
                    std::fs::read(&p).unwrap(),
                );
            }
        }
    }
    out
}

fn run_backup(repo: Repository, src: &Path) -> capsule_engine::Result<String> {
    let opts = BackupOptions {
        paths: vec![src.to_path_buf()],
        threads: 2,
        ..Default::default()
    };
    backup(Arc::new(repo), &opts, &Arc::new(Progress::default())).map(|r| r.snapshot_id)
}

/// Restores one snapshot and returns (files restored under the source
/// path, errors).
fn restore_snapshot(
    repo: &Repository,
    id: &str,
    src: &Path,
    scratch: &Path,
) -> (BTreeMap<PathBuf, Vec<u8>>, Vec<String>) {
    let snap = match repo.resolve_snapshot(id) {
        Ok((_, s)) => s,
        Err(e) => return (BTreeMap::new(), vec![format!("snapshot: {e}")]),
    };
    let (index, _) = repo.load_index().unwrap();
    let target = scratch.join(format!("restore-{id}"));
    let _ = std::fs::remove_dir_all(&target);
    let root: BlobId = snap.tree.parse().unwrap();
    let opts = RestoreOptions {
        target: target.clone(),
        max_entries: capsule_engine::treewalk::entry_budget(&snap),
        connections: 0,
        ..Default::default()
    };
    let errors = match restore(repo, &index, &root, &opts, &Progress::default()) {
        Ok(r) => r.errors.into_iter().map(|w| w.path).collect(),
        Err(e) => vec![format!("restore: {e}")],
    };
    let got = contents(&target.join(src.strip_prefix("/").unwrap()));
    let _ = std::fs::remove_dir_all(&target);
    (got, errors)
}

/// The oracle after a fault: a clean check, every snapshot restores what
/// it recorded, the next backup completes and is clean too.
fn oracle(
    store: &Arc<MemoryBackend>,
    expected: &BTreeMap<String, BTreeMap<PathBuf, Vec<u8>>>,
    current: &BTreeMap<PathBuf, Vec<u8>>,
    src: &Path,
    scratch: &Path,
) -> Result<(), String> {
    let repo = open(store.clone()).map_err(|e| format!("open: {e}"))?;
    let r = capsule_engine::check::check(&repo, true, &Progress::default())
        .map_err(|e| format!("check: {e}"))?;
    if !r.ok() {
        return Err(format!("check found damage: {:?}", r.problems));
    }
    let (snaps, bad) = repo.list_snapshots().map_err(|e| e.to_string())?;
    if !bad.is_empty() {
        return Err(format!("unreadable snapshots: {bad:?}"));
    }
    for (id, _) in &snaps {
        let hex = id.to_hex();
        // A snapshot the faulted run committed holds the current tree.
        let want = expected.get(&hex).unwrap_or(current);
        let (got, errors) = restore_snapshot(&repo, &hex, src, scratch);
        if !errors.is_empty() || &got != want {
            return Err(format!(
                "snapshot {} restores {} files ({} errors: {errors:?}), expected {}",
                id.short(),
                got.len(),
                errors.len(),
                want.len()
            ));
        }
    }
    let id = run_backup(repo, src).map_err(|e| format!("next backup: {e}"))?;
    let repo = open(store.clone()).map_err(|e| format!("reopen: {e}"))?;
    let r = capsule_engine::check::check(&repo, true, &Progress::default())
        .map_err(|e| format!("check after the next backup: {e}"))?;
    if !r.ok() {
        return Err(format!("check after the next backup: {:?}", r.problems));
    }
    let (got, errors) = restore_snapshot(&repo, &id, src, scratch);
    if !errors.is_empty() || &got != current {
        return Err(format!("the next backup restores wrong: {errors:?}"));
    }
    Ok(())
}

struct Row {
    scenario: &'static str,
    runs: u64,
    /// Runs where the faulted operation itself reported failure (the fault
    /// fired before it could finish).
    aborted: u64,
    failures: Vec<(u64, String)>,
    seeds: String,
    secs: f64,
}

fn runs(default: u64) -> u64 {
    std::env::var("CAPSULE_RELIABILITY_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn seeds(n: u64, base: u64) -> Vec<u64> {
    match std::env::var("CAPSULE_RELIABILITY_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
    {
        Some(s) => vec![s],
        None => (0..n).map(|i| base + i).collect(),
    }
}

/// The repository after one complete backup of generation 0, the source
/// tree (now generation 1) and what each existing snapshot holds.
struct World {
    _dir: tempfile::TempDir,
    src: PathBuf,
    scratch: PathBuf,
    base: Arc<MemoryBackend>,
    expected: BTreeMap<String, BTreeMap<PathBuf, Vec<u8>>>,
    current: BTreeMap<PathBuf, Vec<u8>>,
    /// Backend calls a clean second backup makes.
    clean_calls: u64,
}

fn world() -> World {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src");
    let scratch = dir.path().join("scratch");
    std::fs::create_dir_all(&scratch).unwrap();
    write_tree(&src, 0);
    let base = Arc::new(MemoryBackend::new());
    init(&base);
    let id = run_backup(open(base.clone()).unwrap(), &src).unwrap();
    let mut expected = BTreeMap::new();
    expected.insert(id, contents(&src));
    write_tree(&src, 1);
    let current = contents(&src);
    let probe = Arc::new(base.fork());
    let fb = Arc::new(FaultBackend::new(probe, FaultPlan::default()));
    run_backup(open(fb.clone()).unwrap(), &src).unwrap();
    World {
        _dir: dir,
        src,
        scratch,
        base,
        expected,
        current,
        clean_calls: fb.calls(),
    }
}

/// One fault at a seeded call of the second backup, then the oracle.
fn backup_fault_scenario(w: &World, name: &'static str, fault: Fault, n: u64, base: u64) -> Row {
    let calls = w.clean_calls;
    plan_scenario(w, name, n, base, |rng| {
        let at = 1 + rng.below(calls + 1);
        (FaultPlan::at(at, fault), format!("fault at call {at}"))
    })
}

/// Every Nth call fails (N seeded, 2 to 9): a flaky link under a backup
/// with no retry layer. The backup may fail; the oracle must hold.
fn every_nth_scenario(w: &World, n: u64, base: u64) -> Row {
    plan_scenario(w, "every Nth call fails in backup", n, base, |rng| {
        let every = 2 + rng.below(8);
        let plan = FaultPlan {
            every: Some((every, Fault::Fail)),
            ..FaultPlan::default()
        };
        (plan, format!("every {every}th call failing"))
    })
}

/// The second backup under the fault plan each seed draws, then the
/// oracle. A backend that lies (torn or lost writes) may leave damage;
/// then what must hold is that check sees it.
fn plan_scenario(
    w: &World,
    name: &'static str,
    n: u64,
    base: u64,
    draw: impl Fn(&mut Rng) -> (FaultPlan, String),
) -> Row {
    let t = Instant::now();
    let mut failures = Vec::new();
    let mut aborted = 0;
    let list = seeds(n, base);
    for &seed in &list {
        let mut rng = Rng(seed.wrapping_mul(0x2545_F491_4F6C_DD1D) | 1);
        let (plan, what) = draw(&mut rng);
        let lies = plan
            .at
            .values()
            .chain(plan.every.iter().map(|(_, f)| f))
            .any(|f| matches!(f, Fault::TornWrite | Fault::LostWrite));
        let store = Arc::new(w.base.fork());
        let fb = Arc::new(FaultBackend::new(store.clone(), plan));
        let outcome = match open(fb.clone()) {
            Ok(repo) => run_backup(repo, &w.src).map(|_| ()),
            Err(e) => Err(e),
        };
        aborted += u64::from(outcome.is_err());
        let verdict = if lies {
            detected_or_clean(&store, w)
        } else {
            oracle(&store, &w.expected, &w.current, &w.src, &w.scratch)
        };
        if let Err(e) = verdict {
            failures.push((seed, format!("{what} (backup: {:?}): {e}", outcome.err())));
        }
    }
    Row {
        scenario: name,
        runs: list.len() as u64,
        aborted,
        failures,
        seeds: format!("{}..{}", list[0], list[list.len() - 1]),
        secs: t.elapsed().as_secs_f64(),
    }
}

/// After a contract-breaking write: either the repository is clean and
/// restores right, or check reports damage (and never a wrong restore of a
/// file check did not name).
fn detected_or_clean(store: &Arc<MemoryBackend>, w: &World) -> Result<(), String> {
    let repo = open(store.clone()).map_err(|e| format!("open: {e}"))?;
    let r = capsule_engine::check::check(&repo, true, &Progress::default())
        .map_err(|e| format!("check: {e}"))?;
    if r.ok() {
        return oracle(store, &w.expected, &w.current, &w.src, &w.scratch);
    }
    restores_match_or_named(&repo, &r, w)
}

/// Every file that restores is bit-identical to what its snapshot holds;
/// every file that does not was named by check.
fn restores_match_or_named(
    repo: &Repository,
    r: &capsule_engine::check::CheckReport,
    w: &World,
) -> Result<(), String> {
    let named: Vec<&String> = r.problems.iter().flat_map(|p| &p.affected).collect();
    let (snaps, _) = repo.list_snapshots().map_err(|e| e.to_string())?;
    for (id, _) in &snaps {
        let hex = id.to_hex();
        let want = w.expected.get(&hex).unwrap_or(&w.current);
        let (got, errors) = restore_snapshot(repo, &hex, &w.src, &w.scratch);
        for (p, bytes) in &got {
            if want.get(p) != Some(bytes) {
                return Err(format!("{}: {} restored wrong", id.short(), p.display()));
            }
        }
        let lost = want.keys().filter(|p| !got.contains_key(*p));
        for p in lost {
            let rel = p.to_string_lossy();
            if !named.iter().any(|a| a.contains(&*rel)) && errors.is_empty() {
                return Err(format!(
                    "{}: {} silently missing (check named {named:?})",
                    id.short(),
                    p.display()
                ));
            }
        }
    }
    Ok(())
}

/// A key change cut at every call: one of the two passwords still opens.
fn key_scenario() -> Row {
    let t = Instant::now();
    let store = Arc::new(MemoryBackend::new());
    init(&store);
    let probe = Arc::new(store.fork());
    let fb = Arc::new(FaultBackend::new(probe.clone(), FaultPlan::default()));
    let mut r = open(probe).unwrap().with_backend(fb.clone());
    r.change_password(b"new", kdf()).unwrap();
    let calls = fb.calls();
    let mut failures = Vec::new();
    let mut aborted = 0;
    for at in 1..=calls + 1 {
        let s = Arc::new(store.fork());
        // Opened cleanly; the crash lands at call `at` of the change.
        let fb = Arc::new(FaultBackend::new(
            s.clone(),
            FaultPlan::at(at, Fault::Crash),
        ));
        let mut r = open(s.clone()).unwrap().with_backend(fb);
        aborted += u64::from(r.change_password(b"new", kdf()).is_err());
        let old = Repository::open(s.clone(), PW).is_ok();
        let new = Repository::open(s.clone(), b"new").is_ok();
        if !old && !new {
            failures.push((at, "neither password opens".to_string()));
        }
    }
    Row {
        scenario: "crash in key passwd",
        runs: calls + 1,
        aborted,
        failures,
        seeds: format!("calls 1..{}", calls + 1),
        secs: t.elapsed().as_secs_f64(),
    }
}

/// One flipped bit in a random object of a repository with two snapshots.
fn bitflip_scenario(w: &World, n: u64, base: u64) -> Row {
    let t = Instant::now();
    // Both generations committed.
    let full = Arc::new(w.base.fork());
    let id = run_backup(open(full.clone()).unwrap(), &w.src).unwrap();
    let mut expected = w.expected.clone();
    expected.insert(id, w.current.clone());
    let names = full.names();
    let mut failures = Vec::new();
    let mut aborted = 0;
    let list = seeds(n, base);
    for &seed in &list {
        let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
        let name = &names[rng.below(names.len() as u64) as usize];
        let store = Arc::new(full.fork());
        let mut bytes = store.bytes(name).unwrap();
        let off = rng.below(bytes.len() as u64) as usize;
        bytes[off] ^= 1 << rng.below(8);
        store.overwrite(name, bytes);
        let verdict = (|| -> Result<(), String> {
            let repo = match open(store.clone()) {
                // Config and the only key: opening must fail, clearly.
                Err(e) => {
                    aborted += 1;
                    let msg = e.to_string();
                    return if (name == "config" && msg.contains("config"))
                        || (name.starts_with("keys/") && msg.contains("key"))
                    {
                        Ok(())
                    } else {
                        Err(format!("open failed unclearly: {msg}"))
                    };
                }
                Ok(r) => r,
            };
            let r = capsule_engine::check::check(&repo, true, &Progress::default())
                .map_err(|e| format!("check: {e}"))?;
            if r.ok() {
                return Err("flip not detected".into());
            }
            let w2 = World {
                _dir: tempfile::tempdir().unwrap(),
                src: w.src.clone(),
                scratch: w.scratch.clone(),
                base: full.clone(),
                expected: expected.clone(),
                current: w.current.clone(),
                clean_calls: 0,
            };
            restores_match_or_named(&repo, &r, &w2)
        })();
        if let Err(e) = verdict {
            failures.push((seed, format!("{name}: {e}")));
        }
    }
    Row {
        scenario: "bit flip in any object",
        runs: list.len() as u64,
        aborted,
        failures,
        seeds: format!("{}..{}", list[0], list[list.len() - 1]),
        secs: t.elapsed().as_secs_f64(),
    }
}

/// Three snapshots, each generation replacing the last one's large file
/// and a small one, so forgetting the oldest leaves packs wholly unused
/// and packs partly used: prune marks, repacks and sweeps.
struct PruneWorld {
    _dir: tempfile::TempDir,
    src: PathBuf,
    scratch: PathBuf,
    base: Arc<MemoryBackend>,
    expected: BTreeMap<String, BTreeMap<PathBuf, Vec<u8>>>,
    oldest: capsule_format::ObjectId,
    /// The source now: the newest generation.
    current: BTreeMap<PathBuf, Vec<u8>>,
    /// Backend calls a clean forget and two prunes make.
    clean_calls: u64,
}

fn prune_opts() -> PruneOptions {
    // Repack whatever is partly used: more steps for a fault to land in.
    PruneOptions {
        max_unused: 0.0,
        ..PruneOptions::default()
    }
}

/// Forgets the oldest snapshot, then prunes twice (mark, then sweep).
fn forget_and_prune(
    store: Arc<dyn Backend>,
    oldest: &capsule_format::ObjectId,
) -> capsule_engine::Result<()> {
    let repo = Arc::new(open(store)?);
    capsule_engine::forget::forget(&repo, oldest)?;
    prune(&repo, &prune_opts())?;
    prune(&repo, &prune_opts())?;
    Ok(())
}

fn prune_world() -> PruneWorld {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src");
    let scratch = dir.path().join("scratch");
    std::fs::create_dir_all(&scratch).unwrap();
    let base = Arc::new(MemoryBackend::new());
    init(&base);
    let mut expected = BTreeMap::new();
    let mut ids = Vec::new();
    for g in 0..3 {
        if g > 0 {
            std::fs::remove_file(src.join(format!("gen-{}", g - 1))).unwrap();
        }
        write_tree(&src, g);
        let id = run_backup(open(base.clone()).unwrap(), &src).unwrap();
        expected.insert(id.clone(), contents(&src));
        ids.push(id);
    }
    let oldest: capsule_format::ObjectId = ids[0].parse().unwrap();
    let current = contents(&src);
    let probe = Arc::new(base.fork());
    let fb = Arc::new(FaultBackend::new(probe.clone(), FaultPlan::default()));
    forget_and_prune(fb.clone(), &oldest).unwrap();
    // The clean run did give space back, or the scenario tests nothing.
    let packs = |m: &MemoryBackend| m.names().iter().filter(|n| n.starts_with("data/")).count();
    assert!(packs(&probe) < packs(&base), "nothing pruned");
    PruneWorld {
        _dir: dir,
        src,
        scratch,
        base,
        current,
        expected,
        oldest,
        clean_calls: fb.calls(),
    }
}

/// After a faulted forget and prune: check is clean and every live
/// snapshot restores what it recorded; prunes run cleanly until one finds
/// nothing left to do (at most four), with the same holding after; then
/// the oracle of the backup scenarios (next backup included).
fn prune_oracle(store: &Arc<MemoryBackend>, w: &PruneWorld) -> Result<(), String> {
    let verify = |when: &str| -> Result<(), String> {
        let repo = open(store.clone()).map_err(|e| format!("open {when}: {e}"))?;
        let r = capsule_engine::check::check(&repo, true, &Progress::default())
            .map_err(|e| format!("check {when}: {e}"))?;
        if !r.ok() {
            return Err(format!("check {when} found damage: {:?}", r.problems));
        }
        let (snaps, _) = repo.list_snapshots().map_err(|e| e.to_string())?;
        if snaps.len() < 2 {
            return Err(format!(
                "{when}: {} snapshots live, expected 2 or 3",
                snaps.len()
            ));
        }
        for (id, _) in &snaps {
            let hex = id.to_hex();
            let (got, errors) = restore_snapshot(&repo, &hex, &w.src, &w.scratch);
            if !errors.is_empty() || got != w.expected[&hex] {
                return Err(format!(
                    "{when}: snapshot {} restores wrong: {errors:?}",
                    id.short()
                ));
            }
        }
        Ok(())
    };
    verify("after the fault")?;
    let repo = Arc::new(open(store.clone()).map_err(|e| e.to_string())?);
    // The forget may not have happened: finish it, as a user would.
    if repo.list_snapshots().map_err(|e| e.to_string())?.0.len() == 3 {
        capsule_engine::forget::forget(&repo, &w.oldest)
            .map_err(|e| format!("forget again: {e}"))?;
    }
    let mut done = false;
    for _ in 0..4 {
        let r = prune(&repo, &prune_opts()).map_err(|e| format!("next prune: {e}"))?;
        if r.packs_marked == 0
            && r.marks_waiting == 0
            && r.packs_deleted == 0
            && r.forgotten_removed == 0
        {
            done = true;
            break;
        }
    }
    if !done {
        return Err("four prunes after the fault did not finish the job".into());
    }
    verify("after the next prunes")?;
    let expected: BTreeMap<_, _> = w
        .expected
        .iter()
        .filter(|(id, _)| **id != w.oldest.to_hex())
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    // The source holds the newest generation: the next backup is of it.
    oracle(store, &expected, &w.current, &w.src, &w.scratch)
}

/// One fault at a seeded call of forget-and-prune, then the prune oracle.
fn prune_fault_scenario(
    w: &PruneWorld,
    name: &'static str,
    fault: Fault,
    n: u64,
    base: u64,
) -> Row {
    let t = Instant::now();
    let mut failures = Vec::new();
    let mut aborted = 0;
    let list = seeds(n, base);
    for &seed in &list {
        let mut rng = Rng(seed.wrapping_mul(0x2545_F491_4F6C_DD1D) | 1);
        let at = 1 + rng.below(w.clean_calls + 1);
        let store = Arc::new(w.base.fork());
        let fb = Arc::new(FaultBackend::new(store.clone(), FaultPlan::at(at, fault)));
        let outcome = forget_and_prune(fb, &w.oldest);
        aborted += u64::from(outcome.is_err());
        if let Err(e) = prune_oracle(&store, w) {
            failures.push((
                seed,
                format!("fault at call {at} (prune: {:?}): {e}", outcome.err()),
            ));
        }
    }
    Row {
        scenario: name,
        runs: list.len() as u64,
        aborted,
        failures,
        seeds: format!("{}..{}", list[0], list[list.len() - 1]),
        secs: t.elapsed().as_secs_f64(),
    }
}

#[test]
fn reliability_suite() {
    let w = world();
    let pw = prune_world();
    let n = runs(200);
    eprintln!(
        "a clean second backup makes {} backend calls; forget and two prunes make {}",
        w.clean_calls, pw.clean_calls
    );
    let rows = vec![
        backup_fault_scenario(&w, "crash in backup", Fault::Crash, n, 1),
        backup_fault_scenario(&w, "failed call in backup", Fault::Fail, n / 2, 10_001),
        backup_fault_scenario(&w, "destination full in backup", Fault::Full, n / 2, 20_001),
        backup_fault_scenario(&w, "short read in backup", Fault::ShortRead, n / 2, 30_001),
        backup_fault_scenario(&w, "torn write in backup", Fault::TornWrite, n / 2, 40_001),
        backup_fault_scenario(&w, "lost write in backup", Fault::LostWrite, n / 2, 50_001),
        backup_fault_scenario(&w, "stalled call in backup", Fault::Stall, n / 8, 70_001),
        every_nth_scenario(&w, n / 4, 80_001),
        key_scenario(),
        prune_fault_scenario(
            &pw,
            "crash in forget and prune",
            Fault::Crash,
            n / 2,
            90_001,
        ),
        prune_fault_scenario(&pw, "failed call in prune", Fault::Fail, n / 4, 100_001),
        prune_fault_scenario(
            &pw,
            "destination full in prune",
            Fault::Full,
            n / 8,
            110_001,
        ),
        prune_fault_scenario(&pw, "short read in prune", Fault::ShortRead, n / 8, 120_001),
        bitflip_scenario(&w, n, 60_001),
    ];
    eprintln!(
        "\n| scenario | runs | operation failed (fault fired) | oracle failures | seeds | time |\n|---|---:|---:|---:|---|---:|"
    );
    for r in &rows {
        eprintln!(
            "| {} | {} | {} | {} | {} | {:.1} s |",
            r.scenario,
            r.runs,
            r.aborted,
            r.failures.len(),
            r.seeds,
            r.secs
        );
    }
    let failed: Vec<String> = rows
        .iter()
        .flat_map(|r| {
            r.failures
                .iter()
                .map(move |(s, e)| format!("{} seed {s}: {e}", r.scenario))
        })
        .collect();
    assert!(
        failed.is_empty(),
        "{} failures (replay with CAPSULE_RELIABILITY_SEED=<seed>):\n{}",
        failed.len(),
        failed.join("\n")
    );
}
