//! `hearth dev` as a user runs it, one process per test:
//!
//! - a JavaScript Worker's module in a fresh folder (`hearth dev
//!   worker.js`): built as `hearth build` builds it, served, rebuilt once
//!   per edit (its output is not in the folder), and a broken edit leaves
//!   the last good version serving;
//! - `--build` whose output lies in the watched folder and does not exist
//!   yet (the issue's `hearth dev --watch . --build "hearth build worker.js
//!   -o app.wasm" app.wasm`): the first build runs before the first deploy,
//!   and the build's own write of its output never starts another build;
//! - `--build` copying samples into place: `.dev.vars`, a change of the
//!   watched sources redeploys, a failing build and a build that writes
//!   something that is not a component print why and leave the last good
//!   version answering; Ctrl-C exits cleanly.

use std::io::{BufRead, BufReader, Read};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
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

/// GETs `/` until the answer's body contains `needle`, for at most
/// `limit`.
fn get_until(addr: SocketAddr, needle: &str, limit: Duration, out: &Output) -> TestResponse {
    let deadline = Instant::now() + limit;
    loop {
        let resp = get_path(addr, "/");
        if resp.text().contains(needle) {
            return resp;
        }
        assert!(
            Instant::now() < deadline,
            "no {needle:?} within {limit:?}: {resp:?}\noutput:\n{}",
            out.text()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A running `hearth dev` and what it prints.
struct Dev {
    proc: Process,
    out: Output,
    addr: SocketAddr,
}

impl Dev {
    /// Starts `hearth dev ARGS --listen …` in `cwd`, with the JS samples'
    /// esbuild when it is installed (as `hearth build`'s tests use it), and
    /// waits until it serves and watches.
    fn start(args: &[&str], cwd: &Path) -> Dev {
        let port = crate::free_port();
        let mut cmd = Command::new(BIN);
        cmd.arg("dev")
            .args(args)
            .arg("--listen")
            .arg(format!("127.0.0.1:{port}"))
            .current_dir(cwd)
            .env(
                "HEARTH_CACHE_DIR",
                Path::new(env!("CARGO_TARGET_TMPDIR")).join("hearth-cache"),
            )
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        match hearth::testing::js_toolchain() {
            Some(modules) => cmd.env("HEARTH_JS_NODE_MODULES", modules),
            None => cmd.env_remove("HEARTH_JS_NODE_MODULES"),
        };
        let mut proc = Process::spawn(&mut cmd).expect("start hearth dev");
        let out = Output::default();
        out.collect(proc.take_stdout().expect("stdout"));
        out.collect(proc.take_stderr().expect("stderr"));
        out.wait_for("Ctrl-C to stop", Duration::from_secs(120));
        Dev {
            proc,
            out,
            addr: ([127, 0, 0, 1], port).into(),
        }
    }

    /// The builds started so far (`building …` lines: one per build).
    fn builds(&self) -> usize {
        self.out
            .text()
            .lines()
            .filter(|l| l.starts_with("building"))
            .count()
    }

    /// Waits a few seconds, then checks that `expected` builds started in
    /// all: the last build's own output did not start another.
    fn no_more_builds(&self, expected: usize) {
        std::thread::sleep(Duration::from_secs(3));
        assert_eq!(
            self.builds(),
            expected,
            "builds; output:\n{}",
            self.out.text()
        );
    }
}

/// A Worker module answering `text`.
fn worker(text: &str) -> String {
    format!(
        "export default {{\n  async fetch(request) {{\n    return new Response({text:?});\n  }},\n}};\n"
    )
}

/// The folder's entries, sorted.
fn entries(dir: &Path) -> Vec<PathBuf> {
    let mut all: Vec<PathBuf> = std::fs::read_dir(dir)
        .expect("read dir")
        .map(|e| e.expect("entry").path())
        .collect();
    all.sort();
    all
}

#[test]
fn dev_builds_a_js_module_serves_it_and_rebuilds_once_per_edit() {
    let dir = tempfile::tempdir().expect("tempdir");
    let module = dir.path().join("worker.js");
    std::fs::write(&module, worker("one")).expect("write worker");
    let dev = Dev::start(&["worker.js"], dir.path());
    assert!(
        dev.out.text().contains("serving worker on"),
        "{}",
        dev.out.text()
    );
    let resp = get_until(dev.addr, "one", Duration::from_secs(5), &dev.out);
    assert_eq!(resp.status, 200, "{resp:?}");
    assert_eq!(dev.builds(), 1, "{}", dev.out.text());
    // The build's output is not in the module's folder.
    assert_eq!(entries(dir.path()), [module.clone()]);

    // One edit: one build, and the new version answers.
    std::fs::write(&module, worker("two")).expect("edit worker");
    get_until(dev.addr, "two", Duration::from_secs(30), &dev.out);
    dev.no_more_builds(2);

    // A broken edit: the error is shown, the last good version answers.
    std::fs::write(
        &module,
        "export default {\n  fetch() { return new Response(; },\n};\n",
    )
    .expect("break worker");
    dev.out.wait_for(
        "still serving the last good version",
        Duration::from_secs(30),
    );
    // esbuild's message, with the line.
    dev.out
        .wait_for("worker.js does not build", Duration::from_secs(1));
    dev.out.wait_for("worker.js:2:", Duration::from_secs(1));
    assert!(get_path(dev.addr, "/").text().contains("two"));

    // Mended: served again.
    std::fs::write(&module, worker("three")).expect("mend worker");
    get_until(dev.addr, "three", Duration::from_secs(30), &dev.out);
    dev.no_more_builds(4);
}

#[test]
fn dev_runs_the_build_before_the_first_deploy_and_ignores_its_output() {
    // A fresh folder: the module, no app.wasm yet, and the build writes it
    // into the folder it watches.
    let dir = tempfile::tempdir().expect("tempdir");
    let module = dir.path().join("worker.js");
    std::fs::write(&module, worker("first")).expect("write worker");
    let build = format!("{BIN} build worker.js -o app.wasm");
    let dev = Dev::start(&["--watch", ".", "--build", &build, "app.wasm"], dir.path());
    get_until(dev.addr, "first", Duration::from_secs(5), &dev.out);
    // Its output in the watched folder did not start a second build.
    dev.no_more_builds(1);

    std::fs::write(&module, worker("second")).expect("edit worker");
    get_until(dev.addr, "second", Duration::from_secs(30), &dev.out);
    dev.no_more_builds(2);
}

#[test]
fn dev_rebuilds_redeploys_and_keeps_the_last_good_version() {
    let dir = tempfile::tempdir().expect("tempdir");
    let wasm = dir.path().join("hello.wasm");
    // The watched source: the sample the build copies into place.
    // `config-echo` first (deployed as `hello`): it shows the vars it reads.
    let src = dir.path().join("src");
    std::fs::create_dir(&src).expect("src dir");
    let next = src.join("next.wasm");
    let hello = hearth_sample_workers::path("config-echo").expect("config-echo sample built");
    let echo = hearth_sample_workers::path("echo").expect("echo sample built");
    std::fs::copy(hello, &next).expect("copy hello");
    std::fs::write(
        dir.path().join(".dev.vars"),
        "GREETING=hi\nAPI_TOKEN=\"s3cret\"\n",
    )
    .expect("dev vars");
    // The build: fails while FAIL exists, writes junk while JUNK exists,
    // else puts src/next.wasm in place.
    let build = format!(
        "cd {d} && if [ -e FAIL ]; then echo 'compile error: boom' >&2; exit 3; fi; \
         if [ -e JUNK ]; then echo 'not wasm' > hello.wasm; exit 0; fi; cp src/next.wasm hello.wasm",
        d = dir.path().display(),
    );
    let store = dir.path().join("store");
    let mut dev = Dev::start(
        &[
            "--build",
            &build,
            "--watch",
            &src.to_string_lossy(),
            "--store",
            &store.to_string_lossy(),
            &wasm.to_string_lossy(),
        ],
        dir.path(),
    );
    let (out, addr) = (dev.out.clone(), dev.addr);

    let text = out.text();
    assert!(text.contains("GREETING, API_TOKEN"), "{text}");
    assert!(!text.contains("s3cret"), "a value was printed:\n{text}");
    // `.dev.vars` reach the Worker as vars.
    let resp = get_path(addr, "/GREETING").text();
    assert!(resp.contains("env=hi config=hi"), "{resp}");
    let resp = get_path(addr, "/API_TOKEN").text();
    assert!(resp.contains("env=s3cret"), "{resp}");
    // Each request is printed with its status and timing.
    out.wait_for("GET /GREETING -> 200 in ", Duration::from_secs(2));

    // A change of the sources rebuilds: `echo` answers now.
    std::fs::copy(echo, &next).expect("copy echo");
    let served_by_echo = |r: &TestResponse| r.headers.contains_key("x-echo-served");
    let resp = touch_until(&next, addr, served_by_echo);
    assert!(served_by_echo(&resp), "{resp:?}");
    assert!(!resp.text().contains("env="), "{resp:?}");

    // A failed build: the error is shown, `echo` still answers.
    std::fs::write(dir.path().join("FAIL"), "").expect("fail marker");
    let before = out.text().matches("build failed").count();
    touch_until(&next, addr, |_| {
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
    touch_until(&next, addr, |_| {
        out.text().contains("deploy of hello failed")
    });
    out.wait_for("deploy of hello failed", Duration::from_secs(1));
    assert!(served_by_echo(&get(addr)));

    // Ctrl-C stops it cleanly.
    let status = dev
        .proc
        .stop(Signal::Int, Duration::from_secs(5))
        .unwrap_or_else(|e| panic!("still running after Ctrl-C: {e}"));
    assert!(status.success(), "{status}; output:\n{}", out.text());
}
