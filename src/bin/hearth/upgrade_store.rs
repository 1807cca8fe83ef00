//! `hearth upgrade-store`: upgrades a store written by a hearth from
//! before store records were signed, once every node runs this build
//! (nodes set `accept_unsigned_records = true` until then). It moves each
//! Worker's secrets out of its deployment record into records of their
//! own, strips sealed values from every version record, and signs every
//! record under the cluster's `artifact_key`
//! ([`hearth::runtime::store::records`]). Afterwards, turn
//! `accept_unsigned_records` off: a record without a MAC is then refused.

use std::path::PathBuf;

/// `hearth upgrade-store`'s flags.
#[derive(clap::Args)]
pub(crate) struct UpgradeStoreArgs {
    /// The nodes' config file: its store, [s3], data and artifact_key
    /// are used.
    #[arg(long)]
    config: Option<PathBuf>,
    /// Script store: a directory or s3://bucket/prefix (over the config's).
    #[arg(long)]
    store: Option<String>,
}

/// Upgrades every record of the store; fails on the first record that
/// cannot be (one whose MAC does not check is refused, not signed).
pub(crate) async fn run(args: UpgradeStoreArgs) -> anyhow::Result<()> {
    let (runtime, location) = super::precompile::store_runtime(args.config, args.store).await?;
    let done = runtime.script_store().upgrade().await?;
    println!(
        "{} Workers in {location}: {} records signed, {} secrets moved into their own records",
        done.scripts, done.records_signed, done.secrets_moved
    );
    Ok(())
}
