//! `dispatcher`: a dynamic dispatch Worker (Workers for Platforms). A
//! request for `/<user>/<rest>` goes to user Worker `<user>` of dispatch
//! namespace `users` (`http://<user>.users.dispatch.internal/<rest>`); the
//! answer comes back as `"dispatcher > <user Worker's body>"` with the user
//! Worker's status and `x-hearth-node` as `x-user-node`. A user Worker that
//! is not in the namespace is a 404.

use hearth_sdk::fetch::{FetchError, Request};
use hearth_sdk::{Guest, IncomingRequest, ResponseOutparam};

struct Dispatcher;

impl Guest for Dispatcher {
    fn handle(request: IncomingRequest, out: ResponseOutparam) {
        let path = hearth_sdk::path(&request);
        let trimmed = path.trim_start_matches('/');
        let (user, rest) = trimmed.split_once('/').unwrap_or((trimmed, ""));
        hearth_sdk::log!("dispatching /{rest} to {user}");
        let users = hearth_sdk::env().dispatch("users");
        match users.get(user).fetch(Request::get(&format!("/{rest}"))) {
            Ok(resp) => {
                let node = resp.header("x-hearth-node").unwrap_or_default();
                let body = format!("dispatcher > {}", resp.text());
                let _ = hearth_sdk::respond(
                    out,
                    resp.status,
                    &[("x-user-node", node.as_bytes())],
                    body.as_bytes(),
                );
            }
            Err(FetchError::Denied) => {
                let body = format!("no user Worker {user:?} in namespace users");
                let _ = hearth_sdk::respond(out, 404, &[], body.as_bytes());
            }
            Err(e) => {
                let body = format!("dispatcher: {e}");
                let _ = hearth_sdk::respond(out, 502, &[], body.as_bytes());
            }
        }
    }
}

hearth_sdk::export_worker!(Dispatcher);
