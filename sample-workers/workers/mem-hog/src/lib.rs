//! `mem-hog`: on request, allocates 1 MiB blocks without bound, writing every
//! page of each and keeping them all in a global, until the host's memory
//! limit makes `memory.grow` fail (the allocation failure then traps).
//! With `?keep=N` it allocates only N blocks, keeps them too, and answers
//! 200 with the number of blocks this instance now holds: a Worker whose
//! memory creeps up request by request. With `?random=N` it asks the host
//! for N random bytes in one `wasi:random` call and answers 200 with how
//! many came (the host caps one call; a larger ask traps).

use hearth_sdk::{Guest, IncomingRequest, ResponseOutparam};
use std::hint::black_box;
use std::sync::Mutex;

/// Where the blocks are kept, so none can be freed or elided.
static HOARD: Mutex<Vec<Vec<u8>>> = Mutex::new(Vec::new());

const BLOCK: usize = 1 << 20;
const PAGE: usize = 4096;

struct MemHog;

impl Guest for MemHog {
    fn handle(request: IncomingRequest, out: ResponseOutparam) {
        let path = request.path_with_query().unwrap_or_default();
        if let Some(n) = path
            .split_once("random=")
            .and_then(|(_, n)| n.parse::<u64>().ok())
        {
            let got = hearth_sdk::wasi::random::random::get_random_bytes(n);
            let _ = hearth_sdk::respond(out, 200, &[], got.len().to_string().as_bytes());
            return;
        }
        let mut hoard = match HOARD.lock() {
            Ok(h) => h,
            Err(poisoned) => poisoned.into_inner(),
        };
        let keep = path
            .split_once("keep=")
            .and_then(|(_, n)| n.parse::<usize>().ok());
        let mut n: u8 = 0;
        if let Some(keep) = keep {
            for _ in 0..keep {
                hoard.push(black_box(touched_block(n)));
                n = n.wrapping_add(1);
            }
            let held = hoard.len().to_string();
            // An error here means the client or host went away.
            let _ = hearth_sdk::respond(out, 200, &[], held.as_bytes());
            return;
        }
        // Held, unanswered, until the allocation failure traps.
        let _out = out;
        loop {
            hoard.push(black_box(touched_block(n)));
            n = n.wrapping_add(1);
        }
    }
}

/// A 1 MiB block with every page written.
fn touched_block(n: u8) -> Vec<u8> {
    let mut block = vec![0u8; BLOCK];
    for i in (0..BLOCK).step_by(PAGE) {
        block[i] = n;
    }
    block
}

hearth_sdk::export_worker!(MemHog);
