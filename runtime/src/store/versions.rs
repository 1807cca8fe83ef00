//! Versions, rollback and gradual rollout.
//!
//! **A version** is an immutable record of one deploy: its number (1, 2,
//! 3… per script, never reused), the source hash, and the plan, bindings,
//! vars, lifecycle and deploy time as deployed: a [`ScriptMeta`] with
//! [`ScriptMeta::version`] set, kept in the store under
//! `versions/<id>/<n>.json` ([`crate::store::script_store`]), signed like
//! every record ([`crate::store::records`]). Every deploy makes one.
//! Sources are content-addressed, so versions with the same code share one
//! blob.
//!
//! **Secrets are not part of a version** (unlike Cloudflare, where a
//! secret change is a new version and a rollback rolls it back): they are
//! the script's, one record each ([`crate::store::secrets`]). A secret
//! change writes no version; a rollback or a split runs the earlier code
//! with *today's* secrets; a deleted secret stays deleted whatever version
//! serves; a rotated one is rotated for every version. So a rollback
//! cannot bring back a credential that was revoked, and the code of an
//! earlier version must work with the secrets as they are now.
//!
//! **Numbers without races**: nodes deploy concurrently and S3 overwrites
//! (Garage ignores conditional writes), so a deploy claims its number
//! before writing its record, and two nodes never write the same version
//! (the protocol is in [`crate::store::records`]). A number whose claim
//! lost, or whose deploy crashed, is skipped, so numbers have gaps then.
//!
//! **Pruning**: each deploy keeps the latest
//! [`crate::RuntimeConfig::keep_versions`] versions on record (default
//! [`crate::limits::DEFAULT_KEEP_VERSIONS`]) and deletes older version
//! records, except the ones the deployment serves; a rollback or a split
//! can name only versions on record. Source blobs are not deleted (they
//! are shared by content, and a concurrent deploy may be reusing one).
//!
//! **The current deployment** (`scripts/<id>.json`) is the metadata of
//! one version, plus, during a gradual rollout, a *split*: two or more
//! versions with percentages summing to 100 ([`Share`]). A deploy makes
//! its new version current at 100% (ending any split); a rollback makes
//! an earlier version current at 100% (by default the highest-numbered
//! version below the current one); `versions deploy` sets a split, whose
//! first entry is the version whose metadata is current. Neither a
//! rollback nor a split writes a version: they only replace the current
//! deployment.
//!
//! **Which version serves a request** during a split: the request's *key*
//! ([`split_key`]) is hashed with the script ID into 100 buckets, and the
//! shares take consecutive buckets in the order given (`7@10% 6@90%`:
//! buckets 0–9 are version 7, 10–99 version 6). The key is the
//! `hearth-version-key` request header if the client (or a proxy in
//! front) sends one (not an `x-hearth-…` name: front doors drop those, as
//! only the host sets them; Cloudflare's is
//! `Cloudflare-Workers-Version-Key`), else the first address in
//! `x-forwarded-for`; so one
//! client sticks to one version, on every node, and for the same split
//! always. A request with neither is placed at random (no stickiness).
//! The key is hashed, never stored or logged.
//!
//! **On a node** the resident Worker of a script is its current version;
//! the other versions of a split are loaded beside it, on first use, and
//! are dropped with it (their memory counts as its). Every response a
//! Worker serves carries `x-hearth-version: N` ([`VERSION_HEADER`]).
//! During a split each node counts requests and errors (5xx or a failed
//! invocation) per version ([`VersionCounters`]), shown by
//! `GET /v1/scripts/{id}/versions` and in `/metrics` as
//! `hearth_version_requests_total{script,version,outcome}`, only for
//! scripts with a split (label cardinality stays at the scripts being
//! rolled out times their versions).
//!
//! **Propagation**: a rollback or a new split changes the current
//! deployment's [`ScriptMeta::revision`] (it names the version and the
//! split), and is announced to every member exactly like a deploy, so it
//! takes effect everywhere within the same bound.
//!
//! **Old stores**: a script deployed before versions existed has no
//! number: it is version 1 ([`ScriptMeta::number`]), and the first deploy
//! after the upgrade records it as such before writing version 2.

use std::collections::HashMap;
use std::sync::Mutex;

use serde::Serialize;

use crate::store::meta::{ScriptMeta, Share};

/// The response header naming the version that served a request.
pub const VERSION_HEADER: &str = "x-hearth-version";

/// The request header that picks a client's version during a split.
pub const VERSION_KEY_HEADER: &str = "hearth-version-key";

/// Scripts whose per-version counters a node keeps at once; a script with
/// a split beyond that is served but not counted.
pub const MAX_COUNTED_SCRIPTS: usize = 10_000;

// Parsing belongs with the split's other checks and its error.
impl std::str::FromStr for Share {
    type Err = VersionError;

    /// Parses `7@10%` (the `%` is optional).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || VersionError::BadSplit(format!("{s:?} is not VERSION@PERCENT%, e.g. 7@10%"));
        let (v, p) = s.split_once('@').ok_or_else(bad)?;
        let p = p.strip_suffix('%').unwrap_or(p);
        Ok(Share {
            version: v.trim().parse().map_err(|_| bad())?,
            percent: p.trim().parse().map_err(|_| bad())?,
        })
    }
}

/// Why versions could not be listed, or a rollback or split not made.
#[derive(Debug, thiserror::Error)]
pub enum VersionError {
    /// No Worker of that name is deployed.
    #[error("no Worker named {0:?} is deployed")]
    UnknownScript(String),
    /// The split names a version that is not recorded.
    #[error("{script_id} has no version {version} (see `hearth versions list {script_id}`)")]
    NoSuchVersion {
        /// The script.
        script_id: String,
        /// The version asked for.
        version: u64,
    },
    /// A rollback without a version, from the lowest version.
    #[error("{script_id} is at version {current}: there is no earlier version to roll back to")]
    NoEarlierVersion {
        /// The script.
        script_id: String,
        /// Its current version.
        current: u64,
    },
    /// The split is malformed (percentages, duplicates, syntax).
    #[error("bad split: {0}")]
    BadSplit(String),
    /// The script store failed.
    #[error(transparent)]
    Store(#[from] crate::error::StoreError),
}

/// Checks a split as given: one to ten shares, each 1–100%, no version
/// twice, summing to 100.
pub fn check_split(shares: &[Share]) -> Result<(), VersionError> {
    if shares.is_empty() {
        return Err(VersionError::BadSplit("no versions given".into()));
    }
    if shares.len() > 10 {
        return Err(VersionError::BadSplit(format!(
            "{} versions: at most 10",
            shares.len()
        )));
    }
    for (i, s) in shares.iter().enumerate() {
        if s.percent == 0 || s.percent > 100 {
            return Err(VersionError::BadSplit(format!(
                "{s}: a share is 1% to 100%"
            )));
        }
        if shares[..i].iter().any(|o| o.version == s.version) {
            return Err(VersionError::BadSplit(format!(
                "version {} is named twice",
                s.version
            )));
        }
    }
    let sum: u32 = shares.iter().map(|s| u32::from(s.percent)).sum();
    if sum != 100 {
        let list: Vec<String> = shares.iter().map(Share::to_string).collect();
        return Err(VersionError::BadSplit(format!(
            "{} sum to {sum}%, not 100%",
            list.join(" ")
        )));
    }
    Ok(())
}

/// The split key of a request (see the module docs): the
/// `hearth-version-key` header, else the first `x-forwarded-for`
/// address; `None` if it has neither.
pub fn split_key(headers: &http::HeaderMap) -> Option<&[u8]> {
    if let Some(v) = headers.get(VERSION_KEY_HEADER) {
        return Some(v.as_bytes());
    }
    let xff = headers.get("x-forwarded-for")?.as_bytes();
    let first = xff.split(|b| *b == b',').next()?.trim_ascii();
    (!first.is_empty()).then_some(first)
}

/// The bucket (0–99) of `key` for `script_id`.
pub fn bucket(script_id: &str, key: &[u8]) -> u8 {
    let mut h = blake3::Hasher::new();
    h.update(script_id.as_bytes());
    h.update(&[0]);
    h.update(key);
    let b = h.finalize();
    let mut first = [0u8; 8];
    first.copy_from_slice(&b.as_bytes()[..8]);
    (u64::from_le_bytes(first) % 100) as u8
}

/// The version of `split` that serves bucket `bucket`.
pub fn pick(split: &[Share], bucket: u8) -> Option<u64> {
    let mut upto = 0u32;
    for s in split {
        upto += u32::from(s.percent);
        if u32::from(bucket) < upto {
            return Some(s.version);
        }
    }
    split.last().map(|s| s.version)
}

/// The version of `meta`'s deployment that serves a request with
/// `headers`: its own if it has no split.
pub fn choose(meta: &ScriptMeta, headers: &http::HeaderMap) -> u64 {
    if meta.split.is_empty() {
        return meta.number();
    }
    let b = match split_key(headers) {
        Some(key) => bucket(&meta.script_id, key),
        None => (random_u64() % 100) as u8,
    };
    pick(&meta.split, b).unwrap_or_else(|| meta.number())
}

/// A random number for a request without a split key.
fn random_u64() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0),
    );
    h.finish()
}

/// One version's counts on this node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct VersionCount {
    /// The version.
    pub version: u64,
    /// Requests it served.
    pub requests: u64,
    /// Of those, the ones that failed (a 5xx, or the invocation failed).
    pub errors: u64,
}

/// Per-version request and error counts of the scripts being rolled out
/// on this node (see the module docs): only versions of the current split
/// are kept.
#[derive(Debug, Default)]
pub struct VersionCounters {
    map: Mutex<HashMap<String, Vec<VersionCount>>>,
}

impl VersionCounters {
    /// Counts a request of `script_id` served by `version` under `split`
    /// (counts of versions no longer in it are dropped).
    pub fn record(&self, script_id: &str, split: &[Share], version: u64, error: bool) {
        let mut map = self.map.lock().unwrap_or_else(|p| p.into_inner());
        if !map.contains_key(script_id) && map.len() >= MAX_COUNTED_SCRIPTS {
            return;
        }
        let counts = map.entry(script_id.to_string()).or_default();
        counts.retain(|c| split.iter().any(|s| s.version == c.version));
        let c = match counts.iter_mut().position(|c| c.version == version) {
            Some(i) => &mut counts[i],
            None => {
                counts.push(VersionCount {
                    version,
                    requests: 0,
                    errors: 0,
                });
                counts.sort_by_key(|c| c.version);
                let i = counts
                    .iter()
                    .position(|c| c.version == version)
                    .unwrap_or(0);
                &mut counts[i]
            }
        };
        c.requests += 1;
        c.errors += u64::from(error);
    }

    /// Forgets `script_id`'s counts (its split ended here).
    pub fn forget(&self, script_id: &str) {
        self.map
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(script_id);
    }

    /// `script_id`'s counts, lowest version first.
    pub fn of(&self, script_id: &str) -> Vec<VersionCount> {
        self.map
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(script_id)
            .cloned()
            .unwrap_or_default()
    }

    /// Every counted script's counts, by script ID.
    pub fn snapshot(&self) -> Vec<(String, Vec<VersionCount>)> {
        let mut out: Vec<_> = self
            .map
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        out.sort_by(|a, b| a.0.cmp(&b.0));
        out
    }
}

/// What `GET /v1/scripts/{id}/versions` answers.
#[derive(Debug, Clone, Serialize)]
pub struct VersionList {
    /// The script.
    pub script_id: String,
    /// The current deployment: one version at 100%, or a split.
    pub deployment: Vec<Share>,
    /// Every recorded version, lowest first.
    pub versions: Vec<ScriptMeta>,
    /// This node's request and error counts per version of the split
    /// (empty without one).
    pub counts: Vec<VersionCount>,
}

/// The current deployment of `current` as shares.
pub fn deployment_of(current: &ScriptMeta) -> Vec<Share> {
    if current.split.is_empty() {
        vec![Share {
            version: current.number(),
            percent: 100,
        }]
    } else {
        current.split.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn split(s: &str) -> Vec<Share> {
        s.split_whitespace()
            .map(|p| p.parse().expect("share"))
            .collect()
    }

    #[test]
    fn shares_parse_and_splits_are_checked() {
        assert_eq!(
            split("7@10% 6@90"),
            vec![
                Share {
                    version: 7,
                    percent: 10
                },
                Share {
                    version: 6,
                    percent: 90
                }
            ]
        );
        assert!("7".parse::<Share>().is_err());
        assert!("x@10%".parse::<Share>().is_err());
        assert!("7@300%".parse::<Share>().is_err());
        check_split(&split("7@10% 6@90%")).expect("valid");
        check_split(&split("3@100%")).expect("valid");
        for bad in ["7@10% 6@80%", "7@50% 7@50%", "7@0% 6@100%", ""] {
            let e = check_split(&split(bad)).expect_err(bad);
            assert!(matches!(e, VersionError::BadSplit(_)), "{bad}: {e}");
        }
        let e = check_split(&split("7@10% 6@80%")).expect_err("sum");
        assert!(e.to_string().contains("sum to 90%"), "{e}");
    }

    #[test]
    fn one_key_sticks_to_one_version_and_the_split_is_near_its_percentages() {
        let s = split("7@10% 6@90%");
        let mut sevens = 0;
        let n = 2000;
        for i in 0..n {
            let key = format!("client-{i}");
            let v = pick(&s, bucket("app", key.as_bytes())).expect("version");
            // The same key always lands on the same version.
            for _ in 0..3 {
                assert_eq!(pick(&s, bucket("app", key.as_bytes())), Some(v));
            }
            sevens += usize::from(v == 7);
        }
        // 10% of 2000 is 200; hashing, so a wide tolerance.
        assert!(
            (140..=260).contains(&sevens),
            "{sevens} of {n} on version 7"
        );
    }

    #[test]
    fn the_key_is_the_version_key_header_else_the_first_forwarded_address() {
        let mut h = http::HeaderMap::new();
        assert_eq!(split_key(&h), None);
        h.insert(
            "x-forwarded-for",
            "203.0.113.7, 10.0.0.1".parse().expect("v"),
        );
        assert_eq!(split_key(&h), Some(&b"203.0.113.7"[..]));
        h.insert(VERSION_KEY_HEADER, "user-42".parse().expect("v"));
        assert_eq!(split_key(&h), Some(&b"user-42"[..]));
    }

    #[test]
    fn counters_keep_only_the_versions_of_the_split() {
        let c = VersionCounters::default();
        let s = split("2@50% 1@50%");
        c.record("app", &s, 2, false);
        c.record("app", &s, 1, true);
        c.record("app", &s, 1, false);
        assert_eq!(
            c.of("app"),
            vec![
                VersionCount {
                    version: 1,
                    requests: 2,
                    errors: 1
                },
                VersionCount {
                    version: 2,
                    requests: 1,
                    errors: 0
                }
            ]
        );
        c.record("app", &split("3@50% 2@50%"), 3, false);
        let versions: Vec<u64> = c.of("app").iter().map(|c| c.version).collect();
        assert_eq!(versions, vec![2, 3]);
    }
}
