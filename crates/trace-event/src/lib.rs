//! # hearth-trace-event
//!
//! [`TraceEvent`]: one thing that happened in a *traced flow* (a flow of
//! Workers calling Workers whose entry Worker has tail Workers). The model
//! is in `hearth_runtime::tail`: every level of the flow, on whatever node
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

use serde::Serialize;

/// One trace event of a flow.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
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
