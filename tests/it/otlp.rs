//! OpenTelemetry export of request spans (`hearth::telemetry`) on 2 real
//! nodes: an OTLP/HTTP collector runs in the test on 127.0.0.1 and decodes
//! what the nodes POST as `ExportTraceServiceRequest` protobuf (with
//! prost and the field numbers of opentelemetry-proto's `trace/v1`, written
//! out below, independently of the nodes' encoder). A sharded request that
//! makes a nested call must give one trace across both nodes, linked front
//! → home → call → nested Worker, under a client's `traceparent` when it
//! sends one; a node without telemetry sends nothing.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use hearth::runtime::Manifest;
use hearth::telemetry::{Telemetry, TelemetryConfig};
use hearth::testing::{TestCluster, eventually};
use http_body_util::BodyExt;
use prost::Message;

// ------------------------------------------------ the OTLP messages (decode)

#[derive(Clone, PartialEq, Message)]
struct ExportTraceServiceRequest {
    #[prost(message, repeated, tag = "1")]
    resource_spans: Vec<ResourceSpans>,
}

#[derive(Clone, PartialEq, Message)]
struct ResourceSpans {
    #[prost(message, optional, tag = "1")]
    resource: Option<Resource>,
    #[prost(message, repeated, tag = "2")]
    scope_spans: Vec<ScopeSpans>,
}

#[derive(Clone, PartialEq, Message)]
struct Resource {
    #[prost(message, repeated, tag = "1")]
    attributes: Vec<KeyValue>,
}

#[derive(Clone, PartialEq, Message)]
struct ScopeSpans {
    #[prost(message, optional, tag = "1")]
    scope: Option<InstrumentationScope>,
    #[prost(message, repeated, tag = "2")]
    spans: Vec<Span>,
}

#[derive(Clone, PartialEq, Message)]
struct InstrumentationScope {
    #[prost(string, tag = "1")]
    name: String,
}

#[derive(Clone, PartialEq, Message)]
struct Span {
    #[prost(bytes = "vec", tag = "1")]
    trace_id: Vec<u8>,
    #[prost(bytes = "vec", tag = "2")]
    span_id: Vec<u8>,
    #[prost(bytes = "vec", tag = "4")]
    parent_span_id: Vec<u8>,
    #[prost(string, tag = "5")]
    name: String,
    #[prost(int32, tag = "6")]
    kind: i32,
    #[prost(fixed64, tag = "7")]
    start_time_unix_nano: u64,
    #[prost(fixed64, tag = "8")]
    end_time_unix_nano: u64,
    #[prost(message, repeated, tag = "9")]
    attributes: Vec<KeyValue>,
}

#[derive(Clone, PartialEq, Message)]
struct KeyValue {
    #[prost(string, tag = "1")]
    key: String,
    #[prost(message, optional, tag = "2")]
    value: Option<AnyValue>,
}

#[derive(Clone, PartialEq, Message)]
struct AnyValue {
    #[prost(oneof = "Value", tags = "1, 3")]
    value: Option<Value>,
}

#[derive(Clone, PartialEq, prost::Oneof)]
enum Value {
    #[prost(string, tag = "1")]
    Str(String),
    #[prost(int64, tag = "3")]
    Int(i64),
}

/// A span as the collector got it, with the node that sent it.
#[derive(Debug, Clone)]
struct Got {
    node: String,
    trace_id: String,
    span_id: String,
    parent: String,
    name: String,
    kind: i32,
    attrs: HashMap<String, String>,
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn attrs(kvs: &[KeyValue]) -> HashMap<String, String> {
    kvs.iter()
        .map(|kv| {
            let v = match kv.value.as_ref().and_then(|v| v.value.clone()) {
                Some(Value::Str(s)) => s,
                Some(Value::Int(i)) => i.to_string(),
                None => String::new(),
            };
            (kv.key.clone(), v)
        })
        .collect()
}

/// An OTLP/HTTP collector on 127.0.0.1: every POST body decoded into
/// `spans` (and the request's content type checked).
async fn collector() -> (SocketAddr, Arc<Mutex<Vec<Got>>>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let spans = Arc::new(Mutex::new(Vec::new()));
    let out = spans.clone();
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                return;
            };
            let spans = spans.clone();
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(move |req: http::Request<_>| {
                    let spans = spans.clone();
                    async move {
                        assert_eq!(req.uri().path(), "/v1/traces");
                        assert_eq!(req.headers()["content-type"], "application/x-protobuf");
                        let body: hyper::body::Incoming = req.into_body();
                        let bytes = body.collect().await?.to_bytes();
                        let export =
                            ExportTraceServiceRequest::decode(bytes).expect("OTLP protobuf");
                        let mut got = spans.lock().expect("lock");
                        for rs in export.resource_spans {
                            let resource = attrs(&rs.resource.expect("resource").attributes);
                            assert_eq!(resource["service.name"], "hearth-test");
                            for ss in rs.scope_spans {
                                assert_eq!(ss.scope.expect("scope").name, "hearth");
                                for s in ss.spans {
                                    assert!(s.end_time_unix_nano >= s.start_time_unix_nano);
                                    assert!(s.start_time_unix_nano > 0);
                                    got.push(Got {
                                        node: resource["service.instance.id"].clone(),
                                        trace_id: hex(&s.trace_id),
                                        span_id: hex(&s.span_id),
                                        parent: hex(&s.parent_span_id),
                                        name: s.name,
                                        kind: s.kind,
                                        attrs: attrs(&s.attributes),
                                    });
                                }
                            }
                        }
                        Ok::<_, hyper::Error>(http::Response::new(http_body_util::Full::new(
                            Bytes::new(),
                        )))
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    (addr, out)
}

fn sample(name: &str) -> Vec<u8> {
    hearth_sample_workers::bytes(name).expect("sample built")
}

/// Two script IDs with the given prefix whose homes are nodes 0 and 1.
fn one_name_per_home(c: &TestCluster, prefix: &str) -> [String; 2] {
    let mut out: [Option<String>; 2] = [None, None];
    for k in 0..1000 {
        let name = format!("{prefix}-{k}");
        let home = c.home_of(&name).expect("home");
        out[home].get_or_insert(name);
        if let [Some(a), Some(b)] = &out {
            return [a.clone(), b.clone()];
        }
    }
    panic!("no names on both homes");
}

fn spans_of(spans: &Mutex<Vec<Got>>, trace_id: &str) -> Vec<Got> {
    spans
        .lock()
        .expect("lock")
        .iter()
        .filter(|s| s.trace_id == trace_id)
        .cloned()
        .collect()
}

/// The one span named `name` for Worker `script` in `spans`.
fn find<'a>(spans: &'a [Got], name: &str, script: &str) -> &'a Got {
    let found: Vec<_> = spans
        .iter()
        .filter(|s| s.name == name && s.attrs["hearth.script"] == script)
        .collect();
    assert_eq!(found.len(), 1, "one {name} for {script} in {spans:#?}");
    found[0]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_trace_links_the_front_the_home_and_the_nested_worker() {
    let (addr, spans) = collector().await;
    let c = TestCluster::start(2).await.expect("cluster");
    // `outer` is homed on node 1 and calls `inner`, homed on node 0.
    let [inner, outer] = one_name_per_home(&c, "otlp");
    let mut m = Manifest::default();
    m.bindings.services.insert("next".into(), inner.clone());
    c.deploy_manifest(&outer, m, sample("relay"))
        .await
        .expect("deploy");
    c.deploy_manifest(&inner, Manifest::default(), sample("relay"))
        .await
        .expect("deploy");

    // Telemetry off (the default): a traced request sends nothing, and
    // turning it on later does not send what ran before.
    let off_trace = "0af7651916cd43dd8448eb211c80319c";
    let r = c
        .send(
            0,
            &outer,
            http::Method::GET,
            "/",
            Bytes::new(),
            &[(
                "traceparent",
                &format!("00-{off_trace}-b7ad6b7169203331-01"),
            )],
        )
        .await
        .expect("request");
    assert_eq!(r.status, 200, "{}", r.text());

    let ids: Vec<String> = (0..2).map(|i| c.node(i).node.id().to_string()).collect();
    for i in 0..2 {
        let node = &c.node(i).node;
        let mut cfg = TelemetryConfig::new(format!("http://{addr}/v1/traces"));
        cfg.service_name = "hearth-test".into();
        cfg.export_interval = Duration::from_millis(20);
        let t = Telemetry::start(cfg, node.id(), node.metrics().otel.clone()).expect("start");
        node.set_telemetry(t);
    }

    // A client's sampled traceparent: its trace ID is kept, and the
    // request's span is its child. Node 0 is the front; `outer` runs at
    // its home, node 1, and its nested call of `inner` comes back to
    // node 0.
    let client_trace = "4bf92f3577b34da6a3ce929d0e0e4736";
    let client_span = "00f067aa0ba902b7";
    let r = c
        .send(
            0,
            &outer,
            http::Method::POST,
            "/some/path?q=1",
            Bytes::from_static(b"hi"),
            &[(
                "traceparent",
                &format!("00-{client_trace}-{client_span}-01"),
            )],
        )
        .await
        .expect("request");
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.text(), format!("{outer} > {inner}"));
    assert_eq!(r.header("x-hearth-route"), "sharded");

    assert!(
        eventually(Duration::from_secs(10), || spans_of(&spans, client_trace)
            .len()
            >= 4)
        .await,
        "four spans of the client's trace: {:#?}",
        spans.lock().expect("lock")
    );
    let got = spans_of(&spans, client_trace);
    assert_eq!(got.len(), 4, "{got:#?}");
    let request = find(&got, "hearth.request", &outer);
    let home = find(&got, "hearth.worker", &outer);
    let call = find(&got, "hearth.call", &inner);
    let nested = find(&got, "hearth.worker", &inner);
    // front (node 0) -> home (node 1) -> its call (node 1) -> nested (node 0)
    assert_eq!(
        request.parent, client_span,
        "the client's span is the parent"
    );
    assert_eq!(request.node, ids[0]);
    assert_eq!(home.parent, request.span_id);
    assert_eq!(home.node, ids[1]);
    assert_eq!(call.parent, home.span_id);
    assert_eq!(call.node, ids[1]);
    assert_eq!(nested.parent, call.span_id);
    assert_eq!(nested.node, ids[0]);
    let distinct: std::collections::HashSet<_> = got.iter().map(|s| &s.span_id).collect();
    assert_eq!(distinct.len(), 4, "every span has its own ID");
    // Attributes and kinds (server 2, client 3).
    assert_eq!(request.kind, 2);
    assert_eq!(call.kind, 3);
    assert_eq!(request.attrs["hearth.route"], "sharded");
    assert_eq!(request.attrs["http.request.method"], "POST");
    assert_eq!(request.attrs["url.path"], "/some/path");
    assert_eq!(request.attrs["http.response.status_code"], "200");
    assert_eq!(home.attrs["hearth.route"], "sharded");
    assert_eq!(home.attrs["hearth.depth"], "0");
    assert_eq!(call.attrs["hearth.caller"], outer);
    assert_eq!(call.attrs["hearth.call"], "service");
    assert_eq!(nested.attrs["hearth.depth"], "1");

    // The Worker sees its own span as its `traceparent` (so what it sends
    // on joins the trace): `echo` returns request headers as `x-echo-*`.
    c.deploy("echo", hearth::runtime::Plan::Free, sample("echo"))
        .await
        .expect("deploy");
    let echo_trace = "33333333333333333333333333333333";
    let r = c
        .send(
            0,
            "echo",
            http::Method::GET,
            "/",
            Bytes::new(),
            &[("traceparent", &format!("00-{echo_trace}-{client_span}-01"))],
        )
        .await
        .expect("request");
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(
        eventually(Duration::from_secs(10), || spans_of(&spans, echo_trace)
            .len()
            >= 2)
        .await
    );
    let echoed = spans_of(&spans, echo_trace);
    let worker = find(&echoed, "hearth.worker", "echo");
    assert_eq!(
        r.header("x-echo-traceparent"),
        format!("00-{echo_trace}-{}-01", worker.span_id)
    );

    // Without a traceparent the front starts a trace of its own: still one
    // trace ID on both nodes.
    let r = c.get(0, &outer, "/").await.expect("request");
    assert_eq!(r.status, 200, "{}", r.text());
    let root_trace = || {
        spans
            .lock()
            .expect("lock")
            .iter()
            .find(|s| s.name == "hearth.request" && s.parent.is_empty())
            .map(|s| s.trace_id.clone())
    };
    assert!(eventually(Duration::from_secs(10), || root_trace().is_some()).await);
    let trace = root_trace().expect("a root span");
    assert_ne!(trace, client_trace);
    assert!(
        eventually(Duration::from_secs(10), || spans_of(&spans, &trace).len()
            >= 4)
        .await,
        "{:#?}",
        spans.lock().expect("lock")
    );
    let nodes: std::collections::HashSet<_> = spans_of(&spans, &trace)
        .into_iter()
        .map(|s| s.node)
        .collect();
    assert_eq!(nodes.len(), 2, "spans from both nodes");

    // A client's trace that is not sampled is not recorded anywhere.
    let unsampled = "11111111111111111111111111111111";
    let r = c
        .send(
            0,
            &outer,
            http::Method::GET,
            "/",
            Bytes::new(),
            &[("traceparent", &format!("00-{unsampled}-{client_span}-00"))],
        )
        .await
        .expect("request");
    assert_eq!(r.status, 200);
    // A sampled request after it: once its spans are in, the unsampled
    // one's would have been too.
    let last = "22222222222222222222222222222222";
    c.send(
        0,
        &outer,
        http::Method::GET,
        "/",
        Bytes::new(),
        &[("traceparent", &format!("00-{last}-{client_span}-01"))],
    )
    .await
    .expect("request");
    assert!(
        eventually(Duration::from_secs(10), || spans_of(&spans, last).len()
            >= 4)
        .await
    );
    assert!(spans_of(&spans, unsampled).is_empty());
    assert!(spans_of(&spans, off_trace).is_empty(), "sent while off");
    // Counted in /metrics: every span the collector took, none dropped.
    let exported = || -> u64 {
        (0..2)
            .map(|i| c.node(i).node.metrics().otel.exported.get())
            .sum()
    };
    assert!(
        eventually(Duration::from_secs(10), || exported() as usize
            == spans.lock().expect("lock").len())
        .await,
        "{} exported",
        exported()
    );
    let metrics = c.node(0).node.metrics().render();
    assert!(
        metrics.contains("hearth_otel_spans_dropped_total 0"),
        "{metrics}"
    );
}
