//! # hearth
//!
//! A WebAssembly Worker runtime with built-in sharding. One `hearth`
//! process is a *node*; the nodes of a data center form a *cluster* in which
//! every Worker has a home on a consistent hash ring, so a low-traffic
//! Worker is cold-started once per data center instead of once per server.
//!
//! This crate is the node you run and its tools: the front doors and admin
//! API ([`http_util`], [`https`], [`admin`]), the node that routes and
//! serves ([`node`]) and carries its Workers' calls to Workers ([`nested`]),
//! prewarming from a TLS ClientHello ([`prewarm`]), metrics ([`metrics`]),
//! configuration ([`config`]). The
//! runtime (one node's Workers on wasmtime) is [`hearth_runtime`], re-exported
//! as [`runtime`]; the cluster layer is [`hearth_sharding`], re-exported as
//! [`sharding`].

pub mod admin;
pub mod bench;
pub mod cluster;
pub mod config;
pub mod demo;
pub mod http_util;
pub mod https;
pub mod metrics;
pub mod nested;
pub mod node;
pub mod plot;
pub mod prewarm;
pub mod simulate;
pub mod testing;
pub mod trace;

pub use hearth_runtime as runtime;
pub use hearth_sharding as sharding;
