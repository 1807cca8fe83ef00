//! The byte pipe under inter-node RPC: TCP, mutual TLS, a byte counter, and
//! a Cap'n Proto two-party network on top.
//!
//! ```text
//! capnp-rpc (two-party VatNetwork, message size limit)
//!   └ buffered writes (one TLS record per RPC message, not per segment)
//!     └ CountingStream (plaintext bytes each way, for stats and tests)
//!       └ rustls (TLS 1.3, client certificate required, see crate::tls)
//!         └ TCP (no Nagle delay)
//! ```
//!
//! Counting sits between TLS and Cap'n Proto, so the counters measure RPC
//! messages (framing included) and not TLS records or handshakes. Above the
//! network, every message is also tallied by kind ([`MessageCounts`]: calls,
//! returns, finishes, releases), which is how the tests check that a small
//! sharded request costs one call and one return.

use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use capnp::capability::Promise;
use capnp_rpc::rpc_twoparty_capnp::Side;
use capnp_rpc::twoparty::VatNetwork;
use capnp_rpc::{Connection, OutgoingMessage};
use tokio::io::{AsyncRead, AsyncWrite, BufWriter, ReadBuf};
use tokio::net::TcpStream;
use tokio_rustls::{TlsAcceptor, TlsConnector, TlsStream};
use tokio_util::compat::{TokioAsyncReadCompatExt, TokioAsyncWriteCompatExt};

/// Bytes and RPC messages moved through counted connections, each way.
#[derive(Debug, Default)]
pub struct WireCounters {
    sent: AtomicU64,
    received: AtomicU64,
    messages_sent: KindCounters,
    messages_received: KindCounters,
    unanswered_peak: AtomicU64,
    reads_paused: AtomicU64,
}

impl WireCounters {
    /// Bytes written so far.
    pub fn sent(&self) -> u64 {
        self.sent.load(Ordering::Relaxed)
    }

    /// Bytes read so far.
    pub fn received(&self) -> u64 {
        self.received.load(Ordering::Relaxed)
    }

    /// The most bytes of a peer's calls one connection held unanswered at
    /// once (see `Unanswered`).
    pub fn unanswered_peak(&self) -> u64 {
        self.unanswered_peak.load(Ordering::Relaxed)
    }

    /// Times a connection stopped reading because its peer's unanswered
    /// calls reached the limit.
    pub fn reads_paused(&self) -> u64 {
        self.reads_paused.load(Ordering::Relaxed)
    }

    /// RPC messages sent so far, by kind.
    pub fn messages_sent(&self) -> MessageCounts {
        self.messages_sent.snapshot()
    }

    /// RPC messages received so far, by kind.
    pub fn messages_received(&self) -> MessageCounts {
        self.messages_received.snapshot()
    }
}

/// Cap'n Proto RPC messages by kind (see `rpc.capnp`): what a request costs
/// on the wire, independent of how the bytes were batched into TLS records.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MessageCounts {
    /// `Call`: a method invocation.
    pub calls: u64,
    /// `Return`: a call's answer.
    pub returns: u64,
    /// `Finish`: the caller is done with an answer.
    pub finishes: u64,
    /// `Release`: a capability reference dropped.
    pub releases: u64,
    /// Everything else (`Bootstrap`, `Resolve`, `Disembargo`, `Abort`, ...).
    pub other: u64,
}

impl MessageCounts {
    /// All messages.
    pub fn total(&self) -> u64 {
        self.calls + self.returns + self.finishes + self.releases + self.other
    }

    /// The messages counted since `earlier` (a snapshot of the same counter).
    pub fn since(&self, earlier: &MessageCounts) -> MessageCounts {
        MessageCounts {
            calls: self.calls - earlier.calls,
            returns: self.returns - earlier.returns,
            finishes: self.finishes - earlier.finishes,
            releases: self.releases - earlier.releases,
            other: self.other - earlier.other,
        }
    }
}

#[derive(Debug, Default)]
struct KindCounters([AtomicU64; 5]);

impl KindCounters {
    /// Counts one message; returns whether someone waits for it (anything
    /// but `Finish` and `Release`, which are bookkeeping).
    fn count(&self, body: capnp::Result<capnp::any_pointer::Reader<'_>>) -> bool {
        use capnp_rpc::rpc_capnp::message::Which;
        let kind = body
            .and_then(|b| b.get_as::<capnp_rpc::rpc_capnp::message::Reader<'_>>())
            .ok()
            .and_then(|m| m.which().ok());
        let index = match kind {
            Some(Which::Call(_)) => 0,
            Some(Which::Return(_)) => 1,
            Some(Which::Finish(_)) => 2,
            Some(Which::Release(_)) => 3,
            _ => 4,
        };
        self.0[index].fetch_add(1, Ordering::Relaxed);
        !matches!(index, 2 | 3)
    }

    fn snapshot(&self) -> MessageCounts {
        let get = |i: usize| self.0[i].load(Ordering::Relaxed);
        MessageCounts {
            calls: get(0),
            returns: get(1),
            finishes: get(2),
            releases: get(3),
            other: get(4),
        }
    }
}

/// A stream that adds the bytes it moves to shared [`WireCounters`].
#[derive(Debug)]
pub struct CountingStream<S> {
    inner: S,
    counters: Arc<WireCounters>,
}

impl<S> CountingStream<S> {
    /// Wraps `inner`, counting into `counters`.
    pub fn new(inner: S, counters: Arc<WireCounters>) -> Self {
        CountingStream { inner, counters }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for CountingStream<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let poll = Pin::new(&mut self.inner).poll_read(cx, buf);
        if let Poll::Ready(Ok(())) = poll {
            let n = buf.filled().len().saturating_sub(before) as u64;
            self.counters.received.fetch_add(n, Ordering::Relaxed);
        }
        poll
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for CountingStream<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let poll = Pin::new(&mut self.inner).poll_write(cx, buf);
        if let Poll::Ready(Ok(n)) = poll {
            self.counters.sent.fetch_add(n as u64, Ordering::Relaxed);
        }
        poll
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// Why a connection to a peer could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    /// TCP connect and TLS handshake did not finish in time.
    #[error("connecting to {addr} timed out after {after:?}")]
    Timeout {
        /// The peer.
        addr: SocketAddr,
        /// The limit that passed.
        after: Duration,
    },
    /// TCP connect failed (refused, unreachable, ...).
    #[error("connecting to {addr}: {source}")]
    Tcp {
        /// The peer.
        addr: SocketAddr,
        /// The error.
        source: io::Error,
    },
    /// The TLS handshake failed: the peer's certificate is not from the
    /// cluster CA, or not for the node ID the ring gives that address.
    #[error("TLS handshake with node {node} at {addr}: {source}")]
    Tls {
        /// The node ID that was expected.
        node: crate::ring::NodeId,
        /// The peer.
        addr: SocketAddr,
        /// The error.
        source: io::Error,
    },
    /// The node ID cannot name a certificate, so no peer can prove it.
    #[error("node {node} at {addr}: {source}")]
    NodeName {
        /// The node ID.
        node: crate::ring::NodeId,
        /// The peer.
        addr: SocketAddr,
        /// Why the name is unusable.
        source: crate::tls::TlsError,
    },
}

/// A TLS stream to or from a peer, either side of the handshake.
pub type PeerTls = TlsStream<TcpStream>;

/// Connects to `node`'s RPC address and completes a TLS handshake presenting
/// this node's certificate, within `timeout` for both. The peer must prove
/// it is `node`: its certificate must be the cluster CA's for that node ID
/// (see [`crate::tls::node_server_name`]).
pub async fn connect(
    node: &crate::ring::Member,
    config: Arc<rustls::ClientConfig>,
    timeout: Duration,
) -> Result<PeerTls, ConnectError> {
    let addr = node.rpc_addr;
    let server_name = crate::tls::node_server_name(node.id.as_str()).map_err(|source| {
        ConnectError::NodeName {
            node: node.id.clone(),
            addr,
            source,
        }
    })?;
    let attempt = async {
        let tcp = TcpStream::connect(addr)
            .await
            .map_err(|source| ConnectError::Tcp { addr, source })?;
        // Small RPC messages (dispatch, acks) must not wait for Nagle.
        let _ = tcp.set_nodelay(true);
        let tls = TlsConnector::from(config)
            .connect(server_name, tcp)
            .await
            .map_err(|source| ConnectError::Tls {
                node: node.id.clone(),
                addr,
                source,
            })?;
        Ok(TlsStream::from(tls))
    };
    match tokio::time::timeout(timeout, attempt).await {
        Ok(result) => result,
        Err(_) => Err(ConnectError::Timeout {
            addr,
            after: timeout,
        }),
    }
}

/// The [`crate::membership::IdentityCheck`] that admits a gossip member to
/// the ring: a TLS handshake with its RPC address that must prove its node
/// ID, exactly as a forward to it would ([`connect`]), within `timeout`.
pub fn identity_check(
    config: Arc<rustls::ClientConfig>,
    timeout: Duration,
) -> crate::membership::IdentityCheck {
    crate::membership::IdentityCheck::new(move |node| {
        let config = config.clone();
        Box::pin(async move { connect(&node, config, timeout).await.map(drop) })
    })
}

/// Completes the server side of a TLS handshake on an accepted connection,
/// within `timeout`. Fails for a peer without a cluster certificate.
pub async fn accept(
    tcp: TcpStream,
    acceptor: &TlsAcceptor,
    timeout: Duration,
) -> io::Result<PeerTls> {
    let _ = tcp.set_nodelay(true);
    match tokio::time::timeout(timeout, acceptor.accept(tcp)).await {
        Ok(Ok(tls)) => Ok(TlsStream::from(tls)),
        Ok(Err(e)) => Err(e),
        Err(_) => Err(io::Error::new(
            io::ErrorKind::TimedOut,
            format!("TLS handshake not finished after {timeout:?}"),
        )),
    }
}

/// A Cap'n Proto two-party network over `stream` whose messages are
/// tallied by kind into `counters`. Incoming messages larger than
/// `max_message_bytes` are rejected (the connection fails) before they are
/// buffered in full, and reading pauses while the peer's unanswered calls
/// hold more than `max_unanswered_bytes` ([`Unanswered`]).
pub(crate) fn two_party<S>(
    stream: S,
    side: Side,
    max_message_bytes: usize,
    max_unanswered_bytes: usize,
    member: Option<Arc<MemberBudget>>,
    counters: Arc<WireCounters>,
) -> Box<dyn capnp_rpc::VatNetwork<Side>>
where
    S: AsyncRead + AsyncWrite + Unpin + 'static,
{
    let (read, write) = tokio::io::split(stream);
    let urgent = Urgent::default();
    let write = Coalescing::new(BufWriter::with_capacity(64 * 1024, write), urgent.clone());
    let mut options = capnp::message::ReaderOptions::new();
    options.traversal_limit_in_words(Some(max_message_bytes / 8));
    options.nesting_limit(64);
    let network = VatNetwork::new(read.compat(), write.compat_write(), side, options);
    Box::new(Tallied {
        inner: network,
        counters,
        urgent,
        unanswered: Rc::new(Unanswered {
            limit: max_unanswered_bytes,
            bytes: Default::default(),
            by_question: Default::default(),
            freed: tokio::sync::Notify::new(),
            member,
        }),
    })
}

/// What one member (one cluster certificate) may hold unanswered over all
/// its connections to this node: the bound [`Unanswered`] keeps per
/// connection, kept for the member as a whole, so opening more connections
/// gives a peer no more room. Shared by that member's connections on every
/// RPC thread.
#[derive(Debug)]
pub(crate) struct MemberBudget {
    limit: usize,
    bytes: std::sync::atomic::AtomicUsize,
    freed: tokio::sync::Notify,
    /// The node's record of the most any member held at once.
    peak: Arc<AtomicU64>,
}

impl MemberBudget {
    /// A budget of `limit` bytes, reporting its high-water mark to `peak`.
    pub(crate) fn new(limit: usize, peak: Arc<AtomicU64>) -> Self {
        MemberBudget {
            limit,
            bytes: Default::default(),
            freed: tokio::sync::Notify::new(),
            peak,
        }
    }

    fn add(&self, size: usize) {
        let now = self.bytes.fetch_add(size, Ordering::Relaxed) + size;
        self.peak.fetch_max(now as u64, Ordering::Relaxed);
    }

    fn sub(&self, size: usize) {
        let _ = self
            .bytes
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |b| {
                Some(b.saturating_sub(size))
            });
        self.freed.notify_waiters();
    }

    fn full(&self) -> bool {
        self.bytes.load(Ordering::Relaxed) >= self.limit
    }
}

/// The calls a peer has sent on one connection that this side has not
/// answered yet, in bytes.
///
/// capnp-rpc buffers every call it reads until it is answered, and queues
/// `-> stream` calls (body writes) to deliver them one at a time, so a peer
/// that ignores flow control could make this side buffer without limit
/// while a Worker does not read. Past `limit` this side stops reading the
/// connection until answers free room: the peer's TCP window fills and it
/// is the one that waits. Honest peers stay far below: their body writes
/// are flow-controlled (about 128 KiB in flight per stream) and an inline
/// call is at most 64 KiB plus its head. A pause can only end by answers
/// this side gives, and some answers wait for the peer's own answers (a
/// response sent to its sink), so a pause longer than [`MAX_READ_PAUSE`]
/// fails the connection instead of waiting forever.
///
/// On a connection a member opened to this node, the same bytes also count
/// against that member's [`MemberBudget`], and reading pauses while either
/// is full.
struct Unanswered {
    limit: usize,
    bytes: std::cell::Cell<usize>,
    by_question: std::cell::RefCell<std::collections::HashMap<u32, usize>>,
    freed: tokio::sync::Notify,
    member: Option<Arc<MemberBudget>>,
}

impl Unanswered {
    fn called(&self, question: u32, size: usize) -> usize {
        if let Some(old) = self.by_question.borrow_mut().insert(question, size) {
            // A question ID reused before its answer: a protocol error the
            // RPC system reports; keep the books straight meanwhile.
            self.bytes.set(self.bytes.get().saturating_sub(old));
            if let Some(m) = &self.member {
                m.sub(old);
            }
        }
        self.bytes.set(self.bytes.get() + size);
        if let Some(m) = &self.member {
            m.add(size);
        }
        self.bytes.get()
    }

    fn answered(&self, question: u32) {
        if let Some(size) = self.by_question.borrow_mut().remove(&question) {
            self.bytes.set(self.bytes.get().saturating_sub(size));
            self.freed.notify_waiters();
            if let Some(m) = &self.member {
                m.sub(size);
            }
        }
    }

    /// Waits until there is room to read another message; an error if
    /// that takes longer than [`MAX_READ_PAUSE`].
    async fn room(&self, counters: &WireCounters) -> Result<(), capnp::Error> {
        let deadline = tokio::time::Instant::now() + MAX_READ_PAUSE;
        let mut counted = false;
        loop {
            let freed = self.freed.notified();
            let member_freed = self.member.as_ref().map(|m| m.freed.notified());
            let member_full = self.member.as_ref().is_some_and(|m| m.full());
            if self.bytes.get() < self.limit && !member_full {
                return Ok(());
            }
            if !counted {
                counters.reads_paused.fetch_add(1, Ordering::Relaxed);
                counted = true;
            }
            let either = async {
                match member_freed {
                    Some(m) => {
                        tokio::select! {
                            () = freed => {}
                            () = m => {}
                        }
                    }
                    None => freed.await,
                }
            };
            if tokio::time::timeout_at(deadline, either).await.is_err() {
                return Err(capnp::Error::overloaded(format!(
                    "the peer's unanswered calls stayed over their limit ({} bytes on this \
                     connection{}) for {MAX_READ_PAUSE:?}",
                    self.limit,
                    self.member
                        .as_ref()
                        .map(|m| format!(", {} over all its connections", m.limit))
                        .unwrap_or_default()
                )));
            }
        }
    }
}

impl Drop for Unanswered {
    /// A connection that ends gives its member back what it held.
    fn drop(&mut self) {
        if let Some(m) = &self.member {
            m.sub(self.bytes.get());
        }
    }
}

/// Longest a connection stops reading for its peer's unanswered calls
/// before it fails.
pub const MAX_READ_PAUSE: Duration = Duration::from_secs(10);

/// The question ID and size of an incoming `Call`.
fn call_of(body: capnp::Result<capnp::any_pointer::Reader<'_>>) -> Option<(u32, usize)> {
    use capnp_rpc::rpc_capnp::message::Which;
    let body = body.ok()?;
    let size = usize::try_from(body.target_size().ok()?.word_count)
        .ok()?
        .saturating_mul(8);
    let message = body
        .get_as::<capnp_rpc::rpc_capnp::message::Reader<'_>>()
        .ok()?;
    match message.which().ok()? {
        Which::Call(Ok(call)) => Some((call.get_question_id(), size)),
        _ => None,
    }
}

/// The answer ID of an outgoing `Return`.
fn return_of(body: capnp::Result<capnp::any_pointer::Reader<'_>>) -> Option<u32> {
    use capnp_rpc::rpc_capnp::message::Which;
    let message = body
        .ok()?
        .get_as::<capnp_rpc::rpc_capnp::message::Reader<'_>>()
        .ok()?;
    match message.which().ok()? {
        Which::Return(Ok(answer)) => Some(answer.get_answer_id()),
        _ => None,
    }
}

/// Set when a message someone waits for (a call, a return, ...) has been
/// queued since the last flush.
type Urgent = Rc<std::cell::Cell<bool>>;

/// How long bookkeeping messages (`Finish`, `Release`) may wait to leave
/// with the next message someone waits for.
const LAZY_FLUSH: std::time::Duration = std::time::Duration::from_millis(1);

/// A writer that turns the flush capnp-rpc requests after every message
/// into one flush per turn of the event loop, and lets bookkeeping wait.
///
/// capnp-rpc's write queue flushes after each message, so a return and the
/// releases that go with it would each cost a TLS record, a `writev` and a
/// wake-up of the peer. Here a flush only wakes a flusher task on this
/// thread, which yields once (letting the write queue buffer every message
/// of this turn) and then flushes them all. If nothing in the buffer is
/// urgent (only `Finish` and `Release`, which nobody waits for), it waits
/// up to [`LAZY_FLUSH`] for a message that is, so a request's `Finish`
/// usually rides with the next call instead of waking the peer on its own.
/// Must be created on an RPC thread (it spawns the flusher there). A failed
/// flush fails the next write.
struct Coalescing<W> {
    shared: Rc<CoalescingState<W>>,
    dirty: Rc<tokio::sync::Notify>,
}

struct CoalescingState<W> {
    inner: std::cell::RefCell<W>,
    failed: std::cell::RefCell<Option<io::Error>>,
}

impl<W: AsyncWrite + Unpin + 'static> Coalescing<W> {
    fn new(inner: W, urgent: Urgent) -> Self {
        let shared = Rc::new(CoalescingState {
            inner: std::cell::RefCell::new(inner),
            failed: std::cell::RefCell::new(None),
        });
        let dirty = Rc::new(tokio::sync::Notify::new());
        let weak = Rc::downgrade(&shared);
        let notified = dirty.clone();
        tokio::task::spawn_local(async move {
            loop {
                notified.notified().await;
                // Let the write queue buffer the rest of this turn's messages.
                tokio::task::yield_now().await;
                if !urgent.get() {
                    // Bookkeeping only: wait a little for company.
                    let _ = tokio::time::timeout(LAZY_FLUSH, notified.notified()).await;
                    tokio::task::yield_now().await;
                }
                urgent.set(false);
                // Gone: the connection is closed (dropping the writer wakes us).
                let Some(state) = weak.upgrade() else { return };
                let flushed = std::future::poll_fn(|cx| {
                    Pin::new(&mut *state.inner.borrow_mut()).poll_flush(cx)
                })
                .await;
                if let Err(e) = flushed {
                    *state.failed.borrow_mut() = Some(e);
                    return;
                }
            }
        });
        Coalescing { shared, dirty }
    }

    fn check(&self) -> io::Result<()> {
        match self.shared.failed.borrow_mut().take() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

impl<W: AsyncWrite + Unpin + 'static> AsyncWrite for Coalescing<W> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.check()?;
        Pin::new(&mut *self.shared.inner.borrow_mut()).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.check()?;
        self.dirty.notify_one();
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.check()?;
        Pin::new(&mut *self.shared.inner.borrow_mut()).poll_shutdown(cx)
    }
}

impl<W> Drop for Coalescing<W> {
    fn drop(&mut self) {
        self.dirty.notify_one();
    }
}

/// A network whose connections tally their messages.
struct Tallied<N> {
    inner: N,
    counters: Arc<WireCounters>,
    urgent: Urgent,
    unanswered: Rc<Unanswered>,
}

impl<N: capnp_rpc::VatNetwork<Side>> capnp_rpc::VatNetwork<Side> for Tallied<N> {
    fn connect(&mut self, host_id: Side) -> Option<Box<dyn Connection<Side>>> {
        let (counters, urgent) = (self.counters.clone(), self.urgent.clone());
        let unanswered = self.unanswered.clone();
        self.inner.connect(host_id).map(|inner| {
            Box::new(TalliedConnection {
                inner,
                counters,
                urgent,
                unanswered,
            }) as Box<dyn Connection<Side>>
        })
    }

    fn accept(&mut self) -> Promise<Box<dyn Connection<Side>>, capnp::Error> {
        let (counters, urgent) = (self.counters.clone(), self.urgent.clone());
        let unanswered = self.unanswered.clone();
        let accepted = self.inner.accept();
        Promise::from_future(async move {
            let inner = accepted.await?;
            Ok(Box::new(TalliedConnection {
                inner,
                counters,
                urgent,
                unanswered,
            }) as Box<dyn Connection<Side>>)
        })
    }

    fn drive_until_shutdown(&mut self) -> Promise<(), capnp::Error> {
        self.inner.drive_until_shutdown()
    }
}

struct TalliedConnection {
    inner: Box<dyn Connection<Side>>,
    counters: Arc<WireCounters>,
    urgent: Urgent,
    unanswered: Rc<Unanswered>,
}

impl Connection<Side> for TalliedConnection {
    fn get_peer_vat_id(&self) -> Side {
        self.inner.get_peer_vat_id()
    }

    fn new_outgoing_message(&mut self, first_segment_word_size: u32) -> Box<dyn OutgoingMessage> {
        Box::new(TalliedOutgoing {
            inner: self.inner.new_outgoing_message(first_segment_word_size),
            counters: self.counters.clone(),
            urgent: self.urgent.clone(),
            unanswered: self.unanswered.clone(),
        })
    }

    fn receive_incoming_message(
        &mut self,
    ) -> Promise<Option<Box<dyn capnp_rpc::IncomingMessage>>, capnp::Error> {
        let counters = self.counters.clone();
        let unanswered = self.unanswered.clone();
        // Lazy: nothing is read from the socket until this is awaited.
        let received = self.inner.receive_incoming_message();
        Promise::from_future(async move {
            unanswered.room(&counters).await?;
            let message = received.await?;
            if let Some(message) = &message {
                let _ = counters.messages_received.count(message.get_body());
                if let Some((question, size)) = call_of(message.get_body()) {
                    let held = unanswered.called(question, size);
                    counters
                        .unanswered_peak
                        .fetch_max(held as u64, Ordering::Relaxed);
                }
            }
            Ok(message)
        })
    }

    fn new_stream(
        &mut self,
    ) -> (
        Box<dyn capnp_rpc::FlowController>,
        Promise<(), capnp::Error>,
    ) {
        self.inner.new_stream()
    }

    fn shutdown(&mut self, result: capnp::Result<()>) -> Promise<(), capnp::Error> {
        self.inner.shutdown(result)
    }
}

struct TalliedOutgoing {
    inner: Box<dyn OutgoingMessage>,
    counters: Arc<WireCounters>,
    urgent: Urgent,
    unanswered: Rc<Unanswered>,
}

impl OutgoingMessage for TalliedOutgoing {
    fn get_body(&mut self) -> capnp::Result<capnp::any_pointer::Builder<'_>> {
        self.inner.get_body()
    }

    fn get_body_as_reader(&self) -> capnp::Result<capnp::any_pointer::Reader<'_>> {
        self.inner.get_body_as_reader()
    }

    fn send(
        self: Box<Self>,
    ) -> (
        Promise<(), capnp::Error>,
        std::rc::Rc<capnp::message::Builder<capnp::message::HeapAllocator>>,
    ) {
        if self
            .counters
            .messages_sent
            .count(self.inner.get_body_as_reader())
        {
            self.urgent.set(true);
        }
        if let Some(answer) = return_of(self.inner.get_body_as_reader()) {
            self.unanswered.answered(answer);
        }
        self.inner.send()
    }

    fn take(self: Box<Self>) -> capnp::message::Builder<capnp::message::HeapAllocator> {
        self.inner.take()
    }

    fn size_in_words(&self) -> usize {
        self.inner.size_in_words()
    }
}
