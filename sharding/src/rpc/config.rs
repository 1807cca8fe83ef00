//! The settings of a node's inter-node RPC.
//!
//! [`RpcConfig`] holds the node's cluster certificate, how many RPC threads
//! to run, the time limits of connecting, handshaking and dispatching, and
//! the bounds that keep a peer from filling this node's memory: message
//! size, request-body bytes sent before a home accepts, and the bytes of a
//! peer's calls left unanswered per connection and per member. Each field's
//! default is documented on it and set by [`RpcConfig::new`].

use std::time::Duration;

use super::MAX_SPECULATIVE_BODY_BYTES;
use crate::admission::OverloadConfig;
use crate::tls::NodeTls;

/// Settings of a node's inter-node RPC.
#[derive(Debug, Clone)]
pub struct RpcConfig {
    /// This node's cluster certificate and the cluster CA.
    pub tls: NodeTls,
    /// RPC threads (default: one per core; each is an OS thread with its
    /// own event loop, its own connection to every home it forwards to, and
    /// a share of the front door's connections and of the Workers).
    pub threads: usize,
    /// Limit for TCP connect plus TLS handshake to a home (default 1 s).
    pub connect_timeout: Duration,
    /// Limit for an inbound peer's TLS handshake (default 1 s: a member
    /// needs a round trip or two; an idle socket holds a slot of the
    /// [`crate::handshake_gate`] no longer than this).
    pub handshake_timeout: Duration,
    /// Limit, from sending `dispatch` (after connecting, if a connection had
    /// to be opened), for the home's answer on the streaming path (default
    /// 1 s). The home answers at once (admission is a counter check; the
    /// Worker starts after), so running out means the home is stuck; it may
    /// still have started the request, so the user gets a 502 (at most
    /// once) and the request is cancelled there.
    pub dispatch_timeout: Duration,
    /// After failing to connect to a home, requests for it are served
    /// locally without trying again for this long (default 1 s), so a
    /// black-holed home does not cost every request a connect timeout.
    pub unreachable_backoff: Duration,
    /// Admission thresholds when this node is a home.
    pub overload: OverloadConfig,
    /// Largest RPC message accepted from a peer (default 4 MiB; body chunks
    /// are at most 64 KiB, heads at most 256 KiB).
    pub max_message_bytes: usize,
    /// Request-body bytes sent before the home accepted (default and
    /// maximum [`MAX_SPECULATIVE_BODY_BYTES`]).
    pub speculative_body_bytes: usize,
    /// Bytes of a peer's calls one connection may hold unanswered before it
    /// stops reading from that peer (default 64 MiB): the bound on what a
    /// peer that ignores flow control can make this node buffer.
    pub max_unanswered_bytes: usize,
    /// Bytes of one member's calls all its connections together may hold
    /// unanswered (default 256 MiB): past it, each of them stops reading,
    /// so a member gains nothing by opening more connections. A member is
    /// a cluster certificate.
    pub max_unanswered_bytes_per_member: usize,
}

impl RpcConfig {
    /// The defaults documented on each field, with `tls`.
    pub fn new(tls: NodeTls) -> Self {
        RpcConfig {
            tls,
            threads: std::thread::available_parallelism().map_or(1, |n| n.get()),
            connect_timeout: Duration::from_secs(1),
            handshake_timeout: Duration::from_secs(1),
            dispatch_timeout: Duration::from_secs(1),
            unreachable_backoff: Duration::from_secs(1),
            overload: OverloadConfig::default(),
            max_message_bytes: 4 * 1024 * 1024,
            speculative_body_bytes: MAX_SPECULATIVE_BODY_BYTES,
            max_unanswered_bytes: 64 * 1024 * 1024,
            max_unanswered_bytes_per_member: 256 * 1024 * 1024,
        }
    }
}
