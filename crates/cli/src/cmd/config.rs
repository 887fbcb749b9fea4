//! `capsule config show | check`: the settings a command would use and
//! where each comes from; the configuration file checked.

use anyhow::Result;
use capsule_app::Settings;
use clap::Subcommand;

use crate::exit;
use crate::output::Output;

/// `capsule config` subcommands.
#[derive(Subcommand, Debug)]
pub enum ConfigCommand {
    /// Print the settings a command would use, with where each comes from
    /// (flag, environment, profile, default); secrets are masked.
    Show,
    /// Read and check the configuration file: exit 0 when it is usable,
    /// 2 with the file, line and key of the first mistake otherwise.
    Check,
}

/// `capsule config show | check`.
pub fn config(settings: &Settings, out: &Output, c: ConfigCommand) -> Result<u8> {
    let cfg = capsule_app::settings::load_config(settings.flags.config.as_deref())?;
    match c {
        ConfigCommand::Check => {
            let Some(cfg) = cfg else {
                let path =
                    capsule_app::config::config_path(None).map(|(p, _)| p.display().to_string());
                out.result(format!(
                    "no configuration file ({}): nothing to check",
                    path.unwrap_or_else(|| "no configuration directory".into())
                ));
                return Ok(exit::OK);
            };
            for w in &cfg.warnings {
                out.warn(w);
            }
            if let Some(name) = &settings.flags.profile {
                cfg.profile(name)?;
            }
            // Any profile of a file others may change that runs commands
            // or names secrets: the file is not fit to use.
            if let Some(e) = cfg
                .file
                .profiles
                .iter()
                .find_map(|(n, p)| cfg.refused(n, p))
            {
                return Err(e.into());
            }
            // What every run of a profile would refuse is a mistake now,
            // not at 3 a.m.: exclude patterns are compiled as a backup
            // compiles them.
            for (name, p) in &cfg.file.profiles {
                let keyed = p
                    .excludes
                    .iter()
                    .map(|x| ("excludes", x))
                    .chain(p.iexcludes.iter().map(|x| ("iexcludes", x)));
                for (key, pat) in keyed {
                    if let Err(e) = capsule_engine::backup::check_pattern(pat) {
                        return Err(capsule_app::UsageError(format!(
                            "{}: profile {name}: {key}: {e}; every backup of this profile would refuse it",
                            cfg.path.display()
                        ))
                        .into());
                    }
                }
            }
            if let Some(why) = &cfg.insecure {
                out.warn(format!(
                    "{}: {why}; another user could change what it backs up and where",
                    cfg.path.display()
                ));
            }
            out.json(&serde_json::json!({
                "ok": true,
                "file": cfg.path.display().to_string(),
                "profiles": cfg.file.profiles.keys().collect::<Vec<_>>(),
            }));
            out.result(format!(
                "{}: ok, {} profile(s): {}",
                cfg.path.display(),
                cfg.file.profiles.len(),
                cfg.file
                    .profiles
                    .keys()
                    .cloned()
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
            Ok(exit::OK)
        }
        ConfigCommand::Show => {
            let profile = match (&cfg, &settings.flags.profile) {
                (Some(cfg), Some(name)) => {
                    for w in &cfg.warnings {
                        out.warn(w);
                    }
                    Some(cfg.profile(name)?.clone())
                }
                _ => None,
            };
            let rows = capsule_app::explain::explain(settings, profile.as_ref());
            if out.json {
                let v: serde_json::Map<String, serde_json::Value> = rows
                    .iter()
                    .map(|(k, v, from)| {
                        (
                            k.to_string(),
                            serde_json::json!({ "value": v, "from": from }),
                        )
                    })
                    .collect();
                out.json(&serde_json::json!({
                    "file": cfg.as_ref().map(|c| c.path.display().to_string()),
                    "profile": settings.flags.profile,
                    "settings": v,
                }));
            } else {
                if let Some(c) = &cfg {
                    out.result(format!(
                        "# {}{}",
                        c.path.display(),
                        settings
                            .flags
                            .profile
                            .as_ref()
                            .map(|p| format!(", profile {p:?}"))
                            .unwrap_or_default()
                    ));
                }
                for (k, v, from) in rows {
                    out.result(format!("{k:<18} {v:<40} ({from})"));
                }
            }
            Ok(exit::OK)
        }
    }
}
