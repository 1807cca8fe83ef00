//! The records the store keeps, shared by everything that reads them:
//! [`ScriptMeta`], what is recorded about one deployed version of a
//! script, and the parts it is made of that are not a concept of their own
//! ([`Share`], one version's part of a split; [`Sealed`], a secret as
//! stored).
//!
//! A store ([`crate::store::script_store`], [`crate::store::s3_store`]) writes
//! and reads these records as JSON; the concepts that give them meaning read
//! them here: [`crate::store::versions`] (numbers, splits),
//! [`crate::store::secrets`] (vars and sealed secrets, [`SecretRecord`]),
//! [`crate::store::misses`] (what a lookup found), and the runtime that loads a
//! Worker from them. Fields added later have serde defaults, so metadata
//! written by an older node still reads. What is written and read as bytes,
//! signed, is [`crate::store::records`]'s.

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::error::StoreError;
use crate::instances::lifecycle::LifecycleChoice;
use crate::limits::Plan;
use crate::outbound::bindings::Bindings;

/// What is recorded about a deployed script.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ScriptMeta {
    /// The script ID (a DNS label).
    pub script_id: String,
    /// The plan whose limits apply.
    pub plan: Plan,
    /// Size of the source in bytes.
    pub size: u64,
    /// Size gzip-compressed (level 6), the measure the size limit uses.
    pub compressed_size: u64,
    /// blake3 of the source, hex.
    pub hash: String,
    /// Unix time of the deploy, in milliseconds.
    pub deployed_at_ms: u64,
    /// Whether instances are reused, as decided at deploy
    /// ([`crate::instances::lifecycle`]).
    #[serde(default)]
    pub lifecycle: LifecycleChoice,
    /// The Workers it may call, and its outbound and tail Workers
    /// ([`crate::outbound::bindings`]).
    #[serde(default, skip_serializing_if = "Bindings::is_empty")]
    pub bindings: Bindings,
    /// Its vars, in the clear ([`crate::store::secrets`]).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub vars: BTreeMap<String, String>,
    /// The names of its secrets as the store lists them when the
    /// deployment is read ([`crate::store::secrets`]). Never part of a
    /// record: a secret belongs to the script, not to a version, so a
    /// rollback or a split keeps today's secrets. The admin API shows
    /// these names, never a value.
    #[serde(default, skip_serializing_if = "Vec::is_empty", skip_deserializing)]
    pub secrets: Vec<String>,
    /// A digest of its secret records as listed (each name, and what
    /// changes when it is written), empty without secrets: part of
    /// [`ScriptMeta::revision`], so a secret change is picked up like a
    /// deploy. Not stored.
    #[serde(skip)]
    pub secrets_tag: String,
    /// The sealed secrets a record written before secrets had records of
    /// their own carried: read only to move them into their records
    /// ([`crate::store::records::Records::upgrade`]), and never written.
    #[serde(rename = "secrets", default, skip_serializing)]
    pub(crate) legacy_secrets: BTreeMap<String, Sealed>,
    /// Whether it was read from a record that authenticated (false for a
    /// record accepted without a MAC while upgrading, see
    /// [`crate::store::records`], and for metadata not read from a store).
    #[serde(skip)]
    pub(crate) signed: bool,
    /// A user Worker, served only as a nested call, never as a flow's
    /// entry ([`crate::store::manifest`]).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub dispatch_only: bool,
    /// Its version number ([`crate::store::versions`]); 0 in metadata written
    /// before versions existed, which counts as version 1
    /// ([`ScriptMeta::number`]).
    #[serde(default)]
    pub version: u64,
    /// The highest version number given to this script so far (in the
    /// current deployment: the next deploy is one more, even after a
    /// rollback).
    #[serde(default)]
    pub latest_version: u64,
    /// In the current deployment, the versions that share the traffic
    /// and their percentages (empty: this version takes it all). This
    /// version is one of them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub split: Vec<Share>,
}

/// Whether `hash` is a source hash as a deploy writes it: blake3, 64
/// lowercase hex digits. Metadata comes from a directory or bucket that
/// others can write, and its hash names files (the source's blob, its
/// artifact), so nothing else may be joined into a path.
pub fn is_source_hash(hash: &str) -> bool {
    hash.len() == 64 && hash.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

impl ScriptMeta {
    /// What a node compares to tell whether its warm copy is current: the
    /// source hash, and a digest of the vars and of the secret records
    /// ([`ScriptMeta::secrets_tag`]) when there are any (so changing them
    /// takes effect like a redeploy). What a deploy
    /// or a secret change announces to the other members.
    /// The version number and the split are part of it, so a rollback or
    /// a new split is announced and picked up like a deploy.
    pub fn revision(&self) -> String {
        let mut rev = self.hash.clone();
        if !(self.vars.is_empty() && self.secrets_tag.is_empty()) {
            let mut h = blake3::Hasher::new();
            // Serializing a map of strings and a string cannot fail.
            h.update(&serde_json::to_vec(&(&self.vars, &self.secrets_tag)).unwrap_or_default());
            rev = format!("{rev}+{}", &h.finalize().to_hex()[..16]);
        }
        if self.version > 0 {
            rev = format!("{rev}@v{}", self.version);
        }
        for s in &self.split {
            rev = format!("{rev}/{}:{}", s.version, s.percent);
        }
        rev
    }

    /// Its version number: [`ScriptMeta::version`], and 1 for metadata
    /// written before versions existed.
    pub fn number(&self) -> u64 {
        self.version.max(1)
    }

    /// Parses metadata read from `path` (a file or an object key), refusing
    /// a hash that is not [`is_source_hash`] with [`StoreError::BadHash`].
    pub(crate) fn parse(path: &Path, bytes: &[u8]) -> Result<ScriptMeta, StoreError> {
        let meta: ScriptMeta = serde_json::from_slice(bytes).map_err(|e| StoreError::Corrupt {
            path: path.to_path_buf(),
            message: e.to_string(),
        })?;
        if !is_source_hash(&meta.hash) {
            return Err(StoreError::BadHash {
                path: path.to_path_buf(),
                hash: meta.hash.chars().take(80).collect(),
            });
        }
        Ok(meta)
    }
}

/// One version's share of a split deployment.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Share {
    /// The version.
    pub version: u64,
    /// Its percentage of the requests (1–100).
    pub percent: u8,
}

impl std::fmt::Display for Share {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}@{}%", self.version, self.percent)
    }
}

/// One secret's record (`secrets/<id>/<NAME>.json`): its sealed value.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SecretRecord {
    /// The value, sealed for this script and name.
    pub sealed: Sealed,
}

/// A secret's value as stored: hex of nonce and ciphertext, sealed and
/// opened by [`crate::store::secrets`]. Its `Debug` shows nothing of it.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Sealed(pub(crate) String);

impl std::fmt::Debug for Sealed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Sealed(..)")
    }
}
