//! Sharding across real nodes on loopback (TestCluster: real HTTP front
//! doors, Cap'n Proto RPC over mTLS, gossip membership).

use std::time::Duration;

use bytes::Bytes;
use hearth::cluster::ClusterConfig;
use hearth::runtime::Plan;
use hearth::sharding::admission::OverloadConfig;
use hearth::testing::{HttpRequest, TestCluster};

/// Waits up to 5 s for `f` (see [`hearth::testing::eventually`]).
async fn eventually(f: impl FnMut() -> bool) -> bool {
    hearth::testing::eventually(Duration::from_secs(5), f).await
}

fn sample(name: &str) -> Vec<u8> {
    hearth_sample_workers::bytes(name).expect("sample built")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn round_robin_cold_starts_once_in_the_cluster() {
    let c = TestCluster::start(3).await.expect("cluster");
    c.deploy("hello", Plan::Free, sample("hello"))
        .await
        .expect("deploy");
    let home = c.home_of("hello").expect("home");
    for i in 0..12 {
        let r = c.get(i % 3, "hello", "/").await.expect("request");
        assert_eq!(r.status, 200, "{}", r.text());
        assert_eq!(r.text(), "hello from hello");
        assert_eq!(
            r.header("x-hearth-node"),
            c.node(home).node.id(),
            "served by the home"
        );
        let expect_start = if i == 0 { "cold" } else { "warm" };
        assert_eq!(r.header("x-hearth-start"), expect_start, "request {i}");
        let route = r.header("x-hearth-route");
        if i % 3 == home {
            assert!(route == "home" || route == "local", "{route}");
        } else {
            assert_eq!(route, "sharded");
            assert!(r.header("server-timing").starts_with("shard;dur="));
        }
    }
    assert_eq!(c.total_cold(), 1, "one cold start in the whole cluster");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overloaded_home_refuses_and_the_client_serves_locally() {
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
    assert_eq!(r.status, 200);
    assert_eq!(r.header("x-hearth-route"), "fallback");
    assert_eq!(r.header("x-hearth-start"), "cold");
    assert_eq!(r.header("x-hearth-node"), c.node(client).node.id());
    for _ in 0..5 {
        let r = c.get(client, "hello", "/").await.expect("request");
        assert_eq!(r.status, 200);
        assert_eq!(
            r.header("x-hearth-route"),
            "local",
            "kept serving it locally"
        );
        assert_eq!(r.header("x-hearth-start"), "warm");
    }
    assert_eq!(c.stats(client).rpc.refusals_received, 1);
    assert_eq!(c.stats(home).rpc.refusals_sent(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bodies_stream_both_ways_through_the_home() {
    let c = TestCluster::start(3).await.expect("cluster");
    c.deploy("echo", Plan::Free, sample("echo"))
        .await
        .expect("deploy");
    let home = c.home_of("echo").expect("home");
    let client = (home + 1) % 3;
    let payload: Vec<u8> = (0..10_000_000u32)
        .map(|i| (i.wrapping_mul(31) % 253) as u8)
        .collect();
    let r = c
        .send(
            client,
            "echo",
            http::Method::POST,
            "/",
            Bytes::from(payload.clone()),
            &[("x-tag", "t1")],
        )
        .await
        .expect("request");
    assert_eq!(r.status, 200);
    assert_eq!(r.header("x-hearth-route"), "sharded");
    assert_eq!(r.header("x-echo-x-tag"), "t1");
    assert_eq!(r.body.len(), payload.len());
    assert!(r.body == payload, "echoed body differs");
}

/// GET Worker `id` through the front door at `addr`: (status, route, body),
/// or (0, "", the error) if there was no answer.
async fn get_at(addr: std::net::SocketAddr, id: &str) -> (u16, String, String) {
    match HttpRequest::get(&format!("{id}.localhost"), "/")
        .send_async(addr)
        .await
    {
        Ok(r) => (r.status, r.header("x-hearth-route").to_string(), r.text()),
        Err(e) => (0, String::new(), format!("{e:?}")),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_the_home_mid_load_fails_no_request_that_had_not_reached_it() {
    let mut c = TestCluster::start(3).await.expect("cluster");
    c.deploy("hello", Plan::Free, sample("hello"))
        .await
        .expect("deploy");
    let home = c.home_of("hello").expect("home");
    let others: Vec<usize> = (0..3).filter(|&i| i != home).collect();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    // Two clients keep requesting through the surviving nodes while the home dies.
    let load: Vec<_> = others
        .iter()
        .map(|&i| {
            let addr = c.node(i).http_addr;
            let stop = stop.clone();
            tokio::spawn(async move {
                let mut seen = Vec::new();
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    seen.push(get_at(addr, "hello").await);
                }
                seen
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(300)).await;
    c.kill(home);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    while c.home_of("hello") == Some(home) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the ring never dropped the dead home"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    c.wait_for_ring(2, Duration::from_secs(10))
        .await
        .expect("ring of two");
    tokio::time::sleep(Duration::from_millis(300)).await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let mut total = 0;
    let mut sharded_before = 0;
    let mut failed = Vec::new();
    for t in load {
        for (status, route, body) in t.await.expect("load task") {
            total += 1;
            if route == "sharded" && status == 200 {
                sharded_before += 1;
            }
            if status != 200 {
                failed.push((status, route, body));
            }
        }
    }
    // Each client has one request in flight at a time, so at most one per
    // client can have reached the home when it died: that one may fail (a
    // clear 502, or a response cut mid-body). Every other request succeeds.
    assert!(failed.len() <= others.len(), "requests failed: {failed:?}");
    for (status, route, body) in &failed {
        assert!(
            *status == 0 || (*status == 502 && route == "sharded"),
            "a request that had not reached the home failed: {status} {route} {body}"
        );
    }
    assert!(sharded_before > 0, "load reached the home before it died");
    assert!(total > 20, "{total} requests");
    for &i in &others {
        assert_eq!(c.get(i, "hello", "/").await.expect("req").status, 200);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_without_a_cluster_certificate_gets_nothing() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let c = TestCluster::start(2).await.expect("cluster");
    c.deploy("hello", Plan::Free, sample("hello"))
        .await
        .expect("deploy");
    let mut s = tokio::net::TcpStream::connect(c.node(0).rpc_addr)
        .await
        .expect("connect");
    // Not a TLS ClientHello: a raw Cap'n Proto bootstrap attempt.
    let _ = s.write_all(&[0u8; 64]).await;
    let mut buf = [0u8; 256];
    let got = tokio::time::timeout(Duration::from_secs(6), s.read(&mut buf)).await;
    match got {
        Ok(Ok(n)) => assert!(
            n == 0 || buf[0] == 0x15,
            "expected close or TLS alert, got {n} bytes"
        ),
        Ok(Err(_)) => {}
        Err(_) => panic!("the server kept an unauthenticated connection open"),
    }
    // The socket closes as the handshake fails; the counter follows a moment
    // later on the RPC thread, so wait for it (bounded) rather than race it.
    assert!(
        eventually(|| c.stats(0).rpc.handshakes_rejected > 0).await,
        "the rejected handshake was never counted"
    );
    for i in 0..2 {
        assert_eq!(c.get(i, "hello", "/").await.expect("req").status, 200);
    }
}

/// Gossip a node cannot authenticate (the usual sender: a member with
/// another gossip_key) is counted in `/metrics`, and the cluster carries on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gossip_without_the_key_is_counted_in_metrics() {
    let c = TestCluster::start(2).await.expect("cluster");
    c.deploy("hello", Plan::Free, sample("hello"))
        .await
        .expect("deploy");
    let target = c.node(0).gossip_addr().expect("gossip is on");
    let socket = tokio::net::UdpSocket::bind("127.0.0.1:0")
        .await
        .expect("udp");
    for i in 0..3u8 {
        socket
            .send_to(&[i; 80], target)
            .await
            .expect("send a forged datagram");
    }
    let metric = |text: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix("hearth_gossip_unauthenticated_total "))
            .and_then(|v| v.trim().parse::<u64>().ok())
    };
    assert!(
        eventually(|| metric(&c.node(0).node.metrics().render()) >= Some(3)).await,
        "{}",
        c.node(0).node.metrics().render()
    );
    assert_eq!(metric(&c.node(1).node.metrics().render()), Some(0));
    for i in 0..2 {
        assert_eq!(c.get(i, "hello", "/").await.expect("req").status, 200);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redeploy_through_one_node_reaches_every_node() {
    let c = TestCluster::start(3).await.expect("cluster");
    c.deploy("app", Plan::Free, sample("hello"))
        .await
        .expect("deploy");
    let home = c.home_of("app").expect("home");
    assert_eq!(
        c.get(home, "app", "/").await.expect("req").text(),
        "hello from app"
    );
    // Redeploy through a node that is not the home: announced to every
    // member before the deploy returns, so the home's stale copy is gone
    // and every node serves the new version at once.
    let other = (home + 1) % 3;
    let d = c
        .node(other)
        .node
        .deploy("app", Plan::Free, sample("wstd-hello"))
        .await
        .expect("redeploy");
    assert_eq!(d.announced.acknowledged, 2, "{:?}", d.announced.failed);
    for i in 0..3 {
        let r = c.get(i, "app", "/").await.expect("req");
        assert_eq!(r.text(), "hello from wstd", "node {i}");
    }
    // Behind the node's back (straight into the runtime, so nobody is
    // told): the home's copy is stale until its background check against
    // the shared store, at most about a second later.
    c.node(other)
        .node
        .runtime()
        .deploy("app", Plan::Free, sample("hello"))
        .await
        .expect("redeploy unannounced");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    for i in 0..3 {
        loop {
            let r = c.get(i, "app", "/").await.expect("req");
            if r.text() == "hello from app" {
                break;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "node {i} stayed stale"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hand_back_returns_a_worker_to_its_home_at_once() {
    let c = TestCluster::start(3).await.expect("cluster");
    c.deploy("app", Plan::Free, sample("hello"))
        .await
        .expect("deploy");
    let home = c.home_of("app").expect("home");
    let others: Vec<usize> = (0..3).filter(|&i| i != home).collect();
    // The other nodes hold warm copies (as after serving the Worker while
    // its home was down): they serve it themselves.
    for &i in &others {
        let req = http::Request::get("http://app.localhost/")
            .body(hearth::runtime::body::full(""))
            .expect("request");
        assert_eq!(
            c.node(i).node.runtime().serve("app", req).await.status(),
            200
        );
        let r = c.get(i, "app", "/").await.expect("req");
        assert_eq!(r.header("x-hearth-route"), "local", "node {i}");
    }
    // Hand it back through any node's admin API.
    let admin = |i: usize| {
        hearth_admin_client::AdminClient::new(
            &format!("http://{}", c.node(i).admin_addr),
            Some(c.token().to_string()),
        )
        .expect("admin client")
    };
    let done = admin(others[0]).hand_back("app").await.expect("hand-back");
    assert_eq!(done.home, format!("node-{}", home + 1));
    let mut dropped = done.dropped.clone();
    dropped.sort();
    let expected: Vec<String> = others.iter().map(|i| format!("node-{}", i + 1)).collect();
    assert_eq!(dropped, expected);
    // From the next request on, the others forward to the home, which
    // holds it warm (prewarmed by the hand-back).
    assert!(c.node(home).node.runtime().is_warm("app"));
    for &i in &others {
        let r = c.get(i, "app", "/").await.expect("req");
        assert_eq!(r.header("x-hearth-route"), "sharded", "node {i}");
        assert_eq!(r.header("x-hearth-node"), format!("node-{}", home + 1));
    }
    // A home keeps its copy, whoever asks.
    let again = admin(home).hand_back("app").await.expect("hand-back");
    assert!(again.dropped.is_empty(), "{again:?}");
    assert!(c.node(home).node.runtime().is_warm("app"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_leaves_a_sharded_request_cancels_it_on_the_home() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let c = TestCluster::start(2).await.expect("cluster");
    c.deploy("hog", Plan::Free, sample("cpu-hog"))
        .await
        .expect("deploy");
    let home = c.home_of("hog").expect("home");
    let other = 1 - home;
    // Clients of the other node give up after 0.3 s on a Worker that loops
    // until its 30 s CPU limit; the request was forwarded to the home.
    for _ in 0..4 {
        let mut s = tokio::net::TcpStream::connect(c.node(other).http_addr)
            .await
            .expect("connect");
        s.write_all(b"GET / HTTP/1.1\r\nHost: hog.localhost\r\n\r\n")
            .await
            .expect("write");
        let mut buf = [0u8; 64];
        let r = tokio::time::timeout(Duration::from_millis(300), s.read(&mut buf)).await;
        assert!(r.is_err(), "the hog answered");
    }
    // The home stops each invocation soon after; nothing keeps running.
    let rt = c.node(home).node.runtime();
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while rt.stats().in_flight > 0 || rt.stats().cancelled < 4 {
        assert!(
            std::time::Instant::now() < deadline,
            "the home kept running them: {:?}",
            rt.stats()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(rt.stats().cpu_kills, 0);
    assert_eq!(
        c.node(other).node.runtime().stats().requests,
        0,
        "forwarded, not served locally"
    );
}

#[tokio::test]
async fn a_cluster_of_no_nodes_is_refused_before_anything_starts() {
    let dir = tempfile::tempdir().expect("tempdir");
    let err = hearth::cluster::LoopbackCluster::start(ClusterConfig::new(0, dir.path()))
        .await
        .err()
        .expect("zero nodes must be refused");
    assert!(
        matches!(err, hearth::cluster::ClusterError::NoNodes),
        "{err}"
    );
}
