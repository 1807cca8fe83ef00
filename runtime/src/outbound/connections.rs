//! How many connections to origins a node keeps open, and how it makes
//! room: the connection caps of [`crate::outbound::egress`].
//!
//! # The model
//!
//! The node's client for origins pools connections (one pool for every
//! Worker, so a connection one fetch opened can serve the next fetch of
//! the same origin). Two caps bound what that pool can hold:
//!
//! * **Per node, open connections** (`[egress] max_connections`): every
//!   connection takes a permit before the node resolves the host or dials
//!   it, and gives it back when its socket closes, idle ones included. So
//!   the node never has more sockets to origins open than the cap,
//!   however many host names its Workers use.
//! * **Per Worker, connections in use** (`[egress] max_connections_per_worker`,
//!   enforced by [`crate::outbound::egress`]): a fetch holds one of its
//!   Worker's permits from the moment it is sent until its response body
//!   ends or is dropped, whichever of the Worker's instances made it. A
//!   Worker can therefore keep at most that many of the node's connections
//!   busy; the rest are idle, and an idle connection is closed whenever
//!   someone needs its permit.
//!
//! **Making room.** A connection is *busy* from the moment the client
//! writes a request on it until the response's body is done, and *idle*
//! otherwise (in the pool, waiting for reuse; a new connection counts as
//! idle only after [`NEW_GRACE`], so the request it was opened for gets
//! to use it). When a fetch needs a new connection and the node is at its
//! cap, the connection idle the longest is closed (its reader is woken and
//! sees the end of the stream, which the client treats as the origin
//! closing an idle connection) and its permit goes to the fetch; if no
//! connection is idle, the fetch waits for one to become idle or to close.
//! Each close is counted (`hearth_egress_idle_closed_total`).
//!
//! **Waiting.** A fetch waits for a permit, its Worker's and then the
//! node's, at most `[egress] connect_timeout` (and never past its
//! request's deadline); then it fails with the wasi:http error code
//! `connection-limit-reached`, counted as the `connection_limit` outcome.
//!
//! Idle connections also close on their own after `[egress] idle_timeout`,
//! and at most [`EGRESS_IDLE_PER_HOST`] stay idle per origin.
//!
//! [`EGRESS_IDLE_PER_HOST`]: crate::limits::EGRESS_IDLE_PER_HOST

use std::collections::HashMap;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use hyper::rt::{Read, ReadBufCursor, Write};
use hyper_util::client::legacy::connect::{Connected, Connection};
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};

use crate::outbound::egress::SubrequestCounters;

/// How long a new connection is reserved for the request it was opened
/// for before it can be closed to make room (the request is written
/// within a scheduling round of the connection's handshake).
pub(crate) const NEW_GRACE: Duration = Duration::from_millis(250);

/// How often a fetch waiting for room looks again for an idle connection
/// to close (besides being woken when one turns idle).
const RECHECK: Duration = Duration::from_millis(100);

const BUSY: u8 = 0;
const IDLE: u8 = 1;
const CLOSING: u8 = 2;

/// No permit came within the wait: the node is at its connection cap and
/// none of its connections went idle.
#[derive(Debug, thiserror::Error)]
#[error("the node has {cap} connections to origins open, none idle, for {waited:?}")]
pub(crate) struct NodeFull {
    cap: usize,
    waited: Duration,
}

/// One open connection's shared state: what the client's I/O sees, and
/// what a fetch looking for room looks at.
#[derive(Debug)]
pub(crate) struct Conn {
    state: AtomicU8,
    /// When it went idle, in milliseconds since the registry's epoch.
    idle_since: AtomicU64,
    /// The reader's waker, to wake it when the connection is closed.
    reader: Mutex<Option<Waker>>,
    registry: Weak<Connections>,
}

impl Conn {
    /// Marks the connection idle (its response is done): it may be closed
    /// to make room from now on.
    pub(crate) fn idle(&self) {
        let Some(registry) = self.registry.upgrade() else {
            return;
        };
        self.idle_since.store(registry.now_ms(), Ordering::Relaxed);
        if self
            .state
            .compare_exchange(BUSY, IDLE, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
        {
            registry.became_idle.notify_waiters();
        }
    }

    /// Closes it if it is idle since `before` (milliseconds): its reader
    /// sees the end of the stream next. Whether it was closed.
    fn close_if_idle(&self, before: u64) -> bool {
        if self.idle_since.load(Ordering::Relaxed) > before
            || self
                .state
                .compare_exchange(IDLE, CLOSING, Ordering::AcqRel, Ordering::Relaxed)
                .is_err()
        {
            return false;
        }
        let waker = self.reader.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(w) = waker {
            w.wake();
        }
        true
    }
}

/// The handle the connector puts in every response's extensions (hyper-util
/// copies a connection's `Connected::extra` into each response), so the
/// fetch that got the response can mark the connection idle when its body
/// is done.
#[derive(Debug, Clone)]
pub(crate) struct ConnHandle(pub(crate) Arc<Conn>);

/// The node's open connections to origins and the permits of its cap.
pub(crate) struct Connections {
    cap: usize,
    permits: Arc<Semaphore>,
    open: Mutex<HashMap<u64, Weak<Conn>>>,
    next_id: AtomicU64,
    epoch: Instant,
    became_idle: Notify,
    /// How long a fetch waits for a permit.
    wait: Duration,
    /// The `hearth_egress_*` gauges and counters.
    counts: Arc<SubrequestCounters>,
}

impl Connections {
    /// A registry of at most `cap` connections (at least one), whose
    /// fetches wait at most `wait` for room.
    pub(crate) fn new(cap: usize, wait: Duration, counts: Arc<SubrequestCounters>) -> Arc<Self> {
        let cap = cap.max(1);
        Arc::new(Connections {
            cap,
            permits: Arc::new(Semaphore::new(cap)),
            open: Mutex::new(HashMap::new()),
            next_id: AtomicU64::new(0),
            epoch: Instant::now(),
            became_idle: Notify::new(),
            wait,
            counts,
        })
    }

    fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }

    /// A permit for one more connection: at once if the node is under its
    /// cap, else once an idle connection closed to make room (or any
    /// closed), within the wait.
    pub(crate) async fn permit(self: &Arc<Self>) -> Result<OwnedSemaphorePermit, NodeFull> {
        if let Ok(p) = self.permits.clone().try_acquire_owned() {
            return Ok(p);
        }
        let started = tokio::time::Instant::now();
        let give_up = tokio::time::sleep_until(started + self.wait);
        // One place in the semaphore's queue for the whole wait (first
        // come, first served among waiting fetches).
        let acquire = self.permits.clone().acquire_owned();
        tokio::pin!(give_up, acquire);
        // The connection this fetch closed and waits for, if any: no other
        // is closed for it while that one is still closing.
        let mut closing: Option<Weak<Conn>> = None;
        loop {
            let pending = closing
                .as_ref()
                .and_then(Weak::upgrade)
                .is_some_and(|c| c.state.load(Ordering::Acquire) == CLOSING);
            if !pending {
                closing = self.close_oldest_idle();
            }
            let turned_idle = self.became_idle.notified();
            tokio::select! {
                p = &mut acquire => {
                    return p.map_err(|_| NodeFull { cap: self.cap, waited: started.elapsed() });
                }
                _ = turned_idle => {}
                _ = tokio::time::sleep(RECHECK) => {}
                _ = &mut give_up => {
                    return Err(NodeFull { cap: self.cap, waited: self.wait });
                }
            }
        }
    }

    /// Closes the connection idle the longest (past its grace), if any.
    fn close_oldest_idle(&self) -> Option<Weak<Conn>> {
        let now = self.now_ms();
        let mut idle: Vec<(u64, Arc<Conn>)> = {
            let open = self.open.lock().unwrap_or_else(|p| p.into_inner());
            open.values()
                .filter_map(Weak::upgrade)
                .filter(|c| c.state.load(Ordering::Acquire) == IDLE)
                .map(|c| (c.idle_since.load(Ordering::Relaxed), c))
                .filter(|(since, _)| *since <= now)
                .collect()
        };
        idle.sort_by_key(|(since, _)| *since);
        let (_, conn) = idle.into_iter().find(|(_, c)| c.close_if_idle(now))?;
        self.counts.idle_closed.fetch_add(1, Ordering::Relaxed);
        tracing::debug!(
            cap = self.cap,
            "egress: an idle connection closed to make room"
        );
        Some(Arc::downgrade(&conn))
    }

    /// Registers a connection that holds `permit` for as long as `io`
    /// lives.
    pub(crate) fn wrap<T>(self: &Arc<Self>, io: T, permit: OwnedSemaphorePermit) -> Limited<T> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let conn = Arc::new(Conn {
            state: AtomicU8::new(IDLE),
            idle_since: AtomicU64::new(self.now_ms() + NEW_GRACE.as_millis() as u64),
            reader: Mutex::new(None),
            registry: Arc::downgrade(self),
        });
        self.open
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(id, Arc::downgrade(&conn));
        self.counts.open.fetch_add(1, Ordering::Relaxed);
        Limited {
            inner: io,
            conn,
            id,
            registry: self.clone(),
            _permit: permit,
        }
    }
}

/// A connection's I/O, counted against the node's cap while it lives (see
/// the module docs): reads see the end of the stream once it was closed to
/// make room; writes mark it busy.
pub(crate) struct Limited<T> {
    inner: T,
    conn: Arc<Conn>,
    id: u64,
    registry: Arc<Connections>,
    _permit: OwnedSemaphorePermit,
}

impl<T> Drop for Limited<T> {
    fn drop(&mut self) {
        self.registry
            .open
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&self.id);
        self.registry.counts.open.fetch_sub(1, Ordering::Relaxed);
    }
}

impl<T: Read + Unpin> Read for Limited<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: ReadBufCursor<'_>,
    ) -> Poll<io::Result<()>> {
        if self.conn.state.load(Ordering::Acquire) == CLOSING {
            // The end of the stream: the client closes an idle connection.
            return Poll::Ready(Ok(()));
        }
        {
            let mut reader = self.conn.reader.lock().unwrap_or_else(|p| p.into_inner());
            if !reader.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
                *reader = Some(cx.waker().clone());
            }
        }
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<T: Write + Unpin> Write for Limited<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        // A request goes out: busy, even if it was just picked to close
        // (its reader has not seen the end yet, or the client would not
        // write; the fetch that picked it waits for another).
        self.conn.state.store(BUSY, Ordering::Release);
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        self.conn.state.store(BUSY, Ordering::Release);
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }
}

impl<T: Connection> Connection for Limited<T> {
    fn connected(&self) -> Connected {
        self.inner.connected().extra(ConnHandle(self.conn.clone()))
    }
}

/// The error of a connector: boxed, as hyper-util takes it.
type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A connector that takes a node permit ([`Connections::permit`]) before
/// `inner` resolves and dials, and wraps what it opens so the permit is
/// held for as long as the connection lives.
#[derive(Clone)]
pub(crate) struct CappedConnector<S> {
    inner: S,
    conns: Arc<Connections>,
}

impl<S> CappedConnector<S> {
    pub(crate) fn new(inner: S, conns: Arc<Connections>) -> Self {
        CappedConnector { inner, conns }
    }
}

impl<S> tower_service::Service<http::Uri> for CappedConnector<S>
where
    S: tower_service::Service<http::Uri> + Clone + Send + 'static,
    S::Response: Send,
    S::Future: Send,
    S::Error: Into<BoxError>,
{
    type Response = Limited<S::Response>;
    type Error = BoxError;
    type Future =
        Pin<Box<dyn std::future::Future<Output = Result<Self::Response, BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, dst: http::Uri) -> Self::Future {
        // The inner connector is always ready (hyper-util's and
        // hyper-rustls's are), so a clone can be called.
        let mut inner = self.inner.clone();
        let conns = self.conns.clone();
        Box::pin(async move {
            let permit = conns.permit().await?;
            let io = inner.call(dst).await.map_err(Into::into)?;
            Ok(conns.wrap(io, permit))
        })
    }
}
