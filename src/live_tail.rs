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
//!
//! **Memory is bounded in bytes** ([`hearth_runtime::outbound::live_tail`]'s
//! `TailBudget`, the config's `[live_tail]`): each event, this node's own
//! or a member's JSON, is charged to the watcher's queue budget and the
//! node's until its bytes have been written to the watcher's connection
//! (the charge rides in the frame). A member's event that finds no room
//! waits (the member's own queue fills meanwhile, and it drops and counts
//! there); this node holds at most one more event per member in transit.

use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use hearth_runtime::body::{Body, BoxError};
use hearth_runtime::outbound::live_tail::RequestEvent;
use hearth_runtime::outbound::live_tail::{Charge, QueueBudget, StatusFilter, Subscription};
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
    let sub = node
        .runtime()
        .live_tail()
        .subscribe(script_id, filter, sample);
    let remote = cluster.then(|| peers(node, script_id, status.unwrap_or(""), sample, &sub));
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
/// event JSON, each charged to `sub`'s budgets (`None` for a node outside
/// a cluster). Each member's part ends when it leaves or drains; all end
/// when the receiver is dropped.
fn peers(
    node: &Node,
    script_id: &str,
    status: &str,
    sample: f64,
    sub: &Subscription,
) -> Option<mpsc::Receiver<(String, Charge)>> {
    let (rpc, ring) = (node.rpc()?, node.ring()?);
    let (tx, rx) = mpsc::channel(256);
    for member in ring.members() {
        if member.id.as_str() == node.id() {
            continue;
        }
        let mut from = rpc.tail(member, script_id, status, sample);
        let (tx, budget) = (tx.clone(), sub.budget());
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    // The reader left: drop `from`, so the member's sink
                    // fails at its next event or keepalive.
                    _ = tx.closed() => break,
                    json = from.recv() => match json {
                        Some(json) => {
                            if !forward(&tx, &budget, json).await {
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

/// Passes a member's event on once the watcher's budgets have room for
/// it (one that never fits is dropped and counted); `false` once the
/// reader is gone.
async fn forward(tx: &mpsc::Sender<(String, Charge)>, budget: &QueueBudget, json: String) -> bool {
    let charge = tokio::select! {
        _ = tx.closed() => return false,
        charge = budget.charge(json.len()) => charge,
    };
    match charge {
        Some(charge) => tx.send((json, charge)).await.is_ok(),
        None => true,
    }
}

/// What a tail stream says next.
enum Item {
    /// A request this node served, and its charge.
    Event(RequestEvent, Charge),
    /// A request another member served, as its JSON, and its charge.
    Peer(String, Charge),
    /// Nothing for a while; how many events this node dropped so far.
    Keepalive(u64),
}

/// This node's events of `sub` (and, with `peers`, the other members'),
/// with a [`Item::Keepalive`] after `keepalive` of quiet, until the node
/// drains.
fn items(
    node: Node,
    sub: Subscription,
    peers: Option<mpsc::Receiver<(String, Charge)>>,
    keepalive: Duration,
) -> futures::stream::BoxStream<'static, Item> {
    struct State {
        node: Node,
        sub: Subscription,
        peers: Option<mpsc::Receiver<(String, Charge)>>,
        idle: Duration,
        keepalive: Duration,
    }
    enum Next {
        Local(Option<(RequestEvent, Charge)>),
        Quiet,
        Peer(Option<(String, Charge)>),
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
                Next::Local(Some((mut e, charge))) => {
                    s.idle = Duration::ZERO;
                    if e.node.is_empty() {
                        e.node = s.node.id().to_string();
                    }
                    return Some((Item::Event(e, charge), s));
                }
                Next::Local(None) => return None,
                Next::Peer(Some((json, charge))) => return Some((Item::Peer(json, charge), s)),
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
            Item::Event(e, _) => serde_json::to_string(&e).unwrap_or_default(),
            Item::Peer(json, _) => json,
            Item::Keepalive(_) => String::new(),
        })
        .boxed()
}

/// The body: a first comment naming the node, then events (this node's
/// and, with `peers`, the other members') and keepalives until the node
/// drains.
fn event_stream(
    node: Node,
    sub: Subscription,
    peers: Option<mpsc::Receiver<(String, Charge)>>,
) -> Body {
    use http_body_util::BodyExt;
    let hello = format!(": hearth tail of {} on {}\n\n", sub.script_id(), node.id());
    let first = futures::stream::once(async move { Ok::<_, BoxError>(frame(hello, None)) });
    let rest = items(node, sub, peers, KEEPALIVE).map(|item| {
        Ok(match item {
            Item::Event(e, charge) => {
                let json = serde_json::to_string(&e).unwrap_or_default();
                frame(format!("data: {json}\n\n"), Some(charge))
            }
            Item::Peer(json, charge) => frame(format!("data: {json}\n\n"), Some(charge)),
            Item::Keepalive(dropped) => frame(format!(":keepalive dropped={dropped}\n\n"), None),
        })
    });
    http_body_util::StreamBody::new(first.chain(rest)).boxed_unsync()
}

/// A frame's bytes and the charge they hold against the live tail's
/// budgets, given back when the connection has written (and dropped)
/// them.
struct Charged {
    text: String,
    _charge: Option<Charge>,
}

impl AsRef<[u8]> for Charged {
    fn as_ref(&self) -> &[u8] {
        self.text.as_bytes()
    }
}

fn frame(text: String, charge: Option<Charge>) -> hyper::body::Frame<Bytes> {
    hyper::body::Frame::data(Bytes::from_owner(Charged {
        text,
        _charge: charge,
    }))
}
