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
