//! Worker sources in S3-compatible object storage: the [`S3Store`].
//!
//! The nodes of a data center do not share a disk; they share an object
//! store. An `S3Store` keeps the same content-addressed layout as the
//! [`DirStore`](crate::DirStore), as objects under a bucket and prefix:
//!
//! ```text
//! s3://BUCKET/PREFIX/blobs/<blake3>.wasm                sources, by hash (immutable)
//! s3://BUCKET/PREFIX/scripts/<id>.json                  the current deployment per script ID
//! s3://BUCKET/PREFIX/versions/<id>/<n>.json             version n of script <id> (immutable)
//! s3://BUCKET/PREFIX/secrets/<id>/<NAME>.json           secret NAME of script <id>, sealed
//! s3://BUCKET/PREFIX/claims/<id>/<n>-<nonce>.json       a deploy's claim on version number n
//! s3://BUCKET/PREFIX/artifacts/<blake3>-<engine>.cwasm  precompiled artifacts
//! ```
//!
//! A deploy uploads the blob, then the artifact, then claims a version
//! number, writes the version's record ([`crate::store::versions`]), then
//! the current deployment: an S3 `PUT` replaces an object atomically, so a
//! reader sees the old deployment or the new one, and the new one is only
//! written once its blob is in place. A deploy that fails part way leaves
//! the old version serving (at worst an unreferenced blob or artifact,
//! which is harmless: both are named by content). Two nodes never write
//! the same version's object: numbers are claimed first (S3 conditional
//! writes would do, but Garage ignores them), see
//! [`crate::store::records`]. The bucket is not trusted with records
//! either: each carries a MAC the nodes check.
//!
//! Artifacts are shared through the bucket so that one node's compile
//! serves every node of the same build (the engine fingerprint is in the
//! name). The bucket is not trusted with native code: every node keeps its
//! own on-disk artifact cache and loads an artifact only if its MAC checks
//! under the cluster's artifact key ([`crate::store::artifact`]); one tampered with
//! in the bucket is refused, recompiled and uploaded again.
//!
//! Every call has a short timeout and few retries ([`S3Settings`]), so an
//! unreachable store is a clear error within seconds, not minutes; warm
//! Workers never need the store to serve.
//!
//! Calls run on the Tokio runtime the store was opened on (the node's main
//! runtime), whichever thread asks: the HTTP client's connection pool lives
//! there.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::{StreamExt, TryStreamExt};
use object_store::aws::{AmazonS3Builder, AmazonS3ConfigKey};
use object_store::path::Path as ObjectPath;
use object_store::{
    BackoffConfig, ClientConfigKey, ObjectStore, ObjectStoreExt, PutPayload, RetryConfig,
};
use serde::Deserialize;

use crate::error::StoreError;
use crate::store::script_store::{Kind, Listed, RecordKey, ScriptStore};

/// How to reach an S3-compatible store. Every field is optional; what is
/// not given comes from the standard environment variables
/// (`AWS_ENDPOINT_URL`, `AWS_REGION`, `AWS_ACCESS_KEY_ID`,
/// `AWS_SECRET_ACCESS_KEY`, `AWS_ALLOW_HTTP`, ...).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, remote = "Self")]
pub struct S3Settings {
    /// Endpoint URL, e.g. `http://127.0.0.1:3900` (default: AWS).
    pub endpoint: Option<String>,
    /// Region (default `us-east-1`; Garage's default is `garage`).
    pub region: Option<String>,
    /// Access key ID.
    pub access_key_id: Option<String>,
    /// Secret access key.
    pub secret_access_key: Option<String>,
    /// Allow a plain `http://` endpoint (default false).
    pub allow_http: Option<bool>,
    /// How long one call may take before it fails (default 5 s); in a
    /// config file a duration such as `"5s"` or `"1500ms"`.
    #[serde(default, with = "humantime_serde")]
    pub timeout: Option<Duration>,
    /// Deprecated spelling of `timeout`, in milliseconds: read for one
    /// release. Parsing moves it into `timeout` with a warning; [`S3Store`]
    /// uses it only when `timeout` is unset.
    pub timeout_ms: Option<u64>,
    /// Retries of a failed call (default 2).
    pub max_retries: Option<usize>,
}

impl<'de> Deserialize<'de> for S3Settings {
    /// The `[s3]` section as written, with `timeout_ms` moved into
    /// `timeout`.
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let mut s = S3Settings::deserialize(d)?;
        if let Some(ms) = s.timeout_ms.take() {
            if s.timeout.is_some() {
                return Err(serde::de::Error::custom(
                    "[s3] sets both timeout_ms and timeout; timeout_ms is the deprecated \
                     spelling of timeout: remove it",
                ));
            }
            let timeout = Duration::from_millis(ms);
            tracing::warn!(
                "config: [s3] timeout_ms is deprecated and will be removed in the next release; \
                 write timeout = \"{}\" instead",
                humantime_serde::re::humantime::format_duration(timeout)
            );
            s.timeout = Some(timeout);
        }
        Ok(s)
    }
}

/// A [`ScriptStore`] in an S3-compatible bucket (see the module docs).
#[derive(Clone)]
pub struct S3Store {
    store: Arc<dyn ObjectStore>,
    prefix: ObjectPath,
    url: String,
    handle: tokio::runtime::Handle,
}

impl std::fmt::Debug for S3Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("S3Store").field("url", &self.url).finish()
    }
}

/// Whether `location` is an object store URL (`s3://…`) rather than a
/// directory.
pub fn is_s3_url(location: &str) -> bool {
    location.starts_with("s3://") || location.starts_with("s3a://")
}

impl S3Store {
    /// Opens the store at `url` (`s3://bucket/prefix`) with `settings` over
    /// the environment's. Must be called inside a Tokio runtime, whose
    /// threads will carry every call. Nothing is contacted yet: an
    /// unreachable store shows at the first call ([`S3Store::check`]).
    pub fn open(url: &str, settings: &S3Settings) -> Result<Self, StoreError> {
        let bad = |message: String| StoreError::Config {
            location: url.to_string(),
            message,
        };
        if !is_s3_url(url) {
            return Err(bad("expected s3://bucket/prefix".into()));
        }
        // HTTPS endpoints use rustls with the process's provider: ring,
        // as everywhere in hearth (a no-op if one is installed already).
        let _ = rustls::crypto::ring::default_provider().install_default();
        let handle = tokio::runtime::Handle::try_current()
            .map_err(|_| bad("an S3 store must be opened inside a Tokio runtime".into()))?;
        let rest = url.split_once("://").map(|(_, r)| r).unwrap_or_default();
        let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
        if bucket.is_empty() {
            return Err(bad("the URL names no bucket".into()));
        }
        let prefix = ObjectPath::parse(prefix.trim_matches('/'))
            .map_err(|e| bad(format!("invalid prefix: {e}")))?;
        let mut b = AmazonS3Builder::from_env().with_bucket_name(bucket);
        if let Some(v) = &settings.endpoint {
            b = b.with_endpoint(v);
        }
        if let Some(v) = &settings.region {
            b = b.with_region(v);
        }
        if let Some(v) = &settings.access_key_id {
            b = b.with_access_key_id(v);
        }
        if let Some(v) = &settings.secret_access_key {
            b = b.with_secret_access_key(v);
        }
        if let Some(v) = settings.allow_http {
            b = b.with_allow_http(v);
        }
        // Set key by key: `with_client_options` would replace what the
        // environment (and `allow_http` above) set.
        let timeout = settings
            .timeout
            .or(settings.timeout_ms.map(Duration::from_millis))
            .unwrap_or(Duration::from_secs(5));
        let connect = timeout.min(Duration::from_secs(2));
        b = b
            .with_config(
                AmazonS3ConfigKey::Client(ClientConfigKey::Timeout),
                format!("{}ms", timeout.as_millis()),
            )
            .with_config(
                AmazonS3ConfigKey::Client(ClientConfigKey::ConnectTimeout),
                format!("{}ms", connect.as_millis()),
            )
            .with_retry(RetryConfig {
                backoff: BackoffConfig {
                    init_backoff: Duration::from_millis(50),
                    max_backoff: Duration::from_millis(500),
                    base: 2.0,
                },
                max_retries: settings.max_retries.unwrap_or(2),
                retry_timeout: timeout * 2,
            });
        let store = b.build().map_err(|e| bad(e.to_string()))?;
        Ok(S3Store {
            store: Arc::new(store),
            prefix,
            url: url.trim_end_matches('/').to_string(),
            handle,
        })
    }

    /// Lists one object under the prefix: an error says the bucket cannot
    /// be reached or read with these credentials. For a clear message at
    /// start rather than at the first deploy.
    pub async fn check(&self) -> Result<(), StoreError> {
        let store = self.store.clone();
        let prefix = self.key(&["scripts"]);
        self.run(async move {
            store
                .list(Some(&prefix))
                .take(1)
                .try_collect::<Vec<_>>()
                .await
                .map(|_| ())
                .map_err(|e| remote(&prefix, e))
        })
        .await
    }

    /// The object key `prefix/parts…`.
    fn key(&self, parts: &[&str]) -> ObjectPath {
        let mut p = self.prefix.clone();
        for part in parts {
            p = p.join(*part);
        }
        p
    }

    /// Runs `fut` on the store's runtime.
    async fn run<T: Send + 'static>(
        &self,
        fut: impl Future<Output = Result<T, StoreError>> + Send + 'static,
    ) -> Result<T, StoreError> {
        self.handle
            .spawn(fut)
            .await
            .map_err(|e| StoreError::Remote {
                key: self.url.clone(),
                message: format!("store task failed: {e}"),
            })?
    }

    /// The bytes of object `key`, `None` if there is none.
    async fn read(&self, key: ObjectPath) -> Result<Option<Bytes>, StoreError> {
        let store = self.store.clone();
        self.run(async move {
            match store.get(&key).await {
                Ok(r) => r.bytes().await.map(Some).map_err(|e| remote(&key, e)),
                Err(object_store::Error::NotFound { .. }) => Ok(None),
                Err(e) => Err(remote(&key, e)),
            }
        })
        .await
    }

    /// Replaces object `key` with `bytes` (atomically, as S3 does).
    async fn write(&self, key: ObjectPath, bytes: Bytes) -> Result<(), StoreError> {
        let store = self.store.clone();
        self.run(async move {
            store
                .put(&key, PutPayload::from(bytes))
                .await
                .map(|_| ())
                .map_err(|e| remote(&key, e))
        })
        .await
    }

    /// The object of record `key`.
    fn record_key(&self, key: RecordKey<'_>) -> Result<ObjectPath, StoreError> {
        let path = key.path()?;
        Ok(self.key(&path.split('/').collect::<Vec<_>>()))
    }

    /// The object of the source with blake3 `hash`.
    fn blob_key(&self, hash: &str) -> Result<ObjectPath, StoreError> {
        if !crate::store::meta::is_source_hash(hash) {
            return Err(StoreError::BadKey {
                key: hash.chars().take(80).collect(),
            });
        }
        Ok(self.key(&["blobs", &format!("{hash}.wasm")]))
    }

    /// Every object directly under `dir` ending in `.json` (a listing is
    /// recursive, so deeper keys are skipped), by name without the
    /// extension, with its tag.
    async fn list_json(&self, dir: ObjectPath) -> Result<Vec<Listed>, StoreError> {
        let store = self.store.clone();
        let depth = dir.parts().count() + 1;
        let listed = dir.clone();
        let objects: Vec<object_store::ObjectMeta> = self
            .run(async move {
                store
                    .list(Some(&listed))
                    .try_collect()
                    .await
                    .map_err(|e| remote(&listed, e))
            })
            .await?;
        Ok(objects
            .into_iter()
            .filter(|o| o.location.parts().count() == depth)
            .filter_map(|o| {
                let name = o.location.filename()?.strip_suffix(".json")?.to_string();
                let tag = format!(
                    "{}.{}.{}",
                    o.e_tag.as_deref().unwrap_or(""),
                    o.last_modified.timestamp_nanos_opt().unwrap_or(0),
                    o.size
                );
                Some(Listed { name, tag })
            })
            .collect())
    }
}

fn remote(key: &ObjectPath, e: object_store::Error) -> StoreError {
    StoreError::Remote {
        key: key.to_string(),
        message: e.to_string(),
    }
}

#[async_trait::async_trait]
impl ScriptStore for S3Store {
    async fn put_blob(&self, hash: &str, bytes: &[u8]) -> Result<(), StoreError> {
        // Content-addressed, so rewriting an existing blob is harmless, and
        // it repairs one damaged in the bucket.
        let key = self.blob_key(hash)?;
        self.write(key, Bytes::copy_from_slice(bytes)).await
    }

    async fn get_blob(&self, hash: &str) -> Result<Option<Vec<u8>>, StoreError> {
        let key = self.blob_key(hash)?;
        Ok(self.read(key).await?.map(|b| b.to_vec()))
    }

    async fn put_record(&self, key: RecordKey<'_>, bytes: &[u8]) -> Result<(), StoreError> {
        let key = self.record_key(key)?;
        self.write(key, Bytes::copy_from_slice(bytes)).await
    }

    async fn get_record(&self, key: RecordKey<'_>) -> Result<Option<Vec<u8>>, StoreError> {
        let key = self.record_key(key)?;
        Ok(self.read(key).await?.map(|b| b.to_vec()))
    }

    async fn delete_record(&self, key: RecordKey<'_>) -> Result<(), StoreError> {
        let key = self.record_key(key)?;
        let store = self.store.clone();
        self.run(async move {
            match store.delete(&key).await {
                Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
                Err(e) => Err(remote(&key, e)),
            }
        })
        .await
    }

    async fn list_records(&self, kind: Kind, script_id: &str) -> Result<Vec<Listed>, StoreError> {
        let dir = match kind {
            Kind::Deployment => self.key(&[kind.dir()]),
            kind => {
                // The folder of a valid key: the script ID is checked.
                RecordKey::of(kind, script_id, "x").path()?;
                self.key(&[kind.dir(), script_id])
            }
        };
        let mut listed = self.list_json(dir).await?;
        listed.retain(|l| {
            let key = match kind {
                Kind::Deployment => RecordKey::deployment(&l.name),
                kind => RecordKey::of(kind, script_id, &l.name),
            };
            key.path().is_ok()
        });
        Ok(listed)
    }

    async fn get_artifact(&self, name: &str) -> Result<Option<Bytes>, StoreError> {
        self.read(self.key(&["artifacts", name])).await
    }

    async fn put_artifact(&self, name: &str, bytes: Bytes) -> Result<(), StoreError> {
        self.write(self.key(&["artifacts", name]), bytes).await
    }

    fn keeps_artifacts(&self) -> bool {
        true
    }

    fn location(&self) -> String {
        self.url.clone()
    }
}
