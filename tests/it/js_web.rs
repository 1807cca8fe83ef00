//! The web APIs of hearth's JS engine (`sdk/js/engine/src/web/*.js`:
//! `Headers`, `Request`, `Response`, streams, `URL`, encoders, `crypto`,
//! events, ...): the self-checking Worker `sdk/js/engine/tests/web.test.js`,
//! built with [`hearth::testing::build_js`] and served, runs every check on
//! `GET /` and answers `{passed, failed}`. The same file gives
//! `failed: []` on workerd, so a failure here is a difference from workerd.

use http_body_util::BodyExt;

use hearth::testing::build_js;
use hearth_runtime::body;
use hearth_runtime::{Manifest, Runtime, RuntimeConfig};

/// The self-checking Worker.
const WEB_TEST_JS: &str = include_str!("../../sdk/js/engine/tests/web.test.js");

/// How many checks `web.test.js` holds: fewer passing means checks stopped
/// running (a file that silently does less fails).
const CHECKS: u64 = 86;

/// Every check of `web.test.js` passes on the engine, and none went missing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_web_apis_pass_every_check_of_web_test_js() {
    let component = build_js(WEB_TEST_JS).expect("web.test.js builds");
    let dir = tempfile::tempdir().expect("tempdir");
    let rt = Runtime::new(RuntimeConfig::new(dir.path()).artifact_key([7; 32])).expect("runtime");
    rt.deploy("web", Manifest::default(), component)
        .await
        .expect("deploy");
    let req = http::Request::get("http://web.localhost/")
        .header("accept", "*/*")
        .header("x-test", "web")
        .body(body::full(String::new()))
        .expect("request");
    let resp = rt.serve("web", req).await;
    let status = resp.status().as_u16();
    let header = |name: &str| {
        resp.headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string)
    };
    let (content_type, passed_header) = (header("content-type"), header("x-passed"));
    let bytes = resp.into_body().collect().await.expect("body").to_bytes();
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&bytes));
    let v: serde_json::Value = serde_json::from_slice(&bytes).expect("JSON answer");
    assert_eq!(v["failed"], serde_json::json!([]), "failed checks: {v:#}");
    let passed = v["passed"].as_u64().expect("passed is a number");
    assert_eq!(
        (content_type.as_deref(), passed_header),
        (Some("application/json"), Some(passed.to_string())),
        "headers the Worker set on its Response after making it"
    );
    assert!(
        passed >= CHECKS,
        "only {passed} of {CHECKS} checks ran: {v:#}"
    );
}
