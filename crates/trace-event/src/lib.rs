//! # hearth-trace-event
//!
//! [`TraceEvent`]: one thing that happened in a *traced flow* (a flow of
//! Workers calling Workers whose entry Worker has tail Workers). The model
//! is in `hearth_runtime::outbound::tail`: every level of the flow, on whatever node
//! it runs, records events; they travel to the flow's first node, which
//! hands them all to the tail Workers in one invocation.
//!
//! Two crates handle the same events and depend on neither each other nor
//! anything heavy: the runtime (`hearth-runtime`) records them and delivers
//! them as JSON, and the cluster layer (`hearth-sharding`) carries them
//! between nodes in the context stack's `reportTraces` calls. The one
//! definition both use lives in this crate of its own (serde only), so the
//! cluster layer stays free of wasmtime and the node converts nothing
//! between them.
//!
//! The live tail (`hearth tail`, `hearth_runtime::outbound::live_tail`) streams one
//! [`RequestEvent`] per finished request: the request line, status, timing
//! and the same [`TraceEvent`]s a tail Worker gets for that level. The
//! admin client reads them back, hence `Deserialize` too.

use serde::{Deserialize, Serialize};

/// One trace event of a flow.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TraceEvent {
    /// The Worker that produced it.
    pub script_id: String,
    /// The node it was produced on (filled in by the node that reports it).
    pub node: String,
    /// When, in milliseconds since the Unix epoch.
    pub timestamp_unix_ms: u64,
    /// `log`, `subrequest`, `exception` or `outcome`.
    pub kind: String,
    /// The event's text.
    pub message: String,
}

/// One finished request of a Worker on one node, as the live tail streams
/// it (one server-sent event each).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RequestEvent {
    /// The Worker that served it.
    pub script_id: String,
    /// The node it ran on.
    pub node: String,
    /// When it ended, in milliseconds since the Unix epoch.
    pub timestamp_unix_ms: u64,
    /// The request's method.
    pub method: String,
    /// The request's URL (as the Worker saw it).
    pub url: String,
    /// The status the client got: the Worker's, or the node's for a
    /// request that failed before the Worker answered.
    pub status: u16,
    /// `ok`, or `exception` (trap, limit, no response).
    pub outcome: String,
    /// CPU time of the invocation, in milliseconds.
    pub cpu_ms: f64,
    /// Wall time of the invocation, in milliseconds.
    pub wall_ms: f64,
    /// Its logs, subrequests, exception and outcome, in order: what a
    /// tail Worker gets for this level.
    pub events: Vec<TraceEvent>,
    /// The fraction of this subscriber's matching requests being sent
    /// (the requested rate times the node's own when over its rate).
    pub sample_rate: f64,
    /// Events this subscriber has lost so far because it read too slowly.
    pub dropped: u64,
}
