//! Durable Objects on this node: the host side of `hearth:objects`
//! (`wit/hearth-objects/objects.wit`), the `.object.internal` address, and
//! the resident objects.
//!
//! # The model
//!
//! A Worker declares **Durable Object bindings** at deploy: a binding name
//! → a class of its own script or of another
//! ([`crate::outbound::bindings::ObjectBinding`]). An *object* is
//! (script, class, id) ([`ObjectKey`]); its ID is 64 hex digits that the
//! host computes (`hearth:objects/ids`), so every language gets the same
//! IDs, and an ID of one namespace is refused by another.
//!
//! A Worker calls an object with a plain wasi:http request to
//! `http://<binding>.<id>.object.internal/<path>` (the stub's `fetch`). The
//! host resolves the binding beside service bindings
//! ([`crate::outbound::bindings::resolve`]), checks the ID against the
//! binding's namespace, and hands the call to the node's invoker with the
//! object's *ring key* ([`hearth_objects::ObjectKey::ring_key`],
//! `do:<script>/<class>/<id>`) as its target
//! ([`crate::outbound::bindings::CallKind::Object`]): the node routes it to
//! the ring's home of that key, and only there, over the shard hop if need
//! be ([`crate::Runtime::handle`] takes ring keys; a runtime without a node
//! is every object's home). The home serves it on its **resident
//! object**:
//!
//! * **One instance per object.** A resident object holds one instance of
//!   its script of its own (not from the Worker's shared pool; the same
//!   memory and CPU limits as any of the Worker's instances) and the
//!   object's storage ([`hearth_objects::ObjectStorage`], opened with
//!   [`hearth_objects::Objects::open`], which claims the object in the
//!   fence and restores its state).
//! * **The input gate.** A per-object async mutex: one request runs at a
//!   time, from the moment it takes the object until its handler returns
//!   (the response body may still be streaming). Others wait in order, up
//!   to their flow's deadline.
//! * **The output gate.** Writes are visible to the object at once and
//!   durable once flushed. The host flushes before the response head is
//!   released to the caller, before every outgoing request of the object,
//!   and when the handler returns. Before the response head, a request
//!   that wrote nothing has its owner confirmed instead: one read of the
//!   fence says whether another node claimed the object since this one
//!   did ([`hearth_objects::ObjectStorage::confirm`]), so a node that lost
//!   the object (partitioned away while the cluster moved it) never
//!   answers a stale read. A failed flush or confirm answers the caller 503
//!   and discards the instance and its storage (the writes were never
//!   confirmed to anyone).
//! * **Superseded.** Whatever learns that another owner claimed the object
//!   (a flush, the confirm, a storage call after either) shuts this
//!   residency down: the instance and storage are dropped when the request
//!   ends, counted in `objects_superseded`, and the next request here
//!   reopens the object (claims it again, restoring the latest state).
//! * **Eviction.** At most [`ObjectsConfig::max_resident`] objects are
//!   resident per node; past that, the least recently used idle ones (no
//!   request running or waiting) are dropped, and reloaded from storage on
//!   their next request.
//!
//! The guest's `hearth:objects/storage` calls go to the object its
//! invocation runs as (`this-object()`); in a plain Worker request they
//! fail with `not-an-object`. Every call counts against
//! [`ObjectsConfig::ops_per_request`].
//!
//! The header [`OBJECT_URL_HEADER`] on a request to an object carries the
//! URL the caller gave its stub: the object's request has that URL. The
//! header is the host's: it is removed from every request that reaches a
//! Worker any other way ([`crate::flow::strip_host_headers`]).
//!
//! Storage lives in the node's [`hearth_objects::Objects`]: blobs in the
//! runtime's script store (content-addressed by blake3, [`StoreBlobs`]) and
//! heads in the fence the config names ([`ObjectFence`]: an embedded
//! SQLite file under the store directory by default, or etcd).
//!
//! **Alarms** (`objects/alarms.rs`): an object's alarm is a write kept in
//! its head; each node's scheduler polls the fence for due alarms and fires
//! those of objects homed here through the input gate, with the header
//! [`ALARM_HEADER`] (host-only, stripped like [`OBJECT_URL_HEADER`]),
//! retrying failures with backoff; a new home fires what an old one left.
//!
//! Not here yet: `sql.exec` (see docs/durable-objects.md, which also
//! describes placement and failover).

use std::path::PathBuf;
use std::sync::Arc;

use hearth_objects::{ObjectKey, StorageError};

pub(crate) mod alarms;
pub(crate) mod host;
pub(crate) mod resident;

pub use alarms::{ALARM_FIRST_BACKOFF, ALARM_HEADER, ALARM_MAX_RETRIES, ALARM_POLL};
pub use hearth_objects::RING_KEY_PREFIX;
pub use resident::{HomeCheck, NodeObjects};

/// The request header that carries the URL an object's request has (see
/// the module docs); only the host reads it, and it is stripped from every
/// other request.
pub const OBJECT_URL_HEADER: &str = "hearth-object-url";

/// Default of [`ObjectsConfig::max_resident`].
pub const DEFAULT_MAX_RESIDENT: usize = 1000;
/// Default of [`ObjectsConfig::ops_per_request`].
pub const DEFAULT_OPS_PER_REQUEST: u32 = 10_000;
/// Default of [`ObjectsConfig::max_object_bytes`]: 64 MiB.
pub const DEFAULT_MAX_OBJECT_BYTES: u64 = 64 << 20;

/// Where the node's objects' heads are fenced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ObjectFence {
    /// An SQLite file (the default: `<store>/objects/fence.sqlite`). Nodes
    /// that share the file (one machine) share the fence.
    Sqlite(Option<PathBuf>),
    /// etcd, at these endpoints (`http://host:2379`), for nodes that share
    /// no disk.
    Etcd(Vec<String>),
}

/// The node's Durable Objects settings (the `[objects]` section of the
/// node config).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectsConfig {
    /// Where heads are fenced.
    pub fence: ObjectFence,
    /// Objects resident on the node at most (idle ones past it are evicted).
    pub max_resident: usize,
    /// Storage calls one request of an object may make.
    pub ops_per_request: u32,
    /// Bytes of keys and values one object may store.
    pub max_object_bytes: u64,
}

impl Default for ObjectsConfig {
    fn default() -> Self {
        ObjectsConfig {
            fence: ObjectFence::Sqlite(None),
            max_resident: DEFAULT_MAX_RESIDENT,
            ops_per_request: DEFAULT_OPS_PER_REQUEST,
            max_object_bytes: DEFAULT_MAX_OBJECT_BYTES,
        }
    }
}

/// The `hearth-objects` blob store of a node: the runtime's script store's
/// content-addressed blobs (a [`crate::DirStore`] directory, or the S3
/// bucket of an [`crate::S3Store`]).
pub struct StoreBlobs(pub Arc<dyn crate::ScriptStore>);

#[async_trait::async_trait]
impl hearth_objects::BlobStore for StoreBlobs {
    async fn put(&self, hash: &str, bytes: &[u8]) -> Result<(), hearth_objects::ObjectsError> {
        self.0
            .put_blob(hash, bytes)
            .await
            .map_err(|e| hearth_objects::ObjectsError::Blob(e.to_string()))
    }

    async fn get(&self, hash: &str) -> Result<Option<Vec<u8>>, hearth_objects::ObjectsError> {
        self.0
            .get_blob(hash)
            .await
            .map_err(|e| hearth_objects::ObjectsError::Blob(e.to_string()))
    }
}

/// The object one invocation runs as: what its `hearth:objects/storage`
/// calls and the output gate reach.
pub(crate) struct ObjectCtx {
    pub(crate) key: ObjectKey,
    /// The name its ID was made from, if this node saw it.
    pub(crate) name: Option<String>,
    /// The resident object's storage (shared with the next invocations).
    pub(crate) storage: Arc<tokio::sync::Mutex<hearth_objects::ObjectStorage>>,
    ops: std::sync::atomic::AtomicU32,
    ops_limit: u32,
    /// Set once a flush or a confirm failed, or a storage call found the
    /// object superseded: the instance and the storage are dropped when the
    /// invocation ends.
    lost: std::sync::atomic::AtomicBool,
    /// Set once the object learned that another owner claimed it.
    superseded: std::sync::atomic::AtomicBool,
}

impl ObjectCtx {
    pub(crate) fn new(
        key: ObjectKey,
        name: Option<String>,
        storage: Arc<tokio::sync::Mutex<hearth_objects::ObjectStorage>>,
        ops_limit: u32,
    ) -> Self {
        ObjectCtx {
            key,
            name,
            storage,
            ops: Default::default(),
            ops_limit,
            lost: Default::default(),
            superseded: Default::default(),
        }
    }

    /// Counts one storage call against the request's limit.
    pub(crate) fn op(&self) -> Result<(), StorageError> {
        use std::sync::atomic::Ordering;
        let n = self.ops.fetch_add(1, Ordering::Relaxed);
        if n >= self.ops_limit {
            return Err(StorageError::Limit(format!(
                "more than {} storage calls in one request (objects.ops_per_request)",
                self.ops_limit
            )));
        }
        Ok(())
    }

    /// The output gate before an outgoing request: makes every write so
    /// far durable. A failure marks the object lost (see
    /// [`ObjectCtx::lost`]).
    pub(crate) async fn flush(&self) -> Result<(), StorageError> {
        let mut storage = self.storage.lock().await;
        if !storage.has_unflushed() {
            return Ok(());
        }
        let flushed = storage.flush().await;
        if let Err(e) = &flushed {
            self.fail("flush", e);
        }
        flushed
    }

    /// The output gate before the response head: makes the writes so far
    /// durable, or, if there are none, confirms in the fence that this
    /// node still owns the object (one read), so a superseded owner never
    /// answers from its stale working copy
    /// ([`hearth_objects::ObjectStorage::confirm`]). A failure marks the
    /// object lost.
    pub(crate) async fn confirm(&self) -> Result<(), StorageError> {
        let mut storage = self.storage.lock().await;
        let confirmed = storage.confirm().await;
        if let Err(e) = &confirmed {
            self.fail("confirm", e);
        }
        confirmed
    }

    /// What a storage call answered: one that found the object superseded
    /// shuts the instance down as a failed flush does.
    pub(crate) fn saw<T>(&self, answer: &Result<T, StorageError>) {
        if let Err(e @ StorageError::Superseded) = answer {
            self.fail("storage call", e);
        }
    }

    /// Marks the object lost after `what` failed with `error`.
    fn fail(&self, what: &str, error: &StorageError) {
        use std::sync::atomic::Ordering;
        self.lost.store(true, Ordering::Relaxed);
        if matches!(error, StorageError::Superseded) {
            self.superseded.store(true, Ordering::Relaxed);
        }
        tracing::warn!(object = %self.key.ring_key(), %error,
            "an object's {what} failed: its caller gets an error and the instance is discarded");
    }

    /// Whether a gate failed or the object was superseded: the instance
    /// and storage must not serve again.
    pub(crate) fn lost(&self) -> bool {
        self.lost.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Whether the object learned that another owner claimed it (counted
    /// once per residency, `objects_superseded`).
    pub(crate) fn superseded(&self) -> bool {
        self.superseded.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The object's name for logs and errors.
    pub(crate) fn describe(&self) -> String {
        self.key.ring_key()
    }
}
