//! A node's RPC counters, and the snapshot the rest of the node reads.
//!
//! The counters live in one [`NodeCounters`] shared by every RPC thread
//! (atomics, and the wire counters of the client and server sides);
//! [`RpcNode::stats`] reads them all into an
//! [`RpcStats`], which `/metrics` and the tests consume.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use super::RpcNode;
use crate::admission::OverloadStats;
use crate::shard_client::ClientCounters;
use crate::transport::{MessageCounts, WireCounters};

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
    /// once (bounded by
    /// [`RpcConfig::max_unanswered_bytes`](super::RpcConfig::max_unanswered_bytes)
    /// plus one message).
    pub unanswered_peak: u64,
    /// Times a connection stopped reading because its peer's unanswered
    /// calls reached
    /// [`RpcConfig::max_unanswered_bytes`](super::RpcConfig::max_unanswered_bytes)
    /// (or its member's reached
    /// [`RpcConfig::max_unanswered_bytes_per_member`](super::RpcConfig::max_unanswered_bytes_per_member)).
    pub reads_paused: u64,
    /// The most bytes one member's calls held unanswered at once over all
    /// its connections (bounded by
    /// [`RpcConfig::max_unanswered_bytes_per_member`](super::RpcConfig::max_unanswered_bytes_per_member)
    /// plus one message per connection).
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

/// The counters behind [`RpcStats`], shared by every RPC thread of a node.
#[derive(Default)]
pub(super) struct NodeCounters {
    pub(super) client: Arc<ClientCounters>,
    pub(super) connections_opened: AtomicU64,
    pub(super) connections_accepted: AtomicU64,
    pub(super) handshakes_rejected: AtomicU64,
    pub(super) handshakes_shed: AtomicU64,
    pub(super) client_wire: Arc<WireCounters>,
    pub(super) server_wire: Arc<WireCounters>,
    pub(super) member_unanswered_peak: Arc<AtomicU64>,
}

impl RpcNode {
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
}
