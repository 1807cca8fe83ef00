//! One RPC thread's connections: those peers open to it, and those it
//! opens to homes.
//!
//! An inbound connection arrives as a raw socket the accept loop handed to
//! this thread; the thread completes its TLS handshake itself (bounded by
//! [`RpcConfig::handshake_timeout`](super::RpcConfig::handshake_timeout),
//! and given up if the handshake gate evicts it), so a peer without a
//! cluster certificate is dropped before Cap'n Proto sees it, and then
//! serves the shard server on it. Every connection's unanswered calls count
//! against its peer's member budget.
//!
//! Outbound, a thread keeps one connection per home, keyed by node ID and
//! address ([`PeerKey`]): the open one is reused, one being opened is
//! awaited by every request that needs it, and one that failed is not tried
//! again for [`RpcConfig::unreachable_backoff`](super::RpcConfig::unreachable_backoff)
//! (its requests are served locally meanwhile). A connection that ends is
//! forgotten, so the next request opens a new one.

use std::cell::Cell;
use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use capnp_rpc::RpcSystem;
use capnp_rpc::rpc_twoparty_capnp::Side;
use futures::FutureExt;
use futures::future::{LocalBoxFuture, Shared};

use super::PeerError;
use super::thread::{Inbound, ThreadState};
use crate::shard_client::PeerConn;
use crate::shard_server::ShardServerImpl;
use crate::transport::{self, CountingStream, PeerTls};
use crate::worker_fetch::closed_signal;

/// A connection to a home is for one node ID at one address.
pub(super) type PeerKey = (crate::ring::NodeId, SocketAddr);

/// A connection being opened, shared by every request that waits for it.
type Connecting = Shared<LocalBoxFuture<'static, Result<PeerConn, PeerError>>>;

/// Where a thread's connection to one home stands.
pub(super) enum PeerSlot {
    Connecting(Connecting),
    Ready(PeerConn),
    Down { until: Instant, reason: PeerError },
}

impl ThreadState {
    /// Completes an inbound connection's TLS handshake on this thread, then
    /// serves it; a peer without a cluster certificate is dropped here.
    pub(super) fn handshake(self: &Rc<Self>, inbound: Inbound) {
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
    pub(super) async fn peer(
        self: &Rc<Self>,
        home: &crate::ring::Member,
    ) -> Result<PeerConn, PeerError> {
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
