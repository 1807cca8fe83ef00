//! Precompiled artifacts: compiled Workers cached on disk, authenticated.
//!
//! Compiling a large component takes seconds; loading its compiled artifact
//! takes milliseconds. So every compile is serialized to
//! `DIR/<source-hash>-<engine>.cwasm`, and a restarted node (or another node
//! sharing the directory) loads it instead of compiling.
//!
//! Loading an artifact maps native code into the process, so an artifact is
//! trusted only if it carries a valid keyed blake3 MAC under the node's (or
//! cluster's) secret, computed over the engine fingerprint, the source hash
//! and the artifact bytes. A tampered or foreign artifact fails the check, is
//! deleted and counted, and the source is compiled again.
//!
//! ## File format and the cost of a load
//!
//! A file is wasmtime's serialized ELF image followed by a 40-byte trailer,
//! the 32-byte MAC and the magic `HEARTHM1`. ELF readers ignore bytes past
//! the section headers, so wasmtime maps the file itself
//! ([`Component::deserialize_file`]): code and copy-on-write memory images
//! come straight from the page cache, nothing is copied.
//!
//! The MAC is checked once per *file*, not once per load: the file is
//! mapped (not read) and hashed on every core, and its identity (device,
//! inode, size, modification and change times, which user space cannot set
//! back) is remembered. A later load whose file has the same identity skips
//! the hash; any write or replacement changes the identity and the file is
//! verified again. The identity is taken again after wasmtime has mapped
//! the file, so a file swapped in between is never used. An artifact this
//! node wrote itself is remembered as verified when it is written.
//!
//! Because a loaded Worker's code *is* the mapped file, artifacts are only
//! ever replaced by writing a new file and renaming it over the old one
//! (what [`ArtifactCache::store`] does). Truncating or rewriting a mapped
//! artifact in place (`cp` over it, say) would fault the node (SIGBUS) the
//! next time that code runs; operators must not do it.
//!
//! ## Ahead of a rollout
//!
//! The engine fingerprint changes with the hearth build (wasmtime version,
//! its settings), so a node on a new build finds no artifact of its own
//! and would compile every Worker on its first request.
//! [`Runtime::precompile`](crate::Runtime::precompile) (`hearth precompile
//! --all`, run with the new binary before the rollout) fills the cache,
//! and a store that shares artifacts (S3) hands them to every node, which
//! then loads on its first request ([`Precompiled`]).

use std::collections::HashMap;
use std::fs::File;
use std::hash::Hasher;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use wasmtime::Engine;
use wasmtime::component::Component;

use crate::store::script_store::write_atomic;

const MAC_LEN: usize = 32;
const MAGIC: &[u8; 8] = b"HEARTHM1";
const TRAILER_LEN: usize = MAC_LEN + MAGIC.len();

/// A file-backed cache of compiled components, keyed by source hash.
#[derive(Clone)]
pub struct ArtifactCache {
    dir: PathBuf,
    key: [u8; 32],
    engine_id: String,
    verified: Arc<Mutex<HashMap<PathBuf, Stamp>>>,
}

/// What happened when an artifact was looked up.
pub enum Lookup {
    /// A valid artifact was loaded.
    Loaded(Component),
    /// There is none for this source and engine.
    Missing,
    /// One was there but failed authentication or loading (it was
    /// deleted), or it changed while loading (left alone).
    Rejected(String),
}

/// The identity of one version of a file: any write or replacement changes
/// it (the change time cannot be set from user space).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Stamp {
    dev: u64,
    ino: u64,
    len: u64,
    mtime: (i64, i64),
    ctime: (i64, i64),
}

impl Stamp {
    fn of(m: &std::fs::Metadata) -> Stamp {
        Stamp {
            dev: m.dev(),
            ino: m.ino(),
            len: m.len(),
            mtime: (m.mtime(), m.mtime_nsec()),
            ctime: (m.ctime(), m.ctime_nsec()),
        }
    }
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
            verified: Arc::default(),
        })
    }

    /// The path of the artifact for source `hash`.
    pub fn path(&self, hash: &str) -> PathBuf {
        self.dir.join(self.file_name(hash))
    }

    /// The file name of the artifact for source `hash`: the source hash
    /// and the engine fingerprint, so that builds that cannot load each
    /// other's code never share an artifact (also its name in a store
    /// that shares artifacts).
    pub fn file_name(&self, hash: &str) -> String {
        format!("{hash}-{}.cwasm", self.engine_id)
    }

    fn mac(&self, hash: &str, bytes: &[u8]) -> blake3::Hash {
        let mut h = blake3::Hasher::new_keyed(&self.key);
        h.update(self.engine_id.as_bytes());
        h.update(b"\0");
        h.update(hash.as_bytes());
        h.update(b"\0");
        // Large artifacts (tens of MB for a JS Worker) hash on every core.
        if bytes.len() > 1 << 20 {
            h.update_rayon(bytes);
        } else {
            h.update(bytes);
        }
        h.finalize()
    }

    fn verified(&self) -> std::sync::MutexGuard<'_, HashMap<PathBuf, Stamp>> {
        self.verified.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Checks the MAC of the open artifact `file` of source `hash`.
    fn authenticate(&self, hash: &str, file: &File) -> Result<(), String> {
        // SAFETY: the map is read-only and private, and only read here;
        // a concurrent writer could change what we read, which at worst
        // fails the check (the identity check after loading catches the
        // rest).
        let map =
            unsafe { memmap2::Mmap::map(file) }.map_err(|e| format!("cannot map artifact: {e}"))?;
        let Some(body_len) = map.len().checked_sub(TRAILER_LEN) else {
            return Err("artifact is truncated".into());
        };
        let (body, trailer) = map.split_at(body_len);
        let (tag, magic) = trailer.split_at(MAC_LEN);
        if magic != MAGIC {
            return Err("artifact has no hearth trailer (an older format?)".into());
        }
        let tag = <[u8; MAC_LEN]>::try_from(tag).map_err(|_| "artifact is truncated")?;
        // `blake3::Hash` equality is constant-time.
        if self.mac(hash, body) != blake3::Hash::from_bytes(tag) {
            return Err(
                "artifact failed authentication (tampered, or made by another cluster)".into(),
            );
        }
        Ok(())
    }

    /// Loads the artifact for source `hash` if one exists and authenticates.
    /// A `hash` that is not a source hash
    /// ([`is_source_hash`](crate::store::meta::is_source_hash)) is
    /// refused without touching a file: it would name a path outside the
    /// cache.
    pub fn load(&self, engine: &Engine, hash: &str) -> Lookup {
        if !crate::store::meta::is_source_hash(hash) {
            return Lookup::Rejected(format!("{hash:?} is not a source hash"));
        }
        let path = self.path(hash);
        let file = match File::open(&path) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Lookup::Missing,
            Err(e) => return Lookup::Rejected(format!("cannot open {}: {e}", path.display())),
        };
        let stamp = match file.metadata() {
            Ok(m) => Stamp::of(&m),
            Err(e) => return Lookup::Rejected(format!("cannot stat {}: {e}", path.display())),
        };
        let reject = |why: String| {
            self.verified().remove(&path);
            let _ = std::fs::remove_file(&path);
            Lookup::Rejected(format!("{}: {why}", path.display()))
        };
        let known = self.verified().get(&path) == Some(&stamp);
        if !known {
            if let Err(why) = self.authenticate(hash, &file) {
                return reject(why);
            }
            self.verified().insert(path.clone(), stamp);
        }
        // SAFETY: the file was produced by `Component::serialize` on an
        // engine with the same compatibility hash, under our secret key (the
        // MAC proves both), and it is still that very file: its identity is
        // checked below, after wasmtime has mapped it.
        let component = match unsafe { Component::deserialize_file(engine, &path) } {
            Ok(c) => c,
            Err(e) => return reject(format!("artifact does not load: {e}")),
        };
        match std::fs::metadata(&path) {
            Ok(m) if Stamp::of(&m) == stamp => Lookup::Loaded(component),
            // Replaced while loading (another node writing the same
            // artifact, or worse): do not use what was mapped, and do not
            // delete a file we did not check.
            _ => {
                self.verified().remove(&path);
                Lookup::Rejected(format!("{} changed while loading", path.display()))
            }
        }
    }

    /// Serializes `component` (compiled from source `hash`) into the cache;
    /// a `hash` that is not a source hash is refused, as in
    /// [`ArtifactCache::load`].
    pub fn store(&self, hash: &str, component: &Component) -> Result<(), ArtifactWriteError> {
        if !crate::store::meta::is_source_hash(hash) {
            return Err(ArtifactWriteError::Write(
                crate::error::StoreError::BadHash {
                    path: self.dir.clone(),
                    hash: hash.chars().take(80).collect(),
                },
            ));
        }
        let mut bytes = component
            .serialize()
            .map_err(ArtifactWriteError::Serialize)?;
        let tag = self.mac(hash, &bytes);
        bytes.extend_from_slice(tag.as_bytes());
        bytes.extend_from_slice(MAGIC);
        let path = self.path(hash);
        let file = write_atomic(&path, &bytes).map_err(ArtifactWriteError::Write)?;
        if let Ok(m) = file.metadata() {
            self.verified().insert(path, Stamp::of(&m));
        }
        Ok(())
    }

    /// The source hashes that have an artifact of another engine (an
    /// earlier hearth build) in this cache but none of this engine, newest
    /// first: Workers this node compiled or loaded before an upgrade and
    /// has not yet on this build. Empty if the cache cannot be read.
    pub fn other_engine_hashes(&self) -> Vec<String> {
        let Ok(entries) = std::fs::read_dir(&self.dir) else {
            return Vec::new();
        };
        let mut own = std::collections::HashSet::new();
        let mut found: Vec<(std::time::SystemTime, String)> = Vec::new();
        for entry in entries.flatten() {
            let Ok(name) = entry.file_name().into_string() else {
                continue;
            };
            let Some((hash, engine)) = name
                .strip_suffix(".cwasm")
                .and_then(|stem| stem.rsplit_once('-'))
            else {
                continue;
            };
            if !crate::store::meta::is_source_hash(hash) {
                continue;
            }
            if engine == self.engine_id {
                own.insert(hash.to_string());
                continue;
            }
            let modified = entry
                .metadata()
                .and_then(|m| m.modified())
                .unwrap_or(std::time::UNIX_EPOCH);
            found.push((modified, hash.to_string()));
        }
        found.sort_by(|a, b| b.0.cmp(&a.0).then_with(|| a.1.cmp(&b.1)));
        found
            .into_iter()
            .filter_map(|(_, h)| own.insert(h.clone()).then_some(h))
            .collect()
    }

    /// The directory artifacts are kept in.
    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

/// What [`Runtime::precompile`](crate::Runtime::precompile) found or did
/// for one Worker: after any of these, a node on this engine loads the
/// Worker's artifact on its first request instead of compiling it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Precompiled {
    /// Its artifact for this engine was already in the local cache.
    Cached,
    /// The store shared one (another node compiled it): now cached here.
    Fetched,
    /// Compiled now, cached here and shared through the store.
    Compiled,
}

impl std::fmt::Display for Precompiled {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Precompiled::Cached => "already cached",
            Precompiled::Fetched => "fetched from the store",
            Precompiled::Compiled => "compiled",
        })
    }
}

/// Why [`ArtifactCache::store`] could not write an artifact (the Worker
/// still runs; the next cold start compiles again).
#[derive(Debug, thiserror::Error)]
pub enum ArtifactWriteError {
    /// wasmtime could not serialize the compiled component.
    #[error("{0}")]
    Serialize(wasmtime::Error),
    /// The file could not be written.
    #[error(transparent)]
    Write(#[from] crate::error::StoreError),
}
