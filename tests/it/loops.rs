//! Workers that loop through the public front door (issue 42 item 3), on
//! real nodes whose egress may reach loopback: a Worker allowed to fetch
//! its own public name, `<id>.localhost:<port>` (the node's egress
//! resolves `*.localhost` to loopback itself, RFC 6761, and the front door
//! routes by the first label, so `fetch(request.url)` comes back to the
//! same Worker). Every request a Worker sends to an origin carries
//! hearth's `CDN-Loop` entry, which the guest can neither drop nor forge,
//! and the front door answers 508 past `max_loop_passes` passes (default
//! `hearth_runtime::limits::MAX_LOOP_PASSES`, 8), before any slot is taken
//! (`hearth_runtime::flow`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use hearth::cluster::ClusterConfig;
use hearth::runtime::outbound::egress::EgressConfig;
use hearth::runtime::{Manifest, Plan};
use hearth::testing::{TestCluster, build_js};
use http_body_util::{BodyExt, Full};
use hyper::service::service_fn;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};

/// The Worker: answers whatever its own URL answers.
const SELF_FETCH: &str = "export default { fetch(request) { return fetch(request.url); } };";

/// A cluster of `n` nodes whose Workers may fetch loopback origins.
async fn cluster(n: usize) -> (TestCluster, tempfile::TempDir) {
    cluster_with(n, None).await
}

/// [`cluster`], with `max_loop_passes` set if given.
async fn cluster_with(n: usize, passes: Option<usize>) -> (TestCluster, tempfile::TempDir) {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut cfg = ClusterConfig::new(n, dir.path());
    cfg.https = false;
    let egress = EgressConfig {
        allow_private_addresses: true,
        ..EgressConfig::default()
    };
    cfg.runtime = Arc::new(move |c| {
        let c = c.instance_pool_size(64).egress(egress.clone());
        match passes {
            Some(n) => c.max_loop_passes(n),
            None => c,
        }
    });
    let c = TestCluster::with_config(cfg, None).await.expect("cluster");
    (c, dir)
}

/// `id`'s public origin through node `i`: `http://<id>.localhost:<port>`.
fn public_origin(c: &TestCluster, i: usize, id: &str) -> String {
    format!("http://{id}.localhost:{}", c.node(i).http_addr.port())
}

/// Deploys `source` as `id` with `manifest`'s bindings, allowed to fetch
/// `allowed`.
async fn deploy_js(c: &TestCluster, id: &str, mut m: Manifest, allowed: &[String], source: &str) {
    m.bindings.allowed_hosts = allowed.to_vec();
    c.deploy_manifest(id, m, build_js(source).expect("builds"))
        .await
        .expect("deploy");
}

/// GETs `id`'s public URL through node `i` as a client does (the Host
/// names the Worker with the node's port, so the Worker's `request.url`
/// is its own public URL), with `headers`; the status and body.
async fn get(c: &TestCluster, i: usize, id: &str, headers: &[(&str, &str)]) -> (u16, String) {
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let addr = c.node(i).http_addr;
    let mut req = http::Request::get(format!("http://{addr}/")).header(
        http::header::HOST,
        format!("{id}.localhost:{}", addr.port()),
    );
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let resp = client
        .request(req.body(Full::new(Bytes::new())).expect("request"))
        .await
        .expect("response");
    let status = resp.status().as_u16();
    let body = resp.into_body().collect().await.expect("body").to_bytes();
    (status, String::from_utf8_lossy(&body).into_owned())
}

/// Requests the runtimes of the whole cluster have been handed.
fn invocations(c: &TestCluster) -> u64 {
    (0..c.nodes().len())
        .map(|i| c.stats(i).runtime.requests)
        .sum()
}

/// `hearth_loop_refused_total` summed over the cluster, from `/metrics`.
fn loop_refused(c: &TestCluster) -> u64 {
    (0..c.nodes().len())
        .map(|i| {
            let text = c.node(i).node.metrics().render();
            text.lines()
                .find_map(|l| l.strip_prefix("hearth_loop_refused_total "))
                .and_then(|v| v.trim().parse::<u64>().ok())
                .unwrap_or(0)
        })
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_fetching_its_own_url_is_refused_past_the_bound() {
    let (c, _dir) = cluster(1).await;
    let own = public_origin(&c, 0, "loop");
    deploy_js(&c, "loop", Manifest::from(Plan::Free), &[own], SELF_FETCH).await;
    let started = Instant::now();
    let (status, body) = get(&c, 0, "loop", &[]).await;
    let (n, busy) = (invocations(&c), c.stats(0).runtime.busy);
    eprintln!(
        "self-fetch: {status} after {:?}, {n} invocations, {busy} busy; {body:?}",
        started.elapsed()
    );
    assert_eq!(status, 508, "{body}");
    assert!(
        body.contains("loop detected") && body.contains("at most 8"),
        "{body}"
    );
    // The client's request and 8 passes: the 9th pass never took a slot.
    assert_eq!(n, 9, "invocations for one client request");
    assert_eq!(busy, 0);
    assert_eq!(loop_refused(&c), 1);
}

/// A fan-out multiplies at every pass (3^8 requests at the default bound's
/// last pass), so this runs with `max_loop_passes = 2`: the client's
/// request, 3 first passes and 9 second ones, each 1 + 3 + 9 within the
/// Worker's 16 slots; the 27 third passes are refused at the front door.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fan_out_of_three_through_the_front_door_is_bounded() {
    let (c, _dir) = cluster_with(1, Some(2)).await;
    let own = public_origin(&c, 0, "fan");
    let source = "export default { async fetch(request) {
        const rs = await Promise.all([0, 1, 2].map(() => fetch(request.url)));
        for (const r of rs) await r.arrayBuffer();
        return new Response(rs.map((r) => r.status).join(','));
    } };";
    deploy_js(&c, "fan", Manifest::from(Plan::Free), &[own], source).await;
    let started = Instant::now();
    let (status, body) = get(&c, 0, "fan", &[]).await;
    let (n, busy) = (invocations(&c), c.stats(0).runtime.busy);
    eprintln!(
        "fan-out 3: {status} after {:?}, {n} invocations, {busy} busy, {} refused; {body:?}",
        started.elapsed(),
        loop_refused(&c)
    );
    assert_eq!(status, 200, "{body}");
    assert_eq!(busy, 0, "no request waited for a slot and gave up");
    assert_eq!((n, loop_refused(&c)), (13, 27));
}

/// A local origin that answers every request with the `CDN-Loop` it got.
async fn echo_origin() -> std::net::SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let svc = service_fn(|req: http::Request<hyper::body::Incoming>| async move {
                    let seen: Vec<String> = req
                        .headers()
                        .get_all("cdn-loop")
                        .iter()
                        .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
                        .collect();
                    Ok::<_, std::convert::Infallible>(http::Response::new(Full::new(Bytes::from(
                        seen.join(" | "),
                    ))))
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    addr
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_guest_cannot_drop_or_forge_the_loop_mark() {
    let (c, _dir) = cluster(1).await;
    // What an origin sees: the client's entries, then hearth's, whatever
    // the guest set.
    let origin = echo_origin().await;
    let source = format!(
        "export default {{ fetch() {{
            return fetch('http://{origin}/', {{ headers: {{ 'cdn-loop': 'x, forged' }} }});
        }} }};"
    );
    deploy_js(
        &c,
        "marker",
        Manifest::from(Plan::Free),
        &[format!("http://{origin}")],
        &source,
    )
    .await;
    let (status, seen) = get(&c, 0, "marker", &[("cdn-loop", "edge-cdn; v=1")]).await;
    eprintln!("origin saw CDN-Loop {seen:?}");
    assert_eq!((status, seen.as_str()), (200, "edge-cdn; v=1, hearth"));
    let (_, seen) = get(&c, 0, "marker", &[]).await;
    assert_eq!(seen, "hearth");

    // A self-fetching Worker that resets the header on every pass still
    // loops only up to the bound.
    let own = public_origin(&c, 0, "reset");
    let source = "export default { fetch(request) {
        return fetch(request.url, { headers: { 'cdn-loop': 'x' } });
    } };";
    deploy_js(&c, "reset", Manifest::from(Plan::Free), &[own], source).await;
    let before = invocations(&c);
    let (status, body) = get(&c, 0, "reset", &[]).await;
    let n = invocations(&c) - before;
    eprintln!("reset: {status}, {n} invocations; {body:?}");
    assert_eq!((status, n), (508, 9), "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nested_call_to_another_node_keeps_the_count() {
    let (c, _dir) = cluster(2).await;
    // The entry Worker and the Worker it binds live on different nodes.
    let (entry, callee) = (0..200)
        .map(|k| (format!("entry-{k}"), format!("callee-{k}")))
        .find(|(e, l)| c.home_of(e) == Some(0) && c.home_of(l) == Some(1))
        .expect("names with homes 0 and 1");
    // entry → (service binding, to node 1) → callee → fetch of entry's
    // public URL → entry → …: the callee's request carries the entry's
    // CDN-Loop entries, which its fetch passes on with one more.
    let callee_source = format!(
        "export default {{ fetch() {{ return fetch('{}/'); }} }};",
        public_origin(&c, 0, &entry)
    );
    deploy_js(
        &c,
        &callee,
        Manifest::from(Plan::Free),
        &[public_origin(&c, 0, &entry)],
        &callee_source,
    )
    .await;
    let mut m = Manifest::from(Plan::Free);
    m.bindings.services.insert("next".into(), callee.clone());
    deploy_js(
        &c,
        &entry,
        m,
        &[],
        "export default { fetch() { return fetch('http://next.internal/'); } };",
    )
    .await;
    let (status, body) = get(&c, 0, &entry, &[]).await;
    let (n, nested) = (
        invocations(&c),
        (0..2).map(|i| c.stats(i).runtime.nested_calls).sum::<u64>(),
    );
    let served_on_1 = c.stats(1).runtime.requests;
    eprintln!(
        "nested across nodes: {status}, {n} invocations ({nested} nested, {served_on_1} on node 1); {body:?}"
    );
    assert_eq!(status, 508, "{body}");
    // 9 passes of entry, each with its callee.
    assert_eq!((n, nested), (18, 9));
    assert!(served_on_1 >= 9, "the callee ran on the other node");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tail_worker_fetching_the_worker_it_tails_stops_at_the_bound() {
    let (c, _dir) = cluster(1).await;
    let tailed = public_origin(&c, 0, "tailed");
    deploy_js(
        &c,
        "tailer",
        Manifest::from(Plan::Free),
        std::slice::from_ref(&tailed),
        &format!(
            "export default {{ async fetch() {{
                const r = await fetch('{tailed}/');
                await r.arrayBuffer();
                return new Response('ok');
            }} }};"
        ),
    )
    .await;
    let mut m = Manifest::from(Plan::Free);
    m.bindings.tail = vec!["tailer".into()];
    deploy_js(
        &c,
        "tailed",
        m,
        &[],
        "export default { fetch() { return new Response('hi'); } };",
    )
    .await;
    let (status, _) = get(&c, 0, "tailed", &[]).await;
    assert_eq!(status, 200);
    // Each request of `tailed` invokes `tailer`, whose fetch is another
    // request of `tailed`: a chain with no end but the mark. Wait until it
    // has been still for a second (at most 15 s).
    let started = Instant::now();
    let mut last = (invocations(&c), Instant::now());
    while started.elapsed() < Duration::from_secs(15) && last.1.elapsed() < Duration::from_secs(1) {
        tokio::time::sleep(Duration::from_millis(50)).await;
        let n = invocations(&c);
        if n != last.0 {
            last = (n, Instant::now());
        }
    }
    let n = invocations(&c);
    eprintln!(
        "tail loop: {n} invocations after {:?}, {} refused",
        started.elapsed(),
        loop_refused(&c)
    );
    // `tailed` 9 times (the client's and 8 passes), `tailer` after each.
    assert_eq!(n, 18);
    assert_eq!(loop_refused(&c), 1);
}
