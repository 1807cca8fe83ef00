//! The TOML configuration of `hearth serve` (every field optional; flags
//! override the file).
//!
//! ```toml
//! node_id = "node-1"
//! listen = "127.0.0.1:8080"
//! admin = "127.0.0.1:8081"
//! tls_listen = "127.0.0.1:8443"   # HTTPS (h2 + http/1.1); off if absent
//! tls_cert = "./cert.pem"    # chain, leaf first; with tls_key. Neither:
//! tls_key = "./key.pem"      #   a dev cert for *.localhost in <store>/tls/
//! sni_prewarm = true         # prewarm the Worker a ClientHello names
//! max_prewarms = 4           # prewarms in flight at once; more are dropped
//! store = "./hearth-store"   # a directory, or "s3://bucket/prefix" (then see [s3])
//! data = "./hearth-data"     # with an s3:// store: this node's own files
//!                            #   (artifact cache, admin token, dev certificates)
//! artifact_key = "…64 hex…"  # required with an s3:// store, the same on every
//!                            #   node; a directory store keeps it in the store
//! admin_token = "…"          # generated and saved in the store if absent
//! memory_budget_mb = 1024
//! idle_timeout_s = 300
//! idle_sweep_above = 0.9    # sweep idle Workers only above 90% of the budget
//!
//! [limits]                   # what clients may hold (defaults shown)
//! max_connections = 4096     # open at once on each listener
//! max_connections_per_peer = 256
//! write_timeout_s = 30       # a client that stops reading is closed
//! drain_timeout_s = 30       # Ctrl-C: in-flight requests get this long
//! body_idle_timeout_s = 10   # a request body that stalls this long fails
//! slot_wait_ms = 2000        # then 503 + retry-after
//! max_in_flight = 256        # instances serving at once on the node
//! instance_memory_mb = 8192  # memory all live instances may hold together
//!
//! [cluster]                  # optional: join a cluster
//! rpc = "127.0.0.1:7000"     # shard server; the address peers dial
//! pki = "./pki"              # ca.pem, <node_id>.pem, <node_id>-key.pem (`hearth pki`)
//! gossip = "127.0.0.1:7001"  # SWIM failure detection (optional)
//! seeds = ["127.0.0.1:7101"] # gossip addresses to join through
//! weight = 1
//! gossip_key = "…64 hex…"    # required with gossip; the same on every node
//! nodes = [{ id = "node-2", rpc = "127.0.0.1:7100" }]   # static members
//! max_in_flight_per_worker = 64
//! max_in_flight_node = 1024
//!
//! [s3]                       # with an s3:// store; unset fields come from the
//! endpoint = "http://127.0.0.1:3900"   # standard AWS_* environment variables
//! region = "garage"
//! access_key_id = "GK…"
//! secret_access_key = "…"
//! allow_http = true          # a plain-HTTP endpoint
//! timeout_ms = 5000          # one call; then a clear error
//! max_retries = 2
//!
//! [plans.free]               # any field of a plan may be given
//! max_script_size = 3145728  # bytes, gzip-compressed
//! startup_cpu = 400          # ms
//! request_cpu = 30000        # ms
//! request_wall = 60000       # ms, wall clock per request
//! memory = 134217728         # bytes
//! max_uncompressed_size = 33554432  # bytes, as uploaded
//! ```

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use std::sync::Arc;

use hearth_runtime::{DirStore, Plan, PlanLimits, RuntimeConfig, S3Settings, S3Store, ScriptStore};

use crate::listener::ServeLimits;

/// Partial plan limits from a config file.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PlanOverrides {
    /// Bytes, gzip-compressed.
    pub max_script_size: Option<u64>,
    /// Milliseconds of CPU.
    pub startup_cpu: Option<u64>,
    /// Milliseconds of CPU.
    pub request_cpu: Option<u64>,
    /// Milliseconds of wall-clock time per request.
    pub request_wall: Option<u64>,
    /// Bytes.
    pub memory: Option<u64>,
    /// Bytes, as uploaded.
    pub max_uncompressed_size: Option<u64>,
}

/// The `[limits]` section: what clients may hold on this node.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClientLimits {
    /// Connections open at once on each listener.
    pub max_connections: Option<usize>,
    /// Connections open at once from one IP address.
    pub max_connections_per_peer: Option<usize>,
    /// Seconds a response write may make no progress.
    pub write_timeout_s: Option<u64>,
    /// Seconds in-flight requests get after Ctrl-C.
    pub drain_timeout_s: Option<u64>,
    /// Seconds a request body may deliver nothing.
    pub body_idle_timeout_s: Option<u64>,
    /// Milliseconds a request may wait for an instance slot.
    pub slot_wait_ms: Option<u64>,
    /// Instances serving at once on the node.
    pub max_in_flight: Option<usize>,
    /// MiB all live instances may hold together.
    pub instance_memory_mb: Option<u64>,
}

/// Per-plan overrides.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Plans {
    /// The free plan.
    #[serde(default)]
    pub free: PlanOverrides,
    /// The paid plan.
    #[serde(default)]
    pub paid: PlanOverrides,
}

/// A static member of the cluster.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StaticNode {
    /// Its node ID.
    pub id: String,
    /// Its RPC address.
    pub rpc: SocketAddr,
    /// Its weight (default 1).
    #[serde(default = "one")]
    pub weight: u32,
}

fn one() -> u32 {
    1
}

/// The `[cluster]` section: how this node joins a cluster.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterSection {
    /// RPC listener, also the address peers dial.
    pub rpc: SocketAddr,
    /// Directory holding the cluster CA and this node's certificate.
    pub pki: PathBuf,
    /// Gossip (UDP) address, if failure detection is wanted.
    pub gossip: Option<SocketAddr>,
    /// Gossip seeds.
    #[serde(default)]
    pub seeds: Vec<SocketAddr>,
    /// This node's weight on the ring.
    #[serde(default = "one")]
    pub weight: u32,
    /// The gossip key, 64 hex digits, the same on every node; required when
    /// `gossip` is set (see [`ClusterSection::gossip_key`]).
    pub gossip_key: Option<String>,
    /// Static members.
    #[serde(default)]
    pub nodes: Vec<StaticNode>,
    /// Refuse sharded requests for a Worker above this many in flight.
    pub max_in_flight_per_worker: Option<usize>,
    /// Refuse sharded requests above this many in flight on the node.
    pub max_in_flight_node: Option<usize>,
}

impl ClusterSection {
    /// The key that authenticates this node's gossip: `None` without
    /// gossip. With gossip it must be given: a key made up per node would
    /// let nodes with separate stores never hear each other, each silently
    /// serving every Worker alone, so a missing key stops the node with a
    /// message that offers a fresh one.
    pub fn gossip_key(&self) -> anyhow::Result<Option<[u8; 32]>> {
        if self.gossip.is_none() {
            return Ok(None);
        }
        let Some(hex) = &self.gossip_key else {
            let fresh: [u8; 32] = rand::random();
            anyhow::bail!(
                "[cluster] turns gossip on but gives no gossip_key. Nodes with different \
                 keys never hear each other, and each would serve every Worker alone. Put \
                 the same key in the [cluster] section of every node, for example this \
                 fresh one:\n    gossip_key = \"{}\"",
                blake3::Hash::from_bytes(fresh).to_hex()
            );
        };
        parse_key("cluster.gossip_key", hex).map(Some)
    }
}

/// A node's configuration file.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NodeConfig {
    /// The node's ID (default `node-1`).
    pub node_id: Option<String>,
    /// HTTP listener for Worker traffic.
    pub listen: Option<SocketAddr>,
    /// Admin listener.
    pub admin: Option<SocketAddr>,
    /// HTTPS listener for Worker traffic.
    pub tls_listen: Option<SocketAddr>,
    /// PEM certificate chain of the HTTPS listener (leaf first).
    pub tls_cert: Option<PathBuf>,
    /// PEM private key of the HTTPS listener.
    pub tls_key: Option<PathBuf>,
    /// Whether a ClientHello's SNI starts a prewarm (default true).
    pub sni_prewarm: Option<bool>,
    /// Prewarms in flight at once on the node (default 4).
    pub max_prewarms: Option<usize>,
    /// Script store: a directory, or `s3://bucket/prefix`.
    pub store: Option<String>,
    /// This node's own files when the store is in S3 (default
    /// `hearth-data`).
    pub data: Option<PathBuf>,
    /// The key that authenticates precompiled artifacts, 64 hex digits,
    /// the same on every node; required with an S3 store.
    pub artifact_key: Option<String>,
    /// How to reach an S3 store.
    pub s3: Option<S3Settings>,
    /// Admin API token.
    pub admin_token: Option<String>,
    /// Memory budget for warm Workers, MiB.
    pub memory_budget_mb: Option<u64>,
    /// Idle timeout, seconds.
    pub idle_timeout_s: Option<u64>,
    /// Sweep idle Workers only above this fraction of the memory budget.
    pub idle_sweep_above: Option<f64>,
    /// Plan limits.
    #[serde(default)]
    pub plans: Plans,
    /// What clients may hold.
    #[serde(default)]
    pub limits: ClientLimits,
    /// Cluster membership; absent for a standalone node.
    pub cluster: Option<ClusterSection>,
}

impl NodeConfig {
    /// Reads and parses `path`.
    pub fn load(path: &Path) -> anyhow::Result<Self> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| anyhow::anyhow!("cannot read config {}: {e}", path.display()))?;
        toml::from_str(&text).map_err(|e| anyhow::anyhow!("invalid config {}: {e}", path.display()))
    }

    /// Applies the file's runtime settings to `cfg`.
    pub fn apply(&self, mut cfg: RuntimeConfig) -> RuntimeConfig {
        if let Some(mb) = self.memory_budget_mb {
            cfg = cfg.memory_budget(mb << 20);
        }
        if let Some(f) = self.idle_sweep_above {
            cfg = cfg.idle_sweep_above(f);
        }
        if let Some(s) = self.idle_timeout_s {
            cfg = cfg.idle_timeout(Duration::from_secs(s));
        }
        let c = &self.limits;
        if let Some(s) = c.body_idle_timeout_s {
            cfg = cfg.body_idle_timeout(Duration::from_secs(s));
        }
        if let Some(ms) = c.slot_wait_ms {
            cfg = cfg.slot_wait(Duration::from_millis(ms));
        }
        if let Some(n) = c.max_in_flight {
            cfg = cfg.max_in_flight(n);
        }
        if let Some(mb) = c.instance_memory_mb {
            cfg = cfg.instance_memory_cap(mb << 20);
        }
        for (plan, o) in [
            (Plan::Free, &self.plans.free),
            (Plan::Paid, &self.plans.paid),
        ] {
            let mut l: PlanLimits = *cfg.limits(plan);
            if let Some(v) = o.max_script_size {
                l.max_script_size = v;
            }
            if let Some(v) = o.startup_cpu {
                l.startup_cpu = Duration::from_millis(v);
            }
            if let Some(v) = o.request_cpu {
                l.request_cpu = Duration::from_millis(v);
            }
            if let Some(v) = o.request_wall {
                l.request_wall = Duration::from_millis(v);
            }
            if let Some(v) = o.max_uncompressed_size {
                l.max_uncompressed_size = v;
            }
            if let Some(v) = o.memory {
                l.memory = v;
            }
            cfg = cfg.plan_limits(plan, l);
        }
        cfg
    }

    /// The node's prewarm settings: the defaults with the file's.
    pub fn prewarm(&self) -> crate::prewarm::PrewarmConfig {
        let d = crate::prewarm::PrewarmConfig::default();
        crate::prewarm::PrewarmConfig {
            enabled: self.sni_prewarm.unwrap_or(d.enabled),
            max_concurrent: self.max_prewarms.unwrap_or(d.max_concurrent),
        }
    }

    /// The listeners' limits: the defaults with the file's `[limits]`.
    pub fn serve_limits(&self) -> ServeLimits {
        let d = ServeLimits::default();
        let c = &self.limits;
        ServeLimits {
            max_connections: c.max_connections.unwrap_or(d.max_connections),
            max_per_peer: c.max_connections_per_peer.unwrap_or(d.max_per_peer),
            write_timeout: c
                .write_timeout_s
                .map(Duration::from_secs)
                .unwrap_or(d.write_timeout),
            drain_timeout: c
                .drain_timeout_s
                .map(Duration::from_secs)
                .unwrap_or(d.drain_timeout),
        }
    }
}

/// Reads the secret in `store/name`, creating a random one (mode 0600) on
/// first use. Nodes sharing a store share it. Only a missing file is
/// created; any other read error (not UTF-8, a directory, no permission)
/// is an error naming the file, so a node never starts with a secret other
/// than the one on disk.
pub fn store_secret(store: &Path, name: &str) -> anyhow::Result<[u8; 32]> {
    use std::io::Write;
    let path = store.join(name);
    if let Some(key) = read_secret(&path)? {
        return Ok(key);
    }
    std::fs::create_dir_all(store)
        .map_err(|e| anyhow::anyhow!("cannot create {}: {e}", store.display()))?;
    let key: [u8; 32] = rand::random();
    // Written whole to a temporary file (0600 by default), then linked into
    // place only if no other node got there first: a concurrent reader sees
    // no file or a complete one, never an empty one.
    let create = |e: std::io::Error| anyhow::anyhow!("cannot create {}: {e}", path.display());
    let mut tmp = tempfile::NamedTempFile::new_in(store).map_err(create)?;
    tmp.write_all(blake3::Hash::from_bytes(key).to_hex().as_bytes())
        .map_err(create)?;
    tmp.as_file().sync_all().map_err(create)?;
    match tmp.persist_noclobber(&path) {
        Ok(_) => {
            hearth_runtime::script_store::sync_dir(store).map_err(create)?;
            Ok(key)
        }
        // Another node created it first: use theirs (read once, no retry).
        Err(e) if e.error.kind() == std::io::ErrorKind::AlreadyExists => read_secret(&path)?
            .ok_or_else(|| anyhow::anyhow!("{} vanished while it was created", path.display())),
        Err(e) => Err(create(e.error)),
    }
}

/// The secret in `path`: `None` if there is no such file, an error naming
/// the file for anything else that stops it being read or parsed.
fn read_secret(path: &Path) -> anyhow::Result<Option<[u8; 32]>> {
    match std::fs::read_to_string(path) {
        Ok(hex) => {
            let bytes = blake3::Hash::from_hex(hex.trim()).map_err(|e| {
                anyhow::anyhow!(
                    "corrupt secret in {}: {e} (expected 64 hex digits)",
                    path.display()
                )
            })?;
            Ok(Some(*bytes.as_bytes()))
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(anyhow::anyhow!(
            "cannot read secret {}: {e}",
            path.display()
        )),
    }
}

/// Where a node keeps Worker sources, and its own files.
#[derive(Clone)]
pub struct NodeStore {
    /// The node's own directory: the store itself for a directory store,
    /// else the data directory (artifact cache, admin token, certificates).
    pub local: PathBuf,
    /// The script store.
    pub scripts: Arc<dyn ScriptStore>,
    /// The runtime configuration to start from: sources in `scripts`,
    /// artifacts cached in `local`, authenticated with the cluster's key.
    pub runtime: RuntimeConfig,
}

impl NodeStore {
    /// Opens the store at `location` (a directory, or `s3://bucket/prefix`
    /// with `file`'s `[s3]`, `data` and `artifact_key`). An S3 store is
    /// contacted once, so a wrong endpoint or key stops the node at start
    /// with the store's own message. Must run inside the node's Tokio
    /// runtime.
    pub async fn open(location: &str, file: &NodeConfig) -> anyhow::Result<NodeStore> {
        if !hearth_runtime::s3_store::is_s3_url(location) {
            let dir = PathBuf::from(location);
            let mut runtime = runtime_config(&dir)?;
            if let Some(hex) = &file.artifact_key {
                runtime = runtime.artifact_key(parse_key("artifact_key", hex)?);
            }
            let scripts = DirStore::open(&dir)
                .map_err(|e| anyhow::anyhow!("cannot open script store: {e}"))?;
            return Ok(NodeStore {
                local: dir,
                scripts: Arc::new(scripts),
                runtime,
            });
        }
        let Some(hex) = &file.artifact_key else {
            let fresh: [u8; 32] = rand::random();
            anyhow::bail!(
                "store = \"{location}\" shares precompiled artifacts between nodes, so every \
                 node needs the same artifact_key (nodes with different keys refuse each \
                 other's artifacts). Put the same key in every node's config, for example \
                 this fresh one:\n    artifact_key = \"{}\"",
                blake3::Hash::from_bytes(fresh).to_hex()
            );
        };
        let key = parse_key("artifact_key", hex)?;
        let local = file
            .data
            .clone()
            .unwrap_or_else(|| PathBuf::from("hearth-data"));
        std::fs::create_dir_all(&local).map_err(|e| {
            anyhow::anyhow!("cannot create data directory {}: {e}", local.display())
        })?;
        let s3 = S3Store::open(location, &file.s3.clone().unwrap_or_default())?;
        s3.check()
            .await
            .map_err(|e| anyhow::anyhow!("cannot use the script store: {e}"))?;
        Ok(NodeStore {
            runtime: RuntimeConfig::new(&local).artifact_key(key),
            local,
            scripts: Arc::new(s3),
        })
    }
}

/// `hex` as a 32-byte key, or an error naming the setting.
fn parse_key(name: &str, hex: &str) -> anyhow::Result<[u8; 32]> {
    let key = blake3::Hash::from_hex(hex.trim())
        .map_err(|_| anyhow::anyhow!("{name} must be 64 hex digits (32 bytes)"))?;
    Ok(*key.as_bytes())
}

/// The runtime configuration every node over `store` starts from: sources
/// and artifacts in the store, authenticated with the store's artifact key.
pub fn runtime_config(store: &Path) -> anyhow::Result<RuntimeConfig> {
    Ok(RuntimeConfig::new(store).artifact_key(store_secret(store, "artifact.key")?))
}

/// The admin token of the nodes over `store` (`store/admin.token`), and
/// whether it was just generated (callers print a new one).
pub fn admin_token(store: &Path) -> anyhow::Result<(String, bool)> {
    let existed = store.join("admin.token").exists();
    let key = store_secret(store, "admin.token")?;
    Ok((blake3::Hash::from_bytes(key).to_hex().to_string(), !existed))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_three_example_configs_of_the_readme_parse_and_agree() {
        let texts = [
            include_str!("../docs/operator/node-1.toml"),
            include_str!("../docs/operator/node-2.toml"),
            include_str!("../docs/operator/node-3.toml"),
        ];
        let mut rpcs = Vec::new();
        for (i, text) in texts.iter().enumerate() {
            let c: NodeConfig = toml::from_str(text).expect("example config parses");
            assert_eq!(
                c.node_id.as_deref(),
                Some(format!("node-{}", i + 1).as_str())
            );
            assert_eq!(c.store.as_deref(), Some("s3://hearth/prod"));
            let key = c.artifact_key.as_deref().expect("artifact_key");
            parse_key("artifact_key", key).expect("artifact_key is 64 hex digits");
            let cluster = c.cluster.as_ref().expect("[cluster]");
            assert!(cluster.gossip_key().expect("gossip_key").is_some());
            rpcs.push(cluster.rpc);
        }
        rpcs.dedup();
        assert_eq!(rpcs.len(), 3, "each node its own RPC address");
    }
}
