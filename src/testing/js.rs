//! JS Workers for tests: [`build_js`] builds a module's source into a
//! component with hearth's JS engine (no Node.js needed), and the JS sample
//! Workers' npm trees serve tests and benches that run `hearth build`.
//!
//! [`build_js`] is `hearth build`'s last step: the source must be one ES
//! module (no imports; `hearth build` bundles with esbuild first).
//! [`js_echo`] is the tests' JSON-echo Worker with test hooks. The
//! component is a Wizer snapshot of the engine with the module started, so
//! a module that does not start is a [`JsBuildError`] with QuickJS's
//! message, and the component's instances are reused under hearth's
//! default (`auto`) lifecycle. The first call in a process compiles the
//! engine (about a second); later ones take milliseconds.
//!
//! ```no_run
//! let component = hearth::testing::build_js(
//!     "export default { fetch() { return new Response('hi'); } };",
//! )?;
//! # let _ = component; Ok::<(), hearth::testing::JsBuildError>(())
//! ```
//!
//! `sample-workers/js/node_modules` holds esbuild at the version `hearth
//! build` pins (beside the `js` sample's componentize-js): cargo's build of
//! the samples installs it, and `hearth build` takes it through
//! `HEARTH_JS_NODE_MODULES` instead of installing its own
//! ([`js_toolchain`]). The Hono sample
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

pub use hearth_js_engine::BuildError as JsBuildError;

/// Builds `module_source` (one ES module in the Workers syntax, imports
/// bundled) into a component with hearth's JS engine: see the module docs.
pub fn build_js(module_source: &str) -> Result<Vec<u8>, JsBuildError> {
    hearth_js_engine::build(module_source)
}

/// The source of the JSON-echo Worker in the Workers module syntax,
/// `sdk/js/engine/tests/echo.js` (its test hooks are listed there).
pub fn js_echo() -> std::io::Result<String> {
    std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("sdk/js/engine/tests/echo.js"),
    )
}

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

/// The JS samples' `node_modules` when it holds esbuild: the value for
/// `hearth build`'s `HEARTH_JS_NODE_MODULES`, which spares a test the
/// esbuild install of a first `hearth build`. None before cargo has built
/// the JS samples.
pub fn js_toolchain() -> Option<PathBuf> {
    let modules = js_samples().join("node_modules");
    modules.join("esbuild").is_dir().then_some(modules)
}
