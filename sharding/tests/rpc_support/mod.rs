//! Shared by the `rpc_*` integration tests: real nodes on 127.0.0.1 with
//! mTLS, serving fake Workers.
#![allow(dead_code)]
// Test helpers: a panic is the failure report (clippy's allow-unwrap-in-tests
// covers #[test] functions only).
#![allow(clippy::unwrap_used)]

use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use futures::FutureExt;
use futures::future::BoxFuture;
use hearth_sharding::context_stack::{ContextFrame, ContextStack, TraceEvent};
use hearth_sharding::hosted_workers::{Body, BoxError, HostedWorkers};
use hearth_sharding::ring::Member;
use hearth_sharding::routing::{ROUTE_HEADER, Route};
use hearth_sharding::rpc::{Forwarded, RpcConfig, RpcNode, ServerHandle};
use hearth_sharding::tls::{NodeTls, generate_dev_pki};
use http_body_util::{BodyExt, StreamBody};
use tokio::sync::Notify;

/// How long the `block` Worker holds its thread.
pub(crate) const BLOCK: Duration = Duration::from_millis(800);

/// A generous guard so a broken test fails instead of hanging.
pub(crate) const GUARD: Duration = Duration::from_secs(60);

pub(crate) async fn guard<T>(what: &str, f: impl Future<Output = T>) -> T {
    match tokio::time::timeout(GUARD, f).await {
        Ok(v) => v,
        Err(_) => panic!("{what}: no result within {GUARD:?}"),
    }
}

/// A development cluster's certificates in a temporary directory.
pub(crate) struct Pki {
    pub dir: tempfile::TempDir,
}

impl Pki {
    pub(crate) fn new(nodes: &[&str]) -> Pki {
        let dir = tempfile::tempdir().unwrap();
        generate_dev_pki(dir.path(), nodes).unwrap();
        Pki { dir }
    }

    pub(crate) fn tls(&self, node: &str) -> NodeTls {
        NodeTls::load(self.dir.path(), node).unwrap()
    }
}

/// Fake Workers, by script ID:
/// * `echo`: 200, streams the request body back;
/// * `gate`: on a node with `hangs` set, waits until `release` (holding the
///   request) and then echoes; elsewhere echoes at once;
/// * `bighead`: answers with a 300 KiB header;
/// * `block`: counts as entered, then blocks the thread serving it for
///   [`BLOCK`] (a stuck home) and answers 200;
/// * `trace`: records the context stack it got, reports one trace event
///   through it, answers 200 `traced`.
///
/// Every response carries `x-served-by: <node name>`.
pub(crate) struct FakeWorkers {
    pub name: String,
    pub can_host: AtomicBool,
    pub hangs: AtomicBool,
    pub served: AtomicUsize,
    pub entered: Notify,
    pub entered_count: AtomicUsize,
    pub release: Notify,
    pub cancelled: AtomicUsize,
    pub contexts: Mutex<Vec<Vec<ContextFrame>>>,
}

impl FakeWorkers {
    pub(crate) fn new(name: &str) -> Arc<FakeWorkers> {
        Arc::new(FakeWorkers {
            name: name.to_string(),
            can_host: AtomicBool::new(true),
            hangs: AtomicBool::new(false),
            served: AtomicUsize::new(0),
            entered: Notify::new(),
            entered_count: AtomicUsize::new(0),
            release: Notify::new(),
            cancelled: AtomicUsize::new(0),
            contexts: Mutex::new(Vec::new()),
        })
    }

    /// Waits until `n` `gate` invocations have started here.
    pub(crate) async fn wait_entered(&self, n: usize) {
        guard("waiting for a gate invocation", async {
            loop {
                let notified = self.entered.notified();
                if self.entered_count.load(Ordering::SeqCst) >= n {
                    return;
                }
                notified.await;
            }
        })
        .await
    }
}

struct CancelGuard(Arc<FakeWorkers>, bool);

impl Drop for CancelGuard {
    fn drop(&mut self) {
        if !self.1 {
            self.0.cancelled.fetch_add(1, Ordering::SeqCst);
        }
    }
}

fn respond(name: &str, body: Body) -> http::Response<Body> {
    let mut response = http::Response::new(body);
    response
        .headers_mut()
        .insert("x-served-by", http::HeaderValue::from_str(name).unwrap());
    response
}

pub(crate) fn full(bytes: &'static [u8]) -> Body {
    http_body_util::Full::new(Bytes::from_static(bytes))
        .map_err(|never| match never {})
        .boxed_unsync()
}

/// The [`HostedWorkers`] a node is started with.
pub(crate) struct Fake(pub Arc<FakeWorkers>);

impl HostedWorkers for Fake {
    fn serve(
        &self,
        role: Route,
        script_id: &str,
        req: http::Request<Body>,
    ) -> BoxFuture<'static, http::Response<Body>> {
        let me = self.0.clone();
        let script = script_id.to_string();
        async move {
            me.served.fetch_add(1, Ordering::SeqCst);
            let mut response = match script.as_str() {
                "echo" => respond(&me.name, req.into_body()),
                "gate" => {
                    if me.hangs.load(Ordering::SeqCst) {
                        let mut cancel = CancelGuard(me.clone(), false);
                        let released = me.release.notified();
                        me.entered_count.fetch_add(1, Ordering::SeqCst);
                        me.entered.notify_waiters();
                        released.await;
                        cancel.1 = true;
                    }
                    respond(&me.name, req.into_body())
                }
                "block" => {
                    me.entered_count.fetch_add(1, Ordering::SeqCst);
                    me.entered.notify_waiters();
                    std::thread::sleep(BLOCK);
                    respond(&me.name, full(b"unblocked"))
                }
                "bighead" => {
                    let mut r = respond(&me.name, full(b"big"));
                    let big = "h".repeat(300 * 1024);
                    r.headers_mut()
                        .insert("x-big", http::HeaderValue::from_str(&big).unwrap());
                    r
                }
                "trace" => {
                    let stack = req
                        .extensions()
                        .get::<ContextStack>()
                        .cloned()
                        .unwrap_or_default();
                    me.contexts.lock().unwrap().push(stack.frames().to_vec());
                    let event = TraceEvent {
                        script_id: "trace".into(),
                        node: me.name.clone(),
                        timestamp_unix_ms: 1,
                        kind: "log".into(),
                        message: format!("hello from {}", me.name),
                    };
                    match stack.report_traces(vec![event]).await {
                        Ok(()) => respond(&me.name, full(b"traced")),
                        Err(e) => {
                            let mut r = respond(&me.name, full(b"trace report failed"));
                            *r.status_mut() = http::StatusCode::INTERNAL_SERVER_ERROR;
                            r.headers_mut().insert(
                                "x-error",
                                http::HeaderValue::from_str(&e.to_string()).unwrap(),
                            );
                            r
                        }
                    }
                }
                _ => {
                    let mut r = respond(&me.name, full(b"no such worker"));
                    *r.status_mut() = http::StatusCode::NOT_FOUND;
                    r
                }
            };
            // The role the request was served in, as the node would
            // report it (`x-hearth-route`).
            response
                .headers_mut()
                .insert(ROUTE_HEADER, role.header_value());
            response
        }
        .boxed()
    }

    fn is_warm(&self, _script_id: &str) -> bool {
        false
    }

    fn can_host(&self, _script_id: &str) -> bool {
        self.0.can_host.load(Ordering::SeqCst)
    }
}

/// A running node.
pub(crate) struct Node {
    pub rpc: RpcNode,
    pub addr: SocketAddr,
    /// The node as a ring names it: its ID (`name`) at `addr`.
    pub home: hearth_sharding::ring::Member,
    pub workers: Arc<FakeWorkers>,
    pub server: ServerHandle,
}

pub(crate) async fn start_node(pki: &Pki, name: &str, tweak: impl FnOnce(&mut RpcConfig)) -> Node {
    let workers = FakeWorkers::new(name);
    let mut config = RpcConfig::new(pki.tls(name));
    tweak(&mut config);
    let rpc = RpcNode::start(config, Arc::new(Fake(workers.clone()))).unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let server = rpc.serve(listener).unwrap();
    Node {
        addr: server.local_addr(),
        home: hearth_sharding::ring::Member::new(name, server.local_addr()),
        rpc,
        workers,
        server,
    }
}

/// Nodes `a` and `b` of a fresh development cluster, each with its config
/// tweaked; the certificates come too, to start more members.
pub(crate) async fn two_nodes(
    tweak_a: impl FnOnce(&mut RpcConfig),
    tweak_b: impl FnOnce(&mut RpcConfig),
) -> (Pki, Node, Node) {
    let pki = Pki::new(&["a", "b"]);
    let a = start_node(&pki, "a", tweak_a).await;
    let b = start_node(&pki, "b", tweak_b).await;
    (pki, a, b)
}

/// A node's config as [`RpcConfig::new`] makes it (for [`two_nodes`]).
pub(crate) fn as_is(_: &mut RpcConfig) {}

/// Forwards `body` from `from` to Worker `worker` (a POST of `/WORKER`) at
/// `home` with an empty context stack; fails the test if it gives no
/// result within [`GUARD`].
pub(crate) async fn forward(from: &Node, home: &Member, worker: &str, body: Body) -> Forwarded {
    let what = format!("forward to {worker} on {}", home.id.as_str());
    guard(
        &what,
        from.rpc.forward(
            home,
            worker,
            ContextStack::new(),
            request(&format!("/{worker}"), body),
        ),
    )
    .await
}

/// [`forward`] in a task of its own: a request left in flight while the
/// test does something else.
pub(crate) fn spawn_forward(
    from: &Node,
    home: &Member,
    worker: &str,
    body: Body,
) -> tokio::task::JoinHandle<Forwarded> {
    let (rpc, home, worker) = (from.rpc.clone(), home.clone(), worker.to_string());
    tokio::spawn(async move {
        rpc.forward(
            &home,
            &worker,
            ContextStack::new(),
            request(&format!("/{worker}"), body),
        )
        .await
    })
}

/// Deterministic, non-repeating-looking test data.
pub(crate) fn pattern(len: usize) -> Vec<u8> {
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}

/// A streaming body of `data` in `chunk`-byte frames.
pub(crate) fn streaming_body(data: Vec<u8>, chunk: usize) -> Body {
    let data = Bytes::from(data);
    let frames: Vec<Result<http_body::Frame<Bytes>, BoxError>> = (0..data.len())
        .step_by(chunk)
        .map(|i| {
            Ok(http_body::Frame::data(
                data.slice(i..(i + chunk).min(data.len())),
            ))
        })
        .collect();
    StreamBody::new(futures::stream::iter(frames)).boxed_unsync()
}

pub(crate) fn request(uri: &str, body: Body) -> http::Request<Body> {
    http::Request::builder()
        .method("POST")
        .uri(uri)
        .header("content-type", "application/octet-stream")
        .body(body)
        .unwrap()
}

pub(crate) async fn collect(body: Body) -> Result<Bytes, BoxError> {
    Ok(body.collect().await?.to_bytes())
}

/// The role the serving node was told to serve the request in (the fake
/// reports it in `x-hearth-route`, as the real node does).
pub(crate) fn served_as(response: &http::Response<Body>) -> String {
    response
        .headers()
        .get(ROUTE_HEADER)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string()
}

pub(crate) fn served_by(response: &http::Response<Body>) -> String {
    response
        .headers()
        .get("x-served-by")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string()
}

/// Polls `f` until it is true (a bounded wait for an asynchronous effect,
/// not a timing assertion).
pub(crate) async fn eventually(what: &str, mut f: impl FnMut() -> bool) {
    guard(what, async {
        while !f() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
}

/// Waits until `read` returns the same value twice, 100 ms apart.
pub(crate) async fn settled<T: PartialEq + Copy>(mut read: impl FnMut() -> T) -> T {
    guard("waiting for counters to settle", async {
        let mut last = read();
        loop {
            tokio::time::sleep(Duration::from_millis(100)).await;
            let now = read();
            if now == last {
                return now;
            }
            last = now;
        }
    })
    .await
}

/// Forwards `payload` from `from` to the echo Worker on `to` and asserts the
/// home served it and echoed it back intact.
pub(crate) async fn assert_echo_sharded(
    from: &Node,
    to: &Node,
    what: &str,
    payload: &[u8],
    chunk: usize,
) {
    let ok = guard(
        what,
        forward(
            from,
            &to.home,
            "echo",
            streaming_body(payload.to_vec(), chunk),
        ),
    )
    .await;
    assert_eq!(ok.outcome, hearth_sharding::rpc::ForwardOutcome::Sharded);
    assert_eq!(served_as(&ok.response), Route::Sharded.as_str());
    assert_eq!(
        &collect(ok.response.into_body()).await.unwrap()[..],
        payload
    );
}
