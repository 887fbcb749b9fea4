//! `capsule schedule install | remove | status`: a service that runs
//! `capsule daemon` at login (or boot, with `--system`), restarted when it
//! fails: a systemd unit on Linux, a launchd agent on macOS, both written
//! from one definition ([`Service`]).

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use clap::{Args, Subcommand, ValueEnum};

use crate::output::Output;
use crate::{exit, GlobalArgs};

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
    manager: Option<Manager>,
    /// Where to write the service file (default: the manager's directory,
    /// e.g. ~/.config/systemd/user).
    #[arg(long, value_name = "DIR")]
    dir: Option<PathBuf>,
    /// Write (or remove) the file only; do not ask the manager to start,
    /// stop or reload anything.
    #[arg(long)]
    no_start: bool,
}

/// A service manager.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Manager {
    /// systemd (Linux).
    Systemd,
    /// launchd (macOS).
    Launchd,
}

/// The one definition both files are written from.
pub struct Service {
    /// The capsule binary.
    pub exe: PathBuf,
    /// The configuration file the daemon reads.
    pub config: PathBuf,
    /// Restart this many seconds after a failure.
    pub restart_secs: u32,
    /// Boot (system) rather than login (user).
    pub system: bool,
}

const NAME: &str = "capsule";
const LABEL: &str = "org.capsule.daemon";

impl Service {
    /// The systemd unit.
    pub fn systemd_unit(&self) -> String {
        format!(
            "# Written by `capsule schedule install`; `capsule schedule remove` removes it.\n\
             [Unit]\n\
             Description=capsule backups (the profiles of {config})\n\
             Wants=network-online.target\n\
             After=network-online.target\n\
             \n\
             [Service]\n\
             Type=simple\n\
             ExecStart={exe} --config {config} daemon\n\
             ExecReload=/bin/kill -HUP $MAINPID\n\
             Restart=on-failure\n\
             RestartSec={restart}\n\
             KillSignal=SIGTERM\n\
             TimeoutStopSec=30\n\
             \n\
             [Install]\n\
             WantedBy={wanted}\n",
            exe = systemd_quote(&self.exe),
            config = systemd_quote(&self.config),
            restart = self.restart_secs,
            wanted = if self.system {
                "multi-user.target"
            } else {
                "default.target"
            },
        )
    }

    /// The launchd property list.
    pub fn launchd_plist(&self) -> String {
        let esc = |p: &Path| {
            p.display()
                .to_string()
                .replace('&', "&amp;")
                .replace('<', "&lt;")
                .replace('>', "&gt;")
        };
        format!(
            "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n\
             <!DOCTYPE plist PUBLIC \"-//Apple//DTD PLIST 1.0//EN\" \"http://www.apple.com/DTDs/PropertyList-1.0.dtd\">\n\
             <!-- Written by `capsule schedule install`; `capsule schedule remove` removes it. -->\n\
             <plist version=\"1.0\">\n\
             <dict>\n\
             \t<key>Label</key>\n\t<string>{LABEL}</string>\n\
             \t<key>ProgramArguments</key>\n\t<array>\n\
             \t\t<string>{exe}</string>\n\t\t<string>--config</string>\n\t\t<string>{config}</string>\n\t\t<string>daemon</string>\n\
             \t</array>\n\
             \t<key>RunAtLoad</key>\n\t<true/>\n\
             \t<key>KeepAlive</key>\n\t<dict>\n\t\t<key>SuccessfulExit</key>\n\t\t<false/>\n\t</dict>\n\
             \t<key>ThrottleInterval</key>\n\t<integer>{restart}</integer>\n\
             \t<key>ProcessType</key>\n\t<string>Background</string>\n\
             \t<key>StandardErrorPath</key>\n\t<string>{log}</string>\n\
             </dict>\n\
             </plist>\n",
            exe = esc(&self.exe),
            config = esc(&self.config),
            restart = self.restart_secs,
            log = esc(&self.config.with_file_name("capsule-daemon.log")),
        )
    }
}

/// A path as one systemd command-line word: quoted, with `\\` and `"`
/// escaped, and `%` (a specifier) and `$` (a variable) doubled, as
/// systemd.service(5) and systemd.unit(5) say. Paths with control
/// characters never get here ([`fit_for_a_service`]).
fn systemd_quote(p: &Path) -> String {
    let s = p.display().to_string();
    if s.chars()
        .all(|c| c.is_ascii_alphanumeric() || "/._-+".contains(c))
    {
        s
    } else {
        format!(
            "\"{}\"",
            s.replace('\\', "\\\\")
                .replace('"', "\\\"")
                .replace('%', "%%")
                .replace('$', "$$")
        )
    }
}

/// Refuses a path that a service file cannot carry as one word: a control
/// character (a newline would start a line of its own in a unit, and XML
/// has no way to write most of them), or bytes that are not UTF-8.
fn fit_for_a_service(what: &str, p: &Path) -> Result<()> {
    let bad = match p.to_str() {
        None => Some("bytes that are not UTF-8".to_string()),
        Some(s) => s
            .chars()
            .find(|c| c.is_control())
            .map(|c| format!("a control character ({c:?})")),
    };
    match bad {
        Some(why) => Err(crate::config::ConfigError(format!(
            "{what} {:?} holds {why}, which a service file cannot carry: move it to a plain path",
            p.as_os_str()
        ))
        .into()),
        None => Ok(()),
    }
}

fn manager(a: &ScheduleArgs) -> Manager {
    a.manager.unwrap_or(if cfg!(target_os = "macos") {
        Manager::Launchd
    } else {
        Manager::Systemd
    })
}

/// The service file's path.
fn file(a: &ScheduleArgs) -> Result<PathBuf> {
    let m = manager(a);
    let dir = match (&a.dir, m, a.system) {
        (Some(d), _, _) => d.clone(),
        (None, Manager::Systemd, true) => PathBuf::from("/etc/systemd/system"),
        (None, Manager::Systemd, false) => dirs::config_dir()
            .context("no configuration directory")?
            .join("systemd/user"),
        (None, Manager::Launchd, true) => PathBuf::from("/Library/LaunchDaemons"),
        (None, Manager::Launchd, false) => dirs::home_dir()
            .context("no home directory")?
            .join("Library/LaunchAgents"),
    };
    Ok(dir.join(match m {
        Manager::Systemd => format!("{NAME}.service"),
        Manager::Launchd => format!("{LABEL}.plist"),
    }))
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
pub fn schedule(g: &GlobalArgs, out: &Output, c: ScheduleCommand) -> Result<u8> {
    match c {
        ScheduleCommand::Install(a) => {
            let (config, _) = crate::config::config_path(g.config.as_deref())
                .context("no configuration directory: give --config")?;
            if !config.exists() {
                return Err(crate::config::ConfigError(format!(
                    "{}: no configuration file; the daemon runs its profiles (see README, \"Profiles\")",
                    config.display()
                ))
                .into());
            }
            // Checked now, not at the first scheduled run.
            crate::config::Config::load(&config)?;
            let svc = Service {
                exe: std::env::current_exe()?,
                config: std::fs::canonicalize(&config)?,
                restart_secs: 30,
                system: a.system,
            };
            fit_for_a_service("the configuration file", &svc.config)?;
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
