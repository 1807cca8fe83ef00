//! hearth's JavaScript Worker engine: a guest component that embeds
//! QuickJS-NG (through `rquickjs`) and serves one Worker written in the
//! Workers module syntax, `export default { async fetch(request, env, ctx) }`.
//!
//! ## The model
//!
//! - **Build** (`hearth_js_engine::build` on the host, crates/js-engine):
//!   this component, compiled once with the hearth binary, is instantiated
//!   under Wizer and its `hearth-js-init(source)` export ([`engine::init`],
//!   `wit/world.wit`) starts the engine: a QuickJS runtime and context, the
//!   web APIs (`src/web/*.js`: `Headers`, `Request`, `Response`, `URL`, ...), the
//!   request glue (`runtime.js`: `env`, `ctx`) and the Worker's module,
//!   evaluated once. Wizer then snapshots the instance's memory and globals
//!   into a new component (the export stays, refusing a second call): the
//!   Worker's own component. A syntax error, a default export without `fetch` or a throw
//!   at the module's top level fails the build with QuickJS's message.
//! - **Instantiation** runs no code: the started engine is in the
//!   snapshot's data segments. What must differ per instance (`Math.random`'s
//!   state, `performance`'s origin) is seeded at the start of the
//!   instance's first request ([`engine::instance_start`]); no JS runs
//!   before it.
//! - **A request** ([`request`]): the host's `incoming-request` is read in
//!   Rust (method, URL, headers, the body unless GET/HEAD), one JS call makes
//!   the `Request`, `default.fetch(request, env, ctx)` runs on the request's
//!   event loop ([`event_loop`]: the job queue, [`timers`], outgoing
//!   [`fetch`]es) until its promise settles, and the `Response`'s status,
//!   headers and body are read back in Rust and sent; then `ctx.waitUntil`
//!   work runs, the request's leftover timers are cancelled, and a failed
//!   request retires the instance. `env` ([`env`]) is read from the
//!   environment on an instance's first request.
//! - **Durable Objects** ([`objects`], `objects.js`): `cloudflare:workers`,
//!   namespace bindings on `env`, stubs, and a request the host says is an
//!   object's answered by that object's instance of the exported class,
//!   with `ctx.storage` on `hearth:objects`.
//! - **Reuse**: one instance serves request after request (hearth's `auto`
//!   lifecycle picks reuse: the component is Rust and C); module state
//!   persists between requests, as on workerd.
//!
//! Nothing a snapshot cannot carry may exist when the build's init returns:
//! no open resource handles (streams, pollables), no started I/O.
//!
//! `web.rs` holds the native helpers the web APIs call (UTF-8 decoding, ...).

mod engine;
mod env;
mod event_loop;
mod fetch;
mod objects;
mod request;
mod timers;
mod web;

use hearth_sdk::{Guest, IncomingRequest, ResponseOutparam};

/// The build-time export (`wit/world.wit`), merged by wit-component with
/// the wasi:http/proxy world of the `wasi` crate.
mod init {
    wit_bindgen::generate!({
        path: "wit",
        world: "init",
        // fast-http takes the very resources the `wasi` crate's bindings
        // hand the handler: its WIT names WASI 0.2.10, the crate 0.2.12,
        // one semver-compatible interface that wit-component imports once.
        with: {
            "wasi:http/types@0.2.10": hearth_sdk::wasi::http::types,
            "wasi:io/streams@0.2.10": hearth_sdk::wasi::io::streams,
            "wasi:io/error@0.2.10": hearth_sdk::wasi::io::error,
            "wasi:io/poll@0.2.10": hearth_sdk::wasi::io::poll,
            "wasi:clocks/monotonic-clock@0.2.10": hearth_sdk::wasi::clocks::monotonic_clock,
            "hearth:js/fast-http": generate,
            "hearth:objects/ids@0.1.0": generate,
            "hearth:objects/storage@0.1.0": generate,
        },
    });
    pub(crate) use hearth::js::fast_http;
    pub(crate) use hearth::objects::{ids, storage};

    /// The `hearth-js-init` export.
    pub(crate) struct Init;

    impl Guest for Init {
        fn hearth_js_init(source: String) -> Result<Vec<String>, (u8, Option<u32>, String)> {
            crate::engine::init(&source).map_err(|e| (e.kind, e.line, e.message))
        }
    }

    export!(Init);
}

/// The `wasi:http/incoming-handler` export.
struct Handler;

impl Guest for Handler {
    fn handle(request: IncomingRequest, out: ResponseOutparam) {
        engine::instance_start();
        request::handle(request, out);
    }
}

hearth_sdk::export_worker!(Handler);
