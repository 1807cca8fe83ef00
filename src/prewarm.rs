//! Prewarm: start warming a Worker while its client's TLS handshake is still
//! under way.
//!
//! # The model
//!
//! A TLS ClientHello names the host before any request arrives (its SNI).
//! The front door maps it to a script ID with the same rule as the Host
//! header ([`crate::front_door::script_id_from_host`]) and, without delaying the
//! handshake, asks for the Worker to be prepared where the request will be
//! served: the routing decision that the request itself will take
//! ([`hearth_sharding::routing::decide`]) says *here* (warm here, or this
//! node is its home, or no cluster) or *at its home*, which gets a
//! `ShardServer.prewarm` call. A prewarm runs what a cold start runs before
//! the handler ([`hearth_runtime::Runtime::prewarm`]); the request that
//! follows finds the Worker resident with an idle instance and reports
//! `x-hearth-start: prewarmed`.
//!
//! # Bounds
//!
//! A ClientHello costs a client nothing, so every prewarm is optional work
//! that must never crowd out requests:
//!
//! * one prewarm in flight per Worker per node (a second hint for the same
//!   Worker is dropped as a duplicate);
//! * at most [`PrewarmConfig::max_concurrent`] in flight per node, counting
//!   calls sent to homes; more are dropped, never queued;
//! * none when the Worker would not fit without evicting a Worker used
//!   within the busy window ([`hearth_runtime::Prewarm::NoRoom`]), so a
//!   prewarm never evicts a busier Worker and memory pressure drops
//!   prewarms first;
//! * a home applies the same bounds to the calls it receives.
//!
//! Everything is counted in `hearth_prewarms_total{at, outcome}`; requests
//! that found their Worker ready thanks to a prewarm are
//! `hearth_prewarmed_requests_total`.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use hearth_runtime::{Prewarm, Runtime};
use hearth_sharding::hosted_workers::PrewarmOutcome;
use hearth_sharding::ring::Member;
use hearth_sharding::rpc::RpcNode;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;

/// How a node prewarms.
#[derive(Debug, Clone, Copy)]
pub struct PrewarmConfig {
    /// Whether a ClientHello's SNI starts a prewarm at all (default on).
    pub enabled: bool,
    /// Prewarms in flight at once on this node, here or sent to homes
    /// (default 4); more are dropped.
    pub max_concurrent: usize,
}

impl Default for PrewarmConfig {
    fn default() -> Self {
        PrewarmConfig {
            enabled: true,
            max_concurrent: 4,
        }
    }
}

/// Labels of `hearth_prewarms_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PrewarmLabels {
    /// `here` (on this node) or `home` (a call sent to the Worker's home).
    pub at: &'static str,
    /// `started`, then one of `loaded`, `already_warm`, `dropped_memory`
    /// (here: it would not fit), `dropped_by_home`, `failed`, or
    /// `unreachable` (home: the call failed); or, instead of starting,
    /// `dropped_duplicate` or `dropped_cap`.
    pub outcome: &'static str,
}

/// Where a prewarm runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum At {
    /// On this node.
    Here,
    /// At the Worker's home, through the cluster RPC.
    Home,
}

impl At {
    fn label(self) -> &'static str {
        match self {
            At::Here => "here",
            At::Home => "home",
        }
    }
}

/// A node's prewarms: the bounds above, and their counters.
pub struct Prewarmer {
    config: PrewarmConfig,
    runtime: Runtime,
    in_flight: Mutex<HashSet<String>>,
    counts: Family<PrewarmLabels, Counter>,
}

/// A prewarm's place among those in flight; given back on drop.
struct Ticket {
    owner: Arc<Prewarmer>,
    script_id: String,
}

impl Drop for Ticket {
    fn drop(&mut self) {
        self.owner.lock().remove(&self.script_id);
    }
}

impl Prewarmer {
    /// Prewarms for `runtime` under `config`, counted in `counts`.
    pub fn new(
        config: PrewarmConfig,
        runtime: Runtime,
        counts: Family<PrewarmLabels, Counter>,
    ) -> Self {
        Prewarmer {
            config,
            runtime,
            in_flight: Mutex::new(HashSet::new()),
            counts,
        }
    }

    /// The settings.
    pub fn config(&self) -> PrewarmConfig {
        self.config
    }

    /// How many prewarms at `at` ended (or were dropped) with `outcome`
    /// (a [`PrewarmLabels::outcome`] value).
    pub fn count(&self, at: At, outcome: &'static str) -> u64 {
        self.counts
            .get_or_create(&PrewarmLabels {
                at: at.label(),
                outcome,
            })
            .get()
    }

    /// Prewarms in flight now.
    pub fn in_flight(&self) -> usize {
        self.lock().len()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashSet<String>> {
        self.in_flight.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn bump(&self, at: At, outcome: &'static str) {
        self.counts
            .get_or_create(&PrewarmLabels {
                at: at.label(),
                outcome,
            })
            .inc();
    }

    /// A place for a prewarm of `script_id`, or the reason there is none.
    fn admit(self: &Arc<Self>, at: At, script_id: &str) -> Option<Ticket> {
        let mut in_flight = self.lock();
        let dropped = if in_flight.contains(script_id) {
            "dropped_duplicate"
        } else if in_flight.len() >= self.config.max_concurrent {
            "dropped_cap"
        } else {
            in_flight.insert(script_id.to_string());
            return Some(Ticket {
                owner: self.clone(),
                script_id: script_id.to_string(),
            });
        };
        drop(in_flight);
        self.bump(at, dropped);
        None
    }

    /// Prewarms `script_id` on this node, within the bounds, and returns
    /// what it did. Dropping the future does not stop a load that started
    /// (a request may be waiting for it).
    pub async fn here(self: &Arc<Self>, script_id: &str) -> PrewarmOutcome {
        let Some(ticket) = self.admit(At::Here, script_id) else {
            return PrewarmOutcome::Dropped;
        };
        self.bump(At::Here, "started");
        let me = self.clone();
        // Its own task, holding the place, so the load runs to the end
        // whoever stops waiting for it.
        let task = tokio::spawn(async move {
            let id = &ticket.script_id;
            let outcome = match me.runtime.prewarm(id).await {
                Ok(Prewarm::Loaded) => PrewarmOutcome::Loaded,
                Ok(Prewarm::AlreadyWarm) => PrewarmOutcome::AlreadyWarm,
                Ok(Prewarm::NoRoom) => {
                    me.bump(At::Here, "dropped_memory");
                    return PrewarmOutcome::Dropped;
                }
                Err(e) => {
                    tracing::debug!(script = %id, error = %e, "prewarm failed");
                    PrewarmOutcome::Failed
                }
            };
            me.bump(At::Here, outcome.as_str());
            drop(ticket);
            outcome
        });
        task.await.unwrap_or(PrewarmOutcome::Failed)
    }

    /// Asks `home` to prewarm `script_id` through `rpc`, within this node's
    /// bounds (the home applies its own), and returns what the home did.
    pub async fn at_home(
        self: &Arc<Self>,
        rpc: &RpcNode,
        home: &Member,
        script_id: &str,
    ) -> PrewarmOutcome {
        let Some(_ticket) = self.admit(At::Home, script_id) else {
            return PrewarmOutcome::Dropped;
        };
        self.bump(At::Home, "started");
        match rpc.prewarm(home, script_id).await {
            Ok(PrewarmOutcome::Dropped) => {
                self.bump(At::Home, "dropped_by_home");
                PrewarmOutcome::Dropped
            }
            Ok(outcome) => {
                self.bump(At::Home, outcome.as_str());
                outcome
            }
            Err(e) => {
                tracing::debug!(script = script_id, home = %home.id, error = %e, "prewarm call failed");
                self.bump(At::Home, "unreachable");
                PrewarmOutcome::Failed
            }
        }
    }
}
