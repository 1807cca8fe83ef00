//! [`Etcd`]: a real etcd server for tests and benches, the fence that
//! Durable Objects' heads are advanced in when nodes share no disk.
//!
//! One member on free ports of 127.0.0.1, with a temporary data directory,
//! killed when dropped. The binary is `$HEARTH_ETCD`, else `etcd` on
//! `PATH` (Debian's `etcd-server`; `.ci/run` installs it).
//!
//! ```no_run
//! # async fn demo() -> anyhow::Result<()> {
//! use hearth::testing::Etcd;
//! let etcd = Etcd::start().await?;
//! let toml = format!("[objects]\netcd = [\"{}\"]\n", etcd.endpoint());
//! # let _ = toml; Ok(()) }
//! ```

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use super::{Process, ProcessError, tcp_port};

/// How long etcd may take to answer `/health` after it starts.
const START_TIMEOUT: Duration = Duration::from_secs(30);

/// Why an [`Etcd`] could not be started.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EtcdError {
    /// No etcd binary was found.
    #[error(
        "this needs an etcd server: `apt-get install etcd-server` (or set HEARTH_ETCD to its path)"
    )]
    NotInstalled,
    /// A file or socket operation failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: &'static str,
        /// Why it failed.
        #[source]
        source: std::io::Error,
    },
    /// The server process could not be started.
    #[error(transparent)]
    Process(#[from] ProcessError),
    /// The server did not become healthy in time; its log.
    #[error("etcd did not become healthy in {START_TIMEOUT:?}: {0}")]
    Timeout(String),
}

/// A one-member etcd server (see the module docs). Killed when dropped.
pub struct Etcd {
    server: Process,
    endpoint: String,
    _dir: tempfile::TempDir,
}

impl Etcd {
    /// The etcd binary, if one is installed.
    pub fn binary() -> Option<PathBuf> {
        if let Some(p) = std::env::var_os("HEARTH_ETCD") {
            return Some(PathBuf::from(p));
        }
        let path = std::env::var_os("PATH")?;
        std::env::split_paths(&path)
            .map(|dir| dir.join("etcd"))
            .find(|p| p.is_file())
    }

    /// Starts a server and waits until it reports itself healthy. Fails
    /// with a message saying how to install etcd if it is missing.
    pub async fn start() -> Result<Etcd, EtcdError> {
        let binary = Self::binary().ok_or(EtcdError::NotInstalled)?;
        let dir = tempfile::tempdir().map_err(|source| EtcdError::Io {
            what: "etcd's data directory",
            source,
        })?;
        let port = |what| tcp_port().map_err(|source| EtcdError::Io { what, source });
        let (client, peer) = (port("a client port")?, port("a peer port")?);
        let endpoint = format!("http://127.0.0.1:{client}");
        let peer_url = format!("http://127.0.0.1:{peer}");
        let log = dir.path().join("etcd.log");
        let mut cmd = Command::new(&binary);
        cmd.arg("--name=hearth")
            .arg(format!("--data-dir={}", dir.path().join("data").display()))
            .arg(format!("--listen-client-urls={endpoint}"))
            .arg(format!("--advertise-client-urls={endpoint}"))
            .arg(format!("--listen-peer-urls={peer_url}"))
            .arg(format!("--initial-advertise-peer-urls={peer_url}"))
            .arg(format!("--initial-cluster=hearth={peer_url}"));
        let server = Process::spawn_logged(&mut cmd, &log, None)?;
        let etcd = Etcd {
            server,
            endpoint,
            _dir: dir,
        };
        let started = Instant::now();
        loop {
            if super::HttpRequest::get("127.0.0.1", "/health")
                .send_async(([127, 0, 0, 1], client).into())
                .await
                .is_ok_and(|r| r.text().contains("\"health\":\"true\""))
            {
                return Ok(etcd);
            }
            if started.elapsed() > START_TIMEOUT {
                return Err(EtcdError::Timeout(etcd.server.log()));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Its client URL (`http://127.0.0.1:<port>`), as `[objects] etcd`
    /// takes it.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }
}
