//! `hearth build WORKER.js`: a JavaScript Worker in the Workers module
//! syntax (`export default { async fetch(request, env, ctx) }`, Hono apps
//! included) built into a component hearth serves.
//!
//! Two steps. The JS package in `sdk/js/` (`hearth-build`, run with
//! `--bundle-only`) has esbuild bundle the Worker and its imports into one
//! ES module. Then the engine (`--engine`):
//!
//! - `quickjs` (the default): hearth's own engine, QuickJS-NG in a guest
//!   component this binary carries (crate `hearth-js-engine`), snapshotted
//!   with the Worker's module started ([`hearth_js_engine::build`]): no
//!   JS runs at instantiation, and `auto` reuses its instances.
//! - `starlingmonkey`: componentize-js (StarlingMonkey), as before this
//!   engine existed, kept for comparison: `hearth-build` bundles the Worker
//!   behind a shim that exports wasi:http/incoming-handler and
//!   componentizes it (the steps and the shim's `env` are in its files).
//!
//! This binary carries a copy of the `sdk/js` package, so an installed
//! `hearth` needs only Node.js and npm: on first use the copy is written to
//! `<cache>/js-sdk-<digest of its files>/` and its pinned dependencies
//! installed there with `npm ci` (once per package version; about 400 MB,
//! most of it componentize-js's engine). `<cache>` is `$HEARTH_CACHE_DIR`,
//! else `$XDG_CACHE_HOME/hearth`, else `~/.cache/hearth`.
//!
//! `HEARTH_JS_NODE_MODULES=DIR` uses an installed `node_modules` with the
//! same pinned versions instead (the tests point it at the JS samples'
//! own, which cargo's build of the samples installs already).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{Context, bail};

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
    /// The JS engine the component embeds: `quickjs` (hearth's own: the
    /// Worker's module started at build time, instances reused) or
    /// `starlingmonkey` (componentize-js, kept for comparison).
    #[arg(long, value_enum, default_value_t = JsEngine::Quickjs)]
    engine: JsEngine,
}

/// `hearth build --engine`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum JsEngine {
    /// QuickJS-NG, snapshotted with the Worker started (crate
    /// `hearth-js-engine`).
    Quickjs,
    /// componentize-js (StarlingMonkey).
    Starlingmonkey,
}

/// The `sdk/js` package, as this binary carries it: (path in the package,
/// contents).
macro_rules! sdk_files {
    ($($path:literal),* $(,)?) => {
        &[$(($path, include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/sdk/js/", $path)))),*]
    };
}

const SDK: &[(&str, &str)] = sdk_files![
    "package.json",
    "package-lock.json",
    "README.md",
    "build.mjs",
    "shim.js",
    "wit/world.wit",
    "wit/deps/cli/command.wit",
    "wit/deps/cli/environment.wit",
    "wit/deps/cli/exit.wit",
    "wit/deps/cli/imports.wit",
    "wit/deps/cli/run.wit",
    "wit/deps/cli/stdio.wit",
    "wit/deps/cli/terminal.wit",
    "wit/deps/clocks/monotonic-clock.wit",
    "wit/deps/clocks/timezone.wit",
    "wit/deps/clocks/wall-clock.wit",
    "wit/deps/clocks/world.wit",
    "wit/deps/filesystem/preopens.wit",
    "wit/deps/filesystem/types.wit",
    "wit/deps/filesystem/world.wit",
    "wit/deps/http/handler.wit",
    "wit/deps/http/proxy.wit",
    "wit/deps/http/types.wit",
    "wit/deps/io/error.wit",
    "wit/deps/io/poll.wit",
    "wit/deps/io/streams.wit",
    "wit/deps/io/world.wit",
    "wit/deps/random/insecure-seed.wit",
    "wit/deps/random/insecure.wit",
    "wit/deps/random/random.wit",
    "wit/deps/random/world.wit",
    "wit/deps/sockets/instance-network.wit",
    "wit/deps/sockets/ip-name-lookup.wit",
    "wit/deps/sockets/network.wit",
    "wit/deps/sockets/tcp-create-socket.wit",
    "wit/deps/sockets/tcp.wit",
    "wit/deps/sockets/udp-create-socket.wit",
    "wit/deps/sockets/udp.wit",
    "wit/deps/sockets/world.wit",
];

/// What to install when a tool is missing.
const NODE_HINT: &str =
    "hearth build needs Node.js 18 or newer with npm on PATH (e.g. apt-get install -y nodejs npm)";

/// Builds the Worker: see the module docs.
pub(crate) fn run(args: BuildArgs) -> anyhow::Result<()> {
    if !args.worker.is_file() {
        bail!("{}: no such file", args.worker.display());
    }
    let version = Command::new("node")
        .arg("--version")
        .stdin(Stdio::null())
        .output();
    match version {
        Ok(out) if out.status.success() => {}
        Ok(out) => bail!("{NODE_HINT}: `node --version` failed ({})", out.status),
        Err(e) => bail!("{NODE_HINT}: could not run node: {e}"),
    }

    // With HEARTH_JS_NODE_MODULES the package is written to a temporary
    // directory beside a link to that node_modules; otherwise to the cache,
    // where its dependencies are installed once.
    let linked = std::env::var_os("HEARTH_JS_NODE_MODULES").filter(|v| !v.is_empty());
    let temp;
    let sdk = match &linked {
        Some(modules) => {
            temp = tempfile::tempdir().context("creating a temporary directory")?;
            write_sdk(temp.path())?;
            symlink(Path::new(modules), &temp.path().join("node_modules"))?;
            temp.path().to_path_buf()
        }
        None => installed_sdk()?,
    };

    if args.bundle_only {
        return hearth_build(&sdk, &args.worker, &["--bundle-only"], args.out.as_deref());
    }
    match args.engine {
        JsEngine::Quickjs => build_quickjs(&sdk, &args),
        JsEngine::Starlingmonkey => {
            hearth_build(&sdk, &args.worker, &[], args.out.as_deref())?;
            // The shim serves request after request on one instance, but
            // `auto` picks fresh for every componentize-js component (it
            // cannot tell this kind from the fetch-event kind), and the
            // engine makes it larger than the free plan allows.
            eprintln!(
                "deploy it with `hearth deploy --lifecycle reuse --plan paid --name NAME FILE.wasm` \
                 (or `lifecycle = \"reuse\"` and `plan = \"paid\"` in its manifest)"
            );
            Ok(())
        }
    }
}

/// Runs the package's `build.mjs` with `flags` on `worker`, writing `out`
/// (its default if None).
fn hearth_build(
    sdk: &Path,
    worker: &Path,
    flags: &[&str],
    out: Option<&Path>,
) -> anyhow::Result<()> {
    let mut cmd = Command::new("node");
    cmd.arg(sdk.join("build.mjs")).args(flags).arg(worker);
    if let Some(out) = out {
        cmd.arg("-o").arg(out);
    }
    // The build's messages (esbuild's errors among them) are the user's to
    // read: stderr is passed through, stdout too.
    let status = cmd
        .stdin(Stdio::null())
        .status()
        .with_context(|| format!("{NODE_HINT}: could not run node"))?;
    if !status.success() {
        bail!(
            "{} did not build ({status}): the reason is above",
            worker.display()
        );
    }
    Ok(())
}

/// `--engine quickjs`: the bundle, then the engine's snapshot of it.
fn build_quickjs(sdk: &Path, args: &BuildArgs) -> anyhow::Result<()> {
    let started = std::time::Instant::now();
    let work = tempfile::tempdir().context("creating a temporary directory")?;
    let bundle = work.path().join("worker.bundle.js");
    hearth_build(sdk, &args.worker, &["--bundle-only"], Some(&bundle))?;
    let source = std::fs::read_to_string(&bundle)
        .with_context(|| format!("reading the bundle {}", bundle.display()))?;
    let built = hearth_js_engine::build_logged(&source)
        .map_err(|e| anyhow::anyhow!("{} does not build: {e}", args.worker.display()))?;
    // What the module's top level logged, which ran now, not per instance.
    for line in &built.logs {
        eprintln!("{} (top level, at build): {line}", args.worker.display());
    }
    let component = built.component;
    let out = match &args.out {
        Some(out) => out.clone(),
        None => args.worker.with_extension("wasm"),
    };
    if let Some(dir) = out.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    std::fs::write(&out, &component).with_context(|| format!("writing {}", out.display()))?;
    eprintln!(
        "hearth build: wrote {} ({} bytes, engine quickjs) in {:.1} s\n\
         deploy it with `hearth deploy --name NAME {}` (its instances are reused)",
        out.display(),
        component.len(),
        started.elapsed().as_secs_f64(),
        out.display()
    );
    Ok(())
}

/// The cache directory (see the module docs).
fn cache_dir() -> anyhow::Result<PathBuf> {
    let var = |name: &str| std::env::var_os(name).filter(|v| !v.is_empty());
    if let Some(dir) = var("HEARTH_CACHE_DIR") {
        return Ok(PathBuf::from(dir));
    }
    if let Some(dir) = var("XDG_CACHE_HOME") {
        return Ok(PathBuf::from(dir).join("hearth"));
    }
    match var("HOME") {
        Some(home) => Ok(PathBuf::from(home).join(".cache").join("hearth")),
        None => bail!("no cache directory: set HEARTH_CACHE_DIR (or XDG_CACHE_HOME or HOME)"),
    }
}

/// The package in the cache with its dependencies installed: written and
/// `npm ci`-ed on first use. Both steps happen in a private directory and
/// are renamed into place, so a concurrent or interrupted build never sees
/// a half-written package.
fn installed_sdk() -> anyhow::Result<PathBuf> {
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
    std::fs::create_dir_all(&cache)
        .with_context(|| format!("creating the cache directory {}", cache.display()))?;
    let work = tempfile::Builder::new()
        .prefix(".js-sdk-")
        .tempdir_in(&cache)
        .with_context(|| format!("creating a directory in {}", cache.display()))?;
    write_sdk(work.path())?;
    eprintln!(
        "hearth build: installing the JS toolchain (esbuild, componentize-js) into {} once",
        dir.display()
    );
    let status = Command::new("npm")
        .args(["ci", "--no-audit", "--no-fund", "--loglevel=error"])
        .current_dir(work.path())
        .stdin(Stdio::null())
        .stdout(Stdio::from(std::io::stderr()))
        .status();
    match status {
        Ok(s) if s.success() => {}
        Ok(s) => bail!(
            "installing the JS toolchain failed (`npm ci` in {}: {s}); the reason is above",
            work.path().display()
        ),
        Err(e) => bail!("{NODE_HINT}: could not run npm: {e}"),
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
            Err(e).with_context(|| format!("moving the JS toolchain to {}", dir.display()))
        }
    }
}

/// Writes the package's files under `dir`.
fn write_sdk(dir: &Path) -> anyhow::Result<()> {
    for (path, text) in SDK {
        let dest = dir.join(path);
        if let Some(parent) = dest.parent() {
            std::fs::create_dir_all(parent)
                .with_context(|| format!("creating {}", parent.display()))?;
        }
        std::fs::write(&dest, text).with_context(|| format!("writing {}", dest.display()))?;
    }
    Ok(())
}

fn symlink(target: &Path, link: &Path) -> anyhow::Result<()> {
    let target =
        std::path::absolute(target).with_context(|| format!("resolving {}", target.display()))?;
    if !target.join("esbuild").is_dir() {
        bail!(
            "HEARTH_JS_NODE_MODULES={} is not a node_modules directory with esbuild",
            target.display()
        );
    }
    std::os::unix::fs::symlink(&target, link)
        .with_context(|| format!("linking {} to {}", link.display(), target.display()))
}
