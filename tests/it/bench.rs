//! `hearth bench` against real nodes (TestCluster): Zipf traffic open loop,
//! trace replay, cold vs warm latency of one Worker, and bad trace input.

use hearth::runtime::Plan;
use hearth::testing::TestCluster;
use hearth_bench::{self as bench, BenchArgs};

fn sample(name: &str) -> Vec<u8> {
    hearth_sample_workers::bytes(name).expect("sample built")
}

/// `--target` and `--admin` (and `--token`) for every node of `c`.
fn cluster_flags(c: &TestCluster) -> Vec<String> {
    let mut f = vec!["bench".to_string()];
    for n in c.nodes() {
        f.push("--target".into());
        f.push(format!("http://{}", n.http_addr));
        f.push("--admin".into());
        f.push(format!("http://{}", n.admin_addr));
    }
    f.push("--token".into());
    f.push(c.token().to_string());
    f
}

fn args(base: &[String], extra: &[&str]) -> BenchArgs {
    let all = base
        .iter()
        .cloned()
        .chain(extra.iter().map(|s| s.to_string()));
    BenchArgs::try_parse_from(all).expect("bench flags")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bench_drives_a_cluster_and_measures_cold_and_warm() {
    let c = TestCluster::start(3).await.expect("cluster");
    for w in ["w0", "w1", "w2", "w3"] {
        c.deploy(w, Plan::Free, sample("hello"))
            .await
            .expect("deploy");
    }
    let base = cluster_flags(&c);
    let dir = tempfile::tempdir().expect("tempdir");

    // Zipf traffic over the discovered Workers, open loop.
    let json = dir.path().join("bench.json");
    let json_flag = json.to_string_lossy().into_owned();
    let r = bench::run(args(
        &base,
        &["--rate", "200", "--requests", "60", "--json", &json_flag],
    ))
    .await
    .expect("bench run");
    assert_eq!(r.mode, "zipf");
    assert_eq!(r.workers, ["w0", "w1", "w2", "w3"], "discovered, sorted");
    assert_eq!(r.planned, 60);
    assert_eq!(r.not_sent, 0);
    assert_eq!(r.requests, 60, "every planned request was sent");
    assert_eq!(
        r.failed, 0,
        "{:?} {:?}",
        r.failures_by_status, r.first_error
    );
    assert_eq!(r.warm + r.cold, r.requests);
    assert!(r.cold >= 1, "the first request of each Worker is cold");
    assert_eq!(r.cold_latency.count, r.cold);
    assert_eq!(r.warm_latency.count, r.warm);
    assert_eq!(r.routes.values().sum::<u64>(), r.requests);
    assert!(r.evictions.is_some() && r.refusals.is_some());
    assert!(r.resident_bytes.is_some_and(|b| b > 0), "Workers resident");
    let table = r.table();
    assert!(table.contains("| warm rate |"), "{table}");
    assert!(table.contains("cold latency (ms)"), "{table}");
    let written: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&json).expect("json written")).expect("json");
    assert_eq!(written["requests"], 60);

    // A trace naming more Workers than are deployed: mapped by index mod 4.
    let trace = dir.path().join("trace.csv");
    let lines: String = (0..30)
        .map(|i| format!("{}.{:03},t{}\n", i / 10, (i % 10) * 100, i % 6))
        .collect();
    std::fs::write(&trace, format!("timestamp,script_id\n{lines}")).expect("write trace");
    let trace_flag = trace.to_string_lossy().into_owned();
    let r = bench::run(args(
        &base,
        &[
            "--workers",
            "w0,w1,w2,w3",
            "--trace",
            &trace_flag,
            "--speedup",
            "10",
        ],
    ))
    .await
    .expect("trace run");
    assert_eq!(r.mode, "trace");
    assert_eq!(r.requests, 30);
    assert_eq!(
        r.failed, 0,
        "{:?} {:?}",
        r.failures_by_status, r.first_error
    );
    assert_eq!(r.warm + r.cold, 30);

    // Cold vs warm of one Worker: evicted everywhere before each cold one.
    let r = bench::run(args(&base, &["--worker", "w1", "--cold", "--repeat", "3"]))
        .await
        .expect("cold run");
    assert_eq!(r.mode, "cold");
    assert_eq!(r.requests, 6);
    assert_eq!(r.failed, 0, "{:?}", r.samples);
    assert_eq!(r.cold_latency.count, 3, "{:?}", r.samples);
    assert_eq!(r.warm_latency.count, 3, "{:?}", r.samples);
    assert_eq!(r.samples.len(), 6);
    for s in &r.samples {
        assert_eq!(s.start, s.phase, "sample {s:?}");
        assert_eq!(s.status, 200);
    }
    assert!(
        r.manual_evictions.is_some_and(|m| m >= 2),
        "the Worker was resident before the 2nd and 3rd eviction: {:?}",
        r.manual_evictions
    );
    assert!(r.table().contains("samples:"));
}

#[tokio::test]
async fn a_missing_or_malformed_trace_is_an_error() {
    let dir = tempfile::tempdir().expect("tempdir");
    // Nothing listens here; the trace is read before any request.
    let base: Vec<String> = ["bench", "--target", "http://127.0.0.1:9", "--workers", "a"]
        .map(String::from)
        .to_vec();

    let missing = dir.path().join("no-such-trace.csv");
    let missing_flag = missing.to_string_lossy().into_owned();
    let e = bench::run(args(&base, &["--trace", &missing_flag]))
        .await
        .expect_err("missing trace");
    assert!(format!("{e:#}").contains("no-such-trace.csv"), "{e:#}");

    let bad = dir.path().join("bad.csv");
    std::fs::write(&bad, "0.5,a\nsoon,a\n").expect("write");
    let bad_flag = bad.to_string_lossy().into_owned();
    let e = bench::run(args(
        &base,
        &["--trace", &bad_flag, "--trace-format", "csv"],
    ))
    .await
    .expect_err("malformed trace");
    assert!(format!("{e:#}").contains("line 2"), "{e:#}");

    let e = bench::run(args(&base, &["--rate", "0"]))
        .await
        .expect_err("zero rate");
    assert!(format!("{e:#}").contains("--rate"), "{e:#}");
}
