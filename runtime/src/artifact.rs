//! Precompiled artifacts: compiled Workers cached on disk, authenticated.
//!
//! Compiling a large component takes seconds; loading its compiled artifact
//! takes about a millisecond. So every compile is serialized to
//! `DIR/<source-hash>-<engine>.cwasm`, and a restarted node (or another node
//! sharing the directory) loads it instead of compiling.
//!
//! Loading an artifact maps native code into the process, so an artifact is
//! trusted only if it carries a valid keyed blake3 MAC under the node's (or
//! cluster's) secret, computed over the engine fingerprint, the source hash
//! and the artifact bytes. A tampered or foreign artifact fails the check, is
//! deleted and counted, and the source is compiled again. The MAC is
//! verified on the same bytes that are then deserialized, so a file swapped
//! between the check and the load cannot slip through.

use std::hash::Hasher;
use std::path::{Path, PathBuf};

use wasmtime::Engine;
use wasmtime::component::Component;

use crate::script_store::write_atomic;

const MAC_LEN: usize = 32;

/// A file-backed cache of compiled components, keyed by source hash.
#[derive(Clone)]
pub struct ArtifactCache {
    dir: PathBuf,
    key: [u8; 32],
    engine_id: String,
}

/// What happened when an artifact was looked up.
pub enum Lookup {
    /// A valid artifact was loaded.
    Loaded(Component),
    /// There is none for this source and engine.
    Missing,
    /// One was there but failed authentication or loading; it was deleted.
    Rejected(String),
}

/// Feeds `Hash` output into blake3, giving a fingerprint stable across runs.
struct Blake3Hasher(blake3::Hasher);

impl Hasher for Blake3Hasher {
    fn finish(&self) -> u64 {
        let h = self.0.finalize();
        let mut b = [0u8; 8];
        b.copy_from_slice(&h.as_bytes()[..8]);
        u64::from_le_bytes(b)
    }
    fn write(&mut self, bytes: &[u8]) {
        self.0.update(bytes);
    }
}

impl ArtifactCache {
    /// A cache in `dir` (created if needed) for artifacts of `engine`,
    /// authenticated with `key`.
    pub fn new(dir: impl Into<PathBuf>, key: [u8; 32], engine: &Engine) -> std::io::Result<Self> {
        let dir = dir.into();
        std::fs::create_dir_all(&dir)?;
        let mut h = Blake3Hasher(blake3::Hasher::new());
        std::hash::Hash::hash(&engine.precompile_compatibility_hash(), &mut h);
        Ok(ArtifactCache {
            dir,
            key,
            engine_id: format!("{:016x}", h.finish()),
        })
    }

    /// The path of the artifact for source `hash`.
    pub fn path(&self, hash: &str) -> PathBuf {
        self.dir.join(format!("{hash}-{}.cwasm", self.engine_id))
    }

    fn mac(&self, hash: &str, bytes: &[u8]) -> blake3::Hash {
        let mut h = blake3::Hasher::new_keyed(&self.key);
        h.update(self.engine_id.as_bytes());
        h.update(b"\0");
        h.update(hash.as_bytes());
        h.update(b"\0");
        h.update(bytes);
        h.finalize()
    }

    /// Loads the artifact for source `hash` if one exists and authenticates.
    pub fn load(&self, engine: &Engine, hash: &str) -> Lookup {
        let path = self.path(hash);
        let file = match std::fs::read(&path) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Lookup::Missing,
            Err(e) => return Lookup::Rejected(format!("cannot read {}: {e}", path.display())),
        };
        let reject = |why: String| {
            let _ = std::fs::remove_file(&path);
            Lookup::Rejected(why)
        };
        if file.len() < MAC_LEN {
            return reject("artifact is truncated".into());
        }
        let (tag, bytes) = file.split_at(MAC_LEN);
        let Ok(tag) = <[u8; MAC_LEN]>::try_from(tag) else {
            return reject("artifact is truncated".into());
        };
        // `blake3::Hash` equality is constant-time.
        if self.mac(hash, bytes) != blake3::Hash::from_bytes(tag) {
            return reject(format!(
                "artifact {} failed authentication (tampered, or made by another cluster)",
                path.display()
            ));
        }
        // SAFETY: the bytes were produced by `Component::serialize` on an
        // engine with the same compatibility hash, under our secret key (the
        // MAC above proves both), and are the very bytes we verified.
        match unsafe { Component::deserialize(engine, bytes) } {
            Ok(c) => Lookup::Loaded(c),
            Err(e) => reject(format!("artifact does not load: {e}")),
        }
    }

    /// Serializes `component` (compiled from source `hash`) into the cache.
    pub fn store(&self, hash: &str, component: &Component) -> Result<(), String> {
        let bytes = component.serialize().map_err(|e| e.to_string())?;
        let mut file = Vec::with_capacity(MAC_LEN + bytes.len());
        file.extend_from_slice(self.mac(hash, &bytes).as_bytes());
        file.extend_from_slice(&bytes);
        write_atomic(&self.path(hash), &file).map_err(|e| e.to_string())
    }

    /// The directory artifacts are kept in.
    pub fn dir(&self) -> &Path {
        &self.dir
    }
}
