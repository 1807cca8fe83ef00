//! Small HTTP helpers shared by the front door, the admin API and tools.

use std::future::Future;
use std::net::SocketAddr;
use std::time::Duration;

use hearth_runtime::body::{self, Body};
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;

/// How long a client may take to send its request head.
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);

/// A plain-text response with `status` (the runtime's, so there is one).
pub use hearth_runtime::body::text_response as text;

/// A JSON response.
pub fn json(status: http::StatusCode, value: &impl serde::Serialize) -> http::Response<Body> {
    let bytes = serde_json::to_vec_pretty(value)
        .unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}").into_bytes());
    let mut r = http::Response::new(body::full(bytes));
    *r.status_mut() = status;
    r.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    r
}

/// Reads a whole body of at most `max` bytes.
pub async fn read_limited(mut body: Body, max: usize) -> Result<Vec<u8>, String> {
    use http_body_util::BodyExt;
    let mut out = Vec::new();
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| format!("reading the body failed: {e}"))?;
        if let Ok(data) = frame.into_data() {
            if out.len() + data.len() > max {
                return Err(format!("body is over the limit of {max} bytes"));
            }
            out.extend_from_slice(&data);
        }
    }
    Ok(out)
}

/// Serves HTTP/1.1 on `listener` with `handler` until `shutdown` resolves,
/// then waits for in-flight connections to finish. A client that is slow to
/// send its head is cut off after [`HEADER_READ_TIMEOUT`]; a client error
/// affects only its own connection.
pub async fn serve<H, F>(listener: TcpListener, handler: H, shutdown: impl Future<Output = ()>)
where
    H: Fn(http::Request<Body>, SocketAddr) -> F + Clone + Send + Sync + 'static,
    F: Future<Output = http::Response<Body>> + Send + 'static,
{
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    tokio::pin!(shutdown);
    loop {
        let (stream, peer) = tokio::select! {
            r = listener.accept() => match r {
                Ok(x) => x,
                Err(e) => {
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                }
            },
            _ = &mut shutdown => break,
        };
        let _ = stream.set_nodelay(true);
        let h = handler.clone();
        let svc = service_fn(move |req: http::Request<hyper::body::Incoming>| {
            let h = h.clone();
            async move { Ok::<_, std::convert::Infallible>(h(req.map(body::boxed), peer).await) }
        });
        let conn = hyper::server::conn::http1::Builder::new()
            .timer(TokioTimer::new())
            .header_read_timeout(HEADER_READ_TIMEOUT)
            .serve_connection(TokioIo::new(stream), svc);
        let conn = graceful.watch(conn);
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::debug!(%peer, error = %e, "connection ended with an error");
            }
        });
    }
    graceful.shutdown().await;
}
