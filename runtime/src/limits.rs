//! Limits: what a Worker may use, per plan, and the bounds every Worker
//! has whatever its plan.
//!
//! Sizes are checked at deploy, where they can be known; CPU and memory are
//! enforced while the Worker runs. CPU always means CPU time on the thread that
//! runs the Worker (see [`crate::instances::cpu`]), never wall time, so a
//! Worker that waits on I/O is not charged for the wait.
//!
//! The fixed bounds are here too: how deep a flow may nest
//! ([`MAX_DEPTH`]), how often a request may loop through the front door
//! ([`MAX_LOOP_PASSES`], by default), and what host memory one instance can make the node
//! allocate (`MAX_RESOURCES`, `FIELD_SIZE_LIMIT`, the outgoing body
//! buffer, and their sum `HOST_RESERVE`, and `MAX_RANDOM_BYTES` per
//! `wasi:random` call; how the host enforces them is in the instance
//! wing's `host`), and the live tail's default byte budgets
//! (`TAIL_*_BYTES`).

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// The most CPU a single request may ever be granted.
pub const MAX_REQUEST_CPU: Duration = Duration::from_secs(5 * 60);

/// A pricing plan; each has its own [`PlanLimits`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Plan {
    /// The free plan: 3 MiB scripts.
    #[default]
    Free,
    /// The paid plan: 10 MiB scripts.
    Paid,
}

impl fmt::Display for Plan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Plan::Free => "free",
            Plan::Paid => "paid",
        })
    }
}

impl FromStr for Plan {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "free" => Ok(Plan::Free),
            "paid" => Ok(Plan::Paid),
            other => Err(format!("unknown plan {other:?}: expected free or paid")),
        }
    }
}

/// What a Worker on one plan may use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlanLimits {
    /// Largest script accepted, measured gzip-compressed (level 6), like the
    /// hosted platforms measure it.
    pub max_script_size: u64,
    /// Largest script accepted as uploaded, so a highly compressible script
    /// cannot slip a huge module past the compressed limit.
    #[serde(default = "default_uncompressed")]
    pub max_uncompressed_size: u64,
    /// CPU time the top level (instantiation, start functions, init) may use.
    #[serde(with = "millis")]
    pub startup_cpu: Duration,
    /// CPU time one request may use (at most [`MAX_REQUEST_CPU`]).
    #[serde(with = "millis")]
    pub request_cpu: Duration,
    /// Linear memory one instance may hold, in bytes (tables and the host
    /// resources it creates are counted too, see `crate::instances::host`).
    pub memory: u64,
    /// Wall-clock time one request may take from the moment it is handed to
    /// an instance until the Worker returns: it bounds a client that is too
    /// slow to send its body or read the response, and a Worker that
    /// waits. CPU is limited separately, by `request_cpu`.
    #[serde(default = "default_request_wall", with = "millis")]
    pub request_wall: Duration,
    /// Origins one request may fetch (each level of a flow counts its
    /// own; calls to bindings are not counted, see [`crate::outbound::egress`]).
    #[serde(default = "default_subrequests")]
    pub subrequests: u32,
}

fn default_uncompressed() -> u64 {
    64 * MIB
}

fn default_subrequests() -> u32 {
    50
}

fn default_request_wall() -> Duration {
    Duration::from_secs(60)
}

const MIB: u64 = 1024 * 1024;

impl PlanLimits {
    /// The defaults of `plan`: 3 MiB (free) or 10 MiB (paid) compressed and
    /// 32 MiB (free) or 64 MiB (paid) uncompressed, 400 ms startup CPU,
    /// 30 s request CPU, 60 s request wall time, 128 MiB memory, 50 (free)
    /// or 1000 (paid) fetches of origins per request, as on Cloudflare
    /// Workers.
    pub fn default_for(plan: Plan) -> Self {
        PlanLimits {
            max_script_size: match plan {
                Plan::Free => 3 * MIB,
                Plan::Paid => 10 * MIB,
            },
            max_uncompressed_size: match plan {
                Plan::Free => 32 * MIB,
                Plan::Paid => 64 * MIB,
            },
            startup_cpu: Duration::from_millis(400),
            request_cpu: Duration::from_secs(30),
            memory: 128 * MIB,
            request_wall: default_request_wall(),
            subrequests: match plan {
                Plan::Free => default_subrequests(),
                Plan::Paid => 1000,
            },
        }
    }

    /// Checks the limits are within what hearth allows.
    pub fn validate(&self) -> Result<(), crate::ConfigError> {
        if self.request_cpu > MAX_REQUEST_CPU {
            return Err(crate::ConfigError::Limit(format!(
                "request CPU {:?} is over the maximum of {MAX_REQUEST_CPU:?}",
                self.request_cpu
            )));
        }
        if self.request_cpu.is_zero()
            || self.startup_cpu.is_zero()
            || self.request_wall.is_zero()
            || self.memory == 0
        {
            return Err(crate::ConfigError::Limit(
                "CPU, wall-time and memory limits must be non-zero".into(),
            ));
        }
        Ok(())
    }
}

/// Most levels a flow may have (the entry Worker is level 1): a call
/// beyond it fails in the caller with `loop-detected` ([`crate::flow`]).
pub const MAX_DEPTH: usize = 16;

/// Default of `RuntimeConfig::max_loop_passes`: how many times a request
/// may have left a hearth node's egress (its `CDN-Loop` entries,
/// [`crate::flow::LoopMark`]) and still be let in by a front door; one more
/// and it is refused with 508 before it takes a slot ([`crate::flow`]).
pub const MAX_LOOP_PASSES: usize = 8;

/// Resources (WASI and wasi:http handles) one instance may hold at once.
pub(crate) const MAX_RESOURCES: usize = 1024;

/// Bytes a header map a Worker builds may hold (in memory, which is about
/// twice its wire size).
pub(crate) const FIELD_SIZE_LIMIT: usize = 16 * 1024;

/// Largest write a guest may make to an outgoing body at once (what
/// `check-write` grants): the `blocking-write-and-flush` limit of
/// wasi:io, and the SDK's chunk.
pub(crate) const OUTGOING_BODY_CHUNK: usize = 4096;

/// Chunks an outgoing body buffers before `check-write` says wait
/// (wasmtime-wasi-http keeps one more, so a body holds at most
/// [`OUTGOING_BODY_BYTES`]).
pub(crate) const OUTGOING_BODY_BUFFER_CHUNKS: usize = 1;

/// The most bytes one outgoing body holds while nobody reads it.
pub(crate) const OUTGOING_BODY_BYTES: usize =
    (OUTGOING_BODY_BUFFER_CHUNKS + 1) * OUTGOING_BODY_CHUNK;

/// The most host memory an instance's resources can take (every resource
/// an outgoing request with a full header map and a full body buffer):
/// 1024 × (16 KiB + 8 KiB) = 24 MiB, reserved against the node-wide cap
/// per live instance.
pub(crate) const HOST_RESERVE: u64 =
    (MAX_RESOURCES * (FIELD_SIZE_LIMIT + OUTGOING_BODY_BYTES)) as u64;

/// Most bytes one `wasi:random` call (`get-random-bytes`,
/// `get-insecure-random-bytes`) may ask the host for: 64 KiB, the quota of
/// Web Crypto's `getRandomValues`. A larger ask traps the guest. The host
/// builds the whole answer before copying it into the guest, outside the
/// instance's memory accounting and its CPU meter, so wasmtime-wasi's
/// default (64 MiB per call) let one call take that much host memory.
pub(crate) const MAX_RANDOM_BYTES: u64 = 64 * 1024;

/// Default open connections to origins per node, idle ones included
/// (`[egress] max_connections`; `outbound::connections`).
pub const EGRESS_MAX_CONNECTIONS: usize = 1024;

/// Default connections to origins one Worker may use at once on a node
/// (`[egress] max_connections_per_worker`), so one Worker cannot take the
/// node's whole cap.
pub const EGRESS_MAX_CONNECTIONS_PER_WORKER: usize = 128;

/// Default time an idle connection to an origin stays open for reuse
/// (`[egress] idle_timeout`; hyper-util's own default is 90 s).
pub const EGRESS_IDLE_TIMEOUT: Duration = Duration::from_secs(10);

/// Idle connections the egress pool keeps per origin (hyper-util's
/// default was 32 per host, with no overall bound).
pub const EGRESS_IDLE_PER_HOST: usize = 4;

/// Default bound on one DNS lookup of an origin's host
/// (`[egress] dns_timeout`).
pub const EGRESS_DNS_TIMEOUT: Duration = Duration::from_secs(5);

/// What one table element is counted as against the memory limit.
pub(crate) const TABLE_ELEMENT_BYTES: usize = 16;

/// The live tail's default byte budget for one event: a finished request
/// as one watcher gets it, its trace events included, counted as JSON
/// ([`crate::outbound::live_tail::TailBudget::event_bytes`]).
pub const TAIL_EVENT_BYTES: usize = 256 * 1024;

/// The live tail's default byte budget for one watcher's queue on a node
/// ([`crate::outbound::live_tail::TailBudget::queue_bytes`]).
pub const TAIL_QUEUE_BYTES: usize = 4 * 1024 * 1024;

/// The live tail's default byte budget for everything a node holds for its
/// watchers, gathered members' events included
/// ([`crate::outbound::live_tail::TailBudget::node_bytes`]).
pub const TAIL_NODE_BYTES: usize = 32 * 1024 * 1024;

/// The smallest per-event budget a node accepts: room for a request's
/// URL, its exception and its outcome (each at most
/// [`crate::outbound::tail::MAX_LINE_BYTES`], escaped) and a mark of what
/// was left out, which an event keeps whatever else it loses.
pub const MIN_TAIL_EVENT_BYTES: usize = 64 * 1024;

/// Serde helper: durations as integer milliseconds (config files, JSON).
mod millis {
    use serde::{Deserialize, Deserializer, Serializer};
    use std::time::Duration;

    pub(crate) fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u64(d.as_millis() as u64)
    }

    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        Ok(Duration::from_millis(u64::deserialize(d)?))
    }
}

/// Versions of a script a deploy keeps on record by default, the latest
/// ones (the versions its deployment serves are kept whatever their age);
/// older version records are deleted ([`crate::store::records`]). Set with
/// [`crate::RuntimeConfig::keep_versions`] (node config `keep_versions`).
pub const DEFAULT_KEEP_VERSIONS: usize = 20;
