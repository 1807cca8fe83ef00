//! A Worker's vars and secrets: named strings its instances read from
//! their environment.
//!
//! # The model
//!
//! *Vars* are deploy settings (`[vars]` in the manifest, `hearth deploy
//! --var NAME=VALUE`, `var=NAME=VALUE` on the admin API): stored in the
//! clear with the script's metadata and replaced by every deploy.
//! *Secrets* are set one at a time after a deploy (`hearth secret put`),
//! belong to the script, not to a version, and are stored **sealed**, one
//! record each (`secrets/<id>/<NAME>.json`, signed like every record,
//! [`crate::store::records`]): each value is encrypted
//! with XChaCha20-Poly1305 (a random 192-bit nonce per value, from the OS, so nonces
//! never need coordinating between nodes) under the node's
//! secrets key, with the script ID and the secret's name as associated
//! data, so a sealed value copied to another name or Worker does not open.
//! The admin API only ever shows their names.
//!
//! Because a secret is a record of its own, a Worker's secrets are always
//! the ones the store holds *now*: a version record carries none, so a
//! deploy keeps them, a rollback or a split serves today's secrets with
//! the earlier code (never the values of that version's day), and a
//! deleted secret stays deleted (its record is gone; no version restores
//! it). A secret change writes no version and replaces no deployment, so
//! it cannot race a deploy on another node: each writes its own records.
//! Two changes of the same secret at once on two nodes: the last write
//! wins. A change is picked up like a deploy: the listing of a script's
//! secret records is part of its revision ([`ScriptMeta::secrets_tag`]).
//! Whoever can write the store can put back a secret's earlier record
//! (signed, so it authenticates): see what store access grants in
//! [`crate::store::records`].
//!
//! The key is derived from the node's artifact key with
//! `blake3::derive_key` (context [`SECRETS_KEY_CONTEXT`]): the artifact key
//! is already the same on every node of a cluster (an S3 store requires it
//! in each node's config; a directory store keeps it in the store), so
//! every member can open what any member sealed without a new setting, and
//! the derivation keeps the two keys independent (the artifact MAC key is
//! never used as a cipher key). Changing `artifact_key` therefore makes the
//! stored secrets unreadable: put them again. A directory store keeps that
//! key in the same directory as the metadata, so there encryption at rest
//! protects copies of the metadata (backups, an S3 bucket's objects), not
//! the directory as a whole.
//!
//! Both kinds reach an instance the same two ways: as environment
//! variables (`wasi:cli/environment`: `std::env::var`, `process.env`,
//! `os.environ`) and through `wasi:config/store` (`get`, `get-all`). A
//! secret is opened once, when the Worker is loaded, into the
//! Worker's environment, whose copies are wiped ([`zeroize`]) when the Worker is
//! dropped; the copies wasmtime's WASI contexts make cannot be.
//!
//! Names are environment-variable-like (`[A-Za-z_][A-Za-z0-9_]*`, at most
//! [`MAX_NAME_BYTES`]) and may not start with `HEARTH_` (the runtime's own,
//! such as `HEARTH_SCRIPT_ID`); a name is a var or a secret, not both. A
//! Worker has at most [`MAX_ENTRIES`] of them together, each value at most
//! [`MAX_VALUE_BYTES`], and its vars at most [`MAX_VARS_BYTES`] together
//! (they travel in the deploy's query string).

use std::collections::BTreeMap;

use chacha20poly1305::aead::{Aead, KeyInit, Payload};
use chacha20poly1305::{XChaCha20Poly1305, XNonce};
use zeroize::Zeroizing;

use crate::store::meta::{ScriptMeta, Sealed};

/// Most vars and secrets one Worker has, together.
pub const MAX_ENTRIES: usize = 64;
/// Longest name of a var or secret, in bytes.
pub const MAX_NAME_BYTES: usize = 64;
/// Largest value of one var or secret, in bytes.
pub const MAX_VALUE_BYTES: usize = 5 * 1024;
/// Most bytes (names and values) of one Worker's vars together.
pub const MAX_VARS_BYTES: usize = 64 * 1024;
/// The prefix of the names the runtime sets itself.
pub const RESERVED_PREFIX: &str = "HEARTH_";
/// The `blake3::derive_key` context of the secrets key.
pub const SECRETS_KEY_CONTEXT: &str = "hearth 2026-12 worker secrets v1 (from artifact_key)";

const NONCE_BYTES: usize = 24;

/// A var or secret that cannot be set.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EnvError {
    /// The name is not environment-variable-like.
    #[error(
        "invalid {kind} name {name:?}: use letters, digits and '_', not starting with a digit, \
         at most {MAX_NAME_BYTES} bytes"
    )]
    BadName {
        /// `var` or `secret`.
        kind: &'static str,
        /// The name as given (cut at 80 characters).
        name: String,
    },
    /// The name is one the runtime sets itself.
    #[error("{kind} name {name:?} is reserved: names starting with {RESERVED_PREFIX} are hearth's")]
    Reserved {
        /// `var` or `secret`.
        kind: &'static str,
        /// The name.
        name: String,
    },
    /// A value is over [`MAX_VALUE_BYTES`].
    #[error("{kind} {name} is {bytes} bytes; the limit is {MAX_VALUE_BYTES} bytes")]
    ValueTooLarge {
        /// `var` or `secret`.
        kind: &'static str,
        /// The name.
        name: String,
        /// Its size.
        bytes: usize,
    },
    /// The vars together are over [`MAX_VARS_BYTES`].
    #[error("the vars are {bytes} bytes together; the limit is {MAX_VARS_BYTES} bytes")]
    VarsTooLarge {
        /// Their size, names and values.
        bytes: usize,
    },
    /// More than [`MAX_ENTRIES`] vars and secrets.
    #[error("{count} vars and secrets; a Worker may have at most {MAX_ENTRIES}")]
    TooMany {
        /// How many there would be.
        count: usize,
    },
    /// The name is a var and a secret at once.
    #[error("{name} is both a var and a secret; a name is one or the other")]
    Conflict {
        /// The name.
        name: String,
    },
    /// A secret's value is not UTF-8.
    #[error("secret {name} is not UTF-8 text")]
    NotText {
        /// The name.
        name: String,
    },
}

/// Why a secret could not be put, deleted or listed.
#[derive(Debug, thiserror::Error)]
pub enum SecretError {
    /// The name or value is refused.
    #[error(transparent)]
    Env(#[from] EnvError),
    /// No Worker of that name is deployed.
    #[error("no Worker named {0:?} is deployed")]
    UnknownScript(String),
    /// The script store failed.
    #[error(transparent)]
    Store(#[from] crate::error::StoreError),
}

/// Checks that `name` may name a var or secret (`kind`).
pub fn check_name(kind: &'static str, name: &str) -> Result<(), EnvError> {
    let mut bytes = name.bytes();
    let first_ok = bytes
        .next()
        .is_some_and(|b| b.is_ascii_alphabetic() || b == b'_');
    if !first_ok
        || name.len() > MAX_NAME_BYTES
        || !bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_')
    {
        return Err(EnvError::BadName {
            kind,
            name: name.chars().take(80).collect(),
        });
    }
    if name.starts_with(RESERVED_PREFIX) {
        return Err(EnvError::Reserved {
            kind,
            name: name.into(),
        });
    }
    Ok(())
}

/// Checks one value's size.
fn check_value(kind: &'static str, name: &str, value: &str) -> Result<(), EnvError> {
    if value.len() > MAX_VALUE_BYTES {
        return Err(EnvError::ValueTooLarge {
            kind,
            name: name.into(),
            bytes: value.len(),
        });
    }
    Ok(())
}

/// Checks a Worker's vars, and that they leave room for and do not
/// collide with `secrets` (the names of its secrets).
pub fn check_vars<'a>(
    vars: &BTreeMap<String, String>,
    secrets: impl IntoIterator<Item = &'a String>,
) -> Result<(), EnvError> {
    let mut total = 0;
    for (name, value) in vars {
        check_name("var", name)?;
        check_value("var", name, value)?;
        total += name.len() + value.len();
    }
    if total > MAX_VARS_BYTES {
        return Err(EnvError::VarsTooLarge { bytes: total });
    }
    let mut count = vars.len();
    for name in secrets {
        count += 1;
        if vars.contains_key(name) {
            return Err(EnvError::Conflict { name: name.clone() });
        }
    }
    if count > MAX_ENTRIES {
        return Err(EnvError::TooMany { count });
    }
    Ok(())
}

/// Why a sealed secret did not open.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "secret {name} of {script_id} does not open with this node's key (was artifact_key changed, \
     or the metadata edited? put the secret again)"
)]
pub struct OpenError {
    /// The Worker.
    pub script_id: String,
    /// The secret.
    pub name: String,
}

/// The key secrets are sealed with (derived from the artifact key). Its
/// bytes are wiped when dropped.
#[derive(Clone)]
pub(crate) struct SecretsKey(Zeroizing<[u8; 32]>);

impl SecretsKey {
    /// The secrets key of a node whose artifact key is `artifact_key`.
    pub(crate) fn derive(artifact_key: &[u8; 32]) -> Self {
        SecretsKey(Zeroizing::new(blake3::derive_key(
            SECRETS_KEY_CONTEXT,
            artifact_key,
        )))
    }

    fn cipher(&self) -> XChaCha20Poly1305 {
        XChaCha20Poly1305::new((&*self.0).into())
    }

    /// Seals `value` as secret `name` of `script_id`.
    pub(crate) fn seal(&self, script_id: &str, name: &str, value: &str) -> Sealed {
        let nonce: [u8; NONCE_BYTES] = rand_nonce();
        let aad = associated(script_id, name);
        // Encryption with a valid key cannot fail for inputs this small.
        let ct = self
            .cipher()
            .encrypt(
                XNonce::from_slice(&nonce),
                Payload {
                    msg: value.as_bytes(),
                    aad: &aad,
                },
            )
            .unwrap_or_default();
        let mut out = String::with_capacity(2 * (NONCE_BYTES + ct.len()));
        for b in nonce.iter().chain(&ct) {
            out.push_str(&format!("{b:02x}"));
        }
        Sealed(out)
    }

    /// Opens secret `name` of `script_id`.
    pub(crate) fn open(
        &self,
        script_id: &str,
        name: &str,
        sealed: &Sealed,
    ) -> Result<Zeroizing<String>, OpenError> {
        let err = || OpenError {
            script_id: script_id.into(),
            name: name.into(),
        };
        let bytes = from_hex(&sealed.0).ok_or_else(err)?;
        if bytes.len() < NONCE_BYTES {
            return Err(err());
        }
        let (nonce, ct) = bytes.split_at(NONCE_BYTES);
        let aad = associated(script_id, name);
        let plain = Zeroizing::new(
            self.cipher()
                .decrypt(XNonce::from_slice(nonce), Payload { msg: ct, aad: &aad })
                .map_err(|_| err())?,
        );
        let text = std::str::from_utf8(&plain).map_err(|_| err())?;
        Ok(Zeroizing::new(text.to_string()))
    }
}

/// A fresh random nonce (from the OS, as the runtime's random keys are).
fn rand_nonce() -> [u8; NONCE_BYTES] {
    let mut nonce = [0; NONCE_BYTES];
    nonce.copy_from_slice(&crate::config::random_key()[..NONCE_BYTES]);
    nonce
}

/// What binds a sealed value to its place: the script and the name.
fn associated(script_id: &str, name: &str) -> Vec<u8> {
    format!("hearth-secret\0{script_id}\0{name}").into_bytes()
}

fn from_hex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect()
}

/// What a Worker's instances see: `HEARTH_SCRIPT_ID` (and, if it has
/// bindings, `HEARTH_SERVICES`, `HEARTH_DISPATCH` and
/// `HEARTH_DURABLE_OBJECTS`: their names, comma-separated), its vars and its opened secrets, as environment
/// variables, and the vars and secrets as `wasi:config/store`.
/// Built once per loaded Worker; the plaintext it holds is wiped on drop.
pub(crate) struct WorkerEnv {
    /// Name and value of each entry, the runtime's own first.
    pub(crate) pairs: Vec<(String, Zeroizing<String>)>,
    /// The same entries for `wasi:config/store` (without the runtime's).
    pub(crate) config: wasmtime_wasi_config::WasiConfigVariables,
}

impl WorkerEnv {
    /// The environment of a Worker: `meta`'s vars, and its script's
    /// `secrets` opened with `key`.
    pub(crate) fn open(
        meta: &ScriptMeta,
        secrets: &BTreeMap<String, Sealed>,
        key: &SecretsKey,
    ) -> Result<Self, OpenError> {
        let mut pairs = vec![(
            "HEARTH_SCRIPT_ID".to_string(),
            Zeroizing::new(meta.script_id.clone()),
        )];
        // The names of its bindings (never their targets), for guests that
        // offer them as objects: the JS engine's `env.AUTH.fetch(request)`.
        // Only when there are some, so other Workers' environments stay as
        // they were.
        let names = |names: Vec<&str>| Zeroizing::new(names.join(","));
        let bindings = &meta.bindings;
        if !bindings.services.is_empty() {
            let services = bindings.services.keys().map(String::as_str).collect();
            pairs.push(("HEARTH_SERVICES".to_string(), names(services)));
        }
        if !bindings.dispatch.is_empty() {
            let namespaces = bindings.dispatch.keys().map(String::as_str).collect();
            pairs.push(("HEARTH_DISPATCH".to_string(), names(namespaces)));
        }
        if !bindings.durable_objects.is_empty() {
            let objects = bindings
                .durable_objects
                .keys()
                .map(String::as_str)
                .collect();
            pairs.push(("HEARTH_DURABLE_OBJECTS".to_string(), names(objects)));
        }
        let own = pairs.len();
        // A name is a var or a secret; should a deploy and a secret put on
        // two nodes at once have made it both, the secret wins.
        for (name, value) in meta.vars.iter().filter(|(n, _)| !secrets.contains_key(*n)) {
            pairs.push((name.clone(), Zeroizing::new(value.clone())));
        }
        for (name, sealed) in secrets {
            pairs.push((name.clone(), key.open(&meta.script_id, name, sealed)?));
        }
        let config = pairs[own..]
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        Ok(WorkerEnv { pairs, config })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_env_var_like_and_bounded() {
        for ok in ["API_BASE", "_x", "a1", &"A".repeat(MAX_NAME_BYTES)] {
            assert_eq!(check_name("var", ok), Ok(()), "{ok}");
        }
        for bad in ["", "1A", "A-B", "A B", "é", &"A".repeat(MAX_NAME_BYTES + 1)] {
            assert!(
                matches!(check_name("var", bad), Err(EnvError::BadName { .. })),
                "{bad}"
            );
        }
        assert!(matches!(
            check_name("secret", "HEARTH_SCRIPT_ID"),
            Err(EnvError::Reserved { .. })
        ));
        let mut vars = BTreeMap::new();
        vars.insert("BIG".to_string(), "x".repeat(MAX_VALUE_BYTES + 1));
        assert!(matches!(
            check_vars(&vars, []),
            Err(EnvError::ValueTooLarge { .. })
        ));
        vars.clear();
        vars.insert("K".to_string(), "v".into());
        let secret = "K".to_string();
        assert!(matches!(
            check_vars(&vars, [&secret]),
            Err(EnvError::Conflict { .. })
        ));
        let many: BTreeMap<String, String> = (0..=MAX_ENTRIES)
            .map(|i| (format!("V{i}"), String::new()))
            .collect();
        assert!(matches!(
            check_vars(&many, []),
            Err(EnvError::TooMany { .. })
        ));
        let big: BTreeMap<String, String> = (0..20)
            .map(|i| (format!("V{i}"), "x".repeat(MAX_VALUE_BYTES)))
            .collect();
        assert!(matches!(
            check_vars(&big, []),
            Err(EnvError::VarsTooLarge { .. })
        ));
    }

    #[test]
    fn the_environment_names_the_bindings_never_their_targets() {
        let key = SecretsKey::derive(&[7; 32]);
        let mut bindings = crate::outbound::bindings::Bindings::default();
        let meta = |bindings: crate::outbound::bindings::Bindings| ScriptMeta {
            script_id: "app".into(),
            plan: crate::Plan::Free,
            size: 0,
            compressed_size: 0,
            hash: String::new(),
            deployed_at_ms: 1,
            lifecycle: Default::default(),
            bindings,
            vars: [("MODE".to_string(), "test".to_string())].into(),
            secrets: Vec::new(),
            secrets_tag: String::new(),
            legacy_secrets: BTreeMap::new(),
            signed: false,
            dispatch_only: false,
            version: 1,
            latest_version: 1,
            split: Vec::new(),
        };
        let secrets: BTreeMap<String, Sealed> =
            [("API_KEY".to_string(), key.seal("app", "API_KEY", "k1"))].into();
        let names = |env: &WorkerEnv| -> Vec<(String, String)> {
            env.pairs
                .iter()
                .map(|(k, v)| (k.clone(), v.as_str().to_string()))
                .collect()
        };
        let pair = |k: &str, v: &str| (k.to_string(), v.to_string());
        // Without bindings: as before.
        let env = WorkerEnv::open(&meta(bindings.clone()), &secrets, &key).expect("open");
        assert_eq!(
            names(&env),
            [
                pair("HEARTH_SCRIPT_ID", "app"),
                pair("MODE", "test"),
                pair("API_KEY", "k1")
            ]
        );
        bindings
            .services
            .insert("auth".into(), "auth-worker".into());
        bindings
            .services
            .insert("billing".into(), "billing-v2".into());
        bindings
            .dispatch
            .insert("users".into(), ["user-a".to_string()].into());
        bindings.durable_objects.insert(
            "COUNTER".into(),
            crate::outbound::bindings::ObjectBinding::new("Counter", Some("other")),
        );
        let env = WorkerEnv::open(&meta(bindings), &secrets, &key).expect("open");
        assert_eq!(
            names(&env),
            [
                pair("HEARTH_SCRIPT_ID", "app"),
                pair("HEARTH_SERVICES", "auth,billing"),
                pair("HEARTH_DISPATCH", "users"),
                pair("HEARTH_DURABLE_OBJECTS", "COUNTER"),
                pair("MODE", "test"),
                pair("API_KEY", "k1"),
            ],
            "binding names, never their targets"
        );
    }

    #[test]
    fn a_sealed_secret_opens_only_in_its_place_and_with_its_key() {
        let key = SecretsKey::derive(&[7; 32]);
        let sealed = key.seal("w", "TOKEN", "hunter2-value");
        assert!(!sealed.0.contains("hunter2"), "stored encrypted");
        assert!(!format!("{sealed:?}").contains(&sealed.0), "Debug hides it");
        assert_eq!(
            key.open("w", "TOKEN", &sealed).expect("opens").as_str(),
            "hunter2-value"
        );
        // Two seals of one value differ (fresh nonces).
        assert_ne!(key.seal("w", "TOKEN", "hunter2-value"), sealed);
        assert!(key.open("w", "OTHER", &sealed).is_err(), "another name");
        assert!(key.open("v", "TOKEN", &sealed).is_err(), "another Worker");
        let other = SecretsKey::derive(&[8; 32]);
        assert!(other.open("w", "TOKEN", &sealed).is_err(), "another key");
        let mut bad = sealed.0.clone();
        bad.replace_range(60..62, if &bad[60..62] == "00" { "01" } else { "00" });
        assert!(key.open("w", "TOKEN", &Sealed(bad)).is_err(), "tampered");
    }
}
