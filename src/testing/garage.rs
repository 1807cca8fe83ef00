//! [`Garage`]: a real S3-compatible server for tests, started and stopped
//! by the test.
//!
//! [Garage](https://garagehq.deuxfleurs.fr/) is a production distributed
//! object store written in Rust; one node with `replication_factor = 1`
//! and SQLite metadata starts in well under a second. The binary is found
//! as `$HEARTH_GARAGE`, else `garage` on `PATH`, else `~/.cargo/bin/garage`
//! (`cargo install garage --locked`; `.ci/run` installs it).
//!
//! ```no_run
//! # async fn demo() -> anyhow::Result<()> {
//! use hearth::testing::Garage;
//! let garage = Garage::start().await?;
//! let url = garage.url("cluster-a");      // s3://hearth/cluster-a
//! let settings = garage.settings();       // endpoint, region, credentials
//! # let _ = (url, settings); Ok(()) }
//! ```

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use hearth_runtime::S3Settings;

use super::{Process, ProcessError};

/// Why a [`Garage`] could not be started or driven.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum GarageError {
    /// No Garage binary was found.
    #[error(
        "the S3 tests need a Garage server: `cargo install garage --locked --version 2.5.0` \
         (or set HEARTH_GARAGE to its path)"
    )]
    NotInstalled,
    /// A file, socket or process operation failed.
    #[error("{what}")]
    Io {
        /// What was being done.
        what: String,
        /// Why it failed.
        #[source]
        source: std::io::Error,
    },
    /// The blocking start task panicked or was cancelled.
    #[error("garage start task")]
    Task(#[from] tokio::task::JoinError),
    /// A `garage` command exited with failure.
    #[error("garage {command} failed: {output}")]
    Command {
        /// Its arguments.
        command: String,
        /// Its stdout and stderr.
        output: String,
    },
    /// The server did not come up in time.
    #[error("{0}")]
    Timeout(String),
    /// The server process could not be started.
    #[error(transparent)]
    Process(#[from] ProcessError),
}

/// Wraps an I/O error with what was being done.
fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> GarageError {
    let what = what.into();
    move |source| GarageError::Io { what, source }
}

/// The bucket every [`Garage`] creates.
const BUCKET: &str = "hearth";
/// Garage's region name in the config it is started with.
const REGION: &str = "garage";
/// The access key the test server accepts (Garage key IDs are `GK` and 24
/// hex digits).
const KEY_ID: &str = "GK0123456789abcdef01234567";
/// Its secret (64 hex digits).
const SECRET: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

/// A one-node Garage server in a temporary directory, with bucket
/// `hearth` readable and writable by the key in [`Garage::settings`].
/// Killed when dropped.
pub struct Garage {
    server: Option<Process>,
    binary: PathBuf,
    config: PathBuf,
    s3: SocketAddr,
    dir: tempfile::TempDir,
}

impl Garage {
    /// The Garage binary, if one is installed.
    pub fn binary() -> Option<PathBuf> {
        if let Some(p) = std::env::var_os("HEARTH_GARAGE") {
            return Some(PathBuf::from(p));
        }
        if let Some(path) = std::env::var_os("PATH") {
            for dir in std::env::split_paths(&path) {
                let p = dir.join("garage");
                if p.is_file() {
                    return Some(p);
                }
            }
        }
        let home = std::env::var_os("HOME").map(PathBuf::from)?;
        let p = home.join(".cargo/bin/garage");
        p.is_file().then_some(p)
    }

    /// Starts a server, lays out its one node, and creates the bucket and
    /// key. Fails with a message saying how to install Garage if it is
    /// missing.
    pub async fn start() -> Result<Garage, GarageError> {
        let binary = Self::binary().ok_or(GarageError::NotInstalled)?;
        tokio::task::spawn_blocking(move || Self::start_blocking(binary)).await?
    }

    fn start_blocking(binary: PathBuf) -> Result<Garage, GarageError> {
        let dir = tempfile::tempdir().map_err(io("tempdir"))?;
        let (rpc, s3, admin) = (free_port()?, free_port()?, free_port()?);
        let config = dir.path().join("garage.toml");
        let secret = blake3::hash(dir.path().as_os_str().as_encoded_bytes()).to_hex();
        std::fs::write(
            &config,
            format!(
                r#"metadata_dir = "{meta}"
data_dir = "{data}"
db_engine = "sqlite"
replication_factor = 1
rpc_bind_addr = "{rpc}"
rpc_public_addr = "{rpc}"
rpc_secret = "{secret}"

[s3_api]
s3_region = "{REGION}"
api_bind_addr = "{s3}"

[admin]
api_bind_addr = "{admin}"
"#,
                meta = dir.path().join("meta").display(),
                data = dir.path().join("data").display(),
            ),
        )
        .map_err(io("write garage config"))?;
        let mut g = Garage {
            server: None,
            binary,
            config,
            s3,
            dir,
        };
        g.spawn()?;
        // The node's ID.
        let deadline = Instant::now() + Duration::from_secs(30);
        let node = loop {
            if let Ok(out) = g.cli(&["node", "id", "-q"]) {
                let id = out.trim().split('@').next().unwrap_or("").to_string();
                if !id.is_empty() {
                    break id;
                }
            }
            if Instant::now() > deadline {
                return Err(GarageError::Timeout(format!(
                    "garage did not start within 30 s (log: {})",
                    g.log().display()
                )));
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        // `node id` reads the node's key from disk, so it answers before the
        // server listens: wait for its RPC port too, and retry the first
        // command that needs the server until it takes.
        wait_port(rpc, deadline)?;
        let short = &node[..node.len().min(16)];
        loop {
            match g.cli(&["layout", "assign", "-z", "dc1", "-c", "1G", short]) {
                Ok(_) => break,
                Err(e) if Instant::now() > deadline => return Err(e),
                Err(_) => std::thread::sleep(Duration::from_millis(100)),
            }
        }
        g.cli(&["layout", "apply", "--version", "1"])?;
        g.cli(&["bucket", "create", BUCKET])?;
        g.cli(&[
            "key",
            "import",
            "--yes",
            "-n",
            "hearth-test",
            KEY_ID,
            SECRET,
        ])?;
        g.cli(&[
            "bucket", "allow", "--read", "--write", "--owner", BUCKET, "--key", KEY_ID,
        ])?;
        g.wait_s3()?;
        Ok(g)
    }

    /// Starts the server process (again, after [`Garage::stop`]), on the
    /// same ports and data.
    pub fn spawn(&mut self) -> Result<(), GarageError> {
        let server = Process::spawn_logged(
            Command::new(&self.binary)
                .arg("-c")
                .arg(&self.config)
                .arg("server")
                .env("RUST_LOG", "garage=warn"),
            &self.log(),
            None,
        )?;
        self.server = Some(server);
        Ok(())
    }

    /// Kills the server: the store becomes unreachable until
    /// [`Garage::restart`].
    pub fn stop(&mut self) {
        // Dropped: killed and reaped.
        self.server = None;
    }

    /// Starts the server again after [`Garage::stop`] and waits until S3
    /// answers.
    pub fn restart(&mut self) -> Result<(), GarageError> {
        self.stop();
        self.spawn()?;
        self.wait_s3()
    }

    /// Waits until the S3 port accepts connections.
    fn wait_s3(&self) -> Result<(), GarageError> {
        wait_port(self.s3, Instant::now() + Duration::from_secs(30))
    }

    fn log(&self) -> PathBuf {
        self.dir.path().join("garage.log")
    }

    /// Runs `garage -c CONFIG args…`; its stdout.
    fn cli(&self, args: &[&str]) -> Result<String, GarageError> {
        let out = Command::new(&self.binary)
            .arg("-c")
            .arg(&self.config)
            .args(args)
            .output()
            .map_err(io(format!("cannot run {}", self.binary.display())))?;
        if !out.status.success() {
            return Err(GarageError::Command {
                command: args.join(" "),
                output: format!(
                    "{}{}",
                    String::from_utf8_lossy(&out.stdout),
                    String::from_utf8_lossy(&out.stderr)
                ),
            });
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// The store URL of `prefix` in the bucket: `s3://hearth/<prefix>`.
    pub fn url(&self, prefix: &str) -> String {
        format!("s3://{BUCKET}/{prefix}")
    }

    /// The S3 endpoint, `http://127.0.0.1:PORT`.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.s3)
    }

    /// Settings that reach this server with its key.
    pub fn settings(&self) -> S3Settings {
        S3Settings {
            endpoint: Some(self.endpoint()),
            region: Some(REGION.into()),
            access_key_id: Some(KEY_ID.into()),
            secret_access_key: Some(SECRET.into()),
            allow_http: Some(true),
            // Generous: a debug build of Garage on a busy 2-core machine
            // can be slow; an unreachable server still fails at once
            // (connection refused).
            timeout: Some(Duration::from_secs(10)),
            timeout_ms: None,
            max_retries: Some(2),
        }
    }

    /// The same settings as a `[s3]` TOML section, for a node's config file.
    pub fn toml_section(&self) -> String {
        format!(
            "[s3]\nendpoint = \"{}\"\nregion = \"{REGION}\"\naccess_key_id = \"{KEY_ID}\"\n\
             secret_access_key = \"{SECRET}\"\nallow_http = true\ntimeout = \"10s\"\nmax_retries = 2\n",
            self.endpoint()
        )
    }

    /// The directory the server keeps its data in.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }
}

/// Waits until `addr` accepts TCP connections, until `deadline`.
fn wait_port(addr: SocketAddr, deadline: Instant) -> Result<(), GarageError> {
    if super::listening(addr, deadline.saturating_duration_since(Instant::now())) {
        return Ok(());
    }
    Err(GarageError::Timeout(format!(
        "garage did not open {addr} within 30 s"
    )))
}

fn free_port() -> Result<SocketAddr, GarageError> {
    let port = super::tcp_port().map_err(io("a free port"))?;
    Ok(SocketAddr::from(([127, 0, 0, 1], port)))
}
