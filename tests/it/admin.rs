//! The admin API of a node: token, deploys with validation errors, stats
//! and metrics, against a real node's listener.

use bytes::Bytes;
use http_body_util::BodyExt;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

use hearth::testing::TestCluster;
use hearth_admin_client::AdminClient;

async fn call(
    method: http::Method,
    url: String,
    token: Option<&str>,
    body: Vec<u8>,
) -> (u16, String) {
    let client = Client::builder(TokioExecutor::new()).build_http::<http_body_util::Full<Bytes>>();
    let mut req = http::Request::builder().method(method).uri(url);
    if let Some(t) = token {
        req = req.header(http::header::AUTHORIZATION, format!("Bearer {t}"));
    }
    let resp = client
        .request(
            req.body(http_body_util::Full::new(Bytes::from(body)))
                .expect("request"),
        )
        .await
        .expect("admin reachable");
    let status = resp.status().as_u16();
    let body = resp.into_body().collect().await.expect("body").to_bytes();
    (status, String::from_utf8_lossy(&body).into_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deploy_through_the_admin_api_reaches_the_whole_cluster() {
    let c = TestCluster::start(2).await.expect("cluster");
    let admin = c.node(1).admin_addr;
    let hello = hearth_sample_workers::bytes("hello").expect("hello");
    let url = format!("http://{admin}/v1/scripts/greeter?plan=free");

    let (status, body) = call(http::Method::PUT, url.clone(), None, hello.clone()).await;
    assert_eq!(status, 401, "{body}");
    let (status, _) = call(http::Method::PUT, url.clone(), Some("wrong"), hello.clone()).await;
    assert_eq!(status, 401);

    let (status, body) = call(http::Method::PUT, url, Some(c.token()), hello).await;
    assert_eq!(status, 200, "{body}");
    let report: serde_json::Value = serde_json::from_str(&body).expect("json report");
    assert_eq!(report["meta"]["script_id"], "greeter");
    assert!(report["compile_time"].as_f64().is_some());
    for i in 0..2 {
        let r = c.get(i, "greeter", "/").await.expect("request");
        assert_eq!((r.status, r.text().as_str()), (200, "hello from greeter"));
    }

    let big = hearth_sample_workers::bytes("big").expect("big");
    let (status, body) = call(
        http::Method::PUT,
        format!("http://{admin}/v1/scripts/big?plan=free"),
        Some(c.token()),
        big,
    )
    .await;
    assert_eq!(status, 413);
    assert!(body.contains("too large for the free plan"), "{body}");
    let (status, body) = call(
        http::Method::PUT,
        format!("http://{admin}/v1/scripts/core"),
        Some(c.token()),
        b"\0asm\x01\0\0\0".to_vec(),
    )
    .await;
    assert_eq!(status, 422);
    assert!(body.contains("core WebAssembly module"), "{body}");

    let (status, body) = call(
        http::Method::GET,
        format!("http://{admin}/metrics"),
        None,
        vec![],
    )
    .await;
    assert_eq!(status, 200);
    assert!(body.contains("# TYPE hearth_"), "{body}");
    assert!(body.contains("hearth_evictions_total"), "{body}");
    let (status, body) = call(
        http::Method::GET,
        format!("http://{admin}/v1/stats"),
        Some(c.token()),
        vec![],
    )
    .await;
    assert_eq!(status, 200);
    assert!(body.contains("\"requests\""), "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deploy_sets_and_reports_the_lifecycle() {
    let c = TestCluster::start(1).await.expect("cluster");
    let admin = c.node(0).admin_addr;
    let echo = hearth_sample_workers::bytes("echo").expect("echo");
    let deploy = |query: &str| format!("http://{admin}/v1/scripts/echo?{query}");

    // Nothing set: hearth reads the component (Rust) and reuses.
    let (status, body) = call(
        http::Method::PUT,
        deploy("plan=free"),
        Some(c.token()),
        echo.clone(),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let report: serde_json::Value = serde_json::from_str(&body).expect("json report");
    assert_eq!(report["meta"]["lifecycle"]["chosen"], "reuse", "{body}");
    assert_eq!(report["meta"]["lifecycle"]["requested"], "auto");

    // Set at deploy: final, and in force (a fresh instance per request).
    let (status, body) = call(
        http::Method::PUT,
        deploy("plan=free&lifecycle=Fresh"),
        Some(c.token()),
        echo.clone(),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let report: serde_json::Value = serde_json::from_str(&body).expect("json report");
    assert_eq!(report["meta"]["lifecycle"]["chosen"], "fresh", "{body}");
    for _ in 0..2 {
        let r = c.get(0, "echo", "/").await.expect("request");
        assert_eq!(r.status, 200);
        assert_eq!(r.headers["x-echo-served"], "1");
    }

    // A bad value is refused with the reason, and changes nothing.
    let (status, body) = call(
        http::Method::PUT,
        deploy("lifecycle=sometimes"),
        Some(c.token()),
        echo,
    )
    .await;
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("expected auto, reuse or fresh"), "{body}");
}

/// The value of metric `name` (no labels) in a Prometheus text exposition.
fn metric(text: &str, name: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {name} in {text}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_ring_view_places_a_worker_and_agrees_with_metrics_and_hearth_ring() {
    let c = TestCluster::start(3).await.expect("cluster");
    let admin = c.node(1).admin_addr;
    let view = AdminClient::new(&format!("http://{admin}"), Some(c.token().to_string()))
        .expect("admin url")
        .ring(Some("hello"))
        .await
        .expect("a RingView");
    assert_eq!(view.node, "node-2");
    assert!(view.clustered);
    let ids: Vec<&str> = view.members.iter().map(|m| m.id.as_str()).collect();
    assert_eq!(ids, ["node-1", "node-2", "node-3"]);
    let states: Vec<&str> = view.members.iter().map(|m| m.state.as_str()).collect();
    assert_eq!(states, ["up", "self", "up"]);
    let total: f64 = view.members.iter().map(|m| m.ownership).sum();
    assert!((total - 1.0).abs() < 1e-9, "shares add up to 1: {total}");
    let placed = view.script.as_ref().expect("hello placed");
    let home = c.node(c.home_of("hello").expect("home")).node.id();
    assert_eq!(placed.home.as_deref(), Some(home));
    assert_eq!(placed.successors.len(), 3);
    assert_eq!(placed.successors[0], home);

    // A script ID that must be percent-encoded in the query (the client
    // does) is placed under its own name, not its encoding.
    let odd = "my app/ü&x=1";
    let view = AdminClient::new(&format!("http://{admin}"), Some(c.token().to_string()))
        .expect("admin url")
        .ring(Some(odd))
        .await
        .expect("a RingView");
    let placed = view.script.as_ref().expect("placed");
    assert_eq!(placed.script_id, odd);
    let odd_home = c.node(c.home_of(odd).expect("home")).node.id();
    assert_eq!(placed.home.as_deref(), Some(odd_home));

    // /metrics says the same.
    let (_, metrics) = call(
        http::Method::GET,
        format!("http://{admin}/metrics"),
        None,
        Vec::new(),
    )
    .await;
    assert_eq!(metric(&metrics, "hearth_ring_members"), 3.0);
    let mine = view
        .members
        .iter()
        .find(|m| m.state == "self")
        .expect("self");
    assert!((metric(&metrics, "hearth_ring_ownership") - mine.ownership).abs() < 1e-9);

    // And so does `hearth ring`.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_hearth"))
        .args([
            "ring",
            "--admin",
            &format!("http://{admin}"),
            "--script",
            "hello",
        ])
        .env("HEARTH_ADMIN_TOKEN", c.token())
        .output()
        .expect("run hearth ring");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.starts_with("ring of node-2 (3 members)"), "{text}");
    assert!(
        text.contains(&format!("hello: home {home}, successors")),
        "{text}"
    );
    assert_eq!(
        text.matches(" up").count() + text.matches(" self").count(),
        3,
        "{text}"
    );

    // Without the token: refused.
    let (status, _) = call(
        http::Method::GET,
        format!("http://{admin}/v1/ring"),
        None,
        Vec::new(),
    )
    .await;
    assert_eq!(status, 401);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bindings_deploy_through_the_admin_api_and_are_listed() {
    // Through the typed admin client, as `hearth deploy` and `hearth bench`
    // use the API.
    let c = TestCluster::start(1).await.expect("cluster");
    let admin = AdminClient::new(
        &format!("http://{}", c.node(0).admin_addr),
        Some(c.token().to_string()),
    )
    .expect("admin URL");
    let relay = hearth_sample_workers::bytes("relay").expect("relay");
    let report = admin
        .deploy(
            "front",
            "service=next:back&dispatch=users:user-a&dispatch=users:user-b\
             &outbound=egress&tail=traces",
            relay.clone(),
        )
        .await
        .expect("deploy");
    let b = &report.meta.bindings;
    assert_eq!(b.services["next"], "back");
    assert_eq!(
        b.dispatch["users"].iter().collect::<Vec<_>>(),
        ["user-a", "user-b"]
    );
    assert_eq!(b.outbound.as_deref(), Some("egress"));
    assert_eq!(b.tail, ["traces"]);

    let list = admin.list().await.expect("list");
    assert_eq!(list[0].script_id, "front");
    assert_eq!(list[0].bindings.services["next"], "back");

    // Bindings that cannot name a Worker are refused at deploy.
    let refused = admin
        .deploy("front", "service=Bad_Name:back", relay)
        .await
        .expect_err("refused");
    assert_eq!(refused.status().map(|s| s.as_u16()), Some(422), "{refused}");
    assert!(
        refused.to_string().contains("invalid bindings"),
        "{refused}"
    );

    // Evict and stats: a warm Worker taken out of memory by hand.
    let hello = hearth_sample_workers::bytes("hello").expect("hello");
    admin
        .deploy("plain", "plan=free", hello)
        .await
        .expect("deploy");
    let r = c.get(0, "plain", "/").await.expect("request");
    assert_eq!(r.status, 200);
    let before = admin.stats().await.expect("stats");
    admin.evict("plain").await.expect("evict");
    let after = admin.stats().await.expect("stats");
    assert_eq!(after.evicted_manual, before.evicted_manual + 1);
    assert!(after.requests >= 1);
}

/// With `admin_metrics = "token"`, `/metrics` is one more route behind the
/// admin token (it names Workers and counts store errors); the health
/// checks stay open. The default stays open, as scrapers expect.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_can_require_the_admin_token() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut cfg = hearth::cluster::ClusterConfig::new(1, dir.path());
    cfg.https = false;
    cfg.admin_metrics = hearth::admin::MetricsAccess::Token;
    let c = TestCluster::with_config(cfg, None).await.expect("cluster");
    let admin = c.node(0).admin_addr;
    let metrics = format!("http://{admin}/metrics");

    let (status, body) = call(http::Method::GET, metrics.clone(), None, vec![]).await;
    assert_eq!(status, 401, "{body}");
    assert!(!body.contains("hearth_"), "{body}");
    let (status, _) = call(http::Method::GET, metrics.clone(), Some("wrong"), vec![]).await;
    assert_eq!(status, 401);
    let (status, body) = call(http::Method::GET, metrics, Some(c.token()), vec![]).await;
    assert_eq!(status, 200);
    assert!(body.contains("# TYPE hearth_"), "{body}");
    for open in ["/livez", "/readyz"] {
        let (status, body) = call(
            http::Method::GET,
            format!("http://{admin}{open}"),
            None,
            vec![],
        )
        .await;
        assert_eq!(status, 200, "{open}: {body}");
    }

    let open = TestCluster::start(1).await.expect("cluster");
    let url = format!("http://{}/metrics", open.node(0).admin_addr);
    let (status, _) = call(http::Method::GET, url, None, vec![]).await;
    assert_eq!(status, 200, "open by default");
}
