//! Gossip authentication: a keyed MAC on every datagram, and the counters
//! of what was refused.
//!
//! With a cluster gossip key, [`seal`] appends a keyed blake3 MAC to each
//! outgoing datagram and [`open`] drops any incoming one whose MAC does not
//! check out, so an outsider can neither join nor forge a member's state.
//! The usual sender of a dropped datagram is not an attacker but a member
//! configured with another key, and a node that cannot hear its peers
//! silently serves every Worker alone: so each drop is counted
//! ([`GossipCounters`], read by `/metrics`) and warned about, at most once
//! per [`UNAUTHENTICATED_WARN_EVERY`]. There is no replay protection beyond
//! SWIM's own incarnation ordering.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering as AtomicOrdering};
use std::time::Duration;

use tokio::time::Instant;

use super::gossip::Driver;

/// How often at most a node logs that it drops gossip it cannot
/// authenticate (every drop is counted).
pub const UNAUTHENTICATED_WARN_EVERY: Duration = Duration::from_secs(10);

/// Gossip counters of a running node; cheap to clone, readable from any
/// thread (the node's `/metrics` reads them).
#[derive(Debug, Clone, Default)]
pub struct GossipCounters {
    unauthenticated: Arc<AtomicU64>,
    pub(super) identities_refused: Arc<AtomicU64>,
}

impl GossipCounters {
    /// Datagrams dropped because their MAC did not check out (a sender
    /// without this node's gossip key, or a forger).
    pub fn unauthenticated(&self) -> u64 {
        self.unauthenticated.load(AtomicOrdering::Relaxed)
    }

    /// Identity checks failed: a gossip member kept off the ring because
    /// the node at its RPC address could not prove its node ID.
    pub fn identities_refused(&self) -> u64 {
        self.identities_refused.load(AtomicOrdering::Relaxed)
    }
}

impl Driver {
    /// Counts a datagram that failed authentication and warns, at most once
    /// per [`UNAUTHENTICATED_WARN_EVERY`].
    pub(super) fn unauthenticated(&mut self, from: SocketAddr) {
        self.counters
            .unauthenticated
            .fetch_add(1, AtomicOrdering::Relaxed);
        self.unwarned += 1;
        let now = Instant::now();
        if self
            .last_warning
            .is_some_and(|at| now.duration_since(at) < UNAUTHENTICATED_WARN_EVERY)
        {
            return;
        }
        tracing::warn!(
            %from,
            dropped = self.unwarned,
            "dropped gossip this node cannot authenticate: is cluster.gossip_key the same \
             on every node? Until it is, this node does not see its peers and serves \
             every Worker alone"
        );
        self.last_warning = Some(now);
        self.unwarned = 0;
    }
}

/// Appends the MAC (when keyed) to an outgoing datagram.
pub(super) fn seal(key: Option<&[u8; 32]>, mut datagram: Vec<u8>) -> Vec<u8> {
    if let Some(key) = key {
        let tag = blake3::keyed_hash(key, &datagram);
        datagram.extend_from_slice(tag.as_bytes());
    }
    datagram
}

/// The payload of an incoming datagram if its MAC checks out (or if
/// unkeyed); the comparison is constant-time.
pub(super) fn open<'a>(key: Option<&[u8; 32]>, datagram: &'a [u8]) -> Option<&'a [u8]> {
    let Some(key) = key else {
        return Some(datagram);
    };
    let split = datagram.len().checked_sub(blake3::OUT_LEN)?;
    let (payload, tag) = datagram.split_at(split);
    let tag: [u8; blake3::OUT_LEN] = tag.try_into().ok()?;
    (blake3::keyed_hash(key, payload) == blake3::Hash::from(tag)).then_some(payload)
}
