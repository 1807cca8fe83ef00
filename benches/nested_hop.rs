//! Added latency of one nested Worker call (a service binding), on the same
//! node and across nodes: `cargo bench -p hearth --bench nested_hop`.
//!
//! Three in-process nodes (`hearth::testing::TestCluster`: real HTTP, Cap'n
//! Proto over mTLS on loopback). `relay` Workers: a lone one (it tries its
//! binding `next`, is denied, and answers) is the baseline; a pair `a → b`
//! (b a lone relay) adds exactly one nested call. The pair is measured with
//! `b` on `a`'s node and on another node; one client connection, requests to
//! `a`'s home, the three kinds interleaved, warm. Prints a table.
//!
//! `cargo bench -p hearth --bench nested_hop -- egress` measures the egress
//! path instead (`hearth_runtime::outbound::egress`): one node allowed to reach
//! private addresses, a local origin on 127.0.0.1, and the `fetcher`
//! Worker (warm) fetching it through its allow-list, against the same
//! origin requested directly; one client connection, interleaved.

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
    if std::env::args().any(|a| a == "egress") {
        rt.block_on(egress())
    } else {
        rt.block_on(run())
    }
}

/// A local origin that answers every request `hello from origin`.
async fn origin() -> anyhow::Result<std::net::SocketAddr> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(|_req| async {
                    Ok::<_, std::convert::Infallible>(http::Response::new(
                        http_body_util::Full::new(bytes::Bytes::from_static(b"hello from origin")),
                    ))
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    Ok(addr)
}

/// The egress mode (see the module docs).
async fn egress() -> anyhow::Result<()> {
    use http_body_util::BodyExt;
    let addr = origin().await?;
    let dir = tempfile::tempdir()?;
    let mut cfg = hearth::cluster::ClusterConfig::new(1, dir.path());
    cfg.https = false;
    cfg.runtime = std::sync::Arc::new(|c| {
        c.instance_pool_size(16)
            .egress(hearth::runtime::outbound::egress::EgressConfig {
                allow_private_addresses: true,
                ..Default::default()
            })
    });
    let c = TestCluster::with_config(cfg, None).await?;
    let mut m = Manifest::default();
    m.bindings.allowed_hosts = vec![format!("http://{addr}")];
    c.deploy_manifest("fetcher", m, hearth_sample_workers::bytes("fetcher")?)
        .await?;
    let url = format!("http://{addr}/hello");
    let direct = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http::<http_body_util::Empty<bytes::Bytes>>();
    let via_worker = || async {
        let r = c
            .send(
                0,
                "fetcher",
                http::Method::GET,
                "/",
                bytes::Bytes::new(),
                &[("x-fetch", &url)],
            )
            .await?;
        anyhow::ensure!(r.text() == "200 hello from origin\n", "{}", r.text());
        Ok(())
    };
    let straight = || async {
        let r = direct.get(url.parse()?).await?;
        let body = r.into_body().collect().await?.to_bytes();
        anyhow::ensure!(&body[..] == b"hello from origin", "{body:?}");
        Ok(())
    };
    for _ in 0..100 {
        via_worker().await?;
        straight().await?;
    }
    let mut samples = [Vec::with_capacity(REQUESTS), Vec::with_capacity(REQUESTS)];
    let mut spent = [Duration::ZERO; 2];
    for _ in 0..REQUESTS {
        let t = Instant::now();
        straight().await?;
        samples[0].push(t.elapsed());
        let t = Instant::now();
        via_worker().await?;
        samples[1].push(t.elapsed());
    }
    for (i, s) in samples.iter_mut().enumerate() {
        spent[i] = s.iter().sum();
        s.sort();
    }
    println!("\n{REQUESTS} requests each, 1 connection each, interleaved, one in-process node\n");
    println!("| request | requests/s | p50 (µs) | p99 (µs) |");
    println!("|---|---:|---:|---:|");
    for (i, name) in [
        "the origin, directly",
        "a warm Worker fetching the origin (allow-list, pooled)",
    ]
    .iter()
    .enumerate()
    {
        println!(
            "| {name} | {:.0} | {:.0} | {:.0} |",
            REQUESTS as f64 / spent[i].as_secs_f64(),
            pct(&samples[i], 0.5),
            pct(&samples[i], 0.99)
        );
    }
    let s = c.stats(0).runtime.subrequests;
    println!("\nsubrequests: {} ok, {} failed", s.ok, s.error + s.timeout);
    drop(c);
    Ok(())
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
