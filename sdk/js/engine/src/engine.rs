//! Starting the engine: a QuickJS runtime and context, the web APIs, the
//! request glue and the Worker's module, once, at build time (inside the
//! Wizer snapshot, through [`init`]); then, once per instance, what a
//! snapshot must not share between instances ([`instance_start`]).

use std::cell::{Cell, RefCell};

use hearth_sdk::wasi::clocks::{monotonic_clock, wall_clock};
use hearth_sdk::wasi::random::random;
use rquickjs::{Context, Ctx, Function, Module, Object, Persistent, Runtime, Value};

use crate::web;

/// The per-request glue (`env`, `ctx`, building the `Request`).
const RUNTIME_JS: &str = include_str!("runtime.js");

/// Durable Objects (`DurableObject`, namespaces on `env`, `ctx.storage`,
/// dispatch to an object's class), on `objects.rs`'s natives.
const OBJECTS_JS: &str = include_str!("objects.js");

/// The modules the engine provides, which the bundle leaves as imports
/// (`sdk/js/bundle.mjs`): Cloudflare's `cloudflare:workers`, and
/// hearth's own name for it, `hearth:workers` (the same module: one
/// `DurableObject` class). Declared before the Worker's module, so
/// QuickJS finds them among the loaded modules when it resolves the
/// Worker's imports (no module loader is needed).
const BUILTIN_MODULES: [(&str, &str); 2] = [
    (
        "cloudflare:workers",
        "export const DurableObject = globalThis.__hearth.workers.DurableObject;",
    ),
    ("hearth:workers", "export * from 'cloudflare:workers';"),
];

/// The module's name in QuickJS's messages and stacks.
const MODULE_NAME: &str = "worker.js";

/// A started engine: what a request needs, kept between requests.
pub(crate) struct Engine {
    // Dropped before the context and runtime (field order), so the
    // persistents are freed first.
    /// The module's default export (`this` of `fetch`).
    pub(crate) default: Persistent<Object<'static>>,
    /// `default.fetch`.
    pub(crate) fetch: Persistent<Function<'static>>,
    /// `globalThis.__hearth` (runtime.js).
    pub(crate) hearth: Persistent<Object<'static>>,
    /// `__hearth.request`: builds the `Request`.
    pub(crate) request: Persistent<Function<'static>>,
    /// `__hearth.answer`: the Worker's `Response` taken apart.
    pub(crate) answer: Persistent<Function<'static>>,
    /// Whether the module exports a class (a function besides `default`):
    /// only then can a request be a Durable Object's, and the host is
    /// asked ([`crate::objects::this_object`]).
    pub(crate) objects: bool,
    /// The context everything runs in.
    pub(crate) context: Context,
    _runtime: Runtime,
}

thread_local! {
    /// This instance's engine, once started.
    static ENGINE: RefCell<Option<Engine>> = const { RefCell::new(None) };
    /// `Math.random`'s state (xorshift64*, never 0).
    static RANDOM: Cell<u64> = const { Cell::new(0x9e37_79b9_7f4a_7c15) };
    /// The monotonic clock's reading `performance.now()` counts from (ns).
    static ORIGIN_NS: Cell<u64> = const { Cell::new(0) };
    /// The wall clock at that moment (ms since the epoch):
    /// `performance.timeOrigin`.
    static ORIGIN_MS: Cell<f64> = const { Cell::new(0.0) };
    /// The log lines of the build's start ([`write_log`]); None otherwise.
    static BUILD_LOG: RefCell<Option<Vec<String>>> = const { RefCell::new(None) };
    /// Whether [`instance_start`] ran in this instance. False in the
    /// snapshot: the build never calls it.
    static INSTANCE_STARTED: Cell<bool> = const { Cell::new(false) };
}

/// Bytes of allocation the cycle collector lets pass between two runs
/// beyond what QuickJS gives it (half the heap it left).
const GC_SLACK: usize = 4 << 20;

thread_local! {
    /// The GC threshold [`widen_gc_threshold`] last set (0: none yet).
    static GC_THRESHOLD: Cell<usize> = const { Cell::new(0) };
}

/// Lets the cycle collector run less often: after each run QuickJS sets
/// its next threshold to 1.5 times the heap it left; this raises it to
/// that heap plus [`GC_SLACK`]. A changed threshold says a run happened.
pub(crate) fn widen_gc_threshold(ctx: &Ctx<'_>) {
    // SAFETY: `ctx` is a live context; its runtime lives as long.
    let rt = unsafe { rquickjs::qjs::JS_GetRuntime(ctx.as_raw().as_ptr()) };
    // SAFETY: `rt` is a live runtime.
    let now = unsafe { rquickjs::qjs::JS_GetGCThreshold(rt) } as usize;
    if now == GC_THRESHOLD.with(Cell::get) {
        return;
    }
    let widened = (now / 3 * 2).saturating_add(GC_SLACK);
    // SAFETY: as above.
    unsafe { rquickjs::qjs::JS_SetGCThreshold(rt, widened as _) };
    GC_THRESHOLD.with(|t| t.set(widened));
}

/// Why a Worker did not start; the kinds are `wit/world.wit`'s.
pub(crate) struct StartError {
    /// 0 syntax error, 1 no `fetch`, 2 a throw at the top level, 3 the
    /// engine itself.
    pub(crate) kind: u8,
    /// The module's line, when QuickJS names one.
    pub(crate) line: Option<u32>,
    /// QuickJS's message (`Name: message`).
    pub(crate) message: String,
}

impl StartError {
    fn new(kind: u8, message: impl Into<String>) -> Self {
        StartError {
            kind,
            line: None,
            message: message.into(),
        }
    }
}

/// The pending exception (or `e` itself) as a [`StartError`] of `kind`:
/// `Name: message` and the first line of the Worker's module its stack
/// names.
fn start_error(ctx: &Ctx<'_>, kind: u8, e: rquickjs::Error) -> StartError {
    if !matches!(e, rquickjs::Error::Exception) {
        return StartError::new(kind, e.to_string());
    }
    let v = ctx.catch();
    let Some(o) = v.as_object() else {
        let text = v
            .as_string()
            .and_then(|s| s.to_string().ok())
            .unwrap_or_else(|| format!("{v:?}"));
        return StartError::new(kind, format!("uncaught {text}"));
    };
    let name: String = o.get("name").unwrap_or_else(|_| "Error".into());
    let message: String = o.get("message").unwrap_or_default();
    let stack: String = o.get("stack").unwrap_or_default();
    StartError {
        kind,
        line: module_line(&stack),
        message: format!("{name}: {message}"),
    }
}

/// The first `worker.js:LINE` in a QuickJS stack.
fn module_line(stack: &str) -> Option<u32> {
    let marker = format!("{MODULE_NAME}:");
    let at = stack.find(&marker)? + marker.len();
    let digits: String = stack
        .get(at..)?
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    digits.parse().ok()
}

/// `Math.random()`: xorshift64* on this instance's state, 53 bits.
fn math_random() -> f64 {
    RANDOM.with(|s| {
        let mut x = s.get();
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        s.set(x);
        (x.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 11) as f64 / (1u64 << 53) as f64
    })
}

/// `performance.now()`: milliseconds since this instance started.
fn perf_now() -> f64 {
    let elapsed = monotonic_clock::now().saturating_sub(ORIGIN_NS.with(Cell::get));
    elapsed as f64 / 1e6
}

/// `performance.timeOrigin`.
fn time_origin() -> f64 {
    ORIGIN_MS.with(Cell::get)
}

/// Replaces QuickJS's `Math.random` and `performance` with ones that read
/// per-instance state ([`instance_start`]): QuickJS keeps their state in its
/// context, which the snapshot would freeze (every instance repeating one
/// random sequence, `performance.now()` counting from the build).
const INSTANCE_JS: &str = r#"(() => {
  const g = globalThis;
  const random = g.__hearth_random, now = g.__hearth_perf_now, origin = g.__hearth_time_origin;
  delete g.__hearth_random; delete g.__hearth_perf_now; delete g.__hearth_time_origin;
  Object.defineProperty(Math, 'random', {
    value: function random_() { return random(); }, writable: true, configurable: true,
  });
  Object.defineProperty(Math.random, 'name', { value: 'random' });
  const performance = {};
  Object.defineProperties(performance, {
    now: { value: function now_() { return now(); }, enumerable: true, writable: true, configurable: true },
    timeOrigin: { get() { return origin(); }, enumerable: true, configurable: true },
  });
  Object.defineProperty(performance.now, 'name', { value: 'now' });
  g.performance = performance;
})();"#;

/// Defines [`INSTANCE_JS`]'s natives and runs it.
fn define_instance_state(ctx: &Ctx<'_>) -> rquickjs::Result<()> {
    let g = ctx.globals();
    g.set("__hearth_random", Function::new(ctx.clone(), math_random)?)?;
    g.set("__hearth_perf_now", Function::new(ctx.clone(), perf_now)?)?;
    g.set(
        "__hearth_time_origin",
        Function::new(ctx.clone(), time_origin)?,
    )?;
    ctx.eval::<(), _>(INSTANCE_JS)
}

/// Seeds the per-instance state: `Math.random` from wasi:random and
/// `performance`'s origin from the clocks.
fn seed() {
    // xorshift's state must not be 0.
    RANDOM.with(|s| s.set(random::get_random_u64() | 1));
    ORIGIN_NS.with(|o| o.set(monotonic_clock::now()));
    let wall = wall_clock::now();
    ORIGIN_MS.with(|o| o.set(wall.seconds as f64 * 1e3 + f64::from(wall.nanoseconds) / 1e6));
}

/// Per-instance start, at the beginning of the instance's first request
/// (a snapshot runs no code at instantiation; no JS runs between the two):
/// reseeds what the snapshot froze. Later calls do nothing.
pub(crate) fn instance_start() {
    if !INSTANCE_STARTED.with(Cell::get) {
        seed();
        INSTANCE_STARTED.with(|s| s.set(true));
    }
}

/// Starts an engine running `worker` (an ES module's source).
fn start(worker: &str) -> Result<Engine, StartError> {
    let engine = |e: rquickjs::Error| StartError::new(3, e.to_string());
    let runtime = Runtime::new().map_err(engine)?;
    let context = Context::full(&runtime).map_err(engine)?;
    runtime.set_host_promise_rejection_tracker(Some(crate::event_loop::tracker()));
    let parts = context.with(|ctx| {
        let setup = || -> rquickjs::Result<()> {
            define_instance_state(&ctx)?;
            web::define(&ctx)?;
            crate::event_loop::define(&ctx)?;
            crate::objects::define(&ctx)?;
            ctx.eval::<(), _>(web::WEB_JS)?;
            ctx.eval::<(), _>(RUNTIME_JS)?;
            ctx.eval::<(), _>(OBJECTS_JS)?;
            for (name, source) in BUILTIN_MODULES {
                Module::declare(ctx.clone(), name, source)?;
            }
            Ok(())
        };
        setup().map_err(|e| start_error(&ctx, 3, e))?;
        let module = Module::declare(ctx.clone(), MODULE_NAME, worker)
            .map_err(|e| start_error(&ctx, 0, e))?;
        let (module, done) = module.eval().map_err(|e| start_error(&ctx, 2, e))?;
        done.finish::<()>().map_err(|e| match e {
            rquickjs::Error::WouldBlock => StartError::new(
                2,
                "the module's top-level await never settles (it waits for I/O, \
                 which a Worker cannot do at start)",
            ),
            e => start_error(&ctx, 2, e),
        })?;
        let default: Value = module.get("default").map_err(|e| start_error(&ctx, 3, e))?;
        let Some(default) = default.into_object() else {
            return Err(StartError::new(
                1,
                "the module has no default export: a Worker in the module syntax is \
                 `export default { async fetch(request, env, ctx) { ... } }`",
            ));
        };
        let fetch: Value = default.get("fetch").map_err(|e| start_error(&ctx, 2, e))?;
        let Some(fetch) = fetch.into_function() else {
            return Err(StartError::new(
                1,
                "the module's default export has no fetch method: write \
                 `export default { async fetch(request, env, ctx) { ... } }`",
            ));
        };
        let glue = || -> rquickjs::Result<_> {
            let hearth: Object = ctx.globals().get("__hearth")?;
            let request: Function = hearth.get("request")?;
            let answer: Function = hearth.get("answer")?;
            let set_exports: Function = hearth.get("setExports")?;
            let objects: bool = set_exports.call((module.namespace()?,))?;
            Ok((hearth, request, answer, objects))
        };
        let (hearth, request, answer, objects) = glue().map_err(|e| start_error(&ctx, 3, e))?;
        // Jobs the module queued (promise reactions) run now, not in the
        // first request; a rejection the top level left unhandled is a line
        // of the build's log, as it would be on workerd's console, not one
        // blamed on the first request.
        while ctx.execute_pending_job() {}
        crate::event_loop::report_unhandled(&ctx);
        Ok((
            Persistent::save(&ctx, default),
            Persistent::save(&ctx, fetch),
            Persistent::save(&ctx, hearth),
            Persistent::save(&ctx, request),
            Persistent::save(&ctx, answer),
            objects,
        ))
    });
    let (default, fetch, hearth, request, answer, objects) = match parts {
        Ok(parts) => parts,
        Err(e) => {
            // A failed start may leave objects referenced (the pending
            // exception, the loop's natives), and QuickJS asserts that a
            // runtime it frees holds none. The build discards this instance
            // after a failed start, so its engine is leaked, not freed.
            std::mem::forget(context);
            std::mem::forget(runtime);
            return Err(e);
        }
    };
    Ok(Engine {
        default,
        fetch,
        hearth,
        request,
        answer,
        objects,
        context,
        _runtime: runtime,
    })
}

/// Starts this instance's engine on `worker` (the `hearth-js-init` export,
/// called once by the build, inside the snapshot).
/// Returns the log lines the start wrote ([`write_log`]).
pub(crate) fn init(worker: &str) -> Result<Vec<String>, StartError> {
    if ENGINE.with(|slot| slot.borrow().is_some()) {
        return Err(StartError::new(3, "the engine is already started"));
    }
    // Math.random at the module's top level draws from RANDOM's constant
    // start (the build is reproducible; each instance reseeds): only the
    // Worker's own crypto calls read wasi:random at build time.
    BUILD_LOG.with(|log| *log.borrow_mut() = Some(Vec::new()));
    let started = start(worker);
    let lines = BUILD_LOG.with(|log| log.borrow_mut().take().unwrap_or_default());
    let engine = started?;
    ENGINE.with(|slot| *slot.borrow_mut() = Some(engine));
    Ok(lines)
}

/// Writes one line of the Worker's log: on stderr, or, while the build
/// starts the Worker ([`init`]), into the lines [`init`] returns. The
/// snapshot must not hold a stderr stream (wasi-libc keeps the one it
/// opens; it would be a dead handle in every instance).
pub(crate) fn write_log(line: &str) {
    let kept = BUILD_LOG.with(|log| match log.borrow_mut().as_mut() {
        Some(lines) => {
            lines.push(line.to_owned());
            true
        }
        None => false,
    });
    if !kept {
        eprintln!("{line}");
    }
}

/// Runs `f` with this instance's engine, or says it has none.
pub(crate) fn with<R>(f: impl FnOnce(&Engine) -> Result<R, String>) -> Result<R, String> {
    ENGINE.with(|slot| match slot.borrow().as_ref() {
        Some(e) => f(e),
        None => Err("engine not started".into()),
    })
}
