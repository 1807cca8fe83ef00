//! The outgoing half of the global `fetch`: `__hearth_fetch(method, url,
//! pairs, body)` sends one request through `wasi:http/outgoing-handler` and
//! returns its id and a promise of `[status, pairs, id, url]` (`pairs` the
//! headers as `[name, value, ...]`) once the response head has arrived;
//! `__hearth_fetch_read(id)` reads the body a piece at a time, and
//! `runtime.js` makes the two a `Response` whose body is a
//! `ReadableStream` (`__hearth_web.fromFetch`); `__hearth_fetch_abort(id)`
//! cancels the request or its body (an `AbortSignal`, a cancelled stream).
//!
//! ## The model
//!
//! Sending is immediate: the head goes to the host and the request body is
//! written whole (`hearth_sdk::fetch::send`). The answer is not waited for
//! here: the request joins the instance's list of fetches, and the event
//! loop ([`crate::event_loop`]) moves forward, without blocking
//! ([`progress`]), every one that somebody waits for: the response head
//! while the fetch's promise waits, then the body, a piece of up to 64 KiB
//! for each read the Worker makes (so a body streams through the Worker at
//! the pace it reads, and a large one never sits whole in its memory).
//! When nothing else can run, the loop blocks in `wasi:io/poll` on each
//! waited-for fetch's [`pollable`](Pending), so several fetches progress
//! together and a waiting instance spins no CPU. A body nobody reads is
//! not in flight: it is dropped (cancelled in the host) at the end of its
//! request ([`drop_unread`]).

//! A failure rejects the promise with a `TypeError` whose message says why:
//! a URL that is not absolute http(s), a request hearth refuses (not a
//! binding and not on the Worker's egress allow-list), a connection refused,
//! a body cut short. Hop-by-hop headers and `host` (the host's to set;
//! wasi:http refuses them) are left out of the request.

use std::cell::{Cell, RefCell};

use hearth_sdk::fetch::{FetchError, Request, send};
use hearth_sdk::wasi::http::types::{
    ErrorCode, FutureIncomingResponse, IncomingBody, IncomingResponse,
};
use hearth_sdk::wasi::io::poll::Pollable;
use hearth_sdk::{InputStream, StreamError};
use rquickjs::function::Opt;
use rquickjs::{Array, Ctx, Exception, Function, Persistent, TypedArray, Value};

use crate::event_loop;
use crate::request::body_bytes;

/// Headers an outgoing request or a response may not carry: the ones
/// wasi:http refuses (wasmtime-wasi-http's `DEFAULT_FORBIDDEN_HEADERS`,
/// which hearth's host keeps), since the host sets them itself. They are
/// left out rather than failing the request (what a proxied origin's
/// `Proxy-Authenticate` would otherwise do to the answer).
pub(crate) const HOP_BY_HOP: [&str; 9] = [
    "connection",
    "keep-alive",
    "proxy-authenticate",
    "proxy-authorization",
    "proxy-connection",
    "transfer-encoding",
    "upgrade",
    "host",
    "http2-settings",
];

/// Where a fetch is.
enum Stage {
    /// Sent; the response head has not arrived.
    Head(FutureIncomingResponse),
    /// The head arrived and the fetch's promise resolved; the body is read
    /// a chunk at a time, when the Worker asks (`__hearth_fetch_read`).
    Body {
        // Dropped before `body`, its parent.
        stream: InputStream,
        body: IncomingBody,
    },
}

/// A promise's resolve and reject functions.
type Waiter = (Persistent<Function<'static>>, Persistent<Function<'static>>);

/// A fetch whose head or body is still to come.
struct Pending {
    // Dropped before `stage`, whose child it is.
    /// What the loop blocks on for this fetch, made when it first blocks
    /// in the current stage.
    pollable: Option<Pollable>,
    stage: Stage,
    /// What `__hearth_fetch_read` and `__hearth_fetch_abort` name it by.
    id: u32,
    url: String,
    /// Who waits for it: the fetch's promise until the head arrives, then
    /// the body read in progress, if any. A fetch nobody waits for is not
    /// moved (the body is read only as fast as the Worker reads it).
    waiter: Option<Waiter>,
}

/// What moving a fetch forward came to.
enum Step {
    /// It waits for the host, or nobody waits for it.
    Waiting,
    /// The head: `(status, headers)`; the body stays, to be read.
    Head(u16, Vec<(String, Vec<u8>)>),
    /// A piece of the body, for the read that waits.
    Chunk(Vec<u8>),
    /// The body has ended.
    End,
    /// It failed: why.
    Failed(String),
}

impl Pending {
    /// Moves this fetch forward as far as it goes without blocking, if
    /// somebody waits for it.
    fn step(&mut self) -> Step {
        if self.waiter.is_none() {
            return Step::Waiting;
        }
        match &mut self.stage {
            Stage::Head(future) => {
                let arrived = match future.get() {
                    None => return Step::Waiting,
                    Some(a) => a,
                };
                match head(arrived) {
                    Ok((status, headers, body, stream)) => {
                        self.pollable = None;
                        self.stage = Stage::Body { stream, body };
                        Step::Head(status, headers)
                    }
                    Err(why) => Step::Failed(why),
                }
            }
            Stage::Body { stream, .. } => match stream.read(65536) {
                Ok(chunk) if chunk.is_empty() => Step::Waiting,
                Ok(chunk) => Step::Chunk(chunk),
                Err(StreamError::Closed) => Step::End,
                Err(StreamError::LastOperationFailed(e)) => Step::Failed(format!(
                    "reading the response body failed: {}",
                    e.to_debug_string()
                )),
            },
        }
    }

    /// Makes the pollable that is ready when this fetch can move again,
    /// if somebody waits for it and it has none for its stage yet.
    fn subscribe(&mut self) {
        if self.pollable.is_none() && self.waiter.is_some() {
            self.pollable = Some(match &self.stage {
                Stage::Head(future) => future.subscribe(),
                Stage::Body { stream, .. } => stream.subscribe(),
            });
        }
    }

    /// Ends this fetch: a body read to its end is finished, anything else
    /// dropped (which cancels it in the host).
    fn close(self, ended: bool) {
        let Pending {
            pollable, stage, ..
        } = self;
        drop(pollable);
        if let Stage::Body { stream, body } = stage {
            drop(stream);
            if ended {
                drop(IncomingBody::finish(body));
            }
        }
    }
}

/// Why the host failed a request, in words: the usual network failures
/// plainly, the rest as `hearth_sdk` says them (a denied request, a loop of
/// bindings, the flow's deadline, the error code).
fn reason(code: ErrorCode) -> String {
    let plain = match &code {
        ErrorCode::ConnectionRefused => "connection refused",
        ErrorCode::DnsError(_) | ErrorCode::DestinationNotFound => "the host name does not resolve",
        ErrorCode::DnsTimeout => "the host name lookup timed out",
        ErrorCode::DestinationIpProhibited => {
            "the destination address is not allowed (private or loopback)"
        }
        ErrorCode::DestinationUnavailable | ErrorCode::DestinationIpUnroutable => {
            "the destination cannot be reached"
        }
        ErrorCode::ConnectionTerminated | ErrorCode::HttpResponseIncomplete => {
            "the connection ended before the whole response"
        }
        ErrorCode::ConnectionReadTimeout | ErrorCode::ConnectionWriteTimeout => {
            "the connection timed out"
        }
        ErrorCode::TlsProtocolError
        | ErrorCode::TlsCertificateError
        | ErrorCode::TlsAlertReceived(_) => "the TLS handshake failed",
        _ => return FetchError::from(code).to_string(),
    };
    plain.to_owned()
}

/// The response head: status, headers, and the body opened for reading.
#[allow(clippy::type_complexity)]
fn head(
    arrived: Result<Result<IncomingResponse, ErrorCode>, ()>,
) -> Result<(u16, Vec<(String, Vec<u8>)>, IncomingBody, InputStream), String> {
    let response = match arrived {
        Ok(Ok(r)) => r,
        Ok(Err(code)) => return Err(reason(code)),
        Err(()) => return Err("the response was taken twice".into()),
    };
    let status = response.status();
    let headers = response.headers().entries();
    let body = response
        .consume()
        .map_err(|()| "the response has no body".to_owned())?;
    let stream = body
        .stream()
        .map_err(|()| "the response body cannot be read".to_owned())?;
    Ok((status, headers, body, stream))
}

thread_local! {
    /// The instance's fetches whose head or body is still to come.
    static IN_FLIGHT: RefCell<Vec<Pending>> = const { RefCell::new(Vec::new()) };
    /// The last fetch id given out.
    static NEXT_ID: Cell<u32> = const { Cell::new(0) };
}

/// A `TypeError` with `message`, as a value (to reject with).
fn type_error<'js>(ctx: &Ctx<'js>, message: &str) -> Value<'js> {
    let _ = Exception::throw_type(ctx, message);
    ctx.catch()
}

/// `__hearth_fetch(method, url, pairs, body)`: `[id, promise]`, see the
/// module docs (`id` names the fetch to `__hearth_fetch_read` and
/// `__hearth_fetch_abort`).
fn fetch<'js>(
    ctx: Ctx<'js>,
    method: String,
    url: String,
    pairs: Vec<String>,
    body: Opt<Value<'js>>,
) -> rquickjs::Result<Array<'js>> {
    event_loop::in_request_only(&ctx, "fetch()")?;
    let (promise, resolve, reject) = ctx.promise()?;
    let body = match body.0 {
        Some(b) => body_bytes(b)?,
        None => Vec::new(),
    };
    let mut req = Request::new(&method, &url).body(body);
    for pair in pairs.chunks_exact(2) {
        if !HOP_BY_HOP.iter().any(|h| pair[0].eq_ignore_ascii_case(h)) {
            req = req.header(&pair[0], pair[1].as_bytes());
        }
    }
    let mut id = 0;
    match send(req) {
        Ok(future) => {
            id = NEXT_ID.with(|n| {
                let id = n.get().wrapping_add(1).max(1);
                n.set(id);
                id
            });
            let pending = Pending {
                pollable: None,
                stage: Stage::Head(future),
                id,
                url,
                waiter: Some((
                    Persistent::save(&ctx, resolve),
                    Persistent::save(&ctx, reject),
                )),
            };
            IN_FLIGHT.with(|f| f.borrow_mut().push(pending));
        }
        Err(e) => {
            let why = match e {
                FetchError::Http(code) => reason(code),
                e => e.to_string(),
            };
            let error = type_error(&ctx, &format!("fetch {url} failed: {why}"));
            reject.call::<_, ()>((error,))?;
        }
    }
    let pair = Array::new(ctx.clone())?;
    pair.set(0, id)?;
    pair.set(1, promise)?;
    Ok(pair)
}

/// `__hearth_fetch_read(id)`: a promise of fetch `id`'s next piece of body
/// (a `Uint8Array`), or of `null` once the body has ended; it rejects with
/// a `TypeError` if the body failed, or is gone (aborted, cancelled, or
/// left unread when its request ended).
fn read<'js>(ctx: Ctx<'js>, id: u32) -> rquickjs::Result<rquickjs::Promise<'js>> {
    let (promise, resolve, reject) = ctx.promise()?;
    let refused = IN_FLIGHT.with(|f| {
        let mut f = f.borrow_mut();
        match f.iter_mut().find(|p| p.id == id) {
            None => Some("the response body is gone: it was cancelled, or its request ended"),
            Some(p) if p.waiter.is_some() || matches!(p.stage, Stage::Head(_)) => {
                Some("the response body is already being read")
            }
            Some(p) => {
                p.waiter = Some((
                    Persistent::save(&ctx, resolve.clone()),
                    Persistent::save(&ctx, reject.clone()),
                ));
                None
            }
        }
    });
    if let Some(why) = refused {
        let error = type_error(&ctx, why);
        reject.call::<_, ()>((error,))?;
    }
    Ok(promise)
}

/// `__hearth_fetch_abort(id)`: drops fetch `id` if it is still there, which
/// cancels it in the host; a promise waiting on it never settles
/// (`runtime.js` rejects the caller's with the signal's reason).
fn abort(id: u32) {
    let gone = IN_FLIGHT.with(|f| {
        let mut f = f.borrow_mut();
        let at = f.iter().position(|p| p.id == id);
        at.map(|i| f.swap_remove(i))
    });
    if let Some(p) = gone {
        p.close(false);
    }
}

/// Defines `__hearth_fetch`, `__hearth_fetch_read` and
/// `__hearth_fetch_abort` on `ctx`'s global object.
pub(crate) fn define(ctx: &Ctx<'_>) -> rquickjs::Result<()> {
    let g = ctx.globals();
    g.set("__hearth_fetch", Function::new(ctx.clone(), fetch)?)?;
    g.set("__hearth_fetch_read", Function::new(ctx.clone(), read)?)?;
    g.set("__hearth_fetch_abort", Function::new(ctx.clone(), abort)?)
}

/// How many fetches somebody waits for: a head not yet arrived, or a body
/// read in progress. (A body nobody reads is not in flight.)
pub(crate) fn in_flight() -> usize {
    IN_FLIGHT.with(|f| f.borrow().iter().filter(|p| p.waiter.is_some()).count())
}

/// Drops the bodies nobody reads at the end of a request (which cancels
/// them in the host): a later read of one rejects, it never reaches into
/// the next request.
pub(crate) fn drop_unread() {
    let gone: Vec<Pending> = IN_FLIGHT.with(|f| {
        let mut f = f.borrow_mut();
        let (gone, kept) = std::mem::take(&mut *f)
            .into_iter()
            .partition(|p| p.waiter.is_none());
        *f = kept;
        gone
    });
    for p in gone {
        p.close(false);
    }
}

/// Moves every fetch somebody waits for forward without blocking, settling
/// the promises of those that moved; whether any did.
pub(crate) fn progress(ctx: &Ctx<'_>) -> bool {
    let mut settled = Vec::new();
    let mut ended = Vec::new();
    IN_FLIGHT.with(|f| {
        let mut f = f.borrow_mut();
        let mut i = 0;
        while i < f.len() {
            match f[i].step() {
                Step::Waiting => i += 1,
                step @ (Step::Head(..) | Step::Chunk(_)) => {
                    let p = &mut f[i];
                    settled.push((p.id, p.url.clone(), p.waiter.take(), step));
                    i += 1;
                }
                step => {
                    let mut p = f.swap_remove(i);
                    let whole = matches!(step, Step::End);
                    settled.push((p.id, p.url.clone(), p.waiter.take(), step));
                    ended.push((p, whole));
                }
            }
        }
    });
    let any = !settled.is_empty();
    // The promises are settled with the list let go of: settling queues
    // jobs only, but a rejection runs the rejection tracker.
    for (id, url, waiter, step) in settled {
        if let Some(waiter) = waiter
            && let Err(e) = settle(ctx, id, &url, waiter, step)
        {
            event_loop::log(&format!("fetch: {}", event_loop::error_text(ctx, e)));
        }
    }
    for (p, whole) in ended {
        p.close(whole);
    }
    any
}

/// Resolves or rejects the promise that waited for a fetch's `step`.
fn settle(
    ctx: &Ctx<'_>,
    id: u32,
    url: &str,
    (resolve, reject): Waiter,
    step: Step,
) -> rquickjs::Result<()> {
    match step {
        Step::Head(status, headers) => {
            let pairs = Array::new(ctx.clone())?;
            for (i, (k, v)) in headers.iter().enumerate() {
                pairs.set(2 * i, k.as_str())?;
                pairs.set(2 * i + 1, String::from_utf8_lossy(v).as_ref())?;
            }
            let answer = Array::new(ctx.clone())?;
            answer.set(0, status)?;
            answer.set(1, pairs)?;
            answer.set(2, id)?;
            answer.set(3, url)?;
            resolve.restore(ctx)?.call::<_, ()>((answer,))
        }
        Step::Chunk(bytes) => resolve
            .restore(ctx)?
            .call::<_, ()>((TypedArray::<u8>::new(ctx.clone(), bytes)?,)),
        Step::End => resolve
            .restore(ctx)?
            .call::<_, ()>((Value::new_null(ctx.clone()),)),
        Step::Failed(why) => {
            let error = type_error(ctx, &format!("fetch {url} failed: {why}"));
            reject.restore(ctx)?.call::<_, ()>((error,))
        }
        Step::Waiting => Ok(()),
    }
}

/// Runs `f` with the pollables of every fetch somebody waits for.
pub(crate) fn with_pollables<R>(f: impl FnOnce(&[&Pollable]) -> R) -> R {
    IN_FLIGHT.with(|list| {
        let mut list = list.borrow_mut();
        for p in list.iter_mut() {
            p.subscribe();
        }
        // Only those somebody waits for: a body the Worker stopped reading
        // keeps the pollable of its last read, ready while data waits, and
        // blocking on it would spin.
        let polls: Vec<&Pollable> = list
            .iter()
            .filter(|p| p.waiter.is_some())
            .filter_map(|p| p.pollable.as_ref())
            .collect();
        f(&polls)
    })
}
