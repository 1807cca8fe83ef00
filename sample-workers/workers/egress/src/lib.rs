//! `egress`: an outbound Worker. Every subrequest of the user Workers its
//! platform dispatches to arrives here instead of the network. A path under
//! `/blocked` is refused (403 `"egress blocked <url>"`); anything else is
//! answered 200 `"egress saw <method> <host><path> for <caller> (<trust>)"`,
//! where the caller and trust are the host's `x-hearth-caller` and
//! `x-hearth-trust` headers.

use hearth_sdk::{Guest, IncomingRequest, ResponseOutparam};

struct Egress;

impl Guest for Egress {
    fn handle(request: IncomingRequest, out: ResponseOutparam) {
        let path = hearth_sdk::path(&request);
        let host = request.authority().unwrap_or_default();
        let header = |name: &str| {
            hearth_sdk::headers(&request)
                .into_iter()
                .find(|(k, _)| k.eq_ignore_ascii_case(name))
                .map(|(_, v)| String::from_utf8_lossy(&v).into_owned())
                .unwrap_or_default()
        };
        let method = hearth_sdk::worker::method_name(&request.method());
        if path.starts_with("/blocked") {
            let body = format!("egress blocked {host}{path}");
            let _ = hearth_sdk::respond(out, 403, &[], body.as_bytes());
            return;
        }
        let body = format!(
            "egress saw {method} {host}{path} for {} ({})",
            header("x-hearth-caller"),
            header("x-hearth-trust")
        );
        let _ = hearth_sdk::respond(out, 200, &[], body.as_bytes());
    }
}

hearth_sdk::export_worker!(Egress);
