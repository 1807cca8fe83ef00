//! `hearth serve`: one node, run with the [`ServeConfig`] that its flags
//! and config file resolve to, until SIGTERM or SIGINT (Ctrl-C); then it
//! drains: it reports not ready, leaves the ring, finishes what is in
//! flight (closing what is left after `drain_timeout`) and exits 0. A
//! second signal exits at once. Under systemd (`Type=notify`) it says
//! `READY=1` once it serves and `STOPPING=1` when it starts to drain.

use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::Context;
use tokio::net::TcpListener;

use hearth::cluster::Joined;
use hearth::config::{NodeStore, ServeArgs, ServeConfig, TlsConfig, admin_token};
use hearth::front_door::{Listeners, spawn_listeners};
use hearth::https::TlsFrontDoor;
use hearth::node::Node;
use hearth::runtime::Runtime;

/// Runs the node: store, runtime, cluster, listeners, then the drain.
pub(crate) async fn run(args: ServeArgs) -> anyhow::Result<()> {
    let cfg = args.resolve()?;
    let serve_limits = cfg.settings.serve_limits()?;
    hearth::cluster::log_fd_limit();
    let store = NodeStore::open(&cfg.store, &cfg.settings).await?;
    // The certificate first: a bad path is a startup error before anything
    // listens.
    let https = tls_front_door(cfg.tls.as_ref(), &store.data_dir)?;
    let admin_tls =
        match &cfg.admin_tls {
            Some((cert, key)) => Some(TlsFrontDoor::from_pem(cert, key).context(
                "cannot load the admin API's certificate (admin_tls_cert, admin_tls_key)",
            )?),
            None => None,
        };
    let runtime = Runtime::with_store(cfg.settings.apply(store.runtime), store.scripts)?;
    let token = token(&cfg, &store.data_dir)?;
    let node = Node::with_prewarm(cfg.node_id.clone(), runtime, cfg.settings.prewarm());
    if let Some(top) = cfg.settings.metrics_top_workers {
        node.metrics().workers.set_top(top);
    }
    if let Some(section) = &cfg.settings.telemetry {
        let telemetry = hearth::telemetry::Telemetry::start(
            section.config()?,
            &cfg.node_id,
            node.metrics().otel.clone(),
        )?;
        node.set_telemetry(telemetry);
        crate::say(&format!(
            "request spans exported over OTLP/HTTP to {}",
            section.endpoint
        ));
    }
    let (node, joined) = join(node, &cfg).await?;
    precompile_after_upgrade(&node);
    // Catch the signals before anything listens, so an early SIGTERM drains
    // too instead of killing the process.
    let mut signals = Signals::new()?;
    let mut listeners = bind(&cfg, https, &node).await?;
    crate::say(&format!(
        "admin API on {}://{} (store {})",
        if admin_tls.is_some() { "https" } else { "http" },
        cfg.admin,
        cfg.store
    ));
    listeners.admin_tls = admin_tls;
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let tasks = spawn_listeners(
        &node,
        listeners,
        hearth::admin::AdminAccess {
            token,
            metrics: cfg.settings.admin_metrics.unwrap_or_default(),
        },
        serve_limits,
        stop_rx,
    );
    notify_systemd(sd_notify::NotifyState::Ready);
    let signal = signals.next().await;
    eprintln!("{signal}: draining (send another signal to exit at once)");
    notify_systemd(sd_notify::NotifyState::Stopping);
    node.start_draining();
    tokio::spawn(async move {
        let signal = signals.next().await;
        eprintln!("{signal} while draining: exiting now");
        std::process::exit(1);
    });
    // Drain: leave everyone's ring first, so no new sharded requests come
    // here, then finish what is in flight, then say goodbye.
    if let Some(j) = &joined {
        eprintln!("draining: leaving the ring");
        if let Err(e) = j.membership.drain().await {
            eprintln!("drain announcement failed: {e}");
        }
    }
    eprintln!("shutting down: finishing in-flight requests");
    let _ = stop_tx.send(true);
    for task in tasks {
        let _ = task.await;
    }
    if let Some(j) = joined {
        j.rpc_server.stop();
        let _ = j.membership.shutdown().await;
        if let Some(r) = node.rpc() {
            r.shutdown();
        }
    }
    Ok(())
}

/// How many Workers a node new to its engine precompiles before it
/// reports ready.
const UPGRADE_PRECOMPILE: usize = 16;

/// The longest a node new to its engine stays not ready to precompile.
const UPGRADE_PRECOMPILE_FOR: std::time::Duration = std::time::Duration::from_secs(120);

/// After an upgrade (the artifact cache holds only another engine's
/// artifacts): precompiles, in the background and one at a time, the
/// Workers this node had artifacts for, most recently compiled first (at
/// most [`UPGRADE_PRECOMPILE`], for at most [`UPGRADE_PRECOMPILE_FOR`]),
/// and reports not ready (`/readyz`) until done, so the first requests it
/// gets load artifacts instead of compiling. Artifacts another node or
/// `hearth precompile` already shared are fetched, not compiled.
fn precompile_after_upgrade(node: &Node) {
    let hashes = node.runtime().artifacts().other_engine_hashes();
    if hashes.is_empty() {
        return;
    }
    node.set_precompiling(true);
    let node = node.clone();
    tokio::spawn(async move {
        let work = async {
            let metas = match node.runtime().script_store().list().await {
                Ok(m) => m,
                Err(e) => {
                    tracing::warn!(error = %e, "cannot list Workers to precompile after the upgrade");
                    return 0;
                }
            };
            let ids: Vec<&str> = hashes
                .iter()
                .filter_map(|h| metas.iter().find(|m| &m.hash == h))
                .map(|m| m.script_id.as_str())
                .take(UPGRADE_PRECOMPILE)
                .collect();
            let mut done = 0;
            for id in ids {
                match node.runtime().precompile(id).await {
                    Ok(how) => {
                        tracing::info!(script = id, "precompiled for the new engine: {how}");
                        done += 1;
                    }
                    Err(e) => tracing::warn!(script = id, error = %e, "cannot precompile"),
                }
            }
            done
        };
        match tokio::time::timeout(UPGRADE_PRECOMPILE_FOR, work).await {
            Ok(done) => crate::say(&format!(
                "new engine: precompiled {done} Workers before reporting ready"
            )),
            Err(_) => tracing::warn!(
                "new engine: precompiling took over {UPGRADE_PRECOMPILE_FOR:?}; ready anyway"
            ),
        }
        node.set_precompiling(false);
    });
}

/// The signals that stop a node: SIGTERM (systemd, Docker, Kubernetes) and
/// SIGINT (Ctrl-C).
struct Signals {
    term: tokio::signal::unix::Signal,
    int: tokio::signal::unix::Signal,
}

impl Signals {
    fn new() -> anyhow::Result<Self> {
        use tokio::signal::unix::{SignalKind, signal};
        Ok(Signals {
            term: signal(SignalKind::terminate()).context("cannot catch SIGTERM")?,
            int: signal(SignalKind::interrupt()).context("cannot catch SIGINT")?,
        })
    }

    /// The next signal's name.
    async fn next(&mut self) -> &'static str {
        tokio::select! {
            _ = self.term.recv() => "SIGTERM",
            _ = self.int.recv() => "SIGINT",
        }
    }
}

/// Tells systemd `state` when run as a `Type=notify` service (nothing
/// otherwise); a failure is only logged.
fn notify_systemd(state: sd_notify::NotifyState<'_>) {
    if let Err(e) = sd_notify::notify(&[state]) {
        tracing::warn!(error = %e, "cannot notify systemd");
    }
}

/// The admin token: the config's, else the store's (made and printed on
/// first use).
fn token(cfg: &ServeConfig, store: &std::path::Path) -> anyhow::Result<Arc<str>> {
    if let Some(t) = &cfg.settings.admin_token {
        return Ok(t.as_str().into());
    }
    let (token, new) = admin_token(store)?;
    if new {
        crate::say(&format!(
            "generated admin token (saved in {}): {token}",
            store.join("admin.token").display()
        ));
    }
    Ok(token.into())
}

/// Joins the cluster of the config's `[cluster]` section, if it has one.
async fn join(node: Node, cfg: &ServeConfig) -> anyhow::Result<(Node, Option<Joined>)> {
    let Some(c) = &cfg.settings.cluster else {
        return Ok((node, None));
    };
    let rpc = c.rpc.addr("[cluster] rpc")?;
    let rpc_listener = TcpListener::bind(rpc)
        .await
        .with_context(|| format!("cannot listen for RPC on {rpc}"))?;
    // Through seeds, the node is ready once it has met one of them.
    node.expect_members(if c.seeds.is_empty() { 1 } else { 2 });
    let joined = hearth::cluster::join(node, c.join_config(&cfg.node_id, rpc_listener)?).await?;
    crate::say(&format!(
        "joined the cluster: rpc {} (pki {})",
        rpc,
        c.pki.display()
    ));
    Ok((joined.node.clone(), Some(joined)))
}

/// Binds the Worker, HTTPS and admin listeners and says where they are.
async fn bind(
    cfg: &ServeConfig,
    https: Option<(SocketAddr, TlsFrontDoor)>,
    node: &Node,
) -> anyhow::Result<Listeners> {
    let listen = |addr: SocketAddr| async move {
        TcpListener::bind(addr)
            .await
            .with_context(|| format!("cannot listen on {addr}"))
    };
    let http = listen(cfg.listen).await?;
    let admin = listen(cfg.admin).await?;
    crate::say(&format!(
        "hearth node {} serving Workers on http://{} (http://<script>.localhost:{})",
        node.id(),
        cfg.listen,
        cfg.listen.port()
    ));
    let https = match https {
        Some((addr, door)) => {
            let listener = listen(addr).await?;
            crate::say(&format!(
                "HTTPS (h2, http/1.1) on https://{addr} (https://<script>.localhost:{}), SNI prewarm {}",
                addr.port(),
                if cfg.settings.prewarm().enabled {
                    "on"
                } else {
                    "off"
                }
            ));
            Some((listener, door))
        }
        None => None,
    };
    Ok(Listeners {
        http,
        https,
        admin,
        admin_tls: None,
    })
}

/// The HTTPS front door's address and certificate, if the config asks for
/// one: the given certificate and key, or the store's development
/// certificate (made on first use; its CA's path is printed).
fn tls_front_door(
    tls: Option<&TlsConfig>,
    store: &std::path::Path,
) -> anyhow::Result<Option<(SocketAddr, TlsFrontDoor)>> {
    let Some(tls) = tls else {
        return Ok(None);
    };
    let door = match &tls.cert {
        Some((cert, key)) => TlsFrontDoor::from_pem(cert, key)
            .context("cannot load the HTTPS certificate (--tls-cert, --tls-key)")?,
        None => {
            let (door, ca) = TlsFrontDoor::dev(store)
                .context("cannot make the development HTTPS certificate")?;
            crate::say(&format!(
                "HTTPS uses development certificates for localhost and <script>.localhost; trust their CA: {}",
                ca.display()
            ));
            door
        }
    };
    Ok(Some((tls.listen, door)))
}
