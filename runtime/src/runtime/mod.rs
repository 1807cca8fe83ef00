//! [`Runtime`]: one node's Workers, and the state its methods share.
//!
//! A runtime owns the node's engine and linker, its script store and
//! artifact cache, the resident Workers under the memory budget, the
//! shared state of the node's instances, and the counters. Its methods
//! live in files by what they serve:
//!
//! * `deploy`: deploys, secrets and versions, what changes a script in the
//!   store (and drops the copy here);
//! * `load`: loading code, from the store's metadata to a resident Worker
//!   (artifact or compile, one load however many requests wait);
//! * `serve`: serving a request (and prewarming for one), with the
//!   response a client sees for a failure;
//! * `residency`: which Workers stay here: eviction, revalidation against
//!   the store, and the router's questions (is it warm, can this node host
//!   it, is the name known to be missing).
//!
//! This file holds the type and what all of them use; none of the others
//! imports from another.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use tokio::sync::OnceCell;
use wasmtime::Engine;
use wasmtime::component::Linker;

use crate::config::RuntimeConfig;
use crate::error::ConfigError;
use crate::eviction::{Evicted, IDLE_SWEEP_EVERY, IdleRule, IdleSweeper, Residency};
use crate::instances::cpu::CpuObserver;
use crate::instances::engine::{build_engine, build_linker};
use crate::instances::epoch::EpochTicker;
use crate::instances::host::Host;
use crate::instances::worker::{NodeShared, Worker};
use crate::stats::{Stats, StatsSnapshot};
use crate::store::artifact::ArtifactCache;
use crate::store::misses::Lookups;
use crate::store::records::Records;
use crate::store::script_store::{DirStore, ScriptStore};

pub(crate) mod deploy;
mod load;
pub(crate) mod residency;
pub(crate) mod serve;

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
    store: Records,
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

/// How the node's objects load their script's current Worker: through the
/// runtime they belong to, held weakly ([`crate::objects`]).
struct ObjectLoader {
    inner: std::sync::Weak<Inner>,
    sweeper: std::sync::Weak<IdleSweeper>,
}

impl crate::objects::resident::LoadWorker for ObjectLoader {
    fn load<'a>(
        &'a self,
        script_id: &'a str,
    ) -> futures::future::BoxFuture<'a, Result<Arc<Worker>, crate::RuntimeError>> {
        Box::pin(async move {
            let (Some(inner), Some(sweeper)) = (self.inner.upgrade(), self.sweeper.upgrade())
            else {
                return Err(crate::RuntimeError::Load {
                    script_id: script_id.into(),
                    message: "the runtime is shutting down".into(),
                });
            };
            let runtime = Runtime { inner, sweeper };
            let mut timing = crate::timing::Timing::default();
            runtime
                .worker(script_id, &mut timing, false)
                .await
                .map(|(worker, _)| worker)
        })
    }
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
        config.tail_budget.validate()?;
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
        let store_for_objects = store.clone();
        let store = Records::new(
            store,
            &config.artifact_key,
            config.accept_unsigned_records,
            config.keep_versions,
            stats.clone(),
        );
        let node = NodeShared::new(&config, stats.clone());
        let blobs = store_for_objects.clone();
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
        let runtime = Runtime {
            inner,
            sweeper: Arc::new(sweeper),
        };
        // Objects load their script's Worker through the runtime, held
        // weakly: the runtime owns its objects, not the other way round.
        runtime.inner.node.objects.install(
            blobs,
            Box::new(ObjectLoader {
                inner: Arc::downgrade(&runtime.inner),
                sweeper: Arc::downgrade(&runtime.sweeper),
            }),
        );
        crate::objects::alarms::start(&runtime.inner.node.objects);
        Ok(runtime)
    }

    /// The node's Durable Objects ([`crate::objects`]).
    pub fn objects(&self) -> &crate::objects::NodeObjects {
        &self.inner.node.objects
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

    /// The script store's records, authenticated
    /// ([`crate::store::records`]).
    pub fn script_store(&self) -> &Records {
        &self.inner.store
    }

    /// The artifact cache.
    pub fn artifacts(&self) -> &ArtifactCache {
        &self.inner.artifacts
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

    fn now_ms(&self) -> u64 {
        self.inner.now_ms()
    }

    fn count(&self, evicted: impl IntoIterator<Item = Evicted<String, Arc<Worker>>>) {
        self.inner.count(evicted);
    }
}
