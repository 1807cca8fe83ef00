//! A Worker's module file and its imports made one ES module, the input of
//! [`crate::build`]: what `hearth build` and `hearth dev` run before the
//! engine's snapshot.
//!
//! ## The model
//!
//! - **The bundler** is esbuild, driven by `sdk/js/bundle.mjs` (the
//!   `sdk/js` package: its `package.json` pins esbuild, its
//!   `package-lock.json` the exact tree). It resolves the Worker's imports
//!   from the Worker's directory (its own `node_modules`, e.g. `hono`) with
//!   the export conditions Cloudflare's tooling uses, and refuses a bundle
//!   without a default export. Its messages (esbuild's, with file and line)
//!   go to this process's stderr, where the user reads them.
//! - **The package travels in this crate**: its files are compiled in
//!   ([`SDK`]), so an installed `hearth` needs only Node.js 18+ and npm. On
//!   first use [`Bundler::new`] writes them to
//!   `<cache>/js-sdk-<digest of the files>/` and runs `npm ci` there (once
//!   per package version, a few MB). `<cache>` is `$HEARTH_CACHE_DIR`, else
//!   `$XDG_CACHE_HOME/hearth`, else `~/.cache/hearth`. The install happens
//!   in a private directory renamed into place, so a concurrent or
//!   interrupted install never leaves a half-written package.
//! - **`HEARTH_JS_NODE_MODULES=DIR`** uses an installed `node_modules` with
//!   the same pinned esbuild instead: the package is written to a temporary
//!   directory beside a link to it (the tests point it at the JS samples'
//!   own, which cargo's build of the samples installs already).
//! - **Node first**: [`Bundler::new`] runs `node --version` before anything
//!   else, so a missing or old Node.js is named, with the command that
//!   installs it, in the first moments of a build; npm is needed only for
//!   the first install, and named the same way if it is missing then.
//!
//! ```no_run
//! let bundler = hearth_js_engine::bundle::Bundler::new()?;
//! let module = bundler.bundle(std::path::Path::new("worker.js"))?;
//! let component = hearth_js_engine::build(&module);
//! # let _ = component; Ok::<(), hearth_js_engine::bundle::BundleError>(())
//! ```

use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};

/// What to install when Node.js or npm is missing.
pub const NODE_HINT: &str = "building a JavaScript Worker needs Node.js 18 or newer with npm on \
     PATH (e.g. apt-get install -y nodejs npm)";

/// The oldest Node.js major version esbuild 0.25 runs on.
const NODE_MAJOR: u32 = 18;

/// The `sdk/js` package as this crate carries it: (path in the package,
/// contents).
macro_rules! sdk_files {
    ($($path:literal),* $(,)?) => {
        &[$(($path, include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/../../sdk/js/", $path)))),*]
    };
}

/// The files of the `sdk/js` package that bundling needs.
pub const SDK: &[(&str, &str)] = sdk_files![
    "package.json",
    "package-lock.json",
    "README.md",
    "bundle.mjs",
];

/// Why a Worker could not be bundled.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BundleError {
    /// Node.js is missing, failed, or is older than esbuild needs.
    #[error("{hint}: {detail}", hint = NODE_HINT)]
    NoNode {
        /// What `node --version` did.
        detail: String,
    },
    /// npm could not be started for the first install.
    #[error("{hint}: could not run npm: {0}", hint = NODE_HINT)]
    NoNpm(#[source] std::io::Error),
    /// `npm ci` ran and failed; its output went to this process's stderr.
    #[error(
        "installing the JS toolchain (esbuild) failed (`npm ci` in {}: {status}); the reason is above",
        dir.display()
    )]
    Install {
        /// The directory it ran in.
        dir: PathBuf,
        /// How it ended.
        status: ExitStatus,
    },
    /// No directory to install the toolchain into.
    #[error(
        "no cache directory for the JS toolchain: set HEARTH_CACHE_DIR (or XDG_CACHE_HOME or HOME)"
    )]
    NoCacheDir,
    /// `HEARTH_JS_NODE_MODULES` names no `node_modules` with esbuild.
    #[error("HEARTH_JS_NODE_MODULES={} is not a node_modules directory with esbuild", .0.display())]
    NotNodeModules(PathBuf),
    /// The Worker's module file does not exist.
    #[error("{}: no such file", .0.display())]
    NoWorker(PathBuf),
    /// esbuild refused the Worker (a syntax error, a missing import, no
    /// default export); its message went to this process's stderr.
    #[error("{} did not bundle ({status}): the reason is above", worker.display())]
    Failed {
        /// The Worker's module file.
        worker: PathBuf,
        /// How the bundler ended.
        status: ExitStatus,
    },
    /// A file or directory could not be made or read.
    #[error("{what} {}: {source}", path.display())]
    Io {
        /// What was being done.
        what: &'static str,
        /// On what.
        path: PathBuf,
        /// The error.
        #[source]
        source: std::io::Error,
    },
}

impl BundleError {
    fn io(what: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> Self {
        let path = path.to_path_buf();
        move |source| BundleError::Io { what, path, source }
    }
}

/// The `sdk/js` package on disk with esbuild installed beside it: made
/// once, then one [`Bundler::bundle`] per Worker (see the module docs).
#[derive(Debug)]
pub struct Bundler {
    /// The package's directory.
    dir: PathBuf,
    /// With `HEARTH_JS_NODE_MODULES`, the temporary directory `dir` is,
    /// removed when the bundler is dropped.
    _temp: Option<tempfile::TempDir>,
}

impl Bundler {
    /// Checks Node.js, then makes the package ready: linked to
    /// `$HEARTH_JS_NODE_MODULES` if set, else installed in the cache on
    /// first use (see the module docs).
    pub fn new() -> Result<Self, BundleError> {
        check_node()?;
        match std::env::var_os("HEARTH_JS_NODE_MODULES").filter(|v| !v.is_empty()) {
            Some(modules) => {
                let temp = tempfile::tempdir()
                    .map_err(BundleError::io("creating", &std::env::temp_dir()))?;
                write_sdk(temp.path())?;
                link_node_modules(Path::new(&modules), &temp.path().join("node_modules"))?;
                Ok(Bundler {
                    dir: temp.path().to_path_buf(),
                    _temp: Some(temp),
                })
            }
            None => Ok(Bundler {
                dir: installed_sdk()?,
                _temp: None,
            }),
        }
    }

    /// The package's directory (`bundle.mjs`, `node_modules`).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Bundles `worker` (a `.js`/`.mjs`/`.ts` module in the Workers syntax)
    /// and its imports into one ES module, returned as its source.
    pub fn bundle(&self, worker: &Path) -> Result<String, BundleError> {
        if !worker.is_file() {
            return Err(BundleError::NoWorker(worker.to_path_buf()));
        }
        let work =
            tempfile::tempdir().map_err(BundleError::io("creating", &std::env::temp_dir()))?;
        let out = work.path().join("worker.bundle.js");
        // esbuild's messages are the user's to read: stderr passes through
        // (stdout too: the bundler prints nothing there).
        let status = Command::new("node")
            .arg(self.dir.join("bundle.mjs"))
            .arg(worker)
            .arg("-o")
            .arg(&out)
            .stdin(Stdio::null())
            .status()
            .map_err(|e| BundleError::NoNode {
                detail: format!("could not run node: {e}"),
            })?;
        if !status.success() {
            return Err(BundleError::Failed {
                worker: worker.to_path_buf(),
                status,
            });
        }
        std::fs::read_to_string(&out).map_err(BundleError::io("reading the bundle", &out))
    }
}

/// Runs `node --version`: Node.js must be there and at least
/// [`NODE_MAJOR`].
fn check_node() -> Result<(), BundleError> {
    let out = Command::new("node")
        .arg("--version")
        .stdin(Stdio::null())
        .output()
        .map_err(|e| BundleError::NoNode {
            detail: format!("could not run node: {e}"),
        })?;
    if !out.status.success() {
        return Err(BundleError::NoNode {
            detail: format!("`node --version` failed ({})", out.status),
        });
    }
    let version = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let major = version
        .strip_prefix('v')
        .and_then(|v| v.split('.').next())
        .and_then(|m| m.parse::<u32>().ok());
    match major {
        Some(m) if m >= NODE_MAJOR => Ok(()),
        _ => Err(BundleError::NoNode {
            detail: format!("`node --version` says {version:?}"),
        }),
    }
}

/// The cache directory (see the module docs).
fn cache_dir() -> Result<PathBuf, BundleError> {
    let var = |name: &str| std::env::var_os(name).filter(|v| !v.is_empty());
    if let Some(dir) = var("HEARTH_CACHE_DIR") {
        return Ok(PathBuf::from(dir));
    }
    if let Some(dir) = var("XDG_CACHE_HOME") {
        return Ok(PathBuf::from(dir).join("hearth"));
    }
    match var("HOME") {
        Some(home) => Ok(PathBuf::from(home).join(".cache").join("hearth")),
        None => Err(BundleError::NoCacheDir),
    }
}

/// The package in the cache with its dependencies installed: written and
/// `npm ci`-ed on first use (see the module docs).
fn installed_sdk() -> Result<PathBuf, BundleError> {
    let mut hasher = blake3::Hasher::new();
    for (path, text) in SDK {
        hasher.update(path.as_bytes());
        hasher.update(&(text.len() as u64).to_le_bytes());
        hasher.update(text.as_bytes());
    }
    let digest = hasher.finalize().to_hex();
    let cache = cache_dir()?;
    let dir = cache.join(format!("js-sdk-{}", &digest[..16]));
    if dir.join("node_modules").is_dir() {
        return Ok(dir);
    }
    std::fs::create_dir_all(&cache).map_err(BundleError::io("creating", &cache))?;
    let work = tempfile::Builder::new()
        .prefix(".js-sdk-")
        .tempdir_in(&cache)
        .map_err(BundleError::io("creating a directory in", &cache))?;
    write_sdk(work.path())?;
    eprintln!(
        "installing the JS toolchain (esbuild) into {} once",
        dir.display()
    );
    let status = Command::new("npm")
        .args(["ci", "--no-audit", "--no-fund", "--loglevel=error"])
        .current_dir(work.path())
        .stdin(Stdio::null())
        .stdout(Stdio::from(std::io::stderr()))
        .status()
        .map_err(BundleError::NoNpm)?;
    if !status.success() {
        return Err(BundleError::Install {
            dir: work.path().to_path_buf(),
            status,
        });
    }
    let work = work.keep();
    match std::fs::rename(&work, &dir) {
        Ok(()) => Ok(dir),
        // Another build installed it meanwhile: use that one.
        Err(_) if dir.join("node_modules").is_dir() => {
            let _ = std::fs::remove_dir_all(&work);
            Ok(dir)
        }
        Err(e) => {
            let _ = std::fs::remove_dir_all(&work);
            Err(BundleError::io("moving the JS toolchain to", &dir)(e))
        }
    }
}

/// Writes the package's files under `dir`.
fn write_sdk(dir: &Path) -> Result<(), BundleError> {
    for (path, text) in SDK {
        let dest = dir.join(path);
        if let Some(parent) = dest.parent() {
            std::fs::create_dir_all(parent).map_err(BundleError::io("creating", parent))?;
        }
        std::fs::write(&dest, text).map_err(BundleError::io("writing", &dest))?;
    }
    Ok(())
}

/// Links `link` to the `node_modules` directory `target`, which must hold
/// esbuild.
fn link_node_modules(target: &Path, link: &Path) -> Result<(), BundleError> {
    let target = std::path::absolute(target).map_err(BundleError::io("resolving", target))?;
    if !target.join("esbuild").is_dir() {
        return Err(BundleError::NotNodeModules(target));
    }
    std::os::unix::fs::symlink(&target, link).map_err(BundleError::io("linking", link))
}
