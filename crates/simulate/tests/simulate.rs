//! `hearth simulate` and trace parsing: determinism, agreement of the two
//! modes where they must agree, hand-computed scenarios, and traces.

use std::io::Write;
use std::path::{Path, PathBuf};

use clap::Parser;
use hearth_sharding::ring::{Member, Ring, RingConfig};
use hearth_simulate::trace::{self, TraceError, TraceFormat};
use hearth_simulate::{Balancer, ModeReport, SimulateArgs, run, server_name};

/// `SimulateArgs` from a command line, exactly as `hearth simulate` parses it.
#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    args: SimulateArgs,
}

fn args(line: &str) -> SimulateArgs {
    Cli::try_parse_from(std::iter::once("simulate").chain(line.split_whitespace()))
        .expect("valid flags")
        .args
}

/// The measured outcome, without the mode's name and routes (which differ
/// between modes by construction).
fn outcome(m: &ModeReport) -> (u64, u64, u64, u64, u64, u64, u64, f64) {
    (
        m.requests,
        m.warm_requests,
        m.cold_requests,
        m.cold_starts,
        m.evictions_pressure,
        m.evictions_idle,
        m.peak_resident_bytes_per_server,
        m.mean_resident_bytes_per_server,
    )
}

const SMALL: &str = "--servers 12 --workers 3000 --exponent 1.0 --requests 60000 \
                     --memory-mb 256 --rate 2000 --idle-timeout-s 10";

#[test]
fn a_seed_determines_the_report() {
    let a = run(&args(SMALL)).expect("runs");
    let b = run(&args(SMALL)).expect("runs");
    assert_eq!(a.unsharded, b.unsharded);
    assert_eq!(a.sharded, b.sharded);
    assert_eq!(a.derived, b.derived);
    let c = run(&args(&format!("{SMALL} --seed 2"))).expect("runs");
    assert_ne!(a.unsharded, c.unsharded);
    assert_ne!(a.sharded, c.sharded);
}

#[test]
fn small_scenario_shows_the_direction_of_the_article() {
    let r = run(&args(SMALL)).expect("runs");
    let (u, s) = (&r.unsharded, &r.sharded);
    assert_eq!(u.requests, 42_000); // 30% warm-up
    assert_eq!(u.requests, s.requests);
    assert_eq!(u.warm_requests + u.cold_requests, u.requests);
    assert_eq!(s.warm_requests + s.cold_requests, s.requests);
    let routes = s.routes.local + s.routes.home + s.routes.sharded + s.routes.fallback;
    assert_eq!(routes, s.requests);
    assert!(s.routes.sharded > 0);
    assert!(
        s.warm_rate > u.warm_rate,
        "{} vs {}",
        s.warm_rate,
        u.warm_rate
    );
    assert!(s.evictions() < u.evictions());
    assert!(s.mean_resident_workers_per_server > 0.0);
    assert!(u.peak_resident_bytes_per_server <= 256 << 20);
    assert_eq!(u.fraction_sharded, 0.0);
    assert_eq!(u.refusals.total(), 0);
    let table = r.table();
    assert!(table.contains("| warm rate |"), "{table}");
    assert!(table.contains("wall time"), "{table}");
}

#[test]
fn with_one_server_sharding_changes_nothing() {
    let r = run(&args(
        "--servers 1 --workers 500 --requests 20000 --memory-mb 1000 --rate 50 \
         --idle-timeout-s 2 --exponent 0.9",
    ))
    .expect("runs");
    assert_eq!(outcome(&r.unsharded), outcome(&r.sharded));
    assert_eq!(r.unsharded.cold_start_causes, r.sharded.cold_start_causes);
    assert_eq!(r.sharded.routes.sharded + r.sharded.routes.fallback, 0);
    let s = &r.sharded;
    assert!(s.evictions_pressure > 0 && s.evictions_idle > 0, "{s:?}");
}

/// Three script IDs with homes (server 0, server 1, server 1) on the
/// simulator's 2-server ring.
fn three_workers_homed_0_1_1() -> [String; 3] {
    let addr = "127.0.0.1:0".parse().expect("addr");
    let ring = Ring::new(
        [server_name(0), server_name(1)].map(|n| Member::new(n.as_str(), addr)),
        RingConfig::default(),
    )
    .expect("ring");
    let home = |id: &str| ring.home(id).expect("home").id.as_str().to_string();
    let on = |server: u32, skip: usize| {
        (0..)
            .map(|i| format!("w{i}"))
            .filter(|id| home(id) == server_name(server))
            .nth(skip)
            .expect("some ID lands there")
    };
    [on(0, 0), on(1, 0), on(1, 1)]
}

/// Writes the trace A B C A B C … (12 requests, one per second) and
/// returns its path.
fn abc_trace(dir: &Path) -> PathBuf {
    let [a, b, c] = three_workers_homed_0_1_1();
    let path = dir.join("abc.csv");
    let mut f = std::fs::File::create(&path).expect("create");
    writeln!(f, "timestamp,script_id").expect("write");
    for i in 0..12 {
        let id = [&a, &b, &c][i % 3];
        writeln!(f, "{i},{id}").expect("write");
    }
    path
}

/// Two servers, each with memory for exactly one Worker; Workers A (home
/// s0), B and C (home s1); requests A B C A B C … one per second, sent
/// round-robin, so request i lands on server i mod 2:
///
/// ```text
/// i   0  1  2  3  4  5  6  7  8  9 10 11
/// W   A  B  C  A  B  C  A  B  C  A  B  C
/// at  s0 s1 s0 s1 s0 s1 s0 s1 s0 s1 s0 s1
/// ```
///
/// Unsharded, s0 sees A C B A C B and s1 sees B A C B A C: three Workers
/// in turn through one slot, so all 12 requests are cold and every load
/// but the first on each server evicts: 10 evictions.
///
/// Sharded (busy window 0, so a home can always make room): A is homed on
/// s0 and stays there; requests for it from s1 are forwarded and warm
/// (i3, i9), and from s0 they are local (i6): 1 cold start, 3 warm. B and C
/// both live on s1 and push each other out: all 8 of their requests are
/// cold, 7 evictions. Routes: home i0 i1 i5 i7 i11, sharded i2 i3 i4 i8 i9
/// i10, local i6.
#[test]
fn hand_computed_scenario_without_refusals() {
    let dir = tempfile::tempdir().expect("tempdir");
    let trace = abc_trace(dir.path());
    let r = run(&args(&format!(
        "--servers 2 --trace {} --memory-mb 4 --size-median-mb 4 --size-sigma 0 \
         --cold-start-ms 0 --duration-ms 1 --duration-sigma 0 --busy-window-ms 0 \
         --idle-timeout-s 100000 --warmup 0 --balancer round-robin",
        trace.display()
    )))
    .expect("runs");
    let (u, s) = (&r.unsharded, &r.sharded);
    assert_eq!((u.requests, u.warm_requests, u.cold_starts), (12, 0, 12));
    assert_eq!((u.evictions_pressure, u.evictions_idle), (10, 0));
    assert_eq!((s.requests, s.warm_requests, s.cold_starts), (12, 3, 9));
    assert_eq!((s.evictions_pressure, s.evictions_idle), (7, 0));
    assert_eq!(
        (
            s.routes.local,
            s.routes.home,
            s.routes.sharded,
            s.routes.fallback
        ),
        (1, 5, 6, 0)
    );
    assert_eq!(s.refusals.total(), 0);
    assert_eq!(s.fraction_sharded, 0.5);
    assert_eq!(s.cold_start_causes.first_in_dc, 3);
    assert_eq!(s.cold_start_causes.after_pressure, 6);
    assert_eq!(u.peak_resident_bytes_per_server, 4 << 20);
    assert_eq!(r.args.balancer, Balancer::RoundRobin);
}

/// The same trace with a busy window of 1.5 s: a home will not evict a
/// Worker used in the last 1.5 s, and every resident Worker was used 1 s
/// ago, so each forward is refused (no memory) and served by the receiving
/// server (fallback), which evicts its own Worker:
///
/// ```text
/// i      0  1  2  3  4  5  6  7  8  9 10 11
/// W      A  B  C  A  B  C  A  B  C  A  B  C
/// at     s0 s1 s0 s1 s0 s1 s0 s1 s0 s1 s0 s1
/// route  H  H  F  F  F  H  H  H  F  F  F  H
/// s0    {A}{A}{C}{C}{B}{B}{A}{A}{C}{C}{B}{B}
/// s1    {} {B}{B}{A}{A}{C}{C}{B}{B}{A}{A}{C}
/// ```
///
/// Every request is cold (12), 10 evictions, 6 refusals.
#[test]
fn hand_computed_scenario_with_refusals() {
    let dir = tempfile::tempdir().expect("tempdir");
    let trace = abc_trace(dir.path());
    let r = run(&args(&format!(
        "--servers 2 --trace {} --memory-mb 4 --size-median-mb 4 --size-sigma 0 \
         --cold-start-ms 0 --duration-ms 1 --duration-sigma 0 --busy-window-ms 1500 \
         --idle-timeout-s 100000 --warmup 0 --balancer round-robin",
        trace.display()
    )))
    .expect("runs");
    let s = &r.sharded;
    assert_eq!((s.requests, s.warm_requests, s.cold_starts), (12, 0, 12));
    assert_eq!(s.evictions_pressure, 10);
    assert_eq!(
        (
            s.refusals.no_memory,
            s.refusals.worker_busy,
            s.refusals.node_busy
        ),
        (6, 0, 0)
    );
    assert_eq!(
        (
            s.routes.local,
            s.routes.home,
            s.routes.sharded,
            s.routes.fallback
        ),
        (0, 6, 0, 6)
    );
}

/// In-flight limits: one Worker, homed on s0 of 2 servers, eight requests
/// at the same instant sent round-robin (even ones to s0, odd ones to s1),
/// each running 10 s, with `max_in_flight_per_worker` = 2:
///
/// * i0 (s0, the home): cold start there (route home), ready at +100 ms;
///   i2 i4 i6 find it resident on s0 (route local) and wait for that load.
/// * i1 i3 (s1): forwarded and admitted (sharded), waiting on the load.
/// * i5 (s1): the Worker has 2 sharded requests in flight on its home, so
///   it is refused (worker busy) and cold-starts on s1 (fallback).
/// * i7 (s1): now resident on s1 (route local), waits for that load.
///
/// So 2 cold starts, all 8 requests cold; unsharded also loads once per
/// server.
#[test]
fn per_worker_in_flight_limit_refuses_and_spreads() {
    let addr = "127.0.0.1:0".parse().expect("addr");
    let ring = Ring::new(
        [server_name(0), server_name(1)].map(|n| Member::new(n.as_str(), addr)),
        RingConfig::default(),
    )
    .expect("ring");
    let id = (0..)
        .map(|i| format!("hot{i}"))
        .find(|id| ring.home(id).expect("home").id.as_str() == server_name(0))
        .expect("an ID homed on s0");
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("hot.csv");
    // Requests 0, 2, 4, 6 go to s0 under round-robin; the odd ones to s1.
    let lines: String = (0..8).map(|_| format!("1.0,{id}\n")).collect();
    std::fs::write(&path, lines).expect("write");
    let r = run(&args(&format!(
        "--servers 2 --trace {} --memory-mb 64 --size-median-mb 4 --size-sigma 0 \
         --duration-ms 10000 --duration-sigma 0 --warmup 0 --balancer round-robin \
         --max-in-flight-per-worker 2",
        path.display()
    )))
    .expect("runs");
    let s = &r.sharded;
    assert_eq!(s.refusals.worker_busy, 1);
    assert_eq!(
        (
            s.routes.local,
            s.routes.home,
            s.routes.sharded,
            s.routes.fallback
        ),
        (4, 1, 2, 1)
    );
    assert_eq!(s.cold_starts, 2);
    assert_eq!(s.cold_requests, 8);
    let u = &r.unsharded;
    assert_eq!((u.cold_starts, u.cold_requests), (2, 8));
}

#[test]
fn prewarm_home_loads_at_home_after_a_fallback() {
    let base = format!("{SMALL} --max-in-flight-per-worker 1 --duration-ms 200");
    let plain = run(&args(&base)).expect("runs");
    let pre = run(&args(&format!("{base} --prewarm-home"))).expect("runs");
    assert_eq!(plain.sharded.prewarm_loads, 0);
    assert!(plain.sharded.refusals.total() > 0);
    assert_eq!(plain.unsharded, pre.unsharded);
    assert_ne!(plain.sharded, pre.sharded);
}

#[test]
fn bad_arguments_are_errors() {
    for bad in [
        "--servers 0",
        "--warmup 1",
        "--rate 0",
        "--requests 0",
        "--size-median-mb 0",
        "--size-sigma=-1",
        "--size-sigma NaN",
        "--duration-ms=-5",
        "--duration-sigma=-0.5",
        "--duration-sigma inf",
        "--rate NaN",
        "--rate inf",
    ] {
        assert!(run(&args(bad)).is_err(), "{bad}");
    }
    let missing = args("--trace /nonexistent/trace.csv");
    let err = run(&missing).expect_err("missing trace").to_string();
    assert!(err.contains("/nonexistent/trace.csv"), "{err}");
}

#[test]
fn json_report_is_written() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("report.json");
    let r = run(&args(&format!(
        "--servers 3 --workers 30 --requests 500 --memory-mb 64 --json {}",
        path.display()
    )))
    .expect("runs");
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).expect("read")).expect("json");
    assert_eq!(json["sharded"]["requests"], r.sharded.requests);
    assert_eq!(json["args"]["servers"], 3);
    assert_eq!(json["args"]["balancer"], "random");
}

// ---- traces ----

#[test]
fn csv_traces_parse_with_or_without_header() {
    let with = "timestamp,script_id\n# a comment\n\n2.5, b\n0,a\n1.25,b\n";
    let t = trace::parse(with.as_bytes(), TraceFormat::Auto, 0).expect("parses");
    assert_eq!(t.workers, ["b", "a"]);
    let got: Vec<(u64, u32)> = t.events.iter().map(|e| (e.t_ms, e.worker)).collect();
    assert_eq!(got, [(0, 1), (1250, 0), (2500, 0)]);
    assert_eq!(t.span_ms(), 2500);
    assert_eq!(t.counts(), [2, 1]);
    let without = "2.5,b\n0,a\n1.25,b\n";
    let u = trace::parse(without.as_bytes(), TraceFormat::Csv, 0).expect("parses");
    assert_eq!(u, t);
    let empty = trace::parse("".as_bytes(), TraceFormat::Auto, 0).expect("parses");
    assert!(empty.is_empty());
}

#[test]
fn malformed_csv_names_the_line() {
    let cases = [
        ("0,a\nsoon,b\n", 2),
        ("0,a\n1\n", 2),
        ("0,a\n1,b,c\n", 2),
        ("t,id\n0,a\n-1,b\n", 3),
        ("0,a\n\n1,\n", 3),
        ("0,a\nNaN,b\n", 2),
        ("0,a\n1e300,b\n", 2),
    ];
    for (text, line) in cases {
        match trace::parse(text.as_bytes(), TraceFormat::Csv, 0) {
            Err(TraceError::Malformed { line: l, .. }) => assert_eq!(l, line, "{text:?}"),
            other => panic!("{text:?}: expected malformed at line {line}, got {other:?}"),
        }
    }
    let not_utf8: &[u8] = b"0,a\r\n1,\xff\n";
    match trace::parse(not_utf8, TraceFormat::Auto, 0) {
        Err(TraceError::Malformed { line: 2, .. }) => {}
        other => panic!("expected malformed at line 2, got {other:?}"),
    }
    let err = trace::parse("0,a\nsoon,b\n".as_bytes(), TraceFormat::Csv, 0).expect_err("bad");
    assert!(err.to_string().contains("line 2"), "{err}");
}

const AZURE: &str = "HashFunction,HashOwner,HashApp,1_minute,2_minute,3_minute\n\
                     f1,o1,a1,2,0,1\n\
                     f2,o2,a2,0,3,\n";

#[test]
fn azure_traces_spread_each_minute_deterministically() {
    assert_eq!(trace::detect(AZURE), TraceFormat::Azure);
    let t = trace::parse(AZURE.as_bytes(), TraceFormat::Auto, 7).expect("parses");
    assert_eq!(t.workers, ["f1", "f2"]);
    assert_eq!(t.counts(), [3, 3]);
    assert!(t.events.windows(2).all(|w| w[0].t_ms <= w[1].t_ms));
    let minute = |w: u32| -> Vec<u64> {
        t.events
            .iter()
            .filter(|e| e.worker == w)
            .map(|e| e.t_ms / 60_000 + 1)
            .collect()
    };
    assert_eq!(minute(0), [1, 1, 3]);
    assert_eq!(minute(1), [2, 2, 2]);
    let again = trace::parse(AZURE.as_bytes(), TraceFormat::Azure, 7).expect("parses");
    assert_eq!(t, again);
    let other = trace::parse(AZURE.as_bytes(), TraceFormat::Azure, 8).expect("parses");
    assert_ne!(t.events, other.events);
    // The original trace's column order, with a Trigger column.
    let original = "HashOwner,HashApp,HashFunction,Trigger,1,2\no,a,f,http,1,1\n";
    let t = trace::parse(original.as_bytes(), TraceFormat::Auto, 0).expect("parses");
    assert_eq!((t.workers.len(), t.len()), (1, 2));
}

#[test]
fn malformed_azure_names_the_line() {
    let cases = [
        ("HashFunction,1_minute\nf,1\nf2,x\n", 3),
        ("HashFunction,1_minute\nf,1,2\n", 2),
        ("HashFunction,1_minute\n,1\n", 2),
        ("HashFunction,1_minute\nf,-1\n", 2),
        ("HashOwner,1_minute\nf,1\n", 1),
        ("HashFunction,name\nf,1\n", 1),
        ("HashFunction,0_minute\nf,1\n", 1),
    ];
    for (text, line) in cases {
        match trace::parse(text.as_bytes(), TraceFormat::Azure, 0) {
            Err(TraceError::Malformed { line: l, .. }) => assert_eq!(l, line, "{text:?}"),
            other => panic!("{text:?}: expected malformed at line {line}, got {other:?}"),
        }
    }
    match trace::parse(
        "HashFunction,1_minute\nf,999999999999\n".as_bytes(),
        TraceFormat::Azure,
        0,
    ) {
        Err(TraceError::TooLarge { line: 2, .. }) => {}
        other => panic!("expected too large, got {other:?}"),
    }
}

const AZURE_SAMPLE: &str = "/work/shared/traces/azure2019-sample-1350-invocations.csv";

#[test]
fn the_real_azure_sample_parses() {
    let path = Path::new(AZURE_SAMPLE);
    if !path.exists() {
        eprintln!("skipping: {AZURE_SAMPLE} not present");
        return;
    }
    let t = trace::load(path, TraceFormat::Auto, 1).expect("parses");
    // Independent count: the sum of every minute cell.
    let text = std::fs::read_to_string(path).expect("read");
    let total: u64 = text
        .lines()
        .skip(1)
        .flat_map(|l| l.split(',').skip(3))
        .map(|c| c.trim().parse::<u64>().unwrap_or(0))
        .sum();
    assert_eq!(t.len() as u64, total);
    assert_eq!(t.workers.len(), 1350);
    assert!(t.events.windows(2).all(|w| w[0] <= w[1]));
    assert!(t.events.last().is_some_and(|e| e.t_ms < 1440 * 60_000));
}

#[test]
fn missing_trace_file_is_an_io_error() {
    match trace::load(Path::new("/nonexistent/x.csv"), TraceFormat::Auto, 0) {
        Err(TraceError::Io { path, .. }) => assert_eq!(path, Path::new("/nonexistent/x.csv")),
        other => panic!("expected an I/O error, got {other:?}"),
    }
}

/// Not a test: runs a full simulation from `HEARTH_SIMULATE_ARGS` (the flags
/// of `hearth simulate`) and prints its table, e.g.
/// `HEARTH_SIMULATE_ARGS="--memory-mb 4096" cargo test --release --test
/// simulate -- --ignored --nocapture simulate_from_env`.
#[test]
#[ignore = "manual: a full-size run"]
fn simulate_from_env() {
    let line = std::env::var("HEARTH_SIMULATE_ARGS").unwrap_or_default();
    let report = run(&args(&line)).expect("runs");
    println!("$ hearth simulate {line}\n\n{}", report.table());
}
