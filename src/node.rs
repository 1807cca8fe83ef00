//! A hearth node: the runtime, its metrics and, in a cluster, the ring and
//! the shard client/server. The front door hands every request to
//! [`Node::handle`], which makes the routing decision
//! ([`hearth_sharding::routing::decide`]) and serves it here or forwards it
//! to the Worker's home.

use std::sync::{Arc, OnceLock};

use futures::future::BoxFuture;
use hearth_runtime::body::Body;
use hearth_runtime::{DeployReport, Runtime, error_response};
use hearth_sharding::context_stack::ContextStack;
use hearth_sharding::hosted_workers::{HostedWorkers, PrewarmOutcome};
use hearth_sharding::ring::{NodeId, SharedRing};
use hearth_sharding::routing::{Decision, Route, decide};
use hearth_sharding::rpc::RpcNode;

use crate::metrics::Metrics;
use crate::prewarm::{At, PrewarmConfig, Prewarmer};

/// Response header naming the node that served the request.
pub const NODE_HEADER: &str = "x-hearth-node";
pub use hearth_sharding::routing::ROUTE_HEADER;

/// What every handle of a [`Node`] shares: its ID, runtime, metrics,
/// prewarmer and, once joined, its RPC node and cluster link. Workers served
/// here go through [`NodeState::serve_as`], stamped with this node's headers
/// and counted.
pub(crate) struct NodeState {
    id: String,
    runtime: Runtime,
    metrics: Metrics,
    prewarmer: Arc<Prewarmer>,
    rpc: Arc<OnceLock<RpcNode>>,
    /// The cluster, once joined (for the hand-back rule: a home keeps its
    /// Workers).
    link: OnceLock<Arc<ClusterLink>>,
}

impl NodeState {
    /// This node's ID.
    pub(crate) fn id(&self) -> &str {
        &self.id
    }

    /// Serves `script_id` here and reports `route`.
    async fn serve_as(
        &self,
        script_id: &str,
        req: http::Request<Body>,
        route: Route,
    ) -> http::Response<Body> {
        let mut req = req;
        crate::nested::attach_flow(&mut req);
        let (mut resp, start) = match self.runtime.handle(script_id, req).await {
            Ok(s) => {
                let mut r = s.response;
                hearth_runtime::decorate(r.headers_mut(), s.start, &s.timing);
                (r, s.start.as_str())
            }
            Err(e) => (error_response(&e), "error"),
        };
        self.metrics.record(route.as_str(), start);
        let h = resp.headers_mut();
        if let Ok(v) = http::HeaderValue::from_str(&self.id) {
            h.insert(NODE_HEADER, v);
        }
        h.insert(ROUTE_HEADER, route.header_value());
        resp
    }
}

/// This node's Workers as the cluster layer runs them ([`HostedWorkers`]):
/// as a home (the shard server) or through a lazy instance handed back by a
/// refusing home.
struct NodeWorkers(Arc<NodeState>);

impl HostedWorkers for NodeWorkers {
    fn serve(
        &self,
        script_id: &str,
        req: http::Request<Body>,
    ) -> BoxFuture<'static, http::Response<Body>> {
        let me = self.0.clone();
        let id = script_id.to_string();
        // The route header is rewritten by the node that received the
        // request; `home` is what the serving node knows.
        Box::pin(async move { me.serve_as(&id, req, Route::Home).await })
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

    /// A member took a deploy of `script_id`: revalidate a warm copy of
    /// another version against the store.
    fn redeployed(&self, script_id: &str, hash: &str) -> BoxFuture<'static, ()> {
        let runtime = self.0.runtime.clone();
        let (id, hash) = (script_id.to_string(), hash.to_string());
        Box::pin(async move {
            if runtime.revalidate(&id, &hash).await {
                tracing::debug!(script = %id, "stale copy dropped on a deploy announcement");
            }
        })
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
    cluster: Option<Arc<ClusterLink>>,
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
                id: id.into(),
                metrics,
                prewarmer,
                runtime,
                rpc,
                link: OnceLock::new(),
            }),
            cluster: None,
        };
        node.install_invoker();
        node
    }

    /// A node from its parts (for the nested-call invoker).
    pub(crate) fn from_parts(state: Arc<NodeState>, cluster: Option<Arc<ClusterLink>>) -> Self {
        Node { state, cluster }
    }

    /// Lets this node's Workers call Workers, routed as this node routes
    /// ([`crate::nested`]).
    fn install_invoker(&self) {
        self.state
            .runtime
            .set_invoker(Arc::new(crate::nested::NodeInvoker {
                state: Arc::downgrade(&self.state),
                cluster: self.cluster.clone(),
            }));
    }

    /// This node's Workers as the cluster layer sees them (pass to
    /// [`RpcNode::start`]).
    pub fn hosted_workers(&self) -> Arc<dyn HostedWorkers> {
        Arc::new(NodeWorkers(self.state.clone()))
    }

    /// Joins this node to a cluster: requests for Workers homed elsewhere
    /// are forwarded through `rpc` (started with [`Node::hosted_workers`]).
    pub fn join(mut self, link: ClusterLink, rpc: RpcNode) -> Self {
        let _ = self.state.rpc.set(rpc);
        self.state
            .metrics
            .observe_ring(link.self_id.clone(), link.ring.clone());
        let link = Arc::new(link);
        let _ = self.state.link.set(link.clone());
        self.cluster = Some(link);
        self.install_invoker();
        self
    }

    /// This node's ID.
    pub fn id(&self) -> &str {
        &self.state.id
    }

    /// The node's runtime.
    pub fn runtime(&self) -> &Runtime {
        &self.state.runtime
    }

    /// The ring this node routes by now, in a cluster.
    pub fn ring(&self) -> Option<std::sync::Arc<hearth_sharding::ring::Ring>> {
        self.cluster.as_ref().map(|c| c.ring.load_full())
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
        let announced = self.announce(script_id, &report.meta.hash).await;
        if !announced.failed.is_empty() {
            tracing::warn!(script = script_id, failed = ?announced.failed,
                "some members were not told of the deploy; they revalidate within a second");
        }
        Ok(NodeDeploy { report, announced })
    }

    /// Tells every other ring member that `script_id` now has source
    /// `hash`, all at once.
    async fn announce(&self, script_id: &str, hash: &str) -> Announcement {
        let (Some(cluster), Some(rpc)) = (&self.cluster, self.state.rpc.get()) else {
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
        let (cluster, rpc) = (self.cluster.as_ref()?, self.state.rpc.get()?);
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
        let Some(id) = script_id_from_host(sni) else {
            return;
        };
        let node = self.clone();
        tokio::spawn(async move {
            node.prewarm(&id).await;
        });
    }

    /// Prewarms `script_id` where a request for it would be served now:
    /// here (warm here, this node is its home, or no cluster) or at its
    /// home. Returns where, and what was done.
    pub async fn prewarm(&self, script_id: &str) -> (At, PrewarmOutcome) {
        let prewarmer = &self.state.prewarmer;
        let (Some(cluster), Some(rpc)) = (&self.cluster, self.state.rpc.get()) else {
            return (At::Here, prewarmer.here(script_id).await);
        };
        let warm = self.state.runtime.is_warm(script_id);
        let ring = cluster.ring.load();
        let home = ring.home(script_id);
        let home_id = home.map(|n| &n.id).unwrap_or(&cluster.self_id);
        match (decide(&cluster.self_id, home_id, warm), home) {
            (Decision::Forward(_), Some(home)) => {
                (At::Home, prewarmer.at_home(rpc, home, script_id).await)
            }
            _ => (At::Here, prewarmer.here(script_id).await),
        }
    }

    /// Serves `req` for `script_id`: here if the Worker is warm here or
    /// this node is its home, else through its home (which may refuse, in
    /// which case it is served here after all).
    pub async fn handle(&self, script_id: &str, req: http::Request<Body>) -> http::Response<Body> {
        self.route(script_id, req, ContextStack::new()).await
    }

    /// [`Node::handle`] for a request of a flow with `context` (a nested
    /// invocation; see [`crate::nested`]): served here, the context is in
    /// the request's extensions; forwarded, it travels with the request.
    pub async fn route(
        &self,
        script_id: &str,
        mut req: http::Request<Body>,
        context: ContextStack,
    ) -> http::Response<Body> {
        if !context.frames().is_empty() {
            req.extensions_mut().insert(context.clone());
        }
        let warm = self.state.runtime.is_warm(script_id);
        let (Some(cluster), Some(rpc)) = (&self.cluster, self.state.rpc.get()) else {
            let route = if warm { Route::Local } else { Route::Home };
            return self.state.serve_as(script_id, req, route).await;
        };
        let ring = cluster.ring.load();
        let home = ring.home(script_id);
        let home_id = home.map(|n| &n.id).unwrap_or(&cluster.self_id);
        match decide(&cluster.self_id, home_id, warm) {
            Decision::Serve(route) => self.state.serve_as(script_id, req, route).await,
            Decision::Forward(_) => {
                let Some(home) = home else {
                    return self.state.serve_as(script_id, req, Route::Home).await;
                };
                let f = rpc.forward(home, script_id, context, req).await;
                let route = f.route();
                let mut resp = f.response;
                let start = resp
                    .headers()
                    .get(hearth_runtime::timing::START_HEADER)
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or("error")
                    .to_string();
                // A fallback was already counted when it was served here.
                if route == Route::Sharded {
                    self.state.metrics.record(route.as_str(), &start);
                }
                self.state.metrics.hop_latency.observe(f.hop.as_secs_f64());
                let h = resp.headers_mut();
                h.insert(ROUTE_HEADER, route.header_value());
                let timing = h
                    .get(hearth_runtime::timing::SERVER_TIMING_HEADER)
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or("")
                    .to_string();
                let shard = format!("shard;dur={:.3}", f.hop.as_secs_f64() * 1000.0);
                let value = if timing.is_empty() {
                    shard
                } else {
                    format!("{shard}, {timing}")
                };
                if let Ok(v) = http::HeaderValue::from_str(&value) {
                    h.insert(hearth_runtime::timing::SERVER_TIMING_HEADER, v);
                }
                resp
            }
        }
    }
}

/// The script ID a request is for: the first label of its Host, lowercased
/// (DNS names are case-insensitive: `HELLO.localhost:8080` -> `hello`). An
/// IP literal (`127.0.0.1`, `[::1]:8080`) names no Worker, so deploying a
/// Worker called `127` cannot capture traffic addressed by IP. A label that
/// no Worker can be named ([`valid_script_id`]) names none either, so junk
/// in a Host header never costs a shard hop.
///
/// [`valid_script_id`]: hearth_runtime::validate::valid_script_id
pub fn script_id_from_host(host: &str) -> Option<String> {
    if host.starts_with('[') {
        return None; // an IPv6 literal
    }
    let host = host.split(':').next()?;
    if host.parse::<std::net::Ipv4Addr>().is_ok() {
        return None;
    }
    let (label, rest) = host.split_once('.')?;
    let id = label.to_ascii_lowercase();
    (!rest.is_empty() && hearth_runtime::validate::valid_script_id(&id)).then_some(id)
}

/// The listeners of one node.
pub struct Listeners {
    /// Plain HTTP/1.1 Worker traffic.
    pub http: tokio::net::TcpListener,
    /// HTTPS Worker traffic (HTTP/2 or HTTP/1.1 by ALPN), with SNI prewarm.
    pub https: Option<(tokio::net::TcpListener, crate::https::TlsFrontDoor)>,
    /// The admin API.
    pub admin: tokio::net::TcpListener,
}

/// Serves `node`'s front doors (plain HTTP, and HTTPS if given) and its
/// admin API (accepting `token`), all under `limits`, until `stop` turns
/// true; each task then drains its in-flight requests (within the drain
/// timeout).
pub fn spawn_listeners(
    node: &Node,
    listeners: Listeners,
    token: Arc<str>,
    limits: crate::listener::ServeLimits,
    stop: tokio::sync::watch::Receiver<bool>,
) -> Vec<tokio::task::JoinHandle<()>> {
    let stopped = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|s| *s).await;
    };
    // A clustered node serves its front doors on its RPC threads, where
    // forwards and Workers run too (see `RpcNode::run_on_thread`).
    let runner = node.rpc().map(|rpc| {
        let rpc = rpc.clone();
        Arc::new(move |work| rpc.run_on_thread(work)) as crate::listener::Runner
    });
    let front = |listener, tls| {
        let n = node.clone();
        tokio::spawn(crate::listener::serve(
            listener,
            limits,
            move |req, _| {
                let n = n.clone();
                async move { front_door(n, req).await }
            },
            stopped(stop.clone()),
            runner.clone(),
            tls,
        ))
    };
    let mut tasks = vec![front(listeners.http, None)];
    if let Some((listener, door)) = listeners.https {
        let n = node.clone();
        let tls = crate::listener::TlsListener {
            door,
            // Prewarms run on this (multi-threaded) runtime, not on the RPC
            // thread doing the handshake: they overlap it instead of
            // waiting for it to yield.
            on_sni: Arc::new({
                let rt = tokio::runtime::Handle::current();
                move |sni: &str| {
                    let _in_rt = rt.enter();
                    n.prewarm_hint(sni)
                }
            }),
        };
        tasks.push(front(listener, Some(tls)));
    }
    let n = node.clone();
    tasks.push(tokio::spawn(crate::listener::serve(
        listeners.admin,
        limits,
        move |req, _| {
            let (n, t) = (n.clone(), token.clone());
            async move { crate::admin::handle(n, t, req).await }
        },
        stopped(stop),
        None,
        None,
    )));
    tasks
}

/// The host a request is addressed to: the authority of an absolute-form
/// target (RFC 9112 §3.2.2: it overrides `Host`; HTTP/2's `:authority`
/// arrives the same way), else the `Host` header. The guest sees the same
/// authority, so routing and the Worker agree.
pub fn request_host<B>(req: &http::Request<B>) -> Option<String> {
    if let Some(a) = req.uri().authority() {
        return Some(a.host().to_owned());
    }
    req.headers()
        .get(http::header::HOST)
        .and_then(|h| h.to_str().ok())
        .map(str::to_owned)
}

/// Routes a front-door request to its Worker by the first label of its
/// host ([`request_host`]). Every answer names the node that gave it
/// (`x-hearth-node`): the serving node's, or this node's for what it
/// produced itself (a 404, a 502 after a failed hop).
pub async fn front_door(node: Node, req: http::Request<Body>) -> http::Response<Body> {
    let mut resp = match request_host(&req).as_deref().and_then(script_id_from_host) {
        Some(id) => node.handle(&id, req).await,
        None => hearth_runtime::body::text_response(
            http::StatusCode::NOT_FOUND,
            "no Worker named: address a Worker as http://<script-id>.<domain>/ (e.g. hello.localhost)\n",
        ),
    };
    if !resp.headers().contains_key(NODE_HEADER)
        && let Ok(v) = http::HeaderValue::from_str(node.id())
    {
        resp.headers_mut().insert(NODE_HEADER, v);
    }
    resp
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn script_id_is_first_host_label() {
        let id = |h: &str| script_id_from_host(h);
        assert_eq!(id("hello.localhost:8080").as_deref(), Some("hello"));
        assert_eq!(id("a.b.example.com").as_deref(), Some("a"));
        assert_eq!(id("localhost:8080"), None);
        assert_eq!(id(".x"), None);
        // Labels no Worker can be named route nowhere.
        assert_eq!(id("ⷐ[.x"), None);
        assert_eq!(id("under_score.x"), None);
        assert_eq!(id("-x.example"), None);
    }

    #[test]
    fn an_absolute_form_target_overrides_host() {
        let req = http::Request::get("http://Echo.localhost:8080/x")
            .header(http::header::HOST, "hello.localhost")
            .body(())
            .expect("request");
        let host = request_host(&req).expect("host");
        assert_eq!(script_id_from_host(&host).as_deref(), Some("echo"));
        let req = http::Request::get("/x")
            .header(http::header::HOST, "hello.localhost:8080")
            .body(())
            .expect("request");
        let host = request_host(&req).expect("host");
        assert_eq!(script_id_from_host(&host).as_deref(), Some("hello"));
        let req = http::Request::get("http://127.0.0.1/")
            .header(http::header::HOST, "hello.localhost")
            .body(())
            .expect("request");
        assert_eq!(
            request_host(&req).as_deref().and_then(script_id_from_host),
            None
        );
    }

    #[test]
    fn host_is_case_insensitive_and_an_ip_literal_names_no_worker() {
        let id = |h: &str| script_id_from_host(h);
        assert_eq!(id("HELLO.localhost").as_deref(), Some("hello"));
        assert_eq!(id("Hello.Example.COM:8080").as_deref(), Some("hello"));
        assert_eq!(id("127.0.0.1"), None);
        assert_eq!(id("127.0.0.1:8080"), None);
        assert_eq!(id("[::1]:8080"), None);
        assert_eq!(id("10.1.2.3"), None);
    }
}
