//! A Worker's outgoing requests: the runtime's wasi:http hook
//! (`Outbound`'s `send_request`), through which every request a guest
//! makes passes, and which turns it into a nested invocation (a Worker
//! calling a Worker, one more level of its [flow](crate::flow)), a fetch
//! of an allowed origin ([`crate::outbound::egress`]), or denies it.
//!
//! # The model
//!
//! The guest speaks plain wasi:http. For each request the hook resolves the
//! host name against the caller's deployed
//! [bindings](crate::outbound::bindings):
//!
//! * **A binding is a level.** The hook builds the callee's level as
//!   [`crate::flow`] describes (its `x-hearth-*` headers, its depth, the
//!   CPU and deadline it inherits) and hands a [`NestedCall`] to the node's
//!   [`Invoker`]; a call past [`MAX_DEPTH`] fails in the caller with the
//!   wasi:http error code `loop-detected`, logged with the chain's depth.
//!   Every level holds an instance slot only while it runs, so a refused
//!   loop leaves nothing behind. A runtime with no invoker (used on its
//!   own, without a node) denies every nested call.
//! * **Origins are not levels.** A request to a host outside `.internal` with
//!   no outbound Worker in force is fetched by the node if the Worker's
//!   allow-list has it, and denied otherwise ([`crate::outbound::egress`]). It
//!   holds a subrequest slot like a nested call.
//! * **Redirects never lead into bindings.** A binding is reachable only by
//!   a request the guest itself addressed to `.internal`: a redirect from
//!   an origin (or from the outbound Worker that fetched for it) whose
//!   `Location` leads into `.internal` reaches the guest without that
//!   header (`guard_redirect`), counted as `redirects_into_bindings`. So
//!   no guest, whatever language and whatever redirect code it runs (the JS
//!   engine follows redirects; a Rust or Python guest may), can be sent by
//!   an origin into its own bindings. A redirect from origin to origin is
//!   followed by the guest as a new request, which the allow-list checks
//!   like the first.
//! * **Fan-out is bounded.** One invocation has at most
//!   `RuntimeConfig::max_concurrent_subrequests` (6) subrequests in flight:
//!   a call holds one of its slots from the moment it is made until the
//!   response body ends or is dropped. Further calls wait for a slot
//!   (counted as `nested_queued`) until the flow's deadline, then fail with
//!   `HTTP-response-timeout`; how many can wait is bounded by the
//!   instance's resource cap (each holds a `future-incoming-response`). So
//!   a Worker that fires a thousand calls at once runs them six at a time:
//!   it cannot take every instance slot of a Worker it calls (an outbound
//!   Worker shared by many tenants) or of the node.
//! * **Every request carries the loop mark.** A nested call carries the
//!   `CDN-Loop` of the request its caller serves; a fetch of an origin
//!   carries it with one more `hearth` entry; the guest's own `CDN-Loop`
//!   is replaced on both ([`LoopMark`]). So a Worker that fetches a public
//!   name leading back to it is stopped at the front door after
//!   `max_loop_passes` passes, whatever it sets ([`crate::flow`]).
//! * **Nested CPU is bounded per flow.** Every nested invocation of a flow
//!   draws from one CPU budget per node ([`crate::instances::cpu::FlowCpu`],
//!   twice the entry's per-request CPU limit); once it is spent, further calls
//!   fail with an `internal-error` that says so.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use http_body_util::BodyExt;
use wasmtime_wasi_http::{RequestOptions, WasiBody, WasiHttpHooks};

use crate::flow::{
    CALLER_HEADER, DEPTH_HEADER, FLOW_CPU_SPENT, Flow, Invoker, LoopMark, NestedCall,
    UNKNOWN_SCRIPT_HEADER, strip_host_headers,
};
use crate::instances::cpu::CpuMeter;
use crate::limits::MAX_DEPTH;
use crate::outbound::bindings::{Bindings, CallKind, Resolved, resolve};
use crate::outbound::egress::{AllowList, SubrequestOutcome, WorkerEgress};
use crate::stats::Stats;

/// What the host knows about the request an instance is serving, for its
/// outgoing requests.
pub(crate) struct Caller {
    pub(crate) script_id: Arc<str>,
    pub(crate) bindings: Arc<Bindings>,
    /// The origins the Worker may fetch ([`crate::outbound::egress`]).
    pub(crate) allowed: Arc<AllowList>,
    /// The node's client for them, with the Worker's connection cap.
    pub(crate) egress: WorkerEgress,
    /// Fetches this invocation may make (its plan's `subrequests`).
    pub(crate) fetch_limit: u32,
    /// Fetches it has made (or tried).
    pub(crate) fetches: AtomicU32,
    pub(crate) flow: Flow,
    /// The `CDN-Loop` entries of the request it serves: carried on by its
    /// nested calls, one more on its fetches ([`crate::flow`]).
    pub(crate) mark: LoopMark,
    pub(crate) deadline: Instant,
    pub(crate) extensions: http::Extensions,
    pub(crate) meter: Arc<CpuMeter>,
    pub(crate) invoker: Option<Arc<dyn Invoker>>,
    /// The request's trace events, if its flow is traced
    /// ([`crate::outbound::tail`]).
    pub(crate) trace: Option<Arc<crate::outbound::tail::TraceBuffer>>,
    pub(crate) stats: Arc<crate::stats::Stats>,
    /// This invocation's subrequest slots (see the module docs).
    pub(crate) subrequests: Arc<tokio::sync::Semaphore>,
    /// Its flow's CPU budget for nested invocations ([`crate::instances::cpu`]).
    pub(crate) flow_cpu: crate::instances::cpu::FlowCpuHandle,
    /// The node's Durable Objects: its calls to objects, and the names its
    /// IDs are made from ([`crate::objects`]).
    pub(crate) objects: Arc<crate::objects::NodeObjects>,
    /// The object this invocation runs as, if it is an object's.
    pub(crate) object: Option<Arc<crate::objects::ObjectCtx>>,
}

/// Takes the caller's [`OBJECT_URL_HEADER`](crate::objects::OBJECT_URL_HEADER)
/// off a request to an object: the URL the object's request gets, if the
/// caller gave one (an absolute URL, else the call fails).
fn take_object_url(
    headers: &mut http::HeaderMap,
) -> Result<Option<http::Uri>, wasmtime_wasi_http::Error> {
    headers
        .remove(crate::objects::OBJECT_URL_HEADER)
        .map(|v| {
            v.to_str()
                .ok()
                .and_then(|v| v.parse::<http::Uri>().ok())
                .filter(|u| u.scheme().is_some() && u.authority().is_some())
                .ok_or_else(|| {
                    wasmtime_wasi_http::Error::InternalError(Some(format!(
                        "{}: not an absolute URL",
                        crate::objects::OBJECT_URL_HEADER
                    )))
                })
        })
        .transpose()
}

/// The wasi:http hooks of an instance: outgoing requests are nested calls
/// of the request it is serving, fetches of allowed origins, or denied.
#[derive(Default)]
pub(crate) struct Outbound {
    pub(crate) caller: Option<Arc<Caller>>,
}

type SendResult = wasmtime_wasi_http::Result<(
    http::Response<WasiBody>,
    Box<dyn Future<Output = wasmtime_wasi_http::Result<()>> + Send>,
)>;

impl WasiHttpHooks for Outbound {
    // Outgoing bodies (subrequests' and the response's) buffer little, so
    // the host reserve bounds what a guest can park in them (crate::limits).
    fn p2_outgoing_body_buffer_chunks(&mut self) -> usize {
        crate::limits::OUTGOING_BODY_BUFFER_CHUNKS
    }

    fn p2_outgoing_body_chunk_size(&mut self) -> usize {
        crate::limits::OUTGOING_BODY_CHUNK
    }

    fn send_request(
        &mut self,
        request: http::Request<WasiBody>,
        options: Option<RequestOptions>,
        _fut: Box<dyn Future<Output = wasmtime_wasi_http::Result<()>> + Send>,
    ) -> Box<dyn Future<Output = SendResult> + Send> {
        let caller = self.caller.clone();
        let first_byte = options.and_then(|o| o.first_byte_timeout);
        Box::new(async move {
            match caller {
                Some(c) => c.send(request, first_byte).await,
                None => Err(wasmtime_wasi_http::Error::HttpRequestDenied),
            }
        })
    }
}

impl Caller {
    async fn send(
        &self,
        request: http::Request<WasiBody>,
        first_byte: Option<Duration>,
    ) -> SendResult {
        // The output gate: an object's writes are durable before any of
        // its requests leaves ([`crate::objects`]).
        if let Some(object) = &self.object
            && let Err(e) = object.flush().await
        {
            return Err(wasmtime_wasi_http::Error::InternalError(Some(format!(
                "the object's writes could not be made durable, so its request was not sent: {e}"
            ))));
        }
        let what = format!(
            "{} {}",
            request.method(),
            crate::outbound::tail::redact_url(&request.uri().to_string())
        );
        let result = self.send_inner(request, first_byte).await;
        if let Some(t) = &self.trace {
            let how = match &result {
                Ok((r, _)) => r.status().to_string(),
                Err(e) => format!("failed: {e}"),
            };
            t.push("subrequest", format!("{what} -> {how}"));
        }
        result
    }

    async fn send_inner(
        &self,
        request: http::Request<WasiBody>,
        first_byte: Option<Duration>,
    ) -> SendResult {
        let uri = request.uri().clone();
        let external = matches!(
            resolve(&self.bindings, uri.authority().map_or("", |a| a.as_str())),
            Resolved::External
        );
        let (mut response, io) = self.route(request, first_byte).await?;
        if external && guard_redirect(&uri, &mut response) {
            Stats::bump(&self.stats.redirects_into_bindings);
            tracing::info!(script = %self.script_id, %uri,
                "an origin's redirect into .internal was removed (bindings are reached only by requests made to them)");
        }
        Ok((response, io))
    }

    /// Sends `request` where its host leads: a binding, the outbound Worker,
    /// an allowed origin, or nowhere.
    async fn route(
        &self,
        request: http::Request<WasiBody>,
        first_byte: Option<Duration>,
    ) -> SendResult {
        use wasmtime_wasi_http::Error;
        let host = request
            .uri()
            .authority()
            .map(|a| a.as_str().to_string())
            .unwrap_or_default();
        let (target, kind) = match resolve(&self.bindings, &host) {
            Resolved::Worker { script_id, kind } => (script_id, kind),
            Resolved::Object {
                binding,
                target,
                id,
            } => {
                let key = self.object_key(&binding, &target, &id)?;
                if self.invoker.is_none() {
                    // A runtime on its own (no node, so no ring) is every
                    // object's home.
                    return self.call_object(request, key).await;
                }
                // Through the node, like a binding's call: routed by the
                // ring key to the object's home ([`crate::objects`]).
                let script = key.namespace.script.clone();
                (key.ring_key(), CallKind::Object { binding, script })
            }
            Resolved::External => match &self.flow.outbound {
                Some(o) => (o.clone(), CallKind::Outbound),
                None => return self.fetch(request, first_byte).await,
            },
            Resolved::NotBound(why) => {
                Stats::bump(&self.stats.nested_denied);
                tracing::debug!(script = %self.script_id, %host, %why, "outgoing request denied");
                return Err(Error::HttpRequestDenied);
            }
        };
        // The caller is at level depth + 1; its callee one deeper.
        let depth = self.flow.depth + 2;
        if depth > MAX_DEPTH {
            Stats::bump(&self.stats.nested_too_deep);
            tracing::warn!(script = %self.script_id, %target, depth,
                "nested call refused: a flow is at most {MAX_DEPTH} levels deep (a loop of bindings?)");
            return Err(Error::LoopDetected);
        }
        let Some(invoker) = self.invoker.clone() else {
            return Err(Error::InternalError(Some(
                "nested Worker calls need a hearth node".into(),
            )));
        };
        if Instant::now() >= self.deadline {
            return Err(Error::HttpResponseTimeout);
        }
        let slot = self.slot(&target).await?;
        // Every nested invocation of the flow draws from one CPU budget.
        let (flow_id, flow_cpu) = self.flow_cpu.pool();
        if flow_cpu.left().is_zero() {
            Stats::bump(&self.stats.nested_cpu_refused);
            tracing::debug!(script = %self.script_id, %target,
                "nested call refused: the flow's CPU budget for nested calls is spent");
            return Err(Error::InternalError(Some(format!(
                "nested call refused: this flow's CPU budget for nested calls ({:?} on this node) is spent",
                flow_cpu.budget()
            ))));
        }
        let (mut parts, body) = request.into_parts();
        if matches!(kind, CallKind::Object { .. })
            && let Some(url) = take_object_url(&mut parts.headers)?
        {
            parts.uri = url;
        }
        self.nested_head(&mut parts, depth);
        let body = crate::body::boxed(body);
        Stats::bump(&self.stats.nested_calls);
        let call = NestedCall {
            caller: self.script_id.to_string(),
            target,
            kind,
            depth,
            cpu_left: (self.meter.budget().saturating_sub(self.meter.used())).min(flow_cpu.left()),
            deadline: self.deadline,
            caller_bindings: self.bindings.clone(),
            caller_extensions: self.extensions.clone(),
            nested_cpu: Some(crate::instances::cpu::NestedCpu {
                flow_id,
                left: flow_cpu.left(),
            }),
        };
        let response = invoker.invoke(call, http::Request::from_parts(parts, body));
        let response = tokio::time::timeout_at(self.deadline.into(), response)
            .await
            .map_err(|_| Error::HttpResponseTimeout)?;
        // The flow's budget is spent where the callee ran: spent here too.
        let h = response.headers();
        if !h.contains_key(crate::timing::START_HEADER)
            && h.get(UNKNOWN_SCRIPT_HEADER)
                .is_some_and(|v| v == FLOW_CPU_SPENT)
        {
            flow_cpu.spend_all();
        }
        // The slot goes back when the response body ends or is dropped.
        let response = response.map(|b| {
            b.map_err(|e| Error::InternalError(Some(e.to_string())))
                .map_frame(move |frame| {
                    let _held = &slot;
                    frame
                })
                .boxed_unsync()
        });
        Ok((response, Box::new(async { Ok(()) })))
    }

    /// The object `id` of object binding `binding` names
    /// (`http://<binding>.<id>.object.internal/`): the ID checked against
    /// the binding's namespace (an ID of another namespace is refused).
    fn object_key(
        &self,
        binding: &str,
        target: &crate::outbound::bindings::ObjectBinding,
        id: &str,
    ) -> Result<hearth_objects::ObjectKey, wasmtime_wasi_http::Error> {
        let namespace =
            hearth_objects::Namespace::new(target.script_or(&self.script_id), target.class());
        match namespace.id_from_string(id) {
            Ok(id) => Ok(hearth_objects::ObjectKey { namespace, id }),
            Err(e) => {
                Stats::bump(&self.stats.nested_denied);
                tracing::debug!(script = %self.script_id, binding, %id, error = %e,
                    "request to an object refused: not an ID of the binding's namespace");
                Err(wasmtime_wasi_http::Error::InternalError(Some(format!(
                    "{id:?} is not an object ID of Durable Object binding {binding:?} \
                     (class {} of script {}): {e}",
                    namespace.class, namespace.script
                ))))
            }
        }
    }

    /// Makes `parts` the head of a nested call at level `depth`: the
    /// guest's host headers dropped, the host's caller, depth and loop
    /// mark set, and no extensions of the guest's request carried over.
    fn nested_head(&self, parts: &mut http::request::Parts, depth: usize) {
        strip_host_headers(&mut parts.headers);
        if let Ok(v) = http::HeaderValue::from_str(&self.script_id) {
            parts.headers.insert(CALLER_HEADER, v);
        }
        parts
            .headers
            .insert(DEPTH_HEADER, http::HeaderValue::from(depth));
        self.mark.carry(&mut parts.headers);
        parts.extensions = http::Extensions::new();
    }

    /// A request to the Durable Object `key` from a runtime without a node
    /// (no invoker, so no ring: this runtime is every object's home): made
    /// one more level of the flow (as a binding's call), its URL the
    /// caller's [`OBJECT_URL_HEADER`](crate::objects::OBJECT_URL_HEADER) if
    /// it gave one, and served by the resident object here
    /// ([`crate::objects`]). On a node, object calls go through the
    /// invoker instead, to the object's home on the ring. A failure of the
    /// object is a response with an error status, as for a Worker.
    async fn call_object(
        &self,
        request: http::Request<WasiBody>,
        key: hearth_objects::ObjectKey,
    ) -> SendResult {
        use wasmtime_wasi_http::Error;
        let depth = self.flow.depth + 2;
        if depth > MAX_DEPTH {
            Stats::bump(&self.stats.nested_too_deep);
            return Err(Error::LoopDetected);
        }
        if Instant::now() >= self.deadline {
            return Err(Error::HttpResponseTimeout);
        }
        let (mut parts, body) = request.into_parts();
        let url = take_object_url(&mut parts.headers)?;
        let slot = self.slot(&key.ring_key()).await?;
        let (flow_id, flow_cpu) = self.flow_cpu.pool();
        if flow_cpu.left().is_zero() {
            Stats::bump(&self.stats.nested_cpu_refused);
            return Err(Error::InternalError(Some(format!(
                "nested call refused: this flow's CPU budget for nested calls ({:?} on this node) is spent",
                flow_cpu.budget()
            ))));
        }
        if let Some(url) = url {
            parts.uri = url;
        }
        self.nested_head(&mut parts, depth);
        parts.extensions.insert(Flow {
            depth: depth - 1,
            cpu: Some((self.meter.budget().saturating_sub(self.meter.used())).min(flow_cpu.left())),
            memory: None,
            deadline: Some(self.deadline),
            outbound: None,
            nested_cpu: Some(crate::instances::cpu::NestedCpu {
                flow_id,
                left: flow_cpu.left(),
            }),
        });
        if let Some(t) = self.extensions.get::<crate::outbound::tail::Tracing>() {
            parts.extensions.insert(t.clone());
        }
        Stats::bump(&self.stats.nested_calls);
        let request = http::Request::from_parts(parts, crate::body::boxed(body));
        let response = tokio::time::timeout_at(
            self.deadline.into(),
            self.objects.call(key, request, self.deadline),
        )
        .await
        .map_err(|_| Error::HttpResponseTimeout)?
        .unwrap_or_else(|e| crate::runtime::serve::error_response(&e));
        // The slot goes back when the response body ends or is dropped.
        let response = response.map(|b| {
            b.map_err(|e| Error::InternalError(Some(e.to_string())))
                .map_frame(move |frame| {
                    let _held = &slot;
                    frame
                })
                .boxed_unsync()
        });
        Ok((response, Box::new(async { Ok(()) })))
    }

    /// One of this invocation's subrequest slots, waited for until the
    /// flow's deadline (see the module docs).
    async fn slot(
        &self,
        target: &str,
    ) -> Result<tokio::sync::OwnedSemaphorePermit, wasmtime_wasi_http::Error> {
        match self.subrequests.clone().try_acquire_owned() {
            Ok(slot) => Ok(slot),
            Err(_) => {
                Stats::bump(&self.stats.nested_queued);
                let wait = self.subrequests.clone().acquire_owned();
                match tokio::time::timeout_at(self.deadline.into(), wait).await {
                    Ok(Ok(slot)) => Ok(slot),
                    _ => {
                        tracing::debug!(script = %self.script_id, %target,
                            "subrequest waited for a slot until the flow's deadline");
                        Err(wasmtime_wasi_http::Error::HttpResponseTimeout)
                    }
                }
            }
        }
    }

    /// A request to a host outside `.internal` with no outbound Worker in
    /// force: fetched from the origin if the Worker's allow-list has it,
    /// within the plan's fetches per request ([`crate::outbound::egress`]); counted
    /// by outcome either way.
    async fn fetch(
        &self,
        request: http::Request<WasiBody>,
        first_byte: Option<Duration>,
    ) -> SendResult {
        use wasmtime_wasi_http::Error;
        let outcome = |o: SubrequestOutcome| self.stats.subrequests.bump(o);
        let uri = request.uri().clone();
        if !self.allowed.allows(&uri) {
            Stats::bump(&self.stats.nested_denied);
            outcome(SubrequestOutcome::Denied);
            tracing::debug!(script = %self.script_id, %uri,
                "outgoing request denied: not a binding, no outbound Worker, not an allowed host");
            return Err(Error::HttpRequestDenied);
        }
        let made = self.fetches.fetch_add(1, Ordering::Relaxed);
        if made >= self.fetch_limit {
            outcome(SubrequestOutcome::TooMany);
            tracing::debug!(script = %self.script_id, %uri, limit = self.fetch_limit,
                "fetch refused: too many subrequests in one request");
            return Err(Error::ConnectionLimitReached);
        }
        if Instant::now() >= self.deadline {
            outcome(SubrequestOutcome::Timeout);
            return Err(Error::HttpResponseTimeout);
        }
        let slot = match self.slot(&uri.to_string()).await {
            Ok(slot) => slot,
            Err(e) => {
                outcome(SubrequestOutcome::Timeout);
                return Err(e);
            }
        };
        let (mut parts, body) = request.into_parts();
        self.mark.next_pass(&mut parts.headers);
        let request = http::Request::from_parts(parts, crate::body::boxed(body));
        match self.egress.send(request, first_byte, self.deadline).await {
            Ok(response) => {
                outcome(SubrequestOutcome::Ok);
                // The slot goes back when the response body ends or is dropped.
                let response = response.map(|b| {
                    b.map_frame(move |frame| {
                        let _held = &slot;
                        frame
                    })
                    .boxed_unsync()
                });
                Ok((response, Box::new(async { Ok(()) })))
            }
            Err(refused) => {
                outcome(refused.outcome);
                Err(refused.error)
            }
        }
    }
}

/// Removes from `response` (to a request for `uri` that went outside
/// `.internal`) a redirect's `Location` that leads into `.internal`, and
/// says whether it did.
///
/// A `Location` leads there if the WHATWG URL parser (the one the JS engine
/// and Rust's `url` crate use) resolves it, against `uri`, to a host in
/// `.internal`, or if its text names `.internal` anywhere once
/// percent-decoded and lowercased, with `\` read as `/` (another parser
/// may split the same text differently; a false positive costs one
/// redirect not followed, which the Worker sees as a 3xx without
/// `Location`).
pub(crate) fn guard_redirect<B>(uri: &http::Uri, response: &mut http::Response<B>) -> bool {
    if !response.status().is_redirection() {
        return false;
    }
    let leads_in = response
        .headers()
        .get_all(http::header::LOCATION)
        .iter()
        .any(|location| leads_into_internal(uri, location.as_bytes()));
    if leads_in {
        response.headers_mut().remove(http::header::LOCATION);
    }
    leads_in
}

/// Whether `location`, relative to `uri`, may lead into `.internal` (see
/// [`guard_redirect`]).
fn leads_into_internal(uri: &http::Uri, location: &[u8]) -> bool {
    let text = percent_encoding::percent_decode(location)
        .decode_utf8_lossy()
        .to_lowercase()
        .replace('\\', "/");
    if text.contains(".internal") || text.contains("\u{ff0e}internal") {
        return true;
    }
    let Ok(base) = url::Url::parse(&uri.to_string()) else {
        return true;
    };
    let Ok(location) = std::str::from_utf8(location) else {
        return true;
    };
    match base.join(location) {
        Ok(next) => next.host_str().is_some_and(|host| {
            let host = host.trim_end_matches('.');
            host == crate::outbound::bindings::INTERNAL_DOMAIN
                || host.ends_with(&format!(".{}", crate::outbound::bindings::INTERNAL_DOMAIN))
        }),
        // Nothing a parser could follow.
        Err(_) => false,
    }
}

#[cfg(test)]
mod redirect_tests {
    use super::*;

    fn redirected(location: &str) -> http::Response<()> {
        http::Response::builder()
            .status(302)
            .header("location", location)
            .body(())
            .expect("response")
    }

    #[test]
    fn a_redirect_into_internal_loses_its_location_and_others_keep_it() {
        let uri: http::Uri = "http://origin.example:8080/start?x=1".parse().expect("uri");
        for location in [
            "http://auth.internal/",
            "HTTP://AUTH.INTERNAL./secret",
            "//auth.internal/",
            "http:\\\\auth.internal\\",
            "http://auth%2Einternal/",
            "http://auth.%69nternal/",
            "http://user@w.ns.dispatch.internal:80/",
            "http://evil.example\\@auth.internal/",
            "http://auth\u{ff0e}internal/",
        ] {
            let mut resp = redirected(location);
            assert!(guard_redirect(&uri, &mut resp), "{location} kept");
            assert!(resp.headers().get("location").is_none(), "{location}");
        }
        for location in [
            "/next",
            "next",
            "https://other.example/a",
            "http://origin.example:8080/x",
        ] {
            let mut resp = redirected(location);
            assert!(!guard_redirect(&uri, &mut resp), "{location} removed");
            assert_eq!(resp.headers()["location"], location);
        }
        // Only redirects: a 200 with a Location header is left alone.
        let mut ok = http::Response::builder()
            .status(200)
            .header("location", "http://auth.internal/")
            .body(())
            .expect("response");
        assert!(!guard_redirect(&uri, &mut ok));
    }
}
