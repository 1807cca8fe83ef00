//! Calling other Workers (and, through an outbound Worker, the outside
//! world) with plain wasi:http outgoing requests.
//!
//! hearth resolves host names in the reserved `.internal` domain against the
//! bindings the Worker was **deployed** with (nothing a Worker sends can add
//! to them):
//!
//! | URL | reaches |
//! |---|---|
//! | `http://<binding>.internal/<path>` | the Worker of service binding `<binding>` ([`service`]) |
//! | `http://<worker>.<ns>.dispatch.internal/<path>` | user Worker `<worker>` of dispatch namespace `<ns>` ([`dispatch`]) |
//! | anything else | the outbound Worker in force, if the platform set one; else denied |
//!
//! A call the Worker is not allowed to make fails with
//! [`FetchError::Denied`]; a chain of calls deeper than hearth allows (a
//! loop of bindings) with [`FetchError::LoopDetected`]. Because these are
//! ordinary wasi:http requests, the same code works with any wasi:http
//! client (`wstd`, `fetch()` in componentize-js, ...).
//!
//! ```no_run
//! use hearth_sdk::fetch::{Request, service};
//! let resp = service("auth").fetch(Request::get("/check").header("x-user", "ada"))?;
//! if resp.status == 200 { /* ... */ }
//! # Ok::<(), hearth_sdk::fetch::FetchError>(())
//! ```
//!
//! The calls block the instance until the response has arrived (wasi 0.2
//! pollables), which is what a request handler of this SDK does anyway.

use wasi::http::outgoing_handler;
use wasi::http::types::{IncomingBody, Method, OutgoingBody, OutgoingRequest, Scheme};

use crate::{ErrorCode, StreamError, fields, read_to_end, write_all};

/// An outgoing request: method, URL (or, for a [`Binding`], a path),
/// headers and a complete body.
#[derive(Debug, Clone)]
pub struct Request {
    /// The method (`GET`, `POST`, ...).
    pub method: String,
    /// An absolute URL (`http://host/path`) or, for a [`Binding`], a path.
    pub url: String,
    /// Headers in order.
    pub headers: Vec<(String, Vec<u8>)>,
    /// The body.
    pub body: Vec<u8>,
}

impl Request {
    /// A request with `method` to `url` and no body.
    pub fn new(method: &str, url: &str) -> Self {
        Request {
            method: method.to_owned(),
            url: url.to_owned(),
            headers: Vec::new(),
            body: Vec::new(),
        }
    }

    /// A `GET` of `url`.
    pub fn get(url: &str) -> Self {
        Request::new("GET", url)
    }

    /// A `POST` of `body` to `url`.
    pub fn post(url: &str, body: impl Into<Vec<u8>>) -> Self {
        Request::new("POST", url).body(body)
    }

    /// Adds a header.
    pub fn header(mut self, name: &str, value: impl AsRef<[u8]>) -> Self {
        self.headers
            .push((name.to_owned(), value.as_ref().to_vec()));
        self
    }

    /// Sets the body.
    pub fn body(mut self, body: impl Into<Vec<u8>>) -> Self {
        self.body = body.into();
        self
    }

    /// The path and query of the URL (`/` if it has none).
    pub fn path(&self) -> &str {
        match split_url(&self.url) {
            Ok((_, _, path)) => path,
            Err(_) if self.url.starts_with('/') => &self.url,
            Err(_) => "/",
        }
    }

    /// The first value of header `name` (case-insensitive) as text.
    pub fn header_value(&self, name: &str) -> Option<String> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| String::from_utf8_lossy(v).into_owned())
    }
}

/// A response read whole.
#[derive(Debug, Clone)]
pub struct Response {
    /// Status code.
    pub status: u16,
    /// Headers in order.
    pub headers: Vec<(String, Vec<u8>)>,
    /// The body.
    pub body: Vec<u8>,
}

impl Response {
    /// A response with `status` and `body` and no headers.
    pub fn new(status: u16, body: impl Into<Vec<u8>>) -> Self {
        Response {
            status,
            headers: Vec::new(),
            body: body.into(),
        }
    }

    /// Adds a header.
    pub fn with_header(mut self, name: &str, value: impl AsRef<[u8]>) -> Self {
        self.headers
            .push((name.to_owned(), value.as_ref().to_vec()));
        self
    }

    /// The first value of header `name` (case-insensitive) as text.
    pub fn header(&self, name: &str) -> Option<String> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| String::from_utf8_lossy(v).into_owned())
    }

    /// The body as text (invalid UTF-8 replaced).
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// Why a fetch failed.
#[derive(Debug)]
pub enum FetchError {
    /// The host refused the request: not one of the Worker's bindings, no
    /// outbound Worker takes it, and its origin is not on the Worker's
    /// allow-list (`HTTP-request-denied`).
    Denied,
    /// The flow is as deep as hearth allows: a loop of bindings?
    /// (`loop-detected`).
    LoopDetected,
    /// The flow's deadline passed before the answer came.
    Timeout,
    /// The URL or method could not be used.
    Invalid(String),
    /// Any other wasi:http error code.
    Http(ErrorCode),
    /// Writing the request body or reading the response body failed.
    Stream(StreamError),
}

impl core::fmt::Display for FetchError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            FetchError::Denied => {
                f.write_str("request denied: not a binding or an allowed host of this Worker")
            }
            FetchError::LoopDetected => {
                f.write_str("loop detected: the flow is as deep as hearth allows")
            }
            FetchError::Timeout => f.write_str("the flow's deadline passed"),
            FetchError::Invalid(m) => write!(f, "invalid request: {m}"),
            FetchError::Http(e) => write!(f, "HTTP error: {e:?}"),
            FetchError::Stream(e) => write!(f, "body stream error: {e:?}"),
        }
    }
}

impl std::error::Error for FetchError {}

impl From<ErrorCode> for FetchError {
    fn from(e: ErrorCode) -> Self {
        match e {
            ErrorCode::HttpRequestDenied => FetchError::Denied,
            ErrorCode::LoopDetected => FetchError::LoopDetected,
            ErrorCode::HttpResponseTimeout | ErrorCode::ConnectionTimeout => FetchError::Timeout,
            e => FetchError::Http(e),
        }
    }
}

impl From<StreamError> for FetchError {
    fn from(e: StreamError) -> Self {
        FetchError::Stream(e)
    }
}

fn method(m: &str) -> Method {
    match m.to_ascii_uppercase().as_str() {
        "GET" => Method::Get,
        "HEAD" => Method::Head,
        "POST" => Method::Post,
        "PUT" => Method::Put,
        "DELETE" => Method::Delete,
        "OPTIONS" => Method::Options,
        "PATCH" => Method::Patch,
        other => Method::Other(other.to_owned()),
    }
}

/// Splits an absolute `http(s)://authority/path?query` URL.
fn split_url(url: &str) -> Result<(Scheme, &str, &str), FetchError> {
    let (scheme, rest) = if let Some(r) = url.strip_prefix("http://") {
        (Scheme::Http, r)
    } else if let Some(r) = url.strip_prefix("https://") {
        (Scheme::Https, r)
    } else {
        return Err(FetchError::Invalid(format!(
            "{url:?} is not an absolute http(s) URL"
        )));
    };
    let (authority, path) = match rest.find(['/', '?']) {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/"),
    };
    if authority.is_empty() {
        return Err(FetchError::Invalid(format!("{url:?} has no host")));
    }
    Ok((scheme, authority, path))
}

/// Sends `req` (with an absolute URL) and reads the whole response,
/// blocking the instance until it has arrived.
pub fn fetch(req: Request) -> Result<Response, FetchError> {
    let pending = send(req)?;
    let response = loop {
        match pending.get() {
            Some(r) => break r,
            None => pending.subscribe().block(),
        }
    };
    read(response)
}

/// [`fetch`] as a future: other futures (more subrequests, see
/// [`crate::worker::join_all`]) progress while it waits for the response.
pub async fn fetch_async(req: Request) -> Result<Response, FetchError> {
    let pending = send(req)?;
    let response = loop {
        match pending.get() {
            Some(r) => break r,
            None => crate::worker::Ready::new(pending.subscribe()).await,
        }
    };
    read(response)
}

/// Sends `req` (with an absolute URL) without waiting for the answer: the
/// head goes out and the body is written whole; the returned future is
/// the response, for callers that run an event loop of their own (the JS
/// engine's `fetch`). [`fetch`] and [`fetch_async`] wait on it.
pub fn send(req: Request) -> Result<wasi::http::types::FutureIncomingResponse, FetchError> {
    let (scheme, authority, path) = split_url(&req.url)?;
    let headers = fields(&req.headers).map_err(|e| FetchError::Invalid(e.to_string()))?;
    let out = OutgoingRequest::new(headers);
    let invalid = |what: &str| FetchError::Invalid(format!("{what} refused"));
    out.set_method(&method(&req.method))
        .map_err(|()| invalid("method"))?;
    out.set_scheme(Some(&scheme))
        .map_err(|()| invalid("scheme"))?;
    out.set_authority(Some(authority))
        .map_err(|()| invalid("authority"))?;
    out.set_path_with_query(Some(path))
        .map_err(|()| invalid("path"))?;
    let body = out.body().map_err(|()| invalid("body"))?;
    let pending = outgoing_handler::handle(out, None)?;
    {
        let stream = body.write().map_err(|()| invalid("body"))?;
        write_all(&stream, &req.body)?;
    }
    OutgoingBody::finish(body, None)?;
    Ok(pending)
}

type Arrived = Result<Result<wasi::http::types::IncomingResponse, ErrorCode>, ()>;

fn read(response: Arrived) -> Result<Response, FetchError> {
    let invalid = |what: &str| FetchError::Invalid(format!("{what} refused"));
    let response = response.map_err(|()| FetchError::Invalid("response taken twice".into()))??;
    let status = response.status();
    let headers = response.headers().entries();
    let incoming = response.consume().map_err(|()| invalid("response body"))?;
    let bytes = {
        let stream = incoming.stream().map_err(|()| invalid("response body"))?;
        read_to_end(&stream)?
    };
    drop(IncomingBody::finish(incoming));
    Ok(Response {
        status,
        headers,
        body: bytes,
    })
}

/// A Worker this Worker is bound to, addressed by host name; requests to it
/// take a path (`/x?y`), not a URL.
#[derive(Debug, Clone)]
pub struct Binding {
    host: String,
}

impl Binding {
    /// The host name hearth resolves for this binding.
    pub fn host(&self) -> &str {
        &self.host
    }

    /// Sends `req`, whose `url` is a path (a leading `/` is added if
    /// missing), to the bound Worker.
    pub fn fetch(&self, req: Request) -> Result<Response, FetchError> {
        fetch(self.address(req))
    }

    /// [`Binding::fetch`] as a future ([`fetch_async`]).
    pub async fn fetch_async(&self, req: Request) -> Result<Response, FetchError> {
        fetch_async(self.address(req)).await
    }

    fn address(&self, mut req: Request) -> Request {
        let sep = if req.url.starts_with('/') { "" } else { "/" };
        req.url = format!("http://{}{sep}{}", self.host, req.url);
        req
    }
}

/// Service binding `name` (`http://<name>.internal/`).
pub fn service(name: &str) -> Binding {
    Binding {
        host: format!("{name}.internal"),
    }
}

/// A dispatch namespace: pick a user Worker with [`Namespace::get`].
#[derive(Debug, Clone)]
pub struct Namespace {
    name: String,
}

impl Namespace {
    /// User Worker `worker` of this namespace
    /// (`http://<worker>.<ns>.dispatch.internal/`).
    pub fn get(&self, worker: &str) -> Binding {
        Binding {
            host: format!("{worker}.{}.dispatch.internal", self.name),
        }
    }
}

/// Dispatch namespace `name`.
pub fn dispatch(name: &str) -> Namespace {
    Namespace {
        name: name.to_owned(),
    }
}
