//! `hearth ring`: the ring as a running node sees it, through its admin API.

use anyhow::{Context, bail};

use hearth_admin_client::AdminError;

/// `hearth ring`'s flags.
#[derive(clap::Args)]
pub(crate) struct RingArgs {
    /// Admin URL of a running node, e.g. http://127.0.0.1:8081.
    #[arg(long)]
    admin: String,
    /// Admin token (default: $HEARTH_ADMIN_TOKEN).
    #[arg(long, env = "HEARTH_ADMIN_TOKEN", hide_env_values = true)]
    token: Option<String>,
    #[command(flatten)]
    tls: crate::AdminTlsArgs,
    /// A script ID to place on the ring.
    #[arg(long)]
    script: Option<String>,
}

/// Asks the node for its ring and prints it.
pub(crate) async fn run(args: RingArgs) -> anyhow::Result<()> {
    let token = args
        .token
        .context("reading a node's ring needs its admin token: --token or HEARTH_ADMIN_TOKEN")?;
    let admin = args.tls.client(&args.admin, token)?;
    let view = match admin.ring(args.script.as_deref()).await {
        Err(AdminError::Refused { status, body, .. }) => bail!("ring refused ({status}): {body}"),
        other => other?,
    };
    print!("{view}");
    Ok(())
}
