//! A Durable Object runs under its Worker's limits (issue 43's "CPU and
//! memory per object, as for Workers"): an object whose request loops is
//! stopped at the plan's CPU limit, one that eats memory at the plan's
//! memory limit; either way its caller gets an error, not a hang, and the
//! instance is discarded. What the failed request wrote and no answer
//! was released for is not kept (the loop's write); the object's next
//! request is served from its durable state by a new instance.

use std::time::{Duration, Instant};

use http_body_util::BodyExt;

use hearth_runtime::{Lifecycle, Manifest, Plan, Runtime, RuntimeConfig, body};

/// An object that counts `/put`s, and loops (`/spin`) or eats memory
/// (`/eat`) after writing on demand.
const HOG: &str = r#"import { DurableObject } from "cloudflare:workers";
export class Hog extends DurableObject {
  async fetch(request) {
    const what = new URL(request.url).pathname;
    const n = (await this.ctx.storage.get("n")) ?? 0;
    if (what === "/put") await this.ctx.storage.put("n", n + 1);
    if (what === "/spin") { this.ctx.storage.put("n", 1000); for (;;) {} }
    if (what === "/eat") {
      this.ctx.storage.put("n", 2000);
      const hoard = [];
      for (;;) hoard.push(new Array(1 << 16).fill(hoard.length));
    }
    return new Response(String((await this.ctx.storage.get("n")) ?? 0));
  }
}
export default {
  fetch(request, env) {
    return env.HOG.get(env.HOG.idFromName("one")).fetch(request);
  },
};
"#;

async fn call(rt: &Runtime, path: &str) -> (u16, String, Duration) {
    let t = Instant::now();
    let req = http::Request::get(format!("http://hog.localhost{path}"))
        .body(body::empty())
        .expect("request");
    let resp = tokio::time::timeout(Duration::from_secs(60), rt.serve("hog", req))
        .await
        .unwrap_or_else(|_| panic!("{path}: no answer in 60 s"));
    let status = resp.status().as_u16();
    let bytes = resp.into_body().collect().await.expect("body").to_bytes();
    (
        status,
        String::from_utf8_lossy(&bytes).into_owned(),
        t.elapsed(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_object_that_loops_or_eats_memory_is_stopped_and_its_state_survives() {
    let dir = tempfile::tempdir().expect("tempdir");
    let rt = Runtime::new(
        RuntimeConfig::new(dir.path())
            .artifact_key([7; 32])
            .request_cpu(Plan::Free, Duration::from_millis(300))
            .memory_limit(Plan::Free, 64 << 20),
    )
    .expect("runtime");
    let component = hearth::testing::build_js(HOG).expect("build");
    let manifest = Manifest {
        lifecycle: Lifecycle::Auto,
        ..Manifest::from_toml("[durable_objects]\nHOG = \"Hog\"\n").expect("manifest")
    };
    rt.deploy("hog", manifest, component).await.expect("deploy");

    for n in 1..=2 {
        assert_eq!(call(&rt, "/put").await.0, 200);
        assert_eq!(call(&rt, "/").await.1, n.to_string());
    }
    let opened = rt.stats().objects_opened;

    let (status, text, took) = call(&rt, "/spin").await;
    assert!(status >= 500, "a looping object: {status} {text}");
    assert!(
        took < Duration::from_secs(20),
        "stopped near its CPU limit, not at the wall clock's: {took:?}"
    );
    // The loop's write was never flushed: the count is the last answered.
    let (status, text, _) = call(&rt, "/").await;
    assert_eq!((status, text.as_str()), (200, "2"), "after the loop");

    let kills = rt.stats().memory_kills;
    let (status, text, _) = call(&rt, "/eat").await;
    assert!(status >= 500, "an object eating memory: {status} {text}");
    // Counted when the invocation ends, which may be just after its
    // answer reached the caller.
    assert!(
        hearth::testing::eventually(Duration::from_secs(10), || rt.stats().memory_kills
            == kills + 1)
        .await,
        "the instance was stopped at the memory limit: {:?}",
        rt.stats()
    );
    // The engine answered the allocation failure as the handler's error
    // (a 500), and the output gate made the write before it durable before
    // that answer left: the count is the hog's 2000, and goes on from it on
    // a new instance.
    let (status, text, _) = call(&rt, "/put").await;
    assert_eq!(
        (status, text.as_str()),
        (200, "2001"),
        "after the memory hog"
    );
    assert!(
        rt.stats().objects_opened > opened,
        "a failed instance is not reused: the object was opened again ({} then {})",
        opened,
        rt.stats().objects_opened
    );
}
