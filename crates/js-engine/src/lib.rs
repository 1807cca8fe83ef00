//! hearth's JavaScript engine: a JS Worker (an ES module in the Workers
//! syntax, `export default { async fetch(request, env, ctx) { ... } }`)
//! built into its own wasi:http component, ready to serve.
//!
//! ## The model
//!
//! - **The engine** ([`ENGINE`]) is one guest component, `sdk/js/engine`:
//!   Rust embedding QuickJS-NG (rquickjs), with hearth's web APIs and
//!   request glue in it. It ships prebuilt (`prebuilt/engine.wasm`, built
//!   by `cargo xtask engine`, which needs clang; users need no C
//!   toolchain), and this crate embeds it; the build script stops the build
//!   if the engine's sources changed since it was built
//!   (`hearth_build_support::engine`). It serves no Worker by itself.
//! - **A Worker's build** ([`build`], [`Builder`]) is a snapshot, made with
//!   Wizer: the engine is instantiated in-process (wasmtime, WASI without
//!   files, network or environment; its clocks read 0 and its insecure
//!   randomness is seeded, so the same source builds the same bytes unless
//!   its top level draws secure randomness, which is the OS's), its
//!   build-time export
//!   `hearth-js-init(source)` starts QuickJS and evaluates the Worker's
//!   module once (the web APIs, the request glue, the module's top level,
//!   its default export's `fetch` found), and the instance's memories and
//!   globals become the data of a new component (which keeps the export:
//!   called again, it refuses). A
//!   syntax error, a default export without `fetch` and a throw at the
//!   top level are [`BuildError`]s carrying QuickJS's message and line.
//! - **The Worker's component** starts with the engine already started:
//!   instantiating it runs no JS (the snapshot runs no code at all at
//!   instantiation). What must differ per instance (`Math.random`'s state,
//!   `performance`'s origin) the engine seeds from wasi:random and the
//!   clocks at the start of each instance's first request.
//! - **Serving**: one instance serves request after request, module state
//!   kept between them (as on workerd). The component is Rust and C (its
//!   producers say so), so hearth's `auto` lifecycle reuses instances.
//!
//! The module must be one file: [`build`] takes its source with imports
//! bundled. [`build_file`] is the whole build from a module file, as
//! `hearth build` and `hearth dev` run it: esbuild bundles the file and its
//! imports ([`bundle`], which also installs esbuild on first use), then
//! [`build`] snapshots the engine with the bundle.

pub mod bundle;

use std::path::{Path, PathBuf};
use std::sync::{OnceLock, mpsc};
use std::time::Duration;

use rand::SeedableRng;
use rand::rngs::StdRng;
use wasmtime::component::{
    Component, ComponentExportIndex, Instance, Lift, Linker, ResourceTable, WasmList,
};
use wasmtime::{Engine, OptLevel, Store, StoreLimits, StoreLimitsBuilder};
use wasmtime_wasi::{HostMonotonicClock, HostWallClock, WasiCtx, WasiCtxView, WasiView};
use wasmtime_wasi_http::{
    RequestOptions, WasiBody, WasiHttpCtx, WasiHttpCtxView, WasiHttpHooks, WasiHttpView,
};
use wasmtime_wizer::{ComponentContext, ComponentInstanceState, Wizer};

/// The engine component (`sdk/js/engine`, committed prebuilt and checked
/// against its sources by this crate's build script), before any Worker:
/// [`build`] snapshots it with one.
pub const ENGINE: &[u8] = include_bytes!("../prebuilt/engine.wasm");

/// The engine's build-time export (`sdk/js/engine/wit/world.wit`); the
/// snapshot keeps it, refusing a second call.
const INIT: &str = "hearth-js-init";

/// The `hearth:objects` functions the engine imports
/// (`wit/hearth-objects/objects.wit`), linked as traps at build time.
const OBJECTS_IMPORTS: [(&str, &[&str]); 2] = [
    (
        "hearth:objects/ids@0.1.0",
        &["id-from-name", "new-unique-id", "id-from-string"],
    ),
    (
        "hearth:objects/storage@0.1.0",
        &[
            "this-object",
            "get",
            "put",
            "delete",
            "list",
            "delete-all",
            "transaction-begin",
            "transaction-commit",
            "transaction-rollback",
            "get-alarm",
            "set-alarm",
            "delete-alarm",
            "sync",
        ],
    ),
];

/// Why a Worker did not build.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BuildError {
    /// The module does not parse.
    #[error("syntax error{}: {message}", at_line(*line))]
    Syntax {
        /// QuickJS's message (`SyntaxError: ...`).
        message: String,
        /// The module's line, when QuickJS names one.
        line: Option<u32>,
    },
    /// The module's default export is missing or has no `fetch` method.
    #[error("{message}")]
    NoFetch {
        /// What is missing.
        message: String,
    },
    /// The module's top level threw (or its top-level await rejected or
    /// never settled).
    #[error("the module threw at its top level{}: {message}", at_line(*line))]
    Throw {
        /// QuickJS's message (`Error: ...`), or the thrown value.
        message: String,
        /// The module's line, when QuickJS names one.
        line: Option<u32>,
    },
    /// The module's top level ran longer than [`Config::timeout`].
    #[error("the module's top level ran longer than {0:?}")]
    Timeout(Duration),
    /// The engine held I/O open at the end of the module's start (a stream
    /// or handle a snapshot cannot carry).
    #[error("the module left I/O open at the end of its start; start it inside fetch instead")]
    OpenResources,
    /// The engine itself failed: it did not compile, instantiate or start,
    /// or the snapshot failed. A hearth bug unless memory ran out.
    #[error("the JS engine failed ({stage}): {detail}")]
    Engine {
        /// What was being done.
        stage: &'static str,
        /// The error.
        detail: String,
    },
}

/// ` at line N`, or nothing.
fn at_line(line: Option<u32>) -> String {
    line.map(|l| format!(" at line {l}")).unwrap_or_default()
}

impl BuildError {
    fn engine(stage: &'static str, e: impl std::fmt::Debug) -> Self {
        BuildError::Engine {
            stage,
            detail: format!("{e:?}"),
        }
    }
}

/// Limits of a Worker's start at build time.
#[derive(Debug, Clone)]
pub struct Config {
    /// Longest the module's top level may run (wall time).
    pub timeout: Duration,
    /// Largest the engine's memory may grow while the module starts.
    pub max_memory: usize,
}

impl Default for Config {
    /// 10 s and 256 MiB: far above what a Worker's start should take (its
    /// deployed budget is 400 ms of CPU), so only a runaway start is cut.
    fn default() -> Self {
        Config {
            timeout: Duration::from_secs(10),
            max_memory: 256 << 20,
        }
    }
}

/// Builds Workers: the engine instrumented for Wizer and compiled once,
/// then one snapshot per [`Builder::build`].
pub struct Builder {
    engine: Engine,
    component: Component,
    linker: Linker<State>,
    context: ComponentContext<'static>,
    wizer: Wizer,
    init: ComponentExportIndex,
    config: Config,
}

/// The store's data while a Worker starts: WASI with nothing granted.
struct State {
    wasi: WasiCtx,
    http: WasiHttpCtx,
    hooks: NoNetwork,
    table: ResourceTable,
    limits: StoreLimits,
}

impl WasiHttpView for State {
    fn http(&mut self) -> WasiHttpCtxView<'_> {
        WasiHttpCtxView {
            ctx: &mut self.http,
            table: &mut self.table,
            hooks: &mut self.hooks,
        }
    }
}

/// The build's clocks: both read 0 (`Date.now()` at a module's top level is
/// the epoch), so nothing of the build's time reaches the component.
struct Stopped;

impl HostWallClock for Stopped {
    fn resolution(&self) -> Duration {
        Duration::from_nanos(1)
    }
    fn now(&self) -> Duration {
        Duration::ZERO
    }
}

impl HostMonotonicClock for Stopped {
    fn resolution(&self) -> u64 {
        1
    }
    fn now(&self) -> u64 {
        0
    }
}

/// wasi:http hooks that deny every outgoing request.
struct NoNetwork;

/// What [`WasiHttpHooks::send_request`] resolves to.
type SendResult = wasmtime_wasi_http::Result<(
    http::Response<WasiBody>,
    Box<dyn Future<Output = wasmtime_wasi_http::Result<()>> + Send>,
)>;

impl WasiHttpHooks for NoNetwork {
    fn send_request(
        &mut self,
        _request: http::Request<WasiBody>,
        _options: Option<RequestOptions>,
        _fut: Box<dyn Future<Output = wasmtime_wasi_http::Result<()>> + Send>,
    ) -> Box<dyn Future<Output = SendResult> + Send> {
        Box::new(async { Err(wasmtime_wasi_http::Error::HttpRequestDenied) })
    }
}

impl WasiView for State {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView {
            ctx: &mut self.wasi,
            table: &mut self.table,
        }
    }
}

/// What `hearth-js-init` returns on failure: (kind, line, message), kinds
/// as in the WIT.
type InitFailure = (u8, Option<u32>, String);

impl Builder {
    /// Instruments [`ENGINE`] for Wizer and compiles it (about a second;
    /// [`build`] does it once per process).
    pub fn new(config: Config) -> Result<Self, BuildError> {
        let wizer = {
            let mut w = Wizer::new();
            // Kept: Wizer would drop the core function's export (same
            // name) but not the component's lift of it. Called again, it
            // refuses (the engine is started).
            w.init_func(INIT).keep_init_func(true);
            w
        };
        let (context, instrumented) = wizer
            .instrument_component(ENGINE)
            .map_err(|e| BuildError::engine("instrument", e))?;
        let engine =
            Engine::new(&wasmtime_config()).map_err(|e| BuildError::engine("configure", e))?;
        let component =
            Component::new(&engine, &instrumented).map_err(|e| BuildError::engine("compile", e))?;
        let mut linker = Linker::new(&engine);
        wasmtime_wasi::p2::add_to_linker_sync(&mut linker)
            .map_err(|e| BuildError::engine("link", e))?;
        // wasi:http's types and outgoing handler, whose requests are all
        // denied ([`NoNetwork`]): a Worker's start cannot reach the network.
        wasmtime_wasi_http::p2::add_only_http_to_linker_sync(&mut linker)
            .map_err(|e| BuildError::engine("link", e))?;
        // `hearth:js/fast-http` reads a request and answers it: there is
        // none at build time (the module's top level runs then), so its
        // calls trap here; `hearth serve` links the real ones.
        let mut fast_http = linker
            .instance("hearth:js/fast-http")
            .map_err(|e| BuildError::engine("link", e))?;
        for name in ["request-head", "respond"] {
            fast_http
                .func_new(name, move |_, _, _, _| {
                    Err(wasmtime::format_err!(
                        "fast-http {name} called at build time: there is no request"
                    ))
                })
                .map_err(|e| BuildError::engine("link", e))?;
        }
        // `hearth:objects` (Durable Objects' IDs and storage) needs a
        // request of the Worker: none exists at build time, so its calls
        // trap here (the engine refuses them outside a request first);
        // `hearth serve` links the real ones.
        for (interface, names) in OBJECTS_IMPORTS {
            let mut instance = linker
                .instance(interface)
                .map_err(|e| BuildError::engine("link", e))?;
            for name in names {
                instance
                    .func_new(name, move |_, _, _, _| {
                        Err(wasmtime::format_err!(
                            "{interface} {name} called at build time: there is no request"
                        ))
                    })
                    .map_err(|e| BuildError::engine("link", e))?;
            }
        }
        let init = component
            .get_export_index(None, INIT)
            .ok_or_else(|| BuildError::engine("link", format!("no `{INIT}` export")))?;
        Ok(Builder {
            engine,
            component,
            linker,
            context,
            wizer,
            init,
            config,
        })
    }

    /// Builds `module_source` (one ES module, imports bundled) into a
    /// Worker's component: see the crate docs.
    pub fn build(&self, module_source: &str) -> Result<Vec<u8>, BuildError> {
        self.build_logged(module_source)
            .map(|built| built.component)
    }

    /// [`Builder::build`], also returning the lines the module's top level
    /// logged (`console.log` at build time: the engine keeps them instead
    /// of writing them, for the caller to show).
    pub fn build_logged(&self, module_source: &str) -> Result<Built, BuildError> {
        // On a thread of its own: wasmtime-wasi's synchronous host calls
        // start a Tokio runtime, which must not be inside the caller's.
        std::thread::scope(|s| {
            s.spawn(|| self.build_here(module_source))
                .join()
                .unwrap_or_else(|_| Err(BuildError::engine("snapshot", "the build panicked")))
        })
    }

    fn build_here(&self, module_source: &str) -> Result<Built, BuildError> {
        let state = State {
            wasi: WasiCtx::builder()
                .inherit_stderr()
                // Reproducible: the same source builds the same bytes,
                // unless the module's top level asks for secure randomness
                // (crypto.getRandomValues, randomUUID): that comes from the
                // OS, so a key made there is not the same in every build.
                .secure_random(rand::make_rng::<StdRng>())
                .insecure_random(StdRng::seed_from_u64(1))
                .insecure_random_seed(2)
                .wall_clock(Stopped)
                .monotonic_clock(Stopped)
                .build(),
            http: WasiHttpCtx::new(),
            hooks: NoNetwork,
            table: ResourceTable::new(),
            limits: StoreLimitsBuilder::new()
                .memory_size(self.config.max_memory)
                .build(),
        };
        let mut store = Store::new(&self.engine, state);
        store.limiter(|s| &mut s.limits);
        store.set_epoch_deadline(1);
        store.epoch_deadline_trap();

        // The timeout: one epoch tick, unless the start ends first.
        let (done, wait) = mpsc::channel::<()>();
        let engine = self.engine.clone();
        let timeout = self.config.timeout;
        let ticker = std::thread::spawn(move || {
            let fired = matches!(
                wait.recv_timeout(timeout),
                Err(mpsc::RecvTimeoutError::Timeout)
            );
            if fired {
                engine.increment_epoch();
            }
            fired
        });
        let started = self.start(&mut store, module_source);
        drop(done);
        let fired = ticker.join().unwrap_or(false);
        let (instance, logs) = match started {
            Err(_) if fired => return Err(BuildError::Timeout(timeout)),
            other => other?,
        };
        if !store.data().table.is_empty() {
            return Err(BuildError::OpenResources);
        }

        let mut access = Access {
            store: &mut store,
            instance,
            error: None,
        };
        let snapshot =
            futures::executor::block_on(self.wizer.snapshot_component(&self.context, &mut access));
        if let Some(e) = access.error {
            return Err(BuildError::engine("snapshot", e));
        }
        let component = snapshot.map_err(|e| BuildError::engine("snapshot", e))?;
        Ok(Built { component, logs })
    }

    /// Instantiates the engine and starts `source` in it; the instance and
    /// the start's log lines.
    fn start(
        &self,
        store: &mut Store<State>,
        source: &str,
    ) -> Result<(Instance, Vec<String>), BuildError> {
        let instance = self
            .linker
            .instantiate(&mut *store, &self.component)
            .map_err(|e| BuildError::engine("instantiate", e))?;
        let init = instance
            .get_typed_func::<(&str,), (Result<Vec<String>, InitFailure>,)>(&mut *store, self.init)
            .map_err(|e| BuildError::engine("link", e))?;
        let (result,) = init
            .call(&mut *store, (source,))
            .map_err(|e| BuildError::engine("start", e))?;
        match result {
            Ok(logs) => Ok((instance, logs)),
            Err((kind, line, message)) => Err(match kind {
                0 => BuildError::Syntax { message, line },
                1 => BuildError::NoFetch { message },
                2 => BuildError::Throw { message, line },
                _ => BuildError::Engine {
                    stage: "start",
                    detail: message,
                },
            }),
        }
    }
}

/// The build's wasmtime configuration: Cranelift without optimisations
/// (the engine runs once per build, for milliseconds, and compiles several
/// times faster), epochs for the timeout.
fn wasmtime_config() -> wasmtime::Config {
    let mut c = wasmtime::Config::new();
    c.cranelift_opt_level(OptLevel::None);
    c.epoch_interruption(true);
    c
}

/// Wizer's view of the started instance: its `wasmtime:wizer/access`
/// export, read with typed calls (what wasmtime-wizer's own
/// `WasmtimeWizerComponent` does behind features hearth does not build).
struct Access<'a> {
    store: &'a mut Store<State>,
    instance: Instance,
    /// The first failed call: the trait's methods cannot return one.
    error: Option<String>,
}

impl Access<'_> {
    /// Calls `instance#func` (no parameters, one result) and passes its
    /// result to `use_ret`; on failure records the error and returns `R2`'s
    /// default.
    fn call<R, R2: Default>(
        &mut self,
        instance: &str,
        func: &str,
        use_ret: impl FnOnce(&mut Store<State>, R) -> R2,
    ) -> R2
    where
        R: Lift + wasmtime::component::ComponentType + Send + Sync + 'static,
    {
        if self.error.is_some() {
            return R2::default();
        }
        let store = &mut *self.store;
        let found = self
            .instance
            .get_export_index(&mut *store, None, instance)
            .and_then(|i| self.instance.get_export_index(&mut *store, Some(&i), func));
        let Some(index) = found else {
            self.error = Some(format!("no export {instance}#{func}"));
            return R2::default();
        };
        let called = self
            .instance
            .get_typed_func::<(), (R,)>(&mut *store, index)
            .and_then(|f| f.call(&mut *store, ()));
        match called {
            Ok((r,)) => use_ret(store, r),
            Err(e) => {
                self.error = Some(format!("{instance}#{func}: {e:?}"));
                R2::default()
            }
        }
    }
}

impl ComponentInstanceState for Access<'_> {
    async fn call_func_ret_list_u8(
        &mut self,
        instance: &str,
        func: &str,
        contents: impl FnOnce(&[u8]) + Send,
    ) {
        let mut contents = Some(contents);
        self.call(instance, func, |store, list: WasmList<u8>| {
            if let Some(f) = contents.take() {
                f(list.as_le_slice(&*store));
            }
        });
        // A failed call still owes Wizer its contents.
        if let Some(f) = contents.take() {
            f(&[]);
        }
    }

    async fn call_func_ret_s32(&mut self, instance: &str, func: &str) -> i32 {
        self.call(instance, func, |_, r| r)
    }

    async fn call_func_ret_s64(&mut self, instance: &str, func: &str) -> i64 {
        self.call(instance, func, |_, r| r)
    }

    async fn call_func_ret_f32(&mut self, instance: &str, func: &str) -> u32 {
        self.call(instance, func, |_, r: f32| r.to_bits())
    }

    async fn call_func_ret_f64(&mut self, instance: &str, func: &str) -> u64 {
        self.call(instance, func, |_, r: f64| r.to_bits())
    }
}

/// A built Worker: its component, and what its top level logged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Built {
    /// The Worker's component.
    pub component: Vec<u8>,
    /// The lines the module's top level logged at build time (`console`),
    /// in order.
    pub logs: Vec<String>,
}

/// The process's [`Builder`] with the default [`Config`], made on first
/// use.
fn shared() -> Result<&'static Builder, BuildError> {
    static SHARED: OnceLock<Result<Builder, BuildError>> = OnceLock::new();
    SHARED
        .get_or_init(|| Builder::new(Config::default()))
        .as_ref()
        .map_err(Clone::clone)
}

/// Builds `module_source` (one ES module in the Workers syntax, imports
/// bundled) into a Worker's component, with the default [`Config`]; the
/// engine is compiled on the first call and kept for later ones.
pub fn build(module_source: &str) -> Result<Vec<u8>, BuildError> {
    shared()?.build(module_source)
}

/// [`build`], also returning what the module's top level logged
/// ([`Builder::build_logged`]).
pub fn build_logged(module_source: &str) -> Result<Built, BuildError> {
    shared()?.build_logged(module_source)
}

/// Why a Worker's module file did not build: its bundle, or its start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BuildFileError {
    /// The bundle failed (esbuild's message, if any, went to stderr).
    #[error(transparent)]
    Bundle(#[from] bundle::BundleError),
    /// The bundle did not start in the engine.
    #[error("{} does not build: {source}", worker.display())]
    Build {
        /// The Worker's module file.
        worker: PathBuf,
        /// Why.
        #[source]
        source: BuildError,
    },
}

/// Builds the Worker whose module is the file `worker` (`.js`/`.mjs`/`.ts`,
/// imports resolved from its directory): `bundler` bundles it, then
/// [`build_logged`] snapshots the engine with it. What `hearth build` and
/// `hearth dev` run.
pub fn build_file(bundler: &bundle::Bundler, worker: &Path) -> Result<Built, BuildFileError> {
    let source = bundler.bundle(worker)?;
    build_logged(&source).map_err(|source| BuildFileError::Build {
        worker: worker.to_path_buf(),
        source,
    })
}
