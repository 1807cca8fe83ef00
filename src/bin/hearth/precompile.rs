//! `hearth precompile`: fills the store's artifact cache for this build's
//! engine ahead of a rollout, so nodes on the new build load every Worker
//! from its artifact on their first request instead of compiling it (which
//! takes seconds for a JS or Python Worker). Run it with the new binary and
//! the nodes' config (`--config`) or store (`--store`); Workers are
//! compiled one at a time.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::bail;

use hearth::config::{NodeStore, ServeArgs};
use hearth::runtime::Runtime;

/// `hearth precompile`'s flags.
#[derive(clap::Args)]
pub(crate) struct PrecompileArgs {
    /// Every Worker in the store.
    #[arg(long, conflicts_with = "scripts")]
    all: bool,
    /// The Workers (script IDs) to precompile.
    #[arg(required_unless_present = "all")]
    scripts: Vec<String>,
    /// The nodes' config file: its store, [s3], data, artifact_key and
    /// plans are used.
    #[arg(long)]
    config: Option<PathBuf>,
    /// Script store: a directory or s3://bucket/prefix (over the config's).
    #[arg(long)]
    store: Option<String>,
}

/// A runtime over the nodes' store, as a node with their config
/// (`config`) or over `store` would be, and where the store is: for the
/// tools that work on the store ahead of or after a rollout.
pub(crate) async fn store_runtime(
    config: Option<PathBuf>,
    store: Option<String>,
) -> anyhow::Result<(Runtime, String)> {
    let cfg = ServeArgs {
        config,
        store,
        ..ServeArgs::default()
    }
    .resolve()?;
    let store = NodeStore::open(&cfg.store, &cfg.settings).await?;
    let runtime = Runtime::with_store(cfg.settings.apply(store.runtime), store.scripts)?;
    Ok((runtime, cfg.store))
}

/// Precompiles the Workers asked for; fails if any could not be.
pub(crate) async fn run(args: PrecompileArgs) -> anyhow::Result<()> {
    let (runtime, location) = store_runtime(args.config, args.store).await?;
    let scripts = if args.all {
        let mut ids: Vec<String> = runtime
            .script_store()
            .list()
            .await?
            .into_iter()
            .map(|m| m.script_id)
            .collect();
        ids.sort();
        ids
    } else {
        args.scripts
    };
    let mut failed = 0;
    for id in &scripts {
        let t = Instant::now();
        match runtime.precompile(id).await {
            Ok(done) => println!("{id}: {done} ({:.1?})", t.elapsed()),
            Err(e) => {
                failed += 1;
                eprintln!("{id}: {e}");
            }
        }
    }
    println!(
        "{} of {} Workers have artifacts for this engine in {}",
        scripts.len() - failed,
        scripts.len(),
        location
    );
    if failed > 0 {
        bail!("{failed} Workers could not be precompiled");
    }
    Ok(())
}
