//! The HTTPS front door's HTTP/2 limits, against a real node with a raw h2
//! client: the idle close, the preface (head) deadline, the write timeout
//! applied to a client that grants no flow-control window, and the bound
//! on request bytes buffered before a slot, the receive windows a client
//! may fill unread included. Limits are set short
//! (`ServeLimits`), so nothing waits for the defaults.

use std::time::{Duration, Instant};

use bytes::Bytes;
use hearth::cluster::ClusterConfig;
use hearth::listener::ServeLimits;
use hearth::runtime::Plan;
use hearth::testing::{HttpsClient, TestCluster};
use tokio::io::AsyncReadExt;

type Tls = tokio_rustls::client::TlsStream<tokio::net::TcpStream>;

/// One node with `limits`, serving `hello`.
async fn node(limits: ServeLimits) -> (TestCluster, tempfile::TempDir) {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut cfg = ClusterConfig::new(1, dir.path());
    cfg.serve_limits = limits;
    let c = TestCluster::with_config(cfg, None).await.expect("cluster");
    let hello = hearth_sample_workers::bytes("hello").expect("sample built");
    c.deploy("hello", Plan::Free, hello).await.expect("deploy");
    (c, dir)
}

/// A TLS connection to node 0 that chose `h2`.
async fn tls(c: &TestCluster) -> Tls {
    let client = HttpsClient::trusting(c.tls_ca().expect("https on")).expect("client");
    let addr = c.node(0).https_addr.expect("https on");
    let tls = client
        .connect(addr, "hello.localhost", true)
        .await
        .expect("TLS");
    assert_eq!(tls.get_ref().1.alpn_protocol(), Some(&b"h2"[..]));
    tls
}

/// An h2 client on a fresh connection; the connection runs in the
/// returned task, which ends when the node closes it.
async fn h2_client(
    c: &TestCluster,
    builder: h2::client::Builder,
) -> (
    h2::client::SendRequest<Bytes>,
    tokio::task::JoinHandle<Result<(), h2::Error>>,
) {
    let (send, conn) = builder.handshake(tls(c).await).await.expect("h2 handshake");
    (send, tokio::spawn(conn))
}

fn request(method: &str) -> http::Request<()> {
    http::Request::builder()
        .method(method)
        .uri("https://hello.localhost/")
        .body(())
        .expect("request")
}

/// How long `conn` took to be closed by the node, if within `limit`.
async fn closed_within(
    conn: tokio::task::JoinHandle<Result<(), h2::Error>>,
    limit: Duration,
) -> Option<Duration> {
    let t = Instant::now();
    tokio::time::timeout(limit, conn)
        .await
        .ok()
        .map(|_| t.elapsed())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_h2_connection_is_closed_after_the_idle_timeout() {
    let limits = ServeLimits {
        header_read_timeout: Duration::from_millis(500),
        ..ServeLimits::default()
    };
    let (c, _dir) = node(limits).await;
    let (send, conn) = h2_client(&c, h2::client::Builder::new()).await;
    let mut send = send.ready().await.expect("ready");
    let (resp, _) = send.send_request(request("GET"), true).expect("send");
    let resp = resp.await.expect("response");
    assert_eq!(resp.status(), 200);
    let mut body = resp.into_body();
    while let Some(d) = body.data().await {
        d.expect("body");
    }
    // Now idle: no stream open. The node's PINGs are answered by the
    // client, which does not count as use.
    let took = closed_within(conn, Duration::from_secs(5)).await;
    let took = took.expect("an idle h2 connection was held past 5 s (idle timeout 0.5 s)");
    assert!(
        took >= Duration::from_millis(400),
        "closed too early: {took:?}"
    );
    // Other clients are served as before.
    let r = c.get(0, "hello", "/").await.expect("hello");
    assert_eq!(r.status, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_never_sends_the_preface_is_closed_after_the_head_timeout() {
    let limits = ServeLimits {
        header_read_timeout: Duration::from_millis(500),
        ..ServeLimits::default()
    };
    let (c, _dir) = node(limits).await;
    let mut tls = tls(&c).await;
    // TCP and TLS, `h2` chosen, and then nothing: read (the node's
    // SETTINGS) until the node closes.
    let t = Instant::now();
    let mut sink = [0u8; 1024];
    let closed = tokio::time::timeout(Duration::from_secs(5), async {
        while tls.read(&mut sink).await.is_ok_and(|n| n > 0) {}
    })
    .await;
    assert!(
        closed.is_ok(),
        "a connection without a preface was held past 5 s (head timeout 0.5 s)"
    );
    assert!(
        t.elapsed() >= Duration::from_millis(400),
        "{:?}",
        t.elapsed()
    );
    let r = c.get(0, "hello", "/").await.expect("hello");
    assert_eq!(r.status, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_grants_no_window_is_cut_within_the_write_timeout() {
    // A long idle timeout, so only the write timeout can close it.
    let limits = ServeLimits {
        header_read_timeout: Duration::from_secs(60),
        write_timeout: Duration::from_secs(1),
        ..ServeLimits::default()
    };
    let (c, _dir) = node(limits).await;
    let (send, conn) = h2_client(&c, {
        let mut b = h2::client::Builder::new();
        b.initial_window_size(0);
        b
    })
    .await;
    let mut send = send.ready().await.expect("ready");
    let (resp, _) = send.send_request(request("GET"), true).expect("send");
    let resp = resp.await.expect("the head needs no window");
    assert_eq!(resp.status(), 200);
    // The body cannot be sent: the client never grants window.
    let took = closed_within(conn, Duration::from_secs(10)).await;
    let took = took.expect("a zero-window client held its stream past 10 s (write timeout 1 s)");
    assert!(
        took >= Duration::from_millis(900),
        "closed too early: {took:?}"
    );
    let r = c.get(0, "hello", "/").await.expect("hello");
    assert_eq!(r.status, 200);
}

/// Opens `n` POST streams on `send`, each sending one 16 KiB frame of its
/// body and then nothing; the response futures, in order.
async fn stalled_posts(
    send: &mut h2::client::SendRequest<Bytes>,
    n: usize,
) -> Vec<(h2::client::ResponseFuture, h2::SendStream<Bytes>)> {
    let mut out = Vec::new();
    for _ in 0..n {
        let mut ready = send.clone().ready().await.expect("ready");
        let (resp, mut body) = ready.send_request(request("POST"), false).expect("send");
        body.send_data(Bytes::from(vec![b'x'; 16 * 1024]), false)
            .expect("data");
        out.push((resp, body));
    }
    out
}

/// Of `posts`, the bodies of those answered within `wait` with a 503.
async fn refused(
    posts: &mut Vec<(h2::client::ResponseFuture, h2::SendStream<Bytes>)>,
    wait: Duration,
) -> Vec<String> {
    let mut refused = Vec::new();
    let mut pending = Vec::new();
    let deadline = tokio::time::Instant::now() + wait;
    for (mut resp, body) in posts.drain(..) {
        match tokio::time::timeout_at(deadline, &mut resp).await {
            Ok(Ok(r)) => {
                assert_eq!(r.status(), 503, "only refusals are answered early");
                assert_eq!(r.headers()["retry-after"], "1");
                let mut b = r.into_body();
                let mut text = Vec::new();
                while let Some(d) = b.data().await {
                    text.extend_from_slice(&d.expect("body"));
                }
                refused.push(String::from_utf8_lossy(&text).into_owned());
            }
            Ok(Err(e)) => panic!("stream failed: {e}"),
            Err(_) => pending.push((resp, body)),
        }
    }
    *posts = pending;
    refused
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pre_slot_bytes_over_the_connection_and_listener_caps_get_503_and_others_are_served() {
    // Each connection holds its 64 KiB window of both budgets: 12 frames
    // of 16 KiB fit beside it on a connection, 24 on the listener, less
    // the windows of the connections open.
    let limits = ServeLimits {
        max_pre_slot_bytes_per_connection: 256 * 1024,
        max_pre_slot_bytes: 448 * 1024,
        h2_window: 64 * 1024,
        ..ServeLimits::default()
    };
    let (c, _dir) = node(limits).await;
    let (mut a, _conn_a) = h2_client(&c, h2::client::Builder::new()).await;
    let mut posts_a = stalled_posts(&mut a, 24).await;
    let wait = Duration::from_secs(3);
    let refused_a = refused(&mut posts_a, wait).await;
    assert_eq!(
        refused_a.len(),
        12,
        "the connection holds its window and 12 × 16 KiB: {refused_a:?}"
    );
    assert!(refused_a[0].contains("this connection"), "{}", refused_a[0]);
    assert_eq!(
        posts_a.len(),
        12,
        "the 12 within the cap wait for the rest of their bodies"
    );

    // A second connection: the listener has room for its window and 4 more
    // (448 - 64 - 192 - 64 = 128 KiB, of which a third connection's window
    // is kept: it is opened first).
    let (mut b, _conn_b) = h2_client(&c, h2::client::Builder::new()).await;
    let (cl, _conn_c) = h2_client(&c, h2::client::Builder::new()).await;
    // Served, so its window is held before b's bodies arrive.
    let mut ready = cl.clone().ready().await.expect("ready");
    let (resp, _) = ready.send_request(request("GET"), true).expect("send");
    assert_eq!(resp.await.expect("response").status(), 200);
    let mut posts_b = stalled_posts(&mut b, 24).await;
    let refused_b = refused(&mut posts_b, wait).await;
    assert_eq!(refused_b.len(), 20, "{refused_b:?}");
    assert!(refused_b[0].contains("this node"), "{}", refused_b[0]);

    // A request that buffers nothing is served on the third connection, on
    // the crowded connection itself, and on the plain listener.
    for send in [cl, a] {
        let mut send = send.clone().ready().await.expect("ready");
        let (resp, _) = send.send_request(request("GET"), true).expect("send");
        let resp = tokio::time::timeout(wait, resp)
            .await
            .expect("answered")
            .expect("response");
        assert_eq!(resp.status(), 200);
    }
    let r = c.get(0, "hello", "/").await.expect("hello");
    assert_eq!(r.status, 200);
    assert_eq!(c.stats(0).runtime.pre_slot_refused, 32);
    let metrics = c.node(0).node.metrics().render();
    assert!(
        metrics.contains("hearth_pre_slot_refused_total 32"),
        "{metrics}"
    );
}

/// The send window `send`'s node grants one request body: what a client
/// may send on it before the node reads a byte.
async fn granted_window(send: &h2::client::SendRequest<Bytes>) -> usize {
    let mut ready = send.clone().ready().await.expect("ready");
    // A round trip first, so the node's SETTINGS and window updates are in.
    let (resp, _) = ready.send_request(request("GET"), true).expect("send");
    assert_eq!(resp.await.expect("response").status(), 200);
    let mut ready = send.clone().ready().await.expect("ready");
    let (_resp, mut body) = ready.send_request(request("POST"), false).expect("send");
    body.reserve_capacity(4 << 20);
    let granted = std::future::poll_fn(|cx| body.poll_capacity(cx));
    tokio::time::timeout(Duration::from_secs(5), granted)
        .await
        .expect("some window within 5 s")
        .expect("a window")
        .expect("no error")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn h2_receive_windows_are_held_of_the_node_budget_and_a_connection_past_it_is_refused() {
    // Room for the windows of three connections (the default window, the
    // protocol's 65,535 bytes) and a little more, not a fourth.
    let limits = ServeLimits {
        max_pre_slot_bytes: 3 * 65_535 + 1000,
        ..ServeLimits::default()
    };
    let (c, _dir) = node(limits).await;
    let mut open = Vec::new();
    for _ in 0..3 {
        let (send, conn) = h2_client(&c, h2::client::Builder::new()).await;
        let window = granted_window(&send).await;
        // hyper's defaults granted 1 MiB to each (and up to 128 streams
        // of 1 MiB), none of it counted.
        assert!(window <= 65_535, "a client may send {window} bytes unread");
        open.push((send, conn));
    }

    // A fourth h2 connection: no room for its window on the node.
    let (send, conn) = h2_client(&c, h2::client::Builder::new()).await;
    let answered = async move {
        let mut ready = send.ready().await?;
        let (resp, _) = ready.send_request(request("GET"), true)?;
        resp.await
    };
    let r = tokio::time::timeout(Duration::from_secs(5), answered)
        .await
        .expect("refused within 5 s, not left hanging");
    assert!(r.is_err(), "served past the node's budget: {r:?}");
    assert!(
        closed_within(conn, Duration::from_secs(5)).await.is_some(),
        "the refused connection is closed"
    );

    // HTTP/1.1 is served meanwhile, and a closed connection gives its
    // window back.
    assert_eq!(c.get(0, "hello", "/").await.expect("hello").status, 200);
    let (send, conn) = open.pop().expect("three open");
    drop(send);
    conn.abort();
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let (send, _conn) = h2_client(&c, h2::client::Builder::new()).await;
        let mut ready = send.ready().await.expect("ready");
        let (resp, _) = ready.send_request(request("GET"), true).expect("send");
        match tokio::time::timeout(Duration::from_secs(2), resp).await {
            Ok(Ok(r)) => {
                assert_eq!(r.status(), 200);
                break;
            }
            _ if Instant::now() < deadline => tokio::time::sleep(Duration::from_millis(50)).await,
            other => panic!("the window was not given back: {other:?}"),
        }
    }
}
