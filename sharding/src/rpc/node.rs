//! The handle the rest of the node uses: [`RpcNode`].
//!
//! [`RpcNode::start`] spawns the RPC threads and keeps a channel to each;
//! every clone of the handle shares them (`Send + Sync`, usable from any
//! tokio task). [`RpcNode::serve`] runs the accept loop on the caller's
//! runtime: it admits each peer through the handshake gate and hands the
//! raw socket to an RPC thread, round-robin, which does the rest.
//! [`RpcNode::forward`] reads a small body whole, then forwards on the
//! caller's own RPC thread if it is on one, else on the thread that owns the
//! connection to the home; a forward that no thread can take is served
//! here. [`RpcNode::run_on_thread`] is how the front door puts its
//! connections on the RPC threads, and [`RpcNode::shutdown`] closes
//! everything at once.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::net::TcpListener;
use tokio::sync::{mpsc, oneshot, watch};
use tokio_rustls::TlsAcceptor;

use super::stats::NodeCounters;
use super::thread::{Command, Inbound, current_thread_of, rpc_thread, thread_for};
use super::{ForwardOutcome, Forwarded, RpcConfig, RpcError};
use crate::admission::OverloadGate;
use crate::context_stack::ContextStack;
use crate::handshake_gate::{HandshakeGate, Refusal};
use crate::hosted_workers::{Body, HostedWorkers};
use crate::inline::{Gathered, MAX_INLINE_BODY_BYTES, gather};
use crate::shard_client::ForwardJob;
use crate::shard_server::ServerShared;
use crate::transport::{MemberBudget, PeerTls};
use crate::worker_fetch::WorkerHost;

/// What every RPC thread of a node shares.
pub(super) struct NodeShared {
    pub(super) config: RpcConfig,
    pub(super) host: WorkerHost,
    pub(super) server: Arc<ServerShared>,
    pub(super) counters: NodeCounters,
    /// The unanswered-bytes budget of each member connected now, by the
    /// hash of its certificate (a member is a certificate).
    pub(super) members: Mutex<HashMap<[u8; 32], std::sync::Weak<MemberBudget>>>,
}

impl NodeShared {
    /// The budget shared by every connection of the member at the other
    /// end of `tls` (see [`RpcConfig::max_unanswered_bytes_per_member`]).
    pub(super) fn member_budget(&self, tls: &PeerTls) -> Arc<MemberBudget> {
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

/// What the clones of one [`RpcNode`] share; dropping the last one shuts
/// the node's RPC down.
pub(super) struct NodeInner {
    pub(super) shared: Arc<NodeShared>,
    pub(super) threads: Vec<mpsc::UnboundedSender<Command>>,
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
    pub(super) inner: Arc<NodeInner>,
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
