//! Durable Objects on a real node (issue 43; `hearth_runtime::objects`):
//! the `counter` sample is both the object (class `Counter`, and `Other`
//! for a second namespace) and the front Worker that calls it by name.
//! State lives in the object's storage: it survives the object's eviction
//! and the node's restart over the same store; requests to one object run
//! one at a time; IDs, bindings and storage limits fail with clear errors;
//! and the host's `hearth-object-url` header never comes from a client.

use std::collections::BTreeSet;
use std::sync::Arc;

use hearth::cluster::ClusterConfig;
use hearth::runtime::Manifest;
use hearth::runtime::objects::ObjectsConfig;
use hearth::runtime::outbound::bindings::ObjectBinding;
use hearth::testing::{TestCluster, TestResponse};

/// One node over `store`, at most `max_resident` objects resident.
async fn node(store: &std::path::Path, max_resident: usize) -> TestCluster {
    let mut cfg = ClusterConfig::new(1, store);
    cfg.runtime = Arc::new(move |c| {
        c.instance_pool_size(32).objects(ObjectsConfig {
            max_resident,
            ..ObjectsConfig::default()
        })
    });
    TestCluster::with_config(cfg, None).await.expect("node")
}

/// The counter sample deployed as `counter`, its binding `COUNTER` naming
/// its own class `Counter` and `OTHER` its class `Other`.
async fn deploy_counter(c: &TestCluster) {
    let mut m = Manifest::default();
    m.bindings
        .durable_objects
        .insert("COUNTER".into(), ObjectBinding::new("Counter", None));
    m.bindings
        .durable_objects
        .insert("OTHER".into(), ObjectBinding::new("Other", None));
    let wasm = hearth_sample_workers::bytes("counter").expect("sample built");
    c.deploy_manifest("counter", m, wasm).await.expect("deploy");
}

async fn get(c: &TestCluster, path: &str) -> TestResponse {
    c.get(0, "counter", path).await.expect("request")
}

/// `path`'s answer, which must be a 200.
async fn ok(c: &TestCluster, path: &str) -> String {
    let r = get(c, path).await;
    assert_eq!(r.status, 200, "{path}: {}", r.text());
    r.text()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_count_lives_in_storage_across_eviction_and_a_restart() {
    let dir = tempfile::tempdir().expect("tempdir");
    let c = node(dir.path(), 1).await;
    deploy_counter(&c).await;
    for n in 1..=3 {
        assert_eq!(ok(&c, "/a/").await, n.to_string());
    }
    let who = ok(&c, "/a/whoami").await;
    let parts: Vec<&str> = who.split(' ').collect();
    assert_eq!(parts.len(), 3, "{who}");
    assert_eq!((parts[0], parts[2]), ("Counter", "a"), "{who}");
    assert_eq!(parts[1].len(), 64, "{who}");
    // One object resident at most: b's arrival evicts a, whose count
    // comes back from storage, not from a live instance.
    assert_eq!(ok(&c, "/b/").await, "1");
    assert_eq!(ok(&c, "/a/").await, "4");
    let stats = c.stats(0).runtime;
    assert!(stats.objects_evicted >= 2, "{stats:?}");
    assert!(stats.objects_opened >= 3, "{stats:?}");
    assert!(stats.object_requests >= 6, "{stats:?}");
    // A new node over the same store: the same count.
    drop(c);
    let c = node(dir.path(), 10).await;
    assert_eq!(ok(&c, "/a/get").await, "4");
    assert_eq!(ok(&c, "/a/").await, "5");
    assert_eq!(ok(&c, "/b/get").await, "1");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn requests_to_one_object_run_one_at_a_time() {
    let dir = tempfile::tempdir().expect("tempdir");
    let c = Arc::new(node(dir.path(), 10).await);
    deploy_counter(&c).await;
    // `/slow` reads the count, waits 100 ms, then writes count + 1: two
    // that overlapped would both write the same number.
    const N: usize = 6;
    let calls = (0..N).map(|_| {
        let c = c.clone();
        tokio::spawn(async move { ok(&c, "/s/slow").await })
    });
    let mut answers = BTreeSet::new();
    for call in calls {
        answers.insert(call.await.expect("task"));
    }
    let expected: BTreeSet<String> = (1..=N).map(|n| n.to_string()).collect();
    assert_eq!(answers, expected, "each increment saw the one before it");
    assert_eq!(ok(&c, "/s/get").await, N.to_string());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn bindings_ids_and_limits_fail_with_clear_errors() {
    let dir = tempfile::tempdir().expect("tempdir");
    let c = node(dir.path(), 10).await;
    deploy_counter(&c).await;
    // A binding the Worker does not have.
    let r = get(&c, "/x/get?binding=NOPE").await;
    assert_eq!(r.status, 400, "{}", r.text());
    assert!(
        r.text()
            .contains("no Durable Object binding named \"NOPE\""),
        "{}",
        r.text()
    );
    // Not an ID at all.
    let r = get(&c, "/id/not-an-id/get").await;
    assert_eq!(r.status, 400, "{}", r.text());
    assert!(r.text().contains("invalid object ID"), "{}", r.text());
    // An ID of another namespace (class Other) is refused by COUNTER.
    let who = ok(&c, "/x/whoami?binding=OTHER").await;
    let other_id = who.split(' ').nth(1).expect("an id").to_string();
    assert!(who.starts_with("Other "), "{who}");
    let r = get(&c, &format!("/id/{other_id}/get")).await;
    assert_eq!(r.status, 400, "{}", r.text());
    assert!(
        r.text()
            .contains("not an ID of Durable Object binding \"COUNTER\""),
        "{}",
        r.text()
    );
    // The same ID through its own binding reaches the object.
    assert_eq!(
        ok(&c, &format!("/id/{other_id}/whoami?binding=OTHER")).await,
        who
    );
    // Storage outside an object.
    let r = get(&c, "/storage").await;
    assert_eq!(r.status, 409, "{}", r.text());
    assert!(
        r.text().contains("not running as a Durable Object"),
        "{}",
        r.text()
    );
    // A value over Cloudflare's 128 KiB; one within it is stored.
    let r = get(&c, "/v/big?bytes=200000").await;
    assert_eq!(r.status, 413, "{}", r.text());
    assert!(
        r.text().contains("max_value_bytes is 131072"),
        "{}",
        r.text()
    );
    assert_eq!(ok(&c, "/v/big?bytes=100000").await, "stored");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_object_url_header_is_the_hosts_alone() {
    let dir = tempfile::tempdir().expect("tempdir");
    let c = node(dir.path(), 10).await;
    deploy_counter(&c).await;
    // Without it, the object sees its .object.internal address.
    let url = ok(&c, "/u/url").await;
    assert!(url.contains(".object.internal/url"), "{url}");
    // The front Worker's stub gives the URL its caller gave.
    assert_eq!(
        ok(&c, "/u/url?url=http://shop.example/url").await,
        "http://shop.example/url"
    );
    // A client's header never reaches a Worker: the echo sample returns
    // every request header it gets as x-echo-<name>.
    let wasm = hearth_sample_workers::bytes("echo").expect("sample built");
    c.deploy("echo", hearth::runtime::Plan::Free, wasm)
        .await
        .expect("deploy");
    let r = c
        .send(
            0,
            "echo",
            http::Method::GET,
            "/",
            bytes::Bytes::new(),
            &[
                ("hearth-object-url", "http://evil.example/"),
                ("hearth-object-alarm", "0"),
                ("x-kept", "1"),
            ],
        )
        .await
        .expect("request");
    assert_eq!(r.status, 200);
    assert_eq!(r.header("x-echo-x-kept"), "1");
    assert!(
        r.headers.get("x-echo-hearth-object-url").is_none(),
        "a client's hearth-object-url reached a Worker: {:?}",
        r.headers
    );
    assert!(
        r.headers.get("x-echo-hearth-object-alarm").is_none(),
        "a client's hearth-object-alarm reached a Worker: {:?}",
        r.headers
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn objects_live_on_their_ring_home_whichever_node_calls() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut cfg = ClusterConfig::new(3, dir.path());
    cfg.runtime = Arc::new(|c| c.instance_pool_size(32));
    let c = TestCluster::with_config(cfg, None).await.expect("cluster");
    deploy_counter(&c).await;
    let names = ["a", "b", "c", "d", "e", "f", "g", "h"];
    for name in names {
        // Each front door in turn: one count, wherever the call comes from.
        for (n, node) in [0, 1, 2, 0].into_iter().enumerate() {
            let r = c
                .get(node, "counter", &format!("/{name}/"))
                .await
                .expect("request");
            assert_eq!(r.status, 200, "{name} via node {node}: {}", r.text());
            assert_eq!(r.text(), (n + 1).to_string(), "{name} via node {node}");
        }
    }
    // Each object was made resident once, on its home; the homes differ.
    let opened: Vec<u64> = (0..3).map(|i| c.stats(i).runtime.objects_opened).collect();
    assert_eq!(opened.iter().sum::<u64>(), names.len() as u64, "{opened:?}");
    assert!(
        opened.iter().filter(|n| **n > 0).count() >= 2,
        "8 objects on one node of 3: {opened:?}"
    );
}
