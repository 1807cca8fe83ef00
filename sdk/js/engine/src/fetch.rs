//! The outgoing half of the global `fetch`: `__hearth_fetch(method, url,
//! pairs, body)` sends one request through `wasi:http/outgoing-handler` and
//! returns its id and a promise of `[status, pairs, body, url]` (`pairs`
//! the headers as `[name, value, ...]`, `body` a `Uint8Array`), which
//! `runtime.js` makes a `Response` with `__hearth_web.fromFetch`;
//! `__hearth_fetch_abort(id)` cancels it (an `AbortSignal`).
//!
//! ## The model
//!
//! Sending is immediate: the head goes to the host and the request body is
//! written whole (`hearth_sdk::fetch::send`). The answer is not waited for
//! here: the request joins the instance's list of fetches in flight, and the
//! event loop ([`crate::event_loop`]) moves every one of them forward
//! without blocking ([`progress`]): the response head when it has arrived,
//! then the body, read as it comes until the stream ends (buffered: the
//! promise resolves with the whole body). When nothing else can run, the
//! loop blocks in `wasi:io/poll` on each fetch's [`pollable`](Pending), so
//! several fetches in flight progress together and a waiting instance spins
//! no CPU.
//!
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

/// Headers an outgoing request or a response may not carry (wasi:http
/// refuses them: the host sets them itself).
pub(crate) const HOP_BY_HOP: [&str; 6] = [
    "connection",
    "keep-alive",
    "proxy-connection",
    "transfer-encoding",
    "upgrade",
    "host",
];

/// Where a fetch in flight is.
enum Stage {
    /// Sent; the response head has not arrived.
    Head(FutureIncomingResponse),
    /// The head arrived; the body is being read.
    Body {
        status: u16,
        headers: Vec<(String, Vec<u8>)>,
        // Dropped before `body`, its parent.
        stream: InputStream,
        body: IncomingBody,
        read: Vec<u8>,
    },
    /// Taken apart: its promise is being settled.
    Over,
}

/// A fetch in flight.
struct Pending {
    // Dropped before `stage`, whose child it is.
    /// What the loop blocks on for this fetch, made when it first blocks
    /// in the current stage.
    pollable: Option<Pollable>,
    stage: Stage,
    /// What `__hearth_fetch_abort` names it by.
    id: u32,
    url: String,
    resolve: Persistent<Function<'static>>,
    reject: Persistent<Function<'static>>,
}

/// What moving a fetch forward came to.
enum Step {
    /// It waits for the host.
    Waiting,
    /// The whole answer: `(status, headers, body)`.
    Done(u16, Vec<(String, Vec<u8>)>, Vec<u8>),
    /// It failed: why.
    Failed(String),
}

impl Pending {
    /// Moves this fetch forward as far as it goes without blocking.
    fn step(&mut self) -> Step {
        loop {
            match &mut self.stage {
                Stage::Head(future) => {
                    let arrived = match future.get() {
                        None => return Step::Waiting,
                        Some(a) => a,
                    };
                    match head(arrived) {
                        Ok((status, headers, body, stream)) => {
                            self.pollable = None;
                            self.stage = Stage::Body {
                                status,
                                headers,
                                stream,
                                body,
                                read: Vec::new(),
                            };
                        }
                        Err(why) => return Step::Failed(why),
                    }
                }
                Stage::Body { stream, read, .. } => loop {
                    match stream.read(65536) {
                        Ok(chunk) if chunk.is_empty() => return Step::Waiting,
                        Ok(chunk) => read.extend_from_slice(&chunk),
                        Err(StreamError::Closed) => {
                            self.pollable = None;
                            if let Stage::Body {
                                status,
                                headers,
                                stream,
                                body,
                                read,
                            } = std::mem::replace(&mut self.stage, Stage::Over)
                            {
                                drop(stream);
                                drop(IncomingBody::finish(body));
                                return Step::Done(status, headers, read);
                            }
                            return Step::Failed("taken apart twice".into());
                        }
                        Err(StreamError::LastOperationFailed(e)) => {
                            return Step::Failed(format!(
                                "reading the response body failed: {}",
                                e.to_debug_string()
                            ));
                        }
                    }
                },
                Stage::Over => return Step::Failed("taken apart twice".into()),
            }
        }
    }

    /// Makes the pollable that is ready when this fetch can move again,
    /// if it has none for its stage yet.
    fn subscribe(&mut self) {
        if self.pollable.is_none() {
            self.pollable = match &self.stage {
                Stage::Head(future) => Some(future.subscribe()),
                Stage::Body { stream, .. } => Some(stream.subscribe()),
                Stage::Over => None,
            };
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
    /// The instance's fetches in flight.
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
/// module docs (`id` names the fetch to `__hearth_fetch_abort`).
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
                resolve: Persistent::save(&ctx, resolve),
                reject: Persistent::save(&ctx, reject),
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

/// `__hearth_fetch_abort(id)`: drops fetch `id` if it is still in flight,
/// which cancels it in the host; its promise never settles (`runtime.js`
/// rejects the caller's with the signal's reason).
fn abort(id: u32) {
    let gone = IN_FLIGHT.with(|f| {
        let mut f = f.borrow_mut();
        let at = f.iter().position(|p| p.id == id);
        at.map(|i| f.swap_remove(i))
    });
    drop(gone);
}

/// Defines `__hearth_fetch` and `__hearth_fetch_abort` on `ctx`'s global
/// object.
pub(crate) fn define(ctx: &Ctx<'_>) -> rquickjs::Result<()> {
    ctx.globals()
        .set("__hearth_fetch", Function::new(ctx.clone(), fetch)?)?;
    ctx.globals()
        .set("__hearth_fetch_abort", Function::new(ctx.clone(), abort)?)
}

/// How many fetches are in flight.
pub(crate) fn in_flight() -> usize {
    IN_FLIGHT.with(|f| f.borrow().len())
}

/// Moves every fetch in flight forward without blocking, settling the
/// promises of those that finished or failed; whether any did.
pub(crate) fn progress(ctx: &Ctx<'_>) -> bool {
    let mut settled = Vec::new();
    IN_FLIGHT.with(|f| {
        let mut f = f.borrow_mut();
        let mut i = 0;
        while i < f.len() {
            match f[i].step() {
                Step::Waiting => i += 1,
                step => settled.push((f.swap_remove(i), step)),
            }
        }
    });
    let any = !settled.is_empty();
    // The promises are settled with the list let go of: settling queues
    // jobs only, but a rejection runs the rejection tracker.
    for (p, step) in settled {
        if let Err(e) = settle(ctx, p, step) {
            event_loop::log(&format!("fetch: {}", event_loop::error_text(ctx, e)));
        }
    }
    any
}

/// Resolves or rejects a finished fetch's promise.
fn settle(ctx: &Ctx<'_>, p: Pending, step: Step) -> rquickjs::Result<()> {
    match step {
        Step::Done(status, headers, body) => {
            let pairs = Array::new(ctx.clone())?;
            for (i, (k, v)) in headers.iter().enumerate() {
                pairs.set(2 * i, k.as_str())?;
                pairs.set(2 * i + 1, String::from_utf8_lossy(v).as_ref())?;
            }
            let answer = Array::new(ctx.clone())?;
            answer.set(0, status)?;
            answer.set(1, pairs)?;
            answer.set(2, TypedArray::<u8>::new(ctx.clone(), body)?)?;
            answer.set(3, p.url.as_str())?;
            p.resolve.restore(ctx)?.call::<_, ()>((answer,))
        }
        Step::Failed(why) => {
            let error = type_error(ctx, &format!("fetch {} failed: {why}", p.url));
            p.reject.restore(ctx)?.call::<_, ()>((error,))
        }
        Step::Waiting => Ok(()),
    }
}

/// Runs `f` with the pollables of every fetch in flight.
pub(crate) fn with_pollables<R>(f: impl FnOnce(&[&Pollable]) -> R) -> R {
    IN_FLIGHT.with(|list| {
        let mut list = list.borrow_mut();
        for p in list.iter_mut() {
            p.subscribe();
        }
        let polls: Vec<&Pollable> = list.iter().filter_map(|p| p.pollable.as_ref()).collect();
        f(&polls)
    })
}
