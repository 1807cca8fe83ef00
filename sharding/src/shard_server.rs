//! The shard server: how a home answers sharded requests.
//!
//! Every inter-node connection's bootstrap capability is a `ShardServer`.
//! A shard client either sends a small request whole with `call` (see
//! [`crate::inline`]), or calls `dispatch(scriptId, context, lazy)` and,
//! without waiting, pipelines `fetch` on the `worker` it will get back.
//! Either way the home asks its admission control ([`crate::admission`]):
//!
//! * **admitted** → it answers with a Worker of its own for that one
//!   request, holding the in-flight [`Permit`]; the pipelined `fetch`
//!   lands there, runs the Worker through
//!   [`crate::hosted_workers::HostedWorkers::serve`] (cold-starting it if needed), and
//!   streams the response back;
//! * **refused** → it answers with `lazy`, the caller's own capability. That
//!   is the whole refusal: no error, no "go away" message. The caller
//!   recognises its own object and serves the request itself.
//!
//! A request for a Durable Object (`scriptId` is its ring key,
//! `do:<script>/<class>/<id>`, [`crate::routing::is_object_key`]) is always
//! admitted ([`crate::admission`]) and served by the node's objects
//! (through the same [`crate::hosted_workers::HostedWorkers::serve`]); the
//! script-ID check here ([`MAX_SCRIPT_ID_BYTES`], UTF-8) takes ring keys
//! as they are, and the runtime checks the key itself.
//!
//! For `call`, "admitted" means the Worker runs right away, on this RPC
//! thread, and the return carries its response when that is small and
//! complete; otherwise the response streams into the caller's sink and the
//! call returns `streamed` once it has been sent.
//!
//! The context stack that came with the request is rebuilt as native
//! structs and handed to the Worker in the request's extensions.
//!
//! Besides requests, a member may ask for a node's live tail of a Worker
//! (`tail`, what `hearth tail` shows when one node gathers the cluster's):
//! the events go to the caller's `TailSink` until it fails or the node
//! drains ([`crate::hosted_workers::HostedWorkers::tail`]).
//!
//! Everything a peer sends is checked (sizes, UTF-8, heads); a bad call
//! fails that call, never the node.

use std::cell::RefCell;
use std::future::Future;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;

use crate::admission::{OverloadGate, Permit};
use crate::byte_stream;
use crate::context_stack::{self, ContextStack};
use crate::hosted_workers::Body;
use crate::http_wire;
use crate::inline::{Gathered, MAX_INLINE_BODY_BYTES};
use crate::routing::Route;
use crate::schema::hearth_capnp::{response_sink, shard_server, worker};
use crate::worker_fetch::{Closed, WorkerHost, serve_fetch};

/// Longest script ID accepted from a peer, in bytes.
pub const MAX_SCRIPT_ID_BYTES: usize = 1024;

/// How long an admitted `dispatch` holds its admission permit waiting for
/// its `fetch`. An honest caller pipelines `fetch` with `dispatch`, so it
/// arrives right behind it; a peer that dispatches and never fetches would
/// otherwise hold the Worker's in-flight slots for as long as it keeps the
/// capability. After this the permit is given back and a late `fetch`
/// fails (nothing ran).
pub const FETCH_PATIENCE: std::time::Duration = std::time::Duration::from_secs(2);

/// What every connection's shard server shares on a node.
pub(crate) struct ServerShared {
    pub(crate) host: WorkerHost,
    pub(crate) gate: Arc<OverloadGate>,
}

/// The `ShardServer` capability of one inbound connection.
pub(crate) struct ShardServerImpl {
    shared: Arc<ServerShared>,
    closed: Closed,
}

impl ShardServerImpl {
    /// The bootstrap capability for a connection whose end is `closed`.
    pub(crate) fn new_client(shared: Arc<ServerShared>, closed: Closed) -> shard_server::Client {
        capnp_rpc::new_client(ShardServerImpl { shared, closed })
    }

    fn dispatch_now(
        &self,
        params: shard_server::DispatchParams,
        mut results: shard_server::DispatchResults,
    ) -> Result<(), capnp::Error> {
        let p = params.get()?;
        let lazy = p.get_lazy()?;
        // What cannot be taken is refused with `lazy`, not failed: an error
        // would not tell the caller that nothing ran here (see
        // `shard_client`), a refusal does.
        let read = || -> Result<(String, ContextStack), capnp::Error> {
            let script_id = read_script_id(p.get_script_id()?)?;
            let context = context_stack::read_context(p.get_context()?)
                .map_err(|e| capnp::Error::failed(e.to_string()))?;
            Ok((script_id, context))
        };
        let (script_id, context) = match read() {
            Ok(read) => read,
            Err(e) => {
                tracing::debug!(error = %e, "refusing a dispatch that cannot be read");
                results.get().set_worker(lazy);
                return Ok(());
            }
        };

        let workers = &self.shared.host.workers;
        match self
            .shared
            .gate
            .try_admit(&script_id, || workers.can_host(&script_id))
        {
            Ok(permit) => {
                let admitted = Rc::new(RefCell::new(Some((permit, context))));
                let waiting = Rc::downgrade(&admitted);
                tokio::task::spawn_local(async move {
                    tokio::time::sleep(FETCH_PATIENCE).await;
                    if let Some(admitted) = waiting.upgrade()
                        && admitted.borrow_mut().take().is_some()
                    {
                        tracing::debug!(
                            "a dispatch was not followed by its fetch; permit returned"
                        );
                    }
                });
                let home_worker = HomeWorker {
                    script_id,
                    host: self.shared.host.clone(),
                    admitted,
                    closed: self.closed.clone(),
                };
                results
                    .get()
                    .set_worker(capnp_rpc::new_client::<worker::Client, _>(home_worker));
            }
            Err(reason) => {
                tracing::debug!(script_id = %script_id, %reason, "refusing sharded request");
                results.get().set_worker(lazy);
            }
        }
        Ok(())
    }

    /// The synchronous half of `call`: checks what the peer sent and asks
    /// admission control.
    fn admit_call(&self, params: &shard_server::CallParams) -> Result<CallAdmission, capnp::Error> {
        let p = params.get()?;
        let script_id = read_script_id(p.get_script_id()?)?;
        let context = context_stack::read_context(p.get_context()?)
            .map_err(|e| capnp::Error::failed(e.to_string()))?;
        let parts = http_wire::read_request_head(p.get_head()?)
            .map_err(|e| capnp::Error::failed(e.to_string()))?;
        let body = p.get_body()?;
        if body.len() > MAX_INLINE_BODY_BYTES {
            return Err(capnp::Error::failed(format!(
                "an inline request body is at most {MAX_INLINE_BODY_BYTES} bytes (got {})",
                body.len()
            )));
        }
        let lazy = p.get_lazy()?;
        let sink = p.get_response()?;
        let workers = &self.shared.host.workers;
        match self
            .shared
            .gate
            .try_admit(&script_id, || workers.can_host(&script_id))
        {
            Ok(permit) => {
                let mut request = http::Request::from_parts(
                    parts,
                    hearth_body::full(Bytes::copy_from_slice(body)),
                );
                request.extensions_mut().insert(context);
                Ok(CallAdmission::Admitted(Box::new(AdmittedCall {
                    script_id,
                    request,
                    sink,
                    permit,
                })))
            }
            Err(reason) => {
                tracing::debug!(script_id = %script_id, %reason, "refusing sharded request");
                Ok(CallAdmission::Refused(lazy))
            }
        }
    }
}

enum CallAdmission {
    /// The caller's own lazy capability, to hand back.
    Refused(worker::Client),
    Admitted(Box<AdmittedCall>),
}

struct AdmittedCall {
    script_id: String,
    request: http::Request<Body>,
    sink: response_sink::Client,
    permit: Permit,
}

/// Checks a script ID a peer sent.
fn read_script_id(text: capnp::text::Reader<'_>) -> Result<String, capnp::Error> {
    if text.len() > MAX_SCRIPT_ID_BYTES || text.is_empty() {
        return Err(capnp::Error::failed(format!(
            "script ID must be 1 to {MAX_SCRIPT_ID_BYTES} bytes"
        )));
    }
    text.to_str()
        .map(str::to_string)
        .map_err(|e| capnp::Error::failed(format!("script ID is not UTF-8: {e}")))
}

fn micros_since(t: Instant) -> u64 {
    u64::try_from(t.elapsed().as_micros()).unwrap_or(u64::MAX)
}

impl shard_server::Server for ShardServerImpl {
    /// Runs the node's prewarm (bounded by the node, see
    /// [`crate::hosted_workers::HostedWorkers::prewarm`]) and answers with what it
    /// did. A peer that closes the connection cancels nothing: a load that
    /// has started finishes, as it would for the next request.
    fn prewarm(
        self: capnp::capability::Rc<Self>,
        params: shard_server::PrewarmParams,
        mut results: shard_server::PrewarmResults,
    ) -> impl Future<Output = Result<(), capnp::Error>> + 'static {
        let started = params
            .get()
            .and_then(|p| read_script_id(p.get_script_id()?))
            .map(|id| self.shared.host.workers.prewarm(&id));
        async move {
            use crate::hosted_workers::PrewarmOutcome as O;
            use crate::schema::hearth_capnp::PrewarmOutcome as W;
            let outcome = match started?.await {
                O::Loaded => W::Loaded,
                O::AlreadyWarm => W::AlreadyWarm,
                O::Dropped => W::Dropped,
                O::Failed => W::Failed,
            };
            results.get().set_outcome(outcome);
            Ok(())
        }
    }

    /// Revalidates this node's warm copy against the store (see
    /// [`crate::hosted_workers::HostedWorkers::redeployed`]) and answers when done.
    fn redeployed(
        self: capnp::capability::Rc<Self>,
        params: shard_server::RedeployedParams,
        _results: shard_server::RedeployedResults,
    ) -> impl Future<Output = Result<(), capnp::Error>> + 'static {
        let started = params.get().and_then(|p| {
            let id = read_script_id(p.get_script_id()?)?;
            let hash = p
                .get_hash()?
                .to_str()
                .map_err(|e| capnp::Error::failed(format!("hash is not UTF-8: {e}")))?;
            Ok(self.shared.host.workers.redeployed(&id, hash))
        });
        async move {
            started?.await;
            Ok(())
        }
    }

    /// Drops this node's warm copy if it is not the Worker's home.
    fn hand_back(
        self: capnp::capability::Rc<Self>,
        params: shard_server::HandBackParams,
        mut results: shard_server::HandBackResults,
    ) -> impl Future<Output = Result<(), capnp::Error>> + 'static {
        let dropped = params
            .get()
            .and_then(|p| read_script_id(p.get_script_id()?))
            .map(|id| self.shared.host.workers.hand_back(&id));
        std::future::ready(dropped.map(|d| results.get().set_dropped(d)))
    }

    /// Streams this node's live tail of a Worker into the caller's sink
    /// until the sink fails (its reader left), the caller finishes the
    /// call, or this node drains (the tail ends).
    fn tail(
        self: capnp::capability::Rc<Self>,
        params: shard_server::TailParams,
        _results: shard_server::TailResults,
    ) -> impl Future<Output = Result<(), capnp::Error>> + 'static {
        let opened = params.get().and_then(|p| {
            let id = read_script_id(p.get_script_id()?)?;
            let status = p
                .get_status()?
                .to_str()
                .map_err(|_| capnp::Error::failed("tail status is not UTF-8".into()))?
                .to_string();
            Ok((id, status, p.get_sample(), p.get_sink()?))
        });
        let host = self.shared.host.workers.clone();
        async move {
            use futures::StreamExt;
            let (id, status, sample, sink) = opened?;
            let mut events = host
                .tail(&id, &status, sample)
                .map_err(capnp::Error::failed)?;
            while let Some(json) = events.next().await {
                let mut request = sink.event_request();
                request.get().set_json(json.as_str());
                request.send().await?;
            }
            Ok(())
        }
    }

    fn dispatch(
        self: capnp::capability::Rc<Self>,
        params: shard_server::DispatchParams,
        results: shard_server::DispatchResults,
    ) -> impl Future<Output = Result<(), capnp::Error>> + 'static {
        std::future::ready(self.dispatch_now(params, results))
    }

    /// Admits or refuses at once; an admitted request runs on this RPC
    /// thread and its response comes back inline if it is small and
    /// complete, else streams into the caller's sink. The call returns only
    /// then, so a caller that gives up, or a closed connection, cancels the
    /// invocation (its permit is held until the end).
    fn call(
        self: capnp::capability::Rc<Self>,
        params: shard_server::CallParams,
        mut results: shard_server::CallResults,
    ) -> impl Future<Output = Result<(), capnp::Error>> + 'static {
        let received = Instant::now();
        let admission = self.admit_call(&params);
        let host = self.shared.host.clone();
        let closed = self.closed.clone();
        async move {
            // Held to the end, so the releases of the capabilities it
            // carries leave with the return, in one write.
            let _params = params;
            let call = match admission? {
                CallAdmission::Refused(lazy) => {
                    let mut answer = results.get();
                    answer.set_refused(lazy);
                    answer.set_home_micros(micros_since(received));
                    return Ok(());
                }
                CallAdmission::Admitted(call) => *call,
            };
            let AdmittedCall {
                script_id,
                request,
                sink,
                permit,
            } = call;
            let work = async {
                let (parts, body) = host
                    .serve_gathered(Route::Sharded, &script_id, request, MAX_INLINE_BODY_BYTES)
                    .await;
                match byte_stream::relayable(parts, body) {
                    (parts, Ok(Gathered::Whole(body))) => {
                        let mut answer = results.get();
                        let mut inline = answer.reborrow().init_response();
                        http_wire::write_response_head(&parts, inline.reborrow().init_head());
                        inline.set_body(&body);
                        answer.set_home_micros(micros_since(received));
                        Ok(())
                    }
                    (parts, Ok(Gathered::Streaming(body)) | Err(body)) => {
                        let response = http::Response::from_parts(parts, body);
                        byte_stream::send_response(response, sink).await?;
                        let mut answer = results.get();
                        answer.set_streamed(());
                        answer.set_home_micros(micros_since(received));
                        Ok(())
                    }
                }
            };
            let result = tokio::select! {
                result = work => result,
                () = closed.cancelled() => {
                    tracing::debug!(script_id = %script_id, "peer disconnected; invocation cancelled");
                    Ok(())
                }
            };
            drop(permit);
            result
        }
    }
}

/// The home's Worker for one admitted request: serves a single `fetch`,
/// if it comes within [`FETCH_PATIENCE`]. Dropped unused (the caller
/// cancelled), it gives its permit back.
struct HomeWorker {
    script_id: String,
    host: WorkerHost,
    admitted: Rc<RefCell<Option<(Permit, ContextStack)>>>,
    closed: Closed,
}

impl worker::Server for HomeWorker {
    fn fetch(
        self: capnp::capability::Rc<Self>,
        params: worker::FetchParams,
        results: worker::FetchResults,
    ) -> impl Future<Output = Result<(), capnp::Error>> + 'static {
        let admitted = self.admitted.borrow_mut().take();
        async move {
            match admitted {
                Some((permit, context)) => {
                    serve_fetch(
                        &self.host,
                        &self.script_id,
                        context,
                        params,
                        results,
                        Some(permit),
                        Some(self.closed.clone()),
                    )
                    .await
                }
                None => Err(capnp::Error::failed(format!(
                    "a dispatched Worker serves exactly one request, and only if its fetch \
                     follows within {FETCH_PATIENCE:?}"
                ))),
            }
        }
    }
}
