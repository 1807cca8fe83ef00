//! What a node starts membership with.
//!
//! A [`MembershipConfig`] names this node (its ID, RPC address and weight),
//! the static nodes that are always members, the ring layout every node
//! must share, and, for a gossiping cluster, a [`GossipConfig`]: where to
//! listen, whom to join through, how fast to detect failures, the shared
//! key that authenticates datagrams and the check that proves a member's
//! node ID before it gets a ring slot.

use std::net::SocketAddr;
use std::time::Duration;

use super::{FailureDetection, IdentityCheck, PeerAddr, RESOLVE_EVERY, StaticMember};
use crate::ring::{Member, RingConfig};

/// How to start a node's membership.
#[derive(Clone, Debug)]
pub struct MembershipConfig {
    /// This node: its ID, RPC address and weight.
    pub node: Member,
    /// Nodes that are always members (no failure detection). An entry with
    /// this node's own ID is ignored.
    pub static_nodes: Vec<StaticMember>,
    /// Gossip with the other nodes; `None` for a static cluster.
    pub gossip: Option<GossipConfig>,
    /// Ring layout; must be the same on every node.
    pub ring: RingConfig,
    /// How often DNS names among the seeds and static nodes are resolved
    /// again ([`RESOLVE_EVERY`] by default).
    pub resolve_every: Duration,
}

impl MembershipConfig {
    /// A node with gossip on `listen`, joining through `seeds`, default
    /// timing and ring.
    pub fn gossip(node: Member, listen: SocketAddr, seeds: Vec<SocketAddr>) -> Self {
        Self {
            node,
            static_nodes: Vec::new(),
            gossip: Some(GossipConfig {
                listen,
                advertise: None,
                seeds: seeds.into_iter().map(PeerAddr::Ip).collect(),
                timing: FailureDetection::default(),
                key: None,
                verify: None,
            }),
            ring: RingConfig::default(),
            resolve_every: RESOLVE_EVERY,
        }
    }

    /// A static cluster: `node` plus `static_nodes`, no gossip.
    pub fn fixed(node: Member, static_nodes: Vec<Member>) -> Self {
        Self {
            node,
            static_nodes: static_nodes.into_iter().map(StaticMember::from).collect(),
            gossip: None,
            ring: RingConfig::default(),
            resolve_every: RESOLVE_EVERY,
        }
    }
}

/// Where and how this node gossips.
#[derive(Clone, Debug)]
pub struct GossipConfig {
    /// UDP address to bind, and to advertise to peers unless `advertise`
    /// is set. Must be a specific IP (not 0.0.0.0); port 0 picks a free
    /// port (see [`Membership::gossip_addr`](super::Membership::gossip_addr)).
    pub listen: SocketAddr,
    /// The address peers send this node's gossip to, when it is not
    /// `listen`: behind NAT or a container's port mapping, or a relay (what
    /// Consul calls `advertise_addr`). Datagrams to it must reach
    /// `listen`; this node's own datagrams still leave from `listen`. A
    /// specific IP and port.
    pub advertise: Option<SocketAddr>,
    /// Gossip addresses of nodes to join through (a name stands for every
    /// address it resolves to). This node keeps announcing to them while it
    /// knows no peer, so start order does not matter.
    pub seeds: Vec<PeerAddr>,
    /// Failure-detection timing.
    pub timing: FailureDetection,
    /// The cluster's shared gossip key. When set, every datagram carries a
    /// keyed blake3 MAC and datagrams without a valid one are dropped, so
    /// only holders of the key can join or speak for a member. `None`
    /// accepts anyone who can reach the port.
    pub key: Option<[u8; 32]>,
    /// Proves each gossip member's node ID before it enters the ring (see
    /// the [membership docs](super#identity-a-ring-slot-needs-the-nodes-certificate));
    /// `None` trusts what gossip says.
    pub verify: Option<IdentityCheck>,
}
