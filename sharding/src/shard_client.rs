//! The shard client: sending a request to its Worker's home, optimistically.
//!
//! The node that received a request for a Worker homed elsewhere does not
//! ask the home for permission first (that would cost a round trip on every
//! sharded request). It sends everything at once.
//!
//! # The common case: one call
//!
//! A request whose body is small and complete ([`crate::inline`]) travels
//! whole in `ShardServer.call(scriptId, context, lazy, head, body,
//! responseSink)`, and the home answers in the call's return: a small
//! complete response inline, `lazy` handed back (refused: served here from
//! the body this node still holds, nothing ran there), or `streamed` (the
//! response went through `responseSink`, as below). Once the call is sent
//! the home may have started the request, so there is no dispatch timeout
//! on this path and a failure is a 502, never a replay.
//!
//! # Large or open-ended bodies: dispatch, fetch, streams
//!
//! Everything else is pipelined on one connection:
//!
//! ```text
//! dispatch(scriptId, context, lazy)          -> worker      (question 1)
//!   worker.fetch(head, responseSink)         -> requestBody (on 1's answer)
//!     requestBody.write(chunk) ...                          (on 2's answer)
//! ```
//!
//! where `lazy` is a capability to a [`LazyInstance`] of the Worker on this
//! node and `responseSink` is where the response will arrive.
//!
//! # The bounded trombone
//!
//! Until the home has answered `dispatch`, the client sends at most
//! [`MAX_SPECULATIVE_BODY_BYTES`] of the request body (256 KiB, or less if
//! configured) and keeps a copy of exactly the bytes it sent. Then it waits
//! for the answer:
//!
//! * **the home's own Worker** (accepted) → the copy is dropped and the rest
//!   of the body streams on to the home; the response streams back into
//!   `responseSink`. Outcome [`ForwardOutcome::Sharded`].
//! * **`lazy` itself** (refused) → Cap'n Proto delivers a capability the
//!   peer hands back as this node's own object, which
//!   [`capnp_rpc::CapabilityServerSet::get_local_server_of_resolved`]
//!   identifies. The client stops sending body bytes to the home and takes
//!   the request back (`LazyInstance::take_back`): it serves it here with
//!   the kept copy followed by the unsent rest of the body, so the body is
//!   byte-exact whatever happened on the wire. Outcome
//!   [`ForwardOutcome::Refused`].
//!
//! This is the "replay the kept copy" design. The home's RPC system still
//! reflects the pipelined `fetch` and the speculative writes back to `lazy`
//! (that is how promise pipelining works); the lazy instance answers the
//! reflected `fetch` with an error nobody waits for, so those bytes are
//! dropped. Either way the body bytes that travel to the home, and back, are
//! bounded by the speculative budget, however large the body is.
//!
//! # Failures (streaming protocol)
//!
//! When nothing can have run on the home (connect error, TLS failure, a
//! home without the method), the request is served here like a refusal:
//! [`ForwardOutcome::Unavailable`], no error for the user. A home that
//! cannot take a `dispatch` it received (even a malformed one) refuses it
//! with `lazy`; any error instead of an answer may be the connection
//! ending after the home read `dispatch` and `fetch`. Once the home may
//! have started the request (it accepted, or `dispatch` and the pipelined
//! `fetch` were sent and then an error or no answer came within
//! [`crate::rpc::RpcConfig::dispatch_timeout`]), it is
//! not replayed, because requests need not be idempotent: the user gets a
//! clear 502 ([`ForwardOutcome::FailedAfterAccept`]) and the questions are
//! dropped, which cancels the request on the home if it is running there.
//! A home that fails mid-body yields a body error. At most once, always.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::rc::Rc;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use capnp_rpc::CapabilityServerSet;
use hearth_body::{Replay, text_response};
use http_body_util::BodyExt as _;
use tokio::sync::mpsc;

use crate::byte_stream::{
    self, MAX_WRITE_BYTES, ResponseSinkServer, StreamItem, finish_stream, write_chunk,
};
use crate::context_stack::{self, ContextStack};
use crate::hosted_workers::Body;
use crate::http_wire;
use crate::lazy_instance::LazyInstance;
use crate::routing::{HomeAnswer, Route, after_forward};
use crate::rpc::PeerError;
use crate::schema::hearth_capnp::{byte_stream as wire_stream, shard_server, worker};
use crate::worker_fetch::{Closed, WorkerHost};

/// The most request-body bytes sent to a home before it has accepted the
/// request: the bound on the bytes a refusal bounces.
pub const MAX_SPECULATIVE_BODY_BYTES: usize = 256 * 1024;

/// How a forwarded request ended up being served.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ForwardOutcome {
    /// The home accepted and served it ([`Route::Sharded`]).
    Sharded,
    /// The home refused (overloaded) and this node served it
    /// ([`Route::Fallback`]). The Worker is now warm here: keep serving it
    /// locally until it is evicted.
    Refused,
    /// Nothing can have run on the home (no connection, a TLS failure, a
    /// home without the method), and this node served it
    /// ([`Route::Fallback`]).
    Unavailable(String),
    /// The home accepted (or may have: no answer in time, or an error
    /// instead of the answer, such as a lost connection), then failed before its response head; the user
    /// got a 502, never a second execution ([`Route::Sharded`]: the home
    /// was the one serving).
    FailedAfterAccept(String),
}

impl ForwardOutcome {
    /// What the home did, in the routing vocabulary.
    pub fn home_answer(&self) -> HomeAnswer {
        match self {
            ForwardOutcome::Sharded | ForwardOutcome::FailedAfterAccept(_) => HomeAnswer::Accepted,
            ForwardOutcome::Refused => HomeAnswer::Refused,
            ForwardOutcome::Unavailable(_) => HomeAnswer::Unavailable,
        }
    }

    /// The route to report in `x-hearth-route`.
    pub fn route(&self) -> Route {
        after_forward(self.home_answer())
    }
}

/// The result of [`crate::rpc::RpcNode::forward`].
#[derive(Debug)]
pub struct Forwarded {
    /// The response for the user (its body may still be streaming).
    pub response: http::Response<Body>,
    /// How it was served.
    pub outcome: ForwardOutcome,
    /// Time from the start of the forward until the home's answer to
    /// `dispatch` (or until the failure that made this node serve it): the
    /// latency the shard hop added, for `server-timing: shard;dur=…`.
    /// Includes connecting when no connection to the home was open.
    pub hop: Duration,
}

impl Forwarded {
    /// The route to report in `x-hearth-route`.
    pub fn route(&self) -> Route {
        self.outcome.route()
    }
}

/// A request handed to an RPC thread for forwarding.
pub(crate) struct ForwardJob {
    pub(crate) home: crate::ring::Member,
    pub(crate) script_id: String,
    pub(crate) context: ContextStack,
    /// The request; its body is complete and equal to `inline` if that is
    /// set.
    pub(crate) request: http::Request<Body>,
    /// The whole request body, when it is small enough to travel inside
    /// one `call` (see [`crate::inline`]).
    pub(crate) inline: Option<Bytes>,
    pub(crate) started: Instant,
}

/// A live connection to a home.
#[derive(Clone)]
pub(crate) struct PeerConn {
    pub(crate) shard: shard_server::Client,
    pub(crate) closed: Closed,
    /// False once the connection has ended.
    pub(crate) alive: Rc<std::cell::Cell<bool>>,
    /// The RPC thread's handle on its socket (see `ThreadState::socket_ended`).
    pub(crate) socket_id: u64,
}

/// Shard-client counters (shared by all RPC threads).
#[derive(Debug, Default)]
pub(crate) struct ClientCounters {
    pub(crate) forwarded: AtomicU64,
    pub(crate) sharded: AtomicU64,
    pub(crate) refusals_received: AtomicU64,
    pub(crate) unavailable: AtomicU64,
    pub(crate) failed_after_accept: AtomicU64,
    pub(crate) speculative_bytes_sent: AtomicU64,
}

/// What a forward needs from its RPC thread.
pub(crate) struct ClientEnv {
    pub(crate) host: WorkerHost,
    pub(crate) lazies: RefCell<CapabilityServerSet<LazyInstance, worker::Client>>,
    pub(crate) counters: Arc<ClientCounters>,
    /// This node's admission control, which a network `fetch` on a
    /// released lazy instance passes like any sharded request.
    pub(crate) gate: Arc<crate::admission::OverloadGate>,
    pub(crate) dispatch_timeout: Duration,
    pub(crate) speculative_budget: usize,
}

/// The request body as the client reads it: from the node's body (drained
/// into `rx` by a task on this RPC thread), with bytes pushed back in front.
struct Source {
    front: VecDeque<Bytes>,
    rx: Option<mpsc::Receiver<StreamItem>>,
}

impl Source {
    /// The next piece of the body; cancel-safe.
    async fn next(&mut self) -> Option<StreamItem> {
        if let Some(chunk) = self.front.pop_front() {
            return Some(StreamItem::Chunk(chunk));
        }
        let rx = self.rx.as_mut()?;
        let item = rx
            .recv()
            .await
            .unwrap_or_else(|| StreamItem::Abort("request body producer went away".into()));
        if !matches!(item, StreamItem::Chunk(_)) {
            self.rx = None;
        }
        Some(item)
    }

    /// The body this node serves: `kept` (sent to the home already), then
    /// everything not yet sent, or, if the body's end was sent already
    /// (`terminal_sent`), that end: a body that failed fails here too.
    fn into_replay(self, kept: Vec<Bytes>, terminal_sent: Option<StreamItem>) -> Body {
        let read = kept
            .into_iter()
            .chain(self.front)
            .map(http_body::Frame::data);
        match (self.rx, terminal_sent) {
            (Some(rx), _) => Replay::new(read, byte_stream::ChannelBody::new(rx).boxed()),
            (None, Some(StreamItem::Abort(reason))) => Replay::failed(
                read,
                Box::new(byte_stream::BodyStreamError::Aborted(reason)),
            ),
            (None, _) => Replay::complete(read),
        }
        .boxed()
    }
}

/// Everything sent to the home before it answered.
struct Speculation {
    kept: Vec<Bytes>,
    sent: usize,
    /// `End`/`Abort` already sent (the whole body went out).
    terminal_sent: Option<StreamItem>,
    /// The `end`/`abort` call, kept alive so it is not cancelled.
    finish_call: Option<capnp::capability::Promise<(), capnp::Error>>,
}

impl Speculation {
    /// Sends the next piece of the body if the budget allows. Cancel-safe:
    /// a piece is recorded in `kept` in the same step that sends it.
    async fn step(
        &mut self,
        source: &mut Source,
        stream: &wire_stream::Client,
        budget: usize,
    ) -> Result<(), capnp::Error> {
        match source.next().await {
            None => Ok(()),
            Some(StreamItem::Chunk(mut chunk)) => {
                let n = chunk.len().min(budget - self.sent).min(MAX_WRITE_BYTES);
                if chunk.len() > n {
                    source.front.push_front(chunk.split_off(n));
                }
                let mut request = stream.write_request();
                request.get().set_chunk(&chunk);
                let window = request.send();
                self.sent += n;
                self.kept.push(chunk);
                window.await
            }
            Some(terminal) => {
                let call = match &terminal {
                    StreamItem::Abort(reason) => {
                        let mut request = stream.abort_request();
                        request.get().set_reason(reason.as_str());
                        let promise = request.send().promise;
                        capnp::capability::Promise::from_future(
                            async move { promise.await.map(|_| ()) },
                        )
                    }
                    _ => {
                        let promise = stream.end_request().send().promise;
                        capnp::capability::Promise::from_future(
                            async move { promise.await.map(|_| ()) },
                        )
                    }
                };
                self.finish_call = Some(call);
                self.terminal_sent = Some(terminal);
                Ok(())
            }
        }
    }

    fn done(&self, budget: usize) -> bool {
        self.terminal_sent.is_some() || self.sent >= budget
    }
}

/// Forwards `job` to its home over `peer` (or serves it here if `peer` is
/// an error), and returns how it was served. Runs on an RPC thread.
///
/// The phases, as the module docs name them: a request that cannot be
/// forwarded is served here untouched ([`serve_unforwarded`]); a small
/// complete one travels in one `call` ([`forward_inline`]); any other is
/// sent pipelined ([`send_pipelined`]), its body speculated up to the
/// budget while the home answers ([`speculate`]), and then, by the answer
/// ([`judge`]), failed with a 502, replayed here from the kept copy
/// ([`replay_here`]), or streamed on to the home ([`stream_to_home`]).
pub(crate) async fn forward(
    env: Rc<ClientEnv>,
    peer: Result<PeerConn, PeerError>,
    job: ForwardJob,
) -> Forwarded {
    let ForwardJob {
        script_id,
        context,
        request,
        inline,
        started,
        ..
    } = job;
    env.counters.forwarded.fetch_add(1, Ordering::Relaxed);

    let (head, body) = request.into_parts();
    let too_large = http_wire::request_head_size(&head) > http_wire::MAX_HEAD_BYTES
        || head.headers.len() > http_wire::MAX_HEADERS;
    let request = http::Request::from_parts(head, body);
    let conn = match peer {
        Ok(conn) if !too_large => conn,
        unforwardable => {
            let reason = match unforwardable {
                // The home would refuse it (and a huge message would cost
                // the whole connection), so it is served here.
                Ok(_) => "the request head is too large to forward".to_string(),
                Err(e) => e.to_string(),
            };
            return serve_unforwarded(
                &env.host,
                &env.counters,
                &script_id,
                context,
                request,
                reason,
                started,
            )
            .await;
        }
    };

    match inline {
        Some(body) => {
            forward_inline(&env, &conn, &script_id, &context, request, body, started).await
        }
        None => forward_streaming(&env, &conn, script_id, context, request, started).await,
    }
}

/// Nothing was sent (no connection to the home, a head too large to
/// forward, the RPC layer shut down): serves the untouched request here as
/// a [`Route::Fallback`] and counts the home as unavailable. The one way a
/// request that never left this node is served, from this module and from
/// [`crate::rpc::RpcNode::forward`].
pub(crate) async fn serve_unforwarded(
    host: &WorkerHost,
    counters: &ClientCounters,
    script_id: &str,
    context: ContextStack,
    mut request: http::Request<Body>,
    reason: String,
    started: Instant,
) -> Forwarded {
    let hop = started.elapsed();
    request.extensions_mut().insert(context);
    counters.unavailable.fetch_add(1, Ordering::Relaxed);
    let response = host.serve(Route::Fallback, script_id, request).await;
    Forwarded {
        response,
        outcome: ForwardOutcome::Unavailable(reason),
        hop,
    }
}

/// The questions of one forward, all sent before any answer.
struct Pipelined {
    /// `dispatch`: the home's Worker, or `lazy` handed back.
    dispatch: capnp::capability::Promise<
        capnp::capability::Response<shard_server::dispatch_results::Owned>,
        capnp::Error,
    >,
    /// `fetch` on the dispatched Worker; open while the request is wanted.
    fetch: capnp::capability::RemotePromise<worker::fetch_results::Owned>,
    /// Where the request body goes (pipelined on `fetch`).
    stream: wire_stream::Client,
    /// Where the response head arrives.
    response_rx: byte_stream::ResponseReceiver,
}

/// Sends `dispatch(scriptId, context, lazy)` and, pipelined on its answer,
/// `fetch(head, responseSink)`, without waiting for anything.
fn send_pipelined(
    conn: &PeerConn,
    script_id: &str,
    context: &ContextStack,
    parts: &http::request::Parts,
    lazy_cap: worker::Client,
) -> Pipelined {
    let (sink, response_rx) = ResponseSinkServer::new_pair();
    let mut dispatch = conn.shard.dispatch_request();
    {
        let mut p = dispatch.get();
        p.set_script_id(script_id);
        context_stack::write_context(context, p.reborrow().init_context());
        p.set_lazy(lazy_cap);
    }
    let dispatch = dispatch.send();
    let mut fetch = dispatch.pipeline.get_worker().fetch_request();
    {
        let mut p = fetch.get();
        http_wire::write_request_head(parts, p.reborrow().init_head());
        p.set_response(sink);
    }
    let fetch = fetch.send();
    let stream = fetch.pipeline.get_request_body();
    Pipelined {
        dispatch: dispatch.promise,
        fetch,
        stream,
        response_rx,
    }
}

/// The home's answer to `dispatch`, resolved to the capability it names,
/// or the deadline passed.
async fn home_answer(
    dispatch: capnp::capability::Promise<
        capnp::capability::Response<shard_server::dispatch_results::Owned>,
        capnp::Error,
    >,
    deadline: tokio::time::Instant,
) -> Result<Result<worker::Client, capnp::Error>, tokio::time::error::Elapsed> {
    let answer = async {
        let response = dispatch.await?;
        let worker = response.get()?.get_worker()?;
        Ok::<_, capnp::Error>(capnp::capability::get_resolved_cap(worker).await)
    };
    tokio::time::timeout_at(deadline, answer).await
}

/// Sends body bytes within the speculative budget until the home answers
/// (or the whole body, or the budget, went out; or a write failed), and
/// returns the answer.
async fn speculate<F: std::future::Future>(
    mut answer: std::pin::Pin<&mut F>,
    spec: &mut Speculation,
    source: &mut Source,
    stream: &wire_stream::Client,
    budget: usize,
) -> F::Output {
    let mut speculating = true;
    loop {
        if !speculating || spec.done(budget) {
            return answer.await;
        }
        tokio::select! {
            biased;
            a = &mut answer => return a,
            step = spec.step(source, stream, budget) => {
                if let Err(e) = step {
                    tracing::debug!(error = %e, "speculative body write failed; waiting for the home's answer");
                    speculating = false;
                }
            }
        }
    }
}

/// What the home's answer to `dispatch` means for the request.
enum Judged {
    /// The home may have started it: a 502, never a replay.
    MayHaveStarted(String),
    /// Nothing ran there (`Refused`, or `Unavailable`): serve it here.
    Back(ForwardOutcome),
    /// The home's own Worker took it.
    Accepted,
}

/// Reads the home's answer. Only the home's own answer tells that nothing
/// ran there: a refusal (a home that cannot take a dispatch, for whatever
/// reason, hands back `lazy`). An error cannot tell: a connection that ends
/// (a crash, a reset, an end of stream without TLS close, an abort the peer
/// sends) fails every open question with an error of any kind, and by then
/// the home may have read `dispatch` and `fetch` and started the request.
/// So no answer in time, or any error but "unimplemented" (a method the
/// home does not have never ran), is a 502, never a replay.
fn judge(
    env: &ClientEnv,
    answer: Result<Result<worker::Client, capnp::Error>, tokio::time::error::Elapsed>,
    lazy: &Rc<LazyInstance>,
) -> Judged {
    match answer {
        Err(_elapsed) => Judged::MayHaveStarted(format!(
            "no answer to dispatch within {:?}",
            env.dispatch_timeout
        )),
        Ok(Err(e)) if e.kind != capnp::ErrorKind::Unimplemented => {
            Judged::MayHaveStarted(format!("the home's answer to dispatch never came: {e}"))
        }
        Ok(Err(e)) => Judged::Back(ForwardOutcome::Unavailable(format!("dispatch failed: {e}"))),
        Ok(Ok(worker)) if is_own(env, &worker, lazy) => Judged::Back(ForwardOutcome::Refused),
        Ok(Ok(_)) => Judged::Accepted,
    }
}

/// Whether the home answered with `lazy` itself: the hand-back of a
/// refusal (a resolved capability to a server of this node's set).
fn is_own(env: &ClientEnv, worker: &worker::Client, lazy: &Rc<LazyInstance>) -> bool {
    env.lazies
        .borrow()
        .get_local_server_of_resolved(worker)
        .is_some_and(|server| Rc::ptr_eq(&server, lazy))
}

/// The dispatch/fetch protocol: send pipelined, speculate, then fail,
/// replay here or stream to the home by the answer.
async fn forward_streaming(
    env: &Rc<ClientEnv>,
    conn: &PeerConn,
    script_id: String,
    context: ContextStack,
    request: http::Request<Body>,
    started: Instant,
) -> Forwarded {
    let (parts, body) = request.into_parts();
    let mut source = Source {
        front: VecDeque::new(),
        rx: Some(byte_stream::spawn_reader(body)),
    };
    let lazy = Rc::new(LazyInstance::new(
        &script_id,
        env.host.clone(),
        env.gate.clone(),
        context.clone(),
    ));
    let lazy_cap: worker::Client = env.lazies.borrow_mut().new_client_from_rc(lazy.clone());

    // Everything is sent now, without waiting for any answer.
    let Pipelined {
        dispatch,
        fetch,
        stream,
        response_rx,
    } = send_pipelined(conn, &script_id, &context, &parts, lazy_cap);
    let deadline = tokio::time::Instant::now() + env.dispatch_timeout;
    let answer = home_answer(dispatch, deadline);
    tokio::pin!(answer);

    let budget = env.speculative_budget;
    let mut spec = Speculation {
        kept: Vec::new(),
        sent: 0,
        terminal_sent: None,
        finish_call: None,
    };
    let answer = speculate(answer, &mut spec, &mut source, &stream, budget).await;
    let hop = started.elapsed();
    env.counters
        .speculative_bytes_sent
        .fetch_add(spec.sent as u64, Ordering::Relaxed);

    match judge(env, answer, &lazy) {
        Judged::MayHaveStarted(reason) => {
            // Dropping the questions cancels the request there, if it started.
            drop(stream);
            drop(fetch);
            drop(spec.finish_call.take());
            lazy.release();
            gc(env);
            failed_after_accept(env, hop, reason)
        }
        Judged::Back(outcome) => {
            // Stop talking to the home about this request: dropping the
            // questions cancels them there.
            drop(stream);
            drop(fetch);
            drop(spec.finish_call.take());
            let mut request =
                http::Request::from_parts(parts, source.into_replay(spec.kept, spec.terminal_sent));
            request.extensions_mut().insert(context);
            replay_here(env, &lazy, request, outcome, hop).await
        }
        Judged::Accepted => {
            let open = OpenForward {
                spec,
                source,
                stream,
                fetch,
                response_rx,
            };
            stream_to_home(env, conn, &lazy, open, hop).await
        }
    }
}

/// A refusal (or a home without the method): serves `request`, whose body
/// is the kept copy followed by the unsent rest, here through `lazy`.
async fn replay_here(
    env: &ClientEnv,
    lazy: &LazyInstance,
    request: http::Request<Body>,
    outcome: ForwardOutcome,
    hop: Duration,
) -> Forwarded {
    let response = match lazy.take_back(request) {
        Some(serving) => serving.await,
        None => text_response(
            http::StatusCode::INTERNAL_SERVER_ERROR,
            "the lazy instance was already used\n",
        ),
    };
    let counter = match outcome {
        ForwardOutcome::Refused => &env.counters.refusals_received,
        _ => &env.counters.unavailable,
    };
    counter.fetch_add(1, Ordering::Relaxed);
    gc(env);
    Forwarded {
        response,
        outcome,
        hop,
    }
}

/// A forward the home accepted: what was sent and what is still open.
struct OpenForward {
    spec: Speculation,
    source: Source,
    stream: wire_stream::Client,
    fetch: capnp::capability::RemotePromise<worker::fetch_results::Owned>,
    response_rx: byte_stream::ResponseReceiver,
}

/// Accepted: the rest of the body goes to the home, and its response
/// streams back.
async fn stream_to_home(
    env: &ClientEnv,
    conn: &PeerConn,
    lazy: &LazyInstance,
    open: OpenForward,
    hop: Duration,
) -> Forwarded {
    let OpenForward {
        mut spec,
        mut source,
        stream,
        fetch,
        response_rx,
    } = open;
    lazy.release();
    drop(spec.kept);
    let finish_call = spec.finish_call.take();
    // The fetch question stays open while this request is wanted: until
    // the response body has been read to its end or dropped, or, if no head
    // ever comes, until this future is dropped (its client went away).
    // Dropping `wanted` finishes the question, which cancels the
    // invocation on the home.
    let (wanted, gone) = tokio::sync::oneshot::channel::<()>();
    let rest_of_body = async move {
        let talk = async move {
            let result = match (spec.terminal_sent, finish_call) {
                (Some(_), Some(call)) => call.await,
                _ => send_rest(&mut source, &stream).await,
            };
            if let Err(e) = result {
                tracing::debug!(error = %e, "streaming the request body to the home failed");
            }
            let _ = fetch.promise.await;
        };
        tokio::select! {
            () = talk => {}
            _ = gone => {}
        }
    };
    tokio::task::spawn_local(rest_of_body);

    // A sink dropped unused (the peer went away) cancels `response_rx`; the
    // closed connection is a second way to notice the same thing.
    let head = tokio::select! {
        biased;
        head = response_rx => head.ok(),
        () = conn.closed.cancelled() => None,
    };
    gc(env);
    match head {
        Some(Ok(response)) => streamed_from_home(env, response, wanted, hop),
        Some(Err(head_error)) => {
            failed_after_accept(env, hop, format!("bad response head: {head_error}"))
        }
        None => failed_after_accept(
            env,
            hop,
            "the connection to the home closed before its response".into(),
        ),
    }
}

/// Forwards a request whose body is small and complete (`body`; the
/// request's own body is the same bytes) in one `call`, and returns how it
/// was served.
///
/// There is no dispatch timeout here: the home may start the request as
/// soon as the call arrives, so from then on it is never served anywhere
/// else. A refusal (the home hands `lazy` back) is served here; a failure
/// is a 502.
async fn forward_inline(
    env: &Rc<ClientEnv>,
    conn: &PeerConn,
    script_id: &str,
    context: &ContextStack,
    request: http::Request<Body>,
    body: Bytes,
    started: Instant,
) -> Forwarded {
    let lazy = Rc::new(LazyInstance::new(
        script_id,
        env.host.clone(),
        env.gate.clone(),
        context.clone(),
    ));
    let lazy_cap: worker::Client = env.lazies.borrow_mut().new_client_from_rc(lazy.clone());
    let (parts, request_body) = request.into_parts();
    let (call, response_rx) = send_inline(conn, script_id, context, &parts, &body, lazy_cap);
    let request = http::Request::from_parts(parts, request_body);
    env.counters
        .speculative_bytes_sent
        .fetch_add(body.len() as u64, Ordering::Relaxed);
    let waited = wait_inline(call, response_rx, conn.closed.clone()).await;
    gc(env);
    let failed = |reason: String| failed_after_accept(env, started.elapsed(), reason);
    let answer = match waited {
        InlineWait::Head(response, call) => {
            lazy.release();
            return stream_inline(env, response, call, started.elapsed());
        }
        InlineWait::HeadError(e) => return failed(format!("bad response head: {e}")),
        InlineWait::Closed => {
            return failed("the connection to the home closed before its response".into());
        }
        InlineWait::Answer(Err(e)) => return failed(format!("call failed: {e}")),
        InlineWait::Answer(Ok(answer)) => answer,
    };
    // The hop's own cost: the time the home spent is taken out.
    let hop_with = |home_micros: u64| {
        started
            .elapsed()
            .saturating_sub(Duration::from_micros(home_micros))
    };
    match read_inline_answer(&answer) {
        Ok(InlineAnswer::Response(response, home_micros)) => {
            lazy.release();
            env.counters.sharded.fetch_add(1, Ordering::Relaxed);
            Forwarded {
                response,
                outcome: ForwardOutcome::Sharded,
                hop: hop_with(home_micros),
            }
        }
        Ok(InlineAnswer::Refused(worker, home_micros)) => {
            let worker = capnp::capability::get_resolved_cap(worker).await;
            let outcome = if is_own(env, &worker, &lazy) {
                ForwardOutcome::Refused
            } else {
                // Refused all the same (nothing ran there), with a
                // capability that is not ours.
                ForwardOutcome::Unavailable("the home refused with a foreign capability".into())
            };
            let hop = hop_with(home_micros);
            let mut request = request;
            request.extensions_mut().insert(context.clone());
            replay_here(env, &lazy, request, outcome, hop).await
        }
        Ok(InlineAnswer::StreamedWithoutHead) => {
            failed("the home reported a streamed response but sent no head".into())
        }
        Err(e) => failed(format!("bad answer: {e}")),
    }
}

/// The home's answer to `call`, still to be read.
type CallPromise = capnp::capability::Promise<
    capnp::capability::Response<crate::schema::hearth_capnp::call_answer::Owned>,
    capnp::Error,
>;

/// Sends `call(scriptId, context, lazy, head, body, response)` without
/// waiting, and returns the answer to come and where a streamed response
/// head arrives.
fn send_inline(
    conn: &PeerConn,
    script_id: &str,
    context: &ContextStack,
    parts: &http::request::Parts,
    body: &[u8],
    lazy_cap: worker::Client,
) -> (CallPromise, byte_stream::ResponseReceiver) {
    let (sink, response_rx) = ResponseSinkServer::new_pair();
    let mut call = conn.shard.call_request();
    {
        let mut p = call.get();
        p.set_script_id(script_id);
        context_stack::write_context(context, p.reborrow().init_context());
        p.set_lazy(lazy_cap);
        http_wire::write_request_head(parts, p.reborrow().init_head());
        p.set_body(body);
        p.set_response(sink);
    }
    (call.send().promise, response_rx)
}

/// What came first of a `call`'s two ways to answer.
enum InlineWait {
    /// A streamed response head, through the sink; the call stays open
    /// while its body is wanted.
    Head(http::Response<Body>, CallPromise),
    /// A streamed response head that could not be read.
    HeadError(http_wire::HeadError),
    /// The answer, whole (or the call's error).
    Answer(
        Result<
            capnp::capability::Response<crate::schema::hearth_capnp::call_answer::Owned>,
            capnp::Error,
        >,
    ),
    /// The connection ended before either.
    Closed,
}

/// Waits for the home to stream its response head or answer the call
/// whole; a sink released unused is not an answer.
async fn wait_inline(
    mut call: CallPromise,
    mut response_rx: byte_stream::ResponseReceiver,
    closed: Closed,
) -> InlineWait {
    let closed = closed.cancelled_owned();
    tokio::pin!(closed);
    let mut sink_open = true;
    loop {
        tokio::select! {
            biased;
            // A capnp `Promise` is `Unpin`: it can be polled here, then moved.
            answer = &mut call => return InlineWait::Answer(answer),
            got = &mut response_rx, if sink_open => match got {
                Ok(Ok(response)) => return InlineWait::Head(response, call),
                Ok(Err(head_error)) => return InlineWait::HeadError(head_error),
                Err(_sink_released) => sink_open = false,
            },
            () = &mut closed => return InlineWait::Closed,
        }
    }
}

/// The home streams its response to `call`: the call returns once the home
/// has sent the body. It stays open until then or until the body is no
/// longer wanted, and finishing it early cancels the invocation on the home.
fn stream_inline(
    env: &ClientEnv,
    response: http::Response<Body>,
    call: CallPromise,
    hop: Duration,
) -> Forwarded {
    let (wanted, gone) = tokio::sync::oneshot::channel::<()>();
    tokio::task::spawn_local(async move {
        tokio::select! {
            _ = call => {}
            _ = gone => {}
        }
    });
    streamed_from_home(env, response, wanted, hop)
}

/// The answer of a `call`, read.
enum InlineAnswer {
    /// The home handed back this capability (with the µs it spent).
    Refused(worker::Client, u64),
    /// The home served it and answered with the whole response.
    Response(http::Response<Body>, u64),
    /// The home says it streamed the response, but no head came.
    StreamedWithoutHead,
}

/// Reads the home's whole answer to `call`; a malformed one is an error.
fn read_inline_answer(
    answer: &capnp::capability::Response<crate::schema::hearth_capnp::call_answer::Owned>,
) -> Result<InlineAnswer, capnp::Error> {
    use crate::schema::hearth_capnp::call_answer::Which;
    let a = answer.get()?;
    let home_micros = a.get_home_micros();
    Ok(match a.which()? {
        Which::Refused(worker) => InlineAnswer::Refused(worker?, home_micros),
        Which::Response(inline) => {
            let inline = inline?;
            let parts = http_wire::read_response_head(inline.get_head()?)
                .map_err(|e| capnp::Error::failed(e.to_string()))?;
            let body = hearth_body::full(Bytes::copy_from_slice(inline.get_body()?));
            InlineAnswer::Response(http::Response::from_parts(parts, body), home_micros)
        }
        Which::Streamed(()) => InlineAnswer::StreamedWithoutHead,
    })
}

/// A response the home served and streams back: counted as sharded, its
/// body holding `wanted` so the question stays open while it is read.
fn streamed_from_home(
    env: &ClientEnv,
    response: http::Response<Body>,
    wanted: tokio::sync::oneshot::Sender<()>,
    hop: Duration,
) -> Forwarded {
    env.counters.sharded.fetch_add(1, Ordering::Relaxed);
    Forwarded {
        response: response.map(|body| {
            Wanted {
                body,
                _wanted: wanted,
            }
            .boxed_unsync()
        }),
        outcome: ForwardOutcome::Sharded,
        hop,
    }
}

/// A response body that keeps its request's `fetch` question open until
/// it is read to its end or dropped.
struct Wanted {
    body: Body,
    _wanted: tokio::sync::oneshot::Sender<()>,
}

impl http_body::Body for Wanted {
    type Data = bytes::Bytes;
    type Error = crate::hosted_workers::BoxError;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<bytes::Bytes>, Self::Error>>> {
        std::pin::Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}

async fn send_rest(source: &mut Source, stream: &wire_stream::Client) -> Result<(), capnp::Error> {
    while let Some(item) = source.next().await {
        match item {
            StreamItem::Chunk(chunk) => write_chunk(stream, chunk).await?,
            terminal => return finish_stream(stream, terminal).await,
        }
    }
    Ok(())
}

fn failed_after_accept(env: &ClientEnv, hop: Duration, reason: String) -> Forwarded {
    env.counters
        .failed_after_accept
        .fetch_add(1, Ordering::Relaxed);
    tracing::warn!(%reason, "home failed after accepting a sharded request");
    let message = format!(
        "502 Bad Gateway: the Worker's home node may have started this request and then failed ({reason}). \
         It was not retried, because the request may already have had effects.\n"
    );
    Forwarded {
        response: text_response(http::StatusCode::BAD_GATEWAY, message),
        outcome: ForwardOutcome::FailedAfterAccept(reason),
        hop,
    }
}

fn gc(env: &ClientEnv) {
    env.lazies.borrow_mut().gc();
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A refused request whose body failed within the speculative budget
    /// (its abort already sent to the home) is replayed here as failed,
    /// never as a shorter, complete body.
    #[tokio::test]
    async fn a_replayed_body_keeps_the_failure_it_met() {
        let kept = vec![Bytes::from_static(b"part")];
        let source = Source {
            front: VecDeque::new(),
            rx: None,
        };
        let body = source.into_replay(kept.clone(), Some(StreamItem::Abort("upload cut".into())));
        let err = body.collect().await.expect_err("the body failed");
        assert!(err.to_string().contains("upload cut"), "{err}");

        let source = Source {
            front: VecDeque::from([Bytes::from_static(b"+rest")]),
            rx: None,
        };
        let body = source.into_replay(kept, Some(StreamItem::End));
        let got = body.collect().await.expect("complete").to_bytes();
        assert_eq!(&got[..], b"part+rest");
    }
}
