//! `hearth:js/fast-http`: a JS Worker's request head and its answer in one
//! host call each.
//!
//! The shim that runs a JS Worker on a reused instance (`sdk/js/shim.js`,
//! docs/js-reuse.md) used to read a request with about seven wasi:http calls
//! (method, scheme, authority, path, headers, their entries, a drop) and to
//! answer with about eight (`fields.from-list`, `new outgoing-response`,
//! `set-status-code`, `body`, `response-outparam.set`, a write, a drop,
//! `finish`). componentize-js's generated bindings spend 4–12 µs of
//! interpreted JS on every such call whatever it carries, ≈ 160 of the
//! ≈ 250 µs a request spent in the guest. The two functions here take the
//! very same wasi:http resources (the `with` mapping below makes them
//! wasmtime-wasi-http's own) and do that work on the host:
//!
//! * `request-head` reads the method, URL and headers through
//!   wasmtime-wasi-http's own `incoming-request` and `fields` methods and
//!   returns them as one string (its format is in `sdk/js/wit/world.wit`);
//!   a header value is decoded as the shim's `TextDecoder` decoded it.
//! * `respond` takes the header lines and the body in one list (the
//!   bindings lower a `string` with an interpreted loop over its characters,
//!   a list with one copy), builds the response and hands it to the
//!   outparam as
//!   `response-outparam.set` would, with the checks of the calls it
//!   replaces: each header through [`FieldMap::append`] (what
//!   `fields.from-list` does: invalid or forbidden names and values refused,
//!   at most one `content-length`, the map held to
//!   [`FIELD_SIZE_LIMIT`](crate::host::FIELD_SIZE_LIMIT)), the status as
//!   `set-status-code` takes it (100–999), a declared `content-length` that
//!   must be the body's (`outgoing-body` refuses a body of another length).
//!   The body may be at most
//!   [`OUTGOING_BODY_BYTES`](crate::host::OUTGOING_BODY_BYTES), what one
//!   outgoing body buffers on the wasi:http path: a guest can never park
//!   more of its memory in the host's response than that path allows; the
//!   shim writes a larger body through wasi:http's streams as before.
//!
//! A refusal is an `err` for the guest (the shim then throws, as a failed
//! wasi:http call made it throw), never a trap of the host's making; a
//! handle that is not one (or an outparam used twice) is the component
//! model's trap, as with wasi:http.

use std::convert::Infallible;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use wasmtime::component::Resource;
use wasmtime_wasi_http::p2::bindings::http::types::{
    self as wasi_types, HostFields, HostIncomingRequest as _, Method, Scheme,
};
use wasmtime_wasi_http::p2::types::{
    HostIncomingRequest, HostOutgoingResponse, HostResponseOutparam,
};
use wasmtime_wasi_http::{FieldMap, WasiHttpCtxView};

use crate::host::{FIELD_SIZE_LIMIT, OUTGOING_BODY_BYTES};

mod generated {
    wasmtime::component::bindgen!({
        path: "../sdk/js/wit",
        world: "hearth:js/worker",
        imports: { default: trappable },
        require_store_data_send: true,
        with: {
            "wasi:http": wasmtime_wasi_http::p2::bindings::http,
            "wasi:io": wasmtime_wasi::p2::bindings::io,
            "wasi:clocks": wasmtime_wasi::p2::bindings::clocks,
            "wasi:cli": wasmtime_wasi::p2::bindings::cli,
        },
    });
}

use generated::hearth::js::fast_http;

/// Adds `hearth:js/fast-http` to `linker`: the host's side of the two calls.
pub(crate) fn add_to_linker<T: wasmtime_wasi_http::WasiHttpView + 'static>(
    linker: &mut wasmtime::component::Linker<T>,
) -> wasmtime::Result<()> {
    fast_http::add_to_linker::<T, wasmtime_wasi_http::WasiHttp>(linker, T::http)
}

/// The separator of the lines of a request head and of a response's
/// headers: a byte no method, URL, header name or header value can hold
/// (`http` refuses control characters in all of them).
const LINE: char = '\n';

/// `bytes` as the shim's `new TextDecoder().decode(bytes)` gives them: a
/// leading byte-order mark dropped, U+FFFD for each invalid UTF-8 sequence
/// (Rust's lossy decoding replaces the same maximal subparts as the
/// WHATWG decoder).
fn decode_like_text_decoder(bytes: &[u8]) -> std::borrow::Cow<'_, str> {
    let bytes = bytes.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(bytes);
    String::from_utf8_lossy(bytes)
}

/// A method's name as the request line has it.
fn method_name(method: &Method) -> &str {
    match method {
        Method::Get => "GET",
        Method::Head => "HEAD",
        Method::Post => "POST",
        Method::Put => "PUT",
        Method::Delete => "DELETE",
        Method::Connect => "CONNECT",
        Method::Options => "OPTIONS",
        Method::Trace => "TRACE",
        Method::Patch => "PATCH",
        Method::Other(other) => other,
    }
}

/// `respond`'s one list split into its head (UTF-8 header lines) and its
/// body, which keeps the list's allocation (no copy).
fn split_head(head_and_body: Vec<u8>, head_length: u32) -> Result<(String, Bytes), String> {
    let all = Bytes::from(head_and_body);
    let at = usize::try_from(head_length)
        .ok()
        .filter(|n| *n <= all.len())
        .ok_or_else(|| {
            format!(
                "a head of {head_length} bytes in a list of {} bytes",
                all.len()
            )
        })?;
    let head = std::str::from_utf8(&all[..at])
        .map_err(|e| format!("the header lines are not UTF-8: {e}"))?
        .to_owned();
    Ok((head, all.slice(at..)))
}

/// The response `respond` describes, or why it cannot be sent.
fn build_response(
    hooks: &mut dyn wasmtime_wasi_http::WasiHttpHooks,
    status: u16,
    headers: &str,
    body: Bytes,
) -> Result<http::Response<wasmtime_wasi_http::p2::body::HyperOutgoingBody>, String> {
    if body.len() > OUTGOING_BODY_BYTES {
        return Err(format!(
            "a body of {} bytes: respond takes at most {OUTGOING_BODY_BYTES}, write a larger one \
             through wasi:http's outgoing-body",
            body.len()
        ));
    }
    let status = http::StatusCode::from_u16(status)
        .map_err(|_| format!("status {status} is not an HTTP status (100-999)"))?;
    let mut fields = FieldMap::new_mutable(FIELD_SIZE_LIMIT);
    if !headers.is_empty() {
        let mut lines = headers.split(LINE);
        while let Some(name) = lines.next() {
            let Some(value) = lines.next() else {
                return Err(format!("header {name:?} has no value line"));
            };
            fields
                .append(hooks, name.to_owned(), value.as_bytes().to_vec())
                .map_err(|e| format!("header {name:?}: {e}"))?;
        }
    }
    // `outgoing-response.body` refuses a response whose content-length is
    // not digits, and the body's stream one of another length.
    if let Some(declared) = fields.get(http::header::CONTENT_LENGTH) {
        let matches = declared
            .to_str()
            .ok()
            .filter(|v| !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit()))
            .and_then(|v| v.parse::<u64>().ok())
            .is_some_and(|n| n == body.len() as u64);
        if !matches {
            return Err(format!(
                "content-length {declared:?} is not the body's length, {}",
                body.len()
            ));
        }
    }
    fields.set_immutable();
    let body = Full::new(body)
        .map_err(|never: Infallible| match never {})
        .boxed_unsync();
    let response = HostOutgoingResponse {
        status,
        headers: fields,
        body: Some(body),
    };
    http::Response::try_from(response).map_err(|e| e.to_string())
}

impl fast_http::Host for WasiHttpCtxView<'_> {
    fn request_head(&mut self, request: Resource<HostIncomingRequest>) -> wasmtime::Result<String> {
        let borrow = || Resource::<HostIncomingRequest>::new_borrow(request.rep());
        let method = self.method(borrow())?;
        let scheme = match self.scheme(borrow())? {
            Some(Scheme::Https) => "https",
            _ => "http",
        };
        let authority = self.authority(borrow())?.filter(|a| !a.is_empty());
        let path = self.path_with_query(borrow())?.filter(|p| !p.is_empty());
        let mut head = String::with_capacity(256);
        head.push_str(method_name(&method));
        head.push(LINE);
        head.push_str(scheme);
        head.push_str("://");
        head.push_str(authority.as_deref().unwrap_or("localhost"));
        head.push_str(path.as_deref().unwrap_or("/"));
        let fields = wasi_types::HostIncomingRequest::headers(self, borrow())?;
        for (name, value) in self.table.get(&fields)?.iter() {
            head.push(LINE);
            head.push_str(name.as_str());
            head.push(LINE);
            head.push_str(&decode_like_text_decoder(value.as_bytes()));
        }
        HostFields::drop(self, fields)?;
        Ok(head)
    }

    fn respond(
        &mut self,
        out: Resource<HostResponseOutparam>,
        status: u16,
        head_length: u32,
        head_and_body: Vec<u8>,
    ) -> wasmtime::Result<Result<(), String>> {
        let out = self.table.delete(out)?;
        match split_head(head_and_body, head_length)
            .and_then(|(headers, body)| build_response(self.hooks, status, &headers, body))
        {
            Ok(response) => {
                (out.send)(Ok(response));
                Ok(Ok(()))
            }
            // `out` is dropped unused: the request gets no response from
            // this guest, as when a wasi:http call failed before `set`.
            Err(e) => Ok(Err(e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_values_decode_as_the_shim_s_text_decoder_did() {
        assert_eq!(decode_like_text_decoder(b"caf\xC3\xA9"), "café");
        assert_eq!(decode_like_text_decoder(b"caf\xE9"), "caf\u{FFFD}");
        assert_eq!(decode_like_text_decoder(b"\xEF\xBB\xBFbom"), "bom");
        // One U+FFFD per maximal invalid subpart, as WHATWG's decoder.
        assert_eq!(decode_like_text_decoder(b"a\xF0\x9F\x98b"), "a\u{FFFD}b");
        assert_eq!(
            decode_like_text_decoder(b"a\xC0\x80b"),
            "a\u{FFFD}\u{FFFD}b"
        );
    }

    fn response(
        status: u16,
        headers: &str,
        body: &[u8],
    ) -> Result<http::Response<wasmtime_wasi_http::p2::body::HyperOutgoingBody>, String> {
        // The hooks every instance has (wasi:http's forbidden headers).
        let mut hooks = crate::outgoing::Outbound::default();
        build_response(&mut hooks, status, headers, Bytes::copy_from_slice(body))
    }

    #[test]
    fn a_response_keeps_its_status_headers_in_order_and_body_length() {
        let r = response(201, "x-a\n1\nx-a\n2\nx-b\ncaf\u{e9}", b"\0\xFF").expect("valid");
        assert_eq!(r.status(), 201);
        let xa: Vec<_> = r.headers().get_all("x-a").iter().collect();
        assert_eq!(xa, ["1", "2"]);
        assert_eq!(r.headers()["x-b"].as_bytes(), "café".as_bytes());
        assert!(response(204, "", b"").is_ok());
        assert!(response(200, "content-length\n2", b"ab").is_ok());
    }

    #[test]
    fn respond_s_list_splits_into_head_and_body_and_refuses_a_bad_head() {
        let (head, body) = split_head(b"x-a\ncaf\xC3\xA9\0\xFF".to_vec(), 9).expect("valid");
        assert_eq!(head, "x-a\ncaf\u{e9}");
        assert_eq!(&body[..], b"\0\xFF");
        let (head, body) = split_head(b"body".to_vec(), 0).expect("no headers");
        assert_eq!((head.as_str(), &body[..]), ("", &b"body"[..]));
        // A head longer than the list, or not UTF-8, is refused.
        assert!(split_head(b"x-a\n1".to_vec(), 5).is_ok());
        assert!(split_head(b"x-a\n1".to_vec(), 6).is_err());
        assert!(split_head(b"x-a\n\xE9".to_vec(), 5).is_err());
        // Cut inside a UTF-8 sequence.
        assert!(split_head("x-a\n\u{e9}".as_bytes().to_vec(), 5).is_err());
    }

    #[test]
    fn what_wasi_http_refuses_respond_refuses() {
        for (status, headers, body) in [
            (99, "", &b""[..]),
            (1000, "", b""),
            (200, "bad name\nx", b""),
            (200, "x-a\na\u{7f}b", b""),
            (200, "x-a\nline\rbreak", b""),
            (200, "x-a", b""),
            (200, "host\nexample.com", b""),
            (200, "proxy-authorization\nx", b""),
            (200, "http2-settings\nx", b""),
            (200, "transfer-encoding\nchunked", b""),
            (200, "content-length\n3", b"ab"),
            (200, "content-length\n+2", b"ab"),
            (200, "content-length\n2\ncontent-length\n2", b"ab"),
        ] {
            assert!(
                response(status, headers, body).is_err(),
                "{status} {headers:?} was accepted"
            );
        }
        let big = format!("x-a\n{}", "v".repeat(FIELD_SIZE_LIMIT));
        assert!(
            response(200, &big, b"").is_err(),
            "over the field size limit"
        );
        assert!(response(200, "", &vec![0; OUTGOING_BODY_BYTES]).is_ok());
        assert!(response(200, "", &vec![0; OUTGOING_BODY_BYTES + 1]).is_err());
    }
}
