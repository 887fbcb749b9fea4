//! `capsule schedule install | remove | status`: a service that runs
//! `capsule daemon` at login (or boot, with `--system`), restarted when it
//! fails: a systemd unit on Linux, a launchd agent on macOS, both written
//! from one definition ([`Service`]).

use std::path::PathBuf;

use anyhow::{Context, Result};
use capsule_app::service::{self, fit_for_a_service, Manager, Service, LABEL};
use clap::{Args, Subcommand, ValueEnum};

use crate::exit;
use crate::output::Output;
use capsule_app::Settings;

/// `capsule schedule` subcommands.
#[derive(Subcommand, Debug)]
pub enum ScheduleCommand {
    /// Write the service and start it (the daemon then runs every profile
    /// with a schedule).
    Install(ScheduleArgs),
    /// Stop the service and remove it.
    Remove(ScheduleArgs),
    /// Say whether the service is installed and running.
    Status(ScheduleArgs),
    /// Print the service file `install` would write, writing nothing (the
    /// Debian package's units are made with it).
    Unit(UnitArgs),
}

/// What `schedule unit` prints.
#[derive(Args, Debug)]
pub struct UnitArgs {
    /// The system service (started at boot, as root).
    #[arg(long)]
    system: bool,
    /// Which service manager (default: this system's).
    #[arg(long, value_enum)]
    manager: Option<ManagerArg>,
    /// The capsule binary the service runs (default: this one).
    #[arg(long, value_name = "PATH")]
    exe: Option<PathBuf>,
    /// The configuration file the daemon reads (default: none given, so
    /// the daemon reads the user's own, `~/.config/capsule/capsule.toml`).
    #[arg(long = "daemon-config", value_name = "FILE")]
    daemon_config: Option<PathBuf>,
}

/// Where and how.
#[derive(Args, Debug)]
pub struct ScheduleArgs {
    /// A system service (started at boot, as root) instead of the user's
    /// (started at login).
    #[arg(long)]
    system: bool,
    /// Which service manager (default: this system's: systemd on Linux,
    /// launchd on macOS).
    #[arg(long, value_enum)]
    manager: Option<ManagerArg>,
    /// Where to write the service file (default: the manager's directory,
    /// e.g. ~/.config/systemd/user).
    #[arg(long, value_name = "DIR")]
    dir: Option<PathBuf>,
    /// Write (or remove) the file only; do not ask the manager to start,
    /// stop or reload anything.
    #[arg(long)]
    no_start: bool,
}

/// A service manager, as `--manager` names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ManagerArg {
    /// systemd (Linux).
    Systemd,
    /// launchd (macOS).
    Launchd,
}

fn manager(a: &ScheduleArgs) -> Manager {
    manager_of(a.manager)
}

fn manager_of(m: Option<ManagerArg>) -> Manager {
    match m {
        Some(ManagerArg::Systemd) => Manager::Systemd,
        Some(ManagerArg::Launchd) => Manager::Launchd,
        None => service::this_system(),
    }
}

/// The service file's path.
fn file(a: &ScheduleArgs) -> capsule_app::Result<PathBuf> {
    service::file(manager(a), a.system, a.dir.as_deref())
}

/// Runs a service manager command; its failure is reported, not fatal
/// (the file is in place; the user can run it).
fn manage(out: &Output, args: &[&str]) -> bool {
    match std::process::Command::new(args[0])
        .args(&args[1..])
        .output()
    {
        Ok(o) if o.status.success() => true,
        Ok(o) => {
            out.warn(format!(
                "`{}` failed: {}",
                args.join(" "),
                String::from_utf8_lossy(&o.stderr).trim()
            ));
            false
        }
        Err(e) => {
            out.warn(format!("`{}` could not run: {e}", args.join(" ")));
            false
        }
    }
}

fn systemctl<'a>(a: &ScheduleArgs, rest: &[&'a str]) -> Vec<&'a str> {
    let mut v = vec!["systemctl"];
    if !a.system {
        v.push("--user");
    }
    v.extend_from_slice(rest);
    v
}

/// `capsule schedule ...`.
pub fn schedule(settings: &Settings, out: &Output, c: ScheduleCommand) -> Result<u8> {
    match c {
        ScheduleCommand::Install(a) => {
            let (config, _) = capsule_app::config::config_path(settings.flags.config.as_deref())
                .context("no configuration directory: give --config")?;
            if !config.exists() {
                return Err(capsule_app::config::ConfigError(format!(
                    "{}: no configuration file; the daemon runs its profiles (see \"A profile\" in the user guide, book/src/getting-started.md)",
                    config.display()
                ))
                .into());
            }
            // Checked now, not at the first scheduled run.
            capsule_app::config::Config::load(&config)?;
            let config = std::fs::canonicalize(&config)?;
            fit_for_a_service("the configuration file", &config)?;
            let svc = Service {
                exe: std::env::current_exe()?,
                config: Some(config),
                restart_secs: 30,
                system: a.system,
            };
            fit_for_a_service("capsule's program file", &svc.exe)?;
            let path = file(&a)?;
            if let Some(d) = path.parent() {
                std::fs::create_dir_all(d).with_context(|| format!("creating {}", d.display()))?;
            }
            let text = match manager(&a) {
                Manager::Systemd => svc.systemd_unit(),
                Manager::Launchd => svc.launchd_plist(),
            };
            std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))?;
            out.result(format!("wrote {}", path.display()));
            if !a.no_start {
                let started = match manager(&a) {
                    Manager::Systemd => {
                        manage(out, &systemctl(&a, &["daemon-reload"]))
                            && manage(out, &systemctl(&a, &["enable", "--now", "capsule.service"]))
                    }
                    Manager::Launchd => manage(
                        out,
                        &["launchctl", "load", "-w", &path.display().to_string()],
                    ),
                };
                if !started {
                    let run = match manager(&a) {
                        Manager::Systemd => {
                            systemctl(&a, &["enable", "--now", "capsule.service"]).join(" ")
                        }
                        Manager::Launchd => format!("launchctl load -w {}", path.display()),
                    };
                    out.warn(format!(
                        "the service file is in place, but the manager did not start it (see above): once it can, run `{run}`"
                    ));
                    return Ok(exit::ERROR);
                }
                out.result("the daemon is running and starts at login (boot, with --system)");
            }
            Ok(exit::OK)
        }
        ScheduleCommand::Unit(a) => {
            let svc = Service {
                exe: match a.exe {
                    Some(e) => e,
                    None => std::env::current_exe()?,
                },
                config: a.daemon_config,
                restart_secs: 30,
                system: a.system,
            };
            fit_for_a_service("capsule's program file", &svc.exe)?;
            if let Some(c) = &svc.config {
                fit_for_a_service("the configuration file", c)?;
            }
            print!(
                "{}",
                match manager_of(a.manager) {
                    Manager::Systemd => svc.systemd_unit(),
                    Manager::Launchd => svc.launchd_plist(),
                }
            );
            Ok(exit::OK)
        }
        ScheduleCommand::Remove(a) => {
            let path = file(&a)?;
            if !a.no_start && path.exists() {
                match manager(&a) {
                    Manager::Systemd => {
                        manage(
                            out,
                            &systemctl(&a, &["disable", "--now", "capsule.service"]),
                        );
                    }
                    Manager::Launchd => {
                        manage(
                            out,
                            &["launchctl", "unload", "-w", &path.display().to_string()],
                        );
                    }
                }
            }
            match std::fs::remove_file(&path) {
                Ok(()) => out.result(format!("removed {}", path.display())),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    out.result(format!("not installed ({} does not exist)", path.display()))
                }
                Err(e) => return Err(e).with_context(|| format!("removing {}", path.display())),
            }
            if !a.no_start && manager(&a) == Manager::Systemd {
                manage(out, &systemctl(&a, &["daemon-reload"]));
            }
            Ok(exit::OK)
        }
        ScheduleCommand::Status(a) => {
            let path = file(&a)?;
            let installed = path.exists();
            let running = match manager(&a) {
                // is-active prints the state (active, inactive, failed,
                // activating...); anything else means it could not ask.
                Manager::Systemd => std::process::Command::new("systemctl")
                    .args(
                        systemctl(&a, &["is-active", "capsule.service"])
                            .get(1..)
                            .unwrap_or(&[]),
                    )
                    .output()
                    .ok()
                    .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
                    .filter(|s| {
                        [
                            "active",
                            "inactive",
                            "failed",
                            "activating",
                            "deactivating",
                            "reloading",
                        ]
                        .contains(&s.as_str())
                    }),
                Manager::Launchd => std::process::Command::new("launchctl")
                    .args(["list", LABEL])
                    .output()
                    .ok()
                    .map(|o| {
                        if o.status.success() {
                            "active".into()
                        } else {
                            "inactive".into()
                        }
                    }),
            };
            out.json(&serde_json::json!({
                "file": path.display().to_string(),
                "installed": installed,
                "state": running,
            }));
            out.result(format!(
                "{}: {}; the manager says: {}",
                path.display(),
                if installed {
                    "installed"
                } else {
                    "not installed"
                },
                running
                    .as_deref()
                    .unwrap_or("unknown (it could not be asked)")
            ));
            Ok(exit::OK)
        }
    }
}
