//! `tail-log`: a tail Worker. hearth delivers each finished flow's trace
//! events to it as one `POST /` with a JSON body; it checks the body with
//! `hearth_sdk::tail::parse` (400 if it does not parse) and keeps every
//! batch in its instance's memory. `GET /` answers with the number of
//! batches received on the first line, then each batch on a line of its
//! own (so a test can see what a flow delivered, and how many times).

use std::sync::Mutex;

use hearth_sdk::fetch::{Request, Response};
use hearth_sdk::{Env, Worker};

struct TailLog;

/// The batches received by this instance.
static BATCHES: Mutex<Vec<String>> = Mutex::new(Vec::new());

impl Worker for TailLog {
    async fn fetch(req: Request, _env: Env) -> Response {
        let mut batches = BATCHES.lock().unwrap_or_else(|p| p.into_inner());
        if req.method == "POST" {
            return match hearth_sdk::tail::parse(&req.body) {
                Ok(batch) => {
                    hearth_sdk::log!("flow of {}: {} events", batch.entry, batch.events.len());
                    batches.push(String::from_utf8_lossy(&req.body).replace('\n', " "));
                    Response::new(204, "")
                }
                Err(e) => Response::new(400, e),
            };
        }
        let mut text = format!("{}\n", batches.len());
        for b in batches.iter() {
            text.push_str(b);
            text.push('\n');
        }
        Response::new(200, text)
    }
}

hearth_sdk::export_fetch!(TailLog);
