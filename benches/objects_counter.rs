//! Durable Objects through a node's crash, measured (issue 43's counter
//! bench): `cargo bench -p hearth --bench objects_counter`.
//!
//! * **Cluster.** Three `hearth serve` processes over one S3 store
//!   (Garage) with the objects' heads fenced in etcd (both must be
//!   installed): the deployment for nodes that share no disk, so nothing an
//!   object wrote lives only on the node that wrote it
//!   ([`hearth::testing::Rollout`] starts them).
//! * **Worker.** [`COUNTER`], Cloudflare's counter with a read: `POST
//!   /<name>/` increments the object called `<name>` and answers its new
//!   count, `GET /<name>/` reads it, `GET /<name>/id` gives its ID.
//!   Deployed with `durable_object=COUNTER:Counter`.
//! * **Load.** `RATE` increments a second (open loop: each at its time),
//!   over `OBJECTS` objects in turn, sent to the three front doors in turn
//!   on keep-alive connections; `PHASE_S` seconds of steady load, then the
//!   busiest object home (the node that is home to the most objects) is
//!   killed with SIGKILL and the load goes on `PHASE_S` seconds through
//!   the two others (a load balancer would stop sending to the dead node;
//!   this one does at once). During the steady phase the same Worker on
//!   workerd (its `localDisk` Durable Objects: SQLite on this machine's
//!   disk, no replica) gets the same increments from the same client, so
//!   both rows see the same machine.
//!
//! Printed: a latency table (steady phase) of hearth's increments by the
//! hops they took (front door → the Worker's home → the object's home,
//! each arrow a Cap'n Proto hop when the two nodes differ) beside
//! workerd's; the count check (per object, the final count must be the
//! acknowledged increments, or more by at most the increments that got an
//! error or no answer: those may or may not have run, never twice); and
//! the failover (for the killed node's objects: how long after the kill
//! the first increment was acknowledged, and that increment's latency).
//!
//! Settings: `RATE` (increments a second, 100), `OBJECTS` (12), `PHASE_S`
//! (10). `HEARTH_BENCH_BIN` runs another build of `hearth`.

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;

use hearth::testing::{Etcd, Garage, Rollout, Workerd, build_js};
use hearth_report::latency::Distribution;
use hearth_report::table::{Align, Table};

mod support;

/// The Worker: Cloudflare's counter with a read (the demo's).
const COUNTER: &str = hearth::demo::objects::COUNTER;

/// The script ID the Worker is deployed as.
const SCRIPT: &str = "counter";
/// A request with no answer after this long is lost.
const TIMEOUT: Duration = Duration::from_secs(10);

type HttpClient = Client<HttpConnector, Full<Bytes>>;

/// What one increment did.
#[derive(Debug, Clone)]
enum Outcome {
    /// Acknowledged: 200 and the new count.
    Count(u64),
    /// Answered with something else: status and the start of the body.
    Error(u16, String),
    /// Sent, and no answer (connection ended, or [`TIMEOUT`]).
    Lost(String),
}

/// One increment of the load.
#[derive(Debug, Clone)]
struct Record {
    object: usize,
    /// The front door's index, or `None` for workerd.
    front: Option<usize>,
    /// Sent at, from the start of the load.
    sent: Duration,
    latency: Duration,
    outcome: Outcome,
}

fn client() -> HttpClient {
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    connector.set_connect_timeout(Some(Duration::from_secs(1)));
    Client::builder(TokioExecutor::new())
        .pool_idle_timeout(Duration::from_secs(5))
        .build(connector)
}

/// Sends `method /<object name>/<what>` to `addr`; the status and body.
async fn send(
    client: &HttpClient,
    addr: SocketAddr,
    method: &str,
    object: usize,
    what: &str,
) -> Result<(u16, String), String> {
    let req = http::Request::builder()
        .method(method)
        .uri(format!("http://{addr}/o{object}/{what}"))
        .header(http::header::HOST, format!("{SCRIPT}.localhost"))
        .body(Full::new(Bytes::new()))
        .map_err(|e| e.to_string())?;
    let answer = async {
        let resp = client.request(req).await.map_err(|e| format!("{e:?}"))?;
        let status = resp.status().as_u16();
        let body = resp
            .into_body()
            .collect()
            .await
            .map_err(|e| e.to_string())?
            .to_bytes();
        Ok((status, String::from_utf8_lossy(&body).into_owned()))
    };
    tokio::time::timeout(TIMEOUT, answer)
        .await
        .map_err(|_| format!("no answer in {TIMEOUT:?}"))?
}

/// One increment of `object` at `addr`, recorded.
async fn increment(
    client: &HttpClient,
    addr: SocketAddr,
    front: Option<usize>,
    object: usize,
    start: Instant,
) -> Record {
    let t = Instant::now();
    let outcome = match send(client, addr, "POST", object, "").await {
        Ok((200, body)) => match body.trim().parse() {
            Ok(n) => Outcome::Count(n),
            Err(_) => Outcome::Error(200, body.chars().take(80).collect()),
        },
        Ok((status, body)) => Outcome::Error(status, body.chars().take(80).collect()),
        Err(e) => Outcome::Lost(e),
    };
    Record {
        object,
        front,
        sent: t - start,
        latency: t.elapsed(),
        outcome,
    }
}

/// The open-loop load (see the module docs): until `stop`, one increment
/// every `1/rate` s, objects and live front doors in turn; also to
/// `workerd` while `mirror` is set.
struct Load {
    stop: Arc<AtomicBool>,
    mirror: Arc<AtomicBool>,
    dead: Arc<Mutex<Option<usize>>>,
    records: Arc<Mutex<Vec<Record>>>,
    driver: tokio::task::JoinHandle<()>,
    start: Instant,
}

impl Load {
    fn start(fronts: Vec<SocketAddr>, workerd: SocketAddr, rate: u32, objects: usize) -> Load {
        let (stop, mirror) = (
            Arc::new(AtomicBool::new(false)),
            Arc::new(AtomicBool::new(true)),
        );
        let dead = Arc::new(Mutex::new(None::<usize>));
        let records = Arc::new(Mutex::new(Vec::new()));
        let start = Instant::now();
        let driver = tokio::spawn({
            let (stop, mirror, dead, records) =
                (stop.clone(), mirror.clone(), dead.clone(), records.clone());
            async move {
                let client = client();
                let next_front = AtomicUsize::new(0);
                let gap = Duration::from_secs_f64(1.0 / f64::from(rate.max(1)));
                let t0 = tokio::time::Instant::from_std(start);
                let mut inflight = tokio::task::JoinSet::new();
                let mut n = 0u32;
                while !stop.load(Ordering::Relaxed) {
                    n += 1;
                    tokio::time::sleep_until(t0 + gap * n).await;
                    let object = n as usize % objects;
                    let down = *dead.lock().unwrap_or_else(|p| p.into_inner());
                    let front = loop {
                        let f = next_front.fetch_add(1, Ordering::Relaxed) % fronts.len();
                        if Some(f) != down {
                            break f;
                        }
                    };
                    let (c, r, addr) = (client.clone(), records.clone(), fronts[front]);
                    inflight.spawn(async move {
                        let rec = increment(&c, addr, Some(front), object, start).await;
                        r.lock().unwrap_or_else(|p| p.into_inner()).push(rec);
                    });
                    if mirror.load(Ordering::Relaxed) {
                        let (c, r) = (client.clone(), records.clone());
                        inflight.spawn(async move {
                            let rec = increment(&c, workerd, None, object, start).await;
                            r.lock().unwrap_or_else(|p| p.into_inner()).push(rec);
                        });
                    }
                    while inflight.try_join_next().is_some() {}
                }
                while inflight.join_next().await.is_some() {}
            }
        });
        Load {
            stop,
            mirror,
            dead,
            records,
            driver,
            start,
        }
    }

    async fn stop(self) -> Vec<Record> {
        self.stop.store(true, Ordering::Relaxed);
        let _ = self.driver.await;
        let mut r = std::mem::take(&mut *self.records.lock().unwrap_or_else(|p| p.into_inner()));
        r.sort_by_key(|r| r.sent);
        r
    }
}

impl std::fmt::Display for Outcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Outcome::Count(n) => write!(f, "count {n}"),
            Outcome::Error(status, body) => write!(f, "{status} {body}"),
            Outcome::Lost(why) => write!(f, "no answer: {why}"),
        }
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn main() -> anyhow::Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    rt.block_on(run())
}

async fn run() -> anyhow::Result<()> {
    let rate = u32::try_from(support::env_or("RATE", 100))?;
    let objects = usize::try_from(support::env_or("OBJECTS", 12))?.max(1);
    let phase = Duration::from_secs(support::env_or("PHASE_S", 10));

    let wasm = build_js(COUNTER).context("building the counter with hearth's JS engine")?;
    let workerd = Workerd::serve_with_objects_on_disk(COUNTER, &[("COUNTER", "Counter")])
        .context("workerd (npm install @cloudflare/workerd-linux-64)")?;
    let garage = Garage::start().await?;
    let etcd = Etcd::start().await?;
    let extra = format!("[objects]\netcd = [\"{}\"]\n", etcd.endpoint());
    let mut c = Rollout::start_with(&support::bin(), garage, 3, 0, Duration::ZERO, &extra).await?;
    let admin = c.admin_client(0)?;
    admin
        .deploy(SCRIPT, "durable_object=COUNTER:Counter", wasm)
        .await
        .context("deploying the counter")?;
    let fronts: Vec<SocketAddr> = (0..c.nodes()).map(|i| c.http(i)).collect();
    let http = client();

    // Every node serves it (the deploy reached them), and where each
    // object and the Worker live.
    let ids: Vec<String> = (0..c.nodes()).map(|i| c.node_id(i).to_string()).collect();
    let index = |id: &str| ids.iter().position(|n| n == id);
    for (i, &addr) in fronts.iter().enumerate() {
        let t = Instant::now();
        while !matches!(send(&http, addr, "GET", 0, "id").await, Ok((200, _))) {
            anyhow::ensure!(
                t.elapsed() < Duration::from_secs(30),
                "node {i} never served the counter"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    let home_of = |key: String| {
        let admin = &admin;
        async move {
            let view = admin.ring(Some(&key)).await?;
            view.script
                .and_then(|s| s.home)
                .and_then(|h| index(&h))
                .with_context(|| format!("no home for {key}"))
        }
    };
    let worker_home = home_of(SCRIPT.to_string()).await?;
    let mut homes = Vec::new();
    for o in 0..objects {
        let (status, id) = send(&http, fronts[0], "GET", o, "id")
            .await
            .map_err(anyhow::Error::msg)?;
        anyhow::ensure!(status == 200, "o{o}/id: {status} {id}");
        homes.push(home_of(format!("do:{SCRIPT}/Counter/{}", id.trim())).await?);
    }
    let mut per_node = vec![0usize; c.nodes()];
    for &h in &homes {
        per_node[h] += 1;
    }
    let busiest = (0..c.nodes())
        .max_by_key(|&i| per_node[i])
        .context("no node")?;

    // Steady load (hearth and workerd), then the kill, then hearth alone.
    let load = Load::start(fronts.clone(), workerd.addr(), rate, objects);
    tokio::time::sleep(phase).await;
    load.mirror.store(false, Ordering::Relaxed);
    *load.dead.lock().unwrap_or_else(|p| p.into_inner()) = Some(busiest);
    let (signalled, gone) = c.kill(busiest).await?;
    let killed_at = signalled - load.start;
    tokio::time::sleep(phase).await;
    let records = load.stop().await;

    // The final counts, read through a survivor once the ring has settled.
    let survivor = fronts[(busiest + 1) % fronts.len()];
    let mut finals = Vec::new();
    for o in 0..objects {
        let t = Instant::now();
        loop {
            match send(&http, survivor, "GET", o, "").await {
                Ok((200, n)) => {
                    finals.push(n.trim().parse::<u64>().context("a count")?);
                    break;
                }
                other if t.elapsed() > Duration::from_secs(30) => {
                    anyhow::bail!("o{o} could not be read after the run: {other:?}")
                }
                _ => tokio::time::sleep(Duration::from_millis(200)).await,
            }
        }
    }

    report(&Report {
        records: &records,
        rate,
        phase,
        objects,
        homes: &homes,
        worker_home,
        busiest,
        ids: &ids,
        killed_at,
        gone: gone - signalled,
        finals: &finals,
    });
    Ok(())
}

/// Everything the report prints from.
struct Report<'a> {
    records: &'a [Record],
    rate: u32,
    phase: Duration,
    objects: usize,
    homes: &'a [usize],
    worker_home: usize,
    busiest: usize,
    ids: &'a [String],
    killed_at: Duration,
    gone: Duration,
    finals: &'a [u64],
}

fn report(r: &Report) {
    println!(
        "objects counter: 3 hearth serve processes (Garage store, etcd fence), {} objects, \
         {} increments/s, {:?} steady then {:?} after SIGKILL of {} (home of {} objects; \
         the Worker's home is {})\n",
        r.objects,
        r.rate,
        r.phase,
        r.phase,
        r.ids[r.busiest],
        r.homes.iter().filter(|&&h| h == r.busiest).count(),
        r.ids[r.worker_home],
    );

    // Latency in the steady phase, by hops.
    let steady = |rec: &&Record| rec.sent < r.killed_at;
    let mut rows: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    let mut failed: BTreeMap<String, usize> = BTreeMap::new();
    for rec in r.records.iter().filter(steady) {
        let row = match rec.front {
            None => "workerd 1.2026 (localDisk objects, one process)".to_string(),
            Some(front) => {
                let hops = usize::from(front != r.worker_home)
                    + usize::from(r.worker_home != r.homes[rec.object]);
                format!("hearth, {hops} hop{}", if hops == 1 { "" } else { "s" })
            }
        };
        match rec.outcome {
            Outcome::Count(_) => rows.entry(row).or_default().push(ms(rec.latency)),
            _ => *failed.entry(row).or_default() += 1,
        }
    }
    let mut table = Table::new([
        "increment (steady phase)",
        "acknowledged",
        "failed",
        "p50 / p99 ms",
    ])
    .align([Align::Left, Align::Right, Align::Right, Align::Right]);
    for (row, samples) in &rows {
        table.row([
            row.clone(),
            samples.len().to_string(),
            failed.get(row).copied().unwrap_or(0).to_string(),
            Distribution::of(samples).p50_p99(),
        ]);
    }
    println!("{table}");
    for x in r
        .records
        .iter()
        .filter(steady)
        .filter(|x| !matches!(x.outcome, Outcome::Count(_)))
        .take(5)
    {
        println!(
            "  failed (steady): o{} at {:.3?} via {:?}: {}",
            x.object, x.sent, x.front, x.outcome
        );
    }

    // The counts.
    let hearth: Vec<&Record> = r.records.iter().filter(|x| x.front.is_some()).collect();
    let mut acked = vec![0u64; r.objects];
    let mut unsure = vec![0u64; r.objects];
    let mut seen: HashMap<(usize, u64), usize> = HashMap::new();
    for rec in &hearth {
        match rec.outcome {
            Outcome::Count(n) => {
                acked[rec.object] += 1;
                *seen.entry((rec.object, n)).or_default() += 1;
            }
            _ => unsure[rec.object] += 1,
        }
    }
    let twice = seen.values().filter(|&&k| k > 1).count();
    let mut bad = Vec::new();
    for o in 0..r.objects {
        let ok = acked[o] <= r.finals[o] && r.finals[o] <= acked[o] + unsure[o];
        if !ok {
            bad.push(format!(
                "o{o}: final {} with {} acknowledged and {} unsure",
                r.finals[o], acked[o], unsure[o]
            ));
        }
    }
    let mut counts =
        Table::new(["count check (whole run)", "value"]).align([Align::Left, Align::Right]);
    counts.row(["increments sent".to_string(), hearth.len().to_string()]);
    counts.row([
        "acknowledged (200 with a count)".to_string(),
        acked.iter().sum::<u64>().to_string(),
    ]);
    counts.row([
        "errors or no answer".to_string(),
        unsure.iter().sum::<u64>().to_string(),
    ]);
    counts.row([
        "final counts, summed".to_string(),
        r.finals.iter().sum::<u64>().to_string(),
    ]);
    counts.row(["counts acknowledged twice".to_string(), twice.to_string()]);
    counts.row([
        "objects whose final count is off".to_string(),
        bad.len().to_string(),
    ]);
    println!("{counts}");
    for b in &bad {
        println!("  {b}");
    }

    // The failover of the killed node's objects.
    let after: Vec<&&Record> = hearth.iter().filter(|x| x.sent >= r.killed_at).collect();
    let mut gaps = Vec::new();
    let mut firsts = Vec::new();
    for o in (0..r.objects).filter(|&o| r.homes[o] == r.busiest) {
        if let Some(first) = after
            .iter()
            .find(|x| x.object == o && matches!(x.outcome, Outcome::Count(_)))
        {
            gaps.push(ms(first.sent + first.latency - r.killed_at));
            firsts.push(ms(first.latency));
        }
    }
    let errors_after: usize = after
        .iter()
        .filter(|x| !matches!(x.outcome, Outcome::Count(_)))
        .count();
    let mut failover = Table::new(["failover (killed node's objects)", "value"])
        .align([Align::Left, Align::Right]);
    failover.row([
        "process gone after SIGKILL".to_string(),
        format!("{:.1} ms", ms(r.gone)),
    ]);
    failover.row([
        "kill to first acknowledged increment, p50 / p99 ms".to_string(),
        Distribution::of(&gaps).p50_p99(),
    ]);
    failover.row([
        "that increment's own latency, p50 / p99 ms".to_string(),
        Distribution::of(&firsts).p50_p99(),
    ]);
    failover.row([
        "increments failed after the kill".to_string(),
        errors_after.to_string(),
    ]);
    println!("{failover}");
    for x in after
        .iter()
        .filter(|x| !matches!(x.outcome, Outcome::Count(_)))
        .take(5)
    {
        println!(
            "  failed: o{} at {:.3?} via node {:?}: {}",
            x.object, x.sent, x.front, x.outcome
        );
    }
}
