//! A rolling upgrade under steady load, measured: `cargo bench -p hearth
//! --bench rolling_upgrade`.
//!
//! Three `hearth serve` processes over one S3 store (Garage, which must be
//! installed), six Workers (the `fetcher` sample under six names, each
//! request waiting `ORIGIN_MS` on an origin that counts its invocations),
//! load at `RATE` requests a second spread over every Worker and sent to
//! all three front doors by a client that balances like a load balancer
//! (`/readyz` every 50 ms, connection-refused tried on the next node; see
//! `hearth::testing::Rollout`). The phases: warm-up, steady load
//! (`PHASE_S`), a rollout (each node: SIGTERM, exit, start the binary
//! again, `/readyz`, then `PAUSE_S` before the next, as a rollout's
//! minimum ready time), steady load again, the same rollout with the
//! second node SIGKILLed `PAUSE_S` after the first is replaced (then
//! started again), and steady load after. Printed: a table of each phase's
//! requests, lost (sent, no answer), errors (an answer other than the
//! Worker's 200), requests never sent, p50 and p99 at the client; the
//! nodes' exit and ready times; and how many requests ran twice (expected:
//! none). `HEARTH_BENCH_BIN` runs another build of `hearth` instead, and
//! `HEARTH_NEW_BIN` starts the replacements from another build (an upgrade
//! from `HEARTH_BENCH_BIN` or this one to it).

use std::time::Duration;

use hearth::testing::{Garage, Outcome, Record, Rollout, Summary};
use hearth_report::table::{Align, Table};

mod support;

const PHASES: [&str; 6] = [
    "warm-up",
    "before",
    "rollout (SIGTERM each)",
    "between",
    "rollout, one SIGKILLed",
    "after",
];

fn main() -> anyhow::Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    rt.block_on(run())
}

async fn run() -> anyhow::Result<()> {
    let rate = u32::try_from(support::env_or("RATE", 300))?;
    let phase = Duration::from_secs(support::env_or("PHASE_S", 20));
    let pause = Duration::from_secs(support::env_or("PAUSE_S", 2));
    let origin = Duration::from_millis(support::env_or("ORIGIN_MS", 20));
    if Garage::binary().is_none() {
        anyhow::bail!("this bench needs Garage: cargo install garage --locked --version 2.5.0");
    }
    let garage = Garage::start().await?;
    let mut c = Rollout::start(&support::bin(), garage, 3, 6, origin).await?;
    let mut steps = Vec::new();
    c.phase(0);
    let load = c.load(rate);
    tokio::time::sleep(Duration::from_secs(3)).await;
    c.phase(1);
    tokio::time::sleep(phase).await;
    if let Some(new) = std::env::var_os("HEARTH_NEW_BIN") {
        c.upgrade_to(std::path::Path::new(&new));
    }
    c.phase(2);
    for i in 0..c.nodes() {
        let (exit, ready) = c.replace(i).await?;
        steps.push(format!(
            "{}: SIGTERM -> exit 0 in {exit:.2?}, ready in {ready:.2?}",
            c.node_id(i)
        ));
        tokio::time::sleep(pause).await;
    }
    c.phase(3);
    tokio::time::sleep(phase).await;
    c.phase(4);
    let (exit, ready) = c.replace(0).await?;
    steps.push(format!(
        "{}: SIGTERM -> exit 0 in {exit:.2?}, ready in {ready:.2?}",
        c.node_id(0)
    ));
    tokio::time::sleep(pause).await;
    let (signalled, gone) = c.kill(1).await?;
    let kill = load.offset(signalled)..load.offset(gone);
    let ready = c.restart(1).await?;
    steps.push(format!(
        "{}: SIGKILL (gone in {:.2?}), ready in {ready:.2?}",
        c.node_id(1),
        gone - signalled
    ));
    tokio::time::sleep(pause).await;
    let (exit, ready) = c.replace(2).await?;
    steps.push(format!(
        "{}: SIGTERM -> exit 0 in {exit:.2?}, ready in {ready:.2?}",
        c.node_id(2)
    ));
    tokio::time::sleep(pause).await;
    c.phase(5);
    tokio::time::sleep(Duration::from_secs(5)).await;
    let records = load.stop().await;

    println!(
        "rolling upgrade: 3 hearth serve processes over Garage, {} Workers, {rate} req/s, \
         {origin:?} at the origin per request\n",
        c.workers().len()
    );
    let mut table = Table::new([
        "phase", "requests", "lost", "errors", "not sent", "p50 ms", "p99 ms",
    ])
    .align([
        Align::Left,
        Align::Right,
        Align::Right,
        Align::Right,
        Align::Right,
        Align::Right,
        Align::Right,
    ]);
    for (p, name) in PHASES.iter().enumerate() {
        let s = Summary::of(&records, p);
        table.row([
            name.to_string(),
            s.requests.to_string(),
            s.lost.to_string(),
            s.errors.to_string(),
            s.not_sent.to_string(),
            format!("{:.2}", s.latency.p50_ms),
            format!("{:.2}", s.latency.p99_ms),
        ]);
    }
    println!("{table}");
    for s in &steps {
        println!("{s}");
    }
    let failed: Vec<&Record> = records
        .iter()
        .filter(|r| !matches!(r.outcome, Outcome::Ok))
        .collect();
    for r in failed.iter().take(10) {
        println!(
            "failed: #{} phase {} sent {:.3?} to {:?}: {:?}",
            r.id, r.phase, r.sent, r.front, r.outcome
        );
    }
    let its = failed
        .iter()
        .filter(|r| r.started_by_killed(1, &kill))
        .count();
    println!(
        "failed: {} ({its} in flight on {} when it was killed, {kill:.3?} into the load)",
        failed.len(),
        c.node_id(1)
    );
    let twice = records.iter().filter(|r| c.invocations(r.id) > 1).count();
    println!("requests that ran more than once: {twice}");
    Ok(())
}
