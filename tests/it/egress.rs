//! Outbound fetch to origins on one real node (`hearth_runtime::outbound::egress`):
//! the `fetcher` sample (and the JS sample's plain `fetch()`) call a local
//! origin this test starts on 127.0.0.1. Allowed, denied (not on the
//! allow-list), private addresses refused by default (an IP literal and a
//! name that resolves to 127.0.0.1), redirects not followed, the timeout,
//! too many fetches in one request, and the response size cap.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use hearth::cluster::ClusterConfig;
use hearth::runtime::outbound::egress::EgressConfig;
use hearth::runtime::{Manifest, Plan};
use hearth::testing::TestCluster;
use http_body_util::Full;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;

fn sample(name: &str) -> Vec<u8> {
    hearth_sample_workers::bytes(name).expect("sample built")
}

/// A local origin: `/hello` answers `hello from origin`, `/slow` after
/// 5 s, `/redirect` is a 302 to `to` (another listener), `/big` is 64 KiB.
/// Counts the requests of each path.
struct Origin {
    addr: SocketAddr,
    hits: Arc<Mutex<HashMap<String, u32>>>,
}

impl Origin {
    async fn start(redirect_to: Option<SocketAddr>) -> Origin {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let hits: Arc<Mutex<HashMap<String, u32>>> = Arc::default();
        let counted = hits.clone();
        tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    return;
                };
                let hits = counted.clone();
                tokio::spawn(async move {
                    let svc = service_fn(move |req: http::Request<hyper::body::Incoming>| {
                        let hits = hits.clone();
                        async move {
                            let path = req.uri().path().to_string();
                            *hits.lock().expect("hits").entry(path.clone()).or_default() += 1;
                            let mut resp = http::Response::builder();
                            let body = match path.as_str() {
                                "/hello" => Bytes::from_static(b"hello from origin"),
                                "/slow" => {
                                    tokio::time::sleep(Duration::from_secs(5)).await;
                                    Bytes::from_static(b"late")
                                }
                                "/redirect" => {
                                    let to = redirect_to.unwrap_or(addr);
                                    resp = resp
                                        .status(302)
                                        .header("location", format!("http://{to}/hello"));
                                    Bytes::new()
                                }
                                "/big" => Bytes::from(vec![b'x'; 64 * 1024]),
                                _ => {
                                    resp = resp.status(404);
                                    Bytes::new()
                                }
                            };
                            resp.body(Full::new(body))
                        }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), svc)
                        .await;
                });
            }
        });
        Origin { addr, hits }
    }

    fn hits(&self, path: &str) -> u32 {
        self.hits
            .lock()
            .expect("hits")
            .get(path)
            .copied()
            .unwrap_or(0)
    }
}

/// One node with `egress` settings.
async fn node(egress: EgressConfig) -> (TestCluster, tempfile::TempDir) {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut cfg = ClusterConfig::new(1, dir.path());
    cfg.https = false;
    cfg.runtime = Arc::new(move |c| c.instance_pool_size(16).egress(egress.clone()));
    let c = TestCluster::with_config(cfg, None).await.expect("cluster");
    (c, dir)
}

/// Node settings that reach the local origin quickly.
fn private_allowed() -> EgressConfig {
    EgressConfig {
        allow_private_addresses: true,
        first_byte_timeout: Duration::from_millis(300),
        max_response_size: 16 * 1024,
        ..EgressConfig::default()
    }
}

fn allowing(plan: Plan, hosts: &[String]) -> Manifest {
    let mut m = Manifest::from(plan);
    m.bindings.allowed_hosts = hosts.to_vec();
    m
}

/// What `fetcher` answers for `count` fetches of `url`.
async fn fetch(c: &TestCluster, worker: &str, url: &str, count: u32) -> String {
    let count = count.to_string();
    let r = c
        .send(
            0,
            worker,
            http::Method::GET,
            "/",
            Bytes::new(),
            &[("x-fetch", url), ("x-fetch-count", &count)],
        )
        .await
        .expect("request");
    assert_eq!(r.status, 200, "{}", r.text());
    r.text()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn allowed_origins_are_fetched_and_every_other_host_is_denied() {
    let other = Origin::start(None).await;
    let origin = Origin::start(Some(other.addr)).await;
    let (c, _dir) = node(private_allowed()).await;
    let base = format!("http://{}", origin.addr);
    c.deploy_manifest(
        "fetcher",
        allowing(Plan::Free, std::slice::from_ref(&base)),
        sample("fetcher"),
    )
    .await
    .expect("deploy");

    assert_eq!(
        fetch(&c, "fetcher", &format!("{base}/hello"), 1).await,
        "200 hello from origin\n"
    );
    // Not on the list: another port, another name for the same address.
    for url in [
        format!("http://{}/hello", other.addr),
        format!("http://localhost:{}/hello", origin.addr.port()),
        format!("https://{}/hello", origin.addr),
    ] {
        let out = fetch(&c, "fetcher", &url, 1).await;
        assert!(out.starts_with("error request denied"), "{url}: {out}");
    }
    // The guest sees the redirect; the host does not follow it.
    let out = fetch(&c, "fetcher", &format!("{base}/redirect"), 1).await;
    assert_eq!(out, format!("302 location=http://{}/hello\n", other.addr));
    assert_eq!(other.hits("/hello"), 0, "a redirect is not followed");
    assert_eq!(origin.hits("/hello"), 1);

    let s = c.stats(0).runtime.subrequests;
    assert_eq!((s.ok, s.denied), (2, 3), "{s:?}");

    // A bad allow-list is refused at deploy, with the reason.
    let err = c
        .deploy_manifest(
            "fetcher-bad",
            allowing(Plan::Free, &["https://*".into()]),
            sample("fetcher"),
        )
        .await
        .expect_err("a bare * is refused");
    assert!(err.to_string().contains("bare *"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn private_addresses_are_refused_by_default() {
    let origin = Origin::start(None).await;
    let (c, _dir) = node(EgressConfig::default()).await;
    let port = origin.addr.port();
    let hosts = [
        format!("http://127.0.0.1:{port}"),
        format!("http://localhost:{port}"),
        format!("http://[::1]:{port}"),
    ];
    c.deploy_manifest("fetcher", allowing(Plan::Free, &hosts), sample("fetcher"))
        .await
        .expect("deploy");
    for host in &hosts {
        let out = fetch(&c, "fetcher", &format!("{host}/hello"), 1).await;
        assert_eq!(
            out, "error HTTP error: ErrorCode::DestinationIpProhibited\n",
            "{host} is allowed by the Worker but private"
        );
    }
    assert_eq!(origin.hits("/hello"), 0, "nothing reached the origin");
    assert_eq!(c.stats(0).runtime.subrequests.private_address, 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limits_fail_the_fetch_with_an_error_the_worker_reads() {
    let origin = Origin::start(None).await;
    let (c, _dir) = node(private_allowed()).await;
    let base = format!("http://{}", origin.addr);
    c.deploy_manifest(
        "fetcher",
        allowing(Plan::Free, std::slice::from_ref(&base)),
        sample("fetcher"),
    )
    .await
    .expect("deploy");

    // A free-plan request fetches 50 origins at most.
    let out = fetch(&c, "fetcher", &format!("{base}/hello"), 52).await;
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 52);
    assert!(lines[..50].iter().all(|l| *l == "200 hello from origin"));
    assert_eq!(
        lines[50],
        "error HTTP error: ErrorCode::ConnectionLimitReached"
    );
    assert_eq!(origin.hits("/hello"), 50);
    // The count is per request.
    assert_eq!(
        fetch(&c, "fetcher", &format!("{base}/hello"), 1).await,
        "200 hello from origin\n"
    );

    // No response head within the first-byte timeout (300 ms here).
    let out = fetch(&c, "fetcher", &format!("{base}/slow"), 1).await;
    assert_eq!(out, "error the flow's deadline passed\n");

    // A 64 KiB body over a 16 KiB cap.
    let out = fetch(&c, "fetcher", &format!("{base}/big"), 1).await;
    assert!(
        out.starts_with("error HTTP error: ErrorCode::HttpResponseBodySize"),
        "{out}"
    );

    let s = c.stats(0).runtime.subrequests;
    assert_eq!((s.too_many, s.timeout, s.too_large), (2, 1, 1), "{s:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_js_worker_fetches_an_allowed_origin_with_plain_fetch() {
    let origin = Origin::start(None).await;
    let (c, _dir) = node(private_allowed()).await;
    let base = format!("http://{}", origin.addr);
    c.deploy_manifest(
        "js",
        allowing(Plan::Paid, std::slice::from_ref(&base)),
        sample("js"),
    )
    .await
    .expect("deploy");
    let ask = |url: String| {
        let c = &c;
        async move {
            let r = c
                .send(
                    0,
                    "js",
                    http::Method::GET,
                    "/",
                    Bytes::new(),
                    &[("x-js-fetch", &url)],
                )
                .await
                .expect("request");
            assert_eq!(r.status, 200, "{}", r.text());
            serde_json::from_slice::<serde_json::Value>(&r.body).expect("json")
        }
    };
    let v = ask(format!("{base}/hello")).await;
    assert_eq!(v["fetched"]["status"], 200, "{v}");
    assert_eq!(v["fetched"]["body"], "hello from origin", "{v}");
    let v = ask(format!("http://localhost:{}/hello", origin.addr.port())).await;
    assert!(v["fetchError"].is_string(), "not on the list: {v}");
    assert_eq!(origin.hits("/hello"), 1);
}

/// Workers for Platforms: a dispatched user Worker's subrequest goes to the
/// dispatch Worker's outbound Worker, which may fetch origins on its own
/// allow-list, and only those. (`fetcher` plays both the user Worker and
/// the outbound Worker: each takes its URL from its request's query.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outbound_worker_fetches_origins_on_its_own_allow_list() {
    let origin = Origin::start(None).await;
    let (c, _dir) = node(private_allowed()).await;
    let mut m = Manifest::default();
    m.bindings
        .dispatch
        .entry("users".into())
        .or_default()
        .insert("user-f".into());
    m.bindings.outbound = Some("out-f".into());
    c.deploy_manifest("disp", m, sample("dispatcher"))
        .await
        .expect("deploy the dispatch Worker");
    // The user Worker has no allow-list of its own.
    c.deploy("user-f", Plan::Free, sample("fetcher"))
        .await
        .expect("deploy the user Worker");
    let on_list = allowing(Plan::Free, &[format!("http://{}", origin.addr)]);
    c.deploy_manifest("out-f", on_list, sample("fetcher"))
        .await
        .expect("deploy the outbound Worker");
    // The user Worker fetches api.example.com/z?fetch=<origin>; its
    // outbound Worker gets that request and fetches the origin it names.
    let path = format!(
        "/user-f/?fetch=http://api.example.com/z?fetch=http://{}/hello",
        origin.addr
    );
    let r = c.get(0, "disp", &path).await.expect("request");
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(
        r.text()
            .starts_with("dispatcher > 200 200 hello from origin"),
        "{}",
        r.text()
    );
    assert_eq!(origin.hits("/hello"), 1);

    // Off the outbound Worker's allow-list, its fetch is denied (and the
    // origin never hit); the user Worker sees the outbound Worker's answer.
    c.deploy_manifest("out-f", allowing(Plan::Free, &[]), sample("fetcher"))
        .await
        .expect("redeploy the outbound Worker");
    let r = c.get(0, "disp", &path).await.expect("request");
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(
        r.text().starts_with("dispatcher > 200 error"),
        "{}",
        r.text()
    );
    assert_eq!(origin.hits("/hello"), 1);
}

/// A CA and a `localhost` certificate it signed (DER), with the key.
fn localhost_cert() -> (
    rustls::pki_types::CertificateDer<'static>,
    rustls::pki_types::CertificateDer<'static>,
    rustls::pki_types::PrivateKeyDer<'static>,
) {
    use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};
    let mut ca = CertificateParams::new(Vec::<String>::new()).expect("ca params");
    ca.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    let ca_key = KeyPair::generate().expect("ca key");
    let ca_cert = ca.self_signed(&ca_key).expect("ca cert");
    let leaf_key = KeyPair::generate().expect("leaf key");
    let leaf = CertificateParams::new(vec!["localhost".to_string()])
        .expect("leaf params")
        .signed_by(&leaf_key, &Issuer::new(ca, ca_key))
        .expect("leaf cert");
    (
        ca_cert.der().clone(),
        leaf.der().clone(),
        rustls::pki_types::PrivateKeyDer::Pkcs8(leaf_key.serialize_der().into()),
    )
}

/// HTTPS to an origin: rustls (ring) verifies its certificate against the
/// roots, here a private CA given as an extra root; without it, the same
/// fetch fails (the Mozilla roots do not know that CA).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn https_origins_are_verified_against_the_roots() {
    let (ca, leaf, key) = localhost_cert();
    let tls = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .expect("tls versions")
    .with_no_client_auth()
    .with_single_cert(vec![leaf], key)
    .expect("server cert");
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(tls));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let port = listener.local_addr().expect("addr").port();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                let Ok(stream) = acceptor.accept(tcp).await else {
                    return;
                };
                let svc = service_fn(|_req: http::Request<hyper::body::Incoming>| async {
                    Ok::<_, std::convert::Infallible>(http::Response::new(Full::new(
                        Bytes::from_static(b"hello over tls"),
                    )))
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    let url = format!("https://localhost:{port}");
    for (trusted, expect) in [(true, "200 hello over tls"), (false, "error")] {
        let mut egress = private_allowed();
        if trusted {
            egress.extra_roots = vec![ca.clone()];
        }
        let (c, _dir) = node(egress).await;
        c.deploy_manifest(
            "tls",
            allowing(Plan::Free, std::slice::from_ref(&url)),
            sample("fetcher"),
        )
        .await
        .expect("deploy");
        let got = fetch(&c, "tls", &format!("{url}/x"), 1).await;
        assert!(got.starts_with(expect), "trusted={trusted}: {got}");
    }
}
