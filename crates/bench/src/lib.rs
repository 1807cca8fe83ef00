//! # hearth-bench
//!
//! `hearth bench`: a load generator against a running cluster — one started
//! with `hearth cluster`, or real nodes — that reports the same measures as
//! `hearth demo` plus the cold and warm latency distributions.
//!
//! # Model
//!
//! The bench talks to nodes only over HTTP, as any client would:
//!
//! * **Front doors** (`--target`, one or more): every request goes to one of
//!   them, round-robin or at random (`--spread`), addressed to its Worker by
//!   `Host: <script-id>.<host-suffix>`. The response headers say how it was
//!   served: `x-hearth-start: cold|warm`, `x-hearth-route:
//!   local|home|sharded|fallback` and `x-hearth-node`. A request's latency
//!   is measured at the client, from sending it to receiving the last byte
//!   of the body.
//! * **Admin APIs** (`--admin`, optional, one per node you want counted):
//!   the Workers to drive are discovered from the first one (`GET
//!   /v1/scripts`) unless `--workers` names them; the node counters are read
//!   before and after the run (`GET /v1/stats` with the token, or the
//!   Prometheus `/metrics` without one) and the report shows the
//!   differences summed over the nodes. *Evictions* are those under memory
//!   pressure plus idle ones (the manual evictions `--cold` makes are
//!   counted apart); *resident memory* is the sum at the end of the run;
//!   *refusals* is the change of `hearth_refusals_received_total`. Without
//!   `--admin` these are reported as unknown.
//!
//! Three kinds of run:
//!
//! * **Zipf** (default): `--requests N` (or `--rate × --duration-s`)
//!   requests, the Worker of each drawn from
//!   [`Zipf`] with `--exponent` over the Workers in
//!   the order listed (discovered ones sorted by ID: the first is the most
//!   popular).
//! * **Trace replay** (`--trace FILE`, read by [`hearth_simulate::trace::load`] in the
//!   formats of `hearth simulate`): each invocation is sent at its trace
//!   time (from the first invocation) divided by `--speedup`. If every
//!   Worker the trace names is among the Workers driven, they are used by
//!   name; otherwise trace Worker `i` is mapped to driven Worker `i mod n`.
//! * **Cold vs warm** (`--worker ID --cold`): `--repeat N` times, evict the
//!   Worker on every `--admin` node and send it one request (a cold start);
//!   then send it `N` requests back to back (warm). Every sample is kept in
//!   the report ([`BenchReport::samples`]) with the start it was reported
//!   with.
//!
//! The Zipf and trace runs are **open loop**: each request is sent at its
//! scheduled time whatever the earlier ones are doing (constant gaps of
//! `1/rate`, or exponential ones with `--arrivals poisson`), so a slow
//! server does not slow the offered load down. At most `--max-outstanding`
//! requests are in flight; a request whose time comes while that many are
//! outstanding is not sent and is counted as *not sent*, and one sent more
//! than [`LATE_MS`] after its time (the client could not keep up) as
//! *late*.
//!
//! Latency is summarised per start (cold or warm) by the tools' one
//! latency summary ([`Distribution`], from `hearth-report`: nearest-rank
//! percentiles from an HDR histogram, and a histogram in logarithmic
//! buckets, [`BUCKETS_MS`]).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use serde::Serialize;
use tokio::time::Instant;

use hearth_admin_client::{AdminClient, AdminError, NodeStats};
pub use hearth_report::latency::{BUCKETS_MS, Bucket, Distribution};
use hearth_report::table::Table;
use hearth_simulate::Zipf;
use hearth_simulate::trace::{self, TraceFormat};

/// A request sent more than this many milliseconds after its scheduled time
/// is counted as late.
pub const LATE_MS: f64 = 5.0;

/// How requests are spread over the `--target` front doors.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Spread {
    /// Request `i` goes to target `i mod n`.
    #[default]
    RoundRobin,
    /// Each request goes to a target drawn uniformly at random.
    Random,
}

/// How the send times of a `--rate` run are spaced.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Arrivals {
    /// Exactly `1/rate` apart.
    #[default]
    Constant,
    /// Exponential gaps with mean `1/rate` (a Poisson process).
    Poisson,
}

/// Flags of `hearth bench`.
#[derive(clap::Args, Debug, Clone)]
pub struct BenchArgs {
    /// Front door URL(s) to send Worker requests to, e.g.
    /// http://127.0.0.1:8080 (repeat the flag or separate with commas).
    #[arg(long = "target", value_delimiter = ',', value_name = "URL")]
    pub targets: Vec<String>,
    /// Admin API URL(s) of the nodes to count (discovery, evictions for
    /// --cold, stats before and after); repeat or separate with commas.
    #[arg(long = "admin", value_delimiter = ',', value_name = "URL")]
    pub admins: Vec<String>,
    /// Admin token (default: $HEARTH_ADMIN_TOKEN).
    #[arg(long, env = "HEARTH_ADMIN_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// Workers to drive, most popular first (default: every Worker deployed,
    /// listed by the first --admin).
    #[arg(
        long,
        value_delimiter = ',',
        value_name = "ID",
        conflicts_with = "worker"
    )]
    pub workers: Vec<String>,
    /// Drive only this Worker; with --cold, measure its cold and warm
    /// latency.
    #[arg(long, value_name = "ID")]
    pub worker: Option<String>,
    /// With --worker: evict it on every --admin node before each of
    /// --repeat requests (cold), then send --repeat more (warm).
    #[arg(long, requires = "worker", conflicts_with = "trace")]
    pub cold: bool,
    /// Cold (and warm) requests of a --cold run.
    #[arg(long, default_value_t = 10)]
    pub repeat: usize,
    /// Zipf exponent of Worker popularity.
    #[arg(long, default_value_t = 1.1)]
    pub exponent: f64,
    /// Offered load in requests per second (open loop).
    #[arg(long, default_value_t = 100.0)]
    pub rate: f64,
    /// Spacing of send times at --rate.
    #[arg(long, value_enum, default_value_t)]
    pub arrivals: Arrivals,
    /// Requests to send (default 1000 without --duration-s; a trace: its
    /// first N invocations).
    #[arg(long, conflicts_with = "duration_s")]
    pub requests: Option<u64>,
    /// Send for this many seconds (at --rate, or of replayed trace time).
    #[arg(long)]
    pub duration_s: Option<f64>,
    /// Replay this trace file instead of Zipf traffic.
    #[arg(long)]
    pub trace: Option<PathBuf>,
    /// Format of --trace.
    #[arg(long, value_enum, default_value_t)]
    pub trace_format: TraceFormat,
    /// Replay the trace this many times faster than recorded.
    #[arg(long, default_value_t = 1.0)]
    pub speedup: f64,
    /// How requests are spread over the targets.
    #[arg(long, value_enum, default_value_t)]
    pub spread: Spread,
    /// Most requests in flight at once; a request due while this many are
    /// outstanding is not sent (and counted).
    #[arg(long, default_value_t = 256)]
    pub max_outstanding: usize,
    /// Give up on a request (counted as failed) after this many seconds.
    #[arg(long, default_value_t = 30.0)]
    pub timeout_s: f64,
    /// Path (and query) of every Worker request.
    #[arg(long, default_value = "/")]
    pub path: String,
    /// Host suffix: requests carry `Host: <script-id>.<suffix>`.
    #[arg(long, default_value = "localhost")]
    pub host_suffix: String,
    /// Random seed (Zipf draws, random spread, Azure trace placement).
    #[arg(long, default_value_t = 42)]
    pub seed: u64,
    /// Also write the report as JSON here.
    #[arg(long)]
    pub json: Option<PathBuf>,
}

impl BenchArgs {
    /// Parses `hearth bench` flags (the first item is the program name), as
    /// the command line would, defaults included.
    pub fn try_parse_from<I, T>(args: I) -> Result<Self, clap::Error>
    where
        I: IntoIterator<Item = T>,
        T: Into<std::ffi::OsString> + Clone,
    {
        let cmd = <Self as clap::Args>::augment_args(clap::Command::new("bench"));
        let matches = cmd.try_get_matches_from(args)?;
        <Self as clap::FromArgMatches>::from_arg_matches(&matches)
    }
}

/// Why a bench could not run. A cause is in the message, not also a
/// `source` (which would print it twice in an error chain).
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// The flags cannot describe a run, or there is nothing to drive.
    #[error("{0}")]
    Usage(String),
    /// The `--trace` file could not be read.
    #[error("cannot use trace {}: {error}", path.display())]
    Trace {
        /// The trace file.
        path: PathBuf,
        /// What the trace reader said.
        error: Box<trace::TraceError>,
    },
    /// A call to an admin API failed.
    #[error(transparent)]
    Admin(Box<AdminError>),
    /// A `--cold` run could not evict its Worker.
    #[error("cannot evict {id}: {error}")]
    Evict {
        /// The Worker.
        id: String,
        /// What the admin API said.
        error: Box<AdminError>,
    },
    /// A request to a target failed; the message carries its causes.
    #[error("{0}")]
    Request(String),
    /// The report could not be serialized.
    #[error(transparent)]
    Report(#[from] serde_json::Error),
    /// The `--json` report could not be written.
    #[error("cannot write {}: {error}", path.display())]
    Write {
        /// The report file.
        path: PathBuf,
        /// What the file system said.
        error: std::io::Error,
    },
}

impl From<AdminError> for BenchError {
    fn from(error: AdminError) -> Self {
        BenchError::Admin(Box::new(error))
    }
}

/// Fails with [`BenchError::Usage`] saying `message` unless `ok`.
fn ensure(ok: bool, message: impl FnOnce() -> String) -> Result<(), BenchError> {
    if ok {
        Ok(())
    } else {
        Err(BenchError::Usage(message()))
    }
}

/// `error` and its causes, `: `-separated (hyper's connect error says
/// only "client error (Connect)"; the cause says what happened).
fn with_causes(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut cause = error.source();
    while let Some(e) = cause {
        text.push_str(": ");
        text.push_str(&e.to_string());
        cause = e.source();
    }
    text
}

/// One request of a `--cold` run.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Sample {
    /// `cold` (sent right after evicting the Worker) or `warm`.
    pub phase: &'static str,
    /// HTTP status (0 if no response arrived).
    pub status: u16,
    /// The response's `x-hearth-start` ("" if absent).
    pub start: String,
    /// The response's `x-hearth-route`.
    pub route: String,
    /// The response's `x-hearth-node`.
    pub node: String,
    /// The response's `server-timing` (the node's phases).
    pub server_timing: String,
    /// Latency at the client, ms.
    pub latency_ms: f64,
    /// The transport error, if the request failed without a response.
    pub error: Option<String>,
}

/// What a bench run measured.
#[derive(Debug, Clone, Default, Serialize)]
pub struct BenchReport {
    /// `zipf`, `trace` or `cold`.
    pub mode: String,
    /// One line saying what was run.
    pub description: String,
    /// The Workers driven.
    pub workers: Vec<String>,
    /// Requests scheduled.
    pub planned: u64,
    /// Requests sent (responses plus failures).
    pub requests: u64,
    /// Requests not sent: due while `--max-outstanding` were in flight.
    pub not_sent: u64,
    /// Requests sent more than [`LATE_MS`] after their scheduled time.
    pub late: u64,
    /// Successful (2xx) responses marked `x-hearth-start: warm`.
    pub warm: u64,
    /// Successful responses marked `x-hearth-start: cold`.
    pub cold: u64,
    /// Successful responses without an `x-hearth-start` header.
    pub unmarked: u64,
    /// Requests that failed: a non-2xx status, a transport error or a
    /// timeout.
    pub failed: u64,
    /// Failures by status code (0: no response).
    pub failures_by_status: BTreeMap<u16, u64>,
    /// The first transport error seen, if any.
    pub first_error: Option<String>,
    /// Responses by `x-hearth-route`.
    pub routes: BTreeMap<String, u64>,
    /// Responses by `x-hearth-node`.
    pub served_by: BTreeMap<String, u64>,
    /// Evictions (pressure + idle) during the run, summed over `--admin`
    /// nodes; `None` without `--admin`.
    pub evictions: Option<u64>,
    /// Evictions per 1000 requests.
    pub evictions_per_1k: Option<f64>,
    /// Manual evictions during the run (those `--cold` asks for).
    pub manual_evictions: Option<u64>,
    /// Refusals received from overloaded homes during the run.
    pub refusals: Option<u64>,
    /// Bytes resident over the `--admin` nodes at the end.
    pub resident_bytes: Option<u64>,
    /// Latency of warm responses.
    pub warm_latency: Distribution,
    /// Latency of cold responses.
    pub cold_latency: Distribution,
    /// Every request of a `--cold` run (empty otherwise).
    pub samples: Vec<Sample>,
    /// Wall time of the traffic, s.
    pub seconds: f64,
    /// Requests sent per second of wall time.
    pub achieved_rate: f64,
}

impl BenchReport {
    /// Share of sent requests that found their Worker warm.
    pub fn warm_rate(&self) -> f64 {
        self.warm as f64 / self.requests.max(1) as f64
    }

    /// Share of sent requests served by their home for another node.
    pub fn fraction_sharded(&self) -> f64 {
        self.routes.get("sharded").copied().unwrap_or(0) as f64 / self.requests.max(1) as f64
    }

    /// The report as text: the `hearth demo` measures as a table, then the
    /// cold and warm latency distributions with histograms.
    pub fn table(&self) -> String {
        let unknown = || "unknown".to_string();
        let opt = |v: Option<u64>| v.map_or_else(unknown, |v| v.to_string());
        let mut rows: Vec<(&str, String)> = vec![
            ("requests", self.requests.to_string()),
            ("warm rate", format!("{:.2}%", 100.0 * self.warm_rate())),
            ("cold starts", self.cold.to_string()),
            ("failed", self.failed.to_string()),
            ("evictions", opt(self.evictions)),
            (
                "evictions / 1k requests",
                self.evictions_per_1k
                    .map_or_else(unknown, |v| format!("{v:.1}")),
            ),
            (
                "fraction sharded",
                format!("{:.1}%", 100.0 * self.fraction_sharded()),
            ),
            ("refusals", opt(self.refusals)),
            (
                "resident memory (KiB)",
                opt(self.resident_bytes.map(|b| b / 1024)),
            ),
            ("warm p50 / p99 (ms)", self.warm_latency.p50_p99()),
            ("cold p50 / p99 (ms)", self.cold_latency.p50_p99()),
        ];
        if self.mode != "cold" {
            rows.push(("not sent (outstanding cap)", self.not_sent.to_string()));
            rows.push(("sent late (> 5 ms)", self.late.to_string()));
        }
        if self.unmarked > 0 {
            rows.push(("2xx without x-hearth-start", self.unmarked.to_string()));
        }
        if let Some(m) = self.manual_evictions.filter(|&m| m > 0) {
            rows.push(("manual evictions", m.to_string()));
        }
        let join = |m: &BTreeMap<String, u64>| {
            m.iter()
                .map(|(k, v)| format!("{k} {v}"))
                .collect::<Vec<_>>()
                .join(", ")
        };
        if !self.routes.is_empty() {
            rows.push(("routes", join(&self.routes)));
        }
        if !self.served_by.is_empty() {
            rows.push(("served by", join(&self.served_by)));
        }
        if !self.failures_by_status.is_empty() {
            rows.push((
                "failures by status",
                self.failures_by_status
                    .iter()
                    .map(|(k, v)| format!("{k} {v}"))
                    .collect::<Vec<_>>()
                    .join(", "),
            ));
        }
        rows.push((
            "achieved rate (req/s)",
            format!("{:.1}", self.achieved_rate),
        ));
        rows.push(("wall time (s)", format!("{:.1}", self.seconds)));

        let mut table = Table::new(["measure", "value"]);
        for (k, v) in rows {
            table.row([k.to_string(), v]);
        }
        let mut out = format!("{}\n\n{table}", self.description);
        if let Some(e) = &self.first_error {
            out.push_str(&format!("\nfirst error: {e}\n"));
        }
        for (name, d) in [("cold", &self.cold_latency), ("warm", &self.warm_latency)] {
            if d.count == 0 {
                out.push_str(&format!("\n{name} latency (ms): no samples\n"));
                continue;
            }
            out.push_str(&format!(
                "\n{name} latency (ms), {} samples: p50 {:.3}  p90 {:.3}  p99 {:.3}  max {:.3}  (mean {:.3}, min {:.3})\n",
                d.count, d.p50_ms, d.p90_ms, d.p99_ms, d.max_ms, d.mean_ms, d.min_ms
            ));
            out.push_str(&d.text_histogram());
        }
        if !self.samples.is_empty() {
            out.push_str("\nsamples:\n");
            for s in &self.samples {
                out.push_str(&format!(
                    "  {:<4} {:>9.3} ms  {} start={} route={} node={}  {}\n",
                    s.phase,
                    s.latency_ms,
                    s.status,
                    s.start,
                    s.route,
                    s.node,
                    s.error.as_deref().unwrap_or(&s.server_timing)
                ));
            }
        }
        out
    }
}

type HttpClient = Client<HttpConnector, Full<Bytes>>;

/// Everything a request task needs, shared.
struct Ctx {
    client: HttpClient,
    targets: Vec<String>,
    workers: Vec<String>,
    path: String,
    host_suffix: String,
    timeout: Duration,
}

/// The outcome of one Worker request.
#[derive(Debug)]
struct Outcome {
    status: u16,
    start: String,
    route: String,
    node: String,
    server_timing: String,
    latency_ms: f64,
    error: Option<String>,
}

impl Ctx {
    async fn send(&self, worker: usize, target: usize) -> Outcome {
        let t0 = Instant::now();
        let r = tokio::time::timeout(self.timeout, self.exchange(worker, target)).await;
        let latency_ms = t0.elapsed().as_secs_f64() * 1e3;
        let failed = |error: String| Outcome {
            status: 0,
            start: String::new(),
            route: String::new(),
            node: String::new(),
            server_timing: String::new(),
            latency_ms,
            error: Some(error),
        };
        match r {
            Err(_) => failed(format!("no response within {:?}", self.timeout)),
            Ok(Err(e)) => failed(format!("{e:#}")),
            Ok(Ok((status, headers))) => {
                let h = |name: &str| {
                    headers
                        .get(name)
                        .and_then(|v| v.to_str().ok())
                        .unwrap_or("")
                        .to_string()
                };
                Outcome {
                    status,
                    start: h("x-hearth-start"),
                    route: h("x-hearth-route"),
                    node: h("x-hearth-node"),
                    server_timing: h("server-timing"),
                    latency_ms,
                    error: None,
                }
            }
        }
    }

    async fn exchange(
        &self,
        worker: usize,
        target: usize,
    ) -> Result<(u16, http::HeaderMap), BenchError> {
        let failed = |e: &dyn std::error::Error| BenchError::Request(with_causes(e));
        let (Some(base), Some(id)) = (self.targets.get(target), self.workers.get(worker)) else {
            return Err(BenchError::Request(format!(
                "no target {target} or Worker {worker}"
            )));
        };
        let req = http::Request::get(format!("{base}{}", self.path))
            .header(http::header::HOST, format!("{id}.{}", self.host_suffix))
            .body(Full::new(Bytes::new()))
            .map_err(|e| failed(&e))?;
        let resp = self.client.request(req).await.map_err(|e| failed(&e))?;
        let status = resp.status().as_u16();
        let headers = resp.headers().clone();
        resp.into_body().collect().await.map_err(|e| failed(&e))?;
        Ok((status, headers))
    }
}

/// A request of the schedule: when (ms from the start), which Worker, which
/// target.
#[derive(Debug, Clone, Copy)]
struct Planned {
    at_ms: f64,
    worker: usize,
    target: usize,
}

/// Node counters summed over the `--admin` nodes.
#[derive(Debug, Clone, Copy, Default)]
struct Counters {
    evictions: u64,
    manual: u64,
    resident_bytes: u64,
    refusals: Option<u64>,
}

/// The admin APIs of the `--admin` nodes.
struct Admin {
    nodes: Vec<AdminClient>,
}

impl Admin {
    /// The script IDs deployed, as listed by the first admin URL, sorted.
    async fn discover(&self) -> Result<Vec<String>, BenchError> {
        let node = self.nodes.first().ok_or_else(|| {
            BenchError::Usage(
                "no Workers to drive: name them with --workers, or give --admin to discover them"
                    .into(),
            )
        })?;
        let mut ids: Vec<String> = node
            .list()
            .await?
            .into_iter()
            .map(|s| s.script_id)
            .collect();
        ids.sort();
        ids.dedup();
        ensure(!ids.is_empty(), || {
            format!("no Workers are deployed (listed by {})", node.url())
        })?;
        Ok(ids)
    }

    /// Evicts `id` on every admin node.
    async fn evict_everywhere(&self, id: &str) -> Result<(), AdminError> {
        for node in &self.nodes {
            node.evict(id).await?;
        }
        Ok(())
    }

    /// The counters summed over the admin nodes; `None` without any.
    async fn counters(&self) -> Result<Option<Counters>, AdminError> {
        if self.nodes.is_empty() {
            return Ok(None);
        }
        let mut sum = Counters {
            refusals: Some(0),
            ..Counters::default()
        };
        for node in &self.nodes {
            let metrics = node.metrics().await?;
            let stats = if node.has_token() {
                node.stats().await?
            } else {
                // No token: the same counters from the Prometheus page.
                let m = |name: &str, labels: &str| metrics.sample(name, labels).unwrap_or(0.0);
                NodeStats {
                    evicted_pressure: m("hearth_evictions_total", "cause=\"pressure\"") as u64,
                    evicted_idle: m("hearth_evictions_total", "cause=\"idle\"") as u64,
                    evicted_manual: m("hearth_evictions_total", "cause=\"manual\"") as u64,
                    resident_bytes: m("hearth_resident_bytes", "") as u64,
                    ..NodeStats::default()
                }
            };
            sum.evictions += stats.evicted_pressure + stats.evicted_idle;
            sum.manual += stats.evicted_manual;
            sum.resident_bytes += stats.resident_bytes;
            let refusals = metrics.sample("hearth_refusals_received_total", "");
            sum.refusals = sum.refusals.zip(refusals).map(|(a, b)| a + b as u64);
        }
        Ok(Some(sum))
    }
}

/// A front door or admin URL without its trailing `/`; `host:port` gets
/// `http://`.
fn normalize_url(raw: &str, flag: &str) -> Result<String, BenchError> {
    let raw = raw.trim();
    let url = if raw.contains("://") {
        raw.to_string()
    } else {
        format!("http://{raw}")
    };
    let uri: http::Uri = url.parse().map_err(|e: http::uri::InvalidUri| {
        BenchError::Usage(format!("{flag} {raw:?} is not a URL: {e}"))
    })?;
    ensure(uri.scheme_str() == Some("http"), || {
        format!("{flag} {raw:?}: only http:// is supported")
    })?;
    ensure(uri.host().is_some_and(|h| !h.is_empty()), || {
        format!("{flag} {raw:?}: no host in the URL")
    })?;
    Ok(url.trim_end_matches('/').to_string())
}

/// Runs the bench described by `args` and returns what it measured; with
/// `--json`, also writes the report there.
pub async fn run(args: BenchArgs) -> Result<BenchReport, BenchError> {
    // Check the flags and read the trace before touching the network.
    validate(&args)?;
    let targets = args
        .targets
        .iter()
        .map(|t| normalize_url(t, "--target"))
        .collect::<Result<Vec<_>, _>>()?;
    let admins = args
        .admins
        .iter()
        .map(|t| normalize_url(t, "--admin"))
        .collect::<Result<Vec<_>, _>>()?;
    if args.cold {
        ensure(!admins.is_empty(), || {
            "--cold evicts the Worker through the admin API: give --admin URL (every node)".into()
        })?;
    }
    let trace = match &args.trace {
        Some(p) => Some(
            trace::load(p, args.trace_format, args.seed).map_err(|error| BenchError::Trace {
                path: p.clone(),
                error: Box::new(error),
            })?,
        ),
        None => None,
    };

    let (ctx, admin) = connect(&args, targets, admins).await?;
    let before = admin.counters().await?;
    let mut report = if args.cold {
        cold_run(&args, &ctx, &admin).await?
    } else {
        let (plan, mode, description) = schedule(&args, &ctx, trace.as_ref())?;
        let mut r = open_loop(&args, &ctx, plan).await?;
        r.mode = mode;
        r.description = description;
        r
    };
    let after = match admin.counters().await {
        Ok(c) => c,
        Err(e) => {
            tracing::warn!(error = %format!("{e:#}"), "cannot read the node counters after the run");
            None
        }
    };
    if let (Some(b), Some(a)) = (before, after) {
        report.count_node_changes(&b, &a);
    }
    report.workers = ctx.workers.clone();
    if let Some(p) = &args.json {
        let bytes = serde_json::to_vec_pretty(&report)?;
        std::fs::write(p, bytes).map_err(|error| BenchError::Write {
            path: p.clone(),
            error,
        })?;
    }
    Ok(report)
}

/// Refuses flags that cannot describe a run.
fn validate(args: &BenchArgs) -> Result<(), BenchError> {
    ensure(args.rate.is_finite() && args.rate > 0.0, || {
        "--rate must be a positive number of requests per second".into()
    })?;
    ensure(args.speedup.is_finite() && args.speedup > 0.0, || {
        "--speedup must be a positive number".into()
    })?;
    ensure(args.exponent.is_finite() && args.exponent >= 0.0, || {
        "--exponent must be a number >= 0".into()
    })?;
    ensure(args.timeout_s.is_finite() && args.timeout_s > 0.0, || {
        "--timeout-s must be a positive number of seconds".into()
    })?;
    if let Some(d) = args.duration_s {
        ensure(d.is_finite() && d > 0.0, || {
            "--duration-s must be a positive number of seconds".into()
        })?;
    }
    ensure(args.max_outstanding >= 1, || {
        "--max-outstanding must be >= 1".into()
    })?;
    ensure(args.repeat >= 1, || "--repeat must be >= 1".into())?;
    ensure(args.path.starts_with('/'), || {
        format!("--path must start with / (got {:?})", args.path)
    })?;
    ensure(!args.targets.is_empty(), || {
        "say where to send requests: --target URL (a node's front door)".into()
    })?;
    Ok(())
}

/// The HTTP client, the admin APIs, and the Workers to drive (discovered
/// from the first admin API unless named).
async fn connect(
    args: &BenchArgs,
    targets: Vec<String>,
    admins: Vec<String>,
) -> Result<(Arc<Ctx>, Admin), BenchError> {
    let timeout = Duration::from_secs_f64(args.timeout_s);
    let client: HttpClient = Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(args.max_outstanding)
        .build_http();
    let admin = Admin {
        nodes: admins
            .iter()
            .map(|url| AdminClient::new(url, args.token.clone()).map(|c| c.with_timeout(timeout)))
            .collect::<Result<_, _>>()?,
    };
    let workers = match (&args.worker, args.workers.is_empty()) {
        (Some(w), _) => vec![w.clone()],
        (None, false) => args.workers.clone(),
        (None, true) => admin.discover().await?,
    };
    let ctx = Arc::new(Ctx {
        client,
        targets,
        workers,
        path: args.path.clone(),
        host_suffix: args.host_suffix.trim_start_matches('.').to_string(),
        timeout,
    });
    Ok((ctx, admin))
}

impl BenchReport {
    /// What the nodes counted during the run: the differences between
    /// their counters `before` and `after` (resident memory as it is at the
    /// end).
    fn count_node_changes(&mut self, before: &Counters, after: &Counters) {
        let evictions = after.evictions.saturating_sub(before.evictions);
        self.evictions = Some(evictions);
        self.evictions_per_1k = Some(evictions as f64 * 1000.0 / self.requests.max(1) as f64);
        self.manual_evictions = Some(after.manual.saturating_sub(before.manual));
        self.resident_bytes = Some(after.resident_bytes);
        self.refusals = after
            .refusals
            .zip(before.refusals)
            .map(|(a, b)| a.saturating_sub(b));
    }
}

/// The schedule of a Zipf or trace run, its mode and a description.
fn schedule(
    args: &BenchArgs,
    ctx: &Ctx,
    trace: Option<&trace::Trace>,
) -> Result<(Vec<Planned>, String, String), BenchError> {
    let mut rng = StdRng::seed_from_u64(args.seed);
    let n_targets = ctx.targets.len();
    let target = |i: usize, rng: &mut StdRng| match args.spread {
        Spread::RoundRobin => i % n_targets,
        Spread::Random => rng.random_range(0..n_targets),
    };
    let n_workers = ctx.workers.len();
    let mut plan = Vec::new();
    match trace {
        Some(trace) => {
            ensure(!trace.is_empty(), || "the trace has no invocations".into())?;
            let by_name = trace.workers.iter().all(|w| ctx.workers.contains(w));
            let map: Vec<usize> = trace
                .workers
                .iter()
                .enumerate()
                .map(|(i, w)| {
                    if by_name {
                        ctx.workers.iter().position(|d| d == w).unwrap_or(0)
                    } else {
                        i % n_workers
                    }
                })
                .collect();
            let t0 = trace.events.first().map_or(0, |e| e.t_ms);
            let limit = args.requests.map_or(usize::MAX, |n| n as usize);
            for e in trace.events.iter().take(limit) {
                let at_ms = (e.t_ms - t0) as f64 / args.speedup;
                if args.duration_s.is_some_and(|d| at_ms > d * 1e3) {
                    break;
                }
                let worker = map.get(e.worker as usize).copied().unwrap_or(0);
                let i = plan.len();
                plan.push(Planned {
                    at_ms,
                    worker,
                    target: target(i, &mut rng),
                });
            }
            let description = format!(
                "hearth bench: trace replay, {} of {} invocations over {} trace Workers onto {} Workers ({}), {}x speed, {} targets",
                plan.len(),
                trace.len(),
                trace.workers.len(),
                n_workers,
                if by_name { "by name" } else { "by index mod n" },
                args.speedup,
                n_targets
            );
            Ok((plan, "trace".into(), description))
        }
        None => {
            let count = match (args.requests, args.duration_s) {
                (Some(n), _) => n,
                (None, Some(d)) => (d * args.rate).ceil() as u64,
                (None, None) => 1000,
            };
            let zipf = Zipf::new(n_workers, args.exponent);
            let gap_ms = 1e3 / args.rate;
            let mut at_ms = 0.0;
            for i in 0..count as usize {
                plan.push(Planned {
                    at_ms,
                    worker: zipf.sample(&mut rng) as usize,
                    target: target(i, &mut rng),
                });
                at_ms += match args.arrivals {
                    Arrivals::Constant => gap_ms,
                    Arrivals::Poisson => -gap_ms * (1.0 - rng.random::<f64>()).ln(),
                };
            }
            let description = format!(
                "hearth bench: {count} requests, Zipf s={} over {n_workers} Workers, {} req/s ({} arrivals, open loop), {n_targets} targets",
                args.exponent,
                args.rate,
                match args.arrivals {
                    Arrivals::Constant => "constant",
                    Arrivals::Poisson => "Poisson",
                }
            );
            Ok((plan, "zipf".into(), description))
        }
    }
}

/// Adds one outcome to the report's counts; returns its latency if the
/// response was 2xx, with whether it was cold.
fn tally(r: &mut BenchReport, o: &Outcome) -> Option<(bool, f64)> {
    r.requests += 1;
    if let (Some(e), None) = (&o.error, &r.first_error) {
        r.first_error = Some(e.clone());
    }
    if !(200..300).contains(&o.status) {
        r.failed += 1;
        *r.failures_by_status.entry(o.status).or_default() += 1;
        return None;
    }
    if !o.route.is_empty() {
        *r.routes.entry(o.route.clone()).or_default() += 1;
    }
    if !o.node.is_empty() {
        *r.served_by.entry(o.node.clone()).or_default() += 1;
    }
    match o.start.as_str() {
        "cold" => {
            r.cold += 1;
            Some((true, o.latency_ms))
        }
        "warm" => {
            r.warm += 1;
            Some((false, o.latency_ms))
        }
        _ => {
            r.unmarked += 1;
            None
        }
    }
}

/// Sends `plan` open loop and tallies the outcomes.
async fn open_loop(
    args: &BenchArgs,
    ctx: &Arc<Ctx>,
    plan: Vec<Planned>,
) -> Result<BenchReport, BenchError> {
    let mut report = BenchReport {
        planned: plan.len() as u64,
        ..BenchReport::default()
    };
    let bar = indicatif::ProgressBar::new(plan.len() as u64);
    bar.set_style(
        indicatif::ProgressStyle::with_template("{bar:40} {pos}/{len} requests {elapsed}")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    let permits = Arc::new(tokio::sync::Semaphore::new(args.max_outstanding));
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<Outcome>();
    let start = Instant::now();
    for p in &plan {
        let due = start + Duration::from_secs_f64(p.at_ms / 1e3);
        tokio::time::sleep_until(due).await;
        bar.inc(1);
        let Ok(permit) = permits.clone().try_acquire_owned() else {
            report.not_sent += 1;
            continue;
        };
        if Instant::now().duration_since(due).as_secs_f64() * 1e3 > LATE_MS {
            report.late += 1;
        }
        let (ctx, tx, p) = (ctx.clone(), tx.clone(), *p);
        tokio::spawn(async move {
            let o = ctx.send(p.worker, p.target).await;
            drop(permit);
            let _ = tx.send(o);
        });
    }
    drop(tx);
    let (mut warm, mut cold) = (Vec::new(), Vec::new());
    while let Some(o) = rx.recv().await {
        match tally(&mut report, &o) {
            Some((true, ms)) => cold.push(ms),
            Some((false, ms)) => warm.push(ms),
            None => {}
        }
    }
    bar.finish_and_clear();
    report.seconds = start.elapsed().as_secs_f64();
    report.achieved_rate = report.requests as f64 / report.seconds.max(1e-9);
    report.warm_latency = Distribution::of(&warm);
    report.cold_latency = Distribution::of(&cold);
    Ok(report)
}

/// The `--cold` run: `repeat` × (evict everywhere, one request), then
/// `repeat` warm requests.
async fn cold_run(args: &BenchArgs, ctx: &Ctx, admin: &Admin) -> Result<BenchReport, BenchError> {
    let id = ctx
        .workers
        .first()
        .ok_or_else(|| BenchError::Usage("--cold needs --worker ID".into()))?;
    let mut report = BenchReport {
        mode: "cold".into(),
        description: format!(
            "hearth bench: cold vs warm latency of {id}: {} cold requests (evicted on {} nodes before each), then {} warm, {} targets",
            args.repeat,
            admin.nodes.len(),
            args.repeat,
            ctx.targets.len()
        ),
        planned: 2 * args.repeat as u64,
        ..BenchReport::default()
    };
    let (mut warm, mut cold) = (Vec::new(), Vec::new());
    let start = Instant::now();
    for i in 0..2 * args.repeat {
        let phase = if i < args.repeat { "cold" } else { "warm" };
        if phase == "cold" {
            admin
                .evict_everywhere(id)
                .await
                .map_err(|error| BenchError::Evict {
                    id: id.clone(),
                    error: Box::new(error),
                })?;
        }
        let o = ctx.send(0, i % ctx.targets.len()).await;
        match tally(&mut report, &o) {
            Some((true, ms)) => cold.push(ms),
            Some((false, ms)) => warm.push(ms),
            None => {}
        }
        report.samples.push(Sample {
            phase,
            status: o.status,
            start: o.start,
            route: o.route,
            node: o.node,
            server_timing: o.server_timing,
            latency_ms: o.latency_ms,
            error: o.error,
        });
    }
    report.seconds = start.elapsed().as_secs_f64();
    report.achieved_rate = report.requests as f64 / report.seconds.max(1e-9);
    report.warm_latency = Distribution::of(&warm);
    report.cold_latency = Distribution::of(&cold);
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_are_checked() {
        assert_eq!(
            normalize_url("127.0.0.1:8080/", "--target").ok().as_deref(),
            Some("http://127.0.0.1:8080")
        );
        assert!(normalize_url("https://x:1", "--target").is_err());
        assert!(normalize_url("http://", "--target").is_err());
        assert!(normalize_url("not a url", "--target").is_err());
    }

    #[test]
    fn flags_parse_with_defaults() {
        let a = BenchArgs::try_parse_from([
            "bench",
            "--target",
            "http://a:1,http://b:2",
            "--target",
            "http://c:3",
            "--workers",
            "x,y",
        ])
        .expect("flags");
        assert_eq!(a.targets.len(), 3);
        assert_eq!(a.workers, ["x", "y"]);
        assert_eq!(a.rate, 100.0);
        assert!(!a.cold);
        assert!(BenchArgs::try_parse_from(["bench", "--cold"]).is_err());
    }
}
