//! The node's invoker (`NodeInvoker`): nested Worker invocations across
//! the cluster, the node's half (the runtime's is `hearth_runtime::outbound::outgoing`).
//!
//! # The model
//!
//! A Worker calls a Worker with a plain wasi:http request to a name of its
//! [bindings](hearth_runtime::outbound::bindings); the runtime resolves the name,
//! checks the depth limit and hands the call to this node's
//! `NodeInvoker` ([`hearth_runtime::outbound::outgoing`]). The invoker:
//!
//! 1. takes the caller's **context stack** (the [`ContextStack`] in the
//!    caller's request; a flow's entry Worker has none yet, so its own frame
//!    is pushed first, with its tail Workers);
//! 2. pushes the callee's **frame**, built from deploys and the caller's
//!    frame only ([`callee_frame`]): its trust level (a dispatched user
//!    Worker is untrusted; a service binding inherits its caller's trust; an
//!    outbound Worker runs with the trust of the flow's entry), the CPU its
//!    caller had left as a limit override, and the outbound Worker in force
//!    (a dispatch Worker's outbound Worker for the user Workers it
//!    dispatches to, inherited through their service bindings, so a user
//!    Worker cannot shed it by calling a binding);
//! 3. sets the flow's deadline and its CPU budget for nested invocations
//!    (its ID and what is left, [`hearth_runtime::instances::cpu`]) on the stack, and routes the request exactly
//!    like a client's ([`crate::node::Node::route`]): warm here → here;
//!    else to its home over the shard client with the stack; a refusing or
//!    unreachable home → served here lazily. The stack travels as Cap'n
//!    Proto and is rebuilt on the home.
//!
//! A call to a **Durable Object** ([`CallKind::Object`]) is one of these
//! calls whose target is the object's ring key (`do:<script>/<class>/<id>`)
//! and whose level runs as the object's script, with a service binding's
//! trust: the node routes it to the object's home and nowhere else (no
//! warm copy, no lazy fallback: see [`crate::node::Node::route`]).
//!
//! Wherever a level is served, [`attach_flow`] turns the stack into the
//! runtime's [`Flow`]: depth, tightest CPU and memory overrides, deadline,
//! outbound Worker.
//!
//! # Traces
//!
//! When the entry Worker of a flow has tail Workers, its runtime collects
//! the flow ([`hearth_runtime::outbound::tail`]) and marks the entry's request with a
//! [`Tracing`] sink. The first nested call puts a
//! [`TraceReporter::origin`] into the stack that feeds that collector;
//! serialized, it is the `reportTraces` capability every other node of the
//! flow reports through, however deep the nesting and wherever the levels
//! run. The callee also sees the host's `x-hearth-trust`,
//! `x-hearth-caller` and `x-hearth-depth` headers; whatever `x-hearth-*`
//! headers the caller's guest set are gone.

use std::sync::{Arc, Weak};

use futures::future::BoxFuture;
use hearth_runtime::Bindings;
use hearth_runtime::body::Body;
use hearth_runtime::flow::{Flow, Invoker, NestedCall};
use hearth_runtime::outbound::bindings::CallKind;
use hearth_runtime::outbound::tail::{TraceSink, Tracing};
use hearth_sharding::context_stack::{
    ContextFrame, ContextStack, LimitOverrides, NestedCpu, OutboundWorkerConfig, TailWorkerConfig,
    TraceError, TraceEvent, TraceReporter, TrustLevel,
};

use crate::node::{Node, NodeState};

/// Header with the callee's trust level (`untrusted`, `standard`,
/// `platform`), set by the host on a nested request.
pub const TRUST_HEADER: &str = "x-hearth-trust";

/// Carries a node's nested calls; installed in its runtime by
/// [`Node::new`]. Routes as the node routes at the time of the call (so
/// it needs no reinstalling when the node joins a cluster).
pub(crate) struct NodeInvoker {
    /// Weak: the runtime (owned by the node) holds the invoker.
    pub(crate) state: Weak<NodeState>,
}

impl Invoker for NodeInvoker {
    fn node_id(&self) -> String {
        self.state
            .upgrade()
            .map(|l| l.id().to_string())
            .unwrap_or_default()
    }

    fn invoke(
        &self,
        call: NestedCall,
        mut req: http::Request<Body>,
    ) -> BoxFuture<'static, http::Response<Body>> {
        let node = self.state.upgrade().map(Node::from_state);
        Box::pin(async move {
            let Some(node) = node else {
                return hearth_runtime::body::text_response(
                    http::StatusCode::SERVICE_UNAVAILABLE,
                    "the node is shutting down\n",
                );
            };
            let mut stack = call
                .caller_extensions
                .get::<ContextStack>()
                .cloned()
                .unwrap_or_default();
            if stack.frames().is_empty() {
                stack.push(entry_frame(&call.caller, &call.caller_bindings));
            }
            // The entry of a traced flow: this node is its first node, and
            // the stack carries a reporter that calls back here.
            if stack.traces().is_none()
                && let Some(sink) = call.caller_extensions.get::<Tracing>().cloned()
            {
                stack.set_traces(Some(origin_reporter(sink)));
            }
            let frame = callee_frame(&stack, &call);
            if let Ok(v) = http::HeaderValue::from_str(trust_name(frame.trust)) {
                req.headers_mut().insert(TRUST_HEADER, v);
            }
            stack.push(frame);
            stack.set_deadline(Some(call.deadline));
            stack.set_nested_cpu(call.nested_cpu.map(|n| NestedCpu {
                flow_id: n.flow_id,
                left: n.left,
            }));
            // A traced flow: the call's `hearth.call` span, the parent of
            // the callee's `hearth.worker` span wherever it runs.
            let span = node
                .telemetry()
                .zip(stack.trace())
                .and_then(|(t, parent)| Some((t.clone(), t.start_child(parent)?)));
            if let Some((_, span)) = &span {
                stack.set_trace(Some(span.context()));
            }
            let resp = node.route(&call.target, req, stack).await;
            if let Some((telemetry, span)) = span {
                let mut attributes = crate::telemetry::response_attributes(&call.target, &resp);
                attributes.push(("hearth.caller", call.caller.clone().into()));
                attributes.push(("hearth.call", call_kind_name(&call.kind).into()));
                attributes.push(("hearth.node", node.id().into()));
                let error = resp.status().is_server_error();
                telemetry.finish(
                    span,
                    "hearth.call",
                    crate::telemetry::SpanKind::Client,
                    attributes,
                    error,
                );
            }
            resp
        })
    }
}

/// The frame of a flow's entry Worker: a Worker that dispatches to user
/// Workers is a platform Worker; its tail Workers are the flow's.
pub fn entry_frame(script_id: &str, bindings: &Bindings) -> ContextFrame {
    ContextFrame {
        script_id: script_id.to_string(),
        trust: if bindings.dispatch.is_empty() {
            TrustLevel::Standard
        } else {
            TrustLevel::Platform
        },
        tail_workers: bindings
            .tail
            .iter()
            .map(|t| TailWorkerConfig {
                script_id: t.clone(),
            })
            .collect(),
        ..ContextFrame::default()
    }
}

/// The frame the host pushes for `call`, from the caller's frame (the top
/// of `stack`) and the caller's deployed bindings only.
pub fn callee_frame(stack: &ContextStack, call: &NestedCall) -> ContextFrame {
    let caller = stack.top().cloned().unwrap_or_default();
    let cpu_ms = u64::try_from(call.cpu_left.as_millis())
        .unwrap_or(u64::MAX)
        .max(1);
    let (trust, outbound) = match &call.kind {
        // An object is its script's, reached like that script through a
        // service binding.
        CallKind::Service(_) | CallKind::Object { .. } => (caller.trust, caller.outbound.clone()),
        CallKind::Dispatch(namespace) => (
            TrustLevel::Untrusted,
            call.caller_bindings
                .outbound
                .as_ref()
                .map(|o| OutboundWorkerConfig {
                    script_id: o.clone(),
                    params: vec![
                        ("dispatcher".into(), call.caller.clone()),
                        ("namespace".into(), namespace.clone()),
                    ],
                }),
        ),
        CallKind::Outbound => (
            stack
                .frames()
                .first()
                .map(|f| f.trust)
                .unwrap_or(TrustLevel::Standard),
            None,
        ),
        CallKind::Tail => (TrustLevel::Standard, None),
    };
    // The level runs as a script: an object's call targets its ring key,
    // and runs as the script of its class.
    let script_id = match &call.kind {
        CallKind::Object { script, .. } => script.clone(),
        _ => call.target.clone(),
    };
    ContextFrame {
        script_id,
        ownership_override: caller.ownership_override.clone(),
        limits: LimitOverrides {
            cpu_ms: Some(cpu_ms),
            memory_bytes: None,
        },
        trust,
        tail_workers: Vec::new(),
        outbound,
        feature_flags: caller.feature_flags.clone(),
    }
}

/// The kind of a nested call, as the `hearth.call` span's attribute
/// `hearth.call` names it.
fn call_kind_name(kind: &CallKind) -> &'static str {
    match kind {
        CallKind::Service(_) => "service",
        CallKind::Dispatch(_) => "dispatch",
        CallKind::Outbound => "outbound",
        CallKind::Tail => "tail",
        CallKind::Object { .. } => "object",
    }
}

/// The lowercase name of a trust level, as in [`TRUST_HEADER`].
pub fn trust_name(t: TrustLevel) -> &'static str {
    match t {
        TrustLevel::Untrusted => "untrusted",
        TrustLevel::Standard => "standard",
        TrustLevel::Platform => "platform",
    }
}

/// The runtime's view of the flow a request belongs to, from its context
/// stack (none for a client's request).
pub fn flow_of(stack: &ContextStack) -> Option<Flow> {
    let top = stack.top()?;
    let limits = stack.effective_limits();
    Some(Flow {
        depth: stack.frames().len().saturating_sub(1),
        cpu: limits.cpu_ms.map(std::time::Duration::from_millis),
        memory: limits.memory_bytes,
        deadline: stack.deadline(),
        outbound: top.outbound.as_ref().map(|o| o.script_id.clone()),
        nested_cpu: stack
            .nested_cpu()
            .map(|n| hearth_runtime::instances::cpu::NestedCpu {
                flow_id: n.flow_id,
                left: n.left,
            }),
    })
}

/// Puts the runtime's [`Flow`] for `req`'s context stack (if it has one)
/// into its extensions, where the runtime reads it, and, if the flow is
/// traced, a [`Tracing`] sink that reports to the flow's first node.
pub fn attach_flow(req: &mut http::Request<Body>) {
    let Some(stack) = req.extensions().get::<ContextStack>().cloned() else {
        return;
    };
    if let Some(flow) = flow_of(&stack) {
        req.extensions_mut().insert(flow);
    }
    if let Some(reporter) = stack.traces() {
        req.extensions_mut()
            .insert(Tracing(Arc::new(ReportToFirstNode(reporter.clone()))));
    }
}

/// A reporter on a flow's first node: events from any node of the flow go
/// into the runtime's collector there (`sink`, which takes them at once).
fn origin_reporter(sink: Tracing) -> TraceReporter {
    use futures::FutureExt as _;
    TraceReporter::origin_checked(move |events: Vec<TraceEvent>| {
        // The collector answers synchronously: its future is ready.
        match sink.0.report(events).now_or_never() {
            Some(Ok(())) | None => Ok(()),
            Some(Err(e)) => Err(TraceError::Refused(e.to_string())),
        }
    })
}

/// A level's sink: its events go to the flow's first node through the
/// stack's reporter (a `reportTraces` capability when that is another node).
struct ReportToFirstNode(TraceReporter);

impl TraceSink for ReportToFirstNode {
    fn report(
        &self,
        events: Vec<TraceEvent>,
    ) -> BoxFuture<'static, Result<(), hearth_runtime::outbound::tail::ReportError>> {
        let reporter = self.0.clone();
        Box::pin(async move {
            reporter.report(events).await.map_err(|e| match e {
                TraceError::Refused(_) => {
                    hearth_runtime::outbound::tail::ReportError::FlowDelivered
                }
                e => hearth_runtime::outbound::tail::ReportError::Unreachable(e.to_string()),
            })
        })
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use super::*;

    fn call(kind: CallKind, bindings: Bindings) -> NestedCall {
        NestedCall {
            caller: "caller".into(),
            target: "callee".into(),
            kind,
            depth: 2,
            cpu_left: Duration::from_millis(250),
            deadline: Instant::now() + Duration::from_secs(5),
            caller_bindings: Arc::new(bindings),
            caller_extensions: http::Extensions::new(),
            nested_cpu: None,
        }
    }

    fn dispatcher() -> Bindings {
        Bindings {
            dispatch: [("users".into(), ["u".to_string()].into_iter().collect())].into(),
            outbound: Some("egress".into()),
            tail: vec!["traces".into()],
            ..Bindings::default()
        }
    }

    #[test]
    fn dispatch_makes_an_untrusted_level_under_the_dispatchers_outbound() {
        let mut stack = ContextStack::new();
        stack.push(entry_frame("dispatcher", &dispatcher()));
        assert_eq!(stack.frames()[0].trust, TrustLevel::Platform);
        assert_eq!(stack.frames()[0].tail_workers.len(), 1);
        let f = callee_frame(
            &stack,
            &call(CallKind::Dispatch("users".into()), dispatcher()),
        );
        assert_eq!(f.trust, TrustLevel::Untrusted);
        assert_eq!(
            f.outbound.as_ref().map(|o| o.script_id.as_str()),
            Some("egress")
        );
        assert_eq!(f.limits.cpu_ms, Some(250));
        assert!(
            f.tail_workers.is_empty(),
            "only the entry's deploy sets tail Workers"
        );
        stack.push(f);
        // The user Worker's own service bindings keep it untrusted and under
        // the outbound Worker, whatever its bindings say.
        let g = callee_frame(&stack, &call(CallKind::Service("x".into()), dispatcher()));
        assert_eq!(g.trust, TrustLevel::Untrusted);
        assert_eq!(
            g.outbound.as_ref().map(|o| o.script_id.as_str()),
            Some("egress")
        );
        // The outbound Worker runs with the entry's trust, and has no
        // outbound Worker itself.
        let o = callee_frame(&stack, &call(CallKind::Outbound, Bindings::default()));
        assert_eq!(o.trust, TrustLevel::Platform);
        assert!(o.outbound.is_none());
    }

    #[test]
    fn an_objects_level_runs_as_its_script_with_a_service_bindings_trust() {
        let mut stack = ContextStack::new();
        stack.push(entry_frame("dispatcher", &dispatcher()));
        let mut object = call(
            CallKind::Object {
                binding: "COUNTER".into(),
                script: "counter".into(),
            },
            Bindings::default(),
        );
        object.target = "do:counter/Counter/00".into();
        let f = callee_frame(&stack, &object);
        assert_eq!(f.script_id, "counter", "the script, not the ring key");
        assert_eq!(f.trust, TrustLevel::Platform, "the caller's trust");
        assert_eq!(call_kind_name(&object.kind), "object");
    }

    #[test]
    fn a_flow_takes_the_tightest_limits_of_its_stack() {
        let mut stack = ContextStack::new();
        stack.push(entry_frame("a", &Bindings::default()));
        let mut f = callee_frame(
            &stack,
            &call(CallKind::Service("b".into()), Bindings::default()),
        );
        f.limits.cpu_ms = Some(40);
        stack.push(f);
        let mut g = callee_frame(
            &stack,
            &call(CallKind::Service("c".into()), Bindings::default()),
        );
        g.limits.cpu_ms = Some(900);
        stack.push(g);
        let flow = flow_of(&stack).expect("a flow");
        assert_eq!(flow.depth, 2);
        assert_eq!(flow.cpu, Some(Duration::from_millis(40)));
        assert!(flow_of(&ContextStack::new()).is_none());
    }
}
