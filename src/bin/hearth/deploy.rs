//! `hearth deploy`: a Worker to a running node (through its admin API) or
//! straight into a store directory, with the manifest beside the component
//! and the flags over it.

use std::path::{Path, PathBuf};

use anyhow::{Context, bail};

use hearth::config::runtime_config;
use hearth::runtime::{Lifecycle, Manifest, Plan, Runtime};
use hearth_admin_client::{AdminError, DeployReport};

/// `hearth deploy`'s flags.
#[derive(clap::Args)]
pub(crate) struct DeployArgs {
    /// Script ID (a DNS label: the first label of the Host it serves).
    #[arg(long)]
    name: String,
    /// Plan whose limits apply (default: the manifest's, else free).
    #[arg(long)]
    plan: Option<Plan>,
    /// Instance lifecycle: auto (hearth decides from the component),
    /// reuse, or fresh (default: the manifest's, else auto).
    #[arg(long)]
    lifecycle: Option<Lifecycle>,
    /// Manifest (TOML) with the Worker's settings; default: FILE with
    /// a .toml extension, if it exists.
    #[arg(long)]
    manifest: Option<PathBuf>,
    /// Service binding NAME=SCRIPT (repeatable; adds to the manifest's):
    /// the Worker reaches SCRIPT at http://NAME.internal/.
    #[arg(long = "service", value_name = "NAME=SCRIPT")]
    services: Vec<String>,
    /// Dispatch namespace entry NS=SCRIPT (repeatable): the Worker
    /// reaches user Worker SCRIPT at http://SCRIPT.NS.dispatch.internal/.
    #[arg(long = "dispatch", value_name = "NS=SCRIPT")]
    dispatch: Vec<String>,
    /// Outbound Worker for the user Workers this Worker dispatches to.
    #[arg(long)]
    outbound: Option<String>,
    /// Tail Worker of the flows this Worker starts (repeatable).
    #[arg(long = "tail", value_name = "SCRIPT")]
    tail: Vec<String>,
    /// Origin the Worker may fetch, scheme://host[:port] (repeatable; adds
    /// to the manifest's allowed_hosts): https://api.example.com,
    /// http://*.example.com:8080. Any other host is denied.
    #[arg(long = "allow-host", value_name = "URL")]
    allow_hosts: Vec<String>,
    /// Durable Object binding BINDING=Class or BINDING=Class@script
    /// (repeatable; adds to the manifest's [durable_objects]): the Worker
    /// addresses objects of that class at
    /// http://BINDING.<id>.object.internal/.
    #[arg(long = "durable-object", value_name = "BINDING=CLASS[@SCRIPT]")]
    durable_objects: Vec<String>,
    /// Var NAME=VALUE the Worker reads from its environment (repeatable;
    /// over the manifest's [vars]). Secrets: `hearth secret put`.
    #[arg(long = "var", value_name = "NAME=VALUE")]
    vars: Vec<String>,
    /// A user Worker: served only through a dispatch namespace, never to
    /// a client addressing it directly (manifest `dispatch_only = true`).
    #[arg(long)]
    dispatch_only: bool,
    /// Admin URL of a running node, e.g. http://127.0.0.1:8081.
    #[arg(long, conflicts_with = "store")]
    admin: Option<String>,
    /// Admin token (default: $HEARTH_ADMIN_TOKEN).
    #[arg(long, env = "HEARTH_ADMIN_TOKEN", hide_env_values = true)]
    token: Option<String>,
    #[command(flatten)]
    tls: crate::AdminTlsArgs,
    /// Seconds to wait for the node's answer: it stores and compiles the
    /// Worker before it answers, which takes longer for a large component
    /// (a Python Worker) on a busy node.
    #[arg(long, value_name = "SECS", default_value_t = hearth_admin_client::DEFAULT_TIMEOUT.as_secs(),
          value_parser = clap::value_parser!(u64).range(1..))]
    timeout: u64,
    /// Deploy straight into this store directory instead.
    #[arg(long)]
    store: Option<PathBuf>,
    /// The component (.wasm) to deploy.
    file: PathBuf,
}

impl DeployArgs {
    /// The manifest with the flags over it.
    fn manifest(&self) -> anyhow::Result<Manifest> {
        let mut m = read_manifest(self.manifest.as_deref(), &self.file)?;
        m.plan = self.plan.unwrap_or(m.plan);
        m.lifecycle = self.lifecycle.unwrap_or(m.lifecycle);
        for s in &self.services {
            let (name, target) = s
                .split_once('=')
                .with_context(|| format!("--service {s}: expected NAME=SCRIPT"))?;
            m.bindings.services.insert(name.into(), target.into());
        }
        for d in &self.dispatch {
            let (ns, worker) = d
                .split_once('=')
                .with_context(|| format!("--dispatch {d}: expected NS=SCRIPT"))?;
            m.bindings
                .dispatch
                .entry(ns.into())
                .or_default()
                .insert(worker.into());
        }
        if self.outbound.is_some() {
            m.bindings.outbound = self.outbound.clone();
        }
        m.bindings.tail.extend(self.tail.iter().cloned());
        m.bindings
            .allowed_hosts
            .extend(self.allow_hosts.iter().cloned());
        for d in &self.durable_objects {
            let (name, class) = d.split_once('=').with_context(|| {
                format!("--durable-object {d}: expected BINDING=CLASS[@SCRIPT]")
            })?;
            m.bindings
                .durable_objects
                .insert(name.into(), class.parse()?);
        }
        for v in &self.vars {
            let (name, value) = v
                .split_once('=')
                .with_context(|| format!("--var {v}: expected NAME=VALUE"))?;
            m.vars.insert(name.into(), value.into());
        }
        hearth::runtime::store::secrets::check_vars(&m.vars, [])?;
        m.dispatch_only |= self.dispatch_only;
        Ok(m)
    }
}

/// Deploys, then prints what the node (or store) reports.
pub(crate) async fn run(args: DeployArgs) -> anyhow::Result<()> {
    let manifest = args.manifest()?;
    let bytes = std::fs::read(&args.file)
        .with_context(|| format!("cannot read {}", args.file.display()))?;
    let name = &args.name;
    let report: DeployReport = match (&args.admin, &args.store) {
        (Some(url), _) => {
            let token = args.token.context(
                "deploying to a node needs its admin token: --token or HEARTH_ADMIN_TOKEN",
            )?;
            let admin = args
                .tls
                .client(url, token)?
                .with_timeout(std::time::Duration::from_secs(args.timeout));
            let query = hearth::admin::manifest_query(&manifest);
            match admin.deploy(name, &query, bytes).await {
                Err(AdminError::Refused { status, body, .. }) => {
                    bail!("deploy refused ({status}): {body}")
                }
                other => other?,
            }
        }
        (None, Some(store)) => {
            if hearth::runtime::store::s3_store::is_s3_url(&store.to_string_lossy()) {
                bail!(
                    "--store takes a directory; deploy into an S3 store through a node (--admin URL)"
                );
            }
            let rt = Runtime::new(runtime_config(store)?)?;
            let report = rt.deploy(name, manifest, bytes).await?;
            // The same report the admin API answers, read the same way.
            let mut value = serde_json::to_value(report)?;
            hearth::admin::names_only(&mut value);
            serde_json::from_value(value)?
        }
        (None, None) => bail!("say where to deploy: --admin URL (a running node) or --store DIR"),
    };
    print_report(name, &report);
    Ok(())
}

/// The manifest at `explicit`, else the one beside `wasm` (same name,
/// `.toml`) if there is one, else the defaults.
pub(crate) fn read_manifest(explicit: Option<&Path>, wasm: &Path) -> anyhow::Result<Manifest> {
    let beside = wasm.with_extension("toml");
    let path = match explicit {
        Some(p) => p.to_path_buf(),
        None if beside.is_file() => beside,
        None => return Ok(Manifest::default()),
    };
    let text = std::fs::read_to_string(&path)
        .with_context(|| format!("cannot read manifest {}", path.display()))?;
    Manifest::from_toml(&text).with_context(|| format!("in {}", path.display()))
}

fn print_report(name: &str, report: &DeployReport) {
    let meta = &report.meta;
    println!(
        "deployed {name}: plan {}, {} bytes ({} gzip-compressed, limit {}), hash {}, compile {:.1} ms ({})",
        meta.plan,
        meta.size,
        meta.compressed_size,
        report.limit,
        meta.hash,
        report.compile_time,
        report.code_source,
    );
    if meta.version > 0 {
        println!("version {} (now serving at 100%)", meta.version);
    }
    println!(
        "lifecycle: {} ({})",
        meta.lifecycle.chosen, meta.lifecycle.reason
    );
    let b = &meta.bindings;
    for (name, target) in &b.services {
        println!("service binding: http://{name}.internal/ -> {target}");
    }
    for (ns, workers) in &b.dispatch {
        let list: Vec<&str> = workers.iter().map(String::as_str).collect();
        println!(
            "dispatch namespace {ns}: http://<worker>.{ns}.dispatch.internal/ for {}",
            list.join(", ")
        );
    }
    if let Some(o) = &b.outbound {
        println!("outbound Worker: {o}");
    }
    if !b.tail.is_empty() {
        println!("tail Workers: {}", b.tail.join(", "));
    }
    if !b.allowed_hosts.is_empty() {
        println!("allowed hosts: {}", b.allowed_hosts.join(", "));
    }
    for (name, class) in &b.durable_objects {
        println!("Durable Object binding: http://{name}.<id>.object.internal/ -> {class}");
    }
    if !meta.vars.is_empty() {
        let names: Vec<&str> = meta.vars.keys().map(String::as_str).collect();
        println!("vars: {}", names.join(", "));
    }
    if !meta.secrets.is_empty() {
        println!("secrets (kept from before): {}", meta.secrets.join(", "));
    }
    if meta.dispatch_only {
        println!("dispatch only: served through dispatch namespaces, never to clients directly");
    }
    let a = &report.announced;
    if a.members > 0 {
        println!(
            "announced to {} of {} other nodes (they serve the new version now)",
            a.acknowledged, a.members
        );
        for (node, why) in &a.failed {
            println!("not told: {node} ({why}); it revalidates within a second");
        }
    }
}
