//! The SFTP backend as the engine and the lab call it.

use std::io::{Read, Write};
use std::ops::Range;

use capsule_backend::{
    validate_name, Backend, BackendError, Capabilities, LabBackend, ObjectInfo, Space,
};
use futures::stream::FuturesUnordered;
use futures::StreamExt;
use russh_sftp::protocol::{FileAttributes, OpenFlags};

use super::dial::{is_missing, lock, sftp_err};
use super::requests::SftpBackend;
use crate::rt::block_on;

impl Backend for SftpBackend {
    fn put(&self, name: &str, data: &[u8]) -> Result<(), BackendError> {
        self.put_stream(name, data.len() as u64, &mut &data[..])
    }

    fn put_stream(&self, name: &str, size: u64, data: &mut dyn Read) -> Result<(), BackendError> {
        validate_name(name)?;
        block_on(self.with_conn(|c| async move { self.put_inner(&c, name, size, data).await }))
    }

    fn get(&self, name: &str, range: Option<Range<u64>>) -> Result<Vec<u8>, BackendError> {
        validate_name(name)?;
        let mut out = Vec::new();
        block_on(self.with_conn(|c| {
            let out = &mut out;
            async move {
                self.read_range(&c, name, range, &mut |b| {
                    out.extend_from_slice(b);
                    Ok(())
                })
                .await
            }
        }))?;
        Ok(out)
    }

    fn get_stream(
        &self,
        name: &str,
        range: Option<Range<u64>>,
        out: &mut dyn Write,
    ) -> Result<u64, BackendError> {
        validate_name(name)?;
        block_on(self.with_conn(|c| async move {
            self.read_range(&c, name, range, &mut |b| {
                out.write_all(b)
                    .map_err(|e| capsule_backend::write_out_error(name, e))
            })
            .await
        }))
    }

    fn stat(&self, name: &str) -> Result<ObjectInfo, BackendError> {
        validate_name(name)?;
        let a = block_on(self.with_conn(|c| async move {
            c.sftp
                .stat(self.path(name))
                .await
                .map_err(|e| sftp_err("stat", name, e))
        }))?;
        Ok(ObjectInfo {
            name: name.to_string(),
            size: a.attrs.size.unwrap_or(0),
            modified: a.attrs.mtime.map(i64::from),
        })
    }

    fn list(&self, prefix: &str) -> Result<Vec<ObjectInfo>, BackendError> {
        block_on(self.with_conn(|c| async move {
            crate::dirwalk::walk_tree(prefix, |d| self.read_dir(&c, d)).await
        }))
    }

    fn list_temporaries(&self) -> Result<Vec<ObjectInfo>, BackendError> {
        block_on(self.with_conn(|c| async move {
            crate::dirwalk::walk_temporaries(|d| self.read_dir(&c, d)).await
        }))
    }

    fn delete(&self, name: &str) -> Result<(), BackendError> {
        validate_name(name)?;
        block_on(self.with_conn(|c| async move {
            match c.sftp.remove(self.path(name)).await {
                Ok(_) => Ok(()),
                Err(e) if is_missing(&e) => Ok(()),
                Err(e) => Err(sftp_err("delete", name, e)),
            }
        }))
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            concurrency: self.concurrency,
            durable_put: true,
            local: false,
            buffers_puts: false,
        }
    }

    fn location(&self) -> String {
        self.dialer.location.clone()
    }
}

impl LabBackend for SftpBackend {
    fn probe_write(
        &self,
        name: &str,
        data: &[u8],
        writes: usize,
        sync: bool,
    ) -> Result<(), BackendError> {
        validate_name(name)?;
        block_on(self.with_conn(|c| async move {
            let flags = OpenFlags::CREATE | OpenFlags::TRUNCATE | OpenFlags::WRITE;
            let open = || {
                c.sftp
                    .open(self.path(name), flags, FileAttributes::default())
            };
            let handle = match open().await {
                Ok(h) => h.handle,
                Err(e) if is_missing(&e) && name.contains('/') => {
                    let dir = name.rsplit_once('/').map(|(d, _)| d).unwrap_or_default();
                    self.make_dirs(&c, dir).await?;
                    open().await.map_err(|e| sftp_err("probe", name, e))?.handle
                }
                Err(e) => return Err(sftp_err("probe", name, e)),
            };
            // No request may exceed the server's packet limit, however few
            // writes were asked for.
            let piece = data
                .len()
                .div_ceil(writes.max(1))
                .clamp(1, c.write_len as usize);
            let mut in_flight: FuturesUnordered<_> = data
                .chunks(piece)
                .enumerate()
                .map(|(i, part)| {
                    c.sftp
                        .write(handle.clone(), (i * piece) as u64, part.to_vec())
                })
                .collect();
            let mut res = Ok(());
            while let Some(r) = in_flight.next().await {
                if let Err(e) = r {
                    res = Err(sftp_err("probe", name, e));
                }
            }
            // The fsync is pipelined with the close (the server answers in
            // order), so a synced probe costs the same round trips as an
            // unsynced one and the lab's flush time is the sync alone.
            let fsync = async {
                if res.is_ok() && sync && c.fsync {
                    c.sftp.fsync(handle.clone()).await.map(|_| ())
                } else {
                    Ok(())
                }
            };
            let (synced, closed) = futures::join!(fsync, c.sftp.close(handle.clone()));
            res = res.and_then(|_| synced.map_err(|e| sftp_err("probe", name, e)));
            res.and_then(|_| closed.map(|_| ()).map_err(|e| sftp_err("probe", name, e)))
        }))
    }

    fn space(&self) -> Result<Option<Space>, BackendError> {
        block_on(self.with_conn(|c| async move {
            match c.sftp.statvfs(self.base.clone()).await {
                Ok(v) => Ok(Some(Space {
                    free: v.blocks_avail.saturating_mul(v.fragment_size.max(1)),
                    total: v.blocks.saturating_mul(v.fragment_size.max(1)),
                })),
                // Servers without the statvfs@openssh.com extension.
                Err(_) => Ok(None),
            }
        }))
    }

    fn remove_empty_dirs(&self) -> Result<(), BackendError> {
        block_on(self.with_conn(|c| async move {
            let dirs = crate::dirwalk::all_dirs(|d| self.read_dir(&c, d)).await?;
            // Deepest first; a directory that is not empty simply stays.
            for d in dirs.iter().rev() {
                let _ = c.sftp.rmdir(self.path(d)).await;
            }
            lock(&self.dirs).clear();
            Ok(())
        }))
    }
}
