//! Where a stream backup's bytes come from: standard input, or a command
//! capsule starts (without a shell) and whose exit status it checks
//! before anything is committed.

use std::ffi::OsString;
use std::io::{IsTerminal, Read};
use std::process::{Child, Command, Stdio};

use anyhow::Result;
use capsule_app::error::UsageError;

/// A stream to back up, not yet opened.
pub struct StreamSource {
    /// The file name it is stored under.
    pub name: String,
    command: Option<Vec<OsString>>,
}

/// The reader, and what says whether the stream ended well.
pub type Opened = (
    Box<dyn Read>,
    Box<dyn FnMut() -> std::result::Result<(), String>>,
);

impl StreamSource {
    /// Standard input, stored as `name` (default "stdin").
    pub fn stdin(name: Option<String>) -> Result<Self> {
        if std::io::stdin().is_terminal() {
            return Err(UsageError(
                "--stdin reads standard input, which is a terminal here: pipe the data in (pg_dump mydb | capsule backup --stdin --stdin-filename mydb.sql)".into(),
            )
            .into());
        }
        Ok(StreamSource {
            name: name.unwrap_or_else(|| "stdin".into()),
            command: None,
        })
    }

    /// The output of `argv`, stored as `name` (default: the program's
    /// name).
    pub fn command(argv: Vec<OsString>, name: Option<String>) -> Result<Self> {
        let program = argv
            .first()
            .ok_or_else(|| UsageError("--stdin-from-command needs the command".into()))?;
        let name = name.unwrap_or_else(|| {
            std::path::Path::new(program)
                .file_name()
                .map_or_else(|| "stdin".into(), |n| n.to_string_lossy().into_owned())
        });
        Ok(StreamSource {
            name,
            command: Some(argv),
        })
    }

    /// Starts reading: opens standard input, or starts the command.
    pub fn open(&mut self) -> Result<Opened> {
        let Some(argv) = self.command.take() else {
            return Ok((Box::new(std::io::stdin()), Box::new(|| Ok(()))));
        };
        let shown = shown(&argv);
        let mut child = Command::new(&argv[0])
            .args(&argv[1..])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|e| {
                UsageError(format!(
                    "cannot start {shown}: {e} (is it installed, and on PATH?)"
                ))
            })?;
        let out = child
            .stdout
            .take()
            .ok_or_else(|| anyhow::anyhow!("{shown}: no output pipe"))?;
        let mut child = Some(child);
        let ended = move || match child.take() {
            Some(c) => judge(c, &shown),
            None => Ok(()),
        };
        Ok((Box::new(out), Box::new(ended)))
    }
}

/// The command line as the user would recognise it.
fn shown(argv: &[OsString]) -> String {
    argv.iter()
        .map(|a| a.to_string_lossy().into_owned())
        .collect::<Vec<_>>()
        .join(" ")
}

/// Whether the command ended well: exit status 0.
fn judge(mut c: Child, shown: &str) -> std::result::Result<(), String> {
    use std::os::unix::process::ExitStatusExt;
    let st = c
        .wait()
        .map_err(|e| format!("cannot learn how `{shown}` ended: {e}"))?;
    if st.success() {
        return Ok(());
    }
    Err(match (st.code(), st.signal()) {
        (Some(code), _) => format!("the command `{shown}` exited with status {code}"),
        (None, Some(sig)) => format!("the command `{shown}` was killed by signal {sig}"),
        _ => format!("the command `{shown}` failed ({st})"),
    })
}
