//! A *flow* and the `x-hearth-*` headers: what a nested invocation knows
//! of the levels above it, and what only the host may say.
//!
//! # The model
//!
//! A flow starts with a request from a client and grows whenever a Worker calls
//! one of its [bindings](crate::outbound::bindings): the dispatch Worker calls
//! a user Worker, which makes a subrequest through the outbound Worker, and so
//! on. Each level of a flow is one invocation, possibly on another node (it is
//! routed like any request: warm here, else its home, else lazily here). Three
//! things hold for every level:
//!
//! * **Only the host builds levels.** The guest speaks plain wasi:http; the
//!   host resolves the host name against the caller's deployed bindings
//!   ([`crate::outbound::outgoing`]), strips every `x-hearth-*` header the
//!   guest set ([`strip_host_headers`], which every front door applies to
//!   clients' requests too), and sets its own ([`CALLER_HEADER`],
//!   [`DEPTH_HEADER`], and the node's trust header). Trust, limits, tail and
//!   outbound Workers come from deploys and the caller's level, never from the
//!   request.
//! * **Limits only tighten.** A nested invocation runs under its own plan's
//!   limits, tightened by its [`Flow`]: the CPU its caller had left when it
//!   called (so along any chain no level gets more CPU than the entry
//!   Worker's limit), any limit override of a level above it, and the flow's
//!   wall-clock **deadline**, set once by the entry Worker's wall limit and
//!   carried to every node. A call that would pass the deadline fails in the
//!   caller with `HTTP-response-timeout`. Every nested invocation of a flow
//!   also draws from one CPU budget per node ([`crate::instances::cpu`]).
//! * **Depth is bounded.** A flow is at most
//!   [`MAX_DEPTH`](crate::limits::MAX_DEPTH) levels deep
//!   (the entry Worker is level 1): a call beyond that (a loop of bindings,
//!   A → B → A → …) fails in the caller.
//!
//! # The node's part
//!
//! The runtime does not know about rings or RPC. It calls an [`Invoker`]
//! that the node installs ([`crate::Runtime::set_invoker`]), with a
//! [`NestedCall`] describing the call and the caller's request extensions,
//! where the node keeps its context stack. The node pushes the callee's
//! frame, routes the request, and tells the callee's runtime its [`Flow`]
//! through the callee request's extensions. A request without a `Flow` is
//! a flow's entry: a client's.
//!
//! # What the host says in headers
//!
//! Only the host sets `x-hearth-*` headers ([`HOST_HEADER_PREFIX`]): on a
//! nested request, [`CALLER_HEADER`] and [`DEPTH_HEADER`]; on a failed
//! request's response, its [`REQUEST_ID_HEADER`] (the ID it is logged
//! under) and, for a name no Worker is deployed under or a flow whose
//! nested CPU is spent, [`UNKNOWN_SCRIPT_HEADER`]. A served response also
//! carries `x-hearth-start` ([`crate::timing::START_HEADER`]) and its
//! version ([`crate::store::versions::VERSION_HEADER`]).
//!
//! # Loops through the front door
//!
//! A Worker allowed to fetch a public name of the node (its own, or a
//! Worker's that fetches it back) makes a flow that leaves through egress
//! and comes back through the front door as a new client request: no
//! depth above bounds it. So every request a Worker sends to an origin
//! carries the [`CDN_LOOP_HEADER`] (RFC 8586) of the request it serves
//! with one more `hearth` entry ([`LoopMark::next_pass`]), and a nested
//! call carries it unchanged ([`LoopMark::carry`]); the guest's own
//! `CDN-Loop` is replaced, never read, so it can neither drop nor forge
//! entries. Other CDNs' entries stay, as RFC 8586 asks, so a loop through
//! another CDN counts too. The front door refuses a request that has
//! passed through it more than `RuntimeConfig::max_loop_passes` times
//! (default [`MAX_LOOP_PASSES`](crate::limits::MAX_LOOP_PASSES)) with
//! 508 Loop Detected, before it is routed or takes a slot
//! ([`crate::Runtime::admit_loop`]).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use futures::future::BoxFuture;

use crate::body::Body;
use crate::limits::PlanLimits;
use crate::outbound::bindings::{Bindings, CallKind};

/// Prefix of the headers only the host sets on a nested request; a
/// guest's own are removed.
pub const HOST_HEADER_PREFIX: &str = "x-hearth-";
/// Removes every [`HOST_HEADER_PREFIX`] header from `headers`,
/// [`OBJECT_URL_HEADER`](crate::objects::OBJECT_URL_HEADER) and
/// [`ALARM_HEADER`](crate::objects::ALARM_HEADER): only the
/// host may set them, so whatever a client or a guest sent is dropped
/// before a Worker sees the request (at every front door, and on every
/// nested call; a request to an object reads its URL header first).
pub fn strip_host_headers(headers: &mut http::HeaderMap) {
    let forged: Vec<_> = headers
        .keys()
        .filter(|k| {
            k.as_str().starts_with(HOST_HEADER_PREFIX)
                || k.as_str() == crate::objects::OBJECT_URL_HEADER
                || k.as_str() == crate::objects::ALARM_HEADER
        })
        .cloned()
        .collect();
    for k in forged {
        headers.remove(&k);
    }
}

/// The RFC 8586 header in which every CDN a request passes through leaves
/// an entry; hearth's is [`CDN_LOOP_ID`] (see the module docs).
pub const CDN_LOOP_HEADER: &str = "cdn-loop";
/// hearth's `cdn-id` in [`CDN_LOOP_HEADER`]: one entry per pass of a
/// request through egress.
pub const CDN_LOOP_ID: &str = "hearth";

/// The `CDN-Loop` entries of the request an invocation serves, as the host
/// received them: what its outgoing requests carry on, whatever the guest
/// set (see the module docs).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LoopMark {
    /// Every `CDN-Loop` field line of the request, joined with `, `.
    entries: Option<http::HeaderValue>,
}

impl LoopMark {
    /// The mark of a request with `headers`.
    pub fn of(headers: &http::HeaderMap) -> Self {
        let mut lines = headers.get_all(CDN_LOOP_HEADER).iter();
        let Some(first) = lines.next() else {
            return LoopMark::default();
        };
        let mut joined = first.as_bytes().to_vec();
        for line in lines {
            joined.extend_from_slice(b", ");
            joined.extend_from_slice(line.as_bytes());
        }
        LoopMark {
            entries: Some(header_value(joined)),
        }
    }

    /// How many times the request passed through a hearth node's egress:
    /// its entries whose `cdn-id` is [`CDN_LOOP_ID`]. Commas split entries
    /// even inside a quoted parameter: an entry hearth appended is never
    /// hidden (a client that quotes one in only raises its own count).
    pub fn passes(&self) -> usize {
        self.entries.as_ref().map_or(0, |v| passes_in(v.as_bytes()))
    }

    /// Sets `headers`' `CDN-Loop` to this mark, replacing the guest's: for a
    /// nested call, which stays inside the node's flow.
    pub fn carry(&self, headers: &mut http::HeaderMap) {
        headers.remove(CDN_LOOP_HEADER);
        if let Some(v) = &self.entries {
            headers.insert(CDN_LOOP_HEADER, v.clone());
        }
    }

    /// Sets `headers`' `CDN-Loop` to this mark and one more [`CDN_LOOP_ID`]
    /// entry, replacing the guest's: for a request leaving through egress.
    pub fn next_pass(&self, headers: &mut http::HeaderMap) {
        let mut joined = Vec::new();
        if let Some(v) = &self.entries {
            joined.extend_from_slice(v.as_bytes());
            joined.extend_from_slice(b", ");
        }
        joined.extend_from_slice(CDN_LOOP_ID.as_bytes());
        let value = header_value(joined);
        headers.remove(CDN_LOOP_HEADER);
        headers.insert(CDN_LOOP_HEADER, value);
    }
}

/// hearth's entries in the `CDN-Loop` text `bytes` (see [`LoopMark::passes`]).
fn passes_in(bytes: &[u8]) -> usize {
    bytes
        .split(|b| *b == b',')
        .filter(|entry| {
            let id = entry.split(|b| *b == b';').next().unwrap_or_default();
            id.trim_ascii().eq_ignore_ascii_case(CDN_LOOP_ID.as_bytes())
        })
        .count()
}

/// `bytes` as a header value. Joined from valid values with `, ` and
/// [`CDN_LOOP_ID`], they always are one; were they not, as many bare
/// entries as they count keep the count (never less).
fn header_value(bytes: Vec<u8>) -> http::HeaderValue {
    http::HeaderValue::from_bytes(&bytes).unwrap_or_else(|_| {
        let entries = vec![CDN_LOOP_ID; passes_in(&bytes).max(1)].join(", ");
        http::HeaderValue::from_str(&entries).unwrap_or(http::HeaderValue::from_static(CDN_LOOP_ID))
    })
}

/// Header naming the calling Worker, set by the host.
pub const CALLER_HEADER: &str = "x-hearth-caller";
/// Header with the callee's level in its flow (1 is the entry Worker), set
/// by the host.
pub const DEPTH_HEADER: &str = "x-hearth-depth";

/// Where an invocation sits in its flow: what the node tells the runtime
/// through the request's extensions. The default is a flow's entry (a
/// request from a client).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Flow {
    /// Levels above this one (0 for the entry Worker).
    pub depth: usize,
    /// CPU this level may use at most (tightens its plan's limit).
    pub cpu: Option<Duration>,
    /// Memory its instance may use at most (tightens its plan's limit).
    pub memory: Option<u64>,
    /// The flow's wall-clock deadline.
    pub deadline: Option<Instant>,
    /// The outbound Worker that this level's subrequests to hosts outside
    /// `.internal` go to (none: to the origin if the Worker's allow-list
    /// has it, else denied; see [`crate::outbound::egress`]).
    pub outbound: Option<String>,
    /// The flow's CPU budget for nested invocations ([`crate::instances::cpu`]).
    pub nested_cpu: Option<crate::instances::cpu::NestedCpu>,
}

impl Flow {
    /// `plan` tightened by this flow at `now`: never looser than `plan`.
    pub fn tighten(&self, plan: PlanLimits, now: Instant) -> PlanLimits {
        let mut l = plan;
        if let Some(cpu) = self.cpu {
            l.request_cpu = l.request_cpu.min(cpu.max(Duration::from_millis(1)));
        }
        if let Some(mem) = self.memory {
            l.memory = l.memory.min(mem);
        }
        if let Some(deadline) = self.deadline {
            let left = deadline.saturating_duration_since(now);
            l.request_wall = l.request_wall.min(left.max(Duration::from_millis(1)));
        }
        l
    }
}

/// One call of a Worker to a Worker, as handed to the [`Invoker`].
#[derive(Debug)]
pub struct NestedCall {
    /// The calling Worker.
    pub caller: String,
    /// The Worker to invoke.
    pub target: String,
    /// How the caller reached it.
    pub kind: CallKind,
    /// The callee's level in the flow (the entry Worker is 1).
    pub depth: usize,
    /// CPU the caller had left when it called.
    pub cpu_left: Duration,
    /// The flow's deadline.
    pub deadline: Instant,
    /// The caller's deployed bindings (its outbound and tail Workers are
    /// the node's business).
    pub caller_bindings: Arc<Bindings>,
    /// The caller's request extensions (the node's context stack is there).
    pub caller_extensions: http::Extensions,
    /// The flow's CPU budget for nested invocations, for the callee
    /// ([`crate::instances::cpu`]).
    pub nested_cpu: Option<crate::instances::cpu::NestedCpu>,
}

/// Carries nested calls for the runtime; the node implements it.
pub trait Invoker: Send + Sync + 'static {
    /// The node's ID, stamped on the trace events of its Workers.
    fn node_id(&self) -> String {
        String::new()
    }

    /// Invokes `call.target` with `req` and returns its response (a failure
    /// of the callee is a response with an error status, as for a client).
    fn invoke(
        &self,
        call: NestedCall,
        req: http::Request<Body>,
    ) -> BoxFuture<'static, http::Response<Body>>;
}

/// The header that carries the ID of a failed request, as in the log.
pub const REQUEST_ID_HEADER: &str = "x-hearth-request-id";

/// The header on the 404 for a script ID no Worker is deployed under
/// (value `unknown-script`). A Worker's own answers never carry it with
/// [`START_HEADER`](crate::timing::START_HEADER) absent (every served
/// response has that), so a node that forwarded a request can tell its
/// home's "not deployed" apart and remember the name
/// ([`Runtime::remember_missing`](crate::Runtime::remember_missing)).
pub const UNKNOWN_SCRIPT_HEADER: &str = "x-hearth-error";

/// The value of [`UNKNOWN_SCRIPT_HEADER`] on a nested invocation stopped or
/// refused because its flow's CPU budget for nested calls is spent on the node
/// that ran it ([`crate::instances::cpu`]): the caller's node then spends its
/// own budget of the flow too, so the guest's next calls fail at once.
pub const FLOW_CPU_SPENT: &str = "flow-cpu-spent";

/// A node-unique, hard-to-guess ID for a failed request: 64 bits of
/// (time, counter) mixed through blake3, as 16 hex digits.
pub(crate) fn request_id() -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let t = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    let mut h = blake3::Hasher::new();
    h.update(&n.to_le_bytes());
    h.update(&t.to_le_bytes());
    h.update(&std::process::id().to_le_bytes());
    let bytes = h.finalize();
    bytes.as_bytes()[..8]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mark(lines: &[&str]) -> LoopMark {
        let mut h = http::HeaderMap::new();
        for l in lines {
            h.append(
                CDN_LOOP_HEADER,
                http::HeaderValue::from_str(l).expect("value"),
            );
        }
        LoopMark::of(&h)
    }

    #[test]
    fn a_loop_mark_counts_hearths_entries_and_only_grows() {
        assert_eq!(mark(&[]).passes(), 0);
        assert_eq!(mark(&["edge-cdn; v=1"]).passes(), 0);
        assert_eq!(mark(&["hearth", "x, HEARTH ;a=1"]).passes(), 2);
        // A quoted comma cannot hide an entry hearth appended.
        let m = mark(&["x; a=\"open"]);
        let mut h = http::HeaderMap::new();
        h.insert(CDN_LOOP_HEADER, http::HeaderValue::from_static("forged"));
        m.next_pass(&mut h);
        assert_eq!(h.get_all(CDN_LOOP_HEADER).iter().count(), 1);
        assert_eq!(h[CDN_LOOP_HEADER], "x; a=\"open, hearth");
        assert_eq!(LoopMark::of(&h).passes(), 1);
        // A nested call carries the mark as it came, the guest's dropped.
        let mut h = http::HeaderMap::new();
        h.insert(CDN_LOOP_HEADER, http::HeaderValue::from_static("forged"));
        mark(&[]).carry(&mut h);
        assert!(h.get(CDN_LOOP_HEADER).is_none());
        mark(&["a", "hearth"]).carry(&mut h);
        assert_eq!(h[CDN_LOOP_HEADER], "a, hearth");
        let mut h = http::HeaderMap::new();
        mark(&[]).next_pass(&mut h);
        assert_eq!(h[CDN_LOOP_HEADER], "hearth");
    }

    #[test]
    fn a_flow_only_tightens_the_plan() {
        let plan = PlanLimits::default_for(crate::Plan::Free);
        let now = Instant::now();
        let loose = Flow {
            cpu: Some(plan.request_cpu * 10),
            memory: Some(plan.memory * 10),
            deadline: Some(now + plan.request_wall * 10),
            ..Flow::default()
        };
        assert_eq!(loose.tighten(plan, now), plan);
        let tight = Flow {
            cpu: Some(Duration::from_millis(5)),
            memory: Some(1 << 20),
            deadline: Some(now + Duration::from_secs(2)),
            ..Flow::default()
        };
        let l = tight.tighten(plan, now);
        assert_eq!(l.request_cpu, Duration::from_millis(5));
        assert_eq!(l.memory, 1 << 20);
        assert_eq!(l.request_wall, Duration::from_secs(2));
        assert_eq!(Flow::default().tighten(plan, now), plan);
    }
}
