//! The `capsule` command line: parses arguments, resolves settings (repository,
//! password, output mode), calls the engine, and maps outcomes to exit codes.
//! Everything of substance lives in `capsule-engine`.

mod commands;
mod completions;
mod conditions;
mod config;
mod config_cmd;
mod daemon;
mod forget_cmd;
mod held_key;
mod journal;
mod lab_cmd;
mod mount_cmd;
mod output;
mod schedule_cmd;
mod settings;
mod status_cmd;
mod ui_cmd;

use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};

/// Exit codes (documented in the README).
pub mod exit {
    /// Success.
    pub const OK: u8 = 0;
    /// A fatal error (I/O, storage, bug).
    pub const ERROR: u8 = 1;
    /// Bad usage (clap also uses 2).
    pub const USAGE: u8 = 2;
    /// Finished, but some entries were skipped: the snapshot (or restore) is incomplete.
    pub const INCOMPLETE: u8 = 3;
    /// Wrong or missing password.
    pub const PASSWORD: u8 = 10;
    /// No repository at the location, or one already exists for `init`.
    pub const REPOSITORY: u8 = 11;
    /// `check` found damage.
    pub const DAMAGED: u8 = 12;
    /// Snapshot or path not found.
    pub const NOT_FOUND: u8 = 13;
    /// The destination cannot be reached or stopped answering.
    pub const UNREACHABLE: u8 = 14;
    /// The destination refused the credentials, the host key did not match,
    /// or access was denied.
    pub const ACCESS: u8 = 15;
    /// The destination is full.
    pub const FULL: u8 = 16;
    /// The share, bucket or base directory does not exist.
    pub const NO_CONTAINER: u8 = 17;
    /// A retention policy would remove every snapshot of a group, and
    /// `--allow-empty` was not given.
    pub const KEEPS_NOTHING: u8 = 18;
    /// A quota cannot hold the snapshots that must stay.
    pub const QUOTA_TOO_SMALL: u8 = 19;
    /// `status`: a profile's backups have gone stale (no success within
    /// its `stale-after`, twice its interval by default, or never).
    pub const STALE: u8 = 20;
    /// `status`: nothing is stale, but a profile's last run failed.
    pub const FAILING: u8 = 21;
    /// Another run of the profile holds its lock (a backup), or another
    /// daemon runs the profile: nothing was done.
    pub const BUSY: u8 = 22;
    /// Interrupted by a signal.
    pub const INTERRUPTED: u8 = 130;
}

/// Fast, encrypted, deduplicated backups to local and network storage.
#[derive(Parser, Debug)]
#[command(name = "capsule", version, about, long_about = None, max_term_width = 100)]
pub struct Cli {
    #[command(flatten)]
    global: GlobalArgs,
    #[command(subcommand)]
    command: Command,
}

/// Options every command takes.
#[derive(Args, Debug, Clone)]
pub struct GlobalArgs {
    /// Repository location: a directory, smb://user@host:port/share/path,
    /// sftp://user@host:port/path, s3://host:port/bucket/prefix (ports optional) or
    /// s3+http://… (default: a repository in your data directory, e.g.
    /// ~/.local/share/capsule/repo). Credentials: CAPSULE_SMB_PASSWORD or _FILE,
    /// CAPSULE_SFTP_KEY, CAPSULE_SFTP_PASSWORD or _FILE, CAPSULE_SFTP_KNOWN_HOSTS,
    /// AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY or ~/.aws/credentials.
    #[arg(short = 'r', long, env = "CAPSULE_REPO", global = true)]
    repo: Option<String>,
    /// Read the password from this file (it wins over CAPSULE_PASSWORD).
    #[arg(long, env = "CAPSULE_PASSWORD_FILE", global = true)]
    password_file: Option<std::path::PathBuf>,
    /// Print machine-readable JSON on stdout.
    #[arg(long, global = true)]
    json: bool,
    /// Print only errors and warnings.
    #[arg(short, long, global = true)]
    quiet: bool,
    /// Do not use the local cache of index files, snapshots and trees.
    #[arg(long, global = true)]
    no_cache: bool,
    /// Cache directory (default: the user cache directory, per repository).
    #[arg(long, env = "CAPSULE_CACHE_DIR", global = true)]
    cache_dir: Option<std::path::PathBuf>,
    /// Do not fsync objects on the local backend (faster on shares that
    /// force synchronous writes; a power cut may lose the newest backup).
    #[arg(long, global = true, conflicts_with = "sync")]
    no_fsync: bool,
    /// Fsync every object on the local backend before it counts as stored
    /// (the default; say it explicitly in scripts for mounted shares).
    #[arg(long, global = true)]
    sync: bool,
    /// Requests in flight to a network destination (default 8).
    #[arg(long, env = "CAPSULE_CONNECTIONS", global = true, value_name = "N",
          value_parser = clap::value_parser!(u32).range(1..=256))]
    connections: Option<u32>,
    /// Write a line per request to the destination into FILE (tab-separated:
    /// start and duration in seconds, operation, bytes, result, object), to
    /// see where a slow run waits.
    #[arg(long, global = true, value_name = "FILE")]
    trace_requests: Option<std::path::PathBuf>,
    /// Configuration file (default: capsule.toml in your configuration
    /// directory, e.g. ~/.config/capsule/capsule.toml).
    #[arg(long, env = config::CONFIG_ENV, global = true, value_name = "FILE")]
    config: Option<std::path::PathBuf>,
    /// Take settings from this profile of the configuration file. A flag or
    /// an environment variable wins over the profile, the profile over
    /// capsule's default; lists (excludes, tags) add up.
    #[arg(long, env = "CAPSULE_PROFILE", global = true, value_name = "NAME")]
    profile: Option<String>,
    /// The profile's settings, once read (see `config::apply`).
    #[arg(skip)]
    profile_settings: Option<config::Profile>,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Create a new repository.
    Init(commands::InitArgs),
    /// Back up files and directories into a new snapshot.
    Backup(commands::BackupArgs),
    /// List snapshots.
    Snapshots(commands::SnapshotsArgs),
    /// List the files in a snapshot.
    Ls(commands::LsArgs),
    /// Forget snapshots, by ID or by a retention policy (their data stays
    /// until a prune; `unforget` brings them back until then).
    Forget(Box<forget_cmd::ForgetArgs>),
    /// Bring back forgotten snapshots.
    Unforget(forget_cmd::UnforgetArgs),
    /// Give back the space of data no snapshot uses (safe while backups run).
    Prune(forget_cmd::PruneArgs),
    /// Set, show or enforce the repository's quota.
    #[command(subcommand)]
    Quota(forget_cmd::QuotaCommand),
    /// Restore a snapshot (or part of it) into a directory.
    Restore(commands::RestoreArgs),
    /// Show the distinct versions of a file or directory across snapshots.
    Versions(commands::VersionsArgs),
    /// Show the snapshots as a read-only file system (FUSE) until Ctrl-C.
    Mount(mount_cmd::MountArgs),
    /// Serve a local web page to browse snapshots, versions and diffs, and to
    /// download and restore, until Ctrl-C.
    Ui(ui_cmd::UiArgs),
    /// Print or install shell completions (bash, zsh, fish) and man pages.
    Completions(completions::CompletionsArgs),
    /// Verify the repository's integrity.
    Check(commands::CheckArgs),
    /// Show what changed between two snapshots.
    Diff(commands::DiffArgs),
    /// Show repository statistics.
    Stats,
    /// Manage the passwords (key files) that open the repository.
    #[command(subcommand)]
    Key(commands::KeyCommand),
    /// Repair a damaged repository (what `check` recommends).
    #[command(subcommand)]
    Repair(commands::RepairCommand),
    /// Measure a destination: round trips, throughput, small files, forced
    /// sync, free space; back up a seed tree and copy files one by one.
    Lab(lab_cmd::LabArgs),
    /// Predict the initial backup and an hourly run of a source to a
    /// destination, for capsule and for per-file copying.
    Estimate(lab_cmd::EstimateArgs),
    /// Show a recorded backup or lab run; write it as HTML or SVG charts.
    Report(lab_cmd::ReportArgs),
    /// Show or check the configuration file and its profiles.
    #[command(subcommand)]
    Config(config_cmd::ConfigCommand),
    /// Per profile: the last run, the last successful backup, staleness
    /// (exit 20 when a profile is stale, 21 when a last run failed), from
    /// this machine's records only.
    Status(status_cmd::StatusArgs),
    /// Run the profiles' backups, forget, prune and check on their
    /// schedules, in the foreground (as a service manager expects).
    Daemon(daemon::DaemonArgs),
    /// Install, remove or inspect the service (systemd, launchd) that runs
    /// the daemon at login or boot.
    #[command(subcommand)]
    Schedule(schedule_cmd::ScheduleCommand),
}

/// glibc's allocator, tuned for this pipeline: at most two malloc arenas
/// and glibc's own sliding mmap threshold; for a restore, buffers up to
/// 32 MiB from the heap, and a heap that keeps up to 64 MiB free before it
/// gives memory back.
///
/// Until packs spilled to temporary files (issue 13), 16 MiB pack buffers
/// freed to the heap stayed resident, so the threshold was fixed at 1 MiB:
/// every large buffer was then a fresh mapping, faulted in page by page,
/// zeroed, and unmapped on free. With packs out of memory, that policy cost
/// more than it saved: the kernel time of faulting 4 MiB read buffers and
/// ~1 MiB blob buffers was half of a restore's CPU. Measured on 605 MB
/// (6,000 × 50 KiB, 2 × 150 MiB), two runs each, wall seconds and peak RSS:
/// local backup 2.1–2.3 → 1.5 s, local restore 1.2–1.5 → 0.9–1.0 s, SMB
/// restore 3.7–4.1 → 1.9 s, S3 restore 2.5–2.8 → 1.8–2.0 s; RSS 72 MiB
/// locally either way, SMB 76–85 → 87–126 MiB, S3 backup 83–98 → 104–110.
/// The sliding threshold alone, with glibc's default of 8 arenas per core,
/// kept freed buffers in up to 16 arenas (SMB restore 151 MiB); two arenas
/// share them, and on this project's 2-core machines cost no measurable
/// lock contention.
///
/// The sliding threshold still shrinks the heap whenever its free top
/// passes twice the threshold, so a restore's receive buffers were faulted
/// in again and again: an SMB restore of the Rust toolchain (52,000 files,
/// 1.2 GB, capsule on one core and the servers on the other) took
/// 180,000–290,000 minor faults. Fixed thresholds (mmap at 32 MiB, glibc's
/// ceiling; trim at 64 MiB) cut that to 60,000–72,000 and the restore from
/// 5.0–5.3 s to 4.7–4.8 s, with peak RSS 116–132 MiB against 103–116.
/// Backups keep the sliding threshold: with the fixed one, an S3 backup of
/// 4 × 128 MiB peaked at 108–137 MiB against 91–101, past their 100 MiB
/// bound, for no measurable gain.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[allow(unsafe_code)]
fn tune_allocator(restore: bool) {
    // SAFETY: mallopt only changes allocator parameters; it is called once,
    // before any other thread exists.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 2);
        if restore {
            libc::mallopt(libc::M_MMAP_THRESHOLD, 32 << 20);
            libc::mallopt(libc::M_TRIM_THRESHOLD, 64 << 20);
        }
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn tune_allocator(_restore: bool) {}

/// When the process started: run records count from here.
pub static STARTED: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();

/// Makes everything capsule creates private to the user: the cache and run
/// records name the paths backed up, and a local repository holds the key
/// files. Restore is unaffected: it sets each entry's recorded mode.
#[allow(unsafe_code)]
fn private_umask() {
    // SAFETY: umask only changes this process's file-creation mask; it is
    // called once, before any other thread exists.
    unsafe {
        libc::umask(0o077);
    }
}

fn main() -> ExitCode {
    STARTED.get_or_init(std::time::Instant::now);
    private_umask();
    let mut cli = Cli::parse();
    tune_allocator(matches!(cli.command, Command::Restore(_)));
    let out = output::Output::new(cli.global.json, cli.global.quiet);
    if let Some(why) = capsule_engine::timefmt::test_clock_error() {
        out.error(&anyhow::anyhow!(why));
        return ExitCode::from(exit::USAGE);
    }
    if let Command::Completions(a) = cli.command {
        return match completions::completions(&out, a) {
            Ok(code) => ExitCode::from(code),
            Err(e) => {
                out.error(&e);
                ExitCode::from(output::exit_code_for(&e))
            }
        };
    }
    // `config check` reads the file itself (its mistakes are its result).
    if !matches!(
        cli.command,
        Command::Config(config_cmd::ConfigCommand::Check)
    ) {
        if let Err(e) = config_cmd::apply_profile(&mut cli.global, &out) {
            let code = output::exit_code_for(&e);
            out.error(&e);
            return ExitCode::from(code);
        }
    }
    let result = match cli.command {
        Command::Config(c) => config_cmd::config(&cli.global, &out, c),
        Command::Init(a) => commands::init(&cli.global, &out, a),
        Command::Backup(a) => {
            let started = capsule_engine::timefmt::now_precise();
            let t = std::time::Instant::now();
            // A profile's backups never overlap, across processes: the lock
            // goes with this process, however it ends.
            let lock = match &cli.global.profile {
                Some(name) => daemon::ProfileLock::acquire(name, "run"),
                None => Ok(None),
            };
            if let Err(e) = lock {
                out.error(&e);
                return ExitCode::from(exit::BUSY);
            }
            let r = commands::backup(&cli.global, &out, a);
            if let Some(name) = &cli.global.profile {
                status_cmd::record(
                    name,
                    status_cmd::outcome(started.0, t.elapsed().as_secs_f64(), &r),
                );
            }
            r.map(|(code, _)| code)
        }
        Command::Status(a) => status_cmd::status(&cli.global, &out, a),
        Command::Daemon(a) => daemon::daemon(&cli.global, &out, a),
        Command::Schedule(c) => schedule_cmd::schedule(&cli.global, &out, c),
        Command::Snapshots(a) => commands::snapshots(&cli.global, &out, a),
        Command::Forget(a) => forget_cmd::forget(&cli.global, &out, *a),
        Command::Unforget(a) => forget_cmd::unforget(&cli.global, &out, a),
        Command::Prune(a) => forget_cmd::prune(&cli.global, &out, a),
        Command::Quota(q) => forget_cmd::quota(&cli.global, &out, q),
        Command::Ls(a) => commands::ls(&cli.global, &out, a),
        Command::Restore(a) => commands::restore(&cli.global, &out, a),
        Command::Versions(a) => commands::versions(&cli.global, &out, a),
        Command::Mount(a) => mount_cmd::mount(&cli.global, &out, a),
        Command::Ui(a) => ui_cmd::ui(&cli.global, &out, a),
        Command::Completions(_) => unreachable!("answered above"),
        Command::Check(a) => {
            let started = capsule_engine::timefmt::now_unix();
            let read_data = a.read_data;
            let r = commands::check(&cli.global, &out, a);
            if let Some(name) = &cli.global.profile {
                status_cmd::record_check(
                    name,
                    status_cmd::CheckOutcome {
                        started_unix: started,
                        read_data,
                        result: match &r {
                            Ok(0) => "ok",
                            Ok(_) => "damaged",
                            Err(_) => "failed",
                        }
                        .into(),
                        error: r
                            .as_ref()
                            .err()
                            .map(|e| format!("{e:#}").lines().next().unwrap_or("").to_string()),
                    },
                );
            }
            r
        }
        Command::Diff(a) => commands::diff(&cli.global, &out, a),
        Command::Stats => commands::stats(&cli.global, &out),
        Command::Key(k) => commands::key(&cli.global, &out, k),
        Command::Repair(r) => commands::repair(&cli.global, &out, r),
        Command::Lab(a) => lab_cmd::lab(&cli.global, &out, a),
        Command::Estimate(a) => lab_cmd::estimate(&cli.global, &out, a),
        Command::Report(a) => lab_cmd::report(&cli.global, &out, a),
    };
    // A trace that could not be written whole (a full disk, /dev/full)
    // must not pass for a complete one.
    if let (Some(path), Ok(Some(t))) = (
        &cli.global.trace_requests,
        settings::trace(&cli.global).map_err(|_| ()),
    ) {
        if let Some(e) = t.error() {
            out.warn(format!(
                "the request trace {} is incomplete: writing it failed ({e}), and it stops there",
                path.display()
            ));
        }
    }
    if std::env::var_os(capsule_access::stack::KILL_AT_CALL).is_some() {
        if let Some(s) = settings::destination_stats() {
            eprintln!("capsule-test: {} destination requests", s.requests());
        }
    }
    match result {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            let code = output::exit_code_for(&e);
            out.error(&e);
            ExitCode::from(code)
        }
    }
}
