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

use std::collections::{BTreeMap, HashMap, HashSet};
use std::io;
use std::net::SocketAddr;
use std::num::{NonZeroU8, NonZeroUsize};
use std::ops::ControlFlow;
use std::str::FromStr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering as AtomicOrdering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use foca::{AccumulatingRuntime, Foca, NoCustomBroadcast, OwnedNotification, PostcardCodec, Timer};
use futures::{FutureExt as _, StreamExt as _};
use rand::rngs::StdRng;
use serde::{Deserialize, Serialize};
use tokio::net::UdpSocket;
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinHandle;
use tokio::time::{Instant, sleep_until};
use tokio_util::time::DelayQueue;
use tokio_util::time::delay_queue::Expired;

use crate::ring::{
    Member, NodeId, Ring, RingConfig, RingError, SharedRing, rehomed_fraction, sample_keys,
};
use crate::transport::ConnectError;

/// Size of the synthetic key sample used to log re-homed fractions.
const REHOME_SAMPLE: usize = 10_000;

/// Largest weight accepted from gossip: a peer's typo must not blow up
/// everyone's ring (points grow with weight).
pub const MAX_GOSSIP_WEIGHT: u32 = 100;

/// Largest gossip datagram sent or accepted.
const MAX_PACKET: usize = 1400;

/// How soon a gossip member that failed its [`IdentityCheck`] is checked
/// again (it may only have been starting).
pub const IDENTITY_RETRY: Duration = Duration::from_secs(2);

/// How often DNS names among the seeds and static nodes are resolved again
/// unless [`MembershipConfig::resolve_every`] says otherwise.
pub const RESOLVE_EVERY: Duration = Duration::from_secs(10);

/// The longest one name's lookup may take before that round counts it as
/// not resolving (the system resolver can retry for much longer).
const LOOKUP_TIMEOUT: Duration = Duration::from_secs(5);

/// A peer's address as configured: an IP address and port, or a DNS name
/// and port (`hearth.default.svc.cluster.local:7001`) that membership
/// resolves at start and again every [`MembershipConfig::resolve_every`].
/// Written `ip:port`, `[ipv6]:port` or `name:port`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Deserialize)]
#[serde(try_from = "String")]
pub enum PeerAddr {
    /// An IP address and port, used as is.
    Ip(SocketAddr),
    /// A DNS name and port, resolved again and again.
    Name {
        /// The name, e.g. a headless Service's.
        host: String,
        /// The port on every address it resolves to.
        port: u16,
    },
}

/// Why a string is not a [`PeerAddr`].
#[derive(Debug, thiserror::Error)]
#[error(
    "{0:?} is not a peer address: write IP:PORT, [IPv6]:PORT or NAME:PORT \
     (e.g. \"hearth.default.svc.cluster.local:7001\")"
)]
pub struct PeerAddrError(String);

impl FromStr for PeerAddr {
    type Err = PeerAddrError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if let Ok(addr) = s.parse::<SocketAddr>() {
            return Ok(Self::Ip(addr));
        }
        let bad = || PeerAddrError(s.to_string());
        let (host, port) = s.rsplit_once(':').ok_or_else(bad)?;
        let port: u16 = port.parse().map_err(|_| bad())?;
        let label_ok = |l: &str| {
            !l.is_empty()
                && l.len() <= 63
                && l.chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_'))
        };
        let host = host.strip_suffix('.').unwrap_or(host);
        if host.len() > 253 || !host.split('.').all(label_ok) {
            return Err(bad());
        }
        Ok(Self::Name {
            host: host.to_string(),
            port,
        })
    }
}

impl TryFrom<String> for PeerAddr {
    type Error = PeerAddrError;

    fn try_from(s: String) -> Result<Self, Self::Error> {
        s.parse()
    }
}

impl From<SocketAddr> for PeerAddr {
    fn from(addr: SocketAddr) -> Self {
        Self::Ip(addr)
    }
}

impl std::fmt::Display for PeerAddr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Ip(addr) => write!(f, "{addr}"),
            Self::Name { host, port } => write!(f, "{host}:{port}"),
        }
    }
}

impl PeerAddr {
    /// Whether this is a name (and so worth resolving again).
    pub fn is_name(&self) -> bool {
        matches!(self, Self::Name { .. })
    }

    /// The addresses this stands for now, sorted: itself for an IP
    /// address, what the system resolver answers for a name (an error if
    /// it answers nothing within 5 s).
    pub async fn resolve(&self) -> io::Result<Vec<SocketAddr>> {
        let (host, port) = match self {
            Self::Ip(addr) => return Ok(vec![*addr]),
            Self::Name { host, port } => (host.as_str(), *port),
        };
        let found = tokio::time::timeout(LOOKUP_TIMEOUT, tokio::net::lookup_host((host, port)))
            .await
            .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "DNS lookup timed out"))??;
        let mut addrs: Vec<SocketAddr> = found.collect();
        addrs.sort();
        addrs.dedup();
        if addrs.is_empty() {
            return Err(io::Error::new(io::ErrorKind::NotFound, "no addresses"));
        }
        Ok(addrs)
    }
}

/// A static member as configured: its address may be a DNS name
/// ([`PeerAddr`]), e.g. a StatefulSet pod's stable name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StaticMember {
    /// Its node ID.
    pub id: NodeId,
    /// Where its shard server listens.
    pub addr: PeerAddr,
    /// Its weight on the ring.
    pub weight: u32,
}

impl From<Member> for StaticMember {
    fn from(m: Member) -> Self {
        Self {
            id: m.id,
            addr: PeerAddr::Ip(m.rpc_addr),
            weight: m.weight,
        }
    }
}

/// The names of a membership's seeds and static nodes, and what they
/// resolved to last.
struct Names {
    statics: Vec<StaticMember>,
    seeds: Vec<PeerAddr>,
    /// Names whose last lookup failed (each failure is logged once).
    failing: HashSet<PeerAddr>,
}

/// What the configured seeds and static nodes stand for at one moment.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Resolved {
    statics: Vec<Member>,
    seeds: Vec<SocketAddr>,
}

impl Names {
    fn any(&self) -> bool {
        self.seeds.iter().any(PeerAddr::is_name) || self.statics.iter().any(|s| s.addr.is_name())
    }

    /// Resolves every address once; a name that fails is left out.
    async fn resolve(&mut self) -> Resolved {
        let mut resolved = Resolved {
            statics: Vec::new(),
            seeds: Vec::new(),
        };
        for s in &self.statics {
            if let Some(addrs) = lookup(&mut self.failing, &s.addr).await {
                if addrs.len() > 1 {
                    tracing::debug!(node = %s.id, name = %s.addr, ?addrs,
                        "static node's name has several addresses; using the first");
                }
                resolved
                    .statics
                    .push(Member::new(s.id.clone(), addrs[0]).with_weight(s.weight));
            }
        }
        for seed in &self.seeds {
            if let Some(addrs) = lookup(&mut self.failing, seed).await {
                resolved.seeds.extend(addrs);
            }
        }
        resolved.seeds.sort();
        resolved.seeds.dedup();
        resolved
    }
}

/// `addr`'s addresses, or `None` (logged when it starts failing).
async fn lookup(failing: &mut HashSet<PeerAddr>, addr: &PeerAddr) -> Option<Vec<SocketAddr>> {
    match addr.resolve().await {
        Ok(addrs) => {
            if failing.remove(addr) {
                tracing::info!(name = %addr, ?addrs, "peer name resolves again");
            }
            Some(addrs)
        }
        Err(error) => {
            if failing.insert(addr.clone()) {
                tracing::warn!(name = %addr, %error,
                    "peer name does not resolve; left out until it does (retried every few seconds)");
            }
            None
        }
    }
}

/// Resolves `names` every `every` and sends each change to the membership
/// task, until that task stops.
async fn re_resolve(
    mut names: Names,
    mut last: Resolved,
    every: Duration,
    commands: mpsc::UnboundedSender<Command>,
) {
    loop {
        tokio::time::sleep(every).await;
        let now = names.resolve().await;
        if now != last {
            tracing::info!(seeds = ?now.seeds, statics = ?now.statics, "peer names resolve to new addresses");
            if commands.send(Command::Resolved(now.clone())).is_err() {
                return;
            }
            last = now;
        }
    }
}

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
    /// UDP address to bind and advertise to peers. Must be a specific IP
    /// (not 0.0.0.0); port 0 picks a free port (see
    /// [`Membership::gossip_addr`]).
    pub listen: SocketAddr,
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
    /// the module docs); `None` trusts what gossip says.
    pub verify: Option<IdentityCheck>,
}

/// Failure-detection and dissemination timing. Defaults suit a data center
/// LAN (and loopback); see the module docs for the detection bound they give.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FailureDetection {
    /// How often each node probes one peer (SWIM protocol period `P`).
    pub probe_period: Duration,
    /// How long a direct probe may take before indirect probes are sent.
    /// Must be less than `probe_period`.
    pub probe_rtt: Duration,
    /// How long a suspected node has to refute before it is declared down
    /// (`S`).
    pub suspect_to_down: Duration,
    /// How often pending updates are gossiped to a few random peers (`G`).
    pub gossip_interval: Duration,
    /// How often to re-announce to the seeds while no peer is known, and a
    /// tenth as often to random peers afterwards (roster catch-up).
    pub announce_interval: Duration,
    /// The longest [`Membership::drain`] waits for the draining state to be
    /// gossiped before returning.
    pub drain_timeout: Duration,
}

impl Default for FailureDetection {
    fn default() -> Self {
        Self {
            probe_period: Duration::from_millis(500),
            probe_rtt: Duration::from_millis(200),
            suspect_to_down: Duration::from_millis(1500),
            gossip_interval: Duration::from_millis(100),
            announce_interval: Duration::from_millis(500),
            drain_timeout: Duration::from_secs(2),
        }
    }
}

impl FailureDetection {
    /// The documented bound on how long a node that dies abruptly stays on a
    /// survivor's ring, in a cluster of `cluster_size` nodes:
    /// `2(N − 1)·P + S + G`.
    pub fn detection_bound(&self, cluster_size: usize) -> Duration {
        let peers = cluster_size.saturating_sub(1).max(1) as u32;
        self.probe_period * (2 * peers) + self.suspect_to_down + self.gossip_interval
    }

    fn validate(&self) -> Result<(), MembershipError> {
        let nonzero = [
            ("probe_period", self.probe_period),
            ("probe_rtt", self.probe_rtt),
            ("suspect_to_down", self.suspect_to_down),
            ("gossip_interval", self.gossip_interval),
            ("announce_interval", self.announce_interval),
        ];
        if let Some((name, _)) = nonzero.iter().find(|(_, d)| d.is_zero()) {
            return Err(MembershipError::InvalidTiming(format!(
                "{name} must not be zero"
            )));
        }
        if self.probe_rtt >= self.probe_period {
            return Err(MembershipError::InvalidTiming(
                "probe_rtt must be less than probe_period".into(),
            ));
        }
        Ok(())
    }

    fn foca_config(&self) -> foca::Config {
        let three = NonZeroUsize::MIN.saturating_add(2);
        let mut config = foca::Config::simple();
        config.probe_period = self.probe_period;
        config.probe_rtt = self.probe_rtt;
        config.suspect_to_down_after = self.suspect_to_down;
        config.num_indirect_probes = three;
        config.max_transmissions = NonZeroU8::MIN.saturating_add(9);
        // Room for the MAC within one MAX_PACKET datagram.
        config.max_packet_size = NonZeroUsize::MIN.saturating_add(MAX_PACKET - blake3::OUT_LEN - 1);
        // A node wrongly declared down hears so and rejoins (with a renewed
        // identity) instead of staying cut off.
        config.notify_down_members = true;
        config.periodic_gossip = Some(foca::PeriodicParams {
            frequency: self.gossip_interval,
            num_members: three,
        });
        config.periodic_announce = Some(foca::PeriodicParams {
            frequency: self.announce_interval * 10,
            num_members: NonZeroUsize::MIN,
        });
        config.periodic_announce_to_down_members = Some(foca::PeriodicParams {
            frequency: self.announce_interval * 10,
            num_members: NonZeroUsize::MIN.saturating_add(1),
        });
        config
    }
}

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

/// How often at most a node logs that it drops gossip it cannot
/// authenticate (every drop is counted).
pub const UNAUTHENTICATED_WARN_EVERY: Duration = Duration::from_secs(10);

/// Gossip counters of a running node; cheap to clone, readable from any
/// thread (the node's `/metrics` reads them).
#[derive(Debug, Clone, Default)]
pub struct GossipCounters {
    unauthenticated: Arc<AtomicU64>,
    identities_refused: Arc<AtomicU64>,
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

/// The live set and the ring derived from it.
struct View {
    me: Member,
    statics: Vec<Member>,
    draining: bool,
    config: RingConfig,
    shared: SharedRing,
    updates: watch::Sender<Arc<Ring>>,
    sample: Vec<String>,
}

impl View {
    /// Replaces the static members (their names resolved anew), leaving out
    /// this node.
    fn set_statics(&mut self, statics: Vec<Member>) {
        self.statics = statics.into_iter().filter(|n| n.id != self.me.id).collect();
    }

    /// Recomputes the live set from the gossip members (those allowed on the
    /// ring) and, if it changed, builds, publishes and logs the new ring.
    fn rebuild<'a>(&self, gossip_members: impl Iterator<Item = &'a GossipIdentity>) {
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

async fn run_static(mut view: View, mut commands: mpsc::UnboundedReceiver<Command>) {
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

/// A gossip identity: who a member is, how to reach it, and its state.
/// Foca treats identities with the same gossip address as one member and
/// keeps the one with the higher [`GossipIdentity::precedence`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
struct GossipIdentity {
    gossip: SocketAddr,
    generation: u64,
    draining: bool,
    id: NodeId,
    rpc: SocketAddr,
    weight: u32,
}

impl GossipIdentity {
    /// Newer generation wins; within one, draining wins; the rest only makes
    /// the order total so every node picks the same.
    fn precedence(&self) -> (u64, bool, &NodeId, SocketAddr, u32, SocketAddr) {
        (
            self.generation,
            self.draining,
            &self.id,
            self.rpc,
            self.weight,
            self.gossip,
        )
    }

    fn ring_member(&self) -> Member {
        Member {
            id: self.id.clone(),
            rpc_addr: self.rpc,
            weight: self.weight,
        }
    }

    /// Stand-in identity for a seed we have not met: foca accepts an
    /// announce addressed to any identity with its gossip address.
    fn seed(gossip: SocketAddr) -> Self {
        Self {
            gossip,
            generation: 0,
            draining: false,
            id: NodeId::new(""),
            rpc: gossip,
            weight: 0,
        }
    }
}

impl foca::Identity for GossipIdentity {
    type Addr = SocketAddr;

    fn renew(&self) -> Option<Self> {
        Some(Self {
            generation: self.generation.wrapping_add(1),
            ..self.clone()
        })
    }

    fn addr(&self) -> SocketAddr {
        self.gossip
    }

    fn win_addr_conflict(&self, adversary: &Self) -> bool {
        self.precedence() > adversary.precedence()
    }
}

/// A timer foca asked for, numbered in submission order: timers due at the
/// same instant are handed to foca in the order it asked for them.
struct Due {
    seq: u64,
    timer: Timer<GossipIdentity>,
}

type Swim = Foca<GossipIdentity, PostcardCodec, StdRng, NoCustomBroadcast>;

/// Drives foca: one task owns the SWIM state machine, the socket and the
/// timers, so events are handled strictly one at a time and in order.
///
/// [`Driver::run`] waits for the next [`Event`] and hands it to its handler:
/// a command from the handle ([`Driver::on_command`]), an identity check's
/// verdict ([`Driver::verdict`]), a datagram ([`Driver::on_datagram`]),
/// foca's due timers ([`Driver::on_timers`]), the announce tick
/// ([`Driver::on_announce`]) or the drain deadline. After each, what foca
/// asked for is carried out ([`Driver::flush`]).
struct Driver {
    view: View,
    me: GossipIdentity,
    foca: Swim,
    out: AccumulatingRuntime<GossipIdentity>,
    socket: UdpSocket,
    /// foca's timers, by due time.
    timers: DelayQueue<Due>,
    seq: u64,
    /// A drain waiting for the draining state to be gossiped out, and its
    /// deadline.
    pending_drain: Option<(oneshot::Sender<()>, Instant)>,
    seeds: Vec<SocketAddr>,
    timing: FailureDetection,
    /// Set once we said goodbye: our own "down" is expected from then on.
    leaving: bool,
    key: Option<[u8; 32]>,
    counters: GossipCounters,
    /// When the last "cannot authenticate" warning was logged, and the
    /// drops since.
    last_warning: Option<Instant>,
    unwarned: u64,
    /// Proves members' node IDs; `None` trusts gossip.
    verify: Option<IdentityCheck>,
    /// What is known of each gossiped (node ID, RPC address).
    identities: HashMap<(NodeId, SocketAddr), Identity>,
    verdicts_tx: mpsc::UnboundedSender<Verdict>,
    verdicts: mpsc::UnboundedReceiver<Verdict>,
}

/// Where a gossiped identity stands with the [`IdentityCheck`].
enum Identity {
    Checking,
    Proven,
    Refused { retry_at: Instant },
}

/// The result of one identity check.
struct Verdict {
    node: Member,
    result: Result<(), ConnectError>,
}

enum Event {
    Command(Option<Command>),
    Verdict(Option<Verdict>),
    Datagram(io::Result<(usize, SocketAddr)>),
    Timer(Expired<Due>),
    Announce,
    DrainDeadline,
}

impl Driver {
    /// Binds the gossip socket; `seeds` are the configured seeds resolved.
    async fn bind(
        view: View,
        gossip: GossipConfig,
        seeds: Vec<SocketAddr>,
        counters: GossipCounters,
    ) -> Result<Self, MembershipError> {
        let GossipConfig {
            listen,
            seeds: _,
            timing,
            key,
            verify,
        } = gossip;
        timing.validate()?;
        if view.me.weight > MAX_GOSSIP_WEIGHT {
            return Err(MembershipError::WeightTooLarge {
                weight: view.me.weight,
                max: MAX_GOSSIP_WEIGHT,
            });
        }
        if listen.ip().is_unspecified() {
            return Err(MembershipError::UnspecifiedGossipAddr(listen));
        }
        let bind_error = |source| MembershipError::Bind {
            addr: listen,
            source,
        };
        let socket = UdpSocket::bind(listen).await.map_err(bind_error)?;
        let gossip_addr = socket.local_addr().map_err(bind_error)?;
        let generation = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        let me = GossipIdentity {
            gossip: gossip_addr,
            generation,
            draining: false,
            id: view.me.id.clone(),
            rpc: view.me.rpc_addr,
            weight: view.me.weight,
        };
        let rng: StdRng = rand::make_rng();
        let foca = Foca::new(me.clone(), timing.foca_config(), rng, PostcardCodec);
        let seeds = seeds.into_iter().filter(|s| *s != gossip_addr).collect();
        let (verdicts_tx, verdicts) = mpsc::unbounded_channel();
        Ok(Self {
            view,
            me,
            foca,
            out: AccumulatingRuntime::new(),
            socket,
            timers: DelayQueue::new(),
            seq: 0,
            pending_drain: None,
            seeds,
            timing,
            leaving: false,
            key,
            counters,
            last_warning: None,
            unwarned: 0,
            verify,
            identities: HashMap::new(),
            verdicts_tx,
            verdicts,
        })
    }

    async fn run(mut self, mut commands: mpsc::UnboundedReceiver<Command>) {
        let mut buf = vec![0u8; MAX_PACKET];
        let mut announce = tokio::time::interval(self.timing.announce_interval);
        announce.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let drain_deadline = self.pending_drain.as_ref().map_or_else(far_future, |p| p.1);
            let event = tokio::select! {
                command = commands.recv() => Event::Command(command),
                verdict = self.verdicts.recv() => Event::Verdict(verdict),
                received = self.socket.recv_from(&mut buf) => {
                    Event::Datagram(received)
                }
                // Disabled while no timer is set (the queue yields `None`).
                Some(due) = self.timers.next() => Event::Timer(due),
                _ = announce.tick() => Event::Announce,
                _ = sleep_until(drain_deadline) => Event::DrainDeadline,
            };
            match event {
                Event::Command(None) => return,
                Event::Command(Some(command)) => {
                    if self.on_command(command).await.is_break() {
                        return;
                    }
                }
                // The sender half lives in `self`: never closed.
                Event::Verdict(None) => {}
                Event::Verdict(Some(verdict)) => self.verdict(verdict),
                Event::Datagram(received) => self.on_datagram(received, &buf).await,
                Event::Timer(first) => self.on_timers(first),
                Event::Announce => self.on_announce(),
                Event::DrainDeadline => {
                    if let Some((drained, _)) = self.pending_drain.take() {
                        tracing::warn!(node = %self.me.id, "drain: gossip not fully sent before the timeout");
                        let _ = drained.send(());
                    }
                }
            }
            self.flush().await;
            // Drained once the draining state has been gossiped out (or
            // there is nobody to tell).
            let announced = self.foca.updates_backlog() == 0 || self.foca.num_members() == 0;
            if announced && let Some((drained, _)) = self.pending_drain.take() {
                let _ = drained.send(());
            }
        }
    }

    /// A command from the [`Membership`] handle: shut down (say goodbye,
    /// then stop) or drain (leave the ring, answer once that is gossiped).
    /// `Break` stops the driver.
    async fn on_command(&mut self, command: Command) -> ControlFlow<()> {
        match command {
            Command::Shutdown(reply) => {
                self.leaving = true;
                if self.foca.num_members() > 0 {
                    let left = self.foca.leave_cluster(&mut self.out);
                    log_foca("leave", left);
                    self.flush().await;
                }
                if let Some((drained, _)) = self.pending_drain.take() {
                    let _ = drained.send(());
                }
                let _ = reply.send(());
                ControlFlow::Break(())
            }
            Command::Drain(reply) => {
                if self.me.draining {
                    let _ = reply.send(());
                } else {
                    tracing::info!(node = %self.me.id, "draining: leaving the ring");
                    self.me.draining = true;
                    self.view.draining = true;
                    let changed = self.foca.change_identity(self.me.clone(), &mut self.out);
                    log_foca("drain", changed);
                    self.rebuild();
                    let deadline = Instant::now() + self.timing.drain_timeout;
                    self.pending_drain = Some((reply, deadline));
                }
                ControlFlow::Continue(())
            }
            Command::Resolved(resolved) => {
                let own = self.me.gossip;
                self.seeds = resolved.seeds.into_iter().filter(|s| *s != own).collect();
                self.view.set_statics(resolved.statics);
                self.rebuild();
                ControlFlow::Continue(())
            }
        }
    }

    /// A datagram (or a receive error): authenticated gossip goes to foca,
    /// the rest is counted.
    async fn on_datagram(&mut self, received: io::Result<(usize, SocketAddr)>, buf: &[u8]) {
        match received {
            Ok((len, from)) => match open(self.key.as_ref(), &buf[..len]) {
                Some(payload) => {
                    let handled = self.foca.handle_data(payload, &mut self.out);
                    log_foca("datagram", handled);
                }
                None => self.unauthenticated(from),
            },
            Err(error) => {
                // ICMP errors from peers that went away surface here on
                // some platforms; they are not ours to handle.
                tracing::debug!(%error, "gossip receive error");
                if !matches!(
                    error.kind(),
                    io::ErrorKind::ConnectionRefused | io::ErrorKind::ConnectionReset
                ) {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            }
        }
    }

    /// `first` and every other timer already due, handed to foca in due
    /// order, and in the order foca set them when due together.
    fn on_timers(&mut self, first: Expired<Due>) {
        let mut due = vec![first];
        while let Some(Some(more)) = self.timers.next().now_or_never() {
            due.push(more);
        }
        due.sort_by_key(|e| (e.deadline(), e.get_ref().seq));
        for expired in due {
            let handled = self
                .foca
                .handle_timer(expired.into_inner().timer, &mut self.out);
            log_foca("timer", handled);
        }
    }

    /// The announce tick: retry refused identities that are due, and
    /// announce to the seeds while no peer is known.
    fn on_announce(&mut self) {
        let now = Instant::now();
        if self
            .identities
            .values()
            .any(|i| matches!(i, Identity::Refused { retry_at } if *retry_at <= now))
        {
            self.rebuild();
        }
        if self.foca.num_members() == 0 {
            for seed in &self.seeds {
                let sent = self
                    .foca
                    .announce(GossipIdentity::seed(*seed), &mut self.out);
                log_foca("announce", sent);
            }
        }
    }

    /// Counts a datagram that failed authentication and warns, at most once
    /// per [`UNAUTHENTICATED_WARN_EVERY`].
    fn unauthenticated(&mut self, from: SocketAddr) {
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

    /// Carries out what foca asked for: datagrams, timers, and — when the
    /// membership changed — a ring rebuild.
    async fn flush(&mut self) {
        while let Some((to, data)) = self.out.to_send() {
            let datagram = seal(self.key.as_ref(), data.to_vec());
            if let Err(error) = self.socket.send_to(&datagram, to.gossip).await {
                tracing::debug!(%error, to = %to.gossip, "gossip send error");
            }
        }
        let now = Instant::now();
        while let Some((after, timer)) = self.out.to_schedule() {
            self.seq += 1;
            self.timers.insert_at(
                Due {
                    seq: self.seq,
                    timer,
                },
                now + after,
            );
        }
        let mut changed = false;
        while let Some(notification) = self.out.to_notify() {
            match notification {
                OwnedNotification::MemberUp(_)
                | OwnedNotification::MemberDown(_)
                | OwnedNotification::Rename(..) => changed = true,
                OwnedNotification::Rejoin(me) => {
                    tracing::warn!(node = %me.id, generation = me.generation,
                        "declared down by the cluster; rejoined with a renewed identity");
                    self.me = me;
                }
                OwnedNotification::Defunct if !self.leaving => {
                    tracing::error!(node = %self.me.id, "declared down by the cluster");
                }
                OwnedNotification::Idle => {
                    tracing::info!(node = %self.me.id, "no live peers");
                }
                _ => {}
            }
        }
        if changed {
            self.rebuild();
        }
    }

    /// Rebuilds the ring from the gossip members whose node ID is proven
    /// (all of them without an [`IdentityCheck`]), and starts checks for
    /// the ones not yet proven.
    fn rebuild(&mut self) {
        let Some(verify) = self.verify.clone() else {
            self.view.rebuild(self.foca.iter_members().map(|m| m.id()));
            return;
        };
        let now = Instant::now();
        let mut present = std::collections::HashSet::new();
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
    fn verdict(&mut self, Verdict { node, result }: Verdict) {
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

/// Appends the MAC (when keyed) to an outgoing datagram.
fn seal(key: Option<&[u8; 32]>, mut datagram: Vec<u8>) -> Vec<u8> {
    if let Some(key) = key {
        let tag = blake3::keyed_hash(key, &datagram);
        datagram.extend_from_slice(tag.as_bytes());
    }
    datagram
}

/// The payload of an incoming datagram if its MAC checks out (or if
/// unkeyed); the comparison is constant-time.
fn open<'a>(key: Option<&[u8; 32]>, datagram: &'a [u8]) -> Option<&'a [u8]> {
    let Some(key) = key else {
        return Some(datagram);
    };
    let split = datagram.len().checked_sub(blake3::OUT_LEN)?;
    let (payload, tag) = datagram.split_at(split);
    let tag: [u8; blake3::OUT_LEN] = tag.try_into().ok()?;
    (blake3::keyed_hash(key, payload) == blake3::Hash::from(tag)).then_some(payload)
}

fn far_future() -> Instant {
    Instant::now() + Duration::from_secs(3600)
}

fn log_foca(what: &str, result: Result<(), foca::Error>) {
    if let Err(error) = result {
        tracing::debug!(%error, "foca {what}");
    }
}
