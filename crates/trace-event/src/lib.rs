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
//!
//! The live tail holds events to byte budgets counted as JSON:
//! [`RequestEvent::json_bytes`] bounds an event's serialized length,
//! escaping included (a control character takes six bytes), without
//! serializing it.

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
    /// `log`, `subrequest`, `exception`, `outcome`, or `truncated`: a
    /// mark the node adds where it left events out to stay within a bound
    /// (its message says how many and which bound); a Worker cannot
    /// write one.
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
    /// The request's URL as the Worker saw it, with the value of every
    /// query parameter replaced by `REDACTED` (API keys ride in query
    /// strings; the path and the parameters' names stay).
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
    /// Events this subscriber has lost so far: it read too slowly, or the
    /// node's memory budget for live tails was spent.
    pub dropped: u64,
}

/// Bytes of JSON a serialized event's fields other than its strings take
/// at most: the names, quotes, separators and numbers.
const TRACE_EVENT_FRAME: usize = 96;
/// The same for a [`RequestEvent`] (without its events).
const REQUEST_EVENT_FRAME: usize = 320;

/// The length of `s` as a JSON string's contents (without the quotes):
/// what `serde_json` writes for it. A control character is written as
/// `\uXXXX`, six bytes for one, so a string of them is six times its
/// length.
pub fn json_str_len(s: &str) -> usize {
    s.bytes()
        .map(|b| match b {
            b'"' | b'\\' | b'\n' | b'\r' | b'\t' | 0x08 | 0x0c => 2,
            0..0x20 => 6,
            _ => 1,
        })
        .sum()
}

impl TraceEvent {
    /// A bound on the length of this event's JSON (escaping counted):
    /// what the live tail's byte budgets charge for it.
    pub fn json_bytes(&self) -> usize {
        TRACE_EVENT_FRAME
            + [&self.script_id, &self.node, &self.kind, &self.message]
                .iter()
                .map(|s| json_str_len(s))
                .sum::<usize>()
    }
}

impl RequestEvent {
    /// A bound on the length of this event's JSON (escaping counted, its
    /// trace events included): what the live tail's byte budgets charge
    /// for it.
    pub fn json_bytes(&self) -> usize {
        self.frame_json_bytes()
            + self
                .events
                .iter()
                .map(TraceEvent::json_bytes)
                .sum::<usize>()
    }

    /// [`RequestEvent::json_bytes`] without its trace events.
    pub fn frame_json_bytes(&self) -> usize {
        REQUEST_EVENT_FRAME
            + [
                &self.script_id,
                &self.node,
                &self.method,
                &self.url,
                &self.outcome,
            ]
            .iter()
            .map(|s| json_str_len(s))
            .sum::<usize>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_bytes_bound_the_serialized_length() {
        let text = |s: &str| s.to_string();
        let mut e = RequestEvent {
            script_id: text("w"),
            node: text("node-1"),
            timestamp_unix_ms: u64::MAX,
            method: text("GET"),
            url: text("/?q=\"\\"),
            status: u16::MAX,
            outcome: text("exception"),
            cpu_ms: -1.234_567_890_123_456_7e-300,
            wall_ms: f64::MAX,
            events: Vec::new(),
            sample_rate: f64::MIN_POSITIVE,
            dropped: u64::MAX,
        };
        let bare = serde_json::to_string(&e).expect("json").len();
        assert!(bare <= e.json_bytes(), "{bare} > {}", e.json_bytes());
        for message in ["plain", "\u{1b}[31mred\u{7}", "tab\tnl\n\"q\"", "é\u{0}"] {
            e.events.push(TraceEvent {
                script_id: text("w"),
                node: text("node-1"),
                timestamp_unix_ms: u64::MAX,
                kind: text("log"),
                message: message.repeat(100),
            });
        }
        let json = serde_json::to_string(&e).expect("json");
        assert!(
            json.len() <= e.json_bytes(),
            "{} > {}",
            json.len(),
            e.json_bytes()
        );
        // Strings are counted as serde_json writes them, exactly.
        for t in &e.events {
            let quoted = serde_json::to_string(&t.message).expect("json").len();
            assert_eq!(json_str_len(&t.message) + 2, quoted, "{:?}", t.message);
        }
        // Six bytes for a control character.
        assert_eq!(json_str_len("\u{1b}\u{1b}"), 12);
    }
}
