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
//! request through [`crate::hosted_workers::HostedWorkers::serve`], which cold-starts
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
//! like any Worker, and like any request that arrives over the network it
//! must pass this node's admission control ([`crate::admission`]) first: a
//! peer holding the capability cannot run Workers here past the limits a
//! sharded request meets. This keeps "served exactly once, body
//! byte-exact" independent of how the reflected calls interleave with the
//! take-back.

use std::cell::Cell;
use std::future::Future;
use std::sync::Arc;

use tokio::sync::Notify;

use crate::admission::OverloadGate;
use crate::context_stack::ContextStack;
use crate::hosted_workers::Body;
use crate::routing::Route;
use crate::schema::hearth_capnp::worker;
use crate::worker_fetch::{WorkerHost, serve_fetch};

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
    gate: Arc<OverloadGate>,
    context: ContextStack,
    state: Cell<State>,
    decided: Notify,
}

impl LazyInstance {
    /// An undecided instance; a network `fetch` after release is admitted
    /// through `gate`.
    pub(crate) fn new(
        script_id: &str,
        host: WorkerHost,
        gate: Arc<OverloadGate>,
        context: ContextStack,
    ) -> Self {
        LazyInstance {
            script_id: script_id.to_string(),
            host,
            gate,
            context,
            state: Cell::new(State::Undecided),
            decided: Notify::new(),
        }
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
        Some(self.host.serve(Route::Fallback, &self.script_id, request))
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
        let workers = &self.host.workers;
        let permit = self
            .gate
            .try_admit(&self.script_id, || workers.can_host(&self.script_id))
            .map_err(|reason| {
                capnp::Error::overloaded(format!("this node does not admit the request ({reason})"))
            })?;
        serve_fetch(
            &self.host,
            &self.script_id,
            self.context.clone(),
            params,
            results,
            Some(permit),
            None,
        )
        .await
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use futures::FutureExt as _;
    use futures::future::BoxFuture;

    use super::*;
    use crate::admission::OverloadConfig;
    use crate::byte_stream::ResponseSinkServer;
    use crate::hosted_workers::HostedWorkers;
    use hearth_body::full;

    #[derive(Default)]
    struct Counting(AtomicUsize);

    impl HostedWorkers for Counting {
        fn serve(
            &self,
            _role: Route,
            _script_id: &str,
            _req: http::Request<Body>,
        ) -> BoxFuture<'static, http::Response<Body>> {
            self.0.fetch_add(1, Ordering::SeqCst);
            async { http::Response::new(full("ran")) }.boxed()
        }
        fn is_warm(&self, _script_id: &str) -> bool {
            false
        }
        fn can_host(&self, _script_id: &str) -> bool {
            true
        }
    }

    async fn network_fetch(lazy: LazyInstance) -> Result<(), capnp::Error> {
        let lazy: worker::Client = capnp_rpc::new_client(lazy);
        let mut fetch = lazy.fetch_request();
        {
            let mut head = fetch.get().init_head();
            head.set_method("GET");
            head.set_uri("/");
        }
        let (sink, _response) = ResponseSinkServer::new_pair();
        fetch.get().set_response(sink);
        fetch.send().promise.await.map(|_| ())
    }

    #[tokio::test]
    async fn a_released_instance_admits_network_fetches_like_any_sharded_request() {
        let local = tokio::task::LocalSet::new();
        local
            .run_until(async {
                let workers = Arc::new(Counting::default());
                let host = WorkerHost {
                    workers: workers.clone(),
                };
                let gate = OverloadGate::new(OverloadConfig {
                    max_in_flight_per_worker: 1,
                    ..OverloadConfig::default()
                });
                let lazy = |gate: &Arc<OverloadGate>| {
                    let lazy =
                        LazyInstance::new("w", host.clone(), gate.clone(), ContextStack::new());
                    lazy.release();
                    lazy
                };
                // The Worker's one slot is taken: a peer's fetch is refused.
                let held = gate.try_admit("w", || true).expect("first permit");
                let refused = network_fetch(lazy(&gate)).await;
                assert!(
                    refused
                        .as_ref()
                        .is_err_and(|e| e.kind == capnp::ErrorKind::Overloaded),
                    "{refused:?}"
                );
                assert_eq!(workers.0.load(Ordering::SeqCst), 0);
                // With the slot free it is served, and gives the slot back.
                drop(held);
                network_fetch(lazy(&gate)).await.expect("admitted");
                assert_eq!(workers.0.load(Ordering::SeqCst), 1);
                assert!(gate.try_admit("w", || true).is_ok());
            })
            .await;
    }
}
