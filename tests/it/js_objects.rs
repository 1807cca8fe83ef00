//! Durable Objects in hearth's JS engine (issue 43), Cloudflare's API:
//! `import { DurableObject } from "cloudflare:workers"` (or hearth's own
//! name for it, `hearth:workers`), namespace bindings on `env`, stubs,
//! `ctx.storage` with structured-clone values.
//!
//! Without a node ([`the_storage_format_round_trips`],
//! [`both_module_names_resolve`], [`both_module_names_bundle_as_cloudflare_workers`]):
//! the engine's storage format, checked by round trips and exact bytes at
//! a Worker's top level (`sdk/js/engine/tests/storage-format.test.js`: the
//! build is the test), and the modules' names, at build time and in
//! esbuild's bundle.
//!
//! On a node ([`cloudflare_examples_answer_as_on_workerd`]): the Workers
//! of `tests/it/js_objects/` (Cloudflare's counter examples unchanged, its
//! Durable Objects starter with an RPC method, a rate limiter, a
//! key-value room, IDs and `env`), bundled as `hearth build` bundles them,
//! deployed with their Durable Object bindings, and sent a fixed sequence
//! of requests whose answers are written down: workerd's answers (the
//! same Worker, the same requests, its in-memory Durable Objects) are
//! those, and hearth's must be too. Without workerd the comparison is
//! skipped, saying so, unless `HEARTH_REQUIRE_WORKERD` is set.
//!
//! On a real node ([`the_counter_keeps_counting_after_its_node_is_killed`]):
//! issue 43's counter built with `hearth build`, deployed with `hearth
//! deploy --durable-object`, served by `hearth serve`, whose process is
//! killed (SIGKILL) and started again: the count goes on from where the
//! answered requests left it.

use std::process::{Command, Stdio};
use std::time::Duration;

use http_body_util::BodyExt;

use hearth::testing::{ServeCommand, Signal, Workerd};
use hearth_js_engine::{BuildError, build_logged};
use hearth_runtime::{Lifecycle, Manifest, Runtime, RuntimeConfig, body};

/// The storage format's checks (see its header).
const FORMAT_TEST: &str = include_str!("../../sdk/js/engine/tests/storage-format.test.js");

#[test]
fn the_storage_format_round_trips() {
    let built = build_logged(FORMAT_TEST).unwrap_or_else(|e| panic!("{e}"));
    let line = built
        .logs
        .iter()
        .find(|l| l.starts_with("storage format: "))
        .unwrap_or_else(|| panic!("no summary line in {:?}", built.logs));
    let checks: u32 = line
        .trim_start_matches("storage format: ")
        .split(' ')
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{line}"));
    assert!(checks >= 100, "{line}");
}

#[test]
fn a_failed_check_fails_the_build() {
    // The checks above pass by building: a failure must be a build error.
    let broken = FORMAT_TEST.replace("[1, '01 04 02']", "[1, '01 04 03']");
    assert_ne!(broken, FORMAT_TEST);
    match build_logged(&broken) {
        Err(BuildError::Throw { message, .. }) => {
            assert!(message.contains("the bytes of 1 are 01 04 02"), "{message}")
        }
        other => panic!("a failed check built: {other:?}"),
    }
}

#[test]
fn both_module_names_resolve() {
    // At run time (here the build's start, unbundled): both names are the
    // engine's one module; anything it does not export is a build error.
    let source = "import { DurableObject as A } from 'cloudflare:workers';\n\
                  import { DurableObject as B } from 'hearth:workers';\n\
                  if (A !== B || typeof A !== 'function') throw new Error('two DurableObjects');\n\
                  class Old { constructor(state, env) { this.state = state; } }\n\
                  class New extends A { constructor(ctx, env) { super(ctx, env); } }\n\
                  const n = new New(1, 2);\n\
                  if (n.ctx !== 1 || n.env !== 2) throw new Error('ctx and env not kept');\n\
                  export { Old, New };\n\
                  export default { fetch() { return new Response('ok'); } };\n";
    build_logged(source).unwrap_or_else(|e| panic!("{e}"));
    let missing = "import { NotThere } from 'cloudflare:workers';\n\
                   export default { fetch() { return new Response(String(NotThere)); } };\n";
    let err = build_logged(missing).expect_err("an export the module lacks");
    assert!(err.to_string().contains("NotThere"), "{err}");
}

/// `worker` bundled by `sdk/js/bundle.mjs` (esbuild from the JS samples'
/// `node_modules`): the bundle, or esbuild's message; None without that
/// toolchain.
fn bundle(worker: &str) -> Option<Result<String, String>> {
    let Some(modules) = hearth::testing::js_toolchain() else {
        eprintln!(
            "skipped: no esbuild in sample-workers/js/node_modules (build the samples first)"
        );
        return None;
    };
    let dir = tempfile::tempdir().expect("tempdir");
    for (path, text) in hearth_js_engine::bundle::SDK {
        std::fs::write(dir.path().join(path), text).expect("write the sdk");
    }
    std::os::unix::fs::symlink(&modules, dir.path().join("node_modules")).expect("link");
    std::fs::write(dir.path().join("worker.js"), worker).expect("write worker");
    let out = Command::new("node")
        .arg(dir.path().join("bundle.mjs"))
        .arg("worker.js")
        .arg("-o")
        .arg("out.js")
        .current_dir(dir.path())
        .stdin(Stdio::null())
        .output()
        .expect("run node");
    if !out.status.success() {
        return Some(Err(String::from_utf8_lossy(&out.stderr).into_owned()));
    }
    Some(Ok(
        std::fs::read_to_string(dir.path().join("out.js")).expect("the bundle")
    ))
}

#[test]
fn both_module_names_bundle_as_cloudflare_workers() {
    for name in ["cloudflare:workers", "hearth:workers"] {
        let worker = format!(
            "import {{ DurableObject }} from '{name}';\n\
             export class Counter extends DurableObject {{}}\n\
             export default {{ fetch() {{ return new Response(typeof Counter); }} }};\n"
        );
        let Some(bundled) = bundle(&worker) else {
            return;
        };
        let bundled = bundled.unwrap_or_else(|e| panic!("{name} did not bundle: {e}"));
        assert!(
            bundled.contains("from \"cloudflare:workers\""),
            "{name} is left as an import of cloudflare:workers:\n{bundled}"
        );
        assert!(!bundled.contains("hearth:workers"), "{bundled}");
        build_logged(&bundled).unwrap_or_else(|e| panic!("{name}: {e}"));
    }
    // Other `cloudflare:` modules are not the engine's: esbuild says so.
    let worker = "import { connect } from 'cloudflare:sockets';\n\
                  export default { fetch() { return connect; } };\n";
    if let Some(result) = bundle(worker) {
        let err = result.expect_err("cloudflare:sockets bundled");
        assert!(err.contains("cloudflare:sockets"), "{err}");
    }
}

/// One request of an example and the answer it must get.
struct Step {
    /// The path and query.
    path: &'static str,
    /// `x-client` (the rate limiter's client), if any.
    client: Option<&'static str>,
    /// A POST body, if any (else GET).
    body: Option<&'static str>,
    /// The status the answer must have.
    status: u16,
    /// Its body, exactly.
    answer: &'static str,
}

/// A step without a client or a body.
const fn get(path: &'static str, status: u16, answer: &'static str) -> Step {
    Step {
        path,
        client: None,
        body: None,
        status,
        answer,
    }
}

/// One example Worker of `tests/it/js_objects/`: its file, its one
/// Durable Object binding (name, class), and its requests in order.
struct Example {
    file: &'static str,
    source: &'static str,
    binding: (&'static str, &'static str),
    steps: Vec<Step>,
}

/// The examples, with the answers workerd gives (checked against it when
/// it can be had).
fn examples() -> Vec<Example> {
    let limited = |client: &'static str, path: &'static str, status, answer| Step {
        path,
        client: Some(client),
        body: None,
        status,
        answer,
    };
    let put = |path: &'static str| Step {
        path,
        client: None,
        body: Some(r#"{"v":1}"#),
        status: 200,
        answer: r#"{"ok":true}"#,
    };
    vec![
        Example {
            file: "counter.js",
            source: include_str!("js_objects/counter.js"),
            binding: ("COUNTER", "Counter"),
            steps: vec![get("/", 200, "1"), get("/x", 200, "2"), get("/", 200, "3")],
        },
        Example {
            file: "classic.js",
            source: include_str!("js_objects/classic.js"),
            binding: ("COUNTER", "Counter"),
            steps: vec![
                get("/", 200, "Durable Object 'A' count: 0"),
                get("/increment", 200, "Durable Object 'A' count: 1"),
                get("/increment", 200, "Durable Object 'A' count: 2"),
                get("/decrement", 200, "Durable Object 'A' count: 1"),
                get("/nope", 200, "Durable Object 'A' count: Not found"),
                get("/", 200, "Durable Object 'A' count: 1"),
            ],
        },
        Example {
            file: "hello.js",
            source: include_str!("js_objects/hello.js"),
            binding: ("MY_DURABLE_OBJECT", "MyDurableObject"),
            steps: vec![get("/", 200, "Hello, world!")],
        },
        Example {
            file: "limiter.js",
            source: include_str!("js_objects/limiter.js"),
            binding: ("LIMITER", "RateLimiter"),
            steps: vec![
                limited("a", "/", 200, "ok, 2 left"),
                limited("a", "/", 200, "ok, 1 left"),
                limited("a", "/", 200, "ok, 0 left"),
                limited("a", "/", 429, "rate limited"),
                limited("b", "/", 200, "ok, 2 left"),
                limited("a", "/left", 200, "0"),
                limited("a", "/refill?n=2", 200, "2"),
                limited("a", "/refill?n=-1", 400, "RangeError: refill takes a count"),
                limited("a", "/", 200, "ok, 1 left"),
            ],
        },
        Example {
            file: "room.js",
            source: include_str!("js_objects/room.js"),
            binding: ("ROOMS", "Room"),
            steps: vec![
                put("/put?key=a"),
                put("/put?key=b"),
                put("/put?key=c/1"),
                get("/get?key=a", 200, r#"{"value":{"v":1}}"#),
                get("/get?key=zz", 200, r#"{"value":null}"#),
                get("/get?key=a&room=other", 200, r#"{"value":null}"#),
                get(
                    "/list",
                    200,
                    r#"[["a",{"v":1}],["b",{"v":1}],["c/1",{"v":1}]]"#,
                ),
                get("/list?prefix=c", 200, r#"[["c/1",{"v":1}]]"#),
                get("/list?start=b&limit=1", 200, r#"[["b",{"v":1}]]"#),
                get(
                    "/list?startAfter=a",
                    200,
                    r#"[["b",{"v":1}],["c/1",{"v":1}]]"#,
                ),
                get("/list?end=b", 200, r#"[["a",{"v":1}]]"#),
                get(
                    "/list?reverse=1&limit=2",
                    200,
                    r#"[["c/1",{"v":1}],["b",{"v":1}]]"#,
                ),
                get("/delete?key=a", 200, r#"{"deleted":true}"#),
                get("/delete?key=a", 200, r#"{"deleted":false}"#),
                get(
                    "/batch",
                    200,
                    r#"{"got":[["b:1",1],["b:2",[2,2]],["b:3",{"three":3}]],"deleted":2,"left":[["b:3",{"three":3}]]}"#,
                ),
                get(
                    "/move?from=b&to=c/1",
                    409,
                    r#"{"moved":false,"why":"c/1 exists"}"#,
                ),
                get(
                    "/list",
                    200,
                    r#"[["b",{"v":1}],["b:3",{"three":3}],["c/1",{"v":1}]]"#,
                ),
                get("/move?from=b&to=d", 200, r#"{"moved":true}"#),
                get(
                    "/list",
                    200,
                    r#"[["b:3",{"three":3}],["c/1",{"v":1}],["d",{"v":1}]]"#,
                ),
                get("/rollback", 200, r#"{"rolled":null}"#),
                get(
                    "/types",
                    200,
                    r#"{"map":true,"date":"1970-01-02T00:00:00.000Z","big":"12345678901234567890","bytes":[1,2,3],"special":[true,true,null,5,true,null],"regexp":"/ab+c/gi","error":"far","shared":true,"cyclic":true}"#,
                ),
                get(
                    "/refused",
                    200,
                    r#"{"refused":"DataCloneError","kept":null}"#,
                ),
                get("/clear", 200, "[]"),
                get("/nope", 404, "no such route"),
            ],
        },
        Example {
            file: "ids.js",
            source: include_str!("js_objects/ids.js"),
            binding: ("PROBES", "Probe"),
            steps: vec![get(
                "/",
                200,
                r#"{"nope":"undefined","inEnv":true,"notInEnv":false,"hex":true,"same":true,"differs":true,"uniqueHex":true,"name":"a","uniqueName":null,"fromString":true,"invalid":"TypeError","inside":{"url":"https://example.com/path?q=1","idIsHex":true,"asked":true,"storage":"function","env":"object"},"rpc":true,"getByName":true}"#,
            )],
        },
    ]
}

/// The example's module as `hearth build` bundles it (esbuild), or its
/// source as it is without the JS toolchain (the engine resolves
/// `cloudflare:workers` itself).
fn module_of(example: &Example) -> String {
    match bundle(example.source) {
        Some(bundled) => bundled.unwrap_or_else(|e| panic!("{} did not bundle: {e}", example.file)),
        None => example.source.to_string(),
    }
}

/// `step`'s request to `host`, but its body.
fn request(host: &str, step: &Step) -> http::request::Builder {
    let mut req = http::Request::builder()
        .method(if step.body.is_some() { "POST" } else { "GET" })
        .uri(format!("http://{host}{}", step.path));
    if let Some(client) = step.client {
        req = req.header("x-client", client);
    }
    req
}

/// `resp`'s status and body.
async fn answer<B>(resp: http::Response<B>) -> (u16, String)
where
    B: hyper::body::Body,
    B::Error: std::fmt::Debug,
{
    let status = resp.status().as_u16();
    let bytes = resp.into_body().collect().await.expect("body").to_bytes();
    (status, String::from_utf8_lossy(&bytes).into_owned())
}

/// Checks `got` (a runtime's answer to `step`) against the step's answer.
fn check(runtime: &str, example: &Example, step: &Step, got: (u16, String)) {
    assert_eq!(
        got,
        (step.status, step.answer.to_string()),
        "{runtime}, {} {} (client {:?})",
        example.file,
        step.path,
        step.client
    );
}

/// workerd serving `module` with `binding`, or None (said why) when it
/// cannot be had and `HEARTH_REQUIRE_WORKERD` is not set.
fn workerd(module: &str, binding: (&str, &str)) -> Option<Workerd> {
    match Workerd::serve_with_objects(module, &[binding]) {
        Ok(w) => Some(w),
        Err(e) if std::env::var_os("HEARTH_REQUIRE_WORKERD").is_some() => {
            panic!("{e}, and HEARTH_REQUIRE_WORKERD is set (CI sets it)")
        }
        Err(e) => {
            eprintln!("{e}: the comparison with workerd is skipped");
            None
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cloudflare_examples_answer_as_on_workerd() {
    let dir = tempfile::tempdir().expect("tempdir");
    let rt = Runtime::new(RuntimeConfig::new(dir.path()).artifact_key([7; 32])).expect("runtime");
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http::<http_body_util::Full<bytes::Bytes>>();
    for example in examples() {
        let module = module_of(&example);
        let component =
            hearth::testing::build_js(&module).unwrap_or_else(|e| panic!("{}: {e}", example.file));
        let id = example.file.trim_end_matches(".js");
        let (name, class) = example.binding;
        let manifest = Manifest {
            lifecycle: Lifecycle::Auto,
            ..Manifest::from_toml(&format!("[durable_objects]\n{name} = \"{class}\"\n"))
                .expect("manifest")
        };
        rt.deploy(id, manifest, component)
            .await
            .unwrap_or_else(|e| panic!("deploy {id}: {e}"));
        let reference = workerd(&module, example.binding);
        for step in &example.steps {
            let resp = tokio::time::timeout(
                Duration::from_secs(30),
                rt.serve(
                    id,
                    request(&format!("{id}.localhost"), step)
                        .body(body::full(step.body.unwrap_or("").to_string()))
                        .expect("request"),
                ),
            )
            .await
            .unwrap_or_else(|_| panic!("{} {}: no answer in 30 s", example.file, step.path));
            check("hearth", &example, step, answer(resp).await);
            if let Some(w) = &reference {
                let resp = client
                    .request(
                        request(&w.addr().to_string(), step)
                            .body(http_body_util::Full::new(bytes::Bytes::from(
                                step.body.unwrap_or(""),
                            )))
                            .expect("request"),
                    )
                    .await
                    .expect("workerd answers");
                check("workerd", &example, step, answer(resp).await);
            }
        }
    }
}

#[test]
fn the_counter_keeps_counting_after_its_node_is_killed() {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(
        dir.path().join("counter.js"),
        include_str!("js_objects/counter.js"),
    )
    .expect("write the Worker");
    let wasm = dir.path().join("counter.wasm");
    let mut build = Command::new(crate::BIN);
    build
        .args(["build", "counter.js", "-o"])
        .arg(&wasm)
        .current_dir(dir.path())
        .env("HEARTH_CACHE_DIR", dir.path().join("cache"))
        .stdin(Stdio::null());
    match hearth::testing::js_toolchain() {
        Some(modules) => build.env("HEARTH_JS_NODE_MODULES", modules),
        None => build.env_remove("HEARTH_JS_NODE_MODULES"),
    };
    let out = build.output().expect("run hearth build");
    assert!(
        out.status.success(),
        "hearth build: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    crate::hearth()
        .deploy(
            &dir.path().join("store"),
            "counter",
            &wasm,
            &["--durable-object", "COUNTER=Counter"],
        )
        .expect("hearth deploy");

    let serve = ServeCommand::standalone(&crate::hearth(), dir.path(), "js-objects-test-token", "")
        .expect("the node's config");
    let count = |node: &hearth::testing::NodeProcess| {
        let resp = node
            .get("counter.localhost", "/")
            .unwrap_or_else(|e| panic!("{e}; log: {}", node.log()));
        assert_eq!(resp.status, 200, "{}; log: {}", resp.text(), node.log());
        resp.text()
    };
    let mut node = serve.spawn().expect("the node starts");
    node.wait_listening(Duration::from_secs(60))
        .expect("the node listens");
    for want in ["1", "2", "3"] {
        assert_eq!(count(&node), want);
    }
    node.signal(Signal::Kill).expect("SIGKILL");
    node.wait_exit(Duration::from_secs(20)).expect("killed");
    let node = serve.spawn().expect("the node starts again");
    node.wait_listening(Duration::from_secs(60))
        .expect("the node listens again");
    for want in ["4", "5"] {
        assert_eq!(count(&node), want);
    }
}
