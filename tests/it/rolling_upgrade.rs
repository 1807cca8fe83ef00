//! A rolling upgrade of three `hearth serve` processes over an S3 store
//! (Garage), under steady load on every Worker, sent to all three front
//! doors as a load balancer would (`hearth::testing::Rollout`): each node
//! in turn gets SIGTERM, exits 0, starts again and is waited for on
//! `/readyz`. Nothing sent may be lost and nothing may fail. Then the same
//! rollout with one node SIGKILLed in the middle: only the requests in
//! flight on that node when it died may fail, and no request runs twice.
//!
//! Which requests "that node had started": the ones the client had sent to
//! it (its front door) and not yet had answered when it was killed (from
//! the signal until its process is gone, and `POOL_SLACK` after: see
//! `Record::started_by_killed`), and
//! the ones another front door had forwarded to it over the shard hop and
//! that came back as that door's 502 "the Worker's home node may have
//! started this request and then failed", in flight at the kill. The shard
//! client never serves such a request again elsewhere (at most once); the
//! counter every Worker fetches with the request's ID proves it for all
//! of them: no ID is counted twice, and every answered one exactly once.

use std::time::Duration;

use hearth::testing::{Garage, Outcome, Record, Rollout, Summary};

const BIN: &str = env!("CARGO_BIN_EXE_hearth");

/// Requests a second, over every Worker and front door.
const RATE: u32 = 300;
/// How long each request waits in its Worker (on the counter), so that
/// every drain and the kill find requests in flight (~6 at 300/s).
const ORIGIN_DELAY: Duration = Duration::from_millis(20);
/// Load before the rollout (after a second of warm-up: cold starts).
const STEADY: Duration = Duration::from_secs(3);

/// A Garage server, or `None` (skipped, and says so) when Garage is not
/// installed and `HEARTH_REQUIRE_GARAGE` is unset (CI sets it).
async fn garage() -> Option<Garage> {
    if Garage::binary().is_none() && std::env::var_os("HEARTH_REQUIRE_GARAGE").is_none() {
        eprintln!("skipped: no Garage server to test against (cargo install garage --locked)");
        return None;
    }
    Some(Garage::start().await.expect("garage"))
}

/// The phases of the run, in order.
const WARMUP: usize = 0;
const BEFORE: usize = 1;
const ROLLOUT: usize = 2;
const BETWEEN: usize = 3;
const CRASH: usize = 4;
const AFTER: usize = 5;
const PHASES: [&str; 6] = [
    "warm-up",
    "before",
    "rollout",
    "between",
    "rollout with SIGKILL",
    "after",
];

fn show(records: &[Record]) -> String {
    let mut out = String::new();
    for (p, name) in PHASES.iter().enumerate() {
        let s = Summary::of(records, p);
        out.push_str(&format!(
            "{name}: {} requests, {} lost, {} errors, {} not sent, p50/p99 {}\n",
            s.requests,
            s.lost,
            s.errors,
            s.not_sent,
            s.latency.p50_p99()
        ));
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolling_upgrade_loses_nothing_and_a_killed_node_fails_only_what_it_had_started() {
    let Some(garage) = garage().await else {
        return;
    };
    let mut c = Rollout::start(BIN.as_ref(), garage, 3, 6, ORIGIN_DELAY)
        .await
        .expect("cluster");
    c.phase(WARMUP);
    let load = c.load(RATE);
    tokio::time::sleep(Duration::from_secs(1)).await;
    c.phase(BEFORE);
    tokio::time::sleep(STEADY).await;

    c.phase(ROLLOUT);
    for i in 0..c.nodes() {
        c.replace(i).await.expect("replace");
    }
    c.phase(BETWEEN);
    tokio::time::sleep(Duration::from_secs(1)).await;

    // The same rollout, with the second node killed while it serves.
    c.phase(CRASH);
    c.replace(0).await.expect("replace");
    tokio::time::sleep(Duration::from_millis(500)).await;
    let killed = 1;
    let (signalled, gone) = c.kill(killed).await.expect("kill");
    c.restart(killed).await.expect("restart");
    c.replace(2).await.expect("replace");
    c.phase(AFTER);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let kill = load.offset(signalled)..load.offset(gone);
    let records = load.stop().await;
    eprintln!("{}killed {kill:?} into the load", show(&records));

    // Nothing sent during the clean rollout (nor around it) failed, and
    // the load was there.
    for phase in [WARMUP, BEFORE, ROLLOUT, BETWEEN] {
        let s = Summary::of(&records, phase);
        let failed: Vec<&Record> = records
            .iter()
            .filter(|r| r.phase == phase && !matches!(r.outcome, Outcome::Ok))
            .collect();
        assert!(
            failed.is_empty(),
            "phase {phase}: {} lost, {} errors, {} not sent, e.g. {:?}\n{}\n{}",
            s.lost,
            s.errors,
            s.not_sent,
            &failed[..failed.len().min(5)],
            show(&records),
            c.logs()
        );
    }
    let during = Summary::of(&records, ROLLOUT);
    assert!(
        during.requests as f64 >= 0.8 * f64::from(RATE),
        "the rollout ran under load: {}",
        show(&records)
    );

    // With the kill: only what the killed node had in flight failed.
    let not_its: Vec<&Record> = records
        .iter()
        .filter(|r| r.phase >= CRASH && !matches!(r.outcome, Outcome::Ok))
        .filter(|r| !r.started_by_killed(killed, &kill))
        .collect();
    assert!(
        not_its.is_empty(),
        "failures the killed node had not started (killed at {kill:?}): {:?}\n{}\n{}",
        &not_its[..not_its.len().min(5)],
        show(&records),
        c.logs()
    );

    // Never replayed: every request ran at most once, every answered one
    // exactly once.
    for r in &records {
        let n = c.invocations(r.id);
        match r.outcome {
            Outcome::Ok => assert_eq!(n, 1, "{r:?} ran {n} times"),
            _ => assert!(n <= 1, "{r:?} ran {n} times"),
        }
    }
}
