//! What the index reads and writes through a repository: its index files,
//! sealed, and where this machine keeps its tables (see
//! [`crate::index::SealedStore`]).

use std::sync::Arc;

use capsule_backend::Backend;
use capsule_crypto::{Aad, MasterKey};
use capsule_format::{FileType, ObjectId};

use super::{put_addressed, Repository};
use crate::error::{EngineError, Result};

fn list_sized(backend: &dyn Backend, t: FileType) -> Result<Vec<(String, u64)>> {
    Ok(backend
        .list(t.prefix())?
        .into_iter()
        .map(|o| (o.name, o.size))
        .collect())
}

fn read_sealed(
    backend: &dyn Backend,
    key: &MasterKey,
    t: FileType,
    id: &ObjectId,
    aad: Aad<'_>,
) -> Result<Vec<u8>> {
    let name = t.name(id);
    let b = backend.get(&name, None)?;
    if ObjectId::of(&b) != *id {
        return Err(EngineError::corrupt(
            &name,
            "content does not match its name",
        ));
    }
    key.open(aad, &b)
        .map_err(|e| EngineError::corrupt(&name, e))
}

/// What the index keeps to read index files again, for a table found
/// damaged mid-run: the backend and the key, nothing of the repository.
struct IndexSource {
    backend: Arc<dyn Backend>,
    key: MasterKey,
}

impl crate::index::SealedStore for IndexSource {
    fn list(&self, t: FileType) -> Result<Vec<(String, u64)>> {
        list_sized(&*self.backend, t)
    }
    fn read_sealed(&self, t: FileType, id: &ObjectId, aad: Aad<'_>) -> Result<Vec<u8>> {
        read_sealed(&*self.backend, &self.key, t, id, aad)
    }
    fn reads_in_flight(&self) -> usize {
        crate::flight::reads_in_flight(&self.backend.capabilities())
    }
    fn write_sealed(&self, t: FileType, _: Aad<'_>, _: &[u8]) -> Result<ObjectId> {
        Err(EngineError::corrupt(
            t.prefix(),
            "the index's reader does not write",
        ))
    }
}

impl crate::index::SealedStore for Repository {
    fn list(&self, t: FileType) -> Result<Vec<(String, u64)>> {
        list_sized(&*self.backend, t)
    }

    fn read_sealed(&self, t: FileType, id: &ObjectId, aad: Aad<'_>) -> Result<Vec<u8>> {
        read_sealed(&*self.backend, &self.key, t, id, aad)
    }

    fn reads_in_flight(&self) -> usize {
        crate::flight::reads_in_flight(&self.backend.capabilities())
    }

    fn index_home(&self) -> crate::index::IndexHome {
        crate::index::IndexHome {
            dir: self.index_dir.clone(),
            key: self.key.local_key("capsule index tables v1"),
            source: Some(Arc::new(IndexSource {
                backend: self.backend.clone(),
                key: self.key.clone(),
            })),
        }
    }

    fn write_sealed(&self, t: FileType, aad: Aad<'_>, plain: &[u8]) -> Result<ObjectId> {
        let sealed = self.key.seal(aad, plain)?;
        let id = ObjectId::of(&sealed);
        put_addressed(&*self.backend, &t.name(&id), &sealed)?;
        Ok(id)
    }
}
