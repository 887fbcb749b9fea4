//! Walking a destination made of directories (SMB, SFTP): listings read
//! many at a time, temporaries told apart, directories in order.

use capsule_backend::BackendError;

/// A random suffix for temporary object names.
pub(crate) fn random_suffix() -> String {
    let mut r = [0u8; 8];
    let _ = getrandom::fill(&mut r);
    hex::encode(r)
}

/// One entry of a directory listing on a file-like destination.
pub(crate) struct DirEntry {
    pub(crate) name: String,
    pub(crate) is_dir: bool,
    pub(crate) size: u64,
    /// Unix seconds, when the listing gives it.
    pub(crate) modified: Option<i64>,
}

/// Lists every object under `prefix` on a destination made of directories
/// (SMB, SFTP). `read_dir(rel)` lists one directory relative to the base
/// (`""` is the base), or `None` if it does not exist. Directories are read
/// 16 at a time: a repository's `data/` has 256 subdirectories, and one at
/// a time would cost 256 round trips in a row. Temporaries are skipped.
pub(crate) async fn walk_tree<F, Fut>(
    prefix: &str,
    read_dir: F,
) -> Result<Vec<capsule_backend::ObjectInfo>, BackendError>
where
    F: Fn(String) -> Fut,
    Fut: std::future::Future<Output = Result<Option<Vec<DirEntry>>, BackendError>>,
{
    let (mut out, _, _) = walk(prefix.trim_end_matches('/'), read_dir).await?;
    out.retain(|o| o.name.starts_with(prefix));
    Ok(out)
}

/// Every temporary below the base: what interrupted writes left.
pub(crate) async fn walk_temporaries<F, Fut>(
    read_dir: F,
) -> Result<Vec<capsule_backend::ObjectInfo>, BackendError>
where
    F: Fn(String) -> Fut,
    Fut: std::future::Future<Output = Result<Option<Vec<DirEntry>>, BackendError>>,
{
    Ok(walk("", read_dir).await?.2)
}

/// Every directory below the base (and the base, `""`), parents before
/// children: what `remove_empty_dirs` removes in reverse.
pub(crate) async fn all_dirs<F, Fut>(read_dir: F) -> Result<Vec<String>, BackendError>
where
    F: Fn(String) -> Fut,
    Fut: std::future::Future<Output = Result<Option<Vec<DirEntry>>, BackendError>>,
{
    Ok(walk("", read_dir).await?.1)
}

/// Objects, directories in the order visited (parents first), and
/// temporaries.
pub(crate) type Walked = (
    Vec<capsule_backend::ObjectInfo>,
    Vec<String>,
    Vec<capsule_backend::ObjectInfo>,
);

/// The walk behind [`walk_tree`], [`all_dirs`] and [`walk_temporaries`].
pub(crate) async fn walk<F, Fut>(start: &str, read_dir: F) -> Result<Walked, BackendError>
where
    F: Fn(String) -> Fut,
    Fut: std::future::Future<Output = Result<Option<Vec<DirEntry>>, BackendError>>,
{
    let mut out = Vec::new();
    let mut dirs = Vec::new();
    let mut temps = Vec::new();
    let mut pending = vec![start.to_string()];
    while !pending.is_empty() {
        let batch: Vec<String> = pending.drain(..pending.len().min(16)).collect();
        let listed = futures::future::join_all(batch.iter().map(|d| read_dir(d.clone()))).await;
        for (dir, entries) in batch.into_iter().zip(listed) {
            for e in entries?.unwrap_or_default() {
                if e.name == "." || e.name == ".." {
                    continue;
                }
                let is_temp = e.name.starts_with(capsule_backend::TEMP_PREFIX);
                let child = if dir.is_empty() {
                    e.name
                } else {
                    format!("{dir}/{}", e.name)
                };
                if e.is_dir {
                    pending.push(child);
                } else {
                    let o = capsule_backend::ObjectInfo {
                        name: child,
                        size: e.size,
                        modified: e.modified,
                    };
                    if is_temp {
                        temps.push(o);
                    } else {
                        out.push(o);
                    }
                }
            }
            dirs.push(dir);
        }
    }
    Ok((out, dirs, temps))
}
