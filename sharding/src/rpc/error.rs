//! Why the RPC layer could not start, and why a call to a member failed.
//!
//! [`RpcError`] is a start-up failure of the node's RPC layer. [`PeerError`]
//! is the failure of one call to a member's shard server (or of the
//! connection it needed), cheap to clone because one failed connection
//! attempt is shared by every call that waited for it. A forward never
//! fails this way: it is served locally or answered with a 502 instead (see
//! [`ForwardOutcome`](super::ForwardOutcome)).

use std::sync::Arc;
use std::time::Duration;

use crate::transport;

/// Why the RPC layer could not start.
#[derive(Debug, thiserror::Error)]
pub enum RpcError {
    /// [`RpcNode::start`](super::RpcNode::start) was called outside a tokio
    /// runtime.
    #[error("RpcNode::start must be called from within a tokio runtime")]
    NoRuntime,
    /// An RPC thread could not be spawned.
    #[error("spawning an RPC thread: {0}")]
    Thread(std::io::Error),
    /// The listener's address could not be read.
    #[error("reading the listener's address: {0}")]
    Listener(std::io::Error),
}

/// Why a call to a member's shard server ([`RpcNode::prewarm`],
/// [`RpcNode::announce_redeploy`], [`RpcNode::hand_back`]) or a connection
/// to it failed. Cheap to clone: one failed connection attempt is shared by
/// every call that waited for it.
///
/// [`RpcNode::prewarm`]: super::RpcNode::prewarm
/// [`RpcNode::announce_redeploy`]: super::RpcNode::announce_redeploy
/// [`RpcNode::hand_back`]: super::RpcNode::hand_back
#[derive(Debug, Clone, thiserror::Error)]
pub enum PeerError {
    /// The member could not be reached: TCP, TLS, its identity, or the
    /// connect timeout ([`transport::ConnectError`] says which).
    #[error(transparent)]
    Connect(Arc<transport::ConnectError>),
    /// The connection was open but the call failed on it.
    #[error(transparent)]
    Rpc(#[from] capnp::Error),
    /// The node has no RPC thread to make the call on.
    #[error("no RPC thread")]
    NoThread,
    /// The RPC layer was shut down before the call was made.
    #[error("the RPC layer is shut down")]
    ShutDown,
    /// The RPC layer stopped while the call was under way.
    #[error("the RPC layer stopped")]
    Stopped,
    /// The member did not answer within the call's limit.
    #[error("no answer within {0:?}")]
    Timeout(Duration),
}
