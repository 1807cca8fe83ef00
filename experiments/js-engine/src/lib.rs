//! SPIKE (issue 29): a JS Worker engine as a Rust guest component.
//!
//! QuickJS-NG (through rquickjs) runs the JSON-echo Worker
//! (`sample-workers/js/module/worker.js`, embedded at build time). The engine
//! (runtime, context, the prelude's Workers API and the Worker's module) is set
//! up once per instance, at instantiation (`hearth_sdk::init!`), so with
//! `lifecycle = "reuse"` every request after the first pays only:
//! read the wasi:http request natively, one JS call that builds the `Request`
//! (`__hearth.request`), `default.fetch(request, env, ctx)`, the job queue
//! until the promise settles, and reading `status`, headers and body of the
//! `Response` natively. The Workers API in `prelude.js` is only what that
//! Worker needs (Headers, Request, Response, URL, TextDecoder, ctx.waitUntil).
//! No timers, no streams, no subrequests: this is a measurement, not a feature.

#[cfg(feature = "native")]
mod native;
#[cfg(not(feature = "native"))]
use rquickjs::Array;

use std::cell::RefCell;
use std::time::Instant;

use hearth_sdk::wasi::http::types::{Method, Scheme};
use hearth_sdk::{Guest, IncomingRequest, ResponseOutparam};
use rquickjs::function::This;
use rquickjs::{
    ArrayBuffer, Context, Ctx, Function, Module, Object, Persistent, Runtime, TypedArray, Value,
};

/// The Worker's source, evaluated once per instance.
#[cfg(not(any(feature = "trivial", feature = "external")))]
const WORKER: &str = include_str!("../../../sample-workers/js/module/worker.js");
/// With `--features trivial`: a Worker that only answers "hello".
#[cfg(feature = "trivial")]
const WORKER: &str = include_str!("trivial.js");
/// With `--features external`: the bundled ES module at `$SPIKE_WORKER_JS`
/// (e.g. the Hono sample bundled by esbuild).
#[cfg(all(feature = "external", not(feature = "trivial")))]
const WORKER: &str = include_str!(env!("SPIKE_WORKER_JS"));
/// The minimal Workers API the Worker needs.
const PRELUDE: &str = include_str!("prelude.js");

struct Engine {
    // Dropped after the persistents (field order) so they are freed first.
    default: Persistent<Object<'static>>,
    fetch: Persistent<Function<'static>>,
    hearth: Persistent<Object<'static>>,
    #[cfg_attr(feature = "native", allow(dead_code))]
    request: Persistent<Function<'static>>,
    #[cfg_attr(feature = "native", allow(dead_code))]
    headers: Persistent<Function<'static>>,
    #[cfg_attr(not(feature = "native"), allow(dead_code))]
    proto: Persistent<Object<'static>>,
    context: Context,
    _runtime: Runtime,
    init_us: u64,
}

#[cfg(feature = "talc")]
#[global_allocator]
static TALC: talc::wasm::WasmDynamicTalc = talc::wasm::new_wasm_dynamic_allocator();

thread_local! {
    static PHASES: RefCell<[u64; 5]> = const { RefCell::new([0; 5]) };
    static ENGINE: RefCell<Option<Engine>> = const { RefCell::new(None) };
}

fn utf8<'js>(b: TypedArray<'js, u8>) -> String {
    // SAFETY: the bytes are copied before any JS runs again.
    let bytes = unsafe { b.as_bytes() }.unwrap_or(&[]);
    String::from_utf8_lossy(bytes).into_owned()
}

fn exception(ctx: &Ctx<'_>, e: rquickjs::Error) -> String {
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

fn start() -> Result<Engine, String> {
    let t0 = Instant::now();
    #[cfg(feature = "talc")]
    let runtime =
        Runtime::new_with_alloc(rquickjs::allocator::RustAllocator).map_err(|e| e.to_string())?;
    #[cfg(not(feature = "talc"))]
    let runtime = Runtime::new().map_err(|e| e.to_string())?;
    if let Some(mb) = option_env!("SPIKE_GC_MB") {
        // QuickJS-NG's cycle collector runs when allocation passes this.
        runtime.set_gc_threshold(mb.parse::<usize>().unwrap_or(1) << 20);
    }
    let context = Context::full(&runtime).map_err(|e| e.to_string())?;
    let parts = context.with(|ctx| {
        let go = || -> rquickjs::Result<_> {
            ctx.globals()
                .set("__hearth_utf8", Function::new(ctx.clone(), utf8)?)?;
            #[cfg(feature = "native")]
            native::define(&ctx)?;
            ctx.eval::<(), _>(PRELUDE)?;
            let (module, done) = Module::declare(ctx.clone(), "worker.js", WORKER)?.eval()?;
            done.finish::<()>()?;
            let default: Object = module.get("default")?;
            let fetch: Function = default.get("fetch")?;
            let hearth: Object = ctx.globals().get("__hearth")?;
            let request: Function = hearth.get("request")?;
            let headers: Function = hearth.get("headers")?;
            let proto: Object = hearth.get("RequestProto")?;
            Ok((
                Persistent::save(&ctx, default),
                Persistent::save(&ctx, fetch),
                Persistent::save(&ctx, hearth),
                Persistent::save(&ctx, request),
                Persistent::save(&ctx, headers),
                Persistent::save(&ctx, proto),
            ))
        };
        go().map_err(|e| exception(&ctx, e))
    })?;
    let (default, fetch, hearth, request, headers, proto) = parts;
    Ok(Engine {
        default,
        fetch,
        hearth,
        request,
        headers,
        proto,
        context,
        _runtime: runtime,
        init_us: t0.elapsed().as_micros() as u64,
    })
}

fn init() {
    match start() {
        Ok(e) => ENGINE.with(|slot| *slot.borrow_mut() = Some(e)),
        Err(e) => panic!("js engine init: {e}"),
    }
}

hearth_sdk::init!(init);

fn method(m: &Method) -> &str {
    match m {
        Method::Get => "GET",
        Method::Head => "HEAD",
        Method::Post => "POST",
        Method::Put => "PUT",
        Method::Delete => "DELETE",
        Method::Connect => "CONNECT",
        Method::Options => "OPTIONS",
        Method::Trace => "TRACE",
        Method::Patch => "PATCH",
        Method::Other(s) => s,
    }
}

/// With `--features phases`: the clock, else nothing (no host call).
#[cfg(feature = "phases")]
fn now() -> Option<Instant> {
    Some(Instant::now())
}
#[cfg(not(feature = "phases"))]
fn now() -> Option<Instant> {
    None
}

/// This instance's average phase times so far, in 0.1 us: build Request,
/// fetch(), job queue, read Response (empty without `--features phases`).
fn phases(
    t0: Option<Instant>,
    t1: Option<Instant>,
    t2: Option<Instant>,
    t3: Option<Instant>,
    t4: Option<Instant>,
) -> String {
    let (Some(t0), Some(t1), Some(t2), Some(t3), Some(t4)) = (t0, t1, t2, t3, t4) else {
        return String::new();
    };
    let ns = |a: Instant, b: Instant| (b - a).as_nanos() as u64;
    PHASES.with(|p| {
        let mut p = p.borrow_mut();
        p[0] += 1;
        p[1] += ns(t0, t1);
        p[2] += ns(t1, t2);
        p[3] += ns(t2, t3);
        p[4] += ns(t3, t4);
        let n = p[0] * 100;
        format!(
            "n={} {} {} {} {}",
            p[0],
            p[1] / n,
            p[2] / n,
            p[3] / n,
            p[4] / n
        )
    })
}

struct Answer {
    status: u16,
    headers: Vec<String>,
    body: Vec<u8>,
    phases: String,
}

fn body_bytes(v: Value<'_>) -> rquickjs::Result<Vec<u8>> {
    if let Some(s) = v.as_string() {
        return Ok(s.to_string()?.into_bytes());
    }
    if let Ok(t) = TypedArray::<u8>::from_value(v.clone()) {
        // SAFETY: copied at once.
        return Ok(unsafe { t.as_bytes() }.unwrap_or(&[]).to_vec());
    }
    if let Some(b) = ArrayBuffer::from_value(v.clone()) {
        // SAFETY: copied at once.
        return Ok(unsafe { b.as_bytes() }.unwrap_or(&[]).to_vec());
    }
    Ok(Vec::new())
}

fn serve(
    e: &Engine,
    method: &str,
    url: &str,
    headers: &[(String, Vec<u8>)],
    body: Option<Vec<u8>>,
) -> Result<Answer, String> {
    e.context.with(|ctx| {
        let go = || -> rquickjs::Result<Answer> {
            let t0 = now();
            let body: Value = match body {
                Some(b) => TypedArray::<u8>::new(ctx.clone(), b)?.into_value(),
                None => Value::new_undefined(ctx.clone()),
            };
            #[cfg(feature = "native")]
            let req: Value = {
                let proto = e.proto.clone().restore(&ctx)?;
                native::request(&ctx, &proto, method, url, headers, body)?
            };
            #[cfg(not(feature = "native"))]
            let req: Value = {
                let pairs = Array::new(ctx.clone())?;
                for (i, (k, v)) in headers.iter().enumerate() {
                    pairs.set(2 * i, k.as_str())?;
                    pairs.set(2 * i + 1, String::from_utf8_lossy(v).as_ref())?;
                }
                let request = e.request.clone().restore(&ctx)?;
                request.call((method, url, pairs, body))?
            };
            let hearth = e.hearth.clone().restore(&ctx)?;
            let env: Value = hearth.get("env")?;
            let jsctx: Value = hearth.get("ctx")?;
            let fetch = e.fetch.clone().restore(&ctx)?;
            let default = e.default.clone().restore(&ctx)?;
            let t1 = now();
            let result: Value = fetch.call((This(default), req, env, jsctx))?;
            let t2 = now();
            let resp: Object = match result.as_promise() {
                Some(p) => p.finish::<Object>()?,
                None => Object::from_value(result)?,
            };
            // ctx.waitUntil work and anything else queued: run it now.
            while ctx.execute_pending_job() {}
            let t3 = now();
            let status: u16 = resp.get("status")?;
            #[cfg(feature = "native")]
            let headers = native::response_headers(&resp)?;
            #[cfg(not(feature = "native"))]
            let headers: Vec<String> = e.headers.clone().restore(&ctx)?.call((resp.clone(),))?;
            let body = body_bytes(resp.get("_body")?)?;
            let t4 = now();
            let avg = phases(t0, t1, t2, t3, t4);
            Ok(Answer {
                status,
                headers,
                body,
                // Phases in 0.1 us: build Request, fetch(), jobs, read Response.
                // Instance averages so far.
                phases: avg,
            })
        };
        go().map_err(|err| exception(&ctx, err))
    })
}

struct Handler;

impl Guest for Handler {
    fn handle(request: IncomingRequest, out: ResponseOutparam) {
        let m = request.method();
        let method = method(&m).to_owned();
        let path = hearth_sdk::path(&request);
        let authority = request.authority().unwrap_or_else(|| "localhost".into());
        let scheme = match request.scheme() {
            Some(Scheme::Https) => "https",
            _ => "http",
        };
        let url = format!("{scheme}://{authority}{path}");
        let headers = hearth_sdk::headers(&request);
        let body = if method == "GET" || method == "HEAD" {
            None
        } else {
            request.consume().ok().and_then(|b| {
                let s = b.stream().ok()?;
                let bytes = hearth_sdk::read_to_end(&s).ok();
                drop(s);
                bytes
            })
        };
        let answer = ENGINE.with(|slot| {
            let slot = slot.borrow();
            match slot.as_ref() {
                Some(e) => serve(e, &method, &url, &headers, body).map(|a| (a, e.init_us)),
                None => Err("engine not started".into()),
            }
        });
        match answer {
            Ok((a, init_us)) => {
                let init = init_us.to_string();
                let mut hs: Vec<(&str, &[u8])> = a
                    .headers
                    .chunks(2)
                    .filter(|c| c.len() == 2)
                    .map(|c| (c[0].as_str(), c[1].as_bytes()))
                    .collect();
                let len = a.body.len().to_string();
                if !a.headers.iter().step_by(2).any(|k| k == "content-length") {
                    hs.push(("content-length", len.as_bytes()));
                }
                hs.push(("x-js-init-us", init.as_bytes()));
                if !a.phases.is_empty() {
                    hs.push(("x-js-phases", a.phases.as_bytes()));
                }
                let _ = hearth_sdk::respond(out, a.status, &hs, &a.body);
            }
            Err(e) => {
                let _ = hearth_sdk::respond(
                    out,
                    500,
                    &[("content-type", b"text/plain")],
                    format!("js error: {e}").as_bytes(),
                );
            }
        }
    }
}

hearth_sdk::export_worker!(Handler);
