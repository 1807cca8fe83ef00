//! `hearth versions list|deploy` and `hearth rollback`: a Worker's
//! numbered versions, a gradual rollout between them, and a rollback,
//! through a node's admin API (see `hearth_runtime::store::versions` for the
//! model). A rollout or rollback is announced to every node of the
//! cluster, like a deploy.

use std::time::{Duration, UNIX_EPOCH};

use anyhow::{Context, bail};
use hearth_admin_client::{AdminClient, AdminError, DeploymentChange, VersionShare};

/// Where the admin API is (shared by `versions`, `rollback` and `secret`).
#[derive(clap::Args)]
pub(crate) struct AdminArgs {
    /// Admin URL of a running node, e.g. http://127.0.0.1:8081.
    #[arg(long, global = true, default_value = "http://127.0.0.1:8081")]
    admin: String,
    /// Admin token (default: $HEARTH_ADMIN_TOKEN).
    #[arg(
        long,
        global = true,
        env = "HEARTH_ADMIN_TOKEN",
        hide_env_values = true
    )]
    token: Option<String>,
}

impl AdminArgs {
    pub(crate) fn client(&self) -> anyhow::Result<AdminClient> {
        let token = self
            .token
            .clone()
            .context("the admin API needs its token: --token or HEARTH_ADMIN_TOKEN")?;
        Ok(AdminClient::new(&self.admin, Some(token))?)
    }
}

/// `hearth versions`'s flags.
#[derive(clap::Args)]
pub(crate) struct VersionsArgs {
    #[command(flatten)]
    admin: AdminArgs,
    #[command(subcommand)]
    action: Action,
}

#[derive(clap::Subcommand)]
enum Action {
    /// List SCRIPT's versions, newest first, with the current deployment
    /// and (during a split) this node's requests and errors per version.
    List {
        /// The Worker.
        script: String,
    },
    /// Split SCRIPT's traffic between versions, e.g. `7@10% 6@90%`
    /// (percentages summing to 100; one client sticks to one version:
    /// see the README). `7@100%` ends a split.
    Deploy {
        /// The Worker.
        script: String,
        /// VERSION@PERCENT%, one or more.
        #[arg(required = true)]
        split: Vec<String>,
    },
}

/// `hearth rollback`'s flags.
#[derive(clap::Args)]
pub(crate) struct RollbackArgs {
    #[command(flatten)]
    admin: AdminArgs,
    /// The Worker.
    script: String,
    /// The version to serve (default: the one before the current).
    version: Option<u64>,
}

fn refused(e: AdminError) -> anyhow::Error {
    match e {
        AdminError::Refused { status, body, .. } => anyhow::anyhow!("refused ({status}): {body}"),
        e => e.into(),
    }
}

/// Parses `7@10%` (the `%` optional).
fn parse_share(s: &str) -> anyhow::Result<VersionShare> {
    let bad = || anyhow::anyhow!("{s:?} is not VERSION@PERCENT%, e.g. 7@10%");
    let (v, p) = s.split_once('@').ok_or_else(bad)?;
    let p = p.strip_suffix('%').unwrap_or(p);
    Ok(VersionShare {
        version: v.trim().parse().map_err(|_| bad())?,
        percent: p.trim().parse().map_err(|_| bad())?,
    })
}

/// Runs one `hearth versions` command.
pub(crate) async fn run(args: VersionsArgs) -> anyhow::Result<()> {
    let admin = args.admin.client()?;
    match args.action {
        Action::List { script } => {
            let list = admin.versions(&script).await.map_err(refused)?;
            let deployment: Vec<String> = list.deployment.iter().map(|s| s.to_string()).collect();
            println!("{script}: serving {}", deployment.join(" "));
            println!(
                "  {:<8} {:<20} {:<14} {:>10}  {:>7}",
                "version", "deployed (UTC)", "hash", "bytes", "traffic"
            );
            for v in list.versions.iter().rev() {
                let share = list
                    .deployment
                    .iter()
                    .find(|s| s.version == v.version)
                    .map(|s| format!("{}%", s.percent))
                    .unwrap_or_default();
                let at = UNIX_EPOCH + Duration::from_millis(v.deployed_at_ms);
                println!(
                    "  {:<8} {:<20} {:<14} {:>10}  {:>7}",
                    v.version,
                    humantime_serde::re::humantime::format_rfc3339_seconds(at).to_string(),
                    v.hash.get(..12).unwrap_or(&v.hash),
                    v.size,
                    share
                );
            }
            if !list.counts.is_empty() {
                println!("requests on {} during the split:", admin.url());
                for c in &list.counts {
                    let rate = if c.requests == 0 {
                        0.0
                    } else {
                        c.errors as f64 * 100.0 / c.requests as f64
                    };
                    println!(
                        "  version {:<6} {:>10} requests {:>8} errors ({rate:.2}%)",
                        c.version, c.requests, c.errors
                    );
                }
            }
        }
        Action::Deploy { script, split } => {
            let shares = split
                .iter()
                .map(|s| parse_share(s))
                .collect::<anyhow::Result<Vec<_>>>()?;
            let sum: u32 = shares.iter().map(|s| u32::from(s.percent)).sum();
            if sum != 100 {
                bail!("the percentages sum to {sum}%, not 100%");
            }
            let done = admin
                .set_deployment(&script, &shares)
                .await
                .map_err(refused)?;
            print_change(&done);
        }
    }
    Ok(())
}

/// Runs `hearth rollback`.
pub(crate) async fn rollback(args: RollbackArgs) -> anyhow::Result<()> {
    let admin = args.admin.client()?;
    let done = admin
        .rollback(&args.script, args.version)
        .await
        .map_err(refused)?;
    print_change(&done);
    Ok(())
}

fn print_change(done: &DeploymentChange) {
    let deployment: Vec<String> = done.deployment.iter().map(|s| s.to_string()).collect();
    println!("{} now serves {}", done.script_id, deployment.join(" "));
    let a = &done.announced;
    if a.members > 0 {
        println!(
            "announced to {} of {} other nodes (they serve it now)",
            a.acknowledged, a.members
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shares_parse_with_or_without_the_percent_sign() {
        let s = parse_share("7@10%").expect("share");
        assert_eq!((s.version, s.percent), (7, 10));
        let s = parse_share("6@90").expect("share");
        assert_eq!((s.version, s.percent), (6, 90));
        assert!(parse_share("7").is_err());
        assert!(parse_share("7@ten").is_err());
    }
}
