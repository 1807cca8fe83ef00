//! Proving a gossip member's node ID before it gets a ring slot.
//!
//! The gossip key says "a member of this cluster", not "node `b`": a holder
//! of the key could gossip node `b`'s ID with its own RPC address and take
//! `b`'s ring slot. With an [`IdentityCheck`] configured, the driver puts a
//! gossip member on the ring only once the check proved that whoever
//! listens at its RPC address holds the cluster certificate for its node
//! ID. Each gossiped (node ID, RPC address) is in one [`Identity`] state:
//! being checked (off the ring), proven (on it), or refused (off it, and
//! checked again [`IDENTITY_RETRY`] later, as it may only have been
//! starting). Checks run as tasks of their own and report a [`Verdict`]
//! back to the driver; a member gossip no longer mentions is forgotten.

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::Ordering as AtomicOrdering;
use std::time::Duration;

use tokio::time::Instant;

use super::gossip::Driver;
use crate::ring::Member;
use crate::transport::ConnectError;

/// How soon a gossip member that failed its [`IdentityCheck`] is checked
/// again (it may only have been starting).
pub const IDENTITY_RETRY: Duration = Duration::from_secs(2);

/// Proves a gossip member is the node it claims to be before it gets a ring
/// slot: resolves `Ok` only if the node listening at `node.rpc_addr` holds
/// the cluster certificate for `node.id`, and with the failed connection
/// ([`ConnectError`]) otherwise.
#[derive(Clone)]
pub struct IdentityCheck(Arc<IdentityCheckFn>);

type IdentityCheckFn =
    dyn Fn(Member) -> futures::future::BoxFuture<'static, Result<(), ConnectError>> + Send + Sync;

impl IdentityCheck {
    /// Wraps a check.
    pub fn new(
        check: impl Fn(Member) -> futures::future::BoxFuture<'static, Result<(), ConnectError>>
        + Send
        + Sync
        + 'static,
    ) -> Self {
        Self(Arc::new(check))
    }
}

impl std::fmt::Debug for IdentityCheck {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("IdentityCheck")
    }
}

/// Where a gossiped identity stands with the [`IdentityCheck`].
pub(super) enum Identity {
    Checking,
    Proven,
    Refused { retry_at: Instant },
}

/// The result of one identity check.
pub(super) struct Verdict {
    pub(super) node: Member,
    pub(super) result: Result<(), ConnectError>,
}

impl Driver {
    /// Rebuilds the ring from the gossip members whose node ID is proven
    /// (all of them without an [`IdentityCheck`]), and starts checks for
    /// the ones not yet proven.
    pub(super) fn rebuild(&mut self) {
        let Some(verify) = self.verify.clone() else {
            self.view.rebuild(self.foca.iter_members().map(|m| m.id()));
            return;
        };
        let now = Instant::now();
        let mut present = HashSet::new();
        let mut proven = Vec::new();
        for member in self.foca.iter_members().map(|m| m.id()) {
            if member.draining || member.id == self.me.id {
                // Not put on the ring whatever its identity.
                proven.push(member.clone());
                continue;
            }
            let key = (member.id.clone(), member.rpc);
            present.insert(key.clone());
            match self.identities.get(&key) {
                Some(Identity::Proven) => proven.push(member.clone()),
                Some(Identity::Checking) => {}
                Some(Identity::Refused { retry_at }) if *retry_at > now => {}
                _ => {
                    self.identities.insert(key, Identity::Checking);
                    let node = member.ring_member();
                    let check = (verify.0)(node.clone());
                    let verdicts = self.verdicts_tx.clone();
                    tokio::spawn(async move {
                        let result = check.await;
                        let _ = verdicts.send(Verdict { node, result });
                    });
                }
            }
        }
        // Forget identities gossip no longer mentions (bounded by the
        // member list); a check still running reports into nothing.
        self.identities.retain(|key, _| present.contains(key));
        self.view.rebuild(proven.iter());
    }

    /// Records the outcome of an identity check.
    pub(super) fn verdict(&mut self, Verdict { node, result }: Verdict) {
        let key = (node.id.clone(), node.rpc_addr);
        if !self.identities.contains_key(&key) {
            return; // gone from gossip meanwhile
        }
        match result {
            Ok(()) => {
                tracing::debug!(node = %node.id, rpc = %node.rpc_addr, "gossip member proved its node ID");
                self.identities.insert(key, Identity::Proven);
                self.rebuild();
            }
            Err(reason) => {
                self.counters
                    .identities_refused
                    .fetch_add(1, AtomicOrdering::Relaxed);
                tracing::warn!(node = %node.id, rpc = %node.rpc_addr, %reason,
                    "kept a gossip member off the ring: the node at its RPC address does not \
                     present the cluster certificate for its node ID");
                self.identities.insert(
                    key,
                    Identity::Refused {
                        retry_at: Instant::now() + IDENTITY_RETRY,
                    },
                );
            }
        }
    }
}
