//! The role a request is served in, end to end: each path through a real
//! node reports its route in `x-hearth-route` and is counted once, under
//! that route, in `hearth_requests_total` of the node that ran the Worker.
//!
//! Paths: `home` (the receiving node is the home), `local` (warm here),
//! `sharded` (forwarded and served by the home), `fallback` after the home
//! refused, and `fallback` after the home could not be reached.

use std::net::SocketAddr;
use std::time::Duration;

use hearth::cluster::ClusterConfig;
use hearth::metrics::{Metrics, RequestLabels};
use hearth::node::{ClusterLink, Node};
use hearth::runtime::{Plan, Runtime, RuntimeConfig};
use hearth::sharding::admission::OverloadConfig;
use hearth::sharding::ring::{Member, NodeId, Ring, RingConfig, SharedRing};
use hearth::sharding::routing::Route;
use hearth::sharding::rpc::{RpcConfig, RpcNode};
use hearth::sharding::tls::{NodeTls, generate_dev_pki};
use hearth::testing::TestCluster;

fn sample(name: &str) -> Vec<u8> {
    hearth_sample_workers::bytes(name).expect("sample built")
}

/// Requests a node counted under `route`, whatever their start.
fn counted(metrics: &Metrics, route: Route) -> u64 {
    ["cold", "warm", "prewarmed", "error"]
        .into_iter()
        .map(|start| {
            metrics
                .requests
                .get_or_create(&RequestLabels {
                    route: route.as_str().into(),
                    start: start.into(),
                })
                .get()
        })
        .sum()
}

/// Shard hops a node has timed (`hearth_shard_hop_seconds_count`).
fn hops_timed(metrics: &Metrics) -> u64 {
    metrics
        .render()
        .lines()
        .find_map(|l| l.strip_prefix("hearth_shard_hop_seconds_count "))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or(0)
}

/// Every route's count on a node, in [`Route::ALL`] order.
fn counts(metrics: &Metrics) -> [u64; 4] {
    Route::ALL.map(|r| counted(metrics, r))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn home_local_and_sharded_are_counted_once_by_the_serving_node() {
    let c = TestCluster::start(3).await.expect("cluster");
    c.deploy("hello", Plan::Free, sample("hello"))
        .await
        .expect("deploy");
    let home = c.home_of("hello").expect("home");
    let other = (home + 1) % 3;
    let metrics = |i: usize| c.node(i).node.metrics();

    let r = c.get(home, "hello", "/").await.expect("request");
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("x-hearth-route"), "home");
    assert_eq!(counts(metrics(home)), [0, 1, 0, 0], "home");

    let r = c.get(home, "hello", "/").await.expect("request");
    assert_eq!(r.header("x-hearth-route"), "local", "warm at the home");
    assert_eq!(counts(metrics(home)), [1, 1, 0, 0], "local");

    let r = c.get(other, "hello", "/").await.expect("request");
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("x-hearth-route"), "sharded");
    assert_eq!(r.header("x-hearth-node"), c.node(home).node.id());
    assert!(
        r.header("server-timing").starts_with("shard;dur="),
        "{}",
        r.header("server-timing")
    );
    assert_eq!(
        counts(metrics(home)),
        [1, 1, 1, 0],
        "the home counts what it served for another node as sharded"
    );
    assert_eq!(
        counts(metrics(other)),
        [0, 0, 0, 0],
        "the receiving node ran nothing, so counts no request"
    );
    assert_eq!(
        hops_timed(metrics(other)),
        1,
        "the receiving node times the hop"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_the_home_refuses_is_counted_as_fallback_where_it_ran() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut cfg = ClusterConfig::new(3, dir.path());
    // A home that admits nothing: every sharded request is refused.
    cfg.overload = OverloadConfig {
        max_in_flight_per_worker: 0,
        max_in_flight_node: 0,
    };
    let c = TestCluster::with_config(cfg, Some(dir))
        .await
        .expect("cluster");
    c.deploy("hello", Plan::Free, sample("hello"))
        .await
        .expect("deploy");
    let home = c.home_of("hello").expect("home");
    let client = (home + 1) % 3;

    let r = c.get(client, "hello", "/").await.expect("request");
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("x-hearth-route"), "fallback");
    let client_metrics = c.node(client).node.metrics();
    assert_eq!(
        counts(client_metrics),
        [0, 0, 0, 1],
        "served here after the refusal: fallback, not home"
    );
    assert_eq!(counts(c.node(home).node.metrics()), [0, 0, 0, 0]);

    let r = c.get(client, "hello", "/").await.expect("request");
    assert_eq!(r.header("x-hearth-route"), "local");
    assert_eq!(counts(client_metrics), [1, 0, 0, 1]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_whose_home_is_unreachable_is_counted_as_fallback() {
    let dir = tempfile::tempdir().expect("tempdir");
    let pki = dir.path().join("pki");
    generate_dev_pki(&pki, &["a"]).expect("pki");
    let runtime = Runtime::new(RuntimeConfig::new(dir.path().join("store"))).expect("runtime");
    let node = Node::new("a", runtime);
    let rpc = RpcNode::start(
        RpcConfig::new(NodeTls::load(&pki, "a").expect("tls")),
        node.hosted_workers(),
    )
    .expect("rpc");
    // A ring of this node and one whose address has nobody listening.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let ghost_addr = closed.local_addr().expect("addr");
    drop(closed);
    let unused: SocketAddr = "127.0.0.1:1".parse().expect("addr");
    let ring = Ring::new(
        [Member::new("a", unused), Member::new("ghost", ghost_addr)],
        RingConfig::default(),
    )
    .expect("ring");
    let name = (0..1000)
        .map(|i| format!("w{i}"))
        .find(|n| ring.home(n).is_some_and(|m| m.id.as_str() == "ghost"))
        .expect("a name homed on the ghost");
    let node = node.join(
        ClusterLink {
            self_id: NodeId::new("a"),
            ring: SharedRing::new(ring),
        },
        rpc,
    );
    node.deploy(&name, Plan::Free, sample("hello"))
        .await
        .expect("deploy");

    let get = || {
        http::Request::get("/")
            .header(http::header::HOST, format!("{name}.localhost"))
            .body(hearth::runtime::body::full(bytes::Bytes::new()))
            .expect("request")
    };
    let resp = tokio::time::timeout(Duration::from_secs(30), node.handle(&name, get()))
        .await
        .expect("served in time");
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["x-hearth-route"], "fallback");
    assert_eq!(counts(node.metrics()), [0, 0, 0, 1]);
    assert_eq!(node.rpc().expect("rpc").stats().home_unavailable, 1);

    let resp = node.handle(&name, get()).await;
    assert_eq!(resp.headers()["x-hearth-route"], "local", "warm here now");
    assert_eq!(counts(node.metrics()), [1, 0, 0, 1]);
}
