//! OpenTelemetry export of request spans (OTLP over HTTP/protobuf), off
//! unless a node's config has a `[telemetry]` section.
//!
//! # The model
//!
//! One trace per request flow, the same trace ID on every node it reaches:
//!
//! * `hearth.request` (kind server): the request at the node whose front
//!   door took it, from its head to the response head. Its parent is the
//!   client's `traceparent` header when that is valid (a parent that is not
//!   sampled is honoured: nothing is recorded); otherwise it starts a trace,
//!   sampled at `sample_ratio`.
//! * `hearth.worker` (kind server): a Worker's run on the node that ran it
//!   (here, at its home after the shard hop, or a nested Worker wherever it
//!   was served), a child of the span that asked for it. The Worker's
//!   request carries this span as its `traceparent` header (the client's
//!   is replaced), so what the Worker sends on with it joins the trace.
//! * `hearth.call` (kind client): a Worker's call of a Worker (a service
//!   binding, dynamic dispatch, an outbound Worker), on the caller's node,
//!   a child of the caller's `hearth.worker`; the callee's `hearth.worker`
//!   is its child.
//!
//! The span a request runs under travels as a
//! [`TraceParent`] in the request's
//! [`ContextStack`](hearth_sharding::context_stack::ContextStack): inside a
//! node in the request's extensions, across the shard hop in the stack's
//! Cap'n Proto form. Nothing else is trusted: `x-hearth-*` headers are
//! stripped at the front door, and only the W3C `traceparent` header of a
//! client is read.
//!
//! # Export
//!
//! A finished span is a small struct sent to a bounded queue with
//! `try_send`: a full queue drops the span (counted in
//! `hearth_otel_spans_dropped_total`), a request never waits. One
//! background task batches the queue and POSTs each batch as an
//! `ExportTraceServiceRequest` (protobuf, encoded here: the few messages
//! of the OTLP trace schema a span needs, so no protobuf or OpenTelemetry
//! crates are linked) to the endpoint, over the node's hyper client
//! (rustls with ring for `https://`). A failed export loses its batch
//! (counted); it is not retried.
//!
//! Off, a node has no [`Telemetry`]: no span is built, no ID drawn.

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use hearth_sharding::context_stack::TraceParent;
use http_body_util::Full;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use prometheus_client::metrics::counter::Counter;
use tokio::sync::mpsc;

/// The `traceparent` request header (W3C Trace Context).
pub const TRACEPARENT_HEADER: &str = "traceparent";

/// Where and how a node exports its spans (the config's `[telemetry]`).
#[derive(Debug, Clone)]
pub struct TelemetryConfig {
    /// The OTLP/HTTP traces URL, e.g. `http://127.0.0.1:4318/v1/traces`.
    pub endpoint: String,
    /// `service.name` of the spans' resource.
    pub service_name: String,
    /// Fraction of traces a node starts that are recorded (0.0 to 1.0).
    /// A client's `traceparent` decides for its own trace instead.
    pub sample_ratio: f64,
    /// Finished spans waiting for export; more are dropped.
    pub max_queue: usize,
    /// Most spans per export request.
    pub max_batch: usize,
    /// How long a span waits for its batch to fill before it is sent.
    pub export_interval: Duration,
    /// How long an export request may take.
    pub export_timeout: Duration,
}

impl TelemetryConfig {
    /// Export to `endpoint` with the defaults: service `hearth`, every
    /// trace sampled, 2048 spans queued, batches of 512 sent at least
    /// every second.
    pub fn new(endpoint: impl Into<String>) -> Self {
        TelemetryConfig {
            endpoint: endpoint.into(),
            service_name: "hearth".into(),
            sample_ratio: 1.0,
            max_queue: 2048,
            max_batch: 512,
            export_interval: Duration::from_secs(1),
            export_timeout: Duration::from_secs(10),
        }
    }
}

/// Why telemetry could not start.
#[derive(Debug, thiserror::Error)]
pub enum TelemetryError {
    /// The endpoint is not an `http://` or `https://` URL.
    #[error("telemetry endpoint {0:?} is not an http:// or https:// URL")]
    Endpoint(String),
}

/// The span export counters in `/metrics` (zero while telemetry is off).
#[derive(Debug, Clone, Default)]
pub struct ExportCounters {
    /// Spans the collector accepted (`hearth_otel_spans_exported`).
    pub exported: Counter,
    /// Spans dropped because the queue was full
    /// (`hearth_otel_spans_dropped`).
    pub dropped: Counter,
    /// Spans lost with an export request that failed
    /// (`hearth_otel_spans_failed`).
    pub failed: Counter,
}

/// A span's kind (OTLP `SpanKind`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SpanKind {
    /// The handling of a request from elsewhere.
    Server,
    /// A request to elsewhere.
    Client,
}

/// An attribute value.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    /// Text.
    Str(String),
    /// An integer.
    Int(i64),
}

impl From<&str> for Value {
    fn from(s: &str) -> Self {
        Value::Str(s.to_string())
    }
}

impl From<String> for Value {
    fn from(s: String) -> Self {
        Value::Str(s)
    }
}

impl From<i64> for Value {
    fn from(v: i64) -> Self {
        Value::Int(v)
    }
}

/// A span that has started: its context (what its children name as their
/// parent) and when it started. Finished with [`Telemetry::finish`].
#[derive(Debug)]
pub struct ActiveSpan {
    context: TraceParent,
    parent_span_id: u64,
    start_unix_ns: u64,
    started: Instant,
}

impl ActiveSpan {
    /// This span as the parent of its children.
    pub fn context(&self) -> TraceParent {
        self.context
    }
}

/// A finished span, queued for export.
struct SpanData {
    trace_id: u128,
    span_id: u64,
    parent_span_id: u64,
    name: &'static str,
    kind: SpanKind,
    start_unix_ns: u64,
    end_unix_ns: u64,
    attributes: Vec<(&'static str, Value)>,
    error: bool,
}

struct Inner {
    queue: mpsc::Sender<SpanData>,
    sample_ratio: f64,
    counters: ExportCounters,
}

/// A node's span recorder and exporter. Cheap to clone; the export task
/// stops when the last clone is dropped.
#[derive(Clone)]
pub struct Telemetry {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Telemetry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Telemetry")
            .field("sample_ratio", &self.inner.sample_ratio)
            .finish()
    }
}

impl Telemetry {
    /// Starts exporting the spans of node `node_id` as `cfg` says, counting
    /// in `counters`. Must run inside a tokio runtime (it spawns the export
    /// task).
    pub fn start(
        cfg: TelemetryConfig,
        node_id: &str,
        counters: ExportCounters,
    ) -> Result<Telemetry, TelemetryError> {
        let uri: http::Uri = cfg
            .endpoint
            .parse()
            .map_err(|_| TelemetryError::Endpoint(cfg.endpoint.clone()))?;
        if !matches!(uri.scheme_str(), Some("http" | "https")) || uri.host().is_none() {
            return Err(TelemetryError::Endpoint(cfg.endpoint.clone()));
        }
        let (tx, rx) = mpsc::channel(cfg.max_queue.max(1));
        let resource = encode_resource(&cfg.service_name, node_id);
        tokio::spawn(export_loop(
            cfg.clone(),
            uri,
            resource,
            rx,
            counters.clone(),
        ));
        Ok(Telemetry {
            inner: Arc::new(Inner {
                queue: tx,
                sample_ratio: cfg.sample_ratio.clamp(0.0, 1.0),
                counters,
            }),
        })
    }

    /// Starts the span of a request that entered at this node's front door
    /// with `headers`: a child of the client's valid `traceparent` if it has
    /// one (`None` if that trace is not sampled), else the root of a new
    /// trace, sampled at the configured ratio (`None` if not).
    pub fn start_request(&self, headers: &http::HeaderMap) -> Option<ActiveSpan> {
        let parent = headers
            .get(TRACEPARENT_HEADER)
            .and_then(|v| v.to_str().ok())
            .and_then(TraceParent::parse);
        match parent {
            Some(parent) if parent.sampled => Some(self.child(parent)),
            Some(_) => None,
            None => {
                let ratio = self.inner.sample_ratio;
                if ratio < 1.0 && rand::random::<f64>() >= ratio {
                    return None;
                }
                Some(start_span(nonzero_u128(), 0))
            }
        }
    }

    /// Starts a span that is a child of `parent` (`None` if its trace is not
    /// sampled).
    pub fn start_child(&self, parent: TraceParent) -> Option<ActiveSpan> {
        parent.sampled.then(|| self.child(parent))
    }

    fn child(&self, parent: TraceParent) -> ActiveSpan {
        start_span(parent.trace_id, parent.span_id)
    }

    /// Ends `span` now and queues it for export (dropped and counted if the
    /// queue is full). `error` sets the span's status to error.
    pub fn finish(
        &self,
        span: ActiveSpan,
        name: &'static str,
        kind: SpanKind,
        attributes: Vec<(&'static str, Value)>,
        error: bool,
    ) {
        let elapsed = u64::try_from(span.started.elapsed().as_nanos()).unwrap_or(u64::MAX);
        let data = SpanData {
            trace_id: span.context.trace_id,
            span_id: span.context.span_id,
            parent_span_id: span.parent_span_id,
            name,
            kind,
            start_unix_ns: span.start_unix_ns,
            end_unix_ns: span.start_unix_ns.saturating_add(elapsed),
            attributes,
            error,
        };
        if self.inner.queue.try_send(data).is_err() {
            self.inner.counters.dropped.inc();
        }
    }
}

/// The attributes every request and Worker span has, from the response:
/// `hearth.script`, `hearth.route` (the role it was served in: `local`,
/// `home`, `sharded`, `fallback`) and `http.response.status_code`.
pub(crate) fn response_attributes<B>(
    script_id: &str,
    resp: &http::Response<B>,
) -> Vec<(&'static str, Value)> {
    let route = resp
        .headers()
        .get(hearth_sharding::routing::ROUTE_HEADER)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    vec![
        ("hearth.script", script_id.into()),
        ("hearth.route", route.into()),
        (
            "http.response.status_code",
            i64::from(resp.status().as_u16()).into(),
        ),
    ]
}

fn start_span(trace_id: u128, parent_span_id: u64) -> ActiveSpan {
    let start_unix_ns = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX));
    ActiveSpan {
        context: TraceParent {
            trace_id,
            span_id: nonzero_u64(),
            sampled: true,
        },
        parent_span_id,
        start_unix_ns,
        started: Instant::now(),
    }
}

/// A random ID; 0 is not a valid trace or span ID.
fn nonzero_u128() -> u128 {
    rand::random::<u128>().max(1)
}

fn nonzero_u64() -> u64 {
    rand::random::<u64>().max(1)
}

type ExportClient = Client<hyper_rustls::HttpsConnector<HttpConnector>, Full<Bytes>>;

fn export_client() -> ExportClient {
    let tls = hearth_runtime::outbound::egress::tls_client_config(&[]);
    let connector = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_or_http()
        .enable_http1()
        .build();
    Client::builder(TokioExecutor::new()).build(connector)
}

/// Batches the queue and sends each batch; ends when every sender is gone
/// (after sending what is left).
async fn export_loop(
    cfg: TelemetryConfig,
    uri: http::Uri,
    resource: Vec<u8>,
    mut rx: mpsc::Receiver<SpanData>,
    counters: ExportCounters,
) {
    let client = export_client();
    let max_batch = cfg.max_batch.max(1);
    loop {
        // Wait for a first span, then for the batch to fill or the
        // interval to pass.
        let Some(first) = rx.recv().await else {
            return;
        };
        let mut batch = vec![first];
        let deadline = tokio::time::Instant::now() + cfg.export_interval;
        let mut open = true;
        while batch.len() < max_batch {
            match tokio::time::timeout_at(deadline, rx.recv()).await {
                Ok(Some(span)) => batch.push(span),
                Ok(None) => {
                    open = false;
                    break;
                }
                Err(_) => break,
            }
        }
        let n = batch.len() as u64;
        let body = encode_request(&resource, &batch);
        let sent = send(&client, &uri, body, cfg.export_timeout).await;
        match sent {
            Ok(()) => {
                counters.exported.inc_by(n);
            }
            Err(why) => {
                counters.failed.inc_by(n);
                tracing::warn!(spans = n, endpoint = %uri, "span export failed: {why}");
            }
        }
        if !open {
            return;
        }
    }
}

async fn send(
    client: &ExportClient,
    uri: &http::Uri,
    body: Vec<u8>,
    timeout: Duration,
) -> Result<(), String> {
    let req = http::Request::post(uri.clone())
        .header(http::header::CONTENT_TYPE, "application/x-protobuf")
        .body(Full::new(Bytes::from(body)))
        .map_err(|e| e.to_string())?;
    let resp = tokio::time::timeout(timeout, client.request(req))
        .await
        .map_err(|_| format!("no answer within {timeout:?}"))?
        .map_err(|e| e.to_string())?;
    if resp.status().is_success() {
        Ok(())
    } else {
        Err(format!("the collector answered {}", resp.status()))
    }
}

// ------------------------------------------------------------------ protobuf
//
// The messages of opentelemetry-proto's `collector/trace/v1` and
// `trace/v1` a span needs, with their field numbers:
//
// ExportTraceServiceRequest { repeated ResourceSpans resource_spans = 1; }
// ResourceSpans { Resource resource = 1; repeated ScopeSpans scope_spans = 2; }
// Resource      { repeated KeyValue attributes = 1; }
// ScopeSpans    { InstrumentationScope scope = 1; repeated Span spans = 2; }
// InstrumentationScope { string name = 1; string version = 2; }
// Span { bytes trace_id = 1; bytes span_id = 2; bytes parent_span_id = 4;
//        string name = 5; SpanKind kind = 6; fixed64 start_time_unix_nano = 7;
//        fixed64 end_time_unix_nano = 8; repeated KeyValue attributes = 9;
//        Status status = 15; }
// Status   { string message = 2; StatusCode code = 3; }  (UNSET 0, OK 1, ERROR 2)
// KeyValue { string key = 1; AnyValue value = 2; }
// AnyValue { oneof { string string_value = 1; int64 int_value = 3; } }
// SpanKind: SERVER 2, CLIENT 3.

const LEN: u8 = 2;
const VARINT: u8 = 0;
const FIXED64: u8 = 1;

fn varint(buf: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        buf.push((v as u8) | 0x80);
        v >>= 7;
    }
    buf.push(v as u8);
}

fn tag(buf: &mut Vec<u8>, field: u32, wire: u8) {
    varint(buf, (u64::from(field) << 3) | u64::from(wire));
}

fn bytes_field(buf: &mut Vec<u8>, field: u32, data: &[u8]) {
    tag(buf, field, LEN);
    varint(buf, data.len() as u64);
    buf.extend_from_slice(data);
}

fn key_value(buf: &mut Vec<u8>, field: u32, key: &str, value: &Value) {
    let mut any = Vec::new();
    match value {
        Value::Str(s) => bytes_field(&mut any, 1, s.as_bytes()),
        Value::Int(i) => {
            tag(&mut any, 3, VARINT);
            varint(&mut any, *i as u64);
        }
    }
    let mut kv = Vec::new();
    bytes_field(&mut kv, 1, key.as_bytes());
    bytes_field(&mut kv, 2, &any);
    bytes_field(buf, field, &kv);
}

/// The `Resource` message: `service.name` and `service.instance.id` (the
/// node's ID).
fn encode_resource(service_name: &str, node_id: &str) -> Vec<u8> {
    let mut r = Vec::new();
    key_value(&mut r, 1, "service.name", &service_name.into());
    key_value(&mut r, 1, "service.instance.id", &node_id.into());
    r
}

fn encode_span(buf: &mut Vec<u8>, s: &SpanData) {
    let mut m = Vec::new();
    bytes_field(&mut m, 1, &s.trace_id.to_be_bytes());
    bytes_field(&mut m, 2, &s.span_id.to_be_bytes());
    if s.parent_span_id != 0 {
        bytes_field(&mut m, 4, &s.parent_span_id.to_be_bytes());
    }
    bytes_field(&mut m, 5, s.name.as_bytes());
    tag(&mut m, 6, VARINT);
    varint(
        &mut m,
        match s.kind {
            SpanKind::Server => 2,
            SpanKind::Client => 3,
        },
    );
    tag(&mut m, 7, FIXED64);
    m.extend_from_slice(&s.start_unix_ns.to_le_bytes());
    tag(&mut m, 8, FIXED64);
    m.extend_from_slice(&s.end_unix_ns.to_le_bytes());
    for (k, v) in &s.attributes {
        key_value(&mut m, 9, k, v);
    }
    if s.error {
        let mut status = Vec::new();
        tag(&mut status, 3, VARINT);
        varint(&mut status, 2);
        bytes_field(&mut m, 15, &status);
    }
    bytes_field(buf, 2, &m);
}

/// An `ExportTraceServiceRequest` with one resource (this node) and one
/// scope (`hearth`) holding `spans`.
fn encode_request(resource: &[u8], spans: &[SpanData]) -> Vec<u8> {
    let mut scope = Vec::new();
    bytes_field(&mut scope, 1, b"hearth");
    bytes_field(&mut scope, 2, env!("CARGO_PKG_VERSION").as_bytes());
    let mut scope_spans = Vec::new();
    bytes_field(&mut scope_spans, 1, &scope);
    for s in spans {
        encode_span(&mut scope_spans, s);
    }
    let mut resource_spans = Vec::new();
    bytes_field(&mut resource_spans, 1, resource);
    bytes_field(&mut resource_spans, 2, &scope_spans);
    let mut out = Vec::new();
    bytes_field(&mut out, 1, &resource_spans);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn varints_are_little_endian_base_128() {
        let mut b = Vec::new();
        varint(&mut b, 300);
        assert_eq!(b, [0xac, 0x02]);
        let mut b = Vec::new();
        varint(&mut b, (-1i64) as u64);
        assert_eq!(b.len(), 10, "a negative int64 takes ten bytes");
    }

    #[test]
    fn a_client_traceparent_is_the_parent_and_its_sampling_is_honoured() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        rt.block_on(async {
            let t = Telemetry::start(
                TelemetryConfig::new("http://127.0.0.1:9/v1/traces"),
                "n1",
                ExportCounters::default(),
            )
            .expect("telemetry");
            let mut h = http::HeaderMap::new();
            h.insert(
                TRACEPARENT_HEADER,
                http::HeaderValue::from_static(
                    "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
                ),
            );
            let span = t.start_request(&h).expect("sampled");
            assert_eq!(span.context().trace_id, 0x4bf92f3577b34da6a3ce929d0e0e4736);
            assert_eq!(span.parent_span_id, 0x00f067aa0ba902b7);
            assert_ne!(span.context().span_id, 0x00f067aa0ba902b7);
            h.insert(
                TRACEPARENT_HEADER,
                http::HeaderValue::from_static(
                    "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00",
                ),
            );
            assert!(t.start_request(&h).is_none(), "not sampled upstream");
            let root = t.start_request(&http::HeaderMap::new()).expect("ratio 1");
            assert_eq!(root.parent_span_id, 0);
            assert!(
                Telemetry::start(
                    TelemetryConfig::new("udp://x"),
                    "n1",
                    ExportCounters::default()
                )
                .is_err()
            );
        });
    }
}
