//! An async fetch handler, like `export default { async fetch(request, env) }`
//! in a JavaScript Worker or `#[event(fetch)]` in workers-rs.
//!
//! Implement [`Worker`] and export it with [`export_fetch!`](crate::export_fetch):
//! the request arrives read whole as a [`Request`], the handler returns a
//! [`Response`], and it may `.await` subrequests to its bindings
//! ([`Binding::fetch_async`](crate::fetch::Binding::fetch_async)), several
//! at once with [`join_all`].
//!
//! ```no_run
//! use hearth_sdk::fetch::{Request, Response};
//! use hearth_sdk::{Env, Worker};
//!
//! struct Gateway;
//!
//! impl Worker for Gateway {
//!     async fn fetch(req: Request, env: Env) -> Response {
//!         let auth = env.service("auth").fetch_async(Request::get("/check")).await;
//!         match auth {
//!             Ok(r) if r.status == 200 => Response::new(200, format!("hello, {}", req.path())),
//!             _ => Response::new(403, "denied"),
//!         }
//!     }
//! }
//!
//! hearth_sdk::export_fetch!(Gateway);
//! ```
//!
//! # How the futures run
//!
//! wasi 0.2 has one thread and `wasi:io/poll`. [`block_on`] polls the
//! handler's future; when it is pending, every [`Pollable`] a future of this
//! crate is waiting for has been registered, and the instance blocks in
//! `poll` on all of them at once, then polls the handler again. So
//! subrequests joined with [`join_all`] wait concurrently. Bodies are read
//! and written with blocking calls.

use std::cell::RefCell;
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll};

use wasi::io::poll::Pollable;

use crate::fetch::{Request, Response};
use crate::{Env, IncomingRequest, ResponseOutparam};

/// A Worker with an async fetch handler; export it with
/// [`export_fetch!`](crate::export_fetch).
pub trait Worker {
    /// Answers `req`; `env` reaches the Worker's bindings.
    fn fetch(req: Request, env: Env) -> impl Future<Output = Response>;
}

/// Exports `$ty` (a type implementing [`Worker`]) as this component's
/// `wasi:http/incoming-handler`. Use it once, at the crate root.
#[macro_export]
macro_rules! export_fetch {
    ($ty:ident) => {
        struct __HearthFetchHandler;
        impl $crate::Guest for __HearthFetchHandler {
            fn handle(request: $crate::IncomingRequest, out: $crate::ResponseOutparam) {
                $crate::worker::serve::<$ty>(request, out)
            }
        }
        $crate::export_worker!(__HearthFetchHandler);
    };
}

thread_local! {
    static WAITING: RefCell<Vec<Rc<Pollable>>> = const { RefCell::new(Vec::new()) };
}

/// A future that is ready when `pollable` is.
pub struct Ready {
    pollable: Rc<Pollable>,
}

impl Ready {
    /// Waits for `pollable`.
    pub fn new(pollable: Pollable) -> Self {
        Ready {
            pollable: Rc::new(pollable),
        }
    }
}

impl Future for Ready {
    type Output = ();

    fn poll(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<()> {
        if self.pollable.ready() {
            Poll::Ready(())
        } else {
            WAITING.with(|w| w.borrow_mut().push(self.pollable.clone()));
            Poll::Pending
        }
    }
}

/// Runs `fut` to completion on this instance (see the module docs).
pub fn block_on<F: Future>(fut: F) -> F::Output {
    let mut fut = std::pin::pin!(fut);
    let mut cx = Context::from_waker(std::task::Waker::noop());
    loop {
        if let Poll::Ready(v) = fut.as_mut().poll(&mut cx) {
            return v;
        }
        let waiting = WAITING.with(|w| std::mem::take(&mut *w.borrow_mut()));
        if !waiting.is_empty() {
            let list: Vec<&Pollable> = waiting.iter().map(|p| &**p).collect();
            wasi::io::poll::poll(&list);
        }
    }
}

/// Runs `futures` concurrently; their outputs in order.
pub fn join_all<F: Future>(futures: Vec<F>) -> impl Future<Output = Vec<F::Output>> {
    JoinAll {
        futures: futures.into_iter().map(|f| Box::pin(f)).collect(),
        outputs: Vec::new(),
    }
}

struct JoinAll<F: Future> {
    futures: Vec<Pin<Box<F>>>,
    outputs: Vec<Option<F::Output>>,
}

// The futures are boxed and pinned there; the outputs are never pinned.
impl<F: Future> Unpin for JoinAll<F> {}

impl<F: Future> Future for JoinAll<F> {
    type Output = Vec<F::Output>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        if this.outputs.is_empty() {
            this.outputs = this.futures.iter().map(|_| None).collect();
        }
        let mut pending = false;
        for (f, out) in this.futures.iter_mut().zip(this.outputs.iter_mut()) {
            if out.is_none() {
                match f.as_mut().poll(cx) {
                    Poll::Ready(v) => *out = Some(v),
                    Poll::Pending => pending = true,
                }
            }
        }
        if pending {
            return Poll::Pending;
        }
        Poll::Ready(this.outputs.iter_mut().filter_map(Option::take).collect())
    }
}

/// The name of a wasi:http method (`GET`, `POST`, ...).
pub fn method_name(m: &wasi::http::types::Method) -> String {
    use wasi::http::types::Method;
    match m {
        Method::Get => "GET".into(),
        Method::Head => "HEAD".into(),
        Method::Post => "POST".into(),
        Method::Put => "PUT".into(),
        Method::Delete => "DELETE".into(),
        Method::Connect => "CONNECT".into(),
        Method::Options => "OPTIONS".into(),
        Method::Trace => "TRACE".into(),
        Method::Patch => "PATCH".into(),
        Method::Other(o) => o.clone(),
    }
}

/// Reads `request` whole, runs `W::fetch`, sends its response. Used by
/// [`export_fetch!`](crate::export_fetch).
pub fn serve<W: Worker>(request: IncomingRequest, out: ResponseOutparam) {
    let path = crate::path(&request);
    let host = request.authority().unwrap_or_default();
    let req = Request {
        method: method_name(&request.method()),
        url: format!("http://{host}{path}"),
        headers: crate::headers(&request),
        body: request
            .consume()
            .ok()
            .and_then(|b| {
                let bytes = b.stream().ok().and_then(|s| crate::read_to_end(&s).ok());
                drop(crate::IncomingBody::finish(b));
                bytes
            })
            .unwrap_or_default(),
    };
    let resp = block_on(W::fetch(req, crate::env()));
    let headers: Vec<(&str, &[u8])> = resp
        .headers
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_slice()))
        .collect();
    // A failure here means the client went away; there is no one to tell.
    let _ = crate::respond(out, resp.status, &headers, &resp.body);
}
