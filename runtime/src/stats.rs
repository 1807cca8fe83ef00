//! Counters of a node's runtime, read by tests, `hearth` and `/metrics`.

use std::sync::atomic::{AtomicU64, Ordering};

use serde::Serialize;

use crate::eviction::EvictionCause;

/// Live counters; all monotonic but the gauges `in_flight` and
/// `live_tail_queued_bytes`.
#[derive(Debug, Default)]
pub struct Stats {
    pub(crate) requests: AtomicU64,
    pub(crate) warm: AtomicU64,
    pub(crate) cold: AtomicU64,
    pub(crate) prewarmed: AtomicU64,
    pub(crate) prewarm_loads: AtomicU64,
    pub(crate) startup_failures: AtomicU64,
    pub(crate) cpu_kills: AtomicU64,
    pub(crate) memory_kills: AtomicU64,
    pub(crate) traps: AtomicU64,
    pub(crate) instances_started: AtomicU64,
    pub(crate) compiles: AtomicU64,
    pub(crate) artifact_loads: AtomicU64,
    pub(crate) artifacts_rejected: AtomicU64,
    pub(crate) store_metadata_rejected: AtomicU64,
    pub(crate) pre_slot_refused: AtomicU64,
    pub(crate) evicted_pressure: AtomicU64,
    pub(crate) evicted_idle: AtomicU64,
    pub(crate) evicted_replaced: AtomicU64,
    pub(crate) evicted_manual: AtomicU64,
    pub(crate) reuse_demotions: AtomicU64,
    pub(crate) memory_retirements: AtomicU64,
    pub(crate) busy: AtomicU64,
    pub(crate) wall_kills: AtomicU64,
    pub(crate) client_timeouts: AtomicU64,
    pub(crate) cancelled: AtomicU64,
    pub(crate) in_flight: AtomicU64,
    pub(crate) nested_calls: AtomicU64,
    pub(crate) nested_denied: AtomicU64,
    pub(crate) redirects_into_bindings: AtomicU64,
    pub(crate) nested_too_deep: AtomicU64,
    pub(crate) loop_refused: AtomicU64,
    pub(crate) nested_queued: AtomicU64,
    pub(crate) tail_deliveries: AtomicU64,
    pub(crate) tail_failures: AtomicU64,
    pub(crate) tail_late_reports: AtomicU64,
    pub(crate) trace_levels_truncated: AtomicU64,
    pub(crate) live_tail_dropped_queue: AtomicU64,
    pub(crate) live_tail_dropped_node: AtomicU64,
    pub(crate) live_tail_truncated: AtomicU64,
    /// Bytes queued for live-tail watchers on the node now: the gauge the
    /// node's budget is held to ([`crate::outbound::live_tail`]).
    pub(crate) live_tail_queued_bytes: AtomicU64,
    pub(crate) store_reads: AtomicU64,
    pub(crate) unknown_scripts: AtomicU64,
    pub(crate) unknown_cached: AtomicU64,
    /// Fetches of origins by outcome ([`crate::outbound::egress`]); shared with the
    /// node's client for origins, which counts into it.
    pub(crate) subrequests: std::sync::Arc<crate::outbound::egress::SubrequestCounters>,
    pub(crate) dispatch_only_refused: AtomicU64,
    pub(crate) nested_cpu_refused: AtomicU64,
    pub(crate) object_requests: AtomicU64,
    pub(crate) objects_opened: AtomicU64,
    pub(crate) objects_evicted: AtomicU64,
    pub(crate) object_alarms_fired: AtomicU64,
    pub(crate) object_alarms_failed: AtomicU64,
    pub(crate) objects_superseded: AtomicU64,
}

impl Stats {
    pub(crate) fn bump(c: &AtomicU64) {
        c.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn evicted(&self, cause: EvictionCause) {
        Self::bump(match cause {
            EvictionCause::Pressure => &self.evicted_pressure,
            EvictionCause::Idle => &self.evicted_idle,
            EvictionCause::Replaced => &self.evicted_replaced,
            EvictionCause::Manual => &self.evicted_manual,
        });
    }
}

/// A point-in-time copy of the counters plus residency gauges.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct StatsSnapshot {
    /// Requests handed to a Worker (served or failed).
    pub requests: u64,
    /// Requests that found their Worker resident.
    pub warm: u64,
    /// Requests that had to load their Worker.
    pub cold: u64,
    /// Requests that found their Worker warm because a prewarm loaded it
    /// (the first request after each such load).
    pub prewarmed: u64,
    /// Workers loaded by a prewarm rather than by a request.
    pub prewarm_loads: u64,
    /// Instantiations that failed (startup CPU budget, traps in init).
    pub startup_failures: u64,
    /// Requests stopped at their CPU limit.
    pub cpu_kills: u64,
    /// Requests stopped at their memory limit.
    pub memory_kills: u64,
    /// Requests whose Worker trapped.
    pub traps: u64,
    /// Instances started.
    pub instances_started: u64,
    /// Components compiled from source.
    pub compiles: u64,
    /// Components loaded from precompiled artifacts.
    pub artifact_loads: u64,
    /// Artifacts refused (bad MAC or unloadable) and recompiled.
    pub artifacts_rejected: u64,
    /// Store records refused on read: a deployment, version or secret
    /// record whose MAC does not check or that has none
    /// ([`crate::store::records`]), or metadata whose source hash is not
    /// 64 lowercase hex digits (the hash names files, so it never reaches
    /// a path). Each is a record in the store that no node wrote.
    pub store_metadata_rejected: u64,
    /// Requests answered 503 because the body bytes they had buffered
    /// before taking a slot would pass their connection's or listener's
    /// bound ([`crate::instances::pre_slot`]).
    pub pre_slot_refused: u64,
    /// Evictions under memory pressure.
    pub evicted_pressure: u64,
    /// Evictions after the idle timeout.
    pub evicted_idle: u64,
    /// Evictions by a redeploy.
    pub evicted_replaced: u64,
    /// Evictions asked for explicitly.
    pub evicted_manual: u64,
    /// Workers switched to fresh instances because a reused instance
    /// returned without a response ([`crate::instances::lifecycle`]).
    pub reuse_demotions: u64,
    /// Reused instances retired after a request because they held more
    /// than three quarters of their memory limit (the next request gets a
    /// fresh instance instead of failing at the limit).
    pub memory_retirements: u64,
    /// Requests answered 503 because no instance slot came free in time.
    pub busy: u64,
    /// Requests stopped at their wall-clock limit.
    pub wall_kills: u64,
    /// Requests refused because the client stalled sending its body.
    pub client_timeouts: u64,
    /// Invocations cancelled because their client went away.
    pub cancelled: u64,
    /// Instances serving a request now.
    pub in_flight: u64,
    /// Outgoing requests of Workers that reached a Worker (a binding, a
    /// dispatch namespace or the outbound Worker; [`crate::outbound::outgoing`]).
    pub nested_calls: u64,
    /// Outgoing requests of Workers denied (not a binding, no outbound).
    pub nested_denied: u64,
    /// Redirects from origins (or an outbound Worker) whose `Location`
    /// led into `.internal`, removed before the guest saw them
    /// ([`crate::outbound::outgoing`]).
    pub redirects_into_bindings: u64,
    /// Nested calls refused at the depth limit (`loop-detected`).
    pub nested_too_deep: u64,
    /// Requests refused at a front door with 508: they had passed through
    /// hearth's egress more than `max_loop_passes` times ([`crate::flow`]).
    pub loop_refused: u64,
    /// Nested calls that waited for one of their invocation's subrequest
    /// slots (`RuntimeConfig::max_concurrent_subrequests`).
    pub nested_queued: u64,
    /// Flows delivered to a tail Worker ([`crate::outbound::tail`]).
    pub tail_deliveries: u64,
    /// Tail deliveries the tail Worker did not accept (no 2xx).
    pub tail_failures: u64,
    /// Trace reports refused because their flow was already delivered
    /// (a level that ended after its entry; [`crate::outbound::tail`]).
    pub tail_late_reports: u64,
    /// Requests whose trace events were cut at a level's bounds
    /// (`MAX_EVENTS`, `MAX_LEVEL_BYTES`; [`crate::outbound::tail`]).
    pub trace_levels_truncated: u64,
    /// Live-tail events a watcher lost because its queue was full (by
    /// count or by its byte budget; [`crate::outbound::live_tail`]).
    pub live_tail_dropped_queue: u64,
    /// Live-tail events a watcher lost because the node's byte budget for
    /// all watchers was spent.
    pub live_tail_dropped_node: u64,
    /// Live-tail events cut to the per-event byte budget (their trace
    /// events partly left out, with a `truncated` mark).
    pub live_tail_truncated: u64,
    /// Bytes queued for live-tail watchers on the node now.
    pub live_tail_queued_bytes: u64,
    /// Reads of a script's metadata or source from the script store.
    pub store_reads: u64,
    /// Requests for a script ID under which no Worker is deployed (404).
    pub unknown_scripts: u64,
    /// Lookups of an unknown script ID answered from the negative cache,
    /// without a store read ([`crate::store::misses`]).
    pub unknown_cached: u64,
    /// Fetches of origins by Workers, by outcome ([`crate::outbound::egress`]).
    pub subrequests: crate::outbound::egress::SubrequestCounts,
    /// Client requests (a flow's entry) for a dispatch-only user Worker,
    /// refused with a 404 ([`crate::store::manifest`]).
    pub dispatch_only_refused: u64,
    /// Nested calls refused because their flow's CPU budget for nested
    /// invocations on this node was spent ([`crate::instances::cpu::FlowCpu`]).
    pub nested_cpu_refused: u64,
    /// Requests served by Durable Objects on this node ([`crate::objects`]).
    pub object_requests: u64,
    /// Objects made resident (their storage opened: claimed and restored).
    pub objects_opened: u64,
    /// Idle objects evicted past `objects.max_resident`.
    pub objects_evicted: u64,
    /// Durable Object alarms whose handler ran and succeeded on this node
    /// ([`crate::objects`]).
    pub object_alarms_fired: u64,
    /// Tries of a Durable Object alarm handler that failed on this node
    /// (each is retried with backoff, up to a limit).
    pub object_alarms_failed: u64,
    /// Resident objects shut down because they learned (a flush, the
    /// output gate's confirm, a storage call) that another owner claimed
    /// them.
    pub objects_superseded: u64,
    /// Bytes live instances hold now against the node's instance memory
    /// cap: linear memories, tables and each one's host reserve.
    pub instance_bytes: u64,
    /// Workers resident now.
    pub resident_workers: u64,
    /// Bytes accounted to resident Workers now.
    pub resident_bytes: u64,
}

impl StatsSnapshot {
    /// Evictions of every cause but redeploys: the memory-pressure measure.
    pub fn evictions(&self) -> u64 {
        self.evicted_pressure + self.evicted_idle + self.evicted_manual
    }

    pub(crate) fn from(
        s: &Stats,
        resident_workers: u64,
        resident_bytes: u64,
        instance_bytes: u64,
    ) -> Self {
        let g = |c: &AtomicU64| c.load(Ordering::Relaxed);
        StatsSnapshot {
            requests: g(&s.requests),
            warm: g(&s.warm),
            cold: g(&s.cold),
            prewarmed: g(&s.prewarmed),
            prewarm_loads: g(&s.prewarm_loads),
            startup_failures: g(&s.startup_failures),
            cpu_kills: g(&s.cpu_kills),
            memory_kills: g(&s.memory_kills),
            traps: g(&s.traps),
            instances_started: g(&s.instances_started),
            compiles: g(&s.compiles),
            artifact_loads: g(&s.artifact_loads),
            artifacts_rejected: g(&s.artifacts_rejected),
            store_metadata_rejected: g(&s.store_metadata_rejected),
            pre_slot_refused: g(&s.pre_slot_refused),
            evicted_pressure: g(&s.evicted_pressure),
            evicted_idle: g(&s.evicted_idle),
            evicted_replaced: g(&s.evicted_replaced),
            evicted_manual: g(&s.evicted_manual),
            reuse_demotions: g(&s.reuse_demotions),
            memory_retirements: g(&s.memory_retirements),
            busy: g(&s.busy),
            wall_kills: g(&s.wall_kills),
            client_timeouts: g(&s.client_timeouts),
            cancelled: g(&s.cancelled),
            in_flight: g(&s.in_flight),
            nested_calls: g(&s.nested_calls),
            nested_denied: g(&s.nested_denied),
            redirects_into_bindings: g(&s.redirects_into_bindings),
            nested_too_deep: g(&s.nested_too_deep),
            loop_refused: g(&s.loop_refused),
            nested_queued: g(&s.nested_queued),
            tail_deliveries: g(&s.tail_deliveries),
            tail_failures: g(&s.tail_failures),
            tail_late_reports: g(&s.tail_late_reports),
            trace_levels_truncated: g(&s.trace_levels_truncated),
            live_tail_dropped_queue: g(&s.live_tail_dropped_queue),
            live_tail_dropped_node: g(&s.live_tail_dropped_node),
            live_tail_truncated: g(&s.live_tail_truncated),
            live_tail_queued_bytes: g(&s.live_tail_queued_bytes),
            store_reads: g(&s.store_reads),
            unknown_scripts: g(&s.unknown_scripts),
            unknown_cached: g(&s.unknown_cached),
            subrequests: s.subrequests.snapshot(),
            dispatch_only_refused: g(&s.dispatch_only_refused),
            nested_cpu_refused: g(&s.nested_cpu_refused),
            object_requests: g(&s.object_requests),
            objects_opened: g(&s.objects_opened),
            objects_evicted: g(&s.objects_evicted),
            object_alarms_fired: g(&s.object_alarms_fired),
            object_alarms_failed: g(&s.object_alarms_failed),
            objects_superseded: g(&s.objects_superseded),
            instance_bytes,
            resident_workers,
            resident_bytes,
        }
    }
}
