//! The one-round-trip hop: small complete bodies travel inside the call.
//!
//! Most requests a Worker serves are small, and so are most responses. For
//! them the streaming protocol (`dispatch`, then `fetch`, then `ByteStream`
//! writes for each body, each with its own return) costs several messages,
//! each a write on one node and a wake-up of the other's RPC thread.
//! `ShardServer.call` carries the whole request instead, and its return
//! carries the whole response:
//!
//! ```text
//! caller                                   home
//!   call(scriptId, context, lazy, head, body, sink) ──►
//!                                           admit, run the Worker, gather
//!   ◄── return { response: (head, body) | refused: lazy | streamed }
//! ```
//!
//! What is small: a body that is complete, at most [`MAX_INLINE_BODY_BYTES`]
//! long, and fully arrived within [`INLINE_PATIENCE`] of being looked at.
//! `gather` decides that without losing a byte: a body that does not
//! qualify comes back as a [`Body`] that replays what was read and then
//! streams the rest ([`Replay`]), so the caller falls back to streaming (the request to
//! `dispatch`/`fetch`, the response to the `ResponseSink`). A streaming
//! response's head therefore waits at most [`INLINE_PATIENCE`] longer.

use std::collections::VecDeque;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http_body::{Body as _, Frame};
use http_body_util::BodyExt as _;

use hearth_body::Replay;

use crate::hosted_workers::Body;

/// The largest body carried inside a call or its return.
pub const MAX_INLINE_BODY_BYTES: usize = 64 * 1024;

/// How long `gather` waits for the rest of a body before it streams it.
pub const INLINE_PATIENCE: Duration = Duration::from_millis(2);

/// A body as [`gather`] found it.
pub(crate) enum Gathered {
    /// Complete and small: all of it.
    Whole(Bytes),
    /// Too large, too slow or failed: the same body, from its first byte.
    Streaming(Body),
}

/// The crate's gathering of a body (as for an inline `call`), for callers
/// outside it: the whole body if it is small and complete, else an
/// equivalent body that replays what was read. The node uses it to hold a Durable Object
/// request it may send again.
pub async fn whole(body: Body, limit: usize) -> Result<Bytes, Body> {
    match gather(body, limit).await {
        Gathered::Whole(bytes) => Ok(bytes),
        Gathered::Streaming(body) => Err(body),
    }
}

/// Reads `body` to its end if it is at most `limit` bytes and arrives
/// within [`INLINE_PATIENCE`]; otherwise hands back an equivalent body
/// (what was read, then the rest, then its error if it failed).
pub(crate) async fn gather(mut body: Body, limit: usize) -> Gathered {
    if body.is_end_stream() {
        return Gathered::Whole(Bytes::new());
    }
    if body.size_hint().lower() > limit as u64 {
        return Gathered::Streaming(body);
    }
    let deadline = tokio::time::Instant::now() + INLINE_PATIENCE;
    let mut read: VecDeque<Bytes> = VecDeque::new();
    let mut total = 0usize;
    let error = loop {
        let frame = match tokio::time::timeout_at(deadline, body.frame()).await {
            Err(_late) => break None,
            Ok(None) => return Gathered::Whole(concat(read, total)),
            Ok(Some(Err(e))) => break Some(e),
            Ok(Some(Ok(frame))) => frame,
        };
        // Trailers are not carried between nodes (see `byte_stream`).
        if let Ok(data) = frame.into_data()
            && !data.is_empty()
        {
            total += data.len();
            read.push_back(data);
            if total > limit {
                break None;
            }
        }
        if body.is_end_stream() {
            return Gathered::Whole(concat(read, total));
        }
    };
    let read = read.into_iter().map(Frame::data);
    Gathered::Streaming(match error {
        Some(error) => Replay::failed(read, error).boxed(),
        None => Replay::new(read, body).boxed(),
    })
}

fn concat(mut parts: VecDeque<Bytes>, total: usize) -> Bytes {
    if parts.len() == 1
        && let Some(only) = parts.pop_front()
    {
        return only;
    }
    let mut all = BytesMut::with_capacity(total);
    for part in parts {
        all.extend_from_slice(&part);
    }
    all.freeze()
}

#[cfg(test)]
mod tests {
    use super::*;

    use hearth_body::full;
    use http_body_util::StreamBody;

    use crate::hosted_workers::BoxError;

    /// A body of `chunks`, then (if given) an error; `stall` keeps it open
    /// after the chunks, as a slow client would.
    fn chunked(chunks: Vec<&'static [u8]>, error: Option<&'static str>, stall: bool) -> Body {
        let mut items: Vec<Result<Frame<Bytes>, BoxError>> = chunks
            .into_iter()
            .map(|c| Ok(Frame::data(Bytes::from_static(c))))
            .collect();
        if let Some(e) = error {
            items.push(Err(e.into()));
        }
        let stream = futures::stream::iter(items);
        if stall {
            let stream = futures::StreamExt::chain(stream, futures::stream::pending());
            Body::new(StreamBody::new(stream))
        } else {
            Body::new(StreamBody::new(stream))
        }
    }

    async fn whole(g: Gathered) -> Bytes {
        match g {
            Gathered::Whole(b) => b,
            Gathered::Streaming(_) => panic!("expected the body whole"),
        }
    }

    async fn streamed(g: Gathered) -> Body {
        match g {
            Gathered::Whole(b) => panic!("expected a stream, got {} bytes whole", b.len()),
            Gathered::Streaming(body) => body,
        }
    }

    #[tokio::test]
    async fn small_complete_bodies_come_whole() {
        assert_eq!(whole(gather(full(""), 10).await).await, Bytes::new());
        assert_eq!(whole(gather(full("hello"), 10).await).await, "hello");
        let body = chunked(vec![b"ab", b"cd", b"ef"], None, false);
        assert_eq!(whole(gather(body, 10).await).await, "abcdef");
    }

    #[tokio::test]
    async fn a_body_over_the_limit_streams_from_its_first_byte() {
        let body = chunked(vec![b"abcd", b"efgh", b"ijkl"], None, false);
        let body = streamed(gather(body, 6).await).await;
        assert_eq!(body.collect().await.unwrap().to_bytes(), "abcdefghijkl");
        // Known to be too long: not read at all.
        let body = streamed(gather(full("0123456789"), 4).await).await;
        assert_eq!(body.collect().await.unwrap().to_bytes(), "0123456789");
    }

    #[tokio::test]
    async fn a_stalled_body_streams_after_the_patience() {
        let body = chunked(vec![b"start"], None, true);
        let body = streamed(gather(body, 1024).await).await;
        let mut body = body;
        let first = body.frame().await.unwrap().unwrap().into_data().unwrap();
        assert_eq!(first, "start");
        assert!(!body.is_end_stream());
    }

    #[tokio::test]
    async fn a_failed_body_keeps_its_error_after_its_bytes() {
        let body = chunked(vec![b"part"], Some("upload cut"), false);
        let mut body = streamed(gather(body, 1024).await).await;
        let first = body.frame().await.unwrap().unwrap().into_data().unwrap();
        assert_eq!(first, "part");
        let err = body.frame().await.unwrap().unwrap_err();
        assert!(err.to_string().contains("upload cut"), "{err}");
        assert!(body.frame().await.is_none());
    }
}
