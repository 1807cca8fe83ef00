//! The front door as a client meets it: `x-hearth-*` request headers are
//! the host's alone, so a client cannot forge them.

use bytes::Bytes;
use hearth::runtime::Plan;
use hearth::testing::TestCluster;

fn sample(name: &str) -> Vec<u8> {
    hearth_sample_workers::bytes(name).expect("sample built")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_cannot_forge_host_headers_on_any_route() {
    let c = TestCluster::start(3).await.expect("cluster");
    c.deploy("echo", Plan::Free, sample("echo"))
        .await
        .expect("deploy");
    let home = c.home_of("echo").expect("home");
    // At the home (served here) and at another node (served over the hop).
    for (i, route) in [(home, "home"), ((home + 1) % 3, "sharded")] {
        let r = c
            .send(
                i,
                "echo",
                http::Method::POST,
                "/",
                Bytes::from_static(b"x"),
                &[
                    ("x-hearth-trust", "platform"),
                    ("x-hearth-caller", "billing"),
                    ("X-Hearth-Depth", "1"),
                    ("x-tag", "kept"),
                ],
            )
            .await
            .expect("request");
        assert_eq!(r.status, 200, "{}", r.text());
        assert_eq!(r.header("x-hearth-route"), route);
        assert_eq!(r.header("x-echo-x-tag"), "kept", "other headers pass");
        for forged in [
            "x-echo-x-hearth-trust",
            "x-echo-x-hearth-caller",
            "x-echo-x-hearth-depth",
        ] {
            assert!(
                !r.headers.contains_key(forged),
                "the Worker saw a client's {forged} via {route}"
            );
        }
    }
}

/// A user Worker deployed `dispatch_only` (as on Workers for Platforms):
/// a client addressing it directly gets a 404 on every front door (HTTP,
/// HTTPS over HTTP/1.1 and HTTP/2), at its home and through another node
/// (over the shard hop); its dispatcher still reaches it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dispatch_only_user_worker_is_not_routable_from_the_front_door() {
    use hearth::runtime::Manifest;
    use hearth::testing::HttpsClient;
    let c = TestCluster::start(2).await.expect("cluster");
    let (dispatcher, user, egress) = ("platform", "tenant-a", "egress");
    let mut m = Manifest::default();
    m.bindings
        .dispatch
        .entry("users".into())
        .or_default()
        .insert(user.into());
    m.bindings.outbound = Some(egress.into());
    c.deploy_manifest(dispatcher, m, sample("dispatcher"))
        .await
        .expect("deploy");
    let user_manifest = Manifest {
        dispatch_only: true,
        ..Manifest::default()
    };
    c.deploy_manifest(user, user_manifest, sample("user-app"))
        .await
        .expect("deploy");
    c.deploy(egress, Plan::Free, sample("egress"))
        .await
        .expect("deploy");
    let home = c.home_of(user).expect("home");
    let other = (home + 1) % 2;
    let refused = |r: &hearth::testing::TestResponse, how: &str| {
        assert_eq!(r.status, 404, "{how}: {}", r.text());
        assert!(
            r.text()
                .contains("reachable only through its platform's dispatch namespace"),
            "{how}: {}",
            r.text()
        );
    };
    // Plain HTTP, at the home and through the other node (forwarded).
    for i in [home, other] {
        let r = c.get(i, user, "/orders").await.expect("request");
        refused(&r, &format!("HTTP via node {i}"));
    }
    // HTTPS, HTTP/1.1 and HTTP/2, at both nodes.
    let https = HttpsClient::trusting(c.tls_ca().expect("https on")).expect("client");
    let host = format!("{user}.localhost");
    for i in [home, other] {
        let addr = c.node(i).https_addr.expect("https on");
        for http2 in [false, true] {
            let (_, r) = https
                .get(addr, &host, "/orders", http2)
                .await
                .expect("request");
            refused(&r, &format!("HTTPS (h2: {http2}) via node {i}"));
        }
    }
    let refusals: u64 = (0..2)
        .map(|i| c.stats(i).runtime.dispatch_only_refused)
        .sum();
    assert_eq!(refusals, 6, "each refused where it was served");
    // Its dispatcher reaches it, from either node.
    for i in [home, other] {
        let r = c
            .get(i, dispatcher, &format!("/{user}/orders?id=7"))
            .await
            .expect("request");
        assert_eq!(r.status, 200, "{}", r.text());
        assert!(r.text().contains(&format!("> {user} >")), "{}", r.text());
    }
}
