//! Fuzz targets for the front door: how a request finds its Worker.
//!
//! * The routing functions alone: any Host finds one valid script ID or
//!   none (this found that `ⷐ[.x` routed to a Worker named `ⷐ[`, a shard
//!   hop for a name no Worker can have), IP literals none, and an absolute-form target's authority wins
//!   over the Host header.
//! * A real cluster: raw HTTP/1 requests, half of them near-valid (methods,
//!   targets, versions, Host headers, header lines and bodies drawn from
//!   what clients, proxies and attackers send), go over TCP to a node of a
//!   3-node cluster that is not `hello`'s home, so each one that routes to
//!   `hello` crosses the shard hop (heads, bodies and all) to the home.
//!   Each gets a well-formed response or a closed connection, never a
//!   5xx, and a valid request is served by `hello` every time; after the
//!   run the cluster still serves.
//!
//! Proptest on the stable toolchain; a long run is
//! `PROPTEST_CASES=20000 cargo test --release --test it fuzz_front_door::`.

use std::time::Duration;

use hearth::front_door::{request_host, script_id_from_host};
use hearth::runtime::Plan;
use hearth::testing::TestCluster;
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn host() -> impl Strategy<Value = String> {
    prop_oneof![
        "\\PC{0,30}",
        "[a-zA-Z0-9_-]{0,10}(\\.[a-zA-Z0-9-]{0,10}){0,3}(:[0-9]{0,6})?",
        "\\[[0-9a-f:.]{0,20}\\](:[0-9]{1,5})?",
        "[0-9]{1,3}(\\.[0-9]{1,3}){3}(:[0-9]{1,5})?",
    ]
}

proptest! {
    #[test]
    fn fuzz_any_host_names_one_lowercase_worker_or_none(host in host()) {
        if let Some(id) = script_id_from_host(&host) {
            // A name a Worker can have: lowercase DNS label characters.
            prop_assert!(hearth::runtime::store::validate::valid_script_id(&id), "{id:?}");
            let name = host.split(':').next().unwrap_or_default();
            prop_assert!(name.parse::<std::net::Ipv4Addr>().is_err(), "{host:?} is an IP");
            // DNS names are case-insensitive, and so is routing.
            prop_assert_eq!(script_id_from_host(&host.to_ascii_uppercase()), Some(id));
        }
    }

    #[test]
    fn fuzz_the_target_authority_wins_over_host(
        authority in host(),
        path in "/[ -~]{0,12}",
        host_header in prop::collection::vec(any::<u8>(), 0..24),
    ) {
        let mut req = http::Request::builder();
        if let Ok(uri) = http::Uri::try_from(format!("http://{authority}{path}")) {
            req = req.uri(uri);
        }
        if let Ok(value) = http::HeaderValue::from_bytes(&host_header) {
            req = req.header(http::header::HOST, value);
        }
        let Ok(req) = req.body(()) else { return Ok(()) };
        let expected = match req.uri().authority() {
            Some(a) => Some(a.host().to_owned()),
            None => req
                .headers()
                .get(http::header::HOST)
                .and_then(|h| h.to_str().ok())
                .map(str::to_owned),
        };
        prop_assert_eq!(request_host(&req), expected);
    }
}

/// A raw HTTP/1 request and whether it is one `hello` must serve.
#[derive(Debug, Clone)]
struct RawRequest {
    bytes: Vec<u8>,
    valid: bool,
}

fn raw_request() -> impl Strategy<Value = RawRequest> {
    // Mostly near-valid, so that most cases get past the parser to routing
    // and the Worker; some junk in every part.
    let method = prop_oneof![
        3 => prop_oneof![Just("GET"), Just("POST"), Just("HEAD"), Just("PUT")].prop_map(String::from),
        1 => "[A-Z]{1,8}",
        1 => "\\PC{0,6}",
    ];
    let target = prop_oneof![
        3 => "/[a-zA-Z0-9/_.~%?=&-]{0,30}",
        1 => "http://(hello|HELLO|127\\.0\\.0\\.1|\\[::1\\])(\\.localhost)?(:[0-9]{1,5})?/[a-z]{0,5}",
        1 => prop_oneof!["[ -~]{0,20}", Just("*".to_string())],
    ];
    let version = prop_oneof![
        4 => prop_oneof![Just("HTTP/1.1"), Just("HTTP/1.0")].prop_map(String::from),
        1 => prop_oneof!["HTTP/[0-9]\\.[0-9]", "[ -~]{0,8}"],
    ];
    let host = prop::option::weighted(
        0.9,
        prop_oneof![
            4 => prop_oneof![Just("hello.localhost"), Just("HELLO.localhost:8080")].prop_map(String::from),
            1 => prop_oneof![Just("127.0.0.1"), Just("[::1]:80"), Just("nobody.localhost")].prop_map(String::from),
            1 => "[ -~]{0,20}",
        ],
    );
    let headers = prop::collection::vec(
        prop_oneof![
            4 => "[a-z-]{1,12}: [ -~]{0,20}",
            1 => "[ -~\\t]{0,24}",
            1 => prop_oneof![
                Just("transfer-encoding: chunked"),
                Just("content-length: 99999999999999999999"),
                Just("expect: 100-continue"),
                Just("host: other.localhost"),
            ]
            .prop_map(String::from),
        ],
        0..4,
    );
    let body = prop::option::of((0usize..24, prop::collection::vec(any::<u8>(), 0..24)));
    let eol = prop_oneof![Just("\r\n"), Just("\n")];
    let fuzzed = (method, target, version, host, headers, body, eol).prop_map(
        |(method, target, version, host, headers, body, eol)| {
            let mut bytes = format!("{method} {target} {version}{eol}").into_bytes();
            if let Some(host) = host {
                bytes.extend(format!("host: {host}{eol}").bytes());
            }
            for h in headers {
                bytes.extend(format!("{h}{eol}").bytes());
            }
            let data = body.map(|(declared, data)| {
                bytes.extend(format!("content-length: {declared}{eol}").bytes());
                data
            });
            // So that a node that answers also closes (no keep-alive wait).
            bytes.extend(format!("connection: close{eol}{eol}").bytes());
            bytes.extend(data.unwrap_or_default());
            RawRequest {
                bytes,
                valid: false,
            }
        },
    );
    let valid =
        ("/[a-z0-9]{0,8}", prop_oneof![Just("hello"), Just("HELLO")]).prop_map(|(path, name)| {
            RawRequest {
                bytes: format!(
                    "GET {path} HTTP/1.1\r\nhost: {name}.localhost\r\nconnection: close\r\n\r\n"
                )
                .into_bytes(),
                valid: true,
            }
        });
    prop_oneof![3 => fuzzed, 1 => valid]
}

/// Sends `bytes` and reads what comes back until the node closes the
/// connection, or (for a request that may be waiting for bytes that never
/// come) until 200 ms of silence, when the client goes away. The write side
/// is never half-closed: to the node that looks like a client that left
/// (whose request is then cancelled), which is the point of that rule.
async fn exchange(addr: std::net::SocketAddr, req: &RawRequest) -> Vec<u8> {
    let mut tcp = tokio::net::TcpStream::connect(addr).await.expect("connect");
    // The node may answer and close before reading everything we send.
    let _ = tcp.write_all(&req.bytes).await;
    let patience = if req.valid {
        Duration::from_secs(20)
    } else {
        Duration::from_millis(200)
    };
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    while let Ok(Ok(n)) = tokio::time::timeout(patience, tcp.read(&mut buf)).await {
        if n == 0 {
            break;
        }
        out.extend_from_slice(&buf[..n]);
    }
    out
}

/// The status of the first response in `raw`, if it starts with a status
/// line (`HTTP/1.x NNN ...`).
fn status(raw: &[u8]) -> Option<u16> {
    let line = raw.split(|b| *b == b'\n').next()?;
    let line = std::str::from_utf8(line).ok()?;
    let rest = line
        .strip_prefix("HTTP/1.1 ")
        .or_else(|| line.strip_prefix("HTTP/1.0 "))?;
    rest.get(..3)?.parse().ok()
}

#[test]
fn fuzz_raw_requests_to_a_real_front_door() {
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let cluster = rt.block_on(async {
        let c = TestCluster::start(3).await.expect("cluster");
        let hello = hearth_sample_workers::bytes("hello").expect("sample built");
        c.deploy("hello", Plan::Free, hello).await.expect("deploy");
        c
    });
    let home = cluster.home_of("hello").expect("home");
    let entry = (home + 1) % 3;
    let addr = cluster.node(entry).http_addr;
    let mut runner = TestRunner::new(Config {
        // Each case is a real connection; the default 256 keeps CI quick.
        failure_persistence: None,
        ..Config::default()
    });
    let result = runner.run(&raw_request(), |req| {
        let answer = rt.block_on(exchange(addr, &req));
        let text = String::from_utf8_lossy(&answer);
        if answer.is_empty() {
            // Closed without a word: only for input that is not HTTP.
            prop_assert!(!req.valid, "a valid request got no answer");
            return Ok(());
        }
        let code = status(&answer);
        prop_assert!(code.is_some(), "not an HTTP response: {text:?}");
        let code = code.unwrap_or_default();
        prop_assert!(
            code < 500,
            "{code} for {:?}: {text:?}",
            String::from_utf8_lossy(&req.bytes)
        );
        if req.valid {
            prop_assert_eq!(code, 200, "{}", text);
            // Whole (the hop brings a small response back inline) or
            // chunked, the body is hello's.
            prop_assert!(text.contains("hello from hello"), "{text:?}");
            prop_assert!(text.contains("x-hearth-route: sharded"), "{text:?}");
        }
        Ok(())
    });
    result.expect("no case fails");
    for i in 0..3 {
        let after = rt.block_on(cluster.get(i, "hello", "/")).expect("request");
        assert_eq!(after.status, 200);
    }
    // The hop was taken: the home served what the entry node forwarded.
    assert!(cluster.stats(entry).rpc.sharded > 0);
    drop(cluster);
}
