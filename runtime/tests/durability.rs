//! What a deploy promises and what a node holds to: a deploy stopped at any
//! step leaves the old or the new version servable, concurrent deploys of
//! one name are serialised, the free plan bounds the uncompressed size,
//! and live instances are held to the node's memory cap.

use std::sync::Arc;

use http_body_util::BodyExt;

use hearth_runtime::body::{self, Body};
use hearth_runtime::{DeployError, DirStore, Plan, Runtime, RuntimeConfig};

fn sample(name: &str) -> Vec<u8> {
    hearth_sample_workers::bytes(name).expect("sample Worker built")
}

fn config(dir: &std::path::Path) -> RuntimeConfig {
    RuntimeConfig::new(dir)
        .artifact_key([3; 32])
        .instance_pool_size(20)
}

fn get(id: &str) -> http::Request<Body> {
    http::Request::get(format!("http://{id}.localhost/"))
        .body(body::full(""))
        .expect("request")
}

/// Which sample answers for `app` on a fresh runtime over `dir`: `hello`,
/// `echo`, or a failure.
async fn who_serves(dir: &std::path::Path) -> String {
    let rt = Runtime::new(config(dir)).expect("runtime");
    let resp = rt.serve("app", get("app")).await;
    let status = resp.status();
    let echo = resp.headers().contains_key("x-echo-served");
    let bytes = resp
        .into_body()
        .collect()
        .await
        .map(|c| c.to_bytes())
        .unwrap_or_default();
    let text = String::from_utf8_lossy(&bytes);
    match (status.as_u16(), echo) {
        (200, true) => "echo".into(),
        (200, false) if text.contains("hello from app") => "hello".into(),
        _ => format!("failure {status}: {text}"),
    }
}

const STEPS: [&str; 9] = [
    "blob.write",
    "blob.rename",
    "blob.sync-dir",
    "version.write",
    "version.rename",
    "version.sync-dir",
    "meta.write",
    "meta.rename",
    "meta.sync-dir",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deploy_stopped_at_any_step_leaves_a_servable_version() {
    for (i, step) in STEPS.iter().enumerate() {
        let dir = tempfile::tempdir().expect("tempdir");
        let rt = Runtime::new(config(dir.path())).expect("runtime");
        rt.deploy("app", Plan::Free, sample("hello"))
            .await
            .expect("first deploy");
        drop(rt);
        // The second deploy "crashes" at `step`.
        let failing = step.to_string();
        let store = DirStore::open(dir.path())
            .expect("store")
            .with_fault_hook(Arc::new(move |s: &str| {
                if s == failing {
                    Err(std::io::Error::other(format!("injected crash at {s}")))
                } else {
                    Ok(())
                }
            }));
        let rt = Runtime::with_store(config(dir.path()), Arc::new(store)).expect("runtime");
        let err = rt
            .deploy("app", Plan::Free, sample("echo"))
            .await
            .expect_err("the injected fault stops the deploy");
        assert!(matches!(err, DeployError::Store(_)), "{step}: {err}");
        drop(rt);
        let serving = who_serves(dir.path()).await;
        // Before the metadata is renamed into place the old version stands;
        // from then on the new one does. Never neither.
        let expected = if i < 8 { "hello" } else { "echo" };
        assert_eq!(serving, expected, "crash at {step}");
    }
    // And with no fault, the new version.
    let dir = tempfile::tempdir().expect("tempdir");
    let rt = Runtime::new(config(dir.path())).expect("runtime");
    rt.deploy("app", Plan::Free, sample("hello"))
        .await
        .expect("deploy");
    rt.deploy("app", Plan::Free, sample("echo"))
        .await
        .expect("deploy");
    drop(rt);
    assert_eq!(who_serves(dir.path()).await, "echo");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_damaged_blob_is_rewritten_by_the_next_deploy() {
    let dir = tempfile::tempdir().expect("tempdir");
    let rt = Runtime::new(config(dir.path())).expect("runtime");
    let report = rt
        .deploy("app", Plan::Free, sample("hello"))
        .await
        .expect("deploy");
    let blob = dir
        .path()
        .join("blobs")
        .join(format!("{}.wasm", report.meta.hash));
    std::fs::write(&blob, b"damaged").expect("damage");
    rt.deploy("app", Plan::Free, sample("hello"))
        .await
        .expect("redeploy");
    drop(rt);
    std::fs::remove_dir_all(dir.path().join("artifacts")).expect("drop artifacts");
    assert_eq!(who_serves(dir.path()).await, "hello");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_deploys_of_one_name_are_serialised() {
    let dir = tempfile::tempdir().expect("tempdir");
    let rt = Runtime::new(config(dir.path())).expect("runtime");
    let (hello, echo) = (sample("hello"), sample("echo"));
    let deploys: Vec<_> = (0..8)
        .map(|i| {
            let rt = rt.clone();
            let src = if i % 2 == 0 {
                hello.clone()
            } else {
                echo.clone()
            };
            tokio::spawn(async move { rt.deploy("app", Plan::Free, src).await })
        })
        .collect();
    let mut reports = Vec::new();
    for d in deploys {
        reports.push(d.await.expect("task").expect("deploy"));
    }
    // The stored version is the one deployed last, and no two deploys
    // overlapped: their deploy times are all distinct or ordered.
    let stored = rt
        .script_store()
        .meta("app")
        .await
        .expect("meta")
        .expect("stored");
    let last = reports
        .iter()
        .max_by_key(|r| r.meta.deployed_at_ms)
        .expect("reports");
    assert_eq!(stored.deployed_at_ms, last.meta.deployed_at_ms);
    assert!(
        reports
            .iter()
            .filter(|r| r.meta.deployed_at_ms == stored.deployed_at_ms)
            .any(|r| r.meta.hash == stored.hash)
    );
    let resp = rt.serve("app", get("app")).await;
    assert_eq!(resp.status(), 200);
}

/// `source` with a custom section of `n` zero bytes appended: still a
/// valid component, tiny compressed, huge uncompressed.
fn with_padding(mut source: Vec<u8>, n: usize) -> Vec<u8> {
    fn leb(mut v: usize, out: &mut Vec<u8>) {
        loop {
            let b = (v & 0x7f) as u8;
            v >>= 7;
            if v == 0 {
                out.push(b);
                return;
            }
            out.push(b | 0x80);
        }
    }
    let name = b"padding";
    let mut payload = Vec::new();
    leb(name.len(), &mut payload);
    payload.extend_from_slice(name);
    payload.resize(payload.len() + n, 0);
    source.push(0);
    leb(payload.len(), &mut source);
    source.extend_from_slice(&payload);
    source
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_uncompressed_size_is_bounded_too() {
    let dir = tempfile::tempdir().expect("tempdir");
    let rt = Runtime::new(config(dir.path())).expect("runtime");
    let padded = with_padding(sample("hello"), 60 << 20);
    match rt.deploy("pad", Plan::Free, padded.clone()).await {
        Err(e @ DeployError::TooLargeUncompressed { .. }) => {
            let msg = e.to_string();
            assert!(msg.contains("33554432"), "{msg}");
        }
        other => panic!("a 60 MiB script must be refused on free: {other:?}"),
    }
    assert!(rt.script_store().meta("pad").await.expect("meta").is_none());
    // Under the limit, the same padding is accepted: it is the size, not
    // the section, that was refused.
    let small = with_padding(sample("hello"), 1 << 20);
    rt.deploy("pad", Plan::Free, small).await.expect("deploy");
    assert_eq!(rt.serve("pad", get("pad")).await.status(), 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn live_instances_are_held_to_the_node_memory_cap() {
    let dir = tempfile::tempdir().expect("tempdir");
    // Each instance may hold 128 MiB, but all of them together only 64
    // (24 of which each live instance reserves for its host resources).
    let rt = Runtime::new(config(dir.path()).instance_memory_cap(64 << 20)).expect("runtime");
    rt.deploy("mem", Plan::Free, sample("mem-hog"))
        .await
        .expect("deploy");
    rt.deploy("hello", Plan::Free, sample("hello"))
        .await
        .expect("deploy");
    assert_eq!(rt.serve("hello", get("hello")).await.status(), 200);
    let before = rt.stats().instance_bytes;
    let resp = rt.serve("mem", get("mem")).await;
    assert_eq!(resp.status(), 503);
    let s = rt.stats();
    assert_eq!(s.memory_kills, 1);
    // The hog's memory (and its host reserve) came back; another Worker
    // still runs.
    assert_eq!(s.instance_bytes, before);
    assert_eq!(rt.serve("hello", get("hello")).await.status(), 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn can_host_never_reads_the_store_on_the_caller() {
    let dir = tempfile::tempdir().expect("tempdir");
    let rt = Runtime::new(
        config(dir.path())
            .memory_budget(2 << 20)
            .busy_window(std::time::Duration::from_secs(60)),
    )
    .expect("runtime");
    rt.deploy("hello", Plan::Free, sample("hello"))
        .await
        .expect("deploy");
    rt.deploy("big", Plan::Paid, sample("big"))
        .await
        .expect("deploy");
    assert_eq!(rt.serve("hello", get("hello")).await.status(), 200);
    // The first answer for a Worker of unknown size is optimistic (the
    // store is read on the blocking pool, not under the caller's lock) ...
    assert!(rt.can_host("big"));
    // ... and once its size is known, a node too small to hold it beside a
    // busy Worker says no.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while rt.can_host("big") {
        assert!(std::time::Instant::now() < deadline, "size never learned");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

/// The test process's resident memory, from `/proc/self/status`.
fn rss() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("proc status");
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS");
    kb * 1024
}

/// Serves `id` at `path` `total` times, `parallel` at a time, while a
/// sampler records the peak RSS; (statuses with their text, peak RSS).
async fn hammer(
    rt: &Runtime,
    id: &str,
    path: &str,
    total: usize,
    parallel: usize,
) -> (Vec<(u16, String)>, u64) {
    use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
    let peak = Arc::new(AtomicU64::new(rss()));
    let stop = Arc::new(AtomicBool::new(false));
    let sampler = {
        let (peak, stop) = (peak.clone(), stop.clone());
        tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                peak.fetch_max(rss(), Ordering::Relaxed);
                tokio::time::sleep(std::time::Duration::from_millis(5)).await;
            }
        })
    };
    let next = AtomicUsize::new(0);
    let lanes = (0..parallel).map(|_| async {
        let mut out = Vec::new();
        while next.fetch_add(1, Ordering::Relaxed) < total {
            let req = http::Request::get(format!("http://{id}.localhost{path}"))
                .body(body::full(""))
                .expect("request");
            let resp = rt.serve(id, req).await;
            let status = resp.status().as_u16();
            let bytes = resp
                .into_body()
                .collect()
                .await
                .map(|c| c.to_bytes())
                .unwrap_or_default();
            out.push((status, String::from_utf8_lossy(&bytes).into_owned()));
        }
        out
    });
    let results = futures::future::join_all(lanes).await.concat();
    stop.store(true, Ordering::Relaxed);
    sampler.await.expect("sampler");
    peak.fetch_max(rss(), Ordering::Relaxed);
    (results, peak.load(Ordering::Relaxed))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outgoing_bodies_cannot_pin_host_memory() {
    let dir = tempfile::tempdir().expect("tempdir");
    // 16 live instances × (24 MiB host reserve + their linear memory) fit.
    let cap: u64 = 512 << 20;
    let rt = Runtime::new(config(dir.path()).instance_memory_cap(cap)).expect("runtime");
    rt.deploy("hog", Plan::Free, sample("body-hog"))
        .await
        .expect("deploy");
    rt.deploy("hello", Plan::Free, sample("hello"))
        .await
        .expect("deploy");
    assert_eq!(rt.serve("hello", get("hello")).await.status(), 200);
    let before = rss();
    // 100 requests, 16 at a time, each parking 4 bodies of 2 MiB in 1 MiB
    // writes on a reused instance: 800 MiB if the host let it.
    let ((greedy, peak), hello) = tokio::join!(
        hammer(&rt, "hog", "/greedy/4", 100, 16),
        hammer(&rt, "hello", "/", 50, 1)
    );
    assert!(
        peak < before + cap,
        "RSS grew by {} MiB, over the {} MiB cap",
        (peak - before) >> 20,
        cap >> 20
    );
    assert_eq!(greedy.len(), 100);
    for (status, text) in &greedy {
        assert!(
            *status >= 400 && !text.trim().is_empty(),
            "a 1 MiB write into an outgoing body must fail clearly: {status} {text}"
        );
    }
    assert!(hello.0.iter().all(|(s, _)| *s == 200), "{:?}", hello.0);
    // A guest that writes only what check-write grants parks at most 8 KiB
    // per body; on a reused instance they pile up until its resource table
    // is full (then the call traps and the instance goes).
    let (fill, peak) = hammer(&rt, "hog", "/fill/200", 100, 16).await;
    assert!(
        peak < before + cap,
        "RSS grew by {} MiB, over the {} MiB cap",
        (peak - before) >> 20,
        cap >> 20
    );
    for (status, text) in &fill {
        assert!(
            (*status == 200 && text.starts_with("held")) || *status >= 500,
            "{status} {text}"
        );
        if let Some(bytes) = text
            .strip_prefix("held ")
            .and_then(|t| t.split_once(" bodies, "))
        {
            let bodies: u64 = bytes.0.parse().expect("count");
            let held: u64 = bytes.1.trim_end_matches(" bytes").parse().expect("bytes");
            assert!(held <= bodies * 8192, "{text}");
        }
    }
    assert!(rt.stats().instance_bytes <= cap);
    assert_eq!(rt.serve("hello", get("hello")).await.status(), 200);
    let held = fill.iter().filter(|(s, _)| *s == 200).count();
    eprintln!(
        "greedy: {} of 100 failed ({:?}); fill: {held} answered, {} trapped; peak RSS +{} MiB; hello {} of {} served",
        greedy.len(),
        greedy.first(),
        fill.len() - held,
        (peak - before) >> 20,
        hello.0.iter().filter(|(s, _)| *s == 200).count(),
        hello.0.len()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_script_deployed_before_versions_is_version_1_and_can_be_rolled_back_to() {
    let dir = tempfile::tempdir().expect("tempdir");
    let rt = Runtime::new(config(dir.path())).expect("runtime");
    rt.deploy("app", Plan::Free, sample("hello"))
        .await
        .expect("deploy");
    drop(rt);
    // Make it as an older hearth wrote it: no version number, no records
    // (and, older than signed records, no MAC: read while upgrading).
    let path = dir.path().join("scripts").join("app.json");
    let mut meta: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&path).expect("read")).expect("json");
    let obj = meta.as_object_mut().expect("object");
    obj.remove("version");
    obj.remove("latest_version");
    obj.remove("mac");
    std::fs::write(&path, serde_json::to_vec(&meta).expect("json")).expect("write");
    std::fs::remove_dir_all(dir.path().join("versions")).expect("no records");

    let rt = Runtime::new(config(dir.path()).accept_unsigned_records(true)).expect("runtime");
    let resp = rt.serve("app", get("app")).await;
    assert_eq!(resp.headers()["x-hearth-version"], "1");
    let list = rt.versions("app").await.expect("versions");
    assert_eq!(list.versions.len(), 1);
    assert_eq!(list.versions[0].version, 1);
    let report = rt
        .deploy("app", Plan::Free, sample("echo"))
        .await
        .expect("deploy");
    assert_eq!(report.meta.version, 2);
    let numbers: Vec<u64> = rt
        .versions("app")
        .await
        .expect("versions")
        .versions
        .iter()
        .map(|m| m.version)
        .collect();
    assert_eq!(numbers, vec![1, 2], "the old deployment was recorded as 1");
    let back = rt.rollback("app", None).await.expect("rollback");
    assert_eq!(back.version, 1);
    drop(rt);
    assert_eq!(who_serves(dir.path()).await, "hello");
}
