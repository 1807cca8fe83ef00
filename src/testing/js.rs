//! The JS sample Workers' npm trees, for tests and benches that run
//! `hearth build` on them.
//!
//! `sample-workers/js/node_modules` holds the pinned JS toolchain (esbuild,
//! componentize-js): cargo's build of the samples installs it, and
//! `hearth build` takes it through `HEARTH_JS_NODE_MODULES` instead of
//! installing its own ([`js_toolchain`]). The Hono sample
//! (`sample-workers/js/hono`) has its own `package-lock.json`, for Hono
//! itself, which nothing builds by default: [`hono_sample`] runs `npm ci`
//! there once, when `node_modules/hono` is missing.
//!
//! ```no_run
//! let hono = hearth::testing::hono_sample()?;          // …/sample-workers/js/hono
//! let toolchain = hearth::testing::js_toolchain();     // Some(…/js/node_modules)
//! # let _ = (hono, toolchain); Ok::<(), hearth::testing::NpmError>(())
//! ```

use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus};

/// Why the Hono sample's `node_modules` could not be installed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum NpmError {
    /// npm could not be started.
    #[error("could not run npm (Node.js 18 or newer with npm is needed): {0}")]
    Spawn(#[source] std::io::Error),
    /// `npm ci` ran and failed; its output went to this process's stderr.
    #[error("npm ci in {} failed ({status})", dir.display())]
    Failed {
        /// The directory it ran in.
        dir: PathBuf,
        /// How it ended.
        status: ExitStatus,
    },
}

/// The JS samples' directory, `sample-workers/js` in this repository.
fn js_samples() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("sample-workers/js")
}

/// The Hono sample's directory (`sample-workers/js/hono`, holding
/// `worker.js`), with its `node_modules` installed by `npm ci` first if
/// `node_modules/hono` is missing.
pub fn hono_sample() -> Result<PathBuf, NpmError> {
    let dir = js_samples().join("hono");
    if !dir.join("node_modules/hono").is_dir() {
        let status = Command::new("npm")
            .args(["ci", "--no-audit", "--no-fund", "--loglevel=error"])
            .current_dir(&dir)
            .status()
            .map_err(NpmError::Spawn)?;
        if !status.success() {
            return Err(NpmError::Failed { dir, status });
        }
    }
    Ok(dir)
}

/// The JS samples' `node_modules` when it holds the pinned toolchain (it
/// has esbuild): the value for `hearth build`'s `HEARTH_JS_NODE_MODULES`,
/// which spares a test the toolchain install of a first `hearth build`.
/// None before cargo has built the JS samples.
pub fn js_toolchain() -> Option<PathBuf> {
    let modules = js_samples().join("node_modules");
    modules.join("esbuild").is_dir().then_some(modules)
}
