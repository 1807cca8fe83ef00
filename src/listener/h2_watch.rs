//! What bounds an HTTP/2 connection beyond hyper's own settings.
//!
//! hyper closes an HTTP/1.1 connection that sends no request head within
//! the header timeout, between requests too, and the listener's socket
//! write timeout closes one whose client stops reading. Neither carries
//! over to HTTP/2: hyper's h2 server has no head or idle timeout, and a
//! client that stops *granting flow-control window* (rather than stops
//! reading the socket) leaves nothing to write, so the socket timeout never
//! fires and the stream waits until the Worker's wall-clock limit, or
//! forever once the Worker has finished. This module gives each HTTP/2
//! connection a [`Watch`] with two rules, raced against the connection by
//! the listener:
//!
//! * **idle**: a connection with no stream open for the header timeout is
//!   closed. That covers a client that never sends its preface or its
//!   first request's head, and one that keeps the connection open and
//!   idle (answering PINGs does not count as use);
//! * **stalled**: hyper asks a response body for its next frame only once
//!   the previous one has found send window. A body that has handed hyper
//!   a frame and is not asked for another within the write timeout belongs
//!   to a client that grants no window: the connection is closed, which
//!   cancels its Workers. Frames are handed over at most [`MAX_CHUNK`]
//!   bytes at a time, so a client that reads slowly but steadily is asked
//!   for window in steps it can grant well within the timeout.

use std::pin::Pin;
use std::sync::{Arc, Mutex, Weak};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use hearth_runtime::body::{Body, BoxError};
use http_body_util::BodyExt;
use hyper::body::{Body as HttpBody, Frame, SizeHint};
use tokio::time::Instant;

/// The most bytes a response body hands hyper at once: one default HTTP/2
/// frame.
pub(super) const MAX_CHUNK: usize = 16 * 1024;

/// One HTTP/2 connection's open streams, for [`Watch::until_cut`].
pub(super) struct Watch {
    /// (streams open now, streams opened so far).
    active: tokio::sync::watch::Sender<(usize, u64)>,
    streams: Mutex<Vec<Weak<StreamState>>>,
}

/// Whether a stream's body is waiting for hyper to ask for more: since
/// when, if it is.
#[derive(Default)]
struct StreamState {
    handed_at: Mutex<Option<Instant>>,
}

impl StreamState {
    fn set(&self, at: Option<Instant>) {
        *self.handed_at.lock().unwrap_or_else(|p| p.into_inner()) = at;
    }

    /// How long it has waited to be asked, if it is waiting.
    fn waited(&self, now: Instant) -> Option<Duration> {
        self.handed_at
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .map(|t| now.saturating_duration_since(t))
    }
}

/// A stream's place in its [`Watch`], from the request to the end of its
/// response body.
pub(super) struct Stream {
    watch: Arc<Watch>,
    state: Arc<StreamState>,
}

impl Drop for Stream {
    fn drop(&mut self) {
        self.watch.active.send_modify(|(n, _)| *n -= 1);
    }
}

impl Watch {
    /// A connection with no stream open.
    pub(super) fn new() -> Arc<Self> {
        Arc::new(Watch {
            active: tokio::sync::watch::Sender::new((0, 0)),
            streams: Mutex::new(Vec::new()),
        })
    }

    /// A stream opened (a request arrived).
    pub(super) fn open(self: &Arc<Self>) -> Stream {
        let state = Arc::new(StreamState::default());
        {
            let mut streams = self.streams.lock().unwrap_or_else(|p| p.into_inner());
            streams.retain(|s| s.strong_count() > 0);
            streams.push(Arc::downgrade(&state));
        }
        self.active.send_modify(|(n, opened)| {
            *n += 1;
            *opened += 1;
        });
        Stream {
            watch: self.clone(),
            state,
        }
    }

    /// Whether a stream's body has waited `stall` or longer to be asked for
    /// its next frame.
    fn stalled(&self, stall: Duration) -> bool {
        let now = Instant::now();
        let streams = self.streams.lock().unwrap_or_else(|p| p.into_inner());
        streams
            .iter()
            .filter_map(Weak::upgrade)
            .any(|s| s.waited(now).is_some_and(|w| w >= stall))
    }

    /// Resolves when the connection should be closed: no stream open for
    /// `idle` ("idle"), or a stream stalled for `stall` ("stalled").
    pub(super) async fn until_cut(&self, idle: Duration, stall: Duration) -> &'static str {
        let mut rx = self.active.subscribe();
        let mut tick = tokio::time::interval((stall / 4).max(Duration::from_millis(10)));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // Since when the connection has had no stream open, and how many
        // it had opened then.
        let mut idle_since: Option<(Instant, u64)> = None;
        loop {
            let (open, opened) = *rx.borrow_and_update();
            idle_since = match idle_since {
                _ if open > 0 => None,
                Some((t, o)) if o == opened => Some((t, o)),
                _ => Some((Instant::now(), opened)),
            };
            let deadline = idle_since.map(|(t, _)| t + idle);
            tokio::select! {
                () = sleep_until(deadline) => return "idle",
                _ = tick.tick(), if open > 0 => {
                    if self.stalled(stall) {
                        return "stalled: the client grants no flow-control window";
                    }
                }
                r = rx.changed() => {
                    if r.is_err() {
                        // The sender lives as long as `self`.
                        std::future::pending::<()>().await;
                    }
                }
            }
        }
    }
}

/// Sleeps until `deadline`, or forever if there is none.
async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}

/// `body` as the response of `stream`: handed to hyper in frames of at
/// most [`MAX_CHUNK`] bytes, each marking when it was handed until hyper
/// asks for the next.
pub(super) fn watched(body: Body, stream: Stream) -> Body {
    Watched {
        inner: body,
        rest: Bytes::new(),
        stream,
    }
    .boxed_unsync()
}

struct Watched {
    inner: Body,
    /// What is left of a data frame larger than [`MAX_CHUNK`].
    rest: Bytes,
    stream: Stream,
}

impl Watched {
    fn hand(&mut self, mut data: Bytes) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        if data.len() > MAX_CHUNK {
            self.rest = data.split_off(MAX_CHUNK);
        }
        self.stream.state.set(Some(Instant::now()));
        Poll::Ready(Some(Ok(Frame::data(data))))
    }
}

impl HttpBody for Watched {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        // Asked: whatever was handed before has found its window.
        self.stream.state.set(None);
        if !self.rest.is_empty() {
            let rest = std::mem::take(&mut self.rest);
            return self.hand(rest);
        }
        match std::task::ready!(Pin::new(&mut self.inner).poll_frame(cx)) {
            Some(Ok(frame)) => match frame.into_data() {
                Ok(data) => self.hand(data),
                Err(frame) => Poll::Ready(Some(Ok(frame))),
            },
            other => Poll::Ready(other),
        }
    }

    fn is_end_stream(&self) -> bool {
        self.rest.is_empty() && self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        let mut hint = self.inner.size_hint();
        let rest = self.rest.len() as u64;
        if let Some(upper) = hint.upper() {
            hint.set_upper(upper + rest);
        }
        hint.set_lower(hint.lower() + rest);
        hint
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::Full;

    #[tokio::test]
    async fn large_frames_are_handed_in_chunks_and_a_handed_frame_counts_as_waiting() {
        let watch = Watch::new();
        let body = Full::new(Bytes::from(vec![7u8; 40 * 1024]))
            .map_err(|e: std::convert::Infallible| -> BoxError { match e {} })
            .boxed_unsync();
        let mut body = watched(body, watch.open());
        let mut sizes = Vec::new();
        while let Some(f) = body.frame().await {
            let f = f.expect("frame");
            sizes.push(f.data_ref().map_or(0, |d| d.len()));
            assert!(watch.stalled(Duration::ZERO), "handed, not asked again yet");
        }
        assert_eq!(sizes, [16 * 1024, 16 * 1024, 8 * 1024]);
        assert!(!watch.stalled(Duration::ZERO), "ended: waiting for nothing");
        assert_eq!(watch.active.borrow().0, 1);
        drop(body);
        assert_eq!(
            watch.active.borrow().0,
            0,
            "the stream closed with its body"
        );
    }
}
