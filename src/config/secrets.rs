//! Secrets: refusing the ones that protect nothing, and the secret files a
//! directory store keeps.
//!
//! `artifact_key`, `[cluster] gossip_key` and `admin_token` are each node's
//! own or its cluster's. A value hearth's documentation prints (the
//! [`SECRET_PLACEHOLDER`], or an example value shipped before) protects
//! nothing, since anyone can read it, and neither does a short admin token
//! ([`MIN_ADMIN_TOKEN_BYTES`]): [`NodeConfig::check_secrets`] refuses them
//! before the node starts, each error offering a fresh value.
//!
//! Nodes over one directory store share its secrets, kept as files in it
//! (`artifact.key`, `admin.token`): [`store_secret`] reads one, or makes a
//! random one on first use, written whole and linked into place only if no
//! other node got there first, so a concurrent reader never sees half a
//! secret. Any read error other than a missing file stops the node, which
//! never starts with a secret other than the one on disk.

use std::path::Path;

use hearth_runtime::RuntimeConfig;

use super::{NodeConfig, NodeConfigError};

/// What hearth's documentation writes where a secret goes (`artifact_key`,
/// `gossip_key`, `admin_token`): a node refuses to start with it.
pub const SECRET_PLACEHOLDER: &str = "REPLACE-ME";

/// The shortest admin token a node accepts, in bytes: the admin API can
/// deploy code, and a short token can be guessed over the network.
pub const MIN_ADMIN_TOKEN_BYTES: usize = 32;

/// Secret values hearth's documentation has printed: the placeholder, and
/// the example keys and token that `docs/operator/*.toml` shipped before
/// they became placeholders. Anyone who has read the docs knows them, so a
/// node refuses them ([`NodeConfig::check_secrets`]).
const EXAMPLE_SECRETS: &[&str] = &[
    SECRET_PLACEHOLDER,
    "change-me",
    "9c1f5e0b7a3d4c2e8f6a1b0d9e7c5a3f2b4d6e8a0c1e3f5a7b9d1f3e5a7c9e1b",
    "3e8d1c6b2a9f4e7d0c5b8a3f6e1d4c9b7a2f5e0d3c8b6a1f4e9d2c7b5a0f3e8d",
];

impl NodeConfig {
    /// Refuses secrets that protect nothing, before the node starts: an
    /// `artifact_key`, `[cluster] gossip_key` or `admin_token` that hearth's
    /// documentation has printed (the placeholder, or an example value), and
    /// an `admin_token` shorter than [`MIN_ADMIN_TOKEN_BYTES`]. Each error
    /// says why and offers a freshly generated value to paste.
    pub fn check_secrets(&self) -> Result<(), NodeConfigError> {
        let example = |value: &str| {
            EXAMPLE_SECRETS
                .iter()
                .any(|e| value.trim().eq_ignore_ascii_case(e))
        };
        if self.artifact_key.as_deref().is_some_and(example) {
            return Err(NodeConfigError::ExampleSecret {
                setting: "artifact_key",
                key: "artifact_key",
                risk: "forge precompiled artifacts, which nodes run as native code",
                scope: " (the same on every node)",
                fresh: fresh_key(),
            });
        }
        let gossip_key = self.cluster.as_ref().and_then(|c| c.gossip_key.as_deref());
        if gossip_key.is_some_and(example) {
            return Err(NodeConfigError::ExampleSecret {
                setting: "[cluster] gossip_key",
                key: "gossip_key",
                risk: "forge gossip and take nodes off the ring",
                scope: " (the same on every node)",
                fresh: fresh_key(),
            });
        }
        if let Some(token) = &self.admin_token {
            if example(token) {
                return Err(NodeConfigError::ExampleSecret {
                    setting: "admin_token",
                    key: "admin_token",
                    risk: "deploy Workers and drive this node through its admin API",
                    scope: "",
                    fresh: fresh_key(),
                });
            }
            if token.len() < MIN_ADMIN_TOKEN_BYTES {
                return Err(NodeConfigError::ShortAdminToken {
                    len: token.len(),
                    fresh: fresh_key(),
                });
            }
        }
        Ok(())
    }
}

/// Reads the secret in `store/name`, creating a random one (mode 0600) on
/// first use. Nodes sharing a store share it. Only a missing file is
/// created; any other read error (not UTF-8, a directory, no permission)
/// is an error naming the file, so a node never starts with a secret other
/// than the one on disk.
pub fn store_secret(store: &Path, name: &str) -> Result<[u8; 32], NodeConfigError> {
    use std::io::Write;
    let path = store.join(name);
    if let Some(key) = read_secret(&path)? {
        return Ok(key);
    }
    std::fs::create_dir_all(store).map_err(|error| NodeConfigError::Create {
        path: store.to_path_buf(),
        error,
    })?;
    let key: [u8; 32] = rand::random();
    // Written whole to a temporary file (0600 by default), then linked into
    // place only if no other node got there first: a concurrent reader sees
    // no file or a complete one, never an empty one.
    let create = |error: std::io::Error| NodeConfigError::Create {
        path: path.clone(),
        error,
    };
    let mut tmp = tempfile::NamedTempFile::new_in(store).map_err(create)?;
    tmp.write_all(blake3::Hash::from_bytes(key).to_hex().as_bytes())
        .map_err(create)?;
    tmp.as_file().sync_all().map_err(create)?;
    match tmp.persist_noclobber(&path) {
        Ok(_) => {
            hearth_runtime::store::script_store::sync_dir(store).map_err(create)?;
            Ok(key)
        }
        // Another node created it first: use theirs (read once, no retry).
        Err(e) if e.error.kind() == std::io::ErrorKind::AlreadyExists => {
            read_secret(&path)?.ok_or(NodeConfigError::SecretVanished { path })
        }
        Err(e) => Err(create(e.error)),
    }
}

/// The secret in `path`: `None` if there is no such file, an error naming
/// the file for anything else that stops it being read or parsed.
fn read_secret(path: &Path) -> Result<Option<[u8; 32]>, NodeConfigError> {
    match std::fs::read_to_string(path) {
        Ok(hex) => {
            let bytes =
                blake3::Hash::from_hex(hex.trim()).map_err(|e| NodeConfigError::CorruptSecret {
                    path: path.to_path_buf(),
                    reason: e.to_string(),
                })?;
            Ok(Some(*bytes.as_bytes()))
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(error) => Err(NodeConfigError::ReadSecret {
            path: path.to_path_buf(),
            error,
        }),
    }
}

/// `hex` as a 32-byte key, or an error naming the setting.
pub(super) fn parse_key(setting: &'static str, hex: &str) -> Result<[u8; 32], NodeConfigError> {
    let key =
        blake3::Hash::from_hex(hex.trim()).map_err(|_| NodeConfigError::BadKey { setting })?;
    Ok(*key.as_bytes())
}

/// A fresh random key in hex, offered in the message when one is missing.
pub(super) fn fresh_key() -> String {
    let fresh: [u8; 32] = rand::random();
    blake3::Hash::from_bytes(fresh).to_hex().to_string()
}

/// The runtime configuration every node over `store` starts from: sources
/// and artifacts in the store, authenticated with the store's artifact key.
pub fn runtime_config(store: &Path) -> Result<RuntimeConfig, NodeConfigError> {
    Ok(RuntimeConfig::new(store).artifact_key(store_secret(store, "artifact.key")?))
}

/// The admin token of the nodes over `store` (`store/admin.token`), and
/// whether it was just generated (callers print a new one).
pub fn admin_token(store: &Path) -> Result<(String, bool), NodeConfigError> {
    let existed = store.join("admin.token").exists();
    let key = store_secret(store, "admin.token")?;
    Ok((blake3::Hash::from_bytes(key).to_hex().to_string(), !existed))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::test_support::resolve_text;

    /// The value a refusal offers to paste after `key = "`.
    fn offered(message: &str, key: &str) -> String {
        message
            .split(&format!("{key} = \""))
            .nth(1)
            .and_then(|rest| rest.split('"').next())
            .unwrap_or_else(|| panic!("no {key} offered in: {message}"))
            .to_string()
    }

    #[test]
    fn the_three_example_configs_of_the_readme_parse_agree_and_hold_no_usable_secret() {
        let texts = [
            include_str!("../../docs/operator/node-1.toml"),
            include_str!("../../docs/operator/node-2.toml"),
            include_str!("../../docs/operator/node-3.toml"),
        ];
        let mut rpcs = Vec::new();
        for (i, text) in texts.iter().enumerate() {
            let mut c: NodeConfig = toml::from_str(text).expect("example config parses");
            assert_eq!(
                c.node_id.as_deref(),
                Some(format!("node-{}", i + 1).as_str())
            );
            assert_eq!(c.store.as_deref(), Some("s3://hearth/prod"));
            let cluster = c.cluster.as_ref().expect("[cluster]");
            assert!(cluster.gossip.is_some(), "gossip, so gossip_key is needed");
            rpcs.push(cluster.rpc.clone());
            // Every secret is a placeholder the node refuses, each with a
            // fresh value that it then accepts.
            for key in ["artifact_key", "gossip_key", "admin_token"] {
                let refused = c.check_secrets().expect_err("a placeholder is refused");
                assert!(
                    matches!(refused, NodeConfigError::ExampleSecret { key: k, .. } if k == key),
                    "{refused}"
                );
                let fresh = offered(&refused.to_string(), key);
                assert_ne!(fresh, SECRET_PLACEHOLDER);
                match key {
                    "artifact_key" => c.artifact_key = Some(fresh),
                    "gossip_key" => {
                        c.cluster.as_mut().expect("[cluster]").gossip_key = Some(fresh);
                    }
                    _ => c.admin_token = Some(fresh),
                }
            }
            c.check_secrets().expect("fresh secrets are accepted");
            let key = c.artifact_key.as_deref().expect("artifact_key");
            parse_key("artifact_key", key).expect("the offered key is 64 hex digits");
            let cluster = c.cluster.as_ref().expect("[cluster]");
            assert!(cluster.gossip_key().expect("offered gossip_key").is_some());
        }
        rpcs.dedup();
        assert_eq!(rpcs.len(), 3, "each node its own RPC address");
    }

    #[test]
    fn a_node_refuses_the_secrets_the_docs_shipped() {
        let dir = tempfile::tempdir().expect("tempdir");
        let good_key = "5d1f0c9a8b7e6d5c4b3a29181706f5e4d3c2b1a09f8e7d6c5b4a392817160504";
        let good_token = "a-long-enough-admin-token-of-32-bytes";
        // The artifact key docs/operator/*.toml shipped before.
        let shipped = "9c1f5e0b7a3d4c2e8f6a1b0d9e7c5a3f2b4d6e8a0c1e3f5a7b9d1f3e5a7c9e1b";
        let err = resolve_text(
            dir.path(),
            &format!("artifact_key = \"{shipped}\"\nadmin_token = \"{good_token}\"\n"),
        )
        .expect_err("the docs' example artifact key");
        let message = err.to_string();
        assert!(
            message.starts_with("artifact_key is an example value from hearth's documentation"),
            "{message}"
        );
        assert!(message.contains("forge precompiled artifacts"), "{message}");
        let fresh = offered(&message, "artifact_key");
        parse_key("artifact_key", &fresh).expect("a usable key is offered");
        assert_ne!(fresh, shipped);
        // Upper case is the same key.
        let err = resolve_text(
            dir.path(),
            &format!("artifact_key = \"{}\"\n", shipped.to_uppercase()),
        )
        .expect_err("the same key in upper case");
        assert!(
            matches!(err, NodeConfigError::ExampleSecret { .. }),
            "{err}"
        );
        // The gossip key the docs shipped, and their admin token.
        let err = resolve_text(
            dir.path(),
            "[cluster]\nrpc = \"127.0.0.1:7000\"\npki = \"./pki\"\ngossip = \"127.0.0.1:7001\"\n\
             gossip_key = \"3e8d1c6b2a9f4e7d0c5b8a3f6e1d4c9b7a2f5e0d3c8b6a1f4e9d2c7b5a0f3e8d\"\n",
        )
        .expect_err("the docs' example gossip key");
        assert!(
            err.to_string()
                .starts_with("[cluster] gossip_key is an example value"),
            "{err}"
        );
        let err = resolve_text(dir.path(), "admin_token = \"change-me\"\n")
            .expect_err("the docs' example token");
        assert!(
            err.to_string()
                .starts_with("admin_token is an example value"),
            "{err}"
        );

        // A 10-byte token is too short, whatever it is.
        let err = resolve_text(dir.path(), "admin_token = \"0123456789\"\n")
            .expect_err("a 10-byte token");
        let message = err.to_string();
        assert!(
            message.starts_with("admin_token is 10 bytes long; it must be at least 32 bytes"),
            "{message}"
        );
        assert!(offered(&message, "admin_token").len() >= MIN_ADMIN_TOKEN_BYTES);

        // Secrets of one's own are accepted.
        let good = resolve_text(
            dir.path(),
            &format!(
                "artifact_key = \"{good_key}\"\nadmin_token = \"{good_token}\"\n[cluster]\n\
                 rpc = \"127.0.0.1:7000\"\npki = \"./pki\"\ngossip = \"127.0.0.1:7001\"\n\
                 gossip_key = \"{good_key}\"\n"
            ),
        )
        .expect("a config with secrets of its own");
        assert_eq!(good.settings.admin_token.as_deref(), Some(good_token));
    }
}
