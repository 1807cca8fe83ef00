//! The runtime against the real sample Workers: cold and warm starts, every
//! limit, eviction, redeploys, artifacts. Each test builds its own runtime
//! over a fresh store directory.

use std::time::Duration;

use bytes::Bytes;
use http_body_util::BodyExt;

use hearth_runtime::body::{self, Body};
use hearth_runtime::{DeployError, Plan, ReusePolicy, Runtime, RuntimeConfig, ValidationError};

fn sample(name: &str) -> Vec<u8> {
    hearth_sample_workers::bytes(name).expect("sample Worker built")
}

fn config(dir: &tempfile::TempDir) -> RuntimeConfig {
    RuntimeConfig::new(dir.path())
        .artifact_key([7; 32])
        .instance_pool_size(50)
}

fn get(id: &str) -> http::Request<Body> {
    http::Request::get(format!("http://{id}.localhost/"))
        .body(body::full(""))
        .expect("request")
}

async fn text(resp: http::Response<Body>) -> (http::StatusCode, http::HeaderMap, String) {
    let (parts, b) = resp.into_parts();
    let bytes = b.collect().await.map(|c| c.to_bytes()).unwrap_or_default();
    (
        parts.status,
        parts.headers,
        String::from_utf8_lossy(&bytes).into_owned(),
    )
}

async fn call(rt: &Runtime, id: &str) -> (http::StatusCode, http::HeaderMap, String) {
    text(rt.serve(id, get(id)).await).await
}

fn header<'a>(h: &'a http::HeaderMap, name: &str) -> &'a str {
    h.get(name).and_then(|v| v.to_str().ok()).unwrap_or("")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cold_then_warm_with_phases_in_server_timing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let rt = Runtime::new(config(&dir)).expect("runtime");
    rt.deploy("hello", Plan::Free, sample("hello"))
        .await
        .expect("deploy");

    let (status, h, body) = call(&rt, "hello").await;
    assert_eq!(status, 200);
    assert_eq!(body, "hello from hello");
    assert_eq!(header(&h, "x-hearth-start"), "cold");
    let timing = header(&h, "server-timing");
    for phase in [
        "fetch;dur=",
        "compile;dur=",
        "instantiate;dur=",
        "handler;dur=",
    ] {
        assert!(timing.contains(phase), "{phase} missing from {timing}");
    }

    let (status, h, _) = call(&rt, "hello").await;
    assert_eq!(status, 200);
    assert_eq!(header(&h, "x-hearth-start"), "warm");
    let timing = header(&h, "server-timing");
    assert!(!timing.contains("compile"));

    let s = rt.stats();
    assert_eq!((s.requests, s.cold, s.warm), (2, 1, 1));
    // The first instance goes back to the pool when its handler task ends,
    // which may be just after the response: at most one more was started.
    assert!(s.instances_started <= 2, "{s:?}");
    assert_eq!(s.resident_workers, 1);
    assert!(s.resident_bytes > 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_cold_requests_load_once() {
    let dir = tempfile::tempdir().expect("tempdir");
    let rt = Runtime::new(config(&dir)).expect("runtime");
    rt.deploy("hello", Plan::Free, sample("hello"))
        .await
        .expect("deploy");
    let compiles_at_deploy = rt.stats().compiles;
    let tasks: Vec<_> = (0..8)
        .map(|_| {
            let rt = rt.clone();
            tokio::spawn(async move { call(&rt, "hello").await.0 })
        })
        .collect();
    for t in tasks {
        assert_eq!(t.await.expect("task"), 200);
    }
    let s = rt.stats();
    assert_eq!(
        s.artifact_loads + s.compiles - compiles_at_deploy,
        1,
        "{s:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_script_is_404_with_clear_body() {
    let dir = tempfile::tempdir().expect("tempdir");
    let rt = Runtime::new(config(&dir)).expect("runtime");
    let (status, _, body) = call(&rt, "nobody").await;
    assert_eq!(status, 404);
    assert!(
        body.contains("no Worker is deployed as \"nobody\""),
        "{body}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn size_limit_is_per_plan_and_measured_compressed() {
    let dir = tempfile::tempdir().expect("tempdir");
    let rt = Runtime::new(config(&dir)).expect("runtime");
    let big = sample("big");
    match rt.deploy("big", Plan::Free, big.clone()).await {
        Err(DeployError::TooLarge {
            compressed, limit, ..
        }) => {
            assert_eq!(limit, 3 << 20);
            assert!(compressed > limit);
            let msg = DeployError::TooLarge {
                plan: Plan::Free,
                compressed,
                raw: big.len() as u64,
                limit,
            }
            .to_string();
            assert!(
                msg.contains(&compressed.to_string()) && msg.contains("3145728"),
                "{msg}"
            );
        }
        other => panic!("big must be refused on free, got {other:?}"),
    }
    assert!(
        rt.script_store().meta("big").await.expect("meta").is_none(),
        "nothing stored"
    );
    let report = rt
        .deploy("big", Plan::Paid, big)
        .await
        .expect("big fits paid");
    assert!(report.meta.compressed_size <= 10 << 20);
    let (status, _, _) = call(&rt, "big").await;
    assert_eq!(status, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_is_refused_with_the_reason() {
    let dir = tempfile::tempdir().expect("tempdir");
    let rt = Runtime::new(config(&dir)).expect("runtime");
    let core = wasmtime_wat(r#"(module (func (export "_start")))"#);
    assert!(matches!(
        rt.deploy("x", Plan::Free, core).await,
        Err(DeployError::Invalid(ValidationError::CoreModule))
    ));
    assert!(matches!(
        rt.deploy("x", Plan::Free, b"#!/bin/sh\necho hi".to_vec())
            .await,
        Err(DeployError::Invalid(ValidationError::NotWasm))
    ));
    let mut truncated = sample("hello");
    truncated.truncate(truncated.len() / 2);
    match rt.deploy("x", Plan::Free, truncated).await {
        Err(DeployError::Invalid(ValidationError::Malformed(m))) => assert!(!m.is_empty()),
        other => panic!("truncated component: {other:?}"),
    }
    assert!(matches!(
        rt.deploy("Bad_Name", Plan::Free, sample("hello")).await,
        Err(DeployError::InvalidScriptId(_))
    ));
}

fn wasmtime_wat(src: &str) -> Vec<u8> {
    wat::parse_str(src).expect("valid wat")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn startup_budget_kills_slow_start_and_retries_next_time() {
    let dir = tempfile::tempdir().expect("tempdir");
    // free keeps the default 400 ms; paid gets enough for slow-start's ~1 s.
    let rt = Runtime::new(config(&dir).startup_cpu(Plan::Paid, Duration::from_secs(5)))
        .expect("runtime");
    rt.deploy("slow", Plan::Free, sample("slow-start"))
        .await
        .expect("deploy");
    rt.deploy("hello", Plan::Free, sample("hello"))
        .await
        .expect("deploy");
    for attempt in 1..=2 {
        let (status, _, body) = call(&rt, "slow").await;
        assert_eq!(status, 503, "attempt {attempt}");
        assert!(body.contains("exceeded its startup CPU budget"), "{body}");
        assert_eq!(
            rt.stats().startup_failures,
            attempt,
            "each request tried again"
        );
    }
    assert_eq!(call(&rt, "hello").await.0, 200, "the node keeps serving");

    rt.deploy("slow", Plan::Paid, sample("slow-start"))
        .await
        .expect("redeploy on paid");
    let (status, h, _) = call(&rt, "slow").await;
    assert_eq!(status, 200);
    assert!(header(&h, "server-timing").contains("instantiate;dur="));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cpu_hog_is_stopped_near_its_limit() {
    let dir = tempfile::tempdir().expect("tempdir");
    let limit = Duration::from_millis(300);
    let rt = Runtime::new(config(&dir).request_cpu(Plan::Free, limit)).expect("runtime");
    rt.deploy("hog", Plan::Free, sample("cpu-hog"))
        .await
        .expect("deploy");
    rt.deploy("hello", Plan::Free, sample("hello"))
        .await
        .expect("deploy");
    let served = rt.handle("hog", get("hog")).await;
    match served {
        Err(hearth_runtime::RuntimeError::CpuExceeded { used, budget, .. }) => {
            assert_eq!(budget, limit);
            assert!(used > limit, "{used:?}");
            // CPU time, not wall time: the overshoot is about one epoch tick.
            assert!(
                used < limit + Duration::from_millis(100),
                "stopped late: {used:?}"
            );
        }
        Err(e) => panic!("expected CpuExceeded, got {e}"),
        Ok(_) => panic!("cpu-hog must not finish"),
    }
    let (status, _, body) = call(&rt, "hog").await;
    assert_eq!(status, 503);
    assert!(body.contains("exceeded its CPU limit"), "{body}");
    assert_eq!(call(&rt, "hello").await.0, 200);
    assert_eq!(rt.stats().cpu_kills, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mem_hog_fails_its_allocation_and_trap_is_500() {
    let dir = tempfile::tempdir().expect("tempdir");
    let rt = Runtime::new(config(&dir).memory_limit(Plan::Free, 32 << 20)).expect("runtime");
    rt.deploy("mem", Plan::Free, sample("mem-hog"))
        .await
        .expect("deploy");
    rt.deploy("trap", Plan::Free, sample("trap"))
        .await
        .expect("deploy");
    rt.deploy("hello", Plan::Free, sample("hello"))
        .await
        .expect("deploy");
    let (status, _, body) = call(&rt, "mem").await;
    assert_eq!(status, 503);
    assert!(
        body.contains("exceeded its memory limit of 33554432 bytes"),
        "{body}"
    );
    let (status, headers, body) = call(&rt, "trap").await;
    assert_eq!(status, 500);
    // End users get a short message and a request ID; the backtrace and
    // error chain go to the log only.
    let id = header(&headers, hearth_runtime::REQUEST_ID_HEADER).to_string();
    assert_eq!(id.len(), 16, "{headers:?}");
    assert_eq!(
        body.trim(),
        format!("Worker trap failed (it trapped) (request id {id})")
    );
    assert!(
        !body.contains("wasm backtrace") && !body.contains("0x"),
        "{body}"
    );
    assert_eq!(call(&rt, "hello").await.0, 200);
    // A trapped instance is discarded: the next request gets a fresh one.
    let before = rt.stats().instances_started;
    assert_eq!(call(&rt, "trap").await.0, 500);
    assert_eq!(rt.stats().instances_started, before + 1);
    let s = rt.stats();
    assert_eq!((s.memory_kills, s.traps), (1, 2));
}

/// `wasi:random` answers at most 64 KiB per call (the host builds the answer
/// in its own memory before the guest sees it; wasmtime-wasi's default let
/// one call ask for 64 MiB): a larger ask traps that instance, and the
/// Worker and the node go on serving.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_guest_asking_for_too_many_random_bytes_traps_and_the_node_serves_on() {
    let dir = tempfile::tempdir().expect("tempdir");
    let rt = Runtime::new(config(&dir)).expect("runtime");
    rt.deploy("mem", Plan::Free, sample("mem-hog"))
        .await
        .expect("deploy");
    let random = |n: u64| {
        let req = http::Request::get(format!("http://mem.localhost/?random={n}"))
            .body(body::full(""))
            .expect("request");
        let rt = &rt;
        async move { text(rt.serve("mem", req).await).await }
    };
    let (status, _, body) = random(64 * 1024).await;
    assert_eq!((status.as_u16(), body.as_str()), (200, "65536"));
    for over in [64 * 1024 + 1, 1 << 20, 32 << 20] {
        let (status, _, body) = random(over).await;
        assert_eq!(status, 500, "{over} bytes: {body}");
        assert!(body.contains("it trapped"), "{body}");
    }
    assert_eq!(rt.stats().traps, 3);
    let (status, _, body) = random(16).await;
    assert_eq!((status.as_u16(), body.as_str()), (200, "16"));
    rt.deploy("hello", Plan::Free, sample("hello"))
        .await
        .expect("deploy");
    assert_eq!(call(&rt, "hello").await.0, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reused_instance_near_its_memory_limit_is_retired_before_a_request_fails() {
    let dir = tempfile::tempdir().expect("tempdir");
    let rt = Runtime::new(config(&dir).memory_limit(Plan::Free, 32 << 20)).expect("runtime");
    rt.deploy("mem", Plan::Free, sample("mem-hog"))
        .await
        .expect("deploy");
    // Each request keeps 4 MiB more on the (reused) instance that serves
    // it: without retirement an instance's 8th request would pass the
    // 32 MiB limit and fail.
    let mut held = Vec::new();
    for _ in 0..24 {
        let req = http::Request::get("http://mem.localhost/?keep=4")
            .body(body::full(""))
            .expect("request");
        let (status, _, body) = text(rt.serve("mem", req).await).await;
        assert_eq!(status, 200, "{body}");
        held.push(body.trim().parse::<usize>().expect("blocks held"));
    }
    // Instances served while they could, and none past 3/4 of 32 MiB
    // (six requests' worth): then the count starts again on a fresh one.
    assert!(held.iter().all(|&n| n <= 24), "{held:?}");
    let s = rt.stats();
    assert_eq!(s.memory_kills, 0);
    assert!(s.memory_retirements >= 1, "{held:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eviction_under_pressure_is_counted_and_then_cold() {
    let dir = tempfile::tempdir().expect("tempdir");
    let probe = Runtime::new(config(&dir)).expect("runtime");
    probe
        .deploy("a", Plan::Free, sample("hello"))
        .await
        .expect("deploy");
    call(&probe, "a").await;
    let one = probe.stats().resident_bytes;
    drop(probe);
    // Room for one hello and a half: the second evicts the first.
    let rt = Runtime::new(config(&dir).memory_budget(one * 3 / 2)).expect("runtime");
    rt.deploy("b", Plan::Free, sample("hello"))
        .await
        .expect("deploy");
    assert_eq!(header(&call(&rt, "a").await.1, "x-hearth-start"), "cold");
    assert_eq!(header(&call(&rt, "b").await.1, "x-hearth-start"), "cold");
    let s = rt.stats();
    assert_eq!(s.evicted_pressure, 1);
    assert_eq!(rt.resident(), vec!["b".to_string()]);
    assert_eq!(header(&call(&rt, "a").await.1, "x-hearth-start"), "cold");
    assert_eq!(rt.stats().evicted_pressure, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_workers_are_evicted() {
    let dir = tempfile::tempdir().expect("tempdir");
    let rt = Runtime::new(config(&dir).idle_timeout(Duration::ZERO)).expect("runtime");
    rt.deploy("hello", Plan::Free, sample("hello"))
        .await
        .expect("deploy");
    call(&rt, "hello").await;
    // No request triggers it: the runtime's background sweep evicts the
    // idle Worker by itself.
    rt.next_idle_sweep().await;
    assert_eq!(rt.stats().evicted_idle, 1);
    assert!(rt.resident().is_empty());
    assert!(!rt.is_warm("hello"));
    assert_eq!(rt.sweep_idle(), 0, "nothing left to sweep");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_aware_idle_sweep_keeps_idle_workers_while_memory_is_plentiful() {
    let dir = tempfile::tempdir().expect("tempdir");
    let rt = Runtime::new(
        config(&dir)
            .idle_timeout(Duration::ZERO)
            .idle_sweep_above(0.9),
    )
    .expect("runtime");
    rt.deploy("hello", Plan::Free, sample("hello"))
        .await
        .expect("deploy");
    call(&rt, "hello").await;
    assert_eq!(
        rt.sweep_idle(),
        0,
        "1 GiB budget, one small Worker: keep it warm"
    );
    assert!(rt.is_warm("hello"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redeploy_replaces_and_failed_redeploy_keeps_old_version() {
    let dir = tempfile::tempdir().expect("tempdir");
    let rt = Runtime::new(config(&dir)).expect("runtime");
    rt.deploy("app", Plan::Free, sample("hello"))
        .await
        .expect("deploy");
    assert_eq!(call(&rt, "app").await.2, "hello from app");
    rt.deploy("app", Plan::Free, sample("wstd-hello"))
        .await
        .expect("redeploy");
    let (status, h, body) = call(&rt, "app").await;
    assert_eq!((status.as_u16(), body.as_str()), (200, "hello from wstd"));
    assert_eq!(
        header(&h, "x-hearth-start"),
        "cold",
        "the old version was dropped"
    );
    assert_eq!(rt.stats().evicted_replaced, 1);
    assert!(
        rt.deploy("app", Plan::Free, b"\0asm garbage".to_vec())
            .await
            .is_err()
    );
    assert!(rt.deploy("app", Plan::Free, sample("big")).await.is_err());
    assert_eq!(
        call(&rt, "app").await.2,
        "hello from wstd",
        "failed deploys change nothing"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn artifacts_are_reused_across_restarts_and_tampering_is_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let rt = Runtime::new(config(&dir)).expect("runtime");
    let report = rt
        .deploy("hello", Plan::Free, sample("hello"))
        .await
        .expect("deploy");
    drop(rt);

    // A restarted node loads the artifact instead of compiling, and
    // checks its MAC once: a second load of the same file skips the hash.
    let rt = Runtime::new(config(&dir)).expect("runtime");
    assert_eq!(call(&rt, "hello").await.0, 200);
    assert!(rt.evict("hello"));
    assert_eq!(call(&rt, "hello").await.0, 200);
    let s = rt.stats();
    assert_eq!((s.artifact_loads, s.compiles), (2, 0));

    // Replaced after it was checked (a new file renamed over it, the way
    // artifacts are written; a file rewritten in place while mapped is not
    // supported, see artifact.rs): checked again, refused, and the source
    // compiled.
    let path = rt.artifacts().path(&report.meta.hash);
    let mut bytes = std::fs::read(&path).expect("artifact");
    let mid = bytes.len() / 3;
    bytes[mid] ^= 0x55;
    let tmp = path.with_extension("tampered");
    std::fs::write(&tmp, &bytes).expect("write");
    std::fs::rename(&tmp, &path).expect("rename");
    assert!(rt.evict("hello"));
    assert_eq!(call(&rt, "hello").await.2, "hello from hello");
    let s = rt.stats();
    assert_eq!(
        (s.artifacts_rejected, s.artifact_loads, s.compiles),
        (1, 2, 1)
    );
    drop(rt);

    // Tamper with it: the MAC fails, it is discarded and the source compiled.
    let path = Runtime::new(config(&dir))
        .expect("runtime")
        .artifacts()
        .path(&report.meta.hash);
    let mut bytes = std::fs::read(&path).expect("artifact");
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0xff;
    // No Runtime has it mapped now: rewriting in place is safe here.
    std::fs::write(&path, &bytes).expect("write");
    let rt = Runtime::new(config(&dir)).expect("runtime");
    assert_eq!(call(&rt, "hello").await.2, "hello from hello");
    let s = rt.stats();
    assert_eq!(
        (s.artifacts_rejected, s.artifact_loads, s.compiles),
        (1, 0, 1)
    );
    drop(rt);

    // An artifact made under another cluster's key is foreign: refused too.
    // (That cluster's store: its records are signed under its own key, so
    // this store's records would be refused there as well.)
    let foreign = tempfile::tempdir().expect("tempdir");
    let rt = Runtime::new(config(&foreign).artifact_key([9; 32])).expect("runtime");
    rt.deploy("hello", Plan::Free, sample("hello"))
        .await
        .expect("deploy");
    let theirs = rt.artifacts().path(&report.meta.hash);
    let tmp = theirs.with_extension("foreign");
    std::fs::copy(&path, &tmp).expect("copy ours");
    std::fs::rename(&tmp, &theirs).expect("rename over theirs");
    assert_eq!(call(&rt, "hello").await.0, 200);
    assert_eq!(rt.stats().artifacts_rejected, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_wstd_component_runs() {
    let dir = tempfile::tempdir().expect("tempdir");
    let rt = Runtime::new(config(&dir)).expect("runtime");
    rt.deploy("plain", Plan::Free, sample("wstd-hello"))
        .await
        .expect("deploy");
    let (status, _, body) = call(&rt, "plain").await;
    assert_eq!((status.as_u16(), body.as_str()), (200, "hello from wstd"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn echo_streams_ten_megabytes_and_headers() {
    let dir = tempfile::tempdir().expect("tempdir");
    let rt = Runtime::new(config(&dir)).expect("runtime");
    rt.deploy("echo", Plan::Free, sample("echo"))
        .await
        .expect("deploy");
    let payload: Vec<u8> = (0..10_000_000u32).map(|i| (i % 251) as u8).collect();
    // Stream the request body in 64 KiB frames.
    let chunks: Vec<Result<http_body::Frame<Bytes>, hearth_runtime::BoxError>> = payload
        .chunks(64 * 1024)
        .map(|c| Ok(http_body::Frame::data(Bytes::copy_from_slice(c))))
        .collect();
    let stream = http_body_util::StreamBody::new(futures::stream::iter(chunks));
    let req = http::Request::post("http://echo.localhost/")
        .header("x-color", "blue")
        .body(body::boxed(stream))
        .expect("request");
    let resp = rt.serve("echo", req).await;
    assert_eq!(resp.status(), 200);
    assert_eq!(header(resp.headers(), "x-echo-x-color"), "blue");
    let got = resp.into_body().collect().await.expect("body").to_bytes();
    assert_eq!(got.len(), payload.len());
    assert!(got == payload, "echoed bytes differ");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fresh_per_request_policy_starts_an_instance_each_time() {
    let dir = tempfile::tempdir().expect("tempdir");
    let rt = Runtime::new(config(&dir).reuse(ReusePolicy::fresh_per_request())).expect("runtime");
    rt.deploy("hello", Plan::Free, sample("hello"))
        .await
        .expect("deploy");
    for _ in 0..3 {
        assert_eq!(call(&rt, "hello").await.0, 200);
    }
    assert_eq!(rt.stats().instances_started, 3);
}
