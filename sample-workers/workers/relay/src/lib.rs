//! `relay`: a link of a chain of service bindings. It calls its binding
//! `next` (`http://next.internal<path>`), or the URL in request header
//! `x-relay-to` if there is one, and answers with the callee's status and
//! `"<script-id> > <callee body>"`; the callee's `x-echo-*` headers come
//! back as they are, and `x-relay-nodes` lists the node of every level
//! below (`x-hearth-node` of each answer), nearest first. Request headers
//! `x-forward-<h>` are sent on as `x-<h>` (so a test can try to forge the
//! host's `x-hearth-*` headers through it).
//!
//! Without a binding `next` (the call is denied) it is the end of the
//! chain: 200 `"<script-id>"`. A call refused as too deep answers 508, any
//! other failure 502, each with the error in the body.

use hearth_sdk::fetch::{self, FetchError, Request};
use hearth_sdk::{Guest, IncomingRequest, ResponseOutparam};

struct Relay;

impl Guest for Relay {
    fn handle(request: IncomingRequest, out: ResponseOutparam) {
        let me = hearth_sdk::script_id();
        let path = hearth_sdk::path(&request);
        let mut to = None;
        let mut req = Request::get("");
        for (name, value) in hearth_sdk::headers(&request) {
            if name.eq_ignore_ascii_case("x-relay-to") {
                to = Some(String::from_utf8_lossy(&value).into_owned());
            } else if let Some(rest) = name.strip_prefix("x-forward-") {
                req = req.header(&format!("x-{rest}"), value);
            }
        }
        let result = match to {
            Some(url) => {
                req.url = url;
                fetch::fetch(req)
            }
            None => {
                req.url = path;
                hearth_sdk::env().service("next").fetch(req)
            }
        };
        match result {
            Ok(resp) => {
                let mut nodes = resp.header("x-hearth-node").unwrap_or_default();
                if let Some(below) = resp.header("x-relay-nodes") {
                    nodes = format!("{nodes},{below}");
                }
                let mut headers: Vec<(String, Vec<u8>)> = resp
                    .headers
                    .iter()
                    .filter(|(k, _)| k.starts_with("x-echo-"))
                    .cloned()
                    .collect();
                headers.push(("x-relay-nodes".into(), nodes.into_bytes()));
                let body = format!("{me} > {}", resp.text());
                let Ok(fields) = hearth_sdk::fields(&headers) else {
                    let _ = hearth_sdk::respond(out, 502, &[], b"bad callee headers");
                    return;
                };
                if let Ok(r) = hearth_sdk::Response::start(out, resp.status, fields) {
                    let _ = r.write_all(body.as_bytes());
                    let _ = r.finish();
                }
            }
            Err(FetchError::Denied) => {
                let _ = hearth_sdk::respond(out, 200, &[], me.as_bytes());
            }
            Err(e @ FetchError::LoopDetected) => {
                let body = format!("{me}: {e}");
                let _ = hearth_sdk::respond(out, 508, &[], body.as_bytes());
            }
            Err(e) => {
                let body = format!("{me}: {e}");
                let _ = hearth_sdk::respond(out, 502, &[], body.as_bytes());
            }
        }
    }
}

hearth_sdk::export_worker!(Relay);
