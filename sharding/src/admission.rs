//! When a home refuses a sharded request: admission control on the shard
//! server.
//!
//! A Worker instance can use minutes of CPU per request, so sending all of a
//! Worker's traffic to its home could swamp the home. The home therefore
//! admits a sharded request only while, counting requests it admitted and has
//! not finished:
//!
//! * the node as a whole has fewer than [`OverloadConfig::max_in_flight_node`]
//!   in flight,
//! * that Worker has fewer than [`OverloadConfig::max_in_flight_per_worker`]
//!   in flight, and
//! * the node can host the Worker without evicting busier ones
//!   ([`crate::hosted_workers::HostedWorkers::can_host`]).
//!
//! Otherwise it refuses by handing the caller's own lazy capability back
//! (see [`crate::shard_server`]); the caller then serves the request itself
//! and keeps the Worker warm locally, which is how a hot Worker spreads over
//! the data center. A refusal is never an error to the end user.
//!
//! A request for a **Durable Object** (its ring key,
//! [`crate::routing::is_object_key`]) is always admitted, and counted: it
//! cannot be served anywhere but its home (a refusal would be a 503, not a
//! fallback, [`crate::routing::may_fall_back`]), and its object serves one
//! request at a time anyway, so its requests queue at the object's input
//! gate until their deadline.
//!
//! Admission returns a [`Permit`] that counts the request as in flight until
//! it is dropped, so the counters cannot leak however a request ends.
//!
//! The rule itself is [`admit`], a pure function of the counters: the live
//! gate ([`OverloadGate::try_admit`]) and the data-center simulator both
//! call it, as they both call [`crate::routing::decide`].
//!
//! # Words
//!
//! A home is **overloaded** for a request when admitting it would pass one
//! of the thresholds ([`OverloadConfig`]: per Worker, per node) or evict a
//! busier Worker; the type names keep that word (`OverloadConfig`,
//! [`OverloadGate`]). It then **refuses** the request: the caller gets its
//! lazy capability back and serves it itself (a *fallback*), the refusal is
//! counted by [`RefusalReason`] (`/metrics`), and a caller whose own gate
//! refuses a peer's call on that capability answers the Cap'n Proto error
//! `overloaded`.

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

/// Thresholds of a home's admission control.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OverloadConfig {
    /// Sharded requests one Worker may have in flight on its home before the
    /// home refuses more (default 64). A Worker that needs more than this is
    /// busy enough to be served on several nodes.
    pub max_in_flight_per_worker: usize,
    /// Sharded requests the home may have in flight over all Workers
    /// (default 1024).
    pub max_in_flight_node: usize,
}

/// The admission rule: whether a home admits one more sharded request for a
/// Worker that has `worker_in_flight` of them in flight, on a node with
/// `node_in_flight`, and if not, why.
///
/// The checks run in this order: the node limit, the Worker's limit, then
/// `can_host`, which is asked only when the counters allow the request since
/// it may cost more than a counter check.
pub fn admit(
    config: &OverloadConfig,
    node_in_flight: usize,
    worker_in_flight: usize,
    can_host: impl FnOnce() -> bool,
) -> Result<(), RefusalReason> {
    if node_in_flight >= config.max_in_flight_node {
        Err(RefusalReason::NodeBusy)
    } else if worker_in_flight >= config.max_in_flight_per_worker {
        Err(RefusalReason::WorkerBusy)
    } else if !can_host() {
        Err(RefusalReason::NoMemory)
    } else {
        Ok(())
    }
}

impl Default for OverloadConfig {
    fn default() -> Self {
        OverloadConfig {
            max_in_flight_per_worker: 64,
            max_in_flight_node: 1024,
        }
    }
}

/// Why a home refused a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RefusalReason {
    /// The Worker has [`OverloadConfig::max_in_flight_per_worker`] requests in
    /// flight here.
    WorkerBusy,
    /// The node has [`OverloadConfig::max_in_flight_node`] requests in flight.
    NodeBusy,
    /// The node has no memory for the Worker without evicting busier ones.
    NoMemory,
}

impl RefusalReason {
    /// A short label for logs and metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            RefusalReason::WorkerBusy => "worker_busy",
            RefusalReason::NodeBusy => "node_busy",
            RefusalReason::NoMemory => "no_memory",
        }
    }
}

impl fmt::Display for RefusalReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Counters of an [`OverloadGate`], as a snapshot.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct OverloadStats {
    /// Requests admitted so far.
    pub admitted: u64,
    /// Refusals for [`RefusalReason::WorkerBusy`].
    pub refused_worker_busy: u64,
    /// Refusals for [`RefusalReason::NodeBusy`].
    pub refused_node_busy: u64,
    /// Refusals for [`RefusalReason::NoMemory`].
    pub refused_no_memory: u64,
    /// Requests in flight right now.
    pub in_flight: usize,
}

impl OverloadStats {
    /// All refusals sent, whatever the reason.
    pub fn refused(&self) -> u64 {
        self.refused_worker_busy + self.refused_node_busy + self.refused_no_memory
    }
}

/// A home's admission control: in-flight counters and the thresholds.
///
/// Shared by every connection and RPC thread of a node (it is `Send + Sync`).
#[derive(Debug)]
pub struct OverloadGate {
    config: OverloadConfig,
    node_in_flight: AtomicUsize,
    per_worker: Mutex<HashMap<String, usize>>,
    admitted: AtomicU64,
    refused_worker_busy: AtomicU64,
    refused_node_busy: AtomicU64,
    refused_no_memory: AtomicU64,
}

impl OverloadGate {
    /// A gate with no request in flight.
    pub fn new(config: OverloadConfig) -> Arc<Self> {
        Arc::new(OverloadGate {
            config,
            node_in_flight: AtomicUsize::new(0),
            per_worker: Mutex::new(HashMap::new()),
            admitted: AtomicU64::new(0),
            refused_worker_busy: AtomicU64::new(0),
            refused_node_busy: AtomicU64::new(0),
            refused_no_memory: AtomicU64::new(0),
        })
    }

    /// The thresholds in force.
    pub fn config(&self) -> OverloadConfig {
        self.config
    }

    /// Admits a request for `script_id` by the rule of [`admit`], or says
    /// why not. `can_host` is asked only when the counters allow the
    /// request, since it may cost more than a counter check.
    pub fn try_admit(
        self: &Arc<Self>,
        script_id: &str,
        can_host: impl FnOnce() -> bool,
    ) -> Result<Permit, RefusalReason> {
        let mut per_worker = self.lock();
        // An object's home takes every request for it (see the module docs).
        let verdict = if crate::routing::is_object_key(script_id) {
            Ok(())
        } else {
            admit(
                &self.config,
                self.node_in_flight.load(Ordering::Acquire),
                per_worker.get(script_id).copied().unwrap_or(0),
                can_host,
            )
        };
        if let Err(reason) = verdict {
            drop(per_worker);
            self.counter(reason).fetch_add(1, Ordering::Relaxed);
            return Err(reason);
        }
        *per_worker.entry(script_id.to_string()).or_insert(0) += 1;
        self.node_in_flight.fetch_add(1, Ordering::AcqRel);
        drop(per_worker);
        self.admitted.fetch_add(1, Ordering::Relaxed);
        Ok(Permit {
            gate: Arc::clone(self),
            script_id: script_id.to_string(),
        })
    }

    /// Requests for `script_id` in flight now.
    pub fn in_flight_for(&self, script_id: &str) -> usize {
        self.lock().get(script_id).copied().unwrap_or(0)
    }

    /// Counters, as a snapshot.
    pub fn stats(&self) -> OverloadStats {
        OverloadStats {
            admitted: self.admitted.load(Ordering::Relaxed),
            refused_worker_busy: self.refused_worker_busy.load(Ordering::Relaxed),
            refused_node_busy: self.refused_node_busy.load(Ordering::Relaxed),
            refused_no_memory: self.refused_no_memory.load(Ordering::Relaxed),
            in_flight: self.node_in_flight.load(Ordering::Acquire),
        }
    }

    fn counter(&self, reason: RefusalReason) -> &AtomicU64 {
        match reason {
            RefusalReason::WorkerBusy => &self.refused_worker_busy,
            RefusalReason::NodeBusy => &self.refused_node_busy,
            RefusalReason::NoMemory => &self.refused_no_memory,
        }
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<String, usize>> {
        // The map holds plain counters, consistent after any panic.
        self.per_worker.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn release(&self, script_id: &str) {
        let mut per_worker = self.lock();
        if let Some(n) = per_worker.get_mut(script_id) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                per_worker.remove(script_id);
            }
        }
        self.node_in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}

/// One admitted request, counted as in flight until dropped.
#[derive(Debug)]
pub struct Permit {
    gate: Arc<OverloadGate>,
    script_id: String,
}

impl Permit {
    /// The Worker this permit was admitted for.
    pub fn script_id(&self) -> &str {
        &self.script_id
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        self.gate.release(&self.script_id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gate(per_worker: usize, node: usize) -> Arc<OverloadGate> {
        OverloadGate::new(OverloadConfig {
            max_in_flight_per_worker: per_worker,
            max_in_flight_node: node,
        })
    }

    #[test]
    fn defaults_are_documented_values() {
        let c = OverloadConfig::default();
        assert_eq!(
            (c.max_in_flight_per_worker, c.max_in_flight_node),
            (64, 1024)
        );
    }

    #[test]
    fn an_objects_home_admits_every_request_for_it_and_counts_them() {
        let g = gate(1, 1);
        let key = "do:counter/Counter/00";
        let p1 = g
            .try_admit(key, || false)
            .expect("an object is always admitted");
        let _p2 = g
            .try_admit(key, || false)
            .expect("past every threshold too");
        assert_eq!(g.in_flight_for(key), 2);
        // The objects' requests count toward the node's in flight.
        assert_eq!(
            g.try_admit("w", || true).unwrap_err(),
            RefusalReason::NodeBusy
        );
        drop(p1);
        assert_eq!(g.in_flight_for(key), 1);
    }

    #[test]
    fn a_worker_over_its_limit_is_refused_while_others_are_admitted() {
        let g = gate(2, 100);
        let a1 = g.try_admit("a", || true).unwrap();
        let _a2 = g.try_admit("a", || true).unwrap();
        assert_eq!(
            g.try_admit("a", || true).unwrap_err(),
            RefusalReason::WorkerBusy
        );
        let _b = g.try_admit("b", || true).unwrap();
        drop(a1);
        assert!(g.try_admit("a", || true).is_ok());
        assert_eq!(g.stats().refused_worker_busy, 1);
    }

    #[test]
    fn the_node_limit_applies_across_workers() {
        let g = gate(10, 2);
        let _a = g.try_admit("a", || true).unwrap();
        let _b = g.try_admit("b", || true).unwrap();
        assert_eq!(
            g.try_admit("c", || true).unwrap_err(),
            RefusalReason::NodeBusy
        );
    }

    #[test]
    fn no_memory_refuses_and_is_only_asked_when_counters_allow() {
        let g = gate(0, 10);
        let mut asked = false;
        assert_eq!(
            g.try_admit("a", || {
                asked = true;
                true
            })
            .unwrap_err(),
            RefusalReason::WorkerBusy
        );
        assert!(!asked);
        let g = gate(10, 10);
        assert_eq!(
            g.try_admit("a", || false).unwrap_err(),
            RefusalReason::NoMemory
        );
        assert_eq!(g.stats().refused(), 1);
    }

    #[test]
    fn the_rule_checks_node_then_worker_then_memory() {
        let c = OverloadConfig {
            max_in_flight_per_worker: 2,
            max_in_flight_node: 4,
        };
        assert_eq!(admit(&c, 4, 2, || false), Err(RefusalReason::NodeBusy));
        assert_eq!(admit(&c, 3, 2, || false), Err(RefusalReason::WorkerBusy));
        assert_eq!(admit(&c, 3, 1, || false), Err(RefusalReason::NoMemory));
        assert_eq!(admit(&c, 3, 1, || true), Ok(()));
    }

    #[test]
    fn dropping_permits_returns_counters_to_zero() {
        let g = gate(10, 10);
        let permits: Vec<_> = (0..5).map(|_| g.try_admit("a", || true).unwrap()).collect();
        assert_eq!(g.in_flight_for("a"), 5);
        assert_eq!(g.stats().in_flight, 5);
        drop(permits);
        assert_eq!(g.in_flight_for("a"), 0);
        assert_eq!(g.stats().in_flight, 0);
        assert_eq!(g.stats().admitted, 5);
    }
}
