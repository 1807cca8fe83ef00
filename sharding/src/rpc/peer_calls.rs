//! The small calls a node makes to one member's shard server.
//!
//! Besides forwarding requests, a node asks members to prewarm a Worker
//! ([`RpcNode::prewarm`]), tells them a Worker was redeployed
//! ([`RpcNode::announce_redeploy`]), asks a non-home to drop its warm copy
//! ([`RpcNode::hand_back`]) and opens a member's live tail
//! ([`RpcNode::tail`]). Each is a [`PeerCall`] sent to the RPC thread that
//! owns this node's connection to the member, made there over that
//! connection, and answered through a channel within a time limit
//! ([`PREWARM_TIMEOUT`], [`ANNOUNCE_TIMEOUT`]); a tail streams its events
//! back through a `TailSink` capability until either side ends it.

use std::rc::Rc;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};

use super::thread::{Command, ThreadState, current_thread_of, thread_for};
use super::{PeerError, RpcNode};
use crate::hosted_workers::PrewarmOutcome;

/// The small calls a node makes to one member's shard server, with where
/// each answer goes.
pub(super) enum PeerCall {
    Prewarm(String, oneshot::Sender<Result<PrewarmOutcome, PeerError>>),
    Redeployed(String, String, oneshot::Sender<Result<(), PeerError>>),
    HandBack(String, oneshot::Sender<Result<bool, PeerError>>),
    /// `ShardServer.tail`: script, status filter, sample rate, and where
    /// the events go.
    Tail(String, String, f64, mpsc::Sender<String>),
}

impl RpcNode {
    /// Asks `home` to prewarm `script_id` (`ShardServer.prewarm`) and
    /// returns what it did, or why it could not be asked (unreachable, or
    /// no answer within [`PREWARM_TIMEOUT`]). Runs on the RPC thread that
    /// owns this node's connection to `home`.
    pub async fn prewarm(
        &self,
        home: &crate::ring::Member,
        script_id: &str,
    ) -> Result<PrewarmOutcome, PeerError> {
        let id = script_id.to_string();
        self.call_peer(home, PREWARM_TIMEOUT, |reply| PeerCall::Prewarm(id, reply))
            .await
    }

    /// Tells `member` that `script_id` was redeployed with source `hash`
    /// (`ShardServer.redeployed`); returns when it has revalidated its
    /// warm copy, or why it could not be told within
    /// [`ANNOUNCE_TIMEOUT`].
    pub async fn announce_redeploy(
        &self,
        member: &crate::ring::Member,
        script_id: &str,
        hash: &str,
    ) -> Result<(), PeerError> {
        let (id, hash) = (script_id.to_string(), hash.to_string());
        self.call_peer(member, ANNOUNCE_TIMEOUT, |reply| {
            PeerCall::Redeployed(id, hash, reply)
        })
        .await
    }

    /// Asks `member` to drop its warm copy of `script_id` unless it is the
    /// Worker's home (`ShardServer.handBack`); whether it dropped one.
    pub async fn hand_back(
        &self,
        member: &crate::ring::Member,
        script_id: &str,
    ) -> Result<bool, PeerError> {
        let id = script_id.to_string();
        self.call_peer(member, ANNOUNCE_TIMEOUT, |reply| {
            PeerCall::HandBack(id, reply)
        })
        .await
    }

    /// Opens `member`'s live tail of `script_id` (`ShardServer.tail`,
    /// `status` as the admin API's `status=`, empty for all): each request
    /// of it that finishes there, as the JSON of a `RequestEvent`, until
    /// either side ends it. Dropping the receiver ends it (the member sees
    /// that at its next event or keepalive); a member that cannot be
    /// reached, or drains, ends the receiver.
    pub fn tail(
        &self,
        member: &crate::ring::Member,
        script_id: &str,
        status: &str,
        sample: f64,
    ) -> mpsc::Receiver<String> {
        // Room for a burst; beyond it the member's own queue fills and it
        // counts what it drops (the sink applies back-pressure).
        let (tx, rx) = mpsc::channel(64);
        let index = current_thread_of(&self.inner.shared)
            .unwrap_or_else(|| thread_for(&member.id, self.inner.threads.len()));
        if let Some(thread) = self.inner.threads.get(index) {
            let call = PeerCall::Tail(script_id.to_string(), status.to_string(), sample, tx);
            let _ = thread.send(Command::Peer(member.clone(), call));
        }
        rx
    }

    /// Sends the call `make` builds to `member` on the RPC thread that owns
    /// this node's connection to it, and waits up to `limit` for the answer.
    async fn call_peer<T>(
        &self,
        member: &crate::ring::Member,
        limit: Duration,
        make: impl FnOnce(oneshot::Sender<Result<T, PeerError>>) -> PeerCall,
    ) -> Result<T, PeerError> {
        let index = current_thread_of(&self.inner.shared)
            .unwrap_or_else(|| thread_for(&member.id, self.inner.threads.len()));
        let thread = self.inner.threads.get(index).ok_or(PeerError::NoThread)?;
        let (reply, result) = oneshot::channel();
        thread
            .send(Command::Peer(member.clone(), make(reply)))
            .map_err(|_| PeerError::ShutDown)?;
        match tokio::time::timeout(limit, result).await {
            Ok(Ok(outcome)) => outcome,
            Ok(Err(_)) => Err(PeerError::Stopped),
            Err(_) => Err(PeerError::Timeout(limit)),
        }
    }
}

/// How long [`RpcNode::prewarm`] waits for a home's answer (a compile
/// from source can take seconds; the answer only feeds counters).
pub const PREWARM_TIMEOUT: Duration = Duration::from_secs(30);

/// How long [`RpcNode::announce_redeploy`] and [`RpcNode::hand_back`]
/// wait for a member's answer (one store read at most). A member that does
/// not answer in time still catches up by itself within
/// `hearth_runtime::REVALIDATE_MS`.
pub const ANNOUNCE_TIMEOUT: Duration = Duration::from_secs(2);

/// Makes `call` to `member` on this RPC thread and sends the answer where
/// the call says.
pub(super) async fn send_peer_call(
    state: Rc<ThreadState>,
    member: crate::ring::Member,
    call: PeerCall,
) {
    match call {
        PeerCall::Prewarm(id, reply) => {
            let _ = reply.send(send_prewarm(state, member, id).await);
        }
        PeerCall::Redeployed(id, hash, reply) => {
            let _ = reply.send(send_redeployed(state, member, id, hash).await);
        }
        PeerCall::HandBack(id, reply) => {
            let _ = reply.send(send_hand_back(state, member, id).await);
        }
        PeerCall::Tail(id, status, sample, tx) => {
            let peer = member.id.clone();
            if let Err(e) = send_tail(state, member, id, status, sample, tx).await {
                tracing::debug!(%peer, error = %e, "a member's live tail ended");
            }
        }
    }
}

/// Sends `ShardServer.tail` to `member`, its events going to `tx`; returns
/// when the member ends the tail or `tx`'s receiver is gone.
async fn send_tail(
    state: Rc<ThreadState>,
    member: crate::ring::Member,
    script_id: String,
    status: String,
    sample: f64,
    tx: mpsc::Sender<String>,
) -> Result<(), PeerError> {
    let peer = state.peer(&member).await?;
    let sink: crate::schema::hearth_capnp::tail_sink::Client =
        capnp_rpc::new_client(TailSinkServer { tx });
    let mut request = peer.shard.tail_request();
    request.get().set_script_id(script_id.as_str());
    request.get().set_status(status.as_str());
    request.get().set_sample(sample);
    request.get().set_sink(sink);
    request.send().promise.await?;
    Ok(())
}

/// The caller's end of a member's live tail: passes each event on, and
/// fails (which ends the member's tail) once the reader is gone.
struct TailSinkServer {
    tx: mpsc::Sender<String>,
}

impl crate::schema::hearth_capnp::tail_sink::Server for TailSinkServer {
    fn event(
        self: capnp::capability::Rc<Self>,
        params: crate::schema::hearth_capnp::tail_sink::EventParams,
    ) -> impl std::future::Future<Output = Result<(), capnp::Error>> + 'static {
        let json = params.get().and_then(|p| {
            p.get_json()?
                .to_string()
                .map_err(|_| capnp::Error::failed("tail event is not UTF-8".into()))
        });
        let tx = self.tx.clone();
        async move {
            let json = json?;
            let gone = || capnp::Error::failed("the tail's reader is gone".into());
            if json.is_empty() {
                // A keepalive: only whether anyone still reads.
                return if tx.is_closed() { Err(gone()) } else { Ok(()) };
            }
            tx.send(json).await.map_err(|_| gone())
        }
    }
}

/// Sends `ShardServer.redeployed` to `member`.
async fn send_redeployed(
    state: Rc<ThreadState>,
    member: crate::ring::Member,
    script_id: String,
    hash: String,
) -> Result<(), PeerError> {
    let peer = state.peer(&member).await?;
    let mut request = peer.shard.redeployed_request();
    request.get().set_script_id(script_id.as_str());
    request.get().set_hash(hash.as_str());
    request.send().promise.await?;
    Ok(())
}

/// Sends `ShardServer.handBack` to `member`.
async fn send_hand_back(
    state: Rc<ThreadState>,
    member: crate::ring::Member,
    script_id: String,
) -> Result<bool, PeerError> {
    let peer = state.peer(&member).await?;
    let mut request = peer.shard.hand_back_request();
    request.get().set_script_id(script_id.as_str());
    let response = request.send().promise.await?;
    Ok(response.get().map(|r| r.get_dropped())?)
}

/// Sends `ShardServer.prewarm` for `script_id` to `home` on this RPC
/// thread.
async fn send_prewarm(
    state: Rc<ThreadState>,
    home: crate::ring::Member,
    script_id: String,
) -> Result<PrewarmOutcome, PeerError> {
    use crate::schema::hearth_capnp::PrewarmOutcome as W;
    let peer = state.peer(&home).await?;
    let mut request = peer.shard.prewarm_request();
    request.get().set_script_id(script_id.as_str());
    let response = request.send().promise.await?;
    let outcome = response
        .get()
        .and_then(|r| r.get_outcome().map_err(capnp::Error::from))?;
    Ok(match outcome {
        W::Loaded => PrewarmOutcome::Loaded,
        W::AlreadyWarm => PrewarmOutcome::AlreadyWarm,
        W::Dropped => PrewarmOutcome::Dropped,
        W::Failed => PrewarmOutcome::Failed,
    })
}
