//! The lazy local instance: a Worker capability that costs nothing until it
//! is invoked.
//!
//! A shard client sends every sharded request with a capability to a lazy
//! instance of the same Worker on its own node. Creating one is allocating a
//! small object; nothing is fetched, compiled or started. An overloaded home
//! refuses by returning this very capability, and Cap'n Proto hands a
//! capability back to the vat that hosts it as the local object itself, so
//! the shard client recognises it
//! ([`capnp_rpc::CapabilityServerSet::get_local_server_of_resolved`]) and
//! *takes the request back* (`LazyInstance::take_back`): it serves the
//! request through [`crate::local::LocalWorkers::serve`], which cold-starts
//! the Worker here, with the full original body (the bytes it had sent
//! speculatively, from the copy it kept, then the rest).
//!
//! # Calls that arrive over the network
//!
//! The shard client pipelines `fetch` (and the first body bytes) on the
//! home's answer before it knows the answer. When the answer is this
//! capability, the home's RPC system forwards those pipelined calls back
//! here. The request they carry is the one the shard client takes back, so
//! a network `fetch` on an instance that is still undecided waits for the
//! shard client's decision; after a take-back it fails (nobody is waiting for
//! its answer) and the reflected body bytes are dropped. Only if the home
//! *accepted* (`LazyInstance::release`) does a later network `fetch` serve
//! like any Worker. This keeps "served exactly once, body byte-exact"
//! independent of how the reflected calls interleave with the take-back.

use std::cell::Cell;
use std::future::Future;

use tokio::sync::Notify;

use crate::context_stack::ContextStack;
use crate::local::Body;
use crate::local_fetch::{WorkerHost, serve_fetch};
use crate::schema::hearth_capnp::worker;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// The shard client has not heard from the home yet.
    Undecided,
    /// The shard client took its request back and serves it here.
    TakenBack,
    /// The home accepted the request; the instance is an ordinary Worker.
    Released,
}

/// A Worker capability for `script_id` on this node, started only when
/// invoked. Lives on an RPC thread.
pub struct LazyInstance {
    script_id: String,
    host: WorkerHost,
    context: ContextStack,
    state: Cell<State>,
    decided: Notify,
    invoked: Cell<bool>,
}

impl LazyInstance {
    pub(crate) fn new(script_id: &str, host: WorkerHost, context: ContextStack) -> Self {
        LazyInstance {
            script_id: script_id.to_string(),
            host,
            context,
            state: Cell::new(State::Undecided),
            decided: Notify::new(),
            invoked: Cell::new(false),
        }
    }

    /// The Worker this instance runs.
    pub fn script_id(&self) -> &str {
        &self.script_id
    }

    /// Whether it has been invoked, i.e. whether it has cost anything.
    pub fn was_invoked(&self) -> bool {
        self.invoked.get()
    }

    /// Serves the shard client's own request here (after a refusal, or when
    /// the home was unavailable). Returns `None` if the instance was already
    /// decided: a request is taken back at most once.
    pub(crate) fn take_back(
        &self,
        request: http::Request<Body>,
    ) -> Option<impl Future<Output = http::Response<Body>> + Send + 'static> {
        if self.state.get() != State::Undecided {
            return None;
        }
        self.decide(State::TakenBack);
        self.invoked.set(true);
        Some(self.host.serve(&self.script_id, request))
    }

    /// The home accepted the shard client's request; from now on a network
    /// `fetch` serves like any Worker.
    pub(crate) fn release(&self) {
        if self.state.get() == State::Undecided {
            self.decide(State::Released);
        }
    }

    fn decide(&self, state: State) {
        self.state.set(state);
        self.decided.notify_waiters();
    }
}

impl worker::Server for LazyInstance {
    async fn fetch(
        self: capnp::capability::Rc<Self>,
        params: worker::FetchParams,
        results: worker::FetchResults,
    ) -> Result<(), capnp::Error> {
        loop {
            // Registered before the check, so a decision in between is not
            // missed.
            let decided = self.decided.notified();
            match self.state.get() {
                State::Undecided => decided.await,
                State::TakenBack => {
                    return Err(capnp::Error::failed(
                        "this request was refused by the home and is served by its shard client"
                            .into(),
                    ));
                }
                State::Released => break,
            }
        }
        self.invoked.set(true);
        serve_fetch(
            &self.host,
            &self.script_id,
            self.context.clone(),
            params,
            results,
            None,
            None,
        )
        .await
    }
}
