//! What the shard hop costs: `hello` on a 3-node `hearth cluster` (its own
//! process, loopback, mTLS Cap'n Proto between nodes), requests sent to the
//! Worker's home ("local") vs to another node, which forwards them to the
//! home ("sharded"), side by side in one run:
//!
//! * **1 connection**: a local and a sharded request alternate, each on its
//!   own keep-alive connection, so both rows see the same machine;
//! * **32 connections**: phases of local and sharded load alternate
//!   (`HEARTH_BENCH_ROUNDS` rounds of `HEARTH_BENCH_SECONDS` each);
//! * **paced**: the traffic sharding exists for — one request at a time,
//!   `HEARTH_BENCH_PACE_MS` apart (default 5, i.e. 200 req/s), local and
//!   sharded alternating, so the cluster's threads are asleep when each
//!   request arrives. Beside the latencies it prints the cluster's thread
//!   wake-ups per request (context switches of all its threads, counted
//!   from `/proc`, in total and by thread name, as for the 1-connection
//!   pairs) and its CPU use while idle, so a change that buys latency by
//!   spinning shows up, and so does a thread a request should not wake.
//!   Two more rows give this VM's floor, paced the same way in the same
//!   loop: a bare HTTP responder ("floor: bare echo", no runtime) and a
//!   bare byte relay in front of it ("floor: bare relay", one more
//!   process to wake each way, the least a hop can add), each a child
//!   process of this bench on blocking sockets; their back-to-back p50s
//!   are printed too, so the paced/back-to-back ratio of a bare server
//!   and the hop's excess over a bare relay are read from one run.
//!
//! ```sh
//! cargo bench -p hearth --bench shard_hop
//! ```
//!
//! The load client is this process (hyper, one thread), not the cluster's.
//! Settings: `HEARTH_BENCH_REQUESTS` (1-connection pairs, 3000),
//! `HEARTH_BENCH_SECONDS` (per phase, 3), `HEARTH_BENCH_ROUNDS` (2),
//! `HEARTH_BENCH_PACED` (paced pairs, 400), `HEARTH_BENCH_PACE_MS` (5).

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use hearth::testing::ProcStat;

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::TokioIo;

mod support;
use support::*;

const HOST: &str = "hello.localhost";

/// The VM's own floor for the paced rows: the same client, the same pace,
/// against a bare HTTP responder with no runtime behind it ("echo"), and
/// against a bare byte relay in front of it ("relay", what a hop adds at
/// the least: one more process to wake each way). Both are child processes
/// of this bench (itself, re-run with `HEARTH_BENCH_FLOOR`), blocking
/// `std::net` on one thread each, so the rows measure the machine's
/// wake-up and loopback cost and nothing of hearth's.
mod floor {
    use std::io::{BufRead, BufReader, Read, Write};
    use std::net::{SocketAddr, TcpListener, TcpStream};
    use std::process::{Command, Stdio};

    /// The echo's answer: what `hello` answers, as far as the client cares.
    const RESPONSE: &[u8] =
        b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\nx-hearth-route: floor\r\n\r\nhello";

    /// If this process was started as a floor server, serves until killed
    /// and never returns.
    pub(crate) fn serve_if_asked() {
        let Ok(role) = std::env::var("HEARTH_BENCH_FLOOR") else {
            return;
        };
        let result = (|| -> std::io::Result<()> {
            let listener = TcpListener::bind("127.0.0.1:0")?;
            println!("{}", listener.local_addr()?);
            std::io::stdout().flush()?;
            let upstream: Option<SocketAddr> = std::env::var("HEARTH_BENCH_FLOOR_UPSTREAM")
                .ok()
                .and_then(|a| a.parse().ok());
            for conn in listener.incoming() {
                let conn = conn?;
                conn.set_nodelay(true)?;
                let role = role.clone();
                std::thread::spawn(move || {
                    let _ = match (role.as_str(), upstream) {
                        ("relay", Some(up)) => relay(conn, up),
                        _ => echo(conn),
                    };
                });
            }
            Ok(())
        })();
        if let Err(e) = result {
            eprintln!("floor server: {e}");
        }
        std::process::exit(0);
    }

    /// Reads one bodiless request's head (up to the blank line) into `buf`;
    /// false at end of stream.
    fn read_head(conn: &mut TcpStream, buf: &mut Vec<u8>) -> std::io::Result<bool> {
        buf.clear();
        let mut chunk = [0u8; 4096];
        while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
            let n = conn.read(&mut chunk)?;
            if n == 0 {
                return Ok(false);
            }
            buf.extend_from_slice(&chunk[..n]);
        }
        Ok(true)
    }

    fn echo(mut conn: TcpStream) -> std::io::Result<()> {
        let mut buf = Vec::new();
        while read_head(&mut conn, &mut buf)? {
            conn.write_all(RESPONSE)?;
        }
        Ok(())
    }

    fn relay(mut conn: TcpStream, upstream: SocketAddr) -> std::io::Result<()> {
        let mut up = TcpStream::connect(upstream)?;
        up.set_nodelay(true)?;
        let (mut buf, mut answer) = (Vec::new(), vec![0u8; RESPONSE.len()]);
        while read_head(&mut conn, &mut buf)? {
            up.write_all(&buf)?;
            up.read_exact(&mut answer)?;
            conn.write_all(&answer)?;
        }
        Ok(())
    }

    /// Starts a floor server (`echo`, or `relay` to `upstream`) as a child
    /// process; returns it and its address.
    pub(crate) fn start(
        role: &str,
        upstream: Option<SocketAddr>,
    ) -> anyhow::Result<(super::Process, SocketAddr)> {
        let mut cmd = Command::new(std::env::current_exe()?);
        cmd.env("HEARTH_BENCH_FLOOR", role)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        if let Some(up) = upstream {
            cmd.env("HEARTH_BENCH_FLOOR_UPSTREAM", up.to_string());
        }
        let mut proc = super::Process::spawn(&mut cmd)?;
        let stdout = proc
            .take_stdout()
            .ok_or_else(|| anyhow::anyhow!("no stdout"))?;
        let mut line = String::new();
        BufReader::new(stdout).read_line(&mut line)?;
        let addr = line
            .trim()
            .parse()
            .map_err(|e| anyhow::anyhow!("floor {role} printed {line:?}: {e}"))?;
        Ok((proc, addr))
    }
}

/// One keep-alive HTTP/1.1 connection to a node's front door.
struct Conn {
    send: hyper::client::conn::http1::SendRequest<Empty<Bytes>>,
}

impl Conn {
    async fn open(addr: SocketAddr) -> anyhow::Result<Conn> {
        let tcp = tokio::net::TcpStream::connect(addr).await?;
        tcp.set_nodelay(true)?;
        let (send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp)).await?;
        tokio::spawn(conn);
        Ok(Conn { send })
    }

    /// GET / for `hello`; returns its `x-hearth-route`.
    async fn get(&mut self) -> anyhow::Result<String> {
        let req = http::Request::get("/")
            .header(http::header::HOST, HOST)
            .body(Empty::new())?;
        let resp = self.send.send_request(req).await?;
        let status = resp.status();
        let route = resp
            .headers()
            .get("x-hearth-route")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_string();
        let body = resp.into_body().collect().await?.to_bytes();
        anyhow::ensure!(
            status == 200,
            "{status}: {}",
            String::from_utf8_lossy(&body)
        );
        Ok(route)
    }
}

/// Latencies of one row.
#[derive(Default)]
struct Row {
    latencies: Vec<Duration>,
    elapsed: Duration,
    /// CPU time the cluster process spent serving them, if measured.
    cpu: Option<Duration>,
    /// Context switches of the cluster's threads while serving them, by
    /// thread name.
    by_thread: BTreeMap<String, u64>,
}

impl Row {
    /// Context switches of all the cluster's threads while serving them.
    fn switches(&self) -> u64 {
        self.by_thread.values().sum()
    }

    /// Cluster CPU per request: far less noisy than latency on a shared
    /// machine, since time stolen by other tenants is not counted.
    fn cpu_us(&self) -> f64 {
        self.cpu.map_or(f64::NAN, |c| {
            c.as_secs_f64() * 1e6 / self.latencies.len().max(1) as f64
        })
    }

    fn rps(&self) -> f64 {
        self.latencies.len() as f64 / self.elapsed.as_secs_f64()
    }

    fn mean_us(&self) -> f64 {
        let total: Duration = self.latencies.iter().sum();
        total.as_secs_f64() * 1e6 / self.latencies.len().max(1) as f64
    }

    fn pct_us(&mut self, p: f64) -> f64 {
        self.latencies.sort();
        let i = ((self.latencies.len().saturating_sub(1)) as f64 * p).round() as usize;
        self.latencies
            .get(i)
            .map_or(f64::NAN, |d| d.as_secs_f64() * 1e6)
    }
}

/// User plus system CPU time of process `pid` so far (Linux `/proc`).
fn cpu_of(pid: u32) -> Option<Duration> {
    ProcStat::of(pid).map(|s| s.cpu)
}

/// Context switches (voluntary and not) of every thread of process `pid`
/// so far: each is a thread going to sleep or being preempted, so the
/// count per request is the number of wake-ups serving it took.
fn switches_of(pid: u32) -> u64 {
    switches_by_thread(pid).values().sum()
}

/// [`switches_of`] by thread name (`hearth-rpc-0`, `hearth-epoch`,
/// `tokio-runtime-w`, …; threads of one name summed), to see which threads
/// a request wakes.
fn switches_by_thread(pid: u32) -> BTreeMap<String, u64> {
    let mut by_name = BTreeMap::new();
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return by_name;
    };
    for task in tasks.flatten() {
        let Ok(status) = std::fs::read_to_string(task.path().join("status")) else {
            continue;
        };
        let mut name = String::new();
        let mut switches = 0;
        for line in status.lines() {
            if let Some(n) = line.strip_prefix("Name:") {
                name = n.trim().to_string();
            } else if line.contains("ctxt_switches:") {
                switches += line
                    .split_whitespace()
                    .nth(1)
                    .and_then(|v| v.parse::<u64>().ok())
                    .unwrap_or(0);
            }
        }
        *by_name.entry(name).or_insert(0) += switches;
    }
    by_name
}

/// `after - before`, by thread name, added to `into`.
fn add_switches(
    into: &mut BTreeMap<String, u64>,
    before: &BTreeMap<String, u64>,
    after: &BTreeMap<String, u64>,
) {
    for (name, n) in after {
        let d = n.saturating_sub(before.get(name).copied().unwrap_or(0));
        *into.entry(name.clone()).or_insert(0) += d;
    }
}

/// `connections` clients sending back to back to `addr` for `secs`; the
/// CPU time of process `pid` meanwhile is added to the row.
async fn phase(
    addr: SocketAddr,
    connections: usize,
    secs: f64,
    pid: u32,
    row: &mut Row,
) -> anyhow::Result<()> {
    let mut conns = Vec::with_capacity(connections);
    for _ in 0..connections {
        let mut c = Conn::open(addr).await?;
        c.get().await?;
        conns.push(c);
    }
    let cpu_before = cpu_of(pid);
    let start = Instant::now();
    let end = start + Duration::from_secs_f64(secs);
    let mut tasks = tokio::task::JoinSet::new();
    for mut c in conns {
        tasks.spawn(async move {
            let mut lat = Vec::new();
            while Instant::now() < end {
                let t = Instant::now();
                c.get().await?;
                lat.push(t.elapsed());
            }
            anyhow::Ok(lat)
        });
    }
    while let Some(done) = tasks.join_next().await {
        row.latencies.extend(done??);
    }
    row.elapsed += start.elapsed();
    if let (Some(before), Some(after)) = (cpu_before, cpu_of(pid)) {
        row.cpu = Some(row.cpu.unwrap_or_default() + (after - before));
    }
    Ok(())
}

/// `pairs` times a request on each of `conns` in turn, back to back, each
/// one's latency into its row of `rows`.
async fn alternate(
    pairs: usize,
    rows: &mut [Row; 2],
    mut conns: [&mut Conn; 2],
) -> anyhow::Result<()> {
    for _ in 0..pairs {
        for (row, conn) in rows.iter_mut().zip(conns.iter_mut()) {
            let t = Instant::now();
            conn.get().await?;
            let d = t.elapsed();
            row.latencies.push(d);
            row.elapsed += d;
        }
    }
    Ok(())
}

/// Starts `hearth cluster --nodes 3` over `store`; returns it and the
/// nodes' front-door addresses.
fn start_cluster(store: &std::path::Path) -> anyhow::Result<(Process, Vec<SocketAddr>)> {
    let mut proc = Process::spawn(
        Command::new(bin())
            .args(["cluster", "--nodes", "3", "--store"])
            .arg(store)
            .env("RUST_LOG", "warn")
            .stdout(Stdio::piped())
            .stderr(Stdio::null()),
    )?;
    let stdout = proc
        .take_stdout()
        .ok_or_else(|| anyhow::anyhow!("no stdout"))?;
    let mut addrs = Vec::new();
    let mut lines = BufReader::new(stdout).lines();
    while let Some(line) = lines.next() {
        let line = line?;
        // "node-1  http://127.0.0.1:…  admin http://…  rpc …"
        if line.starts_with("node-")
            && let Some(addr) = line.split_whitespace().nth(1)
        {
            addrs.push(addr.trim_start_matches("http://").parse()?);
            if addrs.len() == 3 {
                // Read on, so the cluster's stdout never closes under it.
                std::thread::spawn(move || lines.for_each(drop));
                return Ok((proc, addrs));
            }
        }
    }
    anyhow::bail!("hearth cluster exited before listing its nodes")
}

fn main() -> anyhow::Result<()> {
    floor::serve_if_asked();
    let pairs = env_or("HEARTH_BENCH_REQUESTS", 3000) as usize;
    let secs = env_or("HEARTH_BENCH_SECONDS", 3) as f64;
    let rounds = env_or("HEARTH_BENCH_ROUNDS", 2);
    let paced_pairs = env_or("HEARTH_BENCH_PACED", 400);
    let pace_ms = env_or("HEARTH_BENCH_PACE_MS", 5).max(1);

    let dir = tempfile::tempdir()?;
    let store = dir.path().join("store");
    let hello = hearth_sample_workers::path("hello")
        .ok_or_else(|| anyhow::anyhow!("the hello sample is not built"))?;
    let out = Command::new(bin())
        .args(["deploy", "--store"])
        .arg(&store)
        .args(["--name", "hello"])
        .arg(hello)
        .output()?;
    anyhow::ensure!(
        out.status.success(),
        "deploy: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (cluster, nodes) = start_cluster(&store)?;
    let (_echo, echo_addr) = floor::start("echo", None)?;
    let (_relay, relay_addr) = floor::start("relay", Some(echo_addr))?;
    let pid = cluster.pid();
    for addr in &nodes {
        wait_ready(*addr, HOST, Duration::from_secs(120));
    }

    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(async {
        // The home serves it as `home` or `local`; the others forward it.
        let mut home = None;
        for (i, addr) in nodes.iter().enumerate() {
            let route = Conn::open(*addr).await?.get().await?;
            if route != "sharded" {
                home = Some(i);
            }
        }
        let home = home.ok_or_else(|| anyhow::anyhow!("no node serves hello itself"))?;
        let other = (home + 1) % nodes.len();
        let (local_addr, sharded_addr) = (nodes[home], nodes[other]);

        let mut one = [Row::default(), Row::default()];
        let mut local = Conn::open(local_addr).await?;
        let mut sharded = Conn::open(sharded_addr).await?;
        for _ in 0..300 {
            local.get().await?;
            anyhow::ensure!(sharded.get().await? == "sharded", "not sharded");
        }
        let before = switches_by_thread(pid);
        alternate(pairs, &mut one, [&mut local, &mut sharded]).await?;
        // Both routes together: the pair's wake-ups, by thread.
        let mut back_to_back = BTreeMap::new();
        add_switches(&mut back_to_back, &before, &switches_by_thread(pid));

        // The floor, back to back the same way (after the cluster's pairs,
        // so their figures are not changed by requests between them).
        let mut floor_one = [Row::default(), Row::default()];
        let mut echo = Conn::open(echo_addr).await?;
        let mut relay = Conn::open(relay_addr).await?;
        alternate(pairs, &mut floor_one, [&mut echo, &mut relay]).await?;

        // Paced: one request every `pace`, the routes and then the floor's
        // two in turn; the cluster's switches and CPU are read between
        // requests, while all is idle (for the floor's rows they count
        // nothing: the cluster is not on their path).
        let mut paced = [Row::default(), Row::default(), Row::default(), Row::default()];
        let pace = Duration::from_millis(pace_ms);
        let mut next = Instant::now();
        for _ in 0..paced_pairs {
            let conns = [&mut local, &mut sharded, &mut echo, &mut relay];
            for (row, conn) in paced.iter_mut().zip(conns) {
                next += pace;
                tokio::time::sleep_until(next.into()).await;
                let (cpu, switches) = (cpu_of(pid), switches_by_thread(pid));
                let t = Instant::now();
                conn.get().await?;
                let d = t.elapsed();
                row.latencies.push(d);
                row.elapsed += pace;
                // The request's work may end after its response: read the
                // counters just before the next send instead.
                tokio::time::sleep_until((next + pace - Duration::from_micros(200)).into())
                    .await;
                add_switches(&mut row.by_thread, &switches, &switches_by_thread(pid));
                if let (Some(a), Some(b)) = (cpu, cpu_of(pid)) {
                    row.cpu = Some(row.cpu.unwrap_or_default() + (b - a));
                }
            }
        }
        let idle_secs = 2;
        let (idle_cpu, idle_switches) = (cpu_of(pid), switches_of(pid));
        tokio::time::sleep(Duration::from_secs(idle_secs)).await;
        let idle_cpu = match (idle_cpu, cpu_of(pid)) {
            (Some(a), Some(b)) => format!("{:.1}%", (b - a).as_secs_f64() * 100.0 / idle_secs as f64),
            _ => "–".into(),
        };
        let idle_switches = switches_of(pid).saturating_sub(idle_switches) / idle_secs;

        let mut many = [Row::default(), Row::default()];
        for _ in 0..rounds {
            phase(local_addr, 32, secs, pid, &mut many[0]).await?;
            phase(sharded_addr, 32, secs, pid, &mut many[1]).await?;
        }

        println!(
            "| connections | route | requests/s | mean (µs) | p50 (µs) | p99 (µs) | cluster CPU per request (µs) |"
        );
        println!("|---:|---|---:|---:|---:|---:|---:|");
        let mut figures = Vec::new();
        for (connections, rows) in [(1, &mut one), (32, &mut many)] {
            for (name, row) in ["local", "sharded"].into_iter().zip(rows.iter_mut()) {
                let f = (row.rps(), row.mean_us(), row.pct_us(0.5), row.pct_us(0.99));
                let cpu = if row.cpu.is_some() {
                    format!("{:.0}", row.cpu_us())
                } else {
                    "–".into()
                };
                println!(
                    "| {connections} | {name} | {:.0} | {:.0} | {:.0} | {:.0} | {cpu} |",
                    f.0, f.1, f.2, f.3
                );
                figures.push(f);
            }
        }
        let (l1, s1, l32, s32) = (figures[0], figures[1], figures[2], figures[3]);

        println!(
            "\n| paced, {pace_ms} ms apart | route | p50 (µs) | p99 (µs) | wake-ups per request | cluster CPU per request (µs) |"
        );
        println!("|---|---|---:|---:|---:|---:|");
        let mut p = Vec::new();
        let names = ["local", "sharded", "floor: bare echo", "floor: bare relay"];
        for (i, (name, row)) in names.into_iter().zip(paced.iter_mut()).enumerate() {
            let n = row.latencies.len().max(1) as f64;
            let f = (row.pct_us(0.5), row.pct_us(0.99));
            let (switches, cpu) = if i < 2 {
                (format!("{:.1}", row.switches() as f64 / n), format!("{:.0}", row.cpu_us()))
            } else {
                ("–".into(), "–".into())
            };
            println!(
                "| {} req/s | {name} | {:.0} | {:.0} | {switches} | {cpu} |",
                1000 / pace_ms.max(1),
                f.0,
                f.1,
            );
            p.push(f);
        }
        let floor_b2b: Vec<f64> = floor_one.iter_mut().map(|r| r.pct_us(0.5)).collect();
        println!(
            "floor, back to back at 1 connection: bare echo p50 {:.0} µs, bare relay p50 {:.0} µs",
            floor_b2b[0], floor_b2b[1]
        );
        for (name, row) in ["local", "sharded"].into_iter().zip(paced.iter()) {
            let n = row.latencies.len().max(1) as f64;
            let threads: Vec<String> = row
                .by_thread
                .iter()
                .filter(|(_, s)| **s > 0)
                .map(|(t, s)| format!("{t} {:.2}", *s as f64 / n))
                .collect();
            println!("paced {name}, wake-ups per request by thread: {}", threads.join(", "));
        }
        let pairs_done = one[0].latencies.len().max(1) as f64;
        let threads: Vec<String> = back_to_back
            .iter()
            .filter(|(_, s)| **s > 0)
            .map(|(t, s)| format!("{t} {:.2}", *s as f64 / pairs_done))
            .collect();
        println!(
            "1 connection, wake-ups per local + sharded pair by thread: {}",
            threads.join(", ")
        );
        println!(
            "paced: the hop adds {:.0} µs p50, {:.0} µs p99 (a bare relay adds {:.0} µs p50, {:.0} µs p99); \
             local paced p50 is {:.2}× its back-to-back p50 (a bare echo's: {:.2}×); \
             idle cluster: {idle_cpu} of a core, {idle_switches} wake-ups/s",
            p[1].0 - p[0].0,
            p[1].1 - p[0].1,
            p[3].0 - p[2].0,
            p[3].1 - p[2].1,
            p[0].0 / l1.2,
            p[2].0 / floor_b2b[0],
        );
        println!(
            "\n1 connection: the hop adds {:.0} µs mean, {:.0} µs p50, {:.0} µs p99",
            s1.1 - l1.1,
            s1.2 - l1.2,
            s1.3 - l1.3
        );
        println!(
            "32 connections: sharded throughput is {:.2}× local; sharded p99 {:.2} ms",
            s32.0 / l32.0,
            s32.3 / 1000.0
        );
        anyhow::Ok(())
    })
}
