//! A JS Worker in the Workers module syntax (`js-module`: componentize-js
//! behind `sdk/js/shim.js`, which exports
//! wasi:http/incoming-handler itself) served with `lifecycle = "reuse"`:
//! one instance answers request after request, module state persists, and
//! nothing of a finished request runs in the next one; an error, a trap or
//! a CPU overrun retires the instance.

use std::time::Duration;

use http_body_util::BodyExt;

use hearth_runtime::body::{self, Body};
use hearth_runtime::{Lifecycle, Manifest, Plan, Runtime, RuntimeConfig};

const ID: &str = "jsm";

async fn reuse_runtime(dir: &tempfile::TempDir) -> Runtime {
    let rt = Runtime::new(
        RuntimeConfig::new(dir.path())
            .artifact_key([7; 32])
            .instance_pool_size(16)
            // Short, so the test of a loop that never ends takes a moment.
            .request_cpu(Plan::Paid, Duration::from_millis(300)),
    )
    .expect("runtime");
    let report = rt
        .deploy(
            ID,
            Manifest {
                plan: Plan::Paid,
                lifecycle: Lifecycle::Reuse,
                ..Manifest::default()
            },
            hearth_sample_workers::bytes("js-module").expect("js-module is built"),
        )
        .await
        .expect("deploy");
    assert_eq!(report.meta.lifecycle.chosen, Lifecycle::Reuse);
    rt
}

/// Waits until no invocation is running: the instance that served the last
/// request has finished its call (after the response: `waitUntil` work and
/// the end-of-request cleanup) and is idle again, so the next request
/// finds it rather than starting another.
async fn settle(rt: &Runtime) {
    for _ in 0..10_000 {
        if rt.stats().in_flight == 0 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    panic!("an invocation never ended: {:?}", rt.stats());
}

/// Sends one request with `headers` (and `body`, as a POST), waits until
/// its invocation has ended, and returns the status and the body.
async fn send(
    rt: &Runtime,
    path: &str,
    headers: &[(&str, &str)],
    body: Option<&str>,
) -> (u16, Vec<u8>) {
    let mut req = match body {
        Some(_) => http::Request::post(format!("http://{ID}.localhost{path}")),
        None => http::Request::get(format!("http://{ID}.localhost{path}")),
    };
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let req = req
        .body(body::full(body.unwrap_or("").to_string()))
        .expect("request");
    let (status, _, bytes) = exchange(rt, req).await;
    (status, bytes)
}

/// Serves `req`, waits until its invocation has ended, and returns the
/// whole response.
async fn exchange(rt: &Runtime, req: http::Request<Body>) -> (u16, http::HeaderMap, Vec<u8>) {
    let resp = rt.serve(ID, req).await;
    let status = resp.status().as_u16();
    let head = resp.headers().clone();
    let bytes = resp
        .into_body()
        .collect()
        .await
        .expect("body")
        .to_bytes()
        .to_vec();
    settle(rt).await;
    (status, head, bytes)
}

/// A request that must answer 200 with JSON; returns the JSON.
async fn json(rt: &Runtime, path: &str, headers: &[(&str, &str)]) -> serde_json::Value {
    let (status, bytes) = send(rt, path, headers, None).await;
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&bytes));
    serde_json::from_slice(&bytes).expect("JSON answer")
}

/// One runtime and one deploy for every check (compiling the 12 MB
/// component is the slow part), in an order where each check starts from
/// what the one before left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_module_syntax_js_worker_is_reused_and_requests_stay_apart() {
    let dir = tempfile::tempdir().expect("tempdir");
    let rt = reuse_runtime(&dir).await;
    one_instance_serves_many_requests_and_keeps_module_state(&rt).await;
    a_request_body_arrives_whole_with_or_without_a_declared_length(&rt).await;
    a_finished_request_s_timers_and_promises_never_run_in_the_next(&rt).await;
    wait_until_work_finishes_after_the_response_on_the_same_instance(&rt).await;
    an_error_or_a_cpu_overrun_retires_the_instance(&rt).await;
    // Last: some of their requests fail on purpose and retire instances.
    the_request_head_reaches_the_worker_as_sent(&rt).await;
    the_worker_s_status_headers_and_bytes_reach_the_client(&rt).await;
}

/// Sends a GET with `headers` (raw values), waits until its invocation has
/// ended, and returns the whole response.
async fn send_raw(
    rt: &Runtime,
    path: &str,
    headers: &[(&str, &[u8])],
) -> (u16, http::HeaderMap, Vec<u8>) {
    let mut req = http::Request::get(format!("http://{ID}.localhost{path}"));
    for (k, v) in headers {
        req = req.header(*k, http::HeaderValue::from_bytes(v).expect("header value"));
    }
    exchange(rt, req.body(body::full(String::new())).expect("request")).await
}

/// What the Worker sees of a request: method, path and query, and every
/// header, repeated names joined as `Headers` joins them, a UTF-8 value
/// decoded, a value that is not UTF-8 with U+FFFD for each bad byte.
async fn the_request_head_reaches_the_worker_as_sent(rt: &Runtime) {
    let (status, _, bytes) = send_raw(
        rt,
        "/a/b%20c?x=1&y=%C3%A9",
        &[
            ("x-one", b"1"),
            ("x-rep", b"a"),
            ("x-rep", b"b"),
            ("x-utf8", "café ünï".as_bytes()),
            ("x-empty", b""),
            ("x-colon", b"a: b\tc"),
        ],
    )
    .await;
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&bytes));
    let v: serde_json::Value = serde_json::from_slice(&bytes).expect("JSON");
    assert_eq!(v["method"], "GET");
    assert_eq!(v["path"], "/a/b%20c?x=1&y=%C3%A9");
    let h = &v["headers"];
    assert_eq!(h["x-one"], "1");
    assert_eq!(h["x-rep"], "a, b");
    assert_eq!(h["x-utf8"], "café ünï");
    assert_eq!(h["x-empty"], "");
    assert_eq!(h["x-colon"], "a: b\tc");
    // wasi:http keeps `host` from guests (the URL carries the authority).
    assert_eq!(h["host"], serde_json::Value::Null);

    // Not UTF-8: decoded with U+FFFD, which a `Headers` refuses, so the
    // shim answers 500 (and retires the instance).
    let (status, _, _) = send_raw(rt, "/", &[("x-latin1", b"caf\xe9")]).await;
    assert_eq!(status, 500);
}

/// The Worker's `Response` as the client gets it: its status, every
/// header (a repeated name's values joined, a non-ASCII value as UTF-8), and its
/// body byte for byte, small or larger than one outgoing-body buffer; an
/// invalid header is refused in the Worker (500), and a header only the
/// host may set never reaches the client.
async fn the_worker_s_status_headers_and_bytes_reach_the_client(rt: &Runtime) {
    let all: Vec<u8> = (0..=255).collect();
    let spec = serde_json::json!({
        "status": 201,
        "headers": [["x-a", "1"], ["x-a", "2"], ["x-b", "café"], ["content-type", "application/octet-stream"]],
        "bytes": all,
    });
    let (status, head, bytes) =
        send_raw(rt, "/", &[("x-js-respond", spec.to_string().as_bytes())]).await;
    assert_eq!(status, 201, "{}", String::from_utf8_lossy(&bytes));
    assert_eq!(bytes, all);
    // A `Headers` joins a repeated name's values.
    assert_eq!(head["x-a"], "1, 2");
    assert_eq!(head["x-b"].as_bytes(), "café".as_bytes());
    assert_eq!(head["content-type"], "application/octet-stream");

    // 404 with an empty body; 20,000 bytes (several outgoing chunks).
    for (code, unit, repeat) in [(404, vec![], 1), (200, vec![7u8, 0, 200], 20_000)] {
        let spec = serde_json::json!({"status": code, "bytes": unit, "repeat": repeat});
        let (status, _, bytes) =
            send_raw(rt, "/", &[("x-js-respond", spec.to_string().as_bytes())]).await;
        assert_eq!(status, code);
        assert_eq!(bytes, unit.repeat(repeat));
    }

    // Hop-by-hop headers and those wasi:http forbids are the host's: never
    // sent from the Worker's response.
    for forbidden in ["connection", "proxy-authorization", "http2-settings"] {
        let spec = serde_json::json!({"headers": [[forbidden, "x"], ["x-ok", "1"]], "bytes": [1]});
        let (status, head, bytes) =
            send_raw(rt, "/", &[("x-js-respond", spec.to_string().as_bytes())]).await;
        assert_eq!((status, bytes), (200, vec![1]), "{forbidden}");
        assert_eq!(head["x-ok"], "1");
        assert!(head.get(forbidden).is_none(), "{forbidden} was sent");
    }
    // An invalid name or value: the Worker's `Response` throws, 500.
    for bad in [["bad name", "x"], ["x-bad", "a\u{0}b"]] {
        let spec = serde_json::json!({"headers": [bad], "bytes": [1]});
        let (status, _, bytes) =
            send_raw(rt, "/", &[("x-js-respond", spec.to_string().as_bytes())]).await;
        assert_eq!(status, 500, "{bad:?}");
        assert_eq!(bytes, b"Internal Server Error");
    }
}

async fn one_instance_serves_many_requests_and_keeps_module_state(rt: &Runtime) {
    for i in 1..=100u64 {
        let (status, bytes, path, sent) = if i % 2 == 0 {
            let path = format!("/get/{i}?q={i}");
            let (s, b) = send(rt, &path, &[("x-test", "t")], None).await;
            (s, b, path, String::new())
        } else {
            let path = format!("/post/{i}");
            let text = format!("body of request {i}: {}", "x".repeat(i as usize));
            let (s, b) = send(rt, &path, &[("x-test", "t")], Some(&text)).await;
            (s, b, path, text)
        };
        assert_eq!(
            status,
            200,
            "request {i}: {}",
            String::from_utf8_lossy(&bytes)
        );
        let v: serde_json::Value = serde_json::from_slice(&bytes).expect("JSON");
        assert_eq!(v["path"], path, "request {i}");
        assert_eq!(v["body"], sent, "request {i}");
        assert_eq!(v["bodyLength"], sent.len(), "request {i}");
        assert_eq!(v["headers"]["x-test"], "t", "request {i}");
        // The module-level counter: the same instance, its globals kept.
        assert_eq!(v["served"], i, "request {i}");
    }
    let s = rt.stats();
    assert_eq!(s.instances_started, 1, "{s:?}");
    assert_eq!((s.traps, s.reuse_demotions), (0, 0), "{s:?}");
}

/// A body sent in several pieces (larger than one 64 KiB read of the
/// shim) reaches the Worker whole, byte for byte: with a `content-length`
/// (the shim stops reading once that many bytes arrived) and without one
/// (it reads until the stream ends).
async fn a_request_body_arrives_whole_with_or_without_a_declared_length(rt: &Runtime) {
    let pieces: Vec<String> = (0..5)
        .map(|i| format!("{i}").repeat(30_000 + i * 1_000))
        .collect();
    let whole = pieces.concat();
    for declared in [true, false] {
        let frames = pieces
            .clone()
            .into_iter()
            .map(|p| Ok::<_, body::BoxError>(http_body::Frame::data(bytes::Bytes::from(p))));
        let mut req = http::Request::post(format!("http://{ID}.localhost/upload"));
        if declared {
            req = req.header("content-length", whole.len());
        }
        let req = req
            .body(body::boxed(http_body_util::StreamBody::new(
                futures::stream::iter(frames),
            )))
            .expect("request");
        let resp = rt.serve(ID, req).await;
        assert_eq!(resp.status(), 200, "declared length: {declared}");
        let bytes = resp.into_body().collect().await.expect("body").to_bytes();
        settle(rt).await;
        let v: serde_json::Value = serde_json::from_slice(&bytes).expect("JSON");
        assert_eq!(v["bodyLength"], whole.len(), "declared length: {declared}");
        assert!(
            v["body"] == whole.as_str(),
            "declared length: {declared}: the body differs"
        );
    }
}

async fn a_finished_request_s_timers_and_promises_never_run_in_the_next(rt: &Runtime) {
    // Leaves a 0 ms timer and a promise chain on a 1 ms timer behind.
    let first = json(rt, "/", &[("x-js-leave", "timer")]).await;
    assert_eq!(first["leaked"], false);
    tokio::time::sleep(Duration::from_millis(20)).await;
    // This one waits on a timer of its own, so the event loop runs every
    // due timer while it waits: the first request's must be gone.
    let second = json(rt, "/", &[("x-js-sleep", "20")]).await;
    assert_eq!(
        second["served"].as_u64(),
        first["served"].as_u64().map(|n| n + 1),
        "the same instance"
    );
    assert_eq!(
        second["leaked"], false,
        "a callback of request 1 ran in request 2"
    );
    let third = json(rt, "/", &[("x-js-sleep", "5")]).await;
    assert_eq!(third["leaked"], false);
}

async fn wait_until_work_finishes_after_the_response_on_the_same_instance(rt: &Runtime) {
    let first = json(rt, "/", &[("x-js-wait-until", "1")]).await;
    assert_eq!(first["waitedUntil"], 0, "runs after the answer");
    let second = json(rt, "/", &[]).await;
    assert_eq!(second["waitedUntil"], 1);
}

async fn an_error_or_a_cpu_overrun_retires_the_instance(rt: &Runtime) {
    let before = rt.stats();
    assert!(json(rt, "/", &[]).await["served"].as_u64() > Some(1));

    // A thrown error: 500, and the instance is not used again.
    let (status, body) = send(rt, "/", &[("x-js-throw", "1")], None).await;
    assert_eq!(status, 500, "{}", String::from_utf8_lossy(&body));
    assert_eq!(rt.stats().traps, before.traps + 1);
    assert_eq!(json(rt, "/", &[]).await["served"], 1, "a new instance");

    // A loop that never ends: the CPU limit stops it, and again the next
    // request starts from a new instance.
    let (status, _) = send(rt, "/", &[("x-js-spin", "1")], None).await;
    assert_ne!(status, 200);
    assert_eq!(rt.stats().cpu_kills, before.cpu_kills + 1);
    assert_eq!(json(rt, "/", &[]).await["served"], 1, "a new instance");
    assert_eq!(rt.stats().instances_started, before.instances_started + 2);
}
