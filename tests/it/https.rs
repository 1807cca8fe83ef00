//! The HTTPS front door on real nodes (TestCluster: real TLS, real HTTP/2
//! and HTTP/1.1, Cap'n Proto RPC between nodes) and the prewarm its
//! ClientHellos start: at the Worker's home, bounded, and visible to the
//! request that follows.

use std::time::Duration;

use hearth::cluster::ClusterConfig;
use hearth::prewarm::{At, PrewarmConfig};
use hearth::runtime::Plan;
use hearth::testing::{HttpsClient, TestCluster};

/// Waits up to 10 s for `f` (see [`hearth::testing::eventually`]).
async fn eventually(f: impl FnMut() -> bool) -> bool {
    hearth::testing::eventually(Duration::from_secs(10), f).await
}

fn sample(name: &str) -> Vec<u8> {
    hearth_sample_workers::bytes(name).expect("sample built")
}

fn client(c: &TestCluster) -> HttpsClient {
    HttpsClient::trusting(c.tls_ca().expect("the cluster serves HTTPS")).expect("client")
}

fn https(c: &TestCluster, i: usize) -> std::net::SocketAddr {
    c.node(i).https_addr.expect("HTTPS address")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handshake_alone_warms_the_worker_at_its_home() {
    let c = TestCluster::start(3).await.expect("cluster");
    c.deploy("hello", Plan::Free, sample("hello"))
        .await
        .expect("deploy");
    let home = c.home_of("hello").expect("home");
    let other = (home + 1) % 3;
    let tls = client(&c);

    // A ClientHello for hello.localhost lands on a node that is not its
    // home; no request follows.
    tls.handshake(https(&c, other), "hello.localhost")
        .await
        .expect("handshake");
    let home_rt = c.node(home).node.runtime().clone();
    assert!(
        eventually(|| home_rt.is_warm("hello")).await,
        "the Worker is warm at its home after the handshake alone"
    );
    assert!(
        !c.node(other).node.runtime().is_warm("hello"),
        "and only there"
    );
    assert_eq!(c.node(other).node.prewarmer().count(At::Home, "started"), 1);
    assert!(
        eventually(|| c.node(other).node.prewarmer().count(At::Home, "loaded") == 1).await,
        "the home answered that it loaded the Worker"
    );
    assert_eq!(c.node(home).node.prewarmer().count(At::Here, "loaded"), 1);
    assert_eq!(c.stats(home).runtime.prewarm_loads, 1);
    assert_eq!(c.total_cold(), 0, "no request has run yet");

    // The request that follows, over HTTPS on the same non-home node, is
    // served by the home and finds the Worker ready: no compile phase.
    let (_, r) = tls
        .get(https(&c, other), "hello.localhost", "/", true)
        .await
        .expect("request");
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.text(), "hello from hello");
    assert_eq!(r.header("x-hearth-node"), c.node(home).node.id());
    assert_eq!(r.header("x-hearth-route"), "sharded");
    assert_eq!(r.header("x-hearth-start"), "prewarmed");
    let timing = r.header("server-timing");
    assert!(
        !timing.contains("compile") && !timing.contains("fetch"),
        "{timing}"
    );
    assert_eq!(c.total_cold(), 0, "the prewarm was the only load");
    assert_eq!(c.stats(home).runtime.prewarmed, 1);
    // The next one is an ordinary warm request.
    let (_, r) = tls
        .get(https(&c, other), "hello.localhost", "/", false)
        .await
        .expect("request");
    assert_eq!(r.header("x-hearth-start"), "warm");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handshake_on_the_home_prewarms_there_and_unknown_names_do_nothing() {
    let c = TestCluster::start(3).await.expect("cluster");
    c.deploy("hello", Plan::Free, sample("hello"))
        .await
        .expect("deploy");
    let home = c.home_of("hello").expect("home");
    let tls = client(&c);
    tls.handshake(https(&c, home), "HELLO.localhost")
        .await
        .expect("handshake");
    let rt = c.node(home).node.runtime().clone();
    let p = c.node(home).node.prewarmer().clone();
    assert!(
        eventually(|| p.count(At::Here, "loaded") == 1).await,
        "SNI is case-insensitive"
    );
    assert!(rt.is_warm("hello"));
    // A request for another Worker than the SNI named is routed by Host,
    // and does not use the prewarm.
    c.deploy("echo", Plan::Free, sample("echo"))
        .await
        .expect("deploy");
    for http2 in [true, false] {
        let r = tls
            .send(
                https(&c, home),
                "hello.localhost",
                "echo.localhost",
                "/x",
                http2,
            )
            .await
            .expect("request")
            .response;
        assert_eq!(r.status, 200, "{}", r.text());
        assert!(!r.header("x-echo-served").is_empty(), "echo answered");
        assert_ne!(r.header("x-hearth-start"), "prewarmed");
    }
    let (_, r) = tls
        .get(https(&c, home), "hello.localhost", "/", false)
        .await
        .expect("request");
    assert_eq!(r.text(), "hello from hello");
    assert_eq!(
        r.header("x-hearth-start"),
        "prewarmed",
        "hello's prewarm was kept for it"
    );

    // No SNI Worker: `localhost` names none, nothing is prewarmed.
    let before: u64 = (0..3)
        .map(|i| c.node(i).node.prewarmer().count(At::Here, "started"))
        .sum();
    tls.handshake(https(&c, home), "localhost")
        .await
        .expect("handshake");
    tokio::time::sleep(Duration::from_millis(100)).await;
    let after: u64 = (0..3)
        .map(|i| c.node(i).node.prewarmer().count(At::Here, "started"))
        .sum();
    assert_eq!(before, after);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prewarm_switched_off_leaves_the_worker_cold() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut cfg = ClusterConfig::new(1, dir.path());
    cfg.prewarm = PrewarmConfig {
        enabled: false,
        ..PrewarmConfig::default()
    };
    let c = TestCluster::with_config(cfg, Some(dir))
        .await
        .expect("cluster");
    c.deploy("hello", Plan::Free, sample("hello"))
        .await
        .expect("deploy");
    let tls = client(&c);
    tls.handshake(https(&c, 0), "hello.localhost")
        .await
        .expect("handshake");
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!c.node(0).node.runtime().is_warm("hello"));
    let (_, r) = tls
        .get(https(&c, 0), "hello.localhost", "/", true)
        .await
        .expect("request");
    assert_eq!(r.header("x-hearth-start"), "cold");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http2_and_http1_over_tls_reach_workers() {
    let c = TestCluster::start(3).await.expect("cluster");
    c.deploy("hello", Plan::Free, sample("hello"))
        .await
        .expect("deploy");
    c.deploy("echo", Plan::Free, sample("echo"))
        .await
        .expect("deploy");
    let tls = client(&c);
    for i in 0..3 {
        for (http2, version) in [
            (true, http::Version::HTTP_2),
            (false, http::Version::HTTP_11),
        ] {
            let (v, r) = tls
                .get(https(&c, i), "hello.localhost", "/", http2)
                .await
                .expect("request");
            assert_eq!(v, version, "node {i}");
            assert_eq!(r.status, 200, "{}", r.text());
            assert_eq!(r.text(), "hello from hello");
        }
    }
    // The plain listener still serves as before.
    let r = c.get(0, "echo", "/x").await.expect("plain");
    assert_eq!(r.status, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_random_snis_are_bounded_and_the_node_keeps_serving() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut cfg = ClusterConfig::new(3, dir.path());
    let max = 2;
    cfg.prewarm = PrewarmConfig {
        enabled: true,
        max_concurrent: max,
    };
    let c = TestCluster::with_config(cfg, Some(dir))
        .await
        .expect("cluster");
    c.deploy("hello", Plan::Free, sample("hello"))
        .await
        .expect("deploy");
    let compiles_before: u64 = (0..3).map(|i| c.stats(i).runtime.compiles).sum();
    let tls = client(&c);
    let target = https(&c, 0);
    let flood = {
        let tls = tls.clone();
        tokio::spawn(async move {
            let mut ok = 0;
            for batch in 0..20 {
                let mut set = tokio::task::JoinSet::new();
                for j in 0..50 {
                    let tls = tls.clone();
                    let name = format!(
                        "w{:08x}.localhost",
                        rand::random::<u32>() ^ (batch * 50 + j)
                    );
                    set.spawn(async move { tls.handshake(target, &name).await.is_ok() });
                }
                while let Some(r) = set.join_next().await {
                    ok += usize::from(r.unwrap_or(false));
                }
            }
            ok
        })
    };
    // While the flood runs: prewarms in flight stay within the cap, and
    // hello is served.
    let mut served = 0;
    let mut peak = 0;
    while !flood.is_finished() {
        for i in 0..3 {
            peak = peak.max(c.node(i).node.prewarmer().in_flight());
        }
        let r = c
            .get(0, "hello", "/")
            .await
            .expect("hello during the flood");
        assert_eq!(r.status, 200, "{}", r.text());
        served += 1;
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let handshakes = flood.await.expect("flood");
    assert_eq!(handshakes, 1000, "every handshake completed");
    assert!(served > 0);
    assert!(peak <= max, "in flight peaked at {peak}, cap {max}");

    let p = c.node(0).node.prewarmer();
    let started = p.count(At::Here, "started") + p.count(At::Home, "started");
    let dropped = ["dropped_duplicate", "dropped_cap"]
        .iter()
        .map(|o| p.count(At::Here, o) + p.count(At::Home, o))
        .sum::<u64>();
    assert_eq!(started + dropped, 1000, "every hint was started or dropped");
    assert!(
        eventually(|| (0..3).all(|i| c.node(i).node.prewarmer().in_flight() == 0)).await,
        "nothing left in flight"
    );
    let failed = p.count(At::Here, "failed") + p.count(At::Home, "failed");
    assert_eq!(
        failed, started,
        "no such Workers: every started prewarm failed"
    );
    let compiles_after: u64 = (0..3).map(|i| c.stats(i).runtime.compiles).sum();
    assert_eq!(compiles_before, compiles_after, "nothing was compiled");
    for i in 0..3 {
        let resident = c.node(i).node.runtime().resident();
        assert!(
            resident.iter().all(|w| w == "hello"),
            "node {i} holds only hello: {resident:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prewarm_that_does_not_fit_is_dropped_and_evicts_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut cfg = ClusterConfig::new(1, dir.path());
    // Room for hello, not for `big` beside it.
    cfg.runtime = std::sync::Arc::new(|c| c.instance_pool_size(64).memory_budget(6 << 20));
    let c = TestCluster::with_config(cfg, Some(dir))
        .await
        .expect("cluster");
    c.deploy("hello", Plan::Free, sample("hello"))
        .await
        .expect("deploy");
    c.deploy("big", Plan::Paid, sample("big"))
        .await
        .expect("deploy");
    let r = c.get(0, "hello", "/").await.expect("hello");
    assert_eq!(r.status, 200);
    let tls = client(&c);
    tls.handshake(https(&c, 0), "big.localhost")
        .await
        .expect("handshake");
    let p = c.node(0).node.prewarmer().clone();
    assert!(
        eventually(|| p.count(At::Here, "dropped_memory") == 1).await,
        "the prewarm of big was dropped for memory"
    );
    let rt = c.node(0).node.runtime();
    assert!(rt.is_warm("hello"), "hello was not evicted");
    assert!(!rt.is_warm("big"));
    assert_eq!(rt.stats().evictions(), 0);
}
