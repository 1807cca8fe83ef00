//! Latency the shard hop adds, and throughput, for `hello` on a 3-node
//! loopback cluster: the same Worker served by the node that received the
//! request (it is the home) vs forwarded to the home, in one run.
//!
//! `cargo bench -p hearth --bench shard_hop`

use std::time::{Duration, Instant};

use hearth::runtime::Plan;
use hearth::testing::TestCluster;

fn pct(v: &mut [Duration], p: f64) -> Duration {
    v.sort();
    v[((v.len() - 1) as f64 * p).round() as usize]
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> anyhow::Result<()> {
    let c = TestCluster::start(3).await?;
    c.deploy("hello", Plan::Free, hearth_sample_workers::bytes("hello")?)
        .await?;
    let home = c
        .home_of("hello")
        .ok_or_else(|| anyhow::anyhow!("no home"))?;
    let other = (home + 1) % 3;
    // Warm it at the home.
    c.get(home, "hello", "/").await?;
    let n = 2000;
    let mut rows = Vec::new();
    for (name, node) in [
        ("local (request lands on the home)", home),
        ("sharded (forwarded to the home)", other),
    ] {
        for _ in 0..200 {
            c.get(node, "hello", "/").await?;
        }
        let mut lat = Vec::with_capacity(n);
        let t0 = Instant::now();
        for _ in 0..n {
            let t = Instant::now();
            let r = c.get(node, "hello", "/").await?;
            anyhow::ensure!(r.status == 200, "request failed: {}", r.text());
            lat.push(t.elapsed());
        }
        let total = t0.elapsed();
        rows.push((
            name,
            pct(&mut lat, 0.5),
            pct(&mut lat, 0.99),
            n as f64 / total.as_secs_f64(),
        ));
    }
    println!("| route | p50 (µs) | p99 (µs) | requests/s (1 client) |");
    println!("|---|---|---|---|");
    for (name, p50, p99, rps) in &rows {
        println!(
            "| {name} | {:.0} | {:.0} | {:.0} |",
            p50.as_secs_f64() * 1e6,
            p99.as_secs_f64() * 1e6,
            rps
        );
    }
    println!(
        "\nadded by the hop: p50 {:.0} µs, p99 {:.0} µs",
        (rows[1].1.as_secs_f64() - rows[0].1.as_secs_f64()) * 1e6,
        (rows[1].2.as_secs_f64() - rows[0].2.as_secs_f64()) * 1e6
    );
    Ok(())
}
