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
}

pub fn init(settings: &Settings, out: &Output, a: InitArgs) -> Result<u8> {
    let loc = settings.location()?;
    let opts = InitOptions {
        compression: a.compression,
        pack_size: a.pack_size_mib << 20,
        ..InitOptions::default()
    };
    let access = settings.access(&loc)?;
    let repo = capsule_app::open::create(settings, &access, "new repository password", &opts)?.repo;
    if let Some(q) = a.quota.filter(|q| *q > 0) {
        capsule_engine::quota::set(&repo, q, 3600)?;
        out.say(format!("quota {}", bytes(q)));
    }
    out.json(&serde_json::json!({ "repository": loc.display(), "id": repo.config().id, "quota": a.quota }));
    out.say(format!(
        "created repository {} at {}",
        &repo.config().id[..8],
        loc.display()
    ));
    out.say("keep the password safe: without it the backups cannot be read");
    Ok(exit::OK)
}
