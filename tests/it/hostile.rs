//! Slow, stalled, vanishing and greedy clients against a real `hearth
//! serve` process, as a user would try them with a few sockets: none of
//! them may freeze a Worker, starve another Worker, keep a Worker burning
//! CPU after they left, or stop a drain.

use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use hearth::testing::{NodeProcess, ServeCommand, Signal, TestResponse};
use hearth_admin_client::NodeStats;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};

use crate::{free_port, hearth};

const TOKEN: &str = "hostile-test-token-long-enough-for-the-node";

/// Deploys `workers` into a fresh store in `dir` and starts a node on it
/// whose config has `extra` appended.
fn start(dir: &Path, workers: &[&str], extra: &str) -> NodeProcess {
    deploy(dir, workers);
    NodeProcess::standalone(&hearth(), dir, TOKEN, extra).expect("the node starts")
}

/// Deploys `workers` (samples) into the store `dir/store`.
fn deploy(dir: &Path, workers: &[&str]) {
    for w in workers {
        let path = hearth_sample_workers::path(w).expect("sample built");
        hearth()
            .deploy(&dir.join("store"), w, path, &[])
            .unwrap_or_else(|e| panic!("{e}"));
    }
}

/// The node's counters, through the typed admin client.
async fn stats(node: &NodeProcess) -> NodeStats {
    node.admin_client()
        .expect("admin url")
        .stats()
        .await
        .expect("admin answers")
}

/// Sends `bytes` from `from` (an address on the loopback, or any) and reads
/// the whole answer: (status, text). `None` if the connection failed.
async fn exchange(to: SocketAddr, from: Option<[u8; 4]>, bytes: &[u8]) -> Option<(u16, String)> {
    let mut s = connect(to, from).await?;
    s.write_all(bytes).await.ok()?;
    // Everything up to the close (or a reset after the answer).
    let mut buf = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut buf)).await;
    let text = String::from_utf8_lossy(&buf).into_owned();
    let status = text.split_whitespace().nth(1)?.parse().ok()?;
    Some((status, text))
}

async fn connect(to: SocketAddr, from: Option<[u8; 4]>) -> Option<TcpStream> {
    let sock = TcpSocket::new_v4().ok()?;
    if let Some(ip) = from {
        sock.bind((ip, 0).into()).ok()?;
    }
    sock.connect(to).await.ok()
}

fn get(host: &str) -> Vec<u8> {
    format!("GET / HTTP/1.1\r\nHost: {host}.localhost\r\nConnection: close\r\n\r\n").into_bytes()
}

/// A POST to `host` announcing 100 MB that sends `sent` bytes of it and
/// then nothing: the socket, still open.
async fn stalled_post(to: SocketAddr, host: &str, sent: usize) -> Option<TcpStream> {
    let mut s = connect(to, None).await?;
    let head =
        format!("POST / HTTP/1.1\r\nHost: {host}.localhost\r\nContent-Length: 100000000\r\n\r\n");
    s.write_all(head.as_bytes()).await.ok()?;
    s.write_all(&vec![b'x'; sent]).await.ok()?;
    Some(s)
}

/// `n` stalled POSTs to echo: half send 1 byte (they never reach the
/// Worker), half 80 KiB (they are handed over and hold a slot).
async fn stalled_mix(to: SocketAddr, n: usize) -> Vec<TcpStream> {
    let mut sockets = Vec::new();
    for i in 0..n {
        let sent = if i % 2 == 0 { 1 } else { 80 * 1024 };
        sockets.push(stalled_post(to, "echo", sent).await.expect("connect"));
    }
    sockets
}

/// Reads what `s` gets until it closes (at most `within`): the status of
/// the answer, if any, and whether it closed.
async fn outcome(mut s: TcpStream, within: Duration) -> (Option<u16>, bool) {
    let mut buf = Vec::new();
    let closed = matches!(
        tokio::time::timeout(within, s.read_to_end(&mut buf)).await,
        Ok(Ok(_)) | Ok(Err(_))
    );
    let text = String::from_utf8_lossy(&buf);
    (
        text.split_whitespace().nth(1).and_then(|c| c.parse().ok()),
        closed,
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixteen_idle_posts_do_not_freeze_a_worker() {
    let dir = tempfile::tempdir().expect("tempdir");
    let node = start(
        dir.path(),
        &["echo"],
        "[limits]\nbody_idle_timeout = \"2s\"\nslot_wait = \"500ms\"\n",
    );
    // The reported attack: a head and one byte, then nothing, 16 times.
    let mut idle = Vec::new();
    for _ in 0..16 {
        idle.push(stalled_post(node.http(), "echo", 1).await.expect("connect"));
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    // Those hold connections, not instances: the 17th is served at once.
    let t = Instant::now();
    let (status, resp) = exchange(node.http(), None, &get("echo"))
        .await
        .expect("answer");
    assert_eq!(status, 200, "{resp}");
    assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
    // And each stalled client is answered 408 and closed after the idle
    // timeout, not kept open.
    for s in idle {
        let (status, closed) = outcome(s, Duration::from_secs(8)).await;
        assert_eq!(status, Some(408), "{}", node.log());
        assert!(closed);
    }
    assert_eq!(stats(&node).await.client_timeouts, 16);

    // Clients that send enough to be handed to the Worker and then stall
    // do hold its 16 slots; a 17th waits at most the slot wait and gets
    // 503 with retry-after, and the slots come back after the idle timeout.
    let mut held = Vec::new();
    for _ in 0..16 {
        held.push(
            stalled_post(node.http(), "echo", 80 * 1024)
                .await
                .expect("connect"),
        );
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(stats(&node).await.in_flight, 16);
    let t = Instant::now();
    let (status, resp) = exchange(node.http(), None, &get("echo"))
        .await
        .expect("answer");
    assert_eq!(status, 503, "{resp}");
    assert!(
        resp.to_ascii_lowercase().contains("retry-after: 1"),
        "{resp}"
    );
    assert!(t.elapsed() < Duration::from_secs(3), "{:?}", t.elapsed());
    for s in held {
        let (_, closed) = outcome(s, Duration::from_secs(8)).await;
        assert!(closed, "a stalled body kept its connection");
    }
    assert_eq!(stats(&node).await.in_flight, 0);
    let (status, resp) = exchange(node.http(), None, &get("echo"))
        .await
        .expect("answer");
    assert_eq!(status, 200, "{resp}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_hundred_fifty_six_stalled_sockets_do_not_starve_other_workers() {
    let dir = tempfile::tempdir().expect("tempdir");
    let node = start(
        dir.path(),
        &["echo", "hello"],
        "[limits]\nbody_idle_timeout = \"30s\"\nslot_wait = \"300ms\"\nmax_in_flight = 24\nmax_connections_per_peer = 1024\n",
    );
    // Half trickle, half hand their request over and then stall: echo's
    // slots are all held, and the rest wait for them.
    let sockets = stalled_mix(node.http(), 256).await;
    tokio::time::sleep(Duration::from_millis(800)).await;
    // A Worker holds at most its own 16 of the node's 24 slots, so another
    // Worker is still served, promptly.
    for _ in 0..5 {
        let t = Instant::now();
        let (status, resp) = exchange(node.http(), None, &get("hello"))
            .await
            .expect("answer");
        assert_eq!(status, 200, "{resp}");
        assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
    }
    assert!(stats(&node).await.in_flight <= 16);
    assert!(
        stats(&node).await.busy > 0,
        "excess requests for echo get 503"
    );
    drop(sockets);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_address_cannot_take_every_connection() {
    let dir = tempfile::tempdir().expect("tempdir");
    let node = start(
        dir.path(),
        &["echo", "hello"],
        "[limits]\nmax_connections_per_peer = 32\n",
    );
    let mut sockets = Vec::new();
    for _ in 0..32 {
        sockets.push(stalled_post(node.http(), "echo", 1).await.expect("connect"));
    }
    // The 33rd from the same address is refused with a 503 at once, as soon
    // as the node has accepted the 32 (on a loaded machine that can take a
    // moment: until then a 33rd is simply served) ...
    let deadline = Instant::now() + Duration::from_secs(10);
    let (status, resp) = loop {
        let (status, resp) = exchange(node.http(), Some([127, 0, 0, 1]), &get("hello"))
            .await
            .expect("answer");
        if status == 503 || Instant::now() > deadline {
            break (status, resp);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(status, 503, "{resp}");
    assert!(resp.to_ascii_lowercase().contains("retry-after"), "{resp}");
    // ... while another client is served.
    let (status, resp) = exchange(node.http(), Some([127, 0, 0, 2]), &get("hello"))
        .await
        .expect("answer");
    assert_eq!(status, 200, "{resp}");
    drop(sockets);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_goes_away_cancels_its_worker() {
    let dir = tempfile::tempdir().expect("tempdir");
    let node = start(dir.path(), &["cpu-hog"], "");
    // The reported case: 8 requests to a Worker that loops, each client
    // giving up after 0.3 s. Each would burn 30 s of CPU.
    for _ in 0..8 {
        let mut s = connect(node.http(), None).await.expect("connect");
        s.write_all(&get("cpu-hog")).await.expect("write");
        let mut buf = [0u8; 64];
        let r = tokio::time::timeout(Duration::from_millis(300), s.read(&mut buf)).await;
        assert!(r.is_err(), "cpu-hog answered");
        drop(s);
    }
    // Each invocation is cancelled within an epoch tick or so of its client
    // leaving, and nothing keeps running.
    let deadline = Instant::now() + Duration::from_secs(5);
    while stats(&node).await.in_flight > 0 {
        assert!(Instant::now() < deadline, "invocations kept running");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(stats(&node).await.cancelled, 8, "{}", node.log());
    assert_eq!(stats(&node).await.cpu_kills, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_has_a_wall_clock_deadline() {
    let dir = tempfile::tempdir().expect("tempdir");
    let node = start(
        dir.path(),
        &["echo"],
        "[limits]\nbody_idle_timeout = \"60s\"\n\n[plans.free]\nrequest_wall = \"1s\"\n",
    );
    // A body that stops after being handed over: the idle timeout is long,
    // so it is the 1 s wall-clock deadline that frees the instance.
    let s = stalled_post(node.http(), "echo", 80 * 1024)
        .await
        .expect("connect");
    let t = Instant::now();
    let (_, closed) = outcome(s, Duration::from_secs(10)).await;
    assert!(closed);
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
    assert_eq!(stats(&node).await.wall_kills, 1, "{}", node.log());
    assert_eq!(stats(&node).await.in_flight, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ctrl_c_drains_even_with_stalled_clients_connected() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut node = start(
        dir.path(),
        &["echo"],
        "[limits]\nbody_idle_timeout = \"10m\"\ndrain_timeout = \"1s\"\n",
    );
    let sockets = stalled_mix(node.http(), 16).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    node.signal(Signal::Int).expect("SIGINT");
    let status = node
        .wait_exit_async(Duration::from_secs(10))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(status.success(), "exit {status}: {}", node.log());
    drop(sockets);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_drains_finishing_in_flight_requests_and_readyz_says_so() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut node = start(dir.path(), &["echo"], "[limits]\ndrain_timeout = \"20s\"\n");
    let status = |r: std::io::Result<TestResponse>| r.ok().map(|r| r.status);
    assert_eq!(
        status(node.admin_get_async("/readyz").await),
        Some(200),
        "a standalone node whose store answers is ready: {}",
        node.log()
    );
    assert_eq!(status(node.admin_get_async("/livez").await), Some(200));
    // A request in flight: its head and half its body sent.
    let mut s = connect(node.http(), None).await.expect("connect");
    s.write_all(b"POST / HTTP/1.1\r\nhost: echo.localhost\r\ncontent-length: 10\r\n\r\nhello")
        .await
        .expect("write");
    tokio::time::sleep(Duration::from_millis(300)).await;
    node.signal(Signal::Term).expect("SIGTERM");
    // Not ready while it drains; the admin API answers until the end.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match node.admin_get_async("/readyz").await {
            Ok(r) if r.status == 503 => {
                assert!(r.text().contains("not ready: draining"), "{}", r.text());
                break;
            }
            other => assert!(
                Instant::now() < deadline,
                "readyz never said draining: {other:?}: {}",
                node.log()
            ),
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        node.try_exit().expect("wait").is_none(),
        "exited with a request in flight: {}",
        node.log()
    );
    // The rest of the body: the request finishes, echoed whole.
    s.write_all(b"world").await.expect("write");
    let mut resp = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut resp)).await;
    let resp = String::from_utf8_lossy(&resp);
    assert!(resp.starts_with("HTTP/1.1 200"), "{resp}");
    assert!(resp.contains("hello") && resp.contains("world"), "{resp}");
    let status = node
        .wait_exit_async(Duration::from_secs(10))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(status.success(), "exit {status}: {}", node.log());
    assert!(node.log().contains("SIGTERM: draining"), "{}", node.log());
}

/// Starts `hearth serve` over `store` (with `extra` arguments) and expects
/// it to refuse: its stderr.
fn refused_start(store: &Path, extra: &[&str]) -> String {
    let mut args = vec![
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--admin",
        "127.0.0.1:0",
        "--store",
        store.to_str().expect("a UTF-8 temporary path"),
    ];
    args.extend_from_slice(extra);
    let out = hearth().run(args, "").expect("run hearth serve");
    assert!(!out.success());
    out.stderr
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn https_from_the_config_file_serves_with_the_stores_dev_certificate() {
    let dir = tempfile::tempdir().expect("tempdir");
    let https = free_port();
    let node = start(
        dir.path(),
        &["hello"],
        &format!("tls_listen = \"127.0.0.1:{https}\"\n"),
    );
    let ca = dir.path().join("store/tls/dev-ca.pem");
    let client = hearth::testing::HttpsClient::trusting(&ca).expect("the store's dev CA");
    let addr: SocketAddr = ([127, 0, 0, 1], https).into();
    assert!(
        hearth::testing::listening(addr, Duration::from_secs(10)),
        "no HTTPS listener: {}",
        node.log()
    );
    for http2 in [true, false] {
        let (_, r) = client
            .get(addr, "hello.localhost", "/", http2)
            .await
            .unwrap_or_else(|e| panic!("HTTPS request: {e:#}\n{}", node.log()));
        assert_eq!(r.status, 200, "{}", r.text());
        assert_eq!(r.text(), "hello from hello");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_answer_names_its_node_and_announces_the_idle_close() {
    let dir = tempfile::tempdir().expect("tempdir");
    let node = start(dir.path(), &["hello"], "node_id = \"edge-7\"\n");
    // An unknown Worker is a 404 from the runtime, logged as a warning.
    for (host, status) in [
        ("hello.localhost", 200),
        ("localhost", 404),
        ("nosuch.localhost", 404),
    ] {
        let head = format!("GET / HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n");
        let (code, text) = exchange(node.http(), None, head.as_bytes())
            .await
            .expect("an answer");
        assert_eq!(code, status, "{text}");
        let lower = text.to_ascii_lowercase();
        assert!(lower.contains("\r\nx-hearth-node: edge-7\r\n"), "{text}");
        assert!(lower.contains("\r\nkeep-alive: timeout=10\r\n"), "{text}");
    }
    // Its log went to a file, not a terminal: no colour codes in it.
    let log = node.log();
    assert!(log.contains("WARN"), "{log}");
    assert!(
        !log.contains('\u{1b}'),
        "ANSI escapes in a log file: {log:?}"
    );
}

#[test]
fn json_logs_are_one_object_per_line() {
    let dir = tempfile::tempdir().expect("tempdir");
    let hello = hearth_sample_workers::path("hello").expect("sample built");
    let store = dir.path().join("store");
    let (store, hello) = (store.to_str().expect("utf8"), hello.to_str().expect("utf8"));
    let out = hearth()
        .run(
            [
                "--log-format",
                "json",
                "deploy",
                "--name",
                "hello",
                "--store",
                store,
                hello,
            ],
            "",
        )
        .expect("run hearth deploy");
    assert!(out.success(), "{}", out.stderr);
    let stderr = out.stderr;
    let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    assert!(!lines.is_empty(), "the deploy logs something");
    for line in lines {
        let v: serde_json::Value =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"));
        assert!(v["level"].is_string() && v["fields"].is_object(), "{line}");
    }
}

#[test]
fn a_bad_https_certificate_stops_the_node_with_a_clear_message() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = dir.path().join("store");
    let missing = dir.path().join("no-such-cert.pem");
    let err = refused_start(
        &store,
        &["--tls-listen", "127.0.0.1:0", "--tls-cert", "cert.pem"],
    );
    assert!(
        err.contains("--tls-key"),
        "a certificate needs its key: {err}"
    );
    let with_cert = |path: &Path| {
        let path = path.to_str().expect("a UTF-8 temporary path");
        refused_start(
            &store,
            &[
                "--tls-listen",
                "127.0.0.1:0",
                "--tls-cert",
                path,
                "--tls-key",
                path,
            ],
        )
    };
    let err = with_cert(&missing);
    assert!(
        err.contains("HTTPS certificate") && err.contains("no-such-cert.pem"),
        "{err}"
    );
    let junk = dir.path().join("junk.pem");
    std::fs::write(&junk, "-----BEGIN NOTHING-----\n").expect("write");
    let err = with_cert(&junk);
    assert!(
        err.contains("junk.pem") && err.contains("certificate"),
        "{err}"
    );
}

#[test]
fn an_unreadable_secret_file_stops_the_node_with_its_name() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = dir.path().join("store");
    // A directory where the artifact key should be: not "missing".
    std::fs::create_dir_all(store.join("artifact.key")).expect("mkdir");
    let err = refused_start(&store, &[]);
    assert!(err.contains("artifact.key"), "{err}");
    // Nothing was left behind by retries.
    let tmp = std::fs::read_dir(&store)
        .expect("store")
        .filter(|e| {
            e.as_ref()
                .is_ok_and(|e| e.file_name().to_string_lossy().starts_with(".tmp"))
        })
        .count();
    assert_eq!(tmp, 0);
    // A secret that is not UTF-8 is an error naming it, too.
    std::fs::remove_dir(store.join("artifact.key")).expect("rmdir");
    std::fs::write(store.join("artifact.key"), [0xff, 0xfe, 0x00]).expect("write");
    let err = refused_start(&store, &[]);
    assert!(err.contains("artifact.key"), "{err}");
}

/// Gossip without a shared key would leave every node alone, silently: the
/// node refuses to start and offers a key; a wrong-length key is named too.
#[test]
fn gossip_without_a_shared_key_stops_the_node_with_a_fresh_key_offered() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = dir.path().join("store");
    let pki = dir.path().join("pki");
    let config = dir.path().join("node.toml");
    let section = format!(
        "node_id = \"node-1\"\n[cluster]\nrpc = \"127.0.0.1:0\"\npki = \"{}\"\ngossip = \"127.0.0.1:0\"\n",
        pki.display()
    );
    std::fs::write(&config, &section).expect("write config");
    let path = config.to_str().expect("utf8");
    let err = refused_start(&store, &["--config", path]);
    assert!(err.contains("gossip_key"), "{err}");
    let offered = err
        .split("gossip_key = \"")
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .expect("a key is offered");
    assert_eq!(offered.len(), 64, "{err}");
    assert!(offered.chars().all(|c| c.is_ascii_hexdigit()), "{err}");

    std::fs::write(&config, format!("{section}gossip_key = \"abc\"\n")).expect("write config");
    let err = refused_start(&store, &["--config", path]);
    assert!(err.contains("64 hex digits"), "{err}");
}

/// The example configs in docs/operator are not a working secret: a node
/// started with one refuses, says why and offers a fresh value; so does a
/// node given an admin token too short to resist guessing. (Every other
/// test here starts a node with a config of its own secrets.)
#[test]
fn the_docs_example_secrets_and_a_short_admin_token_stop_the_node() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = dir.path().join("store");
    let example = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/operator/node-1.toml");
    let err = refused_start(&store, &["--config", example]);
    assert!(
        err.contains("artifact_key is an example value from hearth's documentation"),
        "{err}"
    );
    let offered = err
        .split("artifact_key = \"")
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .expect("a key is offered");
    assert_eq!(offered.len(), 64, "{err}");
    assert!(offered.chars().all(|c| c.is_ascii_hexdigit()), "{err}");
    assert!(!store.exists(), "refused before the store was touched");

    let config = dir.path().join("node.toml");
    std::fs::write(&config, "admin_token = \"0123456789\"\n").expect("write config");
    let err = refused_start(&store, &["--config", config.to_str().expect("utf8")]);
    assert!(
        err.contains("admin_token is 10 bytes long; it must be at least 32 bytes"),
        "{err}"
    );
    assert!(
        err.contains("admin_token = \""),
        "a token is offered: {err}"
    );
}

/// A config written for the last release still starts a node, and the log
/// names each deprecated key and what to write instead.
#[test]
fn a_config_with_last_releases_keys_starts_and_says_what_to_write() {
    let dir = tempfile::tempdir().expect("tempdir");
    let node = start(
        dir.path(),
        &[],
        "idle_timeout_s = 300\n[limits]\nslot_wait_ms = 500\n",
    );
    let log = node.log();
    assert!(
        log.contains("idle_timeout_s is deprecated") && log.contains("idle_timeout = \"5m\""),
        "{log}"
    );
    assert!(
        log.contains("[limits] slot_wait_ms is deprecated")
            && log.contains("slot_wait = \"500ms\""),
        "{log}"
    );
}

/// Stored metadata names the files a node opens (the source's blob, its
/// artifact), and a store directory or bucket can be written by others
/// than the node. A forged `hash` is refused on read, counted, and never
/// joined into a path: here `../../x` would lead the artifact lookup out
/// of the cache to a file it would fail to authenticate and delete.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forged_hash_in_stored_metadata_is_refused_and_touches_no_file() {
    use hearth::cluster::ClusterConfig;
    use hearth::testing::TestCluster;
    let dir = tempfile::tempdir().expect("tempdir");
    let store = dir.path().join("store");
    let c = TestCluster::with_config(ClusterConfig::new(1, &store), None)
        .await
        .expect("cluster");
    let hello = hearth_sample_workers::bytes("hello").expect("sample built");
    c.deploy("hello", hearth::runtime::Plan::Free, hello)
        .await
        .expect("deploy");
    // Where `<artifacts>/<hash>-<engine>.cwasm` leads for hash `../../x`:
    // beside the store, outside the cache.
    let artifacts = c.node(0).node.runtime().artifacts();
    let bait = dir.path().join(artifacts.file_name("x"));
    assert_eq!(artifacts.dir(), store.join("artifacts"));
    std::fs::write(&bait, b"a file outside the cache").expect("bait");
    // Forged metadata: hello's, under another name, with the hash replaced.
    let scripts = store.join("scripts");
    let json = std::fs::read(scripts.join("hello.json")).expect("hello's metadata");
    let mut meta: serde_json::Value = serde_json::from_slice(&json).expect("json");
    meta["script_id"] = "evil".into();
    meta["hash"] = "../../x".into();
    std::fs::write(
        scripts.join("evil.json"),
        serde_json::to_vec(&meta).expect("json"),
    )
    .expect("write forged metadata");

    for _ in 0..3 {
        let r = c.get(0, "evil", "/").await.expect("an answer");
        assert_eq!(r.status, 500, "{}", r.text());
        assert!(r.text().contains("could not be loaded"), "{}", r.text());
    }
    assert_eq!(
        std::fs::read(&bait).ok().as_deref(),
        Some(&b"a file outside the cache"[..]),
        "the file the forged hash pointed at was touched"
    );
    assert_eq!(c.stats(0).runtime.store_metadata_rejected, 3);
    let metrics = c.node(0).node.metrics().render();
    assert!(
        metrics.contains("hearth_store_metadata_rejected_total 3"),
        "{metrics}"
    );
    // The node serves its other Workers as before.
    let r = c.get(0, "hello", "/").await.expect("hello");
    assert_eq!((r.status, r.text().as_str()), (200, "hello from hello"));
}

/// Every connection is a file descriptor: a node started under a low soft
/// limit (a login shell's 1024) raises it to the hard limit and says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_node_raises_its_open_files_limit_and_logs_it() {
    let limits = |pid: u32| -> (String, String) {
        let text = std::fs::read_to_string(format!("/proc/{pid}/limits")).expect("limits");
        let line = text
            .lines()
            .find(|l| l.starts_with("Max open files"))
            .expect("a Max open files line")
            .to_string();
        let mut f = line.split_whitespace().skip(3);
        (
            f.next().expect("soft").to_string(),
            f.next().expect("hard").to_string(),
        )
    };
    let (_, hard) = limits(std::process::id());
    let dir = tempfile::tempdir().expect("tempdir");
    deploy(dir.path(), &["hello"]);
    let node = ServeCommand::standalone(&hearth(), dir.path(), TOKEN, "")
        .expect("config")
        .soft_nofile(512)
        .spawn()
        .expect("the node starts");
    node.wait_listening(hearth::testing::START_TIMEOUT)
        .unwrap_or_else(|e| panic!("{e}"));
    let (soft, hard_now) = limits(node.pid());
    assert_eq!(
        (soft.as_str(), hard_now.as_str()),
        (hard.as_str(), hard.as_str())
    );
    let log = node.log();
    assert!(
        log.contains(&format!("open files limit: {hard}")),
        "no log line with the limit: {log}"
    );
}
