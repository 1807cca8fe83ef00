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
//! through the [`hosted_workers::HostedWorkers`] trait, so this crate never
//! links wasmtime.
//!
//! # Words
//!
//! - **member** ([`ring::Member`]): a node as the ring sees it (ID, RPC
//!   address, weight); the node itself is `hearth::node::Node`.
//! - **home**: the member that owns a script ID on the ring.
//! - **local**: on the node that *received* the request, as in
//!   [`routing::Route::Local`] (warm there) and the *lazy local instance*
//!   the request carries to the home.
//! - **hosted Workers** ([`hosted_workers::HostedWorkers`]): the Workers a
//!   node runs itself, whichever role it serves them in (local, home or
//!   fallback).

pub mod admission;
mod byte_stream;
pub mod context_stack;
pub mod handshake_gate;
pub mod hosted_workers;
mod http_wire;
pub mod inline;
pub mod lazy_instance;
pub mod membership;
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
mod worker_fetch;
