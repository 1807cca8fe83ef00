//! Why a node's configuration cannot be used.
//!
//! One error type, [`NodeConfigError`], for every part of the config: a
//! file that cannot be read or parsed, a setting that cannot be used (an
//! unset variable, a bad node ID or address, a certificate without its key
//! or listener), a secret that protects nothing, a store secret that
//! cannot be read or made, and a store that cannot be opened. Each message
//! names the file or setting and says what to do, and where a secret is
//! missing or unusable it offers a freshly generated one to paste.

use std::path::PathBuf;

use hearth_runtime::StoreError;

use super::MIN_ADMIN_TOKEN_BYTES;

/// Why a node's configuration cannot be used. Each message names the file
/// or setting and says what to do; a cause is in the message, not also a
/// `source` (which would print it twice in an error chain).
#[derive(Debug, thiserror::Error)]
pub enum NodeConfigError {
    /// A CA file of `[egress] extra_roots` is not usable (the error names
    /// the file).
    #[error("[egress] extra_roots: {0}")]
    EgressRoot(crate::https::HttpsError),
    /// `[limits]` that cannot work together.
    #[error("[limits] {0}")]
    Limits(#[from] crate::listener::ServeLimitsError),
    /// The `[objects]` section is not usable.
    #[error("[objects] {0}")]
    Objects(String),
    /// The `[telemetry]` section is not usable.
    #[error("[telemetry] {0}")]
    Telemetry(String),
    /// The config file could not be read.
    #[error("cannot read config {}: {error}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        error: std::io::Error,
    },
    /// The config file is not valid TOML for a node.
    #[error("invalid config {}: {error}", path.display())]
    Parse {
        /// The file.
        path: PathBuf,
        /// Where and why.
        error: toml::de::Error,
    },
    /// Gossip is on but no key is given.
    #[error(
        "[cluster] turns gossip on but gives no gossip_key. Nodes with different \
         keys never hear each other, and each would serve every Worker alone. Put \
         the same key in the [cluster] section of every node, for example this \
         fresh one:\n    gossip_key = \"{fresh}\""
    )]
    NoGossipKey {
        /// A fresh key to offer.
        fresh: String,
    },
    /// An S3 store is given without the shared artifact key.
    #[error(
        "store = \"{location}\" shares precompiled artifacts between nodes, so every \
         node needs the same artifact_key (nodes with different keys refuse each \
         other's artifacts). Put the same key in every node's config, for example \
         this fresh one:\n    artifact_key = \"{fresh}\""
    )]
    NoArtifactKey {
        /// The store's location.
        location: String,
        /// A fresh key to offer.
        fresh: String,
    },
    /// A secret setting holds a value printed in hearth's documentation.
    #[error(
        "{setting} is an example value from hearth's documentation, which anyone can read: \
         with it, whoever has read the docs could {risk}. Put a secret of your own in its \
         place{scope}, for example this freshly generated one:\n    {key} = \"{fresh}\""
    )]
    ExampleSecret {
        /// Where the setting is, e.g. `[cluster] gossip_key`.
        setting: &'static str,
        /// The key to write the fresh value under.
        key: &'static str,
        /// What the secret protects.
        risk: &'static str,
        /// Which nodes must share it, if any.
        scope: &'static str,
        /// A fresh value to offer.
        fresh: String,
    },
    /// The admin token is too short to resist guessing.
    #[error(
        "admin_token is {len} bytes long; it must be at least {MIN_ADMIN_TOKEN_BYTES} bytes, \
         since a short token can be guessed over the network. Use for example this freshly \
         generated one:\n    admin_token = \"{fresh}\""
    )]
    ShortAdminToken {
        /// Its length in bytes.
        len: usize,
        /// A fresh token to offer.
        fresh: String,
    },
    /// A key setting is not 64 hex digits.
    #[error("{setting} must be 64 hex digits (32 bytes)")]
    BadKey {
        /// The setting, e.g. `artifact_key`.
        setting: &'static str,
    },
    /// A certificate is given but no HTTPS listener.
    #[error("tls_cert and tls_key need tls_listen (--tls-listen ADDR) to serve HTTPS")]
    TlsWithoutListen,
    /// Only one of certificate and key is given.
    #[error("give both tls_cert and tls_key (--tls-cert, --tls-key), or neither")]
    TlsHalfPair,
    /// Only one of the admin API's certificate and key is given.
    #[error(
        "give both admin_tls_cert and admin_tls_key (--admin-tls-cert, --admin-tls-key), or neither"
    )]
    AdminTlsHalfPair,
    /// A store secret or its directory could not be created.
    #[error("cannot create {}: {error}", path.display())]
    Create {
        /// The file or directory.
        path: PathBuf,
        /// Why.
        error: std::io::Error,
    },
    /// A store secret is not 64 hex digits.
    #[error("corrupt secret in {}: {reason} (expected 64 hex digits)", path.display())]
    CorruptSecret {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// A store secret exists but cannot be read.
    #[error("cannot read secret {}: {error}", path.display())]
    ReadSecret {
        /// The file.
        path: PathBuf,
        /// Why.
        error: std::io::Error,
    },
    /// Another node created a secret and it was gone when read.
    #[error("{} vanished while it was created", path.display())]
    SecretVanished {
        /// The file.
        path: PathBuf,
    },
    /// The data directory of an S3-backed node could not be created.
    #[error("cannot create data directory {}: {error}", path.display())]
    DataDir {
        /// The directory.
        path: PathBuf,
        /// Why.
        error: std::io::Error,
    },
    /// The script store could not be opened.
    #[error("cannot open script store: {0}")]
    OpenStore(StoreError),
    /// The script store answered its first call with an error.
    #[error("cannot use the script store: {0}")]
    UseStore(StoreError),
    /// A setting names an environment variable that is not set.
    #[error(
        "{setting} = \"{value}\" names the environment variable {name}, which is not set \
         (export it, e.g. `export {name}`, or write the value itself)"
    )]
    UnsetVariable {
        /// The setting, e.g. `node_id`.
        setting: &'static str,
        /// Its value as written.
        value: String,
        /// The variable.
        name: String,
    },
    /// A node ID (after expanding variables) cannot name a node.
    #[error(
        "{setting} = \"{value}\" gives the node ID \"{id}\", which cannot name a node: use \
         lowercase letters, digits, '-' and '_' (dot-separated labels, at most 63 bytes), \
         e.g. a Kubernetes pod name such as hearth-0"
    )]
    BadNodeId {
        /// Where it came from: `node_id` or `--node-id`.
        setting: &'static str,
        /// As written.
        value: String,
        /// As expanded.
        id: String,
    },
    /// An address (after expanding variables) is not an IP address and port.
    #[error("{setting} = \"{value}\" expands to \"{expanded}\", which is not an IP:PORT address")]
    BadAddress {
        /// The setting, e.g. `[cluster] rpc`.
        setting: &'static str,
        /// As written.
        value: String,
        /// As expanded.
        expanded: String,
    },
}
