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
//! messages (framing included) and not TLS records or handshakes.

use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use capnp_rpc::rpc_twoparty_capnp::Side;
use capnp_rpc::twoparty::VatNetwork;
use tokio::io::{AsyncRead, AsyncWrite, BufWriter, ReadBuf};
use tokio::net::TcpStream;
use tokio_rustls::{TlsAcceptor, TlsConnector, TlsStream};
use tokio_util::compat::{TokioAsyncReadCompatExt, TokioAsyncWriteCompatExt};

/// Bytes moved through counted streams, each way.
#[derive(Debug, Default)]
pub struct WireCounters {
    sent: AtomicU64,
    received: AtomicU64,
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
    /// The TLS handshake failed (e.g. the peer's certificate is not from the
    /// cluster CA).
    #[error("TLS handshake with {addr}: {source}")]
    Tls {
        /// The peer.
        addr: SocketAddr,
        /// The error.
        source: io::Error,
    },
}

/// A TLS stream to or from a peer, either side of the handshake.
pub type PeerTls = TlsStream<TcpStream>;

/// Connects to `addr` and completes a TLS handshake presenting this node's
/// certificate, within `timeout` for both.
pub async fn connect(
    addr: SocketAddr,
    config: Arc<rustls::ClientConfig>,
    timeout: Duration,
) -> Result<PeerTls, ConnectError> {
    let attempt = async {
        let tcp = TcpStream::connect(addr)
            .await
            .map_err(|source| ConnectError::Tcp { addr, source })?;
        // Small RPC messages (dispatch, acks) must not wait for Nagle.
        let _ = tcp.set_nodelay(true);
        let tls = TlsConnector::from(config)
            .connect(crate::tls::cluster_server_name(), tcp)
            .await
            .map_err(|source| ConnectError::Tls { addr, source })?;
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

/// A Cap'n Proto two-party network over `stream`. Incoming messages larger
/// than `max_message_bytes` are rejected (the connection fails) before they
/// are buffered in full.
pub(crate) fn two_party<S>(
    stream: S,
    side: Side,
    max_message_bytes: usize,
) -> VatNetwork<tokio_util::compat::Compat<tokio::io::ReadHalf<S>>>
where
    S: AsyncRead + AsyncWrite + Unpin + 'static,
{
    let (read, write) = tokio::io::split(stream);
    let write = BufWriter::with_capacity(64 * 1024, write);
    let mut options = capnp::message::ReaderOptions::new();
    options.traversal_limit_in_words(Some(max_message_bytes / 8));
    options.nesting_limit(64);
    VatNetwork::new(read.compat(), write.compat_write(), side, options)
}
