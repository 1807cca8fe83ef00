//! Fuzz target for gossip datagrams: what anyone who can reach a node's UDP
//! port can send it.
//!
//! Real gossip is captured first (a node's announces, sealed and unsealed),
//! then each case sends a random datagram or a captured one with bytes
//! overwritten, cut short or extended, to running nodes. Properties:
//! - a keyed node counts every datagram that is not byte-for-byte a real
//!   sealed one as unauthenticated, and acts on none of them;
//! - an unkeyed node (which accepts anyone, by configuration) keeps running
//!   and keeps its real peer on its ring;
//! - both still shut down cleanly (their gossip task never died).
//!
//! Proptest on the stable toolchain; a long run is
//! `PROPTEST_CASES=100000 cargo test --release -p hearth-sharding --test fuzz_gossip`.

use std::net::SocketAddr;
use std::time::Duration;

use hearth_sharding::membership::{Membership, MembershipConfig};
use hearth_sharding::ring::{Member, NodeId};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use tokio::net::UdpSocket;

const KEY: [u8; 32] = *b"hearth gossip fuzz test key 32b!";

fn any_port() -> SocketAddr {
    ([127, 0, 0, 1], 0).into()
}

async fn start(id: &str, seeds: Vec<SocketAddr>, key: Option<[u8; 32]>) -> Membership {
    let mut config = MembershipConfig::gossip(
        Member::new(id, ([127, 0, 0, 1], 9).into()),
        any_port(),
        seeds,
    );
    if let Some(g) = config.gossip.as_mut() {
        g.key = key;
    }
    Membership::start(config).await.expect("membership starts")
}

async fn eventually(what: &str, mut f: impl FnMut() -> bool) {
    let waited = tokio::time::timeout(Duration::from_secs(30), async {
        while !f() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    assert!(waited.is_ok(), "{what}: not within 30 s");
}

/// Waits until `keyed` has counted `forged` unauthenticated datagrams since
/// `before`.
async fn caught_up(keyed: &Membership, before: u64, forged: u64) {
    let counters = keyed.gossip_counters();
    eventually("every forged datagram is counted", || {
        counters.unauthenticated() - before >= forged
    })
    .await;
}

/// Datagrams a node with `key` sends to a seed it has not met (announces).
async fn capture(key: Option<[u8; 32]>) -> Vec<Vec<u8>> {
    let trap = UdpSocket::bind(any_port()).await.expect("bind");
    let speaker = start("speaker", vec![trap.local_addr().expect("addr")], key).await;
    let mut out = Vec::new();
    let mut buf = vec![0u8; 2048];
    while out.len() < 3 {
        let (n, _) = tokio::time::timeout(Duration::from_secs(10), trap.recv_from(&mut buf))
            .await
            .expect("the speaker announces")
            .expect("recv");
        out.push(buf[..n].to_vec());
    }
    drop(speaker);
    out
}

#[derive(Debug, Clone)]
enum Datagram {
    Random(Vec<u8>),
    Damaged {
        original: prop::sample::Index,
        writes: Vec<(prop::sample::Index, u8)>,
        cut: Option<prop::sample::Index>,
        tail: Vec<u8>,
    },
}

fn datagram() -> impl Strategy<Value = Datagram> {
    prop_oneof![
        prop::collection::vec(any::<u8>(), 0..1600).prop_map(Datagram::Random),
        (
            any::<prop::sample::Index>(),
            prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 0..6),
            prop::option::weighted(0.3, any::<prop::sample::Index>()),
            prop::collection::vec(any::<u8>(), 0..8),
        )
            .prop_map(|(original, writes, cut, tail)| Datagram::Damaged {
                original,
                writes,
                cut,
                tail,
            }),
    ]
}

impl Datagram {
    fn bytes(&self, corpus: &[Vec<u8>]) -> Vec<u8> {
        match self {
            Datagram::Random(bytes) => bytes.clone(),
            Datagram::Damaged {
                original,
                writes,
                cut,
                tail,
            } => {
                let mut bytes = original.get(corpus).clone();
                for (at, value) in writes {
                    let i = at.index(bytes.len());
                    bytes[i] = *value;
                }
                if let Some(cut) = cut {
                    bytes.truncate(cut.index(bytes.len()));
                }
                bytes.extend_from_slice(tail);
                bytes
            }
        }
    }
}

#[test]
fn fuzz_gossip_datagrams_harm_no_node() {
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let (sealed, plain) = rt.block_on(async { (capture(Some(KEY)).await, capture(None).await) });

    let (keyed, keyed_peer, open, open_peer, sender) = rt.block_on(async {
        let keyed = start("keyed", vec![], Some(KEY)).await;
        let keyed_peer = start(
            "keyed-peer",
            keyed.gossip_addr().into_iter().collect(),
            Some(KEY),
        )
        .await;
        let open = start("open", vec![], None).await;
        let open_peer = start("open-peer", open.gossip_addr().into_iter().collect(), None).await;
        let peer = NodeId::new("keyed-peer");
        eventually("keyed pair joins", || keyed.ring().load().contains(&peer)).await;
        let peer = NodeId::new("open-peer");
        eventually("open pair joins", || open.ring().load().contains(&peer)).await;
        let sender = UdpSocket::bind(any_port()).await.expect("bind");
        (keyed, keyed_peer, open, open_peer, sender)
    });
    let keyed_addr = keyed.gossip_addr().expect("gossip");
    let open_addr = open.gossip_addr().expect("gossip");

    let forged = std::cell::Cell::new(0u64);
    let sent = std::cell::Cell::new(0u64);
    let before = keyed.gossip_counters().unauthenticated();
    let mut runner = TestRunner::new(Config::default());
    let result = runner.run(&(datagram(), datagram()), |(to_keyed, to_open)| {
        let bytes = to_keyed.bytes(&sealed);
        if !sealed.contains(&bytes) {
            forged.set(forged.get() + 1);
        }
        rt.block_on(async {
            sender.send_to(&bytes, keyed_addr).await.expect("send");
            sender
                .send_to(&to_open.bytes(&plain), open_addr)
                .await
                .expect("send");
            sent.set(sent.get() + 1);
            // Let the nodes keep up: a flood would overflow their socket
            // buffers, and a datagram the kernel drops tests nothing.
            if sent.get().is_multiple_of(32) {
                caught_up(&keyed, before, forged.get()).await;
            }
        });
        Ok(())
    });
    result.expect("no case fails");
    let forged = forged.get();

    rt.block_on(async {
        // Every forged datagram (and only those) was dropped as
        // unauthenticated: with the key, nothing else gets in.
        caught_up(&keyed, before, forged).await;
        assert_eq!(keyed.gossip_counters().unauthenticated() - before, forged);
        // Both nodes still have their real peer (after failure detection
        // has dealt with whatever the fuzz made the open node believe).
        let peer = NodeId::new("keyed-peer");
        eventually("keyed node keeps its peer", || {
            keyed.ring().load().contains(&peer)
        })
        .await;
        let peer = NodeId::new("open-peer");
        eventually("open node keeps its peer", || {
            open.ring().load().contains(&peer)
        })
        .await;
        for m in [keyed, keyed_peer, open, open_peer] {
            m.shutdown()
                .await
                .expect("the gossip task is still running");
        }
    });
}
