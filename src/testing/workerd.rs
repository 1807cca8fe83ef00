//! workerd, Cloudflare's open-source Workers runtime, as the reference that
//! tests and benches compare hearth's JS engine with: [`workerd_binary`]
//! finds it or installs it with npm, [`Workerd::serve`] runs one module
//! Worker on a free local port until the value drops.
//!
//! The binary is the npm package [`WORKERD_PACKAGE`] at
//! [`WORKERD_VERSION`] (pinned: a test that takes workerd's answers as the
//! oracle must not change its mind with a new release), installed once
//! into `~/.cache/hearth/workerd-<version>`; `$HEARTH_WORKERD` names a
//! `workerd` binary to use instead. Without npm or the registry the caller
//! gets a [`WorkerdError`] and skips what needed workerd, saying so.
//!
//! ```no_run
//! let workerd = hearth::testing::Workerd::serve(
//!     "export default { fetch() { return new Response('hi'); } };",
//! )?;
//! println!("http://{}/", workerd.addr());
//! # Ok::<(), hearth::testing::WorkerdError>(())
//! ```

use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// The npm package of workerd's Linux x86-64 binary.
pub const WORKERD_PACKAGE: &str = "@cloudflare/workerd-linux-64";

/// The version of [`WORKERD_PACKAGE`] installed.
pub const WORKERD_VERSION: &str = "1.20261201.1";

/// The compatibility date the Worker runs with (standard URL parsing,
/// module Workers).
const COMPATIBILITY_DATE: &str = "2024-09-23";

/// Why workerd could not be had or started.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum WorkerdError {
    /// `$HOME` is not set, so there is no cache to install into.
    #[error("HOME is not set: nowhere to install workerd")]
    NoHome,
    /// npm could not be started.
    #[error("could not run npm to install {WORKERD_PACKAGE}: {0}")]
    Npm(#[source] std::io::Error),
    /// `npm install` ran and failed (its output went to this process's
    /// stderr).
    #[error("npm install {WORKERD_PACKAGE}@{WORKERD_VERSION} failed ({0})")]
    Install(ExitStatus),
    /// The workerd binary could not be started.
    #[error("could not start workerd ({}): {source}", path.display())]
    Spawn {
        /// The binary.
        path: PathBuf,
        /// Why not.
        #[source]
        source: std::io::Error,
    },
    /// Writing the Worker and its configuration failed.
    #[error(transparent)]
    Io(#[from] std::io::Error),
    /// workerd did not listen within its start-up time.
    #[error("workerd did not listen on {0} within 60 s")]
    NotReady(SocketAddr),
}

/// workerd's binary: `$HEARTH_WORKERD`, else the pinned npm package,
/// installed first if the cache does not hold it.
pub fn workerd_binary() -> Result<PathBuf, WorkerdError> {
    if let Some(p) = std::env::var_os("HEARTH_WORKERD") {
        return Ok(PathBuf::from(p));
    }
    let home = std::env::var_os("HOME").ok_or(WorkerdError::NoHome)?;
    let cache = PathBuf::from(home).join(format!(".cache/hearth/workerd-{WORKERD_VERSION}"));
    let binary = cache
        .join("node_modules")
        .join(WORKERD_PACKAGE)
        .join("bin/workerd");
    if binary.is_file() {
        return Ok(binary);
    }
    std::fs::create_dir_all(&cache)?;
    eprintln!(
        "installing {WORKERD_PACKAGE}@{WORKERD_VERSION} into {}",
        cache.display()
    );
    let status = Command::new("npm")
        .args(["install", "--no-audit", "--no-fund", "--no-save"])
        .arg(format!("{WORKERD_PACKAGE}@{WORKERD_VERSION}"))
        .current_dir(&cache)
        .stdout(Stdio::null())
        .status()
        .map_err(WorkerdError::Npm)?;
    if status.success() && binary.is_file() {
        Ok(binary)
    } else {
        Err(WorkerdError::Install(status))
    }
}

/// One module Worker served by workerd on a local port; the process is
/// killed when this drops.
pub struct Workerd {
    child: Child,
    addr: SocketAddr,
    _dir: tempfile::TempDir,
}

impl Workerd {
    /// Serves `module` (one ES module in the Workers syntax, no imports) on
    /// a free port of 127.0.0.1, once workerd listens there.
    pub fn serve(module: &str) -> Result<Workerd, WorkerdError> {
        Workerd::serve_with_objects(module, &[])
    }

    /// [`Workerd::serve`] with Durable Object bindings: (binding name,
    /// class the module exports) each, objects stored in memory (workerd's
    /// `inMemory` storage: lost when it stops).
    pub fn serve_with_objects(
        module: &str,
        objects: &[(&str, &str)],
    ) -> Result<Workerd, WorkerdError> {
        Workerd::serve_objects(module, objects, false)
    }

    /// [`Workerd::serve_with_objects`] with the objects stored on local
    /// disk (workerd's `localDisk` storage, SQLite files in its temporary
    /// directory): what a self-hosted workerd offers as durable, the
    /// reference for the Durable Objects bench.
    pub fn serve_with_objects_on_disk(
        module: &str,
        objects: &[(&str, &str)],
    ) -> Result<Workerd, WorkerdError> {
        Workerd::serve_objects(module, objects, true)
    }

    fn serve_objects(
        module: &str,
        objects: &[(&str, &str)],
        on_disk: bool,
    ) -> Result<Workerd, WorkerdError> {
        let dir = tempfile::tempdir()?;
        let mut services = String::new();
        let mut extra = String::new();
        if !objects.is_empty() {
            let bindings: Vec<String> = objects
                .iter()
                .map(|(name, class)| {
                    format!("(name = \"{name}\", durableObjectNamespace = \"{class}\")")
                })
                .collect();
            let classes: Vec<String> = objects
                .iter()
                .map(|(_, class)| {
                    format!("(className = \"{class}\", uniqueKey = \"hearth-test-{class}\")")
                })
                .collect();
            let storage = if on_disk {
                let objects_dir = dir.path().join("objects");
                std::fs::create_dir_all(&objects_dir)?;
                services = format!(
                    ", (name = \"objects-disk\", disk = (path = \"{}\", writable = true))",
                    objects_dir.display()
                );
                "localDisk = \"objects-disk\""
            } else {
                "inMemory = void"
            };
            extra = format!(
                "  bindings = [ {} ],\n  durableObjectNamespaces = [ {} ],\n  \
                 durableObjectStorage = ({storage}),\n",
                bindings.join(", "),
                classes.join(", ")
            );
        }
        let binary = workerd_binary()?;
        let addr = SocketAddr::from(([127, 0, 0, 1], super::tcp_port()?));
        std::fs::write(dir.path().join("worker.mjs"), module)?;
        std::fs::write(
            dir.path().join("config.capnp"),
            format!(
                r#"using Workerd = import "/workerd/workerd.capnp";
const config :Workerd.Config = (
  services = [ (name = "main", worker = .worker){services} ],
  sockets = [ (name = "http", address = "{addr}", http = (), service = "main") ],
);
const worker :Workerd.Worker = (
  modules = [ (name = "worker.mjs", esModule = embed "worker.mjs") ],
  compatibilityDate = "{COMPATIBILITY_DATE}",
{extra});
"#
            ),
        )?;
        let child = Command::new(&binary)
            .arg("serve")
            .arg(dir.path().join("config.capnp"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|source| WorkerdError::Spawn {
                path: binary,
                source,
            })?;
        let workerd = Workerd {
            child,
            addr,
            _dir: dir,
        };
        let started = Instant::now();
        while TcpStream::connect(addr).is_err() {
            if started.elapsed() > Duration::from_secs(60) {
                return Err(WorkerdError::NotReady(addr));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(workerd)
    }

    /// Where it listens (plain HTTP).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for Workerd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
