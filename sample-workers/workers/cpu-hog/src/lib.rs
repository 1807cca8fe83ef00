//! `cpu-hog`: on request, spins forever on real computation (no sleeping), so
//! only the host's CPU limit (epoch interruption / fuel) can stop it.

use hearth_sdk::{Guest, IncomingRequest, ResponseOutparam};
use std::hint::black_box;

struct CpuHog;

impl Guest for CpuHog {
    fn handle(_request: IncomingRequest, _out: ResponseOutparam) {
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        loop {
            // xorshift64*: real work the optimiser cannot fold away.
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x = black_box(x.wrapping_mul(0x2545_f491_4f6c_dd1d));
        }
    }
}

hearth_sdk::export_worker!(CpuHog);
