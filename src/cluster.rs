//! Joining a cluster: a node's shard server (mTLS Cap'n Proto RPC) and
//! membership (the ring, by gossip, a static list, or both) started around
//! an existing [`Node`], which then routes through the ring. `hearth serve`
//! joins this way, and so does every node of a [`LoopbackCluster`] (N real
//! nodes in one process, in `src/loopback_cluster.rs`, re-exported here).
//! Both raise the open-files limit first ([`log_fd_limit`]).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use tokio::net::TcpListener;

use hearth_runtime::{ConfigError, StoreError};
use hearth_sharding::admission::OverloadConfig;
use hearth_sharding::membership::{
    Membership, MembershipConfig, MembershipError, PeerAddr, StaticMember,
};
use hearth_sharding::ring::{Member, NodeId};
use hearth_sharding::rpc::{RpcConfig, RpcError, RpcNode, ServerHandle};
use hearth_sharding::tls::{NodeTls, TlsError};

use crate::config::NodeConfigError;
use crate::https::HttpsError;
use crate::node::{ClusterLink, Node};

pub use crate::loopback_cluster::{ClusterConfig, ClusterNode, LoopbackCluster};

/// Why a node could not join its cluster, or a [`LoopbackCluster`] could
/// not start. Each variant names the step that failed and keeps its cause.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ClusterError {
    /// A loopback cluster was asked for zero nodes.
    #[error("a cluster needs at least one node")]
    NoNodes,
    /// The listeners' limits cannot work together.
    #[error(transparent)]
    Limits(#[from] crate::listener::ServeLimitsError),
    /// The node's cluster certificate is missing, unreadable or not its own.
    #[error("loading the cluster certificate of {node_id} from {}", pki_dir.display())]
    NodeCertificate {
        /// The node whose certificate was loaded.
        node_id: String,
        /// Where it was looked for.
        pki_dir: PathBuf,
        /// What was wrong with it.
        #[source]
        source: TlsError,
    },
    /// The development PKI could not be written.
    #[error(transparent)]
    Pki(#[from] TlsError),
    /// A listening socket could not be opened.
    #[error("cannot listen on {addr}")]
    Listen {
        /// The address asked for.
        addr: String,
        /// Why not.
        #[source]
        source: std::io::Error,
    },
    /// The store directory, or a socket's address, could not be read.
    #[error(transparent)]
    Io(#[from] std::io::Error),
    /// The node's configuration or secrets in the store are unusable.
    #[error(transparent)]
    Config(#[from] NodeConfigError),
    /// The runtime refused its configuration.
    #[error(transparent)]
    Runtime(#[from] ConfigError),
    /// The shared object store could not be opened or reached.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The HTTPS front door's certificate could not be made.
    #[error(transparent)]
    Https(#[from] HttpsError),
    /// The shard server could not start.
    #[error(transparent)]
    Rpc(#[from] RpcError),
    /// Membership (gossip) could not start.
    #[error(transparent)]
    Membership(#[from] MembershipError),
    /// The nodes did not all see each other in time.
    #[error("rings did not converge to {nodes} nodes within {limit:?}")]
    NoConvergence {
        /// Ring size waited for.
        nodes: usize,
        /// How long.
        limit: Duration,
    },
}
/// How a node joins a cluster: its RPC listener and certificate, and who
/// its peers are (a static list, gossip seeds, or both).
pub struct JoinConfig {
    /// The node's ID on the ring (and the name of its certificate).
    pub node_id: String,
    /// Where peers reach this node's shard server.
    pub rpc_listener: TcpListener,
    /// Directory with `ca.pem`, `<node_id>.pem` and `<node_id>-key.pem`.
    pub pki_dir: PathBuf,
    /// UDP address for gossip (port 0 picks one); `None` for static only.
    pub gossip: Option<SocketAddr>,
    /// The gossip address peers send to, if not `gossip`'s (NAT, a port
    /// mapping, a relay); `None`: `gossip`'s bound address.
    pub gossip_advertise: Option<SocketAddr>,
    /// Gossip addresses of nodes to join through (DNS names are resolved
    /// again every few seconds, see [`hearth_sharding::membership`]).
    pub seeds: Vec<PeerAddr>,
    /// Members that are always on the ring (their addresses may be names).
    pub static_nodes: Vec<StaticMember>,
    /// This node's weight on the ring.
    pub weight: u32,
    /// The cluster's gossip key (datagrams without a valid MAC are dropped).
    pub gossip_key: Option<[u8; 32]>,
    /// Admission thresholds when this node is a home.
    pub overload: OverloadConfig,
}

/// A node that has joined: its membership and RPC server.
pub struct Joined {
    /// The node, now routing through the ring.
    pub node: Node,
    /// Its view of the cluster (drain and shut down through it).
    pub membership: Membership,
    /// Its shard server.
    pub rpc_server: ServerHandle,
}

/// How long a gossip member gets to prove its node ID (a TLS handshake).
const IDENTITY_CHECK_TIMEOUT: Duration = Duration::from_secs(2);

/// Starts `node`'s shard server and membership and joins it to the ring.
pub async fn join(node: Node, cfg: JoinConfig) -> Result<Joined, ClusterError> {
    let tls = NodeTls::load(&cfg.pki_dir, &cfg.node_id).map_err(|source| {
        ClusterError::NodeCertificate {
            node_id: cfg.node_id.clone(),
            pki_dir: cfg.pki_dir.clone(),
            source,
        }
    })?;
    let rpc_addr = cfg.rpc_listener.local_addr()?;
    let identity_check =
        hearth_sharding::transport::identity_check(tls.client_config(), IDENTITY_CHECK_TIMEOUT);
    let mut rc = RpcConfig::new(tls);
    rc.overload = cfg.overload;
    let rpc = RpcNode::start(rc, node.hosted_workers())?;
    let rpc_server = rpc.serve(cfg.rpc_listener)?;
    let me = Member::new(NodeId::new(cfg.node_id.clone()), rpc_addr).with_weight(cfg.weight);
    let mut mc = match cfg.gossip {
        Some(listen) => MembershipConfig::gossip(me, listen, Vec::new()),
        None => MembershipConfig::fixed(me, Vec::new()),
    };
    mc.static_nodes = cfg.static_nodes;
    if let Some(g) = mc.gossip.as_mut() {
        g.seeds = cfg.seeds;
        g.advertise = cfg.gossip_advertise;
        g.key = cfg.gossip_key;
        // A ring slot needs the node's certificate, not just the gossip key.
        g.verify = Some(identity_check);
    }
    let membership = Membership::start(mc).await?;
    node.metrics().observe_gossip(membership.gossip_counters());
    let link = ClusterLink {
        self_id: NodeId::new(cfg.node_id),
        ring: membership.ring().clone(),
    };
    Ok(Joined {
        node: node.join(link, rpc),
        membership,
        rpc_server,
    })
}

/// Raises the open-files limit ([`crate::listener::raise_fd_limit`]) and
/// logs the limit in force, once per process.
pub fn log_fd_limit() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| match crate::listener::raise_fd_limit() {
        Ok(limit) => tracing::info!(limit, "open files limit: {limit} (soft limit raised to the hard limit)"),
        Err(e) => tracing::warn!(error = %e, "cannot raise the open files limit; serving under the current one"),
    });
}
