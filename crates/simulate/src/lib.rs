//! # hearth-simulate
//!
//! `hearth simulate`: a discrete-event simulator of one data center, run
//! with and without Worker sharding on the same traffic.
//!
//! # Model
//!
//! A data center is `servers` servers behind a load balancer, each holding
//! warm Workers in a [`Residency`](hearth_residency::Residency) with
//! a `memory_mb` budget — the very type, LRU order, pressure eviction and
//! idle sweep of the live runtime. Requests for `workers` Workers arrive at
//! random servers (see [`model`] for popularity, sizes, durations and
//! arrivals). The same request stream is replayed in two modes:
//!
//! * **unsharded** — the plain load balancer of the article's "before": each
//!   server serves what it receives, cold-starting the Worker if it is not
//!   resident there;
//! * **sharded** — each server makes the live node's routing decision
//!   ([`hearth_sharding::routing::decide`]) with the Worker's home from the
//!   live node's ring ([`hearth_sharding::ring::Ring`], default virtual
//!   nodes, servers named `server-0000`, …); a forwarded request is admitted
//!   or refused by the home's admission control
//!   ([`hearth_sharding::admission::OverloadConfig`] thresholds, plus "can host
//!   without evicting a Worker used in the last `busy_window_ms`"), and a
//!   refused one is served — and stays warm — on the receiving server
//!   ([`hearth_sharding::routing::after_forward`]).
//!
//! Nothing about the policy is re-implemented: the simulator owns only the
//! clock, the request stream, and the in-flight counters that the live
//! node's `OverloadGate` keeps (it counts sharded requests admitted at a home
//! until they complete). See [`engine`] for the event loop.
//!
//! A cold start makes the Worker resident at once (its memory is charged
//! from the start of the load) and ready `cold_start_ms` later; requests
//! that arrive at that server meanwhile wait for it and count as cold, as in
//! the runtime, which coalesces them onto the one load.
//!
//! (In the live node a Worker still loading is not yet `is_warm`, so a
//! request reaching a non-home server during the load would be forwarded to
//! the home instead; the difference is a handful of requests per run.)
//!
//! The first `warmup` fraction of requests fills the caches and is not
//! counted: the report describes the steady state, like the article's
//! day-long production numbers, rather than the compulsory cold start of
//! every Worker at power-on.
//!
//! # Policy options beyond the live node
//!
//! Off by default, so that the default run measures the live policy:
//!
//! * `--prewarm-home`: after a fallback cold start on the receiving server,
//!   also load the Worker at its home (if the home has room without evicting
//!   busy Workers). Counted as `prewarm_loads`, not as cold starts.
//! * `--idle-sweep-above F`: run the idle sweep only on a server holding at
//!   least `F` of its budget, so idle Workers stay warm while memory is
//!   plentiful. This is what takes the sharded data center to five nines in
//!   `docs/simulate-results.md`; in the runtime it is one condition of its
//!   idle sweep (`hearth_runtime::eviction`), with `Residency` unchanged.
//!
//! # Measures
//!
//! For each mode a [`ModeReport`]: requests, warm rate, cold starts (and what
//! caused them), evictions by cause and per server-hour, routes and the
//! fraction of requests sharded, refusals by reason, and resident memory
//! (mean over time and servers, and peak). [`SimReport::table`] puts the two
//! modes side by side.
//!
//! # Example
//!
//! ```
//! use hearth_simulate::{run, SimulateArgs};
//!
//! let args = SimulateArgs {
//!     servers: 4,
//!     workers: 50,
//!     requests: Some(2_000),
//!     memory_mb: 64,
//!     rate: 100.0,
//!     ..SimulateArgs::default()
//! };
//! let report = run(&args).unwrap();
//! assert_eq!(report.sharded.requests, report.unsharded.requests);
//! assert!(report.sharded.warm_rate >= report.unsharded.warm_rate);
//! ```

pub mod engine;
pub mod model;
pub mod trace;

use std::collections::HashMap;
use std::fmt::Write as _;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::time::Instant;

use hearth_report::table::{Align, Table};
use hearth_sharding::admission::OverloadConfig;
use hearth_sharding::ring::{Member, NodeId, Ring, RingConfig, RingError};
use serde::Serialize;

use crate::trace::TraceFormat;
pub use engine::{ColdCauses, ModeReport, Refusals, RouteCounts};
use engine::{Mode, World, run_mode};
use model::{Arrivals, MedianLogNormal, WorkerModel};
pub use model::{Balancer, Zipf};

/// Default number of servers: one data center of the article's size.
pub const DEFAULT_SERVERS: u32 = 300;
/// Default number of Workers.
pub const DEFAULT_WORKERS: u32 = 100_000;
/// Default Zipf exponent of Worker popularity.
///
/// 1.2: a generic Internet power law, a little steeper than the s ≈ 1 of
/// real serverless popularity (the Azure 2019 sample, whose top 1% of
/// functions take 46% of invocations, is close to s = 1). At this exponent
/// 100,000 Workers cannot be kept warm per server with any realistic
/// budget, so both modes are far below the article's nines; the article's
/// 99.9% baseline implies enterprise traffic concentrated like s ≈ 2 (see
/// `docs/simulate-results.md`).
pub const DEFAULT_EXPONENT: f64 = 1.2;
/// Default number of requests simulated (including the warm-up) when no
/// trace is given: 10^7, a few seconds per mode (about 0.3–1.2 µs per
/// request, depending on how often caches churn).
pub const DEFAULT_REQUESTS: u64 = 10_000_000;
/// Default memory budget per server for warm Workers, MiB.
pub const DEFAULT_MEMORY_MB: u64 = 2048;
/// Default arrival rate for the whole data center, requests per second:
/// with [`DEFAULT_REQUESTS`] and [`DEFAULT_WARMUP`] the default run spans
/// 1,000 s of virtual time, of which the first 300 s (one idle timeout)
/// warm up.
pub const DEFAULT_RATE: f64 = 10_000.0;
/// Default idle timeout, seconds (the runtime's default).
pub const DEFAULT_IDLE_TIMEOUT_S: u64 = 300;
/// Default busy window, ms: a home refuses rather than evict a Worker used
/// this recently (the runtime's default).
pub const DEFAULT_BUSY_WINDOW_MS: u64 = 1000;
/// Default median Worker memory size, MiB.
pub const DEFAULT_SIZE_MEDIAN_MB: f64 = 8.0;
/// Default log-normal shape of Worker memory sizes.
pub const DEFAULT_SIZE_SIGMA: f64 = 0.8;
/// Default median of the Workers' mean request durations, ms.
pub const DEFAULT_DURATION_MS: f64 = 50.0;
/// Default log-normal shape of the Workers' mean request durations.
pub const DEFAULT_DURATION_SIGMA: f64 = 1.0;
/// Default cold-start time (fetch, compile, instantiate), ms.
pub const DEFAULT_COLD_START_MS: u64 = 100;
/// Default fraction of requests used to warm up and not counted. A warm-up
/// at least as long as the idle timeout makes the counted part steady
/// state: a Worker first seen after it has had no request for a whole idle
/// timeout, so it would be cold in a data center that had run forever too.
pub const DEFAULT_WARMUP: f64 = 0.3;
/// Default seed.
pub const DEFAULT_SEED: u64 = 1;

/// Flags of `hearth simulate` (and the whole configuration of a run).
#[derive(clap::Args, Debug, Clone, PartialEq, Serialize)]
pub struct SimulateArgs {
    /// Servers in the data center.
    #[arg(long, default_value_t = DEFAULT_SERVERS)]
    pub servers: u32,
    /// Workers (ignored with --trace, which names its own).
    #[arg(long, default_value_t = DEFAULT_WORKERS)]
    pub workers: u32,
    /// Zipf exponent s of Worker popularity: rank k gets a share ∝ k^-s.
    #[arg(long, default_value_t = DEFAULT_EXPONENT)]
    pub exponent: f64,
    /// Requests to simulate, warm-up included [default: 10^7, or the whole
    /// trace with --trace].
    #[arg(long)]
    pub requests: Option<u64>,
    /// Memory budget per server for warm Workers, MiB.
    #[arg(long, default_value_t = DEFAULT_MEMORY_MB)]
    pub memory_mb: u64,
    /// Poisson arrival rate for the whole data center, requests/s (ignored
    /// with --trace).
    #[arg(long, default_value_t = DEFAULT_RATE)]
    pub rate: f64,
    /// Evict a Worker unused for this long, seconds.
    #[arg(long, default_value_t = DEFAULT_IDLE_TIMEOUT_S)]
    pub idle_timeout_s: u64,
    /// A home refuses a sharded request when the Worker already has this
    /// many sharded requests in flight there.
    #[arg(long, default_value_t = OverloadConfig::default().max_in_flight_per_worker)]
    pub max_in_flight_per_worker: usize,
    /// A home refuses a sharded request when it has this many sharded
    /// requests in flight.
    #[arg(long, default_value_t = OverloadConfig::default().max_in_flight_node)]
    pub max_in_flight_node: usize,
    /// A home refuses rather than evict a Worker used within this window, ms.
    #[arg(long, default_value_t = DEFAULT_BUSY_WINDOW_MS)]
    pub busy_window_ms: u64,
    /// Median Worker memory size, MiB (log-normal, clamped to 1..=128 MiB).
    #[arg(long, default_value_t = DEFAULT_SIZE_MEDIAN_MB)]
    pub size_median_mb: f64,
    /// Log-normal shape (σ) of Worker sizes; 0 makes every Worker the median.
    #[arg(long, default_value_t = DEFAULT_SIZE_SIGMA)]
    pub size_sigma: f64,
    /// Median of the Workers' mean request durations, ms (per request:
    /// exponential around its Worker's mean).
    #[arg(long, default_value_t = DEFAULT_DURATION_MS)]
    pub duration_ms: f64,
    /// Log-normal shape (σ) of the Workers' mean durations.
    #[arg(long, default_value_t = DEFAULT_DURATION_SIGMA)]
    pub duration_sigma: f64,
    /// Time from a cold start to the Worker being ready, ms.
    #[arg(long, default_value_t = DEFAULT_COLD_START_MS)]
    pub cold_start_ms: u64,
    /// Fraction of the requests simulated first and not counted, in [0, 1).
    #[arg(long, default_value_t = DEFAULT_WARMUP)]
    pub warmup: f64,
    /// How the load balancer picks the receiving server.
    #[arg(long, value_enum, default_value_t = Balancer::Random)]
    pub balancer: Balancer,
    /// After a fallback cold start, also load the Worker at its home (when
    /// the home has room without evicting busy Workers).
    #[arg(long)]
    pub prewarm_home: bool,
    /// Run the idle sweep only on servers holding at least this fraction of
    /// their budget, in [0, 1] (0: always, as the runtime does). Idle
    /// Workers then stay warm while memory is plentiful.
    #[arg(long, default_value_t = 0.0)]
    pub idle_sweep_above: f64,
    /// Seed of every random draw.
    #[arg(long, default_value_t = DEFAULT_SEED)]
    pub seed: u64,
    /// Replay this trace instead of Poisson/Zipf traffic.
    #[arg(long)]
    pub trace: Option<PathBuf>,
    /// Format of --trace.
    #[arg(long, value_enum, default_value_t = TraceFormat::Auto)]
    #[serde(serialize_with = "serialize_format")]
    pub trace_format: TraceFormat,
    /// Also write the report as JSON to this file.
    #[arg(long)]
    pub json: Option<PathBuf>,
}

fn serialize_format<S: serde::Serializer>(f: &TraceFormat, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(match f {
        TraceFormat::Auto => "auto",
        TraceFormat::Csv => "csv",
        TraceFormat::Azure => "azure",
    })
}

impl Default for SimulateArgs {
    /// The defaults of the command line.
    fn default() -> Self {
        let overload = OverloadConfig::default();
        SimulateArgs {
            servers: DEFAULT_SERVERS,
            workers: DEFAULT_WORKERS,
            exponent: DEFAULT_EXPONENT,
            requests: None,
            memory_mb: DEFAULT_MEMORY_MB,
            rate: DEFAULT_RATE,
            idle_timeout_s: DEFAULT_IDLE_TIMEOUT_S,
            max_in_flight_per_worker: overload.max_in_flight_per_worker,
            max_in_flight_node: overload.max_in_flight_node,
            busy_window_ms: DEFAULT_BUSY_WINDOW_MS,
            size_median_mb: DEFAULT_SIZE_MEDIAN_MB,
            size_sigma: DEFAULT_SIZE_SIGMA,
            duration_ms: DEFAULT_DURATION_MS,
            duration_sigma: DEFAULT_DURATION_SIGMA,
            cold_start_ms: DEFAULT_COLD_START_MS,
            warmup: DEFAULT_WARMUP,
            balancer: Balancer::Random,
            prewarm_home: false,
            idle_sweep_above: 0.0,
            seed: DEFAULT_SEED,
            trace: None,
            trace_format: TraceFormat::Auto,
            json: None,
        }
    }
}

/// What a run derived from its arguments.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Derived {
    /// Workers simulated (from the trace when there is one).
    pub workers: u64,
    /// Requests simulated, warm-up included.
    pub requests: u64,
    /// Of which warm-up, not counted.
    pub warmup_requests: u64,
    /// Mean Worker memory size, MiB.
    pub mean_worker_mb: f64,
    /// Memory all Workers would take with one copy each, GiB.
    pub all_workers_gib: f64,
    /// Memory budget of the whole data center, GiB.
    pub dc_memory_gib: f64,
    /// Virtual time from the first request to the last, seconds.
    pub span_s: f64,
}

/// Wall-clock time of a run.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct WallTimes {
    /// Reading the trace or drawing the Workers, and building the ring.
    pub setup_s: f64,
    /// The unsharded event loop.
    pub unsharded_s: f64,
    /// The sharded event loop (run in parallel with the unsharded one).
    pub sharded_s: f64,
    /// The whole run.
    pub total_s: f64,
}

/// The outcome of a run: both modes on the same traffic.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SimReport {
    /// The configuration.
    pub args: SimulateArgs,
    /// What followed from it.
    pub derived: Derived,
    /// The plain load balancer.
    pub unsharded: ModeReport,
    /// Worker sharding.
    pub sharded: ModeReport,
    /// How long it took (differs between otherwise identical runs).
    pub wall: WallTimes,
}

/// Runs the simulation described by `args` in both modes (on two threads),
/// and writes the JSON report to `args.json` if set.
///
/// The phases: the Workers (from the trace, or `worker-0`, …) with their
/// homes on the ring and their drawn sizes and durations; the workload and
/// the `World` both modes share; the two modes over the same request
/// stream (`run_both`); the report.
pub fn run(args: &SimulateArgs) -> Result<SimReport, SimulateError> {
    let started = Instant::now();
    validate(args)?;
    let trace = match &args.trace {
        Some(path) => Some(crate::trace::load(path, args.trace_format, args.seed)?),
        None => None,
    };
    let ids: Vec<String> = match &trace {
        Some(t) => t.workers.clone(),
        None => (0..args.workers).map(|i| format!("worker-{i}")).collect(),
    };
    if ids.is_empty() {
        return Err(SimulateError::NoWorkers);
    }
    let home = homes(&ids, args.servers)?;
    let model = WorkerModel {
        size_mb: MedianLogNormal::new(
            args.size_median_mb,
            args.size_sigma,
            "--size-median-mb / --size-sigma",
        )?,
        duration_ms: MedianLogNormal::new(
            args.duration_ms,
            args.duration_sigma,
            "--duration-ms / --duration-sigma",
        )?,
    };
    let (size, mean_duration) = model.draw(ids.len(), args.seed);

    let workload = Workload::new(args, trace.as_ref(), ids.len())?;
    let requests = workload.requests(args);
    let warmup_requests = (args.warmup * requests as f64).floor() as u64;
    let world = world(args, &home, &size, warmup_requests);
    let arrivals = || workload.arrivals(args, requests, &mean_duration);
    let setup_s = started.elapsed().as_secs_f64();
    let ((unsharded, unsharded_s), (sharded, sharded_s)) = run_both(&world, arrivals)?;

    let total_bytes: u64 = size.iter().sum();
    let report = SimReport {
        args: args.clone(),
        derived: Derived {
            workers: ids.len() as u64,
            requests,
            warmup_requests,
            mean_worker_mb: total_bytes as f64 / ids.len() as f64 / MIB,
            all_workers_gib: total_bytes as f64 / GIB,
            dc_memory_gib: world.memory_bytes as f64 * f64::from(args.servers) / GIB,
            span_s: workload.span_s(args, requests),
        },
        unsharded,
        sharded,
        wall: WallTimes {
            setup_s,
            unsharded_s,
            sharded_s,
            total_s: started.elapsed().as_secs_f64(),
        },
    };
    if let Some(path) = &args.json {
        let json = serde_json::to_string_pretty(&report).map_err(SimulateError::Json)?;
        std::fs::write(path, json + "\n").map_err(|error| SimulateError::WriteReport {
            path: path.clone(),
            error,
        })?;
    }
    Ok(report)
}

/// What both modes share: the Workers and the policy parameters of `args`.
fn world<'a>(
    args: &SimulateArgs,
    home: &'a [u32],
    size: &'a [u64],
    warmup_requests: u64,
) -> World<'a> {
    let memory_bytes = args.memory_mb.saturating_mul(1 << 20);
    World {
        home,
        size,
        servers: args.servers,
        memory_bytes,
        idle_ms: args.idle_timeout_s.saturating_mul(1000),
        busy_ms: args.busy_window_ms,
        cold_start_ms: args.cold_start_ms,
        overload: OverloadConfig {
            max_in_flight_per_worker: args.max_in_flight_per_worker,
            max_in_flight_node: args.max_in_flight_node,
        },
        prewarm_home: args.prewarm_home,
        idle_sweep_above: (args.idle_sweep_above * memory_bytes as f64).ceil() as u64,
        warmup_requests,
    }
}

/// A mode's report and its wall time, s.
type Timed = (ModeReport, f64);

/// Runs the unsharded mode on another thread and the sharded one on this
/// one, each over its own copy of the same request stream.
fn run_both<I: Iterator<Item = model::Request>>(
    world: &World<'_>,
    arrivals: impl Fn() -> I + Sync,
) -> Result<(Timed, Timed), SimulateError> {
    let timed = |mode| {
        let t = Instant::now();
        let report = run_mode(mode, world, arrivals());
        (report, t.elapsed().as_secs_f64())
    };
    std::thread::scope(|scope| {
        let other = scope.spawn(|| timed(Mode::Unsharded));
        let sharded = timed(Mode::Sharded);
        other
            .join()
            .map(|unsharded| (unsharded, sharded))
            .map_err(|_| SimulateError::Panicked)
    })
}

/// Where the requests come from.
enum Workload<'a> {
    /// A trace's invocations (possibly cut to `--requests`).
    Trace(&'a [crate::trace::TraceEvent]),
    /// Poisson arrivals (their gaps, ms) with Zipf popularity.
    Poisson(Zipf, rand_distr::Exp<f64>),
}

impl<'a> Workload<'a> {
    /// The trace's invocations, cut to `--requests`; else Zipf over
    /// `workers` at `--rate`.
    fn new(
        args: &SimulateArgs,
        trace: Option<&'a trace::Trace>,
        workers: usize,
    ) -> Result<Self, SimulateError> {
        Ok(match trace {
            Some(t) => {
                let n = args.requests.map_or(t.events.len(), |r| {
                    usize::try_from(r).unwrap_or(usize::MAX).min(t.events.len())
                });
                Workload::Trace(&t.events[..n])
            }
            None => Workload::Poisson(
                Zipf::new(workers, args.exponent),
                model::arrival_gaps(args.rate)?,
            ),
        })
    }

    /// Requests simulated, warm-up included.
    fn requests(&self, args: &SimulateArgs) -> u64 {
        match self {
            Workload::Trace(e) => e.len() as u64,
            Workload::Poisson(..) => args.requests.unwrap_or(DEFAULT_REQUESTS),
        }
    }

    /// Virtual time from the first request to the last, s.
    fn span_s(&self, args: &SimulateArgs, requests: u64) -> f64 {
        match self {
            Workload::Trace(e) => match (e.first(), e.last()) {
                (Some(a), Some(b)) => (b.t_ms - a.t_ms) as f64 / 1000.0,
                _ => 0.0,
            },
            Workload::Poisson(..) => requests as f64 / args.rate,
        }
    }

    /// The request stream (the same each time it is asked for).
    fn arrivals<'s>(
        &'s self,
        args: &SimulateArgs,
        requests: u64,
        mean_duration: &'s [f32],
    ) -> Arrivals<'s> {
        match self {
            Workload::Trace(events) => Arrivals::trace(
                events,
                args.seed,
                args.balancer,
                args.servers,
                mean_duration,
            ),
            Workload::Poisson(zipf, gap_ms) => Arrivals::poisson(
                zipf,
                *gap_ms,
                requests,
                args.seed,
                args.balancer,
                args.servers,
                mean_duration,
            ),
        }
    }
}

/// Why a simulation could not run. A cause is in the message, not also a
/// `source` (which would print it twice in an error chain), as in
/// [`trace::TraceError`].
#[derive(Debug, thiserror::Error)]
pub enum SimulateError {
    /// A flag out of its range; the message names the flag.
    #[error("{0}")]
    InvalidArgument(String),
    /// The trace could not be read (or says nothing).
    #[error(transparent)]
    Trace(#[from] crate::trace::TraceError),
    /// No Workers: `--workers 0`, or a trace with none.
    #[error("no Workers to simulate")]
    NoWorkers,
    /// The ring over the simulated servers could not be built.
    #[error("building the ring: {0}")]
    Ring(RingError),
    /// The ring gave a Worker no home.
    #[error("no home for {0}")]
    NoHome(String),
    /// The unsharded mode's thread panicked.
    #[error("the unsharded simulation panicked")]
    Panicked,
    /// The report could not be turned into JSON.
    #[error("the report as JSON: {0}")]
    Json(serde_json::Error),
    /// The JSON report could not be written.
    #[error("writing the report to {}: {error}", path.display())]
    WriteReport {
        /// Where it was to go (`--json`).
        path: PathBuf,
        /// Why it could not.
        error: std::io::Error,
    },
}

const MIB: f64 = (1u64 << 20) as f64;
const GIB: f64 = (1u64 << 30) as f64;

/// Refuses a run whose flag breaks `cond`, with the message that names it.
macro_rules! ensure_arg {
    ($cond:expr, $($msg:tt)+) => {
        if !$cond {
            return Err(SimulateError::InvalidArgument(format!($($msg)+)));
        }
    };
}

fn validate(args: &SimulateArgs) -> Result<(), SimulateError> {
    ensure_arg!(args.servers >= 1, "--servers must be at least 1");
    ensure_arg!(args.memory_mb >= 1, "--memory-mb must be at least 1");
    ensure_arg!(
        (0.0..1.0).contains(&args.warmup),
        "--warmup must be in [0, 1), got {}",
        args.warmup
    );
    ensure_arg!(
        args.size_median_mb.is_finite() && args.size_median_mb > 0.0,
        "--size-median-mb must be positive"
    );
    ensure_arg!(
        args.size_sigma.is_finite() && args.size_sigma >= 0.0,
        "--size-sigma must be at least 0"
    );
    ensure_arg!(
        args.duration_ms.is_finite() && args.duration_ms > 0.0,
        "--duration-ms must be positive"
    );
    ensure_arg!(
        args.duration_sigma.is_finite() && args.duration_sigma >= 0.0,
        "--duration-sigma must be at least 0"
    );
    ensure_arg!(
        (0.0..=1.0).contains(&args.idle_sweep_above),
        "--idle-sweep-above must be in [0, 1]"
    );
    if args.trace.is_none() {
        ensure_arg!(args.workers >= 1, "--workers must be at least 1");
        ensure_arg!(
            args.exponent.is_finite() && args.exponent >= 0.0,
            "--exponent must be at least 0"
        );
        ensure_arg!(
            args.rate.is_finite() && args.rate > 0.0,
            "--rate must be positive"
        );
    }
    if args.requests == Some(0) {
        return Err(SimulateError::InvalidArgument(
            "--requests must be at least 1".into(),
        ));
    }
    Ok(())
}

/// The home server index of each Worker, from the live node's ring over
/// servers `server-0000`, `server-0001`, ….
fn homes(ids: &[String], servers: u32) -> Result<Vec<u32>, SimulateError> {
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, 0));
    let names: Vec<String> = (0..servers).map(server_name).collect();
    let ring = Ring::new(
        names.iter().map(|n| Member::new(n.as_str(), addr)),
        RingConfig::default(),
    )
    .map_err(SimulateError::Ring)?;
    let index: HashMap<NodeId, u32> = (0u32..)
        .zip(&names)
        .map(|(i, n)| (NodeId::from(n.as_str()), i))
        .collect();
    ids.iter()
        .map(|id| {
            ring.home(id)
                .and_then(|node| index.get(&node.id).copied())
                .ok_or_else(|| SimulateError::NoHome(id.clone()))
        })
        .collect()
}

/// The non-default policy options of a run, for the table's heading.
fn options(a: &SimulateArgs) -> String {
    let d = SimulateArgs::default();
    let mut out = String::new();
    if a.max_in_flight_per_worker != d.max_in_flight_per_worker {
        let _ = write!(
            out,
            ", max in flight per Worker {}",
            a.max_in_flight_per_worker
        );
    }
    if a.max_in_flight_node != d.max_in_flight_node {
        let _ = write!(out, ", max in flight per node {}", a.max_in_flight_node);
    }
    if a.prewarm_home {
        out.push_str(", prewarm-home");
    }
    if a.idle_sweep_above > 0.0 {
        let _ = write!(
            out,
            ", idle sweep above {}% full",
            100.0 * a.idle_sweep_above
        );
    }
    if a.balancer != Balancer::Random {
        out.push_str(", round-robin balancer");
    }
    out
}

/// The ring ID of server `i`: `server-0000`, `server-0001`, ….
pub fn server_name(i: u32) -> String {
    format!("server-{i:04}")
}

impl SimReport {
    /// The two modes side by side as a markdown table, preceded by a line
    /// with the parameters and followed by the wall times.
    pub fn table(&self) -> String {
        let mut out = self.parameters();
        out.push_str(&self.comparison().to_string());
        let _ = writeln!(
            out,
            "\nwall time: {:.1} s (setup {:.1} s, unsharded {:.1} s, sharded {:.1} s, in parallel)",
            self.wall.total_s, self.wall.setup_s, self.wall.unsharded_s, self.wall.sharded_s
        );
        out
    }

    /// The line (and blank line) that says what was simulated.
    fn parameters(&self) -> String {
        let a = &self.args;
        let d = &self.derived;
        let mut out = String::new();
        let source = match &a.trace {
            Some(p) => format!("trace {}", p.display()),
            None => format!("Zipf s={} at {} req/s", a.exponent, a.rate),
        };
        let _ = writeln!(
            out,
            "{} servers × {} MiB, {} Workers (mean {:.1} MiB, {:.0} GiB for one copy of each \
             vs {:.0} GiB in the DC), {source}, {} requests ({} warm-up), {:.0} s virtual, \
             idle timeout {} s, seed {}{}\n",
            a.servers,
            a.memory_mb,
            d.workers,
            d.mean_worker_mb,
            d.all_workers_gib,
            d.dc_memory_gib,
            d.requests,
            d.warmup_requests,
            d.span_s,
            a.idle_timeout_s,
            a.seed,
            options(a),
        );
        out
    }

    /// The measures of both modes, with their ratio where it means something.
    fn comparison(&self) -> Table {
        let (u, s) = (&self.unsharded, &self.sharded);
        let mut table = Table::new(["measure", "unsharded", "sharded", "sharded / unsharded"])
            .align([Align::Left, Align::Right, Align::Right, Align::Right]);
        let mut row = |name: &str, x: String, y: String, r: String| {
            table.row([name.to_string(), x, y, r]);
        };
        let ratio = |x: f64, y: f64| {
            if x == 0.0 {
                "–".to_string()
            } else if y == 0.0 {
                "0".to_string()
            } else {
                format!("{:.3} (÷{:.1})", y / x, x / y)
            }
        };
        let int = |x: u64| x.to_string();
        let pct = |x: f64| format!("{:.4}%", 100.0 * x);
        let mib = |x: f64| format!("{:.0} MiB", x / MIB);
        row("requests", int(u.requests), int(s.requests), String::new());
        row(
            "warm rate",
            pct(u.warm_rate),
            pct(s.warm_rate),
            String::new(),
        );
        row(
            "warm rate after first loads",
            pct(u.warm_rate_after_first_loads),
            pct(s.warm_rate_after_first_loads),
            String::new(),
        );
        let cold_rate = |m: &ModeReport| 1.0 - m.warm_rate;
        row(
            "cold request rate",
            pct(cold_rate(u)),
            pct(cold_rate(s)),
            ratio(cold_rate(u), cold_rate(s)),
        );
        row(
            "cold starts",
            int(u.cold_starts),
            int(s.cold_starts),
            ratio(u.cold_starts as f64, s.cold_starts as f64),
        );
        row(
            "evictions (pressure + idle)",
            format!("{} + {}", u.evictions_pressure, u.evictions_idle),
            format!("{} + {}", s.evictions_pressure, s.evictions_idle),
            ratio(u.evictions() as f64, s.evictions() as f64),
        );
        row(
            "evictions / server-hour",
            format!("{:.1}", u.evictions_per_server_hour),
            format!("{:.1}", s.evictions_per_server_hour),
            ratio(u.evictions_per_server_hour, s.evictions_per_server_hour),
        );
        row(
            "routes local / home / sharded / fallback",
            "–".into(),
            format!(
                "{} / {} / {} / {}",
                s.routes.local, s.routes.home, s.routes.sharded, s.routes.fallback
            ),
            String::new(),
        );
        row(
            "fraction sharded",
            pct(u.fraction_sharded),
            pct(s.fraction_sharded),
            String::new(),
        );
        row(
            "refusals (worker busy / node busy / no memory)",
            "–".into(),
            format!(
                "{} / {} / {}",
                s.refusals.worker_busy, s.refusals.node_busy, s.refusals.no_memory
            ),
            String::new(),
        );
        let causes = |c: &ColdCauses| {
            format!(
                "{} / {} / {} / {}",
                c.first_in_dc, c.first_on_server, c.after_pressure, c.after_idle
            )
        };
        row(
            "cold starts: first in DC / first on server / after pressure / after idle",
            causes(&u.cold_start_causes),
            causes(&s.cold_start_causes),
            String::new(),
        );
        if self.args.prewarm_home {
            row(
                "prewarm loads",
                int(u.prewarm_loads),
                int(s.prewarm_loads),
                String::new(),
            );
        }
        row(
            "resident memory / server: mean",
            mib(u.mean_resident_bytes_per_server),
            mib(s.mean_resident_bytes_per_server),
            ratio(
                u.mean_resident_bytes_per_server,
                s.mean_resident_bytes_per_server,
            ),
        );
        row(
            "resident memory / server: peak",
            mib(u.peak_resident_bytes_per_server as f64),
            mib(s.peak_resident_bytes_per_server as f64),
            String::new(),
        );
        row(
            "resident Workers / server: mean",
            format!("{:.0}", u.mean_resident_workers_per_server),
            format!("{:.0}", s.mean_resident_workers_per_server),
            ratio(
                u.mean_resident_workers_per_server,
                s.mean_resident_workers_per_server,
            ),
        );
        table
    }
}
