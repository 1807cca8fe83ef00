//! `size-1m`: a sized component for the cold-start benchmark, made of
//! real code and data (see `build.rs` for the amounts): incompressible
//! pseudo-random data and generated functions from `big`'s generator, both
//! really used at request time by the Worker code shared with `big`
//! ([`payload`]). Responds 200 with a one-line text summary.

use hearth_sdk::{Guest, IncomingRequest, ResponseOutparam};

#[path = "../../big/src/payload.rs"]
mod payload;

struct Worker;

impl Guest for Worker {
    fn handle(request: IncomingRequest, out: ResponseOutparam) {
        payload::handle("size-1m", request, out);
    }
}

hearth_sdk::export_worker!(Worker);
