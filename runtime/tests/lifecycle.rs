//! Every real Worker runs: the JS (componentize-js) and Python
//! (componentize-py) samples serve request after request under the lifecycle
//! hearth picks for them, and a Rust Worker keeps the reuse fast path.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use http_body_util::BodyExt;

use hearth_runtime::body::{self, Body};
use hearth_runtime::{Lifecycle, Manifest, Plan, Runtime, RuntimeConfig};

fn sample(name: &str) -> Vec<u8> {
    hearth_sample_workers::bytes(name).expect("sample Worker built")
}

fn runtime(dir: &tempfile::TempDir) -> Runtime {
    Runtime::new(
        RuntimeConfig::new(dir.path())
            .artifact_key([5; 32])
            .instance_pool_size(64),
    )
    .expect("runtime")
}

/// Request `i` of a mixed sequence: even ones GET with a query, odd ones
/// POST with a body that names `i`.
fn request(id: &str, i: usize) -> (http::Request<Body>, String, String) {
    if i.is_multiple_of(2) {
        let path = format!("/get/{i}?q={i}");
        let req = http::Request::get(format!("http://{id}.localhost{path}"))
            .header("x-test", format!("t{i}"))
            .body(body::full(""))
            .expect("request");
        (req, path, String::new())
    } else {
        let path = format!("/post/{i}");
        let text = format!("body of request {i}: {}", "x".repeat(i % 300));
        let req = http::Request::post(format!("http://{id}.localhost{path}"))
            .header("x-test", format!("t{i}"))
            .header("content-type", "text/plain")
            .body(body::full(text.clone()))
            .expect("request");
        (req, path, text)
    }
}

/// Sends request `i` and checks the JSON answer describes it; returns the
/// `x-hearth-start` value.
async fn check(rt: &Runtime, id: &str, worker: &str, i: usize) -> Result<String, String> {
    let (req, path, sent) = request(id, i);
    let method = req.method().to_string();
    let resp = rt.serve(id, req).await;
    let status = resp.status();
    let start = resp
        .headers()
        .get("x-hearth-start")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string();
    let bytes = resp
        .into_body()
        .collect()
        .await
        .map_err(|e| format!("request {i}: body failed: {e}"))?
        .to_bytes();
    if status != 200 {
        return Err(format!(
            "request {i}: status {status}: {}",
            String::from_utf8_lossy(&bytes)
        ));
    }
    let v: serde_json::Value = serde_json::from_slice(&bytes)
        .map_err(|e| format!("request {i}: not JSON ({e}): {bytes:?}"))?;
    let want = serde_json::json!({
        "worker": worker,
        "method": method,
        "path": path,
        "body": sent,
        "bodyLength": sent.len(),
    });
    for key in ["worker", "method", "path", "body", "bodyLength"] {
        if v[key] != want[key] {
            return Err(format!(
                "request {i}: {key} is {} not {}",
                v[key], want[key]
            ));
        }
    }
    if v["headers"]["x-test"] != format!("t{i}") {
        return Err(format!("request {i}: headers {}", v["headers"]));
    }
    Ok(start)
}

/// Deploys `name` as `id`, serves 1,000 mixed requests in a row and checks
/// every answer, the first cold and the rest warm; returns the runtime.
async fn thousand_in_a_row(
    dir: &tempfile::TempDir,
    name: &str,
    worker: &str,
    expect: Lifecycle,
) -> Runtime {
    let rt = runtime(dir);
    let report = rt
        .deploy(name, Plan::Paid, sample(name))
        .await
        .expect("deploy");
    assert_eq!(
        report.meta.lifecycle.chosen, expect,
        "{}",
        report.meta.lifecycle.reason
    );
    for i in 0..1000 {
        let start = check(&rt, name, worker, i)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let want = if i == 0 { "cold" } else { "warm" };
        assert_eq!(start, want, "request {i}");
    }
    let s = rt.stats();
    assert_eq!((s.requests, s.cold, s.warm), (1000, 1, 999), "{s:?}");
    assert_eq!((s.traps, s.reuse_demotions), (0, 0), "{s:?}");
    rt
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn js_worker_serves_a_thousand_requests_on_fresh_instances() {
    let dir = tempfile::tempdir().expect("tempdir");
    let rt = thousand_in_a_row(&dir, "js", "js", Lifecycle::Fresh).await;
    // One instance per request: StarlingMonkey never sees a second one.
    assert_eq!(rt.stats().instances_started, 1000);

    // 32 concurrent clients for 5 s: no errors either.
    let errors = Arc::new(AtomicU64::new(0));
    let served = Arc::new(AtomicU64::new(0));
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut clients = Vec::new();
    for c in 0..32 {
        let (rt, errors, served) = (rt.clone(), errors.clone(), served.clone());
        clients.push(tokio::spawn(async move {
            let mut i = c;
            while Instant::now() < deadline {
                match check(&rt, "js", "js", i).await {
                    Ok(_) => served.fetch_add(1, Ordering::Relaxed),
                    Err(e) => {
                        eprintln!("{e}");
                        errors.fetch_add(1, Ordering::Relaxed)
                    }
                };
                i += 32;
            }
        }));
    }
    for c in clients {
        c.await.expect("client task");
    }
    assert_eq!(errors.load(Ordering::Relaxed), 0);
    assert!(
        served.load(Ordering::Relaxed) > 32,
        "every client was served"
    );

    // A fresh instance starts in a pool slot an earlier instance of the same
    // Worker used. The pages that one dirtied (SpiderMonkey's heap: far more
    // than 32 separate runs of pages) are reset in place, found with
    // wasmtime's PAGEMAP_SCAN, not handed back to the kernel, so the new
    // instance does not fault them in again. wasmtime 48.0.8 as published
    // gave up after 32 runs and decommitted the rest: ≈ 45 faults per
    // request here (vendor/README.md), each a TLB shootdown on a VM.
    if !wasmtime::PoolingAllocationConfig::is_pagemap_scan_available() {
        eprintln!("page faults not checked: no PAGEMAP_SCAN ioctl (Linux < 6.7)");
        return;
    }
    let faults = fresh_js_faults_per_request(&rt, 20, 200);
    eprintln!("fresh JS instances: {faults:.2} page faults per request");
    assert!(
        faults < 10.0,
        "{faults:.1} page faults per fresh JS request: a pool slot's dirty pages were decommitted"
    );
}

/// Minor page faults the calling thread has taken so far (field 10 of
/// `/proc/thread-self/stat`, after the command name in parentheses).
fn thread_minor_faults() -> u64 {
    let stat =
        std::fs::read_to_string("/proc/thread-self/stat").expect("read /proc/thread-self/stat");
    let (_, fields) = stat
        .rsplit_once(')')
        .expect("stat has the command in parentheses");
    fields
        .split_whitespace()
        .nth(7)
        .and_then(|f| f.parse().ok())
        .expect("minflt field")
}

/// Serves `warm` then `n` requests to the fresh `js` Worker, one at a time,
/// on a thread of its own with a current-thread tokio runtime (so the guests
/// run on that thread, and other tests' faults are not counted), and returns
/// that thread's minor page faults per request over the last `n`.
fn fresh_js_faults_per_request(rt: &Runtime, warm: usize, n: usize) -> f64 {
    let rt = rt.clone();
    std::thread::spawn(move || {
        let tokio = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("tokio runtime");
        tokio.block_on(async {
            for i in 0..warm {
                check(&rt, "js", "js", i)
                    .await
                    .unwrap_or_else(|e| panic!("{e}"));
            }
            let before = thread_minor_faults();
            for i in warm..warm + n {
                check(&rt, "js", "js", i)
                    .await
                    .unwrap_or_else(|e| panic!("{e}"));
            }
            (thread_minor_faults() - before) as f64 / n as f64
        })
    })
    .join()
    .expect("the measuring thread")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_worker_serves_a_thousand_requests_on_a_reused_instance() {
    if let Some(why) = hearth_sample_workers::skipped("python") {
        eprintln!("skipping: {why}");
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let rt = thousand_in_a_row(&dir, "python", "python", Lifecycle::Reuse).await;
    // Reused: far fewer instances than requests (one, plus at most a few
    // started while the previous one was still being handed back).
    let started = rt.stats().instances_started;
    assert!(started < 10, "{started} instances for 1000 requests");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rust_worker_reuses_its_instance_and_a_trap_discards_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let rt = runtime(&dir);
    let report = rt
        .deploy("echo", Plan::Free, sample("echo"))
        .await
        .expect("deploy");
    assert_eq!(report.meta.lifecycle.chosen, Lifecycle::Reuse);
    // Sequential requests on one reused instance: its global counter
    // persists from one request to the next.
    let mut counts = Vec::new();
    for _ in 0..3 {
        let req = http::Request::get("http://echo.localhost/")
            .body(body::full(""))
            .expect("request");
        let resp = rt.serve("echo", req).await;
        assert_eq!(resp.status(), 200);
        counts.push(
            resp.headers()["x-echo-served"]
                .to_str()
                .expect("ascii")
                .to_string(),
        );
        let _ = resp.into_body().collect().await;
        // Let the instance go back to the pool before the next request.
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(counts, ["1", "2", "3"]);

    // The same Worker deployed fresh: every request sees a new instance.
    rt.deploy(
        "echo",
        Manifest {
            plan: Plan::Free,
            lifecycle: Lifecycle::Fresh,
            ..Manifest::default()
        },
        sample("echo"),
    )
    .await
    .expect("redeploy");
    for _ in 0..2 {
        let req = http::Request::get("http://echo.localhost/")
            .body(body::full(""))
            .expect("request");
        let resp = rt.serve("echo", req).await;
        assert_eq!(resp.headers()["x-echo-served"], "1");
    }

    // A trap discards the instance even under reuse.
    rt.deploy("trap", Plan::Free, sample("trap"))
        .await
        .expect("deploy");
    let before = rt.stats().instances_started;
    for _ in 0..2 {
        let req = http::Request::get("http://trap.localhost/")
            .body(body::full(""))
            .expect("request");
        assert_eq!(rt.serve("trap", req).await.status(), 500);
    }
    assert_eq!(rt.stats().instances_started, before + 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_js_worker_forced_to_reuse_is_demoted_after_one_failure() {
    // The last line of defence: a Worker that cannot survive reuse but was
    // deployed with lifecycle = "reuse" fails once, then gets fresh
    // instances (and the failure is counted).
    let dir = tempfile::tempdir().expect("tempdir");
    let rt = runtime(&dir);
    rt.deploy(
        "js",
        Manifest {
            plan: Plan::Paid,
            lifecycle: Lifecycle::Reuse,
            ..Manifest::default()
        },
        sample("js"),
    )
    .await
    .expect("deploy");
    let mut failures = 0;
    for i in 0..6 {
        if check(&rt, "js", "js", i).await.is_err() {
            failures += 1;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(failures, 1, "exactly the first reused request fails");
    assert_eq!(rt.stats().reuse_demotions, 1);
}
