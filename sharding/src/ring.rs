//! The consistent hash ring: which node is a Worker's *home*.
//!
//! # Model
//!
//! Picture the 64-bit integers as a circle (`u64::MAX` is followed by 0).
//! Every node is hashed onto that circle at many places, its *points*
//! (virtual nodes): `vnodes × weight` of them. A script ID is hashed onto the
//! circle at one place, and its home is the owner of the first point at or
//! after it, wrapping past the top to the lowest point. That is the whole
//! algorithm, the same as groupcache's `consistenthash` and as the HTTP
//! cache sharding the design borrows it from.
//!
//! What follows from it, and what the rest of hearth relies on:
//!
//! - **Determinism.** A ring is a pure function of the set of nodes (IDs and
//!   weights) and the [`RingConfig`]. Every node that sees the same
//!   membership computes the same home for every Worker, with no
//!   coordination, whatever order it learned the members in.
//! - **Minimal movement.** Removing a node removes only its points: the
//!   Workers it owned move to their next distinct node on the circle
//!   ([`Ring::successors`]`(id, 2)[1]` on the old ring), and no other Worker
//!   moves. Adding a node moves only the Workers that land on its new points.
//!   With `N` equal nodes that is about `1/N` of all Workers either way.
//! - **Balance.** With many points per node, each node's share of the circle
//!   is close to `weight / total weight`; the spread shrinks like
//!   `1/sqrt(vnodes)`. [`DEFAULT_VNODES`] is chosen from the measurements in
//!   `sharding/BENCH-ring.md`.
//! - **Succession.** Walking on from the home gives the next distinct
//!   nodes ([`Ring::successors`]): the node that inherits a Worker when its
//!   home leaves the ring. Nothing is copied or replicated to them, and a
//!   home that is still on the ring but unreachable is not skipped: the node
//!   that received the request serves it itself
//!   ([`crate::routing::Route::Fallback`]).
//!
//! Lookups are a binary search over the sorted points, started from a small
//! bucket index on the positions' top bits so that a 300-node ring of 1.2 M
//! points costs a few cache misses rather than twenty.
//!
//! A [`Ring`] is an immutable value. Membership changes build a new ring and
//! publish it through a [`SharedRing`], which readers (the request path)
//! load wait-free, never blocking on a writer.
//!
//! # Hashing
//!
//! - A script ID's position is the first 8 bytes (little-endian) of
//!   `blake3(script_id)` ([`key_position`]).
//! - A node's points are read 8 bytes at a time from the blake3 extendable
//!   output of its ID (in `derive_key` mode, so node points and script
//!   positions live in separate hash domains). Point `i` of a node is the
//!   same whatever its weight, so raising a weight only adds points.
//! - Two nodes' points colliding (about one chance in 2^64 per pair) is broken
//!   by node ID order, so even then the ring depends only on the membership.
//!
//! # Example
//!
//! ```
//! use hearth_sharding::ring::{Member, Ring, RingConfig};
//!
//! let nodes = ["a", "b", "c"].map(|id| Member::new(id, "127.0.0.1:7000".parse().unwrap()));
//! let ring = Ring::new(nodes, RingConfig::default()).unwrap();
//! let home = ring.home("my-worker").unwrap();
//! let successors = ring.successors("my-worker", 2);
//! assert_eq!(successors[0].id, home.id);
//! ```

use std::fmt;
use std::net::SocketAddr;
use std::sync::Arc;

use arc_swap::{ArcSwap, Guard};
use serde::{Deserialize, Serialize};

/// Points per unit of weight used by [`RingConfig::default`].
///
/// Chosen from the balance curve in `sharding/BENCH-ring.md`. A node's share
/// of the circle varies by about `1/sqrt(vnodes)`, and counting a finite
/// sample of script IDs adds its own noise, so the requirement "with 300
/// equal nodes, the most loaded owns at most 1.10× the mean of 10^6 keys"
/// needs more points than one might guess: at 1024 half of the membership
/// sets we tried exceed 1.10, at 2048 one in sixteen, at 4096 none (worst
/// 1.09, exact share within ~1.06×). The price is ~12 bytes per point
/// (15 MB for 300 nodes), a rebuild of tens of milliseconds on a membership
/// change, and a lookup that the bucket index keeps at a few cache misses.
pub const DEFAULT_VNODES: u32 = 4096;

/// Upper bound on the total number of points in one ring: ~100 MB of ring,
/// about three times that briefly while building it.
///
/// Weights arrive from configuration and from gossip; this keeps a typo or
/// a hostile weight from making a ring rebuild allocate without bound.
pub const MAX_POINTS: u64 = 1 << 23;

/// Domain-separation context for node points.
const NODE_POINTS_CONTEXT: &str = "hearth-sharding 2025-01 ring node points";

/// A node's identity in the cluster: stable across restarts of the same
/// server, and what its ring points are derived from.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct NodeId(String);

impl NodeId {
    /// Wraps a node ID.
    pub fn new(id: impl Into<String>) -> Self {
        Self(id.into())
    }

    /// The ID as a string slice.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for NodeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for NodeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.0, f)
    }
}

impl From<&str> for NodeId {
    fn from(id: &str) -> Self {
        Self(id.to_owned())
    }
}

impl From<String> for NodeId {
    fn from(id: String) -> Self {
        Self(id)
    }
}

impl AsRef<str> for NodeId {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

/// A member of the cluster as the ring and the shard client see it: an ID,
/// an RPC address and a weight (the node itself, front door and runtime, is
/// `hearth::node::Node`).
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Member {
    /// Stable identity; the node's ring points are derived from it.
    pub id: NodeId,
    /// Where its shard server (Cap'n Proto RPC) listens.
    pub rpc_addr: SocketAddr,
    /// Relative capacity: a node of weight 2 owns twice the Workers of a
    /// node of weight 1. Must be at least 1.
    #[serde(default = "default_weight")]
    pub weight: u32,
}

fn default_weight() -> u32 {
    1
}

impl Member {
    /// A member of weight 1.
    pub fn new(id: impl Into<NodeId>, rpc_addr: SocketAddr) -> Self {
        Self {
            id: id.into(),
            rpc_addr,
            weight: 1,
        }
    }

    /// The same member with another weight.
    pub fn with_weight(mut self, weight: u32) -> Self {
        self.weight = weight;
        self
    }
}

/// How a ring is laid out. Every node of a cluster must use the same
/// config, or they will disagree about homes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct RingConfig {
    /// Points per unit of weight: a node gets `vnodes × weight` points.
    pub vnodes: u32,
}

impl Default for RingConfig {
    fn default() -> Self {
        Self {
            vnodes: DEFAULT_VNODES,
        }
    }
}

impl RingConfig {
    /// A config with `vnodes` points per unit of weight.
    pub fn with_vnodes(vnodes: u32) -> Self {
        Self { vnodes }
    }
}

/// Why a ring could not be built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RingError {
    /// `RingConfig::vnodes` was 0: no node would own anything.
    #[error("ring config has 0 vnodes per unit of weight")]
    ZeroVnodes,
    /// A node had weight 0; leave it out of the ring instead.
    #[error("node {0} has weight 0")]
    ZeroWeight(NodeId),
    /// The same node ID was given twice.
    #[error("node {0} appears more than once")]
    DuplicateNode(NodeId),
    /// `vnodes × total weight` exceeds [`MAX_POINTS`].
    #[error("ring would have {points} points, more than the limit of {max}")]
    TooManyPoints {
        /// Points the ring would have had.
        points: u64,
        /// The limit, [`MAX_POINTS`].
        max: u64,
    },
}

/// The position of a script ID on the ring: the first 8 bytes of its blake3
/// hash, little-endian.
pub fn key_position(script_id: &str) -> u64 {
    let hash = blake3::hash(script_id.as_bytes());
    let mut first = [0u8; 8];
    first.copy_from_slice(&hash.as_bytes()[..8]);
    u64::from_le_bytes(first)
}

/// An immutable consistent hash ring over a set of nodes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ring {
    config: RingConfig,
    /// Sorted by ID, so the layout does not depend on insertion order.
    nodes: Vec<Member>,
    /// Point positions, ascending.
    points: Vec<u64>,
    /// `owners[i]` is the index in `nodes` of the owner of `points[i]`.
    owners: Vec<u32>,
    /// Lookup shortcut: the points whose top `index_bits` bits equal `b`
    /// are `points[index[b]..index[b + 1]]`, a handful, so a lookup costs
    /// two or three cache misses instead of one per binary-search step.
    index: Vec<u32>,
    index_bits: u32,
}

impl Default for Ring {
    /// The empty ring: every lookup answers `None`.
    fn default() -> Self {
        Self {
            config: RingConfig::default(),
            nodes: Vec::new(),
            points: Vec::new(),
            owners: Vec::new(),
            index: vec![0, 0],
            index_bits: 0,
        }
    }
}

impl Ring {
    /// Builds the ring for a membership snapshot. The order of `nodes` does
    /// not matter.
    pub fn new(
        nodes: impl IntoIterator<Item = Member>,
        config: RingConfig,
    ) -> Result<Self, RingError> {
        if config.vnodes == 0 {
            return Err(RingError::ZeroVnodes);
        }
        let mut nodes: Vec<Member> = nodes.into_iter().collect();
        nodes.sort_by(|a, b| a.id.cmp(&b.id));
        let mut total: u64 = 0;
        for (i, node) in nodes.iter().enumerate() {
            if node.weight == 0 {
                return Err(RingError::ZeroWeight(node.id.clone()));
            }
            if i > 0 && nodes[i - 1].id == node.id {
                return Err(RingError::DuplicateNode(node.id.clone()));
            }
            total += u64::from(node.weight) * u64::from(config.vnodes);
        }
        if total > MAX_POINTS {
            return Err(RingError::TooManyPoints {
                points: total,
                max: MAX_POINTS,
            });
        }

        // (position, owner index): sorting the pairs breaks position ties by
        // node ID order, since `nodes` is sorted by ID.
        let mut pairs: Vec<(u64, u32)> = Vec::with_capacity(total as usize);
        let mut buf = vec![0u8; 8 * 1024];
        for (owner, node) in (0u32..).zip(&nodes) {
            let mut xof = blake3::Hasher::new_derive_key(NODE_POINTS_CONTEXT)
                .update(node.id.as_str().as_bytes())
                .finalize_xof();
            let mut left = node.weight as usize * config.vnodes as usize;
            while left > 0 {
                let n = left.min(buf.len() / 8);
                let chunk = &mut buf[..n * 8];
                xof.fill(chunk);
                pairs.extend(chunk.chunks_exact(8).map(|b| {
                    let mut p = [0u8; 8];
                    p.copy_from_slice(b);
                    (u64::from_le_bytes(p), owner)
                }));
                left -= n;
            }
        }
        // Sort by bucket (the index's top bits) in one counting pass, then
        // each bucket's handful of points: linear time, and it leaves the
        // index built.
        let index_bits = (usize::BITS - pairs.len().leading_zeros()).saturating_sub(3);
        let mut index = vec![0u32; (1 << index_bits) + 1];
        for &(position, _) in &pairs {
            index[bucket_of(position, index_bits) as usize + 1] += 1;
        }
        for b in 1..index.len() {
            index[b] += index[b - 1];
        }
        let mut next = index.clone();
        let mut sorted = vec![(0u64, 0u32); pairs.len()];
        for pair in pairs {
            let slot = &mut next[bucket_of(pair.0, index_bits) as usize];
            sorted[*slot as usize] = pair;
            *slot += 1;
        }
        for bucket in index.windows(2) {
            sorted[bucket[0] as usize..bucket[1] as usize].sort_unstable();
        }
        let (points, owners): (Vec<u64>, Vec<u32>) = sorted.into_iter().unzip();
        Ok(Self {
            config,
            nodes,
            points,
            owners,
            index,
            index_bits,
        })
    }

    /// The home of `script_id`: the node owning the first point at or after
    /// its position. `None` only for an empty ring.
    pub fn home(&self, script_id: &str) -> Option<&Member> {
        self.home_at(key_position(script_id))
    }

    /// The node owning the first point at or after `position` (see
    /// [`key_position`]), for callers that hash keys themselves.
    pub fn home_at(&self, position: u64) -> Option<&Member> {
        let i = self.point_at_or_after(position)?;
        Some(&self.nodes[self.owners[i] as usize])
    }

    /// The home of `script_id` followed by the next distinct nodes clockwise:
    /// up to `n` nodes, fewer if the ring has fewer: who becomes the home as
    /// the nodes before it leave the ring. Shown by the admin API's ring
    /// view; requests are never sent to a successor while the home is a
    /// member.
    pub fn successors(&self, script_id: &str, n: usize) -> Vec<&Member> {
        let want = n.min(self.nodes.len());
        let mut picked: Vec<u32> = Vec::with_capacity(want);
        if let Some(start) = self.point_at_or_after(key_position(script_id)) {
            let (before, after) = self.owners.split_at(start);
            for &owner in after.iter().chain(before) {
                if picked.len() == want {
                    break;
                }
                if !picked.contains(&owner) {
                    picked.push(owner);
                }
            }
        }
        picked
            .into_iter()
            .map(|i| &self.nodes[i as usize])
            .collect()
    }

    /// The members, sorted by ID.
    pub fn members(&self) -> &[Member] {
        &self.nodes
    }

    /// The member with this ID, if any.
    pub fn get(&self, id: &NodeId) -> Option<&Member> {
        self.nodes
            .binary_search_by(|n| n.id.cmp(id))
            .ok()
            .map(|i| &self.nodes[i])
    }

    /// Whether `id` is a member.
    pub fn contains(&self, id: &NodeId) -> bool {
        self.get(id).is_some()
    }

    /// Number of members.
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// Whether the ring has no members.
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// Total number of points (virtual nodes).
    pub fn num_points(&self) -> usize {
        self.points.len()
    }

    /// The config this ring was built with.
    pub fn config(&self) -> RingConfig {
        self.config
    }

    /// The exact fraction of the hash space each member owns (the share of
    /// all possible script IDs homed on it), in [`Ring::members`] order. Sums
    /// to 1 for a non-empty ring. For metrics and balance reports.
    pub fn ownership(&self) -> Vec<(&Member, f64)> {
        let mut owned = vec![0u128; self.nodes.len()];
        let n = self.points.len();
        for i in 0..n {
            // Point i owns the arc (points[i-1], points[i]]; the first point
            // owns the arc that wraps past u64::MAX.
            let arc = if n == 1 {
                1u128 << 64
            } else {
                let prev = self.points[(i + n - 1) % n];
                u128::from(self.points[i].wrapping_sub(prev))
            };
            owned[self.owners[i] as usize] += arc;
        }
        let whole = (1u128 << 64) as f64;
        self.nodes
            .iter()
            .zip(owned)
            .map(|(node, arc)| (node, arc as f64 / whole))
            .collect()
    }

    fn point_at_or_after(&self, position: u64) -> Option<usize> {
        if self.points.is_empty() {
            return None;
        }
        let bucket = bucket_of(position, self.index_bits) as usize;
        let (lo, hi) = (self.index[bucket] as usize, self.index[bucket + 1] as usize);
        let i = lo + self.points[lo..hi].partition_point(|&p| p < position);
        Some(if i == self.points.len() { 0 } else { i })
    }
}

/// The index bucket of a position: its top `bits` bits.
fn bucket_of(position: u64, bits: u32) -> u64 {
    position.checked_shr(64 - bits).unwrap_or(0)
}

/// The fraction of `keys` whose home differs between `old` and `new`
/// (a key homed on an empty ring counts as moved once it has a home).
/// 0.0 for an empty sample. Membership logs it on every ring change.
pub fn rehomed_fraction<K: AsRef<str>>(
    old: &Ring,
    new: &Ring,
    keys: impl IntoIterator<Item = K>,
) -> f64 {
    let (mut total, mut moved) = (0u64, 0u64);
    for key in keys {
        let position = key_position(key.as_ref());
        total += 1;
        let before = old.home_at(position).map(|n| &n.id);
        let after = new.home_at(position).map(|n| &n.id);
        if before != after {
            moved += 1;
        }
    }
    if total == 0 {
        0.0
    } else {
        moved as f64 / total as f64
    }
}

/// `n` synthetic script IDs (`sample-0`, `sample-1`, …): a fixed sample for
/// estimating [`rehomed_fraction`] without knowing the deployed Workers.
pub fn sample_keys(n: usize) -> impl Iterator<Item = String> {
    (0..n).map(|i| format!("sample-{i}"))
}

/// The current ring, shared between the membership task (the only writer)
/// and the request path (many readers). Clones share the same slot.
///
/// Readers [`load`](SharedRing::load) without locks and never wait for a
/// writer; a writer [`store`](SharedRing::store)s a whole new ring in one
/// atomic swap, so a reader sees either the old ring or the new one, never a
/// mix.
#[derive(Clone, Debug, Default)]
pub struct SharedRing(Arc<ArcSwap<Ring>>);

impl SharedRing {
    /// A shared slot holding `ring`.
    pub fn new(ring: impl Into<Arc<Ring>>) -> Self {
        Self(Arc::new(ArcSwap::new(ring.into())))
    }

    /// The current ring, for a short read (one request's lookups). Cheap and
    /// wait-free; hold it briefly, or use [`load_full`](Self::load_full).
    pub fn load(&self) -> Guard<Arc<Ring>> {
        self.0.load()
    }

    /// The current ring as an owned `Arc`, to keep across awaits.
    pub fn load_full(&self) -> Arc<Ring> {
        self.0.load_full()
    }

    /// Publishes `ring` and returns the ring it replaced.
    pub fn store(&self, ring: impl Into<Arc<Ring>>) -> Arc<Ring> {
        self.0.swap(ring.into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// The bucket index finds the same point as a binary search over all
        /// points, including at the edges and exactly on points.
        #[test]
        fn index_agrees_with_full_binary_search(
            n in 1usize..40,
            vnodes in 1u32..200,
            mut probes in prop::collection::vec(any::<u64>(), 1..100),
        ) {
            let addr: SocketAddr = ([127, 0, 0, 1], 1).into();
            let nodes = (0..n).map(|i| Member::new(format!("n{i}"), addr));
            let ring = Ring::new(nodes, RingConfig::with_vnodes(vnodes)).map_err(|e| TestCaseError::fail(e.to_string()))?;
            prop_assert!(ring.points.windows(2).all(|w| w[0] <= w[1]));
            probes.extend([0, 1, u64::MAX - 1, u64::MAX]);
            probes.extend(ring.points.iter().step_by(7).flat_map(|&p| [p.wrapping_sub(1), p, p.wrapping_add(1)]));
            for p in probes {
                let i = ring.points.partition_point(|&x| x < p);
                let expected = if i == ring.points.len() { 0 } else { i };
                prop_assert_eq!(ring.point_at_or_after(p), Some(expected));
            }
        }
    }
}
