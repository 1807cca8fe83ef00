//! The configuration of `hearth serve`: a TOML file (every field
//! optional) and flags over it, resolved in one step by
//! [`ServeArgs::resolve`] into the [`ServeConfig`] the node runs with.
//!
//! Every key of the file, with its default or an example value, is in
//! `docs/operator/hearth.toml` (a unit test parses it); the three files
//! `docs/operator/node-*.toml` are a 3-node cluster's, as an operator runs
//! it.
//!
//! Durations are strings with a unit (`"10s"`, `"250ms"`, `"5m"`, read by
//! `humantime`), sizes are strings with a unit (`"128MiB"`, `"8GiB"`; KiB,
//! MiB and GiB are powers of 1024, KB, MB and GB powers of 1000) or a bare
//! number of bytes. The keys that carried their unit in the name before
//! (`idle_timeout_s`, `memory_budget_mb`, `write_timeout_s`,
//! `drain_timeout_s`, `body_idle_timeout_s`, `slot_wait_ms`,
//! `instance_memory_mb`, `[s3] timeout_ms`) and a plan's time limits as bare
//! milliseconds are still read for this release, each with a warning that
//! names what to write instead; a file that sets an old key and its new
//! one is refused.
//!
//! Secrets (`artifact_key`, `[cluster] gossip_key`, `admin_token`) are each
//! node's own or its cluster's: a node refuses to start with a value
//! hearth's documentation prints ([`SECRET_PLACEHOLDER`], or an example
//! value shipped before) or an admin token shorter than
//! [`MIN_ADMIN_TOKEN_BYTES`], and offers a fresh one
//! ([`NodeConfig::check_secrets`]). The admin API is plain HTTP unless
//! `admin_tls_cert` and `admin_tls_key` are set (then HTTPS only): keep
//! `admin` on loopback (the default) or a private network either way. Give
//! each node only its own certificate and key from `hearth pki` (and the
//! CA certificate `ca.pem`), never the CA's key `ca-key.pem`: whoever holds
//! that can make certificates for any node ID.
//!
//! One file can serve every node of a cluster (the pods `hearth-0…N` of a
//! Kubernetes StatefulSet): `node_id` and the `[cluster]` `rpc` and
//! `gossip` addresses may name environment variables (`$HOSTNAME`,
//! `${POD_IP}`), expanded when the node starts ([`expand_env`]), and seeds
//! and static members may be DNS names (`hearth.default.svc:7001`),
//! resolved again every 10 s ([`hearth_sharding::membership::PeerAddr`]).
//!
//! # Layout
//!
//! Each part has a file of its own; the public items are re-exported here.
//!
//! - `arguments`: `hearth serve`'s flags ([`ServeArgs`]), the defaults, and
//!   the one [`ServeConfig`] they resolve to with the file.
//! - `file`: the TOML file's structs ([`NodeConfig`] and its sections) and
//!   what their settings mean for the runtime and the listeners.
//! - `environment`: environment variables in node IDs, addresses
//!   ([`ListenAddr`]) and secrets.
//! - `secrets`: refusing secrets that protect nothing, and the secret files
//!   a directory store keeps ([`store_secret`], [`admin_token`]).
//! - `store`: opening the script store a node runs from ([`NodeStore`]).
//! - `legacy`: the deprecated keys, read for this release only; the next
//!   release deletes the file (and the fields it names).
//! - `error`: [`NodeConfigError`].

mod arguments;
mod environment;
mod error;
mod file;
mod legacy;
mod secrets;
mod store;

pub use arguments::{
    DEFAULT_ADMIN, DEFAULT_LISTEN, DEFAULT_NODE_ID, DEFAULT_STORE, ServeArgs, ServeConfig,
    TlsConfig,
};
pub use environment::{ListenAddr, expand_env};
pub use error::NodeConfigError;
pub use file::{
    ClientLimits, ClusterSection, EgressSection, NodeConfig, PlanOverrides, Plans, StaticNode,
    TelemetrySection,
};
pub use secrets::{
    MIN_ADMIN_TOKEN_BYTES, SECRET_PLACEHOLDER, admin_token, runtime_config, store_secret,
};
pub use store::NodeStore;

/// What the tests of several parts share: resolving a config as `hearth
/// serve --config` does.
#[cfg(test)]
mod test_support {
    use std::path::Path;

    use super::{NodeConfigError, ServeArgs, ServeConfig};

    pub(super) fn args(config: Option<&Path>) -> ServeArgs {
        ServeArgs {
            config: config.map(Path::to_path_buf),
            ..ServeArgs::default()
        }
    }

    /// Writes `text` as a config file in `dir` and resolves it, as `hearth
    /// serve --config` does before anything starts.
    pub(super) fn resolve_text(dir: &Path, text: &str) -> Result<ServeConfig, NodeConfigError> {
        let path = dir.join("node.toml");
        std::fs::write(&path, text).expect("write config");
        args(Some(&path)).resolve()
    }
}
