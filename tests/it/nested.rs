//! Nested Worker invocations on 3 real nodes (TestCluster): service-binding
//! chains, dynamic dispatch through an outbound Worker, the depth limit, and
//! the security rules of `hearth::invoker` / `hearth_runtime::outbound::outgoing`. The
//! Workers are named so that their homes differ, and the nodes that served
//! each level are checked from `x-hearth-node` as the samples report it.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use hearth::cluster::ClusterConfig;
use hearth::runtime::limits::MAX_DEPTH;
use hearth::runtime::{Lifecycle, Manifest, Plan, RuntimeConfig};
use hearth::sharding::admission::OverloadConfig;
use hearth::testing::{HttpRequest, TestCluster, TestResponse, eventually};

/// How long a test waits for an asynchronous effect (a bounded wait, not a
/// timing assertion).
const SETTLE: Duration = Duration::from_secs(10);

/// `n` nodes whose runtimes pool 64 instances and are then configured by
/// `runtime`.
async fn cluster_with(
    n: usize,
    runtime: impl Fn(RuntimeConfig) -> RuntimeConfig + Send + Sync + 'static,
) -> TestCluster {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut cfg = ClusterConfig::new(n, dir.path());
    cfg.runtime = Arc::new(move |c| runtime(c.instance_pool_size(64)));
    TestCluster::with_config(cfg, Some(dir))
        .await
        .expect("cluster")
}

/// Deploys the sample `sample` as `id` with `manifest` through node 0.
async fn deploy(c: &TestCluster, id: &str, manifest: Manifest, sample: &str) {
    let wasm = hearth_sample_workers::bytes(sample).expect("sample built");
    c.deploy_manifest(id, manifest, wasm).await.expect("deploy");
}

/// `cpu-hog`'s manifest: the paid plan, a fresh instance per request.
fn hog() -> Manifest {
    Manifest {
        lifecycle: Lifecycle::Fresh,
        ..Manifest::from(Plan::Paid)
    }
}

/// A platform's manifest (the `dispatcher` sample): the dispatch namespace
/// `users` holding `users`, and `outbound` as its outbound Worker.
fn platform(users: &[&str], outbound: &str) -> Manifest {
    let mut m = Manifest::default();
    let namespace = m.bindings.dispatch.entry("users".into()).or_default();
    for u in users {
        namespace.insert((*u).to_string());
    }
    m.bindings.outbound = Some(outbound.into());
    m
}

/// `GET /` of Worker `id` through node `i`, with `headers`.
async fn get_with(c: &TestCluster, i: usize, id: &str, headers: &[(&str, &str)]) -> TestResponse {
    c.send(i, id, http::Method::GET, "/", Bytes::new(), headers)
        .await
        .expect("request")
}

/// What the `tail-log` Worker `traces` on node `home` has received, once
/// `ready(log)` (polled for up to 10 s: the tail Worker is invoked after
/// the flow's response).
async fn tail_log_once(c: &TestCluster, home: usize, ready: impl Fn(&str) -> bool) -> String {
    let mut log = String::new();
    for _ in 0..500 {
        log = c.get(home, "traces", "/").await.expect("tail").text();
        if ready(&log) {
            return log;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("the tail Worker was not invoked: {log}");
}

/// `n` (≤ nodes) script IDs starting with `prefix` whose homes are
/// pairwise different.
fn names_on_distinct_homes(c: &TestCluster, prefix: &str, n: usize) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    let mut homes = Vec::new();
    for k in 0..1000 {
        let name = format!("{prefix}-{k}");
        let home = c.home_of(&name).expect("home");
        if !homes.contains(&home) {
            homes.push(home);
            out.push(name);
            if out.len() == n {
                return out;
            }
        }
    }
    panic!("no {n} names with distinct homes");
}

fn manifest(services: &[(&str, &str)]) -> Manifest {
    let mut m = Manifest::default();
    for (name, target) in services {
        m.bindings.services.insert((*name).into(), (*target).into());
    }
    m
}

fn node_id(c: &TestCluster, i: usize) -> String {
    c.node(i).node.id().to_string()
}

/// Requests the runtimes of the whole cluster have received.
fn total_requests(c: &TestCluster) -> u64 {
    (0..c.nodes().len())
        .map(|i| c.stats(i).runtime.requests)
        .sum()
}

/// Deploys the chain `names[0] -> names[1] -> ...` of `relay`s.
async fn deploy_chain(c: &TestCluster, names: &[String]) {
    for (i, name) in names.iter().enumerate() {
        let m = match names.get(i + 1) {
            Some(next) => manifest(&[("next", next)]),
            None => Manifest::default(),
        };
        deploy(c, name, m, "relay").await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chain_of_service_bindings_crosses_three_homes() {
    let c = TestCluster::start(3).await.expect("cluster");
    let mut names = names_on_distinct_homes(&c, "link", 3);
    // Depth 4: the last link is on the first one's home again.
    let more = names_on_distinct_homes(&c, "tail-link", 3);
    let back = more
        .into_iter()
        .find(|n| c.home_of(n) == c.home_of(&names[0]))
        .expect("a name on the first home");
    names.push(back);
    deploy_chain(&c, &names).await;
    let homes: Vec<usize> = names.iter().map(|n| c.home_of(n).expect("home")).collect();
    // Enter through a node that is not the first link's home.
    let entry = (homes[0] + 1) % 3;
    let r = c.get(entry, &names[0], "/x").await.expect("request");
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.text(), names.join(" > "));
    assert_eq!(r.header("x-hearth-node"), node_id(&c, homes[0]));
    let below: Vec<String> = homes[1..].iter().map(|&h| node_id(&c, h)).collect();
    assert_eq!(
        r.header("x-relay-nodes"),
        below.join(","),
        "each level at its home"
    );
    // Each level ran exactly once.
    assert_eq!(total_requests(&c), names.len() as u64);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refusing_homes_mid_chain_serve_the_calls_lazily_on_the_caller() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut cfg = ClusterConfig::new(3, dir.path());
    // Homes admit nothing: every sharded hop is refused.
    cfg.overload = OverloadConfig {
        max_in_flight_per_worker: 0,
        max_in_flight_node: 0,
    };
    let c = TestCluster::with_config(cfg, Some(dir))
        .await
        .expect("cluster");
    let names = names_on_distinct_homes(&c, "lazy", 3);
    deploy_chain(&c, &names).await;
    let first = c.home_of(&names[0]).expect("home");
    let r = c.get(first, &names[0], "/").await.expect("request");
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.text(), names.join(" > "));
    // Both nested calls were refused by their homes and served by the
    // caller's node, through its lazy instance.
    let here = node_id(&c, first);
    assert_eq!(r.header("x-relay-nodes"), format!("{here},{here}"));
    assert!(c.stats(first).rpc.refusals_received >= 2);
    assert_eq!(total_requests(&c), 3, "nothing ran twice");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_loop_of_bindings_stops_at_the_depth_limit() {
    let c = TestCluster::start(3).await.expect("cluster");
    let names = names_on_distinct_homes(&c, "loop", 2);
    let (a, b) = (&names[0], &names[1]);
    deploy(&c, a, manifest(&[("next", b)]), "relay").await;
    deploy(&c, b, manifest(&[("next", a)]), "relay").await;
    let r = c.get(0, a, "/").await.expect("request");
    assert_eq!(r.status, 508, "{}", r.text());
    assert!(r.text().contains("loop detected"), "{}", r.text());
    // Levels 1..=MAX_DEPTH ran; the deepest one's call was refused.
    assert_eq!(
        r.text().matches(" > ").count(),
        MAX_DEPTH - 1,
        "{}",
        r.text()
    );
    assert_eq!(total_requests(&c), MAX_DEPTH as u64);
    let too_deep: u64 = (0..3).map(|i| c.stats(i).runtime.nested_too_deep).sum();
    assert_eq!(too_deep, 1, "counted");
    // Nothing is left running or holding a slot.
    assert!(
        eventually(SETTLE, || (0..3).all(|i| c.stats(i).runtime.in_flight == 0)).await,
        "instance slots released"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_reaches_nothing_outside_its_bindings() {
    let c = TestCluster::start(3).await.expect("cluster");
    deploy(&c, "hello", Plan::Free.into(), "hello").await;
    deploy(&c, "r", manifest(&[("greet", "hello")]), "relay").await;
    for url in [
        "http://hello.internal/",                // the script ID, not a binding name
        "http://hello.localhost/",               // an external host, no outbound Worker
        "http://hello.users.dispatch.internal/", // no such namespace
        "http://greet.other.internal/",          // not the binding scheme
    ] {
        let r = get_with(&c, 0, "r", &[("x-relay-to", url)]).await;
        // Denied: the relay answers as the end of a chain.
        assert_eq!((r.status, r.text()), (200, "r".to_string()), "{url}");
    }
    assert_eq!(total_requests(&c), 4, "hello never ran");
    let denied: u64 = (0..3).map(|i| c.stats(i).runtime.nested_denied).sum();
    assert_eq!(denied, 4, "each denial counted");
    // The binding it has works.
    let r = get_with(&c, 0, "r", &[("x-relay-to", "http://greet.internal/")]).await;
    assert_eq!(r.text(), "r > hello from hello");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_guest_cannot_forge_the_hosts_headers_trust_or_depth() {
    let c = TestCluster::start(3).await.expect("cluster");
    deploy(&c, "echo", Plan::Free.into(), "echo").await;
    deploy(&c, "r", manifest(&[("next", "echo")]), "relay").await;
    // The relay sends these on as x-hearth-trust etc.
    let forged = [
        ("x-forward-hearth-trust", "platform"),
        ("x-forward-hearth-caller", "admin"),
        ("x-forward-hearth-depth", "0"),
        ("x-forward-hearth-cpu-ms", "999999999"),
        ("x-forward-hearth-tail", "spy"),
    ];
    let r = get_with(&c, 1, "r", &forged).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("x-echo-x-hearth-trust"), "standard");
    assert_eq!(r.header("x-echo-x-hearth-caller"), "r");
    assert_eq!(r.header("x-echo-x-hearth-depth"), "2");
    assert_eq!(r.header("x-echo-x-hearth-cpu-ms"), "", "dropped");
    assert_eq!(r.header("x-echo-x-hearth-tail"), "", "dropped");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nested_worker_gets_no_more_cpu_than_its_caller_had_left() {
    // The caller's plan allows 300 ms of CPU; the callee's 60 s.
    let c = cluster_with(3, |c| {
        c.request_cpu(Plan::Free, Duration::from_millis(300))
            .request_cpu(Plan::Paid, Duration::from_secs(60))
    })
    .await;
    deploy(&c, "hog", hog(), "cpu-hog").await;
    deploy(&c, "r", manifest(&[("next", "hog")]), "relay").await;
    let r = c.get(0, "r", "/").await.expect("request");
    assert_eq!(r.status, 503, "{}", r.text());
    let text = r.text();
    assert!(text.contains("exceeded its CPU limit"), "{text}");
    // The budget named is the caller's remainder (≤ 300 ms), not 60 s.
    let budget = text
        .split(" of ")
        .nth(1)
        .and_then(|s| s.split(' ').next())
        .unwrap_or("");
    assert!(budget.ends_with("ms"), "budget {budget:?} in {text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_workers_for_platforms_flow_goes_through_the_outbound_worker() {
    let c = TestCluster::start(3).await.expect("cluster");
    let names = names_on_distinct_homes(&c, "wfp", 3);
    let (dispatcher, user, egress) = (&names[0], &names[1], &names[2]);
    deploy(
        &c,
        dispatcher,
        platform(&[user.as_str()], egress),
        "dispatcher",
    )
    .await;
    deploy(&c, "user-a-direct", Plan::Free.into(), "user-app").await;
    deploy(&c, user, Plan::Free.into(), "user-app").await;
    deploy(&c, egress, Plan::Free.into(), "egress").await;
    let entry = (c.home_of(dispatcher).expect("home") + 1) % 3;

    let r = c
        .get(entry, dispatcher, &format!("/{user}/orders?id=7"))
        .await
        .expect("request");
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(
        r.text(),
        format!(
            "dispatcher > {user} > egress saw GET api.example.com/orders?id=7 for {user} (platform)"
        )
    );
    let home = |n: &String| node_id(&c, c.home_of(n).expect("home"));
    assert_eq!(r.header("x-hearth-node"), home(dispatcher));
    assert_eq!(r.header("x-user-node"), home(user));

    // The outbound Worker may block a subrequest.
    let r = c
        .get(entry, dispatcher, &format!("/{user}/blocked/x"))
        .await
        .expect("request");
    assert_eq!(r.status, 403, "{}", r.text());
    assert!(
        r.text()
            .ends_with("egress blocked api.example.com/blocked/x")
    );

    // A Worker outside the namespace cannot be dispatched to.
    let r = c
        .get(entry, dispatcher, "/user-a-direct/x")
        .await
        .expect("request");
    assert_eq!(r.status, 404, "{}", r.text());

    // The same user Worker called directly has no outbound Worker: its
    // subrequest is denied.
    let r = c.get(entry, "user-a-direct", "/x").await.expect("request");
    assert_eq!(r.status, 403, "{}", r.text());
    assert_eq!(r.text(), "user-a-direct: subrequest denied");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_the_middle_node_mid_flow_fails_the_flow_cleanly_and_once() {
    // The last link spins until its CPU limit (3 s), long enough to kill
    // the node in the middle while it waits.
    let mut c = cluster_with(3, |c| c.request_cpu(Plan::Paid, Duration::from_secs(3))).await;
    let names = names_on_distinct_homes(&c, "mid", 3);
    let (first, middle, last) = (&names[0], &names[1], &names[2]);
    deploy(&c, first, manifest(&[("next", middle)]), "relay").await;
    deploy(&c, middle, manifest(&[("next", last)]), "relay").await;
    deploy(&c, last, hog(), "cpu-hog").await;
    let homes: Vec<usize> = names.iter().map(|n| c.home_of(n).expect("home")).collect();
    let addr = c.node(homes[0]).http_addr;
    let request = HttpRequest::get(&format!("{first}.localhost"), "/");
    let flow = tokio::spawn(async move {
        let resp = request.send_async(addr).await.expect("an answer");
        (resp.status, resp.text())
    });
    // Wait until the last link is running (the middle one waits for it).
    let last_home = homes[2];
    assert!(
        eventually(SETTLE, || c.stats(last_home).runtime.in_flight >= 1).await,
        "the flow reached its last level"
    );
    c.kill(homes[1]);
    let (status, body) = tokio::time::timeout(Duration::from_secs(30), flow)
        .await
        .expect("the flow ends, it does not hang")
        .expect("task");
    assert_eq!(status, 502, "{body}");
    assert!(body.starts_with(&format!("{first} > ")), "{body}");
    // The middle level was not run again anywhere else.
    let survivors = [homes[0], homes[2]];
    let requests: u64 = survivors.iter().map(|&i| c.stats(i).runtime.requests).sum();
    assert_eq!(requests, 2, "the first and last levels ran once each");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_tail_worker_gets_the_whole_flow_from_every_node_in_one_invocation() {
    // One instance per Worker and node, reused: `tail-log` keeps what it
    // received in that instance's memory.
    let c = cluster_with(3, |c| {
        c.reuse(hearth::runtime::ReusePolicy {
            max_concurrency: 1,
            ..hearth::runtime::ReusePolicy::default()
        })
    })
    .await;
    let names = names_on_distinct_homes(&c, "traced", 3);
    let (dispatcher, user, egress) = (&names[0], &names[1], &names[2]);
    let mut m = platform(&[user.as_str(), "crashy"], egress);
    m.bindings.tail = vec!["traces".into()];
    deploy(&c, dispatcher, m, "dispatcher").await;
    deploy(&c, user, Plan::Free.into(), "user-app").await;
    deploy(&c, egress, Plan::Free.into(), "egress").await;
    let reuse = Manifest {
        lifecycle: Lifecycle::Reuse,
        ..Manifest::default()
    };
    deploy(&c, "traces", reuse, "tail-log").await;
    let tail_home = c.home_of("traces").expect("home");
    let entry = (c.home_of(dispatcher).expect("home") + 1) % 3;

    let r = c
        .get(entry, dispatcher, &format!("/{user}/orders"))
        .await
        .expect("request");
    assert_eq!(r.status, 200, "{}", r.text());

    // The tail Worker is invoked after the flow ends: wait for it.
    let log = tail_log_once(&c, tail_home, |log| !log.starts_with("0\n")).await;
    let mut lines = log.lines();
    assert_eq!(lines.next(), Some("1"), "exactly one invocation: {log}");
    let batch: serde_json::Value =
        serde_json::from_str(lines.next().expect("a batch")).expect("JSON");
    assert_eq!(batch["entry"], dispatcher.as_str());
    let events = batch["events"].as_array().expect("events");
    let has = |script: &str, kind: &str, text: &str| {
        events.iter().any(|e| {
            e["script_id"] == script
                && e["kind"] == kind
                && e["message"].as_str().is_some_and(|m| m.contains(text))
        })
    };
    // Logs (the guests' stderr), subrequests and outcomes of every level.
    assert!(
        has(dispatcher, "log", &format!("dispatching /orders to {user}")),
        "{log}"
    );
    assert!(has(user, "log", "fetching /orders"), "{log}");
    assert!(has(user, "log", "[trace] subrequest"), "{log}");
    assert!(has(dispatcher, "subrequest", "-> 200"), "{log}");
    assert!(has(user, "subrequest", "api.example.com"), "{log}");
    for w in [dispatcher, user, egress] {
        assert!(has(w, "outcome", "ok 200"), "{w}: {log}");
    }
    // From every node the flow crossed.
    let nodes: std::collections::BTreeSet<&str> =
        events.iter().filter_map(|e| e["node"].as_str()).collect();
    let expected: std::collections::BTreeSet<String> = [dispatcher, user, egress]
        .iter()
        .map(|n| node_id(&c, c.home_of(n).expect("home")))
        .collect();
    assert_eq!(
        nodes,
        expected.iter().map(String::as_str).collect(),
        "{log}"
    );

    // A second flow is a second invocation; a failing level is an exception.
    let r = c
        .get(entry, dispatcher, &format!("/{user}/blocked"))
        .await
        .expect("request");
    assert_eq!(r.status, 403);
    let log = tail_log_once(&c, tail_home, |log| !log.starts_with("1\n")).await;
    assert!(log.starts_with("2\n"), "{log}");
    assert!(
        log.lines().nth(2).is_some_and(|b| b.contains("ok 403")),
        "{log}"
    );

    // A user Worker that traps: its exception is in the flow's events.
    deploy(&c, "crashy", Plan::Free.into(), "trap").await;
    let r = c
        .get(entry, dispatcher, "/crashy/x")
        .await
        .expect("request");
    assert_eq!(r.status, 500, "{}", r.text());
    let log = tail_log_once(&c, tail_home, |log| !log.starts_with("2\n")).await;
    assert!(log.starts_with("3\n"), "{log}");
    let batch: serde_json::Value =
        serde_json::from_str(log.lines().nth(3).expect("third batch")).expect("JSON");
    let events = batch["events"].as_array().expect("events");
    let of = |kind: &str| {
        events
            .iter()
            .any(|e| e["script_id"] == "crashy" && e["kind"] == kind)
    };
    assert!(of("exception") && of("outcome"), "{log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_worker_keeps_its_outbound_worker_through_its_own_bindings() {
    let c = TestCluster::start(3).await.expect("cluster");
    deploy(&c, "platform", platform(&["shop"], "egress"), "dispatcher").await;
    // The user Worker `shop` hands its work to its own service binding,
    // which makes the subrequest.
    deploy(&c, "shop", manifest(&[("next", "shop-backend")]), "relay").await;
    deploy(&c, "shop-backend", Plan::Free.into(), "user-app").await;
    deploy(&c, "egress", Plan::Free.into(), "egress").await;
    let r = c.get(0, "platform", "/shop/cart").await.expect("request");
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(
        r.text(),
        "dispatcher > shop > shop-backend > egress saw GET api.example.com/cart for shop-backend (platform)"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_entry_workers_wall_clock_deadline_bounds_the_whole_flow() {
    // The entry (free plan) has 300 ms of wall time; the Worker it calls
    // (paid) would be allowed a minute of CPU and wall time on its own.
    let c = cluster_with(3, |c| {
        let mut free = hearth::runtime::PlanLimits::default_for(Plan::Free);
        free.request_wall = Duration::from_millis(300);
        let mut paid = hearth::runtime::PlanLimits::default_for(Plan::Paid);
        paid.request_cpu = Duration::from_secs(60);
        paid.request_wall = Duration::from_secs(60);
        c.plan_limits(Plan::Free, free)
            .plan_limits(Plan::Paid, paid)
    })
    .await;
    deploy(&c, "hog", hog(), "cpu-hog").await;
    deploy(&c, "r", manifest(&[("next", "hog")]), "relay").await;
    let r = tokio::time::timeout(Duration::from_secs(20), c.get(0, "r", "/"))
        .await
        .expect("the flow ends at its deadline")
        .expect("request");
    assert!(
        r.status == 504 || r.status == 502,
        "{} {}",
        r.status,
        r.text()
    );
    // The callee was stopped at the flow's deadline too, not left to spin
    // for its own minute.
    assert!(
        eventually(SETTLE, || (0..3).all(|i| c.stats(i).runtime.in_flight == 0)).await,
        "every level stopped"
    );
    assert!((0..3).map(|i| c.stats(i).runtime.wall_kills).sum::<u64>() >= 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fetch_in_a_javascript_worker_reaches_its_bindings_unchanged() {
    let c = TestCluster::start(3).await.expect("cluster");
    deploy(&c, "hello", Plan::Free.into(), "hello").await;
    let mut m = manifest(&[("next", "hello")]);
    m.plan = Plan::Paid;
    deploy(&c, "js", m, "js").await;
    let r = get_with(&c, 0, "js", &[("x-js-fetch", "http://next.internal/")]).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let answer: serde_json::Value = serde_json::from_str(&r.text()).expect("JSON");
    assert_eq!(answer["fetched"]["status"], 200, "{answer}");
    assert_eq!(answer["fetched"]["body"], "hello from hello", "{answer}");
    // Outside its bindings, fetch() rejects.
    let r = get_with(&c, 0, "js", &[("x-js-fetch", "http://hello.localhost/")]).await;
    let answer: serde_json::Value = serde_json::from_str(&r.text()).expect("JSON");
    assert!(answer["fetchError"].is_string(), "{answer}");
    assert!(answer.get("fetched").is_none(), "{answer}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_concurrent_subrequests_are_bounded_per_invocation() {
    let c = TestCluster::start(1).await.expect("cluster");
    deploy(&c, "fan", manifest(&[("next", "nap")]), "fan-out").await;
    deploy(&c, "nap", Manifest::default(), "fan-out").await;
    deploy(&c, "hello", Plan::Free.into(), "hello").await;
    assert_eq!(c.get(0, "hello", "/").await.expect("hello").status, 200);
    // The fan-out sends 1,000 calls before awaiting any; each callee naps
    // 20 ms. The node's in-flight gauge counts every running instance:
    // the fan-out, its callees, and the other tenant's request.
    let peak = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let fan = async {
        let r = c.get(0, "fan", "/1000?ms=20").await.expect("fan-out");
        done.store(true, std::sync::atomic::Ordering::Relaxed);
        r
    };
    let watch = async {
        while !done.load(std::sync::atomic::Ordering::Relaxed) {
            peak.fetch_max(
                c.stats(0).runtime.in_flight,
                std::sync::atomic::Ordering::Relaxed,
            );
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    };
    let other = async {
        let mut statuses = Vec::new();
        while !done.load(std::sync::atomic::Ordering::Relaxed) {
            statuses.push(c.get(0, "hello", "/").await.expect("hello").status);
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        statuses
    };
    let (r, (), statuses) = tokio::join!(fan, watch, other);
    let limit = 6;
    let peak = peak.load(std::sync::atomic::Ordering::Relaxed);
    eprintln!(
        "fan-out: {} {:?}; peak in flight {peak}; hello {} of {}",
        r.status,
        r.text(),
        statuses.iter().filter(|s| **s == 200).count(),
        statuses.len()
    );
    assert!(
        peak <= limit + 2,
        "{peak} instances ran at once: the fan-out, hello and more than {limit} callees"
    );
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(
        r.text(),
        "1000 ok, 0 failed",
        "every call is served, in turn"
    );
    assert!(
        !statuses.is_empty() && statuses.iter().all(|s| *s == 200),
        "{statuses:?}"
    );
    let s = c.stats(0).runtime;
    assert_eq!(s.nested_calls, 1000);
    assert!(s.nested_queued >= 1000 - limit, "{}", s.nested_queued);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_nested_calls_of_a_flow_share_one_cpu_budget_across_the_hop() {
    // 200 ms of CPU per request: the flow's nested calls get 400 ms per
    // node (twice that).
    let c = cluster_with(2, |c| c.request_cpu(Plan::Free, Duration::from_millis(200))).await;
    let names = names_on_distinct_homes(&c, "burn", 2);
    let (fan, spin) = (&names[0], &names[1]);
    deploy(&c, fan, manifest(&[("next", spin)]), "fan-out").await;
    deploy(&c, spin, Manifest::default(), "fan-out").await;
    let entry = c.home_of(fan).expect("home");
    // 1,000 calls, each burning 10 ms of CPU at the callee's home, over
    // the shard hop: 10 s of CPU without a flow budget.
    let r = c.get(entry, fan, "/1000?spin=10").await.expect("fan-out");
    assert_eq!(r.status, 200, "{}", r.text());
    let text = r.text();
    let ok: usize = text
        .split(' ')
        .next()
        .and_then(|n| n.parse().ok())
        .expect("a count");
    let refused: u64 = (0..2).map(|i| c.stats(i).runtime.nested_cpu_refused).sum();
    eprintln!("fan-out of 1,000 × 10 ms CPU: {text:?}; {refused} refused");
    // The budget (400 ms per node) ran out well before the 1,000th call
    // (each spins 10 ms of wall time, at most 10 ms of CPU: fewer under
    // load, so the count served varies); every later call was refused at
    // the caller but the few stopped where they ran.
    assert!((5..1000).contains(&ok), "{text}");
    assert!(
        text.contains("CPU budget for nested calls"),
        "the guest sees why: {text}"
    );
    assert!(
        refused as usize + 12 >= 1000 - ok,
        "{refused} refused of {} not served: {text}",
        1000 - ok
    );
    // Another flow has its own budget.
    let r = c.get(entry, fan, "/3?spin=10").await.expect("fan-out");
    assert_eq!(r.text(), "3 ok, 0 failed");
}
