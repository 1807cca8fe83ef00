//! # hearth-runtime
//!
//! One hearth node's Workers on wasmtime. A *Worker* is a script ID bound to
//! a wasi:http proxy component (it exports `wasi:http/incoming-handler`), so
//! the same `.wasm` runs under `wasmtime serve`, Spin or hearth. The one
//! exception is the JS Workers `hearth build` makes: they also import
//! hearth's `hearth:js/fast-http` (`src/fast_http.rs`: two calls that
//! replace fifteen wasi:http calls), so they run on hearth only.
//!
//! The model, in the order a request meets it:
//!
//! * [`script_store`]: sources live in a [`ScriptStore`] (default
//!   [`DirStore`], content-addressed by blake3; [`S3Store`] keeps the same
//!   layout, and the artifacts, in an S3-compatible bucket for nodes that
//!   share no disk). A deploy checks the
//!   compressed size against the plan ([`limits`]), validates the component
//!   ([`validate`]), compiles it and caches the compiled artifact
//!   ([`artifact`], authenticated by a keyed MAC).
//! * A request for a Worker that is not resident is a *cold start* in four
//!   measured phases ([`timing`]): fetch, compile (or load the artifact),
//!   instantiate (top-level code under the startup CPU budget, metered by
//!   [`cpu`]), handler.
//! * Warm Workers stay in memory under a byte budget and are evicted under
//!   pressure (LRU) or, by a background sweep, when idle ([`eviction`]);
//!   their instances are reused per a [`ReusePolicy`]. A trap or limit hit
//!   discards the instance.
//! * A name no Worker is deployed under is a 404 that costs at most one
//!   store read per short TTL, shared by concurrent requests ([`misses`]).
//! * A slow, stalled or vanished client costs a connection and a bounded
//!   wait, never a Worker ([`slow_client`]); each request also has a
//!   wall-clock deadline ([`PlanLimits::request_wall`]).
//! * A Worker reaches other Workers only through the [`bindings`] it was
//!   deployed with, by plain wasi:http requests to `.internal` names; the
//!   node carries those calls across the cluster ([`outgoing`]). It reaches
//!   an origin on the network only if its deploy allows that origin; the
//!   node fetches it, refusing private addresses ([`egress`]).
//! * A flow started by a Worker with tail Workers reports every level's
//!   logs, subrequests, exceptions and outcome to its first node, which
//!   hands them to the tail Workers in one invocation ([`tail`]).
//! * Every outcome is counted ([`stats`]).
//!
//! One runtime in a few lines: deploy the `hello` sample Worker (built by the
//! `hearth-sample-workers` crate) into a fresh store and serve a request
//! through it; the first request is a cold start, with its phases in
//! `server-timing`.
//!
//! ```
//! # #[tokio::main] async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use hearth_runtime::{Plan, Runtime, RuntimeConfig, body};
//! let store = tempfile::tempdir()?;
//! let rt = Runtime::new(RuntimeConfig::new(store.path()))?;
//! rt.deploy("hello", Plan::Free, hearth_sample_workers::bytes("hello")?).await?;
//! let req = http::Request::get("http://hello.localhost/").body(body::full(""))?;
//! let resp = rt.serve("hello", req).await;
//! assert_eq!(resp.status(), 200);
//! assert_eq!(resp.headers()["x-hearth-start"], "cold");
//! println!("{:?}", resp.headers()["server-timing"]);
//! # Ok(()) }
//! ```

pub mod artifact;
pub mod bindings;
/// The HTTP body type the runtime takes and returns, and its helpers:
/// `hearth-body`, which the cluster layer shares.
pub use hearth_body as body;
pub mod config;
pub mod cpu;
pub mod egress;
mod engine;
pub mod epoch;
pub mod error;
pub mod eviction;
mod fast_http;
pub mod flow;
mod host;
mod instance;
pub mod lifecycle;
pub mod limits;
pub mod live_tail;
pub mod manifest;
pub mod meta;
pub mod misses;
pub mod outgoing;
pub mod pre_slot;
mod runtime;
pub mod s3_store;
pub mod script_store;
pub mod secrets;
pub mod slow_client;
pub mod stats;
pub mod tail;
pub mod timing;
pub mod validate;
pub mod versions;
mod worker;

pub use bindings::Bindings;
pub use body::{Body, BoxError};
pub use config::{ReusePolicy, RuntimeConfig};
pub use cpu::CpuObserver;
pub use epoch::EPOCH_TICK;
pub use error::{CompileError, ConfigError, RuntimeError, StoreError};
pub use flow::{
    FLOW_CPU_SPENT, Flow, Invoker, NestedCall, REQUEST_ID_HEADER, UNKNOWN_SCRIPT_HEADER,
};
pub use lifecycle::{Lifecycle, LifecycleChoice};
pub use limits::{Plan, PlanLimits};
pub use manifest::{Manifest, ManifestError};
pub use meta::ScriptMeta;
pub use runtime::{
    DeployError, DeployReport, Prewarm, REVALIDATE_MS, Runtime, Served, decorate, error_response,
};
pub use s3_store::{S3Settings, S3Store};
pub use script_store::{DirStore, ScriptStore};
pub use stats::StatsSnapshot;
pub use timing::{Start, Timing};
pub use validate::ValidationError;
pub use worker::INIT_INTERFACE;
