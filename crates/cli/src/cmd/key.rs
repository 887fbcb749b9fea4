//! `capsule key`: the passwords (key files) that open the repository.

use std::path::PathBuf;

use anyhow::{Context, Result};
use capsule_app::Settings;
use capsule_crypto::KdfParams;
use clap::Subcommand;

use crate::exit;
use crate::output::Output;
use crate::repo::open;

/// `key` subcommands.
#[derive(Subcommand, Debug)]
pub enum KeyCommand {
    /// Add another password.
    Add {
        /// Read the new password from this file instead of prompting.
        #[arg(long)]
        new_password_file: Option<PathBuf>,
    },
    /// List keys.
    List,
    /// Remove a key (not the one in use).
    Remove {
        /// Key ID or prefix.
        id: String,
    },
    /// Change the password in use (adds a new key, removes the old one).
    Passwd {
        /// Read the new password from this file instead of prompting.
        #[arg(long)]
        new_password_file: Option<PathBuf>,
    },
}

fn read_new_password(f: &Option<PathBuf>) -> Result<Vec<u8>> {
    match f {
        Some(f) => {
            let mut s = std::fs::read(f).with_context(|| format!("reading {}", f.display()))?;
            while matches!(s.last(), Some(b'\n' | b'\r')) {
                s.pop();
            }
            Ok(s)
        }
        None => Ok(capsule_app::password::prompt_new("new password")?),
    }
}

pub fn key(settings: &Settings, out: &Output, k: KeyCommand) -> Result<u8> {
    let (mut repo, loc) = open(settings, out)?;
    match k {
        KeyCommand::Add { new_password_file } => {
            let pw = read_new_password(&new_password_file)?;
            let id = repo.add_key(&pw, KdfParams::default())?;
            out.json(&serde_json::json!({ "added": id.to_hex() }));
            out.say(format!("added key {}", id.short()));
        }
        KeyCommand::List => {
            let keys = repo.list_keys()?;
            out.json(&keys);
            for k in &keys {
                let short: String = k.id.chars().take(8).collect();
                match &k.damaged {
                    None => out.result(format!(
                        "{} {:<10} {} {}@{}",
                        if k.current { "*" } else { " " },
                        short,
                        k.created,
                        k.username,
                        k.hostname
                    )),
                    Some(why) => out.result(format!("  {short:<10} DAMAGED: {why}")),
                }
            }
        }
        KeyCommand::Remove { id } => {
            let removed = repo.remove_key(&id)?;
            out.json(&serde_json::json!({ "removed": removed }));
            out.say(format!(
                "removed key {}",
                removed.chars().take(8).collect::<String>()
            ));
        }
        KeyCommand::Passwd { new_password_file } => {
            let pw = read_new_password(&new_password_file)?;
            let id = repo.change_password(&pw, KdfParams::default())?;
            settings.access(&loc)?.remember_key(&repo);
            out.json(&serde_json::json!({ "key": id.to_hex() }));
            out.say(format!("password changed (new key {})", id.short()));
        }
    }
    Ok(exit::OK)
}
