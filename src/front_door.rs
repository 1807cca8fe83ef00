//! The front door: how a request from outside finds its Worker.
//!
//! A request names its Worker by the first label of the host it is
//! addressed to ([`request_host`], [`script_id_from_host`]):
//! `hello.example.com` is Worker `hello`. [`front_door`] hands it to
//! [`Node::handle`], which decides where it is served (here, or at the
//! Worker's home) and in which role. Anything that names no Worker gets a
//! 404 with a clear body. [`spawn_listeners`] runs a node's front doors
//! (plain HTTP/1.1 and HTTPS with HTTP/2) and its admin API (plain HTTP,
//! or HTTPS only when the node has an admin certificate) on their
//! listeners ([`crate::listener`]).

use std::sync::Arc;

use hearth_runtime::body::Body;
use hearth_runtime::instances::pre_slot::ByteBudget;

use crate::node::{NODE_HEADER, Node};

/// The script ID a request is for: the first label of its Host, lowercased
/// (DNS names are case-insensitive: `HELLO.localhost:8080` -> `hello`). An
/// IP literal (`127.0.0.1`, `[::1]:8080`) names no Worker, so deploying a
/// Worker called `127` cannot capture traffic addressed by IP. A label that
/// no Worker can be named ([`valid_script_id`]) names none either, so junk
/// in a Host header never costs a shard hop.
///
/// [`valid_script_id`]: hearth_runtime::store::validate::valid_script_id
pub fn script_id_from_host(host: &str) -> Option<String> {
    if host.starts_with('[') {
        return None; // an IPv6 literal
    }
    let host = host.split(':').next()?;
    if host.parse::<std::net::Ipv4Addr>().is_ok() {
        return None;
    }
    let (label, rest) = host.split_once('.')?;
    let id = label.to_ascii_lowercase();
    (!rest.is_empty() && hearth_runtime::store::validate::valid_script_id(&id)).then_some(id)
}

/// The listeners of one node.
pub struct Listeners {
    /// Plain HTTP/1.1 Worker traffic.
    pub http: tokio::net::TcpListener,
    /// HTTPS Worker traffic (HTTP/2 or HTTP/1.1 by ALPN), with SNI prewarm.
    pub https: Option<(tokio::net::TcpListener, crate::https::TlsFrontDoor)>,
    /// The admin API.
    pub admin: tokio::net::TcpListener,
    /// The admin API's TLS, if it is served over HTTPS (then only HTTPS:
    /// a plain HTTP request gets its connection closed).
    pub admin_tls: Option<crate::https::TlsFrontDoor>,
}

/// Serves `node`'s front doors (plain HTTP, and HTTPS if given) and its
/// admin API (with `access`), all under `limits`, until `stop` turns
/// true; the front doors then drain their in-flight requests (within the
/// drain timeout), and the admin API stops once they have. Await every
/// returned task for the whole drain.
pub fn spawn_listeners(
    node: &Node,
    listeners: Listeners,
    access: crate::admin::AdminAccess,
    limits: crate::listener::ServeLimits,
    stop: tokio::sync::watch::Receiver<bool>,
) -> Vec<tokio::task::JoinHandle<()>> {
    let stopped = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|s| *s).await;
    };
    // A clustered node serves its front doors on its RPC threads, where
    // forwards and Workers run too (see `RpcNode::run_on_thread`).
    let runner = node.rpc().map(|rpc| {
        let rpc = rpc.clone();
        Arc::new(move |work| rpc.run_on_thread(work)) as crate::listener::Runner
    });
    // One budget for every front door's pre-slot bytes.
    let pre_slot = ByteBudget::new(limits.max_pre_slot_bytes, "this node");
    let front = |listener, tls| {
        let n = node.clone();
        tokio::spawn(crate::listener::serve(
            listener,
            limits,
            pre_slot.clone(),
            move |req, _| {
                let n = n.clone();
                async move { front_door(n, req).await }
            },
            stopped(stop.clone()),
            runner.clone(),
            tls,
        ))
    };
    let mut tasks = vec![front(listeners.http, None)];
    if let Some((listener, door)) = listeners.https {
        let n = node.clone();
        let tls = crate::listener::TlsListener {
            door,
            // Prewarms run on this (multi-threaded) runtime, not on the RPC
            // thread doing the handshake: they overlap it instead of
            // waiting for it to yield.
            on_sni: Arc::new({
                let rt = tokio::runtime::Handle::current();
                move |sni: &str| {
                    let _in_rt = rt.enter();
                    n.prewarm_hint(sni)
                }
            }),
        };
        tasks.push(front(listener, Some(tls)));
    }
    // The admin API stops last, once the front doors have drained, so
    // `/readyz` says "draining" (and `/metrics` counts) while they do.
    let (admin_stop, admin_stopped) = tokio::sync::watch::channel(false);
    let fronts = tokio::spawn(async move {
        for task in tasks {
            let _ = task.await;
        }
        let _ = admin_stop.send(true);
    });
    let n = node.clone();
    let admin = tokio::spawn(crate::listener::serve(
        listeners.admin,
        limits,
        ByteBudget::new(limits.max_pre_slot_bytes, "the admin API"),
        move |req, _| {
            let (n, a) = (n.clone(), access.clone());
            async move { crate::admin::handle(n, a, req).await }
        },
        stopped(admin_stopped),
        None,
        listeners
            .admin_tls
            .map(|door| crate::listener::TlsListener {
                door,
                // The admin API prewarms nothing.
                on_sni: Arc::new(|_: &str| {}),
            }),
    ));
    vec![fronts, admin]
}

/// The host a request is addressed to: the authority of an absolute-form
/// target (RFC 9112 §3.2.2: it overrides `Host`; HTTP/2's `:authority`
/// arrives the same way), else the `Host` header. The guest sees the same
/// authority, so routing and the Worker agree.
pub fn request_host<B>(req: &http::Request<B>) -> Option<String> {
    if let Some(a) = req.uri().authority() {
        return Some(a.host().to_owned());
    }
    req.headers()
        .get(http::header::HOST)
        .and_then(|h| h.to_str().ok())
        .map(str::to_owned)
}

/// Routes a front-door request to its Worker by the first label of its
/// host ([`request_host`]), after dropping every `x-hearth-*` header the
/// client sent (only the host sets those). Every answer names the node that gave it
/// (`x-hearth-node`): the serving node's, or this node's for what it
/// produced itself (a 404, a 502 after a failed hop).
pub async fn front_door(node: Node, mut req: http::Request<Body>) -> http::Response<Body> {
    // Only the host sets `x-hearth-*` request headers (a nested callee's
    // trust level, its caller, its depth): a client's are forgeries.
    hearth_runtime::flow::strip_host_headers(req.headers_mut());
    let mut resp = match request_host(&req).as_deref().and_then(script_id_from_host) {
        Some(id) => node.handle(&id, req).await,
        None => hearth_runtime::body::text_response(
            http::StatusCode::NOT_FOUND,
            "no Worker named: address a Worker as http://<script-id>.<domain>/ (e.g. hello.localhost)\n",
        ),
    };
    if !resp.headers().contains_key(NODE_HEADER)
        && let Ok(v) = http::HeaderValue::from_str(node.id())
    {
        resp.headers_mut().insert(NODE_HEADER, v);
    }
    resp
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn script_id_is_first_host_label() {
        let id = |h: &str| script_id_from_host(h);
        assert_eq!(id("hello.localhost:8080").as_deref(), Some("hello"));
        assert_eq!(id("a.b.example.com").as_deref(), Some("a"));
        assert_eq!(id("localhost:8080"), None);
        assert_eq!(id(".x"), None);
        // Labels no Worker can be named route nowhere.
        assert_eq!(id("ⷐ[.x"), None);
        assert_eq!(id("under_score.x"), None);
        assert_eq!(id("-x.example"), None);
    }

    #[test]
    fn an_absolute_form_target_overrides_host() {
        let req = http::Request::get("http://Echo.localhost:8080/x")
            .header(http::header::HOST, "hello.localhost")
            .body(())
            .expect("request");
        let host = request_host(&req).expect("host");
        assert_eq!(script_id_from_host(&host).as_deref(), Some("echo"));
        let req = http::Request::get("/x")
            .header(http::header::HOST, "hello.localhost:8080")
            .body(())
            .expect("request");
        let host = request_host(&req).expect("host");
        assert_eq!(script_id_from_host(&host).as_deref(), Some("hello"));
        let req = http::Request::get("http://127.0.0.1/")
            .header(http::header::HOST, "hello.localhost")
            .body(())
            .expect("request");
        assert_eq!(
            request_host(&req).as_deref().and_then(script_id_from_host),
            None
        );
    }

    #[test]
    fn host_is_case_insensitive_and_an_ip_literal_names_no_worker() {
        let id = |h: &str| script_id_from_host(h);
        assert_eq!(id("HELLO.localhost").as_deref(), Some("hello"));
        assert_eq!(id("Hello.Example.COM:8080").as_deref(), Some("hello"));
        assert_eq!(id("127.0.0.1"), None);
        assert_eq!(id("127.0.0.1:8080"), None);
        assert_eq!(id("[::1]:8080"), None);
        assert_eq!(id("10.1.2.3"), None);
    }
}
