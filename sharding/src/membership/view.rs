//! The live set, and the ring built from it.
//!
//! A [`View`] is what one node knows: itself (until it drains), the static
//! nodes, and whichever gossip members the driver lets onto the ring. Each
//! [`View::rebuild`] recomputes the live set; when it changed, it builds a
//! new [`Ring`], publishes it through the [`SharedRing`] and the watch
//! channel, and logs who came, went or changed and the share of a fixed
//! sample of script IDs ([`REHOME_SAMPLE`] of them) that moved home.
//!
//! Without gossip, [`run_static`] is the whole membership task: it only
//! drains and takes newly resolved static addresses.

use std::collections::BTreeMap;
use std::sync::Arc;

use tokio::sync::{mpsc, watch};

use super::Command;
use super::gossip::{GossipIdentity, MAX_GOSSIP_WEIGHT};
use crate::ring::{Member, NodeId, Ring, RingConfig, SharedRing, rehomed_fraction};

/// Size of the synthetic key sample used to log re-homed fractions.
pub(super) const REHOME_SAMPLE: usize = 10_000;

/// The live set and the ring derived from it.
pub(super) struct View {
    pub(super) me: Member,
    pub(super) statics: Vec<Member>,
    pub(super) draining: bool,
    pub(super) config: RingConfig,
    pub(super) shared: SharedRing,
    pub(super) updates: watch::Sender<Arc<Ring>>,
    pub(super) sample: Vec<String>,
}

impl View {
    /// Replaces the static members (their names resolved anew), leaving out
    /// this node.
    pub(super) fn set_statics(&mut self, statics: Vec<Member>) {
        self.statics = statics.into_iter().filter(|n| n.id != self.me.id).collect();
    }

    /// Recomputes the live set from the gossip members (those allowed on the
    /// ring) and, if it changed, builds, publishes and logs the new ring.
    pub(super) fn rebuild<'a>(&self, gossip_members: impl Iterator<Item = &'a GossipIdentity>) {
        let mut live: BTreeMap<NodeId, Member> = self
            .statics
            .iter()
            .map(|n| (n.id.clone(), n.clone()))
            .collect();
        // Two gossip identities claiming one node ID (misconfiguration):
        // every node keeps the same one, the newest generation.
        let mut gossiped: BTreeMap<&NodeId, &GossipIdentity> = BTreeMap::new();
        for member in gossip_members {
            if member.draining || member.id == self.me.id {
                continue;
            }
            if member.weight == 0 || member.weight > MAX_GOSSIP_WEIGHT {
                tracing::warn!(node = %member.id, weight = member.weight,
                    "ignoring gossip member with an out-of-range weight");
                continue;
            }
            match gossiped.get(&member.id) {
                Some(kept) if kept.precedence() >= member.precedence() => {
                    tracing::warn!(node = %member.id, a = %kept.gossip, b = %member.gossip,
                        "two gossip addresses claim one node ID");
                }
                _ => {
                    gossiped.insert(&member.id, member);
                }
            }
        }
        for member in gossiped.into_values() {
            live.insert(member.id.clone(), member.ring_member());
        }
        if !self.draining {
            live.insert(self.me.id.clone(), self.me.clone());
        }

        let old = self.shared.load_full();
        if live.values().eq(old.members()) {
            return;
        }
        let ring = match Ring::new(live.into_values(), self.config) {
            Ok(ring) => ring,
            Err(error) => {
                tracing::error!(%error, "membership change ignored: ring cannot be built");
                return;
            }
        };
        let added: Vec<&NodeId> = ring
            .members()
            .iter()
            .filter(|n| !old.contains(&n.id))
            .map(|n| &n.id)
            .collect();
        let removed: Vec<&NodeId> = old
            .members()
            .iter()
            .filter(|n| !ring.contains(&n.id))
            .map(|n| &n.id)
            .collect();
        let changed: Vec<&NodeId> = ring
            .members()
            .iter()
            .filter(|n| old.get(&n.id).is_some_and(|o| o != *n))
            .map(|n| &n.id)
            .collect();
        let fraction = rehomed_fraction(&old, &ring, &self.sample);
        tracing::info!(
            node = %self.me.id,
            members = ring.len(),
            ?added,
            ?removed,
            ?changed,
            rehomed = format_args!("{:.2}%", fraction * 100.0),
            "ring changed"
        );
        let ring = Arc::new(ring);
        self.shared.store(ring.clone());
        self.updates.send_replace(ring);
    }
}

/// The membership task of a static cluster (no gossip): drains and takes
/// newly resolved static addresses until the handle shuts it down.
pub(super) async fn run_static(mut view: View, mut commands: mpsc::UnboundedReceiver<Command>) {
    while let Some(command) = commands.recv().await {
        match command {
            Command::Drain(reply) => {
                view.draining = true;
                view.rebuild(std::iter::empty());
                let _ = reply.send(());
            }
            Command::Shutdown(reply) => {
                let _ = reply.send(());
                return;
            }
            Command::Resolved(resolved) => {
                view.set_statics(resolved.statics);
                view.rebuild(std::iter::empty());
            }
        }
    }
}
