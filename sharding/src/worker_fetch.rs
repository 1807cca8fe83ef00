//! Serving a Cap'n Proto `Worker.fetch` call with this node's own Workers.
//!
//! Both Worker capabilities this crate hosts end here: the home's Worker for
//! an accepted sharded request ([`crate::shard_server`]) and a lazy local
//! instance invoked over the network ([`crate::lazy_instance`]). A call is
//! answered at once with the `ByteStream` the caller writes the request body
//! into; the Worker runs through [`HostedWorkers::serve`] in a task of its
//! own on the RPC thread that received the call (its event loop keeps
//! serving the connection while the Worker runs; wasmtime yields at every
//! epoch tick), and its response streams back into the caller's
//! `ResponseSink`.
//!
//! The `fetch` call stays open until the response has been sent. If the
//! caller gives up on it (its client went away: the question is finished)
//! or the calling connection closes before the response is complete, the
//! Worker's invocation is cancelled, so a vanished client or peer cannot
//! pin an in-flight slot or burn CPU (see [`crate::admission::Permit`]).

use std::future::Future;
use std::sync::Arc;

use hearth_body::text_response;
use tokio_util::sync::{CancellationToken, DropGuard};
use tokio_util::task::AbortOnDropHandle;

use crate::admission::Permit;
use crate::byte_stream::{ByteStreamServer, send_response};
use crate::context_stack::ContextStack;
use crate::hosted_workers::{Body, HostedWorkers};
use crate::http_wire;
use crate::inline::{Gathered, gather};
use crate::routing::Route;
use crate::schema::hearth_capnp::worker;

/// This node's Workers, as the RPC layer runs them: on the runtime of the
/// thread that asks (see [`crate::rpc`]'s threads).
#[derive(Clone)]
pub(crate) struct WorkerHost {
    pub(crate) workers: Arc<dyn HostedWorkers>,
}

impl WorkerHost {
    /// Runs `req` on Worker `script_id` in `role` on this thread's runtime.
    /// The invocation is cancelled if the returned future is dropped.
    pub(crate) fn serve(
        &self,
        role: Route,
        script_id: &str,
        req: http::Request<Body>,
    ) -> impl Future<Output = http::Response<Body>> + Send + 'static {
        let task = self.spawn_guarded(self.workers.serve(role, script_id, req));
        async move { task.await.unwrap_or_else(invocation_failed) }
    }

    /// [`WorkerHost::serve`], then [`gather`]s the response body on the
    /// same task (one hand-off back, whether the body comes whole or not).
    pub(crate) fn serve_gathered(
        &self,
        role: Route,
        script_id: &str,
        req: http::Request<Body>,
        limit: usize,
    ) -> impl Future<Output = (http::response::Parts, Gathered)> + Send + 'static {
        let serving = self.workers.serve(role, script_id, req);
        let task = self.spawn_guarded(async move {
            let (parts, body) = serving.await.into_parts();
            (parts, gather(body, limit).await)
        });
        async move {
            match task.await {
                Ok(answer) => answer,
                Err(e) => {
                    let (parts, body) = invocation_failed(e).into_parts();
                    (parts, Gathered::Streaming(body))
                }
            }
        }
    }

    /// Runs `work` on the calling thread's runtime (an RPC thread's, for
    /// anything that arrived over RPC); dropping the returned future aborts
    /// it.
    fn spawn_guarded<T: Send + 'static>(
        &self,
        work: impl Future<Output = T> + Send + 'static,
    ) -> AbortOnDropHandle<T> {
        AbortOnDropHandle::new(tokio::spawn(work))
    }
}

fn invocation_failed(e: tokio::task::JoinError) -> http::Response<Body> {
    text_response(
        http::StatusCode::INTERNAL_SERVER_ERROR,
        format!("the Worker's invocation failed: {e}\n"),
    )
}

/// Cancelled when a connection has closed; every request on the
/// connection waits on a clone (`closed.cancelled()`).
pub(crate) type Closed = CancellationToken;

/// A [`Closed`] signal and the guard that fires it when dropped (the
/// connection's task holds it to its end).
pub(crate) fn closed_signal() -> (DropGuard, Closed) {
    let closed = CancellationToken::new();
    (closed.clone().drop_guard(), closed)
}

/// Answers a `Worker.fetch` call for `script_id` (a request that came over
/// the hop, so served as [`Route::Sharded`]): sets the request-body
/// stream in `results` and releases it to pipelined calls at once
/// (`set_pipeline`), then runs the invocation, which holds `permit` until
/// its response has been sent. The call returns only then, so a caller
/// that gives up (dropping its question sends `Finish`) cancels the
/// invocation, as does a closed connection. Must run on an RPC thread.
pub(crate) async fn serve_fetch(
    host: &WorkerHost,
    script_id: &str,
    context: ContextStack,
    params: worker::FetchParams,
    mut results: worker::FetchResults,
    permit: Option<Permit>,
    closed: Option<Closed>,
) -> Result<(), capnp::Error> {
    let p = params.get()?;
    let parts = http_wire::read_request_head(p.get_head()?)
        .map_err(|e| capnp::Error::failed(e.to_string()))?;
    let sink = p.get_response()?;
    let (stream, body) = ByteStreamServer::new_pair();
    results.get().set_request_body(stream);
    results.set_pipeline()?;
    drop(params);

    let mut request = http::Request::from_parts(parts, body.boxed());
    request.extensions_mut().insert(context);
    let invocation = host.serve(Route::Sharded, script_id, request);

    let work = async move {
        let response = invocation.await;
        send_response(response, sink).await
    };
    let outcome = match closed {
        Some(closed) => {
            tokio::select! {
                result = work => Some(result),
                () = closed.cancelled() => None,
            }
        }
        None => Some(work.await),
    };
    match outcome {
        Some(Ok(_)) => {}
        Some(Err(e)) => {
            tracing::debug!(script_id = %script_id, error = %e, "sending a response to a peer failed")
        }
        None => {
            tracing::debug!(script_id = %script_id, "peer disconnected; invocation cancelled")
        }
    }
    drop(permit);
    Ok(())
}
