//! "Back up now": a profile's backup started on request (the page's
//! button), through the daemon when one runs the profile, so that the run
//! gets its held key and change journal and is one of its runs; else as a
//! child process of its own, as the daemon would start it. Either way the
//! run says how far it got ([`crate::status::Running`]) and records its
//! outcome, which is how its starter follows it.

use std::path::Path;

use crate::status;

/// How a backup asked for now was started.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Started {
    /// One was running already: that one is the answer.
    AlreadyRunning,
    /// The daemon was asked (it starts it within a moment).
    Daemon,
    /// A child process runs it.
    Process,
}

/// Starts a backup of `profile` now. `config` is the configuration file
/// named on the command line, if one was, for the child to read too.
pub fn backup_now(config: Option<&Path>, profile: &str) -> std::io::Result<Started> {
    if status::load_running(profile).is_some() {
        return Ok(Started::AlreadyRunning);
    }
    if let Some(d) = status::load_daemon_view(profile) {
        status::request_backup(profile)?;
        if let Some(pid) = rustix::process::Pid::from_raw(d.pid as i32) {
            if rustix::process::kill_process(pid, rustix::process::Signal::USR2).is_ok() {
                return Ok(Started::Daemon);
            }
        }
        // The daemon went away meanwhile: not asked after all.
        status::take_backup_request(profile);
    }
    let exe = std::env::current_exe()?;
    let mut cmd = std::process::Command::new(exe);
    if let Some(c) = config {
        cmd.arg("--config").arg(c);
    }
    // Its own profile's credentials, not those this process's profile set.
    for k in crate::settings::env_set_by_profile() {
        cmd.env_remove(k);
    }
    let mut child = cmd
        .args(["--profile", profile, "backup"])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()?;
    // Waited for, so it does not linger as a zombie (which would look
    // alive to whoever follows it by its process ID).
    std::thread::spawn(move || child.wait());
    Ok(Started::Process)
}
