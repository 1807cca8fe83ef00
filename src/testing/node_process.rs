//! Real `hearth` processes for tests and benches: a node started as a user
//! starts one (`hearth serve` with a config file), and the commands a user
//! types at it.
//!
//! # Model
//!
//! * **[`Process`]**: any child process a test starts (a node, `hearth dev`,
//!   `hearth cluster`, a reference server of a bench). It is killed and
//!   reaped when dropped, so a failing test leaves nothing running. A test
//!   stops it as an operator would: a [`Signal`], then the exit status
//!   ([`Process::stop`]); its log file (stdout and stderr, when it was
//!   started with one) is read back for a failure message.
//! * **[`Hearth`]**: the binary under test (tests pass
//!   `env!("CARGO_BIN_EXE_hearth")`, which only they can name) and the
//!   environment every command of it gets (an admin token).
//!   [`Hearth::run`] runs a subcommand to its end with `stdin`
//!   written to it.
//! * **[`ServeCommand`] → [`NodeProcess`]**: `hearth serve` with its
//!   Worker and admin listeners on free loopback ports (given as flags, so
//!   one config file can serve several nodes), a config file, a store,
//!   variables and a working directory of the caller's choice; spawned, it
//!   is a [`NodeProcess`], which knows its addresses and admin token:
//!   waits until it listens or says it is ready, GETs a Worker or an admin
//!   path, deploys through the admin API, reads `/metrics`. One node on a
//!   store directory of its own is [`NodeProcess::standalone`].
//! * What a client sees of the node is plain HTTP/1.1 on a socket: see
//!   [`HttpRequest`].
//!
//! ```no_run
//! # fn demo() -> Result<(), hearth::testing::ProcessError> {
//! use std::time::Duration;
//! use hearth::testing::{Hearth, NodeProcess, Signal};
//! # let hello = std::path::Path::new("hello.wasm");
//! let dir = tempfile::tempdir().expect("a temporary directory");
//! let hearth = Hearth::new("target/release/hearth");
//! let mut node = NodeProcess::standalone(&hearth, dir.path(), "a-token-of-32-bytes-or-more-0123", "")?;
//! node.deploy("hello", hello, &[])?;
//! let r = node.get("hello.localhost", "/").expect("an answer");
//! assert_eq!(r.status, 200);
//! assert!(node.stop(Signal::Term, Duration::from_secs(10))?.success());
//! # Ok(()) }
//! ```

use std::ffi::{OsStr, OsString};
use std::io::Write;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStderr, ChildStdout, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use super::{HttpRequest, TestResponse};

/// How long a node may take to listen after it is spawned
/// ([`NodeProcess::standalone`]).
pub const START_TIMEOUT: Duration = Duration::from_secs(30);

/// How many lines of a log a [`ProcessError`] carries.
const LOG_LINES: usize = 60;

/// Why a process could not be started, driven or stopped.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ProcessError {
    /// A file, socket or process operation failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// Why it failed.
        #[source]
        source: std::io::Error,
    },
    /// A command ran and exited with failure.
    #[error("{command} failed ({status}):\n{output}")]
    Failed {
        /// The command.
        command: String,
        /// Its exit status.
        status: ExitStatus,
        /// Its stdout, then its stderr.
        output: String,
    },
    /// A process did not do something in time (listen, be ready, exit).
    #[error("{what}; the last lines of its log:\n{log}")]
    Timeout {
        /// What it did not do.
        what: String,
        /// The end of its log.
        log: String,
    },
    /// The process had already exited (or was never started).
    #[error("{0} is not running")]
    NotRunning(String),
}

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> ProcessError {
    let what = what.into();
    move |source| ProcessError::Io { what, source }
}

/// A signal to stop a process with, as an operator's tools send them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Signal {
    /// SIGTERM: what systemd, Docker and Kubernetes send.
    Term,
    /// SIGINT: Ctrl-C.
    Int,
    /// SIGKILL: a crash, or the OOM killer.
    Kill,
}

impl Signal {
    fn number(self) -> libc::c_int {
        match self {
            Signal::Term => libc::SIGTERM,
            Signal::Int => libc::SIGINT,
            Signal::Kill => libc::SIGKILL,
        }
    }
}

/// A child process, killed and reaped when dropped (see the module docs).
#[derive(Debug)]
pub struct Process {
    child: Child,
    /// Its exit status, once seen (the pid is no longer its after that).
    exited: Option<ExitStatus>,
    /// The file its output goes to, if any.
    log: Option<PathBuf>,
    /// What it is, for messages.
    name: String,
}

impl Drop for Process {
    fn drop(&mut self) {
        if self.exited.is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

impl Process {
    /// Spawns `cmd` with the standard streams it was given (take a piped
    /// one with [`Process::take_stdout`]).
    pub fn spawn(cmd: &mut Command) -> Result<Process, ProcessError> {
        let name = cmd.get_program().to_string_lossy().into_owned();
        let child = cmd.spawn().map_err(io(format!("cannot run {name}")))?;
        Ok(Process {
            child,
            exited: None,
            log: None,
            name,
        })
    }

    /// Spawns `cmd` with no stdin, its stderr into a new file `log`, and
    /// its stdout into the same file or, if given, into a new file
    /// `stdout`. [`Process::log`] reads `log` back.
    pub fn spawn_logged(
        cmd: &mut Command,
        log: &Path,
        stdout: Option<&Path>,
    ) -> Result<Process, ProcessError> {
        let create =
            |p: &Path| std::fs::File::create(p).map_err(io(format!("create {}", p.display())));
        let err = create(log)?;
        let out = match stdout {
            Some(p) => create(p)?,
            None => err.try_clone().map_err(io("the log file"))?,
        };
        cmd.stdin(Stdio::null()).stdout(out).stderr(err);
        let mut p = Process::spawn(cmd)?;
        p.log = Some(log.to_path_buf());
        Ok(p)
    }

    /// Its process ID.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Its stdout, if it was piped and not taken yet.
    pub fn take_stdout(&mut self) -> Option<ChildStdout> {
        self.child.stdout.take()
    }

    /// Its stderr, if it was piped and not taken yet.
    pub fn take_stderr(&mut self) -> Option<ChildStderr> {
        self.child.stderr.take()
    }

    /// What it has logged so far ("" without a log file).
    pub fn log(&self) -> String {
        self.log
            .as_ref()
            .and_then(|p| std::fs::read_to_string(p).ok())
            .unwrap_or_default()
    }

    /// The last lines of its log, for a failure message.
    fn log_tail(&self) -> String {
        let log = self.log();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(LOG_LINES)..].join("\n")
    }

    fn timeout(&self, what: String) -> ProcessError {
        ProcessError::Timeout {
            what,
            log: self.log_tail(),
        }
    }

    /// Sends `signal`; an error if it has already exited.
    pub fn signal(&self, signal: Signal) -> Result<(), ProcessError> {
        if self.exited.is_some() {
            return Err(ProcessError::NotRunning(self.name.clone()));
        }
        let pid = libc::pid_t::try_from(self.child.id())
            .map_err(|_| ProcessError::NotRunning(self.name.clone()))?;
        // SAFETY: kill(2) on a child this value started and has not reaped
        // (`exited` is unset), so the pid is still its.
        if unsafe { libc::kill(pid, signal.number()) } != 0 {
            return Err(io(format!("signal {}", self.name))(
                std::io::Error::last_os_error(),
            ));
        }
        Ok(())
    }

    /// Its exit status if it has exited (reaping it), else `None`.
    pub fn try_exit(&mut self) -> Result<Option<ExitStatus>, ProcessError> {
        if self.exited.is_none() {
            self.exited = self
                .child
                .try_wait()
                .map_err(io(format!("wait for {}", self.name)))?;
        }
        Ok(self.exited)
    }

    /// Waits up to `limit` for it to exit (blocking the thread); its
    /// status.
    pub fn wait_exit(&mut self, limit: Duration) -> Result<ExitStatus, ProcessError> {
        let t = Instant::now();
        loop {
            if let Some(status) = self.exited_within(t, limit)? {
                return Ok(status);
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// [`Process::wait_exit`] for async code: the runtime's other tasks
    /// (a load, a client) run while it waits.
    pub async fn wait_exit_async(&mut self, limit: Duration) -> Result<ExitStatus, ProcessError> {
        let t = Instant::now();
        loop {
            if let Some(status) = self.exited_within(t, limit)? {
                return Ok(status);
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }

    /// One look of a wait that began at `t`: its status if it has exited,
    /// `None` to look again, an error once `limit` has passed.
    fn exited_within(
        &mut self,
        t: Instant,
        limit: Duration,
    ) -> Result<Option<ExitStatus>, ProcessError> {
        match self.try_exit()? {
            Some(status) => Ok(Some(status)),
            None if t.elapsed() > limit => {
                Err(self.timeout(format!("{} did not exit within {limit:?}", self.name)))
            }
            None => Ok(None),
        }
    }

    /// Sends `signal` and waits up to `limit` for it to exit; its status.
    pub fn stop(&mut self, signal: Signal, limit: Duration) -> Result<ExitStatus, ProcessError> {
        self.signal(signal)?;
        self.wait_exit(limit)
    }
}

/// What a command run to its end did ([`run`]).
#[derive(Debug, Clone)]
pub struct Finished {
    /// Its exit status.
    pub status: ExitStatus,
    /// Its stdout.
    pub stdout: String,
    /// Its stderr.
    pub stderr: String,
}

impl Finished {
    /// Whether it exited with success.
    pub fn success(&self) -> bool {
        self.status.success()
    }

    /// Its stdout, then its stderr: all it said.
    pub fn output(&self) -> String {
        format!("{}{}", self.stdout, self.stderr)
    }

    /// Its stdout if it succeeded, else all it said.
    pub fn into_result(self) -> Result<String, String> {
        if self.success() {
            Ok(self.stdout)
        } else {
            Err(self.output())
        }
    }
}

/// Runs `cmd` to its end with `stdin` written to it; what it did, whether
/// or not it succeeded.
pub fn run(mut cmd: Command, stdin: &str) -> Result<Finished, ProcessError> {
    let name = format!("{cmd:?}");
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(io(format!("cannot run {name}")))?;
    if let Some(mut input) = child.stdin.take() {
        input
            .write_all(stdin.as_bytes())
            .map_err(io(format!("write the stdin of {name}")))?;
    }
    let out = child
        .wait_with_output()
        .map_err(io(format!("wait for {name}")))?;
    Ok(Finished {
        status: out.status,
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    })
}

/// The `hearth` binary under test and the environment each of its
/// commands gets.
#[derive(Debug, Clone)]
pub struct Hearth {
    binary: PathBuf,
    envs: Vec<(OsString, OsString)>,
}

impl Hearth {
    /// The binary at `binary` (a test's `env!("CARGO_BIN_EXE_hearth")`).
    pub fn new(binary: impl Into<PathBuf>) -> Hearth {
        Hearth {
            binary: binary.into(),
            envs: Vec::new(),
        }
    }

    /// Sets the environment variable `key` for every command from here.
    pub fn env(mut self, key: impl AsRef<OsStr>, value: impl AsRef<OsStr>) -> Hearth {
        self.envs
            .push((key.as_ref().to_owned(), value.as_ref().to_owned()));
        self
    }

    /// The binary.
    pub fn binary(&self) -> &Path {
        &self.binary
    }

    /// `hearth ARGS` with this environment and no stdin, for a caller to
    /// adjust and run.
    pub fn command<I, S>(&self, args: I) -> Command
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        let mut cmd = Command::new(&self.binary);
        cmd.args(args).stdin(Stdio::null());
        for (k, v) in &self.envs {
            cmd.env(k, v);
        }
        cmd
    }

    /// Runs `hearth ARGS` to its end with `stdin`; what it did, whether or
    /// not it succeeded.
    pub fn run<I, S>(&self, args: I, stdin: &str) -> Result<Finished, ProcessError>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        run(self.command(args), stdin)
    }

    /// Runs `hearth ARGS`, which must succeed; its stdout.
    pub fn ok<I, S>(&self, args: I) -> Result<String, ProcessError>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        let args: Vec<OsString> = args.into_iter().map(|a| a.as_ref().to_owned()).collect();
        let done = self.run(&args, "")?;
        if done.success() {
            return Ok(done.stdout);
        }
        Err(ProcessError::Failed {
            command: format!("hearth {}", shown(&args)),
            status: done.status,
            output: done.output(),
        })
    }

    /// `hearth pki --dir DIR NODES…`: a development cluster's certificates,
    /// which must be made; its stdout.
    pub fn pki(&self, dir: &Path, nodes: &[&str]) -> Result<String, ProcessError> {
        let mut args: Vec<&OsStr> = vec!["pki".as_ref(), "--dir".as_ref(), dir.as_os_str()];
        args.extend(nodes.iter().map(OsStr::new));
        self.ok(args)
    }

    /// `hearth deploy --store STORE --name NAME EXTRA… WASM`: a Worker
    /// deployed into a store directory (before a node serves it), which
    /// must succeed; its stdout.
    pub fn deploy(
        &self,
        store: &Path,
        name: &str,
        wasm: &Path,
        extra: &[&str],
    ) -> Result<String, ProcessError> {
        let mut args: Vec<&OsStr> = vec![
            "deploy".as_ref(),
            "--store".as_ref(),
            store.as_os_str(),
            "--name".as_ref(),
            name.as_ref(),
        ];
        args.extend(extra.iter().map(OsStr::new));
        args.push(wasm.as_os_str());
        self.ok(args)
    }
}

/// Arguments as a command line, for messages.
fn shown(args: &[OsString]) -> String {
    args.iter()
        .map(|a| a.to_string_lossy())
        .collect::<Vec<_>>()
        .join(" ")
}

/// How to start `hearth serve` (see the module docs); [`ServeCommand::spawn`]
/// starts it, and again on the same ports after it stopped (a restart).
#[derive(Debug, Clone)]
pub struct ServeCommand {
    hearth: Hearth,
    http: SocketAddr,
    admin: SocketAddr,
    args: Vec<OsString>,
    envs: Vec<(OsString, OsString)>,
    current_dir: Option<PathBuf>,
    log: PathBuf,
    stdout: Option<PathBuf>,
    soft_nofile: Option<u64>,
    token: Option<String>,
    store: Option<PathBuf>,
}

impl ServeCommand {
    /// `hearth serve` listening for Workers and admin requests on free
    /// loopback ports, logging (stdout and stderr) to a new file `log`.
    pub fn new(hearth: &Hearth, log: impl Into<PathBuf>) -> Result<ServeCommand, ProcessError> {
        let port = || super::tcp_port().map_err(io("a free port"));
        Ok(ServeCommand {
            hearth: hearth.clone(),
            http: SocketAddr::from(([127, 0, 0, 1], port()?)),
            admin: SocketAddr::from(([127, 0, 0, 1], port()?)),
            args: Vec::new(),
            envs: vec![("RUST_LOG".into(), "info".into())],
            current_dir: None,
            log: log.into(),
            stdout: None,
            soft_nofile: None,
            token: None,
            store: None,
        })
    }

    /// A node of its own in `dir` (not started): config file
    /// `dir/node.toml` with admin token `token` and `extra_config` (TOML
    /// lines), store `dir/store`, log `dir/node.log`.
    pub fn standalone(
        hearth: &Hearth,
        dir: &Path,
        token: &str,
        extra_config: &str,
    ) -> Result<ServeCommand, ProcessError> {
        let config = dir.join("node.toml");
        std::fs::write(
            &config,
            format!("admin_token = \"{token}\"\n{extra_config}"),
        )
        .map_err(io("write the node's config"))?;
        Ok(ServeCommand::new(hearth, dir.join("node.log"))?
            .config(&config)
            .store(dir.join("store"))
            .token(token))
    }

    /// Runs the binary of `hearth` from now on (a node upgraded in place).
    pub fn hearth(mut self, hearth: &Hearth) -> ServeCommand {
        self.hearth = hearth.clone();
        self
    }

    /// Reads the config file at `path` (`--config`).
    pub fn config(self, path: impl AsRef<OsStr>) -> ServeCommand {
        self.arg("--config").arg(path)
    }

    /// Serves the store directory `path` (`--store`).
    pub fn store(mut self, path: impl Into<PathBuf>) -> ServeCommand {
        let path = path.into();
        self.store = Some(path.clone());
        self.arg("--store").arg(path)
    }

    /// The admin token the config gives the node: sent with
    /// [`NodeProcess::admin_get`] and given to the commands it runs.
    pub fn token(mut self, token: &str) -> ServeCommand {
        self.token = Some(token.to_string());
        self
    }

    /// One more argument of `hearth serve`.
    pub fn arg(mut self, arg: impl AsRef<OsStr>) -> ServeCommand {
        self.args.push(arg.as_ref().to_owned());
        self
    }

    /// Sets the environment variable `key` for the node (`RUST_LOG` is
    /// `info` unless set here).
    pub fn env(mut self, key: impl AsRef<OsStr>, value: impl AsRef<OsStr>) -> ServeCommand {
        self.envs
            .push((key.as_ref().to_owned(), value.as_ref().to_owned()));
        self
    }

    /// Runs the node in `dir` (where a relative `data` directory lands).
    pub fn current_dir(mut self, dir: impl Into<PathBuf>) -> ServeCommand {
        self.current_dir = Some(dir.into());
        self
    }

    /// Sends the node's stdout to a new file `path` instead of its log.
    pub fn stdout(mut self, path: impl Into<PathBuf>) -> ServeCommand {
        self.stdout = Some(path.into());
        self
    }

    /// Starts the node under a soft open-files limit of `n` (as a login
    /// shell's 1024 is).
    pub fn soft_nofile(mut self, n: u64) -> ServeCommand {
        self.soft_nofile = Some(n);
        self
    }

    /// Logs to a new file `path` instead (a restart's own log).
    pub fn log_to(mut self, path: impl Into<PathBuf>) -> ServeCommand {
        self.log = path.into();
        self
    }

    /// The Worker listener's address.
    pub fn http(&self) -> SocketAddr {
        self.http
    }

    /// The admin listener's address.
    pub fn admin(&self) -> SocketAddr {
        self.admin
    }

    /// Starts the node; it returns at once (see
    /// [`NodeProcess::wait_listening`] and [`NodeProcess::wait_ready`]).
    pub fn spawn(&self) -> Result<NodeProcess, ProcessError> {
        let mut cmd = match self.soft_nofile {
            Some(n) => {
                let mut c = Command::new("sh");
                c.args(["-c", &format!("ulimit -Sn {n} && exec \"$0\" \"$@\"")])
                    .arg(self.hearth.binary());
                c
            }
            None => Command::new(self.hearth.binary()),
        };
        cmd.arg("serve")
            .args(["--listen", &self.http.to_string()])
            .args(["--admin", &self.admin.to_string()])
            .args(&self.args);
        for (k, v) in self.hearth.envs.iter().chain(&self.envs) {
            cmd.env(k, v);
        }
        if let Some(dir) = &self.current_dir {
            cmd.current_dir(dir);
        }
        let mut process = Process::spawn_logged(&mut cmd, &self.log, self.stdout.as_deref())?;
        process.name = format!("hearth serve ({})", self.http);
        let hearth = match &self.token {
            Some(t) => self.hearth.clone().env("HEARTH_ADMIN_TOKEN", t),
            None => self.hearth.clone(),
        };
        Ok(NodeProcess {
            process,
            http: self.http,
            admin: self.admin,
            token: self.token.clone(),
            store: self.store.clone(),
            hearth,
        })
    }
}

/// A running `hearth serve` ([`ServeCommand::spawn`]); derefs to its
/// [`Process`] (signals, exit, log). Killed when dropped.
#[derive(Debug)]
pub struct NodeProcess {
    process: Process,
    http: SocketAddr,
    admin: SocketAddr,
    token: Option<String>,
    store: Option<PathBuf>,
    hearth: Hearth,
}

impl std::ops::Deref for NodeProcess {
    type Target = Process;
    fn deref(&self) -> &Process {
        &self.process
    }
}

impl std::ops::DerefMut for NodeProcess {
    fn deref_mut(&mut self) -> &mut Process {
        &mut self.process
    }
}

impl NodeProcess {
    /// [`ServeCommand::standalone`], started; returns once its Worker
    /// listener accepts connections.
    pub fn standalone(
        hearth: &Hearth,
        dir: &Path,
        token: &str,
        extra_config: &str,
    ) -> Result<NodeProcess, ProcessError> {
        let node = ServeCommand::standalone(hearth, dir, token, extra_config)?.spawn()?;
        node.wait_listening(START_TIMEOUT)?;
        Ok(node)
    }

    /// The Worker listener (Workers by `Host`).
    pub fn http(&self) -> SocketAddr {
        self.http
    }

    /// The admin listener.
    pub fn admin(&self) -> SocketAddr {
        self.admin
    }

    /// The admin API's URL, `http://ADDR`.
    pub fn admin_url(&self) -> String {
        format!("http://{}", self.admin)
    }

    /// The store directory given with [`ServeCommand::store`].
    pub fn store(&self) -> Option<&Path> {
        self.store.as_deref()
    }

    /// Waits up to `limit` until the Worker listener accepts connections.
    pub fn wait_listening(&self, limit: Duration) -> Result<(), ProcessError> {
        if listening(self.http, limit) {
            return Ok(());
        }
        Err(self.timeout(format!("{} did not listen within {limit:?}", self.name)))
    }

    /// Waits up to `limit` until `/readyz` answers 200; how long that took.
    pub fn wait_ready(&self, limit: Duration) -> Result<Duration, ProcessError> {
        let t = Instant::now();
        let mut last = None;
        while t.elapsed() < limit {
            match self.admin_get("/readyz") {
                Ok(r) if r.status == 200 => return Ok(t.elapsed()),
                other => last = Some(other),
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Err(self.not_ready(limit, last))
    }

    /// [`NodeProcess::wait_ready`] for async code.
    pub async fn wait_ready_async(&self, limit: Duration) -> Result<Duration, ProcessError> {
        let t = Instant::now();
        let mut last = None;
        while t.elapsed() < limit {
            match self.admin_request("/readyz").send_async(self.admin).await {
                Ok(r) if r.status == 200 => return Ok(t.elapsed()),
                other => last = Some(other),
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Err(self.not_ready(limit, last))
    }

    fn not_ready(
        &self,
        limit: Duration,
        last: Option<std::io::Result<TestResponse>>,
    ) -> ProcessError {
        let last = match last {
            Some(Ok(r)) => format!("{} {}", r.status, r.text()),
            Some(Err(e)) => e.to_string(),
            None => "not asked".into(),
        };
        self.timeout(format!(
            "{} was not ready within {limit:?} (/readyz: {last})",
            self.name
        ))
    }

    /// `GET path` with `Host: host` on the Worker listener.
    pub fn get(&self, host: &str, path: &str) -> std::io::Result<TestResponse> {
        HttpRequest::get(host, path).send(self.http)
    }

    /// `GET path` on the admin listener, with the admin token if the node
    /// has one.
    pub fn admin_get(&self, path: &str) -> std::io::Result<TestResponse> {
        self.admin_request(path).send(self.admin)
    }

    /// [`NodeProcess::admin_get`] for async code.
    pub async fn admin_get_async(&self, path: &str) -> std::io::Result<TestResponse> {
        self.admin_request(path).send_async(self.admin).await
    }

    fn admin_request(&self, path: &str) -> HttpRequest {
        let r = HttpRequest::get("admin", path);
        match &self.token {
            Some(t) => r.header("authorization", &format!("Bearer {t}")),
            None => r,
        }
    }

    /// The node's `/metrics` text.
    pub fn metrics(&self) -> std::io::Result<String> {
        Ok(self.admin_get("/metrics")?.text())
    }

    /// A typed client of its admin API, with its token.
    pub fn admin_client(
        &self,
    ) -> Result<hearth_admin_client::AdminClient, hearth_admin_client::AdminError> {
        hearth_admin_client::AdminClient::new(&self.admin_url(), self.token.clone())
    }

    /// Runs `hearth ARGS` (a command a user types at this node: its admin
    /// token is in the environment) to its end with `stdin`.
    pub fn hearth<I, S>(&self, args: I, stdin: &str) -> Result<Finished, ProcessError>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        self.hearth.run(args, stdin)
    }

    /// `hearth deploy --admin URL --name NAME EXTRA… WASM` through its admin
    /// API; what it did, whether or not it succeeded.
    pub fn deploy(
        &self,
        name: &str,
        wasm: &Path,
        extra: &[&str],
    ) -> Result<Finished, ProcessError> {
        let url = self.admin_url();
        let mut args: Vec<&OsStr> = ["deploy", "--admin", &url, "--name", name]
            .into_iter()
            .map(OsStr::new)
            .collect();
        args.extend(extra.iter().map(OsStr::new));
        args.push(wasm.as_os_str());
        self.hearth(args, "")
    }
}

/// Whether `addr` accepts TCP connections within `limit`.
pub fn listening(addr: SocketAddr, limit: Duration) -> bool {
    let t = Instant::now();
    loop {
        if std::net::TcpStream::connect(addr).is_ok() {
            return true;
        }
        if t.elapsed() > limit {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_process_is_stopped_by_a_signal_and_killed_on_drop() {
        let dir = tempfile::tempdir().expect("tempdir");
        let log = dir.path().join("log");
        let mut p = Process::spawn_logged(
            Command::new("sh").args(["-c", "echo started; exec sleep 30"]),
            &log,
            None,
        )
        .expect("spawn sh");
        // A signal sent before the shell ran `echo` would end it silently.
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while !p.log().contains("started") && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        let status = p
            .stop(Signal::Term, Duration::from_secs(10))
            .expect("exits");
        assert!(!status.success());
        assert!(p.log().contains("started"), "{}", p.log());
        assert!(matches!(
            p.signal(Signal::Int),
            Err(ProcessError::NotRunning(_))
        ));
        let pid = Process::spawn(Command::new("sleep").arg("30"))
            .map(|p| p.pid())
            .expect("spawn sleep");
        // Dropped above, so killed and reaped: no such process now.
        assert!(!Path::new(&format!("/proc/{pid}")).exists());
    }
}
