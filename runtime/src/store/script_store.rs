//! Where Worker sources live: the [`ScriptStore`] trait and its default, a
//! local directory content-addressed by blake3. For nodes that share no
//! disk, [`crate::store::s3_store::S3Store`] keeps the same layout in an
//! S3-compatible bucket.
//!
//! The trait is async: a store may be across the network. Nothing on a
//! warm request's path waits for it (a warm Worker is revalidated in the
//! background, see [`crate::Runtime`]).
//!
//! Layout of a [`DirStore`]:
//!
//! ```text
//! DIR/blobs/<blake3>.wasm        sources, named by their hash (immutable)
//! DIR/versions/<id>/<n>.json     version n of script <id>: its metadata as deployed (immutable)
//! DIR/scripts/<id>.json          the current deployment: the metadata of the version
//!                                serving (and the split, if several do)
//! ```
//!
//! Every deploy (and every secret change) is a new numbered version
//! ([`crate::store::versions`]): a deploy writes the blob first, then the
//! version's record, then replaces the current deployment with an atomic
//! rename, so a reader sees either the old version or the new one, never a
//! mix; a deploy that fails before the rename leaves the old version
//! serving (at worst a version record that never served, which the next
//! deploy's number replaces). A rollback or a split only replaces the
//! current deployment ([`ScriptStore::set_current`]): the versions it names
//! are on record already. A store written before versions existed has no
//! `versions/` and no number in its metadata: its script is version 1.
//! Several nodes may share one directory.
//!
//! Durability: every file is written to a temporary name, fsynced, renamed
//! into place, and then its directory is fsynced, blob before metadata. So
//! once `put` returns, a crash or power loss at any later point leaves the
//! new version, and a crash at any earlier point leaves the old one: the
//! metadata never survives without its blob. `tests/crash.rs` stops a
//! deploy at each step (a [`FaultHook`]) and checks exactly that.

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

use crate::error::StoreError;
use crate::store::meta::ScriptMeta;

/// A place to keep Worker sources. Implementations must make [`put`]
/// atomic per script ID: a reader sees the old version or the new one.
///
/// [`put`]: ScriptStore::put
#[async_trait::async_trait]
pub trait ScriptStore: Send + Sync + 'static {
    /// Stores `source` under `meta.script_id`, replacing any earlier version
    /// atomically: the blob, then (if `meta.version` is set) the version's
    /// record, then the current deployment.
    async fn put(&self, meta: &ScriptMeta, source: &[u8]) -> Result<(), StoreError>;
    /// Records version `meta.version` of `meta.script_id` (its blob must be
    /// stored already), written atomically like the current deployment.
    async fn put_version(&self, meta: &ScriptMeta) -> Result<(), StoreError>;
    /// Replaces the current deployment of `meta.script_id` with `meta`
    /// atomically (a rollback or a split: the versions it names are on
    /// record, their blobs stored).
    async fn set_current(&self, meta: &ScriptMeta) -> Result<(), StoreError>;
    /// The recorded versions of `script_id`, lowest number first (none for
    /// a script deployed before versions existed).
    async fn versions(&self, script_id: &str) -> Result<Vec<ScriptMeta>, StoreError>;
    /// Version `version` of `script_id` and its source, if recorded; the
    /// source is checked against its hash.
    async fn get_version(
        &self,
        script_id: &str,
        version: u64,
    ) -> Result<Option<(ScriptMeta, Vec<u8>)>, StoreError>;
    /// The metadata of `script_id`, if deployed.
    async fn meta(&self, script_id: &str) -> Result<Option<ScriptMeta>, StoreError>;
    /// The metadata and source of `script_id`, if deployed; the source is
    /// checked against its hash.
    async fn get(&self, script_id: &str) -> Result<Option<(ScriptMeta, Vec<u8>)>, StoreError>;
    /// Every deployed script's metadata.
    async fn list(&self) -> Result<Vec<ScriptMeta>, StoreError>;
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

/// The store a runtime reads through: `inner`, with every metadata read it
/// refuses ([`StoreError::BadHash`]) counted in the runtime's stats
/// (`store_metadata_rejected`, in `/metrics`).
pub(crate) struct Counted {
    /// The store.
    pub(crate) inner: std::sync::Arc<dyn ScriptStore>,
    /// Where refusals are counted.
    pub(crate) stats: std::sync::Arc<crate::stats::Stats>,
}

impl Counted {
    fn count<T>(&self, r: Result<T, StoreError>) -> Result<T, StoreError> {
        if let Err(StoreError::BadHash { path, hash }) = &r {
            crate::stats::Stats::bump(&self.stats.store_metadata_rejected);
            tracing::warn!(path = %path.display(), hash, "script metadata refused: its hash is not a source hash");
        }
        r
    }
}

#[async_trait::async_trait]
impl ScriptStore for Counted {
    async fn put(&self, meta: &ScriptMeta, source: &[u8]) -> Result<(), StoreError> {
        self.inner.put(meta, source).await
    }
    async fn put_version(&self, meta: &ScriptMeta) -> Result<(), StoreError> {
        self.inner.put_version(meta).await
    }
    async fn set_current(&self, meta: &ScriptMeta) -> Result<(), StoreError> {
        self.inner.set_current(meta).await
    }
    async fn versions(&self, script_id: &str) -> Result<Vec<ScriptMeta>, StoreError> {
        self.count(self.inner.versions(script_id).await)
    }
    async fn get_version(
        &self,
        script_id: &str,
        version: u64,
    ) -> Result<Option<(ScriptMeta, Vec<u8>)>, StoreError> {
        self.count(self.inner.get_version(script_id, version).await)
    }
    async fn meta(&self, script_id: &str) -> Result<Option<ScriptMeta>, StoreError> {
        self.count(self.inner.meta(script_id).await)
    }
    async fn get(&self, script_id: &str) -> Result<Option<(ScriptMeta, Vec<u8>)>, StoreError> {
        self.count(self.inner.get(script_id).await)
    }
    async fn list(&self) -> Result<Vec<ScriptMeta>, StoreError> {
        self.count(self.inner.list().await)
    }
    async fn get_artifact(&self, name: &str) -> Result<Option<bytes::Bytes>, StoreError> {
        self.inner.get_artifact(name).await
    }
    async fn put_artifact(&self, name: &str, bytes: bytes::Bytes) -> Result<(), StoreError> {
        self.inner.put_artifact(name, bytes).await
    }
    fn keeps_artifacts(&self) -> bool {
        self.inner.keeps_artifacts()
    }
    fn location(&self) -> String {
        self.inner.location()
    }
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

/// Called with the name of each durable step of a [`DirStore::put`] before
/// it is taken (`blob.write`, `blob.rename`, `blob.sync-dir`, `meta.write`,
/// `meta.rename`, `meta.sync-dir`); an error stops the deploy there, as a
/// crash would. For crash-injection tests.
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
    /// deploy (see [`FaultHook`]).
    pub fn with_fault_hook(mut self, hook: FaultHook) -> Self {
        self.fault = Some(hook);
        self
    }

    /// The directory this store lives in.
    pub fn root(&self) -> &Path {
        &self.root
    }

    fn meta_path(&self, id: &str) -> PathBuf {
        self.root.join("scripts").join(format!("{id}.json"))
    }

    fn version_dir(&self, id: &str) -> PathBuf {
        self.root.join("versions").join(id)
    }

    fn version_path(&self, id: &str, version: u64) -> PathBuf {
        self.version_dir(id).join(format!("{version}.json"))
    }

    fn blob_path(&self, hash: &str) -> PathBuf {
        self.root.join("blobs").join(format!("{hash}.wasm"))
    }

    fn read_meta(path: &Path) -> Result<Option<ScriptMeta>, StoreError> {
        match fs::read(path) {
            Ok(bytes) => ScriptMeta::parse(path, &bytes).map(Some),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(io(path)(e)),
        }
    }
}

/// The blocking operations behind [`DirStore`]'s [`ScriptStore`] methods,
/// which run them on Tokio's blocking pool.
impl DirStore {
    /// [`ScriptStore::put`] on the calling thread.
    pub fn put_blocking(&self, meta: &ScriptMeta, source: &[u8]) -> Result<(), StoreError> {
        let blob = self.blob_path(&meta.hash);
        // A blob already in place is reused only if it is intact (it was
        // written the same durable way, but disks do fail).
        let intact = fs::read(&blob).is_ok_and(|b| blake3::hash(&b).to_hex().as_str() == meta.hash);
        if !intact {
            write_durable(&blob, source, "blob", self.fault.as_ref())?;
        }
        if meta.version > 0 {
            self.put_version_blocking(meta)?;
        }
        self.set_current_blocking(meta)
    }

    /// [`ScriptStore::put_version`] on the calling thread.
    pub fn put_version_blocking(&self, meta: &ScriptMeta) -> Result<(), StoreError> {
        let dir = self.version_dir(&meta.script_id);
        if !dir.is_dir() {
            fs::create_dir_all(&dir).map_err(io(&dir))?;
            let parent = dir.parent().unwrap_or(&self.root);
            sync_dir(parent).map_err(io(parent))?;
            sync_dir(&self.root).map_err(io(&self.root))?;
        }
        // A version record carries no split: that belongs to a deployment.
        let record = ScriptMeta {
            split: Vec::new(),
            ..meta.clone()
        };
        let path = self.version_path(&meta.script_id, meta.version);
        let json = serde_json::to_vec_pretty(&record).map_err(|e| StoreError::Corrupt {
            path: path.clone(),
            message: e.to_string(),
        })?;
        write_durable(&path, &json, "version", self.fault.as_ref())?;
        Ok(())
    }

    /// [`ScriptStore::set_current`] on the calling thread.
    pub fn set_current_blocking(&self, meta: &ScriptMeta) -> Result<(), StoreError> {
        let path = self.meta_path(&meta.script_id);
        let json = serde_json::to_vec_pretty(meta).map_err(|e| StoreError::Corrupt {
            path: path.clone(),
            message: e.to_string(),
        })?;
        write_durable(&path, &json, "meta", self.fault.as_ref())?;
        Ok(())
    }

    /// [`ScriptStore::versions`] on the calling thread.
    pub fn versions_blocking(&self, script_id: &str) -> Result<Vec<ScriptMeta>, StoreError> {
        if !crate::store::validate::valid_script_id(script_id) {
            return Ok(Vec::new());
        }
        let dir = self.version_dir(script_id);
        let entries = match fs::read_dir(&dir) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(io(&dir)(e)),
        };
        let mut out = Vec::new();
        for entry in entries {
            let path = entry.map_err(io(&dir))?.path();
            if path.extension().is_some_and(|e| e == "json")
                && let Some(meta) = Self::read_meta(&path)?
            {
                out.push(meta);
            }
        }
        out.sort_by_key(|m| m.version);
        Ok(out)
    }

    /// [`ScriptStore::get_version`] on the calling thread.
    pub fn get_version_blocking(
        &self,
        script_id: &str,
        version: u64,
    ) -> Result<Option<(ScriptMeta, Vec<u8>)>, StoreError> {
        if !crate::store::validate::valid_script_id(script_id) {
            return Ok(None);
        }
        let Some(meta) = Self::read_meta(&self.version_path(script_id, version))? else {
            return Ok(None);
        };
        self.with_source(meta).map(Some)
    }

    /// `meta` with its source, checked against its hash.
    fn with_source(&self, meta: ScriptMeta) -> Result<(ScriptMeta, Vec<u8>), StoreError> {
        let path = self.blob_path(&meta.hash);
        let source = fs::read(&path).map_err(io(&path))?;
        if blake3::hash(&source).to_hex().as_str() != meta.hash {
            return Err(StoreError::HashMismatch {
                script_id: meta.script_id,
                hash: meta.hash,
            });
        }
        Ok((meta, source))
    }

    /// [`ScriptStore::meta`] on the calling thread.
    pub fn meta_blocking(&self, script_id: &str) -> Result<Option<ScriptMeta>, StoreError> {
        if !crate::store::validate::valid_script_id(script_id) {
            return Ok(None);
        }
        Self::read_meta(&self.meta_path(script_id))
    }

    /// [`ScriptStore::get`] on the calling thread.
    pub fn get_blocking(
        &self,
        script_id: &str,
    ) -> Result<Option<(ScriptMeta, Vec<u8>)>, StoreError> {
        let Some(meta) = self.meta_blocking(script_id)? else {
            return Ok(None);
        };
        self.with_source(meta).map(Some)
    }

    /// [`ScriptStore::list`] on the calling thread.
    pub fn list_blocking(&self) -> Result<Vec<ScriptMeta>, StoreError> {
        let dir = self.root.join("scripts");
        let mut out = Vec::new();
        for entry in fs::read_dir(&dir).map_err(io(&dir))? {
            let path = entry.map_err(io(&dir))?.path();
            if path.extension().is_some_and(|e| e == "json")
                && let Some(meta) = Self::read_meta(&path)?
            {
                out.push(meta);
            }
        }
        out.sort_by(|a, b| a.script_id.cmp(&b.script_id));
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

#[async_trait::async_trait]
impl ScriptStore for DirStore {
    async fn put(&self, meta: &ScriptMeta, source: &[u8]) -> Result<(), StoreError> {
        let (meta, source) = (meta.clone(), source.to_vec());
        self.blocking(move |s| s.put_blocking(&meta, &source)).await
    }

    async fn put_version(&self, meta: &ScriptMeta) -> Result<(), StoreError> {
        let meta = meta.clone();
        self.blocking(move |s| s.put_version_blocking(&meta)).await
    }

    async fn set_current(&self, meta: &ScriptMeta) -> Result<(), StoreError> {
        let meta = meta.clone();
        self.blocking(move |s| s.set_current_blocking(&meta)).await
    }

    async fn versions(&self, script_id: &str) -> Result<Vec<ScriptMeta>, StoreError> {
        let id = script_id.to_string();
        self.blocking(move |s| s.versions_blocking(&id)).await
    }

    async fn get_version(
        &self,
        script_id: &str,
        version: u64,
    ) -> Result<Option<(ScriptMeta, Vec<u8>)>, StoreError> {
        let id = script_id.to_string();
        self.blocking(move |s| s.get_version_blocking(&id, version))
            .await
    }

    async fn meta(&self, script_id: &str) -> Result<Option<ScriptMeta>, StoreError> {
        let id = script_id.to_string();
        self.blocking(move |s| s.meta_blocking(&id)).await
    }

    async fn get(&self, script_id: &str) -> Result<Option<(ScriptMeta, Vec<u8>)>, StoreError> {
        let id = script_id.to_string();
        self.blocking(move |s| s.get_blocking(&id)).await
    }

    async fn list(&self) -> Result<Vec<ScriptMeta>, StoreError> {
        self.blocking(|s| s.list_blocking()).await
    }

    fn location(&self) -> String {
        self.root.display().to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::instances::lifecycle::LifecycleChoice;
    use crate::limits::Plan;
    use crate::outbound::bindings::Bindings;
    use std::collections::BTreeMap;

    fn meta(id: &str, src: &[u8]) -> ScriptMeta {
        ScriptMeta {
            script_id: id.into(),
            plan: Plan::Free,
            size: src.len() as u64,
            compressed_size: 0,
            hash: blake3::hash(src).to_hex().to_string(),
            deployed_at_ms: 1,
            lifecycle: LifecycleChoice::default(),
            bindings: Bindings::default(),
            vars: BTreeMap::new(),
            secrets: BTreeMap::new(),
            dispatch_only: false,
            version: 0,
            latest_version: 0,
            split: Vec::new(),
        }
    }

    #[test]
    fn put_replaces_and_get_verifies_hash() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = DirStore::open(dir.path()).expect("open");
        store.put_blocking(&meta("a", b"one"), b"one").expect("put");
        store.put_blocking(&meta("a", b"two"), b"two").expect("put");
        let (m, src) = store.get_blocking("a").expect("get").expect("present");
        assert_eq!(src, b"two");
        assert_eq!(m.hash, blake3::hash(b"two").to_hex().to_string());
        assert_eq!(store.list_blocking().expect("list").len(), 1);
        // Damage the blob: the store refuses to hand it out.
        fs::write(store.blob_path(&m.hash), b"evil").expect("write");
        assert!(matches!(
            store.get_blocking("a"),
            Err(StoreError::HashMismatch { .. })
        ));
        assert!(store.get_blocking("missing").expect("get").is_none());
        assert!(store.get_blocking("../etc").expect("get").is_none());
    }

    #[test]
    fn every_version_is_kept_and_the_current_deployment_can_point_back() {
        use crate::store::meta::Share;
        let dir = tempfile::tempdir().expect("tempdir");
        let store = DirStore::open(dir.path()).expect("open");
        let v = |n: u64, src: &[u8]| ScriptMeta {
            version: n,
            latest_version: n,
            ..meta("a", src)
        };
        store.put_blocking(&v(1, b"one"), b"one").expect("put");
        store.put_blocking(&v(2, b"two"), b"two").expect("put");
        let versions = store.versions_blocking("a").expect("versions");
        let numbers: Vec<u64> = versions.iter().map(|m| m.version).collect();
        assert_eq!(numbers, vec![1, 2]);
        let (m1, src) = store
            .get_version_blocking("a", 1)
            .expect("get")
            .expect("version 1");
        assert_eq!((m1.version, src.as_slice()), (1, &b"one"[..]));
        assert!(store.get_version_blocking("a", 3).expect("get").is_none());
        assert!(store.versions_blocking("../etc").expect("list").is_empty());
        // A split names version 1 first: its metadata becomes current, the
        // record of version 1 stays as it was (no split in it).
        let split = vec![
            Share {
                version: 1,
                percent: 10,
            },
            Share {
                version: 2,
                percent: 90,
            },
        ];
        let current = ScriptMeta {
            latest_version: 2,
            split: split.clone(),
            ..m1
        };
        store.set_current_blocking(&current).expect("set current");
        let (m, src) = store.get_blocking("a").expect("get").expect("current");
        assert_eq!(
            (m.version, m.split, src.as_slice()),
            (1, split, &b"one"[..])
        );
        let (m1, _) = store
            .get_version_blocking("a", 1)
            .expect("get")
            .expect("version 1");
        assert!(m1.split.is_empty());
        // Version records are not scripts.
        assert_eq!(store.list_blocking().expect("list").len(), 1);
    }
}
