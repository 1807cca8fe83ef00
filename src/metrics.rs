//! Prometheus metrics of a node, served at `/metrics` on the admin listener.
//!
//! Request outcomes (by route and start) and the shard hop latency are
//! recorded live; the runtime's counters and residency gauges are read at
//! scrape time through a collector, so there is one source of truth for them.
//!
//! Per-Worker series (`hearth_worker_requests_total{script}`, `..._errors`,
//! `..._cold_starts`, `hearth_worker_cpu_seconds_total`) have a bounded `script` label ([`WorkerMetrics`]):
//! only the busiest Workers (`metrics_top_workers`, default
//! [`DEFAULT_TOP_WORKERS`]) get their own value, every other Worker is
//! counted under [`OTHER_WORKERS`], so a node hosting thousands of Workers
//! (or asked for thousands of names) exports at most N + 1 series per
//! metric. Per-version series (`hearth_version_requests_total{script,
//! version,outcome}`) exist only for Workers in a gradual rollout
//! ([`hearth_runtime::store::versions`]).

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, OnceLock};

use hearth_runtime::Runtime;
use hearth_sharding::membership::GossipCounters;
use hearth_sharding::ring::{NodeId, SharedRing};
use hearth_sharding::rpc::RpcNode;

/// Labels of a served request.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    /// local, home, sharded or fallback.
    pub route: String,
    /// cold, warm, prewarmed or error.
    pub start: String,
}

/// A node's live metrics.
pub struct Metrics {
    registry: Registry,
    gossip: Arc<OnceLock<GossipCounters>>,
    ring: Arc<OnceLock<(NodeId, SharedRing)>>,
    /// Requests by route and start.
    pub requests: Family<RequestLabels, Counter>,
    /// Latency of the shard hop, seconds.
    pub hop_latency: Histogram,
    /// Prewarms by where they ran and how they ended ([`crate::prewarm`]).
    pub prewarms: Family<crate::prewarm::PrewarmLabels, Counter>,
    /// Requests, errors and cold starts by Worker (top N, the rest
    /// `_other`).
    pub workers: WorkerMetrics,
    /// Durable Object requests whose home refused them or could not be
    /// reached, answered 503 instead of being served on the receiving
    /// node (`hearth_object_home_unavailable_total`, [`crate::node`]).
    pub object_home_unavailable: Counter,
    /// Spans exported, dropped and lost by OpenTelemetry export
    /// ([`crate::telemetry`]; zero while it is off).
    pub otel: crate::telemetry::ExportCounters,
}

/// How many Workers get their own `script` label unless
/// `metrics_top_workers` says otherwise.
pub const DEFAULT_TOP_WORKERS: usize = 50;

/// The `script` label of every Worker outside the top N.
pub const OTHER_WORKERS: &str = "_other";

/// How many Workers' traffic is tracked per labelled one: enough to find
/// the busiest under a long tail, with memory bounded whatever the names.
const TRACKED_PER_TOP: usize = 8;

/// Requests between two re-rankings of the busiest Workers.
const RERANK_EVERY: u64 = 1024;

/// Per-Worker counters with a bounded `script` label: the busiest
/// `top` Workers by recent traffic each have their own series, all others
/// share [`OTHER_WORKERS`].
///
/// Traffic is counted per Worker in a table of at most `TRACKED_PER_TOP ·
/// top` entries (a *space-saving* sketch: a new name takes the place of the
/// least busy one), halved at each re-ranking (every `RERANK_EVERY`
/// requests) so the ranking follows current traffic. A Worker that leaves
/// the top N loses its series once a busier Worker needs the slot (its
/// later requests count under `_other`); while slots are free, an idle
/// Worker keeps its series. Each series only ever grows while it exists,
/// so every counter stays monotonic.
#[derive(Clone, Debug)]
pub struct WorkerMetrics(Arc<Mutex<WorkerTable>>);

/// One series' counts.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct WorkerCounts {
    /// Requests served (or failed) by the Worker on this node.
    pub requests: u64,
    /// Of those, answered with an error (trap, limit, failed load).
    pub errors: u64,
    /// Of those, cold starts (the Worker was loaded for it).
    pub cold_starts: u64,
    /// CPU time its handlers used on this node, in nanoseconds.
    pub cpu_ns: u64,
}

#[derive(Debug)]
struct WorkerTable {
    top: usize,
    traffic: HashMap<String, u64>,
    /// The top Workers at the last re-ranking.
    ranked: HashSet<String>,
    labelled: HashMap<String, WorkerCounts>,
    other: WorkerCounts,
    since_rerank: u64,
}

impl WorkerMetrics {
    /// A table that labels the `top` busiest Workers.
    pub fn new(top: usize) -> Self {
        WorkerMetrics(Arc::new(Mutex::new(WorkerTable {
            top,
            traffic: HashMap::new(),
            ranked: HashSet::new(),
            labelled: HashMap::new(),
            other: WorkerCounts::default(),
            since_rerank: 0,
        })))
    }

    fn table(&self) -> std::sync::MutexGuard<'_, WorkerTable> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Labels the `top` busiest Workers from now on (`metrics_top_workers`).
    pub fn set_top(&self, top: usize) {
        let mut t = self.table();
        t.top = top;
        t.rerank();
    }

    /// Counts one request of `script` that started `start` (`cold`,
    /// `warm`, `prewarmed` or `error`).
    pub fn record(&self, script: &str, start: &str) {
        let mut t = self.table();
        t.count_traffic(script);
        let counts = t.series(script);
        counts.requests += 1;
        match start {
            "error" => counts.errors += 1,
            "cold" => counts.cold_starts += 1,
            _ => {}
        }
        t.since_rerank += 1;
        if t.since_rerank >= RERANK_EVERY {
            t.rerank();
        }
    }

    /// Adds `cpu`, one invocation's handler CPU time, to `script`'s series
    /// (told by the runtime when the invocation ends, after its request
    /// was counted).
    pub fn record_cpu(&self, script: &str, cpu: std::time::Duration) {
        let mut t = self.table();
        let counts = t.series(script);
        counts.cpu_ns = counts
            .cpu_ns
            .saturating_add(u64::try_from(cpu.as_nanos()).unwrap_or(u64::MAX));
    }

    /// Every series now: each labelled Worker, then [`OTHER_WORKERS`].
    pub fn snapshot(&self) -> Vec<(String, WorkerCounts)> {
        let t = self.table();
        let mut out: Vec<(String, WorkerCounts)> =
            t.labelled.iter().map(|(k, v)| (k.clone(), *v)).collect();
        out.sort_by(|a, b| a.0.cmp(&b.0));
        out.push((OTHER_WORKERS.to_string(), t.other));
        out
    }
}

impl WorkerTable {
    /// One more request of `script` in the traffic sketch.
    fn count_traffic(&mut self, script: &str) {
        if let Some(n) = self.traffic.get_mut(script) {
            *n += 1;
            return;
        }
        let cap = self.top.max(1) * TRACKED_PER_TOP;
        let mut start = 1;
        if self.traffic.len() >= cap
            && let Some((least, n)) = self
                .traffic
                .iter()
                .min_by_key(|(_, n)| **n)
                .map(|(k, n)| (k.clone(), *n))
        {
            self.traffic.remove(&least);
            start = n + 1;
        }
        self.traffic.insert(script.to_string(), start);
    }

    /// The series `script`'s request counts under: its own if it has one
    /// or may take a free one (it was among the busiest at the last
    /// ranking, or there has been no full ranking yet), else `_other`.
    fn series(&mut self, script: &str) -> &mut WorkerCounts {
        let admit = !self.labelled.contains_key(script)
            && self.labelled.len() < self.top
            && (self.ranked.len() < self.top || self.ranked.contains(script));
        if admit {
            self.labelled
                .insert(script.to_string(), WorkerCounts::default());
        }
        match self.labelled.get_mut(script) {
            Some(c) => c,
            None => &mut self.other,
        }
    }

    /// Ranks the Workers by traffic since the last ranking (halved since).
    /// A labelled Worker no longer among the top N loses its series only
    /// when a ranked Worker needs the slot (or `top` shrank): with fewer
    /// busy Workers than slots, an idle Worker keeps its series and its
    /// counts, however long it idles.
    fn rerank(&mut self) {
        self.since_rerank = 0;
        let mut by_traffic: Vec<(&String, &u64)> = self.traffic.iter().collect();
        by_traffic.sort_by(|a, b| b.1.cmp(a.1).then_with(|| a.0.cmp(b.0)));
        self.ranked = by_traffic
            .into_iter()
            .take(self.top)
            .map(|(k, _)| k.clone())
            .collect();
        let waiting = self
            .ranked
            .iter()
            .filter(|k| !self.labelled.contains_key(*k))
            .count();
        let over = (self.labelled.len() + waiting).saturating_sub(self.top);
        if over > 0 {
            // The stale series, least traffic first, give up their slots.
            let mut stale: Vec<(u64, String)> = self
                .labelled
                .keys()
                .filter(|k| !self.ranked.contains(*k))
                .map(|k| (self.traffic.get(k).copied().unwrap_or(0), k.clone()))
                .collect();
            stale.sort();
            for (_, k) in stale.into_iter().take(over) {
                self.labelled.remove(&k);
            }
        }
        for n in self.traffic.values_mut() {
            *n /= 2;
        }
        self.traffic.retain(|_, n| *n > 0);
    }
}

struct WorkerCollector(WorkerMetrics);

impl std::fmt::Debug for WorkerCollector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("WorkerCollector")
    }
}

impl Collector for WorkerCollector {
    fn encode(&self, mut enc: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let series = self.0.snapshot();
        type Pick = fn(&WorkerCounts) -> u64;
        let families: [(&str, &str, Pick); 3] = [
            (
                "hearth_worker_requests",
                "Requests by Worker (the busiest metrics_top_workers; the rest as _other)",
                |c| c.requests,
            ),
            (
                "hearth_worker_errors",
                "Requests answered with an error (trap, limit, failed load) by Worker",
                |c| c.errors,
            ),
            (
                "hearth_worker_cold_starts",
                "Requests that loaded their Worker, by Worker",
                |c| c.cold_starts,
            ),
        ];
        for (name, help, pick) in families {
            let c = ConstCounter::new(0u64);
            let mut fam = enc.encode_descriptor(name, help, None, c.metric_type())?;
            for (script, counts) in &series {
                ConstCounter::new(pick(counts))
                    .encode(fam.encode_family(&[("script", script.as_str())])?)?;
            }
        }
        let c = ConstCounter::new(0f64);
        let mut fam = enc.encode_descriptor(
            "hearth_worker_cpu_seconds",
            "CPU time of Worker handlers on this node, by Worker",
            None,
            c.metric_type(),
        )?;
        for (script, counts) in &series {
            ConstCounter::new(counts.cpu_ns as f64 / 1e9)
                .encode(fam.encode_family(&[("script", script.as_str())])?)?;
        }
        Ok(())
    }
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

struct RuntimeCollector(Runtime);

impl std::fmt::Debug for RuntimeCollector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RuntimeCollector")
    }
}

impl Collector for RuntimeCollector {
    fn encode(&self, mut enc: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let s = self.0.stats();
        let counters = [
            (
                "hearth_cold_starts",
                "Requests that loaded their Worker",
                s.cold,
            ),
            (
                "hearth_warm_requests",
                "Requests that found their Worker resident",
                s.warm,
            ),
            (
                "hearth_prewarmed_requests",
                "Requests that found their Worker ready because a prewarm loaded it",
                s.prewarmed,
            ),
            (
                "hearth_prewarm_loads",
                "Workers loaded by a prewarm rather than by a request",
                s.prewarm_loads,
            ),
            (
                "hearth_startup_failures",
                "Instances that failed to start",
                s.startup_failures,
            ),
            (
                "hearth_cpu_limit_kills",
                "Requests stopped at the CPU limit",
                s.cpu_kills,
            ),
            (
                "hearth_memory_limit_kills",
                "Requests stopped at the memory limit",
                s.memory_kills,
            ),
            (
                "hearth_memory_retirements",
                "Reused instances retired after a request for holding over 3/4 of their memory limit",
                s.memory_retirements,
            ),
            ("hearth_traps", "Requests whose Worker trapped", s.traps),
            (
                "hearth_compiles",
                "Components compiled from source",
                s.compiles,
            ),
            (
                "hearth_artifact_loads",
                "Components loaded from artifacts",
                s.artifact_loads,
            ),
            (
                "hearth_artifacts_rejected",
                "Artifacts refused and recompiled",
                s.artifacts_rejected,
            ),
            (
                "hearth_store_metadata_rejected",
                "Store records refused on read: no MAC, a MAC that does not check, or a source hash that is not 64 lowercase hex digits",
                s.store_metadata_rejected,
            ),
            (
                "hearth_pre_slot_refused",
                "Requests answered 503: their connection or listener had buffered its bound of request bytes before a slot",
                s.pre_slot_refused,
            ),
            (
                "hearth_busy_rejections",
                "Requests answered 503: no instance slot came free in time",
                s.busy,
            ),
            (
                "hearth_wall_limit_kills",
                "Requests stopped at the wall-clock limit",
                s.wall_kills,
            ),
            (
                "hearth_client_timeouts",
                "Requests refused: the client stalled sending its body",
                s.client_timeouts,
            ),
            (
                "hearth_cancelled",
                "Invocations cancelled because the client went away",
                s.cancelled,
            ),
            (
                "hearth_nested_calls",
                "Outgoing requests of Workers that reached a Worker they are bound to",
                s.nested_calls,
            ),
            (
                "hearth_nested_denied",
                "Outgoing requests of Workers denied: not a binding, no outbound Worker",
                s.nested_denied,
            ),
            (
                "hearth_redirects_into_bindings_refused",
                "Redirects from origins whose Location led into .internal (a Worker's bindings), removed before the Worker saw them",
                s.redirects_into_bindings,
            ),
            (
                "hearth_nested_too_deep",
                "Nested calls refused at the flow depth limit (loop-detected)",
                s.nested_too_deep,
            ),
            (
                "hearth_loop_refused",
                "Requests refused at the front door with 508: they had looped through hearth's egress more than max_loop_passes times (CDN-Loop)",
                s.loop_refused,
            ),
            (
                "hearth_nested_queued",
                "Nested calls that waited for a subrequest slot of their invocation",
                s.nested_queued,
            ),
            (
                "hearth_tail_deliveries",
                "Flows delivered to a tail Worker",
                s.tail_deliveries,
            ),
            (
                "hearth_tail_failures",
                "Tail deliveries the tail Worker did not accept",
                s.tail_failures,
            ),
            (
                "hearth_tail_late_reports",
                "Trace reports refused: their flow was already delivered to its tail Workers",
                s.tail_late_reports,
            ),
            (
                "hearth_trace_levels_truncated",
                "Requests whose trace events were cut at a level's bounds (events, bytes)",
                s.trace_levels_truncated,
            ),
            (
                "hearth_live_tail_truncated",
                "Live tail events cut to the per-event byte budget",
                s.live_tail_truncated,
            ),
            (
                "hearth_store_reads",
                "Reads of a script's metadata or source from the script store",
                s.store_reads,
            ),
            (
                "hearth_unknown_scripts",
                "Requests for a script ID with no Worker deployed (answered 404)",
                s.unknown_scripts,
            ),
            (
                "hearth_unknown_cached",
                "Lookups of an unknown script ID answered from the negative cache, without a store read",
                s.unknown_cached,
            ),
            (
                "hearth_dispatch_only_refused",
                "Client requests for a dispatch-only user Worker, refused with a 404",
                s.dispatch_only_refused,
            ),
            (
                "hearth_nested_cpu_refused",
                "Nested calls refused because their flow's CPU budget for nested calls was spent",
                s.nested_cpu_refused,
            ),
            (
                "hearth_object_requests",
                "Requests served by Durable Objects on this node",
                s.object_requests,
            ),
            (
                "hearth_objects_opened",
                "Durable Objects made resident on this node (their storage claimed and restored)",
                s.objects_opened,
            ),
            (
                "hearth_objects_evicted",
                "Idle Durable Objects evicted past [objects] max_resident",
                s.objects_evicted,
            ),
            (
                "hearth_object_alarms_fired",
                "Durable Object alarms whose handler ran and succeeded on this node",
                s.object_alarms_fired,
            ),
            (
                "hearth_object_alarms_failed",
                "Tries of a Durable Object alarm handler that failed on this node (retried with backoff)",
                s.object_alarms_failed,
            ),
            (
                "hearth_objects_superseded",
                "Resident Durable Objects shut down on learning that another owner claimed them",
                s.objects_superseded,
            ),
            (
                "hearth_egress_idle_closed",
                "Idle connections to origins closed to make room under the node's connection cap",
                s.subrequests.idle_closed,
            ),
        ];
        for (name, help, v) in counters {
            let c = ConstCounter::new(v);
            c.encode(enc.encode_descriptor(name, help, None, c.metric_type())?)?;
        }
        {
            let c = ConstCounter::new(0u64);
            let mut fam = enc.encode_descriptor(
                "hearth_evictions",
                "Evictions by cause",
                None,
                c.metric_type(),
            )?;
            for (cause, v) in [
                ("pressure", s.evicted_pressure),
                ("idle", s.evicted_idle),
                ("replaced", s.evicted_replaced),
                ("manual", s.evicted_manual),
            ] {
                ConstCounter::new(v).encode(fam.encode_family(&[("cause", cause)])?)?;
            }
        }
        {
            let c = ConstCounter::new(0u64);
            let mut fam = enc.encode_descriptor(
                "hearth_live_tail_dropped",
                "Live tail events a watcher lost, by the budget that was full (queue: its own, by count or bytes; node: all watchers')",
                None,
                c.metric_type(),
            )?;
            for (reason, v) in [
                ("queue", s.live_tail_dropped_queue),
                ("node", s.live_tail_dropped_node),
            ] {
                ConstCounter::new(v).encode(fam.encode_family(&[("reason", reason)])?)?;
            }
        }
        {
            let c = ConstCounter::new(0u64);
            let mut fam = enc.encode_descriptor(
                "hearth_subrequests",
                "Fetches of origins by Workers, by outcome (ok, denied, private_address, timeout, too_many, too_large, connection_limit, error)",
                None,
                c.metric_type(),
            )?;
            for o in hearth_runtime::outbound::egress::SubrequestOutcome::ALL {
                ConstCounter::new(s.subrequests.get(o))
                    .encode(fam.encode_family(&[("outcome", o.label())])?)?;
            }
        }
        for (name, help, v) in [
            (
                "hearth_resident_workers",
                "Workers resident now",
                s.resident_workers as i64,
            ),
            (
                "hearth_resident_bytes",
                "Bytes accounted to resident Workers",
                s.resident_bytes as i64,
            ),
            (
                "hearth_in_flight",
                "Instances serving a request now",
                s.in_flight as i64,
            ),
            (
                "hearth_live_tail_queued_bytes",
                "Bytes queued for live tail watchers on this node",
                s.live_tail_queued_bytes as i64,
            ),
            (
                "hearth_instance_bytes",
                "Bytes live instances hold (linear memory and tables)",
                s.instance_bytes as i64,
            ),
            (
                "hearth_egress_connections",
                "Connections to origins open now (at most [egress] max_connections)",
                s.subrequests.open_connections as i64,
            ),
        ] {
            let g = ConstGauge::new(v);
            g.encode(enc.encode_descriptor(name, help, None, g.metric_type())?)?;
        }
        // Per version, only for the scripts being rolled out (a split):
        // bounded by the scripts in a split times their versions
        // ([`hearth_runtime::store::versions`]).
        let counts = self.0.version_counts();
        let c = ConstCounter::new(0u64);
        let mut fam = enc.encode_descriptor(
            "hearth_version_requests",
            "Requests by version of the Workers in a gradual rollout (split), by outcome",
            None,
            c.metric_type(),
        )?;
        for (script, versions) in &counts {
            for v in versions {
                let version = v.version.to_string();
                for (outcome, n) in [("ok", v.requests - v.errors), ("error", v.errors)] {
                    ConstCounter::new(n).encode(fam.encode_family(&[
                        ("script", script.as_str()),
                        ("version", version.as_str()),
                        ("outcome", outcome),
                    ])?)?;
                }
            }
        }
        Ok(())
    }
}

struct RpcCollector(Arc<OnceLock<RpcNode>>);

impl std::fmt::Debug for RpcCollector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RpcCollector")
    }
}

impl Collector for RpcCollector {
    fn encode(&self, mut enc: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let s = self.0.get().map(|r| r.stats()).unwrap_or_default();
        let sharded_fraction = if s.forwarded == 0 {
            0.0
        } else {
            s.sharded as f64 / s.forwarded as f64
        };
        for (name, help, v) in [
            (
                "hearth_forwarded",
                "Requests forwarded to their home",
                s.forwarded,
            ),
            (
                "hearth_sharded",
                "Forwarded requests the home served",
                s.sharded,
            ),
            (
                "hearth_refusals_received",
                "Forwarded requests the home refused",
                s.refusals_received,
            ),
            (
                "hearth_refusals_sent",
                "Sharded requests this node refused as a home",
                s.refusals_sent(),
            ),
            (
                "hearth_home_unavailable",
                "Forwards whose home was unreachable",
                s.home_unavailable,
            ),
            (
                "hearth_rpc_handshakes_rejected",
                "RPC peers refused at the TLS handshake",
                s.handshakes_rejected,
            ),
            (
                "hearth_rpc_handshakes_shed",
                "RPC connections closed before their handshake to bound pending handshakes",
                s.handshakes_shed,
            ),
        ] {
            let c = ConstCounter::new(v);
            c.encode(enc.encode_descriptor(name, help, None, c.metric_type())?)?;
        }
        let g = ConstGauge::new(sharded_fraction);
        g.encode(enc.encode_descriptor(
            "hearth_sharded_fraction",
            "Fraction of forwarded requests served by their home",
            None,
            g.metric_type(),
        )?)?;
        Ok(())
    }
}

struct RingCollector(Arc<OnceLock<(NodeId, SharedRing)>>);

impl std::fmt::Debug for RingCollector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RingCollector")
    }
}

impl Collector for RingCollector {
    fn encode(&self, mut enc: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let Some((me, ring)) = self.0.get() else {
            return Ok(());
        };
        let ring = ring.load();
        let members = ConstGauge::new(ring.len() as i64);
        members.encode(enc.encode_descriptor(
            "hearth_ring_members",
            "Members on this node's ring",
            None,
            members.metric_type(),
        )?)?;
        let mine = ring
            .ownership()
            .into_iter()
            .find(|(n, _)| &n.id == me)
            .map_or(0.0, |(_, share)| share);
        let share = ConstGauge::new(mine);
        share.encode(enc.encode_descriptor(
            "hearth_ring_ownership",
            "Fraction of the key space this node owns on its ring",
            None,
            share.metric_type(),
        )?)?;
        Ok(())
    }
}

struct GossipCollector(Arc<OnceLock<GossipCounters>>);

impl std::fmt::Debug for GossipCollector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("GossipCollector")
    }
}

impl Collector for GossipCollector {
    fn encode(&self, mut enc: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let dropped = self.0.get().map_or(0, |c| c.unauthenticated());
        let c = ConstCounter::new(dropped);
        c.encode(enc.encode_descriptor(
            "hearth_gossip_unauthenticated",
            "Gossip datagrams dropped because they failed authentication (another gossip_key?)",
            None,
            c.metric_type(),
        )?)?;
        let refused = self.0.get().map_or(0, |c| c.identities_refused());
        let c = ConstCounter::new(refused);
        c.encode(enc.encode_descriptor(
            "hearth_gossip_identity_refused",
            "Gossip members kept off the ring: the node at their RPC address lacks the certificate for their node ID",
            None,
            c.metric_type(),
        )?)?;
        Ok(())
    }
}

impl Metrics {
    /// Metrics for a node over `runtime` and (once set) its RPC layer.
    pub fn new(runtime: Runtime, rpc: Arc<OnceLock<RpcNode>>) -> Self {
        let mut registry = Registry::default();
        let requests = Family::<RequestLabels, Counter>::default();
        registry.register(
            "hearth_requests",
            "Requests by route and start",
            requests.clone(),
        );
        let hop_latency = Histogram::new([
            0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5,
        ]);
        registry.register(
            "hearth_shard_hop_seconds",
            "Latency added by the shard hop",
            hop_latency.clone(),
        );
        let prewarms = Family::<crate::prewarm::PrewarmLabels, Counter>::default();
        registry.register(
            "hearth_prewarms",
            "Prewarms from TLS ClientHellos (and homes' prewarm calls), by where they ran (here, home) and outcome",
            prewarms.clone(),
        );
        let object_home_unavailable = Counter::default();
        registry.register(
            "hearth_object_home_unavailable",
            "Durable Object requests whose home refused them or could not be reached: answered 503, never served on another node",
            object_home_unavailable.clone(),
        );
        let otel = crate::telemetry::ExportCounters::default();
        registry.register(
            "hearth_otel_spans_exported",
            "Request spans the OTLP collector accepted",
            otel.exported.clone(),
        );
        registry.register(
            "hearth_otel_spans_dropped",
            "Request spans dropped because the export queue was full",
            otel.dropped.clone(),
        );
        registry.register(
            "hearth_otel_spans_failed",
            "Request spans lost with an OTLP export that failed",
            otel.failed.clone(),
        );
        let workers = WorkerMetrics::new(DEFAULT_TOP_WORKERS);
        let cpu = workers.clone();
        runtime.observe_cpu(Arc::new(move |script, used| cpu.record_cpu(script, used)));
        registry.register_collector(Box::new(RuntimeCollector(runtime)));
        registry.register_collector(Box::new(WorkerCollector(workers.clone())));
        registry.register_collector(Box::new(RpcCollector(rpc)));
        let gossip = Arc::new(OnceLock::new());
        registry.register_collector(Box::new(GossipCollector(gossip.clone())));
        let ring = Arc::new(OnceLock::new());
        registry.register_collector(Box::new(RingCollector(ring.clone())));
        Metrics {
            registry,
            gossip,
            ring,
            requests,
            hop_latency,
            prewarms,
            workers,
            object_home_unavailable,
            otel,
        }
    }

    /// Reports the ring `me` routes by from now on (set once, when it
    /// joins a cluster): `hearth_ring_members` and `hearth_ring_ownership`.
    pub fn observe_ring(&self, me: NodeId, ring: SharedRing) {
        let _ = self.ring.set((me, ring));
    }

    /// Reports this node's gossip counters from now on (set once, when it
    /// joins a cluster with gossip).
    pub fn observe_gossip(&self, counters: GossipCounters) {
        let _ = self.gossip.set(counters);
    }

    /// Counts one request, served in `route` (by this node), with `start`
    /// (`cold`, `warm`, `prewarmed` or `error`).
    pub fn record(&self, route: hearth_sharding::routing::Route, start: &str) {
        self.requests
            .get_or_create(&RequestLabels {
                route: route.as_str().into(),
                start: start.into(),
            })
            .inc();
    }

    /// The Prometheus text exposition of every metric.
    pub fn render(&self) -> String {
        let mut out = String::new();
        if prometheus_client::encoding::text::encode(&mut out, &self.registry).is_err() {
            out.push_str("# encoding failed\n");
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_script_label_is_bounded_to_the_busiest_workers() {
        let m = WorkerMetrics::new(3);
        // A long tail of 10,000 names once each, and three busy Workers.
        for round in 0..10_000 {
            m.record(&format!("tail-{round}"), "cold");
            for busy in ["a", "b", "c"] {
                m.record(busy, if round % 100 == 0 { "error" } else { "warm" });
            }
        }
        let series = m.snapshot();
        assert!(series.len() <= 4, "top 3 + _other: {}", series.len());
        let names: Vec<&str> = series.iter().map(|(s, _)| s.as_str()).collect();
        assert_eq!(
            names,
            ["a", "b", "c", OTHER_WORKERS],
            "the busiest keep their label"
        );
        // Every request is counted, but a series dropped at a ranking goes
        // with its counts: here the one first tail name, labelled while
        // no ranking had been made.
        let total: u64 = series.iter().map(|(_, c)| c.requests).sum();
        assert_eq!(total, 40_000 - 1);
        let table = m.table();
        assert!(
            table.traffic.len() <= 3 * TRACKED_PER_TOP,
            "the traffic sketch is bounded too: {}",
            table.traffic.len()
        );
        drop(table);
        let (_, a) = &series[0];
        assert!(a.requests > 9_000 && a.errors >= 90, "{a:?}");

        // The label set shows in the exposition, bounded the same way.
        let text = {
            let mut r = Registry::default();
            r.register_collector(Box::new(WorkerCollector(m.clone())));
            let mut out = String::new();
            prometheus_client::encoding::text::encode(&mut out, &r).expect("encode");
            out
        };
        let labelled = text
            .lines()
            .filter(|l| l.starts_with("hearth_worker_requests_total{"))
            .count();
        assert_eq!(labelled, 4, "{text}");
        assert!(
            text.contains("hearth_worker_requests_total{script=\"_other\"}"),
            "{text}"
        );
    }

    #[test]
    fn a_worker_that_becomes_busy_gets_a_label_and_an_idle_one_loses_it() {
        let m = WorkerMetrics::new(1);
        for _ in 0..RERANK_EVERY {
            m.record("early", "warm");
        }
        for _ in 0..(4 * RERANK_EVERY) {
            m.record("later", "warm");
        }
        let names: Vec<String> = m.snapshot().into_iter().map(|(s, _)| s).collect();
        assert_eq!(names, ["later", OTHER_WORKERS]);
        m.record_cpu("later", std::time::Duration::from_millis(1500));
        m.record_cpu("nobody", std::time::Duration::from_millis(250));
        let cpu: Vec<u64> = m.snapshot().iter().map(|(_, c)| c.cpu_ns).collect();
        assert_eq!(
            cpu,
            [1_500_000_000, 250_000_000],
            "CPU to the label, the rest _other"
        );
    }

    #[test]
    fn an_idle_worker_keeps_its_series_while_slots_are_free() {
        // Three Workers, fifty slots: one serves, then idles for many
        // rankings while another is busy. Its counts must stay.
        let m = WorkerMetrics::new(DEFAULT_TOP_WORKERS);
        for _ in 0..100 {
            m.record("quiet", "warm");
        }
        m.record_cpu("quiet", std::time::Duration::from_millis(7));
        for _ in 0..(50 * RERANK_EVERY) {
            m.record("busy", "warm");
        }
        m.record("other", "cold");
        let series = m.snapshot();
        let quiet = series.iter().find(|(s, _)| s == "quiet").map(|(_, c)| *c);
        assert_eq!(
            quiet.map(|c| (c.requests, c.cpu_ns)),
            Some((100, 7_000_000)),
            "the idle Worker's series, counts intact: {series:?}"
        );
        let names: Vec<&str> = series.iter().map(|(s, _)| s.as_str()).collect();
        assert_eq!(names, ["busy", "other", "quiet", OTHER_WORKERS]);
    }

    #[test]
    fn a_stale_series_gives_way_when_a_busy_worker_needs_its_slot() {
        let m = WorkerMetrics::new(2);
        for _ in 0..RERANK_EVERY {
            m.record("old-a", "warm");
            m.record("old-b", "warm");
        }
        // Both idle now; "new" becomes busy and takes the slot of the one
        // with less traffic, the other keeps its series.
        for _ in 0..RERANK_EVERY {
            m.record("old-b", "warm");
        }
        for _ in 0..(4 * RERANK_EVERY) {
            m.record("new", "warm");
        }
        let names: Vec<String> = m.snapshot().into_iter().map(|(s, _)| s).collect();
        assert_eq!(names, ["new", "old-b", OTHER_WORKERS]);
    }
}
