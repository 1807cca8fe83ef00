//! # hearth-admin-client
//!
//! A typed client of one hearth node's admin API (`hearth serve --admin`),
//! in place of hand-built HTTP requests with a bearer token and untyped
//! JSON: [`AdminClient::deploy`] (`PUT /v1/scripts/{id}`),
//! [`AdminClient::list`] (`GET /v1/scripts`), [`AdminClient::evict`]
//! (`POST /v1/scripts/{id}/evict`), [`AdminClient::hand_back`],
//! [`AdminClient::ring`] (`GET /v1/ring`), [`AdminClient::stats`] (`GET
//! /v1/stats`), [`AdminClient::tail`] (`GET /v1/scripts/{id}/tail`, a
//! stream of [`RequestEvent`]s), [`AdminClient::versions`],
//! [`AdminClient::set_deployment`] and [`AdminClient::rollback`] (versions
//! and gradual rollout), and [`AdminClient::metrics`] (`GET /metrics`, the
//! one route that needs no token).
//!
//! The admin API is plain HTTP unless the node serves it with TLS
//! (`admin_tls_cert` / `admin_tls_key` in its config): then use
//! [`AdminClient::with_ca`] with an `https://` URL and the CA that signed
//! the node's certificate (for a certificate from `hearth pki`, the
//! cluster's `ca.pem` and the server name `<node-id>.node.hearth.cluster`).
//!
//! The answers are typed with the fields a client reads ([`DeployReport`],
//! [`ScriptInfo`], [`RingView`], [`NodeStats`], [`Metrics`]); fields a node adds later are
//! ignored, so an older client keeps working. Every failure is an
//! [`AdminError`] that says what to do.
//!
//! ```no_run
//! # async fn demo() -> Result<(), hearth_admin_client::AdminError> {
//! use hearth_admin_client::AdminClient;
//! let admin = AdminClient::new("http://127.0.0.1:8081", Some("token".into()))?;
//! for script in admin.list().await? {
//!     println!("{} ({} bytes)", script.script_id, script.size);
//! }
//! admin.evict("hello").await?;
//! println!("evicted under pressure: {}", admin.stats().await?.evicted_pressure);
//! # Ok(()) }
//! ```

mod tail;
pub use tail::{RequestEvent, TailItem, TailQuery, TailStream, TraceEvent};

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use bytes::Bytes;
use http::{Method, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use serde::{Deserialize, Serialize};

/// How long a call waits for its answer unless told otherwise.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);

/// Why an admin call failed. A cause is in the message, not also a
/// `source` (which would print it twice in an error chain).
#[derive(Debug, thiserror::Error)]
pub enum AdminError {
    /// The URL is not an `http://host:port` address.
    #[error("invalid admin URL {url:?}: {reason}")]
    InvalidUrl {
        /// The URL as given.
        url: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The CA file to trust for an `https://` admin URL could not be
    /// used (missing, not PEM, no certificate), or none was given.
    #[error("cannot verify the admin API's TLS certificate: {0}")]
    Tls(String),
    /// The route needs the admin token and none was given.
    #[error("the admin API needs the admin token: --token or HEARTH_ADMIN_TOKEN")]
    NoToken,
    /// The node could not be reached (refused, reset, closed).
    #[error("cannot reach the admin API at {url}: {error}")]
    Unreachable {
        /// The node's admin URL.
        url: String,
        /// What the connection said, with its causes.
        error: String,
    },
    /// No answer in time.
    #[error("no answer from {url} within {timeout:?}")]
    Timeout {
        /// The node's admin URL.
        url: String,
        /// How long the call waited.
        timeout: Duration,
    },
    /// The node answered with an error status; `body` is its message.
    #[error("{method} {url}{path}: {status}: {body}")]
    Refused {
        /// The call's method.
        method: Method,
        /// The node's admin URL.
        url: String,
        /// The route.
        path: String,
        /// The status the node answered.
        status: StatusCode,
        /// The node's message (trimmed).
        body: String,
    },
    /// The answer is not what this client reads.
    #[error("{url}{path}: not the expected answer: {error}")]
    Malformed {
        /// The node's admin URL.
        url: String,
        /// The route.
        path: String,
        /// What the JSON parser said.
        error: serde_json::Error,
    },
}

impl AdminError {
    /// The status the node answered, if it answered with an error.
    pub fn status(&self) -> Option<StatusCode> {
        match self {
            AdminError::Refused { status, .. } => Some(*status),
            _ => None,
        }
    }
}

/// A script as `GET /v1/scripts` lists it (and a deploy reports it).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct ScriptInfo {
    /// Its script ID.
    pub script_id: String,
    /// The plan whose limits apply (`free`, `paid`).
    #[serde(default)]
    pub plan: String,
    /// Bytes as uploaded.
    #[serde(default)]
    pub size: u64,
    /// Bytes gzip-compressed, as the size limit measures them.
    #[serde(default)]
    pub compressed_size: u64,
    /// Content hash of the source.
    #[serde(default)]
    pub hash: String,
    /// When it was deployed, ms since the Unix epoch.
    #[serde(default)]
    pub deployed_at_ms: u64,
    /// The instance lifecycle chosen for it, and why.
    #[serde(default)]
    pub lifecycle: LifecycleInfo,
    /// What it may call.
    #[serde(default)]
    pub bindings: BindingsInfo,
    /// Its vars: name → value.
    #[serde(default)]
    pub vars: BTreeMap<String, String>,
    /// The names of its secrets (the admin API never shows a value).
    #[serde(default)]
    pub secrets: Vec<String>,
    /// A user Worker: served only through a dispatch namespace, never to
    /// a client directly.
    #[serde(default)]
    pub dispatch_only: bool,
    /// Its version number (0 from a node older than versions).
    #[serde(default)]
    pub version: u64,
}

/// One version's share of a deployment: `7@10%`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct VersionShare {
    /// The version.
    pub version: u64,
    /// Its percentage of the requests.
    pub percent: u8,
}

impl std::fmt::Display for VersionShare {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}@{}%", self.version, self.percent)
    }
}

/// One version's request and error counts on the answering node, during a
/// split.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
pub struct VersionCount {
    /// The version.
    pub version: u64,
    /// Requests it served.
    pub requests: u64,
    /// Of those, the ones that failed (5xx or a failed invocation).
    pub errors: u64,
}

/// What `GET /v1/scripts/{id}/versions` answers.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct VersionList {
    /// The Worker.
    pub script_id: String,
    /// Its current deployment: one version at 100%, or a split.
    pub deployment: Vec<VersionShare>,
    /// Every recorded version, lowest first.
    pub versions: Vec<ScriptInfo>,
    /// The answering node's counts per version of the split.
    #[serde(default)]
    pub counts: Vec<VersionCount>,
}

/// What a rollback or a new split did.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct DeploymentChange {
    /// The Worker.
    pub script_id: String,
    /// Its deployment now.
    pub deployment: Vec<VersionShare>,
    /// How the other members heard of it (like a deploy's).
    #[serde(default)]
    pub announced: Announcement,
}

/// A Worker's secrets as `GET /v1/scripts/{id}/secrets` lists them.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct SecretList {
    /// The Worker.
    pub script_id: String,
    /// The names of its secrets.
    pub secrets: Vec<String>,
}

/// What putting or deleting a secret did.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct SecretChange {
    /// The Worker.
    pub script_id: String,
    /// The secret's name.
    pub secret: String,
    /// For a delete: whether there was such a secret.
    #[serde(default)]
    pub deleted: Option<bool>,
    /// How the other members heard of the change (like a deploy's).
    #[serde(default)]
    pub announced: Announcement,
}

/// The lifecycle of a [`ScriptInfo`].
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
pub struct LifecycleInfo {
    /// `reuse` or `fresh`.
    #[serde(default)]
    pub chosen: String,
    /// Why.
    #[serde(default)]
    pub reason: String,
}

/// The bindings of a [`ScriptInfo`].
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
pub struct BindingsInfo {
    /// Service bindings: name → script.
    #[serde(default)]
    pub services: BTreeMap<String, String>,
    /// Dispatch namespaces: namespace → scripts.
    #[serde(default)]
    pub dispatch: BTreeMap<String, BTreeSet<String>>,
    /// The outbound Worker of the user Workers it dispatches to.
    #[serde(default)]
    pub outbound: Option<String>,
    /// Tail Workers of the flows it starts.
    #[serde(default)]
    pub tail: Vec<String>,
    /// Origins it may fetch (`scheme://host[:port]`).
    #[serde(default)]
    pub allowed_hosts: Vec<String>,
    /// Durable Object bindings: name → the class whose objects it
    /// addresses.
    #[serde(default)]
    pub durable_objects: BTreeMap<String, ObjectBindingInfo>,
}

/// The class a Durable Object binding of a [`BindingsInfo`] names: of the
/// Worker's own script (a bare class name) or of another script.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(untagged)]
pub enum ObjectBindingInfo {
    /// A class of the Worker's own script.
    Class(String),
    /// A class of another script.
    Script {
        /// The class.
        class: String,
        /// The script exporting it.
        script: String,
    },
}

impl std::fmt::Display for ObjectBindingInfo {
    /// `Class`, or `Class@script` (as `hearth deploy --durable-object` takes it).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ObjectBindingInfo::Class(c) => f.write_str(c),
            ObjectBindingInfo::Script { class, script } => write!(f, "{class}@{script}"),
        }
    }
}

/// What a deploy reports.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct DeployReport {
    /// The script as stored.
    pub meta: ScriptInfo,
    /// The compressed size limit of its plan, bytes.
    #[serde(default)]
    pub limit: u64,
    /// How long compiling (or loading the artifact) took, ms.
    #[serde(default)]
    pub compile_time: f64,
    /// `compiled` or `artifact`.
    #[serde(default)]
    pub code_source: String,
    /// How the other members heard of it.
    #[serde(default)]
    pub announced: Announcement,
}

/// How a deploy was announced to the other members of a cluster (absent
/// or empty for a standalone node).
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
pub struct Announcement {
    /// Members told (every ring member but the deploying node).
    #[serde(default)]
    pub members: usize,
    /// Members that acknowledged: they serve the new version.
    #[serde(default)]
    pub acknowledged: usize,
    /// Milliseconds from the store write to each member's acknowledgement.
    #[serde(default)]
    pub ack_ms: Vec<(String, f64)>,
    /// Members that could not be told, and why (they revalidate within a
    /// second by themselves).
    #[serde(default)]
    pub failed: Vec<(String, String)>,
}

/// What `POST /v1/scripts/{id}/hand-back` did.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct HandBack {
    /// The Worker.
    pub script_id: String,
    /// Its home.
    pub home: String,
    /// How the prewarm at the home went (`loaded`, `already_warm`, ...).
    pub home_prewarm: String,
    /// Nodes that dropped a warm copy.
    #[serde(default)]
    pub dropped: Vec<String>,
    /// Nodes that could not be asked, and why.
    #[serde(default)]
    pub failed: Vec<(String, String)>,
}

/// The ring as one node sees it: what `GET /v1/ring` answers and
/// `hearth ring` prints.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RingView {
    /// The node that answered.
    pub node: String,
    /// Whether it is in a cluster (a standalone node serves everything).
    pub clustered: bool,
    /// The members on its ring, by ID.
    pub members: Vec<RingMember>,
    /// The script asked about, if any.
    pub script: Option<ScriptPlacement>,
}

/// One member of a [`RingView`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RingMember {
    /// Node ID.
    pub id: String,
    /// RPC address peers dial.
    pub rpc: std::net::SocketAddr,
    /// Weight on the ring.
    pub weight: u32,
    /// Fraction of the key space it owns.
    pub ownership: f64,
    /// `self` for the node that answered, else `up` (a member that fails
    /// or drains leaves the ring, so every member listed is up).
    pub state: String,
}

/// Where a script lives, on a [`RingView`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ScriptPlacement {
    /// The script ID.
    pub script_id: String,
    /// Its home (none on an empty ring; this node when standalone).
    pub home: Option<String>,
    /// The home, then the next distinct members clockwise (up to 3): where
    /// it goes if the home leaves.
    pub successors: Vec<String>,
    /// Whether it is warm on the answering node.
    pub warm_here: bool,
}

impl std::fmt::Display for RingView {
    /// What `hearth ring` prints: the members with weights and shares, and
    /// the script's home and successors if one was asked about.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.clustered {
            writeln!(f, "ring of {} ({} members)", self.node, self.members.len())?;
            for m in &self.members {
                writeln!(
                    f,
                    "  {:<16} {:<22} weight {:<3} {:>6.2}%  {}",
                    m.id,
                    m.rpc,
                    m.weight,
                    m.ownership * 100.0,
                    m.state
                )?;
            }
        } else {
            writeln!(
                f,
                "{} is a standalone node: it serves every Worker itself",
                self.node
            )?;
        }
        if let Some(p) = &self.script {
            writeln!(
                f,
                "{}: home {}, successors {} (warm on {}: {})",
                p.script_id,
                p.home.as_deref().unwrap_or("none"),
                p.successors.join(", "),
                self.node,
                if p.warm_here { "yes" } else { "no" }
            )?;
        }
        Ok(())
    }
}

/// The node counters of `GET /v1/stats` that clients read.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
pub struct NodeStats {
    /// Requests served.
    #[serde(default)]
    pub requests: u64,
    /// Requests that found their Worker warm.
    #[serde(default)]
    pub warm: u64,
    /// Requests that cold-started their Worker.
    #[serde(default)]
    pub cold: u64,
    /// Evictions under memory pressure.
    #[serde(default)]
    pub evicted_pressure: u64,
    /// Evictions after the idle timeout.
    #[serde(default)]
    pub evicted_idle: u64,
    /// Evictions asked for (`POST /v1/scripts/{id}/evict`).
    #[serde(default)]
    pub evicted_manual: u64,
    /// Bytes resident now.
    #[serde(default)]
    pub resident_bytes: u64,
    /// Instances serving a request now.
    #[serde(default)]
    pub in_flight: u64,
    /// Requests answered 503 because no instance slot came free in time.
    #[serde(default)]
    pub busy: u64,
    /// Requests stopped at their CPU limit.
    #[serde(default)]
    pub cpu_kills: u64,
    /// Requests stopped at their wall-clock limit.
    #[serde(default)]
    pub wall_kills: u64,
    /// Requests refused because the client stalled sending its body.
    #[serde(default)]
    pub client_timeouts: u64,
    /// Invocations cancelled because their client went away.
    #[serde(default)]
    pub cancelled: u64,
}

/// A node's Prometheus page (`GET /metrics`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Metrics(pub String);

impl Metrics {
    /// The value of sample `name` whose label set contains `labels` (e.g.
    /// `cause="idle"`; "" for a sample without labels).
    pub fn sample(&self, name: &str, labels: &str) -> Option<f64> {
        self.0
            .lines()
            .filter(|l| !l.starts_with('#'))
            .find_map(|line| {
                let rest = line.strip_prefix(name)?;
                let (set, value) = match rest.strip_prefix('{') {
                    Some(r) => r.split_once('}')?,
                    None if rest.starts_with(' ') => ("", rest),
                    None => return None,
                };
                if !labels.is_empty() && !set.split(',').any(|l| l.trim() == labels) {
                    return None;
                }
                value.split_whitespace().next()?.parse().ok()
            })
    }
}

/// A client of one node's admin API. Cheap to clone (the connection pool
/// is shared).
#[derive(Clone)]
pub struct AdminClient {
    http: Client<HttpsConnector<HttpConnector>, Full<Bytes>>,
    url: String,
    token: Option<String>,
    timeout: Duration,
}

impl std::fmt::Debug for AdminClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the token.
        f.debug_struct("AdminClient")
            .field("url", &self.url)
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

impl AdminClient {
    /// A client of the admin API at `url` (`http://host:port`, a trailing
    /// `/` ignored), authenticating with `token` (an empty token is none).
    /// An `https://` URL needs the node's CA: [`AdminClient::with_ca`].
    pub fn new(url: &str, token: Option<String>) -> Result<Self, AdminError> {
        let (url, https) = parse_url(url)?;
        if https {
            return Err(AdminError::InvalidUrl {
                url,
                reason: "an https:// admin URL needs the CA that signed the node's \
                         certificate (AdminClient::with_ca; hearth: --admin-ca)"
                    .into(),
            });
        }
        // Never used for http://; a config with no roots trusts nothing.
        let tls = client_config(rustls::RootCertStore::empty())?;
        Ok(Self::build(url, token, tls, None))
    }

    /// A client of the admin API at `url` (`https://host:port`, or
    /// `http://`), trusting only the CA certificate(s) in the PEM file
    /// `ca`, and checking that the node's certificate is for `server_name`
    /// (default: the URL's host). A node whose admin certificate comes from
    /// `hearth pki` is `<node-id>.node.hearth.cluster` under the cluster's
    /// `ca.pem`.
    pub fn with_ca(
        url: &str,
        token: Option<String>,
        ca: &std::path::Path,
        server_name: Option<&str>,
    ) -> Result<Self, AdminError> {
        use rustls::pki_types::pem::PemObject;
        let (url, _) = parse_url(url)?;
        let ca_error = |reason: String| AdminError::Tls(format!("{}: {reason}", ca.display()));
        let mut roots = rustls::RootCertStore::empty();
        for cert in rustls::pki_types::CertificateDer::pem_file_iter(ca)
            .map_err(|e| ca_error(e.to_string()))?
        {
            roots
                .add(cert.map_err(|e| ca_error(e.to_string()))?)
                .map_err(|e| ca_error(e.to_string()))?;
        }
        if roots.is_empty() {
            return Err(ca_error("no certificate in it".into()));
        }
        let name = match server_name {
            Some(n) => Some(
                rustls::pki_types::ServerName::try_from(n.to_string())
                    .map_err(|e| AdminError::Tls(format!("server name {n:?}: {e}")))?,
            ),
            None => None,
        };
        Ok(Self::build(url, token, client_config(roots)?, name))
    }

    fn build(
        url: String,
        token: Option<String>,
        tls: rustls::ClientConfig,
        server_name: Option<rustls::pki_types::ServerName<'static>>,
    ) -> Self {
        let builder = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(tls)
            .https_or_http();
        let builder = match server_name {
            Some(name) => {
                builder.with_server_name_resolver(hyper_rustls::FixedServerNameResolver::new(name))
            }
            None => builder,
        };
        let connector = builder.enable_http1().build();
        AdminClient {
            http: Client::builder(TokioExecutor::new()).build(connector),
            url,
            token: token.filter(|t| !t.is_empty()),
            timeout: DEFAULT_TIMEOUT,
        }
    }

    /// The same client, waiting at most `timeout` for each answer.
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// The admin URL, without a trailing `/`.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Whether a token was given (the routes under `/v1` need one).
    pub fn has_token(&self) -> bool {
        self.token.is_some()
    }

    /// Deploys `component` as `script_id` with the settings of `query`
    /// (the query string of `PUT /v1/scripts/{id}`, e.g. `plan=paid`).
    pub async fn deploy(
        &self,
        script_id: &str,
        query: &str,
        component: Vec<u8>,
    ) -> Result<DeployReport, AdminError> {
        let path = format!("/v1/scripts/{script_id}?{query}");
        let body = self
            .call(Method::PUT, &path, true, Bytes::from(component))
            .await?;
        self.parse(&path, &body)
    }

    /// Sets secret `name` of `script_id` to `value` (sent as the body,
    /// never in the URL).
    pub async fn put_secret(
        &self,
        script_id: &str,
        name: &str,
        value: &str,
    ) -> Result<SecretChange, AdminError> {
        let path = format!("/v1/scripts/{script_id}/secrets/{name}");
        let body = self
            .call(
                Method::PUT,
                &path,
                true,
                Bytes::copy_from_slice(value.as_bytes()),
            )
            .await?;
        self.parse(&path, &body)
    }

    /// `script_id`'s versions, its current deployment, and the node's
    /// per-version counts during a split.
    pub async fn versions(&self, script_id: &str) -> Result<VersionList, AdminError> {
        let path = format!("/v1/scripts/{script_id}/versions");
        let body = self.call(Method::GET, &path, true, Bytes::new()).await?;
        self.parse(&path, &body)
    }

    /// Makes `split` (percentages summing to 100) `script_id`'s
    /// deployment, announced to every member like a deploy.
    pub async fn set_deployment(
        &self,
        script_id: &str,
        split: &[VersionShare],
    ) -> Result<DeploymentChange, AdminError> {
        let path = format!("/v1/scripts/{script_id}/deployment");
        let body = serde_json::to_vec(&serde_json::json!({ "split": split })).map_err(|error| {
            AdminError::Malformed {
                url: self.url.clone(),
                path: path.clone(),
                error,
            }
        })?;
        let body = self
            .call(Method::PUT, &path, true, Bytes::from(body))
            .await?;
        self.parse(&path, &body)
    }

    /// Rolls `script_id` back to `version` (default: the one before the
    /// current) at 100%, announced to every member like a deploy.
    pub async fn rollback(
        &self,
        script_id: &str,
        version: Option<u64>,
    ) -> Result<DeploymentChange, AdminError> {
        let path = match version {
            Some(v) => format!("/v1/scripts/{script_id}/rollback?version={v}"),
            None => format!("/v1/scripts/{script_id}/rollback"),
        };
        let body = self.call(Method::POST, &path, true, Bytes::new()).await?;
        self.parse(&path, &body)
    }

    /// The names of `script_id`'s secrets.
    pub async fn secrets(&self, script_id: &str) -> Result<SecretList, AdminError> {
        let path = format!("/v1/scripts/{script_id}/secrets");
        let body = self.call(Method::GET, &path, true, Bytes::new()).await?;
        self.parse(&path, &body)
    }

    /// Deletes secret `name` of `script_id`.
    pub async fn delete_secret(
        &self,
        script_id: &str,
        name: &str,
    ) -> Result<SecretChange, AdminError> {
        let path = format!("/v1/scripts/{script_id}/secrets/{name}");
        let body = self.call(Method::DELETE, &path, true, Bytes::new()).await?;
        self.parse(&path, &body)
    }

    /// The scripts deployed, as the node lists them.
    pub async fn list(&self) -> Result<Vec<ScriptInfo>, AdminError> {
        let path = "/v1/scripts";
        let body = self.call(Method::GET, path, true, Bytes::new()).await?;
        self.parse(path, &body)
    }

    /// Evicts `script_id` from the node's memory (its next request is a
    /// cold start there).
    pub async fn evict(&self, script_id: &str) -> Result<(), AdminError> {
        let path = format!("/v1/scripts/{script_id}/evict");
        self.call(Method::POST, &path, true, Bytes::new()).await?;
        Ok(())
    }

    /// Hands `script_id` back to its home: prewarmed there, every other
    /// node's warm copy dropped.
    pub async fn hand_back(&self, script_id: &str) -> Result<HandBack, AdminError> {
        let path = format!("/v1/scripts/{script_id}/hand-back");
        let body = self.call(Method::POST, &path, true, Bytes::new()).await?;
        self.parse(&path, &body)
    }

    /// The ring as the node sees it, and (with `script`) that Worker's
    /// home and successors.
    pub async fn ring(&self, script: Option<&str>) -> Result<RingView, AdminError> {
        let path = match script {
            Some(id) => format!("/v1/ring?script={}", query_value(id)),
            None => "/v1/ring".to_string(),
        };
        let body = self.call(Method::GET, &path, true, Bytes::new()).await?;
        self.parse(&path, &body)
    }

    /// The node's counters.
    pub async fn stats(&self) -> Result<NodeStats, AdminError> {
        let path = "/v1/stats";
        let body = self.call(Method::GET, path, true, Bytes::new()).await?;
        self.parse(path, &body)
    }

    /// The node's Prometheus page (no token needed).
    pub async fn metrics(&self) -> Result<Metrics, AdminError> {
        let body = self
            .call(Method::GET, "/metrics", false, Bytes::new())
            .await?;
        Ok(Metrics(String::from_utf8_lossy(&body).into_owned()))
    }

    fn parse<T: serde::de::DeserializeOwned>(
        &self,
        path: &str,
        body: &[u8],
    ) -> Result<T, AdminError> {
        serde_json::from_slice(body).map_err(|error| AdminError::Malformed {
            url: self.url.clone(),
            path: path.to_string(),
            error,
        })
    }

    async fn call(
        &self,
        method: Method,
        path: &str,
        auth: bool,
        body: Bytes,
    ) -> Result<Bytes, AdminError> {
        let mut req = http::Request::builder()
            .method(method.clone())
            .uri(format!("{}{path}", self.url));
        if auth {
            let token = self.token.as_deref().ok_or(AdminError::NoToken)?;
            req = req.header(http::header::AUTHORIZATION, format!("Bearer {token}"));
        }
        let req = req
            .body(Full::new(body))
            .map_err(|e| AdminError::InvalidUrl {
                url: format!("{}{path}", self.url),
                reason: e.to_string(),
            })?;
        let unreachable = |error: &dyn std::error::Error| AdminError::Unreachable {
            url: self.url.clone(),
            error: with_causes(error),
        };
        let exchange = async {
            let resp = self.http.request(req).await.map_err(|e| unreachable(&e))?;
            let status = resp.status();
            let body = resp
                .into_body()
                .collect()
                .await
                .map_err(|e| unreachable(&e))?
                .to_bytes();
            Ok::<_, AdminError>((status, body))
        };
        let (status, body) = tokio::time::timeout(self.timeout, exchange)
            .await
            .map_err(|_| AdminError::Timeout {
                url: self.url.clone(),
                timeout: self.timeout,
            })??;
        if !status.is_success() {
            return Err(AdminError::Refused {
                method,
                url: self.url.clone(),
                path: path.to_string(),
                status,
                body: String::from_utf8_lossy(&body).trim().to_string(),
            });
        }
        Ok(body)
    }
}

/// `url` without a trailing `/`, and whether it is `https://`; anything
/// but an `http://` or `https://` URL with a host is refused.
fn parse_url(url: &str) -> Result<(String, bool), AdminError> {
    let url = url.trim_end_matches('/').to_string();
    let uri: http::Uri =
        url.parse()
            .map_err(|e: http::uri::InvalidUri| AdminError::InvalidUrl {
                url: url.clone(),
                reason: e.to_string(),
            })?;
    let https = match uri.scheme_str() {
        Some("http") => false,
        Some("https") => true,
        _ => {
            return Err(AdminError::InvalidUrl {
                url,
                reason: "expected http://host:port or https://host:port".into(),
            });
        }
    };
    if uri.authority().is_none() {
        return Err(AdminError::InvalidUrl {
            url,
            reason: "expected http://host:port or https://host:port".into(),
        });
    }
    Ok((url, https))
}

/// A TLS client configuration (rustls on ring, as the node's) trusting
/// `roots`.
fn client_config(roots: rustls::RootCertStore) -> Result<rustls::ClientConfig, AdminError> {
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    Ok(rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| AdminError::Tls(e.to_string()))?
        .with_root_certificates(roots)
        .with_no_client_auth())
}

/// `error` and its causes, `: `-separated (hyper's connect error says
/// only "client error (Connect)"; the cause says what happened).
fn with_causes(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut cause = error.source();
    while let Some(e) = cause {
        text.push_str(": ");
        text.push_str(&e.to_string());
        cause = e.source();
    }
    text
}

/// `value` percent-encoded for a query string: unreserved characters
/// (RFC 3986 §2.3) as they are, every other byte as `%XX`.
fn query_value(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for b in value.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_prometheus_samples() {
        let page = Metrics(
            "# TYPE hearth_refusals_received counter\n\
             hearth_refusals_received_total 7\n\
             hearth_evictions_total{cause=\"pressure\"} 3\n\
             hearth_evictions_total{cause=\"idle\"} 2\n\
             hearth_resident_bytes 4096\n"
                .to_string(),
        );
        assert_eq!(page.sample("hearth_refusals_received_total", ""), Some(7.0));
        assert_eq!(
            page.sample("hearth_evictions_total", "cause=\"idle\""),
            Some(2.0)
        );
        assert_eq!(page.sample("hearth_resident_bytes", ""), Some(4096.0));
        assert_eq!(page.sample("hearth_resident", ""), None);
        assert_eq!(page.sample("hearth_missing_total", ""), None);
    }

    #[test]
    fn urls_and_tokens_are_checked() {
        assert!(AdminClient::new("http://127.0.0.1:8081/", None).is_ok());
        assert!(AdminClient::new("https://127.0.0.1:8081", None).is_err());
        let missing = std::path::Path::new("/nonexistent/ca.pem");
        assert!(matches!(
            AdminClient::with_ca("https://127.0.0.1:8081", None, missing, None),
            Err(AdminError::Tls(_))
        ));
        assert!(AdminClient::new("not a url", None).is_err());
        let c = AdminClient::new("http://127.0.0.1:8081/", Some(String::new())).expect("url");
        assert_eq!(c.url(), "http://127.0.0.1:8081");
        assert!(!c.has_token());
        assert!(!format!("{c:?}").contains("Bearer"));
    }

    #[test]
    fn answers_parse_and_ignore_unknown_fields() {
        let report: DeployReport = serde_json::from_str(
            r#"{"meta":{"script_id":"hello","plan":"free","size":10,"compressed_size":5,
                "hash":"ab","deployed_at_ms":1,"lifecycle":{"requested":"auto","chosen":"reuse",
                "reason":"Rust"},"bindings":{"services":{"auth":"a"}},"new_field":1},
                "limit":3145728,"compile_time":1.5,"code_source":"compiled"}"#,
        )
        .expect("report");
        assert_eq!(report.meta.lifecycle.chosen, "reuse");
        assert_eq!(report.meta.bindings.services["auth"], "a");
        let stats: NodeStats =
            serde_json::from_str(r#"{"requests":3,"evicted_idle":2,"other":{"x":1}}"#)
                .expect("stats");
        assert_eq!((stats.requests, stats.evicted_idle), (3, 2));
    }

    #[tokio::test]
    async fn a_node_that_is_not_there_is_unreachable_and_no_token_is_said() {
        let c = AdminClient::new("http://127.0.0.1:1", None).expect("url");
        assert!(matches!(c.list().await, Err(AdminError::NoToken)));
        let c = c.with_timeout(Duration::from_secs(5));
        assert!(matches!(
            c.metrics().await,
            Err(AdminError::Unreachable { .. })
        ));
    }

    #[test]
    fn a_ring_view_prints_members_and_placement() {
        let view: RingView = serde_json::from_str(
            r#"{"node":"node-1","clustered":true,"members":[
                {"id":"node-1","rpc":"127.0.0.1:7000","weight":1,"ownership":0.25,"state":"self"},
                {"id":"node-2","rpc":"127.0.0.1:7100","weight":3,"ownership":0.75,"state":"up"}],
                "script":{"script_id":"hello","home":"node-2","successors":["node-2","node-1"],
                "warm_here":false}}"#,
        )
        .expect("view");
        let text = view.to_string();
        assert!(text.starts_with("ring of node-1 (2 members)\n"), "{text}");
        assert!(text.contains(" 75.00%  up"), "{text}");
        assert!(
            text.contains("hello: home node-2, successors node-2, node-1 (warm on node-1: no)"),
            "{text}"
        );
        let alone = RingView {
            clustered: false,
            members: Vec::new(),
            script: None,
            ..view
        };
        assert_eq!(
            alone.to_string(),
            "node-1 is a standalone node: it serves every Worker itself\n"
        );
    }

    #[test]
    fn query_values_are_percent_encoded() {
        assert_eq!(query_value("hello-world_1.x~"), "hello-world_1.x~");
        assert_eq!(query_value("a b&c=d/é"), "a%20b%26c%3Dd%2F%C3%A9");
    }
}
