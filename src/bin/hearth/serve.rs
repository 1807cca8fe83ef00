//! `hearth serve`: one node, run with the [`ServeConfig`] that its flags
//! and config file resolve to, until Ctrl-C; then it drains.

use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::Context;
use tokio::net::TcpListener;

use hearth::cluster::Joined;
use hearth::config::{NodeStore, ServeArgs, ServeConfig, TlsConfig, admin_token};
use hearth::https::TlsFrontDoor;
use hearth::node::{Listeners, Node, spawn_listeners};
use hearth::runtime::Runtime;

/// Runs the node: store, runtime, cluster, listeners, then the drain.
pub(crate) async fn run(args: ServeArgs) -> anyhow::Result<()> {
    let cfg = args.resolve()?;
    hearth::cluster::log_fd_limit();
    let store = NodeStore::open(&cfg.store, &cfg.settings).await?;
    // The certificate first: a bad path is a startup error before anything
    // listens.
    let https = tls_front_door(cfg.tls.as_ref(), &store.data_dir)?;
    let runtime = Runtime::with_store(cfg.settings.apply(store.runtime), store.scripts)?;
    let token = token(&cfg, &store.data_dir)?;
    let node = Node::with_prewarm(cfg.node_id.clone(), runtime, cfg.settings.prewarm());
    let (node, joined) = join(node, &cfg).await?;
    let listeners = bind(&cfg, https, &node).await?;
    crate::say(&format!(
        "admin API on http://{} (store {})",
        cfg.admin, cfg.store
    ));
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let tasks = spawn_listeners(
        &node,
        listeners,
        token,
        cfg.settings.serve_limits(),
        stop_rx,
    );
    tokio::signal::ctrl_c().await?;
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
    let rpc_listener = TcpListener::bind(c.rpc)
        .await
        .with_context(|| format!("cannot listen for RPC on {}", c.rpc))?;
    let joined = hearth::cluster::join(node, c.join_config(&cfg.node_id, rpc_listener)?).await?;
    crate::say(&format!(
        "joined the cluster: rpc {} (pki {})",
        c.rpc,
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
    Ok(Listeners { http, https, admin })
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
