//! The node's inter-node RPC: Cap'n Proto over mutual TLS, behind a `Send`
//! handle.
//!
//! # Threads
//!
//! capnp-rpc's objects are `!Send` (`Rc` inside), so every connection, its
//! capabilities and the forwards using it live on one *RPC thread*: an OS
//! thread running a current-thread tokio runtime and a
//! [`tokio::task::LocalSet`]. A node runs [`RpcConfig::threads`] of them,
//! one per core by default, and a request stays on one thread from the
//! front door to the Worker, because every hand-off between threads costs
//! a wake-up and the shard hop is mostly wake-ups:
//!
//! * The front door of a clustered node serves its connections on the RPC
//!   threads ([`RpcNode::run_on_thread`], round-robin). A request that
//!   must go to its home is forwarded by the same thread, over that
//!   thread's own connection to the home (each thread opens its own).
//! * [`RpcNode::serve`] accepts peer connections on the calling runtime and
//!   hands each raw socket to an RPC thread, round-robin, which completes
//!   the TLS handshake (a peer without a cluster certificate is dropped
//!   there and never reaches Cap'n Proto) and owns the connection, so its
//!   readiness wakes that thread directly.
//! * Workers run on the thread that asks for them: a sharded request on the
//!   home's RPC thread that received it, a request the front door serves
//!   itself on the front door's thread. Guest code yields at every epoch
//!   tick (1 ms), so a busy Worker shares its thread instead of holding it.
//! * [`RpcNode`] is the handle the rest of the node uses: `Clone + Send +
//!   Sync`, usable from any tokio task. Called off the RPC threads (tests,
//!   tools), [`RpcNode::forward`] sends the request to the RPC thread that
//!   owns the connection to that home and awaits the result.
//!
//! Per forward, the common case is one Cap'n Proto call and its return
//! ([`crate::inline`]), and an RPC connection's writes are batched: one
//! flush per turn of the event loop, with bookkeeping messages (`Finish`,
//! `Release`) waiting briefly for company (see [`crate::transport`]).
//!
//! # Robustness
//!
//! Pending inbound handshakes are bounded per source address and in total,
//! the oldest giving way to a newcomer ([`crate::handshake_gate`]), so idle
//! sockets cannot crowd out the members' connections.
//! A peer's calls left unanswered on a connection are bounded
//! ([`RpcConfig::max_unanswered_bytes`]), and so are a member's over all
//! its connections ([`RpcConfig::max_unanswered_bytes_per_member`]): past
//! either, the connection stops reading, so a peer that ignores flow
//! control waits instead of filling this node's memory, however many
//! connections it opens.
//! Messages larger than [`RpcConfig::max_message_bytes`] are refused before
//! they are buffered; a malformed message or a protocol error fails that
//! connection only (capnp-rpc aborts it), and its requests become 502s or
//! local fallbacks as [`crate::shard_client`] describes. A peer that vanishes
//! mid-stream turns into body errors on the other side and its in-flight
//! invocations are cancelled. [`RpcNode::shutdown`] closes every connection
//! at once, as a crash would.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use capnp_rpc::rpc_twoparty_capnp::Side;
use capnp_rpc::{CapabilityServerSet, RpcSystem};
use futures::FutureExt;
use futures::future::{LocalBoxFuture, Shared};
use tokio::net::TcpListener;
use tokio::sync::{mpsc, oneshot, watch};
use tokio_rustls::TlsAcceptor;

use crate::admission::{OverloadConfig, OverloadGate, OverloadStats};
use crate::context_stack::ContextStack;
use crate::handshake_gate::{HandshakeGate, Refusal, Slot};
use crate::hosted_workers::{Body, HostedWorkers, PrewarmOutcome};
use crate::inline::{Gathered, MAX_INLINE_BODY_BYTES, gather};
use crate::shard_client::{self, ClientCounters, ClientEnv, ForwardJob, PeerConn};
use crate::shard_server::{ServerShared, ShardServerImpl};
use crate::tls::NodeTls;
use crate::transport::{self, CountingStream, MemberBudget, MessageCounts, PeerTls, WireCounters};
use crate::worker_fetch::{WorkerHost, closed_signal};

pub use crate::byte_stream::BodyStreamError;
pub use crate::shard_client::{ForwardOutcome, Forwarded, MAX_SPECULATIVE_BODY_BYTES};

/// Settings of a node's inter-node RPC.
#[derive(Debug, Clone)]
pub struct RpcConfig {
    /// This node's cluster certificate and the cluster CA.
    pub tls: NodeTls,
    /// RPC threads (default: one per core; each is an OS thread with its
    /// own event loop, its own connection to every home it forwards to, and
    /// a share of the front door's connections and of the Workers).
    pub threads: usize,
    /// Limit for TCP connect plus TLS handshake to a home (default 1 s).
    pub connect_timeout: Duration,
    /// Limit for an inbound peer's TLS handshake (default 1 s: a member
    /// needs a round trip or two; an idle socket holds a slot of the
    /// [`crate::handshake_gate`] no longer than this).
    pub handshake_timeout: Duration,
    /// Limit, from sending `dispatch` (after connecting, if a connection had
    /// to be opened), for the home's answer on the streaming path (default
    /// 1 s). The home answers at once (admission is a counter check; the
    /// Worker starts after), so running out means the home is stuck; it may
    /// still have started the request, so the user gets a 502 (at most
    /// once) and the request is cancelled there.
    pub dispatch_timeout: Duration,
    /// After failing to connect to a home, requests for it are served
    /// locally without trying again for this long (default 1 s), so a
    /// black-holed home does not cost every request a connect timeout.
    pub unreachable_backoff: Duration,
    /// Admission thresholds when this node is a home.
    pub overload: OverloadConfig,
    /// Largest RPC message accepted from a peer (default 4 MiB; body chunks
    /// are at most 64 KiB, heads at most 256 KiB).
    pub max_message_bytes: usize,
    /// Request-body bytes sent before the home accepted (default and
    /// maximum [`MAX_SPECULATIVE_BODY_BYTES`]).
    pub speculative_body_bytes: usize,
    /// Bytes of a peer's calls one connection may hold unanswered before it
    /// stops reading from that peer (default 64 MiB): the bound on what a
    /// peer that ignores flow control can make this node buffer.
    pub max_unanswered_bytes: usize,
    /// Bytes of one member's calls all its connections together may hold
    /// unanswered (default 256 MiB): past it, each of them stops reading,
    /// so a member gains nothing by opening more connections. A member is
    /// a cluster certificate.
    pub max_unanswered_bytes_per_member: usize,
}

impl RpcConfig {
    /// The defaults documented on each field, with `tls`.
    pub fn new(tls: NodeTls) -> Self {
        RpcConfig {
            tls,
            threads: std::thread::available_parallelism().map_or(1, |n| n.get()),
            connect_timeout: Duration::from_secs(1),
            handshake_timeout: Duration::from_secs(1),
            dispatch_timeout: Duration::from_secs(1),
            unreachable_backoff: Duration::from_secs(1),
            overload: OverloadConfig::default(),
            max_message_bytes: 4 * 1024 * 1024,
            speculative_body_bytes: MAX_SPECULATIVE_BODY_BYTES,
            max_unanswered_bytes: 64 * 1024 * 1024,
            max_unanswered_bytes_per_member: 256 * 1024 * 1024,
        }
    }
}

/// Why the RPC layer could not start.
#[derive(Debug, thiserror::Error)]
pub enum RpcError {
    /// [`RpcNode::start`] was called outside a tokio runtime.
    #[error("RpcNode::start must be called from within a tokio runtime")]
    NoRuntime,
    /// An RPC thread could not be spawned.
    #[error("spawning an RPC thread: {0}")]
    Thread(std::io::Error),
    /// The listener's address could not be read.
    #[error("reading the listener's address: {0}")]
    Listener(std::io::Error),
}

/// Why a call to a member's shard server ([`RpcNode::prewarm`],
/// [`RpcNode::announce_redeploy`], [`RpcNode::hand_back`]) or a connection
/// to it failed. Cheap to clone: one failed connection attempt is shared by
/// every call that waited for it.
#[derive(Debug, Clone, thiserror::Error)]
pub enum PeerError {
    /// The member could not be reached: TCP, TLS, its identity, or the
    /// connect timeout ([`transport::ConnectError`] says which).
    #[error(transparent)]
    Connect(Arc<transport::ConnectError>),
    /// The connection was open but the call failed on it.
    #[error(transparent)]
    Rpc(#[from] capnp::Error),
    /// The node has no RPC thread to make the call on.
    #[error("no RPC thread")]
    NoThread,
    /// The RPC layer was shut down before the call was made.
    #[error("the RPC layer is shut down")]
    ShutDown,
    /// The RPC layer stopped while the call was under way.
    #[error("the RPC layer stopped")]
    Stopped,
    /// The member did not answer within the call's limit.
    #[error("no answer within {0:?}")]
    Timeout(Duration),
}

/// A snapshot of a node's RPC counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RpcStats {
    /// Requests this node forwarded to a home.
    pub forwarded: u64,
    /// ...of which the home served.
    pub sharded: u64,
    /// ...of which the home refused (served here).
    pub refusals_received: u64,
    /// ...of which the home was unavailable (served here).
    pub home_unavailable: u64,
    /// ...of which the home failed after accepting (502).
    pub failed_after_accept: u64,
    /// Request-body bytes sent to homes before they accepted.
    pub speculative_bytes_sent: u64,
    /// As a home: admission counters, refusals sent among them.
    pub home: OverloadStats,
    /// Outbound connections opened.
    pub connections_opened: u64,
    /// Inbound connections that passed the TLS handshake.
    pub connections_accepted: u64,
    /// Inbound connections rejected at the TLS handshake.
    pub handshakes_rejected: u64,
    /// Inbound connections closed before their handshake finished to keep
    /// pending handshakes bounded ([`crate::handshake_gate`]): over the
    /// per-source share, or the oldest pending when the gate was full.
    pub handshakes_shed: u64,
    /// RPC bytes sent on connections this node opened (framing included,
    /// TLS excluded).
    pub client_bytes_sent: u64,
    /// RPC bytes received on connections this node opened.
    pub client_bytes_received: u64,
    /// RPC bytes sent on connections peers opened.
    pub server_bytes_sent: u64,
    /// RPC bytes received on connections peers opened.
    pub server_bytes_received: u64,
    /// The most bytes of a peer's calls one connection held unanswered at
    /// once (bounded by [`RpcConfig::max_unanswered_bytes`] plus one
    /// message).
    pub unanswered_peak: u64,
    /// Times a connection stopped reading because its peer's unanswered
    /// calls reached [`RpcConfig::max_unanswered_bytes`] (or its member's
    /// reached [`RpcConfig::max_unanswered_bytes_per_member`]).
    pub reads_paused: u64,
    /// The most bytes one member's calls held unanswered at once over all
    /// its connections (bounded by
    /// [`RpcConfig::max_unanswered_bytes_per_member`] plus one message per
    /// connection).
    pub member_unanswered_peak: u64,
    /// RPC messages sent on connections this node opened, by kind.
    pub client_messages_sent: MessageCounts,
    /// RPC messages received on connections this node opened, by kind.
    pub client_messages_received: MessageCounts,
    /// RPC messages sent on connections peers opened, by kind.
    pub server_messages_sent: MessageCounts,
    /// RPC messages received on connections peers opened, by kind.
    pub server_messages_received: MessageCounts,
}

impl RpcStats {
    /// Refusals this node sent as a home.
    pub fn refusals_sent(&self) -> u64 {
        self.home.refused()
    }
}

#[derive(Default)]
struct NodeCounters {
    client: Arc<ClientCounters>,
    connections_opened: AtomicU64,
    connections_accepted: AtomicU64,
    handshakes_rejected: AtomicU64,
    handshakes_shed: AtomicU64,
    client_wire: Arc<WireCounters>,
    server_wire: Arc<WireCounters>,
    member_unanswered_peak: Arc<AtomicU64>,
}

enum Command {
    Inbound(Box<Inbound>),
    Run(Box<dyn FnOnce() + Send>),
    Forward(Box<ForwardJob>, Reply),
    /// A call to one member's shard server.
    Peer(crate::ring::Member, PeerCall),
}

/// The small calls a node makes to one member's shard server, with where
/// each answer goes.
enum PeerCall {
    Prewarm(String, oneshot::Sender<Result<PrewarmOutcome, PeerError>>),
    Redeployed(String, String, oneshot::Sender<Result<(), PeerError>>),
    HandBack(String, oneshot::Sender<Result<bool, PeerError>>),
    /// `ShardServer.tail`: script, status filter, sample rate, and where
    /// the events go.
    Tail(String, String, f64, mpsc::Sender<String>),
}

/// A TCP connection from a peer, before its TLS handshake.
struct Inbound {
    tcp: std::net::TcpStream,
    peer: SocketAddr,
    acceptor: TlsAcceptor,
    /// Its place in the [`HandshakeGate`], held until the handshake is over.
    slot: Slot,
}

/// How an RPC thread answers a forward: the result, or the job back if the
/// thread stopped before looking at it (it is then served locally).
type Reply = oneshot::Sender<Result<Forwarded, Box<ForwardJob>>>;

/// What every RPC thread of a node shares.
struct NodeShared {
    config: RpcConfig,
    host: WorkerHost,
    server: Arc<ServerShared>,
    counters: NodeCounters,
    /// The unanswered-bytes budget of each member connected now, by the
    /// hash of its certificate (a member is a certificate).
    members: Mutex<HashMap<[u8; 32], std::sync::Weak<MemberBudget>>>,
}

impl NodeShared {
    /// The budget shared by every connection of the member at the other
    /// end of `tls` (see [`RpcConfig::max_unanswered_bytes_per_member`]).
    fn member_budget(&self, tls: &PeerTls) -> Arc<MemberBudget> {
        let key = tls
            .get_ref()
            .1
            .peer_certificates()
            .and_then(|chain| chain.first())
            .map(|leaf| *blake3::hash(leaf.as_ref()).as_bytes())
            .unwrap_or_default();
        let mut members = self.members.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(budget) = members.get(&key).and_then(std::sync::Weak::upgrade) {
            return budget;
        }
        members.retain(|_, b| b.strong_count() > 0);
        let budget = Arc::new(MemberBudget::new(
            self.config.max_unanswered_bytes_per_member,
            self.counters.member_unanswered_peak.clone(),
        ));
        members.insert(key, Arc::downgrade(&budget));
        budget
    }
}

struct NodeInner {
    shared: Arc<NodeShared>,
    threads: Vec<mpsc::UnboundedSender<Command>>,
    next_inbound: AtomicUsize,
    next_run: AtomicUsize,
    shutdown: watch::Sender<bool>,
    joins: Mutex<Vec<std::thread::JoinHandle<()>>>,
}

impl Drop for NodeInner {
    fn drop(&mut self) {
        let _ = self.shutdown.send(true);
    }
}

/// A node's inter-node RPC: shard client and shard server. Cheap to clone;
/// `Send + Sync`.
#[derive(Clone)]
pub struct RpcNode {
    inner: Arc<NodeInner>,
}

impl std::fmt::Debug for RpcNode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RpcNode")
            .field("threads", &self.inner.threads.len())
            .finish_non_exhaustive()
    }
}

/// An accept loop started by [`RpcNode::serve`].
#[derive(Debug)]
pub struct ServerHandle {
    local_addr: SocketAddr,
    task: tokio::task::JoinHandle<()>,
}

impl ServerHandle {
    /// The address it listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// Stops accepting (established connections stay up).
    pub fn stop(&self) {
        self.task.abort();
    }
}

impl RpcNode {
    /// Starts the RPC threads. Workers are served through `local`, on the
    /// RPC thread that asks for them. Must be called within a tokio runtime
    /// (the accept loop of [`RpcNode::serve`] runs on it).
    pub fn start(config: RpcConfig, workers: Arc<dyn HostedWorkers>) -> Result<RpcNode, RpcError> {
        tokio::runtime::Handle::try_current().map_err(|_| RpcError::NoRuntime)?;
        let host = WorkerHost { workers };
        let server = Arc::new(ServerShared {
            host: host.clone(),
            gate: OverloadGate::new(config.overload),
        });
        let threads = config.threads.max(1);
        let shared = Arc::new(NodeShared {
            config,
            host,
            server,
            counters: NodeCounters::default(),
            members: Mutex::new(HashMap::new()),
        });
        let (shutdown, _) = watch::channel(false);
        let mut senders = Vec::with_capacity(threads);
        let mut joins = Vec::with_capacity(threads);
        for index in 0..threads {
            let (tx, rx) = mpsc::unbounded_channel();
            let thread_shared = shared.clone();
            let stop = shutdown.subscribe();
            let join = std::thread::Builder::new()
                .name(format!("hearth-rpc-{index}"))
                .spawn(move || rpc_thread(thread_shared, index, rx, stop))
                .map_err(RpcError::Thread)?;
            senders.push(tx);
            joins.push(join);
        }
        Ok(RpcNode {
            inner: Arc::new(NodeInner {
                shared,
                threads: senders,
                next_inbound: AtomicUsize::new(0),
                next_run: AtomicUsize::new(0),
                shutdown,
                joins: Mutex::new(joins),
            }),
        })
    }

    /// Accepts peers on `listener` (on the current runtime) until
    /// [`ServerHandle::stop`] or [`RpcNode::shutdown`].
    pub fn serve(&self, listener: TcpListener) -> Result<ServerHandle, RpcError> {
        let local_addr = listener.local_addr().map_err(RpcError::Listener)?;
        // Weak, so dropping every `RpcNode` still shuts the node down.
        let node = Arc::downgrade(&self.inner);
        let acceptor = TlsAcceptor::from(self.inner.shared.config.tls.server_config());
        let mut stop = self.inner.shutdown.subscribe();
        let gate = HandshakeGate::default();
        let task = tokio::spawn(async move {
            loop {
                let accepted = tokio::select! {
                    accepted = listener.accept() => accepted,
                    _ = stop.changed() => return,
                };
                match accepted {
                    Ok((tcp, peer)) => {
                        let Some(node) = node.upgrade() else { return };
                        let slot = match gate.admit(peer.ip()) {
                            Ok(slot) => slot,
                            Err(Refusal::SourceBusy) => {
                                node.shared
                                    .counters
                                    .handshakes_shed
                                    .fetch_add(1, Ordering::Relaxed);
                                tracing::debug!(%peer, "too many TLS handshakes pending from this address; closing a connection");
                                continue;
                            }
                        };
                        // The RPC thread that will own the connection does
                        // the handshake, so the socket is registered with
                        // its event loop: readiness then wakes that thread
                        // directly, with no hop through this runtime.
                        let tcp = match tcp.into_std() {
                            Ok(tcp) => tcp,
                            Err(e) => {
                                tracing::warn!(%peer, error = %e, "cannot hand an RPC connection over");
                                continue;
                            }
                        };
                        let n = node.threads.len().max(1);
                        let index = node.next_inbound.fetch_add(1, Ordering::Relaxed) % n;
                        if let Some(thread) = node.threads.get(index) {
                            let _ = thread.send(Command::Inbound(Box::new(Inbound {
                                tcp,
                                peer,
                                acceptor: acceptor.clone(),
                                slot,
                            })));
                        }
                    }
                    Err(e) => {
                        // Out of file descriptors and the like: back off a
                        // little instead of spinning.
                        tracing::warn!(error = %e, "accepting an RPC connection failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                }
            }
        });
        Ok(ServerHandle { local_addr, task })
    }

    /// Forwards `request` for Worker `script_id` to its home `home` (the
    /// ring's node: its ID is checked against the certificate of whoever
    /// answers at its address), with the invocation's `context`. Never
    /// fails: a refusal or an unavailable home (or one that cannot prove
    /// its node ID) is served on this node, a home that fails after
    /// accepting yields a 502 (see [`ForwardOutcome`]).
    pub async fn forward(
        &self,
        home: &crate::ring::Member,
        script_id: &str,
        context: ContextStack,
        request: http::Request<Body>,
    ) -> Forwarded {
        let started = Instant::now();
        // A small complete body is read here, on the caller's task, so the
        // request can travel whole in one call (see `crate::inline`).
        let limit = MAX_INLINE_BODY_BYTES.min(self.inner.shared.config.speculative_body_bytes);
        let (parts, body) = request.into_parts();
        let (request, inline) = match gather(body, limit).await {
            Gathered::Whole(bytes) => (
                http::Request::from_parts(parts, hearth_body::full(bytes.clone())),
                Some(bytes),
            ),
            Gathered::Streaming(body) => (http::Request::from_parts(parts, body), None),
        };
        let job = Box::new(ForwardJob {
            home: home.clone(),
            script_id: script_id.to_string(),
            context,
            request,
            inline,
            started,
        });
        let (reply, result) = oneshot::channel();
        // On one of this node's RPC threads (the front door runs there, see
        // `RpcNode::run_on_thread`), the forward stays on that thread and
        // uses its own connection to the home: no hand-off between threads.
        let index = current_thread_of(&self.inner.shared)
            .unwrap_or_else(|| thread_for(&home.id, self.inner.threads.len()));
        let Some(thread) = self.inner.threads.get(index) else {
            return self.serve_here(*job, "no RPC thread".into()).await;
        };
        // A closed channel hands the forward back: served here.
        if let Err(mpsc::error::SendError(Command::Forward(job, _))) =
            thread.send(Command::Forward(job, reply))
        {
            return self
                .serve_here(*job, "the RPC layer is shut down".into())
                .await;
        }
        match result.await {
            Ok(Ok(forwarded)) => forwarded,
            Ok(Err(job)) => {
                self.serve_here(*job, "the RPC layer is shut down".into())
                    .await
            }
            Err(_) => Forwarded {
                response: hearth_body::text_response(
                    http::StatusCode::BAD_GATEWAY,
                    "502 Bad Gateway: the node's RPC layer stopped while forwarding this request\n",
                ),
                outcome: ForwardOutcome::FailedAfterAccept("RPC thread stopped".into()),
                hop: started.elapsed(),
            },
        }
    }

    /// Asks `home` to prewarm `script_id` (`ShardServer.prewarm`) and
    /// returns what it did, or why it could not be asked (unreachable, or
    /// no answer within [`PREWARM_TIMEOUT`]). Runs on the RPC thread that
    /// owns this node's connection to `home`.
    pub async fn prewarm(
        &self,
        home: &crate::ring::Member,
        script_id: &str,
    ) -> Result<PrewarmOutcome, PeerError> {
        let id = script_id.to_string();
        self.call_peer(home, PREWARM_TIMEOUT, |reply| PeerCall::Prewarm(id, reply))
            .await
    }

    /// Tells `member` that `script_id` was redeployed with source `hash`
    /// (`ShardServer.redeployed`); returns when it has revalidated its
    /// warm copy, or why it could not be told within
    /// [`ANNOUNCE_TIMEOUT`].
    pub async fn announce_redeploy(
        &self,
        member: &crate::ring::Member,
        script_id: &str,
        hash: &str,
    ) -> Result<(), PeerError> {
        let (id, hash) = (script_id.to_string(), hash.to_string());
        self.call_peer(member, ANNOUNCE_TIMEOUT, |reply| {
            PeerCall::Redeployed(id, hash, reply)
        })
        .await
    }

    /// Asks `member` to drop its warm copy of `script_id` unless it is the
    /// Worker's home (`ShardServer.handBack`); whether it dropped one.
    pub async fn hand_back(
        &self,
        member: &crate::ring::Member,
        script_id: &str,
    ) -> Result<bool, PeerError> {
        let id = script_id.to_string();
        self.call_peer(member, ANNOUNCE_TIMEOUT, |reply| {
            PeerCall::HandBack(id, reply)
        })
        .await
    }

    /// Opens `member`'s live tail of `script_id` (`ShardServer.tail`,
    /// `status` as the admin API's `status=`, empty for all): each request
    /// of it that finishes there, as the JSON of a `RequestEvent`, until
    /// either side ends it. Dropping the receiver ends it (the member sees
    /// that at its next event or keepalive); a member that cannot be
    /// reached, or drains, ends the receiver.
    pub fn tail(
        &self,
        member: &crate::ring::Member,
        script_id: &str,
        status: &str,
        sample: f64,
    ) -> mpsc::Receiver<String> {
        // Room for a burst; beyond it the member's own queue fills and it
        // counts what it drops (the sink applies back-pressure).
        let (tx, rx) = mpsc::channel(64);
        let index = current_thread_of(&self.inner.shared)
            .unwrap_or_else(|| thread_for(&member.id, self.inner.threads.len()));
        if let Some(thread) = self.inner.threads.get(index) {
            let call = PeerCall::Tail(script_id.to_string(), status.to_string(), sample, tx);
            let _ = thread.send(Command::Peer(member.clone(), call));
        }
        rx
    }

    /// Sends the call `make` builds to `member` on the RPC thread that owns
    /// this node's connection to it, and waits up to `limit` for the answer.
    async fn call_peer<T>(
        &self,
        member: &crate::ring::Member,
        limit: Duration,
        make: impl FnOnce(oneshot::Sender<Result<T, PeerError>>) -> PeerCall,
    ) -> Result<T, PeerError> {
        let index = current_thread_of(&self.inner.shared)
            .unwrap_or_else(|| thread_for(&member.id, self.inner.threads.len()));
        let thread = self.inner.threads.get(index).ok_or(PeerError::NoThread)?;
        let (reply, result) = oneshot::channel();
        thread
            .send(Command::Peer(member.clone(), make(reply)))
            .map_err(|_| PeerError::ShutDown)?;
        match tokio::time::timeout(limit, result).await {
            Ok(Ok(outcome)) => outcome,
            Ok(Err(_)) => Err(PeerError::Stopped),
            Err(_) => Err(PeerError::Timeout(limit)),
        }
    }

    /// Serves `job` here: it could not be handed to an RPC thread.
    async fn serve_here(&self, job: ForwardJob, reason: String) -> Forwarded {
        let shared = &self.inner.shared;
        crate::shard_client::serve_unforwarded(
            &shared.host,
            &shared.counters.client,
            &job.script_id,
            job.context,
            job.request,
            reason,
            job.started,
        )
        .await
    }

    /// Runs `work` on one of the node's RPC threads (round-robin), inside
    /// its event loop: what it registers or spawns there (`TcpStream::from_std`,
    /// `tokio::spawn`) belongs to that thread. The front door runs its
    /// connections this way, so a request, its forward and the Workers it
    /// reaches share one thread and no hand-offs. Returns `false` (and
    /// drops `work`) if the RPC threads have stopped.
    pub fn run_on_thread(&self, work: Box<dyn FnOnce() + Send>) -> bool {
        let threads = &self.inner.threads;
        let index = self.inner.next_run.fetch_add(1, Ordering::Relaxed) % threads.len().max(1);
        threads
            .get(index)
            .is_some_and(|thread| thread.send(Command::Run(work)).is_ok())
    }

    /// The node's RPC counters.
    pub fn stats(&self) -> RpcStats {
        let shared = &self.inner.shared;
        let c = &shared.counters;
        let client = &c.client;
        RpcStats {
            forwarded: client.forwarded.load(Ordering::Relaxed),
            sharded: client.sharded.load(Ordering::Relaxed),
            refusals_received: client.refusals_received.load(Ordering::Relaxed),
            home_unavailable: client.unavailable.load(Ordering::Relaxed),
            failed_after_accept: client.failed_after_accept.load(Ordering::Relaxed),
            speculative_bytes_sent: client.speculative_bytes_sent.load(Ordering::Relaxed),
            home: shared.server.gate.stats(),
            connections_opened: c.connections_opened.load(Ordering::Relaxed),
            connections_accepted: c.connections_accepted.load(Ordering::Relaxed),
            handshakes_rejected: c.handshakes_rejected.load(Ordering::Relaxed),
            handshakes_shed: c.handshakes_shed.load(Ordering::Relaxed),
            client_bytes_sent: c.client_wire.sent(),
            client_bytes_received: c.client_wire.received(),
            server_bytes_sent: c.server_wire.sent(),
            server_bytes_received: c.server_wire.received(),
            unanswered_peak: c
                .client_wire
                .unanswered_peak()
                .max(c.server_wire.unanswered_peak()),
            reads_paused: c.client_wire.reads_paused() + c.server_wire.reads_paused(),
            member_unanswered_peak: c.member_unanswered_peak.load(Ordering::Relaxed),
            client_messages_sent: c.client_wire.messages_sent(),
            client_messages_received: c.client_wire.messages_received(),
            server_messages_sent: c.server_wire.messages_sent(),
            server_messages_received: c.server_wire.messages_received(),
        }
    }

    /// Requests for `script_id` this node is serving as its home right now.
    pub fn home_in_flight(&self, script_id: &str) -> usize {
        self.inner.shared.server.gate.in_flight_for(script_id)
    }

    /// Stops accepting, closes every connection at once (peers see what a
    /// crash looks like) and stops the RPC threads. Later forwards are
    /// served locally.
    pub fn shutdown(&self) {
        let _ = self.inner.shutdown.send(true);
    }

    /// [`RpcNode::shutdown`], then waits for the RPC threads to exit.
    pub async fn shutdown_and_wait(&self) {
        self.shutdown();
        let joins: Vec<_> = {
            let mut guard = self.inner.joins.lock().unwrap_or_else(|e| e.into_inner());
            guard.drain(..).collect()
        };
        let _ = tokio::task::spawn_blocking(move || {
            for join in joins {
                let _ = join.join();
            }
        })
        .await;
    }
}

/// How long [`RpcNode::prewarm`] waits for a home's answer (a compile
/// from source can take seconds; the answer only feeds counters).
pub const PREWARM_TIMEOUT: Duration = Duration::from_secs(30);

/// How long [`RpcNode::announce_redeploy`] and [`RpcNode::hand_back`]
/// wait for a member's answer (one store read at most). A member that does
/// not answer in time still catches up by itself within
/// `hearth_runtime::REVALIDATE_MS`.
pub const ANNOUNCE_TIMEOUT: Duration = Duration::from_secs(2);

/// Makes `call` to `member` on this RPC thread and sends the answer where
/// the call says.
async fn send_peer_call(state: Rc<ThreadState>, member: crate::ring::Member, call: PeerCall) {
    match call {
        PeerCall::Prewarm(id, reply) => {
            let _ = reply.send(send_prewarm(state, member, id).await);
        }
        PeerCall::Redeployed(id, hash, reply) => {
            let _ = reply.send(send_redeployed(state, member, id, hash).await);
        }
        PeerCall::HandBack(id, reply) => {
            let _ = reply.send(send_hand_back(state, member, id).await);
        }
        PeerCall::Tail(id, status, sample, tx) => {
            let peer = member.id.clone();
            if let Err(e) = send_tail(state, member, id, status, sample, tx).await {
                tracing::debug!(%peer, error = %e, "a member's live tail ended");
            }
        }
    }
}

/// Sends `ShardServer.tail` to `member`, its events going to `tx`; returns
/// when the member ends the tail or `tx`'s receiver is gone.
async fn send_tail(
    state: Rc<ThreadState>,
    member: crate::ring::Member,
    script_id: String,
    status: String,
    sample: f64,
    tx: mpsc::Sender<String>,
) -> Result<(), PeerError> {
    let peer = state.peer(&member).await?;
    let sink: crate::schema::hearth_capnp::tail_sink::Client =
        capnp_rpc::new_client(TailSinkServer { tx });
    let mut request = peer.shard.tail_request();
    request.get().set_script_id(script_id.as_str());
    request.get().set_status(status.as_str());
    request.get().set_sample(sample);
    request.get().set_sink(sink);
    request.send().promise.await?;
    Ok(())
}

/// The caller's end of a member's live tail: passes each event on, and
/// fails (which ends the member's tail) once the reader is gone.
struct TailSinkServer {
    tx: mpsc::Sender<String>,
}

impl crate::schema::hearth_capnp::tail_sink::Server for TailSinkServer {
    fn event(
        self: capnp::capability::Rc<Self>,
        params: crate::schema::hearth_capnp::tail_sink::EventParams,
    ) -> impl std::future::Future<Output = Result<(), capnp::Error>> + 'static {
        let json = params.get().and_then(|p| {
            p.get_json()?
                .to_string()
                .map_err(|_| capnp::Error::failed("tail event is not UTF-8".into()))
        });
        let tx = self.tx.clone();
        async move {
            let json = json?;
            let gone = || capnp::Error::failed("the tail's reader is gone".into());
            if json.is_empty() {
                // A keepalive: only whether anyone still reads.
                return if tx.is_closed() { Err(gone()) } else { Ok(()) };
            }
            tx.send(json).await.map_err(|_| gone())
        }
    }
}

/// Sends `ShardServer.redeployed` to `member`.
async fn send_redeployed(
    state: Rc<ThreadState>,
    member: crate::ring::Member,
    script_id: String,
    hash: String,
) -> Result<(), PeerError> {
    let peer = state.peer(&member).await?;
    let mut request = peer.shard.redeployed_request();
    request.get().set_script_id(script_id.as_str());
    request.get().set_hash(hash.as_str());
    request.send().promise.await?;
    Ok(())
}

/// Sends `ShardServer.handBack` to `member`.
async fn send_hand_back(
    state: Rc<ThreadState>,
    member: crate::ring::Member,
    script_id: String,
) -> Result<bool, PeerError> {
    let peer = state.peer(&member).await?;
    let mut request = peer.shard.hand_back_request();
    request.get().set_script_id(script_id.as_str());
    let response = request.send().promise.await?;
    Ok(response.get().map(|r| r.get_dropped())?)
}

/// Sends `ShardServer.prewarm` for `script_id` to `home` on this RPC
/// thread.
async fn send_prewarm(
    state: Rc<ThreadState>,
    home: crate::ring::Member,
    script_id: String,
) -> Result<PrewarmOutcome, PeerError> {
    use crate::schema::hearth_capnp::PrewarmOutcome as W;
    let peer = state.peer(&home).await?;
    let mut request = peer.shard.prewarm_request();
    request.get().set_script_id(script_id.as_str());
    let response = request.send().promise.await?;
    let outcome = response
        .get()
        .and_then(|r| r.get_outcome().map_err(capnp::Error::from))?;
    Ok(match outcome {
        W::Loaded => PrewarmOutcome::Loaded,
        W::AlreadyWarm => PrewarmOutcome::AlreadyWarm,
        W::Dropped => PrewarmOutcome::Dropped,
        W::Failed => PrewarmOutcome::Failed,
    })
}

fn thread_for(home: &crate::ring::NodeId, threads: usize) -> usize {
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    home.hash(&mut hasher);
    (hasher.finish() % threads.max(1) as u64) as usize
}

type PeerKey = (crate::ring::NodeId, SocketAddr);

type Connecting = Shared<LocalBoxFuture<'static, Result<PeerConn, PeerError>>>;

enum PeerSlot {
    Connecting(Connecting),
    Ready(PeerConn),
    Down { until: Instant, reason: PeerError },
}

/// One RPC thread's state. Lives in its `LocalSet`.
struct ThreadState {
    shared: Arc<NodeShared>,
    /// Which of the node's RPC threads this is.
    index: usize,
    client: Rc<ClientEnv>,
    /// Connections to homes, by the node ID and address they were opened
    /// for (the peer proved that ID in the handshake).
    peers: RefCell<HashMap<PeerKey, PeerSlot>>,
    /// A second handle on every connection's socket, to close it at once on
    /// shutdown whatever capnp-rpc still references.
    sockets: RefCell<HashMap<u64, std::net::TcpStream>>,
    next_id: Cell<u64>,
}

fn rpc_thread(
    shared: Arc<NodeShared>,
    index: usize,
    mut commands: mpsc::UnboundedReceiver<Command>,
    mut stop: watch::Receiver<bool>,
) {
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            tracing::error!(error = %e, "cannot start an RPC thread's runtime");
            return;
        }
    };
    let local = tokio::task::LocalSet::new();
    let state = Rc::new(ThreadState {
        client: Rc::new(ClientEnv {
            host: shared.host.clone(),
            lazies: RefCell::new(CapabilityServerSet::new()),
            counters: shared.counters.client.clone(),
            gate: shared.server.gate.clone(),
            dispatch_timeout: shared.config.dispatch_timeout,
            speculative_budget: shared
                .config
                .speculative_body_bytes
                .min(MAX_SPECULATIVE_BODY_BYTES),
        }),
        shared,
        index,
        peers: RefCell::new(HashMap::new()),
        sockets: RefCell::new(HashMap::new()),
        next_id: Cell::new(0),
    });
    CURRENT.with(|c| *c.borrow_mut() = Some(state.clone()));
    let run_state = state.clone();
    let queue = &mut commands;
    local.block_on(&rt, async move {
        let state = run_state;
        loop {
            let command = tokio::select! {
                command = queue.recv() => command,
                _ = stop.changed() => None,
            };
            match command {
                None => break,
                Some(Command::Inbound(inbound)) => state.handshake(*inbound),
                Some(Command::Run(work)) => work(),
                Some(Command::Peer(member, call)) => {
                    tokio::task::spawn_local(send_peer_call(state.clone(), member, call));
                }
                Some(Command::Forward(job, reply)) => {
                    let state = state.clone();
                    tokio::task::spawn_local(async move {
                        let mut reply = reply;
                        let forward = async {
                            let peer = state.peer(&job.home).await;
                            shard_client::forward(state.client.clone(), peer, *job).await
                        };
                        // A requester that went away (its client left) drops
                        // the forward, which cancels the invocation on the
                        // home.
                        tokio::select! {
                            forwarded = forward => {
                                let _ = reply.send(Ok(forwarded));
                            }
                            () = reply.closed() => {}
                        }
                    });
                }
            }
        }
    });
    // Forwards this thread never started are handed back to be served
    // locally; later ones find the channel closed and do the same.
    commands.close();
    while let Ok(command) = commands.try_recv() {
        if let Command::Forward(job, reply) = command {
            let _ = reply.send(Err(job));
        }
    }
    state.close_all_sockets();
    CURRENT.with(|c| c.borrow_mut().take());
    // Dropping the LocalSet drops every connection and capability.
    drop(local);
    state.close_all_sockets();
}

thread_local! {
    /// The state of the RPC thread this is, if it is one.
    static CURRENT: RefCell<Option<Rc<ThreadState>>> = const { RefCell::new(None) };
}

/// The index of this thread among the node's RPC threads, when called on
/// one of them.
fn current_thread_of(shared: &Arc<NodeShared>) -> Option<usize> {
    CURRENT.with(|c| {
        c.borrow()
            .as_ref()
            .filter(|state| Arc::ptr_eq(&state.shared, shared))
            .map(|state| state.index)
    })
}

impl ThreadState {
    fn new_id(&self) -> u64 {
        let id = self.next_id.get();
        self.next_id.set(id + 1);
        id
    }

    fn remember_socket(&self, id: u64, tls: &PeerTls) {
        let tcp = tls.get_ref().0;
        #[cfg(unix)]
        {
            use std::os::fd::AsFd;
            if let Ok(fd) = tcp.as_fd().try_clone_to_owned() {
                self.sockets
                    .borrow_mut()
                    .insert(id, std::net::TcpStream::from(fd));
            }
        }
        #[cfg(not(unix))]
        let _ = (id, tcp);
    }

    fn forget_socket(&self, id: u64) {
        self.sockets.borrow_mut().remove(&id);
    }

    fn close_all_sockets(&self) {
        for (_, socket) in self.sockets.borrow_mut().drain() {
            let _ = socket.shutdown(std::net::Shutdown::Both);
        }
    }

    /// Completes an inbound connection's TLS handshake on this thread, then
    /// serves it; a peer without a cluster certificate is dropped here.
    fn handshake(self: &Rc<Self>, inbound: Inbound) {
        let state = self.clone();
        tokio::task::spawn_local(async move {
            let Inbound {
                tcp,
                peer,
                acceptor,
                mut slot,
            } = inbound;
            let counters = &state.shared.counters;
            let accepted = match tokio::net::TcpStream::from_std(tcp) {
                Ok(tcp) => {
                    let timeout = state.shared.config.handshake_timeout;
                    tokio::select! {
                        accepted = transport::accept(tcp, &acceptor, timeout) => accepted,
                        () = slot.evicted() => {
                            counters.handshakes_shed.fetch_add(1, Ordering::Relaxed);
                            return;
                        }
                    }
                }
                Err(e) => Err(e),
            };
            drop(slot);
            match accepted {
                Ok(tls) => {
                    counters
                        .connections_accepted
                        .fetch_add(1, Ordering::Relaxed);
                    state.serve_inbound(tls);
                }
                Err(e) => {
                    counters.handshakes_rejected.fetch_add(1, Ordering::Relaxed);
                    tracing::info!(%peer, error = %e, "rejected an RPC peer at the TLS handshake");
                }
            }
        });
    }

    fn serve_inbound(self: &Rc<Self>, tls: PeerTls) {
        let id = self.new_id();
        self.remember_socket(id, &tls);
        let member = self.shared.member_budget(&tls);
        let stream = CountingStream::new(tls, self.shared.counters.server_wire.clone());
        let network = transport::two_party(
            stream,
            Side::Server,
            self.shared.config.max_message_bytes,
            self.shared.config.max_unanswered_bytes,
            Some(member),
            self.shared.counters.server_wire.clone(),
        );
        let (closed_tx, closed) = closed_signal();
        let bootstrap = ShardServerImpl::new_client(self.shared.server.clone(), closed);
        let rpc = RpcSystem::new(network, Some(bootstrap.client));
        let state = self.clone();
        tokio::task::spawn_local(async move {
            if let Err(e) = rpc.await {
                tracing::debug!(error = %e, "inbound RPC connection ended with an error");
            }
            drop(closed_tx);
            state.forget_socket(id);
        });
    }

    /// A connection to `home`: the open one, one being opened, or a new one.
    async fn peer(self: &Rc<Self>, home: &crate::ring::Member) -> Result<PeerConn, PeerError> {
        let key: PeerKey = (home.id.clone(), home.rpc_addr);
        let connecting = {
            let mut peers = self.peers.borrow_mut();
            match peers.get(&key) {
                Some(PeerSlot::Ready(conn)) if conn.alive.get() => {
                    return Ok(conn.clone());
                }
                Some(PeerSlot::Connecting(f)) => f.clone(),
                Some(PeerSlot::Down { until, reason }) if Instant::now() < *until => {
                    return Err(reason.clone());
                }
                _ => {
                    let state = self.clone();
                    let home = home.clone();
                    let f = async move { state.connect(home).await }
                        .boxed_local()
                        .shared();
                    peers.insert(key.clone(), PeerSlot::Connecting(f.clone()));
                    f
                }
            }
        };
        let result = connecting.await;
        let mut peers = self.peers.borrow_mut();
        if let Some(PeerSlot::Connecting(_)) = peers.get(&key) {
            match &result {
                Ok(conn) => {
                    peers.insert(key, PeerSlot::Ready(conn.clone()));
                }
                Err(reason) => {
                    peers.insert(
                        key,
                        PeerSlot::Down {
                            until: Instant::now() + self.shared.config.unreachable_backoff,
                            reason: reason.clone(),
                        },
                    );
                }
            }
        }
        result
    }

    async fn connect(self: Rc<Self>, home: crate::ring::Member) -> Result<PeerConn, PeerError> {
        let config = &self.shared.config;
        let tls = transport::connect(&home, config.tls.client_config(), config.connect_timeout)
            .await
            .map_err(|e| PeerError::Connect(Arc::new(e)))?;
        self.shared
            .counters
            .connections_opened
            .fetch_add(1, Ordering::Relaxed);
        let id = self.new_id();
        self.remember_socket(id, &tls);
        let stream = CountingStream::new(tls, self.shared.counters.client_wire.clone());
        let network = transport::two_party(
            stream,
            Side::Client,
            config.max_message_bytes,
            config.max_unanswered_bytes,
            None,
            self.shared.counters.client_wire.clone(),
        );
        let mut rpc = RpcSystem::new(network, None);
        let shard: crate::schema::hearth_capnp::shard_server::Client = rpc.bootstrap(Side::Server);
        let (closed_tx, closed) = closed_signal();
        let alive = Rc::new(Cell::new(true));
        let state = self.clone();
        let still_alive = alive.clone();
        tokio::task::spawn_local(async move {
            if let Err(e) = rpc.await {
                tracing::debug!(home = %home.id, addr = %home.rpc_addr, error = %e, "RPC connection to a home ended with an error");
            }
            still_alive.set(false);
            drop(closed_tx);
            state.forget_socket(id);
            let mut peers = state.peers.borrow_mut();
            let key: PeerKey = (home.id.clone(), home.rpc_addr);
            if let Some(PeerSlot::Ready(conn)) = peers.get(&key)
                && Rc::ptr_eq(&conn.alive, &still_alive)
            {
                peers.remove(&key);
            }
        });
        Ok(PeerConn {
            shard,
            closed,
            alive,
        })
    }
}
