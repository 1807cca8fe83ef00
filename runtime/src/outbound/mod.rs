//! The guest's ways out: everything a running Worker can reach beyond its
//! own memory, and what the host does with each.
//!
//! # The model
//!
//! A Worker speaks plain wasi:http (a JS Worker `hearth build` made may
//! also answer through hearth's two-call `fast-http` import, `fast_http`,
//! which builds the same response with the same checks). Every request it
//! makes passes one hook ([`outgoing`]), which resolves the host name
//! against the [`bindings`] the Worker was deployed with:
//!
//! * a binding is a nested invocation, one more level of its flow
//!   ([`crate::flow`]), which the node carries wherever the callee runs;
//! * an origin on the Worker's allow-list is fetched by the node's own
//!   client, which refuses private addresses and caps what comes back
//!   ([`egress`]) and bounds how many connections it holds open
//!   (`connections`), unless an outbound Worker intercepts it;
//! * anything else is denied.
//!
//! What a Worker writes to stdout and stderr, and how its requests went,
//! are trace events: delivered after its flow to its tail Workers
//! ([`tail`]), and to whoever watches the Worker live ([`live_tail`]).
//! Each of these ways is counted ([`crate::stats`]).

pub mod bindings;
pub(crate) mod connections;
pub mod egress;
pub(crate) mod fast_http;
pub mod live_tail;
pub mod outgoing;
pub mod tail;
