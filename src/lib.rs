//! # hearth
//!
//! A WebAssembly Worker runtime with built-in sharding. One `hearth`
//! process is a *node*; the nodes of a data center form a *cluster* in which
//! every Worker has a home on a consistent hash ring, so a low-traffic
//! Worker is cold-started once per data center instead of once per server.
//!
//! This crate is the node you run: the front doors and admin API
//! ([`front_door`], [`listener`], [`https`], [`admin`]), the node that routes and serves
//! ([`node`]) and carries its Workers' calls to Workers ([`invoker`]),
//! prewarming from a TLS ClientHello ([`prewarm`]), metrics ([`metrics`]),
//! configuration ([`config`]) and a cluster of nodes in one process
//! ([`cluster`]). The runtime (one node's Workers on wasmtime) is
//! [`hearth_runtime`], re-exported as [`runtime`]; the cluster layer is
//! [`hearth_sharding`], re-exported as [`sharding`].
//!
//! The tools live in crates of their own, each depending on what it needs
//! and never on this one unless it drives real nodes: the load generator
//! (`hearth-bench`, HTTP only, no wasmtime) and the data-center simulator
//! (`hearth-simulate`, the ring, routing, admission and residency code
//! without wasmtime). The `hearth` binary dispatches to them.
//!
//! # Features
//!
//! * `test-util`: `testing`, real nodes inside one test process
//!   (`TestCluster`), as tokio's feature of that name. The workspace's
//!   own tests enable it.
//! * `demo` (default): `hearth demo` and its plot, which drive such an
//!   in-process cluster; implies `test-util`.

pub mod admin;
pub mod cluster;
pub mod config;
#[cfg(feature = "demo")]
pub mod demo;
pub mod front_door;
pub mod https;
pub mod invoker;
pub mod listener;
pub mod live_tail;
mod loopback_cluster;
pub mod metrics;
pub mod node;
#[cfg(feature = "demo")]
pub mod plot;
pub mod prewarm;
pub mod telemetry;
#[cfg(feature = "test-util")]
pub mod testing;

pub use hearth_runtime as runtime;
pub use hearth_sharding as sharding;
