//! What the cluster layer needs from the node's own Workers.
//!
//! The shard server and the lazy local instance run Workers on *this* node
//! through [`HostedWorkers`]; the `hearth` package implements it on top of
//! `hearth-runtime`. Keeping it a trait keeps wasmtime out of this crate and
//! lets the RPC layer be tested against fakes.

use futures::future::BoxFuture;

use crate::routing::Route;

/// The HTTP body passed between the front door, the cluster layer and the
/// runtime, and the error its stream carries: `hearth-body`'s, which the
/// runtime uses too.
pub use hearth_body::{Body, BoxError};

/// A node's own Workers, as seen by the cluster layer.
pub trait HostedWorkers: Send + Sync + 'static {
    /// Serves `req` with Worker `script_id` on this node in `role`,
    /// cold-starting it if needed. The role was decided once, by
    /// [`crate::routing::decide`] and the home's answer: [`Route::Sharded`]
    /// for a request that reached this node over the shard hop,
    /// [`Route::Fallback`] for one a home refused or could not take. The
    /// implementation reports it (response header, metrics). Runtime
    /// failures (unknown script, limits, traps) come back as 4xx/5xx
    /// responses with a clear body, never as a panic.
    fn serve(
        &self,
        role: Route,
        script_id: &str,
        req: http::Request<Body>,
    ) -> BoxFuture<'static, http::Response<Body>>;

    /// Whether `script_id` is warm (resident) on this node right now.
    fn is_warm(&self, script_id: &str) -> bool;

    /// Whether this node has memory to host `script_id` without evicting
    /// Workers busier than it (always true when it is already warm).
    fn can_host(&self, script_id: &str) -> bool;

    /// Gets `script_id` ready for a request that is probably coming (load,
    /// instantiate) without serving one, within the node's own bounds on
    /// prewarms. A host that does not prewarm drops every hint, which is
    /// what the default does.
    fn prewarm(&self, script_id: &str) -> BoxFuture<'static, PrewarmOutcome> {
        let _ = script_id;
        Box::pin(std::future::ready(PrewarmOutcome::Dropped))
    }

    /// `script_id` was redeployed with source `hash` (announced by the
    /// node that took the deploy): a warm copy of another version is
    /// revalidated against the store. Resolves when that is done. The
    /// default holds no copies, so does nothing.
    fn redeployed(&self, script_id: &str, hash: &str) -> BoxFuture<'static, ()> {
        let _ = (script_id, hash);
        Box::pin(std::future::ready(()))
    }

    /// Drops this node's warm copy of `script_id` if this node is not its
    /// home, so requests go to the home again; whether one was dropped.
    fn hand_back(&self, script_id: &str) -> bool {
        let _ = script_id;
        false
    }

    /// A live tail of `script_id` on this node for a peer
    /// (`ShardServer.tail`): each finished request as the JSON of a
    /// `RequestEvent`, an empty string as a keepalive when quiet; the
    /// stream ends when this node drains. `status` is the admin API's
    /// `status=` filter (empty for all). `Err` says why not (a bad filter,
    /// or a host that offers no tail, the default).
    fn tail(
        &self,
        script_id: &str,
        status: &str,
        sample: f64,
    ) -> Result<futures::stream::BoxStream<'static, String>, String> {
        let _ = (script_id, status, sample);
        Err("this node offers no live tail".to_string())
    }
}

/// What a prewarm did (as a home answers `ShardServer.prewarm`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PrewarmOutcome {
    /// The Worker was loaded and instantiated for it.
    Loaded,
    /// The Worker was resident already.
    AlreadyWarm,
    /// Not done: prewarms at their cap, one already running for this
    /// Worker, or memory short.
    Dropped,
    /// No such Worker, or it failed to load or start.
    Failed,
}

impl PrewarmOutcome {
    /// Lowercase name, for logs and metrics labels.
    pub fn as_str(self) -> &'static str {
        match self {
            PrewarmOutcome::Loaded => "loaded",
            PrewarmOutcome::AlreadyWarm => "already_warm",
            PrewarmOutcome::Dropped => "dropped",
            PrewarmOutcome::Failed => "failed",
        }
    }
}
