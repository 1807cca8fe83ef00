//! Prometheus metrics of a node, served at `/metrics` on the admin listener.
//!
//! Request outcomes (by route and start) and the shard hop latency are
//! recorded live; the runtime's counters and residency gauges are read at
//! scrape time through a collector, so there is one source of truth for them.

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use std::sync::{Arc, OnceLock};

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
                "Script metadata refused on read: its source hash is not 64 lowercase hex digits",
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
                "hearth_nested_too_deep",
                "Nested calls refused at the flow depth limit (loop-detected)",
                s.nested_too_deep,
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
                "hearth_instance_bytes",
                "Bytes live instances hold (linear memory and tables)",
                s.instance_bytes as i64,
            ),
        ] {
            let g = ConstGauge::new(v);
            g.encode(enc.encode_descriptor(name, help, None, g.metric_type())?)?;
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
        registry.register_collector(Box::new(RuntimeCollector(runtime)));
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
