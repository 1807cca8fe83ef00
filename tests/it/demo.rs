//! The demo end to end on a small setting: both modes run on the same
//! traffic, the JSON has the documented keys, and the plot is written.

use hearth::demo::{DemoArgs, DemoError, run};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn demo_compares_both_modes_and_writes_json_and_plot() {
    let dir = tempfile::tempdir().expect("tempdir");
    let args = DemoArgs {
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
