//! The HTTP listener every door of a node runs on: the Worker front door
//! (plain and TLS) and the admin API. One [`serve`] loop holds what a
//! hostile or slow client must not be able to break: connection caps per
//! listener and per peer ([`ServeLimits`]), a deadline for the request head
//! and the TLS handshake, a write timeout, HTTP/2 by ALPN with a stream cap,
//! and a bounded graceful drain.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hearth_runtime::body::{self, Body};
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;

/// Runs a connection's setup on another thread's runtime (see [`serve`]);
/// `false` if that is no longer possible.
pub type Runner = Arc<dyn Fn(Box<dyn FnOnce() + Send>) -> bool + Send + Sync>;

/// How long a client may take to send its request head.
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);

/// What one listener lets clients hold, and how long it drains. A client
/// over a cap gets a short 503 with `retry-after` and is closed; nobody
/// else is affected.
#[derive(Debug, Clone, Copy)]
pub struct ServeLimits {
    /// Connections open at once on the listener (default 4096).
    pub max_connections: usize,
    /// Connections open at once from one IP address (default 256).
    pub max_per_peer: usize,
    /// A response write that makes no progress for this long closes the
    /// connection (default 30 s): a client that stops reading holds
    /// nothing.
    pub write_timeout: Duration,
    /// After shutdown, in-flight requests get this long to finish before
    /// their connections are closed (default 30 s).
    pub drain_timeout: Duration,
}

impl Default for ServeLimits {
    fn default() -> Self {
        ServeLimits {
            max_connections: 4096,
            max_per_peer: 256,
            write_timeout: Duration::from_secs(30),
            drain_timeout: Duration::from_secs(30),
        }
    }
}

/// Open connections, in all and per peer address.
#[derive(Default)]
struct Open {
    total: usize,
    per_peer: std::collections::HashMap<std::net::IpAddr, usize>,
}

/// A connection's place in [`Open`], given back when it closes.
struct OpenSlot {
    open: Arc<Mutex<Open>>,
    peer: std::net::IpAddr,
}

impl OpenSlot {
    /// Takes a place for `peer` if both caps allow it.
    fn take(open: &Arc<Mutex<Open>>, peer: std::net::IpAddr, limits: &ServeLimits) -> Option<Self> {
        let mut o = open.lock().unwrap_or_else(|p| p.into_inner());
        let mine = o.per_peer.get(&peer).copied().unwrap_or(0);
        if o.total >= limits.max_connections || mine >= limits.max_per_peer {
            return None;
        }
        o.total += 1;
        o.per_peer.insert(peer, mine + 1);
        Some(OpenSlot {
            open: open.clone(),
            peer,
        })
    }
}

impl Drop for OpenSlot {
    fn drop(&mut self) {
        let mut o = self.open.lock().unwrap_or_else(|p| p.into_inner());
        o.total = o.total.saturating_sub(1);
        if let Some(n) = o.per_peer.get_mut(&self.peer) {
            *n -= 1;
            if *n == 0 {
                o.per_peer.remove(&self.peer);
            }
        }
    }
}

/// The whole answer to a connection over a cap.
const OVER_CAP: &[u8] = b"HTTP/1.1 503 Service Unavailable\r\nretry-after: 1\r\n\
content-type: text/plain; charset=utf-8\r\ncontent-length: 41\r\nconnection: close\r\n\r\n\
too many connections; retry in a second\r\n";

/// Answers a connection over the caps with [`OVER_CAP`] and closes it,
/// reading what the client sent first (for at most a second), so the close
/// does not reset the connection before the client has read the answer.
async fn refuse(mut stream: tokio::net::TcpStream) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let _ = tokio::time::timeout(Duration::from_secs(1), async {
        stream.write_all(OVER_CAP).await?;
        stream.shutdown().await?;
        let mut sink = [0u8; 4096];
        while stream.read(&mut sink).await? > 0 {}
        Ok::<_, std::io::Error>(())
    })
    .await;
}

/// TLS on a listener ([`serve`]): the front door's certificate, and what to
/// do with each ClientHello's server name (it must not block: it runs
/// before the handshake goes on).
#[derive(Clone)]
pub struct TlsListener {
    /// The certificate and protocols.
    pub door: crate::https::TlsFrontDoor,
    /// Called with the SNI of every ClientHello that has one.
    pub on_sni: Arc<dyn Fn(&str) + Send + Sync>,
}

/// The `Keep-Alive` value of HTTP/1.1 responses: the idle close,
/// [`HEADER_READ_TIMEOUT`].
fn keep_alive_value() -> http::HeaderValue {
    http::HeaderValue::from_str(&format!("timeout={}", HEADER_READ_TIMEOUT.as_secs()))
        .unwrap_or_else(|_| http::HeaderValue::from_static("timeout=10"))
}

/// HTTP/2 streams one connection may have open at once.
pub const MAX_H2_STREAMS: u32 = 128;

/// Serves one accepted connection: the TLS handshake if the listener has
/// one, then HTTP/1.1 or h2 (by ALPN) until the connection closes or the
/// node drains (`watcher`). Response writes that stall past
/// `write_timeout` close it.
async fn serve_connection<H, F>(
    stream: tokio::net::TcpStream,
    peer: SocketAddr,
    write_timeout: Duration,
    handler: H,
    tls: Option<TlsListener>,
    watcher: hyper_util::server::graceful::Watcher,
) where
    H: Fn(http::Request<Body>, SocketAddr) -> F + Clone + Send + Sync + 'static,
    F: Future<Output = http::Response<Body>> + Send + 'static,
{
    let mut io = tokio_io_timeout::TimeoutStream::new(stream);
    io.set_write_timeout(Some(write_timeout));
    let io = Box::pin(io);
    let svc = service_fn(move |req: http::Request<hyper::body::Incoming>| {
        let h = handler.clone();
        async move { Ok::<_, std::convert::Infallible>(h(req.map(body::boxed), peer).await) }
    });
    let http1 = || {
        let mut b = hyper::server::conn::http1::Builder::new();
        b.timer(TokioTimer::new())
            .header_read_timeout(HEADER_READ_TIMEOUT);
        b
    };
    // HTTP/1.1 responses announce the idle close (RFC 9112 has no
    // field for it, but `Keep-Alive: timeout=N` is what clients
    // read), so a client does not reuse a connection the node is
    // about to close. HTTP/2 forbids connection-specific fields.
    let svc1 = service_fn({
        let svc = svc.clone();
        move |req: http::Request<hyper::body::Incoming>| {
            let call = hyper::service::Service::call(&svc, req);
            async move {
                let mut resp = call.await?;
                resp.headers_mut()
                    .entry(http::header::HeaderName::from_static("keep-alive"))
                    .or_insert(keep_alive_value());
                Ok::<_, std::convert::Infallible>(resp)
            }
        }
    });
    let Some(tls) = tls else {
        let conn = http1().serve_connection(TokioIo::new(io), svc1);
        return drive(watcher.watch(conn), peer).await;
    };
    let on_sni = tls.on_sni.clone();
    let handshake = tls.door.accept(io, |sni| on_sni(sni));
    let (stream, protocol) = match tokio::time::timeout(HEADER_READ_TIMEOUT, handshake).await {
        Ok(Ok(accepted)) => accepted,
        Ok(Err(e)) => {
            tracing::debug!(%peer, error = %e, "TLS handshake failed");
            return;
        }
        Err(_) => {
            tracing::debug!(%peer, "TLS handshake timed out");
            return;
        }
    };
    let io = TokioIo::new(stream);
    match protocol {
        crate::https::Protocol::Http1 => {
            let conn = http1().serve_connection(io, svc1);
            drive(watcher.watch(conn), peer).await
        }
        crate::https::Protocol::Http2 => {
            let conn =
                hyper::server::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new())
                    .timer(TokioTimer::new())
                    .max_concurrent_streams(MAX_H2_STREAMS)
                    .serve_connection(io, svc);
            drive(watcher.watch(conn), peer).await
        }
    }
}

/// Starts `connection` on the runner's thread if there is one (this task
/// then holds the slot and aborts the connection at the drain deadline), or
/// in `conns` here. The slot is given back when the connection ends.
fn spawn_connection<C, Fut>(
    conns: &mut tokio::task::JoinSet<()>,
    runner: Option<&Runner>,
    stream: tokio::net::TcpStream,
    peer: SocketAddr,
    slot: OpenSlot,
    connection: C,
) where
    C: FnOnce(tokio::net::TcpStream) -> Fut + Send + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    let std_stream = match stream.into_std() {
        Ok(s) => s,
        Err(e) => {
            tracing::warn!(%peer, error = %e, "cannot serve a connection");
            return;
        }
    };
    let Some(runner) = runner else {
        match tokio::net::TcpStream::from_std(std_stream) {
            Ok(stream) => {
                let conn = connection(stream);
                conns.spawn(async move {
                    let _slot = slot;
                    conn.await;
                });
            }
            Err(e) => tracing::warn!(%peer, error = %e, "cannot serve a connection"),
        }
        return;
    };
    let (started, task) = tokio::sync::oneshot::channel();
    let work = Box::new(move || match tokio::net::TcpStream::from_std(std_stream) {
        Ok(stream) => {
            let _ = started.send(tokio::spawn(connection(stream)));
        }
        Err(e) => tracing::warn!(%peer, error = %e, "cannot serve a connection"),
    });
    if !runner(work) {
        tracing::debug!(%peer, "connection dropped: the node is shutting down");
        return;
    }
    conns.spawn(async move {
        let _slot = slot;
        if let Ok(task) = task.await {
            let _ = tokio_util::task::AbortOnDropHandle::new(task).await;
        }
    });
}

/// Drives one served connection to its end, logging how it ended.
async fn drive<C, E>(conn: C, peer: SocketAddr)
where
    C: Future<Output = Result<(), E>>,
    E: std::fmt::Display,
{
    if let Err(e) = conn.await {
        tracing::debug!(%peer, error = %e, "connection ended with an error");
    }
}

/// Serves HTTP/1.1 on `listener` with `handler` until `shutdown` resolves,
/// then drains: in-flight requests get [`ServeLimits::drain_timeout`] to
/// finish, and connections still open after it are closed. A client that
/// is slow to send its head is cut off after [`HEADER_READ_TIMEOUT`] (also
/// the keep-alive idle timeout), one that stops reading after
/// [`ServeLimits::write_timeout`]; connections over the caps are refused
/// with a 503. A client error affects only its own connection.
///
/// With `tls`, every connection is a TLS one ([`crate::https`]): its
/// handshake must finish within [`HEADER_READ_TIMEOUT`], the ClientHello's
/// server name goes to [`TlsListener::on_sni`] first, and a client that
/// chose `h2` by ALPN is served HTTP/2 (at most [`MAX_H2_STREAMS`] streams
/// at once), any other HTTP/1.1.
///
/// With a `runner` (the node's RPC threads, see
/// [`hearth_sharding::rpc::RpcNode::run_on_thread`]), each connection is
/// served on the thread the runner picks instead of this runtime, so the
/// requests it carries are forwarded, and Workers run, without a hand-off
/// between threads.
pub async fn serve<H, F>(
    listener: TcpListener,
    limits: ServeLimits,
    handler: H,
    shutdown: impl Future<Output = ()>,
    runner: Option<Runner>,
    tls: Option<TlsListener>,
) where
    H: Fn(http::Request<Body>, SocketAddr) -> F + Clone + Send + Sync + 'static,
    F: Future<Output = http::Response<Body>> + Send + 'static,
{
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    let open = Arc::new(Mutex::new(Open::default()));
    let mut conns = tokio::task::JoinSet::new();
    tokio::pin!(shutdown);
    loop {
        let (stream, peer) = tokio::select! {
            r = listener.accept() => match r {
                Ok(x) => x,
                Err(e) => {
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                }
            },
            _ = &mut shutdown => break,
        };
        while conns.try_join_next().is_some() {}
        let Some(slot) = OpenSlot::take(&open, peer.ip(), &limits) else {
            tracing::debug!(%peer, "connection refused: over the connection caps");
            conns.spawn(refuse(stream));
            continue;
        };
        let _ = stream.set_nodelay(true);
        let watcher = graceful.watcher();
        let (handler, tls) = (handler.clone(), tls.clone());
        let write_timeout = limits.write_timeout;
        let connection =
            move |stream| serve_connection(stream, peer, write_timeout, handler, tls, watcher);
        spawn_connection(&mut conns, runner.as_ref(), stream, peer, slot, connection);
    }
    drop(listener);
    if tokio::time::timeout(limits.drain_timeout, graceful.shutdown())
        .await
        .is_err()
    {
        tracing::warn!(
            open = conns.len(),
            "drain deadline passed; closing the connections still open"
        );
    }
    conns.shutdown().await;
}
