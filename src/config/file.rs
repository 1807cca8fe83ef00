//! The TOML file: its structs, and what their settings mean.
//!
//! [`NodeConfig`] is the whole file, every field optional, with a struct
//! per section: `[limits]` ([`ClientLimits`], what clients may hold),
//! `[plans.*]` ([`Plans`] of [`PlanOverrides`]), `[egress]`
//! ([`EgressSection`]), `[live_tail]` ([`LiveTailSection`]), `[objects]`
//! ([`ObjectsSection`]), `[telemetry]` ([`TelemetrySection`]) and
//! `[cluster]` ([`ClusterSection`], with its [`StaticNode`]s); `[s3]` is
//! the runtime's own `S3Settings`. Unknown keys are refused. What the
//! settings mean is here too: [`NodeConfig::apply`] lays them over the
//! runtime's defaults, [`NodeConfig::serve_limits`] over the listeners',
//! [`NodeConfig::prewarm`] over prewarm's, and
//! [`ClusterSection::join_config`] makes how the node joins its cluster.
//!
//! The settings the flags can override (addresses, store, certificates) are
//! taken out by `ServeArgs::resolve`; the deprecated keys' fields are read
//! by `legacy` only. `docs/operator/hearth.toml` shows every key.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use bytesize::ByteSize;
use serde::Deserialize;

use hearth_runtime::{Plan, PlanLimits, RuntimeConfig, S3Settings};
use hearth_sharding::admission::OverloadConfig;
use hearth_sharding::membership::{PeerAddr, StaticMember};

use super::legacy::{request_cpu, request_wall, startup_cpu};
use super::secrets::{fresh_key, parse_key};
use super::{ListenAddr, NodeConfigError};
use crate::cluster::JoinConfig;
use crate::listener::ServeLimits;

/// Partial plan limits from a config file. Sizes are [`ByteSize`]s
/// (`"3MiB"`, or a bare number of bytes); times are durations (`"400ms"`,
/// `"30s"`; a bare number is still read as milliseconds, with a
/// deprecation warning, for one release).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PlanOverrides {
    /// Script size, gzip-compressed.
    pub max_script_size: Option<ByteSize>,
    /// CPU time of instantiation (top-level code).
    #[serde(default, deserialize_with = "startup_cpu")]
    pub startup_cpu: Option<Duration>,
    /// CPU time of one request.
    #[serde(default, deserialize_with = "request_cpu")]
    pub request_cpu: Option<Duration>,
    /// Wall-clock time of one request.
    #[serde(default, deserialize_with = "request_wall")]
    pub request_wall: Option<Duration>,
    /// Memory of one instance.
    pub memory: Option<ByteSize>,
    /// Script size as uploaded.
    pub max_uncompressed_size: Option<ByteSize>,
    /// Fetches of origins per request.
    pub subrequests: Option<u32>,
}

/// The `[egress]` section: how Workers' fetches of allowed origins are
/// made ([`hearth_runtime::outbound::egress`]).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EgressSection {
    /// Whether loopback, private, link-local and metadata addresses may be
    /// reached (default false).
    pub allow_private_addresses: Option<bool>,
    /// Waiting for a connection under the caps, then TCP connect, each at
    /// most this long.
    #[serde(default, with = "humantime_serde")]
    pub connect_timeout: Option<Duration>,
    /// One DNS lookup at most this long.
    #[serde(default, with = "humantime_serde")]
    pub dns_timeout: Option<Duration>,
    /// Name servers to ask instead of those of `/etc/resolv.conf`.
    pub dns_servers: Option<Vec<std::net::SocketAddr>>,
    /// Open connections to origins per node.
    pub max_connections: Option<usize>,
    /// Connections one Worker may use at once on a node.
    pub max_connections_per_worker: Option<usize>,
    /// How long an idle connection stays open.
    #[serde(default, with = "humantime_serde")]
    pub idle_timeout: Option<Duration>,
    /// From sending a request until its response head.
    #[serde(default, with = "humantime_serde")]
    pub first_byte_timeout: Option<Duration>,
    /// The largest response body a Worker may read.
    pub max_response_size: Option<ByteSize>,
    /// PEM files of CAs trusted beside the Mozilla roots, for origins
    /// served with certificates of a private CA.
    #[serde(default)]
    pub extra_roots: Vec<PathBuf>,
    /// The certificates of `extra_roots`, read by
    /// [`ServeArgs::resolve`](super::ServeArgs::resolve).
    #[serde(skip)]
    loaded_roots: Vec<rustls::pki_types::CertificateDer<'static>>,
}

impl EgressSection {
    /// Reads the CA certificates of `extra_roots`; a file that cannot be
    /// read or holds no certificate is an error naming it.
    pub(super) fn load_roots(&mut self) -> Result<(), NodeConfigError> {
        for path in &self.extra_roots {
            let certs = crate::https::read_certs(path).map_err(NodeConfigError::EgressRoot)?;
            self.loaded_roots.extend(certs);
        }
        Ok(())
    }
}

/// The `[live_tail]` section: the byte budgets of the live tail
/// ([`hearth_runtime::outbound::live_tail::TailBudget`]).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LiveTailSection {
    /// Most bytes of JSON one request's event may take (default 256 KiB,
    /// at least 64 KiB); a larger one is cut, with a `truncated` mark.
    pub max_event_bytes: Option<ByteSize>,
    /// Most bytes queued for one watcher (default 4 MiB); more are
    /// dropped and counted.
    pub max_queue_bytes: Option<ByteSize>,
    /// Most bytes queued for all watchers on the node (default 32 MiB).
    pub max_node_bytes: Option<ByteSize>,
}

impl LiveTailSection {
    /// `cfg` with this section's budgets (unset ones keep theirs).
    fn apply(&self, cfg: RuntimeConfig) -> RuntimeConfig {
        let mut b = *cfg.tail_budget_config();
        if let Some(v) = self.max_event_bytes {
            b.event_bytes = bytes_usize(v);
        }
        if let Some(v) = self.max_queue_bytes {
            b.queue_bytes = bytes_usize(v);
        }
        if let Some(v) = self.max_node_bytes {
            b.node_bytes = bytes_usize(v);
        }
        cfg.tail_budget(b)
    }
}

/// The `[objects]` section: Durable Objects on this node
/// ([`hearth_runtime::objects`]).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ObjectsSection {
    /// The SQLite file that fences the objects' heads (default
    /// `<store>/objects/fence.sqlite`); nodes on one machine share it.
    pub fence: Option<PathBuf>,
    /// etcd endpoints (`http://host:2379`) that fence the heads instead,
    /// for nodes that share no disk.
    pub etcd: Option<Vec<String>>,
    /// Objects resident on the node at most (default 1000); idle ones
    /// past it are evicted and reloaded from storage on their next request.
    pub max_resident: Option<usize>,
    /// Storage calls one request of an object may make (default 10000).
    pub ops_per_request: Option<u32>,
    /// Bytes of keys and values one object may store (default 64 MiB).
    pub max_object_bytes: Option<ByteSize>,
}

impl ObjectsSection {
    /// Checks what cannot be applied: one fence only, endpoints given.
    pub(super) fn check(&self) -> Result<(), NodeConfigError> {
        match (&self.fence, &self.etcd) {
            (Some(_), Some(_)) => Err(NodeConfigError::Objects(
                "give `fence` (an SQLite file) or `etcd` (endpoints), not both".into(),
            )),
            (_, Some(e)) if e.is_empty() => {
                Err(NodeConfigError::Objects("`etcd` lists no endpoint".into()))
            }
            _ if self.max_resident == Some(0) => Err(NodeConfigError::Objects(
                "`max_resident` must be at least 1".into(),
            )),
            _ => Ok(()),
        }
    }

    /// `cfg` with this section's settings (unset ones keep theirs).
    fn apply(&self, cfg: RuntimeConfig) -> RuntimeConfig {
        use hearth_runtime::objects::{ObjectFence, ObjectsConfig};
        let mut o: ObjectsConfig = ObjectsConfig::default();
        if let Some(path) = &self.fence {
            o.fence = ObjectFence::Sqlite(Some(path.clone()));
        }
        if let Some(endpoints) = &self.etcd {
            o.fence = ObjectFence::Etcd(endpoints.clone());
        }
        if let Some(n) = self.max_resident {
            o.max_resident = n;
        }
        if let Some(n) = self.ops_per_request {
            o.ops_per_request = n;
        }
        if let Some(b) = self.max_object_bytes {
            o.max_object_bytes = b.as_u64();
        }
        cfg.objects(o)
    }
}

/// The `[telemetry]` section: OpenTelemetry export of request spans over
/// OTLP/HTTP ([`crate::telemetry`]). Absent, nothing is exported.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TelemetrySection {
    /// The collector's OTLP/HTTP traces URL
    /// (`http://127.0.0.1:4318/v1/traces`; `https://` too).
    pub endpoint: String,
    /// The spans' `service.name` (default `hearth`).
    pub service_name: Option<String>,
    /// Fraction of the traces this node starts that are recorded, 0.0 to
    /// 1.0 (default 1.0); a client's `traceparent` decides for its own.
    pub sample_ratio: Option<f64>,
    /// Finished spans waiting for export; more are dropped (default 2048).
    pub max_queue: Option<usize>,
    /// A batch of spans is sent at least this often (default 1s).
    #[serde(default, with = "humantime_serde")]
    pub export_interval: Option<Duration>,
}

impl TelemetrySection {
    /// The exporter's settings: the defaults with the section's.
    pub fn config(&self) -> Result<crate::telemetry::TelemetryConfig, NodeConfigError> {
        let mut c = crate::telemetry::TelemetryConfig::new(self.endpoint.clone());
        if let Some(name) = &self.service_name {
            c.service_name = name.clone();
        }
        if let Some(ratio) = self.sample_ratio {
            if !(0.0..=1.0).contains(&ratio) {
                return Err(NodeConfigError::Telemetry(format!(
                    "sample_ratio must be between 0.0 and 1.0 (got {ratio})"
                )));
            }
            c.sample_ratio = ratio;
        }
        if let Some(n) = self.max_queue {
            c.max_queue = n.max(1);
        }
        if let Some(every) = self.export_interval {
            c.export_interval = every;
        }
        Ok(c)
    }
}

/// The `[limits]` section: what clients may hold on this node.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, remote = "Self")]
pub struct ClientLimits {
    /// Connections open at once on each listener.
    pub max_connections: Option<usize>,
    /// Connections open at once from one IP address.
    pub max_connections_per_peer: Option<usize>,
    /// How long a response write may make no progress.
    #[serde(default, with = "humantime_serde")]
    pub write_timeout: Option<Duration>,
    /// How long in-flight requests get after Ctrl-C.
    #[serde(default, with = "humantime_serde")]
    pub drain_timeout: Option<Duration>,
    /// How long a request body may deliver nothing.
    #[serde(default, with = "humantime_serde")]
    pub body_idle_timeout: Option<Duration>,
    /// How long a request may wait for an instance slot.
    #[serde(default, with = "humantime_serde")]
    pub slot_wait: Option<Duration>,
    /// Instances serving at once on the node.
    pub max_in_flight: Option<usize>,
    /// Memory all live instances may hold together.
    pub instance_memory: Option<ByteSize>,
    /// How long a request head (and a TLS handshake, and an HTTP/2
    /// connection with no stream open) may take; also the HTTP/1.1
    /// keep-alive idle timeout.
    #[serde(default, with = "humantime_serde")]
    pub header_read_timeout: Option<Duration>,
    /// HTTP/2 keep-alive: a PING after this long without a frame, to be
    /// answered within as long again.
    #[serde(default, with = "humantime_serde")]
    pub h2_keep_alive: Option<Duration>,
    /// Request body bytes one connection's requests may hold before they
    /// take their slots.
    pub max_pre_slot_bytes_per_connection: Option<ByteSize>,
    /// The same over every front-door connection of the node together.
    pub max_pre_slot_bytes: Option<ByteSize>,
    /// The receive window of an HTTP/2 connection and of each of its
    /// streams, reserved from both pre-slot budgets while it is open.
    pub h2_window: Option<ByteSize>,
    /// Subrequests one invocation may have in flight.
    pub max_concurrent_subrequests: Option<usize>,
    /// How long a name no Worker is deployed under is answered 404 without
    /// a store read.
    #[serde(default, with = "humantime_serde")]
    pub unknown_script_ttl: Option<Duration>,
    /// Names the negative cache of unknown script IDs holds at most.
    pub unknown_script_cache: Option<usize>,
    /// Times a request may have passed through hearth's egress (its
    /// `CDN-Loop`) and still be let in; past it, 508 before any slot.
    pub max_loop_passes: Option<usize>,
    // The keys these replace, read for this release only (see `legacy`,
    // which the next release deletes with these fields).
    pub(super) write_timeout_s: Option<u64>,
    pub(super) drain_timeout_s: Option<u64>,
    pub(super) body_idle_timeout_s: Option<u64>,
    pub(super) slot_wait_ms: Option<u64>,
    pub(super) instance_memory_mb: Option<u64>,
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
    /// Its RPC address: `IP:PORT`, or `NAME:PORT` resolved again every
    /// 10 s (a StatefulSet pod's stable DNS name).
    pub rpc: PeerAddr,
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
    /// RPC listener, also the address peers dial (may name environment
    /// variables, e.g. `"${POD_IP}:7000"`).
    pub rpc: ListenAddr,
    /// Directory holding the cluster CA and this node's certificate.
    pub pki: PathBuf,
    /// Gossip (UDP) address, if failure detection is wanted (may name
    /// environment variables).
    pub gossip: Option<ListenAddr>,
    /// The gossip address peers send to, when it is not `gossip` (behind
    /// NAT or a container's port mapping): datagrams to it must reach
    /// `gossip`. May name environment variables.
    pub gossip_advertise: Option<ListenAddr>,
    /// Gossip seeds: `IP:PORT`, or `NAME:PORT` for every address the name
    /// resolves to (a headless Service), resolved again every 10 s.
    #[serde(default)]
    pub seeds: Vec<PeerAddr>,
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
    pub fn gossip_key(&self) -> Result<Option<[u8; 32]>, NodeConfigError> {
        if self.gossip.is_none() {
            return Ok(None);
        }
        let Some(hex) = &self.gossip_key else {
            return Err(NodeConfigError::NoGossipKey { fresh: fresh_key() });
        };
        parse_key("cluster.gossip_key", hex).map(Some)
    }

    /// How this node joins: the section's settings, the gossip key checked,
    /// with `rpc_listener` already bound to [`ClusterSection::rpc`].
    pub fn join_config(
        &self,
        node_id: &str,
        rpc_listener: tokio::net::TcpListener,
    ) -> Result<JoinConfig, NodeConfigError> {
        let mut overload = OverloadConfig::default();
        if let Some(n) = self.max_in_flight_per_worker {
            overload.max_in_flight_per_worker = n;
        }
        if let Some(n) = self.max_in_flight_node {
            overload.max_in_flight_node = n;
        }
        let gossip = match &self.gossip {
            Some(g) => Some(g.addr("[cluster] gossip")?),
            None => None,
        };
        let gossip_advertise = match &self.gossip_advertise {
            Some(a) => Some(a.addr("[cluster] gossip_advertise")?),
            None => None,
        };
        Ok(JoinConfig {
            node_id: node_id.to_string(),
            rpc_listener,
            pki_dir: self.pki.clone(),
            gossip,
            gossip_advertise,
            seeds: self.seeds.clone(),
            static_nodes: self
                .nodes
                .iter()
                .map(|n| StaticMember {
                    id: n.id.as_str().into(),
                    addr: n.rpc.clone(),
                    weight: n.weight,
                })
                .collect(),
            weight: self.weight,
            gossip_key: self.gossip_key()?,
            overload,
        })
    }
}

/// A node's configuration file.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, remote = "Self")]
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
    /// PEM certificate chain of the admin API (leaf first): with
    /// `admin_tls_key`, the admin API is served over HTTPS only.
    pub admin_tls_cert: Option<PathBuf>,
    /// PEM private key of the admin API.
    pub admin_tls_key: Option<PathBuf>,
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
    /// Read store records that carry no MAC, written by a hearth from
    /// before records were signed (default false: refused); only while
    /// upgrading such a store (`hearth upgrade-store`).
    pub accept_unsigned_records: Option<bool>,
    /// Versions of each script kept on record, the latest ones (default
    /// 20); a deploy deletes older ones, except those serving.
    pub keep_versions: Option<usize>,
    /// Admin API token.
    pub admin_token: Option<String>,
    /// Who may read the admin API's `/metrics`: `"open"` (default) or
    /// `"token"` ([`crate::admin::MetricsAccess`]).
    pub admin_metrics: Option<crate::admin::MetricsAccess>,
    /// Memory budget for warm Workers.
    pub memory_budget: Option<ByteSize>,
    /// How long a Worker may stay warm without a request.
    #[serde(default, with = "humantime_serde")]
    pub idle_timeout: Option<Duration>,
    /// Sweep idle Workers only above this fraction of the memory budget.
    pub idle_sweep_above: Option<f64>,
    /// How many of the busiest Workers get their own `script` label in
    /// `/metrics` (the rest are `_other`); default 50.
    pub metrics_top_workers: Option<usize>,
    /// Plan limits.
    #[serde(default)]
    pub plans: Plans,
    /// What clients may hold.
    #[serde(default)]
    pub limits: ClientLimits,
    /// Workers' fetches of origins.
    #[serde(default)]
    pub egress: EgressSection,
    /// The live tail's byte budgets.
    #[serde(default)]
    pub live_tail: LiveTailSection,
    /// Durable Objects: the fence, objects resident, storage limits.
    #[serde(default)]
    pub objects: ObjectsSection,
    /// Cluster membership; absent for a standalone node.
    pub cluster: Option<ClusterSection>,
    /// OpenTelemetry export of request spans; absent, off.
    pub telemetry: Option<TelemetrySection>,
    // The keys these replace, read for this release only (see `legacy`,
    // which the next release deletes with these fields).
    pub(super) memory_budget_mb: Option<u64>,
    pub(super) idle_timeout_s: Option<u64>,
}

impl NodeConfig {
    /// Reads and parses `path`.
    pub fn load(path: &Path) -> Result<Self, NodeConfigError> {
        let text = std::fs::read_to_string(path).map_err(|error| NodeConfigError::Read {
            path: path.to_path_buf(),
            error,
        })?;
        toml::from_str(&text).map_err(|error| NodeConfigError::Parse {
            path: path.to_path_buf(),
            error,
        })
    }

    /// Applies the file's runtime settings to `cfg`.
    pub fn apply(&self, mut cfg: RuntimeConfig) -> RuntimeConfig {
        if let Some(accept) = self.accept_unsigned_records {
            cfg = cfg.accept_unsigned_records(accept);
        }
        if let Some(n) = self.keep_versions {
            cfg = cfg.keep_versions(n);
        }
        if let Some(size) = self.memory_budget {
            cfg = cfg.memory_budget(size.as_u64());
        }
        if let Some(f) = self.idle_sweep_above {
            cfg = cfg.idle_sweep_above(f);
        }
        if let Some(d) = self.idle_timeout {
            cfg = cfg.idle_timeout(d);
        }
        let c = &self.limits;
        if let Some(d) = c.body_idle_timeout {
            cfg = cfg.body_idle_timeout(d);
        }
        if let Some(d) = c.slot_wait {
            cfg = cfg.slot_wait(d);
        }
        if let Some(n) = c.max_in_flight {
            cfg = cfg.max_in_flight(n);
        }
        if let Some(size) = c.instance_memory {
            cfg = cfg.instance_memory_cap(size.as_u64());
        }
        if let Some(n) = c.max_concurrent_subrequests {
            cfg = cfg.max_concurrent_subrequests(n);
        }
        if let Some(d) = c.unknown_script_ttl {
            cfg = cfg.unknown_script_ttl(d);
        }
        if let Some(n) = c.unknown_script_cache {
            cfg = cfg.unknown_script_capacity(n);
        }
        if let Some(n) = c.max_loop_passes {
            cfg = cfg.max_loop_passes(n);
        }
        for (plan, o) in [
            (Plan::Free, &self.plans.free),
            (Plan::Paid, &self.plans.paid),
        ] {
            let mut l: PlanLimits = *cfg.limits(plan);
            if let Some(v) = o.max_script_size {
                l.max_script_size = v.as_u64();
            }
            if let Some(v) = o.startup_cpu {
                l.startup_cpu = v;
            }
            if let Some(v) = o.request_cpu {
                l.request_cpu = v;
            }
            if let Some(v) = o.request_wall {
                l.request_wall = v;
            }
            if let Some(v) = o.max_uncompressed_size {
                l.max_uncompressed_size = v.as_u64();
            }
            if let Some(v) = o.memory {
                l.memory = v.as_u64();
            }
            if let Some(v) = o.subrequests {
                l.subrequests = v;
            }
            cfg = cfg.plan_limits(plan, l);
        }
        let e = &self.egress;
        let mut egress = cfg.egress_config().clone();
        if let Some(v) = e.allow_private_addresses {
            egress.allow_private_addresses = v;
        }
        if let Some(v) = e.connect_timeout {
            egress.connect_timeout = v;
        }
        if let Some(v) = e.dns_timeout {
            egress.dns_timeout = v;
        }
        if let Some(v) = &e.dns_servers {
            egress.dns_servers = v.clone();
        }
        if let Some(v) = e.max_connections {
            egress.max_connections = v;
        }
        if let Some(v) = e.max_connections_per_worker {
            egress.max_connections_per_worker = v;
        }
        if let Some(v) = e.idle_timeout {
            egress.idle_timeout = v;
        }
        if let Some(v) = e.first_byte_timeout {
            egress.first_byte_timeout = v;
        }
        if let Some(v) = e.max_response_size {
            egress.max_response_size = v.as_u64();
        }
        egress.extra_roots.extend(e.loaded_roots.iter().cloned());
        let cfg = self.live_tail.apply(cfg.egress(egress));
        self.objects.apply(cfg)
    }

    /// The node's prewarm settings: the defaults with the file's.
    pub fn prewarm(&self) -> crate::prewarm::PrewarmConfig {
        let d = crate::prewarm::PrewarmConfig::default();
        crate::prewarm::PrewarmConfig {
            enabled: self.sni_prewarm.unwrap_or(d.enabled),
            max_concurrent: self.max_prewarms.unwrap_or(d.max_concurrent),
        }
    }

    /// The listeners' limits: the defaults with the file's `[limits]`,
    /// checked to work together.
    pub fn serve_limits(&self) -> Result<ServeLimits, NodeConfigError> {
        let d = ServeLimits::default();
        let c = &self.limits;
        let limits = ServeLimits {
            max_connections: c.max_connections.unwrap_or(d.max_connections),
            max_per_peer: c.max_connections_per_peer.unwrap_or(d.max_per_peer),
            write_timeout: c.write_timeout.unwrap_or(d.write_timeout),
            drain_timeout: c.drain_timeout.unwrap_or(d.drain_timeout),
            header_read_timeout: c.header_read_timeout.unwrap_or(d.header_read_timeout),
            h2_keep_alive: c.h2_keep_alive.unwrap_or(d.h2_keep_alive),
            max_pre_slot_bytes_per_connection: c
                .max_pre_slot_bytes_per_connection
                .map_or(d.max_pre_slot_bytes_per_connection, bytes_usize),
            max_pre_slot_bytes: c
                .max_pre_slot_bytes
                .map_or(d.max_pre_slot_bytes, bytes_usize),
            h2_window: c.h2_window.map_or(d.h2_window, |w| {
                u32::try_from(w.as_u64()).unwrap_or(u32::MAX)
            }),
        };
        limits.check()?;
        Ok(limits)
    }
}

/// A size from the config as a byte count in memory (saturating).
fn bytes_usize(size: ByteSize) -> usize {
    usize::try_from(size.as_u64()).unwrap_or(usize::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::test_support::args;

    #[test]
    fn the_example_with_every_key_parses_and_its_values_come_through() {
        let text = include_str!("../../docs/operator/hearth.toml");
        let c: NodeConfig = toml::from_str(text).expect("docs/operator/hearth.toml parses");
        assert_eq!(c.node_id.as_deref(), Some("node-1"));
        assert_eq!(c.listen, Some("127.0.0.1:8080".parse().expect("addr")));
        assert_eq!(c.store.as_deref(), Some("./hearth-store"));
        assert_eq!(
            c.keep_versions,
            Some(hearth_runtime::limits::DEFAULT_KEEP_VERSIONS)
        );
        assert_eq!(c.accept_unsigned_records, Some(false));
        assert_eq!(c.memory_budget, Some(ByteSize::gib(1)));
        assert_eq!(c.idle_timeout, Some(Duration::from_secs(300)));
        assert_eq!(c.limits.max_connections, Some(4096));
        assert_eq!(c.limits.instance_memory, Some(ByteSize::gib(8)));
        assert_eq!(c.limits.slot_wait, Some(Duration::from_secs(2)));
        assert_eq!(c.limits.unknown_script_cache, Some(16384));
        assert_eq!(c.limits.max_loop_passes, Some(8));
        assert_eq!(c.limits.h2_window, Some(ByteSize::b(65_535)));
        let cluster = c.cluster.as_ref().expect("[cluster]");
        assert_eq!(
            cluster.rpc,
            ListenAddr::Addr("127.0.0.1:7000".parse().expect("addr"))
        );
        assert_eq!(
            cluster.gossip_advertise,
            Some(ListenAddr::Addr("203.0.113.7:7001".parse().expect("addr")))
        );
        assert_eq!(cluster.nodes.len(), 1);
        assert_eq!(cluster.nodes[0].id, "node-2");
        assert_eq!(cluster.max_in_flight_node, Some(1024));
        let s3 = c.s3.as_ref().expect("[s3]");
        assert_eq!(s3.region.as_deref(), Some("garage"));
        assert_eq!(s3.timeout, Some(Duration::from_secs(5)));
        assert_eq!(
            c.egress.extra_roots,
            vec![PathBuf::from("/etc/hearth/origin-ca.pem")]
        );
        assert_eq!(c.egress.dns_timeout, Some(Duration::from_secs(5)));
        assert_eq!(c.egress.dns_servers, Some(Vec::new()));
        assert_eq!(
            (
                c.egress.max_connections,
                c.egress.max_connections_per_worker
            ),
            (Some(1024), Some(128))
        );
        assert_eq!(c.egress.idle_timeout, Some(Duration::from_secs(10)));
        assert_eq!(c.live_tail.max_node_bytes, Some(ByteSize::mib(32)));
        let telemetry = c.telemetry.as_ref().expect("[telemetry]");
        assert_eq!(telemetry.service_name.as_deref(), Some("hearth"));
        let free = &c.plans.free;
        assert_eq!(free.startup_cpu, Some(Duration::from_millis(400)));
        assert_eq!(free.subrequests, Some(50));
        // Its secrets are placeholders a node refuses.
        assert!(matches!(
            c.check_secrets(),
            Err(NodeConfigError::ExampleSecret { .. })
        ));
    }

    #[test]
    fn telemetry_is_off_unless_its_section_is_given() {
        let c: NodeConfig = toml::from_str("node_id = \"n\"").expect("parses");
        assert!(c.telemetry.is_none(), "off by default");
        let c: NodeConfig = toml::from_str(
            "[telemetry]\nendpoint = \"http://127.0.0.1:4318/v1/traces\"\n\
             sample_ratio = 0.25\nexport_interval = \"200ms\"\nmax_queue = 10",
        )
        .expect("parses");
        let t = c.telemetry.expect("[telemetry]").config().expect("valid");
        assert_eq!(t.endpoint, "http://127.0.0.1:4318/v1/traces");
        assert_eq!(t.service_name, "hearth");
        assert_eq!(t.sample_ratio, 0.25);
        assert_eq!(t.export_interval, Duration::from_millis(200));
        assert_eq!(t.max_queue, 10);
        let c: NodeConfig =
            toml::from_str("[telemetry]\nendpoint = \"http://x/v1/traces\"\nsample_ratio = 2.0")
                .expect("parses");
        assert!(c.telemetry.expect("[telemetry]").config().is_err());
        assert!(toml::from_str::<NodeConfig>("[telemetry]\nsample_ratio = 1.0").is_err());
    }

    #[test]
    fn egress_settings_and_fetches_per_request_reach_the_runtime() {
        let c: NodeConfig = toml::from_str(
            "[egress]\nallow_private_addresses = true\nconnect_timeout = \"2s\"\n\
             first_byte_timeout = \"5s\"\nmax_response_size = \"1MiB\"\n\
             dns_timeout = \"1s\"\ndns_servers = [\"127.0.0.1:5353\"]\n\
             max_connections = 64\nmax_connections_per_worker = 8\nidle_timeout = \"3s\"\n\
             [plans.free]\nsubrequests = 7\n",
        )
        .expect("[egress]");
        let cfg = c.apply(RuntimeConfig::new("/tmp/hearth-egress-config"));
        let e = cfg.egress_config();
        assert!(e.allow_private_addresses);
        assert_eq!(e.connect_timeout, Duration::from_secs(2));
        assert_eq!(e.first_byte_timeout, Duration::from_secs(5));
        assert_eq!(e.max_response_size, 1 << 20);
        assert_eq!(e.dns_timeout, Duration::from_secs(1));
        assert_eq!(
            e.dns_servers,
            vec![
                "127.0.0.1:5353"
                    .parse::<std::net::SocketAddr>()
                    .expect("addr")
            ]
        );
        assert_eq!((e.max_connections, e.max_connections_per_worker), (64, 8));
        assert_eq!(e.idle_timeout, Duration::from_secs(3));
        assert_eq!(cfg.limits(Plan::Free).subrequests, 7);
        assert_eq!(cfg.limits(Plan::Paid).subrequests, 1000);
        let default = NodeConfig::default().apply(RuntimeConfig::new("/tmp/hearth-egress-config"));
        assert!(!default.egress_config().allow_private_addresses);
        assert!(toml::from_str::<NodeConfig>("[egress]\nallow_private = true\n").is_err());
    }

    #[test]
    fn live_tail_budgets_reach_the_runtime() {
        let c: NodeConfig = toml::from_str(
            "[live_tail]\nmax_event_bytes = \"128KiB\"\nmax_queue_bytes = \"1MiB\"\n\
             max_node_bytes = \"8MiB\"\n",
        )
        .expect("[live_tail]");
        let cfg = c.apply(RuntimeConfig::new("/tmp/hearth-live-tail-config"));
        let b = cfg.tail_budget_config();
        assert_eq!(
            (b.event_bytes, b.queue_bytes, b.node_bytes),
            (128 << 10, 1 << 20, 8 << 20)
        );
        let default =
            NodeConfig::default().apply(RuntimeConfig::new("/tmp/hearth-live-tail-config"));
        assert_eq!(
            *default.tail_budget_config(),
            hearth_runtime::outbound::live_tail::TailBudget::default()
        );
        assert!(toml::from_str::<NodeConfig>("[live_tail]\nqueue_bytes = 1\n").is_err());
    }

    #[test]
    fn the_objects_section_reaches_the_runtime_and_is_checked() {
        use hearth_runtime::objects::{ObjectFence, ObjectsConfig};
        let c: NodeConfig = toml::from_str(
            "[objects]\netcd = [\"http://10.0.0.5:2379\"]\nmax_resident = 3\n\
             ops_per_request = 50\nmax_object_bytes = \"1MiB\"\n",
        )
        .expect("[objects]");
        c.objects.check().expect("usable");
        let cfg = c.apply(RuntimeConfig::new("/tmp/hearth-objects-config"));
        assert_eq!(
            *cfg.objects_config(),
            ObjectsConfig {
                fence: ObjectFence::Etcd(vec!["http://10.0.0.5:2379".into()]),
                max_resident: 3,
                ops_per_request: 50,
                max_object_bytes: 1 << 20,
            }
        );
        let default = NodeConfig::default().apply(RuntimeConfig::new("/tmp/hearth-objects-config"));
        assert_eq!(*default.objects_config(), ObjectsConfig::default());
        let both: NodeConfig =
            toml::from_str("[objects]\nfence = \"/f.sqlite\"\netcd = [\"http://e:2379\"]\n")
                .expect("parses");
        let err = both.objects.check().expect_err("two fences");
        assert!(err.to_string().contains("not both"), "{err}");
        assert!(toml::from_str::<NodeConfig>("[objects]\nmax_residents = 1\n").is_err());
    }

    #[test]
    fn egress_extra_roots_are_read_at_start_and_a_bad_file_is_named() {
        let dir = tempfile::tempdir().expect("tempdir");
        let key = rcgen::KeyPair::generate().expect("key");
        let ca = rcgen::CertificateParams::new(vec!["origin.test".to_string()])
            .expect("params")
            .self_signed(&key)
            .expect("cert");
        let pem = dir.path().join("origin-ca.pem");
        std::fs::write(&pem, ca.pem()).expect("write pem");
        let not_pem = dir.path().join("not.pem");
        std::fs::write(&not_pem, "hello\n").expect("write");
        let config = |roots: &[&Path]| {
            let path = dir.path().join("node.toml");
            let list: Vec<String> = roots
                .iter()
                .map(|p| format!("{:?}", p.display().to_string()))
                .collect();
            std::fs::write(
                &path,
                format!("[egress]\nextra_roots = [{}]\n", list.join(", ")),
            )
            .expect("write config");
            args(Some(&path)).resolve()
        };

        let served = config(&[&pem]).expect("a CA file");
        let runtime = served
            .settings
            .apply(RuntimeConfig::new("/tmp/hearth-egress-roots"));
        assert_eq!(runtime.egress_config().extra_roots, vec![ca.der().clone()]);

        for bad in [not_pem.as_path(), &dir.path().join("missing.pem")] {
            let err = config(&[&pem, bad]).expect_err("not a CA file").to_string();
            assert!(err.starts_with("[egress] extra_roots: "), "{err}");
            assert!(err.contains(&bad.display().to_string()), "{err}");
        }
    }

    #[test]
    fn durations_and_sizes_are_written_with_their_units() {
        let c: NodeConfig = toml::from_str(
            "memory_budget = \"512MiB\"\nidle_timeout = \"90s\"\n\
             [limits]\nwrite_timeout = \"5s\"\ndrain_timeout = \"1m\"\nbody_idle_timeout = \"2s\"\n\
             slot_wait = \"250ms\"\ninstance_memory = \"2GiB\"\n\
             [s3]\ntimeout = \"1500ms\"\n\
             [plans.paid]\nmax_script_size = \"10MiB\"\nstartup_cpu = \"400ms\"\nrequest_cpu = \"30s\"\n\
             request_wall = \"1m\"\nmemory = \"128MiB\"\nmax_uncompressed_size = 67108864\n",
        )
        .expect("config with units");
        assert_eq!(c.memory_budget, Some(ByteSize::mib(512)));
        assert_eq!(c.idle_timeout, Some(Duration::from_secs(90)));
        let l = &c.limits;
        assert_eq!(l.write_timeout, Some(Duration::from_secs(5)));
        assert_eq!(l.drain_timeout, Some(Duration::from_secs(60)));
        assert_eq!(l.body_idle_timeout, Some(Duration::from_secs(2)));
        assert_eq!(l.slot_wait, Some(Duration::from_millis(250)));
        assert_eq!(l.instance_memory, Some(ByteSize::gib(2)));
        let s3 = c.s3.as_ref().expect("[s3]");
        assert_eq!(s3.timeout, Some(Duration::from_millis(1500)));
        let p = &c.plans.paid;
        assert_eq!(p.max_script_size, Some(ByteSize::mib(10)));
        assert_eq!(p.startup_cpu, Some(Duration::from_millis(400)));
        assert_eq!(p.request_cpu, Some(Duration::from_secs(30)));
        assert_eq!(p.request_wall, Some(Duration::from_secs(60)));
        assert_eq!(p.memory, Some(ByteSize::mib(128)));
        assert_eq!(
            p.max_uncompressed_size,
            Some(ByteSize::mib(64)),
            "bare bytes"
        );
        let limits = c.serve_limits().expect("limits");
        assert_eq!(limits.write_timeout, Duration::from_secs(5));
        assert_eq!(limits.drain_timeout, Duration::from_secs(60));

        for bad in [
            "idle_timeout = \"ten seconds\"\n",
            "idle_timeout = 10\n",
            "memory_budget = \"lots\"\n",
            "[plans.free]\nrequest_cpu = \"fast\"\n",
        ] {
            assert!(toml::from_str::<NodeConfig>(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn every_listener_and_runtime_limit_can_be_set_in_the_file() {
        let c: NodeConfig = toml::from_str(
            "[limits]\nheader_read_timeout = \"3s\"\nh2_keep_alive = \"20s\"\n\
             max_pre_slot_bytes_per_connection = \"256KiB\"\nmax_pre_slot_bytes = \"8MiB\"\n\
             max_concurrent_subrequests = 3\nunknown_script_ttl = \"2s\"\n\
             unknown_script_cache = 100\nmax_loop_passes = 4\nh2_window = \"128KiB\"\n",
        )
        .expect("config");
        let limits = c.serve_limits().expect("limits");
        assert_eq!(limits.h2_window, 128 << 10);
        assert_eq!(limits.header_read_timeout, Duration::from_secs(3));
        assert_eq!(limits.h2_keep_alive, Duration::from_secs(20));
        assert_eq!(limits.max_pre_slot_bytes_per_connection, 256 << 10);
        assert_eq!(limits.max_pre_slot_bytes, 8 << 20);
        // The runtime's settings are private; its Debug form shows them.
        let rt = format!("{:?}", c.apply(RuntimeConfig::new("/tmp/unused")));
        for field in [
            "max_concurrent_subrequests: 3",
            "miss_ttl: 2s",
            "miss_capacity: 100",
            "max_loop_passes: 4",
        ] {
            assert!(rt.contains(field), "{field} not in {rt}");
        }
        // Unset, each keeps its default.
        let d = NodeConfig::default().serve_limits().expect("defaults");
        assert_eq!(
            d.header_read_timeout,
            ServeLimits::default().header_read_timeout
        );
        assert_eq!(
            d.max_pre_slot_bytes,
            ServeLimits::default().max_pre_slot_bytes
        );
        assert!(toml::from_str::<NodeConfig>("[limits]\nh2_keep_alive = 10\n").is_err());
        assert_eq!(d.h2_window, ServeLimits::default().h2_window);
    }

    #[test]
    fn an_h2_window_the_protocol_or_the_connection_budget_cannot_hold_is_refused() {
        for (text, why) in [
            ("h2_window = \"16KiB\"\n", "under HTTP/2's initial window"),
            ("h2_window = \"4GiB\"\n", "over HTTP/2's largest window"),
            (
                "h2_window = \"512KiB\"\nmax_pre_slot_bytes_per_connection = \"256KiB\"\n",
                "over the budget it is reserved from",
            ),
        ] {
            let c: NodeConfig = toml::from_str(&format!("[limits]\n{text}")).expect("parses");
            let err = c.serve_limits().expect_err(why).to_string();
            assert!(err.contains("h2_window"), "{why}: {err}");
            assert!(err.contains("max_pre_slot_bytes_per_connection"), "{err}");
        }
    }

    #[test]
    fn join_config_carries_the_cluster_section() {
        let c: NodeConfig = toml::from_str(
            "[cluster]\nrpc = \"127.0.0.1:7000\"\npki = \"./pki\"\nweight = 2\n\
             nodes = [{ id = \"node-2\", rpc = \"127.0.0.1:7100\", weight = 3 }]\n\
             max_in_flight_node = 9\n",
        )
        .expect("config");
        let section = c.cluster.expect("[cluster]");
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        let join = rt
            .block_on(async {
                let l = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
                Ok::<_, std::io::Error>(section.join_config("node-1", l))
            })
            .expect("bind")
            .expect("join config");
        assert_eq!(join.node_id, "node-1");
        assert_eq!(join.weight, 2);
        assert_eq!(join.gossip_key, None, "no gossip, no key");
        assert_eq!(join.static_nodes.len(), 1);
        assert_eq!(join.static_nodes[0].weight, 3);
        assert_eq!(join.overload.max_in_flight_node, 9);
        assert_eq!(
            join.overload.max_in_flight_per_worker,
            OverloadConfig::default().max_in_flight_per_worker
        );
    }
}
