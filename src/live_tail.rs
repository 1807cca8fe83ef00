//! `GET /v1/scripts/{id}/tail`: a node's live tail of one Worker as
//! server-sent events (`text/event-stream`), what `hearth tail` reads.
//!
//! # The model
//!
//! The stream is one node's view: each request of the Worker that
//! finishes on this node while the stream is open is one event
//! ([`hearth_runtime::outbound::live_tail`]: filtered by `status=`, sampled by
//! `sample=` and by the node itself under load), written as one
//! `data: <JSON RequestEvent>` line and a blank line. A comment line
//! `:keepalive dropped=N` comes every [`KEEPALIVE`] so proxies keep the
//! connection and the client learns of events its slow reading lost (also
//! in each event's `dropped`). The stream ends when the client goes away
//! (the subscription is dropped with the body) or the node drains.
//!
//! **A cluster's tail is gathered by the node asked**: with the default
//! `scope=cluster`, the node opens the same tail on every other member of
//! its ring over the cluster's own RPC connections (`ShardServer.tail`,
//! mutual TLS: only members can ask), and merges their events into its
//! stream; each event names the node that served it. So `hearth tail`
//! needs one node's admin URL. A member that joins after the stream opened
//! is not included (open the tail again); one that leaves or drains ends
//! its part. `scope=node` streams only this node's requests (what
//! `hearth tail` asks each node for when it is given several `--admin`
//! URLs). Peers send an empty keepalive every [`PEER_KEEPALIVE`] when
//! quiet, so a member notices a gatherer that went away.

use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use hearth_runtime::body::{Body, BoxError};
use hearth_runtime::outbound::live_tail::RequestEvent;
use hearth_runtime::outbound::live_tail::{StatusFilter, Subscription};
use http::StatusCode;
use tokio::sync::mpsc;

use crate::node::Node;

/// How often a stream with no events sends a `:keepalive` comment.
pub const KEEPALIVE: Duration = Duration::from_secs(15);

/// How often a member streaming its tail to a peer sends an empty
/// keepalive event when quiet.
pub const PEER_KEEPALIVE: Duration = Duration::from_secs(2);

/// How often an idle stream checks whether the node drains.
const CHECK: Duration = Duration::from_millis(500);

/// The answer to `GET /v1/scripts/{script_id}/tail?status=..&sample=..`:
/// a 400 that says why for a bad parameter, else the event stream.
pub fn response(
    node: &Node,
    script_id: &str,
    status: Option<&str>,
    sample: Option<&str>,
    scope: Option<&str>,
) -> http::Response<Body> {
    let text = hearth_runtime::body::text_response;
    let filter = match status.map(str::parse::<StatusFilter>).transpose() {
        Ok(f) => f.unwrap_or_default(),
        Err(e) => return text(StatusCode::BAD_REQUEST, format!("{e}\n")),
    };
    let sample = match sample
        .map(hearth_runtime::outbound::live_tail::parse_sample_rate)
        .transpose()
    {
        Ok(r) => r.unwrap_or(1.0),
        Err(e) => return text(StatusCode::BAD_REQUEST, format!("{e}\n")),
    };
    let cluster = match scope {
        None | Some("cluster") => true,
        Some("node") => false,
        Some(other) => {
            return text(
                StatusCode::BAD_REQUEST,
                format!("scope={other}: expected cluster or node\n"),
            );
        }
    };
    let remote = cluster.then(|| peers(node, script_id, status.unwrap_or(""), sample));
    let sub = node
        .runtime()
        .live_tail()
        .subscribe(script_id, filter, sample);
    let body = event_stream(node.clone(), sub, remote.flatten());
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

/// The other members' tails of `script_id`, merged into one channel of
/// event JSON (`None` for a node outside a cluster). Each member's part
/// ends when it leaves or drains; all end when the receiver is dropped.
fn peers(
    node: &Node,
    script_id: &str,
    status: &str,
    sample: f64,
) -> Option<mpsc::Receiver<String>> {
    let (rpc, ring) = (node.rpc()?, node.ring()?);
    let (tx, rx) = mpsc::channel(256);
    for member in ring.members() {
        if member.id.as_str() == node.id() {
            continue;
        }
        let mut from = rpc.tail(member, script_id, status, sample);
        let tx = tx.clone();
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    // The reader left: drop `from`, so the member's sink
                    // fails at its next event or keepalive.
                    _ = tx.closed() => break,
                    json = from.recv() => match json {
                        Some(json) => {
                            if tx.send(json).await.is_err() {
                                break;
                            }
                        }
                        None => break,
                    },
                }
            }
        });
    }
    Some(rx)
}

/// What a tail stream says next.
enum Item {
    /// A request this node served.
    Event(RequestEvent),
    /// A request another member served, as its JSON.
    Peer(String),
    /// Nothing for a while; how many events this node dropped so far.
    Keepalive(u64),
}

/// This node's events of `sub` (and, with `peers`, the other members'),
/// with a [`Item::Keepalive`] after `keepalive` of quiet, until the node
/// drains.
fn items(
    node: Node,
    sub: Subscription,
    peers: Option<mpsc::Receiver<String>>,
    keepalive: Duration,
) -> futures::stream::BoxStream<'static, Item> {
    struct State {
        node: Node,
        sub: Subscription,
        peers: Option<mpsc::Receiver<String>>,
        idle: Duration,
        keepalive: Duration,
    }
    enum Next {
        Local(Option<RequestEvent>),
        Quiet,
        Peer(Option<String>),
    }
    let state = State {
        node,
        sub,
        peers,
        idle: Duration::ZERO,
        keepalive,
    };
    futures::stream::unfold(state, |mut s| async move {
        loop {
            if s.node.is_draining() {
                return None;
            }
            let next = {
                let peer = async {
                    match s.peers.as_mut() {
                        Some(rx) => rx.recv().await,
                        None => std::future::pending().await,
                    }
                };
                tokio::select! {
                    e = tokio::time::timeout(CHECK, s.sub.next()) => match e {
                        Ok(e) => Next::Local(e),
                        Err(_) => Next::Quiet,
                    },
                    p = peer => Next::Peer(p),
                }
            };
            match next {
                Next::Local(Some(mut e)) => {
                    s.idle = Duration::ZERO;
                    if e.node.is_empty() {
                        e.node = s.node.id().to_string();
                    }
                    return Some((Item::Event(e), s));
                }
                Next::Local(None) => return None,
                Next::Peer(Some(json)) => return Some((Item::Peer(json), s)),
                // Every member's part ended: this node's own goes on.
                Next::Peer(None) => s.peers = None,
                Next::Quiet => {
                    s.idle += CHECK;
                    if s.idle >= s.keepalive {
                        s.idle = Duration::ZERO;
                        let dropped = s.sub.dropped();
                        return Some((Item::Keepalive(dropped), s));
                    }
                }
            }
        }
    })
    .boxed()
}

/// This node's tail for a peer (`ShardServer.tail`, see
/// [`crate::node`]'s `HostedWorkers`): each event as JSON, an empty string
/// as a keepalive.
pub(crate) fn for_peer(
    node: Node,
    sub: Subscription,
) -> futures::stream::BoxStream<'static, String> {
    items(node, sub, None, PEER_KEEPALIVE)
        .map(|item| match item {
            Item::Event(e) => serde_json::to_string(&e).unwrap_or_default(),
            Item::Peer(json) => json,
            Item::Keepalive(_) => String::new(),
        })
        .boxed()
}

/// The body: a first comment naming the node, then events (this node's
/// and, with `peers`, the other members') and keepalives until the node
/// drains.
fn event_stream(node: Node, sub: Subscription, peers: Option<mpsc::Receiver<String>>) -> Body {
    use http_body_util::BodyExt;
    let hello = format!(": hearth tail of {} on {}\n\n", sub.script_id(), node.id());
    let first = futures::stream::once(async move { Ok::<_, BoxError>(frame(hello)) });
    let rest = items(node, sub, peers, KEEPALIVE).map(|item| {
        Ok(frame(match item {
            Item::Event(e) => {
                let json = serde_json::to_string(&e).unwrap_or_default();
                format!("data: {json}\n\n")
            }
            Item::Peer(json) => format!("data: {json}\n\n"),
            Item::Keepalive(dropped) => format!(":keepalive dropped={dropped}\n\n"),
        }))
    });
    http_body_util::StreamBody::new(first.chain(rest)).boxed_unsync()
}

fn frame(text: String) -> hyper::body::Frame<Bytes> {
    hyper::body::Frame::data(Bytes::from(text))
}
