//! `tail-log`: a tail Worker. hearth delivers each finished flow's trace
//! events to it as one `POST /` with a JSON body; it keeps every batch in
//! its instance's memory. `GET /` answers with the number of batches
//! received on the first line, then each batch on a line of its own (so a
//! test can see what a flow delivered, and how many times).

use std::sync::Mutex;

use hearth_sdk::{Guest, IncomingRequest, ResponseOutparam};

struct TailLog;

/// The batches received by this instance.
static BATCHES: Mutex<Vec<String>> = Mutex::new(Vec::new());

impl Guest for TailLog {
    fn handle(request: IncomingRequest, out: ResponseOutparam) {
        let post = matches!(
            request.method(),
            hearth_sdk::wasi::http::types::Method::Post
        );
        let mut batches = BATCHES.lock().unwrap_or_else(|p| p.into_inner());
        if post {
            let body = request
                .consume()
                .ok()
                .and_then(|b| {
                    b.stream()
                        .ok()
                        .and_then(|s| hearth_sdk::read_to_end(&s).ok())
                })
                .unwrap_or_default();
            batches.push(String::from_utf8_lossy(&body).replace('\n', " "));
            let _ = hearth_sdk::respond(out, 204, &[], b"");
            return;
        }
        let mut text = format!("{}\n", batches.len());
        for b in batches.iter() {
            text.push_str(b);
            text.push('\n');
        }
        let _ = hearth_sdk::respond(out, 200, &[], text.as_bytes());
    }
}

hearth_sdk::export_worker!(TailLog);
