//! The HTTPS front door: TLS 1.3 and 1.2 (rustls), ALPN `h2` and
//! `http/1.1`, and the ClientHello's SNI handed to the prewarm before the
//! handshake goes on.
//!
//! # The model
//!
//! A connection's first flight is its ClientHello. The front door reads it
//! whole ([`tokio_rustls::LazyConfigAcceptor`]), passes the server name it
//! carries to a callback (the node turns it into a prewarm, see
//! [`crate::prewarm`]: that callback only spawns, so the handshake is not
//! delayed), then completes the handshake and serves HTTP/2 if the client
//! chose `h2` by ALPN, HTTP/1.1 otherwise. Requests are routed by their Host
//! (`:authority` in HTTP/2) as on the plain listener; a request whose Host
//! names another Worker than the SNI goes to that Worker and does not use
//! the prewarm.
//!
//! # Certificates
//!
//! [`TlsFrontDoor::from_pem`] serves a certificate chain and key the operator
//! gives (`--tls-cert`, `--tls-key`). Without them, [`TlsFrontDoor::dev`]
//! serves development certificates signed by a development CA that is made
//! once into `<store>/tls/` and reused. Certificate checkers (rustls'
//! webpki, OpenSSL) do not let a wildcard stand for a name under a single
//! label such as `localhost`, so `*.localhost` would not cover
//! `hello.localhost`; instead, the front door issues a certificate for the
//! exact name a ClientHello asks for when it is `<label>.localhost`
//! (remembered for the last [`DEV_CERT_CACHE`] names; an issue costs one
//! signature). Any other name, or none, gets the certificate for
//! `localhost`. (The default leaf names no `*.localhost`: it would cover
//! nothing, and webpki refuses a wildcard under the CA's name constraint
//! below as a malformed name.)
//!
//! Whoever trusts the development CA trusts it for `localhost` and the names
//! under it only: the CA carries an X.509 name constraint (permitted DNS
//! subtree `localhost`), so a certificate it signed for any other name is
//! refused by the client even if the CA's key leaks from the store; and it
//! lives [`DEV_CA_DAYS`] days, its leaves [`DEV_LEAF_DAYS`]. A CA made
//! before this rule has neither: delete `<store>/tls/` to get a new one
//! (and trust that).
//!
//! ```text
//! <store>/tls/dev-ca.pem          the CA to trust (curl --cacert …)
//! <store>/tls/dev-ca-key.pem      its key (0600), to issue names on demand
//! <store>/tls/localhost.pem       the default chain (leaf, then CA)
//! <store>/tls/localhost-key.pem   the key of every issued leaf (0600)
//! ```

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, GeneralSubtree, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, NameConstraints,
};
use rustls::ServerConfig;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio::io::{AsyncRead, AsyncWrite};

/// The directory under the store that holds the development certificate.
pub const DEV_CERT_DIR: &str = "tls";
/// The development CA's certificate, in [`DEV_CERT_DIR`].
pub const DEV_CA_FILE: &str = "dev-ca.pem";
/// The development CA's key, in [`DEV_CERT_DIR`].
pub const DEV_CA_KEY_FILE: &str = "dev-ca-key.pem";
/// Names the development front door remembers certificates for.
pub const DEV_CERT_CACHE: usize = 1024;
/// The development CA's common name (its subject is rebuilt from this to
/// sign, so it never changes).
const DEV_CA_NAME: &str = "hearth development CA (localhost)";
/// The development server chain, in [`DEV_CERT_DIR`].
pub const DEV_CERT_FILE: &str = "localhost.pem";
/// The development server key, in [`DEV_CERT_DIR`].
pub const DEV_KEY_FILE: &str = "localhost-key.pem";

/// Why the HTTPS front door could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum HttpsError {
    /// A certificate or key file could not be read or written.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: io::Error,
    },
    /// A file holds no usable certificate or key.
    #[error("{}: {reason}", path.display())]
    Pem {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// The certificate and key do not make a usable server configuration
    /// (for example, the key does not match the certificate).
    #[error("the TLS certificate and key cannot be used together: {0}")]
    Config(#[from] rustls::Error),
    /// The development certificate could not be made.
    #[error("making the development certificate: {0}")]
    Generate(#[from] rcgen::Error),
}

/// The HTTP protocol a TLS client chose by ALPN.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    /// `http/1.1`, or no ALPN.
    Http1,
    /// `h2`.
    Http2,
}

/// The front door's TLS: one server configuration, shared by every
/// connection.
#[derive(Clone)]
pub struct TlsFrontDoor {
    config: Arc<ServerConfig>,
}

impl std::fmt::Debug for TlsFrontDoor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsFrontDoor").finish_non_exhaustive()
    }
}

impl TlsFrontDoor {
    /// Serves the chain in `cert` (PEM, leaf first) with the key in `key`
    /// (PEM: PKCS#8, PKCS#1 or SEC1).
    pub fn from_pem(cert: &Path, key: &Path) -> Result<Self, HttpsError> {
        let chain = read_certs(cert)?;
        let key = read_key(key)?;
        Self::from_parts(chain, key)
    }

    /// Serves development certificates (see the module docs) from the CA
    /// of `store`, making it first if there is none; returns the path of
    /// the CA a client should trust.
    pub fn dev(store: &Path) -> Result<(Self, PathBuf), HttpsError> {
        let dir = store.join(DEV_CERT_DIR);
        if !dir.join(DEV_KEY_FILE).exists() {
            make_dev_cert(store, &dir)?;
        }
        let certs = DevCerts::load(&dir)?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut config = ServerConfig::builder_with_provider(provider)
            .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])?
            .with_no_client_auth()
            .with_cert_resolver(Arc::new(certs));
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        let door = TlsFrontDoor {
            config: Arc::new(config),
        };
        Ok((door, dir.join(DEV_CA_FILE)))
    }

    fn from_parts(
        chain: Vec<CertificateDer<'static>>,
        key: PrivateKeyDer<'static>,
    ) -> Result<Self, HttpsError> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut config = ServerConfig::builder_with_provider(provider)
            .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])?
            .with_no_client_auth()
            .with_single_cert(chain, key)?;
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        Ok(TlsFrontDoor {
            config: Arc::new(config),
        })
    }

    /// Reads `io`'s ClientHello, hands its server name (if any) to
    /// `on_sni`, then completes the handshake; returns the stream and the
    /// protocol the client chose. `on_sni` runs before the handshake goes
    /// on, so it must not block.
    pub async fn accept<IO>(
        &self,
        io: IO,
        on_sni: impl FnOnce(&str),
    ) -> io::Result<(tokio_rustls::server::TlsStream<IO>, Protocol)>
    where
        IO: AsyncRead + AsyncWrite + Unpin,
    {
        let acceptor =
            tokio_rustls::LazyConfigAcceptor::new(rustls::server::Acceptor::default(), io);
        let start = acceptor.await?;
        if let Some(name) = start.client_hello().server_name() {
            on_sni(name);
        }
        let stream = start.into_stream(self.config.clone()).await?;
        let protocol = match stream.get_ref().1.alpn_protocol() {
            Some(b"h2") => Protocol::Http2,
            _ => Protocol::Http1,
        };
        Ok((stream, protocol))
    }
}

fn read_file(path: &Path) -> Result<Vec<u8>, HttpsError> {
    std::fs::read(path).map_err(|source| HttpsError::Io {
        path: path.to_path_buf(),
        source,
    })
}

/// The PEM certificates in `path`; an error naming the file if it cannot be
/// read or holds none.
pub(crate) fn read_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, HttpsError> {
    let pem = read_file(path)?;
    let certs = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| HttpsError::Pem {
            path: path.to_path_buf(),
            reason: format!("not a PEM certificate chain: {e}"),
        })?;
    if certs.is_empty() {
        return Err(HttpsError::Pem {
            path: path.to_path_buf(),
            reason: "no certificate in it (expected PEM `BEGIN CERTIFICATE` blocks)".into(),
        });
    }
    Ok(certs)
}

fn read_key(path: &Path) -> Result<PrivateKeyDer<'static>, HttpsError> {
    let pem = read_file(path)?;
    PrivateKeyDer::from_pem_slice(&pem).map_err(|e| HttpsError::Pem {
        path: path.to_path_buf(),
        reason: format!("no PEM private key in it: {e}"),
    })
}

/// Makes the development CA and a `localhost` certificate
/// signed by it into `dir`, whole or not at all: written to a fresh
/// directory beside it, then renamed into place, so nodes sharing a store
/// that start together agree on one certificate.
fn make_dev_cert(store: &Path, dir: &Path) -> Result<(), HttpsError> {
    let io_err = |path: &Path| {
        let path = path.to_path_buf();
        move |source| HttpsError::Io { path, source }
    };
    std::fs::create_dir_all(store).map_err(io_err(store))?;
    let tmp = tempfile::Builder::new()
        .prefix(".tls-")
        .tempdir_in(store)
        .map_err(io_err(store))?;

    let days = |d| {
        let now = time::OffsetDateTime::now_utc();
        // A day of slack for clocks that disagree a little.
        (now - time::Duration::days(1), now + time::Duration::days(d))
    };
    let mut ca = dev_ca_params()?;
    (ca.not_before, ca.not_after) = days(DEV_CA_DAYS);
    let ca_key = KeyPair::generate()?;
    let ca_cert = ca.self_signed(&ca_key)?;

    let mut leaf = dev_leaf_params(vec!["localhost".into()])?;
    (leaf.not_before, leaf.not_after) = days(DEV_LEAF_DAYS);
    let leaf_key = KeyPair::generate()?;
    let issuer = Issuer::new(ca, ca_key);
    let leaf_cert = leaf.signed_by(&leaf_key, &issuer)?;

    let write = |name: &str, contents: String, secret: bool| -> Result<(), HttpsError> {
        let path = tmp.path().join(name);
        let mut options = std::fs::OpenOptions::new();
        options.write(true).create_new(true);
        #[cfg(unix)]
        if secret {
            use std::os::unix::fs::OpenOptionsExt;
            options.mode(0o600);
        }
        #[cfg(not(unix))]
        let _ = secret;
        let mut file = options.open(&path).map_err(io_err(&path))?;
        io::Write::write_all(&mut file, contents.as_bytes()).map_err(io_err(&path))?;
        file.sync_all().map_err(io_err(&path))
    };
    write(DEV_CA_FILE, ca_cert.pem(), false)?;
    write(DEV_CA_KEY_FILE, issuer.key().serialize_pem(), true)?;
    write(
        DEV_CERT_FILE,
        format!("{}{}", leaf_cert.pem(), ca_cert.pem()),
        false,
    )?;
    write(DEV_KEY_FILE, leaf_key.serialize_pem(), true)?;
    let made = tmp.keep();
    match std::fs::rename(&made, dir) {
        Ok(()) => hearth_runtime::store::script_store::sync_dir(store).map_err(io_err(store)),
        // Another node made one first (or an earlier, partial `tls/` is
        // there): keep what is in place.
        Err(_) if dir.join(DEV_KEY_FILE).exists() => {
            let _ = std::fs::remove_dir_all(&made);
            Ok(())
        }
        Err(source) => {
            let _ = std::fs::remove_dir_all(&made);
            Err(HttpsError::Io {
                path: dir.to_path_buf(),
                source,
            })
        }
    }
}

fn dev_ca_params() -> Result<CertificateParams, rcgen::Error> {
    let mut ca = CertificateParams::new(Vec::<String>::new())?;
    ca.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    ca.distinguished_name.push(DnType::CommonName, DEV_CA_NAME);
    ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    // `localhost` and every name under it; nothing else (see the module
    // docs).
    ca.name_constraints = Some(NameConstraints {
        permitted_subtrees: vec![GeneralSubtree::DnsName("localhost".into())],
        excluded_subtrees: Vec::new(),
    });
    Ok(ca)
}

fn dev_leaf_params(names: Vec<String>) -> Result<CertificateParams, rcgen::Error> {
    let mut leaf = CertificateParams::new(names)?;
    leaf.distinguished_name
        .push(DnType::CommonName, "localhost");
    leaf.use_authority_key_identifier_extension = true;
    leaf.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    leaf.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    Ok(leaf)
}

/// How long the development CA is valid from the day it is made.
pub const DEV_CA_DAYS: i64 = 730;

/// How long a development leaf certificate is valid (a client's maximum
/// for a server certificate, and within the CA's life).
pub const DEV_LEAF_DAYS: i64 = 397;

/// The development certificates: the default chain, and one issued per
/// `<label>.localhost` name asked for (see the module docs).
struct DevCerts {
    issuer: Issuer<'static, KeyPair>,
    ca: CertificateDer<'static>,
    leaf_key: KeyPair,
    signing_key: Arc<dyn rustls::sign::SigningKey>,
    default: Arc<rustls::sign::CertifiedKey>,
    issued: std::sync::Mutex<lru::LruCache<String, Arc<rustls::sign::CertifiedKey>>>,
}

impl std::fmt::Debug for DevCerts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DevCerts").finish_non_exhaustive()
    }
}

impl DevCerts {
    fn load(dir: &Path) -> Result<Self, HttpsError> {
        let key_pair = |path: &Path| -> Result<KeyPair, HttpsError> {
            let pem = String::from_utf8(read_file(path)?).map_err(|_| HttpsError::Pem {
                path: path.to_path_buf(),
                reason: "not UTF-8 PEM".into(),
            })?;
            KeyPair::from_pem(&pem).map_err(|e| HttpsError::Pem {
                path: path.to_path_buf(),
                reason: e.to_string(),
            })
        };
        let ca_key = key_pair(&dir.join(DEV_CA_KEY_FILE))?;
        let issuer = Issuer::new(dev_ca_params()?, ca_key);
        let ca_path = dir.join(DEV_CA_FILE);
        let ca = read_certs(&ca_path)?
            .into_iter()
            .next()
            .ok_or_else(|| HttpsError::Pem {
                path: ca_path,
                reason: "no certificate".into(),
            })?;
        let key_path = dir.join(DEV_KEY_FILE);
        let leaf_key = key_pair(&key_path)?;
        let provider = rustls::crypto::ring::default_provider();
        let signing_key = provider
            .key_provider
            .load_private_key(read_key(&key_path)?)?;
        let default = Arc::new(rustls::sign::CertifiedKey::new(
            read_certs(&dir.join(DEV_CERT_FILE))?,
            signing_key.clone(),
        ));
        let cache =
            std::num::NonZeroUsize::new(DEV_CERT_CACHE).unwrap_or(std::num::NonZeroUsize::MIN);
        Ok(DevCerts {
            issuer,
            ca,
            leaf_key,
            signing_key,
            default,
            issued: std::sync::Mutex::new(lru::LruCache::new(cache)),
        })
    }

    /// A certificate for exactly `name`, issued now.
    fn issue(&self, name: &str) -> Result<Arc<rustls::sign::CertifiedKey>, rcgen::Error> {
        let mut params = dev_leaf_params(vec![name.to_string()])?;
        let now = time::OffsetDateTime::now_utc();
        params.not_before = now - time::Duration::days(1);
        params.not_after = now + time::Duration::days(DEV_LEAF_DAYS);
        let cert = params.signed_by(&self.leaf_key, &self.issuer)?;
        Ok(Arc::new(rustls::sign::CertifiedKey::new(
            vec![cert.der().clone(), self.ca.clone()],
            self.signing_key.clone(),
        )))
    }
}

impl rustls::server::ResolvesServerCert for DevCerts {
    fn resolve(
        &self,
        hello: rustls::server::ClientHello<'_>,
    ) -> Option<Arc<rustls::sign::CertifiedKey>> {
        let Some(name) = hello.server_name() else {
            return Some(self.default.clone());
        };
        let name = name.to_ascii_lowercase();
        // `<one label>.localhost` only: what `*.localhost` means but cannot
        // say to a certificate checker.
        let label_only = name
            .strip_suffix(".localhost")
            .is_some_and(|label| !label.is_empty() && !label.contains('.'));
        if !label_only {
            return Some(self.default.clone());
        }
        let mut issued = self.issued.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(cert) = issued.get(&name) {
            return Some(cert.clone());
        }
        match self.issue(&name) {
            Ok(cert) => {
                issued.put(name, cert.clone());
                Some(cert)
            }
            Err(e) => {
                tracing::warn!(name, error = %e, "cannot issue a development certificate");
                Some(self.default.clone())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_dev_certificate_is_made_once_and_reused() {
        let store = tempfile::tempdir().expect("tempdir");
        let (_, ca) = TlsFrontDoor::dev(store.path()).expect("dev cert");
        let first = std::fs::read(&ca).expect("ca");
        let (_, again) = TlsFrontDoor::dev(store.path()).expect("dev cert again");
        assert_eq!(ca, again);
        assert_eq!(
            std::fs::read(&again).expect("ca"),
            first,
            "reused, not remade"
        );
        let leftovers: Vec<_> = std::fs::read_dir(store.path())
            .expect("store")
            .filter_map(Result::ok)
            .filter(|e| e.file_name().to_string_lossy().starts_with(".tls-"))
            .collect();
        assert!(leftovers.is_empty(), "no temporary directories left");
    }

    /// A leaf for `name` signed with the store's development CA key, as
    /// someone holding that key could make.
    fn signed_by_dev_ca(store: &Path, name: &str) -> CertificateDer<'static> {
        let dir = store.join(DEV_CERT_DIR);
        let ca_key =
            KeyPair::from_pem(&std::fs::read_to_string(dir.join(DEV_CA_KEY_FILE)).expect("CA key"))
                .expect("CA key");
        let issuer = Issuer::new(dev_ca_params().expect("params"), ca_key);
        let leaf_key = KeyPair::generate().expect("key");
        dev_leaf_params(vec![name.to_string()])
            .expect("params")
            .signed_by(&leaf_key, &issuer)
            .expect("signed")
            .der()
            .clone()
    }

    #[test]
    fn the_dev_ca_is_trusted_for_localhost_names_only() {
        use rustls::client::danger::ServerCertVerifier;
        let store = tempfile::tempdir().expect("tempdir");
        let (_, ca) = TlsFrontDoor::dev(store.path()).expect("dev cert");
        let mut roots = rustls::RootCertStore::empty();
        for cert in read_certs(&ca).expect("CA") {
            roots.add(cert).expect("root");
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let verifier =
            rustls::client::WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider)
                .build()
                .expect("verifier");
        let now = rustls::pki_types::UnixTime::now();
        let check = |name: &str| {
            let leaf = signed_by_dev_ca(store.path(), name);
            let server = rustls::pki_types::ServerName::try_from(name.to_string()).expect("name");
            verifier.verify_server_cert(&leaf, &[], &server, &[], now)
        };
        assert!(
            check("hello.localhost").is_ok(),
            "{:?}",
            check("hello.localhost")
        );
        assert!(check("localhost").is_ok());
        for outside in ["example.com", "bank.example", "localhost.example.com"] {
            assert!(check(outside).is_err(), "the dev CA vouched for {outside}");
        }
    }

    #[test]
    fn missing_and_garbage_files_are_clear_errors() {
        let dir = tempfile::tempdir().expect("tempdir");
        let missing = dir.path().join("nope.pem");
        let err = TlsFrontDoor::from_pem(&missing, &missing).expect_err("missing");
        assert!(err.to_string().contains("nope.pem"), "{err}");
        let junk = dir.path().join("junk.pem");
        std::fs::write(&junk, "not a certificate").expect("write");
        let err = TlsFrontDoor::from_pem(&junk, &junk).expect_err("junk");
        assert!(err.to_string().contains("no certificate"), "{err}");
        // A real chain with another certificate's key.
        let (_, _) = TlsFrontDoor::dev(dir.path()).expect("dev");
        let other = tempfile::tempdir().expect("tempdir");
        let (_, _) = TlsFrontDoor::dev(other.path()).expect("dev");
        let err = TlsFrontDoor::from_pem(
            &dir.path().join(DEV_CERT_DIR).join(DEV_CERT_FILE),
            &other.path().join(DEV_CERT_DIR).join(DEV_KEY_FILE),
        )
        .expect_err("mismatched key");
        assert!(err.to_string().contains("cannot be used together"), "{err}");
    }
}
