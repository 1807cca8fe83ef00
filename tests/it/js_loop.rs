//! The JS engine's request lifecycle on a real `hearth serve`: its event
//! loop, timers, the global `fetch`, `env`, `ctx` and the end-of-request
//! rules (`sdk/js/engine/src/request.rs`, `event_loop.rs`, `timers.rs`,
//! `fetch.rs`, `env.rs`).
//!
//! The engine's test Worker (`sdk/js/engine/tests/loop.js`, one route per
//! behaviour) is built once and deployed four times: as `loop`, with a
//! var, a service binding (`auth`, to itself as `auth-w`), a dispatch
//! namespace (`users`, holding itself as `user-a`) and an egress allow-list
//! naming an origin this file starts on 127.0.0.1 (and a port nobody
//! listens on); as `auth-w` and `user-a`, the Workers bound to it; and as
//! `fail`, which only ever serves requests one at a time, so that its
//! `served` count says whether an instance was kept or retired. One node
//! serves them all. (js_engine.rs holds the JSON-echo sample to the same
//! end-of-request rules through its test hooks.)

use std::collections::HashSet;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use hearth::testing::{NodeProcess, build_js};

use crate::{free_port, hearth};

const TOKEN: &str = "js-loop-test-admin-token-0123456789";

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// `source` (one ES module, no imports) built into a Worker component with
/// the engine, written to `dir/name.wasm`.
fn component(source: &str, dir: &Path, name: &str) -> String {
    let wasm = build_js(source).unwrap_or_else(|e| panic!("{name} builds: {e}"));
    let path = dir.join(format!("{name}.wasm"));
    std::fs::write(&path, wasm).expect("write the component");
    path.to_string_lossy().into_owned()
}

/// What the origin has been asked, and the gate `/gate` waits on.
#[derive(Default)]
struct Seen {
    /// Request lines (`GET /x HTTP/1.1`), in arrival order.
    lines: Vec<String>,
    /// Whether `/gate` may answer.
    open: bool,
    /// Whether `/drip` may send the rest of its body.
    drip: bool,
}

/// An HTTP origin on 127.0.0.1, a thread per connection:
/// `GET /big` answers 3 MiB (byte i is i % 253); `GET /redirect` answers
/// 302 to `/moved?from=redirect`; `GET /gate` and `GET
/// /hold` answer once the test opens the gate; anything else answers `METHOD PATH
/// x-test=VALUE` with `x-origin: origin`. Every request line is recorded.
struct Origin {
    url: String,
    seen: Arc<(Mutex<Seen>, Condvar)>,
}

impl Origin {
    fn start() -> Origin {
        let listener = TcpListener::bind("127.0.0.1:0").expect("origin");
        let url = format!("http://{}", listener.local_addr().expect("addr"));
        let seen = Arc::new((Mutex::new(Seen::default()), Condvar::new()));
        let shared = seen.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let seen = shared.clone();
                std::thread::spawn(move || Origin::answer(stream, &seen));
            }
        });
        Origin { url, seen }
    }

    fn answer(stream: std::net::TcpStream, seen: &(Mutex<Seen>, Condvar)) {
        let mut reader = BufReader::new(stream);
        let mut head = Vec::new();
        let mut line = String::new();
        while reader.read_line(&mut line).is_ok_and(|n| n > 2) {
            head.push(line.trim_end().to_string());
            line.clear();
        }
        let first = head.first().cloned().unwrap_or_default();
        let (lock, ready) = seen;
        lock.lock().expect("origin lock").lines.push(first.clone());
        ready.notify_all();
        let path = first.split_whitespace().nth(1).unwrap_or("/");
        if path == "/drip" {
            // A first piece at once, the rest when the test lets it.
            let stream = reader.get_mut();
            let _ = write!(
                stream,
                "HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\nx-origin: origin\r\n\
                 connection: close\r\n\r\nfirst piece\n"
            );
            let _ = stream.flush();
            let mut s = lock.lock().expect("origin lock");
            while !s.drip {
                s = ready.wait(s).expect("origin lock");
            }
            drop(s);
            let _ = reader.get_mut().write_all(b"second piece\n");
            return;
        }
        if path == "/redirect" {
            let _ = write!(
                reader.get_mut(),
                "HTTP/1.1 302 Found\r\nlocation: /moved?from=redirect\r\n\
                 content-length: 0\r\nconnection: close\r\n\r\n"
            );
            return;
        }
        let body: Vec<u8> = if path == "/big" {
            (0..3 << 20).map(|i: u32| (i % 253) as u8).collect()
        } else {
            if path == "/gate" || path == "/hold" {
                let mut s = lock.lock().expect("origin lock");
                while !s.open {
                    s = ready.wait(s).expect("origin lock");
                }
            }
            let test = head
                .iter()
                .find_map(|h| h.strip_prefix("x-test: "))
                .unwrap_or("-");
            let method = first.split_whitespace().next().unwrap_or("");
            format!("{method} {path} x-test={test}").into_bytes()
        };
        let stream = reader.get_mut();
        let _ = write!(
            stream,
            "HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\nx-origin: origin\r\n\
             content-length: {}\r\nconnection: close\r\n\r\n",
            body.len()
        );
        let _ = stream.write_all(&body);
    }

    /// Lets `/drip` send the rest of its body.
    fn release_drip(&self) {
        let (lock, ready) = &*self.seen;
        lock.lock().expect("origin lock").drip = true;
        ready.notify_all();
    }

    /// Lets `/gate` answer.
    fn open_gate(&self) {
        let (lock, ready) = &*self.seen;
        lock.lock().expect("origin lock").open = true;
        ready.notify_all();
    }

    /// Whether a request line starting with `prefix` arrived within 20 s.
    fn saw(&self, prefix: &str) -> bool {
        let (lock, ready) = &*self.seen;
        let deadline = Instant::now() + Duration::from_secs(20);
        let mut s = lock.lock().expect("origin lock");
        loop {
            if s.lines.iter().any(|l| l.starts_with(prefix)) {
                return true;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            s = ready.wait_timeout(s, left).expect("origin lock").0;
        }
    }
}

/// `hearth deploy --store STORE --name NAME --plan paid EXTRA… WASM`; it
/// must succeed.
fn deploy(store: &Path, name: &str, extra: &[&str], wasm: &str) {
    let mut all = vec!["--plan", "paid"];
    all.extend_from_slice(extra);
    hearth()
        .deploy(store, name, Path::new(wasm), &all)
        .unwrap_or_else(|e| panic!("{e}"));
}

/// `GET path` on Worker `script`: status and body.
fn get(node: &NodeProcess, script: &str, path: &str) -> (u16, Vec<u8>) {
    let resp = node
        .get(&format!("{script}.localhost"), path)
        .unwrap_or_else(|e| panic!("{script} {path}: {e}; log: {}", node.log()));
    (resp.status, resp.body.to_vec())
}

/// `GET path` on `script`, answered 200 with JSON: the JSON.
fn json(node: &NodeProcess, script: &str, path: &str) -> serde_json::Value {
    let (status, body) = get(node, script, path);
    let text = String::from_utf8_lossy(&body);
    assert_eq!(status, 200, "{script} {path}: {text}; log: {}", node.log());
    serde_json::from_slice(&body).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"))
}

/// Where `entry` is in `log`; it must be there once.
fn at(log: &[String], entry: &str) -> usize {
    let found: Vec<usize> = (0..log.len()).filter(|&i| log[i] == entry).collect();
    assert_eq!(found.len(), 1, "{entry} once in {log:?}");
    found[0]
}

#[test]
fn js_workers_run_timers_fetch_env_and_ctx_on_the_engine_s_event_loop() {
    let dir = tempfile::tempdir().expect("tempdir");
    let origin = Origin::start();
    // Allowed, but nobody listens there.
    let closed = format!("http://127.0.0.1:{}", free_port());
    // Not allowed.
    let denied = format!("http://127.0.0.1:{}", free_port());

    let test = std::fs::read_to_string(repo().join("sdk/js/engine/tests/loop.js"))
        .expect("the engine's test Worker");
    let test = component(&test, dir.path(), "loop");

    // Deployed into the store before the node starts, as js_build does.
    let store = dir.path().join("store");
    deploy(&store, "auth-w", &["--lifecycle", "reuse"], &test);
    deploy(
        &store,
        "user-a",
        &["--dispatch-only", "--lifecycle", "reuse"],
        &test,
    );
    deploy(
        &store,
        "fail",
        &["--lifecycle", "reuse", "--allow-host", &origin.url],
        &test,
    );
    deploy(
        &store,
        "loop",
        &[
            "--lifecycle",
            "reuse",
            "--var",
            "FOO=bar",
            "--service",
            "auth=auth-w",
            "--dispatch",
            "users=user-a",
            "--allow-host",
            &origin.url,
            "--allow-host",
            &closed,
        ],
        &test,
    );
    // The origin is on loopback, which egress refuses unless allowed.
    let node = NodeProcess::standalone(
        &hearth(),
        dir.path(),
        TOKEN,
        "[egress]\nallow_private_addresses = true\n",
    )
    .expect("the node starts");

    timers_fire_in_order(&node);
    a_finished_request_s_timers_never_run_in_the_next(&node);
    fetch_reaches_an_allowed_origin_and_fails_with_a_reason(&node, &origin, &closed, &denied);
    env_holds_vars_and_bindings(&node);
    large_bodies_stream_both_ways(&node, &origin);
    fetched_bodies_stream_and_one_left_unread_is_dropped(&node, &origin);
    a_failed_request_answers_500_and_retires_the_instance(&node, &origin);
    // Last: it lets /gate and /hold answer.
    wait_until_work_runs_after_the_response(&node, &origin);
    an_unhandled_rejection_is_one_line_of_the_log(&node);
}

/// Due order, extra arguments, a nested timer, a cleared one, a negative
/// delay, an interval cleared after three runs, a microtask checkpoint
/// after each callback, `scheduler.wait`. Only orders no scheduling delay can change are
/// asserted (a later-created timer with a delay 50 ms longer is due later).
fn timers_fire_in_order(node: &NodeProcess) {
    let v = json(node, "loop", "/timers");
    let log: Vec<String> = serde_json::from_value(v["log"].clone()).expect("a log");
    let want: HashSet<&str> = [
        "t0",
        "neg",
        "nested-t0",
        "iv1",
        "iv2",
        "iv3",
        "t50:xy",
        "micro-after-t50",
        "t100",
        "t200",
        "wait250",
    ]
    .into();
    let got: HashSet<&str> = log.iter().map(String::as_str).collect();
    assert_eq!(got, want, "{log:?}");
    assert_eq!(log.len(), want.len(), "each once: {log:?}");
    assert!(at(&log, "t0") < at(&log, "neg"), "creation order: {log:?}");
    assert!(at(&log, "neg") < at(&log, "nested-t0"), "{log:?}");
    assert!(at(&log, "iv1") < at(&log, "iv2") && at(&log, "iv2") < at(&log, "iv3"));
    assert!(at(&log, "t0") < at(&log, "t50:xy"), "{log:?}");
    assert_eq!(
        at(&log, "micro-after-t50"),
        at(&log, "t50:xy") + 1,
        "the microtask runs right after its callback: {log:?}"
    );
    assert!(at(&log, "t50:xy") < at(&log, "t100"), "{log:?}");
    assert!(at(&log, "t100") < at(&log, "t200"), "{log:?}");
    assert_eq!(
        at(&log, "wait250"),
        log.len() - 1,
        "scheduler.wait: {log:?}"
    );
}

/// A 0 ms timer, a promise on a 1 ms timer and an interval left behind
/// never run, not even while a later request on the same instance waits
/// on a timer of its own (the JSON-echo sample's `x-js-leave` and
/// `x-js-sleep` do the same in js_engine.rs).
fn a_finished_request_s_timers_never_run_in_the_next(node: &NodeProcess) {
    let first = json(node, "fail", "/leave");
    assert_eq!(first["leaked"], false);
    // The instance is idle again before the next request, so the next one
    // is served by it.
    std::thread::sleep(Duration::from_millis(50));
    let second = json(node, "fail", "/sleep?ms=20");
    assert_eq!(
        second["served"].as_u64(),
        first["served"].as_u64().map(|n| n + 1),
        "the same instance"
    );
    assert_eq!(
        second["leaked"], false,
        "a callback of request 1 ran in request 2"
    );
}

fn fetch_reaches_an_allowed_origin_and_fails_with_a_reason(
    node: &NodeProcess,
    origin: &Origin,
    closed: &str,
    denied: &str,
) {
    let v = json(node, "loop", &format!("/fetch?url={}/hello", origin.url));
    assert_eq!(v["status"], 200, "{v}");
    assert_eq!(
        v["body"], "GET /hello x-test=loop",
        "the request's headers: {v}"
    );
    assert_eq!(v["header"], "origin", "the response's headers: {v}");

    // A redirect is followed (the final URL is the response's), unless
    // the request says `redirect: "manual"`.
    let v = json(node, "loop", &format!("/fetch?url={}/redirect", origin.url));
    assert_eq!(v["status"], 200, "{v}");
    assert_eq!(v["body"], "GET /moved?from=redirect x-test=loop", "{v}");
    assert_eq!(
        v["url"],
        format!("{}/moved?from=redirect", origin.url),
        "{v}"
    );
    let v = json(
        node,
        "loop",
        &format!("/fetch?url={}/redirect&redirect=manual", origin.url),
    );
    assert_eq!(v["status"], 302, "{v}");
    assert_eq!(v["location"], "/moved?from=redirect", "{v}");

    // Two at once: both answered, each its own.
    let v = json(node, "loop", &format!("/fetch2?url={}/two", origin.url));
    assert_eq!(v[0]["body"], "GET /two?n=1 x-test=-", "{v}");
    assert_eq!(v[1]["body"], "GET /two?n=2 x-test=-", "{v}");

    // Failures reject with a TypeError that says why.
    let v = json(node, "loop", &format!("/fetch?url={denied}/x"));
    let error = v["error"].as_str().unwrap_or_default();
    assert!(error.starts_with("TypeError: "), "{v}");
    assert!(
        error.contains("request denied"),
        "not on the allow-list: {v}"
    );
    let v = json(node, "loop", &format!("/fetch?url={closed}/x"));
    let error = v["error"].as_str().unwrap_or_default();
    assert!(error.starts_with("TypeError: "), "{v}");
    assert!(error.contains("connection refused"), "nobody listens: {v}");
    let v = json(node, "loop", "/fetch?url=ftp://example.com/");
    let error = v["error"].as_str().unwrap_or_default();
    assert!(error.contains("not an absolute http(s) URL"), "{v}");
}

fn env_holds_vars_and_bindings(node: &NodeProcess) {
    let v = json(node, "loop", "/env");
    assert_eq!(
        v["vars"],
        serde_json::json!({"FOO": "bar"}),
        "the var, not the runtime's own HEARTH_* entries"
    );
    let bindings: HashSet<String> =
        serde_json::from_value(v["bindings"].clone()).expect("binding names");
    let want: HashSet<String> = ["auth", "AUTH", "users", "USERS"].map(String::from).into();
    assert_eq!(bindings, want);

    // A service binding: the path and query go to the bound Worker.
    let v = json(node, "loop", "/auth");
    assert_eq!(v["status"], 200, "{v}");
    assert_eq!(v["header"], "callee", "{v}");
    let callee: serde_json::Value =
        serde_json::from_str(v["body"].as_str().unwrap_or_default()).expect("callee JSON");
    assert_eq!(
        callee,
        serde_json::json!({"method": "GET", "path": "/check?q=1", "from": "loop", "body": ""})
    );

    // A dispatch namespace's user Worker, with a method and a body; the
    // URL's host is replaced by the user Worker's.
    let v = json(node, "loop", "/dispatch?name=user-a");
    assert_eq!(v["status"], 200, "{v}");
    let callee: serde_json::Value =
        serde_json::from_str(v["body"].as_str().unwrap_or_default()).expect("callee JSON");
    assert_eq!(
        callee,
        serde_json::json!({"method": "POST", "path": "/check?via=dispatch", "from": "dispatch", "body": "hello"})
    );
}

/// `ctx.waitUntil`: the answer comes while the work still waits on the
/// origin's gate; the work finishes after it (its second fetch arrives).
fn wait_until_work_runs_after_the_response(node: &NodeProcess, origin: &Origin) {
    let v = json(node, "loop", &format!("/wait-gate?url={}", origin.url));
    assert_eq!(v["waiting"], true, "{v}");
    assert!(origin.saw("GET /gate "), "the work started");
    origin.open_gate();
    assert!(
        origin.saw("GET /after-gate "),
        "the work went on after the answer; log: {}",
        node.log()
    );
}

/// A 3 MiB response body from the Worker, and a 3 MiB body fetched whole.
fn large_bodies_stream_both_ways(node: &NodeProcess, origin: &Origin) {
    let (status, body) = get(node, "loop", "/big?kb=3072");
    assert_eq!(status, 200);
    assert_eq!(body.len(), 3 << 20);
    assert!(
        body.iter()
            .enumerate()
            .all(|(i, &b)| usize::from(b) == i % 251),
        "the bytes arrive unchanged"
    );
    let v = json(node, "loop", &format!("/fetch-len?url={}/big", origin.url));
    let sum = (0..3u64 << 20).fold(0, |s, i| (s + (i % 253) * (i % 7)) % 1_000_003);
    assert_eq!(
        v,
        serde_json::json!({"status": 200, "length": 3 << 20, "sum": sum})
    );
}

/// A throw, a rejection, an answer that is not a Response and a promise
/// nothing can settle each answer 500; those and a fetch still running at
/// the end retire the instance (the next request starts a new one); a
/// fetch aborted by its signal does not.
fn a_failed_request_answers_500_and_retires_the_instance(node: &NodeProcess, origin: &Origin) {
    // An aborted fetch is not one still running: the instance stays.
    let v = keeps_its_instance(node, &format!("/fetch-abort?url={}", origin.url));
    assert_eq!(
        v,
        serde_json::json!({"aborted": true, "error": "AbortError"})
    );

    for route in ["/throw", "/reject", "/not-response", "/never"] {
        assert!(json(node, "fail", "/")["served"].as_u64() >= Some(1));
        assert!(json(node, "fail", "/")["served"].as_u64() >= Some(2));
        let (status, body) = get(node, "fail", route);
        assert_eq!(status, 500, "{route}: {}", String::from_utf8_lossy(&body));
        assert_eq!(body, b"Internal Server Error", "{route}");
        assert_eq!(
            json(node, "fail", "/")["served"],
            1,
            "{route}: a new instance"
        );
    }
    json(node, "fail", "/");
    let v = json(
        node,
        "fail",
        &format!("/fetch-leave?url={}/slow", origin.url),
    );
    assert_eq!(v["left"], true);
    assert_eq!(
        json(node, "fail", "/")["served"],
        1,
        "a fetch still running retires the instance"
    );
    // The guest's stderr reaches the node's log after the answer.
    wait_for_log(
        node,
        "fetch() calls still running: this instance is retired",
    );
}

/// A fetched body reaches the Worker as it arrives: a Worker that answers
/// with `fetch(origin/drip)` sends the origin's first piece to its client
/// while the origin still holds the rest. A body the Worker never reads is
/// not a fetch still running: it is dropped at the request's end and the
/// instance serves on; nor is one aborted after its first piece, whose
/// next read rejects with the abort. A body the Worker stopped reading
/// costs no CPU while the Worker waits on something else.
fn fetched_bodies_stream_and_one_left_unread_is_dropped(node: &NodeProcess, origin: &Origin) {
    let v = keeps_its_instance(node, &format!("/fetch-status?url={}/big", origin.url));
    assert_eq!(v["status"], 200, "{v}");

    // A body the Worker stopped reading, its next piece already at the
    // host, is not waited on: a 500 ms timer after it costs next to no CPU
    // (a loop that polled the body's readiness would spin all along).
    let cpu = hearth::testing::ProcStat::of(node.pid()).expect("the node's /proc stat");
    let v = json(
        node,
        "fail",
        &format!("/read-one-then-wait?url={}/big", origin.url),
    );
    let spent = hearth::testing::ProcStat::of(node.pid())
        .expect("the node's /proc stat")
        .cpu
        .saturating_sub(cpu.cpu);
    assert!(v["read"].as_u64() > Some(0), "{v}");
    assert!(
        spent < Duration::from_millis(250),
        "the node spent {spent:?} of CPU while its Worker waited 500 ms"
    );

    // An abort after the head errors the body: the next read rejects, and
    // the instance serves on.
    let v = keeps_its_instance(node, &format!("/fetch-abort-body?url={}/drip", origin.url));
    assert_eq!(
        v,
        serde_json::json!({"first": "first piece\n", "aborted": true, "error": "AbortError"})
    );

    // Last: it lets every /drip send its rest.
    let mut s = std::net::TcpStream::connect(node.http()).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(20)))
        .expect("timeout");
    write!(
        s,
        "GET /proxy?url={}/drip HTTP/1.0\r\nHost: fail.localhost\r\n\r\n",
        origin.url
    )
    .expect("write");
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    while !String::from_utf8_lossy(&got).contains("first piece\n") {
        let n = s.read(&mut buf).expect("the first piece before the rest");
        assert!(n > 0, "ended early: {}", String::from_utf8_lossy(&got));
        got.extend_from_slice(&buf[..n]);
    }
    assert!(!String::from_utf8_lossy(&got).contains("second piece"));
    origin.release_drip();
    s.read_to_end(&mut got).expect("the rest");
    let text = String::from_utf8_lossy(&got);
    assert!(
        text.starts_with("HTTP/1.1 200") || text.starts_with("HTTP/1.0 200"),
        "{text}"
    );
    assert!(
        text.ends_with("\r\n\r\nfirst piece\nsecond piece\n"),
        "{text}"
    );
}

/// Waits until the node runs no invocation (`hearth_in_flight 0` in its
/// unauthenticated `/metrics`).
fn idle(node: &NodeProcess) {
    let mut last = String::new();
    for _ in 0..1000 {
        last = node.metrics().expect("/metrics");
        if last.lines().any(|l| l == "hearth_in_flight 0") {
            return;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    panic!("the node never became idle: {last}");
}

/// `GET path` on `fail` (answered 200 with JSON), checked to leave the
/// instance that served it serving the next request: the JSON.
fn keeps_its_instance(node: &NodeProcess, path: &str) -> serde_json::Value {
    // A client has its answer before the instance has finished the
    // request (the end-of-request work, a body left unread dropped): wait
    // until that instance is idle, or it would come back into the pool
    // after the requests below and serve the last one.
    idle(node);
    let before = json(node, "fail", "/")["served"].as_u64();
    let v = json(node, "fail", path);
    // Idle again before the next request, so the next one is served by it
    // unless it was retired.
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(
        json(node, "fail", "/")["served"].as_u64(),
        before.map(|n| n + 2),
        "{path} retired its instance: {v}"
    );
    v
}

/// Waits (10 s at most) until the node's log holds `line`.
fn wait_for_log(node: &NodeProcess, line: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !node.log().contains(line) {
        assert!(
            Instant::now() < deadline,
            "no {line:?} in the log: {}",
            node.log()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn an_unhandled_rejection_is_one_line_of_the_log(node: &NodeProcess) {
    assert_eq!(json(node, "loop", "/unhandled")["ok"], true);
    wait_for_log(
        node,
        "Uncaught (in promise) Error: nobody handles this at fetch (worker.js:",
    );
}
