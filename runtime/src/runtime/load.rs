//! Loading code: from the store's metadata to a Worker ready to serve.
//!
//! A Worker not resident here is loaded once, however many requests wait
//! for it: its metadata (one store read, shared, or the negative cache's
//! answer), then its code from the authenticated artifact (fetched from a
//! store that shares artifacts if this node has none), compiling the
//! source only when there is no valid artifact; then it is made resident.
//! During a split the script's other versions are loaded beside it on
//! first use.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use wasmtime::component::Component;

use crate::error::{CompileError, RuntimeError};
use crate::instances::lifecycle::{self, Lifecycle};
use crate::instances::worker::Worker;
use crate::stats::Stats;
use crate::store::artifact::{Lookup, Precompiled};
use crate::store::meta::{ScriptMeta, Sealed};
use crate::store::misses::Found;
use crate::timing::{CodeSource, Start, Timing};

use super::{Runtime, lock};

/// A Worker's code as [`Runtime::load_code`] found it.
struct LoadedCode {
    meta: ScriptMeta,
    component: Component,
    code_source: CodeSource,
    fetch: Duration,
    compile: Duration,
}

impl Runtime {
    /// Returns the resident Worker, or loads it (once, however many requests
    /// wait for it) and makes it resident. `by_prewarm`: the caller is a
    /// prewarm, not a request (a Worker it loads is marked so, and it does
    /// not take the mark).
    pub(super) async fn worker(
        &self,
        script_id: &str,
        timing: &mut Timing,
        by_prewarm: bool,
    ) -> Result<(Arc<Worker>, Start), RuntimeError> {
        let now = self.now_ms();
        let warm = lock(&self.inner.resident).get(script_id, now).cloned();
        if let Some(w) = warm {
            self.revalidate_in_background(&w, now);
            let start = if !by_prewarm && w.take_prewarmed() {
                Start::Prewarmed
            } else {
                Start::Warm
            };
            return Ok((w, start));
        }
        if self.inner.lookups.is_known_missing(script_id) {
            Stats::bump(&self.inner.stats.unknown_cached);
            return Err(RuntimeError::UnknownScript(script_id.into()));
        }
        let cell = lock(&self.inner.loading)
            .entry(script_id.to_string())
            .or_default()
            .clone();
        let mut loaded_here = false;
        let result = cell
            .get_or_try_init(|| async {
                loaded_here = true;
                let w = self.load(script_id, timing).await?;
                if by_prewarm {
                    w.mark_prewarmed();
                    Stats::bump(&self.inner.stats.prewarm_loads);
                }
                let ev = lock(&self.inner.resident).insert(
                    script_id.to_string(),
                    w.clone(),
                    w.bytes(),
                    self.now_ms(),
                );
                self.count(ev);
                Ok::<_, RuntimeError>(w)
            })
            .await
            .cloned();
        if loaded_here || result.is_ok() {
            let mut loading = lock(&self.inner.loading);
            if loading
                .get(script_id)
                .is_some_and(|c| Arc::ptr_eq(c, &cell))
            {
                loading.remove(script_id);
            }
        }
        let w = result?;
        // A request that waited for a prewarm's load did not load it either.
        let start = if !loaded_here && !by_prewarm && w.take_prewarmed() {
            Start::Prewarmed
        } else {
            Start::Cold
        };
        Ok((w, start))
    }

    /// Loads `script_id` from the store: its metadata, then its code from
    /// the authenticated artifact, reading the source only when there is no
    /// valid artifact (or the lifecycle still has to be decided from it).
    async fn load(
        &self,
        script_id: &str,
        timing: &mut Timing,
    ) -> Result<Arc<Worker>, RuntimeError> {
        let load_err = |message: String| RuntimeError::Load {
            script_id: script_id.into(),
            message,
        };
        let loaded = self.load_code(script_id).await?;
        timing.fetch = Some(loaded.fetch);
        timing.compile = Some(loaded.compile);
        timing.code_source = Some(loaded.code_source);
        if loaded.meta.split.is_empty() {
            // No split (any more): no per-version counts to keep.
            self.inner.versions.forget(script_id);
        }
        let t = Instant::now();
        let (meta, secrets) = self.with_secrets(loaded.meta).await?;
        timing.fetch = Some(loaded.fetch + t.elapsed());
        self.build_worker(meta, &secrets, &loaded.component)
            .map(Arc::new)
            .map_err(load_err)
    }

    /// `meta` with its script's secrets as the store holds them now (a
    /// secret belongs to the script, not to a version:
    /// [`crate::store::secrets`]), their names and tag set from the
    /// listing they were read from, so the Worker's revision is what it
    /// runs with.
    async fn with_secrets(
        &self,
        mut meta: ScriptMeta,
    ) -> Result<(ScriptMeta, BTreeMap<String, Sealed>), RuntimeError> {
        let id = meta.script_id.clone();
        let set = self
            .inner
            .store
            .secrets(&id)
            .await
            .map_err(|e| store_error(&id, &e))?;
        meta.secrets = set.values.keys().cloned().collect();
        meta.secrets_tag = set.tag;
        Ok((meta, set.values))
    }

    /// The code of [`Runtime::load`], timed by phase: reading from the
    /// store (and fetching a shared artifact) is *fetch*, loading the
    /// artifact or compiling is *compile*.
    async fn load_code(&self, script_id: &str) -> Result<LoadedCode, RuntimeError> {
        let inner = &self.inner;
        let load_err = |message: String| RuntimeError::Load {
            script_id: script_id.into(),
            message,
        };
        let store_err = |e: &crate::StoreError| store_error(script_id, e);
        let t = Instant::now();
        let meta = self
            .store_meta(script_id)
            .await
            .map_err(|e| store_err(&e))?
            .ok_or_else(|| RuntimeError::UnknownScript(script_id.into()))?;
        let mut fetch = t.elapsed();
        let t = Instant::now();
        let mut found = self.load_artifact_async(&meta.hash).await;
        let mut compile = t.elapsed();
        if found.is_none() && inner.store.keeps_artifacts() {
            let t = Instant::now();
            let fetched = self.fetch_artifact(&meta.hash).await;
            fetch += t.elapsed();
            if fetched {
                let t = Instant::now();
                found = self.load_artifact_async(&meta.hash).await;
                compile += t.elapsed();
            }
        }
        if let Some(component) = &found
            && meta.lifecycle.chosen != Lifecycle::Auto
        {
            return Ok(LoadedCode {
                meta,
                component: component.clone(),
                code_source: CodeSource::Artifact,
                fetch,
                compile,
            });
        }
        // No valid artifact (or metadata from before lifecycles were
        // recorded, whose lifecycle is decided from the source): the source
        // is needed after all.
        let t = Instant::now();
        Stats::bump(&inner.stats.store_reads);
        let (mut meta, source) = inner
            .store
            .get(script_id)
            .await
            .map_err(|e| store_err(&e))?
            .ok_or_else(|| RuntimeError::UnknownScript(script_id.into()))?;
        if meta.lifecycle.chosen == Lifecycle::Auto {
            meta.lifecycle = lifecycle::decide(meta.lifecycle.requested, &source);
        }
        fetch += t.elapsed();
        let (component, code_source) = match found {
            Some(c) => (c, CodeSource::Artifact),
            None => {
                let t = Instant::now();
                let rt = self.clone();
                let hash = meta.hash.clone();
                let c = tokio::task::spawn_blocking(move || rt.compile_source(&hash, &source))
                    .await
                    .map_err(|e| load_err(e.to_string()))?
                    .map_err(|e| load_err(e.to_string()))?;
                compile += t.elapsed();
                if inner.store.keeps_artifacts() {
                    // Shared in the background: this cold start does not
                    // wait for the upload.
                    let rt = self.clone();
                    let hash = meta.hash.clone();
                    tokio::spawn(async move { rt.share_artifact(&hash).await });
                }
                (c, CodeSource::Compiled)
            }
        };
        Ok(LoadedCode {
            meta,
            component,
            code_source,
            fetch,
            compile,
        })
    }

    /// A Worker of `meta`'s version with its script's `secrets`, from its
    /// compiled `component`.
    fn build_worker(
        &self,
        meta: ScriptMeta,
        secrets: &BTreeMap<String, Sealed>,
        component: &Component,
    ) -> Result<Worker, String> {
        let limits = *self.inner.config.limits(meta.plan);
        let mut reuse = self.inner.config.reuse;
        if !meta.lifecycle.reuses() {
            reuse.max_requests_per_instance = 1;
        }
        let env =
            crate::store::secrets::WorkerEnv::open(&meta, secrets, &self.inner.node.secrets_key)
                .map_err(|e| e.to_string())?;
        Worker::new(
            &self.inner.engine,
            &self.inner.linker,
            component,
            meta,
            env,
            limits,
            reuse,
            self.inner.node.clone(),
        )
        .map_err(|e| e.to_string())
    }

    /// Version `version` of the script `primary` is the current version of,
    /// during a split: loaded beside it on first use (once, however many
    /// requests wait), and whether this call loaded it.
    pub(super) async fn alt_worker(
        &self,
        primary: &Arc<Worker>,
        version: u64,
    ) -> Result<(Arc<Worker>, bool), RuntimeError> {
        let cell = lock(&primary.alts).entry(version).or_default().clone();
        let mut loaded = false;
        let w = cell
            .get_or_try_init(|| async {
                loaded = true;
                self.load_version(&primary.meta.script_id, version)
                    .await
                    .map(Arc::new)
            })
            .await?
            .clone();
        Ok((w, loaded))
    }

    /// Loads recorded version `version` of `script_id` (for a split).
    async fn load_version(&self, script_id: &str, version: u64) -> Result<Worker, RuntimeError> {
        let load_err = |message: String| RuntimeError::Load {
            script_id: script_id.into(),
            message,
        };
        let store_err = |e: crate::StoreError| store_error(script_id, &e);
        let store = &self.inner.store;
        Stats::bump(&self.inner.stats.store_reads);
        let found = match store.get_version(script_id, version).await {
            Ok(Some(found)) => Some(found),
            // Deployed before versions existed: version 1 is the current.
            Ok(None) if version == 1 => store
                .get(script_id)
                .await
                .map_err(store_err)?
                .filter(|(m, _)| m.version == 0),
            Ok(None) => None,
            Err(e) => return Err(store_err(e)),
        };
        let (mut meta, source) =
            found.ok_or_else(|| load_err(format!("version {version} is not recorded")))?;
        meta.split.clear();
        if meta.lifecycle.chosen == Lifecycle::Auto {
            meta.lifecycle = lifecycle::decide(meta.lifecycle.requested, &source);
        }
        let rt = self.clone();
        let hash = meta.hash.clone();
        let (component, _) = tokio::task::spawn_blocking(move || rt.compile(&hash, &source))
            .await
            .map_err(|e| load_err(e.to_string()))?
            .map_err(|e| load_err(e.to_string()))?;
        // Today's secrets, whichever version this is.
        let (meta, secrets) = self.with_secrets(meta).await?;
        self.build_worker(meta, &secrets, &component)
            .map_err(load_err)
    }

    /// The metadata of `script_id` as the store has it (`None`: no Worker
    /// is deployed under that name): from the negative cache, or one store
    /// read (counted in `store_reads`) shared by every concurrent lookup
    /// of the name ([`crate::store::misses`]).
    pub(super) async fn store_meta(
        &self,
        script_id: &str,
    ) -> Result<Option<ScriptMeta>, Arc<crate::StoreError>> {
        let inner = &self.inner;
        let found = inner
            .lookups
            .meta(script_id, || async {
                Stats::bump(&inner.stats.store_reads);
                inner.store.meta(script_id).await
            })
            .await;
        match found {
            Found::KnownMissing => {
                Stats::bump(&inner.stats.unknown_cached);
                Ok(None)
            }
            Found::Read(result) => result,
        }
    }

    /// Makes sure the current version of `script_id` has an artifact for
    /// this engine, in the local cache and (for a store that shares
    /// artifacts) in the store, so a node on this engine loads it on its
    /// first request instead of compiling ([`crate::store::artifact`]). Nothing is
    /// made resident. The compile runs on the blocking pool.
    pub async fn precompile(&self, script_id: &str) -> Result<Precompiled, RuntimeError> {
        let inner = &self.inner;
        let err = |message: String| RuntimeError::Load {
            script_id: script_id.into(),
            message,
        };
        let meta = self
            .store_meta(script_id)
            .await
            .map_err(|e| err(e.to_string()))?
            .ok_or_else(|| RuntimeError::UnknownScript(script_id.into()))?;
        if self.load_artifact_async(&meta.hash).await.is_some() {
            return Ok(Precompiled::Cached);
        }
        if inner.store.keeps_artifacts()
            && self.fetch_artifact(&meta.hash).await
            && self.load_artifact_async(&meta.hash).await.is_some()
        {
            return Ok(Precompiled::Fetched);
        }
        Stats::bump(&inner.stats.store_reads);
        let (meta, source) = inner
            .store
            .get(script_id)
            .await
            .map_err(|e| err(e.to_string()))?
            .ok_or_else(|| RuntimeError::UnknownScript(script_id.into()))?;
        let rt = self.clone();
        let hash = meta.hash.clone();
        tokio::task::spawn_blocking(move || rt.compile_source(&hash, &source))
            .await
            .map_err(|e| err(e.to_string()))?
            .map_err(|e| err(e.to_string()))?;
        if inner.store.keeps_artifacts() {
            self.share_artifact(&meta.hash).await;
        }
        Ok(Precompiled::Compiled)
    }

    /// The authenticated artifact of source `hash`, if there is one (a
    /// rejected one is counted and logged).
    fn load_artifact(&self, hash: &str) -> Option<Component> {
        let inner = &self.inner;
        match inner.artifacts.load(&inner.engine, hash) {
            Lookup::Loaded(c) => {
                Stats::bump(&inner.stats.artifact_loads);
                Some(c)
            }
            Lookup::Rejected(why) => {
                Stats::bump(&inner.stats.artifacts_rejected);
                tracing::warn!(hash, reason = %why, "precompiled artifact refused; recompiling");
                None
            }
            Lookup::Missing => None,
        }
    }

    /// [`Runtime::load_artifact`] on the blocking pool.
    async fn load_artifact_async(&self, hash: &str) -> Option<Component> {
        let rt = self.clone();
        let hash = hash.to_string();
        tokio::task::spawn_blocking(move || rt.load_artifact(&hash))
            .await
            .ok()
            .flatten()
    }

    /// Compiles `source`, or loads its authenticated artifact; a new
    /// compile is written to the artifact cache.
    pub(super) fn compile(
        &self,
        hash: &str,
        source: &[u8],
    ) -> Result<(Component, CodeSource), CompileError> {
        if let Some(c) = self.load_artifact(hash) {
            return Ok((c, CodeSource::Artifact));
        }
        Ok((self.compile_source(hash, source)?, CodeSource::Compiled))
    }

    /// Compiles `source` and writes its artifact to the cache.
    fn compile_source(&self, hash: &str, source: &[u8]) -> Result<Component, CompileError> {
        let inner = &self.inner;
        let component = Component::new(&inner.engine, source).map_err(CompileError::Compile)?;
        Stats::bump(&inner.stats.compiles);
        if let Err(e) = inner.artifacts.store(hash, &component) {
            tracing::warn!(hash, error = %e, "could not write precompiled artifact");
        }
        Ok(component)
    }

    /// Uploads the local artifact of source `hash` to the store, for the
    /// other nodes (a failure is logged: they compile instead).
    pub(super) async fn share_artifact(&self, hash: &str) {
        let path = self.inner.artifacts.path(hash);
        let name = self.inner.artifacts.file_name(hash);
        let bytes = match tokio::fs::read(&path).await {
            Ok(b) => b,
            Err(e) => {
                tracing::warn!(hash, error = %e, "no local artifact to share");
                return;
            }
        };
        if let Err(e) = self.inner.store.put_artifact(&name, bytes.into()).await {
            tracing::warn!(hash, error = %e, "could not share the precompiled artifact");
        }
    }

    /// Fetches the shared artifact of source `hash` from the store into the
    /// local cache (unauthenticated yet: loading checks it); whether one
    /// was there.
    async fn fetch_artifact(&self, hash: &str) -> bool {
        let name = self.inner.artifacts.file_name(hash);
        let bytes = match self.inner.store.get_artifact(&name).await {
            Ok(Some(b)) => b,
            Ok(None) => return false,
            Err(e) => {
                tracing::warn!(hash, error = %e, "could not fetch the shared artifact");
                return false;
            }
        };
        let path = self.inner.artifacts.path(hash);
        let written = tokio::task::spawn_blocking(move || {
            crate::store::script_store::write_atomic(&path, &bytes).map(|_| ())
        })
        .await;
        matches!(written, Ok(Ok(())))
    }
}

/// What a request is answered when the store failed while loading
/// `script_id`: 503 if it could not be reached, else the load failed.
fn store_error(script_id: &str, e: &crate::StoreError) -> RuntimeError {
    match e {
        crate::StoreError::Remote { .. } => RuntimeError::StoreUnavailable {
            script_id: script_id.into(),
            message: e.to_string(),
        },
        e => RuntimeError::Load {
            script_id: script_id.into(),
            message: e.to_string(),
        },
    }
}
