//! What SNI prewarm saves a cold request over HTTPS: time to first byte of
//! a first request to a cold Worker, with prewarm on vs off, on the
//! Worker's home and on a node that forwards it there, side by side in one
//! run.
//!
//! Two 3-node clusters run in this process over one store (so both load
//! the same artifacts): one prewarms from the ClientHello's SNI, one does
//! not. Each sample evicts the Worker on every node of both clusters, then
//! opens a fresh TLS connection (SNI = the Worker's host) to the chosen
//! node and times from the TCP connect to the response head: handshake,
//! request, load and handler. On and off samples alternate, so both see
//! the same machine. A cold start here loads the precompiled artifact (the
//! deploy compiled it), as it does in a running cluster.
//!
//! ```sh
//! cargo bench -p hearth --bench https_prewarm
//! ```
//!
//! On loopback the handshake is short, so there is little time to hide a
//! load behind. A real client is a network round trip or more away, and a
//! TLS 1.3 request arrives at least one round trip after its ClientHello:
//! the rows with an emulated client RTT send every byte through a proxy in
//! this process that delays each direction by half the RTT.
//!
//! Settings: `HEARTH_BENCH_SAMPLES` (per row, 30), `HEARTH_BENCH_RTT_MS`
//! (emulated client round trips, comma-separated, `0,10`).

use std::time::Duration;

use hearth::cluster::ClusterConfig;
use hearth::prewarm::PrewarmConfig;
use hearth::runtime::Plan;
use hearth::testing::{HttpsClient, TestCluster};
use hearth_report::latency::Distribution;

mod support;
use support::env_or;

/// A Worker under test and its plan.
const WORKERS: [(&str, Plan); 2] = [("big", Plan::Paid), ("js", Plan::Paid)];

/// A TCP proxy on loopback that forwards to `upstream`, delaying every
/// chunk by `one_way` in each direction (order kept): a client that far
/// away.
async fn delaying_proxy(
    upstream: std::net::SocketAddr,
    one_way: Duration,
) -> anyhow::Result<std::net::SocketAddr> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move {
        while let Ok((client, _)) = listener.accept().await {
            tokio::spawn(async move {
                let Ok(server) = tokio::net::TcpStream::connect(upstream).await else {
                    return;
                };
                let _ = (client.set_nodelay(true), server.set_nodelay(true));
                let (cr, cw) = client.into_split();
                let (sr, sw) = server.into_split();
                tokio::join!(delay_copy(cr, sw, one_way), delay_copy(sr, cw, one_way));
            });
        }
    });
    Ok(addr)
}

/// Copies `from` to `to`, each chunk `delay` after it was read.
async fn delay_copy(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    delay: Duration,
) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let reader = async move {
        let mut buf = vec![0u8; 64 * 1024];
        while let Ok(n) = from.read(&mut buf).await {
            if n == 0
                || tx
                    .send((tokio::time::Instant::now() + delay, buf[..n].to_vec()))
                    .is_err()
            {
                break;
            }
        }
    };
    let writer = async move {
        while let Some((due, chunk)) = rx.recv().await {
            tokio::time::sleep_until(due).await;
            if to.write_all(&chunk).await.is_err() {
                break;
            }
        }
        let _ = to.shutdown().await;
    };
    tokio::join!(reader, writer);
}

async fn cluster(store: &std::path::Path, prewarm: bool) -> anyhow::Result<TestCluster> {
    let mut cfg = ClusterConfig::new(3, store);
    cfg.prewarm = PrewarmConfig {
        enabled: prewarm,
        ..PrewarmConfig::default()
    };
    Ok(TestCluster::with_config(cfg, None).await?)
}

fn evict_everywhere(clusters: &[&TestCluster], id: &str) {
    for c in clusters {
        for n in c.nodes() {
            n.node.runtime().evict(id);
        }
    }
}

/// The sum of a `server-timing` value's phases but the shard hop.
fn worker_phases_ms(server_timing: &str) -> f64 {
    server_timing
        .split(',')
        .filter(|m| !m.trim_start().starts_with("shard;"))
        .filter_map(|m| m.split_once("dur=")?.1.trim().parse::<f64>().ok())
        .sum()
}

struct Row {
    rtt_ms: u64,
    worker: &'static str,
    node: &'static str,
    prewarm: bool,
    ttfb_ms: Vec<f64>,
    /// The Worker's phases as `server-timing` reports them (fetch,
    /// compile, instantiate, handler; not the shard hop).
    worker_ms: Vec<f64>,
    starts: std::collections::BTreeMap<String, usize>,
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> anyhow::Result<()> {
    let samples = env_or("HEARTH_BENCH_SAMPLES", 30) as usize;
    let dir = tempfile::tempdir()?;
    let on = cluster(dir.path(), true).await?;
    let off = cluster(dir.path(), false).await?;
    for (id, plan) in WORKERS {
        let wasm = hearth_sample_workers::bytes(id)?;
        on.deploy(id, plan, wasm).await?;
    }
    let tls = HttpsClient::trusting(on.tls_ca().expect("HTTPS"))?;
    let rtts: Vec<u64> = std::env::var("HEARTH_BENCH_RTT_MS")
        .unwrap_or_else(|_| "0,10".into())
        .split(',')
        .filter_map(|v| v.trim().parse().ok())
        .collect();
    let mut rows = Vec::new();
    for rtt_ms in rtts {
        for (id, _) in WORKERS {
            let host = format!("{id}.localhost");
            // Both clusters hash the same node names, so homes agree.
            let home = on.home_of(id).expect("home");
            let other = (home + 1) % 3;
            for (node_name, node) in [("home", home), ("non-home", other)] {
                let mut via = Vec::new();
                for c in [&on, &off] {
                    let addr = c.node(node).https_addr.expect("HTTPS");
                    via.push(if rtt_ms == 0 {
                        addr
                    } else {
                        delaying_proxy(addr, Duration::from_micros(rtt_ms * 500)).await?
                    });
                }
                let mut pair = [true, false].map(|prewarm| Row {
                    rtt_ms,
                    worker: id,
                    node: node_name,
                    prewarm,
                    ttfb_ms: Vec::new(),
                    worker_ms: Vec::new(),
                    starts: Default::default(),
                });
                // One unmeasured request each, so the artifact's first-load
                // check is behind both.
                for &addr in &via {
                    evict_everywhere(&[&on, &off], id);
                    tls.send(addr, &host, &host, "/", true).await?;
                }
                for _ in 0..samples {
                    for (row, &addr) in pair.iter_mut().zip(&via) {
                        evict_everywhere(&[&on, &off], id);
                        tokio::time::sleep(Duration::from_millis(20)).await;
                        let r = tls.send(addr, &host, &host, "/", true).await?;
                        anyhow::ensure!(
                            r.response.status == 200,
                            "{id}: {} {}",
                            r.response.status,
                            r.response.text()
                        );
                        row.ttfb_ms.push(r.ttfb.as_secs_f64() * 1000.0);
                        row.worker_ms
                            .push(worker_phases_ms(r.response.header("server-timing")));
                        *row.starts
                            .entry(r.response.header("x-hearth-start").to_string())
                            .or_default() += 1;
                    }
                }
                rows.extend(pair);
            }
        }
    }
    println!(
        "First request to a cold Worker over HTTPS (HTTP/2), TTFB from TCP connect, \
         {samples} samples per row, one run:\n"
    );
    println!(
        "| client RTT (ms) | Worker | request lands on | SNI prewarm | TTFB p50 (ms) | p90 (ms) | min (ms) | Worker phases in the request, p50 (ms) | x-hearth-start |"
    );
    println!("|---:|---|---|---|---:|---:|---:|---:|---|");
    for r in &rows {
        let d = Distribution::of(&r.ttfb_ms);
        let starts: Vec<String> = r.starts.iter().map(|(k, n)| format!("{k} ×{n}")).collect();
        println!(
            "| {} | {} | {} | {} | {:.2} | {:.2} | {:.2} | {:.2} | {} |",
            r.rtt_ms,
            r.worker,
            r.node,
            if r.prewarm { "on" } else { "off" },
            d.p50_ms,
            d.p90_ms,
            d.min_ms,
            Distribution::of(&r.worker_ms).p50_ms,
            starts.join(", ")
        );
    }
    println!();
    for pair in rows.chunks(2) {
        if let [with, without] = pair {
            let (a, b) = (
                Distribution::of(&with.ttfb_ms).p50_ms,
                Distribution::of(&without.ttfb_ms).p50_ms,
            );
            println!(
                "RTT {} ms, {} on {}: prewarm saves {:.2} ms of {:.2} ms at p50 ({:.0}%)",
                with.rtt_ms,
                with.worker,
                with.node,
                b - a,
                b,
                100.0 * (b - a) / b
            );
        }
    }
    Ok(())
}
