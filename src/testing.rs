//! `TestCluster`: real hearth nodes inside one test process, as Miniflare
//! is to Workers. Real TCP, real HTTP, real Cap'n Proto RPC with mTLS, real
//! gossip; requests go to a chosen node's front door.
//!
//! ```no_run
//! # async fn demo() -> anyhow::Result<()> {
//! use hearth::testing::TestCluster;
//! use hearth::runtime::Plan;
//! let cluster = TestCluster::start(3).await?;
//! cluster.deploy("hello", Plan::Free, hearth_sample_workers::bytes("hello")?).await?;
//! let resp = cluster.get(1, "hello", "/").await?;
//! assert_eq!(resp.status, 200);
//! println!("served by {} via {}", resp.header("x-hearth-node"), resp.header("x-hearth-route"));
//! println!("{:?}", cluster.stats(0));
//! # Ok(()) }
//! ```
//!
//! What only separate processes show (signals, drains, restarts, the
//! commands a user types) is [`NodeProcess`]'s: a real `hearth serve`
//! started from a config file, driven with `hearth` subcommands and raw
//! HTTP/1.1 ([`HttpRequest`]), stopped with a [`Signal`]. [`Rollout`] runs
//! three of them over a [`Garage`] bucket, under load, replaced one at a
//! time; [`Etcd`] is the fence Durable Objects' heads use when nodes share
//! no disk. [`build_js`] builds a JS Worker's
//! module into a component with hearth's JS engine; tests and benches that
//! build the JS samples with `hearth build` find their npm trees with
//! [`hono_sample`] and [`js_toolchain`]; [`Workerd`] serves one on
//! Cloudflare's workerd, the reference hearth's JS engine is compared with.

use std::net::SocketAddr;
use std::ops::{Deref, DerefMut};
use std::path::Path;
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::BodyExt;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;

use hearth_runtime::{DeployReport, Plan, StatsSnapshot};
use hearth_sharding::rpc::RpcStats;

use crate::cluster::{ClusterConfig, ClusterError, LoopbackCluster};

mod etcd;
pub use etcd::{Etcd, EtcdError};
mod garage;
pub use garage::{Garage, GarageError};
mod js;
mod node_process;
pub use node_process::{
    Finished, Hearth, NodeProcess, Process, ProcessError, START_TIMEOUT, ServeCommand, Signal,
    listening, run,
};
mod ports;
mod proc_stat;
mod raw_http;
pub use js::{JsBuildError, NpmError, build_js, hono_sample, js_echo, js_toolchain};
pub use ports::{tcp_port, tcp_port_block, udp_port};
pub use proc_stat::ProcStat;
pub use raw_http::HttpRequest;
mod rollout;
mod workerd;
pub use rollout::{
    HEALTH_EVERY, Load, Outcome, POOL_SLACK, REQUEST_TIMEOUT, Record, Rollout, RolloutError,
    Summary,
};
pub use workerd::{WORKERD_PACKAGE, WORKERD_VERSION, Workerd, WorkerdError, workerd_binary};

/// Polls `f` every 5 ms until it is true or `limit` has passed; whether it
/// became true. For waiting on an asynchronous effect (a Worker warm on
/// its home, a counter), not for timing anything.
pub async fn eventually(limit: std::time::Duration, mut f: impl FnMut() -> bool) -> bool {
    tokio::time::timeout(limit, async {
        while !f() {
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
    })
    .await
    .is_ok()
}

/// What went wrong in a test client or cluster: the step and its cause.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TestError {
    /// The cluster did not start.
    #[error(transparent)]
    Cluster(#[from] ClusterError),
    /// A deploy was refused.
    #[error(transparent)]
    Deploy(#[from] hearth_runtime::DeployError),
    /// The CA certificate file could not be read or parsed.
    #[error("reading {}", path.display())]
    Ca {
        /// The file.
        path: std::path::PathBuf,
        /// Why not.
        #[source]
        source: rustls::pki_types::pem::Error,
    },
    /// TLS configuration or handshake failed.
    #[error(transparent)]
    Tls(#[from] rustls::Error),
    /// A host name cannot be sent as SNI.
    #[error("{0:?} is not a valid TLS server name")]
    ServerName(String),
    /// A connection or socket failed.
    #[error(transparent)]
    Io(#[from] std::io::Error),
    /// The request could not be built.
    #[error(transparent)]
    Request(#[from] http::Error),
    /// HTTP on a connection failed.
    #[error(transparent)]
    Http(#[from] hyper::Error),
    /// The pooled HTTP client failed.
    #[error(transparent)]
    Client(#[from] hyper_util::client::legacy::Error),
}

/// A response read whole.
#[derive(Debug, Clone)]
pub struct TestResponse {
    /// Status code.
    pub status: u16,
    /// Headers.
    pub headers: http::HeaderMap,
    /// Body.
    pub body: Bytes,
}

impl TestResponse {
    /// A header as text ("" if absent).
    pub fn header(&self, name: &str) -> &str {
        self.headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
    }

    /// The body as text.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// An HTTPS client for tests and tools: trusts one CA (a cluster's
/// development CA, [`LoopbackCluster::tls_ca`]), opens a fresh TLS connection
/// per call, and speaks HTTP/2 or HTTP/1.1 as asked (by ALPN).
#[derive(Clone)]
pub struct HttpsClient {
    h2: Arc<rustls::ClientConfig>,
    h1: Arc<rustls::ClientConfig>,
}

impl HttpsClient {
    /// A client that trusts the PEM CA certificate at `ca`.
    pub fn trusting(ca: &Path) -> Result<Self, TestError> {
        use rustls::pki_types::pem::PemObject;
        let pem_error = |source| TestError::Ca {
            path: ca.to_path_buf(),
            source,
        };
        let mut roots = rustls::RootCertStore::empty();
        for cert in rustls::pki_types::CertificateDer::pem_file_iter(ca).map_err(pem_error)? {
            roots.add(cert.map_err(pem_error)?)?;
        }
        let config = |alpn: &[u8]| -> Result<Arc<rustls::ClientConfig>, TestError> {
            let provider = Arc::new(rustls::crypto::ring::default_provider());
            let mut c = rustls::ClientConfig::builder_with_provider(provider)
                .with_safe_default_protocol_versions()?
                .with_root_certificates(roots.clone())
                .with_no_client_auth();
            c.alpn_protocols = vec![alpn.to_vec()];
            Ok(Arc::new(c))
        };
        Ok(HttpsClient {
            h2: config(b"h2")?,
            h1: config(b"http/1.1")?,
        })
    }

    /// A TLS connection to `addr` whose ClientHello names `host` and
    /// offers `h2` by ALPN if `http2` (else `http/1.1`), for a test that
    /// speaks the protocol itself.
    pub async fn connect(
        &self,
        addr: SocketAddr,
        host: &str,
        http2: bool,
    ) -> Result<tokio_rustls::client::TlsStream<tokio::net::TcpStream>, TestError> {
        let config = if http2 { &self.h2 } else { &self.h1 };
        let tcp = tokio::net::TcpStream::connect(addr).await?;
        tcp.set_nodelay(true)?;
        let name = rustls::pki_types::ServerName::try_from(host.to_string())
            .map_err(|_| TestError::ServerName(host.to_string()))?;
        Ok(tokio_rustls::TlsConnector::from(config.clone())
            .connect(name, tcp)
            .await?)
    }

    /// A TLS handshake naming `host` in its SNI, and nothing else: the
    /// connection is closed without a request.
    pub async fn handshake(&self, addr: SocketAddr, host: &str) -> Result<(), TestError> {
        use tokio::io::AsyncWriteExt;
        let mut tls = self.connect(addr, host, false).await?;
        let _ = tls.shutdown().await;
        Ok(())
    }

    /// `GET https://{host}{path}` on a fresh connection to `addr` (SNI and
    /// Host both `host`), over HTTP/2 if `http2`, else HTTP/1.1. The
    /// response's `version()` tells which was spoken.
    pub async fn get(
        &self,
        addr: SocketAddr,
        host: &str,
        path: &str,
        http2: bool,
    ) -> Result<(http::Version, TestResponse), TestError> {
        let r = self.send(addr, host, host, path, http2).await?;
        Ok((r.version, r.response))
    }

    /// `GET {path}` for `host` on a fresh TLS connection to `addr` whose
    /// ClientHello names `sni`, over HTTP/2 if `http2`, else HTTP/1.1,
    /// timed from the TCP connect to the response head.
    pub async fn send(
        &self,
        addr: SocketAddr,
        sni: &str,
        host: &str,
        path: &str,
        http2: bool,
    ) -> Result<HttpsResponse, TestError> {
        let started = std::time::Instant::now();
        let io = hyper_util::rt::TokioIo::new(self.connect(addr, sni, http2).await?);
        let empty = http_body_util::Empty::<Bytes>::new();
        let resp = if http2 {
            let (mut send, conn) =
                hyper::client::conn::http2::handshake(TokioExecutor::new(), io).await?;
            tokio::spawn(conn);
            let req = http::Request::get(format!("https://{host}{path}")).body(empty)?;
            send.send_request(req).await?
        } else {
            let (mut send, conn) = hyper::client::conn::http1::handshake(io).await?;
            tokio::spawn(conn);
            let req = http::Request::get(path)
                .header(http::header::HOST, host)
                .body(empty)?;
            send.send_request(req).await?
        };
        let ttfb = started.elapsed();
        let version = resp.version();
        let status = resp.status().as_u16();
        let headers = resp.headers().clone();
        let body = resp.into_body().collect().await?.to_bytes();
        Ok(HttpsResponse {
            version,
            ttfb,
            response: TestResponse {
                status,
                headers,
                body,
            },
        })
    }
}

/// What [`HttpsClient::send`] got back.
#[derive(Debug, Clone)]
pub struct HttpsResponse {
    /// The HTTP version spoken (by ALPN).
    pub version: http::Version,
    /// Time from the TCP connect to the response head: handshake, request,
    /// and whatever the node did before answering.
    pub ttfb: std::time::Duration,
    /// The response, read whole.
    pub response: TestResponse,
}

/// Per-node counters.
#[derive(Debug, Clone)]
pub struct NodeStats {
    /// The runtime's counters.
    pub runtime: StatsSnapshot,
    /// The RPC layer's counters.
    pub rpc: RpcStats,
}

/// A cluster of real nodes for tests; derefs to [`LoopbackCluster`].
pub struct TestCluster {
    cluster: LoopbackCluster,
    client: Client<HttpConnector, http_body_util::Full<Bytes>>,
    _dir: Option<tempfile::TempDir>,
}

impl Deref for TestCluster {
    type Target = LoopbackCluster;
    fn deref(&self) -> &LoopbackCluster {
        &self.cluster
    }
}

impl DerefMut for TestCluster {
    fn deref_mut(&mut self) -> &mut LoopbackCluster {
        &mut self.cluster
    }
}

impl TestCluster {
    /// `n` nodes with default settings over a fresh temporary store.
    pub async fn start(n: usize) -> Result<Self, TestError> {
        let dir = tempfile::tempdir()?;
        let cfg = ClusterConfig::new(n, dir.path());
        Self::with_config(cfg, Some(dir)).await
    }

    /// A cluster from `cfg`; `dir` (if any) is deleted when it drops.
    pub async fn with_config(
        cfg: ClusterConfig,
        dir: Option<tempfile::TempDir>,
    ) -> Result<Self, TestError> {
        let cluster = LoopbackCluster::start(cfg).await?;
        Ok(TestCluster {
            cluster,
            client: Client::builder(TokioExecutor::new()).build_http(),
            _dir: dir,
        })
    }

    /// Deploys through node 0 (as its admin API does: the store makes it
    /// available to all, and the other nodes are told at once).
    pub async fn deploy(
        &self,
        id: &str,
        plan: Plan,
        wasm: Vec<u8>,
    ) -> Result<DeployReport, TestError> {
        self.deploy_manifest(id, plan.into(), wasm).await
    }

    /// Deploys through node 0 with the settings of `manifest` (plan,
    /// lifecycle, bindings).
    pub async fn deploy_manifest(
        &self,
        id: &str,
        manifest: hearth_runtime::Manifest,
        wasm: Vec<u8>,
    ) -> Result<DeployReport, TestError> {
        Ok(self
            .cluster
            .node(0)
            .node
            .deploy(id, manifest, wasm)
            .await?
            .report)
    }

    /// GET `path` of Worker `id` through node `i`'s front door.
    pub async fn get(&self, i: usize, id: &str, path: &str) -> Result<TestResponse, TestError> {
        self.send(i, id, http::Method::GET, path, Bytes::new(), &[])
            .await
    }

    /// Sends a request to Worker `id` through node `i`'s front door.
    pub async fn send(
        &self,
        i: usize,
        id: &str,
        method: http::Method,
        path: &str,
        body: Bytes,
        headers: &[(&str, &str)],
    ) -> Result<TestResponse, TestError> {
        let addr = self.cluster.node(i).http_addr;
        let mut req = http::Request::builder()
            .method(method)
            .uri(format!("http://{addr}{path}"))
            .header(http::header::HOST, format!("{id}.localhost"));
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        let resp = self
            .client
            .request(req.body(http_body_util::Full::new(body))?)
            .await?;
        let status = resp.status().as_u16();
        let headers = resp.headers().clone();
        let body = resp.into_body().collect().await?.to_bytes();
        Ok(TestResponse {
            status,
            headers,
            body,
        })
    }

    /// Node `i`'s counters.
    pub fn stats(&self, i: usize) -> NodeStats {
        let n = &self.cluster.node(i).node;
        NodeStats {
            runtime: n.runtime().stats(),
            rpc: n.rpc().map(|r| r.stats()).unwrap_or_default(),
        }
    }

    /// Cold starts summed over the cluster (loads from source or artifact).
    pub fn total_cold(&self) -> u64 {
        (0..self.cluster.nodes().len())
            .map(|i| self.stats(i).runtime.cold)
            .sum()
    }
}
