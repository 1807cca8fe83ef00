//! Added latency of one nested Worker call (a service binding), on the same
//! node and across nodes: `cargo bench -p hearth --bench nested_hop`.
//!
//! Three in-process nodes (`hearth::testing::TestCluster`: real HTTP, Cap'n
//! Proto over mTLS on loopback). `relay` Workers: a lone one (it tries its
//! binding `next`, is denied, and answers) is the baseline; a pair `a → b`
//! (b a lone relay) adds exactly one nested call. The pair is measured with
//! `b` on `a`'s node and on another node; one client connection, requests to
//! `a`'s home, the three kinds interleaved, warm. Prints a table.

use std::time::{Duration, Instant};

use hearth::runtime::Manifest;
use hearth::testing::TestCluster;

const REQUESTS: usize = 2000;

fn pct(sorted: &[Duration], p: f64) -> f64 {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i].as_secs_f64() * 1e6
}

fn main() -> anyhow::Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    rt.block_on(run())
}

async fn run() -> anyhow::Result<()> {
    let c = TestCluster::start(3).await?;
    let relay = hearth_sample_workers::bytes("relay")?;
    // Names: a base on some home, a leaf on the same home, a leaf elsewhere.
    let home_of = |n: &str| c.home_of(n).expect("home");
    let a = "hop-a".to_string();
    let h = home_of(&a);
    let same = (0..1000)
        .map(|k| format!("leaf-same-{k}"))
        .find(|n| home_of(n) == h)
        .expect("a name on the same home");
    let other = (0..1000)
        .map(|k| format!("leaf-other-{k}"))
        .find(|n| home_of(n) != h)
        .expect("a name on another home");
    let a_same = format!("{a}-same");
    let a_other = format!("{a}-other");
    let a_same = (0..1000)
        .map(|k| format!("{a_same}-{k}"))
        .find(|n| home_of(n) == h)
        .expect("name");
    let a_other = (0..1000)
        .map(|k| format!("{a_other}-{k}"))
        .find(|n| home_of(n) == h)
        .expect("name");
    for leaf in [&same, &other] {
        c.deploy_manifest(leaf, Manifest::default(), relay.clone())
            .await?;
    }
    let mut m = Manifest::default();
    m.bindings.services.insert("next".into(), same.clone());
    c.deploy_manifest(&a_same, m, relay.clone()).await?;
    let mut m = Manifest::default();
    m.bindings.services.insert("next".into(), other.clone());
    c.deploy_manifest(&a_other, m, relay.clone()).await?;

    let kinds = [
        ("baseline (no nested call)", same.clone()),
        ("+1 hop, same node", a_same.clone()),
        ("+1 hop, across nodes", a_other.clone()),
    ];
    // Warm everything up.
    for _ in 0..50 {
        for (_, id) in &kinds {
            let r = c.get(h, id, "/").await?;
            anyhow::ensure!(r.status == 200, "{}", r.text());
        }
    }
    let mut samples = vec![Vec::with_capacity(REQUESTS); kinds.len()];
    for _ in 0..REQUESTS {
        for (i, (_, id)) in kinds.iter().enumerate() {
            let t = Instant::now();
            let r = c.get(h, id, "/").await?;
            samples[i].push(t.elapsed());
            anyhow::ensure!(r.status == 200, "{}", r.text());
        }
    }
    for s in &mut samples {
        s.sort();
    }
    let base = (pct(&samples[0], 0.5), pct(&samples[0], 0.99));
    println!("\n{REQUESTS} requests each, 1 connection, 3 in-process nodes on loopback\n");
    println!("| request | p50 (µs) | p99 (µs) | added p50 (µs) | added p99 (µs) |");
    println!("|---|---:|---:|---:|---:|");
    for (i, (name, _)) in kinds.iter().enumerate() {
        let (p50, p99) = (pct(&samples[i], 0.5), pct(&samples[i], 0.99));
        let added = if i == 0 {
            ("–".to_string(), "–".to_string())
        } else {
            (
                format!("{:.0}", p50 - base.0),
                format!("{:.0}", p99 - base.1),
            )
        };
        println!(
            "| {name} | {p50:.0} | {p99:.0} | {} | {} |",
            added.0, added.1
        );
    }
    drop(c);
    Ok(())
}
