//! [`AdminClient::tail`]: one node's live tail of a Worker
//! (`GET /v1/scripts/{id}/tail`), read as it streams.

use bytes::Bytes;
use http::Method;
use http_body_util::{BodyExt, Full};

use crate::{AdminClient, AdminError, query_value, with_causes};

pub use hearth_trace_event::{RequestEvent, TraceEvent};

/// What a tail stream may filter on and sample; see [`AdminClient::tail`].
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TailQuery {
    /// `5xx`, `4xx`, `404`, `ok`, `error` (all when `None`).
    pub status: Option<String>,
    /// The fraction of matching requests wanted, in `(0, 1]` (all when
    /// `None`).
    pub sample: Option<f64>,
    /// Only the requests of the node asked (`scope=node`); by default a
    /// clustered node gathers every member's (`scope=cluster`).
    pub node_only: bool,
}

/// One thing a tail stream said.
#[derive(Debug, Clone, PartialEq)]
pub enum TailItem {
    /// A finished request.
    Event(Box<RequestEvent>),
    /// The stream is alive; `dropped` events were lost so far because the
    /// client read too slowly.
    Keepalive {
        /// Events lost so far.
        dropped: u64,
    },
    /// Any other comment (the first names the node).
    Comment(String),
}

/// An open tail stream of one node; ends when the node ends it.
pub struct TailStream {
    body: http_body_util::combinators::UnsyncBoxBody<Bytes, BoxError>,
    buf: Vec<u8>,
    url: String,
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

impl std::fmt::Debug for TailStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TailStream")
            .field("url", &self.url)
            .finish()
    }
}

impl AdminClient {
    /// Opens the node's live tail of `script_id`: waits (within the
    /// client's timeout) for the node to accept, then streams.
    pub async fn tail(&self, script_id: &str, q: &TailQuery) -> Result<TailStream, AdminError> {
        let mut path = format!("/v1/scripts/{}/tail", query_value(script_id));
        let mut sep = '?';
        if let Some(s) = &q.status {
            path.push_str(&format!("{sep}status={}", query_value(s)));
            sep = '&';
        }
        if let Some(r) = q.sample {
            path.push_str(&format!("{sep}sample={r}"));
            sep = '&';
        }
        if q.node_only {
            path.push_str(&format!("{sep}scope=node"));
        }
        let token = self.token.as_deref().ok_or(AdminError::NoToken)?;
        let req = http::Request::builder()
            .method(Method::GET)
            .uri(format!("{}{path}", self.url))
            .header(http::header::AUTHORIZATION, format!("Bearer {token}"))
            .header(http::header::ACCEPT, "text/event-stream")
            .body(Full::new(Bytes::new()))
            .map_err(|e| AdminError::InvalidUrl {
                url: format!("{}{path}", self.url),
                reason: e.to_string(),
            })?;
        let resp = tokio::time::timeout(self.timeout, self.http.request(req))
            .await
            .map_err(|_| AdminError::Timeout {
                url: self.url.clone(),
                timeout: self.timeout,
            })?
            .map_err(|e| AdminError::Unreachable {
                url: self.url.clone(),
                error: with_causes(&e),
            })?;
        let status = resp.status();
        if !status.is_success() {
            let body = tokio::time::timeout(self.timeout, resp.into_body().collect())
                .await
                .ok()
                .and_then(Result::ok)
                .map(|c| String::from_utf8_lossy(&c.to_bytes()).trim().to_string())
                .unwrap_or_default();
            return Err(AdminError::Refused {
                method: Method::GET,
                url: self.url.clone(),
                path,
                status,
                body,
            });
        }
        Ok(TailStream {
            body: resp
                .into_body()
                .map_err(|e| Box::new(e) as BoxError)
                .boxed_unsync(),
            buf: Vec::new(),
            url: self.url.clone(),
        })
    }
}

impl TailStream {
    /// The next item, `None` once the node ended the stream, or why it
    /// broke.
    pub async fn next(&mut self) -> Option<Result<TailItem, AdminError>> {
        loop {
            while let Some(i) = self.buf.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = self.buf.drain(..=i).collect();
                let line = String::from_utf8_lossy(&line[..i]);
                if let Some(item) = self.parse_line(line.trim_end_matches('\r')) {
                    return Some(item);
                }
            }
            match self.body.frame().await {
                None => return None,
                Some(Err(e)) => {
                    return Some(Err(AdminError::Unreachable {
                        url: self.url.clone(),
                        error: with_causes(e.as_ref()),
                    }));
                }
                Some(Ok(frame)) => {
                    if let Ok(data) = frame.into_data() {
                        self.buf.extend_from_slice(&data);
                    }
                }
            }
        }
    }

    fn parse_line(&self, line: &str) -> Option<Result<TailItem, AdminError>> {
        if let Some(json) = line.strip_prefix("data:") {
            return Some(
                serde_json::from_str(json.trim_start())
                    .map(|e| TailItem::Event(Box::new(e)))
                    .map_err(|error| AdminError::Malformed {
                        url: self.url.clone(),
                        path: "/v1/scripts/{id}/tail".into(),
                        error,
                    }),
            );
        }
        let comment = line.strip_prefix(':')?;
        if let Some(n) = comment.strip_prefix("keepalive dropped=") {
            return Some(Ok(TailItem::Keepalive {
                dropped: n.trim().parse().unwrap_or(0),
            }));
        }
        Some(Ok(TailItem::Comment(comment.trim().to_string())))
    }
}
