//! Running the system's own snapshot tools (btrfs-progs, LVM, ZFS): they
//! know their file systems' rules better than a copy of their ioctls
//! would, and say what went wrong in words their users know.

use std::process::Command;

use crate::SnapError;

/// A command, and the package that provides it.
#[derive(Clone, Copy)]
pub(crate) struct Tool {
    pub(crate) name: &'static str,
    pub(crate) package: &'static str,
}

impl Tool {
    /// Runs the tool with `args`; its standard output when it succeeds.
    pub(crate) fn run(&self, doing: &str, args: &[&str]) -> Result<String, SnapError> {
        let out = Command::new(self.name)
            .args(args)
            .env("LC_ALL", "C")
            // LVM warns about inherited descriptors on every call.
            .env("LVM_SUPPRESS_FD_WARNINGS", "1")
            .stdin(std::process::Stdio::null())
            .output()
            .map_err(|e| match e.kind() {
                std::io::ErrorKind::NotFound => SnapError::NoTool {
                    tool: self.name,
                    package: self.package,
                },
                _ => SnapError::Failed {
                    doing: doing.to_string(),
                    tool: self.name,
                    message: e.to_string(),
                    hint: "",
                },
            })?;
        if out.status.success() {
            return Ok(String::from_utf8_lossy(&out.stdout).into_owned());
        }
        let err = String::from_utf8_lossy(&out.stderr);
        let message = err
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .collect::<Vec<_>>()
            .join("; ");
        let message = if message.is_empty() {
            format!("exit status {}", out.status)
        } else {
            message
        };
        Err(SnapError::Failed {
            doing: doing.to_string(),
            tool: self.name,
            hint: hint(&message),
            message,
        })
    }
}

/// What to do, for the failures a user can act on.
fn hint(message: &str) -> &'static str {
    let m = message.to_ascii_lowercase();
    if m.contains("no space") || m.contains("insufficient free space") {
        " (no space for the snapshot: free some, or set source-snapshot = \"off\")"
    } else if m.contains("operation not permitted") || m.contains("permission denied") {
        " (snapshots need root, or CAP_SYS_ADMIN: run the backup as root, or set source-snapshot = \"off\")"
    } else {
        ""
    }
}
