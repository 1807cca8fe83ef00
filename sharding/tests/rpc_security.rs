//! Who may call a node's RPC port, and what a bad peer can do to it.

// Test helpers: a panic is the failure report (clippy's allow-unwrap-in-tests
// covers #[test] functions only).
#![allow(clippy::unwrap_used)]

mod rpc_support;

use std::sync::Arc;
use std::time::Duration;

use capnp_rpc::RpcSystem;
use capnp_rpc::rpc_twoparty_capnp::Side;
use capnp_rpc::twoparty::VatNetwork;
use hearth_sharding::context_stack::ContextStack;
use hearth_sharding::rpc::ForwardOutcome;
use hearth_sharding::schema::hearth_capnp::{shard_server, worker};
use hearth_sharding::tls::{NODE_NAME_SUFFIX, node_server_name};
use hearth_sharding::transport;
use rpc_support::*;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_util::compat::{TokioAsyncReadCompatExt, TokioAsyncWriteCompatExt};

/// A Worker capability that does nothing, to pass as `lazy`.
struct Dummy;
impl worker::Server for Dummy {}

/// Bootstraps the peer's `ShardServer` over `stream` and calls `dispatch`:
/// Ok only if the peer handed out a working capability.
async fn try_dispatch<S>(stream: S) -> Result<(), capnp::Error>
where
    S: AsyncRead + AsyncWrite + Unpin + 'static,
{
    let local = tokio::task::LocalSet::new();
    local
        .run_until(async move {
            let shard = bootstrap(stream);
            let mut request = shard.dispatch_request();
            request.get().set_script_id("echo");
            request.get().set_lazy(capnp_rpc::new_client(Dummy));
            let answer = request.send().promise.await?;
            answer.get()?.get_worker()?;
            Ok(())
        })
        .await
}

/// The peer's `ShardServer` over `stream`, with its RPC system driven on
/// the current `LocalSet`.
fn bootstrap<S>(stream: S) -> shard_server::Client
where
    S: AsyncRead + AsyncWrite + Unpin + 'static,
{
    let (read, write) = tokio::io::split(stream);
    let network = VatNetwork::new(
        read.compat(),
        write.compat_write(),
        Side::Client,
        capnp::message::ReaderOptions::new(),
    );
    let mut rpc = RpcSystem::new(Box::new(network), None);
    let shard = rpc.bootstrap(Side::Server);
    tokio::task::spawn_local(rpc);
    shard
}

/// Runs a misbehaving member written for a test on a thread of its own
/// (capnp-rpc is `!Send`): `act` gets the home's `ShardServer` over `tls`.
fn hand_written_member<S, F, Fut>(tls: S, act: F) -> std::thread::JoinHandle<()>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    F: FnOnce(shard_server::Client) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()> + 'static,
{
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let local = tokio::task::LocalSet::new();
        local.block_on(&rt, async move { act(bootstrap(tls)).await });
    })
}

fn client_config_with(
    ca_pem: &[u8],
    identity: Option<(Vec<u8>, Vec<u8>)>,
) -> Arc<rustls::ClientConfig> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(ca_pem) {
        roots.add(cert.unwrap()).unwrap();
    }
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])
        .unwrap()
        .with_root_certificates(roots);
    let config = match identity {
        None => builder.with_no_client_auth(),
        Some((cert, key)) => builder
            .with_client_auth_cert(
                vec![CertificateDer::from_pem_slice(&cert).unwrap()],
                PrivateKeyDer::from_pem_slice(&key).unwrap(),
            )
            .unwrap(),
    };
    Arc::new(config)
}

/// Tries to get a capability from `node` over TLS with `config`; true if it
/// got one.
async fn got_capability(node: &Node, config: Arc<rustls::ClientConfig>) -> bool {
    let tcp = TcpStream::connect(node.addr).await.unwrap();
    let tls = match tokio_rustls::TlsConnector::from(config)
        .connect(node_server_name(node.home.id.as_str()).unwrap(), tcp)
        .await
    {
        Ok(tls) => tls,
        // The server refused the handshake.
        Err(_) => return false,
    };
    // With TLS 1.3 the client may finish before the server has checked its
    // certificate; the server's verdict then arrives as the first read.
    guard("dispatch attempt", try_dispatch(tls)).await.is_ok()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_peers_with_a_cluster_certificate_get_a_capability() {
    let pki = Pki::new(&["a", "b", "c"]);
    let a = start_node(&pki, "a", |_| {}).await;
    let b = start_node(&pki, "b", |_| {}).await;
    let ca_pem = std::fs::read(pki.dir.path().join("ca.pem")).unwrap();

    // Control: a member's certificate gets a capability this way.
    assert!(got_capability(&b, pki.tls("c").client_config()).await);

    // Plain TCP, speaking Cap'n Proto directly: no capability.
    let plain = TcpStream::connect(b.addr).await.unwrap();
    assert!(guard("plain dispatch", try_dispatch(plain)).await.is_err());

    // TLS without a client certificate.
    assert!(!got_capability(&b, client_config_with(&ca_pem, None)).await);

    // TLS with a self-signed certificate for a member's name.
    let self_signed =
        rcgen::generate_simple_self_signed(vec![format!("c.{NODE_NAME_SUFFIX}")]).unwrap();
    let identity = (
        self_signed.cert.pem().into_bytes(),
        self_signed.signing_key.serialize_pem().into_bytes(),
    );
    assert!(!got_capability(&b, client_config_with(&ca_pem, Some(identity))).await);

    // A certificate from another cluster's CA.
    let other = Pki::new(&["intruder"]);
    assert!(!got_capability(&b, other.tls("intruder").client_config()).await);

    eventually("rejections are counted", || {
        b.rpc.stats().handshakes_rejected >= 4
    })
    .await;
    assert_echo_sharded(&a, &b, "a legitimate forward", b"members welcome", 5).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_refuses_a_home_without_a_cluster_certificate() {
    let pki = Pki::new(&["a"]);
    let other = Pki::new(&["impostor"]);
    let a = start_node(&pki, "a", |_| {}).await;
    // A "home" from another cluster: the client's handshake fails, so the
    // request is served locally rather than sent to a stranger.
    let impostor = start_node(&other, "impostor", |_| {}).await;
    let forwarded = forward(
        &a,
        &impostor.home,
        "echo",
        streaming_body(b"secret".to_vec(), 6),
    )
    .await;
    assert!(
        matches!(forwarded.outcome, ForwardOutcome::Unavailable(_)),
        "{:?}",
        forwarded.outcome
    );
    assert_eq!(served_by(&forwarded.response), "a");
    assert_eq!(
        impostor
            .workers
            .served
            .load(std::sync::atomic::Ordering::SeqCst),
        0
    );
}

/// A member holding a valid cluster certificate (for `c`) that listens
/// where the ring says `b` is cannot answer for `b`: the handshake fails on
/// the name, the request is served by the caller, the impostor runs nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_cannot_answer_for_another_node_id() {
    let pki = Pki::new(&["a", "b", "c"]);
    let a = start_node(&pki, "a", |_| {}).await;
    let c = start_node(&pki, "c", |_| {}).await;
    let b_as_the_ring_has_it = hearth_sharding::ring::Member::new("b", c.addr);
    let forwarded = forward(
        &a,
        &b_as_the_ring_has_it,
        "echo",
        streaming_body(b"for b only".to_vec(), 5),
    )
    .await;
    let ForwardOutcome::Unavailable(reason) = &forwarded.outcome else {
        panic!("{:?}", forwarded.outcome);
    };
    assert!(reason.contains("node b"), "{reason}");
    assert_eq!(served_by(&forwarded.response), "a");
    assert_eq!(
        c.workers.served.load(std::sync::atomic::Ordering::SeqCst),
        0
    );
    // Control: as itself, c is a home like any other.
    assert_echo_sharded(&a, &c, "c as c", b"for c", 5).await;
}

/// With the gossip key, a member could gossip `b`'s node ID with its own
/// RPC address and take `b`'s ring slot. A node that checks identities
/// keeps it off the ring (and counts the refusal); one that trusts gossip
/// (the old behaviour, kept as the control) hands it the slot.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gossip_member_claiming_another_node_id_never_enters_the_ring() {
    use hearth_sharding::membership::{Membership, MembershipConfig};
    use hearth_sharding::ring::{Member, NodeId};
    let pki = Pki::new(&["a", "c"]);
    let a = start_node(&pki, "a", |_| {}).await;
    let c = start_node(&pki, "c", |_| {}).await;
    let key = [7u8; 32];
    let any_port = "127.0.0.1:0".parse().unwrap();
    let start = |node: Member, seeds: Vec<std::net::SocketAddr>, check: bool| {
        let mut config = MembershipConfig::gossip(node, any_port, seeds);
        if let Some(g) = config.gossip.as_mut() {
            g.key = Some(key);
            if check {
                g.verify = Some(transport::identity_check(
                    pki.tls("a").client_config(),
                    Duration::from_secs(2),
                ));
            }
        }
        Membership::start(config)
    };
    let checking = start(a.home.clone(), Vec::new(), true).await.unwrap();
    let trusting = start(Member::new("t", a.addr), Vec::new(), false)
        .await
        .unwrap();
    let seeds: Vec<_> = [&checking, &trusting]
        .iter()
        .filter_map(|m| m.gossip_addr())
        .collect();
    // c gossips as itself, and (with c's certificate behind it) as b.
    let honest = start(c.home.clone(), seeds.clone(), false).await.unwrap();
    let impostor = start(Member::new("b", c.addr), seeds, false).await.unwrap();

    let b = NodeId::new("b");
    let c_id = NodeId::new("c");
    eventually("the trusting node hands b's slot to the impostor", || {
        trusting.ring().load().get(&b).map(|n| n.rpc_addr) == Some(c.addr)
    })
    .await;
    eventually("the checking node admits c, who proves its ID", || {
        checking.ring().load().contains(&c_id)
    })
    .await;
    eventually("the checking node refuses the impostor", || {
        checking.gossip_counters().identities_refused() >= 1
    })
    .await;
    assert!(!checking.ring().load().contains(&b));
    // It keeps gossiping and is checked again; it stays off the ring.
    let refused = checking.gossip_counters().identities_refused();
    eventually("the impostor is checked again", || {
        checking.gossip_counters().identities_refused() > refused
    })
    .await;
    assert!(!checking.ring().load().contains(&b));
    drop((honest, impostor));
}

/// Sends `bytes` over an authenticated connection and waits for the node to
/// close it.
async fn closed_after(node: &Node, member: &Pki, bytes: &[u8]) {
    let mut tls = transport::connect(
        &node.home,
        member.tls("c").client_config(),
        Duration::from_secs(5),
    )
    .await
    .unwrap();
    tls.write_all(bytes).await.unwrap();
    tls.flush().await.unwrap();
    let mut sink = Vec::new();
    // Whatever the node says (an Abort message), it must then hang up.
    let _ = guard("the node closes the connection", tls.read_to_end(&mut sink)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_and_oversized_messages_close_that_connection_only() {
    let pki = Pki::new(&["a", "b", "c"]);
    let a = start_node(&pki, "a", |_| {}).await;
    let b = start_node(&pki, "b", |_| {}).await;
    assert_echo_sharded(&a, &b, "a legitimate forward", b"members welcome", 5).await;

    // A segment table announcing a 1 GiB message: refused by the size limit
    // before anything is buffered.
    let mut huge = Vec::new();
    huge.extend_from_slice(&0u32.to_le_bytes()); // one segment
    huge.extend_from_slice(&(1u32 << 27).to_le_bytes()); // of 2^27 words
    closed_after(&b, &pki, &huge).await;

    // A well-framed message whose content is garbage.
    let mut garbage = Vec::new();
    garbage.extend_from_slice(&0u32.to_le_bytes());
    garbage.extend_from_slice(&4u32.to_le_bytes());
    garbage.extend_from_slice(&pattern(32));
    closed_after(&b, &pki, &garbage).await;

    // An absurd segment count.
    closed_after(&b, &pki, &[0xff, 0xff, 0xff, 0x7f, 0, 0, 0, 0]).await;

    // The node, and its connection with `a`, are unharmed.
    assert_echo_sharded(&a, &b, "a legitimate forward", b"members welcome", 5).await;
    eventually("no request is left in flight on the home", || {
        b.rpc.stats().home.in_flight == 0
    })
    .await;
}

/// Idle TCP sockets (no TLS bytes) cannot switch sharding off: one address
/// gets a small share of the pending handshakes, a flood from many
/// addresses pushes out the oldest pending ones, and a member's connection
/// that arrives during the flood still completes and is served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_idle_sockets_does_not_starve_a_members_connection() {
    use hearth_sharding::handshake_gate::{MAX_PENDING_HANDSHAKES, MAX_PENDING_PER_SOURCE};
    // Long enough that no idle socket times out during the test: the gate
    // alone must keep room for members.
    let (_pki, a, b) = two_nodes(as_is, |c| c.handshake_timeout = Duration::from_secs(30)).await;

    let mut idle = Vec::new();
    let open_from = |last: u8| async move {
        let socket = tokio::net::TcpSocket::new_v4().expect("socket");
        socket
            .bind(std::net::SocketAddr::from(([127, 0, 0, last], 0)))
            .expect("bind a loopback source");
        socket.connect(b.addr).await.expect("connect")
    };
    // 300 from one address ...
    for _ in 0..300 {
        idle.push(open_from(2).await);
    }
    // ... and 8 each from 40 more.
    let sources = 40;
    for last in 3..3 + sources {
        for _ in 0..MAX_PENDING_PER_SOURCE {
            idle.push(open_from(last).await);
        }
    }
    let over_share = 300 - MAX_PENDING_PER_SOURCE;
    let admitted = MAX_PENDING_PER_SOURCE * (1 + sources as usize);
    let shed = (over_share + admitted.saturating_sub(MAX_PENDING_HANDSHAKES)) as u64;
    eventually("the flood is shed", || {
        b.rpc.stats().handshakes_shed >= shed
    })
    .await;

    assert_echo_sharded(&a, &b, "a member during the flood", b"still sharded", 4).await;
    assert_eq!(a.rpc.stats().home_unavailable, 0);
    drop(idle);
}

/// A member that dispatches and never fetches cannot hold a Worker's
/// in-flight slots on the home: after `FETCH_PATIENCE` the permit is back
/// and the home admits again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dispatch_without_its_fetch_gives_its_slot_back() {
    use hearth_sharding::shard_server::FETCH_PATIENCE;
    let pki = Pki::new(&["a", "b", "c"]);
    let a = start_node(&pki, "a", |_| {}).await;
    let b = start_node(&pki, "b", |c| c.overload.max_in_flight_per_worker = 1).await;
    let tls = transport::connect(
        &b.home,
        pki.tls("c").client_config(),
        Duration::from_secs(5),
    )
    .await
    .unwrap();
    let (held_tx, held_rx) = tokio::sync::oneshot::channel::<()>();
    let (done_tx, done_rx) = tokio::sync::oneshot::channel::<()>();
    // The hostile member, on a thread of its own (capnp-rpc is !Send).
    let member = hand_written_member(tls, move |shard| async move {
        let mut dispatch = shard.dispatch_request();
        dispatch.get().set_script_id("echo");
        dispatch.get().set_lazy(capnp_rpc::new_client(Dummy));
        let answer = dispatch.send().promise.await.expect("admitted");
        // Keep the home's Worker capability, and never fetch.
        let _worker = answer.get().unwrap().get_worker().unwrap();
        let _ = held_tx.send(());
        let _ = done_rx.await;
    });
    guard("the member holds a dispatch", held_rx).await.unwrap();

    let refused = forward(&a, &b.home, "echo", streaming_body(b"wait".to_vec(), 4)).await;
    assert_eq!(refused.outcome, ForwardOutcome::Refused);

    tokio::time::sleep(FETCH_PATIENCE + Duration::from_millis(500)).await;
    assert_echo_sharded(&a, &b, "after the patience", b"slot is back", 4).await;
    let _ = done_tx.send(());
    member.join().unwrap();
}

/// A response sink that accepts nothing (the test never reads a response).
struct NoSink;
impl hearth_sharding::schema::hearth_capnp::response_sink::Server for NoSink {}

/// A member that ignores flow control and keeps writing a body its Worker
/// does not read cannot make the home buffer without limit: past
/// `max_unanswered_bytes` the home stops reading that connection, and
/// everyone else is served as before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_that_ignores_flow_control_cannot_fill_the_homes_memory() {
    const LIMIT: usize = 1024 * 1024;
    const CHUNK: usize = 64 * 1024;
    const WRITES: usize = 64; // 4 MiB, four times the limit
    let pki = Pki::new(&["a", "b", "c"]);
    let a = start_node(&pki, "a", |_| {}).await;
    let b = start_node(&pki, "b", |c| c.max_unanswered_bytes = LIMIT).await;
    // `gate` holds its request without reading the body.
    b.workers
        .hangs
        .store(true, std::sync::atomic::Ordering::SeqCst);
    let tls = transport::connect(
        &b.home,
        pki.tls("c").client_config(),
        Duration::from_secs(5),
    )
    .await
    .unwrap();
    let (done_tx, done_rx) = tokio::sync::oneshot::channel::<()>();
    let member = hand_written_member(tls, move |shard| async move {
        let mut dispatch = shard.dispatch_request();
        dispatch.get().set_script_id("gate");
        dispatch.get().set_lazy(capnp_rpc::new_client(Dummy));
        let dispatch = dispatch.send();
        let mut fetch = dispatch.pipeline.get_worker().fetch_request();
        {
            let mut head = fetch.get().init_head();
            head.set_method("POST");
            head.set_uri("/gate");
        }
        fetch.get().set_response(capnp_rpc::new_client(NoSink));
        let fetch = fetch.send();
        let stream = fetch.pipeline.get_request_body();
        let chunk = vec![7u8; CHUNK];
        // Every write sent at once, none awaited before the next.
        let writes: Vec<_> = (0..WRITES)
            .map(|_| {
                let mut w = stream.write_request();
                w.get().set_chunk(&chunk);
                w.send()
            })
            .collect();
        let _ = done_rx.await;
        drop((writes, dispatch.promise, fetch.promise));
    });

    eventually("the home stops reading the flooding member", || {
        b.rpc.stats().reads_paused >= 1
    })
    .await;
    // Give the member time to push the rest; the home does not take it.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let peak = b.rpc.stats().unanswered_peak as usize;
    assert!(peak <= LIMIT + 2 * CHUNK, "{peak} bytes held unanswered");
    // Everyone else is served as before.
    assert_echo_sharded(&a, &b, "a legitimate forward", b"members welcome", 5).await;
    let _ = done_tx.send(());
    member.join().unwrap();
}

/// More connections give a flooding member no more room: what its calls
/// hold unanswered is bounded over all its connections together, while
/// another member is served as before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_gains_no_memory_by_opening_more_connections() {
    const PER_CONNECTION: usize = 1024 * 1024;
    const PER_MEMBER: usize = 2 * 1024 * 1024;
    const CONNECTIONS: usize = 4;
    const CHUNK: usize = 64 * 1024;
    const WRITES: usize = 24; // 1.5 MiB per connection, 6 MiB in all
    let pki = Pki::new(&["a", "b", "c"]);
    let a = start_node(&pki, "a", |_| {}).await;
    let b = start_node(&pki, "b", |c| {
        c.max_unanswered_bytes = PER_CONNECTION;
        c.max_unanswered_bytes_per_member = PER_MEMBER;
    })
    .await;
    b.workers
        .hangs
        .store(true, std::sync::atomic::Ordering::SeqCst);
    let (done_tx, _) = tokio::sync::broadcast::channel::<()>(1);
    let mut members = Vec::new();
    for _ in 0..CONNECTIONS {
        let tls = transport::connect(
            &b.home,
            pki.tls("c").client_config(),
            Duration::from_secs(5),
        )
        .await
        .unwrap();
        let mut done = done_tx.subscribe();
        members.push(hand_written_member(tls, move |shard| async move {
            let mut dispatch = shard.dispatch_request();
            dispatch.get().set_script_id("gate");
            dispatch.get().set_lazy(capnp_rpc::new_client(Dummy));
            let dispatch = dispatch.send();
            let mut fetch = dispatch.pipeline.get_worker().fetch_request();
            {
                let mut head = fetch.get().init_head();
                head.set_method("POST");
                head.set_uri("/gate");
            }
            fetch.get().set_response(capnp_rpc::new_client(NoSink));
            let fetch = fetch.send();
            let stream = fetch.pipeline.get_request_body();
            let chunk = vec![7u8; CHUNK];
            let writes: Vec<_> = (0..WRITES)
                .map(|_| {
                    let mut w = stream.write_request();
                    w.get().set_chunk(&chunk);
                    w.send()
                })
                .collect();
            let _ = done.recv().await;
            drop((writes, dispatch.promise, fetch.promise));
        }));
    }
    eventually("the home stops reading the flooding member", || {
        b.rpc.stats().reads_paused >= 1
    })
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let stats = b.rpc.stats();
    let held = stats.member_unanswered_peak as usize;
    assert!(
        held <= PER_MEMBER + CONNECTIONS * 2 * CHUNK,
        "{held} bytes held for one member over {CONNECTIONS} connections"
    );
    assert!(
        (stats.unanswered_peak as usize) <= PER_CONNECTION + 2 * CHUNK,
        "and each connection within its own bound"
    );
    assert_echo_sharded(&a, &b, "another member", b"members welcome", 5).await;
    let _ = done_tx.send(());
    for m in members {
        m.join().unwrap();
    }
}

/// A home written for the test: it completes the TLS handshake as node `b`
/// (a real cluster certificate), reads what the caller sends for a while,
/// so `dispatch` and `fetch` (or `call`) have arrived, then ends the
/// connection without answering: by closing it (an end of stream without a
/// TLS close), or by resetting it. Returns its address.
async fn a_home_that_vanishes_after_reading(pki: &Pki, reset: bool) -> std::net::SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(pki.tls("b").server_config());
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                let Ok(mut tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let mut buf = vec![0u8; 64 * 1024];
                let mut got = 0;
                let _ = tokio::time::timeout(Duration::from_millis(150), async {
                    while let Ok(n) = tls.read(&mut buf).await {
                        if n == 0 {
                            break;
                        }
                        got += n;
                    }
                })
                .await;
                assert!(got > 0, "the caller sent its request");
                let (tcp, _) = tls.into_inner();
                if reset {
                    let _ = tcp.set_zero_linger();
                }
                drop(tcp);
            });
        }
    });
    addr
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_home_that_vanishes_before_answering_yields_a_502_never_a_second_run() {
    let pki = Pki::new(&["a", "b"]);
    let a = start_node(&pki, "a", |_| {}).await;
    for reset in [false, true] {
        let home = hearth_sharding::ring::Member::new(
            "b",
            a_home_that_vanishes_after_reading(&pki, reset).await,
        );
        // The streaming path (dispatch + fetch + body writes) and the
        // one-call path (a small complete body).
        for body in [streaming_body(pattern(200_000), 4096), full(b"small")] {
            let forwarded = guard(
                "forward to a vanishing home",
                a.rpc
                    .forward(&home, "echo", ContextStack::new(), request("/echo", body)),
            )
            .await;
            assert!(
                matches!(forwarded.outcome, ForwardOutcome::FailedAfterAccept(_)),
                "reset {reset}: {:?}",
                forwarded.outcome
            );
            assert_eq!(forwarded.response.status(), 502);
            let text = collect(forwarded.response.into_body()).await.unwrap();
            assert!(String::from_utf8_lossy(&text).contains("not retried"));
        }
    }
    // The home may have started each of them; this node ran none.
    assert_eq!(
        a.workers.served.load(std::sync::atomic::Ordering::SeqCst),
        0
    );
    assert_eq!(a.rpc.stats().failed_after_accept, 4);
    assert_eq!(a.rpc.stats().home_unavailable, 0);
}

/// A `dispatch` the home cannot take (here: no script ID, and one of 2 KiB)
/// is refused with the caller's own `lazy`, not failed: only a refusal
/// tells the caller that nothing ran, so it may serve the request itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreadable_dispatch_is_refused_with_the_callers_lazy() {
    let pki = Pki::new(&["b", "c"]);
    let b = start_node(&pki, "b", |_| {}).await;
    let tls = transport::connect(
        &b.home,
        pki.tls("c").client_config(),
        Duration::from_secs(5),
    )
    .await
    .unwrap();
    let (result_tx, result_rx) = tokio::sync::oneshot::channel::<Vec<bool>>();
    let member = hand_written_member(tls, move |shard| async move {
        let mut own = capnp_rpc::CapabilityServerSet::<Dummy, worker::Client>::new();
        let mut answers = Vec::new();
        for script_id in [String::new(), "x".repeat(2048)] {
            let mut dispatch = shard.dispatch_request();
            dispatch.get().set_script_id(script_id.as_str());
            dispatch.get().set_lazy(own.new_client(Dummy));
            let answer = dispatch
                .send()
                .promise
                .await
                .expect("an answer, not an error");
            let worker = answer.get().unwrap().get_worker().unwrap();
            let worker = capnp::capability::get_resolved_cap(worker).await;
            answers.push(own.get_local_server_of_resolved(&worker).is_some());
        }
        let _ = result_tx.send(answers);
    });
    let answers = guard("the member's dispatches", result_rx).await.unwrap();
    assert_eq!(
        answers,
        [true, true],
        "each came back as the caller's own lazy"
    );
    member.join().unwrap();
    assert_eq!(
        b.workers.served.load(std::sync::atomic::Ordering::SeqCst),
        0
    );
}

/// A home written for the test that "accepts" every dispatch with a Worker
/// of its own (which serves nothing) and keeps the caller's `lazy`
/// capability, to call it later.
struct KeepingHome {
    kept: std::rc::Rc<std::cell::RefCell<Vec<worker::Client>>>,
}

impl shard_server::Server for KeepingHome {
    fn dispatch(
        self: capnp::capability::Rc<Self>,
        params: shard_server::DispatchParams,
        mut results: shard_server::DispatchResults,
    ) -> impl std::future::Future<Output = Result<(), capnp::Error>> + 'static {
        let kept = params.get().and_then(|p| p.get_lazy());
        std::future::ready(kept.map(|lazy| {
            self.kept.borrow_mut().push(lazy);
            results.get().set_worker(capnp_rpc::new_client(Dummy));
        }))
    }
}

/// Calls `fetch` on `lazy` for `GET /`: Ok if the caller's node admitted
/// it.
async fn fetch_on(lazy: &worker::Client) -> Result<(), capnp::Error> {
    let mut call = lazy.fetch_request();
    {
        let mut head = call.get().init_head();
        head.set_method("GET");
        head.set_uri("/");
        head.init_headers(0);
    }
    call.get().set_response(capnp_rpc::new_client(NoSink));
    call.send().promise.await.map(|_| ())
}

/// A home that accepted keeps the caller's released `lazy` capability and
/// calls it: each call passes the caller's admission control like any
/// sharded request, so a peer cannot run Workers there past its limits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kept_lazy_capability_is_admitted_like_any_sharded_request() {
    let pki = Pki::new(&["a", "b"]);
    let a = start_node(&pki, "a", |c| c.overload.max_in_flight_per_worker = 1).await;
    a.workers
        .hangs
        .store(true, std::sync::atomic::Ordering::SeqCst);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let home = hearth_sharding::ring::Member::new("b", listener.local_addr().unwrap());
    let acceptor = tokio_rustls::TlsAcceptor::from(pki.tls("b").server_config());
    let (results_tx, results_rx) = tokio::sync::oneshot::channel();
    let (done_tx, done_rx) = tokio::sync::oneshot::channel::<()>();
    // The forward goes on (it ends in a 502: the fake Worker serves
    // nothing) while the home keeps its lazy. Its body is too large to
    // travel inside one `call` (which this home does not implement), so it
    // is dispatched.
    let body = vec![b'f'; hearth_sharding::inline::MAX_INLINE_BODY_BYTES + 1];
    let forward = {
        let (rpc, home) = (a.rpc.clone(), home.clone());
        tokio::spawn(async move {
            let forwarded = rpc
                .forward(
                    &home,
                    "gate",
                    ContextStack::new(),
                    request("/", streaming_body(body, 16 * 1024)),
                )
                .await;
            forwarded.response.status()
        })
    };
    let (tcp, _) = guard("the caller connects", listener.accept())
        .await
        .unwrap();
    let tls = acceptor.accept(tcp).await.unwrap();
    let member = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let local = tokio::task::LocalSet::new();
        local.block_on(&rt, async move {
            let kept = std::rc::Rc::new(std::cell::RefCell::new(Vec::new()));
            let bootstrap: shard_server::Client =
                capnp_rpc::new_client(KeepingHome { kept: kept.clone() });
            let (read, write) = tokio::io::split(tls);
            let network = VatNetwork::new(
                read.compat(),
                write.compat_write(),
                Side::Server,
                capnp::message::ReaderOptions::new(),
            );
            tokio::task::spawn_local(RpcSystem::new(Box::new(network), Some(bootstrap.client)));
            let lazy = loop {
                if let Some(lazy) = kept.borrow().first().cloned() {
                    break lazy;
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            };
            // Let the caller see the answer and release its lazy first.
            tokio::time::sleep(Duration::from_millis(200)).await;
            let first = tokio::task::spawn_local({
                let lazy = lazy.clone();
                async move { fetch_on(&lazy).await }
            });
            tokio::time::sleep(Duration::from_millis(200)).await;
            let second = fetch_on(&lazy).await;
            let _ = results_tx.send(second.map_err(|e| (e.kind, e.to_string())));
            let _ = done_rx.await;
            drop(first);
        });
    });
    a.workers.wait_entered(1).await;
    let second = guard("the second call on the kept lazy", results_rx)
        .await
        .unwrap();
    let Err((kind, message)) = second else {
        panic!("a second request past the per-Worker limit was admitted");
    };
    assert_eq!(kind, capnp::ErrorKind::Overloaded, "{message}");
    assert!(message.contains("does not admit"), "{message}");
    // One invocation ran (the first call, admitted); the forward itself was
    // not served here.
    assert_eq!(
        a.workers
            .entered_count
            .load(std::sync::atomic::Ordering::SeqCst),
        1
    );
    a.workers.release.notify_waiters();
    let _ = done_tx.send(());
    member.join().unwrap();
    assert_eq!(guard("the forward", forward).await.unwrap(), 502);
}
