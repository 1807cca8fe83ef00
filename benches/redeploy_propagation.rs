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
//!
//! Then as many rollbacks (`hearth rollback`: the current deployment
//! points at an earlier version, [`hearth::runtime::store::versions`]), through
//! each node in turn, alternating between the last two versions: announced
//! the same way, measured the same way.

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
    // Rollbacks: version n is versions[(n - 1) % 2]; alternate between the
    // two newest.
    let latest = REDEPLOYS as u64 + 1;
    let mut rb_acks = Vec::new();
    let mut rollbacks = Vec::new();
    for k in 0..REDEPLOYS {
        for i in 0..3 {
            body_of(&c, i).await?;
        }
        let target = if k % 2 == 0 { latest - 1 } else { latest };
        let expect = versions[((target - 1) % 2) as usize].1;
        let t = Instant::now();
        let d = c.node(k % 3).node.rollback("app", Some(target)).await?;
        rollbacks.push(t.elapsed().as_secs_f64() * 1000.0);
        failed += d.announced.failed.len();
        rb_acks.extend(d.announced.ack_ms.iter().map(|(_, ms)| *ms));
        for i in 0..3 {
            if body_of(&c, i).await? != expect {
                stale += 1;
            }
        }
    }
    let (acks_d, deploys_d) = (Distribution::of(&acks), Distribution::of(&deploys));
    let (rb_acks_d, rollbacks_d) = (Distribution::of(&rb_acks), Distribution::of(&rollbacks));
    println!("redeploy propagation, 3 nodes, store: {store}, {REDEPLOYS} redeploys");
    let mut table = Table::new(["", "p50 ms", "p99 ms", "max ms"]);
    for (what, d) in [
        ("store write -> member dropped its copy", &acks_d),
        ("whole deploy (compile, store, announce)", &deploys_d),
        (
            "rollback: store write -> member dropped its copy",
            &rb_acks_d,
        ),
        ("whole rollback (store, announce)", &rollbacks_d),
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
        "member acknowledgements: {} of {}; stale answers after a deploy or rollback returned: \
         {stale} of {}",
        acks.len() + rb_acks.len(),
        4 * REDEPLOYS,
        6 * REDEPLOYS
    );
    anyhow::ensure!(
        failed == 0 && stale == 0,
        "{failed} unannounced, {stale} stale"
    );
    Ok(())
}
