//! The node's inter-node RPC: Cap'n Proto over mutual TLS, behind a `Send`
//! handle.
//!
//! # Threads
//!
//! capnp-rpc's objects are `!Send` (`Rc` inside), so every connection, its
//! capabilities and the forwards using it live on one *RPC thread*: an OS
//! thread running a current-thread tokio runtime and a
//! [`tokio::task::LocalSet`]. A node runs [`RpcConfig::threads`] of them,
//! one per core by default, and a request stays on one thread from the
//! front door to the Worker, because every hand-off between threads costs
//! a wake-up and the shard hop is mostly wake-ups:
//!
//! * The front door of a clustered node serves its connections on the RPC
//!   threads ([`RpcNode::run_on_thread`], round-robin). A request that
//!   must go to its home is forwarded by the same thread, over that
//!   thread's own connection to the home (each thread opens its own).
//! * [`RpcNode::serve`] accepts peer connections on the calling runtime and
//!   hands each raw socket to an RPC thread, round-robin, which completes
//!   the TLS handshake (a peer without a cluster certificate is dropped
//!   there and never reaches Cap'n Proto) and owns the connection, so its
//!   readiness wakes that thread directly.
//! * Workers run on the thread that asks for them: a sharded request on the
//!   home's RPC thread that received it, a request the front door serves
//!   itself on the front door's thread. Guest code yields at every epoch
//!   tick (1 ms), so a busy Worker shares its thread instead of holding it.
//! * [`RpcNode`] is the handle the rest of the node uses: `Clone + Send +
//!   Sync`, usable from any tokio task. Called off the RPC threads (tests,
//!   tools), [`RpcNode::forward`] sends the request to the RPC thread that
//!   owns the connection to that home and awaits the result.
//!
//! Per forward, the common case is one Cap'n Proto call and its return
//! ([`crate::inline`]), and an RPC connection's writes are batched: one
//! flush per turn of the event loop, with bookkeeping messages (`Finish`,
//! `Release`) waiting briefly for company (see [`crate::transport`]).
//!
//! # Robustness
//!
//! Pending inbound handshakes are bounded per source address and in total,
//! the oldest giving way to a newcomer ([`crate::handshake_gate`]), so idle
//! sockets cannot crowd out the members' connections.
//! A peer's calls left unanswered on a connection are bounded
//! ([`RpcConfig::max_unanswered_bytes`]), and so are a member's over all
//! its connections ([`RpcConfig::max_unanswered_bytes_per_member`]): past
//! either, the connection stops reading, so a peer that ignores flow
//! control waits instead of filling this node's memory, however many
//! connections it opens.
//! Messages larger than [`RpcConfig::max_message_bytes`] are refused before
//! they are buffered; a malformed message or a protocol error fails that
//! connection only (capnp-rpc aborts it), and its requests become 502s or
//! local fallbacks as [`crate::shard_client`] describes. A peer that vanishes
//! mid-stream turns into body errors on the other side and its in-flight
//! invocations are cancelled. [`RpcNode::shutdown`] closes every connection
//! at once, as a crash would.
//!
//! # Layout
//!
//! Each part of the above has a file of its own; the public items are
//! re-exported here.
//!
//! - `node`: the [`RpcNode`] handle: starting the RPC threads, the accept
//!   loop ([`ServerHandle`]), forwarding a request, running work on a
//!   thread, shutting down.
//! - `thread`: one RPC thread: its event loop, its state, and which thread
//!   owns the connection to a home.
//! - `connections`: a thread's connections: an inbound peer's handshake and
//!   service, and the one connection per home it opens and shares.
//! - `peer_calls`: the small calls to a member's shard server (prewarm,
//!   redeploy announcements, hand-back, live tail).
//! - `config`: [`RpcConfig`]; `error`: [`RpcError`] and [`PeerError`];
//!   `stats`: [`RpcStats`] and the counters behind it.

mod config;
mod connections;
mod error;
mod node;
mod peer_calls;
mod stats;
mod thread;

pub use crate::byte_stream::BodyStreamError;
pub use crate::shard_client::{ForwardOutcome, Forwarded, MAX_SPECULATIVE_BODY_BYTES};
pub use config::RpcConfig;
pub use error::{PeerError, RpcError};
pub use node::{RpcNode, ServerHandle};
pub use peer_calls::{ANNOUNCE_TIMEOUT, PREWARM_TIMEOUT};
pub use stats::RpcStats;
