//! The shard server: how a home answers sharded requests.
//!
//! Every inter-node connection's bootstrap capability is a `ShardServer`.
//! A shard client calls `dispatch(scriptId, context, lazy)` and, without
//! waiting, pipelines `fetch` on the `worker` it will get back. The home asks
//! its admission control ([`crate::overload`]):
//!
//! * **admitted** → it answers with a Worker of its own for that one
//!   request, holding the in-flight [`Permit`]; the pipelined `fetch`
//!   lands there, runs the Worker through
//!   [`crate::local::LocalWorkers::serve`] (cold-starting it if needed), and
//!   streams the response back;
//! * **refused** → it answers with `lazy`, the caller's own capability. That
//!   is the whole refusal: no error, no "go away" message. The caller
//!   recognises its own object and serves the request itself.
//!
//! The context stack that came with the request is rebuilt as native
//! structs and handed to the Worker in the request's extensions.
//!
//! Everything a peer sends is checked (sizes, UTF-8, heads); a bad call
//! fails that call, never the node.

use std::future::Future;
use std::sync::Arc;

use crate::context_stack::{self, ContextStack};
use crate::local_fetch::{Closed, WorkerHost, serve_fetch};
use crate::overload::{OverloadGate, Permit};
use crate::schema::hearth_capnp::{shard_server, worker};
use std::cell::RefCell;

/// Longest script ID accepted from a peer, in bytes.
pub const MAX_SCRIPT_ID_BYTES: usize = 1024;

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
        let script_id = p.get_script_id()?;
        if script_id.len() > MAX_SCRIPT_ID_BYTES || script_id.is_empty() {
            return Err(capnp::Error::failed(format!(
                "script ID must be 1 to {MAX_SCRIPT_ID_BYTES} bytes"
            )));
        }
        let script_id = script_id
            .to_str()
            .map_err(|e| capnp::Error::failed(format!("script ID is not UTF-8: {e}")))?
            .to_string();
        let context = context_stack::read_context(p.get_context()?)
            .map_err(|e| capnp::Error::failed(e.to_string()))?;
        let lazy = p.get_lazy()?;

        let local = &self.shared.host.local;
        match self
            .shared
            .gate
            .try_admit(&script_id, || local.can_host(&script_id))
        {
            Ok(permit) => {
                let home_worker = HomeWorker {
                    script_id,
                    host: self.shared.host.clone(),
                    admitted: RefCell::new(Some((permit, context))),
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
}

impl shard_server::Server for ShardServerImpl {
    fn dispatch(
        self: capnp::capability::Rc<Self>,
        params: shard_server::DispatchParams,
        results: shard_server::DispatchResults,
    ) -> impl Future<Output = Result<(), capnp::Error>> + 'static {
        std::future::ready(self.dispatch_now(params, results))
    }
}

/// The home's Worker for one admitted request: serves a single `fetch`.
/// Dropped unused (the caller cancelled), it gives its permit back.
struct HomeWorker {
    script_id: String,
    host: WorkerHost,
    admitted: RefCell<Option<(Permit, ContextStack)>>,
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
                None => Err(capnp::Error::failed(
                    "a dispatched Worker serves exactly one request".into(),
                )),
            }
        }
    }
}
