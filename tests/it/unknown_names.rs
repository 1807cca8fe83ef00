//! Requests for names no Worker is deployed under (`<random>.localhost`),
//! as a scanner or an attacker sends them, against a real 3-node cluster:
//! each is a clear 404, a name asked again within the negative cache's
//! TTL costs no store read, concurrent requests for one name share one
//! read, and a deployed Worker's latency does not suffer from the flood.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use hearth::runtime::Plan;
use hearth::testing::TestCluster;

/// Requests of the flood, their pace and how many are in flight at once.
const FLOOD: usize = 10_000;
const FLOOD_TIME: Duration = Duration::from_secs(10);
const IN_FLIGHT: usize = 64;
/// Distinct random names in the flood (each asked `FLOOD / NAMES` times,
/// about a second apart).
const NAMES: usize = 1_000;
/// Pace of the latency probe of the deployed Worker (one request at a time).
const PROBE_EVERY: Duration = Duration::from_millis(5);
const PROBES_BEFORE: usize = 1_500;

fn sample(name: &str) -> Vec<u8> {
    hearth_sample_workers::bytes(name).expect("sample built")
}

/// `n` distinct valid script IDs no one deployed.
fn random_names(n: usize) -> Vec<String> {
    let seed = format!("{:?}{}", Instant::now(), std::process::id());
    (0..n)
        .map(|i| {
            let h = blake3::hash(format!("{seed}/{i}").as_bytes()).to_hex();
            format!("r{}", &h[..15])
        })
        .collect()
}

/// Store reads (metadata or source) over every node.
fn store_reads(c: &TestCluster) -> u64 {
    (0..c.nodes().len())
        .map(|i| c.stats(i).runtime.store_reads)
        .sum()
}

fn p99(mut samples: Vec<Duration>) -> Duration {
    assert!(!samples.is_empty(), "no samples");
    samples.sort();
    let i = (samples.len() * 99).div_ceil(100) - 1;
    samples[i]
}

/// GETs `hello` through node `at`, one at a time every [`PROBE_EVERY`],
/// until `count` were sent or (if `until` is set) until it says stop;
/// each one's latency. Every answer must be hello's 200.
async fn probe(
    c: &TestCluster,
    at: usize,
    count: usize,
    until: Option<&tokio::sync::watch::Receiver<bool>>,
) -> Vec<Duration> {
    let mut out = Vec::new();
    let mut tick = tokio::time::interval(PROBE_EVERY);
    loop {
        match until {
            Some(done) if *done.borrow() => break,
            None if out.len() >= count => break,
            _ => {}
        }
        tick.tick().await;
        let t = Instant::now();
        let r = c.get(at, "hello", "/").await.expect("hello answers");
        out.push(t.elapsed());
        assert_eq!(r.status, 200, "{}", r.text());
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_unknown_names_costs_bounded_store_reads_and_spares_a_deployed_worker() {
    let c = Arc::new(TestCluster::start(3).await.expect("cluster"));
    c.deploy("hello", Plan::Free, sample("hello"))
        .await
        .expect("deploy hello");
    let home = c.home_of("hello").expect("hello has a home");
    for _ in 0..200 {
        c.get(home, "hello", "/").await.expect("warm up");
    }
    let before = p99(probe(&c, home, PROBES_BEFORE, None).await);

    let names = Arc::new(random_names(NAMES));
    let reads_at_start = store_reads(&c);
    let (done_tx, done_rx) = tokio::sync::watch::channel(false);
    let not_404 = Arc::new(AtomicU64::new(0));
    let flood = {
        let (c, names, not_404) = (c.clone(), names.clone(), not_404.clone());
        tokio::spawn(async move {
            let slots = Arc::new(tokio::sync::Semaphore::new(IN_FLIGHT));
            let mut tick = tokio::time::interval(FLOOD_TIME / FLOOD as u32);
            let mut sent = Vec::with_capacity(FLOOD);
            let started = Instant::now();
            for k in 0..FLOOD {
                tick.tick().await;
                let slot = slots.clone().acquire_owned().await.expect("semaphore");
                let (c, names, not_404) = (c.clone(), names.clone(), not_404.clone());
                sent.push(tokio::spawn(async move {
                    let name = &names[k % NAMES];
                    let r = c.get(k % 3, name, "/").await.expect("an answer");
                    let clear = r.status == 404 && r.text().contains("no Worker is deployed");
                    if !clear {
                        not_404.fetch_add(1, Ordering::Relaxed);
                    }
                    drop(slot);
                }));
            }
            for s in sent {
                s.await.expect("flood request");
            }
            let took = started.elapsed();
            let _ = done_tx.send(true);
            took
        })
    };
    let during = p99(probe(&c, home, 0, Some(&done_rx)).await);
    let took = flood.await.expect("flood");
    let reads = store_reads(&c) - reads_at_start;
    let unknown: u64 = (0..3).map(|i| c.stats(i).runtime.unknown_scripts).sum();
    eprintln!(
        "{FLOOD} requests for {NAMES} unknown names in {took:?}: {reads} store reads, \
         {unknown} counted unknown; hello p99 {before:?} before, {during:?} during"
    );
    assert_eq!(
        not_404.load(Ordering::Relaxed),
        0,
        "every unknown name is a clear 404"
    );
    // Each name is read once on its home, and again at most once per TTL
    // (default 5 s) while it keeps being asked: three times in 10 s.
    assert!(
        reads <= (NAMES * 3) as u64,
        "{reads} store reads for {FLOOD} requests over {NAMES} unknown names"
    );
    // Twice the p99 before, counted from at least 2 ms: on a 2-core machine
    // that runs the client, three nodes and other tests, a sub-millisecond
    // p99 doubles from scheduling alone; what must not happen is the flood
    // stalling hello for its store reads and log lines.
    let bound = before.max(Duration::from_millis(2)) * 2;
    assert!(
        during <= bound,
        "hello's p99 during the flood {during:?} is over {bound:?} (twice its p99 before it, {before:?}, \
         counted from 2 ms)"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_requests_for_one_unknown_name_share_one_store_read() {
    let c = Arc::new(TestCluster::start(3).await.expect("cluster"));
    let name = random_names(1).remove(0);
    let home = c.home_of(&name).expect("a home");
    let at = (home + 1) % 3;
    let reads_at_start = store_reads(&c);
    let asked: Vec<_> = (0..IN_FLIGHT)
        .map(|_| {
            let (c, name) = (c.clone(), name.clone());
            tokio::spawn(async move { c.get(at, &name, "/").await.expect("an answer") })
        })
        .collect();
    for a in asked {
        let r = a.await.expect("request");
        assert_eq!(r.status, 404, "{}", r.text());
        assert!(r.text().contains("no Worker is deployed"), "{}", r.text());
    }
    let reads = store_reads(&c) - reads_at_start;
    eprintln!("{IN_FLIGHT} concurrent requests for one unknown name: {reads} store reads");
    assert!(
        reads <= 2,
        "{reads} store reads for {IN_FLIGHT} concurrent requests of one unknown name"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_name_deployed_after_its_404_is_served_at_once_from_every_node() {
    let c = TestCluster::start(3).await.expect("cluster");
    let name = random_names(1).remove(0);
    for i in 0..3 {
        let r = c.get(i, &name, "/").await.expect("an answer");
        assert_eq!(r.status, 404, "{}", r.text());
    }
    c.deploy(&name, Plan::Free, sample("hello"))
        .await
        .expect("deploy");
    for i in 0..3 {
        let r = c.get(i, &name, "/").await.expect("an answer");
        assert_eq!(r.status, 200, "node {i} still says {}", r.text());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_name_known_unknown_costs_no_shard_hop() {
    let c = TestCluster::start(3).await.expect("cluster");
    let name = random_names(1).remove(0);
    let home = c.home_of(&name).expect("a home");
    let at = (home + 1) % 3;
    let forwarded = |c: &TestCluster| c.stats(at).rpc.forwarded;
    let before = forwarded(&c);
    let r = c.get(at, &name, "/").await.expect("an answer");
    assert_eq!(r.status, 404, "{}", r.text());
    assert_eq!(forwarded(&c), before + 1, "the first request asks the home");
    // Asked again within the TTL: the node that forwarded remembers the
    // home's answer, and answers itself.
    for _ in 0..10 {
        let r = c.get(at, &name, "/").await.expect("an answer");
        assert_eq!(r.status, 404, "{}", r.text());
        assert!(r.text().contains("no Worker is deployed"), "{}", r.text());
        assert_eq!(r.header("x-hearth-route"), "local");
    }
    assert_eq!(
        forwarded(&c),
        before + 1,
        "a known-unknown name was forwarded again"
    );
    // A deploy announced to every member is served at once from here.
    c.deploy(&name, Plan::Free, sample("hello"))
        .await
        .expect("deploy");
    let r = c.get(at, &name, "/").await.expect("an answer");
    assert_eq!(r.status, 200, "{}", r.text());
}
