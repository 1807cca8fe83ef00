//! Real `hearth serve` processes forming a cluster from one shared config
//! file, as the pods of a StatefulSet do (node IDs from `$HOSTNAME`, gossip
//! seeds given as `localhost:PORT` names, mTLS certificates from `hearth
//! pki`), sharding a Worker to its home, and draining cleanly on SIGTERM;
//! `hearth cluster` serving on when nobody reads its output.

use std::net::SocketAddr;
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use hearth::sharding::ring::{Member, Ring, RingConfig};
use hearth::testing::{HttpRequest, NodeProcess, Process, ServeCommand, Signal};

use crate::{free_port, hearth};

pub(crate) fn free_udp_port() -> u16 {
    hearth::testing::udp_port().expect("a free UDP port")
}

/// The one config file both nodes run with: the node ID from `$HOSTNAME`,
/// the cluster ports from variables (as a pod's IP would be), and the seeds
/// as names, the way a Kubernetes ConfigMap shared by a StatefulSet's pods
/// writes them. (The Worker and admin ports differ by flag: on one host
/// they cannot be the same.)
pub(crate) fn shared_config(dir: &Path, gossip_ports: &[u16]) -> std::path::PathBuf {
    let seeds: Vec<String> = gossip_ports
        .iter()
        .map(|p| format!("\"localhost:{p}\""))
        .collect();
    let text = format!(
        "node_id = \"$HOSTNAME\"\n\
         store = \"{}\"\n\n[cluster]\nrpc = \"127.0.0.1:${{RPC_PORT}}\"\ngossip = \"127.0.0.1:${{GOSSIP_PORT}}\"\n\
         seeds = [{}]\ngossip_key = \"{}\"\npki = \"{}\"\n",
        dir.join("store").display(),
        seeds.join(", "),
        "6b".repeat(32),
        dir.join("pki").display(),
    );
    let path = dir.join("hearth.toml");
    std::fs::write(&path, text).expect("write config");
    path
}

/// `hearth serve` as node-1, node-2, ... (IDs from `$HOSTNAME`), each
/// with the shared config `cfg` and its (RPC, gossip) ports, logging to
/// `<dir>/node-<n>.log`.
pub(crate) fn spawn_nodes(dir: &Path, cfg: &Path, ports: &[(u16, u16)]) -> Vec<NodeProcess> {
    ports
        .iter()
        .enumerate()
        .map(|(i, (rpc, gossip))| {
            ServeCommand::new(&hearth(), dir.join(format!("node-{}.log", i + 1)))
                .expect("ports")
                .config(cfg)
                .env("HOSTNAME", format!("node-{}", i + 1))
                .env("RPC_PORT", rpc.to_string())
                .env("GOSSIP_PORT", gossip.to_string())
                .spawn()
                .expect("spawn hearth serve")
        })
        .collect()
}

/// The logs of the `nodes` nodes [`spawn_nodes`] started in `dir`, for a
/// failure's message.
pub(crate) fn node_logs(dir: &Path, nodes: usize) -> String {
    let logs: Vec<String> = (1..=nodes)
        .map(|n| std::fs::read_to_string(dir.join(format!("node-{n}.log"))).unwrap_or_default())
        .collect();
    format!("node logs:\n{}", logs.join("\n"))
}

#[test]
fn two_serve_processes_shard_and_drain() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    let pki = d.join("pki");
    let store = d.join("store");
    hearth()
        .pki(&pki, &["node-1", "node-2"])
        .unwrap_or_else(|e| panic!("{e}"));
    let hello = hearth_sample_workers::path("hello").expect("hello built");
    // Each node's RPC and gossip ports.
    let cluster: Vec<(u16, u16)> = (0..2).map(|_| (free_port(), free_udp_port())).collect();
    // Pick a script ID homed at node-2, so a request to node-1 is sharded.
    let ring = Ring::new(
        (0..2).map(|i| {
            Member::new(
                format!("node-{}", i + 1),
                SocketAddr::from(([127, 0, 0, 1], cluster[i].0)),
            )
        }),
        RingConfig::default(),
    )
    .expect("ring");
    let id = (0..100)
        .map(|i| format!("app{i}"))
        .find(|id| ring.home(id).is_some_and(|n| n.id.as_str() == "node-2"))
        .expect("some ID homed at node-2");
    hearth()
        .deploy(&store, &id, hello, &[])
        .unwrap_or_else(|e| panic!("{e}"));

    let gossip: Vec<u16> = cluster.iter().map(|c| c.1).collect();
    let cfg = shared_config(d, &gossip);
    let mut nodes = spawn_nodes(d, &cfg, &cluster);
    let host = format!("{id}.localhost");
    let logs = || node_logs(d, 2);
    // Both join through the seeds' names: ready once each has met the
    // other (and proved its node ID).
    for node in &nodes {
        node.wait_ready(Duration::from_secs(30))
            .unwrap_or_else(|e| panic!("{e}; {}", logs()));
    }
    // Both on both rings: a request to node-1 is served at node-2.
    let deadline = Instant::now() + Duration::from_secs(10);
    let resp = loop {
        if let Ok(r) = nodes[0].get(&host, "/")
            && r.status == 200
            && r.header("x-hearth-route") == "sharded"
        {
            break r;
        }
        assert!(
            Instant::now() < deadline,
            "node-1 never sharded {id}; {}",
            logs()
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_eq!(
        resp.header("x-hearth-node"),
        "node-2",
        "node ID from $HOSTNAME"
    );
    assert!(resp.text().contains(&format!("hello from {id}")));

    // SIGTERM (what systemd, Docker and Kubernetes send) on node-2: it
    // drains and exits cleanly; node-1 keeps serving.
    let status = nodes[1]
        .stop(Signal::Term, Duration::from_secs(20))
        .unwrap_or_else(|e| panic!("node-2 did not exit after SIGTERM: {e}"));
    assert!(status.success(), "node-2 exited with {status}");
    let resp = nodes[0].get(&host, "/").expect("node-1 still answers");
    assert_eq!(resp.status, 200, "{resp:?}");
    assert_eq!(resp.header("x-hearth-node"), "node-1");
}

#[test]
fn hearth_cluster_keeps_serving_when_nobody_reads_its_stdout() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = dir.path().join("store");
    let hello = hearth_sample_workers::path("hello").expect("hello built");
    hearth()
        .deploy(&store, "hello", hello, &[])
        .unwrap_or_else(|e| panic!("{e}"));
    // One node's HTTP, admin, RPC and HTTPS ports count up from the base.
    let base = hearth::testing::tcp_port_block(4).expect("four free ports");
    let log = dir.path().join("cluster.log");
    let mut cmd = hearth().command([
        "cluster",
        "--nodes",
        "1",
        "--base-port",
        &base.to_string(),
        "--store",
        store.to_str().expect("utf8"),
    ]);
    cmd.stdout(Stdio::piped())
        .stderr(std::fs::File::create(&log).expect("log file"));
    let mut cluster = Process::spawn(&mut cmd).expect("spawn hearth cluster");
    // The reader goes away before the cluster prints its addresses (as
    // `| head -1` or a script that has read what it needed would).
    drop(cluster.take_stdout());
    let node: SocketAddr = ([127, 0, 0, 1], base).into();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(status) = cluster.try_exit().expect("wait") {
            panic!(
                "hearth cluster exited ({status}) when its stdout closed:\n{}",
                std::fs::read_to_string(&log).unwrap_or_default()
            );
        }
        if HttpRequest::get("hello.localhost", "/")
            .send(node)
            .is_ok_and(|r| r.status == 200)
        {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the cluster never served hello:\n{}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    // The cluster serves a moment before it prints its addresses (and
    // logs that it could not): wait for that line rather than race it.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        if text.contains("could not print to stdout") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the lost output is not reported:\n{text}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// `node_id = "$HOSTNAME"` with no such variable, or with a hostname that
/// cannot name a node, stops `hearth serve` at once with a message that
/// says which.
#[test]
fn a_node_id_from_an_unusable_hostname_is_refused_at_start() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = dir.path().join("hearth.toml");
    std::fs::write(&cfg, "node_id = \"$HOSTNAME\"\n").expect("write config");
    let serve = |hostname: Option<&str>| {
        let mut c = hearth().command(["serve", "--config", cfg.to_str().expect("utf8")]);
        match hostname {
            Some(h) => c.env("HOSTNAME", h),
            None => c.env_remove("HOSTNAME"),
        };
        let out = hearth::testing::run(c, "").expect("run hearth serve");
        assert!(!out.success(), "hearth serve started");
        out.stderr
    };
    let unset = serve(None);
    assert!(
        unset.contains("names the environment variable HOSTNAME, which is not set"),
        "{unset}"
    );
    let bad = serve(Some("Build Box"));
    assert!(
        bad.contains("gives the node ID \"Build Box\", which cannot name a node"),
        "{bad}"
    );
}

/// The value of counter `name` in a `/metrics` body.
fn counter(metrics: &str, name: &str) -> u64 {
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{name}_total ")))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {name}_total in /metrics:\n{metrics}"))
}

/// After an upgrade the engine has no artifacts of its own (here: the
/// deploys' artifacts are renamed to another engine's). `hearth precompile
/// pre` makes one for `pre`; the node, finding `up` compiled only by the
/// old engine, precompiles it before it reports ready. So the node's first
/// requests to both load artifacts: it compiles nothing on a request.
#[test]
fn after_precompile_a_fresh_node_compiles_nothing_on_its_first_request() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = dir.path().join("store");
    let store_s = store.to_str().expect("utf8");
    let hello = hearth_sample_workers::path("hello").expect("hello built");
    let echo = hearth_sample_workers::path("echo").expect("echo built");
    for (name, wasm) in [("pre", hello), ("up", echo)] {
        hearth()
            .deploy(&store, name, wasm, &[])
            .unwrap_or_else(|e| panic!("{e}"));
    }
    // The deploys compiled for this engine; make their artifacts an older
    // engine's, as an upgrade finds them.
    let artifacts = store.join("artifacts");
    let mut renamed = 0;
    for e in std::fs::read_dir(&artifacts).expect("artifact dir") {
        let path = e.expect("entry").path();
        let name = path
            .file_name()
            .expect("name")
            .to_string_lossy()
            .into_owned();
        if let Some((hash, _engine)) = name.strip_suffix(".cwasm").and_then(|s| s.rsplit_once('-'))
        {
            std::fs::rename(
                &path,
                artifacts.join(format!("{hash}-0000000000000000.cwasm")),
            )
            .expect("rename artifact");
            renamed += 1;
        }
    }
    assert_eq!(renamed, 2, "each deploy wrote one artifact");
    let precompile = || {
        hearth()
            .ok(["precompile", "pre", "--store", store_s])
            .unwrap_or_else(|e| panic!("{e}"))
    };
    let first = precompile();
    assert!(first.contains("pre: compiled"), "{first}");
    assert!(
        first.contains("1 of 1 Workers have artifacts for this engine"),
        "{first}"
    );
    assert!(precompile().contains("pre: already cached"), "idempotent");
    let all = hearth()
        .run(["precompile", "--all", "nope", "--store", store_s], "")
        .expect("run hearth precompile");
    assert!(!all.success(), "--all and names together are refused");

    let out = dir.path().join("node.out");
    let node = ServeCommand::new(&hearth(), dir.path().join("node.log"))
        .expect("ports")
        .store(&store)
        .stdout(&out)
        .spawn()
        .expect("spawn hearth serve");
    node.wait_ready(Duration::from_secs(30))
        .unwrap_or_else(|e| panic!("{e}"));
    let said = std::fs::read_to_string(&out).unwrap_or_default();
    assert!(
        said.contains("new engine: precompiled 1 Workers before reporting ready"),
        "{said}"
    );
    let metrics = node.metrics().expect("metrics");
    assert_eq!(
        counter(&metrics, "hearth_compiles"),
        1,
        "`up`, before ready"
    );
    for script in ["pre", "up"] {
        let resp = node
            .get(&format!("{script}.localhost"), "/")
            .expect("answers");
        assert_eq!(resp.status, 200, "{resp:?}");
        assert_eq!(resp.header("x-hearth-start"), "cold", "{resp:?}");
    }
    let metrics = node.metrics().expect("metrics");
    assert_eq!(
        counter(&metrics, "hearth_compiles"),
        1,
        "no request compiled"
    );
    assert_eq!(
        counter(&metrics, "hearth_artifact_loads"),
        2,
        "both loaded artifacts"
    );
}

/// The admin API over TLS: a node configured with its own certificate
/// from `hearth pki` (`admin_tls_cert`, `admin_tls_key`) answers the admin
/// client over HTTPS (trusting the cluster's CA), and a plain HTTP request
/// to the same port gets no answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_api_serves_https_with_the_nodes_own_certificate() {
    use hearth_admin_client::{AdminClient, AdminError};
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    let pki = d.join("pki");
    hearth()
        .pki(&pki, &["node-1"])
        .unwrap_or_else(|e| panic!("{e}"));
    let token = "an-admin-token-of-at-least-32-bytes-0123456789";
    let cfg = d.join("node-1.toml");
    std::fs::write(
        &cfg,
        format!(
            "node_id = \"node-1\"\n\
             store = \"{}\"\nadmin_token = \"{token}\"\nadmin_tls_cert = \"{}\"\nadmin_tls_key = \"{}\"\n",
            d.join("store").display(),
            pki.join("node-1.pem").display(),
            pki.join("node-1-key.pem").display(),
        ),
    )
    .expect("config");
    let node = ServeCommand::new(&hearth(), d.join("node-1.log"))
        .expect("ports")
        .config(&cfg)
        .spawn()
        .expect("spawn hearth serve");
    let admin = node.admin();
    let url = format!("https://{admin}");
    let client = AdminClient::with_ca(
        &url,
        Some(token.into()),
        &pki.join("ca.pem"),
        Some("node-1.node.hearth.cluster"),
    )
    .expect("client")
    .with_timeout(Duration::from_secs(2));
    let deadline = Instant::now() + Duration::from_secs(30);
    let scripts = loop {
        match client.list().await {
            Ok(s) => break s,
            Err(e) => {
                assert!(
                    Instant::now() < deadline,
                    "no HTTPS admin answer: {e}; node log:\n{}",
                    node.log()
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    };
    assert!(scripts.is_empty());
    assert!(
        client
            .metrics()
            .await
            .expect("metrics")
            .0
            .contains("hearth_")
    );
    // A wrong token is still refused over TLS.
    let wrong = AdminClient::with_ca(
        &url,
        Some("x".repeat(40)),
        &pki.join("ca.pem"),
        Some("node-1.node.hearth.cluster"),
    )
    .expect("client");
    assert_eq!(
        wrong.list().await.expect_err("wrong token").status(),
        Some(http::StatusCode::UNAUTHORIZED)
    );
    // Plain HTTP to the admin port: no HTTP answer.
    let plain = HttpRequest::get("admin", "/healthz")
        .timeout(Duration::from_secs(10))
        .send_async(admin)
        .await
        .ok();
    assert!(
        plain.as_ref().is_none_or(|r| r.status != 200),
        "plain HTTP answered: {plain:?}"
    );
    let http_client = AdminClient::new(&format!("http://{admin}"), Some(token.into()))
        .expect("client")
        .with_timeout(Duration::from_secs(5));
    assert!(matches!(
        http_client.list().await,
        Err(AdminError::Unreachable { .. })
    ));
    // A client that does not trust the node's CA is refused by the handshake.
    let other = tempfile::tempdir().expect("tempdir");
    hearth()
        .pki(other.path(), &["node-1"])
        .unwrap_or_else(|e| panic!("{e}"));
    let stranger = AdminClient::with_ca(
        &url,
        Some(token.into()),
        &other.path().join("ca.pem"),
        Some("node-1.node.hearth.cluster"),
    )
    .expect("client");
    assert!(matches!(
        stranger.list().await,
        Err(AdminError::Unreachable { .. })
    ));
}
