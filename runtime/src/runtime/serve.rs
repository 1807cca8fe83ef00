//! Serving: a request handed to its Worker, and what the client sees.
//!
//! [`Runtime::handle`] finds the Worker (warm, or loaded once), refuses a
//! user Worker reached without a flow, picks the version during a split,
//! and runs the request on an instance, timing each phase.
//! [`Runtime::serve`] turns the outcome into the response a client sees:
//! the Worker's, with `x-hearth-start` and `server-timing`
//! ([`decorate`]), or a failure's ([`error_response`]). A prewarm runs
//! what a cold start runs before the handler.

use std::time::Instant;

use serde::Serialize;

use crate::body::{self, Body};
use crate::error::RuntimeError;
use crate::flow::{FLOW_CPU_SPENT, REQUEST_ID_HEADER, UNKNOWN_SCRIPT_HEADER, request_id};
use crate::stats::Stats;
use crate::store::misses::{UNKNOWN_WARN_EVERY, WarnEvery};
use crate::store::validate::valid_script_id;
use crate::timing::{SERVER_TIMING_HEADER, START_HEADER, Start, Timing};

use super::{Runtime, lock};

/// What [`Runtime::prewarm`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Prewarm {
    /// The Worker was loaded (and an instance started) for the prewarm.
    Loaded,
    /// The Worker was resident already; at most an instance was started.
    AlreadyWarm,
    /// Not loaded: it would not fit without evicting a Worker used within
    /// the busy window (memory pressure drops prewarms first).
    NoRoom,
}

/// A served request: the response and how it was produced.
pub struct Served {
    /// The Worker's response (its body may still be streaming).
    pub response: http::Response<Body>,
    /// Whether the Worker was warm.
    pub start: Start,
    /// The phases that ran.
    pub timing: Timing,
}

impl Served {
    /// The response with `x-hearth-start` and `server-timing` added (see
    /// [`decorate`]): what a client of this Worker sees.
    pub fn into_response(self) -> http::Response<Body> {
        let mut response = self.response;
        decorate(response.headers_mut(), self.start, &self.timing);
        response
    }
}

impl Runtime {
    /// Prepares `script_id` for its next request without serving one: what
    /// a cold start runs before the handler (fetch, compile or load the
    /// artifact, instantiate with the top-level code under the startup CPU
    /// budget), leaving the Worker resident with an idle instance. The
    /// first request after it reports `x-hearth-start: prewarmed` and no
    /// fetch or compile phase. Concurrent prewarms and requests share one
    /// load. It takes no request slot (the caller bounds how many run at
    /// once), and it never evicts a busier Worker: a Worker that does not
    /// fit without doing so is not loaded ([`Prewarm::NoRoom`]).
    pub async fn prewarm(&self, script_id: &str) -> Result<Prewarm, RuntimeError> {
        if !valid_script_id(script_id) {
            return Err(RuntimeError::UnknownScript(script_id.into()));
        }
        if !self.is_warm(script_id) {
            // Its real size, read off the async path (a prewarm can wait;
            // unlike `can_host` it never guesses).
            let meta = self
                .store_meta(script_id)
                .await
                .map_err(|e| RuntimeError::Load {
                    script_id: script_id.into(),
                    message: e.to_string(),
                })?
                .ok_or_else(|| RuntimeError::UnknownScript(script_id.into()))?;
            if !self.fits(meta.size) {
                return Ok(Prewarm::NoRoom);
            }
        }
        let mut timing = Timing::default();
        let (worker, start) = self.worker(script_id, &mut timing, true).await?;
        worker.prewarm_instance().await?;
        let bytes = worker.bytes();
        let ev = lock(&self.inner.resident).set_bytes(script_id, bytes);
        self.count(ev);
        Ok(match start {
            Start::Cold => Prewarm::Loaded,
            Start::Warm | Start::Prewarmed => Prewarm::AlreadyWarm,
        })
    }

    /// Serves `req` with Worker `script_id`.
    pub async fn handle(
        &self,
        script_id: &str,
        req: http::Request<Body>,
    ) -> Result<Served, RuntimeError> {
        if script_id.starts_with(hearth_objects::RING_KEY_PREFIX) {
            return self.handle_object(script_id, req).await;
        }
        let inner = &self.inner;
        Stats::bump(&inner.stats.requests);
        let mut timing = Timing::default();
        let (primary, mut start) = match self.worker(script_id, &mut timing, false).await {
            Ok(found) => found,
            Err(e) => {
                if matches!(e, RuntimeError::UnknownScript(_)) {
                    Stats::bump(&inner.stats.unknown_scripts);
                }
                return Err(e);
            }
        };
        // A user Worker runs only as a nested call: a request without a
        // flow is a client's (at any front door, or forwarded to this
        // home), and never reaches it. The one check for every path.
        if primary.meta.dispatch_only && req.extensions().get::<crate::flow::Flow>().is_none() {
            Stats::bump(&inner.stats.dispatch_only_refused);
            return Err(RuntimeError::DispatchOnly(script_id.into()));
        }
        // During a split the request's key picks the version
        // ([`crate::store::versions`]).
        let split = !primary.meta.split.is_empty();
        let version = crate::store::versions::choose(&primary.meta, req.headers());
        let worker = if version == primary.meta.number() {
            primary.clone()
        } else {
            let (w, loaded) = self.alt_worker(&primary, version).await?;
            if loaded {
                start = Start::Cold;
            }
            w
        };
        Stats::bump(match start {
            Start::Cold => &inner.stats.cold,
            Start::Warm => &inner.stats.warm,
            Start::Prewarmed => &inner.stats.prewarmed,
        });
        let t = Instant::now();
        let served = worker.serve(req).await;
        if split {
            let error = served
                .as_ref()
                .map_or(true, |(r, _)| r.status().is_server_error());
            inner
                .versions
                .record(script_id, &primary.meta.split, version, error);
        }
        let (mut response, started) = served?;
        response.headers_mut().insert(
            crate::store::versions::VERSION_HEADER,
            http::HeaderValue::from(version),
        );
        if let Some(s) = started {
            timing.instantiate = Some(s.wall);
            timing.startup_cpu = Some(s.cpu);
        }
        timing.handler = Some(t.elapsed() - timing.instantiate.unwrap_or_default());
        let bytes = primary.bytes();
        let ev = lock(&inner.resident).set_bytes(script_id, bytes);
        self.count(ev);
        Ok(Served {
            response,
            start,
            timing,
        })
    }

    /// Serves `req` on the Durable Object whose ring key is `ring_key`
    /// (`do:<script>/<class>/<id>`): the node routed it here because this
    /// node is the object's home ([`crate::objects`]). Only a nested call
    /// (a request with a [`crate::flow::Flow`]) reaches an object: a
    /// client's request for a ring key, like one for a key that names no
    /// object of its namespace, is an unknown script (404), so no front
    /// door can address an object directly.
    async fn handle_object(
        &self,
        ring_key: &str,
        req: http::Request<Body>,
    ) -> Result<Served, RuntimeError> {
        let unknown = || RuntimeError::UnknownScript(ring_key.into());
        let flow = req
            .extensions()
            .get::<crate::flow::Flow>()
            .ok_or_else(unknown)?;
        let key = hearth_objects::ObjectKey::from_ring_key(ring_key).map_err(|_| unknown())?;
        let deadline = flow.deadline.unwrap_or_else(|| {
            Instant::now()
                + crate::limits::PlanLimits::default_for(crate::limits::Plan::default())
                    .request_wall
        });
        let objects = &self.inner.node.objects;
        let start = if objects.is_resident(&key) {
            Start::Warm
        } else {
            Start::Cold
        };
        let t = Instant::now();
        let response = objects.call(key, req, deadline).await?;
        Ok(Served {
            response,
            start,
            timing: Timing {
                handler: Some(t.elapsed()),
                ..Timing::default()
            },
        })
    }

    /// Whether a front door lets in a client's request for `script_id`
    /// with `headers`: refused ([`RuntimeError::LoopDetected`], counted as
    /// `loop_refused`) if it has passed through hearth's egress more than
    /// `RuntimeConfig::max_loop_passes` times (loops through the front
    /// door, [`crate::flow`]). A front door asks before it routes the
    /// request, so a refused one takes no slot anywhere.
    pub fn admit_loop(
        &self,
        script_id: &str,
        headers: &http::HeaderMap,
    ) -> Result<(), RuntimeError> {
        let passes = crate::flow::LoopMark::of(headers).passes();
        let max = self.inner.config.max_loop_passes;
        if passes <= max {
            return Ok(());
        }
        Stats::bump(&self.inner.stats.loop_refused);
        Err(RuntimeError::LoopDetected {
            script_id: script_id.into(),
            passes,
            max,
        })
    }

    /// Serves `req` with Worker `script_id`, turning failures into responses
    /// with a clear body, and adds the `x-hearth-start` and `server-timing`
    /// headers.
    pub async fn serve(&self, script_id: &str, req: http::Request<Body>) -> http::Response<Body> {
        match self.handle(script_id, req).await {
            Ok(served) => served.into_response(),
            Err(e) => error_response(&e),
        }
    }
}

/// Adds the `x-hearth-start` and `server-timing` headers.
pub fn decorate(headers: &mut http::HeaderMap, start: Start, timing: &Timing) {
    headers.insert(START_HEADER, http::HeaderValue::from_static(start.as_str()));
    if let Ok(v) = http::HeaderValue::from_str(&timing.header_value()) {
        headers.insert(SERVER_TIMING_HEADER, v);
    }
}

/// The response a client sees for `err`: its status, the short
/// [`RuntimeError::public_message`] and a request ID (also in the
/// `x-hearth-request-id` header). The full error, with any backtrace or
/// path, is logged under the same ID.
pub fn error_response(err: &RuntimeError) -> http::Response<Body> {
    /// Requests for unknown scripts are logged at most this often.
    static UNKNOWN: WarnEvery = WarnEvery::new(UNKNOWN_WARN_EVERY);
    /// Loops refused at the front door, likewise (a client can send a
    /// `CDN-Loop` past the bound at will).
    static LOOPS: WarnEvery = WarnEvery::new(UNKNOWN_WARN_EVERY);
    let id = request_id();
    match err {
        RuntimeError::LoopDetected { .. } => match LOOPS.allow() {
            Some(suppressed) => tracing::warn!(request_id = %id, error = %err, suppressed,
                "request refused at the front door: a loop (at most one such warning every {}s; \
                 `suppressed` were not logged, all are counted in loop_refused)",
                UNKNOWN_WARN_EVERY.as_secs()),
            None => tracing::debug!(request_id = %id, error = %err, "request failed"),
        },
        RuntimeError::UnknownScript(_) | RuntimeError::DispatchOnly(_) => match UNKNOWN.allow() {
            Some(suppressed) => tracing::warn!(request_id = %id, error = %err, suppressed,
                "request for a script not deployed or not routable (at most one such warning \
                 every {}s; `suppressed` were not logged, all are counted in unknown_scripts \
                 or dispatch_only_refused)",
                UNKNOWN_WARN_EVERY.as_secs()),
            None => tracing::debug!(request_id = %id, error = %err, "request failed"),
        },
        _ => tracing::warn!(request_id = %id, error = %err, "request failed"),
    }
    let mut resp = body::text_response(
        err.status(),
        format!("{} (request id {id})\n", err.public_message()),
    );
    if let Ok(v) = http::HeaderValue::from_str(&id) {
        resp.headers_mut().insert(REQUEST_ID_HEADER, v);
    }
    match err {
        RuntimeError::UnknownScript(_) => {
            resp.headers_mut().insert(
                UNKNOWN_SCRIPT_HEADER,
                http::HeaderValue::from_static("unknown-script"),
            );
        }
        RuntimeError::FlowCpuExceeded { .. } => {
            resp.headers_mut().insert(
                UNKNOWN_SCRIPT_HEADER,
                http::HeaderValue::from_static(FLOW_CPU_SPENT),
            );
        }
        _ => {}
    }
    if let Some(secs) = err.retry_after() {
        resp.headers_mut()
            .insert(http::header::RETRY_AFTER, http::HeaderValue::from(secs));
    }
    resp
}
