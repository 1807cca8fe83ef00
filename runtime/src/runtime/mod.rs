//! [`Runtime`]: one node's Workers. Deploys, cold and warm starts,
//! residency, counters.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde::Serialize;
use tokio::sync::OnceCell;
use wasmtime::Engine;
use wasmtime::component::{Component, Linker};

use crate::body::{self, Body};
use crate::config::RuntimeConfig;
use crate::error::StoreError;
use crate::error::{CompileError, ConfigError, RuntimeError};
use crate::eviction::{Evicted, EvictionCause, IDLE_SWEEP_EVERY, IdleRule, IdleSweeper, Residency};
use crate::flow::{FLOW_CPU_SPENT, REQUEST_ID_HEADER, UNKNOWN_SCRIPT_HEADER, request_id};
use crate::instances::cpu::CpuObserver;
use crate::instances::engine::{build_engine, build_linker};
use crate::instances::epoch::EpochTicker;
use crate::instances::host::Host;
use crate::instances::lifecycle::{self, Lifecycle};
use crate::instances::worker::{NodeShared, Worker, link};
use crate::limits::Plan;
use crate::stats::{Stats, StatsSnapshot};
use crate::store::artifact::{ArtifactCache, Lookup, Precompiled};
use crate::store::manifest::Manifest;
use crate::store::meta::{ScriptMeta, Share};
use crate::store::misses::{Found, Lookups, UNKNOWN_WARN_EVERY, WarnEvery};
use crate::store::script_store::{DirStore, ScriptStore};
use crate::store::secrets::SecretError;
use crate::store::validate::{
    ValidationError, compressed_size, valid_script_id, validate_component,
};
use crate::store::versions::{VersionError, VersionList};
use crate::timing::{CodeSource, SERVER_TIMING_HEADER, START_HEADER, Start, Timing};

/// Source sizes [`Runtime::can_host`] remembers before it starts over.
const MAX_CACHED_SIZES: usize = 100_000;

/// How often a warm Worker is checked against the store for a redeploy
/// (in the background: the request that notices goes on with the copy it
/// has). A backstop: a deploy through a node announces itself to every
/// member at once ([`Runtime::revalidate`]).
pub const REVALIDATE_MS: u64 = 1000;

/// Why a deploy was refused. The old version (if any) keeps serving.
#[derive(Debug, thiserror::Error)]
pub enum DeployError {
    /// The script ID cannot be routed to (it must be a DNS label).
    #[error(
        "invalid script ID {0:?}: use 1-63 lowercase letters, digits and '-', not starting or ending with '-'"
    )]
    InvalidScriptId(String),
    /// The script is over its plan's size limit (measured gzip-compressed).
    #[error(
        "script too large for the {plan} plan: {compressed} bytes gzip-compressed ({raw} bytes raw), limit is {limit} bytes compressed"
    )]
    TooLarge {
        /// The plan whose limit applies.
        plan: Plan,
        /// Size after gzip (level 6), the measure the limit uses.
        compressed: u64,
        /// Size as uploaded.
        raw: u64,
        /// The plan's limit on the compressed size.
        limit: u64,
    },
    /// The script is over its plan's limit on the uncompressed size.
    #[error(
        "script too large for the {plan} plan: {raw} bytes uncompressed, limit is {limit} bytes uncompressed"
    )]
    TooLargeUncompressed {
        /// The plan whose limit applies.
        plan: Plan,
        /// Size as uploaded.
        raw: u64,
        /// The plan's limit on the uncompressed size.
        limit: u64,
    },
    /// The bytes are not a valid Worker component.
    #[error(transparent)]
    Invalid(#[from] ValidationError),
    /// The component is well-formed but wasmtime could not compile or link it.
    #[error("component does not compile or link: {0}")]
    Compile(String),
    /// The script store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The bindings are invalid ([`crate::outbound::bindings`]).
    #[error(transparent)]
    Bindings(#[from] crate::outbound::bindings::BindingsError),
    /// The vars are invalid, or collide with the Worker's secrets
    /// ([`crate::store::secrets`]).
    #[error(transparent)]
    Env(#[from] crate::store::secrets::EnvError),
}

/// What a successful deploy reports.
#[derive(Debug, Clone, Serialize)]
pub struct DeployReport {
    /// The script's metadata as stored.
    pub meta: ScriptMeta,
    /// The plan's compressed size limit.
    pub limit: u64,
    /// Time to compile (or load the artifact of an identical source).
    #[serde(serialize_with = "ser_ms")]
    pub compile_time: Duration,
    /// Whether the code was compiled or an artifact reused.
    pub code_source: CodeSource,
}

fn ser_ms<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_f64(d.as_secs_f64() * 1000.0)
}

/// What a deploy checked and compiled, before it is stored.
struct Checked {
    plan: crate::Plan,
    limit: u64,
    compressed: u64,
    lifecycle: crate::LifecycleChoice,
    bindings: crate::Bindings,
    vars: std::collections::BTreeMap<String, String>,
    dispatch_only: bool,
    hash: String,
    compile_time: Duration,
    code_source: CodeSource,
}

/// A Worker's code as [`Runtime::load_code`] found it.
struct LoadedCode {
    meta: ScriptMeta,
    component: Component,
    code_source: CodeSource,
    fetch: Duration,
    compile: Duration,
}

/// What [`Runtime::prewarm`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Prewarm {
    /// The Worker was loaded (and an instance started) for the prewarm.
    Loaded,
    /// The Worker was resident already; at most an instance was started.
    AlreadyWarm,
    /// Not loaded: it would not fit without evicting a Worker used within
    /// the busy window (memory pressure drops prewarms first).
    NoRoom,
}

/// A served request: the response and how it was produced.
pub struct Served {
    /// The Worker's response (its body may still be streaming).
    pub response: http::Response<Body>,
    /// Whether the Worker was warm.
    pub start: Start,
    /// The phases that ran.
    pub timing: Timing,
}

impl Served {
    /// The response with `x-hearth-start` and `server-timing` added (see
    /// [`decorate`]): what a client of this Worker sees.
    pub fn into_response(self) -> http::Response<Body> {
        let mut response = self.response;
        decorate(response.headers_mut(), self.start, &self.timing);
        response
    }
}

/// One node's Worker runtime. Cheap to clone; clones share everything.
///
/// ```no_run
/// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
/// use hearth_runtime::{Plan, Runtime, RuntimeConfig, body};
/// let rt = Runtime::new(RuntimeConfig::new("/tmp/hearth-store"))?;
/// let wasm = std::fs::read("hello.wasm")?;
/// rt.deploy("hello", Plan::Free, wasm).await?;
/// let req = http::Request::get("http://hello.localhost/").body(body::full(""))?;
/// let resp = rt.serve("hello", req).await;
/// assert_eq!(resp.headers()["x-hearth-start"], "cold");
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Runtime {
    inner: Arc<Inner>,
    /// The idle sweep ([`crate::eviction`]): a thread that holds the runtime
    /// weakly and stops when the last clone is dropped.
    sweeper: Arc<IdleSweeper>,
}

struct Inner {
    engine: Engine,
    linker: Linker<Host>,
    _ticker: EpochTicker,
    store: Arc<dyn ScriptStore>,
    artifacts: ArtifactCache,
    config: RuntimeConfig,
    resident: Mutex<Residency<String, Arc<Worker>>>,
    loading: Mutex<HashMap<String, Arc<OnceCell<Arc<Worker>>>>>,
    deploying: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    /// Source sizes of scripts, for [`Runtime::can_host`].
    sizes: Mutex<HashMap<String, u64>>,
    /// Metadata reads in flight and names the store did not have.
    lookups: Lookups,
    stats: Arc<Stats>,
    node: Arc<NodeShared>,
    epoch: Instant,
    idle: IdleRule,
    /// Per-version counts of the scripts with a split ([`crate::store::versions`]).
    versions: crate::store::versions::VersionCounters,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Inner {
    fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }

    /// One idle sweep (the sweep thread's and [`Runtime::sweep_idle`]'s).
    fn sweep_idle(&self) -> usize {
        let now = self.now_ms();
        let ev = self.idle.sweep(&mut *lock(&self.resident), now);
        let n = ev.len();
        self.count(ev);
        n
    }

    /// Counts and logs `evicted` (and drops them).
    fn count(&self, evicted: impl IntoIterator<Item = Evicted<String, Arc<Worker>>>) {
        for e in evicted {
            self.stats.evicted(e.cause);
            tracing::debug!(script = %e.key, bytes = e.bytes, cause = e.cause.as_str(), "evicted");
        }
    }
}

impl Runtime {
    /// A runtime whose scripts live in a [`DirStore`] at the config's store
    /// directory.
    pub fn new(config: RuntimeConfig) -> Result<Self, ConfigError> {
        let store = DirStore::open(&config.store_dir)
            .map_err(|e| ConfigError::Limit(format!("cannot open script store: {e}")))?;
        Self::with_store(config, Arc::new(store))
    }

    /// A runtime over any [`ScriptStore`].
    pub fn with_store(
        config: RuntimeConfig,
        store: Arc<dyn ScriptStore>,
    ) -> Result<Self, ConfigError> {
        config.free.validate()?;
        config.paid.validate()?;
        let engine = build_engine(&config)?;
        let linker = build_linker(&engine)?;
        let ticker = EpochTicker::start(&engine)
            .map_err(|e| ConfigError::Engine(format!("cannot start epoch ticker: {e}")))?;
        let dir = config
            .artifact_dir
            .clone()
            .unwrap_or_else(|| config.store_dir.join("artifacts"));
        let artifacts = ArtifactCache::new(dir, config.artifact_key, &engine)
            .map_err(|e| ConfigError::Engine(format!("cannot open artifact cache: {e}")))?;
        let stats = Arc::new(Stats::default());
        let store = Arc::new(crate::store::script_store::Counted {
            inner: store,
            stats: stats.clone(),
        });
        let node = NodeShared::new(&config, stats.clone());
        let lookups = Lookups::new(config.miss_capacity, config.miss_ttl);
        let inner = Arc::new(Inner {
            idle: IdleRule::of(&config),
            resident: Mutex::new(Residency::new(config.memory_budget)),
            engine,
            linker,
            _ticker: ticker,
            store,
            artifacts,
            config,
            loading: Mutex::new(HashMap::new()),
            deploying: Mutex::new(HashMap::new()),
            sizes: Mutex::new(HashMap::new()),
            lookups,
            stats,
            node,
            epoch: Instant::now(),
            versions: Default::default(),
        });
        let weak = Arc::downgrade(&inner);
        let sweeper = IdleSweeper::start(IDLE_SWEEP_EVERY, move || match weak.upgrade() {
            Some(inner) => {
                inner.sweep_idle();
                true
            }
            None => false,
        })
        .map_err(|e| ConfigError::Engine(format!("cannot start the idle sweep: {e}")))?;
        Ok(Runtime {
            inner,
            sweeper: Arc::new(sweeper),
        })
    }

    /// Installs what carries this node's nested Worker calls (the node
    /// does, see [`crate::flow`]); replaces any earlier one. Until then
    /// every nested call is denied.
    pub fn set_invoker(&self, invoker: Arc<dyn crate::flow::Invoker>) {
        *self
            .inner
            .node
            .invoker
            .write()
            .unwrap_or_else(|p| p.into_inner()) = Some(invoker);
    }

    /// Installs what is told each invocation's handler CPU time, with its
    /// script ID, when the invocation ends (the node's per-Worker
    /// metrics); only the first call installs one.
    pub fn observe_cpu(&self, observer: CpuObserver) {
        let _ = self.inner.node.cpu_observer.set(observer);
    }

    /// The configuration this runtime was built from.
    pub fn config(&self) -> &RuntimeConfig {
        &self.inner.config
    }

    /// The script store.
    pub fn script_store(&self) -> &Arc<dyn ScriptStore> {
        &self.inner.store
    }

    /// The artifact cache.
    pub fn artifacts(&self) -> &ArtifactCache {
        &self.inner.artifacts
    }

    fn now_ms(&self) -> u64 {
        self.inner.now_ms()
    }

    /// Validates, compiles and stores `source` as `script_id` with the
    /// settings of `manifest` (a [`Manifest`], or just a [`crate::Plan`]),
    /// as its next numbered version ([`crate::store::versions`]), which replaces
    /// the current deployment atomically (at 100%, ending any split; the
    /// earlier versions stay on record). Runs the CPU-heavy parts on
    /// the blocking pool. A store that shares artifacts gets the compiled
    /// one before the new version is visible, so other nodes load it
    /// instead of compiling.
    pub async fn deploy(
        &self,
        script_id: &str,
        manifest: impl Into<Manifest>,
        source: Vec<u8>,
    ) -> Result<DeployReport, DeployError> {
        let rt = self.clone();
        let id = script_id.to_string();
        let manifest = manifest.into();
        let (checked, source) =
            tokio::task::spawn_blocking(move || rt.check_and_compile(&id, &manifest, source))
                .await
                .map_err(|e| DeployError::Compile(format!("deploy task failed: {e}")))??;
        if self.inner.store.keeps_artifacts() {
            self.share_artifact(&checked.hash).await;
        }
        // Concurrent deploys of one name are serialised from here: the
        // deploy time is taken under the lock, so the version stored last
        // is the one with the latest time, and each caller is told what it
        // wrote.
        let name_lock = self.deploy_lock(script_id);
        let _serial = name_lock.lock().await;
        // Secrets outlive redeploys: the new version keeps the old one's.
        let old = self.inner.store.meta(script_id).await?;
        let version = self.next_version(old.as_ref()).await?;
        let secrets = match old {
            Some(old) => old.secrets,
            None => Default::default(),
        };
        crate::store::secrets::check_vars(&checked.vars, secrets.keys())?;
        let meta = ScriptMeta {
            script_id: script_id.into(),
            plan: checked.plan,
            size: source.len() as u64,
            compressed_size: checked.compressed,
            hash: checked.hash,
            deployed_at_ms: unix_ms(),
            lifecycle: checked.lifecycle,
            bindings: checked.bindings,
            vars: checked.vars,
            secrets,
            dispatch_only: checked.dispatch_only,
            version,
            latest_version: version,
            split: Vec::new(),
        };
        self.inner.store.put(&meta, &source).await?;
        self.invalidate(script_id);
        tracing::info!(script = script_id, version = meta.version, plan = %meta.plan, size = meta.size,
            compressed = meta.compressed_size, hash = %meta.hash,
            lifecycle = %meta.lifecycle.chosen, compile_time = ?checked.compile_time, "deployed");
        Ok(DeployReport {
            meta,
            limit: checked.limit,
            compile_time: checked.compile_time,
            code_source: checked.code_source,
        })
    }

    /// Seals `value` as secret `name` of `script_id` and stores it with the
    /// script's metadata, replacing a secret of that name, as a new
    /// version ([`crate::store::versions`]; refused during a split); the warm copy
    /// here is dropped, so its next request sees it. Returns the new
    /// metadata (announce its [`ScriptMeta::revision`] to the other
    /// members, as a deploy does).
    pub async fn put_secret(
        &self,
        script_id: &str,
        name: &str,
        value: &str,
    ) -> Result<ScriptMeta, SecretError> {
        use crate::store::secrets::{EnvError, MAX_ENTRIES, MAX_VALUE_BYTES, check_name};
        check_name("secret", name)?;
        if value.len() > MAX_VALUE_BYTES {
            return Err(EnvError::ValueTooLarge {
                kind: "secret",
                name: name.into(),
                bytes: value.len(),
            }
            .into());
        }
        let key = self.inner.node.secrets_key.clone();
        let (meta, _) = self
            .change_secrets(script_id, |meta| {
                if meta.vars.contains_key(name) {
                    return Err(EnvError::Conflict { name: name.into() });
                }
                let count = meta.vars.len() + meta.secrets.len() + 1;
                if !meta.secrets.contains_key(name) && count > MAX_ENTRIES {
                    return Err(EnvError::TooMany { count });
                }
                let sealed = key.seal(script_id, name, value);
                meta.secrets.insert(name.to_string(), sealed);
                Ok(true)
            })
            .await?;
        tracing::info!(script = script_id, secret = name, "secret put");
        Ok(meta)
    }

    /// Deletes secret `name` of `script_id` (as [`Runtime::put_secret`]
    /// stores a change); the new metadata, and whether there was one.
    pub async fn delete_secret(
        &self,
        script_id: &str,
        name: &str,
    ) -> Result<(ScriptMeta, bool), SecretError> {
        let (meta, deleted) = self
            .change_secrets(script_id, |meta| Ok(meta.secrets.remove(name).is_some()))
            .await?;
        if deleted {
            tracing::info!(script = script_id, secret = name, "secret deleted");
        }
        Ok((meta, deleted))
    }

    /// The names of `script_id`'s secrets (never their values).
    pub async fn secret_names(&self, script_id: &str) -> Result<Vec<String>, SecretError> {
        let meta = self
            .inner
            .store
            .meta(script_id)
            .await?
            .ok_or_else(|| SecretError::UnknownScript(script_id.into()))?;
        Ok(meta.secrets.into_keys().collect())
    }

    /// Applies `change` to `script_id`'s metadata under its deploy lock,
    /// and stores it (with the same source) if `change` says it changed.
    async fn change_secrets(
        &self,
        script_id: &str,
        change: impl FnOnce(&mut ScriptMeta) -> Result<bool, crate::store::secrets::EnvError>,
    ) -> Result<(ScriptMeta, bool), SecretError> {
        let name_lock = self.deploy_lock(script_id);
        let _serial = name_lock.lock().await;
        let (mut meta, source) = self
            .inner
            .store
            .get(script_id)
            .await?
            .ok_or_else(|| SecretError::UnknownScript(script_id.into()))?;
        if !meta.split.is_empty() {
            return Err(SecretError::SplitActive(script_id.into()));
        }
        let changed = change(&mut meta)?;
        if changed {
            // A secret is part of what a version runs: a change is a new
            // version ([`crate::store::versions`]).
            let version = self.next_version(Some(&meta)).await?;
            meta.version = version;
            meta.latest_version = version;
            meta.deployed_at_ms = unix_ms();
            self.inner.store.put(&meta, &source).await?;
            self.invalidate(script_id);
        }
        Ok((meta, changed))
    }

    /// The number of the next version of a script whose current
    /// deployment is `current`; a script deployed before versions existed
    /// is recorded as version 1 first, so it can be rolled back to.
    async fn next_version(&self, current: Option<&ScriptMeta>) -> Result<u64, StoreError> {
        let Some(current) = current else {
            return Ok(1);
        };
        if current.version == 0 {
            let legacy = ScriptMeta {
                version: 1,
                latest_version: 1,
                split: Vec::new(),
                ..current.clone()
            };
            self.inner.store.put_version(&legacy).await?;
        }
        Ok(current.latest_version.max(current.number()) + 1)
    }

    /// The versions of `script_id`, its current deployment, and this
    /// node's counts per version of its split ([`crate::store::versions`]).
    pub async fn versions(&self, script_id: &str) -> Result<VersionList, VersionError> {
        let current = self
            .inner
            .store
            .meta(script_id)
            .await?
            .ok_or_else(|| VersionError::UnknownScript(script_id.into()))?;
        let mut versions = self.inner.store.versions(script_id).await?;
        if current.version == 0 {
            // Deployed before versions existed: it is version 1.
            versions = vec![ScriptMeta {
                version: 1,
                ..current.clone()
            }];
        }
        Ok(VersionList {
            script_id: script_id.into(),
            deployment: crate::store::versions::deployment_of(&current),
            versions,
            counts: self.inner.versions.of(script_id),
        })
    }

    /// Makes `shares` the current deployment of `script_id`: one version
    /// at 100% (a rollback) or a split ([`crate::store::versions`]). Every version
    /// must be recorded; the first one's metadata becomes current. The
    /// warm copy here is dropped; returns the new current deployment
    /// (announce its [`ScriptMeta::revision`] to the other members, as a
    /// deploy does).
    pub async fn set_deployment(
        &self,
        script_id: &str,
        shares: &[Share],
    ) -> Result<ScriptMeta, VersionError> {
        crate::store::versions::check_split(shares)?;
        let name_lock = self.deploy_lock(script_id);
        let _serial = name_lock.lock().await;
        let current = self
            .inner
            .store
            .meta(script_id)
            .await?
            .ok_or_else(|| VersionError::UnknownScript(script_id.into()))?;
        let mut first = None;
        for share in shares {
            let found = self.version_meta(&current, share.version).await?;
            let found = found.ok_or_else(|| VersionError::NoSuchVersion {
                script_id: script_id.into(),
                version: share.version,
            })?;
            first.get_or_insert(found);
        }
        let Some(first) = first else {
            return Err(VersionError::BadSplit("no versions given".into()));
        };
        let meta = ScriptMeta {
            latest_version: current.latest_version.max(current.number()),
            split: if shares.len() > 1 {
                shares.to_vec()
            } else {
                Vec::new()
            },
            ..first
        };
        if current.version == 0 && meta.version != 0 {
            // Leaving a deployment from before versions: keep it as 1.
            self.next_version(Some(&current)).await?;
        }
        self.inner.store.set_current(&meta).await?;
        self.invalidate(script_id);
        let list: Vec<String> = shares.iter().map(Share::to_string).collect();
        tracing::info!(script = script_id, deployment = %list.join(" "), "deployment changed");
        Ok(meta)
    }

    /// Rolls `script_id` back to `version` at 100%, by default the
    /// highest recorded version below the current one (see
    /// [`Runtime::set_deployment`]).
    pub async fn rollback(
        &self,
        script_id: &str,
        version: Option<u64>,
    ) -> Result<ScriptMeta, VersionError> {
        let version = match version {
            Some(v) => v,
            None => {
                let list = self.versions(script_id).await?;
                let current = list.deployment.first().map(|s| s.version).unwrap_or(1);
                list.versions
                    .iter()
                    .map(|m| m.number())
                    .filter(|v| *v < current)
                    .max()
                    .ok_or_else(|| VersionError::NoEarlierVersion {
                        script_id: script_id.into(),
                        current,
                    })?
            }
        };
        self.set_deployment(
            script_id,
            &[Share {
                version,
                percent: 100,
            }],
        )
        .await
    }

    /// Version `version`'s metadata, given the current deployment
    /// `current` (a deployment from before versions is version 1).
    async fn version_meta(
        &self,
        current: &ScriptMeta,
        version: u64,
    ) -> Result<Option<ScriptMeta>, StoreError> {
        if current.version == 0 {
            return Ok((version == 1).then(|| ScriptMeta {
                version: 1,
                latest_version: 1,
                ..current.clone()
            }));
        }
        // One record and its blob (checked: a version whose source is
        // damaged is not rolled back to), not every version's record.
        let found = self
            .inner
            .store
            .get_version(&current.script_id, version)
            .await?;
        Ok(found.map(|(meta, _)| meta))
    }

    /// The CPU-bound part of a deploy: every check on `source`, then the
    /// compile (or the artifact of an identical source).
    fn check_and_compile(
        &self,
        script_id: &str,
        manifest: &Manifest,
        source: Vec<u8>,
    ) -> Result<(Checked, Vec<u8>), DeployError> {
        if !valid_script_id(script_id) {
            return Err(DeployError::InvalidScriptId(script_id.into()));
        }
        let plan = manifest.plan;
        let limits = self.inner.config.limits(plan);
        let limit = limits.max_script_size;
        if source.len() as u64 > limits.max_uncompressed_size {
            return Err(DeployError::TooLargeUncompressed {
                plan,
                raw: source.len() as u64,
                limit: limits.max_uncompressed_size,
            });
        }
        let compressed = compressed_size(&source);
        if compressed > limit {
            return Err(DeployError::TooLarge {
                plan,
                compressed,
                raw: source.len() as u64,
                limit,
            });
        }
        validate_component(&source)?;
        let bindings = manifest.bindings.clone();
        bindings.validate()?;
        crate::store::secrets::check_vars(&manifest.vars, [])?;
        let hash = blake3::hash(&source).to_hex().to_string();
        let t = Instant::now();
        let (component, code_source) = self
            .compile(&hash, &source)
            .map_err(|e| DeployError::Compile(e.to_string()))?;
        link(&self.inner.linker, &component).map_err(|e| DeployError::Compile(e.to_string()))?;
        let checked = Checked {
            plan,
            limit,
            compressed,
            lifecycle: lifecycle::decide(manifest.lifecycle, &source),
            bindings,
            vars: manifest.vars.clone(),
            dispatch_only: manifest.dispatch_only,
            hash,
            compile_time: t.elapsed(),
            code_source,
        };
        Ok((checked, source))
    }

    /// Uploads the local artifact of source `hash` to the store, for the
    /// other nodes (a failure is logged: they compile instead).
    async fn share_artifact(&self, hash: &str) {
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

    /// The lock that serialises deploys of `script_id` on this node (the
    /// store serialises across nodes).
    fn deploy_lock(&self, script_id: &str) -> Arc<tokio::sync::Mutex<()>> {
        let mut locks = lock(&self.inner.deploying);
        locks.retain(|_, l| Arc::strong_count(l) > 1);
        locks.entry(script_id.to_string()).or_default().clone()
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

    /// Compiles `source`, or loads its authenticated artifact; a new
    /// compile is written to the artifact cache.
    fn compile(&self, hash: &str, source: &[u8]) -> Result<(Component, CodeSource), CompileError> {
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

    /// Drops the resident copy of `script_id` (after a redeploy elsewhere),
    /// so the next request loads the current version.
    pub fn invalidate(&self, script_id: &str) {
        self.inner.lookups.forget(script_id);
        lock(&self.inner.sizes).remove(script_id);
        let ev = lock(&self.inner.resident).remove(script_id, EvictionCause::Replaced);
        self.count(ev);
    }

    /// Evicts `script_id` now (counted as manual); whether it was resident.
    pub fn evict(&self, script_id: &str) -> bool {
        let ev = lock(&self.inner.resident).remove(script_id, EvictionCause::Manual);
        let was = ev.is_some();
        self.count(ev);
        was
    }

    /// Runs the idle sweep now: evicts Workers idle for the idle timeout
    /// (see [`crate::eviction`]); returns how many. The runtime also runs
    /// it by itself every [`IDLE_SWEEP_EVERY`], in the background.
    pub fn sweep_idle(&self) -> usize {
        self.inner.sweep_idle()
    }

    /// Waits until the background idle sweep has run once after this call
    /// (for tests and tools that watch idle eviction happen by itself).
    pub async fn next_idle_sweep(&self) {
        self.sweeper.next().await;
    }

    fn count(&self, evicted: impl IntoIterator<Item = Evicted<String, Arc<Worker>>>) {
        self.inner.count(evicted);
    }

    /// Whether `script_id` is in this node's negative cache: its store had
    /// no Worker under it within the TTL and no deploy of it was seen since
    /// ([`crate::store::misses`]). A router asks this before a shard hop: the
    /// answer here is the same 404, without the hop.
    pub fn is_known_missing(&self, script_id: &str) -> bool {
        self.inner.lookups.is_known_missing(script_id)
    }

    /// The negative cache's generation now: take it before asking another
    /// node about a name, and hand it to [`Runtime::remember_missing`].
    pub fn miss_generation(&self) -> u64 {
        self.inner.lookups.generation()
    }

    /// Another node (the name's home) answered that no Worker is deployed
    /// under `script_id`: remember it here too, unless a deploy of the name
    /// was seen since `generation` ([`Runtime::miss_generation`]).
    pub fn remember_missing(&self, script_id: &str, generation: u64) {
        self.inner.lookups.remember_missing(script_id, generation);
    }

    /// Whether `script_id` is warm (resident) here.
    /// A Worker idle past the timeout counts as gone even before the next
    /// sweep removes it, so the router sends it to its home instead of
    /// cold-starting a stale copy here.
    pub fn is_warm(&self, script_id: &str) -> bool {
        let r = lock(&self.inner.resident);
        r.idle_ms(script_id, self.now_ms())
            .is_some_and(|idle| self.inner.idle.keeps(idle, r.used()))
    }

    /// Whether this node can host `script_id` without evicting a Worker used
    /// within the busy window (always true if it is already warm). The size
    /// of a Worker not yet loaded is estimated from its source size, which
    /// is cached: this is asked under the shard server's admission lock, so
    /// it never reads the store itself. On a miss it answers yes and looks
    /// the size up on the blocking pool for next time.
    pub fn can_host(&self, script_id: &str) -> bool {
        if self.is_warm(script_id) {
            return true;
        }
        if self.inner.lookups.is_known_missing(script_id) {
            // Admitted: its 404 costs no store read and no memory.
            return true;
        }
        let cached = lock(&self.inner.sizes).get(script_id).copied();
        let Some(size) = cached else {
            self.learn_size(script_id);
            return true;
        };
        self.fits(size)
    }

    /// Whether a Worker with a source of `size` bytes fits without evicting
    /// a Worker used within the busy window (its resident size estimated
    /// as twice its source).
    fn fits(&self, size: u64) -> bool {
        let estimate = size.saturating_mul(2);
        let busy = self.inner.config.busy_window.as_millis() as u64;
        lock(&self.inner.resident).fits_without_evicting_busy(estimate, self.now_ms(), busy)
    }

    /// Reads the source size of `script_id` off the async path into the
    /// cache [`Runtime::can_host`] uses.
    fn learn_size(&self, script_id: &str) {
        let Ok(handle) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let rt = self.clone();
        let id = script_id.to_string();
        handle.spawn(async move {
            if let Ok(Some(m)) = rt.store_meta(&id).await {
                let mut sizes = lock(&rt.inner.sizes);
                if sizes.len() >= MAX_CACHED_SIZES {
                    sizes.clear();
                }
                sizes.insert(id, m.size);
            }
        });
    }

    /// This node's live-tail hub: subscribe to watch a Worker's requests
    /// as they finish ([`crate::outbound::live_tail`]).
    pub fn live_tail(&self) -> &Arc<crate::outbound::live_tail::LiveTail> {
        &self.inner.node.live
    }

    /// A snapshot of the counters and residency gauges.
    pub fn stats(&self) -> StatsSnapshot {
        let (n, bytes) = {
            let r = lock(&self.inner.resident);
            (r.len() as u64, r.used())
        };
        StatsSnapshot::from(&self.inner.stats, n, bytes, self.inner.node.memory.used())
    }

    /// This node's per-version request and error counts of the scripts
    /// in a split, by script ID ([`crate::store::versions`]).
    pub fn version_counts(&self) -> Vec<(String, Vec<crate::store::versions::VersionCount>)> {
        self.inner.versions.snapshot()
    }

    /// Script IDs resident now, least recently used first.
    pub fn resident(&self) -> Vec<String> {
        lock(&self.inner.resident)
            .keys_lru_first()
            .cloned()
            .collect()
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
        self.build_worker(loaded.meta, &loaded.component)
            .map(Arc::new)
            .map_err(load_err)
    }

    /// A Worker of `meta`'s version from its compiled `component`.
    fn build_worker(&self, meta: ScriptMeta, component: &Component) -> Result<Worker, String> {
        let limits = *self.inner.config.limits(meta.plan);
        let mut reuse = self.inner.config.reuse;
        if !meta.lifecycle.reuses() {
            reuse.max_requests_per_instance = 1;
        }
        let env = crate::store::secrets::WorkerEnv::open(&meta, &self.inner.node.secrets_key)
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
    async fn alt_worker(
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
        let store_err = |e: crate::StoreError| match e {
            crate::StoreError::Remote { .. } => RuntimeError::StoreUnavailable {
                script_id: script_id.into(),
                message: e.to_string(),
            },
            e => load_err(e.to_string()),
        };
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
        self.build_worker(meta, &component).map_err(load_err)
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
        let store_err = |e: &crate::StoreError| match e {
            crate::StoreError::Remote { .. } => RuntimeError::StoreUnavailable {
                script_id: script_id.into(),
                message: e.to_string(),
            },
            e => load_err(e.to_string()),
        };
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

    /// [`Runtime::load_artifact`] on the blocking pool.
    async fn load_artifact_async(&self, hash: &str) -> Option<Component> {
        let rt = self.clone();
        let hash = hash.to_string();
        tokio::task::spawn_blocking(move || rt.load_artifact(&hash))
            .await
            .ok()
            .flatten()
    }

    /// The metadata of `script_id` as the store has it (`None`: no Worker
    /// is deployed under that name): from the negative cache, or one store
    /// read (counted in `store_reads`) shared by every concurrent lookup
    /// of the name ([`crate::store::misses`]).
    async fn store_meta(
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

    /// Checks a warm Worker against the store at most once per
    /// [`REVALIDATE_MS`], in the background (the caller goes on with `w`):
    /// a redeploy through a node that could not announce it still reaches
    /// this one within about that time.
    fn revalidate_in_background(&self, w: &Arc<Worker>, now: u64) {
        if !w.due_for_check(now, REVALIDATE_MS) {
            return;
        }
        let Ok(handle) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let rt = self.clone();
        let w = w.clone();
        handle.spawn(async move {
            rt.check_against_store(&w).await;
        });
    }

    /// Drops `w` if the store holds another version of it (or none); a
    /// store that cannot be read is no reason to drop a working Worker.
    /// Whether it was dropped.
    async fn check_against_store(&self, w: &Arc<Worker>) -> bool {
        let id = &w.meta.script_id;
        match self.store_meta(id).await {
            Ok(Some(m)) if m.revision() == w.meta.revision() => false,
            Ok(_) => self.invalidate_worker(w),
            Err(e) => {
                tracing::debug!(script = %id, error = %e, "revalidation skipped: store unreadable");
                false
            }
        }
    }

    /// Drops `w` if it is still the resident copy of its script (a newer
    /// copy loaded meanwhile stays); whether it was dropped.
    fn invalidate_worker(&self, w: &Arc<Worker>) -> bool {
        let id = w.meta.script_id.as_str();
        lock(&self.inner.sizes).remove(id);
        let ev = {
            let mut r = lock(&self.inner.resident);
            if r.peek(id).is_some_and(|cur| Arc::ptr_eq(cur, w)) {
                r.remove(id, EvictionCause::Replaced)
            } else {
                None
            }
        };
        let dropped = ev.is_some();
        self.count(ev);
        dropped
    }

    /// A deploy of `script_id` at `revision` ([`ScriptMeta::revision`]:
    /// its source hash, and its vars and secrets) was announced (by
    /// another node of the cluster): a warm copy of another version is
    /// checked against the store and dropped if the store agrees it is
    /// stale, so the next request loads the new version. The store is read
    /// only when this node holds a copy that differs from the announced
    /// revision, so a member cannot make a node drop a current Worker, nor read
    /// the store for Workers it does not hold. Whether a copy was dropped.
    pub async fn revalidate(&self, script_id: &str, revision: &str) -> bool {
        self.inner.lookups.forget(script_id);
        lock(&self.inner.sizes).remove(script_id);
        let warm = lock(&self.inner.resident).peek(script_id).cloned();
        match warm {
            Some(w) if w.meta.revision() != revision => self.check_against_store(&w).await,
            _ => false,
        }
    }

    /// Returns the resident Worker, or loads it (once, however many requests
    /// wait for it) and makes it resident. `by_prewarm`: the caller is a
    /// prewarm, not a request (a Worker it loads is marked so, and it does
    /// not take the mark).
    async fn worker(
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

    /// Prepares `script_id` for its next request without serving one: what
    /// a cold start runs before the handler (fetch, compile or load the
    /// artifact, instantiate with the top-level code under the startup CPU
    /// budget), leaving the Worker resident with an idle instance. The
    /// first request after it reports `x-hearth-start: prewarmed` and no
    /// fetch or compile phase. Concurrent prewarms and requests share one
    /// load. It takes no request slot (the caller bounds how many run at
    /// once), and it never evicts a busier Worker: a Worker that does not
    /// fit without doing so is not loaded ([`Prewarm::NoRoom`]).
    pub async fn prewarm(&self, script_id: &str) -> Result<Prewarm, RuntimeError> {
        if !valid_script_id(script_id) {
            return Err(RuntimeError::UnknownScript(script_id.into()));
        }
        if !self.is_warm(script_id) {
            // Its real size, read off the async path (a prewarm can wait;
            // unlike `can_host` it never guesses).
            let meta = self
                .store_meta(script_id)
                .await
                .map_err(|e| RuntimeError::Load {
                    script_id: script_id.into(),
                    message: e.to_string(),
                })?
                .ok_or_else(|| RuntimeError::UnknownScript(script_id.into()))?;
            if !self.fits(meta.size) {
                return Ok(Prewarm::NoRoom);
            }
        }
        let mut timing = Timing::default();
        let (worker, start) = self.worker(script_id, &mut timing, true).await?;
        worker.prewarm_instance().await?;
        let bytes = worker.bytes();
        let ev = lock(&self.inner.resident).set_bytes(script_id, bytes);
        self.count(ev);
        Ok(match start {
            Start::Cold => Prewarm::Loaded,
            Start::Warm | Start::Prewarmed => Prewarm::AlreadyWarm,
        })
    }

    /// Serves `req` with Worker `script_id`.
    pub async fn handle(
        &self,
        script_id: &str,
        req: http::Request<Body>,
    ) -> Result<Served, RuntimeError> {
        let inner = &self.inner;
        Stats::bump(&inner.stats.requests);
        let mut timing = Timing::default();
        let (primary, mut start) = match self.worker(script_id, &mut timing, false).await {
            Ok(found) => found,
            Err(e) => {
                if matches!(e, RuntimeError::UnknownScript(_)) {
                    Stats::bump(&inner.stats.unknown_scripts);
                }
                return Err(e);
            }
        };
        // A user Worker runs only as a nested call: a request without a
        // flow is a client's (at any front door, or forwarded to this
        // home), and never reaches it. The one check for every path.
        if primary.meta.dispatch_only && req.extensions().get::<crate::flow::Flow>().is_none() {
            Stats::bump(&inner.stats.dispatch_only_refused);
            return Err(RuntimeError::DispatchOnly(script_id.into()));
        }
        // During a split the request's key picks the version
        // ([`crate::store::versions`]).
        let split = !primary.meta.split.is_empty();
        let version = crate::store::versions::choose(&primary.meta, req.headers());
        let worker = if version == primary.meta.number() {
            primary.clone()
        } else {
            let (w, loaded) = self.alt_worker(&primary, version).await?;
            if loaded {
                start = Start::Cold;
            }
            w
        };
        Stats::bump(match start {
            Start::Cold => &inner.stats.cold,
            Start::Warm => &inner.stats.warm,
            Start::Prewarmed => &inner.stats.prewarmed,
        });
        let t = Instant::now();
        let served = worker.serve(req).await;
        if split {
            let error = served
                .as_ref()
                .map_or(true, |(r, _)| r.status().is_server_error());
            inner
                .versions
                .record(script_id, &primary.meta.split, version, error);
        }
        let (mut response, started) = served?;
        response.headers_mut().insert(
            crate::store::versions::VERSION_HEADER,
            http::HeaderValue::from(version),
        );
        if let Some(s) = started {
            timing.instantiate = Some(s.wall);
            timing.startup_cpu = Some(s.cpu);
        }
        timing.handler = Some(t.elapsed() - timing.instantiate.unwrap_or_default());
        let bytes = primary.bytes();
        let ev = lock(&inner.resident).set_bytes(script_id, bytes);
        self.count(ev);
        Ok(Served {
            response,
            start,
            timing,
        })
    }

    /// Serves `req` with Worker `script_id`, turning failures into responses
    /// with a clear body, and adds the `x-hearth-start` and `server-timing`
    /// headers.
    pub async fn serve(&self, script_id: &str, req: http::Request<Body>) -> http::Response<Body> {
        match self.handle(script_id, req).await {
            Ok(served) => served.into_response(),
            Err(e) => error_response(&e),
        }
    }
}

/// Adds the `x-hearth-start` and `server-timing` headers.
pub fn decorate(headers: &mut http::HeaderMap, start: Start, timing: &Timing) {
    headers.insert(START_HEADER, http::HeaderValue::from_static(start.as_str()));
    if let Ok(v) = http::HeaderValue::from_str(&timing.header_value()) {
        headers.insert(SERVER_TIMING_HEADER, v);
    }
}

/// The response a client sees for `err`: its status, the short
/// [`RuntimeError::public_message`] and a request ID (also in the
/// `x-hearth-request-id` header). The full error, with any backtrace or
/// path, is logged under the same ID.
pub fn error_response(err: &RuntimeError) -> http::Response<Body> {
    /// Requests for unknown scripts are logged at most this often.
    static UNKNOWN: WarnEvery = WarnEvery::new(UNKNOWN_WARN_EVERY);
    let id = request_id();
    match err {
        RuntimeError::UnknownScript(_) | RuntimeError::DispatchOnly(_) => match UNKNOWN.allow() {
            Some(suppressed) => tracing::warn!(request_id = %id, error = %err, suppressed,
                "request for a script not deployed or not routable (at most one such warning \
                 every {}s; `suppressed` were not logged, all are counted in unknown_scripts \
                 or dispatch_only_refused)",
                UNKNOWN_WARN_EVERY.as_secs()),
            None => tracing::debug!(request_id = %id, error = %err, "request failed"),
        },
        _ => tracing::warn!(request_id = %id, error = %err, "request failed"),
    }
    let mut resp = body::text_response(
        err.status(),
        format!("{} (request id {id})\n", err.public_message()),
    );
    if let Ok(v) = http::HeaderValue::from_str(&id) {
        resp.headers_mut().insert(REQUEST_ID_HEADER, v);
    }
    match err {
        RuntimeError::UnknownScript(_) => {
            resp.headers_mut().insert(
                UNKNOWN_SCRIPT_HEADER,
                http::HeaderValue::from_static("unknown-script"),
            );
        }
        RuntimeError::FlowCpuExceeded { .. } => {
            resp.headers_mut().insert(
                UNKNOWN_SCRIPT_HEADER,
                http::HeaderValue::from_static(FLOW_CPU_SPENT),
            );
        }
        _ => {}
    }
    if let Some(secs) = err.retry_after() {
        resp.headers_mut()
            .insert(http::header::RETRY_AFTER, http::HeaderValue::from(secs));
    }
    resp
}

/// Unix time now, in milliseconds.
fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}
