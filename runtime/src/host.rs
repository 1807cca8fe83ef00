//! The host side of one instance: the data every wasmtime `Store` carries.
//!
//! Each instance gets a full WASI 0.2 context (clocks, random, cli with an
//! environment holding `HEARTH_SCRIPT_ID`, a filesystem with no preopens,
//! sockets denied) and a wasi:http context whose outbound requests are
//! denied, plus the two meters that enforce its limits: a [`MemoryLimiter`]
//! and a [`CpuMeter`].

use std::sync::Arc;

use wasmtime::component::ResourceTable;
use wasmtime_wasi::{WasiCtx, WasiCtxBuilder, WasiCtxView, WasiView};
use wasmtime_wasi_http::{
    RequestOptions, WasiBody, WasiHttpCtx, WasiHttpCtxView, WasiHttpHooks, WasiHttpView,
};

use crate::cpu::CpuMeter;

/// The `T` of every instance's `Store<T>`.
pub(crate) struct Host {
    wasi: WasiCtx,
    http: WasiHttpCtx,
    table: ResourceTable,
    hooks: DenyOutbound,
    pub(crate) memory: MemoryLimiter,
    pub(crate) meter: Arc<CpuMeter>,
}

impl Host {
    /// Host state for an instance of `script_id` limited to `memory` bytes.
    pub(crate) fn new(script_id: &str, memory: u64) -> Self {
        let wasi = WasiCtxBuilder::new()
            .env("HEARTH_SCRIPT_ID", script_id)
            .allow_ip_name_lookup(false)
            .allow_tcp(false)
            .allow_udp(false)
            .build();
        Host {
            wasi,
            http: WasiHttpCtx::new(),
            table: ResourceTable::new(),
            hooks: DenyOutbound,
            memory: MemoryLimiter {
                limit: usize::try_from(memory).unwrap_or(usize::MAX),
                total: 0,
                hit: false,
            },
            meter: Arc::new(CpuMeter::default()),
        }
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

/// Outbound HTTP from a Worker is not offered yet: every request is denied
/// with `HTTP-request-denied`, which the guest sees as a normal error.
struct DenyOutbound;

type SendResult = wasmtime_wasi_http::Result<(
    http::Response<WasiBody>,
    Box<dyn Future<Output = wasmtime_wasi_http::Result<()>> + Send>,
)>;

impl WasiHttpHooks for DenyOutbound {
    fn send_request(
        &mut self,
        _request: http::Request<WasiBody>,
        _options: Option<RequestOptions>,
        _fut: Box<dyn Future<Output = wasmtime_wasi_http::Result<()>> + Send>,
    ) -> Box<dyn Future<Output = SendResult> + Send> {
        Box::new(async { Err(wasmtime_wasi_http::Error::HttpRequestDenied) })
    }
}

/// Caps the total linear memory of one instance and remembers whether a
/// growth was refused, so a trap that follows is reported as a memory limit.
pub(crate) struct MemoryLimiter {
    limit: usize,
    total: usize,
    pub(crate) hit: bool,
}

impl MemoryLimiter {
    /// Bytes of linear memory the instance holds.
    pub(crate) fn bytes(&self) -> u64 {
        self.total as u64
    }
}

impl wasmtime::ResourceLimiter for MemoryLimiter {
    fn memory_growing(
        &mut self,
        current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        let grow = desired.saturating_sub(current);
        if self.total.saturating_add(grow) > self.limit {
            self.hit = true;
            return Ok(false);
        }
        self.total += grow;
        Ok(true)
    }

    fn table_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        Ok(desired <= 1_000_000)
    }
}
