//! A hearth node: the runtime, its metrics and, in a cluster, the ring and
//! the shard client/server.
//!
//! Every request reaches [`Node::handle`] (from the front door,
//! [`crate::front_door`]) or [`Node::route`] (a Worker calling a Worker,
//! [`crate::invoker`]). The node decides once, with
//! [`hearth_sharding::routing::decide`], where it is served: *here*, in the
//! role `local` (warm here) or `home` (this node is its home), or *at its
//! home* through the shard client, whose answer settles the role
//! (`sharded` at the home, or `fallback` back here). The role travels with
//! the request to the node that runs the Worker
//! ([`HostedWorkers::serve`]), and that node's one serving function
//! (`NodeState::serve`) stamps `x-hearth-node`, `x-hearth-route` and
//! `server-timing` and counts the request in `hearth_requests_total`. The
//! receiving node of a forwarded request adds only the hop
//! (`server-timing: shard;dur=…`, `hearth_shard_hop_seconds`).

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use futures::future::BoxFuture;
use hearth_runtime::body::Body;
use hearth_runtime::store::meta::Share;
use hearth_runtime::store::versions::VersionError;
use hearth_runtime::timing::SERVER_TIMING_HEADER;
use hearth_runtime::{DeployReport, Runtime, error_response};
use hearth_sharding::context_stack::ContextStack;
use hearth_sharding::hosted_workers::{HostedWorkers, PrewarmOutcome};
use hearth_sharding::inline::MAX_INLINE_BODY_BYTES;
use hearth_sharding::ring::{Member, NodeId, SharedRing};
use hearth_sharding::routing::{
    Decision, Route, decide, decide_object, is_object_key, may_fall_back, object_script,
};
use hearth_sharding::rpc::RpcNode;

use crate::metrics::Metrics;
use crate::prewarm::{At, PrewarmConfig, Prewarmer};
use crate::telemetry::{SpanKind, Telemetry};

/// Response header naming the node that served the request.
pub const NODE_HEADER: &str = "x-hearth-node";
/// Response header of a 503 for a Durable Object whose home did not take
/// the request: the home the answering node sees on its ring.
pub const OBJECT_HOME_HEADER: &str = "x-hearth-object-home";
pub use hearth_sharding::routing::ROUTE_HEADER;

/// What every handle of a [`Node`] shares: its ID, runtime, metrics,
/// prewarmer and, once joined, its RPC node and cluster link.
pub(crate) struct NodeState {
    id: NodeId,
    runtime: Runtime,
    metrics: Metrics,
    prewarmer: Arc<Prewarmer>,
    rpc: Arc<OnceLock<RpcNode>>,
    /// The cluster, once joined: the ring requests are routed by.
    link: OnceLock<ClusterLink>,
    /// Ring members this node waits for before it reports ready (itself,
    /// plus one if it joins through seeds); 0 for a standalone node.
    members_expected: AtomicUsize,
    /// Set when the node starts to drain: it stops reporting ready.
    draining: AtomicBool,
    /// Precompiling for a new engine ([`Node::set_precompiling`]).
    precompiling: AtomicBool,
    /// Span export, when on ([`Node::set_telemetry`]).
    telemetry: OnceLock<Telemetry>,
}

/// Where a request is served, decided once by [`NodeState::place`].
enum Placement<'a> {
    /// On this node, in this role ([`Route::Local`] or [`Route::Home`]).
    Here(Route),
    /// At the Worker's home, through this node's shard client.
    Home(Member, &'a RpcNode),
}

/// A Worker's home on the ring and the shard client that reaches it: what
/// [`decide`] compares with this node's ID.
struct HomeVia<'r, 'a> {
    member: &'r Member,
    rpc: &'a RpcNode,
}

impl PartialEq<NodeId> for HomeVia<'_, '_> {
    fn eq(&self, id: &NodeId) -> bool {
        self.member.id == *id
    }
}

impl NodeState {
    /// This node's ID.
    pub(crate) fn id(&self) -> &str {
        self.id.as_str()
    }

    /// This node's span export, when on.
    pub(crate) fn telemetry(&self) -> Option<&Telemetry> {
        self.telemetry.get()
    }

    /// The routing decision for a request for `script_id` arriving here now
    /// ([`decide`]). A node that has not joined a cluster, or whose ring is
    /// empty, has no home to ask: it is every Worker's home. A name this
    /// node knows no Worker is deployed under (its negative cache, filled by
    /// its own store reads and by its homes' "not deployed" answers) is
    /// answered here, as `local`: the same 404 its home would give, without
    /// the shard hop.
    ///
    /// A Durable Object's ring key ([`is_object_key`]) is placed by
    /// [`decide_object`]: at its home only, whatever is warm or missing
    /// here.
    fn place(&self, script_id: &str) -> Placement<'_> {
        let object = is_object_key(script_id);
        let warm = !object && self.runtime.is_warm(script_id);
        if !object && !warm && self.runtime.is_known_missing(script_id) {
            return Placement::Here(Route::Local);
        }
        let cluster = self.link.get().zip(self.rpc.get());
        let ring = cluster.map(|(link, _)| link.ring.load());
        let home = cluster.zip(ring.as_ref()).and_then(|((_, rpc), ring)| {
            Some(HomeVia {
                member: ring.home(script_id)?,
                rpc,
            })
        });
        let decision = if object {
            decide_object(&self.id, home.as_ref())
        } else {
            decide(&self.id, home.as_ref(), warm)
        };
        match decision {
            Decision::Serve(route) => Placement::Here(route),
            Decision::Forward(home) => Placement::Home(home.member.clone(), home.rpc),
        }
    }

    /// Serves `script_id` on this node in `role`. The one place a response
    /// gets this node's name (`x-hearth-node`), its role
    /// (`x-hearth-route`) and `server-timing`, and is counted
    /// (`hearth_requests_total{route, start}`, and per Worker
    /// `hearth_worker_*{script}`).
    async fn serve(
        &self,
        role: Route,
        script_id: &str,
        mut req: http::Request<Body>,
    ) -> http::Response<Body> {
        if role == Route::Fallback && !may_fall_back(script_id) {
            return self.object_home_unavailable(script_id);
        }
        crate::invoker::attach_flow(&mut req);
        let span = self.start_worker_span(&mut req);
        let (mut resp, start, deployed) = match self.runtime.handle(script_id, req).await {
            Ok(served) => {
                let start = served.start.as_str();
                (served.into_response(), start, true)
            }
            Err(e) => {
                let deployed = !matches!(e, hearth_runtime::RuntimeError::UnknownScript(_));
                (error_response(&e), "error", deployed)
            }
        };
        self.metrics.record(role, start);
        // Names nobody deployed get no per-Worker series; an object's
        // requests count under its script, not one series per object.
        if deployed {
            let worker = object_script(script_id).unwrap_or(script_id);
            self.metrics.workers.record(worker, start);
        }
        self.stamp(&mut resp, role);
        if let Some((telemetry, span, depth)) = span {
            let mut attributes = crate::telemetry::response_attributes(script_id, &resp);
            attributes.push(("hearth.node", self.id().into()));
            attributes.push(("hearth.start", start.into()));
            attributes.push(("hearth.depth", depth.into()));
            let error = resp.status().is_server_error();
            telemetry.finish(span, "hearth.worker", SpanKind::Server, attributes, error);
        }
        resp
    }

    /// The answer to a request for a Durable Object whose home refused it
    /// or could not be reached ([`Route::Fallback`]): never served here
    /// (that would be a second live instance, [`may_fall_back`]), but 503
    /// with `retry-after: 1`, naming the home this node sees, and counted
    /// (`hearth_object_home_unavailable_total`, and as a `fallback` with
    /// start `error`).
    fn object_home_unavailable(&self, ring_key: &str) -> http::Response<Body> {
        let home = self
            .link
            .get()
            .and_then(|link| Some(link.ring.load().home(ring_key)?.id.to_string()))
            .unwrap_or_else(|| "unknown".to_string());
        self.metrics.object_home_unavailable.inc();
        self.metrics.record(Route::Fallback, "error");
        tracing::debug!(object = ring_key, %home,
            "a Durable Object's home did not take its request: 503, not served here");
        let mut resp = hearth_runtime::body::text_response(
            http::StatusCode::SERVICE_UNAVAILABLE,
            format!(
                "the Durable Object's home ({home}) did not take the request; it is not served \
                 anywhere else, retry shortly\n"
            ),
        );
        resp.headers_mut().insert(
            http::header::RETRY_AFTER,
            http::HeaderValue::from_static("1"),
        );
        if let Ok(v) = http::HeaderValue::from_str(&home) {
            resp.headers_mut().insert(OBJECT_HOME_HEADER, v);
        }
        self.stamp(&mut resp, Route::Fallback);
        resp
    }

    /// Starts the `hearth.worker` span of a traced request (its context
    /// stack carries a sampled trace context; [`crate::telemetry`]) and
    /// makes it the parent of what the Worker calls, and of what it sends
    /// on with the `traceparent` header it sees. Off: nothing.
    fn start_worker_span(
        &self,
        req: &mut http::Request<Body>,
    ) -> Option<(&Telemetry, crate::telemetry::ActiveSpan, i64)> {
        let telemetry = self.telemetry.get()?;
        let stack = req.extensions_mut().get_mut::<ContextStack>()?;
        let span = telemetry.start_child(stack.trace()?)?;
        stack.set_trace(Some(span.context()));
        let depth = stack.frames().len().saturating_sub(1) as i64;
        if let Ok(v) = http::HeaderValue::from_str(&span.context().header_value()) {
            req.headers_mut()
                .insert(crate::telemetry::TRACEPARENT_HEADER, v);
        }
        Some((telemetry, span, depth))
    }

    /// Names this node and `role` in `resp`'s headers.
    fn stamp(&self, resp: &mut http::Response<Body>, role: Route) {
        let h = resp.headers_mut();
        if let Ok(v) = http::HeaderValue::from_str(self.id.as_str()) {
            h.insert(NODE_HEADER, v);
        }
        h.insert(ROUTE_HEADER, role.header_value());
    }
}

/// Whether `resp` is a node's "no Worker is deployed under this name": a
/// 404 the runtime made ([`hearth_runtime::UNKNOWN_SCRIPT_HEADER`], and no
/// `x-hearth-start`, which every response a Worker served carries).
fn is_not_deployed(resp: &http::Response<Body>) -> bool {
    let h = resp.headers();
    resp.status() == http::StatusCode::NOT_FOUND
        && !h.contains_key(hearth_runtime::timing::START_HEADER)
        && h.get(hearth_runtime::UNKNOWN_SCRIPT_HEADER)
            .is_some_and(|v| v == "unknown-script")
}

/// Prepends the shard hop to a response's `server-timing` (the serving
/// node's phases follow it).
fn add_hop_timing(headers: &mut http::HeaderMap, hop: Duration) {
    let shard = format!("shard;dur={:.3}", hop.as_secs_f64() * 1000.0);
    let value = match headers
        .get(SERVER_TIMING_HEADER)
        .and_then(|v| v.to_str().ok())
    {
        Some(timing) if !timing.is_empty() => format!("{shard}, {timing}"),
        _ => shard,
    };
    if let Ok(v) = http::HeaderValue::from_str(&value) {
        headers.insert(SERVER_TIMING_HEADER, v);
    }
}

/// This node's Workers as the cluster layer runs them ([`HostedWorkers`]):
/// as a home (the shard server) or through a lazy instance handed back by a
/// refusing home.
struct NodeWorkers(Arc<NodeState>);

impl HostedWorkers for NodeWorkers {
    fn serve(
        &self,
        role: Route,
        script_id: &str,
        req: http::Request<Body>,
    ) -> BoxFuture<'static, http::Response<Body>> {
        let me = self.0.clone();
        let id = script_id.to_string();
        Box::pin(async move { me.serve(role, &id, req).await })
    }

    fn is_warm(&self, script_id: &str) -> bool {
        self.0.runtime.is_warm(script_id)
    }

    fn can_host(&self, script_id: &str) -> bool {
        self.0.runtime.can_host(script_id)
    }

    /// A home's answer to `ShardServer.prewarm`: here, within this node's
    /// prewarm bounds.
    fn prewarm(&self, script_id: &str) -> BoxFuture<'static, PrewarmOutcome> {
        let prewarmer = self.0.prewarmer.clone();
        let id = script_id.to_string();
        Box::pin(async move { prewarmer.here(&id).await })
    }

    /// A member took a deploy (or a secret change) of `script_id`:
    /// revalidate a warm copy of another revision against the store.
    fn redeployed(&self, script_id: &str, hash: &str) -> BoxFuture<'static, ()> {
        let runtime = self.0.runtime.clone();
        let (id, hash) = (script_id.to_string(), hash.to_string());
        Box::pin(async move {
            if runtime.revalidate(&id, &hash).await {
                tracing::debug!(script = %id, "stale copy dropped on a deploy announcement");
            }
        })
    }

    /// This node's live tail of `script_id` for a peer that gathers the
    /// cluster's ([`crate::live_tail`]).
    fn tail(
        &self,
        script_id: &str,
        status: &str,
        sample: f64,
    ) -> Result<futures::stream::BoxStream<'static, String>, String> {
        use hearth_runtime::outbound::live_tail::StatusFilter;
        let filter = if status.is_empty() {
            StatusFilter::default()
        } else {
            status.parse::<StatusFilter>().map_err(|e| e.to_string())?
        };
        let sample =
            hearth_runtime::outbound::live_tail::sample_rate(sample).map_err(|e| e.to_string())?;
        let sub = self
            .0
            .runtime
            .live_tail()
            .subscribe(script_id, filter, sample);
        let node = Node {
            state: self.0.clone(),
        };
        Ok(crate::live_tail::for_peer(node, sub))
    }

    /// Drops the warm copy here unless this node is the Worker's home.
    fn hand_back(&self, script_id: &str) -> bool {
        let Some(link) = self.0.link.get() else {
            return false;
        };
        let ring = link.ring.load();
        match ring.home(script_id) {
            Some(home) if home.id != link.self_id => self.0.runtime.evict(script_id),
            _ => false,
        }
    }
}

/// Why a node is not ready for traffic ([`Node::readiness`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NotReady {
    /// It is draining (a signal asked it to stop).
    #[error("draining")]
    Draining,
    /// It is new to this engine (hearth was upgraded) and precompiles its
    /// Workers first, so its first requests load instead of compiling.
    #[error("precompiling Workers for this engine")]
    Precompiling,
    /// Its script store did not answer a read in time, or failed.
    #[error("the script store does not answer: {0}")]
    Store(String),
    /// It has not joined its cluster, or its ring has fewer members than it
    /// joins with.
    #[error("not joined: the ring has {members} of at least {expected} members")]
    NotJoined {
        /// Members on its ring now.
        members: usize,
        /// Members it waits for.
        expected: usize,
    },
}

impl NotReady {
    /// What a caller without the admin token is told: the reason, without
    /// the store's own error text (which can name a bucket, an endpoint or
    /// a credential).
    pub fn summary(&self) -> String {
        match self {
            NotReady::Store(_) => "the script store does not answer".to_string(),
            other => other.to_string(),
        }
    }
}

/// The first wait before a Durable Object call its home did not take is
/// sent again ([`Node::route`]).
pub const OBJECT_RETRY_FIRST: Duration = Duration::from_millis(50);
/// The longest wait between two tries of a Durable Object call.
pub const OBJECT_RETRY_MAX: Duration = Duration::from_millis(800);

/// How often a node drops the idle resident Durable Objects whose ring
/// home is another node now ([`Node::join`]).
pub const OBJECT_HOME_SWEEP: Duration = Duration::from_millis(250);

/// How long a readiness check waits for the store.
pub const READY_STORE_TIMEOUT: Duration = Duration::from_secs(2);

/// What a deploy through a node did: the runtime's report, and how the
/// rest of the cluster heard of it.
#[derive(Debug, Clone, serde::Serialize)]
pub struct NodeDeploy {
    /// The runtime's report (stored metadata, compile time).
    #[serde(flatten)]
    pub report: DeployReport,
    /// The announcement to the other members.
    pub announced: Announcement,
}

/// How a deploy's announcement went: every member that acknowledged has
/// dropped a stale warm copy (or held none) before the deploy returned;
/// one that did not catches up within [`hearth_runtime::REVALIDATE_MS`].
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct Announcement {
    /// Members told (every ring member but this node).
    pub members: usize,
    /// Members that answered.
    pub acknowledged: usize,
    /// Milliseconds from the store write until each answering member's
    /// acknowledgement, by node ID.
    pub ack_ms: Vec<(String, f64)>,
    /// Members that could not be told, and why.
    pub failed: Vec<(String, String)>,
}

/// What a rollback or a new split did ([`Node::set_deployment`]).
#[derive(Debug, Clone, serde::Serialize)]
pub struct DeploymentChange {
    /// The Worker.
    pub script_id: String,
    /// Its deployment now: one version at 100%, or a split.
    pub deployment: Vec<Share>,
    /// How the other members heard of it.
    pub announced: Announcement,
}

/// What a hand-back did ([`Node::hand_back`]).
#[derive(Debug, Clone, serde::Serialize)]
pub struct HandBack {
    /// The Worker.
    pub script_id: String,
    /// Its home now.
    pub home: String,
    /// How the home's prewarm went.
    pub home_prewarm: &'static str,
    /// Members that dropped a warm copy.
    pub dropped: Vec<String>,
    /// Members that could not be asked, and why.
    pub failed: Vec<(String, String)>,
}

/// What a node needs to be part of a cluster.
pub struct ClusterLink {
    /// This node's ID on the ring.
    pub self_id: NodeId,
    /// The current ring (kept up to date by membership).
    pub ring: SharedRing,
}

/// One node. Cheap to clone.
#[derive(Clone)]
pub struct Node {
    state: Arc<NodeState>,
}

impl Node {
    /// A standalone node over `runtime`: every Worker is served here. It
    /// prewarms with the default [`PrewarmConfig`].
    pub fn new(id: impl Into<String>, runtime: Runtime) -> Self {
        Self::with_prewarm(id, runtime, PrewarmConfig::default())
    }

    /// [`Node::new`] with its prewarms configured by `prewarm`.
    pub fn with_prewarm(id: impl Into<String>, runtime: Runtime, prewarm: PrewarmConfig) -> Self {
        let rpc = Arc::new(OnceLock::new());
        let metrics = Metrics::new(runtime.clone(), rpc.clone());
        let prewarmer = Arc::new(Prewarmer::new(
            prewarm,
            runtime.clone(),
            metrics.prewarms.clone(),
        ));
        let node = Node {
            state: Arc::new(NodeState {
                id: NodeId::new(id),
                metrics,
                prewarmer,
                runtime,
                rpc,
                link: OnceLock::new(),
                members_expected: AtomicUsize::new(0),
                draining: AtomicBool::new(false),
                precompiling: AtomicBool::new(false),
                telemetry: OnceLock::new(),
            }),
        };
        node.install_invoker();
        node
    }

    /// A node from its shared state (for the nested-call invoker).
    pub(crate) fn from_state(state: Arc<NodeState>) -> Self {
        Node { state }
    }

    /// Lets this node's Workers call Workers, routed as this node routes
    /// ([`crate::invoker`]).
    fn install_invoker(&self) {
        self.state
            .runtime
            .set_invoker(Arc::new(crate::invoker::NodeInvoker {
                state: Arc::downgrade(&self.state),
            }));
    }

    /// This node's Workers as the cluster layer sees them (pass to
    /// [`RpcNode::start`]).
    pub fn hosted_workers(&self) -> Arc<dyn HostedWorkers> {
        Arc::new(NodeWorkers(self.state.clone()))
    }

    /// Joins this node to a cluster: requests for Workers homed elsewhere
    /// are forwarded through `rpc` (started with [`Node::hosted_workers`]).
    /// A node joins once; a second call changes nothing.
    pub fn join(self, link: ClusterLink, rpc: RpcNode) -> Self {
        let _ = self.state.rpc.set(rpc);
        self.state
            .metrics
            .observe_ring(link.self_id.clone(), link.ring.clone());
        let ring = link.ring.clone();
        let self_id = link.self_id.clone();
        if self.state.link.set(link).is_ok() {
            // The alarm scheduler fires only the alarms of objects homed here.
            self.state
                .runtime
                .objects()
                .set_home_check(Box::new(move |ring_key| {
                    ring.load()
                        .home(ring_key)
                        .is_none_or(|home| home.id == self_id)
                }));
            self.watch_object_homes();
        }
        self
    }

    /// Keeps this node's resident Durable Objects to those it is the ring
    /// home of: every [`OBJECT_HOME_SWEEP`], the idle residents whose home
    /// is now another node are dropped
    /// ([`hearth_runtime::objects::NodeObjects::release_where`]). An object
    /// a node took over while its home was down is then reopened from
    /// storage, with a new epoch, if the ring ever gives it back to this
    /// node, never served from a working copy other owners have since
    /// written past. The task ends with the node (it holds it weakly);
    /// outside a tokio runtime there is none.
    fn watch_object_homes(&self) {
        let Ok(handle) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let state = Arc::downgrade(&self.state);
        handle.spawn(async move {
            let mut tick = tokio::time::interval(OBJECT_HOME_SWEEP);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                let Some(state) = state.upgrade() else {
                    return;
                };
                let Some(link) = state.link.get() else {
                    continue;
                };
                let ring = link.ring.load();
                let objects = state.runtime.objects();
                if objects.resident_count() == 0 {
                    continue;
                }
                let released = objects.release_where(|key| {
                    ring.home(&key.ring_key())
                        .is_none_or(|home| home.id == link.self_id)
                });
                if released > 0 {
                    tracing::debug!(
                        released,
                        "Durable Objects homed elsewhere now were released"
                    );
                }
            }
        });
    }

    /// This node's ID.
    pub fn id(&self) -> &str {
        self.state.id()
    }

    /// This node's span export, when on.
    pub(crate) fn telemetry(&self) -> Option<&Telemetry> {
        self.state.telemetry()
    }

    /// Exports this node's request spans through `telemetry` from now on
    /// ([`crate::telemetry`]); set once, a second call changes nothing.
    pub fn set_telemetry(&self, telemetry: Telemetry) {
        let _ = self.state.telemetry.set(telemetry);
    }

    /// Makes [`Node::readiness`] wait until this node's ring has at least
    /// `members` members (itself included): 2 for a node that joins through
    /// seeds, so it is not ready while it is alone on its ring.
    pub fn expect_members(&self, members: usize) {
        self.state
            .members_expected
            .store(members, Ordering::Relaxed);
    }

    /// Marks the node as draining: from now on it is not ready, so a load
    /// balancer stops sending it traffic while it finishes what it has.
    pub fn start_draining(&self) {
        self.state.draining.store(true, Ordering::Relaxed);
    }

    /// Whether the node was told to stop ([`Node::start_draining`]): long
    /// admin streams (`hearth tail`) end so the admin API can stop.
    pub fn is_draining(&self) -> bool {
        self.state.draining.load(Ordering::Relaxed)
    }

    /// Keeps the node not ready while `on` ([`NotReady::Precompiling`]):
    /// `hearth serve` sets it while it precompiles for a new engine.
    pub fn set_precompiling(&self, on: bool) {
        self.state.precompiling.store(on, Ordering::Relaxed);
    }

    /// Whether the node should get traffic now (`/readyz`): not draining, not
    /// precompiling for a new engine,
    /// its script store answers a read within [`READY_STORE_TIMEOUT`], and
    /// its ring has the members it waits for ([`Node::expect_members`]).
    pub async fn readiness(&self) -> Result<(), NotReady> {
        let state = &self.state;
        if state.draining.load(Ordering::Relaxed) {
            return Err(NotReady::Draining);
        }
        if state.precompiling.load(Ordering::Relaxed) {
            return Err(NotReady::Precompiling);
        }
        let expected = state.members_expected.load(Ordering::Relaxed);
        let members = state
            .link
            .get()
            .map_or(0, |link| link.ring.load().members().len());
        if members < expected {
            return Err(NotReady::NotJoined { members, expected });
        }
        // Any read will do; a name no Worker has keeps it cheap.
        let probe = state.runtime.script_store().meta("hearth-readyz-probe");
        match tokio::time::timeout(READY_STORE_TIMEOUT, probe).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(e)) => Err(NotReady::Store(e.to_string())),
            Err(_) => Err(NotReady::Store(format!(
                "no answer within {READY_STORE_TIMEOUT:?}"
            ))),
        }
    }

    /// The node's runtime.
    pub fn runtime(&self) -> &Runtime {
        &self.state.runtime
    }

    /// The ring this node routes by now, in a cluster.
    pub fn ring(&self) -> Option<std::sync::Arc<hearth_sharding::ring::Ring>> {
        self.state.link.get().map(|c| c.ring.load_full())
    }

    /// The node's RPC layer, in a cluster.
    pub fn rpc(&self) -> Option<&RpcNode> {
        self.state.rpc.get()
    }

    /// The node's metrics.
    pub fn metrics(&self) -> &Metrics {
        &self.state.metrics
    }

    /// The node's prewarms and their counters.
    pub fn prewarmer(&self) -> &Arc<Prewarmer> {
        &self.state.prewarmer
    }

    /// Deploys `source` as `script_id` with `manifest` (see
    /// [`Runtime::deploy`]), then announces the new version to every other
    /// member at once and waits for their answers: when this returns, every
    /// member that acknowledged serves the new version. A member that
    /// could not be told catches up within [`hearth_runtime::REVALIDATE_MS`]
    /// by itself.
    pub async fn deploy(
        &self,
        script_id: &str,
        manifest: impl Into<hearth_runtime::Manifest>,
        source: Vec<u8>,
    ) -> Result<NodeDeploy, hearth_runtime::DeployError> {
        let report = self
            .state
            .runtime
            .deploy(script_id, manifest, source)
            .await?;
        let announced = self.announce(script_id, &report.meta.revision()).await;
        if !announced.failed.is_empty() {
            tracing::warn!(script = script_id, failed = ?announced.failed,
                "some members were not told of the deploy; they revalidate within a second");
        }
        Ok(NodeDeploy { report, announced })
    }

    /// Puts secret `name` of `script_id` (see [`Runtime::put_secret`]),
    /// then announces the change as a deploy is announced: when this
    /// returns, every member that acknowledged serves with the new value.
    pub async fn put_secret(
        &self,
        script_id: &str,
        name: &str,
        value: &str,
    ) -> Result<Announcement, hearth_runtime::store::secrets::SecretError> {
        let meta = self
            .state
            .runtime
            .put_secret(script_id, name, value)
            .await?;
        Ok(self.announce(script_id, &meta.revision()).await)
    }

    /// Deletes secret `name` of `script_id`, announced like
    /// [`Node::put_secret`] if there was one; whether there was.
    pub async fn delete_secret(
        &self,
        script_id: &str,
        name: &str,
    ) -> Result<(bool, Announcement), hearth_runtime::store::secrets::SecretError> {
        let (meta, deleted) = self.state.runtime.delete_secret(script_id, name).await?;
        let announced = if deleted {
            self.announce(script_id, &meta.revision()).await
        } else {
            Announcement::default()
        };
        Ok((deleted, announced))
    }

    /// Makes `shares` the current deployment of `script_id` (a split, or
    /// one version at 100%: see [`hearth_runtime::store::versions`]), then
    /// announces it as a deploy is announced: when this returns, every
    /// member that acknowledged serves the new deployment.
    pub async fn set_deployment(
        &self,
        script_id: &str,
        shares: &[Share],
    ) -> Result<DeploymentChange, VersionError> {
        let meta = self.state.runtime.set_deployment(script_id, shares).await?;
        Ok(self.deployment_changed(meta).await)
    }

    /// Rolls `script_id` back to `version` (by default the version before
    /// the current one) at 100%, announced like
    /// [`Node::set_deployment`].
    pub async fn rollback(
        &self,
        script_id: &str,
        version: Option<u64>,
    ) -> Result<DeploymentChange, VersionError> {
        let meta = self.state.runtime.rollback(script_id, version).await?;
        Ok(self.deployment_changed(meta).await)
    }

    /// Announces `meta`, the new current deployment, and reports it.
    async fn deployment_changed(&self, meta: hearth_runtime::ScriptMeta) -> DeploymentChange {
        let announced = self.announce(&meta.script_id, &meta.revision()).await;
        if !announced.failed.is_empty() {
            tracing::warn!(script = %meta.script_id, failed = ?announced.failed,
                "some members were not told of the new deployment; they revalidate within a second");
        }
        DeploymentChange {
            deployment: hearth_runtime::store::versions::deployment_of(&meta),
            script_id: meta.script_id,
            announced,
        }
    }

    /// Tells every other ring member that `script_id` is now at
    /// `revision` ([`hearth_runtime::ScriptMeta::revision`]: its source
    /// hash, vars and secrets), all at once.
    async fn announce(&self, script_id: &str, hash: &str) -> Announcement {
        let (Some(cluster), Some(rpc)) = (self.state.link.get(), self.state.rpc.get()) else {
            return Announcement::default();
        };
        let ring = cluster.ring.load_full();
        let others: Vec<_> = ring
            .members()
            .iter()
            .filter(|n| n.id != cluster.self_id)
            .collect();
        let t = std::time::Instant::now();
        let answers = futures::future::join_all(others.iter().map(|member| async move {
            let r = rpc.announce_redeploy(member, script_id, hash).await;
            (member.id.to_string(), r, t.elapsed())
        }))
        .await;
        let mut a = Announcement {
            members: others.len(),
            ..Announcement::default()
        };
        for (id, result, took) in answers {
            match result {
                Ok(()) => {
                    a.acknowledged += 1;
                    a.ack_ms.push((id, took.as_secs_f64() * 1000.0));
                }
                Err(e) => a.failed.push((id, e.to_string())),
            }
        }
        a
    }

    /// Hands `script_id` back to its home now (after a crashed home has
    /// rejoined, say): prewarms it at the home, then asks every other member
    /// to drop its warm copy, so requests go to the home from the next one
    /// on. Standalone, there is nothing to hand back.
    pub async fn hand_back(&self, script_id: &str) -> Option<HandBack> {
        let (cluster, rpc) = (self.state.link.get()?, self.state.rpc.get()?);
        let ring = cluster.ring.load_full();
        let home = ring.home(script_id)?.clone();
        let home_prewarm = if home.id == cluster.self_id {
            self.state.prewarmer.here(script_id).await
        } else {
            self.state.prewarmer.at_home(rpc, &home, script_id).await
        };
        let mut out = HandBack {
            script_id: script_id.to_string(),
            home: home.id.to_string(),
            home_prewarm: home_prewarm.as_str(),
            dropped: Vec::new(),
            failed: Vec::new(),
        };
        if home.id != cluster.self_id && self.state.runtime.evict(script_id) {
            out.dropped.push(cluster.self_id.to_string());
        }
        let others = ring
            .members()
            .iter()
            .filter(|n| n.id != cluster.self_id && n.id != home.id);
        let answers = futures::future::join_all(others.map(|member| async move {
            (
                member.id.to_string(),
                rpc.hand_back(member, script_id).await,
            )
        }))
        .await;
        for (id, r) in answers {
            match r {
                Ok(true) => out.dropped.push(id),
                Ok(false) => {}
                Err(e) => out.failed.push((id, e.to_string())),
            }
        }
        Some(out)
    }

    /// A TLS ClientHello named `sni`: starts a prewarm of the Worker it
    /// names (same rule as the Host header) where its request will be
    /// served, and returns at once. No SNI Worker, or prewarm off: nothing.
    pub fn prewarm_hint(&self, sni: &str) {
        if !self.state.prewarmer.config().enabled {
            return;
        }
        let Some(id) = crate::front_door::script_id_from_host(sni) else {
            return;
        };
        let node = self.clone();
        tokio::spawn(async move {
            node.prewarm(&id).await;
        });
    }

    /// Prewarms `script_id` where a request for it would be served now
    /// (the same decision as [`Node::route`]): here (warm here, this node
    /// is its home, or no cluster) or at its home. Returns where, and what
    /// was done.
    pub async fn prewarm(&self, script_id: &str) -> (At, PrewarmOutcome) {
        let prewarmer = &self.state.prewarmer;
        match self.state.place(script_id) {
            Placement::Here(_) => (At::Here, prewarmer.here(script_id).await),
            Placement::Home(home, rpc) => {
                (At::Home, prewarmer.at_home(rpc, &home, script_id).await)
            }
        }
    }

    /// Serves `req` for `script_id`: here if the Worker is warm here or
    /// this node is its home, else through its home (which may refuse, in
    /// which case it is served here after all).
    ///
    /// With span export on, the request gets its `hearth.request` span
    /// here ([`crate::telemetry`]).
    ///
    /// A request that has looped through hearth's egress more than
    /// `max_loop_passes` times (its `CDN-Loop`) is answered 508 here,
    /// before it is routed or takes a slot anywhere
    /// ([`Runtime::admit_loop`]).
    ///
    /// A Durable Object's ring key is never a client's to address: it is
    /// answered 404 like a name no Worker has, before it is routed (objects
    /// are reached only through their bindings, [`Node::route`]).
    pub async fn handle(&self, script_id: &str, req: http::Request<Body>) -> http::Response<Body> {
        if is_object_key(script_id) {
            return error_response(&hearth_runtime::RuntimeError::UnknownScript(
                script_id.into(),
            ));
        }
        if let Err(e) = self.state.runtime.admit_loop(script_id, req.headers()) {
            return error_response(&e);
        }
        let traced = self
            .state
            .telemetry
            .get()
            .and_then(|t| Some((t, t.start_request(req.headers())?)));
        let Some((telemetry, span)) = traced else {
            return self.route(script_id, req, ContextStack::new()).await;
        };
        let method = req.method().to_string();
        let path = req.uri().path().to_string();
        let mut context = ContextStack::new();
        context.set_trace(Some(span.context()));
        let resp = self.route(script_id, req, context).await;
        let mut attributes = crate::telemetry::response_attributes(script_id, &resp);
        attributes.push(("hearth.node", self.id().into()));
        attributes.push(("http.request.method", method.into()));
        attributes.push(("url.path", path.into()));
        let error = resp.status().is_server_error();
        telemetry.finish(span, "hearth.request", SpanKind::Server, attributes, error);
        resp
    }

    /// [`Node::handle`] for a request of a flow with `context` (a nested
    /// invocation; see [`crate::invoker`]): served here, the context is in
    /// the request's extensions; forwarded, it travels with the request.
    ///
    /// A Durable Object's ring key (a call through an object binding) goes
    /// to the object's home only ([`decide_object`]). If the home refuses
    /// it or cannot be reached, this node does not serve it: the answer is
    /// a 503 naming the home (`NodeState::serve`). A request whose body
    /// is small and complete is tried again until the flow's deadline
    /// ([`OBJECT_RETRY_FIRST`], doubling up to [`OBJECT_RETRY_MAX`]), each
    /// time placed afresh, so a call made while the ring drops a dead home
    /// reaches the object's new home; a larger or streaming body gets the
    /// 503 at once.
    pub async fn route(
        &self,
        script_id: &str,
        req: http::Request<Body>,
        context: ContextStack,
    ) -> http::Response<Body> {
        if !is_object_key(script_id) {
            return self.route_once(script_id, req, context).await.0;
        }
        let Some(deadline) = context.deadline() else {
            return self.route_once(script_id, req, context).await.0;
        };
        let (parts, body) = req.into_parts();
        let body = match hearth_sharding::inline::whole(body, MAX_INLINE_BODY_BYTES).await {
            Ok(bytes) => bytes,
            Err(body) => {
                let req = http::Request::from_parts(parts, body);
                return self.route_once(script_id, req, context).await.0;
            }
        };
        let mut wait = OBJECT_RETRY_FIRST;
        loop {
            let req =
                http::Request::from_parts(parts.clone(), hearth_runtime::body::full(body.clone()));
            let (resp, route) = self.route_once(script_id, req, context.clone()).await;
            if route != Route::Fallback || std::time::Instant::now() + wait >= deadline {
                return resp;
            }
            tracing::debug!(
                object = script_id,
                ?wait,
                "the object's home did not take the call; trying again within the deadline"
            );
            tokio::time::sleep(wait).await;
            wait = (wait * 2).min(OBJECT_RETRY_MAX);
        }
    }

    /// Routes `req` once ([`Node::route`]): served here or forwarded to
    /// its home, and the route it was served in.
    async fn route_once(
        &self,
        script_id: &str,
        mut req: http::Request<Body>,
        context: ContextStack,
    ) -> (http::Response<Body>, Route) {
        if !context.frames().is_empty() || context.trace().is_some() {
            req.extensions_mut().insert(context.clone());
        }
        match self.state.place(script_id) {
            Placement::Here(role) => (self.state.serve(role, script_id, req).await, role),
            Placement::Home(home, rpc) => {
                let generation = self.state.runtime.miss_generation();
                let forwarded = rpc.forward(&home, script_id, context, req).await;
                if !is_object_key(script_id) && is_not_deployed(&forwarded.response) {
                    self.state.runtime.remember_missing(script_id, generation);
                }
                let hop = forwarded.hop;
                let route = forwarded.route();
                let mut resp = forwarded.response;
                self.state.metrics.hop_latency.observe(hop.as_secs_f64());
                if !resp.headers().contains_key(ROUTE_HEADER) {
                    // No node served it (a 502 after the home accepted, made
                    // by the shard client): this node answered, so it
                    // stamps and counts it.
                    self.state.metrics.record(route, "error");
                    self.state.stamp(&mut resp, route);
                }
                add_hop_timing(resp.headers_mut(), hop);
                (resp, route)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::NotReady;

    #[test]
    fn the_router_and_the_objects_agree_on_ring_keys() {
        assert_eq!(
            hearth_sharding::routing::OBJECT_KEY_PREFIX,
            hearth_runtime::objects::RING_KEY_PREFIX
        );
    }

    #[test]
    fn readiness_without_the_token_names_the_reason_not_the_stores_error() {
        let why = NotReady::Store("GET s3://acme-secrets-bucket/scripts: 403 (key AKIA123)".into());
        assert_eq!(why.summary(), "the script store does not answer");
        assert!(
            why.to_string().contains("acme-secrets-bucket"),
            "the token's answer has it"
        );
        assert_eq!(NotReady::Draining.summary(), "draining");
    }
}
