//! # hearth-body
//!
//! The HTTP bodies a hearth node passes around, defined once.
//!
//! A request enters at the front door, may cross the cluster layer to the
//! Worker's home and back, and is served by the runtime; its response goes
//! the same way back. The runtime (`hearth-runtime`) and the cluster layer
//! (`hearth-sharding`) do not depend on each other, so the body type they
//! share, and the few helpers every layer needs, live here:
//!
//! * [`Body`]: a boxed, streamed body of [`Bytes`] whose errors are
//!   [`BoxError`]s. It is `Send` but not `Sync`, because wasi:http's
//!   response bodies are not `Sync`.
//! * [`full`], [`empty`], [`boxed`] and [`text_response`]: bodies and
//!   replies the host makes itself (errors, admin answers, the bodies of
//!   requests that travelled whole between nodes).
//! * [`Replay`]: a body that was partly read before its consumer was known
//!   (to decide whether it is small, whether a client trickles it, or to
//!   send its start to another node speculatively) is handed on as what was
//!   read, then the rest, so no byte is lost or repeated. Every "replay the
//!   start, then the rest" in the node is this one type.
//!
//! The combinators themselves are `http-body-util`'s ([`BodyExt`],
//! `Full`, `Empty`, `StreamBody`, `Limited`); this crate only names the
//! node's choices.

use std::collections::VecDeque;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::Frame;
use http_body_util::BodyExt;
use http_body_util::combinators::UnsyncBoxBody;

/// Any error a body stream can carry across crates.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Request and response bodies: streamed, `Send`, not `Sync` (wasi:http's
/// response bodies are not).
pub type Body = UnsyncBoxBody<Bytes, BoxError>;

/// A complete body holding `bytes`.
pub fn full(bytes: impl Into<Bytes>) -> Body {
    http_body_util::Full::new(bytes.into())
        .map_err(|never| match never {})
        .boxed_unsync()
}

/// A complete body with no bytes.
pub fn empty() -> Body {
    http_body_util::Empty::new()
        .map_err(|never| match never {})
        .boxed_unsync()
}

/// Converts any streaming body of [`Bytes`] into a [`Body`].
pub fn boxed<B>(body: B) -> Body
where
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    body.map_err(Into::into).boxed_unsync()
}

/// A plain-text response with `status` and exactly `msg` as its body, for
/// replies the host makes itself (errors, admin answers).
pub fn text_response(status: http::StatusCode, msg: impl Into<String>) -> http::Response<Body> {
    let mut r = http::Response::new(full(msg.into()));
    *r.status_mut() = status;
    r.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    r
}

/// A body whose first frames were already read: those frames again, then
/// how the body went on (the rest of it, its end, or the error it met).
///
/// Its size hint is the default (unknown), as the bodies it replaced had:
/// a replayed response streams as it did before it was looked at.
pub struct Replay {
    read: VecDeque<Frame<Bytes>>,
    then: Then,
}

/// What a [`Replay`] yields after the frames it replays.
enum Then {
    /// The body ended with the frames.
    End,
    /// The body failed after the frames.
    Fail(BoxError),
    /// The body goes on.
    Rest(Body),
}

impl Replay {
    /// `read`, then the rest of the body, `rest`.
    pub fn new(read: impl IntoIterator<Item = Frame<Bytes>>, rest: Body) -> Self {
        Replay {
            read: read.into_iter().collect(),
            then: Then::Rest(rest),
        }
    }

    /// `read`, which was the whole body.
    pub fn complete(read: impl IntoIterator<Item = Frame<Bytes>>) -> Self {
        Replay {
            read: read.into_iter().collect(),
            then: Then::End,
        }
    }

    /// `read`, then `error`: the body failed after those frames, and still
    /// does when replayed (it is never mistaken for a shorter, complete one).
    pub fn failed(read: impl IntoIterator<Item = Frame<Bytes>>, error: BoxError) -> Self {
        Replay {
            read: read.into_iter().collect(),
            then: Then::Fail(error),
        }
    }

    /// Boxes it as a [`Body`].
    pub fn boxed(self) -> Body {
        Body::new(self)
    }
}

impl http_body::Body for Replay {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = &mut *self;
        if let Some(frame) = this.read.pop_front() {
            return Poll::Ready(Some(Ok(frame)));
        }
        match std::mem::replace(&mut this.then, Then::End) {
            Then::End => Poll::Ready(None),
            Then::Fail(error) => Poll::Ready(Some(Err(error))),
            Then::Rest(mut rest) => {
                let polled = Pin::new(&mut rest).poll_frame(cx);
                this.then = Then::Rest(rest);
                polled
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.read.is_empty()
            && match &self.then {
                Then::End => true,
                Then::Fail(_) => false,
                Then::Rest(rest) => rest.is_end_stream(),
            }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use http_body::Body as _;

    fn data(chunks: &[&'static [u8]]) -> Vec<Frame<Bytes>> {
        chunks
            .iter()
            .map(|c| Frame::data(Bytes::from_static(c)))
            .collect()
    }

    #[tokio::test]
    async fn a_replay_yields_what_was_read_then_the_rest() {
        let body = Replay::new(data(&[b"ab", b"cd"]), full("ef")).boxed();
        let got = body.collect().await.expect("collect").to_bytes();
        assert_eq!(&got[..], b"abcdef");
    }

    #[tokio::test]
    async fn a_complete_replay_ends_after_its_frames() {
        let mut body = Replay::complete(data(&[b"whole"]));
        assert!(!body.is_end_stream());
        let first = body.frame().await.expect("frame").expect("data");
        assert_eq!(first.into_data().ok(), Some(Bytes::from_static(b"whole")));
        assert!(body.is_end_stream());
        assert!(body.frame().await.is_none());
        assert!(Replay::complete(Vec::new()).is_end_stream());
    }

    #[tokio::test]
    async fn a_failed_body_fails_again_after_its_bytes() {
        let mut body = Replay::failed(data(&[b"part"]), "upload cut".into());
        let first = body.frame().await.expect("frame").expect("data");
        assert_eq!(first.into_data().ok(), Some(Bytes::from_static(b"part")));
        assert!(!body.is_end_stream(), "an error is still to come");
        let err = body.frame().await.expect("frame").expect_err("error");
        assert!(err.to_string().contains("upload cut"), "{err}");
        assert!(body.frame().await.is_none());
        assert!(body.is_end_stream());
    }

    #[tokio::test]
    async fn the_rest_decides_the_end() {
        let still_open = Replay::new(Vec::new(), full("x"));
        assert!(!still_open.is_end_stream());
        let ended = Replay::new(Vec::new(), empty());
        assert!(ended.is_end_stream());
    }

    #[tokio::test]
    async fn helpers_make_complete_bodies() {
        let r = text_response(http::StatusCode::NOT_FOUND, "nope\n");
        assert_eq!(r.status(), http::StatusCode::NOT_FOUND);
        assert_eq!(
            r.headers().get(http::header::CONTENT_TYPE).expect("type"),
            "text/plain; charset=utf-8"
        );
        let got = r.into_body().collect().await.expect("collect").to_bytes();
        assert_eq!(&got[..], b"nope\n");
        assert!(empty().is_end_stream());
        let b = boxed(http_body_util::Full::new(Bytes::from_static(b"y")));
        assert_eq!(&b.collect().await.expect("collect").to_bytes()[..], b"y");
    }
}
