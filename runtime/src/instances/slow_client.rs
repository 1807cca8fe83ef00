//! What a slow, stalled or vanished client may cost a node: a connection
//! and a bounded wait, never a Worker.
//!
//! The model, in the order a request meets it:
//!
//! 1. **Buffer before a slot.** A request takes an instance slot only once
//!    its body has ended or its first
//!    [`buffer_before_slot`](crate::RuntimeConfig::buffer_before_slot)
//!    bytes have arrived ([`buffer_prefix`]). A client that trickles a body
//!    holds its own connection, not one of the Worker's instances.
//! 2. **Idle body.** Each wait for the next piece of a request body is
//!    bounded by [`body_idle_timeout`](crate::RuntimeConfig::body_idle_timeout)
//!    ([`IdleTimeout`]): before the slot this is a 408, after it the guest
//!    sees a body error.
//! 3. **Bounded slot wait** and the **wall-clock deadline** per request live
//!    in `worker` and `instance` (503 with `retry-after`, 504).
//! 4. **Cancel on disconnect.** The task running an invocation is aborted
//!    when the request's future or its response body is dropped before the
//!    body ended (`Cancel`, `CancelOnDrop`): a client that goes away
//!    stops its Worker at the next epoch tick, and the instance is
//!    discarded. A response streamed to its end (or to the last byte of
//!    its declared `content-length`) disarms the guard, so a Worker that
//!    answered in full is never cut short.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body as HttpBody, Frame, SizeHint};
use http_body_util::BodyExt;

use crate::body::{Body, BoxError, Replay};
use crate::stats::Stats;

/// The body of a request stalled: nothing arrived for the idle timeout.
#[derive(Debug, thiserror::Error)]
#[error("request body stalled: nothing arrived for {0:?}")]
pub struct Stalled(pub Duration);

/// A body whose every wait for the next frame is bounded by `idle`; when it
/// expires the body yields [`Stalled`] and ends.
pub struct IdleTimeout {
    inner: Body,
    idle: Duration,
    /// One timer per body, re-armed (not reallocated) for each wait.
    timer: Option<Pin<Box<tokio::time::Sleep>>>,
    armed: bool,
    failed: bool,
}

impl IdleTimeout {
    /// Wraps `inner`.
    pub fn new(inner: Body, idle: Duration) -> Self {
        IdleTimeout {
            inner,
            idle,
            timer: None,
            armed: false,
            failed: false,
        }
    }
}

impl HttpBody for IdleTimeout {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = &mut *self;
        if this.failed {
            return Poll::Ready(None);
        }
        if let Poll::Ready(frame) = Pin::new(&mut this.inner).poll_frame(cx) {
            this.armed = false;
            return Poll::Ready(frame);
        }
        let idle = this.idle;
        let timer = this
            .timer
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(idle)));
        if !this.armed {
            timer.as_mut().reset(tokio::time::Instant::now() + idle);
            this.armed = true;
        }
        ready!(timer.as_mut().poll(cx));
        this.failed = true;
        Poll::Ready(Some(Err(Box::new(Stalled(idle)))))
    }

    fn is_end_stream(&self) -> bool {
        self.failed || self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// Waits until `body` has ended or at least `max` bytes of it have arrived,
/// each frame within `idle`, and returns a body that replays what was read
/// and then streams the rest ([`Replay`]). An empty body returns at once.
pub async fn buffer_prefix(mut body: Body, max: usize, idle: Duration) -> Result<Body, BoxError> {
    if body.is_end_stream() || max == 0 {
        return Ok(body);
    }
    let mut frames = Vec::new();
    let mut bytes = 0usize;
    loop {
        match tokio::time::timeout(idle, body.frame()).await {
            Err(_) => return Err(Box::new(Stalled(idle))),
            Ok(None) => return Ok(Replay::complete(frames).boxed()),
            Ok(Some(frame)) => {
                let frame = frame?;
                if let Some(d) = frame.data_ref() {
                    bytes += d.len();
                }
                frames.push(frame);
                if body.is_end_stream() {
                    return Ok(Replay::complete(frames).boxed());
                }
                if bytes >= max {
                    return Ok(Replay::new(frames, body).boxed());
                }
            }
        }
    }
}

/// Aborts an invocation's task when dropped, unless [disarmed](Cancel::disarm)
/// or the task already finished (then it is a no-op).
pub(crate) struct Cancel {
    task: Option<tokio::task::AbortHandle>,
    stats: Arc<Stats>,
}

impl Cancel {
    /// A guard over `task`.
    pub(crate) fn new(task: tokio::task::AbortHandle, stats: Arc<Stats>) -> Self {
        Cancel {
            task: Some(task),
            stats,
        }
    }

    /// Lets the task run to its end whatever happens to the guard.
    pub(crate) fn disarm(&mut self) {
        self.task = None;
    }
}

impl Drop for Cancel {
    fn drop(&mut self) {
        if let Some(t) = self.task.take()
            && !t.is_finished()
        {
            Stats::bump(&self.stats.cancelled);
            tracing::debug!("client went away; invocation cancelled");
            t.abort();
        }
    }
}

/// A response body that carries its invocation's [`Cancel`] guard: dropped
/// before its end (the client went away), it cancels the invocation; read
/// to its end, it lets the Worker finish.
///
/// "Its end" is the end of the stream, or, for a response that declares its
/// `content-length`, the last of those bytes: hyper stops polling such a
/// body once it has written that many bytes and drops it without waiting
/// for the end of the stream. The Worker has answered in full then, and
/// may still be running (returning from its handler, `ctx.waitUntil` work):
/// cancelling it would cut that short and, on a reused instance, discard
/// the instance (every such request would pay for a new one).
pub(crate) struct CancelOnDrop {
    inner: Body,
    guard: Cancel,
    /// Bytes of the declared length not yet delivered, if one was declared.
    remaining: Option<u64>,
}

impl CancelOnDrop {
    /// Wraps `inner`, a body of `length` bytes if the response declares it.
    pub(crate) fn new(inner: Body, guard: Cancel, length: Option<u64>) -> Self {
        let mut body = CancelOnDrop {
            inner,
            guard,
            remaining: length,
        };
        if length == Some(0) {
            body.guard.disarm();
        }
        body
    }
}

impl HttpBody for CancelOnDrop {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let frame = ready!(Pin::new(&mut self.inner).poll_frame(cx));
        if let (Some(Ok(f)), Some(left)) = (&frame, self.remaining.as_mut())
            && let Some(d) = f.data_ref()
        {
            *left = left.saturating_sub(d.len() as u64);
            if *left == 0 {
                self.guard.disarm();
            }
        }
        if frame.is_none() || self.inner.is_end_stream() {
            self.guard.disarm();
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::body;

    /// A body that sends `first` and then nothing, ever.
    fn stalls_after(first: &'static [u8]) -> Body {
        let s = futures::stream::once(async move {
            Ok::<_, BoxError>(Frame::data(Bytes::from_static(first)))
        })
        .chain(futures::stream::pending());
        http_body_util::StreamBody::new(s).boxed_unsync()
    }

    use futures::StreamExt;

    #[tokio::test]
    async fn a_stalled_body_fails_after_the_idle_timeout() {
        let idle = Duration::from_millis(50);
        let err = buffer_prefix(stalls_after(b"x"), 1024, idle)
            .await
            .expect_err("stalled");
        assert!(err.downcast_ref::<Stalled>().is_some(), "{err}");
        // Once past the prefix, the guest's reads are bounded the same way.
        let mut b = IdleTimeout::new(stalls_after(b"x"), idle);
        let first = b.frame().await.expect("frame").expect("data");
        assert_eq!(first.into_data().ok(), Some(Bytes::from_static(b"x")));
        let err = b.frame().await.expect("frame").expect_err("stalled");
        assert!(err.downcast_ref::<Stalled>().is_some(), "{err}");
        assert!(b.frame().await.is_none());
    }

    #[tokio::test]
    async fn the_prefix_is_replayed_before_the_rest() {
        let whole = buffer_prefix(body::full("hello"), 1024, Duration::from_secs(1))
            .await
            .expect("buffered");
        let got = whole.collect().await.expect("collect").to_bytes();
        assert_eq!(&got[..], b"hello");
        // Over the threshold: the rest still streams after the prefix.
        let s = futures::stream::iter([
            Ok::<_, BoxError>(Frame::data(Bytes::from_static(b"ab"))),
            Ok(Frame::data(Bytes::from_static(b"cd"))),
            Ok(Frame::data(Bytes::from_static(b"ef"))),
        ]);
        let b = http_body_util::StreamBody::new(s).boxed_unsync();
        let b = buffer_prefix(b, 2, Duration::from_secs(1))
            .await
            .expect("buffered");
        let got = b.collect().await.expect("collect").to_bytes();
        assert_eq!(&got[..], b"abcdef");
    }

    /// Reads `n` frames of a [`CancelOnDrop`] over a body that sends
    /// `b"ab"` and then nothing, declared `length` bytes long, drops it, and
    /// says whether the running task it guards was cancelled.
    async fn cancelled_after(n: usize, length: Option<u64>) -> bool {
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            let _ = rx.await;
        });
        let stats = Arc::new(Stats::default());
        let guard = Cancel::new(task.abort_handle(), stats);
        let mut b = CancelOnDrop::new(stalls_after(b"ab"), guard, length);
        for _ in 0..n {
            b.frame().await.expect("frame").expect("data");
        }
        drop(b);
        let _ = tx.send(());
        task.await.is_err_and(|e| e.is_cancelled())
    }

    #[tokio::test]
    async fn a_response_sent_to_its_declared_length_does_not_cancel_the_worker() {
        // hyper drops a body with a content-length once it has written that
        // many bytes, without polling for the end: the Worker answered in
        // full and keeps running.
        assert!(!cancelled_after(1, Some(2)).await);
        assert!(!cancelled_after(0, Some(0)).await);
        // A client that went away before the last declared byte, or a body
        // of unknown length not read to its end, still cancels it.
        assert!(cancelled_after(0, Some(2)).await);
        assert!(cancelled_after(1, Some(3)).await);
        assert!(cancelled_after(1, None).await);
    }
}
