//! Worker sources and artifacts in S3-compatible object storage, against a
//! real server (Garage, started and stopped by each test; see
//! `hearth::testing::Garage`): nodes with no shared disk deploy and serve
//! through the bucket, redeploys reach every node at once, a tampered
//! artifact or record is refused, two nodes deploying at once never write
//! the same version, and an unreachable store costs no warm Worker and
//! half-writes nothing.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::BodyExt;

use hearth::cluster::ClusterConfig;
use hearth::runtime::{
    DeployError, Plan, Runtime, RuntimeConfig, S3Store, ScriptStore, StoreError, body,
};
use hearth::testing::{Garage, TestCluster};

/// A Garage server for this test, or `None` (the test is skipped, and says
/// so) when Garage is not installed and `HEARTH_REQUIRE_GARAGE` is unset.
/// CI installs Garage and sets it, so there these tests always run.
async fn garage() -> Option<Garage> {
    if Garage::binary().is_none() && std::env::var_os("HEARTH_REQUIRE_GARAGE").is_none() {
        eprintln!(
            "skipped: no Garage server to test against (cargo install garage --locked \
             --version 2.5.0 --debug --no-default-features --features bundled-libs,sqlite; \
             CI installs it and sets HEARTH_REQUIRE_GARAGE=1)"
        );
        return None;
    }
    Some(Garage::start().await.expect("garage"))
}

fn sample(name: &str) -> Vec<u8> {
    hearth_sample_workers::bytes(name).expect("sample built")
}

const KEY: [u8; 32] = [7; 32];

/// A runtime with a directory of its own (its artifact cache) over the
/// bucket prefix `prefix`: one "node" sharing no disk with the others.
fn node(garage: &Garage, prefix: &str, dir: &Path) -> (Runtime, Arc<S3Store>) {
    let store = Arc::new(S3Store::open(&garage.url(prefix), &garage.settings()).expect("s3 store"));
    let rt = Runtime::with_store(RuntimeConfig::new(dir).artifact_key(KEY), store.clone())
        .expect("runtime");
    (rt, store)
}

async fn get(rt: &Runtime, id: &str) -> (u16, String, String) {
    let req = http::Request::get(format!("http://{id}.localhost/"))
        .body(body::full(""))
        .expect("request");
    let resp = rt.serve(id, req).await;
    let status = resp.status().as_u16();
    let start = resp
        .headers()
        .get("x-hearth-start")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string();
    let text = resp
        .into_body()
        .collect()
        .await
        .map(|b| String::from_utf8_lossy(&b.to_bytes()).into_owned())
        .unwrap_or_default();
    (status, start, text)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deploy_through_one_node_serves_from_another_with_no_shared_disk() {
    let Some(garage) = garage().await else {
        return;
    };
    let (da, db) = (
        tempfile::tempdir().expect("dir"),
        tempfile::tempdir().expect("dir"),
    );
    let (a, _) = node(&garage, "shared", da.path());
    let (b, _) = node(&garage, "shared", db.path());
    let report = a
        .deploy("app", Plan::Free, sample("hello"))
        .await
        .expect("deploy through A");
    // B has never seen this Worker and shares no directory with A: it reads
    // the source's metadata and A's compiled artifact from the bucket.
    let (status, start, text) = get(&b, "app").await;
    assert_eq!((status, start.as_str()), (200, "cold"), "{text}");
    assert_eq!(text, "hello from app");
    let s = b.stats();
    assert_eq!(s.compiles, 0, "B loaded A's artifact instead of compiling");
    assert_eq!(s.artifact_loads, 1);
    assert!(
        db.path()
            .join("artifacts")
            .read_dir()
            .expect("B's artifact cache")
            .count()
            == 1,
        "the artifact is cached on B's own disk"
    );
    // The listing comes from the bucket too.
    let list = b.script_store().list().await.expect("list");
    assert_eq!(list.len(), 1);
    assert_eq!(list[0].hash, report.meta.hash);

    // A redeploy through A: B's warm copy is stale. Told (as the cluster's
    // announcement does), B drops it at once; the next request is new.
    let report = a
        .deploy("app", Plan::Free, sample("wstd-hello"))
        .await
        .expect("redeploy");
    assert!(
        b.revalidate("app", &report.meta.hash).await,
        "stale copy dropped"
    );
    assert_eq!(get(&b, "app").await.2, "hello from wstd");
    // An announcement of the version B already has drops nothing.
    assert!(!b.revalidate("app", &report.meta.hash).await);

    // Both versions are recorded in the bucket (versions/app/1.json, 2.json,
    // not listed as scripts); a rollback through A reaches B like a deploy.
    let versions = b.versions("app").await.expect("versions");
    let numbers: Vec<u64> = versions.versions.iter().map(|m| m.version).collect();
    assert_eq!(numbers, vec![1, 2]);
    assert_eq!(b.script_store().list().await.expect("list").len(), 1);
    let back = a.rollback("app", None).await.expect("rollback");
    assert_eq!(back.version, 1);
    assert!(b.revalidate("app", &back.revision()).await, "B told");
    assert_eq!(get(&b, "app").await.2, "hello from app");
    a.rollback("app", Some(2)).await.expect("forward again");

    // Vars and a secret set through A reach B through the bucket; the
    // secret is sealed there.
    let secret = "bucket-secret-5d1e";
    let mut manifest = hearth::runtime::Manifest::default();
    manifest
        .vars
        .insert("API_BASE".into(), "https://x.example".into());
    a.deploy("cfg", manifest, sample("config-echo"))
        .await
        .expect("deploy config-echo");
    assert_eq!(
        get_path(&b, "cfg", "/API_BASE").await,
        "env=https://x.example config=https://x.example"
    );
    let meta = a
        .put_secret("cfg", "API_KEY", secret)
        .await
        .expect("secret put");
    assert!(b.revalidate("cfg", &meta.revision()).await, "B told");
    assert_eq!(
        get_path(&b, "cfg", "/API_KEY").await,
        format!("env={secret} config={secret}")
    );
    let stored = b
        .script_store()
        .meta("cfg")
        .await
        .expect("meta")
        .expect("cfg");
    let json = serde_json::to_string(&stored).expect("json");
    assert!(json.contains("API_KEY") && !json.contains(secret), "{json}");
}

/// The body of `GET path` on Worker `id` of `rt`.
async fn get_path(rt: &Runtime, id: &str, path: &str) -> String {
    let req = http::Request::get(format!("http://{id}.localhost{path}"))
        .body(body::full(""))
        .expect("request");
    let resp = rt.serve(id, req).await;
    resp.into_body()
        .collect()
        .await
        .map(|b| String::from_utf8_lossy(&b.to_bytes()).into_owned())
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redeploy_reaches_a_node_that_was_not_told_within_the_revalidation_period() {
    let Some(garage) = garage().await else {
        return;
    };
    let (da, db) = (
        tempfile::tempdir().expect("dir"),
        tempfile::tempdir().expect("dir"),
    );
    let (a, _) = node(&garage, "p", da.path());
    let (b, _) = node(&garage, "p", db.path());
    a.deploy("app", Plan::Free, sample("hello"))
        .await
        .expect("deploy");
    assert_eq!(get(&b, "app").await.2, "hello from app");
    a.deploy("app", Plan::Free, sample("wstd-hello"))
        .await
        .expect("redeploy");
    // No announcement: B's background revalidation (once a second per
    // Worker, off the request path) finds the new version by itself.
    let mut seen = String::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while tokio::time::Instant::now() < deadline {
        seen = get(&b, "app").await.2;
        if seen == "hello from wstd" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(seen, "hello from wstd", "{:?}", b.stats());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_artifact_tampered_with_in_the_bucket_is_refused_and_recompiled() {
    let Some(garage) = garage().await else {
        return;
    };
    let (da, db) = (
        tempfile::tempdir().expect("dir"),
        tempfile::tempdir().expect("dir"),
    );
    let (a, store) = node(&garage, "t", da.path());
    let (b, _) = node(&garage, "t", db.path());
    let report = a
        .deploy("app", Plan::Free, sample("hello"))
        .await
        .expect("deploy");
    let name = a.artifacts().file_name(&report.meta.hash);
    let good = store
        .get_artifact(&name)
        .await
        .expect("read")
        .expect("the deploy shared its artifact");
    // Someone with write access to the bucket flips bytes of the code.
    let mut evil = good.to_vec();
    let mid = evil.len() / 2;
    evil[mid] ^= 0xff;
    store
        .put_artifact(&name, Bytes::from(evil.clone()))
        .await
        .expect("tamper");
    let (status, _, text) = get(&b, "app").await;
    assert_eq!((status, text.as_str()), (200, "hello from app"));
    let s = b.stats();
    assert_eq!(s.artifacts_rejected, 1, "the tampered artifact was refused");
    assert_eq!(s.compiles, 1, "and the source compiled instead");
    // B shares its own compile, replacing the tampered object.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let now = store.get_artifact(&name).await.expect("read");
        if now.as_deref().is_some_and(|b| b != evil.as_slice()) {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the tampered artifact stayed in the bucket"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // A third node now loads the repaired artifact without compiling.
    let dc = tempfile::tempdir().expect("dir");
    let (c, _) = node(&garage, "t", dc.path());
    assert_eq!(get(&c, "app").await.2, "hello from app");
    assert_eq!(c.stats().compiles, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_store_keeps_warm_workers_serving_and_half_writes_nothing() {
    let Some(mut garage) = garage().await else {
        return;
    };
    let (da, db) = (
        tempfile::tempdir().expect("dir"),
        tempfile::tempdir().expect("dir"),
    );
    let (a, _) = node(&garage, "u", da.path());
    let (b, _) = node(&garage, "u", db.path());
    a.deploy("app", Plan::Free, sample("hello"))
        .await
        .expect("deploy");
    a.deploy("other", Plan::Free, sample("echo"))
        .await
        .expect("deploy");
    assert_eq!(get(&b, "app").await.0, 200);

    garage.stop();
    // Warm Workers never need the store, even past their revalidation
    // time (the background check fails and keeps them).
    for _ in 0..3 {
        let (status, start, text) = get(&b, "app").await;
        assert_eq!((status, start.as_str()), (200, "warm"), "{text}");
        tokio::time::sleep(Duration::from_millis(600)).await;
    }
    // A deploy fails with the store's error, within the store's timeout.
    let t = std::time::Instant::now();
    let err = a
        .deploy("app", Plan::Free, sample("wstd-hello"))
        .await
        .expect_err("no store, no deploy");
    assert!(
        matches!(err, DeployError::Store(StoreError::Remote { .. })),
        "{err}"
    );
    assert!(t.elapsed() < Duration::from_secs(30), "{:?}", t.elapsed());
    // A cold start says why it cannot load.
    let (status, _, text) = get(&b, "other").await;
    assert_eq!(status, 503, "{text}");
    assert!(text.contains("store is unreachable"), "{text}");

    garage.restart().expect("garage back");
    // Nothing of the failed deploy is visible: the old version serves,
    // from the store, on a node that has never held it.
    let dc = tempfile::tempdir().expect("dir");
    let (c, _) = node(&garage, "u", dc.path());
    assert_eq!(get(&c, "app").await.2, "hello from app");
    assert_eq!(get(&b, "other").await.0, 200);
    let metas = c.script_store().list().await.expect("list");
    assert_eq!(metas.len(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_over_the_bucket_serves_a_redeploy_everywhere_as_soon_as_it_returns() {
    let Some(garage) = garage().await else {
        return;
    };
    let dir = tempfile::tempdir().expect("dir");
    let mut cfg = ClusterConfig::new(3, dir.path());
    cfg.s3 = Some((garage.url("cluster"), garage.settings()));
    let c = TestCluster::with_config(cfg, None).await.expect("cluster");
    c.deploy("app", Plan::Free, sample("hello"))
        .await
        .expect("deploy");
    for i in 0..3 {
        let r = c.get(i, "app", "/").await.expect("req");
        assert_eq!(
            (r.status, r.text().as_str()),
            (200, "hello from app"),
            "node {i}"
        );
    }
    // Warm a copy on every node (as fallbacks and lazy instances do), then
    // redeploy through another node than the first.
    for i in 0..3 {
        let req = http::Request::get("http://app.localhost/")
            .body(body::full(""))
            .expect("request");
        assert_eq!(
            c.node(i).node.runtime().serve("app", req).await.status(),
            200
        );
    }
    let d = c
        .node(1)
        .node
        .deploy("app", Plan::Free, sample("wstd-hello"))
        .await
        .expect("redeploy");
    assert_eq!(d.announced.members, 2);
    assert_eq!(d.announced.acknowledged, 2, "{:?}", d.announced.failed);
    // No waiting: every node serves the new version from now on.
    for i in 0..3 {
        let req = http::Request::get("http://app.localhost/")
            .body(body::full(""))
            .expect("request");
        let resp = c.node(i).node.runtime().serve("app", req).await;
        let text = resp.into_body().collect().await.expect("body").to_bytes();
        assert_eq!(text, "hello from wstd", "node {i}");
        let r = c.get(i, "app", "/").await.expect("req");
        assert_eq!(r.text(), "hello from wstd", "node {i} front door");
    }
    // The nodes' own directories hold no scripts: those are in the bucket.
    for i in 0..3 {
        let own = dir.path().join(format!("node-{}", i + 1));
        assert!(!own.join("scripts").exists(), "{}", own.display());
    }
}

/// Real `hearth serve` processes over the bucket, each with a directory of
/// its own (no shared disk), forming a cluster by gossip; one is killed
/// with SIGKILL under load.
mod processes {
    use std::net::SocketAddr;
    use std::path::Path;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::{Arc, Mutex};
    use std::time::{Duration, Instant};

    use hearth::sharding::ring::{Member, Ring, RingConfig};
    use hearth::testing::{Garage, HttpRequest, NodeProcess, ServeCommand, Signal, udp_port};

    use crate::{free_port, hearth};

    const TOKEN: &str = "s3-test-token-long-enough-for-the-node";
    const GOSSIP_KEY: &str = "4f5e6d7c8b9a0f1e2d3c4b5a69788796a5b4c3d2e1f00112233445566778899a";
    const ARTIFACT_KEY: &str = "0a1b2c3d4e5f60718293a4b5c6d7e8f90a1b2c3d4e5f60718293a4b5c6d7e8f9";

    /// One plain HTTP/1.1 GET of `/` on a fresh connection: status and
    /// body, or `None` if the connection failed.
    fn get(addr: SocketAddr, host: &str) -> Option<(u16, String)> {
        let r = HttpRequest::get(host, "/")
            .timeout(Duration::from_secs(15))
            .send(addr)
            .ok()?;
        Some((r.status, r.text()))
    }

    /// When a request was sent, for which Worker, and its answer.
    type Outcome = (Instant, String, Option<(u16, String)>);

    /// One node's RPC and gossip ports.
    struct Ports {
        rpc: u16,
        gossip: u16,
    }

    fn config(dir: &Path, me: usize, ports: &[Ports], garage: &Garage) -> std::path::PathBuf {
        let p = &ports[me];
        let text = format!(
            "node_id = \"node-{n}\"\n\
             store = \"{store}\"\ndata = \"{data}\"\nartifact_key = \"{ARTIFACT_KEY}\"\n\
             admin_token = \"{TOKEN}\"\n\n{s3}\n[cluster]\nrpc = \"127.0.0.1:{rpc}\"\npki = \"{pki}\"\n\
             gossip = \"127.0.0.1:{gossip}\"\nseeds = [\"127.0.0.1:{seed}\"]\ngossip_key = \"{GOSSIP_KEY}\"\n",
            n = me + 1,
            store = garage.url("procs"),
            data = dir.join(format!("data-{}", me + 1)).display(),
            s3 = garage.toml_section(),
            rpc = p.rpc,
            pki = dir.join("pki").display(),
            gossip = p.gossip,
            seed = ports[0].gossip,
        );
        let path = dir.join(format!("node-{}.toml", me + 1));
        std::fs::write(&path, text).expect("write config");
        path
    }

    fn logs(dir: &Path) -> String {
        (1..=3)
            .map(|i| {
                format!(
                    "--- node-{i}\n{}",
                    std::fs::read_to_string(dir.join(format!("node-{i}.log"))).unwrap_or_default()
                )
            })
            .collect()
    }

    /// Runs `hearth serve` with `config`, which must make it exit with an
    /// error; its stderr.
    fn serve_fails(dir: &Path, config: &str) -> String {
        let path = dir.join("node.toml");
        std::fs::write(&path, config).expect("write config");
        let out = hearth()
            .run(["serve", "--config", path.to_str().expect("utf8")], "")
            .expect("hearth serve");
        assert!(!out.success(), "it started");
        out.stderr
    }

    #[test]
    fn a_node_whose_bucket_it_cannot_use_refuses_to_start_and_says_why() {
        let dir = tempfile::tempdir().expect("tempdir");
        let d = dir.path();
        let (http, admin) = (free_port(), free_port());
        let base = format!(
            "listen = \"127.0.0.1:{http}\"\nadmin = \"127.0.0.1:{admin}\"\n\
             store = \"s3://hearth/x\"\ndata = \"{}\"\n",
            d.join("data").display()
        );
        // No artifact key: the node offers one.
        let err = serve_fails(d, &base);
        assert!(
            err.contains("artifact_key") && err.contains("artifact_key = \""),
            "{err}"
        );
        // A key, but nothing listening at the endpoint: the store's error,
        // promptly.
        let closed = free_port();
        let err = serve_fails(
            d,
            &format!(
                "{base}artifact_key = \"{ARTIFACT_KEY}\"\n[s3]\nendpoint = \"http://127.0.0.1:{closed}\"\n\
                 region = \"garage\"\naccess_key_id = \"GKx\"\nsecret_access_key = \"y\"\n\
                 allow_http = true\nmax_retries = 0\n"
            ),
        );
        assert!(err.contains("cannot use the script store"), "{err}");
        // A key of the wrong length is named as such.
        let err = serve_fails(d, &format!("{base}artifact_key = \"abc\"\n"));
        assert!(err.contains("artifact_key must be 64 hex digits"), "{err}");
    }

    #[test]
    fn a_cluster_over_the_bucket_loses_nothing_but_what_had_started_on_a_killed_node() {
        let rt = tokio::runtime::Runtime::new().expect("runtime");
        let Some(garage) = rt.block_on(super::garage()) else {
            return;
        };
        let dir = tempfile::tempdir().expect("tempdir");
        let d = dir.path();
        let pki = d.join("pki");
        hearth()
            .pki(&pki, &["node-1", "node-2", "node-3"])
            .unwrap_or_else(|e| panic!("{e}"));
        let ports: Vec<Ports> = (0..3)
            .map(|_| Ports {
                rpc: free_port(),
                gossip: udp_port().expect("a free UDP port"),
            })
            .collect();
        let nodes: Vec<NodeProcess> = (0..3)
            .map(|i| {
                ServeCommand::new(&hearth(), d.join(format!("node-{}.log", i + 1)))
                    .expect("ports")
                    .config(config(d, i, &ports, &garage))
                    .token(TOKEN)
                    .spawn()
                    .expect("spawn hearth serve")
            })
            .collect();
        // Two Workers homed on each node.
        let ring = Ring::new(
            (0..3).map(|i| {
                Member::new(
                    format!("node-{}", i + 1),
                    SocketAddr::from(([127, 0, 0, 1], ports[i].rpc)),
                )
            }),
            RingConfig::default(),
        )
        .expect("ring");
        let mut ids: Vec<String> = Vec::new();
        for n in 1..=3 {
            let home = format!("node-{n}");
            ids.extend(
                (0..1000)
                    .map(|k| format!("w{k}"))
                    .filter(|id| ring.home(id).is_some_and(|h| h.id.as_str() == home))
                    .take(2),
            );
        }
        // Deploy through node-1's admin API once it is up.
        let hello = hearth_sample_workers::path("hello").expect("hello built");
        let deadline = Instant::now() + Duration::from_secs(30);
        for id in &ids {
            loop {
                let out = nodes[0].deploy(id, hello, &[]).expect("hearth deploy");
                if out.success() {
                    break;
                }
                assert!(
                    Instant::now() < deadline,
                    "deploy failed: {}\n{}",
                    out.stderr,
                    logs(d)
                );
                std::thread::sleep(Duration::from_millis(200));
            }
        }
        // Wait until the three have met: a Worker homed at node-3 is served
        // there through node-1.
        let fronts: Vec<SocketAddr> = nodes.iter().map(|n| n.http()).collect();
        let at3 = format!("{}.localhost", ids[4]);
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Ok(r) = nodes[0].get(&at3, "/")
                && r.status == 200
                && r.header("x-hearth-node") == "node-3"
            {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "the cluster never formed\n{}",
                logs(d)
            );
            std::thread::sleep(Duration::from_millis(100));
        }

        // ~300 requests/s from 6 clients to node-1 and node-2, every Worker.
        let stop = Arc::new(AtomicBool::new(false));
        let results: Arc<Mutex<Vec<Outcome>>> = Arc::default();
        let clients: Vec<_> = (0..6)
            .map(|c| {
                let (stop, results, ids) = (stop.clone(), results.clone(), ids.clone());
                let target = fronts[c % 2];
                std::thread::spawn(move || {
                    let mut k = c;
                    while !stop.load(Ordering::Relaxed) {
                        let t = Instant::now();
                        let id = &ids[k % ids.len()];
                        let r = get(target, &format!("{id}.localhost"));
                        results.lock().expect("results").push((t, id.clone(), r));
                        k += 1;
                        std::thread::sleep(Duration::from_millis(20).saturating_sub(t.elapsed()));
                    }
                })
            })
            .collect();
        std::thread::sleep(Duration::from_secs(2));
        let killed_at = Instant::now();
        nodes[2].signal(Signal::Kill).expect("SIGKILL");
        std::thread::sleep(Duration::from_secs(6));
        stop.store(true, Ordering::Relaxed);
        for c in clients {
            c.join().expect("client");
        }
        let results = results.lock().expect("results");
        let total = results.len();
        let mut failed = Vec::new();
        let mut after_kill_ok_for_node3 = 0;
        for (t, id, r) in results.iter() {
            match r {
                Some((200, body)) => {
                    if *t > killed_at + Duration::from_secs(1)
                        && (id == &ids[4] || id == &ids[5])
                        && body.contains("hello from")
                    {
                        after_kill_ok_for_node3 += 1;
                    }
                }
                other => failed.push((id.clone(), other.clone())),
            }
        }
        // Every failure is a request that node-3 may have started when it
        // died (the at-most-once rule answers it with a 502, never a
        // replay); each client had at most one in flight at the kill.
        for (id, r) in &failed {
            let text = r.as_ref().map(|(_, b)| b.as_str()).unwrap_or("no answer");
            assert!(
                (id == &ids[4] || id == &ids[5]) && text.contains("may have started"),
                "a request that had not started at the killed node was lost ({id}): {text}"
            );
        }
        assert!(failed.len() <= 6, "{} failed of {total}", failed.len());
        assert!(total > 1000, "only {total} requests were sent");
        assert!(
            after_kill_ok_for_node3 > 50,
            "node-3's Workers were not served by the survivors: {after_kill_ok_for_node3}\n{}",
            logs(d)
        );
        eprintln!(
            "{total} requests, {} lost (had started on the killed node)",
            failed.len()
        );
    }
}

/// Whoever can write the bucket points `app`'s deployment at another
/// Worker's blob (one that prints its environment): the next load refuses
/// the record and counts it, and the secret is never printed. Before
/// records were signed, the answer was `env=<secret>`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_edited_in_the_bucket_is_refused_and_counted() {
    use hearth::runtime::store::script_store::RecordKey;
    let Some(garage) = garage().await else {
        return;
    };
    let (da, db) = (
        tempfile::tempdir().expect("dir"),
        tempfile::tempdir().expect("dir"),
    );
    let (a, store) = node(&garage, "signed", da.path());
    let (b, _) = node(&garage, "signed", db.path());
    let hello = a
        .deploy("app", Plan::Free, sample("hello"))
        .await
        .expect("deploy");
    a.put_secret("app", "TOKEN", "s3cr3t-in-the-bucket")
        .await
        .expect("secret");
    let dumper = a
        .deploy("dumper", Plan::Free, sample("config-echo"))
        .await
        .expect("deploy");
    let key = RecordKey::deployment("app");
    let record = store.get_record(key).await.expect("read").expect("record");
    let text = String::from_utf8(record).expect("utf-8");
    let forged = text.replace(&hello.meta.hash, &dumper.meta.hash);
    assert_ne!(forged, text);
    store
        .put_record(key, forged.as_bytes())
        .await
        .expect("write");
    let req = http::Request::get("http://app.localhost/TOKEN")
        .body(body::full(""))
        .expect("request");
    let resp = b.serve("app", req).await;
    assert_eq!(resp.status(), 500);
    let body = resp.into_body().collect().await.expect("body").to_bytes();
    assert!(!String::from_utf8_lossy(&body).contains("s3cr3t"));
    assert_eq!(b.stats().store_metadata_rejected, 1);
    let e = b.script_store().meta("app").await.expect_err("refused");
    assert!(matches!(e, StoreError::Unauthenticated { .. }), "{e}");
}

/// Two nodes with no shared disk deploy one script at the same moment,
/// over and over: every deploy gets a version of its own, on record as it
/// was deployed (Garage ignores conditional writes, so before numbers
/// were claimed the second write replaced the first's version).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_nodes_deploying_at_once_never_share_a_version() {
    let Some(garage) = garage().await else {
        return;
    };
    let (da, db) = (
        tempfile::tempdir().expect("dir"),
        tempfile::tempdir().expect("dir"),
    );
    let (a, _) = node(&garage, "race", da.path());
    let (b, _) = node(&garage, "race", db.path());
    a.deploy("app", Plan::Free, sample("hello"))
        .await
        .expect("first");
    let mut reports = Vec::new();
    for _ in 0..5 {
        let (ra, rb) = tokio::join!(
            a.deploy("app", Plan::Free, sample("hello")),
            b.deploy("app", Plan::Free, sample("hello")),
        );
        reports.push(ra.expect("a").meta);
        reports.push(rb.expect("b").meta);
    }
    let mut numbers: Vec<u64> = reports.iter().map(|m| m.version).collect();
    numbers.sort_unstable();
    numbers.dedup();
    assert_eq!(numbers.len(), reports.len(), "{numbers:?}");
    let list = a.versions("app").await.expect("versions");
    for m in &reports {
        let on_record = list.versions.iter().find(|v| v.version == m.version);
        assert_eq!(
            on_record.map(|v| v.deployed_at_ms),
            Some(m.deployed_at_ms),
            "version {}",
            m.version
        );
    }
}
