//! Real `hearth serve` processes forming a cluster from one shared config
//! file, as the pods of a StatefulSet do (node IDs from `$HOSTNAME`, gossip
//! seeds given as `localhost:PORT` names, mTLS certificates from `hearth
//! pki`), sharding a Worker to its home, and draining cleanly on SIGTERM;
//! `hearth cluster` serving on when nobody reads its output.

use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use hearth::sharding::ring::{Member, Ring, RingConfig};

use super::serve_node::free_port;

const BIN: &str = env!("CARGO_BIN_EXE_hearth");

struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn run_ok(args: &[&str]) {
    let out = Command::new(BIN).args(args).output().expect("run hearth");
    assert!(
        out.status.success(),
        "hearth {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn get(addr: SocketAddr, host: &str) -> Option<(u16, String)> {
    get_path(addr, host, "/")
}

/// GET `path` on an admin listener.
fn admin_get(addr: SocketAddr, path: &str) -> Option<(u16, String)> {
    get_path(addr, "admin", path)
}

fn get_path(addr: SocketAddr, host: &str, path: &str) -> Option<(u16, String)> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(2)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut buf = String::new();
    s.read_to_string(&mut buf).ok()?;
    let status = buf.split_whitespace().nth(1)?.parse().ok()?;
    Some((status, buf))
}

fn header<'a>(resp: &'a str, name: &str) -> &'a str {
    resp.lines()
        .find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case(name).then(|| v.trim())
        })
        .unwrap_or("")
}

fn free_udp_port() -> u16 {
    hearth::testing::udp_port().expect("a free UDP port")
}

/// One node's ports: HTTP, admin, RPC, gossip.
type Ports = (u16, u16, u16, u16);

/// The one config file both nodes run with: the node ID from `$HOSTNAME`,
/// the cluster ports from variables (as a pod's IP would be), and the seeds
/// as names, the way a Kubernetes ConfigMap shared by a StatefulSet's pods
/// writes them. (The Worker and admin ports differ by flag: on one host
/// they cannot be the same.)
fn shared_config(dir: &Path, ports: &[Ports]) -> std::path::PathBuf {
    let seeds: Vec<String> = ports
        .iter()
        .map(|p| format!("\"localhost:{}\"", p.3))
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

#[test]
fn two_serve_processes_shard_and_drain() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    let pki = d.join("pki");
    let store = d.join("store");
    run_ok(&[
        "pki",
        "--dir",
        pki.to_str().expect("utf8"),
        "node-1",
        "node-2",
    ]);
    let hello = hearth_sample_workers::path("hello").expect("hello built");
    let ports: Vec<Ports> = (0..2)
        .map(|_| (free_port(), free_port(), free_port(), free_udp_port()))
        .collect();
    // Pick a script ID homed at node-2, so a request to node-1 is sharded.
    let ring = Ring::new(
        (0..2).map(|i| {
            Member::new(
                format!("node-{}", i + 1),
                SocketAddr::from(([127, 0, 0, 1], ports[i].2)),
            )
        }),
        RingConfig::default(),
    )
    .expect("ring");
    let id = (0..100)
        .map(|i| format!("app{i}"))
        .find(|id| ring.home(id).is_some_and(|n| n.id.as_str() == "node-2"))
        .expect("some ID homed at node-2");
    run_ok(&[
        "deploy",
        "--store",
        store.to_str().expect("utf8"),
        "--name",
        &id,
        hello.to_str().expect("utf8"),
    ]);

    let cfg = shared_config(d, &ports);
    let mut procs: Vec<Proc> = (0..2)
        .map(|i| {
            let (http, admin, rpc, gossip) = ports[i];
            Proc(
                Command::new(BIN)
                    .args(["serve", "--config", cfg.to_str().expect("utf8")])
                    .args(["--listen", &format!("127.0.0.1:{http}")])
                    .args(["--admin", &format!("127.0.0.1:{admin}")])
                    .env("HOSTNAME", format!("node-{}", i + 1))
                    .env("RPC_PORT", rpc.to_string())
                    .env("GOSSIP_PORT", gossip.to_string())
                    .stdout(Stdio::null())
                    .stderr(
                        std::fs::File::create(d.join(format!("node-{}.log", i + 1)))
                            .expect("log file"),
                    )
                    .spawn()
                    .expect("spawn hearth serve"),
            )
        })
        .collect();
    let node1: SocketAddr = ([127, 0, 0, 1], ports[0].0).into();
    let host = format!("{id}.localhost");
    let logs = || {
        format!(
            "node logs:\n{}\n{}",
            std::fs::read_to_string(d.join("node-1.log")).unwrap_or_default(),
            std::fs::read_to_string(d.join("node-2.log")).unwrap_or_default()
        )
    };
    // Both join through the seeds' names: ready once each has met the
    // other (and proved its node ID).
    let deadline = Instant::now() + Duration::from_secs(30);
    for (i, p) in ports.iter().enumerate() {
        loop {
            let ready = admin_get(([127, 0, 0, 1], p.1).into(), "/readyz");
            if matches!(ready, Some((200, _))) {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "node-{} never ready ({ready:?}); {}",
                i + 1,
                logs()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    // Both on both rings: a request to node-1 is served at node-2.
    let deadline = Instant::now() + Duration::from_secs(10);
    let resp = loop {
        if let Some((200, r)) = get(node1, &host)
            && header(&r, "x-hearth-route") == "sharded"
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
        header(&resp, "x-hearth-node"),
        "node-2",
        "node ID from $HOSTNAME"
    );
    assert!(resp.contains(&format!("hello from {id}")));

    // SIGTERM (what systemd, Docker and Kubernetes send) on node-2: it
    // drains and exits cleanly; node-1 keeps serving.
    let pid = procs[1].0.id().to_string();
    assert!(
        Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .expect("kill")
            .success()
    );
    let deadline = Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(s) = procs[1].0.try_wait().expect("wait") {
            break s;
        }
        assert!(
            Instant::now() < deadline,
            "node-2 did not exit after SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(status.success(), "node-2 exited with {status}");
    let (code, resp) = get(node1, &host).expect("node-1 still answers");
    assert_eq!(code, 200, "{resp}");
    assert_eq!(header(&resp, "x-hearth-node"), "node-1");
    procs.clear();
}

#[test]
fn hearth_cluster_keeps_serving_when_nobody_reads_its_stdout() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = dir.path().join("store");
    let hello = hearth_sample_workers::path("hello").expect("hello built");
    run_ok(&[
        "deploy",
        "--store",
        store.to_str().expect("utf8"),
        "--name",
        "hello",
        hello.to_str().expect("utf8"),
    ]);
    // One node's HTTP, admin, RPC and HTTPS ports count up from the base.
    let base = hearth::testing::tcp_port_block(4).expect("four free ports");
    let log = dir.path().join("cluster.log");
    let mut cluster = Proc(
        Command::new(BIN)
            .args(["cluster", "--nodes", "1", "--base-port", &base.to_string()])
            .arg("--store")
            .arg(&store)
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&log).expect("log file"))
            .spawn()
            .expect("spawn hearth cluster"),
    );
    // The reader goes away before the cluster prints its addresses (as
    // `| head -1` or a script that has read what it needed would).
    drop(cluster.0.stdout.take());
    let node: SocketAddr = ([127, 0, 0, 1], base).into();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(status) = cluster.0.try_wait().expect("wait") {
            panic!(
                "hearth cluster exited ({status}) when its stdout closed:\n{}",
                std::fs::read_to_string(&log).unwrap_or_default()
            );
        }
        if let Some((200, _)) = get(node, "hello.localhost") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the cluster never served hello:\n{}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let log = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(
        log.contains("could not print to stdout"),
        "the lost output is not reported:\n{log}"
    );
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
        let mut c = Command::new(BIN);
        c.args(["serve", "--config", cfg.to_str().expect("utf8")]);
        match hostname {
            Some(h) => c.env("HOSTNAME", h),
            None => c.env_remove("HOSTNAME"),
        };
        let out = c.output().expect("run hearth serve");
        assert!(!out.status.success(), "hearth serve started");
        String::from_utf8_lossy(&out.stderr).into_owned()
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
    for (name, wasm) in [("pre", &hello), ("up", &echo)] {
        run_ok(&[
            "deploy",
            "--store",
            store_s,
            "--name",
            name,
            wasm.to_str().expect("utf8"),
        ]);
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
        let out = Command::new(BIN)
            .args(["precompile", "pre", "--store", store_s])
            .output()
            .expect("run hearth precompile");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let first = precompile();
    assert!(first.contains("pre: compiled"), "{first}");
    assert!(
        first.contains("1 of 1 Workers have artifacts for this engine"),
        "{first}"
    );
    assert!(precompile().contains("pre: already cached"), "idempotent");
    let all = Command::new(BIN)
        .args(["precompile", "--all", "nope", "--store", store_s])
        .output()
        .expect("run hearth precompile");
    assert!(
        !all.status.success(),
        "--all and names together are refused"
    );

    let (http, admin) = (free_port(), free_port());
    let log = dir.path().join("node.log");
    let out = dir.path().join("node.out");
    let _node = Proc(
        Command::new(BIN)
            .args(["serve", "--store", store_s])
            .args(["--listen", &format!("127.0.0.1:{http}")])
            .args(["--admin", &format!("127.0.0.1:{admin}")])
            .stdout(std::fs::File::create(&out).expect("stdout file"))
            .stderr(std::fs::File::create(&log).expect("log file"))
            .spawn()
            .expect("spawn hearth serve"),
    );
    let admin: SocketAddr = ([127, 0, 0, 1], admin).into();
    let deadline = Instant::now() + Duration::from_secs(30);
    while !matches!(admin_get(admin, "/readyz"), Some((200, _))) {
        assert!(
            Instant::now() < deadline,
            "never ready: {}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let said = std::fs::read_to_string(&out).unwrap_or_default();
    assert!(
        said.contains("new engine: precompiled 1 Workers before reporting ready"),
        "{said}"
    );
    let (_, metrics) = admin_get(admin, "/metrics").expect("metrics");
    assert_eq!(
        counter(&metrics, "hearth_compiles"),
        1,
        "`up`, before ready"
    );
    for script in ["pre", "up"] {
        let host = format!("{script}.localhost");
        let (code, resp) = get(([127, 0, 0, 1], http).into(), &host).expect("answers");
        assert_eq!(code, 200, "{resp}");
        assert_eq!(header(&resp, "x-hearth-start"), "cold", "{resp}");
    }
    let (_, metrics) = admin_get(admin, "/metrics").expect("metrics");
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
    run_ok(&["pki", "--dir", pki.to_str().expect("utf8"), "node-1"]);
    let (http, admin) = (free_port(), free_port());
    let token = "an-admin-token-of-at-least-32-bytes-0123456789";
    let cfg = d.join("node-1.toml");
    std::fs::write(
        &cfg,
        format!(
            "node_id = \"node-1\"\nlisten = \"127.0.0.1:{http}\"\nadmin = \"127.0.0.1:{admin}\"\n\
             store = \"{}\"\nadmin_token = \"{token}\"\nadmin_tls_cert = \"{}\"\nadmin_tls_key = \"{}\"\n",
            d.join("store").display(),
            pki.join("node-1.pem").display(),
            pki.join("node-1-key.pem").display(),
        ),
    )
    .expect("config");
    let _node = Proc(
        Command::new(BIN)
            .args(["serve", "--config", cfg.to_str().expect("utf8")])
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(d.join("node-1.log")).expect("log file"))
            .spawn()
            .expect("spawn hearth serve"),
    );
    let url = format!("https://127.0.0.1:{admin}");
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
                    std::fs::read_to_string(d.join("node-1.log")).unwrap_or_default()
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
    let plain =
        tokio::task::spawn_blocking(move || admin_get(([127, 0, 0, 1], admin).into(), "/healthz"))
            .await
            .expect("plain request");
    assert!(
        plain.as_ref().is_none_or(|(code, _)| *code != 200),
        "plain HTTP answered: {plain:?}"
    );
    let http_client = AdminClient::new(&format!("http://127.0.0.1:{admin}"), Some(token.into()))
        .expect("client")
        .with_timeout(Duration::from_secs(5));
    assert!(matches!(
        http_client.list().await,
        Err(AdminError::Unreachable { .. })
    ));
    // A client that does not trust the node's CA is refused by the handshake.
    let other = tempfile::tempdir().expect("tempdir");
    run_ok(&[
        "pki",
        "--dir",
        other.path().to_str().expect("utf8"),
        "node-1",
    ]);
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
