//! `big`: a deliberately large component (gzip size between 3 and 10 MiB,
//! ~5.9 MiB), for script-size limits and slow fetch/compile paths.
//!
//! It embeds 5.5 MiB of incompressible pseudo-random data and 4096 generated
//! functions (both from `build.rs`, via the shared `payload_gen.rs`), and
//! really uses both at request time (see [`payload`], shared with `size-1m`
//! and `size-10m`), so neither can be stripped. Responds 200 with a one-line
//! text summary.

use hearth_sdk::{Guest, IncomingRequest, ResponseOutparam};

mod payload;

struct Big;

impl Guest for Big {
    fn handle(request: IncomingRequest, out: ResponseOutparam) {
        payload::handle("big", request, out);
    }
}

hearth_sdk::export_worker!(Big);
