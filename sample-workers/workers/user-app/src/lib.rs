//! `user-app`: a user Worker of a platform. It makes a subrequest to the
//! outside world (`http://api.example.com<path>`) and answers
//! `"<script-id> > <answer>"` with the subrequest's status (and its
//! `x-hearth-node` as `x-outbound-node`). On hearth such a subrequest goes
//! to the outbound Worker the platform's dispatch Worker configured, or is
//! denied: then 403 `"<script-id>: subrequest denied"`.

use hearth_sdk::fetch::{self, FetchError, Request};
use hearth_sdk::{Guest, IncomingRequest, ResponseOutparam};

struct UserApp;

impl Guest for UserApp {
    fn handle(request: IncomingRequest, out: ResponseOutparam) {
        let me = hearth_sdk::script_id();
        let path = hearth_sdk::path(&request);
        hearth_sdk::log!("{me} fetching {path}");
        hearth_sdk::trace!("subrequest to api.example.com");
        match fetch::fetch(Request::get(&format!("http://api.example.com{path}"))) {
            Ok(resp) => {
                let node = resp.header("x-hearth-node").unwrap_or_default();
                let body = format!("{me} > {}", resp.text());
                let _ = hearth_sdk::respond(
                    out,
                    resp.status,
                    &[("x-outbound-node", node.as_bytes())],
                    body.as_bytes(),
                );
            }
            Err(FetchError::Denied) => {
                let body = format!("{me}: subrequest denied");
                let _ = hearth_sdk::respond(out, 403, &[], body.as_bytes());
            }
            Err(e) => {
                let body = format!("{me}: {e}");
                let _ = hearth_sdk::respond(out, 502, &[], body.as_bytes());
            }
        }
    }
}

hearth_sdk::export_worker!(UserApp);
