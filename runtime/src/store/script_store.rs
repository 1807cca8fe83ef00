//! Where Worker sources and records live: the [`ScriptStore`] trait and its
//! default, a local directory. For nodes that share no disk,
//! [`crate::store::s3_store::S3Store`] keeps the same layout in an
//! S3-compatible bucket.
//!
//! A store keeps bytes under names and gives them back: it does not parse
//! records and is not trusted to. Everything that reads a record goes
//! through [`crate::store::records::Records`], which signs what it writes
//! and refuses what does not authenticate, so a store (a directory, a
//! bucket) can be written by others than the nodes without their writes
//! being believed. The trait is async: a store may be across the network.
//! Nothing on a warm request's path waits for it (a warm Worker is
//! revalidated in the background, see [`crate::Runtime`]).
//!
//! Layout of a [`DirStore`] (each kind of record is a [`Kind`]):
//!
//! ```text
//! DIR/blobs/<blake3>.wasm           sources, named by their hash (immutable)
//! DIR/scripts/<id>.json             the current deployment of script <id>: the metadata of
//!                                   the version serving (and the split, if several do)
//! DIR/versions/<id>/<n>.json        version n of script <id>, as deployed (immutable)
//! DIR/secrets/<id>/<NAME>.json      secret NAME of script <id>, sealed (one record each)
//! DIR/claims/<id>/<n>-<nonce>.json  a writer's claim on version number n, while it deploys
//! ```
//!
//! What a deploy writes, in order, is [`crate::store::records`]'s: the blob,
//! a claim, the version's record, then the current deployment, each with
//! an atomic rename, so a reader sees either the old version or the new
//! one, never a mix. Several nodes may share one directory.
//!
//! Durability: every file is written to a temporary name, fsynced, renamed
//! into place, and then its directory is fsynced; a deletion fsyncs its
//! directory too. So once a write returns, a crash or power loss at any
//! later point keeps it, and a deploy that crashes at any step before the
//! current deployment is renamed into place leaves the old version
//! serving. `tests/durability.rs` stops a deploy at each step (a
//! [`FaultHook`]) and checks exactly that.

use std::fs;
use std::io::Write;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use crate::error::StoreError;

/// The kinds of record a store keeps, each in a folder of its own (see
/// the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    /// A script's current deployment, `scripts/<id>.json`.
    Deployment,
    /// One version of a script, `versions/<id>/<n>.json`.
    Version,
    /// One secret of a script, `secrets/<id>/<NAME>.json`.
    Secret,
    /// A writer's claim on a version number, `claims/<id>/<n>-<nonce>.json`.
    Claim,
}

impl Kind {
    /// The folder its records are kept in.
    pub fn dir(self) -> &'static str {
        match self {
            Kind::Deployment => "scripts",
            Kind::Version => "versions",
            Kind::Secret => "secrets",
            Kind::Claim => "claims",
        }
    }

    /// The name of its write in a [`FaultHook`]'s steps (`meta.write`…).
    fn step(self) -> &'static str {
        match self {
            Kind::Deployment => "meta",
            Kind::Version => "version",
            Kind::Secret => "secret",
            Kind::Claim => "claim",
        }
    }
}

/// Where one record is: its kind, its script, and its name among that
/// script's records of the kind (empty for a [`Kind::Deployment`], which
/// a script has one of).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecordKey<'a> {
    /// Its kind.
    pub kind: Kind,
    /// Its script.
    pub script_id: &'a str,
    /// Its name (a version number, a secret's name, a claim).
    pub name: &'a str,
}

/// Longest name of a record.
const MAX_RECORD_NAME: usize = 128;

/// Whether `name` may name a record: 1–128 letters, digits, `_` or `-`
/// (so it is one plain path segment, on a disk or in a bucket).
pub fn valid_record_name(name: &str) -> bool {
    (1..=MAX_RECORD_NAME).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

impl<'a> RecordKey<'a> {
    /// The current deployment of `script_id`.
    pub fn deployment(script_id: &'a str) -> Self {
        RecordKey {
            kind: Kind::Deployment,
            script_id,
            name: "",
        }
    }

    /// The record `name` of kind `kind` of `script_id`.
    pub fn of(kind: Kind, script_id: &'a str, name: &'a str) -> Self {
        RecordKey {
            kind,
            script_id,
            name,
        }
    }

    /// Its path inside the store (`scripts/app.json`,
    /// `versions/app/3.json`), or [`StoreError::BadKey`] if a part is not
    /// a plain name: nothing outside the store can be named.
    pub fn path(&self) -> Result<String, StoreError> {
        let bad = || StoreError::BadKey {
            key: format!("{}/{}/{}", self.kind.dir(), self.script_id, self.name)
                .chars()
                .take(80)
                .collect(),
        };
        if !crate::store::validate::valid_script_id(self.script_id) {
            return Err(bad());
        }
        match self.kind {
            Kind::Deployment if self.name.is_empty() => {
                Ok(format!("scripts/{}.json", self.script_id))
            }
            Kind::Deployment => Err(bad()),
            kind if valid_record_name(self.name) => Ok(format!(
                "{}/{}/{}.json",
                kind.dir(),
                self.script_id,
                self.name
            )),
            _ => Err(bad()),
        }
    }
}

/// One record as a listing finds it: its name, and a tag that changes
/// whenever the record is written again (a file's inode, time and size;
/// an object's ETag and time), so a listing tells whether anything
/// changed without reading each record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listed {
    /// The record's name (for [`Kind::Deployment`], the script ID).
    pub name: String,
    /// What changes when it is written.
    pub tag: String,
}

/// A place to keep Worker sources and records as bytes. Each write of a
/// record replaces it atomically: a reader sees the old bytes or the new,
/// never a mix. A store checks only that keys are plain names
/// ([`RecordKey::path`]); what the bytes mean, and whether to believe
/// them, is [`crate::store::records`]'s.
#[async_trait::async_trait]
pub trait ScriptStore: Send + Sync + 'static {
    /// Stores source `bytes` under their blake3 `hash`, durably, before
    /// any record names it.
    async fn put_blob(&self, hash: &str, bytes: &[u8]) -> Result<(), StoreError>;
    /// The source stored under `hash`, if any (unchecked: the caller
    /// compares it with its hash).
    async fn get_blob(&self, hash: &str) -> Result<Option<Vec<u8>>, StoreError>;
    /// Writes record `key` atomically and durably.
    async fn put_record(&self, key: RecordKey<'_>, bytes: &[u8]) -> Result<(), StoreError>;
    /// Record `key`'s bytes, if there is such a record.
    async fn get_record(&self, key: RecordKey<'_>) -> Result<Option<Vec<u8>>, StoreError>;
    /// Deletes record `key` durably (nothing if there is none).
    async fn delete_record(&self, key: RecordKey<'_>) -> Result<(), StoreError>;
    /// The records of kind `kind` of `script_id`; for
    /// [`Kind::Deployment`], every deployed script (`script_id` is not
    /// used). In no particular order.
    async fn list_records(&self, kind: Kind, script_id: &str) -> Result<Vec<Listed>, StoreError>;
    /// The shared precompiled artifact `name`, for a store that keeps
    /// artifacts for every node (`None` if it has none, or keeps none).
    /// Whatever comes back is authenticated before use
    /// ([`crate::store::artifact`]).
    async fn get_artifact(&self, _name: &str) -> Result<Option<bytes::Bytes>, StoreError> {
        Ok(None)
    }
    /// Shares precompiled artifact `name` with every node (a no-op for a
    /// store that keeps none: nodes sharing a directory share its
    /// artifact cache already).
    async fn put_artifact(&self, _name: &str, _bytes: bytes::Bytes) -> Result<(), StoreError> {
        Ok(())
    }
    /// Whether [`ScriptStore::get_artifact`] and
    /// [`ScriptStore::put_artifact`] share anything (so a deploy uploads
    /// its artifact and a cold start looks there before compiling).
    fn keeps_artifacts(&self) -> bool {
        false
    }
    /// Where the store is, for logs and errors (a directory or a URL).
    fn location(&self) -> String;
}

/// A [`ScriptStore`] in a local directory.
#[derive(Clone)]
pub struct DirStore {
    root: PathBuf,
    fault: Option<FaultHook>,
}

impl std::fmt::Debug for DirStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DirStore")
            .field("root", &self.root)
            .finish()
    }
}

/// Called with the name of each durable step of a [`DirStore`] write
/// before it is taken (`blob.write`, `blob.rename`, `blob.sync-dir`, then
/// the same for `claim`, `version`, `meta` (the current deployment) and
/// `secret`); an error stops the write there, as a crash would. For
/// crash-injection tests.
pub type FaultHook = std::sync::Arc<dyn Fn(&str) -> std::io::Result<()> + Send + Sync>;

/// Fsyncs directory `dir`, so a rename or create inside it survives a
/// power loss.
pub fn sync_dir(dir: &Path) -> std::io::Result<()> {
    fs::File::open(dir)?.sync_all()
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> StoreError + '_ {
    move |source| StoreError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// Writes `bytes` to `path` via a temporary file and a rename, so readers
/// never see a partial file, then fsyncs the directory so the rename is
/// durable; returns the file written (for its identity).
pub(crate) fn write_atomic(path: &Path, bytes: &[u8]) -> Result<fs::File, StoreError> {
    write_durable(path, bytes, "file", None)
}

/// [`write_atomic`], asking `fault` before each step (`{what}.write`,
/// `{what}.rename`, `{what}.sync-dir`).
fn write_durable(
    path: &Path,
    bytes: &[u8],
    what: &str,
    fault: Option<&FaultHook>,
) -> Result<fs::File, StoreError> {
    let step = |name: &str| match fault {
        Some(f) => f(&format!("{what}.{name}")).map_err(io(path)),
        None => Ok(()),
    };
    let dir = path.parent().unwrap_or(Path::new("."));
    step("write")?;
    let mut tmp = tempfile::NamedTempFile::new_in(dir).map_err(io(dir))?;
    tmp.write_all(bytes).map_err(io(path))?;
    tmp.as_file().sync_all().map_err(io(path))?;
    step("rename")?;
    let file = tmp.persist(path).map_err(|e| StoreError::Io {
        path: path.to_path_buf(),
        source: e.error,
    })?;
    step("sync-dir")?;
    sync_dir(dir).map_err(io(dir))?;
    Ok(file)
}

/// The bytes of file `path`, `None` if there is none.
fn read_if_any(path: &Path) -> Result<Option<Vec<u8>>, StoreError> {
    match fs::read(path) {
        Ok(bytes) => Ok(Some(bytes)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(io(path)(e)),
    }
}

impl DirStore {
    /// Opens (creating if needed) a store rooted at `root`.
    pub fn open(root: impl Into<PathBuf>) -> Result<Self, StoreError> {
        let root = root.into();
        for sub in ["blobs", "scripts"] {
            let p = root.join(sub);
            if !p.is_dir() {
                fs::create_dir_all(&p).map_err(io(&p))?;
                sync_dir(&root).map_err(io(&root))?;
            }
        }
        Ok(DirStore { root, fault: None })
    }

    /// The same store, with `hook` asked before each durable step of a
    /// write (see [`FaultHook`]).
    pub fn with_fault_hook(mut self, hook: FaultHook) -> Self {
        self.fault = Some(hook);
        self
    }

    /// The directory this store lives in.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The file of record `key`.
    pub fn record_path(&self, key: RecordKey<'_>) -> Result<PathBuf, StoreError> {
        Ok(self.root.join(key.path()?))
    }

    /// The file of the source with blake3 `hash`.
    pub fn blob_path(&self, hash: &str) -> Result<PathBuf, StoreError> {
        if !crate::store::meta::is_source_hash(hash) {
            return Err(StoreError::BadKey {
                key: hash.chars().take(80).collect(),
            });
        }
        Ok(self.root.join("blobs").join(format!("{hash}.wasm")))
    }

    /// Creates `dir` (a script's folder of records) durably if missing.
    fn ensure_dir(&self, dir: &Path) -> Result<(), StoreError> {
        if dir.is_dir() {
            return Ok(());
        }
        fs::create_dir_all(dir).map_err(io(dir))?;
        let mut parent = dir.parent();
        while let Some(p) = parent {
            sync_dir(p).map_err(io(p))?;
            if p == self.root {
                break;
            }
            parent = p.parent();
        }
        Ok(())
    }
}

/// The blocking operations behind [`DirStore`]'s [`ScriptStore`] methods,
/// which run them on Tokio's blocking pool.
impl DirStore {
    /// [`ScriptStore::put_blob`] on the calling thread.
    pub fn put_blob_blocking(&self, hash: &str, bytes: &[u8]) -> Result<(), StoreError> {
        let blob = self.blob_path(hash)?;
        // A blob already in place is reused only if it is intact (it was
        // written the same durable way, but disks do fail).
        let intact = fs::read(&blob).is_ok_and(|b| blake3::hash(&b).to_hex().as_str() == hash);
        if !intact {
            write_durable(&blob, bytes, "blob", self.fault.as_ref())?;
        }
        Ok(())
    }

    /// [`ScriptStore::get_blob`] on the calling thread.
    pub fn get_blob_blocking(&self, hash: &str) -> Result<Option<Vec<u8>>, StoreError> {
        read_if_any(&self.blob_path(hash)?)
    }

    /// [`ScriptStore::put_record`] on the calling thread.
    pub fn put_record_blocking(&self, key: RecordKey<'_>, bytes: &[u8]) -> Result<(), StoreError> {
        let path = self.record_path(key)?;
        if let Some(dir) = path.parent() {
            self.ensure_dir(dir)?;
        }
        write_durable(&path, bytes, key.kind.step(), self.fault.as_ref())?;
        Ok(())
    }

    /// [`ScriptStore::get_record`] on the calling thread.
    pub fn get_record_blocking(&self, key: RecordKey<'_>) -> Result<Option<Vec<u8>>, StoreError> {
        read_if_any(&self.record_path(key)?)
    }

    /// [`ScriptStore::delete_record`] on the calling thread.
    pub fn delete_record_blocking(&self, key: RecordKey<'_>) -> Result<(), StoreError> {
        let path = self.record_path(key)?;
        match fs::remove_file(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(io(&path)(e)),
        }
        let dir = path.parent().unwrap_or(&self.root);
        sync_dir(dir).map_err(io(dir))
    }

    /// [`ScriptStore::list_records`] on the calling thread.
    pub fn list_records_blocking(
        &self,
        kind: Kind,
        script_id: &str,
    ) -> Result<Vec<Listed>, StoreError> {
        let dir = match kind {
            Kind::Deployment => self.root.join(kind.dir()),
            _ => self
                .record_path(RecordKey::of(kind, script_id, "x"))?
                .parent()
                .map(Path::to_path_buf)
                .unwrap_or_else(|| self.root.clone()),
        };
        let entries = match fs::read_dir(&dir) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(io(&dir)(e)),
        };
        let mut out = Vec::new();
        for entry in entries {
            let entry = entry.map_err(io(&dir))?;
            let file_name = entry.file_name();
            let Some(name) = file_name.to_str().and_then(|n| n.strip_suffix(".json")) else {
                continue;
            };
            let named = match kind {
                Kind::Deployment => RecordKey::deployment(name),
                kind => RecordKey::of(kind, script_id, name),
            };
            if named.path().is_err() {
                continue;
            }
            let m = match entry.metadata() {
                Ok(m) => m,
                // Deleted between the listing and now.
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(e) => return Err(io(&entry.path())(e)),
            };
            out.push(Listed {
                name: name.to_string(),
                tag: format!("{}.{}.{}.{}", m.ino(), m.mtime(), m.mtime_nsec(), m.len()),
            });
        }
        Ok(out)
    }

    /// Runs `f` on this store on Tokio's blocking pool.
    async fn blocking<T: Send + 'static>(
        &self,
        f: impl FnOnce(&DirStore) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, StoreError> {
        let me = self.clone();
        tokio::task::spawn_blocking(move || f(&me))
            .await
            .map_err(|e| StoreError::Io {
                path: self.root.clone(),
                source: std::io::Error::other(format!("store task failed: {e}")),
            })?
    }
}

/// A [`RecordKey`] that owns its parts, to move onto the blocking pool.
struct OwnedKey {
    kind: Kind,
    script_id: String,
    name: String,
}

impl OwnedKey {
    fn of(key: RecordKey<'_>) -> Self {
        OwnedKey {
            kind: key.kind,
            script_id: key.script_id.to_string(),
            name: key.name.to_string(),
        }
    }

    fn key(&self) -> RecordKey<'_> {
        RecordKey::of(self.kind, &self.script_id, &self.name)
    }
}

#[async_trait::async_trait]
impl ScriptStore for DirStore {
    async fn put_blob(&self, hash: &str, bytes: &[u8]) -> Result<(), StoreError> {
        let (hash, bytes) = (hash.to_string(), bytes.to_vec());
        self.blocking(move |s| s.put_blob_blocking(&hash, &bytes))
            .await
    }

    async fn get_blob(&self, hash: &str) -> Result<Option<Vec<u8>>, StoreError> {
        let hash = hash.to_string();
        self.blocking(move |s| s.get_blob_blocking(&hash)).await
    }

    async fn put_record(&self, key: RecordKey<'_>, bytes: &[u8]) -> Result<(), StoreError> {
        let (key, bytes) = (OwnedKey::of(key), bytes.to_vec());
        self.blocking(move |s| s.put_record_blocking(key.key(), &bytes))
            .await
    }

    async fn get_record(&self, key: RecordKey<'_>) -> Result<Option<Vec<u8>>, StoreError> {
        let key = OwnedKey::of(key);
        self.blocking(move |s| s.get_record_blocking(key.key()))
            .await
    }

    async fn delete_record(&self, key: RecordKey<'_>) -> Result<(), StoreError> {
        let key = OwnedKey::of(key);
        self.blocking(move |s| s.delete_record_blocking(key.key()))
            .await
    }

    async fn list_records(&self, kind: Kind, script_id: &str) -> Result<Vec<Listed>, StoreError> {
        let id = script_id.to_string();
        self.blocking(move |s| s.list_records_blocking(kind, &id))
            .await
    }

    fn location(&self) -> String {
        self.root.display().to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_are_kept_by_kind_and_name_and_keys_stay_inside_the_store() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = DirStore::open(dir.path()).expect("open");
        let v3 = RecordKey::of(Kind::Version, "app", "3");
        store.put_record_blocking(v3, b"three").expect("put");
        store
            .put_record_blocking(RecordKey::deployment("app"), b"current")
            .expect("put");
        assert_eq!(
            store.get_record_blocking(v3).expect("get").as_deref(),
            Some(&b"three"[..])
        );
        assert!(dir.path().join("versions/app/3.json").is_file());
        assert!(dir.path().join("scripts/app.json").is_file());
        let listed = store
            .list_records_blocking(Kind::Version, "app")
            .expect("list");
        assert_eq!(listed.len(), 1);
        assert_eq!(listed[0].name, "3");
        // Written again: the tag changes.
        store.put_record_blocking(v3, b"three").expect("put");
        let again = store
            .list_records_blocking(Kind::Version, "app")
            .expect("list");
        assert_ne!(listed[0].tag, again[0].tag);
        let scripts = store
            .list_records_blocking(Kind::Deployment, "")
            .expect("list");
        assert_eq!(
            scripts.iter().map(|l| l.name.as_str()).collect::<Vec<_>>(),
            ["app"]
        );
        store.delete_record_blocking(v3).expect("delete");
        store
            .delete_record_blocking(v3)
            .expect("deleting nothing is fine");
        assert!(store.get_record_blocking(v3).expect("get").is_none());
        for bad in [
            RecordKey::of(Kind::Version, "../etc", "3"),
            RecordKey::of(Kind::Secret, "app", "../x"),
            RecordKey::of(Kind::Secret, "app", ""),
            RecordKey::of(Kind::Deployment, "app", "x"),
        ] {
            assert!(
                matches!(
                    store.get_record_blocking(bad),
                    Err(StoreError::BadKey { .. })
                ),
                "{bad:?}"
            );
        }
        assert!(matches!(
            store.get_blob_blocking("../x"),
            Err(StoreError::BadKey { .. })
        ));
    }

    #[test]
    fn a_damaged_blob_is_rewritten() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = DirStore::open(dir.path()).expect("open");
        let hash = blake3::hash(b"one").to_hex().to_string();
        store.put_blob_blocking(&hash, b"one").expect("put");
        fs::write(store.blob_path(&hash).expect("path"), b"evil").expect("damage");
        store.put_blob_blocking(&hash, b"one").expect("put");
        assert_eq!(
            store.get_blob_blocking(&hash).expect("get").as_deref(),
            Some(&b"one"[..])
        );
    }
}
