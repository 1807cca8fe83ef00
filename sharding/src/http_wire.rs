//! HTTP request and response heads on the wire (`RequestHead`,
//! `ResponseHead` in `schema/hearth.capnp`).
//!
//! Bodies travel separately as streams (see [`crate::byte_stream`]), so a
//! head is only method, URI, status and headers. Hop-by-hop headers
//! (`connection`, `transfer-encoding`, ...) describe one TCP connection and
//! are dropped in transit, as any proxy does; the body is re-framed on the
//! other side. The HTTP version is not carried (each side speaks its own).
//!
//! Heads from a peer are checked against [`MAX_HEADERS`] and
//! [`MAX_HEAD_BYTES`] and rejected with a [`HeadError`] otherwise.

use http::header::{HeaderName, HeaderValue};
use http::{HeaderMap, Method, StatusCode, Uri};

use crate::schema::hearth_capnp::{header, request_head, response_head};

/// Most headers a head may carry.
pub(crate) const MAX_HEADERS: usize = 512;
/// Most bytes of method, URI, names and values in one head.
pub(crate) const MAX_HEAD_BYTES: usize = 256 * 1024;

/// A head from a peer that cannot be turned back into HTTP.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum HeadError {
    /// Cap'n Proto could not read it.
    #[error("malformed head: {0}")]
    Malformed(String),
    /// It is over [`MAX_HEADERS`] or [`MAX_HEAD_BYTES`].
    #[error("head too large: {0}")]
    TooLarge(String),
    /// A method, URI, status, header name or value that HTTP does not allow.
    #[error("invalid head: {0}")]
    Invalid(String),
}

impl From<capnp::Error> for HeadError {
    fn from(e: capnp::Error) -> Self {
        HeadError::Malformed(e.to_string())
    }
}

/// Whether `name` is a hop-by-hop header that a proxy must not forward.
pub(crate) fn is_hop_by_hop(name: &HeaderName) -> bool {
    matches!(
        name.as_str(),
        "connection"
            | "keep-alive"
            | "proxy-connection"
            | "proxy-authenticate"
            | "proxy-authorization"
            | "te"
            | "trailer"
            | "transfer-encoding"
            | "upgrade"
    )
}

fn forwarded(headers: &HeaderMap) -> impl Iterator<Item = (&HeaderName, &HeaderValue)> {
    headers.iter().filter(|(name, _)| !is_hop_by_hop(name))
}

fn write_headers(headers: &HeaderMap, mut list: capnp::struct_list::Builder<'_, header::Owned>) {
    for (i, (name, value)) in forwarded(headers).enumerate() {
        let mut h = list.reborrow().get(i as u32);
        h.set_name(name.as_str());
        h.set_value(value.as_bytes());
    }
}

fn headers_size(headers: &HeaderMap) -> usize {
    forwarded(headers)
        .map(|(name, value)| name.as_str().len() + value.len())
        .sum()
}

/// Bytes of a request head as [`read_request_head`] counts them against
/// [`MAX_HEAD_BYTES`]: check before sending, since a peer refuses more.
pub(crate) fn request_head_size(parts: &http::request::Parts) -> usize {
    parts.method.as_str().len() + parts.uri.to_string().len() + headers_size(&parts.headers)
}

/// Bytes of a response head as [`read_response_head`] counts them.
pub(crate) fn response_head_size(parts: &http::response::Parts) -> usize {
    headers_size(&parts.headers)
}

fn header_count(headers: &HeaderMap) -> u32 {
    u32::try_from(forwarded(headers).count()).unwrap_or(u32::MAX)
}

/// Writes a request head.
pub(crate) fn write_request_head(parts: &http::request::Parts, mut b: request_head::Builder<'_>) {
    b.set_method(parts.method.as_str());
    let uri = parts.uri.to_string();
    b.set_uri(uri.as_str());
    write_headers(&parts.headers, b.init_headers(header_count(&parts.headers)));
}

/// Writes a response head.
pub(crate) fn write_response_head(
    parts: &http::response::Parts,
    mut b: response_head::Builder<'_>,
) {
    b.set_status(parts.status.as_u16());
    write_headers(&parts.headers, b.init_headers(header_count(&parts.headers)));
}

struct Budget(usize);

impl Budget {
    fn take(&mut self, n: usize) -> Result<(), HeadError> {
        self.0 = self.0.checked_sub(n).ok_or_else(|| {
            HeadError::TooLarge(format!(
                "over {MAX_HEAD_BYTES} bytes of method, URI and headers"
            ))
        })?;
        Ok(())
    }
}

fn read_headers(
    list: capnp::struct_list::Reader<'_, header::Owned>,
    budget: &mut Budget,
) -> Result<HeaderMap, HeadError> {
    if list.len() as usize > MAX_HEADERS {
        return Err(HeadError::TooLarge(format!(
            "{} headers (at most {MAX_HEADERS})",
            list.len()
        )));
    }
    let mut headers = HeaderMap::with_capacity(list.len() as usize);
    for h in list.iter() {
        let name = h.get_name()?;
        let value = h.get_value()?;
        budget.take(name.len() + value.len())?;
        let name = HeaderName::from_bytes(name.as_bytes())
            .map_err(|e| HeadError::Invalid(format!("header name: {e}")))?;
        if is_hop_by_hop(&name) {
            continue;
        }
        let value = HeaderValue::from_bytes(value)
            .map_err(|e| HeadError::Invalid(format!("value of {name}: {e}")))?;
        headers.append(name, value);
    }
    Ok(headers)
}

/// Reads a request head from a peer into the parts of an HTTP request.
pub(crate) fn read_request_head(
    r: request_head::Reader<'_>,
) -> Result<http::request::Parts, HeadError> {
    let mut budget = Budget(MAX_HEAD_BYTES);
    let method = r.get_method()?;
    let uri = r.get_uri()?;
    budget.take(method.len() + uri.len())?;
    let method = Method::from_bytes(method.as_bytes())
        .map_err(|e| HeadError::Invalid(format!("method: {e}")))?;
    let uri = Uri::try_from(uri.as_bytes()).map_err(|e| HeadError::Invalid(format!("URI: {e}")))?;
    let headers = read_headers(r.get_headers()?, &mut budget)?;
    let (mut parts, ()) = http::Request::new(()).into_parts();
    parts.method = method;
    parts.uri = uri;
    parts.headers = headers;
    Ok(parts)
}

/// Reads a response head from a peer into the parts of an HTTP response.
pub(crate) fn read_response_head(
    r: response_head::Reader<'_>,
) -> Result<http::response::Parts, HeadError> {
    let mut budget = Budget(MAX_HEAD_BYTES);
    let status = StatusCode::from_u16(r.get_status())
        .map_err(|e| HeadError::Invalid(format!("status: {e}")))?;
    let headers = read_headers(r.get_headers()?, &mut budget)?;
    let (mut parts, ()) = http::Response::new(()).into_parts();
    parts.status = status;
    parts.headers = headers;
    Ok(parts)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_heads_round_trip_without_hop_by_hop_headers() {
        let (parts, ()) = http::Request::builder()
            .method("PUT")
            .uri("/upload?x=1")
            .header("content-type", "application/octet-stream")
            .header("x-bin", HeaderValue::from_bytes(b"\xffraw").unwrap())
            .header("x-multi", "a")
            .header("x-multi", "b")
            .header("cdn-loop", "edge-cdn; v=1, hearth")
            .header("connection", "keep-alive")
            .header("transfer-encoding", "chunked")
            .body(())
            .unwrap()
            .into_parts();
        let mut message = capnp::message::Builder::new_default();
        write_request_head(&parts, message.init_root());
        let back = read_request_head(message.get_root_as_reader().unwrap()).unwrap();
        assert_eq!(back.method, Method::PUT);
        assert_eq!(back.uri, "/upload?x=1");
        assert_eq!(back.headers["x-bin"].as_bytes(), b"\xffraw");
        assert_eq!(back.headers.get_all("x-multi").iter().count(), 2);
        // hearth's loop mark crosses the hop as it came (hearth_runtime::flow).
        assert_eq!(back.headers["cdn-loop"], "edge-cdn; v=1, hearth");
        assert!(back.headers.get("connection").is_none());
        assert!(back.headers.get("transfer-encoding").is_none());
    }

    #[test]
    fn response_heads_round_trip() {
        let (parts, ()) = http::Response::builder()
            .status(418)
            .header("x-served-by", "home")
            .body(())
            .unwrap()
            .into_parts();
        let mut message = capnp::message::Builder::new_default();
        write_response_head(&parts, message.init_root());
        let back = read_response_head(message.get_root_as_reader().unwrap()).unwrap();
        assert_eq!(back.status, StatusCode::IM_A_TEAPOT);
        assert_eq!(back.headers["x-served-by"], "home");
    }

    #[test]
    fn invalid_or_oversized_heads_are_rejected() {
        let mut message = capnp::message::Builder::new_default();
        {
            let mut b: request_head::Builder = message.init_root();
            b.set_method("GET");
            b.set_uri("/");
            let mut h = b.init_headers(1);
            h.reborrow().get(0).set_name("bad name");
            h.get(0).set_value(b"v");
        }
        assert!(matches!(
            read_request_head(message.get_root_as_reader().unwrap()),
            Err(HeadError::Invalid(_))
        ));

        let mut message = capnp::message::Builder::new_default();
        {
            let mut b: request_head::Builder = message.init_root();
            b.set_method("GET");
            b.set_uri("/");
            let mut h = b.init_headers(2);
            let big = vec![b'a'; MAX_HEAD_BYTES / 2 + 1];
            for i in 0..2 {
                h.reborrow().get(i).set_name("x-big");
                h.reborrow().get(i).set_value(&big);
            }
        }
        assert!(matches!(
            read_request_head(message.get_root_as_reader().unwrap()),
            Err(HeadError::TooLarge(_))
        ));

        let mut message = capnp::message::Builder::new_default();
        message
            .init_root::<response_head::Builder>()
            .set_status(1000);
        assert!(matches!(
            read_response_head(message.get_root_as_reader().unwrap()),
            Err(HeadError::Invalid(_))
        ));
    }
}
