//! `GET /v1/scripts/{id}/tail`: a node's live tail of one Worker as
//! server-sent events (`text/event-stream`), what `hearth tail` reads.
//!
//! # The model
//!
//! The stream is one node's view: each request of the Worker that
//! finishes on this node while the stream is open is one event
//! ([`hearth_runtime::live_tail`]: filtered by `status=`, sampled by
//! `sample=` and by the node itself under load), written as one
//! `data: <JSON RequestEvent>` line and a blank line. A comment line
//! `:keepalive dropped=N` comes every [`KEEPALIVE`] so proxies keep the
//! connection and the client learns of events its slow reading lost (also
//! in each event's `dropped`). The stream ends when the client goes away
//! (the subscription is dropped with the body) or the node drains.
//!
//! **A cluster's tail is gathered by the client**: a node streams only its
//! own requests, and `hearth tail` opens one stream per node it is given
//! (`--admin`, repeatable), reads `GET /v1/ring` from each to name it and
//! to list the members it was not given, and merges the streams. A node
//! does not know its peers' admin addresses (membership carries only
//! their RPC address), so it cannot fan the tail out itself; a client
//! that reaches every node's admin API can.

use std::time::Duration;

use bytes::Bytes;
use hearth_runtime::body::{Body, BoxError};
use hearth_runtime::live_tail::{StatusFilter, Subscription};
use http::StatusCode;

use crate::node::Node;

/// How often a stream with no events sends a `:keepalive` comment.
pub const KEEPALIVE: Duration = Duration::from_secs(15);

/// How often an idle stream checks whether the node drains.
const CHECK: Duration = Duration::from_millis(500);

/// The answer to `GET /v1/scripts/{script_id}/tail?status=..&sample=..`:
/// a 400 that says why for a bad parameter, else the event stream.
pub fn response(
    node: &Node,
    script_id: &str,
    status: Option<&str>,
    sample: Option<&str>,
) -> http::Response<Body> {
    let text = hearth_runtime::body::text_response;
    let filter = match status.map(str::parse::<StatusFilter>).transpose() {
        Ok(f) => f.unwrap_or_default(),
        Err(e) => return text(StatusCode::BAD_REQUEST, format!("{e}\n")),
    };
    let sample = match sample
        .map(hearth_runtime::live_tail::parse_sample_rate)
        .transpose()
    {
        Ok(r) => r.unwrap_or(1.0),
        Err(e) => return text(StatusCode::BAD_REQUEST, format!("{e}\n")),
    };
    let sub = node
        .runtime()
        .live_tail()
        .subscribe(script_id, filter, sample);
    let body = event_stream(node.clone(), sub);
    let mut r = http::Response::new(body);
    let headers = r.headers_mut();
    headers.insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("text/event-stream"),
    );
    headers.insert(
        http::header::CACHE_CONTROL,
        http::HeaderValue::from_static("no-cache"),
    );
    r
}

/// The body: a first comment naming the node, then events and keepalives
/// until the node drains.
fn event_stream(node: Node, sub: Subscription) -> Body {
    use http_body_util::BodyExt;
    struct State {
        node: Node,
        sub: Subscription,
        hello: bool,
        idle: Duration,
    }
    let state = State {
        node,
        sub,
        hello: false,
        idle: Duration::ZERO,
    };
    let stream = futures::stream::unfold(state, |mut s| async move {
        if !s.hello {
            s.hello = true;
            let line = format!(
                ": hearth tail of {} on {}\n\n",
                s.sub.script_id(),
                s.node.id()
            );
            return Some((Ok::<_, BoxError>(frame(line)), s));
        }
        loop {
            if s.node.is_draining() {
                return None;
            }
            match tokio::time::timeout(CHECK, s.sub.next()).await {
                Ok(Some(mut e)) => {
                    s.idle = Duration::ZERO;
                    if e.node.is_empty() {
                        e.node = s.node.id().to_string();
                    }
                    let json = serde_json::to_string(&e).unwrap_or_default();
                    return Some((Ok(frame(format!("data: {json}\n\n"))), s));
                }
                Ok(None) => return None,
                Err(_) => {
                    s.idle += CHECK;
                    if s.idle >= KEEPALIVE {
                        s.idle = Duration::ZERO;
                        let line = format!(":keepalive dropped={}\n\n", s.sub.dropped());
                        return Some((Ok(frame(line)), s));
                    }
                }
            }
        }
    });
    http_body_util::StreamBody::new(stream).boxed_unsync()
}

fn frame(text: String) -> hyper::body::Frame<Bytes> {
    hyper::body::Frame::data(Bytes::from(text))
}
