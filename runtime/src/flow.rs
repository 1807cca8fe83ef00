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
/// Removes every [`HOST_HEADER_PREFIX`] header from `headers`: only the
/// host may set them, so whatever a client or a guest sent is dropped
/// before a Worker sees the request (at every front door, and on every
/// nested call).
pub fn strip_host_headers(headers: &mut http::HeaderMap) {
    let forged: Vec<_> = headers
        .keys()
        .filter(|k| k.as_str().starts_with(HOST_HEADER_PREFIX))
        .cloned()
        .collect();
    for k in forged {
        headers.remove(&k);
    }
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
