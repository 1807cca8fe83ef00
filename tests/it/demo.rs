//! The demo end to end on a small setting: both modes run on the same
//! traffic, the JSON has the documented keys, and the plot is written.

use hearth::demo::objects::ObjectsDemoArgs;
use hearth::demo::{DemoArgs, DemoError, run};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn demo_compares_both_modes_and_writes_json_and_plot() {
    let dir = tempfile::tempdir().expect("tempdir");
    let args = DemoArgs {
        other: None,
        nodes: 3,
        workers: 30,
        requests: 600,
        exponent: 1.1,
        budget_workers: 12,
        concurrency: 4,
        seed: 7,
        json: Some(dir.path().join("demo.json")),
        plot: dir.path().join("demo.png"),
    };
    let report = run(args).await.expect("demo");
    for m in [&report.unsharded, &report.sharded] {
        assert_eq!(m.requests, 600);
        assert_eq!(m.failed, 0);
        assert_eq!(m.warm + m.cold, m.requests);
        assert!(!m.timeline.is_empty());
    }
    assert_eq!(report.unsharded.sharded, 0, "no sharding when it is off");
    assert!(report.sharded.sharded > 0);
    // Each Worker lives on one node when sharded: 30 Workers fit in 3 × 12.
    assert!(
        report.sharded.evictions < report.unsharded.evictions,
        "{report:?}"
    );
    let json: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.path().join("demo.json")).expect("json"))
            .expect("parse");
    for mode in ["unsharded", "sharded"] {
        for key in [
            "requests",
            "warm",
            "cold",
            "evictions",
            "sharded",
            "refusals",
            "resident_bytes",
        ] {
            assert!(json[mode][key].is_u64(), "{mode}.{key} missing");
        }
    }
    let png = std::fs::read(dir.path().join("demo.png")).expect("png");
    assert!(png.starts_with(b"\x89PNG\r\n\x1a\n"));
}

#[tokio::test]
async fn demo_refuses_flags_it_cannot_run_with_and_names_the_flag() {
    let dir = tempfile::tempdir().expect("tempdir");
    let args = |nodes, exponent| DemoArgs {
        other: None,
        nodes,
        workers: 3,
        requests: 3,
        exponent,
        budget_workers: 1,
        concurrency: 1,
        seed: 1,
        json: None,
        plot: dir.path().join("never.png"),
    };
    for (a, flag) in [(args(0, 1.0), "--nodes"), (args(1, f64::NAN), "--exponent")] {
        match run(a).await {
            Err(e @ DemoError::Usage(_)) => assert!(e.to_string().starts_with(flag), "{e}"),
            other => panic!("expected a usage error naming {flag}, got {other:?}"),
        }
    }
    assert!(!dir.path().join("never.png").exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_objects_demo_spreads_counters_and_each_counts_on_after_a_node_stops() {
    let report = hearth::demo::objects::run(ObjectsDemoArgs {
        nodes: 3,
        objects: 9,
        increments: 2,
    })
    .await
    .expect("objects demo");
    assert_eq!(report.counted_on, 9, "{report:?}");
    let homed: usize = report.nodes.iter().map(|n| n.homes_before).sum();
    assert_eq!(homed, 9, "every counter has one home: {report:?}");
    assert!(
        report.nodes.iter().filter(|n| n.homes_before > 0).count() >= 2,
        "counters spread over the ring: {report:?}"
    );
    for n in &report.nodes {
        // Only a counter's home serves it: each increment once, plus the
        // reads of nothing (IDs are made by the Worker, not the object).
        assert_eq!(n.served_before, 2 * n.homes_before as u64, "{n:?}");
    }
    let after: usize = report.nodes.iter().map(|n| n.homes_after).sum();
    assert_eq!(after, 9, "every counter has a home among the survivors");
    let stopped = report
        .nodes
        .iter()
        .find(|n| n.id == report.stopped)
        .expect("the stopped node");
    assert_eq!(stopped.homes_before, report.moved);
    assert!(report.moved > 0);
}

#[tokio::test]
async fn the_objects_demo_refuses_a_cluster_it_cannot_stop_a_node_of() {
    let err = hearth::demo::objects::run(ObjectsDemoArgs {
        nodes: 1,
        objects: 3,
        increments: 1,
    })
    .await
    .expect_err("one node");
    assert!(err.to_string().contains("--nodes"), "{err}");
}
