//! `hello`: responds 200 `hello from <script-id>`, the script ID coming from
//! `HEARTH_SCRIPT_ID` in the WASI environment (`unknown` when unset).

use hearth_sdk::{Guest, IncomingRequest, ResponseOutparam};

struct Hello;

impl Guest for Hello {
    fn handle(_request: IncomingRequest, out: ResponseOutparam) {
        let body = format!("hello from {}", hearth_sdk::script_id());
        // An error here means the client or host went away: nothing to do.
        let _ = hearth_sdk::respond(
            out,
            200,
            &[("content-type", b"text/plain; charset=utf-8")],
            body.as_bytes(),
        );
    }
}

hearth_sdk::export_worker!(Hello);
