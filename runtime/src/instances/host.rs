//! The host side of one instance: the data every wasmtime `Store` carries.
//!
//! Each instance gets a full WASI 0.2 context (clocks, random, cli with an
//! environment holding `HEARTH_SCRIPT_ID`, the names of its bindings
//! (`HEARTH_SERVICES`, `HEARTH_DISPATCH`, `HEARTH_DURABLE_OBJECTS`, if any) and the Worker's vars and
//! secrets, a filesystem with no preopens, sockets denied), the same vars and
//! secrets through `wasi:config/store` ([`crate::store::secrets`]), stdout and
//! stderr that go to the node's log and any trace ([`crate::outbound::tail`]),
//! and a wasi:http context whose outgoing requests reach only the Worker's
//! bindings ([`crate::outbound::outgoing`]), plus the two meters that enforce
//! its limits: a [`MemoryLimiter`] and a [`CpuMeter`].
//!
//! Host memory a Worker can make the node allocate is held to its limit:
//!
//! * linear memories and tables are counted against the instance's memory
//!   limit (a table element as [`TABLE_ELEMENT_BYTES`]), and against the
//!   node-wide cap on live instance memory ([`NodeMemory`]), so the
//!   in-flight instances together cannot exceed it either;
//! * the resources an instance holds (streams, pollables, header maps,
//!   outgoing requests and bodies, ...) are capped at [`MAX_RESOURCES`], a
//!   header map it builds at [`FIELD_SIZE_LIMIT`] bytes, and what an
//!   outgoing body (a subrequest's or the response's) buffers at
//!   [`OUTGOING_BODY_BYTES`]: chunks of at most [`OUTGOING_BODY_CHUNK`]
//!   bytes, [`OUTGOING_BODY_BUFFER_CHUNKS`] buffered plus the one in hand
//!   (wasmtime-wasi-http's defaults, 1 MiB chunks, let a guest park 2 MiB in
//!   every body it finishes and never sends). A write larger than the chunk
//!   fails the guest's call (a trap); a guest that waits for `check-write`
//!   waits for the body to be read. wasmtime offers no hook to count those
//!   allocations one by one, so their worst case, [`HOST_RESERVE`] (every
//!   resource a full header map with a full body buffer), is reserved
//!   against the node-wide cap for as long as the instance lives: however
//!   the in-flight instances use the host, together they stay within the
//!   cap.
//!
//! * one `wasi:random` call may ask for [`MAX_RANDOM_BYTES`] (64 KiB; the
//!   host builds the answer in its own memory first); a larger ask traps.
//!
//! These bounds are constants of [`crate::limits`].
//!
//! [`OUTGOING_BODY_BYTES`]: crate::limits::OUTGOING_BODY_BYTES
//! [`OUTGOING_BODY_CHUNK`]: crate::limits::OUTGOING_BODY_CHUNK
//! [`OUTGOING_BODY_BUFFER_CHUNKS`]: crate::limits::OUTGOING_BODY_BUFFER_CHUNKS

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use wasmtime::component::ResourceTable;
use wasmtime_wasi::{WasiCtx, WasiCtxBuilder, WasiCtxView, WasiView};
use wasmtime_wasi_http::{WasiHttpCtx, WasiHttpCtxView, WasiHttpView};

use crate::instances::cpu::CpuMeter;
use crate::limits::{
    FIELD_SIZE_LIMIT, HOST_RESERVE, MAX_RANDOM_BYTES, MAX_RESOURCES, TABLE_ELEMENT_BYTES,
};
use crate::outbound::outgoing::Outbound;

/// The `T` of every instance's `Store<T>`.
pub(crate) struct Host {
    wasi: WasiCtx,
    http: WasiHttpCtx,
    table: ResourceTable,
    /// Where outgoing requests go: set per request ([`crate::outbound::outgoing`]).
    pub(crate) hooks: Outbound,
    /// The instance's stdout and stderr: the node's log, and trace events
    /// while a traced request runs ([`crate::outbound::tail`]).
    logs: [crate::outbound::tail::LogPipe; 2],
    /// What the Worker's instances share: its environment (read by
    /// `wasi:config/store` from here) and its node log.
    io: Arc<WorkerIo>,
    pub(crate) memory: MemoryLimiter,
    pub(crate) meter: Arc<CpuMeter>,
}

/// The node-wide cap on memory held by live instances (linear memories and
/// tables of every instance of every Worker), shared by all their limiters.
#[derive(Debug)]
pub(crate) struct NodeMemory {
    used: AtomicU64,
    limit: u64,
}

impl NodeMemory {
    /// A cap of `limit` bytes.
    pub(crate) fn new(limit: u64) -> Arc<Self> {
        Arc::new(NodeMemory {
            used: AtomicU64::new(0),
            limit,
        })
    }

    /// Takes `bytes` if they fit under the cap.
    pub(crate) fn try_take(&self, bytes: u64) -> bool {
        self.used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |u| {
                u.checked_add(bytes).filter(|n| *n <= self.limit)
            })
            .is_ok()
    }

    fn give_back(&self, bytes: u64) {
        self.used.fetch_sub(bytes, Ordering::AcqRel);
    }

    /// Bytes live instances hold now.
    pub(crate) fn used(&self) -> u64 {
        self.used.load(Ordering::Relaxed)
    }
}

/// What every instance of one Worker gets from the host besides its
/// limits: its script ID, environment and node log.
pub(crate) struct WorkerIo {
    /// The Worker.
    pub(crate) script_id: Arc<str>,
    /// `HEARTH_SCRIPT_ID`, binding names, vars and opened secrets.
    pub(crate) env: crate::store::secrets::WorkerEnv,
    /// Where its output lines go on this node.
    pub(crate) log: Arc<crate::outbound::tail::WorkerLog>,
}

impl Host {
    /// Host state for an instance of the Worker `io` describes, limited to
    /// `memory` bytes of its own and to what is left of `node`, which must
    /// already hold this instance's [`HOST_RESERVE`] (given back when the
    /// host drops).
    pub(crate) fn new(io: &Arc<WorkerIo>, memory: u64, node: Arc<NodeMemory>) -> Self {
        let (stdout, stderr) = crate::outbound::tail::LogPipe::pair(io.log.clone());
        let mut wasi = WasiCtxBuilder::new();
        for (name, value) in &io.env.pairs {
            wasi.env(name, value.as_str());
        }
        let wasi = wasi
            .stdout(stdout.clone())
            .stderr(stderr.clone())
            .allow_ip_name_lookup(false)
            .allow_tcp(false)
            .allow_udp(false)
            .max_random_size(MAX_RANDOM_BYTES)
            .build();
        let mut http = WasiHttpCtx::new();
        http.set_field_size_limit(FIELD_SIZE_LIMIT);
        let mut table = ResourceTable::new();
        table.set_max_capacity(MAX_RESOURCES);
        Host {
            wasi,
            http,
            table,
            hooks: Outbound::default(),
            logs: [stdout, stderr],
            io: io.clone(),
            memory: MemoryLimiter {
                limit: usize::try_from(memory).unwrap_or(usize::MAX),
                total: 0,
                hit: false,
                node,
            },
            meter: Arc::new(CpuMeter::default()),
        }
    }
}

impl Host {
    /// A request starts: the instance's output goes to `trace` too (or
    /// only to the node's log), tagged with a new request ID.
    pub(crate) fn begin_request(&self, trace: Option<Arc<crate::outbound::tail::TraceBuffer>>) {
        for pipe in &self.logs {
            pipe.flush_line();
        }
        self.logs[0].set(trace);
        self.logs[0].begin_request();
    }

    /// The request ended: its unfinished lines are logged, and the
    /// instance keeps nothing of its trace.
    pub(crate) fn end_request(&self) {
        for pipe in &self.logs {
            pipe.flush_line();
        }
        self.logs[0].set(None);
    }

    /// The Worker's `wasi:config/store`: its vars and secrets.
    pub(crate) fn config(&mut self) -> wasmtime_wasi_config::WasiConfig<'_> {
        wasmtime_wasi_config::WasiConfig::from(&self.io.env.config)
    }
}

impl WasiView for Host {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView {
            ctx: &mut self.wasi,
            table: &mut self.table,
        }
    }
}

impl WasiHttpView for Host {
    fn http(&mut self) -> WasiHttpCtxView<'_> {
        WasiHttpCtxView {
            ctx: &mut self.http,
            table: &mut self.table,
            hooks: &mut self.hooks,
        }
    }
}

/// Caps the linear memory and tables of one instance (and their share of
/// the node's cap) and remembers whether a growth was refused, so a trap
/// that follows is reported as a memory limit.
pub(crate) struct MemoryLimiter {
    limit: usize,
    total: usize,
    pub(crate) hit: bool,
    node: Arc<NodeMemory>,
}

impl MemoryLimiter {
    /// Bytes of linear memory and tables the instance holds.
    pub(crate) fn bytes(&self) -> u64 {
        self.total as u64
    }

    /// Sets the instance's own limit (per request: a flow may tighten it).
    pub(crate) fn set_limit(&mut self, limit: u64) {
        self.limit = usize::try_from(limit).unwrap_or(usize::MAX);
    }

    /// Grows the count by `grow` bytes if the instance's limit and the
    /// node's cap allow it.
    fn grow(&mut self, grow: usize) -> bool {
        if self.total.saturating_add(grow) > self.limit || !self.node.try_take(grow as u64) {
            self.hit = true;
            return false;
        }
        self.total += grow;
        true
    }
}

impl Drop for MemoryLimiter {
    fn drop(&mut self) {
        self.node.give_back(self.total as u64 + HOST_RESERVE);
    }
}

impl wasmtime::ResourceLimiter for MemoryLimiter {
    fn memory_growing(
        &mut self,
        current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        Ok(self.grow(desired.saturating_sub(current)))
    }

    fn table_growing(
        &mut self,
        current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        let elements = desired.saturating_sub(current);
        Ok(self.grow(elements.saturating_mul(TABLE_ELEMENT_BYTES)))
    }
}
