//! The `hearth` command: run a node, deploy Workers, and the tools. This
//! file is the command list and its dispatch; each command that does more
//! than call a library lives in a file named after it, as wasmtime's
//! `commands/` do.

mod build;
mod cluster;
mod deploy;
mod dev;
mod hand_back;
mod precompile;
mod ring;
mod secret;
mod serve;
mod tail;
mod upgrade_store;
mod versions;

use std::path::PathBuf;

use clap::{Parser, Subcommand};

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
    Serve(hearth::config::ServeArgs),
    /// Deploy a Worker, to a running node (--admin) or into a store (--store).
    Deploy(deploy::DeployArgs),
    /// A Worker's secrets: `put SCRIPT NAME` (value from stdin), `list
    /// SCRIPT` (names only), `delete SCRIPT NAME`.
    Secret(secret::SecretArgs),
    /// A Worker's numbered versions: `list SCRIPT`, and `deploy SCRIPT
    /// 7@10% 6@90%` (a gradual rollout, one client sticking to one
    /// version), announced to every node.
    Versions(versions::VersionsArgs),
    /// Serve an earlier version of a Worker at 100% (default: the one
    /// before the current), announced to every node like a deploy.
    Rollback(versions::RollbackArgs),
    /// Serve one Worker locally, rebuild and redeploy it when its sources
    /// change, and print each request (a dev loop).
    Dev(dev::DevArgs),
    /// Show the ring as a running node sees it: members with weights and
    /// shares, and (with --script) a Worker's home and successors.
    Ring(ring::RingArgs),
    /// Watch a Worker's requests live on every node given (status, timing,
    /// logs, exceptions, subrequests) until Ctrl-C.
    Tail(tail::TailArgs),
    /// Hand a Worker back to its home now: prewarm it there and have every
    /// other node drop its warm copy (after a crashed home has rejoined,
    /// its Workers otherwise drift back only as the copies go idle).
    HandBack(hand_back::HandBackArgs),
    /// Compile Workers for this build's engine into the store's artifact
    /// cache ahead of a rollout, so upgraded nodes load instead of
    /// compiling on their first request.
    Precompile(precompile::PrecompileArgs),
    /// Sign every record of a store written before store records were
    /// signed, and move Workers' secrets into records of their own (once
    /// every node runs this build; see `accept_unsigned_records`).
    UpgradeStore(upgrade_store::UpgradeStoreArgs),
    /// List the sample Workers built with hearth, with their paths.
    Samples,
    /// Build a JavaScript Worker in the Workers module syntax (`export
    /// default { fetch }`, Hono apps too) into a component: esbuild bundles
    /// it (Node.js and npm needed), then hearth's QuickJS engine is
    /// snapshotted with the module started.
    Build(build::BuildArgs),
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
    Cluster(cluster::ClusterArgs),
    /// The main job: sharding off vs on, on the same power-law traffic
    /// (`hearth demo objects`: Durable Objects over the ring, through a
    /// node's loss).
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
    init_logs(&cli);
    let rt = tokio::runtime::Runtime::new()?;
    rt.block_on(run(cli.command))
}

/// Logs on stderr. A tool's default output is its progress and its result;
/// the node's info logs (e.g. a demo's hundreds of deploys) show only with
/// RUST_LOG.
fn init_logs(cli: &Cli) {
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
}

async fn run(command: Command) -> anyhow::Result<()> {
    match command {
        Command::Serve(args) => serve::run(args).await,
        Command::Build(args) => build::run(args),
        Command::Deploy(args) => deploy::run(args).await,
        Command::Secret(args) => secret::run(args).await,
        Command::Versions(args) => versions::run(args).await,
        Command::Rollback(args) => versions::rollback(args).await,
        Command::Dev(args) => dev::run(args).await,
        Command::Ring(args) => ring::run(args).await,
        Command::Tail(args) => tail::run(args).await,
        Command::HandBack(args) => hand_back::run(args).await,
        Command::Precompile(args) => precompile::run(args).await,
        Command::UpgradeStore(args) => upgrade_store::run(args).await,
        Command::Cluster(args) => cluster::run(args).await,
        Command::Pki { dir, nodes } => {
            if !dir.join("ca.pem").exists() {
                hearth::sharding::tls::generate_dev_ca(&dir)?;
                println!("created cluster CA {}", dir.join("ca.pem").display());
            }
            for n in &nodes {
                let p = hearth::sharding::tls::issue_node_cert(&dir, n)?;
                println!("issued {n}: {} {}", p.cert.display(), p.key.display());
            }
            println!(
                "give each node ca.pem and only its own certificate and key; keep {} off the nodes \
                 (whoever holds it can make a certificate for any node ID)",
                dir.join("ca-key.pem").display()
            );
            Ok(())
        }
        #[cfg(feature = "demo")]
        Command::Demo(args) => {
            match args.other {
                Some(hearth::demo::OtherDemo::Objects(args)) => {
                    hearth::demo::objects::run(args).await?;
                }
                None => {
                    hearth::demo::run(args).await?;
                }
            }
            Ok(())
        }
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

/// How the CLI reaches a node's admin API over HTTPS (when the node serves
/// it with `admin_tls_cert`): the CA to trust and the name its certificate
/// is for.
#[derive(clap::Args, Debug, Clone)]
pub(crate) struct AdminTlsArgs {
    /// CA certificate (PEM) that signed the node's admin certificate, for
    /// an https:// --admin URL (e.g. the cluster's pki/ca.pem).
    #[arg(long, env = "HEARTH_ADMIN_CA")]
    admin_ca: Option<PathBuf>,
    /// The name the node's admin certificate is for, if not the URL's host
    /// (a `hearth pki` certificate: <node-id>.node.hearth.cluster).
    #[arg(long, requires = "admin_ca")]
    admin_server_name: Option<String>,
}

impl AdminTlsArgs {
    /// The admin client of `url`: over HTTPS trusting `--admin-ca` if given.
    pub(crate) fn client(
        &self,
        url: &str,
        token: String,
    ) -> Result<hearth_admin_client::AdminClient, hearth_admin_client::AdminError> {
        match &self.admin_ca {
            Some(ca) => hearth_admin_client::AdminClient::with_ca(
                url,
                Some(token),
                ca,
                self.admin_server_name.as_deref(),
            ),
            None => hearth_admin_client::AdminClient::new(url, Some(token)),
        }
    }
}

/// Prints what a long-running command says about itself (where it listens,
/// its token). A reader that has gone (`| head`, a script that read what it
/// needed) costs a warning, not the running node: `println!` would panic.
pub(crate) fn say(text: &str) {
    use std::io::Write as _;
    let mut out = std::io::stdout().lock();
    if let Err(e) = writeln!(out, "{text}").and_then(|()| out.flush()) {
        tracing::warn!(error = %e, "could not print to stdout; serving on");
    }
}
