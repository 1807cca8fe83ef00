//! A `hearth serve` process of a test's own, as a user starts one: a
//! config file in a temporary directory (loopback listeners on free ports,
//! a store directory, an admin token), logs to a file the test can read,
//! killed when dropped. Shared by the test modules that drive the node with
//! the commands a user types (`env`, `js_build`).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The `hearth` binary under test.
pub(crate) const BIN: &str = env!("CARGO_BIN_EXE_hearth");

/// A port on 127.0.0.1 that was free a moment ago.
pub(crate) fn free_port() -> u16 {
    hearth::testing::tcp_port().expect("a free port")
}

/// A running `hearth serve`; killed on drop.
pub(crate) struct ServeNode {
    child: Child,
    /// The front door (Workers by `Host`).
    pub(crate) http: SocketAddr,
    /// The admin API's URL.
    pub(crate) admin: String,
    /// The node's store directory.
    pub(crate) store: PathBuf,
    log: PathBuf,
}

impl Drop for ServeNode {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl ServeNode {
    /// Starts a node in `dir` with admin token `token` and `extra_config`
    /// (TOML lines) after the listeners and store; returns once the front
    /// door accepts connections.
    pub(crate) fn start(dir: &Path, token: &str, extra_config: &str) -> ServeNode {
        let store = dir.join("store");
        let (http, admin) = (free_port(), free_port());
        let cfg = dir.join("node.toml");
        std::fs::write(
            &cfg,
            format!(
                "listen = \"127.0.0.1:{http}\"\nadmin = \"127.0.0.1:{admin}\"\nstore = \"{}\"\n\
                 admin_token = \"{token}\"\n{extra_config}",
                store.display()
            ),
        )
        .expect("write config");
        let log = dir.join("node.log");
        let child = Command::new(BIN)
            .args(["serve", "--config"])
            .arg(&cfg)
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("log"))
            .spawn()
            .expect("spawn hearth serve");
        let node = ServeNode {
            child,
            http: ([127, 0, 0, 1], http).into(),
            admin: format!("http://127.0.0.1:{admin}"),
            store,
            log,
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        while std::net::TcpStream::connect(node.http).is_err() {
            assert!(Instant::now() < deadline, "never listened: {}", node.log());
            std::thread::sleep(Duration::from_millis(50));
        }
        node
    }

    /// The node process's id.
    pub(crate) fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The node's `/metrics` (the admin API serves it without a token).
    pub(crate) fn metrics(&self) -> String {
        use std::io::{Read, Write};
        let addr = self.admin.trim_start_matches("http://");
        let mut s = std::net::TcpStream::connect(addr).expect("connect to the admin API");
        // HTTP/1.0: the body comes as is and the connection ends with it.
        write!(s, "GET /metrics HTTP/1.0\r\nHost: {addr}\r\n\r\n").expect("write");
        let mut answer = String::new();
        s.read_to_string(&mut answer).expect("read /metrics");
        answer
    }

    /// What the node has logged so far.
    pub(crate) fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}
