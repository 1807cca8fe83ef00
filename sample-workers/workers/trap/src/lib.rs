//! `trap`: on request, panics before setting any response. With
//! `panic = "abort"` the panic is a wasm trap, so the host sees the handler
//! trap and must discard the instance.

use hearth_sdk::{Guest, IncomingRequest, ResponseOutparam};

struct Trap;

impl Guest for Trap {
    fn handle(request: IncomingRequest, _out: ResponseOutparam) {
        panic!(
            "trap worker: deliberate panic on {}",
            hearth_sdk::path(&request)
        );
    }
}

hearth_sdk::export_worker!(Trap);
