//! `mem-hog`: on request, allocates 1 MiB blocks without bound, writing every
//! page of each and keeping them all in a global, until the host's memory
//! limit makes `memory.grow` fail (the allocation failure then traps).

use hearth_sdk::{Guest, IncomingRequest, ResponseOutparam};
use std::hint::black_box;
use std::sync::Mutex;

/// Where the blocks are kept, so none can be freed or elided.
static HOARD: Mutex<Vec<Vec<u8>>> = Mutex::new(Vec::new());

const BLOCK: usize = 1 << 20;
const PAGE: usize = 4096;

struct MemHog;

impl Guest for MemHog {
    fn handle(_request: IncomingRequest, _out: ResponseOutparam) {
        let mut hoard = match HOARD.lock() {
            Ok(h) => h,
            Err(poisoned) => poisoned.into_inner(),
        };
        let mut n: u8 = 0;
        loop {
            let mut block = vec![0u8; BLOCK];
            // Touch every page so the memory is really used.
            for i in (0..BLOCK).step_by(PAGE) {
                block[i] = n;
            }
            n = n.wrapping_add(1);
            hoard.push(black_box(block));
        }
    }
}

hearth_sdk::export_worker!(MemHog);
