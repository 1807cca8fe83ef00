//! Bodies as streams between nodes: an HTTP [`Body`] on one side, a
//! Cap'n Proto `ByteStream` capability on the other.
//!
//! The *receiver* of a body exports a `ByteStream` ([`ByteStreamServer`])
//! that turns calls into a [`Body`] ([`ChannelBody`]); the *sender* pumps a
//! body into the capability with `write` calls ([`pump`]). `write` is a
//! `-> stream` method: capnp-rpc keeps a window of unacknowledged writes per
//! capability and the server acknowledges a write only once its bounded
//! channel has room, so a slow reader slows the writer down end to end
//! instead of buffering the body in memory.
//!
//! Capabilities live on an RPC thread; bodies may come from anywhere (a
//! Worker, the front door, a test). They meet through tokio channels of
//! [`StreamItem`]s: [`spawn_reader`] drains a [`Body`] on a task of its own
//! into a channel that the RPC thread pumps into a capability, and
//! [`ChannelBody`] is the `Send` body the receiving side hands to a Worker.
//!
//! A stream ends with `end` (complete) or `abort` (failed). A stream whose
//! capability goes away without either (the peer disconnected) yields a
//! body error, never a silently truncated body. HTTP trailers are not
//! carried.

use std::cell::RefCell;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::Frame;
use http_body_util::BodyExt;
use tokio::sync::{mpsc, oneshot};

use crate::hosted_workers::{Body, BoxError};
use crate::http_wire::{self, HeadError};
use crate::schema::hearth_capnp::{byte_stream, response_sink};

/// Largest chunk sent in one `write` call.
pub(crate) const MAX_WRITE_BYTES: usize = 64 * 1024;
/// Chunks buffered between a stream's capability and its consumer.
const CHANNEL_CHUNKS: usize = 16;

/// One step of a body in transit between threads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum StreamItem {
    /// The next bytes of the body.
    Chunk(Bytes),
    /// The body is complete.
    End,
    /// The body failed; what was sent before is not the whole body.
    Abort(String),
}

/// Why a body that came over the network is not complete.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BodyStreamError {
    /// The sender reported a failure.
    #[error("body aborted by sender: {0}")]
    Aborted(String),
    /// The sender went away (peer disconnected) before the end of the body.
    #[error("body stream closed before its end (peer disconnected)")]
    Disconnected,
}

/// A [`Body`] fed by a channel of [`StreamItem`]s. (The kept copy of a
/// refused request's start goes in front of one with
/// [`hearth_body::Replay`].)
#[derive(Debug)]
pub(crate) struct ChannelBody {
    /// `None` once the body is over (ended or failed).
    rx: Option<mpsc::Receiver<StreamItem>>,
}

impl ChannelBody {
    /// A body of what arrives on `rx`.
    pub(crate) fn new(rx: mpsc::Receiver<StreamItem>) -> Self {
        ChannelBody { rx: Some(rx) }
    }

    /// Boxes it as the crate's [`Body`].
    pub(crate) fn boxed(self) -> Body {
        Body::new(self)
    }
}

impl http_body::Body for ChannelBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let Some(rx) = self.rx.as_mut() else {
            return Poll::Ready(None);
        };
        let item = match rx.poll_recv(cx) {
            Poll::Pending => return Poll::Pending,
            Poll::Ready(item) => item,
        };
        let result = match item {
            Some(StreamItem::Chunk(b)) => return Poll::Ready(Some(Ok(Frame::data(b)))),
            Some(StreamItem::End) => None,
            Some(StreamItem::Abort(reason)) => {
                Some(Err(Box::new(BodyStreamError::Aborted(reason)) as BoxError))
            }
            None => Some(Err(Box::new(BodyStreamError::Disconnected) as BoxError)),
        };
        // After the end or an error the body is over.
        self.rx = None;
        Poll::Ready(result)
    }

    fn is_end_stream(&self) -> bool {
        self.rx.is_none()
    }
}

/// The receiving end of a body: a `ByteStream` capability whose calls feed a
/// [`ChannelBody`].
pub(crate) struct ByteStreamServer {
    tx: RefCell<Option<mpsc::Sender<StreamItem>>>,
}

impl ByteStreamServer {
    /// A new stream: the capability to hand to the sender, and the body it
    /// feeds.
    pub(crate) fn new_pair() -> (byte_stream::Client, ChannelBody) {
        let (tx, rx) = mpsc::channel(CHANNEL_CHUNKS);
        let server = ByteStreamServer {
            tx: RefCell::new(Some(tx)),
        };
        (capnp_rpc::new_client(server), ChannelBody::new(rx))
    }

    fn finish(&self, item: StreamItem) -> impl Future<Output = Result<(), capnp::Error>> + use<> {
        let tx = self.tx.borrow_mut().take();
        async move {
            if let Some(tx) = tx {
                // A consumer that stopped reading does not care how it ends.
                let _ = tx.send(item).await;
            }
            Ok(())
        }
    }
}

impl byte_stream::Server for ByteStreamServer {
    fn write(
        self: capnp::capability::Rc<Self>,
        params: byte_stream::WriteParams,
    ) -> impl Future<Output = Result<(), capnp::Error>> + 'static {
        // Copy the chunk out now: the params message is released on return.
        let chunk = params
            .get()
            .and_then(|p| p.get_chunk())
            .map(Bytes::copy_from_slice);
        let tx = self.tx.borrow().clone();
        async move {
            let chunk = chunk?;
            let tx = tx.ok_or_else(|| capnp::Error::failed("write after end of stream".into()))?;
            // Completing only when the channel has room is the back-pressure.
            tx.send(StreamItem::Chunk(chunk))
                .await
                .map_err(|_| capnp::Error::failed("body consumer has gone away".into()))
        }
    }

    fn end(
        self: capnp::capability::Rc<Self>,
        _: byte_stream::EndParams,
        _: byte_stream::EndResults,
    ) -> impl Future<Output = Result<(), capnp::Error>> + 'static {
        self.finish(StreamItem::End)
    }

    fn abort(
        self: capnp::capability::Rc<Self>,
        params: byte_stream::AbortParams,
        _: byte_stream::AbortResults,
    ) -> impl Future<Output = Result<(), capnp::Error>> + 'static {
        let reason = params
            .get()
            .and_then(|p| p.get_reason())
            .ok()
            .and_then(|r| r.to_string().ok())
            .unwrap_or_else(|| "unspecified".into());
        self.finish(StreamItem::Abort(reason))
    }
}

/// Drains `body` on a task of its own into a channel, so the pump that
/// writes it into a capability never polls Worker code itself. Stops when
/// the receiver is dropped.
pub(crate) fn spawn_reader(mut body: Body) -> mpsc::Receiver<StreamItem> {
    let (tx, rx) = mpsc::channel(CHANNEL_CHUNKS);
    tokio::spawn(async move {
        loop {
            let item = match body.frame().await {
                None => StreamItem::End,
                Some(Err(e)) => StreamItem::Abort(e.to_string()),
                Some(Ok(frame)) => match frame.into_data() {
                    Ok(data) if data.is_empty() => continue,
                    Ok(data) => StreamItem::Chunk(data),
                    Err(_trailers) => continue,
                },
            };
            let last = !matches!(item, StreamItem::Chunk(_));
            if tx.send(item).await.is_err() || last {
                return;
            }
        }
    });
    rx
}

/// Sends one chunk (split into `write`s of at most [`MAX_WRITE_BYTES`]) and
/// waits until the flow-control window has room again.
pub(crate) async fn write_chunk(
    stream: &byte_stream::Client,
    mut chunk: Bytes,
) -> Result<(), capnp::Error> {
    while !chunk.is_empty() {
        let part = chunk.split_to(chunk.len().min(MAX_WRITE_BYTES));
        let mut request = stream.write_request();
        request.get().set_chunk(&part);
        request.send().await?;
    }
    Ok(())
}

/// Ends `stream` the way `terminal` says (`End` or `Abort`).
pub(crate) async fn finish_stream(
    stream: &byte_stream::Client,
    terminal: StreamItem,
) -> Result<(), capnp::Error> {
    match terminal {
        StreamItem::Chunk(chunk) => write_chunk(stream, chunk).await,
        StreamItem::End => stream.end_request().send().promise.await.map(|_| ()),
        StreamItem::Abort(reason) => {
            let mut request = stream.abort_request();
            request.get().set_reason(reason.as_str());
            request.send().promise.await.map(|_| ())
        }
    }
}

/// Pumps what arrives on `rx` into `stream`, then ends or aborts it. Returns
/// the number of body bytes written.
pub(crate) async fn pump(
    mut rx: mpsc::Receiver<StreamItem>,
    stream: &byte_stream::Client,
) -> Result<u64, capnp::Error> {
    let mut written = 0u64;
    loop {
        match rx.recv().await {
            Some(StreamItem::Chunk(chunk)) => {
                written += chunk.len() as u64;
                write_chunk(stream, chunk).await?;
            }
            Some(terminal) => {
                finish_stream(stream, terminal).await?;
                return Ok(written);
            }
            None => {
                let gone = StreamItem::Abort("body producer went away".into());
                finish_stream(stream, gone).await?;
                return Ok(written);
            }
        }
    }
}

/// Where a Worker on another node delivers its response: a `ResponseSink`
/// that hands the response (head plus streaming body) to a oneshot.
/// Dropped without `start` (the peer went away), the oneshot reports
/// cancellation, which the caller turns into a 502.
pub(crate) struct ResponseSinkServer {
    tx: RefCell<Option<ResponseSender>>,
}

type ResponseSender = oneshot::Sender<Result<http::Response<Body>, HeadError>>;

/// What a [`ResponseSinkServer`] delivers: the response, or why its head
/// was unusable; `Err(Canceled)` if the sink went away unused.
pub(crate) type ResponseReceiver = oneshot::Receiver<Result<http::Response<Body>, HeadError>>;

impl ResponseSinkServer {
    /// A new sink capability and the receiver of the response it gets.
    pub(crate) fn new_pair() -> (response_sink::Client, ResponseReceiver) {
        let (tx, rx) = oneshot::channel();
        let server = ResponseSinkServer {
            tx: RefCell::new(Some(tx)),
        };
        (capnp_rpc::new_client(server), rx)
    }
}

impl response_sink::Server for ResponseSinkServer {
    fn start(
        self: capnp::capability::Rc<Self>,
        params: response_sink::StartParams,
        mut results: response_sink::StartResults,
    ) -> impl Future<Output = Result<(), capnp::Error>> + 'static {
        let result = (|| {
            let tx = self
                .tx
                .borrow_mut()
                .take()
                .ok_or_else(|| capnp::Error::failed("response already started".into()))?;
            let head = params
                .get()
                .and_then(|p| p.get_head())
                .map_err(HeadError::from)
                .and_then(http_wire::read_response_head);
            match head {
                Ok(parts) => {
                    let (stream, body) = ByteStreamServer::new_pair();
                    results.get().set_body(stream);
                    let _ = tx.send(Ok(http::Response::from_parts(parts, body.boxed())));
                    Ok(())
                }
                Err(e) => {
                    let message = e.to_string();
                    let _ = tx.send(Err(e));
                    Err(capnp::Error::failed(message))
                }
            }
        })();
        std::future::ready(result)
    }
}

/// `response`, or a 502 in its place if its head is too large to relay
/// (the peer would refuse the message, and it would cost the connection).
pub(crate) fn relayable<B>(
    parts: http::response::Parts,
    body: B,
) -> (http::response::Parts, Result<B, Body>) {
    if http_wire::response_head_size(&parts) > http_wire::MAX_HEAD_BYTES
        || parts.headers.len() > http_wire::MAX_HEADERS
    {
        let (parts, body) = hearth_body::text_response(
            http::StatusCode::BAD_GATEWAY,
            "502 Bad Gateway: the Worker's response head is too large to relay\n",
        )
        .into_parts();
        return (parts, Err(body));
    }
    (parts, Ok(body))
}

/// Sends `response` into `sink` (on an RPC thread): the head with `start`,
/// then the body, drained by [`spawn_reader`], with pipelined `write`s.
pub(crate) async fn send_response(
    response: http::Response<Body>,
    sink: response_sink::Client,
) -> Result<u64, capnp::Error> {
    let (parts, body) = response.into_parts();
    let (parts, body) = relayable(parts, body);
    let body = body.unwrap_or_else(|replacement| replacement);
    let mut start = sink.start_request();
    http_wire::write_response_head(&parts, start.get().init_head());
    let started = start.send();
    // Pipelined: the body flows without waiting for `start` to return.
    let stream = started.pipeline.get_body();
    let rx = spawn_reader(body);
    let pumped = pump(rx, &stream).await;
    started.promise.await?;
    pumped
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn channel_body_yields_the_channel_then_ends() {
        let (tx, rx) = mpsc::channel(4);
        let body = ChannelBody::new(rx);
        tx.send(StreamItem::Chunk(Bytes::from_static(b"ab")))
            .await
            .unwrap();
        tx.send(StreamItem::Chunk(Bytes::from_static(b"cd")))
            .await
            .unwrap();
        tx.send(StreamItem::End).await.unwrap();
        let bytes = body.boxed().collect().await.unwrap().to_bytes();
        assert_eq!(&bytes[..], b"abcd");
    }

    #[tokio::test]
    async fn a_stream_that_goes_away_before_its_end_is_an_error_not_a_short_body() {
        let (tx, rx) = mpsc::channel(4);
        tx.send(StreamItem::Chunk(Bytes::from_static(b"partial")))
            .await
            .unwrap();
        drop(tx);
        let err = ChannelBody::new(rx).boxed().collect().await.unwrap_err();
        assert!(err.to_string().contains("closed before its end"), "{err}");

        let (tx, rx) = mpsc::channel(4);
        tx.send(StreamItem::Abort("upload cut".into()))
            .await
            .unwrap();
        let err = ChannelBody::new(rx).boxed().collect().await.unwrap_err();
        assert!(err.to_string().contains("upload cut"), "{err}");
    }
}
