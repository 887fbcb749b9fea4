//! `capsule completions`: shell completions and man pages, generated from
//! the command definitions, so they never fall behind them.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use clap::{Args, ValueEnum};
use clap_complete::Shell;

use crate::exit;
use crate::output::Output;

/// Shells completions are made for.
#[derive(ValueEnum, Clone, Copy, Debug)]
pub enum ShellArg {
    Bash,
    Zsh,
    Fish,
}

impl From<ShellArg> for Shell {
    fn from(s: ShellArg) -> Self {
        match s {
            ShellArg::Bash => Shell::Bash,
            ShellArg::Zsh => Shell::Zsh,
            ShellArg::Fish => Shell::Fish,
        }
    }
}

/// Arguments of `completions`.
#[derive(Args, Debug)]
pub struct CompletionsArgs {
    /// Print the completion script for this shell.
    #[arg(required_unless_present_any = ["install", "man", "markdown"])]
    shell: Option<ShellArg>,
    /// Write completions for bash, zsh and fish, and the man pages, where
    /// each looks for a user's own (under ~/.local/share, ~/.zfunc and
    /// ~/.config/fish).
    #[arg(long, conflicts_with_all = ["shell", "man", "markdown"])]
    install: bool,
    /// Write the man pages (capsule.1, capsule-backup.1, …) into this
    /// directory.
    #[arg(long, value_name = "DIR", conflicts_with = "shell")]
    man: Option<PathBuf>,
    /// Write the command reference as Markdown (the user guide's
    /// reference/commands.md) to this file; `-` for stdout.
    #[arg(long, value_name = "FILE", conflicts_with = "shell")]
    markdown: Option<PathBuf>,
}

fn write(path: &Path, bytes: &[u8]) -> Result<()> {
    if let Some(d) = path.parent() {
        std::fs::create_dir_all(d).with_context(|| format!("creating {}", d.display()))?;
    }
    std::fs::write(path, bytes).with_context(|| format!("writing {}", path.display()))
}

fn script(cli: &clap::Command, shell: Shell) -> Vec<u8> {
    let mut out = Vec::new();
    clap_complete::generate(shell, &mut cli.clone(), "capsule", &mut out);
    out
}

/// Writes a man page for capsule and one for each command into `dir`;
/// returns how many.
fn man_pages(cmd: &clap::Command, dir: &Path) -> Result<usize> {
    let mut n = 0;
    let mut page = |c: &clap::Command, name: &str| -> Result<()> {
        let mut b = Vec::new();
        clap_mangen::Man::new(c.clone().name(name.to_string()))
            .render(&mut b)
            .context("rendering a man page")?;
        write(&dir.join(format!("{name}.1")), &b)?;
        n += 1;
        Ok(())
    };
    page(cmd, "capsule")?;
    for sub in cmd.get_subcommands() {
        page(sub, &format!("capsule-{}", sub.get_name()))?;
        for subsub in sub.get_subcommands() {
            page(
                subsub,
                &format!("capsule-{}-{}", sub.get_name(), subsub.get_name()),
            )?;
        }
    }
    Ok(n)
}

pub fn completions(cli: &clap::Command, out: &Output, a: CompletionsArgs) -> Result<u8> {
    if let Some(s) = a.shell {
        use std::io::Write;
        return match std::io::stdout().write_all(&script(cli, s.into())) {
            // Piped into `head`: what was wanted was taken.
            Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(e.into()),
            _ => Ok(exit::OK),
        };
    }
    if let Some(file) = a.markdown {
        let md = super::reference::markdown(cli);
        if file.as_os_str() == "-" {
            print!("{md}");
        } else {
            write(&file, md.as_bytes())?;
            out.say(format!(
                "the command reference written to {}",
                file.display()
            ));
        }
        if a.man.is_none() {
            return Ok(exit::OK);
        }
    }
    if let Some(dir) = a.man {
        let n = man_pages(cli, &dir)?;
        out.say(format!("{n} man pages written to {}", dir.display()));
        return Ok(exit::OK);
    }
    let home = dirs::home_dir().context("no home directory to install into")?;
    let data = dirs::data_dir().unwrap_or_else(|| home.join(".local/share"));
    let places = [
        (
            Shell::Bash,
            data.join("bash-completion/completions/capsule"),
        ),
        (Shell::Zsh, home.join(".zfunc/_capsule")),
        (
            Shell::Fish,
            home.join(".config/fish/completions/capsule.fish"),
        ),
    ];
    for (shell, path) in &places {
        write(path, &script(cli, *shell))?;
        out.say(format!("{shell} completions: {}", path.display()));
    }
    let man = data.join("man/man1");
    let n = man_pages(cli, &man)?;
    out.say(format!("{n} man pages: {} (`man capsule`)", man.display()));
    out.say("zsh: add `fpath+=~/.zfunc` before `compinit` in ~/.zshrc, if it is not there yet");
    Ok(exit::OK)
}
