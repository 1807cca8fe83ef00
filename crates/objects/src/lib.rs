//! Durable Objects' storage: object IDs, each object's transactional
//! key-value storage, and how its writes become durable and stay fenced.
//!
//! # The model
//!
//! A Durable Object is `(script, class, id)`: a [`Namespace`] (the Worker's
//! script and the exported class) and an [`ObjectId`]. At most one live
//! instance of an object may exist in the cluster, serving one request at a
//! time, with storage no other instance writes. The parts of that promise
//! live in different places:
//!
//! - **Placement** is the ring's: an object's home is the node the
//!   consistent-hash ring names for [`ObjectKey::ring_key`]. This crate does
//!   not place anything.
//! - **The input gate** is the host's: it keeps one request at a time per
//!   object (a per-object lock around the instance). [`ObjectStorage`]'s
//!   methods take `&mut self`, so the type system carries the same rule.
//! - **The output gate** is [`ObjectStorage::flush`]: writes are visible to
//!   the object at once (its working copy is an in-memory SQLite database),
//!   and durable only once `flush` returns `Ok`. The host flushes before a
//!   response head leaves and before the object's outgoing requests; when
//!   `flush` fails the client gets an error and the instance is discarded,
//!   so nothing outside ever saw a write that was lost. Before a response
//!   head the host calls [`ObjectStorage::confirm`] instead: it flushes
//!   pending writes, or, for a request that wrote nothing, reads the fence
//!   to confirm the owner still owns the object, so nothing outside sees a
//!   read served from a superseded owner's stale working copy either.
//!
//! # Durability: segments, snapshots, heads
//!
//! The writes made since the last flush form a *segment* (puts, deletes,
//! delete-alls, in order), encoded with postcard and stored in a
//! [`BlobStore`] (S3 in a cluster) under its blake3 hash, so blobs never
//! collide and never need overwriting. Every so often (more than
//! [`COMPACT_AFTER_SEGMENTS`] segments, or segments heavier than the
//! snapshot) a flush writes a *snapshot* instead: the whole SQLite database,
//! serialized.
//!
//! What makes a blob part of the object's state is its *head*
//! ([`Head`]): the owner's epoch, the snapshot's hash, the segments' hashes
//! in order, and the object's byte count. The head is advanced by
//! compare-and-swap in a [`Fence`], and that CAS is the commit point: a
//! segment that no head names is never applied (it is garbage, harmless).
//!
//! # Epochs and fencing
//!
//! [`Objects::open`] *claims* the object: the fence gives it a new epoch,
//! greater than every earlier one, and a token that only the claim holds.
//! Any older owner (a node partitioned away that still believes it is the
//! home) holds a stale token: its next flush fails with
//! [`StorageError::Superseded`] and leaves the head untouched, so the new
//! owner, and every later one, restores state without the old owner's late
//! writes. An old owner that only reads learns the same from
//! [`ObjectStorage::confirm`] (one [`Fence::check`]) before it answers.
//! Then the host shuts the old instance down.
//!
//! The head lives in the fence store, not in the object store, because the
//! object store cannot fence: Garage (hearth's S3 server in tests and
//! self-hosting) ignores S3's conditional writes (`If-None-Match: *` and a
//! wrong `If-Match` both succeed and overwrite), so two owners could both
//! "win" a head kept there. The fence store is one that offers real
//! compare-and-swap: [`SqliteFence`], an SQLite file for nodes on one
//! machine (it works across processes), or [`EtcdFence`] for machines that
//! share no disk. Bulk state stays in the object store, where
//! content-addressed keys mean two owners never write the same key with
//! different bytes.
//!
//! # The API
//!
//! A node builds one [`Objects`] from a fence, a blob store and its
//! [`StorageLimits`]; [`Objects::open`] returns an [`ObjectStorage`] for a
//! resident object: `get`/`put`/`delete` (batches), `list`
//! ([`ListOptions`]: Cloudflare's semantics), `delete_all`, transactions,
//! `flush`. Every write is checked against the limits (Cloudflare's key,
//! value and batch sizes, and a per-object total) with an error that names
//! the limit.
//!
//! Each object may have one **alarm** (a time): set and deleted through
//! its storage like any write ([`ObjectStorage::set_alarm`]), kept in its
//! head, and found without loading objects by [`Objects::due_alarms`]
//! (the fence indexes heads by alarm time), which a node's alarm
//! scheduler polls.
//!
//! Not here: `sql.exec`, and garbage collection of blobs that no
//! head names any more.

mod blob;
mod error;
mod etcd;
mod fence;
mod id;
mod segment;
mod sqlite_fence;
mod storage;

use std::sync::Arc;

pub use blob::{BlobStore, DirBlobStore, MemoryBlobStore, blob_hash};
pub use error::{IdError, ObjectsError, StorageError};
pub use etcd::EtcdFence;
pub use fence::{BlobRef, Claim, Fence, Head};
pub use id::{Namespace, ObjectId, ObjectKey, RING_KEY_PREFIX};
pub use sqlite_fence::SqliteFence;
pub use storage::{ListOptions, ObjectStorage, StorageLimits};

/// A flush writes a snapshot instead of a segment once the head names this
/// many segments (or the segments outweigh the snapshot), so a restore
/// replays a bounded number of segments.
pub const COMPACT_AFTER_SEGMENTS: usize = 32;

/// A node's access to Durable Objects' storage: where heads are fenced,
/// where blobs are kept, and the limits every object's storage enforces.
///
/// Cheap to clone (shared handles); one per node.
#[derive(Clone)]
pub struct Objects {
    fence: Arc<dyn Fence>,
    blobs: Arc<dyn BlobStore>,
    limits: StorageLimits,
}

impl std::fmt::Debug for Objects {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Objects")
            .field("limits", &self.limits)
            .finish_non_exhaustive()
    }
}

impl Objects {
    /// Objects whose heads are fenced in `fence` and whose segments and
    /// snapshots are kept in `blobs`, each object held to `limits`.
    pub fn new(fence: Arc<dyn Fence>, blobs: Arc<dyn BlobStore>, limits: StorageLimits) -> Self {
        Self {
            fence,
            blobs,
            limits,
        }
    }

    /// The limits every opened object's storage enforces.
    pub fn limits(&self) -> &StorageLimits {
        &self.limits
    }

    /// Makes this node the object's owner and loads its state: claims a new
    /// epoch in the fence (from then on, any earlier owner's flush fails
    /// with [`StorageError::Superseded`]), then restores the head's
    /// snapshot and segments into a fresh in-memory database.
    ///
    /// Call it once per residency: the returned storage is the only one
    /// that may write the object until another `open` (here or on another
    /// node) supersedes it. The claim comes first, so an error after it (a
    /// blob store down) leaves no owner that can write; the next `open`
    /// claims again.
    pub async fn open(&self, key: &ObjectKey) -> Result<ObjectStorage, ObjectsError> {
        let ring_key = key.ring_key();
        let claim = self.fence.claim(&ring_key).await?;
        let snapshot = match &claim.head.snapshot {
            Some(blob) => Some(self.fetch(blob).await?),
            None => None,
        };
        let mut segments = Vec::with_capacity(claim.head.segments.len());
        for blob in &claim.head.segments {
            segments.push(self.fetch(blob).await?);
        }
        ObjectStorage::restore(
            ring_key,
            claim,
            snapshot.as_deref(),
            &segments,
            self.limits.clone(),
            Arc::clone(&self.fence),
            Arc::clone(&self.blobs),
        )
    }

    /// The objects whose alarm is due at `now_ms` (milliseconds since the
    /// Unix epoch), earliest first, at most `limit`: `(ring key, alarm
    /// time)` pairs as the fence holds them, whoever owns the objects.
    pub async fn due_alarms(
        &self,
        now_ms: u64,
        limit: usize,
    ) -> Result<Vec<(String, u64)>, ObjectsError> {
        self.fence.due_alarms(now_ms, limit).await
    }

    /// A blob the head names, checked against its hash: a head that names
    /// a missing or altered blob is an error, never a silent partial state.
    async fn fetch(&self, blob: &BlobRef) -> Result<Vec<u8>, ObjectsError> {
        let bytes = self
            .blobs
            .get(&blob.hash)
            .await?
            .ok_or_else(|| ObjectsError::MissingBlob(blob.hash.clone()))?;
        if blob_hash(&bytes) != blob.hash {
            return Err(ObjectsError::Corrupt(format!(
                "blob {} does not match its hash",
                blob.hash
            )));
        }
        Ok(bytes)
    }
}
