//! `hearth serve`'s flags, and the one config they resolve to with the file.
//!
//! A flag ([`ServeArgs`]) overrides the same setting of the `--config`
//! file; what neither gives takes its default ([`DEFAULT_LISTEN`],
//! [`DEFAULT_ADMIN`], [`DEFAULT_STORE`], [`DEFAULT_NODE_ID`]).
//! [`ServeArgs::resolve`] does it all in one step, before anything starts:
//! it loads the file, expands the environment variables it names, refuses
//! unusable secrets, reads the extra egress roots, checks that certificates
//! come in pairs with a listener to use them, and returns the
//! [`ServeConfig`] the node runs with, the file's other settings in it.

use std::net::SocketAddr;
use std::path::PathBuf;

use super::environment::node_id;
use super::{NodeConfig, NodeConfigError};

/// Where `hearth serve` takes Worker traffic unless told otherwise.
pub const DEFAULT_LISTEN: SocketAddr =
    SocketAddr::new(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST), 8080);
/// Where `hearth serve` answers the admin API unless told otherwise.
pub const DEFAULT_ADMIN: SocketAddr =
    SocketAddr::new(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST), 8081);
/// The script store of `hearth serve` unless told otherwise.
pub const DEFAULT_STORE: &str = "hearth-store";
/// The node ID of `hearth serve` unless told otherwise.
pub const DEFAULT_NODE_ID: &str = "node-1";

/// `hearth serve`'s flags. Each overrides the same setting of the
/// `--config` file; [`ServeArgs::resolve`] makes the one [`ServeConfig`]
/// the node runs with.
#[derive(Debug, Default, Clone, clap::Args)]
pub struct ServeArgs {
    /// This node's ID on the ring (and the name of its cluster
    /// certificate); overrides the config's node_id, e.g.
    /// `--node-id "$(hostname)"`.
    #[arg(long)]
    pub node_id: Option<String>,
    /// Address for Worker traffic (routed by the first label of Host).
    #[arg(long)]
    pub listen: Option<SocketAddr>,
    /// Address of the admin API (deploys, stats, /metrics).
    #[arg(long)]
    pub admin: Option<SocketAddr>,
    /// Script store: a directory, or s3://bucket/prefix (with the
    /// config's `[s3]` section or the AWS_* environment variables).
    #[arg(long)]
    pub store: Option<String>,
    /// Address for HTTPS Worker traffic (HTTP/2 or HTTP/1.1 by ALPN).
    /// A ClientHello's SNI starts warming the Worker it names.
    #[arg(long)]
    pub tls_listen: Option<SocketAddr>,
    /// PEM certificate chain for --tls-listen (leaf first); without
    /// it, a development certificate for localhost and *.localhost is
    /// made in the store.
    #[arg(long, requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// PEM private key for --tls-cert.
    #[arg(long, requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// PEM certificate chain (leaf first) to serve the admin API over
    /// HTTPS with, e.g. this node's certificate from `hearth pki`;
    /// without it the admin API is plain HTTP.
    #[arg(long, requires = "admin_tls_key")]
    pub admin_tls_cert: Option<PathBuf>,
    /// PEM private key for --admin-tls-cert.
    #[arg(long, requires = "admin_tls_cert")]
    pub admin_tls_key: Option<PathBuf>,
    /// Do not prewarm Workers from the TLS ClientHello's SNI.
    #[arg(long)]
    pub no_sni_prewarm: bool,
    /// TOML config file (flags override it).
    #[arg(long)]
    pub config: Option<PathBuf>,
}

/// What `hearth serve` runs with: the file and the flags resolved in one
/// step, every default filled in and every pairing checked.
#[derive(Debug)]
pub struct ServeConfig {
    /// The node's ID on the ring (default [`DEFAULT_NODE_ID`]).
    pub node_id: String,
    /// Worker traffic (default [`DEFAULT_LISTEN`]).
    pub listen: SocketAddr,
    /// The admin API (default [`DEFAULT_ADMIN`]).
    pub admin: SocketAddr,
    /// The script store: a directory or `s3://bucket/prefix` (default
    /// [`DEFAULT_STORE`]).
    pub store: String,
    /// The HTTPS front door, if any.
    pub tls: Option<TlsConfig>,
    /// The admin API's certificate chain and key (PEM files): it serves
    /// HTTPS only, if given; plain HTTP otherwise.
    pub admin_tls: Option<(PathBuf, PathBuf)>,
    /// The file's other settings, with the flags' over them: runtime and
    /// client limits, prewarm, cluster, S3, admin token. The settings
    /// resolved into the fields above are taken out of it.
    pub settings: NodeConfig,
}

/// The HTTPS front door of [`ServeConfig`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsConfig {
    /// Its address.
    pub listen: SocketAddr,
    /// Certificate chain and private key (PEM files); `None`: a development
    /// certificate for `localhost` and `*.localhost`, made in the store.
    pub cert: Option<(PathBuf, PathBuf)>,
}

impl ServeArgs {
    /// Loads `--config` (if given), lays the flags over it and fills in
    /// the defaults: the one config `hearth serve` runs with.
    pub fn resolve(self) -> Result<ServeConfig, NodeConfigError> {
        let mut file = match &self.config {
            Some(path) => NodeConfig::load(path)?,
            None => NodeConfig::default(),
        };
        file.expand_secrets()?;
        file.check_secrets()?;
        file.egress.load_roots()?;
        file.objects.check()?;
        let node_id = match self.node_id {
            Some(id) => node_id("--node-id", &id)?,
            None => match file.node_id.take() {
                Some(id) => node_id("node_id", &id)?,
                None => DEFAULT_NODE_ID.into(),
            },
        };
        if let Some(c) = file.cluster.as_mut() {
            c.rpc.expand("[cluster] rpc")?;
            if let Some(g) = c.gossip.as_mut() {
                g.expand("[cluster] gossip")?;
            }
            if let Some(a) = c.gossip_advertise.as_mut() {
                a.expand("[cluster] gossip_advertise")?;
            }
        }
        if self.no_sni_prewarm {
            file.sni_prewarm = Some(false);
        }
        // A certificate given by flags replaces the file's pair whole.
        let (cert, key) = match self.tls_cert {
            Some(cert) => (Some(cert), self.tls_key),
            None => (file.tls_cert.take(), file.tls_key.take()),
        };
        let tls = match (self.tls_listen.or(file.tls_listen.take()), cert, key) {
            (None, None, None) => None,
            (None, _, _) => return Err(NodeConfigError::TlsWithoutListen),
            (Some(listen), None, None) => Some(TlsConfig { listen, cert: None }),
            (Some(listen), Some(cert), Some(key)) => Some(TlsConfig {
                listen,
                cert: Some((cert, key)),
            }),
            (Some(_), _, _) => return Err(NodeConfigError::TlsHalfPair),
        };
        let admin_tls = match self.admin_tls_cert {
            Some(cert) => (Some(cert), self.admin_tls_key),
            None => (file.admin_tls_cert.take(), file.admin_tls_key.take()),
        };
        let admin_tls = match admin_tls {
            (None, None) => None,
            (Some(cert), Some(key)) => Some((cert, key)),
            _ => return Err(NodeConfigError::AdminTlsHalfPair),
        };
        Ok(ServeConfig {
            admin_tls,
            node_id,
            listen: self.listen.or(file.listen.take()).unwrap_or(DEFAULT_LISTEN),
            admin: self.admin.or(file.admin.take()).unwrap_or(DEFAULT_ADMIN),
            store: self
                .store
                .or(file.store.take())
                .unwrap_or_else(|| DEFAULT_STORE.into()),
            tls,
            settings: file,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::test_support::args;

    #[test]
    fn serve_config_takes_defaults_then_the_file_then_the_flags() {
        let bare = args(None).resolve().expect("no file, no flags");
        assert_eq!(
            (
                bare.node_id.as_str(),
                bare.listen,
                bare.admin,
                bare.store.as_str()
            ),
            (
                DEFAULT_NODE_ID,
                DEFAULT_LISTEN,
                DEFAULT_ADMIN,
                DEFAULT_STORE
            )
        );
        assert_eq!(bare.tls, None);

        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("node.toml");
        std::fs::write(
            &path,
            "node_id = \"n7\"\nlisten = \"127.0.0.1:9080\"\nadmin = \"127.0.0.1:9081\"\n\
             store = \"./s\"\ntls_listen = \"127.0.0.1:9443\"\ntls_cert = \"c.pem\"\n\
             tls_key = \"k.pem\"\nmax_prewarms = 2\n",
        )
        .expect("write config");
        let file = args(Some(&path)).resolve().expect("file");
        assert_eq!(file.node_id, "n7");
        assert_eq!(file.listen.port(), 9080);
        assert_eq!(file.admin.port(), 9081);
        assert_eq!(file.store, "./s");
        let tls = file.tls.expect("tls from the file");
        assert_eq!(tls.listen.port(), 9443);
        assert_eq!(tls.cert, Some(("c.pem".into(), "k.pem".into())));
        assert!(file.settings.prewarm().enabled);
        assert_eq!(file.settings.prewarm().max_concurrent, 2);

        let flags = ServeArgs {
            listen: Some("127.0.0.1:1080".parse().expect("addr")),
            store: Some("s3://b/p".into()),
            tls_cert: Some("flag.pem".into()),
            tls_key: Some("flag-key.pem".into()),
            no_sni_prewarm: true,
            ..args(Some(&path))
        }
        .resolve()
        .expect("flags over the file");
        assert_eq!(flags.listen.port(), 1080, "a flag wins");
        assert_eq!(flags.admin.port(), 9081, "the file fills what flags leave");
        assert_eq!(flags.store, "s3://b/p");
        let tls = flags.tls.expect("tls");
        assert_eq!(tls.listen.port(), 9443);
        assert_eq!(tls.cert, Some(("flag.pem".into(), "flag-key.pem".into())));
        assert!(!flags.settings.prewarm().enabled, "--no-sni-prewarm");
    }

    #[test]
    fn serve_config_refuses_a_certificate_it_cannot_use() {
        let dir = tempfile::tempdir().expect("tempdir");
        let resolve = |text: &str| {
            let path = dir.path().join("node.toml");
            std::fs::write(&path, text).expect("write config");
            args(Some(&path)).resolve()
        };
        assert!(matches!(
            resolve("tls_cert = \"c.pem\"\ntls_key = \"k.pem\"\n"),
            Err(NodeConfigError::TlsWithoutListen)
        ));
        assert!(matches!(
            resolve("tls_listen = \"127.0.0.1:9443\"\ntls_cert = \"c.pem\"\n"),
            Err(NodeConfigError::TlsHalfPair)
        ));
        let dev = resolve("tls_listen = \"127.0.0.1:9443\"\n").expect("dev certificate");
        assert_eq!(dev.tls.expect("tls").cert, None);
        let bad = resolve("listen = 8080\n").expect_err("not an address");
        assert!(matches!(bad, NodeConfigError::Parse { .. }));
        assert!(bad.to_string().starts_with("invalid config "), "{bad}");
        let missing = args(Some(&dir.path().join("nope.toml")))
            .resolve()
            .expect_err("no such file");
        assert!(
            missing.to_string().starts_with("cannot read config "),
            "{missing}"
        );
    }
}
