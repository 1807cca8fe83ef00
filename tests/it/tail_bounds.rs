//! The bounds of a traced flow on its first node, against a real 3-node
//! cluster: however much its levels log, the tail Worker receives at most
//! `MAX_FLOW_EVENTS` events and `MAX_FLOW_BYTES` bytes of event text, and
//! is told how many were dropped; a level that reports after the flow was
//! delivered is refused.

use std::time::Duration;

use hearth::cluster::ClusterConfig;
use hearth::runtime::Manifest;
use hearth::runtime::outbound::tail::{MAX_FLOW_BYTES, MAX_FLOW_EVENTS};
use hearth::testing::TestCluster;

fn sample(name: &str) -> Vec<u8> {
    hearth_sample_workers::bytes(name).expect("sample built")
}

/// A cluster whose Workers each keep one reused instance per node:
/// `tail-log` keeps what it received in that instance's memory, and a
/// `chatty` call left running goes on in its caller's instance.
async fn cluster() -> TestCluster {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut cfg = ClusterConfig::new(3, dir.path());
    cfg.runtime = std::sync::Arc::new(|c| {
        c.instance_pool_size(64)
            .reuse(hearth::runtime::ReusePolicy {
                max_concurrency: 1,
                ..hearth::runtime::ReusePolicy::default()
            })
    });
    TestCluster::with_config(cfg, Some(dir))
        .await
        .expect("cluster")
}

/// `chatty` as `entry` (binding `next` → `leaf`, tail Worker `traces`) and
/// as `leaf` on another home; `tail-log` as `traces`. The node a client
/// enters through (not the entry's home, so levels cross nodes), and the
/// tail Worker's home.
async fn deploy_flow(c: &TestCluster) -> (usize, usize) {
    let reuse = Manifest {
        lifecycle: hearth::runtime::Lifecycle::Reuse,
        ..Manifest::default()
    };
    let mut entry = reuse.clone();
    entry.bindings.services.insert("next".into(), "leaf".into());
    entry.bindings.tail = vec!["traces".into()];
    c.deploy_manifest("entry", entry, sample("chatty"))
        .await
        .expect("deploy");
    c.deploy_manifest("leaf", reuse.clone(), sample("chatty"))
        .await
        .expect("deploy");
    c.deploy_manifest("traces", reuse, sample("tail-log"))
        .await
        .expect("deploy");
    let at = (c.home_of("entry").expect("home") + 1) % 3;
    (at, c.home_of("traces").expect("home"))
}

/// The batches `traces` received so far, once there are `n` (polled for up
/// to 20 s: the tail Worker is invoked after the flow's response).
async fn batches(c: &TestCluster, tail_home: usize, n: usize) -> Vec<serde_json::Value> {
    let mut log = String::new();
    for _ in 0..1000 {
        log = c.get(tail_home, "traces", "/").await.expect("tail").text();
        if log.lines().next() == Some(n.to_string().as_str()) {
            return log
                .lines()
                .skip(1)
                .map(|b| serde_json::from_str(b).expect("a JSON batch"))
                .collect();
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("not {n} batches: {:.300}", log);
}

fn text_bytes(events: &[serde_json::Value]) -> usize {
    events
        .iter()
        .map(|e| {
            ["script_id", "node", "kind", "message"]
                .iter()
                .map(|k| e[k].as_str().map_or(0, str::len))
                .sum::<usize>()
        })
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flow_that_reports_far_more_than_its_bounds_delivers_at_most_them() {
    let c = cluster().await;
    let (at, tail_home) = deploy_flow(&c).await;
    // 7 levels of 1000 lines: by bytes 7 MB of text (the byte bound binds),
    // then by count 7,000 short events (the event bound binds).
    for (n, (bytes, bound)) in [(1000, "bytes"), (8, "events")].into_iter().enumerate() {
        let r = c
            .get(at, "entry", &format!("/?lines=1000&bytes={bytes}&fan=6"))
            .await
            .expect("request");
        assert_eq!(r.status, 200, "{}", r.text());
        assert_eq!(r.text(), "6", "every level answered");
        let all = batches(&c, tail_home, n + 1).await;
        let batch = &all[n];
        let events = batch["events"].as_array().expect("events");
        let dropped = batch["dropped"].as_u64().expect("dropped");
        let text = text_bytes(events);
        eprintln!(
            "{bound}: {} events, {text} bytes delivered, {dropped} dropped",
            events.len()
        );
        assert!(events.len() <= MAX_FLOW_EVENTS, "{}", events.len());
        assert!(text <= MAX_FLOW_BYTES, "{text}");
        // Every level recorded its 1,000 lines (and more events); whatever
        // was not delivered is counted.
        assert!(
            events.len() as u64 + dropped >= 7 * 1000,
            "{} delivered + {dropped} dropped",
            events.len()
        );
        match bound {
            "bytes" => assert!(text > MAX_FLOW_BYTES - 4096, "the byte bound was reached"),
            _ => assert_eq!(events.len(), MAX_FLOW_EVENTS, "the event bound was reached"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_level_that_reports_after_its_flow_was_delivered_is_refused() {
    let c = cluster().await;
    let (at, tail_home) = deploy_flow(&c).await;
    let first = c.home_of("entry").expect("home");
    // The entry answers at once; its call to `leaf` ends 1.5 s later, long
    // after the flow was delivered.
    let r = c
        .get(at, "entry", "/?late=1500&lines=3&bytes=10")
        .await
        .expect("request");
    assert_eq!(r.status, 200, "{}", r.text());
    let delivered = batches(&c, tail_home, 1).await;
    let refused = hearth::testing::eventually(Duration::from_secs(20), || {
        c.stats(first).runtime.tail_late_reports >= 1
    })
    .await;
    assert!(refused, "the late report was not refused on the first node");
    // Delivered once, without the late level's events.
    let again = batches(&c, tail_home, 1).await;
    assert_eq!(again, delivered);
    let events = delivered[0]["events"].as_array().expect("events");
    assert!(
        events.iter().all(|e| e["script_id"] != "leaf"),
        "{events:?}"
    );
}
