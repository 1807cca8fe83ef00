//! `echo`: streams the request body back as the response body, 4 KiB at a
//! time (constant memory, whatever the body size), and echoes every request
//! header `name: value` as response header `x-echo-<name>: value`. Header
//! `x-echo-served` counts the requests this instance has served (a global),
//! so a host's instance reuse is visible.

use std::sync::atomic::{AtomicU64, Ordering};

use hearth_sdk::{Fields, Guest, IncomingBody, IncomingRequest, Response, ResponseOutparam};

struct Echo;

/// Requests served by this instance, this one included.
static SERVED: AtomicU64 = AtomicU64::new(0);

impl Guest for Echo {
    fn handle(request: IncomingRequest, out: ResponseOutparam) {
        let headers = Fields::new();
        let served = SERVED.fetch_add(1, Ordering::Relaxed) + 1;
        let _ = headers.append(&"x-echo-served".to_string(), &served.to_string().into_bytes());
        for (name, value) in hearth_sdk::headers(&request) {
            // A header the host refuses to set is skipped, not fatal.
            let _ = headers.append(&format!("x-echo-{name}"), &value);
        }
        let Ok(body) = request.consume() else {
            let _ = hearth_sdk::respond(out, 500, &[], b"request body already consumed");
            return;
        };
        let Ok(input) = body.stream() else {
            let _ = hearth_sdk::respond(out, 500, &[], b"request body stream unavailable");
            return;
        };
        let Ok(response) = Response::start(out, 200, headers) else {
            return;
        };
        if response.copy_from(&input).is_err() {
            // The client went away (or the request body failed): dropping the
            // response unfinished tells the host the body is incomplete.
            return;
        }
        drop(input);
        // Trailers of the request are not echoed.
        drop(IncomingBody::finish(body));
        let _ = response.finish();
    }
}

hearth_sdk::export_worker!(Echo);
