//! hearth's JS engine (crate `hearth-js-engine`, QuickJS in a Wizer
//! snapshot): a Worker module built with [`hearth::testing::build_js`] (what
//! `hearth build` does after bundling) and served by a runtime with the
//! default lifecycle, which reuses its instances; the build's errors for a
//! module that does not start; what a snapshot must not share between
//! instances; and the CPU, memory and wall-clock limits and a caller that
//! leaves ending a request and retiring its instance.

use std::time::Duration;

use http_body_util::BodyExt;

use hearth::testing::{JsBuildError, build_js, js_module_sample};
use hearth_runtime::body;
use hearth_runtime::{Lifecycle, Manifest, Plan, PlanLimits, Runtime, RuntimeConfig};

/// A runtime with a short request CPU limit and a small memory limit (so
/// a loop that never ends, or a heap that grows without end, takes a
/// moment).
fn runtime(dir: &tempfile::TempDir) -> Runtime {
    Runtime::new(
        RuntimeConfig::new(dir.path())
            .artifact_key([7; 32])
            .instance_pool_size(16)
            .request_cpu(Plan::Free, Duration::from_millis(300))
            .memory_limit(Plan::Free, 32 << 20),
    )
    .expect("runtime")
}

/// A runtime whose free plan's wall-clock deadline per request is `wall`
/// (its other limits the plan's own).
fn runtime_with_wall(dir: &tempfile::TempDir, wall: Duration) -> Runtime {
    Runtime::new(
        RuntimeConfig::new(dir.path())
            .artifact_key([7; 32])
            .plan_limits(
                Plan::Free,
                PlanLimits {
                    request_wall: wall,
                    ..PlanLimits::default_for(Plan::Free)
                },
            ),
    )
    .expect("runtime")
}

/// Deploys `component` as `id` with `lifecycle`; returns what was chosen.
async fn deploy(rt: &Runtime, id: &str, lifecycle: Lifecycle, component: Vec<u8>) -> Lifecycle {
    let report = rt
        .deploy(
            id,
            Manifest {
                plan: Plan::Free,
                lifecycle,
                ..Manifest::default()
            },
            component,
        )
        .await
        .expect("deploy");
    report.meta.lifecycle.chosen
}

/// `source` built and deployed as `id` on [`runtime`] with the `auto`
/// lifecycle, which must pick reuse (the runtime's directory is returned
/// to keep it alive).
async fn reused(source: &str, id: &str) -> (tempfile::TempDir, Runtime) {
    let component = build_js(source).expect("builds");
    let dir = tempfile::tempdir().expect("tempdir");
    let rt = runtime(&dir);
    assert_eq!(
        deploy(&rt, id, Lifecycle::Auto, component).await,
        Lifecycle::Reuse
    );
    (dir, rt)
}

/// `source` built and deployed as `id` with the `auto` lifecycle on
/// [`runtime_with_wall`] (the runtime's directory is returned to keep it
/// alive).
async fn with_wall(source: &str, id: &str, wall: Duration) -> (tempfile::TempDir, Runtime) {
    let component = build_js(source).expect("builds");
    let dir = tempfile::tempdir().expect("tempdir");
    let rt = runtime_with_wall(&dir, wall);
    deploy(&rt, id, Lifecycle::Auto, component).await;
    (dir, rt)
}

/// Waits until no invocation is running, so the next request finds the
/// instance that served the last one idle.
async fn settle(rt: &Runtime) {
    for _ in 0..10_000 {
        if rt.stats().in_flight == 0 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    panic!("an invocation never ended: {:?}", rt.stats());
}

/// Sends a request to `id` (a POST when `body` is given) with `headers`,
/// waits until it has ended, and returns the status and the body.
async fn send(
    rt: &Runtime,
    id: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: Option<&str>,
) -> (u16, Vec<u8>) {
    let mut req = match body {
        Some(_) => http::Request::post(format!("http://{id}.localhost{path}")),
        None => http::Request::get(format!("http://{id}.localhost{path}")),
    };
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let req = req
        .body(body::full(body.unwrap_or("").to_string()))
        .expect("request");
    let resp = rt.serve(id, req).await;
    let status = resp.status().as_u16();
    let bytes = resp
        .into_body()
        .collect()
        .await
        .expect("body")
        .to_bytes()
        .to_vec();
    settle(rt).await;
    (status, bytes)
}

/// A request that must answer 200 with JSON.
async fn json(rt: &Runtime, id: &str, path: &str, headers: &[(&str, &str)]) -> serde_json::Value {
    let (status, bytes) = send(rt, id, path, headers, None).await;
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&bytes));
    serde_json::from_slice(&bytes).expect("JSON answer")
}

/// The JSON-echo sample built with the engine, deployed with the default
/// lifecycle: instances are reused, GET and POST answer, and one instance
/// serves every request with the module's counter kept; a request's
/// leftover timers never run in the next, `ctx.waitUntil` work runs after
/// the answer, a throw answers 500 and retires the instance; then the CPU
/// limit ends a request that never finishes and the next one gets a new
/// instance.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_json_echo_sample_is_served_by_one_reused_instance() {
    let source = js_module_sample().expect("the sample's source");
    // `auto` reuses the engine's instances.
    let (_dir, rt) = reused(&source, "echo").await;

    for i in 1..=20u64 {
        let (status, bytes, path, sent) = if i % 2 == 0 {
            let path = format!("/get/{i}?q={i}");
            let (s, b) = send(&rt, "echo", &path, &[("x-test", "t")], None).await;
            (s, b, path, String::new())
        } else {
            let path = format!("/post/{i}");
            let text = format!("body of request {i}: {}", "x".repeat(i as usize));
            let (s, b) = send(&rt, "echo", &path, &[("x-test", "t")], Some(&text)).await;
            (s, b, path, text)
        };
        assert_eq!(
            status,
            200,
            "request {i}: {}",
            String::from_utf8_lossy(&bytes)
        );
        let v: serde_json::Value = serde_json::from_slice(&bytes).expect("JSON");
        assert_eq!(v["method"], if i % 2 == 0 { "GET" } else { "POST" });
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

    // A body that fails part way (a client gone, broken chunks) is answered
    // 400 without running the Worker: its fetch never sees a request cut
    // short as a whole one. The counter does not move; the instance serves
    // on. (The part that arrived is more than the runtime buffers before it
    // takes a slot, 64 KiB, so it is the engine that meets the failure.)
    let arrived = bytes::Bytes::from(vec![b'x'; 70_000]);
    let cut = body::Replay::failed(
        [hyper::body::Frame::data(arrived)],
        "the client went away".into(),
    );
    let req = http::Request::post("http://echo.localhost/cut")
        .header("content-length", "100000")
        .body(cut.boxed())
        .expect("request");
    let resp = rt.serve("echo", req).await;
    let status = resp.status().as_u16();
    let text = resp.into_body().collect().await.expect("body").to_bytes();
    settle(&rt).await;
    assert_eq!(status, 400, "{}", String::from_utf8_lossy(&text));
    assert_eq!(
        json(&rt, "echo", "/", &[]).await["served"],
        21,
        "the Worker ran for the request whose body failed"
    );
    assert_eq!(rt.stats().instances_started, 1);

    // The end-of-request rules (sdk/js/engine/src/request.rs), through the
    // sample's test hooks as the StarlingMonkey shim's tests use them: a
    // 0 ms timer and a promise on a 1 ms timer left behind never run, not
    // even while the next request on the instance waits on a timer.
    let first = json(&rt, "echo", "/", &[("x-js-leave", "timer")]).await;
    assert_eq!(first["leaked"], false);
    tokio::time::sleep(Duration::from_millis(20)).await;
    let second = json(&rt, "echo", "/", &[("x-js-sleep", "20")]).await;
    assert_eq!(
        second["served"].as_u64(),
        first["served"].as_u64().map(|n| n + 1),
        "the same instance"
    );
    assert_eq!(
        second["leaked"], false,
        "a callback of request 1 ran in request 2"
    );
    // ctx.waitUntil work runs after the answer, on the same instance.
    let waited = json(&rt, "echo", "/", &[("x-js-wait-until", "1")]).await;
    assert_eq!(waited["waitedUntil"], 0, "runs after the answer");
    assert_eq!(json(&rt, "echo", "/", &[]).await["waitedUntil"], 1);
    // A throw answers 500 and retires the instance.
    let before = rt.stats();
    let (status, body) = send(&rt, "echo", "/", &[("x-js-throw", "1")], None).await;
    assert_eq!(status, 500, "{}", String::from_utf8_lossy(&body));
    assert_eq!(rt.stats().traps, before.traps + 1);
    assert_eq!(
        json(&rt, "echo", "/", &[]).await["served"],
        1,
        "a new instance"
    );

    // A loop that never ends: the CPU limit stops it, and the next request
    // starts from a new instance.
    let before = rt.stats();
    let (status, _) = send(&rt, "echo", "/", &[("x-js-spin", "1")], None).await;
    assert_ne!(status, 200);
    assert_eq!(rt.stats().cpu_kills, before.cpu_kills + 1);
    assert_eq!(
        json(&rt, "echo", "/", &[]).await["served"],
        1,
        "a new instance"
    );
}

/// A module that does not start is a build error with QuickJS's message:
/// a syntax error (with its line), no default export, a default export
/// without `fetch`, a throw at the top level (with its line).
#[test]
fn a_module_that_does_not_start_is_a_clear_build_error() {
    match build_js("export default {\n  fetch() {\n    return new Response(;\n  },\n};\n") {
        Err(JsBuildError::Syntax { message, line }) => {
            assert!(message.starts_with("SyntaxError"), "{message}");
            assert_eq!(line, Some(3), "{message}");
        }
        other => panic!("not a syntax error: {other:?}"),
    }

    for source in [
        "export function fetch() { return new Response('x'); }\n",
        "export default { hello() { return 1; } };\n",
        "export default 42;\n",
    ] {
        match build_js(source) {
            Err(e @ JsBuildError::NoFetch { .. }) => {
                let text = e.to_string();
                assert!(text.contains("export default { async fetch"), "{text}");
            }
            other => panic!("{source}: not a missing fetch: {other:?}"),
        }
    }

    match build_js("const config = {};\nconfig.port.number = 1;\nexport default { fetch() {} };\n")
    {
        Err(e @ JsBuildError::Throw { .. }) => {
            let text = e.to_string();
            assert!(text.contains("TypeError"), "{text}");
            assert!(text.contains("at line 2"), "{text}");
        }
        other => panic!("not a top-level throw: {other:?}"),
    }
    match build_js("throw 'plain';\nexport default { fetch() {} };\n") {
        Err(JsBuildError::Throw { message, .. }) => assert!(message.contains("plain"), "{message}"),
        other => panic!("not a top-level throw: {other:?}"),
    }
}

/// A Worker for the per-instance checks: its `Math.random()` draws, its
/// request count, and with `x-grow` a heap that grows until the memory
/// limit stops it. Its top level logs (at build time).
const PER_INSTANCE: &str = r#"
console.log('started at build time');
let served = 0;
const held = [];
export default {
  async fetch(request) {
    served += 1;
    if (request.headers.get('x-grow')) {
      for (;;) held.push(new Float64Array(1 << 20));
    }
    const random = [Math.random(), Math.random(), Math.random()];
    return new Response(JSON.stringify({ served, random, now: performance.now() }));
  },
};
"#;

/// Two instances of one component draw different `Math.random()`
/// sequences (the snapshot holds one QuickJS state; each instance reseeds
/// it), and a heap that outgrows the memory limit ends its request and its
/// instance.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn instances_draw_their_own_randoms_and_the_memory_limit_retires_one() {
    let component = build_js(PER_INSTANCE).expect("builds");
    let dir = tempfile::tempdir().expect("tempdir");
    let rt = runtime(&dir);
    // Two scripts of the same bytes: one instance each.
    for id in ["r1", "r2"] {
        assert_eq!(
            deploy(&rt, id, Lifecycle::Auto, component.clone()).await,
            Lifecycle::Reuse
        );
    }
    let a = json(&rt, "r1", "/", &[]).await;
    let b = json(&rt, "r2", "/", &[]).await;
    assert_eq!(
        (a["served"].as_u64(), b["served"].as_u64()),
        (Some(1), Some(1))
    );
    assert_ne!(
        a["random"], b["random"],
        "two instances drew the same sequence"
    );
    for v in a["random"].as_array().expect("draws") {
        let x = v.as_f64().expect("a number");
        assert!((0.0..1.0).contains(&x), "{x}");
    }
    assert!(a["now"].as_f64().is_some_and(|n| n >= 0.0), "{a}");
    // The same instance draws on: not the sequence it started with.
    let a2 = json(&rt, "r1", "/", &[]).await;
    assert_eq!(a2["served"], 2);
    assert_ne!(a2["random"], a["random"]);

    // Past the memory limit: the request fails and its instance is gone.
    let before = rt.stats();
    let (status, body) = send(&rt, "r1", "/", &[("x-grow", "1")], None).await;
    // QuickJS's allocation fails and it throws: an error status, and the
    // instance traps after answering; the host counts the request as
    // stopped at its memory limit and retires the instance.
    assert!(
        status == 500 || status == 503,
        "{status} {}",
        String::from_utf8_lossy(&body)
    );
    let after = rt.stats();
    assert_eq!(after.memory_kills, before.memory_kills + 1, "{after:?}");
    assert_eq!(
        json(&rt, "r1", "/", &[]).await["served"],
        1,
        "a new instance"
    );
}

/// The build is reproducible: the same source makes the same bytes (the
/// build's clocks and randomness are fixed), and a different one does not.
#[test]
fn the_same_source_builds_the_same_bytes() {
    let a = build_js(PER_INSTANCE).expect("builds");
    let b = build_js(PER_INSTANCE).expect("builds");
    assert!(a == b, "two builds of one source differ");
    let c = build_js(&PER_INSTANCE.replace("served += 1", "served += 2")).expect("builds");
    assert!(a != c, "two sources built the same bytes");
}

/// What the module's top level logs is kept by the build and returned,
/// in order (the snapshot cannot hold the stderr stream a write opens),
/// with the rejections it left unhandled.
#[test]
fn the_top_level_s_log_lines_come_back_from_the_build() {
    let built = hearth_js_engine::build_logged(
        "console.log('one', 2);\nconsole.error('two');\nexport default { fetch() { return new Response('x'); } };\n",
    )
    .expect("builds");
    assert_eq!(built.logs, ["one 2", "two"]);
    // A rejection the top level leaves unhandled is a line of the build's
    // log (workerd's console shows it too); one handled later is not.
    let built = hearth_js_engine::build_logged(
        "Promise.reject(new Error('nobody catches this'));\n\
         const later = Promise.reject(new Error('caught'));\n\
         later.catch(() => {});\n\
         export default { fetch() { return new Response('x'); } };\n",
    )
    .expect("builds");
    assert_eq!(built.logs.len(), 1, "{:?}", built.logs);
    assert!(
        built.logs[0].starts_with("Uncaught (in promise) Error: nobody catches this"),
        "{:?}",
        built.logs
    );
    let built = hearth_js_engine::build_logged(PER_INSTANCE).expect("builds");
    assert_eq!(built.logs, ["started at build time"]);
}

/// Secure randomness at a module's top level comes from the OS, not the
/// build's seed: a key made there differs from build to build.
#[test]
fn a_top_level_secure_random_differs_between_builds() {
    let source = "const key = crypto.randomUUID();\nexport default { fetch() { return new Response(key); } };\n";
    let a = build_js(source).expect("builds");
    let b = build_js(source).expect("builds");
    assert!(a != b, "two builds made the same top-level key");
}

/// The wall-clock deadline ends a JS request that waits past it (a timer),
/// and a request whose caller goes away is cancelled: either way the
/// instance is discarded, so the next request starts on a new one (the
/// module's counter starts again) and nothing the ended request left (its
/// timers, the promises waiting on them) runs there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_wall_deadline_and_a_caller_that_leaves_end_a_request_and_its_instance() {
    let source = js_module_sample().expect("the sample's source");
    let (_dir, rt) = with_wall(&source, "echo", Duration::from_millis(500)).await;
    assert_eq!(json(&rt, "echo", "/", &[]).await["served"], 1);

    // A 10 s timer, and timers left behind: the 500 ms deadline ends it.
    let before = rt.stats();
    let (status, _) = send(
        &rt,
        "echo",
        "/",
        &[("x-js-leave", "timer"), ("x-js-sleep", "10000")],
        None,
    )
    .await;
    assert_ne!(status, 200);
    assert_eq!(rt.stats().wall_kills, before.wall_kills + 1);
    let next = json(&rt, "echo", "/", &[]).await;
    assert_eq!(next["served"], 1, "a new instance: {next}");
    assert_eq!(next["leaked"], false, "{next}");

    // The caller leaves while the Worker waits on a timer it made.
    let before = rt.stats();
    let req = http::Request::get("http://echo.localhost/")
        .header("x-js-leave", "timer")
        .header("x-js-sleep", "300")
        .body(body::full(String::new()))
        .expect("request");
    assert!(
        tokio::time::timeout(Duration::from_millis(100), rt.serve("echo", req))
            .await
            .is_err(),
        "the request answered before its timer"
    );
    settle(&rt).await;
    assert_eq!(rt.stats().cancelled, before.cancelled + 1);
    // Past the abandoned request's timers.
    tokio::time::sleep(Duration::from_millis(400)).await;
    let next = json(&rt, "echo", "/", &[]).await;
    assert_eq!(next["served"], 1, "a new instance: {next}");
    assert_eq!(next["leaked"], false, "{next}");
}

/// A module's top level runs at build time, under the build's own limits:
/// a loop that never ends is cut at the build's timeout and a heap that
/// grows without end at its memory cap, each a build error that says so;
/// the same builder then builds a good module.
#[test]
fn a_runaway_top_level_is_cut_at_the_build_s_limits() {
    let timeout = Duration::from_millis(300);
    let builder = hearth_js_engine::Builder::new(hearth_js_engine::Config {
        timeout,
        max_memory: 64 << 20,
    })
    .expect("the engine compiles");
    let fetch = "export default { async fetch() { return new Response('ok'); } };";
    match builder.build(&format!("for (;;) {{}}\n{fetch}")) {
        Err(JsBuildError::Timeout(t)) => assert_eq!(t, timeout),
        other => panic!("not a timeout: {other:?}"),
    }
    match builder.build(&format!(
        "const held = [];\nfor (;;) held.push(new Float64Array(1 << 20));\n{fetch}"
    )) {
        Err(e) => assert!(e.to_string().contains("memory"), "{e}"),
        Ok(_) => panic!("a heap without end built"),
    }
    let source = js_module_sample().expect("the sample's source");
    builder.build(&source).expect("a good module still builds");
}

/// A Worker whose Response body is a `ReadableStream`: `/events` enqueues
/// an event every 20 ms from a timer, three in all; `/forever` one every
/// 10 ms without end; `/strings` enqueues a
/// string (not bytes); `/breaks` errors the stream after one chunk; anything
/// else answers how many requests this instance served.
const STREAMS: &str = r#"
let served = 0;
export default {
  async fetch(request) {
    served += 1;
    const path = new URL(request.url).pathname;
    const enc = new TextEncoder();
    if (path === '/events') {
      let n = 0;
      const body = new ReadableStream({
        start(c) {
          const id = setInterval(() => {
            n += 1;
            c.enqueue(enc.encode(`data: ${n}\n\n`));
            if (n === 3) { clearInterval(id); c.close(); }
          }, 20);
        },
      });
      return new Response(body, { headers: { 'content-type': 'text/event-stream', 'content-length': '999' } });
    }
    if (path === '/forever') {
      return new Response(new ReadableStream({
        start(c) { setInterval(() => c.enqueue(enc.encode('tick\n')), 10); },
      }));
    }
    if (path === '/strings') {
      return new Response(new ReadableStream({ start(c) { c.enqueue('text'); c.close(); } }));
    }
    if (path === '/breaks') {
      return new Response(new ReadableStream({
        start(c) {
          c.enqueue(enc.encode('first'));
          setTimeout(() => c.error(new Error('the stream broke')), 10);
        },
      }));
    }
    return new Response(String(served));
  },
};
"#;

/// A body made by a stream reaches the client chunk by chunk as the event
/// loop makes it (each event its own frame, the first before the stream has
/// ended), with no `content-length` (not even the Worker's own); the
/// instance serves on. A stream that yields a string or errors cuts the
/// answer short after its status, and retires the instance.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streamed_body_is_sent_as_the_worker_makes_it() {
    let (_dir, rt) = reused(STREAMS, "streams").await;

    let req = http::Request::get("http://streams.localhost/events")
        .body(body::empty())
        .expect("request");
    let resp = rt.serve("streams", req).await;
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["content-type"], "text/event-stream");
    assert!(resp.headers().get("content-length").is_none());
    let mut body = resp.into_body();
    let mut frames = Vec::new();
    while let Some(frame) = body.frame().await {
        if let Ok(data) = frame.expect("a frame").into_data() {
            frames.push(String::from_utf8_lossy(&data).into_owned());
        }
    }
    // The first event is sent alone, 40 ms before the stream ends.
    assert_eq!(frames.first().map(String::as_str), Some("data: 1\n\n"));
    assert_eq!(frames.concat(), "data: 1\n\ndata: 2\n\ndata: 3\n\n");
    settle(&rt).await;
    let (_, served) = send(&rt, "streams", "/", &[], None).await;
    assert_eq!(served, b"2", "the same instance serves on");

    for path in ["/strings", "/breaks"] {
        let before = rt.stats();
        let req = http::Request::get(format!("http://streams.localhost{path}"))
            .body(body::empty())
            .expect("request");
        let resp = rt.serve("streams", req).await;
        assert_eq!(resp.status(), 200, "{path}: the status went first");
        assert!(
            resp.into_body().collect().await.is_err(),
            "{path}: the answer is cut short"
        );
        settle(&rt).await;
        // The guest traps after cutting the answer; the host may see the
        // body end first and cancel the invocation: either discards it.
        let s = rt.stats();
        assert!(
            s.traps + s.cancelled > before.traps + before.cancelled,
            "{path} ends its instance: {s:?}"
        );
        let (_, served) = send(&rt, "streams", "/", &[], None).await;
        assert_eq!(served, b"1", "{path}: a new instance serves the next");
    }
}

/// A stream that never ends is cut at the request's wall-clock deadline
/// like any request: the answer already sent ends short, the instance is
/// discarded, and the next request gets a new one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_without_end_is_cut_at_the_wall_deadline() {
    let (_dir, rt) = with_wall(STREAMS, "streams", Duration::from_millis(500)).await;
    let before = rt.stats();
    let req = http::Request::get("http://streams.localhost/forever")
        .body(body::empty())
        .expect("request");
    let resp = rt.serve("streams", req).await;
    assert_eq!(resp.status(), 200);
    let mut body = resp.into_body();
    let mut ticks = 0;
    let ended = tokio::time::timeout(Duration::from_secs(20), async {
        while let Some(frame) = body.frame().await {
            match frame {
                Ok(f) => ticks += f.data_ref().map_or(0, |d| d.len()),
                Err(_) => return,
            }
        }
    })
    .await;
    assert!(ended.is_ok(), "the stream outlived the wall deadline");
    assert!(ticks > 0, "some ticks arrived before the cut");
    settle(&rt).await;
    assert_eq!(
        rt.stats().wall_kills,
        before.wall_kills + 1,
        "{:?}",
        rt.stats()
    );
    let (status, served) = send(&rt, "streams", "/", &[], None).await;
    assert_eq!((status, &served[..]), (200, &b"1"[..]), "a new instance");
}

/// Answers by path: `/big-header` a header over the host's 16 KiB header
/// limit, `/body?n=N` N bytes of `x` (either side of the 8 KiB a response
/// goes in one host call with), anything else how many requests this
/// instance served.
const ANSWERS: &str = r#"
let served = 0;
export default {
  fetch(request) {
    served += 1;
    const url = new URL(request.url);
    if (url.pathname === '/big-header') {
      return new Response('x', { headers: { 'x-big': 'a'.repeat(20000) } });
    }
    if (url.pathname === '/body') {
      const r = new Response('x'.repeat(Number(url.searchParams.get('n'))));
      r.headers.set('x-set-late', 'yes');
      return r;
    }
    return new Response(String(served));
  },
};
"#;

/// A response the host refuses (a header past its limit) answers the
/// client 500 and retires the instance, as a throw does; the Worker stays
/// on reused instances (it is not mistaken for one that never answers).
/// Bodies either side of the one-call limit arrive whole, with their
/// headers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_response_the_host_refuses_is_a_500_and_retires_only_its_instance() {
    let (_dir, rt) = reused(ANSWERS, "answers").await;
    assert_eq!(
        send(&rt, "answers", "/", &[], None).await,
        (200, b"1".to_vec())
    );
    let before = rt.stats();
    let (status, _) = send(&rt, "answers", "/big-header", &[], None).await;
    assert_eq!(status, 500, "a refused response is an error for the client");
    let after = rt.stats();
    assert!(
        after.traps > before.traps,
        "its instance is retired: {after:?}"
    );
    assert_eq!(after.reuse_demotions, before.reuse_demotions, "{after:?}");
    assert_eq!(
        send(&rt, "answers", "/", &[], None).await,
        (200, b"1".to_vec()),
        "a new instance serves the next request"
    );
    assert_eq!(
        send(&rt, "answers", "/", &[], None).await,
        (200, b"2".to_vec()),
        "and is reused"
    );
    for n in [0, 8192, 8193, 100_000] {
        let req = http::Request::get(format!("http://answers.localhost/body?n={n}"))
            .body(body::empty())
            .expect("request");
        let resp = rt.serve("answers", req).await;
        assert_eq!(resp.status(), 200, "{n} bytes");
        assert_eq!(resp.headers()["x-set-late"], "yes", "{n} bytes");
        assert_eq!(resp.headers()["content-length"], n.to_string().as_str());
        let bytes = resp.into_body().collect().await.expect("body").to_bytes();
        assert_eq!(bytes.len(), n, "{n} bytes arrive whole");
        assert!(bytes.iter().all(|b| *b == b'x'));
        settle(&rt).await;
    }
}

/// Each request leaves ≈ 1 MB of garbage in reference cycles, which only
/// QuickJS's cycle collector frees (reference counts never reach zero).
const CYCLES: &str = r#"
let served = 0;
export default {
  fetch() {
    served += 1;
    for (let i = 0; i < 2000; i++) {
      const a = { pad: 'x'.repeat(500) + i };
      const b = { a };
      a.b = b;
    }
    return new Response(String(served));
  },
};
"#;

/// The engine lets its cycle collector run less often than QuickJS alone
/// would (a slack of heap between runs), but it still runs: 100 requests
/// leaving ≈ 100 MB of cyclic garbage in all are served by one instance
/// under a 32 MiB memory limit, none retired.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_in_cycles_is_collected_on_a_reused_instance() {
    let (_dir, rt) = reused(CYCLES, "cycles").await;
    for n in 1..=100u32 {
        let (status, body) = send(&rt, "cycles", "/", &[], None).await;
        assert_eq!(
            (status, String::from_utf8_lossy(&body).into_owned()),
            (200, n.to_string()),
            "request {n} on the same instance: {:?}",
            rt.stats()
        );
    }
    let s = rt.stats();
    assert_eq!((s.traps, s.memory_retirements), (0, 0), "{s:?}");
}
