//! `capsule-bench`: runs capsule, restic, borg and rsync `--link-dest` on the
//! same generated data into local repositories, and prints one table per
//! step (initial backup, no-change run, +10,000 × 50 KiB files, full
//! restore) with wall time, CPU time, peak RSS and items/s. Peers are
//! measured in the same run on the same machine; nothing is asserted.

use std::fmt::Write as _;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use clap::Parser;

/// Compare capsule with restic, borg and rsync on generated data.
#[derive(Parser, Debug)]
#[command(version, about)]
struct Args {
    /// Scratch directory (data, repositories, restores); removed at the end
    /// unless --keep.
    #[arg(long, default_value = "bench/work")]
    work: PathBuf,
    /// The capsule binary to measure.
    #[arg(long, default_value = "target/release/capsule")]
    capsule: PathBuf,
    /// Tools to run, comma-separated.
    #[arg(
        long,
        default_value = "capsule,restic,borg,rustic,rsync",
        value_delimiter = ','
    )]
    tools: Vec<String>,
    /// Use this directory as the base data set (copied) instead of generating one.
    #[arg(long)]
    source: Option<PathBuf>,
    /// Use the Rust toolchains under ~/.rustup/toolchains (about 120,000
    /// real files) as the base data set.
    #[arg(long, conflicts_with = "source")]
    toolchain: bool,
    /// Install missing peers first: restic, borg, rsync from Debian
    /// (apt-get, as root) and rustic with `cargo install rustic-rs` into
    /// ~/.cache/capsule-bench (built once, reused).
    #[arg(long)]
    install: bool,
    /// Size of the generated base data set in MiB.
    #[arg(long, default_value_t = 512)]
    size_mib: u64,
    /// How many 50 KiB files the "add small files" step adds.
    #[arg(long, default_value_t = 10_000)]
    small_files: usize,
    /// Drop the page cache before each step (needs root).
    #[arg(long)]
    drop_caches: bool,
    /// Keep the scratch directory.
    #[arg(long)]
    keep: bool,
    /// Also write the tables to this Markdown file.
    #[arg(long)]
    output: Option<PathBuf>,
}

const STEPS: [&str; 5] = [
    "initial backup",
    "no-change run",
    "+10k small files",
    "1% of files modified",
    "full restore",
];
const PASSWORD: &str = "benchmark password";

#[derive(Clone, Copy, Default)]
struct Measure {
    wall: f64,
    cpu: f64,
    rss_mib: f64,
    ok: bool,
}

fn xorshift(x: &mut u64) -> u64 {
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    *x
}

fn random_bytes(n: usize, seed: &mut u64) -> Vec<u8> {
    let mut v = Vec::with_capacity(n + 8);
    while v.len() < n {
        v.extend_from_slice(&xorshift(seed).to_le_bytes());
    }
    v.truncate(n);
    v
}

const WORDS: &[&str] = &[
    "backup",
    "network",
    "share",
    "latency",
    "snapshot",
    "chunk",
    "index",
    "pack",
    "restore",
    "the",
    "of",
    "and",
    "file",
    "directory",
    "storage",
    "encrypted",
    "fn",
    "let",
    "impl",
    "struct",
    "return",
    "match",
];

fn text_bytes(n: usize, seed: &mut u64) -> Vec<u8> {
    let mut v = Vec::with_capacity(n + 16);
    while v.len() < n {
        let w = WORDS[(xorshift(seed) % WORDS.len() as u64) as usize];
        v.extend_from_slice(w.as_bytes());
        v.push(if xorshift(seed).is_multiple_of(12) {
            b'\n'
        } else {
            b' '
        });
    }
    v.truncate(n);
    v
}

/// A home-directory-like tree: many small text files, source-like trees,
/// incompressible media and one large mixed file.
fn generate(dir: &Path, size_mib: u64) -> Result<(u64, u64)> {
    let mut seed = 0x5eed_cafe_f00d_u64;
    let budget = size_mib << 20;
    let (mut files, mut bytes) = (0u64, 0u64);
    let mut put = |rel: String, data: Vec<u8>| -> Result<()> {
        let p = dir.join(rel);
        std::fs::create_dir_all(p.parent().unwrap_or(dir))?;
        bytes += data.len() as u64;
        files += 1;
        std::fs::write(p, data)?;
        Ok(())
    };
    // 20%: documents, 2-64 KiB text.
    let mut used = 0;
    let mut i = 0;
    while used < budget / 5 {
        let n = 2048 + (xorshift(&mut seed) % (62 * 1024)) as usize;
        used += n as u64;
        put(
            format!("docs/d{:02}/doc{i:05}.txt", i % 50),
            text_bytes(n, &mut seed),
        )?;
        i += 1;
    }
    // 5%: source trees, 1-8 KiB.
    used = 0;
    i = 0;
    while used < budget / 20 {
        let n = 1024 + (xorshift(&mut seed) % (7 * 1024)) as usize;
        used += n as u64;
        put(
            format!("src/p{:02}/m{:02}/f{i:05}.rs", i % 7, i % 31),
            text_bytes(n, &mut seed),
        )?;
        i += 1;
    }
    // 35%: media, 8 MiB incompressible.
    used = 0;
    i = 0;
    while used < budget * 7 / 20 {
        bytes += write_streamed(
            &dir.join(format!("media/m{i:03}.bin")),
            8 << 20,
            0,
            &mut seed,
        )?;
        files += 1;
        used += 8 << 20;
        i += 1;
    }
    // 40%: one large file, half random, half text (a disk image, a database).
    let half = budget * 2 / 10;
    bytes += write_streamed(&dir.join("vm/disk.img"), half, half, &mut seed)?;
    files += 1;
    Ok((files, bytes))
}

/// Writes `random` bytes of noise then `text` bytes of text, 1 MiB at a
/// time. The benchmark process must stay small: a child's peak RSS as
/// reported by wait4 includes the parent's high-water mark at exec.
fn write_streamed(p: &Path, random: u64, text: u64, seed: &mut u64) -> Result<u64> {
    std::fs::create_dir_all(p.parent().unwrap_or(Path::new(".")))?;
    let mut f = std::io::BufWriter::new(std::fs::File::create(p)?);
    for (total, is_text) in [(random, false), (text, true)] {
        let mut left = total;
        while left > 0 {
            let n = left.min(1 << 20) as usize;
            let chunk = if is_text {
                text_bytes(n, seed)
            } else {
                random_bytes(n, seed)
            };
            f.write_all(&chunk)?;
            left -= n as u64;
        }
    }
    f.flush()?;
    Ok(random + text)
}

fn generate_small(dir: &Path, n: usize) -> Result<()> {
    let mut seed = 0xadd5_u64;
    for i in 0..n {
        let p = dir.join(format!("s{:03}/small{i:05}.dat", i / 500));
        if i % 500 == 0 {
            std::fs::create_dir_all(p.parent().unwrap_or(dir))?;
        }
        // Half compressible, half not: like photos plus documents.
        let data = if i % 2 == 0 {
            random_bytes(50 * 1024, &mut seed)
        } else {
            text_bytes(50 * 1024, &mut seed)
        };
        std::fs::write(p, data)?;
    }
    Ok(())
}

/// Runs a command to completion and measures it with wait4 (peak RSS of
/// that one child, user+system CPU).
#[allow(unsafe_code)]
fn measure(cmd: &mut Command) -> Result<Measure> {
    let start = Instant::now();
    let child = cmd
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .with_context(|| format!("starting {cmd:?}"))?;
    let pid = child.id() as libc::pid_t;
    let mut stderr = child.stderr;
    let reader = std::thread::spawn(move || {
        let mut s = String::new();
        if let Some(e) = stderr.as_mut() {
            use std::io::Read;
            let _ = e.read_to_string(&mut s);
        }
        s
    });
    let mut status: libc::c_int = 0;
    // SAFETY: `rusage` is a plain C struct that wait4 fully initializes; `pid`
    // is our own child, waited for exactly once (Child's own wait is never called).
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    let r = unsafe { libc::wait4(pid, &mut status, 0, &mut ru) };
    let wall = start.elapsed().as_secs_f64();
    if r < 0 {
        bail!("wait4 failed: {}", std::io::Error::last_os_error());
    }
    let err = reader.join().unwrap_or_default();
    let exited_ok = libc::WIFEXITED(status) && matches!(libc::WEXITSTATUS(status), 0 | 1);
    if !libc::WIFEXITED(status) || libc::WEXITSTATUS(status) != 0 {
        eprintln!("  ! {cmd:?} exited with status {status:#x}: {}", err.trim());
    }
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    Ok(Measure {
        wall,
        cpu: tv(ru.ru_utime) + tv(ru.ru_stime),
        rss_mib: ru.ru_maxrss as f64 / 1024.0,
        ok: exited_ok,
    })
}

fn drop_caches(enabled: bool) {
    if enabled {
        let _ = Command::new("sync").status();
        if std::fs::write("/proc/sys/vm/drop_caches", "3").is_err() {
            eprintln!("  (cannot drop caches; measuring with a warm cache)");
        }
    }
}

fn tool_version(tool: &str, capsule: &Path) -> String {
    let out = match tool {
        "capsule" => Command::new(capsule).arg("--version").output(),
        "restic" => Command::new("restic").arg("version").output(),
        "borg" => Command::new("borg").arg("--version").output(),
        "rsync" => Command::new("rsync").arg("--version").output(),
        "rustic" => Command::new(rustic_bin()).arg("--version").output(),
        _ => return "?".into(),
    };
    out.ok()
        .map(|o| {
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .next()
                .unwrap_or("")
                .trim()
                .to_string()
        })
        .unwrap_or_else(|| "not installed".into())
}

/// Where `--install` puts rustic; used when rustic is not on PATH.
fn rustic_root() -> PathBuf {
    std::env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/tmp"))
        .join(".cache/capsule-bench")
}

fn rustic_bin() -> PathBuf {
    let local = rustic_root().join("bin/rustic");
    if local.exists() {
        local
    } else {
        PathBuf::from("rustic")
    }
}

fn works(cmd: &mut Command) -> bool {
    cmd.output().map(|o| o.status.success()).unwrap_or(false)
}

fn install_peers() -> Result<()> {
    let missing: Vec<&str> = [
        ("restic", "restic"),
        ("borg", "borgbackup"),
        ("rsync", "rsync"),
    ]
    .iter()
    .filter(|(bin, _)| !works(Command::new(bin).arg("--version")))
    .map(|(_, pkg)| *pkg)
    .collect();
    if !missing.is_empty() {
        eprintln!("installing {missing:?} with apt-get ...");
        let _ = Command::new("apt-get").args(["update", "-qq"]).status();
        let st = Command::new("apt-get")
            .args(["install", "-y", "-qq"])
            .args(&missing)
            .env("DEBIAN_FRONTEND", "noninteractive")
            .status()?;
        if !st.success() {
            bail!("apt-get install {missing:?} failed");
        }
    }
    if !works(Command::new(rustic_bin()).arg("--version")) {
        eprintln!("building rustic with cargo install rustic-rs (slow on 2 cores) ...");
        let st = Command::new("cargo")
            .args(["install", "--locked", "rustic-rs", "--root"])
            .arg(rustic_root())
            .status()?;
        if !st.success() {
            bail!("cargo install rustic-rs failed");
        }
    }
    Ok(())
}

/// One tool's commands.
struct Tool<'a> {
    name: &'a str,
    capsule: &'a Path,
    repo: PathBuf,
    runs: usize,
}

impl Tool<'_> {
    fn cmd(&self, prog: &str) -> Command {
        let mut c = Command::new(prog);
        c.env("CAPSULE_PASSWORD", PASSWORD)
            .env("RESTIC_PASSWORD", PASSWORD)
            .env("BORG_PASSPHRASE", PASSWORD)
            .env("RUSTIC_PASSWORD", PASSWORD)
            .env("RUSTIC_NO_PROGRESS", "true")
            .env("BORG_UNKNOWN_UNENCRYPTED_REPO_ACCESS_IS_OK", "yes")
            .env("BORG_RELOCATED_REPO_ACCESS_IS_OK", "yes");
        c
    }

    fn init(&self) -> Result<()> {
        let st = match self.name {
            "capsule" => self
                .cmd(&self.capsule.display().to_string())
                .arg("-r")
                .arg(&self.repo)
                .arg("-q")
                .arg("init")
                .status()?,
            "restic" => self
                .cmd("restic")
                .arg("-r")
                .arg(&self.repo)
                .arg("init")
                .stdout(std::process::Stdio::null())
                .status()?,
            "rustic" => self
                .cmd(&rustic_bin().display().to_string())
                .arg("-r")
                .arg(&self.repo)
                .arg("init")
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .status()?,
            "borg" => self
                .cmd("borg")
                .args(["init", "-e", "repokey-blake2"])
                .arg(&self.repo)
                .stderr(std::process::Stdio::null())
                .status()?,
            "rsync" => {
                std::fs::create_dir_all(&self.repo)?;
                return Ok(());
            }
            other => bail!("unknown tool {other}"),
        };
        if !st.success() {
            bail!("{} init failed", self.name);
        }
        Ok(())
    }

    fn backup(&mut self, src: &Path) -> Result<Measure> {
        self.runs += 1;
        let mut c = match self.name {
            "capsule" => {
                let mut c = self.cmd(&self.capsule.display().to_string());
                c.arg("-r").arg(&self.repo).arg("-q").arg("backup").arg(src);
                c
            }
            "restic" => {
                let mut c = self.cmd("restic");
                c.arg("-r").arg(&self.repo).args(["backup", "-q"]).arg(src);
                c
            }
            "rustic" => {
                let mut c = self.cmd(&rustic_bin().display().to_string());
                c.arg("-r").arg(&self.repo).arg("backup").arg(src);
                c
            }
            "borg" => {
                let mut c = self.cmd("borg");
                c.arg("create")
                    .arg(format!("{}::run{}", self.repo.display(), self.runs))
                    .arg(src);
                c
            }
            _ => {
                // rsync --link-dest: a full tree per run, unchanged files hard-linked.
                let dst = self.repo.join(format!("run{}", self.runs));
                let mut c = Command::new("rsync");
                c.args(["-aHAX", "--delete"]);
                if self.runs > 1 {
                    c.arg(format!(
                        "--link-dest={}",
                        self.repo.join(format!("run{}", self.runs - 1)).display()
                    ));
                }
                c.arg(format!("{}/", src.display())).arg(&dst);
                c
            }
        };
        measure(&mut c)
    }

    fn restore(&self, target: &Path) -> Result<Measure> {
        std::fs::create_dir_all(target)?;
        let mut c = match self.name {
            "capsule" => {
                let mut c = self.cmd(&self.capsule.display().to_string());
                c.arg("-r")
                    .arg(&self.repo)
                    .arg("-q")
                    .args(["restore", "latest", "-t"])
                    .arg(target);
                c
            }
            "restic" => {
                let mut c = self.cmd("restic");
                c.arg("-r")
                    .arg(&self.repo)
                    .args(["restore", "latest", "-q", "--target"])
                    .arg(target);
                c
            }
            "rustic" => {
                let mut c = self.cmd(&rustic_bin().display().to_string());
                c.arg("-r")
                    .arg(&self.repo)
                    .args(["restore", "latest"])
                    .arg(target);
                c
            }
            "borg" => {
                let mut c = self.cmd("borg");
                c.current_dir(target).arg("extract").arg(format!(
                    "{}::run{}",
                    self.repo.display(),
                    self.runs
                ));
                c
            }
            _ => {
                let mut c = Command::new("rsync");
                c.arg("-aHAX")
                    .arg(format!(
                        "{}/",
                        self.repo.join(format!("run{}", self.runs)).display()
                    ))
                    .arg(target);
                c
            }
        };
        measure(&mut c)
    }
}

fn count_files(dir: &Path) -> (u64, u64) {
    let (mut n, mut b) = (0, 0);
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        if let Ok(rd) = std::fs::read_dir(&d) {
            for e in rd.flatten() {
                match e.file_type() {
                    Ok(t) if t.is_dir() => stack.push(e.path()),
                    Ok(t) if t.is_file() => {
                        n += 1;
                        b += e.metadata().map(|m| m.len()).unwrap_or(0);
                    }
                    _ => {}
                }
            }
        }
    }
    (n, b)
}

fn list_files(dir: &Path, out: &mut Vec<PathBuf>) {
    if let Ok(rd) = std::fs::read_dir(dir) {
        for e in rd.flatten() {
            match e.file_type() {
                Ok(t) if t.is_dir() => list_files(&e.path(), out),
                Ok(t) if t.is_file() => out.push(e.path()),
                _ => {}
            }
        }
    }
}

fn du(dir: &Path) -> u64 {
    count_files(dir).1
}

fn main() -> Result<()> {
    let args = Args::parse();
    let work = std::path::absolute(&args.work)?;
    let capsule = std::path::absolute(&args.capsule)?;
    if !capsule.exists() {
        bail!(
            "{} not found: build it with `cargo build --release` first",
            capsule.display()
        );
    }
    if args.install {
        install_peers()?;
    }
    let source = if args.toolchain {
        let home = std::env::var_os("HOME")
            .map(PathBuf::from)
            .unwrap_or_default();
        Some(home.join(".rustup/toolchains"))
    } else {
        args.source.clone()
    };
    let _ = std::fs::remove_dir_all(&work);
    let src = work.join("data/src");
    let small = work.join("data/small");
    std::fs::create_dir_all(&src)?;
    std::fs::create_dir_all(&small)?;
    eprintln!("generating data in {} ...", work.display());
    let (files, bytes) = match &source {
        Some(s) => {
            let st = Command::new("cp")
                .arg("-a")
                .arg(format!("{}/.", s.display()))
                .arg(&src)
                .status()?;
            if !st.success() {
                bail!("copying {} failed", s.display());
            }
            count_files(&src)
        }
        None => generate(&src, args.size_mib)?,
    };
    generate_small(&small, args.small_files)?;
    // Let ctimes age past the one-second window in which capsule re-reads
    // files on the next run (see docs/DESIGN.md, change detection).
    std::thread::sleep(std::time::Duration::from_secs(2));

    let tools: Vec<String> = args
        .tools
        .iter()
        .filter(|t| {
            let v = tool_version(t, &capsule);
            let ok = v != "not installed" && !v.is_empty();
            if !ok {
                eprintln!("skipping {t}: not installed");
            }
            ok
        })
        .cloned()
        .collect();
    let mut results: Vec<Vec<Measure>> = vec![vec![Measure::default(); tools.len()]; STEPS.len()];
    let mut sizes = vec![0u64; tools.len()];
    let added = src.join("added-small-files");
    // Every 100th file of the base set (sorted): 1% of the files.
    let mut all_files = Vec::new();
    list_files(&src, &mut all_files);
    all_files.sort();
    let modify: Vec<(PathBuf, u64)> = all_files
        .iter()
        .step_by(100)
        .filter_map(|p| {
            std::fs::symlink_metadata(p)
                .ok()
                .map(|m| (p.clone(), m.len()))
        })
        .collect();
    for (ti, name) in tools.iter().enumerate() {
        eprintln!("== {name}");
        let mut tool = Tool {
            name,
            capsule: &capsule,
            repo: work.join("repos").join(name),
            runs: 0,
        };
        tool.init()?;
        drop_caches(args.drop_caches);
        results[0][ti] = tool.backup(&src)?;
        eprintln!("  initial   {:.2}s", results[0][ti].wall);
        drop_caches(args.drop_caches);
        results[1][ti] = tool.backup(&src)?;
        eprintln!("  no-change {:.2}s", results[1][ti].wall);
        std::fs::rename(&small, &added)?;
        let steps = (|| -> Result<()> {
            drop_caches(args.drop_caches);
            results[2][ti] = tool.backup(&src)?;
            eprintln!("  +small    {:.2}s", results[2][ti].wall);
            // Modify 1% of the files: append a line (undone after this tool,
            // so every tool sees the same data).
            for (p, _) in &modify {
                let mut f = std::fs::OpenOptions::new().append(true).open(p)?;
                f.write_all(b"\n# modified by capsule-bench\n")?;
            }
            drop_caches(args.drop_caches);
            results[3][ti] = tool.backup(&src)?;
            eprintln!("  modify 1% {:.2}s", results[3][ti].wall);
            sizes[ti] = du(&tool.repo);
            let target = work.join("restore").join(name);
            drop_caches(args.drop_caches);
            results[4][ti] = tool.restore(&target)?;
            let (rf, _) = count_files(&target);
            let want = files + args.small_files as u64;
            if rf < want {
                eprintln!("  ! restore produced {rf} files, expected {want}");
                results[4][ti].ok = false;
            }
            eprintln!("  restore   {:.2}s", results[4][ti].wall);
            let _ = std::fs::remove_dir_all(&target);
            Ok(())
        })();
        for (p, len) in &modify {
            if let Ok(f) = std::fs::OpenOptions::new().write(true).open(p) {
                let _ = f.set_len(*len);
            }
        }
        std::fs::rename(&added, &small)?;
        steps?;
        // Ctimes of the truncated files must age before the next tool runs.
        std::thread::sleep(std::time::Duration::from_secs(2));
    }

    let mut md = String::new();
    let _ = writeln!(md, "Data: {files} files, {:.0} MiB base; +{} × 50 KiB files. Warm page cache unless --drop-caches.\n", bytes as f64 / 1048576.0, args.small_files);
    let _ = writeln!(
        md,
        "Versions: {}\n",
        tools
            .iter()
            .map(|t| tool_version(t, &capsule))
            .collect::<Vec<_>>()
            .join("; ")
    );
    for (si, step) in STEPS.iter().enumerate() {
        let items = match si {
            0 | 1 => files,
            _ => files + args.small_files as u64,
        };
        let _ = writeln!(md, "### {step}\n");
        let _ = writeln!(
            md,
            "| tool | wall s | CPU s | peak RSS MiB | items/s | vs capsule |"
        );
        let _ = writeln!(md, "|---|---:|---:|---:|---:|---:|");
        let base = tools
            .iter()
            .position(|t| t == "capsule")
            .map(|i| results[si][i].wall);
        for (ti, t) in tools.iter().enumerate() {
            let m = results[si][ti];
            let ratio = base
                .map(|b| format!("{:.1}×", m.wall / b.max(1e-9)))
                .unwrap_or_default();
            let _ = writeln!(
                md,
                "| {t}{} | {:.2} | {:.2} | {:.0} | {:.0} | {ratio} |",
                if m.ok { "" } else { " (FAILED)" },
                m.wall,
                m.cpu,
                m.rss_mib,
                items as f64 / m.wall.max(1e-9)
            );
        }
        let _ = writeln!(md);
    }
    let _ = writeln!(md, "### repository size after the fourth run\n");
    let _ = writeln!(md, "| tool | MiB |\n|---|---:|");
    for (ti, t) in tools.iter().enumerate() {
        let _ = writeln!(md, "| {t} | {:.0} |", sizes[ti] as f64 / 1048576.0);
    }
    print!("{md}");
    std::io::stdout().flush()?;
    if let Some(o) = &args.output {
        std::fs::write(o, &md)?;
    }
    if !args.keep {
        std::fs::remove_dir_all(&work)?;
    }
    Ok(())
}
