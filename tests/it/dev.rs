//! `hearth dev` as a user runs it: one process serving a copy of the
//! `hello` sample, whose build command copies `echo` over it. Touching the
//! watched file rebuilds and redeploys (the new Worker answers within
//! seconds); a failing build, and a build that writes something that is not
//! a component, print why and leave the last good version answering; Ctrl-C
//! exits cleanly.

use std::io::{BufRead, BufReader, Read};
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hearth::testing::{HttpRequest, Process, Signal, TestResponse};

use crate::BIN;

/// Everything the process printed, stdout and stderr, as it arrives.
#[derive(Clone, Default)]
struct Output(Arc<Mutex<String>>);

impl Output {
    fn collect(&self, stream: impl Read + Send + 'static) {
        let out = self.0.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stream).lines().map_while(Result::ok) {
                let mut o = out.lock().expect("output lock");
                o.push_str(&line);
                o.push('\n');
            }
        });
    }

    fn text(&self) -> String {
        self.0.lock().expect("output lock").clone()
    }

    /// Waits up to `limit` for the output to contain `needle`.
    fn wait_for(&self, needle: &str, limit: Duration) -> String {
        let deadline = Instant::now() + limit;
        loop {
            let text = self.text();
            if text.contains(needle) {
                return text;
            }
            assert!(
                Instant::now() < deadline,
                "no {needle:?} within {limit:?}; output:\n{text}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

fn get(addr: SocketAddr) -> TestResponse {
    get_path(addr, "/x")
}

fn get_path(addr: SocketAddr, path: &str) -> TestResponse {
    HttpRequest::get("anything", path)
        .send(addr)
        .expect("an answer")
}

/// Touches `file` (its modification time, not its content) until the
/// answer passes `check`, for at most a few seconds.
fn touch_until(
    file: &Path,
    addr: SocketAddr,
    check: impl Fn(&TestResponse) -> bool,
) -> TestResponse {
    let f = std::fs::OpenOptions::new()
        .append(true)
        .open(file)
        .expect("open");
    f.set_modified(std::time::SystemTime::now()).expect("touch");
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let resp = get(addr);
        if check(&resp) || Instant::now() > deadline {
            return resp;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn dev_rebuilds_redeploys_and_keeps_the_last_good_version() {
    let dir = tempfile::tempdir().expect("tempdir");
    let wasm = dir.path().join("hello.wasm");
    // `config-echo` first (deployed as `hello`): it shows the vars it reads.
    let hello = hearth_sample_workers::path("config-echo").expect("config-echo sample built");
    let echo = hearth_sample_workers::path("echo").expect("echo sample built");
    std::fs::copy(hello, &wasm).expect("copy hello");
    std::fs::write(
        dir.path().join(".dev.vars"),
        "GREETING=hi\nAPI_TOKEN=\"s3cret\"\n",
    )
    .expect("dev vars");
    // The build: fails while FAIL exists, writes junk while JUNK exists,
    // else puts `echo` in place.
    let build = format!(
        "cd {d} && if [ -e FAIL ]; then echo 'compile error: boom' >&2; exit 3; fi; \
         if [ -e JUNK ]; then echo 'not wasm' > hello.wasm; exit 0; fi; cp {echo} hello.wasm",
        d = dir.path().display(),
        echo = echo.display()
    );
    let port = crate::free_port();
    let mut proc = Process::spawn(
        Command::new(BIN)
            .args(["dev", "--build", &build, "--listen"])
            .arg(format!("127.0.0.1:{port}"))
            .arg("--store")
            .arg(dir.path().join("store"))
            .arg(&wasm)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped()),
    )
    .expect("start hearth dev");
    let out = Output::default();
    out.collect(proc.take_stdout().expect("stdout"));
    out.collect(proc.take_stderr().expect("stderr"));
    let addr: SocketAddr = ([127, 0, 0, 1], port).into();

    let text = out.wait_for("Ctrl-C to stop", Duration::from_secs(30));
    assert!(text.contains("GREETING, API_TOKEN"), "{text}");
    assert!(!text.contains("s3cret"), "a value was printed:\n{text}");
    // `.dev.vars` reach the Worker as vars.
    let resp = get_path(addr, "/GREETING").text();
    assert!(resp.contains("env=hi config=hi"), "{resp}");
    let resp = get_path(addr, "/API_TOKEN").text();
    assert!(resp.contains("env=s3cret"), "{resp}");
    // Each request is printed with its status and timing.
    out.wait_for("GET /GREETING -> 200 in ", Duration::from_secs(2));

    // A change rebuilds: `echo` answers now.
    let served_by_echo = |r: &TestResponse| r.headers.contains_key("x-echo-served");
    let resp = touch_until(&wasm, addr, served_by_echo);
    assert!(served_by_echo(&resp), "{resp:?}");
    assert!(!resp.text().contains("env="), "{resp:?}");

    // A failed build: the error is shown, `echo` still answers.
    std::fs::write(dir.path().join("FAIL"), "").expect("fail marker");
    let before = out.text().matches("build failed").count();
    touch_until(&wasm, addr, |_| {
        out.text().matches("build failed").count() > before
    });
    let text = out.text();
    assert!(text.contains("compile error: boom"), "{text}");
    assert!(
        text.contains("still serving the last good version"),
        "{text}"
    );
    assert!(served_by_echo(&get(addr)));

    // A build that writes no component: the deploy's error, `echo` answers.
    std::fs::remove_file(dir.path().join("FAIL")).expect("unmark");
    std::fs::write(dir.path().join("JUNK"), "").expect("junk marker");
    touch_until(&wasm, addr, |_| {
        out.text().contains("deploy of hello failed")
    });
    out.wait_for("deploy of hello failed", Duration::from_secs(1));
    assert!(served_by_echo(&get(addr)));

    // Ctrl-C stops it cleanly.
    let status = proc
        .stop(Signal::Int, Duration::from_secs(5))
        .unwrap_or_else(|e| panic!("still running after Ctrl-C: {e}"));
    assert!(status.success(), "{status}; output:\n{}", out.text());
}
