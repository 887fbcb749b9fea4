//! The `capsule` command line: parses arguments, has the application
//! layer resolve the settings once, dispatches to one module per command
//! (`cmd/`), and maps outcomes to exit codes. Everything of substance
//! lives in the library crates: `capsule-app` (profiles, settings, run
//! records, the daemon), `capsule-access` and `capsule-engine`.

mod args;
mod cmd;
mod excludes;
mod exit;
mod filter;
mod keep;
mod output;
mod repo;
mod stream;

use std::process::ExitCode;

use clap::{CommandFactory, Parser, Subcommand};

use args::GlobalArgs;

/// Fast, encrypted, deduplicated backups to local and network storage.
#[derive(Parser, Debug)]
#[command(name = "capsule", version, about, long_about = None, max_term_width = 100)]
pub struct Cli {
    #[command(flatten)]
    global: GlobalArgs,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Create a new repository.
    Init(cmd::init::InitArgs),
    /// Back up files and directories into a new snapshot.
    Backup(cmd::backup::BackupArgs),
    /// List snapshots.
    Snapshots(cmd::snapshots::SnapshotsArgs),
    /// Add, remove or set tags of snapshots (only the snapshot objects are
    /// rewritten).
    Tag(cmd::snapshots::TagArgs),
    /// List the files in a snapshot.
    Ls(cmd::snapshots::LsArgs),
    /// Forget snapshots, by ID or by a retention policy (their data stays
    /// until a prune; `unforget` brings them back until then).
    Forget(Box<cmd::forget::ForgetArgs>),
    /// Copy snapshots into another repository (the NAS's to S3, say),
    /// sending only the blobs it lacks.
    Copy(Box<cmd::copy::CopyArgs>),
    /// Write snapshots again without paths backed up by mistake (a secret,
    /// a huge file); the next prune gives their space back.
    Rewrite(cmd::rewrite::RewriteArgs),
    /// Bring back forgotten snapshots.
    Unforget(cmd::forget::UnforgetArgs),
    /// Give back the space of data no snapshot uses (safe while backups run).
    Prune(cmd::forget::PruneArgs),
    /// Set, show or enforce the repository's quota.
    #[command(subcommand)]
    Quota(cmd::quota::QuotaCommand),
    /// Restore a snapshot (or part of it) into a directory.
    Restore(cmd::restore::RestoreArgs),
    /// Write a file of a snapshot to standard output (or --target), or a
    /// directory as a tar stream.
    Dump(cmd::dump::DumpArgs),
    /// Find files and directories by name or path pattern across
    /// snapshots, with their versions.
    Find(cmd::find::FindArgs),
    /// Show the distinct versions of a file or directory across snapshots.
    Versions(cmd::restore::VersionsArgs),
    /// Show the snapshots as a read-only file system (FUSE) until Ctrl-C.
    Mount(cmd::mount::MountArgs),
    /// Serve a local web page to browse snapshots, versions and diffs, and to
    /// download and restore, until Ctrl-C.
    Ui(cmd::ui::UiArgs),
    /// Print or install shell completions (bash, zsh, fish) and man pages.
    Completions(cmd::completions::CompletionsArgs),
    /// Verify the repository's integrity.
    Check(cmd::check::CheckArgs),
    /// Show what changed between two snapshots.
    Diff(cmd::diff::DiffArgs),
    /// Show repository statistics.
    Stats,
    /// Manage the passwords (key files) that open the repository.
    #[command(subcommand)]
    Key(cmd::key::KeyCommand),
    /// Repair a damaged repository (what `check` recommends).
    #[command(subcommand)]
    Repair(cmd::check::RepairCommand),
    /// Measure a destination: round trips, throughput, small files, forced
    /// sync, free space; back up a seed tree and copy files one by one.
    Lab(cmd::lab::LabArgs),
    /// Predict the initial backup and an hourly run of a source to a
    /// destination, for capsule and for per-file copying.
    Estimate(cmd::lab::EstimateArgs),
    /// Show a recorded backup or lab run; write it as HTML or SVG charts.
    Report(cmd::lab::ReportArgs),
    /// Show or check the configuration file and its profiles.
    #[command(subcommand)]
    Config(cmd::config::ConfigCommand),
    /// Per profile: the last run, the last successful backup, staleness
    /// (exit 20 when a profile is stale, 21 when a last run failed), from
    /// this machine's records only.
    Status(cmd::status::StatusArgs),
    /// Run the profiles' backups, forget, prune and check on their
    /// schedules, in the foreground (as a service manager expects).
    Daemon(cmd::daemon::DaemonArgs),
    /// Install, remove or inspect the service (systemd, launchd) that runs
    /// the daemon at login or boot.
    #[command(subcommand)]
    Schedule(cmd::schedule::ScheduleCommand),
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
///
/// Prune holds one large structure (the used blobs, 8 bytes each) beside
/// buffers that come and go (trees, whole packs to repack, marks): with
/// the sliding threshold those buffers landed in the heap, and what they
/// left freed there counted against the peak. A prune of a 10-million-blob
/// repository after forgetting a tenth peaked at 208 MiB, of which 118 MiB
/// was ever in use at once; with every buffer of 1 MiB or more mapped on
/// its own (and so unmapped when freed), 122 MiB.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[allow(unsafe_code)]
fn tune_allocator(command: &Command) {
    // SAFETY: mallopt only changes allocator parameters; it is called once,
    // before any other thread exists.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 2);
        match command {
            Command::Restore(_) => {
                libc::mallopt(libc::M_MMAP_THRESHOLD, 32 << 20);
                libc::mallopt(libc::M_TRIM_THRESHOLD, 64 << 20);
            }
            // `forget --prune` runs the same prune in this process.
            Command::Prune(_) => {
                libc::mallopt(libc::M_MMAP_THRESHOLD, 1 << 20);
            }
            Command::Forget(a) if a.prune => {
                libc::mallopt(libc::M_MMAP_THRESHOLD, 1 << 20);
            }
            _ => {}
        }
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn tune_allocator(_command: &Command) {}

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
    capsule_app::STARTED.get_or_init(std::time::Instant::now);
    private_umask();
    let cli = Cli::parse();
    tune_allocator(&cli.command);
    let mut out = output::Output::new(cli.global.json, cli.global.quiet);
    out.config = cli.global.config.clone();
    if let Some(why) = capsule_engine::timefmt::test_clock_error() {
        out.error(&anyhow::anyhow!(why));
        return ExitCode::from(exit::USAGE);
    }
    if let Command::Completions(a) = cli.command {
        return finish(
            &out,
            cmd::completions::completions(&Cli::command(), &out, a),
        );
    }
    // The settings, resolved once, before anything is connected. `config
    // check` reads the file itself (its mistakes are its result).
    let settings = if matches!(
        cli.command,
        Command::Config(cmd::config::ConfigCommand::Check)
    ) {
        capsule_app::Settings::without_profile(cli.global.flags())
    } else {
        // A command on one repository may take the configuration's
        // default profile; those over every profile do not.
        let resolve = if matches!(
            cli.command,
            Command::Status(_) | Command::Daemon(_) | Command::Schedule(_) | Command::Config(_)
        ) {
            capsule_app::Settings::resolve
        } else {
            capsule_app::Settings::resolve_one
        };
        match resolve(cli.global.flags()) {
            Ok(r) => {
                for w in &r.warnings {
                    out.warn(w);
                }
                r.settings
            }
            Err(e) => return finish(&out, Err(e.into())),
        }
    };
    let s = &settings;
    let result = match cli.command {
        Command::Config(c) => cmd::config::config(s, &out, c),
        Command::Init(a) => cmd::init::init(s, &out, a),
        Command::Backup(a) => cmd::backup::run(s, &out, a),
        Command::Status(a) => cmd::status::status(s, &out, a),
        Command::Daemon(a) => cmd::daemon::daemon(s, &out, a),
        Command::Schedule(c) => cmd::schedule::schedule(s, &out, c),
        Command::Snapshots(a) => cmd::snapshots::snapshots(s, &out, a),
        Command::Forget(a) => cmd::forget::forget(s, &out, *a),
        Command::Copy(a) => cmd::copy::copy(s, &out, *a),
        Command::Rewrite(a) => cmd::rewrite::rewrite(s, &out, a),
        Command::Unforget(a) => cmd::forget::unforget(s, &out, a),
        Command::Prune(a) => cmd::forget::prune(s, &out, a),
        Command::Quota(q) => cmd::quota::quota(s, &out, q),
        Command::Tag(a) => cmd::snapshots::tag(s, &out, a),
        Command::Ls(a) => cmd::snapshots::ls(s, &out, a),
        Command::Restore(a) => cmd::restore::restore(s, &out, a),
        Command::Dump(a) => cmd::dump::dump(s, &out, a),
        Command::Find(a) => cmd::find::find(s, &out, a),
        Command::Versions(a) => cmd::restore::versions(s, &out, a),
        Command::Mount(a) => cmd::mount::mount(s, &out, a),
        Command::Ui(a) => cmd::ui::ui(s, &out, a),
        Command::Completions(_) => unreachable!("answered above"),
        Command::Check(a) => cmd::check::run(s, &out, a),
        Command::Diff(a) => cmd::diff::diff(s, &out, a),
        Command::Stats => cmd::diff::stats(s, &out),
        Command::Key(k) => cmd::key::key(s, &out, k),
        Command::Repair(r) => cmd::check::repair(s, &out, r),
        Command::Lab(a) => cmd::lab::lab(s, &out, a),
        Command::Estimate(a) => cmd::lab::estimate(s, &out, a),
        Command::Report(a) => cmd::lab::report(s, &out, a),
    };
    // A trace that could not be written whole (a full disk, /dev/full)
    // must not pass for a complete one.
    if let (Some(path), Ok(Some(t))) = (&s.flags.trace_requests, s.trace()) {
        if let Some(e) = t.error() {
            out.warn(format!(
                "the request trace {} is incomplete: writing it failed ({e}), and it stops there",
                path.display()
            ));
        }
    }
    if std::env::var_os(capsule_access::stack::KILL_AT_CALL).is_some() {
        if let Some(st) = capsule_app::open::destination_stats() {
            eprintln!("capsule-test: {} destination requests", st.requests());
        }
    }
    finish(&out, result)
}

/// The exit code of `result`, with its error printed.
fn finish(out: &output::Output, result: anyhow::Result<u8>) -> ExitCode {
    match result {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            let code = output::exit_code_for(&e);
            out.error(&e);
            ExitCode::from(code)
        }
    }
}
