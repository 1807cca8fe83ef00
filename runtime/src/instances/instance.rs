//! One live instance of a Worker: a wasmtime `Store` and the component's
//! exports, started under the startup CPU budget and invoked under the
//! per-request limits.
//!
//! An instance serves one request at a time. Whatever it holds in linear
//! memory is accounted to its Worker (and so to the node's residency budget)
//! for as long as it lives; dropping it gives the memory back.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use wasmtime::component::ComponentExportIndex;
use wasmtime::{Engine, Store, UpdateDeadline};
use wasmtime_wasi_http::WasiHttpView;
use wasmtime_wasi_http::p2::bindings::http::types::ErrorCode;
use wasmtime_wasi_http::p2::bindings::http::types::Scheme;
use wasmtime_wasi_http::p2::bindings::{Proxy, ProxyPre};
use wasmtime_wasi_http::p2::body::HyperOutgoingBody;

use crate::body::Body;
use crate::error::RuntimeError;
use crate::instances::cpu::{CpuExceeded, Metered};
use crate::instances::host::Host;
use crate::limits::PlanLimits;

/// The response channel of one invocation.
pub(crate) type ResponseRx =
    tokio::sync::oneshot::Receiver<Result<hyper::Response<HyperOutgoingBody>, ErrorCode>>;

/// A started instance, idle or serving.
pub(crate) struct Instance {
    store: Store<Host>,
    proxy: Proxy,
    /// Requests served so far.
    pub(crate) served: u64,
    /// When it last finished a request (or started).
    pub(crate) idle_since: Instant,
    accounted: u64,
    counter: Arc<AtomicU64>,
}

/// Which phase's limits apply when a Worker fails.
#[derive(Clone, Copy)]
pub(crate) enum Phase {
    Startup,
    Request,
}

/// Turns a wasmtime failure of `script_id` into the error a user sees.
pub(crate) fn classify(
    script_id: &str,
    phase: Phase,
    err: wasmtime::Error,
    memory_hit: bool,
    memory_limit: u64,
) -> RuntimeError {
    let cpu = err
        .chain()
        .find_map(|c| c.downcast_ref::<CpuExceeded>().copied());
    match (cpu, phase) {
        (Some(c), Phase::Startup) => RuntimeError::StartupCpuExceeded {
            script_id: script_id.into(),
            used: c.used,
            budget: c.budget,
        },
        (Some(c), Phase::Request) if c.flow.is_some() => RuntimeError::FlowCpuExceeded {
            script_id: script_id.into(),
            used: c.used,
            flow_budget: c.flow.unwrap_or_default(),
        },
        (Some(c), Phase::Request) => RuntimeError::CpuExceeded {
            script_id: script_id.into(),
            used: c.used,
            budget: c.budget,
        },
        (None, _) if memory_hit => RuntimeError::MemoryExceeded {
            script_id: script_id.into(),
            limit: memory_limit,
        },
        (None, _) => RuntimeError::Trap {
            script_id: script_id.into(),
            message: format!("{err:?}"),
        },
    }
}

impl Instance {
    /// Instantiates `pre` (running any start functions and the optional
    /// `hearth:worker/init#init` export) under `limits.startup_cpu`.
    pub(crate) async fn start(
        engine: &Engine,
        pre: &ProxyPre<Host>,
        init: Option<&ComponentExportIndex>,
        io: &Arc<crate::instances::host::WorkerIo>,
        limits: &PlanLimits,
        counter: Arc<AtomicU64>,
        node_memory: Arc<crate::instances::host::NodeMemory>,
    ) -> Result<(Instance, std::time::Duration), RuntimeError> {
        let script_id = &*io.script_id;
        if !node_memory.try_take(crate::limits::HOST_RESERVE) {
            return Err(RuntimeError::MemoryExceeded {
                script_id: script_id.into(),
                limit: limits.memory,
            });
        }
        let mut store = Store::new(engine, Host::new(io, limits.memory, node_memory));
        store.limiter(|h| &mut h.memory);
        store.epoch_deadline_callback(|ctx| {
            let yield_now = ctx.data().meter.tick().map_err(wasmtime::Error::new)?;
            Ok(if yield_now {
                UpdateDeadline::Yield(1)
            } else {
                UpdateDeadline::Continue(1)
            })
        });
        store.set_epoch_deadline(1);
        let meter = store.data().meter.clone();
        meter.attach_ticker(engine);
        meter.reset(limits.startup_cpu);
        let cpu = meter.clone();
        let started = Metered::new(
            async {
                let instance = pre.instance_pre().instantiate_async(&mut store).await?;
                let proxy = Proxy::new(&mut store, &instance)?;
                if let Some(idx) = init {
                    let f = instance.get_typed_func::<(), ()>(&mut store, idx)?;
                    f.call_async(&mut store, ()).await?;
                }
                wasmtime::Result::Ok(proxy)
            },
            meter,
        )
        .await;
        match started {
            Ok(proxy) => {
                let accounted = store.data().memory.bytes();
                counter.fetch_add(accounted, Ordering::Relaxed);
                let inst = Instance {
                    store,
                    proxy,
                    served: 0,
                    idle_since: Instant::now(),
                    accounted,
                    counter,
                };
                Ok((inst, cpu.used()))
            }
            Err(e) => Err(classify(
                script_id,
                Phase::Startup,
                e,
                store.data().memory.hit,
                limits.memory,
            )),
        }
    }

    /// Hands `req` to the instance and returns the task that runs the
    /// handler (yielding the instance back if it stays healthy) and the
    /// channel its response arrives on.
    pub(crate) fn invoke(
        mut self,
        script_id: Arc<str>,
        req: http::Request<Body>,
        limits: PlanLimits,
        hooks: crate::outbound::outgoing::Outbound,
        on_done: OnDone,
    ) -> Result<(tokio::task::JoinHandle<InvokeOutcome>, ResponseRx), RuntimeError> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let bad = |e: wasmtime::Error| RuntimeError::BadRequest {
            script_id: script_id.to_string(),
            message: e.to_string(),
        };
        let req = req.map(|b| {
            http_body_util::BodyExt::map_err(b, |e| {
                wasmtime_wasi_http::Error::InternalError(Some(e.to_string()))
            })
        });
        let mut http = self.store.data_mut().http();
        let req = http.new_incoming_request(Scheme::Http, req).map_err(bad)?;
        let out = http.new_response_outparam(tx).map_err(bad)?;
        let meter = self.store.data().meter.clone();
        let flow_cpu = hooks.caller.as_ref().and_then(|c| c.flow_cpu.charged());
        meter.reset_in_flow(limits.request_cpu, flow_cpu);
        self.store.data_mut().memory.hit = false;
        self.store.data_mut().memory.set_limit(limits.memory);
        let trace = hooks.caller.as_ref().and_then(|c| c.trace.clone());
        self.store.data().begin_request(trace);
        self.store.data_mut().hooks = hooks;
        self.store.set_epoch_deadline(1);
        let task = tokio::spawn(async move {
            let handler = self.proxy.wasi_http_incoming_handler();
            let run = Metered::new(
                handler.call_handle(&mut self.store, req, out),
                meter.clone(),
            );
            let result = match tokio::time::timeout(limits.request_wall, run).await {
                Ok(r) => r.map_err(|e| {
                    let hit = self.store.data().memory.hit;
                    classify(&script_id, Phase::Request, e, hit, limits.memory)
                }),
                Err(_) => Err(RuntimeError::WallTimeExceeded {
                    script_id: script_id.to_string(),
                    limit: limits.request_wall,
                }),
            };
            meter.settle_flow();
            let cpu = meter.used();
            match result {
                Ok(()) => {
                    // An idle instance keeps nothing of its last flow.
                    self.store.data_mut().hooks = crate::outbound::outgoing::Outbound::default();
                    self.store.data().end_request();
                    self.served += 1;
                    self.idle_since = Instant::now();
                    self.reaccount();
                    on_done(Ok(self));
                    InvokeOutcome {
                        result: Ok(()),
                        cpu,
                    }
                }
                Err(err) => {
                    // Dropping the store also drops the response sender if
                    // the guest never used it, which wakes the waiter.
                    drop(self);
                    on_done(Err(&err));
                    InvokeOutcome {
                        result: Err(err),
                        cpu,
                    }
                }
            }
        });
        Ok((task, rx))
    }

    /// Bytes of linear memory and tables the instance holds now.
    pub(crate) fn memory_bytes(&self) -> u64 {
        self.store.data().memory.bytes()
    }

    /// The instance's CPU meter (its budget is set per request).
    pub(crate) fn meter(&self) -> Arc<crate::instances::cpu::CpuMeter> {
        self.store.data().meter.clone()
    }

    fn reaccount(&mut self) {
        let now = self.store.data().memory.bytes();
        if now >= self.accounted {
            self.counter
                .fetch_add(now - self.accounted, Ordering::Relaxed);
        } else {
            self.counter
                .fetch_sub(self.accounted - now, Ordering::Relaxed);
        }
        self.accounted = now;
    }
}

impl Drop for Instance {
    fn drop(&mut self) {
        self.counter.fetch_sub(self.accounted, Ordering::Relaxed);
    }
}

/// How one invocation ended.
pub(crate) struct InvokeOutcome {
    /// `Ok` if the handler returned normally.
    pub(crate) result: Result<(), RuntimeError>,
    /// CPU time the handler used.
    pub(crate) cpu: std::time::Duration,
}

/// Called when an invocation ends, on the task that ran it: with the
/// instance if it is healthy and may serve again, else with the error (the
/// instance is already gone).
pub(crate) type OnDone = Box<dyn FnOnce(Result<Instance, &RuntimeError>) + Send>;
