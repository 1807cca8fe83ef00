//! `hearth cluster`: N nodes on loopback in this process, until Ctrl-C.

use std::path::PathBuf;

use hearth::cluster::{ClusterConfig, LoopbackCluster};

/// `hearth cluster`'s flags.
#[derive(clap::Args)]
pub(crate) struct ClusterArgs {
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
}

/// Starts the cluster, prints how to reach it, and serves until Ctrl-C.
pub(crate) async fn run(args: ClusterArgs) -> anyhow::Result<()> {
    let mut cfg = ClusterConfig::new(args.nodes, &args.store);
    cfg.base_port = args.base_port;
    let cluster = LoopbackCluster::start(cfg).await?;
    crate::say(&banner(&cluster, &args));
    tokio::signal::ctrl_c().await?;
    cluster.shutdown().await;
    Ok(())
}

/// How to reach the cluster: one line per node, the HTTPS CA, the admin
/// token and a deploy command.
fn banner(cluster: &LoopbackCluster, args: &ClusterArgs) -> String {
    let mut lines = vec![format!(
        "hearth cluster: {} nodes, store {}",
        args.nodes,
        args.store.display()
    )];
    for c in cluster.nodes() {
        let https = c
            .https_addr
            .map(|a| format!("  https://{a}"))
            .unwrap_or_default();
        lines.push(format!(
            "{}  http://{}{https}  admin http://{}  rpc {}",
            c.node.id(),
            c.http_addr,
            c.admin_addr,
            c.rpc_addr
        ));
    }
    if let Some(ca) = cluster.tls_ca() {
        lines.push(format!(
            "HTTPS: development certificates for localhost and <script>.localhost; trust their CA: {}",
            ca.display()
        ));
    }
    lines.push(format!("admin token: {}", cluster.token()));
    lines.push(format!(
        "deploy with: hearth deploy --admin http://{} --token {} --name hello FILE",
        cluster.node(0).admin_addr,
        cluster.token()
    ));
    lines.join("\n")
}
