//! A loaded Worker: the one-time work (compiled component, linked
//! [`ProxyPre`], init export lookup) separated from the per-request work,
//! plus its pool of idle instances and the [`ReusePolicy`] that governs it
//! (one request per instance when its [lifecycle](crate::instances::lifecycle) is
//! fresh).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use http_body_util::BodyExt;
use tokio::sync::Semaphore;
use wasmtime::Engine;
use wasmtime::component::{Component, ComponentExportIndex, Linker};
use wasmtime_wasi_http::p2::bindings::ProxyPre;

use crate::body::Body;
use crate::config::{ReusePolicy, RuntimeConfig};
use crate::error::{CompileError, RuntimeError};
use crate::instances::host::{Host, NodeMemory};
use crate::instances::instance::{Instance, OnDone};
use crate::instances::pre_slot::{self, PreSlotBudget};
use crate::instances::slow_client::{self, Cancel, CancelOnDrop};
use crate::limits::PlanLimits;
use crate::stats::Stats;
use crate::store::meta::ScriptMeta;

/// The share of its memory limit above which a reused instance is retired
/// after a request instead of serving another: it still answered this
/// request, and the next one gets a fresh instance rather than failing at
/// the limit part-way (JS engines' heaps grow a few KiB per request and
/// give little back, docs/js-engine.md).
pub(crate) const RETIRE_AT_MEMORY: f64 = 0.75;

/// What every Worker on a node shares: the node-wide instance slots and
/// memory cap, and the slow-client settings ([`crate::instances::slow_client`]).
pub(crate) struct NodeShared {
    /// One permit per instance that may serve at once on the node.
    pub(crate) slots: Arc<Semaphore>,
    /// The cap on memory held by live instances.
    pub(crate) memory: Arc<NodeMemory>,
    pub(crate) slot_wait: Duration,
    pub(crate) body_idle: Duration,
    pub(crate) buffer_before_slot: usize,
    /// Subrequests one invocation may have in flight
    /// ([`crate::outbound::outgoing`]).
    pub(crate) subrequests: usize,
    /// Each flow's CPU budget for nested invocations here
    /// ([`crate::instances::cpu`]).
    pub(crate) flow_pools: Arc<crate::instances::cpu::FlowPools>,
    pub(crate) stats: Arc<Stats>,
    /// The node's client for Workers' fetches of origins
    /// ([`crate::outbound::egress`]).
    pub(crate) egress: Arc<crate::outbound::egress::Egress>,
    /// Seals and opens Worker secrets ([`crate::store::secrets`]).
    pub(crate) secrets_key: crate::store::secrets::SecretsKey,
    /// Carries this node's nested calls ([`crate::flow::Invoker`]), once installed.
    pub(crate) invoker: std::sync::RwLock<Option<Arc<dyn crate::flow::Invoker>>>,
    /// Told each invocation's handler CPU time, once installed
    /// ([`crate::Runtime::observe_cpu`]).
    pub(crate) cpu_observer: std::sync::OnceLock<crate::instances::cpu::CpuObserver>,
    /// Who watches this node's requests live ([`crate::outbound::live_tail`]).
    pub(crate) live: Arc<crate::outbound::live_tail::LiveTail>,
    /// The node's Durable Objects ([`crate::objects`]).
    pub(crate) objects: Arc<crate::objects::NodeObjects>,
}

impl NodeShared {
    /// The shared state of a node configured by `cfg`.
    pub(crate) fn new(cfg: &RuntimeConfig, stats: Arc<Stats>) -> Arc<Self> {
        Arc::new(NodeShared {
            slots: Arc::new(Semaphore::new(cfg.max_in_flight)),
            memory: NodeMemory::new(cfg.instance_memory_cap),
            slot_wait: cfg.slot_wait,
            body_idle: cfg.body_idle_timeout,
            buffer_before_slot: cfg.buffer_before_slot,
            subrequests: cfg.max_concurrent_subrequests,
            egress: Arc::new(crate::outbound::egress::Egress::new(
                cfg.egress.clone(),
                stats.subrequests.clone(),
            )),
            flow_pools: Arc::default(),
            secrets_key: crate::store::secrets::SecretsKey::derive(&cfg.artifact_key),
            invoker: std::sync::RwLock::new(None),
            cpu_observer: std::sync::OnceLock::new(),
            live: Arc::new(crate::outbound::live_tail::LiveTail::new(
                cfg.tail_budget,
                stats.clone(),
            )),
            objects: Arc::new(crate::objects::NodeObjects::new(
                cfg.objects.clone(),
                cfg.store_dir.clone(),
                stats.clone(),
            )),
            stats,
        })
    }
}

/// The allow-list of `meta`'s deploy (checked then); a list this release
/// can no longer read allows nothing, and says so.
fn allow_list(meta: &ScriptMeta) -> crate::outbound::egress::AllowList {
    crate::outbound::egress::AllowList::parse(&meta.bindings.allowed_hosts).unwrap_or_else(|e| {
        tracing::warn!(script = %meta.script_id, error = %e,
            "stored allow-list refused: the Worker may fetch no origin until redeployed");
        crate::outbound::egress::AllowList::default()
    })
}

/// The two slots a serving instance holds (its Worker's and the node's),
/// counted in the `in_flight` gauge while held.
struct Slots {
    /// None for an object's request: its one instance is its own, bounded
    /// by the node's resident objects, not by the Worker's instances (the
    /// front Worker calling its own objects must not wait for itself).
    _worker: Option<tokio::sync::OwnedSemaphorePermit>,
    _node: tokio::sync::OwnedSemaphorePermit,
    stats: Arc<Stats>,
}

impl Drop for Slots {
    fn drop(&mut self) {
        self.stats
            .in_flight
            .fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
    }
}

/// The optional export a Worker may provide for top-level init that the
/// runtime runs (and charges to the startup budget) right after
/// instantiation: `hearth:worker/init#init: func()`.
pub const INIT_INTERFACE: &str = "hearth:worker/init";

/// A Worker ready to serve on this node.
pub(crate) struct Worker {
    pub(crate) meta: ScriptMeta,
    checked_ms: AtomicU64,
    pub(crate) limits: PlanLimits,
    script_id: Arc<str>,
    /// Its environment and node log, shared by its instances.
    io: Arc<crate::instances::host::WorkerIo>,
    /// The Worker's bindings, shared with every request's hooks.
    bindings: Arc<crate::outbound::bindings::Bindings>,
    /// The origins it may fetch, parsed from its bindings' allowed hosts.
    allowed: Arc<crate::outbound::egress::AllowList>,
    /// The node's client for them, with this Worker's connection cap.
    egress: crate::outbound::egress::WorkerEgress,
    engine: Engine,
    pre: ProxyPre<Host>,
    init: Option<ComponentExportIndex>,
    code_bytes: u64,
    reuse: ReusePolicy,
    /// Set once a reused instance failed to answer: fresh instances only
    /// from then on (see [`crate::instances::lifecycle`]).
    demoted: AtomicBool,
    /// Set when a prewarm loaded this Worker; the first request to find it
    /// takes it and reports `prewarmed` ([`crate::Start::Prewarmed`]).
    prewarmed: AtomicBool,
    idle: Mutex<Vec<Instance>>,
    permits: Arc<Semaphore>,
    instance_bytes: Arc<AtomicU64>,
    stats: Arc<Stats>,
    node: Arc<NodeShared>,
    /// During a split ([`crate::store::versions`]), the script's other versions,
    /// loaded on first use and dropped with this one (the current version).
    pub(crate) alts: Mutex<std::collections::HashMap<u64, Arc<tokio::sync::OnceCell<Arc<Worker>>>>>,
}

/// A Durable Object's request: the object's own instance (none: start
/// one), the object it runs as, and where the instance goes back when the
/// handler returns healthy ([`crate::objects`]).
pub(crate) struct Pinned {
    pub(crate) instance: Option<Instance>,
    pub(crate) object: Arc<crate::objects::ObjectCtx>,
    pub(crate) back: tokio::sync::oneshot::Sender<Instance>,
}

/// A new instance's startup figures.
pub(crate) struct Started {
    pub(crate) wall: Duration,
    pub(crate) cpu: Duration,
}

impl Worker {
    /// Links `component` and finds its exports (the one-time work).
    // Each argument comes from a different owner (the engine, the store's
    // metadata, the Worker's opened environment, its plan, the node); a
    // struct bundling them would be built only to be taken apart here.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        engine: &Engine,
        linker: &Linker<Host>,
        component: &Component,
        meta: ScriptMeta,
        env: crate::store::secrets::WorkerEnv,
        limits: PlanLimits,
        reuse: ReusePolicy,
        node: Arc<NodeShared>,
    ) -> Result<Self, CompileError> {
        let pre = link(linker, component)?;
        let init = component
            .component_type()
            .exports(engine)
            .find(|(name, _)| name.starts_with(INIT_INTERFACE))
            .and_then(|(name, _)| {
                let iface = component.get_export_index(None, name)?;
                component.get_export_index(Some(&iface), "init")
            });
        let range = component.image_range();
        let code_bytes = (range.end as usize).saturating_sub(range.start as usize) as u64;
        let script_id: Arc<str> = meta.script_id.as_str().into();
        Ok(Worker {
            io: Arc::new(crate::instances::host::WorkerIo {
                script_id: script_id.clone(),
                env,
                log: crate::outbound::tail::WorkerLog::new(script_id.clone()),
            }),
            egress: node.egress.for_worker(&script_id),
            script_id,
            bindings: Arc::new(meta.bindings.clone()),
            allowed: Arc::new(allow_list(&meta)),
            meta,
            limits,
            engine: engine.clone(),
            pre,
            init,
            code_bytes,
            reuse,
            demoted: AtomicBool::new(false),
            prewarmed: AtomicBool::new(false),
            idle: Mutex::new(Vec::new()),
            permits: Arc::new(Semaphore::new(reuse.max_concurrency.max(1))),
            instance_bytes: Arc::new(AtomicU64::new(0)),
            stats: node.stats.clone(),
            node,
            checked_ms: AtomicU64::new(0),
            alts: Mutex::new(std::collections::HashMap::new()),
        })
    }

    /// True at most once per `every_ms`: time to check the store for a
    /// newer version.
    pub(crate) fn due_for_check(&self, now_ms: u64, every_ms: u64) -> bool {
        let last = self.checked_ms.load(Ordering::Relaxed);
        (last == 0 || now_ms.saturating_sub(last) >= every_ms)
            && self
                .checked_ms
                .compare_exchange(last, now_ms.max(1), Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
    }

    /// Real bytes this Worker holds: compiled code plus live instances'
    /// linear memories.
    /// A split's other versions loaded beside it count as its.
    pub(crate) fn bytes(&self) -> u64 {
        let alts: u64 = self
            .alts
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .filter_map(|cell| cell.get())
            .map(|w| w.bytes())
            .sum();
        self.code_bytes + self.instance_bytes.load(Ordering::Relaxed) + alts
    }

    /// Marks this Worker as loaded by a prewarm.
    pub(crate) fn mark_prewarmed(&self) {
        self.prewarmed.store(true, Ordering::Relaxed);
    }

    /// Whether a prewarm loaded this Worker and no request has used it
    /// yet; true once.
    pub(crate) fn take_prewarmed(&self) -> bool {
        self.prewarmed.load(Ordering::Relaxed) && self.prewarmed.swap(false, Ordering::Relaxed)
    }

    /// Starts an instance ahead of any request and parks it idle, so the
    /// next request skips instantiation (the top-level code runs now,
    /// under the startup budget). Nothing to do if one is idle already, or
    /// if instances are not kept between requests.
    pub(crate) async fn prewarm_instance(&self) -> Result<(), RuntimeError> {
        let have_idle = !self
            .idle
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_empty();
        if have_idle || self.reuse.idle_ttl.is_zero() {
            return Ok(());
        }
        let (inst, _) = self.start_instance().await?;
        self.put_idle(inst);
        Ok(())
    }

    /// Memory above which a reused instance is not reused
    /// ([`RETIRE_AT_MEMORY`] of the plan's limit).
    fn retire_above(&self) -> u64 {
        (self.limits.memory as f64 * RETIRE_AT_MEMORY) as u64
    }

    fn take_idle(&self) -> Option<Instance> {
        let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
        while let Some(inst) = idle.pop() {
            if inst.idle_since.elapsed() <= self.reuse.idle_ttl {
                return Some(inst);
            }
        }
        None
    }

    fn put_idle(&self, inst: Instance) {
        if self.demoted.load(Ordering::Relaxed) {
            return;
        }
        let bytes = inst.memory_bytes();
        if bytes > self.retire_above() {
            // A guest whose memory creeps up request by request (a leak, or
            // an engine's GC that never gives pages back) would otherwise
            // fail a request at the limit: retire it while it still works.
            Stats::bump(&self.stats.memory_retirements);
            tracing::debug!(script = %self.script_id, bytes, "instance retired: near its memory limit");
            return;
        }
        if inst.served < self.reuse.max_requests_per_instance {
            let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
            idle.retain(|i| i.idle_since.elapsed() <= self.reuse.idle_ttl);
            idle.push(inst);
        }
    }

    /// Starts a new instance under the startup budget.
    pub(crate) async fn start_instance(&self) -> Result<(Instance, Started), RuntimeError> {
        let t = Instant::now();
        let res = Instance::start(
            &self.engine,
            &self.pre,
            self.init.as_ref(),
            &self.io,
            &self.limits,
            self.instance_bytes.clone(),
            self.node.memory.clone(),
        )
        .await;
        match res {
            Ok((inst, cpu)) => {
                Stats::bump(&self.stats.instances_started);
                Ok((
                    inst,
                    Started {
                        wall: t.elapsed(),
                        cpu,
                    },
                ))
            }
            Err(e) => {
                Stats::bump(&self.stats.startup_failures);
                tracing::warn!(script = %self.script_id, error = %e, "instance failed to start");
                Err(e)
            }
        }
    }

    /// Takes this Worker's slot (unless `object`, see [`Slots`]) and then
    /// one of the node's, each waited for at most the slot wait in all;
    /// `Busy` if none came free.
    async fn take_slots(&self, object: bool) -> Result<Slots, RuntimeError> {
        let wait = self.node.slot_wait;
        let busy = || {
            Stats::bump(&self.stats.busy);
            RuntimeError::Busy {
                script_id: self.script_id.to_string(),
                waited: wait,
            }
        };
        let deadline = tokio::time::Instant::now() + wait;
        let closed = |_| RuntimeError::Load {
            script_id: self.script_id.to_string(),
            message: "Worker is shutting down".into(),
        };
        let worker = match object {
            true => None,
            false => Some(
                tokio::time::timeout_at(deadline, self.permits.clone().acquire_owned())
                    .await
                    .map_err(|_| busy())?
                    .map_err(closed)?,
            ),
        };
        let node = tokio::time::timeout_at(deadline, self.node.slots.clone().acquire_owned())
            .await
            .map_err(|_| busy())?
            .map_err(closed)?;
        self.stats.in_flight.fetch_add(1, Ordering::Relaxed);
        Ok(Slots {
            _worker: worker,
            _node: node,
            stats: self.stats.clone(),
        })
    }

    /// Serves `req` on an idle instance or a new one, returning the response
    /// once its head is ready (the body keeps streaming from the instance) and
    /// the startup figures if a new instance was started. The request takes a
    /// slot only once its body has arrived or its first bytes have (see
    /// [`crate::instances::slow_client`]); dropping the future, or the response
    /// body before its end, cancels the invocation.
    pub(crate) async fn serve(
        self: &Arc<Self>,
        req: http::Request<Body>,
    ) -> Result<(http::Response<Body>, Option<Started>), RuntimeError> {
        self.serve_on(req, None).await
    }

    /// Serves a Durable Object's request as [`Worker::serve`] does, on the
    /// object's own instance (started if it has none), never the idle
    /// pool's: the instance goes back through `pinned.back`, and the
    /// object's writes are flushed before the response head is returned
    /// (the output gate, [`crate::objects`]).
    pub(crate) async fn serve_pinned(
        self: &Arc<Self>,
        req: http::Request<Body>,
        pinned: Pinned,
    ) -> Result<(http::Response<Body>, Option<Started>), RuntimeError> {
        self.serve_on(req, Some(pinned)).await
    }

    async fn serve_on(
        self: &Arc<Self>,
        req: http::Request<Body>,
        pinned: Option<Pinned>,
    ) -> Result<(http::Response<Body>, Option<Started>), RuntimeError> {
        let (parts, body) = req.into_parts();
        // Where this request sits in its flow, as the node said; a client's
        // request is a flow's entry. Limits only tighten.
        let flow = parts
            .extensions
            .get::<crate::flow::Flow>()
            .cloned()
            .unwrap_or_default();
        let mut limits = flow.tighten(self.limits, Instant::now());
        let deadline = flow
            .deadline
            .unwrap_or_else(|| Instant::now() + limits.request_wall);
        // A nested invocation runs on its flow's CPU budget
        // ([`crate::instances::cpu`]).
        let pools = self.node.flow_pools.clone();
        let flow_cpu = match flow.nested_cpu {
            Some(n) => {
                let handle = crate::instances::cpu::FlowCpuHandle::nested(pools, n, deadline);
                let pool = handle.pool().1;
                if pool.left().is_zero() {
                    // Spent: refused before it takes a slot, with a clear
                    // answer the caller's node recognizes.
                    Stats::bump(&self.stats.nested_cpu_refused);
                    return Err(RuntimeError::FlowCpuExceeded {
                        script_id: self.script_id.to_string(),
                        used: Duration::ZERO,
                        flow_budget: pool.budget(),
                    });
                }
                limits.request_cpu = limits.request_cpu.min(pool.left());
                handle
            }
            None => {
                crate::instances::cpu::FlowCpuHandle::entry(pools, limits.request_cpu, deadline)
            }
        };
        let mut extensions = parts.extensions.clone();
        let invoker = self
            .node
            .invoker
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        let level = self.trace_level(&flow, &mut extensions, &invoker, limits, &parts);
        let budget = parts.extensions.get::<PreSlotBudget>().cloned();
        let (body, charge) = self.read_body_prefix(body, budget).await?;
        let req = http::Request::from_parts(parts, body);
        let slots = self.take_slots(pinned.is_some()).await?;
        // The buffered bytes are the instance's now.
        if let Some(c) = charge {
            c.settle();
        }
        let (own, object, back) = match pinned {
            Some(p) => (Some(p.instance), Some(p.object), Some(p.back)),
            None => (None, None, None),
        };
        // An object's own instance, or (for a plain request) an idle one.
        let found = match own {
            Some(inst) => inst,
            None => self.take_idle(),
        };
        let (inst, started) = match found {
            Some(i) => (i, None),
            None => {
                let (i, s) = self.start_instance().await?;
                (i, Some(s))
            }
        };
        let on_done = self.on_done(slots, inst.meter(), back);
        // An instance that served before (not one just started, nor one a
        // prewarm parked unused) is a reused one.
        let reused = inst.served > 0;
        let hooks = crate::outbound::outgoing::Outbound {
            caller: Some(Arc::new(crate::outbound::outgoing::Caller {
                script_id: self.script_id.clone(),
                bindings: self.bindings.clone(),
                allowed: self.allowed.clone(),
                egress: self.egress.clone(),
                fetch_limit: limits.subrequests,
                fetches: std::sync::atomic::AtomicU32::new(0),
                flow,
                mark: crate::flow::LoopMark::of(req.headers()),
                deadline,
                extensions,
                meter: inst.meter(),
                invoker,
                trace: level.as_ref().map(|l| l.buffer.clone()),
                stats: self.stats.clone(),
                subrequests: Arc::new(Semaphore::new(self.node.subrequests)),
                flow_cpu,
                objects: self.node.objects.clone(),
                object: object.clone(),
            })),
        };
        let (mut task, mut rx) =
            inst.invoke(self.script_id.clone(), req, limits, hooks, on_done)?;
        let guard = Cancel::new(task.abort_handle(), self.stats.clone());
        let mut ended = None;
        let resp = tokio::select! {
            biased;
            r = &mut rx => match r {
                Ok(r) => r,
                Err(_) => {
                    let e = self.finished_without_response(task.await, reused);
                    return Err(finish_failed(level, e).await);
                }
            },
            j = &mut task => match rx.try_recv() {
                Ok(r) => {
                    ended = Some(j);
                    r
                }
                Err(_) => {
                    let e = self.finished_without_response(j, reused);
                    return Err(finish_failed(level, e).await);
                }
            },
        };
        let status = resp.as_ref().ok().map(|r| r.status().as_u16());
        // Only a level that reports to a flow holds its response's end; one
        // recorded for live watchers alone does not.
        let hold = match level {
            Some(level) if level.sink.is_some() => {
                Some(finish_when_ended(level, status, ended, task))
            }
            Some(level) => {
                drop(finish_when_ended(level, status, ended, task));
                None
            }
            None => None,
        };
        let resp = resp.map_err(|code| RuntimeError::Trap {
            script_id: self.script_id.to_string(),
            message: format!("Worker answered with error code {code:?}"),
        })?;
        // The output gate: an object's writes so far are durable, or (if
        // it wrote nothing) its ownership confirmed, before its response
        // head leaves. A failure answers 503; dropping the guard cancels
        // the invocation, and the instance is not kept.
        if let Some(object) = &object
            && let Err(e) = object.confirm().await
        {
            return Err(RuntimeError::ObjectUnavailable {
                object: object.describe(),
                message: format!(
                    "its writes could not be made durable or its ownership confirmed: {e}"
                ),
            });
        }
        let length = resp
            .headers()
            .get(http::header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok());
        Ok((
            resp.map(|b| {
                let b = crate::body::boxed(b);
                let b = CancelOnDrop::new(b, guard, length).boxed_unsync();
                match hold {
                    Some(done) => crate::outbound::tail::HoldEnd {
                        inner: b,
                        done: Some(done),
                    }
                    .boxed_unsync(),
                    None => b,
                }
            }),
            started,
        ))
    }

    /// Reads up to the node's `buffer_before_slot` of the request body
    /// before the request takes a slot (a slow client holds no instance
    /// while it trickles in), and bounds every later read by the node's
    /// `body_idle`. With a `budget` (the front door's), the bytes read are
    /// charged to it until the returned charge settles
    /// ([`crate::instances::pre_slot`]); a request over it is refused.
    async fn read_body_prefix(
        &self,
        body: Body,
        budget: Option<PreSlotBudget>,
    ) -> Result<(Body, Option<Arc<pre_slot::Charge>>), RuntimeError> {
        let idle = self.node.body_idle;
        let (body, charge) = match budget {
            Some(b) => {
                let (body, charge) = pre_slot::metered(body, b);
                (body, Some(charge))
            }
            None => (body, None),
        };
        let body = slow_client::buffer_prefix(body, self.node.buffer_before_slot, idle)
            .await
            .map_err(|e| {
                if let Some(over) = e.downcast_ref::<pre_slot::OverBudget>() {
                    Stats::bump(&self.stats.pre_slot_refused);
                    RuntimeError::PreSlotFull {
                        script_id: self.script_id.to_string(),
                        scope: over.scope,
                        cap: over.cap,
                    }
                } else if e.downcast_ref::<slow_client::Stalled>().is_some() {
                    Stats::bump(&self.stats.client_timeouts);
                    RuntimeError::ClientTimeout {
                        script_id: self.script_id.to_string(),
                        idle,
                    }
                } else {
                    RuntimeError::BadRequest {
                        script_id: self.script_id.to_string(),
                        message: format!("reading the request body failed: {e}"),
                    }
                }
            })?;
        Ok((
            slow_client::IdleTimeout::new(body, idle).boxed_unsync(),
            charge,
        ))
    }

    /// What happens when an invocation ends: a healthy instance goes back
    /// to the idle pool, a failed one is discarded and counted by why;
    /// either way the request's `slots` are given back.
    fn on_done(
        self: &Arc<Self>,
        slots: Slots,
        meter: Arc<crate::instances::cpu::CpuMeter>,
        back: Option<tokio::sync::oneshot::Sender<Instance>>,
    ) -> OnDone {
        let me = self.clone();
        Box::new(move |r| {
            // Read before the instance goes back: its next request resets it.
            if let Some(observe) = me.node.cpu_observer.get() {
                observe(&me.script_id, meter.used());
            }
            match r {
                // An object's instance goes back to its object, never to
                // the pool; one the object no longer waits for is dropped.
                Ok(inst) => match back {
                    Some(back) => drop(back.send(inst)),
                    None => me.put_idle(inst),
                },
                Err(e) => {
                    let c = match e {
                        RuntimeError::CpuExceeded { .. } | RuntimeError::FlowCpuExceeded { .. } => {
                            &me.stats.cpu_kills
                        }
                        RuntimeError::MemoryExceeded { .. } => &me.stats.memory_kills,
                        RuntimeError::WallTimeExceeded { .. } => &me.stats.wall_kills,
                        _ => &me.stats.traps,
                    };
                    Stats::bump(c);
                    tracing::warn!(script = %me.script_id, error = %e, "request failed; instance discarded");
                }
            }
            drop(slots);
        })
    }

    /// The trace level of a request: traced if its flow is (the node put a
    /// [`crate::outbound::tail::Tracing`] in it), or if it enters a flow as a
    /// Worker with tail Workers, in which case this node collects the flow and
    /// the sink goes into `extensions` for the nested calls to find. Recorded
    /// too (without a sink) while someone watches the Worker live
    /// ([`crate::outbound::live_tail`]).
    fn trace_level(
        &self,
        flow: &crate::flow::Flow,
        extensions: &mut http::Extensions,
        invoker: &Option<Arc<dyn crate::flow::Invoker>>,
        limits: PlanLimits,
        request: &http::request::Parts,
    ) -> Option<crate::outbound::tail::Level> {
        use crate::outbound::tail::{
            Collector, Level, LiveRequest, TailDelivery, TraceBuffer, Tracing,
        };
        let live = self.node.live.wants(&self.script_id).then(|| LiveRequest {
            hub: self.node.live.clone(),
            method: request.method.to_string(),
            url: crate::outbound::tail::redact_url(&request.uri.to_string()),
        });
        let (sink, tails) = match extensions.get::<Tracing>() {
            Some(t) => (Some(t.clone()), None),
            None if flow.depth == 0 && !self.bindings.tail.is_empty() => {
                let collector = Arc::new(Collector::new(self.stats.clone()));
                let sink = Tracing(collector.clone());
                extensions.insert(sink.clone());
                let tails = TailDelivery {
                    collector,
                    entry: self.script_id.to_string(),
                    tails: self.bindings.tail.clone(),
                    invoker: invoker.clone(),
                    limits,
                    stats: self.stats.clone(),
                    mark: crate::flow::LoopMark::of(&request.headers),
                };
                (Some(sink), Some(tails))
            }
            None if live.is_some() => (None, None),
            None => return None,
        };
        Some(Level {
            buffer: TraceBuffer::new(&self.script_id),
            sink,
            live,
            node_status: None,
            started: Instant::now(),
            node: invoker.as_ref().map(|i| i.node_id()).unwrap_or_default(),
            tails,
            stats: self.stats.clone(),
        })
    }

    /// The error for an invocation that ended without a response. A reused
    /// instance that returned normally without answering is the signature
    /// of a guest that cannot survive reuse: the Worker gets fresh
    /// instances from now on.
    fn finished_without_response(
        &self,
        j: Result<crate::instances::instance::InvokeOutcome, tokio::task::JoinError>,
        reused: bool,
    ) -> RuntimeError {
        match j {
            Ok(out) => match out.result {
                Err(e) => e,
                Ok(()) => {
                    if reused && !self.demoted.swap(true, Ordering::Relaxed) {
                        Stats::bump(&self.stats.reuse_demotions);
                        self.idle.lock().unwrap_or_else(|p| p.into_inner()).clear();
                        tracing::warn!(script = %self.script_id,
                            "a reused instance returned without a response; \
                             this Worker gets a fresh instance per request from now on \
                             (deploy it with lifecycle = \"fresh\")");
                    }
                    RuntimeError::NoResponse(self.script_id.to_string())
                }
            },
            Err(e) => RuntimeError::Trap {
                script_id: self.script_id.to_string(),
                message: format!("host task failed: {e}"),
            },
        }
    }
}

/// A traced level reports once its invocation has ended (`ended`, or when
/// `task` finishes); the response body ends only after that (see
/// `crate::outbound::tail`), so the returned receiver holds it.
fn finish_when_ended(
    level: crate::outbound::tail::Level,
    status: Option<u16>,
    ended: Option<Result<crate::instances::instance::InvokeOutcome, tokio::task::JoinError>>,
    task: tokio::task::JoinHandle<crate::instances::instance::InvokeOutcome>,
) -> tokio::sync::oneshot::Receiver<()> {
    let (done, hold) = tokio::sync::oneshot::channel();
    tokio::spawn(async move {
        let outcome = match ended {
            Some(j) => j,
            None => task.await,
        };
        let (error, cpu) = match outcome {
            Ok(o) => (o.result.err().map(|e| e.public_message()), o.cpu),
            Err(e) => (Some(format!("host task failed: {e}")), Duration::ZERO),
        };
        level.finish(status, error, cpu).await;
        let _ = done.send(());
    });
    hold
}

/// Reports a traced level that failed without a response (before its
/// error goes back), and returns the error.
async fn finish_failed(
    level: Option<crate::outbound::tail::Level>,
    e: RuntimeError,
) -> RuntimeError {
    if let Some(mut level) = level {
        level.node_status = Some(e.status().as_u16());
        level
            .finish(None, Some(e.public_message()), Duration::ZERO)
            .await;
    }
    e
}

/// Links `component` against the WASI + wasi:http linker, with a clear
/// message naming what is missing when it imports something hearth does not
/// provide.
pub(crate) fn link(
    linker: &Linker<Host>,
    component: &Component,
) -> Result<ProxyPre<Host>, CompileError> {
    let ipre = linker
        .instantiate_pre(component)
        .map_err(CompileError::Link)?;
    ProxyPre::new(ipre).map_err(CompileError::Link)
}
