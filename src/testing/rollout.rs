//! [`Rollout`]: three real `hearth serve` processes over one S3 store
//! ([`Garage`]), under steady open-loop load, replaced one at a time as a
//! rolling upgrade replaces them; what every request did is recorded.
//!
//! # Model
//!
//! * **Cluster.** Every node runs the same config file (node ID from
//!   `$HOSTNAME`, cluster ports from variables, every node's gossip address
//!   as a seed, one gossip key, one artifact key, one admin token, the
//!   Garage bucket as the store), each in its own working directory (its
//!   `data` directory: the artifact cache). Workers are deployed through
//!   the first node's admin API, as an operator deploys.
//! * **Workers.** Each is the `fetcher` sample under its own name (so
//!   their homes spread over the ring), allowed to fetch one origin: a
//!   counter in this process. Every request carries its own ID in the URL
//!   it asks the Worker to fetch, so the counter sees how many times each
//!   request was *invoked*, on whichever node: a request run twice
//!   (replayed after a failure) shows a count of 2.
//! * **Load** ([`Rollout::load`]): requests at a fixed rate (open loop:
//!   each at its time, whatever the others do), round-robin over the
//!   Workers, sent to the three front doors like a load balancer: it
//!   health-checks `/readyz` every [`HEALTH_EVERY`] and sends only to nodes
//!   that answered ready (round-robin), keeps connections alive, and when a
//!   connection cannot be opened (refused: the node is down) tries the next
//!   node. Such a request was never sent, so it is not lost. A request that
//!   was sent and got no answer (the connection closed or reset before the
//!   response, or no answer in [`REQUEST_TIMEOUT`]) is *lost*; one
//!   answered with anything but the Worker's 200 (a 5xx from a node, a 200
//!   whose fetch failed) is an *error*.
//! * **Rollout** ([`Rollout::replace`]): SIGTERM, wait for exit 0, start
//!   the binary again with the same config and directory, wait until its
//!   `/readyz` says ready; the caller does it node after node. SIGKILL
//!   ([`Rollout::kill`]) stops a node as a crash would.
//!
//! [`Rollout::phase`] tags the requests sent from then on, and
//! [`Summary::of`] reports a phase: requests, lost, errors, p50 and p99
//! (of answered requests, measured at the client).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;

use super::{Garage, Hearth, HttpRequest, NodeProcess, ProcessError, ServeCommand, Signal};

/// How often the load balancer asks each node's `/readyz`.
pub const HEALTH_EVERY: Duration = Duration::from_millis(50);

/// A request with no answer after this long is lost.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// How long a node may take to exit after SIGTERM, and to be ready after
/// it starts.
const NODE_TIMEOUT: Duration = Duration::from_secs(30);

/// The admin token every node accepts.
const TOKEN: &str = "rollout-admin-token-0123456789abcdef0123456789";

/// Why the cluster or a step of the rollout failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RolloutError {
    /// Garage could not be started.
    #[error(transparent)]
    Garage(#[from] super::GarageError),
    /// A file or process operation failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// Why it failed.
        #[source]
        source: std::io::Error,
    },
    /// A node misbehaved (did not start, exit or become ready in time).
    #[error("{0}")]
    Node(String),
    /// A node's process could not be started, signalled or waited for.
    #[error(transparent)]
    Process(#[from] ProcessError),
    /// A deploy through the admin API failed.
    #[error("deploy {0}: {1}")]
    Deploy(String, String),
}

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> RolloutError {
    let what = what.into();
    move |source| RolloutError::Io { what, source }
}

/// A node: how it starts, where it lives, and its process while it runs.
struct Node {
    id: String,
    /// Its Worker and admin ports, config, variables (node ID, cluster
    /// ports) and directory; the same at every start.
    serve: ServeCommand,
    dir: PathBuf,
    process: Option<NodeProcess>,
    /// Starts so far (its log is `node.log.<start>`).
    starts: usize,
}

/// What happened to one request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The Worker's answer: 200, and its fetch of the counter succeeded.
    Ok,
    /// An answer that is not the Worker's success: the status and the
    /// start of the body.
    Error(u16, String),
    /// Sent, and no answer (the connection ended, or the timeout).
    Lost(String),
    /// Never sent: no node accepted a connection.
    NotSent,
}

/// One request of the load.
#[derive(Debug, Clone)]
pub struct Record {
    /// Its ID (the counter's key).
    pub id: u64,
    /// The phase it was sent in ([`Rollout::phase`]).
    pub phase: usize,
    /// The node it was sent to (index), if it was sent.
    pub front: Option<usize>,
    /// When it was sent (to the node that took it), from the start of the
    /// load.
    pub sent: Duration,
    /// From sending to the end of the answer (or of the failure).
    pub latency: Duration,
    /// What came of it.
    pub outcome: Outcome,
    /// The node that served it (`x-hearth-node`), if it was answered.
    pub served_by: String,
}

/// How long after a killed node's process is gone a request sent to it on
/// a kept-alive connection still counts as in flight there
/// ([`Record::started_by_killed`]): the client's pool learns that the
/// kernel reset the connection when its event loop next reads it.
pub const POOL_SLACK: Duration = Duration::from_millis(20);

impl Record {
    /// Whether this request is one that node `killed`, killed over `kill`
    /// (from the signal until its process was seen gone, as offsets of the
    /// load: [`Load::offset`]), had started: in flight over that time (up
    /// to [`POOL_SLACK`] after), and sent to it, or forwarded to it by
    /// another front door and answered with that door's 502 ("the
    /// Worker's home node may have started this request", which the shard
    /// client never serves again elsewhere).
    pub fn started_by_killed(&self, killed: usize, kill: &std::ops::Range<Duration>) -> bool {
        let in_flight =
            self.sent <= kill.end + POOL_SLACK && self.sent + self.latency >= kill.start;
        let forwarded = matches!(&self.outcome,
            Outcome::Error(502, body) if body.contains("may have started"));
        in_flight && (self.front == Some(killed) || forwarded)
    }
}

/// A phase's figures.
#[derive(Debug, Clone)]
pub struct Summary {
    /// Requests sent.
    pub requests: usize,
    /// Sent and not answered.
    pub lost: usize,
    /// Answered with an error.
    pub errors: usize,
    /// Never sent (no node accepted a connection); not in `requests`.
    pub not_sent: usize,
    /// Latency of the answered requests.
    pub latency: hearth_report::latency::Distribution,
}

impl Summary {
    /// The figures of the records of `phase`.
    pub fn of(records: &[Record], phase: usize) -> Summary {
        let mine: Vec<&Record> = records.iter().filter(|r| r.phase == phase).collect();
        let count = |f: fn(&Outcome) -> bool| mine.iter().filter(|r| f(&r.outcome)).count();
        let answered: Vec<f64> = mine
            .iter()
            .filter(|r| matches!(r.outcome, Outcome::Ok | Outcome::Error(..)))
            .map(|r| r.latency.as_secs_f64() * 1000.0)
            .collect();
        let not_sent = count(|o| matches!(o, Outcome::NotSent));
        Summary {
            requests: mine.len() - not_sent,
            lost: count(|o| matches!(o, Outcome::Lost(_))),
            errors: count(|o| matches!(o, Outcome::Error(..))),
            not_sent,
            latency: hearth_report::latency::Distribution::of(&answered),
        }
    }
}

/// Counts invocations per request ID: the origin every Worker fetches.
/// It answers after `delay`, so that requests spend that long in a Worker
/// (as real ones wait on their origins) and a drain or a crash finds some
/// in flight.
#[derive(Clone, Default)]
struct Counter {
    counts: Arc<Mutex<HashMap<u64, u32>>>,
    delay: Duration,
}

impl Counter {
    /// Serves the counter on a free port; its address.
    async fn serve(&self) -> Result<SocketAddr, RolloutError> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .map_err(io("bind the counter"))?;
        let addr = listener.local_addr().map_err(io("counter address"))?;
        let (counts, delay) = (self.counts.clone(), self.delay);
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let counts = counts.clone();
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(move |req: http::Request<_>| {
                        let id = req.uri().path().trim_start_matches('/').parse::<u64>();
                        if let Ok(id) = id {
                            let mut c = counts.lock().unwrap_or_else(|p| p.into_inner());
                            *c.entry(id).or_insert(0) += 1;
                        }
                        async move {
                            tokio::time::sleep(delay).await;
                            Ok::<_, std::convert::Infallible>(http::Response::new(Full::new(
                                Bytes::from_static(b"counted"),
                            )))
                        }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        Ok(addr)
    }

    /// Invocations of request `id` so far.
    fn get(&self, id: u64) -> u32 {
        let c = self.counts.lock().unwrap_or_else(|p| p.into_inner());
        c.get(&id).copied().unwrap_or(0)
    }
}

/// Three `hearth serve` processes over one Garage bucket, with Workers
/// deployed (see the module docs). Dropping it kills them all.
pub struct Rollout {
    nodes: Vec<Node>,
    workers: Vec<String>,
    counter: Counter,
    counter_addr: SocketAddr,
    ready: Arc<Vec<AtomicBool>>,
    phase: Arc<AtomicUsize>,
    /// Kept last: the nodes stop before the store does.
    _garage: Garage,
    dir: tempfile::TempDir,
}

impl Rollout {
    /// Starts `nodes` nodes of `binary` over `garage`, waits until each is
    /// ready and every ring has them all, and deploys `workers` Workers
    /// (`w0`, `w1`, …) through the first. Each request spends at least
    /// `origin_delay` in its Worker (the counter's answer).
    pub async fn start(
        binary: &Path,
        garage: Garage,
        nodes: usize,
        workers: usize,
        origin_delay: Duration,
    ) -> Result<Rollout, RolloutError> {
        Rollout::start_with(binary, garage, nodes, workers, origin_delay, "").await
    }

    /// [`Rollout::start`] with `extra_config` (TOML tables, such as
    /// `[objects]`) appended to every node's config file. With no Workers,
    /// the caller deploys its own through [`Rollout::admin_client`].
    pub async fn start_with(
        binary: &Path,
        garage: Garage,
        nodes: usize,
        workers: usize,
        origin_delay: Duration,
        extra_config: &str,
    ) -> Result<Rollout, RolloutError> {
        let dir = tempfile::tempdir().map_err(io("tempdir"))?;
        let d = dir.path();
        let hearth = Hearth::new(binary);
        let ids: Vec<String> = (1..=nodes).map(|i| format!("node-{i}")).collect();
        let pki = d.join("pki");
        let names: Vec<&str> = ids.iter().map(String::as_str).collect();
        hearth.pki(&pki, &names)?;
        let config = d.join("hearth.toml");
        let (mut serve_nodes, mut seeds) = (Vec::new(), Vec::new());
        for id in &ids {
            let (rpc, gossip) = (free_port()?, free_udp_port()?);
            seeds.push(format!("\"localhost:{gossip}\""));
            let node_dir = d.join(id);
            std::fs::create_dir_all(&node_dir).map_err(io("node dir"))?;
            let serve = ServeCommand::new(&hearth, node_dir.join("node.log.1"))?
                .config(&config)
                .token(TOKEN)
                .env("HOSTNAME", id)
                .env("RPC_PORT", rpc.to_string())
                .env("GOSSIP_PORT", gossip.to_string())
                .env("RUST_LOG", "warn")
                .current_dir(&node_dir);
            serve_nodes.push(Node {
                id: id.clone(),
                serve,
                dir: node_dir,
                process: None,
                starts: 0,
            });
        }
        let text = format!(
            "node_id = \"$HOSTNAME\"\nstore = \"{store}\"\nartifact_key = \"{akey}\"\n\
             admin_token = \"{TOKEN}\"\n\n[limits]\ndrain_timeout = \"10s\"\n\n\
             [egress]\nallow_private_addresses = true\n\n\
             [cluster]\nrpc = \"127.0.0.1:${{RPC_PORT}}\"\ngossip = \"127.0.0.1:${{GOSSIP_PORT}}\"\n\
             seeds = [{seeds}]\ngossip_key = \"{gkey}\"\npki = \"{pki}\"\n\n{s3}\n{extra_config}",
            store = garage.url("rollout"),
            akey = "a7".repeat(32),
            seeds = seeds.join(", "),
            gkey = "6b".repeat(32),
            pki = pki.display(),
            s3 = garage.toml_section(),
        );
        std::fs::write(&config, text).map_err(io("write config"))?;
        let counter = Counter {
            delay: origin_delay,
            ..Counter::default()
        };
        let counter_addr = counter.serve().await?;
        let mut r = Rollout {
            ready: Arc::new((0..nodes).map(|_| AtomicBool::new(false)).collect()),
            nodes: serve_nodes,
            workers: (0..workers).map(|i| format!("w{i}")).collect(),
            counter,
            counter_addr,
            phase: Arc::new(AtomicUsize::new(0)),
            _garage: garage,
            dir,
        };
        for i in 0..nodes {
            r.spawn(i)?;
        }
        for i in 0..nodes {
            r.wait_ready(i).await?;
        }
        r.wait_rings().await?;
        r.deploy().await?;
        Ok(r)
    }

    /// The number of nodes.
    pub fn nodes(&self) -> usize {
        self.nodes.len()
    }

    /// The Workers' script IDs.
    pub fn workers(&self) -> &[String] {
        &self.workers
    }

    /// Starts nodes from now on (restarts, replacements) from `binary`: a
    /// rollout from one build of hearth to another.
    pub fn upgrade_to(&mut self, binary: &Path) {
        let hearth = Hearth::new(binary);
        for n in &mut self.nodes {
            n.serve = n.serve.clone().hearth(&hearth);
        }
    }

    /// Node `i`'s ID.
    pub fn node_id(&self, i: usize) -> &str {
        &self.nodes[i].id
    }

    /// Starts node `i`'s process (again), logging to `node.log.<start>`.
    fn spawn(&mut self, i: usize) -> Result<(), RolloutError> {
        let n = &mut self.nodes[i];
        n.starts += 1;
        let log = n.dir.join(format!("node.log.{}", n.starts));
        n.process = Some(n.serve.clone().log_to(log).spawn()?);
        Ok(())
    }

    /// Node `i`'s process, if it is running.
    fn process(&mut self, i: usize) -> Result<&mut NodeProcess, RolloutError> {
        let n = &mut self.nodes[i];
        n.process
            .as_mut()
            .ok_or_else(|| RolloutError::Node(format!("{} is not running", n.id)))
    }

    /// Every node's logs, for a failure message.
    pub fn logs(&self) -> String {
        let mut out = String::new();
        for n in &self.nodes {
            for s in 1..=n.starts {
                let text = std::fs::read_to_string(n.dir.join(format!("node.log.{s}")))
                    .unwrap_or_default();
                let tail: Vec<&str> = text.lines().rev().take(40).collect();
                out.push_str(&format!("--- {} start {s} (last lines)\n", n.id));
                for l in tail.into_iter().rev() {
                    out.push_str(l);
                    out.push('\n');
                }
            }
        }
        out
    }

    /// Waits until node `i` answers `/readyz` with 200; how long that took.
    async fn wait_ready(&mut self, i: usize) -> Result<Duration, RolloutError> {
        Ok(self.process(i)?.wait_ready_async(NODE_TIMEOUT).await?)
    }

    /// Waits until every node's ring has every node.
    async fn wait_rings(&self) -> Result<(), RolloutError> {
        let t = Instant::now();
        for n in &self.nodes {
            let client = self.admin(n)?;
            loop {
                let members = client.ring(None).await.map(|r| r.members.len());
                if matches!(members, Ok(m) if m == self.nodes.len()) {
                    break;
                }
                if t.elapsed() > NODE_TIMEOUT {
                    return Err(RolloutError::Node(format!(
                        "{}'s ring never had every node ({members:?})",
                        n.id
                    )));
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
        Ok(())
    }

    /// Node `i`'s front door (plain HTTP).
    pub fn http(&self, i: usize) -> SocketAddr {
        self.nodes[i].serve.http()
    }

    /// An admin client of node `i`, with the cluster's token.
    pub fn admin_client(&self, i: usize) -> Result<hearth_admin_client::AdminClient, RolloutError> {
        self.admin(&self.nodes[i])
    }

    fn admin(&self, n: &Node) -> Result<hearth_admin_client::AdminClient, RolloutError> {
        hearth_admin_client::AdminClient::new(
            &format!("http://{}", n.serve.admin()),
            Some(TOKEN.into()),
        )
        .map_err(|e| RolloutError::Node(format!("admin client: {e}")))
    }

    /// Deploys every Worker through the first node.
    async fn deploy(&self) -> Result<(), RolloutError> {
        let wasm = hearth_sample_workers::bytes("fetcher").map_err(io("the fetcher sample"))?;
        let client = self.admin(&self.nodes[0])?;
        let query = serde_urlencoded::to_string([
            ("allow_host", format!("http://{}", self.counter_addr)),
            ("lifecycle", "reuse".into()),
        ])
        .map_err(|e| RolloutError::Deploy("query".into(), e.to_string()))?;
        for w in &self.workers {
            client
                .deploy(w, &query, wasm.clone())
                .await
                .map_err(|e| RolloutError::Deploy(w.clone(), e.to_string()))?;
        }
        Ok(())
    }

    /// Tags the requests sent from now on with `phase`.
    pub fn phase(&self, phase: usize) {
        self.phase.store(phase, Ordering::Relaxed);
    }

    /// Sends `signal` to node `i` and waits for its process to exit; its
    /// status (the process is gone after it).
    async fn stop(
        &mut self,
        i: usize,
        signal: Signal,
    ) -> Result<std::process::ExitStatus, RolloutError> {
        let p = self.process(i)?;
        p.signal(signal)?;
        let status = p.wait_exit_async(NODE_TIMEOUT).await?;
        self.nodes[i].process = None;
        Ok(status)
    }

    /// Replaces node `i` as a rollout does: SIGTERM, wait for it to exit
    /// (it must exit 0), start it again, wait for `/readyz`. How long it
    /// took to exit and to be ready again.
    pub async fn replace(&mut self, i: usize) -> Result<(Duration, Duration), RolloutError> {
        let t = Instant::now();
        let status = self.stop(i, Signal::Term).await?;
        if !status.success() {
            return Err(RolloutError::Node(format!(
                "{} exited with {status} after SIGTERM\n{}",
                self.nodes[i].id,
                self.logs()
            )));
        }
        let exited = t.elapsed();
        let ready = self.restart(i).await?;
        Ok((exited, ready))
    }

    /// Kills node `i` with SIGKILL (as a crash would) and reaps it. Returns
    /// when the signal was sent and when the process was seen gone: it may
    /// take requests until then (a dying process is torn down some
    /// milliseconds after the signal on a busy machine).
    pub async fn kill(&mut self, i: usize) -> Result<(Instant, Instant), RolloutError> {
        let signalled = Instant::now();
        self.stop(i, Signal::Kill).await?;
        Ok((signalled, Instant::now()))
    }

    /// Starts node `i` again and waits until it is ready; how long that
    /// took.
    pub async fn restart(&mut self, i: usize) -> Result<Duration, RolloutError> {
        self.spawn(i)?;
        self.wait_ready(i).await
    }

    /// Invocations of request `id` seen by the counter (on any node).
    pub fn invocations(&self, id: u64) -> u32 {
        self.counter.get(id)
    }

    /// Starts steady load of `rate` requests a second (see the module
    /// docs); [`Load::stop`] ends it and returns the records.
    pub fn load(&self, rate: u32) -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let records = Arc::new(Mutex::new(Vec::new()));
        let fronts: Vec<(SocketAddr, SocketAddr)> = self
            .nodes
            .iter()
            .map(|n| (n.serve.http(), n.serve.admin()))
            .collect();
        for r in self.ready.iter() {
            r.store(true, Ordering::Relaxed);
        }
        let health = tokio::spawn(health_checks(
            fronts.iter().map(|f| f.1).collect(),
            self.ready.clone(),
            stop.clone(),
        ));
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        connector.set_connect_timeout(Some(Duration::from_secs(1)));
        let client = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(Duration::from_secs(5))
            .build(connector);
        let sender = Sender {
            client,
            http: fronts.iter().map(|f| f.0).collect(),
            ready: self.ready.clone(),
            next: Arc::new(AtomicUsize::new(0)),
            workers: self.workers.clone(),
            counter: self.counter_addr,
        };
        let start = Instant::now();
        let driver = tokio::spawn({
            let (stop, records, phase) = (stop.clone(), records.clone(), self.phase.clone());
            async move {
                let start = tokio::time::Instant::from_std(start);
                let gap = Duration::from_secs_f64(1.0 / f64::from(rate.max(1)));
                let mut inflight = tokio::task::JoinSet::new();
                let mut id = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    id += 1;
                    let at = start + gap * u32::try_from(id).unwrap_or(u32::MAX);
                    tokio::time::sleep_until(at).await;
                    let (sender, records) = (sender.clone(), records.clone());
                    let p = phase.load(Ordering::Relaxed);
                    inflight.spawn(async move {
                        let r = sender.send(id, p, start.into_std()).await;
                        records.lock().unwrap_or_else(|p| p.into_inner()).push(r);
                    });
                    while inflight.try_join_next().is_some() {}
                }
                while inflight.join_next().await.is_some() {}
            }
        });
        Load {
            start,
            stop,
            records,
            driver,
            health,
        }
    }

    /// The directory of the cluster's files (config, node logs).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }
}

/// Steady load in progress ([`Rollout::load`]).
pub struct Load {
    start: Instant,
    stop: Arc<AtomicBool>,
    records: Arc<Mutex<Vec<Record>>>,
    driver: tokio::task::JoinHandle<()>,
    health: tokio::task::JoinHandle<()>,
}

impl Load {
    /// `at` as a time of the load ([`Record::sent`]: from its start).
    pub fn offset(&self, at: Instant) -> Duration {
        at.saturating_duration_since(self.start)
    }

    /// Stops sending, waits for the requests in flight, and returns every
    /// request's record, in ID order.
    pub async fn stop(self) -> Vec<Record> {
        self.stop.store(true, Ordering::Relaxed);
        let _ = self.driver.await;
        let _ = self.health.await;
        let mut r = std::mem::take(&mut *self.records.lock().unwrap_or_else(|p| p.into_inner()));
        r.sort_by_key(|r| r.id);
        r
    }
}

/// The load balancer's health checks: `/readyz` on every node, every
/// [`HEALTH_EVERY`]; a node is sent requests while its last answer was 200.
async fn health_checks(
    admins: Vec<SocketAddr>,
    ready: Arc<Vec<AtomicBool>>,
    stop: Arc<AtomicBool>,
) {
    let readyz = HttpRequest::get("admin", "/readyz");
    while !stop.load(Ordering::Relaxed) {
        let checks = admins.iter().map(|&addr| {
            let readyz = &readyz;
            async move {
                tokio::time::timeout(HEALTH_EVERY * 4, readyz.send_async(addr))
                    .await
                    .is_ok_and(|r| r.is_ok_and(|r| r.status == 200))
            }
        });
        let answers = futures::future::join_all(checks).await;
        for (i, ok) in answers.into_iter().enumerate() {
            ready[i].store(ok, Ordering::Relaxed);
        }
        tokio::time::sleep(HEALTH_EVERY).await;
    }
}

/// What sends one request: the client, the front doors, who is ready.
#[derive(Clone)]
struct Sender {
    client: Client<HttpConnector, Full<Bytes>>,
    http: Vec<SocketAddr>,
    ready: Arc<Vec<AtomicBool>>,
    next: Arc<AtomicUsize>,
    workers: Vec<String>,
    counter: SocketAddr,
}

impl Sender {
    /// Sends request `id` to the next ready node (and on to the following
    /// ones while a connection cannot be opened); its record.
    async fn send(&self, id: u64, phase: usize, start: Instant) -> Record {
        let n = self.http.len();
        let worker = &self.workers[usize::try_from(id).unwrap_or(0) % self.workers.len()];
        let first = self.next.fetch_add(1, Ordering::Relaxed);
        // Ready nodes first, in round-robin order; then the others, in case
        // every health check is behind.
        let mut order: Vec<usize> = (0..n).map(|k| (first + k) % n).collect();
        order.sort_by_key(|&i| !self.ready[i].load(Ordering::Relaxed));
        let mut record = Record {
            id,
            phase,
            front: None,
            sent: start.elapsed(),
            latency: Duration::ZERO,
            outcome: Outcome::NotSent,
            served_by: String::new(),
        };
        for i in order {
            let req = http::Request::get(format!("http://{}/", self.http[i]))
                .header(http::header::HOST, format!("{worker}.localhost"))
                .header("x-fetch", format!("http://{}/{id}", self.counter))
                .body(Full::new(Bytes::new()));
            let Ok(req) = req else {
                return record;
            };
            let t = Instant::now();
            record.sent = t.saturating_duration_since(start);
            let result = tokio::time::timeout(REQUEST_TIMEOUT, async {
                let resp = self.client.request(req).await?;
                let status = resp.status().as_u16();
                let node = resp
                    .headers()
                    .get(crate::node::NODE_HEADER)
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or("")
                    .to_string();
                let body = resp
                    .into_body()
                    .collect()
                    .await
                    .map_err(ClientFailure::Body)?
                    .to_bytes();
                Ok::<_, ClientFailure>((status, node, body))
            })
            .await;
            record.latency = t.elapsed();
            record.front = Some(i);
            match result {
                Err(_) => record.outcome = Outcome::Lost("no answer in time".into()),
                Ok(Err(ClientFailure::Client(e))) if e.is_connect() => {
                    // Never sent: the node is down. Try the next one.
                    self.ready[i].store(false, Ordering::Relaxed);
                    record.front = None;
                    continue;
                }
                Ok(Err(e)) => record.outcome = Outcome::Lost(e.to_string()),
                Ok(Ok((status, node, body))) => {
                    record.served_by = node;
                    let text = String::from_utf8_lossy(&body);
                    record.outcome = if status == 200 && text.starts_with("200 counted") {
                        Outcome::Ok
                    } else {
                        Outcome::Error(status, text.chars().take(200).collect())
                    };
                }
            }
            return record;
        }
        record
    }
}

/// Why a sent request got no answer.
#[derive(Debug, thiserror::Error)]
enum ClientFailure {
    #[error("{0:?}")]
    Client(#[from] hyper_util::client::legacy::Error),
    #[error("body: {0}")]
    Body(hyper::Error),
}

fn free_port() -> Result<u16, RolloutError> {
    super::tcp_port().map_err(io("a free port"))
}

fn free_udp_port() -> Result<u16, RolloutError> {
    super::udp_port().map_err(io("a free UDP port"))
}
