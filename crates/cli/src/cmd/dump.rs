//! `capsule dump`: one stored file's bytes, or a stored directory as a tar
//! stream, to standard output or a new file.

use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context, Result};
use capsule_app::error::UsageError;
use capsule_app::Settings;
use capsule_engine::browse::Browser;
use capsule_engine::EngineError;
use capsule_format::tree::NodeKind;
use clap::{Args, ValueEnum};

use crate::exit;
use crate::output::Output;
use crate::repo::{open, resolve, root_of};

/// Arguments of `dump`.
#[derive(Args, Debug)]
pub struct DumpArgs {
    /// Snapshot: an ID or its prefix, "latest", "latest~N", or a time.
    snapshot: String,
    /// The file or directory in the snapshot ("/" for all of it).
    path: String,
    /// What a directory is written as.
    #[arg(long, value_enum, default_value_t = Archive::Tar)]
    archive: Archive,
    /// Write into this new file instead of standard output (an existing
    /// file is not replaced).
    #[arg(long, value_name = "FILE")]
    target: Option<PathBuf>,
}

/// What a directory is written as.
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum Archive {
    /// A tar stream: modes, owners, times, symlinks, FIFOs and devices.
    Tar,
    /// A zip stream: files deflated, modes, times and symlinks (no owners).
    Zip,
}

pub fn dump(settings: &Settings, out: &Output, a: DumpArgs) -> Result<u8> {
    let stdout = std::io::stdout();
    if a.target.is_none() && stdout.is_terminal() {
        return Err(UsageError(
            "standard output is a terminal: redirect it (capsule dump … > file), pipe it, or give --target FILE".into(),
        )
        .into());
    }
    let (repo, _) = open(settings, out)?;
    let repo = Arc::new(repo);
    let (id, snap) = resolve(&repo, out, &a.snapshot)?;
    let (mut index, bad) = repo.load_index()?;
    for e in &bad {
        out.warn(format!("{e} (blobs it lists are unavailable)"));
    }
    capsule_engine::prune::add_marked_packs(&repo, &mut index)?;
    let b = Browser::new(repo.clone(), Arc::new(index));
    let root = root_of(&snap)?;
    let path = capsule_engine::treewalk::snapshot_path(&a.path);
    let node = b.find(&root, &path)?;
    let (tree, top_node) = match &node {
        None => (Some(root), None),
        Some(n) if n.kind() == NodeKind::Dir => (n.subtree, Some(n)),
        Some(n) if n.kind() == NodeKind::File => (None, Some(n)),
        Some(n) => {
            return Err(UsageError(format!(
                "{} in snapshot {} is a {}: only a file or a directory can be dumped",
                path.display(),
                id.short(),
                n.kind().as_str()
            ))
            .into())
        }
    };
    let mut sink = match &a.target {
        Some(t) => Sink::File(new_file(t)?),
        None => Sink::Stdout(std::io::BufWriter::with_capacity(1 << 20, stdout.lock())),
    };
    let written = match (tree, top_node) {
        (None, Some(file)) => capsule_engine::dump::copy_file(&b, file, sink.writer()).map(|n| {
            capsule_engine::dump::Dumped {
                files: 1,
                bytes: n,
                ..Default::default()
            }
        }),
        (tree, top) => {
            // A directory is archived under its own name, as `tar -C parent
            // name` would; the snapshot's root as "snapshot".
            let name = path
                .file_name()
                .map_or_else(|| PathBuf::from("snapshot"), PathBuf::from);
            match a.archive {
                Archive::Tar => {
                    capsule_engine::dump::write_tar(&b, tree.as_ref(), &name, top, sink.writer())
                }
                Archive::Zip => {
                    capsule_engine::dump::write_zip(&b, tree.as_ref(), &name, top, sink.writer())
                }
            }
        }
    };
    let written = written.and_then(|d| sink.finish().map(|()| d));
    match written {
        // Standard output holds the data: nothing else may go there; what
        // the archive could not carry is said on stderr either way.
        Ok(d) if a.target.is_none() => {
            if d.skipped > 0 {
                out.warn(format!(
                    "{} entries of {} (sockets; in a zip also FIFOs and devices) have no kind in the archive and were left out",
                    d.skipped,
                    path.display()
                ));
            }
            Ok(exit::OK)
        }
        Ok(d) => {
            if out.json {
                out.json(&serde_json::json!({
                    "snapshot": id.to_hex(),
                    "path": path.to_string_lossy(),
                    "target": a.target.as_ref().map(|t| t.to_string_lossy()),
                    "written": d,
                }));
            } else {
                out.say(format!(
                    "dumped {} of snapshot {}: {} file{}, {} bytes{}",
                    path.display(),
                    id.short(),
                    d.files,
                    if d.files == 1 { "" } else { "s" },
                    d.bytes,
                    if d.skipped > 0 {
                        format!(
                            " ({} socket(s) left out: tar has no entry for one)",
                            d.skipped
                        )
                    } else {
                        String::new()
                    }
                ));
            }
            Ok(exit::OK)
        }
        Err(e) => {
            // What was written is not the whole: a file written is removed,
            // so no one takes it for the whole.
            if let Some(t) = &a.target {
                let _ = std::fs::remove_file(t);
            }
            let broken = e.kind() == std::io::ErrorKind::BrokenPipe;
            let inner = e
                .get_ref()
                .and_then(|i| i.downcast_ref::<EngineError>())
                .map(|x| x.to_string());
            Err(anyhow::anyhow!(
                "dump of {} from snapshot {} stopped: {}{}",
                path.display(),
                id.short(),
                inner.unwrap_or_else(|| e.to_string()),
                if broken {
                    " (the reader of standard output went away)"
                } else {
                    ""
                }
            ))
        }
    }
}

/// Where the bytes go.
enum Sink<'a> {
    Stdout(std::io::BufWriter<std::io::StdoutLock<'a>>),
    File(std::io::BufWriter<std::fs::File>),
}

impl Sink<'_> {
    fn writer(&mut self) -> &mut dyn Write {
        match self {
            Sink::Stdout(w) => w,
            Sink::File(w) => w,
        }
    }

    /// Flushed, and a file's bytes on its disk, before success is said.
    fn finish(&mut self) -> std::io::Result<()> {
        match self {
            Sink::Stdout(w) => w.flush(),
            Sink::File(w) => {
                w.flush()?;
                w.get_ref().sync_all()
            }
        }
    }
}

/// A new file at `t`, never through a symlink and never over an existing
/// file (capsule may run as root in a directory others write).
fn new_file(t: &Path) -> Result<std::io::BufWriter<std::fs::File>> {
    use std::os::unix::fs::OpenOptionsExt;
    let f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .mode(0o600)
        .open(t)
        .map_err(|e| {
            if e.kind() == std::io::ErrorKind::AlreadyExists {
                anyhow::Error::new(UsageError(format!(
                    "{} already exists: dump writes a new file (remove it or choose another name)",
                    t.display()
                )))
            } else {
                anyhow::Error::new(e)
            }
        })
        .with_context(|| format!("create {}", t.display()))?;
    Ok(std::io::BufWriter::with_capacity(1 << 20, f))
}
