//! `hearth build WORKER.js`: a JavaScript Worker in the Workers module
//! syntax (`export default { async fetch(request, env, ctx) }`, Hono apps
//! included) built into a component hearth serves.
//!
//! Two steps, both in crate `hearth-js-engine`
//! ([`hearth_js_engine::build_file`]): esbuild bundles the module and its
//! imports into one ES module ([`hearth_js_engine::bundle`], which needs
//! Node.js and npm and installs esbuild into the user's cache once), then
//! hearth's engine, QuickJS-NG in a guest component this binary carries, is
//! snapshotted with that module started: the module's top level runs now,
//! not per instance, and `auto` reuses the component's instances.
//! `--bundle-only` stops after the first step. `hearth dev WORKER.js` runs
//! the same build on every edit.

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, bail};
use hearth_js_engine::bundle::Bundler;

/// `hearth build`'s flags.
#[derive(clap::Args)]
pub(crate) struct BuildArgs {
    /// The Worker's module (`.js`/`.mjs`/`.ts`): its default export has a
    /// `fetch(request, env, ctx)` method. Imports resolve from its
    /// directory (its own `node_modules`, e.g. `hono`).
    worker: PathBuf,
    /// Where to write the component (default: the module's path with
    /// `.wasm`; with --bundle-only, `.bundle.js`).
    #[arg(short, long)]
    out: Option<PathBuf>,
    /// Only bundle: write the single ES module esbuild makes of the Worker
    /// (what workerd or wrangler would run), no component.
    #[arg(long)]
    bundle_only: bool,
}

/// Builds the Worker: see the module docs.
pub(crate) fn run(args: BuildArgs) -> anyhow::Result<()> {
    let started = Instant::now();
    if !args.worker.is_file() {
        bail!("{}: no such file", args.worker.display());
    }
    let bundler = Bundler::new()?;
    if args.bundle_only {
        let out = out_path(&args, "bundle.js");
        let source = bundler.bundle(&args.worker)?;
        write(&out, source.as_bytes())?;
        eprintln!(
            "hearth build: wrote {} ({} bytes, bundled) in {:.1} s",
            out.display(),
            source.len(),
            started.elapsed().as_secs_f64()
        );
        return Ok(());
    }
    let out = out_path(&args, "wasm");
    let len = build_to(&bundler, &args.worker, &out)?;
    eprintln!(
        "hearth build: wrote {} ({len} bytes) in {:.1} s\n\
         deploy it with `hearth deploy --name NAME {}` (its instances are reused)",
        out.display(),
        started.elapsed().as_secs_f64(),
        out.display()
    );
    Ok(())
}

/// Builds the Worker `worker` into the component file `out` (its directory
/// made if missing), printing what its top level logged; the component's
/// size. The build `hearth build` and `hearth dev` share.
pub(crate) fn build_to(bundler: &Bundler, worker: &Path, out: &Path) -> anyhow::Result<usize> {
    let built = hearth_js_engine::build_file(bundler, worker)?;
    // What the module's top level logged, which ran now, not per instance.
    for line in &built.logs {
        eprintln!("{} (top level, at build): {line}", worker.display());
    }
    write(out, &built.component)?;
    Ok(built.component.len())
}

/// `--out`, else the module's path with `extension`.
fn out_path(args: &BuildArgs, extension: &str) -> PathBuf {
    args.out
        .clone()
        .unwrap_or_else(|| args.worker.with_extension(extension))
}

/// Writes `bytes` to `out`, making its directory first.
fn write(out: &Path, bytes: &[u8]) -> anyhow::Result<()> {
    if let Some(dir) = out.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    std::fs::write(out, bytes).with_context(|| format!("writing {}", out.display()))
}
