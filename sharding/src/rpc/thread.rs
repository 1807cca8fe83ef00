//! One RPC thread: an OS thread running a current-thread tokio runtime and
//! a `LocalSet`, where capnp-rpc's `!Send` objects live.
//!
//! Each thread owns its connections (the ones peers opened that were handed
//! to it, and one to each home it forwards to) and the Workers it runs, so
//! a request stays on one thread from the front door to the Worker. The
//! rest of the node talks to a thread through its [`Command`] channel; a
//! caller that is itself on one of the node's RPC threads
//! ([`current_thread_of`]) keeps its work there, any other caller uses the
//! thread that owns the connection to the home ([`thread_for`]). When the
//! node shuts down, each thread hands back the forwards it never started
//! (served locally) and closes every socket at once, as a crash would.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::Arc;

use capnp_rpc::CapabilityServerSet;
use tokio::sync::{mpsc, oneshot, watch};
use tokio_rustls::TlsAcceptor;

use super::connections::{PeerKey, PeerSlot};
use super::node::NodeShared;
use super::peer_calls::{PeerCall, send_peer_call};
use super::{Forwarded, MAX_SPECULATIVE_BODY_BYTES};
use crate::handshake_gate::Slot;
use crate::shard_client::{self, ClientEnv, ForwardJob};
use crate::transport::PeerTls;

/// What the rest of the node asks of one RPC thread.
pub(super) enum Command {
    /// Complete a peer's TLS handshake, then serve its connection.
    Inbound(Box<Inbound>),
    /// Run work inside the thread's event loop
    /// ([`RpcNode::run_on_thread`](super::RpcNode::run_on_thread)).
    Run(Box<dyn FnOnce() + Send>),
    /// Forward a request to its home over this thread's connection.
    Forward(Box<ForwardJob>, Reply),
    /// A call to one member's shard server.
    Peer(crate::ring::Member, PeerCall),
}

/// A TCP connection from a peer, before its TLS handshake.
pub(super) struct Inbound {
    pub(super) tcp: std::net::TcpStream,
    pub(super) peer: SocketAddr,
    pub(super) acceptor: TlsAcceptor,
    /// Its place in the [`HandshakeGate`](crate::handshake_gate::HandshakeGate),
    /// held until the handshake is over.
    pub(super) slot: Slot,
}

/// How an RPC thread answers a forward: the result, or the job back if the
/// thread stopped before looking at it (it is then served locally).
pub(super) type Reply = oneshot::Sender<Result<Forwarded, Box<ForwardJob>>>;

/// The RPC thread that owns this node's connection to `home`, when the
/// caller is not on an RPC thread of its own: one per home, by hash.
pub(super) fn thread_for(home: &crate::ring::NodeId, threads: usize) -> usize {
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    home.hash(&mut hasher);
    (hasher.finish() % threads.max(1) as u64) as usize
}

/// One RPC thread's state. Lives in its `LocalSet`.
pub(super) struct ThreadState {
    pub(super) shared: Arc<NodeShared>,
    /// Which of the node's RPC threads this is.
    index: usize,
    client: Rc<ClientEnv>,
    /// Connections to homes, by the node ID and address they were opened
    /// for (the peer proved that ID in the handshake).
    pub(super) peers: RefCell<HashMap<PeerKey, PeerSlot>>,
    /// A second handle on every connection's socket, to close it at once on
    /// shutdown whatever capnp-rpc still references.
    sockets: RefCell<HashMap<u64, std::net::TcpStream>>,
    next_id: Cell<u64>,
}

/// The body of RPC thread `index`: its runtime and `LocalSet`, serving
/// `commands` until `stop` or until every sender is gone, then handing
/// back the forwards it never started and closing every socket.
pub(super) fn rpc_thread(
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
pub(super) fn current_thread_of(shared: &Arc<NodeShared>) -> Option<usize> {
    CURRENT.with(|c| {
        c.borrow()
            .as_ref()
            .filter(|state| Arc::ptr_eq(&state.shared, shared))
            .map(|state| state.index)
    })
}

impl ThreadState {
    pub(super) fn new_id(&self) -> u64 {
        let id = self.next_id.get();
        self.next_id.set(id + 1);
        id
    }

    pub(super) fn remember_socket(&self, id: u64, tls: &PeerTls) {
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

    pub(super) fn forget_socket(&self, id: u64) {
        self.sockets.borrow_mut().remove(&id);
    }

    fn close_all_sockets(&self) {
        for (_, socket) in self.sockets.borrow_mut().drain() {
            let _ = socket.shutdown(std::net::Shutdown::Both);
        }
    }
}
