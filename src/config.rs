//! The configuration of `hearth serve`: a TOML file (every field
//! optional) and flags over it, resolved in one step by
//! [`ServeArgs::resolve`] into the [`ServeConfig`] the node runs with.
//!
//! Durations are strings with a unit (`"10s"`, `"250ms"`, `"5m"`, read by
//! `humantime`), sizes are strings with a unit (`"128MiB"`, `"8GiB"`; KiB,
//! MiB and GiB are powers of 1024, KB, MB and GB powers of 1000) or a bare
//! number of bytes. The keys that carried their unit in the name before
//! (`idle_timeout_s`, `memory_budget_mb`, `write_timeout_s`,
//! `drain_timeout_s`, `body_idle_timeout_s`, `slot_wait_ms`,
//! `instance_memory_mb`, `[s3] timeout_ms`) and a plan's time limits as bare
//! milliseconds are still read for this release, each with a warning that
//! names what to write instead; a file that sets an old key and its new
//! one is refused.
//!
//! Secrets (`artifact_key`, `[cluster] gossip_key`, `admin_token`) are each
//! node's own or its cluster's: a node refuses to start with a value
//! hearth's documentation prints ([`SECRET_PLACEHOLDER`], or an example
//! value shipped before) or an admin token shorter than
//! [`MIN_ADMIN_TOKEN_BYTES`], and offers a fresh one
//! ([`NodeConfig::check_secrets`]). The admin API is plain HTTP unless
//! `admin_tls_cert` and `admin_tls_key` are set (then HTTPS only): keep
//! `admin` on loopback (the default) or a private network either way. Give
//! each node only its own certificate and key from `hearth pki` (and the
//! CA certificate `ca.pem`), never the CA's key `ca-key.pem`: whoever holds
//! that can make certificates for any node ID.
//!
//! One file can serve every node of a cluster (the pods `hearth-0…N` of a
//! Kubernetes StatefulSet): `node_id` and the `[cluster]` `rpc` and
//! `gossip` addresses may name environment variables (`$HOSTNAME`,
//! `${POD_IP}`), expanded when the node starts ([`expand_env`]), and seeds
//! and static members may be DNS names (`hearth.default.svc:7001`),
//! resolved again every 10 s ([`hearth_sharding::membership::PeerAddr`]).
//!
//! ```toml
//! node_id = "node-1"          # or "$HOSTNAME" (or --node-id)
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
//! artifact_key = "REPLACE-ME" # 64 hex digits; required with an s3:// store,
//!                            #   the same on every node; a directory store
//!                            #   keeps it in the store
//! keep_versions = 20         # versions of each Worker kept on record
//! accept_unsigned_records = false # true only while upgrading a store
//!                            #   written before records were signed
//! admin_token = "REPLACE-ME" # at least 32 bytes; generated and saved in the
//!                            #   store if absent
//! admin_tls_cert = "./pki/node-1.pem"     # admin API over HTTPS only (else
//! admin_tls_key = "./pki/node-1-key.pem"  #   plain HTTP); e.g. the node's own
//!                            #   certificate from `hearth pki`
//! memory_budget = "1GiB"     # warm Workers, all together
//! idle_timeout = "5m"        # a Worker idle this long may be swept
//! idle_sweep_above = 0.9     # sweep idle Workers only above 90% of the budget
//! metrics_top_workers = 50   # Workers with their own `script` label in /metrics
//!
//! [limits]                   # what clients may hold (defaults shown)
//! max_connections = 4096     # open at once on each listener
//! max_connections_per_peer = 256
//! write_timeout = "30s"      # a client that stops reading is closed
//! drain_timeout = "30s"      # Ctrl-C: in-flight requests get this long
//! body_idle_timeout = "10s"  # a request body that stalls this long fails
//! slot_wait = "2s"           # then 503 + retry-after
//! max_in_flight = 256        # instances serving at once on the node
//! instance_memory = "8GiB"   # memory all live instances may hold together
//! header_read_timeout = "10s" # request head, TLS handshake, idle HTTP/2
//!                            #   connection; also the keep-alive idle timeout
//! h2_keep_alive = "10s"      # HTTP/2 PING after this long without a frame
//! max_pre_slot_bytes_per_connection = "1MiB" # body bytes held before a slot
//! max_pre_slot_bytes = "64MiB"  # the same, every front door together
//! max_concurrent_subrequests = 6 # one invocation's subrequests in flight
//! unknown_script_ttl = "5s"  # a name not deployed: 404 without a store read
//! unknown_script_cache = 16384 # names remembered as not deployed
//!
//! [cluster]                  # optional: join a cluster
//! rpc = "127.0.0.1:7000"     # shard server; the address peers dial ("${POD_IP}:7000")
//! pki = "./pki"              # ca.pem, <node_id>.pem, <node_id>-key.pem (`hearth pki`)
//! gossip = "127.0.0.1:7001"  # SWIM failure detection (optional)
//! seeds = ["127.0.0.1:7101"] # gossip addresses to join through; IP:PORT or
//!                            #   NAME:PORT (every address NAME resolves to)
//! weight = 1
//! gossip_key = "REPLACE-ME"  # 64 hex digits; required with gossip, the same
//!                            #   on every node
//! nodes = [{ id = "node-2", rpc = "127.0.0.1:7100" }]   # static members (rpc may be NAME:PORT)
//! max_in_flight_per_worker = 64
//! max_in_flight_node = 1024
//!
//! [s3]                       # with an s3:// store; unset fields come from the
//! endpoint = "http://127.0.0.1:3900"   # standard AWS_* environment variables
//! region = "garage"
//! access_key_id = "GK…"
//! secret_access_key = "…"
//! allow_http = true          # a plain-HTTP endpoint
//! timeout = "5s"             # one call; then a clear error
//! max_retries = 2
//!
//! [egress]                   # Workers' fetches of allowed origins
//! allow_private_addresses = false  # loopback, RFC 1918, ULA, link-local,
//!                            #   metadata: refused unless true (tests)
//! connect_timeout = "10s"    # DNS, then TCP connect
//! first_byte_timeout = "30s" # request sent -> response head
//! max_response_size = "32MiB"
//! extra_roots = ["/etc/hearth/origin-ca.pem"]  # CAs trusted beside the
//!                            #   Mozilla roots (origins of a private CA)
//!
//! [telemetry]                # OpenTelemetry span export (OTLP/HTTP); off if absent
//! endpoint = "http://127.0.0.1:4318/v1/traces"  # the collector's traces URL
//! service_name = "hearth"    # the spans' service.name
//! sample_ratio = 1.0         # traces this node starts that are recorded; a
//!                            #   client's traceparent decides for its own
//! max_queue = 2048           # spans waiting for export; more are dropped
//! export_interval = "1s"     # a batch is sent at least this often
//!
//! [plans.free]               # any field of a plan may be given
//! max_script_size = "3MiB"   # gzip-compressed
//! startup_cpu = "400ms"      # CPU time of instantiation
//! request_cpu = "30s"        # CPU time per request
//! request_wall = "60s"       # wall clock per request
//! memory = "128MiB"          # per instance
//! max_uncompressed_size = "32MiB"  # as uploaded
//! subrequests = 50           # origin fetches per request (paid: 1000)
//! ```

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use bytesize::ByteSize;
use serde::Deserialize;

use hearth_runtime::{
    DirStore, Plan, PlanLimits, RuntimeConfig, S3Settings, S3Store, ScriptStore, StoreError,
};
use hearth_sharding::admission::OverloadConfig;
use hearth_sharding::membership::{PeerAddr, StaticMember};

use crate::cluster::JoinConfig;
use crate::listener::ServeLimits;

/// Where `hearth serve` takes Worker traffic unless told otherwise.
pub const DEFAULT_LISTEN: SocketAddr =
    SocketAddr::new(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST), 8080);
/// Where `hearth serve` answers the admin API unless told otherwise.
pub const DEFAULT_ADMIN: SocketAddr =
    SocketAddr::new(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST), 8081);
/// The script store of `hearth serve` unless told otherwise.
pub const DEFAULT_STORE: &str = "hearth-store";
/// The node ID of `hearth serve` unless told otherwise.
pub const DEFAULT_NODE_ID: &str = "node-1";

/// What hearth's documentation writes where a secret goes (`artifact_key`,
/// `gossip_key`, `admin_token`): a node refuses to start with it.
pub const SECRET_PLACEHOLDER: &str = "REPLACE-ME";

/// The shortest admin token a node accepts, in bytes: the admin API can
/// deploy code, and a short token can be guessed over the network.
pub const MIN_ADMIN_TOKEN_BYTES: usize = 32;

/// Secret values hearth's documentation has printed: the placeholder, and
/// the example keys and token that `docs/operator/*.toml` shipped before
/// they became placeholders. Anyone who has read the docs knows them, so a
/// node refuses them ([`NodeConfig::check_secrets`]).
const EXAMPLE_SECRETS: &[&str] = &[
    SECRET_PLACEHOLDER,
    "change-me",
    "9c1f5e0b7a3d4c2e8f6a1b0d9e7c5a3f2b4d6e8a0c1e3f5a7b9d1f3e5a7c9e1b",
    "3e8d1c6b2a9f4e7d0c5b8a3f6e1d4c9b7a2f5e0d3c8b6a1f4e9d2c7b5a0f3e8d",
];

/// Why a node's configuration cannot be used. Each message names the file
/// or setting and says what to do; a cause is in the message, not also a
/// `source` (which would print it twice in an error chain).
#[derive(Debug, thiserror::Error)]
pub enum NodeConfigError {
    /// A CA file of `[egress] extra_roots` is not usable (the error names
    /// the file).
    #[error("[egress] extra_roots: {0}")]
    EgressRoot(crate::https::HttpsError),
    /// The `[telemetry]` section is not usable.
    #[error("[telemetry] {0}")]
    Telemetry(String),
    /// The config file could not be read.
    #[error("cannot read config {}: {error}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        error: std::io::Error,
    },
    /// The config file is not valid TOML for a node.
    #[error("invalid config {}: {error}", path.display())]
    Parse {
        /// The file.
        path: PathBuf,
        /// Where and why.
        error: toml::de::Error,
    },
    /// Gossip is on but no key is given.
    #[error(
        "[cluster] turns gossip on but gives no gossip_key. Nodes with different \
         keys never hear each other, and each would serve every Worker alone. Put \
         the same key in the [cluster] section of every node, for example this \
         fresh one:\n    gossip_key = \"{fresh}\""
    )]
    NoGossipKey {
        /// A fresh key to offer.
        fresh: String,
    },
    /// An S3 store is given without the shared artifact key.
    #[error(
        "store = \"{location}\" shares precompiled artifacts between nodes, so every \
         node needs the same artifact_key (nodes with different keys refuse each \
         other's artifacts). Put the same key in every node's config, for example \
         this fresh one:\n    artifact_key = \"{fresh}\""
    )]
    NoArtifactKey {
        /// The store's location.
        location: String,
        /// A fresh key to offer.
        fresh: String,
    },
    /// A secret setting holds a value printed in hearth's documentation.
    #[error(
        "{setting} is an example value from hearth's documentation, which anyone can read: \
         with it, whoever has read the docs could {risk}. Put a secret of your own in its \
         place{scope}, for example this freshly generated one:\n    {key} = \"{fresh}\""
    )]
    ExampleSecret {
        /// Where the setting is, e.g. `[cluster] gossip_key`.
        setting: &'static str,
        /// The key to write the fresh value under.
        key: &'static str,
        /// What the secret protects.
        risk: &'static str,
        /// Which nodes must share it, if any.
        scope: &'static str,
        /// A fresh value to offer.
        fresh: String,
    },
    /// The admin token is too short to resist guessing.
    #[error(
        "admin_token is {len} bytes long; it must be at least {MIN_ADMIN_TOKEN_BYTES} bytes, \
         since a short token can be guessed over the network. Use for example this freshly \
         generated one:\n    admin_token = \"{fresh}\""
    )]
    ShortAdminToken {
        /// Its length in bytes.
        len: usize,
        /// A fresh token to offer.
        fresh: String,
    },
    /// A key setting is not 64 hex digits.
    #[error("{setting} must be 64 hex digits (32 bytes)")]
    BadKey {
        /// The setting, e.g. `artifact_key`.
        setting: &'static str,
    },
    /// A certificate is given but no HTTPS listener.
    #[error("tls_cert and tls_key need tls_listen (--tls-listen ADDR) to serve HTTPS")]
    TlsWithoutListen,
    /// Only one of certificate and key is given.
    #[error("give both tls_cert and tls_key (--tls-cert, --tls-key), or neither")]
    TlsHalfPair,
    /// Only one of the admin API's certificate and key is given.
    #[error(
        "give both admin_tls_cert and admin_tls_key (--admin-tls-cert, --admin-tls-key), or neither"
    )]
    AdminTlsHalfPair,
    /// A store secret or its directory could not be created.
    #[error("cannot create {}: {error}", path.display())]
    Create {
        /// The file or directory.
        path: PathBuf,
        /// Why.
        error: std::io::Error,
    },
    /// A store secret is not 64 hex digits.
    #[error("corrupt secret in {}: {reason} (expected 64 hex digits)", path.display())]
    CorruptSecret {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// A store secret exists but cannot be read.
    #[error("cannot read secret {}: {error}", path.display())]
    ReadSecret {
        /// The file.
        path: PathBuf,
        /// Why.
        error: std::io::Error,
    },
    /// Another node created a secret and it was gone when read.
    #[error("{} vanished while it was created", path.display())]
    SecretVanished {
        /// The file.
        path: PathBuf,
    },
    /// The data directory of an S3-backed node could not be created.
    #[error("cannot create data directory {}: {error}", path.display())]
    DataDir {
        /// The directory.
        path: PathBuf,
        /// Why.
        error: std::io::Error,
    },
    /// The script store could not be opened.
    #[error("cannot open script store: {0}")]
    OpenStore(StoreError),
    /// The script store answered its first call with an error.
    #[error("cannot use the script store: {0}")]
    UseStore(StoreError),
    /// A setting names an environment variable that is not set.
    #[error(
        "{setting} = \"{value}\" names the environment variable {name}, which is not set \
         (export it, e.g. `export {name}`, or write the value itself)"
    )]
    UnsetVariable {
        /// The setting, e.g. `node_id`.
        setting: &'static str,
        /// Its value as written.
        value: String,
        /// The variable.
        name: String,
    },
    /// A node ID (after expanding variables) cannot name a node.
    #[error(
        "{setting} = \"{value}\" gives the node ID \"{id}\", which cannot name a node: use \
         lowercase letters, digits, '-' and '_' (dot-separated labels, at most 63 bytes), \
         e.g. a Kubernetes pod name such as hearth-0"
    )]
    BadNodeId {
        /// Where it came from: `node_id` or `--node-id`.
        setting: &'static str,
        /// As written.
        value: String,
        /// As expanded.
        id: String,
    },
    /// An address (after expanding variables) is not an IP address and port.
    #[error("{setting} = \"{value}\" expands to \"{expanded}\", which is not an IP:PORT address")]
    BadAddress {
        /// The setting, e.g. `[cluster] rpc`.
        setting: &'static str,
        /// As written.
        value: String,
        /// As expanded.
        expanded: String,
    },
}

/// `hearth serve`'s flags. Each overrides the same setting of the
/// `--config` file; [`ServeArgs::resolve`] makes the one [`ServeConfig`]
/// the node runs with.
#[derive(Debug, Default, Clone, clap::Args)]
pub struct ServeArgs {
    /// This node's ID on the ring (and the name of its cluster
    /// certificate); overrides the config's node_id, e.g.
    /// `--node-id "$(hostname)"`.
    #[arg(long)]
    pub node_id: Option<String>,
    /// Address for Worker traffic (routed by the first label of Host).
    #[arg(long)]
    pub listen: Option<SocketAddr>,
    /// Address of the admin API (deploys, stats, /metrics).
    #[arg(long)]
    pub admin: Option<SocketAddr>,
    /// Script store: a directory, or s3://bucket/prefix (with the
    /// config's `[s3]` section or the AWS_* environment variables).
    #[arg(long)]
    pub store: Option<String>,
    /// Address for HTTPS Worker traffic (HTTP/2 or HTTP/1.1 by ALPN).
    /// A ClientHello's SNI starts warming the Worker it names.
    #[arg(long)]
    pub tls_listen: Option<SocketAddr>,
    /// PEM certificate chain for --tls-listen (leaf first); without
    /// it, a development certificate for localhost and *.localhost is
    /// made in the store.
    #[arg(long, requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// PEM private key for --tls-cert.
    #[arg(long, requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// PEM certificate chain (leaf first) to serve the admin API over
    /// HTTPS with, e.g. this node's certificate from `hearth pki`;
    /// without it the admin API is plain HTTP.
    #[arg(long, requires = "admin_tls_key")]
    pub admin_tls_cert: Option<PathBuf>,
    /// PEM private key for --admin-tls-cert.
    #[arg(long, requires = "admin_tls_cert")]
    pub admin_tls_key: Option<PathBuf>,
    /// Do not prewarm Workers from the TLS ClientHello's SNI.
    #[arg(long)]
    pub no_sni_prewarm: bool,
    /// TOML config file (flags override it).
    #[arg(long)]
    pub config: Option<PathBuf>,
}

/// What `hearth serve` runs with: the file and the flags resolved in one
/// step, every default filled in and every pairing checked.
#[derive(Debug)]
pub struct ServeConfig {
    /// The node's ID on the ring (default [`DEFAULT_NODE_ID`]).
    pub node_id: String,
    /// Worker traffic (default [`DEFAULT_LISTEN`]).
    pub listen: SocketAddr,
    /// The admin API (default [`DEFAULT_ADMIN`]).
    pub admin: SocketAddr,
    /// The script store: a directory or `s3://bucket/prefix` (default
    /// [`DEFAULT_STORE`]).
    pub store: String,
    /// The HTTPS front door, if any.
    pub tls: Option<TlsConfig>,
    /// The admin API's certificate chain and key (PEM files): it serves
    /// HTTPS only, if given; plain HTTP otherwise.
    pub admin_tls: Option<(PathBuf, PathBuf)>,
    /// The file's other settings, with the flags' over them: runtime and
    /// client limits, prewarm, cluster, S3, admin token. The settings
    /// resolved into the fields above are taken out of it.
    pub settings: NodeConfig,
}

/// The HTTPS front door of [`ServeConfig`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsConfig {
    /// Its address.
    pub listen: SocketAddr,
    /// Certificate chain and private key (PEM files); `None`: a development
    /// certificate for `localhost` and `*.localhost`, made in the store.
    pub cert: Option<(PathBuf, PathBuf)>,
}

impl ServeArgs {
    /// Loads `--config` (if given), lays the flags over it and fills in
    /// the defaults: the one config `hearth serve` runs with.
    pub fn resolve(self) -> Result<ServeConfig, NodeConfigError> {
        let mut file = match &self.config {
            Some(path) => NodeConfig::load(path)?,
            None => NodeConfig::default(),
        };
        file.expand_secrets()?;
        file.check_secrets()?;
        file.egress.load_roots()?;
        let node_id = match self.node_id {
            Some(id) => node_id("--node-id", &id)?,
            None => match file.node_id.take() {
                Some(id) => node_id("node_id", &id)?,
                None => DEFAULT_NODE_ID.into(),
            },
        };
        if let Some(c) = file.cluster.as_mut() {
            c.rpc.expand("[cluster] rpc")?;
            if let Some(g) = c.gossip.as_mut() {
                g.expand("[cluster] gossip")?;
            }
        }
        if self.no_sni_prewarm {
            file.sni_prewarm = Some(false);
        }
        // A certificate given by flags replaces the file's pair whole.
        let (cert, key) = match self.tls_cert {
            Some(cert) => (Some(cert), self.tls_key),
            None => (file.tls_cert.take(), file.tls_key.take()),
        };
        let tls = match (self.tls_listen.or(file.tls_listen.take()), cert, key) {
            (None, None, None) => None,
            (None, _, _) => return Err(NodeConfigError::TlsWithoutListen),
            (Some(listen), None, None) => Some(TlsConfig { listen, cert: None }),
            (Some(listen), Some(cert), Some(key)) => Some(TlsConfig {
                listen,
                cert: Some((cert, key)),
            }),
            (Some(_), _, _) => return Err(NodeConfigError::TlsHalfPair),
        };
        let admin_tls = match self.admin_tls_cert {
            Some(cert) => (Some(cert), self.admin_tls_key),
            None => (file.admin_tls_cert.take(), file.admin_tls_key.take()),
        };
        let admin_tls = match admin_tls {
            (None, None) => None,
            (Some(cert), Some(key)) => Some((cert, key)),
            _ => return Err(NodeConfigError::AdminTlsHalfPair),
        };
        Ok(ServeConfig {
            admin_tls,
            node_id,
            listen: self.listen.or(file.listen.take()).unwrap_or(DEFAULT_LISTEN),
            admin: self.admin.or(file.admin.take()).unwrap_or(DEFAULT_ADMIN),
            store: self
                .store
                .or(file.store.take())
                .unwrap_or_else(|| DEFAULT_STORE.into()),
            tls,
            settings: file,
        })
    }
}

/// `value` with each `$NAME` or `${NAME}` replaced by that environment
/// variable, so one config file serves every pod of a StatefulSet
/// (`node_id = "$HOSTNAME"`). A `$` not followed by a name (a letter or
/// `_`, then letters, digits and `_`) is kept. An
/// unset variable is an error naming `setting`.
pub fn expand_env(setting: &'static str, value: &str) -> Result<String, NodeConfigError> {
    expand_with(setting, value, |name| std::env::var(name).ok())
}

/// [`expand_env`] with the variables from `var`.
fn expand_with(
    setting: &'static str,
    value: &str,
    var: impl Fn(&str) -> Option<String>,
) -> Result<String, NodeConfigError> {
    let is_name = |c: char| c.is_ascii_alphanumeric() || c == '_';
    let mut out = String::with_capacity(value.len());
    let mut rest = value;
    while let Some(at) = rest.find('$') {
        out.push_str(&rest[..at]);
        let after = &rest[at + 1..];
        let (name, tail) = match after.strip_prefix('{') {
            Some(braced) => match braced.find('}') {
                Some(end) => (&braced[..end], &braced[end + 1..]),
                None => ("", after),
            },
            None => {
                let end = after.find(|c| !is_name(c)).unwrap_or(after.len());
                (&after[..end], &after[end..])
            }
        };
        let starts_ok = name
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_');
        if !starts_ok || !name.chars().all(is_name) {
            out.push('$');
            rest = after;
            continue;
        }
        let v = var(name).ok_or_else(|| NodeConfigError::UnsetVariable {
            setting,
            value: value.to_string(),
            name: name.to_string(),
        })?;
        out.push_str(&v);
        rest = tail;
    }
    out.push_str(rest);
    Ok(out)
}

/// The node ID `value` of `setting` gives: variables expanded; one that
/// came from a variable (a hostname) must be usable as a node's name.
fn node_id(setting: &'static str, value: &str) -> Result<String, NodeConfigError> {
    node_id_with(setting, value, |name| std::env::var(name).ok())
}

/// [`node_id`] with the variables from `var`.
fn node_id_with(
    setting: &'static str,
    value: &str,
    var: impl Fn(&str) -> Option<String>,
) -> Result<String, NodeConfigError> {
    let id = expand_with(setting, value, var)?;
    if id != value && hearth_sharding::tls::node_server_name(&id).is_err() {
        return Err(NodeConfigError::BadNodeId {
            setting,
            value: value.to_string(),
            id,
        });
    }
    Ok(id)
}

/// A listening address of the `[cluster]` section: `IP:PORT`, or a value
/// naming environment variables (`"${POD_IP}:7000"`) that
/// [`ServeArgs::resolve`] expands when the node starts.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(try_from = "String")]
pub enum ListenAddr {
    /// An address.
    Addr(SocketAddr),
    /// A value with variables, not yet expanded.
    Template(String),
}

impl TryFrom<String> for ListenAddr {
    type Error = String;

    fn try_from(s: String) -> Result<Self, String> {
        if s.contains('$') {
            return Ok(Self::Template(s));
        }
        s.parse()
            .map(Self::Addr)
            .map_err(|_| format!("{s:?} is not an IP:PORT address"))
    }
}

impl From<SocketAddr> for ListenAddr {
    fn from(addr: SocketAddr) -> Self {
        Self::Addr(addr)
    }
}

impl std::fmt::Display for ListenAddr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Addr(a) => write!(f, "{a}"),
            Self::Template(t) => f.write_str(t),
        }
    }
}

impl ListenAddr {
    /// The address; for a template, its variables expanded (an error names
    /// `setting`).
    pub fn addr(&self, setting: &'static str) -> Result<SocketAddr, NodeConfigError> {
        let template = match self {
            Self::Addr(a) => return Ok(*a),
            Self::Template(t) => t,
        };
        let expanded = expand_env(setting, template)?;
        expanded.parse().map_err(|_| NodeConfigError::BadAddress {
            setting,
            value: template.clone(),
            expanded,
        })
    }

    /// Expands a template in place.
    fn expand(&mut self, setting: &'static str) -> Result<(), NodeConfigError> {
        *self = Self::Addr(self.addr(setting)?);
        Ok(())
    }
}

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
    /// DNS resolution, then TCP connect, each at most this long.
    #[serde(default, with = "humantime_serde")]
    pub connect_timeout: Option<Duration>,
    /// From sending a request until its response head.
    #[serde(default, with = "humantime_serde")]
    pub first_byte_timeout: Option<Duration>,
    /// The largest response body a Worker may read.
    pub max_response_size: Option<ByteSize>,
    /// PEM files of CAs trusted beside the Mozilla roots, for origins
    /// served with certificates of a private CA.
    #[serde(default)]
    pub extra_roots: Vec<PathBuf>,
    /// The certificates of `extra_roots`, read by [`ServeArgs::resolve`].
    #[serde(skip)]
    loaded_roots: Vec<rustls::pki_types::CertificateDer<'static>>,
}

impl EgressSection {
    /// Reads the CA certificates of `extra_roots`; a file that cannot be
    /// read or holds no certificate is an error naming it.
    fn load_roots(&mut self) -> Result<(), NodeConfigError> {
        for path in &self.extra_roots {
            let certs = crate::https::read_certs(path).map_err(NodeConfigError::EgressRoot)?;
            self.loaded_roots.extend(certs);
        }
        Ok(())
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
    /// Subrequests one invocation may have in flight.
    pub max_concurrent_subrequests: Option<usize>,
    /// How long a name no Worker is deployed under is answered 404 without
    /// a store read.
    #[serde(default, with = "humantime_serde")]
    pub unknown_script_ttl: Option<Duration>,
    /// Names the negative cache of unknown script IDs holds at most.
    pub unknown_script_cache: Option<usize>,
    // The keys these replace, read for one release (see `Renamed`).
    write_timeout_s: Option<u64>,
    drain_timeout_s: Option<u64>,
    body_idle_timeout_s: Option<u64>,
    slot_wait_ms: Option<u64>,
    instance_memory_mb: Option<u64>,
}

impl<'de> Deserialize<'de> for ClientLimits {
    /// The section as written, with its deprecated keys moved into their
    /// replacements.
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let mut c = ClientLimits::deserialize(d)?;
        c.take_renamed().map_err(serde::de::Error::custom)?;
        Ok(c)
    }
}

impl ClientLimits {
    /// Moves each deprecated key's value into its replacement.
    fn take_renamed(&mut self) -> Result<(), String> {
        let r = Renamed::section("limits");
        let old = self.write_timeout_s.take();
        r.secs(
            "write_timeout_s",
            old,
            "write_timeout",
            &mut self.write_timeout,
        )?;
        let old = self.drain_timeout_s.take();
        r.secs(
            "drain_timeout_s",
            old,
            "drain_timeout",
            &mut self.drain_timeout,
        )?;
        let old = self.body_idle_timeout_s.take();
        r.secs(
            "body_idle_timeout_s",
            old,
            "body_idle_timeout",
            &mut self.body_idle_timeout,
        )?;
        let old = self.slot_wait_ms.take();
        r.millis("slot_wait_ms", old, "slot_wait", &mut self.slot_wait)?;
        let old = self.instance_memory_mb.take();
        r.mib(
            "instance_memory_mb",
            old,
            "instance_memory",
            &mut self.instance_memory,
        )
    }
}

/// Where a renamed config key is read: the section, for messages. The keys
/// that carried their unit in the name (`idle_timeout_s`, `slot_wait_ms`,
/// `memory_budget_mb`, ...) became durations (`"5m"`) and sizes
/// (`"1GiB"`); the old keys are still read for one release, each with a
/// warning that names its replacement and the value to write there.
struct Renamed {
    /// `[section] ` or nothing for the top level.
    place: String,
}

impl Renamed {
    fn section(name: &str) -> Renamed {
        Renamed {
            place: if name.is_empty() {
                String::new()
            } else {
                format!("[{name}] ")
            },
        }
    }

    /// Moves `value` of the deprecated key `old` into `slot` (the key
    /// `new`) as `convert` makes it, with a warning; both set is an error.
    fn moved<T, U>(
        &self,
        old: &str,
        value: Option<T>,
        new: &str,
        slot: &mut Option<U>,
        convert: impl FnOnce(T) -> (U, String),
    ) -> Result<(), String> {
        let Some(value) = value else { return Ok(()) };
        let place = &self.place;
        if slot.is_some() {
            return Err(format!(
                "{place}sets both {old} and {new}; {old} is the deprecated spelling of {new}: remove it"
            ));
        }
        let (value, written) = convert(value);
        tracing::warn!(
            "config: {place}{old} is deprecated and will be removed in the next release; \
             write {new} = {written} instead"
        );
        *slot = Some(value);
        Ok(())
    }

    /// A number of seconds that became a duration.
    fn secs(
        &self,
        old: &str,
        v: Option<u64>,
        new: &str,
        slot: &mut Option<Duration>,
    ) -> Result<(), String> {
        self.moved(old, v, new, slot, |s| written(Duration::from_secs(s)))
    }

    /// A number of milliseconds that became a duration.
    fn millis(
        &self,
        old: &str,
        v: Option<u64>,
        new: &str,
        slot: &mut Option<Duration>,
    ) -> Result<(), String> {
        self.moved(old, v, new, slot, |ms| written(Duration::from_millis(ms)))
    }

    /// A number of MiB that became a size.
    fn mib(
        &self,
        old: &str,
        v: Option<u64>,
        new: &str,
        slot: &mut Option<ByteSize>,
    ) -> Result<(), String> {
        self.moved(old, v, new, slot, |mb| {
            (ByteSize::mib(mb), format!("\"{mb}MiB\""))
        })
    }
}

/// `d` and how to write it in a config file (`"5m"`, `"250ms"`).
fn written(d: Duration) -> (Duration, String) {
    (
        d,
        format!("\"{}\"", humantime_serde::re::humantime::format_duration(d)),
    )
}

/// `[plans.*] startup_cpu`: see [`plan_duration`].
fn startup_cpu<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
    plan_duration(d, "startup_cpu")
}

/// `[plans.*] request_cpu`: see [`plan_duration`].
fn request_cpu<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
    plan_duration(d, "request_cpu")
}

/// `[plans.*] request_wall`: see [`plan_duration`].
fn request_wall<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
    plan_duration(d, "request_wall")
}

/// A plan's time limit `key`: a duration (`"400ms"`), or, as before this
/// release, a bare number of milliseconds (read with a deprecation
/// warning).
fn plan_duration<'de, D: serde::Deserializer<'de>>(
    d: D,
    key: &'static str,
) -> Result<Option<Duration>, D::Error> {
    struct PlanDuration(&'static str);
    impl serde::de::Visitor<'_> for PlanDuration {
        type Value = Duration;
        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("a duration such as \"400ms\" or \"30s\"")
        }
        fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Duration, E> {
            humantime_serde::re::humantime::parse_duration(v)
                .map_err(|e| E::custom(format!("{}: {e} in {v:?}", self.0)))
        }
        fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<Duration, E> {
            let ms = u64::try_from(v).map_err(|_| E::custom(format!("{} is negative", self.0)))?;
            self.visit_u64(ms)
        }
        fn visit_u64<E: serde::de::Error>(self, ms: u64) -> Result<Duration, E> {
            let (d, written) = written(Duration::from_millis(ms));
            tracing::warn!(
                "config: [plans.…] {key} = {ms} (a bare number of milliseconds) is deprecated and \
                 will be refused in the next release; write {key} = {written} instead",
                key = self.0
            );
            Ok(d)
        }
    }
    d.deserialize_any(PlanDuration(key)).map(Some)
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
        Ok(JoinConfig {
            node_id: node_id.to_string(),
            rpc_listener,
            pki_dir: self.pki.clone(),
            gossip,
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
    /// Cluster membership; absent for a standalone node.
    pub cluster: Option<ClusterSection>,
    /// OpenTelemetry export of request spans; absent, off.
    pub telemetry: Option<TelemetrySection>,
    // The keys these replace, read for one release (see `Renamed`).
    memory_budget_mb: Option<u64>,
    idle_timeout_s: Option<u64>,
}

impl<'de> Deserialize<'de> for NodeConfig {
    /// The file as written, with its deprecated keys moved into their
    /// replacements.
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let mut c = NodeConfig::deserialize(d)?;
        c.take_renamed().map_err(serde::de::Error::custom)?;
        Ok(c)
    }
}

impl NodeConfig {
    /// Moves each deprecated top-level key's value into its replacement
    /// (the sections do their own).
    fn take_renamed(&mut self) -> Result<(), String> {
        let r = Renamed::section("");
        let old = self.memory_budget_mb.take();
        r.mib(
            "memory_budget_mb",
            old,
            "memory_budget",
            &mut self.memory_budget,
        )?;
        let old = self.idle_timeout_s.take();
        r.secs(
            "idle_timeout_s",
            old,
            "idle_timeout",
            &mut self.idle_timeout,
        )
    }

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

    /// Replaces each secret (`artifact_key`, `admin_token`, `[cluster]
    /// gossip_key`) written as one environment variable (`"$HEARTH_ADMIN_TOKEN"`
    /// or `"${HEARTH_ADMIN_TOKEN}"`) by its value, so a config shared by
    /// many nodes (a Kubernetes ConfigMap) names secrets kept elsewhere (a
    /// Secret). Any other value is a secret itself, `$` and all.
    pub fn expand_secrets(&mut self) -> Result<(), NodeConfigError> {
        let gossip_key = self.cluster.as_mut().map(|c| &mut c.gossip_key);
        for (setting, value) in [
            ("artifact_key", Some(&mut self.artifact_key)),
            ("admin_token", Some(&mut self.admin_token)),
            ("[cluster] gossip_key", gossip_key),
        ] {
            let Some(Some(v)) = value else { continue };
            let name = v
                .strip_prefix("${")
                .and_then(|n| n.strip_suffix('}'))
                .or_else(|| v.strip_prefix('$'));
            if let Some(name) = name
                && !name.is_empty()
                && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
            {
                *v = expand_env(setting, v)?;
            }
        }
        Ok(())
    }

    /// Refuses secrets that protect nothing, before the node starts: an
    /// `artifact_key`, `[cluster] gossip_key` or `admin_token` that hearth's
    /// documentation has printed (the placeholder, or an example value), and
    /// an `admin_token` shorter than [`MIN_ADMIN_TOKEN_BYTES`]. Each error
    /// says why and offers a freshly generated value to paste.
    pub fn check_secrets(&self) -> Result<(), NodeConfigError> {
        let example = |value: &str| {
            EXAMPLE_SECRETS
                .iter()
                .any(|e| value.trim().eq_ignore_ascii_case(e))
        };
        if self.artifact_key.as_deref().is_some_and(example) {
            return Err(NodeConfigError::ExampleSecret {
                setting: "artifact_key",
                key: "artifact_key",
                risk: "forge precompiled artifacts, which nodes run as native code",
                scope: " (the same on every node)",
                fresh: fresh_key(),
            });
        }
        let gossip_key = self.cluster.as_ref().and_then(|c| c.gossip_key.as_deref());
        if gossip_key.is_some_and(example) {
            return Err(NodeConfigError::ExampleSecret {
                setting: "[cluster] gossip_key",
                key: "gossip_key",
                risk: "forge gossip and take nodes off the ring",
                scope: " (the same on every node)",
                fresh: fresh_key(),
            });
        }
        if let Some(token) = &self.admin_token {
            if example(token) {
                return Err(NodeConfigError::ExampleSecret {
                    setting: "admin_token",
                    key: "admin_token",
                    risk: "deploy Workers and drive this node through its admin API",
                    scope: "",
                    fresh: fresh_key(),
                });
            }
            if token.len() < MIN_ADMIN_TOKEN_BYTES {
                return Err(NodeConfigError::ShortAdminToken {
                    len: token.len(),
                    fresh: fresh_key(),
                });
            }
        }
        Ok(())
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
        if let Some(v) = e.first_byte_timeout {
            egress.first_byte_timeout = v;
        }
        if let Some(v) = e.max_response_size {
            egress.max_response_size = v.as_u64();
        }
        egress.extra_roots.extend(e.loaded_roots.iter().cloned());
        cfg.egress(egress)
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
        }
    }
}

/// A size from the config as a byte count in memory (saturating).
fn bytes_usize(size: ByteSize) -> usize {
    usize::try_from(size.as_u64()).unwrap_or(usize::MAX)
}

/// Reads the secret in `store/name`, creating a random one (mode 0600) on
/// first use. Nodes sharing a store share it. Only a missing file is
/// created; any other read error (not UTF-8, a directory, no permission)
/// is an error naming the file, so a node never starts with a secret other
/// than the one on disk.
pub fn store_secret(store: &Path, name: &str) -> Result<[u8; 32], NodeConfigError> {
    use std::io::Write;
    let path = store.join(name);
    if let Some(key) = read_secret(&path)? {
        return Ok(key);
    }
    std::fs::create_dir_all(store).map_err(|error| NodeConfigError::Create {
        path: store.to_path_buf(),
        error,
    })?;
    let key: [u8; 32] = rand::random();
    // Written whole to a temporary file (0600 by default), then linked into
    // place only if no other node got there first: a concurrent reader sees
    // no file or a complete one, never an empty one.
    let create = |error: std::io::Error| NodeConfigError::Create {
        path: path.clone(),
        error,
    };
    let mut tmp = tempfile::NamedTempFile::new_in(store).map_err(create)?;
    tmp.write_all(blake3::Hash::from_bytes(key).to_hex().as_bytes())
        .map_err(create)?;
    tmp.as_file().sync_all().map_err(create)?;
    match tmp.persist_noclobber(&path) {
        Ok(_) => {
            hearth_runtime::store::script_store::sync_dir(store).map_err(create)?;
            Ok(key)
        }
        // Another node created it first: use theirs (read once, no retry).
        Err(e) if e.error.kind() == std::io::ErrorKind::AlreadyExists => {
            read_secret(&path)?.ok_or(NodeConfigError::SecretVanished { path })
        }
        Err(e) => Err(create(e.error)),
    }
}

/// The secret in `path`: `None` if there is no such file, an error naming
/// the file for anything else that stops it being read or parsed.
fn read_secret(path: &Path) -> Result<Option<[u8; 32]>, NodeConfigError> {
    match std::fs::read_to_string(path) {
        Ok(hex) => {
            let bytes =
                blake3::Hash::from_hex(hex.trim()).map_err(|e| NodeConfigError::CorruptSecret {
                    path: path.to_path_buf(),
                    reason: e.to_string(),
                })?;
            Ok(Some(*bytes.as_bytes()))
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(error) => Err(NodeConfigError::ReadSecret {
            path: path.to_path_buf(),
            error,
        }),
    }
}

/// Where a node keeps Worker sources, and its own files.
#[derive(Clone)]
pub struct NodeStore {
    /// The node's own directory: the store itself for a directory store,
    /// else the data directory (artifact cache, admin token, certificates).
    pub data_dir: PathBuf,
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
    pub async fn open(location: &str, file: &NodeConfig) -> Result<NodeStore, NodeConfigError> {
        if !hearth_runtime::store::s3_store::is_s3_url(location) {
            let dir = PathBuf::from(location);
            let mut runtime = runtime_config(&dir)?;
            if let Some(hex) = &file.artifact_key {
                runtime = runtime.artifact_key(parse_key("artifact_key", hex)?);
            }
            let scripts = DirStore::open(&dir).map_err(NodeConfigError::OpenStore)?;
            return Ok(NodeStore {
                data_dir: dir,
                scripts: Arc::new(scripts),
                runtime,
            });
        }
        let Some(hex) = &file.artifact_key else {
            return Err(NodeConfigError::NoArtifactKey {
                location: location.to_string(),
                fresh: fresh_key(),
            });
        };
        let key = parse_key("artifact_key", hex)?;
        let data_dir = file
            .data
            .clone()
            .unwrap_or_else(|| PathBuf::from("hearth-data"));
        std::fs::create_dir_all(&data_dir).map_err(|error| NodeConfigError::DataDir {
            path: data_dir.clone(),
            error,
        })?;
        let s3 = S3Store::open(location, &file.s3.clone().unwrap_or_default())
            .map_err(NodeConfigError::OpenStore)?;
        s3.check().await.map_err(NodeConfigError::UseStore)?;
        Ok(NodeStore {
            runtime: RuntimeConfig::new(&data_dir).artifact_key(key),
            data_dir,
            scripts: Arc::new(s3),
        })
    }
}

/// `hex` as a 32-byte key, or an error naming the setting.
fn parse_key(setting: &'static str, hex: &str) -> Result<[u8; 32], NodeConfigError> {
    let key =
        blake3::Hash::from_hex(hex.trim()).map_err(|_| NodeConfigError::BadKey { setting })?;
    Ok(*key.as_bytes())
}

/// A fresh random key in hex, offered in the message when one is missing.
fn fresh_key() -> String {
    let fresh: [u8; 32] = rand::random();
    blake3::Hash::from_bytes(fresh).to_hex().to_string()
}

/// The runtime configuration every node over `store` starts from: sources
/// and artifacts in the store, authenticated with the store's artifact key.
pub fn runtime_config(store: &Path) -> Result<RuntimeConfig, NodeConfigError> {
    Ok(RuntimeConfig::new(store).artifact_key(store_secret(store, "artifact.key")?))
}

/// The admin token of the nodes over `store` (`store/admin.token`), and
/// whether it was just generated (callers print a new one).
pub fn admin_token(store: &Path) -> Result<(String, bool), NodeConfigError> {
    let existed = store.join("admin.token").exists();
    let key = store_secret(store, "admin.token")?;
    Ok((blake3::Hash::from_bytes(key).to_hex().to_string(), !existed))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The value a refusal offers to paste after `key = "`.
    fn offered(message: &str, key: &str) -> String {
        message
            .split(&format!("{key} = \""))
            .nth(1)
            .and_then(|rest| rest.split('"').next())
            .unwrap_or_else(|| panic!("no {key} offered in: {message}"))
            .to_string()
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
    fn the_three_example_configs_of_the_readme_parse_agree_and_hold_no_usable_secret() {
        let texts = [
            include_str!("../docs/operator/node-1.toml"),
            include_str!("../docs/operator/node-2.toml"),
            include_str!("../docs/operator/node-3.toml"),
        ];
        let mut rpcs = Vec::new();
        for (i, text) in texts.iter().enumerate() {
            let mut c: NodeConfig = toml::from_str(text).expect("example config parses");
            assert_eq!(
                c.node_id.as_deref(),
                Some(format!("node-{}", i + 1).as_str())
            );
            assert_eq!(c.store.as_deref(), Some("s3://hearth/prod"));
            let cluster = c.cluster.as_ref().expect("[cluster]");
            assert!(cluster.gossip.is_some(), "gossip, so gossip_key is needed");
            rpcs.push(cluster.rpc.clone());
            // Every secret is a placeholder the node refuses, each with a
            // fresh value that it then accepts.
            for key in ["artifact_key", "gossip_key", "admin_token"] {
                let refused = c.check_secrets().expect_err("a placeholder is refused");
                assert!(
                    matches!(refused, NodeConfigError::ExampleSecret { key: k, .. } if k == key),
                    "{refused}"
                );
                let fresh = offered(&refused.to_string(), key);
                assert_ne!(fresh, SECRET_PLACEHOLDER);
                match key {
                    "artifact_key" => c.artifact_key = Some(fresh),
                    "gossip_key" => {
                        c.cluster.as_mut().expect("[cluster]").gossip_key = Some(fresh);
                    }
                    _ => c.admin_token = Some(fresh),
                }
            }
            c.check_secrets().expect("fresh secrets are accepted");
            let key = c.artifact_key.as_deref().expect("artifact_key");
            parse_key("artifact_key", key).expect("the offered key is 64 hex digits");
            let cluster = c.cluster.as_ref().expect("[cluster]");
            assert!(cluster.gossip_key().expect("offered gossip_key").is_some());
        }
        rpcs.dedup();
        assert_eq!(rpcs.len(), 3, "each node its own RPC address");
    }

    /// Writes `text` as a config file in `dir` and resolves it, as `hearth
    /// serve --config` does before anything starts.
    fn resolve_text(dir: &Path, text: &str) -> Result<ServeConfig, NodeConfigError> {
        let path = dir.join("node.toml");
        std::fs::write(&path, text).expect("write config");
        args(Some(&path)).resolve()
    }

    #[test]
    fn a_node_refuses_the_secrets_the_docs_shipped() {
        let dir = tempfile::tempdir().expect("tempdir");
        let good_key = "5d1f0c9a8b7e6d5c4b3a29181706f5e4d3c2b1a09f8e7d6c5b4a392817160504";
        let good_token = "a-long-enough-admin-token-of-32-bytes";
        // The artifact key docs/operator/*.toml shipped before.
        let shipped = "9c1f5e0b7a3d4c2e8f6a1b0d9e7c5a3f2b4d6e8a0c1e3f5a7b9d1f3e5a7c9e1b";
        let err = resolve_text(
            dir.path(),
            &format!("artifact_key = \"{shipped}\"\nadmin_token = \"{good_token}\"\n"),
        )
        .expect_err("the docs' example artifact key");
        let message = err.to_string();
        assert!(
            message.starts_with("artifact_key is an example value from hearth's documentation"),
            "{message}"
        );
        assert!(message.contains("forge precompiled artifacts"), "{message}");
        let fresh = offered(&message, "artifact_key");
        parse_key("artifact_key", &fresh).expect("a usable key is offered");
        assert_ne!(fresh, shipped);
        // Upper case is the same key.
        let err = resolve_text(
            dir.path(),
            &format!("artifact_key = \"{}\"\n", shipped.to_uppercase()),
        )
        .expect_err("the same key in upper case");
        assert!(
            matches!(err, NodeConfigError::ExampleSecret { .. }),
            "{err}"
        );
        // The gossip key the docs shipped, and their admin token.
        let err = resolve_text(
            dir.path(),
            "[cluster]\nrpc = \"127.0.0.1:7000\"\npki = \"./pki\"\ngossip = \"127.0.0.1:7001\"\n\
             gossip_key = \"3e8d1c6b2a9f4e7d0c5b8a3f6e1d4c9b7a2f5e0d3c8b6a1f4e9d2c7b5a0f3e8d\"\n",
        )
        .expect_err("the docs' example gossip key");
        assert!(
            err.to_string()
                .starts_with("[cluster] gossip_key is an example value"),
            "{err}"
        );
        let err = resolve_text(dir.path(), "admin_token = \"change-me\"\n")
            .expect_err("the docs' example token");
        assert!(
            err.to_string()
                .starts_with("admin_token is an example value"),
            "{err}"
        );

        // A 10-byte token is too short, whatever it is.
        let err = resolve_text(dir.path(), "admin_token = \"0123456789\"\n")
            .expect_err("a 10-byte token");
        let message = err.to_string();
        assert!(
            message.starts_with("admin_token is 10 bytes long; it must be at least 32 bytes"),
            "{message}"
        );
        assert!(offered(&message, "admin_token").len() >= MIN_ADMIN_TOKEN_BYTES);

        // Secrets of one's own are accepted.
        let good = resolve_text(
            dir.path(),
            &format!(
                "artifact_key = \"{good_key}\"\nadmin_token = \"{good_token}\"\n[cluster]\n\
                 rpc = \"127.0.0.1:7000\"\npki = \"./pki\"\ngossip = \"127.0.0.1:7001\"\n\
                 gossip_key = \"{good_key}\"\n"
            ),
        )
        .expect("a config with secrets of its own");
        assert_eq!(good.settings.admin_token.as_deref(), Some(good_token));
    }

    #[test]
    fn egress_settings_and_fetches_per_request_reach_the_runtime() {
        let c: NodeConfig = toml::from_str(
            "[egress]\nallow_private_addresses = true\nconnect_timeout = \"2s\"\n\
             first_byte_timeout = \"5s\"\nmax_response_size = \"1MiB\"\n\
             [plans.free]\nsubrequests = 7\n",
        )
        .expect("[egress]");
        let cfg = c.apply(RuntimeConfig::new("/tmp/hearth-egress-config"));
        let e = cfg.egress_config();
        assert!(e.allow_private_addresses);
        assert_eq!(e.connect_timeout, Duration::from_secs(2));
        assert_eq!(e.first_byte_timeout, Duration::from_secs(5));
        assert_eq!(e.max_response_size, 1 << 20);
        assert_eq!(cfg.limits(Plan::Free).subrequests, 7);
        assert_eq!(cfg.limits(Plan::Paid).subrequests, 1000);
        let default = NodeConfig::default().apply(RuntimeConfig::new("/tmp/hearth-egress-config"));
        assert!(!default.egress_config().allow_private_addresses);
        assert!(toml::from_str::<NodeConfig>("[egress]\nallow_private = true\n").is_err());
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
        let limits = c.serve_limits();
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
             unknown_script_cache = 100\n",
        )
        .expect("config");
        let limits = c.serve_limits();
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
        ] {
            assert!(rt.contains(field), "{field} not in {rt}");
        }
        // Unset, each keeps its default.
        let d = NodeConfig::default().serve_limits();
        assert_eq!(
            d.header_read_timeout,
            ServeLimits::default().header_read_timeout
        );
        assert_eq!(
            d.max_pre_slot_bytes,
            ServeLimits::default().max_pre_slot_bytes
        );
        assert!(toml::from_str::<NodeConfig>("[limits]\nh2_keep_alive = 10\n").is_err());
    }

    #[test]
    fn the_keys_of_the_last_release_still_parse_to_the_same_values() {
        let old: NodeConfig = toml::from_str(
            "memory_budget_mb = 512\nidle_timeout_s = 90\n\
             [limits]\nwrite_timeout_s = 5\ndrain_timeout_s = 60\nbody_idle_timeout_s = 2\n\
             slot_wait_ms = 250\ninstance_memory_mb = 2048\n\
             [s3]\ntimeout_ms = 1500\n\
             [plans.free]\nmax_script_size = 3145728\nstartup_cpu = 400\nrequest_cpu = 30000\n\
             request_wall = 60000\nmemory = 134217728\n",
        )
        .expect("old keys parse");
        let new: NodeConfig = toml::from_str(
            "memory_budget = \"512MiB\"\nidle_timeout = \"90s\"\n\
             [limits]\nwrite_timeout = \"5s\"\ndrain_timeout = \"60s\"\nbody_idle_timeout = \"2s\"\n\
             slot_wait = \"250ms\"\ninstance_memory = \"2GiB\"\n\
             [s3]\ntimeout = \"1500ms\"\n\
             [plans.free]\nmax_script_size = \"3MiB\"\nstartup_cpu = \"400ms\"\nrequest_cpu = \"30s\"\n\
             request_wall = \"60s\"\nmemory = \"128MiB\"\n",
        )
        .expect("new keys parse");
        // Debug shows every field, the deprecated ones too (emptied once
        // moved), so equal output means equal settings.
        assert_eq!(format!("{old:?}"), format!("{new:?}"));
        assert_eq!(old.memory_budget, Some(ByteSize::mib(512)));
        assert_eq!(old.limits.slot_wait, Some(Duration::from_millis(250)));
        assert_eq!(old.plans.free.request_cpu, Some(Duration::from_secs(30)));
        assert_eq!(
            old.s3.as_ref().and_then(|s| s.timeout),
            Some(Duration::from_millis(1500))
        );

        // An old key next to its replacement is a mistake, not a choice.
        for both in [
            "idle_timeout_s = 1\nidle_timeout = \"1s\"\n",
            "[limits]\nslot_wait_ms = 1\nslot_wait = \"1ms\"\n",
            "[s3]\ntimeout_ms = 1\ntimeout = \"1ms\"\n",
        ] {
            let err = toml::from_str::<NodeConfig>(both).expect_err(both);
            assert!(err.to_string().contains("deprecated spelling"), "{err}");
        }
    }

    fn args(config: Option<&Path>) -> ServeArgs {
        ServeArgs {
            config: config.map(Path::to_path_buf),
            ..ServeArgs::default()
        }
    }

    #[test]
    fn serve_config_takes_defaults_then_the_file_then_the_flags() {
        let bare = args(None).resolve().expect("no file, no flags");
        assert_eq!(
            (
                bare.node_id.as_str(),
                bare.listen,
                bare.admin,
                bare.store.as_str()
            ),
            (
                DEFAULT_NODE_ID,
                DEFAULT_LISTEN,
                DEFAULT_ADMIN,
                DEFAULT_STORE
            )
        );
        assert_eq!(bare.tls, None);

        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("node.toml");
        std::fs::write(
            &path,
            "node_id = \"n7\"\nlisten = \"127.0.0.1:9080\"\nadmin = \"127.0.0.1:9081\"\n\
             store = \"./s\"\ntls_listen = \"127.0.0.1:9443\"\ntls_cert = \"c.pem\"\n\
             tls_key = \"k.pem\"\nmax_prewarms = 2\n",
        )
        .expect("write config");
        let file = args(Some(&path)).resolve().expect("file");
        assert_eq!(file.node_id, "n7");
        assert_eq!(file.listen.port(), 9080);
        assert_eq!(file.admin.port(), 9081);
        assert_eq!(file.store, "./s");
        let tls = file.tls.expect("tls from the file");
        assert_eq!(tls.listen.port(), 9443);
        assert_eq!(tls.cert, Some(("c.pem".into(), "k.pem".into())));
        assert!(file.settings.prewarm().enabled);
        assert_eq!(file.settings.prewarm().max_concurrent, 2);

        let flags = ServeArgs {
            listen: Some("127.0.0.1:1080".parse().expect("addr")),
            store: Some("s3://b/p".into()),
            tls_cert: Some("flag.pem".into()),
            tls_key: Some("flag-key.pem".into()),
            no_sni_prewarm: true,
            ..args(Some(&path))
        }
        .resolve()
        .expect("flags over the file");
        assert_eq!(flags.listen.port(), 1080, "a flag wins");
        assert_eq!(flags.admin.port(), 9081, "the file fills what flags leave");
        assert_eq!(flags.store, "s3://b/p");
        let tls = flags.tls.expect("tls");
        assert_eq!(tls.listen.port(), 9443);
        assert_eq!(tls.cert, Some(("flag.pem".into(), "flag-key.pem".into())));
        assert!(!flags.settings.prewarm().enabled, "--no-sni-prewarm");
    }

    #[test]
    fn serve_config_refuses_a_certificate_it_cannot_use() {
        let dir = tempfile::tempdir().expect("tempdir");
        let resolve = |text: &str| {
            let path = dir.path().join("node.toml");
            std::fs::write(&path, text).expect("write config");
            args(Some(&path)).resolve()
        };
        assert!(matches!(
            resolve("tls_cert = \"c.pem\"\ntls_key = \"k.pem\"\n"),
            Err(NodeConfigError::TlsWithoutListen)
        ));
        assert!(matches!(
            resolve("tls_listen = \"127.0.0.1:9443\"\ntls_cert = \"c.pem\"\n"),
            Err(NodeConfigError::TlsHalfPair)
        ));
        let dev = resolve("tls_listen = \"127.0.0.1:9443\"\n").expect("dev certificate");
        assert_eq!(dev.tls.expect("tls").cert, None);
        let bad = resolve("listen = 8080\n").expect_err("not an address");
        assert!(matches!(bad, NodeConfigError::Parse { .. }));
        assert!(bad.to_string().starts_with("invalid config "), "{bad}");
        let missing = args(Some(&dir.path().join("nope.toml")))
            .resolve()
            .expect_err("no such file");
        assert!(
            missing.to_string().starts_with("cannot read config "),
            "{missing}"
        );
    }

    #[test]
    fn variables_in_node_ids_and_addresses_are_expanded_and_checked() {
        let env = |name: &str| match name {
            "HOSTNAME" => Some("hearth-2".to_string()),
            "POD_IP" => Some("10.1.2.3".to_string()),
            "BAD" => Some("Not A Node".to_string()),
            _ => None,
        };
        let x = |v: &str| expand_with("node_id", v, env);
        assert_eq!(x("$HOSTNAME").expect("set"), "hearth-2");
        assert_eq!(x("${POD_IP}:7000").expect("set"), "10.1.2.3:7000");
        assert_eq!(x("n-$HOSTNAME.x").expect("set"), "n-hearth-2.x");
        assert_eq!(x("no variables").expect("plain"), "no variables");
        assert_eq!(x("cost: $5 and $").expect("a lone $"), "cost: $5 and $");
        let unset = x("$NOPE").expect_err("unset");
        assert_eq!(
            unset.to_string(),
            "node_id = \"$NOPE\" names the environment variable NOPE, which is not set \
             (export it, e.g. `export NOPE`, or write the value itself)"
        );
        // A hostname is checked as a node name; a literal ID is taken as is.
        let checked = |v: &str| node_id_with("node_id", v, env);
        assert!(matches!(
            checked("$BAD"),
            Err(NodeConfigError::BadNodeId { .. })
        ));
        assert_eq!(checked("$HOSTNAME").expect("a pod name"), "hearth-2");

        // Secrets: a value that is one variable names it; any other value
        // is the secret itself, `$` and all.
        let dir = env!("CARGO_MANIFEST_DIR");
        let mut c: NodeConfig = toml::from_str(
            "artifact_key = \"${CARGO_MANIFEST_DIR}\"\nadmin_token = \"$CARGO_MANIFEST_DIR\"\n\
             [cluster]\nrpc = \"1.2.3.4:1\"\npki = \"p\"\ngossip_key = \"a$b${c}\"\n",
        )
        .expect("secrets naming variables");
        c.expand_secrets().expect("set variables");
        assert_eq!(c.artifact_key.as_deref(), Some(dir));
        assert_eq!(c.admin_token.as_deref(), Some(dir));
        let cluster = c.cluster.as_ref().expect("[cluster]");
        assert_eq!(cluster.gossip_key.as_deref(), Some("a$b${c}"));
        let mut c: NodeConfig =
            toml::from_str("admin_token = \"$HEARTH_TEST_NEVER_SET\"\n").expect("config");
        assert!(matches!(
            c.expand_secrets(),
            Err(NodeConfigError::UnsetVariable {
                setting: "admin_token",
                ..
            })
        ));

        // Addresses: templates wait for the node to start; literals are
        // checked when the file is read.
        let c: NodeConfig = toml::from_str(
            "[cluster]\nrpc = \"${POD_IP}:7000\"\ngossip = \"127.0.0.1:7001\"\npki = \"p\"\n\
             seeds = [\"hearth.default.svc.cluster.local:7001\", \"10.0.0.9:7001\"]\n\
             nodes = [{ id = \"hearth-0\", rpc = \"hearth-0.hearth:7000\" }]\n",
        )
        .expect("config with names and variables");
        let cluster = c.cluster.expect("[cluster]");
        assert_eq!(cluster.rpc, ListenAddr::Template("${POD_IP}:7000".into()));
        assert_eq!(
            cluster.seeds,
            vec![
                PeerAddr::Name {
                    host: "hearth.default.svc.cluster.local".into(),
                    port: 7001
                },
                PeerAddr::Ip("10.0.0.9:7001".parse().expect("addr")),
            ]
        );
        assert!(cluster.nodes[0].rpc.is_name());
        for bad in [
            "[cluster]\nrpc = \"localhost\"\npki = \"p\"\n",
            "[cluster]\nrpc = \"1.2.3.4:1\"\npki = \"p\"\nseeds = [\"no port\"]\n",
            "[cluster]\nrpc = \"1.2.3.4:1\"\npki = \"p\"\nseeds = [\"a..b:1\"]\n",
        ] {
            assert!(toml::from_str::<NodeConfig>(bad).is_err(), "{bad}");
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
