//! Deploys, secrets and versions: what changes a script in the store.
//!
//! A deploy checks and compiles on the blocking pool, then, under the
//! script's deploy lock, claims its next version number, writes the
//! version and makes it the current deployment, then prunes old versions;
//! a secret change writes that secret's record only; a rollback or a split
//! only replaces the current deployment. Each drops the copy resident
//! here, so the next request loads what the store has.

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde::Serialize;

use crate::error::StoreError;
use crate::instances::lifecycle;
use crate::instances::worker::link;
use crate::limits::Plan;
use crate::store::manifest::Manifest;
use crate::store::meta::{ScriptMeta, Share};
use crate::store::secrets::SecretError;
use crate::store::validate::{
    ValidationError, compressed_size, valid_script_id, validate_component,
};
use crate::store::versions::{VersionError, VersionList};
use crate::timing::CodeSource;

use super::{Runtime, lock};

/// Why a deploy was refused. The old version (if any) keeps serving.
#[derive(Debug, thiserror::Error)]
pub enum DeployError {
    /// The script ID cannot be routed to (it must be a DNS label).
    #[error(
        "invalid script ID {0:?}: use 1-63 lowercase letters, digits and '-', not starting or ending with '-'"
    )]
    InvalidScriptId(String),
    /// The script is over its plan's size limit (measured gzip-compressed).
    #[error(
        "script too large for the {plan} plan: {compressed} bytes gzip-compressed ({raw} bytes raw), limit is {limit} bytes compressed"
    )]
    TooLarge {
        /// The plan whose limit applies.
        plan: Plan,
        /// Size after gzip (level 6), the measure the limit uses.
        compressed: u64,
        /// Size as uploaded.
        raw: u64,
        /// The plan's limit on the compressed size.
        limit: u64,
    },
    /// The script is over its plan's limit on the uncompressed size.
    #[error(
        "script too large for the {plan} plan: {raw} bytes uncompressed, limit is {limit} bytes uncompressed"
    )]
    TooLargeUncompressed {
        /// The plan whose limit applies.
        plan: Plan,
        /// Size as uploaded.
        raw: u64,
        /// The plan's limit on the uncompressed size.
        limit: u64,
    },
    /// The bytes are not a valid Worker component.
    #[error(transparent)]
    Invalid(#[from] ValidationError),
    /// The component is well-formed but wasmtime could not compile or link it.
    #[error("component does not compile or link: {0}")]
    Compile(String),
    /// The script store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The bindings are invalid ([`crate::outbound::bindings`]).
    #[error(transparent)]
    Bindings(#[from] crate::outbound::bindings::BindingsError),
    /// The vars are invalid, or collide with the Worker's secrets
    /// ([`crate::store::secrets`]).
    #[error(transparent)]
    Env(#[from] crate::store::secrets::EnvError),
}

/// What a successful deploy reports.
#[derive(Debug, Clone, Serialize)]
pub struct DeployReport {
    /// The script's metadata as stored.
    pub meta: ScriptMeta,
    /// The plan's compressed size limit.
    pub limit: u64,
    /// Time to compile (or load the artifact of an identical source).
    #[serde(serialize_with = "ser_ms")]
    pub compile_time: Duration,
    /// Whether the code was compiled or an artifact reused.
    pub code_source: CodeSource,
}

fn ser_ms<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_f64(d.as_secs_f64() * 1000.0)
}

/// What a deploy checked and compiled, before it is stored.
struct Checked {
    plan: Plan,
    limit: u64,
    compressed: u64,
    lifecycle: crate::LifecycleChoice,
    bindings: crate::Bindings,
    vars: std::collections::BTreeMap<String, String>,
    dispatch_only: bool,
    hash: String,
    compile_time: Duration,
    code_source: CodeSource,
}

impl Runtime {
    /// Validates, compiles and stores `source` as `script_id` with the
    /// settings of `manifest` (a [`Manifest`], or just a [`crate::Plan`]),
    /// as its next numbered version ([`crate::store::versions`]), which replaces
    /// the current deployment atomically (at 100%, ending any split; the
    /// earlier versions stay on record). Runs the CPU-heavy parts on
    /// the blocking pool. A store that shares artifacts gets the compiled
    /// one before the new version is visible, so other nodes load it
    /// instead of compiling.
    pub async fn deploy(
        &self,
        script_id: &str,
        manifest: impl Into<Manifest>,
        source: Vec<u8>,
    ) -> Result<DeployReport, DeployError> {
        let rt = self.clone();
        let id = script_id.to_string();
        let manifest = manifest.into();
        let (checked, source) =
            tokio::task::spawn_blocking(move || rt.check_and_compile(&id, &manifest, source))
                .await
                .map_err(|e| DeployError::Compile(format!("deploy task failed: {e}")))??;
        if self.inner.store.keeps_artifacts() {
            self.share_artifact(&checked.hash).await;
        }
        // Concurrent deploys of one name are serialised from here: the
        // deploy time is taken under the lock, so the version stored last
        // is the one with the latest time, and each caller is told what it
        // wrote.
        let name_lock = self.deploy_lock(script_id);
        let _serial = name_lock.lock().await;
        let store = &self.inner.store;
        let old = self.current_upgraded(script_id).await?;
        // Secrets belong to the script, not to a version: the new version
        // runs with the ones the store holds (their names are checked
        // against the vars here, and shown in the report).
        let (secrets, secrets_tag) = old
            .as_ref()
            .map(|m| (m.secrets.clone(), m.secrets_tag.clone()))
            .unwrap_or_default();
        crate::store::secrets::check_vars(&checked.vars, secrets.iter())?;
        store.put_blob(&checked.hash, &source).await?;
        let claim = self.claim_next_version(script_id, old.as_ref()).await?;
        let meta = ScriptMeta {
            script_id: script_id.into(),
            plan: checked.plan,
            size: source.len() as u64,
            compressed_size: checked.compressed,
            hash: checked.hash,
            deployed_at_ms: unix_ms(),
            lifecycle: checked.lifecycle,
            bindings: checked.bindings,
            vars: checked.vars,
            secrets,
            secrets_tag,
            legacy_secrets: Default::default(),
            signed: true,
            dispatch_only: checked.dispatch_only,
            version: claim.number,
            latest_version: claim.number,
            split: Vec::new(),
        };
        let recorded = store.put_version(&meta).await;
        store.release(script_id, &claim).await;
        recorded?;
        store.set_current(&meta).await?;
        self.invalidate(script_id);
        store.prune(&meta).await;
        tracing::info!(script = script_id, version = meta.version, plan = %meta.plan, size = meta.size,
            compressed = meta.compressed_size, hash = %meta.hash,
            lifecycle = %meta.lifecycle.chosen, compile_time = ?checked.compile_time, "deployed");
        Ok(DeployReport {
            meta,
            limit: checked.limit,
            compile_time: checked.compile_time,
            code_source: checked.code_source,
        })
    }

    /// The CPU-bound part of a deploy: every check on `source`, then the
    /// compile (or the artifact of an identical source).
    fn check_and_compile(
        &self,
        script_id: &str,
        manifest: &Manifest,
        source: Vec<u8>,
    ) -> Result<(Checked, Vec<u8>), DeployError> {
        if !valid_script_id(script_id) {
            return Err(DeployError::InvalidScriptId(script_id.into()));
        }
        let plan = manifest.plan;
        let limits = self.inner.config.limits(plan);
        let limit = limits.max_script_size;
        if source.len() as u64 > limits.max_uncompressed_size {
            return Err(DeployError::TooLargeUncompressed {
                plan,
                raw: source.len() as u64,
                limit: limits.max_uncompressed_size,
            });
        }
        let compressed = compressed_size(&source);
        if compressed > limit {
            return Err(DeployError::TooLarge {
                plan,
                compressed,
                raw: source.len() as u64,
                limit,
            });
        }
        validate_component(&source)?;
        let bindings = manifest.bindings.clone();
        bindings.validate()?;
        crate::store::secrets::check_vars(&manifest.vars, [])?;
        let hash = blake3::hash(&source).to_hex().to_string();
        let t = Instant::now();
        let (component, code_source) = self
            .compile(&hash, &source)
            .map_err(|e| DeployError::Compile(e.to_string()))?;
        link(&self.inner.linker, &component).map_err(|e| DeployError::Compile(e.to_string()))?;
        let checked = Checked {
            plan,
            limit,
            compressed,
            lifecycle: lifecycle::decide(manifest.lifecycle, &source),
            bindings,
            vars: manifest.vars.clone(),
            dispatch_only: manifest.dispatch_only,
            hash,
            compile_time: t.elapsed(),
            code_source,
        };
        Ok((checked, source))
    }

    /// The lock that serialises deploys of `script_id` on this node (the
    /// store serialises across nodes).
    fn deploy_lock(&self, script_id: &str) -> Arc<tokio::sync::Mutex<()>> {
        let mut locks = lock(&self.inner.deploying);
        locks.retain(|_, l| Arc::strong_count(l) > 1);
        locks.entry(script_id.to_string()).or_default().clone()
    }

    /// Seals `value` as secret `name` of `script_id` and stores it as the
    /// script's record of that secret, replacing one of that name. It
    /// writes no version and leaves the deployment as it is (a secret
    /// belongs to the script: [`crate::store::secrets`]), so it cannot race
    /// a deploy on another node. The warm copy here is dropped, so its next
    /// request sees it. Returns the current deployment with the new
    /// secrets (announce its [`ScriptMeta::revision`] to the other
    /// members, as a deploy does).
    pub async fn put_secret(
        &self,
        script_id: &str,
        name: &str,
        value: &str,
    ) -> Result<ScriptMeta, SecretError> {
        use crate::store::secrets::{EnvError, MAX_ENTRIES, MAX_VALUE_BYTES, check_name};
        check_name("secret", name)?;
        if value.len() > MAX_VALUE_BYTES {
            return Err(EnvError::ValueTooLarge {
                kind: "secret",
                name: name.into(),
                bytes: value.len(),
            }
            .into());
        }
        let (_serial, meta) = self.for_secret_change(script_id).await?;
        if meta.vars.contains_key(name) {
            return Err(EnvError::Conflict { name: name.into() }.into());
        }
        let count = meta.vars.len() + meta.secrets.len() + 1;
        if !meta.secrets.iter().any(|s| s == name) && count > MAX_ENTRIES {
            return Err(EnvError::TooMany { count }.into());
        }
        let sealed = self.inner.node.secrets_key.seal(script_id, name, value);
        self.inner.store.put_secret(script_id, name, sealed).await?;
        tracing::info!(script = script_id, secret = name, "secret put");
        self.after_secret_change(script_id).await
    }

    /// Deletes secret `name` of `script_id` (its record: no version keeps
    /// a copy, so it stays deleted through any rollback); the current
    /// deployment, and whether there was such a secret.
    pub async fn delete_secret(
        &self,
        script_id: &str,
        name: &str,
    ) -> Result<(ScriptMeta, bool), SecretError> {
        let (_serial, meta) = self.for_secret_change(script_id).await?;
        if crate::store::secrets::check_name("secret", name).is_err() {
            return Ok((meta, false));
        }
        let deleted = self.inner.store.delete_secret(script_id, name).await?;
        if !deleted {
            return Ok((meta, false));
        }
        tracing::info!(script = script_id, secret = name, "secret deleted");
        Ok((self.after_secret_change(script_id).await?, true))
    }

    /// The names of `script_id`'s secrets (never their values).
    pub async fn secret_names(&self, script_id: &str) -> Result<Vec<String>, SecretError> {
        let meta = self
            .inner
            .store
            .meta(script_id)
            .await?
            .ok_or_else(|| SecretError::UnknownScript(script_id.into()))?;
        Ok(meta.secrets)
    }

    /// `script_id`'s deploy lock (held until the guard is dropped) and its
    /// current deployment, for a secret change.
    async fn for_secret_change(
        &self,
        script_id: &str,
    ) -> Result<(tokio::sync::OwnedMutexGuard<()>, ScriptMeta), SecretError> {
        let serial = self.deploy_lock(script_id).lock_owned().await;
        let meta = self
            .current_upgraded(script_id)
            .await?
            .ok_or_else(|| SecretError::UnknownScript(script_id.into()))?;
        Ok((serial, meta))
    }

    /// After a secret of `script_id` changed: drops the warm copy here and
    /// reads the deployment again, with the new listing of its secrets.
    async fn after_secret_change(&self, script_id: &str) -> Result<ScriptMeta, SecretError> {
        self.invalidate(script_id);
        self.inner
            .store
            .meta(script_id)
            .await?
            .ok_or_else(|| SecretError::UnknownScript(script_id.into()))
    }

    /// The current deployment of `script_id`; if it is a record from
    /// before records were signed (read under
    /// [`crate::RuntimeConfig::accept_unsigned_records`]), the script is
    /// upgraded first ([`crate::store::records`]), so a write here moves
    /// its secrets into their records instead of dropping them.
    async fn current_upgraded(&self, script_id: &str) -> Result<Option<ScriptMeta>, StoreError> {
        let store = &self.inner.store;
        let current = store.meta(script_id).await?;
        if store.upgrade_if_unsigned(current.as_ref()).await? == Default::default() {
            return Ok(current);
        }
        store.meta(script_id).await
    }

    /// Claims the number of the next version of a script whose current
    /// deployment is `current` ([`crate::store::records`]: unique even when
    /// nodes deploy it at once); a script deployed before versions existed
    /// is recorded as version 1 first, so it can be rolled back to.
    async fn claim_next_version(
        &self,
        script_id: &str,
        current: Option<&ScriptMeta>,
    ) -> Result<crate::store::records::Claim, StoreError> {
        let floor = match current {
            None => 0,
            Some(current) => {
                self.record_as_version_1(current).await?;
                current.latest_version.max(current.number())
            }
        };
        self.inner.store.claim_version(script_id, floor).await
    }

    /// Records `current`, if it is a deployment from before versions
    /// existed, as version 1 (what it counts as), so it can be rolled back
    /// to once another version serves.
    async fn record_as_version_1(&self, current: &ScriptMeta) -> Result<(), StoreError> {
        if current.version != 0 {
            return Ok(());
        }
        let legacy = ScriptMeta {
            version: 1,
            latest_version: 1,
            split: Vec::new(),
            ..current.clone()
        };
        self.inner.store.put_version(&legacy).await
    }

    /// The versions of `script_id`, its current deployment, and this
    /// node's counts per version of its split ([`crate::store::versions`]).
    pub async fn versions(&self, script_id: &str) -> Result<VersionList, VersionError> {
        let current = self
            .inner
            .store
            .meta(script_id)
            .await?
            .ok_or_else(|| VersionError::UnknownScript(script_id.into()))?;
        let mut versions = self.inner.store.versions(script_id).await?;
        if current.version == 0 {
            // Deployed before versions existed: it is version 1.
            versions = vec![ScriptMeta {
                version: 1,
                ..current.clone()
            }];
        }
        Ok(VersionList {
            script_id: script_id.into(),
            deployment: crate::store::versions::deployment_of(&current),
            versions,
            counts: self.inner.versions.of(script_id),
        })
    }

    /// Makes `shares` the current deployment of `script_id`: one version
    /// at 100% (a rollback) or a split ([`crate::store::versions`]). Every version
    /// must be recorded; the first one's metadata becomes current. The
    /// warm copy here is dropped; returns the new current deployment
    /// (announce its [`ScriptMeta::revision`] to the other members, as a
    /// deploy does).
    pub async fn set_deployment(
        &self,
        script_id: &str,
        shares: &[Share],
    ) -> Result<ScriptMeta, VersionError> {
        crate::store::versions::check_split(shares)?;
        let name_lock = self.deploy_lock(script_id);
        let _serial = name_lock.lock().await;
        let current = self
            .current_upgraded(script_id)
            .await?
            .ok_or_else(|| VersionError::UnknownScript(script_id.into()))?;
        let mut first = None;
        for share in shares {
            let found = self.version_meta(&current, share.version).await?;
            let found = found.ok_or_else(|| VersionError::NoSuchVersion {
                script_id: script_id.into(),
                version: share.version,
            })?;
            first.get_or_insert(found);
        }
        let Some(first) = first else {
            return Err(VersionError::BadSplit("no versions given".into()));
        };
        // The versions run with today's secrets: their names and tag are
        // the script's, not the version's.
        let meta = ScriptMeta {
            latest_version: current.latest_version.max(current.number()),
            split: if shares.len() > 1 {
                shares.to_vec()
            } else {
                Vec::new()
            },
            secrets: current.secrets.clone(),
            secrets_tag: current.secrets_tag.clone(),
            ..first
        };
        if meta.version != 0 {
            // Leaving a deployment from before versions: keep it as 1.
            self.record_as_version_1(&current).await?;
        }
        self.inner.store.set_current(&meta).await?;
        self.invalidate(script_id);
        let list: Vec<String> = shares.iter().map(Share::to_string).collect();
        tracing::info!(script = script_id, deployment = %list.join(" "), "deployment changed");
        Ok(meta)
    }

    /// Rolls `script_id` back to `version` at 100%, by default the
    /// highest recorded version below the current one (see
    /// [`Runtime::set_deployment`]).
    pub async fn rollback(
        &self,
        script_id: &str,
        version: Option<u64>,
    ) -> Result<ScriptMeta, VersionError> {
        let version = match version {
            Some(v) => v,
            None => {
                let list = self.versions(script_id).await?;
                let current = list.deployment.first().map(|s| s.version).unwrap_or(1);
                list.versions
                    .iter()
                    .map(|m| m.number())
                    .filter(|v| *v < current)
                    .max()
                    .ok_or_else(|| VersionError::NoEarlierVersion {
                        script_id: script_id.into(),
                        current,
                    })?
            }
        };
        self.set_deployment(
            script_id,
            &[Share {
                version,
                percent: 100,
            }],
        )
        .await
    }

    /// Version `version`'s metadata, given the current deployment
    /// `current` (a deployment from before versions is version 1).
    async fn version_meta(
        &self,
        current: &ScriptMeta,
        version: u64,
    ) -> Result<Option<ScriptMeta>, StoreError> {
        if current.version == 0 {
            return Ok((version == 1).then(|| ScriptMeta {
                version: 1,
                latest_version: 1,
                ..current.clone()
            }));
        }
        // One record and its blob (checked: a version whose source is
        // damaged is not rolled back to), not every version's record.
        let found = self
            .inner
            .store
            .get_version(&current.script_id, version)
            .await?;
        Ok(found.map(|(meta, _)| meta))
    }
}

/// Unix time now, in milliseconds.
fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}
