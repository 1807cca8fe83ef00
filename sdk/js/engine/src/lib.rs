//! hearth's JavaScript Worker engine: a guest component that embeds
//! QuickJS-NG (through `rquickjs`) and serves one Worker written in the
//! Workers module syntax, `export default { async fetch(request, env, ctx) }`.
//!
//! ## The model
//!
//! - **Start** ([`engine`]): a QuickJS runtime and context, the web APIs
//!   (`web.js`: `Headers`, `Request`, `Response`, `URL`, ...), the request
//!   glue (`runtime.js`: `env`, `ctx`) and the Worker's module, evaluated
//!   once. What is kept between requests is an [`engine::Engine`]: the
//!   module's `default` export and its `fetch`, held as `Persistent`s.
//! - **A request** ([`request`]): the host's `incoming-request` is read in
//!   Rust (method, URL, headers, the body unless GET/HEAD), one JS call makes
//!   the `Request`, `default.fetch(request, env, ctx)` runs, QuickJS's job
//!   queue runs until its promise settles, and the `Response`'s status,
//!   headers and body are read back in Rust and sent.
//! - **Reuse**: one instance serves request after request (deploy with
//!   `lifecycle = "reuse"`, hearth's default for it); module state persists
//!   between requests, as on workerd.
//!
//! `web.rs` holds the native helpers the web APIs call (UTF-8 decoding, ...).

mod engine;
mod env;
mod event_loop;
mod fetch;
mod request;
mod timers;
mod web;

use hearth_sdk::{Guest, IncomingRequest, ResponseOutparam};

/// Starts the engine at instantiation, so the first request finds it ready.
fn init() {
    engine::init();
}

hearth_sdk::init!(init);

/// The `wasi:http/incoming-handler` export.
struct Handler;

impl Guest for Handler {
    fn handle(request: IncomingRequest, out: ResponseOutparam) {
        request::handle(request, out);
    }
}

hearth_sdk::export_worker!(Handler);
