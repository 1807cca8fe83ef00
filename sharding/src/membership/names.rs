//! Peer addresses that may be DNS names, and the loop that resolves them.
//!
//! A static node's address and a gossip seed are [`PeerAddr`]s: an IP
//! address and port, or a name and port. [`Names`] holds the configured
//! ones and resolves them all at once into a [`Resolved`] (a seed name
//! stands for every address it resolves to, a static node takes the
//! first; a name that fails is left out and logged once until it resolves
//! again). [`re_resolve`] repeats that every
//! [`MembershipConfig::resolve_every`](super::MembershipConfig::resolve_every)
//! and sends each change to the task that keeps the ring, so a headless
//! Service whose pods come and go with new IPs keeps working as the seed
//! list.

use std::collections::HashSet;
use std::io;
use std::net::SocketAddr;
use std::str::FromStr;
use std::time::Duration;

use serde::Deserialize;
use tokio::sync::mpsc;

use super::Command;
use crate::ring::{Member, NodeId};

/// How often DNS names among the seeds and static nodes are resolved again
/// unless [`MembershipConfig::resolve_every`](super::MembershipConfig::resolve_every)
/// says otherwise.
pub const RESOLVE_EVERY: Duration = Duration::from_secs(10);

/// The longest one name's lookup may take before that round counts it as
/// not resolving (the system resolver can retry for much longer).
const LOOKUP_TIMEOUT: Duration = Duration::from_secs(5);

/// A peer's address as configured: an IP address and port, or a DNS name
/// and port (`hearth.default.svc.cluster.local:7001`) that membership
/// resolves at start and again every
/// [`MembershipConfig::resolve_every`](super::MembershipConfig::resolve_every).
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
pub(super) struct Names {
    pub(super) statics: Vec<StaticMember>,
    pub(super) seeds: Vec<PeerAddr>,
    /// Names whose last lookup failed (each failure is logged once).
    pub(super) failing: HashSet<PeerAddr>,
}

/// What the configured seeds and static nodes stand for at one moment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Resolved {
    pub(super) statics: Vec<Member>,
    pub(super) seeds: Vec<SocketAddr>,
}

impl Names {
    pub(super) fn any(&self) -> bool {
        self.seeds.iter().any(PeerAddr::is_name) || self.statics.iter().any(|s| s.addr.is_name())
    }

    /// Resolves every address once; a name that fails is left out.
    pub(super) async fn resolve(&mut self) -> Resolved {
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
pub(super) async fn re_resolve(
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
