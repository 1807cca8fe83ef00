//! `hearth tail`: a Worker's requests, live, from every node of a cluster
//! (the admin API's `GET /v1/scripts/{id}/tail`, and the CLI over it).
//!
//! The clusters here admit no sharded request at a home
//! (`max_in_flight_* = 0`), so a request is served by the node it reaches:
//! each node serves requests of the same Worker, and its tail shows them.

use std::io::BufRead as _;
use std::time::Duration;

use hearth::cluster::ClusterConfig;
use hearth::runtime::Plan;
use hearth::runtime::outbound::live_tail::StatusFilter;
use hearth::sharding::admission::OverloadConfig;
use hearth::testing::{HttpRequest, TestCluster};
use hearth_admin_client::{AdminClient, RequestEvent, TailItem, TailQuery, TailStream};

fn sample(name: &str) -> Vec<u8> {
    hearth_sample_workers::bytes(name).expect("sample built")
}

/// Two nodes that each serve what reaches them.
async fn cluster() -> TestCluster {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut cfg = ClusterConfig::new(2, dir.path());
    cfg.overload = OverloadConfig {
        max_in_flight_per_worker: 0,
        max_in_flight_node: 0,
    };
    TestCluster::with_config(cfg, Some(dir))
        .await
        .expect("cluster")
}

fn admin(c: &TestCluster, i: usize, token: &str) -> AdminClient {
    AdminClient::new(
        &format!("http://{}", c.node(i).admin_addr),
        Some(token.to_string()),
    )
    .expect("admin url")
}

/// `GET path` on the admin API at `addr` with `token`: status and body.
async fn raw_get(addr: std::net::SocketAddr, path: &str, token: &str) -> (u16, String) {
    let resp = HttpRequest::get("admin", path)
        .header("authorization", &format!("Bearer {token}"))
        .timeout(Duration::from_secs(5))
        .send_async(addr)
        .await
        .expect("an answer within 5 s");
    (resp.status, resp.text())
}

/// The next request event of `s`, within 5 s.
async fn next_event(s: &mut TailStream) -> RequestEvent {
    tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            match s.next().await.expect("stream open").expect("readable") {
                TailItem::Event(e) => return *e,
                _ => continue,
            }
        }
    })
    .await
    .expect("an event within 5 s")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_nodes_requests_stream_with_their_logs_filtered_and_never_blocked() {
    let c = cluster().await;
    c.deploy("chatty", Plan::Free, sample("chatty"))
        .await
        .expect("deploy");
    let all = TailQuery::default();

    // Without the token, or with a bad filter: refused.
    let refused = admin(&c, 0, "wrong").tail("chatty", &all).await;
    assert_eq!(
        refused.expect_err("no token").status(),
        Some(http::StatusCode::UNAUTHORIZED)
    );
    let bad = TailQuery {
        status: Some("6xx".into()),
        ..TailQuery::default()
    };
    let refused = admin(&c, 0, c.token()).tail("chatty", &bad).await;
    assert_eq!(
        refused.expect_err("bad filter").status(),
        Some(http::StatusCode::BAD_REQUEST)
    );
    // A scope other than cluster or node (the client cannot send one, a
    // script can): refused, saying which are valid.
    let (status, body) = raw_get(
        c.node(0).admin_addr,
        "/v1/scripts/chatty/tail?scope=rack",
        c.token(),
    )
    .await;
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("expected cluster or node"), "{body}");

    // A request served on each node shows on that node's own stream
    // (scope=node), with the lines the Worker wrote.
    let own = TailQuery {
        node_only: true,
        ..TailQuery::default()
    };
    let mut streams = Vec::new();
    for i in 0..2 {
        streams.push(
            admin(&c, i, c.token())
                .tail("chatty", &own)
                .await
                .expect("tail"),
        );
    }
    for i in 0..2 {
        let r = c
            .get(i, "chatty", &format!("/?lines=2&bytes={}", i + 1))
            .await
            .expect("request");
        assert_eq!(r.status, 200, "{}", r.text());
        assert_eq!(r.header("x-hearth-node"), c.node(i).node.id());
    }
    for (i, s) in streams.iter_mut().enumerate() {
        let e = next_event(s).await;
        assert_eq!(e.node, c.node(i).node.id());
        assert_eq!((e.script_id.as_str(), e.status), ("chatty", 200));
        assert_eq!((e.method.as_str(), e.outcome.as_str()), ("GET", "ok"));
        // Query values are redacted in the live tail (they carry keys);
        // the names stay, and the logs below tell the requests apart.
        assert_eq!(e.url, "/?lines=REDACTED&bytes=REDACTED");
        assert!(e.wall_ms >= e.cpu_ms && e.wall_ms > 0.0, "{e:?}");
        assert_eq!(e.sample_rate, 1.0);
        let x = "x".repeat(i + 1);
        let logs: Vec<&str> = e
            .events
            .iter()
            .filter(|t| t.kind == "log")
            .map(|t| t.message.as_str())
            .collect();
        assert_eq!(logs, [format!("0 {x}"), format!("1 {x}")]);
        assert!(e.events.iter().any(|t| t.kind == "outcome"), "{e:?}");
    }
    drop(streams);

    // status=5xx: the 200s are left out, a trap's 500 is not.
    let errors = TailQuery {
        status: Some("5xx".into()),
        ..TailQuery::default()
    };
    c.deploy("flaky", Plan::Free, sample("chatty"))
        .await
        .expect("deploy");
    let mut s = admin(&c, 0, c.token())
        .tail("flaky", &errors)
        .await
        .expect("tail");
    assert_eq!(c.get(0, "flaky", "/").await.expect("request").status, 200);
    c.deploy("flaky", Plan::Free, sample("trap"))
        .await
        .expect("redeploy");
    assert_eq!(c.get(0, "flaky", "/").await.expect("request").status, 500);
    let e = next_event(&mut s).await;
    assert_eq!((e.status, e.outcome.as_str()), (500, "exception"), "{e:?}");
    assert!(e.events.iter().any(|t| t.kind == "exception"), "{e:?}");
    drop(s);

    // A watcher that never reads holds nothing up: its events are dropped
    // and counted, every request is answered.
    let hub = c.node(0).node.runtime().live_tail().clone();
    let stuck = hub.subscribe("chatty", StatusFilter::All, 1.0);
    let mut tasks = Vec::new();
    for _ in 0..4 {
        let addr = c.node(0).http_addr;
        tasks.push(tokio::spawn(async move {
            let client =
                hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
                    .build_http::<http_body_util::Full<bytes::Bytes>>();
            for _ in 0..150 {
                let req = http::Request::get(format!("http://{addr}/"))
                    .header(http::header::HOST, "chatty.localhost")
                    .body(http_body_util::Full::default())
                    .expect("request");
                let resp = tokio::time::timeout(Duration::from_secs(5), client.request(req))
                    .await
                    .expect("answered in time")
                    .expect("answered");
                assert_eq!(resp.status(), 200);
            }
        }));
    }
    for t in tasks {
        t.await.expect("requests answered");
    }
    assert!(stuck.dropped() > 0, "a full queue drops");
    drop(stuck);
    assert_eq!(hub.subscribers(), 0);
}

/// Reads `child`'s stderr lines into a channel.
fn lines(r: impl std::io::Read + Send + 'static) -> std::sync::mpsc::Receiver<String> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(r).lines() {
            let Ok(line) = line else { return };
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    rx
}

/// The first line of `rx` that `f` accepts, within 10 s.
fn wait_line(
    rx: &std::sync::mpsc::Receiver<String>,
    what: &str,
    f: impl Fn(&str) -> bool,
) -> String {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        match rx.recv_timeout(left) {
            Ok(l) if f(&l) => return l,
            Ok(_) => continue,
            Err(e) => panic!("no line {what} ({e})"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hearth_tail_merges_every_node_until_ctrl_c() {
    let c = cluster().await;
    c.deploy("chatty", Plan::Free, sample("chatty"))
        .await
        .expect("deploy");
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_hearth"))
        .args(["tail", "chatty", "--format", "json"])
        .args(["--admin", &format!("http://{}", c.node(0).admin_addr)])
        .args(["--admin", &format!("http://{}", c.node(1).admin_addr)])
        .env("HEARTH_ADMIN_TOKEN", c.token())
        .env("RUST_LOG", "warn")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run hearth tail");
    let out = lines(child.stdout.take().expect("stdout"));
    let err = lines(child.stderr.take().expect("stderr"));
    wait_line(&err, "saying it tails both nodes", |l| {
        l.starts_with("tailing chatty on node-1, node-2")
    });

    for i in 0..2 {
        let r = c
            .get(i, "chatty", "/?lines=1&bytes=4")
            .await
            .expect("request");
        assert_eq!(r.status, 200);
    }
    let mut nodes = Vec::new();
    for _ in 0..2 {
        let line = wait_line(&out, "with an event", |_| true);
        let e: RequestEvent = serde_json::from_str(&line).expect("a JSON event per line");
        assert_eq!(e.events[0].message, "0 xxxx", "{line}");
        nodes.push(e.node);
    }
    nodes.sort();
    assert_eq!(nodes, ["node-1", "node-2"]);

    // A node that goes away is said so; the other keeps streaming.
    c.node(1).node.start_draining();
    wait_line(&err, "about node-2", |l| {
        l.starts_with("node-2: tail ended")
    });
    let r = c
        .get(0, "chatty", "/?lines=1&bytes=2")
        .await
        .expect("request");
    assert_eq!(r.status, 200);
    let line = wait_line(&out, "with node-1's event", |_| true);
    assert!(line.contains("\"0 xx\""), "{line}");

    // Ctrl-C ends it cleanly.
    // SAFETY: kill(2) on our own child's PID, with a valid signal.
    let rc = unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    assert_eq!(rc, 0);
    let status = child.wait().expect("exits");
    assert!(status.success(), "{status}");
    let rest: Vec<String> = err.try_iter().collect();
    assert!(!rest.iter().any(|l| l.contains("panicked")), "{rest:?}");
}

/// Waits until `node`'s hub has a watcher of `script` (a gathering peer's
/// subscription is set up over RPC, after the stream opened).
async fn watched(c: &TestCluster, node: usize, script: &str) {
    let hub = c.node(node).node.runtime().live_tail().clone();
    tokio::time::timeout(Duration::from_secs(5), async {
        while !hub.wants(script) {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("the peer's tail subscribed within 5 s");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hearth_tail_on_one_node_shows_what_every_node_served() {
    let c = cluster().await;
    c.deploy("chatty", Plan::Free, sample("chatty"))
        .await
        .expect("deploy");
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_hearth"))
        .args(["tail", "chatty", "--format", "json"])
        .args(["--admin", &format!("http://{}", c.node(0).admin_addr)])
        .env("HEARTH_ADMIN_TOKEN", c.token())
        .env("RUST_LOG", "warn")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run hearth tail");
    let out = lines(child.stdout.take().expect("stdout"));
    let err = lines(child.stderr.take().expect("stderr"));
    wait_line(&err, "saying it tails the cluster", |l| {
        l.starts_with("tailing chatty on node-1, node-2")
    });
    watched(&c, 1, "chatty").await;

    // Served by node-2, shown by node-1's stream; then one of node-1's.
    for (i, bytes) in [(1, 3), (0, 1)] {
        let r = c
            .get(i, "chatty", &format!("/?lines=1&bytes={bytes}"))
            .await
            .expect("request");
        assert_eq!(r.status, 200);
        assert_eq!(r.header("x-hearth-node"), c.node(i).node.id());
        let line = wait_line(&out, "with an event", |_| true);
        let e: RequestEvent = serde_json::from_str(&line).expect("a JSON event per line");
        assert_eq!(e.node, c.node(i).node.id(), "{line}");
        assert_eq!(e.events[0].message, format!("0 {}", "x".repeat(bytes)));
    }

    // Ctrl-C ends it, and node-2 drops its part of the tail (at its next
    // keepalive at the latest).
    // SAFETY: kill(2) on our own child's PID, with a valid signal.
    let rc = unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    assert_eq!(rc, 0);
    assert!(child.wait().expect("exits").success());
    let hub = c.node(1).node.runtime().live_tail().clone();
    tokio::time::timeout(Duration::from_secs(15), async {
        while hub.subscribers() > 0 {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await
    .expect("node-2's part of the tail ended after the reader left");
}
