//! # hearth-sdk
//!
//! A small guest-side library for writing hearth Workers in Rust.
//!
//! A hearth Worker is a plain **wasi:http proxy component**: a `wasm32-wasip2`
//! `cdylib` that exports `wasi:http/incoming-handler@0.2.x`. Nothing here is
//! hearth-only magic; the same component runs under `wasmtime serve` and any
//! other wasi:http host. This crate is a thin layer over the [`wasi`] crate
//! (wasi 0.2 bindings, re-exported as [`hearth_sdk::wasi`](wasi)) that takes
//! the boilerplate out of the common cases:
//!
//! - [`export_worker!`] exports a type implementing [`Guest`] as the
//!   component's `wasi:http/incoming-handler`.
//! - [`init!`] runs a function at component *instantiation* (start-up work
//!   that a host counts as cold start, not as the first request).
//! - [`script_id`] reads the Worker's script ID, which hearth puts in the
//!   Worker's WASI environment as [`SCRIPT_ID_ENV`] (`HEARTH_SCRIPT_ID`).
//! - [`respond`] sends a complete response (status, headers, body) in one call.
//! - [`Response`] starts a response whose body you stream yourself; [`copy`]
//!   and [`write_all`] move bytes between wasi streams in chunks of at most
//!   [`CHUNK`] bytes, in constant memory.
//! - [`fetch`] calls the Workers this Worker is bound to, with plain wasi:http
//!   requests: `env().service("auth").fetch(req)`,
//!   `env().dispatch("users").get("user-a").fetch(req)`.
//! - [`log!`] and [`trace!`] write a line to the Worker's log (its stderr;
//!   hearth delivers it to the flow's tail Workers).
//! - [`Worker`] and [`export_fetch!`]: an async fetch handler with typed
//!   request and response, whose subrequests can run concurrently
//!   ([`join_all`]).
//! - [`tail::parse`] reads what hearth sends a tail Worker.
//! - [`config::get`] reads a var or secret through `wasi:config/store`
//!   (hearth also puts them in the environment, for `std::env::var`).
//!
//! ## Example: the lowest level
//!
//! ```no_run
//! use hearth_sdk::{Guest, IncomingRequest, ResponseOutparam};
//!
//! struct Hello;
//!
//! impl Guest for Hello {
//!     fn handle(_request: IncomingRequest, out: ResponseOutparam) {
//!         let body = format!("hello from {}", hearth_sdk::script_id());
//!         // A failure here means the host went away; there is no one to tell.
//!         let _ = hearth_sdk::respond(out, 200, &[("content-type", b"text/plain")], body.as_bytes());
//!     }
//! }
//!
//! hearth_sdk::export_worker!(Hello);
//! ```
//!
//! ## Example: a Worker that calls Workers
//!
//! Deployed with a service binding `auth` and a dispatch namespace `users`
//! (`hearth deploy --service auth=auth-worker --dispatch users=user-a ...`),
//! this Worker checks the caller with `auth`, then hands the request to the
//! user Worker named by the first path segment, both calls running at once:
//!
//! ```no_run
//! use hearth_sdk::fetch::{FetchError, Request, Response};
//! use hearth_sdk::{Env, Worker, join_all};
//!
//! struct Platform;
//!
//! impl Worker for Platform {
//!     async fn fetch(req: Request, env: Env) -> Response {
//!         let path = req.path().trim_start_matches('/').to_string();
//!         let (user, rest) = path.split_once('/').unwrap_or((&path, ""));
//!         hearth_sdk::log!("request for {user}");
//!         let token = req.header_value("authorization").unwrap_or_default();
//!         let auth = env.service("auth");
//!         let target = env.dispatch("users").get(user);
//!         let check = Request::get("/check").header("authorization", token);
//!         let forward = Request::get(&format!("/{rest}"));
//!         let mut answers = join_all(vec![
//!             Box::pin(auth.fetch_async(check)) as std::pin::Pin<Box<dyn std::future::Future<Output = _>>>,
//!             Box::pin(target.fetch_async(forward)),
//!         ])
//!         .await
//!         .into_iter();
//!         match (answers.next(), answers.next()) {
//!             (Some(Ok(ok)), Some(Ok(resp))) if ok.status == 200 => resp,
//!             (Some(Ok(_)), _) => Response::new(403, "not allowed"),
//!             (_, Some(Err(FetchError::Denied))) => Response::new(404, "no such user Worker"),
//!             _ => Response::new(502, "upstream failed"),
//!         }
//!     }
//! }
//!
//! hearth_sdk::export_fetch!(Platform);
//! ```
//!
//! Build it with `cargo build --release --target wasm32-wasip2` from a crate
//! with `crate-type = ["cdylib"]`; the `.wasm` in
//! `target/wasm32-wasip2/release/` is the component to deploy.
//!
//! A panic in a handler traps (the instance is discarded by hearth); with
//! `panic = "abort"` in the release profile it is an immediate trap.

#![warn(missing_docs)]

pub mod config;
pub mod fetch;
pub mod tail;
pub mod worker;

pub use worker::{Worker, join_all};

/// The wasi 0.2 bindings this SDK is built on (the [`wasi`] crate,
/// re-exported so Workers need no direct dependency on it).
pub use wasi;

pub use wasi::exports::http::incoming_handler::Guest;
pub use wasi::http::types::{
    ErrorCode, Fields, IncomingBody, IncomingRequest, OutgoingBody, OutgoingResponse,
    ResponseOutparam,
};
pub use wasi::io::streams::{InputStream, OutputStream, StreamError};

/// What the Worker was deployed with that it can reach: its bindings.
#[derive(Debug, Clone, Copy, Default)]
pub struct Env;

/// The Worker's environment ([`Env`]).
pub fn env() -> Env {
    Env
}

impl Env {
    /// Service binding `name`.
    pub fn service(&self, name: &str) -> fetch::Binding {
        fetch::service(name)
    }

    /// Dispatch namespace `name`.
    pub fn dispatch(&self, name: &str) -> fetch::Namespace {
        fetch::dispatch(name)
    }
}

/// Writes a formatted line to the Worker's log (stderr), like `eprintln!`.
#[macro_export]
macro_rules! log {
    ($($arg:tt)*) => {
        ::std::eprintln!($($arg)*)
    };
}

/// Writes a formatted line to the Worker's log marked `[trace]`, for
/// detail a tail Worker may filter out (same channel as [`log!`]).
#[macro_export]
macro_rules! trace {
    ($($arg:tt)*) => {
        ::std::eprintln!("[trace] {}", ::std::format_args!($($arg)*))
    };
}

/// Environment variable in which hearth passes the Worker's script ID.
pub const SCRIPT_ID_ENV: &str = "HEARTH_SCRIPT_ID";

/// Largest number of bytes moved per `blocking_write_and_flush` /
/// `blocking_read` call: wasi:io guarantees a write of 4096 bytes is allowed
/// by `check-write`, so no write in this crate ever exceeds it.
pub const CHUNK: usize = 4096;

/// Exports `$ty` (a type implementing [`Guest`]) as this component's
/// `wasi:http/incoming-handler`.
///
/// Use it once, at the crate root of a `cdylib`. It expands to the [`wasi`]
/// crate's `http::proxy::export!` with the types taken from
/// [`hearth_sdk::wasi`](wasi), so the Worker needs no `wasi` dependency of its
/// own.
#[macro_export]
macro_rules! export_worker {
    ($ty:ident) => {
        $crate::wasi::http::proxy::export!($ty with_types_in $crate::wasi);
    };
}

/// Runs `$f` (a `fn()`) once when the component is **instantiated**, before
/// any request: put expensive start-up work (parsing embedded data, building
/// tables) here so it counts as start-up, not as the first request.
///
/// It exports the core function `_initialize`, the WASI reactor convention
/// (also in the component model's `BuildTargets.md`). When a core module
/// exports `_initialize`, `wit-component` (run by `wasm-component-ld`, the
/// linker rustc uses for `wasm32-wasip2`) adds a tiny core module whose
/// `start` section calls it, instantiated last; so any component-model host
/// (wasmtime, jco, ...) runs it inside component instantiation, with no
/// hearth-specific support. Without this, a Rust `wasm32-wasip2` component runs
/// no guest code at instantiation: static constructors run lazily at the start
/// of the first export call.
///
/// `_initialize` first runs the module's static constructors (once; the
/// exported handler then skips them), then `$f`. Use it at most once per
/// component. A panic in `$f` traps, failing instantiation.
///
/// ```no_run
/// fn warm_up() {
///     // ... expensive set-up ...
/// }
/// hearth_sdk::init!(warm_up);
/// ```
#[macro_export]
macro_rules! init {
    ($f:path) => {
        const _: () = {
            #[unsafe(export_name = "_initialize")]
            extern "C" fn __hearth_sdk_initialize() {
                $crate::__private::initialize($f);
            }
        };
    };
}

#[doc(hidden)]
pub mod __private {
    /// The body of the `_initialize` export generated by [`init!`](crate::init).
    pub fn initialize(f: fn()) {
        #[cfg(target_arch = "wasm32")]
        wit_bindgen::rt::run_ctors_once();
        f();
    }
}

/// Errors from the response helpers.
#[derive(Debug)]
pub enum Error {
    /// The status code is not a valid HTTP status.
    Status(u16),
    /// A header name or value was refused (invalid or forbidden).
    Header(String),
    /// The response body had already been taken.
    Body,
    /// Writing the body failed (for example, the client went away).
    Stream(StreamError),
    /// Finishing the body failed.
    Finish(ErrorCode),
}

impl core::fmt::Display for Error {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            Error::Status(s) => write!(f, "invalid status code {s}"),
            Error::Header(h) => write!(f, "header refused: {h}"),
            Error::Body => f.write_str("response body already taken"),
            Error::Stream(e) => write!(f, "body stream error: {e:?}"),
            Error::Finish(e) => write!(f, "finishing body failed: {e:?}"),
        }
    }
}

impl std::error::Error for Error {}

impl From<StreamError> for Error {
    fn from(e: StreamError) -> Self {
        Error::Stream(e)
    }
}

/// The Worker's script ID as set by hearth in [`SCRIPT_ID_ENV`], if any.
///
/// Reads the WASI environment (`wasi:cli/environment`) each call.
pub fn try_script_id() -> Option<String> {
    wasi::cli::environment::get_environment()
        .into_iter()
        .find(|(k, _)| k == SCRIPT_ID_ENV)
        .map(|(_, v)| v)
}

/// The Worker's script ID, or `"unknown"` when not run by hearth.
pub fn script_id() -> String {
    try_script_id().unwrap_or_else(|| "unknown".to_owned())
}

/// All headers of a request as `(name, value)` pairs, in order.
pub fn headers(request: &IncomingRequest) -> Vec<(String, Vec<u8>)> {
    request.headers().entries()
}

/// The path and query of a request (`"/"` when absent).
pub fn path(request: &IncomingRequest) -> String {
    request
        .path_with_query()
        .filter(|p| !p.is_empty())
        .unwrap_or_else(|| "/".to_owned())
}

/// Builds a [`Fields`] from `(name, value)` pairs.
///
/// Fails with [`Error::Header`] naming the first header the host refuses.
pub fn fields<N: AsRef<str>, V: AsRef<[u8]>>(headers: &[(N, V)]) -> Result<Fields, Error> {
    let fields = Fields::new();
    for (name, value) in headers {
        fields
            .append(name.as_ref(), value.as_ref())
            .map_err(|e| Error::Header(format!("{}: {e:?}", name.as_ref())))?;
    }
    Ok(fields)
}

/// A response that has been sent to the client with its status and headers,
/// and whose body is being written.
///
/// Write with [`Response::write_all`] or [`Response::copy_from`], or use
/// [`Response::stream`] directly; then call [`Response::finish`]. Dropping a
/// `Response` without finishing tells the host the body was cut short.
pub struct Response {
    // Field order matters: the stream is a child of the body and must be
    // dropped first.
    stream: Option<OutputStream>,
    body: Option<OutgoingBody>,
}

impl Response {
    /// Sends status and headers through `out` and opens the body for writing.
    pub fn start(out: ResponseOutparam, status: u16, headers: Fields) -> Result<Self, Error> {
        let response = OutgoingResponse::new(headers);
        if response.set_status_code(status).is_err() {
            ResponseOutparam::set(
                out,
                Err(ErrorCode::InternalError(Some(format!(
                    "invalid status {status}"
                )))),
            );
            return Err(Error::Status(status));
        }
        let body = response.body().map_err(|()| Error::Body)?;
        ResponseOutparam::set(out, Ok(response));
        let stream = body.write().map_err(|()| Error::Body)?;
        Ok(Response {
            stream: Some(stream),
            body: Some(body),
        })
    }

    /// The body's output stream.
    ///
    /// # Panics
    ///
    /// Never: the stream is present until [`Response::finish`] consumes `self`.
    pub fn stream(&self) -> &OutputStream {
        match &self.stream {
            Some(s) => s,
            None => unreachable!("stream present until finish"),
        }
    }

    /// Writes all of `bytes` to the body (see [`write_all`]).
    pub fn write_all(&self, bytes: &[u8]) -> Result<(), Error> {
        Ok(write_all(self.stream(), bytes)?)
    }

    /// Copies `input` to the body until `input` closes (see [`copy`]);
    /// returns the number of bytes copied.
    pub fn copy_from(&self, input: &InputStream) -> Result<u64, Error> {
        Ok(copy(input, self.stream())?)
    }

    /// Ends the body (no trailers).
    pub fn finish(mut self) -> Result<(), Error> {
        drop(self.stream.take());
        match self.body.take() {
            Some(body) => OutgoingBody::finish(body, None).map_err(Error::Finish),
            None => Ok(()),
        }
    }
}

/// Sends a complete response: `status`, `headers` and the whole `body`.
pub fn respond(
    out: ResponseOutparam,
    status: u16,
    headers: &[(&str, &[u8])],
    body: &[u8],
) -> Result<(), Error> {
    let response = start_response(out, status, headers)?;
    response.write_all(body)?;
    response.finish()
}

/// Sends `status` and `headers` and opens the body for writing, for a body
/// written as it is made ([`Response`]); a header the host refuses answers
/// the client with an error instead.
pub fn start_response(
    out: ResponseOutparam,
    status: u16,
    headers: &[(&str, &[u8])],
) -> Result<Response, Error> {
    let fields = match fields(headers) {
        Ok(f) => f,
        Err(e) => {
            ResponseOutparam::set(out, Err(ErrorCode::InternalError(Some(e.to_string()))));
            return Err(e);
        }
    };
    Response::start(out, status, fields)
}

/// Writes all of `bytes` to `stream`, blocking, in chunks of at most
/// [`CHUNK`] bytes (each no larger than `check-write` permits), flushing each.
pub fn write_all(stream: &OutputStream, bytes: &[u8]) -> Result<(), StreamError> {
    for chunk in bytes.chunks(CHUNK) {
        stream.blocking_write_and_flush(chunk)?;
    }
    Ok(())
}

/// Copies `input` to `output` until `input` is closed, blocking, at most
/// [`CHUNK`] bytes at a time, so memory use is constant whatever the size.
/// Returns the number of bytes copied.
pub fn copy(input: &InputStream, output: &OutputStream) -> Result<u64, StreamError> {
    let mut total = 0u64;
    loop {
        match input.blocking_read(CHUNK as u64) {
            Ok(chunk) => {
                write_all(output, &chunk)?;
                total += chunk.len() as u64;
            }
            Err(StreamError::Closed) => return Ok(total),
            Err(e) => return Err(e),
        }
    }
}

/// Reads the whole of `input` into memory (until it closes). Prefer [`copy`]
/// for bodies of unknown size.
pub fn read_to_end(input: &InputStream) -> Result<Vec<u8>, StreamError> {
    let mut buf = Vec::new();
    loop {
        match input.blocking_read(CHUNK as u64) {
            Ok(chunk) => buf.extend_from_slice(&chunk),
            Err(StreamError::Closed) => return Ok(buf),
            Err(e) => return Err(e),
        }
    }
}
