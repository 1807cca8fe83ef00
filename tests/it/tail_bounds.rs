//! The bounds of what a node records of its Workers' requests for tail
//! Workers and live tails. Against a real 3-node cluster: however much a
//! traced flow's levels log, the tail Worker receives at most
//! `MAX_FLOW_EVENTS` events and `MAX_FLOW_BYTES` bytes of event text, and
//! is told how many were dropped; a level that reports after the flow was
//! delivered is refused; URLs show without their query values. Against a
//! `hearth serve` process: a Worker that logs hard while live tails that
//! never read watch it raises the node's resident memory by about its
//! live tail budget, not by what the Worker logs.

use std::time::Duration;

use hearth::cluster::ClusterConfig;
use hearth::runtime::Manifest;
use hearth::runtime::outbound::tail::{MAX_FLOW_BYTES, MAX_FLOW_EVENTS};
use hearth::testing::{HttpRequest, NodeProcess, ProcStat, TestCluster};

use crate::hearth;

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

/// `fetcher` as `entry` (binding `next` → `hello`, tail Worker `traces`),
/// `hello`, and `tail-log` as `traces`: a request names a URL with a
/// secret in its query, which the entry fetches through its binding.
/// Neither the live tail nor the tail Worker shows the secret: every
/// query value, the request's own and the subrequest's, is `REDACTED`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn query_values_are_redacted_in_trace_events_and_the_live_tail() {
    use hearth_admin_client::{AdminClient, TailItem, TailQuery};
    const SECRET: &str = "s3cr3t-api-key-4f9a";
    let c = cluster().await;
    let reuse = Manifest {
        lifecycle: hearth::runtime::Lifecycle::Reuse,
        ..Manifest::default()
    };
    let mut entry = reuse.clone();
    entry
        .bindings
        .services
        .insert("next".into(), "hello".into());
    entry.bindings.tail = vec!["traces".into()];
    c.deploy_manifest("entry", entry, sample("fetcher"))
        .await
        .expect("deploy");
    c.deploy_manifest("hello", reuse.clone(), sample("hello"))
        .await
        .expect("deploy");
    c.deploy_manifest("traces", reuse, sample("tail-log"))
        .await
        .expect("deploy");
    let home = c.home_of("entry").expect("home");
    let tail_home = c.home_of("traces").expect("home");
    let admin = AdminClient::new(
        &format!("http://{}", c.node(home).admin_addr),
        Some(c.token().to_string()),
    )
    .expect("admin url");
    let own = TailQuery {
        node_only: true,
        ..TailQuery::default()
    };
    let mut live = admin.tail("entry", &own).await.expect("tail");

    let r = c
        .get(
            (home + 1) % 3,
            "entry",
            &format!("/?fetch=http://next.internal/p?api_key={SECRET}&n=1"),
        )
        .await
        .expect("request");
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(r.text().starts_with("200 "), "{}", r.text());

    let e = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            match live.next().await.expect("stream open").expect("readable") {
                TailItem::Event(e) => return *e,
                _ => continue,
            }
        }
    })
    .await
    .expect("the request's event within 10 s");
    assert_eq!(e.url, "/?fetch=REDACTED&n=REDACTED", "{e:?}");
    let sub: Vec<&str> = e
        .events
        .iter()
        .filter(|t| t.kind == "subrequest")
        .map(|t| t.message.as_str())
        .collect();
    assert_eq!(
        sub,
        ["GET http://next.internal/p?api_key=REDACTED&n=REDACTED -> 200 OK"],
        "{e:?}"
    );
    let json = serde_json::to_string(&e).expect("json");
    assert!(!json.contains(SECRET), "{json}");

    let batch = &batches(&c, tail_home, 1).await[0];
    let text = batch.to_string();
    assert!(!text.contains(SECRET), "{text}");
    assert!(
        text.contains("GET http://next.internal/p?api_key=REDACTED&n=REDACTED -> 200 OK"),
        "{text}"
    );
}

/// The node's resident memory, in bytes.
fn rss(node: &NodeProcess) -> u64 {
    ProcStat::of(node.pid()).expect("the node's /proc").rss
}

/// Opens `node`'s live tail of `script` (this node's requests only) and
/// reads nothing after the stream's first comment: a watcher that never
/// reads. Kept open as long as the stream is.
fn stuck_watcher(node: &NodeProcess, script: &str) -> std::net::TcpStream {
    use std::io::Read;
    let mut s = HttpRequest::get("admin", &format!("/v1/scripts/{script}/tail?scope=node"))
        .header("authorization", &format!("Bearer {TOKEN}"))
        .timeout(Duration::from_secs(10))
        .open(node.admin())
        .expect("open the live tail");
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !String::from_utf8_lossy(&head).contains(": hearth tail of") {
        s.read_exact(&mut byte).expect("the stream's head");
        head.push(byte[0]);
    }
    assert!(head.starts_with(b"HTTP/1.1 200"), "{head:?}");
    s
}

/// The status of `GET path` on Worker `script` of `node`.
fn get(node: &NodeProcess, script: &str, path: &str) -> u16 {
    node.get(&format!("{script}.localhost"), path)
        .expect("an answer")
        .status
}

const TOKEN: &str = "tail-bounds-admin-token-0123456789abcdef";

/// What the node's live tail may hold for its watchers in the test below.
const NODE_BUDGET: u64 = 6 << 20;

/// Two watchers that never read tail `chatty` on a `hearth serve`
/// process while requests make it log 1,024 lines of 4 KiB each (4 MiB
/// of trace events per request; before byte budgets each watcher's
/// queue held 256 such events, 1 GiB). The node's resident memory grows
/// by about its live tail budget at most (6 MiB here, two queues of 4
/// MiB sharing it), with a margin for the requests in flight and the
/// allocator; `/metrics` shows the events cut and dropped, and the
/// queued bytes within the budget.
#[test]
fn a_worker_logging_hard_under_stuck_watchers_stays_within_the_live_tail_budget() {
    let dir = tempfile::tempdir().expect("tempdir");
    let node = NodeProcess::standalone(
        &hearth(),
        dir.path(),
        TOKEN,
        &format!("[live_tail]\nmax_queue_bytes = \"4MiB\"\nmax_node_bytes = {NODE_BUDGET}\n"),
    )
    .expect("the node starts");
    let chatty = hearth_sample_workers::path("chatty").expect("sample built");
    let deployed = node
        .deploy("chatty", chatty, &[])
        .expect("run hearth deploy");
    assert!(deployed.success(), "{}", deployed.output());
    const HARD: &str = "/?lines=1024&bytes=4096";
    // Warm: the Worker compiled, instances made, the node's log rate
    // limit reached; nobody watches yet.
    for _ in 0..8 {
        assert_eq!(get(&node, "chatty", HARD), 200);
    }
    let before = rss(&node);
    let watchers = [
        stuck_watcher(&node, "chatty"),
        stuck_watcher(&node, "chatty"),
    ];
    let mut peak = before;
    std::thread::scope(|s| {
        let load: Vec<_> = (0..2)
            .map(|_| {
                s.spawn(|| {
                    for _ in 0..40 {
                        assert_eq!(get(&node, "chatty", HARD), 200);
                    }
                })
            })
            .collect();
        while !load.iter().all(|t| t.is_finished()) {
            peak = peak.max(rss(&node));
            std::thread::sleep(Duration::from_millis(20));
        }
        for t in load {
            t.join().expect("requests answered");
        }
    });
    peak = peak.max(rss(&node));
    let grown = peak.saturating_sub(before);
    let metrics = hearth_admin_client::Metrics(node.metrics().expect("/metrics"));
    let metric = |name: &str, labels: &str| metrics.sample(name, labels).unwrap_or(-1.0);
    eprintln!(
        "RSS {} MiB before, peak {} MiB: grew {} MiB; queued {} bytes, dropped {} (queue) {} (node), truncated {}",
        before >> 20,
        peak >> 20,
        grown >> 20,
        metric("hearth_live_tail_queued_bytes", ""),
        metric("hearth_live_tail_dropped_total", "reason=\"queue\""),
        metric("hearth_live_tail_dropped_total", "reason=\"node\""),
        metric("hearth_live_tail_truncated_total", ""),
    );
    assert!(
        grown < NODE_BUDGET + (48 << 20),
        "the node grew {} MiB under a live tail budget of {} MiB",
        grown >> 20,
        NODE_BUDGET >> 20
    );
    let queued = metric("hearth_live_tail_queued_bytes", "");
    assert!(queued > 0.0 && queued <= NODE_BUDGET as f64, "{queued}");
    assert!(metric("hearth_live_tail_dropped_total", "reason=\"node\"") > 0.0);
    assert!(metric("hearth_live_tail_truncated_total", "") >= 80.0);
    drop(watchers);
}
