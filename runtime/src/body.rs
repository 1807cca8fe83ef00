//! The HTTP body type the runtime takes and returns.

use bytes::Bytes;
use http_body_util::BodyExt;
use http_body_util::combinators::UnsyncBoxBody;

/// Any error a body stream can carry across crates.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Request and response bodies: streamed, `Send`, not `Sync` (wasi:http's
/// response bodies are not). The cluster layer uses the identical alias.
pub type Body = UnsyncBoxBody<Bytes, BoxError>;

/// A body holding `bytes`, for responses the host makes itself.
pub fn full(bytes: impl Into<Bytes>) -> Body {
    http_body_util::Full::new(bytes.into())
        .map_err(|never| match never {})
        .boxed_unsync()
}

/// Converts any streaming body into a [`Body`].
pub fn boxed<B>(body: B) -> Body
where
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    body.map_err(Into::into).boxed_unsync()
}

/// A plain-text response with `status`, for replies the host makes itself
/// (errors, admin answers).
pub fn text_response(status: http::StatusCode, msg: impl Into<String>) -> http::Response<Body> {
    let mut r = http::Response::new(full(msg.into()));
    *r.status_mut() = status;
    r.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    r
}
