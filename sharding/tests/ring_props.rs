//! What the rest of hearth relies on from the ring: the same membership
//! gives the same homes everywhere, membership changes move only the Workers
//! they must (and to where the successors said), weights and balance
//! hold, and bad input is refused with a typed error.

use std::collections::{BTreeSet, HashMap};
use std::net::SocketAddr;

use hearth_sharding::ring::{
    DEFAULT_VNODES, MAX_POINTS, Member, NodeId, Ring, RingConfig, RingError, SharedRing,
    rehomed_fraction, sample_keys,
};
use proptest::prelude::*;
use proptest::sample::Index;

fn addr(port: u16) -> SocketAddr {
    ([127, 0, 0, 1], port).into()
}

fn ring(nodes: Vec<Member>, vnodes: u32) -> Ring {
    Ring::new(nodes, RingConfig::with_vnodes(vnodes)).expect("valid membership")
}

/// 1 to 24 nodes with distinct IDs and weights 1..=4.
fn membership() -> impl Strategy<Value = Vec<Member>> {
    prop::collection::btree_set("[a-z0-9-]{1,10}", 1..24).prop_flat_map(|ids| {
        let n = ids.len();
        prop::collection::vec(1u32..=4, n).prop_map(move |weights| {
            ids.iter()
                .zip(weights)
                .enumerate()
                .map(|(i, (id, w))| Member::new(id.as_str(), addr(7000 + i as u16)).with_weight(w))
                .collect::<Vec<_>>()
        })
    })
}

/// Mostly small vnode counts (the properties hold for any), sometimes the
/// default.
fn vnodes() -> impl Strategy<Value = u32> {
    prop_oneof![4 => 1u32..=64, 1 => Just(DEFAULT_VNODES)]
}

/// Script IDs: arbitrary strings, including empty and non-ASCII.
fn keys() -> impl Strategy<Value = Vec<String>> {
    prop::collection::vec(any::<String>(), 1..200)
}

fn home_id(ring: &Ring, key: &str) -> Option<NodeId> {
    ring.home(key).map(|n| n.id.clone())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

    /// Every node computes the same home whatever order it learned the
    /// members in.
    #[test]
    fn same_membership_same_homes(
        (nodes, shuffled) in membership().prop_flat_map(|n| (Just(n.clone()), Just(n).prop_shuffle())),
        vnodes in vnodes(),
        keys in keys(),
    ) {
        let a = ring(nodes, vnodes);
        let b = ring(shuffled, vnodes);
        prop_assert_eq!(&a, &b);
        for key in &keys {
            prop_assert_eq!(home_id(&a, key), home_id(&b, key));
        }
    }

    /// Removing a node moves exactly the keys it owned, each to its old
    /// second successor; no other key moves.
    #[test]
    fn removing_a_node_moves_only_its_keys_to_their_successor(
        nodes in membership(),
        gone in any::<Index>(),
        vnodes in vnodes(),
        keys in keys(),
    ) {
        let gone = gone.get(&nodes).id.clone();
        let before = ring(nodes.clone(), vnodes);
        let after = ring(nodes.into_iter().filter(|n| n.id != gone).collect(), vnodes);
        for key in &keys {
            let old = home_id(&before, key);
            let new = home_id(&after, key);
            if old.as_ref() == Some(&gone) {
                let next = before.successors(key, 2).get(1).map(|n| n.id.clone());
                prop_assert_eq!(new, next, "key {:?} of the removed node", key);
            } else {
                prop_assert_eq!(new, old, "key {:?} moved though its home stayed", key);
            }
        }
    }

    /// Adding a node moves only the keys the new node now owns.
    #[test]
    fn adding_a_node_moves_only_keys_it_now_owns(
        nodes in membership(),
        new_id in "[A-Z]{1,10}",
        weight in 1u32..=4,
        vnodes in vnodes(),
        keys in keys(),
    ) {
        let new_id = NodeId::new(new_id);
        let before = ring(nodes.clone(), vnodes);
        let mut grown = nodes;
        grown.push(Member::new(new_id.clone(), addr(9000)).with_weight(weight));
        let after = ring(grown, vnodes);
        for key in &keys {
            let new = home_id(&after, key);
            if new.as_ref() != Some(&new_id) {
                prop_assert_eq!(new, home_id(&before, key), "key {:?} moved to an old node", key);
            }
        }
    }

    /// The successors start at the home and list distinct nodes; asked
    /// for all of them, it is a permutation of the membership.
    #[test]
    fn successors_are_home_then_distinct_nodes(
        nodes in membership(),
        vnodes in vnodes(),
        keys in keys(),
        n in 0usize..30,
    ) {
        let r = ring(nodes, vnodes);
        for key in &keys {
            let some = r.successors(key, n);
            prop_assert_eq!(some.len(), n.min(r.len()));
            if let Some(first) = some.first() {
                prop_assert_eq!(Some(&first.id), r.home(key).map(|h| &h.id));
            }
            let all: Vec<&NodeId> = r.successors(key, usize::MAX).into_iter().map(|n| &n.id).collect();
            let distinct: BTreeSet<&NodeId> = all.iter().copied().collect();
            prop_assert_eq!(all.len(), r.len());
            prop_assert_eq!(distinct.len(), r.len());
            prop_assert_eq!(&all[..some.len()], &some.iter().map(|n| &n.id).collect::<Vec<_>>()[..]);
        }
    }

    /// Raising one node's weight only moves keys onto that node (its first
    /// points do not move).
    #[test]
    fn raising_a_weight_only_pulls_keys_to_that_node(
        nodes in membership(),
        heavier in any::<Index>(),
        vnodes in 1u32..=64,
        keys in keys(),
    ) {
        let heavier = heavier.get(&nodes).id.clone();
        let before = ring(nodes.clone(), vnodes);
        let after = ring(
            nodes.into_iter().map(|n| if n.id == heavier { let w = n.weight + 1; n.with_weight(w) } else { n }).collect(),
            vnodes,
        );
        for key in &keys {
            let new = home_id(&after, key);
            if new.as_ref() != Some(&heavier) {
                prop_assert_eq!(new, home_id(&before, key));
            }
        }
    }

    /// The logged re-homed fraction is exactly the share of sample keys
    /// whose home changed; identical rings move nothing.
    #[test]
    fn rehomed_fraction_counts_moved_keys(
        nodes in membership(),
        gone in any::<Index>(),
        vnodes in 1u32..=64,
    ) {
        let gone = gone.get(&nodes).id.clone();
        let before = ring(nodes.clone(), vnodes);
        let after = ring(nodes.into_iter().filter(|n| n.id != gone).collect(), vnodes);
        let sample: Vec<String> = sample_keys(500).collect();
        prop_assert_eq!(rehomed_fraction(&before, &before.clone(), &sample), 0.0);
        let owned_by_gone = sample.iter().filter(|k| home_id(&before, k).as_ref() == Some(&gone)).count();
        let expected = owned_by_gone as f64 / sample.len() as f64;
        prop_assert_eq!(rehomed_fraction(&before, &after, &sample), expected);
    }
}

/// The balance bar: 300 equal nodes at the default vnode count, the
/// most loaded owns at most 1.10× the mean of 10^6 script IDs.
#[test]
fn balance_300_equal_nodes_default_vnodes() {
    const NODES: usize = 300;
    const KEYS: usize = 1_000_000;
    let nodes: Vec<Member> = (0..NODES)
        .map(|i| Member::new(format!("node-{i}"), addr(7000)))
        .collect();
    let r = Ring::new(nodes, RingConfig::default()).expect("valid membership");
    let mut counts: HashMap<&NodeId, usize> = HashMap::new();
    for i in 0..KEYS {
        let home = r.home(&format!("script-{i}")).expect("non-empty ring");
        *counts.entry(&home.id).or_default() += 1;
    }
    assert_eq!(counts.len(), NODES, "every node owns some keys");
    let mean = KEYS as f64 / NODES as f64;
    let max = counts.values().copied().max().unwrap_or(0) as f64 / mean;
    let min = counts.values().copied().min().unwrap_or(0) as f64 / mean;
    eprintln!(
        "300 nodes, {DEFAULT_VNODES} vnodes, {KEYS} keys: max/mean {max:.3}, min/mean {min:.3}"
    );
    assert!(max <= 1.10, "most loaded node has {max:.3}x the mean");
}

/// A node of weight w owns about w/total of the hash space.
#[test]
fn weights_set_proportional_shares() {
    let nodes: Vec<Member> = (0..12u32)
        .map(|i| Member::new(format!("host-{i}"), addr(7000)).with_weight(1 + i % 4))
        .collect();
    let total: u32 = nodes.iter().map(|n| n.weight).sum();
    let r = Ring::new(nodes, RingConfig::default()).expect("valid membership");
    let shares = r.ownership();
    let sum: f64 = shares.iter().map(|(_, s)| s).sum();
    assert!((sum - 1.0).abs() < 1e-9, "shares sum to {sum}");
    for (node, share) in shares {
        let expected = f64::from(node.weight) / f64::from(total);
        let ratio = share / expected;
        assert!(
            (0.93..=1.07).contains(&ratio),
            "{} (weight {}) owns {share:.4}, expected {expected:.4}",
            node.id,
            node.weight
        );
    }
}

#[test]
fn empty_ring_has_no_home() {
    let r = Ring::new(Vec::new(), RingConfig::default()).expect("empty is valid");
    assert!(r.is_empty());
    assert!(r.home("anything").is_none());
    assert!(r.successors("anything", 3).is_empty());
    assert!(r.ownership().is_empty());
    assert_eq!(r, Ring::default());
}

#[test]
fn single_node_owns_everything() {
    let r = Ring::new([Member::new("only", addr(1))], RingConfig::with_vnodes(1)).expect("valid");
    assert_eq!(r.home("x").map(|n| n.id.as_str()), Some("only"));
    assert_eq!(r.successors("x", 5).len(), 1);
    assert_eq!(r.ownership()[0].1, 1.0);
}

#[test]
fn invalid_memberships_are_typed_errors() {
    let a = Member::new("a", addr(1));
    assert_eq!(
        Ring::new([a.clone()], RingConfig::with_vnodes(0)),
        Err(RingError::ZeroVnodes)
    );
    assert_eq!(
        Ring::new([a.clone().with_weight(0)], RingConfig::default()),
        Err(RingError::ZeroWeight(NodeId::new("a")))
    );
    assert_eq!(
        Ring::new([a.clone(), a.clone().with_weight(3)], RingConfig::default()),
        Err(RingError::DuplicateNode(NodeId::new("a")))
    );
    assert!(matches!(
        Ring::new([a.with_weight(u32::MAX)], RingConfig::with_vnodes(u32::MAX)),
        Err(RingError::TooManyPoints {
            max: MAX_POINTS,
            ..
        })
    ));
}

#[test]
fn lookups_by_id() {
    let r = ring(
        vec![Member::new("b", addr(2)), Member::new("a", addr(1))],
        8,
    );
    assert_eq!(r.len(), 2);
    assert_eq!(r.num_points(), 16);
    assert_eq!(r.members()[0].id.as_str(), "a", "nodes are listed by ID");
    assert_eq!(r.get(&NodeId::new("b")).map(|n| n.rpc_addr), Some(addr(2)));
    assert!(!r.contains(&NodeId::new("c")));
}

/// Readers of a shared ring see a new ring as soon as it is stored, and a
/// ring they already loaded stays valid.
#[test]
fn shared_ring_swaps_for_every_reader() {
    let three = ring(
        ["a", "b", "c"].map(|id| Member::new(id, addr(1))).into(),
        16,
    );
    let two = ring(["a", "b"].map(|id| Member::new(id, addr(1))).into(), 16);
    let writer = SharedRing::new(three.clone());
    let reader = writer.clone();
    let held = reader.load_full();
    let previous = writer.store(two.clone());
    assert_eq!(*previous, three);
    assert_eq!(**reader.load(), two);
    assert_eq!(*held, three, "an already loaded ring is unaffected");
    assert!(SharedRing::default().load().is_empty());
}

/// A change of membership in a fuzzed sequence.
#[derive(Debug, Clone)]
enum Change {
    /// A node with this ID (reused IDs rejoin) and weight joins; a node
    /// already in joins again with its new weight (a restart).
    Join(String, u32),
    /// The node at this index of the current membership leaves.
    Leave(Index),
}

fn change() -> impl Strategy<Value = Change> {
    prop_oneof![
        3 => ("[a-e][0-9]?", 1u32..=3).prop_map(|(id, w)| Change::Join(id, w)),
        2 => any::<Index>().prop_map(Change::Leave),
    ]
}

/// Cases for the fuzz target: `PROPTEST_CASES` for a long run, else 64.
fn fuzz_cases() -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(64)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: fuzz_cases(), ..ProptestConfig::default() })]

    /// Any sequence of joins, rejoins with a new weight and leaves keeps the
    /// ring's invariants after every step: a home for every key while
    /// anyone is a member, and only members are homes; the same membership
    /// learned in another order gives the same homes; successors are
    /// distinct members, home first; a join moves keys only to the joiner,
    /// a leave moves only the leaver's keys, each to its old second
    /// successor; an empty membership is an empty ring, not an error.
    #[test]
    fn fuzz_ring_any_sequence_of_joins_and_leaves_keeps_its_invariants(
        changes in prop::collection::vec(change(), 1..40),
        vnodes in 1u32..=32,
        keys in prop::collection::vec("[a-z0-9-]{1,12}", 1..64),
    ) {
        let mut members: Vec<Member> = Vec::new();
        let mut before = ring(Vec::new(), vnodes);
        for (step, c) in changes.iter().enumerate() {
            let (joined, left) = match c {
                Change::Join(id, w) => {
                    members.retain(|n| n.id.as_str() != id);
                    members.push(Member::new(id.as_str(), addr(7000 + step as u16)).with_weight(*w));
                    (Some(NodeId::new(id.as_str())), None)
                }
                Change::Leave(i) if !members.is_empty() => {
                    let gone = members.remove(i.index(members.len()));
                    (None, Some(gone.id))
                }
                Change::Leave(_) => (None, None),
            };
            let after = ring(members.clone(), vnodes);
            let mut reversed = members.clone();
            reversed.reverse();
            prop_assert_eq!(&after, &ring(reversed, vnodes));
            prop_assert_eq!(after.is_empty(), members.is_empty());
            for key in &keys {
                let home = home_id(&after, key);
                prop_assert_eq!(home.is_some(), !members.is_empty());
                if let Some(h) = &home {
                    prop_assert!(after.contains(h), "home {} is not a member", h);
                }
                let succ = after.successors(key, 3);
                let distinct: BTreeSet<_> = succ.iter().map(|n| n.id.clone()).collect();
                prop_assert_eq!(distinct.len(), succ.len());
                prop_assert_eq!(succ.first().map(|n| n.id.clone()), home.clone());
                let old = home_id(&before, key);
                if old != home && old.is_some() {
                    match (&joined, &left) {
                        // A pure join (not a reweighting) moves keys only
                        // to the joiner.
                        (Some(j), None) if !before.contains(j) => {
                            prop_assert_eq!(home.as_ref(), Some(j), "key {} moved elsewhere", key);
                        }
                        (None, Some(l)) => {
                            prop_assert_eq!(old.as_ref(), Some(l), "key {} of a staying node moved", key);
                            let second = before.successors(key, 2).get(1).map(|n| n.id.clone());
                            prop_assert_eq!(home.clone(), second);
                        }
                        // A reweighting moves keys to or from that node.
                        (Some(j), None) => {
                            prop_assert!(old.as_ref() == Some(j) || home.as_ref() == Some(j));
                        }
                        _ => prop_assert!(false, "key {} moved with no membership change", key),
                    }
                }
            }
            before = after;
        }
    }
}
