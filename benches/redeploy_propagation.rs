//! How fast a redeploy reaches every node: `cargo bench -p hearth --bench
//! redeploy_propagation`.
//!
//! Three in-process nodes (`hearth::testing::TestCluster`: real Cap'n Proto
//! over mTLS on loopback), scripts in a real S3 server (Garage, if
//! installed; else the shared directory, said in the output). Before each
//! redeploy every node holds a warm copy of the Worker; the redeploy goes
//! through one node (in turn), which writes the store and announces the
//! new version to the other two; each of them checks the store and drops
//! its stale copy before it answers. Measured: the time from the store
//! write to each member's answer (the propagation), and the whole deploy.
//! After each deploy returns, every node is asked for the Worker: a stale
//! answer would be counted (expected: none).

use std::time::Instant;

use http_body_util::BodyExt;

use hearth::cluster::ClusterConfig;
use hearth::runtime::{Plan, body};
use hearth::testing::{Garage, TestCluster};
use hearth_report::latency::Distribution;
use hearth_report::table::Table;

const REDEPLOYS: usize = 100;

fn main() -> anyhow::Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    rt.block_on(run())
}

async fn body_of(c: &TestCluster, i: usize) -> anyhow::Result<String> {
    let req = http::Request::get("http://app.localhost/").body(body::full(""))?;
    let resp = c.node(i).node.runtime().serve("app", req).await;
    let bytes = resp
        .into_body()
        .collect()
        .await
        .map_err(|e| anyhow::anyhow!("{e}"))?
        .to_bytes();
    Ok(String::from_utf8_lossy(&bytes).into_owned())
}

async fn run() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let mut cfg = ClusterConfig::new(3, dir.path());
    let garage = match Garage::binary() {
        Some(_) => Some(Garage::start().await?),
        None => None,
    };
    let store = match &garage {
        Some(g) => {
            cfg.s3 = Some((g.url("bench"), g.settings()));
            "S3 (Garage, one node on loopback)"
        }
        None => "shared directory (Garage not installed)",
    };
    let c = TestCluster::with_config(cfg, None).await?;
    let versions = [
        (hearth_sample_workers::bytes("hello")?, "hello from app"),
        (
            hearth_sample_workers::bytes("wstd-hello")?,
            "hello from wstd",
        ),
    ];
    c.deploy("app", Plan::Free, versions[0].0.clone()).await?;
    let mut acks = Vec::new();
    let mut deploys = Vec::new();
    let mut stale = 0;
    let mut failed = 0;
    for k in 0..REDEPLOYS {
        // A warm copy on every node.
        for i in 0..3 {
            body_of(&c, i).await?;
        }
        let (src, expect) = &versions[(k + 1) % 2];
        let t = Instant::now();
        let d = c
            .node(k % 3)
            .node
            .deploy("app", Plan::Free, src.clone())
            .await?;
        deploys.push(t.elapsed().as_secs_f64() * 1000.0);
        failed += d.announced.failed.len();
        acks.extend(d.announced.ack_ms.iter().map(|(_, ms)| *ms));
        for i in 0..3 {
            if body_of(&c, i).await? != *expect {
                stale += 1;
            }
        }
    }
    let (acks_d, deploys_d) = (Distribution::of(&acks), Distribution::of(&deploys));
    println!("redeploy propagation, 3 nodes, store: {store}, {REDEPLOYS} redeploys");
    let mut table = Table::new(["", "p50 ms", "p99 ms", "max ms"]);
    for (what, d) in [
        ("store write -> member dropped its copy", &acks_d),
        ("whole deploy (compile, store, announce)", &deploys_d),
    ] {
        table.row([
            what.to_string(),
            format!("{:.2}", d.p50_ms),
            format!("{:.2}", d.p99_ms),
            format!("{:.2}", d.max_ms),
        ]);
    }
    println!("{table}");
    println!(
        "member acknowledgements: {} of {}; stale answers after a deploy returned: {stale} of {}",
        acks.len(),
        2 * REDEPLOYS,
        3 * REDEPLOYS
    );
    anyhow::ensure!(
        failed == 0 && stale == 0,
        "{failed} unannounced, {stale} stale"
    );
    Ok(())
}
