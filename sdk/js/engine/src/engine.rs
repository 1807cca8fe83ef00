//! Starting the engine: a QuickJS runtime and context, the web APIs, the
//! request glue and the Worker's module, once per instance.

use std::cell::RefCell;

use rquickjs::{Context, Ctx, Function, Module, Object, Persistent, Runtime};

use crate::web;

/// The Worker's source, evaluated once per instance.
// TODO(engine): the user's bundle, given at build time, not the sample.
const WORKER: &str = include_str!("../../../../sample-workers/js/module/worker.js");
/// The per-request glue (`env`, `ctx`, building the `Request`).
const RUNTIME_JS: &str = include_str!("runtime.js");

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
    /// The context everything runs in.
    pub(crate) context: Context,
    _runtime: Runtime,
}

thread_local! {
    /// This instance's engine, once started.
    static ENGINE: RefCell<Option<Engine>> = const { RefCell::new(None) };
}

/// A JS error as one line: its message and stack, or the thrown value.
pub(crate) fn exception(ctx: &Ctx<'_>, e: rquickjs::Error) -> String {
    if matches!(e, rquickjs::Error::Exception) {
        let v = ctx.catch();
        if let Some(o) = v.as_object() {
            let msg: Option<String> = o.get("message").ok();
            let stack: Option<String> = o.get("stack").ok();
            return format!("{} {}", msg.unwrap_or_default(), stack.unwrap_or_default());
        }
        return format!("{v:?}");
    }
    e.to_string()
}

/// Starts an engine running `worker` (an ES module's source).
fn start(worker: &str) -> Result<Engine, String> {
    let runtime = Runtime::new().map_err(|e| e.to_string())?;
    let context = Context::full(&runtime).map_err(|e| e.to_string())?;
    runtime.set_host_promise_rejection_tracker(Some(crate::event_loop::tracker()));
    let parts = context.with(|ctx| {
        let go = || -> rquickjs::Result<_> {
            web::define(&ctx)?;
            crate::event_loop::define(&ctx)?;
            ctx.eval::<(), _>(web::WEB_JS)?;
            ctx.eval::<(), _>(RUNTIME_JS)?;
            let (module, done) = Module::declare(ctx.clone(), "worker.js", worker)?.eval()?;
            done.finish::<()>()?;
            let default: Object = module.get("default")?;
            let fetch: Function = default.get("fetch")?;
            let hearth: Object = ctx.globals().get("__hearth")?;
            let request: Function = hearth.get("request")?;
            let answer: Function = hearth.get("answer")?;
            Ok((
                Persistent::save(&ctx, default),
                Persistent::save(&ctx, fetch),
                Persistent::save(&ctx, hearth),
                Persistent::save(&ctx, request),
                Persistent::save(&ctx, answer),
            ))
        };
        go().map_err(|e| exception(&ctx, e))
    })?;
    let (default, fetch, hearth, request, answer) = parts;
    Ok(Engine {
        default,
        fetch,
        hearth,
        request,
        answer,
        context,
        _runtime: runtime,
    })
}

/// Starts this instance's engine; a Worker that does not start traps
/// (instantiation fails with the reason).
pub(crate) fn init() {
    match start(WORKER) {
        Ok(e) => ENGINE.with(|slot| *slot.borrow_mut() = Some(e)),
        Err(e) => panic!("js engine init: {e}"),
    }
}

/// Runs `f` with this instance's engine, or says it has none.
pub(crate) fn with<R>(f: impl FnOnce(&Engine) -> Result<R, String>) -> Result<R, String> {
    ENGINE.with(|slot| match slot.borrow().as_ref() {
        Some(e) => f(e),
        None => Err("engine not started".into()),
    })
}
