//! The etcd fence: heads in etcd, for nodes that share no disk.
//!
//! Each object's head is one etcd key (`<prefix><ring key>`, the head as
//! JSON). Its `mod_revision` is the fence token: a claim and an advance are
//! etcd transactions that compare the key's `mod_revision` with the one the
//! caller last saw and put the new head only if they are equal; the
//! transaction's revision is the new token. A claim bumps the revision, so
//! every earlier owner's next advance fails its compare: superseded. A
//! check is a range read (keys only) comparing the `mod_revision` with the
//! token, as the transactions' compare does.
//!
//! An object with an alarm also has the key `<prefix>alarms/<ring key>`
//! (its value the alarm time, decimal milliseconds since the Unix epoch),
//! put or deleted in the same transaction as the head, so only the owner
//! whose compare succeeds moves it. [`Fence::due_alarms`] reads the
//! `alarms/` range and keeps the due ones: one range read per poll, which
//! returns every pending alarm of the cluster (fine for thousands; etcd
//! cannot filter by value).
//!
//! Spoken through etcd's v3 JSON gateway (`POST /v3/kv/range`,
//! `/v3/kv/txn` on the client port, keys and values in base64), over the
//! HTTP client hearth already links, rather than through the `etcd-client`
//! crate: its build script runs `protoc` (tonic-prost-build, not
//! optional), which a bare machine with only rustup does not have, and a
//! build script cannot be handed a vendored `protoc` by the crate that
//! depends on it. The gateway is part of every etcd v3 server (3.4 on
//! Debian) and the two calls it needs here are stable.
//!
//! Plain HTTP only: TLS to etcd (and etcd's auth) is not done yet.

use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use bytes::Bytes;
use http_body_util::{BodyExt as _, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use serde_json::{Value, json};

use crate::error::ObjectsError;
use crate::fence::{Claim, Fence, Head, decode_head, encode_head};

/// How long one call to etcd may take before the fence reports it
/// unreachable (and tries the next endpoint).
const CALL_TIMEOUT: Duration = Duration::from_secs(5);
/// The part of the key prefix under which alarm times are kept.
const ALARMS: &str = "alarms/";
/// How many times a claim retries when other claimants keep moving the key
/// between its read and its transaction.
const CLAIM_ATTEMPTS: usize = 16;

/// Heads fenced in etcd (v3 API, through its JSON gateway).
#[derive(Clone)]
pub struct EtcdFence {
    endpoints: Vec<String>,
    prefix: String,
    client: Client<HttpConnector, Full<Bytes>>,
}

impl std::fmt::Debug for EtcdFence {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdFence")
            .field("endpoints", &self.endpoints)
            .field("prefix", &self.prefix)
            .finish_non_exhaustive()
    }
}

impl EtcdFence {
    /// A fence over the etcd cluster at `endpoints` (client URLs such as
    /// `http://10.0.0.5:2379`, tried in order when one is unreachable),
    /// keeping heads under keys that begin with `prefix` (for example
    /// `hearth/objects/`), so clusters can share an etcd.
    pub fn new(
        endpoints: impl IntoIterator<Item = impl Into<String>>,
        prefix: impl Into<String>,
    ) -> Result<Self, ObjectsError> {
        let endpoints: Vec<String> = endpoints
            .into_iter()
            .map(|e| e.into().trim_end_matches('/').to_owned())
            .collect();
        if endpoints.is_empty() {
            return Err(ObjectsError::Invalid("etcd: no endpoint given".to_owned()));
        }
        if let Some(bad) = endpoints.iter().find(|e| !e.starts_with("http://")) {
            return Err(ObjectsError::Invalid(format!(
                "etcd endpoint {bad:?}: only http:// endpoints are supported"
            )));
        }
        let client = Client::builder(TokioExecutor::new()).build_http();
        Ok(Self {
            endpoints,
            prefix: prefix.into(),
            client,
        })
    }

    /// POSTs `body` to `path` on the first endpoint that answers; the
    /// answer's JSON.
    async fn call(&self, path: &str, body: &Value) -> Result<Value, ObjectsError> {
        let body = Bytes::from(body.to_string());
        let mut failures = Vec::new();
        for endpoint in &self.endpoints {
            match tokio::time::timeout(CALL_TIMEOUT, self.call_one(endpoint, path, body.clone()))
                .await
            {
                Ok(Ok(answer)) => return Ok(answer),
                Ok(Err(error)) => failures.push(format!("{endpoint}: {error}")),
                Err(_) => failures.push(format!("{endpoint}: no answer in {CALL_TIMEOUT:?}")),
            }
        }
        Err(ObjectsError::Fence(format!(
            "etcd {path}: {}",
            failures.join("; ")
        )))
    }

    async fn call_one(&self, endpoint: &str, path: &str, body: Bytes) -> Result<Value, String> {
        let request = hyper::Request::post(format!("{endpoint}{path}"))
            .header(hyper::header::CONTENT_TYPE, "application/json")
            .body(Full::new(body))
            .map_err(|e| e.to_string())?;
        let response = self
            .client
            .request(request)
            .await
            .map_err(|e| e.to_string())?;
        let status = response.status();
        let bytes = response
            .into_body()
            .collect()
            .await
            .map_err(|e| e.to_string())?
            .to_bytes();
        if !status.is_success() {
            return Err(format!(
                "status {status}: {}",
                String::from_utf8_lossy(&bytes)
            ));
        }
        serde_json::from_slice(&bytes).map_err(|e| format!("answer is not JSON: {e}"))
    }

    /// The stored head of `key` and its `mod_revision` (0 if absent).
    async fn read(&self, key: &str) -> Result<(Option<Head>, u64), ObjectsError> {
        let answer = self
            .call("/v3/kv/range", &json!({ "key": BASE64.encode(key) }))
            .await?;
        let Some(kv) = answer
            .get("kvs")
            .and_then(Value::as_array)
            .and_then(|kvs| kvs.first())
        else {
            return Ok((None, 0));
        };
        let value = kv.get("value").and_then(Value::as_str).unwrap_or("");
        let value = BASE64
            .decode(value)
            .map_err(|e| ObjectsError::Corrupt(format!("etcd value of {key}: {e}")))?;
        Ok((Some(decode_head(&value)?), number(kv, "mod_revision")?))
    }

    /// The `mod_revision` of `key` (0 if absent), without its value.
    async fn revision(&self, key: &str) -> Result<u64, ObjectsError> {
        let answer = self
            .call(
                "/v3/kv/range",
                &json!({ "key": BASE64.encode(key), "keys_only": true }),
            )
            .await?;
        match answer
            .get("kvs")
            .and_then(Value::as_array)
            .and_then(|kvs| kvs.first())
        {
            Some(kv) => number(kv, "mod_revision"),
            None => Ok(0),
        }
    }

    /// Puts `head` under `ring_key`'s key if its `mod_revision` is still
    /// `revision` (and, in the same transaction, puts or deletes its alarm
    /// key): the new revision, or `None` when the compare failed.
    async fn put_if(
        &self,
        ring_key: &str,
        revision: u64,
        head: &Head,
    ) -> Result<Option<u64>, ObjectsError> {
        let key = BASE64.encode(self.key(ring_key));
        let alarm_key = BASE64.encode(self.alarm_key(ring_key));
        let alarm_op = match head.alarm {
            Some(at) => json!({
                "request_put": { "key": alarm_key, "value": BASE64.encode(at.to_string()) },
            }),
            None => json!({ "request_delete_range": { "key": alarm_key } }),
        };
        let txn = json!({
            "compare": [{
                "key": key,
                "target": "MOD",
                "result": "EQUAL",
                "mod_revision": revision.to_string(),
            }],
            "success": [{
                "request_put": { "key": key, "value": BASE64.encode(encode_head(head)?) },
            }, alarm_op],
        });
        let answer = self.call("/v3/kv/txn", &txn).await?;
        // proto3 JSON leaves out a false `succeeded`.
        if answer.get("succeeded").and_then(Value::as_bool) != Some(true) {
            return Ok(None);
        }
        let header = answer
            .get("header")
            .ok_or_else(|| ObjectsError::Fence("etcd txn answer has no header".to_owned()))?;
        Ok(Some(number(header, "revision")?))
    }

    fn key(&self, key: &str) -> String {
        format!("{}{key}", self.prefix)
    }

    /// Where the alarm time of the object `ring_key` is kept (ring keys
    /// begin with `do:`, so this never names a head).
    fn alarm_key(&self, ring_key: &str) -> String {
        format!("{}{ALARMS}{ring_key}", self.prefix)
    }
}

/// An int64 field of etcd's JSON (proto3 JSON writes them as strings).
fn number(object: &Value, field: &str) -> Result<u64, ObjectsError> {
    match object.get(field) {
        None => Ok(0),
        Some(Value::String(text)) => text
            .parse()
            .map_err(|_| ObjectsError::Fence(format!("etcd {field} {text:?} is not a number"))),
        Some(Value::Number(n)) => n
            .as_u64()
            .ok_or_else(|| ObjectsError::Fence(format!("etcd {field} {n} is not a revision"))),
        Some(other) => Err(ObjectsError::Fence(format!(
            "etcd {field} {other} is not a number"
        ))),
    }
}

#[async_trait::async_trait]
impl Fence for EtcdFence {
    async fn claim(&self, ring_key: &str) -> Result<Claim, ObjectsError> {
        let key = self.key(ring_key);
        for _ in 0..CLAIM_ATTEMPTS {
            let (head, revision) = self.read(&key).await?;
            let mut head = head.unwrap_or_default();
            head.epoch += 1;
            if let Some(token) = self.put_if(ring_key, revision, &head).await? {
                return Ok(Claim { head, token });
            }
        }
        Err(ObjectsError::Fence(format!(
            "etcd: {key} changed under {CLAIM_ATTEMPTS} claims in a row"
        )))
    }

    async fn advance(&self, key: &str, token: u64, head: &Head) -> Result<u64, ObjectsError> {
        self.put_if(key, token, head)
            .await?
            .ok_or(ObjectsError::Superseded)
    }

    async fn due_alarms(
        &self,
        now_ms: u64,
        limit: usize,
    ) -> Result<Vec<(String, u64)>, ObjectsError> {
        let start = format!("{}{ALARMS}", self.prefix);
        let mut end = start.clone().into_bytes();
        // The range end: the prefix with its last byte incremented ('/'
        // becomes '0'), so the range is every key that begins with it.
        if let Some(last) = end.last_mut() {
            *last += 1;
        }
        let answer = self
            .call(
                "/v3/kv/range",
                &json!({ "key": BASE64.encode(&start), "range_end": BASE64.encode(&end) }),
            )
            .await?;
        let mut due = Vec::new();
        for kv in answer
            .get("kvs")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let field = |name: &str| -> Result<String, ObjectsError> {
                let text = kv.get(name).and_then(Value::as_str).unwrap_or("");
                let bytes = BASE64
                    .decode(text)
                    .map_err(|e| ObjectsError::Corrupt(format!("etcd alarm {name}: {e}")))?;
                String::from_utf8(bytes)
                    .map_err(|_| ObjectsError::Corrupt(format!("etcd alarm {name} is not UTF-8")))
            };
            let key = field("key")?;
            let Some(ring_key) = key.strip_prefix(&start) else {
                continue;
            };
            let at: u64 = field("value")?.parse().map_err(|_| {
                ObjectsError::Corrupt(format!("etcd alarm of {ring_key} is not a time"))
            })?;
            if at <= now_ms {
                due.push((ring_key.to_owned(), at));
            }
        }
        due.sort_by_key(|(_, at)| *at);
        due.truncate(limit);
        Ok(due)
    }

    async fn check(&self, key: &str, token: u64) -> Result<(), ObjectsError> {
        // A claim or an advance by anyone moves the key's mod_revision
        // past the token; a deleted key has none (0), never a token.
        let revision = self.revision(&self.key(key)).await?;
        if revision != 0 && revision == token {
            Ok(())
        } else {
            Err(ObjectsError::Superseded)
        }
    }
}
