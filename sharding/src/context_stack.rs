//! The context stack: what a nested Worker invocation carries from node to
//! node.
//!
//! Workers invoke Workers: a dynamic dispatch Worker picks a user Worker,
//! which may call out through an outbound Worker, and the dispatch Worker may
//! have a tail Worker that must see the trace events of the *whole* flow in
//! one invocation. Each level of such a flow is a [`ContextFrame`]:
//! ownership override, limit overrides, trust level, tail and outbound Worker
//! configuration, feature flags. The frames, outermost first, form a
//! [`ContextStack`].
//!
//! When a Worker deep in a flow is sharded, its stack is serialized into the
//! `ContextStack` Cap'n Proto struct of `schema/hearth.capnp`, travels with
//! the request, and is rebuilt as these native structs on the home. The
//! shard server hands it to the Worker in the request's extensions
//! (`req.extensions().get::<ContextStack>()`).
//!
//! # Traces
//!
//! The node of the first Worker creates a [`TraceReporter`] with
//! [`TraceReporter::origin`] (one callback for the flow) and puts it in the
//! stack. Serializing the stack turns it into a `ReportTraces` capability;
//! every node that receives the stack gets a reporter that calls back to the
//! first node through that capability, however many hops away it is, without
//! knowing where that node is. The native side stays `Send`: a remote
//! reporter is a channel to a task on the RPC thread that owns the
//! capability.
//!
//! # Distributed tracing
//!
//! A node that exports spans (OpenTelemetry, off by default) puts the W3C
//! trace context of the span a request runs under, a [`TraceParent`], in
//! the stack. It travels with a forwarded or nested call as plain numbers,
//! so the span the receiving node records is a child of the caller's, in
//! the same trace, on whatever node it runs.

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, oneshot};

use crate::schema::hearth_capnp::TrustLevel as WireTrust;
use crate::schema::hearth_capnp::{context_frame, context_stack, report_traces, trace_event};

/// Most frames a stack may have on the wire (nesting deeper than this is a
/// loop, not a flow).
pub const MAX_FRAMES: usize = 64;
/// Longest text field accepted from a peer, in bytes.
pub const MAX_TEXT_BYTES: usize = 4096;
/// Most list entries (flags, tail Workers, parameters) per frame.
pub const MAX_LIST_LEN: usize = 256;
/// Most trace events accepted in one `reportTraces` call.
pub const MAX_EVENTS_PER_REPORT: usize = 4096;

/// How far a level of the flow is trusted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum TrustLevel {
    /// Untrusted code, e.g. a user Worker behind a dynamic dispatch Worker.
    Untrusted,
    /// An ordinary customer Worker.
    #[default]
    Standard,
    /// A platform Worker (dynamic dispatch, outbound).
    Platform,
}

/// Limits a level runs under instead of its plan's. `None` keeps the plan's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct LimitOverrides {
    /// CPU time per request, in milliseconds.
    pub cpu_ms: Option<u64>,
    /// Memory per instance, in bytes.
    pub memory_bytes: Option<u64>,
}

/// A tail Worker that receives the trace events of the flow.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TailWorkerConfig {
    /// The tail Worker's script ID.
    pub script_id: String,
}

/// An outbound Worker that intercepts the subrequests of this level.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct OutboundWorkerConfig {
    /// The outbound Worker's script ID.
    pub script_id: String,
    /// Parameters the dispatch Worker passes it, in order.
    pub params: Vec<(String, String)>,
}

/// One level of a nested invocation.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ContextFrame {
    /// The Worker running at this level.
    pub script_id: String,
    /// The account the invocation is attributed to, if not the Worker's own.
    pub ownership_override: Option<String>,
    /// Limit overrides for this level.
    pub limits: LimitOverrides,
    /// Trust level of this level.
    pub trust: TrustLevel,
    /// Tail Workers configured at this level.
    pub tail_workers: Vec<TailWorkerConfig>,
    /// Outbound Worker configured at this level.
    pub outbound: Option<OutboundWorkerConfig>,
    /// Feature (compatibility) flags of this level.
    pub feature_flags: Vec<String>,
}

/// One trace event of a flow (the runtime records them; this stack
/// carries them to the flow's first node). Shared with the runtime through
/// a crate of its own, `hearth-trace-event`.
pub use hearth_trace_event::TraceEvent;

/// Why trace events could not be reported.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TraceError {
    /// The stack carries no reporter (tracing is off for this flow).
    #[error("this flow has no trace reporter")]
    NoReporter,
    /// The first node of the flow could not be reached.
    #[error("reporting traces to the first node failed: {0}")]
    Unreachable(String),
    /// The first node took the report and refused it (the flow was already
    /// delivered to its tail Workers); the reason travels back as text.
    #[error("the first node refused the trace events: {0}")]
    Refused(String),
}

/// Marks a refusal in the `reportTraces` error text, so the reporter on
/// the other end gets [`TraceError::Refused`] back, not `Unreachable`.
const REFUSED_MARK: &str = "hearth-trace-refused: ";

/// A context stack from a peer that this node will not rebuild.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ContextError {
    /// The Cap'n Proto data could not be read.
    #[error("malformed context stack: {0}")]
    Malformed(String),
    /// A field is over one of this module's limits.
    #[error("context stack over limits: {0}")]
    TooLarge(String),
}

impl From<capnp::Error> for ContextError {
    fn from(e: capnp::Error) -> Self {
        ContextError::Malformed(e.to_string())
    }
}

type TraceCallback = dyn Fn(Vec<TraceEvent>) -> Result<(), TraceError> + Send + Sync;

enum ReporterInner {
    Origin(Arc<TraceCallback>),
    Remote(mpsc::UnboundedSender<RemoteReport>),
}

struct RemoteReport {
    events: Vec<TraceEvent>,
    done: oneshot::Sender<Result<(), TraceError>>,
}

/// Reports a flow's trace events to the flow's first node. Cheap to clone,
/// `Send + Sync`.
#[derive(Clone)]
pub struct TraceReporter {
    inner: Arc<ReporterInner>,
}

impl fmt::Debug for TraceReporter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match &*self.inner {
            ReporterInner::Origin(_) => "origin",
            ReporterInner::Remote(_) => "remote",
        };
        f.debug_struct("TraceReporter")
            .field("kind", &kind)
            .finish()
    }
}

impl TraceReporter {
    /// A reporter at the first node of a flow: every event reported anywhere
    /// in the flow reaches `callback`, on the thread that received it. The
    /// callback must not block (hand the events on to a channel).
    pub fn origin(callback: impl Fn(Vec<TraceEvent>) + Send + Sync + 'static) -> Self {
        Self::origin_checked(move |events| {
            callback(events);
            Ok(())
        })
    }

    /// [`TraceReporter::origin`] with a callback that may refuse the events
    /// ([`TraceError::Refused`]); the refusal reaches the reporting node.
    pub fn origin_checked(
        callback: impl Fn(Vec<TraceEvent>) -> Result<(), TraceError> + Send + Sync + 'static,
    ) -> Self {
        TraceReporter {
            inner: Arc::new(ReporterInner::Origin(Arc::new(callback))),
        }
    }

    /// Whether this node is the flow's first node.
    pub fn is_origin(&self) -> bool {
        matches!(&*self.inner, ReporterInner::Origin(_))
    }

    /// Reports `events` to the first node; resolves once it has them.
    pub async fn report(&self, events: Vec<TraceEvent>) -> Result<(), TraceError> {
        match &*self.inner {
            ReporterInner::Origin(callback) => callback(events),
            ReporterInner::Remote(tx) => {
                let (done, result) = oneshot::channel();
                tx.send(RemoteReport { events, done })
                    .map_err(|_| TraceError::Unreachable("RPC thread stopped".into()))?;
                result
                    .await
                    .map_err(|_| TraceError::Unreachable("connection closed".into()))?
            }
        }
    }

    /// A reporter that calls `cap` (a `ReportTraces` capability received from
    /// a peer). Must run on an RPC thread (inside its `LocalSet`), where a
    /// task takes ownership of the capability.
    pub(crate) fn remote(cap: report_traces::Client) -> Self {
        let (tx, mut rx) = mpsc::unbounded_channel::<RemoteReport>();
        tokio::task::spawn_local(async move {
            while let Some(report) = rx.recv().await {
                let mut result = Ok(());
                // Batches keep every message well under a peer's size limit.
                for batch in batches(&report.events) {
                    let mut request = cap.report_traces_request();
                    write_events(batch, request.get());
                    if let Err(e) = request.send().promise.await {
                        let text = e.to_string();
                        result = Err(match text.split_once(REFUSED_MARK) {
                            Some((_, why)) => TraceError::Refused(why.to_string()),
                            None => TraceError::Unreachable(text),
                        });
                        break;
                    }
                }
                let _ = report.done.send(result);
            }
        });
        TraceReporter {
            inner: Arc::new(ReporterInner::Remote(tx)),
        }
    }
}

/// The context of a (possibly nested) invocation. See the module docs.
#[derive(Debug, Clone, Default)]
pub struct ContextStack {
    frames: Vec<ContextFrame>,
    traces: Option<TraceReporter>,
    deadline: Option<Instant>,
    nested_cpu: Option<NestedCpu>,
    trace: Option<TraceParent>,
}

/// A W3C trace context (the `traceparent` header,
/// <https://www.w3.org/TR/trace-context/>): the trace a request belongs to
/// and the span it runs under.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TraceParent {
    /// The trace's ID (never 0).
    pub trace_id: u128,
    /// The parent span's ID (never 0).
    pub span_id: u64,
    /// Whether the trace is sampled (recorded and exported).
    pub sampled: bool,
}

impl TraceParent {
    /// Parses a `traceparent` header value: `00-<32 hex>-<16 hex>-<2 hex>`
    /// (lowercase; a later version may append fields). `None` for anything
    /// else, including the all-zero IDs the specification forbids.
    pub fn parse(value: &str) -> Option<TraceParent> {
        let mut parts = value.trim().split('-');
        let version = parts.next()?;
        let (trace, span, flags) = (parts.next()?, parts.next()?, parts.next()?);
        let rest = parts.next();
        let hex = |s: &str, len: usize| {
            s.len() == len && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
        };
        if !hex(version, 2) || version == "ff" || (version == "00" && rest.is_some()) {
            return None;
        }
        if !hex(trace, 32) || !hex(span, 16) || !hex(flags, 2) {
            return None;
        }
        let trace_id = u128::from_str_radix(trace, 16).ok()?;
        let span_id = u64::from_str_radix(span, 16).ok()?;
        let flags = u8::from_str_radix(flags, 16).ok()?;
        (trace_id != 0 && span_id != 0).then_some(TraceParent {
            trace_id,
            span_id,
            sampled: flags & 1 == 1,
        })
    }

    /// The `traceparent` header value (version 00).
    pub fn header_value(&self) -> String {
        format!(
            "00-{:032x}-{:016x}-{:02x}",
            self.trace_id,
            self.span_id,
            u8::from(self.sampled)
        )
    }
}

/// A flow's CPU budget for its nested invocations, as it travels: the
/// flow's ID (each node keeps one budget per flow ID, shared by every
/// nested invocation of the flow there) and the CPU left of it on the node
/// that made the call (a node that has no budget for the flow yet starts
/// one of this size).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NestedCpu {
    /// The flow's ID (never 0), chosen at random by its entry's node.
    pub flow_id: u64,
    /// The CPU left of the budget when the call was made.
    pub left: Duration,
}

impl ContextStack {
    /// An empty stack without tracing.
    pub fn new() -> Self {
        ContextStack::default()
    }

    /// A stack whose first frame is `frame`, tracing to `traces`.
    pub fn with_frame(frame: ContextFrame, traces: Option<TraceReporter>) -> Self {
        ContextStack {
            frames: vec![frame],
            traces,
            deadline: None,
            nested_cpu: None,
            trace: None,
        }
    }

    /// The trace context of the span this invocation runs under, when the
    /// flow is traced.
    pub fn trace(&self) -> Option<TraceParent> {
        self.trace
    }

    /// Sets the trace context (see [`ContextStack::trace`]).
    pub fn set_trace(&mut self, trace: Option<TraceParent>) {
        self.trace = trace;
    }

    /// The flow's CPU budget for nested invocations, if it has one.
    pub fn nested_cpu(&self) -> Option<NestedCpu> {
        self.nested_cpu
    }

    /// Sets the flow's CPU budget for nested invocations.
    pub fn set_nested_cpu(&mut self, budget: Option<NestedCpu>) {
        self.nested_cpu = budget;
    }

    /// The flow's wall-clock deadline, if it has one. It travels as the
    /// time left, so the nodes' clocks need not agree.
    pub fn deadline(&self) -> Option<Instant> {
        self.deadline
    }

    /// Sets the flow's wall-clock deadline.
    pub fn set_deadline(&mut self, deadline: Option<Instant>) {
        self.deadline = deadline;
    }

    /// Adds the frame of a nested invocation.
    pub fn push(&mut self, frame: ContextFrame) {
        self.frames.push(frame);
    }

    /// The frames, outermost first.
    pub fn frames(&self) -> &[ContextFrame] {
        &self.frames
    }

    /// The innermost frame (the Worker being invoked), if any.
    pub fn top(&self) -> Option<&ContextFrame> {
        self.frames.last()
    }

    /// The flow's trace reporter, if tracing is on.
    pub fn traces(&self) -> Option<&TraceReporter> {
        self.traces.as_ref()
    }

    /// Sets the flow's trace reporter.
    pub fn set_traces(&mut self, traces: Option<TraceReporter>) {
        self.traces = traces;
    }

    /// The limits in force for the innermost level: a nested invocation can
    /// only tighten its callers' overrides, so this is the smallest override
    /// of each limit over all frames.
    pub fn effective_limits(&self) -> LimitOverrides {
        fn min(a: Option<u64>, b: Option<u64>) -> Option<u64> {
            match (a, b) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            }
        }
        self.frames
            .iter()
            .fold(LimitOverrides::default(), |acc, f| LimitOverrides {
                cpu_ms: min(acc.cpu_ms, f.limits.cpu_ms),
                memory_bytes: min(acc.memory_bytes, f.limits.memory_bytes),
            })
    }

    /// Reports trace events to the flow's first node.
    pub async fn report_traces(&self, events: Vec<TraceEvent>) -> Result<(), TraceError> {
        match &self.traces {
            Some(reporter) => reporter.report(events).await,
            None => Err(TraceError::NoReporter),
        }
    }
}

/// Serves `reportTraces` for a native reporter: the capability that rides in
/// a serialized stack. On the first node it calls the callback; on a node in
/// the middle of a flow it forwards to the first node.
struct ReportTracesServer {
    reporter: TraceReporter,
}

impl report_traces::Server for ReportTracesServer {
    fn report_traces(
        self: capnp::capability::Rc<Self>,
        params: report_traces::ReportTracesParams,
        _results: report_traces::ReportTracesResults,
    ) -> impl std::future::Future<Output = Result<(), capnp::Error>> + 'static {
        let events = params
            .get()
            .and_then(|p| p.get_events())
            .map_err(ContextError::from)
            .and_then(read_events);
        let reporter = self.reporter.clone();
        async move {
            let events = events.map_err(|e| capnp::Error::failed(e.to_string()))?;
            reporter.report(events).await.map_err(|e| match e {
                TraceError::Refused(why) => capnp::Error::failed(format!("{REFUSED_MARK}{why}")),
                e => capnp::Error::failed(e.to_string()),
            })
        }
    }
}

/// Writes `stack` into `builder`, exporting its reporter (if any) as a
/// `ReportTraces` capability. Must run on an RPC thread.
pub(crate) fn write_context(stack: &ContextStack, mut builder: context_stack::Builder<'_>) {
    let len = u32::try_from(stack.frames.len()).unwrap_or(u32::MAX);
    let mut frames = builder.reborrow().init_frames(len);
    for (i, frame) in stack.frames.iter().enumerate().take(len as usize) {
        write_frame(frame, frames.reborrow().get(i as u32));
    }
    if let Some(deadline) = stack.deadline {
        let left = deadline.saturating_duration_since(Instant::now());
        // At least 1: a deadline that has passed is still a deadline.
        builder.set_deadline_ms(u64::try_from(left.as_millis()).unwrap_or(u64::MAX).max(1));
    }
    if let Some(n) = stack.nested_cpu.filter(|n| n.flow_id != 0) {
        builder.set_flow_id(n.flow_id);
        // At least 1: a spent budget is still a budget.
        builder.set_nested_cpu_us(u64::try_from(n.left.as_micros()).unwrap_or(u64::MAX).max(1));
    }
    if let Some(t) = stack.trace.filter(|t| t.trace_id != 0) {
        builder.set_trace_id_high((t.trace_id >> 64) as u64);
        builder.set_trace_id_low(t.trace_id as u64);
        builder.set_parent_span_id(t.span_id);
        builder.set_trace_flags(u8::from(t.sampled));
    }
    if let Some(reporter) = &stack.traces {
        let cap: report_traces::Client = capnp_rpc::new_client(ReportTracesServer {
            reporter: reporter.clone(),
        });
        builder.set_report_traces(cap);
    }
}

fn list_len(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

fn write_frame(frame: &ContextFrame, mut b: context_frame::Builder<'_>) {
    b.set_script_id(frame.script_id.as_str());
    if let Some(owner) = &frame.ownership_override {
        b.set_ownership_override(owner.as_str());
    }
    {
        let mut limits = b.reborrow().init_limits();
        limits.set_cpu_ms(frame.limits.cpu_ms.unwrap_or(0));
        limits.set_memory_bytes(frame.limits.memory_bytes.unwrap_or(0));
    }
    b.set_trust(match frame.trust {
        TrustLevel::Untrusted => WireTrust::Untrusted,
        TrustLevel::Standard => WireTrust::Standard,
        TrustLevel::Platform => WireTrust::Platform,
    });
    {
        let mut tails = b
            .reborrow()
            .init_tail_workers(list_len(frame.tail_workers.len()));
        for (i, tail) in frame.tail_workers.iter().enumerate() {
            tails
                .reborrow()
                .get(i as u32)
                .set_script_id(tail.script_id.as_str());
        }
    }
    if let Some(outbound) = &frame.outbound {
        let mut o = b.reborrow().init_outbound();
        o.set_script_id(outbound.script_id.as_str());
        let mut params = o.init_params(list_len(outbound.params.len()));
        for (i, (name, value)) in outbound.params.iter().enumerate() {
            let mut p = params.reborrow().get(i as u32);
            p.set_name(name.as_str());
            p.set_value(value.as_str());
        }
    }
    let mut flags = b.init_feature_flags(list_len(frame.feature_flags.len()));
    for (i, flag) in frame.feature_flags.iter().enumerate() {
        flags.set(i as u32, flag.as_str());
    }
}

/// Rebuilds a native stack from `reader`. A `ReportTraces` capability in it
/// becomes a remote [`TraceReporter`]; must run on an RPC thread.
pub(crate) fn read_context(
    reader: context_stack::Reader<'_>,
) -> Result<ContextStack, ContextError> {
    let frames_reader = reader.get_frames()?;
    if frames_reader.len() as usize > MAX_FRAMES {
        return Err(ContextError::TooLarge(format!(
            "{} frames (at most {MAX_FRAMES})",
            frames_reader.len()
        )));
    }
    let frames = frames_reader
        .iter()
        .map(read_frame)
        .collect::<Result<Vec<_>, _>>()?;
    let traces = if reader.has_report_traces() {
        Some(TraceReporter::remote(reader.get_report_traces()?))
    } else {
        None
    };
    let deadline = match reader.get_deadline_ms() {
        0 => None,
        // A peer's absurd value must not overflow the clock.
        ms => Instant::now().checked_add(Duration::from_millis(ms.min(MAX_DEADLINE_MS))),
    };
    let nested_cpu = match reader.get_flow_id() {
        0 => None,
        flow_id => Some(NestedCpu {
            flow_id,
            // A peer's absurd value is capped like a deadline.
            left: Duration::from_micros(reader.get_nested_cpu_us().min(MAX_DEADLINE_MS * 1000)),
        }),
    };
    let trace_id =
        (u128::from(reader.get_trace_id_high()) << 64) | u128::from(reader.get_trace_id_low());
    // A peer's half-set context (no trace or no span) is no context.
    let trace = (trace_id != 0 && reader.get_parent_span_id() != 0).then(|| TraceParent {
        trace_id,
        span_id: reader.get_parent_span_id(),
        sampled: reader.get_trace_flags() & 1 == 1,
    });
    Ok(ContextStack {
        frames,
        traces,
        deadline,
        nested_cpu,
        trace,
    })
}

/// Longest deadline accepted from a peer (a day; request wall limits are
/// minutes).
pub const MAX_DEADLINE_MS: u64 = 24 * 3600 * 1000;

fn text(
    field: &str,
    value: capnp::Result<capnp::text::Reader<'_>>,
) -> Result<String, ContextError> {
    let value = value?;
    if value.len() > MAX_TEXT_BYTES {
        return Err(ContextError::TooLarge(format!(
            "{field} is {} bytes (at most {MAX_TEXT_BYTES})",
            value.len()
        )));
    }
    value
        .to_string()
        .map_err(|e| ContextError::Malformed(format!("{field} is not UTF-8: {e}")))
}

fn check_len(field: &str, len: u32) -> Result<(), ContextError> {
    if len as usize > MAX_LIST_LEN {
        return Err(ContextError::TooLarge(format!(
            "{field} has {len} entries (at most {MAX_LIST_LEN})"
        )));
    }
    Ok(())
}

fn nonzero(v: u64) -> Option<u64> {
    (v != 0).then_some(v)
}

fn read_frame(r: context_frame::Reader<'_>) -> Result<ContextFrame, ContextError> {
    let ownership_override = if r.has_ownership_override() {
        Some(text("ownershipOverride", r.get_ownership_override())?)
    } else {
        None
    };
    let limits = r.get_limits()?;
    // An unknown trust level from a newer peer gets the least trust.
    let trust = match r.get_trust() {
        Ok(WireTrust::Standard) => TrustLevel::Standard,
        Ok(WireTrust::Platform) => TrustLevel::Platform,
        Ok(WireTrust::Untrusted) | Err(_) => TrustLevel::Untrusted,
    };
    let tails = r.get_tail_workers()?;
    check_len("tailWorkers", tails.len())?;
    let tail_workers = tails
        .iter()
        .map(|t| {
            Ok(TailWorkerConfig {
                script_id: text("tailWorkers.scriptId", t.get_script_id())?,
            })
        })
        .collect::<Result<Vec<_>, ContextError>>()?;
    let outbound = if r.has_outbound() {
        let o = r.get_outbound()?;
        let params = o.get_params()?;
        check_len("outbound.params", params.len())?;
        Some(OutboundWorkerConfig {
            script_id: text("outbound.scriptId", o.get_script_id())?,
            params: params
                .iter()
                .map(|p| {
                    Ok((
                        text("outbound.params.name", p.get_name())?,
                        text("outbound.params.value", p.get_value())?,
                    ))
                })
                .collect::<Result<Vec<_>, ContextError>>()?,
        })
    } else {
        None
    };
    let flags = r.get_feature_flags()?;
    check_len("featureFlags", flags.len())?;
    let feature_flags = flags
        .iter()
        .map(|f| text("featureFlags", f))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(ContextFrame {
        script_id: text("scriptId", r.get_script_id())?,
        ownership_override,
        limits: LimitOverrides {
            cpu_ms: nonzero(limits.get_cpu_ms()),
            memory_bytes: nonzero(limits.get_memory_bytes()),
        },
        trust,
        tail_workers,
        outbound,
        feature_flags,
    })
}

/// Bytes of trace text per `reportTraces` call (the peer's message limit is
/// 4 MiB by default).
const REPORT_BATCH_BYTES: usize = 512 * 1024;

/// Splits `events` into runs that each fit one `reportTraces` call.
fn batches(events: &[TraceEvent]) -> Vec<&[TraceEvent]> {
    let mut out = Vec::new();
    let (mut start, mut bytes) = (0, 0);
    for (i, e) in events.iter().enumerate() {
        let size = 64
            + [&e.script_id, &e.node, &e.kind, &e.message]
                .iter()
                .map(|t| t.len().min(MAX_TEXT_BYTES))
                .sum::<usize>();
        if i > start && (bytes + size > REPORT_BATCH_BYTES || i - start == MAX_EVENTS_PER_REPORT) {
            out.push(&events[start..i]);
            (start, bytes) = (i, 0);
        }
        bytes += size;
    }
    if start < events.len() {
        out.push(&events[start..]);
    }
    out
}

pub(crate) fn write_events(
    events: &[TraceEvent],
    params: report_traces::report_traces_params::Builder<'_>,
) {
    let mut list = params.init_events(list_len(events.len()));
    for (i, e) in events.iter().enumerate() {
        write_event(e, list.reborrow().get(i as u32));
    }
}

/// `text` cut to at most [`MAX_TEXT_BYTES`] (at a character boundary), so
/// the receiver accepts it.
fn clip(text: &str) -> &str {
    if text.len() <= MAX_TEXT_BYTES {
        return text;
    }
    let mut end = MAX_TEXT_BYTES;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

fn write_event(e: &TraceEvent, mut b: trace_event::Builder<'_>) {
    b.set_script_id(clip(&e.script_id));
    b.set_node(clip(&e.node));
    b.set_timestamp_unix_ms(e.timestamp_unix_ms);
    b.set_kind(clip(&e.kind));
    b.set_message(clip(&e.message));
}

pub(crate) fn read_events(
    list: capnp::struct_list::Reader<'_, trace_event::Owned>,
) -> Result<Vec<TraceEvent>, ContextError> {
    if list.len() as usize > MAX_EVENTS_PER_REPORT {
        return Err(ContextError::TooLarge(format!(
            "{} trace events in one report (at most {MAX_EVENTS_PER_REPORT})",
            list.len()
        )));
    }
    list.iter()
        .map(|e| {
            Ok(TraceEvent {
                script_id: text("scriptId", e.get_script_id())?,
                node: text("node", e.get_node())?,
                timestamp_unix_ms: e.get_timestamp_unix_ms(),
                kind: text("kind", e.get_kind())?,
                message: text("message", e.get_message())?,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample_frames() -> Vec<ContextFrame> {
        vec![
            ContextFrame {
                script_id: "dispatcher".into(),
                ownership_override: None,
                limits: LimitOverrides {
                    cpu_ms: Some(50),
                    memory_bytes: None,
                },
                trust: TrustLevel::Platform,
                tail_workers: vec![TailWorkerConfig {
                    script_id: "tail".into(),
                }],
                outbound: None,
                feature_flags: vec!["nodejs_compat".into()],
            },
            ContextFrame {
                script_id: "user-worker".into(),
                ownership_override: Some("customer-42".into()),
                limits: LimitOverrides {
                    cpu_ms: Some(10),
                    memory_bytes: Some(64 << 20),
                },
                trust: TrustLevel::Untrusted,
                tail_workers: vec![],
                outbound: Some(OutboundWorkerConfig {
                    script_id: "outbound".into(),
                    params: vec![("customer".into(), "42".into())],
                }),
                feature_flags: vec![],
            },
        ]
    }

    #[test]
    fn frames_round_trip_through_capnp() {
        let mut stack = ContextStack::new();
        for f in sample_frames() {
            stack.push(f);
        }
        let mut message = capnp::message::Builder::new_default();
        write_context(&stack, message.init_root());
        let reader = message
            .get_root_as_reader::<context_stack::Reader>()
            .unwrap();
        let rebuilt = read_context(reader).unwrap();
        assert_eq!(rebuilt.frames(), stack.frames());
        assert!(rebuilt.traces().is_none());
        assert_eq!(
            rebuilt.top().map(|f| f.script_id.as_str()),
            Some("user-worker")
        );
    }

    #[test]
    fn the_nested_cpu_budget_travels_with_its_flow_id() {
        let mut stack = ContextStack::new();
        let budget = NestedCpu {
            flow_id: 7,
            left: Duration::from_micros(1_500),
        };
        stack.set_nested_cpu(Some(budget));
        let mut message = capnp::message::Builder::new_default();
        write_context(&stack, message.init_root());
        let reader = message
            .get_root_as_reader::<context_stack::Reader>()
            .unwrap();
        assert_eq!(read_context(reader).unwrap().nested_cpu(), Some(budget));
        let mut message = capnp::message::Builder::new_default();
        write_context(&ContextStack::new(), message.init_root());
        let reader = message
            .get_root_as_reader::<context_stack::Reader>()
            .unwrap();
        assert_eq!(read_context(reader).unwrap().nested_cpu(), None);
    }

    #[test]
    fn the_trace_context_travels_and_traceparent_parses() {
        let t = TraceParent::parse("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
            .expect("the specification's example");
        assert_eq!(t.trace_id, 0x4bf92f3577b34da6a3ce929d0e0e4736);
        assert_eq!(t.span_id, 0x00f067aa0ba902b7);
        assert!(t.sampled);
        assert_eq!(
            t.header_value(),
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
        );
        for bad in [
            "",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            "00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01",
        ] {
            assert_eq!(TraceParent::parse(bad), None, "{bad:?}");
        }
        let mut stack = ContextStack::new();
        stack.set_trace(Some(t));
        let mut message = capnp::message::Builder::new_default();
        write_context(&stack, message.init_root());
        let reader = message
            .get_root_as_reader::<context_stack::Reader>()
            .unwrap();
        assert_eq!(read_context(reader).unwrap().trace(), Some(t));
        let mut message = capnp::message::Builder::new_default();
        write_context(&ContextStack::new(), message.init_root());
        let reader = message
            .get_root_as_reader::<context_stack::Reader>()
            .unwrap();
        assert_eq!(read_context(reader).unwrap().trace(), None);
    }

    #[test]
    fn the_deadline_travels_as_time_left() {
        let mut stack = ContextStack::new();
        let deadline = Instant::now() + Duration::from_secs(30);
        stack.set_deadline(Some(deadline));
        let mut message = capnp::message::Builder::new_default();
        write_context(&stack, message.init_root());
        let reader = message
            .get_root_as_reader::<context_stack::Reader>()
            .unwrap();
        let rebuilt = read_context(reader).unwrap();
        let got = rebuilt.deadline().expect("a deadline");
        // Rebuilt from the time left, on this node's clock.
        assert!(got > Instant::now());
        let mut message = capnp::message::Builder::new_default();
        write_context(&ContextStack::new(), message.init_root());
        let reader = message
            .get_root_as_reader::<context_stack::Reader>()
            .unwrap();
        assert_eq!(read_context(reader).unwrap().deadline(), None);
    }

    #[test]
    fn effective_limits_take_the_tightest_override() {
        let mut stack = ContextStack::new();
        for f in sample_frames() {
            stack.push(f);
        }
        assert_eq!(
            stack.effective_limits(),
            LimitOverrides {
                cpu_ms: Some(10),
                memory_bytes: Some(64 << 20)
            }
        );
        assert_eq!(
            ContextStack::new().effective_limits(),
            LimitOverrides::default()
        );
    }

    #[test]
    fn oversized_stacks_are_refused() {
        let mut stack = ContextStack::new();
        for _ in 0..=MAX_FRAMES {
            stack.push(ContextFrame::default());
        }
        let mut message = capnp::message::Builder::new_default();
        write_context(&stack, message.init_root());
        let reader = message
            .get_root_as_reader::<context_stack::Reader>()
            .unwrap();
        assert!(matches!(
            read_context(reader),
            Err(ContextError::TooLarge(_))
        ));

        let mut stack = ContextStack::new();
        stack.push(ContextFrame {
            script_id: "x".repeat(MAX_TEXT_BYTES + 1),
            ..ContextFrame::default()
        });
        let mut message = capnp::message::Builder::new_default();
        write_context(&stack, message.init_root());
        let reader = message
            .get_root_as_reader::<context_stack::Reader>()
            .unwrap();
        assert!(matches!(
            read_context(reader),
            Err(ContextError::TooLarge(_))
        ));
    }

    #[test]
    fn big_reports_are_split_into_batches_that_fit_a_message() {
        let event = TraceEvent {
            message: "x".repeat(MAX_TEXT_BYTES * 2),
            ..TraceEvent::default()
        };
        let events = vec![event; 1000];
        let split = batches(&events);
        assert!(split.len() > 1);
        assert_eq!(split.iter().map(|b| b.len()).sum::<usize>(), 1000);
        for batch in &split {
            let mut message = capnp::message::Builder::new_default();
            write_events(batch, message.init_root());
            let bytes: usize = message
                .get_segments_for_output()
                .iter()
                .map(|s| s.len())
                .sum();
            assert!(
                bytes <= REPORT_BATCH_BYTES + 64 * 1024,
                "batch of {bytes} bytes"
            );
            let reader = message
                .get_root_as_reader::<report_traces::report_traces_params::Reader>()
                .unwrap();
            let back = read_events(reader.get_events().unwrap()).unwrap();
            assert_eq!(back.len(), batch.len());
            assert_eq!(back[0].message.len(), MAX_TEXT_BYTES);
        }
        assert!(batches(&[]).is_empty());
    }

    #[tokio::test]
    async fn origin_reporter_calls_its_callback_and_no_reporter_is_an_error() {
        let (tx, rx) = std::sync::mpsc::channel();
        let reporter = TraceReporter::origin(move |events| {
            let _ = tx.send(events);
        });
        let stack = ContextStack::with_frame(ContextFrame::default(), Some(reporter));
        let event = TraceEvent {
            kind: "log".into(),
            message: "hello".into(),
            ..TraceEvent::default()
        };
        stack.report_traces(vec![event.clone()]).await.unwrap();
        assert_eq!(rx.recv().unwrap(), vec![event]);
        assert_eq!(
            ContextStack::new().report_traces(vec![]).await,
            Err(TraceError::NoReporter)
        );
    }
}
