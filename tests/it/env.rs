//! Vars, secrets and Worker logs on a real `hearth serve` process, driven
//! by the commands a user types (`hearth deploy --var`, `hearth secret
//! put|list|delete`): a Rust Worker reads both through `std::env` and
//! `wasi:config/store`; a secret's value is in no admin answer, no log
//! line and no byte of the store; a Worker's output reaches the node's log
//! tagged with its script and request ID, and a chatty one is held to its
//! rate. One node for the whole file.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use hearth::testing::NodeProcess;

use crate::hearth;

const TOKEN: &str = "env-test-admin-token-0123456789abcdef";
/// The secret: it must never show up outside the Worker.
const SECRET: &str = "s3cr3t-Value-7f1c2b9e";

/// This file's node: a [`NodeProcess`] and the commands a user types at it.
struct Node(NodeProcess);

impl std::ops::Deref for Node {
    type Target = NodeProcess;
    fn deref(&self) -> &NodeProcess {
        &self.0
    }
}

impl Node {
    fn start(dir: &Path) -> Node {
        Node(NodeProcess::standalone(&hearth(), dir, TOKEN, "").expect("the node starts"))
    }

    fn deploy(&self, name: &str, extra: &[&str]) -> Result<String, String> {
        let path = hearth_sample_workers::path(name).expect("sample built");
        self.0
            .deploy(name, path, extra)
            .expect("run hearth")
            .into_result()
    }

    fn secret(&self, args: &[&str], stdin: &str) -> Result<String, String> {
        let admin = self.admin_url();
        let mut all = vec!["secret", "--admin", &admin];
        all.extend_from_slice(args);
        self.hearth(all, stdin).expect("run hearth").into_result()
    }

    /// The body of `GET path` on Worker `script`.
    fn worker(&self, script: &str, path: &str) -> String {
        let resp = self
            .get(&format!("{script}.localhost"), path)
            .expect("an answer");
        assert_eq!(resp.status, 200, "{resp:?}");
        resp.text()
    }

    /// An admin answer (its headers and body), whatever its status.
    fn admin(&self, path: &str) -> String {
        let resp = self.admin_get(path).expect("an answer");
        format!("{:?}\n{}", resp.headers, resp.text())
    }
}

/// The bytes of every file under `dir`.
fn all_files(dir: &Path, out: &mut Vec<(PathBuf, Vec<u8>)>) {
    for entry in std::fs::read_dir(dir).expect("read dir").flatten() {
        let path = entry.path();
        if path.is_dir() {
            all_files(&path, out);
        } else if let Ok(bytes) = std::fs::read(&path) {
            out.push((path, bytes));
        }
    }
}

fn contains(haystack: &[u8], needle: &str) -> bool {
    haystack
        .windows(needle.len())
        .any(|w| w == needle.as_bytes())
}

#[test]
fn vars_secrets_and_logs_on_a_real_node() {
    let dir = tempfile::tempdir().expect("tempdir");
    let node = Node::start(dir.path());

    // Vars: set at deploy, read through both interfaces.
    let out = node
        .deploy(
            "config-echo",
            &[
                "--var",
                "API_BASE=https://api.example.com/v1",
                "--var",
                "MODE=test",
            ],
        )
        .expect("deploy");
    assert!(out.contains("vars: API_BASE, MODE"), "{out}");
    assert_eq!(
        node.worker("config-echo", "/API_BASE"),
        "env=https://api.example.com/v1 config=https://api.example.com/v1"
    );
    assert_eq!(
        node.worker("config-echo", "/"),
        "env: API_BASE,HEARTH_SCRIPT_ID,MODE config: API_BASE,MODE"
    );

    // Bad names and reserved names are refused with the rule.
    let err = node
        .deploy("config-echo", &["--var", "1BAD=x"])
        .expect_err("a bad var name");
    assert!(err.contains("invalid var name \"1BAD\""), "{err}");
    let err = node
        .secret(&["put", "config-echo", "HEARTH_TOKEN"], "x")
        .expect_err("a reserved name");
    assert!(err.contains("400") && err.contains("reserved"), "{err}");
    let err = node
        .secret(&["put", "config-echo", "MODE"], "x")
        .expect_err("a var's name");
    assert!(err.contains("both a var and a secret"), "{err}");
    let err = node
        .secret(&["put", "nobody", "API_KEY"], "x")
        .expect_err("no such Worker");
    assert!(err.contains("404"), "{err}");

    // A secret: from stdin, read through both interfaces at once (the
    // warm copy was dropped), kept by a redeploy.
    let out = node
        .secret(&["put", "config-echo", "API_KEY"], &format!("{SECRET}\n"))
        .expect("secret put");
    assert!(out.contains("secret API_KEY of config-echo set"), "{out}");
    let both = format!("env={SECRET} config={SECRET}");
    assert_eq!(node.worker("config-echo", "/API_KEY"), both);
    let out = node
        .deploy("config-echo", &["--var", "MODE=again"])
        .expect("redeploy");
    assert!(out.contains("secrets (kept from before): API_KEY"), "{out}");
    assert!(!out.contains(SECRET), "{out}");
    assert_eq!(node.worker("config-echo", "/API_KEY"), both);
    assert_eq!(node.worker("config-echo", "/API_BASE"), "env=- config=-");
    let list = node
        .secret(&["list", "config-echo"], "")
        .expect("secret list");
    assert_eq!(list, "API_KEY\n");

    // No admin answer carries the value (nor its sealed form).
    let store = node.store().expect("the node's store");
    let record = std::fs::read_to_string(store.join("secrets/config-echo/API_KEY.json"))
        .expect("the secret's record");
    let sealed: serde_json::Value = serde_json::from_str(&record).expect("json");
    let sealed = sealed["sealed"]
        .as_str()
        .expect("a sealed secret")
        .to_string();
    for path in [
        "/v1/scripts",
        "/v1/scripts/config-echo/secrets",
        "/v1/stats",
        "/metrics",
    ] {
        let answer = node.admin(path);
        assert!(!answer.contains(SECRET), "{path}: {answer}");
        assert!(!answer.contains(&sealed[..32]), "{path}: {answer}");
    }
    assert!(node.admin("/v1/scripts").contains("\"API_KEY\""));

    // Stored encrypted: no file of the store holds the value.
    let mut files = Vec::new();
    all_files(store, &mut files);
    assert!(files.len() > 2, "the store has files");
    for (path, bytes) in &files {
        assert!(
            !contains(bytes, SECRET),
            "{} holds the secret",
            path.display()
        );
    }

    // Logs: a line from a Worker with no tail Worker reaches the node's
    // log, tagged.
    node.worker("config-echo", "/?log=hello-from-the-worker-42");
    let deadline = Instant::now() + Duration::from_secs(5);
    let line = loop {
        let log = node.log();
        if let Some(l) = log.lines().find(|l| l.contains("hello-from-the-worker-42")) {
            break l.to_string();
        }
        assert!(
            Instant::now() < deadline,
            "no Worker line in the log:\n{log}"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(
        line.contains("script=\"config-echo\"") || line.contains("script=config-echo"),
        "{line}"
    );
    assert!(line.contains("request_id="), "{line}");
    assert!(
        line.contains("stream=\"stdout\"") || line.contains("stream=stdout"),
        "{line}"
    );

    // A chatty Worker is held to its rate: of 1000 lines, about a burst
    // gets through, and the rest are reported as dropped.
    node.deploy("chatty", &[]).expect("deploy chatty");
    node.worker("chatty", "/?lines=1000&bytes=8");
    std::thread::sleep(Duration::from_millis(100));
    node.worker("chatty", "/?lines=1&bytes=8");
    let deadline = Instant::now() + Duration::from_secs(5);
    let log = loop {
        let log = node.log();
        if log.contains("lines dropped") {
            break log;
        }
        assert!(Instant::now() < deadline, "no dropped report:\n{log}");
        std::thread::sleep(Duration::from_millis(20));
    };
    let logged = log
        .lines()
        .filter(|l| l.contains("chatty") && l.contains("xxxxxxxx"))
        .count();
    let burst = hearth::runtime::outbound::tail::LOG_BURST_LINES as usize;
    assert!(
        (burst..burst + 300).contains(&logged),
        "{logged} of 1000 lines logged"
    );

    // Deleting the secret takes it away at once.
    let out = node
        .secret(&["delete", "config-echo", "API_KEY"], "")
        .expect("secret delete");
    assert!(out.contains("deleted"), "{out}");
    assert_eq!(node.worker("config-echo", "/API_KEY"), "env=- config=-");
    assert_eq!(
        node.secret(&["list", "config-echo"], "").expect("list"),
        "config-echo has no secrets\n"
    );

    // Nothing the node logged holds the value.
    let log = node.log();
    assert!(!log.contains(SECRET), "the node log holds the secret");
}

/// A Python Worker (componentize-py) sees its vars and secrets in
/// `os.environ`: the sample refreshes it from `wasi:cli/environment` on an
/// instance's first request, since componentize-py built the module's
/// top level (and its `os.environ`) on the build machine.
#[test]
fn a_python_worker_reads_its_vars_and_secrets_in_os_environ() {
    if let Some(why) = hearth_sample_workers::skipped("python") {
        eprintln!("skipping: {why}");
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let node = Node::start(dir.path());
    node.deploy(
        "python",
        // Compiling the Python component takes a while, longer when the
        // other tests of this binary compile beside it.
        &[
            "--plan",
            "paid",
            "--var",
            "API_BASE=https://origin.test/v1",
            "--timeout",
            "180",
        ],
    )
    .expect("deploy python");
    let env = |body: &str| -> serde_json::Value {
        let v: serde_json::Value = serde_json::from_str(body).expect("JSON");
        v["env"].clone()
    };
    let body = node.worker("python", "/?env=API_BASE,API_KEY");
    assert_eq!(
        env(&body),
        serde_json::json!({"API_BASE": "https://origin.test/v1", "API_KEY": null}),
        "{body}"
    );
    node.secret(&["put", "python", "API_KEY"], &format!("{SECRET}\n"))
        .expect("secret put");
    let body = node.worker("python", "/?env=API_BASE,API_KEY,HOME");
    assert_eq!(
        env(&body),
        serde_json::json!({
            "API_BASE": "https://origin.test/v1",
            "API_KEY": SECRET,
            // Nothing of the build machine's environment is left.
            "HOME": null,
        }),
        "{body}"
    );
}
