//! Typed errors the runtime's parts share: what went wrong in the store,
//! while compiling, while serving, or in the configuration, each with a
//! message a user can act on.
//!
//! An error that belongs to one concept lives next to it (a refused deploy is
//! [`crate::DeployError`], malformed bytes a
//! [`crate::store::validate::ValidationError`], bad bindings a
//! [`crate::outbound::bindings::BindingsError`]); this module imports nothing
//! of the crate, so every part can use it.

use std::time::Duration;

/// Why wasmtime could not turn a component into a Worker's code. The
/// message is wasmtime's, with its whole chain of causes.
#[derive(Debug, thiserror::Error)]
pub enum CompileError {
    /// The component does not compile.
    #[error("{0:#}")]
    Compile(wasmtime::Error),
    /// The compiled component does not link against the host's imports.
    #[error("{0:#}")]
    Link(wasmtime::Error),
}

/// A failure of the script store.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// An I/O error at the given path.
    #[error("script store I/O error at {path}: {source}")]
    Io {
        /// The file or directory involved.
        path: std::path::PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// Metadata on disk does not parse.
    #[error("corrupt script metadata at {path}: {message}")]
    Corrupt {
        /// The metadata file.
        path: std::path::PathBuf,
        /// What is wrong with it.
        message: String,
    },
    /// An object store call failed (unreachable, refused, timed out).
    #[error("script store error at {key}: {message}")]
    Remote {
        /// The object (or store URL) involved.
        key: String,
        /// What went wrong.
        message: String,
    },
    /// The store's location or settings are unusable.
    #[error("cannot open script store {location}: {message}")]
    Config {
        /// The location as given.
        location: String,
        /// What is wrong.
        message: String,
    },
    /// Metadata read from the store names a source hash that is not 64
    /// lowercase hex digits (blake3, as a deploy writes it): a damaged or
    /// forged file. The hash names the source's blob and its artifact, so
    /// such metadata is refused before it can reach a path.
    #[error(
        "refused script metadata at {path}: its source hash {hash:?} is not 64 lowercase hex digits"
    )]
    BadHash {
        /// The metadata file or object.
        path: std::path::PathBuf,
        /// The hash it records (at most its first 80 characters).
        hash: String,
    },
    /// A record read from the store (a deployment, a version, a secret)
    /// does not carry a valid MAC under this node's key
    /// ([`crate::store::records`]): edited or forged by whoever can write
    /// the store, or signed under another cluster's `artifact_key`, or
    /// written by a hearth from before records were signed. Refused, and
    /// counted (`store_metadata_rejected`).
    #[error("refused store record at {path}: {reason}")]
    Unauthenticated {
        /// The record's file or object.
        path: std::path::PathBuf,
        /// Why: no MAC, or a MAC that does not check.
        reason: String,
    },
    /// A record's place would not be a plain name inside the store (a
    /// script ID that is not a DNS label, a name with other characters
    /// than letters, digits, `_` and `-`): nothing is read or written.
    #[error("refused store key {key:?}: not a plain name inside the store")]
    BadKey {
        /// The key as asked for (at most its first 80 characters).
        key: String,
    },
    /// Writers on other nodes kept taking the version numbers this deploy
    /// tried ([`crate::store::versions`]); nothing was made current.
    #[error(
        "could not take a version number for {script_id}: {attempts} attempts met other deploys; try again"
    )]
    Contended {
        /// The script.
        script_id: String,
        /// How many numbers were tried.
        attempts: u32,
    },
    /// The stored source does not match its recorded hash.
    #[error("stored source of {script_id} does not match its hash {hash}")]
    HashMismatch {
        /// The script whose source is damaged.
        script_id: String,
        /// The hash its metadata records.
        hash: String,
    },
}

/// Why a request could not be served by its Worker. Each maps to an HTTP
/// status and a clear body via [`RuntimeError::status`] and `Display`.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    /// No Worker is deployed under this script ID.
    #[error("no Worker is deployed as {0:?}")]
    UnknownScript(String),
    /// A client addressed a user Worker deployed `dispatch_only`: it is
    /// served only through a dispatch namespace ([`crate::store::manifest`]).
    #[error(
        "no Worker is served at {0:?}: it is a user Worker, reachable only through its platform's dispatch namespace"
    )]
    DispatchOnly(String),
    /// Top-level code used more CPU than the startup budget.
    #[error(
        "Worker {script_id} exceeded its startup CPU budget: used {used:?} of {budget:?} during instantiation; it was stopped and will be retried on the next request"
    )]
    StartupCpuExceeded {
        /// The Worker.
        script_id: String,
        /// CPU time used when it was stopped.
        used: Duration,
        /// The plan's startup budget.
        budget: Duration,
    },
    /// The handler used more CPU than the per-request limit.
    #[error(
        "Worker {script_id} exceeded its CPU limit: used {used:?} of {budget:?} on this request; the instance was discarded"
    )]
    CpuExceeded {
        /// The Worker.
        script_id: String,
        /// CPU time used when it was stopped.
        used: Duration,
        /// The per-request limit.
        budget: Duration,
    },
    /// A nested invocation was stopped because its flow's CPU budget for nested
    /// invocations on this node ran out ([`crate::instances::cpu::FlowCpu`]).
    #[error(
        "Worker {script_id} was stopped after {used:?} of CPU: its flow's CPU budget for nested calls ({flow_budget:?} on this node) is spent; the instance was discarded"
    )]
    FlowCpuExceeded {
        /// The Worker.
        script_id: String,
        /// CPU this invocation used when it was stopped.
        used: Duration,
        /// The flow's budget for nested invocations.
        flow_budget: Duration,
    },
    /// The instance tried to grow past its memory limit and then failed.
    #[error(
        "Worker {script_id} exceeded its memory limit of {limit} bytes; the instance was discarded"
    )]
    MemoryExceeded {
        /// The Worker.
        script_id: String,
        /// The per-instance limit.
        limit: u64,
    },
    /// The Worker trapped (panicked, hit `unreachable`, ...).
    #[error("Worker {script_id} failed: {message}")]
    Trap {
        /// The Worker.
        script_id: String,
        /// The trap and its backtrace, as wasmtime reports it.
        message: String,
    },
    /// The Worker returned without setting a response.
    #[error("Worker {0} returned without sending a response")]
    NoResponse(String),
    /// A Durable Object could not serve: its storage could not be opened,
    /// or its writes could not be made durable before its response (the
    /// output gate, [`crate::objects`]); the instance was discarded.
    #[error("Durable Object {object} is unavailable: {message}; retry shortly")]
    ObjectUnavailable {
        /// The object (`do:<script>/<class>/<id>`).
        object: String,
        /// What failed.
        message: String,
    },
    /// The Worker could not be loaded (store, compile, link).
    #[error("Worker {script_id} could not be loaded: {message}")]
    Load {
        /// The Worker.
        script_id: String,
        /// What failed.
        message: String,
    },
    /// The Worker is not warm here and the script store cannot be reached
    /// to load it (a warm Worker never needs the store).
    #[error("Worker {script_id} could not be loaded: the script store is unreachable ({message})")]
    StoreUnavailable {
        /// The Worker.
        script_id: String,
        /// The store's error.
        message: String,
    },
    /// No instance slot came free in time (the Worker's own, or the node's).
    #[error(
        "Worker {script_id} is busy: no instance slot came free within {waited:?}; retry shortly"
    )]
    Busy {
        /// The Worker.
        script_id: String,
        /// How long the request waited.
        waited: Duration,
    },
    /// The request ran past its wall-clock deadline (a client too slow to
    /// send or read, or a Worker that waited too long); the instance was
    /// discarded.
    #[error(
        "Worker {script_id} exceeded its wall-clock limit of {limit:?} on this request; the instance was discarded"
    )]
    WallTimeExceeded {
        /// The Worker.
        script_id: String,
        /// The plan's per-request wall-clock limit.
        limit: Duration,
    },
    /// The client sent nothing of its request body for too long before the
    /// Worker was given the request.
    #[error("the request body for Worker {script_id} stalled: nothing arrived for {idle:?}")]
    ClientTimeout {
        /// The Worker.
        script_id: String,
        /// The idle timeout that expired.
        idle: Duration,
    },
    /// The request body bytes buffered before a slot, on the request's
    /// connection or listener, are at their bound ([`crate::instances::pre_slot`]):
    /// this request is refused; the others go on.
    #[error(
        "request refused before Worker {script_id} ran: {scope} already holds {cap} bytes of request bodies waiting for a slot; retry shortly"
    )]
    PreSlotFull {
        /// The Worker.
        script_id: String,
        /// The budget that is full ("this connection", "this node").
        scope: &'static str,
        /// Its size in bytes.
        cap: usize,
    },
    /// The request came back through a front door more often than the
    /// node allows: a Worker (or a chain of them) fetching a public name
    /// that leads back to it ([`crate::flow`], loops through the front
    /// door). Refused before it is routed or takes a slot.
    #[error(
        "loop detected: this request for Worker {script_id} has passed through hearth {passes} times (its CDN-Loop header); a request may pass at most {max} times"
    )]
    LoopDetected {
        /// The Worker.
        script_id: String,
        /// hearth's entries in the request's `CDN-Loop`.
        passes: usize,
        /// The bound (`RuntimeConfig::max_loop_passes`).
        max: usize,
    },
    /// The request could not be handed to the Worker (e.g. a bad header).
    #[error("bad request for Worker {script_id}: {message}")]
    BadRequest {
        /// The Worker.
        script_id: String,
        /// What is wrong.
        message: String,
    },
}

impl RuntimeError {
    /// The HTTP status a client sees for this error.
    pub fn status(&self) -> http::StatusCode {
        use http::StatusCode as S;
        match self {
            RuntimeError::UnknownScript(_) | RuntimeError::DispatchOnly(_) => S::NOT_FOUND,
            RuntimeError::BadRequest { .. } => S::BAD_REQUEST,
            RuntimeError::LoopDetected { .. } => S::LOOP_DETECTED,
            RuntimeError::ClientTimeout { .. } => S::REQUEST_TIMEOUT,
            RuntimeError::WallTimeExceeded { .. } => S::GATEWAY_TIMEOUT,
            RuntimeError::StartupCpuExceeded { .. }
            | RuntimeError::Busy { .. }
            | RuntimeError::PreSlotFull { .. }
            | RuntimeError::StoreUnavailable { .. }
            | RuntimeError::ObjectUnavailable { .. }
            | RuntimeError::CpuExceeded { .. }
            | RuntimeError::FlowCpuExceeded { .. }
            | RuntimeError::MemoryExceeded { .. } => S::SERVICE_UNAVAILABLE,
            RuntimeError::Trap { .. } | RuntimeError::NoResponse(_) | RuntimeError::Load { .. } => {
                S::INTERNAL_SERVER_ERROR
            }
        }
    }

    /// Seconds a client should wait before retrying (`retry-after`), for
    /// the errors that are about load rather than the request.
    pub fn retry_after(&self) -> Option<u64> {
        matches!(
            self,
            RuntimeError::Busy { .. }
                | RuntimeError::PreSlotFull { .. }
                | RuntimeError::StoreUnavailable { .. }
                | RuntimeError::ObjectUnavailable { .. }
        )
        .then_some(1)
    }

    /// What an end user may see: the kind of failure and the limit involved,
    /// never a backtrace, an error chain or a path on the node (those go to
    /// the log, see [`crate::error_response`]).
    pub fn public_message(&self) -> String {
        match self {
            RuntimeError::Trap { script_id, .. } => {
                format!("Worker {script_id} failed (it trapped)")
            }
            RuntimeError::Load { script_id, .. } => {
                format!("Worker {script_id} could not be loaded")
            }
            RuntimeError::StoreUnavailable { script_id, .. } => {
                format!(
                    "Worker {script_id} could not be loaded: its store is unreachable; retry shortly"
                )
            }
            RuntimeError::BadRequest { script_id, .. } => {
                format!("bad request for Worker {script_id}")
            }
            RuntimeError::ObjectUnavailable { object, .. } => {
                format!("Durable Object {object} is unavailable; retry shortly")
            }
            other => other.to_string(),
        }
    }
}

/// An invalid runtime configuration.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// A limit is outside what hearth allows.
    #[error("invalid limit: {0}")]
    Limit(String),
    /// wasmtime refused the engine configuration.
    #[error("engine configuration rejected: {0}")]
    Engine(String),
}
