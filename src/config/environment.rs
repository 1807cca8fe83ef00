//! Environment variables in the config: one file for every node of a
//! cluster.
//!
//! The pods `hearth-0…N` of a Kubernetes StatefulSet can share one file (a
//! ConfigMap) when what differs between them comes from the environment:
//! `node_id` and `--node-id` may name variables (`"$HOSTNAME"`), and so may
//! the `[cluster]` `rpc` and `gossip` addresses ([`ListenAddr`],
//! `"${POD_IP}:7000"`), all expanded by [`expand_env`] when the node starts;
//! a node ID that came from a variable must be usable as a node's name. A
//! secret written as exactly one variable (`"$HEARTH_ADMIN_TOKEN"`) is
//! replaced by its value ([`NodeConfig::expand_secrets`]), so the shared file
//! names secrets kept elsewhere (a Secret). An unset variable is an error
//! naming the setting.

use std::net::SocketAddr;

use serde::Deserialize;

use super::{NodeConfig, NodeConfigError};

/// `value` with each `$NAME` or `${NAME}` replaced by that environment
/// variable, so one config file serves every pod of a StatefulSet
/// (`node_id = "$HOSTNAME"`). A `$` not followed by a name (a letter or
/// `_`, then letters, digits and `_`) is kept. An
/// unset variable is an error naming `setting`.
pub fn expand_env(setting: &'static str, value: &str) -> Result<String, NodeConfigError> {
    expand_with(setting, value, |name| std::env::var(name).ok())
}

/// [`expand_env`] with the variables from `var`.
fn expand_with(
    setting: &'static str,
    value: &str,
    var: impl Fn(&str) -> Option<String>,
) -> Result<String, NodeConfigError> {
    let is_name = |c: char| c.is_ascii_alphanumeric() || c == '_';
    let mut out = String::with_capacity(value.len());
    let mut rest = value;
    while let Some(at) = rest.find('$') {
        out.push_str(&rest[..at]);
        let after = &rest[at + 1..];
        let (name, tail) = match after.strip_prefix('{') {
            Some(braced) => match braced.find('}') {
                Some(end) => (&braced[..end], &braced[end + 1..]),
                None => ("", after),
            },
            None => {
                let end = after.find(|c| !is_name(c)).unwrap_or(after.len());
                (&after[..end], &after[end..])
            }
        };
        let starts_ok = name
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_');
        if !starts_ok || !name.chars().all(is_name) {
            out.push('$');
            rest = after;
            continue;
        }
        let v = var(name).ok_or_else(|| NodeConfigError::UnsetVariable {
            setting,
            value: value.to_string(),
            name: name.to_string(),
        })?;
        out.push_str(&v);
        rest = tail;
    }
    out.push_str(rest);
    Ok(out)
}

/// The node ID `value` of `setting` gives: variables expanded; one that
/// came from a variable (a hostname) must be usable as a node's name.
pub(super) fn node_id(setting: &'static str, value: &str) -> Result<String, NodeConfigError> {
    node_id_with(setting, value, |name| std::env::var(name).ok())
}

/// [`node_id`] with the variables from `var`.
fn node_id_with(
    setting: &'static str,
    value: &str,
    var: impl Fn(&str) -> Option<String>,
) -> Result<String, NodeConfigError> {
    let id = expand_with(setting, value, var)?;
    if id != value && hearth_sharding::tls::node_server_name(&id).is_err() {
        return Err(NodeConfigError::BadNodeId {
            setting,
            value: value.to_string(),
            id,
        });
    }
    Ok(id)
}

/// A listening address of the `[cluster]` section: `IP:PORT`, or a value
/// naming environment variables (`"${POD_IP}:7000"`) that
/// [`ServeArgs::resolve`](super::ServeArgs::resolve) expands when the node starts.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(try_from = "String")]
pub enum ListenAddr {
    /// An address.
    Addr(SocketAddr),
    /// A value with variables, not yet expanded.
    Template(String),
}

impl TryFrom<String> for ListenAddr {
    type Error = String;

    fn try_from(s: String) -> Result<Self, String> {
        if s.contains('$') {
            return Ok(Self::Template(s));
        }
        s.parse()
            .map(Self::Addr)
            .map_err(|_| format!("{s:?} is not an IP:PORT address"))
    }
}

impl From<SocketAddr> for ListenAddr {
    fn from(addr: SocketAddr) -> Self {
        Self::Addr(addr)
    }
}

impl std::fmt::Display for ListenAddr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Addr(a) => write!(f, "{a}"),
            Self::Template(t) => f.write_str(t),
        }
    }
}

impl ListenAddr {
    /// The address; for a template, its variables expanded (an error names
    /// `setting`).
    pub fn addr(&self, setting: &'static str) -> Result<SocketAddr, NodeConfigError> {
        let template = match self {
            Self::Addr(a) => return Ok(*a),
            Self::Template(t) => t,
        };
        let expanded = expand_env(setting, template)?;
        expanded.parse().map_err(|_| NodeConfigError::BadAddress {
            setting,
            value: template.clone(),
            expanded,
        })
    }

    /// Expands a template in place.
    pub(super) fn expand(&mut self, setting: &'static str) -> Result<(), NodeConfigError> {
        *self = Self::Addr(self.addr(setting)?);
        Ok(())
    }
}

impl NodeConfig {
    /// Replaces each secret (`artifact_key`, `admin_token`, `[cluster]
    /// gossip_key`) written as one environment variable (`"$HEARTH_ADMIN_TOKEN"`
    /// or `"${HEARTH_ADMIN_TOKEN}"`) by its value, so a config shared by
    /// many nodes (a Kubernetes ConfigMap) names secrets kept elsewhere (a
    /// Secret). Any other value is a secret itself, `$` and all.
    pub fn expand_secrets(&mut self) -> Result<(), NodeConfigError> {
        let gossip_key = self.cluster.as_mut().map(|c| &mut c.gossip_key);
        for (setting, value) in [
            ("artifact_key", Some(&mut self.artifact_key)),
            ("admin_token", Some(&mut self.admin_token)),
            ("[cluster] gossip_key", gossip_key),
        ] {
            let Some(Some(v)) = value else { continue };
            let name = v
                .strip_prefix("${")
                .and_then(|n| n.strip_suffix('}'))
                .or_else(|| v.strip_prefix('$'));
            if let Some(name) = name
                && !name.is_empty()
                && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
            {
                *v = expand_env(setting, v)?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use hearth_sharding::membership::PeerAddr;

    use super::*;

    #[test]
    fn variables_in_node_ids_and_addresses_are_expanded_and_checked() {
        let env = |name: &str| match name {
            "HOSTNAME" => Some("hearth-2".to_string()),
            "POD_IP" => Some("10.1.2.3".to_string()),
            "BAD" => Some("Not A Node".to_string()),
            _ => None,
        };
        let x = |v: &str| expand_with("node_id", v, env);
        assert_eq!(x("$HOSTNAME").expect("set"), "hearth-2");
        assert_eq!(x("${POD_IP}:7000").expect("set"), "10.1.2.3:7000");
        assert_eq!(x("n-$HOSTNAME.x").expect("set"), "n-hearth-2.x");
        assert_eq!(x("no variables").expect("plain"), "no variables");
        assert_eq!(x("cost: $5 and $").expect("a lone $"), "cost: $5 and $");
        let unset = x("$NOPE").expect_err("unset");
        assert_eq!(
            unset.to_string(),
            "node_id = \"$NOPE\" names the environment variable NOPE, which is not set \
             (export it, e.g. `export NOPE`, or write the value itself)"
        );
        // A hostname is checked as a node name; a literal ID is taken as is.
        let checked = |v: &str| node_id_with("node_id", v, env);
        assert!(matches!(
            checked("$BAD"),
            Err(NodeConfigError::BadNodeId { .. })
        ));
        assert_eq!(checked("$HOSTNAME").expect("a pod name"), "hearth-2");

        // Secrets: a value that is one variable names it; any other value
        // is the secret itself, `$` and all.
        let dir = env!("CARGO_MANIFEST_DIR");
        let mut c: NodeConfig = toml::from_str(
            "artifact_key = \"${CARGO_MANIFEST_DIR}\"\nadmin_token = \"$CARGO_MANIFEST_DIR\"\n\
             [cluster]\nrpc = \"1.2.3.4:1\"\npki = \"p\"\ngossip_key = \"a$b${c}\"\n",
        )
        .expect("secrets naming variables");
        c.expand_secrets().expect("set variables");
        assert_eq!(c.artifact_key.as_deref(), Some(dir));
        assert_eq!(c.admin_token.as_deref(), Some(dir));
        let cluster = c.cluster.as_ref().expect("[cluster]");
        assert_eq!(cluster.gossip_key.as_deref(), Some("a$b${c}"));
        let mut c: NodeConfig =
            toml::from_str("admin_token = \"$HEARTH_TEST_NEVER_SET\"\n").expect("config");
        assert!(matches!(
            c.expand_secrets(),
            Err(NodeConfigError::UnsetVariable {
                setting: "admin_token",
                ..
            })
        ));

        // Addresses: templates wait for the node to start; literals are
        // checked when the file is read.
        let c: NodeConfig = toml::from_str(
            "[cluster]\nrpc = \"${POD_IP}:7000\"\ngossip = \"127.0.0.1:7001\"\npki = \"p\"\n\
             seeds = [\"hearth.default.svc.cluster.local:7001\", \"10.0.0.9:7001\"]\n\
             nodes = [{ id = \"hearth-0\", rpc = \"hearth-0.hearth:7000\" }]\n",
        )
        .expect("config with names and variables");
        let cluster = c.cluster.expect("[cluster]");
        assert_eq!(cluster.rpc, ListenAddr::Template("${POD_IP}:7000".into()));
        assert_eq!(
            cluster.seeds,
            vec![
                PeerAddr::Name {
                    host: "hearth.default.svc.cluster.local".into(),
                    port: 7001
                },
                PeerAddr::Ip("10.0.0.9:7001".parse().expect("addr")),
            ]
        );
        assert!(cluster.nodes[0].rpc.is_name());
        for bad in [
            "[cluster]\nrpc = \"localhost\"\npki = \"p\"\n",
            "[cluster]\nrpc = \"1.2.3.4:1\"\npki = \"p\"\nseeds = [\"no port\"]\n",
            "[cluster]\nrpc = \"1.2.3.4:1\"\npki = \"p\"\nseeds = [\"a..b:1\"]\n",
        ] {
            assert!(toml::from_str::<NodeConfig>(bad).is_err(), "{bad}");
        }
    }
}
