//! The store's records, authenticated: what a node believes of what a
//! directory or bucket holds.
//!
//! # The model
//!
//! A store ([`ScriptStore`]) is a place others than the nodes may be able
//! to write: a shared directory, a bucket whose credentials a CI job or a
//! backup tool also holds. Code it holds is named by its blake3 hash, and
//! compiled code carries a MAC ([`crate::store::artifact`]); the records
//! that say *what runs* (which source a script serves, its bindings, vars,
//! allow-lists and split, and its sealed secrets) carry one too. Without
//! it, whoever could write `scripts/app.json` could point its hash at a
//! blob that prints its environment, and the next request would print the
//! Worker's secrets in the clear.
//!
//! Every record [`Records`] writes (a deployment, a version, a secret) is
//! signed with a keyed blake3 MAC under a key derived from the node's
//! `artifact_key` with `blake3::derive_key` (context
//! [`RECORDS_KEY_CONTEXT`], so it is independent of the artifact MAC key
//! and of the secrets key derived from the same `artifact_key`). The MAC
//! covers the record's kind, script and name as well as its bytes, so a
//! record copied to another script, version or secret does not check.
//! On every read, a record whose MAC does not check is refused
//! ([`StoreError::Unauthenticated`]), counted (`store_metadata_rejected`,
//! with the refusals of a forged source hash) and logged with its path;
//! the Worker answers 500 "could not be loaded", the others serve.
//!
//! The MAC is the record's first JSON field, `"mac"`, ahead of the record
//! as it was serialized, and covers exactly those bytes: a reader strips
//! the field, checks the MAC and parses what it covered, so fields added
//! by a later hearth are covered too, and a hearth from before signing,
//! which ignores unknown fields, still reads a signed record.
//!
//! # What store access grants
//!
//! Whoever can write the store but does not hold `artifact_key` can delete
//! records and blobs (the Worker stops loading), and put back an earlier
//! record exactly as it was (a deployment as it was once current, a
//! secret's record before its rotation or deletion): the MAC proves a
//! record was written by a node, not that it is the latest. They cannot
//! make a node run code no node deployed, change a record's bindings,
//! vars, allow-lists or split, move a record to another script, or read a
//! secret. Reading the store shows the vars and bindings (in the clear)
//! and sealed secrets. A directory store keeps `artifact.key` in the
//! store unless `artifact_key` is set in the node's config: there,
//! writing the directory is holding the key.
//!
//! # Records from before signing
//!
//! Records written by a hearth from before this one carry no MAC, and
//! their secrets lived inside the deployment and version records. A node
//! refuses them unless `accept_unsigned_records` is set
//! ([`crate::RuntimeConfig::accept_unsigned_records`]); with it, a record
//! without a MAC is read (one with a MAC that does not check never is),
//! and an unsigned deployment's secrets serve until they are moved. The
//! upgrade is: roll out the new binary with the setting on, run
//! [`Records::upgrade`] once (`hearth upgrade-store`), which moves every
//! script's secrets into their own records, strips the sealed values from
//! every version record and signs every record, then turn the setting off.
//! Any write to a script through a new node (deploy, secret, rollback)
//! upgrades that script first.
//!
//! # Version numbers
//!
//! A deploy on one node may race a deploy of the same script on another,
//! and S3 overwrites objects (Garage ignores conditional writes), so two
//! nodes must never write the same `versions/<id>/<n>.json`. A deploy
//! first *claims* its number (`Records::claim_version`): it writes
//! `claims/<id>/<n>-<nonce>.json`, a name no other writer uses, lists the
//! claims, and keeps `n` only if no other claim for `n` and no record `n`
//! exist; otherwise it withdraws and tries the next number. Two writers
//! cannot both keep `n`: the later of the two claim writes is followed by
//! a listing that sees the earlier claim, or, if that writer has already
//! written record `n` and withdrawn its claim, the record. The winner
//! writes its record and withdraws its claim; claims a crash left behind
//! only skip numbers, and are pruned.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use serde::Serialize;
use serde::de::DeserializeOwned;
use zeroize::Zeroizing;

use crate::error::StoreError;
use crate::stats::Stats;
use crate::store::meta::{ScriptMeta, Sealed, SecretRecord};
use crate::store::script_store::{Kind, Listed, RecordKey, ScriptStore};

/// The `blake3::derive_key` context of the key records are signed with.
pub const RECORDS_KEY_CONTEXT: &str = "hearth 2026-12 store records v1 (from artifact_key)";

/// What a signed record starts with; then 64 hex digits of MAC and
/// [`MAC_END`], then the record as serialized without its opening `{`.
const MAC_START: &[u8] = b"{\n  \"mac\": \"";
/// What follows the MAC's hex digits.
const MAC_END: &[u8] = b"\",";
/// Hex digits of a MAC.
const MAC_HEX: usize = 64;

/// Most numbers one deploy tries before it gives up
/// ([`StoreError::Contended`]).
const MAX_CLAIM_ATTEMPTS: u32 = 8;

/// Records read at once when many are (a listing's).
const READ_CONCURRENCY: usize = 16;

/// What a node believes of its store: every record read is authenticated
/// (see the module docs), every record written is signed, and refusals
/// are counted. The runtime reads and writes the store only through this.
pub struct Records {
    store: Arc<dyn ScriptStore>,
    key: Zeroizing<[u8; 32]>,
    accept_unsigned: bool,
    keep_versions: usize,
    stats: Arc<Stats>,
}

impl std::fmt::Debug for Records {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Records")
            .field("store", &self.store.location())
            .field("accept_unsigned", &self.accept_unsigned)
            .field("keep_versions", &self.keep_versions)
            .finish()
    }
}

/// A script's secrets as the store holds them now: each sealed value, and
/// the tag of the listing they were read from (what
/// [`ScriptMeta::secrets_tag`] is for the same listing).
#[derive(Debug, Clone, Default)]
pub(crate) struct SecretSet {
    /// Name → sealed value.
    pub(crate) values: BTreeMap<String, Sealed>,
    /// The listing's digest.
    pub(crate) tag: String,
}

/// A version number a deploy has claimed ([`Records::claim_version`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Claim {
    /// The number.
    pub(crate) number: u64,
    /// The claim's record name, `<n>-<nonce>`.
    name: String,
}

/// What [`Records::upgrade`] did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct UpgradeReport {
    /// Scripts looked at.
    pub scripts: usize,
    /// Records rewritten signed (deployments and versions that had no MAC
    /// or still carried sealed secrets).
    pub records_signed: usize,
    /// Secrets moved from a deployment record into records of their own.
    pub secrets_moved: usize,
}

/// The digest of a listing of secret records: empty for none.
fn secrets_tag<'a>(entries: impl IntoIterator<Item = (&'a str, &'a str)>) -> String {
    let mut entries: Vec<_> = entries.into_iter().collect();
    if entries.is_empty() {
        return String::new();
    }
    entries.sort();
    let mut h = blake3::Hasher::new();
    for (name, tag) in entries {
        h.update(name.as_bytes());
        h.update(b"\0");
        h.update(tag.as_bytes());
        h.update(b"\0");
    }
    h.finalize().to_hex()[..16].to_string()
}

/// The version number a claim's name `<n>-<nonce>` (or a version record's
/// name `<n>`) stands for.
fn number_of(name: &str) -> Option<u64> {
    name.split('-').next()?.parse().ok()
}

/// How a record read out: authenticated, or accepted without a MAC.
enum Opened {
    /// Its MAC checked: the bytes it covers.
    Signed(Vec<u8>),
    /// It has no MAC.
    Unsigned,
}

impl Records {
    /// The records of `store`, signed and checked with the key derived
    /// from `artifact_key`; records without a MAC are read only if
    /// `accept_unsigned`; a deploy keeps the `keep_versions` latest
    /// versions of its script (at least 1); refusals are counted in
    /// `stats`.
    pub(crate) fn new(
        store: Arc<dyn ScriptStore>,
        artifact_key: &[u8; 32],
        accept_unsigned: bool,
        keep_versions: usize,
        stats: Arc<Stats>,
    ) -> Self {
        Records {
            store,
            key: Zeroizing::new(blake3::derive_key(RECORDS_KEY_CONTEXT, artifact_key)),
            accept_unsigned,
            keep_versions: keep_versions.max(1),
            stats,
        }
    }

    /// The store underneath (its bytes are not authenticated).
    pub fn backend(&self) -> &Arc<dyn ScriptStore> {
        &self.store
    }

    /// Where the store is, for logs and errors.
    pub fn location(&self) -> String {
        self.store.location()
    }

    /// Whether the store shares precompiled artifacts between nodes.
    pub fn keeps_artifacts(&self) -> bool {
        self.store.keeps_artifacts()
    }

    /// The shared artifact `name` (authenticated by its own MAC when
    /// loaded, [`crate::store::artifact`]).
    pub(crate) async fn get_artifact(
        &self,
        name: &str,
    ) -> Result<Option<bytes::Bytes>, StoreError> {
        self.store.get_artifact(name).await
    }

    /// Shares artifact `name` through the store.
    pub(crate) async fn put_artifact(
        &self,
        name: &str,
        bytes: bytes::Bytes,
    ) -> Result<(), StoreError> {
        self.store.put_artifact(name, bytes).await
    }

    /// The path of `key` for messages (or its parts, if it has none).
    fn shown(key: RecordKey<'_>) -> PathBuf {
        PathBuf::from(
            key.path()
                .unwrap_or_else(|_| format!("{}/{}/{}", key.kind.dir(), key.script_id, key.name)),
        )
    }

    /// The MAC of record `key` with bytes `body`.
    fn mac(&self, key: RecordKey<'_>, body: &[u8]) -> blake3::Hash {
        let mut h = blake3::Hasher::new_keyed(&self.key);
        for part in [
            b"hearth-record".as_slice(),
            key.kind.dir().as_bytes(),
            key.script_id.as_bytes(),
            key.name.as_bytes(),
        ] {
            h.update(part);
            h.update(b"\0");
        }
        h.update(body);
        h.finalize()
    }

    /// `value` serialized and signed as record `key`.
    fn encode(&self, key: RecordKey<'_>, value: &impl Serialize) -> Result<Vec<u8>, StoreError> {
        let body = serde_json::to_vec_pretty(value).map_err(|e| StoreError::Corrupt {
            path: Self::shown(key),
            message: e.to_string(),
        })?;
        // Every record is an object with at least one field.
        let Some(rest) = body.strip_prefix(b"{").filter(|r| r.len() > 1) else {
            return Err(StoreError::Corrupt {
                path: Self::shown(key),
                message: "a record must be a JSON object with fields".into(),
            });
        };
        let mac = self.mac(key, &body);
        let mut out = Vec::with_capacity(body.len() + MAC_START.len() + MAC_HEX + MAC_END.len());
        out.extend_from_slice(MAC_START);
        out.extend_from_slice(mac.to_hex().as_bytes());
        out.extend_from_slice(MAC_END);
        out.extend_from_slice(rest);
        Ok(out)
    }

    /// Checks record `key`'s `bytes`: the bytes its MAC covers, or
    /// [`Opened::Unsigned`], or an error if its MAC does not check.
    fn open(&self, key: RecordKey<'_>, bytes: &[u8]) -> Result<Opened, String> {
        let Some(rest) = bytes.strip_prefix(MAC_START) else {
            return Ok(Opened::Unsigned);
        };
        let (Some(hex), Some(rest)) = (
            rest.get(..MAC_HEX),
            rest.get(MAC_HEX..).and_then(|r| r.strip_prefix(MAC_END)),
        ) else {
            return Err("its MAC is malformed".into());
        };
        let tag = std::str::from_utf8(hex)
            .ok()
            .and_then(|h| blake3::Hash::from_hex(h).ok())
            .ok_or("its MAC is malformed")?;
        let mut body = Vec::with_capacity(rest.len() + 1);
        body.push(b'{');
        body.extend_from_slice(rest);
        // `blake3::Hash` equality is constant-time.
        if self.mac(key, &body) != tag {
            return Err(
                "its MAC does not check (the record was edited or forged, or signed under \
                 another artifact_key)"
                    .into(),
            );
        }
        Ok(Opened::Signed(body))
    }

    /// Counts and logs a refused record, and says why.
    fn refused(&self, e: StoreError) -> StoreError {
        Stats::bump(&self.stats.store_metadata_rejected);
        tracing::warn!(error = %e, "store record refused");
        e
    }

    /// Record `key`'s `bytes`, authenticated: the bytes its MAC covers,
    /// and whether it was signed; a record without a MAC (all of it) only
    /// if `accept_unsigned`.
    fn authenticate<'b>(
        &self,
        key: RecordKey<'_>,
        bytes: &'b [u8],
        accept_unsigned: bool,
    ) -> Result<(std::borrow::Cow<'b, [u8]>, bool), StoreError> {
        let path = Self::shown(key);
        match self.open(key, bytes) {
            Ok(Opened::Signed(body)) => Ok((std::borrow::Cow::Owned(body), true)),
            Ok(Opened::Unsigned) if accept_unsigned => {
                Ok((std::borrow::Cow::Borrowed(bytes), false))
            }
            Ok(Opened::Unsigned) => Err(self.refused(StoreError::Unauthenticated {
                path,
                reason: "it carries no MAC (forged, or written by a hearth from before records \
                         were signed: see accept_unsigned_records and `hearth upgrade-store`)"
                    .into(),
            })),
            Err(reason) => Err(self.refused(StoreError::Unauthenticated { path, reason })),
        }
    }

    /// Record `key`'s `bytes`, authenticated and parsed, and whether it
    /// was signed (see [`Records::authenticate`]).
    fn decode<T: DeserializeOwned>(
        &self,
        key: RecordKey<'_>,
        bytes: &[u8],
        accept_unsigned: bool,
    ) -> Result<(T, bool), StoreError> {
        let (body, signed) = self.authenticate(key, bytes, accept_unsigned)?;
        let value = serde_json::from_slice(&body).map_err(|e| StoreError::Corrupt {
            path: Self::shown(key),
            message: e.to_string(),
        })?;
        Ok((value, signed))
    }

    /// Script metadata (a deployment or a version record) at `key`:
    /// authenticated, its hash a source hash, and naming the script (and
    /// version) it is filed under.
    fn decode_meta(
        &self,
        key: RecordKey<'_>,
        bytes: &[u8],
        accept_unsigned: bool,
    ) -> Result<ScriptMeta, StoreError> {
        let (body, signed) = self.authenticate(key, bytes, accept_unsigned)?;
        let path = Self::shown(key);
        let mut meta = ScriptMeta::parse(&path, &body).map_err(|e| match e {
            e @ StoreError::BadHash { .. } => self.refused(e),
            e => e,
        })?;
        let filed = meta.script_id == key.script_id
            && (key.kind != Kind::Version || number_of(key.name) == Some(meta.number()));
        if !filed {
            return Err(StoreError::Corrupt {
                path,
                message: format!(
                    "the record says it is {} version {}",
                    meta.script_id.chars().take(80).collect::<String>(),
                    meta.version
                ),
            });
        }
        meta.signed = signed;
        if signed {
            // Only records from before signing carry secrets.
            meta.legacy_secrets.clear();
        }
        Ok(meta)
    }

    /// The metadata at `key`, if there is such a record.
    async fn read_meta(
        &self,
        key: RecordKey<'_>,
        accept_unsigned: bool,
    ) -> Result<Option<ScriptMeta>, StoreError> {
        match self.store.get_record(key).await? {
            Some(bytes) => self.decode_meta(key, &bytes, accept_unsigned).map(Some),
            None => Ok(None),
        }
    }

    /// Writes `value` signed as record `key`.
    async fn write<T: Serialize>(&self, key: RecordKey<'_>, value: &T) -> Result<(), StoreError> {
        let bytes = self.encode(key, value)?;
        self.store.put_record(key, &bytes).await
    }

    /// Writes `meta` as script metadata at `key`: without its secrets
    /// (they are records of their own) and, for a version, its split.
    async fn write_meta(&self, key: RecordKey<'_>, meta: &ScriptMeta) -> Result<(), StoreError> {
        let record = ScriptMeta {
            secrets: Vec::new(),
            secrets_tag: String::new(),
            legacy_secrets: BTreeMap::new(),
            split: match key.kind {
                Kind::Version => Vec::new(),
                _ => meta.split.clone(),
            },
            ..meta.clone()
        };
        self.write(key, &record).await
    }

    /// `meta` with the names and tag of its script's secrets, listed as
    /// `listed` (or, for a deployment from before secrets had records,
    /// its own).
    fn with_secret_names(mut meta: ScriptMeta, listed: &[Listed]) -> ScriptMeta {
        if listed.is_empty() && !meta.signed && !meta.legacy_secrets.is_empty() {
            meta.secrets = meta.legacy_secrets.keys().cloned().collect();
            meta.secrets_tag = secrets_tag(
                meta.legacy_secrets
                    .iter()
                    .map(|(name, sealed)| (name.as_str(), sealed.0.as_str())),
            );
        } else {
            let mut names: Vec<String> = listed.iter().map(|l| l.name.clone()).collect();
            names.sort();
            meta.secrets = names;
            meta.secrets_tag =
                secrets_tag(listed.iter().map(|l| (l.name.as_str(), l.tag.as_str())));
        }
        meta
    }

    /// The current deployment of `script_id` (`None`: not deployed), with
    /// its secrets' names and tag.
    pub async fn meta(&self, script_id: &str) -> Result<Option<ScriptMeta>, StoreError> {
        if !crate::store::validate::valid_script_id(script_id) {
            return Ok(None);
        }
        // One read for a name that is not deployed (a flood of unknown
        // names costs one read each, see `misses`); the listing after.
        let key = RecordKey::deployment(script_id);
        let Some(meta) = self.read_meta(key, self.accept_unsigned).await? else {
            return Ok(None);
        };
        let listed = self.store.list_records(Kind::Secret, script_id).await?;
        Ok(Some(Self::with_secret_names(meta, &listed)))
    }

    /// The source of `meta`, checked against its hash.
    async fn source_of(&self, meta: &ScriptMeta) -> Result<Vec<u8>, StoreError> {
        let source = self
            .store
            .get_blob(&meta.hash)
            .await?
            .ok_or_else(|| StoreError::Remote {
                key: format!("blobs/{}.wasm", meta.hash),
                message: "the metadata names a source that is not in the store".into(),
            })?;
        if blake3::hash(&source).to_hex().as_str() != meta.hash {
            return Err(StoreError::HashMismatch {
                script_id: meta.script_id.clone(),
                hash: meta.hash.clone(),
            });
        }
        Ok(source)
    }

    /// The current deployment of `script_id` and its source (checked
    /// against its hash), if deployed.
    pub async fn get(&self, script_id: &str) -> Result<Option<(ScriptMeta, Vec<u8>)>, StoreError> {
        let Some(meta) = self.meta(script_id).await? else {
            return Ok(None);
        };
        let source = self.source_of(&meta).await?;
        Ok(Some((meta, source)))
    }

    /// Every deployed script's current deployment, by script ID.
    pub async fn list(&self) -> Result<Vec<ScriptMeta>, StoreError> {
        let listed = self.store.list_records(Kind::Deployment, "").await?;
        // The futures are made first: a stream that makes them in a
        // closure borrowing `self` is not provably `Send`.
        let reads: Vec<_> = listed.iter().map(|l| self.meta(&l.name)).collect();
        let metas: Vec<Option<ScriptMeta>> = futures::stream::iter(reads)
            .buffer_unordered(READ_CONCURRENCY)
            .try_collect()
            .await?;
        let mut out: Vec<ScriptMeta> = metas.into_iter().flatten().collect();
        out.sort_by(|a, b| a.script_id.cmp(&b.script_id));
        Ok(out)
    }

    /// The recorded versions of `script_id`, lowest number first (none
    /// for a script deployed before versions existed).
    pub async fn versions(&self, script_id: &str) -> Result<Vec<ScriptMeta>, StoreError> {
        self.versions_of(script_id, self.accept_unsigned).await
    }

    async fn versions_of(
        &self,
        script_id: &str,
        accept_unsigned: bool,
    ) -> Result<Vec<ScriptMeta>, StoreError> {
        if !crate::store::validate::valid_script_id(script_id) {
            return Ok(Vec::new());
        }
        let listed = self.store.list_records(Kind::Version, script_id).await?;
        let reads: Vec<_> = listed
            .iter()
            .map(|l| {
                self.read_meta(
                    RecordKey::of(Kind::Version, script_id, &l.name),
                    accept_unsigned,
                )
            })
            .collect();
        let metas: Vec<Option<ScriptMeta>> = futures::stream::iter(reads)
            .buffer_unordered(READ_CONCURRENCY)
            .try_collect()
            .await?;
        let mut out: Vec<ScriptMeta> = metas.into_iter().flatten().collect();
        out.sort_by_key(|m| m.version);
        Ok(out)
    }

    /// Version `version` of `script_id` and its source (checked against
    /// its hash), if recorded.
    pub async fn get_version(
        &self,
        script_id: &str,
        version: u64,
    ) -> Result<Option<(ScriptMeta, Vec<u8>)>, StoreError> {
        if !crate::store::validate::valid_script_id(script_id) {
            return Ok(None);
        }
        let name = version.to_string();
        let key = RecordKey::of(Kind::Version, script_id, &name);
        let Some(meta) = self.read_meta(key, self.accept_unsigned).await? else {
            return Ok(None);
        };
        let source = self.source_of(&meta).await?;
        Ok(Some((meta, source)))
    }

    /// The secrets of `script_id` as they are now: every record, read and
    /// authenticated (for a deployment from before secrets had records,
    /// accepted unsigned, the ones it carries).
    pub(crate) async fn secrets(&self, script_id: &str) -> Result<SecretSet, StoreError> {
        let listed = self.store.list_records(Kind::Secret, script_id).await?;
        if listed.is_empty() && self.accept_unsigned {
            let current = self
                .read_meta(RecordKey::deployment(script_id), true)
                .await?;
            if let Some(m) = current.filter(|m| !m.signed && !m.legacy_secrets.is_empty()) {
                let tag = Self::with_secret_names(m.clone(), &[]).secrets_tag;
                return Ok(SecretSet {
                    values: m.legacy_secrets,
                    tag,
                });
            }
        }
        let reads: Vec<_> = listed
            .iter()
            .map(|l| self.read_secret(script_id, &l.name))
            .collect();
        let read: Vec<Option<(String, Sealed)>> = futures::stream::iter(reads)
            .buffer_unordered(READ_CONCURRENCY)
            .try_collect()
            .await?;
        Ok(SecretSet {
            values: read.into_iter().flatten().collect(),
            tag: secrets_tag(listed.iter().map(|l| (l.name.as_str(), l.tag.as_str()))),
        })
    }

    /// Secret `name` of `script_id`, authenticated (`None` if it was
    /// deleted since it was listed: the next check of the listing's tag
    /// reloads).
    async fn read_secret(
        &self,
        script_id: &str,
        name: &str,
    ) -> Result<Option<(String, Sealed)>, StoreError> {
        let key = RecordKey::of(Kind::Secret, script_id, name);
        let Some(bytes) = self.store.get_record(key).await? else {
            return Ok(None);
        };
        let (record, _) = self.decode::<SecretRecord>(key, &bytes, false)?;
        Ok(Some((name.to_string(), record.sealed)))
    }

    /// Stores `source`, content-addressed by its blake3 `hash`.
    pub(crate) async fn put_blob(&self, hash: &str, source: &[u8]) -> Result<(), StoreError> {
        self.store.put_blob(hash, source).await
    }

    /// Claims the next version number of `script_id` above `floor` and
    /// above every recorded or claimed number (see the module docs):
    /// write record `claim.number` with [`Records::put_version`], then
    /// [`Records::release`] the claim.
    pub(crate) async fn claim_version(
        &self,
        script_id: &str,
        floor: u64,
    ) -> Result<Claim, StoreError> {
        let nonce: String = crate::config::random_key()[..8]
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        for attempt in 1..=MAX_CLAIM_ATTEMPTS {
            let (versions, claims) = futures::join!(
                self.store.list_records(Kind::Version, script_id),
                self.store.list_records(Kind::Claim, script_id)
            );
            let highest = versions?
                .iter()
                .chain(&claims?)
                .filter_map(|l| number_of(&l.name))
                .fold(floor, u64::max);
            let number = highest + 1;
            let name = format!("{number}-{nonce}");
            let key = RecordKey::of(Kind::Claim, script_id, &name);
            self.write(key, &serde_json::json!({ "claimed": number }))
                .await?;
            let others = self.store.list_records(Kind::Claim, script_id).await?;
            let contested = others
                .iter()
                .any(|l| l.name != name && number_of(&l.name) == Some(number));
            let taken = contested
                || self
                    .store
                    .get_record(RecordKey::of(Kind::Version, script_id, &number.to_string()))
                    .await?
                    .is_some();
            if !taken {
                return Ok(Claim { number, name });
            }
            self.store.delete_record(key).await?;
            tracing::debug!(
                script = script_id,
                number,
                attempt,
                "version number taken by another writer"
            );
            let jitter = u64::from(crate::config::random_key()[0]) % 20;
            tokio::time::sleep(Duration::from_millis(5 + jitter) * attempt).await;
        }
        Err(StoreError::Contended {
            script_id: script_id.into(),
            attempts: MAX_CLAIM_ATTEMPTS,
        })
    }

    /// Withdraws `claim` (its record is written, or the deploy failed).
    pub(crate) async fn release(&self, script_id: &str, claim: &Claim) {
        let key = RecordKey::of(Kind::Claim, script_id, &claim.name);
        if let Err(e) = self.store.delete_record(key).await {
            tracing::warn!(script = script_id, error = %e, "a version claim stays behind (pruned later)");
        }
    }

    /// Records `meta` as version `meta.version` of its script (signed,
    /// without its split and secrets).
    pub(crate) async fn put_version(&self, meta: &ScriptMeta) -> Result<(), StoreError> {
        let name = meta.number().to_string();
        self.write_meta(RecordKey::of(Kind::Version, &meta.script_id, &name), meta)
            .await
    }

    /// Makes `meta` the current deployment of its script (signed, without
    /// its secrets).
    pub(crate) async fn set_current(&self, meta: &ScriptMeta) -> Result<(), StoreError> {
        self.write_meta(RecordKey::deployment(&meta.script_id), meta)
            .await
    }

    /// Writes secret `name` of `script_id`, replacing it.
    pub(crate) async fn put_secret(
        &self,
        script_id: &str,
        name: &str,
        sealed: Sealed,
    ) -> Result<(), StoreError> {
        let key = RecordKey::of(Kind::Secret, script_id, name);
        self.write(key, &SecretRecord { sealed }).await
    }

    /// Deletes secret `name` of `script_id`; whether there was one.
    pub(crate) async fn delete_secret(
        &self,
        script_id: &str,
        name: &str,
    ) -> Result<bool, StoreError> {
        let key = RecordKey::of(Kind::Secret, script_id, name);
        let existed = self.store.get_record(key).await?.is_some();
        self.store.delete_record(key).await?;
        Ok(existed)
    }

    /// Deletes the versions of `current`'s script beyond the
    /// `keep_versions` latest, except the ones `current` serves, and the
    /// claims crashed deploys left below the latest version (no writer
    /// contests a number below a recorded one). Returns how many versions
    /// were deleted; a failure is logged, not returned (the deploy it
    /// follows has succeeded).
    pub(crate) async fn prune(&self, current: &ScriptMeta) -> usize {
        let id = current.script_id.as_str();
        let (versions, claims) = futures::join!(
            self.store.list_records(Kind::Version, id),
            self.store.list_records(Kind::Claim, id)
        );
        let (versions, claims) = match (versions, claims) {
            (Ok(v), Ok(c)) => (v, c),
            (Err(e), _) | (_, Err(e)) => {
                tracing::warn!(script = id, error = %e, "versions not pruned");
                return 0;
            }
        };
        let mut numbers: Vec<u64> = versions.iter().filter_map(|l| number_of(&l.name)).collect();
        numbers.sort_unstable_by(|a, b| b.cmp(a));
        let highest = numbers.first().copied().unwrap_or(0);
        let serving: Vec<u64> = crate::store::versions::deployment_of(current)
            .iter()
            .map(|s| s.version)
            .collect();
        let mut deleted = 0;
        for n in numbers.iter().skip(self.keep_versions) {
            if serving.contains(n) {
                continue;
            }
            let name = n.to_string();
            match self
                .store
                .delete_record(RecordKey::of(Kind::Version, id, &name))
                .await
            {
                Ok(()) => deleted += 1,
                Err(e) => {
                    tracing::warn!(script = id, version = n, error = %e, "version not pruned")
                }
            }
        }
        for l in claims {
            if number_of(&l.name).is_some_and(|n| n < highest) {
                let _ = self
                    .store
                    .delete_record(RecordKey::of(Kind::Claim, id, &l.name))
                    .await;
            }
        }
        if deleted > 0 {
            tracing::info!(
                script = id,
                deleted,
                keep = self.keep_versions,
                "old versions pruned"
            );
        }
        deleted
    }

    /// Upgrades `script_id` if its current deployment is a record from
    /// before signing (see the module docs); what it did.
    pub(crate) async fn upgrade_if_unsigned(
        &self,
        current: Option<&ScriptMeta>,
    ) -> Result<UpgradeReport, StoreError> {
        match current {
            Some(m) if !m.signed => self.upgrade_script(&m.script_id).await,
            _ => Ok(UpgradeReport::default()),
        }
    }

    /// Upgrades every script in the store from records written before
    /// records were signed (see the module docs): each script's secrets
    /// move into records of their own, sealed values leave every version
    /// record, and every deployment and version record is signed. Reads
    /// records without a MAC whatever `accept_unsigned_records` says (the
    /// operator running it vouches for the store as it is); a record
    /// whose MAC does not check is refused, as always. Run it once every
    /// node runs a hearth that signs, with no deploy in flight.
    pub async fn upgrade(&self) -> Result<UpgradeReport, StoreError> {
        let listed = self.store.list_records(Kind::Deployment, "").await?;
        let mut total = UpgradeReport::default();
        for l in listed {
            let r = self.upgrade_script(&l.name).await?;
            total.scripts += 1;
            total.records_signed += r.records_signed;
            total.secrets_moved += r.secrets_moved;
        }
        Ok(total)
    }

    /// [`Records::upgrade`] for one script.
    async fn upgrade_script(&self, script_id: &str) -> Result<UpgradeReport, StoreError> {
        let mut report = UpgradeReport {
            scripts: 1,
            ..UpgradeReport::default()
        };
        let Some(current) = self
            .read_meta(RecordKey::deployment(script_id), true)
            .await?
        else {
            return Ok(report);
        };
        let existing = self.store.list_records(Kind::Secret, script_id).await?;
        if existing.is_empty() {
            for (name, sealed) in &current.legacy_secrets {
                self.put_secret(script_id, name, sealed.clone()).await?;
                report.secrets_moved += 1;
            }
        }
        for version in self.versions_of(script_id, true).await? {
            if !version.signed || !version.legacy_secrets.is_empty() {
                self.put_version(&version).await?;
                report.records_signed += 1;
            }
        }
        if !current.signed || !current.legacy_secrets.is_empty() {
            self.set_current(&current).await?;
            report.records_signed += 1;
        }
        if report.records_signed > 0 {
            tracing::info!(
                script = script_id,
                signed = report.records_signed,
                secrets_moved = report.secrets_moved,
                "store records upgraded"
            );
        }
        Ok(report)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::script_store::DirStore;

    fn records(dir: &std::path::Path, key: u8, accept_unsigned: bool) -> Records {
        let store = DirStore::open(dir).expect("open");
        Records::new(
            Arc::new(store),
            &[key; 32],
            accept_unsigned,
            3,
            Arc::default(),
        )
    }

    #[test]
    fn a_signed_record_opens_only_where_and_under_the_key_it_was_signed() {
        let dir = tempfile::tempdir().expect("tempdir");
        let r = records(dir.path(), 1, false);
        let key = RecordKey::of(Kind::Secret, "app", "TOKEN");
        let value = serde_json::json!({ "sealed": "00ff" });
        let bytes = r.encode(key, &value).expect("encode");
        let text = String::from_utf8(bytes.clone()).expect("utf-8");
        assert!(text.starts_with("{\n  \"mac\": \""), "{text}");
        // Still JSON, with the record's fields beside the MAC.
        let parsed: serde_json::Value = serde_json::from_slice(&bytes).expect("json");
        assert_eq!(parsed["sealed"], "00ff");
        let (back, signed) = r
            .decode::<serde_json::Value>(key, &bytes, false)
            .expect("opens");
        assert_eq!((back, signed), (value, true));
        // Another name, script or kind: refused.
        for other in [
            RecordKey::of(Kind::Secret, "app", "OTHER"),
            RecordKey::of(Kind::Secret, "evil", "TOKEN"),
            RecordKey::of(Kind::Version, "app", "TOKEN"),
        ] {
            assert!(matches!(
                r.decode::<serde_json::Value>(other, &bytes, false),
                Err(StoreError::Unauthenticated { .. })
            ));
        }
        // One byte changed: refused.
        let edited = text.replace("00ff", "00fe");
        assert!(matches!(
            r.decode::<serde_json::Value>(key, edited.as_bytes(), true),
            Err(StoreError::Unauthenticated { .. })
        ));
        // Another cluster's key: refused.
        let foreign = records(dir.path(), 2, true);
        assert!(matches!(
            foreign.decode::<serde_json::Value>(key, &bytes, true),
            Err(StoreError::Unauthenticated { .. })
        ));
        // No MAC: refused unless accepted.
        let plain = br#"{"sealed": "00ff"}"#;
        assert!(matches!(
            r.decode::<serde_json::Value>(key, plain, false),
            Err(StoreError::Unauthenticated { .. })
        ));
        let (_, signed) = r
            .decode::<serde_json::Value>(key, plain, true)
            .expect("accepted");
        assert!(!signed);
        assert_eq!(
            r.stats
                .store_metadata_rejected
                .load(std::sync::atomic::Ordering::Relaxed),
            5
        );
    }

    #[test]
    fn claims_and_versions_number_alike() {
        assert_eq!(number_of("12"), Some(12));
        assert_eq!(number_of("12-00ff00ff00ff00ff"), Some(12));
        assert_eq!(number_of("x-1"), None);
        assert_eq!(secrets_tag([]), "");
        assert_ne!(secrets_tag([("A", "1")]), secrets_tag([("A", "2")]));
        assert_eq!(
            secrets_tag([("A", "1"), ("B", "2")]),
            secrets_tag([("B", "2"), ("A", "1")])
        );
    }
}
