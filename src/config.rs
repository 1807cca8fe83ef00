//! The TOML configuration of `hearth serve` (every field optional; flags
//! override the file).
//!
//! ```toml
//! node_id = "node-1"
//! listen = "127.0.0.1:8080"
//! admin = "127.0.0.1:8081"
//! store = "./hearth-store"
//! admin_token = "…"          # generated and saved in the store if absent
//! memory_budget_mb = 1024
//! idle_timeout_s = 300
//! idle_sweep_above = 0.9    # sweep idle Workers only above 90% of the budget
//!
//! [cluster]                  # optional: join a cluster
//! rpc = "127.0.0.1:7000"     # shard server; the address peers dial
//! pki = "./pki"              # ca.pem, <node_id>.pem, <node_id>-key.pem (`hearth pki`)
//! gossip = "127.0.0.1:7001"  # SWIM failure detection (optional)
//! seeds = ["127.0.0.1:7101"] # gossip addresses to join through
//! weight = 1
//! gossip_key = "…64 hex…"    # default: the store's gossip.key (shared store)
//! nodes = [{ id = "node-2", rpc = "127.0.0.1:7100" }]   # static members
//! max_in_flight_per_worker = 64
//! max_in_flight_node = 1024
//!
//! [plans.free]               # any field of a plan may be given
//! max_script_size = 3145728  # bytes, gzip-compressed
//! startup_cpu = 400          # ms
//! request_cpu = 30000        # ms
//! memory = 134217728         # bytes
//! ```

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use hearth_runtime::{Plan, PlanLimits, RuntimeConfig};

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
    /// Bytes.
    pub memory: Option<u64>,
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
    /// The gossip key, 64 hex digits.
    pub gossip_key: Option<String>,
    /// Static members.
    #[serde(default)]
    pub nodes: Vec<StaticNode>,
    /// Refuse sharded requests for a Worker above this many in flight.
    pub max_in_flight_per_worker: Option<usize>,
    /// Refuse sharded requests above this many in flight on the node.
    pub max_in_flight_node: Option<usize>,
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
    /// Script store directory.
    pub store: Option<PathBuf>,
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
            cfg = cfg.idle_timeout(std::time::Duration::from_secs(s));
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
                l.startup_cpu = std::time::Duration::from_millis(v);
            }
            if let Some(v) = o.request_cpu {
                l.request_cpu = std::time::Duration::from_millis(v);
            }
            if let Some(v) = o.memory {
                l.memory = v;
            }
            cfg = cfg.plan_limits(plan, l);
        }
        cfg
    }
}

/// Reads the secret in `store/name`, creating a random one (mode 0600) on
/// first use. Nodes sharing a store share it.
pub fn store_secret(store: &Path, name: &str) -> anyhow::Result<[u8; 32]> {
    use std::io::Write;
    let path = store.join(name);
    if let Ok(hex) = std::fs::read_to_string(&path) {
        let bytes = blake3::Hash::from_hex(hex.trim())
            .map_err(|e| anyhow::anyhow!("corrupt secret in {}: {e}", path.display()))?;
        return Ok(*bytes.as_bytes());
    }
    std::fs::create_dir_all(store)?;
    let key: [u8; 32] = rand::random();
    // Written whole to a temporary file (0600 by default), then linked into
    // place only if no other node got there first: a concurrent reader sees
    // no file or a complete one, never an empty one.
    let mut tmp = tempfile::NamedTempFile::new_in(store)?;
    tmp.write_all(blake3::Hash::from_bytes(key).to_hex().as_bytes())?;
    tmp.as_file().sync_all()?;
    match tmp.persist_noclobber(&path) {
        Ok(_) => Ok(key),
        // Another node created it first: use theirs.
        Err(e) if e.error.kind() == std::io::ErrorKind::AlreadyExists => store_secret(store, name),
        Err(e) => Err(anyhow::anyhow!(
            "cannot create {}: {}",
            path.display(),
            e.error
        )),
    }
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
