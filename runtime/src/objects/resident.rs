//! The node's resident objects: one entry per object served here, each
//! with its input gate, its instance and its storage (see
//! [`crate::objects`]).

use std::collections::HashMap;
use std::num::NonZeroUsize;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Instant;

use futures::future::BoxFuture;
use hearth_objects::{Namespace, ObjectId, ObjectKey, ObjectStorage, Objects, StorageLimits};

use crate::body::Body;
use crate::error::RuntimeError;
use crate::instances::instance::Instance;
use crate::instances::worker::{Pinned, Worker};
use crate::objects::{ObjectCtx, ObjectFence, ObjectsConfig, StoreBlobs};
use crate::stats::Stats;

/// Names remembered for `this-object().name`, per node.
const NAMES_REMEMBERED: usize = 16_384;
/// Longest name remembered (longer ones still make IDs).
const MAX_NAME_REMEMBERED: usize = 2048;

/// Loads a script's current Worker for its objects (the runtime does).
pub(crate) trait LoadWorker: Send + Sync {
    /// The Worker serving `script_id` now.
    fn load<'a>(&'a self, script_id: &'a str) -> BoxFuture<'a, Result<Arc<Worker>, RuntimeError>>;
}

/// What a resident object holds between its requests.
#[derive(Default)]
struct Slot {
    /// The Worker its instance is of (a redeploy starts a new instance).
    worker: Option<Arc<Worker>>,
    /// Its instance, between requests.
    instance: Option<Instance>,
    /// Its storage, opened once per residency.
    storage: Option<Arc<tokio::sync::Mutex<ObjectStorage>>>,
}

/// One resident object: its input gate over what it holds.
struct Resident {
    gate: Arc<tokio::sync::Mutex<Slot>>,
    /// Milliseconds since the table's start when it was last taken.
    used_ms: AtomicU64,
}

/// The node's Durable Objects: its storage, its resident objects, and the
/// names its Workers made IDs from.
pub struct NodeObjects {
    config: ObjectsConfig,
    store_dir: std::path::PathBuf,
    resident: Mutex<HashMap<ObjectKey, Arc<Resident>>>,
    names: Mutex<lru::LruCache<(Namespace, ObjectId), String>>,
    started: Instant,
    /// The script store, for blobs; set when the runtime starts.
    store: OnceLock<Arc<dyn crate::ScriptStore>>,
    loader: OnceLock<Box<dyn LoadWorker>>,
    objects: tokio::sync::OnceCell<Objects>,
    stats: Arc<Stats>,
    /// Whether this node is the ring home of an object (by ring key); set
    /// by the node when it joins a cluster. Without one, this runtime is
    /// every object's home.
    home: OnceLock<HomeCheck>,
    /// Wakes the alarm scheduler early: an object just made an alarm
    /// durable, which may be due before the next poll.
    pub(crate) alarm_nudge: Arc<tokio::sync::Notify>,
}

/// "Is this node the ring home of the object with this ring key?"
pub type HomeCheck = Box<dyn Fn(&str) -> bool + Send + Sync>;

impl std::fmt::Debug for NodeObjects {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeObjects")
            .field("config", &self.config)
            .field("resident", &self.resident_count())
            .finish_non_exhaustive()
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl NodeObjects {
    /// The objects of a node configured with `config`, whose store is at
    /// `store_dir` (where the default fence file lives).
    pub(crate) fn new(
        config: ObjectsConfig,
        store_dir: std::path::PathBuf,
        stats: Arc<Stats>,
    ) -> Self {
        NodeObjects {
            config,
            store_dir,
            resident: Mutex::new(HashMap::new()),
            names: Mutex::new(lru::LruCache::new(
                NonZeroUsize::new(NAMES_REMEMBERED).unwrap_or(NonZeroUsize::MIN),
            )),
            started: Instant::now(),
            store: OnceLock::new(),
            loader: OnceLock::new(),
            objects: tokio::sync::OnceCell::new(),
            stats,
            home: OnceLock::new(),
            alarm_nudge: Arc::default(),
        }
    }

    /// Connects the table to the runtime: its script store (blobs) and
    /// how it loads a script's Worker. Once; later calls are ignored.
    pub(crate) fn install(&self, store: Arc<dyn crate::ScriptStore>, loader: Box<dyn LoadWorker>) {
        let _ = self.store.set(store);
        let _ = self.loader.set(loader);
    }

    /// Tells the table how to know whether this node is an object's ring
    /// home (the node does when it joins a cluster): the alarm scheduler
    /// fires only the alarms of objects homed here. Once; later calls are
    /// ignored. Without it, this runtime is every object's home.
    pub fn set_home_check(&self, is_home: HomeCheck) {
        let _ = self.home.set(is_home);
    }

    /// Whether this node is the ring home of the object `ring_key`.
    pub(crate) fn is_home(&self, ring_key: &str) -> bool {
        self.home.get().is_none_or(|is_home| is_home(ring_key))
    }

    /// The node's storage for the alarm scheduler (see
    /// [`NodeObjects::storage`]).
    pub(crate) async fn objects_storage(&self) -> Result<&Objects, String> {
        self.storage().await
    }

    /// The node's counters.
    pub(crate) fn stats(&self) -> &Stats {
        &self.stats
    }

    /// Objects resident now.
    pub fn resident_count(&self) -> usize {
        lock(&self.resident).len()
    }

    /// Whether `key` is resident here now (its next request is warm).
    pub(crate) fn is_resident(&self, key: &ObjectKey) -> bool {
        lock(&self.resident).contains_key(key)
    }

    /// Remembers that `id` of `ns` was made from `name`.
    pub(crate) fn remember_name(&self, ns: &Namespace, id: &ObjectId, name: &str) {
        if name.len() <= MAX_NAME_REMEMBERED {
            lock(&self.names).put((ns.clone(), *id), name.to_string());
        }
    }

    fn name_of(&self, key: &ObjectKey) -> Option<String> {
        lock(&self.names)
            .get(&(key.namespace.clone(), key.id))
            .cloned()
    }

    /// The node's storage, built on first use from the config.
    async fn storage(&self) -> Result<&Objects, String> {
        self.objects
            .get_or_try_init(|| async {
                let store = self
                    .store
                    .get()
                    .ok_or("the runtime has not installed its store")?
                    .clone();
                let fence: Arc<dyn hearth_objects::Fence> = match &self.config.fence {
                    ObjectFence::Sqlite(path) => {
                        let path = path
                            .clone()
                            .unwrap_or_else(|| self.store_dir.join("objects").join("fence.sqlite"));
                        if let Some(dir) = path.parent() {
                            std::fs::create_dir_all(dir)
                                .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
                        }
                        Arc::new(
                            hearth_objects::SqliteFence::open(&path)
                                .map_err(|e| format!("fence {}: {e}", path.display()))?,
                        )
                    }
                    ObjectFence::Etcd(endpoints) => Arc::new(
                        hearth_objects::EtcdFence::new(endpoints.clone(), "hearth/objects/")
                            .map_err(|e| format!("etcd fence: {e}"))?,
                    ),
                };
                let limits = StorageLimits {
                    max_object_bytes: self.config.max_object_bytes,
                    ..StorageLimits::default()
                };
                Ok::<_, String>(Objects::new(fence, Arc::new(StoreBlobs(store)), limits))
            })
            .await
    }

    /// The resident entry of `key`, taken (its use time bumped); a new one
    /// past the count evicts the least recently used idle objects.
    fn resident(&self, key: &ObjectKey) -> Arc<Resident> {
        let now = self.started.elapsed().as_millis() as u64;
        let mut table = lock(&self.resident);
        if let Some(r) = table.get(key) {
            r.used_ms.store(now, Ordering::Relaxed);
            return r.clone();
        }
        let r = Arc::new(Resident {
            gate: Arc::default(),
            used_ms: AtomicU64::new(now),
        });
        table.insert(key.clone(), r.clone());
        if table.len() > self.config.max_resident {
            self.evict(&mut table);
        }
        r
    }

    /// Drops the least recently used idle objects until the table is
    /// within its count. Idle: nothing but the table holds the entry (no
    /// request waits for it: requests take their clone under the table's
    /// lock and drop it once they hold the gate) and its gate is open (no
    /// handler runs, no final flush is under way), so two residencies of
    /// one object never overlap on this node.
    fn evict(&self, table: &mut HashMap<ObjectKey, Arc<Resident>>) {
        let over = table.len().saturating_sub(self.config.max_resident);
        let mut idle: Vec<(u64, ObjectKey)> = table
            .iter()
            .filter(|(_, r)| Arc::strong_count(r) == 1 && r.gate.try_lock().is_ok())
            .map(|(k, r)| (r.used_ms.load(Ordering::Relaxed), k.clone()))
            .collect();
        idle.sort_unstable_by_key(|(used, _)| *used);
        for (_, key) in idle.into_iter().take(over) {
            table.remove(&key);
            Stats::bump(&self.stats.objects_evicted);
            tracing::debug!(object = %key.ring_key(), "idle object evicted (objects.max_resident)");
        }
    }

    /// Drops every idle resident object (no request running or waiting)
    /// that `keep` refuses, and returns how many: the node's placement
    /// calls it with "is this node the object's ring home?", so an object
    /// whose home moved away is reopened from storage (a new epoch) if it
    /// ever comes back, instead of serving the working copy it had before
    /// another node owned it. A busy one stays until a later call.
    pub fn release_where(&self, keep: impl Fn(&ObjectKey) -> bool) -> usize {
        let mut table = lock(&self.resident);
        let before = table.len();
        table.retain(|key, r| keep(key) || Arc::strong_count(r) > 1 || r.gate.try_lock().is_err());
        before - table.len()
    }

    /// Serves `req` on the object `key`: through its input gate, on its
    /// instance, with the output gate before the response head (see the
    /// module docs). The gate is held until the handler returns.
    pub(crate) async fn call(
        &self,
        key: ObjectKey,
        req: http::Request<Body>,
        deadline: Instant,
    ) -> Result<http::Response<Body>, RuntimeError> {
        let object = key.ring_key();
        // Only an alarm's try is ever skipped.
        self.serve(key, req, deadline, None)
            .await?
            .ok_or_else(|| RuntimeError::ObjectUnavailable {
                object,
                message: "the call was skipped".into(),
            })
    }

    /// Serves `req` (an alarm's request, see [`crate::objects::alarms`])
    /// on `key` as [`NodeObjects::call`] does, if the object's alarm is
    /// still `alarm.at` once its input gate is taken: `Ok(None)` (nothing
    /// run) when it was deleted or moved meanwhile. After a handler that
    /// answered 2xx (or after the last try, `alarm.last`), the alarm is
    /// deleted, unless the handler set another, and flushed with the
    /// handler's writes.
    pub(crate) async fn serve_alarm(
        &self,
        key: ObjectKey,
        req: http::Request<Body>,
        deadline: Instant,
        alarm: AlarmTry,
    ) -> Result<Option<http::Response<Body>>, RuntimeError> {
        self.serve(key, req, deadline, Some(alarm)).await
    }

    async fn serve(
        &self,
        key: ObjectKey,
        req: http::Request<Body>,
        deadline: Instant,
        alarm: Option<AlarmTry>,
    ) -> Result<Option<http::Response<Body>>, RuntimeError> {
        let script = key.namespace.script.clone();
        let unavailable = |message: String| RuntimeError::ObjectUnavailable {
            object: key.ring_key(),
            message,
        };
        let resident = self.resident(&key);
        let gate = resident.gate.clone().lock_owned();
        let mut slot = tokio::time::timeout_at(deadline.into(), gate)
            .await
            .map_err(|_| RuntimeError::WallTimeExceeded {
                script_id: script.clone(),
                limit: deadline.saturating_duration_since(Instant::now()),
            })?;
        drop(resident);
        let loader = self
            .loader
            .get()
            .ok_or_else(|| unavailable("the runtime has not installed its loader".into()))?;
        let worker = loader.load(&script).await?;
        if !slot
            .worker
            .as_ref()
            .is_some_and(|w| Arc::ptr_eq(w, &worker))
        {
            // A new residency, or a redeploy: a new instance, same storage.
            slot.instance = None;
            slot.worker = Some(worker.clone());
        }
        let storage = match &slot.storage {
            Some(s) => s.clone(),
            None => {
                let objects = self.storage().await.map_err(&unavailable)?;
                let opened = objects
                    .open(&key)
                    .await
                    .map_err(|e| unavailable(format!("cannot open its storage: {e}")))?;
                Stats::bump(&self.stats.objects_opened);
                let s = Arc::new(tokio::sync::Mutex::new(opened));
                slot.storage = Some(s.clone());
                s
            }
        };
        if let Some(alarm) = &alarm
            && storage.lock().await.get_alarm().ok().flatten() != Some(alarm.at)
        {
            return Ok(None);
        }
        let object = Arc::new(ObjectCtx::new(
            key.clone(),
            self.name_of(&key),
            storage,
            self.config.ops_per_request,
        ));
        let (back, returned) = tokio::sync::oneshot::channel();
        let pinned = Pinned {
            instance: slot.instance.take(),
            object: object.clone(),
            back,
        };
        Stats::bump(&self.stats.object_requests);
        let served = worker.serve_pinned(req, pinned).await.map(|(r, _)| r);
        let succeeded = served.as_ref().is_ok_and(|r| r.status().is_success());
        let nudge = self.alarm_nudge.clone();
        let stats = self.stats.clone();
        // The input gate stays closed until the handler returns; then the
        // writes made after the head are flushed and the instance goes back.
        // An instance that failed (a trap, a CPU, memory or wall-time limit)
        // does not come back: the writes its request made since its last
        // flush were never confirmed to anyone and are dropped with the
        // working copy; the next request reopens the object from what was
        // durable.
        tokio::spawn(async move {
            let instance = returned.await.ok();
            if let Some(alarm) = alarm.filter(|a| instance.is_some() && (succeeded || a.last)) {
                // The alarm that fired is done with, unless the handler set
                // another time. (A failed instance's working copy is
                // dropped below: its alarm stays, and fires again.)
                let mut storage = object.storage.lock().await;
                if storage.get_alarm().ok().flatten() == Some(alarm.at) {
                    let _ = storage.delete_alarm();
                }
            }
            let failed = instance.is_none() || object.lost() || object.flush().await.is_err();
            let alarm = object.storage.lock().await.get_alarm().ok().flatten();
            if !failed && alarm.is_some_and(crate::objects::alarms::due_before_next_poll) {
                // An alarm due before the scheduler's next poll (maybe just
                // set): it looks now instead.
                nudge.notify_one();
            }
            if failed {
                // A failed instance, a failed gate or a superseded
                // object: neither the instance nor the working copy may
                // serve again; the next request reopens the object (a
                // new claim).
                slot.instance = None;
                slot.storage = None;
                if object.superseded() {
                    Stats::bump(&stats.objects_superseded);
                    tracing::info!(object = %object.describe(),
                        "another node claimed this object: its instance here is shut down");
                }
            } else {
                slot.instance = instance;
            }
            drop(slot);
        });
        served.map(Some)
    }
}

/// One try of an alarm: the time that fired, and whether it is the last
/// try (then the alarm is deleted whatever the handler answers).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct AlarmTry {
    /// The alarm time that fired (milliseconds since the Unix epoch).
    pub(crate) at: u64,
    /// No more tries after this one.
    pub(crate) last: bool,
}
