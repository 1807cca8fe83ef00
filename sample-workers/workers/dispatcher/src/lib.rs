//! `dispatcher`: a dynamic dispatch Worker (Workers for Platforms), written
//! with `hearth-sdk`'s async fetch handler. A request for `/<user>/<rest>`
//! goes to user Worker `<user>` of dispatch namespace `users`
//! (`http://<user>.users.dispatch.internal/<rest>`); the answer comes back
//! as `"dispatcher > <user Worker's body>"` with the user Worker's status
//! and `x-hearth-node` as `x-user-node`. A user Worker that is not in the
//! namespace is a 404.

use hearth_sdk::fetch::{FetchError, Request, Response};
use hearth_sdk::{Env, Worker};

struct Dispatcher;

impl Worker for Dispatcher {
    async fn fetch(req: Request, env: Env) -> Response {
        let path = req.path().trim_start_matches('/').to_string();
        let (user, rest) = path.split_once('/').unwrap_or((&path, ""));
        hearth_sdk::log!("dispatching /{rest} to {user}");
        let users = env.dispatch("users");
        match users
            .get(user)
            .fetch_async(Request::get(&format!("/{rest}")))
            .await
        {
            Ok(resp) => {
                let node = resp.header("x-hearth-node").unwrap_or_default();
                Response::new(resp.status, format!("dispatcher > {}", resp.text()))
                    .with_header("x-user-node", node)
            }
            Err(FetchError::Denied) => {
                Response::new(404, format!("no user Worker {user:?} in namespace users"))
            }
            Err(e) => Response::new(502, format!("dispatcher: {e}")),
        }
    }
}

hearth_sdk::export_fetch!(Dispatcher);
