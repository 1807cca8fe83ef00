//! Blob stores: where segments and snapshots are kept, under their blake3
//! hashes.

use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use crate::error::ObjectsError;

/// A content-addressed store of segments and snapshots. A blob is put once
/// under its blake3 hash and never changed, so owners never overwrite each
/// other's blobs and a store without conditional writes (Garage) serves.
///
/// The runtime adapts its script store (S3) to this trait; the crate brings
/// an in-memory one and a directory one.
#[async_trait::async_trait]
pub trait BlobStore: Send + Sync {
    /// Stores `bytes` under `hash` (their [`blob_hash`]), durably: when
    /// `put` returns `Ok`, a later `get` from any node finds them.
    async fn put(&self, hash: &str, bytes: &[u8]) -> Result<(), ObjectsError>;
    /// The blob stored under `hash`, or `None` if there is none.
    async fn get(&self, hash: &str) -> Result<Option<Vec<u8>>, ObjectsError>;
}

/// The name a blob is stored under: its blake3 hash, 64 lowercase hex.
pub fn blob_hash(bytes: &[u8]) -> String {
    blake3::hash(bytes).to_hex().to_string()
}

/// Refuses a blob name that is not a blake3 hash (so a name can never be a
/// path outside the store).
fn check_hash(hash: &str) -> Result<(), ObjectsError> {
    if hash.len() == 64 && hash.bytes().all(|c| matches!(c, b'0'..=b'9' | b'a'..=b'f')) {
        Ok(())
    } else {
        Err(ObjectsError::Invalid(format!(
            "blob name {hash:?} is not a blake3 hash"
        )))
    }
}

/// Blobs in memory, shared by its clones: tests, and a node that needs no
/// durability beyond its process.
#[derive(Debug, Clone, Default)]
pub struct MemoryBlobStore {
    blobs: Arc<Mutex<HashMap<String, Vec<u8>>>>,
}

impl MemoryBlobStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    /// How many blobs the store holds.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Whether the store holds no blob.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Vec<u8>>> {
        // A panic while holding the lock leaves the map whole (inserts
        // are single calls), so a poisoned lock is still usable.
        self.blobs.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[async_trait::async_trait]
impl BlobStore for MemoryBlobStore {
    async fn put(&self, hash: &str, bytes: &[u8]) -> Result<(), ObjectsError> {
        check_hash(hash)?;
        self.lock().insert(hash.to_owned(), bytes.to_vec());
        Ok(())
    }

    async fn get(&self, hash: &str) -> Result<Option<Vec<u8>>, ObjectsError> {
        check_hash(hash)?;
        Ok(self.lock().get(hash).cloned())
    }
}

/// Blobs as files in a directory (`<dir>/<first two hex>/<hash>`), for one
/// machine: written to a temporary file, synced, then renamed, so a blob is
/// whole or absent after a crash.
#[derive(Debug, Clone)]
pub struct DirBlobStore {
    dir: PathBuf,
}

impl DirBlobStore {
    /// A store in `dir` (created on the first put).
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Self { dir: dir.into() }
    }

    fn path(&self, hash: &str) -> PathBuf {
        self.dir.join(&hash[..2]).join(hash)
    }
}

fn write_durably(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let parent = path.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(parent)?;
    let mut file = tempfile::NamedTempFile::new_in(parent)?;
    file.write_all(bytes)?;
    file.as_file().sync_all()?;
    file.persist(path).map_err(|e| e.error)?;
    std::fs::File::open(parent)?.sync_all()
}

#[async_trait::async_trait]
impl BlobStore for DirBlobStore {
    async fn put(&self, hash: &str, bytes: &[u8]) -> Result<(), ObjectsError> {
        check_hash(hash)?;
        let path = self.path(hash);
        let bytes = bytes.to_vec();
        tokio::task::spawn_blocking(move || write_durably(&path, &bytes))
            .await
            .map_err(|e| ObjectsError::Blob(format!("writing a blob: {e}")))?
            .map_err(|e| ObjectsError::Blob(format!("writing a blob: {e}")))
    }

    async fn get(&self, hash: &str) -> Result<Option<Vec<u8>>, ObjectsError> {
        check_hash(hash)?;
        match tokio::fs::read(self.path(hash)).await {
            Ok(bytes) => Ok(Some(bytes)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(ObjectsError::Blob(format!("reading blob {hash}: {e}"))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn stores_keep_blobs_and_refuse_names_that_are_not_hashes() {
        let dir = tempfile::tempdir().expect("temporary directory");
        let stores: [Box<dyn BlobStore>; 2] = [
            Box::new(MemoryBlobStore::new()),
            Box::new(DirBlobStore::new(dir.path().join("blobs"))),
        ];
        for store in stores {
            let hash = blob_hash(b"segment");
            assert_eq!(store.get(&hash).await.expect("get"), None);
            store.put(&hash, b"segment").await.expect("put");
            assert_eq!(
                store.get(&hash).await.expect("get"),
                Some(b"segment".to_vec())
            );
            for bad in ["../../etc/passwd", "", &hash.to_uppercase(), &hash[..63]] {
                assert!(matches!(
                    store.put(bad, b"x").await,
                    Err(ObjectsError::Invalid(_))
                ));
                assert!(matches!(
                    store.get(bad).await,
                    Err(ObjectsError::Invalid(_))
                ));
            }
        }
    }
}
