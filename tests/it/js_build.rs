//! `hearth build` for JavaScript Workers, driven as a user drives it: the
//! Hono sample (`sample-workers/js/hono/worker.js`, unchanged) built with
//! `hearth build`, deployed with `hearth deploy --var … --service …` and
//! `hearth secret put` on a real `hearth serve`, then its routes, path
//! parameters, JSON, `env` (a var, a secret, not the runtime's own
//! entries), a service binding called with `env.AUTH.fetch(request)` and a
//! dispatch namespace's user Worker with `env.USERS.get(name).fetch(…)`;
//! and the build's errors (no Node.js, a syntax error, no default export,
//! no `fetch`), which stop before componentize-js and so take a second.
//!
//! Componentizing takes 30-60 s, so the file builds one component, once.
//! The toolchain is the JS samples' `node_modules` (cargo's build of the
//! samples installs it, with the same pinned esbuild and componentize-js as
//! `sdk/js`) through `HEARTH_JS_NODE_MODULES`; without it `hearth build`
//! installs its own into a cache under the target dir.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use hearth::testing::{HttpRequest, NodeProcess};

use crate::BIN;

const TOKEN: &str = "js-build-test-admin-token-0123456789";

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// `hearth ARGS` with the JS toolchain set up as the module docs say.
fn hearth(args: &[&str], cwd: &Path) -> Command {
    let mut cmd = Command::new(BIN);
    cmd.args(args)
        .current_dir(cwd)
        .env("HEARTH_ADMIN_TOKEN", TOKEN)
        .env(
            "HEARTH_CACHE_DIR",
            Path::new(env!("CARGO_TARGET_TMPDIR")).join("hearth-cache"),
        )
        .stdin(Stdio::null());
    match hearth::testing::js_toolchain() {
        Some(modules) => cmd.env("HEARTH_JS_NODE_MODULES", modules),
        None => cmd.env_remove("HEARTH_JS_NODE_MODULES"),
    };
    cmd
}

fn run(mut cmd: Command) -> (bool, String) {
    let Output {
        status,
        stdout,
        stderr,
    } = cmd.output().expect("run hearth");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&stdout),
        String::from_utf8_lossy(&stderr)
    );
    (status.success(), text)
}

/// Runs `hearth build` on a one-file Worker with `source`; it must fail,
/// and its output is returned.
fn build_fails(source: &str) -> String {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("worker.js"), source).expect("write worker");
    let (ok, out) = run(hearth(&["build", "worker.js"], dir.path()));
    assert!(!ok, "built, but should not have: {out}");
    assert!(
        !dir.path().join("worker.wasm").exists(),
        "a failed build wrote no component"
    );
    out
}

#[test]
fn build_errors_say_what_is_wrong() {
    // esbuild's own message: what, where.
    let out = build_fails(
        "export default {\n  async fetch(request) {\n    return new Response(;\n  },\n};\n",
    );
    assert!(out.contains("worker.js does not build"), "{out}");
    assert!(out.contains("worker.js:3:"), "esbuild's location: {out}");
    assert!(out.contains("Unexpected \";\""), "esbuild's message: {out}");

    let out = build_fails("export function fetch() { return new Response('x'); }\n");
    assert!(out.contains("has no default export"), "{out}");
    assert!(out.contains("export default { async fetch"), "{out}");

    let out = build_fails("export default { hello() { return 1; } };\n");
    assert!(out.contains("default export has no fetch method"), "{out}");

    let out = build_fails(
        "import { nope } from 'not-installed-anywhere';\nexport default { fetch() {} };\n",
    );
    assert!(
        out.contains("Could not resolve \"not-installed-anywhere\""),
        "{out}"
    );

    // No node on PATH: said plainly, before anything else.
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(
        dir.path().join("worker.js"),
        "export default { fetch() {} };\n",
    )
    .expect("write worker");
    let mut cmd = hearth(&["build", "worker.js"], dir.path());
    cmd.env("PATH", dir.path());
    let (ok, out) = run(cmd);
    assert!(!ok, "{out}");
    assert!(out.contains("needs Node.js"), "{out}");
}

/// This file's node: a [`NodeProcess`] and the commands a user types at it.
struct Node(NodeProcess);

impl std::ops::Deref for Node {
    type Target = NodeProcess;
    fn deref(&self) -> &NodeProcess {
        &self.0
    }
}

impl Node {
    fn start(dir: &Path, extra_config: &str) -> Node {
        Node(
            NodeProcess::standalone(&crate::hearth(), dir, TOKEN, extra_config)
                .expect("the node starts"),
        )
    }

    /// `hearth ARGS` against this node, with `stdin`; it must succeed.
    fn hearth(&self, args: &[&str], stdin: &str) -> String {
        let out = hearth::testing::run(hearth(args, &repo()), stdin).expect("run hearth");
        let text = out.output();
        assert!(out.success(), "hearth {args:?}: {text}");
        text
    }

    /// `METHOD path` on Worker `script` with `headers` and `body`: status
    /// and body.
    fn send(
        &self,
        script: &str,
        method: &str,
        path: &str,
        headers: &str,
        body: &str,
    ) -> (u16, String) {
        let mut req = HttpRequest::new(method, &format!("{script}.localhost"), path)
            .body(body)
            .timeout(Duration::from_secs(20));
        for line in headers.split("\r\n").filter(|l| !l.is_empty()) {
            let (name, value) = line.split_once(':').expect("a header line");
            req = req.header(name.trim(), value.trim());
        }
        let resp = req
            .send(self.http())
            .unwrap_or_else(|e| panic!("{e}; log: {}", self.log()));
        (resp.status, resp.text())
    }

    fn get(&self, script: &str, path: &str) -> (u16, String) {
        self.send(script, "GET", path, "", "")
    }
}

/// Parses `body` as JSON, or fails the test showing it.
fn json(body: &str) -> serde_json::Value {
    serde_json::from_str(body).unwrap_or_else(|e| panic!("not JSON ({e}): {body:?}"))
}

#[test]
fn a_hono_app_builds_unchanged_and_serves_routes_env_and_bindings() {
    let dir = tempfile::tempdir().expect("tempdir");
    let hono = hearth::testing::hono_sample().expect("the Hono sample's node_modules");
    // The origin the Worker proxies to (GET /origin/…): it answers with the
    // request line and the Authorization header it got.
    let origin = std::net::TcpListener::bind("127.0.0.1:0").expect("origin");
    let origin_url = format!("http://{}", origin.local_addr().expect("addr"));
    std::thread::spawn(move || {
        use std::io::{BufRead, BufReader, Write};
        for stream in origin.incoming().flatten() {
            let mut reader = BufReader::new(stream);
            let mut head = Vec::new();
            let mut line = String::new();
            while reader.read_line(&mut line).is_ok_and(|n| n > 2) {
                head.push(line.trim_end().to_string());
                line.clear();
            }
            let auth = head
                .iter()
                .find_map(|h| h.strip_prefix("authorization: "))
                .unwrap_or("-");
            let body = format!("{} auth={auth}", head.first().map_or("", String::as_str));
            let _ = write!(
                reader.get_mut(),
                "HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: {}\r\n\
                 connection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
    let wasm = dir.path().join("hono.wasm");
    let wasm_arg = wasm.to_string_lossy().into_owned();
    let (ok, out) = run(hearth(&["build", "worker.js", "-o", &wasm_arg], &hono));
    assert!(ok, "hearth build of the Hono sample: {out}");
    assert!(wasm.is_file(), "{out}");

    // Deployed into the store before the node starts: compiling the
    // component takes longer under load than the admin client waits.
    let store = dir.path().join("store");
    let store_arg = store.to_string_lossy().into_owned();
    let deploy = |args: &[&str]| {
        let mut all = vec!["deploy", "--store", &store_arg, "--plan", "paid"];
        all.extend_from_slice(args);
        let (ok, out) = run(hearth(&all, &repo()));
        assert!(ok, "hearth {all:?}: {out}");
        out
    };
    // The binding's target: the echo sample (request headers back as
    // x-echo-*, the body back).
    let echo = hearth_sample_workers::path("echo").expect("the echo sample is built");
    deploy(&["--name", "auth-echo", &echo.to_string_lossy()]);
    deploy(&[
        "--name",
        "user-echo",
        "--dispatch-only",
        &echo.to_string_lossy(),
    ]);
    let deployed = deploy(&[
        "--name",
        "hono",
        "--lifecycle",
        "reuse",
        "--var",
        "GREETING=hello there",
        "--service",
        "auth=auth-echo",
        "--dispatch",
        "users=user-echo",
        "--var",
        &format!("ORIGIN={origin_url}"),
        "--allow-host",
        &origin_url,
        &wasm_arg,
    ]);
    assert!(deployed.contains("lifecycle: reuse"), "{deployed}");
    // The origin is on loopback, which egress refuses unless allowed.
    let node = Node::start(dir.path(), "[egress]\nallow_private_addresses = true\n");

    // Routing, JSON, a path parameter and a query, a JSON body, Hono's 404.
    let (status, body) = node.get("hono", "/");
    assert_eq!((status, body.as_str()), (200, "Hello from Hono on hearth!"));
    let (status, body) = node.get("hono", "/json");
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        json(&body),
        serde_json::json!({"framework": "hono", "ok": true})
    );
    let (status, body) = node.get("hono", "/users/42?q=x%20y");
    assert_eq!(status, 200, "{body}");
    assert_eq!(json(&body), serde_json::json!({"id": "42", "q": "x y"}));
    let (status, body) = node.send(
        "hono",
        "POST",
        "/echo",
        "Content-Type: application/json\r\n",
        r#"{"a":[1,2]}"#,
    );
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        json(&body),
        serde_json::json!({"body": {"a": [1, 2]}, "size": 11})
    );
    let (status, _) = node.get("hono", "/nowhere");
    assert_eq!(status, 404);

    // env: the var; the runtime's own entries are not in it.
    let (status, body) = node.get("hono", "/env/GREETING");
    assert_eq!(status, 200, "{body}");
    assert_eq!(json(&body), serde_json::json!({"value": "hello there"}));
    for hidden in ["HEARTH_SCRIPT_ID", "HEARTH_SERVICES", "API_KEY"] {
        let (status, body) = node.get("hono", &format!("/env/{hidden}"));
        assert_eq!(status, 404, "{hidden}: {body}");
    }

    // A secret put after the deploy is in env from the next request.
    let put = node.hearth(
        &[
            "secret",
            "--admin",
            &node.admin_url(),
            "put",
            "hono",
            "API_KEY",
        ],
        "k-123-secret",
    );
    assert!(put.contains("secret API_KEY of hono set"), "{put}");
    let (status, body) = node.get("hono", "/env/API_KEY");
    assert_eq!(status, 200, "{body}");
    assert_eq!(json(&body), serde_json::json!({"value": "k-123-secret"}));

    // The README's example: proxying to an origin on the allow-list with
    // the secret as a header.
    let (status, body) = node.get("hono", "/origin/v1/items?page=2");
    assert_eq!(status, 200, "{body}; log: {}", node.log());
    assert_eq!(
        body,
        "GET /v1/items?page=2 HTTP/1.1 auth=Bearer k-123-secret"
    );

    // env.AUTH.fetch(request): the bound Worker gets the method, headers
    // and body, and its answer comes back.
    let (status, body) = node.send(
        "hono",
        "POST",
        "/auth/check?user=ann",
        "x-token: t-42\r\n",
        "ping",
    );
    assert_eq!(status, 200, "{body}; log: {}", node.log());
    let answer = json(&body);
    assert_eq!(answer["status"], 200, "{body}");
    assert_eq!(answer["body"], "ping", "{body}");
    assert_eq!(answer["headers"]["x-echo-x-token"], "t-42", "{body}");
    assert_eq!(
        answer["headers"]["x-echo-x-hearth-caller"], "hono",
        "a nested call from hono: {body}"
    );

    // env.USERS.get(name).fetch(request): a user Worker of a dispatch
    // namespace; a name outside it is refused by hearth.
    let (status, body) = node.send("hono", "PUT", "/dispatch/user-echo/x", "", "pong");
    assert_eq!(status, 200, "{body}; log: {}", node.log());
    assert_eq!(
        json(&body),
        serde_json::json!({"status": 200, "body": "pong"})
    );
    let (status, _) = node.send("hono", "PUT", "/dispatch/auth-echo/x", "", "pong");
    assert_eq!(status, 500, "auth-echo is not in the namespace");
}
