//! One request's lifecycle: the host's `incoming-request` made a JS
//! `Request`, `default.fetch(request, env, ctx)` run on the event loop until
//! its promise settles, the `Response` read back and sent, then what the
//! request leaves behind dealt with before the next one.
//!
//! ## The model
//!
//! 1. The request (method, URL, headers in one host call,
//!    `hearth:js/fast-http`'s `request-head`; the body read whole unless GET
//!    or HEAD, up to its `content-length` when it declares one) is read in
//!    Rust; one JS call makes the `Request`. A body that cannot be read
//!    whole (cut short, malformed chunks) is answered **400** without
//!    running the Worker. `env`
//!    ([`crate::env`]) is built on the instance's first request; `ctx` is
//!    `runtime.js`'s (`waitUntil`, `passThroughOnException`, a no-op).
//! 2. The Worker's `fetch` runs (or, when the module exports a class and
//!    the host says the request is a Durable Object's, that object's
//!    instance answers: [`crate::objects`], `objects.js`); the event loop
//!    ([`crate::event_loop`])
//!    runs jobs, timers and outgoing fetches until its promise settles, then
//!    until the `Response` is taken apart (`__hearth_web.outgoing`).
//! 3. The answer is sent: status, headers (hop-by-hop ones left out) and
//!    the body. A whole body (a string, bytes, a form) goes with its
//!    `content-length`: up to 8 KiB in one host call with the status and
//!    headers (`fast-http`'s `respond`), a larger one through `wasi:http`'s
//!    streams in 4 KiB writes;
//!    a body made by a `ReadableStream` goes chunk by chunk as the event
//!    loop makes them (server-sent events, a long answer), its status and
//!    headers first. A stream that errors, yields something that is not
//!    bytes or can never end cuts the answer short and is the request's
//!    failure; so is a response the host refuses (a header past its
//!    limits), the client answered with an error. A thrown error, a rejected promise, a value that is not a
//!    `Response` or a promise that can never settle (nothing left that could
//!    settle it) answers **500** `Internal Server Error`, the reason on
//!    stderr.
//! 4. After the answer, the loop runs until the promises `ctx.waitUntil`
//!    was given have settled.
//! 5. The request ends: the job queue is run empty, the timers it set and
//!    did not clear are cancelled (none of their callbacks, nor promises
//!    waiting on them, run in a later request), the bodies of fetches it
//!    did not read are dropped (a later read rejects), each promise
//!    rejection no handler took is one line on stderr, and the cycle
//!    collector's next run is put off by a slack of heap
//!    ([`engine::widen_gc_threshold`]). If the request failed (step 3) or
//!    left an outgoing fetch running, the instance **traps** after
//!    answering, and hearth retires it: a broken request's state, or a
//!    half-finished request's I/O, must not reach the next one.
//!
//! Module state persists between requests, as on workerd.

use hearth_sdk::{IncomingRequest, ResponseOutparam, StreamError};
use rquickjs::function::This;
use rquickjs::promise::PromiseState;
use rquickjs::{Array, ArrayBuffer, Ctx, Function, Object, TypedArray, Value};

use crate::engine::{self, Engine};
use crate::event_loop::{self, Ran};
use crate::init::fast_http;
use crate::web::{self, Usv};
use crate::{env, fetch, objects, timers};

/// The largest body [`fast_http::respond`] takes: the host's
/// `OUTGOING_BODY_BYTES` (runtime/src/limits.rs), what one outgoing body
/// buffers. A larger body goes through wasi:http's streams.
const FAST_BODY_BYTES: usize = 8 * 1024;

/// A request's method, URL and headers (names lower case and valid, values
/// as UTF-8), taken from the text `request-head` answers in one host call
/// (instead of about seven wasi:http calls; its format is in
/// `sdk/js/wit/world.wit`), without copying it.
struct Head<'a> {
    method: &'a str,
    url: &'a str,
    headers: Vec<(&'a str, &'a str)>,
}

impl<'a> Head<'a> {
    fn parse(head: &'a str) -> Head<'a> {
        let mut lines = head.split('\n');
        let method = lines.next().unwrap_or("GET");
        let url = lines.next().unwrap_or("http://localhost/");
        let mut headers = Vec::new();
        while let (Some(name), Some(value)) = (lines.next(), lines.next()) {
            headers.push((name, value));
        }
        Head {
            method,
            url,
            headers,
        }
    }
}

/// What the Worker answered.
struct Answer<'js> {
    status: u16,
    /// Name and value, alternating.
    headers: Vec<String>,
    body: AnswerBody<'js>,
}

/// The body of a Worker's answer.
enum AnswerBody<'js> {
    /// The whole body (a string, bytes, a form, ...).
    Whole(Vec<u8>),
    /// A body made by a stream: each call answers (a promise of) the next
    /// chunk, or null once the stream has ended (`bodyPieces` in
    /// `web/fetch.js`).
    Stream(Function<'js>),
}

/// A body value's bytes: a string (UTF-8, lone surrogates as U+FFFD), a
/// `Uint8Array` or an `ArrayBuffer`; anything else is empty.
pub(crate) fn body_bytes(v: Value<'_>) -> rquickjs::Result<Vec<u8>> {
    if let Some(s) = v.as_string() {
        return Ok(web::usv(s)?.into_bytes());
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

/// `value` once it has settled: a promise is run on the event loop until it
/// settles; anything else is its own value. A rejection is the request's
/// failure (and so not an unhandled rejection); so is a promise that can
/// never settle.
fn settled<'js>(ctx: &Ctx<'js>, value: Value<'js>, what: &str) -> Result<Value<'js>, String> {
    let Some(p) = value.as_promise().cloned() else {
        return Ok(value);
    };
    if event_loop::run(ctx, || p.state() != PromiseState::Pending) == Ran::Stuck {
        return Err(format!(
            "{what} never settles: nothing it waits for (a timer, a fetch) is pending"
        ));
    }
    if p.state() == PromiseState::Rejected {
        event_loop::handled(ctx, &p);
    }
    match p.result::<Value>() {
        Some(Ok(v)) => Ok(v),
        Some(Err(e)) => Err(event_loop::error_text(ctx, e)),
        None => Err(format!("{what} never settles")),
    }
}

/// Runs the Worker's `fetch` for one request: its answer, or why it has
/// none.
fn answer<'js>(
    ctx: &Ctx<'js>,
    e: &Engine,
    method: &str,
    url: &str,
    headers: &[(&str, &str)],
    body: Option<Vec<u8>>,
) -> Result<Answer<'js>, String> {
    let go = || -> rquickjs::Result<Result<Answer<'js>, String>> {
        let body: Value = match body {
            Some(b) => TypedArray::<u8>::new(ctx.clone(), b)?.into_value(),
            None => Value::new_undefined(ctx.clone()),
        };
        let pairs = Array::new(ctx.clone())?;
        for (i, (k, v)) in headers.iter().enumerate() {
            pairs.set(2 * i, *k)?;
            pairs.set(2 * i + 1, *v)?;
        }
        let request: Function = e.request.clone().restore(ctx)?;
        let req: Value = request.call((method, url, pairs, body))?;
        let hearth: Object = e.hearth.clone().restore(ctx)?;
        let env = env::get(ctx, &hearth)?;
        let jsctx: Value = hearth.get("ctx")?;
        let object = if e.objects {
            objects::this_object()
        } else {
            None
        };
        let result: Value = match object {
            None => {
                let fetch = e.fetch.clone().restore(ctx)?;
                let default = e.default.clone().restore(ctx)?;
                fetch.call((This(default), req, env, jsctx))?
            }
            // A Durable Object's request: its class's instance answers
            // (`__hearth.objectFetch`, objects.js).
            Some((class, id, name)) => {
                let dispatch: Function = hearth.get("objectFetch")?;
                dispatch.call((class, id, name, req, env))?
            }
        };
        let resp = match settled(ctx, result, "the Worker's fetch") {
            Ok(r) => r,
            Err(why) => return Ok(Err(why)),
        };
        let answer: Function = e.answer.clone().restore(ctx)?;
        let parts: Value = answer.call((resp,))?;
        let parts = match settled(ctx, parts, "reading the Worker's Response") {
            Ok(p) => Array::from_value(p)?,
            Err(why) => return Ok(Err(why)),
        };
        let status: u16 = parts.get(0)?;
        // Lone surrogates in a value (a Worker's cut of client text) are
        // sent as U+FFFD, not the request's failure.
        let headers = parts
            .get::<Vec<Usv>>(1)?
            .into_iter()
            .map(|Usv(s)| s)
            .collect();
        let body: Value = parts.get(2)?;
        let body = match body.as_function() {
            Some(next) => AnswerBody::Stream(next.clone()),
            None => AnswerBody::Whole(body_bytes(body)?),
        };
        Ok(Ok(Answer {
            status,
            headers,
            body,
        }))
    };
    go().unwrap_or_else(|err| Err(event_loop::error_text(ctx, err)))
}

/// Sends `a` through `out`: a whole body with its `content-length` (in one
/// host call, `respond`, when it is at most [`FAST_BODY_BYTES`]), a
/// stream's chunks as the event loop makes them. A response the host
/// refuses (a header it does not take, a head too large) is the request's
/// failure, the client answered with an error; so is a stream that fails
/// (it errors, a chunk is not bytes, it can never end) or cannot be
/// written, with the answer cut short: its status and headers are already
/// sent.
fn send<'js>(ctx: &Ctx<'js>, out: ResponseOutparam, a: Answer<'js>) -> Result<(), String> {
    let mut hs: Vec<(&str, &[u8])> = a
        .headers
        .chunks_exact(2)
        .filter_map(|c| match c {
            [name, value] => Some((name.as_str(), value.as_bytes())),
            _ => None,
        })
        .filter(|(name, _)| {
            !name.eq_ignore_ascii_case("content-length")
                && !fetch::HOP_BY_HOP
                    .iter()
                    .any(|h| name.eq_ignore_ascii_case(h))
        })
        .collect();
    let next = match a.body {
        AnswerBody::Whole(body) => {
            let len = body.len().to_string();
            hs.push(("content-length", len.as_bytes()));
            let sent = if body.len() <= FAST_BODY_BYTES {
                respond_at_once(out, a.status, &hs, &body)
            } else {
                hearth_sdk::respond(out, a.status, &hs, &body).map_err(|e| e.to_string())
            };
            return sent.map_err(|e| format!("it could not be sent: {e}"));
        }
        AnswerBody::Stream(next) => next,
    };
    let response = hearth_sdk::start_response(out, a.status, &hs)
        .map_err(|e| format!("sending the Worker's response failed: {e}"))?;
    loop {
        let piece: Value = next.call(()).map_err(|e| event_loop::error_text(ctx, e))?;
        let piece = settled(ctx, piece, "the Worker's response body stream")?;
        if piece.is_null() || piece.is_undefined() {
            break;
        }
        let bytes = body_bytes(piece).map_err(|e| event_loop::error_text(ctx, e))?;
        response
            .write_all(&bytes)
            .map_err(|e| format!("writing the response body failed: {e}"))?;
    }
    response
        .finish()
        .map_err(|e| format!("ending the response body failed: {e}"))
}

/// Answers through `out` in one host call (`respond`): the header lines
/// (name and value on alternate lines, joined by `\n`, which no valid name
/// or value holds), then the body, in one list. On an error (a header the
/// host refuses) `out` is used up without a response, and hearth answers
/// the client with an error.
fn respond_at_once(
    out: ResponseOutparam,
    status: u16,
    headers: &[(&str, &[u8])],
    body: &[u8],
) -> Result<(), String> {
    let head: usize = headers.iter().map(|(n, v)| n.len() + v.len() + 2).sum();
    let mut list = Vec::with_capacity(head + body.len());
    for (name, value) in headers {
        if !list.is_empty() {
            list.push(b'\n');
        }
        list.extend_from_slice(name.as_bytes());
        list.push(b'\n');
        list.extend_from_slice(value);
    }
    let head_length = u32::try_from(list.len()).map_err(|_| "a head over 4 GiB".to_string())?;
    list.extend_from_slice(body);
    fast_http::respond(out, status, head_length, &list)
}

/// Answers 500 `Internal Server Error` (the reason is in the log).
fn internal_error(out: ResponseOutparam) {
    hearth_sdk::respond(
        out,
        500,
        &[("content-type", b"text/plain")],
        b"Internal Server Error",
    )
    .ok();
}

/// How a request ended.
struct End {
    /// Why the Worker's `fetch` gave no answer, if it did not.
    failed: Option<String>,
    /// Outgoing fetches still running.
    in_flight: usize,
}

/// Steps 2 to 5 of the module docs, inside the engine's context.
fn serve(
    e: &Engine,
    method: &str,
    url: &str,
    headers: &[(&str, &str)],
    body: Option<Vec<u8>>,
    out: ResponseOutparam,
) -> End {
    e.context.with(|ctx| {
        event_loop::set_in_request(true);
        let failed = match answer(&ctx, e, method, url, headers, body) {
            Ok(a) => match send(&ctx, out, a) {
                Ok(()) => None,
                Err(why) => {
                    event_loop::log(&format!("the Worker's response failed: {why}"));
                    Some(why)
                }
            },
            Err(why) => {
                event_loop::log(&format!("Worker fetch failed: {why}"));
                internal_error(out);
                Some(why)
            }
        };
        finish(&ctx);
        event_loop::set_in_request(false);
        End {
            failed,
            in_flight: fetch::in_flight(),
        }
    })
}

/// After the answer: `ctx.waitUntil` work, then the request's end (steps 4
/// and 5 of the module docs, but the trap).
fn finish(ctx: &Ctx<'_>) {
    if event_loop::any_waits() {
        if event_loop::run(ctx, || event_loop::waits_settled(ctx)) == Ran::Stuck {
            event_loop::log(
                "a ctx.waitUntil promise never settles: nothing it waits for is pending",
            );
        }
        event_loop::clear_waits();
    }
    event_loop::checkpoint(ctx);
    if timers::any() {
        timers::cancel_all();
    }
    fetch::drop_unread();
    event_loop::report_unhandled(ctx);
    engine::widen_gc_threshold(ctx);
}

/// The request's `content-length`, unless it has none, it is not a number
/// or the body is chunked (framed by its chunks, whatever a length says).
fn declared_length(headers: &[(&str, &str)]) -> Option<usize> {
    let mut length = None;
    for (name, value) in headers {
        if name.eq_ignore_ascii_case("transfer-encoding") {
            return None;
        }
        if name.eq_ignore_ascii_case("content-length") {
            length = value.trim().parse().ok();
        }
    }
    length
}

/// The request body, read whole in reads of up to 64 KiB; `None` if it
/// cannot be read. With a declared length the reads stop once that many
/// bytes arrived: the host ends a body at its `content-length`, so the read
/// that would only report the end (a host call) is skipped.
fn read_body(request: &IncomingRequest, declared: Option<usize>) -> Option<Vec<u8>> {
    let body = request.consume().ok()?;
    let stream = body.stream().ok()?;
    let mut bytes = Vec::with_capacity(declared.unwrap_or(0).min(1 << 20));
    while declared != Some(bytes.len()) {
        match stream.blocking_read(65536) {
            Ok(chunk) => bytes.extend_from_slice(&chunk),
            Err(StreamError::Closed) => break,
            Err(StreamError::LastOperationFailed(_)) => return None,
        }
    }
    Some(bytes)
}

/// Serves `request` through `out`.
pub(crate) fn handle(request: IncomingRequest, out: ResponseOutparam) {
    let head = fast_http::request_head(&request);
    let Head {
        method,
        url,
        headers,
    } = Head::parse(&head);
    let body = if method == "GET" || method == "HEAD" {
        None
    } else {
        match read_body(&request, declared_length(&headers)) {
            Some(body) => Some(body),
            None => {
                // A body cut short or malformed (a client gone, broken
                // chunks) is not handed to the Worker as no body: its
                // `fetch` would answer a request it never saw whole.
                event_loop::log(&format!(
                    "{method} {url}: the request body could not be read; answered 400 \
                     without running the Worker"
                ));
                hearth_sdk::respond(
                    out,
                    400,
                    &[("content-type", b"text/plain")],
                    b"Bad Request: the request body could not be read",
                )
                .ok();
                return;
            }
        }
    };
    drop(request);
    let mut out = Some(out);
    let end = engine::with(|e| {
        let out = out.take().ok_or("the response outparam was used")?;
        Ok(serve(e, method, url, &headers, body, out))
    });
    match end {
        Ok(End {
            failed: None,
            in_flight: 0,
        }) => {}
        Ok(End {
            failed: Some(_), ..
        }) => retire("the Worker failed"),
        Ok(End { in_flight, .. }) => retire(&format!(
            "the request ended with {in_flight} fetch() calls still running"
        )),
        Err(why) => {
            if let Some(out) = out {
                internal_error(out);
            }
            retire(&format!("js engine: {why}"));
        }
    }
}

/// Says why on stderr, then traps: hearth retires the instance.
fn retire(why: &str) -> ! {
    event_loop::log(&format!("{why}: this instance is retired"));
    std::process::abort()
}
