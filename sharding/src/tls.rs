//! Mutual TLS between the nodes of a cluster.
//!
//! Inter-node RPC hands out capabilities that run Workers, so only cluster
//! members may call it. Every node holds a certificate signed by the
//! cluster's CA and presents it both as a server and as a client; each side
//! requires the other's certificate to chain to that CA. A peer without one
//! fails the TLS handshake and never reaches the Cap'n Proto bootstrap, so it
//! gets no capability at all.
//!
//! A node's certificate is bound to its node ID: it carries the DNS name
//! `<node-id>.node.hearth.cluster` ([`node_server_name`]), and a client
//! dialing the home the ring names verifies exactly that name. So a member
//! holding a valid cluster certificate for node `c` cannot answer for node
//! `b`, whatever address gossip or a stale ring points at: the handshake
//! fails and the request is served locally. The same check admits a member
//! to the ring when it is heard by gossip (see `membership`). The server
//! side asks only "is this a member of my cluster": any member may forward.
//! The node ID is also the certificate's common name, for logs.
//!
//! For development, [`generate_dev_pki`] makes a CA and node certificates in
//! a directory as PEM files (what `hearth cluster` calls), and
//! [`NodeTls::load`] reads one node's files back:
//!
//! ```text
//! <dir>/ca.pem            cluster CA certificate
//! <dir>/ca-key.pem        cluster CA private key (needed only to issue certs)
//! <dir>/<node>.pem        node certificate
//! <dir>/<node>-key.pem    node private key
//! ```
//!
//! TLS runs on rustls with the `ring` provider (no C build), TLS 1.3 only.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::server::WebPkiClientVerifier;
use rustls::{ClientConfig, RootCertStore, ServerConfig};

/// The DNS suffix of every node certificate's name: node `b`'s certificate
/// is for `b.node.hearth.cluster`.
pub const NODE_NAME_SUFFIX: &str = "node.hearth.cluster";
/// File name of the cluster CA certificate.
pub const CA_CERT_FILE: &str = "ca.pem";
/// File name of the cluster CA private key.
pub const CA_KEY_FILE: &str = "ca-key.pem";

const CA_COMMON_NAME: &str = "hearth development cluster CA";
const ORGANIZATION: &str = "hearth";
const CA_VALID_DAYS: i64 = 3650;
const NODE_VALID_DAYS: i64 = 825;

/// Why certificates could not be made, loaded or used.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A file could not be read or written.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: io::Error,
    },
    /// A PEM file holds no usable certificate or key.
    #[error("{}: {reason}", path.display())]
    Pem {
        /// The file (or a description of the in-memory input).
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// A node name that cannot name a certificate file or a DNS name.
    #[error(
        "invalid node name {0:?}: use 1-63 of a-z 0-9 _ - (dot-separated labels allowed; \
         no uppercase, no label starting or ending with '-')"
    )]
    InvalidNodeName(String),
    /// A node certificate that does not prove the node's ID: from another
    /// CA, expired, or made before certificates were bound to node IDs.
    #[error(
        "{}: not a cluster certificate for node {node:?} ({reason}); \
         re-issue it with `hearth pki --dir DIR {node}`",
        path.display()
    )]
    NotForNode {
        /// The certificate file.
        path: PathBuf,
        /// The node it should be for.
        node: String,
        /// What the verifier said.
        reason: String,
    },
    /// Certificate generation failed.
    #[error("generating a certificate: {0}")]
    Generate(#[from] rcgen::Error),
    /// rustls rejected the certificates or key.
    #[error("TLS configuration: {0}")]
    Rustls(#[from] rustls::Error),
    /// The client-certificate verifier could not be built.
    #[error("client certificate verifier: {0}")]
    Verifier(String),
}

/// Paths of one node's certificate and key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeCertPaths {
    /// The node certificate (PEM).
    pub cert: PathBuf,
    /// The node private key (PEM).
    pub key: PathBuf,
}

/// Where `node_name`'s files live in `dir`.
pub fn node_cert_paths(dir: &Path, node_name: &str) -> Result<NodeCertPaths, TlsError> {
    check_node_name(node_name)?;
    Ok(NodeCertPaths {
        cert: dir.join(format!("{node_name}.pem")),
        key: dir.join(format!("{node_name}-key.pem")),
    })
}

/// A node name must be usable as a file name and as the first labels of
/// the node's certificate name. Uppercase is refused because certificate
/// names match case-insensitively: `A` could answer for `a`.
fn check_node_name(name: &str) -> Result<(), TlsError> {
    let label_ok = |label: &str| {
        !label.is_empty()
            && !label.starts_with('-')
            && !label.ends_with('-')
            && label
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, '_' | '-'))
    };
    let ok = name.len() <= 63
        && name.split('.').all(label_ok)
        && rustls::pki_types::DnsName::try_from(node_dns_name(name)).is_ok();
    if ok {
        Ok(())
    } else {
        Err(TlsError::InvalidNodeName(name.to_string()))
    }
}

fn node_dns_name(node_name: &str) -> String {
    format!("{node_name}.{NODE_NAME_SUFFIX}")
}

/// The name a client verifies on the certificate of the node called
/// `node_name`: `<node_name>.node.hearth.cluster`.
pub fn node_server_name(node_name: &str) -> Result<ServerName<'static>, TlsError> {
    check_node_name(node_name)?;
    rustls::pki_types::DnsName::try_from(node_dns_name(node_name))
        .map(ServerName::DnsName)
        .map_err(|_| TlsError::InvalidNodeName(node_name.to_string()))
}

/// Makes a development cluster in `dir` (created if missing): a CA, unless
/// `dir` already has one, and a certificate for each of `node_names`.
pub fn generate_dev_pki(dir: &Path, node_names: &[&str]) -> Result<(), TlsError> {
    for name in node_names {
        check_node_name(name)?;
    }
    if !dir.join(CA_CERT_FILE).exists() {
        generate_dev_ca(dir)?;
    }
    for name in node_names {
        issue_node_cert(dir, name)?;
    }
    Ok(())
}

/// Makes a new cluster CA in `dir` (created if missing), replacing any CA
/// there. Certificates issued by a replaced CA stop being trusted.
pub fn generate_dev_ca(dir: &Path) -> Result<(), TlsError> {
    fs::create_dir_all(dir).map_err(|source| TlsError::Io {
        path: dir.to_path_buf(),
        source,
    })?;
    let key = KeyPair::generate()?;
    let cert = ca_params()?.self_signed(&key)?;
    write_file(&dir.join(CA_CERT_FILE), cert.pem().as_bytes(), false)?;
    write_file(&dir.join(CA_KEY_FILE), key.serialize_pem().as_bytes(), true)?;
    Ok(())
}

/// Issues (or re-issues) `node_name`'s certificate, signed by the CA in `dir`
/// (which must have been made by [`generate_dev_ca`]).
pub fn issue_node_cert(dir: &Path, node_name: &str) -> Result<NodeCertPaths, TlsError> {
    let paths = node_cert_paths(dir, node_name)?;
    let ca_key_path = dir.join(CA_KEY_FILE);
    let ca_key_pem = read_file(&ca_key_path)?;
    let ca_key_pem = String::from_utf8(ca_key_pem).map_err(|_| TlsError::Pem {
        path: ca_key_path.clone(),
        reason: "not UTF-8 PEM".into(),
    })?;
    let ca_key = KeyPair::from_pem(&ca_key_pem).map_err(|e| TlsError::Pem {
        path: ca_key_path,
        reason: e.to_string(),
    })?;
    // The issuer is rebuilt from the CA's key and its (fixed) subject: that
    // is all signing needs, and it avoids parsing the CA certificate.
    let issuer = Issuer::new(ca_params()?, ca_key);

    let mut params = CertificateParams::new(vec![node_dns_name(node_name)])?;
    params
        .distinguished_name
        .push(DnType::CommonName, node_name);
    params
        .distinguished_name
        .push(DnType::OrganizationName, ORGANIZATION);
    params.use_authority_key_identifier_extension = true;
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages = vec![
        ExtendedKeyUsagePurpose::ServerAuth,
        ExtendedKeyUsagePurpose::ClientAuth,
    ];
    let (not_before, not_after) = validity(NODE_VALID_DAYS);
    params.not_before = not_before;
    params.not_after = not_after;
    let key = KeyPair::generate()?;
    let cert = params.signed_by(&key, &issuer)?;
    write_file(&paths.cert, cert.pem().as_bytes(), false)?;
    write_file(&paths.key, key.serialize_pem().as_bytes(), true)?;
    Ok(paths)
}

fn ca_params() -> Result<CertificateParams, TlsError> {
    let mut params = CertificateParams::new(Vec::<String>::new())?;
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params
        .distinguished_name
        .push(DnType::CommonName, CA_COMMON_NAME);
    params
        .distinguished_name
        .push(DnType::OrganizationName, ORGANIZATION);
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let (not_before, not_after) = validity(CA_VALID_DAYS);
    params.not_before = not_before;
    params.not_after = not_after;
    Ok(params)
}

fn validity(days: i64) -> (time::OffsetDateTime, time::OffsetDateTime) {
    let now = time::OffsetDateTime::now_utc();
    // A day of slack for clocks that disagree a little.
    (
        now - time::Duration::days(1),
        now + time::Duration::days(days),
    )
}

fn read_file(path: &Path) -> Result<Vec<u8>, TlsError> {
    fs::read(path).map_err(|source| TlsError::Io {
        path: path.to_path_buf(),
        source,
    })
}

fn write_file(path: &Path, contents: &[u8], secret: bool) -> Result<(), TlsError> {
    let io_err = |source| TlsError::Io {
        path: path.to_path_buf(),
        source,
    };
    let mut options = fs::OpenOptions::new();
    options.write(true).create(true).truncate(true);
    #[cfg(unix)]
    if secret {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(0o600);
    }
    #[cfg(not(unix))]
    let _ = secret;
    let mut file = options.open(path).map_err(io_err)?;
    io::Write::write_all(&mut file, contents).map_err(io_err)
}

/// One node's TLS configuration for inter-node RPC: a server side that
/// requires a client certificate from the cluster CA, and a client side that
/// presents the node's certificate and trusts only the cluster CA.
#[derive(Clone)]
pub struct NodeTls {
    server: Arc<ServerConfig>,
    client: Arc<ClientConfig>,
}

impl std::fmt::Debug for NodeTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeTls").finish_non_exhaustive()
    }
}

impl NodeTls {
    /// Loads `node_name`'s certificate and key and the cluster CA from `dir`
    /// (the layout [`generate_dev_pki`] writes). Fails with
    /// [`TlsError::NotForNode`] if the certificate would not prove
    /// `node_name` to a peer, so a node whose forwards would all fail the
    /// handshake says so at start instead of silently serving locally.
    pub fn load(dir: &Path, node_name: &str) -> Result<Self, TlsError> {
        let paths = node_cert_paths(dir, node_name)?;
        let ca_path = dir.join(CA_CERT_FILE);
        let ca = read_file(&ca_path)?;
        let cert = read_file(&paths.cert)?;
        let key = read_file(&paths.key)?;
        let ca = parse_certs(&ca, &ca_path)?;
        let chain = parse_certs(&cert, &paths.cert)?;
        let key = parse_key(&key, &paths.key)?;
        check_cert_is_for(&ca, &chain, node_name, &paths.cert)?;
        Self::from_parts(ca, chain, key)
    }

    /// Builds the configuration from PEM text: the cluster CA certificate(s),
    /// the node's certificate chain and its private key.
    pub fn from_pem(ca_pem: &[u8], cert_pem: &[u8], key_pem: &[u8]) -> Result<Self, TlsError> {
        let ca = parse_certs(ca_pem, Path::new("<CA PEM>"))?;
        let chain = parse_certs(cert_pem, Path::new("<certificate PEM>"))?;
        let key = parse_key(key_pem, Path::new("<key PEM>"))?;
        Self::from_parts(ca, chain, key)
    }

    fn from_parts(
        ca: Vec<CertificateDer<'static>>,
        chain: Vec<CertificateDer<'static>>,
        key: PrivateKeyDer<'static>,
    ) -> Result<Self, TlsError> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut roots = RootCertStore::empty();
        for cert in ca {
            roots.add(cert)?;
        }
        let roots = Arc::new(roots);
        // Built this way the verifier rejects a client without a certificate.
        let verifier = WebPkiClientVerifier::builder_with_provider(roots.clone(), provider.clone())
            .build()
            .map_err(|e| TlsError::Verifier(e.to_string()))?;
        let server = ServerConfig::builder_with_provider(provider.clone())
            .with_protocol_versions(&[&rustls::version::TLS13])?
            .with_client_cert_verifier(verifier)
            .with_single_cert(chain.clone(), key.clone_key())?;
        let client = ClientConfig::builder_with_provider(provider)
            .with_protocol_versions(&[&rustls::version::TLS13])?
            .with_root_certificates(roots)
            .with_client_auth_cert(chain, key)?;
        Ok(NodeTls {
            server: Arc::new(server),
            client: Arc::new(client),
        })
    }

    /// The server side: requires a client certificate from the cluster CA.
    pub fn server_config(&self) -> Arc<ServerConfig> {
        self.server.clone()
    }

    /// The client side: presents this node's certificate, trusts only the
    /// cluster CA.
    pub fn client_config(&self) -> Arc<ClientConfig> {
        self.client.clone()
    }
}

/// Verifies `chain` as a peer would when dialing `node_name`.
fn check_cert_is_for(
    ca: &[CertificateDer<'static>],
    chain: &[CertificateDer<'static>],
    node_name: &str,
    path: &Path,
) -> Result<(), TlsError> {
    let mut roots = RootCertStore::empty();
    for cert in ca {
        roots.add(cert.clone())?;
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    use rustls::client::danger::ServerCertVerifier;
    let verifier =
        rustls::client::WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider)
            .build()
            .map_err(|e| TlsError::Verifier(e.to_string()))?;
    let not_for_node = |reason: String| TlsError::NotForNode {
        path: path.to_path_buf(),
        node: node_name.to_string(),
        reason,
    };
    let (end_entity, intermediates) = chain
        .split_first()
        .ok_or_else(|| not_for_node("no certificate".into()))?;
    verifier
        .verify_server_cert(
            end_entity,
            intermediates,
            &node_server_name(node_name)?,
            &[],
            rustls::pki_types::UnixTime::now(),
        )
        .map(|_| ())
        .map_err(|e| not_for_node(e.to_string()))
}

fn parse_certs(pem: &[u8], path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| TlsError::Pem {
            path: path.to_path_buf(),
            reason: e.to_string(),
        })?;
    if certs.is_empty() {
        return Err(TlsError::Pem {
            path: path.to_path_buf(),
            reason: "no certificate in file".into(),
        });
    }
    Ok(certs)
}

fn parse_key(pem: &[u8], path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    PrivateKeyDer::from_pem_slice(pem).map_err(|e| TlsError::Pem {
        path: path.to_path_buf(),
        reason: e.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dev_pki_is_written_and_loads() {
        let dir = tempfile::tempdir().unwrap();
        generate_dev_pki(dir.path(), &["node-1", "node-2"]).unwrap();
        for f in [
            CA_CERT_FILE,
            CA_KEY_FILE,
            "node-1.pem",
            "node-1-key.pem",
            "node-2.pem",
        ] {
            assert!(dir.path().join(f).exists(), "{f} missing");
        }
        NodeTls::load(dir.path(), "node-1").unwrap();
        NodeTls::load(dir.path(), "node-2").unwrap();
        // Adding a node later reuses the CA.
        let ca_before = fs::read(dir.path().join(CA_CERT_FILE)).unwrap();
        generate_dev_pki(dir.path(), &["node-3"]).unwrap();
        assert_eq!(fs::read(dir.path().join(CA_CERT_FILE)).unwrap(), ca_before);
        NodeTls::load(dir.path(), "node-3").unwrap();
    }

    #[cfg(unix)]
    #[test]
    fn private_keys_are_private() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        generate_dev_pki(dir.path(), &["n"]).unwrap();
        for f in [CA_KEY_FILE, "n-key.pem"] {
            let mode = fs::metadata(dir.path().join(f))
                .unwrap()
                .permissions()
                .mode();
            assert_eq!(mode & 0o077, 0, "{f} is readable by others");
        }
    }

    #[test]
    fn node_names_cannot_escape_the_directory() {
        let dir = tempfile::tempdir().unwrap();
        for bad in ["", "../x", "a/b", ".hidden", "x".repeat(64).as_str()] {
            assert!(matches!(
                generate_dev_pki(dir.path(), &[bad]),
                Err(TlsError::InvalidNodeName(_))
            ));
        }
    }

    #[test]
    fn node_names_must_be_dns_safe_and_lowercase() {
        for bad in ["A", "node-A", "a..b", "a.", "-a", "a-", "a.-b", "a b", "é"] {
            assert!(
                matches!(node_server_name(bad), Err(TlsError::InvalidNodeName(_))),
                "{bad:?} accepted"
            );
        }
        for good in ["a", "node-1", "eu_west", "rack-3.node-7", &"x".repeat(63)] {
            assert!(node_server_name(good).is_ok(), "{good:?} refused");
        }
    }

    /// The binding a forward relies on: `b`'s certificate verifies as `b`
    /// and as nobody else, and a node refuses to load a certificate that
    /// is not its own.
    #[test]
    fn a_node_certificate_proves_its_own_node_id_only() {
        let dir = tempfile::tempdir().unwrap();
        generate_dev_pki(dir.path(), &["b", "node_2"]).unwrap();
        let ca = parse_certs(
            &fs::read(dir.path().join(CA_CERT_FILE)).unwrap(),
            dir.path(),
        )
        .unwrap();
        let proves = |holder: &str, claimed: &str| {
            let path = dir.path().join(format!("{holder}.pem"));
            let chain = parse_certs(&fs::read(&path).unwrap(), &path).unwrap();
            check_cert_is_for(&ca, &chain, claimed, &path).is_ok()
        };
        assert!(proves("b", "b"));
        assert!(proves("node_2", "node_2"));
        assert!(!proves("b", "node_2"));
        assert!(!proves("node_2", "b"));

        // b's files renamed to c's: c will not start with them.
        for (from, to) in [("b.pem", "c.pem"), ("b-key.pem", "c-key.pem")] {
            fs::copy(dir.path().join(from), dir.path().join(to)).unwrap();
        }
        let err = NodeTls::load(dir.path(), "c").unwrap_err();
        assert!(matches!(err, TlsError::NotForNode { .. }), "{err}");
        assert!(err.to_string().contains("hearth pki --dir DIR c"), "{err}");
    }

    #[test]
    fn missing_or_garbage_files_are_typed_errors() {
        let dir = tempfile::tempdir().unwrap();
        assert!(matches!(
            NodeTls::load(dir.path(), "n"),
            Err(TlsError::Io { .. })
        ));
        assert!(matches!(
            NodeTls::from_pem(b"nope", b"nope", b"nope"),
            Err(TlsError::Pem { .. })
        ));
    }
}
