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

use std::ops::{Deref, DerefMut};

use bytes::Bytes;
use http_body_util::BodyExt;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;

use hearth_runtime::{DeployReport, Plan, StatsSnapshot};
use hearth_sharding::rpc::RpcStats;

use crate::cluster::{ClusterConfig, LocalCluster};

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

/// Per-node counters.
#[derive(Debug, Clone)]
pub struct NodeStats {
    /// The runtime's counters.
    pub runtime: StatsSnapshot,
    /// The RPC layer's counters.
    pub rpc: RpcStats,
}

/// A cluster of real nodes for tests; derefs to [`LocalCluster`].
pub struct TestCluster {
    cluster: LocalCluster,
    client: Client<HttpConnector, http_body_util::Full<Bytes>>,
    _dir: Option<tempfile::TempDir>,
}

impl Deref for TestCluster {
    type Target = LocalCluster;
    fn deref(&self) -> &LocalCluster {
        &self.cluster
    }
}

impl DerefMut for TestCluster {
    fn deref_mut(&mut self) -> &mut LocalCluster {
        &mut self.cluster
    }
}

impl TestCluster {
    /// `n` nodes with default settings over a fresh temporary store.
    pub async fn start(n: usize) -> anyhow::Result<Self> {
        let dir = tempfile::tempdir()?;
        let cfg = ClusterConfig::new(n, dir.path());
        Self::with_config(cfg, Some(dir)).await
    }

    /// A cluster from `cfg`; `dir` (if any) is deleted when it drops.
    pub async fn with_config(
        cfg: ClusterConfig,
        dir: Option<tempfile::TempDir>,
    ) -> anyhow::Result<Self> {
        let cluster = LocalCluster::start(cfg).await?;
        Ok(TestCluster {
            cluster,
            client: Client::builder(TokioExecutor::new()).build_http(),
            _dir: dir,
        })
    }

    /// Deploys through node 0; the shared store makes it available to all.
    pub async fn deploy(
        &self,
        id: &str,
        plan: Plan,
        wasm: Vec<u8>,
    ) -> anyhow::Result<DeployReport> {
        Ok(self
            .cluster
            .node(0)
            .node
            .runtime()
            .deploy(id, plan, wasm)
            .await?)
    }

    /// Deploys through node 0 with the settings of `manifest` (plan,
    /// lifecycle, bindings).
    pub async fn deploy_manifest(
        &self,
        id: &str,
        manifest: hearth_runtime::Manifest,
        wasm: Vec<u8>,
    ) -> anyhow::Result<DeployReport> {
        Ok(self
            .cluster
            .node(0)
            .node
            .runtime()
            .deploy(id, manifest, wasm)
            .await?)
    }

    /// GET `path` of Worker `id` through node `i`'s front door.
    pub async fn get(&self, i: usize, id: &str, path: &str) -> anyhow::Result<TestResponse> {
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
    ) -> anyhow::Result<TestResponse> {
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
