//! A hearth node: the runtime, its metrics, and (in a cluster) the shard
//! client and server. The front door hands every request to
//! [`Node::handle`], which makes the routing decision and serves it.

use std::sync::Arc;

use hearth_runtime::body::Body;
use hearth_runtime::{Runtime, error_response};

use crate::metrics::Metrics;

/// Response header naming the node that served the request.
pub const NODE_HEADER: &str = "x-hearth-node";
/// Response header naming how the request was routed.
pub const ROUTE_HEADER: &str = "x-hearth-route";

/// One node. Cheap to clone.
#[derive(Clone)]
pub struct Node {
    inner: Arc<NodeInner>,
}

struct NodeInner {
    id: String,
    runtime: Runtime,
    metrics: Metrics,
}

impl Node {
    /// A standalone node over `runtime`.
    pub fn new(id: impl Into<String>, runtime: Runtime) -> Self {
        Node {
            inner: Arc::new(NodeInner {
                id: id.into(),
                metrics: Metrics::new(runtime.clone()),
                runtime,
            }),
        }
    }

    /// This node's ID.
    pub fn id(&self) -> &str {
        &self.inner.id
    }

    /// The node's runtime.
    pub fn runtime(&self) -> &Runtime {
        &self.inner.runtime
    }

    /// The node's metrics.
    pub fn metrics(&self) -> &Metrics {
        &self.inner.metrics
    }

    /// Serves `req` for `script_id`.
    pub async fn handle(&self, script_id: &str, req: http::Request<Body>) -> http::Response<Body> {
        let route = if self.inner.runtime.is_warm(script_id) {
            "local"
        } else {
            "home"
        };
        let (mut resp, start) = match self.inner.runtime.handle(script_id, req).await {
            Ok(s) => {
                let mut r = s.response;
                hearth_runtime::decorate(r.headers_mut(), s.start, &s.timing);
                (r, s.start.as_str())
            }
            Err(e) => (error_response(&e), "error"),
        };
        self.inner.metrics.record(route, start);
        self.stamp(&mut resp, route);
        resp
    }

    fn stamp(&self, resp: &mut http::Response<Body>, route: &'static str) {
        let h = resp.headers_mut();
        if let Ok(v) = http::HeaderValue::from_str(&self.inner.id) {
            h.insert(NODE_HEADER, v);
        }
        h.insert(ROUTE_HEADER, http::HeaderValue::from_static(route));
    }
}

/// The script ID a request is for: the first label of its Host
/// (`hello.localhost:8080` -> `hello`).
pub fn script_id_from_host(host: &str) -> Option<&str> {
    let host = host.split(':').next()?;
    let (label, rest) = host.split_once('.')?;
    (!label.is_empty() && !rest.is_empty()).then_some(label)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn script_id_is_first_host_label() {
        assert_eq!(script_id_from_host("hello.localhost:8080"), Some("hello"));
        assert_eq!(script_id_from_host("a.b.example.com"), Some("a"));
        assert_eq!(script_id_from_host("localhost:8080"), None);
        assert_eq!(script_id_from_host(".x"), None);
    }
}
