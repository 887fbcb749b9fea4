//! The service that runs the daemon at login or boot: one definition
//! ([`Service`]) written as a systemd unit or a launchd property list.

use std::path::{Path, PathBuf};

use crate::config::ConfigError;
use crate::error::Error;

/// A service manager.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
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
    /// The configuration file the daemon reads; `None` leaves it to the
    /// daemon's default (the user's `~/.config/capsule/capsule.toml`), as
    /// a package's user unit must, being one file for every user.
    pub config: Option<PathBuf>,
    /// Restart this many seconds after a failure.
    pub restart_secs: u32,
    /// Boot (system) rather than login (user).
    pub system: bool,
}

/// The service's name (systemd).
pub const NAME: &str = "capsule";
/// The service's label (launchd).
pub const LABEL: &str = "org.capsule.daemon";

impl Service {
    /// The systemd unit.
    pub fn systemd_unit(&self) -> String {
        let (of, arg) = match &self.config {
            Some(c) => (systemd_quote(c), format!(" --config {}", systemd_quote(c))),
            None => ("~/.config/capsule/capsule.toml".to_string(), String::new()),
        };
        format!(
            "# Written by `capsule schedule install`; `capsule schedule remove` removes it.\n\
             [Unit]\n\
             Description=capsule backups (the profiles of {of})\n\
             Wants=network-online.target\n\
             After=network-online.target\n\
             \n\
             [Service]\n\
             Type=simple\n\
             ExecStart={exe}{arg} daemon\n\
             ExecReload=/bin/kill -HUP $MAINPID\n\
             Restart=on-failure\n\
             RestartSec={restart}\n\
             KillSignal=SIGTERM\n\
             TimeoutStopSec=30\n\
             \n\
             [Install]\n\
             WantedBy={wanted}\n",
            exe = systemd_quote(&self.exe),
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
        let config = match &self.config {
            Some(c) => format!(
                "\t\t<string>--config</string>\n\t\t<string>{}</string>\n",
                esc(c)
            ),
            None => String::new(),
        };
        // Beside the configuration; launchd needs a fixed path otherwise.
        let log = match &self.config {
            Some(c) => esc(&c.with_file_name("capsule-daemon.log")),
            None => "/tmp/capsule-daemon.log".to_string(),
        };
        format!(
            "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n\
             <!DOCTYPE plist PUBLIC \"-//Apple//DTD PLIST 1.0//EN\" \"http://www.apple.com/DTDs/PropertyList-1.0.dtd\">\n\
             <!-- Written by `capsule schedule install`; `capsule schedule remove` removes it. -->\n\
             <plist version=\"1.0\">\n\
             <dict>\n\
             \t<key>Label</key>\n\t<string>{LABEL}</string>\n\
             \t<key>ProgramArguments</key>\n\t<array>\n\
             \t\t<string>{exe}</string>\n{config}\t\t<string>daemon</string>\n\
             \t</array>\n\
             \t<key>RunAtLoad</key>\n\t<true/>\n\
             \t<key>KeepAlive</key>\n\t<dict>\n\t\t<key>SuccessfulExit</key>\n\t\t<false/>\n\t</dict>\n\
             \t<key>ThrottleInterval</key>\n\t<integer>{restart}</integer>\n\
             \t<key>ProcessType</key>\n\t<string>Background</string>\n\
             \t<key>StandardErrorPath</key>\n\t<string>{log}</string>\n\
             </dict>\n\
             </plist>\n",
            exe = esc(&self.exe),
            restart = self.restart_secs,
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
pub fn fit_for_a_service(what: &str, p: &Path) -> Result<(), ConfigError> {
    let bad = match p.to_str() {
        None => Some("bytes that are not UTF-8".to_string()),
        Some(s) => s
            .chars()
            .find(|c| c.is_control())
            .map(|c| format!("a control character ({c:?})")),
    };
    match bad {
        Some(why) => Err(ConfigError(format!(
            "{what} {:?} holds {why}, which a service file cannot carry: move it to a plain path",
            p.as_os_str()
        ))),
        None => Ok(()),
    }
}

/// The service file's path for manager `m`: in `dir`, else the manager's
/// directory for a system or a user service.
pub fn file(m: Manager, system: bool, dir: Option<&Path>) -> Result<PathBuf, Error> {
    let none = |what: &str| Error::Other(format!("no {what} directory"));
    let dir = match (dir, m, system) {
        (Some(d), _, _) => d.to_path_buf(),
        (None, Manager::Systemd, true) => PathBuf::from("/etc/systemd/system"),
        (None, Manager::Systemd, false) => dirs::config_dir()
            .ok_or_else(|| none("configuration"))?
            .join("systemd/user"),
        (None, Manager::Launchd, true) => PathBuf::from("/Library/LaunchDaemons"),
        (None, Manager::Launchd, false) => dirs::home_dir()
            .ok_or_else(|| none("home"))?
            .join("Library/LaunchAgents"),
    };
    Ok(dir.join(match m {
        Manager::Systemd => format!("{NAME}.service"),
        Manager::Launchd => format!("{LABEL}.plist"),
    }))
}

/// This system's service manager: launchd on macOS, systemd elsewhere.
pub fn this_system() -> Manager {
    if cfg!(target_os = "macos") {
        Manager::Launchd
    } else {
        Manager::Systemd
    }
}
