//! The HTTP listener every door of a node runs on: the Worker front door
//! (plain and TLS) and the admin API. One [`serve`] loop holds what a
//! hostile or slow client must not be able to break: connection caps per
//! listener and per peer ([`ServeLimits`]; a peer is an IPv4 address or an
//! IPv6 /64), a deadline for the request head and the TLS handshake, an
//! idle close, a write timeout, HTTP/2 by ALPN with a stream cap, the same
//! deadlines and a stall watch on HTTP/2 (`h2_watch`), a bound on the request
//! bytes a connection and the listener buffer before their requests take
//! slots ([`hearth_runtime::instances::pre_slot`]), and a bounded graceful drain.
//!
//! A node serves many connections, each a file descriptor, and opens
//! artifact files beside them; [`raise_fd_limit`] lifts the process's soft
//! limit on open files to its hard limit at start, so the caps here are
//! reached before `accept` fails.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hearth_runtime::body::{self, Body};
use hearth_runtime::instances::pre_slot::{ByteBudget, PreSlotBudget};
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;

/// Runs a connection's setup on another thread's runtime (see [`serve`]);
/// `false` if that is no longer possible.
pub type Runner = Arc<dyn Fn(Box<dyn FnOnce() + Send>) -> bool + Send + Sync>;

mod h2_watch;

/// How long a client may take to send its request head, by default
/// ([`ServeLimits::header_read_timeout`]).
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);

/// What one listener lets clients hold, and how long it drains. A client
/// over a cap gets a short 503 with `retry-after` and is closed; nobody
/// else is affected.
#[derive(Debug, Clone, Copy)]
pub struct ServeLimits {
    /// Connections open at once on the listener (default 4096).
    pub max_connections: usize,
    /// Connections open at once from one peer (default 256): an IPv4
    /// address, or an IPv6 /64 prefix, since one host or network is handed
    /// a whole /64 (as the RPC handshake gate counts,
    /// [`hearth_sharding::handshake_gate`]).
    pub max_per_peer: usize,
    /// How long a client may take to send its request head, and how long
    /// a connection may sit idle before it is closed: HTTP/1.1 between
    /// requests, HTTP/2 while no stream is open (also before the client's
    /// preface), and the TLS handshake (default 10 s,
    /// [`HEADER_READ_TIMEOUT`]; HTTP/1.1 answers say so in `Keep-Alive`).
    pub header_read_timeout: Duration,
    /// HTTP/2 keep-alive: a PING this long after the last frame from the
    /// client, and the connection closed if it is not answered within as
    /// long again (default 10 s), so a peer that vanished with streams
    /// open holds nothing.
    pub h2_keep_alive: Duration,
    /// Request body bytes the requests of one connection may hold at once
    /// before they take their slots (default 1 MiB: 16 requests'
    /// `buffer_before_slot` of 64 KiB; an HTTP/1.1 connection carries one
    /// request at a time and never reaches it). A request whose bytes would
    /// pass it gets a 503 with `retry-after`; the others go on.
    pub max_pre_slot_bytes_per_connection: usize,
    /// The same over every connection of the node's front doors together
    /// (default 64 MiB; [`crate::front_door::spawn_listeners`] shares one
    /// budget between the plain and the HTTPS listener): the node's bound
    /// on memory that clients fill before any Worker limit applies.
    pub max_pre_slot_bytes: usize,
    /// The receive window an HTTP/2 connection grants its client, for the
    /// connection and for each stream (default [`H2_MIN_WINDOW`], 64 KiB
    /// less one byte, the protocol's own initial window, as nginx's
    /// `http2_body_preread_size`): the request body bytes the client may
    /// send before any of them is read. Each HTTP/2 connection reserves it
    /// from both pre-slot budgets for as long as it is open, so the
    /// budgets bound what clients fill on HTTP/2 too; a connection the
    /// node's budget has no room for is closed before it is served. At
    /// least [`H2_MIN_WINDOW`], at most
    /// [`ServeLimits::max_pre_slot_bytes_per_connection`]
    /// ([`ServeLimits::check`]).
    pub h2_window: u32,
    /// A response write that makes no progress for this long closes the
    /// connection (default 30 s): a client that stops reading holds
    /// nothing. On HTTP/2 this includes a client that never grants
    /// flow-control window (`h2_watch`).
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
            header_read_timeout: HEADER_READ_TIMEOUT,
            h2_keep_alive: Duration::from_secs(10),
            max_pre_slot_bytes_per_connection: 1 << 20,
            max_pre_slot_bytes: 64 << 20,
            h2_window: H2_MIN_WINDOW,
            write_timeout: Duration::from_secs(30),
            drain_timeout: Duration::from_secs(30),
        }
    }
}

/// HTTP/2's initial flow-control window (RFC 9113 §6.9.2): a connection's
/// cannot be smaller, so it is the least [`ServeLimits::h2_window`].
pub const H2_MIN_WINDOW: u32 = 65_535;

/// Limits that cannot work together.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ServeLimitsError {
    /// The HTTP/2 window is under the protocol's minimum, over its
    /// maximum, or over the per-connection pre-slot budget it is reserved
    /// from (so no HTTP/2 connection could be served).
    #[error(
        "h2_window = {window} bytes: it must be at least {H2_MIN_WINDOW} (HTTP/2's initial window), \
         at most 2147483647, and at most max_pre_slot_bytes_per_connection ({per_connection} bytes), \
         which every HTTP/2 connection reserves it from"
    )]
    H2Window {
        /// The window asked for.
        window: u64,
        /// The per-connection budget.
        per_connection: usize,
    },
}

impl ServeLimits {
    /// Checks that the limits can work together (see [`ServeLimitsError`]).
    pub fn check(&self) -> Result<(), ServeLimitsError> {
        let w = self.h2_window;
        if w < H2_MIN_WINDOW
            || w > i32::MAX as u32
            || w as usize > self.max_pre_slot_bytes_per_connection
        {
            return Err(ServeLimitsError::H2Window {
                window: u64::from(w),
                per_connection: self.max_pre_slot_bytes_per_connection,
            });
        }
        Ok(())
    }
}

/// Open connections, in all and per peer (an IPv4 address or an IPv6 /64).
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
        let peer = hearth_sharding::handshake_gate::source_of(peer);
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
/// [`ServeLimits::header_read_timeout`] (in whole seconds, at least 1).
fn keep_alive_value(idle: Duration) -> http::HeaderValue {
    http::HeaderValue::from_str(&format!("timeout={}", idle.as_secs().max(1)))
        .unwrap_or_else(|_| http::HeaderValue::from_static("timeout=10"))
}

/// Raises this process's soft limit on open files to its hard limit and
/// returns the limit now in force. Every connection is a file descriptor,
/// and so is every artifact a cold start opens; at the common soft default
/// of 1024, `accept` and artifact loads would fail long before the
/// connection caps are reached.
pub fn raise_fd_limit() -> std::io::Result<u64> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit only writes the struct we own and pass.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    if lim.rlim_cur < lim.rlim_max {
        let want = libc::rlimit {
            rlim_cur: lim.rlim_max,
            rlim_max: lim.rlim_max,
        };
        // SAFETY: setrlimit only reads the struct we pass.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &want) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        lim = want;
    }
    Ok(lim.rlim_cur)
}

/// HTTP/2 streams one connection may have open at once.
pub const MAX_H2_STREAMS: u32 = 128;

/// Serves one accepted connection: the TLS handshake if the listener has
/// one, then HTTP/1.1 or h2 (by ALPN) until the connection closes or the
/// node drains (`watcher`). Response writes that stall past
/// [`ServeLimits::write_timeout`] close it. Each request carries the
/// pre-slot byte budgets of this connection and of `listener_budget`.
async fn serve_connection<H, F>(
    stream: tokio::net::TcpStream,
    peer: SocketAddr,
    limits: ServeLimits,
    listener_budget: Arc<ByteBudget>,
    handler: H,
    tls: Option<TlsListener>,
    watcher: hyper_util::server::graceful::Watcher,
) where
    H: Fn(http::Request<Body>, SocketAddr) -> F + Clone + Send + Sync + 'static,
    F: Future<Output = http::Response<Body>> + Send + 'static,
{
    let mut io = tokio_io_timeout::TimeoutStream::new(stream);
    io.set_write_timeout(Some(limits.write_timeout));
    let io = Box::pin(io);
    let budget = PreSlotBudget::new(vec![
        ByteBudget::new(limits.max_pre_slot_bytes_per_connection, "this connection"),
        listener_budget,
    ]);
    let connection_budget = budget.clone();
    let svc = service_fn(move |req: http::Request<hyper::body::Incoming>| {
        let h = handler.clone();
        let mut req = req.map(body::boxed);
        req.extensions_mut().insert(budget.clone());
        async move { Ok::<_, std::convert::Infallible>(h(req, peer).await) }
    });
    let idle = limits.header_read_timeout;
    let http1 = || {
        let mut b = hyper::server::conn::http1::Builder::new();
        b.timer(TokioTimer::new()).header_read_timeout(idle);
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
                    .or_insert(keep_alive_value(idle));
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
    let (stream, protocol) = match tokio::time::timeout(idle, handshake).await {
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
            // The receive window the client may fill before anything reads
            // it is held of the pre-slot budgets while the connection is
            // open; no room on the node, no connection.
            let _window = match connection_budget.reserve(limits.h2_window as usize) {
                Ok(w) => w,
                Err(e) => {
                    tracing::debug!(%peer, error = %e, "HTTP/2 connection refused: no room for its window");
                    return;
                }
            };
            // The connection's streams, watched for its idle close and for
            // a client that stops granting window (`h2_watch`).
            let watch = h2_watch::Watch::new();
            let svc2 = service_fn({
                let watch = watch.clone();
                move |req: http::Request<hyper::body::Incoming>| {
                    let stream = watch.open();
                    let call = hyper::service::Service::call(&svc, req);
                    async move {
                        let resp = call.await?;
                        Ok::<_, std::convert::Infallible>(
                            resp.map(|b| h2_watch::watched(b, stream)),
                        )
                    }
                }
            });
            let conn =
                hyper::server::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new())
                    .timer(TokioTimer::new())
                    .max_concurrent_streams(MAX_H2_STREAMS)
                    .initial_connection_window_size(limits.h2_window)
                    .initial_stream_window_size(limits.h2_window)
                    .keep_alive_interval(Some(limits.h2_keep_alive))
                    .keep_alive_timeout(limits.h2_keep_alive)
                    .serve_connection(io, svc2);
            tokio::select! {
                () = drive(watcher.watch(conn), peer) => {}
                why = watch.until_cut(idle, limits.write_timeout) => {
                    tracing::debug!(%peer, why, "HTTP/2 connection closed");
                }
            }
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
/// is slow to send its head is cut off after
/// [`ServeLimits::header_read_timeout`] (also the keep-alive idle timeout),
/// one that stops reading after [`ServeLimits::write_timeout`]; connections
/// over the caps are refused with a 503, and requests over the pre-slot
/// byte budgets get one. A client error affects only its own connection.
///
/// With `tls`, every connection is a TLS one ([`crate::https`]): its
/// handshake must finish within [`ServeLimits::header_read_timeout`], the
/// ClientHello's server name goes to [`TlsListener::on_sni`] first, and a
/// client that chose `h2` by ALPN is served HTTP/2 (at most
/// [`MAX_H2_STREAMS`] streams at once, the same idle close, PING
/// keep-alive, and the write timeout applied to flow control, see `h2_watch`),
/// any other HTTP/1.1.
///
/// With a `runner` (the node's RPC threads, see
/// [`hearth_sharding::rpc::RpcNode::run_on_thread`]), each connection is
/// served on the thread the runner picks instead of this runtime, so the
/// requests it carries are forwarded, and Workers run, without a hand-off
/// between threads.
pub async fn serve<H, F>(
    listener: TcpListener,
    limits: ServeLimits,
    pre_slot: Arc<ByteBudget>,
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
        let (handler, tls, pre_slot) = (handler.clone(), tls.clone(), pre_slot.clone());
        let connection =
            move |stream| serve_connection(stream, peer, limits, pre_slot, handler, tls, watcher);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_ipv6_slash_64_is_one_peer_and_ipv4_addresses_are_each_one() {
        let open = Arc::new(Mutex::new(Open::default()));
        let limits = ServeLimits {
            max_per_peer: 2,
            ..ServeLimits::default()
        };
        let ip = |s: &str| s.parse::<std::net::IpAddr>().expect("ip");
        let a = OpenSlot::take(&open, ip("2001:db8::1"), &limits).expect("first");
        let _b = OpenSlot::take(&open, ip("2001:db8::ffff:2"), &limits).expect("second");
        assert!(
            OpenSlot::take(&open, ip("2001:db8::3"), &limits).is_none(),
            "a third address of the same /64 is the same peer"
        );
        let _other = OpenSlot::take(&open, ip("2001:db8:0:1::1"), &limits).expect("another /64");
        let _v4 = OpenSlot::take(&open, ip("192.0.2.1"), &limits).expect("v4");
        let _v4b = OpenSlot::take(&open, ip("192.0.2.2"), &limits).expect("another v4");
        drop(a);
        let _c = OpenSlot::take(&open, ip("2001:db8::3"), &limits).expect("a place given back");
    }
}
