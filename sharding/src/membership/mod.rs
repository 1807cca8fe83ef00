//! Cluster membership: the live nodes of one data center, and the ring built
//! from them.
//!
//! # Model
//!
//! Each node runs one [`Membership`]. It knows the *live set*: this node
//! (until it drains), the nodes listed statically in config, and the nodes
//! discovered and health-checked by gossip. Every change to the live set
//! builds a new [`Ring`], publishes it through the [`SharedRing`] returned by
//! [`Membership::ring`] (readers never wait) and on the
//! [`Membership::subscribe`] channel, and logs the change with the fraction
//! of a fixed sample of 10,000 synthetic script IDs it re-homed.
//!
//! - **Static nodes** (`MembershipConfig::static_nodes`) are pinned: always
//!   on the ring, never failure-checked. With `gossip: None` they are the
//!   whole cluster (development, tests, or a cluster managed by config).
//! - **Names**: a static node's address and a gossip seed may be a DNS name
//!   with a port ([`PeerAddr`]) instead of an IP address. Names are resolved
//!   when membership starts and again every
//!   [`MembershipConfig::resolve_every`] ([`RESOLVE_EVERY`] by default), so
//!   a Kubernetes headless Service (one name, one address per pod, pods
//!   coming and going with new IPs) works as the seed list: a seed name
//!   stands for every address it resolves to, a static node takes the first.
//!   A name that does not resolve (yet) leaves its node off the ring, or its
//!   seeds out, until it does; each failure is logged once until it resolves.
//! - **Gossip members** carry their node ID, RPC address, weight, a
//!   *generation* (start time in ms) and a *draining* flag inside their gossip
//!   identity, so the live set needs no second round of lookups. A restarted
//!   node (same ID, same gossip address) has a newer generation and replaces
//!   its previous incarnation everywhere (this assumes the wall clock did not
//!   step back across the restart).
//! - **Drain** ([`Membership::drain`]) gossips a draining identity: every
//!   node, this one included, takes it off its ring at once, so it stops being
//!   anyone's home while it finishes in-flight requests. Then
//!   [`Membership::shutdown`] says goodbye (SWIM "leave") and stops. Dropping
//!   a `Membership` without `shutdown` stops it silently, like a crash.
//!
//! # Gossip: foca (SWIM) rather than chitchat
//!
//! We use [`foca`] 2, a small, runtime-agnostic SWIM implementation (with
//! suspicion and piggybacked dissemination), driven here by one tokio task
//! over a UDP socket. SWIM's detection time is a function of configured
//! constants, so the bound below is a formula we can state and test, whereas
//! chitchat's phi-accrual detector derives its timeout from the heartbeat
//! intervals it happens to observe. Foca's custom identities carry our three
//! fields of node state and give drain (identity change), restart (newest
//! generation wins) and goodbye (leave) directly; it adds only itself to the
//! build, where chitchat 0.13 brings a zstd C build and a key-value state
//! protocol we would use three keys of.
//!
//! # Failure-detection bound
//!
//! With probe period `P`, suspicion timeout `S` and gossip interval `G`
//! ([`FailureDetection`]), every node probes its `N − 1` peers round-robin
//! in a freshly shuffled order, so a peer that dies is probed by *each*
//! survivor within `(2(N − 1) − 1)·P`, is suspected when that probe (and its
//! indirect probes) go unanswered one period later, and is declared down `S`
//! after that; gossip from whichever survivor noticed first usually makes it
//! faster. Hence, per survivor and without help from gossip:
//!
//! > abruptly killed node dropped from the ring within
//! > `2(N − 1)·P + S + G` ([`FailureDetection::detection_bound`]).
//!
//! With the defaults (`P` = 500 ms, `S` = 1.5 s, `G` = 100 ms) that is
//! **3.6 s for a 3-node cluster**, which `tests/membership.rs` checks on
//! loopback. In large clusters the expected time stays around `P + S` plus
//! a few gossip rounds, because some survivor probes the dead node in almost
//! every period; the per-survivor worst case above grows with `N`.
//! A drained node leaves the other rings within one gossip exchange
//! (typically well under `G` + a round trip), and a restarted node is back
//! after its first announce round trip.
//!
//! # Authentication
//!
//! With [`GossipConfig::key`] set, every datagram carries a keyed blake3 MAC
//! and anything else is dropped: an outsider can neither join nor forge a
//! member's state. Dropped datagrams are counted
//! ([`Membership::gossip_counters`]) and logged as warnings (at most one
//! line per [`UNAUTHENTICATED_WARN_EVERY`]), because the usual sender is not
//! an attacker but a member configured with another key, and a node that
//! cannot hear its peers silently serves everything alone. There is no replay protection beyond SWIM's own
//! incarnation ordering, so keep the gossip port on the data center's
//! private network as well.
//!
//! # Identity: a ring slot needs the node's certificate
//!
//! The gossip key says "a member of this cluster", not "node `b`": a holder
//! of the key could gossip node `b`'s ID with its own RPC address and take
//! `b`'s ring slot. With [`GossipConfig::verify`] set (what `hearth serve`
//! does), a gossip member enters the ring only after an [`IdentityCheck`]
//! proved that whoever listens at its RPC address holds the cluster
//! certificate for its node ID (a TLS handshake, see `crate::tls`). Until
//! then it stays off the ring; a member that fails is warned about and
//! checked again every [`IDENTITY_RETRY`] while it keeps gossiping.
//!
//! # Layout
//!
//! This file holds the [`Membership`] handle and its errors; each concept
//! above has a file of its own, and its items are re-exported here:
//!
//! - `config`: [`MembershipConfig`] and [`GossipConfig`], what a node
//!   starts membership with.
//! - `names`: [`PeerAddr`] and [`StaticMember`], and the loop that resolves
//!   configured names again and again.
//! - `view`: the live set and the ring built from it, and the task that
//!   keeps a static cluster's ring (no gossip).
//! - `gossip`: the foca driver, one task owning the SWIM state machine, the
//!   socket and the timers, and the gossip identity it spreads.
//! - `timing`: [`FailureDetection`], the knobs of the bound above.
//! - `auth`: the datagram MAC and [`GossipCounters`].
//! - `identity`: [`IdentityCheck`], and how the driver admits a gossip
//!   member to the ring only once its node ID is proven.

mod auth;
mod config;
mod gossip;
mod identity;
mod names;
mod timing;
mod view;

use std::collections::HashSet;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;

use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinHandle;

use crate::ring::{NodeId, Ring, RingError, SharedRing, sample_keys};

pub use auth::{GossipCounters, UNAUTHENTICATED_WARN_EVERY};
pub use config::{GossipConfig, MembershipConfig};
pub use gossip::MAX_GOSSIP_WEIGHT;
pub use identity::{IDENTITY_RETRY, IdentityCheck};
pub use names::{PeerAddr, PeerAddrError, RESOLVE_EVERY, StaticMember};
pub use timing::FailureDetection;

use gossip::Driver;
use names::{Names, Resolved, re_resolve};
use view::{REHOME_SAMPLE, View, run_static};

/// Why membership could not start or act.
#[derive(Debug, thiserror::Error)]
pub enum MembershipError {
    /// The gossip socket could not be bound.
    #[error("cannot bind gossip socket {addr}: {source}")]
    Bind {
        /// The address asked for.
        addr: SocketAddr,
        /// The OS error.
        source: io::Error,
    },
    /// The gossip address is `0.0.0.0` or `[::]`: peers could not reach it.
    #[error("gossip address {0} is unspecified; give the IP peers should use")]
    UnspecifiedGossipAddr(SocketAddr),
    /// The advertised gossip address is unspecified (`0.0.0.0`) or has
    /// port 0: peers could not reach it.
    #[error("advertised gossip address {0} must name a specific IP and port")]
    InvalidAdvertiseAddr(SocketAddr),
    /// This node's weight is above [`MAX_GOSSIP_WEIGHT`], so peers would
    /// ignore it while it counted itself: rings would disagree.
    #[error("weight {weight} is above the gossip limit of {max}")]
    WeightTooLarge {
        /// The configured weight.
        weight: u32,
        /// [`MAX_GOSSIP_WEIGHT`].
        max: u32,
    },
    /// A timing knob is out of range.
    #[error("invalid failure-detection timing: {0}")]
    InvalidTiming(String),
    /// The initial ring (this node plus the static nodes) is invalid.
    #[error("invalid membership: {0}")]
    Ring(#[from] RingError),
    /// The membership task has stopped (after `shutdown`, or it panicked).
    #[error("membership task has stopped")]
    Stopped,
}

/// A running node's view of the cluster. See the module docs.
pub struct Membership {
    self_id: NodeId,
    gossip_addr: Option<SocketAddr>,
    counters: GossipCounters,
    ring: SharedRing,
    updates: watch::Receiver<Arc<Ring>>,
    commands: mpsc::UnboundedSender<Command>,
    task: Option<JoinHandle<()>>,
    /// Resolves the configured names again and again, if there are any.
    resolver: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for Membership {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Membership")
            .field("self_id", &self.self_id)
            .field("gossip_addr", &self.gossip_addr)
            .field("members", &self.ring.load().len())
            .finish()
    }
}

/// What the [`Membership`] handle asks of the task that keeps the ring
/// (the gossip driver, or `run_static` without gossip).
enum Command {
    Drain(oneshot::Sender<()>),
    Shutdown(oneshot::Sender<()>),
    /// The seeds' and static nodes' names resolve to new addresses.
    Resolved(Resolved),
}

impl Membership {
    /// Starts membership on the current tokio runtime: builds the initial
    /// ring (this node and the static nodes), binds the gossip socket if
    /// gossip is configured, and spawns the task that keeps the ring current.
    pub async fn start(config: MembershipConfig) -> Result<Self, MembershipError> {
        let MembershipConfig {
            node,
            static_nodes,
            mut gossip,
            ring: ring_config,
            resolve_every,
        } = config;
        let mut names = Names {
            statics: static_nodes
                .into_iter()
                .filter(|n| n.id != node.id)
                .collect(),
            seeds: gossip
                .as_mut()
                .map(|g| std::mem::take(&mut g.seeds))
                .unwrap_or_default(),
            failing: HashSet::new(),
        };
        let resolved = names.resolve().await;
        let statics = resolved.statics.clone();
        let initial = Arc::new(Ring::new(
            statics.iter().cloned().chain([node.clone()]),
            ring_config,
        )?);
        let shared = SharedRing::new(initial.clone());
        let (updates_tx, updates) = watch::channel(initial);
        let (commands, command_rx) = mpsc::unbounded_channel();
        let self_id = node.id.clone();
        let view = View {
            me: node,
            statics,
            draining: false,
            config: ring_config,
            shared: shared.clone(),
            updates: updates_tx,
            sample: sample_keys(REHOME_SAMPLE).collect(),
        };

        let counters = GossipCounters::default();
        let (gossip_addr, task) = match gossip {
            None => (None, tokio::spawn(run_static(view, command_rx))),
            Some(gossip) => {
                let driver =
                    Driver::bind(view, gossip, resolved.seeds.clone(), counters.clone()).await?;
                (Some(driver.me.gossip), tokio::spawn(driver.run(command_rx)))
            }
        };
        let resolver = names
            .any()
            .then(|| tokio::spawn(re_resolve(names, resolved, resolve_every, commands.clone())));
        Ok(Self {
            self_id,
            gossip_addr,
            counters,
            ring: shared,
            updates,
            commands,
            task: Some(task),
            resolver,
        })
    }

    /// The current ring, always up to date; readers never wait on writers.
    pub fn ring(&self) -> &SharedRing {
        &self.ring
    }

    /// A channel that holds the current ring and is updated on every change.
    pub fn subscribe(&self) -> watch::Receiver<Arc<Ring>> {
        self.updates.clone()
    }

    /// This node's ID.
    pub fn self_id(&self) -> &NodeId {
        &self.self_id
    }

    /// The gossip address peers use for this node (with the real port if the
    /// config asked for port 0); `None` without gossip.
    pub fn gossip_addr(&self) -> Option<SocketAddr> {
        self.gossip_addr
    }

    /// This node's gossip counters (all zero without gossip).
    pub fn gossip_counters(&self) -> GossipCounters {
        self.counters.clone()
    }

    /// Announces that this node is leaving: it is taken off its own ring at
    /// once and off every other node's as soon as they hear the gossiped
    /// draining state. Returns when that state has been sent out (or after
    /// `drain_timeout`); the caller then finishes in-flight requests and
    /// calls [`shutdown`](Self::shutdown). Idempotent.
    pub async fn drain(&self) -> Result<(), MembershipError> {
        let (reply, done) = oneshot::channel();
        self.commands
            .send(Command::Drain(reply))
            .map_err(|_| MembershipError::Stopped)?;
        done.await.map_err(|_| MembershipError::Stopped)
    }

    /// Leaves the cluster (peers are told, so they drop this node without
    /// waiting for failure detection) and stops the membership task.
    pub async fn shutdown(mut self) -> Result<(), MembershipError> {
        if let Some(resolver) = self.resolver.take() {
            resolver.abort();
        }
        let (reply, done) = oneshot::channel();
        self.commands
            .send(Command::Shutdown(reply))
            .map_err(|_| MembershipError::Stopped)?;
        let said_goodbye = done.await;
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
        said_goodbye.map_err(|_| MembershipError::Stopped)
    }
}

impl Drop for Membership {
    /// Stops gossip without a goodbye: peers detect it as a failure.
    fn drop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
        if let Some(resolver) = self.resolver.take() {
            resolver.abort();
        }
    }
}
