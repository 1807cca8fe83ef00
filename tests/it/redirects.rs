//! Redirects never lead a Worker into its own bindings (issue 42.1): an
//! origin on 127.0.0.1 answers `302 location: http://auth.internal/`, and
//! a JS Worker bound to a dispatch-only `auth` Worker does
//! `return fetch(origin)`. The engine follows redirects (as `fetch` does by
//! default); the host removes a `Location` into `.internal` before any
//! guest sees it, so the client gets the origin's 302, never auth's body.
//! A Rust guest that reads redirects itself (`fetcher`) sees no such
//! `Location` either. Redirects from origin to origin still work.

use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use hearth::cluster::ClusterConfig;
use hearth::runtime::outbound::egress::EgressConfig;
use hearth::runtime::{Manifest, Plan};
use hearth::testing::{TestCluster, build_js};
use http_body_util::Full;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;

/// An origin: `/to-auth` redirects into the Worker's binding (with a few
/// spellings picked by `?v=`), `/to-hello` to its own `/hello`.
async fn origin() -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                return;
            };
            tokio::spawn(async move {
                let svc = service_fn(
                    move |req: http::Request<hyper::body::Incoming>| async move {
                        let location = match (req.uri().path(), req.uri().query()) {
                            ("/to-auth", Some("v=dot")) => "HTTP://AUTH.INTERNAL./".to_string(),
                            ("/to-auth", Some("v=encoded")) => {
                                "http://auth%2Einternal/".to_string()
                            }
                            ("/to-auth", Some("v=backslash")) => {
                                "http:\\\\auth.internal\\".to_string()
                            }
                            ("/to-auth", Some("v=relative")) => "//auth.internal/".to_string(),
                            ("/to-auth", _) => "http://auth.internal/".to_string(),
                            ("/to-hello", _) => format!("http://{addr}/hello"),
                            _ => String::new(),
                        };
                        let resp = if location.is_empty() {
                            http::Response::new(Full::new(Bytes::from_static(b"hello from origin")))
                        } else {
                            http::Response::builder()
                                .status(302)
                                .header("location", location)
                                .body(Full::new(Bytes::new()))
                                .expect("response")
                        };
                        Ok::<_, std::convert::Infallible>(resp)
                    },
                );
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    addr
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_origins_redirect_never_reaches_the_workers_bindings() {
    let origin = origin().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let mut cfg = ClusterConfig::new(1, dir.path());
    cfg.https = false;
    let egress = EgressConfig {
        allow_private_addresses: true,
        ..EgressConfig::default()
    };
    cfg.runtime = Arc::new(move |c| c.egress(egress.clone()));
    let c = TestCluster::with_config(cfg, None).await.expect("cluster");

    // auth: reachable only through a binding.
    let hello = hearth_sample_workers::bytes("hello").expect("sample built");
    let auth = Manifest {
        dispatch_only: true,
        ..Manifest::default()
    };
    c.deploy_manifest("auth-worker", auth, hello)
        .await
        .expect("deploy auth");

    let base = format!("http://{origin}");
    let mut m = Manifest::from(Plan::Free);
    m.bindings
        .services
        .insert("auth".into(), "auth-worker".into());
    m.bindings.allowed_hosts = vec![base.clone()];

    // The JS engine follows redirects, as fetch() does by default.
    let front = build_js(&format!(
        "export default {{ async fetch(request) {{\n\
           const u = new URL(request.url);\n\
           if (u.pathname === '/direct') return fetch('http://auth.internal/');\n\
           return fetch('{base}' + u.pathname + u.search);\n\
         }} }};\n"
    ))
    .expect("the JS Worker builds");
    c.deploy_manifest("front", m.clone(), front)
        .await
        .expect("deploy front");

    // The binding itself works when the Worker calls it.
    let direct = c.get(0, "front", "/direct").await.expect("GET");
    assert_eq!(direct.status, 200);
    assert_eq!(direct.body, "hello from auth-worker");

    for v in ["plain", "dot", "encoded", "backslash", "relative"] {
        let resp = c
            .get(0, "front", &format!("/to-auth?v={v}"))
            .await
            .expect("GET");
        assert_ne!(
            resp.body, "hello from auth-worker",
            "{v}: the redirect reached the binding"
        );
        assert_eq!(resp.status, 302, "{v}: the origin's answer, not followed");
        assert!(resp.headers.get("location").is_none(), "{v}");
    }
    // Origin to origin: followed as before.
    let hop = c.get(0, "front", "/to-hello").await.expect("GET");
    assert_eq!(
        (hop.status, hop.body.as_ref()),
        (200, &b"hello from origin"[..])
    );
    assert_eq!(c.stats(0).runtime.redirects_into_bindings, 5);

    // A Rust guest that reads redirects itself sees no Location into
    // .internal either (`fetcher` prints `<3xx> location=<url>`).
    let fetcher = hearth_sample_workers::bytes("fetcher").expect("sample built");
    c.deploy_manifest("fetcher", m, fetcher)
        .await
        .expect("deploy fetcher");
    let url = format!("{base}/to-auth");
    let out = c
        .send(
            0,
            "fetcher",
            http::Method::GET,
            "/",
            Bytes::new(),
            &[("x-fetch", &url)],
        )
        .await
        .expect("GET");
    let out = String::from_utf8_lossy(&out.body).to_string();
    assert!(out.starts_with("302"), "{out}");
    assert!(!out.contains("internal"), "{out}");
}
