//! Heads and the fence that advances them by compare-and-swap.

use serde::{Deserialize, Serialize};

use crate::error::ObjectsError;

/// A blob the head names: its blake3 hash (the blob store's key) and its
/// length (to weigh segments against the snapshot without fetching them).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BlobRef {
    /// blake3 hash of the blob, 64 lowercase hex digits.
    pub hash: String,
    /// The blob's length in bytes.
    pub len: u64,
}

/// An object's durable state: what a restore loads, in order.
///
/// A head is replaced whole by [`Fence::advance`]; a blob is part of the
/// object's state only while a head names it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Head {
    /// The epoch of the owner that wrote the head: every claim takes a
    /// greater one.
    pub epoch: u64,
    /// The whole database as of some flush (a serialized SQLite file), if
    /// one was written.
    pub snapshot: Option<BlobRef>,
    /// Segments written since the snapshot, oldest first.
    pub segments: Vec<BlobRef>,
    /// The object's stored bytes (keys and values) as of this head.
    pub bytes: u64,
    /// When the object's alarm is due, in milliseconds since the Unix
    /// epoch; `None` when none is set. Kept in the head so it is advanced
    /// by the same compare-and-swap as the writes (a superseded owner
    /// cannot set or clear it), and mirrored by the fence in a form
    /// [`Fence::due_alarms`] finds without loading objects. Absent from
    /// heads written before alarms existed, which decode as `None`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub alarm: Option<u64>,
}

/// What a claim returns: the object's head, with the claimant's new epoch,
/// and the token its advances must present.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claim {
    /// The head as the claim found it, its `epoch` replaced by the new one.
    pub head: Head,
    /// The fence's version of the head after the claim: an advance succeeds
    /// only while the stored head is still at this version.
    pub token: u64,
}

/// Where objects' heads live, advanced by compare-and-swap: the commit
/// point of every flush, and what keeps a superseded owner from writing.
///
/// An implementation must be linearizable per key: a claim and an advance
/// of the same key never both succeed against the same version.
#[async_trait::async_trait]
pub trait Fence: Send + Sync {
    /// Claims `key` for a new owner: stores its head with an epoch greater
    /// than any before and returns it with a fresh token. Every token
    /// handed out earlier for `key` stops working.
    async fn claim(&self, key: &str) -> Result<Claim, ObjectsError>;

    /// Replaces `key`'s head with `head` if the stored head is still at
    /// version `token` (nobody claimed or advanced it since), returning the
    /// new token; [`ObjectsError::Superseded`] otherwise, with nothing
    /// written.
    async fn advance(&self, key: &str, token: u64, head: &Head) -> Result<u64, ObjectsError>;

    /// The objects whose alarm is due at `now_ms` (milliseconds since the
    /// Unix epoch): `(ring key, alarm time)` pairs for heads whose
    /// [`Head::alarm`] is at or before `now_ms`, earliest first, at most
    /// `limit` of them. Read without claiming or loading anything: the
    /// node's alarm scheduler polls it and fires the ones it is home of.
    async fn due_alarms(
        &self,
        now_ms: u64,
        limit: usize,
    ) -> Result<Vec<(String, u64)>, ObjectsError>;

    /// Confirms that the stored head of `key` is still at version `token`
    /// (nobody claimed or advanced it since): `Ok` if so,
    /// [`ObjectsError::Superseded`] otherwise. One read, nothing written:
    /// what an owner that made no write asks before it answers from its
    /// working copy, so a superseded owner never serves a stale read.
    async fn check(&self, key: &str, token: u64) -> Result<(), ObjectsError>;
}

/// A head as stored in a fence (JSON: readable with `sqlite3` or `etcdctl`).
pub(crate) fn encode_head(head: &Head) -> Result<String, ObjectsError> {
    serde_json::to_string(head).map_err(|e| ObjectsError::Corrupt(format!("encoding a head: {e}")))
}

/// A stored head, decoded.
pub(crate) fn decode_head(bytes: &[u8]) -> Result<Head, ObjectsError> {
    serde_json::from_slice(bytes)
        .map_err(|e| ObjectsError::Corrupt(format!("decoding a head: {e}")))
}
