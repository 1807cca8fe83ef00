//! `slow-start`: burns about 1 s of CPU while the component is being
//! **instantiated** (in [`hearth_sdk::init!`], i.e. the core `_initialize`
//! export, which wit-component runs from a `start` section during component
//! instantiation), not in the handler. The handler then responds 200 `ready`.
//!
//! The burn is a serial multiply/xor/rotate chain: each step depends on the
//! previous one, so it cannot be vectorised, folded or skipped; the result is
//! kept and reported in the `x-init-hash` response header. Measured on the dev
//! machine (Intel Xeon, one core): ~520 M steps/s natively and ~570 M steps/s
//! compiled by wasmtime 48's Cranelift (500 M steps took 874 ms of thread CPU
//! inside `instantiate_async`), so [`STEPS`] is about 1 s of CPU there.

use hearth_sdk::{Guest, IncomingRequest, ResponseOutparam};
use std::hint::black_box;
use std::sync::atomic::{AtomicU64, Ordering};

/// Steps of the start-up burn (~1 s of CPU on the dev machine).
pub const STEPS: u64 = 570_000_000;

/// Result of the burn; 0 until `init` has run.
static INIT_HASH: AtomicU64 = AtomicU64::new(0);

/// `steps` dependent multiply/xor/rotate steps (FNV-like), returning the hash.
fn burn(steps: u64) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for i in 0..black_box(steps) {
        h = (h ^ i).wrapping_mul(0x0000_0100_0000_01b3);
        h = h.rotate_left(23);
    }
    black_box(h)
}

fn init() {
    INIT_HASH.store(burn(STEPS) | 1, Ordering::Relaxed);
}

hearth_sdk::init!(init);

struct SlowStart;

impl Guest for SlowStart {
    fn handle(_request: IncomingRequest, out: ResponseOutparam) {
        let hash = format!("{:016x}", INIT_HASH.load(Ordering::Relaxed));
        let _ = hearth_sdk::respond(
            out,
            200,
            &[
                ("content-type", b"text/plain"),
                ("x-init-hash", hash.as_bytes()),
            ],
            b"ready",
        );
    }
}

hearth_sdk::export_worker!(SlowStart);
