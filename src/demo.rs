//! `hearth demo`: the main job. A 3-node in-process cluster on loopback with
//! a small per-node memory budget, a few hundred distinct Workers, and the
//! same Zipf-distributed traffic run twice: once with sharding off (each
//! request to a random node, as a plain load balancer would) and once with
//! sharding on. Prints the two side by side.
//!
//! `hearth demo objects` ([`objects`]) is the second demo: Durable Objects
//! spread over the ring, and surviving the loss of a node.

use std::time::{Duration, Instant};

use bytes::Bytes;
use rand::{RngExt, SeedableRng};
use serde::Serialize;

use hearth_report::latency::Distribution;
use hearth_report::table::Table;
use hearth_runtime::Plan;

use crate::cluster::ClusterConfig;
use crate::plot::{Panel, Series};
use crate::testing::{TestCluster, TestError};
use hearth_simulate::Zipf;

pub mod objects;

/// Why the demo stopped: bad flags, or the step that failed and its cause.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DemoError {
    /// A flag is out of range; the message names it.
    #[error("{0}")]
    Usage(&'static str),
    /// The sample Worker could not be read.
    #[error("reading the hello sample Worker")]
    Sample(#[source] std::io::Error),
    /// The cluster failed to start or refused a deploy.
    #[error(transparent)]
    Cluster(#[from] TestError),
    /// The probe runtime that measures one Worker's memory did not start.
    #[error("measuring one Worker's memory")]
    ProbeRuntime(#[source] hearth_runtime::ConfigError),
    /// The probe runtime refused the sample Worker.
    #[error("measuring one Worker's memory")]
    ProbeDeploy(#[source] hearth_runtime::DeployError),
    /// A request task panicked.
    #[error(transparent)]
    Task(#[from] tokio::task::JoinError),
    /// A temporary directory, the JSON or the plot could not be written.
    #[error(transparent)]
    Io(#[from] std::io::Error),
    /// The report could not be encoded as JSON.
    #[error(transparent)]
    Json(#[from] serde_json::Error),
    /// A step of the demo did not go as it must; the message says which.
    #[error("{0}")]
    Failed(String),
}

/// Flags of `hearth demo`.
#[derive(clap::Args, Debug, Clone)]
pub struct DemoArgs {
    /// Another demo instead of the sharding one.
    #[command(subcommand)]
    pub other: Option<OtherDemo>,
    /// Nodes in the cluster.
    #[arg(long, default_value_t = 3)]
    pub nodes: usize,
    /// Distinct Workers deployed (the `hello` sample under many names).
    #[arg(long, default_value_t = 300)]
    pub workers: usize,
    /// Requests per mode.
    #[arg(long, default_value_t = 20000)]
    pub requests: usize,
    /// Zipf exponent of Worker popularity.
    #[arg(long, default_value_t = 1.1)]
    pub exponent: f64,
    /// Warm Workers a node's memory budget holds (budget = this × one
    /// hello's measured resident bytes).
    #[arg(long, default_value_t = 120)]
    pub budget_workers: u64,
    /// Requests in flight at once.
    #[arg(long, default_value_t = 4)]
    pub concurrency: usize,
    /// Random seed (same seed, same traffic in both modes).
    #[arg(long, default_value_t = 42)]
    pub seed: u64,
    /// Also write the table as JSON here.
    #[arg(long)]
    pub json: Option<std::path::PathBuf>,
    /// Where to write the PNG plot of warm rate and evictions over time.
    #[arg(long, default_value = "hearth-demo.png")]
    pub plot: std::path::PathBuf,
}

/// The other demos `hearth demo` runs.
#[derive(clap::Subcommand, Debug, Clone)]
pub enum OtherDemo {
    /// Durable Objects spread over the ring, and surviving a node's loss.
    Objects(objects::ObjectsDemoArgs),
}

impl DemoArgs {
    /// Refuses flags the demo cannot run with, naming the flag.
    fn check(&self) -> Result<(), DemoError> {
        let rules = [
            (self.nodes >= 1, "--nodes must be at least 1"),
            (self.workers >= 1, "--workers must be at least 1"),
            (self.requests >= 1, "--requests must be at least 1"),
            (self.concurrency >= 1, "--concurrency must be at least 1"),
            (
                self.budget_workers >= 1,
                "--budget-workers must be at least 1",
            ),
            (
                self.exponent.is_finite() && self.exponent >= 0.0,
                "--exponent must be a number >= 0",
            ),
        ];
        match rules.iter().find(|(ok, _)| !ok) {
            Some((_, msg)) => Err(DemoError::Usage(msg)),
            None => Ok(()),
        }
    }
}

/// The state of one mode after a slice of its requests.
#[derive(Debug, Clone, Default, Serialize)]
pub struct TimePoint {
    /// Requests sent so far.
    pub requests: u64,
    /// Warm rate over the last slice.
    pub warm_rate: f64,
    /// Evictions so far, over all nodes.
    pub evictions: u64,
}

/// One mode's results.
#[derive(Debug, Clone, Default, Serialize)]
pub struct ModeReport {
    /// Requests sent.
    pub requests: u64,
    /// Requests that found their Worker warm.
    pub warm: u64,
    /// Requests that cold-started their Worker.
    pub cold: u64,
    /// Requests that failed (non-2xx).
    pub failed: u64,
    /// Evictions over all nodes (pressure + idle).
    pub evictions: u64,
    /// Evictions per 1000 requests.
    pub evictions_per_1k: f64,
    /// Requests served by their home for another node.
    pub sharded: u64,
    /// Refusals by overloaded homes.
    pub refusals: u64,
    /// Bytes resident over all nodes at the end.
    pub resident_bytes: u64,
    /// Warm request latency p50 ([`Distribution`], as `hearth bench`), ms.
    pub warm_p50_ms: f64,
    /// Warm p99, ms.
    pub warm_p99_ms: f64,
    /// Cold request latency p50, ms.
    pub cold_p50_ms: f64,
    /// Cold p99, ms.
    pub cold_p99_ms: f64,
    /// Wall time of the mode, s.
    pub seconds: f64,
    /// Warm rate and evictions over time (40 slices).
    pub timeline: Vec<TimePoint>,
}

/// Both modes.
#[derive(Debug, Clone, Serialize)]
pub struct DemoReport {
    /// Sharding off.
    pub unsharded: ModeReport,
    /// Sharding on.
    pub sharded: ModeReport,
}

async fn run_mode(
    args: &DemoArgs,
    sharding: bool,
    budget: u64,
    bar: &indicatif::ProgressBar,
) -> Result<ModeReport, DemoError> {
    let dir = tempfile::tempdir()?;
    let mut cfg = ClusterConfig::new(args.nodes, dir.path());
    cfg.sharding = sharding;
    cfg.runtime = std::sync::Arc::new(move |c| c.memory_budget(budget).instance_pool_size(400));
    let c = TestCluster::with_config(cfg, Some(dir)).await?;
    let wasm = hearth_sample_workers::bytes("hello").map_err(DemoError::Sample)?;
    for w in 0..args.workers {
        c.deploy(&format!("w{w}"), Plan::Free, wasm.clone()).await?;
    }
    let zipf = Zipf::new(args.workers, args.exponent);
    let mut rng = rand::rngs::StdRng::seed_from_u64(args.seed);
    let plan: Vec<(usize, usize)> = (0..args.requests)
        .map(|_| {
            (
                zipf.sample(&mut rng) as usize,
                rng.random_range(0..args.nodes),
            )
        })
        .collect();
    let t0 = Instant::now();
    let c = std::sync::Arc::new(c);
    let mut report = ModeReport::default();
    let (mut warm_ms, mut cold_ms) = (Vec::new(), Vec::new());
    let slice = (args.requests / 40).max(1) as u64;
    let mut slice_warm = 0u64;
    let evictions = |c: &TestCluster| -> u64 {
        (0..args.nodes)
            .map(|i| {
                let s = c.stats(i).runtime;
                s.evicted_pressure + s.evicted_idle
            })
            .sum()
    };
    for chunk in plan.chunks(args.concurrency.max(1)) {
        let tasks: Vec<_> = chunk
            .iter()
            .map(|&(w, n)| {
                let c = c.clone();
                tokio::spawn(async move {
                    let t = Instant::now();
                    let r = c
                        .send(
                            n,
                            &format!("w{w}"),
                            http::Method::GET,
                            "/",
                            Bytes::new(),
                            &[],
                        )
                        .await;
                    (r, t.elapsed())
                })
            })
            .collect();
        for t in tasks {
            let (r, d) = t.await?;
            report.requests += 1;
            bar.inc(1);
            match r {
                Ok(r) if r.status == 200 => {
                    if r.header("x-hearth-route") == "sharded" {
                        report.sharded += 1;
                    }
                    if r.header("x-hearth-start") == "cold" {
                        report.cold += 1;
                        cold_ms.push(d.as_secs_f64() * 1e3);
                    } else {
                        report.warm += 1;
                        slice_warm += 1;
                        warm_ms.push(d.as_secs_f64() * 1e3);
                    }
                }
                _ => report.failed += 1,
            }
            if report.requests % slice == 0 {
                report.timeline.push(TimePoint {
                    requests: report.requests,
                    warm_rate: 100.0 * slice_warm as f64 / slice as f64,
                    evictions: evictions(&c),
                });
                slice_warm = 0;
            }
        }
    }
    report.seconds = t0.elapsed().as_secs_f64();
    for i in 0..args.nodes {
        let s = c.stats(i);
        report.evictions += s.runtime.evicted_pressure + s.runtime.evicted_idle;
        report.refusals += s.rpc.refusals_received;
        report.resident_bytes += s.runtime.resident_bytes;
    }
    report.evictions_per_1k = report.evictions as f64 * 1000.0 / report.requests.max(1) as f64;
    let (warm, cold) = (Distribution::of(&warm_ms), Distribution::of(&cold_ms));
    (report.warm_p50_ms, report.warm_p99_ms) = (warm.p50_ms, warm.p99_ms);
    (report.cold_p50_ms, report.cold_p99_ms) = (cold.p50_ms, cold.p99_ms);
    if let Ok(c) = std::sync::Arc::try_unwrap(c) {
        tokio::time::timeout(Duration::from_secs(5), async move { drop(c) })
            .await
            .ok();
    }
    Ok(report)
}

/// Measures one hello's resident bytes on a throwaway runtime.
async fn one_worker_bytes() -> Result<u64, DemoError> {
    let dir = tempfile::tempdir()?;
    let rt = hearth_runtime::Runtime::new(
        hearth_runtime::RuntimeConfig::new(dir.path()).instance_pool_size(4),
    )
    .map_err(DemoError::ProbeRuntime)?;
    let wasm = hearth_sample_workers::bytes("hello").map_err(DemoError::Sample)?;
    rt.deploy("probe", Plan::Free, wasm)
        .await
        .map_err(DemoError::ProbeDeploy)?;
    let mut req = http::Request::new(hearth_runtime::body::full(""));
    *req.uri_mut() = http::Uri::from_static("http://probe.localhost/");
    let _ = rt.serve("probe", req).await;
    Ok(rt.stats().resident_bytes)
}

/// Runs the demo and prints the table.
pub async fn run(args: DemoArgs) -> Result<DemoReport, DemoError> {
    args.check()?;
    let one = one_worker_bytes().await?;
    let budget = one * args.budget_workers;
    println!(
        "hearth demo: {} nodes, {} Workers, {} requests per mode, Zipf s={}, node memory budget {} KiB ({} Workers of {} KiB)",
        args.nodes,
        args.workers,
        args.requests,
        args.exponent,
        budget / 1024,
        args.budget_workers,
        one / 1024
    );
    let bar = indicatif::ProgressBar::new((2 * args.requests) as u64);
    bar.set_style(
        indicatif::ProgressStyle::with_template("{bar:40} {pos}/{len} requests {elapsed} {msg}")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    bar.set_message("sharding off");
    let unsharded = run_mode(&args, false, budget, &bar).await?;
    bar.set_message("sharding on");
    let sharded = run_mode(&args, true, budget, &bar).await?;
    bar.finish_and_clear();
    let report = DemoReport { unsharded, sharded };
    println!("{}", table(&report));
    if let Some(p) = &args.json {
        std::fs::write(p, serde_json::to_vec_pretty(&report)?)?;
        println!("wrote {}", p.display());
    }
    plot(&report, &args.plot)?;
    println!("wrote plot {}", args.plot.display());
    Ok(report)
}

/// Warm rate and evictions over time, both modes, as a PNG.
pub fn plot(r: &DemoReport, path: &std::path::Path) -> std::io::Result<()> {
    let modes = [
        ("sharding off", [200, 60, 40], &r.unsharded),
        ("sharding on", [30, 110, 200], &r.sharded),
    ];
    let series = |f: &dyn Fn(&TimePoint) -> f64| -> Vec<Series> {
        modes
            .iter()
            .map(|(name, color, m)| Series {
                name: name.to_string(),
                color: *color,
                points: m
                    .timeline
                    .iter()
                    .map(|p| (p.requests as f64, f(p)))
                    .collect(),
            })
            .collect()
    };
    crate::plot::write_png(
        path,
        &[
            Panel {
                title: "warm rate per slice of requests".into(),
                y_label: "warm rate (%)".into(),
                series: series(&|p| p.warm_rate),
            },
            Panel {
                title: "evictions so far, all nodes".into(),
                y_label: "evictions".into(),
                series: series(&|p| p.evictions as f64),
            },
        ],
        "requests sent",
    )
}

/// The side-by-side table.
pub fn table(r: &DemoReport) -> String {
    let (u, s) = (&r.unsharded, &r.sharded);
    let rate = |m: &ModeReport| 100.0 * m.warm as f64 / m.requests.max(1) as f64;
    let rows: Vec<(&str, String, String)> = vec![
        ("requests", u.requests.to_string(), s.requests.to_string()),
        (
            "warm rate",
            format!("{:.2}%", rate(u)),
            format!("{:.2}%", rate(s)),
        ),
        ("cold starts", u.cold.to_string(), s.cold.to_string()),
        ("failed", u.failed.to_string(), s.failed.to_string()),
        (
            "evictions",
            u.evictions.to_string(),
            s.evictions.to_string(),
        ),
        (
            "evictions / 1k requests",
            format!("{:.1}", u.evictions_per_1k),
            format!("{:.1}", s.evictions_per_1k),
        ),
        (
            "fraction sharded",
            format!(
                "{:.1}%",
                100.0 * u.sharded as f64 / u.requests.max(1) as f64
            ),
            format!(
                "{:.1}%",
                100.0 * s.sharded as f64 / s.requests.max(1) as f64
            ),
        ),
        ("refusals", u.refusals.to_string(), s.refusals.to_string()),
        (
            "resident memory (KiB)",
            (u.resident_bytes / 1024).to_string(),
            (s.resident_bytes / 1024).to_string(),
        ),
        (
            "warm p50 / p99 (ms)",
            format!("{:.2} / {:.2}", u.warm_p50_ms, u.warm_p99_ms),
            format!("{:.2} / {:.2}", s.warm_p50_ms, s.warm_p99_ms),
        ),
        (
            "cold p50 / p99 (ms)",
            format!("{:.2} / {:.2}", u.cold_p50_ms, u.cold_p99_ms),
            format!("{:.2} / {:.2}", s.cold_p50_ms, s.cold_p99_ms),
        ),
        (
            "wall time (s)",
            format!("{:.1}", u.seconds),
            format!("{:.1}", s.seconds),
        ),
    ];
    let mut table = Table::new(["measure", "sharding off", "sharding on"]);
    for (k, a, b) in rows {
        table.row([k.to_string(), a, b]);
    }
    table.to_string()
}
