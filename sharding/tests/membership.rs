//! Membership with real nodes: real UDP sockets on 127.0.0.1, each node in
//! its own tokio runtime on its own thread, so killing a node abruptly means
//! dropping its runtime (no goodbye is sent).
//!
//! Every wait is a bounded poll: it fails the test at its deadline.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::sync::mpsc as std_mpsc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use hearth_sharding::membership::{
    FailureDetection, GossipCounters, Membership, MembershipConfig, MembershipError, PeerAddr,
    StaticMember,
};
use hearth_sharding::ring::{Member, NodeId, RingError, SharedRing};
use tokio::sync::mpsc;

const CLUSTER_KEY: [u8; 32] = *b"hearth membership test key 32 b!";

/// 127.0.0.1 with a port the OS picks.
fn any_port() -> SocketAddr {
    rpc(0)
}

fn rpc(port: u16) -> SocketAddr {
    ([127, 0, 0, 1], port).into()
}

enum Control {
    /// Drop the runtime: the gossip task dies mid-flight, no goodbye.
    Kill,
    /// `drain()`, report how long it took, then wait for the next command.
    Drain(std_mpsc::Sender<Result<Duration, String>>),
    /// `shutdown()` (goodbye) and exit.
    Shutdown,
}

/// One node on its own thread and runtime.
struct TestNode {
    id: NodeId,
    gossip: SocketAddr,
    ring: SharedRing,
    counters: GossipCounters,
    control: mpsc::UnboundedSender<Control>,
    thread: Option<JoinHandle<()>>,
}

impl TestNode {
    fn start(id: &str, rpc_port: u16, listen: SocketAddr, seeds: Vec<SocketAddr>) -> Self {
        Self::start_keyed(id, rpc_port, listen, seeds, Some(CLUSTER_KEY))
    }

    fn start_keyed(
        id: &str,
        rpc_port: u16,
        listen: SocketAddr,
        seeds: Vec<SocketAddr>,
        key: Option<[u8; 32]>,
    ) -> Self {
        let node = Member::new(id, rpc(rpc_port));
        let mut config = MembershipConfig::gossip(node, listen, seeds);
        if let Some(gossip) = config.gossip.as_mut() {
            gossip.key = key;
        }
        let (ready_tx, ready_rx) = std_mpsc::channel();
        let (control, mut commands) = mpsc::unbounded_channel();
        let thread = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("tokio runtime");
            let kept = runtime.block_on(async move {
                let membership = match Membership::start(config).await {
                    Ok(m) => m,
                    Err(e) => {
                        let _ = ready_tx.send(Err(e.to_string()));
                        return None;
                    }
                };
                let _ = ready_tx.send(Ok((
                    membership.ring().clone(),
                    membership.gossip_addr(),
                    membership.gossip_counters(),
                )));
                loop {
                    match commands.recv().await {
                        None | Some(Control::Kill) => return Some(membership),
                        Some(Control::Drain(reply)) => {
                            let started = Instant::now();
                            let result = membership.drain().await;
                            let _ = reply.send(
                                result
                                    .map(|()| started.elapsed())
                                    .map_err(|e| e.to_string()),
                            );
                        }
                        Some(Control::Shutdown) => {
                            membership.shutdown().await.expect("clean shutdown");
                            return None;
                        }
                    }
                }
            });
            // Abrupt kill: the runtime (and with it the gossip task and its
            // socket) goes first, then the handle.
            drop(runtime);
            drop(kept);
        });
        let (ring, gossip, counters) = ready_rx
            .recv_timeout(Duration::from_secs(5))
            .expect("node thread answers")
            .expect("membership starts");
        Self {
            id: NodeId::new(id),
            gossip: gossip.expect("gossip is on"),
            ring,
            counters,
            control,
            thread: Some(thread),
        }
    }

    fn members(&self) -> BTreeSet<String> {
        self.ring
            .load()
            .members()
            .iter()
            .map(|n| n.id.to_string())
            .collect()
    }

    fn stop(&mut self, how: Control) {
        let _ = self.control.send(how);
        if let Some(thread) = self.thread.take() {
            thread.join().expect("node thread exits cleanly");
        }
    }

    fn drain(&self) -> Duration {
        let (tx, rx) = std_mpsc::channel();
        self.control.send(Control::Drain(tx)).expect("node alive");
        rx.recv_timeout(Duration::from_secs(10))
            .expect("drain answers")
            .expect("drain succeeds")
    }
}

impl Drop for TestNode {
    fn drop(&mut self) {
        self.stop(Control::Kill);
    }
}

fn set(ids: &[&str]) -> BTreeSet<String> {
    ids.iter().map(|s| s.to_string()).collect()
}

/// Polls until every node in `nodes` has exactly `expected` on its ring, or
/// fails at `within`. Returns the time it took.
fn wait_for(nodes: &[&TestNode], expected: &[&str], within: Duration, what: &str) -> Duration {
    let expected = set(expected);
    let started = Instant::now();
    loop {
        if nodes.iter().all(|n| n.members() == expected) {
            return started.elapsed();
        }
        if started.elapsed() > within {
            let seen: Vec<(String, BTreeSet<String>)> = nodes
                .iter()
                .map(|n| (n.id.to_string(), n.members()))
                .collect();
            panic!("{what}: not every node saw {expected:?} within {within:?}; rings: {seen:?}");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Start three, kill one abruptly, restart it, drain another.
#[test]
fn three_nodes_kill_restart_drain() {
    let _ = tracing_subscriber::fmt().with_test_writer().try_init();
    let timing = FailureDetection::default();
    let bound = timing.detection_bound(3);
    let join = Duration::from_secs(5);

    let a = TestNode::start("a", 7001, any_port(), vec![]);
    let b = TestNode::start("b", 7002, any_port(), vec![a.gossip]);
    let mut c = TestNode::start("c", 7003, any_port(), vec![a.gossip, b.gossip]);
    let took = wait_for(&[&a, &b, &c], &["a", "b", "c"], join, "start 3");
    eprintln!("all three joined in {took:?}");

    // Kill c abruptly: a and b drop it within the documented bound.
    let c_gossip = c.gossip;
    c.stop(Control::Kill);
    let took = wait_for(&[&a, &b], &["a", "b"], bound, "abrupt kill");
    eprintln!("killed node dropped in {took:?} (documented bound {bound:?})");
    assert!(took <= bound);

    // Restart c: same ID, same gossip address. It is back on every ring.
    let c = TestNode::start("c", 7003, c_gossip, vec![a.gossip, b.gossip]);
    assert_eq!(c.gossip, c_gossip);
    let took = wait_for(&[&a, &b, &c], &["a", "b", "c"], join, "restart");
    eprintln!("restarted node back in {took:?}");

    // Drain b: it leaves its own ring at once and the others' promptly,
    // while it is still running (finishing in-flight requests).
    let drain_took = b.drain();
    assert!(
        !b.members().contains("b"),
        "a drained node is off its own ring"
    );
    let took = wait_for(&[&a, &c], &["a", "c"], Duration::from_secs(1), "drain");
    eprintln!("drain() returned in {drain_took:?}; others dropped b {took:?} after that");

    // Then b shuts down with a goodbye: it stays off, nobody else is lost.
    let mut b = b;
    b.stop(Control::Shutdown);
    std::thread::sleep(Duration::from_millis(500));
    wait_for(&[&a, &c], &["a", "c"], Duration::ZERO, "after shutdown");

    let (mut a, mut c) = (a, c);
    a.stop(Control::Shutdown);
    c.stop(Control::Shutdown);
}

/// A node without the cluster key (or with another) cannot join: its
/// datagrams are dropped and it never appears on a member's ring.
#[test]
fn nodes_without_the_key_cannot_join() {
    let member = TestNode::start("member", 7101, any_port(), vec![]);
    let outsider = TestNode::start_keyed("outsider", 7102, any_port(), vec![member.gossip], None);
    let forger = TestNode::start_keyed(
        "forger",
        7103,
        any_port(),
        vec![member.gossip],
        Some([7; 32]),
    );
    // Several announce rounds (every 500 ms) go unanswered.
    std::thread::sleep(Duration::from_millis(1500));
    wait_for(&[&member], &["member"], Duration::ZERO, "keyed member");
    wait_for(
        &[&outsider],
        &["outsider"],
        Duration::ZERO,
        "unkeyed outsider",
    );
    wait_for(&[&forger], &["forger"], Duration::ZERO, "wrong-key forger");
    // The member noticed: both senders' datagrams are counted as
    // unauthenticated (and logged), so a misconfigured key is visible.
    assert!(
        member.counters.unauthenticated() >= 2,
        "{}",
        member.counters.unauthenticated()
    );
    assert_eq!(outsider.counters.unauthenticated(), 0);
}

/// Without gossip the ring is this node plus the static list; draining
/// takes this node off it and is announced on the watch channel.
#[tokio::test]
async fn static_membership_and_drain() {
    let me = Member::new("me", rpc(1));
    let statics = vec![
        Member::new("x", rpc(2)),
        Member::new("y", rpc(3)).with_weight(2),
        Member::new("me", rpc(9)), // our own entry in a shared list: ignored
    ];
    let membership = Membership::start(MembershipConfig::fixed(me.clone(), statics))
        .await
        .expect("static membership starts");
    assert_eq!(membership.gossip_addr(), None);
    assert_eq!(membership.self_id(), &me.id);
    let ring = membership.ring().load_full();
    assert_eq!(ring.len(), 3);
    assert_eq!(
        ring.get(&me.id),
        Some(&me),
        "self uses its own config, not the list's"
    );

    let mut updates = membership.subscribe();
    membership.drain().await.expect("drain");
    membership.drain().await.expect("drain is idempotent");
    assert!(!membership.ring().load().contains(&me.id));
    assert!(updates.has_changed().expect("sender alive"));
    let latest = updates.borrow_and_update().clone();
    assert_eq!(latest.len(), 2);
    membership.shutdown().await.expect("shutdown");
}

/// A static member may be given by DNS name (a StatefulSet pod's stable
/// name): it is on the ring at the address the name resolves to.
#[tokio::test]
async fn a_static_member_named_by_dns_is_on_the_ring_at_its_address() {
    let me = Member::new("me", rpc(1));
    let mut config = MembershipConfig::fixed(me, vec![]);
    config.static_nodes.push(StaticMember {
        id: NodeId::new("peer"),
        addr: "localhost:7123".parse().expect("a name and a port"),
        weight: 2,
    });
    let membership = Membership::start(config).await.expect("starts");
    let ring = membership.ring().load_full();
    let peer = ring
        .get(&NodeId::new("peer"))
        .expect("the named peer is on the ring");
    assert!(peer.rpc_addr.ip().is_loopback(), "{peer:?}");
    assert_eq!((peer.rpc_addr.port(), peer.weight), (7123, 2));
    membership.shutdown().await.expect("shutdown");

    for bad in ["localhost", "localhost:http", ":80", "a b:1", "[::1]"] {
        assert!(bad.parse::<PeerAddr>().is_err(), "{bad}");
    }
    assert_eq!(
        "10.0.0.1:7001".parse::<PeerAddr>().expect("ip"),
        PeerAddr::Ip(([10, 0, 0, 1], 7001).into())
    );
}

#[tokio::test]
async fn bad_configs_are_typed_errors() {
    let node = Member::new("n", rpc(1));

    let unspecified = MembershipConfig::gossip(node.clone(), ([0, 0, 0, 0], 0).into(), vec![]);
    assert!(matches!(
        Membership::start(unspecified).await,
        Err(MembershipError::UnspecifiedGossipAddr(_))
    ));

    for advertise in [
        SocketAddr::from(([0, 0, 0, 0], 7001)),
        SocketAddr::from(([127, 0, 0, 1], 0)),
    ] {
        let mut bad = MembershipConfig::gossip(node.clone(), any_port(), vec![]);
        if let Some(gossip) = bad.gossip.as_mut() {
            gossip.advertise = Some(advertise);
        }
        assert!(matches!(
            Membership::start(bad).await,
            Err(MembershipError::InvalidAdvertiseAddr(a)) if a == advertise
        ));
    }
    // An advertised address is what the node tells peers to send to.
    let mut advertised = MembershipConfig::gossip(node.clone(), any_port(), vec![]);
    let relay = SocketAddr::from(([127, 0, 0, 1], 7999));
    if let Some(gossip) = advertised.gossip.as_mut() {
        gossip.advertise = Some(relay);
    }
    let membership = Membership::start(advertised).await.expect("starts");
    assert_eq!(membership.gossip_addr(), Some(relay));
    membership.shutdown().await.expect("shutdown");

    let mut bad_timing = MembershipConfig::gossip(node.clone(), any_port(), vec![]);
    if let Some(gossip) = bad_timing.gossip.as_mut() {
        gossip.timing.probe_rtt = gossip.timing.probe_period;
    }
    assert!(matches!(
        Membership::start(bad_timing).await,
        Err(MembershipError::InvalidTiming(_))
    ));

    let taken = std::net::UdpSocket::bind(any_port()).expect("bind");
    let busy = MembershipConfig::gossip(node.clone(), taken.local_addr().expect("addr"), vec![]);
    assert!(matches!(
        Membership::start(busy).await,
        Err(MembershipError::Bind { .. })
    ));

    let heavy = MembershipConfig::gossip(node.clone().with_weight(1000), any_port(), vec![]);
    assert!(matches!(
        Membership::start(heavy).await,
        Err(MembershipError::WeightTooLarge { weight: 1000, .. })
    ));

    let weightless = MembershipConfig::fixed(node.with_weight(0), vec![]);
    assert!(matches!(
        Membership::start(weightless).await,
        Err(MembershipError::Ring(RingError::ZeroWeight(_)))
    ));
}
