//! `hearth dev`: a dev loop for one Worker.
//!
//! It starts one local node (a one-node [`LoopbackCluster`], as `hearth
//! cluster` does), deploys FILE to it, and serves it on `--listen`: every
//! request there goes to this Worker, whatever its Host, and prints a line
//! with its method, path, status, time to the response head and the
//! node's `server-timing`. It then watches FILE and every `--watch`
//! directory; when they change (one burst of writes is one change), it
//! runs the `--build` command (`sh -c`, with this terminal's output) and
//! redeploys FILE through the node's own deploy path (the one the admin
//! API takes), so the next request is served by the new version. A failed
//! build, or a FILE the node refuses, prints why and leaves the last good
//! version serving. Ctrl-C stops the node and exits.
//!
//! Changes made while a build runs are folded into it (the build's own
//! writes to FILE would otherwise start the next build). A manifest beside
//! FILE (or `--manifest`) is read as `hearth deploy` reads it. A
//! `.dev.vars` file beside FILE (`KEY=VALUE` lines, as wrangler reads it)
//! gives the Worker vars for this dev loop, over the manifest's `[vars]`:
//! the Worker reads them as it reads vars and secrets in production
//! (environment, `wasi:config/store`); only their names are printed. The
//! Worker's own output (stdout, stderr) is in the node log this command
//! prints (see the runtime's `tail` module), tagged with its script ID.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use notify_debouncer_mini::notify::RecursiveMode;
use notify_debouncer_mini::{DebounceEventResult, new_debouncer};

use hearth::cluster::{ClusterConfig, LoopbackCluster};
use hearth::node::Node;
use hearth::runtime::Manifest;
use hearth::runtime::body::Body;
use hearth::runtime::timing::SERVER_TIMING_HEADER;

/// How long the watched files must be quiet before a change counts.
const DEBOUNCE: Duration = Duration::from_millis(150);

/// `hearth dev`'s flags.
#[derive(clap::Args)]
pub(crate) struct DevArgs {
    /// Command run with `sh -c` when the watched sources change, before
    /// FILE is redeployed (e.g. "cargo build --release --target
    /// wasm32-wasip2 && cp target/.../app.wasm app.wasm").
    #[arg(long)]
    build: Option<String>,
    /// A directory of sources to watch as well, recursively (repeatable).
    #[arg(long = "watch", value_name = "DIR")]
    watch: Vec<PathBuf>,
    /// Script ID (default: FILE's name without `.wasm`).
    #[arg(long)]
    name: Option<String>,
    /// Where the Worker is served (every request there goes to it).
    #[arg(long, default_value = "127.0.0.1:8787")]
    listen: SocketAddr,
    /// Manifest (TOML); default: FILE with a .toml extension, if it exists.
    #[arg(long)]
    manifest: Option<PathBuf>,
    /// Store directory (default: a temporary one, removed on exit).
    #[arg(long)]
    store: Option<PathBuf>,
    /// The component (.wasm) to serve; the build command writes it.
    file: PathBuf,
}

/// Starts the node, deploys, then serves, watches and redeploys until Ctrl-C.
pub(crate) async fn run(args: DevArgs) -> anyhow::Result<()> {
    let file = std::path::absolute(&args.file)
        .with_context(|| format!("cannot resolve {}", args.file.display()))?;
    let name = match &args.name {
        Some(n) => n.clone(),
        None => file
            .file_stem()
            .and_then(|s| s.to_str())
            .context("FILE has no name to serve it under: say --name")?
            .to_ascii_lowercase(),
    };
    if !hearth::runtime::store::validate::valid_script_id(&name) {
        bail!("{name:?} is not a script ID (a DNS label): say --name");
    }
    let mut manifest = crate::deploy::read_manifest(args.manifest.as_deref(), &file)?;
    dev_vars(&file, &mut manifest)?;

    let temp;
    let store = match &args.store {
        Some(s) => s.clone(),
        None => {
            temp = tempfile::tempdir().context("cannot make a temporary store")?;
            temp.path().to_path_buf()
        }
    };
    let mut cfg = ClusterConfig::new(1, &store);
    cfg.https = false;
    cfg.sharding = false;
    let cluster = LoopbackCluster::start(cfg).await?;
    let node = cluster.node(0).node.clone();

    let mut last_good = None;
    deploy(&node, &name, &manifest, &file, &mut last_good).await;

    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("cannot listen on {}", args.listen))?;
    let addr = listener.local_addr()?;
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let server = tokio::spawn(serve(listener, node.clone(), name.clone(), stop_rx));
    crate::say(&format!(
        "hearth dev: serving {name} on http://{addr}/ (admin http://{}, token {})",
        cluster.node(0).admin_addr,
        cluster.token()
    ));

    let (tx, mut changes) = tokio::sync::mpsc::unbounded_channel();
    let mut debouncer = new_debouncer(DEBOUNCE, move |r: DebounceEventResult| {
        let _ = tx.send(r);
    })
    .context("cannot watch files")?;
    let watched = Watched::new(&file, &args.watch)?;
    for (path, mode) in watched.roots() {
        debouncer
            .watcher()
            .watch(&path, mode)
            .with_context(|| format!("cannot watch {}", path.display()))?;
    }
    crate::say(&format!(
        "watching {}{}; Ctrl-C to stop",
        file.display(),
        watched
            .dirs
            .iter()
            .map(|d| format!(", {}/", d.display()))
            .collect::<String>()
    ));

    loop {
        tokio::select! {
            r = tokio::signal::ctrl_c() => {
                r.context("cannot catch Ctrl-C")?;
                break;
            }
            Some(events) = changes.recv() => {
                let changed = match events {
                    Ok(events) => events.iter().any(|e| watched.covers(&e.path)),
                    Err(e) => {
                        crate::say(&format!("watch error: {e}"));
                        false
                    }
                };
                if !changed {
                    continue;
                }
                if let Some(cmd) = &args.build {
                    let ok = build(cmd).await;
                    // The build's own writes (to FILE, say) are not a change.
                    tokio::time::sleep(DEBOUNCE * 2).await;
                    while changes.try_recv().is_ok() {}
                    if !ok {
                        continue;
                    }
                }
                deploy(&node, &name, &manifest, &file, &mut last_good).await;
            }
        }
    }
    crate::say("stopping");
    drop(debouncer);
    let _ = stop_tx.send(true);
    let _ = server.await;
    cluster.shutdown().await;
    Ok(())
}

/// What is watched: FILE (through its directory, since a build may replace
/// it rather than write it) and each `--watch` directory.
struct Watched {
    file: PathBuf,
    dirs: Vec<PathBuf>,
}

impl Watched {
    fn new(file: &Path, dirs: &[PathBuf]) -> anyhow::Result<Self> {
        let dirs = dirs
            .iter()
            .map(|d| {
                std::fs::canonicalize(d)
                    .with_context(|| format!("cannot watch {}: no such directory", d.display()))
            })
            .collect::<anyhow::Result<_>>()?;
        let file = std::fs::canonicalize(file)
            .with_context(|| format!("cannot read {}", file.display()))?;
        Ok(Watched { file, dirs })
    }

    /// The paths to hand the watcher.
    fn roots(&self) -> Vec<(PathBuf, RecursiveMode)> {
        let mut roots: Vec<_> = self
            .dirs
            .iter()
            .map(|d| (d.clone(), RecursiveMode::Recursive))
            .collect();
        if let Some(parent) = self.file.parent() {
            roots.push((parent.to_path_buf(), RecursiveMode::NonRecursive));
        }
        roots
    }

    /// Whether a change of `path` is a change of the Worker's sources.
    fn covers(&self, path: &Path) -> bool {
        path == self.file || self.dirs.iter().any(|d| path.starts_with(d))
    }
}

/// Runs the build command, its output on this terminal; says how it ended.
async fn build(cmd: &str) -> bool {
    crate::say(&format!("building: {cmd}"));
    let t = Instant::now();
    match tokio::process::Command::new("sh")
        .arg("-c")
        .arg(cmd)
        .status()
        .await
    {
        Ok(s) if s.success() => {
            crate::say(&format!("built in {:.1} s", t.elapsed().as_secs_f64()));
            true
        }
        Ok(s) => {
            crate::say(&format!(
                "build failed ({s}); still serving the last good version"
            ));
            false
        }
        Err(e) => {
            crate::say(&format!(
                "build failed: cannot run sh: {e}; still serving the last good version"
            ));
            false
        }
    }
}

/// Deploys FILE through the node (as the admin API does) unless it is the
/// version already serving; says what happened. `last_good` is the hash
/// of the version serving.
async fn deploy(
    node: &Node,
    name: &str,
    manifest: &Manifest,
    file: &Path,
    last_good: &mut Option<String>,
) {
    let bytes = match std::fs::read(file) {
        Ok(b) => b,
        Err(e) => {
            crate::say(&format!("cannot read {}: {e}", file.display()));
            return;
        }
    };
    match node.deploy(name, manifest.clone(), bytes).await {
        Ok(d) => {
            let meta = &d.report.meta;
            if last_good.as_deref() == Some(meta.hash.as_str()) {
                crate::say(&format!("{name}: unchanged (hash {})", meta.hash));
            } else {
                crate::say(&format!(
                    "deployed {name}: {} bytes, hash {}, compile {:.1} ms",
                    meta.size,
                    meta.hash,
                    d.report.compile_time.as_secs_f64() * 1000.0
                ));
            }
            *last_good = Some(meta.hash.clone());
        }
        Err(e) => {
            crate::say(&format!("deploy of {name} failed: {e}"));
            if last_good.is_some() {
                crate::say("still serving the last good version");
            }
        }
    }
}

/// Serves every request on `listener` with the Worker, printing a line
/// for each, until `stop` turns true.
async fn serve(
    listener: tokio::net::TcpListener,
    node: Node,
    name: String,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    let limits = hearth::listener::ServeLimits::default();
    let budget = hearth::runtime::instances::pre_slot::ByteBudget::new(
        limits.max_pre_slot_bytes,
        "hearth dev",
    );
    let handler = move |mut req: http::Request<Body>, _peer| {
        let (node, name) = (node.clone(), name.clone());
        async move {
            hearth::runtime::flow::strip_host_headers(req.headers_mut());
            let line = format!("{} {}", req.method(), req.uri());
            let t = Instant::now();
            let resp = node.handle(&name, req).await;
            let timing = resp
                .headers()
                .get(SERVER_TIMING_HEADER)
                .and_then(|v| v.to_str().ok())
                .map(|v| format!(" [{v}]"))
                .unwrap_or_default();
            crate::say(&format!(
                "{line} -> {} in {:.1} ms{timing}",
                resp.status().as_u16(),
                t.elapsed().as_secs_f64() * 1000.0
            ));
            resp
        }
    };
    let stopped = async move {
        let _ = stop.wait_for(|s| *s).await;
    };
    hearth::listener::serve(listener, limits, budget, handler, stopped, None, None).await;
}

/// Reads `.dev.vars` beside FILE, if there is one, into the manifest's
/// vars (checked as a deploy checks them) and lists their names (never the
/// values).
fn dev_vars(file: &Path, manifest: &mut Manifest) -> anyhow::Result<()> {
    let path = file.with_file_name(".dev.vars");
    let Ok(text) = std::fs::read_to_string(&path) else {
        return Ok(());
    };
    let vars = parse_dev_vars(&text).with_context(|| format!("in {}", path.display()))?;
    let keys: Vec<&str> = vars.iter().map(|(k, _)| k.as_str()).collect();
    crate::say(&format!(
        "read {} from {}: {} (the Worker reads them as vars)",
        if vars.len() == 1 {
            "1 var".to_string()
        } else {
            format!("{} vars", vars.len())
        },
        path.display(),
        keys.join(", ")
    ));
    manifest.vars.extend(vars);
    hearth::runtime::store::secrets::check_vars(&manifest.vars, [])
        .with_context(|| format!("in {}", path.display()))?;
    Ok(())
}

/// `KEY=VALUE` lines; blank lines and `#` comments are skipped, and a
/// value in matching quotes loses them.
fn parse_dev_vars(text: &str) -> anyhow::Result<Vec<(String, String)>> {
    let mut vars = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let (key, value) = line
            .split_once('=')
            .with_context(|| format!("line {}: expected KEY=VALUE", i + 1))?;
        let key = key.trim();
        if key.is_empty() {
            bail!("line {}: empty key", i + 1);
        }
        let value = value.trim();
        let value = ['"', '\'']
            .iter()
            .find_map(|q| value.strip_prefix(*q).and_then(|v| v.strip_suffix(*q)))
            .unwrap_or(value);
        vars.push((key.to_string(), value.to_string()));
    }
    Ok(vars)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dev_vars_are_key_value_lines() {
        let vars = parse_dev_vars("# a comment\n\nAPI_KEY=abc=d\nNAME = \"x y\"\nQ='z'\n")
            .expect("parses");
        let got: Vec<(&str, &str)> = vars.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        assert_eq!(got, [("API_KEY", "abc=d"), ("NAME", "x y"), ("Q", "z")]);
        assert!(parse_dev_vars("JUSTAKEY\n").is_err());
        assert!(parse_dev_vars("=v\n").is_err());
    }
}
