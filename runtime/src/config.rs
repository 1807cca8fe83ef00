//! [`RuntimeConfig`]: everything a node's runtime is built from, as a
//! builder with documented defaults.

use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::limits::{Plan, PlanLimits};

/// How instances of one Worker are reused across requests.
///
/// A Worker's globals persist on a reused instance (as in an isolate that
/// serves many requests). Whatever the policy, an instance that trapped or
/// hit a limit is discarded, never reused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReusePolicy {
    /// Requests one instance serves before it is retired (1 = a fresh
    /// instance per request).
    pub max_requests_per_instance: u64,
    /// Instances of one Worker that may run at once (each serves one
    /// request at a time); further requests wait for one to be free.
    pub max_concurrency: usize,
    /// An idle instance older than this is dropped.
    #[serde(with = "secs")]
    pub idle_ttl: Duration,
}

impl Default for ReusePolicy {
    /// Reuse up to 10,000 times, 16 at once, 30 s idle TTL.
    fn default() -> Self {
        ReusePolicy {
            max_requests_per_instance: 10_000,
            max_concurrency: 16,
            idle_ttl: Duration::from_secs(30),
        }
    }
}

impl ReusePolicy {
    /// A fresh instance for every request.
    pub fn fresh_per_request() -> Self {
        ReusePolicy {
            max_requests_per_instance: 1,
            ..Self::default()
        }
    }
}

mod secs {
    use serde::{Deserialize, Deserializer, Serializer};
    use std::time::Duration;
    pub(crate) fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u64(d.as_secs())
    }
    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        Ok(Duration::from_secs(u64::deserialize(d)?))
    }
}

/// The configuration of a [`crate::Runtime`].
///
/// ```
/// use hearth_runtime::{Plan, RuntimeConfig};
/// let cfg = RuntimeConfig::new("/tmp/hearth-doc-store")
///     .memory_budget(512 << 20)
///     .startup_cpu(Plan::Paid, std::time::Duration::from_secs(2));
/// assert_eq!(cfg.limits(Plan::Free).max_script_size, 3 << 20);
/// ```
#[derive(Debug, Clone)]
pub struct RuntimeConfig {
    pub(crate) store_dir: PathBuf,
    pub(crate) artifact_dir: Option<PathBuf>,
    pub(crate) artifact_key: [u8; 32],
    pub(crate) free: PlanLimits,
    pub(crate) paid: PlanLimits,
    pub(crate) memory_budget: u64,
    pub(crate) idle_timeout: Duration,
    pub(crate) reuse: ReusePolicy,
    pub(crate) pooling: bool,
    pub(crate) instance_pool_size: u32,
    pub(crate) busy_window: Duration,
    pub(crate) idle_sweep_above: f64,
    pub(crate) slot_wait: Duration,
    pub(crate) max_in_flight: usize,
    pub(crate) instance_memory_cap: u64,
    pub(crate) body_idle_timeout: Duration,
    pub(crate) buffer_before_slot: usize,
    pub(crate) miss_ttl: Duration,
    pub(crate) miss_capacity: usize,
    pub(crate) max_concurrent_subrequests: usize,
    pub(crate) max_loop_passes: usize,
    pub(crate) egress: crate::outbound::egress::EgressConfig,
    pub(crate) tail_budget: crate::outbound::live_tail::TailBudget,
    pub(crate) accept_unsigned_records: bool,
    pub(crate) keep_versions: usize,
    pub(crate) objects: crate::objects::ObjectsConfig,
}

impl RuntimeConfig {
    /// Defaults, with Worker sources in `store_dir` (a [`crate::DirStore`])
    /// and artifacts in `store_dir/artifacts`: free/paid plan limits as in
    /// [`PlanLimits::default_for`], a 1 GiB memory budget, 5 min idle
    /// timeout, the default [`ReusePolicy`], the pooling allocator with 256
    /// slots (each reserves address space, not memory), the slow-client
    /// defaults of [`crate::instances::slow_client`], 6 subrequests in flight per
    /// invocation, and a random artifact key, so
    /// artifacts are trusted only by the process that wrote them until a
    /// shared one is set with [`RuntimeConfig::artifact_key`].
    pub fn new(store_dir: impl Into<PathBuf>) -> Self {
        RuntimeConfig {
            store_dir: store_dir.into(),
            artifact_dir: None,
            artifact_key: random_key(),
            free: PlanLimits::default_for(Plan::Free),
            paid: PlanLimits::default_for(Plan::Paid),
            memory_budget: 1 << 30,
            idle_timeout: Duration::from_secs(300),
            reuse: ReusePolicy::default(),
            pooling: true,
            instance_pool_size: 256,
            busy_window: Duration::from_secs(1),
            idle_sweep_above: 0.0,
            slot_wait: Duration::from_secs(2),
            max_in_flight: 256,
            instance_memory_cap: 8 << 30,
            body_idle_timeout: Duration::from_secs(10),
            buffer_before_slot: 64 * 1024,
            miss_ttl: crate::store::misses::DEFAULT_MISS_TTL,
            miss_capacity: crate::store::misses::DEFAULT_MISS_CAPACITY,
            max_concurrent_subrequests: 6,
            max_loop_passes: crate::limits::MAX_LOOP_PASSES,
            egress: crate::outbound::egress::EgressConfig::default(),
            tail_budget: crate::outbound::live_tail::TailBudget::default(),
            accept_unsigned_records: false,
            keep_versions: crate::limits::DEFAULT_KEEP_VERSIONS,
            objects: crate::objects::ObjectsConfig::default(),
        }
    }

    /// The node's Durable Objects settings ([`RuntimeConfig::objects`]).
    pub fn objects_config(&self) -> &crate::objects::ObjectsConfig {
        &self.objects
    }

    /// The node's Durable Objects settings: the fence, objects resident at
    /// most, storage calls per request, bytes per object (default
    /// [`crate::objects::ObjectsConfig::default`]; see [`crate::objects`]).
    pub fn objects(mut self, objects: crate::objects::ObjectsConfig) -> Self {
        self.objects = objects;
        self
    }

    /// How long a request may wait for an instance slot (its Worker's or
    /// the node's) before it is answered 503 with `retry-after` (default
    /// 2 s).
    pub fn slot_wait(mut self, d: Duration) -> Self {
        self.slot_wait = d;
        self
    }

    /// Instances that may serve at once on the node, across all Workers
    /// (default 256, the pooling allocator's slots); each Worker is also
    /// held to [`ReusePolicy::max_concurrency`].
    pub fn max_in_flight(mut self, n: usize) -> Self {
        self.max_in_flight = n.max(1);
        self
    }

    /// Bytes that live instances of all Workers together may hold (linear
    /// memory and tables; default 8 GiB); a growth past it fails like a
    /// per-instance memory limit.
    pub fn instance_memory_cap(mut self, bytes: u64) -> Self {
        self.instance_memory_cap = bytes;
        self
    }

    /// A request body that delivers nothing for this long fails (default
    /// 10 s).
    pub fn body_idle_timeout(mut self, d: Duration) -> Self {
        self.body_idle_timeout = d;
        self
    }

    /// Subrequests (calls to bindings and the outbound Worker, fetches of
    /// origins) one invocation may have in flight at once (default 6, as on
    /// Cloudflare Workers); further ones wait for one to end
    /// ([`crate::outbound::outgoing`]), so one request cannot take every slot
    /// of a Worker it calls, or of the node.
    pub fn max_concurrent_subrequests(mut self, n: usize) -> Self {
        self.max_concurrent_subrequests = n.max(1);
        self
    }

    /// How Workers' fetches of origins are made: private addresses,
    /// timeouts, the response size cap (default [`EgressConfig::default`]);
    /// see [`crate::outbound::egress`].
    ///
    /// [`EgressConfig::default`]: crate::outbound::egress::EgressConfig::default
    pub fn egress(mut self, egress: crate::outbound::egress::EgressConfig) -> Self {
        self.egress = egress;
        self
    }

    /// The live tail's byte budgets: per event, per watcher's queue, per
    /// node (default [`TailBudget::default`]; see
    /// [`crate::outbound::live_tail`]). Checked when the runtime starts
    /// ([`TailBudget::validate`]).
    ///
    /// [`TailBudget::default`]: crate::outbound::live_tail::TailBudget::default
    /// [`TailBudget::validate`]: crate::outbound::live_tail::TailBudget::validate
    pub fn tail_budget(mut self, budget: crate::outbound::live_tail::TailBudget) -> Self {
        self.tail_budget = budget;
        self
    }

    /// The live tail's byte budgets ([`RuntimeConfig::tail_budget`]).
    pub fn tail_budget_config(&self) -> &crate::outbound::live_tail::TailBudget {
        &self.tail_budget
    }

    /// The egress settings ([`RuntimeConfig::egress`]).
    pub fn egress_config(&self) -> &crate::outbound::egress::EgressConfig {
        &self.egress
    }

    /// Bytes of a request body that must have arrived (or the whole body)
    /// before the request takes an instance slot (default 64 KiB), so a
    /// client that trickles its body holds a connection, not an instance.
    pub fn buffer_before_slot(mut self, bytes: usize) -> Self {
        self.buffer_before_slot = bytes;
        self
    }

    /// How many times a request may have passed through a hearth node's
    /// egress (its `CDN-Loop` entries) and still be let in by the front
    /// door (default [`crate::limits::MAX_LOOP_PASSES`], 8); past it the
    /// request is answered 508 before it takes a slot ([`crate::flow`]).
    /// At least 1: a Worker may always fetch another Worker's public name
    /// once.
    pub fn max_loop_passes(mut self, n: usize) -> Self {
        self.max_loop_passes = n.max(1);
        self
    }

    /// How long a script ID the store did not have is answered 404 without
    /// reading the store again (default 5 s; zero turns the negative cache
    /// off). A deploy of the name, here or announced by another node, ends
    /// it at once; see [`crate::store::misses`].
    pub fn unknown_script_ttl(mut self, d: Duration) -> Self {
        self.miss_ttl = d;
        self
    }

    /// How many unknown script IDs the negative cache remembers at most,
    /// least recently asked dropped first (default 16,384).
    pub fn unknown_script_capacity(mut self, names: usize) -> Self {
        self.miss_capacity = names;
        self
    }

    /// Where precompiled artifacts are kept (default `store_dir/artifacts`).
    pub fn artifact_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.artifact_dir = Some(dir.into());
        self
    }

    /// The secret that authenticates precompiled artifacts; nodes that share
    /// artifacts must share it.
    pub fn artifact_key(mut self, key: [u8; 32]) -> Self {
        self.artifact_key = key;
        self
    }

    /// Reads store records that carry no MAC (default off: refused and
    /// counted). Records written by a hearth from before records were
    /// signed have none; turn this on while upgrading such a store, run
    /// `hearth upgrade-store` once every node runs this build, then turn it
    /// off ([`crate::store::records`]). A record whose MAC does not check
    /// is refused either way.
    pub fn accept_unsigned_records(mut self, accept: bool) -> Self {
        self.accept_unsigned_records = accept;
        self
    }

    /// How many versions of a script stay on record, the latest ones
    /// (default [`crate::limits::DEFAULT_KEEP_VERSIONS`], at least 1);
    /// each deploy deletes older version records, except those its
    /// deployment serves. A rollback can reach only versions on record.
    pub fn keep_versions(mut self, n: usize) -> Self {
        self.keep_versions = n.max(1);
        self
    }

    /// Replaces the limits of `plan`.
    pub fn plan_limits(mut self, plan: Plan, limits: PlanLimits) -> Self {
        *self.limits_mut(plan) = limits;
        self
    }

    /// Sets the startup CPU budget of `plan`.
    pub fn startup_cpu(mut self, plan: Plan, budget: Duration) -> Self {
        self.limits_mut(plan).startup_cpu = budget;
        self
    }

    /// Sets the per-request CPU limit of `plan`.
    pub fn request_cpu(mut self, plan: Plan, limit: Duration) -> Self {
        self.limits_mut(plan).request_cpu = limit;
        self
    }

    /// Sets the per-instance memory limit of `plan`, in bytes.
    pub fn memory_limit(mut self, plan: Plan, bytes: u64) -> Self {
        self.limits_mut(plan).memory = bytes;
        self
    }

    /// Bytes of compiled code and instance memory kept warm on this node.
    pub fn memory_budget(mut self, bytes: u64) -> Self {
        self.memory_budget = bytes;
        self
    }

    /// A Worker unused this long is evicted.
    pub fn idle_timeout(mut self, d: Duration) -> Self {
        self.idle_timeout = d;
        self
    }

    /// The instance reuse policy for every Worker.
    pub fn reuse(mut self, policy: ReusePolicy) -> Self {
        self.reuse = policy;
        self
    }

    /// Use the pooling allocator (default) or allocate instances on demand.
    pub fn pooling(mut self, on: bool) -> Self {
        self.pooling = on;
        self
    }

    /// Instance slots of the pooling allocator.
    pub fn instance_pool_size(mut self, n: u32) -> Self {
        self.instance_pool_size = n;
        self
    }

    /// A Worker used within this window counts as busy: a home will not
    /// evict it to make room for a sharded newcomer (default 1 s).
    pub fn busy_window(mut self, d: Duration) -> Self {
        self.busy_window = d;
        self
    }

    /// Memory-aware idle eviction: idle Workers are swept only once this
    /// fraction (0.0–1.0) of the memory budget is in use (default 0: always).
    /// The data-center simulator found this the cheapest way past 99.999%
    /// warm when one copy of every Worker fits in the cluster
    /// (`docs/simulate-results.md`). Values outside 0–1 are clamped.
    pub fn idle_sweep_above(mut self, fraction: f64) -> Self {
        self.idle_sweep_above = if fraction.is_nan() {
            0.0
        } else {
            fraction.clamp(0.0, 1.0)
        };
        self
    }

    /// The limits of `plan`.
    pub fn limits(&self, plan: Plan) -> &PlanLimits {
        match plan {
            Plan::Free => &self.free,
            Plan::Paid => &self.paid,
        }
    }

    fn limits_mut(&mut self, plan: Plan) -> &mut PlanLimits {
        match plan {
            Plan::Free => &mut self.free,
            Plan::Paid => &mut self.paid,
        }
    }

    /// The store directory.
    pub fn store_dir(&self) -> &std::path::Path {
        &self.store_dir
    }
}

/// 32 random bytes from the OS (or, failing that, from the std hasher's
/// random seeds, the time and the process ID).
pub(crate) fn random_key() -> [u8; 32] {
    use std::hash::{BuildHasher, Hasher};
    use std::io::Read;
    let mut key = [0u8; 32];
    if std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut key))
        .is_ok()
    {
        return key;
    }
    let mut h = blake3::Hasher::new();
    for i in 0..4u64 {
        let mut s = std::collections::hash_map::RandomState::new().build_hasher();
        s.write_u64(i);
        h.update(&s.finish().to_le_bytes());
    }
    add_time_and_process(&mut h);
    *h.finalize().as_bytes()
}

/// Feeds the wall clock (ns) and the process ID into `h`: what makes values
/// hashed on different nodes, or in different runs, differ.
pub(crate) fn add_time_and_process(h: &mut blake3::Hasher) {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    h.update(&t.to_le_bytes());
    h.update(&std::process::id().to_le_bytes());
}
