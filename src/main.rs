//! The `hearth` command: run a node, deploy Workers, and the tools.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context, bail};
use clap::{Parser, Subcommand};
use http_body_util::BodyExt;

use hearth::config::{NodeConfig, NodeStore, admin_token, runtime_config};
use hearth::node::{Node, spawn_listeners};
use hearth::runtime::{Lifecycle, Manifest, Plan, Runtime};
use hearth_admin_client::{AdminClient, AdminError, DeployReport};

#[derive(Parser)]
#[command(
    name = "hearth",
    version,
    about = "A WebAssembly Worker runtime with built-in sharding"
)]
struct Cli {
    /// Log format on stderr: `text` (coloured only on a terminal) or
    /// `json` (one object per line, for log shippers). Levels come from
    /// RUST_LOG.
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

/// How the node writes its logs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum LogFormat {
    /// Human-readable lines; ANSI colours only when stderr is a terminal.
    Text,
    /// One JSON object per line.
    Json,
}

#[derive(Subcommand)]
enum Command {
    /// Run one node: Worker traffic on --listen, the admin API on --admin.
    Serve {
        /// Address for Worker traffic (routed by the first label of Host).
        #[arg(long)]
        listen: Option<SocketAddr>,
        /// Address of the admin API (deploys, stats, /metrics).
        #[arg(long)]
        admin: Option<SocketAddr>,
        /// Script store: a directory, or s3://bucket/prefix (with the
        /// config's [s3] section or the AWS_* environment variables).
        #[arg(long)]
        store: Option<String>,
        /// Address for HTTPS Worker traffic (HTTP/2 or HTTP/1.1 by ALPN).
        /// A ClientHello's SNI starts warming the Worker it names.
        #[arg(long)]
        tls_listen: Option<SocketAddr>,
        /// PEM certificate chain for --tls-listen (leaf first); without
        /// it, a development certificate for localhost and *.localhost is
        /// made in the store.
        #[arg(long, requires = "tls_key")]
        tls_cert: Option<PathBuf>,
        /// PEM private key for --tls-cert.
        #[arg(long, requires = "tls_cert")]
        tls_key: Option<PathBuf>,
        /// Do not prewarm Workers from the TLS ClientHello's SNI.
        #[arg(long)]
        no_sni_prewarm: bool,
        /// TOML config file (flags override it).
        #[arg(long)]
        config: Option<PathBuf>,
    },
    /// Deploy a Worker, to a running node (--admin) or into a store (--store).
    Deploy {
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
        /// Admin URL of a running node, e.g. http://127.0.0.1:8081.
        #[arg(long, conflicts_with = "store")]
        admin: Option<String>,
        /// Admin token (default: $HEARTH_ADMIN_TOKEN).
        #[arg(long, env = "HEARTH_ADMIN_TOKEN", hide_env_values = true)]
        token: Option<String>,
        /// Deploy straight into this store directory instead.
        #[arg(long)]
        store: Option<PathBuf>,
        /// The component (.wasm) to deploy.
        file: PathBuf,
    },
    /// Show the ring as a running node sees it: members with weights and
    /// shares, and (with --script) a Worker's home and successors.
    Ring {
        /// Admin URL of a running node, e.g. http://127.0.0.1:8081.
        #[arg(long)]
        admin: String,
        /// Admin token (default: $HEARTH_ADMIN_TOKEN).
        #[arg(long, env = "HEARTH_ADMIN_TOKEN", hide_env_values = true)]
        token: Option<String>,
        /// A script ID to place on the ring.
        #[arg(long)]
        script: Option<String>,
    },
    /// Hand a Worker back to its home now: prewarm it there and have every
    /// other node drop its warm copy (after a crashed home has rejoined,
    /// its Workers otherwise drift back only as the copies go idle).
    HandBack {
        /// Admin URL of any running node of the cluster.
        #[arg(long)]
        admin: String,
        /// Admin token (default: $HEARTH_ADMIN_TOKEN).
        #[arg(long, env = "HEARTH_ADMIN_TOKEN", hide_env_values = true)]
        token: Option<String>,
        /// The Worker's script ID.
        #[arg(long)]
        script: String,
    },
    /// List the sample Workers built with hearth, with their paths.
    Samples,
    /// Create a development cluster CA (if DIR has none) and certificates
    /// for the named nodes, for `[cluster] pki` in `hearth serve` configs.
    Pki {
        /// Directory for ca.pem and the node certificates.
        #[arg(long)]
        dir: PathBuf,
        /// Node IDs to issue certificates for.
        #[arg(required = true)]
        nodes: Vec<String>,
    },
    /// Start a cluster of N nodes on loopback (one shared store) and
    /// serve until interrupted.
    Cluster {
        /// Number of nodes.
        #[arg(long, default_value_t = 3)]
        nodes: usize,
        /// Shared store directory.
        #[arg(long, default_value = "hearth-cluster")]
        store: PathBuf,
        /// First port (node i uses base+4i HTTP, +1 admin, +2 RPC, +3
        /// HTTPS); default: free ports.
        #[arg(long)]
        base_port: Option<u16>,
    },
    /// The main job: sharding off vs on, on the same power-law traffic.
    #[cfg(feature = "demo")]
    Demo(hearth::demo::DemoArgs),
    /// Simulate one data center, sharded vs unsharded.
    Simulate(hearth_simulate::SimulateArgs),
    /// Load generator against a running cluster: Zipf or trace traffic,
    /// open loop, or cold vs warm latency of one Worker.
    Bench(hearth_bench::BenchArgs),
}

/// mimalloc: small short-lived allocations dominate a forwarded request.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    match real_main() {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn real_main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    // A tool's default output is its progress and its result; the node's
    // info logs (e.g. a demo's hundreds of deploys) show only with RUST_LOG.
    let default_filter = match cli.command {
        Command::Simulate(_) | Command::Bench(_) => "warn",
        #[cfg(feature = "demo")]
        Command::Demo(_) => "warn",
        _ => "info,cranelift=warn,wasmtime=warn",
    };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_filter));
    let logs = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match cli.log_format {
        LogFormat::Json => logs.json().init(),
        LogFormat::Text => {
            use std::io::IsTerminal;
            logs.with_ansi(std::io::stderr().is_terminal()).init()
        }
    }
    let rt = tokio::runtime::Runtime::new()?;
    rt.block_on(run(cli))
}

async fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Serve {
            listen,
            admin,
            store,
            tls_listen,
            tls_cert,
            tls_key,
            no_sni_prewarm,
            config,
        } => {
            let mut file = match config {
                Some(p) => NodeConfig::load(&p)?,
                None => NodeConfig::default(),
            };
            // Flags override the file.
            file.tls_listen = tls_listen.or(file.tls_listen);
            if tls_cert.is_some() {
                (file.tls_cert, file.tls_key) = (tls_cert, tls_key);
            }
            if no_sni_prewarm {
                file.sni_prewarm = Some(false);
            }
            serve(file, listen, admin, store).await
        }
        Command::Deploy {
            name,
            plan,
            lifecycle,
            manifest,
            services,
            dispatch,
            outbound,
            tail,
            admin,
            token,
            store,
            file,
        } => {
            let mut m = read_manifest(manifest.as_deref(), &file)?;
            m.plan = plan.unwrap_or(m.plan);
            m.lifecycle = lifecycle.unwrap_or(m.lifecycle);
            for s in services {
                let (name, target) = s
                    .split_once('=')
                    .with_context(|| format!("--service {s}: expected NAME=SCRIPT"))?;
                m.services.insert(name.into(), target.into());
            }
            for d in dispatch {
                let (ns, worker) = d
                    .split_once('=')
                    .with_context(|| format!("--dispatch {d}: expected NS=SCRIPT"))?;
                m.dispatch
                    .entry(ns.into())
                    .or_default()
                    .insert(worker.into());
            }
            if outbound.is_some() {
                m.outbound = outbound;
            }
            m.tail.extend(tail);
            deploy(name, m, admin, token, store, file).await
        }
        Command::Cluster {
            nodes,
            store,
            base_port,
        } => {
            let mut cfg = hearth::cluster::ClusterConfig::new(nodes, &store);
            cfg.base_port = base_port;
            let cluster = hearth::cluster::LoopbackCluster::start(cfg).await?;
            println!("hearth cluster: {nodes} nodes, store {}", store.display());
            for c in cluster.nodes() {
                let https = c
                    .https_addr
                    .map(|a| format!("  https://{a}"))
                    .unwrap_or_default();
                println!(
                    "{}  http://{}{https}  admin http://{}  rpc {}",
                    c.node.id(),
                    c.http_addr,
                    c.admin_addr,
                    c.rpc_addr
                );
            }
            if let Some(ca) = cluster.tls_ca() {
                println!(
                    "HTTPS: development certificates for localhost and <script>.localhost; trust their CA: {}",
                    ca.display()
                );
            }
            println!("admin token: {}", cluster.token());
            println!(
                "deploy with: hearth deploy --admin http://{} --token {} --name hello FILE",
                cluster.node(0).admin_addr,
                cluster.token()
            );
            tokio::signal::ctrl_c().await?;
            cluster.shutdown().await;
            Ok(())
        }
        Command::Pki { dir, nodes } => {
            if !dir.join("ca.pem").exists() {
                hearth::sharding::tls::generate_dev_ca(&dir)?;
                println!("created cluster CA {}", dir.join("ca.pem").display());
            }
            for n in &nodes {
                let p = hearth::sharding::tls::issue_node_cert(&dir, n)?;
                println!("issued {n}: {} {}", p.cert.display(), p.key.display());
            }
            Ok(())
        }
        #[cfg(feature = "demo")]
        Command::Demo(args) => hearth::demo::run(args).await.map(|_| ()),
        Command::Bench(args) => {
            let r = hearth_bench::run(args).await?;
            println!("{}", r.table());
            Ok(())
        }
        Command::Simulate(args) => {
            let report = tokio::task::spawn_blocking(move || hearth_simulate::run(&args)).await??;
            println!("{}", report.table());
            Ok(())
        }
        Command::Ring {
            admin,
            token,
            script,
        } => ring(&admin, token, script.as_deref()).await,
        Command::HandBack {
            admin,
            token,
            script,
        } => hand_back(&admin, token, &script).await,
        Command::Samples => {
            println!("sample Workers (built from sample-workers/ by cargo):");
            for name in hearth_sample_workers::NAMES {
                match hearth_sample_workers::path(name) {
                    Some(p) => println!("  {name:<12} {}", p.display()),
                    None => println!("  {name:<12} (not built)"),
                }
            }
            Ok(())
        }
    }
}

async fn serve(
    file: NodeConfig,
    listen: Option<SocketAddr>,
    admin: Option<SocketAddr>,
    store: Option<String>,
) -> anyhow::Result<()> {
    let listen = listen
        .or(file.listen)
        .unwrap_or_else(|| ([127, 0, 0, 1], 8080).into());
    let admin = admin
        .or(file.admin)
        .unwrap_or_else(|| ([127, 0, 0, 1], 8081).into());
    let location = store
        .or(file.store.clone())
        .unwrap_or_else(|| "hearth-store".into());
    let opened = NodeStore::open(&location, &file).await?;
    let store = opened.local.clone();
    // The certificate first: a bad path is a startup error before anything
    // listens.
    let https = https_front_door(&file, &store)?;
    let runtime = Runtime::with_store(file.apply(opened.runtime), opened.scripts)?;
    let token: Arc<str> = match &file.admin_token {
        Some(t) => t.as_str().into(),
        None => {
            let (token, new) = admin_token(&store)?;
            if new {
                println!(
                    "generated admin token (saved in {}): {token}",
                    store.join("admin.token").display()
                );
            }
            token.into()
        }
    };
    let node_id = file.node_id.clone().unwrap_or_else(|| "node-1".into());
    let mut node = Node::with_prewarm(node_id.clone(), runtime, file.prewarm());
    let mut membership = None;
    if let Some(c) = &file.cluster {
        let rpc_listener = tokio::net::TcpListener::bind(c.rpc)
            .await
            .with_context(|| format!("cannot listen for RPC on {}", c.rpc))?;
        let gossip_key = c.gossip_key()?;
        let mut overload = hearth::sharding::overload::OverloadConfig::default();
        if let Some(n) = c.max_in_flight_per_worker {
            overload.max_in_flight_per_worker = n;
        }
        if let Some(n) = c.max_in_flight_node {
            overload.max_in_flight_node = n;
        }
        let joined = hearth::cluster::join(
            node,
            hearth::cluster::JoinConfig {
                node_id: node_id.clone(),
                rpc_listener,
                pki_dir: c.pki.clone(),
                gossip: c.gossip,
                seeds: c.seeds.clone(),
                static_nodes: c
                    .nodes
                    .iter()
                    .map(|n| {
                        hearth::sharding::ring::Member::new(n.id.as_str(), n.rpc)
                            .with_weight(n.weight)
                    })
                    .collect(),
                weight: c.weight,
                gossip_key,
                overload,
            },
        )
        .await?;
        println!(
            "joined the cluster: rpc {} (pki {})",
            c.rpc,
            c.pki.display()
        );
        node = joined.node;
        membership = Some((joined.membership, joined.rpc_server));
    }
    let http = tokio::net::TcpListener::bind(listen)
        .await
        .with_context(|| format!("cannot listen on {listen}"))?;
    let adm = tokio::net::TcpListener::bind(admin)
        .await
        .with_context(|| format!("cannot listen on {admin}"))?;
    println!(
        "hearth node {} serving Workers on http://{listen} (http://<script>.localhost:{})",
        node.id(),
        listen.port()
    );
    let https = match https {
        Some((addr, door)) => {
            let listener = tokio::net::TcpListener::bind(addr)
                .await
                .with_context(|| format!("cannot listen on {addr}"))?;
            println!(
                "HTTPS (h2, http/1.1) on https://{addr} (https://<script>.localhost:{}), SNI prewarm {}",
                addr.port(),
                if file.prewarm().enabled { "on" } else { "off" }
            );
            Some((listener, door))
        }
        None => None,
    };
    println!("admin API on http://{admin} (store {location})");
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let listeners = hearth::node::Listeners {
        http,
        https,
        admin: adm,
    };
    let tasks = spawn_listeners(&node, listeners, token, file.serve_limits(), stop_rx);
    tokio::signal::ctrl_c().await?;
    // Drain: leave everyone's ring first, so no new sharded requests come
    // here, then finish what is in flight, then say goodbye.
    if let Some((m, _)) = &membership {
        eprintln!("draining: leaving the ring");
        if let Err(e) = m.drain().await {
            eprintln!("drain announcement failed: {e}");
        }
    }
    eprintln!("shutting down: finishing in-flight requests");
    let _ = stop_tx.send(true);
    for task in tasks {
        let _ = task.await;
    }
    if let Some((m, rpc_server)) = membership {
        rpc_server.stop();
        let _ = m.shutdown().await;
        if let Some(r) = node.rpc() {
            r.shutdown();
        }
    }
    Ok(())
}

/// The HTTPS listener's address and certificate, if the config asks for
/// one: the given certificate and key, or the store's development
/// certificate (made on first use; its CA's path is printed).
fn https_front_door(
    file: &NodeConfig,
    store: &std::path::Path,
) -> anyhow::Result<Option<(SocketAddr, hearth::https::TlsFrontDoor)>> {
    let Some(addr) = file.tls_listen else {
        if file.tls_cert.is_some() || file.tls_key.is_some() {
            bail!("tls_cert and tls_key need tls_listen (--tls-listen ADDR) to serve HTTPS");
        }
        return Ok(None);
    };
    let door = match (&file.tls_cert, &file.tls_key) {
        (Some(cert), Some(key)) => hearth::https::TlsFrontDoor::from_pem(cert, key)
            .context("cannot load the HTTPS certificate (--tls-cert, --tls-key)")?,
        (None, None) => {
            let (door, ca) = hearth::https::TlsFrontDoor::dev(store)
                .context("cannot make the development HTTPS certificate")?;
            println!(
                "HTTPS uses development certificates for localhost and <script>.localhost; trust their CA: {}",
                ca.display()
            );
            door
        }
        _ => bail!("give both tls_cert and tls_key (--tls-cert, --tls-key), or neither"),
    };
    Ok(Some((addr, door)))
}

/// `hearth ring`: asks a node's admin API for its ring and prints it.
async fn ring(admin: &str, token: Option<String>, script: Option<&str>) -> anyhow::Result<()> {
    let token = token
        .context("reading a node's ring needs its admin token: --token or HEARTH_ADMIN_TOKEN")?;
    let mut url = format!("{}/v1/ring", admin.trim_end_matches('/'));
    if let Some(id) = script {
        url.push_str(&format!("?script={id}"));
    }
    let uri: http::Uri = url.parse().context("invalid --admin URL")?;
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http::<http_body_util::Empty<bytes::Bytes>>();
    let req = http::Request::get(uri)
        .header(http::header::AUTHORIZATION, format!("Bearer {token}"))
        .body(http_body_util::Empty::new())?;
    let resp = client
        .request(req)
        .await
        .context("cannot reach the admin API")?;
    let status = resp.status();
    let body = resp.into_body().collect().await?.to_bytes();
    if !status.is_success() {
        bail!(
            "ring refused ({status}): {}",
            String::from_utf8_lossy(&body).trim()
        );
    }
    let view: hearth::admin::RingView = serde_json::from_slice(&body)
        .context("the admin API's ring is not what this hearth reads")?;
    if view.clustered {
        println!("ring of {} ({} members)", view.node, view.members.len());
        for m in &view.members {
            println!(
                "  {:<16} {:<22} weight {:<3} {:>6.2}%  {}",
                m.id,
                m.rpc,
                m.weight,
                m.ownership * 100.0,
                m.state
            );
        }
    } else {
        println!(
            "{} is a standalone node: it serves every Worker itself",
            view.node
        );
    }
    if let Some(p) = &view.script {
        println!(
            "{}: home {}, fallback order {} (warm on {}: {})",
            p.script_id,
            p.home.as_deref().unwrap_or("none"),
            p.successors.join(", "),
            view.node,
            if p.warm_here { "yes" } else { "no" }
        );
    }
    Ok(())
}

/// `hearth hand-back`: asks a node to hand a Worker back to its home.
async fn hand_back(admin: &str, token: Option<String>, script: &str) -> anyhow::Result<()> {
    let token = token
        .context("handing a Worker back needs the admin token: --token or HEARTH_ADMIN_TOKEN")?;
    let admin = AdminClient::new(admin, Some(token))?;
    let r = match admin.hand_back(script).await {
        Err(AdminError::Refused { status, body, .. }) => {
            bail!("hand-back refused ({status}): {body}")
        }
        other => other?,
    };
    println!(
        "{script}: home {}, prewarm at home {}",
        r.home, r.home_prewarm
    );
    if r.dropped.is_empty() {
        println!("no other node held a warm copy");
    } else {
        println!("warm copies dropped on: {}", r.dropped.join(", "));
    }
    for (node, why) in &r.failed {
        println!("could not ask {node}: {why}");
    }
    Ok(())
}

/// The manifest at `explicit`, else the one beside `wasm` (same name,
/// `.toml`) if there is one, else the defaults.
fn read_manifest(
    explicit: Option<&std::path::Path>,
    wasm: &std::path::Path,
) -> anyhow::Result<Manifest> {
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

async fn deploy(
    name: String,
    manifest: Manifest,
    admin: Option<String>,
    token: Option<String>,
    store: Option<PathBuf>,
    file: PathBuf,
) -> anyhow::Result<()> {
    let bytes = std::fs::read(&file).with_context(|| format!("cannot read {}", file.display()))?;
    let report: DeployReport = match (admin, store) {
        (Some(url), _) => {
            let token = token.context(
                "deploying to a node needs its admin token: --token or HEARTH_ADMIN_TOKEN",
            )?;
            let admin = AdminClient::new(&url, Some(token))?;
            let query = hearth::admin::manifest_query(&manifest);
            match admin.deploy(&name, &query, bytes).await {
                Err(AdminError::Refused { status, body, .. }) => {
                    bail!("deploy refused ({status}): {body}")
                }
                other => other?,
            }
        }
        (None, Some(store)) => {
            if hearth::runtime::s3_store::is_s3_url(&store.to_string_lossy()) {
                bail!(
                    "--store takes a directory; deploy into an S3 store through a node (--admin URL)"
                );
            }
            let rt = Runtime::new(runtime_config(&store)?)?;
            let report = rt.deploy(&name, manifest, bytes).await?;
            // The same report the admin API answers, read the same way.
            serde_json::from_value(serde_json::to_value(report)?)?
        }
        (None, None) => bail!("say where to deploy: --admin URL (a running node) or --store DIR"),
    };
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
    Ok(())
}
