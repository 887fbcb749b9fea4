//! `capsule init`: create a repository.

use anyhow::Result;
use capsule_app::Settings;
use clap::Args;

use crate::exit;
use crate::output::{bytes, Output};
use capsule_engine::repo::InitOptions;

/// Arguments of `init`.
#[derive(Args, Debug)]
pub struct InitArgs {
    /// zstd level for new data (0 stores uncompressed; 1 is fastest; up to 19).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(i32).range(0..=19))]
    compression: i32,
    /// Target pack size in MiB.
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u32).range(4..=512))]
    pack_size_mib: u32,
    /// Most space the repository may take (500G, 1.5T): backups delete the
    /// oldest snapshots to stay within it (`capsule quota` changes it).
    #[arg(long, value_name = "SIZE", value_parser = capsule_app::config::parse_size)]
    quota: Option<u64>,
    /// Keep every object from deletion and overwrite for this long (30d,
    /// 4w, 1y) with S3 Object Lock: on a bucket made with object lock (init
    /// makes it so when it creates the bucket). Prune extends what is
    /// still in use and deletes what it retired once its date passes.
    #[arg(long, value_name = "PERIOD", value_parser = capsule_app::history::parse_days)]
    object_lock: Option<u32>,
    /// Who may lift a retention early: `governance` (credentials with
    /// s3:BypassGovernanceRetention, so an admin can undo a mistake) or
    /// `compliance` (nobody, not even the account's root).
    #[arg(long, value_enum, default_value_t = LockModeArg::Governance, requires = "object_lock")]
    lock_mode: LockModeArg,
    /// Cut files and name blobs as the repository REPO does (its chunk
    /// sizes and keyed chunker and IDs; a sealing key of its own), so that
    /// `capsule copy` between the two sends blobs as they are, without
    /// re-chunking, and they dedup against each other. REPO's password:
    /// CAPSULE_FROM_PASSWORD or CAPSULE_FROM_PASSWORD_FILE, else this one's.
    #[arg(long, value_name = "REPO")]
    copy_chunker_params_from: Option<String>,
}

/// `--lock-mode`.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
enum LockModeArg {
    Governance,
    Compliance,
}

pub fn init(settings: &Settings, out: &Output, a: InitArgs) -> Result<u8> {
    let loc = settings.location()?;
    let opts = InitOptions {
        compression: a.compression,
        pack_size: a.pack_size_mib << 20,
        ..InitOptions::default()
    };
    let access = settings.access(&loc)?;
    let what = "new repository password";
    let like = match &a.copy_chunker_params_from {
        Some(url) => {
            let pw = capsule_app::copy::password(settings, capsule_app::copy::Other::From)?;
            Some(capsule_app::copy::open(settings, url, &pw)?.repo)
        }
        None => None,
    };
    let repo = match a.object_lock {
        Some(days) => {
            let mode = match a.lock_mode {
                LockModeArg::Governance => capsule_backend::LockMode::Governance,
                LockModeArg::Compliance => capsule_backend::LockMode::Compliance,
            };
            let lock = capsule_app::history::LockRequest { mode, days };
            let repo = capsule_app::history::create_locked(
                settings,
                &access,
                what,
                &opts,
                lock,
                like.as_ref(),
            )?
            .repo;
            out.say(format!(
                "object lock: every object is kept from deletion and overwrite for {days} days ({} mode); prune extends what is in use",
                mode.s3_name().to_ascii_lowercase()
            ));
            repo
        }
        None => match &like {
            Some(like) => {
                capsule_app::copy::create_like(settings, &access, &opts, like, what)?.repo
            }
            None => capsule_app::open::create(settings, &access, what, &opts)?.repo,
        },
    };
    if let Some(url) = &a.copy_chunker_params_from {
        out.say(format!(
            "cuts files and names blobs as {url} does: `capsule copy` from it sends blobs as they are"
        ));
    }
    if let Some(q) = a.quota.filter(|q| *q > 0) {
        capsule_engine::quota::set(&repo, q, 3600)?;
        out.say(format!("quota {}", bytes(q)));
    }
    out.json(&serde_json::json!({
        "repository": loc.display(),
        "id": repo.config().id,
        "quota": a.quota,
        "object_lock_days": a.object_lock,
    }));
    out.say(format!(
        "created repository {} at {}",
        &repo.config().id[..8],
        loc.display()
    ));
    out.say("keep the password safe: without it the backups cannot be read");
    Ok(exit::OK)
}
