//! # hearth-runtime
//!
//! One hearth node's Workers on wasmtime. A *Worker* is a script ID bound to
//! a wasi:http proxy component (it exports `wasi:http/incoming-handler`), so
//! the same `.wasm` runs under `wasmtime serve`, Spin or hearth. The one
//! exception is the JS Workers `hearth build` makes: they also import
//! hearth's `hearth:js/fast-http` (two calls that replace fifteen wasi:http
//! calls, in [`outbound`]), so they run on hearth only.
//!
//! The model, in the order a request meets it:
//!
//! * Sources live in a [`ScriptStore`] (default [`DirStore`],
//!   content-addressed by blake3; [`S3Store`] keeps the same layout, and the
//!   artifacts, in an S3-compatible bucket for nodes that share no disk). A
//!   deploy checks the compressed size against the plan ([`limits`]),
//!   validates the component, compiles it and caches the compiled artifact,
//!   authenticated by a keyed MAC ([`store`]).
//! * A request for a Worker that is not resident is a *cold start* in four
//!   measured phases ([`timing`]): fetch, compile (or load the artifact),
//!   instantiate (top-level code under the startup CPU budget), handler.
//! * Warm Workers stay in memory under a byte budget and are evicted under
//!   pressure (LRU) or, by a background sweep, when idle ([`eviction`]);
//!   their instances are reused per a [`ReusePolicy`], and run under CPU,
//!   memory and wall-clock limits ([`instances`]). A trap or limit hit
//!   discards the instance.
//! * A name no Worker is deployed under is a 404 that costs at most one
//!   store read per short TTL, shared by concurrent requests.
//! * A slow, stalled or vanished client costs a connection and a bounded
//!   wait, never a Worker; each request also has a wall-clock deadline
//!   ([`PlanLimits::request_wall`]).
//! * A Worker reaches other Workers only through the bindings it was
//!   deployed with, by plain wasi:http requests to `.internal` names; the
//!   node carries those calls across the cluster as levels of one
//!   [`flow`]. It reaches an origin on the network only if its deploy
//!   allows that origin; the node fetches it, refusing private addresses.
//!   A flow started by a Worker with tail Workers reports every level's
//!   logs, subrequests, exceptions and outcome to its first node, which
//!   hands them to the tail Workers in one invocation ([`outbound`]).
//! * A Worker with Durable Object bindings addresses objects by ID (the
//!   `hearth:objects` interfaces, and `.object.internal` requests): each
//!   object is served by one instance of its own, one request at a time,
//!   its storage flushed before its answers leave ([`objects`]).
//! * Every outcome is counted ([`stats`]).
//!
//! # The layout
//!
//! The crate is three wings (and Durable Objects beside them) around a small root, and imports between its
//! files never go in a circle:
//!
//! * [`instances`]: the instance lifecycle: the engine, the host state of
//!   an instance, instances and loaded Workers, reuse, the CPU meter and
//!   the epoch ticker, and what a client may cost before its request runs.
//! * [`outbound`]: the guest's ways out: its outgoing requests, its
//!   bindings, fetches of origins, tail Workers and the live tail.
//! * [`objects`]: Durable Objects: the `hearth:objects` host interfaces and
//!   the node's resident objects, over the `hearth-objects` crate's storage.
//! * [`store`]: where code and records live: the script stores, the
//!   records they share ([`store::meta`]), versions, secrets, manifests,
//!   deploy-time validation, compiled artifacts and the negative cache.
//! * The root: the [`Runtime`] itself (its methods in files by what they
//!   serve: deploys, secrets and versions; loading code; serving; what
//!   stays resident), its [`config`], the [`limits`], the [`error`]s the
//!   parts share, [`stats`], [`eviction`], [`timing`], and the [`flow`] a
//!   nested invocation belongs to, with the `x-hearth-*` headers only the
//!   host sets.
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

pub mod config;
pub mod error;
pub mod eviction;
pub mod flow;
pub mod instances;
pub mod limits;
pub mod objects;
pub mod outbound;
mod runtime;
pub mod stats;
pub mod store;
pub mod timing;

/// The HTTP body type the runtime takes and returns, and its helpers:
/// `hearth-body`, which the cluster layer shares.
pub use hearth_body as body;

pub use body::{Body, BoxError};
pub use config::{ReusePolicy, RuntimeConfig};
pub use error::{CompileError, ConfigError, RuntimeError, StoreError};
pub use flow::{
    FLOW_CPU_SPENT, Flow, Invoker, NestedCall, REQUEST_ID_HEADER, UNKNOWN_SCRIPT_HEADER,
};
pub use instances::cpu::CpuObserver;
pub use instances::epoch::EPOCH_TICK;
pub use instances::lifecycle::{Lifecycle, LifecycleChoice};
pub use instances::worker::INIT_INTERFACE;
pub use limits::{Plan, PlanLimits};
pub use outbound::bindings::Bindings;
pub use runtime::Runtime;
pub use runtime::deploy::{DeployError, DeployReport};
pub use runtime::residency::REVALIDATE_MS;
pub use runtime::serve::{Prewarm, Served, decorate, error_response};
pub use stats::StatsSnapshot;
pub use store::manifest::{Manifest, ManifestError};
pub use store::meta::ScriptMeta;
pub use store::s3_store::{S3Settings, S3Store};
pub use store::script_store::{DirStore, ScriptStore};
pub use store::validate::ValidationError;
pub use timing::{Start, Timing};
