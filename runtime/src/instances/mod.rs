//! The instance lifecycle: how a Worker's compiled code becomes instances
//! that serve requests, and what bounds them while they run.
//!
//! # The model
//!
//! A node has one wasmtime engine (`engine`): it compiles every Worker
//! and links it against the host's imports. A *loaded Worker* (`worker`)
//! holds its compiled component, linked once, its idle instances and its
//! instance slots. An *instance* (`instance`) is started when a request
//! (or a prewarm) needs one and none is idle: its top-level code runs
//! under the plan's startup CPU budget, and then it serves one request at
//! a time, reused for the next or dropped after one, as the Worker's
//! [`lifecycle`] says.
//! A trap or a limit hit discards it; a request is never run twice.
//!
//! Every instance carries its `host` state: its WASI context and
//! environment, the hooks of its ways out ([`crate::outbound`]), and the
//! two meters that hold it to its plan. Memory: linear memories and
//! tables against the instance's limit and the node-wide cap. CPU: thread
//! CPU time, metered per poll ([`cpu`]) and checked on each tick of the
//! engine's [`epoch`] ticker, which wakes only while guest code may run.
//! Each request also has a wall-clock deadline.
//!
//! What a client can cost before its request reaches an instance is
//! bounded here too: a request body waits for its slot in a bounded buffer
//! ([`pre_slot`]), and a slow, stalled or vanished client costs a
//! connection and a bounded wait, never an instance ([`slow_client`]).
//!
//! Where the code comes from is [`crate::store`]; which Workers stay
//! loaded is [`crate::eviction`].

pub mod cpu;
pub(crate) mod engine;
pub mod epoch;
pub(crate) mod host;
pub(crate) mod instance;
pub mod lifecycle;
pub mod pre_slot;
pub mod slow_client;
pub(crate) mod worker;
