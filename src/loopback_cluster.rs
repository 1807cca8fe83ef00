//! A loopback cluster: N real nodes in one process, each with its own runtime,
//! HTTP and HTTPS front doors, admin API, Cap'n Proto RPC listener (mTLS with a dev CA)
//! and gossip membership, all on loopback and sharing one store directory.
//! `hearth cluster`, `hearth demo` and [`crate::testing::TestCluster`] are
//! built on it. Each node joins the others as a production node does
//! ([`crate::cluster::join`]); its public path is `hearth::cluster`.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::watch;

use hearth_runtime::{Runtime, RuntimeConfig};
use hearth_sharding::admission::OverloadConfig;
use hearth_sharding::membership::Membership;
use hearth_sharding::rpc::ServerHandle;
use hearth_sharding::tls::{NodeTls, generate_dev_pki};

use crate::cluster::{ClusterError, JoinConfig, join};
use crate::config::{admin_token, store_secret};
use crate::front_door::{Listeners, spawn_listeners};
use crate::node::Node;

/// How to start a [`LoopbackCluster`].
#[derive(Clone)]
pub struct ClusterConfig {
    /// Number of nodes.
    pub nodes: usize,
    /// The shared store directory (scripts, artifacts, dev certificates).
    pub store: PathBuf,
    /// First port: node i listens on HTTP `base+4i`, admin `base+4i+1`, RPC
    /// `base+4i+2`, HTTPS `base+4i+3`; `None` picks free ports.
    pub base_port: Option<u16>,
    /// Runtime settings for every node (the store dir is set per cluster).
    pub runtime: Arc<dyn Fn(RuntimeConfig) -> RuntimeConfig + Send + Sync>,
    /// Admission thresholds of every home.
    pub overload: OverloadConfig,
    /// Whether nodes shard at all (off: each node serves every Worker
    /// itself, as behind a plain load balancer).
    pub sharding: bool,
    /// Whether every node also serves HTTPS, with the store's development
    /// certificate (default on).
    pub https: bool,
    /// How nodes prewarm from a ClientHello's SNI.
    pub prewarm: crate::prewarm::PrewarmConfig,
    /// Keep Worker sources and shared artifacts in this S3 store
    /// (`s3://bucket/prefix` and how to reach it) instead of the shared
    /// directory; each node then has a directory of its own under
    /// `store` (`store/node-N`: artifact cache), so nodes share no files
    /// but the cluster's keys and certificates.
    pub s3: Option<(String, hearth_runtime::S3Settings)>,
    /// What every node's listeners let clients hold
    /// ([`crate::listener::ServeLimits`]; default the node's defaults).
    pub serve_limits: crate::listener::ServeLimits,
    /// Who may read each node's `/metrics` (default open).
    pub admin_metrics: crate::admin::MetricsAccess,
    /// Node `i`'s gossip socket and the address it advertises to peers
    /// (`[cluster] gossip` and `gossip_advertise`), for the nodes this
    /// lists: a test that carries gossip through a relay of its own (to cut
    /// a node off and heal it). Nodes past its end bind a free loopback
    /// port and advertise it (the default: empty).
    pub gossip: Vec<(SocketAddr, Option<SocketAddr>)>,
}

impl ClusterConfig {
    /// `nodes` nodes over `store`, free ports, default runtime and overload
    /// settings, sharding on.
    pub fn new(nodes: usize, store: impl Into<PathBuf>) -> Self {
        ClusterConfig {
            nodes,
            store: store.into(),
            base_port: None,
            // A small pool per node: several nodes share one process's
            // address space.
            runtime: Arc::new(|c| c.instance_pool_size(64)),
            overload: OverloadConfig::default(),
            sharding: true,
            https: true,
            prewarm: crate::prewarm::PrewarmConfig::default(),
            s3: None,
            serve_limits: crate::listener::ServeLimits::default(),
            admin_metrics: crate::admin::MetricsAccess::Open,
            gossip: Vec::new(),
        }
    }
}
/// One node of a [`LoopbackCluster`].
pub struct ClusterNode {
    /// The node.
    pub node: Node,
    /// Its HTTP front door.
    pub http_addr: SocketAddr,
    /// Its HTTPS front door, if the cluster serves HTTPS.
    pub https_addr: Option<SocketAddr>,
    /// Its admin API.
    pub admin_addr: SocketAddr,
    /// Its RPC listener.
    pub rpc_addr: SocketAddr,
    membership: Option<Membership>,
    rpc_server: Option<ServerHandle>,
    stop: watch::Sender<bool>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl ClusterNode {
    /// Its gossip (UDP) address, when it runs gossip.
    pub fn gossip_addr(&self) -> Option<SocketAddr> {
        self.membership.as_ref().and_then(|m| m.gossip_addr())
    }
}

/// N nodes on loopback in this process.
pub struct LoopbackCluster {
    nodes: Vec<ClusterNode>,
    token: Arc<str>,
    store: PathBuf,
    tls_ca: Option<PathBuf>,
}

async fn bind(base: Option<u16>, offset: u16) -> Result<TcpListener, ClusterError> {
    let port = base.map(|b| b + offset).unwrap_or(0);
    TcpListener::bind(("127.0.0.1", port))
        .await
        .map_err(|source| ClusterError::Listen {
            addr: format!("127.0.0.1:{port}"),
            source,
        })
}

fn node_name(i: usize) -> String {
    format!("node-{}", i + 1)
}

/// What every node of a loopback cluster shares, read from its store once.
struct Common {
    pki: PathBuf,
    artifact_key: [u8; 32],
    s3: Option<Arc<hearth_runtime::S3Store>>,
    gossip_key: [u8; 32],
    token: Arc<str>,
    door: Option<crate::https::TlsFrontDoor>,
}

impl Common {
    /// Reads (or makes) the store's PKI, secrets and HTTPS certificate, and
    /// opens and checks the S3 store if there is one. Also returns the CA
    /// that signs the front door's certificate, if it serves HTTPS.
    async fn open(
        cfg: &ClusterConfig,
        names: &[String],
    ) -> Result<(Self, Option<PathBuf>), ClusterError> {
        let pki = cfg.store.join("pki");
        let refs: Vec<&str> = names.iter().map(String::as_str).collect();
        if !pki.join("ca.pem").exists() {
            generate_dev_pki(&pki, &refs)?;
        }
        let artifact_key = store_secret(&cfg.store, "artifact.key")?;
        let s3 = match &cfg.s3 {
            Some((url, settings)) => {
                let s = hearth_runtime::S3Store::open(url, settings)?;
                s.check().await?;
                Some(Arc::new(s))
            }
            None => None,
        };
        let gossip_key = store_secret(&cfg.store, "gossip.key")?;
        let token: Arc<str> = admin_token(&cfg.store)?.0.into();
        let (door, tls_ca) = if cfg.https {
            let (door, ca) = crate::https::TlsFrontDoor::dev(&cfg.store)?;
            (Some(door), Some(ca))
        } else {
            (None, None)
        };
        let common = Common {
            pki,
            artifact_key,
            s3,
            gossip_key,
            token,
            door,
        };
        Ok((common, tls_ca))
    }
}

/// One node's sockets.
struct NodeSockets {
    http: TcpListener,
    admin: TcpListener,
    rpc: TcpListener,
    https: Option<TcpListener>,
}

impl NodeSockets {
    /// Binds node `i`'s sockets: four ports from `base + 4 i` if a base is
    /// given (HTTP, admin, RPC, HTTPS), any free ports otherwise.
    async fn bind(base: Option<u16>, i: usize, https: bool) -> Result<Self, ClusterError> {
        let off = (4 * i) as u16;
        Ok(NodeSockets {
            http: bind(base, off).await?,
            admin: bind(base, off + 1).await?,
            rpc: bind(base, off + 2).await?,
            https: match https {
                true => Some(bind(base, off + 3).await?),
                false => None,
            },
        })
    }
}

/// Starts node `name` on its `sockets`: its runtime, and with sharding its
/// shard server and membership (seeded with the nodes started before it,
/// to which it adds its own gossip address), then its front doors.
async fn start_node(
    cfg: &ClusterConfig,
    common: &Common,
    i: usize,
    name: &str,
    sockets: NodeSockets,
    seeds: &mut Vec<SocketAddr>,
) -> Result<ClusterNode, ClusterError> {
    let NodeSockets {
        http,
        admin,
        rpc,
        https,
    } = sockets;
    // Over S3 each node keeps its compiled artifacts in a directory of its
    // own; over a directory store they all share it.
    let dir = match common.s3 {
        Some(_) => cfg.store.join(name),
        None => cfg.store.clone(),
    };
    let own = (cfg.runtime)(RuntimeConfig::new(dir).artifact_key(common.artifact_key));
    let runtime = match &common.s3 {
        Some(store) => Runtime::with_store(own, store.clone())?,
        None => Runtime::new(own)?,
    };
    let mut node = Node::with_prewarm(name.to_string(), runtime, cfg.prewarm);
    let rpc_addr = rpc.local_addr()?;
    let (mut membership, mut rpc_server) = (None, None);
    if cfg.sharding {
        // Missing, or not bound to this node's ID (a store from before
        // certificates named their node): issue a fresh one.
        if NodeTls::load(&common.pki, name).is_err() {
            hearth_sharding::tls::issue_node_cert(&common.pki, name)?;
        }
        let (gossip, gossip_advertise) = cfg
            .gossip
            .get(i)
            .copied()
            .unwrap_or((SocketAddr::from(([127, 0, 0, 1], 0)), None));
        let joined = join(
            node,
            JoinConfig {
                node_id: name.to_string(),
                rpc_listener: rpc,
                pki_dir: common.pki.clone(),
                gossip: Some(gossip),
                gossip_advertise,
                seeds: seeds.iter().map(|&a| a.into()).collect(),
                static_nodes: Vec::new(),
                weight: 1,
                gossip_key: Some(common.gossip_key),
                overload: cfg.overload,
            },
        )
        .await?;
        if let Some(a) = joined.membership.gossip_addr() {
            seeds.push(a);
        }
        node = joined.node;
        membership = Some(joined.membership);
        rpc_server = Some(joined.rpc_server);
    } else {
        drop(rpc);
    }
    let (stop, stop_rx) = watch::channel(false);
    let http_addr = http.local_addr()?;
    let admin_addr = admin.local_addr()?;
    let https_addr = https.as_ref().map(|l| l.local_addr()).transpose()?;
    let tasks = spawn_listeners(
        &node,
        Listeners {
            http,
            https: https.zip(common.door.clone()),
            admin,
            admin_tls: None,
        },
        crate::admin::AdminAccess {
            token: common.token.clone(),
            metrics: cfg.admin_metrics,
        },
        cfg.serve_limits,
        stop_rx,
    );
    Ok(ClusterNode {
        node,
        http_addr,
        https_addr,
        admin_addr,
        rpc_addr,
        membership,
        rpc_server,
        stop,
        tasks,
    })
}
impl LoopbackCluster {
    /// Starts the cluster and waits until every node sees every other.
    pub async fn start(cfg: ClusterConfig) -> Result<Self, ClusterError> {
        if cfg.nodes == 0 {
            return Err(ClusterError::NoNodes);
        }
        cfg.serve_limits.check()?;
        std::fs::create_dir_all(&cfg.store)?;
        crate::cluster::log_fd_limit();
        let names: Vec<String> = (0..cfg.nodes).map(node_name).collect();
        let (common, tls_ca) = Common::open(&cfg, &names).await?;
        // Every socket is bound before any node starts.
        let mut sockets = Vec::new();
        for i in 0..cfg.nodes {
            sockets.push(NodeSockets::bind(cfg.base_port, i, common.door.is_some()).await?);
        }
        let mut nodes = Vec::new();
        let mut seeds: Vec<SocketAddr> = Vec::new();
        for (i, (name, sockets)) in names.iter().zip(sockets).enumerate() {
            nodes.push(start_node(&cfg, &common, i, name, sockets, &mut seeds).await?);
        }
        let cluster = LoopbackCluster {
            nodes,
            token: common.token,
            store: cfg.store.clone(),
            tls_ca,
        };
        if cfg.sharding {
            cluster
                .wait_for_ring(cfg.nodes, Duration::from_secs(10))
                .await?;
        }
        Ok(cluster)
    }

    /// Waits until every live node's ring has `n` members.
    pub async fn wait_for_ring(&self, n: usize, limit: Duration) -> Result<(), ClusterError> {
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            let ok = self
                .nodes
                .iter()
                .filter_map(|c| c.membership.as_ref())
                .all(|m| m.ring().load().len() == n);
            if ok {
                return Ok(());
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(ClusterError::NoConvergence { nodes: n, limit });
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The nodes.
    pub fn nodes(&self) -> &[ClusterNode] {
        &self.nodes
    }

    /// Node `i`.
    pub fn node(&self, i: usize) -> &ClusterNode {
        &self.nodes[i]
    }

    /// The admin token every node accepts.
    pub fn token(&self) -> &str {
        &self.token
    }

    /// The shared store directory.
    pub fn store(&self) -> &Path {
        &self.store
    }

    /// The CA of the nodes' HTTPS certificate, for clients to trust (when
    /// the cluster serves HTTPS).
    pub fn tls_ca(&self) -> Option<&Path> {
        self.tls_ca.as_deref()
    }

    /// The ID of the home of `script_id` on node 0's ring.
    pub fn home_of(&self, script_id: &str) -> Option<usize> {
        let m = self.nodes.iter().find_map(|c| c.membership.as_ref())?;
        let ring = m.ring().load();
        let id = ring.home(script_id)?.id.as_str().to_string();
        self.nodes.iter().position(|c| c.node.id() == id)
    }

    /// Kills node `i` abruptly: no goodbye on gossip, listeners closed,
    /// in-flight connections cut. The others find out by failure detection.
    pub fn kill(&mut self, i: usize) {
        let c = &mut self.nodes[i];
        drop(c.membership.take());
        if let Some(s) = c.rpc_server.take() {
            s.stop();
        }
        if let Some(r) = c.node.rpc() {
            r.shutdown();
        }
        let _ = c.stop.send(true);
        for t in c.tasks.drain(..) {
            t.abort();
        }
    }

    /// Stops every node gracefully.
    pub async fn shutdown(mut self) {
        for c in &mut self.nodes {
            if let Some(m) = c.membership.take() {
                let _ = m.shutdown().await;
            }
            let _ = c.stop.send(true);
        }
        // The front doors drain first: their connections live on the RPC
        // threads, which stop after.
        for c in &mut self.nodes {
            for t in c.tasks.drain(..) {
                let _ = t.await;
            }
        }
        for c in &self.nodes {
            if let Some(r) = c.node.rpc() {
                r.shutdown();
            }
        }
    }
}
