//! # hearth-sharding
//!
//! The cluster layer of hearth: every script ID has a *home* node on a
//! consistent hash ring ([`ring`]), the ring follows the live nodes
//! ([`membership`]), and a node that receives a request for a Worker it does
//! not hold forwards it to the home over Cap'n Proto RPC ([`shard_client`],
//! [`shard_server`]), carrying a capability to a lazily started local
//! instance ([`lazy_instance`]) that an overloaded home hands back.
//!
//! The routing *decision* is a pure function ([`routing`]) so the live node
//! and the data-center simulator share it. The node's own Workers are reached
//! through the [`local::LocalWorkers`] trait, so this crate never links
//! wasmtime.

mod byte_stream;
pub mod context_stack;
pub mod handshake_gate;
mod http_wire;
pub mod inline;
pub mod lazy_instance;
pub mod local;
mod local_fetch;
pub mod membership;
pub mod overload;
#[cfg(test)]
mod peer_message_fuzz;
pub mod ring;
pub mod routing;
pub mod rpc;
pub mod schema;
pub mod shard_client;
pub mod shard_server;
pub mod tls;
pub mod transport;
