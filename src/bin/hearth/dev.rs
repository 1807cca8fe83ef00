//! `hearth dev`: a dev loop for one Worker, as `wrangler dev` runs one.
//!
//! It starts one local node (a one-node [`LoopbackCluster`], as `hearth
//! cluster` does), builds and deploys the Worker, and serves it on
//! `--listen`: every request there for a loopback name (`localhost`, a
//! name under it, an IP address: see [`loopback_host`]) goes to this
//! Worker, and it prints a line with its method, path, status, time to the response
//! head and the node's `server-timing`. Once it serves (the first build
//! and deploy done, the files watched) it prints `hearth dev: serving NAME
//! on http://ADDR/ …`, the line a script waits for. Ctrl-C stops the node
//! and exits.
//!
//! What FILE is decides how a version is made:
//!
//! - **A JavaScript Worker's module** (`.js`, `.mjs`, `.ts`): built
//!   in-process by the same code as `hearth build` (esbuild's bundle, then
//!   the QuickJS engine's snapshot) into a temporary directory outside the
//!   watched folders. The module's folder is watched, recursively, so an
//!   edit of the module or of anything it imports from there rebuilds it.
//! - **A component** (`.wasm`, anything else) with `--build CMD`: CMD (run
//!   with `sh -c`, with this terminal's output) writes FILE. It runs once
//!   before the first deploy and again whenever a `--watch` directory (at
//!   least one is needed: the sources the build reads) changes.
//! - **A component** without `--build`: FILE is deployed as it is, and
//!   again whenever it (or a `--watch` directory) changes; something else
//!   builds it.
//!
//! Each change (one burst of events: the files created, written, removed,
//! renamed or touched until they are quiet for [`DEBOUNCE`]; a file opened
//! to be read is no change, though inotify reports it, since every build
//! reads its sources) is one build and one redeploy through the node's own
//! deploy path (the one the admin API takes), so the next request is
//! served by the new version. A failed build, or a FILE the node refuses,
//! prints why and leaves the last good version serving.
//!
//! **The build's own output never starts a build.** A JS build writes
//! only outside the watched folders (so an edit saved while it runs is a
//! change of its own, built next). With `--build`, FILE is the build's
//! output, so a change of FILE's own path is never a change of the
//! sources; and every other file the build writes under a watched folder
//! (CMD's intermediate files, say) is recognised too: the paths that
//! change while CMD runs (and for a moment after, while the watcher
//! catches up) are recorded with their modification time and size once it
//! ends, and a later event on such a path counts only if the file has
//! changed since. So an edit saved while CMD runs is taken as part of that
//! build. Hidden files and directories under a watched folder (`.git`,
//! editors' swap files) and the store directory are never sources.
//!
//! A manifest beside FILE (or `--manifest`) is read as `hearth deploy`
//! reads it. A `.dev.vars` file beside FILE (`KEY=VALUE` lines, as wrangler
//! reads it) gives the Worker vars for this dev loop, over the manifest's
//! `[vars]`: the Worker reads them as it reads vars and secrets in
//! production (environment, `wasi:config/store`); only their names are
//! printed. The Worker's own output (stdout, stderr) is in the node log
//! this command prints (see the runtime's `tail` module), tagged with its
//! script ID.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use anyhow::{Context, bail};
use hearth_js_engine::bundle::Bundler;
use notify::{EventKind, RecursiveMode, Watcher as _};

use hearth::cluster::{ClusterConfig, LoopbackCluster};
use hearth::node::Node;
use hearth::runtime::Manifest;
use hearth::runtime::body::Body;
use hearth::runtime::timing::SERVER_TIMING_HEADER;

/// How long the watched files must be quiet before a burst of events is
/// one change.
const DEBOUNCE: Duration = Duration::from_millis(150);

/// The extensions of a JavaScript Worker's module, which `hearth dev`
/// builds itself.
const JS_EXTENSIONS: &[&str] = &["js", "mjs", "ts"];

/// `hearth dev`'s flags.
#[derive(clap::Args)]
pub(crate) struct DevArgs {
    /// Command run with `sh -c` before the first deploy and whenever a
    /// `--watch` directory changes; it writes FILE (e.g. "cargo build
    /// --release --target wasm32-wasip2 && cp target/.../app.wasm
    /// app.wasm"). Needs --watch. Not for a .js FILE, which hearth dev
    /// builds itself.
    #[arg(long)]
    build: Option<String>,
    /// A directory of sources to watch, recursively (repeatable).
    #[arg(long = "watch", value_name = "DIR")]
    watch: Vec<PathBuf>,
    /// Script ID (default: FILE's name without its extension).
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
    /// The Worker: a JavaScript module (.js/.mjs/.ts: built as `hearth
    /// build` builds it, and rebuilt when its folder changes), or a
    /// component (.wasm) that --build or your own build writes.
    file: PathBuf,
}

/// What FILE is, and so how a new version is made.
enum Source {
    /// A component someone else builds: deployed as it is.
    Component,
    /// A component the command (`--build`) writes.
    Command(String),
    /// A JavaScript Worker's module, built in-process into `out`.
    Js {
        /// The bundler, made ready (esbuild installed) once.
        bundler: Arc<Bundler>,
        /// The component's path, in a temporary directory.
        out: PathBuf,
    },
}

/// Starts the node, builds and deploys, then serves, watches and rebuilds
/// until Ctrl-C.
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
    let is_js = file
        .extension()
        .and_then(|e| e.to_str())
        .is_some_and(|e| JS_EXTENSIONS.contains(&e));
    // Kept for the loop's life: the JS build's output directory.
    let mut build_dir = None;
    let source = match (&args.build, is_js) {
        (Some(_), true) => bail!(
            "{} is a JavaScript module: hearth dev builds it itself (drop --build)",
            file.display()
        ),
        (Some(_), false) if args.watch.is_empty() => bail!(
            "--build needs --watch DIR, the sources the build reads: FILE is the build's \
             output, so its own changes never start a build"
        ),
        (Some(cmd), false) => Source::Command(cmd.clone()),
        (None, false) => Source::Component,
        (None, true) => {
            if !file.is_file() {
                bail!("{}: no such file", file.display());
            }
            // First, so a missing Node.js is named before anything starts.
            let bundler = Bundler::new()?;
            let dir = tempfile::Builder::new()
                .prefix("hearth-dev-build-")
                .tempdir()
                .context("cannot make a directory for the build")?;
            let out = dir.path().join(format!("{name}.wasm"));
            build_dir = Some(dir);
            Source::Js {
                bundler: Arc::new(bundler),
                out,
            }
        }
    };
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
    std::fs::create_dir_all(&store)
        .with_context(|| format!("cannot make the store {}", store.display()))?;
    let mut cfg = ClusterConfig::new(1, &store);
    cfg.https = false;
    cfg.sharding = false;
    let cluster = LoopbackCluster::start(cfg).await?;
    let node = cluster.node(0).node.clone();

    // Watching starts before the first build, so an edit made while it
    // runs is not missed.
    let (tx, mut changes) = tokio::sync::mpsc::unbounded_channel();
    let mut watcher = notify::recommended_watcher(move |r: notify::Result<notify::Event>| {
        match r {
            // A file opened (to be read: a build reads its sources) or
            // closed: not a change. A write is a modify event of its own.
            Ok(e) if matches!(e.kind, EventKind::Access(_)) => {}
            other => {
                let _ = tx.send(other);
            }
        }
    })
    .context("cannot watch files")?;
    let mut ignored = vec![store.clone()];
    ignored.extend(build_dir.as_ref().map(|d| d.path().to_path_buf()));
    let mut watched = Watched::new(&file, &source, &args.watch, &ignored)?;
    for (path, mode) in watched.roots() {
        watcher
            .watch(&path, mode)
            .with_context(|| format!("cannot watch {}", path.display()))?;
    }

    let mut dev = Dev {
        node,
        name: name.clone(),
        manifest,
        file,
        source,
        last_good: None,
    };
    dev.update(&mut changes, &mut watched).await;

    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("cannot listen on {}", args.listen))?;
    let addr = listener.local_addr()?;
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let server = tokio::spawn(serve(listener, dev.node.clone(), name.clone(), stop_rx));
    crate::say(&format!(
        "hearth dev: serving {name} on http://{addr}/ (admin http://{}, token {})",
        cluster.node(0).admin_addr,
        cluster.token()
    ));
    crate::say(&format!("watching {}; Ctrl-C to stop", watched.describe()));

    loop {
        tokio::select! {
            r = tokio::signal::ctrl_c() => {
                r.context("cannot catch Ctrl-C")?;
                break;
            }
            Some(paths) = burst(&mut changes) => {
                if paths.iter().any(|p| watched.is_change(p)) {
                    dev.update(&mut changes, &mut watched).await;
                }
            }
        }
    }
    crate::say("stopping");
    drop(watcher);
    let _ = stop_tx.send(true);
    let _ = server.await;
    cluster.shutdown().await;
    Ok(())
}

/// The watcher's events (reads left out), as they arrive.
type Changes = tokio::sync::mpsc::UnboundedReceiver<notify::Result<notify::Event>>;

/// The paths of the next burst of events: the first event, and every one
/// after it until the watched files have been quiet for [`DEBOUNCE`]. A
/// watch error is printed. None once the watcher is gone.
async fn burst(changes: &mut Changes) -> Option<Vec<PathBuf>> {
    let mut paths = Vec::new();
    let mut next = changes.recv().await?;
    loop {
        match next {
            Ok(event) => paths.extend(event.paths),
            Err(e) => crate::say(&format!("watch error: {e}")),
        }
        match tokio::time::timeout(DEBOUNCE, changes.recv()).await {
            Ok(Some(event)) => next = event,
            Ok(None) | Err(_) => return Some(paths),
        }
    }
}

/// The Worker being served and how its versions are made.
struct Dev {
    node: Node,
    name: String,
    manifest: Manifest,
    /// FILE, absolute.
    file: PathBuf,
    source: Source,
    /// The hash of the version serving.
    last_good: Option<String>,
}

impl Dev {
    /// Builds a new version (if the Worker has a build) and deploys it.
    /// With `--build`, the paths the command wrote are recorded in
    /// `watched` as its outputs (see the module docs).
    async fn update(&mut self, changes: &mut Changes, watched: &mut Watched) {
        let built = match &self.source {
            Source::Component => Ok(()),
            Source::Command(cmd) => {
                let built = run_command(cmd).await;
                // What the command wrote reaches the watcher within
                // moments: wait for it, then take it all.
                tokio::time::sleep(DEBOUNCE).await;
                let mut written = vec![self.file.clone()];
                while let Ok(event) = changes.try_recv() {
                    written.extend(event.into_iter().flat_map(|e| e.paths));
                }
                watched.record_outputs(written);
                built
            }
            Source::Js { bundler, out } => build_js(bundler, &self.file, out).await,
        };
        match built {
            Ok(()) => self.deploy().await,
            Err(why) => {
                crate::say(&format!("build failed: {why}"));
                crate::say(if self.last_good.is_some() {
                    "still serving the last good version"
                } else {
                    "nothing to serve until a build succeeds"
                });
            }
        }
    }

    /// The component file to deploy.
    fn component(&self) -> &Path {
        match &self.source {
            Source::Js { out, .. } => out,
            Source::Component | Source::Command(_) => &self.file,
        }
    }

    /// Deploys the component through the node (as the admin API does)
    /// unless it is the version already serving; says what happened.
    async fn deploy(&mut self) {
        let component = self.component().to_path_buf();
        deploy(
            &self.node,
            &self.name,
            &self.manifest,
            &component,
            &mut self.last_good,
        )
        .await;
    }
}

/// Runs the build command, its output on this terminal; says how long it
/// took, or why it failed.
async fn run_command(cmd: &str) -> Result<(), String> {
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
            Ok(())
        }
        Ok(s) => Err(format!("{s}")),
        Err(e) => Err(format!("cannot run sh: {e}")),
    }
}

/// Builds the JS Worker `module` into `out` as `hearth build` does (on a
/// blocking thread: it runs node, then the engine); says how long it took.
async fn build_js(bundler: &Arc<Bundler>, module: &Path, out: &Path) -> Result<(), String> {
    let shown = module.file_name().map_or(module, Path::new).display();
    crate::say(&format!("building {shown}"));
    let t = Instant::now();
    let (bundler, m, o) = (bundler.clone(), module.to_path_buf(), out.to_path_buf());
    match tokio::task::spawn_blocking(move || crate::build::build_to(&bundler, &m, &o)).await {
        Ok(Ok(len)) => {
            crate::say(&format!(
                "built {shown} in {:.1} s ({len} bytes)",
                t.elapsed().as_secs_f64()
            ));
            Ok(())
        }
        Ok(Err(e)) => Err(format!("{e:#}")),
        Err(e) => Err(format!("the build stopped: {e}")),
    }
}

/// A file's modification time and size, or None if it is gone: what a
/// build's output is recognised by.
type Fingerprint = Option<(SystemTime, u64)>;

fn fingerprint(path: &Path) -> Fingerprint {
    let meta = std::fs::metadata(path).ok()?;
    Some((meta.modified().ok()?, meta.len()))
}

/// What is watched, and which of its events are changes of the Worker's
/// sources (see the module docs).
struct Watched {
    /// FILE, its directory canonical.
    file: PathBuf,
    /// Whether FILE's own changes are changes (not with `--build`: FILE is
    /// the build's output).
    file_is_source: bool,
    /// The folders watched recursively, canonical.
    dirs: Vec<PathBuf>,
    /// Folders under them that never hold sources (the store, the JS
    /// build's output).
    ignored: Vec<PathBuf>,
    /// The files the last `--build` run wrote, as it left them.
    outputs: HashMap<PathBuf, Fingerprint>,
}

impl Watched {
    /// FILE's folder and the `--watch` directories for a JS module; FILE
    /// (through its folder, since a build may replace it rather than write
    /// it) and the `--watch` directories for a component.
    fn new(
        file: &Path,
        source: &Source,
        watch: &[PathBuf],
        ignored: &[PathBuf],
    ) -> anyhow::Result<Self> {
        let folder = file.parent().unwrap_or(Path::new("/"));
        let folder = std::fs::canonicalize(folder)
            .with_context(|| format!("cannot watch {}: no such directory", folder.display()))?;
        let file = match file.file_name() {
            Some(name) => folder.join(name),
            None => bail!("{} names no file", file.display()),
        };
        let mut dirs = watch
            .iter()
            .map(|d| {
                std::fs::canonicalize(d)
                    .with_context(|| format!("cannot watch {}: no such directory", d.display()))
            })
            .collect::<anyhow::Result<Vec<_>>>()?;
        if matches!(source, Source::Js { .. }) {
            dirs.insert(0, folder);
        }
        Ok(Watched {
            file,
            file_is_source: !matches!(source, Source::Command(_)),
            dirs,
            ignored: ignored
                .iter()
                .filter_map(|d| std::fs::canonicalize(d).ok())
                .collect(),
            outputs: HashMap::new(),
        })
    }

    /// The paths to hand the watcher.
    fn roots(&self) -> Vec<(PathBuf, RecursiveMode)> {
        let mut roots: Vec<_> = self
            .dirs
            .iter()
            .map(|d| (d.clone(), RecursiveMode::Recursive))
            .collect();
        if let Some(parent) = self.file.parent()
            && self.file_is_source
            && !self.dirs.iter().any(|d| parent.starts_with(d))
        {
            roots.push((parent.to_path_buf(), RecursiveMode::NonRecursive));
        }
        roots
    }

    /// What is watched, for the user.
    fn describe(&self) -> String {
        let mut items: Vec<String> = self
            .dirs
            .iter()
            .map(|d| format!("{}/", d.display()))
            .collect();
        if self.file_is_source && !self.dirs.iter().any(|d| self.file.starts_with(d)) {
            items.insert(0, self.file.display().to_string());
        }
        items.join(", ")
    }

    /// Whether an event on `path` is a change of the Worker's sources.
    fn is_change(&self, path: &Path) -> bool {
        if path == self.file {
            return self.file_is_source;
        }
        if self.ignored.iter().any(|d| path.starts_with(d)) {
            return false;
        }
        let Some(rel) = self.dirs.iter().find_map(|d| path.strip_prefix(d).ok()) else {
            return false;
        };
        let hidden = rel
            .components()
            .any(|c| c.as_os_str().to_string_lossy().starts_with('.'));
        if hidden {
            return false;
        }
        // A file the last build wrote counts only once it has changed
        // since: a late event of the build's own write is not a change.
        match self.outputs.get(path) {
            Some(left) => *left != fingerprint(path),
            None => true,
        }
    }

    /// Records the paths a `--build` run wrote (and what it left there) as
    /// its outputs, in place of the last run's.
    fn record_outputs(&mut self, paths: Vec<PathBuf>) {
        self.outputs = paths
            .into_iter()
            .map(|p| {
                let f = fingerprint(&p);
                (p, f)
            })
            .collect();
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
            let host = hearth::front_door::request_host(&req);
            let resp = if loopback_host(host.as_deref()) {
                node.handle(&name, req).await
            } else {
                hearth::runtime::body::text_response(
                    http::StatusCode::FORBIDDEN,
                    format!(
                        "hearth dev answers requests for localhost, *.localhost and IP addresses only, \
                         not for {:?}: a web page elsewhere could otherwise reach this Worker by DNS \
                         rebinding\n",
                        host.unwrap_or_default()
                    ),
                )
            };
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

/// Whether a request's host (`Host`, or the target's authority) is one a
/// browser uses only for this machine: `localhost`, a name under it, or an
/// IP literal (an address, not a name some other site's DNS can point
/// here). A request without a host is no browser's. Anything else is
/// refused, as Vite's dev server refuses it: a page on `evil.example` whose
/// name its DNS rebinds to 127.0.0.1 sends `Host: evil.example`.
fn loopback_host(host: Option<&str>) -> bool {
    let Some(host) = host else {
        return true;
    };
    if let Some(v6) = host.strip_prefix('[') {
        return v6
            .split(']')
            .next()
            .is_some_and(|a| a.parse::<std::net::Ipv6Addr>().is_ok());
    }
    let name = match host.rsplit_once(':') {
        Some((name, port)) if port.bytes().all(|b| b.is_ascii_digit()) => name,
        _ => host,
    };
    name.parse::<std::net::Ipv4Addr>().is_ok()
        || hearth::runtime::outbound::egress::loopback_name(name)
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

    #[test]
    fn only_loopback_names_and_addresses_reach_the_worker() {
        for ok in [
            None,
            Some("localhost"),
            Some("localhost:8787"),
            Some("LOCALHOST."),
            Some("app.localhost:8787"),
            Some("a.b.localhost"),
            Some("127.0.0.1:8787"),
            Some("192.168.1.20"),
            Some("[::1]:8787"),
            Some("[::1]"),
        ] {
            assert!(loopback_host(ok), "{ok:?} refused");
        }
        for refused in [
            "evil.example",
            "evil.example:8787",
            "localhost.evil.example",
            "evillocalhost",
            "127.0.0.1.nip.io",
            "[not-an-address]",
            "",
        ] {
            assert!(!loopback_host(Some(refused)), "{refused:?} accepted");
        }
    }
}
