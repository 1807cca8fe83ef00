//! `hearth hand-back`: a Worker handed back to its home now.

use anyhow::{Context, bail};

use hearth_admin_client::AdminError;

/// `hearth hand-back`'s flags.
#[derive(clap::Args)]
pub(crate) struct HandBackArgs {
    /// Admin URL of any running node of the cluster.
    #[arg(long)]
    admin: String,
    /// Admin token (default: $HEARTH_ADMIN_TOKEN).
    #[arg(long, env = "HEARTH_ADMIN_TOKEN", hide_env_values = true)]
    token: Option<String>,
    #[command(flatten)]
    tls: crate::AdminTlsArgs,
    /// The Worker's script ID.
    #[arg(long)]
    script: String,
}

/// Asks the node to hand the Worker back and prints what it did.
pub(crate) async fn run(args: HandBackArgs) -> anyhow::Result<()> {
    let token = args
        .token
        .context("handing a Worker back needs the admin token: --token or HEARTH_ADMIN_TOKEN")?;
    let admin = args.tls.client(&args.admin, token)?;
    let script = &args.script;
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
