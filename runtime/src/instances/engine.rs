//! The wasmtime engine of a node: configuration and the
//! linker every Worker is instantiated against.
//!
//! One engine per runtime, with async support, epoch interruption, the
//! pooling allocator and copy-on-write memory images. The epoch is advanced
//! by the engine's [ticker](crate::instances::epoch) while guests run; each store's
//! deadline callback then checks its CPU meter.

use wasmtime::component::Linker;
use wasmtime::{Config, Enabled, Engine, InstanceAllocationStrategy, PoolingAllocationConfig};

use crate::config::RuntimeConfig;
use crate::error::ConfigError;
use crate::instances::host::Host;

/// Bytes of a pooled linear memory (and table) reset in place rather than
/// returned to the kernel when an instance ends.
const KEEP_RESIDENT: usize = 16 << 20;

/// Builds the engine for `cfg`.
pub(crate) fn build_engine(cfg: &RuntimeConfig) -> Result<Engine, ConfigError> {
    let mut c = Config::new();
    c.epoch_interruption(true);
    c.memory_init_cow(true);
    if cfg.pooling {
        let n = cfg.instance_pool_size.max(1);
        let max_mem = cfg.free.memory.max(cfg.paid.memory);
        let mut p = PoolingAllocationConfig::new();
        p.total_component_instances(n)
            .total_core_instances(n.saturating_mul(8))
            .total_memories(n.saturating_mul(2))
            .total_tables(n.saturating_mul(4))
            .total_stacks(n)
            .max_memory_size(usize::try_from(max_mem).unwrap_or(usize::MAX))
            // Large components (a 10 MB Worker) have big function tables.
            .table_elements(200_000)
            .max_core_instance_size(4 << 20)
            .max_component_instance_size(4 << 20)
            .max_memories_per_component(16)
            .max_tables_per_component(32)
            .max_core_instances_per_component(64)
            // Fresh-instance Workers (componentize-js) dirty megabytes of
            // heap per request. Resetting a slot by `memset` of only the
            // pages it touched (found with the PAGEMAP_SCAN ioctl on Linux
            // >= 6.7) keeps them resident and skips an madvise + page faults
            // per instantiation; on older kernels this falls back to
            // madvise.
            .pagemap_scan(Enabled::Auto)
            .linear_memory_keep_resident(KEEP_RESIDENT)
            .table_keep_resident(KEEP_RESIDENT);
        c.allocation_strategy(InstanceAllocationStrategy::Pooling(p));
    }
    Engine::new(&c).map_err(|e| ConfigError::Engine(e.to_string()))
}

/// Builds the linker: all of WASI 0.2 plus wasi:http, hearth's
/// `hearth:js/fast-http` for JS Workers built with `hearth build`, and
/// `hearth:objects` (Durable Objects) for every Worker. Real Workers
/// (Rust std, componentize-js, componentize-py, wstd) import `wasi:cli/*` and
/// mix 0.2.x patch versions; wasmtime matches those by semver.
pub(crate) fn build_linker(engine: &Engine) -> Result<Linker<Host>, ConfigError> {
    let mut linker = Linker::new(engine);
    wasmtime_wasi::p2::add_to_linker_async(&mut linker)
        .map_err(|e| ConfigError::Engine(e.to_string()))?;
    wasmtime_wasi_http::p2::add_only_http_to_linker_async(&mut linker)
        .map_err(|e| ConfigError::Engine(e.to_string()))?;
    // A Worker's vars and secrets, also in its environment (crate::store::secrets).
    wasmtime_wasi_config::add_to_linker(&mut linker, Host::config)
        .map_err(|e| ConfigError::Engine(e.to_string()))?;
    // What the JS engine reads a request and answers with
    // (crate::outbound::fast_http).
    crate::outbound::fast_http::add_to_linker(&mut linker)
        .map_err(|e| ConfigError::Engine(e.to_string()))?;
    // Durable Objects' IDs and storage, for every Worker (crate::objects).
    crate::objects::host::add_to_linker(&mut linker)
        .map_err(|e| ConfigError::Engine(e.to_string()))?;
    Ok(linker)
}
